//! The build outcome and dead-letter steps. A build outcome releases the slot by
//! id, then writes the terminal state, then records a succeeded request as the
//! queue's last green; a dead letter writes `failed` first (its fence), then
//! releases.
//!
//! For an outcome, releasing first matters: once a request is terminal, nothing but
//! reconcile looks at it again, so a crash between a terminal write and a later
//! release would hold the slot until the next reconcile. A crash between the release and the terminal
//! write instead leaves a processing request without a slot; the redelivered
//! message finds its id absent (a no-op release) and writes the terminal state.
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
/// - terminal: the first terminal writer won; release its id if it still owns a
///   slot (normally absent); else, if it is stored as succeeded and newer than the
///   queue's last green (or there is none), record it as the last green
///   ([`QueueWrite::RecordGreen`]); else ack. Superseded, failed and cancelled
///   requests never move the bookmark, and an older success never moves it back;
/// - processing and owning a slot: release by id (a queue write);
/// - processing without a slot (released already, or the queue is missing): write
///   the terminal state of `outcome`.
///
/// So a succeeded outcome runs release, terminal write, green record, ack; each
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
        RequestState::Processing => match owned {
            Some(queue) => release(queue, &request.id),
            None => write_request(
                request,
                RequestWrite::Finish(outcome.state()),
                outcome.state(),
            ),
        },
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
