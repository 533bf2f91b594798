//! The 28 named scenarios of issue 3 and scenarios 29–40 of issue 25
//! (publications, generations, quiet owners, the heartbeat/expiry race, the hold
//! of a duplicate until its build's first heartbeat), with max_concurrent 1
//! unless the name says otherwise, run against the owner-keyed rules. Scenarios
//! 2, 17–19, 29, 31 and 38 are scripts shared with the oracle, whose older
//! designs must fail them. Scenarios 36 and 37 pin two rule fixes found with the
//! model: an outcome writes the terminal state before it releases, and a
//! backfilled owner counts as published at the backfill.

use std::time::Duration;

use holdfast_domain::admission::{
    AdmissionConfig, AdmissionConfigError, AdmissionError, AncestryAnswer, BuildOutcome, Decision,
    Heartbeat, QueueWrite, Reply, RetryReason, Write, decide_backfill, decide_withdraw,
};
use holdfast_domain::{
    BuildPlan, BuildStrategy, FailReason, Generation, LastGreen, RequestId, RequestState, Timestamp,
};

use crate::admission::model::{
    Build, Design, End, Fault, Msg, OwnerKeyed, StepResult, World, rid, uri,
};

/// The first publication of a build.
const G1: Generation = Generation(1);
/// The second.
const G2: Generation = Generation(2);

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

/// The hold of a duplicate process delivery of an owner whose build has not
/// heartbeated since its publication: back in `millis`, when the publication
/// would go quiet.
fn unconfirmed(millis: u64) -> End {
    End::Reply(Reply::Hold {
        delay: Duration::from_millis(millis),
        paused: false,
    })
}

/// A second later, generation `g` of `id`'s build heartbeats (its first
/// heartbeat: the publication is confirmed), and the process message that was
/// held for it is redelivered early and acks, publishing nothing and writing
/// nothing.
fn confirm_then_ack(w: &mut World<OwnerKeyed>, id: &RequestId, g: Generation) {
    w.tick(Duration::from_secs(1));
    assert!(
        matches!(w.heartbeat(id, g), Heartbeat::Extended { .. }),
        "{:#?}",
        w.trace
    );
    let (version, published) = (w.row().queue.version, w.published.len());
    assert_eq!(w.process(id), End::Reply(Reply::Ack), "{:#?}", w.trace);
    assert_eq!(w.row().queue.version, version);
    assert_eq!(w.published.len(), published);
}

/// Scenario 2: claim, crash before the mark, redeliver.
pub fn s02_script<D: Design>(w: &mut World<D>) -> (RequestId, End) {
    let a = claimed_then_crashed(w, "a");
    let end = w.process(&a);
    (a, end)
}

