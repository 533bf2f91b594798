//! The process (admit) step: supersede older heads, resume an own claim, gate,
//! claim, mark processing, publish.

// Private helpers return a whole `Decision` as their early exit; it is moved once
// and never stored, so boxing it would only add allocations.
#![allow(clippy::result_large_err)]

use super::heartbeat::refresh;
use super::reconcile::{mark_expiring, prune_decision};
use super::{
    AdmissionConfig, AncestryAnswer, AncestryFact, DeadLetterReason, Decision, LoadedRequests,
    Need, QueueWrite, Reply, RequestWrite, RetryReason, Write, check_pair, inconsistent, is_head,
    release, reply, write_queue, write_request, write_slot,
};
use crate::request::{
    BuildPlan, BuildStrategy, Generation, Queue, Request, RequestId, RequestState, Slot, Version,
};
use crate::timestamp::Timestamp;
use std::time::Duration;

/// What one delivery of a process message remembers between its own decisions:
/// the fence it wrote and the publication it recorded, if any. Start each delivery
/// with a fresh memo, and call [`ProcessMemo::record_applied`] after every write
/// that was applied. A crash loses the memo, which is safe: the redelivery fences
/// again, and a publication it recorded but never published goes quiet and is
/// published again with the next generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessMemo {
    fenced: Option<(RequestId, Version)>,
    published: Option<(RequestId, Generation)>,
}

impl ProcessMemo {
    /// A memo for a new delivery.
    pub fn new() -> Self {
        ProcessMemo::default()
    }

    /// Records a write that the store applied.
    pub fn record_applied(&mut self, write: &Write) {
        match write {
            Write::Request {
                kind: RequestWrite::Fence,
                request,
                ..
            } => self.fenced = Some((request.id.clone(), request.version)),
            Write::Queue {
                kind: QueueWrite::Publish { id, generation },
                ..
            } => self.published = Some((id.clone(), *generation)),
            _ => {}
        }
    }

    /// Whether this delivery recorded the publication of `generation` of `id`.
    fn published(&self, id: &RequestId, generation: Generation) -> bool {
        self.published
            .as_ref()
            .is_some_and(|(mine, g)| mine == id && *g == generation)
    }

    /// Whether this delivery fenced `request` (loaded accepted and not the head) at
    /// a version not newer than the loaded one.
    ///
    /// Not only "nobody wrote it since": a concurrent delivery of the same request
    /// may fence it again in between, and demanding the exact version would make
    /// two deliveries fence each other forever (each re-fencing after the other's
    /// fence, none releasing). Any later version is as good as our own fence:
    /// versions only grow, and once our fence applied, every delivery that reads
    /// the request also reads the queue after it and sees the newer head, so while
    /// the request is still accepted every write to it after our fence is another
    /// fence (a supersede or fail would end the accepted state; a mark from a read
    /// before our fence fails its compare-and-set). So no delivery can mark it
    /// processing any more, and releasing its slot is safe.
    fn fenced(&self, request: &Request) -> bool {
        self.fenced
            .as_ref()
            .is_some_and(|(id, version)| *id == request.id && *version <= request.version)
    }
}

/// Everything the process step reads.
#[derive(Debug, Clone, Copy)]
pub struct ProcessInput<'a> {
    /// The request named by the message.
    pub id: &'a RequestId,
    /// The request as loaded now (loaded before the queue).
    pub request: Option<&'a Request>,
    /// Its queue as loaded now.
    pub queue: Option<&'a Queue>,
    /// Requests of slot owners loaded on a [`Need::Requests`]; may be stale, since a
    /// terminal or missing request stays so. Keep them across iterations, but
    /// replace an owner's copy after a request write to it applied, and drop it
    /// after one conflicted: a stale copy would make the same compare-and-set
    /// conflict every round.
    pub owners: &'a LoadedRequests,
    /// The ancestry answer obtained on a [`Need::Ancestry`], if any.
    pub ancestry: Option<&'a AncestryFact>,
    /// This delivery's memo.
    pub memo: &'a ProcessMemo,
    /// The time now: a claim starts its slot lease here, and reconcile expires
    /// owners whose lease ran out by then.
    pub now: Timestamp,
}

