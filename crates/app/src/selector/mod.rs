//! The token selector: drives the domain's [`Selection`] state machine against the
//! token and lock stores (`docs/selection.md`).
//!
//! - Fetch -> [`TokenStore::candidates`]; a claim of one token ->
//!   [`LockStore::claim`], of several -> [`LockStore::claim_window`]; the balance ->
//!   [`TokenStore::balance_for`] (the consumer's own selections left out); a release -> [`LockStore::release_tokens`] (by consumer
//!   *and* tokens, never by consumer alone, so earlier selects of the same
//!   transaction keep their locks); a backoff -> a wait on the call's
//!   [`Subscription`] until a signal that tokens of the wallet and type were freed
//!   or the backoff's deadline (tokio time: tests can pause it), whichever is
//!   first (`docs/wakeups.md`). The subscription is taken before the first
//!   read, on behalf of the consumer (its own releases do not wake it). A woken
//!   call reads again after a jitter that shrinks with how long it has waited
//!   (at most 2 ms); if that attempt read free tokens it does not keep, it hands
//!   the wake on to the next waiter ([`Subscription::looked`]); tokens it lost to
//!   other callers are not among them. A wait that ended on its timer while
//!   signals woke waiters ahead of it goes to
//!   [`Selection::on_backoff_passed_over`] (it keeps its place in line). A read
//!   that no wake-up started first lets a woken waiter of the same wallet and type look
//!   (at most 5 ms), so a newcomer does not take what a release offered to the
//!   one that waited longest. A timer-only subscription when `wakeups` is off.
//! - Stubborn legs, random backoff, the blacklist and the fast fail come from the
//!   engine; the selector only performs.
//! - **Cancellation-safe.** Every store call runs as its own tokio task, so a
//!   dropped select cannot abandon a call half-way: the call finishes (or fails) on
//!   its own. A guard holds what the select holds or may hold
//!   ([`Selection::held`], which includes the tokens of a claim in flight) and the
//!   in-flight call's handle across every await, until the select returns its
//!   answer (the selected tokens too: a caller that never got them cannot settle
//!   them). If the future is dropped (cancelled during a backoff, a claim, the
//!   final release, anything), the guard spawns a cleanup that first waits for the
//!   in-flight call to finish (a claim may commit after the drop) and then releases
//!   exactly those tokens, by consumer and tokens, never the consumer's other
//!   locks, retrying a failing store for a while: a selection left
//!   behind would be spent by a later Confirmed of the transaction. Outside a
//!   runtime nothing can be spawned; the lock then expires with the lease.
//! - **A deadline.** A call that outlives [`SelectionConfig::deadline`] stops
//!   wherever it waits (a pooled connection, the wallet's line, a store call, a
//!   backoff or wake-up wait: each ends at the deadline at the latest) and
//!   answers then: what [`Selection::answer_if_stopped`] says (`FundsLocked` once
//!   it saw enough funds held by others), else [`SelectError::DeadlineExceeded`].
//!   Stopping is dropping the call's future, so what it holds or may hold is given
//!   back by the guard above, exactly as for a cancelled select: a store call cut
//!   at the deadline runs on as its own task until it ends (within the store's own
//!   timeouts), and its tokens are given back after it.
//! - **Replayable.** Every call runs with its own RNG seeded from a per-call seed,
//!   drawn from the selector's RNG (seeded from the configuration, or from the OS).
//!   The seed is in the call's span and in [`SelectReport::seed`];
//!   [`TokenSelector::select_seeded`] replays a call.

