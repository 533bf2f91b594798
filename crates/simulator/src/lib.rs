//! The contention simulator behind `holdfast simulate`, in its own crate (not
//! published) so the command-line crate names no database driver or adapter: reproduces the hot-token
//! incident shapes (the presets of `docs/simulate.md`) and runs holdfast beside a naive selector
//! in the same run, with the same seed, each strategy on a fresh database of the
//! same type.
//!
//! - [`workload`]: presets and the TOML workload format (typed errors naming the key).
//! - [`runner`]: one strategy run (replicas, concurrent select tasks, settlement,
//!   the lease sweep on a [`clock::SimClock`], invariant checks).
//! - [`naive`]: the naive selector; holdfast is [`holdfast::TokenSelector`] itself.
//! - [`ledger`], [`antijoin`]: store decorators (per-token conflicts; the
//!   `anti-join` ablation).
//! - [`admission`]: the `admission` workload through [`holdfast::Admission`].
//! - [`rawlimit`]: the physical limit (a hand-written select cycle through the
//!   database driver, no holdfast code in the loop).
//! - [`figures`], [`table`], [`html`]: the figures, the human table, the report page.
//! - [`replay`]: a payment history (CSV) replayed sequentially through the real
//!   selector and settlement, once per policy, with two baselines
//!   (`holdfast simulate --payments`).
//!
//! Backoff between legs is short in the simulator (`retry_interval_ms`, default
//! 20 ms, as in upstream's contention tests) and every report says so.

pub mod admission;
pub mod antijoin;
pub mod clock;
pub mod figures;
pub mod html;
pub mod ledger;
pub mod memory;
pub mod naive;
pub mod oracle;
pub mod provision;
pub mod rawlimit;
pub mod replay;
pub mod runner;
pub mod table;
pub mod workload;

use std::time::Duration;

use holdfast_domain::{LeaseConfigError, SelectionConfigError};
use holdfast_ports::{LockStoreError, QueueStoreError, TokenStoreError};
use serde::Serialize;

pub use admission::AdmissionFigures;
pub use figures::{LatencyMs, StrategyFigures};
pub use provision::{ProvisionError, Provisioner};
pub use rawlimit::RawLimit;
pub use replay::{PaymentsError, ReplayOptions, ReplayPolicy, ReplayReport};
pub use runner::StrategyRun;
pub use table::Table;
pub use workload::{AmountSpec, PRESETS, RequestMode, Workload, WorkloadError};

use holdfast::backend::BackendError;
use holdfast::config::Config;

/// One mechanism of holdfast that `--ablate` switches off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ablation {
    /// Candidates include locked tokens (no `NOT EXISTS (lock)`).
    AntiJoin,
    /// The upstream order instead of `cover_first` (`policy = smallest_first`).
    SmallestFirst,
    /// Candidates in random order: `smallest_first` with `ascending = false`.
    Order,
    /// No sufficiency window (`sufficiency_window = 1`).
    Window,
    /// No blacklist (`blacklist = false`).
    Blacklist,
    /// One token per claim (`batch_window = 1`).
    Batch,
    /// No wake-ups: waiting selects sleep their whole backoff, and PostgreSQL
    /// instances send no `NOTIFY` (`wakeups = false`).
    Wakeups,
    /// Settlement does not release locks: unlocked requests keep theirs until the
    /// lease (spending still removes a spent token's lock).
    SettleRelease,
    /// No tidying: a select alone on its wallet chooses as one beside other
    /// callers (`tidy_band = 0`).
    Tidy,
    /// No snapshots: every read goes to the store (`snapshot_ttl = 0`).
    Snapshot,
}

impl Ablation {
    /// The flag value: `anti-join`, `order`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            Ablation::AntiJoin => "anti-join",
            Ablation::SmallestFirst => "smallest-first",
            Ablation::Order => "order",
            Ablation::Window => "window",
            Ablation::Blacklist => "blacklist",
            Ablation::Batch => "batch",
            Ablation::Wakeups => "wakeups",
            Ablation::SettleRelease => "settle-release",
            Ablation::Tidy => "tidy",
            Ablation::Snapshot => "snapshot",
        }
    }
}

/// A selection strategy the simulator runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// The naive selector ([`naive`]).
    Naive,
    /// holdfast's [`holdfast::TokenSelector`] with the configured settings.
    Holdfast,
    /// holdfast with one mechanism switched off.
    Ablated(Ablation),
    /// The bound: claims what it knows to be free without reading ([`oracle`]).
    Oracle,
}

