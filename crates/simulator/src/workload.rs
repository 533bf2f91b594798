//! Workloads: what a simulation runs. A workload is a wallet layout (token blocks),
//! a request mix (request blocks) and how hard to drive it (replicas, concurrency,
//! legs); or, for `admission`, build queues with injected crashes.
//!
//! Workloads come from the presets ([`Workload::preset`]) or from a TOML file
//! ([`Workload::from_toml_str`]) whose format is documented in the README
//! ("Benchmarks"). Every parse error is a [`WorkloadError`] naming the key
//! (`tokens[1].amount`) and what was expected.

use holdfast_domain::{Precision, Quantity, SelectionConfig, TokenType, WalletId};
use rand::Rng;
use rand::rngs::StdRng;
use serde::Deserialize;

/// The preset names, in the order `--help` lists them.
pub const PRESETS: &[&str] = &[
    "hot-lineage",
    "pareto",
    "dust",
    "big-wallet",
    "many-wallets",
    "hot-wallets",
    "admission",
];

/// Wallets of the `many-wallets` preset.
pub const MANY_WALLETS: u32 = 64;
/// Tokens in each wallet of the `many-wallets` preset.
pub const MANY_WALLETS_TOKENS: u64 = 400;
/// Requests to each wallet of the `many-wallets` preset.
pub const MANY_WALLETS_REQUESTS: u64 = 96;

/// Hot wallets of the `hot-wallets` preset.
pub const HOT_WALLETS: u32 = 3;
/// Tokens (of 1,000) in each hot wallet of the `hot-wallets` preset.
pub const HOT_WALLET_TOKENS: u64 = 200;
/// Payments from each hot wallet of the `hot-wallets` preset.
pub const HOT_WALLET_REQUESTS: u64 = 3_000;
/// Cold wallets of the `hot-wallets` preset.
pub const COLD_WALLETS: u32 = 40;
/// Tokens (of 100) in each cold wallet of the `hot-wallets` preset.
pub const COLD_WALLET_TOKENS: u64 = 10;
/// Payments from each cold wallet of the `hot-wallets` preset.
pub const COLD_WALLET_REQUESTS: u64 = 25;

/// The most replicas a workload may ask for.
pub const MAX_REPLICAS: usize = 64;
/// The most concurrent tasks a workload may ask for.
pub const MAX_CONCURRENCY: usize = 4096;
/// The most tokens (or requests) a workload may describe in total.
pub const MAX_ITEMS: u64 = 10_000_000;

/// Why a workload was refused. Every variant names the key.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The file could not be read.
    #[error("cannot read workload file {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The text is not TOML.
    #[error("workload is not valid TOML: {message}")]
    Syntax {
        /// The parser's message (with line and column).
        message: String,
    },
    /// A required key is absent.
    #[error("workload key {key} is missing: {message}")]
    Missing {
        /// The key, as a path (`tokens[0].wallet`).
        key: String,
        /// What was expected.
        message: String,
    },
    /// A key has a value of the wrong TOML type.
    #[error("workload key {key}: {message}")]
    WrongType {
        /// The key.
        key: String,
        /// The type found and what was expected, as the parser says it.
        message: String,
    },
    /// A key's value is out of range or malformed.
    #[error("workload key {key} = {value}: {expected}")]
    Invalid {
        /// The key.
        key: String,
        /// The rejected value, as written.
        value: String,
        /// What was expected.
        expected: String,
    },
    /// A key this format does not know (a typo would otherwise be ignored).
    #[error("unknown workload key {key}: {message}")]
    UnknownKey {
        /// The key.
        key: String,
        /// The parser's message, with the keys accepted at that place.
        message: String,
    },
    /// Neither a preset name nor a readable file.
    #[error("unknown workload {name:?}; expected a preset ({}) or a TOML file path", PRESETS.join(", "))]
    UnknownPreset {
        /// What was given.
        name: String,
    },
}

