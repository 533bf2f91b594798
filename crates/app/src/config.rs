//! The configuration of a holdfast process: one plain [`Config`] with documented
//! defaults, loaded from a TOML file and `HOLDFAST_*` environment variables (the
//! environment overrides the file), then validated with errors that name the key.
//! `DATABASE_URL` is the fallback for `db_url`: used when neither `HOLDFAST_DB`
//! nor the file sets it. An unknown `HOLDFAST_*` variable is not an error, so a
//! service may keep settings of its own under the prefix: [`Config::apply_env`]
//! returns it, [`Config::unknown_env`] lists those of the process, and the
//! process-environment loaders ([`Config::from_env`], [`Config::load`]) log a
//! warning naming it (and the variable it is likely a typo of).
//!
//! # File format
//!
//! Durations are whole milliseconds in keys ending in `_ms`. Unknown keys are an
//! error naming the key. Every key is optional.
//!
//! ```toml
//! db_url = "sqlite://holdfast.db"
//! seed = 42                     # replayable selection randomness
//!
//! [selection]
//! sufficiency_window = 4
//! max_backoff_ms = 5000        # each backoff between legs is uniform in [0, this)
//! deadline_ms = 30000          # the longest one select takes, every wait included
//!
//! [lease]
//! lease_expiry_ms = 180000
//!
//! [admission]                   # the default of every queue
//! max_concurrent = 1            # stored with a new queue; `queue set-limit` changes it
//! gate_wait_delay_ms = 5000
//! slot_lease_ms = 7200000       # an owner without a heartbeat this long is failed
//! resume_after_ms = 60000       # a build without a heartbeat this long is published again
//!
//! [admission.queues."monorepo/main"]   # a per-queue override
//! max_concurrent = 4
//! slot_lease_ms = 21600000
//! ```
//!
//! The table of every key, its environment variable, default and meaning is
//! [`KEYS`]; that of the per-queue overrides, declared with [`QueueOverride`], is
//! [`QUEUE_KEYS`]. `docs/configuration.md` is generated from both by
//! [`reference_markdown`]. Per-queue overrides exist only in the file.

use std::collections::BTreeMap;
use std::fmt::Write as _;
#[cfg(feature = "config-file")]
use std::path::Path;
use std::time::Duration;

use holdfast_domain::{
    AdmissionConfig, LeaseConfig, PersistPolicy, Precision, QueueName, SelectionConfig,
    SelectionPolicy,
};
use holdfast_ports::LockStrategy;
use serde::Deserialize;

use crate::error::ErrorKind;

/// Environment variables with the `HOLDFAST_` prefix that are not configuration
/// keys but are reserved for the command (so [`Config::apply_env`] does not report
/// them as unknown).
pub const RESERVED_ENV: &[&str] = &[
    "HOLDFAST_CONFIG",
    "HOLDFAST_LOG",
    "HOLDFAST_JSON",
    // Set by `cargo xtask` and the test harnesses, never configuration.
    "HOLDFAST_PG_BIN",
    "HOLDFAST_PG_SKIP",
    "HOLDFAST_PG_TALLY",
    "HOLDFAST_FAULTS_SEED",
    "HOLDFAST_FAULTS_CHILD",
    "HOLDFAST_FUZZ_CASES",
    "HOLDFAST_FUZZ_SECONDS",
    "HOLDFAST_FAILPOINT",
];

