//! Workloads: what a simulation runs. A workload is a wallet layout (token blocks),
//! a request mix (request blocks) and how hard to drive it (replicas, concurrency,
//! legs); or, for `admission`, build queues with injected crashes.
//!
//! Workloads come from the presets ([`Workload::preset`]) or from a TOML file
//! ([`Workload::from_toml_str`]) whose format is documented in the README
//! ("Benchmarks"). Every parse error is a [`WorkloadError`] naming the key
//! (`tokens[1].amount`) and what was expected.

use holdfast_domain::{Precision, Quantity, TokenType, WalletId};
use rand::Rng;
use rand::rngs::StdRng;

/// The preset names, in the order `--help` lists them.
pub const PRESETS: &[&str] = &["hot-lineage", "pareto", "dust", "big-wallet", "admission"];

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
    #[error("workload key {key} is missing; expected {expected}")]
    Missing {
        /// The key, as a path (`tokens[0].wallet`).
        key: String,
        /// What was expected.
        expected: &'static str,
    },
    /// A key has a value of the wrong TOML type.
    #[error("workload key {key} is a {found}; expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// The TOML type found.
        found: &'static str,
        /// What was expected.
        expected: &'static str,
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
    #[error("unknown workload key {key}; expected one of {expected}")]
    UnknownKey {
        /// The key.
        key: String,
        /// The keys accepted at that place.
        expected: &'static str,
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

/// What a request does with the tokens it selected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestMode {
    /// Confirm the transaction: the tokens are spent and their locks released; a
    /// non-zero change is minted back to the wallet as a new token (new tx id).
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
    /// Backoff legs per select; `None` keeps the configuration's `max_retries`.
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
        let table: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| WorkloadError::Syntax {
                    message: e.to_string().trim_end().to_owned(),
                })?;
        parse_workload(&table)
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

const TOP_KEYS: &str =
    "name, replicas, concurrency, legs, retry_interval_ms, time_scale, tokens, requests, admission";
const TOKEN_KEYS: &str = "wallet, type, amount, count";
const REQUEST_KEYS: &str = "wallet, type, amount, count, mode";
const ADMISSION_KEYS: &str = "queues, requests_per_queue, max_concurrent, workers, crash_percent";

fn type_name(value: &toml::Value) -> &'static str {
    match value {
        toml::Value::String(_) => "string",
        toml::Value::Integer(_) => "integer",
        toml::Value::Float(_) => "float",
        toml::Value::Boolean(_) => "boolean",
        toml::Value::Datetime(_) => "datetime",
        toml::Value::Array(_) => "array",
        toml::Value::Table(_) => "table",
    }
}

fn check_keys(
    table: &toml::Table,
    prefix: &str,
    allowed: &'static str,
) -> Result<(), WorkloadError> {
    for key in table.keys() {
        if !allowed.split(", ").any(|a| a == key) {
            return Err(WorkloadError::UnknownKey {
                key: format!("{prefix}{key}"),
                expected: allowed,
            });
        }
    }
    Ok(())
}

fn string<'a>(
    table: &'a toml::Table,
    prefix: &str,
    key: &str,
    expected: &'static str,
) -> Result<Option<&'a str>, WorkloadError> {
    match table.get(key) {
        None => Ok(None),
        Some(toml::Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(WorkloadError::WrongType {
            key: format!("{prefix}{key}"),
            found: type_name(other),
            expected,
        }),
    }
}

fn required_string<'a>(
    table: &'a toml::Table,
    prefix: &str,
    key: &str,
    expected: &'static str,
) -> Result<&'a str, WorkloadError> {
    string(table, prefix, key, expected)?.ok_or_else(|| WorkloadError::Missing {
        key: format!("{prefix}{key}"),
        expected,
    })
}

