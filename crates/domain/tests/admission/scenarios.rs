//! The 28 named scenarios of issue 3 (max_concurrent 1 unless the name says
//! otherwise), run against the owner-keyed rules. Scenarios 2 and 17–19 are scripts
//! shared with the oracle, which must fail them.

use std::time::Duration;

use holdfast_domain::admission::{
    AdmissionConfig, AdmissionConfigError, AdmissionError, AncestryAnswer, BuildOutcome, Decision,
    QueueWrite, Reply, RetryReason, Write, decide_backfill,
};
use holdfast_domain::{BuildPlan, BuildStrategy, LastGreen, RequestId, RequestState};

use crate::admission::model::{Design, End, Fault, Msg, OwnerKeyed, World, rid, uri};

fn world(max: u32) -> World<OwnerKeyed> {
    World::new(
        OwnerKeyed,
        AdmissionConfig {
            max_concurrent: max,
            ..AdmissionConfig::default()
        },
    )
}

fn is_publish(end: &End) -> bool {
    matches!(end, End::Reply(Reply::Publish { .. }))
}

/// Ingests `name` and admits it: it ends processing with a published build.
fn admit<D: Design>(w: &mut World<D>, name: &str) -> RequestId {
    let id = w.ingest(name);
    let end = w.process(&id);
    assert!(is_publish(&end), "{end:?}: {:#?}", w.trace);
    id
}

/// Ingests `name` and delivers its process message until the claim is applied,
/// then crashes: the request is accepted and owns a slot, unmarked, and its
/// message is back in the inbox.
fn claimed_then_crashed<D: Design>(w: &mut World<D>, name: &str) -> RequestId {
    let id = w.ingest(name);
    let d = w.take(Msg::Process(id.clone()));
    w.run_until_applied(d, "claim");
    w.crash(d);
    id
}

fn clean(w: &World<OwnerKeyed>) {
    assert_eq!(w.violations, Vec::<String>::new(), "{:#?}", w.trace);
}

fn drained(w: &mut World<OwnerKeyed>) {
    w.drain().unwrap();
    w.assert_drained_clean();
}

/// Scenario 2: claim, crash before the mark, redeliver.
pub fn s02_script<D: Design>(w: &mut World<D>) -> (RequestId, End) {
    let a = claimed_then_crashed(w, "a");
    let end = w.process(&a);
    (a, end)
}

