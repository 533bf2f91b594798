//! Opening a backend from a database URL: `sqlite://path` (or a plain file path)
//! selects the embedded SQLite adapter, `postgres://` / `postgresql://` the
//! PostgreSQL adapter. Every open applies the missing migrations and is bounded by
//! a connect timeout. Messages never contain a password: URLs are shown redacted.
//!
//! Each adapter is behind a cargo feature (`sqlite`, `postgres`; both default): a
//! URL for an adapter that was not compiled in is [`BackendError::NotCompiled`].

use std::time::Duration;

#[cfg(feature = "postgres")]
use holdfast_adapters_postgres::{ConnectError, PgBackend, PgOptions, redact_url};
#[cfg(feature = "sqlite")]
use holdfast_adapters_sqlite::{OpenError, SqliteBackend, SqliteOptions};
use holdfast_ports::Stores;
use tracing::Instrument;

use crate::error::ErrorKind;

/// The default database: a SQLite file in the working directory.
pub const DEFAULT_DB_URL: &str = "sqlite://holdfast.db";

/// The default bound on opening (connecting and migrating) a database.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Which adapter a URL selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// The embedded SQLite adapter.
    Sqlite,
    /// The PostgreSQL adapter.
    Postgres,
}

impl BackendKind {
    /// `sqlite` or `postgres`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Sqlite => "sqlite",
            BackendKind::Postgres => "postgres",
        }
    }

    /// The adapter `url` selects: `postgres://` and `postgresql://` select
    /// PostgreSQL; `sqlite:` URLs and plain paths (no `scheme://`) select SQLite.
    pub fn of_url(url: &str) -> Result<BackendKind, BackendError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(BackendKind::Postgres);
        }
        if url.starts_with("sqlite:") {
            return Ok(BackendKind::Sqlite);
        }
        match url.split_once("://") {
            Some((scheme, _))
                if !scheme.is_empty()
                    && scheme
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')) =>
            {
                Err(BackendError::UnknownScheme {
                    scheme: scheme.to_owned(),
                })
            }
            _ => Ok(BackendKind::Sqlite),
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How to open a backend. Plain data with documented defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendOptions {
    /// Bound on connecting and migrating (default 10 s).
    pub connect_timeout: Duration,
    /// The owner id this instance records on its locks and selections, so a
    /// restarted instance recovers its own unsettled work and nobody else's
    /// (`Settlement::recover_orphans`). Empty (the default): derived from the
    /// host name, and logged; replicas on one host then share it, so give each
    /// replica a stable id of its own.
    pub owner: String,
    /// SQLite options (busy timeout, reader connections).
    #[cfg(feature = "sqlite")]
    pub sqlite: SqliteOptions,
    /// PostgreSQL options (lock strategy, pool size); its `connect_timeout` is
    /// replaced by [`BackendOptions::connect_timeout`].
    #[cfg(feature = "postgres")]
    pub postgres: PgOptions,
}

impl Default for BackendOptions {
    fn default() -> Self {
        BackendOptions {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            owner: String::new(),
            #[cfg(feature = "sqlite")]
            sqlite: SqliteOptions::default(),
            #[cfg(feature = "postgres")]
            postgres: PgOptions::default(),
        }
    }
}

/// The owner id of an instance that was given none: the host name.
fn derived_owner() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .map_or_else(|| "holdfast".to_owned(), |name| format!("host:{name}"))
}