/// Declares a settings struct from one list: each key's field, type, default,
/// environment variable and meaning, written once. It gives the struct (the
/// meaning as the field's doc), its `Default`, and `$keys`, the entries of
/// [`KEYS`] (key, variable, meaning, get, set) the environment and the reference
/// read. `on |c| place` says where the struct sits in a [`Config`]; `extra` fields
/// (sections, per-queue tables) are not keys themselves.
macro_rules! settings {
    (
        $(#[$smeta:meta])*
        pub struct $name:ident, on |$c:ident| $place:expr, prefix $prefix:literal, keys $keys:ident {
            $(
                $(#[$fmeta:meta])*
                $field:ident: $ty:ty = $default:expr, $env:literal, $meaning:literal;
            )*
        }
        $(extra {
            $( $(#[$xmeta:meta])* $xfield:ident: $xty:ty = $xdefault:expr; )*
        })?
    ) => {
        $(#[$smeta])*
        #[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct $name {
            $(#[doc = $meaning] $(#[$fmeta])* pub $field: $ty,)*
            $($($(#[$xmeta])* pub $xfield: $xty,)*)?
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    $($field: $default,)*
                    $($($xfield: $xdefault,)*)?
                }
            }
        }

        /// The keys of this struct, in the order of the reference.
        const $keys: &[KeySpec] = &[$(KeySpec {
            key: concat!($prefix, stringify!($field)),
            env: $env,
            meaning: $meaning,
            get: |$c: &Config| EnvValue::show(&$place.$field),
            set: |$c: &mut Config, text: &str| {
                $place.$field = EnvValue::parse_env(text)?;
                Ok(())
            },
        },)*];
    };
}

settings! {
    /// The whole configuration. Plain data with public fields; [`Config::validate`]
    /// checks it, and the typed accessors ([`Config::selection_config`], ...) convert
    /// it into the domain's settings.
    pub struct Config, on |c| c, prefix "", keys ROOT_KEYS {
        db_url: String = crate::backend::DEFAULT_DB_URL.to_owned(), "HOLDFAST_DB",
            "Database: `sqlite://path`, `sqlite::memory:` or `postgres://user@host/db`. `HOLDFAST_DB` overrides the file; a non-empty `DATABASE_URL` is the fallback, used only when neither `HOLDFAST_DB` nor the file sets it.";
        connect_timeout_ms: u64 = 10_000, "HOLDFAST_CONNECT_TIMEOUT_MS",
            "How long to wait for a database connection (1 to 3600000 ms).";
        busy_timeout_ms: u64 = 5_000, "HOLDFAST_BUSY_TIMEOUT_MS",
            "SQLite: how long a write waits for another writer before failing as busy; after one such wait, later writes only probe briefly until a write gets the lock, so a whole select fails within about one busy timeout (`docs/sqlite.md`) (1 to 3600000 ms).";
        #[serde(deserialize_with = "de_strategy")]
        pg_lock_strategy: LockStrategy = LockStrategy::default(), "HOLDFAST_PG_LOCK_STRATEGY",
            "PostgreSQL: how a claim loses a race: `insert`, `on_conflict` or `skip_locked`.";
        owner: String = String::new(), "HOLDFAST_OWNER",
            "The owner id this instance records on its locks and selections: at start-up it recovers its own unsettled transactions and nobody else's. Give every replica a stable id of its own; empty derives one from the host name (logged).";
        seed: Option<u64> = None, "HOLDFAST_SEED",
            "Seed of the selection randomness, so runs replay; unset seeds from the OS.";
        precision: u8 = 64, "HOLDFAST_PRECISION",
            "Bits of token quantities (1 to 128); larger amounts are refused.";
    }
    extra {
        /// PostgreSQL: the pool and the settings of every session.
        postgres: PostgresSection = PostgresSection::default();
        /// Token selection.
        selection: SelectionSection = SelectionSection::default();
        /// The lock lease.
        lease: LeaseSection = LeaseSection::default();
        /// Settlement status persistence.
        settlement: SettlementSection = SettlementSection::default();
        /// Build-slot admission.
        admission: AdmissionSection = AdmissionSection::default();
        /// The deprecated names ([`ALIASES`]) this configuration was read with:
        /// the loaders warn about each, and an error about such a key names it
        /// as it was written. Not part of the configuration's value: equality
        /// ignores it.
        #[serde(skip)]
        deprecated_names: DeprecatedNames = DeprecatedNames::default();
    }
}

// The defaults of the PostgreSQL adapter are written out here so the
// configuration does not need the adapter compiled in; a test checks they agree.
settings! {
    /// `[postgres]`: the pool and the session settings of the PostgreSQL backend
    /// (`docs/postgres-sessions.md` says why each matters). Durations in ms.
    pub struct PostgresSection, on |c| c.postgres, prefix "postgres.", keys POSTGRES_KEYS {
        max_connections: u32 = 10, "HOLDFAST_PG_MAX_CONNECTIONS",
            "PostgreSQL: the most connections one instance's pool opens (at least 1). A fleet needs replicas x this within the server's `max_connections`; beyond it calls wait, then fail as unavailable, and are retried.";
        min_connections: u32 = 0, "HOLDFAST_PG_MIN_CONNECTIONS",
            "PostgreSQL: connections kept open while idle (at most `postgres.max_connections`).";
        acquire_timeout_ms: u64 = 10_000, "HOLDFAST_PG_ACQUIRE_TIMEOUT_MS",
            "PostgreSQL: how long a call waits for a pooled connection, or for a new one while the server refuses them, before failing as unavailable (1 to 3600000 ms).";
        idle_timeout_ms: u64 = 60_000, "HOLDFAST_PG_IDLE_TIMEOUT_MS",
            "PostgreSQL: an idle connection above the minimum is closed after this long (1 to 3600000 ms).";
        max_lifetime_ms: u64 = 1_800_000, "HOLDFAST_PG_MAX_LIFETIME_MS",
            "PostgreSQL: a connection is closed and replaced after this long (1 ms to one day).";
        line_wait_ms: u64 = 50, "HOLDFAST_PG_LINE_WAIT_MS",
            "PostgreSQL: how long a read-and-claim waits for its wallet and type's advisory lock before it reads and claims without it, which is always correct (1 to 3600000 ms).";
        lock_timeout_ms: u64 = 1_000, "HOLDFAST_PG_LOCK_TIMEOUT_MS",
            "PostgreSQL: every session's `lock_timeout`: the longest wait for a row lock, then the statement fails busy and the select retries (1 to 3600000 ms).";
        statement_timeout_ms: u64 = 30_000, "HOLDFAST_PG_STATEMENT_TIMEOUT_MS",
            "PostgreSQL: every session's `statement_timeout` (1 to 3600000 ms).";
        idle_in_transaction_timeout_ms: u64 = 5_000, "HOLDFAST_PG_IDLE_IN_TRANSACTION_TIMEOUT_MS",
            "PostgreSQL: every session's `idle_in_transaction_session_timeout`: the server ends a session that sits inside a transaction this long (a frozen replica), releasing its locks (1 to 3600000 ms).";
        keepalive_idle_ms: u64 = 10_000, "HOLDFAST_PG_KEEPALIVE_IDLE_MS",
            "PostgreSQL: every session's `tcp_keepalives_idle` (whole seconds): the server probes a silent client after this long and ends the session of one that vanished (1000 to 3600000 ms).";
        wake_where_waited: bool = true, "HOLDFAST_PG_WAKE_WHERE_WAITED",
            "PostgreSQL: send a freed key (`NOTIFY`) only to instances that announced a wait on it; false sends every freed key, as instances of earlier versions do (set it on the new instances during a rolling upgrade from such a version, whose waiters announce nothing).";
    }
}

/// The longest connection lifetime: one day.
pub const MAX_LIFETIME_MS: u64 = 86_400_000;

/// Declares a settings section that stands for one of the domain's settings
/// structs, one line per setting: the section's field and type, the domain field
/// it stands for (`= .field`; its default is the domain's), its variable, its
/// meaning, optionally the accepted range in the section's units (`range`, where
/// the domain states it in its own, as for durations) and the names it had
/// before (`formerly "key" "VARIABLE"`, still accepted with a warning). It
/// expands to [`settings!`] (the struct, its `Default`, `$keys`), `to_domain`
/// (the conversion, which names every domain field, so a field the domain adds
/// fails to compile until it is declared here), `key_of` (a domain field's key,
/// for errors) and `$aliases`, the entries of [`ALIASES`].
macro_rules! domain_settings {
    (
        $(#[$smeta:meta])*
        pub struct $name:ident for $domain:ident, on |$c:ident| $place:expr, prefix $prefix:literal, keys $keys:ident, aliases $aliases:ident {
            $(
                $(#[$fmeta:meta])*
                $field:ident: $ty:ty = .$dfield:ident, $env:literal, $meaning:literal
                    $(, range $range:literal)? $(, formerly $old:literal $old_env:literal)?;
            )*
        }
    ) => {
        settings! {
            $(#[$smeta])*
            pub struct $name, on |$c| $place, prefix $prefix, keys $keys {
                $(
                    $(#[$fmeta])* $(#[serde(alias = $old)])?
                    $field: $ty = DomainValue::from_domain($domain::default().$dfield), $env, $meaning;
                )*
            }
        }

        impl $name {
            /// The domain's settings this section stands for.
            pub fn to_domain(&self) -> $domain {
                $domain {
                    $($dfield: DomainValue::to_domain(&self.$field),)*
                }
            }

            /// The key, value (as the section holds it) and accepted range (if
            /// the section states it in units of its own) of the setting that
            /// stands for the domain field `domain_field`.
            fn key_of(&self, domain_field: &str) -> Option<(&'static str, String, Option<&'static str>)> {
                $(
                    if domain_field == stringify!($dfield) {
                        let range: Option<&'static str> = None $(.or(Some($range)))?;
                        return Some((concat!($prefix, stringify!($field)), EnvValue::show(&self.$field), range));
                    }
                )*
                None
            }
        }

        /// The renamed keys of this section.
        const $aliases: &[Alias] = &[$($(Alias {
            old_key: concat!($prefix, $old),
            old_env: $old_env,
            key: concat!($prefix, stringify!($field)),
            env: $env,
        },)?)*];
    };
}

/// A section's value that stands for a domain value: the same value, or whole
/// milliseconds for a [`Duration`].
trait DomainValue<D> {
    fn from_domain(value: D) -> Self;
    fn to_domain(&self) -> D;
}

impl<T: Clone> DomainValue<T> for T {
    fn from_domain(value: T) -> Self {
        value
    }
    fn to_domain(&self) -> T {
        self.clone()
    }
}

impl DomainValue<Duration> for u64 {
    fn from_domain(value: Duration) -> Self {
        millis(value)
    }
    fn to_domain(&self) -> Duration {
        Duration::from_millis(*self)
    }
}

domain_settings! {
    /// `[selection]`: see [`SelectionConfig`] for each field; [`Config::selection_config`]
    /// converts it.
    pub struct SelectionSection for SelectionConfig, on |c| c.selection, prefix "selection.", keys SELECTION_KEYS, aliases SELECTION_ALIASES {
        #[serde(deserialize_with = "de_policy")]
        policy: SelectionPolicy = .policy, "HOLDFAST_SELECTION_POLICY",
            "`cover_first`: few inputs (one near-sized token, else a few of the largest smaller ones); `smallest_first`: the upstream order.";
        cover_band: usize = .cover_band, "HOLDFAST_COVER_BAND",
            "`cover_first`: candidates at least as large as the amount read per select, smallest first (1 to 256).";
        prefer_exact: bool = .prefer_exact, "HOLDFAST_PREFER_EXACT",
            "`cover_first`: prefer a token, or a pair or triple of smaller ones, that sums to the amount exactly (no change), of the fewest inputs.";
        consolidate_dust: usize = .consolidate_dust, "HOLDFAST_CONSOLIDATE_DUST",
            "`cover_first`: add up to this many of the smallest candidates as optional inputs (0 to 64).";
        tidy_band: usize = .tidy_band, "HOLDFAST_TIDY_BAND",
            "`cover_first`: with no other select of this instance on the wallet, read up to this many candidates below the amount and prefer an exact choice with the most inputs, up to 3 (0 turns it off; 0 to 10000).";
        sufficiency_window: usize = .sufficiency_window, "HOLDFAST_SUFFICIENCY_WINDOW",
            "Candidates in the sufficiency window, anchor included; one is picked at random (1 to 256).";
        max_sufficiency_ratio: u32 = .max_sufficiency_ratio, "HOLDFAST_MAX_SUFFICIENCY_RATIO",
            "A window member is at most this many times the anchor (at least 1).";
        batch_window: usize = .batch_window, "HOLDFAST_BATCH_WINDOW",
            "The most tokens one claim names in one round trip (1 to 256).";
        max_inputs: usize = .max_inputs, "HOLDFAST_MAX_INPUTS",
            "The most tokens one select returns; an amount the free tokens cannot cover within it answers TooManyInputs (1 to 256).";
        page_size: usize = .page_size, "HOLDFAST_PAGE_SIZE",
            "Candidates per fetch; under `cover_first` the fill band, candidates smaller than the amount (1 to 10000).";
        max_immediate_retries: u32 = .max_immediate_retries, "HOLDFAST_MAX_IMMEDIATE_RETRIES",
            "Refetches without a won lock in one leg before it ends (0 to 1000).";
        max_legs: u32 = .max_retries, "HOLDFAST_MAX_LEGS",
            "Legs of one select, the first included; then FundsLocked (1 to 1000).",
            formerly "max_retries" "HOLDFAST_MAX_RETRIES";
        max_backoff_ms: u64 = .retry_interval, "HOLDFAST_MAX_BACKOFF_MS",
            "The bound of the backoff between legs: each backoff is uniform in [0, this) (1 to 3600000 ms).",
            range "1 to 3600000 ms", formerly "retry_interval_ms" "HOLDFAST_RETRY_INTERVAL_MS";
        deadline_ms: u64 = .deadline, "HOLDFAST_SELECT_DEADLINE_MS",
            "The longest one select takes, every wait included: a pooled connection, the wallet's line, each store call, the backoffs and wake-up waits (legs bound retries, not time). At it the select answers `FundsLocked` if it saw enough funds held by others, else `DeadlineExceeded` (both: retry later), and gives back what it holds (`docs/selection.md`) (1 to 3600000 ms).",
            range "1 to 3600000 ms";
        wakeups: bool = .wakeups, "HOLDFAST_WAKEUPS",
            "A waiting select (and a held head) is woken when tokens (a slot) are freed, the backoff staying the upper bound; on PostgreSQL instances tell each other with NOTIFY. False sleeps the whole backoff.";
        snapshot_ttl_ms: u64 = .snapshot_ttl, "HOLDFAST_SNAPSHOT_TTL_MS",
            "How long the instance's snapshot of a wallet answers the first read of a select beside other selects of the instance on that wallet, instead of a round trip; claims verify every token, and insufficient funds always comes from a fresh balance read (0 reads the store always; 0 to 60000 ms).",
            range "0 to 60000 ms";
        blacklist: bool = .blacklist, "HOLDFAST_BLACKLIST",
            "Skip tokens that lost a race or were stale for the rest of a select.";
        ascending: bool = .ascending, "HOLDFAST_ASCENDING",
            "`smallest_first`: scan candidates smallest first (false only to measure what ordering buys).";
    }
}

settings! {
    /// `[lease]`: see [`LeaseConfig`].
    pub struct LeaseSection, on |c| c.lease, prefix "lease.", keys LEASE_KEYS {
        lease_expiry_ms: u64 = millis(LeaseConfig::default().lease_expiry), "HOLDFAST_LEASE_EXPIRY_MS",
            "The sweeper deletes locks older than this (more than 0 ms).";
        cleanup_period_ms: u64 = millis(LeaseConfig::default().cleanup_period), "HOLDFAST_CLEANUP_PERIOD_MS",
            "How often the lease sweeper runs (more than 0 ms).";
    }
}

settings! {
    /// `[settlement]`: see [`PersistPolicy`].
    pub struct SettlementSection, on |c| c.settlement, prefix "settlement.", keys SETTLEMENT_KEYS {
        persist_max_attempts: u32 = PersistPolicy::default().max_attempts, "HOLDFAST_PERSIST_MAX_ATTEMPTS",
            "Attempts to record a final status; when exhausted the locks are released anyway, once (at least 1).";
        persist_initial_backoff_ms: u64 = millis(PersistPolicy::default().initial_backoff), "HOLDFAST_PERSIST_INITIAL_BACKOFF_MS",
            "Backoff after the first failed status write, doubling per attempt (0 to 3600000 ms).";
    }
}

settings! {
    /// `[admission]`: the default of every queue, per-queue overrides, and the bound
    /// on compare-and-set conflicts per step.
    pub struct AdmissionSection, on |c| c.admission, prefix "admission.", keys ADMISSION_KEYS {
        max_concurrent: u32 = AdmissionConfig::default().max_concurrent, "HOLDFAST_MAX_CONCURRENT",
            "Build slots of a new queue unless overridden in `[admission.queues.\"<name>\"]` (at least 1); stored with the queue at its first request, then changed only by `holdfast queue set-limit`.";
        gate_wait_delay_ms: u64 = millis(AdmissionConfig::default().gate_wait_delay), "HOLDFAST_GATE_WAIT_DELAY_MS",
            "How long a request is held when the gate is closed, unless overridden per queue (1 to 3600000 ms).";
        slot_lease_ms: u64 = millis(AdmissionConfig::default().slot_lease), "HOLDFAST_SLOT_LEASE_MS",
            "How long a slot owner keeps its slot without a heartbeat (`holdfast queue heartbeat`); then reconcile fails it with `slot_lease_expired` and frees the slot. Overridable per queue (1 ms to 30 days).";
        resume_after_ms: u64 = millis(AdmissionConfig::default().resume_after), "HOLDFAST_RESUME_AFTER_MS",
            "How long a published build may go without a heartbeat of its generation before it is presumed lost (its worker or build died) and published again with the next generation; builds heartbeat well within it. Overridable per queue (1 ms to 30 days).";
        max_conflicts: u32 = 32, "HOLDFAST_MAX_CONFLICTS",
            "Compare-and-set conflicts one admission step reloads after before failing (at least 1).";
    }
    extra {
        /// Per-queue overrides, keyed by queue name.
        queues: BTreeMap<String, QueueOverride> = BTreeMap::new();
    }
}

/// One key of a per-queue override (`[admission.queues."<name>"]`), as the
/// reference lists it. [`QUEUE_KEYS`] has them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueKeySpec {
    /// The key inside the queue's table (`slot_lease_ms`).
    pub key: &'static str,
    /// The `[admission]` key whose value applies when the override is absent
    /// (`admission.slot_lease_ms`).
    pub default_key: &'static str,
    /// What it means.
    pub meaning: &'static str,
}

/// Declares [`QueueOverride`] and [`QUEUE_KEYS`] from one list, so the keys the
/// file parser accepts and the keys the reference lists cannot drift apart.
macro_rules! queue_overrides {
    ($($field:ident: $ty:ty => $meaning:literal,)*) => {
        /// `[admission.queues."<name>"]`: what differs from the `[admission]`
        /// default. Every field is listed in [`QUEUE_KEYS`].
        #[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct QueueOverride {
            $(#[doc = $meaning] pub $field: Option<$ty>,)*
        }

        /// Every key of a per-queue override, in the order of the reference.
        pub static QUEUE_KEYS: &[QueueKeySpec] = &[$(QueueKeySpec {
            key: stringify!($field),
            default_key: concat!("admission.", stringify!($field)),
            meaning: $meaning,
        },)*];
    };
}

queue_overrides! {
    max_concurrent: u32 => "Build slots of this queue (at least 1); stored with the queue at its first request, then changed only by `holdfast queue set-limit`.",
    gate_wait_delay_ms: u64 => "How long a request of this queue is held when its gate is closed (1 to 3600000 ms).",
    slot_lease_ms: u64 => "How long a slot owner of this queue keeps its slot without a heartbeat; then reconcile fails it with `slot_lease_expired` and frees the slot. Queues of long builds need a long lease (1 ms to 30 days).",
    resume_after_ms: u64 => "How long a published build of this queue may go without a heartbeat of its generation before it is presumed lost and published again with the next generation (1 ms to 30 days).",
}

/// Why a configuration could not be loaded or was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read configuration file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for [`Config`] (an unknown key, a wrong type).
    #[error("invalid configuration file {path}: {message}")]
    Toml {
        /// The file, or `<string>`.
        path: String,
        /// The parser's message, naming the key.
        message: String,
    },
    /// An environment value that does not parse.
    #[error("invalid environment variable {var} = {value:?}; expected {expected}")]
    Env {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// A value outside its accepted range.
    #[error("invalid configuration: {key} = {value}; expected {expected}")]
    Invalid {
        /// The key, as in the file (`selection.sufficiency_window`).
        key: String,
        /// The rejected value.
        value: String,
        /// The accepted range, in words.
        expected: String,
    },
}

impl ConfigError {
    /// What kind of failure this is: always [`ErrorKind::InvalidInput`] (a file
    /// that cannot be read, a value that does not parse or is out of range: the
    /// configuration must be fixed).
    pub fn kind(&self) -> ErrorKind {
        match self {
            ConfigError::Read { .. }
            | ConfigError::Toml { .. }
            | ConfigError::Env { .. }
            | ConfigError::Invalid { .. } => ErrorKind::InvalidInput,
        }
    }
}

/// A `HOLDFAST_*` variable that is neither a configuration key nor reserved
/// ([`RESERVED_ENV`]): ignored, and reported by [`Config::apply_env`] so the
/// caller can warn about it (a typo of a key would otherwise go unnoticed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownVar {
    /// The variable.
    pub var: String,
    /// The known variable it is likely a typo of, if one is that close.
    pub did_you_mean: Option<&'static str>,
}

impl std::fmt::Display for UnknownVar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ignoring environment variable {}: not a holdfast configuration key",
            self.var
        )?;
        match self.did_you_mean {
            Some(known) => write!(f, "; did you mean {known}?"),
            None => f.write_str(" (see docs/configuration.md)"),
        }
    }
}

/// A renamed key: its old file key and variable stay accepted, with a warning
/// ([`DeprecatedName`]). [`ALIASES`] has them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alias {
    /// The old key (`selection.max_retries`).
    pub old_key: &'static str,
    /// The old variable (`HOLDFAST_MAX_RETRIES`).
    pub old_env: &'static str,
    /// The key now (`selection.max_legs`).
    pub key: &'static str,
    /// The variable now (`HOLDFAST_MAX_LEGS`).
    pub env: &'static str,
}

/// Every renamed key, in the order of the reference.
pub static ALIASES: &[Alias] = SELECTION_ALIASES;

/// A deprecated name a configuration was read with: an old key in the file, or
/// an old variable in the environment. Its value applied as the new name's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeprecatedName {
    /// The rename.
    pub alias: Alias,
    /// Whether the old variable was read (else the old key, in the file).
    pub in_env: bool,
}

impl DeprecatedName {
    /// The name as it was written.
    pub fn old(&self) -> &'static str {
        if self.in_env {
            self.alias.old_env
        } else {
            self.alias.old_key
        }
    }

    /// The name to write instead.
    pub fn now(&self) -> &'static str {
        if self.in_env {
            self.alias.env
        } else {
            self.alias.key
        }
    }
}

impl std::fmt::Display for DeprecatedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.in_env {
            "environment variable"
        } else {
            "configuration key"
        };
        write!(
            f,
            "{what} {} is deprecated: it sets {}, the name to use now (see docs/configuration.md)",
            self.old(),
            self.now()
        )
    }
}