/// Scenario 17 (max 2): `a` and `b` processing; `a`'s outcome crashes after its
/// release and is redelivered.
pub fn s17_script<D: Design>(w: &mut World<D>) -> (RequestId, RequestId) {
    let a = admit(w, "a");
    let b = admit(w, "b");
    w.builds.remove(&a);
    let d = w.start(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    w.run_until_applied(d, "release");
    w.crash(d);
    w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    (a, b)
}

/// Runs two chains for `a` that both load it while processing, the first one
/// releasing before the second decides.
fn racing_chains<D: Design>(w: &mut World<D>, first: Msg, second: Msg) {
    let d1 = w.start(first);
    let d2 = w.start(second);
    w.step(d1);
    w.step(d1);
    w.step(d2);
    w.step(d2);
    w.run_until_applied(d1, "release");
    // The second chain's release decision conflicts; it reloads while `a` is
    // still processing (the first chain has not written the terminal state).
    w.step(d2);
    w.run(d2);
    w.run(d1);
}

/// Scenario 18 (max 2): two outcome chains for `a`.
pub fn s18_script<D: Design>(w: &mut World<D>) -> (RequestId, RequestId) {
    let a = admit(w, "a");
    let b = admit(w, "b");
    w.builds.remove(&a);
    racing_chains(
        w,
        Msg::Outcome(a.clone(), BuildOutcome::Succeeded),
        Msg::Outcome(a.clone(), BuildOutcome::Failed),
    );
    (a, b)
}

/// Scenario 19 (max 2): a dead letter for `a` races its outcome.
pub fn s19_script<D: Design>(w: &mut World<D>) -> (RequestId, RequestId) {
    let a = admit(w, "a");
    let b = admit(w, "b");
    w.builds.remove(&a);
    racing_chains(
        w,
        Msg::Outcome(a.clone(), BuildOutcome::Succeeded),
        Msg::DeadLetter(a.clone()),
    );
    (a, b)
}

#[test]
fn s01_happy_path() {
    let mut w = world(1);
    let a = admit(&mut w, "a");
    assert_eq!(w.owners(), [1]);
    assert_eq!(w.state(&a), RequestState::Processing);
    assert_eq!(
        w.request(&a).plan,
        Some(BuildPlan {
            strategy: BuildStrategy::Full,
            base: None
        })
    );
    w.finish_build(&a, BuildOutcome::Succeeded);
    let end = w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    assert_eq!(end, End::Reply(Reply::Ack));
    assert_eq!(w.state(&a), RequestState::Succeeded);
    drained(&mut w);
    insta::assert_snapshot!("s01_trace", w.trace.join("\n"));
}

#[test]
fn s02_crash_after_claim_before_mark_resumes() {
    let mut w = world(1);
    let (a, end) = s02_script(&mut w);
    assert!(is_publish(&end), "{end:?}");
    assert_eq!(w.holds, 0);
    assert_eq!(w.owners(), [1]);
    assert_eq!(w.state(&a), RequestState::Processing);
    assert_eq!(w.applied("claim"), 1);
    clean(&w);
    drained(&mut w);
    insta::assert_snapshot!("s02_trace", w.trace.join("\n"));
}

#[test]
fn s03_crash_after_claim_newer_head_releases_then_supersedes() {
    let mut w = world(1);
    let a = claimed_then_crashed(&mut w, "a");
    let b = w.ingest("b");
    assert_eq!(w.process(&a), End::Reply(Reply::Ack));
    assert_eq!(w.state(&a), RequestState::Superseded);
    assert_eq!(w.owners(), Vec::<u64>::new());
    let order: Vec<&str> = w
        .trace
        .iter()
        .filter(|l| l.contains("process 1:") && l.contains("applied"))
        .map(|l| {
            ["claim", "fence", "release", "supersede"]
                .into_iter()
                .find(|k| l.contains(&format!(": {k} applied")))
                .unwrap()
        })
        .collect();
    assert_eq!(order, ["claim", "fence", "release", "supersede"]);
    assert!(is_publish(&w.process(&b)));
    clean(&w);
    drained(&mut w);
}

#[test]
fn s04_crash_between_release_and_supersede() {
    let mut w = world(1);
    let a = claimed_then_crashed(&mut w, "a");
    let b = w.ingest("b");
    let d = w.take(Msg::Process(a.clone()));
    w.run_until_applied(d, "release");
    w.crash(d);
    assert_eq!(w.state(&a), RequestState::Accepted);
    assert_eq!(w.owners(), Vec::<u64>::new());
    assert_eq!(w.process(&a), End::Reply(Reply::Ack));
    assert_eq!(w.state(&a), RequestState::Superseded);
    assert_eq!(w.applied("release"), 1);
    assert!(is_publish(&w.process(&b)));
    clean(&w);
    drained(&mut w);
}

#[test]
fn s05_crash_after_claim_at_max_two_uses_exactly_one_slot() {
    let mut w = world(2);
    let (a, end) = s02_script(&mut w);
    assert!(is_publish(&end));
    assert_eq!(w.owners(), [a.seq()]);
    assert_eq!(w.applied("claim"), 1);
    clean(&w);
    drained(&mut w);
}

#[test]
fn s06_mark_commits_but_reports_error_keeps_owner_without_release() {
    let mut w = world(1);
    let a = w.ingest("a");
    let d = w.take(Msg::Process(a.clone()));
    w.fault_on(d, "mark", Fault::CommitThenError);
    assert_eq!(w.run(d), End::StoreError);
    assert_eq!(w.state(&a), RequestState::Processing);
    assert_eq!(w.owners(), [1]);
    assert_eq!(w.inbox[0].attempts, 1);
    assert!(is_publish(&w.process(&a)));
    assert_eq!(w.applied("release"), 0);
    assert_eq!(w.owners(), [1]);
    clean(&w);
    drained(&mut w);
}

#[test]
fn s07_mark_fails_before_write_and_dead_letter_releases_and_fails() {
    let mut w = world(1);
    w.max_attempts = 1;
    let a = w.ingest("a");
    let d = w.take(Msg::Process(a.clone()));
    w.fault_on(d, "mark", Fault::FailBeforeWrite);
    assert_eq!(w.run(d), End::StoreError);
    assert_eq!(w.state(&a), RequestState::Accepted);
    assert_eq!(
        w.owners(),
        [1],
        "no compensating release after a failed mark"
    );
    assert_eq!(
        w.deliver(Msg::DeadLetter(a.clone())),
        End::Reply(Reply::Ack)
    );
    assert_eq!(w.state(&a), RequestState::Failed);
    assert_eq!(w.owners(), Vec::<u64>::new());
    assert_eq!(w.applied("release"), 1);
    clean(&w);
    drained(&mut w);
}

#[test]
fn s08_lost_mark_race_already_processing_keeps_slot() {
    let mut w = world(1);
    let a = w.ingest("a");
    let d1 = w.take(Msg::Process(a.clone()));
    w.run_until_applied(d1, "claim");
    let d2 = w.start(Msg::Process(a.clone()));
    w.step(d2);
    w.step(d2);
    w.run_until_applied(d1, "mark");
    let lost = w.step(d2).unwrap();
    assert_eq!(
        lost,
        crate::admission::model::StepResult::Wrote {
            label: "mark",
            applied: false
        }
    );
    assert!(is_publish(&w.run(d2)));
    assert!(is_publish(&w.run(d1)));
    assert_eq!(w.owners(), [1]);
    assert_eq!(w.applied("release"), 0);
    clean(&w);
    drained(&mut w);
}

#[test]
fn s09_claim_conflict_from_concurrent_ingest_still_latest_reclaims() {
    let mut w = world(1);
    // The ingest created `a` but has not stamped it yet when `a` is processed.
    let ingest = w.start(Msg::Ingest(uri("a")));
    w.step(ingest);
    let a = rid(1);
    let d = w.start(Msg::Process(a.clone()));
    w.step(d);
    w.step(d);
    w.run(ingest);
    let conflict = w.step(d).unwrap();
    assert_eq!(
        conflict,
        crate::admission::model::StepResult::Wrote {
            label: "claim",
            applied: false
        }
    );
    assert!(is_publish(&w.run(d)));
    assert_eq!(w.row().queue.latest_request_id, Some(a.clone()));
    assert_eq!(w.owners(), [1]);
    clean(&w);
    drained(&mut w);
}

#[test]
fn s10_claim_conflict_newer_head_supersedes_without_claim() {
    let mut w = world(1);
    let a = w.ingest("a");
    let d = w.take(Msg::Process(a.clone()));
    w.step(d);
    w.step(d);
    let b = w.ingest("b");
    assert_eq!(w.run(d), End::Reply(Reply::Ack));
    assert_eq!(w.state(&a), RequestState::Superseded);
    assert_eq!(w.applied("claim"), 0);
    assert!(is_publish(&w.process(&b)));
    assert_eq!(w.owners(), [2]);
    clean(&w);
    drained(&mut w);
}

#[test]
fn s11_claim_conflict_own_id_present_resumes_without_duplicate() {
    let mut w = world(2);
    let a = w.ingest("a");
    let d1 = w.take(Msg::Process(a.clone()));
    let d2 = w.start(Msg::Process(a.clone()));
    for d in [d1, d1, d2, d2] {
        w.step(d);
    }
    w.step(d1);
    let conflict = w.step(d2).unwrap();
    assert_eq!(
        conflict,
        crate::admission::model::StepResult::Wrote {
            label: "claim",
            applied: false
        }
    );
    assert!(is_publish(&w.run(d2)));
    assert!(is_publish(&w.run(d1)));
    assert_eq!(w.owners(), [1]);
    assert_eq!(w.applied("claim"), 1);
    clean(&w);
    drained(&mut w);
}

#[test]
fn s12_gate_closed_holds_with_delay_without_consuming_a_retry() {
    let mut w = world(1);
    w.cfg.gate_wait_delay = Duration::from_millis(7_000);
    let a = admit(&mut w, "a");
    let b = w.ingest("b");
    let (queue_version, request_version) = (w.row().queue.version, w.request(&b).version);
    for _ in 0..5 {
        let end = w.process(&b);
        assert_eq!(
            end,
            End::Reply(Reply::Hold {
                delay: Duration::from_millis(7_000),
                paused: false
            })
        );
    }
    // A hold is its own reply, not a retry, and writes nothing: holding as often
    // as the gate stays closed costs no delivery attempt and no version.
    assert_eq!(w.row().queue.version, queue_version);
    assert_eq!(w.request(&b).version, request_version);
    assert_eq!(w.owners(), [a.seq()]);
    clean(&w);
    drained(&mut w);
}

#[test]
fn s13_gate_closed_while_two_newer_heads_arrive() {
    let mut w = world(1);
    let a = admit(&mut w, "a");
    let b = w.ingest("b");
    assert!(matches!(w.process(&b), End::Reply(Reply::Hold { .. })));
    let c = w.ingest("c");
    let d = w.ingest("d");
    assert_eq!(w.process(&b), End::Reply(Reply::Ack));
    assert_eq!(w.process(&c), End::Reply(Reply::Ack));
    assert_eq!(w.state(&b), RequestState::Superseded);
    assert_eq!(w.state(&c), RequestState::Superseded);
    assert!(matches!(w.process(&d), End::Reply(Reply::Hold { .. })));
    w.finish_build(&a, BuildOutcome::Succeeded);
    drained(&mut w);
    assert_eq!(w.state(&d), RequestState::Succeeded);
}

#[test]
fn s14_invalid_config_is_a_non_retryable_error() {
    let mut w = world(1);
    w.cfg.gate_wait_delay = Duration::ZERO;
    let a = w.ingest("a");
    let end = w.process(&a);
    assert_eq!(
        end,
        End::Reply(Reply::Error(AdmissionError::Config(
            AdmissionConfigError::GateWaitDelayZero
        )))
    );
    assert_eq!(w.applied("claim"), 0);
    assert!(w.inbox.iter().any(|p| p.msg == Msg::DeadLetter(a.clone())));
    let zero_max = AdmissionConfig {
        max_concurrent: 0,
        ..AdmissionConfig::default()
    };
    let err = zero_max.validate().unwrap_err();
    assert_eq!(err, AdmissionConfigError::MaxConcurrentZero);
    assert!(err.to_string().contains("max_concurrent is 0"), "{err}");
    assert!(
        AdmissionConfigError::GateWaitDelayZero
            .to_string()
            .contains("gate_wait_delay is 0 ms")
    );
    clean(&w);
}

#[test]
fn s15_ancestry_error_is_an_error_without_claim() {
    let mut w = world(1);
    w.set_last_green("green");
    let a = w.ingest("a");
    w.ancestry
        .insert(uri("a"), AncestryAnswer::Failed("git unavailable".into()));
    let end = w.process(&a);
    let End::Reply(Reply::Retry(RetryReason::Ancestry { reason, .. })) = end else {
        panic!("{end:?}");
    };
    assert_eq!(reason, "git unavailable");
    assert_eq!(w.owners(), Vec::<u64>::new());
    assert_eq!(w.state(&a), RequestState::Accepted);
    w.ancestry.insert(uri("a"), AncestryAnswer::Ancestor);
    assert!(is_publish(&w.process(&a)));
    assert_eq!(
        w.request(&a).plan,
        Some(BuildPlan {
            strategy: BuildStrategy::IncrementalSinceGreen,
            base: Some(uri("green"))
        })
    );
    let b = w.ingest("b");
    w.ancestry.insert(uri("b"), AncestryAnswer::NotAncestor);
    w.finish_build(&a, BuildOutcome::Succeeded);
    w.deliver(Msg::Outcome(a, BuildOutcome::Succeeded));
    assert!(is_publish(&w.process(&b)));
    assert_eq!(
        w.request(&b).plan.as_ref().unwrap().strategy,
        BuildStrategy::Full
    );
    clean(&w);
    drained(&mut w);
}

#[test]
fn s16_publish_fails_after_mark_stays_owner_and_redelivery_republishes() {
    let mut w = world(1);
    let a = w.ingest("a");
    let d = w.take(Msg::Process(a.clone()));
    w.fault_on(d, "publish", Fault::PublishFails);
    assert_eq!(w.run(d), End::PublishFailed);
    assert_eq!(w.state(&a), RequestState::Processing);
    assert_eq!(w.owners(), [1]);
    assert!(w.published.is_empty());
    assert!(is_publish(&w.process(&a)));
    assert_eq!(w.published, [a]);
    clean(&w);
    drained(&mut w);
}

#[test]
fn s17_outcome_crash_after_release_second_release_is_noop() {
    let mut w = world(2);
    let (a, b) = s17_script(&mut w);
    assert_eq!(w.state(&a), RequestState::Succeeded);
    assert_eq!(w.owners(), [b.seq()], "the other owner is untouched");
    assert_eq!(w.applied("release"), 1);
    clean(&w);
    drained(&mut w);
}

#[test]
fn s18_two_outcome_chains_one_removal_first_outcome_wins() {
    let mut w = world(2);
    let (a, b) = s18_script(&mut w);
    assert_eq!(w.applied("release"), 1);
    assert_eq!(w.applied("finish"), 1, "one terminal write");
    // The second chain reached the terminal write first; the first one then acked.
    assert_eq!(w.state(&a), RequestState::Failed);
    assert_eq!(w.owners(), [b.seq()]);
    assert_eq!(
        w.row().queue.last_green,
        None,
        "the losing succeeded outcome records no green"
    );
    clean(&w);
    drained(&mut w);
}

#[test]
fn s19_dead_letter_races_an_outcome() {
    let mut w = world(2);
    let (a, b) = s19_script(&mut w);
    assert_eq!(w.applied("release"), 1);
    assert_eq!(w.applied("fail") + w.applied("finish"), 1);
    assert!(w.state(&a).is_terminal());
    assert_eq!(w.owners(), [b.seq()]);
    clean(&w);
    drained(&mut w);
}

#[test]
fn s20_outcome_write_fails_after_release_bounded_over_admission_healed() {
    let mut w = world(1);
    let a = admit(&mut w, "a");
    w.builds.remove(&a);
    let d = w.start(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    w.fault_on(d, "finish", Fault::FailBeforeWrite);
    assert_eq!(w.run(d), End::StoreError);
    assert_eq!(w.owners(), Vec::<u64>::new());
    let b = admit(&mut w, "b");
    // Over-admission by one: `a` still reads processing while `b` owns the slot.
    assert_eq!(w.count_in(RequestState::Processing), 2);
    assert_eq!(w.owners(), [b.seq()]);
    w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    assert_eq!(w.state(&a), RequestState::Succeeded);
    assert_eq!(w.count_in(RequestState::Processing), 1);
    clean(&w);
    drained(&mut w);
}

#[test]
fn s21_release_hard_error_is_not_terminal_and_retried() {
    let mut w = world(1);
    let a = admit(&mut w, "a");
    w.builds.remove(&a);
    let d = w.start(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    w.fault_on(d, "release", Fault::FailBeforeWrite);
    assert_eq!(w.run(d), End::StoreError);
    assert_eq!(w.state(&a), RequestState::Processing);
    assert_eq!(w.owners(), [1]);
    assert_eq!(w.inbox.back().unwrap().attempts, 1);
    w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    assert_eq!(w.state(&a), RequestState::Succeeded);
    assert_eq!(w.owners(), Vec::<u64>::new());
    clean(&w);
    drained(&mut w);
}

#[test]
fn s22_dead_letter_for_missing_request_missing_queue_or_terminal_request() {
    let mut w = world(1);
    assert_eq!(w.deliver(Msg::DeadLetter(rid(99))), End::Reply(Reply::Ack));
    let a = admit(&mut w, "a");
    w.finish_build(&a, BuildOutcome::Succeeded);
    w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    let writes = w.trace.len();
    assert_eq!(
        w.deliver(Msg::DeadLetter(a.clone())),
        End::Reply(Reply::Ack)
    );
    assert_eq!(w.state(&a), RequestState::Succeeded, "terminal is final");
    assert_eq!(w.trace.len(), writes + 1, "only the ack");
    // A request whose queue record is missing: nothing to release, it is failed.
    let b = w.ingest("b");
    w.store.queue = None;
    assert_eq!(
        w.deliver(Msg::DeadLetter(b.clone())),
        End::Reply(Reply::Ack)
    );
    assert_eq!(w.state(&b), RequestState::Failed);
    clean(&w);
}

#[test]
fn s23_dead_letter_crash_between_its_writes_redelivered() {
    let mut w = world(1);
    let a = admit(&mut w, "a");
    w.builds.remove(&a);
    let d = w.start(Msg::DeadLetter(a.clone()));
    w.run_until_applied(d, "fail");
    w.crash(d);
    // Failed first (the fence), the slot still owned until the redelivery.
    assert_eq!(w.state(&a), RequestState::Failed);
    assert_eq!(w.owners(), [a.seq()]);
    assert_eq!(
        w.deliver(Msg::DeadLetter(a.clone())),
        End::Reply(Reply::Ack)
    );
    assert_eq!(w.state(&a), RequestState::Failed);
    assert_eq!(w.applied("release"), 1);
    assert_eq!(w.owners(), Vec::<u64>::new());
    clean(&w);
    drained(&mut w);
}

#[test]
fn s24_dead_letter_of_a_superseded_request_acks() {
    let mut w = world(1);
    let a = w.ingest("a");
    let _b = w.ingest("b");
    assert_eq!(w.process(&a), End::Reply(Reply::Ack));
    assert_eq!(w.state(&a), RequestState::Superseded);
    let version = w.request(&a).version;
    assert_eq!(
        w.deliver(Msg::DeadLetter(a.clone())),
        End::Reply(Reply::Ack)
    );
    assert_eq!(w.state(&a), RequestState::Superseded);
    assert_eq!(w.request(&a).version, version);
    clean(&w);
    drained(&mut w);
}

#[test]
fn s25_redelivered_process_for_processing_or_terminal_request() {
    let mut w = world(1);
    let a = admit(&mut w, "a");
    let version = w.row().queue.version;
    assert!(is_publish(&w.process(&a)), "processing: republish");
    assert_eq!(w.row().queue.version, version);
    assert_eq!(w.published, [a.clone(), a.clone()]);
    w.finish_build(&a, BuildOutcome::Cancelled);
    w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Cancelled));
    assert_eq!(w.process(&a), End::Reply(Reply::Ack), "terminal: ack");
    assert_eq!(w.state(&a), RequestState::Cancelled);
    clean(&w);
    drained(&mut w);
}

#[test]
fn s26_max_lowered_from_two_to_one_with_two_owners() {
    let mut w = world(2);
    let a = admit(&mut w, "a");
    let b = admit(&mut w, "b");
    w.set_max(1);
    let c = w.ingest("c");
    assert!(matches!(w.process(&c), End::Reply(Reply::Hold { .. })));
    w.finish_build(&a, BuildOutcome::Succeeded);
    w.deliver(Msg::Outcome(a, BuildOutcome::Succeeded));
    assert_eq!(w.owners(), [b.seq()]);
    assert!(matches!(w.process(&c), End::Reply(Reply::Hold { .. })));
    w.finish_build(&b, BuildOutcome::Succeeded);
    w.deliver(Msg::Outcome(b, BuildOutcome::Succeeded));
    assert!(is_publish(&w.process(&c)));
    assert_eq!(w.owners(), [c.seq()]);
    clean(&w);
    drained(&mut w);
}

#[test]
fn s27_backfill_from_anonymous_count_yields_the_processing_owner() {
    let mut w = world(1);
    // Admitted by the old binaries: processing, counted, not in the owner set.
    let a = w.ingest("a");
    w.inbox.clear();
    let mut admitted = w.request(&a).clone();
    admitted.state = RequestState::Processing;
    admitted.plan = Some(BuildPlan {
        strategy: BuildStrategy::Full,
        base: None,
    });
    w.store.requests.insert(a.clone(), admitted);
    w.builds.insert(a.clone());
    w.tolerated.insert(a.clone());
    let b = w.ingest("b");
    w.inbox.clear();

    let requests: Vec<_> = w.store.requests.values().cloned().collect();
    let queue = w.row().queue.clone();
    let decision = decide_backfill(&queue, &requests, w.now);
    let Decision::Write(Write::Queue {
        kind: QueueWrite::Backfill { added },
        expected,
        queue: next,
    }) = decision
    else {
        panic!("{decision:?}");
    };
    assert_eq!(added, std::slice::from_ref(&a));
    assert_eq!(expected, queue.version);
    assert!(next.owners.keys().eq([&a]));
    w.store.queue.as_mut().unwrap().queue = next.clone();
    w.resync_ghost();
    w.tolerated.clear();
    assert_eq!(
        decide_backfill(&next, &requests, w.now),
        Decision::Reply(Reply::Ack),
        "backfill is idempotent"
    );

    assert!(
        matches!(w.process(&b), End::Reply(Reply::Hold { .. })),
        "the gate counts a"
    );
    w.finish_build(&a, BuildOutcome::Succeeded);
    w.deliver(Msg::Outcome(a, BuildOutcome::Succeeded));
    assert!(is_publish(&w.process(&b)));
    clean(&w);
    drained(&mut w);
}

#[test]
fn s28_reconcile_prunes_a_terminal_owner_and_the_head_is_admitted() {
    let mut w = world(1);
    // A missed release: `a` succeeded but still owns the slot.
    let a = admit(&mut w, "a");
    w.builds.remove(&a);
    let mut done = w.request(&a).clone();
    done.state = RequestState::Succeeded;
    w.store.requests.insert(a.clone(), done);
    w.tolerated.insert(a.clone());
    w.inbox.clear();
    let b = w.ingest("b");
    assert!(is_publish(&w.process(&b)));
    assert_eq!(w.applied("prune"), 1);
    assert_eq!(w.owners(), [b.seq()]);
    assert!(w.tolerated.is_empty());
    clean(&w);
    drained(&mut w);
}

/// Not in the list: the race the fence closes. A delivery that loaded the
/// request while it owned the slot and was the head must not mark it processing
/// after another delivery released that slot because a newer head arrived.
#[test]
fn fence_stops_a_stale_mark_after_a_release_for_supersede() {
    let mut w = world(1);
    let a = claimed_then_crashed(&mut w, "a");
    let stale = w.start(Msg::Process(a.clone()));
    w.step(stale);
    w.step(stale);
    let b = w.ingest("b");
    let fresh = w.take(Msg::Process(a.clone()));
    assert_eq!(w.run(fresh), End::Reply(Reply::Ack));
    assert_eq!(w.state(&a), RequestState::Superseded);
    let lost = w.step(stale).unwrap();
    assert_eq!(
        lost,
        crate::admission::model::StepResult::Wrote {
            label: "mark",
            applied: false
        }
    );
    assert_eq!(w.run(stale), End::Reply(Reply::Ack));
    assert_eq!(w.state(&a), RequestState::Superseded);
    assert!(is_publish(&w.process(&b)));
    clean(&w);
    drained(&mut w);
}

// ---------------------------------------------------------------------------------
// The last green bookmark: written by a succeeded outcome after its terminal write,
// only ever forward.
// ---------------------------------------------------------------------------------

/// The bookmark naming request `id` at revision `name`.
fn green(id: &RequestId, name: &str) -> Option<LastGreen> {
    Some(LastGreen {
        uri: uri(name),
        request_id: id.clone(),
    })
}

/// The labels of the writes the deliveries of `who` (e.g. "outcome 1") applied.
fn applied_by(w: &World<OwnerKeyed>, who: &str) -> Vec<String> {
    let prefix = format!(" {who}: ");
    w.trace
        .iter()
        .filter_map(|l| {
            let (_, rest) = l.split_once(&prefix)?;
            let (label, _) = rest.split_once(" applied")?;
            Some(label.to_owned())
        })
        .collect()
}

#[test]
fn green_a_succeeded_outcome_moves_last_green_after_the_terminal_write() {
    let mut w = world(1);
    let a = admit(&mut w, "a");
    w.finish_build(&a, BuildOutcome::Succeeded);
    assert_eq!(
        w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Succeeded)),
        End::Reply(Reply::Ack)
    );
    assert_eq!(w.row().queue.last_green, green(&a, "a"));
    assert_eq!(applied_by(&w, "outcome 1"), ["release", "finish", "green"]);
    // A redelivery finds the bookmark already there: ack, no write.
    let version = w.row().queue.version;
    assert_eq!(
        w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Succeeded)),
        End::Reply(Reply::Ack)
    );
    assert_eq!(w.row().queue.version, version);
    assert_eq!(w.applied("green"), 1);

    // Failed, cancelled and superseded requests never move it.
    for (name, outcome) in [("b", BuildOutcome::Failed), ("c", BuildOutcome::Cancelled)] {
        let id = admit(&mut w, name);
        w.finish_build(&id, outcome);
        w.deliver(Msg::Outcome(id.clone(), outcome));
        assert_eq!(w.state(&id), outcome.state());
        assert_eq!(w.row().queue.last_green, green(&a, "a"));
    }
    let d = w.ingest("d");
    let _e = w.ingest("e");
    assert_eq!(w.process(&d), End::Reply(Reply::Ack));
    assert_eq!(w.state(&d), RequestState::Superseded);
    assert_eq!(
        w.deliver(Msg::Outcome(d.clone(), BuildOutcome::Succeeded)),
        End::Reply(Reply::Ack)
    );
    assert_eq!(w.row().queue.last_green, green(&a, "a"));
    assert_eq!(w.applied("green"), 1);
    clean(&w);
    drained(&mut w);
}

