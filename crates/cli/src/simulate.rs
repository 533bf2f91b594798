//! `holdfast simulate`: the contention simulator ([`holdfast_simulator`]). It makes its
//! own fresh databases (one per strategy), so it runs before any database is
//! opened; `--db` only chooses the backend type and where the databases go.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args, ValueEnum};

use super::CliError;
use super::output::{Rendered, Report};
use holdfast::config::Config;
use holdfast_simulator::{
    self as simulator, Ablation, ReplayOptions, ReplayPolicy, ReplayReport, SimOptions,
    SimulationReport, Strategy, Workload,
};

/// `simulate`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("what").required(true).args(["workload", "payments"])))]
pub struct SimulateArgs {
    /// A preset (hot-lineage, pareto, dust, big-wallet, many-wallets, hot-wallets, admission) or a workload TOML file
    #[arg(long, value_name = "NAME|FILE")]
    pub workload: Option<String>,
    /// Replay a payment history instead (`amount,feerate` lines in BTC; positive
    /// deposits, negative payments) through every selection policy and two baselines
    #[arg(long, value_name = "FILE.csv", conflicts_with_all = ["report", "ablate", "only", "raw_limit"])]
    pub payments: Option<PathBuf>,
    /// Replay only the first N lines of the payment history
    #[arg(long, value_name = "N", requires = "payments")]
    pub limit: Option<usize>,
    /// Seed of the run: every strategy gets the same wallets, requests and per-call seeds
    #[arg(long, default_value_t = 42, value_name = "N")]
    pub seed: u64,
    /// Also write a self-contained HTML report with charts to this file
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// Also run holdfast with one mechanism switched off
    #[arg(long, value_enum, value_name = "MECHANISM")]
    pub ablate: Option<AblationArg>,
    /// Run only these strategies (repeatable; default: naive and holdfast), and the
    /// ablation if `--ablate` is given
    #[arg(long = "strategy", value_enum, value_name = "NAME", hide = true)]
    pub only: Vec<StrategyArg>,
    /// Also run a minimal select cycle (read, claim, settle) written raw against the
    /// database driver at the same concurrency on a fresh database: the physical
    /// limit holdfast is compared with
    #[arg(long, hide = true)]
    pub raw_limit: bool,
    /// How long the raw select cycle runs, in seconds
    #[arg(long, default_value = "3", value_name = "SECONDS", value_parser = seconds, hide = true)]
    pub raw_limit_seconds: Duration,
}

/// A positive, finite number of seconds.
fn seconds(text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("{text:?} is not a positive number of seconds"))
}

/// A strategy named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StrategyArg {
    /// The naive selector.
    Naive,
    /// holdfast's selector.
    Holdfast,
    /// The bound: claims what it knows to be free, without reading.
    Oracle,
}

/// A mechanism named by `--ablate` (the simulator's [`Ablation`]; the binary crate
/// alone names clap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AblationArg {
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

impl From<AblationArg> for Ablation {
    fn from(arg: AblationArg) -> Ablation {
        match arg {
            AblationArg::AntiJoin => Ablation::AntiJoin,
            AblationArg::SmallestFirst => Ablation::SmallestFirst,
            AblationArg::Order => Ablation::Order,
            AblationArg::Window => Ablation::Window,
            AblationArg::Blacklist => Ablation::Blacklist,
            AblationArg::Batch => Ablation::Batch,
            AblationArg::Wakeups => Ablation::Wakeups,
            AblationArg::SettleRelease => Ablation::SettleRelease,
            AblationArg::Tidy => Ablation::Tidy,
            AblationArg::Snapshot => Ablation::Snapshot,
        }
    }
}

impl Report for SimulationReport {
    fn human(&self) -> String {
        self.text()
    }
}

impl Report for ReplayReport {
    fn human(&self) -> String {
        self.text()
    }
}

impl From<simulator::SimulateError> for CliError {
    fn from(e: simulator::SimulateError) -> Self {
        CliError::Simulate(Box::new(e))
    }
}

/// Runs the simulation and renders its report (and writes the HTML report).
pub async fn run(
    args: &SimulateArgs,
    db: Option<&str>,
    config: Config,
) -> Result<Rendered, CliError> {
    // --db, else the configuration's db_url; neither: SQLite in the temp directory.
    let db = db
        .map(str::to_owned)
        .or_else(|| Some(config.db_url.clone()).filter(|u| !u.trim().is_empty()));
    if let Some(path) = &args.payments {
        let payments = simulator::replay::read_payments(path, args.limit)
            .map_err(simulator::SimulateError::from)?;
        let report = simulator::replay::replay(ReplayOptions {
            payments,
            source: path.display().to_string(),
            db,
            seed: args.seed,
            policies: ReplayPolicy::ALL.to_vec(),
            config,
            progress: true,
        })
        .await?;
        return Ok(Rendered::of(&report));
    }
    let name = args.workload.as_deref().unwrap_or_default();
    let workload = Workload::resolve(name).map_err(simulator::SimulateError::from)?;
    let ablate = args.ablate.map(Ablation::from);
    // `--strategy holdfast --ablate X` runs holdfast and its ablation, no naive.
    let only = (!args.only.is_empty()).then(|| {
        args.only
            .iter()
            .map(|s| match s {
                StrategyArg::Naive => Strategy::Naive,
                StrategyArg::Holdfast => Strategy::Holdfast,
                StrategyArg::Oracle => Strategy::Oracle,
            })
            .chain(ablate.map(Strategy::Ablated))
            .collect()
    });
    let options = SimOptions {
        workload,
        db,
        seed: args.seed,
        ablate,
        only,
        raw_limit: args.raw_limit.then_some(args.raw_limit_seconds),
        progress: true,
        config,
    };
    let report = simulator::simulate(options).await?;
    if let Some(path) = &args.report {
        std::fs::write(path, report.html()).map_err(|source| CliError::Io {
            action: "writing the report",
            path: path.display().to_string(),
            source,
        })?;
    }
    Ok(Rendered::of(&report))
}
