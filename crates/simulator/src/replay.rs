//! Replays a payment history (`holdfast simulate --payments FILE.csv`) through
//! the real selector and settlement on a real store, once per policy, and
//! reports what each policy did to the wallet over time: pool size, inputs per
//! payment, changeless payments, dust left, select time.
//!
//! The history is a CSV of `amount,feerate` lines, amounts in BTC with up to 8
//! decimals ([`parse_payments`]): a positive amount is a deposit (one new token of
//! that amount in satoshis), a negative one a payment of that amount. The replay
//! is fee-free and sequential: a payment selects its amount, is confirmed (its
//! inputs spent, the payee's output and the change minted in one transaction, as
//! [`holdfast::Settlement::confirm`] does for any service), and the next line
//! starts. A payment the wallet cannot cover is counted and skipped.
//!
//! Policies ([`ReplayPolicy`]): holdfast's `cover_first` (the default, which
//! tidies a wallet no other caller is on), `cover_first` without tidying
//! (`tidy_band = 0`, as a select beside other callers chooses),
//! `smallest_first` and `cover_first` with `consolidate_dust = 4`, each through
//! [`TokenSelector`]; and two baselines that read the wallet's unspent tokens
//! through the token store and claim what they chose through the lock store, as
//! the naive selector does: a random draw, and Random-Improve as Cardano's CIP-2
//! describes it ([`random_improve`]).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use holdfast_domain::{
    ClaimVerdict, Precision, Quantity, SelectRequest, SelectionConfig, SelectionPolicy, TokenId,
    TokenType, TxId, WalletId,
};
use holdfast_ports::{Clock, MAX_WINDOW, NewToken, Output, Stores};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::Serialize;

use super::figures::{percentile, round3, to_f64};
use super::naive::NAIVE_READ_LIMIT;
use super::provision::{FreshDb, Provisioner};
use super::runner::{Progress, mix};
use super::{SimulateError, Table};
use holdfast::SystemClock;
use holdfast::backend::Backend;
use holdfast::config::Config;
use holdfast::selector::{SelectError, TokenSelector};
use holdfast::settlement::Settlement;

/// Satoshis per bitcoin: the amounts of a history are BTC with up to 8 decimals.
pub const SATS_PER_BTC: u64 = 100_000_000;

/// Digits after the point an amount may have.
pub const DECIMALS: usize = 8;

/// The most inputs a Random-Improve selection may have (CIP-2's maximum input
/// count; one claim window of the lock store).
pub const RANDOM_IMPROVE_MAX_INPUTS: usize = MAX_WINDOW;

/// Dust at the end of a replay: tokens below this share of the median payment
/// (1 / 100, 1%).
pub const DUST_DIVISOR: u128 = 100;

/// `consolidate_dust` of the [`ReplayPolicy::ConsolidateDust`] policy.
pub const CONSOLIDATE_DUST: usize = 4;

/// One line of a payment history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payment {
    /// Money in: a new token of this many satoshis.
    Deposit(u64),
    /// Money out: a payment of this many satoshis.
    Withdrawal(u64),
}

/// Why a payment history was refused.
#[derive(Debug, thiserror::Error)]
pub enum PaymentsError {
    /// The file could not be read (or is missing).
    #[error("cannot read the payment history {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A line is not `amount,feerate`.
    #[error("payment history line {line}: {text:?}: expected {expected}")]
    Line {
        /// The line number, from 1.
        line: usize,
        /// The line as written.
        text: String,
        /// What was expected.
        expected: &'static str,
    },
    /// No line to replay.
    #[error("the payment history has no payment line")]
    Empty,
}

/// Parses a non-negative amount of BTC with at most [`DECIMALS`] decimals into
/// satoshis, exactly (digits, never a float). `None` if it is not one.
pub fn parse_sats(text: &str) -> Option<u64> {
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (text, ""),
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) || fraction.len() > DECIMALS {
        return None;
    }
    if text.contains('.') && fraction.is_empty() {
        return None;
    }
    let mut sats: u64 = whole.parse::<u64>().ok()?.checked_mul(SATS_PER_BTC)?;
    let mut scale = SATS_PER_BTC;
    for b in fraction.bytes() {
        scale /= 10;
        sats = sats.checked_add(u64::from(b - b'0').checked_mul(scale)?)?;
    }
    Some(sats)
}

