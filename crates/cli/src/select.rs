//! `holdfast select`: one call of the token selector service.

use std::sync::Arc;

use clap::Args;
use holdfast::domain::{Quantity, SelectionStats, TokenType, TxId, WalletId};
use serde::Serialize;

use super::output::{self, Rendered, Report};
use super::{CliError, Context};
use holdfast::clock::SystemClock;
use holdfast::selector::{SelectReport, TokenSelector};

/// `select`.
#[derive(Debug, Args)]
pub struct SelectArgs {
    /// The wallet to spend from
    #[arg(long, value_name = "W")]
    pub wallet: WalletId,
    /// The token type
    #[arg(long = "type", value_name = "T")]
    pub token_type: TokenType,
    /// The amount to cover: decimal or 0x-hex, more than zero
    #[arg(long, value_name = "A", allow_hyphen_values = true)]
    pub amount: String,
    /// The consumer transaction the tokens are locked for
    #[arg(long, value_name = "ID")]
    pub tx: TxId,
}

/// The selector a command (or the demo) uses on `ctx`'s backend.
pub fn selector(ctx: &Context) -> Result<TokenSelector, CliError> {
    TokenSelector::new(
        ctx.backend.stores(),
        Arc::new(SystemClock),
        ctx.config.selection_config(),
        ctx.config.seed,
    )
    .map(|selector| selector.with_lease(ctx.config.lease_config().lease_expiry))
    .map_err(CliError::from)
}

/// What one select measured, in JSON.
#[derive(Debug, Serialize)]
pub struct SelectStats {
    /// Legs run (the first included).
    pub legs: u64,
    /// Tokens named in claims.
    pub lock_attempts: u64,
    /// Claims lost to another transaction.
    pub conflicts: u64,
    /// Candidates found no longer spendable.
    pub stale: u64,
    /// Store errors seen (and retried).
    pub store_errors: u64,
    /// Store round trips.
    pub round_trips: u64,
}

impl From<&SelectionStats> for SelectStats {
    fn from(s: &SelectionStats) -> Self {
        SelectStats {
            legs: s.legs,
            lock_attempts: s.lock_attempts,
            conflicts: s.conflicts,
            stale: s.stale,
            store_errors: s.store_errors,
            round_trips: s.round_trips(),
        }
    }
}

/// `select` JSON: `{"tx", "wallet", "type", "amount", "tokens": ["tx:0", ...],
/// "total", "change", "seed", "stats": {...}}`; amounts are decimal strings.
#[derive(Debug, Serialize)]
pub struct Selection {
    /// The consumer transaction.
    pub tx: String,
    /// The wallet.
    pub wallet: String,
    /// The token type.
    #[serde(rename = "type")]
    pub token_type: String,
    /// The requested amount.
    pub amount: String,
    /// The locked tokens, in the order they were won.
    pub tokens: Vec<String>,
    /// Their total.
    pub total: String,
    /// `total - amount`.
    pub change: String,
    /// The call's RNG seed (replays it with the same store state).
    pub seed: u64,
    /// What the call measured.
    pub stats: SelectStats,
}

impl Report for Selection {
    fn human(&self) -> String {
        format!(
            "locked {} token(s) totalling {} {} for tx {} (amount {}, change {}): {}\n",
            self.tokens.len(),
            self.total,
            self.token_type,
            self.tx,
            self.amount,
            self.change,
            output::short_list(&self.tokens, 10)
        )
    }
}

/// Runs `select`.
pub async fn run(ctx: &Context, args: SelectArgs) -> Result<Rendered, CliError> {
    let amount = Quantity::parse(&args.amount, ctx.config.precision_bits()?)?;
    let selector = selector(ctx)?;
    let report: SelectReport = selector
        .select_with_stats(&args.wallet, &args.token_type, amount, &args.tx)
        .await;
    let selected = report.result?;
    Ok(Rendered::of(&Selection {
        tx: args.tx.to_string(),
        wallet: args.wallet.to_string(),
        token_type: args.token_type.to_string(),
        amount: output::amount(amount),
        tokens: selected.tokens.iter().map(ToString::to_string).collect(),
        total: output::amount(selected.total),
        change: output::amount(selected.change),
        seed: report.seed,
        stats: SelectStats::from(&report.stats),
    }))
}
