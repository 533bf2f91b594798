//! `holdfast demo`: a scripted tour on a fresh database (a temporary SQLite file
//! unless `--db` is given), using the same services as the other commands.
//!
//! 1. Fund a wallet with 128 tokens of 100.
//! 2. Run 32 selects of 150 at once across 3 replicas (3 independent backend
//!    instances on the same database), each for its own transaction.
//! 3. Show the locks they hold, settle half as confirmed (each paying 150 to a
//!    payee, its change back to the wallet, with the spend in one transaction) and
//!    half as deleted, and show the locks gone and the balance reduced by exactly
//!    what was paid.
//! 4. Admit builds through a crash and a redelivery: the first process of a request
//!    stops right after its slot claim is written (a store that fails every call
//!    after that write stands in for the crashed process); the redelivery, on a
//!    healthy store, resumes the claimed request and publishes its build. A second
//!    request is held while the slot is taken and admitted once the first build
//!    finishes.
//! 5. Print a summary (JSON under `--json`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use holdfast::domain::{
    AdmissionConfig, BuildOutcome, Precision, Quantity, QueueName, Reply, RequestId, RevisionUri,
    TokenType, TxId, WalletId,
};
use holdfast::ports::Output;
use serde::Serialize;

use super::output::{self, Rendered, Report};
use super::queue::{ReplyView, RequestView};
use super::select::SelectStats;
use super::settle::{SettleStatus, SettleView};
use super::{CliError, Context};
use holdfast::admission::{Admission, AdmissionPolicy, NoAncestry};
use holdfast::backend::Backend;
use holdfast::clock::SystemClock;
use holdfast::config::Config;
use holdfast::crash::{CrashPlan, CrashingQueues, Fate, WriteCall};
use holdfast::selector::{SelectError, TokenSelector};
use holdfast::settlement::Settlement;

/// The demo wallet.
pub const WALLET: &str = "demo-wallet";
/// The wallet the demo's confirmed payments pay to.
pub const PAYEE: &str = "demo-payee";
/// The demo token type.
pub const TOKEN_TYPE: &str = "CHF";
/// Tokens funded.
pub const TOKENS: u32 = 128;
/// The amount of each funded token.
pub const TOKEN_AMOUNT: u128 = 100;
/// Concurrent selects.
pub const SELECTS: usize = 32;
/// Replicas (independent backend instances) the selects are spread over.
pub const REPLICAS: usize = 3;
/// The amount of each select (two tokens, change 50).
pub const SELECT_AMOUNT: u128 = 150;
/// The demo build queue.
pub const QUEUE: &str = "demo/main";
/// The longest backoff between select legs during the tour, so a contended select
/// retries promptly (the configured interval applies when it is shorter).
pub const MAX_DEMO_BACKOFF: Duration = Duration::from_millis(250);

/// `demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Keep the temporary database and print its path (ignored with --db)
    #[arg(long)]
    pub keep: bool,
}