impl Strategy {
    /// `naive`, `holdfast`, `holdfast-no-<mechanism>`, `holdfast-smallest-first`
    /// or `oracle`.
    pub fn name(self) -> String {
        match self {
            Strategy::Naive => "naive".to_owned(),
            Strategy::Holdfast => "holdfast".to_owned(),
            // Not a mechanism switched off but the other policy.
            Strategy::Ablated(Ablation::SmallestFirst) => "holdfast-smallest-first".to_owned(),
            Strategy::Ablated(a) => format!("holdfast-no-{}", a.as_str()),
            Strategy::Oracle => "oracle".to_owned(),
        }
    }
}

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// The workload was refused.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// A fresh database could not be made or removed.
    #[error(transparent)]
    Provision(ProvisionError),
    /// A replica could not open the database.
    #[error(transparent)]
    Open(BackendError),
    /// Seeding the wallets failed.
    #[error("seeding the wallets: {0}")]
    Seed(TokenStoreError),
    /// The selection settings were refused.
    #[error(transparent)]
    Selection(SelectionConfigError),
    /// The lease settings were refused.
    #[error(transparent)]
    Lease(LeaseConfigError),
    /// Listing or claiming locks failed outside a select call.
    #[error("lock store: {0}")]
    Locks(LockStoreError),
    /// The queue store failed outside an admission step.
    #[error("queue store: {0}")]
    Queues(QueueStoreError),
    /// The raw select cycle's database driver failed.
    #[error("raw limit: {0}")]
    RawLimit(String),
    /// The payment history was refused (`--payments`).
    #[error(transparent)]
    Payments(#[from] replay::PaymentsError),
    /// A select or a confirm of the payment replay failed in the store.
    #[error("payment replay: {0}")]
    Replay(String),
    /// A simulation task panicked.
    #[error("a simulation task failed: {0}")]
    Task(String),
    /// The report file could not be written.
    #[error("cannot write the report {path}: {source}")]
    Report {
        /// The path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A value the simulator builds itself was refused (a bug, reported, not a panic).
    #[error("simulator bug: {0}")]
    Internal(String),
}

impl SimulateError {
    pub(crate) fn internal(e: impl std::fmt::Display) -> SimulateError {
        SimulateError::Internal(e.to_string())
    }

    /// Whether the error is the caller's input (workload, settings, URL).
    pub fn is_bad_input(&self) -> bool {
        match self {
            SimulateError::Workload(_)
            | SimulateError::Payments(_)
            | SimulateError::Selection(_)
            | SimulateError::Lease(_) => true,
            SimulateError::Open(e) => e.is_bad_input(),
            SimulateError::Provision(ProvisionError::Url(e)) => e.is_bad_input(),
            _ => false,
        }
    }
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// The workload.
    pub workload: Workload,
    /// Where: `None` for SQLite in the temp directory, a SQLite path (fresh files
    /// beside it) or a PostgreSQL URL (fresh databases on that server).
    pub db: Option<String>,
    /// The run's seed.
    pub seed: u64,
    /// Also run holdfast with this mechanism switched off.
    pub ablate: Option<Ablation>,
    /// Run only these strategies (`None`: naive and holdfast, plus the ablation).
    pub only: Option<Vec<Strategy>>,
    /// Also measure the physical limit: the raw select cycle run for this long
    /// ([`rawlimit::DEFAULT_DURATION`] in the bench).
    pub raw_limit: Option<Duration>,
    /// Progress bars on stderr for phases over a second.
    pub progress: bool,
    /// Backend, selection, lease and settlement settings.
    pub config: Config,
}

/// Settings of the run, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct RunSettingsReport {
    /// Backend instances (each with its own pool) on each database.
    pub replicas: usize,
    /// Concurrent select tasks (workers for admission).
    pub concurrency: usize,
    /// Legs per select.
    pub legs: u32,
    /// Backoff between legs is uniform in `[0, retry_interval_ms)`.
    pub retry_interval_ms: u64,
    /// Simulated clock speed (lease and sweep run on it).
    pub time_scale: u32,
    /// Lease expiry in simulated milliseconds.
    pub lease_expiry_ms: u64,
    /// Tokens seeded.
    pub tokens: u64,
    /// Requests planned.
    pub requests: u64,
    /// Why the backoff is short.
    pub note: &'static str,
}

/// One entry of `strategies`: token figures, or admission figures.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum StrategyEntry {
    /// A token workload strategy.
    Tokens(Box<StrategyFigures>),
    /// The admission workload.
    Admission(AdmissionFigures),
}

/// The result of `holdfast simulate`; its JSON is
/// `{"workload", "backend", "seed", "settings", "strategies": [...], "raw_limit"?}`.
#[derive(Debug, Clone, Serialize)]
pub struct SimulationReport {
    /// The workload name.
    pub workload: String,
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// The seed.
    pub seed: u64,
    /// The settings.
    pub settings: RunSettingsReport,
    /// One entry per strategy, naive first.
    pub strategies: Vec<StrategyEntry>,
    /// The physical limit, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_limit: Option<RawLimit>,
    /// The raw samples (for the HTML report), naive first.
    #[serde(skip)]
    pub runs: Vec<StrategyRun>,
}

