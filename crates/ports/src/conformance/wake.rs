//! Checks of the wake-up signals an adapter sends after its writes
//! (`docs/wakeups.md`): each write that may make tokens spendable and unlocked
//! signals its (wallet, type), a queue write signals its queue, and a signal
//! crosses to another instance of the same database.
//!
//! Each check subscribes before the write and then waits for the signal with a
//! generous deadline: a missing signal fails the check, a present one returns
//! at once.

use std::time::Duration;

use holdfast_domain::{LeaseConfig, TokenId};
use tokio::time::Instant;

use super::TestDatabase;
use super::queues::load_queue;
use super::support::{add, at, chf, queue, token_id, token_type, tx, uri, wallet};
use crate::{Stores, Subscription, WaitEnd, WakeKey};

/// Long enough for any backend under load; a check never waits it out unless the
/// signal is missing.
const PATIENCE: Duration = Duration::from_secs(20);

fn key(wallet_id: &str) -> WakeKey {
    WakeKey::tokens(&wallet(wallet_id), &token_type("CHF"))
}

async fn signalled(mut subscription: Subscription, what: &str) {
    assert_eq!(
        subscription.wait_until(Instant::now() + PATIENCE).await,
        WaitEnd::Signalled,
        "{what} sent no wake-up signal"
    );
}

async fn claimed(s: &Stores, consumer: &str, tokens: &[TokenId]) {
    s.locks
        .claim_window(&tx(consumer), tokens, at(1))
        .await
        .expect("claim");
}

/// Minting, a release of named tokens, a release of a consumer's locks, making a
/// token spendable and the lease sweep each signal the wallet and type of the
/// tokens they free.
pub async fn writes_that_free_tokens_signal_their_key(db: &dyn TestDatabase) {
    let s = db.stores();
    let minted = s.wake.subscribe(key("w"), None);
    add(&s, &[chf("w", "t", 0, 5), chf("w", "t", 1, 7)]).await;
    signalled(minted, "add_tokens").await;

    claimed(&s, "a", &[token_id("t", 0)]).await;
    let released = s.wake.subscribe(key("w"), None);
    s.locks
        .release_tokens(&tx("a"), &[token_id("t", 0)])
        .await
        .expect("release_tokens");
    signalled(released, "release_tokens").await;

    claimed(&s, "b", &[token_id("t", 1)]).await;
    let settled = s.wake.subscribe(key("w"), None);
    s.locks
        .release_consumer(&tx("b"), at(2), true)
        .await
        .expect("release_consumer");
    signalled(settled, "release_consumer").await;

    assert_eq!(
        s.tokens.set_spendable(&token_id("t", 0), false).await,
        Ok(true)
    );
    let spendable = s.wake.subscribe(key("w"), None);
    assert_eq!(
        s.tokens.set_spendable(&token_id("t", 0), true).await,
        Ok(true)
    );
    signalled(spendable, "set_spendable(true)").await;

    claimed(&s, "c", &[token_id("t", 1)]).await;
    let swept = s.wake.subscribe(key("w"), None);
    let rule = LeaseConfig {
        lease_expiry: Duration::from_secs(1),
        ..LeaseConfig::default()
    }
    .sweep_rule(at(1_000_000));
    let report = s.locks.sweep(rule).await.expect("sweep");
    assert_eq!(report.expired, 1, "{report:?}");
    signalled(swept, "the lease sweep").await;
}

/// An applied queue write signals the queue (a slot may have been freed).
pub async fn a_queue_write_signals_its_queue(db: &dyn TestDatabase) {
    let s = db.stores();
    let created = s
        .queues
        .create_request(&queue("q"), &uri("u1"))
        .await
        .expect("create");
    let mut q = load_queue(&s, "q").await;
    let watch = s.wake.subscribe(WakeKey::Queue(queue("q")), None);
    q.latest_request_id = Some(created.request.id);
    let expected = q.version;
    assert_eq!(
        s.queues.cas_queue(expected, &q).await,
        Ok(crate::CasOutcome::Applied)
    );
    signalled(watch, "cas_queue").await;
}

/// A release through one instance wakes a waiter of another instance of the
/// same database (PostgreSQL: `NOTIFY`; SQLite file: `data_version`).
pub async fn a_release_wakes_a_waiter_of_another_instance(db: &dyn TestDatabase) {
    let s = db.stores();
    let other = db.replica().await.expect("replica");
    add(&s, &[chf("w", "t", 0, 5)]).await;
    claimed(&s, "a", &[token_id("t", 0)]).await;
    // Until the other instance listens, a signal could pass it by.
    let deadline = Instant::now() + PATIENCE;
    while !other.wake.connected() {
        assert!(
            Instant::now() < deadline,
            "the other instance never listened"
        );
        // sleep: poll interval until the other instance listens, bounded by PATIENCE.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut waiting = other.wake.subscribe(key("w"), None);
    let waiter = tokio::spawn(async move { waiting.wait_until(Instant::now() + PATIENCE).await });
    s.locks
        .release_tokens(&tx("a"), &[token_id("t", 0)])
        .await
        .expect("release_tokens");
    assert_eq!(
        waiter.await.expect("waiter"),
        WaitEnd::Signalled,
        "a release in one instance did not wake the other"
    );
}
