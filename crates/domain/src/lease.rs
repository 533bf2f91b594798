//! The lock lifecycle: which transaction statuses release a consumer's locks, and
//! when a lock's lease has expired (`docs/lifecycle.md`).
//!
//! - [`settlement_action`]: Confirmed, Deleted and Invalid release all locks of the
//!   consumer; Pending, Busy, Unknown, Orphan and unrecognised statuses keep them.
//! - [`PersistPolicy::after_attempt`]: a releasing status is persisted with bounded
//!   retries; it releases exactly once, after the status was persisted or after the
//!   retries were exhausted, and not at all when the listener was cancelled.
//! - [`SweepRule`]: the one statement of what the sweep deletes: a lock older than
//!   the lease, or one whose consumer is Deleted or Orphan. [`LeaseConfig::sweep_rule`]
//!   computes it for a moment; both adapters' sweeps take it as it is (the SQL
//!   binds its cut-off and statuses), and `holdfast locks list` flags with it.
//!
//! Release is idempotent (a delete by consumer), so a recovery pass after a restart
//! applies the same rules again without harm.

use std::fmt;
use std::time::Duration;

use crate::timestamp::Timestamp;

/// The status of a transaction as holdfast records it, and as a settlement source
/// reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TxStatus {
    /// Submitted, not yet final.
    Pending,
    /// Final and valid: its inputs are spent.
    Confirmed,
    /// Final and invalid (or deleted): its inputs are free again.
    Deleted,
    /// Abandoned without a final answer; released only by the lease sweep.
    Orphan,
    /// The network is busy; try again later.
    Busy,
    /// The network does not know (yet).
    Unknown,
}

impl TxStatus {
    /// Every status, in declaration order: the one list the stored names, the
    /// parser and the adapters' error messages read.
    pub const ALL: [TxStatus; 6] = [
        TxStatus::Pending,
        TxStatus::Confirmed,
        TxStatus::Deleted,
        TxStatus::Orphan,
        TxStatus::Busy,
        TxStatus::Unknown,
    ];

    /// The stored name: `pending`, `confirmed`, `deleted`, `orphan`, `busy`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            TxStatus::Pending => "pending",
            TxStatus::Confirmed => "confirmed",
            TxStatus::Deleted => "deleted",
            TxStatus::Orphan => "orphan",
            TxStatus::Busy => "busy",
            TxStatus::Unknown => "unknown",
        }
    }

    /// Parses a stored name; `None` for anything else.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

impl fmt::Display for TxStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A settlement status as a settlement source reports it: a known [`TxStatus`], the
/// source's `Invalid` verdict, or a code this version does not know.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SettlementStatus {
    /// A status holdfast records as is.
    Known(TxStatus),
    /// Final and invalid; recorded as [`TxStatus::Deleted`].
    Invalid,
    /// A code this version does not recognise; never retried, never releases.
    Unrecognised(String),
}

impl SettlementStatus {
    /// Interprets a reported code: a [`TxStatus`] name, `valid` (Confirmed),
    /// `invalid`, or anything else as [`SettlementStatus::Unrecognised`].
    pub fn from_code(code: &str) -> Self {
        match code {
            "valid" => SettlementStatus::Known(TxStatus::Confirmed),
            "invalid" => SettlementStatus::Invalid,
            other => TxStatus::from_name(other)
                .map(SettlementStatus::Known)
                .unwrap_or_else(|| SettlementStatus::Unrecognised(other.to_owned())),
        }
    }

    /// The status to record for the consumer, if any (`Invalid` is recorded as
    /// Deleted; an unrecognised code records nothing).
    pub fn recorded(&self) -> Option<TxStatus> {
        match self {
            SettlementStatus::Known(status) => Some(*status),
            SettlementStatus::Invalid => Some(TxStatus::Deleted),
            SettlementStatus::Unrecognised(_) => None,
        }
    }
}

/// What to do with the locks of a consumer transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockAction {
    /// Release every lock of the consumer (idempotent).
    ReleaseAll,
    /// Release nothing.
    Keep,
}

