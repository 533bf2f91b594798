//! Build requests and queues: the records that build-slot admission reads and writes.
//!
//! Every record carries a [`Version`]; a store writes a whole record only if the
//! version it holds still equals the one the writer read (compare-and-set), and the
//! written record carries the next version.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::ids::{IdError, QueueName, RevisionUri};
use crate::timestamp::Timestamp;

/// Why a request id was refused or two ids could not be compared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestIdError {
    /// The text is not `request/<queue>/<n>` with `n` in its one canonical spelling:
    /// a decimal number from 1 to [`RequestId::MAX_SEQ`] without leading zeros.
    #[error(
        "invalid request id {input:?}: {reason}; expected request/<queue>/<n> with n a decimal number from 1 to 9223372036854775807 without leading zeros"
    )]
    Malformed {
        /// The rejected text.
        input: String,
        /// What was wrong.
        reason: &'static str,
    },
    /// The queue part is not a valid queue name.
    #[error("invalid request id {input:?}: {source}")]
    Queue {
        /// The rejected text.
        input: String,
        /// Why the queue name was refused.
        source: IdError,
    },
    /// Two ids of different queues were compared.
    #[error("request ids {left} and {right} belong to different queues; expected ids of one queue")]
    DifferentQueues {
        /// The first id.
        left: RequestId,
        /// The second id.
        right: RequestId,
    },
}

/// A request id `request/<queue>/<n>`: `n` is the ingest order within the queue.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId {
    queue: QueueName,
    seq: u64,
}

impl RequestId {
    /// The largest `n` of a request id: the stores keep `n` as a signed 64-bit
    /// number and allocate it from 1.
    pub const MAX_SEQ: u64 = i64::MAX.unsigned_abs();

    /// The id of the `seq`-th request of `queue`.
    pub fn new(queue: QueueName, seq: u64) -> Self {
        RequestId { queue, seq }
    }

    /// Parses `request/<queue>/<n>`; the queue may itself contain `/`.
    ///
    /// This is the one gate for request ids from outside: `n` must be a decimal
    /// number from 1 to [`RequestId::MAX_SEQ`] (stores allocate from 1 and keep a
    /// signed 64-bit number) in its one canonical spelling, without leading zeros,
    /// so an id parses only if it prints back as the same text.
    pub fn parse(input: &str) -> Result<Self, RequestIdError> {
        let malformed = |reason| RequestIdError::Malformed {
            input: input.to_owned(),
            reason,
        };
        let rest = input
            .strip_prefix("request/")
            .ok_or_else(|| malformed("missing the request/ prefix"))?;
        let (queue, seq) = rest
            .rsplit_once('/')
            .ok_or_else(|| malformed("missing the /<n> suffix"))?;
        if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
            return Err(malformed("n is not a decimal number"));
        }
        if seq.len() > 1 && seq.starts_with('0') {
            return Err(malformed("n has a leading zero"));
        }
        let seq = seq
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= RequestId::MAX_SEQ)
            .ok_or_else(|| malformed("n is above 9223372036854775807"))?;
        if seq == 0 {
            return Err(malformed("n is 0"));
        }
        let queue = QueueName::new(queue).map_err(|source| RequestIdError::Queue {
            input: input.to_owned(),
            source,
        })?;
        Ok(RequestId { queue, seq })
    }

    /// The queue this request belongs to.
    pub fn queue(&self) -> &QueueName {
        &self.queue
    }

    /// The ingest order within the queue.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Orders two requests of one queue by ingest order; ids of different queues are an error.
    pub fn compare(&self, other: &RequestId) -> Result<Ordering, RequestIdError> {
        if self.queue != other.queue {
            return Err(RequestIdError::DifferentQueues {
                left: self.clone(),
                right: other.clone(),
            });
        }
        Ok(self.seq.cmp(&other.seq))
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request/{}/{}", self.queue, self.seq)
    }
}

