//! `holdfast soak`: select and settle in a loop against one wallet, as one replica
//! of a fleet would, until a count is reached or the process is killed. It runs
//! the start-up recovery pass and the lease sweeper like a real service, and can
//! write a history of every step (one line each, written whole) for a checker:
//! the kill test uses it to SIGKILL replicas at random and verify what survived.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Args;
use holdfast::domain::{
    Precision, Quantity, SettlementStatus, TokenType, TxId, TxStatus, WalletId,
};
use holdfast::ports::{LockStoreError, Output};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::output::{Rendered, Report};
use super::settle::settlement;
use super::{CliError, Context, select};
use holdfast::clock::SystemClock;
use holdfast::metrics::SelectOutcomeLabel;
use holdfast::selector::{SelectError, TokenSelector};
use holdfast::settlement::{Orphan, SettleError, Settlement};
use holdfast::sweeper::LeaseSweeper;

/// `soak`.
#[derive(Debug, Args)]
pub struct SoakArgs {
    /// The wallet to spend from
    #[arg(long, value_name = "ID")]
    pub wallet: WalletId,
    /// The token type
    #[arg(long = "type", value_name = "TYPE")]
    pub token_type: TokenType,
    /// This replica's name: its transactions are `<name>-<pid>-<n>`, and its owner
    /// id (unless `owner` is configured) `soak-<name>`
    #[arg(long, value_name = "NAME", default_value = "soak")]
    pub name: String,
    /// Amounts are drawn uniformly from 1..=MAX
    #[arg(long, value_name = "MAX", default_value_t = 100)]
    pub max_amount: u64,
    /// Percent of selected transactions settled as confirmed (the rest deleted)
    #[arg(long, value_name = "PERCENT", default_value_t = 70)]
    pub confirm_percent: u8,
    /// Stop after this many selects (0: run until killed)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub selects: u64,
    /// Where confirmed payments pay their amount (default: back to `--wallet`);
    /// the change goes back to `--wallet`, with the spend in one transaction
    #[arg(long, value_name = "WALLET")]
    pub pay_to: Option<WalletId>,
    /// Concurrent select loops in this replica (each selects, settles and mints in
    /// turn; they share the backend, as a service's requests do)
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub workers: u32,
    /// Append one line per step to this file (`selected TX AMOUNT TOKEN...`,
    /// `settling TX STATUS`, `settled TX STATUS`, `double-spend TX TOKEN BY`,
    /// `refused TX REASON` (a confirm whose outputs the store refused),
    /// `failed TX REASON`; a confirmed TX's outputs are `TX:0`, the payment, and
    /// `TX:1`, the change, if any)
    #[arg(long, value_name = "FILE")]
    pub history: Option<PathBuf>,
}

/// `soak` JSON: what the loop did.
#[derive(Debug, Default, Serialize)]
pub struct Soaked {
    /// Selects made.
    pub selects: u64,
    /// Of them, those that failed (insufficient funds, funds locked, store).
    pub failed: u64,
    /// Transactions settled as confirmed.
    pub confirmed: u64,
    /// Transactions settled as deleted.
    pub deleted: u64,
    /// Confirmed settlements refused as double spends.
    pub double_spends: u64,
    /// Confirms whose outputs the store refused (the selection it held is not
    /// what was selected: after a failover that lost the claim's commit).
    pub refused: u64,
    /// Store calls that failed transiently (the database unavailable or busy) and
    /// were retried.
    pub retried: u64,
}

impl Report for Soaked {
    fn human(&self) -> String {
        format!(
            "{} select(s), {} failed; {} confirmed, {} deleted, {} double spend(s), {} refused; {} transient fault(s) retried\n",
            self.selects,
            self.failed,
            self.confirmed,
            self.deleted,
            self.double_spends,
            self.refused,
            self.retried
        )
    }
}

/// The history file: each line is written with one `write` call on a file opened
/// for appending, so a killed process leaves at most its last line incomplete.
struct History(Option<std::fs::File>);

impl History {
    fn open(path: Option<&PathBuf>) -> Result<History, CliError> {
        let file = path
            .map(|p| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|source| CliError::Io {
                        action: "opening the soak history",
                        path: p.display().to_string(),
                        source,
                    })
            })
            .transpose()?;
        Ok(History(file))
    }

    fn line(&self, text: String) {
        if let Some(mut file) = self.0.as_ref() {
            if let Err(e) = file.write_all(format!("{text}\n").as_bytes()) {
                tracing::warn!(error = %e, "could not write the soak history");
            }
        }
    }
}

