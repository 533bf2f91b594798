//! The old anonymous-count design (a counter of busy slots instead of the set of
//! owning request ids), run in the same harness. It must be caught by the invariants: the
//! wedge of scenario 2 and the double releases of scenarios 17–19. That shows the
//! harness detects the bugs the owner-keyed rules guard against.

use holdfast_domain::admission::{AdmissionConfig, BuildOutcome, DeadLetterReason, Reply};
use holdfast_domain::{BuildPlan, BuildStrategy, RequestId, RequestState};

use crate::admission::model::{Act, Design, HWrite, QueueRow, SlotChange, Target, View, World};
use crate::admission::scenarios::{s02_script, s17_script, s18_script, s19_script};

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
            RequestState::Processing => Act::Reply(Reply::Publish {
                request: request.clone(),
                plan: request.plan.clone().unwrap(),
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

fn has(world: &World<AnonymousCount>, needle: &str) -> bool {
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