/// Parses a history: one `amount,feerate` per line (blank lines skipped), at most
/// `limit` payment lines when given. A line that is not one is
/// [`PaymentsError::Line`] naming its number and what was expected.
pub fn parse_payments(text: &str, limit: Option<usize>) -> Result<Vec<Payment>, PaymentsError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        if limit.is_some_and(|n| out.len() >= n) {
            break;
        }
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            continue;
        }
        let bad = |expected| PaymentsError::Line {
            line: i + 1,
            text: raw.to_owned(),
            expected,
        };
        let mut fields = trimmed.split(',');
        let (Some(amount), Some(feerate), None) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(bad("two comma-separated fields, amount,feerate"));
        };
        let (negative, magnitude) = match amount.trim().strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, amount.trim()),
        };
        let sats = parse_sats(magnitude).ok_or_else(|| {
            bad("an amount in BTC with at most 8 decimals, negative for a payment (-0.015)")
        })?;
        if sats == 0 {
            return Err(bad("a non-zero amount"));
        }
        if parse_sats(feerate.trim()).is_none() {
            return Err(bad("a fee rate in BTC/kvB with at most 8 decimals"));
        }
        out.push(if negative {
            Payment::Withdrawal(sats)
        } else {
            Payment::Deposit(sats)
        });
    }
    if out.is_empty() {
        return Err(PaymentsError::Empty);
    }
    Ok(out)
}

/// Reads and parses the history at `path` (see [`parse_payments`]).
pub fn read_payments(path: &Path, limit: Option<usize>) -> Result<Vec<Payment>, PaymentsError> {
    let text = std::fs::read_to_string(path).map_err(|source| PaymentsError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse_payments(&text, limit)
}

/// Why Random-Improve found no selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RandomImproveError {
    /// The tokens do not add up to the amount.
    #[error("insufficient funds")]
    Insufficient,
    /// Covering the amount took more than the maximum input count.
    #[error("more than {0} inputs needed")]
    TooManyInputs(usize),
}

/// Random-Improve (CIP-2) for one payment of `amount` from `values`: returns the
/// indices of the chosen tokens.
///
/// Random selection: draw tokens at random (without replacement) until they cover
/// `amount`; more than `max_inputs` is [`RandomImproveError::TooManyInputs`].
/// Improvement: with the target range (amount, 2 × amount, 3 × amount), keep
/// drawing at random and add a token only if the total moves closer to the ideal
/// 2 × amount, stays at most 3 × amount and the count stays within `max_inputs`;
/// the first draw that would not improve the selection ends the phase (it goes
/// back to the wallet), as does an empty wallet.
pub fn random_improve(
    values: &[u128],
    amount: u128,
    max_inputs: usize,
    rng: &mut StdRng,
) -> Result<Vec<usize>, RandomImproveError> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.shuffle(rng);
    let mut draws = order.into_iter();
    let mut chosen = Vec::new();
    let mut total: u128 = 0;
    while total < amount {
        let Some(i) = draws.next() else {
            return Err(RandomImproveError::Insufficient);
        };
        chosen.push(i);
        total = total.saturating_add(values[i]);
    }
    if chosen.len() > max_inputs {
        return Err(RandomImproveError::TooManyInputs(max_inputs));
    }
    let ideal = amount.saturating_mul(2);
    let maximum = amount.saturating_mul(3);
    for i in draws {
        let next = total.saturating_add(values[i]);
        let closer = next.abs_diff(ideal) < total.abs_diff(ideal);
        if !(closer && next <= maximum && chosen.len() < max_inputs) {
            break;
        }
        chosen.push(i);
        total = next;
    }
    Ok(chosen)
}

/// A policy of the replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplayPolicy {
    /// holdfast's default, `cover_first`.
    CoverFirst,
    /// `cover_first` with `tidy_band = 0`: what a select beside other callers
    /// of its wallet chooses (and the default before tidying).
    Untidy,
    /// holdfast's `smallest_first` (the upstream order).
    SmallestFirst,
    /// `cover_first` with `consolidate_dust = 4`.
    ConsolidateDust,
    /// Baseline: shuffle the unspent tokens, take them until the amount is covered.
    RandomDraw,
    /// Baseline: CIP-2's Random-Improve ([`random_improve`]).
    RandomImprove,
}