/// The deprecated names a [`Config`] was read with, in the order read (each once).
/// How a value was spelled is not part of it, so any two compare equal.
#[derive(Debug, Clone, Default)]
pub struct DeprecatedNames(Vec<DeprecatedName>);

impl DeprecatedNames {
    fn note(&mut self, name: DeprecatedName) {
        if !self.0.contains(&name) {
            self.0.push(name);
        }
    }
}

impl PartialEq for DeprecatedNames {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for DeprecatedNames {}

/// The variable that sets `db_url` when `HOLDFAST_DB` is unset.
pub const DATABASE_URL_ENV: &str = "DATABASE_URL";

/// The longest accepted connect or busy timeout (one hour).
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;

impl Config {
    /// Parses a TOML document; missing keys keep their defaults. Not validated.
    #[cfg(feature = "config-file")]
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| ConfigError::Toml {
            path: "<string>".to_owned(),
            message: e.message().to_owned() + &span_hint(text, e.span()),
        })?;
        // It parsed as a Config, so it is a table; note the old keys it used.
        let table = toml::from_str::<toml::Table>(text).unwrap_or_default();
        for alias in ALIASES {
            let mut path = alias.old_key.split('.');
            let mut at = path.next().and_then(|first| table.get(first));
            for part in path {
                at = at.and_then(|v| v.get(part));
            }
            if at.is_some() {
                config.deprecated_names.note(DeprecatedName {
                    alias: *alias,
                    in_env: false,
                });
            }
        }
        Ok(config)
    }

    /// The deprecated names this configuration was read with (old keys of the
    /// file, old variables of the environment): [`ALIASES`] says what each is
    /// now. The loaders log a warning for each.
    pub fn deprecated_names(&self) -> &[DeprecatedName] {
        &self.deprecated_names.0
    }

    /// `key` as this configuration was written: its old name when that is the
    /// one it was read with.
    fn spelled(&self, key: &'static str) -> &'static str {
        self.deprecated_names()
            .iter()
            .find(|d| d.alias.key == key)
            .map_or(key, |d| d.alias.old_key)
    }

    /// Reads and parses a TOML file. Not validated.
    #[cfg(feature = "config-file")]
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::from_toml_str(&text).map_err(|e| match e {
            ConfigError::Toml { message, .. } => ConfigError::Toml {
                path: path.display().to_string(),
                message,
            },
            other => other,
        })
    }

    /// Applies `HOLDFAST_*` variables from `vars` over this configuration, and
    /// `DATABASE_URL` (non-empty) as `db_url` when `vars` has no `HOLDFAST_DB`
    /// and `db_url` is still the default: the fallback, so a `DATABASE_URL` meant
    /// for another tool never overrides holdfast's own setting ([`Config::load`]
    /// also ignores it when the file names `db_url`, even the default one).
    /// Other variables without the prefix are ignored. An old variable of
    /// [`ALIASES`] sets its key, and is noted in [`Config::deprecated_names`].
    /// A prefixed one that is neither a key of [`KEYS`], an old one nor in
    /// [`RESERVED_ENV`] is ignored too and
    /// returned, with the known variable it is likely a typo of, for the caller to
    /// warn about; a value that does not parse is an error naming the variable.
    pub fn apply_env<I, K, V>(&mut self, vars: I) -> Result<Vec<UnknownVar>, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut unknown = Vec::new();
        let mut database_url = None;
        let mut db_set = false;
        for (var, value) in vars {
            let (var, value) = (var.as_ref(), value.as_ref());
            if var == DATABASE_URL_ENV {
                database_url = Some(value.to_owned());
                continue;
            }
            if !var.starts_with("HOLDFAST_") || RESERVED_ENV.contains(&var) {
                continue;
            }
            let alias = ALIASES.iter().find(|a| a.old_env == var);
            let env = alias.map_or(var, |a| a.env);
            let Some(spec) = KEYS.iter().find(|k| k.env == env) else {
                unknown.push(UnknownVar {
                    var: var.to_owned(),
                    did_you_mean: likely_meant(var),
                });
                continue;
            };
            if let Some(alias) = alias {
                self.deprecated_names.note(DeprecatedName {
                    alias: *alias,
                    in_env: true,
                });
            }
            db_set |= spec.key == "db_url";
            (spec.set)(self, value).map_err(|expected| ConfigError::Env {
                var: var.to_owned(),
                value: value.to_owned(),
                expected,
            })?;
        }
        let db_unset = !db_set && self.db_url == crate::backend::DEFAULT_DB_URL;
        if let Some(url) = database_url.filter(|url| db_unset && !url.trim().is_empty()) {
            self.db_url = url;
        }
        unknown.sort_by(|a, b| a.var.cmp(&b.var));
        Ok(unknown)
    }

    /// The configuration a process starts with: defaults, then the file (if any),
    /// then the process environment ([`Config::apply_env`]; a warning is logged
    /// for each unknown `HOLDFAST_*` variable); validated.
    #[cfg(feature = "config-file")]
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let Some(path) = file else {
            return Config::default().with_process_env(true);
        };
        let config = Config::from_file(path)?;
        // The file parsed, so it reads and is a table; a `db_url` it names wins
        // over the DATABASE_URL fallback, whatever its value.
        let names_db = std::fs::read_to_string(path)
            .ok()
            .and_then(|text| toml::from_str::<toml::Table>(&text).ok())
            .is_some_and(|table| table.contains_key("db_url"));
        config.with_process_env(!names_db)
    }

    /// The defaults, then the process environment (`HOLDFAST_*`, and
    /// `DATABASE_URL` when `HOLDFAST_DB` is unset; a warning is logged for each
    /// unknown `HOLDFAST_*` variable); validated. The configuration of a service
    /// that reads no file.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::default().with_process_env(true)
    }

    /// The `HOLDFAST_*` variables of the process environment that name no key,
    /// for a service that shows them its own way (the loaders also log each as a
    /// `tracing` warning, which needs a subscriber to be seen).
    pub fn unknown_env() -> Vec<UnknownVar> {
        Config::default()
            .apply_env(process_env().filter(|(k, _)| k.starts_with("HOLDFAST_")))
            .unwrap_or_default()
    }

    fn with_process_env(mut self, database_url: bool) -> Result<Config, ConfigError> {
        let vars = process_env().filter(|(k, _)| database_url || k != DATABASE_URL_ENV);
        let unknown = self.apply_env(vars)?;
        for u in unknown {
            tracing::warn!(var = %u.var, did_you_mean = u.did_you_mean, "{u}");
        }
        for d in self.deprecated_names() {
            tracing::warn!(old = d.old(), now = d.now(), "{d}");
        }
        self.validate()?;
        Ok(self)
    }

    /// Checks every value against its range; the error names the first bad key
    /// and what was expected.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn invalid(key: &str, value: impl ToString, expected: &str) -> ConfigError {
            ConfigError::Invalid {
                key: key.to_owned(),
                value: value.to_string(),
                expected: expected.to_owned(),
            }
        }
        if self.db_url.trim().is_empty() {
            return Err(invalid(
                "db_url",
                "\"\"",
                "a sqlite:// path, sqlite::memory: or a postgres:// URL",
            ));
        }
        for (key, value) in [
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("busy_timeout_ms", self.busy_timeout_ms),
        ] {
            if !(1..=MAX_TIMEOUT_MS).contains(&value) {
                return Err(invalid(key, value, "1 to 3600000 ms"));
            }
        }
        if self.owner.len() > 256 || self.owner.chars().any(char::is_control) {
            return Err(invalid(
                "owner",
                format!("{:?}", self.owner),
                "at most 256 characters, none of them control characters",
            ));
        }
        self.check_postgres()?;
        self.precision_bits()?;
        self.selection_config()
            .validate()
            .map_err(|e| match self.selection.key_of(e.key) {
                Some((key, value, range)) => {
                    invalid(self.spelled(key), value, range.unwrap_or(e.expected))
                }
                None => invalid(&format!("selection.{}", e.key), e.value, e.expected),
            })?;
        self.lease_config().validate().map_err(|e| match e {
            holdfast_domain::LeaseConfigError::LeaseExpiryZero => {
                invalid("lease.lease_expiry_ms", 0, "more than 0 ms")
            }
            holdfast_domain::LeaseConfigError::CleanupPeriodZero => {
                invalid("lease.cleanup_period_ms", 0, "more than 0 ms")
            }
        })?;
        if self.settlement.persist_max_attempts == 0 {
            return Err(invalid(
                "settlement.persist_max_attempts",
                0,
                "at least 1 attempt",
            ));
        }
        if self.settlement.persist_initial_backoff_ms > MAX_TIMEOUT_MS {
            return Err(invalid(
                "settlement.persist_initial_backoff_ms",
                self.settlement.persist_initial_backoff_ms,
                "0 to 3600000 ms",
            ));
        }
        if self.admission.max_conflicts == 0 {
            return Err(invalid("admission.max_conflicts", 0, "at least 1"));
        }
        check_admission(
            "admission",
            self.admission.max_concurrent,
            self.admission.gate_wait_delay_ms,
            self.admission.slot_lease_ms,
            self.admission.resume_after_ms,
        )?;
        for (name, o) in &self.admission.queues {
            let prefix = format!("admission.queues.{name:?}");
            QueueName::new(name.as_str()).map_err(|e| {
                invalid(
                    &prefix,
                    format!("{name:?}"),
                    &format!("a valid queue name ({e})"),
                )
            })?;
            check_admission(
                &prefix,
                o.max_concurrent.unwrap_or(self.admission.max_concurrent),
                o.gate_wait_delay_ms
                    .unwrap_or(self.admission.gate_wait_delay_ms),
                o.slot_lease_ms.unwrap_or(self.admission.slot_lease_ms),
                o.resume_after_ms.unwrap_or(self.admission.resume_after_ms),
            )?;
        }
        Ok(())
    }

    fn check_postgres(&self) -> Result<(), ConfigError> {
        let p = &self.postgres;
        let invalid = |key: &str, value: u64, expected: &str| ConfigError::Invalid {
            key: format!("postgres.{key}"),
            value: value.to_string(),
            expected: expected.to_owned(),
        };
        if p.max_connections == 0 {
            return Err(invalid("max_connections", 0, "at least 1"));
        }
        if p.min_connections > p.max_connections {
            return Err(invalid(
                "min_connections",
                u64::from(p.min_connections),
                &format!("at most postgres.max_connections ({})", p.max_connections),
            ));
        }
        for (key, value) in [
            ("acquire_timeout_ms", p.acquire_timeout_ms),
            ("idle_timeout_ms", p.idle_timeout_ms),
            ("line_wait_ms", p.line_wait_ms),
            ("lock_timeout_ms", p.lock_timeout_ms),
            ("statement_timeout_ms", p.statement_timeout_ms),
            (
                "idle_in_transaction_timeout_ms",
                p.idle_in_transaction_timeout_ms,
            ),
        ] {
            if !(1..=MAX_TIMEOUT_MS).contains(&value) {
                return Err(invalid(key, value, "1 to 3600000 ms"));
            }
        }
        if !(1_000..=MAX_TIMEOUT_MS).contains(&p.keepalive_idle_ms) {
            return Err(invalid(
                "keepalive_idle_ms",
                p.keepalive_idle_ms,
                "1000 to 3600000 ms (PostgreSQL takes whole seconds)",
            ));
        }
        if p.line_wait_ms >= p.statement_timeout_ms {
            return Err(invalid(
                "line_wait_ms",
                p.line_wait_ms,
                &format!(
                    "less than postgres.statement_timeout_ms ({})",
                    p.statement_timeout_ms
                ),
            ));
        }
        if !(1..=MAX_LIFETIME_MS).contains(&p.max_lifetime_ms) {
            return Err(invalid(
                "max_lifetime_ms",
                p.max_lifetime_ms,
                "1 to 86400000 ms (one day)",
            ));
        }
        Ok(())
    }

    /// The selection settings.
    pub fn selection_config(&self) -> SelectionConfig {
        self.selection.to_domain()
    }

    /// The lease settings.
    pub fn lease_config(&self) -> LeaseConfig {
        LeaseConfig {
            lease_expiry: Duration::from_millis(self.lease.lease_expiry_ms),
            cleanup_period: Duration::from_millis(self.lease.cleanup_period_ms),
        }
    }

    /// The settlement persistence policy.
    pub fn persist_policy(&self) -> PersistPolicy {
        PersistPolicy {
            max_attempts: self.settlement.persist_max_attempts,
            initial_backoff: Duration::from_millis(self.settlement.persist_initial_backoff_ms),
        }
    }

    /// The admission settings of queues without an override.
    pub fn admission_default(&self) -> AdmissionConfig {
        AdmissionConfig {
            max_concurrent: self.admission.max_concurrent,
            gate_wait_delay: Duration::from_millis(self.admission.gate_wait_delay_ms),
            slot_lease: Duration::from_millis(self.admission.slot_lease_ms),
            resume_after: Duration::from_millis(self.admission.resume_after_ms),
        }
    }

    /// The admission settings of `queue`: its override over the default.
    pub fn admission_for(&self, queue: &QueueName) -> AdmissionConfig {
        let o = self.admission.queues.get(queue.as_str());
        AdmissionConfig {
            max_concurrent: o
                .and_then(|o| o.max_concurrent)
                .unwrap_or(self.admission.max_concurrent),
            gate_wait_delay: Duration::from_millis(
                o.and_then(|o| o.gate_wait_delay_ms)
                    .unwrap_or(self.admission.gate_wait_delay_ms),
            ),
            slot_lease: Duration::from_millis(
                o.and_then(|o| o.slot_lease_ms)
                    .unwrap_or(self.admission.slot_lease_ms),
            ),
            resume_after: Duration::from_millis(
                o.and_then(|o| o.resume_after_ms)
                    .unwrap_or(self.admission.resume_after_ms),
            ),
        }
    }

    /// The quantity precision.
    pub fn precision_bits(&self) -> Result<Precision, ConfigError> {
        Precision::new(self.precision).map_err(|_| ConfigError::Invalid {
            key: "precision".to_owned(),
            value: self.precision.to_string(),
            expected: "1 to 128 bits".to_owned(),
        })
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// The SQLite busy timeout.
    pub fn busy_timeout(&self) -> Duration {
        Duration::from_millis(self.busy_timeout_ms)
    }
}