fn integer(
    table: &toml::Table,
    prefix: &str,
    key: &str,
    range: std::ops::RangeInclusive<u64>,
) -> Result<Option<u64>, WorkloadError> {
    let full = format!("{prefix}{key}");
    let value = match table.get(key) {
        None => return Ok(None),
        Some(toml::Value::Integer(i)) => *i,
        Some(other) => {
            return Err(WorkloadError::WrongType {
                key: full,
                found: type_name(other),
                expected: "an integer",
            });
        }
    };
    match u64::try_from(value) {
        Ok(v) if range.contains(&v) => Ok(Some(v)),
        _ => Err(WorkloadError::Invalid {
            key: full,
            value: value.to_string(),
            expected: format!("expected {} to {}", range.start(), range.end()),
        }),
    }
}

fn required_integer(
    table: &toml::Table,
    prefix: &str,
    key: &str,
    range: std::ops::RangeInclusive<u64>,
) -> Result<u64, WorkloadError> {
    integer(table, prefix, key, range)?.ok_or_else(|| WorkloadError::Missing {
        key: format!("{prefix}{key}"),
        expected: "an integer",
    })
}

fn narrow<T: TryFrom<u64>>(value: u64, key: &str) -> Result<T, WorkloadError> {
    T::try_from(value).map_err(|_| WorkloadError::Invalid {
        key: key.to_owned(),
        value: value.to_string(),
        expected: "expected a smaller number".to_owned(),
    })
}

fn blocks<'a>(
    table: &'a toml::Table,
    key: &str,
) -> Result<Vec<(String, &'a toml::Table)>, WorkloadError> {
    match table.get(key) {
        None => Ok(Vec::new()),
        Some(toml::Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                toml::Value::Table(t) => Ok((format!("{key}[{i}]."), t)),
                other => Err(WorkloadError::WrongType {
                    key: format!("{key}[{i}]"),
                    found: type_name(other),
                    expected: "a table ([[tokens]] / [[requests]] block)",
                }),
            })
            .collect(),
        Some(other) => Err(WorkloadError::WrongType {
            key: key.to_owned(),
            found: type_name(other),
            expected: "an array of tables ([[tokens]] / [[requests]] blocks)",
        }),
    }
}

fn wallet_and_type(
    table: &toml::Table,
    prefix: &str,
) -> Result<(WalletId, TokenType), WorkloadError> {
    let wallet_text = required_string(table, prefix, "wallet", "a wallet id string")?;
    let wallet = WalletId::new(wallet_text).map_err(|e| WorkloadError::Invalid {
        key: format!("{prefix}wallet"),
        value: format!("{wallet_text:?}"),
        expected: e.to_string(),
    })?;
    let type_text = required_string(table, prefix, "type", "a token type string")?;
    let token_type = TokenType::new(type_text).map_err(|e| WorkloadError::Invalid {
        key: format!("{prefix}type"),
        value: format!("{type_text:?}"),
        expected: e.to_string(),
    })?;
    Ok((wallet, token_type))
}

fn amount(table: &toml::Table, prefix: &str) -> Result<AmountSpec, WorkloadError> {
    let key = format!("{prefix}amount");
    match table.get("amount") {
        None => Err(WorkloadError::Missing {
            key,
            expected: "an amount string (\"50\" or \"1..1000\")",
        }),
        Some(toml::Value::String(s)) => AmountSpec::parse(&key, s),
        Some(toml::Value::Integer(i)) => AmountSpec::parse(&key, &i.to_string()),
        Some(other) => Err(WorkloadError::WrongType {
            key,
            found: type_name(other),
            expected: "an amount string (\"50\" or \"1..1000\")",
        }),
    }
}

