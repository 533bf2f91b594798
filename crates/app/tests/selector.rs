//! The token selector against mocked ports and an in-memory lock table:
//! cancellation (during a claim answered after the drop, a backoff, the final
//! release), release scope, FundsLocked after the last leg, and the metrics of
//! failed attempts.

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{TokioClock, cand, q, stores, tok, tx};
use holdfast::{SelectError, TokenSelector, metrics as hm};
use holdfast_domain::{
    ClaimVerdict, SelectionConfig, SelectionPolicy, SweepRule, Timestamp, Token, TokenId,
    TokenType, TxId, TxStatus, WalletId,
};
use holdfast_ports::{
    CandidateRead, Chooser, Confirmation, LockInfo, LockStore, LockStoreError, MockLockStore,
    MockTokenStore, MockTxStatusStore, Output, ReadAndClaim, ReadWithClaim, StoreFault,
    SweepReport,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tokio::sync::{Notify, mpsc};

fn wallet() -> WalletId {
    WalletId::new("alice").expect("wallet")
}

fn chf() -> TokenType {
    TokenType::new("CHF").expect("type")
}

/// The mocked token stores below answer ascending candidate pages, which
/// `smallest_first` reads; the selector's mechanics do not depend on the policy
/// (`cover_first` reads bands: `round_trips.rs` and the SQLite tests).
fn smallest_first() -> SelectionConfig {
    SelectionConfig {
        policy: SelectionPolicy::SmallestFirst,
        ..SelectionConfig::default()
    }
}

fn config(legs: u32, immediate: u32) -> SelectionConfig {
    SelectionConfig {
        max_retries: legs,
        max_immediate_retries: immediate,
        retry_interval: Duration::from_secs(5),
        ..smallest_first()
    }
}

/// What [`FakeLocks`] saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    /// A claim of this token reached its gate and waits there.
    ClaimGated(TokenId),
    /// A read-and-claim reached its gate and waits there.
    ReadAndClaimGated,
    /// A release of these tokens reached its gate and waits there.
    ReleaseGated(Vec<TokenId>),
    /// A release ended (applied, or failed without effect).
    Released {
        consumer: TxId,
        tokens: Vec<TokenId>,
        ok: bool,
    },
}

/// An in-memory lock table with injectable faults and gates: a claim of
/// `claim_gate`'s token, or the release numbered `release_gate` (from 0), waits
/// for its `Notify` before it takes effect (a store answer that arrives after the
/// caller gave up); the first `commit_then_fail` claims lock and then report an
/// error; the first `fail_releases` releases fail without effect. With
/// `read_and_claim`, it reads and claims in one call: the unlocked ones of those
/// candidates, once the `Notify` is given (without it, it cannot).
#[derive(Default)]
struct FakeLocks {
    table: Arc<StdMutex<BTreeMap<TokenId, TxId>>>,
    claim_gate: Option<(TokenId, Arc<Notify>)>,
    release_gate: Option<(usize, Arc<Notify>)>,
    commit_then_fail: AtomicUsize,
    fail_releases: AtomicUsize,
    releases: AtomicUsize,
    read_and_claim: Option<(Vec<holdfast_domain::Candidate>, Arc<Notify>)>,
    events: Option<mpsc::UnboundedSender<Event>>,
}

impl FakeLocks {
    fn with_events() -> (Self, mpsc::UnboundedReceiver<Event>) {
        let (events, rx) = mpsc::unbounded_channel();
        (
            FakeLocks {
                events: Some(events),
                ..FakeLocks::default()
            },
            rx,
        )
    }

    fn emit(&self, event: Event) {
        if let Some(events) = &self.events {
            let _ = events.send(event);
        }
    }

    fn table(&self) -> BTreeMap<TokenId, TxId> {
        self.table.lock().expect("table").clone()
    }

    fn hold(&self, token: TokenId, consumer: TxId) {
        self.table.lock().expect("table").insert(token, consumer);
    }
}