/// An amount: fixed, or drawn uniformly from an inclusive range per token or request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AmountSpec {
    /// Always this amount.
    Fixed(Quantity),
    /// Uniform in `[low, high]`, drawn from the run's seeded RNG.
    Range {
        /// The smallest amount.
        low: Quantity,
        /// The largest amount.
        high: Quantity,
    },
}

impl AmountSpec {
    /// Parses `"50"` or `"1..1000"` (inclusive, low at least 1, low <= high).
    pub fn parse(key: &str, text: &str) -> Result<AmountSpec, WorkloadError> {
        let invalid = |expected: String| WorkloadError::Invalid {
            key: key.to_owned(),
            value: format!("{text:?}"),
            expected,
        };
        let one = |part: &str| {
            Quantity::parse(part, Precision::default())
                .map_err(|e| invalid(format!("{e}")))
                .and_then(|q| {
                    if q.is_zero() {
                        Err(invalid("expected an amount of at least 1".to_owned()))
                    } else {
                        Ok(q)
                    }
                })
        };
        match text.split_once("..") {
            None => Ok(AmountSpec::Fixed(one(text)?)),
            Some((low, high)) => {
                let (low, high) = (one(low)?, one(high)?);
                if low > high {
                    return Err(invalid(
                        "expected a range LOW..HIGH with LOW <= HIGH".to_owned(),
                    ));
                }
                Ok(AmountSpec::Range { low, high })
            }
        }
    }

    /// One amount: the fixed one, or a uniform draw from the range.
    pub fn draw(&self, rng: &mut StdRng) -> Quantity {
        match *self {
            AmountSpec::Fixed(q) => q,
            AmountSpec::Range { low, high } => {
                let value = rng.random_range(low.value()..=high.value());
                // Within [low, high], both valid quantities: always valid.
                Quantity::new(value, Precision::default()).unwrap_or(low)
            }
        }
    }
}

impl std::fmt::Display for AmountSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AmountSpec::Fixed(q) => write!(f, "{q}"),
            AmountSpec::Range { low, high } => write!(f, "{low}..{high}"),
        }
    }
}

/// What a request does with the tokens it selected (`mode` in a workload file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RequestMode {
    /// Confirm the transaction: the tokens are spent and their locks released; a
    /// non-zero change is minted back to the wallet as a new token (new tx id).
    #[default]
    Settle,
    /// Release the locks without spending (the transaction was invalid).
    Unlock,
    /// Keep the locks until the lease sweep deletes them.
    Hold,
}

impl RequestMode {
    /// `settle`, `unlock` or `hold`.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestMode::Settle => "settle",
            RequestMode::Unlock => "unlock",
            RequestMode::Hold => "hold",
        }
    }
}

/// Tokens added to a wallet before the run; repeated blocks add up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBlock {
    /// The wallet.
    pub wallet: WalletId,
    /// The token type.
    pub token_type: TokenType,
    /// Each token's amount.
    pub amount: AmountSpec,
    /// How many tokens.
    pub count: u64,
}

/// Select requests; every block's requests are mixed and shuffled with the seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestBlock {
    /// The wallet.
    pub wallet: WalletId,
    /// The token type.
    pub token_type: TokenType,
    /// Each request's amount.
    pub amount: AmountSpec,
    /// How many requests.
    pub count: u64,
    /// What happens after a successful select.
    pub mode: RequestMode,
}

/// The `admission` workload: build queues driven by workers that crash and have
/// their messages redelivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLoad {
    /// How many queues.
    pub queues: u32,
    /// Requests ingested per queue.
    pub requests_per_queue: u32,
    /// Slots per queue.
    pub max_concurrent: u32,
    /// Concurrent workers.
    pub workers: usize,
    /// Chance, in percent, that one queue-store write crashes: half of the time
    /// before the write, half after it (applied, answer lost). The failed step's
    /// message is redelivered.
    pub crash_percent: u8,
}

