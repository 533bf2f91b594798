//! Checks of settlement against the lease sweep: what a transaction selected is
//! kept apart from its locks, so a confirmed spend is never lost; a token selected
//! twice (its lease expired in between) is spent once and the second spender gets
//! a typed double-spend error that changes nothing; a select can re-stamp its
//! locks; a status is recorded in the same transaction as its spend or release; a
//! transaction never wins a token it already selected.

use holdfast_domain::{ClaimVerdict, LeaseConfig, SweepRule, TxStatus};

use super::TestDatabase;
use super::locks::{holders, two_holders};
use super::support::{T0, add, all_candidates, amount, at, chf, token_id, token_type, tx, wallet};
use crate::LockStoreError;

/// A time at which a lock claimed at [`T0`] has outlived the default lease.
const LATER: u64 = 1_000_000;

/// The sweep rule at `millis` with the default lease (3 min).
fn expired_at(millis: u64) -> SweepRule {
    LeaseConfig::default().sweep_rule(at(millis))
}

/// t1 selects a token, the sweep takes its lock (slow finality), t1 confirms: the
/// token is spent by t1 and no longer a candidate; a second Confirmed spends nothing.
pub async fn confirmed_spends_what_was_selected_even_after_the_sweep(db: &dyn TestDatabase) {
    let s = db.stores();
    add(&s, &[chf("w", "t", 0, 10), chf("w", "t", 1, 5)]).await;
    let t1 = tx("t1");
    assert_eq!(
        s.locks.claim(&t1, &token_id("t", 0), T0).await,
        Ok(ClaimVerdict::Won)
    );
    let report = s.locks.sweep(expired_at(LATER)).await.expect("sweep");
    assert_eq!(report.expired, 1, "the lease ran out: {report:?}");
    assert!(holders(&s).await.is_empty(), "the lock is gone");
    assert_eq!(
        s.locks.unsettled().await,
        Ok(vec![(t1.clone(), None)]),
        "the selection outlives the lock"
    );

    let spent = s
        .locks
        .spend_consumer(&t1, at(LATER + 1), true)
        .await
        .expect("spend");
    assert_eq!(spent, vec![token_id("t", 0)], "the swept token is spent");
    let stored = s.tokens.token(&token_id("t", 0)).await.expect("token");
    assert_eq!(stored.and_then(|t| t.spent_by), Some(t1.clone()));
    assert_eq!(
        s.statuses.status(&t1).await,
        Ok(Some(TxStatus::Confirmed)),
        "the status is recorded with the spend"
    );
    let left: Vec<_> = all_candidates(&s, "w", 10)
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(
        left,
        vec![token_id("t", 1)],
        "only the other token is spendable"
    );
    assert_eq!(
        s.tokens.balance(&wallet("w"), &token_type("CHF")).await,
        Ok(amount(5))
    );
    assert_eq!(
        s.locks.spend_consumer(&t1, at(LATER + 2), true).await,
        Ok(Vec::new()),
        "idempotent"
    );
    assert_eq!(
        s.locks.unsettled().await,
        Ok(Vec::new()),
        "nothing unsettled"
    );
}

