//! The build outcome and dead-letter steps. Both write the terminal state first
//! (the fence), then release the slot by id; an outcome then records a succeeded
//! request as the queue's last green.
//!
//! Terminal first matters: while a request is processing it must own its slot. If
//! the slot were released first, a process delivery holding an older "accepted"
//! read of the request would find exactly the state of a head never admitted,
//! claim a fresh slot and publish the ended build again. With the terminal state
//! written first, such a claim lands on a terminal request, whose next decision
//! releases it. A crash between the terminal write and the release leaves a
//! terminal owner, which the redelivered message releases, and which every
//! reconcile (one runs before every closed-gate decision) prunes.
//!
//! The green record comes last and is decided from the stored state alone: a
//! redelivered outcome for a request already stored as succeeded records the green
//! a crash after the terminal write left unrecorded, whatever outcome the message
//! itself carries (first terminal writer wins).

// Private helpers return a whole `Decision` as their early exit; it is moved once
// and never stored, so boxing it would only add allocations.
#![allow(clippy::result_large_err)]

use std::cmp::Ordering;

use super::{
    Decision, QueueWrite, Reply, RequestWrite, check_pair, release, reply, write_queue,
    write_request,
};
use crate::request::{LastGreen, Queue, Request, RequestState};

/// The terminal result of a build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BuildOutcome {
    /// The build passed.
    Succeeded,
    /// The build failed.
    Failed,
    /// The build was cancelled.
    Cancelled,
}

impl BuildOutcome {
    /// The terminal request state this outcome writes.
    pub fn state(self) -> RequestState {
        match self {
            BuildOutcome::Succeeded => RequestState::Succeeded,
            BuildOutcome::Failed => RequestState::Failed,
            BuildOutcome::Cancelled => RequestState::Cancelled,
        }
    }
}

/// Decides the build outcome step for a request, given the request and its queue
/// as loaded now (request first).
///
/// - request missing, or still accepted (no build was admitted): [`Reply::Ack`];
/// - processing: write the terminal state of `outcome` (a compare-and-set on the
///   request);
/// - terminal: the first terminal writer won; release its id if it still owns a
///   slot; else, if it is stored as succeeded and newer than the queue's last
///   green (or there is none), record it as the last green
///   ([`QueueWrite::RecordGreen`]); else ack. Superseded, failed and cancelled
///   requests never move the bookmark, and an older success never moves it back.
///
/// So a succeeded outcome runs terminal write, release, green record, ack; each
/// step is re-decided from a fresh read, so a crash between any two of them heals
/// on redelivery.
pub fn decide_outcome(
    request: Option<&Request>,
    queue: Option<&Queue>,
    outcome: BuildOutcome,
) -> Decision {
    let Some(request) = request else {
        return reply(Reply::Ack);
    };
    if let Some(Err(decision)) = queue.map(|q| check_pair(request, q)) {
        return decision;
    }
    let owned = queue.filter(|q| q.owners.contains_key(&request.id));
    match request.state {
        RequestState::Accepted => reply(Reply::Ack),
        RequestState::Processing => write_request(
            request,
            RequestWrite::Finish(outcome.state()),
            outcome.state(),
        ),
        RequestState::Succeeded => match (owned, queue) {
            (Some(queue), _) => release(queue, &request.id),
            (None, Some(queue)) => record_green(request, queue),
            (None, None) => reply(Reply::Ack),
        },
        RequestState::Superseded | RequestState::Failed | RequestState::Cancelled => match owned {
            Some(queue) => release(queue, &request.id),
            None => reply(Reply::Ack),
        },
    }
}

/// Records the succeeded `request` as the last green of `queue` if it is newer than
/// the current bookmark (or there is none); acks if the bookmark already names this
/// request or a newer one, so the bookmark only moves forward and a redelivery is a
/// no-op.
fn record_green(request: &Request, queue: &Queue) -> Decision {
    if let Some(green) = &queue.last_green {
        match request.id.compare(&green.request_id) {
            Ok(Ordering::Greater) => {}
            Ok(Ordering::Less | Ordering::Equal) => return reply(Reply::Ack),
            Err(e) => return reply(Reply::Error(e.into())),
        }
    }
    let mut next = queue.clone();
    next.last_green = Some(LastGreen {
        uri: request.uri.clone(),
        request_id: request.id.clone(),
    });
    write_queue(QueueWrite::RecordGreen, queue, next)
}

/// Decides the dead-letter step for a request, given the request and its queue as
/// loaded now (request first).
///
/// - request missing: [`Reply::Ack`];
/// - accepted or processing: write `failed`
///   ([`crate::request::FailReason::DeadLettered`]) first, whether or not it owns a
///   slot. That compare-and-set is the fence: a process delivery that read the
///   request before it cannot mark it processing any more, and one that reads it
///   after finds it terminal (and releases a slot it claimed meanwhile);
/// - terminal (including superseded): release its id if it still owns a slot (the
///   second write of a dead letter, or a missed release), else ack.
///
/// A crash between the two writes leaves a failed request owning its slot: the
/// redelivered dead letter releases it, and so does any reconcile.
pub fn decide_dead_letter(request: Option<&Request>, queue: Option<&Queue>) -> Decision {
    let Some(request) = request else {
        return reply(Reply::Ack);
    };
    if let Some(Err(decision)) = queue.map(|q| check_pair(request, q)) {
        return decision;
    }
    if !request.state.is_terminal() {
        return write_request(request, RequestWrite::Fail, RequestState::Failed);
    }
    match queue.filter(|q| q.owners.contains_key(&request.id)) {
        Some(queue) => release(queue, &request.id),
        None => reply(Reply::Ack),
    }
}
