//! The operations on a queue's slots outside a message's path: an owner's
//! heartbeat, which keeps its slot lease running, and the queue's stored limit.

use std::time::Duration;

use super::{
    DeadLetterReason, Decision, QueueWrite, Reply, loaded_pair, reply, write_queue, write_slot,
};
use crate::ids::QueueName;
use crate::request::{Generation, Queue, Request, RequestId, RequestState, Slot};
use crate::timestamp::Timestamp;

/// What a heartbeat found, read from the request and queue it last loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heartbeat {
    /// The request owns its slot; without another heartbeat its lease runs out at
    /// `expires_at`.
    Extended {
        /// When the lease runs out.
        expires_at: Timestamp,
    },
    /// The request owns no slot (any more): its build should stop. `state` is the
    /// request's stored state, `None` if there is no such request.
    NotOwner {
        /// The request's state.
        state: Option<RequestState>,
    },
    /// The request still holds its slot but the lease ran out at `expired_at` (or a
    /// reconcile marked it expiring): it is being failed, so its build should stop.
    LeaseExpired {
        /// When the lease ran out.
        expired_at: Timestamp,
    },
    /// The request owns its slot, but the heartbeat's generation is not the last
    /// one published: its publication went quiet and the build was published again
    /// (or the generation is unknown). This build should stop, without reporting
    /// an outcome: `current` runs, and an outcome would end the request for it.
    Stale {
        /// The generation published last.
        current: Generation,
    },
}

/// Decides a heartbeat of generation `generation` of `request`'s build at `now`,
/// given the request and its queue as loaded now (request first): the build of
/// the last published generation of a live owner within its lease has its slot's
/// heartbeat moved to `now` ([`QueueWrite::Heartbeat`], a compare-and-set on the
/// queue); anything else is answered ([`Reply::Ack`]) and [`heartbeat_answer`]
/// tells what was found. A lease that ran out, or a slot a reconcile marked
/// expiring, is not revived: the request is being failed.
pub fn decide_heartbeat(
    request: Option<&Request>,
    queue: Option<&Queue>,
    generation: Generation,
    lease: Duration,
    now: Timestamp,
) -> Decision {
    let (request, queue) = match loaded_pair(request, queue) {
        Ok(pair) => pair,
        Err(decision) => return decision,
    };
    match queue
        .owners
        .get(&request.id)
        .map(|slot| (slot, stamp(slot, now)))
    {
        Some((slot, at))
            if !request.state.is_terminal()
                && slot.generation == generation
                && !slot.expiring
                && !slot.expired(lease, now)
                && slot.heartbeat_at < at =>
        {
            refresh(queue, &request.id, at)
        }
        _ => reply(Reply::Ack),
    }
}

/// The most a heartbeat's clock may lag the publisher's and still count as
/// after the publication: a heartbeat within it records
/// [`stamp`], so a slot's lease runs at most this much past the heartbeat's
/// own clock. A clock further behind records its own time (the build is
/// published again after `resume_after`, as when no heartbeat came).
const PUBLICATION_SKEW: Duration = Duration::from_secs(1);

/// The time a heartbeat at `now` records: `now`, or a millisecond after the
/// publication when `now` is not after it by at most [`PUBLICATION_SKEW`] (a
/// heartbeat within the publication's millisecond, or read on a clock slightly
/// behind the publisher's), so that such a heartbeat shows the build was
/// handed over.
fn stamp(slot: &Slot, now: Timestamp) -> Timestamp {
    match slot.published_at {
        Some(at)
            if now <= at
                && Duration::from_millis(at.as_millis() - now.as_millis()) <= PUBLICATION_SKEW =>
        {
            Timestamp::from_millis(at.as_millis().saturating_add(1))
        }
        _ => now,
    }
}

/// Decides withdrawing the publication of `generation` of `request`'s build, whose
/// publish failed: the slot forgets when it was published (the generation stays
/// spent), so the next delivery publishes the next generation at once instead of
/// after `resume_after`. Acks when that generation is no longer the last published
/// one, when it heartbeated since its publication (so it was handed over after
/// all), or when the request owns no slot.
pub fn decide_withdraw(
    request: Option<&Request>,
    queue: Option<&Queue>,
    generation: Generation,
) -> Decision {
    let (request, queue) = match loaded_pair(request, queue) {
        Ok(pair) => pair,
        Err(decision) => return decision,
    };
    match queue.owners.get(&request.id) {
        // A heartbeat since the publication proves it was handed over (the
        // error was ambiguous): nothing to withdraw.
        Some(slot)
            if slot.generation == generation
                && slot.published_at.is_some()
                && !slot.confirmed() =>
        {
            write_slot(QueueWrite::Withdraw, queue, &request.id, |slot| {
                slot.published_at = None;
            })
        }
        _ => reply(Reply::Ack),
    }
}

/// The heartbeat write: the slot of `id` in `queue` runs its lease again from `now`.
pub(super) fn refresh(queue: &Queue, id: &RequestId, now: Timestamp) -> Decision {
    write_slot(QueueWrite::Heartbeat, queue, id, |slot| {
        slot.heartbeat_at = now
    })
}

