//! Reconcile (prune owners whose request is terminal or missing) and the backfill
//! that migrates a queue from an anonymous in-flight count to owner ids.

// Private helpers return a whole `Decision` as their early exit; it is moved once
// and never stored, so boxing it would only add allocations.
#![allow(clippy::result_large_err)]

use super::{Decision, LoadedRequests, Need, QueueWrite, Reply, Write, inconsistent, reply};
use crate::request::{Queue, Request, RequestId, RequestState};

/// The prune write for `queue`, `Ok(None)` if every owner is live, or the decision
/// to load the owners not in `loaded` first.
pub(super) fn prune_decision(
    queue: &Queue,
    loaded: &LoadedRequests,
) -> Result<Option<Decision>, Decision> {
    let missing: Vec<RequestId> = queue
        .owners
        .iter()
        .filter(|id| !loaded.contains_key(*id))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(Decision::Need(Need::Requests(missing)));
    }
    let mut pruned = Vec::new();
    for id in &queue.owners {
        if id.queue() != &queue.name {
            return Err(inconsistent(
                &queue.name,
                format!("owner {id} belongs to another queue"),
            ));
        }
        match loaded.get(id) {
            Some(Some(owner)) if !owner.state.is_terminal() => {}
            _ => pruned.push(id.clone()),
        }
    }
    if pruned.is_empty() {
        return Ok(None);
    }
    let mut next = queue.clone();
    for id in &pruned {
        next.owners.remove(id);
    }
    next.version = queue.version.next();
    Ok(Some(Decision::Write(Write::Queue {
        kind: QueueWrite::Prune { pruned },
        expected: queue.version,
        queue: next,
    })))
}

/// Decides a reconcile pass over `queue`: asks for the owners' requests not in
/// `owners`, then prunes the owners whose request is terminal or missing, or acks
/// when all are live. The process step runs the same rule before every closed-gate
/// decision, so a missed release heals itself.
pub fn decide_reconcile(queue: &Queue, owners: &LoadedRequests) -> Decision {
    match prune_decision(queue, owners) {
        Ok(Some(decision)) | Err(decision) => decision,
        Ok(None) => reply(Reply::Ack),
    }
}

/// Decides the migration of `queue` from an anonymous in-flight count: every
/// processing request of the queue among `requests` (for example all of the
/// queue's requests from `list_requests`) joins the owners. Acks when none is
/// missing. Run it with the old binaries stopped: old and new code must never gate
/// at once on different representations.
pub fn decide_backfill(queue: &Queue, requests: &[Request]) -> Decision {
    let mut added = Vec::new();
    for request in requests {
        if request.id.queue() != &queue.name {
            return inconsistent(&request.id, format!("listed for queue {}", queue.name));
        }
        if request.state == RequestState::Processing && !queue.owners.contains(&request.id) {
            added.push(request.id.clone());
        }
    }
    if added.is_empty() {
        return reply(Reply::Ack);
    }
    let mut next = queue.clone();
    next.owners.extend(added.iter().cloned());
    next.version = queue.version.next();
    Decision::Write(Write::Queue {
        kind: QueueWrite::Backfill { added },
        expected: queue.version,
        queue: next,
    })
}