/// The first pause after a transient fault, doubling up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// Runs `call` until it succeeds or fails with an error `transient` refuses,
/// pausing with a doubling backoff after each transient failure (logged, counted
/// in `retried`). A replica outlives a restarting or overloaded database.
async fn until_done<T, E, F, Fut>(
    what: &str,
    retried: &AtomicU64,
    transient: impl Fn(&E) -> bool,
    mut call: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut pause = FIRST_PAUSE;
    loop {
        match call().await {
            Err(e) if transient(&e) => {
                retried.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, ?pause, "{what} failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
            other => return other,
        }
    }
}

/// Opens the database like every command does, but waits out a database that
/// cannot be opened for now (full, restarting, unreachable), retrying with a
/// backoff, logged: only a URL or option that can never work ends the replica.
/// Unless configured, the replica's owner id is `soak-<name>`: a replica
/// restarted under its name recovers its own orphans and no one else's.
pub async fn open(
    url: &str,
    mut config: holdfast::Config,
    name: &str,
) -> Result<Context, CliError> {
    if config.owner.is_empty() {
        config.owner = format!("soak-{name}");
    }
    let retried = AtomicU64::new(0);
    until_done(
        "opening the database",
        &retried,
        |e: &CliError| matches!(e, CliError::Open(open) if !open.is_bad_input()),
        || Context::open(url, config.clone()),
    )
    .await
}

/// Every settlement error but a double spend or refused outputs is the store
/// failing: retried (a settlement, and a confirm with the same outputs, is
/// idempotent).
fn settle_transient(e: &SettleError) -> bool {
    !matches!(
        e,
        SettleError::DoubleSpend { .. } | SettleError::Outputs { .. }
    )
}

/// Counters of the whole replica, shared by its workers.
#[derive(Default)]
struct Counters {
    selects: AtomicU64,
    failed: AtomicU64,
    confirmed: AtomicU64,
    deleted: AtomicU64,
    double_spends: AtomicU64,
    refused: AtomicU64,
    retried: AtomicU64,
}

/// What every worker shares.
struct Shared {
    args: SoakArgs,
    selector: TokenSelector,
    settlement: Settlement,
    precision: Precision,
    history: History,
    counters: Counters,
    /// The transaction numbers of this process, across workers.
    next: AtomicU64,
}

/// Runs `soak`.
pub async fn run(ctx: &Context, args: SoakArgs) -> Result<Rendered, CliError> {
    if args.max_amount == 0 || args.confirm_percent > 100 || args.workers == 0 {
        return Err(CliError::Argument {
            arg: "--max-amount / --confirm-percent / --workers",
            value: format!(
                "{} / {} / {}",
                args.max_amount, args.confirm_percent, args.workers
            ),
            expected: "a maximum of at least 1, a percent of 0 to 100 and at least 1 worker"
                .to_owned(),
        });
    }
    let history = History::open(args.history.as_ref())?;
    let settlement = settlement(ctx);
    let counters = Counters::default();
    // A restarted replica first finishes what its predecessors recorded, then
    // deletes what its own predecessor (same owner id) was doing when it died:
    // a soak's transactions exist nowhere else, so none of them is on a ledger.
    until_done("recovery", &counters.retried, settle_transient, || {
        settlement.recover()
    })
    .await?;
    until_done(
        "orphan recovery",
        &counters.retried,
        settle_transient,
        || {
            settlement.recover_orphans(|_| async {
                Orphan::Settle(SettlementStatus::Known(TxStatus::Deleted))
            })
        },
    )
    .await?;
    let sweeper = LeaseSweeper::spawn(
        ctx.backend.stores().locks,
        Arc::new(SystemClock),
        ctx.config.lease_config(),
    )
    .map_err(|e| CliError::Argument {
        arg: "lease",
        value: format!("{:?}", ctx.config.lease_config()),
        expected: e.to_string(),
    })?;
    let shared = Arc::new(Shared {
        selector: select::selector(ctx)?,
        settlement,
        precision: ctx.config.precision_bits()?,
        history,
        counters,
        next: AtomicU64::new(0),
        args,
    });
    let seed = ctx.config.seed;
    let workers: Vec<_> = (0..shared.args.workers)
        .map(|worker| {
            let rng = match seed {
                Some(seed) => StdRng::seed_from_u64(seed.wrapping_add(u64::from(worker))),
                None => StdRng::from_os_rng(),
            };
            tokio::spawn(work(shared.clone(), rng))
        })
        .collect();
    let mut outcome = Ok(());
    for worker in workers {
        match worker.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => outcome = Err(e),
            Err(e) => {
                outcome = Err(CliError::Argument {
                    arg: "soak worker",
                    value: e.to_string(),
                    expected: "a worker that does not panic".to_owned(),
                })
            }
        }
    }
    sweeper.shutdown().await;
    outcome?;
    let c = &shared.counters;
    let report = Soaked {
        selects: c.selects.load(Ordering::Relaxed),
        failed: c.failed.load(Ordering::Relaxed),
        confirmed: c.confirmed.load(Ordering::Relaxed),
        deleted: c.deleted.load(Ordering::Relaxed),
        double_spends: c.double_spends.load(Ordering::Relaxed),
        refused: c.refused.load(Ordering::Relaxed),
        retried: c.retried.load(Ordering::Relaxed),
    };
    Ok(Rendered::of(&report))
}

