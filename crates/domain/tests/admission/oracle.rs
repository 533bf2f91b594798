//! Older designs run in the same harness, which must catch their bugs: that shows
//! the harness detects what the owner-keyed rules guard against.
//!
//! - The old anonymous-count design (a counter of busy slots instead of the set of
//!   owning request ids): the wedge of scenario 2, the double releases of
//!   scenarios 17–19, the processing request without a slot of scenario 17 (its
//!   outcome releases before the terminal write), and (it has no publication
//!   record) the duplicate build of scenario 31. The comparisons that need slot leases, heartbeats or
//!   generations do not apply to it: it has none.
//! - The duplicate delivery that acked a live publication before its build's
//!   first heartbeat (the owner-keyed rules, except that such a duplicate acks
//!   instead of holding): with a source that does not scan, the publication
//!   recorded by a delivery that died before publishing it is never published
//!   (scenario 38).
//! - The expiry before issue 25 (the owner-keyed rules, except that an owner whose
//!   lease ran out is failed at once by a compare-and-set on the request, decided
//!   from the queue as read): the build told "extended" and then failed
//!   `slot_lease_expired` of scenario 29.

use std::time::Duration;

use holdfast_domain::admission::{
    AdmissionConfig, BuildOutcome, DeadLetterReason, Decision, QueueWrite, Reply, RequestWrite,
    Write,
};
use holdfast_domain::{
    BuildPlan, BuildStrategy, FailReason, Generation, Heartbeat, RequestId, RequestState, Timestamp,
};

use crate::admission::model::{
    Act, Design, HWrite, OwnerKeyed, QueueRow, SlotChange, Target, View, World, act,
};
use crate::admission::scenarios::{
    s02_script, s17_script, s18_script, s19_script, s29_script, s31_script, s38_script,
};

/// The count-based design: claim = count + 1, release = count - 1 clamped at 0.
#[derive(Debug, Clone, Copy, Default)]
pub struct AnonymousCount;

fn count_write(row: &QueueRow, label: &'static str, count: u32) -> Act {
    let mut next = row.clone();
    next.count = count;
    Act::Write(Box::new(HWrite {
        label,
        target: Target::Queue {
            expected: row.queue.version,
            row: next,
        },
        domain: None,
    }))
}

fn state_write(view: &View<'_>, label: &'static str, state: RequestState) -> Act {
    let request = view.request.unwrap();
    let mut next = request.clone();
    next.state = state;
    if state == RequestState::Processing {
        next.plan = Some(BuildPlan {
            strategy: BuildStrategy::Full,
            base: None,
        });
    }
    Act::Write(Box::new(HWrite {
        label,
        target: Target::Request {
            expected: request.version,
            request: next,
        },
        domain: None,
    }))
}

impl Design for AnonymousCount {
    fn process(&self, cfg: &AdmissionConfig, id: &RequestId, view: &View<'_>) -> Act {
        let (Some(request), Some(row)) = (view.request, view.row) else {
            return Act::Reply(Reply::DeadLetter(DeadLetterReason::RequestMissing(
                id.clone(),
            )));
        };
        match request.state {
            // No publication record: every delivery of a processing request
            // publishes, and every publication is the first.
            RequestState::Processing => Act::Reply(Reply::Publish {
                request: request.clone(),
                plan: request.plan.clone().unwrap(),
                generation: Generation(1),
            }),
            RequestState::Accepted => {
                if view.applied.contains(&"claim") {
                    return state_write(view, "mark", RequestState::Processing);
                }
                if row.queue.latest_request_id.as_ref().is_some_and(|l| id < l) {
                    return state_write(view, "supersede", RequestState::Superseded);
                }
                if row.count >= cfg.max_concurrent {
                    return Act::Reply(Reply::Hold {
                        delay: cfg.gate_wait_delay,
                        paused: false,
                    });
                }
                count_write(row, "claim", row.count + 1)
            }
            _ => Act::Reply(Reply::Ack),
        }
    }

