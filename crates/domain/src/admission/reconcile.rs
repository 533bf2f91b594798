//! Reconcile (expire owners whose slot lease ran out; prune owners whose request
//! is terminal or missing, or of another queue) and the backfill that migrates a
//! queue from an anonymous in-flight count to owner ids.

// Private helpers return a whole `Decision` as their early exit; it is moved once
// and never stored, so boxing it would only add allocations.
#![allow(clippy::result_large_err)]

use std::time::Duration;

use super::{
    Decision, LoadedRequests, Need, QueueWrite, Reply, RequestWrite, inconsistent, reply,
    write_queue, write_request, write_slot,
};
use crate::request::{FailReason, Queue, Request, RequestId, RequestState, Slot};
use crate::timestamp::Timestamp;

/// An owner a reconcile removed, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pruned {
    /// The removed owner.
    pub id: RequestId,
    /// Why it could not own a slot any more.
    pub why: PrunedWhy,
}

/// Why an owner was pruned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrunedWhy {
    /// A request of another queue: it can never own a slot here, and how it got in
    /// is worth a warning.
    Foreign,
    /// No such request is stored.
    Missing,
    /// The request is terminal (a missed release, or an owner whose slot lease ran
    /// out and that reconcile failed with [`FailReason::SlotLeaseExpired`]).
    Terminal {
        /// Its terminal state.
        state: RequestState,
        /// Why admission failed it, if it did.
        reason: Option<FailReason>,
    },
}

/// The next reconcile write for `queue` at `now` with slot lease `lease`,
/// `Ok(None)` if every owner is live and within its lease, or the decision to load
/// the owners not in `loaded` first.
///
/// A live owner whose lease ran out is marked expiring first
/// ([`QueueWrite::MarkExpiring`], a compare-and-set on the queue: a heartbeat that
/// landed after the queue was read makes it conflict, and every heartbeat after it
/// finds the mark and is told the lease ran out), then failed
/// ([`RequestWrite::Expire`], a compare-and-set on the request, so a delivery that
/// read it before cannot mark it processing afterwards); the prune that follows
/// removes it with the other terminal owners. A crash between any two leaves a
/// marked or terminal owner, which the next reconcile carries on with.
pub(super) fn prune_decision(
    queue: &Queue,
    loaded: &LoadedRequests,
    lease: Duration,
    now: Timestamp,
) -> Result<Option<Decision>, Decision> {
    // An id of another queue's request never owns a slot here: pruned unread
    // (an error instead would close the gate for good, and nothing removed it).
    let (foreign, own): (Vec<&RequestId>, Vec<&RequestId>) = queue
        .owners
        .keys()
        .partition(|id| id.queue() != &queue.name);
    let missing: Vec<RequestId> = own
        .iter()
        .filter(|id| !loaded.contains_key(**id))
        .map(|id| (*id).clone())
        .collect();
    if !missing.is_empty() {
        return Err(Decision::Need(Need::Requests(missing)));
    }
    let mut pruned: Vec<Pruned> = foreign
        .into_iter()
        .map(|id| Pruned {
            id: id.clone(),
            why: PrunedWhy::Foreign,
        })
        .collect();
    for (id, slot) in queue
        .owners
        .iter()
        .filter(|(id, _)| id.queue() == &queue.name)
    {
        match loaded.get(id) {
            Some(Some(owner)) if !owner.state.is_terminal() => {
                if slot.expiring {
                    return Ok(Some(write_request(
                        owner,
                        RequestWrite::Expire,
                        RequestState::Failed,
                    )));
                }
                if slot.expired(lease, now) {
                    return Ok(Some(mark_expiring(queue, id)));
                }
            }
            Some(Some(owner)) => pruned.push(Pruned {
                id: id.clone(),
                why: PrunedWhy::Terminal {
                    state: owner.state,
                    reason: owner.reason,
                },
            }),
            _ => pruned.push(Pruned {
                id: id.clone(),
                why: PrunedWhy::Missing,
            }),
        }
    }
    if pruned.is_empty() {
        return Ok(None);
    }
    let mut next = queue.clone();
    for p in &pruned {
        next.owners.remove(&p.id);
    }
    Ok(Some(write_queue(QueueWrite::Prune { pruned }, queue, next)))
}

/// The mark that starts an expiry: the slot of `id` in `queue` is expiring.
pub(super) fn mark_expiring(queue: &Queue, id: &RequestId) -> Decision {
    write_slot(
        QueueWrite::MarkExpiring { id: id.clone() },
        queue,
        id,
        |slot| {
            slot.expiring = true;
        },
    )
}

