//! Build-slot admission owned by request id (`docs/admission.md`), as pure decision steps.
//!
//! Every step is a function from what the caller loaded (the request, the queue,
//! and where needed the requests of the slot owners and an ancestry answer) and the
//! event to one [`Decision`]: a single compare-and-set [`Write`] to attempt next on
//! the version that was read, something more to load ([`Need`]), or a final
//! [`Reply`]. The caller loops until it gets a reply:
//!
//! ```text
//! loop {
//!     request = load_request(id)        // the request FIRST, then the queue
//!     queue   = load_queue(id.queue())
//!     match decide_*(...) {
//!         Decision::Need(need)   => load what it names, decide again
//!         Decision::Write(write) => cas_queue / cas_request; Applied or Conflict,
//!                                   memo.record_applied(&write) if Applied; reload
//!         Decision::Reply(reply) => return reply
//!     }
//! }
//! ```
//!
//! There is no transaction across a queue and a request, so nothing is assumed
//! about what happened between two writes: a crash, a redelivery or a duplicate
//! delivery simply re-decides from what is stored. A store error (the write failed,
//! or committed and reported an error) is answered by the caller with a retry of the
//! message, never with a compensating write.
//!
//! The request must be loaded before the queue in every iteration: together with
//! the fence written before releasing a superseded request's slot (see
//! [`RequestWrite::Fence`]) this ordering guarantees that a concurrent delivery can
//! never mark a request processing after its slot was released for supersession.

// Private helpers return a whole `Decision` as their early exit; it is moved once
// and never stored, so boxing it would only add allocations.
#![allow(clippy::result_large_err)]

mod heartbeat;
mod ingest;
pub mod invariants;
mod outcome;
mod process;
mod reconcile;

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::time::Duration;

use crate::ids::{QueueName, RevisionUri};
use crate::request::{
    BuildPlan, FailReason, Generation, Queue, Request, RequestId, RequestIdError, RequestState,
    Slot, Version,
};

pub use heartbeat::{
    Heartbeat, decide_heartbeat, decide_set_limit, decide_withdraw, heartbeat_answer,
};
pub use ingest::decide_ingest;
pub use outcome::{BuildOutcome, decide_dead_letter, decide_outcome};
pub use process::{ProcessInput, ProcessMemo, decide_process};
pub use reconcile::{Pruned, PrunedWhy, decide_backfill, decide_reconcile, quiet_owners};

/// The default gate wait delay: how long a request waits for a free slot before the
/// gate is asked again.
pub const DEFAULT_GATE_WAIT_DELAY: Duration = Duration::from_secs(5);

/// The default time after which an owner's publication, without a heartbeat since,
/// is presumed lost (its worker or build died) and the build is published again
/// with the next generation. Builds heartbeat well within it (a third is plenty).
pub const DEFAULT_RESUME_AFTER: Duration = Duration::from_secs(60);

/// The default slot lease: an owner without a heartbeat for this long is presumed
/// lost, its request failed with [`FailReason::SlotLeaseExpired`] and its slot freed.
pub const DEFAULT_SLOT_LEASE: Duration = Duration::from_secs(2 * 60 * 60);

/// Admission settings of a queue. Plain data; [`AdmissionConfig::validate`] checks it
/// and every step that gates validates it first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// How many requests may own a build slot at once in a queue that has no
    /// stored limit yet; at least 1 (default 1). The first stamped head stores it
    /// with the queue; from then on the stored limit rules ([`Queue::limit`]).
    pub max_concurrent: u32,
    /// How long a request is held when the gate is closed; more than zero (default 5 s).
    pub gate_wait_delay: Duration,
    /// How long an owner keeps its slot without a heartbeat; more than zero
    /// (default 2 h).
    pub slot_lease: Duration,
    /// How long a published build may go without a heartbeat (or a newer
    /// publication) before it is presumed lost and published again with the next
    /// generation; more than zero (default 60 s). At or above the slot lease it
    /// never comes first: the lease fails the request instead.
    pub resume_after: Duration,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            max_concurrent: 1,
            gate_wait_delay: DEFAULT_GATE_WAIT_DELAY,
            slot_lease: DEFAULT_SLOT_LEASE,
            resume_after: DEFAULT_RESUME_AFTER,
        }
    }
}

