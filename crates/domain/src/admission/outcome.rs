//! The build outcome and dead-letter steps: release the slot by id, then write the
//! terminal state.
//!
//! Releasing first matters: once a request is terminal, nothing but reconcile looks
//! at it again, so a crash between a terminal write and a later release would leak
//! the slot until the next reconcile. A crash between the release and the terminal
//! write instead leaves a processing request without a slot; the redelivered
//! message finds its id absent (a no-op release) and writes the terminal state.

// Private helpers return a whole `Decision` as their early exit; it is moved once
// and never stored, so boxing it would only add allocations.
#![allow(clippy::result_large_err)]

use super::{Decision, Reply, RequestWrite, check_pair, release, reply, write_request};
use crate::request::{Queue, Request, RequestState};

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
///   slot (normally absent), else ack;
/// - processing and owning a slot: release by id (a queue write);
/// - processing without a slot (released already, or the queue is missing): write
///   the terminal state of `outcome`.
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
    let owned = queue.filter(|q| q.owners.contains(&request.id));
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
        _ => match owned {
            Some(queue) => release(queue, &request.id),
            None => reply(Reply::Ack),
        },
    }
}

/// Decides the dead-letter step for a request, given the request and its queue as
/// loaded now (request first).
///
/// - request missing: [`Reply::Ack`];
/// - terminal (including superseded): release its id if it still owns a slot
///   (normally absent), else ack;
/// - accepted or processing and owning a slot: release by id;
/// - accepted or processing without a slot: write `failed`.
pub fn decide_dead_letter(request: Option<&Request>, queue: Option<&Queue>) -> Decision {
    let Some(request) = request else {
        return reply(Reply::Ack);
    };
    if let Some(Err(decision)) = queue.map(|q| check_pair(request, q)) {
        return decision;
    }
    let owned = queue.filter(|q| q.owners.contains(&request.id));
    match (request.state.is_terminal(), owned) {
        (_, Some(queue)) => release(queue, &request.id),
        (false, None) => write_request(request, RequestWrite::Fail, RequestState::Failed),
        (true, None) => reply(Reply::Ack),
    }
}
