//! `holdfast soak`: select and settle in a loop against one wallet, as one replica
//! of a fleet would, until a count is reached or the process is killed. It runs
//! the start-up recovery pass and the lease sweeper like a real service, and can
//! write a history of every step (one line each, written whole) for a checker:
//! the kill test uses it to SIGKILL replicas at random and verify what survived.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use holdfast_domain::{Quantity, SettlementStatus, TokenId, TokenType, TxId, TxStatus, WalletId};
use holdfast_ports::NewToken;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::output::{Rendered, Report};
use super::settle::settlement;
use super::{CliError, Context, select};
use holdfast::clock::SystemClock;
use holdfast::settlement::SettleError;
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
    /// This replica's name: its transactions are `<name>-<pid>-<n>`
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
    /// Append one line per step to this file (`selected TX AMOUNT TOKEN...`,
    /// `settling TX STATUS`, `settled TX STATUS`, `double-spend TX TOKEN BY`,
    /// `minted TOKEN AMOUNT`, `failed TX REASON`)
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
}

impl Report for Soaked {
    fn human(&self) -> String {
        format!(
            "{} select(s), {} failed; {} confirmed, {} deleted, {} double spend(s)\n",
            self.selects, self.failed, self.confirmed, self.deleted, self.double_spends
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

    fn line(&mut self, text: String) {
        if let Some(file) = &mut self.0 {
            if let Err(e) = file.write_all(format!("{text}\n").as_bytes()) {
                tracing::warn!(error = %e, "could not write the soak history");
            }
        }
    }
}

/// Runs `soak`.
pub async fn run(ctx: &Context, args: SoakArgs) -> Result<Rendered, CliError> {
    if args.max_amount == 0 || args.confirm_percent > 100 {
        return Err(CliError::Argument {
            arg: "--max-amount / --confirm-percent",
            value: format!("{} / {}", args.max_amount, args.confirm_percent),
            expected: "a maximum of at least 1 and a percent of 0 to 100".to_owned(),
        });
    }
    let mut history = History::open(args.history.as_ref())?;
    let settlement = settlement(ctx);
    // A restarted replica first finishes what its predecessors recorded.
    settlement.recover().await?;
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
    let selector = select::selector(ctx)?;
    let precision = ctx.config.precision_bits()?;
    let mut rng = match ctx.config.seed {
        Some(seed) => StdRng::seed_from_u64(seed),
        None => StdRng::from_os_rng(),
    };
    let mut report = Soaked::default();
    let pid = std::process::id();
    let mut n = 0u64;
    while args.selects == 0 || n < args.selects {
        n += 1;
        let tx = TxId::new(format!("{}-{pid}-{n}", args.name))?;
        let amount = Quantity::new(u128::from(rng.random_range(1..=args.max_amount)), precision)?;
        report.selects += 1;
        let selected = match selector
            .select(&args.wallet, &args.token_type, amount, &tx)
            .await
        {
            Ok(selected) => selected,
            Err(e) => {
                report.failed += 1;
                history.line(format!("failed {tx} {}", e.outcome_label().as_str()));
                // A drained or locked wallet: pause instead of spinning.
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
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
        match settlement
            .on_status(&tx, SettlementStatus::Known(status))
            .await
        {
            Ok(_) => history.line(format!("settled {tx} {status}")),
            Err(SettleError::DoubleSpend {
                token, spent_by, ..
            }) => {
                report.double_spends += 1;
                history.line(format!("double-spend {tx} {token} {spent_by}"));
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        if !confirm {
            report.deleted += 1;
            continue;
        }
        report.confirmed += 1;
        // The change comes back as a new token of the same wallet, as a payment
        // service would mint it once its transaction is on the ledger.
        if !selected.change.is_zero() {
            let change = NewToken {
                id: TokenId::new(tx.clone(), 0),
                wallet: args.wallet.clone(),
                token_type: args.token_type.clone(),
                quantity: selected.change,
                spendable: true,
            };
            ctx.backend.stores().tokens.add_tokens(&[change]).await?;
            history.line(format!("minted {tx}:0 {}", selected.change));
        }
    }
    sweeper.shutdown().await;
    Ok(Rendered::of(&report))
}