/// Whether a settlement status releases the consumer's locks: Confirmed, Deleted
/// and Invalid do; Pending, Busy, Unknown, Orphan (released only by the lease
/// sweep) and unrecognised codes do not.
pub fn settlement_action(status: &SettlementStatus) -> LockAction {
    match status {
        SettlementStatus::Known(TxStatus::Confirmed | TxStatus::Deleted)
        | SettlementStatus::Invalid => LockAction::ReleaseAll,
        SettlementStatus::Known(
            TxStatus::Pending | TxStatus::Busy | TxStatus::Unknown | TxStatus::Orphan,
        )
        | SettlementStatus::Unrecognised(_) => LockAction::Keep,
    }
}

/// How one attempt to persist a settlement status ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PersistResult {
    /// The status was stored.
    Persisted,
    /// Storing it failed.
    Failed,
    /// The listener itself was cancelled meanwhile (shutdown).
    Cancelled,
}

/// The next move after a persistence attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PersistStep {
    /// Stop; apply this to the consumer's locks.
    Done(LockAction),
    /// Try to persist again after this backoff.
    RetryAfter(Duration),
}

/// Bounded retries for persisting a settlement status: attempts are numbered from 1,
/// and the backoff doubles from `initial_backoff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PersistPolicy {
    /// Attempts before giving up; at least 1 (default 3).
    pub max_attempts: u32,
    /// The backoff after the first failed attempt (default 1 s).
    pub initial_backoff: Duration,
}

impl Default for PersistPolicy {
    fn default() -> Self {
        PersistPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_secs(1),
        }
    }
}

impl PersistPolicy {
    /// Decides after persistence attempt number `attempt` (from 1) of `status`.
    ///
    /// For a releasing status the sequence of attempts ends in exactly one
    /// [`PersistStep::Done`]: [`LockAction::ReleaseAll`] once persisted or once the
    /// attempts are exhausted (the transaction is final either way; keeping its
    /// locks would only leak them until the lease), [`LockAction::Keep`] if the
    /// listener was cancelled (recovery and the lease sweep are the backstops). A
    /// status that does not release is [`LockAction::Keep`] whatever happened.
    pub fn after_attempt(
        &self,
        status: &SettlementStatus,
        attempt: u32,
        result: PersistResult,
    ) -> PersistStep {
        if settlement_action(status) == LockAction::Keep {
            return PersistStep::Done(LockAction::Keep);
        }
        match result {
            PersistResult::Persisted => PersistStep::Done(LockAction::ReleaseAll),
            PersistResult::Cancelled => PersistStep::Done(LockAction::Keep),
            PersistResult::Failed if attempt >= self.max_attempts => {
                PersistStep::Done(LockAction::ReleaseAll)
            }
            PersistResult::Failed => {
                let doublings = attempt.saturating_sub(1).min(16);
                let factor = 1u32 << doublings;
                PersistStep::RetryAfter(self.initial_backoff.saturating_mul(factor))
            }
        }
    }
}

/// The default lease: a lock older than this is swept.
pub const DEFAULT_LEASE_EXPIRY: Duration = Duration::from_secs(180);
/// The default period of the lease sweep.
pub const DEFAULT_CLEANUP_PERIOD: Duration = Duration::from_secs(60);

/// Lease sweep settings. Plain data; [`LeaseConfig::validate`] checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Locks older than this are deleted (default 3 min).
    pub lease_expiry: Duration,
    /// How often the sweep runs (default 1 min).
    pub cleanup_period: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            lease_expiry: DEFAULT_LEASE_EXPIRY,
            cleanup_period: DEFAULT_CLEANUP_PERIOD,
        }
    }
}

/// Why a [`LeaseConfig`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseConfigError {
    /// `lease_expiry` was zero.
    #[error("invalid lease config: lease_expiry is 0 ms; expected more than zero")]
    LeaseExpiryZero,
    /// `cleanup_period` was zero.
    #[error("invalid lease config: cleanup_period is 0 ms; expected more than zero")]
    CleanupPeriodZero,
}

impl LeaseConfig {
    /// Checks that both durations are positive.
    pub fn validate(&self) -> Result<(), LeaseConfigError> {
        if self.lease_expiry.is_zero() {
            return Err(LeaseConfigError::LeaseExpiryZero);
        }
        if self.cleanup_period.is_zero() {
            return Err(LeaseConfigError::CleanupPeriodZero);
        }
        Ok(())
    }

    /// What a sweep at `now` deletes: locks created before `now - lease_expiry`,
    /// and locks of Deleted or Orphan consumers.
    pub fn sweep_rule(&self, now: Timestamp) -> SweepRule {
        SweepRule {
            cutoff: now.saturating_sub(self.lease_expiry),
        }
    }