    fn outcome(&self, view: &View<'_>, outcome: BuildOutcome) -> Act {
        match (view.request, view.row) {
            (Some(r), Some(row)) if r.state == RequestState::Processing => {
                if view.applied.contains(&"release") {
                    state_write(view, "finish", outcome.state())
                } else {
                    count_write(row, "release", row.count.saturating_sub(1))
                }
            }
            _ => Act::Reply(Reply::Ack),
        }
    }

    fn dead_letter(&self, view: &View<'_>) -> Act {
        match (view.request, view.row) {
            (Some(r), Some(row)) if !r.state.is_terminal() => {
                if r.state == RequestState::Processing && !view.applied.contains(&"release") {
                    count_write(row, "release", row.count.saturating_sub(1))
                } else {
                    state_write(view, "fail", RequestState::Failed)
                }
            }
            _ => Act::Reply(Reply::Ack),
        }
    }

    fn reconcile(&self, _cfg: &AdmissionConfig, _view: &View<'_>) -> Act {
        Act::Reply(Reply::Ack)
    }

    fn occupancy(&self, row: &QueueRow) -> usize {
        usize::try_from(row.count).unwrap()
    }

    fn slot_changes(
        &self,
        before: &QueueRow,
        after: &QueueRow,
        actor: Option<&RequestId>,
    ) -> Vec<SlotChange> {
        let Some(actor) = actor else {
            return Vec::new();
        };
        match after.count.cmp(&before.count) {
            std::cmp::Ordering::Greater => vec![SlotChange::Claim(actor.clone())],
            std::cmp::Ordering::Less => vec![SlotChange::Release(actor.clone())],
            std::cmp::Ordering::Equal => Vec::new(),
        }
    }
}

fn has<D: Design>(world: &World<D>, needle: &str) -> bool {
    world.violations.iter().any(|v| v.contains(needle))
}

#[test]
fn oracle_detects_the_wedge_of_scenario_2() {
    let mut w = World::new(AnonymousCount, AdmissionConfig::default());
    let (a, end) = s02_script(&mut w);
    assert_eq!(
        end,
        crate::admission::model::End::Reply(Reply::Hold {
            delay: AdmissionConfig::default().gate_wait_delay,
            paused: false,
        })
    );
    assert!(
        has(&w, &format!("no wedge: {a} is held by its own slot")),
        "{:#?}",
        w.violations
    );
    let drained = w.drain();
    assert!(drained.unwrap_err().starts_with("wedge"));
    insta::assert_snapshot!("oracle_s02", w.violations.join("\n"));
}

/// The old anonymous-count design with two slots, as scenarios 17-19 need.
fn anonymous_count_at_max_2() -> World<AnonymousCount> {
    World::new(
        AnonymousCount,
        AdmissionConfig {
            max_concurrent: 2,
            ..AdmissionConfig::default()
        },
    )
}

/// The harness flagged `a` releasing a slot it does not hold.
fn assert_double_release(w: &World<AnonymousCount>, a: &RequestId) {
    assert!(
        has(
            w,
            &format!("{a} released a slot {a} does not hold (double release)")
        ),
        "{:#?}",
        w.violations
    );
}

#[test]
fn oracle_detects_the_double_release_of_scenario_17() {
    let mut w = anonymous_count_at_max_2();
    let (a, _b) = s17_script(&mut w);
    assert_double_release(&w, &a);
    insta::assert_snapshot!("oracle_s17", w.violations.join("\n"));
}

#[test]
fn oracle_detects_the_double_release_of_scenario_18() {
    let mut w = anonymous_count_at_max_2();
    let (a, _b) = s18_script(&mut w);
    assert_double_release(&w, &a);
}

#[test]
fn oracle_detects_the_double_release_of_scenario_19() {
    let mut w = anonymous_count_at_max_2();
    let (a, _b) = s19_script(&mut w);
    assert_double_release(&w, &a);
}

