//! Settlement, recovery and the lease sweeper against mocked ports.

use crate::common;

use std::time::Duration;

use common::{TokioClock, stores, tok, tx};
use holdfast::{LeaseSweeper, SettleError, Settlement};
use holdfast_domain::{LeaseConfig, LockAction, PersistPolicy, SettlementStatus, TxStatus};
use holdfast_ports::{
    LockStoreError, MockLockStore, MockTokenStore, MockTxStatusStore, StoreFault, SweepReport,
};
use tokio::sync::mpsc;

fn settlement(locks: MockLockStore, statuses: MockTxStatusStore) -> Settlement {
    // No transaction here was confirmed with outputs: a Confirmed spends.
    let mut tokens = MockTokenStore::new();
    tokens.expect_token().returning(|_| Ok(None));
    Settlement::new(
        stores(tokens, locks, statuses),
        TokioClock::new(),
        PersistPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_secs(1),
        },
    )
}

#[tokio::test]
async fn busy_unknown_and_unrecognised_statuses_change_nothing() {
    // Mocks without expectations: any store call fails the test.
    let s = settlement(MockLockStore::new(), MockTxStatusStore::new());
    for status in [
        SettlementStatus::Known(TxStatus::Busy),
        SettlementStatus::Known(TxStatus::Unknown),
        SettlementStatus::Unrecognised("42".into()),
    ] {
        let settled = s.on_status(&tx("t1"), status.clone()).await.expect("ok");
        assert_eq!(settled.action, LockAction::Keep, "{status:?}");
        assert_eq!(settled.recorded, None, "{status:?}");
        assert_eq!(settled.persist_attempts, 0, "{status:?}");
    }
}

#[tokio::test]
async fn pending_and_orphan_are_recorded_and_keep_the_locks() {
    let mut statuses = MockTxStatusStore::new();
    statuses
        .expect_record_status()
        .times(2)
        .returning(|_, _, _| Ok(()));
    let s = settlement(MockLockStore::new(), statuses);
    for status in [TxStatus::Pending, TxStatus::Orphan] {
        let settled = s
            .on_status(&tx("t1"), SettlementStatus::Known(status))
            .await
            .expect("ok");
        assert_eq!(settled.action, LockAction::Keep);
        assert_eq!(settled.recorded, Some(status));
    }
}

fn busy() -> LockStoreError {
    LockStoreError::Fault(StoreFault::Busy("busy".into()))
}

#[tokio::test]
async fn confirmed_spends_and_invalid_releases_each_recording_its_status_in_the_same_call() {
    // The status store is never called: the status is recorded by the lock store,
    // in the transaction that spends or releases.
    let mut locks = MockLockStore::new();
    locks
        .expect_spend_consumer()
        .withf(|t, _, record| *t == tx("t1") && *record)
        .times(1)
        .returning(|_, _, _| Ok(vec![tok("a"), tok("b")]));
    locks
        .expect_release_consumer()
        .withf(|t, _, record| *t == tx("t2") && *record)
        .times(1)
        .returning(|_, _, _| Ok(3));
    let s = settlement(locks, MockTxStatusStore::new());
    let confirmed = s
        .on_status(&tx("t1"), SettlementStatus::from_code("confirmed"))
        .await
        .expect("ok");
    assert_eq!(confirmed.spent, vec![tok("a"), tok("b")]);
    assert_eq!(confirmed.recorded, Some(TxStatus::Confirmed));
    assert_eq!(confirmed.persist_attempts, 1);
    let invalid = s
        .on_status(&tx("t2"), SettlementStatus::Invalid)
        .await
        .expect("ok");
    assert_eq!(invalid.released, 3);
    assert_eq!(invalid.recorded, Some(TxStatus::Deleted));
}