    /// Whether a lock created at `created_at`, whose consumer has the recorded
    /// `consumer` status, is swept at `now` (see [`SweepRule`]).
    pub fn is_expired(
        &self,
        created_at: Timestamp,
        consumer: Option<TxStatus>,
        now: Timestamp,
    ) -> bool {
        self.sweep_rule(now).sweeps(created_at, consumer)
    }
}

/// How long after its lease ran out a selection whose transaction never settled
/// is kept: the sweep then forgets it (a Confirmed arriving later spends nothing
/// of it). Selections are what a late Confirmed spends after the sweep took the
/// locks, so this is far beyond any finality time; it bounds what transactions
/// that never settle leave behind.
pub const SELECTION_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The statuses whose consumers' locks the sweep deletes whatever their age: the
/// transaction is final and invalid (Deleted), or abandoned (Orphan).
pub const SWEPT_STATUSES: [TxStatus; 2] = [TxStatus::Deleted, TxStatus::Orphan];

/// What one lease sweep deletes. Computed by [`LeaseConfig::sweep_rule`]; the lock
/// stores apply it without restating it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SweepRule {
    /// Locks created strictly before this moment have expired (a lock created
    /// exactly at the cut-off stays).
    pub cutoff: Timestamp,
}

impl SweepRule {
    /// Selections made strictly before this moment, whose lock is gone, are
    /// forgotten: [`SELECTION_RETENTION`] past the lease.
    pub fn forget_before(&self) -> Timestamp {
        self.cutoff.saturating_sub(SELECTION_RETENTION)
    }

    /// Whether a lock created at `created_at` has outlived its lease.
    pub fn expired(&self, created_at: Timestamp) -> bool {
        created_at < self.cutoff
    }

    /// Whether a consumer with this recorded status has its locks swept at any age
    /// (one of [`SWEPT_STATUSES`]).
    pub fn dead(consumer: Option<TxStatus>) -> bool {
        consumer.is_some_and(|status| SWEPT_STATUSES.contains(&status))
    }

    /// Whether the sweep deletes a lock created at `created_at` whose consumer has
    /// the recorded status `consumer`.
    pub fn sweeps(&self, created_at: Timestamp, consumer: Option<TxStatus>) -> bool {
        self.expired(created_at) || SweepRule::dead(consumer)
    }
}

/// Whether a select that won its first lock at `first_claim` must re-check (and
/// re-stamp) its locks before answering at `now`: once half the lease has passed,
/// the sweep may already have taken a lock of a slow select, and a select never
/// returns a token whose lock it no longer holds.
pub fn needs_renewal(first_claim: Timestamp, now: Timestamp, lease: Duration) -> bool {
    first_claim <= now.saturating_sub(lease / 2)
}

/// After pass `pass` (counted from 1) of a select lost locks to the lease sweep
/// and gave its tokens back: select again from a fresh read (`Ok`), or, once
/// more than `max_retries` passes ran, answer [`SelectError::FundsLocked`]
/// (other transactions keep taking what it selected).
///
/// [`SelectError::FundsLocked`]: crate::SelectError::FundsLocked
pub fn after_locks_lost(pass: u32, max_retries: u32) -> Result<(), crate::SelectError> {
    if pass > max_retries {
        Err(crate::SelectError::FundsLocked)
    } else {
        Ok(())
    }
}

/// A token type whose confirmed transaction does not conserve it: what its inputs
/// of that type hold and what its outputs of that type add up to (`None`: more
/// than 128 bits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imbalance {
    /// The type.
    pub token_type: crate::TokenType,
    /// The inputs' sum.
    pub inputs: Option<u128>,
    /// The outputs' sum.
    pub outputs: Option<u128>,
}

impl Imbalance {
    /// A sum as decimal text.
    pub fn shown(sum: Option<u128>) -> String {
        sum.map_or_else(|| format!("more than {}", u128::MAX), |s| s.to_string())
    }
}