impl AdmissionConfig {
    /// Checks the settings. An invalid configuration is not retryable: redelivering
    /// the message cannot fix it.
    pub fn validate(&self) -> Result<(), AdmissionConfigError> {
        if self.max_concurrent == 0 {
            return Err(AdmissionConfigError::MaxConcurrentZero);
        }
        if self.gate_wait_delay.is_zero() {
            return Err(AdmissionConfigError::GateWaitDelayZero);
        }
        if self.slot_lease.is_zero() {
            return Err(AdmissionConfigError::SlotLeaseZero);
        }
        if self.resume_after.is_zero() {
            return Err(AdmissionConfigError::ResumeAfterZero);
        }
        Ok(())
    }
}

/// Why an [`AdmissionConfig`] was refused. Never retryable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionConfigError {
    /// `max_concurrent` was 0.
    #[error("invalid admission config: max_concurrent is 0; expected at least 1")]
    MaxConcurrentZero,
    /// `gate_wait_delay` was zero.
    #[error("invalid admission config: gate_wait_delay is 0 ms; expected more than zero")]
    GateWaitDelayZero,
    /// `slot_lease` was zero.
    #[error("invalid admission config: slot_lease is 0 ms; expected more than zero")]
    SlotLeaseZero,
    /// `resume_after` was zero.
    #[error("invalid admission config: resume_after is 0 ms; expected more than zero")]
    ResumeAfterZero,
}

/// A non-retryable admission error: redelivering the message cannot fix it, so the
/// caller routes the message to the dead-letter step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// The queue's admission settings are invalid.
    #[error(transparent)]
    Config(#[from] AdmissionConfigError),
    /// Two request ids could not be compared (for example ids of different queues).
    #[error(transparent)]
    RequestId(#[from] RequestIdError),
    /// What was loaded contradicts itself or the rules (for example a processing
    /// request without a build plan, or a record of another queue).
    #[error("inconsistent admission state for {subject}: {detail}")]
    Inconsistent {
        /// The request or queue concerned.
        subject: String,
        /// What is wrong.
        detail: String,
    },
}

/// Why a message should be redelivered later, counting toward its delivery attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryReason {
    /// The ancestry of the request's revision against the last green could not be
    /// determined; nothing was claimed.
    Ancestry {
        /// The last green revision.
        ancestor: RevisionUri,
        /// The request's revision.
        descendant: RevisionUri,
        /// What the ancestry source reported.
        reason: String,
    },
}

/// Why a message goes straight to the dead-letter step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetterReason {
    /// The request named by the message does not exist.
    RequestMissing(RequestId),
    /// The queue of the request does not exist.
    QueueMissing(QueueName),
}

/// The final answer of a step for the message being handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Done: acknowledge the message.
    Ack,
    /// Redeliver after `delay` (or when a slot of the queue frees): the gate is
    /// closed, or (for a request that owns its slot) its build was published and
    /// has not heartbeated yet, so the message waits until the publication would
    /// go quiet. A hold never counts as a failed delivery attempt.
    Hold {
        /// The gate wait delay, or the time until the publication goes quiet.
        delay: Duration,
        /// Whether the gate is closed because the queue is paused (its limit is 0)
        /// rather than full.
        paused: bool,
    },
    /// Redeliver later; counts toward the message's delivery attempts.
    Retry(RetryReason),
    /// Route the message to the dead-letter step now.
    DeadLetter(DeadLetterReason),
    /// The request owns a slot and this delivery recorded a publication of its
    /// build: publish it with `generation`, then acknowledge. Every generation is
    /// answered to exactly one delivery; a duplicate delivery of a live publication
    /// is acked (or held until the build's first heartbeat) instead. If publishing fails, withdraw the publication
    /// (`decide_withdraw`) and retry the message: the redelivery publishes the next
    /// generation.
    Publish {
        /// The admitted request.
        request: Request,
        /// Its strategy and base.
        plan: BuildPlan,
        /// The generation this publication carries: the build heartbeats with it.
        generation: Generation,
    },
    /// A non-retryable error: route the message to the dead-letter step.
    Error(AdmissionError),
}

