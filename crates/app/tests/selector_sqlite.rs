//! The token selector on the real SQLite adapter: a failed select releases only
//! its own locks; earlier selects of the same transaction keep theirs.

use std::sync::Arc;

use holdfast::{SelectError, SystemClock, TokenSelector};
use holdfast_adapters_sqlite::SqliteBackend;
use holdfast_domain::{Precision, Quantity, SelectionConfig, TokenId, TokenType, TxId, WalletId};
use holdfast_ports::NewToken;

fn q(v: u128) -> Quantity {
    Quantity::new(v, Precision::MAX).expect("quantity")
}

fn tx(id: &str) -> TxId {
    TxId::new(id).expect("tx")
}

fn wallet() -> WalletId {
    WalletId::new("alice").expect("wallet")
}

fn chf() -> TokenType {
    TokenType::new("CHF").expect("type")
}

#[tokio::test]
async fn a_failed_select_keeps_the_locks_of_an_earlier_select_of_the_same_tx() {
    let backend = SqliteBackend::open_in_memory().await.expect("open");
    let stores = backend.stores();
    let funding: Vec<NewToken> = [3u128, 4, 10]
        .into_iter()
        .zip(0u32..)
        .map(|(amount, index)| NewToken {
            id: TokenId::new(tx("funding"), index),
            wallet: wallet(),
            token_type: chf(),
            quantity: q(amount),
            spendable: true,
        })
        .collect();
    stores.tokens.add_tokens(&funding).await.expect("funded");
    let selector = TokenSelector::new(
        stores.clone(),
        Arc::new(SystemClock),
        SelectionConfig::default(),
        Some(1),
    )
    .expect("config");

    let first = selector
        .select(&wallet(), &chf(), q(3), &tx("t1"))
        .await
        .expect("first select");
    assert_eq!(first.tokens, vec![TokenId::new(tx("funding"), 0)]);

    // The second select of t1 claims what is left (4 and 10), then the balance
    // (17) is below 100: insufficient funds, and it releases its own wins only.
    let second = selector
        .select_with_stats(&wallet(), &chf(), q(100), &tx("t1"))
        .await;
    assert_eq!(
        second.result,
        Err(SelectError::InsufficientFunds {
            available: q(17),
            requested: q(100)
        })
    );
    assert_eq!(second.stats.lock_attempts, 2, "{:?}", second.stats);
    assert_eq!(second.stats.releases, 1, "{:?}", second.stats);

    let locks = stores.locks.list_locks().await.expect("locks");
    let held: Vec<(TokenId, TxId)> = locks.into_iter().map(|l| (l.token, l.consumer)).collect();
    assert_eq!(held, vec![(TokenId::new(tx("funding"), 0), tx("t1"))]);
}