/// Decides the next move of a process (admit) delivery.
///
/// In order:
/// 1. invalid config -> [`Reply::Error`]; missing request or queue ->
///    [`Reply::DeadLetter`];
/// 2. terminal: release its id if it still owns a slot (a lost mark race against
///    a terminal writer), else ack;
/// 3. processing without a slot -> ack (its slot was released by an outcome or
///    dead-letter chain, which writes its terminal state); owning one (also when
///    a newer head exists: processing requests are never superseded):
///    - a slot whose lease ran out is expired as reconcile does (marked, then the
///      request failed, then released on the next delivery or reconcile);
///    - a publication this delivery recorded -> [`Reply::Publish`] with its
///      generation;
///    - a live publication (published or heartbeated within `resume_after`):
///      a duplicate delivery publishes nothing. It acks once the build
///      heartbeated since its publication; before that it holds until the
///      publication would go quiet (the delivery that recorded it may have died
///      before handing it over: then this message publishes the next generation);
///    - nothing published, or a publication gone quiet -> record the next
///      generation ([`QueueWrite::Publish`], a compare-and-set on the queue, so
///      exactly one delivery publishes each generation);
/// 4. accepted and older than the latest head: owning a slot -> fence, then
///    release, then supersede (release before supersede); else supersede. This
///    happens even with the gate closed;
/// 5. accepted head owning a slot (a crash between claim and mark): resume,
///    without the gate: refresh its slot's heartbeat if its lease ran out (unless
///    a reconcile marked it expiring: then fail it), mark processing with the
///    plan, then publish as in 3;
/// 6. accepted head without a slot: gate on |owners| < the queue's limit
///    ([`Queue::limit`]; 0 pauses the queue: [`Reply::Hold`] with `paused`).
///    Closed -> reconcile first ([`super::decide_reconcile`]: expire owners whose
///    slot lease ran out, prune terminal or missing ones and ids of another queue),
///    then [`Reply::Hold`] with the gate wait delay if none could be freed. Open ->
///    determine the plan (asking for ancestry when there is a last green; an
///    ancestry failure is a [`Reply::Retry`] before any claim), then claim by
///    adding the id.
///
/// A failed mark is never compensated: the redelivery resumes (step 5) and the
/// dead-letter step releases. A lost mark race against a delivery that marked the
/// request processing lands in step 3 and keeps the slot.
pub fn decide_process(config: &AdmissionConfig, input: &ProcessInput<'_>) -> Decision {
    if let Err(e) = config.validate() {
        return reply(Reply::Error(e.into()));
    }
    let Some(request) = input.request else {
        return reply(Reply::DeadLetter(DeadLetterReason::RequestMissing(
            input.id.clone(),
        )));
    };
    let Some(queue) = input.queue else {
        return reply(Reply::DeadLetter(DeadLetterReason::QueueMissing(
            input.id.queue().clone(),
        )));
    };
    if request.id != *input.id {
        return inconsistent(input.id, format!("loaded request {}", request.id));
    }
    if let Err(decision) = check_pair(request, queue) {
        return decision;
    }
    let slot = queue.owners.get(&request.id);
    match (request.state, slot) {
        (RequestState::Processing, None) => reply(Reply::Ack),
        (RequestState::Processing, Some(slot)) => processing(config, input, request, queue, slot),
        (RequestState::Accepted, _) => accepted(config, input, request, queue, slot),
        (_, Some(_)) => release(queue, &request.id),
        (_, None) => reply(Reply::Ack),
    }
}

/// Step 3 for a processing owner: expire, publish, or ack a duplicate.
fn processing(
    config: &AdmissionConfig,
    input: &ProcessInput<'_>,
    request: &Request,
    queue: &Queue,
    slot: &Slot,
) -> Decision {
    let Some(plan) = &request.plan else {
        return inconsistent(&request.id, "processing without a build plan");
    };
    if slot.expiring {
        return write_request(request, RequestWrite::Expire, RequestState::Failed);
    }
    if slot.expired(config.slot_lease, input.now) {
        return mark_expiring(queue, &request.id);
    }
    if input.memo.published(&request.id, slot.generation) {
        return reply(Reply::Publish {
            request: request.clone(),
            plan: plan.clone(),
            generation: slot.generation,
        });
    }
    if slot.quiet(config.resume_after, input.now) {
        return publish(queue, &request.id, slot, input.now);
    }
    if slot.confirmed() {
        return reply(Reply::Ack);
    }
    // Published, but no heartbeat since: the delivery that recorded it may have
    // died before handing it over. This message comes back when the publication
    // would go quiet, and publishes the next generation unless the build
    // heartbeated by then: any at-least-once source recovers the build, not only
    // one that scans for quiet owners.
    let due = slot.resume_due(config.resume_after);
    reply(Reply::Hold {
        delay: Duration::from_millis(due.as_millis().saturating_sub(input.now.as_millis()).max(1)),
        paused: false,
    })
}