mod calls;
mod races;
mod waking;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast_domain::lease::{DEFAULT_LEASE_EXPIRY, needs_renewal};
use holdfast_domain::{
    Action, Quantity, SelectRequest, Selected, Selection, SelectionConfig, SelectionConfigError,
    SelectionError, SelectionFailure, SelectionStats, TokenId, TokenType, TxId, WalletId,
};
use holdfast_ports::{
    Clock, LockStore, ReadWithClaim, StoreFault, Stores, Subscription, TokenStore, WaitEnd,
    WakeKey, WakeUps,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tracing::Instrument;

use crate::error::ErrorKind;
use crate::metrics::{self as m, SelectOutcomeLabel};
use calls::{HeldGuard, claim, failure, give_back, release, renew};
use races::{Answer, candidate_read, read_size};
use waking::{DEFER_TO_WOKEN, Offered, hand_on, wake_jitter};

/// Why a select call failed. Callers tell "retry later" ([`SelectError::FundsLocked`])
/// from "not enough money" ([`SelectError::InsufficientFunds`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// The wallet's spendable balance, locks ignored, is below the requested amount.
    #[error("insufficient funds: {available} available, {requested} requested")]
    InsufficientFunds {
        /// The lock-ignoring spendable balance.
        available: Quantity,
        /// The full requested amount.
        requested: Quantity,
    },
    /// Enough funds exist but other transactions held them through every leg
    /// (or until the call's deadline).
    #[error("funds locked: enough funds exist but other transactions hold them; retry later")]
    FundsLocked,
    /// The call's deadline ([`SelectionConfig::deadline`]) passed before it could
    /// answer, and before it saw enough funds held by others: it was waiting on
    /// the store (a pooled connection, the wallet's line, a row lock) or for
    /// freed tokens. What it held is given back. Retry later, as for
    /// [`SelectError::FundsLocked`].
    #[error(
        "deadline exceeded: the select did not answer within {deadline_ms} ms (selection.deadline_ms); what it held is given back; retry later"
    )]
    DeadlineExceeded {
        /// The deadline, in ms.
        deadline_ms: u64,
    },
    /// The store failed (without contention) until the retry budget ran out: the
    /// last store fault, with its kind ([`StoreFault::kind`]: an unavailable
    /// database is not corrupt data).
    #[error("token store error: {0}")]
    Store(StoreFault),
    /// The request was refused before any I/O (an amount of zero).
    #[error(transparent)]
    Input(SelectionError),
    /// The handle is shutting down and takes no new work; retry on another
    /// replica. Never returned by [`TokenSelector`] itself.
    #[error("shutting down: this handle takes no new selects; retry on another replica")]
    ShuttingDown,
}

impl From<SelectionFailure> for SelectError {
    fn from(failure: SelectionFailure) -> Self {
        match failure {
            SelectionFailure::InsufficientFunds {
                available,
                requested,
            } => SelectError::InsufficientFunds {
                available,
                requested,
            },
            SelectionFailure::FundsLocked => SelectError::FundsLocked,
            SelectionFailure::Store { kind, message } => {
                SelectError::Store(StoreFault::new(kind, message))
            }
        }
    }
}

impl SelectError {
    /// The `outcome` metric label of this error.
    pub fn outcome_label(&self) -> SelectOutcomeLabel {
        match self {
            SelectError::InsufficientFunds { .. } => SelectOutcomeLabel::InsufficientFunds,
            SelectError::FundsLocked => SelectOutcomeLabel::FundsLocked,
            SelectError::DeadlineExceeded { .. } => SelectOutcomeLabel::DeadlineExceeded,
            SelectError::Store(_) | SelectError::Input(_) | SelectError::ShuttingDown => {
                SelectOutcomeLabel::Error
            }
        }
    }

    /// What kind of failure this is ([`ErrorKind`]): insufficient funds, funds
    /// locked, a deadline (timeout), the store fault's kind, invalid input, or
    /// shutting down.
    pub fn kind(&self) -> ErrorKind {
        match self {
            SelectError::InsufficientFunds { .. } => ErrorKind::InsufficientFunds,
            SelectError::FundsLocked => ErrorKind::FundsLocked,
            SelectError::DeadlineExceeded { .. } => ErrorKind::Timeout,
            SelectError::Store(fault) => fault.kind().into(),
            SelectError::Input(_) => ErrorKind::InvalidInput,
            SelectError::ShuttingDown => ErrorKind::ShuttingDown,
        }
    }
}

/// One select call with everything it measured.
#[derive(Debug, Clone, PartialEq)]
pub struct SelectReport {
    /// The outcome.
    pub result: Result<Selected, SelectError>,
    /// The engine's counters: lock attempts, conflicts, stale, store errors,
    /// distinct tokens, legs, round trips ([`SelectionStats::round_trips`]), ...
    pub stats: SelectionStats,
    /// The per-call RNG seed; [`TokenSelector::select_seeded`] with it replays the
    /// call against the same store state.
    pub seed: u64,
    /// Tokio time from start to the final answer, backoffs included; the deadline
    /// at most (give or take the timer's resolution).
    pub elapsed: Duration,
}

