//! Sessions: the settings every connection holdfast opens applies, the pool
//! ([`Sessions`]: the pool, its [`Health`] and the statement counters, which the
//! backend instance holds), and the rules that keep a pooled connection clean.
//! This module does not know the backend; the backend builds on it.
//!
//! - **A transaction is owned before anything in it can fail.** Multi-statement
//!   transactions run on a [`Tx`], which holds its pooled connection in a
//!   [`Session`]: until `COMMIT` or `ROLLBACK` has answered, a failed statement, a
//!   server-side timeout or a dropped future closes the connection instead of
//!   returning it to the pool inside a transaction (where later statements would
//!   be acknowledged and never committed). sqlx's own `begin` counts a
//!   transaction only once its `BEGIN` has answered, so it is not used.
//! - **Every session bounds its waits** ([`session_settings`]): `lock_timeout`,
//!   `statement_timeout`, `idle_in_transaction_session_timeout` and server-side
//!   TCP keepalives, so a frozen or vanished replica's session is ended by the
//!   server and releases what it held. It also runs its transactions at READ
//!   COMMITTED, whatever the database or role sets (the balance locks need it).
//! - **A broken connection is noticed before a statement is sent on it.** The
//!   pool pings a connection before handing it out when it has been idle since
//!   the last broken connection this instance saw (a statement failing on a
//!   broken connection, or the wake-up listener having had to reconnect:
//!   [`Health`]), or for longer than [`PING_IDLE_AFTER`]; and
//!   [`Sessions`] retries a statement that is safe to repeat once when its
//!   connection broke under it. When the URL asks for a kind of session
//!   (`crate::route`), the ping is the role question, so a connection on a server
//!   that became a standby or read-only is closed too; a write refused as
//!   read-only counts as a broken connection.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{PgConnection, Postgres};

use crate::hosts::TargetSessionAttrs;
use crate::options::PgOptions;
use crate::route::Route;

/// A pooled connection idle for longer than this is pinged before use: an idle
/// service's first call after a server restart finds a live connection.
pub const PING_IDLE_AFTER: Duration = Duration::from_secs(1);

/// How long after a breakage a connection handed back still counts as idle since
/// before it (see [`Health`]): the failed statement's own connection returns to
/// the pool after the failure was noted.
const RETURN_GRACE: Duration = Duration::from_secs(1);

/// The longest one request to the pool waits; callers ask again until the
/// configured acquire timeout ([`Sessions::connection`] keeps waiting, the pool does
/// not). A request that opens a new connection spends its slice on the connect
/// and the health ping too, so the slice is far above a connection's setup
/// (TCP, TLS, authentication: milliseconds on a LAN) and equal to the ping's
/// bound; a caller waiting on a full server looks at the idle queue again at
/// least this often.
pub const ACQUIRE_SLICE: Duration = Duration::from_secs(2);

/// How long the ping of a suspect connection may take before it counts as broken
/// (at most [`ACQUIRE_SLICE`], which covers it).
pub const PING_TIMEOUT: Duration = Duration::from_millis(1500);

/// Server-side TCP keepalive: probes after this much silence, then every
/// [`KEEPALIVE_INTERVAL`], [`KEEPALIVE_COUNT`] times, before the server ends the
/// session of a client that vanished (a paused VM, a partition without RST).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// See [`KEEPALIVE_INTERVAL`].
pub const KEEPALIVE_COUNT: u32 = 3;

/// The `SET` parameters every session holdfast opens starts with (sent in the
/// startup packet, so they hold from the first statement, also on the wake-up
/// listener's connection). Durations are whole milliseconds (seconds for the
/// keepalive settings, as PostgreSQL takes them). Transactions run at READ
/// COMMITTED whatever the database or role defaults to: the balance locks'
/// argument needs each statement's own snapshot (a read after a lock wait sees
/// what the lock's holder committed), and `holdfast_lock_balances` refuses any
/// other level (migration 0007).
pub fn session_settings(options: &PgOptions) -> Vec<(&'static str, String)> {
    let ms = |d: Duration| d.as_millis().to_string();
    let secs = |d: Duration| d.as_secs().max(1).to_string();
    vec![
        ("default_transaction_isolation", "read committed".to_owned()),
        ("lock_timeout", ms(options.lock_timeout)),
        ("statement_timeout", ms(options.statement_timeout)),
        (
            "idle_in_transaction_session_timeout",
            ms(options.idle_in_transaction_timeout),
        ),
        ("tcp_keepalives_idle", secs(options.keepalive_idle)),
        ("tcp_keepalives_interval", secs(KEEPALIVE_INTERVAL)),
        ("tcp_keepalives_count", KEEPALIVE_COUNT.to_string()),
    ]
}