impl crate::Config {
    /// The backend options this configuration asks for: its connect timeout, the
    /// SQLite busy timeout, the PostgreSQL lock strategy, pool and session
    /// settings (`[postgres]`), and whether PostgreSQL instances wake each other
    /// (`selection.wakeups`).
    pub fn backend_options(&self) -> BackendOptions {
        BackendOptions {
            connect_timeout: self.connect_timeout(),
            owner: self.owner.clone(),
            #[cfg(feature = "sqlite")]
            sqlite: SqliteOptions {
                busy_timeout: self.busy_timeout(),
                ..SqliteOptions::default()
            },
            #[cfg(feature = "postgres")]
            postgres: {
                let p = &self.postgres;
                let ms = Duration::from_millis;
                PgOptions {
                    strategy: self.pg_lock_strategy,
                    owner: self.owner.clone(),
                    max_connections: p.max_connections,
                    min_connections: p.min_connections,
                    connect_timeout: self.connect_timeout(),
                    acquire_timeout: ms(p.acquire_timeout_ms),
                    idle_timeout: ms(p.idle_timeout_ms),
                    max_lifetime: ms(p.max_lifetime_ms),
                    line_wait: ms(p.line_wait_ms),
                    lock_timeout: ms(p.lock_timeout_ms),
                    statement_timeout: ms(p.statement_timeout_ms),
                    idle_in_transaction_timeout: ms(p.idle_in_transaction_timeout_ms),
                    keepalive_idle: ms(p.keepalive_idle_ms),
                    wakeups: self.selection.wakeups,
                    wake_where_waited: p.wake_where_waited,
                }
            },
        }
    }
}

/// Why a backend could not be opened. [`BackendError::is_bad_input`] tells a
/// caller's mistake (a URL or option that can never work) from the database
/// failing.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The URL names a scheme no adapter handles.
    #[error(
        "unsupported database URL scheme {scheme:?}; expected sqlite://path, postgres://… or a file path"
    )]
    UnknownScheme {
        /// The scheme, without the rest of the URL (which may carry a password).
        scheme: String,
    },
    /// The URL selects an adapter this build of holdfast was compiled without.
    #[error(
        "the {backend} backend is not compiled in; enable the `{backend}` feature of the holdfast crate"
    )]
    NotCompiled {
        /// `sqlite` or `postgres`.
        backend: BackendKind,
    },
    /// The SQLite adapter refused the location or its options, or failed to open.
    #[cfg(feature = "sqlite")]
    #[error(transparent)]
    Sqlite(#[from] OpenError),
    /// The PostgreSQL adapter refused the URL or its options, or failed to connect.
    #[cfg(feature = "postgres")]
    #[error(transparent)]
    Postgres(#[from] ConnectError),
    /// Opening did not finish within the connect timeout.
    #[error("opening {url} did not finish within {timeout_ms} ms")]
    Timeout {
        /// The URL, password redacted.
        url: String,
        /// The timeout.
        timeout_ms: u128,
    },
}

impl BackendError {
    /// Whether the error is the caller's input (a URL or option that can never
    /// work), as opposed to the database being unreachable or failing: whether
    /// its [`kind`](BackendError::kind) is [`ErrorKind::InvalidInput`].
    pub fn is_bad_input(&self) -> bool {
        self.kind() == ErrorKind::InvalidInput
    }

    /// What kind of failure this is ([`ErrorKind`]): a URL or option that can
    /// never work is invalid input; a database that cannot be reached, refuses
    /// every session or gave no connection in time is unavailable; a schema that
    /// is too new or a migration that failed is a schema error; opening that
    /// did not finish within the connect timeout is a timeout; a fault while
    /// opening keeps its kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            BackendError::UnknownScheme { .. } | BackendError::NotCompiled { .. } => {
                ErrorKind::InvalidInput
            }
            #[cfg(feature = "sqlite")]
            BackendError::Sqlite(e) => match e {
                OpenError::InvalidLocation { .. } | OpenError::InvalidOption { .. } => {
                    ErrorKind::InvalidInput
                }
                OpenError::Unavailable { .. } => ErrorKind::Unavailable,
                OpenError::SchemaTooNew { .. } | OpenError::Migration { .. } => ErrorKind::Schema,
                OpenError::Fault(fault) => fault.kind().into(),
            },
            #[cfg(feature = "postgres")]
            BackendError::Postgres(e) => match e {
                ConnectError::InvalidUrl { .. }
                | ConnectError::Hosts { .. }
                | ConnectError::Options(_) => ErrorKind::InvalidInput,
                ConnectError::NoHost { .. }
                | ConnectError::Timeout { .. }
                | ConnectError::Unavailable { .. } => ErrorKind::Unavailable,
                ConnectError::Migration { .. } => ErrorKind::Schema,
            },
            BackendError::Timeout { .. } => ErrorKind::Timeout,
        }
    }
}