fn parse_workload(table: &toml::Table) -> Result<Workload, WorkloadError> {
    check_keys(table, "", TOP_KEYS)?;
    let name = string(table, "", "name", "a string")?
        .unwrap_or("custom")
        .to_owned();
    let replicas = integer(table, "", "replicas", 1..=narrow_max(MAX_REPLICAS))?.unwrap_or(1);
    let concurrency =
        integer(table, "", "concurrency", 1..=narrow_max(MAX_CONCURRENCY))?.unwrap_or(8);
    let legs = integer(table, "", "legs", 1..=1000)?
        .map(|l| narrow::<u32>(l, "legs"))
        .transpose()?;
    let retry_interval_ms = integer(table, "", "retry_interval_ms", 1..=3_600_000)?
        .unwrap_or(DEFAULT_RETRY_INTERVAL_MS);
    let time_scale = narrow::<u32>(
        integer(table, "", "time_scale", 1..=100_000)?.unwrap_or(u64::from(DEFAULT_TIME_SCALE)),
        "time_scale",
    )?;
    let mut tokens = Vec::new();
    for (prefix, block) in blocks(table, "tokens")? {
        check_keys(block, &prefix, TOKEN_KEYS)?;
        let (wallet, token_type) = wallet_and_type(block, &prefix)?;
        tokens.push(TokenBlock {
            wallet,
            token_type,
            amount: amount(block, &prefix)?,
            count: required_integer(block, &prefix, "count", 1..=MAX_ITEMS)?,
        });
    }
    let mut requests = Vec::new();
    for (prefix, block) in blocks(table, "requests")? {
        check_keys(block, &prefix, REQUEST_KEYS)?;
        let (wallet, token_type) = wallet_and_type(block, &prefix)?;
        let mode = match string(block, &prefix, "mode", "\"settle\", \"unlock\" or \"hold\"")? {
            None | Some("settle") => RequestMode::Settle,
            Some("unlock") => RequestMode::Unlock,
            Some("hold") => RequestMode::Hold,
            Some(other) => {
                return Err(WorkloadError::Invalid {
                    key: format!("{prefix}mode"),
                    value: format!("{other:?}"),
                    expected: "expected \"settle\", \"unlock\" or \"hold\"".to_owned(),
                });
            }
        };
        requests.push(RequestBlock {
            wallet,
            token_type,
            amount: amount(block, &prefix)?,
            count: required_integer(block, &prefix, "count", 1..=MAX_ITEMS)?,
            mode,
        });
    }
    let admission = match table.get("admission") {
        None => None,
        Some(toml::Value::Table(t)) => Some(parse_admission(t)?),
        Some(other) => {
            return Err(WorkloadError::WrongType {
                key: "admission".to_owned(),
                found: type_name(other),
                expected: "a table ([admission])",
            });
        }
    };
    let workload = Workload {
        name,
        replicas: narrow(replicas, "replicas")?,
        concurrency: narrow(concurrency, "concurrency")?,
        legs,
        retry_interval_ms,
        time_scale,
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
            expected: "at least one [[requests]] block (or an [admission] table)",
        }),
        _ => Ok(workload),
    }
}

fn narrow_max(max: usize) -> u64 {
    u64::try_from(max).unwrap_or(u64::MAX)
}

fn parse_admission(table: &toml::Table) -> Result<AdmissionLoad, WorkloadError> {
    let p = "admission.";
    check_keys(table, p, ADMISSION_KEYS)?;
    Ok(AdmissionLoad {
        queues: narrow(
            integer(table, p, "queues", 1..=100_000)?.unwrap_or(100),
            "admission.queues",
        )?,
        requests_per_queue: narrow(
            integer(table, p, "requests_per_queue", 1..=10_000)?.unwrap_or(5),
            "admission.requests_per_queue",
        )?,
        max_concurrent: narrow(
            integer(table, p, "max_concurrent", 1..=1000)?.unwrap_or(1),
            "admission.max_concurrent",
        )?,
        workers: narrow(
            integer(table, p, "workers", 1..=narrow_max(MAX_CONCURRENCY))?.unwrap_or(8),
            "admission.workers",
        )?,
        crash_percent: narrow(
            integer(table, p, "crash_percent", 0..=90)?.unwrap_or(20),
            "admission.crash_percent",
        )?,
    })
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