/// `base` with holdfast's application name and session settings.
pub(crate) fn connect_options(base: PgConnectOptions, options: &PgOptions) -> PgConnectOptions {
    base.application_name("holdfast")
        .options(session_settings(options))
}

/// `base` for the migrating connection: no lock or statement timeout (a replica
/// waits for another's migration under the migration lock, and a migration may
/// rebuild a large table), whatever the role or database sets; a generous
/// idle-in-transaction timeout and the keepalives, so a replica that vanishes
/// mid-migration does not hold the migration lock for hours.
pub(crate) fn migrate_options(base: PgConnectOptions, options: &PgOptions) -> PgConnectOptions {
    let keepalives = session_settings(options)
        .into_iter()
        .filter(|(name, _)| name.starts_with("tcp_keepalives"));
    base.application_name("holdfast-migrate").options(
        [
            ("lock_timeout", "0".to_owned()),
            ("statement_timeout", "0".to_owned()),
            ("idle_in_transaction_session_timeout", "600000".to_owned()),
        ]
        .into_iter()
        .chain(keepalives),
    )
}

/// What the instance knows of its connections' health: when it last saw one
/// broken; and the signal that the server may have moved, which the route's
/// follower waits for (`crate::route`).
#[derive(Debug)]
pub(crate) struct Health {
    started: Instant,
    /// Milliseconds after `started` of the last broken connection, plus one (0:
    /// none seen).
    last_broken: AtomicU64,
    /// Asks the follower (if any) to walk the hosts again; one stored permit
    /// gathers any number of asks.
    look: tokio::sync::Notify,
}

impl Health {
    pub(crate) fn new() -> Health {
        Health {
            started: Instant::now(),
            last_broken: AtomicU64::new(0),
            look: tokio::sync::Notify::new(),
        }
    }

    /// Notes that a connection was found broken now (or on a server of the wrong
    /// kind): idle connections are suspect, and the primary may have moved.
    pub(crate) fn broken(&self) {
        self.suspect_all();
        self.look_again();
    }

    /// Makes every connection idle since now suspect, without asking for a walk
    /// (the follower itself, having moved to another host).
    pub(crate) fn suspect_all(&self) {
        self.broken_at(self.started.elapsed());
    }

    /// Asks the follower to walk the hosts again: no connection could be made,
    /// or a new one was on a server of the wrong kind.
    pub(crate) fn look_again(&self) {
        self.look.notify_one();
    }

    /// Waits until someone asks for a walk.
    pub(crate) async fn look_requested(&self) {
        self.look.notified().await;
    }

    /// Marks a breakage at `elapsed`, reaching [`RETURN_GRACE`] past it: the
    /// connection whose statement failed (a read-only refusal after a failover
    /// leaves it alive) goes back to the pool only after the failure is noted,
    /// and must be checked before its next use too.
    fn broken_at(&self, elapsed: Duration) {
        let at = u64::try_from((elapsed + RETURN_GRACE).as_millis()).unwrap_or(u64::MAX - 1);
        self.last_broken.store(at + 1, Ordering::Relaxed);
    }

    /// Whether a connection idle for `idle_for` may be broken without anyone having
    /// used it since: idle since before the last broken connection, or long idle.
    fn suspect(&self, idle_for: Duration) -> bool {
        self.suspect_at(self.started.elapsed(), idle_for)
    }