impl ReplayPolicy {
    /// Every policy, in report order.
    pub const ALL: [ReplayPolicy; 6] = [
        ReplayPolicy::CoverFirst,
        ReplayPolicy::Untidy,
        ReplayPolicy::SmallestFirst,
        ReplayPolicy::ConsolidateDust,
        ReplayPolicy::RandomDraw,
        ReplayPolicy::RandomImprove,
    ];

    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            ReplayPolicy::CoverFirst => "cover_first",
            ReplayPolicy::Untidy => "cover_first-untidy",
            ReplayPolicy::SmallestFirst => "smallest_first",
            ReplayPolicy::ConsolidateDust => "cover_first+dust4",
            ReplayPolicy::RandomDraw => "random_draw",
            ReplayPolicy::RandomImprove => "random_improve",
        }
    }

    /// The selection settings of a holdfast policy (from `base`); `None` for a
    /// baseline.
    pub fn selection(self, base: &SelectionConfig) -> Option<SelectionConfig> {
        let mut config = base.clone();
        match self {
            ReplayPolicy::CoverFirst => config.policy = SelectionPolicy::CoverFirst,
            ReplayPolicy::Untidy => {
                config.policy = SelectionPolicy::CoverFirst;
                config.tidy_band = 0;
            }
            ReplayPolicy::SmallestFirst => config.policy = SelectionPolicy::SmallestFirst,
            ReplayPolicy::ConsolidateDust => {
                config.policy = SelectionPolicy::CoverFirst;
                config.consolidate_dust = CONSOLIDATE_DUST;
            }
            ReplayPolicy::RandomDraw | ReplayPolicy::RandomImprove => return None,
        }
        Some(config)
    }
}

/// What to replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// The history.
    pub payments: Vec<Payment>,
    /// Where the history came from (shown in the report).
    pub source: String,
    /// `None` for SQLite in the temp directory, a SQLite path or a PostgreSQL URL
    /// (a fresh database per policy, as for `simulate`).
    pub db: Option<String>,
    /// The seed of every random choice.
    pub seed: u64,
    /// The policies, in order.
    pub policies: Vec<ReplayPolicy>,
    /// Backend options and the base selection settings.
    pub config: Config,
    /// A progress bar on stderr for phases over a second.
    pub progress: bool,
}

/// Inputs per payment.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct InputFigures {
    /// Mean.
    pub mean: f64,
    /// 99th percentile (nearest rank).
    pub p99: u64,
    /// Most.
    pub max: u64,
}

/// Select time of a payment (holdfast: the select call; a baseline: reading the
/// wallet, choosing and claiming), in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SelectMs {
    /// Mean.
    pub mean: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// What one policy did over the whole history.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyFigures {
    /// The policy's name.
    pub policy: String,
    /// Payments made (confirmed).
    pub payments: u64,
    /// Payments the wallet could not cover (insufficient funds), skipped.
    pub insufficient: u64,
    /// Payments refused otherwise (Random-Improve's input limit, a holdfast
    /// refusal other than insufficient funds), skipped.
    pub refused: u64,
    /// Unspent tokens in the wallet at the end.
    pub final_pool: u64,
    /// Unspent tokens after each line, averaged over the lines.
    pub mean_pool: f64,
    /// Tokens spent per payment.
    pub inputs: InputFigures,
    /// Payments whose inputs summed to the amount exactly (no change token) /
    /// payments.
    pub changeless_share: f64,
    /// Unspent tokens below 1% of the median payment at the end.
    pub dust_count: u64,
    /// Their value, in satoshis.
    pub dust_sats: u64,
    /// The wallet's unspent value at the end, in satoshis (= deposits − payments made).
    pub unspent_sats: u64,
    /// Select time.
    pub select_ms: SelectMs,
    /// Wall time of this policy's replay, in seconds.
    pub wall_seconds: f64,
}

/// The result of a replay; its JSON is
/// `{"source", "backend", "seed", "lines", "deposits", "withdrawals", "median_payment_sats", "dust_below_sats", "policies": [...]}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayReport {
    /// Where the history came from.
    pub source: String,
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// The seed.
    pub seed: u64,
    /// Lines replayed.
    pub lines: u64,
    /// Deposit lines.
    pub deposits: u64,
    /// Withdrawal lines.
    pub withdrawals: u64,
    /// The median withdrawal, in satoshis.
    pub median_payment_sats: u64,
    /// Tokens below this many satoshis are dust (1% of the median payment).
    pub dust_below_sats: u64,
    /// One entry per policy.
    pub policies: Vec<PolicyFigures>,
}

impl ReplayReport {
    /// The human form: a line about the history and one row per policy.
    pub fn text(&self) -> String {
        let mut out = format!(
            "payment history {} on {}: {} lines ({} deposits, {} payments), seed {}; fee-free, sequential; dust: tokens below {} sat (1% of the median payment, {} sat)\n",
            self.source,
            self.backend,
            self.lines,
            self.deposits,
            self.withdrawals,
            self.seed,
            self.dust_below_sats,
            self.median_payment_sats,
        );
        out.push_str(&self.table().render());
        out
    }