/// Claims `token` for `consumer` in `table`.
fn claim_in(
    table: &StdMutex<BTreeMap<TokenId, TxId>>,
    consumer: &TxId,
    token: &TokenId,
) -> ClaimVerdict {
    let mut table = table.lock().expect("table");
    match table.get(token) {
        Some(holder) if holder == consumer => ClaimVerdict::Won,
        Some(_) => ClaimVerdict::Contended,
        None => {
            table.insert(token.clone(), consumer.clone());
            ClaimVerdict::Won
        }
    }
}

/// Takes one from a fault budget; false once it is spent.
fn take_one(budget: &AtomicUsize) -> bool {
    budget
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn fault() -> LockStoreError {
    LockStoreError::Fault(StoreFault::Busy("injected".into()))
}

#[async_trait]
impl LockStore for FakeLocks {
    async fn claim(
        &self,
        consumer: &TxId,
        token: &TokenId,
        _at: Timestamp,
    ) -> Result<ClaimVerdict, LockStoreError> {
        let verdict = match &self.claim_gate {
            Some((gated, notify)) if gated == token => {
                // Like a blocking database call (or a statement on the server),
                // the commit goes on even if the caller stops waiting for it.
                self.emit(Event::ClaimGated(token.clone()));
                let (table, notify) = (self.table.clone(), notify.clone());
                let (consumer, token) = (consumer.clone(), token.clone());
                let commit = tokio::spawn(async move {
                    notify.notified().await;
                    claim_in(&table, &consumer, &token)
                });
                commit.await.map_err(|_| fault())?
            }
            _ => claim_in(&self.table, consumer, token),
        };
        if take_one(&self.commit_then_fail) {
            return Err(fault());
        }
        Ok(verdict)
    }
    async fn claim_window(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
        at: Timestamp,
    ) -> Result<Vec<(TokenId, ClaimVerdict)>, LockStoreError> {
        let mut out = Vec::new();
        for token in tokens {
            out.push((token.clone(), self.claim(consumer, token, at).await?));
        }
        Ok(out)
    }
    fn read_with_claim(&self) -> ReadWithClaim {
        match self.read_and_claim {
            Some(_) => ReadWithClaim::WhereRacesLikely,
            None => ReadWithClaim::Never,
        }
    }
    async fn read_and_claim(
        &self,
        consumer: &TxId,
        _read: &CandidateRead,
        _at: Timestamp,
        choose: Chooser,
    ) -> Result<Option<ReadAndClaim>, LockStoreError> {
        let Some((candidates, notify)) = &self.read_and_claim else {
            return Ok(None);
        };
        // Like a blocking database call, it commits even if the caller stops
        // waiting for it.
        self.emit(Event::ReadAndClaimGated);
        let (table, notify) = (self.table.clone(), notify.clone());
        let (candidates, consumer) = (candidates.clone(), consumer.clone());
        let commit = tokio::spawn(async move {
            notify.notified().await;
            let page: Vec<_> = {
                let locked = table.lock().expect("table");
                candidates
                    .into_iter()
                    .filter(|c| !locked.contains_key(&c.id))
                    .collect()
            };
            let verdicts = choose(&page)
                .iter()
                .map(|t| (t.clone(), claim_in(&table, &consumer, t)))
                .collect();
            ReadAndClaim { page, verdicts }
        });
        Ok(Some(commit.await.map_err(|_| fault())?))
    }
    async fn release_consumer(
        &self,
        consumer: &TxId,
        _at: Timestamp,
        _record: bool,
    ) -> Result<u64, LockStoreError> {
        panic!("a select must never release everything of {consumer}");
    }
    async fn renew(
        &self,
        _consumer: &TxId,
        tokens: &[TokenId],
        _at: Timestamp,
    ) -> Result<Vec<TokenId>, LockStoreError> {
        Ok(tokens.to_vec())
    }
    async fn selected(&self, _consumer: &TxId) -> Result<Vec<Token>, LockStoreError> {
        Ok(Vec::new())
    }
    async fn unsettled_owned(&self) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError> {
        Ok(Vec::new())
    }
    async fn unsettled(&self) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError> {
        Ok(Vec::new())
    }
    async fn release_tokens(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
    ) -> Result<u64, LockStoreError> {
        let number = self.releases.fetch_add(1, Ordering::SeqCst);
        if let Some((gated, notify)) = &self.release_gate {
            if *gated == number {
                self.emit(Event::ReleaseGated(tokens.to_vec()));
                notify.notified().await;
            }
        }
        let fail = take_one(&self.fail_releases);
        let mut released = 0;
        if !fail {
            let mut table = self.table.lock().expect("table");
            for token in tokens {
                if table.get(token) == Some(consumer) {
                    table.remove(token);
                    released += 1;
                }
            }
        }
        self.emit(Event::Released {
            consumer: consumer.clone(),
            tokens: tokens.to_vec(),
            ok: !fail,
        });
        if fail { Err(fault()) } else { Ok(released) }
    }
    async fn spend_consumer(
        &self,
        _consumer: &TxId,
        _at: Timestamp,
        _record: bool,
    ) -> Result<Vec<TokenId>, LockStoreError> {
        Ok(Vec::new())
    }
    async fn confirm(
        &self,
        _consumer: &TxId,
        _outputs: &[Output],
        _at: Timestamp,
    ) -> Result<Confirmation, LockStoreError> {
        Ok(Confirmation::default())
    }
    async fn sweep(&self, _rule: SweepRule) -> Result<SweepReport, LockStoreError> {
        Ok(SweepReport::default())
    }
    async fn list_locks(&self) -> Result<Vec<LockInfo>, LockStoreError> {
        Ok(Vec::new())
    }
    fn round_trips(&self) -> u64 {
        0
    }
}

/// A selector over `tokens` and the shared fake lock table.
fn selector_on(
    tokens: MockTokenStore,
    locks: Arc<FakeLocks>,
    config: SelectionConfig,
) -> Arc<TokenSelector> {
    let mut s = stores(tokens, MockLockStore::new(), MockTxStatusStore::new());
    s.locks = locks;
    Arc::new(TokenSelector::new(s, TokioClock::new(), config, Some(7)).expect("config"))
}

/// Spawns a select of 10 for `consumer`.
fn spawn_select(
    selector: &Arc<TokenSelector>,
    consumer: &TxId,
) -> tokio::task::JoinHandle<Result<holdfast_domain::Selected, SelectError>> {
    let selector = selector.clone();
    let consumer = consumer.clone();
    tokio::spawn(async move { selector.select(&wallet(), &chf(), q(10), &consumer).await })
}

/// The next event. Time is paused, so the deadline passes as soon as every task
/// waits: a missing event fails the test instead of hanging it.
async fn next_event(events: &mut mpsc::UnboundedReceiver<Event>) -> Option<Event> {
    tokio::time::timeout(Duration::from_secs(3600), events.recv())
        .await
        .ok()
        .flatten()
}

/// The next release that ended (skipping gates being reached), tokens sorted.
async fn next_release(events: &mut mpsc::UnboundedReceiver<Event>) -> (TxId, Vec<TokenId>, bool) {
    loop {
        match next_event(events).await.expect("a release") {
            Event::Released {
                consumer,
                mut tokens,
                ok,
            } => {
                tokens.sort();
                return (consumer, tokens, ok);
            }
            Event::ClaimGated(_) | Event::ReleaseGated(_) | Event::ReadAndClaimGated => {}
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_claim_that_commits_after_the_select_was_dropped_is_released_once_it_ends() {
    // amount 10 from [a=4, b=8] with single-token claims: a is won, then the claim
    // of b waits at its gate. The select is dropped; only then does the claim of b
    // commit. The cleanup must release a and b after that commit (released before
    // it, b would stay locked until the lease), by tokens, never by consumer.
    let mut tokens = MockTokenStore::new();
    tokens
        .expect_candidates()
        .returning(|_| Ok(vec![cand("a", 4), cand("b", 8)]));
    let gate = Arc::new(Notify::new());
    let (locks, mut events) = FakeLocks::with_events();
    let locks = Arc::new(FakeLocks {
        claim_gate: Some((tok("b"), gate.clone())),
        ..locks
    });
    let cfg = SelectionConfig {
        batch_window: 1,
        ..config(3, 5)
    };
    let selector = selector_on(tokens, locks.clone(), cfg);
    let consumer = tx("t1");
    let call = spawn_select(&selector, &consumer);
    assert_eq!(
        next_event(&mut events).await,
        Some(Event::ClaimGated(tok("b")))
    );
    call.abort();
    assert!(call.await.expect_err("aborted").is_cancelled());
    assert_eq!(locks.table().len(), 1, "only a so far: {:?}", locks.table());
    // The store answers after the drop: b is committed now.
    gate.notify_one();
    let released = next_release(&mut events).await;
    assert_eq!(released, (consumer, vec![tok("a"), tok("b")], true));
    assert!(locks.table().is_empty(), "{:?}", locks.table());
    assert!(events.try_recv().is_err(), "exactly one release");
}

#[tokio::test(start_paused = true)]
async fn a_read_and_claim_that_commits_after_the_select_was_dropped_is_given_back() {
    // amount 10 from [a=4, b=8], b held by another transaction: a is won, b
    // lost, so the rescan reads and claims in one call (a race was lost); that
    // call waits at its gate. The select is dropped; then the call commits its
    // claim of c. The select never learnt of c: c is given back, and so is a.
    let mut tokens = MockTokenStore::new();
    tokens
        .expect_candidates()
        .returning(|_| Ok(vec![cand("a", 4), cand("b", 8)]));
    tokens.expect_balance_for().returning(|_, _, _| Ok(q(20)));
    let gate = Arc::new(Notify::new());
    let (locks, mut events) = FakeLocks::with_events();
    let locks = Arc::new(FakeLocks {
        read_and_claim: Some((vec![cand("c", 8)], gate.clone())),
        ..locks
    });
    locks.hold(tok("b"), tx("other"));
    let selector = selector_on(tokens, locks.clone(), config(3, 5));
    let consumer = tx("t1");
    let call = spawn_select(&selector, &consumer);
    assert_eq!(
        next_event(&mut events).await,
        Some(Event::ReadAndClaimGated)
    );
    call.abort();
    assert!(call.await.expect_err("aborted").is_cancelled());
    gate.notify_one();
    let mut released = vec![
        next_release(&mut events).await,
        next_release(&mut events).await,
    ];
    released.sort();
    assert_eq!(
        released,
        [
            (consumer.clone(), vec![tok("a")], true),
            (consumer, vec![tok("c")], true)
        ]
    );
    assert_eq!(locks.table(), BTreeMap::from([(tok("b"), tx("other"))]));
}

#[tokio::test(start_paused = true)]
async fn a_select_cancelled_during_its_backoff_releases_what_it_still_holds() {
    // [a=4, b=8] for 10, b held by another transaction: a is won, b contended
    // through the leg. The leg's release of a fails, so the call still holds a
    // while it backs off (a retry interval of an hour; this seed draws a backoff
    // far above the 1 ms timeout). Dropped there, it releases a, and only a.
    let mut tokens = MockTokenStore::new();
    tokens
        .expect_candidates()
        .returning(|_| Ok(vec![cand("a", 4), cand("b", 8)]));
    tokens.expect_balance_for().returning(|_, _, _| Ok(q(12)));
    let (locks, mut events) = FakeLocks::with_events();
    let locks = Arc::new(FakeLocks {
        fail_releases: AtomicUsize::new(1),
        ..locks
    });
    locks.hold(tok("b"), tx("other"));
    let cfg = SelectionConfig {
        retry_interval: Duration::from_secs(3600),
        ..config(3, 1)
    };
    let selector = selector_on(tokens, locks.clone(), cfg);
    let consumer = tx("t1");
    let (alice, chf) = (wallet(), chf());
    let select = selector.select(&alice, &chf, q(10), &consumer);
    // Store calls answer at once (paused time advances only when every task
    // waits), so the timeout fires in the backoff and drops the select there.
    let timed_out = tokio::time::timeout(Duration::from_millis(1), select).await;
    assert!(timed_out.is_err(), "the select ended: {timed_out:?}");
    assert_eq!(
        next_release(&mut events).await,
        (consumer.clone(), vec![tok("a")], false),
        "the leg's own release failed"
    );
    // The guard's cleanup runs.
    assert_eq!(
        next_release(&mut events).await,
        (consumer, vec![tok("a")], true)
    );
    assert_eq!(
        locks.table(),
        BTreeMap::from([(tok("b"), tx("other"))]),
        "only this call's lock is gone"
    );
}

#[tokio::test(start_paused = true)]
async fn a_select_cancelled_during_its_final_release_keeps_nothing_locked() {
    // [a=10, b=10] for 10, single-token claims. The first claim commits but
    // reports an error (possibly held); the second wins. The engine's release of
    // the first fails, so after Done(Ok) the selector releases it once more:
    // dropped during that release, the call must release the selected token too
    // (the caller never got it).
    let mut tokens = MockTokenStore::new();
    tokens
        .expect_candidates()
        .returning(|_| Ok(vec![cand("a", 10), cand("b", 10)]));
    let gate = Arc::new(Notify::new());
    let (locks, mut events) = FakeLocks::with_events();
    let locks = Arc::new(FakeLocks {
        // The first claim (of a or b: equal amounts are shuffled) commits and
        // errors. Release 0 (the engine's) fails; release 1 (the final one) waits.
        commit_then_fail: AtomicUsize::new(1),
        fail_releases: AtomicUsize::new(1),
        release_gate: Some((1, gate.clone())),
        ..locks
    });
    let cfg = SelectionConfig {
        batch_window: 1,
        ..config(3, 5)
    };
    let selector = selector_on(tokens, locks.clone(), cfg);
    let consumer = tx("t1");
    let call = spawn_select(&selector, &consumer);
    let (who, failed, ok) = next_release(&mut events).await;
    assert_eq!((&who, ok), (&consumer, false), "{failed:?}");
    let gated = match next_event(&mut events).await {
        Some(Event::ReleaseGated(tokens)) => tokens,
        other => panic!("expected the final release at its gate, got {other:?}"),
    };
    assert_eq!(gated, failed, "the final release retries the failed one");
    assert_eq!(locks.table().len(), 2, "{:?}", locks.table());
    call.abort();
    assert!(call.await.expect_err("aborted").is_cancelled());
    gate.notify_one();
    assert_eq!(
        next_release(&mut events).await,
        (consumer.clone(), failed, true)
    );
    let (who, cleanup, ok) = next_release(&mut events).await;
    assert_eq!((who, ok), (consumer, true));
    assert_eq!(cleanup, vec![tok("a"), tok("b")]);
    assert!(locks.table().is_empty(), "{:?}", locks.table());
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
    tokens.expect_balance_for().returning(|_, _, _| Ok(q(22)));
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

/// A select of 10 over one token of `token_amount` that every claim loses, in a
/// wallet whose lock-ignoring balance is `balance` (3 legs).
async fn always_contended(token_amount: u128, balance: u128) -> holdfast::SelectReport {
    let mut tokens = MockTokenStore::new();
    tokens
        .expect_candidates()
        .returning(move |_| Ok(vec![cand("a", token_amount)]));
    tokens
        .expect_balance_for()
        .returning(move |_, _, _| Ok(q(balance)));
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
    selector
        .select_with_stats(&wallet(), &chf(), q(10), &tx("t1"))
        .await
}

#[tokio::test(start_paused = true)]
async fn contention_through_the_last_leg_is_funds_locked_not_insufficient_funds() {
    // The money is there (locks ignored): contention means "retry later".
    let report = always_contended(10, 10).await;
    assert_eq!(report.result, Err(SelectError::FundsLocked));
    assert_eq!(report.stats.legs, 3);
    assert_eq!(report.stats.balance_checks, 3, "one balance read per leg");
    assert!(report.stats.conflicts >= 3, "{:?}", report.stats);
    assert_eq!(report.stats.distinct_tokens_attempted, 1);
}

#[tokio::test(start_paused = true)]
async fn contention_in_a_short_wallet_is_insufficient_funds_in_the_first_leg() {
    let report = always_contended(3, 3).await;
    assert_eq!(
        report.result,
        Err(SelectError::InsufficientFunds {
            available: q(3),
            requested: q(10)
        })
    );
    assert_eq!(
        report.stats.legs, 1,
        "no backoff when the money is not there"
    );
}

#[tokio::test(start_paused = true)]
async fn below_the_balance_without_contention_is_insufficient_funds() {
    let mut tokens = MockTokenStore::new();
    tokens
        .expect_candidates()
        .returning(|_| Ok(vec![cand("a", 3)]));
    // The store leaves out what t1 selected (a, won by this call): nothing else.
    tokens.expect_balance_for().returning(|_, _, _| Ok(q(0)));
    // The scan claims what there is, then the balance check (0 + the 3 this call
    // holds) fails the call, which releases its win.
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

/// A database outage: every candidate read fails as unavailable until the leg's
/// budget is spent. The select fails at once (no backoff for an outage) with the
/// fault it met, kind and message intact: a service answers 503, not 500.
#[tokio::test(start_paused = true)]
async fn an_outage_is_a_store_error_that_keeps_the_kind_unavailable() {
    let mut tokens = MockTokenStore::new();
    tokens.expect_candidates().returning(|_| {
        Err(holdfast_ports::TokenStoreError::Fault(
            StoreFault::Unavailable("connection refused".into()),
        ))
    });
    let selector = TokenSelector::new(
        stores(tokens, MockLockStore::new(), MockTxStatusStore::new()),
        TokioClock::new(),
        config(3, 2),
        Some(3),
    )
    .expect("config");
    let report = selector
        .select_with_stats(&wallet(), &chf(), q(10), &tx("t1"))
        .await;
    let err = report.result.expect_err("every read fails");
    assert_eq!(
        err,
        SelectError::Store(StoreFault::Unavailable("connection refused".into()))
    );
    assert_eq!(err.kind(), holdfast::ErrorKind::Unavailable);
    assert_eq!(err.kind().http_status(), 503);
    assert_eq!(
        err.to_string(),
        "token store error: database unavailable: connection refused"
    );
    assert_eq!(report.stats.legs, 1, "{:?}", report.stats);
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
        ..smallest_first()
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
    tokens.expect_balance_for().returning(|_, _, _| Ok(q(20)));
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
    tokens.expect_balance_for().returning(|_, _, _| Ok(q(10)));
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

#[tokio::test(start_paused = true)]
async fn wake_ups_never_stretch_a_select_past_its_backoffs() {
    // Enough money, none of it free, and a release signalled every millisecond
    // that frees nothing this call can use: every wake-up finds nothing, and the
    // call still answers FundsLocked within its legs' backoffs (3 legs: two waits
    // below 1 s each; the last leg does not wait).
    let mut tokens = MockTokenStore::new();
    tokens.expect_candidates().returning(|_| Ok(Vec::new()));
    tokens.expect_balance_for().returning(|_, _, _| Ok(q(10)));
    let registry = holdfast_ports::Registry::new();
    let stores = holdfast_ports::Stores {
        wake: Arc::new(registry.clone()),
        ..stores(tokens, MockLockStore::new(), MockTxStatusStore::new())
    };
    let cfg = SelectionConfig {
        retry_interval: Duration::from_secs(1),
        ..config(3, 2)
    };
    let selector = TokenSelector::new(stores, TokioClock::new(), cfg, Some(9)).expect("config");
    let key = holdfast_ports::WakeKey::tokens(&wallet(), &chf());
    let signaller = tokio::spawn(async move {
        let mut ticks = tokio::time::interval(Duration::from_millis(1));
        loop {
            ticks.tick().await;
            registry.signal(std::slice::from_ref(&key), None);
        }
    });
    let started = tokio::time::Instant::now();
    let report = selector
        .select_with_stats(&wallet(), &chf(), q(10), &tx("t1"))
        .await;
    signaller.abort();
    assert_eq!(report.result, Err(SelectError::FundsLocked));
    assert_eq!(report.stats.legs, 3, "{:?}", report.stats);
    assert!(report.stats.wakeups > 10, "{:?}", report.stats);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "waited {:?} for two backoffs below 1 s",
        started.elapsed()
    );
}