/// Selects and locks tokens for consumer transactions. Cheap to share (`Arc`) and
/// safe to call concurrently.
pub struct TokenSelector {
    tokens: Arc<dyn TokenStore>,
    locks: Arc<dyn LockStore>,
    wake: Arc<dyn WakeUps>,
    clock: Arc<dyn Clock>,
    config: SelectionConfig,
    lease: Duration,
    seeds: Mutex<StdRng>,
    /// When the lock store reads and claims in one call, as it says.
    read_with_claim: ReadWithClaim,
}

impl std::fmt::Debug for TokenSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSelector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl TokenSelector {
    /// A selector over `stores` (tokens and locks are used), with `config` validated
    /// here. `seed` makes the sequence of calls replayable; `None` seeds from the OS.
    pub fn new(
        stores: Stores,
        clock: Arc<dyn Clock>,
        config: SelectionConfig,
        seed: Option<u64>,
    ) -> Result<Self, SelectionConfigError> {
        config.validate()?;
        let seeds = match seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        Ok(TokenSelector {
            read_with_claim: stores.locks.read_with_claim(),
            tokens: stores.tokens,
            locks: stores.locks,
            wake: stores.wake,
            clock,
            config,
            lease: DEFAULT_LEASE_EXPIRY,
            seeds: Mutex::new(seeds),
        })
    }

    /// Sets the lease of the locks (default [`DEFAULT_LEASE_EXPIRY`]; use the lease
    /// sweep's `lease_expiry`). A select still running after half of it re-checks
    /// and re-stamps its locks before answering, so it never returns a token whose
    /// lock the sweep took: lost tokens are given back and selected again.
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The selection settings.
    pub fn config(&self) -> &SelectionConfig {
        &self.config
    }

    /// Selects tokens of `token_type` from `wallet` covering `amount` and locks them
    /// for `consumer`. On any error, only the locks won by this call are released.
    pub async fn select(
        &self,
        wallet: &WalletId,
        token_type: &TokenType,
        amount: Quantity,
        consumer: &TxId,
    ) -> Result<Selected, SelectError> {
        self.select_with_stats(wallet, token_type, amount, consumer)
            .await
            .result
    }

    /// As [`TokenSelector::select`], returning the call's counters and seed too.
    pub async fn select_with_stats(
        &self,
        wallet: &WalletId,
        token_type: &TokenType,
        amount: Quantity,
        consumer: &TxId,
    ) -> SelectReport {
        let seed = self.next_seed();
        let request = SelectRequest {
            wallet: wallet.clone(),
            token_type: token_type.clone(),
            amount,
            consumer: consumer.clone(),
        };
        self.select_seeded(&request, seed).await
    }

    /// Runs one select call with its RNG seeded by `seed` (a replay of the call
    /// whose [`SelectReport::seed`] it was, given the same store answers).
    pub async fn select_seeded(&self, request: &SelectRequest, seed: u64) -> SelectReport {
        let span = tracing::info_span!(
            "select",
            wallet = %request.wallet,
            token_type = %request.token_type,
            amount = %request.amount,
            consumer = %request.consumer,
            seed,
            outcome = tracing::field::Empty,
            legs = tracing::field::Empty,
        );
        let started = tokio::time::Instant::now();
        let mut progress = Progress::new(started);
        // Past the deadline the call is dropped wherever it waits; its guard gives
        // back what it holds or may hold (module docs).
        let driven = tokio::time::timeout_at(
            started + self.config.deadline,
            self.drive(request, seed, &mut progress),
        )
        .instrument(span.clone())
        .await;
        let (result, stats) = match driven {
            Ok(done) => done,
            Err(_) => {
                let deadline_ms =
                    u64::try_from(self.config.deadline.as_millis()).unwrap_or(u64::MAX);
                let result = match progress.answer.take() {
                    Some(failure) => SelectError::from(failure),
                    None => SelectError::DeadlineExceeded { deadline_ms },
                };
                tracing::debug!(
                    parent: &span,
                    deadline_ms,
                    outcome = result.outcome_label().as_str(),
                    "the select's deadline passed; giving back what it holds"
                );
                (Err(result), progress.stats())
            }
        };
        let elapsed = started.elapsed();
        let label = match &result {
            Ok(_) => SelectOutcomeLabel::Success,
            Err(e) => e.outcome_label(),
        };
        span.record("outcome", label.as_str());
        span.record("legs", stats.legs);
        m::record_selection(label, &stats, elapsed);
        SelectReport {
            result,
            stats,
            seed,
            elapsed,
        }
    }

