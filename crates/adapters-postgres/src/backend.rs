//! The backend: connecting, migrating, and the instance the four port
//! implementations share (its pool and statement counters are
//! `session::Sessions`).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use holdfast_ports::Stores;
use sqlx::Connection;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, PgPoolOptions, Postgres};

use crate::durability::{self, Durability};
use crate::error::ConnectError;
use crate::hosts::{Hosts, ParseError, TargetSessionAttrs};
use crate::options::{LockStrategy, PgOptions};
use crate::route::{self, Follower, HostOutcome, Route};
use crate::schema;
use crate::session::{self, Health, Sessions};
use crate::url::{redact_url, scrub, secrets, unescaped_in_password};
use crate::wake::Wake;

/// How many in-process turns the read-and-claims of a backend take by line
/// (`locks` maps a line to its turn).
pub(crate) const CLAIM_LINE_STRIPES: usize = 64;

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
    /// The pool, its health and the statement counters.
    pub(crate) sessions: Sessions,
    /// The URL's hosts and the one new connections go to.
    pub(crate) route: Arc<Route>,
    /// Walks the hosts when the primary may have moved (several hosts only).
    follower: Follower,
    /// The server's settings at connect.
    durability: Option<Durability>,
    /// The bound on a read-and-claim's wait for its line's advisory lock.
    pub(crate) line_wait: std::time::Duration,
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
}

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend")
            .field("strategy", &self.inner.strategy)
            .field("host", &self.current_host())
            .field("round_trips", &self.round_trips())
            .field("server_errors", &self.server_errors())
            .finish_non_exhaustive()
    }
}

impl PgBackend {
    /// Connects to the database at `url`, applies the embedded migrations (one
    /// replica at a time, under PostgreSQL's migration advisory lock) and returns
    /// the backend. No connection is held afterwards until an operation needs one.
    ///
    /// The URL may name several hosts of one cluster and the kind of session
    /// wanted (`postgres://app@h1:5432,h2:5433/db?target_session_attrs=read-write`,
    /// `docs/postgres-failover.md`): the first host, in order, that gives one is
    /// used, and the backend follows the primary when it moves. The server's
    /// settings are read once; every way they let an acknowledged commit be lost
    /// is logged with `tracing::warn!` ([`PgBackend::durability`]).
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
        let hosts = Hosts::parse(url).map_err(|e| match e {
            ParseError::Hosts(source) => ConnectError::Hosts {
                url: shown.clone(),
                source,
            },
            ParseError::Driver(e) => ConnectError::InvalidUrl {
                url: shown.clone(),
                reason: clean(e.to_string()),
            },
        })?;
        let route = Arc::new(Route::new(hosts, &options, secret_forms.clone()));
        let timeout = options.connect_timeout;
        let timeout_error = |detail: String| ConnectError::Timeout {
            url: shown.clone(),
            timeout_ms: timeout.as_millis(),
            detail,
        };

