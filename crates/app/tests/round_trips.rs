//! An uncontended select costs two round trips on PostgreSQL, read and claim,
//! and one on SQLite (it reads and claims in one transaction), through the
//! selector on the real backends, also when the smallest amount has a run of
//! more tokens than a page holds (that run is not held back for later pages once
//! the page at hand covers the amount). Counted by the adapter and by the select.
//! A confirm with change is one round trip on PostgreSQL (the confirm works the
//! change out itself), two on SQLite (a read of the inputs, then the confirm); a
//! retry after its answer was lost answers the same outputs, replayed.

use holdfast::TokenSelector;
use holdfast::settlement::Settlement;
use holdfast_adapters_postgres::LockStrategy;
use holdfast_adapters_sqlite::SqliteBackend;
use holdfast_domain::{PersistPolicy, SelectionConfig, TokenId, TokenType, WalletId};
use holdfast_ports::{NewToken, Output, Stores};

use crate::common::{TokioClock, q, tx};
use crate::pg_support::TestDb;

/// 300 tokens of 1 and 50 of 100 in `wallet`; a select of 10, then of 150,
/// each in `round_trips`; then the confirm of the second, paying 150 to `payee`
/// with change back to `wallet`, in `confirm_round_trips`, and its retry.
async fn check(stores: Stores, wallet: &str, round_trips: u64, confirm_round_trips: u64) {
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
    let settlement = Settlement::new(stores.clone(), TokioClock::new(), PersistPolicy::default());
    let paid = Output {
        wallet: WalletId::new(format!("payee-{wallet}")).expect("wallet"),
        token_type: chf.clone(),
        quantity: q(150),
    };
    let large = tx(&format!("large-{wallet}"));
    let before = stores.locks.round_trips();
    let confirmed = settlement
        .confirm(&large, std::slice::from_ref(&paid), Some(&wallet))
        .await
        .expect("confirmed");
    assert_eq!(stores.locks.round_trips() - before, confirm_round_trips);
    let (ids, outputs): (Vec<TokenId>, Vec<Output>) = confirmed.outputs.iter().cloned().unzip();
    assert_eq!(
        ids,
        vec![
            TokenId::new(large.clone(), 0),
            TokenId::new(large.clone(), 1)
        ]
    );
    assert_eq!(outputs[0], paid);
    assert_eq!(
        (&outputs[1].wallet, &outputs[1].token_type),
        (&wallet, &chf)
    );
    assert!(
        !confirmed.replayed && outputs[1].quantity.value() > 0,
        "{confirmed:?}"
    );
    let again = settlement
        .confirm(&large, std::slice::from_ref(&paid), Some(&wallet))
        .await
        .expect("a retry after a lost answer");
    assert!(again.replayed, "{again:?}");
    assert_eq!(again.outputs, confirmed.outputs);
}

#[tokio::test]
async fn sqlite_an_uncontended_select_is_one_round_trip() {
    let backend = SqliteBackend::open_in_memory().await.expect("open");
    check(backend.stores(), "w", 1, 2).await;
}

#[tokio::test]
async fn postgres_an_uncontended_select_is_two_round_trips() {
    let Some(db) = TestDb::create("round_trips::uncontended_select").await else {
        return;
    };
    for strategy in LockStrategy::ALL {
        let backend = db.backend(strategy, 2).await;
        check(backend.stores(), &format!("w-{strategy}"), 2, 1).await;
    }
}