    /// The figures as a table (what `cargo xtask bench` and the README show).
    pub fn table(&self) -> Table {
        let mut table = Table::new([
            "policy",
            "payments",
            "insufficient",
            "refused",
            "final pool",
            "mean pool",
            "inputs mean",
            "inputs p99",
            "inputs max",
            "changeless",
            "dust count",
            "dust BTC",
            "select mean ms",
            "select p99 ms",
        ]);
        for p in &self.policies {
            table.row([
                p.policy.clone(),
                p.payments.to_string(),
                p.insufficient.to_string(),
                p.refused.to_string(),
                p.final_pool.to_string(),
                format!("{:.0}", p.mean_pool),
                format!("{:.2}", p.inputs.mean),
                p.inputs.p99.to_string(),
                p.inputs.max.to_string(),
                format!("{:.1}%", p.changeless_share * 100.0),
                p.dust_count.to_string(),
                btc(p.dust_sats),
                format!("{:.2}", p.select_ms.mean),
                format!("{:.2}", p.select_ms.p99),
            ]);
        }
        table
    }
}

/// Satoshis as BTC with 8 decimals.
pub fn btc(sats: u64) -> String {
    format!("{}.{:08}", sats / SATS_PER_BTC, sats % SATS_PER_BTC)
}

/// The wallet every deposit goes to and every payment comes from.
pub const WALLET: &str = "replay-wallet";

/// The token type of the replay.
pub const TOKEN_TYPE: &str = "BTC";

fn wallet() -> Result<WalletId, SimulateError> {
    WalletId::new(WALLET).map_err(SimulateError::internal)
}

fn payee() -> Result<WalletId, SimulateError> {
    WalletId::new("replay-payee").map_err(SimulateError::internal)
}

fn btc_type() -> Result<TokenType, SimulateError> {
    TokenType::new(TOKEN_TYPE).map_err(SimulateError::internal)
}

fn quantity(sats: u64) -> Result<Quantity, SimulateError> {
    Quantity::new(u128::from(sats), Precision::default()).map_err(SimulateError::internal)
}

/// The median withdrawal of `payments` (the lower one of an even count); 0 without
/// withdrawals.
pub fn median_payment(payments: &[Payment]) -> u64 {
    let mut amounts: Vec<u64> = payments
        .iter()
        .filter_map(|p| match p {
            Payment::Withdrawal(sats) => Some(*sats),
            Payment::Deposit(_) => None,
        })
        .collect();
    amounts.sort_unstable();
    if amounts.is_empty() {
        return 0;
    }
    amounts[(amounts.len() - 1) / 2]
}

/// Replays the history once per policy, each on a fresh database.
pub async fn replay(options: ReplayOptions) -> Result<ReplayReport, SimulateError> {
    let provisioner =
        Provisioner::for_url(options.db.as_deref()).map_err(SimulateError::Provision)?;
    let result = replay_on(&options, &provisioner).await;
    provisioner.finish();
    result
}

async fn replay_on(
    options: &ReplayOptions,
    provisioner: &Provisioner,
) -> Result<ReplayReport, SimulateError> {
    let count = |deposit: bool| {
        let n = options
            .payments
            .iter()
            .filter(|p| matches!(p, Payment::Deposit(_)) == deposit)
            .count();
        u64::try_from(n).unwrap_or(u64::MAX)
    };
    let median = median_payment(&options.payments);
    let mut report = ReplayReport {
        source: options.source.clone(),
        backend: provisioner.kind().as_str(),
        seed: options.seed,
        lines: u64::try_from(options.payments.len()).unwrap_or(u64::MAX),
        deposits: count(true),
        withdrawals: count(false),
        median_payment_sats: median,
        dust_below_sats: median.div_ceil(u64::try_from(DUST_DIVISOR).unwrap_or(100)),
        policies: Vec::new(),
    };
    for &policy in &options.policies {
        let db = provisioner
            .create(&format!("replay-{}", policy.name().replace('+', "-")))
            .await
            .map_err(SimulateError::Provision)?;
        let result = replay_policy(policy, options, &db, median).await;
        let removed = provisioner.remove(&db).await;
        let figures = result?;
        removed.map_err(SimulateError::Provision)?;
        report.policies.push(figures);
    }
    Ok(report)
}

/// How a payment chose and locked its inputs.
enum Chooser {
    Holdfast(Box<TokenSelector>),
    Baseline(ReplayPolicy),
}

/// One payment's choice: the tokens won, or why it was skipped.
enum Choice {
    Won(Vec<TokenId>, Quantity),
    Insufficient,
    Refused,
}