/// What the heartbeat of `generation` of `request`'s build (the records
/// [`decide_heartbeat`] answered on) found at `now` with slot lease `lease`.
pub fn heartbeat_answer(
    request: Option<&Request>,
    queue: Option<&Queue>,
    generation: Generation,
    lease: Duration,
    now: Timestamp,
) -> Heartbeat {
    let state = request.map(|r| r.state);
    let slot = request
        .zip(queue)
        .filter(|(r, _)| !r.state.is_terminal())
        .and_then(|(r, q)| q.owners.get(&r.id));
    match slot {
        None => Heartbeat::NotOwner { state },
        Some(slot) if slot.generation != generation => Heartbeat::Stale {
            current: slot.generation,
        },
        Some(slot) if slot.expiring || slot.expired(lease, now) => Heartbeat::LeaseExpired {
            expired_at: slot.expires_at(lease),
        },
        Some(slot) => Heartbeat::Extended {
            expires_at: slot.expires_at(lease),
        },
    }
}

/// Decides setting the stored slot limit of `queue` (named `name`) to `max`; 0
/// pauses the queue (every head holds; owners keep their slots). Acks when the
/// limit is already `max`; a missing queue is [`Reply::DeadLetter`]. Lowering the
/// limit below the current owners frees nothing: they finish, and no head is
/// admitted until fewer than `max` own a slot.
pub fn decide_set_limit(name: &QueueName, queue: Option<&Queue>, max: u32) -> Decision {
    let Some(queue) = queue else {
        return reply(Reply::DeadLetter(DeadLetterReason::QueueMissing(
            name.clone(),
        )));
    };
    if queue.max_concurrent == Some(max) {
        return reply(Reply::Ack);
    }
    let mut next = queue.clone();
    next.max_concurrent = Some(max);
    write_queue(QueueWrite::SetLimit, queue, next)
}

#[cfg(test)]
mod tests {
    use super::super::Write;
    use super::*;
    use crate::ids::RevisionUri;
    use crate::request::Version;

    const LEASE: Duration = Duration::from_secs(10);

    fn at(secs: u64) -> Timestamp {
        Timestamp::from_millis(secs * 1_000)
    }

    fn fixture(state: RequestState, owner: bool) -> (Request, Queue) {
        let name = QueueName::new("q").unwrap();
        let id = RequestId::new(name.clone(), 1);
        let request = Request {
            id: id.clone(),
            uri: RevisionUri::new("git:a").unwrap(),
            state,
            plan: None,
            reason: None,
            ingested_at: crate::Timestamp::from_millis(0),
            version: Version::FIRST,
        };
        let mut queue = Queue::new(name);
        if owner {
            let mut slot = Slot::claimed(at(0));
            slot.generation = G1;
            slot.published_at = Some(at(0));
            queue.owners.insert(id, slot);
        }
        (request, queue)
    }

    const G1: Generation = Generation(1);

    #[test]
    fn a_live_owner_within_its_lease_moves_its_heartbeat() {
        let (request, queue) = fixture(RequestState::Processing, true);
        let Decision::Write(Write::Queue {
            kind, queue: next, ..
        }) = decide_heartbeat(Some(&request), Some(&queue), G1, LEASE, at(9))
        else {
            panic!("a heartbeat write");
        };
        assert_eq!(kind, QueueWrite::Heartbeat);
        let slot = next.owners[&request.id];
        assert_eq!((slot.claimed_at, slot.heartbeat_at), (at(0), at(9)));
        assert_eq!(
            heartbeat_answer(Some(&request), Some(&next), G1, LEASE, at(9)),
            Heartbeat::Extended { expires_at: at(19) }
        );
        // Written already: the reload answers.
        assert_eq!(
            decide_heartbeat(Some(&request), Some(&next), G1, LEASE, at(9)),
            Decision::Reply(Reply::Ack)
        );
    }

    #[test]
    fn a_heartbeat_in_the_publications_millisecond_shows_the_hand_over() {
        // Published at 5 s; the build heartbeats within the same millisecond,
        // or on a replica whose clock is a second behind the publisher's.
        for now in [at(5), Timestamp::from_millis(4_000)] {
            let (request, mut queue) = fixture(RequestState::Processing, true);
            queue.owners.get_mut(&request.id).unwrap().published_at = Some(at(5));
            let Decision::Write(Write::Queue { queue: next, .. }) =
                decide_heartbeat(Some(&request), Some(&queue), G1, LEASE, now)
            else {
                panic!("a heartbeat write");
            };
            let slot = next.owners[&request.id];
            assert!(slot.confirmed(), "{slot:?}");
            assert_eq!(slot.heartbeat_at, Timestamp::from_millis(5_001));
            // Written already: the reload answers.
            assert_eq!(
                decide_heartbeat(Some(&request), Some(&next), G1, LEASE, now),
                Decision::Reply(Reply::Ack)
            );
        }
        // A clock further behind records its own time: the lease never runs
        // more than the skew past the heartbeat's clock.
        let (request, mut queue) = fixture(RequestState::Processing, true);
        queue.owners.get_mut(&request.id).unwrap().published_at = Some(at(5));
        let Decision::Write(Write::Queue { queue: next, .. }) = decide_heartbeat(
            Some(&request),
            Some(&queue),
            G1,
            LEASE,
            Timestamp::from_millis(3_999),
        ) else {
            panic!("a heartbeat write");
        };
        let slot = next.owners[&request.id];
        assert_eq!(slot.heartbeat_at, Timestamp::from_millis(3_999));
        assert!(!slot.confirmed());
    }