    fn suspect_at(&self, elapsed: Duration, idle_for: Duration) -> bool {
        if idle_for >= PING_IDLE_AFTER {
            return true;
        }
        match self.last_broken.load(Ordering::Relaxed) {
            0 => false,
            at => idle_for >= elapsed.saturating_sub(Duration::from_millis(at - 1)),
        }
    }
}

/// Whether `e` says the connection itself is gone (the server restarted or ended
/// the session, the socket broke), or is on a server that refuses writes (a
/// standby, a read-only primary: `read_only_sql_transaction`, which refuses
/// before anything is written), as opposed to a statement failing on a live
/// connection.
pub(crate) fn broken(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => {
            matches!(
                db.code().as_deref(),
                // admin_shutdown, crash_shutdown, cannot_connect_now, idle session /
                // idle-in-transaction timeouts (the session is ended), read-only
                Some("57P01" | "57P02" | "57P03" | "57P05" | "25P03" | "25006")
            ) || db.code().is_some_and(|c| c.starts_with("08"))
        }
        _ => false,
    }
}

/// Whether a failed connection attempt is worth waiting out: the server answers
/// but takes no session now (full: `too_many_connections`, also the role's or
/// database's limit; starting up; shutting down for a restart). A refused TCP
/// connection is answered at once (a wrong port should not take the timeout).
pub(crate) fn worth_waiting_for(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            matches!(db.code().as_deref(), Some("53300" | "57P03" | "57P01"))
        }
        _ => false,
    }
}

/// The pool of an instance: sizes and timeouts from `options`, connections to
/// `route`'s current host, each new one of the wanted kind (when the URL asks
/// for one), and a ping (or the role question) before handing out a connection
/// that [`Health`] suspects.
pub(crate) fn pool(route: &Arc<Route>, options: &PgOptions, health: Arc<Health>) -> PgPool {
    let mut pool = PgPoolOptions::new();
    if route.target() != TargetSessionAttrs::Any {
        let (route, health) = (route.clone(), health.clone());
        pool = pool.after_connect(move |conn, _meta| {
            let (route, health) = (route.clone(), health.clone());
            Box::pin(async move {
                match route.verify(conn).await? {
                    Ok(()) => Ok(()),
                    Err(role) => {
                        // The pool closes it and connects again, to the host the
                        // follower finds.
                        health.look_again();
                        Err(route.misfit(role))
                    }
                }
            })
        });
    }
    let checker = route.clone();
    pool.max_connections(options.max_connections)
        .min_connections(options.min_connections)
        // Waits beyond a slice are Sessions::connection's loop.
        .acquire_timeout(options.acquire_timeout.min(ACQUIRE_SLICE))
        .idle_timeout(options.idle_timeout)
        .max_lifetime(options.max_lifetime)
        // No ping on every acquire (one statement is one round trip); only a
        // suspect connection is pinged, below.
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            let (health, route) = (health.clone(), checker.clone());
            Box::pin(async move {
                if health.suspect(meta.idle_for) {
                    // A ping unanswered within PING_TIMEOUT (a half-open socket) is
                    // as broken as one that fails; one on a server of the wrong
                    // kind is closed too.
                    match tokio::time::timeout(PING_TIMEOUT, route.verify(conn)).await {
                        Ok(Ok(Ok(()))) => {}
                        Ok(Ok(Err(role))) => {
                            health.broken();
                            tracing::info!(%role, "closing a pooled connection on a server of the wrong kind");
                            return Ok(false);
                        }
                        Ok(Err(e)) => {
                            health.broken();
                            // The pool closes it and hands out another.
                            return Err(e);
                        }
                        Err(_) => {
                            health.broken();
                            return Ok(false);
                        }
                    }
                }
                Ok(true)
            })
        })
        .connect_lazy_with(route.pool_options())
}

/// A pooled connection that goes back to the pool only when its user said it is
/// clean ([`Session::clean`]); dropped otherwise (an error, a cancelled future),
/// it is closed, so its unknown state can never reach another caller.
pub(crate) struct Session {
    conn: PoolConnection<Postgres>,
    clean: bool,
}

impl Session {
    /// Takes a connection from the pool.
    pub(crate) async fn acquire(sessions: &Sessions) -> Result<Session, sqlx::Error> {
        let conn = sessions.connection().await?;
        Ok(Session { conn, clean: false })
    }

