//! The token selection engine (`docs/selection.md`), sans-IO.
//!
//! A [`Selection`] is one Select call across all its legs. The caller drives it:
//! it returns an [`Action`] (fetch a page of candidates, claim a window of tokens,
//! read the balance, release tokens, back off, or done) and the caller performs it
//! and feeds the result back through the matching `on_*` method, which returns the
//! next action. The engine performs no I/O, reads no clock and takes its randomness
//! from the caller's RNG, so a seeded RNG replays a call exactly.
//!
//! # How a call proceeds
//!
//! - **Read** (`cover_first`, the default). With R the amount still to cover, one
//!   fetch asks for [`Bands`]: a cover band of up to `cover_band` candidates >= R,
//!   ascending, and a fill band of up to `page_size` candidates < R, largest
//!   first (none for R = 1). Further fill pages (keyset, descending) only when no
//!   cover candidate is left and the fill read cannot cover R.
//! - **Choice** (`cover_first`): exact (opt-in), single cover, fill, dust
//!   (opt-in); see `cover.rs` and `docs/selection.md`. After a loss the next pick
//!   comes from what was read; a read used up is read again (a rescan).
//! - **Scan** (`smallest_first`, the upstream order). Candidates arrive in
//!   ascending pages (keyset cursor: `after` is the last candidate of the previous
//!   page; a page shorter than asked ends the scan). Runs of equal amounts are
//!   shuffled, also when split across pages ([`MAX_SHUFFLE_BUCKET`] bounds how
//!   much is held back), unless what is at hand already covers the amount: then
//!   no page more is read before the claim.
//! - **Window** (`smallest_first`). Small tokens are accumulated smallest first;
//!   the first token that covers the rest is the anchor, and one member of its
//!   sufficiency window is picked at random (see [`crate::window`]). The claim
//!   names that minimal covering prefix, at most `batch_window` tokens.
//! - **Verdicts.** Won: kept, and the leg's immediate-retry count resets. Stale:
//!   blacklisted, not contention, and the next fetch asks for a refresh. Contended:
//!   blacklisted and counted as contention. The next pick comes from what was
//!   read, unless the read is used up: a stale verdict, or claims from it that
//!   lost most of what they proposed (two tokens or more), start a new scan. A
//!   store error blacklists nothing, costs one immediate retry, and the window's
//!   tokens count as possibly held.
//! - **End of a scan.** When candidates run out, the balance available to the
//!   consumer (other transactions' locks ignored; tokens the consumer selected in
//!   earlier selects left out, this call's wins counted) is compared with the
//!   *full* amount, at most once per leg, contention or not: below it is
//!   [`SelectError::InsufficientFunds`]. With `wakeups` on, a scan that found
//!   nothing free at all ends the leg (but the last) at once: a release will say
//!   when to look again. Otherwise a new scan starts, costing one immediate retry; under `smallest_first` a scan that met only blacklisted
//!   tokens clears the blacklist first; under `cover_first` so does a scan whose
//!   clean candidates could not make a claim.
//! - **End of a leg.** When a leg's immediate retries are used up, its wins (and
//!   possibly held tokens) are released, the engine backs off a random time in
//!   `[0, retry_interval)` and starts a new leg from a fresh fetch, up to
//!   `max_retries` legs; then [`SelectError::FundsLocked`]. A wake-up
//!   during the wait ([`Selection::on_woken`]) starts an attempt within the same
//!   leg; a failed attempt goes back to the rest of the same wait. A wait that
//!   ended on its timer while others ahead in line were woken
//!   ([`Selection::on_backoff_passed_over`]) starts the next leg with a wait, in
//!   the first third of the legs. Funds locked by other consumers are invisible
//!   (the anti-join hides them): they show as a scan that runs out while the
//!   balance says enough, which costs a retry like any rescan and so leads to
//!   backoff, never to a store failure.
//! - **Store-bound legs.** A leg whose retry budget was spent on store errors ends
//!   the call with [`SelectError::Store`] instead of backing off, so an outage
//!   is never reported as locked funds. The rule: the event that found the budget
//!   used up was a store error, *and* store errors are a strict majority of the
//!   retry-charging events since the leg's budget was last reset (by a win),
//!   counting that last event. A rescan counts as a store error when its scan met
//!   one (the scan may have run out only because a page or claim failed). A
//!   persistent outage therefore fails after one leg, also when only claims fail
//!   between successful fetches; a transient error among the rescans of a locked
//!   wallet does not cut the stubborn legs short.
//! - **Failure** releases everything this call holds before `Done(Err)`, so a
//!   failed call leaves nothing held (unless a release itself failed: see
//!   [`Selection::held`]).
//! - **Deadline.** The engine reads no clock; its driver stops a call that
//!   outlives [`SelectionConfig::deadline`] wherever it waits, answers as
//!   [`Selection::answer_if_stopped`] says (`FundsLocked` once a scan ran out
//!   while the balance covered the amount) and gives back [`Selection::held`].
//!
//! # Unexpected input
//!
//! No sequence of calls panics. An answer to a question that was not asked (a
//! claim answer while a fetch is pending, anything after `Done`) is ignored and the
//! pending action is returned again; any answer before [`Selection::start`] starts
//! the call. In a claim answer, a verdict for a token that was not proposed is
//! ignored; a proposed token with no verdict, or with contradictory verdicts, is
//! treated as a store error for that token (possibly held, not blacklisted).

mod config;
mod cover;
mod pages;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use rand::Rng;

use crate::blacklist::{Blacklist, BlacklistReason};
use crate::error_kind::ErrorKind;
use crate::fault::{FaultKind, StoreFault};
use crate::ids::{TokenId, TokenType, TxId, WalletId};
use crate::quantity::{Precision, Quantity};
use crate::token::{Candidate, ClaimVerdict};
use crate::window::{self, WindowLimits, WindowPlan};

pub use config::{
    MAX_BATCH_WINDOW, MAX_CONSOLIDATE_DUST, MAX_COVER_BAND, MAX_DEADLINE, MAX_IMMEDIATE_RETRIES,
    MAX_INPUTS, MAX_LEGS, MAX_PAGE_SIZE, MAX_RETRY_INTERVAL, MAX_SUFFICIENCY_WINDOW, MIN_DEADLINE,
    SelectionConfig, SelectionConfigError, SelectionPolicy, UnknownPolicy,
};
pub use pages::MAX_SHUFFLE_BUCKET;

use cover::{CoverLimits, CoverPlan, Exact, Fill};
use pages::Scan;

/// What to select: an amount of one token type from one wallet, for one consumer
/// transaction (the lock holder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectRequest {
    /// The wallet to select from.
    pub wallet: WalletId,
    /// The token type.
    pub token_type: TokenType,
    /// The amount to cover (at least 1).
    pub amount: Quantity,
    /// The transaction that will hold the locks.
    pub consumer: TxId,
}

/// Why a [`Selection`] could not be created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectionError {
    /// The configuration is out of range.
    #[error(transparent)]
    Config(#[from] SelectionConfigError),
    /// The requested amount was zero.
    #[error("invalid selection amount 0: expected at least 1")]
    ZeroAmount,
}

/// One page of candidates to read from the token store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchRequest {
    /// Keyset cursor. Without [`bands`](FetchRequest::bands): candidates strictly
    /// after this one, in ascending `(quantity, tx, index)` order; `None` starts
    /// from the smallest. With bands: fill candidates strictly before this one,
    /// descending.
    pub after: Option<Candidate>,
    /// At most this many candidates (with bands: fill candidates); a shorter page
    /// means there are no more.
    pub limit: usize,
    /// `cover_first`: read the cover and fill bands around a threshold instead of
    /// an ascending page.
    pub bands: Option<Bands>,
    /// Bypass any candidate cache (a stale token was found, or a new leg starts).
    pub refresh: bool,
}

