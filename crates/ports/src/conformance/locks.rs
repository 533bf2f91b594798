//! Checks of the lock store: exactly one winner, verdicts, windows, release, spend,
//! sweep and the lock listing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use holdfast_domain::{ClaimVerdict, LeaseConfig, TokenId, TxId, TxStatus};
use tokio::sync::Barrier;

use super::TestDatabase;
use super::support::{T0, add, all_candidates, at, chf, ids, token_id, tx};
use crate::{LockStoreError, MAX_WINDOW, Stores};

/// The stores of the first instance and two replicas, for concurrency checks.
async fn three_instances(db: &dyn TestDatabase) -> Vec<Stores> {
    let mut out = vec![db.stores()];
    for _ in 0..2 {
        match db.replica().await {
            Ok(s) => out.push(s),
            Err(e) => panic!("conformance: could not open a replica: {e}"),
        }
    }
    out
}

/// Who holds each lock, per `list_locks`.
pub(crate) async fn holders(s: &Stores) -> BTreeMap<TokenId, TxId> {
    s.locks
        .list_locks()
        .await
        .expect("list_locks")
        .into_iter()
        .map(|l| (l.token, l.consumer))
        .collect()
}

/// Stale (missing, spent, not spendable) and contended (locked by another consumer,
/// or by the claimer itself) are told apart; a free token is won.
pub async fn claim_verdicts_stale_vs_contended(db: &dyn TestDatabase) {
    let s = db.stores();
    let mut off = chf("w", "off", 0, 1);
    off.spendable = false;
    add(
        &s,
        &[
            chf("w", "free", 0, 1),
            chf("w", "held", 0, 1),
            chf("w", "spent", 0, 1),
            off,
        ],
    )
    .await;
    let (me, other) = (tx("me"), tx("other"));
    assert_eq!(
        s.locks.claim(&other, &token_id("held", 0), T0).await,
        Ok(ClaimVerdict::Won)
    );
    assert_eq!(
        s.locks.claim(&other, &token_id("spent", 0), T0).await,
        Ok(ClaimVerdict::Won)
    );
    s.locks
        .spend_consumer(&other, T0, true)
        .await
        .expect("spend");
    assert_eq!(
        s.locks.claim(&other, &token_id("held", 0), T0).await,
        Ok(ClaimVerdict::Stale),
        "held:0 was spent by spend_consumer, so it is stale now"
    );
    // `other` is confirmed now, and a confirmed transaction wins nothing more
    // (conformance `confirm::*`): a third transaction holds the next token.
    add(&s, &[chf("w", "held", 1, 1)]).await;
    assert_eq!(
        s.locks.claim(&tx("third"), &token_id("held", 1), T0).await,
        Ok(ClaimVerdict::Won)
    );

    let cases = [
        ("missing", token_id("missing", 0), ClaimVerdict::Stale),
        ("spent", token_id("spent", 0), ClaimVerdict::Stale),
        ("not spendable", token_id("off", 0), ClaimVerdict::Stale),
        (
            "locked by another consumer",
            token_id("held", 1),
            ClaimVerdict::Contended,
        ),
        ("free", token_id("free", 0), ClaimVerdict::Won),
        (
            "locked by the claimer itself",
            token_id("free", 0),
            ClaimVerdict::Contended,
        ),
    ];
    for (what, token, want) in cases {
        assert_eq!(
            s.locks.claim(&me, &token, at(1)).await,
            Ok(want),
            "{what} token {token}"
        );
    }
    let held = holders(&s).await;
    assert_eq!(held.get(&token_id("free", 0)), Some(&me));
    assert_eq!(held.get(&token_id("held", 1)), Some(&tx("third")));
    assert_eq!(
        held.len(),
        2,
        "no lock was written for stale tokens: {held:?}"
    );
}

