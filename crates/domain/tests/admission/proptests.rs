//! Random interleavings of ingest, process, outcome, dead letter, reconcile and
//! heartbeat deliveries with random faults, crashes and duplicates, a clock that
//! moves (so leases run out and publications go quiet), scans that redeliver quiet
//! owners (or a source that only redelivers its messages, which must recover a
//! lost publication by itself), and builds that die; every invariant is checked
//! after every step, and the drained world must end with no owners, every request
//! terminal and every admitted request published.

use std::time::Duration;

use holdfast_domain::admission::{AdmissionConfig, AncestryAnswer, BuildOutcome};
use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, RngAlgorithm};

use crate::admission::model::{Fault, Msg, OwnerKeyed, World, uri};

/// Distinct revisions; a small pool makes duplicate ingests common.
const URIS: usize = 6;

#[derive(Debug, Clone)]
enum Op {
    Ingest(usize),
    Start(usize),
    /// Starts the inbox message at this index and runs it to its end: a worker
    /// that handles one message alone, so builds start while ops still run.
    Run(usize),
    Step(usize, Option<Fault>),
    Crash(usize),
    /// Starts a duplicate of a pending or in-flight message; with `true`, runs it
    /// and the original in lockstep (one loop iteration each in turn) to the end.
    Duplicate(usize, bool),
    FinishBuild(usize, BuildOutcome),
    DeadLetter(usize),
    /// Starts a reconcile pass; with `true`, lets it read the queue at once, so
    /// that what happens before its next step (a heartbeat) races its decision.
    Reconcile(bool),
    Leak(usize),
    /// Starts a heartbeat of the live build at this index, with the generation it
    /// was published with; with `true`, runs it to its end at once.
    Heartbeat(usize, bool),
    /// The live build at this index dies: no outcome, no heartbeat, ever.
    KillBuild(usize),
    /// Moves the model clock forward by this many seconds (the slot lease is
    /// [`LEASE_SECS`], `resume_after` [`RESUME_SECS`]), so publications without a
    /// heartbeat go quiet and owners without one expire.
    Tick(u64),
    /// The delivery source's scan: a process message for every quiet owner.
    Scan,
    /// Sets the stored slot limit (0 pauses the queue); the drain restores `max`.
    SetLimit(u32),
}

/// The slot lease of the generated cases, in seconds.
const LEASE_SECS: u64 = 40;

/// How long a publication of the generated cases may go without a heartbeat
/// before it is published again, in seconds.
const RESUME_SECS: u64 = 20;

fn fault() -> impl Strategy<Value = Option<Fault>> {
    prop_oneof![
        30 => Just(None),
        1 => Just(Some(Fault::FailBeforeWrite)),
        1 => Just(Some(Fault::CommitThenError)),
        3 => Just(Some(Fault::PublishFails)),
        2 => Just(Some(Fault::PublishAmbiguous)),
        1 => Just(Some(Fault::DieAfterWrite)),
    ]
}

fn outcome() -> impl Strategy<Value = BuildOutcome> {
    prop_oneof![
        Just(BuildOutcome::Succeeded),
        Just(BuildOutcome::Failed),
        Just(BuildOutcome::Cancelled),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..URIS).prop_map(Op::Ingest),
        4 => any::<usize>().prop_map(Op::Start),
        3 => any::<usize>().prop_map(Op::Run),
        12 => (any::<usize>(), fault()).prop_map(|(i, f)| Op::Step(i, f)),
        1 => any::<usize>().prop_map(Op::Crash),
        3 => (any::<usize>(), prop::bool::weighted(0.3)).prop_map(|(i, l)| Op::Duplicate(i, l)),
        2 => (any::<usize>(), outcome()).prop_map(|(i, o)| Op::FinishBuild(i, o)),
        1 => any::<usize>().prop_map(Op::DeadLetter),
        2 => any::<bool>().prop_map(Op::Reconcile),
        2 => any::<usize>().prop_map(Op::Leak),
        5 => (any::<usize>(), any::<bool>()).prop_map(|(i, run)| Op::Heartbeat(i, run)),
        1 => any::<usize>().prop_map(Op::KillBuild),
        3 => (0..=40u64).prop_map(Op::Tick),
        2 => Just(Op::Scan),
        1 => (0..=3u32).prop_map(Op::SetLimit),
    ]
}