/// What one policy's replay tallies as it goes.
#[derive(Default)]
struct Tally {
    pool: u64,
    pool_sum: u128,
    inputs: Vec<u64>,
    changeless: u64,
    insufficient: u64,
    refused: u64,
    select_times: Vec<Duration>,
}

async fn replay_policy(
    policy: ReplayPolicy,
    options: &ReplayOptions,
    db: &FreshDb,
    median: u64,
) -> Result<PolicyFigures, SimulateError> {
    let backend = Backend::open(&db.url, &options.config.backend_options())
        .await
        .map_err(SimulateError::Open)?;
    let result = replay_policy_on(policy, options, backend.stores(), median).await;
    backend.close().await;
    result
}

/// Replays `options.payments` with `policy` on `stores` (a fresh database: the
/// wallet [`WALLET`] must be empty); `median` is [`median_payment`] of the
/// history. The tokens stay in the store, for a caller to look at.
pub async fn replay_policy_on(
    policy: ReplayPolicy,
    options: &ReplayOptions,
    stores: Stores,
    median: u64,
) -> Result<PolicyFigures, SimulateError> {
    let started = Instant::now();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let salt = ReplayPolicy::ALL
        .iter()
        .position(|p| *p == policy)
        .map_or(0, |i| u64::try_from(i).unwrap_or(0));
    let chooser = match policy.selection(&options.config.selection_config()) {
        Some(selection) => Chooser::Holdfast(Box::new(
            TokenSelector::new(
                stores.clone(),
                clock.clone(),
                selection,
                Some(mix(options.seed, 700 + salt)),
            )
            .map_err(SimulateError::Selection)?,
        )),
        None => Chooser::Baseline(policy),
    };
    let settlement = Settlement::new(
        stores.clone(),
        clock.clone(),
        options.config.persist_policy(),
    );
    let (wallet, payee, token_type) = (wallet()?, payee()?, btc_type()?);
    let progress = Progress::new(
        Some(u64::try_from(options.payments.len()).unwrap_or(u64::MAX)),
        &format!("replay {}", policy.name()),
        options.progress,
    );
    let mut rng = StdRng::seed_from_u64(mix(options.seed, 800 + salt));
    let mut tally = Tally::default();
    let mut deposits: Vec<NewToken> = Vec::new();
    let (mut deposited, mut paid) = (0u64, 0u64);
    for (line, payment) in options.payments.iter().enumerate() {
        match *payment {
            Payment::Deposit(sats) => {
                // Deposits up to the next payment go in one write: nothing reads
                // the wallet between them.
                deposits.push(NewToken {
                    id: TokenId::new(
                        TxId::new(format!("deposit-{}", line + 1))
                            .map_err(SimulateError::internal)?,
                        0,
                    ),
                    wallet: wallet.clone(),
                    token_type: token_type.clone(),
                    quantity: quantity(sats)?,
                    spendable: true,
                });
                deposited = deposited
                    .checked_add(sats)
                    .ok_or_else(|| SimulateError::internal("deposits overflow u64"))?;
                tally.pool += 1;
            }
            Payment::Withdrawal(sats) => {
                mint(&stores, &mut deposits).await?;
                let tx =
                    TxId::new(format!("payment-{}", line + 1)).map_err(SimulateError::internal)?;
                let amount = quantity(sats)?;
                let request = SelectRequest {
                    wallet: wallet.clone(),
                    token_type: token_type.clone(),
                    amount,
                    consumer: tx.clone(),
                };
                let seed = mix(options.seed, 10_000 + u64::try_from(line).unwrap_or(0));
                let begun = Instant::now();
                let choice = match &chooser {
                    Chooser::Holdfast(selector) => {
                        let report = selector.select_seeded(&request, seed).await;
                        match report.result {
                            Ok(selected) => Choice::Won(selected.tokens, selected.change),
                            Err(SelectError::InsufficientFunds { .. }) => Choice::Insufficient,
                            Err(e @ SelectError::Store(_)) => {
                                return Err(SimulateError::Replay(e.to_string()));
                            }
                            Err(_) => Choice::Refused,
                        }
                    }
                    Chooser::Baseline(policy) => {
                        baseline(*policy, &stores, clock.as_ref(), &request, &mut rng).await?
                    }
                };
                let elapsed = begun.elapsed();
                let (tokens, change) = match choice {
                    Choice::Won(tokens, change) => (tokens, change),
                    Choice::Insufficient => {
                        tally.insufficient += 1;
                        tally.pool_sum += u128::from(tally.pool);
                        progress.inc(1);
                        continue;
                    }
                    Choice::Refused => {
                        tally.refused += 1;
                        tally.pool_sum += u128::from(tally.pool);
                        progress.inc(1);
                        continue;
                    }
                };
                tally.select_times.push(elapsed);
                let to_payee = [Output {
                    wallet: payee.clone(),
                    token_type: token_type.clone(),
                    quantity: amount,
                }];
                let confirmed = settlement
                    .confirm(&tx, &to_payee, Some(&wallet))
                    .await
                    .map_err(|e| SimulateError::Replay(e.to_string()))?;
                let inputs = u64::try_from(tokens.len()).unwrap_or(u64::MAX);
                if u64::try_from(confirmed.spent.len()).unwrap_or(u64::MAX) != inputs {
                    return Err(SimulateError::internal(format!(
                        "{tx} selected {inputs} tokens but confirming spent {}",
                        confirmed.spent.len()
                    )));
                }
                tally.inputs.push(inputs);
                tally.pool = tally.pool.saturating_sub(inputs);
                if change.is_zero() {
                    tally.changeless += 1;
                } else {
                    tally.pool += 1;
                }
                paid = paid
                    .checked_add(sats)
                    .ok_or_else(|| SimulateError::internal("payments overflow u64"))?;
            }
        }
        tally.pool_sum += u128::from(tally.pool);
        progress.inc(1);
    }
    mint(&stores, &mut deposits).await?;
    progress.finish();
    let left = stores
        .tokens
        .list_tokens(&wallet, Some(token_type.clone()), NAIVE_READ_LIMIT)
        .await
        .map_err(SimulateError::Seed)?;
    let unspent: Vec<u128> = left
        .iter()
        .filter(|t| t.spent_by.is_none())
        .map(|t| t.quantity.value())
        .collect();
    let final_pool = u64::try_from(unspent.len()).unwrap_or(u64::MAX);
    if final_pool != tally.pool {
        return Err(SimulateError::internal(format!(
            "{}: the store holds {final_pool} unspent tokens, the replay counted {}",
            policy.name(),
            tally.pool
        )));
    }
    let unspent_total: u128 = unspent.iter().sum();
    // Value is conserved: what is left is what came in less what was paid.
    if unspent_total != u128::from(deposited) - u128::from(paid) {
        return Err(SimulateError::internal(format!(
            "{}: {unspent_total} sat unspent, but deposits {deposited} − payments {paid}",
            policy.name()
        )));
    }
    let unspent_sats = u64::try_from(unspent_total).unwrap_or(u64::MAX);
    let dust: Vec<u128> = unspent
        .iter()
        .copied()
        .filter(|v| v.saturating_mul(DUST_DIVISOR) < u128::from(median))
        .collect();
    let payments = u64::try_from(tally.inputs.len()).unwrap_or(u64::MAX);
    let mut inputs = tally.inputs;
    inputs.sort_unstable();
    let input_total: u64 = inputs.iter().sum();
    let mut times = tally.select_times;
    times.sort_unstable();
    let time_total: Duration = times.iter().sum();
    let lines = u64::try_from(options.payments.len()).unwrap_or(u64::MAX);
    Ok(PolicyFigures {
        policy: policy.name().to_owned(),
        payments,
        insufficient: tally.insufficient,
        refused: tally.refused,
        final_pool,
        mean_pool: round3(pool_mean(tally.pool_sum, lines)),
        inputs: InputFigures {
            mean: ratio(input_total, payments),
            p99: nearest_rank(&inputs, 99),
            max: inputs.last().copied().unwrap_or(0),
        },
        changeless_share: ratio(tally.changeless, payments),
        dust_count: u64::try_from(dust.len()).unwrap_or(u64::MAX),
        dust_sats: u64::try_from(dust.iter().sum::<u128>()).unwrap_or(u64::MAX),
        unspent_sats,
        select_ms: SelectMs {
            mean: if times.is_empty() {
                0.0
            } else {
                round3(time_total.as_secs_f64() * 1000.0 / to_f64(payments))
            },
            p99: round3(percentile(&times, 99).as_secs_f64() * 1000.0),
        },
        wall_seconds: round3(started.elapsed().as_secs_f64()),
    })
}