/// The publication write: the next generation of `id`'s build, published `now`.
fn publish(queue: &Queue, id: &RequestId, slot: &Slot, now: Timestamp) -> Decision {
    let generation = slot.generation.next();
    let kind = QueueWrite::Publish {
        id: id.clone(),
        generation,
    };
    write_slot(kind, queue, id, |slot| {
        slot.generation = generation;
        slot.published_at = Some(now);
    })
}

fn accepted(
    config: &AdmissionConfig,
    input: &ProcessInput<'_>,
    request: &Request,
    queue: &Queue,
    slot: Option<&Slot>,
) -> Decision {
    let owned = slot.is_some();
    let head = match is_head(&request.id, queue) {
        Ok(head) => head,
        Err(decision) => return decision,
    };
    if !head {
        if !owned {
            return write_request(request, RequestWrite::Supersede, RequestState::Superseded);
        }
        if input.memo.fenced(request) {
            return release(queue, &request.id);
        }
        return write_request(request, RequestWrite::Fence, RequestState::Accepted);
    }
    if let Some(slot) = slot {
        // A reconcile found the lease run out first: it is failed, not resumed.
        if slot.expiring {
            return write_request(request, RequestWrite::Expire, RequestState::Failed);
        }
        // A claim older than the slot lease (its worker crashed before the mark,
        // and the message came back late): the lease runs again from now before
        // the build is published, or the next reconcile would fail it at once.
        if slot.expired(config.slot_lease, input.now) {
            return refresh(queue, &request.id, input.now);
        }
        return match plan(request, queue, input.ancestry) {
            Ok(plan) => {
                let mut next = request.clone();
                next.state = RequestState::Processing;
                next.plan = Some(plan);
                next.version = request.version.next();
                Decision::Write(Write::Request {
                    kind: RequestWrite::MarkProcessing,
                    expected: request.version,
                    request: next,
                })
            }
            Err(decision) => decision,
        };
    }
    let limit = queue.limit(config.max_concurrent);
    if limit == 0 {
        return reply(Reply::Hold {
            delay: config.gate_wait_delay,
            paused: true,
        });
    }
    if queue.owners.len() >= usize::try_from(limit).unwrap_or(usize::MAX) {
        return match prune_decision(queue, input.owners, config.slot_lease, input.now) {
            Ok(Some(decision)) => decision,
            Ok(None) => reply(Reply::Hold {
                delay: config.gate_wait_delay,
                paused: false,
            }),
            Err(decision) => decision,
        };
    }
    if let Err(decision) = plan(request, queue, input.ancestry) {
        return decision;
    }
    let mut next = queue.clone();
    next.owners
        .insert(request.id.clone(), Slot::claimed(input.now));
    write_queue(QueueWrite::Claim, queue, next)
}

/// The build plan: full without a last green or when it is not an ancestor,
/// incremental from the last green when it is.
fn plan(
    request: &Request,
    queue: &Queue,
    ancestry: Option<&AncestryFact>,
) -> Result<BuildPlan, Decision> {
    let Some(green) = &queue.last_green else {
        return Ok(BuildPlan {
            strategy: BuildStrategy::Full,
            base: None,
        });
    };
    let fact = ancestry.filter(|f| f.ancestor == green.uri && f.descendant == request.uri);
    let Some(fact) = fact else {
        return Err(Decision::Need(Need::Ancestry {
            ancestor: green.uri.clone(),
            descendant: request.uri.clone(),
        }));
    };
    match &fact.answer {
        AncestryAnswer::Ancestor => Ok(BuildPlan {
            strategy: BuildStrategy::IncrementalSinceGreen,
            base: Some(green.uri.clone()),
        }),
        AncestryAnswer::NotAncestor | AncestryAnswer::NotFound => Ok(BuildPlan {
            strategy: BuildStrategy::Full,
            base: None,
        }),
        AncestryAnswer::Failed(reason) => Err(reply(Reply::Retry(RetryReason::Ancestry {
            ancestor: fact.ancestor.clone(),
            descendant: fact.descendant.clone(),
            reason: reason.clone(),
        }))),
    }
}
