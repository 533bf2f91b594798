//! Lost races on PostgreSQL, through the selector: a burst of selects on a
//! small wallet, all started before any of them read it, reads again with the
//! claim under the wallet's advisory lock once its read comes back thin
//! (`docs/selection.md`, "Reading and claiming in one transaction"), and loses
//! no race.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use holdfast::TokenSelector;
use holdfast::selector::SelectReport;
use holdfast_adapters_postgres::LockStrategy;
use holdfast_domain::{ClaimVerdict, SelectionConfig, TokenId, TokenType, WalletId};
use holdfast_ports::{Clock, NewToken};
use tokio::sync::Barrier;

use crate::common::{TokioClock, q, tx};
use crate::pg_support::TestDb;

/// Selects of `amounts` on `wallet`, all started at once (a barrier), each under
/// a consumer named `{name}{i}`; their reports in the order of `amounts`.
async fn burst(
    selector: &Arc<TokenSelector>,
    wallet: &WalletId,
    chf: &TokenType,
    name: &str,
    amounts: &[u128],
) -> Vec<SelectReport> {
    let barrier = Arc::new(Barrier::new(amounts.len()));
    let tasks: Vec<_> = amounts
        .iter()
        .enumerate()
        .map(|(i, &amount)| {
            let (selector, barrier) = (selector.clone(), barrier.clone());
            let (wallet, chf) = (wallet.clone(), chf.clone());
            let consumer = tx(&format!("{name}{i}"));
            tokio::spawn(async move {
                barrier.wait().await;
                selector
                    .select_with_stats(&wallet, &chf, q(amount), &consumer)
                    .await
            })
        })
        .collect();
    let mut reports = Vec::new();
    for task in tasks {
        reports.push(task.await.expect("select task"));
    }
    reports
}

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
    let (mut conflicts, mut read_again) = (0, 0);
    for report in burst(&selector, &wallet, &chf, "c", &[10; CALLERS as usize]).await {
        assert!(report.result.is_ok(), "{:?}", report.result);
        conflicts += report.stats.conflicts;
        // Read alone, found thin, read again with the claim: two reads, one
        // claim, all round trips but a first read the instance's snapshot
        // answered (`docs/selection.md`, "A snapshot of a hot wallet").
        if report.stats.claims_with_read == 1 && report.stats.fetches == 2 {
            read_again += 1;
            let round_trips = 2 - report.stats.reads_from_snapshot;
            assert_eq!(
                report.stats.round_trips(),
                round_trips,
                "{:?}",
                report.stats
            );
        }
    }
    assert_eq!(conflicts, 0, "a select of the burst lost a race");
    assert!(read_again > 0, "no select read again with its claim");
}

/// A snapshot of a hot wallet out of date (`docs/selection.md`, "A snapshot of
/// a hot wallet"): after a first burst made the instance read its snapshot,
/// most of the tokens still in it are withdrawn behind its back and new ones
/// added. A second burst answered from the snapshot finds the withdrawn tokens
/// stale at its claims, reads the store, and every select still gets tokens
/// that are spendable, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_snapshot_out_of_date_costs_reads_never_a_withdrawn_token() {
    let Some(db) = TestDb::create("races::snapshot_out_of_date").await else {
        return;
    };
    const CALLERS: u32 = 8;
    let backend = db.backend(LockStrategy::default(), CALLERS).await;
    let stores = backend.stores();
    let (wallet, chf) = (
        WalletId::new("hot").expect("wallet"),
        TokenType::new("CHF").expect("type"),
    );
    let token = |fund: &str, n: u32| NewToken {
        id: TokenId::new(tx(fund), n),
        wallet: wallet.clone(),
        token_type: chf.clone(),
        quantity: q(10),
        spendable: true,
    };
    let first: Vec<NewToken> = (0..5 * CALLERS).map(|n| token("first", n)).collect();
    stores.tokens.add_tokens(&first).await.expect("funded");
    // A snapshot that stays fresh for the whole test, so the second burst
    // surely reads it.
    let config = SelectionConfig {
        snapshot_ttl: Duration::from_secs(60),
        ..SelectionConfig::default()
    };
    let selector = Arc::new(
        TokenSelector::new(stores.clone(), TokioClock::new(), config, Some(5)).expect("config"),
    );
    let mut selected = HashSet::new();
    let amounts = [10; CALLERS as usize];
    for report in burst(&selector, &wallet, &chf, "a", &amounts).await {
        let tokens = report.result.expect("first burst").tokens;
        assert!(tokens.iter().all(|t| selected.insert(t.clone())));
    }
    // Behind the snapshot's back: the free tokens but the last few withdrawn,
    // as many new ones added.
    let free: Vec<&NewToken> = first.iter().filter(|t| !selected.contains(&t.id)).collect();
    let (withdrawn, kept) = free.split_at(free.len() - CALLERS as usize / 2);
    for t in withdrawn {
        assert!(
            stores
                .tokens
                .set_spendable(&t.id, false)
                .await
                .expect("withdrawn")
        );
    }
    let added: Vec<NewToken> = (0..CALLERS).map(|n| token("added", n)).collect();
    stores.tokens.add_tokens(&added).await.expect("added");
    let spendable: HashSet<TokenId> = kept
        .iter()
        .map(|t| t.id.clone())
        .chain(added.iter().map(|t| t.id.clone()))
        .collect();
    let (mut from_snapshot, mut stale) = (0, 0);
    for report in burst(&selector, &wallet, &chf, "b", &amounts).await {
        from_snapshot += report.stats.reads_from_snapshot;
        stale += report.stats.stale;
        let tokens = report.result.expect("second burst").tokens;
        for t in tokens {
            assert!(
                spendable.contains(&t),
                "{t} was withdrawn or selected before"
            );
            assert!(selected.insert(t.clone()), "{t} selected twice");
        }
    }
    assert!(from_snapshot > 0, "no select read the snapshot");
    assert!(stale > 0, "no claim found the snapshot out of date");
}

