//! The backend: connecting, migrating, the pool, and the counters shared by the
//! four port implementations.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use holdfast_ports::{StoreFault, Stores};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection};

use crate::error::ConnectError;
use crate::locks::CLAIM_LINE_STRIPES;
use crate::options::{LockStrategy, PgOptions};
use crate::schema;
use crate::session::{self, Health};
use crate::url::{redact_url, scrub, secrets, unescaped_in_password};
use crate::wake::Wake;

/// holdfast's ports over one PostgreSQL database, for one replica of the app.
///
/// Cloning is cheap and shares the pool and the counters. Every operation takes
/// one connection from the pool for its duration and never a second one while
/// holding it, so no pool size can deadlock the app against itself.
#[derive(Clone)]
pub struct PgBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) pool: PgPool,
    /// When this instance last saw a broken connection.
    pub(crate) health: Arc<Health>,
    /// The bound on a read-and-claim's wait for its line's advisory lock.
    pub(crate) line_wait: std::time::Duration,
    /// How long a call waits for a pooled connection in all.
    pub(crate) acquire_timeout: std::time::Duration,
    /// The client-side bound on a whole read-and-claim transaction.
    pub(crate) transaction_bound: std::time::Duration,
    pub(crate) strategy: LockStrategy,
    /// The owner id recorded on this instance's locks and selections.
    pub(crate) owner: String,
    pub(crate) wake: Wake,
    /// In-process turns of read-and-claims, by line (`locks::claim_line`).
    pub(crate) claim_lines: Box<[tokio::sync::Mutex<()>]>,
    /// Read-and-claims that found their line held beyond `line_wait`.
    pub(crate) lines_busy: AtomicU64,
    round_trips: AtomicU64,
    server_errors: AtomicU64,
}

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend")
            .field("strategy", &self.inner.strategy)
            .field("round_trips", &self.round_trips())
            .field("server_errors", &self.server_errors())
            .finish_non_exhaustive()
    }
}

