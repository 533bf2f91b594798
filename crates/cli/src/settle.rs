//! `holdfast settle`: one call of the settlement service.

use std::sync::Arc;

use clap::{Args, ValueEnum};
use holdfast::domain::{
    LockAction, Precision, Quantity, SettlementStatus, TokenType, TxId, TxStatus, WalletId,
};
use holdfast::ports::Output;
use serde::Serialize;

use super::output::{Rendered, Report};
use super::{CliError, Context};
use holdfast::clock::SystemClock;
use holdfast::settlement::{Confirmed, Settled, Settlement};

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
    /// With `confirmed`: an output of the transaction, `WALLET:AMOUNT` (repeat for
    /// several; ids `TX:0`, `TX:1`, ... in order). Spent inputs and outputs commit
    /// together, and must conserve the inputs per type
    #[arg(long = "output", value_name = "WALLET:AMOUNT")]
    pub outputs: Vec<String>,
    /// With `confirmed`: pay what the inputs hold beyond the outputs to this wallet
    /// (the change), as the last output
    #[arg(long, value_name = "WALLET")]
    pub change_to: Option<WalletId>,
    /// The token type of the outputs (default: the type of the transaction's
    /// selected tokens, when they are all of one type)
    #[arg(long = "type", value_name = "TYPE")]
    pub token_type: Option<TokenType>,
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

/// `settle --output` JSON: `{"tx", "status": "confirmed", "spent": ["tx:0", ...],
/// "outputs": [{"id", "wallet", "type", "amount"}, ...], "replayed": bool}`.
#[derive(Debug, Serialize)]
pub struct ConfirmView {
    /// The transaction.
    pub tx: String,
    /// Always `confirmed`.
    pub status: &'static str,
    /// Inputs spent now.
    pub spent: Vec<String>,
    /// The outputs added.
    pub outputs: Vec<OutputView>,
    /// Already confirmed with these outputs: nothing changed.
    pub replayed: bool,
}

/// One output in [`ConfirmView`].
#[derive(Debug, Serialize)]
pub struct OutputView {
    /// `tx:index`.
    pub id: String,
    /// The wallet paid.
    pub wallet: String,
    /// The token type.
    #[serde(rename = "type")]
    pub token_type: String,
    /// The amount, decimal.
    pub amount: String,
}

impl ConfirmView {
    /// The view of a confirm.
    pub fn new(done: &Confirmed) -> ConfirmView {
        ConfirmView {
            tx: done.tx.to_string(),
            status: "confirmed",
            spent: done.spent.iter().map(ToString::to_string).collect(),
            outputs: done
                .outputs
                .iter()
                .map(|(id, o)| OutputView {
                    id: id.to_string(),
                    wallet: o.wallet.to_string(),
                    token_type: o.token_type.to_string(),
                    amount: o.quantity.to_string(),
                })
                .collect(),
            replayed: done.replayed,
        }
    }
}

impl Report for ConfirmView {
    fn human(&self) -> String {
        let outputs: Vec<String> = self
            .outputs
            .iter()
            .map(|o| format!("{} {} to {}", o.amount, o.token_type, o.wallet))
            .collect();
        if self.replayed {
            return format!(
                "tx {} was already confirmed with these outputs: nothing changes\n",
                self.tx
            );
        }
        format!(
            "tx {} confirmed: {} token(s) spent; paid {}\n",
            self.tx,
            self.spent.len(),
            super::output::short_list(&outputs, 10)
        )
    }
}

/// Parses `WALLET:AMOUNT` (the amount after the last `:`).
fn parse_output(
    text: &str,
    token_type: &TokenType,
    precision: Precision,
) -> Result<Output, CliError> {
    let bad = |expected: String| CliError::Argument {
        arg: "--output",
        value: text.to_owned(),
        expected,
    };
    let (wallet, amount) = text
        .rsplit_once(':')
        .ok_or_else(|| bad("WALLET:AMOUNT, for example alice:150".to_owned()))?;
    Ok(Output {
        wallet: WalletId::new(wallet).map_err(|e| bad(format!("a valid wallet ({e})")))?,
        token_type: token_type.clone(),
        quantity: Quantity::parse(amount, precision)?,
    })
}

/// Runs `settle`.
pub async fn run(ctx: &Context, args: SettleArgs) -> Result<Rendered, CliError> {
    if args.outputs.is_empty() && args.change_to.is_none() {
        let settled = settlement(ctx)
            .on_status(&args.tx, args.status.status())
            .await?;
        return Ok(Rendered::of(&SettleView::new(args.status, &settled)));
    }
    if args.status != SettleStatus::Confirmed {
        return Err(CliError::Argument {
            arg: "--output / --change-to",
            value: format!("--status {:?}", args.status).to_lowercase(),
            expected: "--status confirmed: only a confirmed transaction has outputs".to_owned(),
        });
    }
    let token_type = match args.token_type {
        Some(t) => t,
        None => {
            let selected = ctx.backend.stores().locks.selected(&args.tx).await?;
            let mut types: Vec<&TokenType> = selected.iter().map(|t| &t.token_type).collect();
            types.sort();
            types.dedup();
            match types.as_slice() {
                [one] => (*one).clone(),
                _ => {
                    return Err(CliError::Argument {
                        arg: "--type",
                        value: format!(
                            "{} type(s) among the tokens {} selected",
                            types.len(),
                            args.tx
                        ),
                        expected:
                            "--type TYPE, since the selected tokens do not name exactly one type"
                                .to_owned(),
                    });
                }
            }
        }
    };
    let precision = ctx.config.precision_bits()?;
    let outputs = args
        .outputs
        .iter()
        .map(|text| parse_output(text, &token_type, precision))
        .collect::<Result<Vec<_>, _>>()?;
    let done = settlement(ctx)
        .confirm(&args.tx, &outputs, args.change_to.as_ref())
        .await?;
    Ok(Rendered::of(&ConfirmView::new(&done)))
}