    fn next_seed(&self) -> u64 {
        // A poisoned lock only means another call panicked mid-draw; the RNG state
        // is still a valid RNG state.
        let mut rng = self
            .seeds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        rng.random()
    }

    async fn drive(
        &self,
        request: &SelectRequest,
        seed: u64,
        progress: &mut Progress,
    ) -> (Result<Selected, SelectError>, SelectionStats) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut guard = HeldGuard {
            locks: self.locks.clone(),
            consumer: request.consumer.clone(),
            held: Vec::new(),
            in_flight: None,
        };
        // Subscribed before the first read, so that a release between a read and
        // the wait that follows it is not missed; never woken by its own releases.
        let mut waiter = if self.config.wakeups {
            self.wake.subscribe(
                WakeKey::tokens(&request.wallet, &request.token_type),
                Some(request.consumer.clone()),
            )
        } else {
            Subscription::timer_only()
        };
        let mut pass = 0u32;
        let outcome = loop {
            pass += 1;
            let started = self.clock.now();
            let (outcome, stats) = match self
                .pass(request, &mut rng, &mut guard, &mut waiter, progress)
                .await
            {
                Ok(done) => done,
                Err(e) => break Err(SelectError::Input(e)),
            };
            progress.end_pass(&stats);
            let Ok(selected) = outcome else {
                break outcome.map_err(SelectError::from);
            };
            let now = self.clock.now();
            if stats.claims == 0 || !needs_renewal(started, now, self.lease) {
                break Ok(selected);
            }
            // Half the lease has passed since this pass's first claim could have
            // been made: re-check (and re-stamp) every lock before answering.
            progress.total.renewals += 1;
            let call = renew(
                self.locks.clone(),
                request.consumer.clone(),
                selected.tokens.clone(),
                now,
            );
            let lost: Vec<TokenId> = match guard.perform(call).await {
                Ok(held) => selected
                    .tokens
                    .iter()
                    .filter(|t| !held.contains(t))
                    .cloned()
                    .collect(),
                // Unknown: treat every token as possibly lost.
                Err(_) => selected.tokens.clone(),
            };
            if lost.is_empty() {
                break Ok(selected);
            }
            progress.total.locks_lost += u64::try_from(lost.len()).unwrap_or(u64::MAX);
            metrics::counter!(m::SELECT_LOCKS_LOST)
                .increment(u64::try_from(lost.len()).unwrap_or(u64::MAX));
            tracing::warn!(
                lost = lost.len(),
                pass,
                "the lease sweep took locks of this select; selecting again"
            );
            // Give everything of this pass back (the lost tokens' selections too)
            // and select again from a fresh read.
            progress.total.releases += 1;
            let call = release(
                self.locks.clone(),
                request.consumer.clone(),
                selected.tokens.clone(),
            );
            if let Err(e) = guard.perform(call).await {
                tracing::warn!(error = %e, "could not give back a pass's tokens; retrying in the background");
                tokio::spawn(give_back(
                    self.locks.clone(),
                    request.consumer.clone(),
                    selected.tokens.clone(),
                    "renewal",
                ));
            }
            guard.held.clear();
            if pass > self.config.max_retries {
                break Err(SelectError::FundsLocked);
            }
        };
        guard.held.clear();
        (outcome, std::mem::take(&mut progress.total))
    }

    /// One pass of the engine, from a fresh read to its answer. On return the guard
    /// covers exactly the selected tokens (none after a failure).
    async fn pass(
        &self,
        request: &SelectRequest,
        rng: &mut StdRng,
        guard: &mut HeldGuard,
        waiter: &mut Subscription,
        progress: &mut Progress,
    ) -> Result<(Result<Selected, SelectionFailure>, SelectionStats), SelectionError> {
        let call_started = progress.started;
        let mut selection = Selection::new(request.clone(), self.config.clone())?;
        let rng = &mut *rng;
        // In an attempt a wake-up started: the free candidates it read.
        let mut woken: Option<Offered> = None;
        // The deadline of the current leg's wait, kept across its woken attempts.
        let mut leg_deadline: Option<tokio::time::Instant> = None;
        // Tokens of read-and-claims that failed: they may be held (see
        // `read_and_claim`); covered by the guard and given back at the end.
        let mut ambiguous: Vec<TokenId> = Vec::new();
        let mut action = selection.start(rng);
        let outcome = loop {
            guard.held = covered(selection.held(), &ambiguous);
            progress.note(&selection);
            action = match action {
                Action::Fetch(fetch) => {
                    if woken.is_none() {
                        // A waiter woken for freed tokens looks at them first.
                        let bound = tokio::time::Instant::now() + DEFER_TO_WOKEN;
                        waiter.defer_to_woken(bound).await;
                    }
                    let read = candidate_read(request, fetch);
                    // Read and claim in one call where the store says so:
                    // always, or where a race is likely (this call was woken,
                    // has waited or lost one, or its instance's callers of the
                    // same wallet and type wait or read it thin).
                    let stats = selection.stats();
                    let combined = match self.read_with_claim {
                        ReadWithClaim::Never => false,
                        ReadWithClaim::Always => true,
                        ReadWithClaim::WhereRacesLikely => {
                            woken.is_some()
                                || stats.waits + stats.conflicts + stats.stale > 0
                                || waiter.race_likely()
                        }
                    };
                    let combined = if combined {
                        self.read_and_claim(&selection, rng, guard, request, &read, &mut ambiguous)
                            .await
                    } else {
                        None
                    };
                    let answer = match combined {
                        Some(done) => Answer::Claimed(done),
                        None => {
                            let page = self.read(guard, &read).await;
                            if let Ok(found) = &page {
                                waiter.note(read_size(&read, found));
                            }
                            // Thin while others of the instance read the same
                            // wallet and type (the first reads of a burst, before
                            // anyone noted its size): read again with the claim
                            // rather than race them.
                            let thin = self.read_with_claim == ReadWithClaim::WhereRacesLikely
                                && page.as_ref().is_ok_and(|found| !found.is_empty())
                                && waiter.race_likely();
                            let again = if thin {
                                self.read_and_claim(
                                    &selection,
                                    rng,
                                    guard,
                                    request,
                                    &read,
                                    &mut ambiguous,
                                )
                                .await
                            } else {
                                None
                            };
                            match again {
                                Some(done) => {
                                    selection.note_read_again();
                                    Answer::Claimed(done)
                                }
                                None => Answer::Read(page),
                            }
                        }
                    };
                    match answer {
                        Answer::Claimed(Ok(done)) => {
                            waiter.note(read_size(&read, &done.page));
                            if let Some(offered) = &mut woken {
                                offered.read(&done.page);
                                offered.claimed(&done.verdicts);
                            }
                            self.took_with_read(&mut selection, rng, guard, request, done)
                                .await
                        }
                        Answer::Claimed(Err(failure)) => selection.on_candidates(Err(failure), rng),
                        Answer::Read(page) => {
                            if let (Some(offered), Ok(page)) = (&mut woken, &page) {
                                offered.read(page);
                            }
                            selection.on_candidates(page, rng)
                        }
                    }
                }
                Action::Claim(tokens) => {
                    let call = claim(
                        self.locks.clone(),
                        request.consumer.clone(),
                        tokens,
                        self.clock.now(),
                    );
                    let verdicts = guard.perform(call).await;
                    if let (Some(offered), Ok(verdicts)) = (&mut woken, &verdicts) {
                        offered.claimed(verdicts);
                    }
                    selection.on_claim(verdicts, rng)
                }
                Action::CheckBalance => {
                    let tokens = self.tokens.clone();
                    let (wallet, token_type) = (request.wallet.clone(), request.token_type.clone());
                    let consumer = request.consumer.clone();
                    let balance = guard
                        .perform(async move {
                            tokens
                                .balance_for(&wallet, &token_type, &consumer)
                                .await
                                .map_err(failure)
                        })
                        .await;
                    selection.on_balance(balance, rng)
                }
                Action::Release(tokens) => {
                    let released = guard
                        .perform(release(
                            self.locks.clone(),
                            request.consumer.clone(),
                            tokens,
                        ))
                        .await
                        .map(drop);
                    selection.on_released(released, rng)
                }
                Action::Backoff(delay) => {
                    // After a woken attempt the leg's wait goes on to the deadline it
                    // had: the attempt's own time counts, so a leg never lasts longer
                    // than its backoff, however many wake-ups it gets.
                    let resumed = woken.is_some();
                    hand_on(waiter, woken.take(), &[]);
                    let now = tokio::time::Instant::now();
                    let deadline = match leg_deadline {
                        Some(deadline) if resumed => deadline,
                        _ => now + delay,
                    };
                    leg_deadline = Some(deadline);
                    tracing::debug!(leg = selection.leg(), ?delay, "funds locked; waiting");
                    match waiter.wait_until(deadline).await {
                        WaitEnd::Timer if waiter.passed_over() => {
                            leg_deadline = None;
                            selection.on_backoff_passed_over(rng)
                        }
                        WaitEnd::Timer => {
                            leg_deadline = None;
                            selection.on_backoff_elapsed(rng)
                        }
                        WaitEnd::Signalled => {
                            tokio::time::sleep(wake_jitter(call_started.elapsed(), rng)).await;
                            let rest =
                                deadline.saturating_duration_since(tokio::time::Instant::now());
                            tracing::debug!(?rest, "woken; trying again");
                            woken = Some(Offered::default());
                            selection.on_woken(delay.saturating_sub(rest), rng)
                        }
                    }
                }
                Action::Done(outcome) => break outcome,
            };
        };
        let kept = outcome.as_ref().map_or(&[][..], |s| s.tokens.as_slice());
        hand_on(waiter, woken, kept);
        // What is still held beyond the answer: tokens whose release failed. One
        // more attempt, then retries in the background. The guard keeps covering
        // the selected tokens too until the answer is returned: dropped during this
        // release, the call must not leave them locked for a caller that never got
        // them.
        guard.held = covered(selection.held(), &ambiguous);
        progress.note(&selection);
        let keep: Vec<TokenId> = match &outcome {
            Ok(selected) => selected.tokens.clone(),
            Err(_) => Vec::new(),
        };
        let leftover: Vec<TokenId> = guard
            .held
            .iter()
            .filter(|t| !keep.contains(t))
            .cloned()
            .collect();
        if !leftover.is_empty() {
            let count = leftover.len();
            let call = release(
                self.locks.clone(),
                request.consumer.clone(),
                leftover.clone(),
            );
            if let Err(e) = guard.perform(call).await {
                tracing::warn!(
                    tokens = count,
                    error = %e,
                    "could not release this call's leftover locks; retrying in the background"
                );
                tokio::spawn(give_back(
                    self.locks.clone(),
                    request.consumer.clone(),
                    leftover,
                    "leftover",
                ));
            }
        }
        guard.held = keep;
        Ok((outcome, selection.stats().clone()))
    }
}

