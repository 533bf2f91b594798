//! `holdfast tokens add | list | balance`: funding wallets and looking at them.

use clap::{Args, Subcommand};
use holdfast::domain::{Quantity, Token, TokenId, TokenType, TxId, WalletId};
use holdfast::ports::NewToken;
use serde::Serialize;

use super::output::{self, Rendered, Report, Table};
use super::{CliError, Context};

/// Tokens one `add_tokens` call writes; larger `--count`s are written in batches
/// (adding is idempotent, so re-running a partly applied command is safe).
pub const ADD_BATCH: usize = 500;

/// The most tokens one `tokens add` may create.
pub const MAX_COUNT: u32 = 1_000_000;

/// The default and largest `tokens list --limit`.
pub const DEFAULT_LIST_LIMIT: usize = 1000;

/// Token subcommands.
#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Add tokens of one amount to a wallet (idempotent for identical tokens)
    Add(AddArgs),
    /// List the unspent tokens of a wallet, smallest first
    List(ListArgs),
    /// The spendable, unspent balance of a wallet (locks ignored)
    Balance(BalanceArgs),
}

/// `tokens add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    /// The wallet to fund
    #[arg(long, value_name = "W")]
    pub wallet: WalletId,
    /// The token type (denomination), e.g. CHF
    #[arg(long = "type", value_name = "T")]
    pub token_type: TokenType,
    /// The amount of each token: decimal or 0x-hex
    #[arg(long, value_name = "A", allow_hyphen_values = true)]
    pub amount: String,
    /// The creating transaction id [default: a fresh unique id]
    #[arg(long, value_name = "ID")]
    pub tx: Option<TxId>,
    /// The output index of the first token (needs --tx)
    #[arg(long, value_name = "N", requires = "tx", default_value_t = 0)]
    pub index: u32,
    /// How many tokens to add, at consecutive output indexes
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub count: u32,
}

/// `tokens list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// The wallet
    #[arg(long, value_name = "W")]
    pub wallet: WalletId,
    /// Only tokens of this type
    #[arg(long = "type", value_name = "T")]
    pub token_type: Option<TokenType>,
    /// At most this many tokens
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LIST_LIMIT)]
    pub limit: usize,
}

/// `tokens balance`.
#[derive(Debug, Args)]
pub struct BalanceArgs {
    /// The wallet
    #[arg(long, value_name = "W")]
    pub wallet: WalletId,
    /// The token type
    #[arg(long = "type", value_name = "T")]
    pub token_type: TokenType,
}

/// Runs a token subcommand.
pub async fn run(ctx: &Context, cmd: TokensCommand) -> Result<Rendered, CliError> {
    match cmd {
        TokensCommand::Add(args) => add(ctx, args).await.map(|r| Rendered::of(&r)),
        TokensCommand::List(args) => list(ctx, args).await.map(|r| Rendered::of(&r)),
        TokensCommand::Balance(args) => balance(ctx, args).await.map(|r| Rendered::of(&r)),
    }
}

/// A fresh transaction id for minted tokens: `mint-<millis>-<nonce>`, unique across
/// processes and calls (the nonce hashes the process id, a per-process counter and
/// the time with std's randomly keyed hasher).
pub fn fresh_tx_id() -> Result<TxId, CliError> {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(now.as_nanos());
    let nonce = hasher.finish();
    Ok(TxId::new(format!(
        "mint-{:x}-{nonce:016x}",
        now.as_millis()
    ))?)
}

/// The tokens `tokens add` describes, validated.
pub fn new_tokens(
    wallet: &WalletId,
    token_type: &TokenType,
    quantity: Quantity,
    tx: &TxId,
    first_index: u32,
    count: u32,
) -> Result<Vec<NewToken>, CliError> {
    if count == 0 || count > MAX_COUNT {
        return Err(CliError::Argument {
            arg: "--count",
            value: count.to_string(),
            expected: format!("expected 1 to {MAX_COUNT}"),
        });
    }
    if first_index.checked_add(count - 1).is_none() {
        return Err(CliError::Argument {
            arg: "--index",
            value: first_index.to_string(),
            expected: format!(
                "--index + --count - 1 must fit 32 bits; expected at most {}",
                u32::MAX - (count - 1)
            ),
        });
    }
    Ok((0..count)
        .map(|offset| NewToken {
            id: TokenId::new(tx.clone(), first_index + offset),
            wallet: wallet.clone(),
            token_type: token_type.clone(),
            quantity,
            spendable: true,
        })
        .collect())
}

