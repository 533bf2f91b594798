//! Lost races on PostgreSQL, through the selector: a burst of selects on a
//! small wallet, all started before any of them read it, reads again with the
//! claim under the wallet's advisory lock once its read comes back thin
//! (`docs/selection.md`, "Reading and claiming in one transaction"), and loses
//! no race.

use std::sync::Arc;

use holdfast::TokenSelector;
use holdfast_adapters_postgres::LockStrategy;
use holdfast_domain::{SelectionConfig, TokenId, TokenType, WalletId};
use holdfast_ports::NewToken;
use tokio::sync::Barrier;

use crate::common::{TokioClock, q, tx};
use crate::pg_support::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_burst_of_selects_on_a_small_wallet_loses_no_race() {
    let Some(db) = TestDb::create("races::burst_on_a_small_wallet").await else {
        return;
    };
    const CALLERS: u32 = 12;
    let backend = db.backend(LockStrategy::default(), CALLERS).await;
    let stores = backend.stores();
    let (wallet, chf) = (
        WalletId::new("small").expect("wallet"),
        TokenType::new("CHF").expect("type"),
    );
    let tokens: Vec<NewToken> = (0..CALLERS)
        .map(|n| NewToken {
            id: TokenId::new(tx("fund"), n),
            wallet: wallet.clone(),
            token_type: chf.clone(),
            quantity: q(10),
            spendable: true,
        })
        .collect();
    stores.tokens.add_tokens(&tokens).await.expect("funded");
    let selector = Arc::new(
        TokenSelector::new(
            stores,
            TokioClock::new(),
            SelectionConfig::default(),
            Some(3),
        )
        .expect("config"),
    );
    let barrier = Arc::new(Barrier::new(CALLERS as usize));
    let mut tasks = Vec::new();
    for i in 0..CALLERS {
        let (selector, barrier) = (selector.clone(), barrier.clone());
        let (wallet, chf) = (wallet.clone(), chf.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            selector
                .select_with_stats(&wallet, &chf, q(10), &tx(&format!("c{i}")))
                .await
        }));
    }
    let (mut conflicts, mut read_again) = (0, 0);
    for task in tasks {
        let report = task.await.expect("task");
        assert!(report.result.is_ok(), "{:?}", report.result);
        conflicts += report.stats.conflicts;
        // Read alone, found thin, read again with the claim: two reads, one
        // claim, both counted as round trips.
        if report.stats.claims_with_read == 1 && report.stats.fetches == 2 {
            read_again += 1;
            assert_eq!(report.stats.round_trips(), 2, "{:?}", report.stats);
        }
    }
    assert_eq!(conflicts, 0, "a select of the burst lost a race");
    assert!(read_again > 0, "no select read again with its claim");
}