    /// The connection, for statements.
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        &mut self.conn
    }

    /// Marks the connection clean (outside any transaction, nothing pending): it
    /// goes back to the pool when dropped.
    pub(crate) fn clean(&mut self) {
        self.clean = true;
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if !self.clean {
            self.conn.close_on_drop();
        }
    }
}

/// A transaction owned from its first byte: `BEGIN` (with whatever statements
/// `begin` appends, in the same round trip) is sent on a [`Session`], and only an
/// answered `COMMIT` or `ROLLBACK` makes the connection clean again.
pub(crate) struct Tx {
    session: Session,
}

impl Tx {
    /// Begins a transaction with `BEGIN`.
    pub(crate) async fn begin(sessions: &Sessions) -> Result<Tx, sqlx::Error> {
        let session = Session::acquire(sessions).await?;
        Tx::begin_on(sessions, session, "BEGIN").await
    }

    /// Begins a transaction on `session` with `begin`, a simple-query text that
    /// starts with `BEGIN` (one round trip). If the server answers an error (a
    /// statement after `BEGIN` failed, say a lock wait ran out), the aborted
    /// transaction is rolled back and the clean connection goes back to the pool;
    /// on any other error, or if this future is dropped, the connection is closed.
    pub(crate) async fn begin_on(
        sessions: &Sessions,
        mut session: Session,
        begin: impl Into<String>,
    ) -> Result<Tx, sqlx::Error> {
        match simple(sessions, session.conn(), begin.into()).await {
            Ok(()) => Ok(Tx { session }),
            Err(e @ sqlx::Error::Database(_)) if !broken(&e) => {
                if simple(sessions, session.conn(), "ROLLBACK".to_owned())
                    .await
                    .is_ok()
                {
                    session.clean();
                }
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// The connection, for the transaction's statements.
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        self.session.conn()
    }

    /// Commits; the connection is clean only if `COMMIT` answered. A failed
    /// `COMMIT` may have committed: callers treat it as ambiguous.
    pub(crate) async fn commit(mut self, sessions: &Sessions) -> Result<Session, sqlx::Error> {
        simple(sessions, self.session.conn(), "COMMIT".to_owned()).await?;
        self.session.clean();
        Ok(self.session)
    }

    /// Rolls back; the connection is clean only if `ROLLBACK` answered.
    pub(crate) async fn rollback(mut self, sessions: &Sessions) -> Result<Session, sqlx::Error> {
        simple(sessions, self.session.conn(), "ROLLBACK".to_owned()).await?;
        self.session.clean();
        Ok(self.session)
    }
}

/// Runs `text` (one or more statements, no parameters) as one simple query: one
/// round trip.
async fn simple(
    sessions: &Sessions,
    conn: &mut PgConnection,
    text: String,
) -> Result<(), sqlx::Error> {
    sessions
        .note(sqlx::raw_sql(sqlx::AssertSqlSafe(text)).execute(conn).await)
        .map(drop)
}

/// The pool of one backend instance and what every statement sent through it
/// shares: the instance's [`Health`], the acquire timeout, and the counts of
/// statements and of server errors. The backend instance holds one; sessions,
/// transactions and single statements ([`Sessions::retried`], [`Sessions::once`])
/// run on it.
pub(crate) struct Sessions {
    pool: PgPool,
    health: Arc<Health>,
    /// How long a call waits for a pooled connection in all.
    acquire_timeout: Duration,
    round_trips: AtomicU64,
    server_errors: AtomicU64,
}

impl Sessions {
    /// The sessions of `pool`, which reports broken connections to `health`.
    pub(crate) fn new(pool: PgPool, health: Arc<Health>, acquire_timeout: Duration) -> Sessions {
        Sessions {
            pool,
            health,
            acquire_timeout,
            round_trips: AtomicU64::new(0),
            server_errors: AtomicU64::new(0),
        }
    }

    /// The pool.
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Statements sent so far (each one round trip).
    pub(crate) fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// Statements the server answered with an error so far.
    pub(crate) fn server_errors(&self) -> u64 {
        self.server_errors.load(Ordering::Relaxed)
    }

    /// Counts one statement and, if the server answered with an error, one server
    /// error; a broken connection is told to the [`Health`]. Passes the result
    /// through.
    pub(crate) fn note<T>(&self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        if let Err(sqlx::Error::Database(_)) = &result {
            self.server_errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Err(e) = &result {
            tracing::debug!(error = %e, "statement failed");
            if broken(e) {
                self.health.broken();
            }
        }
        result
    }

    /// A connection from the pool, waiting up to the acquire timeout. The pool
    /// itself is asked for at most [`ACQUIRE_SLICE`] at a time: a caller waiting
    /// on a full server (opening a new connection, refused) looks at the idle
    /// queue again after each slice, so it takes a connection another call
    /// hands back instead of waiting out the whole timeout.
    pub(crate) async fn connection(&self) -> Result<PoolConnection<Postgres>, sqlx::Error> {
        let deadline = tokio::time::Instant::now() + self.acquire_timeout;
        loop {
            match self.pool.acquire().await {
                Err(sqlx::Error::PoolTimedOut) if tokio::time::Instant::now() < deadline => {
                    // No connection within a slice: the server may have moved.
                    self.health.look_again();
                }
                other => return other,
            }
        }
    }

    /// Runs `attempt`, one statement on the pool: again while the pool had no
    /// connection within a slice (nothing was sent), until the acquire timeout;
    /// and, when `repeatable` (a read, an idempotent write), once more if its
    /// connection broke under it (a restarted server), on a connection the pool
    /// checks first.
    async fn on_pool<T, F, Fut>(&self, repeatable: bool, mut attempt: F) -> Result<T, sqlx::Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        let deadline = tokio::time::Instant::now() + self.acquire_timeout;
        let mut repeated = false;
        loop {
            match attempt().await {
                Err(sqlx::Error::PoolTimedOut) if tokio::time::Instant::now() < deadline => {
                    self.health.look_again();
                }
                Err(e) if repeatable && !repeated && broken(&e) => {
                    let _ = self.note::<()>(Err(e));
                    tracing::info!("a pooled connection was broken; retrying once");
                    repeated = true;
                }
                other => return self.note(other),
            }
        }
    }

    /// [`Sessions::on_pool`] for a statement that is safe to repeat.
    pub(crate) async fn retried<T, F, Fut>(&self, attempt: F) -> Result<T, sqlx::Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        self.on_pool(true, attempt).await
    }

    /// [`Sessions::on_pool`] for a statement that must not run twice (a claim, a
    /// compare-and-set): repeated only while it was never sent.
    pub(crate) async fn once<T, F, Fut>(&self, attempt: F) -> Result<T, sqlx::Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        self.on_pool(false, attempt).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_suspects_connections_idle_since_a_breakage_or_long_idle() {
        let health = Health::new();
        let ms = Duration::from_millis;
        assert!(!health.suspect_at(ms(100), ms(10)));
        assert!(health.suspect_at(ms(100), PING_IDLE_AFTER));
        health.broken_at(ms(100));
        // Idle since before the breakage: nobody used it since.
        assert!(health.suspect_at(ms(120), ms(500)));
        assert!(health.suspect_at(ms(120), ms(20)));
        // Handed back just after it: the failed statement's own connection, which
        // may be alive on a server of the wrong kind.
        assert!(health.suspect_at(ms(120), ms(19)));
        assert!(health.suspect_at(ms(100) + RETURN_GRACE + ms(30), ms(31)));
        // Released after the grace (its release ping passed).
        assert!(!health.suspect_at(ms(100) + RETURN_GRACE + ms(30), ms(29)));
    }

    #[test]
    fn every_session_setting_is_read_committed_or_a_positive_number() {
        for (name, value) in session_settings(&PgOptions::default()) {
            if name == "default_transaction_isolation" {
                assert_eq!(value, "read committed");
                continue;
            }
            let n: u64 = value.parse().unwrap_or(0);
            assert!(n > 0, "{name} = {value}");
        }
    }
}