/// `tokens add` JSON: `{"tx", "wallet", "type", "amount", "count", "added", "tokens": ["tx:0", ...]}`.
#[derive(Debug, Serialize)]
pub struct Added {
    /// The creating transaction.
    pub tx: String,
    /// The wallet.
    pub wallet: String,
    /// The token type.
    #[serde(rename = "type")]
    pub token_type: String,
    /// The amount of each token (decimal).
    pub amount: String,
    /// Tokens named by the command.
    pub count: u32,
    /// Tokens that were new (the rest existed already, identical).
    pub added: u64,
    /// The token ids, `tx:index`.
    pub tokens: Vec<String>,
}

impl Report for Added {
    fn human(&self) -> String {
        let existed = u64::from(self.count).saturating_sub(self.added);
        let mut text = format!(
            "added {} token(s) of {} {} to wallet {} (tx {})",
            self.added, self.amount, self.token_type, self.wallet, self.tx
        );
        if existed > 0 {
            text.push_str(&format!("; {existed} already existed"));
        }
        text.push('\n');
        text
    }
}

async fn add(ctx: &Context, args: AddArgs) -> Result<Added, CliError> {
    let quantity = Quantity::parse(&args.amount, ctx.config.precision_bits()?)?;
    let tx = match args.tx {
        Some(tx) => tx,
        None => fresh_tx_id()?,
    };
    let tokens = new_tokens(
        &args.wallet,
        &args.token_type,
        quantity,
        &tx,
        args.index,
        args.count,
    )?;
    let progress = (tokens.len() > ADD_BATCH * 4).then(|| {
        let bar = indicatif::ProgressBar::new(u64::from(args.count));
        bar.set_message("adding tokens");
        bar
    });
    let mut added = 0;
    for batch in tokens.chunks(ADD_BATCH) {
        added += ctx.backend.stores().tokens.add_tokens(batch).await?;
        if let Some(bar) = &progress {
            bar.inc(u64::try_from(batch.len()).unwrap_or(u64::MAX));
        }
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    Ok(Added {
        tx: tx.to_string(),
        wallet: args.wallet.to_string(),
        token_type: args.token_type.to_string(),
        amount: output::amount(quantity),
        count: args.count,
        added,
        tokens: tokens.iter().map(|t| t.id.to_string()).collect(),
    })
}

/// One token in JSON: `{"id": "tx:0", "tx", "index", "type", "amount", "spendable"}`.
#[derive(Debug, Serialize)]
pub struct TokenView {
    /// `tx:index`.
    pub id: String,
    /// The creating transaction.
    pub tx: String,
    /// The output index.
    pub index: u32,
    /// The token type.
    #[serde(rename = "type")]
    pub token_type: String,
    /// The amount (decimal).
    pub amount: String,
    /// Whether selection may pick it.
    pub spendable: bool,
}

impl From<&Token> for TokenView {
    fn from(t: &Token) -> Self {
        TokenView {
            id: t.id.to_string(),
            tx: t.id.tx.to_string(),
            index: t.id.index,
            token_type: t.token_type.to_string(),
            amount: output::amount(t.quantity),
            spendable: t.spendable,
        }
    }
}

/// `tokens list` JSON: `{"wallet", "type": null | "T", "limit", "tokens": [TokenView...]}`.
#[derive(Debug, Serialize)]
pub struct Listed {
    /// The wallet.
    pub wallet: String,
    /// The type filter, if any.
    #[serde(rename = "type")]
    pub token_type: Option<String>,
    /// The limit applied.
    pub limit: usize,
    /// Unspent tokens, smallest first.
    pub tokens: Vec<TokenView>,
}

impl Report for Listed {
    fn human(&self) -> String {
        if self.tokens.is_empty() {
            return format!("wallet {} has no unspent tokens\n", self.wallet);
        }
        let mut table = Table::new(["TOKEN", "TYPE", "AMOUNT", "SPENDABLE"]);
        for t in &self.tokens {
            table.row([
                t.id.clone(),
                t.token_type.clone(),
                t.amount.clone(),
                if t.spendable { "yes" } else { "no" }.to_owned(),
            ]);
        }
        let mut text = table.render();
        if self.tokens.len() == self.limit {
            text.push_str(&format!(
                "(showing the first {}; raise --limit for more)\n",
                self.limit
            ));
        }
        text
    }
}

async fn list(ctx: &Context, args: ListArgs) -> Result<Listed, CliError> {
    if args.limit == 0 || args.limit > 100 * DEFAULT_LIST_LIMIT {
        return Err(CliError::Argument {
            arg: "--limit",
            value: args.limit.to_string(),
            expected: format!("expected 1 to {}", 100 * DEFAULT_LIST_LIMIT),
        });
    }
    let tokens = ctx
        .backend
        .stores()
        .tokens
        .list_tokens(&args.wallet, args.token_type.clone(), args.limit)
        .await?;
    Ok(Listed {
        wallet: args.wallet.to_string(),
        token_type: args.token_type.map(|t| t.to_string()),
        limit: args.limit,
        tokens: tokens.iter().map(TokenView::from).collect(),
    })
}

/// `tokens balance` JSON: `{"wallet", "type", "balance"}` (decimal; locks ignored).
#[derive(Debug, Serialize)]
pub struct Balance {
    /// The wallet.
    pub wallet: String,
    /// The token type.
    #[serde(rename = "type")]
    pub token_type: String,
    /// Spendable, unspent total, locked tokens included.
    pub balance: String,
}

impl Report for Balance {
    fn human(&self) -> String {
        format!(
            "wallet {} holds {} {} (spendable, unspent; locked tokens included)\n",
            self.wallet, self.balance, self.token_type
        )
    }
}

async fn balance(ctx: &Context, args: BalanceArgs) -> Result<Balance, CliError> {
    let total = ctx
        .backend
        .stores()
        .tokens
        .balance(&args.wallet, &args.token_type)
        .await?;
    Ok(Balance {
        wallet: args.wallet.to_string(),
        token_type: args.token_type.to_string(),
        balance: output::amount(total),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use holdfast::domain::Precision;

    fn ids() -> (WalletId, TokenType, TxId, Quantity) {
        (
            WalletId::new("w").expect("wallet"),
            TokenType::new("CHF").expect("type"),
            TxId::new("t").expect("tx"),
            Quantity::new(5, Precision::default()).expect("5"),
        )
    }

    #[test]
    fn new_tokens_use_consecutive_indexes() {
        let (w, t, tx, q) = ids();
        let tokens = new_tokens(&w, &t, q, &tx, 7, 3).expect("valid");
        let names: Vec<String> = tokens.iter().map(|t| t.id.to_string()).collect();
        assert_eq!(names, ["t:7", "t:8", "t:9"]);
    }

    #[test]
    fn new_tokens_refuse_zero_count_and_index_overflow() {
        let (w, t, tx, q) = ids();
        let err = new_tokens(&w, &t, q, &tx, 0, 0).expect_err("zero");
        assert!(err.to_string().contains("--count 0"), "{err}");
        let err = new_tokens(&w, &t, q, &tx, u32::MAX, 2).expect_err("overflow");
        assert!(err.to_string().contains("--index"), "{err}");
        assert!(new_tokens(&w, &t, q, &tx, u32::MAX, 1).is_ok());
    }

    #[test]
    fn fresh_tx_ids_differ() {
        let a = fresh_tx_id().expect("id");
        let b = fresh_tx_id().expect("id");
        assert_ne!(a, b);
        assert!(a.as_str().starts_with("mint-"));
    }
}