/// A race lost from a snapshot's read is never answered from that read alone
/// (`docs/selection.md`, "A snapshot of a hot wallet"): the instance read its
/// snapshot of a wallet of one cover of 1,000 and 200 tokens of 1; since, another
/// transaction took the cover and a new one was added. A select of 120 answered
/// from the snapshot loses its claim of the old cover; the small tokens cover
/// 120 only beyond `max_inputs`, which from the snapshot alone would answer
/// `TooManyInputs`. It reads the store instead and gets the new cover. Rounds on
/// fresh wallets until one select of 120 read the snapshot (whether it does
/// depends on the other callers' timing).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_race_lost_from_a_snapshot_reads_the_store_before_answering() {
    let Some(db) = TestDb::create("races::lost_from_a_snapshot").await else {
        return;
    };
    const SMALL: u32 = 6;
    let backend = db.backend(LockStrategy::default(), SMALL + 2).await;
    let stores = backend.stores();
    let clock = TokioClock::new();
    let config = SelectionConfig {
        snapshot_ttl: Duration::from_secs(60),
        ..SelectionConfig::default()
    };
    let selector = Arc::new(
        TokenSelector::new(stores.clone(), clock.clone(), config, Some(7)).expect("config"),
    );
    let chf = TokenType::new("CHF").expect("type");
    for round in 0..40 {
        let wallet = WalletId::new(format!("hot{round}")).expect("wallet");
        let token = |fund: &str, n: u32, v: u128| NewToken {
            id: TokenId::new(tx(&format!("{fund}{round}")), n),
            wallet: wallet.clone(),
            token_type: chf.clone(),
            quantity: q(v),
            spendable: true,
        };
        let mut funds: Vec<NewToken> = (0..200).map(|n| token("dust", n, 1)).collect();
        funds.push(token("old", 0, 1_000));
        stores.tokens.add_tokens(&funds).await.expect("funded");
        // Selects of 1 beside each other: the instance reads its snapshot.
        let small = [1; SMALL as usize];
        for report in burst(&selector, &wallet, &chf, &format!("a{round}-"), &small).await {
            report.result.expect("a select of 1");
        }
        let old = TokenId::new(tx(&format!("old{round}")), 0);
        let other = stores.locks.claim(&tx("other"), &old, clock.now()).await;
        assert_eq!(other.expect("claim"), ClaimVerdict::Won);
        let new = token("new", 0, 1_000);
        stores
            .tokens
            .add_tokens(std::slice::from_ref(&new))
            .await
            .expect("added");
        let with_120: Vec<u128> = small.iter().copied().chain([120]).collect();
        let name = format!("b{round}-");
        let reports = burst(&selector, &wallet, &chf, &name, &with_120).await;
        for (report, amount) in reports.into_iter().zip(with_120) {
            let selected = report.result.expect("every select is answered with tokens");
            if amount == 120 && report.stats.reads_from_snapshot > 0 {
                assert_eq!(
                    selected.tokens,
                    std::slice::from_ref(&new.id),
                    "{:?}",
                    report.stats
                );
                return;
            }
        }
    }
    panic!("in 40 rounds no select of 120 read the snapshot");
}