/// The queue writes admission makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueWrite {
    /// Ingest: the request becomes the newest head.
    StampLatest,
    /// Process: the request takes a slot (its id joins the owners, claimed now).
    Claim,
    /// The request gives up its own slot (its id leaves the owners).
    Release,
    /// Reconcile: owners whose request is terminal or missing, or that belong to
    /// another queue, are removed.
    Prune {
        /// The removed owners and why each went.
        pruned: Vec<Pruned>,
    },
    /// Heartbeat: an owner's slot lease runs again from now.
    Heartbeat,
    /// Process: a publication of the owner's build is recorded (the next
    /// generation, published now). Only the delivery that applies it publishes.
    Publish {
        /// The owner.
        id: RequestId,
        /// The generation it publishes.
        generation: Generation,
    },
    /// Withdraw: a publication whose publish failed is forgotten (its generation
    /// stays spent), so the next delivery publishes again at once.
    Withdraw,
    /// Reconcile: an owner whose lease ran out is marked expiring, covering every
    /// heartbeat before the mark; its request is failed next.
    MarkExpiring {
        /// The owner.
        id: RequestId,
    },
    /// The queue's slot limit is set (0 pauses it).
    SetLimit,
    /// Migration: processing requests admitted under an anonymous count join the owners.
    Backfill {
        /// The added owners.
        added: Vec<RequestId>,
    },
    /// Build outcome: a succeeded request newer than the last green becomes the
    /// last green bookmark (its uri and id). Written after the terminal write, so
    /// the bookmark only ever names a request stored as succeeded, and only moves
    /// forward in request order.
    RecordGreen,
}

/// The request writes admission makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestWrite {
    /// Rewrite the request unchanged, bumping its version, before releasing the slot
    /// of an accepted request that a newer head replaced. A delivery that read the
    /// request before the fence cannot mark it processing any more (its
    /// compare-and-set fails); one that reads it after the fence also reads the
    /// queue after it, and so sees the newer head. Record an applied fence in the
    /// [`ProcessMemo`].
    Fence,
    /// accepted -> superseded.
    Supersede,
    /// accepted -> processing, with the build plan written once.
    MarkProcessing,
    /// processing -> the terminal state of a build outcome.
    Finish(RequestState),
    /// Dead letter: accepted or processing -> failed ([`FailReason::DeadLettered`]).
    Fail,
    /// Reconcile: a live owner whose slot lease ran out -> failed
    /// ([`FailReason::SlotLeaseExpired`]); the prune that follows frees its slot.
    Expire,
}

/// One compare-and-set to attempt: the whole record, on the version that was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// `cas_queue(expected, &queue)`.
    Queue {
        /// What the write does.
        kind: QueueWrite,
        /// The version that was read.
        expected: Version,
        /// The whole new record (its version field is `expected.next()`).
        queue: Queue,
    },
    /// `cas_request(expected, &request)`.
    Request {
        /// What the write does.
        kind: RequestWrite,
        /// The version that was read.
        expected: Version,
        /// The whole new record (its version field is `expected.next()`).
        request: Request,
    },
}

/// Something a step needs loaded before it can decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// Load these requests (slot owners, for reconcile) and pass them in; a missing
    /// request is passed as `None`.
    Requests(Vec<RequestId>),
    /// Ask whether `ancestor` is an ancestor of `descendant` and pass the answer as
    /// an [`AncestryFact`].
    Ancestry {
        /// The last green revision.
        ancestor: RevisionUri,
        /// The request's revision.
        descendant: RevisionUri,
    },
}

/// What a step decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Attempt this write, then reload and decide again (whether it was applied or
    /// conflicted).
    Write(Write),
    /// Load this, then decide again.
    Need(Need),
    /// Stop and answer the message.
    Reply(Reply),
}