/// A `cover_first` read (`docs/selection.md`, "Read"): up to `cover` candidates
/// with amount >= `threshold`, ascending, and up to the fetch's `limit` candidates
/// with amount < `threshold`, descending (strictly before the fetch's `after` when
/// it is set), in one round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bands {
    /// The amount still to cover when the read was planned.
    pub threshold: Quantity,
    /// How many cover candidates to read (0 on a further fill page).
    pub cover: usize,
    /// When set, the store may leave the fill band unread if the smallest
    /// cover candidate is at most this amount: a single cover is then chosen
    /// (`max_sufficiency_ratio` times the threshold; set only when neither
    /// `prefer_exact` nor `consolidate_dust` looks at the fill band, and the
    /// call has lost no race). If that single cover cannot be chosen after all,
    /// the engine's next read asks for both bands.
    pub fill_unless_cover_at_most: Option<Quantity>,
}

impl Bands {
    /// The answer to this read from a wallet whose candidates (locked tokens
    /// already left out) are `ascending` in `(quantity, id)` order: the cover band,
    /// then up to `limit` fill candidates strictly before `before`. A further fill
    /// page (`before` set) reads no cover band. The reference for stores that hold
    /// a wallet in memory.
    pub fn answer(
        &self,
        ascending: &[Candidate],
        before: Option<&Candidate>,
        limit: usize,
    ) -> Vec<Candidate> {
        let key = |c: &Candidate| (c.quantity, c.id.clone());
        let cover = if before.is_some() { 0 } else { self.cover };
        let mut out: Vec<Candidate> = ascending
            .iter()
            .filter(|c| c.quantity >= self.threshold)
            .take(cover)
            .cloned()
            .collect();
        if self.skips_fill(out.first()) {
            return out;
        }
        out.extend(
            ascending
                .iter()
                .rev()
                .filter(|c| c.quantity < self.threshold)
                .filter(|c| before.is_none_or(|b| key(c) < key(b)))
                .take(limit)
                .cloned(),
        );
        out
    }

    /// Whether a store may leave the fill band unread, the smallest cover
    /// candidate it read being `smallest_cover`
    /// ([`Bands::fill_unless_cover_at_most`]).
    pub fn skips_fill(&self, smallest_cover: Option<&Candidate>) -> bool {
        match (self.fill_unless_cover_at_most, smallest_cover) {
            (Some(at_most), Some(cover)) => cover.quantity <= at_most,
            _ => false,
        }
    }
}

/// What the caller must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Read one page of candidates (spendable, unlocked: the anti-join), then call
    /// [`Selection::on_candidates`].
    Fetch(FetchRequest),
    /// Claim these tokens (1 to 256) for the consumer in one round trip, then call
    /// [`Selection::on_claim`] with a verdict per token.
    Claim(Vec<TokenId>),
    /// Read the wallet's spendable balance available to the consumer: other
    /// transactions' locks ignored, the consumer's own selected tokens left out
    /// (this call's wins included: the engine adds them back). Then call
    /// [`Selection::on_balance`].
    CheckBalance,
    /// Release these tokens' locks held by the consumer (only these: never the
    /// consumer's other locks), then call [`Selection::on_released`].
    Release(Vec<TokenId>),
    /// Wait this long (or be cancelled: then release [`Selection::held`]), then call
    /// [`Selection::on_backoff_elapsed`] (or [`Selection::on_backoff_passed_over`]
    /// if signals woke callers ahead of this one meanwhile); or, woken earlier by
    /// a signal that tokens may be free, call [`Selection::on_woken`] with the
    /// time waited.
    Backoff(Duration),
    /// The call is over. Further calls return this again.
    Done(Result<Selected, SelectError>),
}

/// A successful selection: the tokens now locked for the consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// The locked tokens, in the order they were won.
    pub tokens: Vec<TokenId>,
    /// Their total amount (at least the requested amount).
    pub total: Quantity,
    /// `total - amount`.
    pub change: Quantity,
}

/// Why a select call failed. Callers tell "retry later" ([`SelectError::FundsLocked`])
/// from "not enough money" ([`SelectError::InsufficientFunds`]).
///
/// One type for the engine and the services that drive it. The engine itself
/// answers ([`Action::Done`], [`Selection::answer_if_stopped`]) with
/// [`InsufficientFunds`](SelectError::InsufficientFunds),
/// [`FundsLocked`](SelectError::FundsLocked),
/// [`TooManyInputs`](SelectError::TooManyInputs) and
/// [`Store`](SelectError::Store) (the last [`StoreFault`] its driver fed it); the
/// services that drive it add [`DeadlineExceeded`](SelectError::DeadlineExceeded)
/// (the engine reads no clock), [`Input`](SelectError::Input) (a request refused
/// before a [`Selection`] exists) and [`ShuttingDown`](SelectError::ShuttingDown).
/// [`SelectError::kind`] says what a caller should do about each.
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
    /// The amount needs more than [`SelectionConfig::max_inputs`] of the tokens
    /// free now: the wallet holds it in too many small tokens. Pay less at once,
    /// or consolidate the wallet first; retrying unchanged does not help while
    /// the wallet is as it is.
    #[error(
        "too many inputs: {requested} needs more than {max_inputs} tokens of those free now (selection.max_inputs); pay a smaller amount, or consolidate the wallet"
    )]
    TooManyInputs {
        /// The full requested amount.
        requested: Quantity,
        /// The cap.
        max_inputs: usize,
    },
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
    /// The store failed (without contention) until the retry budget ran out
    /// (module docs, "Store-bound legs"): the last store fault, with its kind
    /// ([`StoreFault::kind`]: an unavailable database is not corrupt data).
    #[error("token store error: {0}")]
    Store(StoreFault),
    /// The request was refused before any I/O (an amount of zero).
    #[error(transparent)]
    Input(SelectionError),
    /// The handle is shutting down and takes no new work; retry on another
    /// replica. Never returned by the engine, nor by the token selector itself.
    #[error("shutting down: this handle takes no new selects; retry on another replica")]
    ShuttingDown,
}

impl SelectError {
    /// What kind of failure this is ([`ErrorKind`]): insufficient funds, funds
    /// locked, a deadline (timeout), the store fault's kind, invalid input, or
    /// shutting down.
    pub fn kind(&self) -> ErrorKind {
        match self {
            SelectError::InsufficientFunds { .. } => ErrorKind::InsufficientFunds,
            SelectError::FundsLocked => ErrorKind::FundsLocked,
            SelectError::TooManyInputs { .. } => ErrorKind::Conflict,
            SelectError::DeadlineExceeded { .. } => ErrorKind::Timeout,
            SelectError::Store(fault) => fault.kind().into(),
            SelectError::Input(_) => ErrorKind::InvalidInput,
            SelectError::ShuttingDown => ErrorKind::ShuttingDown,
        }
    }
}