/// t1's lease expires, t2 locks the same token, t1 confirms (t1 spends it), then
/// t2 confirms: a double-spend error naming the token and t1; t2's lock, selection
/// and status are untouched, and so is the token.
pub async fn a_second_confirmed_spender_is_a_double_spend_that_changes_nothing(
    db: &dyn TestDatabase,
) {
    let s = db.stores();
    add(&s, &[chf("w", "t", 0, 10), chf("w", "t", 1, 3)]).await;
    let (t1, t2) = (tx("t1"), tx("t2"));
    assert_eq!(
        s.locks.claim(&t1, &token_id("t", 0), T0).await,
        Ok(ClaimVerdict::Won)
    );
    s.locks.sweep(expired_at(LATER)).await.expect("sweep");
    assert_eq!(
        s.locks
            .claim_window(&t2, &[token_id("t", 0), token_id("t", 1)], at(LATER))
            .await,
        Ok(vec![
            (token_id("t", 0), ClaimVerdict::Won),
            (token_id("t", 1), ClaimVerdict::Won)
        ]),
        "t2 selects the swept token again"
    );
    assert_eq!(
        s.locks.spend_consumer(&t1, at(LATER + 1), true).await,
        Ok(vec![token_id("t", 0)]),
        "t1 confirms first: the token is its"
    );
    let held = holders(&s).await;
    assert_eq!(held.get(&token_id("t", 0)), Some(&t2), "t2's lock stays");

    let err = s
        .locks
        .spend_consumer(&t2, at(LATER + 2), true)
        .await
        .expect_err("double spend");
    assert_eq!(
        err,
        LockStoreError::DoubleSpend {
            token: token_id("t", 0),
            spent_by: t1.clone(),
        }
    );
    assert!(err.to_string().contains("t1"), "{err}");
    assert_eq!(s.statuses.status(&t2).await, Ok(None), "no status recorded");
    let other = s.tokens.token(&token_id("t", 1)).await.expect("token");
    assert_eq!(
        other.and_then(|t| t.spent_by),
        None,
        "t2's other input is not spent either"
    );
    assert_eq!(holders(&s).await, held, "no lock changed");
    assert_eq!(
        s.locks.unsettled().await,
        Ok(vec![(t2.clone(), None)]),
        "t2 is still unsettled"
    );
    // t2 is abandoned: deleting it gives back its other input.
    assert_eq!(
        s.locks.release_consumer(&t2, at(LATER + 3), true).await,
        Ok(2)
    );
    assert_eq!(s.statuses.status(&t2).await, Ok(Some(TxStatus::Deleted)));
    assert_eq!(s.locks.unsettled().await, Ok(Vec::new()));
    assert_eq!(
        s.tokens.balance(&wallet("w"), &token_type("CHF")).await,
        Ok(amount(3))
    );
}

/// `renew` re-stamps the locks a consumer still holds (the sweep then keeps them)
/// and leaves out the ones it lost.
pub async fn renew_restamps_held_locks_and_reports_lost_ones(db: &dyn TestDatabase) {
    let s = db.stores();
    let (a, _b) = two_holders(&s).await;
    // a renews t:0 (and cannot renew b's t:2); the sweep then takes a's t:1 and
    // b's t:2.
    let renewed = s
        .locks
        .renew(&a, &[token_id("t", 0), token_id("t", 2)], at(LATER - 1_000))
        .await;
    assert_eq!(
        renewed,
        Ok(vec![token_id("t", 0)]),
        "t:2 is b's, so not renewed for a"
    );
    let report = s.locks.sweep(expired_at(LATER)).await.expect("sweep");
    assert_eq!(report.expired, 2, "t:1 and b's t:2 expired: {report:?}");
    let held = holders(&s).await;
    assert_eq!(held.len(), 1);
    assert_eq!(
        held.get(&token_id("t", 0)),
        Some(&a),
        "the renewed lock stays"
    );
    assert_eq!(
        s.locks
            .renew(&a, &[token_id("t", 0), token_id("t", 1)], at(LATER))
            .await,
        Ok(vec![token_id("t", 0)]),
        "the swept lock is reported lost"
    );
    assert_eq!(s.locks.renew(&a, &[], at(LATER)).await, Ok(Vec::new()));
}

/// Giving tokens back (a failed or cancelled select) forgets them as selected: a
/// later Confirmed of the same transaction does not spend them.
pub async fn release_tokens_forgets_the_selection(db: &dyn TestDatabase) {
    let s = db.stores();
    add(&s, &[chf("w", "t", 0, 1), chf("w", "t", 1, 1)]).await;
    let a = tx("a");
    s.locks
        .claim_window(&a, &[token_id("t", 0), token_id("t", 1)], T0)
        .await
        .expect("claim");
    assert_eq!(s.locks.release_tokens(&a, &[token_id("t", 1)]).await, Ok(1));
    s.locks.sweep(expired_at(LATER)).await.expect("sweep");
    assert_eq!(
        s.locks.spend_consumer(&a, at(LATER), true).await,
        Ok(vec![token_id("t", 0)]),
        "only what the transaction kept is spent"
    );
    let given_back = s.tokens.token(&token_id("t", 1)).await.expect("token");
    assert_eq!(given_back.and_then(|t| t.spent_by), None);
}

