//! An uncontended select costs two round trips on PostgreSQL, read and claim,
//! and one on SQLite (it reads and claims in one transaction), through the
//! selector on the real backends, also when the smallest amount has a run of
//! more tokens than a page holds (that run is not held back for later pages once
//! the page at hand covers the amount). Counted by the adapter and by the select.

use holdfast::TokenSelector;
use holdfast_adapters_postgres::LockStrategy;
use holdfast_adapters_sqlite::SqliteBackend;
use holdfast_domain::{SelectionConfig, TokenId, TokenType, WalletId};
use holdfast_ports::{NewToken, Stores};

use crate::common::{TokioClock, q, tx};
use crate::pg_support::TestDb;

/// 300 tokens of 1 and 50 of 100 in `wallet`; a select of 10, then of 150,
/// each in `round_trips`.
async fn check(stores: Stores, wallet: &str, round_trips: u64) {
    let fund = tx(&format!("fund-{wallet}"));
    let (wallet, chf) = (
        WalletId::new(wallet).expect("wallet"),
        TokenType::new("CHF").expect("type"),
    );
    let tokens: Vec<NewToken> = (0..350u32)
        .map(|n| NewToken {
            id: TokenId::new(fund.clone(), n),
            wallet: wallet.clone(),
            token_type: chf.clone(),
            quantity: q(if n < 300 { 1 } else { 100 }),
            spendable: true,
        })
        .collect();
    stores.tokens.add_tokens(&tokens).await.expect("funded");
    let selector = TokenSelector::new(
        stores.clone(),
        TokioClock::new(),
        SelectionConfig::default(),
        Some(5),
    )
    .expect("config");
    for (amount, name) in [(10, "small"), (150, "large")] {
        let before = stores.locks.round_trips();
        let report = selector
            .select_with_stats(&wallet, &chf, q(amount), &tx(&format!("{name}-{wallet}")))
            .await;
        let selected = report.result.expect("the wallet covers it");
        assert!(selected.total >= q(amount));
        assert_eq!(
            report.stats.round_trips(),
            round_trips,
            "{name}: {:?}",
            report.stats
        );
        assert_eq!(
            stores.locks.round_trips() - before,
            round_trips,
            "{name}: the adapter's count"
        );
    }
}

#[tokio::test]
async fn sqlite_an_uncontended_select_is_one_round_trip() {
    let backend = SqliteBackend::open_in_memory().await.expect("open");
    check(backend.stores(), "w", 1).await;
}

#[tokio::test]
async fn postgres_an_uncontended_select_is_two_round_trips() {
    let Some(db) = TestDb::create("round_trips::uncontended_select").await else {
        return;
    };
    for strategy in LockStrategy::ALL {
        let backend = db.backend(strategy, 2).await;
        check(backend.stores(), &format!("w-{strategy}"), 2).await;
    }
}