/// The backoff note every report carries.
pub const BACKOFF_NOTE: &str = "backoff between legs is short in the simulator (retry_interval_ms, default 20 ms, as in upstream's contention tests), not the 5 s default";

/// The note of a workload that keeps the configuration's default backoff
/// (`hot-wallets`).
pub const DEFAULT_BACKOFF_NOTE: &str = "backoff between legs is the configuration's default (uniform in [0, 5 s)), as a service runs it";

/// The note for a run whose backoff interval is `retry_interval`.
fn backoff_note(retry_interval: Duration) -> &'static str {
    if retry_interval == holdfast_domain::SelectionConfig::default().retry_interval {
        DEFAULT_BACKOFF_NOTE
    } else {
        BACKOFF_NOTE
    }
}

/// The strategies a run compares, in the order they run (holdfast first, so its
/// peak memory is not inflated by what the naive run left resident).
pub fn strategies(options: &SimOptions) -> Vec<Strategy> {
    if let Some(only) = &options.only {
        return only.clone();
    }
    let mut out = vec![Strategy::Holdfast];
    if let Some(a) = options.ablate {
        out.push(Strategy::Ablated(a));
    }
    out.push(Strategy::Naive);
    out
}

/// Runs the simulation.
pub async fn simulate(options: SimOptions) -> Result<SimulationReport, SimulateError> {
    let provisioner =
        Provisioner::for_url(options.db.as_deref()).map_err(SimulateError::Provision)?;
    let result = simulate_on(&options, &provisioner).await;
    provisioner.finish();
    result
}

async fn simulate_on(
    options: &SimOptions,
    provisioner: &Provisioner,
) -> Result<SimulationReport, SimulateError> {
    let workload = &options.workload;
    let mut selection = options.config.selection_config();
    selection.retry_interval = Duration::from_millis(workload.retry_interval_ms);
    if let Some(legs) = workload.legs {
        selection.max_retries = legs;
    }
    selection.validate().map_err(SimulateError::Selection)?;
    let lease = options.config.lease_config();
    lease.validate().map_err(SimulateError::Lease)?;
    let settings = runner::RunSettings {
        selection: selection.clone(),
        lease,
        config: options.config.clone(),
        seed: options.seed,
        progress: options.progress,
    };
    let report_settings = RunSettingsReport {
        replicas: workload.replicas,
        concurrency: workload
            .admission
            .map_or(workload.concurrency, |a| a.workers),
        legs: selection.max_retries,
        retry_interval_ms: workload.retry_interval_ms,
        time_scale: workload.time_scale,
        lease_expiry_ms: u64::try_from(lease.lease_expiry.as_millis()).unwrap_or(u64::MAX),
        tokens: workload.token_count(),
        requests: workload.request_count(),
        note: backoff_note(selection.retry_interval),
    };
    let mut report = SimulationReport {
        workload: workload.name.clone(),
        backend: provisioner.kind().as_str(),
        seed: options.seed,
        settings: report_settings,
        strategies: Vec::new(),
        raw_limit: None,
        runs: Vec::new(),
    };
    if let Some(load) = workload.admission {
        let figures = admission::run(load, &settings, provisioner).await?;
        report.settings.requests = u64::from(load.queues) * u64::from(load.requests_per_queue);
        report.strategies.push(StrategyEntry::Admission(figures));
        return Ok(report);
    }
    let mut runs = Vec::new();
    for strategy in strategies(options) {
        runs.push(runner::run_strategy(strategy, workload, &settings, provisioner).await?);
    }
    // Report naive first, then holdfast, then the ablation.
    runs.sort_by_key(|r| match r.strategy {
        Strategy::Naive => 0,
        Strategy::Holdfast => 1,
        Strategy::Ablated(_) => 2,
        Strategy::Oracle => 3,
    });
    report.strategies = runs
        .iter()
        .map(|r| StrategyEntry::Tokens(Box::new(StrategyFigures::of(r))))
        .collect();
    if let Some(duration) = options.raw_limit {
        let mut limit = rawlimit::run(workload, &settings, provisioner, duration).await?;
        limit.fraction_of_raw_limit = report.strategies.iter().find_map(|e| match e {
            StrategyEntry::Tokens(f)
                if f.strategy == "holdfast" && limit.cycles_per_second > 0.0 =>
            {
                Some(figures::round3(
                    f.selects_per_second / limit.cycles_per_second,
                ))
            }
            _ => None,
        });
        report.raw_limit = Some(limit);
    }
    report.runs = runs;
    Ok(report)
}