#[tokio::test]
async fn a_double_spend_is_a_typed_error_naming_token_and_spender_and_is_not_retried() {
    let mut locks = MockLockStore::new();
    locks.expect_spend_consumer().times(1).returning(|_, _, _| {
        Err(LockStoreError::DoubleSpend {
            token: tok("a"),
            spent_by: tx("t1"),
        })
    });
    let s = settlement(locks, MockTxStatusStore::new());
    let err = s
        .on_status(&tx("t2"), SettlementStatus::Known(TxStatus::Confirmed))
        .await
        .expect_err("double spend");
    assert_eq!(
        err,
        SettleError::DoubleSpend {
            tx: tx("t2"),
            token: tok("a"),
            spent_by: tx("t1"),
        }
    );
    let message = err.to_string();
    assert!(
        message.contains("t1") && message.contains(&tok("a").to_string()),
        "{message}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_terminal_status_whose_persistence_is_exhausted_releases_exactly_once() {
    let mut locks = MockLockStore::new();
    let mut seq = mockall::Sequence::new();
    locks
        .expect_release_consumer()
        .withf(|t, _, record| *t == tx("t1") && *record)
        .times(3)
        .in_sequence(&mut seq)
        .returning(|_, _, _| Err(busy()));
    locks
        .expect_release_consumer()
        .withf(|t, _, record| *t == tx("t1") && *record)
        .times(1)
        .in_sequence(&mut seq)
        .returning(|_, _, _| Ok(2));
    let s = settlement(locks, MockTxStatusStore::new());
    let started = tokio::time::Instant::now();
    let settled = s
        .on_status(&tx("t1"), SettlementStatus::Known(TxStatus::Deleted))
        .await
        .expect("released despite the status");
    assert_eq!(settled.persist_attempts, 3);
    assert_eq!(settled.action, LockAction::ReleaseAll);
    assert_eq!(
        settled.recorded,
        Some(TxStatus::Deleted),
        "the last try records the status with the release"
    );
    assert_eq!(settled.released, 2);
    // Backoffs of 1 s then 2 s, on tokio time.
    assert_eq!(started.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn a_settlement_that_succeeds_on_retry_spends_once() {
    let mut locks = MockLockStore::new();
    let mut seq = mockall::Sequence::new();
    locks
        .expect_spend_consumer()
        .times(1)
        .in_sequence(&mut seq)
        .returning(|_, _, _| Err(busy()));
    locks
        .expect_spend_consumer()
        .times(1)
        .in_sequence(&mut seq)
        .returning(|_, _, _| Ok(vec![tok("a")]));
    let s = settlement(locks, MockTxStatusStore::new());
    let settled = s
        .on_status(&tx("t1"), SettlementStatus::Known(TxStatus::Confirmed))
        .await
        .expect("ok");
    assert_eq!(settled.persist_attempts, 2);
    assert_eq!(settled.recorded, Some(TxStatus::Confirmed));
    assert_eq!(settled.spent, vec![tok("a")]);
}

#[tokio::test(start_paused = true)]
async fn a_release_that_keeps_failing_is_an_error_naming_the_tx() {
    let mut locks = MockLockStore::new();
    locks
        .expect_release_consumer()
        .times(4)
        .returning(|_, _, _| Err(busy()));
    let s = settlement(locks, MockTxStatusStore::new());
    let err = s
        .on_status(&tx("t9"), SettlementStatus::Known(TxStatus::Deleted))
        .await
        .expect_err("release failed");
    assert!(err.to_string().contains("t9"), "{err}");
}

#[tokio::test]
async fn recovery_settles_consumers_whose_recorded_status_releases() {
    let mut locks = MockLockStore::new();
    locks.expect_unsettled().times(1).returning(|| {
        Ok(vec![
            (tx("busy"), Some(TxStatus::Busy)),
            (tx("clash"), Some(TxStatus::Confirmed)),
            (tx("confirmed"), Some(TxStatus::Confirmed)),
            (tx("deleted"), Some(TxStatus::Deleted)),
            (tx("none"), None),
            (tx("pending"), Some(TxStatus::Pending)),
        ])
    });
    // One failing transaction (a double spend) does not stop the pass.
    locks
        .expect_spend_consumer()
        .withf(|t, _, _| *t == tx("clash"))
        .times(1)
        .returning(|_, _, _| {
            Err(LockStoreError::DoubleSpend {
                token: tok("z"),
                spent_by: tx("other"),
            })
        });
    // Recovery re-applies a recorded status: it records nothing itself.
    locks
        .expect_spend_consumer()
        .withf(|t, _, record| *t == tx("confirmed") && !*record)
        .times(1)
        .returning(|_, _, _| Ok(vec![tok("a"), tok("b")]));
    locks
        .expect_release_consumer()
        .withf(|t, _, record| *t == tx("deleted") && !*record)
        .times(1)
        .returning(|_, _, _| Ok(1));
    let s = settlement(locks, MockTxStatusStore::new());
    let report = s.recover().await.expect("recovered");
    assert_eq!(report.consumers, 6);
    assert_eq!(report.failed, 1);
    assert_eq!(report.settled, 2);
    assert_eq!(report.spent, 2);
    assert_eq!(report.released, 1);
}

#[tokio::test(start_paused = true)]
async fn the_sweeper_sweeps_every_period_with_the_domains_rule_and_shuts_down() {
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let mut locks = MockLockStore::new();
    let mut calls = 0u32;
    locks.expect_sweep().returning(move |rule| {
        calls += 1;
        let _ = seen_tx.send(rule);
        if calls == 2 {
            return Err(LockStoreError::Fault(StoreFault::Busy("busy".into())));
        }
        Ok(SweepReport {
            leader: true,
            expired: 1,
            released_by_status: 2,
            forgotten: 0,
        })
    });
    let config = LeaseConfig {
        lease_expiry: Duration::from_secs(180),
        cleanup_period: Duration::from_secs(60),
    };
    let handle =
        LeaseSweeper::spawn(std::sync::Arc::new(locks), TokioClock::new(), config).expect("valid");
    let mut cutoffs = Vec::new();
    for _ in 0..3 {
        let rule = seen.recv().await.expect("a sweep");
        cutoffs.push(rule.cutoff.as_millis());
    }
    // Ticks at 1,000,000, 1,060,000 and 1,120,000 ms, each minus the 180 s lease.
    assert_eq!(cutoffs, vec![820_000, 880_000, 940_000]);
    let totals = handle.shutdown().await;
    assert_eq!(totals.runs, 3);
    assert_eq!(totals.errors, 1);
    assert_eq!(totals.led, 2);
    assert_eq!((totals.expired, totals.released_by_status), (2, 4));
}

#[tokio::test]
async fn the_sweeper_refuses_a_zero_period() {
    let config = LeaseConfig {
        cleanup_period: Duration::ZERO,
        ..LeaseConfig::default()
    };
    let err = LeaseSweeper::spawn(
        std::sync::Arc::new(MockLockStore::new()),
        TokioClock::new(),
        config,
    )
    .expect_err("zero period");
    assert!(err.to_string().contains("cleanup_period"), "{err}");
}
