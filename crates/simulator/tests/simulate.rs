//! The simulator on SQLite with small workloads and fixed seeds: the invariants
//! hold (no token held by two live consumers, no spent token selected, no locks
//! left after settlement, no spurious failure for holdfast), and workload files
//! are refused with typed errors naming the key. Timings are never asserted.

use holdfast::Config;
use holdfast_simulator::{
    self as simulator, RequestMode, SimOptions, SimulationReport, Strategy, StrategyEntry,
    StrategyFigures, Workload, WorkloadError,
};

fn options(workload: Workload, dir: &tempfile::TempDir) -> SimOptions {
    options_on(workload, dir.path().join("sim.db").display().to_string())
}

/// The tests' options for `workload` on the database `db` (a file or a URL).
pub(crate) fn options_on(workload: Workload, db: String) -> SimOptions {
    SimOptions {
        workload,
        db: Some(db),
        seed: 7,
        ablate: None,
        only: None,
        raw_limit: None,
        progress: false,
        config: Config::default(),
    }
}

fn workload(toml: &str) -> Workload {
    Workload::from_toml_str(toml).unwrap_or_else(|e| panic!("workload: {e}"))
}

fn tokens(report: &SimulationReport) -> Vec<&StrategyFigures> {
    report
        .strategies
        .iter()
        .filter_map(|e| match e {
            StrategyEntry::Tokens(f) => Some(f.as_ref()),
            StrategyEntry::Admission(_) => None,
        })
        .collect()
}

fn by_name<'a>(report: &'a SimulationReport, name: &str) -> &'a StrategyFigures {
    tokens(report)
        .into_iter()
        .find(|f| f.strategy == name)
        .unwrap_or_else(|| panic!("no strategy {name}"))
}

/// A small hot lineage: demand equals balance, every spend mints its change.
const SMALL_LINEAGE: &str = include_str!("small-lineage.toml");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_lineage_keeps_the_invariants_and_holdfast_never_fails_spuriously() {
    let dir = tempfile::tempdir().expect("temp dir");
    let report = simulator::simulate(options(workload(SMALL_LINEAGE), &dir))
        .await
        .expect("simulation runs");
    assert_eq!(report.backend, "sqlite");
    assert_eq!(
        tokens(&report)
            .iter()
            .map(|f| f.strategy.as_str())
            .collect::<Vec<_>>(),
        ["naive", "holdfast"]
    );
    for f in tokens(&report) {
        assert_eq!(f.selects, 60, "{}", f.strategy);
        assert_eq!(
            f.double_claims, 0,
            "{}: token held by two live consumers",
            f.strategy
        );
        assert_eq!(f.spent_selected, 0, "{}: spent token selected", f.strategy);
        assert_eq!(f.invariant_violations, 0, "{}", f.strategy);
        assert_eq!(f.settle_errors, 0, "{}", f.strategy);
        assert_eq!(f.locks_lost_to_lease, 0, "{}", f.strategy);
        // Spending removes the spent tokens' locks for both strategies.
        assert_eq!(f.locks_left, 0, "{}: locks after settlement", f.strategy);
    }
    let holdfast = by_name(&report, "holdfast");
    assert_eq!(holdfast.spurious_failures, 0);
    assert_eq!(holdfast.succeeded, 60);
    assert_eq!(holdfast.insufficient_funds, 0);
    // Each request of 1 takes one token whatever the order; the 56 and its change
    // lineage (56, 55, ..., 2) leave change, the four 1s and the lineage's last 1
    // do not: 55 of 60.
    assert_eq!(holdfast.inputs_per_select, 1.0);
    assert_eq!(holdfast.change_share, 0.917);
    // The run's fresh databases are gone: nothing but what the test made is left.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Hot tokens selected then unlocked: holdfast releases on settlement, the naive
/// strategy only by lease.
const SMALL_PARETO: &str = r#"
name = "small-pareto"
replicas = 2
concurrency = 8
legs = 50
[[tokens]]
wallet = "alice"
type = "CHF"
amount = "50"
count = 3
[[tokens]]
wallet = "alice"
type = "CHF_COLD"
amount = "10000"
count = 4
[[requests]]
wallet = "alice"
type = "CHF"
amount = "1"
count = 40
mode = "unlock"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlocked_requests_leave_no_locks_for_holdfast_and_the_ablation_keeps_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut opts = options(workload(SMALL_PARETO), &dir);
    opts.only = Some(vec![Strategy::Holdfast]);
    opts.ablate = Some(simulator::Ablation::SettleRelease);
    let only = simulator::strategies(&opts);
    assert_eq!(only, [Strategy::Holdfast]);
    opts.only = Some(vec![
        Strategy::Holdfast,
        Strategy::Ablated(simulator::Ablation::SettleRelease),
    ]);
    let report = simulator::simulate(opts).await.expect("simulation runs");
    let holdfast = by_name(&report, "holdfast");
    assert_eq!(holdfast.spurious_failures, 0);
    assert_eq!(holdfast.succeeded, 40);
    assert_eq!(holdfast.locks_left, 0, "locks after settlement");
    assert_eq!(holdfast.invariant_violations, 0);
    // Only the cold tokens' type differs: the hot ones took every conflict.
    let ablated = by_name(&report, "holdfast-no-settle-release");
    assert_eq!(ablated.invariant_violations, 0);
    assert!(
        ablated.locks_left > 0,
        "without settlement release the last holders' locks wait for the lease"
    );
}