fn apply(w: &mut World<OwnerKeyed>, op: Op) {
    let active = w.active_ids();
    match op {
        Op::Ingest(i) => w.inbox.push_back(crate::admission::model::Pending {
            msg: Msg::Ingest(uri(&format!("rev-{i}"))),
            attempts: 0,
            due: None,
        }),
        Op::Start(i) => {
            if !w.inbox.is_empty() {
                w.start_inbox(i % w.inbox.len());
            }
        }
        Op::Run(i) => {
            if !w.inbox.is_empty()
                && let Some(d) = w.start_inbox(i % w.inbox.len())
            {
                w.run(d);
            }
        }
        Op::Step(i, fault) => {
            if let Some(&d) = active.get(i % active.len().max(1)) {
                if let Some(fault) = fault {
                    let label = if matches!(fault, Fault::PublishFails | Fault::PublishAmbiguous) {
                        "publish"
                    } else {
                        "*"
                    };
                    w.fault_on(d, label, fault);
                }
                w.step(d);
            }
        }
        Op::Crash(i) => {
            if let Some(&d) = active.get(i % active.len().max(1)) {
                w.crash(d);
            }
        }
        Op::Duplicate(i, lockstep) => {
            let n = w.inbox.len() + active.len();
            if n > 0 {
                let i = i % n;
                let (msg, original) = match w.inbox.get(i) {
                    Some(p) => (p.msg.clone(), None),
                    None => {
                        let d = active[i - w.inbox.len()];
                        (w.active_msg(d).unwrap(), Some(d))
                    }
                };
                if !lockstep {
                    w.start(msg);
                    return;
                }
                let original = original.or_else(|| w.start_inbox(i));
                let duplicate = w.start(msg);
                if let Some(original) = original {
                    w.lockstep(original, duplicate);
                }
            }
        }
        Op::FinishBuild(i, outcome) => {
            let builds: Vec<_> = w.builds.keys().cloned().collect();
            if let Some((id, g)) = builds.get(i % builds.len().max(1)) {
                w.finish_generation(id, *g, outcome);
            }
        }
        Op::DeadLetter(i) => {
            let ids: Vec<_> = w.store.requests.keys().cloned().collect();
            if let Some(id) = ids.get(i % ids.len().max(1)) {
                w.start(Msg::DeadLetter(id.clone()));
            }
        }
        Op::Reconcile(read) => {
            let d = w.start(Msg::Reconcile);
            if read {
                w.step(d);
            }
        }
        Op::Leak(i) => {
            let ids: Vec<_> = w
                .store
                .requests
                .values()
                .filter(|r| r.state.is_terminal())
                .map(|r| r.id.clone())
                .collect();
            if let Some(id) = ids.get(i % ids.len().max(1)) {
                w.inject_leak(id);
            }
        }
        Op::Heartbeat(i, run) => {
            let builds: Vec<_> = w.builds.keys().cloned().collect();
            if let Some((id, g)) = builds.get(i % builds.len().max(1)) {
                let d = w.start(Msg::Heartbeat(id.clone(), *g));
                if run {
                    w.run(d);
                }
            }
        }
        Op::KillBuild(i) => {
            let builds: Vec<_> = w.builds.keys().cloned().collect();
            if let Some((id, g)) = builds.get(i % builds.len().max(1)) {
                w.kill_build(id, *g);
            }
        }
        Op::Tick(secs) => w.tick(Duration::from_secs(secs)),
        Op::Scan => {
            w.scan();
        }
        Op::SetLimit(max) => w.set_max(max),
    }
}