/// 16 tasks on three instances claim one token at the same moment: exactly one wins,
/// the other 15 are contended, and the lock row names the winner.
pub async fn sixteen_claimers_one_winner(db: &dyn TestDatabase) {
    let instances = three_instances(db).await;
    add(&instances[0], &[chf("w", "hot", 0, 100)]).await;
    let barrier = Arc::new(Barrier::new(16));
    let mut tasks = Vec::new();
    for i in 0..16usize {
        let s = instances[i % instances.len()].clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let me = tx(&format!("claimer-{i:02}"));
            barrier.wait().await;
            let verdict = s.locks.claim(&me, &token_id("hot", 0), T0).await;
            (me, verdict)
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        let (me, verdict) = t.await.expect("claim task panicked");
        match verdict {
            Ok(ClaimVerdict::Won) => winners.push(me),
            Ok(ClaimVerdict::Contended) => {}
            other => panic!("{me}: expected Won or Contended, got {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one winner, got {winners:?}");
    let held = holders(&instances[1]).await;
    assert_eq!(
        held.get(&token_id("hot", 0)),
        Some(&winners[0]),
        "the lock names the winner"
    );
}

/// 16 tasks on three instances claim overlapping windows at once: every token is
/// won by at most one consumer, each won token is locked by the consumer that was
/// told it won, and no token is reported won twice.
pub async fn overlapping_windows_one_winner_per_token(db: &dyn TestDatabase) {
    let instances = three_instances(db).await;
    let batch: Vec<_> = (0..24u32)
        .map(|i| chf("w", "pool", i, u128::from(i) + 1))
        .collect();
    add(&instances[0], &batch).await;
    let barrier = Arc::new(Barrier::new(16));
    let mut tasks = Vec::new();
    for i in 0..16u32 {
        let s = instances[usize::try_from(i).unwrap_or(0) % instances.len()].clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let me = tx(&format!("window-{i:02}"));
            // Windows of 9 starting at i (0..16) name every token 0..24, most of
            // them in several windows at once.
            let window: Vec<TokenId> = (i..i + 9).map(|k| token_id("pool", k % 24)).collect();
            barrier.wait().await;
            let verdicts = s.locks.claim_window(&me, &window, T0).await;
            (me, window, verdicts)
        }));
    }
    let mut won: BTreeMap<TokenId, TxId> = BTreeMap::new();
    for t in tasks {
        let (me, window, verdicts) = t.await.expect("window task panicked");
        let verdicts = verdicts.unwrap_or_else(|e| panic!("{me}: claim_window failed: {e}"));
        let named: Vec<TokenId> = verdicts.iter().map(|(t, _)| t.clone()).collect();
        assert_eq!(named, window, "{me}: verdicts come in the order given");
        for (token, verdict) in verdicts {
            match verdict {
                ClaimVerdict::Won => {
                    if let Some(first) = won.insert(token.clone(), me.clone()) {
                        panic!("{token} reported won by both {first} and {me}");
                    }
                }
                ClaimVerdict::Contended => {}
                ClaimVerdict::Stale => panic!("{me}: {token} is spendable, not stale"),
            }
        }
    }
    assert_eq!(
        holders(&instances[2]).await,
        won,
        "the lock rows are exactly the reported wins"
    );
    assert_eq!(
        won.len(),
        24,
        "every token was named by some window and won by one"
    );
}

/// Token `held:0` claimed by `other`, and `sp:0` claimed and spent by
/// `spender` (both already added).
async fn held_and_spent(s: &Stores) {
    s.locks
        .claim(&tx("other"), &token_id("held", 0), T0)
        .await
        .expect("claim");
    s.locks
        .claim(&tx("spender"), &token_id("sp", 0), T0)
        .await
        .expect("claim");
    s.locks
        .spend_consumer(&tx("spender"), T0, true)
        .await
        .expect("spend");
}

/// A window reports a verdict per token, in the order given: free tokens won,
/// tokens locked by others or named twice contended, spent/missing/non-spendable stale.
pub async fn window_verdicts_in_order(db: &dyn TestDatabase) {
    let s = db.stores();
    let mut off = chf("w", "off", 0, 1);
    off.spendable = false;
    add(
        &s,
        &[
            chf("w", "f", 0, 1),
            chf("w", "f", 1, 2),
            chf("w", "held", 0, 3),
            chf("w", "sp", 0, 4),
            off,
        ],
    )
    .await;
    held_and_spent(&s).await;
    let window = vec![
        token_id("f", 1),
        token_id("held", 0),
        token_id("missing", 7),
        token_id("sp", 0),
        token_id("off", 0),
        token_id("f", 0),
        token_id("f", 1),
    ];
    let got = s
        .locks
        .claim_window(&tx("me"), &window, at(5))
        .await
        .expect("claim_window");
    let want = vec![
        (token_id("f", 1), ClaimVerdict::Won),
        (token_id("held", 0), ClaimVerdict::Contended),
        (token_id("missing", 7), ClaimVerdict::Stale),
        (token_id("sp", 0), ClaimVerdict::Stale),
        (token_id("off", 0), ClaimVerdict::Stale),
        (token_id("f", 0), ClaimVerdict::Won),
        (token_id("f", 1), ClaimVerdict::Contended),
    ];
    assert_eq!(got, want);
    let held = holders(&s).await;
    assert_eq!(held.len(), 3, "{held:?}");
    assert_eq!(held.get(&token_id("f", 0)), Some(&tx("me")));
    assert_eq!(held.get(&token_id("f", 1)), Some(&tx("me")));
    assert_eq!(
        s.locks.claim_window(&tx("me"), &[], T0).await,
        Ok(Vec::new()),
        "empty window"
    );
}