/// The longest slot lease: 30 days.
pub const MAX_SLOT_LEASE_MS: u64 = 30 * 24 * 3_600_000;

fn check_admission(
    prefix: &str,
    max_concurrent: u32,
    delay_ms: u64,
    lease_ms: u64,
    resume_ms: u64,
) -> Result<(), ConfigError> {
    if !(1..=MAX_SLOT_LEASE_MS).contains(&resume_ms) {
        return Err(ConfigError::Invalid {
            key: format!("{prefix}.resume_after_ms"),
            value: resume_ms.to_string(),
            expected: "1 to 2592000000 ms (30 days)".to_owned(),
        });
    }
    if !(1..=MAX_SLOT_LEASE_MS).contains(&lease_ms) {
        return Err(ConfigError::Invalid {
            key: format!("{prefix}.slot_lease_ms"),
            value: lease_ms.to_string(),
            expected: "1 to 2592000000 ms (30 days)".to_owned(),
        });
    }
    if max_concurrent == 0 {
        return Err(ConfigError::Invalid {
            key: format!("{prefix}.max_concurrent"),
            value: "0".to_owned(),
            expected: "at least 1 slot".to_owned(),
        });
    }
    if !(1..=MAX_TIMEOUT_MS).contains(&delay_ms) {
        return Err(ConfigError::Invalid {
            key: format!("{prefix}.gate_wait_delay_ms"),
            value: delay_ms.to_string(),
            expected: "1 to 3600000 ms".to_owned(),
        });
    }
    Ok(())
}

