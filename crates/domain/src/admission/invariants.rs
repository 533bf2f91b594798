//! The admission invariants of `docs/admission.md` that need only one stored state: a queue
//! and its requests, as loaded. Checkers (the simulator, the crash tests, `queue
//! show`) read the store and ask these functions; the rules live here once.
//!
//! Invariants about steps (release only by the owner, only the latest head is
//! admitted, terminal is final) need two states and stay with their checkers.

use std::collections::BTreeMap;
use std::fmt;

use crate::ids::QueueName;
use crate::request::{Queue, Request, RequestId, RequestState};

/// One broken stored-state invariant. `Display` names the request (or the queue)
/// and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// More requests own a slot than the queue has slots.
    TooManyOwners {
        /// The queue.
        queue: QueueName,
        /// How many requests own a slot.
        owners: usize,
        /// The configured slot count.
        max_concurrent: u32,
    },
    /// A slot owner that is not a stored request.
    OwnerMissing {
        /// The owner.
        owner: RequestId,
    },
    /// A terminal request (superseded, succeeded, failed or cancelled) still owns a
    /// slot. A crash between an outcome's (or a dead letter's) terminal write and
    /// its release leaves exactly this until the message is redelivered or a
    /// reconcile prunes it, so a checker looking while messages are in flight may
    /// tolerate it for the request of an interrupted message.
    TerminalOwner {
        /// The owner.
        owner: RequestId,
        /// Its terminal state.
        state: RequestState,
    },
    /// A processing request owns no slot: no step leaves this (outcomes and dead
    /// letters write the terminal state before they release), only binaries that
    /// counted slots anonymously, until `queue backfill`.
    ProcessingWithoutSlot {
        /// The processing request.
        request: RequestId,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::TooManyOwners {
                queue,
                owners,
                max_concurrent,
            } => write!(
                f,
                "queue {queue} has {owners} slot owners; expected at most max_concurrent = \
                 {max_concurrent}"
            ),
            Violation::OwnerMissing { owner } => {
                write!(f, "{owner} owns a slot but is not a stored request")
            }
            Violation::TerminalOwner { owner, state } => write!(
                f,
                "{owner} is {state} and owns a slot; terminal requests own no slot"
            ),
            Violation::ProcessingWithoutSlot { request } => {
                write!(f, "{request} is processing without a slot")
            }
        }
    }
}

/// Whether `owner`, whose stored state is `state` (`None`: no such request), may
/// own a slot: only a live (accepted or processing) request may. This is the rule
/// `queue show` flags owners by, and the per-owner part of [`stored_violations`].
pub fn owner_violation(owner: &RequestId, state: Option<RequestState>) -> Option<Violation> {
    match state {
        None => Some(Violation::OwnerMissing {
            owner: owner.clone(),
        }),
        Some(state) if state.is_terminal() => Some(Violation::TerminalOwner {
            owner: owner.clone(),
            state,
        }),
        Some(_) => None,
    }
}

/// The stored-state invariants of `queue` with `max_concurrent` slots and its
/// `requests` (every stored request of the queue; a missing one would be reported
/// as [`Violation::OwnerMissing`] if it owns a slot):
///
/// - at most `max_concurrent` owners ([`Violation::TooManyOwners`]);
/// - every owner is a stored, live request ([`owner_violation`]), in owner order;
/// - every processing request owns a slot ([`Violation::ProcessingWithoutSlot`]),
///   in the order of `requests`.
///
/// Returns every violation, none tolerated: a caller that looks while messages are
/// in flight, or at a state it crafted on purpose, drops the ones its moment allows.
pub fn stored_violations<'a>(
    queue: &Queue,
    requests: impl IntoIterator<Item = &'a Request>,
    max_concurrent: u32,
) -> Vec<Violation> {
    let requests: Vec<&Request> = requests.into_iter().collect();
    let states: BTreeMap<&RequestId, RequestState> =
        requests.iter().map(|r| (&r.id, r.state)).collect();
    let mut found = Vec::new();
    if queue.owners.len() > usize::try_from(max_concurrent).unwrap_or(usize::MAX) {
        found.push(Violation::TooManyOwners {
            queue: queue.name.clone(),
            owners: queue.owners.len(),
            max_concurrent,
        });
    }
    found.extend(
        queue
            .owners
            .keys()
            .filter_map(|owner| owner_violation(owner, states.get(owner).copied())),
    );
    found.extend(
        requests
            .iter()
            .filter(|r| r.state == RequestState::Processing && !queue.owners.contains_key(&r.id))
            .map(|r| Violation::ProcessingWithoutSlot {
                request: r.id.clone(),
            }),
    );
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::RevisionUri;
    use crate::request::Version;

    fn id(seq: u64) -> RequestId {
        RequestId::new(QueueName::new("q").unwrap(), seq)
    }

    fn request(seq: u64, state: RequestState) -> Request {
        Request {
            id: id(seq),
            uri: RevisionUri::new(format!("rev-{seq}")).unwrap(),
            state,
            plan: None,
            reason: None,
            ingested_at: crate::Timestamp::from_millis(0),
            version: Version::FIRST,
        }
    }

    /// The violations of a queue owned by `owners` with `requests`, as text.
    fn check(owners: &[u64], requests: &[(u64, RequestState)], max: u32) -> Vec<String> {
        let mut queue = Queue::new(QueueName::new("q").unwrap());
        queue.owners = owners
            .iter()
            .map(|&n| (id(n), crate::request::Slot::claimed(crate::Timestamp(0))))
            .collect();
        let requests: Vec<Request> = requests.iter().map(|&(n, s)| request(n, s)).collect();
        stored_violations(&queue, &requests, max)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_consistent_state_has_no_violation() {
        use RequestState::*;
        let requests = [
            (1, Succeeded),
            (2, Processing),
            (3, Accepted),
            (4, Superseded),
        ];
        assert!(check(&[2, 3], &requests, 2).is_empty());
        assert!(check(&[], &[(1, Accepted), (2, Failed)], 1).is_empty());
    }

    #[test]
    fn each_rule_names_its_request_and_rule() {
        use RequestState::*;
        assert_eq!(
            check(
                &[1, 2, 3],
                &[(1, Processing), (2, Processing), (3, Processing)],
                2
            ),
            ["queue q has 3 slot owners; expected at most max_concurrent = 2"]
        );
        assert_eq!(
            check(&[7], &[], 2),
            ["request/q/7 owns a slot but is not a stored request"]
        );
        assert_eq!(
            check(&[1, 2], &[(1, Superseded), (2, Cancelled)], 2),
            [
                "request/q/1 is superseded and owns a slot; terminal requests own no slot",
                "request/q/2 is cancelled and owns a slot; terminal requests own no slot",
            ]
        );
        assert_eq!(
            check(&[], &[(1, Processing), (2, Accepted)], 2),
            ["request/q/1 is processing without a slot"]
        );
    }

    #[test]
    fn only_live_requests_may_own_a_slot() {
        let owner = id(1);
        assert_eq!(
            owner_violation(&owner, None),
            Some(Violation::OwnerMissing {
                owner: owner.clone()
            })
        );
        for state in [RequestState::Accepted, RequestState::Processing] {
            assert_eq!(owner_violation(&owner, Some(state)), None);
        }
        for state in [
            RequestState::Superseded,
            RequestState::Succeeded,
            RequestState::Failed,
            RequestState::Cancelled,
        ] {
            assert_eq!(
                owner_violation(&owner, Some(state)),
                Some(Violation::TerminalOwner {
                    owner: owner.clone(),
                    state
                })
            );
        }
    }
}