#[derive(Debug, Clone)]
enum Adapter {
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteBackend),
    #[cfg(feature = "postgres")]
    Postgres(PgBackend),
}

/// One open, migrated backend instance. Opening the same URL twice gives two
/// independent instances (two replicas), each with its own connections.
#[derive(Debug, Clone)]
pub struct Backend {
    adapter: Adapter,
    shown_url: String,
}

impl Backend {
    /// Opens the database at `url`, applying missing migrations, within
    /// `options.connect_timeout`.
    pub async fn open(url: &str, options: &BackendOptions) -> Result<Backend, BackendError> {
        let kind = BackendKind::of_url(url)?;
        let shown_url = shown(url);
        let timeout = options.connect_timeout;
        let owner = if options.owner.is_empty() {
            let derived = derived_owner();
            tracing::info!(
                owner = %derived,
                "no owner id configured; using the host name (replicas on one host share it: \
                 give each replica a stable `owner` of its own)"
            );
            derived
        } else {
            options.owner.clone()
        };
        let opening = async {
            match kind {
                #[cfg(feature = "sqlite")]
                BackendKind::Sqlite => SqliteBackend::open(url, options.sqlite.clone())
                    .await
                    .map(|b| Adapter::Sqlite(b.with_owner(&owner)))
                    .map_err(BackendError::from),
                #[cfg(feature = "postgres")]
                BackendKind::Postgres => {
                    let pg = PgOptions {
                        connect_timeout: timeout,
                        owner: owner.clone(),
                        ..options.postgres.clone()
                    };
                    PgBackend::connect(url, pg)
                        .await
                        .map(Adapter::Postgres)
                        .map_err(BackendError::from)
                }
                #[allow(unreachable_patterns)]
                backend => Err(BackendError::NotCompiled { backend }),
            }
        };
        let span = tracing::debug_span!("open_backend", backend = kind.as_str(), url = %shown_url);
        let adapter = match tokio::time::timeout(timeout, opening.instrument(span)).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(BackendError::Timeout {
                    url: shown_url,
                    timeout_ms: timeout.as_millis(),
                });
            }
        };
        tracing::debug!(backend = kind.as_str(), url = %shown_url, "backend open");
        Ok(Backend { adapter, shown_url })
    }

    /// The four ports of this instance.
    pub fn stores(&self) -> Stores {
        match &self.adapter {
            #[cfg(feature = "sqlite")]
            Adapter::Sqlite(b) => b.stores(),
            #[cfg(feature = "postgres")]
            Adapter::Postgres(b) => b.stores(),
        }
    }

    /// The owner id this instance records on its locks and selections.
    pub fn owner(&self) -> &str {
        match &self.adapter {
            #[cfg(feature = "sqlite")]
            Adapter::Sqlite(b) => b.owner(),
            #[cfg(feature = "postgres")]
            Adapter::Postgres(b) => b.owner(),
        }
    }

    /// The PostgreSQL backend underneath, for what only it has: what the
    /// server's settings said at connect ([`PgBackend::durability`]), the host
    /// new connections go to. `None` on SQLite.
    #[cfg(feature = "postgres")]
    pub fn postgres(&self) -> Option<&PgBackend> {
        match &self.adapter {
            Adapter::Postgres(b) => Some(b),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// Which adapter this is.
    pub fn kind(&self) -> BackendKind {
        match self.adapter {
            #[cfg(feature = "sqlite")]
            Adapter::Sqlite(_) => BackendKind::Sqlite,
            #[cfg(feature = "postgres")]
            Adapter::Postgres(_) => BackendKind::Postgres,
        }
    }

    /// The URL it was opened with, password redacted.
    pub fn shown_url(&self) -> &str {
        &self.shown_url
    }

    /// The schema version the database is at after opening (every open migrates to
    /// the newest version this build knows).
    pub fn schema_version(&self) -> i64 {
        match self.adapter {
            #[cfg(feature = "sqlite")]
            Adapter::Sqlite(_) => holdfast_adapters_sqlite::SCHEMA_VERSION,
            #[cfg(feature = "postgres")]
            Adapter::Postgres(_) => holdfast_adapters_postgres::MIGRATIONS
                .last()
                .map_or(0, |(version, _, _)| *version),
        }
    }

    /// Closes pooled connections where the adapter keeps a pool (PostgreSQL);
    /// SQLite connections close when the last clone is dropped.
    pub async fn close(&self) {
        match &self.adapter {
            #[cfg(feature = "postgres")]
            Adapter::Postgres(pg) => pg.close().await,
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }
}

/// `url` as it may be shown: the password of a PostgreSQL URL redacted. Built
/// without the PostgreSQL adapter (and its URL parser), only the scheme of a
/// PostgreSQL URL is shown.
fn shown(url: &str) -> String {
    #[cfg(feature = "postgres")]
    return redact_url(url);
    #[cfg(not(feature = "postgres"))]
    return match BackendKind::of_url(url) {
        Ok(BackendKind::Postgres) => {
            let scheme = url.split_once("://").map_or(url, |(scheme, _)| scheme);
            format!("{scheme}://…")
        }
        _ => url.to_owned(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[postgres]` writes the adapter's defaults out; they must agree.
    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_section_defaults_are_the_adapters() {
        let from_config = crate::Config::default().backend_options().postgres;
        assert_eq!(from_config, PgOptions::default());
    }

    #[test]
    fn urls_select_adapters() {
        for url in [
            "sqlite://holdfast.db",
            "sqlite:h.db",
            "sqlite::memory:",
            "h.db",
            "/tmp/x/h.db",
        ] {
            assert_eq!(
                BackendKind::of_url(url).ok(),
                Some(BackendKind::Sqlite),
                "{url}"
            );
        }
        for url in ["postgres://u@h/db", "postgresql://u:p@h:5432/db"] {
            assert_eq!(
                BackendKind::of_url(url).ok(),
                Some(BackendKind::Postgres),
                "{url}"
            );
        }
    }

    #[test]
    fn unknown_schemes_are_bad_input_and_hide_the_rest_of_the_url() {
        let err = BackendKind::of_url("mysql://root:hunter2@db/x").expect_err("mysql");
        assert!(err.is_bad_input());
        let text = err.to_string();
        assert!(text.contains("\"mysql\""), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn bad_sqlite_locations_are_bad_input() {
        let err = Backend::open("sqlite://", &BackendOptions::default())
            .await
            .expect_err("empty path");
        assert!(err.is_bad_input(), "{err}");
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn unopenable_sqlite_files_are_backend_errors() {
        let dir = std::env::temp_dir().join(format!("holdfast-backend-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("not-a-db");
        std::fs::write(
            &file,
            b"this is not a SQLite database, just text padding it out",
        )
        .expect("write");
        let err = Backend::open(&file.display().to_string(), &BackendOptions::default())
            .await
            .expect_err("not a database");
        assert!(!err.is_bad_input(), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn postgres_urls_are_redacted_in_errors() {
        let options = BackendOptions {
            connect_timeout: Duration::from_secs(2),
            ..BackendOptions::default()
        };
        // Port 1 on loopback refuses at once: an unavailable server, not bad input.
        let err = Backend::open("postgres://app:hunter2@127.0.0.1:1/db", &options)
            .await
            .expect_err("nothing listens on port 1");
        assert!(!err.is_bad_input(), "{err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
}