/// Runs one generated case and returns the world after draining it; `newest_first`
/// makes the drain end running builds newest first, so older builds succeed after
/// newer ones (the last green must not move back). Without `scans`, the delivery
/// source only redelivers its messages, as a message broker does: no scan op,
/// none in the drain, and no build dies (a build that dies after its
/// publication was handed over is found by a scan, or failed by its lease),
/// so every lost publication must come back through a held message.
fn run_case(
    max: u32,
    green: bool,
    newest_first: bool,
    scans: bool,
    ops: Vec<Op>,
) -> (World<OwnerKeyed>, Result<(), String>) {
    let mut w = World::new(
        OwnerKeyed,
        AdmissionConfig {
            max_concurrent: max,
            slot_lease: Duration::from_secs(LEASE_SECS),
            resume_after: Duration::from_secs(RESUME_SECS),
            ..AdmissionConfig::default()
        },
    );
    w.finish_newest_first = newest_first;
    w.scans = scans;
    if green {
        w.set_last_green("rev-green");
        w.ancestry.insert(uri("rev-1"), AncestryAnswer::NotAncestor);
        w.ancestry.insert(uri("rev-2"), AncestryAnswer::NotFound);
        w.ancestry
            .insert(uri("rev-5"), AncestryAnswer::Failed("flaky".into()));
    }
    for op in ops {
        if !scans && matches!(op, Op::Scan | Op::KillBuild(_)) {
            continue;
        }
        apply(&mut w, op);
        if !w.violations.is_empty() {
            return (w, Ok(()));
        }
    }
    // A paused queue only holds: the drain runs with the generated limit again.
    if w.capacity() == 0 {
        w.set_max(max);
    }
    // The periodic reconcile pass: an injected leak with the gate never closing
    // afterwards (max 2 or 3 and few requests) is healed by it, not by the gate.
    w.inbox.push_back(crate::admission::model::Pending {
        msg: Msg::Reconcile,
        attempts: 0,
        due: None,
    });
    let drained = w.drain();
    (w, drained)
}

/// The generator reaches the paths the invariants guard: a fixed-seed sample of
/// cases must contain crashes, conflicts, fences, prunes, holds, retries, dead
/// letters, and (issue 25) publications again of a later generation, failed
/// publications withdrawn (also after an ambiguous failure), quiet owners
/// scanned, dead builds and workers, stale heartbeats, a mark that races another
/// write and duplicates held until their build is confirmed, or the property
/// test below would prove little.
#[test]
fn generated_cases_reach_the_guarded_paths() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRng, TestRunner};

    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::XorShift, &[7; 16]),
    );
    let strategy = (
        1u32..=3,
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.75),
        prop::collection::vec(op(), 50),
    );
    let needles = [
        ": claim applied",
        ": mark applied",
        ": claim conflict",
        ": mark conflict",
        ": release conflict",
        ": fence applied",
        ": release applied",
        ": supersede applied",
        ": prune applied",
        ": fail applied",
        ": finish applied",
        ": green applied",
        ": expire applied",
        ": heartbeat applied",
        "(paused)",
        "crashed",
        "hold",
        "store error",
        "publish failed",
        "dead-letter",
        ": retry",
        "injected",
        // A pass that freed something, not the one every case ends with.
        "reconcile: prune applied",
        "lockstep",
        // Publications, heartbeats and expiry (issue 25).
        ": publish applied",
        ": publish conflict",
        ": withdraw applied",
        ": mark-expiring applied",
        ": mark-expiring conflict",
        ": heartbeat conflict",
        "extended until",
        "stale (current",
        "lease expired at",
        "not owner",
        "scan: quiet",
        ": worker died",
        // A build that died (no outcome, no heartbeat).
        ": died",
        // A build published again: a generation after the first.
        " g2",
        " g3",
        // A duplicate held until its build's first heartbeat, and a publish that
        // failed after handing the build over (withdrawn unless it heartbeated).
        "(unconfirmed)",
        "reported failed, handed over",
    ];
    let mut seen = vec![0usize; needles.len()];
    for _ in 0..1_000 {
        let (max, green, newest_first, scans, ops) =
            strategy.new_tree(&mut runner).unwrap().current();
        let (w, drained) = run_case(max, green, newest_first, scans, ops);
        assert!(
            drained.is_ok() && w.violations.is_empty(),
            "{:#?}",
            w.violations
        );
        for line in &w.trace {
            for (i, needle) in needles.iter().enumerate() {
                if line.contains(needle) {
                    seen[i] += 1;
                }
            }
        }
    }
    let missing: Vec<_> = needles
        .iter()
        .zip(&seen)
        .filter(|(_, n)| **n == 0)
        .map(|(needle, _)| *needle)
        .collect();
    let report: Vec<String> = needles
        .iter()
        .zip(&seen)
        .map(|(needle, n)| format!("{needle}: {n}"))
        .collect();
    eprintln!("{}", report.join("\n"));
    assert!(missing.is_empty(), "never reached: {missing:?}");
}