/// Scenario 17 (max 2): `a` and `b` processing; `a`'s outcome crashes after its
/// release and is redelivered. The owner-keyed rules wrote the terminal state
/// before the release; the old design writes it after, on redelivery.
pub fn s17_script<D: Design>(w: &mut World<D>) -> (RequestId, RequestId) {
    let a = admit(w, "a");
    let b = admit(w, "b");
    w.builds_ended(&a);
    let d = w.start(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    w.run_until_applied(d, "release");
    w.crash(d);
    w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    (a, b)
}

/// Runs two chains for `a` that both load it while processing, the first one
/// releasing before the second decides. The owner-keyed rules write the terminal
/// state before the release, so the second chain's terminal write conflicts and
/// its reload finds `a` terminal and released; the old design releases first, so
/// its second chain's release conflicts and reloads while `a` is still processing.
fn racing_chains<D: Design>(w: &mut World<D>, first: Msg, second: Msg) {
    let d1 = w.start(first);
    let d2 = w.start(second);
    w.step(d1);
    w.step(d1);
    w.step(d2);
    w.step(d2);
    w.run_until_applied(d1, "release");
    // The second chain's first write conflicts; it reloads.
    w.step(d2);
    w.run(d2);
    w.run(d1);
}

/// Scenario 18 (max 2): two outcome chains for `a`.
pub fn s18_script<D: Design>(w: &mut World<D>) -> (RequestId, RequestId) {
    let a = admit(w, "a");
    let b = admit(w, "b");
    w.builds_ended(&a);
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
    w.builds_ended(&a);
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
    // One of the two deliveries publishes the build, the other finds it live
    // and unconfirmed: it holds until it would go quiet, then acks once the
    // build heartbeated.
    assert!(is_publish(&w.run(d2)));
    assert_eq!(w.run(d1), unconfirmed(60_000));
    confirm_then_ack(&mut w, &a, G1);
    assert_eq!(w.published, [(a, G1)]);
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
    assert_eq!(w.run(d1), unconfirmed(60_000));
    confirm_then_ack(&mut w, &a, G1);
    assert_eq!(w.published, [(a, G1)]);
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

/// The failed publish is withdrawn before the retry (as the app does), so the
/// redelivery publishes the next generation at once.
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
    assert_eq!(
        applied_by(&w, "process 1"),
        ["claim", "mark", "publish", "withdraw"]
    );
    assert!(is_publish(&w.process(&a)));
    assert_eq!(w.published, [(a, G2)]);
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
    // The first chain wrote the terminal state; the second one's terminal write
    // conflicted, and its reload found `a` succeeded and released.
    assert_eq!(w.state(&a), RequestState::Succeeded);
    assert_eq!(w.owners(), [b.seq()]);
    // The stored state decides the bookmark, not the message: recorded once,
    // whichever chain got there first (here the losing failed one).
    assert_eq!(w.row().queue.last_green, green(&a, "a"));
    assert_eq!(w.applied("green"), 1);
    assert_eq!(applied_by(&w, "outcome 1"), ["finish", "release", "green"]);
    clean(&w);
    drained(&mut w);
}

#[test]
fn s19_dead_letter_races_an_outcome() {
    let mut w = world(2);
    let (a, b) = s19_script(&mut w);
    assert_eq!(w.applied("release"), 1);
    assert_eq!(w.applied("fail") + w.applied("finish"), 1);
    // The outcome's terminal write came first; the dead letter's conflicted.
    assert_eq!(w.state(&a), RequestState::Succeeded);
    assert_eq!(w.owners(), [b.seq()]);
    clean(&w);
    drained(&mut w);
}

/// The terminal write comes before the release, so a failed terminal write
/// leaves `a` processing with its slot: no over-admission (the release-first
/// order of issue 3 admitted `b` beside it until the redelivery).
#[test]
fn s20_outcome_write_fails_before_the_release_no_over_admission() {
    let mut w = world(1);
    let a = admit(&mut w, "a");
    w.builds_ended(&a);
    let d = w.start(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    w.fault_on(d, "finish", Fault::FailBeforeWrite);
    assert_eq!(w.run(d), End::StoreError);
    assert_eq!(w.state(&a), RequestState::Processing);
    assert_eq!(w.owners(), [a.seq()]);
    let b = w.ingest("b");
    assert!(
        matches!(w.process(&b), End::Reply(Reply::Hold { .. })),
        "`a` still holds the slot"
    );
    assert_eq!(w.count_in(RequestState::Processing), 1);
    w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    assert_eq!(w.state(&a), RequestState::Succeeded);
    assert_eq!(w.owners(), Vec::<u64>::new());
    assert!(is_publish(&w.process(&b)));
    assert_eq!(w.count_in(RequestState::Processing), 1);
    clean(&w);
    drained(&mut w);
}

/// A release that fails after the terminal write leaves a terminal owner; the
/// retried outcome releases it and records the green.
#[test]
fn s21_release_hard_error_after_the_terminal_write_is_retried() {
    let mut w = world(1);
    let a = admit(&mut w, "a");
    w.builds_ended(&a);
    let d = w.start(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    w.fault_on(d, "release", Fault::FailBeforeWrite);
    assert_eq!(w.run(d), End::StoreError);
    assert_eq!(w.state(&a), RequestState::Succeeded);
    assert_eq!(w.owners(), [1]);
    assert_eq!(w.row().queue.last_green, None);
    assert_eq!(w.inbox.back().unwrap().attempts, 1);
    w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    assert_eq!(w.state(&a), RequestState::Succeeded);
    assert_eq!(w.owners(), Vec::<u64>::new());
    assert_eq!(w.row().queue.last_green, green(&a, "a"));
    assert_eq!(applied_by(&w, "outcome 1"), ["finish", "release", "green"]);
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
    w.builds_ended(&a);
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

/// A redelivery of a processing request whose build was published within
/// `resume_after` publishes nothing (issue 25: before, every delivery
/// republished, and a duplicate started a second build). Before the build's
/// first heartbeat it holds until the publication would go quiet (counted from
/// the publication, not from the redelivery), writing nothing; after it, it acks.
#[test]
fn s25_redelivered_process_for_processing_or_terminal_request() {
    let mut w = world(1);
    let a = admit(&mut w, "a");
    let version = w.row().queue.version;
    assert_eq!(
        w.process(&a),
        unconfirmed(60_000),
        "processing: unconfirmed"
    );
    w.tick(Duration::from_secs(20));
    assert_eq!(w.process(&a), unconfirmed(40_000), "still unconfirmed");
    assert_eq!(w.row().queue.version, version);
    assert_eq!(w.inbox[0].due, Some(at_secs(60)), "{:?}", w.inbox);
    assert_eq!(w.inbox[0].attempts, 0, "a hold is no failed attempt");
    confirm_then_ack(&mut w, &a, G1);
    assert_eq!(w.published, [(a.clone(), G1)]);
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

/// Admits `a` as the old binaries did (processing, counted, not in the owner set,
/// its build running without a generation), ingests `b`, then backfills the
/// owners, checking the backfill write. Returns `a` and `b`.
fn backfilled(w: &mut World<OwnerKeyed>) -> (RequestId, RequestId) {
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
    // Its build was started by the old binaries, before generations.
    w.builds
        .insert((a.clone(), Generation::NONE), Build::default());
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
    (a, b)
}

#[test]
fn s27_backfill_from_anonymous_count_yields_the_processing_owner() {
    let mut w = world(1);
    let (a, b) = backfilled(&mut w);
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
    w.builds_ended(&a);
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
    assert_eq!(applied_by(&w, "outcome 1"), ["finish", "release", "green"]);
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
    assert_eq!(applied_by(&w, "outcome 1"), ["finish", "release"]);
    assert_eq!(w.row().queue.last_green, green(&b, "b"));
    clean(&w);
    drained(&mut w);
}

#[test]
fn green_crash_after_the_terminal_write_is_recorded_on_redelivery() {
    let mut w = world(1);
    let a = admit(&mut w, "a");
    w.builds_ended(&a);
    let d = w.start(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    w.run_until_applied(d, "finish");
    w.crash(d);
    assert_eq!(w.state(&a), RequestState::Succeeded);
    assert_eq!(w.owners(), [a.seq()], "a terminal owner, released next");
    assert_eq!(w.row().queue.last_green, None);
    clean(&w);
    // The stored state decides, not the message: a duplicate outcome chain that
    // reported a failure still records the green of the request that succeeded.
    assert_eq!(
        w.deliver(Msg::Outcome(a.clone(), BuildOutcome::Failed)),
        End::Reply(Reply::Ack)
    );
    assert_eq!(w.state(&a), RequestState::Succeeded, "first writer wins");
    assert_eq!(w.owners(), Vec::<u64>::new());
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
    w.builds_ended(&a);
    let d = w.start(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    w.run_until_applied(d, "release");
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
    w.kill_builds(&a); // the runner died: no outcome, no heartbeat
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
        [
            "mark-expiring",
            "expire",
            "prune",
            "claim",
            "mark",
            "publish"
        ]
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
        assert_eq!(
            w.heartbeat(&a, G1),
            Heartbeat::Extended {
                expires_at: at_secs(secs + 60)
            }
        );
        assert_eq!(w.deliver(Msg::Reconcile), End::Reply(Reply::Ack));
    }
    assert_eq!(w.applied("heartbeat"), 3);
    assert_eq!(w.state(&a), RequestState::Processing);
    w.now = at_secs(210);
    assert_eq!(
        w.heartbeat(&a, G1),
        Heartbeat::LeaseExpired {
            expired_at: at_secs(210)
        }
    );
    assert_eq!(w.applied("heartbeat"), 3, "an expired lease is not revived");
    assert!(w.live(&a).is_empty(), "told to stop, the build stops");
    assert_eq!(w.deliver(Msg::Reconcile), End::Reply(Reply::Ack));
    assert_eq!(
        applied_by(&w, "reconcile"),
        ["mark-expiring", "expire", "prune"]
    );
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
    assert_eq!(
        applied_by(&w, "process 1"),
        ["claim", "heartbeat", "mark", "publish"]
    );
    assert_eq!(w.deliver(Msg::Reconcile), End::Reply(Reply::Ack));
    assert_eq!(w.state(&a), RequestState::Processing);
    assert_eq!(w.owners(), [a.seq()]);
    clean(&w);
    drained(&mut w);
}

// ---------------------------------------------------------------------------------
// Issue 25: publications with generations, quiet owners published again, and the
// heartbeat/expiry race closed by the mark.
// ---------------------------------------------------------------------------------

fn at_millis(millis: u64) -> Timestamp {
    Timestamp::from_millis(millis)
}

/// A world with `max` slots, a slot lease of `lease_secs` and publications that
/// go quiet after `resume_secs` without a heartbeat.
fn timed(max: u32, lease_secs: u64, resume_secs: u64) -> World<OwnerKeyed> {
    let mut w = leased(max, lease_secs);
    w.cfg.resume_after = Duration::from_secs(resume_secs);
    w
}

/// Scenario 29 (slot lease 60 s): `a`'s build, published at 0, heartbeats from a
/// step that started at 59.999 s, while a reconcile whose step started at 60 s
/// has read the queue (the lease run out on that read) but not decided yet; the
/// heartbeat lands first. Returns `a` and what its build was told.
pub fn s29_script<D: Design>(w: &mut World<D>) -> (RequestId, Heartbeat) {
    let a = admit(w, "a");
    w.now = at_millis(59_999);
    let beat = w.start(Msg::Heartbeat(a.clone(), G1));
    w.now = at_secs(60);
    let reconcile = w.start(Msg::Reconcile);
    w.step(reconcile);
    let End::Heartbeat(told) = w.run(beat) else {
        panic!("a heartbeat answer: {:#?}", w.trace);
    };
    w.run(reconcile);
    (a, told)
}

/// The heartbeat/expiry race, heartbeat first: the reconcile's mark, decided on
/// its read from before the heartbeat, conflicts (a compare-and-set on the queue,
/// which the heartbeat wrote); read again, the lease runs, so the owner stays and
/// its build was rightly told "extended". Before issue 25 the reconcile failed the
/// request by a compare-and-set on the request alone, which the heartbeat had not
/// touched: the build just told "extended" was failed `slot_lease_expired` (the
/// oracle shows the harness catches exactly that).
#[test]
fn s29_a_heartbeat_landing_before_the_mark_keeps_the_owner() {
    let mut w = leased(1, 60);
    let (a, told) = s29_script(&mut w);
    assert_eq!(
        told,
        Heartbeat::Extended {
            expires_at: at_millis(119_999)
        }
    );
    assert_eq!(applied_by(&w, "heartbeat 1 g1"), ["heartbeat"]);
    assert!(
        w.trace
            .iter()
            .any(|l| l.ends_with(" reconcile: mark-expiring conflict")),
        "{:#?}",
        w.trace
    );
    assert_eq!(w.applied("mark-expiring"), 0);
    assert_eq!(w.state(&a), RequestState::Processing);
    assert_eq!(w.owners(), [a.seq()]);
    assert_eq!(w.live(&a), [G1]);
    clean(&w);
    drained(&mut w);
    assert_eq!(w.state(&a), RequestState::Succeeded);
}

/// The heartbeat/expiry race, mark first: the heartbeat read the queue before the
/// mark (its lease ran until 60 s, its step started at 59.999 s) and decides to
/// extend it; that compare-and-set conflicts with the mark, and read again, the
/// slot is marked: the build is told its lease ran out, never "extended", and the
/// request ends failed `slot_lease_expired`.
#[test]
fn s30_a_heartbeat_after_the_mark_is_told_lease_expired_and_the_request_fails() {
    let mut w = leased(1, 60);
    let a = admit(&mut w, "a");
    w.now = at_millis(59_999);
    let beat = w.start(Msg::Heartbeat(a.clone(), G1));
    w.step(beat);
    w.step(beat);
    w.now = at_secs(60);
    let reconcile = w.start(Msg::Reconcile);
    w.run_until_applied(reconcile, "mark-expiring");
    assert_eq!(
        w.step(beat),
        Some(StepResult::Wrote {
            label: "heartbeat",
            applied: false
        })
    );
    assert_eq!(
        w.run(beat),
        End::Heartbeat(Heartbeat::LeaseExpired {
            expired_at: at_secs(60)
        })
    );
    assert!(w.live(&a).is_empty(), "told to stop, the build stops");
    assert_eq!(w.run(reconcile), End::Reply(Reply::Ack));
    assert_eq!(
        applied_by(&w, "reconcile"),
        ["mark-expiring", "expire", "prune"]
    );
    assert_eq!(w.state(&a), RequestState::Failed);
    assert_eq!(w.request(&a).reason, Some(FailReason::SlotLeaseExpired));
    assert!(
        w.answers
            .iter()
            .all(|(_, _, told)| !matches!(told, Heartbeat::Extended { .. })),
        "{:#?}",
        w.answers
    );
    clean(&w);
    drained(&mut w);
}

/// Scenario 31 script: two deliveries of `a`'s process message, one loop
/// iteration each in turn, then a late third delivery of it.
pub fn s31_script<D: Design>(w: &mut World<D>) -> (RequestId, End) {
    let a = w.ingest("a");
    let first = w.take(Msg::Process(a.clone()));
    let second = w.start(Msg::Process(a.clone()));
    w.lockstep(first, second);
    let late = w.process(&a);
    (a, late)
}

/// Duplicate process deliveries publish one generation: of two deliveries in
/// lockstep, one records the publication and publishes it; the other, and a late
/// redelivery, find a live publication that its build has not confirmed yet and
/// hold until it would go quiet; after the build's first heartbeat a redelivery
/// acks. Once the build died and its publication went quiet, two redeliveries
/// that both read it quiet race: one publication write applies (generation 2),
/// the other conflicts, reads the live, unconfirmed publication and holds.
#[test]
fn s31_duplicate_process_deliveries_publish_one_generation() {
    let mut w = timed(1, 600, 60);
    let (a, late) = s31_script(&mut w);
    assert_eq!(late, unconfirmed(60_000));
    assert_eq!(w.holds, 2, "{:#?}", w.trace);
    assert_eq!(w.published, [(a.clone(), G1)]);
    assert_eq!(w.applied("publish"), 1);
    confirm_then_ack(&mut w, &a, G1);
    w.kill_builds(&a);
    w.tick(Duration::from_secs(60));
    assert_eq!(w.scan(), std::slice::from_ref(&a));
    let first = w.take(Msg::Process(a.clone()));
    let second = w.start(Msg::Process(a.clone()));
    for d in [first, first, second, second] {
        w.step(d);
    }
    assert!(is_publish(&w.run(first)));
    assert_eq!(
        w.step(second),
        Some(StepResult::Wrote {
            label: "publish",
            applied: false
        })
    );
    assert_eq!(w.run(second), unconfirmed(60_000));
    assert_eq!(w.published, [(a.clone(), G1), (a.clone(), G2)]);
    assert_eq!(w.applied("publish"), 2);
    clean(&w);
    drained(&mut w);
    assert_eq!(w.published, [(a.clone(), G1), (a.clone(), G2)]);
}

/// A worker killed between the publication write and the publish, with a
/// delivery source that only scans (its message died with the worker): the
/// publication is recorded (generation 1) but nothing runs and nothing comes
/// back. Once it went quiet (`resume_after` after the write, no heartbeat
/// since), the scan redelivers it and generation 2 is published. Generation 1 is
/// never published. Scenario 38 is the same loss with a source that redelivers.
#[test]
fn s32_a_worker_killed_after_the_publish_write_is_published_again_after_resume_after() {
    let mut w = timed(1, 600, 60);
    let a = w.ingest("a");
    let d = w.take(Msg::Process(a.clone()));
    w.fault_on(d, "publish", Fault::DieAfterWrite);
    assert_eq!(w.run(d), End::Died);
    w.inbox.clear();
    let slot = w.row().queue.owners[&a];
    assert_eq!((slot.generation, slot.published_at), (G1, Some(at_secs(0))));
    assert!(w.published.is_empty());
    w.tick(Duration::from_secs(59));
    assert_eq!(w.scan(), Vec::<RequestId>::new());
    w.tick(Duration::from_secs(1));
    assert_eq!(w.scan(), std::slice::from_ref(&a));
    assert!(is_publish(&w.process(&a)));
    assert_eq!(w.published, [(a.clone(), G2)]);
    // The heartbeat comes in the publication's millisecond: it is recorded one
    // after it, so it shows the hand-over.
    assert_eq!(
        w.heartbeat(&a, G2),
        Heartbeat::Extended {
            expires_at: Timestamp::from_millis(660_001)
        }
    );
    clean(&w);
    drained(&mut w);
}

/// A slow build of generation 1 (no heartbeat within `resume_after`) is presumed
/// lost and generation 2 is published; both run until generation 1's next
/// heartbeat, which is told it is stale (and extends nothing), so it stops.
#[test]
fn s33_a_heartbeat_of_generation_1_after_generation_2_is_told_stale() {
    let mut w = timed(1, 600, 60);
    let a = admit(&mut w, "a");
    w.tick(Duration::from_secs(60));
    assert_eq!(w.scan(), std::slice::from_ref(&a));
    assert!(is_publish(&w.process(&a)));
    assert_eq!(w.live(&a), [G1, G2]);
    assert_eq!(w.heartbeat(&a, G1), Heartbeat::Stale { current: G2 });
    assert_eq!(w.live(&a), [G2]);
    assert_eq!(
        w.applied("heartbeat"),
        0,
        "a stale heartbeat extends nothing"
    );
    w.tick(Duration::from_secs(1));
    assert_eq!(
        w.heartbeat(&a, G2),
        Heartbeat::Extended {
            expires_at: at_secs(661)
        }
    );
    clean(&w);
    drained(&mut w);
    assert_eq!(w.state(&a), RequestState::Succeeded);
}

/// Runs a process delivery until its publish failed (injected); it withdraws next.
fn until_publish_failed(w: &mut World<OwnerKeyed>, d: u64) {
    until_publish_fails_with(w, d, Fault::PublishFails);
}

/// Runs a process delivery until its publish failed with `fault` (injected); it
/// withdraws next.
fn until_publish_fails_with(w: &mut World<OwnerKeyed>, d: u64, fault: Fault) {
    w.fault_on(d, "publish", fault);
    for _ in 0..50 {
        match w.step(d) {
            Some(StepResult::PublishFailed) => return,
            Some(StepResult::Ended(end)) => panic!("ended with {end:?}: {:#?}", w.trace),
            _ => {}
        }
    }
    panic!("never published: {:#?}", w.trace);
}

/// A failed publish is withdrawn before the message is retried (as the app
/// does): the slot forgets when generation 1 was published, so the retry
/// publishes generation 2 at once instead of after `resume_after`; a withdrawal
/// of generation 1 arriving after that changes nothing. A worker that dies
/// between the failed publish and the withdrawal leaves a live publication that
/// nothing confirms: its redelivery holds until the publication would go quiet,
/// then comes back and publishes the next generation (the scan adds nothing: the
/// held message covers the owner).
#[test]
fn s34_a_failed_publish_is_withdrawn_and_the_retry_publishes_the_next_generation() {
    let mut w = timed(1, 600, 60);
    let a = w.ingest("a");
    let d = w.take(Msg::Process(a.clone()));
    until_publish_failed(&mut w, d);
    assert_eq!(w.run(d), End::PublishFailed);
    assert_eq!(
        applied_by(&w, "process 1"),
        ["claim", "mark", "publish", "withdraw"]
    );
    let slot = w.row().queue.owners[&a];
    assert_eq!((slot.generation, slot.published_at), (G1, None));
    assert!(is_publish(&w.process(&a)), "at once");
    assert_eq!(w.published, [(a.clone(), G2)]);
    let version = w.row().queue.version;
    assert_eq!(
        decide_withdraw(Some(w.request(&a)), Some(&w.row().queue), G1),
        Decision::Reply(Reply::Ack)
    );
    assert_eq!(w.row().queue.version, version);
    clean(&w);
    drained(&mut w);

    let mut w = timed(1, 600, 60);
    let a = w.ingest("a");
    let d = w.take(Msg::Process(a.clone()));
    until_publish_failed(&mut w, d);
    w.crash(d);
    assert_eq!(w.deliver_due(), [unconfirmed(60_000)]);
    assert!(w.published.is_empty());
    w.tick(Duration::from_secs(60));
    assert_eq!(w.scan(), Vec::<RequestId>::new());
    let ends = w.deliver_due();
    assert!(
        matches!(ends.as_slice(), [end] if is_publish(end)),
        "{ends:?}"
    );
    assert_eq!(w.published, [(a.clone(), G2)]);
    clean(&w);
    drained(&mut w);
}

/// A build that dies is published again once quiet, from its last sign of life:
/// the lease keeps running from the last heartbeat (a publication is no sign of
/// life), so a build that dies every time is published again every
/// `resume_after` until its lease runs out; then the next delivery expires it
/// (marked, failed `slot_lease_expired`, released) instead of publishing it.
#[test]
fn s35_a_dead_build_is_published_again_until_its_lease_runs_out() {
    let mut w = timed(1, 120, 30);
    let a = admit(&mut w, "a");
    w.tick(Duration::from_secs(20));
    assert!(matches!(w.heartbeat(&a, G1), Heartbeat::Extended { .. }));
    w.kill_builds(&a);
    w.tick(Duration::from_secs(29));
    assert_eq!(w.scan(), Vec::<RequestId>::new(), "quiet at 50 s, not 49 s");
    w.tick(Duration::from_secs(1));
    assert_eq!(w.scan(), std::slice::from_ref(&a));
    assert!(is_publish(&w.process(&a)));
    assert_eq!(w.live(&a), [G2]);
    for g in 3..=4 {
        w.kill_builds(&a);
        w.tick(Duration::from_secs(30));
        assert_eq!(w.scan(), std::slice::from_ref(&a));
        assert!(is_publish(&w.process(&a)));
        assert_eq!(w.live(&a), [Generation(g)]);
    }
    // At 140 s the lease (from the heartbeat at 20 s) has run out.
    w.kill_builds(&a);
    w.tick(Duration::from_secs(30));
    assert_eq!(w.scan(), std::slice::from_ref(&a));
    assert_eq!(w.process(&a), End::Reply(Reply::Ack));
    assert_eq!(
        applied_by(&w, "process 1")[3..],
        [
            "publish",
            "publish",
            "publish",
            "mark-expiring",
            "expire",
            "release"
        ]
    );
    assert_eq!(w.state(&a), RequestState::Failed);
    assert_eq!(w.request(&a).reason, Some(FailReason::SlotLeaseExpired));
    assert_eq!(w.generations(&a), [G1, G2, Generation(3), Generation(4)]);
    clean(&w);
    drained(&mut w);
}

/// Found by the property test: a process delivery that read its request
/// accepted, then (after a whole admission and build in between) reads the queue
/// after the build outcome released the slot, claims a fresh slot. When the
/// outcome released before its terminal write, that claim landed on a processing
/// request, and the reload published generation 1 a second time: a duplicate
/// build, with the same generation, of a request whose build had ended. With the
/// terminal state written first, the claim lands on a terminal request, whose
/// reload releases it and publishes nothing.
#[test]
fn s36_a_stale_claim_after_the_outcome_released_the_slot_publishes_nothing() {
    let mut w = world(1);
    let a = w.ingest("a");
    let stale = w.take(Msg::Process(a.clone()));
    w.step(stale); // reads the request: accepted
    let fresh = w.start(Msg::Process(a.clone()));
    assert!(is_publish(&w.run(fresh)));
    w.finish_build(&a, BuildOutcome::Succeeded);
    let outcome = w.take(Msg::Outcome(a.clone(), BuildOutcome::Succeeded));
    w.run_until_applied(outcome, "release");
    assert_eq!(w.state(&a), RequestState::Succeeded);
    // Reads the queue now: no slot, and the request it read was accepted.
    assert_eq!(w.run(stale), End::Reply(Reply::Ack));
    assert_eq!(applied_by(&w, "process 1")[3..], ["claim", "release"]);
    w.run(outcome);
    assert_eq!(w.published, [(a.clone(), G1)], "{:#?}", w.trace);
    assert_eq!(w.owners(), Vec::<u64>::new());
    clean(&w);
    drained(&mut w);
    assert_eq!(w.state(&a), RequestState::Succeeded);
}

/// A backfilled owner's build was started by the old binaries and still runs: it
/// counts as published at the backfill (generation NONE), so a process delivery
/// while the build heartbeats (with `Generation::NONE`, the only generation it
/// can know, which the rules extend) publishes nothing. Found by the model: the
/// backfill used to add the slot unpublished, which the rules read as a withdrawn
/// publication ("publish again at once"), so the build started a second time and
/// the running one was told it is stale.
#[test]
fn s37_a_backfilled_build_that_heartbeats_is_not_published_again() {
    let mut w = world(1);
    let (a, b) = backfilled(&mut w);
    assert_eq!(w.row().queue.owners[&a].published_at, Some(w.now));
    assert_eq!(w.row().queue.owners[&a].generation, Generation::NONE);
    w.tick(Duration::from_secs(10));
    assert!(matches!(
        w.heartbeat(&a, Generation::NONE),
        Heartbeat::Extended { .. }
    ));
    assert_eq!(w.process(&a), End::Reply(Reply::Ack), "{:#?}", w.trace);
    assert!(w.published.is_empty());
    assert!(w.scan().is_empty(), "not quiet: it heartbeats");
    assert!(
        matches!(w.process(&b), End::Reply(Reply::Hold { .. })),
        "the gate counts a"
    );
    // The running build ends; `b` is admitted from the held message.
    w.finish_build(&a, BuildOutcome::Succeeded);
    clean(&w);
    drained(&mut w);
    assert_eq!(w.published, [(b, G1)]);
}

/// Scenario 38 script, with a source that does not scan: the delivery of `a`
/// that recorded generation 1 dies before it publishes, and its message is
/// redelivered at once. Returns `a` and how the redelivery ended.
pub fn s38_script<D: Design>(w: &mut World<D>) -> (RequestId, Vec<End>) {
    w.scans = false;
    let a = w.ingest("a");
    let d = w.take(Msg::Process(a.clone()));
    w.fault_on(d, "publish", Fault::DieAfterWrite);
    assert_eq!(w.run(d), End::Died);
    assert!(w.published.is_empty());
    let redelivered = w.deliver_due();
    (a, redelivered)
}

/// Scenario 38, the recovery by a source that redelivers its messages: the
/// delivery that recorded generation 1 dies before publishing it, and its
/// message comes back (no scan). The redelivery finds the publication live and
/// unconfirmed and holds until it would go quiet (`resume_after` after the
/// publication, not after the redelivery: an early duplicate at 30 s holds for
/// the rest). When due, the held message finds the publication quiet and
/// publishes generation 2, the only build; generation 1 is never published.
#[test]
fn s38_a_publication_lost_with_its_worker_is_published_by_the_held_redelivery() {
    let mut w = timed(1, 600, 60);
    let (a, redelivered) = s38_script(&mut w);
    assert_eq!(redelivered, [unconfirmed(60_000)]);
    assert_eq!(w.inbox[0].due, Some(at_secs(60)));
    w.tick(Duration::from_secs(30));
    assert_eq!(
        w.deliver_due(),
        [],
        "held: not redelivered before its delay"
    );
    assert_eq!(w.process(&a), unconfirmed(30_000), "an early duplicate");
    w.tick(Duration::from_secs(29));
    assert_eq!(w.deliver_due(), []);
    w.tick(Duration::from_secs(1));
    let ends = w.deliver_due();
    assert!(
        matches!(ends.as_slice(), [end] if is_publish(end)),
        "{ends:?}"
    );
    assert_eq!(w.published, [(a.clone(), G2)]);
    assert!(w.inbox.is_empty(), "{:?}", w.inbox);
    assert!(!w.trace.iter().any(|l| l.starts_with("scan")), "no scan");
    assert_eq!(w.holds, 2);
    assert_eq!(
        w.heartbeat(&a, G2),
        Heartbeat::Extended {
            expires_at: Timestamp::from_millis(660_001)
        }
    );
    clean(&w);
    drained(&mut w);
    assert_eq!(w.published, [(a.clone(), G2)]);
    assert_eq!(w.state(&a), RequestState::Succeeded);
}

/// Scenario 39: an expiry interrupted after its mark (the reconcile's worker
/// died; a reconcile pass is periodic, not redelivered). The slot is marked
/// expiring and the request still processing; its build is told the lease ran
/// out and stops. The lease ran out at 60 s but the publication goes quiet only
/// at 600 s: before the mark, `quiet_owners` names nobody; once marked, it names
/// the owner at once, and that process delivery finishes the expiry (failed
/// `slot_lease_expired`, then released) without waiting for the next reconcile.
#[test]
fn s39_an_interrupted_expiry_is_finished_by_the_delivery_quiet_owners_asks_for() {
    let mut w = timed(1, 60, 600);
    let a = admit(&mut w, "a");
    w.tick(Duration::from_secs(60));
    assert_eq!(w.scan(), Vec::<RequestId>::new(), "expired, not quiet");
    let reconcile = w.start(Msg::Reconcile);
    w.run_until_applied(reconcile, "mark-expiring");
    w.crash(reconcile);
    w.inbox.clear();
    assert!(w.row().queue.owners[&a].expiring);
    assert_eq!(w.state(&a), RequestState::Processing);
    assert_eq!(
        w.heartbeat(&a, G1),
        Heartbeat::LeaseExpired {
            expired_at: at_secs(60)
        }
    );
    assert!(w.live(&a).is_empty(), "told to stop, the build stops");
    assert_eq!(w.scan(), std::slice::from_ref(&a));
    assert_eq!(w.deliver_due(), [End::Reply(Reply::Ack)]);
    assert_eq!(
        applied_by(&w, "process 1"),
        ["claim", "mark", "publish", "expire", "release"]
    );
    assert_eq!(w.state(&a), RequestState::Failed);
    assert_eq!(w.request(&a).reason, Some(FailReason::SlotLeaseExpired));
    assert_eq!(w.owners(), Vec::<u64>::new());
    assert_eq!(w.scan(), Vec::<RequestId>::new());
    clean(&w);
    drained(&mut w);
}

/// Scenario 40: a publish reports an error although the build was handed over,
/// and the build heartbeats before the delivery withdraws the publication. The
/// heartbeat confirms it, so the withdrawal withdraws nothing (an ack without a
/// write); the message is retried as after any failed publish, and its
/// redelivery finds the publication confirmed and acks: one build, of
/// generation 1. Unconfirmed, the same withdrawal forgets the publication, and
/// the retry publishes generation 2 beside the running build.
#[test]
fn s40_a_withdrawal_after_the_build_heartbeated_withdraws_nothing() {
    let mut w = timed(1, 600, 60);
    let a = w.ingest("a");
    let d = w.take(Msg::Process(a.clone()));
    until_publish_fails_with(&mut w, d, Fault::PublishAmbiguous);
    assert_eq!(w.live(&a), [G1], "handed over");
    assert!(matches!(
        decide_withdraw(Some(w.request(&a)), Some(&w.row().queue), G1),
        Decision::Write(Write::Queue {
            kind: QueueWrite::Withdraw,
            ..
        })
    ));
    w.tick(Duration::from_secs(1));
    assert_eq!(
        w.heartbeat(&a, G1),
        Heartbeat::Extended {
            expires_at: at_secs(601)
        }
    );
    let version = w.row().queue.version;
    assert_eq!(w.run(d), End::PublishFailed);
    assert_eq!(w.row().queue.version, version, "nothing withdrawn");
    assert_eq!(w.applied("withdraw"), 0);
    let slot = w.row().queue.owners[&a];
    assert_eq!((slot.generation, slot.published_at), (G1, Some(at_secs(0))));
    assert_eq!(
        w.inbox.back().map(|p| p.attempts),
        Some(1),
        "a failed attempt"
    );
    assert_eq!(w.deliver_due(), [End::Reply(Reply::Ack)]);
    assert_eq!(w.published, [(a.clone(), G1)]);
    assert_eq!(w.live(&a), [G1]);
    clean(&w);
    drained(&mut w);
    assert_eq!(w.published, [(a.clone(), G1)]);
    assert_eq!(w.state(&a), RequestState::Succeeded);
}
