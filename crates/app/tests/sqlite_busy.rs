//! A select on a SQLite file whose write lock another connection holds: it fails
//! as a store error after waiting out one busy timeout, not one per store call
//! (the SQLite adapter's lockout).

use std::sync::Arc;
use std::time::Duration;

use holdfast::{SelectError, SystemClock, TokenSelector};
use holdfast_adapters_sqlite::{SqliteBackend, SqliteOptions};
use holdfast_domain::{Precision, Quantity, SelectionConfig, TokenId, TokenType, TxId, WalletId};
use holdfast_ports::{NewToken, StoreFault};

use crate::common::TempDb;

fn q(v: u128) -> Quantity {
    Quantity::new(v, Precision::MAX).expect("quantity")
}

fn wallet() -> WalletId {
    WalletId::new("alice").expect("wallet")
}

fn chf() -> TokenType {
    TokenType::new("CHF").expect("type")
}

fn tx(id: &str) -> TxId {
    TxId::new(id).expect("tx")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_select_on_a_file_locked_elsewhere_waits_out_one_busy_timeout() {
    let db = TempDb::new("busy-select");
    let options = SqliteOptions {
        busy_timeout: Duration::from_millis(200),
        ..SqliteOptions::default()
    };
    let backend = SqliteBackend::open(&db.url(), options).await.expect("open");
    let stores = backend.stores();
    let funding: Vec<NewToken> = (0..4)
        .map(|index| NewToken {
            id: TokenId::new(tx("funding"), index),
            wallet: wallet(),
            token_type: chf(),
            quantity: q(10),
            spendable: true,
        })
        .collect();
    stores.tokens.add_tokens(&funding).await.expect("funded");
    let selector = TokenSelector::new(
        stores,
        Arc::new(SystemClock),
        SelectionConfig::default(),
        Some(1),
    )
    .expect("config");

    // Another connection (as another process would) holds the write lock for
    // longer than the whole select.
    let path = db.url().trim_start_matches("sqlite://").to_owned();
    let other = rusqlite::Connection::open(&path).expect("another connection");
    other
        .execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");

    let report = selector
        .select_with_stats(&wallet(), &chf(), q(15), &tx("t1"))
        .await;
    match &report.result {
        Err(e @ SelectError::Store(fault)) => {
            // The fault keeps its kind: busy, a 503 with Retry-After, not a 500.
            assert!(matches!(fault, StoreFault::Busy(_)), "{fault:?}");
            assert!(fault.to_string().contains("busy"), "{fault}");
            assert_eq!(e.kind(), holdfast::ErrorKind::Busy);
        }
        other => panic!("a select under a foreign write lock: {other:?}"),
    }
    // Every fetch of the select is a write on SQLite (read and claim in one);
    // the first waited out the busy timeout, the later ones only probed.
    let waits = backend.busy_waits();
    assert_eq!(waits.waited_out, 1, "{waits:?} {:?}", report.stats);
    assert!(waits.cut_short >= 1, "{waits:?} {:?}", report.stats);

    other.execute_batch("ROLLBACK").expect("let go");
    let selected = selector
        .select(&wallet(), &chf(), q(15), &tx("t2"))
        .await
        .expect("a select once the lock is free");
    assert_eq!(selected.tokens.len(), 2);
}