/// Counters of one Select call, for metrics (`docs/metrics.md`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SelectionStats {
    /// Immediate retries (rescans and store errors), summed over all legs.
    pub immediate_retries: u64,
    /// Tokens named in claims (a window of n counts n).
    pub lock_attempts: u64,
    /// Contended verdicts (lost races).
    pub conflicts: u64,
    /// Stale verdicts.
    pub stale: u64,
    /// Lock store errors: tokens whose claim failed with a store error (a failed
    /// window claim counts every token it named, as [`lock_attempts`] does) or got
    /// no clear verdict. With [`conflicts`] and [`stale`] it partitions the failed
    /// attempts: each failed token attempt counts in exactly one of the three.
    ///
    /// [`lock_attempts`]: SelectionStats::lock_attempts
    /// [`conflicts`]: SelectionStats::conflicts
    /// [`stale`]: SelectionStats::stale
    pub store_errors: u64,
    /// Distinct tokens named in claims, over all legs.
    pub distinct_tokens_attempted: u64,
    /// Legs started.
    pub legs: u64,
    /// Candidate pages requested.
    pub fetches: u64,
    /// Claims requested.
    pub claims: u64,
    /// Balance reads requested.
    pub balance_checks: u64,
    /// Releases requested.
    pub releases: u64,
    /// Times the blacklist was cleared: the escape hatch, or a wake-up.
    pub blacklist_clears: u64,
    /// Store errors outside lock attempts: failed fetches, balance reads and
    /// releases (not counted in [`store_errors`](SelectionStats::store_errors)).
    pub other_store_errors: u64,
    /// Lock renewals: a select that outlived half the lease re-checks (and
    /// re-stamps) its locks before answering, one round trip each.
    pub renewals: u64,
    /// Locks such a renewal found taken by the lease sweep; the select then gave
    /// its tokens back and selected again.
    pub locks_lost: u64,
    /// Waits asked for ([`Action::Backoff`]): a leg's first wait, and the rest of
    /// it after each woken attempt.
    pub waits: u64,
    /// Waits a wake-up signal ended before their deadline
    /// ([`Selection::on_woken`]); the others ended on their timers.
    pub wakeups: u64,
    /// Legs that began with a wait instead of a read: the previous wait ended on
    /// its timer while signals woke callers ahead of this one
    /// ([`Selection::on_backoff_passed_over`]).
    pub passed_over: u64,
    /// Claims made in the round trip of the read they chose from (a store that
    /// reads and claims in one transaction): each counts in [`fetches`] and
    /// [`claims`] but is one round trip.
    ///
    /// [`fetches`]: SelectionStats::fetches
    /// [`claims`]: SelectionStats::claims
    pub claims_with_read: u64,
    /// Reads answered from the instance's snapshot of a hot wallet instead of
    /// the store (`docs/selection.md`, "A snapshot of a hot wallet"): each
    /// counts in [`fetches`](SelectionStats::fetches) but is no round trip.
    pub reads_from_snapshot: u64,
}

impl SelectionStats {
    /// Whether the call has waited or lost a race (a contended or stale verdict):
    /// a fact of [`crate::read_plan::ReadFacts`].
    pub fn waited_or_lost(&self) -> bool {
        self.waits > 0 || self.conflicts > 0 || self.stale > 0
    }

    /// Adds the counters of a later pass of the same select call (after locks were
    /// lost to the lease sweep). Distinct tokens are summed over the passes.
    pub fn absorb(&mut self, later: &SelectionStats) {
        let SelectionStats {
            immediate_retries,
            lock_attempts,
            conflicts,
            stale,
            store_errors,
            distinct_tokens_attempted,
            legs,
            fetches,
            claims,
            balance_checks,
            releases,
            blacklist_clears,
            other_store_errors,
            renewals,
            locks_lost,
            waits,
            wakeups,
            passed_over,
            claims_with_read,
            reads_from_snapshot,
        } = later;
        self.immediate_retries += immediate_retries;
        self.lock_attempts += lock_attempts;
        self.conflicts += conflicts;
        self.stale += stale;
        self.store_errors += store_errors;
        self.distinct_tokens_attempted += distinct_tokens_attempted;
        self.legs += legs;
        self.fetches += fetches;
        self.claims += claims;
        self.balance_checks += balance_checks;
        self.releases += releases;
        self.blacklist_clears += blacklist_clears;
        self.other_store_errors += other_store_errors;
        self.renewals += renewals;
        self.locks_lost += locks_lost;
        self.waits += waits;
        self.wakeups += wakeups;
        self.passed_over += passed_over;
        self.claims_with_read += claims_with_read;
        self.reads_from_snapshot += reads_from_snapshot;
    }

    /// Store round trips requested: fetches, claims, balance reads, releases and
    /// renewals, less the claims made with their read and the reads answered
    /// from a snapshot.
    pub fn round_trips(&self) -> u64 {
        (self.fetches + self.claims + self.balance_checks + self.releases + self.renewals)
            .saturating_sub(self.claims_with_read + self.reads_from_snapshot)
    }
}

/// What to do once a release answers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AfterRelease {
    Backoff,
    Fail(SelectError),
    Succeed(Selected),
}

/// Where the call stands: which answer it waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    NotStarted,
    Fetching(FetchRequest),
    Claiming(Vec<Candidate>),
    CheckingBalance,
    Releasing {
        tokens: Vec<TokenId>,
        then: AfterRelease,
    },
    BackingOff(Duration),
    Done(Result<Selected, SelectError>),
}

/// One Select call across all its legs: a state machine the caller drives (see the
/// [module documentation](self)).
#[derive(Debug, Clone)]
pub struct Selection {
    request: SelectRequest,
    config: SelectionConfig,
    phase: Phase,
    stats: SelectionStats,
    attempted: HashSet<TokenId>,
    blacklist: Blacklist,
    /// Callers of the wallet and type the instance sees, this one included
    /// ([`Selection::note_callers`]).
    callers: usize,
    /// Whether a read can go stale before its claim lands, so that callers
    /// should spread ([`Selection::note_reads_race_claims`]).
    reads_race_claims: bool,
    /// Stale was seen: the next fetch asks for a refresh.
    refresh_pending: bool,
    /// Tokens that may be held after a failed release; retried on every release.
    unreleased: BTreeSet<TokenId>,
    /// A scan ran out of free tokens (without a store error) while the balance
    /// available to the transaction covered the full amount: other transactions
    /// hold what it needs ([`Selection::answer_if_stopped`]).
    locked_out: bool,
    leg: Leg,
    scan: Scan,
}

/// Per-leg state.
#[derive(Debug, Clone, Default)]
struct Leg {
    number: u32,
    won: Vec<Candidate>,
    won_ids: HashSet<TokenId>,
    sum: Quantity,
    /// Tokens whose claim errored or went unanswered: possibly held.
    maybe_held: BTreeSet<TokenId>,
    /// Retries charged since the budget was last reset (by a win).
    immediate_retries: u32,
    /// Of those, the ones charged for a store error.
    store_retries: u32,
    /// The fast-fail balance check already ran in this leg.
    balance_checked: bool,
    /// In an attempt after a wake-up: the rest of the leg's wait, which a failed
    /// attempt goes back to (it does not spend a leg).
    rest: Option<Duration>,
    /// A store error happened since the last charged retry (the next charge, or
    /// the failure to charge, is for it).
    store_error_pending: bool,
    last_store_error: Option<StoreFault>,
}

impl Selection {
    /// A call for `request` with `config`; nothing happens until [`Selection::start`].
    pub fn new(request: SelectRequest, config: SelectionConfig) -> Result<Self, SelectionError> {
        config.validate()?;
        if request.amount.is_zero() {
            return Err(SelectionError::ZeroAmount);
        }
        Ok(Selection {
            request,
            config,
            phase: Phase::NotStarted,
            stats: SelectionStats::default(),
            attempted: HashSet::new(),
            blacklist: Blacklist::new(),
            callers: 1,
            reads_race_claims: true,
            refresh_pending: false,
            unreleased: BTreeSet::new(),
            locked_out: false,
            leg: Leg::default(),
            scan: Scan::default(),
        })
    }