/// Cases proptest once shrank to a failure, kept as values: a saved seed replays
/// only while the strategy stays exactly as it was, so these stay reproducible
/// whatever ops are added later.
#[test]
fn saved_failure_cases_drain_clean() {
    let cases: Vec<(u32, bool, bool, Vec<Op>)> = vec![
        (
            1,
            false,
            false,
            vec![
                Op::Ingest(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::FinishBuild(0, BuildOutcome::Succeeded),
                Op::Step(0, Some(Fault::CommitThenError)),
                Op::Step(0, None),
                Op::Start(0),
                Op::Step(0, None),
                Op::Duplicate(0, false),
                Op::Step(0, None),
                Op::Step(0, None),
                Op::Step(0, None),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Ingest(0),
                Op::Ingest(0),
                Op::Step(5331107932925313608, None),
                Op::Step(2250468533717084300, None),
                Op::Step(4641694351220783917, None),
                Op::Ingest(1),
                Op::Start(61583870692943133),
                Op::Step(6613722351807616330, None),
                Op::Start(12441720242432059055),
                Op::Step(5966706332530922896, None),
                Op::Crash(11112699534872681491),
                Op::FinishBuild(0, BuildOutcome::Succeeded),
                Op::Step(855949420844165618, None),
                Op::Reconcile(false),
                Op::Step(4769298714669558845, None),
                Op::Start(6289346000705349634),
                Op::Step(16051597172014949391, None),
                Op::Start(8857357012376664206),
                Op::FinishBuild(10373471183213152437, BuildOutcome::Failed),
                Op::Ingest(3),
                Op::Step(4837404609808104994, None),
                Op::Reconcile(false),
                Op::Step(9436166563718124006, Some(Fault::CommitThenError)),
                Op::Step(4553156780878478397, None),
                Op::Step(1960261026409708783, None),
                Op::Step(1419470916171651103, None),
                Op::Start(9071509975785131137),
                Op::FinishBuild(7706517775503786083, BuildOutcome::Succeeded),
                Op::Step(4911645758648561822, None),
                Op::Step(16645974683883694664, None),
                Op::FinishBuild(5361751032160570454, BuildOutcome::Failed),
                Op::Step(4683821440678742940, None),
                Op::Step(15312703300606814687, None),
                Op::Crash(17177872683754230181),
            ],
        ),
        (
            1,
            false,
            false,
            vec![
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Ingest(1),
                Op::Step(0, None),
                Op::Step(0, None),
                Op::Start(0),
                Op::Crash(0),
                Op::Start(0),
                Op::FinishBuild(0, BuildOutcome::Succeeded),
                Op::FinishBuild(13398132, BuildOutcome::Cancelled),
                Op::Start(7893111036559409564),
                Op::Step(16632407728298503651, None),
                Op::Ingest(2),
                Op::Leak(1775835481204740799),
                Op::Step(9978261089438745473, None),
                Op::FinishBuild(12434819263098650799, BuildOutcome::Failed),
                Op::Step(10405271074925042538, None),
                Op::FinishBuild(18327331273405079059, BuildOutcome::Succeeded),
                Op::Leak(5070692123527427699),
                Op::Step(9582023009322831334, None),
                Op::Ingest(0),
                Op::Step(18368609124547211262, None),
                Op::Step(18146141516095651150, Some(Fault::PublishFails)),
                Op::Step(7919476877626328937, None),
                Op::Step(4168006181275629836, Some(Fault::PublishFails)),
                Op::Step(1097905191656308789, None),
                Op::Step(10949758743194229618, None),
                Op::Step(16143304690107335461, None),
                Op::Ingest(4),
                Op::Start(3085175395100112502),
                Op::Step(15069221926733755088, None),
                Op::Step(11767820259982055720, None),
                Op::Step(13418830211070827217, None),
                Op::Step(1789078973946168292, None),
                Op::Start(7265444048065776144),
                Op::Leak(13077468356879171347),
                Op::FinishBuild(16398236569081197021, BuildOutcome::Succeeded),
                Op::Step(14091236435048597513, Some(Fault::FailBeforeWrite)),
                Op::Leak(3033939196086820671),
                Op::Step(2647777039498887543, None),
                Op::Start(10930580523217417298),
                Op::Ingest(1),
                Op::FinishBuild(17612155297813523828, BuildOutcome::Succeeded),
                Op::Step(2952353207144902931, None),
                Op::Duplicate(3186186008147193057, false),
                Op::Duplicate(8237868708574779656, false),
                Op::FinishBuild(5338619983608863992, BuildOutcome::Succeeded),
                Op::Step(11172739054830640728, None),
                Op::Step(17595961590650711069, None),
            ],
        ),
        (
            1,
            false,
            false,
            vec![
                Op::Start(0),
                Op::Ingest(1),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Step(0, None),
                Op::DeadLetter(0),
                Op::Ingest(0),
                Op::Step(2149291615012844342, None),
                Op::Step(9393125058853592780, None),
                Op::Crash(636010827585761942),
                Op::Step(0, None),
                Op::Start(138747791545677961),
                Op::Start(0),
                Op::FinishBuild(0, BuildOutcome::Succeeded),
                Op::Step(1290919136796003122, None),
                Op::Start(0),
                Op::Start(0),
                Op::Step(13102083696861623034, None),
                Op::Start(0),
                Op::Step(10191879359826827438, None),
                Op::FinishBuild(74963, BuildOutcome::Succeeded),
                Op::Step(2573975299563527834, None),
                Op::Step(2099563812546244808, None),
                Op::Crash(10146112400175338998),
                Op::Step(15269467288868779099, Some(Fault::CommitThenError)),
                Op::Reconcile(false),
                Op::Crash(9793286270424736337),
                Op::Leak(5735950816995909752),
                Op::Step(5412485087821249595, Some(Fault::FailBeforeWrite)),
                Op::FinishBuild(14699417092417267072, BuildOutcome::Failed),
                Op::Duplicate(6458450459087550422, false),
                Op::Step(10091910950513919967, None),
                Op::FinishBuild(17746764299445953592, BuildOutcome::Failed),
                Op::FinishBuild(1979082212694963711, BuildOutcome::Succeeded),
                Op::Leak(11050321645950060015),
                Op::FinishBuild(17583231159506333730, BuildOutcome::Failed),
                Op::Step(9643971260078629929, None),
                Op::Step(6926382210535242351, None),
                Op::Step(17386637616050645056, Some(Fault::PublishFails)),
                Op::Duplicate(3615847514295246836, false),
                Op::Step(3712470284499256768, Some(Fault::CommitThenError)),
                Op::Step(18016670954634499990, None),
                Op::Duplicate(73371533830727768, false),
                Op::DeadLetter(1199665301192538151),
                Op::Step(7287750864785638818, None),
                Op::Leak(13188249599437988724),
                Op::Start(12999521950208946223),
                Op::Step(1644235720737831734, Some(Fault::CommitThenError)),
            ],
        ),
        (
            2,
            false,
            false,
            vec![
                Op::Start(0),
                Op::Start(0),
                Op::Ingest(1),
                Op::FinishBuild(0, BuildOutcome::Succeeded),
                Op::FinishBuild(0, BuildOutcome::Succeeded),
                Op::Start(0),
                Op::Ingest(2),
                Op::Leak(0),
                Op::Step(0, None),
                Op::Duplicate(10530194652369901129, true),
                Op::Step(0, None),
                Op::Ingest(2),
                Op::Ingest(2),
                Op::Duplicate(8473410766660849015, true),
                Op::Step(0, None),
                Op::Duplicate(2475810953604494188, true),
                Op::Ingest(0),
                Op::Ingest(2),
                Op::Step(0, None),
                Op::Start(203029902300758178),
                Op::Start(3231895003937751230),
                Op::Step(6110550512028165857, None),
                Op::Duplicate(16682342723789419194, true),
                Op::Step(0, None),
                Op::Step(3503006952345008473, None),
                Op::Start(132164358565279349),
                Op::Crash(11623185124157365670),
                Op::Ingest(0),
                Op::Step(784128125459454349, None),
                Op::Start(5807029177317259014),
                Op::Step(6566053110501524693, Some(Fault::PublishFails)),
                Op::Step(18216122304658286293, None),
                Op::Ingest(3),
                Op::Duplicate(1823913584993586445, false),
                Op::Ingest(5),
                Op::Ingest(3),
                Op::Step(3164304569718554133, None),
                Op::Ingest(4),
                Op::Step(4364794788730802857, None),
                Op::FinishBuild(1060190475570151590, BuildOutcome::Failed),
                Op::Ingest(0),
                Op::Step(54355383552790628, None),
                Op::Step(10751840224074621047, None),
                Op::Leak(8881333906621098507),
                Op::FinishBuild(2562528445004869598, BuildOutcome::Succeeded),
                Op::Step(10774031610923131516, None),
                Op::Step(9483130667473306606, None),
                Op::Step(3215614873928921684, None),
                Op::Step(2087236437510894827, None),
                Op::Leak(5935238940105823700),
            ],
        ),
        (
            2,
            true,
            false,
            vec![
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Crash(6),
                Op::FinishBuild(6557151652073264213, BuildOutcome::Failed),
                Op::FinishBuild(8347650769022871977, BuildOutcome::Cancelled),
                Op::Leak(5808955492424620125),
                Op::Crash(4031085691651840145),
                Op::Step(5877961262855061249, Some(Fault::PublishFails)),
                Op::Start(14326484333938481289),
                Op::Reconcile(false),
                Op::DeadLetter(6250917677908992612),
                Op::FinishBuild(10135428509144366650, BuildOutcome::Succeeded),
                Op::Duplicate(17914697252238461443, false),
                Op::Ingest(5),
                Op::Duplicate(783091488501868759, false),
                Op::Step(2110359707065115206, None),
                Op::Start(17705723489635203665),
                Op::Step(5679583609304210905, None),
                Op::Start(65910801184310454),
                Op::Ingest(4),
                Op::FinishBuild(15214988633215744706, BuildOutcome::Cancelled),
                Op::Step(17654366776381437735, None),
                Op::Step(9290178982675255749, None),
                Op::Start(16201160716476467460),
                Op::Ingest(5),
                Op::Start(16600956192750398418),
                Op::Step(9191615488155761998, None),
                Op::FinishBuild(1316899316369139440, BuildOutcome::Cancelled),
                Op::Duplicate(14574250122919545678, true),
                Op::Step(5420870302433464052, None),
                Op::Leak(13448433920541565358),
                Op::Duplicate(527413437530468234, true),
                Op::FinishBuild(16831631093737124632, BuildOutcome::Failed),
                Op::Duplicate(1122158946925413598, true),
                Op::Duplicate(16292693397802585661, true),
                Op::Ingest(0),
                Op::Duplicate(15972464224580670580, true),
                Op::Leak(1999754231474794443),
                Op::Step(8710362133846313220, None),
                Op::Leak(2997210720194715603),
                Op::Ingest(5),
            ],
        ),
        (
            1,
            false,
            false,
            vec![
                Op::Ingest(0),
                Op::Ingest(1),
                Op::FinishBuild(0, BuildOutcome::Succeeded),
                Op::Start(0),
                Op::Duplicate(2140694959843130687, true),
                Op::FinishBuild(0, BuildOutcome::Succeeded),
                Op::Start(481041731115039595),
                Op::Step(0, None),
                Op::Duplicate(6008125670646210202, false),
                Op::FinishBuild(0, BuildOutcome::Succeeded),
                Op::Start(66399429936859597),
                Op::Crash(0),
                Op::Step(0, None),
                Op::Crash(0),
                Op::Duplicate(0, false),
                Op::Duplicate(703144215181188008, true),
                Op::Start(44221217859955273),
                Op::Duplicate(8606999541522408336, true),
                Op::Step(0, None),
                Op::Step(0, None),
                Op::Start(313986889744245436),
                Op::FinishBuild(0, BuildOutcome::Succeeded),
                Op::Duplicate(5297849538711601223, false),
                Op::Leak(0),
                Op::Duplicate(0, false),
                Op::Leak(0),
                Op::Step(10631804316805851073, None),
                Op::Crash(27407709065039500),
                Op::Start(17107329260716581534),
                Op::Start(0),
                Op::Start(1103843),
                Op::Step(2709569361524011109, None),
                Op::Ingest(4),
                Op::FinishBuild(15617870711832951284, BuildOutcome::Cancelled),
                Op::Step(8562353807753080481, None),
                Op::Start(11707139790202702640),
                Op::Ingest(4),
                Op::Step(7719183114567391854, None),
                Op::Ingest(4),
                Op::Step(14849055049922951028, None),
                Op::Crash(7142763169538419531),
                Op::Ingest(1),
                Op::FinishBuild(1290601685423145722, BuildOutcome::Succeeded),
                Op::Step(17781420405514627181, None),
                Op::Step(7685146546083248420, None),
                Op::Crash(2614416623301991006),
                Op::DeadLetter(16217608644468056005),
                Op::FinishBuild(6635860153682954228, BuildOutcome::Succeeded),
                Op::Ingest(1),
                Op::Step(11304410745547613055, None),
            ],
        ),
        (
            1,
            false,
            false,
            vec![
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Ingest(0),
                Op::Duplicate(0, true),
                Op::FinishBuild(0, BuildOutcome::Succeeded),
                Op::FinishBuild(0, BuildOutcome::Succeeded),
                Op::Start(0),
                Op::Start(0),
                Op::Duplicate(0, false),
                Op::Start(3647),
                Op::Start(16558816220568281119),
                Op::Step(17699763439222285918, None),
                Op::Step(1269297811869519093, None),
                Op::Step(2835503325660070106, None),
                Op::Step(10569080478377538338, None),
                Op::Step(7722317974912967314, None),
                Op::Ingest(3),
                Op::Step(12204623595506630536, Some(Fault::PublishFails)),
                Op::FinishBuild(8020889215761127991, BuildOutcome::Cancelled),
                Op::Leak(8897265754172563129),
                Op::Step(16576830180326022478, None),
                Op::Duplicate(5376025540770758777, false),
                Op::Step(7523746898538156254, Some(Fault::FailBeforeWrite)),
                Op::Step(9015532194008510324, None),
                Op::Duplicate(10740089412205588142, true),
                Op::Step(4618009157867649358, None),
                Op::Ingest(1),
                Op::Step(8804701637362943931, None),
                Op::Crash(5231159544557206978),
                Op::Start(15998190469091516167),
                Op::Duplicate(8973532241100192898, true),
                Op::Reconcile(false),
                Op::Step(9317856311581912924, None),
                Op::Duplicate(14382826910343024066, false),
                Op::FinishBuild(16542124279788970497, BuildOutcome::Failed),
                Op::Step(13642101547494041619, None),
                Op::FinishBuild(12029223258470305664, BuildOutcome::Succeeded),
                Op::Ingest(0),
                Op::Step(15906037147942073863, None),
                Op::Duplicate(7949199600223915123, true),
                Op::Duplicate(30368876859624120, false),
                Op::Reconcile(false),
                Op::FinishBuild(6643893355201674141, BuildOutcome::Cancelled),
            ],
        ),
        (
            1,
            false,
            false,
            vec![
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(0),
                Op::Start(156556),
                Op::Step(11218903796563802329, Some(Fault::PublishFails)),
                Op::Step(5031851303861289069, None),
                Op::Crash(9419057171393332724),
                Op::Ingest(3),
                Op::Step(8222178416296987623, None),
                Op::FinishBuild(15688198122137158745, BuildOutcome::Succeeded),
                Op::Heartbeat(10832605445786899036, false),
                Op::Leak(5881440517988705062),
                Op::FinishBuild(465132174314418726, BuildOutcome::Cancelled),
                Op::Start(16022509182091507372),
                Op::Start(8221781588395156068),
                Op::Step(9972548221847838803, None),
                Op::Start(5149414587997500595),
                Op::Ingest(0),
                Op::Duplicate(16199911053570616029, true),
                Op::Crash(17984416526180357352),
                Op::SetLimit(2),
                Op::Step(12717118540725690162, None),
                Op::Reconcile(false),
                Op::FinishBuild(9488576917635658486, BuildOutcome::Failed),
                Op::Step(12457339723697605059, None),
                Op::Heartbeat(8581584081299972212, false),
                Op::FinishBuild(6193407730319259395, BuildOutcome::Succeeded),
                Op::Start(16355910740533360474),
                Op::Start(17295599173863507838),
                Op::FinishBuild(14286610734331024155, BuildOutcome::Succeeded),
                Op::Duplicate(9121555966625693116, true),
                Op::Step(13626123069504442552, None),
                Op::Start(1949563031886713313),
                Op::Step(3681773813694574507, None),
                Op::Tick(32),
                Op::Start(8741150295373556308),
                Op::Step(17504638298998158605, None),
                Op::Step(16111699881474165033, None),
                Op::Step(4679455925035476458, None),
                Op::Crash(6895260192384177560),
                Op::Heartbeat(17222834308977094427, false),
                Op::Step(1634714950278246598, None),
                Op::Start(11878525937069688334),
                Op::Ingest(0),
                Op::Start(1751522495214259737),
                Op::Ingest(0),
                Op::Step(7347770227151969251, None),
                Op::Tick(28),
            ],
        ),
    ];
    for (n, (max, green, newest_first, ops)) in cases.into_iter().enumerate() {
        let (w, drained) = run_case(max, green, newest_first, true, ops);
        assert!(drained.is_ok(), "case {n}: {drained:?}\n{:#?}", w.trace);
        assert!(w.violations.is_empty(), "case {n}: {:#?}", w.violations);
        assert!(w.row().queue.owners.is_empty(), "case {n}: {:#?}", w.trace);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2_000,
        max_shrink_iters: 2_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/admission/proptests.proptest-regressions",
        ))),
        // Most of a case's time went to the default ChaCha generator in the
        // unoptimised test build (every `prop_oneof!` arm before the picked one
        // forks it); with XorShift the cases themselves dominate again.
        rng_algorithm: RngAlgorithm::XorShift,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_interleavings_keep_every_invariant_and_drain_clean(
        max in 1u32..=3,
        green in any::<bool>(),
        newest_first in any::<bool>(),
        scans in prop::bool::weighted(0.75),
        ops in prop::collection::vec(op(), 50),
    ) {
        let (w, drained) = run_case(max, green, newest_first, scans, ops);
        prop_assert!(drained.is_ok(), "{:?}\n{:#?}", drained, w.trace);
        prop_assert!(w.violations.is_empty(), "{:#?}\n{:#?}", w.violations, w.trace);
        prop_assert!(w.row().queue.owners.is_empty(), "{:#?}", w.trace);
        prop_assert!(w.tolerated.is_empty(), "injected leaks healed: {:#?}", w.trace);
        for r in w.store.requests.values() {
            prop_assert!(r.state.is_terminal(), "{} is {}: {:#?}", r.id, r.state, w.trace);
        }
    }
}