/// The known `HOLDFAST_*` variable (a key's, or a reserved one) that `var` is an
/// obvious typo of: the closest by edit distance (transpositions count once),
/// at most one edit per four characters and at most three; ties go to the first.
fn likely_meant(var: &str) -> Option<&'static str> {
    let name = var.strip_prefix("HOLDFAST_").unwrap_or(var);
    KEYS.iter()
        .map(|k| k.env)
        .chain(RESERVED_ENV.iter().copied())
        .filter_map(|known| {
            let known_name = known.strip_prefix("HOLDFAST_").unwrap_or(known);
            let d = edit_distance(name, known_name);
            let len = name.chars().count().max(known_name.chars().count()).max(4);
            (d <= 3 && d * 4 <= len).then_some((d, known))
        })
        .min_by_key(|(d, _)| *d)
        .map(|(_, known)| known)
}

/// The optimal-string-alignment distance of `a` and `b`: insertions, deletions,
/// substitutions and transpositions of neighbours, each one edit.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = d;
        }
    }
    rows[a.len()][b.len()]
}

/// The process environment, as text (variables that are not Unicode are skipped;
/// values that are not are read as empty, which every key refuses).
fn process_env() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().unwrap_or_default())))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(feature = "config-file")]
fn span_hint(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    let Some(span) = span else {
        return String::new();
    };
    let line = text
        .get(..span.start)
        .map_or(0, |before| before.matches('\n').count())
        + 1;
    // The line itself names the key, which a type error's message does not.
    match text.lines().nth(line - 1).map(str::trim) {
        Some(source) if !source.is_empty() => {
            let shown: String = source.chars().take(80).collect();
            format!(" (line {line}: {shown})")
        }
        _ => format!(" (line {line})"),
    }
}