impl std::str::FromStr for RequestId {
    type Err = RequestIdError;
    fn from_str(s: &str) -> Result<Self, RequestIdError> {
        RequestId::parse(s)
    }
}

/// The optimistic-concurrency version of a record: starts at 1, +1 per write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Version(pub u64);

impl Version {
    /// The version of a freshly created record.
    pub const FIRST: Version = Version(1);

    /// The version a successful write produces.
    pub fn next(self) -> Version {
        Version(self.0 + 1)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// The life cycle of a build request. Terminal states are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RequestState {
    /// Ingested, waiting for admission.
    Accepted,
    /// Admitted: owns a slot and a build was (or will be) published.
    Processing,
    /// A newer head replaced it before admission (terminal).
    Superseded,
    /// The build passed (terminal).
    Succeeded,
    /// The build failed, or the request was dead-lettered (terminal).
    Failed,
    /// The build was cancelled (terminal).
    Cancelled,
}

impl RequestState {
    /// Whether no further transition is allowed.
    pub fn is_terminal(self) -> bool {
        !matches!(self, RequestState::Accepted | RequestState::Processing)
    }

    /// The stored name: `accepted`, `processing`, `superseded`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            RequestState::Accepted => "accepted",
            RequestState::Processing => "processing",
            RequestState::Superseded => "superseded",
            RequestState::Succeeded => "succeeded",
            RequestState::Failed => "failed",
            RequestState::Cancelled => "cancelled",
        }
    }

    /// Parses a stored name; `None` for anything else.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            RequestState::Accepted,
            RequestState::Processing,
            RequestState::Superseded,
            RequestState::Succeeded,
            RequestState::Failed,
            RequestState::Cancelled,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

impl fmt::Display for RequestState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a build runs: from scratch, or incrementally from the last green revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BuildStrategy {
    /// No usable last green (none, or not an ancestor): build everything.
    Full,
    /// The last green is an ancestor: build the difference since it.
    IncrementalSinceGreen,
}

impl BuildStrategy {
    /// The stored name: `full` or `incremental_since_green`.
    pub fn as_str(self) -> &'static str {
        match self {
            BuildStrategy::Full => "full",
            BuildStrategy::IncrementalSinceGreen => "incremental_since_green",
        }
    }

    /// Parses a stored name; `None` for anything else.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "full" => Some(BuildStrategy::Full),
            "incremental_since_green" => Some(BuildStrategy::IncrementalSinceGreen),
            _ => None,
        }
    }
}

/// The strategy and base of an admitted build, written once with accepted -> processing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BuildPlan {
    /// Full or incremental.
    pub strategy: BuildStrategy,
    /// The last green revision an incremental build starts from; `None` for full builds.
    pub base: Option<RevisionUri>,
}

/// A build request record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `request/<queue>/<n>`.
    pub id: RequestId,
    /// The revision to build; unique within the queue.
    pub uri: RevisionUri,
    /// Where it is in its life cycle.
    pub state: RequestState,
    /// Strategy and base, present from accepted -> processing on.
    pub plan: Option<BuildPlan>,
    /// Why a failed request failed when admission (not a build) failed it.
    pub reason: Option<FailReason>,
    /// When it was ingested (by the store's clock); admission's wait is from here
    /// to the publish of its build.
    pub ingested_at: Timestamp,
    /// Compare-and-set version.
    pub version: Version,
}

/// Why admission itself failed a request (a build outcome carries no reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailReason {
    /// Its slot lease ran out: no heartbeat within the queue's slot lease, so the
    /// build is presumed lost and the slot went to the next head.
    SlotLeaseExpired,
    /// Its message was dead-lettered.
    DeadLettered,
}

impl FailReason {
    /// The stored name: `slot_lease_expired` or `dead_lettered`.
    pub fn as_str(self) -> &'static str {
        match self {
            FailReason::SlotLeaseExpired => "slot_lease_expired",
            FailReason::DeadLettered => "dead_lettered",
        }
    }

    /// Parses a stored name; `None` for anything else.
    pub fn from_name(name: &str) -> Option<Self> {
        [FailReason::SlotLeaseExpired, FailReason::DeadLettered]
            .into_iter()
            .find(|r| r.as_str() == name)
    }
}