/// Windows of every size from one to six tokens, repeats among them, get the
/// verdicts a window of many does (an adapter may claim small windows with a
/// statement of their own): free tokens won, a token named again or held by
/// another contended, spent, missing or not spendable stale; only the won are
/// held, by the claimer, and recorded as its selections.
pub async fn small_windows_verdicts(db: &dyn TestDatabase) {
    use ClaimVerdict::{Contended, Stale, Won};
    let s = db.stores();
    let mut off = chf("w", "off", 0, 1);
    off.spendable = false;
    let mut tokens = vec![chf("w", "held", 0, 3), chf("w", "sp", 0, 4), off];
    for size in 1..=6 {
        // Named to sort after the others: a statement that drops the last
        // distinct token of a window would answer the free ones stale.
        tokens.extend((0..2).map(|i| chf("w", &format!("z{size}"), i, 1)));
    }
    add(&s, &tokens).await;
    held_and_spent(&s).await;
    let mut want_held = BTreeMap::from([(token_id("held", 0), tx("other"))]);
    for size in 1..=6 {
        let free = format!("z{size}");
        let all = [
            (token_id(&free, 1), Won),
            (token_id("held", 0), Contended),
            (token_id(&free, 1), Contended),
            (token_id("sp", 0), Stale),
            (token_id(&free, 0), Won),
            (token_id("missing", 7), Stale),
        ];
        let forward: Vec<_> = all[..size].to_vec();
        let me = tx(&format!("me{size}"));
        let window: Vec<TokenId> = forward.iter().map(|(t, _)| t.clone()).collect();
        let got = s
            .locks
            .claim_window(&me, &window, at(5))
            .await
            .expect("claim_window");
        assert_eq!(got, forward, "a window of {size}");
        let won: BTreeSet<TokenId> = forward
            .iter()
            .filter(|(_, verdict)| *verdict == Won)
            .map(|(token, _)| token.clone())
            .collect();
        let selected = s.locks.selected(&me).await.expect("selected");
        assert_eq!(
            selected.into_iter().map(|t| t.id).collect::<BTreeSet<_>>(),
            won,
            "a window of {size}: the tokens won are recorded as selected"
        );
        want_held.extend(won.into_iter().map(|token| (token, me.clone())));
        let off_window = vec![token_id("off", 0); size];
        let want_off = vec![(token_id("off", 0), Stale); size];
        assert_eq!(
            s.locks
                .claim_window(&me, &off_window, at(5))
                .await
                .expect("claim_window"),
            want_off,
            "a window of {size} naming a token that is not spendable"
        );
    }
    assert_eq!(holders(&s).await, want_held);
}

/// A window of more than [`MAX_WINDOW`] tokens is refused before anything is
/// claimed; a window of exactly [`MAX_WINDOW`] is accepted.
pub async fn window_larger_than_max_is_rejected(db: &dyn TestDatabase) {
    let s = db.stores();
    let batch: Vec<_> = (0..=u32::try_from(MAX_WINDOW).unwrap_or(256))
        .map(|i| chf("w", "m", i, 1))
        .collect();
    add(&s, &batch).await;
    let all: Vec<TokenId> = batch.iter().map(|t| t.id.clone()).collect();
    let err = s.locks.claim_window(&tx("me"), &all, T0).await;
    assert_eq!(
        err,
        Err(LockStoreError::WindowTooLarge {
            len: MAX_WINDOW + 1,
            max: MAX_WINDOW
        })
    );
    assert!(
        holders(&s).await.is_empty(),
        "a refused window claims nothing"
    );
    let verdicts = s
        .locks
        .claim_window(&tx("me"), &all[..MAX_WINDOW], T0)
        .await
        .expect("256");
    assert!(verdicts.iter().all(|(_, v)| *v == ClaimVerdict::Won));
    assert_eq!(holders(&s).await.len(), MAX_WINDOW);
}

/// A window claim is one database round trip, whatever its size.
pub async fn window_claim_is_one_round_trip(db: &dyn TestDatabase) {
    let s = db.stores();
    let batch: Vec<_> = (0..64u32).map(|i| chf("w", "r", i, 1)).collect();
    add(&s, &batch).await;
    let window: Vec<TokenId> = batch.iter().map(|t| t.id.clone()).collect();
    let before = s.locks.round_trips();
    s.locks
        .claim_window(&tx("me"), &window, T0)
        .await
        .expect("claim_window");
    assert_eq!(s.locks.round_trips() - before, 1, "a 64-token window claim");
    let before = s.locks.round_trips();
    s.locks
        .claim(&tx("me2"), &token_id("r", 0), T0)
        .await
        .expect("claim");
    assert_eq!(s.locks.round_trips() - before, 1, "a single claim");
}

