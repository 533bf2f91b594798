//! `holdfast settle`: one call of the settlement service.

use std::sync::Arc;

use clap::{Args, ValueEnum};
use holdfast_domain::{LockAction, SettlementStatus, TxId, TxStatus};
use serde::Serialize;

use super::output::{Rendered, Report};
use super::{CliError, Context};
use holdfast::clock::SystemClock;
use holdfast::settlement::{Settled, Settlement};

/// The statuses `settle` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SettleStatus {
    /// Final and valid: the tokens the tx holds are marked spent by it and unlocked
    Confirmed,
    /// Final and invalid: the tx's locks are released without spending
    Deleted,
    /// The network is busy: nothing changes
    Busy,
    /// The network does not know: nothing changes
    Unknown,
}

impl SettleStatus {
    /// The settlement status this names.
    pub fn status(self) -> SettlementStatus {
        SettlementStatus::Known(match self {
            SettleStatus::Confirmed => TxStatus::Confirmed,
            SettleStatus::Deleted => TxStatus::Deleted,
            SettleStatus::Busy => TxStatus::Busy,
            SettleStatus::Unknown => TxStatus::Unknown,
        })
    }
}

/// `settle`.
#[derive(Debug, Args)]
pub struct SettleArgs {
    /// The consumer transaction
    #[arg(long, value_name = "ID")]
    pub tx: TxId,
    /// Its settlement status
    #[arg(long, value_enum, value_name = "STATUS")]
    pub status: SettleStatus,
}

/// The settlement service a command (or the demo) uses on `ctx`'s backend.
pub fn settlement(ctx: &Context) -> Settlement {
    Settlement::new(
        ctx.backend.stores(),
        Arc::new(SystemClock),
        ctx.config.persist_policy(),
    )
}

/// `settle` JSON: `{"tx", "status", "recorded": "confirmed" | null,
/// "action": "release_all" | "keep", "released": N, "spent": ["tx:0", ...]}`.
#[derive(Debug, Serialize)]
pub struct SettleView {
    /// The transaction.
    pub tx: String,
    /// The status reported.
    pub status: &'static str,
    /// The status recorded (busy and unknown record nothing).
    pub recorded: Option<&'static str>,
    /// `release_all` or `keep`.
    pub action: &'static str,
    /// Locks released without spending.
    pub released: u64,
    /// Tokens marked spent by the tx.
    pub spent: Vec<String>,
}

impl SettleView {
    /// The view of what the settlement service did for `status`.
    pub fn new(status: SettleStatus, settled: &Settled) -> SettleView {
        SettleView {
            tx: settled.tx.to_string(),
            status: match status {
                SettleStatus::Confirmed => "confirmed",
                SettleStatus::Deleted => "deleted",
                SettleStatus::Busy => "busy",
                SettleStatus::Unknown => "unknown",
            },
            recorded: settled.recorded.map(TxStatus::as_str),
            action: match settled.action {
                LockAction::ReleaseAll => "release_all",
                LockAction::Keep => "keep",
            },
            released: settled.released,
            spent: settled.spent.iter().map(ToString::to_string).collect(),
        }
    }
}

impl Report for SettleView {
    fn human(&self) -> String {
        match self.action {
            "release_all" if !self.spent.is_empty() => format!(
                "tx {} {}: {} token(s) spent and unlocked: {}\n",
                self.tx,
                self.status,
                self.spent.len(),
                super::output::short_list(&self.spent, 10)
            ),
            "release_all" => format!(
                "tx {} {}: {} lock(s) released\n",
                self.tx, self.status, self.released
            ),
            _ => format!("tx {} {}: nothing changes\n", self.tx, self.status),
        }
    }
}

/// Runs `settle`.
pub async fn run(ctx: &Context, args: SettleArgs) -> Result<Rendered, CliError> {
    let settled = settlement(ctx)
        .on_status(&args.tx, args.status.status())
        .await?;
    Ok(Rendered::of(&SettleView::new(args.status, &settled)))
}