impl fmt::Display for FailReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The number of one publication of an owner's build: 1 for the first, one more
/// for every re-publication (after the previous one went quiet). A build carries
/// its generation and heartbeats with it; a heartbeat of an older generation is
/// told to stop. Never reused within a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Generation(pub u32);

impl Generation {
    /// No publication yet: a slot's generation until its first publication.
    pub const NONE: Generation = Generation(0);

    /// The generation after this one (saturating).
    #[must_use]
    pub fn next(self) -> Generation {
        Generation(self.0.saturating_add(1))
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A request's hold on a build slot: when it claimed it and when it last showed
/// it is alive, and the last publication of its build. The slot lease runs from
/// the last heartbeat; a publication goes quiet (and is re-published) when neither
/// it nor a heartbeat came within the queue's `resume_after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    /// When the request claimed the slot.
    pub claimed_at: Timestamp,
    /// The claim or the last heartbeat, whichever is later.
    pub heartbeat_at: Timestamp,
    /// The generation of the last publication ([`Generation::NONE`] before the
    /// first).
    pub generation: Generation,
    /// When that generation was published; `None` before the first publication
    /// and after a failed one was withdrawn (the next delivery publishes again).
    pub published_at: Option<Timestamp>,
    /// A reconcile found the lease run out and marked the slot, covering every
    /// heartbeat before it (a compare-and-set on the queue): the request is failed
    /// next, then pruned. A marked slot is never extended.
    pub expiring: bool,
}

impl Slot {
    /// A slot claimed at `now`, not published yet.
    pub fn claimed(now: Timestamp) -> Self {
        Slot {
            claimed_at: now,
            heartbeat_at: now,
            generation: Generation::NONE,
            published_at: None,
            expiring: false,
        }
    }

    /// When a slot lease of `lease` runs out if no heartbeat comes.
    pub fn expires_at(&self, lease: Duration) -> Timestamp {
        Timestamp(self.heartbeat_at.0.saturating_add(millis(lease)))
    }

    /// Whether a lease of `lease` has run out at `now`.
    pub fn expired(&self, lease: Duration, now: Timestamp) -> bool {
        now >= self.expires_at(lease)
    }

    /// When the owner goes quiet with `resume_after`: `resume_after` after the
    /// latest of its publication, its last heartbeat and its claim.
    pub fn resume_due(&self, resume_after: Duration) -> Timestamp {
        let last = self
            .published_at
            .map_or(self.heartbeat_at, |at| at.max(self.heartbeat_at));
        Timestamp(last.0.saturating_add(millis(resume_after)))
    }

    /// Whether a heartbeat came after the current publication: the build was
    /// handed over and runs.
    pub fn confirmed(&self) -> bool {
        self.published_at.is_some_and(|at| self.heartbeat_at > at)
    }

    /// Whether a delivery must publish the build (again) at `now`: nothing is
    /// published (or a failed publication was withdrawn), or neither the
    /// publication nor a heartbeat came within `resume_after`.
    pub fn quiet(&self, resume_after: Duration, now: Timestamp) -> bool {
        self.published_at.is_none() || now >= self.resume_due(resume_after)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The last green bookmark of a queue; only moves forward.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LastGreen {
    /// The green revision.
    pub uri: RevisionUri,
    /// The request that built it.
    pub request_id: RequestId,
}

/// A build queue record. Every write replaces the whole record by compare-and-set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queue {
    /// The queue name.
    pub name: QueueName,
    /// The newest ingested request (the head).
    pub latest_request_id: Option<RequestId>,
    /// The last green bookmark.
    pub last_green: Option<LastGreen>,
    /// The requests that own a build slot, with their slot's times; occupancy is
    /// its size.
    pub owners: BTreeMap<RequestId, Slot>,
    /// The stored slot limit: `Some(0)` pauses the queue. `None` until the first
    /// head is stamped (which writes the configured default) or a limit is set.
    pub max_concurrent: Option<u32>,
    /// Compare-and-set version.
    pub version: Version,
}

impl Queue {
    /// An empty queue at [`Version::FIRST`].
    pub fn new(name: QueueName) -> Self {
        Queue {
            name,
            latest_request_id: None,
            last_green: None,
            owners: BTreeMap::new(),
            max_concurrent: None,
            version: Version::FIRST,
        }
    }