        // Probe with one direct connection per host first (a pool would retry a
        // refused connection until its timeout and hide the reason), in the URL's
        // order, keeping the first that gives the wanted session. A server that is
        // full (too many connections), starting up or restarting, or a standby
        // that may be promoted, is waited for, up to the connect timeout; anything
        // else is answered at once.
        let deadline = tokio::time::Instant::now() + timeout;
        let mut pause = std::time::Duration::from_millis(50);
        let mut probe = loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            // One host: it has the whole wait, as before.
            let bound = if route.several() {
                left.min(route::HOST_TIMEOUT)
            } else {
                left
            };
            let tried = match route.walk(bound).await {
                Ok((i, probe)) => {
                    route.switch(i);
                    break probe;
                }
                Err(tried) => tried,
            };
            let waiting = tried.iter().any(|t| t.outcome.worth_waiting_for());
            if waiting && tokio::time::Instant::now() + pause < deadline {
                tracing::info!(url = %shown, tried = %route::list(&tried), "no host takes the session for now; waiting");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(500));
                continue;
            }
            if !route.plain() {
                return Err(ConnectError::NoHost {
                    url: shown,
                    target: route.target(),
                    tried,
                });
            }
            // One host, no kind asked for: the errors of before.
            return Err(match tried.into_iter().next().map(|t| t.outcome) {
                Some(HostOutcome::Busy(detail)) => timeout_error(detail),
                Some(HostOutcome::Failed(detail)) => {
                    ConnectError::Unavailable { url: shown, detail }
                }
                _ => timeout_error("no answer".to_owned()),
            });
        };
        let durability = match durability::inspect(&mut probe, route.len()).await {
            Ok(found) => Some(found),
            Err(e) => {
                tracing::debug!(error = %clean(e.to_string()), "could not read the durability settings");
                None
            }
        };
        // Closing the probe politely is best effort; the server cleans up.
        let _ = probe.close().await;
        for risk in durability.iter().flat_map(Durability::risks) {
            tracing::warn!(target: durability::DURABILITY_TARGET, url = %shown, host = %route.current_host(), "{risk}");
        }
        // Migrate through a dedicated one-connection pool: closing it closes the
        // connection, which releases the migration lock even if a migration failed.
        let migrating = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(timeout)
            .test_before_acquire(false)
            .connect_lazy_with(session::migrate_options(route.base_options(), &options));
        let migrated = schema::migrator().run(&migrating).await;
        migrating.close().await;
        migrated.map_err(|e| ConnectError::Migration {
            url: shown.clone(),
            detail: clean(e.to_string()),
        })?;
        tracing::debug!(url = %shown, host = %route.current_host(), strategy = %options.strategy, "connected and migrated");

        let health = Arc::new(Health::new());
        let pool = session::pool(&route, &options, health.clone());
        let wake = if options.wakeups {
            Wake::across_instances(
                pool.clone(),
                route.clone(),
                health.clone(),
                options.wake_where_waited,
            )
        } else {
            Wake::in_process()
        };
        let follower = if route.several() {
            Follower::spawn(route.clone(), pool.clone(), health.clone())
        } else {
            Follower::none()
        };
        Ok(PgBackend {
            inner: Arc::new(Inner {
                sessions: Sessions::new(pool, health, options.acquire_timeout),
                route,
                follower,
                durability,
                line_wait: options.line_wait,
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
            }),
        })
    }

    /// What the server's settings said when this instance connected (see
    /// [`Durability::risks`]); `None` when the role could not read them.
    pub fn durability(&self) -> Option<&Durability> {
        self.inner.durability.as_ref()
    }

    /// The host new connections go to (`name:port`): the URL's only host, or the
    /// one the last walk found (it moves with the primary).
    pub fn current_host(&self) -> &str {
        self.inner.route.current_host()
    }

    /// The kind of session every connection gets (`target_session_attrs`; `any`
    /// for a single-host URL that does not ask).
    pub fn target(&self) -> TargetSessionAttrs {
        self.inner.route.target()
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
        self.inner.sessions.round_trips()
    }

    /// Read-and-claims so far that found their wallet and type's advisory lock held
    /// for longer than [`PgOptions::line_wait`] and read and claimed without it.
    pub fn lines_busy(&self) -> u64 {
        self.inner.lines_busy.load(Ordering::Relaxed)
    }

    /// Keys freed here so far and sent to the other instances (`NOTIFY`): keys
    /// another instance waited for, every key while this one may have missed
    /// announcements, and catch-ups (`docs/wakeups.md`).
    pub fn wakes_sent(&self) -> u64 {
        self.inner.wake.counts.sent.load(Ordering::Relaxed)
    }

    /// Keys freed here so far and not sent: no other instance waited for them.
    pub fn wakes_withheld(&self) -> u64 {
        self.inner.wake.counts.withheld.load(Ordering::Relaxed)
    }

    /// Statements the server answered with an error so far (including unique
    /// violations the `insert` strategy reports as contended).
    pub fn server_errors(&self) -> u64 {
        self.inner.sessions.server_errors()
    }

    /// Closes the pool: waits for connections in use to come back, then closes all;
    /// stops listening for wake-ups.
    pub async fn close(&self) {
        self.inner.follower.stop();
        self.inner.wake.stop();
        self.inner.sessions.pool().close().await;
    }

    /// The pool, its health and the statement counters: sessions, transactions
    /// and single statements run on them.
    pub(crate) fn sessions(&self) -> &Sessions {
        &self.inner.sessions
    }

    /// [`Sessions::note`].
    pub(crate) fn note<T>(&self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        self.inner.sessions.note(result)
    }

    /// [`Sessions::pool`].
    pub(crate) fn pool(&self) -> &PgPool {
        self.inner.sessions.pool()
    }

    /// [`Sessions::connection`].
    pub(crate) async fn connection(&self) -> Result<PoolConnection<Postgres>, sqlx::Error> {
        self.inner.sessions.connection().await
    }

    /// [`Sessions::retried`]: a statement that is safe to repeat.
    pub(crate) async fn retried<T, F, Fut>(&self, attempt: F) -> Result<T, sqlx::Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        self.inner.sessions.retried(attempt).await
    }

    /// [`Sessions::once`]: a statement that must not run twice.
    pub(crate) async fn once<T, F, Fut>(&self, attempt: F) -> Result<T, sqlx::Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        self.inner.sessions.once(attempt).await
    }
}