    #[test]
    fn a_heartbeat_never_revives_an_expired_or_terminal_owner() {
        let (request, queue) = fixture(RequestState::Processing, true);
        assert_eq!(
            decide_heartbeat(Some(&request), Some(&queue), G1, LEASE, at(10)),
            Decision::Reply(Reply::Ack)
        );
        assert_eq!(
            heartbeat_answer(Some(&request), Some(&queue), G1, LEASE, at(10)),
            Heartbeat::LeaseExpired { expired_at: at(10) }
        );
        let (done, queue) = fixture(RequestState::Failed, true);
        assert_eq!(
            decide_heartbeat(Some(&done), Some(&queue), G1, LEASE, at(1)),
            Decision::Reply(Reply::Ack)
        );
        assert_eq!(
            heartbeat_answer(Some(&done), Some(&queue), G1, LEASE, at(1)),
            Heartbeat::NotOwner {
                state: Some(RequestState::Failed)
            }
        );
        let (accepted, queue) = fixture(RequestState::Accepted, false);
        assert_eq!(
            heartbeat_answer(Some(&accepted), Some(&queue), G1, LEASE, at(1)),
            Heartbeat::NotOwner {
                state: Some(RequestState::Accepted)
            }
        );
        assert_eq!(
            heartbeat_answer(None, Some(&queue), G1, LEASE, at(1)),
            Heartbeat::NotOwner { state: None }
        );
    }

    /// A build of an older generation is told to stop and extends nothing; so is
    /// one of a slot a reconcile marked expiring, even within its lease.
    #[test]
    fn a_stale_generation_or_a_marked_slot_is_told_to_stop_and_writes_nothing() {
        let (request, mut queue) = fixture(RequestState::Processing, true);
        let slot = queue.owners.get_mut(&request.id).expect("owner");
        slot.generation = Generation(2);
        assert_eq!(
            decide_heartbeat(Some(&request), Some(&queue), G1, LEASE, at(5)),
            Decision::Reply(Reply::Ack)
        );
        assert_eq!(
            heartbeat_answer(Some(&request), Some(&queue), G1, LEASE, at(5)),
            Heartbeat::Stale {
                current: Generation(2)
            }
        );
        let (request, mut queue) = fixture(RequestState::Processing, true);
        queue.owners.get_mut(&request.id).expect("owner").expiring = true;
        assert_eq!(
            decide_heartbeat(Some(&request), Some(&queue), G1, LEASE, at(5)),
            Decision::Reply(Reply::Ack)
        );
        assert_eq!(
            heartbeat_answer(Some(&request), Some(&queue), G1, LEASE, at(5)),
            Heartbeat::LeaseExpired { expired_at: at(10) }
        );
    }

    /// A withdrawal forgets when the current generation was published, once; an
    /// older generation's withdrawal changes nothing.
    #[test]
    fn a_withdrawal_unpublishes_only_the_current_generation() {
        let (request, queue) = fixture(RequestState::Processing, true);
        assert_eq!(
            decide_withdraw(Some(&request), Some(&queue), Generation(7)),
            Decision::Reply(Reply::Ack)
        );
        let Decision::Write(Write::Queue {
            kind, queue: next, ..
        }) = decide_withdraw(Some(&request), Some(&queue), G1)
        else {
            panic!("a withdraw write");
        };
        assert_eq!(kind, QueueWrite::Withdraw);
        let slot = next.owners[&request.id];
        assert_eq!((slot.generation, slot.published_at), (G1, None));
        assert!(slot.quiet(LEASE, at(0)));
        assert_eq!(
            decide_withdraw(Some(&request), Some(&next), G1),
            Decision::Reply(Reply::Ack)
        );
    }

    #[test]
    fn set_limit_writes_once_and_pauses_at_zero() {
        let (_, queue) = fixture(RequestState::Accepted, false);
        let Decision::Write(Write::Queue { queue: next, .. }) =
            decide_set_limit(&queue.name, Some(&queue), 0)
        else {
            panic!("a set-limit write");
        };
        assert_eq!(next.max_concurrent, Some(0));
        assert_eq!(next.limit(3), 0);
        assert_eq!(
            decide_set_limit(&queue.name, Some(&next), 0),
            Decision::Reply(Reply::Ack)
        );
        assert!(matches!(
            decide_set_limit(&queue.name, None, 1),
            Decision::Reply(Reply::DeadLetter(DeadLetterReason::QueueMissing(_)))
        ));
    }
}
