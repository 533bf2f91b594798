//! Reconcile (prune owners whose request is terminal or missing, or of another
//! queue) and the backfill
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
    // An id of another queue's request never owns a slot here: pruned unread
    // (an error instead would close the gate for good, and nothing removed it).
    let (foreign, own): (Vec<&RequestId>, Vec<&RequestId>) = queue
        .owners
        .iter()
        .partition(|id| id.queue() != &queue.name);
    let missing: Vec<RequestId> = own
        .iter()
        .filter(|id| !loaded.contains_key(**id))
        .map(|id| (*id).clone())
        .collect();
    if !missing.is_empty() {
        return Err(Decision::Need(Need::Requests(missing)));
    }
    let foreign: Vec<RequestId> = foreign.into_iter().cloned().collect();
    let mut pruned = foreign.clone();
    for id in own {
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
        kind: QueueWrite::Prune { pruned, foreign },
        expected: queue.version,
        queue: next,
    })))
}

/// Decides a reconcile pass over `queue`: asks for the owners' requests not in
/// `owners`, then prunes the owners whose request is terminal or missing (and, at
/// once, owners that are another queue's requests), or acks when all are live. The process step runs the same rule before every closed-gate
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::ids::{QueueName, RevisionUri};
    use crate::request::Version;

    fn name(q: &str) -> QueueName {
        QueueName::new(q).expect("queue")
    }

    fn request(id: &RequestId, state: RequestState) -> Request {
        Request {
            id: id.clone(),
            uri: RevisionUri::new(format!("rev-{}", id.seq())).expect("uri"),
            state,
            plan: None,
            version: Version::FIRST,
        }
    }

    #[test]
    fn an_owner_of_another_queue_is_pruned_unread_beside_dead_owners() {
        let mut queue = Queue::new(name("main"));
        let foreign = RequestId::new(name("other"), 7);
        let (live, done) = (
            RequestId::new(name("main"), 1),
            RequestId::new(name("main"), 2),
        );
        queue
            .owners
            .extend([foreign.clone(), live.clone(), done.clone()]);
        // The foreign id is never asked for.
        assert_eq!(
            decide_reconcile(&queue, &BTreeMap::new()),
            Decision::Need(Need::Requests(vec![live.clone(), done.clone()]))
        );
        let loaded: LoadedRequests = [
            (live.clone(), Some(request(&live, RequestState::Processing))),
            (done.clone(), Some(request(&done, RequestState::Succeeded))),
        ]
        .into_iter()
        .collect();
        let Decision::Write(Write::Queue {
            kind, queue: next, ..
        }) = decide_reconcile(&queue, &loaded)
        else {
            panic!("a prune write");
        };
        assert_eq!(
            kind,
            QueueWrite::Prune {
                pruned: vec![foreign.clone(), done],
                foreign: vec![foreign],
            }
        );
        assert_eq!(next.owners.into_iter().collect::<Vec<_>>(), vec![live]);
    }
}