/// A simulation workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// The name shown in reports.
    pub name: String,
    /// Independent backend instances (each with its own pool) on one database.
    pub replicas: usize,
    /// Concurrent select tasks in total, spread over the replicas.
    pub concurrency: usize,
    /// Backoff legs per select; `None` keeps the configuration's `selection.max_legs`.
    pub legs: Option<u32>,
    /// Backoff between legs is uniform in `[0, retry_interval_ms)` (default 20).
    pub retry_interval_ms: u64,
    /// How much faster the simulated clock runs than the wall clock (default 10):
    /// lock timestamps and the lease sweep use it, so a 3 min lease expires after
    /// 18 s of wall time (well above a select's latency, so a live holder's lease
    /// does not run out under load, yet naive lease-only locks do come free).
    pub time_scale: u32,
    /// Wallet contents.
    pub tokens: Vec<TokenBlock>,
    /// The request mix.
    pub requests: Vec<RequestBlock>,
    /// Set for admission workloads (tokens and requests are then empty).
    pub admission: Option<AdmissionLoad>,
}

/// The default backoff interval of the simulator, short like upstream's
/// contention tests, so runs take seconds.
pub const DEFAULT_RETRY_INTERVAL_MS: u64 = 20;
/// Legs per select of the token presets: upstream's contention tests ran 50
/// retries with a 20 ms backoff.
pub const PRESET_LEGS: u32 = 50;
/// The default speed of the simulated clock.
pub const DEFAULT_TIME_SCALE: u32 = 10;