#[test]
fn green_an_older_success_after_a_newer_one_does_not_move_it_back() {
    let mut w = world(2);
    let a = admit(&mut w, "a");
    let b = admit(&mut w, "b");
    w.finish_build(&b, BuildOutcome::Succeeded);
    w.deliver(Msg::Outcome(b.clone(), BuildOutcome::Succeeded));
    assert_eq!(w.row().queue.last_green, green(&b, "b"));
    w.finish_build(&a, BuildOutcome::Succeeded);
    assert_eq!(
        w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Succeeded)),
        End::Reply(Reply::Ack)
    );
    assert_eq!(w.state(&a), RequestState::Succeeded);
    assert_eq!(applied_by(&w, "outcome 1"), ["release", "finish"]);
    assert_eq!(w.row().queue.last_green, green(&b, "b"));
    clean(&w);
    drained(&mut w);
}

#[test]
fn green_crash_after_the_terminal_write_is_recorded_on_redelivery() {
    let mut w = world(1);
    let a = admit(&mut w, "a");
    w.builds.remove(&a);
    let d = w.start(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    w.run_until_applied(d, "finish");
    w.crash(d);
    assert_eq!(w.state(&a), RequestState::Succeeded);
    assert_eq!(w.row().queue.last_green, None);
    clean(&w);
    // The stored state decides, not the message: a duplicate outcome chain that
    // reported a failure still records the green of the request that succeeded.
    assert_eq!(
        w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Failed)),
        End::Reply(Reply::Ack)
    );
    assert_eq!(w.state(&a), RequestState::Succeeded, "first writer wins");
    assert_eq!(w.row().queue.last_green, green(&a, "a"));
    assert_eq!(
        w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Succeeded)),
        End::Reply(Reply::Ack)
    );
    assert_eq!(w.applied("green"), 1);
    assert_eq!(w.applied("release"), 1);
    clean(&w);
    drained(&mut w);
}