fn de_policy<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SelectionPolicy, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map_err(serde::de::Error::custom)
}

fn de_strategy<'de, D: serde::Deserializer<'de>>(d: D) -> Result<LockStrategy, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map_err(serde::de::Error::custom)
}

/// One configuration key: its place in the file, its environment variable, its
/// meaning, and how to read and set it. [`KEYS`] lists them all.
#[derive(Clone, Copy)]
pub struct KeySpec {
    /// The key as in the TOML file (`selection.sufficiency_window`).
    pub key: &'static str,
    /// The environment variable (`HOLDFAST_SUFFICIENCY_WINDOW`).
    pub env: &'static str,
    /// What it means.
    pub meaning: &'static str,
    /// The current value, as text.
    pub get: fn(&Config) -> String,
    /// Sets it from text; the error says what was expected.
    pub set: fn(&mut Config, &str) -> Result<(), &'static str>,
}

impl std::fmt::Debug for KeySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySpec")
            .field("key", &self.key)
            .field("env", &self.env)
            .finish_non_exhaustive()
    }
}

/// A value settable from an environment variable.
trait EnvValue: Sized {
    fn parse_env(text: &str) -> Result<Self, &'static str>;
    fn show(&self) -> String;
}

macro_rules! env_number {
    ($($t:ty => $expected:literal),*) => {$(
        impl EnvValue for $t {
            fn parse_env(text: &str) -> Result<Self, &'static str> {
                text.trim().parse().map_err(|_| $expected)
            }
            fn show(&self) -> String {
                self.to_string()
            }
        }
    )*};
}