impl Workload {
    /// A preset by name.
    pub fn preset(name: &str) -> Option<Workload> {
        let wallet = |w: &str| WalletId::new(w).ok();
        let ty = |t: &str| TokenType::new(t).ok();
        let fixed = |v: u128| {
            Quantity::new(v, Precision::default())
                .ok()
                .map(AmountSpec::Fixed)
        };
        let range = |low: u128, high: u128| {
            Some(AmountSpec::Range {
                low: Quantity::new(low, Precision::default()).ok()?,
                high: Quantity::new(high, Precision::default()).ok()?,
            })
        };
        let tokens = |w: &str, t: &str, amount: Option<AmountSpec>, count: u64| {
            Some(TokenBlock {
                wallet: wallet(w)?,
                token_type: ty(t)?,
                amount: amount?,
                count,
            })
        };
        let requests =
            |w: &str, t: &str, amount: Option<AmountSpec>, count: u64, mode: RequestMode| {
                Some(RequestBlock {
                    wallet: wallet(w)?,
                    token_type: ty(t)?,
                    amount: amount?,
                    count,
                    mode,
                })
            };
        // Upstream's contention tests with a 20 ms backoff ran 50 retries; the
        // token presets do the same (the selection settings are otherwise defaults).
        let base = |name: &str| Workload {
            name: name.to_owned(),
            replicas: 3,
            concurrency: 32,
            legs: Some(PRESET_LEGS),
            retry_interval_ms: DEFAULT_RETRY_INTERVAL_MS,
            time_scale: DEFAULT_TIME_SCALE,
            tokens: Vec::new(),
            requests: Vec::new(),
            admission: None,
        };
        let preset = match name {
            // TestHotTokenContention: 4 x CHF 1 + one CHF 296, 3 x 100 requests of
            // CHF 1, each spend minting its change under a new id (a rotating hot
            // lineage); demand equals balance, so every failure is spurious.
            "hot-lineage" => Workload {
                tokens: vec![
                    tokens("alice", "CHF", fixed(1), 4)?,
                    tokens("alice", "CHF", fixed(296), 1)?,
                ],
                requests: vec![requests(
                    "alice",
                    "CHF",
                    fixed(1),
                    300,
                    RequestMode::Settle,
                )?],
                ..base(name)
            },
            // TestStaticHotTokenContentionPareto: 5 hot CHF 50 and 10 cold 10000 of
            // another type; 300 requests of CHF 1, select then unlock.
            "pareto" => Workload {
                tokens: vec![
                    tokens("alice", "CHF", fixed(50), 5)?,
                    tokens("alice", "CHF_COLD", fixed(10_000), 10)?,
                ],
                requests: vec![requests(
                    "alice",
                    "CHF",
                    fixed(1),
                    300,
                    RequestMode::Unlock,
                )?],
                ..base(name)
            },
            // TestHotTokenContentionWideWindow: 90 x CHF 1 dust, 3 x 10 requests of 3.
            "dust" => Workload {
                concurrency: 30,
                tokens: vec![tokens("alice", "CHF", fixed(1), 90)?],
                requests: vec![requests("alice", "CHF", fixed(3), 30, RequestMode::Settle)?],
                ..base(name)
            },
            "big-wallet" => Workload {
                tokens: vec![tokens("alice", "CHF", range(1, 1000), 100_000)?],
                requests: vec![requests(
                    "alice",
                    "CHF",
                    range(1, 2000),
                    2_000,
                    RequestMode::Settle,
                )?],
                ..base(name)
            },
            // The ordinary case beside the incident shapes: many wallets of
            // tokens of 1..1000, each request (1..100) small against most of them, the requests
            // spread over the wallets, so selects rarely meet. Both strategies
            // spend (settle), so they make the same writes.
            "many-wallets" => {
                let mut wallets = Vec::new();
                let mut asks = Vec::new();
                for w in 0..MANY_WALLETS {
                    let name = format!("wallet-{w:02}");
                    wallets.push(tokens(&name, "CHF", range(1, 1000), MANY_WALLETS_TOKENS)?);
                    asks.push(requests(
                        &name,
                        "CHF",
                        range(1, 100),
                        MANY_WALLETS_REQUESTS,
                        RequestMode::Settle,
                    )?);
                }
                Workload {
                    tokens: wallets,
                    requests: asks,
                    ..base(name)
                }
            }
            // A payment service: three replicas, 96 payments in flight, most of
            // them from three hot wallets (200 tokens of 1,000 each) and a few from
            // 40 cold ones (10 tokens of 100), payments of 1..10 settled with their
            // change. Unlike the presets above it keeps the true default backoff
            // (the configuration's legs, 10, of [0, 5 s)), as a service runs it.
            "hot-wallets" => {
                let defaults = SelectionConfig::default();
                let mut wallets = Vec::new();
                let mut asks = Vec::new();
                for w in 0..HOT_WALLETS {
                    let name = format!("hot-{w}");
                    wallets.push(tokens(&name, "CHF", fixed(1_000), HOT_WALLET_TOKENS)?);
                    asks.push(requests(
                        &name,
                        "CHF",
                        range(1, 10),
                        HOT_WALLET_REQUESTS,
                        RequestMode::Settle,
                    )?);
                }
                for w in 0..COLD_WALLETS {
                    let name = format!("cold-{w:02}");
                    wallets.push(tokens(&name, "CHF", fixed(100), COLD_WALLET_TOKENS)?);
                    asks.push(requests(
                        &name,
                        "CHF",
                        range(1, 10),
                        COLD_WALLET_REQUESTS,
                        RequestMode::Settle,
                    )?);
                }
                Workload {
                    concurrency: 96,
                    legs: None,
                    retry_interval_ms: u64::try_from(defaults.retry_interval.as_millis()).ok()?,
                    tokens: wallets,
                    requests: asks,
                    ..base(name)
                }
            }
            "admission" => Workload {
                replicas: 1,
                concurrency: 8,
                admission: Some(AdmissionLoad {
                    queues: 100,
                    requests_per_queue: 5,
                    max_concurrent: 1,
                    workers: 8,
                    crash_percent: 20,
                }),
                ..base(name)
            },
            _ => return None,
        };
        Some(preset)
    }

    /// Parses a workload file's text (format in the README, "Benchmarks").
    pub fn from_toml_str(text: &str) -> Result<Workload, WorkloadError> {
        let syntax = |e: toml::de::Error| WorkloadError::Syntax {
            message: e.to_string().trim_end().to_owned(),
        };
        let document = toml::Deserializer::parse(text).map_err(syntax)?;
        let file: WorkloadFile = serde_path_to_error::deserialize(document).map_err(shape_error)?;
        parse_workload(file)
    }