/// The owners of `queue` a delivery should process at `now`: those neither
/// published nor heartbeated within `resume_after` (an owner never published
/// counts from its claim), to publish their build again, and those a reconcile
/// marked expiring, to finish failing them. What a delivery source redelivers,
/// beside the accepted requests, so that a build lost with its worker restarts
/// after `resume_after` and an interrupted expiry completes.
pub fn quiet_owners(queue: &Queue, resume_after: Duration, now: Timestamp) -> Vec<RequestId> {
    queue
        .owners
        .iter()
        .filter(|(id, slot)| {
            id.queue() == &queue.name && (slot.expiring || now >= slot.resume_due(resume_after))
        })
        .map(|(id, _)| id.clone())
        .collect()
}

/// Decides a reconcile pass over `queue` at `now` with slot lease `lease`: asks
/// for the owners' requests not in `owners`, fails live owners whose lease ran out
/// (a mark and a failure each), then prunes the owners whose request is terminal or missing
/// (and, at once, owners that are another queue's requests), or acks when all are
/// live and within their lease. The process step runs the same rule before every
/// closed-gate decision, so a missed release or a lost build outcome heals itself.
///
/// The caller keeps `owners` current: after an applied request write, the written
/// request replaces its loaded copy.
pub fn decide_reconcile(
    queue: &Queue,
    owners: &LoadedRequests,
    lease: Duration,
    now: Timestamp,
) -> Decision {
    match prune_decision(queue, owners, lease, now) {
        Ok(Some(decision)) | Err(decision) => decision,
        Ok(None) => reply(Reply::Ack),
    }
}