#[test]
fn oracle_detects_the_duplicate_build_of_scenario_31() {
    let mut w = World::new(AnonymousCount, AdmissionConfig::default());
    let (a, late) = s31_script(&mut w);
    assert!(
        matches!(
            late,
            crate::admission::model::End::Reply(Reply::Publish { .. })
        ),
        "{late:?}"
    );
    assert!(
        has(
            &w,
            &format!("each generation is published once: {a} generation 1 published again")
        ),
        "{:#?}",
        w.violations
    );
}

/// The owner-keyed rules with the expiry of before issue 25: a live owner whose
/// lease ran out is failed at once (`RequestWrite::Expire`, a compare-and-set on
/// the request only), decided from the queue as read, where the rules now mark
/// its slot first (a compare-and-set on the queue, which a heartbeat writes).
#[derive(Debug, Clone, Copy, Default)]
pub struct ExpireOnRead;

impl ExpireOnRead {
    /// Turns a mark of `id`'s slot into the failure of `id`'s request as loaded.
    fn expire_at_once(decided: Act, view: &View<'_>) -> Act {
        let Act::Write(write) = &decided else {
            return decided;
        };
        let Some(Write::Queue {
            kind: QueueWrite::MarkExpiring { id },
            ..
        }) = &write.domain
        else {
            return decided;
        };
        let owner = view
            .owners
            .get(id)
            .cloned()
            .flatten()
            .or_else(|| view.request.filter(|r| &r.id == id).cloned());
        let Some(owner) = owner else {
            return decided;
        };
        let mut failed = owner.clone();
        failed.state = RequestState::Failed;
        failed.reason = Some(FailReason::SlotLeaseExpired);
        failed.version = owner.version.next();
        act(
            Decision::Write(Write::Request {
                kind: RequestWrite::Expire,
                expected: owner.version,
                request: failed,
            }),
            view.row,
        )
    }
}

impl Design for ExpireOnRead {
    fn process(&self, cfg: &AdmissionConfig, id: &RequestId, view: &View<'_>) -> Act {
        Self::expire_at_once(OwnerKeyed.process(cfg, id, view), view)
    }

    fn outcome(&self, view: &View<'_>, outcome: BuildOutcome) -> Act {
        OwnerKeyed.outcome(view, outcome)
    }

    fn dead_letter(&self, view: &View<'_>) -> Act {
        OwnerKeyed.dead_letter(view)
    }

    fn reconcile(&self, cfg: &AdmissionConfig, view: &View<'_>) -> Act {
        Self::expire_at_once(OwnerKeyed.reconcile(cfg, view), view)
    }

    fn heartbeat(&self, cfg: &AdmissionConfig, generation: Generation, view: &View<'_>) -> Act {
        OwnerKeyed.heartbeat(cfg, generation, view)
    }

    fn heartbeat_answer(
        &self,
        cfg: &AdmissionConfig,
        generation: Generation,
        view: &View<'_>,
    ) -> Heartbeat {
        OwnerKeyed.heartbeat_answer(cfg, generation, view)
    }

    fn withdraw(&self, generation: Generation, view: &View<'_>) -> Act {
        OwnerKeyed.withdraw(generation, view)
    }

    fn records_publications(&self) -> bool {
        true
    }

    fn occupancy(&self, row: &QueueRow) -> usize {
        OwnerKeyed.occupancy(row)
    }

    fn slot_changes(
        &self,
        before: &QueueRow,
        after: &QueueRow,
        actor: Option<&RequestId>,
    ) -> Vec<SlotChange> {
        OwnerKeyed.slot_changes(before, after, actor)
    }
}