    /// The request this call serves.
    pub fn request(&self) -> &SelectRequest {
        &self.request
    }

    /// The configuration this call runs with.
    pub fn config(&self) -> &SelectionConfig {
        &self.config
    }

    /// The counters so far.
    pub fn stats(&self) -> &SelectionStats {
        &self.stats
    }

    /// The current leg, from 1 (0 before [`Selection::start`]).
    pub fn leg(&self) -> u32 {
        self.leg.number
    }

    /// The outcome, once the call is done.
    pub fn outcome(&self) -> Option<&Result<Selected, SelectError>> {
        match &self.phase {
            Phase::Done(result) => Some(result),
            _ => None,
        }
    }

    /// The tokens this call holds or may hold: those won in the current leg, those
    /// named in a claim or release still in flight, those whose claim errored, and
    /// those whose release failed. This is what the caller releases (by consumer
    /// *and* these tokens) when it abandons the call, for example when cancelled
    /// during a backoff. After success it is the selected tokens plus any whose
    /// release failed; after a failure, only those whose release failed.
    pub fn held(&self) -> Vec<TokenId> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut push = |id: &TokenId| {
            if seen.insert(id.clone()) {
                out.push(id.clone());
            }
        };
        self.leg.won.iter().for_each(|c| push(&c.id));
        match &self.phase {
            Phase::Claiming(window) => window.iter().for_each(|c| push(&c.id)),
            Phase::Releasing { tokens, .. } => tokens.iter().for_each(&mut push),
            _ => {}
        }
        self.leg.maybe_held.iter().for_each(&mut push);
        self.unreleased.iter().for_each(&mut push);
        out
    }

    /// What the call answers if its driver stops it before it is done (its
    /// deadline passed, [`SelectionConfig::deadline`]): the failure it is already
    /// ending with (releasing what it holds first); else
    /// [`SelectError::FundsLocked`] once it has seen the funds held by others:
    /// a scan ran out of free tokens, without a store error, while the balance
    /// available to the transaction covered the full amount. Else `None`: it
    /// cannot tell locked funds from a slow store, and the driver says that the
    /// deadline passed. Whatever the answer, the driver gives back
    /// [`Selection::held`].
    pub fn answer_if_stopped(&self) -> Option<SelectError> {
        match &self.phase {
            Phase::Done(Err(failure))
            | Phase::Releasing {
                then: AfterRelease::Fail(failure),
                ..
            } => Some(failure.clone()),
            _ if self.locked_out => Some(SelectError::FundsLocked),
            _ => None,
        }
    }

    /// Notes how many callers of the wallet and type the instance sees now, this
    /// one included (its driver asks the wake-up registry). Under `cover_first`
    /// the next reads ask for a cover band, and choose from a sufficiency window,
    /// that widen with them, so concurrent callers land on different tokens
    /// instead of all on the few smallest covers.
    pub fn note_callers(&mut self, callers: usize) {
        self.callers = callers.max(1);
    }

    /// Notes whether this call's reads can race other callers' claims (true
    /// unless told otherwise). A store that reads and claims every time in one
    /// serialized transaction (SQLite) loses no race, so the cover band and the
    /// sufficiency window stay as configured however many callers there are:
    /// widening them would only make each read longer.
    pub fn note_reads_race_claims(&mut self, race: bool) {
        self.reads_race_claims = race;
    }

    /// The callers the reads and the window widen for
    /// ([`Selection::note_reads_race_claims`]).
    fn spread_callers(&self) -> usize {
        if self.reads_race_claims {
            self.callers
        } else {
            1
        }
    }

    /// Starts the call: the first action is always a fetch. Calling it again
    /// returns the pending action.
    pub fn start(&mut self, _rng: &mut impl Rng) -> Action {
        if self.phase != Phase::NotStarted {
            return self.pending();
        }
        self.begin_leg(false)
    }

    /// Feeds the answer to [`Action::Fetch`].
    pub fn on_candidates(
        &mut self,
        page: Result<Vec<Candidate>, StoreFault>,
        rng: &mut impl Rng,
    ) -> Action {
        let request = match &self.phase {
            Phase::Fetching(request) => request.clone(),
            Phase::NotStarted => return self.start(rng),
            _ => return self.pending(),
        };
        match page {
            Err(failure) => {
                self.stats.other_store_errors += 1;
                self.record_store_error(failure);
                if !self.charge_retry() {
                    return self.end_leg(rng);
                }
                self.stats.fetches += 1;
                self.pending()
            }
            Ok(page) => {
                match request.bands {
                    Some(bands) => {
                        self.scan
                            .ingest_bands(page, bands, request.limit, &self.leg.won_ids, rng);
                    }
                    None => self.scan.ingest(
                        page,
                        request.limit,
                        self.config.ascending,
                        self.remaining(),
                        &self.leg.won_ids,
                        rng,
                    ),
                }
                self.advance(rng)
            }
        }
    }

    /// Feeds the answer to [`Action::Claim`]: a verdict per proposed token.
    pub fn on_claim(
        &mut self,
        verdicts: Result<Vec<(TokenId, ClaimVerdict)>, StoreFault>,
        rng: &mut impl Rng,
    ) -> Action {
        let window = match &self.phase {
            Phase::Claiming(window) => window.clone(),
            Phase::NotStarted => return self.start(rng),
            _ => return self.pending(),
        };
        let verdicts = match verdicts {
            Ok(verdicts) => verdicts,
            Err(failure) => {
                self.stats.store_errors += u64::try_from(window.len()).unwrap_or(u64::MAX);
                self.leg.maybe_held.extend(window.into_iter().map(|c| c.id));
                self.record_store_error(failure);
                if !self.charge_retry() {
                    return self.end_leg(rng);
                }
                return self.advance(rng);
            }
        };
        let answers = collate(&window, verdicts);
        let mut unanswered = 0usize;
        let (mut lost, mut stale) = (0usize, 0usize);
        for candidate in window.iter() {
            match answers.get(&candidate.id).copied().flatten() {
                Some(ClaimVerdict::Won) => self.win(candidate),
                Some(ClaimVerdict::Stale) => {
                    stale += 1;
                    lost += 1;
                    self.stats.stale += 1;
                    self.refresh_pending = true;
                    self.blacklist_token(&candidate.id, BlacklistReason::Stale);
                }
                Some(ClaimVerdict::Contended) => {
                    lost += 1;
                    self.stats.conflicts += 1;
                    self.scan.contention = true;
                    self.blacklist_token(&candidate.id, BlacklistReason::Contended);
                }
                None => {
                    unanswered += 1;
                    self.leg.maybe_held.insert(candidate.id.clone());
                }
            }
        }
        if unanswered > 0 {
            self.stats.store_errors += u64::try_from(unanswered).unwrap_or(u64::MAX);
            self.record_store_error(StoreFault::new(
                FaultKind::Backend,
                format!(
                    "claim answer had no clear verdict for {unanswered} of {} proposed tokens",
                    window.len()
                ),
            ));
            if !self.charge_retry() {
                return self.end_leg(rng);
            }
        }
        // After losses the next pick comes from what was read, until the read is
        // used up: a stale token (spent or withdrawn since the read) says it is
        // out of date, and so do claims that lost most of what they proposed
        // from it (two or more tokens). What is left of such a read is likely
        // taken too: read afresh instead of picking from it.
        self.scan.proposed += window.len();
        self.scan.lost += lost;
        if self.scan.from_snapshot && lost > 0 && self.remaining() > Quantity::ZERO {
            return self.read_store();
        }
        let used_up = stale > 0 || (self.scan.lost >= 2 && self.scan.lost * 2 > self.scan.proposed);
        if used_up && self.remaining() > Quantity::ZERO {
            return self.rescan(rng);
        }
        self.advance(rng)
    }

    /// Feeds the answer to [`Action::CheckBalance`]: the balance available to the
    /// consumer, without its own selections. This call's wins are added back; while
    /// a claim's outcome is unknown or a release failed, the call cannot tell what
    /// it holds, so it never fails fast then (it rescans instead).
    pub fn on_balance(
        &mut self,
        balance: Result<Quantity, StoreFault>,
        rng: &mut impl Rng,
    ) -> Action {
        match &self.phase {
            Phase::CheckingBalance => {}
            Phase::NotStarted => return self.start(rng),
            _ => return self.pending(),
        }
        match balance {
            Err(failure) => {
                self.stats.other_store_errors += 1;
                self.record_store_error(failure);
                if !self.charge_retry() {
                    return self.end_leg(rng);
                }
                self.stats.balance_checks += 1;
                Action::CheckBalance
            }
            Ok(others) => {
                let certain = self.leg.maybe_held.is_empty() && self.unreleased.is_empty();
                match others.checked_add(self.leg.sum) {
                    Some(available) if certain && available < self.request.amount => {
                        self.fail(SelectError::InsufficientFunds {
                            available,
                            requested: self.request.amount,
                        })
                    }
                    _ if self.scan.over_cap => self.over_cap(),
                    available => {
                        // The money is there (an overflow is more than any amount)
                        // but the scan found it taken: held by others.
                        let enough = available.is_none_or(|a| a >= self.request.amount);
                        self.locked_out |=
                            enough && !self.scan.store_error && !self.scan.from_snapshot;
                        self.rescan(rng)
                    }
                }
            }
        }
    }

    /// Feeds the answer to [`Action::Release`]. A failed release counts in
    /// [`SelectionStats::other_store_errors`] (it costs no retry); its tokens stay in [`Selection::held`] and are
    /// named again by the next release.
    pub fn on_released(&mut self, result: Result<(), StoreFault>, rng: &mut impl Rng) -> Action {
        let (tokens, then) = match &self.phase {
            Phase::Releasing { tokens, then } => (tokens.clone(), then.clone()),
            Phase::NotStarted => return self.start(rng),
            _ => return self.pending(),
        };
        match result {
            Ok(()) => {
                for token in &tokens {
                    self.unreleased.remove(token);
                }
            }
            Err(_) => {
                self.stats.other_store_errors += 1;
                self.unreleased.extend(tokens);
            }
        }
        match then {
            AfterRelease::Backoff => self.backoff(rng),
            AfterRelease::Fail(failure) => self.done(Err(failure)),
            AfterRelease::Succeed(selected) => self.done(Ok(selected)),
        }
    }

    /// Feeds a wake-up that ended [`Action::Backoff`] early, `waited` into it: an
    /// attempt within the same leg starts from a fresh fetch. It gets no rescans
    /// (a read that finds nothing to claim goes back to waiting) until it wins a
    /// lock, which gives it the leg's usual budget; if it fails, its wins are
    /// released and the engine asks to wait for the rest of the leg's wait
    /// (`delay - waited`), so wake-ups never make a call wait longer in all, nor
    /// spend its legs faster. The blacklist is forgotten first: the release that
    /// woke the call may be of a token it lost earlier, and the fresh read shows
    /// only tokens nobody holds.
    pub fn on_woken(&mut self, waited: Duration, rng: &mut impl Rng) -> Action {
        let delay = match &self.phase {
            Phase::BackingOff(delay) => *delay,
            Phase::NotStarted => return self.start(rng),
            _ => return self.pending(),
        };
        self.stats.wakeups += 1;
        if !self.blacklist.is_empty() {
            self.blacklist.clear();
            self.stats.blacklist_clears += 1;
        }
        self.leg = Leg {
            number: self.leg.number,
            immediate_retries: self.config.max_immediate_retries,
            balance_checked: self.leg.balance_checked,
            rest: Some(delay.saturating_sub(waited)),
            ..Leg::default()
        };
        self.new_scan();
        self.fetch(None, true)
    }

    /// Feeds the end of [`Action::Backoff`]: the next leg starts from a fresh fetch.
    pub fn on_backoff_elapsed(&mut self, rng: &mut impl Rng) -> Action {
        match &self.phase {
            Phase::BackingOff(_) => self.begin_leg(true),
            Phase::NotStarted => self.start(rng),
            _ => self.pending(),
        }
    }

    /// Feeds the end of [`Action::Backoff`] by its timer while, with wake-ups, the
    /// wait was passed over: signals of the wallet and type woke callers waiting
    /// ahead of this one, so what was freed went to them, and one that does not
    /// keep it hands it on in order. In the first third of its legs the call keeps
    /// its place in line: the leg is spent and the next one starts with its wait
    /// instead of a read that would race those callers for their tokens. Later
    /// legs read as after any timer: a caller of another instance is not in this
    /// instance's line, and one that has waited a third of its budget must not be
    /// starved by a line that another instance serves first (deferring for half
    /// the legs gave more spurious failures under a short budget).
    pub fn on_backoff_passed_over(&mut self, rng: &mut impl Rng) -> Action {
        match &self.phase {
            Phase::BackingOff(_) => {}
            Phase::NotStarted => return self.start(rng),
            _ => return self.pending(),
        }
        let next = self.leg.number.saturating_add(1);
        if !self.config.wakeups || next > self.config.max_retries / 3 {
            return self.begin_leg(true);
        }
        self.leg = Leg {
            number: self.leg.number.saturating_add(1),
            ..Leg::default()
        };
        self.stats.legs += 1;
        self.stats.passed_over += 1;
        self.backoff(rng)
    }

    /// Notes that the claim just answered ([`Selection::on_claim`]) was made in
    /// the round trip of the read it chose from.
    pub fn note_claim_with_read(&mut self) {
        self.stats.claims_with_read += 1;
    }

    /// Notes that the read about to be answered ([`Selection::on_candidates`])
    /// comes from the instance's snapshot of the wallet, not from the store. No
    /// answer rests on such a read alone: a race lost from it uses it up (the
    /// next read is the store's), and where it covers the amount only beyond
    /// `max_inputs` the call reads the store again instead of answering
    /// `TooManyInputs` (the snapshot may lack a cover added or freed since).
    pub fn note_read_from_snapshot(&mut self) {
        self.stats.reads_from_snapshot += 1;
        self.scan.from_snapshot = true;
    }

    /// Notes that the read asked for was made twice: its first answer was left
    /// unused and the read made again with the claim (one more round trip).
    pub fn note_read_again(&mut self) {
        self.stats.fetches += 1;
        // The answer used is the second one, a store's.
        self.scan.from_snapshot = false;
    }

    /// The action the call waits on, asked again.
    fn pending(&self) -> Action {
        match &self.phase {
            // Callers route NotStarted to `start`; a fetch is what start asks.
            Phase::NotStarted => Action::Fetch(FetchRequest {
                after: None,
                limit: self.config.page_size,
                refresh: false,
                bands: self.bands(None),
            }),
            Phase::Fetching(request) => Action::Fetch(request.clone()),
            Phase::Claiming(window) => Action::Claim(window.iter().map(|c| c.id.clone()).collect()),
            Phase::CheckingBalance => Action::CheckBalance,
            Phase::Releasing { tokens, .. } => Action::Release(tokens.clone()),
            Phase::BackingOff(delay) => Action::Backoff(*delay),
            Phase::Done(result) => Action::Done(result.clone()),
        }
    }

    /// The amount this leg's wins do not cover yet.
    fn remaining(&self) -> Quantity {
        self.request.amount.saturating_sub(self.leg.sum)
    }

    /// What a fetch continuing after `after` reads: bands under `cover_first`
    /// (the cover band only on a scan's first read), else an ascending page.
    fn bands(&self, after: Option<&Candidate>) -> Option<Bands> {
        match self.config.policy {
            SelectionPolicy::SmallestFirst => None,
            SelectionPolicy::CoverFirst => Some(match self.scan.threshold {
                // A further fill page.
                Some(threshold) if after.is_some() => Bands {
                    threshold,
                    cover: 0,
                    fill_unless_cover_at_most: None,
                },
                _ => {
                    let threshold = self.remaining();
                    // Only the single cover looks at the first read (not
                    // prefer_exact, not consolidate_dust), and no race has been
                    // lost yet (a cover lost now would cost another read).
                    let single_cover_only = !self.config.prefer_exact
                        && self.config.consolidate_dust == 0
                        && !self.tidies()
                        && self.blacklist.is_empty()
                        && !self.scan.read_fill;
                    let bound = threshold
                        .value()
                        .saturating_mul(u128::from(self.config.max_sufficiency_ratio));
                    Bands {
                        threshold,
                        cover: cover::spread_band(self.config.cover_band, self.spread_callers()),
                        fill_unless_cover_at_most: single_cover_only
                            .then(|| Quantity::new(bound, Precision::MAX).ok())
                            .flatten(),
                    }
                }
            }),
        }
    }

    fn begin_leg(&mut self, refresh: bool) -> Action {
        let number = self.leg.number.saturating_add(1);
        self.leg = Leg {
            number,
            ..Leg::default()
        };
        self.stats.legs += 1;
        self.new_scan();
        self.fetch(None, refresh)
    }

    fn new_scan(&mut self) {
        self.scan = Scan::default();
    }

    /// Whether a scan starting now tidies (`SelectionConfig::tidy_band`):
    /// `cover_first`, tidying on, and no other caller of the wallet and type in
    /// this instance, so its extra inputs cost nobody a race.
    fn tidies(&self) -> bool {
        self.config.policy == SelectionPolicy::CoverFirst
            && self.config.tidy_band > 0
            && self.callers <= 1
    }

    fn fetch(&mut self, after: Option<Candidate>, refresh: bool) -> Action {
        let bands = self.bands(after.as_ref());
        if after.is_none() {
            self.scan.tidy = self.tidies();
        }
        let mut limit = self.config.page_size;
        if self.scan.tidy {
            limit = limit.max(self.config.tidy_band);
        }
        if let Some(bands) = bands {
            self.scan.threshold = Some(bands.threshold);
            // Nothing but a zero amount lies below 1: no fill band to read.
            if bands.threshold.value() <= 1 {
                limit = 0;
            }
        }
        let request = FetchRequest {
            after,
            limit,
            refresh: refresh || std::mem::take(&mut self.refresh_pending),
            bands,
        };
        self.stats.fetches += 1;
        self.phase = Phase::Fetching(request.clone());
        Action::Fetch(request)
    }

    /// Decides the next step from the current leg and scan.
    fn advance(&mut self, rng: &mut impl Rng) -> Action {
        if let Some(change) = self.leg.sum.checked_sub(self.request.amount) {
            return self.succeed(change);
        }
        let remaining = self.remaining();
        self.drop_unusable();
        let quantities: Vec<Quantity> = self.scan.buffer.iter().map(|c| c.quantity).collect();
        let headroom = u128::MAX - self.leg.sum.value();
        let inputs_left = self.config.max_inputs.saturating_sub(self.leg.won.len());
        if inputs_left == 0 {
            return self.over_cap();
        }
        if self.config.policy == SelectionPolicy::CoverFirst {
            let limits = CoverLimits {
                batch_window: self.config.batch_window.min(MAX_BATCH_WINDOW),
                sufficiency_window: cover::spread_window(
                    self.config.sufficiency_window,
                    self.spread_callers(),
                ),
                max_sufficiency_ratio: self.config.max_sufficiency_ratio,
                exact: if self.scan.tidy {
                    Exact::MostInputs
                } else if self.config.prefer_exact {
                    Exact::FewestInputs
                } else {
                    Exact::Off
                },
                consolidate_dust: self.config.consolidate_dust,
                max_inputs: inputs_left,
            };
            // Further fill pages only while no more cover candidates may exist: a
            // full cover band that was all lost is read afresh instead.
            let fill = if self.scan.fill_unread {
                Fill::Unread
            } else if !self.scan.exhausted && !self.scan.more_cover {
                Fill::MorePages
            } else {
                Fill::Exhausted
            };
            return match cover::plan(&quantities, remaining, headroom, fill, limits, rng) {
                CoverPlan::Claim(chosen) => self.claim(&chosen),
                // The first read left the fill band unread and its single cover
                // could not be chosen: a new scan reads both bands in full.
                CoverPlan::MoreFill if self.scan.fill_unread => {
                    self.new_scan();
                    self.scan.read_fill = true;
                    self.fetch(None, false)
                }
                CoverPlan::MoreFill => {
                    let after = self.scan.cursor.clone();
                    self.fetch(after, false)
                }
                CoverPlan::Nothing => self.end_of_scan(rng),
                CoverPlan::OverCap => self.over_cap(),
            };
        }
        let limits = WindowLimits {
            batch_window: self.config.batch_window.min(MAX_BATCH_WINDOW),
            sufficiency_window: self.config.sufficiency_window,
            max_sufficiency_ratio: self.config.max_sufficiency_ratio,
        };
        let plan = window::plan(
            &quantities,
            remaining,
            headroom,
            self.scan.exhausted,
            limits,
        );
        match plan {
            WindowPlan::NeedMore => {
                let after = self.scan.cursor.clone();
                self.fetch(after, false)
            }
            plan if plan.is_empty() => self.end_of_scan(rng),
            WindowPlan::Ready {
                prefix,
                anchor_choices,
            } => {
                let mut chosen: Vec<usize> = (0..prefix).collect();
                match anchor_choices.len() {
                    0 => {}
                    1 => chosen.extend(anchor_choices.first().copied()),
                    n => chosen.extend(anchor_choices.get(rng.random_range(0..n)).copied()),
                }
                // The smallest tokens first: an amount held in many small ones
                // meets the cap sooner than under cover_first.
                if chosen.len() > inputs_left {
                    return self.over_cap();
                }
                self.claim(&chosen)
            }
        }
    }

    /// Removes from the buffer what must not be proposed: blacklisted tokens
    /// (noting contention) and tokens already won.
    fn drop_unusable(&mut self) {
        let blacklist = &self.blacklist;
        let won = &self.leg.won_ids;
        let scan = &mut self.scan;
        let mut contention = false;
        let mut clean = false;
        scan.buffer.retain(|c| {
            if won.contains(&c.id) {
                return false;
            }
            match blacklist.reason(&c.id) {
                Some(BlacklistReason::Contended) => {
                    contention = true;
                    false
                }
                Some(BlacklistReason::Stale) => false,
                None => {
                    clean = true;
                    true
                }
            }
        });
        scan.contention |= contention;
        scan.saw_clean |= clean;
    }

    /// Takes the buffer entries at `indices` out as the claim window (in that
    /// order), keeping the others in order.
    fn claim(&mut self, indices: &[usize]) -> Action {
        let taken: HashSet<usize> = indices.iter().copied().collect();
        let mut window = Vec::with_capacity(indices.len());
        for &i in indices {
            if let Some(c) = self.scan.buffer.get(i) {
                window.push(c.clone());
            }
        }
        let mut index = 0;
        self.scan.buffer.retain(|_| {
            let keep = !taken.contains(&index);
            index += 1;
            keep
        });
        self.scan.claimed = true;
        self.stats.claims += 1;
        self.stats.lock_attempts += u64::try_from(window.len()).unwrap_or(u64::MAX);
        for c in &window {
            if self.attempted.insert(c.id.clone()) {
                self.stats.distinct_tokens_attempted += 1;
            }
        }
        let ids = window.iter().map(|c| c.id.clone()).collect();
        self.phase = Phase::Claiming(window);
        Action::Claim(ids)
    }

    fn win(&mut self, candidate: &Candidate) {
        if self.leg.won_ids.contains(&candidate.id) {
            return;
        }
        let Some(sum) = self.leg.sum.checked_add(candidate.quantity) else {
            // Unreachable by the window's headroom; keep it as possibly held.
            self.leg.maybe_held.insert(candidate.id.clone());
            return;
        };
        self.leg.sum = sum;
        self.leg.won_ids.insert(candidate.id.clone());
        self.leg.won.push(candidate.clone());
        self.leg.maybe_held.remove(&candidate.id);
        self.leg.immediate_retries = 0;
        self.leg.store_retries = 0;
    }

    fn blacklist_token(&mut self, token: &TokenId, reason: BlacklistReason) {
        if self.config.blacklist {
            self.blacklist.insert(token.clone(), reason);
        }
    }

    /// Notes a store error (the caller counts it in the stats); the retry charged
    /// next is charged to it.
    fn record_store_error(&mut self, fault: StoreFault) {
        self.leg.store_error_pending = true;
        self.scan.store_error = true;
        self.leg.last_store_error = Some(fault);
    }

    /// Spends one immediate retry, for a store error if one was just recorded,
    /// else for a rescan; false when the leg's budget is used up (the event that
    /// asked stays pending for [`Selection::store_bound`]).
    fn charge_retry(&mut self) -> bool {
        if self.leg.immediate_retries >= self.config.max_immediate_retries {
            return false;
        }
        self.leg.immediate_retries += 1;
        if std::mem::take(&mut self.leg.store_error_pending) {
            self.leg.store_retries += 1;
        }
        self.stats.immediate_retries += 1;
        true
    }

    /// Whether the leg's budget was spent on store errors (module docs, "Store-bound
    /// legs"): the event that found it used up was a store error, and store errors
    /// are a strict majority of the charged events, that one included.
    fn store_bound(&self) -> bool {
        if !self.leg.store_error_pending {
            return false;
        }
        let events = u64::from(self.leg.immediate_retries) + 1;
        let store = u64::from(self.leg.store_retries) + 1;
        store * 2 > events
    }

    fn end_of_scan(&mut self, rng: &mut impl Rng) -> Action {
        // Whether or not the scan met contention: a wallet whose lock-ignoring
        // balance is short is short, however contended (once per leg).
        if !self.leg.balance_checked {
            return self.check_balance();
        }
        self.rescan(rng)
    }

    fn rescan(&mut self, rng: &mut impl Rng) -> Action {
        // The blacklist keeps a call away from the tokens it has fought for (the
        // hot ones) while others are free; it is cleared when it is all that
        // stands in the way: a scan that saw only blacklisted tokens (the upstream
        // escape hatch), or, under `cover_first`, a scan whose clean candidates
        // could not make a claim at all (they cannot cover the amount alone).
        let stuck = match self.config.policy {
            SelectionPolicy::CoverFirst => !self.scan.claimed,
            SelectionPolicy::SmallestFirst => false,
        };
        let clear = self.scan.saw_any && (!self.scan.saw_clean || stuck);
        if clear && !self.blacklist.is_empty() {
            self.blacklist.clear();
            self.stats.blacklist_clears += 1;
        }
        // A scan that met a store error may have run out because of it.
        self.leg.store_error_pending |= self.scan.store_error;
        // Nothing at all was free: with wake-ups, the next release says when to
        // look again, so rescanning now would only poll (not in the last leg,
        // which has no wait to go to).
        let nothing_free = !self.scan.saw_any && !self.scan.store_error;
        if self.config.wakeups && nothing_free && self.leg.number < self.config.max_retries {
            return self.end_leg(rng);
        }
        if !self.charge_retry() {
            return self.end_leg(rng);
        }
        self.new_scan();
        self.fetch(None, false)
    }

    fn end_leg(&mut self, rng: &mut impl Rng) -> Action {
        if self.store_bound() {
            let last = self.leg.last_store_error.clone().unwrap_or_else(|| {
                StoreFault::new(FaultKind::Backend, "no store error was recorded")
            });
            return self.fail(SelectError::Store(last));
        }
        if self.leg.number >= self.config.max_retries {
            return self.fail(SelectError::FundsLocked);
        }
        let tokens = self.take_all_held();
        if tokens.is_empty() {
            return self.backoff(rng);
        }
        self.release(tokens, AfterRelease::Backoff)
    }

    fn backoff(&mut self, rng: &mut impl Rng) -> Action {
        let nanos = u64::try_from(self.config.retry_interval.as_nanos()).unwrap_or(u64::MAX);
        let delay = match self.leg.rest {
            Some(rest) => rest,
            None if nanos == 0 => Duration::ZERO,
            None => Duration::from_nanos(rng.random_range(0..nanos)),
        };
        self.stats.waits += 1;
        self.phase = Phase::BackingOff(delay);
        Action::Backoff(delay)
    }

    /// Ends the call with `failure`, releasing everything held first.
    /// Asks for the leg's one balance check ([`Selection::on_balance`] answers).
    fn check_balance(&mut self) -> Action {
        self.leg.balance_checked = true;
        self.stats.balance_checks += 1;
        self.phase = Phase::CheckingBalance;
        Action::CheckBalance
    }

    /// The amount cannot be covered within `max_inputs` tokens of those read:
    /// TooManyInputs, unless the balance check (first, if this leg has not made
    /// it) says the wallet is short of the amount anyway.
    fn over_cap(&mut self) -> Action {
        if !self.leg.balance_checked {
            self.scan.over_cap = true;
            return self.check_balance();
        }
        if self.scan.from_snapshot {
            return self.read_store();
        }
        self.fail(SelectError::TooManyInputs {
            requested: self.request.amount,
            max_inputs: self.config.max_inputs,
        })
    }

    /// A scan from the instance's snapshot of the wallet cannot decide: read
    /// the store, at no cost to the leg's retries (it happens once a call at
    /// most: only a call's first read comes from a snapshot).
    fn read_store(&mut self) -> Action {
        self.new_scan();
        self.fetch(None, true)
    }

    fn fail(&mut self, failure: SelectError) -> Action {
        let tokens = self.take_all_held();
        if tokens.is_empty() {
            return self.done(Err(failure));
        }
        self.release(tokens, AfterRelease::Fail(failure))
    }

    /// Ends the call with the current leg's wins, first releasing any possibly
    /// held token that is not part of them.
    fn succeed(&mut self, change: Quantity) -> Action {
        let selected = Selected {
            tokens: self.leg.won.iter().map(|c| c.id.clone()).collect(),
            total: self.leg.sum,
            change,
        };
        let extra: Vec<TokenId> = std::mem::take(&mut self.leg.maybe_held)
            .into_iter()
            .chain(std::mem::take(&mut self.unreleased))
            .filter(|t| !self.leg.won_ids.contains(t))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if extra.is_empty() {
            return self.done(Ok(selected));
        }
        self.release(extra, AfterRelease::Succeed(selected))
    }

    /// Everything this leg holds or may hold, plus earlier failed releases; the leg
    /// forgets its wins (they are being released).
    fn take_all_held(&mut self) -> Vec<TokenId> {
        let mut tokens: Vec<TokenId> = self.leg.won.drain(..).map(|c| c.id).collect();
        self.leg.won_ids.clear();
        self.leg.sum = Quantity::ZERO;
        let won: HashSet<TokenId> = tokens.iter().cloned().collect();
        let rest: BTreeSet<TokenId> = std::mem::take(&mut self.leg.maybe_held)
            .into_iter()
            .chain(std::mem::take(&mut self.unreleased))
            .filter(|t| !won.contains(t))
            .collect();
        tokens.extend(rest);
        tokens
    }

    fn release(&mut self, tokens: Vec<TokenId>, then: AfterRelease) -> Action {
        self.stats.releases += 1;
        self.phase = Phase::Releasing {
            tokens: tokens.clone(),
            then,
        };
        Action::Release(tokens)
    }

    fn done(&mut self, result: Result<Selected, SelectError>) -> Action {
        self.phase = Phase::Done(result.clone());
        Action::Done(result)
    }
}