/// A temporary directory, removed on drop unless kept.
#[derive(Debug)]
struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl TempDir {
    fn create(keep: bool) -> Result<TempDir, CliError> {
        let base = std::env::temp_dir();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = base.join(format!("holdfast-demo-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&path).map_err(|source| CliError::Io {
            action: "creating the demo directory",
            path: path.display().to_string(),
            source,
        })?;
        Ok(TempDir { path, keep })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The database of the tour in the summary.
#[derive(Debug, Serialize)]
pub struct DatabaseSummary {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// The URL, password redacted.
    pub url: String,
    /// Whether it was a temporary database (removed afterwards unless `--keep`).
    pub temporary: bool,
    /// Independent backend instances used.
    pub replicas: usize,
}

/// Funding in the summary.
#[derive(Debug, Serialize)]
pub struct FundingSummary {
    /// The wallet.
    pub wallet: String,
    /// The token type.
    #[serde(rename = "type")]
    pub token_type: String,
    /// Tokens added.
    pub tokens: u32,
    /// The amount of each.
    pub amount_each: String,
    /// The balance after funding.
    pub balance: String,
}

/// The concurrent selects in the summary.
#[derive(Debug, Serialize)]
pub struct SelectsSummary {
    /// Selects started at once.
    pub concurrent: usize,
    /// The amount of each.
    pub amount_each: String,
    /// Selects that locked their tokens.
    pub locked: usize,
    /// Selects that ended FundsLocked.
    pub funds_locked: usize,
    /// Selects that ended InsufficientFunds.
    pub insufficient_funds: usize,
    /// Selects that failed otherwise.
    pub errors: usize,
    /// Tokens locked by the successful selects.
    pub tokens_locked: usize,
    /// Whether any token was locked by two selects (must be false).
    pub double_claims: bool,
    /// What the selects measured, summed.
    pub stats: SelectStats,
    /// Wall time of the selects.
    pub elapsed_ms: u64,
}

/// Settlement in the summary.
#[derive(Debug, Serialize)]
pub struct SettlementSummary {
    /// Locks held before settling.
    pub locks_before: usize,
    /// Transactions settled as confirmed.
    pub confirmed: usize,
    /// Transactions settled as deleted.
    pub deleted: usize,
    /// Tokens marked spent.
    pub tokens_spent: usize,
    /// Locks released without spending.
    pub locks_released: u64,
    /// Locks left after settling (0).
    pub locks_after: usize,
    /// The balance after settling.
    pub balance_after: String,
    /// What the confirmed payments paid to the payee.
    pub paid: String,
}

/// One admission step of the tour.
#[derive(Debug, Serialize)]
pub struct AdmissionStep {
    /// What the step does.
    pub step: String,
    /// The request.
    pub request: String,
    /// The reply, or null when the step crashed.
    pub reply: Option<ReplyView>,
    /// The request's state afterwards.
    pub state: Option<&'static str>,
    /// The queue's slot owners afterwards.
    pub owners: Vec<String>,
}

/// Admission in the summary.
#[derive(Debug, Serialize)]
pub struct AdmissionSummary {
    /// The queue.
    pub queue: String,
    /// Its slots during the tour.
    pub max_concurrent: u32,
    /// The steps, in order.
    pub steps: Vec<AdmissionStep>,
    /// Owners at the end (none).
    pub owners_after: Vec<String>,
    /// The last green revision at the end.
    pub last_green: Option<String>,
}

/// `demo` JSON: `{"database", "funding", "selects", "settlement", "admission",
/// "elapsed_ms"}` (see the field types for each object's keys).
#[derive(Debug, Serialize)]
pub struct DemoSummary {
    /// The database.
    pub database: DatabaseSummary,
    /// Funding.
    pub funding: FundingSummary,
    /// The concurrent selects.
    pub selects: SelectsSummary,
    /// Settlement.
    pub settlement: SettlementSummary,
    /// Admission through a crash and a redelivery.
    pub admission: AdmissionSummary,
    /// Wall time of the whole tour.
    pub elapsed_ms: u64,
    /// Where the temporary database was kept (`--keep`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_at: Option<String>,
}

impl Report for DemoSummary {
    fn human(&self) -> String {
        let d = &self;
        let mut t = String::new();
        t.push_str(&format!(
            "holdfast demo on {} {}{}\n\n",
            d.database.backend,
            d.database.url,
            if d.database.temporary {
                " (temporary)"
            } else {
                ""
            }
        ));
        t.push_str(&format!(
            "1. funded {} with {} tokens of {} {}: balance {}\n",
            d.funding.wallet,
            d.funding.tokens,
            d.funding.amount_each,
            d.funding.token_type,
            d.funding.balance
        ));
        let s = &d.selects;
        t.push_str(&format!(
            "2. {} concurrent selects of {} across {} replicas: {} locked ({} tokens), {} funds locked, {} insufficient, {} errors; \
             {} lost races, {} legs, {} round trips, {} ms; double claims: {}\n",
            s.concurrent,
            s.amount_each,
            d.database.replicas,
            s.locked,
            s.tokens_locked,
            s.funds_locked,
            s.insufficient_funds,
            s.errors,
            s.stats.conflicts,
            s.stats.legs,
            s.stats.round_trips,
            s.elapsed_ms,
            if s.double_claims { "YES" } else { "none" }
        ));
        let st = &d.settlement;
        t.push_str(&format!(
            "3. locks held: {}; settled {} confirmed ({} tokens spent, {} paid to {PAYEE}, change returned) \
             and {} deleted ({} locks released); locks left: {}; balance {}\n",
            st.locks_before,
            st.confirmed,
            st.tokens_spent,
            st.paid,
            st.deleted,
            st.locks_released,
            st.locks_after,
            st.balance_after
        ));
        let a = &d.admission;
        t.push_str(&format!(
            "4. admission on queue {} ({} slot):\n",
            a.queue, a.max_concurrent
        ));
        for step in &a.steps {
            let reply = step.reply.as_ref().map_or(
                "CRASHED after the claim write".to_owned(),
                ReplyView::describe,
            );
            let owners = if step.owners.is_empty() {
                "none".to_owned()
            } else {
                step.owners.join(", ")
            };
            t.push_str(&format!(
                "   - {}: {} -> {}; state {}; slot owners: {}\n",
                step.step,
                step.request,
                reply,
                step.state.unwrap_or("-"),
                owners
            ));
        }
        t.push_str(&format!(
            "5. done in {} ms: {} lock(s) left, {} slot owner(s) left\n",
            d.elapsed_ms,
            d.settlement.locks_after,
            a.owners_after.len()
        ));
        if let Some(path) = &d.kept_at {
            t.push_str(&format!("   the database was kept at {path}\n"));
        }
        t
    }
}

/// The demo's crash: the process dies right after it wrote the slot claim of
/// `request`; from then on every call fails, as a dead process's would.
struct CrashAfterClaim {
    request: RequestId,
    crashed: AtomicBool,
}

const CRASHED_AFTER_CLAIM: &str = "the demo process crashed after writing the slot claim";

impl CrashPlan for CrashAfterClaim {
    fn fate(&self, write: WriteCall<'_>) -> Fate {
        match write {
            WriteCall::Queue(queue)
                if queue.owners.contains_key(&self.request)
                    && !self.crashed.swap(true, Ordering::SeqCst) =>
            {
                Fate::CrashAfter(CRASHED_AFTER_CLAIM.to_owned())
            }
            _ => Fate::Proceed,
        }
    }

    fn dead(&self) -> Option<String> {
        self.crashed
            .load(Ordering::SeqCst)
            .then(|| CRASHED_AFTER_CLAIM.to_owned())
    }
}

fn step_failed(step: &'static str, detail: impl ToString) -> CliError {
    CliError::Demo {
        step,
        detail: detail.to_string(),
    }
}

/// A spinner on stderr naming the current step (hidden when stderr is not a terminal).
fn spinner() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// Runs the tour. `db` is the `--db` flag: without it the tour uses a temporary
/// SQLite file.
pub async fn run(args: &DemoArgs, db: Option<&str>, config: Config) -> Result<Rendered, CliError> {
    let started = Instant::now();
    let temp = match db {
        Some(_) => None,
        None => Some(TempDir::create(args.keep)?),
    };
    let url = match (db, &temp) {
        (Some(url), _) => url.to_owned(),
        (None, Some(dir)) => format!("sqlite://{}", dir.path.join("demo.db").display()),
        (None, None) => return Err(step_failed("open", "no database")),
    };
    let progress = spinner();
    progress.set_message("opening the database");
    let ctx = Context::open(&url, config).await?;
    let result = tour(&ctx, &url, &progress, temp.is_some()).await;
    progress.finish_and_clear();
    ctx.backend.close().await;
    let mut summary = result?;
    summary.elapsed_ms = output::millis(started.elapsed());
    if let Some(dir) = &temp
        && dir.keep
    {
        summary.kept_at = Some(dir.path.display().to_string());
    }
    Ok(Rendered::of(&summary))
}

async fn tour(
    ctx: &Context,
    url: &str,
    progress: &indicatif::ProgressBar,
    temporary: bool,
) -> Result<DemoSummary, CliError> {
    let stores = ctx.backend.stores();
    let wallet = WalletId::new(WALLET)?;
    let token_type = TokenType::new(TOKEN_TYPE)?;
    let queue = QueueName::new(QUEUE)?;
    let precision = ctx.config.precision_bits()?;

    // 0. The tour needs a database without demo data.
    let existing = stores.tokens.balance(&wallet, &token_type).await?;
    if !existing.is_zero() {
        return Err(CliError::NotFresh {
            url: ctx.backend.shown_url().to_owned(),
            found: format!("wallet {WALLET} holds {existing} {TOKEN_TYPE}"),
        });
    }
    if stores.queues.load_queue(&queue).await?.is_some() {
        return Err(CliError::NotFresh {
            url: ctx.backend.shown_url().to_owned(),
            found: format!("queue {QUEUE} exists"),
        });
    }

    // 1. Fund.
    progress.set_message("funding the wallet");
    let funding_tx = TxId::new("demo-funding")?;
    let each = Quantity::new(TOKEN_AMOUNT, precision)?;
    let tokens = super::tokens::new_tokens(&wallet, &token_type, each, &funding_tx, 0, TOKENS)?;
    stores.tokens.add_tokens(&tokens).await?;
    let funded = stores.tokens.balance(&wallet, &token_type).await?;

    // 2. 32 concurrent selects across 3 replicas.
    progress.set_message("opening replicas");
    let options = ctx.config.backend_options();
    let mut replicas = vec![ctx.backend.clone()];
    for _ in 1..REPLICAS {
        replicas.push(Backend::open(url, &options).await?);
    }
    let selection = {
        let mut s = ctx.config.selection_config();
        s.retry_interval = s.retry_interval.min(MAX_DEMO_BACKOFF);
        s
    };
    let mut selectors = Vec::with_capacity(REPLICAS);
    for (i, replica) in replicas.iter().enumerate() {
        let seed = ctx
            .config
            .seed
            .map(|s| s.wrapping_add(u64::try_from(i).unwrap_or(0)));
        selectors.push(Arc::new(
            TokenSelector::new(
                replica.stores(),
                Arc::new(SystemClock),
                selection.clone(),
                seed,
            )?
            .with_lease(ctx.config.lease_config().lease_expiry),
        ));
    }
    progress.finish_and_clear();
    let bar = indicatif::ProgressBar::new(u64::try_from(SELECTS).unwrap_or(u64::MAX));
    bar.set_message("concurrent selects");
    let amount = Quantity::new(SELECT_AMOUNT, precision)?;
    let select_started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..SELECTS {
        let selector = Arc::clone(&selectors[i % REPLICAS]);
        let (wallet, token_type, bar) = (wallet.clone(), token_type.clone(), bar.clone());
        let tx = TxId::new(format!("demo-tx-{i:02}"))?;
        tasks.spawn(async move {
            let report = selector
                .select_with_stats(&wallet, &token_type, amount, &tx)
                .await;
            bar.inc(1);
            (tx, report)
        });
    }
    let mut outcomes = Vec::with_capacity(SELECTS);
    while let Some(joined) = tasks.join_next().await {
        outcomes.push(joined.map_err(|e| step_failed("select", e))?);
    }
    bar.finish_and_clear();
    let select_elapsed = select_started.elapsed();
    outcomes.sort_by(|a, b| a.0.cmp(&b.0));
    let mut stats = holdfast::domain::SelectionStats::default();
    let (mut locked, mut funds_locked, mut insufficient, mut errors) = (Vec::new(), 0, 0, 0);
    let mut claimed = std::collections::BTreeSet::new();
    let mut double_claims = false;
    for (tx, report) in &outcomes {
        add_stats(&mut stats, &report.stats);
        match &report.result {
            Ok(selected) => {
                for token in &selected.tokens {
                    double_claims |= !claimed.insert(token.clone());
                }
                locked.push(tx.clone());
            }
            Err(SelectError::FundsLocked) => funds_locked += 1,
            Err(SelectError::InsufficientFunds { .. }) => insufficient += 1,
            Err(_) => errors += 1,
        }
    }
    if double_claims {
        return Err(step_failed("select", "a token was locked by two selects"));
    }

    // 3. Locks, settlement, locks gone.
    progress.reset();
    progress.enable_steady_tick(Duration::from_millis(120));
    progress.set_message("settling");
    let locks_before = stores.locks.list_locks().await?.len();
    let settlement = Settlement::new(
        stores.clone(),
        Arc::new(SystemClock),
        ctx.config.persist_policy(),
    );
    let payee = WalletId::new(PAYEE)?;
    let (mut confirmed, mut deleted, mut spent, mut released) = (0, 0, 0, 0);
    for (i, tx) in locked.iter().enumerate() {
        let status = if i % 2 == 0 {
            SettleStatus::Confirmed
        } else {
            SettleStatus::Deleted
        };
        if status == SettleStatus::Confirmed {
            // The payment to the payee and the change back commit with the spend.
            let payment = [Output {
                wallet: payee.clone(),
                token_type: token_type.clone(),
                quantity: Quantity::new(SELECT_AMOUNT, Precision::MAX)?,
            }];
            let done = settlement.confirm(tx, &payment, Some(&wallet)).await?;
            confirmed += 1;
            spent += done.spent.len();
            continue;
        }
        let settled = settlement.on_status(tx, status.status()).await?;
        let view = SettleView::new(status, &settled);
        deleted += 1;
        spent += view.spent.len();
        released += view.released;
    }
    let locks_after = stores.locks.list_locks().await?.len();
    let balance_after = stores.tokens.balance(&wallet, &token_type).await?;
    let paid = stores.tokens.balance(&payee, &token_type).await?;

    // 4. Admission through a crash and a redelivery.
    progress.set_message("admitting builds");
    let admission = admission_tour(ctx, &queue).await?;
    for replica in replicas.iter().skip(1) {
        replica.close().await;
    }

    Ok(DemoSummary {
        database: DatabaseSummary {
            backend: ctx.backend.kind().as_str(),
            url: ctx.backend.shown_url().to_owned(),
            temporary,
            replicas: REPLICAS,
        },
        funding: FundingSummary {
            wallet: WALLET.to_owned(),
            token_type: TOKEN_TYPE.to_owned(),
            tokens: TOKENS,
            amount_each: output::amount(each),
            balance: output::amount(funded),
        },
        selects: SelectsSummary {
            concurrent: SELECTS,
            amount_each: output::amount(amount),
            locked: locked.len(),
            funds_locked,
            insufficient_funds: insufficient,
            errors,
            tokens_locked: claimed.len(),
            double_claims,
            stats: SelectStats::from(&stats),
            elapsed_ms: output::millis(select_elapsed),
        },
        settlement: SettlementSummary {
            locks_before,
            confirmed,
            deleted,
            tokens_spent: spent,
            locks_released: released,
            locks_after,
            balance_after: output::amount(balance_after),
            paid: output::amount(paid),
        },
        admission,
        elapsed_ms: 0,
        kept_at: None,
    })
}

fn add_stats(total: &mut holdfast::domain::SelectionStats, s: &holdfast::domain::SelectionStats) {
    total.immediate_retries += s.immediate_retries;
    total.lock_attempts += s.lock_attempts;
    total.conflicts += s.conflicts;
    total.stale += s.stale;
    total.store_errors += s.store_errors;
    total.distinct_tokens_attempted += s.distinct_tokens_attempted;
    total.legs += s.legs;
    total.fetches += s.fetches;
    total.claims += s.claims;
    total.balance_checks += s.balance_checks;
    total.releases += s.releases;
    total.blacklist_clears += s.blacklist_clears;
}

async fn admission_tour(ctx: &Context, queue: &QueueName) -> Result<AdmissionSummary, CliError> {
    let stores = ctx.backend.stores();
    // The tour shows a held request, so the demo queue has one slot whatever the
    // configured default is.
    let mut policy = AdmissionPolicy::from_config(&ctx.config);
    let gate = AdmissionConfig {
        max_concurrent: 1,
        ..policy.for_queue(queue)
    };
    policy.queues.insert(queue.clone(), gate);
    let healthy = Admission::new(stores.queues.clone(), Arc::new(NoAncestry), policy.clone());
    let mut steps = Vec::new();

    let ingested = healthy.ingest(queue, &RevisionUri::new("rev-1")?).await?;
    let first = ingested.request.id;
    steps.push(observe(ctx, "ingest rev-1", &first, Some(ingested.reply)).await?);

    let crashing = Admission::new(
        Arc::new(CrashingQueues::new(
            stores.queues.clone(),
            CrashAfterClaim {
                request: first.clone(),
                crashed: AtomicBool::new(false),
            },
        )),
        Arc::new(NoAncestry),
        policy,
    );
    match crashing.process(&first).await {
        Err(_) => {}
        Ok(reply) => {
            return Err(step_failed(
                "crash",
                format!(
                    "the process step finished ({}) instead of crashing after the claim",
                    ReplyView::from(&reply).describe()
                ),
            ));
        }
    }
    let crashed = observe(ctx, "process (crashes after the claim write)", &first, None).await?;
    if !crashed.owners.contains(&first.to_string()) {
        return Err(step_failed("crash", "the claim did not survive the crash"));
    }
    steps.push(crashed);

    let resumed = healthy.process(&first).await?;
    expect_publish("redeliver", &resumed)?;
    steps.push(observe(ctx, "redeliver: process resumes", &first, Some(resumed)).await?);

    let ingested = healthy.ingest(queue, &RevisionUri::new("rev-2")?).await?;
    let second = ingested.request.id;
    steps.push(observe(ctx, "ingest rev-2", &second, Some(ingested.reply)).await?);
    let held = healthy.process(&second).await?;
    if !matches!(held, Reply::Hold { .. }) {
        return Err(step_failed(
            "hold",
            format!("expected a hold, got {}", ReplyView::from(&held).describe()),
        ));
    }
    steps.push(observe(ctx, "process while the slot is taken", &second, Some(held)).await?);

    let done = healthy.outcome(&first, BuildOutcome::Succeeded).await?;
    steps.push(observe(ctx, "build outcome: succeeded", &first, Some(done)).await?);
    let admitted = healthy.process(&second).await?;
    expect_publish("admit", &admitted)?;
    steps.push(observe(ctx, "redeliver: process", &second, Some(admitted)).await?);
    let done = healthy.outcome(&second, BuildOutcome::Succeeded).await?;
    steps.push(observe(ctx, "build outcome: succeeded", &second, Some(done)).await?);

    let end = stores
        .queues
        .load_queue(queue)
        .await?
        .ok_or_else(|| step_failed("admission", "the demo queue disappeared"))?;
    Ok(AdmissionSummary {
        queue: queue.to_string(),
        max_concurrent: 1,
        steps,
        owners_after: end.owners.keys().map(ToString::to_string).collect(),
        last_green: end.last_green.map(|g| g.uri.to_string()),
    })
}

fn expect_publish(step: &'static str, reply: &Reply) -> Result<(), CliError> {
    if matches!(reply, Reply::Publish { .. }) {
        Ok(())
    } else {
        Err(step_failed(
            step,
            format!(
                "expected the build to be published, got {}",
                ReplyView::from(reply).describe()
            ),
        ))
    }
}

async fn observe(
    ctx: &Context,
    step: &str,
    id: &RequestId,
    reply: Option<Reply>,
) -> Result<AdmissionStep, CliError> {
    let queues = ctx.backend.stores().queues;
    let request = queues.load_request(id).await?;
    let queue = queues.load_queue(id.queue()).await?;
    let owners = queue
        .as_ref()
        .map(|q| q.owners.keys().map(ToString::to_string).collect())
        .unwrap_or_default();
    let slot = queue.as_ref().and_then(|q| q.owners.get(id));
    Ok(AdmissionStep {
        step: step.to_owned(),
        request: id.to_string(),
        reply: reply.as_ref().map(|r| ReplyView::of(r, slot)),
        state: request.as_ref().map(|r| RequestView::from(r).state),
        owners,
    })
}