/// `many-wallets` cut down to 8 wallets of 50 tokens and 8 requests each, every
/// request unlocked: nothing is spent, so the small tokens stay in the wallets.
fn few_wallets_unlocked() -> Workload {
    let mut w = Workload::preset("many-wallets").expect("preset");
    w.tokens.truncate(8);
    w.requests.truncate(8);
    for block in &mut w.tokens {
        block.count = 50;
    }
    for block in &mut w.requests {
        block.count = 8;
        block.mode = RequestMode::Unlock;
    }
    w
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cover_first_takes_one_token_where_smallest_first_gathers_small_ones() {
    let dir = tempfile::tempdir().expect("temp dir");
    // One select at a time: the policies' choices alone. Concurrent selects skip
    // the small tokens others hold, so smallest first gathered fewer of them the
    // more the selects overlapped (1.45 inputs on a loaded machine).
    let mut workload = few_wallets_unlocked();
    workload.replicas = 1;
    workload.concurrency = 1;
    let mut opts = options(workload, &dir);
    opts.only = Some(vec![
        Strategy::Holdfast,
        Strategy::Ablated(simulator::Ablation::SmallestFirst),
    ]);
    // Without tidying, which takes up to three tokens that sum to the amount
    // exactly where a select is alone on its wallet.
    opts.config.selection.tidy_band = 0;
    let report = simulator::simulate(opts).await.expect("simulation runs");
    let holdfast = by_name(&report, "holdfast");
    let upstream = by_name(&report, "holdfast-smallest-first");
    for f in [holdfast, upstream] {
        assert_eq!(f.succeeded, 64, "{}", f.strategy);
        assert_eq!(f.invariant_violations, 0, "{}", f.strategy);
    }
    // Requests of 1..100 over tokens of 1..1000: almost always one token covers.
    assert!(
        holdfast.inputs_per_select <= 1.1,
        "{}",
        holdfast.inputs_per_select
    );
    assert!(
        upstream.inputs_per_select > holdfast.inputs_per_select + 0.5,
        "smallest first gathers the small tokens: {} vs {}",
        upstream.inputs_per_select,
        holdfast.inputs_per_select
    );
}

/// `bench/workloads/denominations.toml` cut down: tokens of 10, 20 and 50, requests
/// of 30, 60, 70 and 80, which two or three of them make exactly.
fn few_denominations() -> Workload {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../bench/workloads/denominations.toml");
    let mut w = Workload::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
    for block in &mut w.tokens {
        block.count = 20;
    }
    for block in &mut w.requests {
        block.count = 10;
    }
    w
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_exact_selects_without_change_where_a_set_sums_to_the_amount() {
    let mut share = Vec::new();
    for exact in [false, true] {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut opts = options(few_denominations(), &dir);
        opts.only = Some(vec![Strategy::Holdfast]);
        opts.config.selection.prefer_exact = exact;
        // prefer_exact alone: tidying would look for exact sets without it.
        opts.config.selection.tidy_band = 0;
        let report = simulator::simulate(opts).await.expect("simulation runs");
        let f = by_name(&report, "holdfast");
        assert_eq!((f.succeeded, f.invariant_violations), (40, 0));
        share.push(f.change_share);
    }
    // Without it, a near-sized 50 covers 30 and leaves change; with it, 10 + 20.
    // A few selects still take change when concurrent callers hold the exact
    // set's tokens (3 of 40 on a loaded machine; 0.5 and more without it).
    assert!(share[0] > 0.2, "{share:?}");
    assert!(share[1] < 0.15 && share[1] * 3.0 < share[0], "{share:?}");
}

#[test]
fn the_many_wallets_unlock_file_is_the_preset_unlocked() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../bench/workloads/many-wallets-unlock.toml");
    let file = Workload::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
    let mut preset = Workload::preset("many-wallets").expect("preset");
    preset.name = "many-wallets-unlock".to_owned();
    for block in &mut preset.requests {
        block.mode = RequestMode::Unlock;
    }
    assert_eq!(file, preset);
}

/// The raw select cycle runs for real on SQLite in both settle modes: it completes
/// cycles, leaves no lock, sends at least the statements of a cycle (read, claim,
/// then spend, release, status and re-mint, or release and status) and holdfast's
/// fraction of it is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raw_limit_runs_the_select_cycle_on_sqlite() {
    for (load, least) in [(SMALL_LINEAGE, 6.0), (SMALL_PARETO, 4.0)] {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut opts = options(workload(load), &dir);
        opts.only = Some(vec![Strategy::Holdfast]);
        opts.raw_limit = Some(std::time::Duration::from_millis(200));
        let report = simulator::simulate(opts).await.expect("simulation runs");
        let limit = report.raw_limit.as_ref().expect("raw limit measured");
        assert!(limit.cycles > 0, "{limit:?}");
        assert_eq!(limit.locks_left, 0, "{limit:?}");
        assert!(limit.statements_per_cycle >= least, "{limit:?}");
        assert!(
            limit.fraction_of_raw_limit.is_some_and(|f| f > 0.0),
            "{limit:?}"
        );
        let text = report.text();
        assert!(text.contains("raw select cycles/s"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_with_crashes_keeps_the_slot_invariants_and_leaks_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let load = workload(
        r#"
name = "small-admission"
[admission]
queues = 6
requests_per_queue = 4
max_concurrent = 1
workers = 4
crash_percent = 25
"#,
    );
    let report = simulator::simulate(options(load, &dir))
        .await
        .expect("simulation runs");
    let [StrategyEntry::Admission(a)] = report.strategies.as_slice() else {
        panic!("one admission entry: {:?}", report.strategies);
    };
    assert!(a.crashes_injected > 0, "crashes were injected: {a:?}");
    assert_eq!(a.invariant_violations, 0, "{a:?}");
    assert_eq!(a.slots_leaked, 0, "{a:?}");
    assert_eq!(a.wedged_requests, 0, "{a:?}");
    assert_eq!(a.undelivered, 0, "{a:?}");
    // Every queue's head was admitted (older ones may be superseded).
    assert!(a.admits >= 6, "{a:?}");
}

#[test]
fn workload_errors_are_typed_and_name_the_key() {
    let cases: &[(&str, &str)] = &[
        (
            "replicas = 0\n[[requests]]\nwallet='a'\ntype='T'\namount='1'\ncount=1",
            "replicas",
        ),
        (
            "concurrency = 'x'\n[[requests]]\nwallet='a'\ntype='T'\namount='1'\ncount=1",
            "concurrency",
        ),
        (
            "colour = 1\n[[requests]]\nwallet='a'\ntype='T'\namount='1'\ncount=1",
            "colour",
        ),
        (
            "[[tokens]]\nwallet='a'\ntype='T'\ncount=1\n[[requests]]\nwallet='a'\ntype='T'\namount='1'\ncount=1",
            "tokens[0].amount",
        ),
        (
            "[[tokens]]\nwallet='a'\ntype='T'\namount='-5'\ncount=1\n[[requests]]\nwallet='a'\ntype='T'\namount='1'\ncount=1",
            "tokens[0].amount",
        ),
        (
            "[[requests]]\nwallet='a'\ntype='T'\namount='9..3'\ncount=1",
            "requests[0].amount",
        ),
        (
            "[[requests]]\nwallet='a'\ntype='T'\namount='1'\ncount=1\nmode='burn'",
            "requests[0].mode",
        ),
        (
            "[[requests]]\ntype='T'\namount='1'\ncount=1",
            "requests[0].wallet",
        ),
        (
            "[[requests]]\nwallet='a'\ntype='T'\namount='1'",
            "requests[0].count",
        ),
        ("name = 'empty'", "requests"),
        ("[admission]\nqueues = -1", "admission.queues"),
    ];
    for (text, key) in cases {
        let err = Workload::from_toml_str(text).expect_err(text);
        let named = match &err {
            WorkloadError::Missing { key, .. }
            | WorkloadError::WrongType { key, .. }
            | WorkloadError::Invalid { key, .. }
            | WorkloadError::UnknownKey { key, .. } => key.as_str(),
            other => panic!("{text}: unexpected {other:?}"),
        };
        assert_eq!(named, *key, "{text}");
        assert!(err.to_string().contains(key), "{err}");
    }
    assert!(matches!(
        Workload::from_toml_str("replicas = ["),
        Err(WorkloadError::Syntax { .. })
    ));
    assert!(matches!(
        Workload::resolve("no-such-preset"),
        Err(WorkloadError::UnknownPreset { .. })
    ));
}

/// Four tokens, settled payments that mint change and unlocked requests that
/// need two tokens: every select succeeds only if the oracle learns of the
/// change and of the released tokens.
pub(crate) const ORACLE_WALLET: &str = r#"
name = "oracle-wallet"
replicas = 2
concurrency = 2
legs = 50
[[tokens]]
wallet = "alice"
type = "CHF"
amount = "100"
count = 4
[[requests]]
wallet = "alice"
type = "CHF"
amount = "5"
count = 40
mode = "settle"
[[requests]]
wallet = "alice"
type = "CHF"
amount = "120"
count = 10
mode = "unlock"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oracle_claims_what_is_free_without_reading_or_losing_a_race() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut opts = options(workload(ORACLE_WALLET), &dir);
    opts.only = Some(vec![Strategy::Oracle]);
    let report = simulator::simulate(opts).await.expect("simulation runs");
    let oracle = by_name(&report, "oracle");
    assert_eq!(oracle.succeeded, 50, "{oracle:?}");
    assert_eq!(oracle.errors, 0, "{oracle:?}");
    assert_eq!(oracle.conflicts_per_select, 0.0, "{oracle:?}");
    // One claim (a window of two for the unlocked requests), and no read.
    assert_eq!(oracle.lock_attempts_per_select, oracle.inputs_per_select);
    assert_eq!(oracle.round_trips_per_select, 1.0);
    assert!(
        oracle.inputs_per_select > 1.0,
        "the unlocked requests take two"
    );
    assert_eq!(oracle.locks_left, 0);
    assert_eq!(oracle.invariant_violations, 0);
}