/// What a select call has done so far, kept outside its future so that the
/// answer at its deadline (when the future is dropped) can use it.
#[derive(Debug)]
struct Progress {
    /// When the call started (tokio time).
    started: tokio::time::Instant,
    /// The counters of the passes that ended, and of renewals between them.
    total: SelectionStats,
    /// The counters of the pass under way.
    pass: SelectionStats,
    /// What the call answers if stopped now, when the engine can tell
    /// ([`Selection::answer_if_stopped`]); kept once seen.
    answer: Option<SelectionFailure>,
}

impl Progress {
    fn new(started: tokio::time::Instant) -> Self {
        Progress {
            started,
            total: SelectionStats::default(),
            pass: SelectionStats::default(),
            answer: None,
        }
    }

    /// Notes where the engine of the pass under way stands.
    fn note(&mut self, selection: &Selection) {
        self.pass.clone_from(selection.stats());
        if let Some(answer) = selection.answer_if_stopped() {
            self.answer = Some(answer);
        }
    }

    /// Adds the counters of a pass that ended.
    fn end_pass(&mut self, stats: &SelectionStats) {
        self.total.absorb(stats);
        self.pass = SelectionStats::default();
    }

    /// Every counter so far.
    fn stats(&self) -> SelectionStats {
        let mut stats = self.total.clone();
        stats.absorb(&self.pass);
        stats
    }
}

/// What a select covers: what the engine holds, and the tokens of failed
/// read-and-claims that may be held.
fn covered(mut held: Vec<TokenId>, ambiguous: &[TokenId]) -> Vec<TokenId> {
    for token in ambiguous {
        if !held.contains(token) {
            held.push(token.clone());
        }
    }
    held
}
