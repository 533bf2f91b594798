//! Runs one strategy of a token workload on a fresh database: seeds the wallets,
//! opens the replicas, drives `concurrency` select tasks over them, settles each
//! request as its mode says, checks the invariants as it goes, and returns the raw
//! samples ([`StrategyRun`]) the figures are computed from.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use holdfast_domain::{
    LeaseConfig, Quantity, SelectRequest, SelectionConfig, SelectionPolicy, SettlementStatus,
    Timestamp, TokenId, TokenType, TxId, WalletId,
};
use holdfast_ports::{Clock, LockStore, NewToken, Output, Stores, TokenStore};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::antijoin::LockBlindTokens;
use super::clock::SimClock;
use super::ledger::{ClaimLedger, CountingLockStore, TokenClaims};
use super::memory;
use super::naive::{NaiveConfig, NaiveSelector};
use super::oracle::{Oracle, OracleSelector};
use super::provision::{FreshDb, Provisioner};
use super::workload::{RequestMode, Workload};
use super::{Ablation, SimulateError, Strategy};
use holdfast::backend::Backend;
use holdfast::config::Config;
use holdfast::selector::{SelectError, SelectReport, TokenSelector};
use holdfast::settlement::Settlement;
use holdfast::sweeper::LeaseSweeper;

/// Tokens per `add_tokens` call when seeding wallets.
pub const SEED_BATCH: usize = 5_000;

/// One select request of the plan (the same plan for every strategy of a run).
#[derive(Debug, Clone)]
pub struct PlannedRequest {
    /// The wallet.
    pub wallet: WalletId,
    /// The token type.
    pub token_type: TokenType,
    /// The amount.
    pub amount: Quantity,
    /// What happens after a successful select.
    pub mode: RequestMode,
    /// The per-call RNG seed.
    pub seed: u64,
}

/// The wallet confirmed payments of the settle mode pay to (a sink no request
/// spends from).
fn payee() -> WalletId {
    WalletId::new("simulator-payee").unwrap_or_else(|_| unreachable!("a valid wallet id"))
}

/// What one select call measured.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The select succeeded.
    pub ok: bool,
    /// It failed with insufficient funds and the balance did not cover it.
    pub insufficient: bool,
    /// It failed although the balance, locks ignored, covered the request.
    pub spurious: bool,
    /// It failed with a store error.
    pub error: bool,
    /// Tokens named in claims.
    pub lock_attempts: u64,
    /// Contended verdicts.
    pub conflicts: u64,
    /// Store round trips of the call.
    pub round_trips: u64,
    /// Tokens in the selection (zero unless it succeeded).
    pub inputs: u64,
    /// The selection left a non-zero change (false unless it succeeded).
    pub change: bool,
    /// Wall time of the call, backoffs included.
    pub latency: Duration,
    /// When it finished, from the start of the run.
    pub finished_at: Duration,
}

/// Invariant violations seen during a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Violations {
    /// A token returned to a consumer while another live consumer held it.
    pub double_claims: u64,
    /// A token returned by a select after it had been spent.
    pub spent_selected: u64,
    /// Settlement (or minting the change) failed in the store.
    pub settle_errors: u64,
    /// Selected tokens left spendable after their transaction settled as
    /// confirmed: a lost spend.
    pub confirmed_left_spendable: u64,
    /// Locks a select found taken by the lease sweep when it re-checked them
    /// before answering (it then selected again): a figure, not a violation.
    pub lost_to_lease: u64,
    /// Selects that answered only after the lease had run out (their first locks
    /// may have been swept; not judged by the double-claim and spent checks).
    pub outlived_lease: u64,
}

/// Everything one strategy run measured.
#[derive(Debug, Clone)]
pub struct StrategyRun {
    /// The strategy.
    pub strategy: Strategy,
    /// One sample per select call, in completion order.
    pub samples: Vec<Sample>,
    /// Claims per token.
    pub claims: Vec<(TokenId, TokenClaims)>,
    /// How far concurrent claims spread ([`ClaimLedger::distinct_share_per_burst`],
    /// bursts of the workload's concurrency).
    pub distinct_share_per_burst: f64,
    /// Tokens that existed during the run: the seeded ones plus minted change.
    pub population: u64,
    /// Wall time of the request phase.
    pub wall: Duration,
    /// Peak resident memory of the process during the run (VmHWM), if readable.
    pub peak_memory_bytes: Option<u64>,
    /// Locks in the database when the last request finished.
    pub locks_left: u64,
    /// Invariant checks.
    pub violations: Violations,
}

