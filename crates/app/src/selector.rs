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
//! - **Replayable.** Every call runs with its own RNG seeded from a per-call seed,
//!   drawn from the selector's RNG (seeded from the configuration, or from the OS).
//!   The seed is in the call's span and in [`SelectReport::seed`];
//!   [`TokenSelector::select_seeded`] replays a call.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast_domain::lease::{DEFAULT_LEASE_EXPIRY, needs_renewal};
use holdfast_domain::{
    Action, Candidate, ClaimVerdict, FetchRequest, Quantity, SelectRequest, Selected, Selection,
    SelectionConfig, SelectionConfigError, SelectionError, SelectionFailure, SelectionStats,
    StoreFailure, Timestamp, TokenId, TokenType, TxId, WalletId,
};
use holdfast_ports::{
    BandQuery, CandidateQuery, CandidateRead, Chooser, Clock, LockStore, ReadAndClaim, Stores,
    Subscription, TokenStore, WaitEnd, WakeKey, WakeUps,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::metrics::{self as m, SelectOutcomeLabel};

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
    /// Enough funds exist but other transactions held them through every leg.
    #[error("funds locked: enough funds exist but other transactions hold them; retry later")]
    FundsLocked,
    /// The store failed (without contention) until the retry budget ran out.
    #[error("token store error: {0}")]
    Store(String),
    /// The request was refused before any I/O (an amount of zero).
    #[error(transparent)]
    Input(SelectionError),
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
            SelectionFailure::Store { message } => SelectError::Store(message),
        }
    }
}