/// The rule of confirming with outputs: per token type, the outputs add up to
/// exactly what the inputs hold (no fee, nothing minted or burnt). The first type,
/// in type order, where they differ; `None` when every type balances.
pub fn unconserved<'a>(
    inputs: impl IntoIterator<Item = (&'a crate::TokenType, crate::Quantity)>,
    outputs: impl IntoIterator<Item = (&'a crate::TokenType, crate::Quantity)>,
) -> Option<Imbalance> {
    use std::collections::BTreeMap;
    fn add<'t>(
        sums: &mut BTreeMap<&'t crate::TokenType, Option<u128>>,
        t: &'t crate::TokenType,
        q: u128,
    ) {
        let sum = sums.entry(t).or_insert(Some(0));
        *sum = sum.and_then(|s| s.checked_add(q));
    }
    let mut sums: BTreeMap<&crate::TokenType, (Option<u128>, Option<u128>)> = BTreeMap::new();
    let (mut ins, mut outs) = (BTreeMap::new(), BTreeMap::new());
    for (t, q) in inputs {
        add(&mut ins, t, q.value());
    }
    for (t, q) in outputs {
        add(&mut outs, t, q.value());
    }
    for (t, s) in &ins {
        sums.entry(*t).or_insert((Some(0), Some(0))).0 = *s;
    }
    for (t, s) in &outs {
        sums.entry(*t).or_insert((Some(0), Some(0))).1 = *s;
    }
    sums.into_iter()
        .find(|(_, (i, o))| i.is_none() || i != o)
        .map(|(t, (inputs, outputs))| Imbalance {
            token_type: t.clone(),
            inputs,
            outputs,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_conserve_inputs_per_type() {
        let (chf, eur) = (
            crate::TokenType::new("CHF").expect("type"),
            crate::TokenType::new("EUR").expect("type"),
        );
        let q = |v| crate::Quantity::new(v, crate::Precision::MAX).expect("quantity");
        // 7 + 5 of CHF paid as 10 + 2: balanced.
        assert_eq!(
            unconserved([(&chf, q(7)), (&chf, q(5))], [(&chf, q(10)), (&chf, q(2))]),
            None
        );
        // Nothing in, nothing out.
        assert_eq!(unconserved([], []), None);
        // An output short of its inputs (a fee) or beyond them (minting).
        let short = unconserved([(&chf, q(7))], [(&chf, q(6))]).expect("short");
        assert_eq!((short.inputs, short.outputs), (Some(7), Some(6)));
        // A type with inputs and no outputs, or outputs of another type.
        let burnt = unconserved([(&chf, q(7)), (&eur, q(1))], [(&chf, q(7))]).expect("burnt");
        assert_eq!((burnt.token_type, burnt.outputs), (eur.clone(), Some(0)));
        let swapped = unconserved([(&chf, q(7))], [(&eur, q(7))]).expect("swapped");
        assert_eq!(swapped.token_type, chf);
        // Sums beyond 128 bits never balance.
        let huge = unconserved(
            [(&eur, q(u128::MAX)), (&eur, q(1))],
            [(&eur, q(u128::MAX)), (&eur, q(1))],
        )
        .expect("beyond 128 bits");
        assert_eq!(huge.inputs, None);
        assert!(Imbalance::shown(None).starts_with("more than"));
    }

    const ALL: [TxStatus; 6] = TxStatus::ALL;

    #[test]
    fn settlement_releases_only_final_statuses() {
        let release: Vec<_> = ALL
            .into_iter()
            .filter(|s| settlement_action(&SettlementStatus::Known(*s)) == LockAction::ReleaseAll)
            .collect();
        assert_eq!(release, [TxStatus::Confirmed, TxStatus::Deleted]);
        assert_eq!(
            settlement_action(&SettlementStatus::Invalid),
            LockAction::ReleaseAll
        );
        assert_eq!(
            settlement_action(&SettlementStatus::Unrecognised("42".into())),
            LockAction::Keep
        );
    }

    #[test]
    fn codes_parse_to_statuses() {
        assert_eq!(
            SettlementStatus::from_code("valid"),
            SettlementStatus::Known(TxStatus::Confirmed)
        );
        assert_eq!(
            SettlementStatus::from_code("invalid"),
            SettlementStatus::Invalid
        );
        assert_eq!(
            SettlementStatus::from_code("invalid").recorded(),
            Some(TxStatus::Deleted)
        );
        assert_eq!(
            SettlementStatus::from_code("busy"),
            SettlementStatus::Known(TxStatus::Busy)
        );
        let odd = SettlementStatus::from_code("VALID?");
        assert_eq!(odd, SettlementStatus::Unrecognised("VALID?".into()));
        assert_eq!(odd.recorded(), None);
    }

    /// Runs the persistence attempts of `status` with the given results and returns
    /// how often the locks were released and the backoffs asked for.
    fn run(status: &SettlementStatus, results: &[PersistResult]) -> (usize, Vec<Duration>) {
        let policy = PersistPolicy::default();
        let mut releases = 0;
        let mut backoffs = Vec::new();
        for (i, result) in results.iter().enumerate() {
            let attempt = u32::try_from(i + 1).unwrap();
            match policy.after_attempt(status, attempt, *result) {
                PersistStep::Done(LockAction::ReleaseAll) => {
                    releases += 1;
                    break;
                }
                PersistStep::Done(LockAction::Keep) => break,
                PersistStep::RetryAfter(d) => backoffs.push(d),
            }
        }
        (releases, backoffs)
    }

    #[test]
    fn exhausted_persistence_releases_exactly_once() {
        use PersistResult::*;
        let confirmed = SettlementStatus::Known(TxStatus::Confirmed);
        let (releases, backoffs) = run(&confirmed, &[Failed, Failed, Failed, Failed]);
        assert_eq!(releases, 1);
        assert_eq!(backoffs, [Duration::from_secs(1), Duration::from_secs(2)]);
        assert_eq!(run(&confirmed, &[Failed, Persisted]).0, 1);
        assert_eq!(run(&SettlementStatus::Invalid, &[Persisted]).0, 1);
        assert_eq!(run(&confirmed, &[Failed, Cancelled]).0, 0);
        let busy = SettlementStatus::Known(TxStatus::Busy);
        assert_eq!(run(&busy, &[Failed, Failed, Failed]), (0, vec![]));
    }

    #[test]
    fn lease_expires_by_age_or_consumer_status() {
        let config = LeaseConfig::default();
        let now = Timestamp::from_millis(1_000_000);
        let fresh = Timestamp::from_millis(1_000_000 - 180_000);
        let old = Timestamp::from_millis(1_000_000 - 180_001);
        assert!(!config.is_expired(fresh, None, now));
        assert!(config.is_expired(old, None, now));
        assert!(config.is_expired(old, Some(TxStatus::Pending), now));
        for status in ALL {
            let expected = matches!(status, TxStatus::Deleted | TxStatus::Orphan);
            assert_eq!(
                config.is_expired(fresh, Some(status), now),
                expected,
                "{status}"
            );
        }
    }

    #[test]
    fn a_select_renews_its_locks_from_half_the_lease_on() {
        let lease = Duration::from_secs(10);
        let first = Timestamp::from_millis(100_000);
        assert!(!needs_renewal(
            first,
            Timestamp::from_millis(104_999),
            lease
        ));
        assert!(needs_renewal(first, Timestamp::from_millis(105_000), lease));
        assert!(needs_renewal(first, Timestamp::from_millis(200_000), lease));
        // A clock that went backwards never asks for a renewal.
        assert!(!needs_renewal(first, Timestamp::from_millis(0), lease));
    }

    #[test]
    fn a_select_that_keeps_losing_locks_ends_as_funds_locked() {
        let rows = [
            ("the first pass selects again", 1, 10, Ok(())),
            ("the last allowed pass selects again", 10, 10, Ok(())),
            (
                "past max_retries: funds locked",
                11,
                10,
                Err(crate::SelectError::FundsLocked),
            ),
            (
                "one leg, second pass",
                2,
                1,
                Err(crate::SelectError::FundsLocked),
            ),
        ];
        for (name, pass, max_retries, answer) in rows {
            assert_eq!(after_locks_lost(pass, max_retries), answer, "{name}");
        }
    }

    #[test]
    fn lease_config_rejects_zero_durations() {
        assert_eq!(LeaseConfig::default().validate(), Ok(()));
        let zero_lease = LeaseConfig {
            lease_expiry: Duration::ZERO,
            ..LeaseConfig::default()
        };
        let err = zero_lease.validate().unwrap_err();
        assert_eq!(err, LeaseConfigError::LeaseExpiryZero);
        assert!(err.to_string().contains("lease_expiry"), "{err}");
        let zero_period = LeaseConfig {
            cleanup_period: Duration::ZERO,
            ..LeaseConfig::default()
        };
        assert_eq!(
            zero_period.validate(),
            Err(LeaseConfigError::CleanupPeriodZero)
        );
    }
}