/// The answer of an ancestry source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AncestryAnswer {
    /// The last green is an ancestor: build incrementally from it.
    Ancestor,
    /// It is not an ancestor: build everything.
    NotAncestor,
    /// One of the revisions is unknown to the source: build everything.
    NotFound,
    /// The source failed; the message is retried and nothing is claimed.
    Failed(String),
}

/// An ancestry answer for one pair of revisions. Steps use it only if the pair still
/// matches the queue's last green and the request's revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AncestryFact {
    /// The revision asked about as the ancestor (the last green).
    pub ancestor: RevisionUri,
    /// The revision asked about as the descendant (the request).
    pub descendant: RevisionUri,
    /// What the source said.
    pub answer: AncestryAnswer,
}

/// Loaded requests keyed by id; `None` for a request that does not exist.
pub type LoadedRequests = BTreeMap<RequestId, Option<Request>>;

fn reply(reply: Reply) -> Decision {
    Decision::Reply(reply)
}

fn inconsistent(subject: impl ToString, detail: impl Into<String>) -> Decision {
    reply(Reply::Error(AdmissionError::Inconsistent {
        subject: subject.to_string(),
        detail: detail.into(),
    }))
}

/// Checks that a loaded request and queue belong together.
fn check_pair(request: &Request, queue: &Queue) -> Result<(), Decision> {
    if request.id.queue() != &queue.name {
        return Err(inconsistent(
            &request.id,
            format!("loaded with queue {}", queue.name),
        ));
    }
    Ok(())
}

/// Whether `id` is the latest head: not older than the queue's latest request.
fn is_head(id: &RequestId, queue: &Queue) -> Result<bool, Decision> {
    match &queue.latest_request_id {
        None => Ok(true),
        Some(latest) => match id.compare(latest) {
            Ok(order) => Ok(order != Ordering::Less),
            Err(e) => Err(reply(Reply::Error(e.into()))),
        },
    }
}

/// The write of `kind` that replaces `read` (the queue as loaded) with `next` (a
/// changed copy of it), on the version that was read.
fn write_queue(kind: QueueWrite, read: &Queue, mut next: Queue) -> Decision {
    next.version = read.version.next();
    Decision::Write(Write::Queue {
        kind,
        expected: read.version,
        queue: next,
    })
}

/// The queue with `id` removed from the owners, as a release write.
fn release(queue: &Queue, id: &RequestId) -> Decision {
    let mut next = queue.clone();
    next.owners.remove(id);
    write_queue(QueueWrite::Release, queue, next)
}

/// The write of `kind` that changes the slot of `id` in `queue` by `change`; `id`
/// owns a slot in every caller (it decided from that slot).
fn write_slot(
    kind: QueueWrite,
    queue: &Queue,
    id: &RequestId,
    change: impl FnOnce(&mut Slot),
) -> Decision {
    let mut next = queue.clone();
    match next.owners.get_mut(id) {
        Some(slot) => change(slot),
        None => return inconsistent(id, "a slot write without a slot"),
    }
    write_queue(kind, queue, next)
}

/// The request and its queue as loaded (request first), checked to belong
/// together; `Err` with an ack when either is missing.
fn loaded_pair<'a>(
    request: Option<&'a Request>,
    queue: Option<&'a Queue>,
) -> Result<(&'a Request, &'a Queue), Decision> {
    let (Some(request), Some(queue)) = (request, queue) else {
        return Err(reply(Reply::Ack));
    };
    check_pair(request, queue)?;
    Ok((request, queue))
}

/// The request moved to `state` by a write of `kind`, on the version that was read.
fn write_request(request: &Request, kind: RequestWrite, state: RequestState) -> Decision {
    let mut next = request.clone();
    next.state = state;
    next.reason = match kind {
        RequestWrite::Fail => Some(FailReason::DeadLettered),
        RequestWrite::Expire => Some(FailReason::SlotLeaseExpired),
        _ => request.reason,
    };
    next.version = request.version.next();
    Decision::Write(Write::Request {
        kind,
        expected: request.version,
        request: next,
    })
}