/// Three tokens of wallet `w`: consumer `a` holds `t:0` and `t:1` (one window),
/// consumer `b` holds `t:2`.
pub(crate) async fn two_holders(s: &Stores) -> (TxId, TxId) {
    add(
        s,
        &[
            chf("w", "t", 0, 1),
            chf("w", "t", 1, 2),
            chf("w", "t", 2, 3),
        ],
    )
    .await;
    let (a, b) = (tx("a"), tx("b"));
    s.locks
        .claim_window(&a, &[token_id("t", 0), token_id("t", 1)], T0)
        .await
        .expect("claim");
    s.locks
        .claim(&b, &token_id("t", 2), T0)
        .await
        .expect("claim");
    (a, b)
}

/// Releasing by consumer frees all of that consumer's locks and nobody else's; it is
/// idempotent.
pub async fn release_consumer_frees_exactly_its_locks(db: &dyn TestDatabase) {
    let s = db.stores();
    let (a, b) = two_holders(&s).await;
    assert_eq!(s.locks.release_consumer(&a, T0, true).await, Ok(2));
    assert_eq!(
        s.locks.release_consumer(&a, T0, true).await,
        Ok(0),
        "idempotent"
    );
    assert_eq!(
        s.locks.release_consumer(&tx("nobody"), T0, true).await,
        Ok(0)
    );
    let held = holders(&s).await;
    assert_eq!(held, BTreeMap::from([(token_id("t", 2), b)]));
    let cands = ids(&all_candidates(&s, "w", 10).await);
    assert_eq!(cands, vec![token_id("t", 0), token_id("t", 1)]);
}

/// `release_tokens` frees only the named tokens, and only those the consumer holds.
pub async fn release_tokens_frees_only_named_tokens_of_consumer(db: &dyn TestDatabase) {
    let s = db.stores();
    let (a, b) = two_holders(&s).await;
    let named = [token_id("t", 0), token_id("t", 2), token_id("missing", 0)];
    assert_eq!(s.locks.release_tokens(&a, &named).await, Ok(1));
    assert_eq!(
        s.locks.release_tokens(&a, &named).await,
        Ok(0),
        "idempotent"
    );
    assert_eq!(s.locks.release_tokens(&a, &[]).await, Ok(0));
    let held = holders(&s).await;
    assert_eq!(
        held,
        BTreeMap::from([(token_id("t", 1), a), (token_id("t", 2), b)])
    );
}

/// `spend_consumer` marks every token the consumer holds spent by it and releases
/// those locks in one step; others' locks stay; a repeat spends nothing.
pub async fn spend_consumer_marks_spent_and_releases(db: &dyn TestDatabase) {
    let s = db.stores();
    add(
        &s,
        &[
            chf("w", "t", 0, 1),
            chf("w", "t", 1, 2),
            chf("w", "t", 2, 4),
        ],
    )
    .await;
    let (a, b) = (tx("a"), tx("b"));
    s.locks
        .claim_window(&a, &[token_id("t", 1), token_id("t", 0)], T0)
        .await
        .expect("claim");
    s.locks
        .claim(&b, &token_id("t", 2), T0)
        .await
        .expect("claim");
    let mut spent = s
        .locks
        .spend_consumer(&a, at(60_000), true)
        .await
        .expect("spend");
    spent.sort();
    assert_eq!(spent, vec![token_id("t", 0), token_id("t", 1)]);
    for i in [0, 1] {
        let t = s
            .tokens
            .token(&token_id("t", i))
            .await
            .expect("token")
            .expect("stored");
        assert_eq!(t.spent_by, Some(a.clone()), "t:{i} spent by a");
        assert_eq!(t.spent_at, Some(at(60_000)), "t:{i} spent at");
    }
    let held = holders(&s).await;
    assert_eq!(held, BTreeMap::from([(token_id("t", 2), b.clone())]));
    assert_eq!(
        s.locks.spend_consumer(&a, at(70_000), true).await,
        Ok(Vec::new()),
        "idempotent"
    );
    let t0 = s
        .tokens
        .token(&token_id("t", 0))
        .await
        .expect("token")
        .expect("stored");
    assert_eq!(
        t0.spent_at,
        Some(at(60_000)),
        "a repeat does not move spent_at"
    );
    assert_eq!(
        s.tokens
            .balance(
                &super::support::wallet("w"),
                &super::support::token_type("CHF")
            )
            .await,
        Ok(super::support::amount(4))
    );
    assert!(
        all_candidates(&s, "w", 10).await.is_empty(),
        "t:2 is locked, t:0 and t:1 spent"
    );
}

