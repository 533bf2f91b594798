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
mod pass;
mod races;
mod snapshot;
mod waking;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast_domain::lease::{DEFAULT_LEASE_EXPIRY, after_locks_lost, needs_renewal};
use holdfast_domain::{
    Quantity, SelectRequest, Selected, Selection, SelectionConfig, SelectionConfigError,
    SelectionStats, Timestamp, TokenId, TokenType, TxId, WalletId,
};
use holdfast_ports::{
    Clock, LockStore, ReadWithClaim, Stores, Subscription, TokenStore, WakeKey, WakeUps,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tracing::Instrument;

use crate::metrics::{self as m, SelectOutcomeLabel};
use calls::{HeldGuard, give_back, release, renew};

// Why a select call failed: the domain's error, which the engine answers and the
// selector completes (a deadline, a refused input, a handle shutting down).
pub use holdfast_domain::SelectError;

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
    /// Recent reads of hot wallets (`snapshot.rs`).
    snapshots: snapshot::Snapshots,
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
            snapshots: snapshot::Snapshots::new(config.snapshot_ttl),
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
                    Some(answer) => answer,
                    None => SelectError::DeadlineExceeded { deadline_ms },
                };
                tracing::debug!(
                    parent: &span,
                    deadline_ms,
                    outcome = SelectOutcomeLabel::from(&result).as_str(),
                    "the select's deadline passed; giving back what it holds"
                );
                (Err(result), progress.stats())
            }
        };
        let elapsed = started.elapsed();
        let label = match &result {
            Ok(_) => SelectOutcomeLabel::Success,
            Err(e) => SelectOutcomeLabel::from(e),
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

    /// Re-checks and re-stamps the locks of a pass's selection at `now`; returns
    /// the tokens no longer held (every token when the store cannot tell).
    async fn renew_locks(
        &self,
        request: &SelectRequest,
        selected: &Selected,
        now: Timestamp,
        guard: &mut HeldGuard,
        progress: &mut Progress,
    ) -> Vec<TokenId> {
        progress.total.renewals += 1;
        let call = renew(
            self.locks.clone(),
            request.consumer.clone(),
            selected.tokens.clone(),
            now,
        );
        match guard.perform(call).await {
            Ok(held) => selected
                .tokens
                .iter()
                .filter(|t| !held.contains(t))
                .cloned()
                .collect(),
            // Unknown: treat every token as possibly lost.
            Err(_) => selected.tokens.clone(),
        }
    }

    /// Gives everything of a pass back after the lease sweep took `lost` of its
    /// locks (the lost tokens' selections too), so the next pass selects again
    /// from a fresh read.
    async fn give_back_pass(
        &self,
        request: &SelectRequest,
        selected: &Selected,
        lost: &[TokenId],
        pass: u32,
        guard: &mut HeldGuard,
        progress: &mut Progress,
    ) {
        let count = u64::try_from(lost.len()).unwrap_or(u64::MAX);
        progress.total.locks_lost += count;
        metrics::counter!(m::SELECT_LOCKS_LOST).increment(count);
        tracing::warn!(
            lost = lost.len(),
            pass,
            "the lease sweep took locks of this select; selecting again"
        );
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
    }

    /// The call's subscription, taken before the first read so that a release
    /// between a read and the wait that follows it is not missed; never woken by
    /// its own releases. Timer-only when wake-ups are off.
    fn subscribe(&self, request: &SelectRequest) -> Subscription {
        if !self.config.wakeups {
            return Subscription::timer_only();
        }
        self.wake.subscribe(
            WakeKey::tokens(&request.wallet, &request.token_type),
            Some(request.consumer.clone()),
        )
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
        let mut waiter = self.subscribe(request);
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
                break outcome;
            };
            let now = self.clock.now();
            if stats.claims == 0 || !needs_renewal(started, now, self.lease) {
                break Ok(selected);
            }
            // Half the lease has passed since this pass's first claim could have
            // been made: re-check (and re-stamp) every lock before answering.
            let lost = (self.renew_locks(request, &selected, now, &mut guard, progress)).await;
            if lost.is_empty() {
                break Ok(selected);
            }
            self.give_back_pass(request, &selected, &lost, pass, &mut guard, progress)
                .await;
            if let Err(failure) = after_locks_lost(pass, self.config.max_retries) {
                break Err(failure);
            }
        };
        guard.held.clear();
        (outcome, std::mem::take(&mut progress.total))
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
    answer: Option<SelectError>,
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
