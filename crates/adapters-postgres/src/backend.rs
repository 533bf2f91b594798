//! The backend: connecting, migrating, the pool, and the counters shared by the
//! four port implementations.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use holdfast_ports::{StoreFault, Stores};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection};

use crate::error::{ConnectError, redact_url, scrub};
use crate::locks::CLAIM_LINE_STRIPES;
use crate::options::{LockStrategy, PgOptions};
use crate::schema;
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
    pub(crate) strategy: LockStrategy,
    pub(crate) wake: Wake,
    /// In-process turns of read-and-claims, by line (`locks::claim_line`).
    pub(crate) claim_lines: Box<[tokio::sync::Mutex<()>]>,
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

/// The password in `url`'s user info or `password=` parameter, for scrubbing
/// driver messages.
fn password_of(url: &str) -> Option<String> {
    let rest = &url[url.find("://")? + 3..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let from_user_info = authority
        .rfind('@')
        .and_then(|at| authority[..at].split_once(':'))
        .map(|(_, password)| password.to_owned());
    from_user_info.or_else(|| {
        let query = &url[url.find('?')? + 1..];
        query.split('&').find_map(|param| {
            let (key, value) = param.split_once('=')?;
            key.eq_ignore_ascii_case("password")
                .then(|| value.to_owned())
        })
    })
}

impl PgBackend {
    /// Connects to the database at `url`, applies the embedded migrations (one
    /// replica at a time, under PostgreSQL's migration advisory lock) and returns
    /// the backend. No connection is held afterwards until an operation needs one.
    pub async fn connect(url: &str, options: PgOptions) -> Result<PgBackend, ConnectError> {
        options.validate()?;
        let shown = redact_url(url);
        let secret = password_of(url);
        let clean = |text: String| scrub(&text, secret.as_deref());
        let connect_options = PgConnectOptions::from_str(url)
            .map_err(|e| ConnectError::InvalidUrl {
                url: shown.clone(),
                reason: clean(e.to_string()),
            })?
            .application_name("holdfast");
        let timeout = options.connect_timeout;
        let timeout_error = |detail: String| ConnectError::Timeout {
            url: shown.clone(),
            timeout_ms: timeout.as_millis(),
            detail,
        };

        // Probe with one direct connection first: a pool would retry a refused
        // connection until its timeout and hide the reason.
        match tokio::time::timeout(timeout, PgConnection::connect_with(&connect_options)).await {
            Err(_) => return Err(timeout_error("no answer".to_owned())),
            Ok(Err(e)) => {
                return Err(ConnectError::Unavailable {
                    url: shown,
                    detail: clean(e.to_string()),
                });
            }
            // Closing the probe politely is best effort; the server cleans up anyway.
            Ok(Ok(probe)) => {
                let _ = probe.close().await;
            }
        }
        // Migrate through a dedicated one-connection pool: closing it closes the
        // connection, which releases the migration lock even if a migration failed.
        let migrating = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(timeout)
            .test_before_acquire(false)
            .connect_lazy_with(connect_options.clone());
        let migrated = schema::migrator().run(&migrating).await;
        migrating.close().await;
        migrated.map_err(|e| ConnectError::Migration {
            url: shown.clone(),
            detail: clean(e.to_string()),
        })?;
        tracing::debug!(url = %shown, strategy = %options.strategy, "connected and migrated");

        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(timeout)
            // One statement is one round trip: no hidden ping on acquire. A dead
            // connection surfaces as an Unavailable fault and is replaced.
            .test_before_acquire(false)
            .connect_lazy_with(connect_options.clone());
        let wake = if options.wakeups {
            Wake::across_instances(pool.clone(), &connect_options)
        } else {
            Wake::in_process()
        };
        Ok(PgBackend {
            inner: Arc::new(Inner {
                pool,
                strategy: options.strategy,
                wake,
                claim_lines: (0..CLAIM_LINE_STRIPES)
                    .map(|_| tokio::sync::Mutex::new(()))
                    .collect(),
                round_trips: AtomicU64::new(0),
                server_errors: AtomicU64::new(0),
            }),
        })
    }

    /// The four ports, all backed by this instance.
    pub fn stores(&self) -> Stores {
        Stores::shared(Arc::new(self.clone()))
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
        }
        result
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.inner.pool
    }
}

#[cfg(test)]
mod tests {
    use super::password_of;

    #[test]
    fn password_is_found_in_user_info_or_query() {
        assert_eq!(password_of("postgres://u:pw@h/db").as_deref(), Some("pw"));
        assert_eq!(
            password_of("postgres://u@h/db?sslmode=disable&password=pw2").as_deref(),
            Some("pw2")
        );
        assert_eq!(password_of("postgres://u@h/db"), None);
    }
}