/// The sweep deletes locks older than the lease and locks of Deleted or Orphan
/// consumers, and nothing else (a lock exactly at the lease edge stays): exactly
/// what the domain's `SweepRule` says of each lock.
pub async fn sweep_removes_expired_and_dead_consumers_only(db: &dyn TestDatabase) {
    let s = db.stores();
    let batch: Vec<_> = (0..8u32).map(|i| chf("w", "t", i, 1)).collect();
    add(&s, &batch).await;
    let lease = Duration::from_secs(180);
    let now = at(1_000_000);
    let edge = now.saturating_sub(lease);
    let claims = [
        ("old", 0u32, at(0), None),
        ("just-old", 1, holdfast_domain::Timestamp(edge.0 - 1), None),
        ("edge", 2, edge, None),
        ("fresh", 3, at(999_000), Some(TxStatus::Pending)),
        ("deleted", 4, at(999_000), Some(TxStatus::Deleted)),
        ("orphan", 5, at(999_000), Some(TxStatus::Orphan)),
        ("busy", 6, at(999_000), Some(TxStatus::Busy)),
        ("unknown", 7, at(999_000), Some(TxStatus::Unknown)),
    ];
    for (consumer, i, when, status) in &claims {
        let c = tx(consumer);
        assert_eq!(
            s.locks.claim(&c, &token_id("t", *i), *when).await,
            Ok(ClaimVerdict::Won)
        );
        if let Some(st) = status {
            s.statuses
                .record_status(&c, *st, *when)
                .await
                .expect("record_status");
        }
    }
    let rule = LeaseConfig {
        lease_expiry: lease,
        ..LeaseConfig::default()
    }
    .sweep_rule(now);
    let report = s.locks.sweep(rule).await.expect("sweep");
    assert!(report.leader, "a lone sweeper leads");
    assert_eq!(report.expired, 2, "{report:?}");
    assert_eq!(report.released_by_status, 2, "{report:?}");
    let left: BTreeSet<TxId> = holders(&s).await.into_values().collect();
    let want: BTreeSet<TxId> = ["edge", "fresh", "busy", "unknown"]
        .into_iter()
        .map(tx)
        .collect();
    assert_eq!(left, want);
    // The adapter applied the domain's rule, lock by lock.
    for (consumer, _, when, status) in &claims {
        assert_eq!(
            left.contains(&tx(consumer)),
            !rule.sweeps(*when, *status),
            "{consumer}: the sweep must follow SweepRule::sweeps"
        );
    }
    let again = s.locks.sweep(rule).await.expect("sweep");
    assert_eq!(
        (again.expired, again.released_by_status),
        (0, 0),
        "nothing left to sweep"
    );
}

/// `list_locks` lists every lock oldest first, with the exact claim time and the
/// consumer's recorded status.
pub async fn list_locks_oldest_first_with_status(db: &dyn TestDatabase) {
    let s = db.stores();
    add(
        &s,
        &[
            chf("w", "t", 0, 1),
            chf("w", "t", 1, 1),
            chf("w", "t", 2, 1),
        ],
    )
    .await;
    assert!(s.locks.list_locks().await.expect("list").is_empty());
    s.locks
        .claim(&tx("late"), &token_id("t", 0), at(2_345))
        .await
        .expect("claim");
    s.locks
        .claim(&tx("early"), &token_id("t", 1), at(1))
        .await
        .expect("claim");
    s.locks
        .claim(&tx("mid"), &token_id("t", 2), at(999))
        .await
        .expect("claim");
    s.statuses
        .record_status(&tx("early"), TxStatus::Pending, at(1))
        .await
        .expect("status");
    s.statuses
        .record_status(&tx("mid"), TxStatus::Confirmed, at(2))
        .await
        .expect("status");
    let locks = s.locks.list_locks().await.expect("list");
    let got: Vec<_> = locks
        .iter()
        .map(|l| {
            (
                l.token.clone(),
                l.consumer.clone(),
                l.created_at,
                l.consumer_status,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                token_id("t", 1),
                tx("early"),
                at(1),
                Some(TxStatus::Pending)
            ),
            (
                token_id("t", 2),
                tx("mid"),
                at(999),
                Some(TxStatus::Confirmed)
            ),
            (token_id("t", 0), tx("late"), at(2_345), None),
        ]
    );
}