env_number!(
    u8 => "an integer from 0 to 255",
    u32 => "a non-negative integer (32 bits)",
    u64 => "a non-negative integer (64 bits)",
    usize => "a non-negative integer"
);

impl EnvValue for bool {
    fn parse_env(text: &str) -> Result<Self, &'static str> {
        match text.trim() {
            "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            _ => Err("true, false, 1 or 0"),
        }
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

impl EnvValue for String {
    fn parse_env(text: &str) -> Result<Self, &'static str> {
        Ok(text.to_owned())
    }
    fn show(&self) -> String {
        format!("`{self}`")
    }
}

impl EnvValue for Option<u64> {
    fn parse_env(text: &str) -> Result<Self, &'static str> {
        u64::parse_env(text).map(Some)
    }
    fn show(&self) -> String {
        match self {
            Some(v) => v.to_string(),
            None => "none (OS entropy)".to_owned(),
        }
    }
}

impl EnvValue for LockStrategy {
    fn parse_env(text: &str) -> Result<Self, &'static str> {
        text.trim()
            .parse()
            .map_err(|_| "insert, on_conflict or skip_locked")
    }
    fn show(&self) -> String {
        format!("`{self}`")
    }
}

impl EnvValue for SelectionPolicy {
    fn parse_env(text: &str) -> Result<Self, &'static str> {
        text.parse().map_err(|_| "cover_first or smallest_first")
    }
    fn show(&self) -> String {
        format!("`{self}`")
    }
}