/// Decides the migration of `queue` from an anonymous in-flight count: every
/// processing request of the queue among `requests` (for example all of the
/// queue's requests from `list_requests`) joins the owners. Acks when none is
/// missing; the added owners' slot leases start at `now`, and their running
/// builds count as published at `now` with [`crate::request::Generation::NONE`]. Run it with the old
/// binaries stopped: old and new code must never gate at once on different
/// representations.
pub fn decide_backfill(queue: &Queue, requests: &[Request], now: Timestamp) -> Decision {
    let mut added = Vec::new();
    for request in requests {
        if request.id.queue() != &queue.name {
            return inconsistent(&request.id, format!("listed for queue {}", queue.name));
        }
        if request.state == RequestState::Processing && !queue.owners.contains_key(&request.id) {
            added.push(request.id.clone());
        }
    }
    if added.is_empty() {
        return reply(Reply::Ack);
    }
    let mut next = queue.clone();
    // Their claim time is unknown: their slot lease starts now. Their builds run
    // already: they count as published now, without a generation (the one their
    // heartbeats carry), and are published again only once they go quiet.
    next.owners.extend(added.iter().map(|id| {
        let slot = Slot {
            published_at: Some(now),
            ..Slot::claimed(now)
        };
        (id.clone(), slot)
    }));
    write_queue(QueueWrite::Backfill { added }, queue, next)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::Write;
    use super::*;
    use crate::ids::{QueueName, RevisionUri};
    use crate::request::Version;

    fn name(q: &str) -> QueueName {
        QueueName::new(q).expect("queue")
    }

    const LEASE: Duration = Duration::from_secs(60);

    fn request(id: &RequestId, state: RequestState) -> Request {
        Request {
            id: id.clone(),
            uri: RevisionUri::new(format!("rev-{}", id.seq())).expect("uri"),
            state,
            plan: None,
            reason: None,
            ingested_at: crate::Timestamp::from_millis(0),
            version: Version::FIRST,
        }
    }

    fn at(secs: u64) -> Timestamp {
        Timestamp::from_millis(secs * 1_000)
    }

    #[test]
    fn an_owner_of_another_queue_is_pruned_unread_beside_dead_owners() {
        let mut queue = Queue::new(name("main"));
        let foreign = RequestId::new(name("other"), 7);
        let (live, done) = (
            RequestId::new(name("main"), 1),
            RequestId::new(name("main"), 2),
        );
        queue.owners.extend(
            [foreign.clone(), live.clone(), done.clone()].map(|id| (id, Slot::claimed(at(0)))),
        );
        // The foreign id is never asked for.
        assert_eq!(
            decide_reconcile(&queue, &BTreeMap::new(), LEASE, at(1)),
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
        }) = decide_reconcile(&queue, &loaded, LEASE, at(1))
        else {
            panic!("a prune write");
        };
        assert_eq!(
            kind,
            QueueWrite::Prune {
                pruned: vec![
                    Pruned {
                        id: foreign,
                        why: PrunedWhy::Foreign
                    },
                    Pruned {
                        id: done,
                        why: PrunedWhy::Terminal {
                            state: RequestState::Succeeded,
                            reason: None
                        }
                    },
                ],
            }
        );
        assert_eq!(next.owners.into_keys().collect::<Vec<_>>(), vec![live]);
    }

    /// Quiet owners are those without a publication or heartbeat within
    /// `resume_after` (counted from the claim before the first publication), and
    /// marked ones at once; never another queue's.
    #[test]
    fn quiet_owners_are_due_resume_after_their_last_sign_of_life() {
        let mut queue = Queue::new(name("main"));
        let ids: Vec<RequestId> = (1..=4).map(|n| RequestId::new(name("main"), n)).collect();
        let resume = Duration::from_secs(10);
        // 1: claimed at 0, never published; 2: published at 5; 3: published at 0,
        // heartbeat at 8; 4: quiet but marked expiring.
        queue.owners.insert(ids[0].clone(), Slot::claimed(at(0)));
        for (id, published, heartbeat, expiring) in [
            (&ids[1], 5, 0, false),
            (&ids[2], 0, 8, false),
            (&ids[3], 0, 0, true),
        ] {
            queue.owners.insert(
                id.clone(),
                Slot {
                    heartbeat_at: at(heartbeat),
                    generation: crate::request::Generation(1),
                    published_at: Some(at(published)),
                    expiring,
                    ..Slot::claimed(at(0))
                },
            );
        }
        queue
            .owners
            .insert(RequestId::new(name("other"), 1), Slot::claimed(at(0)));
        assert_eq!(quiet_owners(&queue, resume, at(9)), vec![ids[3].clone()]);
        assert_eq!(
            quiet_owners(&queue, resume, at(10)),
            vec![ids[0].clone(), ids[3].clone()]
        );
        assert_eq!(
            quiet_owners(&queue, resume, at(15)),
            vec![ids[0].clone(), ids[1].clone(), ids[3].clone()]
        );
        assert_eq!(quiet_owners(&queue, resume, at(18)), ids.clone());
    }

    /// An owner is expired exactly when no heartbeat came within the lease: first
    /// marked expiring on the queue version read, then failed with
    /// `slot_lease_expired` on the request version read, then pruned as terminal.
    #[test]
    fn an_owner_without_a_heartbeat_for_the_lease_is_failed_then_pruned() {
        let mut queue = Queue::new(name("main"));
        let (old, fresh) = (
            RequestId::new(name("main"), 1),
            RequestId::new(name("main"), 2),
        );
        queue.owners.insert(
            old.clone(),
            Slot {
                heartbeat_at: at(30),
                ..Slot::claimed(at(0))
            },
        );
        queue.owners.insert(fresh.clone(), Slot::claimed(at(60)));
        let mut loaded: LoadedRequests = [&old, &fresh]
            .map(|id| (id.clone(), Some(request(id, RequestState::Processing))))
            .into_iter()
            .collect();
        // One millisecond before the lease runs out from the last heartbeat: nothing.
        let just_before = Timestamp::from_millis(at(90).as_millis() - 1);
        assert_eq!(
            decide_reconcile(&queue, &loaded, LEASE, just_before),
            Decision::Reply(Reply::Ack)
        );
        // First the mark, a compare-and-set on the queue that covers heartbeats.
        let Decision::Write(Write::Queue {
            kind,
            queue: marked,
            ..
        }) = decide_reconcile(&queue, &loaded, LEASE, at(90))
        else {
            panic!("a mark write");
        };
        assert_eq!(kind, QueueWrite::MarkExpiring { id: old.clone() });
        assert!(marked.owners[&old].expiring && !marked.owners[&fresh].expiring);
        let queue = marked;
        let Decision::Write(Write::Request {
            kind,
            expected,
            request: failed,
        }) = decide_reconcile(&queue, &loaded, LEASE, at(90))
        else {
            panic!("an expire write");
        };
        assert_eq!(
            (kind, expected, failed.state, failed.reason),
            (
                RequestWrite::Expire,
                Version::FIRST,
                RequestState::Failed,
                Some(FailReason::SlotLeaseExpired)
            )
        );
        assert_eq!(failed.id, old);
        loaded.insert(old.clone(), Some(failed));
        let Decision::Write(Write::Queue {
            kind, queue: next, ..
        }) = decide_reconcile(&queue, &loaded, LEASE, at(90))
        else {
            panic!("a prune write");
        };
        assert_eq!(
            kind,
            QueueWrite::Prune {
                pruned: vec![Pruned {
                    id: old,
                    why: PrunedWhy::Terminal {
                        state: RequestState::Failed,
                        reason: Some(FailReason::SlotLeaseExpired)
                    }
                }]
            }
        );
        assert_eq!(next.owners.into_keys().collect::<Vec<_>>(), vec![fresh]);
    }
}