/// A transaction whose lock on X was swept cannot win X again in a later select:
/// that claim is contended (the earlier select has X), so a failure of the later
/// select cannot give X back, and Confirmed still spends it.
pub async fn a_consumer_cannot_win_its_own_swept_token_twice(db: &dyn TestDatabase) {
    let s = db.stores();
    add(&s, &[chf("w", "t", 0, 10), chf("w", "t", 1, 10)]).await;
    let a = tx("a");
    assert_eq!(
        s.locks.claim(&a, &token_id("t", 0), T0).await,
        Ok(ClaimVerdict::Won)
    );
    s.locks.sweep(expired_at(LATER)).await.expect("sweep");
    assert_eq!(
        s.locks.claim(&a, &token_id("t", 0), at(LATER)).await,
        Ok(ClaimVerdict::Contended),
        "single claim"
    );
    assert_eq!(
        s.locks
            .claim_window(&a, &[token_id("t", 0), token_id("t", 1)], at(LATER))
            .await,
        Ok(vec![
            (token_id("t", 0), ClaimVerdict::Contended),
            (token_id("t", 1), ClaimVerdict::Won)
        ]),
        "window claim"
    );
    // The later select fails and gives back what it won: t:1 only.
    assert_eq!(s.locks.release_tokens(&a, &[token_id("t", 1)]).await, Ok(1));
    assert_eq!(
        s.locks.spend_consumer(&a, at(LATER + 1), true).await,
        Ok(vec![token_id("t", 0)]),
        "the earlier select's token is still the transaction's"
    );
}

/// A transaction that never settles: its selection outlives its swept lock for
/// [`holdfast_domain::lease::SELECTION_RETENTION`] past the lease, then the
/// sweep forgets it (a Confirmed after that spends nothing).
pub async fn a_selection_that_never_settles_is_forgotten_after_the_retention(
    db: &dyn TestDatabase,
) {
    let s = db.stores();
    add(&s, &[chf("w", "t", 0, 10)]).await;
    let t1 = tx("t1");
    assert_eq!(
        s.locks.claim(&t1, &token_id("t", 0), T0).await,
        Ok(ClaimVerdict::Won)
    );
    let retention = u64::try_from(holdfast_domain::lease::SELECTION_RETENTION.as_millis())
        .expect("retention in ms");
    // The lease ran out: the lock goes, the selection stays.
    let report = s.locks.sweep(expired_at(LATER)).await.expect("sweep");
    assert_eq!((report.expired, report.forgotten), (1, 0), "{report:?}");
    assert_eq!(s.locks.unsettled().await, Ok(vec![(t1.clone(), None)]));
    // Just within the retention past the lease: still kept.
    let lease = u64::try_from(LeaseConfig::default().lease_expiry.as_millis()).expect("ms");
    let report = s.locks.sweep(expired_at(lease + retention)).await;
    assert_eq!(
        report.map(|r| r.forgotten),
        Ok(0),
        "kept until the retention"
    );
    let report = s
        .locks
        .sweep(expired_at(lease + retention + 1))
        .await
        .expect("sweep");
    assert_eq!(report.forgotten, 1, "{report:?}");
    assert_eq!(s.locks.unsettled().await, Ok(Vec::new()), "forgotten");
    let spent = s
        .locks
        .spend_consumer(&t1, at(lease + retention + 2), true)
        .await;
    assert_eq!(spent, Ok(Vec::new()), "nothing left to spend");
}