#[test]
fn oracle_detects_the_extended_then_expired_race_of_scenario_29() {
    let mut w = World::new(
        ExpireOnRead,
        AdmissionConfig {
            slot_lease: Duration::from_secs(60),
            ..AdmissionConfig::default()
        },
    );
    let (a, told) = s29_script(&mut w);
    assert_eq!(
        told,
        Heartbeat::Extended {
            expires_at: Timestamp::from_millis(119_999)
        }
    );
    assert_eq!(w.state(&a), RequestState::Failed);
    assert_eq!(w.request(&a).reason, Some(FailReason::SlotLeaseExpired));
    assert!(
        has(
            &w,
            &format!(
                "heartbeat vs expiry: {a} generation 1 was told extended until 119999ms but its lease was expired at 60000ms"
            )
        ),
        "{:#?}",
        w.violations
    );
}

/// The owner-keyed rules with the duplicate delivery of before: a process
/// delivery of a processing owner whose publication is live acks, confirmed by a
/// heartbeat or not, where the rules now hold it until the publication would go
/// quiet.
#[derive(Debug, Clone, Copy, Default)]
pub struct AckUnconfirmed;

impl Design for AckUnconfirmed {
    fn process(&self, cfg: &AdmissionConfig, id: &RequestId, view: &View<'_>) -> Act {
        match OwnerKeyed.process(cfg, id, view) {
            // A processing request is held only while its publication is
            // unconfirmed.
            Act::Reply(Reply::Hold { .. })
                if view
                    .request
                    .is_some_and(|r| r.state == RequestState::Processing) =>
            {
                Act::Reply(Reply::Ack)
            }
            decided => decided,
        }
    }

    fn outcome(&self, view: &View<'_>, outcome: BuildOutcome) -> Act {
        OwnerKeyed.outcome(view, outcome)
    }

    fn dead_letter(&self, view: &View<'_>) -> Act {
        OwnerKeyed.dead_letter(view)
    }

    fn reconcile(&self, cfg: &AdmissionConfig, view: &View<'_>) -> Act {
        OwnerKeyed.reconcile(cfg, view)
    }

    fn heartbeat(&self, cfg: &AdmissionConfig, generation: Generation, view: &View<'_>) -> Act {
        OwnerKeyed.heartbeat(cfg, generation, view)
    }

    fn heartbeat_answer(
        &self,
        cfg: &AdmissionConfig,
        generation: Generation,
        view: &View<'_>,
    ) -> Heartbeat {
        OwnerKeyed.heartbeat_answer(cfg, generation, view)
    }

    fn withdraw(&self, generation: Generation, view: &View<'_>) -> Act {
        OwnerKeyed.withdraw(generation, view)
    }

    fn records_publications(&self) -> bool {
        true
    }

    fn occupancy(&self, row: &QueueRow) -> usize {
        OwnerKeyed.occupancy(row)
    }

    fn slot_changes(
        &self,
        before: &QueueRow,
        after: &QueueRow,
        actor: Option<&RequestId>,
    ) -> Vec<SlotChange> {
        OwnerKeyed.slot_changes(before, after, actor)
    }
}

/// A source that does not scan: the redelivered message acks the publication
/// recorded by the dead worker, and nothing is left to publish it. The request
/// stays processing with its slot and no build; only its lease expiry, long
/// after, would end it (failed, never built).
#[test]
fn oracle_detects_the_lost_publication_of_scenario_38() {
    let mut w = World::new(
        AckUnconfirmed,
        AdmissionConfig {
            slot_lease: Duration::from_secs(600),
            resume_after: Duration::from_secs(60),
            ..AdmissionConfig::default()
        },
    );
    let (a, redelivered) = s38_script(&mut w);
    assert_eq!(
        redelivered,
        [crate::admission::model::End::Reply(Reply::Ack)]
    );
    assert!(w.inbox.is_empty());
    let drained = w.drain();
    assert_eq!(
        drained,
        Err(format!(
            "lost: owners [{}] have no build and no message, and no scan finds them",
            a.seq()
        ))
    );
    assert!(w.published.is_empty());
    assert_eq!(w.state(&a), RequestState::Processing);
    assert_eq!(w.owners(), [a.seq()]);
}