impl PgBackend {
    /// Connects to the database at `url`, applies the embedded migrations (one
    /// replica at a time, under PostgreSQL's migration advisory lock) and returns
    /// the backend. No connection is held afterwards until an operation needs one.
    pub async fn connect(url: &str, options: PgOptions) -> Result<PgBackend, ConnectError> {
        options.validate()?;
        let shown = redact_url(url);
        let secret_forms = secrets(url);
        let clean = |text: String| scrub(&text, &secret_forms);
        if unescaped_in_password(url) {
            // Which character is not said: it is part of the password.
            return Err(ConnectError::InvalidUrl {
                url: shown,
                reason: clean(
                    "the password holds an unescaped '/', '?', '#' or '@'; percent-encode \
                     them (%2F, %3F, %23, %40) so the user info ends where it should"
                        .to_owned(),
                ),
            });
        }
        let base = PgConnectOptions::from_str(url).map_err(|e| ConnectError::InvalidUrl {
            url: shown.clone(),
            reason: clean(e.to_string()),
        })?;
        let connect_options = session::connect_options(base.clone(), &options);
        let timeout = options.connect_timeout;
        let timeout_error = |detail: String| ConnectError::Timeout {
            url: shown.clone(),
            timeout_ms: timeout.as_millis(),
            detail,
        };

        // Probe with one direct connection first: a pool would retry a refused
        // connection until its timeout and hide the reason. A server that is full
        // (too many connections), starting up or restarting is waited for, up to
        // the connect timeout; anything else is answered at once.
        let deadline = tokio::time::Instant::now() + timeout;
        let mut pause = std::time::Duration::from_millis(50);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, PgConnection::connect_with(&connect_options)).await {
                Err(_) => return Err(timeout_error("no answer".to_owned())),
                // Closing the probe politely is best effort; the server cleans up.
                Ok(Ok(probe)) => {
                    let _ = probe.close().await;
                    break;
                }
                Ok(Err(e)) if session::worth_waiting_for(&e) => {
                    if tokio::time::Instant::now() + pause >= deadline {
                        return Err(timeout_error(clean(e.to_string())));
                    }
                    tracing::info!(url = %shown, error = %clean(e.to_string()), "the server refuses connections for now; waiting");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_millis(500));
                }
                Ok(Err(e)) => {
                    return Err(ConnectError::Unavailable {
                        url: shown,
                        detail: clean(e.to_string()),
                    });
                }
            }
        }
        // Migrate through a dedicated one-connection pool: closing it closes the
        // connection, which releases the migration lock even if a migration failed.
        let migrating = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(timeout)
            .test_before_acquire(false)
            .connect_lazy_with(session::migrate_options(base, &options));
        let migrated = schema::migrator().run(&migrating).await;
        migrating.close().await;
        migrated.map_err(|e| ConnectError::Migration {
            url: shown.clone(),
            detail: clean(e.to_string()),
        })?;
        tracing::debug!(url = %shown, strategy = %options.strategy, "connected and migrated");

        let health = Arc::new(Health::new());
        let pool = session::pool(&connect_options, &options, health.clone());
        let wake = if options.wakeups {
            Wake::across_instances(pool.clone(), &connect_options, health.clone())
        } else {
            Wake::in_process()
        };
        Ok(PgBackend {
            inner: Arc::new(Inner {
                pool,
                health,
                line_wait: options.line_wait,
                acquire_timeout: options.acquire_timeout,
                transaction_bound: options.statement_timeout
                    + options.line_wait
                    + std::time::Duration::from_secs(1),
                strategy: options.strategy,
                owner: options.owner.clone(),
                wake,
                claim_lines: (0..CLAIM_LINE_STRIPES)
                    .map(|_| tokio::sync::Mutex::new(()))
                    .collect(),
                lines_busy: AtomicU64::new(0),
                round_trips: AtomicU64::new(0),
                server_errors: AtomicU64::new(0),
            }),
        })
    }

    /// The four ports, all backed by this instance.
    pub fn stores(&self) -> Stores {
        Stores::shared(Arc::new(self.clone()))
    }

    /// The owner id this instance records on its locks and selections.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// The configured lock strategy.
    pub fn strategy(&self) -> LockStrategy {
        self.inner.strategy
    }

    /// Statements sent to the server so far (each is one round trip; `BEGIN` and
    /// `COMMIT` of multi-statement transactions count too).
    pub fn round_trips(&self) -> u64 {
        self.inner.round_trips.load(Ordering::Relaxed)
    }

    /// Read-and-claims so far that found their wallet and type's advisory lock held
    /// for longer than [`PgOptions::line_wait`] and read and claimed without it.
    pub fn lines_busy(&self) -> u64 {
        self.inner.lines_busy.load(Ordering::Relaxed)
    }

    /// Statements the server answered with an error so far (including unique
    /// violations the `insert` strategy reports as contended).
    pub fn server_errors(&self) -> u64 {
        self.inner.server_errors.load(Ordering::Relaxed)
    }

    /// Closes the pool: waits for connections in use to come back, then closes all;
    /// stops listening for wake-ups.
    pub async fn close(&self) {
        self.inner.wake.stop();
        self.inner.pool.close().await;
    }

    /// The plan PostgreSQL chooses for the candidate query of `wallet`/`token_type`
    /// (first page, `limit` rows), as `EXPLAIN` text. For diagnostics: the plan
    /// should scan `tokens_candidates` and contain no sort.
    pub async fn explain_candidates(
        &self,
        wallet: &holdfast_domain::WalletId,
        token_type: &holdfast_domain::TokenType,
        after: Option<&holdfast_domain::Candidate>,
        limit: usize,
    ) -> Result<String, StoreFault> {
        crate::tokens::explain_candidates(self, wallet, token_type, after, limit).await
    }

    /// The plan PostgreSQL chooses for a first band read (`cover_first`), as
    /// `EXPLAIN` text: both bands should scan `tokens_candidates` (the fill band
    /// backwards) and contain no sort.
    pub async fn explain_candidate_bands(
        &self,
        query: &holdfast_ports::BandQuery,
    ) -> Result<String, StoreFault> {
        crate::tokens::explain_candidate_bands(self, query).await
    }

    /// Counts one statement and, if the server answered with an error, one server
    /// error; passes the result through.
    pub(crate) fn note<T>(&self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        self.inner.round_trips.fetch_add(1, Ordering::Relaxed);
        if let Err(sqlx::Error::Database(_)) = &result {
            self.inner.server_errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Err(e) = &result {
            tracing::debug!(error = %e, "statement failed");
            if session::broken(e) {
                self.inner.health.broken();
            }
        }
        result
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.inner.pool
    }
}