    /// The slot limit in force: the stored one, else `default` (the configured
    /// default of a queue that has none stored yet). 0 means paused.
    pub fn limit(&self, default: u32) -> u32 {
        self.max_concurrent.unwrap_or(default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_request_ids() {
        let id = RequestId::parse("request/monorepo/main/42").unwrap();
        assert_eq!(id.queue().as_str(), "monorepo/main");
        assert_eq!(id.seq(), 42);
        assert_eq!(id.to_string(), "request/monorepo/main/42");
    }

    #[test]
    fn rejects_malformed_request_ids() {
        for bad in [
            "",
            "request/",
            "request/q",
            "request/q/",
            "request//1",
            "request/q/-1",
            "request/q/1x",
            "req/q/1",
            "request/q/99999999999999999999999",
        ] {
            let err = RequestId::parse(bad).unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn accepts_n_from_1_to_the_signed_64_bit_maximum() {
        assert_eq!(RequestId::MAX_SEQ, 9_223_372_036_854_775_807);
        for text in [
            "request/q/1",
            "request/q/10",
            "request/q/9223372036854775807",
        ] {
            let id = RequestId::parse(text).unwrap();
            assert_eq!(id.to_string(), text);
        }
        assert_eq!(
            RequestId::parse("request/q/9223372036854775807")
                .unwrap()
                .seq(),
            RequestId::MAX_SEQ
        );
    }

    #[test]
    fn rejects_n_out_of_range_or_not_canonical() {
        for (bad, reason) in [
            ("request/q/0", "n is 0"),
            ("request/q/00", "leading zero"),
            ("request/q/01", "leading zero"),
            ("request/q/007", "leading zero"),
            ("request/q/9223372036854775808", "above 9223372036854775807"),
            (
                "request/q/18446744073709551615",
                "above 9223372036854775807",
            ),
            (
                "request/q/18446744073709551616",
                "above 9223372036854775807",
            ),
        ] {
            let err = RequestId::parse(bad).unwrap_err();
            assert!(
                matches!(&err, RequestIdError::Malformed { input, .. } if input == bad),
                "{err:?}"
            );
            let text = err.to_string();
            assert!(text.contains(&format!("{bad:?}")), "{text}");
            assert!(text.contains(reason), "{text}");
            assert!(
                text.contains("from 1 to 9223372036854775807 without leading zeros"),
                "{text}"
            );
        }
    }

    #[test]
    fn compares_within_one_queue_only() {
        let a = RequestId::parse("request/q/2").unwrap();
        let b = RequestId::parse("request/q/10").unwrap();
        assert_eq!(a.compare(&b), Ok(Ordering::Less));
        let other = RequestId::parse("request/p/1").unwrap();
        assert!(matches!(
            a.compare(&other),
            Err(RequestIdError::DifferentQueues { .. })
        ));
    }

    #[test]
    fn state_names_round_trip() {
        for s in [
            RequestState::Accepted,
            RequestState::Processing,
            RequestState::Superseded,
            RequestState::Succeeded,
            RequestState::Failed,
            RequestState::Cancelled,
        ] {
            assert_eq!(RequestState::from_name(s.as_str()), Some(s));
        }
        assert!(RequestState::Failed.is_terminal());
        assert!(!RequestState::Processing.is_terminal());
    }
}