/// The keys of every settings struct, in the order of the reference.
const KEY_GROUPS: &[&[KeySpec]] = &[
    ROOT_KEYS,
    POSTGRES_KEYS,
    SELECTION_KEYS,
    LEASE_KEYS,
    SETTLEMENT_KEYS,
    ADMISSION_KEYS,
];

/// How many keys there are.
const KEY_COUNT: usize = {
    let mut n = 0;
    let mut i = 0;
    while i < KEY_GROUPS.len() {
        n += KEY_GROUPS[i].len();
        i += 1;
    }
    n
};

/// [`KEY_GROUPS`] laid end to end.
static KEY_TABLE: [KeySpec; KEY_COUNT] = {
    let mut out = [ROOT_KEYS[0]; KEY_COUNT];
    let (mut n, mut i) = (0, 0);
    while i < KEY_GROUPS.len() {
        let mut j = 0;
        while j < KEY_GROUPS[i].len() {
            out[n] = KEY_GROUPS[i][j];
            n += 1;
            j += 1;
        }
        i += 1;
    }
    out
};

/// Every configuration key, in the order of the reference: each declared once,
/// with its field, default and variable, by `settings!`.
pub static KEYS: &[KeySpec] = &KEY_TABLE;

/// The configuration reference (`docs/configuration.md`), generated from [`KEYS`]
/// and [`Config::default`].
pub fn reference_markdown() -> String {
    let defaults = Config::default();
    let mut out = String::new();
    out.push_str("# Configuration reference\n\n");
    out.push_str(
        "<!-- Generated from crates/app/src/config.rs by the test `configuration_reference_is_current`. Do not edit. -->\n\n",
    );
    out.push_str(
        "holdfast reads an optional TOML file (`--config FILE`), then `HOLDFAST_*` environment\n\
         variables, which override the file; `DATABASE_URL` is the fallback for `db_url` when\n\
         neither `HOLDFAST_DB` nor the file sets it. Every key is optional. Durations are whole milliseconds (`_ms` keys). An\n\
         unknown key in the file is an error naming it. An unknown `HOLDFAST_*` variable is\n\
         ignored with a logged warning naming it (and the variable it is likely a typo of), so\n\
         a service may keep settings of its own under the prefix. A value that does not parse\n\
         or is out of range is an error naming the key or variable and what was expected.\n\n",
    );
    out.push_str("| key | environment | default | meaning |\n|---|---|---|---|\n");
    for k in KEYS {
        let _ = writeln!(
            out,
            "| `{}` | `{}` | {} | {} |",
            k.key,
            k.env,
            (k.get)(&defaults),
            k.meaning
        );
    }
    out.push_str(
        "\n## Per-queue admission overrides\n\n\
         Only in the file: a table `[admission.queues.\"<queue name>\"]` overrides the\n\
         `[admission]` default of that queue, key by key; a key it leaves out keeps the\n\
         default. An unknown key in it is an error naming the key.\n\n",
    );
    out.push_str("| key | default | meaning |\n|---|---|---|\n");
    for q in QUEUE_KEYS {
        let default = KEYS
            .iter()
            .find(|k| k.key == q.default_key)
            .map_or_else(String::new, |k| format!(" ({})", (k.get)(&defaults)));
        let _ = writeln!(
            out,
            "| `{}` | `{}`{default} | {} |",
            q.key, q.default_key, q.meaning
        );
    }
    out.push_str(
        "\n```toml\n[admission]\nmax_concurrent = 1\n\n\
         [admission.queues.\"monorepo/main\"]\nmax_concurrent = 4\nslot_lease_ms = 21600000   # 6 h builds\n```\n\n\
         ## Old names\n\n\
         Keys renamed so that their names say what they count are still accepted under\n\
         their old names, in the file and in the environment, with a logged warning naming\n\
         the new one; an error about such a value names the key as it was written. A file\n\
         that sets both names of one key is refused.\n\n\
         | old key | old variable | now |\n|---|---|---|\n",
    );
    for a in ALIASES {
        let _ = writeln!(
            out,
            "| `{}` | `{}` | `{}` (`{}`) |",
            a.old_key, a.old_env, a.key, a.env
        );
    }
    out.push_str("\n## Reserved variables\n\n");
    let _ = writeln!(
        out,
        "{} are not configuration: the command, `cargo xtask` and the test harnesses read them.",
        RESERVED_ENV
            .iter()
            .map(|v| format!("`{v}`"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    out
}