/// One worker's loop: select, then confirm (paying and returning the change) or
/// delete, until the replica's count
/// of selects is reached.
async fn work(shared: Arc<Shared>, mut rng: StdRng) -> Result<(), CliError> {
    let (args, c, history) = (&shared.args, &shared.counters, &shared.history);
    let pid = std::process::id();
    loop {
        let n = shared.next.fetch_add(1, Ordering::Relaxed) + 1;
        if args.selects != 0 && n > args.selects {
            return Ok(());
        }
        let tx = TxId::new(format!("{}-{pid}-{n}", args.name))?;
        let amount = Quantity::new(
            u128::from(rng.random_range(1..=args.max_amount)),
            shared.precision,
        )?;
        c.selects.fetch_add(1, Ordering::Relaxed);
        let selected = match shared
            .selector
            .select(&args.wallet, &args.token_type, amount, &tx)
            .await
        {
            Ok(selected) => selected,
            Err(e) => {
                c.failed.fetch_add(1, Ordering::Relaxed);
                history.line(format!(
                    "failed {tx} {}",
                    SelectOutcomeLabel::from(&e).as_str()
                ));
                if matches!(e, SelectError::Store(_)) {
                    tracing::warn!(error = %e, %tx, "select failed on the store");
                }
                // A drained or locked wallet, or a failing store: pause instead of
                // spinning.
                tokio::time::sleep(FIRST_PAUSE).await;
                continue;
            }
        };
        let tokens: Vec<String> = selected.tokens.iter().map(ToString::to_string).collect();
        history.line(format!("selected {tx} {amount} {}", tokens.join(" ")));
        let confirm = rng.random_range(0..100u8) < args.confirm_percent;
        let status = if confirm {
            TxStatus::Confirmed
        } else {
            TxStatus::Deleted
        };
        history.line(format!("settling {tx} {status}"));
        // A confirmed payment pays the amount to the recipient and the change back
        // to the wallet: its outputs commit with the spend and the status.
        let payment = [Output {
            wallet: args.pay_to.clone().unwrap_or_else(|| args.wallet.clone()),
            token_type: args.token_type.clone(),
            quantity: amount,
        }];
        let settled = if confirm {
            until_done("confirming", &c.retried, settle_transient, || {
                shared.settlement.confirm(&tx, &payment, Some(&args.wallet))
            })
            .await
            .map(|_| ())
        } else {
            until_done("settlement", &c.retried, settle_transient, || {
                shared
                    .settlement
                    .on_status(&tx, SettlementStatus::Known(status))
            })
            .await
            .map(|_| ())
        };
        match settled {
            Ok(()) => history.line(format!("settled {tx} {status}")),
            Err(SettleError::DoubleSpend {
                token, spent_by, ..
            }) => {
                c.double_spends.fetch_add(1, Ordering::Relaxed);
                history.line(format!("double-spend {tx} {token} {spent_by}"));
                continue;
            }
            // What the store holds of the selection is not what was selected (a
            // failover lost the commit of a claim): nothing was settled; its locks,
            // if any, go with the lease. A service would raise it; a replica goes on.
            Err(SettleError::Outputs { source, .. }) => {
                c.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %source, %tx, "the confirm was refused");
                let reason = match source {
                    LockStoreError::NotConserved(_) => "not-conserved",
                    LockStoreError::OutputsDiffer { .. } => "outputs-differ",
                    _ => "bad-outputs",
                };
                history.line(format!("refused {tx} {reason}"));
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        if confirm {
            c.confirmed.fetch_add(1, Ordering::Relaxed);
        } else {
            c.deleted.fetch_add(1, Ordering::Relaxed);
        }
    }
}