#[test]
fn green_a_request_stored_as_failed_never_records_a_green() {
    let mut w = world(1);
    let a = admit(&mut w, "a");
    w.finish_build(&a, BuildOutcome::Failed);
    w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Failed));
    assert_eq!(
        w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Succeeded)),
        End::Reply(Reply::Ack)
    );
    assert_eq!(w.state(&a), RequestState::Failed);
    assert_eq!(w.row().queue.last_green, None);
    clean(&w);
    drained(&mut w);
}

#[test]
fn green_record_conflicting_with_an_ingest_reloads_and_keeps_the_latest() {
    let mut w = world(1);
    let a = admit(&mut w, "a");
    w.builds.remove(&a);
    let d = w.start(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    w.run_until_applied(d, "finish");
    w.step(d);
    w.step(d);
    let b = w.ingest("b");
    assert_eq!(
        w.step(d).unwrap(),
        crate::admission::model::StepResult::Wrote {
            label: "green",
            applied: false
        }
    );
    assert_eq!(w.run(d), End::Reply(Reply::Ack));
    assert_eq!(w.row().queue.last_green, green(&a, "a"));
    assert_eq!(w.row().queue.latest_request_id, Some(b));
    clean(&w);
    drained(&mut w);
}

#[test]
fn green_a_newer_descendant_builds_incrementally_since_the_green() {
    let mut w = world(1);
    let a = admit(&mut w, "a");
    assert_eq!(
        w.request(&a).plan.as_ref().unwrap().strategy,
        BuildStrategy::Full
    );
    w.finish_build(&a, BuildOutcome::Succeeded);
    w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    assert_eq!(w.row().queue.last_green, green(&a, "a"));

    let b = w.ingest("b");
    w.ancestry.insert(uri("b"), AncestryAnswer::Ancestor);
    assert!(is_publish(&w.process(&b)));
    assert_eq!(
        w.request(&b).plan,
        Some(BuildPlan {
            strategy: BuildStrategy::IncrementalSinceGreen,
            base: Some(uri("a"))
        })
    );
    w.finish_build(&b, BuildOutcome::Succeeded);
    w.deliver(Msg::Outcome(b.clone(), BuildOutcome::Succeeded));
    assert_eq!(w.row().queue.last_green, green(&b, "b"));

    // The base follows the bookmark; a revision it does not descend from builds fully.
    let c = w.ingest("c");
    w.ancestry.insert(uri("c"), AncestryAnswer::NotAncestor);
    assert!(is_publish(&w.process(&c)));
    assert_eq!(
        w.request(&c).plan,
        Some(BuildPlan {
            strategy: BuildStrategy::Full,
            base: None
        })
    );
    clean(&w);
    drained(&mut w);
}

/// Not in the list: two concurrent deliveries of a superseded request that
/// owns a slot, stepped in lockstep (one loop iteration each in turn). Each fences
/// after the other's fence; a delivery that required the request to be exactly at
/// its own fence's version would re-fence forever and never release. Any later
/// version is as good as its own fence, so the first to reload releases, and the
/// other supersedes without a slot.
#[test]
fn two_deliveries_in_lockstep_fence_once_each_then_release_and_supersede() {
    let mut w = world(1);
    let a = claimed_then_crashed(&mut w, "a");
    let b = w.ingest("b");
    let d1 = w.take(Msg::Process(a.clone()));
    let d2 = w.start(Msg::Process(a.clone()));
    let mut writes = Vec::new();
    for _ in 0..3 {
        for d in [d1, d2] {
            if let Some(crate::admission::model::StepResult::Wrote { label, applied }) =
                w.iterate(d)
            {
                writes.push((d, label, applied));
            }
        }
    }
    assert_eq!(
        writes,
        [
            (d1, "fence", true),
            (d2, "fence", true),
            (d1, "release", true),
            (d2, "supersede", true),
        ],
        "{:#?}",
        w.trace
    );
    assert_eq!(w.state(&a), RequestState::Superseded);
    assert_eq!(w.owners(), Vec::<u64>::new());
    w.lockstep(d1, d2);
    assert_eq!(w.applied("fence"), 2);
    assert_eq!(w.applied("release"), 1);
    assert!(is_publish(&w.process(&b)));
    clean(&w);
    drained(&mut w);
}

// ---------------------------------------------------------------------------------
// Slot leases, heartbeats, limits in the queue record, the fenced dead letter.
// ---------------------------------------------------------------------------------

fn at_secs(secs: u64) -> holdfast_domain::Timestamp {
    holdfast_domain::Timestamp::from_millis(secs * 1_000)
}

fn leased(max: u32, lease_secs: u64) -> World<OwnerKeyed> {
    let mut w = world(max);
    w.cfg.slot_lease = Duration::from_secs(lease_secs);
    w
}

/// The build outcome never arrives: once the lease runs out without a heartbeat,
/// the next gate decision fails the owner with `slot_lease_expired`, frees its
/// slot and admits the head. Before that, the head holds.
#[test]
fn a_lost_outcome_expires_with_the_lease_and_the_queue_moves_on() {
    let mut w = leased(1, 60);
    let a = admit(&mut w, "a");
    w.builds.remove(&a); // the runner died: no outcome, no heartbeat
    let b = w.ingest("b");
    w.now = at_secs(59);
    assert!(matches!(w.process(&b), End::Reply(Reply::Hold { .. })));
    w.now = at_secs(60);
    assert!(is_publish(&w.process(&b)));
    assert_eq!(w.state(&a), RequestState::Failed);
    assert_eq!(
        w.request(&a).reason,
        Some(holdfast_domain::FailReason::SlotLeaseExpired)
    );
    assert_eq!(w.owners(), [b.seq()]);
    assert_eq!(
        applied_by(&w, "process 2"),
        ["expire", "prune", "claim", "mark"]
    );
    clean(&w);
    drained(&mut w);
}

/// Heartbeats keep a long build's slot; a heartbeat after the lease ran out is
/// refused, and a reconcile pass (not only a gate decision) expires the owner.
#[test]
fn heartbeats_keep_the_slot_and_a_reconcile_expires_a_silent_owner() {
    let mut w = leased(1, 60);
    let a = admit(&mut w, "a");
    for secs in [50, 100, 150] {
        w.now = at_secs(secs);
        assert_eq!(w.deliver(Msg::Heartbeat(a.clone())), End::Reply(Reply::Ack));
        assert_eq!(w.deliver(Msg::Reconcile), End::Reply(Reply::Ack));
    }
    assert_eq!(w.applied("heartbeat"), 3);
    assert_eq!(w.state(&a), RequestState::Processing);
    w.now = at_secs(210);
    assert_eq!(w.deliver(Msg::Heartbeat(a.clone())), End::Reply(Reply::Ack));
    assert_eq!(w.applied("heartbeat"), 3, "an expired lease is not revived");
    assert_eq!(w.deliver(Msg::Reconcile), End::Reply(Reply::Ack));
    assert_eq!(w.state(&a), RequestState::Failed);
    assert_eq!(w.owners(), Vec::<u64>::new());
    // The build's late outcome finds a terminal request: first terminal writer won.
    w.finish_build(&a, BuildOutcome::Succeeded);
    w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    assert_eq!(w.state(&a), RequestState::Failed);
    clean(&w);
    drained(&mut w);
}

/// A stored limit of 0 pauses the queue: the head holds (saying so) however many
/// slots are free; raising the limit admits it on the next delivery. The limit is
/// the queue's, not the configuration's.
#[test]
fn a_paused_queue_holds_every_head_until_its_limit_is_raised() {
    let mut w = world(2);
    let a = w.ingest("a");
    assert_eq!(
        w.row().queue.max_concurrent,
        Some(2),
        "stored by the first stamp"
    );
    w.set_max(0);
    assert_eq!(
        w.process(&a),
        End::Reply(Reply::Hold {
            delay: w.cfg.gate_wait_delay,
            paused: true
        })
    );
    assert_eq!(w.owners(), Vec::<u64>::new());
    w.set_max(1);
    w.cfg.max_concurrent = 5; // a replica's config no longer decides
    assert!(is_publish(&w.process(&a)));
    let b = w.ingest("b");
    assert!(matches!(
        w.process(&b),
        End::Reply(Reply::Hold { paused: false, .. })
    ));
    clean(&w);
    drained(&mut w);
}

/// The dead letter of an accepted owner fails it before it releases: a delivery
/// that read the request (accepted, owning its slot) before cannot mark it
/// processing after the slot is gone.
#[test]
fn the_dead_letter_fences_a_stale_mark_before_it_releases() {
    let mut w = world(1);
    let a = claimed_then_crashed(&mut w, "a");
    let stale = w.start(Msg::Process(a.clone()));
    w.step(stale);
    w.step(stale);
    assert_eq!(
        w.deliver(Msg::DeadLetter(a.clone())),
        End::Reply(Reply::Ack)
    );
    assert_eq!(applied_by(&w, "dead-letter 1"), ["fail", "release"]);
    assert_eq!(
        w.step(stale).unwrap(),
        crate::admission::model::StepResult::Wrote {
            label: "mark",
            applied: false
        }
    );
    assert_eq!(w.run(stale), End::Reply(Reply::Ack));
    assert_eq!(w.state(&a), RequestState::Failed);
    assert!(w.published.is_empty());
    clean(&w);
    drained(&mut w);
}

/// A dead letter and a duplicate process delivery of an accepted owner (its
/// claim's worker crashed before the mark), one loop iteration each in turn, in
/// both orders: the request ends failed and no slot is owned, with every
/// invariant checked after each step. The dead letter writes `failed` before it
/// releases because a fence-then-release order lets a duplicate re-claim the
/// released slot and, if the dead letter then releases that claim between the
/// duplicate's read and its mark, leave the request processing without a slot.
#[test]
fn a_dead_letter_racing_a_duplicate_process_leaves_no_processing_request_without_a_slot() {
    for dead_letter_first in [true, false] {
        let mut w = world(1);
        let a = claimed_then_crashed(&mut w, "a");
        w.inbox.clear();
        let dead = w.start(Msg::DeadLetter(a.clone()));
        let process = w.start(Msg::Process(a.clone()));
        if dead_letter_first {
            w.lockstep(dead, process);
        } else {
            w.lockstep(process, dead);
        }
        assert_eq!(w.state(&a), RequestState::Failed, "{:#?}", w.trace);
        assert_eq!(w.owners(), Vec::<u64>::new(), "{:#?}", w.trace);
        clean(&w);
        drained(&mut w);
    }
}

/// A claim whose worker crashed before the mark, redelivered after the slot lease
/// ran out: the resume refreshes the slot's heartbeat before it publishes, so the
/// next reconcile does not fail the build it just started.
#[test]
fn a_late_resume_refreshes_its_lease_before_it_publishes() {
    let mut w = leased(1, 60);
    let a = claimed_then_crashed(&mut w, "a");
    w.now = at_secs(61);
    assert!(is_publish(&w.process(&a)));
    assert_eq!(applied_by(&w, "process 1"), ["claim", "heartbeat", "mark"]);
    assert_eq!(w.deliver(Msg::Reconcile), End::Reply(Reply::Ack));
    assert_eq!(w.state(&a), RequestState::Processing);
    assert_eq!(w.owners(), [a.seq()]);
    clean(&w);
    drained(&mut w);
}