/// Adds the deposits gathered since the last payment, in one batch.
async fn mint(stores: &Stores, deposits: &mut Vec<NewToken>) -> Result<(), SimulateError> {
    if !deposits.is_empty() {
        stores
            .tokens
            .add_tokens(deposits)
            .await
            .map_err(SimulateError::Seed)?;
        deposits.clear();
    }
    Ok(())
}

fn ratio(numerator: u64, denominator: u64) -> f64 {
    if denominator == 0 {
        0.0
    } else {
        round3(to_f64(numerator) / to_f64(denominator))
    }
}

fn pool_mean(sum: u128, lines: u64) -> f64 {
    if lines == 0 {
        return 0.0;
    }
    to_f64(u64::try_from(sum / u128::from(lines)).unwrap_or(u64::MAX))
        + to_f64(u64::try_from(sum % u128::from(lines)).unwrap_or(0)) / to_f64(lines)
}

/// The nearest-rank percentile `p` of sorted counts.
fn nearest_rank(sorted: &[u64], p: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

/// A baseline's choice for `request`: reads the wallet's unspent tokens through
/// the token store, chooses, and claims the choice through the lock store (in
/// windows of [`MAX_WINDOW`]); the replay is sequential, so every claim wins.
async fn baseline(
    policy: ReplayPolicy,
    stores: &Stores,
    clock: &dyn Clock,
    request: &SelectRequest,
    rng: &mut StdRng,
) -> Result<Choice, SimulateError> {
    let tokens = stores
        .tokens
        .list_tokens(
            &request.wallet,
            Some(request.token_type.clone()),
            NAIVE_READ_LIMIT,
        )
        .await
        .map_err(SimulateError::Seed)?;
    let tokens: Vec<_> = tokens
        .into_iter()
        .filter(|t| t.spendable && t.spent_by.is_none())
        .collect();
    let values: Vec<u128> = tokens.iter().map(|t| t.quantity.value()).collect();
    let amount = request.amount.value();
    let chosen = match policy {
        ReplayPolicy::RandomImprove => {
            match random_improve(&values, amount, RANDOM_IMPROVE_MAX_INPUTS, rng) {
                Ok(chosen) => chosen,
                Err(RandomImproveError::Insufficient) => return Ok(Choice::Insufficient),
                Err(RandomImproveError::TooManyInputs(_)) => return Ok(Choice::Refused),
            }
        }
        _ => match random_draw(&values, amount, rng) {
            Some(chosen) => chosen,
            None => return Ok(Choice::Insufficient),
        },
    };
    let ids: Vec<TokenId> = chosen.iter().map(|&i| tokens[i].id.clone()).collect();
    let total: u128 = chosen.iter().map(|&i| values[i]).sum();
    for window in ids.chunks(MAX_WINDOW) {
        let verdicts = stores
            .locks
            .claim_window(&request.consumer, window, clock.now())
            .await
            .map_err(SimulateError::Locks)?;
        if let Some((token, verdict)) = verdicts.iter().find(|(_, v)| *v != ClaimVerdict::Won) {
            return Err(SimulateError::internal(format!(
                "a sequential replay lost the claim of {token}: {verdict:?}"
            )));
        }
    }
    let change =
        Quantity::new(total - amount, Precision::default()).map_err(SimulateError::internal)?;
    Ok(Choice::Won(ids, change))
}

/// The random draw: the tokens in a random order, taken until they cover `amount`;
/// `None` when all of them do not.
pub fn random_draw(values: &[u128], amount: u128, rng: &mut StdRng) -> Option<Vec<usize>> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.shuffle(rng);
    let mut total: u128 = 0;
    let mut chosen = Vec::new();
    for i in order {
        if total >= amount {
            break;
        }
        chosen.push(i);
        total = total.saturating_add(values[i]);
    }
    (total >= amount).then_some(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_parse_exactly_to_satoshis() {
        assert_eq!(parse_sats("0.01569000"), Some(1_569_000));
        assert_eq!(parse_sats("1"), Some(100_000_000));
        assert_eq!(parse_sats("0.00000001"), Some(1));
        assert_eq!(parse_sats("0.1"), Some(10_000_000));
        // A float would round 0.29 * 1e8 to 28999999.999999996.
        assert_eq!(parse_sats("0.29"), Some(29_000_000));
        assert_eq!(parse_sats("21000000.12345678"), Some(2_100_000_012_345_678));
        for bad in [
            "",
            ".5",
            "1.",
            "0.000000001",
            "1e5",
            "-1",
            "0x10",
            "1.2.3",
            " 1",
        ] {
            assert_eq!(parse_sats(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn lines_become_deposits_and_withdrawals() {
        let text = "0.01569000,0.00001139\n-0.00940000,0.00001929\n\n1,0.00071535\n";
        let payments = parse_payments(text, None).expect("parses");
        assert_eq!(
            payments,
            vec![
                Payment::Deposit(1_569_000),
                Payment::Withdrawal(940_000),
                Payment::Deposit(100_000_000),
            ]
        );
        assert_eq!(
            parse_payments(text, Some(2)).expect("parses").len(),
            2,
            "a limit stops after that many payment lines"
        );
    }

    #[test]
    fn a_bad_line_is_an_error_naming_its_number_and_what_was_expected() {
        let cases = [
            ("1,0.1\nabc,0.1\n", 2, "an amount in BTC"),
            ("1,0.1\n0.5\n", 2, "two comma-separated fields"),
            ("1,0.1\n\n0.5,0.1,7\n", 3, "two comma-separated fields"),
            ("0.000000001,0.1\n", 1, "an amount in BTC"),
            ("0,0.1\n", 1, "a non-zero amount"),
            ("-0.00000000,0.1\n", 1, "a non-zero amount"),
            ("1,fast\n", 1, "a fee rate"),
        ];
        for (text, want_line, want) in cases {
            match parse_payments(text, None) {
                Err(PaymentsError::Line { line, expected, .. }) => {
                    assert_eq!(line, want_line, "{text:?}");
                    assert!(expected.starts_with(want), "{text:?}: {expected}");
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        assert!(matches!(
            parse_payments("\n\n", None),
            Err(PaymentsError::Empty)
        ));
    }

    #[test]
    fn random_improve_covers_the_amount_and_never_improves_past_three_times_it() {
        let values: Vec<u128> = (1..=60).map(|i| (i * 7) % 23 + 1).collect();
        let available: u128 = values.iter().sum();
        for seed in 0..200 {
            let mut rng = StdRng::seed_from_u64(seed);
            let amount = u128::from(seed % 40) + 1;
            let chosen = random_improve(&values, amount, 256, &mut rng).expect("covers");
            let total: u128 = chosen.iter().map(|&i| values[i]).sum();
            assert!(total >= amount, "seed {seed}: {total} < {amount}");
            // The random phase stops as soon as it covers; what it took is below
            // the amount plus its last token, and each improvement kept the total
            // at most 3x.
            let mut distinct = chosen.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(distinct.len(), chosen.len(), "no token twice");
            let mut running = 0u128;
            let mut covered_at = None;
            for (n, &i) in chosen.iter().enumerate() {
                running += values[i];
                if covered_at.is_none() && running >= amount {
                    covered_at = Some(n);
                } else if covered_at.is_some() {
                    assert!(running <= 3 * amount, "seed {seed}: improved to {running}");
                }
            }
            assert!(total <= available);
        }
    }

    #[test]
    fn random_improve_moves_toward_twice_the_amount_and_stops_at_the_first_miss() {
        // Ten tokens of 10 for 10: one covers; each improvement must bring the
        // total closer to 20 without passing 30: exactly one more token (20).
        let values = vec![10u128; 10];
        for seed in 0..50 {
            let mut rng = StdRng::seed_from_u64(seed);
            let chosen = random_improve(&values, 10, 256, &mut rng).expect("covers");
            assert_eq!(chosen.len(), 2, "seed {seed}");
        }
        // A token that would overshoot 3x is not taken: 10 for 10 beside a 25.
        let values = vec![10u128, 25];
        for seed in 0..50 {
            let mut rng = StdRng::seed_from_u64(seed);
            let chosen = random_improve(&values, 10, 256, &mut rng).expect("covers");
            let total: u128 = chosen.iter().map(|&i| values[i]).sum();
            assert!(total == 10 || total == 25, "seed {seed}: {total}");
        }
    }

    #[test]
    fn random_improve_respects_the_input_limit_and_reports_shortfalls() {
        let values = vec![1u128; 100];
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(
            random_improve(&values, 50, 10, &mut rng),
            Err(RandomImproveError::TooManyInputs(10))
        );
        assert_eq!(
            random_improve(&values, 101, 256, &mut rng),
            Err(RandomImproveError::Insufficient)
        );
        // Improvement stops at the limit: 5 for 5 would improve up to 10 tokens.
        let chosen = random_improve(&values, 5, 7, &mut rng).expect("covers");
        assert_eq!(chosen.len(), 7);
    }

    #[test]
    fn the_random_draw_takes_until_covered() {
        let values = vec![5u128, 5, 5, 5];
        let mut rng = StdRng::seed_from_u64(3);
        assert_eq!(random_draw(&values, 12, &mut rng).map(|c| c.len()), Some(3));
        assert_eq!(random_draw(&values, 21, &mut rng), None);
    }

    #[test]
    fn the_median_payment_ignores_deposits() {
        let payments = [
            Payment::Deposit(1_000),
            Payment::Withdrawal(30),
            Payment::Withdrawal(10),
            Payment::Withdrawal(20),
        ];
        assert_eq!(median_payment(&payments), 20);
    }
}
