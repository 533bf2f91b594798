//! The token selector against mocked ports: cancellation, release scope, FundsLocked
//! after the last leg, and the metrics of failed attempts.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::{TokioClock, cand, q, stores, tok, tx};
use holdfast::{SelectError, TokenSelector, metrics as hm};
use holdfast_domain::{
    ClaimVerdict, SelectionConfig, Timestamp, TokenId, TokenType, TxId, WalletId,
};
use holdfast_ports::{
    LockInfo, LockStore, LockStoreError, MockLockStore, MockTokenStore, MockTxStatusStore,
    StoreFault, SweepReport,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tokio::sync::mpsc;

fn wallet() -> WalletId {
    WalletId::new("alice").expect("wallet")
}

fn chf() -> TokenType {
    TokenType::new("CHF").expect("type")
}

fn config(legs: u32, immediate: u32) -> SelectionConfig {
    SelectionConfig {
        max_retries: legs,
        max_immediate_retries: immediate,
        retry_interval: Duration::from_secs(5),
        ..SelectionConfig::default()
    }
}

/// A lock store whose claims of `gate` never answer (a claim in flight when the
/// caller gives up); everything else goes to the mock. Entering the gate and every
/// release are reported on channels.
struct GatedLocks {
    inner: MockLockStore,
    gate: TokenId,
    entered: mpsc::UnboundedSender<()>,
    released: mpsc::UnboundedSender<(TxId, Vec<TokenId>)>,
}

#[async_trait]
impl LockStore for GatedLocks {
    async fn claim(
        &self,
        consumer: &TxId,
        token: &TokenId,
        at: Timestamp,
    ) -> Result<ClaimVerdict, LockStoreError> {
        if *token == self.gate {
            let _ = self.entered.send(());
            std::future::pending::<()>().await;
        }
        self.inner.claim(consumer, token, at).await
    }
    async fn claim_window(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
        at: Timestamp,
    ) -> Result<Vec<(TokenId, ClaimVerdict)>, LockStoreError> {
        self.inner.claim_window(consumer, tokens, at).await
    }
    async fn release_consumer(&self, consumer: &TxId) -> Result<u64, LockStoreError> {
        self.inner.release_consumer(consumer).await
    }
    async fn release_tokens(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
    ) -> Result<u64, LockStoreError> {
        let _ = self.released.send((consumer.clone(), tokens.to_vec()));
        Ok(u64::try_from(tokens.len()).unwrap_or(0))
    }
    async fn spend_consumer(
        &self,
        consumer: &TxId,
        at: Timestamp,
    ) -> Result<Vec<TokenId>, LockStoreError> {
        self.inner.spend_consumer(consumer, at).await
    }
    async fn sweep(&self, now: Timestamp, lease: Duration) -> Result<SweepReport, LockStoreError> {
        self.inner.sweep(now, lease).await
    }
    async fn list_locks(&self) -> Result<Vec<LockInfo>, LockStoreError> {
        self.inner.list_locks().await
    }
    fn round_trips(&self) -> u64 {
        0
    }
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_select_releases_exactly_the_tokens_it_holds() {
    // amount 10 from [a=4, b=8] with single-token claims: a is won, then the claim
    // of b hangs; dropping the call must release a and b (b may have committed),
    // by consumer and tokens, and never everything of the consumer.
    let mut tokens = MockTokenStore::new();
    tokens
        .expect_candidates()
        .returning(|_| Ok(vec![cand("a", 4), cand("b", 8)]));
    let mut inner = MockLockStore::new();
    inner
        .expect_claim()
        .returning(|_, _, _| Ok(ClaimVerdict::Won));
    inner.expect_release_consumer().never();
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let (released_tx, mut released) = mpsc::unbounded_channel();
    let locks = GatedLocks {
        inner,
        gate: tok("b"),
        entered: entered_tx,
        released: released_tx,
    };
    let mut s = stores(tokens, MockLockStore::new(), MockTxStatusStore::new());
    s.locks = Arc::new(locks);
    let cfg = SelectionConfig {
        batch_window: 1,
        ..config(3, 5)
    };
    let selector =
        Arc::new(TokenSelector::new(s, TokioClock::new(), cfg, Some(7)).expect("config"));
    let consumer = tx("t1");
    let call = {
        let selector = selector.clone();
        let consumer = consumer.clone();
        tokio::spawn(async move { selector.select(&wallet(), &chf(), q(10), &consumer).await })
    };
    entered.recv().await.expect("the claim of b started");
    call.abort();
    assert!(call.await.expect_err("aborted").is_cancelled());
    let (who, what) = released.recv().await.expect("a release after cancellation");
    assert_eq!(who, consumer);
    let mut what = what;
    what.sort();
    assert_eq!(what, vec![tok("a"), tok("b")]);
    assert!(released.try_recv().is_err(), "exactly one release");
}

#[tokio::test(start_paused = true)]
async fn a_failed_select_releases_its_own_wins_and_keeps_earlier_selects_of_the_same_tx() {
    // First select of t1 locks x. The second select of t1 wins y, loses z through
    // its only leg, and fails with FundsLocked: it releases y alone, by tokens.
    let calls = Arc::new(AtomicUsize::new(0));
    let mut tokens = MockTokenStore::new();
    {
        let calls = calls.clone();
        tokens.expect_candidates().returning(move |_| {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                Ok(vec![cand("x", 10)])
            } else {
                Ok(vec![cand("y", 4), cand("z", 8)])
            }
        });
    }
    tokens.expect_balance().returning(|_, _| Ok(q(22)));
    let mut locks = MockLockStore::new();
    locks
        .expect_claim()
        .withf(|_, t, _| *t == tok("x"))
        .times(1)
        .returning(|_, _, _| Ok(ClaimVerdict::Won));
    locks.expect_claim().returning(|_, t, _| {
        Ok(if *t == tok("y") {
            ClaimVerdict::Won
        } else {
            ClaimVerdict::Contended
        })
    });
    locks.expect_claim_window().returning(|_, ts, _| {
        Ok(ts
            .iter()
            .map(|t| {
                let v = if *t == tok("y") {
                    ClaimVerdict::Won
                } else {
                    ClaimVerdict::Contended
                };
                (t.clone(), v)
            })
            .collect())
    });
    locks
        .expect_release_tokens()
        .withf(|c, ts| *c == tx("t1") && ts == [tok("y")])
        .times(1)
        .returning(|_, _| Ok(1));
    locks.expect_release_consumer().never();
    let selector = TokenSelector::new(
        stores(tokens, locks, MockTxStatusStore::new()),
        TokioClock::new(),
        config(1, 1),
        Some(1),
    )
    .expect("config");
    let first = selector
        .select(&wallet(), &chf(), q(10), &tx("t1"))
        .await
        .expect("first select");
    assert_eq!(first.tokens, vec![tok("x")]);
    let second = selector.select(&wallet(), &chf(), q(10), &tx("t1")).await;
    assert_eq!(second, Err(SelectError::FundsLocked));
}

#[tokio::test(start_paused = true)]
async fn contention_through_the_last_leg_is_funds_locked_not_insufficient_funds() {
    let mut tokens = MockTokenStore::new();
    tokens
        .expect_candidates()
        .returning(|_| Ok(vec![cand("a", 10)]));
    // Even a balance below the amount must not turn contention into "no money".
    tokens.expect_balance().returning(|_, _| Ok(q(3)));
    let mut locks = MockLockStore::new();
    locks
        .expect_claim()
        .returning(|_, _, _| Ok(ClaimVerdict::Contended));
    let selector = TokenSelector::new(
        stores(tokens, locks, MockTxStatusStore::new()),
        TokioClock::new(),
        config(3, 2),
        Some(3),
    )
    .expect("config");
    let report = selector
        .select_with_stats(&wallet(), &chf(), q(10), &tx("t1"))
        .await;
    assert_eq!(report.result, Err(SelectError::FundsLocked));
    assert_eq!(report.stats.legs, 3);
    assert_eq!(report.stats.balance_checks, 0);
    assert!(report.stats.conflicts >= 3, "{:?}", report.stats);
    assert_eq!(report.stats.distinct_tokens_attempted, 1);
}

#[tokio::test(start_paused = true)]
async fn below_the_balance_without_contention_is_insufficient_funds() {
    let mut tokens = MockTokenStore::new();
    tokens
        .expect_candidates()
        .returning(|_| Ok(vec![cand("a", 3)]));
    tokens.expect_balance().returning(|_, _| Ok(q(3)));
    // The scan claims what there is, then the balance check fails the call, which
    // releases its win.
    let mut locks = MockLockStore::new();
    locks
        .expect_claim()
        .returning(|_, _, _| Ok(ClaimVerdict::Won));
    locks
        .expect_release_tokens()
        .withf(|c, ts| *c == tx("t1") && ts == [tok("a")])
        .times(1)
        .returning(|_, _| Ok(1));
    let selector = TokenSelector::new(
        stores(tokens, locks, MockTxStatusStore::new()),
        TokioClock::new(),
        config(3, 2),
        Some(3),
    )
    .expect("config");
    let result = selector.select(&wallet(), &chf(), q(10), &tx("t1")).await;
    assert_eq!(
        result,
        Err(SelectError::InsufficientFunds {
            available: q(3),
            requested: q(10)
        })
    );
}

#[tokio::test]
async fn a_zero_amount_is_an_input_error_before_any_io() {
    let selector = TokenSelector::new(
        stores(
            MockTokenStore::new(),
            MockLockStore::new(),
            MockTxStatusStore::new(),
        ),
        TokioClock::new(),
        SelectionConfig::default(),
        Some(3),
    )
    .expect("config");
    let result = selector.select(&wallet(), &chf(), q(0), &tx("t1")).await;
    assert!(matches!(result, Err(SelectError::Input(_))), "{result:?}");
    let bad = SelectionConfig {
        sufficiency_window: 0,
        ..SelectionConfig::default()
    };
    let err = TokenSelector::new(
        stores(
            MockTokenStore::new(),
            MockLockStore::new(),
            MockTxStatusStore::new(),
        ),
        TokioClock::new(),
        bad,
        None,
    )
    .expect_err("invalid config");
    assert_eq!(err.key, "sufficiency_window");
}

/// How the first claim of `a` fails in [`one_failed_attempt`].
#[derive(Debug, Clone, Copy)]
enum FirstClaim {
    Stale,
    Contended,
    StoreError,
}

/// Runs a select whose first claim (of a) fails as `how` and whose second (of b)
/// wins; returns the selection counters as the metrics facade saw them.
async fn one_failed_attempt(how: FirstClaim) -> [u64; 3] {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let fetches = Arc::new(AtomicUsize::new(0));
    let mut tokens = MockTokenStore::new();
    {
        let fetches = fetches.clone();
        tokens.expect_candidates().returning(move |_| {
            Ok(if fetches.fetch_add(1, Ordering::SeqCst) == 0 {
                vec![cand("a", 10)]
            } else {
                vec![cand("b", 10)]
            })
        });
    }
    tokens.expect_balance().returning(|_, _| Ok(q(20)));
    let mut locks = MockLockStore::new();
    locks.expect_claim().returning(move |_, t, _| {
        if *t == tok("b") {
            return Ok(ClaimVerdict::Won);
        }
        match how {
            FirstClaim::Stale => Ok(ClaimVerdict::Stale),
            FirstClaim::Contended => Ok(ClaimVerdict::Contended),
            FirstClaim::StoreError => Err(LockStoreError::Fault(StoreFault::Busy("locked".into()))),
        }
    });
    // After a claim error, a is possibly held and released by tokens.
    locks
        .expect_release_tokens()
        .withf(|_, ts| ts == [tok("a")])
        .returning(|_, _| Ok(0));
    let selector = TokenSelector::new(
        stores(tokens, locks, MockTxStatusStore::new()),
        TokioClock::new(),
        config(2, 3),
        Some(11),
    )
    .expect("config");
    let report = selector
        .select_with_stats(&wallet(), &chf(), q(10), &tx("t1"))
        .await;
    assert_eq!(report.stats.lock_attempts, 2, "{how:?}: {:?}", report.stats);
    let selected = report.result.expect("the second claim wins");
    assert_eq!(selected.tokens, vec![tok("b")]);
    // One snapshot: taking one resets the recorder's counters.
    let snapshot = snapshotter.snapshot().into_vec();
    let counter = |name: &str| {
        snapshot
            .iter()
            .find_map(|(key, _, _, value)| match value {
                DebugValue::Counter(n) if key.key().name() == name => Some(*n),
                _ => None,
            })
            .unwrap_or(0)
    };
    [
        counter(hm::SELECTION_STALE_CANDIDATES),
        counter(hm::SELECTION_LOCK_CONFLICTS),
        counter(hm::SELECTION_STORE_ERRORS),
    ]
}

#[tokio::test(start_paused = true)]
async fn one_failed_attempt_moves_exactly_one_of_stale_conflict_and_store_error() {
    assert_eq!(one_failed_attempt(FirstClaim::Contended).await, [0, 1, 0]);
    assert_eq!(one_failed_attempt(FirstClaim::Stale).await, [1, 0, 0]);
    assert_eq!(one_failed_attempt(FirstClaim::StoreError).await, [0, 0, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_window_claim_counts_a_store_error_per_token_and_a_failed_fetch_none() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    // The first fetch fails, the window claim of [a, b] fails once, then wins.
    let fetches = Arc::new(AtomicUsize::new(0));
    let mut tokens = MockTokenStore::new();
    {
        let fetches = fetches.clone();
        tokens.expect_candidates().returning(move |_| {
            if fetches.fetch_add(1, Ordering::SeqCst) == 0 {
                Err(holdfast_ports::TokenStoreError::Fault(StoreFault::Busy(
                    "locked".into(),
                )))
            } else {
                Ok(vec![cand("a", 4), cand("b", 6)])
            }
        });
    }
    tokens.expect_balance().returning(|_, _| Ok(q(10)));
    let claims = Arc::new(AtomicUsize::new(0));
    let mut locks = MockLockStore::new();
    {
        let claims = claims.clone();
        locks.expect_claim_window().returning(move |_, ts, _| {
            if claims.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(LockStoreError::Fault(StoreFault::Busy("locked".into())));
            }
            Ok(ts.iter().map(|t| (t.clone(), ClaimVerdict::Won)).collect())
        });
    }
    let selector = TokenSelector::new(
        stores(tokens, locks, MockTxStatusStore::new()),
        TokioClock::new(),
        config(2, 5),
        Some(5),
    )
    .expect("config");
    let report = selector
        .select_with_stats(&wallet(), &chf(), q(10), &tx("t1"))
        .await;
    let mut selected = report.result.expect("the second window claim wins").tokens;
    selected.sort();
    assert_eq!(selected, vec![tok("a"), tok("b")]);
    assert_eq!(report.stats.lock_attempts, 4, "{:?}", report.stats);
    assert_eq!(
        (report.stats.store_errors, report.stats.other_store_errors),
        (2, 1),
        "{:?}",
        report.stats
    );
    let snapshot = snapshotter.snapshot().into_vec();
    let store_errors = snapshot
        .iter()
        .find_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) if key.key().name() == hm::SELECTION_STORE_ERRORS => Some(*n),
            _ => None,
        })
        .unwrap_or(0);
    assert_eq!(store_errors, 2);
}

#[tokio::test(start_paused = true)]
async fn a_seed_replays_a_call() {
    let make = || {
        let mut tokens = MockTokenStore::new();
        tokens
            .expect_candidates()
            .returning(|_| Ok((0..8).map(|i| cand(&format!("t{i}"), 10)).collect()));
        let mut locks = MockLockStore::new();
        locks
            .expect_claim()
            .returning(|_, _, _| Ok(ClaimVerdict::Won));
        TokenSelector::new(
            stores(tokens, locks, MockTxStatusStore::new()),
            TokioClock::new(),
            SelectionConfig::default(),
            None,
        )
        .expect("config")
    };
    let first = make()
        .select_with_stats(&wallet(), &chf(), q(10), &tx("t1"))
        .await;
    let request = holdfast_domain::SelectRequest {
        wallet: wallet(),
        token_type: chf(),
        amount: q(10),
        consumer: tx("t1"),
    };
    let replay = make().select_seeded(&request, first.seed).await;
    assert_eq!(replay.result, first.result);
    assert_eq!(replay.stats, first.stats);
}