/// The verdict per proposed token: `Some(verdict)` when the answer is clear,
/// `None` when the store named it with contradictory verdicts. Verdicts for tokens
/// that were not proposed are ignored; a token absent from the map got no verdict.
fn collate(
    window: &[Candidate],
    verdicts: Vec<(TokenId, ClaimVerdict)>,
) -> HashMap<TokenId, Option<ClaimVerdict>> {
    let proposed: HashSet<&TokenId> = window.iter().map(|c| &c.id).collect();
    let mut answers: HashMap<TokenId, Option<ClaimVerdict>> = HashMap::new();
    for (token, verdict) in verdicts {
        if !proposed.contains(&token) {
            continue;
        }
        answers
            .entry(token)
            .and_modify(|seen| {
                if *seen != Some(verdict) {
                    *seen = None;
                }
            })
            .or_insert(Some(verdict));
    }
    answers
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    use super::*;

    fn q(v: u128) -> Quantity {
        Quantity::new(v, Precision::MAX).expect("quantity")
    }

    /// A call for `amount` with the default settings.
    fn call(amount: u128) -> Selection {
        call_with(amount, SelectionConfig::default())
    }

    fn call_with(amount: u128, config: SelectionConfig) -> Selection {
        let request = SelectRequest {
            wallet: WalletId::new("w").expect("wallet"),
            token_type: TokenType::new("CHF").expect("type"),
            amount: q(amount),
            consumer: TxId::new("t").expect("tx"),
        };
        Selection::new(request, config).expect("config")
    }

    /// Token `n` of one funding transaction, of `amount`.
    fn funded(n: u32, amount: u128) -> Candidate {
        Candidate {
            id: TokenId::new(TxId::new("funding").expect("tx"), n),
            quantity: q(amount),
        }
    }

    /// A call for 10 that has read a page with nothing free in it.
    fn ran_out(rng: &mut ChaCha8Rng, page: Result<Vec<Candidate>, StoreFault>) -> Selection {
        let mut s = call(10);
        assert!(matches!(s.start(rng), Action::Fetch(_)));
        assert_eq!(s.answer_if_stopped(), None, "nothing seen yet");
        let mut next = s.on_candidates(page, rng);
        while matches!(next, Action::Fetch(_)) {
            next = s.on_candidates(Ok(Vec::new()), rng);
        }
        assert_eq!(next, Action::CheckBalance);
        s
    }

    #[test]
    fn a_stopped_call_answers_funds_locked_only_once_it_saw_the_funds_held_by_others() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        // The scan ran out while the balance covers the amount: held by others.
        let mut s = ran_out(&mut rng, Ok(Vec::new()));
        assert_eq!(s.answer_if_stopped(), None, "the balance is not known yet");
        s.on_balance(Ok(q(10)), &mut rng);
        assert_eq!(s.answer_if_stopped(), Some(SelectError::FundsLocked));
        // A scan that ran out after a store error may have run out because of it.
        let failed = Err(StoreFault::new(FaultKind::Busy, "busy"));
        let mut s = ran_out(&mut rng, failed);
        s.on_balance(Ok(q(10)), &mut rng);
        assert_eq!(s.answer_if_stopped(), None);
        // A call already ending with a failure answers that failure.
        let mut s = ran_out(&mut rng, Ok(Vec::new()));
        s.on_balance(Ok(q(3)), &mut rng);
        assert_eq!(
            s.answer_if_stopped(),
            Some(SelectError::InsufficientFunds {
                available: q(3),
                requested: q(10)
            })
        );
    }

    /// A call for 120 whose first read shows one cover of 1,000 and 150 tokens
    /// of 1, and whose claim of the cover loses: what it does next.
    fn lost_the_cover(from_snapshot: bool, config: SelectionConfig) -> Action {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut s = call_with(120, config);
        assert!(matches!(s.start(&mut rng), Action::Fetch(_)));
        let mut page = vec![funded(0, 1_000)];
        page.extend((1..=150).map(|n| funded(n, 1)));
        if from_snapshot {
            s.note_read_from_snapshot();
        }
        let cover = funded(0, 1_000).id;
        assert_eq!(
            s.on_candidates(Ok(page), &mut rng),
            Action::Claim(vec![cover.clone()])
        );
        s.on_claim(Ok(vec![(cover, ClaimVerdict::Contended)]), &mut rng)
    }

    #[test]
    fn a_race_lost_from_a_snapshot_reads_the_store_before_any_answer() {
        // From the store, the rest of the read is worth picking from: the small
        // tokens cover 120 only beyond max_inputs, so the balance check decides
        // (TooManyInputs if the funds are there).
        let defaults = SelectionConfig::default;
        assert_eq!(lost_the_cover(false, defaults()), Action::CheckBalance);
        // From a snapshot, the read may lack a cover added or freed since: the
        // call reads the store, at no cost to its retries (none left here: it
        // would end its only leg).
        let no_retries = SelectionConfig {
            max_immediate_retries: 0,
            max_retries: 1,
            ..defaults()
        };
        for config in [defaults(), no_retries] {
            match lost_the_cover(true, config.clone()) {
                Action::Fetch(fetch) => {
                    assert!(fetch.after.is_none() && fetch.refresh, "{fetch:?}");
                }
                other => panic!("expected a fresh read with {config:?}, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_snapshot_covering_only_beyond_max_inputs_reads_the_store_again() {
        let answer = |from_snapshot: bool| {
            let mut rng = ChaCha8Rng::seed_from_u64(4);
            let mut s = call(120);
            s.start(&mut rng);
            let dust: Vec<Candidate> = (0..150).map(|n| funded(n, 1)).collect();
            if from_snapshot {
                s.note_read_from_snapshot();
            }
            assert_eq!(s.on_candidates(Ok(dust), &mut rng), Action::CheckBalance);
            // The wallet holds a cover the read does not show.
            s.on_balance(Ok(q(1_150)), &mut rng)
        };
        let too_many = SelectError::TooManyInputs {
            requested: q(120),
            max_inputs: SelectionConfig::default().max_inputs,
        };
        assert_eq!(answer(false), Action::Done(Err(too_many)));
        assert!(
            matches!(answer(true), Action::Fetch(_)),
            "{:?}",
            answer(true)
        );
    }
}