/// The run-wide settings every strategy shares.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// The selection settings of `holdfast` (before an ablation).
    pub selection: SelectionConfig,
    /// The lease, in simulated time.
    pub lease: LeaseConfig,
    /// The configuration (backend options, settlement policy).
    pub config: Config,
    /// The run's seed.
    pub seed: u64,
    /// Show a progress bar on stderr for phases over a second.
    pub progress: bool,
}

/// A 64-bit mix (splitmix64) to derive independent seeds from the run's seed.
pub fn mix(seed: u64, salt: u64) -> u64 {
    let mut z = seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The seeded wallets of a workload, generated batch by batch (so seeding a 1M
/// token wallet never holds it in memory): every token with its drawn amount, the
/// same for every strategy of a run.
#[derive(Debug)]
pub struct Genesis<'a> {
    workload: &'a Workload,
    rng: StdRng,
    block: usize,
    next: u64,
}

impl<'a> Genesis<'a> {
    /// The wallets of `workload` for the run's `seed`.
    pub fn new(workload: &'a Workload, seed: u64) -> Self {
        Genesis {
            workload,
            rng: StdRng::seed_from_u64(mix(seed, 1)),
            block: 0,
            next: 0,
        }
    }

    /// The next at most `n` tokens; empty when every block is done.
    pub fn batch(&mut self, n: usize) -> Result<Vec<NewToken>, SimulateError> {
        let mut out = Vec::with_capacity(n.min(SEED_BATCH));
        while out.len() < n {
            let Some(block) = self.workload.tokens.get(self.block) else {
                break;
            };
            if self.next >= block.count {
                self.block += 1;
                self.next = 0;
                continue;
            }
            let tx =
                TxId::new(format!("genesis-{}", self.block)).map_err(SimulateError::internal)?;
            let index = u32::try_from(self.next).map_err(SimulateError::internal)?;
            out.push(NewToken {
                id: TokenId::new(tx, index),
                wallet: block.wallet.clone(),
                token_type: block.token_type.clone(),
                quantity: block.amount.draw(&mut self.rng),
                spendable: true,
            });
            self.next += 1;
        }
        Ok(out)
    }
}

/// The request plan: every block's requests with drawn amounts, shuffled.
pub fn plan(workload: &Workload, seed: u64) -> Vec<PlannedRequest> {
    let mut rng = StdRng::seed_from_u64(mix(seed, 2));
    let mut out = Vec::new();
    for block in &workload.requests {
        for _ in 0..block.count {
            out.push(PlannedRequest {
                wallet: block.wallet.clone(),
                token_type: block.token_type.clone(),
                amount: block.amount.draw(&mut rng),
                mode: block.mode,
                seed: 0,
            });
        }
    }
    out.shuffle(&mut rng);
    for (i, request) in out.iter_mut().enumerate() {
        request.seed = mix(seed, 1000 + u64::try_from(i).unwrap_or(u64::MAX));
    }
    out
}

/// Adds the workload's wallets through `store` in batches of [`SEED_BATCH`];
/// `ids`, if given, collects every token id. Returns how many tokens were added.
pub async fn seed_wallets(
    store: &dyn TokenStore,
    workload: &Workload,
    seed: u64,
    progress: &Progress,
    mut ids: Option<&mut Vec<TokenId>>,
) -> Result<u64, SimulateError> {
    let mut genesis = Genesis::new(workload, seed);
    let mut added = 0u64;
    loop {
        let batch = genesis.batch(SEED_BATCH)?;
        if batch.is_empty() {
            return Ok(added);
        }
        store
            .add_tokens(&batch)
            .await
            .map_err(SimulateError::Seed)?;
        let n = u64::try_from(batch.len()).unwrap_or(u64::MAX);
        added += n;
        progress.inc(n);
        if let Some(ids) = ids.as_deref_mut() {
            ids.extend(batch.into_iter().map(|t| t.id));
        }
    }
}

/// A progress bar on stderr that appears only once its phase has run for a second.
#[derive(Debug, Clone)]
pub struct Progress {
    bar: ProgressBar,
    enabled: bool,
    shown: Arc<AtomicBool>,
    started: Instant,
}

impl Progress {
    /// A bar of `total` steps (`None`: unknown) labelled `label`; `enabled` false
    /// never draws.
    pub fn new(total: Option<u64>, label: &str, enabled: bool) -> Progress {
        let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::hidden());
        let template = if total.is_some() {
            "{prefix:>24} [{bar:30}] {pos}/{len} {elapsed_precise}"
        } else {
            "{prefix:>24} {spinner} {pos} {elapsed_precise}"
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(label.to_owned());
        Progress {
            bar,
            enabled,
            shown: Arc::new(AtomicBool::new(false)),
            started: Instant::now(),
        }
    }

    /// Advances by `n`; shows the bar once a second has passed.
    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
        if self.enabled
            && !self.shown.load(Ordering::Relaxed)
            && self.started.elapsed() >= Duration::from_secs(1)
            && !self.shown.swap(true, Ordering::Relaxed)
        {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

enum Selector {
    Holdfast(Box<TokenSelector>),
    Naive(NaiveSelector),
    Oracle(OracleSelector),
}

struct Replica {
    stores: Stores,
    selector: Selector,
    settlement: Settlement,
    /// Whether settlement releases locks (false: naive, and the settle-release ablation).
    releases: bool,
}

impl Replica {
    async fn select(&self, request: &SelectRequest, seed: u64) -> SelectReport {
        match &self.selector {
            Selector::Holdfast(s) => s.select_seeded(request, seed).await,
            Selector::Naive(s) => s.select_seeded(request, seed).await,
            Selector::Oracle(s) => s.select_seeded(request, seed).await,
        }
    }

    /// The run's oracle, when this replica's selector is one.
    fn oracle(&self) -> Option<&Oracle> {
        match &self.selector {
            Selector::Oracle(s) => Some(s.oracle()),
            _ => None,
        }
    }
}

/// Who holds a token, as the run's invariant checker sees it.
#[derive(Debug, Clone)]
struct Holder {
    consumer: TxId,
    /// Simulated time the holder's select started (its lock is at least this new):
    /// once the lease has run from here, the lock may have been swept.
    since: Timestamp,
}

#[derive(Default)]
struct Checker {
    holders: Mutex<HashMap<TokenId, Holder>>,
    spent: Mutex<HashSet<TokenId>>,
    double_claims: AtomicU64,
    spent_selected: AtomicU64,
    settle_errors: AtomicU64,
    confirmed_left_spendable: AtomicU64,
    lost_to_lease: AtomicU64,
    outlived_lease: AtomicU64,
    minted: AtomicU64,
}

impl Checker {
    fn on_selected(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
        since: Timestamp,
        now: Timestamp,
        lease: Duration,
    ) {
        // A select that outlived the lease may have lost its first locks to the
        // sweep before it answered: the lease did its job and the consumer is no
        // longer a live holder of them. Counted, not judged.
        if now.as_millis() >= since.as_millis().saturating_add(millis(lease)) {
            self.outlived_lease.fetch_add(1, Ordering::Relaxed);
            let mut holders = self.holders.lock().unwrap_or_else(PoisonError::into_inner);
            for t in tokens {
                holders.insert(
                    t.clone(),
                    Holder {
                        consumer: consumer.clone(),
                        since,
                    },
                );
            }
            return;
        }
        {
            let spent = self.spent.lock().unwrap_or_else(PoisonError::into_inner);
            for t in tokens {
                if spent.contains(t) {
                    self.spent_selected.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(token = %t, %consumer, "a spent token was selected");
                }
            }
        }
        let mut holders = self.holders.lock().unwrap_or_else(PoisonError::into_inner);
        for t in tokens {
            if let Some(h) = holders.get(t) {
                // Any lock may have been swept once it is older than the lease; its
                // holder's select started no later than the lock was written.
                let maybe_swept =
                    now.as_millis() >= h.since.as_millis().saturating_add(millis(lease));
                if !maybe_swept && h.consumer != *consumer {
                    self.double_claims.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(token = %t, holder = %h.consumer, %consumer, "a token held by a live consumer was selected again");
                }
            }
            holders.insert(
                t.clone(),
                Holder {
                    consumer: consumer.clone(),
                    since,
                },
            );
        }
    }

    /// Forgets the holder before its locks are released (so a later winner is never
    /// mistaken for a double claim).
    fn on_releasing(&self, tokens: &[TokenId]) {
        let mut holders = self.holders.lock().unwrap_or_else(PoisonError::into_inner);
        for t in tokens {
            holders.remove(t);
        }
    }

    /// Records tokens the store reports spent (a token can only be won again if it
    /// was not: spending and the lock release are one step).
    fn on_spent(&self, tokens: &[TokenId]) {
        let mut spent = self.spent.lock().unwrap_or_else(PoisonError::into_inner);
        spent.extend(tokens.iter().cloned());
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The selection settings of a strategy: holdfast's, with the ablated knob off.
pub fn selection_for(strategy: Strategy, base: &SelectionConfig) -> SelectionConfig {
    let mut config = base.clone();
    if let Strategy::Ablated(ablation) = strategy {
        match ablation {
            Ablation::Blacklist => config.blacklist = false,
            Ablation::SmallestFirst => config.policy = SelectionPolicy::SmallestFirst,
            Ablation::Order => {
                config.policy = SelectionPolicy::SmallestFirst;
                config.ascending = false;
            }
            Ablation::Window => config.sufficiency_window = 1,
            Ablation::Batch => config.batch_window = 1,
            Ablation::Wakeups => config.wakeups = false,
            Ablation::Tidy => config.tidy_band = 0,
            Ablation::Snapshot => config.snapshot_ttl = Duration::ZERO,
            Ablation::AntiJoin | Ablation::SettleRelease => {}
        }
    }
    config
}

async fn open_replicas(
    strategy: Strategy,
    db: &FreshDb,
    workload: &Workload,
    settings: &RunSettings,
    clock: &Arc<SimClock>,
    ledger: &Arc<ClaimLedger>,
) -> Result<(Vec<Backend>, Vec<Arc<Replica>>), SimulateError> {
    let selection = selection_for(strategy, &settings.selection);
    let mut options = settings.config.backend_options();
    // No wake-ups, no NOTIFY either (neither the naive selector nor the oracle
    // waits for one).
    options.postgres.wakeups =
        selection.wakeups && !matches!(strategy, Strategy::Naive | Strategy::Oracle);
    let oracle = Arc::new(Oracle::default());
    let mut backends = Vec::new();
    let mut replicas = Vec::new();
    for r in 0..workload.replicas {
        let backend = Backend::open(&db.url, &options)
            .await
            .map_err(SimulateError::Open)?;
        let raw = backend.stores();
        let tokens: Arc<dyn TokenStore> = if strategy == Strategy::Ablated(Ablation::AntiJoin) {
            Arc::new(LockBlindTokens::new(raw.tokens.clone()))
        } else {
            raw.tokens.clone()
        };
        let locks: Arc<dyn LockStore> =
            Arc::new(CountingLockStore::new(raw.locks.clone(), ledger.clone()));
        let stores = Stores {
            tokens,
            locks,
            statuses: raw.statuses.clone(),
            queues: raw.queues.clone(),
            wake: raw.wake.clone(),
        };
        let clock_port: Arc<dyn Clock> = clock.clone();
        let selector = match strategy {
            Strategy::Naive => Selector::Naive(NaiveSelector::new(
                stores.tokens.clone(),
                stores.locks.clone(),
                clock_port.clone(),
                NaiveConfig {
                    legs: selection.max_retries,
                    max_immediate_retries: selection.max_immediate_retries,
                    retry_interval: selection.retry_interval,
                    cache_refresh: Duration::from_secs(1),
                },
            )),
            Strategy::Oracle => Selector::Oracle(OracleSelector::new(
                oracle.clone(),
                stores.locks.clone(),
                clock_port.clone(),
            )),
            _ => Selector::Holdfast(Box::new(
                TokenSelector::new(
                    stores.clone(),
                    clock_port.clone(),
                    selection.clone(),
                    Some(mix(settings.seed, 500 + u64::try_from(r).unwrap_or(0))),
                )
                .map_err(SimulateError::Selection)?
                .with_lease(settings.lease.lease_expiry),
            )),
        };
        let settlement =
            Settlement::new(stores.clone(), clock_port, settings.config.persist_policy());
        let releases = !matches!(
            strategy,
            Strategy::Naive | Strategy::Ablated(Ablation::SettleRelease)
        );
        replicas.push(Arc::new(Replica {
            stores,
            selector,
            settlement,
            releases,
        }));
        backends.push(backend);
    }
    Ok((backends, replicas))
}

struct Shared {
    plan: Vec<PlannedRequest>,
    next: AtomicUsize,
    samples: Mutex<Vec<Sample>>,
    checker: Checker,
    clock: Arc<SimClock>,
    lease: Duration,
    started: Instant,
    progress: Progress,
}

async fn run_request(shared: &Shared, replica: &Replica, index: usize) {
    let Some(planned) = shared.plan.get(index) else {
        return;
    };
    let Ok(consumer) = TxId::new(format!("sim-{index}")) else {
        return;
    };
    let request = SelectRequest {
        wallet: planned.wallet.clone(),
        token_type: planned.token_type.clone(),
        amount: planned.amount,
        consumer: consumer.clone(),
    };
    let since = shared.clock.now();
    let report = replica.select(&request, planned.seed).await;
    shared
        .checker
        .lost_to_lease
        .fetch_add(report.stats.locks_lost, Ordering::Relaxed);
    let mut sample = Sample {
        ok: false,
        insufficient: false,
        spurious: false,
        error: false,
        lock_attempts: report.stats.lock_attempts,
        conflicts: report.stats.conflicts,
        round_trips: report.stats.round_trips(),
        inputs: 0,
        change: false,
        latency: report.elapsed,
        finished_at: Duration::ZERO,
    };
    match report.result {
        Ok(selected) => {
            sample.ok = true;
            sample.inputs = u64::try_from(selected.tokens.len()).unwrap_or(u64::MAX);
            sample.change = !selected.change.is_zero();
            let checker = &shared.checker;
            checker.on_selected(
                &consumer,
                &selected.tokens,
                since,
                shared.clock.now(),
                shared.lease,
            );
            match planned.mode {
                RequestMode::Settle => {
                    checker.on_releasing(&selected.tokens);
                    // The payment leaves the wallet for a payee; the change comes
                    // back to it: both outputs commit with the spend.
                    let payment = [Output {
                        wallet: payee(),
                        token_type: planned.token_type.clone(),
                        quantity: planned.amount,
                    }];
                    match replica
                        .settlement
                        .confirm(&consumer, &payment, Some(&planned.wallet))
                        .await
                    {
                        Ok(confirmed) => {
                            if let Some(oracle) = replica.oracle() {
                                oracle.settled(&selected.tokens, &confirmed.outputs);
                            }
                            if !selected.change.is_zero() {
                                checker.minted.fetch_add(1, Ordering::Relaxed);
                            }
                            checker.on_spent(&confirmed.spent);
                            // Confirmed spends every selected token, whatever the
                            // lease sweep did: one left out is a lost spend.
                            let left = selected
                                .tokens
                                .iter()
                                .filter(|t| !confirmed.spent.contains(t))
                                .count();
                            checker.confirmed_left_spendable.fetch_add(
                                u64::try_from(left).unwrap_or(u64::MAX),
                                Ordering::Relaxed,
                            );
                        }
                        Err(e) => {
                            checker.settle_errors.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(error = %e, "could not confirm");
                            if let Some(oracle) = replica.oracle() {
                                oracle.forget(&selected.tokens);
                            }
                        }
                    }
                }
                RequestMode::Unlock if replica.releases => {
                    checker.on_releasing(&selected.tokens);
                    let released = replica
                        .settlement
                        .on_status(&consumer, SettlementStatus::Invalid)
                        .await;
                    if let Err(e) = &released {
                        checker.settle_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(error = %e, "could not release");
                    }
                    if let Some(oracle) = replica.oracle() {
                        if released.is_ok() {
                            oracle.released(&selected.tokens);
                        } else {
                            oracle.forget(&selected.tokens);
                        }
                    }
                }
                // Left to the lease sweep: the holder stays in the checker until its
                // lease has run out (and out of the oracle's sight).
                RequestMode::Unlock | RequestMode::Hold => {
                    if let Some(oracle) = replica.oracle() {
                        oracle.forget(&selected.tokens);
                    }
                }
            }
        }
        Err(SelectError::Store(_) | SelectError::Input(_)) => sample.error = true,
        Err(e) => {
            let covered = match replica
                .stores
                .tokens
                .balance(&planned.wallet, &planned.token_type)
                .await
            {
                Ok(balance) => balance >= planned.amount,
                Err(_) => false,
            };
            match e {
                SelectError::InsufficientFunds { .. } if !covered => sample.insufficient = true,
                _ if covered => sample.spurious = true,
                // Funds locked while the balance no longer covers the request:
                // the money was spent meanwhile; a true shortage.
                _ => sample.insufficient = true,
            }
        }
    }
    sample.finished_at = shared.started.elapsed();
    shared
        .samples
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(sample);
    shared.progress.inc(1);
}

/// Runs `strategy` of `workload` on a fresh database from `provisioner`.
pub async fn run_strategy(
    strategy: Strategy,
    workload: &Workload,
    settings: &RunSettings,
    provisioner: &Provisioner,
) -> Result<StrategyRun, SimulateError> {
    let db = provisioner
        .create(&strategy.name())
        .await
        .map_err(SimulateError::Provision)?;
    let result = run_on(strategy, workload, settings, provisioner, &db).await;
    let removed = provisioner.remove(&db).await;
    let run = result?;
    removed.map_err(SimulateError::Provision)?;
    Ok(run)
}

async fn run_on(
    strategy: Strategy,
    workload: &Workload,
    settings: &RunSettings,
    provisioner: &Provisioner,
    db: &FreshDb,
) -> Result<StrategyRun, SimulateError> {
    let clock = Arc::new(SimClock::new(
        Timestamp::from_millis(1_700_000_000_000),
        workload.time_scale,
    ));
    let ledger = Arc::new(ClaimLedger::default());
    let (backends, replicas) =
        open_replicas(strategy, db, workload, settings, &clock, &ledger).await?;
    let fresh = (provisioner, db);
    let outcome = drive(
        strategy, workload, settings, fresh, clock, ledger, &replicas,
    )
    .await;
    for backend in &backends {
        backend.close().await;
    }
    outcome
}

/// Opens each replica's connections before the clock starts, as a running
/// service has them: as many balance reads at once as the replica has workers.
/// Otherwise the first requests of a PostgreSQL run pay for connecting, a cost
/// of starting up that is not what the figures compare.
async fn warm_up(replicas: &[Arc<Replica>], workload: &Workload, plan: &[PlannedRequest]) {
    let Some(first) = plan.first() else { return };
    let per_replica = workload.concurrency.div_ceil(replicas.len().max(1));
    let mut reads = tokio::task::JoinSet::new();
    for replica in replicas {
        for _ in 0..per_replica {
            let (replica, wallet, token_type) = (
                replica.clone(),
                first.wallet.clone(),
                first.token_type.clone(),
            );
            reads.spawn(async move {
                // Only the connection matters; a failed read fails the run later.
                let _ = replica.stores.tokens.balance(&wallet, &token_type).await;
            });
        }
    }
    while reads.join_next().await.is_some() {}
}

async fn drive(
    strategy: Strategy,
    workload: &Workload,
    settings: &RunSettings,
    (provisioner, db): (&Provisioner, &FreshDb),
    clock: Arc<SimClock>,
    ledger: Arc<ClaimLedger>,
    replicas: &[Arc<Replica>],
) -> Result<StrategyRun, SimulateError> {
    let first = replicas
        .first()
        .ok_or_else(|| SimulateError::internal("a workload has at least one replica"))?;
    let seeding = Progress::new(
        Some(workload.token_count()),
        &format!("{}: seeding", strategy.name()),
        settings.progress,
    );
    let population = seed_wallets(
        first.stores.tokens.as_ref(),
        workload,
        settings.seed,
        &seeding,
        None,
    )
    .await?;
    seeding.finish();
    provisioner
        .analyze(db)
        .await
        .map_err(SimulateError::Provision)?;

    let lease = settings.lease;
    let sweep_config = LeaseConfig {
        lease_expiry: lease.lease_expiry,
        cleanup_period: clock.wall(lease.cleanup_period),
    };
    let mut sweepers = Vec::new();
    for replica in replicas {
        let clock_port: Arc<dyn Clock> = clock.clone();
        sweepers.push(
            LeaseSweeper::spawn(replica.stores.locks.clone(), clock_port, sweep_config)
                .map_err(SimulateError::Lease)?,
        );
    }

    let plan = plan(workload, settings.seed);
    if let Some(oracle) = first.oracle() {
        let keys: HashSet<(WalletId, TokenType)> = plan
            .iter()
            .map(|p| (p.wallet.clone(), p.token_type.clone()))
            .collect();
        oracle
            .fill(first.stores.tokens.as_ref(), keys)
            .await
            .map_err(SimulateError::Seed)?;
    }
    warm_up(replicas, workload, &plan).await;
    let total = u64::try_from(plan.len()).unwrap_or(u64::MAX);
    memory::reset_peak();
    let shared = Arc::new(Shared {
        plan,
        next: AtomicUsize::new(0),
        samples: Mutex::new(Vec::new()),
        checker: Checker::default(),
        clock: clock.clone(),
        lease: lease.lease_expiry,
        started: Instant::now(),
        progress: Progress::new(Some(total), &strategy.name(), settings.progress),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..workload.concurrency {
        let shared = shared.clone();
        let replica = replicas[t % replicas.len()].clone();
        tasks.spawn(async move {
            loop {
                let index = shared.next.fetch_add(1, Ordering::Relaxed);
                if index >= shared.plan.len() {
                    break;
                }
                run_request(&shared, &replica, index).await;
            }
        });
    }
    let mut panicked = None;
    while let Some(joined) = tasks.join_next().await {
        if let Err(e) = joined {
            panicked = Some(e.to_string());
        }
    }
    let wall = shared.started.elapsed();
    shared.progress.finish();
    let peak_memory_bytes = memory::peak_bytes();
    if let Some(message) = panicked {
        return Err(SimulateError::Task(message));
    }
    for sweeper in sweepers {
        sweeper.shutdown().await;
    }
    let locks_left = first
        .stores
        .locks
        .list_locks()
        .await
        .map_err(SimulateError::Locks)?
        .len();
    let samples = std::mem::take(
        &mut *shared
            .samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    let checker = &shared.checker;
    Ok(StrategyRun {
        strategy,
        samples,
        claims: ledger.snapshot(),
        distinct_share_per_burst: ledger.distinct_share_per_burst(workload.concurrency),
        population: population.saturating_add(checker.minted.load(Ordering::Relaxed)),
        wall,
        peak_memory_bytes,
        locks_left: u64::try_from(locks_left).unwrap_or(u64::MAX),
        violations: Violations {
            double_claims: checker.double_claims.load(Ordering::Relaxed),
            spent_selected: checker.spent_selected.load(Ordering::Relaxed),
            settle_errors: checker.settle_errors.load(Ordering::Relaxed),
            confirmed_left_spendable: checker.confirmed_left_spendable.load(Ordering::Relaxed),
            lost_to_lease: checker.lost_to_lease.load(Ordering::Relaxed),
            outlived_lease: checker.outlived_lease.load(Ordering::Relaxed),
        },
    })
}