impl SelectError {
    /// The `outcome` metric label of this error.
    pub fn outcome_label(&self) -> SelectOutcomeLabel {
        match self {
            SelectError::InsufficientFunds { .. } => SelectOutcomeLabel::InsufficientFunds,
            SelectError::FundsLocked => SelectOutcomeLabel::FundsLocked,
            SelectError::Store(_) | SelectError::Input(_) => SelectOutcomeLabel::Error,
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
    /// Tokio time from start to the final answer, backoffs included.
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
    /// Whether the lock store reads and claims in one round trip (until it
    /// says it cannot).
    reads_with_claims: AtomicBool,
    /// Per wallet and type: when a claim of this selector last lost a race, and
    /// how many candidates its last read returned.
    contention: Mutex<HashMap<(WalletId, TokenType), Contention>>,
}

/// What a selector last saw of one wallet and type.
#[derive(Debug, Clone, Copy, Default)]
struct Contention {
    lost_at: Option<tokio::time::Instant>,
    last_read: Option<usize>,
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
            tokens: stores.tokens,
            locks: stores.locks,
            wake: stores.wake,
            clock,
            config,
            lease: DEFAULT_LEASE_EXPIRY,
            seeds: Mutex::new(seeds),
            reads_with_claims: AtomicBool::new(true),
            contention: Mutex::new(HashMap::new()),
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
        let (result, stats) = self.drive(request, seed).instrument(span.clone()).await;
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
        let call_started = tokio::time::Instant::now();
        let mut total = SelectionStats::default();
        let mut pass = 0u32;
        let outcome = loop {
            pass += 1;
            let started = self.clock.now();
            let (outcome, stats) = match self
                .pass(request, &mut rng, &mut guard, &mut waiter, call_started)
                .await
            {
                Ok(done) => done,
                Err(e) => break Err(SelectError::Input(e)),
            };
            total.absorb(&stats);
            let Ok(selected) = outcome else {
                break outcome.map_err(SelectError::from);
            };
            let now = self.clock.now();
            if stats.claims == 0 || !needs_renewal(started, now, self.lease) {
                break Ok(selected);
            }
            // Half the lease has passed since this pass's first claim could have
            // been made: re-check (and re-stamp) every lock before answering.
            total.renewals += 1;
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
            total.locks_lost += u64::try_from(lost.len()).unwrap_or(u64::MAX);
            metrics::counter!(m::SELECT_LOCKS_LOST)
                .increment(u64::try_from(lost.len()).unwrap_or(u64::MAX));
            tracing::warn!(
                lost = lost.len(),
                pass,
                "the lease sweep took locks of this select; selecting again"
            );
            // Give everything of this pass back (the lost tokens' selections too)
            // and select again from a fresh read.
            total.releases += 1;
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
        (outcome, total)
    }

    /// One pass of the engine, from a fresh read to its answer. On return the guard
    /// covers exactly the selected tokens (none after a failure).
    async fn pass(
        &self,
        request: &SelectRequest,
        rng: &mut StdRng,
        guard: &mut HeldGuard,
        waiter: &mut Subscription,
        call_started: tokio::time::Instant,
    ) -> Result<(Result<Selected, SelectionFailure>, SelectionStats), SelectionError> {
        let mut selection = Selection::new(request.clone(), self.config.clone())?;
        let rng = &mut *rng;
        // In an attempt a wake-up started: the free candidates it read.
        let mut woken: Option<Offered> = None;
        // The deadline of the current leg's wait, kept across its woken attempts.
        let mut leg_deadline: Option<tokio::time::Instant> = None;
        let mut action = selection.start(rng);
        let outcome = loop {
            guard.held = selection.held();
            action = match action {
                Action::Fetch(fetch) => {
                    if woken.is_none() {
                        // A waiter woken for freed tokens looks at them first.
                        let bound = tokio::time::Instant::now() + DEFER_TO_WOKEN;
                        waiter.defer_to_woken(bound).await;
                    }
                    let read = candidate_read(request, fetch);
                    // Contention is likely: others of this instance wait for the
                    // same wallet and type, or this call has waited or lost a race.
                    let stats = selection.stats();
                    let contended = woken.is_some()
                        || waiter.others_waiting()
                        || stats.waits + stats.conflicts + stats.stale > 0
                        || self.contended(request, waiter.others_subscribed());
                    let combined = if contended {
                        self.read_and_claim(&selection, rng, guard, request, &read)
                            .await
                    } else {
                        None
                    };
                    match combined {
                        Some(Ok(done)) => {
                            self.note(request, Some(done.page.len()), false);
                            if let Some(offered) = &mut woken {
                                offered.read(&done.page);
                                offered.claimed(&done.verdicts);
                            }
                            self.took_with_read(&mut selection, rng, guard, request, done)
                                .await
                        }
                        Some(Err(failure)) => selection.on_candidates(Err(failure), rng),
                        None => {
                            let tokens = self.tokens.clone();
                            let page = guard
                                .perform(async move {
                                    match &read {
                                        CandidateRead::Bands(query) => {
                                            tokens.candidate_bands(query).await
                                        }
                                        CandidateRead::Page(query) => {
                                            tokens.candidates(query).await
                                        }
                                    }
                                    .map_err(failure)
                                })
                                .await;
                            if let Ok(page) = &page {
                                self.note(request, Some(page.len()), false);
                            }
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
                    if let Ok(verdicts) = &verdicts
                        && verdicts.iter().any(|(_, v)| *v != ClaimVerdict::Won)
                    {
                        self.note(request, None, true);
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
        guard.held = selection.held();
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

impl TokenSelector {
    /// Reads and claims in one round trip where the lock store can
    /// ([`LockStore::read_and_claim`]): the engine's choice runs on the page
    /// inside the store's transaction (a copy of the engine with a copy of the
    /// call's RNG, so the real engine, fed the same page afterwards, names the
    /// same tokens). `None` when the store cannot: the caller reads and claims
    /// in two calls, and this selector does not ask again.
    async fn read_and_claim(
        &self,
        selection: &Selection,
        rng: &StdRng,
        guard: &mut HeldGuard,
        request: &SelectRequest,
        read: &CandidateRead,
    ) -> Option<Result<ReadAndClaim, StoreFailure>> {
        if !self.reads_with_claims.load(Ordering::Relaxed) {
            return None;
        }
        let (mut probe, mut probe_rng) = (selection.clone(), rng.clone());
        let choose: Chooser = Box::new(move |page: &[Candidate]| {
            match probe.on_candidates(Ok(page.to_vec()), &mut probe_rng) {
                Action::Claim(tokens) => tokens,
                _ => Vec::new(),
            }
        });
        let (locks, consumer, read, at) = (
            self.locks.clone(),
            request.consumer.clone(),
            read.clone(),
            self.clock.now(),
        );
        let call = async move {
            locks
                .read_and_claim(&consumer, &read, at, choose)
                .await
                .map_err(failure)
        };
        // Dropped while the call runs, the select never learns what it won:
        // the call's task gives it back.
        let (locks, consumer) = (self.locks.clone(), request.consumer.clone());
        let answer = guard
            .perform_with(call, move |undelivered| {
                if let Ok(Some(done)) = undelivered {
                    let won = won(&done.verdicts);
                    if !won.is_empty() {
                        tokio::spawn(give_back(locks, consumer, won, "cancelled"));
                    }
                }
            })
            .await;
        match answer {
            Ok(None) => {
                self.reads_with_claims.store(false, Ordering::Relaxed);
                None
            }
            Ok(Some(done)) => Some(Ok(done)),
            Err(failure) => Some(Err(failure)),
        }
    }

    fn contention(&self) -> std::sync::MutexGuard<'_, HashMap<(WalletId, TokenType), Contention>> {
        self.contention
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes what a read of `request`'s wallet and type returned, or that a
    /// claim of it lost a race.
    fn note(&self, request: &SelectRequest, read: Option<usize>, lost: bool) {
        let key = (request.wallet.clone(), request.token_type.clone());
        let mut seen = self.contention();
        let entry = seen.entry(key).or_default();
        if lost {
            entry.lost_at = Some(tokio::time::Instant::now());
        }
        if read.is_some() {
            entry.last_read = read;
        }
    }

    /// Whether reads of `request`'s wallet and type are likely to race other
    /// callers of this selector: one of its claims lost a race within
    /// [`CONTENTION_MEMORY`], or its last read returned fewer than two
    /// candidates for each of the `others` callers after them now.
    fn contended(&self, request: &SelectRequest, others: usize) -> bool {
        let key = (request.wallet.clone(), request.token_type.clone());
        let seen = self.contention();
        let Some(entry) = seen.get(&key) else {
            return false;
        };
        let lost = entry
            .lost_at
            .is_some_and(|at| at.elapsed() < CONTENTION_MEMORY);
        let thin = others > 0 && entry.last_read.is_some_and(|n| n < 2 * others);
        lost || thin
    }

    /// Feeds a read-and-claim to the engine: the page, then (if a claim was
    /// made) its verdicts, as if read and claimed in two calls.
    async fn took_with_read(
        &self,
        selection: &mut Selection,
        rng: &mut StdRng,
        guard: &mut HeldGuard,
        request: &SelectRequest,
        done: ReadAndClaim,
    ) -> Action {
        let next = selection.on_candidates(Ok(done.page), rng);
        if done.verdicts.is_empty() {
            return next;
        }
        let claimed: Vec<TokenId> = done.verdicts.iter().map(|(t, _)| t.clone()).collect();
        match next {
            Action::Claim(tokens) if tokens == claimed => {
                selection.note_claim_with_read();
                selection.on_claim(Ok(done.verdicts), rng)
            }
            other => {
                // The engine chose otherwise than its copy did (it cannot, fed
                // the same page and RNG): give back what the store claimed.
                tracing::error!(
                    ?claimed,
                    ?other,
                    "read-and-claim chose other tokens than the engine"
                );
                let won = won(&done.verdicts);
                let call = release(self.locks.clone(), request.consumer.clone(), won.clone());
                if guard.perform(call).await.is_err() {
                    tokio::spawn(give_back(
                        self.locks.clone(),
                        request.consumer.clone(),
                        won,
                        "leftover",
                    ));
                }
                other
            }
        }
    }
}

/// The tokens of `verdicts` that were won.
fn won(verdicts: &[(TokenId, ClaimVerdict)]) -> Vec<TokenId> {
    verdicts
        .iter()
        .filter(|(_, v)| *v == ClaimVerdict::Won)
        .map(|(t, _)| t.clone())
        .collect()
}

/// What a fetch of the engine reads.
fn candidate_read(request: &SelectRequest, fetch: FetchRequest) -> CandidateRead {
    let (wallet, token_type) = (request.wallet.clone(), request.token_type.clone());
    match fetch.bands {
        Some(bands) => CandidateRead::Bands(BandQuery {
            wallet,
            token_type,
            threshold: bands.threshold,
            cover: bands.cover,
            fill: fetch.limit,
            fill_before: fetch.after,
        }),
        None => CandidateRead::Page(CandidateQuery {
            wallet,
            token_type,
            after: fetch.after,
            limit: fetch.limit,
        }),
    }
}

/// How long a lost race marks a wallet and type as contended for this selector's
/// next reads (they then read and claim in one round trip where the store can).
/// Long enough for the callers that met it, short enough that a big wallet
/// with a rare lost race keeps reading outside the write lock.
const CONTENTION_MEMORY: Duration = Duration::from_millis(10);

/// The longest a read that no wake-up started waits for a woken waiter of the
/// same wallet and type to finish looking at what was freed.
const DEFER_TO_WOKEN: Duration = Duration::from_millis(5);

/// What an attempt a wake-up started found free: the tokens it read, less those
/// it then lost to other callers (contended or stale: taken already).
#[derive(Debug, Default)]
struct Offered(BTreeSet<TokenId>);

impl Offered {
    fn read(&mut self, page: &[Candidate]) {
        self.0.extend(page.iter().map(|c| c.id.clone()));
    }

    fn claimed(&mut self, verdicts: &[(TokenId, ClaimVerdict)]) {
        for (token, verdict) in verdicts {
            if *verdict != ClaimVerdict::Won {
                self.0.remove(token);
            }
        }
    }

    /// Whether free tokens are left that the attempt did not keep (too small for
    /// it, or more than it needed): then the next waiter should look at them.
    fn left_over(&self, kept: &[TokenId]) -> bool {
        self.0.iter().any(|t| !kept.contains(t))
    }
}

/// At the end of an attempt a wake-up started: if it leaves free tokens it does
/// not keep, hands the wake on to the next waiter, for whom they may do. A read
/// that found nothing free, or only tokens others took first, hands nothing on.
fn hand_on(waiter: &Subscription, woken: Option<Offered>, kept: &[TokenId]) {
    if let Some(offered) = woken {
        waiter.looked(offered.left_over(kept));
    }
}

/// Claims `tokens` for `consumer`: one token through [`LockStore::claim`], several
/// through [`LockStore::claim_window`].
async fn claim(
    locks: Arc<dyn LockStore>,
    consumer: TxId,
    tokens: Vec<TokenId>,
    at: Timestamp,
) -> Result<Vec<(TokenId, ClaimVerdict)>, StoreFailure> {
    match tokens.as_slice() {
        [single] => locks
            .claim(&consumer, single, at)
            .await
            .map(|verdict| vec![(single.clone(), verdict)])
            .map_err(failure),
        many => locks
            .claim_window(&consumer, many, at)
            .await
            .map_err(failure),
    }
}

/// Re-stamps the locks `consumer` holds among `tokens`; returns those still held.
async fn renew(
    locks: Arc<dyn LockStore>,
    consumer: TxId,
    tokens: Vec<TokenId>,
    at: Timestamp,
) -> Result<Vec<TokenId>, StoreFailure> {
    locks.renew(&consumer, &tokens, at).await.map_err(failure)
}

/// Releases `tokens` held by `consumer` (only these).
async fn release(
    locks: Arc<dyn LockStore>,
    consumer: TxId,
    tokens: Vec<TokenId>,
) -> Result<u64, StoreFailure> {
    locks
        .release_tokens(&consumer, &tokens)
        .await
        .map_err(failure)
}

fn failure(e: impl std::fmt::Display) -> StoreFailure {
    StoreFailure::new(e.to_string())
}

/// The longest jitter a woken select waits before it reads.
const WAKE_JITTER_MAX: Duration = Duration::from_millis(2);
/// A select waiting this long (since it started) reads at once when woken.
const WAKE_JITTER_AGE: Duration = Duration::from_millis(100);

/// How long a select woken `age` after it started waits before it reads: up to
/// [`WAKE_JITTER_MAX`] for one that just started, less the longer it has waited,
/// none after [`WAKE_JITTER_AGE`]; at random between half and all of that. One signal wakes one
/// waiter per instance, so this is not about a stampede within an instance: it
/// lets the longest-waiting of the instances' woken waiters read first.
fn wake_jitter(age: Duration, rng: &mut StdRng) -> Duration {
    let youth = WAKE_JITTER_AGE.saturating_sub(age).as_secs_f64() / WAKE_JITTER_AGE.as_secs_f64();
    WAKE_JITTER_MAX.mul_f64(youth * rng.random_range(0.5..1.0))
}

/// Attempts of [`give_back`], and the backoff before its second attempt (doubling).
const GIVE_BACK_ATTEMPTS: u32 = 8;
const GIVE_BACK_BACKOFF: Duration = Duration::from_millis(100);

/// Gives back tokens a select call won but does not answer with (it failed, was
/// cancelled, or lost some to the sweep): releases their locks and forgets their
/// selections, retrying a failing store with a doubling backoff (about 25 s in
/// all). Forgetting matters beyond the lease: a selection left behind would be
/// spent by a later Confirmed of the same transaction.
async fn give_back(
    locks: Arc<dyn LockStore>,
    consumer: TxId,
    tokens: Vec<TokenId>,
    reason: &'static str,
) {
    let mut delay = GIVE_BACK_BACKOFF;
    for attempt in 1..=GIVE_BACK_ATTEMPTS {
        match locks.release_tokens(&consumer, &tokens).await {
            Ok(released) => {
                metrics::counter!(m::LOCKS_RELEASED, "reason" => reason).increment(released);
                return;
            }
            Err(e) if attempt == GIVE_BACK_ATTEMPTS => tracing::error!(
                %consumer,
                tokens = tokens.len(),
                error = %e,
                "could not give back a select's tokens; their locks expire with the lease, \
                 but a Confirmed of this transaction would spend them"
            ),
            Err(_) => {
                tokio::time::sleep(delay).await;
                delay = delay.saturating_mul(2);
            }
        }
    }
}

/// Covers what a select call holds or may hold, and its store call in flight, for
/// as long as the call runs; releases them if the call is dropped before it
/// answered.
struct HeldGuard {
    locks: Arc<dyn LockStore>,
    consumer: TxId,
    /// The tokens this call holds or may hold, including those of the claim in
    /// flight.
    held: Vec<TokenId>,
    /// The store call in flight, run as its own task.
    in_flight: Option<JoinHandle<()>>,
}

impl HeldGuard {
    /// Runs one store call as its own task and waits for its answer. If the select
    /// is dropped meanwhile, the task runs on, and the cleanup waits for it before
    /// releasing. A task that ends without an answer (it panicked, or the runtime
    /// is shutting down) is a store failure.
    async fn perform<T: Send + 'static>(
        &mut self,
        call: impl Future<Output = Result<T, StoreFailure>> + Send + 'static,
    ) -> Result<T, StoreFailure> {
        self.perform_with(call, drop).await
    }

    /// As [`HeldGuard::perform`]; an answer the dropped select cannot take goes
    /// to `undelivered` (in the call's task).
    async fn perform_with<T: Send + 'static>(
        &mut self,
        call: impl Future<Output = Result<T, StoreFailure>> + Send + 'static,
        undelivered: impl FnOnce(Result<T, StoreFailure>) + Send + 'static,
    ) -> Result<T, StoreFailure> {
        let (answer_tx, answer_rx) = oneshot::channel();
        let task = async move {
            // The receiver is gone only when the select was dropped; the cleanup
            // then waits for this task instead.
            if let Err(answer) = answer_tx.send(call.await) {
                undelivered(answer);
            }
        };
        self.in_flight = Some(tokio::spawn(task.in_current_span()));
        let answer = answer_rx.await.unwrap_or_else(|_| {
            Err(StoreFailure::new(
                "the store call ended without an answer (it panicked or was cancelled)",
            ))
        });
        self.in_flight = None;
        answer
    }
}

impl Drop for HeldGuard {
    fn drop(&mut self) {
        let in_flight = self.in_flight.take();
        if self.held.is_empty() {
            // Nothing held, and a call in flight holds nothing either: a claim
            // in flight has its tokens in `held`.
            return;
        }
        let tokens = std::mem::take(&mut self.held);
        let consumer = self.consumer.clone();
        let locks = self.locks.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                tracing::debug!(%consumer, tokens = tokens.len(), "select cancelled; releasing its locks");
                runtime.spawn(async move {
                    // A claim in flight may still commit: release after it ended.
                    if let Some(call) = in_flight {
                        let _ = call.await;
                    }
                    give_back(locks, consumer, tokens, "cancelled").await;
                });
            }
            Err(_) => tracing::warn!(
                %consumer,
                tokens = tokens.len(),
                "select dropped outside a tokio runtime; its locks are left to the lease sweep"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use holdfast_domain::{Candidate, ClaimVerdict, Precision, Quantity, TokenId, TxId};

    use super::Offered;

    fn token(n: u32) -> TokenId {
        TokenId::new(TxId::new("funding").expect("tx"), n)
    }

    fn read(tokens: &[u32]) -> Offered {
        let mut offered = Offered::default();
        let page: Vec<Candidate> = tokens
            .iter()
            .map(|&n| Candidate {
                id: token(n),
                quantity: Quantity::new(10, Precision::MAX).expect("amount"),
            })
            .collect();
        offered.read(&page);
        offered
    }

    #[test]
    fn free_tokens_not_kept_are_handed_on() {
        // Read two, kept one: the other may do for the next waiter.
        assert!(read(&[1, 2]).left_over(&[token(1)]));
        // Kept everything, or read nothing: nothing to hand on.
        assert!(!read(&[1, 2]).left_over(&[token(1), token(2)]));
        assert!(!read(&[]).left_over(&[]));
    }

    #[test]
    fn tokens_lost_to_others_are_not_handed_on() {
        // The one token read was taken by another caller before the claim (the
        // serial lineage): waking the next waiter for it would start a race for
        // a token that is gone.
        let mut offered = read(&[1]);
        offered.claimed(&[(token(1), ClaimVerdict::Contended)]);
        assert!(!offered.left_over(&[]));
        let mut offered = read(&[1, 2, 3]);
        offered.claimed(&[
            (token(1), ClaimVerdict::Won),
            (token(2), ClaimVerdict::Stale),
        ]);
        assert!(offered.left_over(&[token(1)]), "token 3 is still free");
        offered.claimed(&[(token(3), ClaimVerdict::Contended)]);
        assert!(!offered.left_over(&[token(1)]));
    }
}