    /// Reads and parses a workload file.
    pub fn from_file(path: &std::path::Path) -> Result<Workload, WorkloadError> {
        let text = std::fs::read_to_string(path).map_err(|source| WorkloadError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Workload::from_toml_str(&text)
    }

    /// A preset if `name_or_path` names one, else the TOML file at that path.
    pub fn resolve(name_or_path: &str) -> Result<Workload, WorkloadError> {
        if let Some(preset) = Workload::preset(name_or_path) {
            return Ok(preset);
        }
        let path = std::path::Path::new(name_or_path);
        if path.exists() {
            return Workload::from_file(path);
        }
        Err(WorkloadError::UnknownPreset {
            name: name_or_path.to_owned(),
        })
    }

    /// Tokens in the initial wallets.
    pub fn token_count(&self) -> u64 {
        self.tokens.iter().map(|b| b.count).sum()
    }

    /// Select requests in total.
    pub fn request_count(&self) -> u64 {
        self.requests.iter().map(|b| b.count).sum()
    }
}

// The file format, as serde reads it: unknown keys are refused, and each error
// carries the path of the value that failed (`tokens[0].amount`). Ranges and ids
// are checked afterwards, naming the key too.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkloadFile {
    name: Option<String>,
    replicas: Option<u64>,
    concurrency: Option<u64>,
    legs: Option<u64>,
    retry_interval_ms: Option<u64>,
    time_scale: Option<u64>,
    #[serde(default)]
    tokens: Vec<TokenBlockFile>,
    #[serde(default)]
    requests: Vec<RequestBlockFile>,
    admission: Option<AdmissionFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenBlockFile {
    wallet: String,
    #[serde(rename = "type")]
    token_type: String,
    amount: AmountFile,
    count: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestBlockFile {
    wallet: String,
    #[serde(rename = "type")]
    token_type: String,
    amount: AmountFile,
    count: u64,
    #[serde(default)]
    mode: RequestMode,
}

/// `amount = "1..1000"`, `amount = "50"` or `amount = 50`.
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "an amount string (\"50\" or \"1..1000\") or a positive integer"
)]
enum AmountFile {
    Text(String),
    Number(u64),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdmissionFile {
    queues: Option<u64>,
    requests_per_queue: Option<u64>,
    max_concurrent: Option<u64>,
    workers: Option<u64>,
    crash_percent: Option<u64>,
}

/// A deserialization error as a [`WorkloadError`] naming the key: the path of the
/// value that failed, or for a missing field the table that lacks it plus the
/// field's name.
fn shape_error(e: serde_path_to_error::Error<toml::de::Error>) -> WorkloadError {
    let path = e.path().to_string();
    let message = e.into_inner().message().trim_end().to_owned();
    let field = |prefix: &str| {
        message
            .strip_prefix(prefix)
            .and_then(|rest| rest.split('`').next())
            .map(|name| match path.as_str() {
                "." | "" => name.to_owned(),
                parent => format!("{parent}.{name}"),
            })
    };
    if message.starts_with("unknown field `") {
        return WorkloadError::UnknownKey { key: path, message };
    }
    if let Some(key) = field("missing field `") {
        return WorkloadError::Missing { key, message };
    }
    WorkloadError::WrongType { key: path, message }
}

/// Checks `value` of `key` against `range`; absent keys take `default`.
fn ranged<T: TryFrom<u64>>(
    key: &str,
    value: Option<u64>,
    range: std::ops::RangeInclusive<u64>,
    default: u64,
) -> Result<T, WorkloadError> {
    let value = value.unwrap_or(default);
    if !range.contains(&value) {
        return Err(WorkloadError::Invalid {
            key: key.to_owned(),
            value: value.to_string(),
            expected: format!("expected {} to {}", range.start(), range.end()),
        });
    }
    T::try_from(value).map_err(|_| WorkloadError::Invalid {
        key: key.to_owned(),
        value: value.to_string(),
        expected: "expected a smaller number".to_owned(),
    })
}

fn id<T, E: std::fmt::Display>(
    key: String,
    text: &str,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> Result<T, WorkloadError> {
    parse(text).map_err(|e| WorkloadError::Invalid {
        key,
        value: format!("{text:?}"),
        expected: e.to_string(),
    })
}

impl AmountFile {
    fn spec(&self, key: &str) -> Result<AmountSpec, WorkloadError> {
        match self {
            AmountFile::Text(text) => AmountSpec::parse(key, text),
            AmountFile::Number(n) => AmountSpec::parse(key, &n.to_string()),
        }
    }
}

fn narrow_max(max: usize) -> u64 {
    u64::try_from(max).unwrap_or(u64::MAX)
}

fn parse_workload(file: WorkloadFile) -> Result<Workload, WorkloadError> {
    let mut tokens = Vec::new();
    for (i, block) in file.tokens.iter().enumerate() {
        let key = |name: &str| format!("tokens[{i}].{name}");
        tokens.push(TokenBlock {
            wallet: id(key("wallet"), &block.wallet, |t| WalletId::new(t))?,
            token_type: id(key("type"), &block.token_type, |t| TokenType::new(t))?,
            amount: block.amount.spec(&key("amount"))?,
            count: ranged(&key("count"), Some(block.count), 1..=MAX_ITEMS, 1)?,
        });
    }
    let mut requests = Vec::new();
    for (i, block) in file.requests.iter().enumerate() {
        let key = |name: &str| format!("requests[{i}].{name}");
        requests.push(RequestBlock {
            wallet: id(key("wallet"), &block.wallet, |t| WalletId::new(t))?,
            token_type: id(key("type"), &block.token_type, |t| TokenType::new(t))?,
            amount: block.amount.spec(&key("amount"))?,
            count: ranged(&key("count"), Some(block.count), 1..=MAX_ITEMS, 1)?,
            mode: block.mode,
        });
    }
    let admission = file
        .admission
        .map(|a| {
            Ok::<_, WorkloadError>(AdmissionLoad {
                queues: ranged("admission.queues", a.queues, 1..=100_000, 100)?,
                requests_per_queue: ranged(
                    "admission.requests_per_queue",
                    a.requests_per_queue,
                    1..=10_000,
                    5,
                )?,
                max_concurrent: ranged("admission.max_concurrent", a.max_concurrent, 1..=1000, 1)?,
                workers: ranged(
                    "admission.workers",
                    a.workers,
                    1..=narrow_max(MAX_CONCURRENCY),
                    8,
                )?,
                crash_percent: ranged("admission.crash_percent", a.crash_percent, 0..=90, 20)?,
            })
        })
        .transpose()?;
    let workload = Workload {
        name: file.name.unwrap_or_else(|| "custom".to_owned()),
        replicas: ranged("replicas", file.replicas, 1..=narrow_max(MAX_REPLICAS), 1)?,
        concurrency: ranged(
            "concurrency",
            file.concurrency,
            1..=narrow_max(MAX_CONCURRENCY),
            8,
        )?,
        legs: file
            .legs
            .map(|legs| ranged("legs", Some(legs), 1..=1000, 1))
            .transpose()?,
        retry_interval_ms: ranged(
            "retry_interval_ms",
            file.retry_interval_ms,
            1..=3_600_000,
            DEFAULT_RETRY_INTERVAL_MS,
        )?,
        time_scale: ranged(
            "time_scale",
            file.time_scale,
            1..=100_000,
            u64::from(DEFAULT_TIME_SCALE),
        )?,
        tokens,
        requests,
        admission,
    };
    for (key, total) in [
        ("tokens", workload.token_count()),
        ("requests", workload.request_count()),
    ] {
        if total > MAX_ITEMS {
            return Err(WorkloadError::Invalid {
                key: key.to_owned(),
                value: total.to_string(),
                expected: format!("expected at most {MAX_ITEMS} in total"),
            });
        }
    }
    match (&workload.admission, workload.requests.is_empty()) {
        (Some(_), false) => Err(WorkloadError::Invalid {
            key: "admission".to_owned(),
            value: "[admission] with [[requests]]".to_owned(),
            expected: "expected either [admission] or [[tokens]]/[[requests]] blocks, not both"
                .to_owned(),
        }),
        (None, true) => Err(WorkloadError::Missing {
            key: "requests".to_owned(),
            message: "expected at least one [[requests]] block (or an [admission] table)"
                .to_owned(),
        }),
        _ => Ok(workload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_resolves() {
        for name in PRESETS {
            let w = Workload::preset(name).unwrap_or_else(|| panic!("preset {name}"));
            assert_eq!(w.name, *name);
        }
        assert_eq!(
            Workload::preset("hot-lineage").map(|w| (w.token_count(), w.request_count())),
            Some((5, 300))
        );
    }

    #[test]
    fn many_wallets_spreads_small_settled_requests_over_distinct_wallets() {
        let w = Workload::preset("many-wallets").expect("preset");
        assert_eq!(w.token_count(), 64 * 400);
        assert_eq!(w.request_count(), 64 * 96);
        let wallets: std::collections::HashSet<_> =
            w.tokens.iter().map(|b| b.wallet.clone()).collect();
        assert_eq!(wallets.len(), 64);
        assert!(w.requests.iter().all(|r| wallets.contains(&r.wallet)));
        assert!(w.requests.iter().all(|r| r.mode == RequestMode::Settle));
        // Requests of 1..100 against tokens of 1..1000: small against most tokens,
        // with some tokens smaller than the request, as in a wallet holding change.
        let range = |a: AmountSpec| match a {
            AmountSpec::Range { low, high } => (low.value(), high.value()),
            AmountSpec::Fixed(q) => (q.value(), q.value()),
        };
        let smallest = w.tokens.iter().map(|b| range(b.amount).0).min();
        let largest_ask = w.requests.iter().map(|r| range(r.amount).1).max();
        assert_eq!((smallest, largest_ask), (Some(1), Some(100)));
    }

    #[test]
    fn hot_wallets_keeps_the_default_backoff_and_pays_mostly_from_three_hot_wallets() {
        let w = Workload::preset("hot-wallets").expect("preset");
        assert_eq!((w.replicas, w.concurrency), (3, 96));
        // The true defaults: the configuration's legs and its 5 s interval, not
        // the short budget of the other token presets.
        let defaults = SelectionConfig::default();
        assert_eq!(w.legs, None);
        assert_eq!(
            u128::from(w.retry_interval_ms),
            defaults.retry_interval.as_millis()
        );
        assert_eq!(w.token_count(), 3 * 200 + 40 * 10);
        let hot: Vec<_> = w.tokens.iter().filter(|b| b.count == 200).collect();
        assert_eq!(hot.len(), 3);
        assert!(
            hot.iter()
                .all(|b| b.amount == AmountSpec::parse("a", "1000").expect("amount"))
        );
        let hot_requests: u64 = w
            .requests
            .iter()
            .filter(|r| hot.iter().any(|b| b.wallet == r.wallet))
            .map(|r| r.count)
            .sum();
        assert!(hot_requests * 2 > w.request_count(), "mostly hot");
        assert!(w.requests.iter().all(|r| r.mode == RequestMode::Settle
            && r.amount == AmountSpec::parse("a", "1..10").expect("amount")));
    }

    #[test]
    fn amounts_parse_fixed_and_ranges() {
        assert!(matches!(
            AmountSpec::parse("a", "50"),
            Ok(AmountSpec::Fixed(q)) if q.value() == 50
        ));
        assert!(matches!(
            AmountSpec::parse("a", "1..1000"),
            Ok(AmountSpec::Range { low, high }) if low.value() == 1 && high.value() == 1000
        ));
        for bad in ["0", "-1", "5..2", "x", "1..", ""] {
            assert!(
                matches!(AmountSpec::parse("tokens[0].amount", bad), Err(WorkloadError::Invalid { ref key, .. }) if key == "tokens[0].amount"),
                "{bad}"
            );
        }
    }
}
