//! Which server of the URL the pools connect to, and following the primary when
//! it moves (`docs/postgres-failover.md`).
//!
//! - **A new connection gets the wanted kind of session or none.** When the URL
//!   asks for one (`target_session_attrs` `read-write` or `primary`, the default
//!   with several hosts), every new pooled connection is asked its server's role
//!   ([`ROLE`], one round trip) before anyone uses it, and closed if it does not
//!   fit; a pooled connection idle long enough to be pinged ([`crate::session`])
//!   is asked the same question instead of the ping, so a connection left on a
//!   server that became a standby or read-only is closed, not handed out.
//! - **The walk.** [`Route::walk`] tries the hosts in the URL's order, each within
//!   [`HOST_TIMEOUT`], and keeps the first whose session fits: the host new
//!   connections go to. When several hosts are named, a follower task walks again
//!   whenever the instance sees a sign that the server may have moved (a broken
//!   connection, a connection that could not be made within an acquire slice, a
//!   session that does not fit) and, until a host fits, every 50 ms doubling to 1 s.
//!   It points the pool's connect options at the host it found; new connections
//!   (the pool's and the wake-up listener's) go there, and idle ones are checked
//!   before their next use.
//!
//! With one host and no `target_session_attrs` nothing here runs: the pool pings
//! suspect connections as before and never walks.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{Connection, PgConnection};
use tokio::task::JoinHandle;

use crate::hosts::{Host, Hosts, TargetSessionAttrs};
use crate::options::PgOptions;
use crate::session::{self, Health};
use crate::url::scrub;

/// The question a new or suspect connection is asked when the URL wants a kind
/// of session: is the server in recovery (a standby), and are its sessions
/// read-only (`transaction_read_only` follows `default_transaction_read_only`
/// and is on during recovery).
pub const ROLE: &str =
    "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'";

/// How long the walk waits for one host (connection and [`ROLE`]) before it
/// tries the next: a host that vanished without a reset does not hold up the
/// others for long.
pub const HOST_TIMEOUT: Duration = Duration::from_secs(2);

/// The follower's first pause after a walk found no host, doubling to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// What a server says about its sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerRole {
    /// `pg_is_in_recovery()`: a standby (or a server still replaying its WAL).
    pub in_recovery: bool,
    /// `transaction_read_only` of a new session.
    pub read_only: bool,
}

impl fmt::Display for ServerRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match (self.in_recovery, self.read_only) {
            (true, _) => "a standby (in recovery)",
            (false, true) => "read-only (default_transaction_read_only is on)",
            (false, false) => "read-write",
        })
    }
}

/// One host a walk tried, and why it was passed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostTried {
    /// The host as `name:port`.
    pub host: String,
    /// What it answered.
    pub outcome: HostOutcome,
}

impl fmt::Display for HostTried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.host, self.outcome)
    }
}

/// Why a host was passed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostOutcome {
    /// Connecting failed (refused, reset, authentication, TLS); the driver's
    /// message, password removed.
    Failed(String),
    /// The server answered but takes no session now (full, starting up, shutting
    /// down): worth waiting for.
    Busy(String),
    /// No answer within the bound.
    NoAnswer {
        /// The bound, in milliseconds.
        after_ms: u128,
    },
    /// The server gives another kind of session.
    Role(ServerRole),
}

impl HostOutcome {
    /// Whether waiting may change the answer: a busy server, or one whose role
    /// may change (a standby about to be promoted).
    pub fn worth_waiting_for(&self) -> bool {
        matches!(self, HostOutcome::Busy(_) | HostOutcome::Role(_))
    }
}

impl fmt::Display for HostOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostOutcome::Failed(detail) => write!(f, "failed: {detail}"),
            HostOutcome::Busy(detail) => write!(f, "takes no session now: {detail}"),
            HostOutcome::NoAnswer { after_ms } => write!(f, "did not answer within {after_ms} ms"),
            HostOutcome::Role(role) => write!(f, "is {role}"),
        }
    }
}

/// The role of the server of `conn` ([`ROLE`]).
pub(crate) async fn role(conn: &mut PgConnection) -> Result<ServerRole, sqlx::Error> {
    let (in_recovery, read_only): (bool, bool) = sqlx::query_as(ROLE).fetch_one(conn).await?;
    Ok(ServerRole {
        in_recovery,
        read_only,
    })
}

/// The hosts of one instance and the one new connections go to.
#[derive(Debug)]
pub(crate) struct Route {
    hosts: Vec<Host>,
    /// Each host's options with the session settings: what the pool connects with.
    pooled: Vec<PgConnectOptions>,
    target: TargetSessionAttrs,
    current: AtomicUsize,
    /// The password's forms, removed from every message.
    secrets: Vec<String>,
}

impl Route {
    pub(crate) fn new(hosts: Hosts, options: &PgOptions, secrets: Vec<String>) -> Route {
        let pooled = hosts
            .hosts
            .iter()
            .map(|h| session::connect_options(h.options.clone(), options))
            .collect();
        Route {
            hosts: hosts.hosts,
            pooled,
            target: hosts.target,
            current: AtomicUsize::new(0),
            secrets,
        }
    }

    /// The kind of session wanted.
    pub(crate) fn target(&self) -> TargetSessionAttrs {
        self.target
    }

    /// Whether the URL names more than one host (a follower walks them).
    pub(crate) fn several(&self) -> bool {
        self.hosts.len() > 1
    }

    /// How many hosts the URL names.
    pub(crate) fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Whether connections are checked at all: one host without a wanted kind
    /// behaves as before.
    pub(crate) fn plain(&self) -> bool {
        !self.several() && self.target == TargetSessionAttrs::Any
    }

    /// The host new connections go to, as `name:port`.
    pub(crate) fn current_host(&self) -> &str {
        &self.hosts[self.current()].shown
    }

    fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// The pool's options for the current host.
    pub(crate) fn pool_options(&self) -> PgConnectOptions {
        self.pooled[self.current()].clone()
    }

    /// The current host's options before the session settings (the migrating
    /// connection sets its own).
    pub(crate) fn base_options(&self) -> PgConnectOptions {
        self.hosts[self.current()].options.clone()
    }

    /// Whether the session on `conn` is of the wanted kind: `Ok(Err(role))` when
    /// it is not. Without a wanted kind this is a ping. One round trip either way.
    pub(crate) async fn verify(
        &self,
        conn: &mut PgConnection,
    ) -> Result<Result<(), ServerRole>, sqlx::Error> {
        if self.target == TargetSessionAttrs::Any {
            return conn.ping().await.map(Ok);
        }
        let role = role(conn).await?;
        Ok(if self.target.accepts(role) {
            Ok(())
        } else {
            Err(role)
        })
    }

    /// The error a pool's new connection on a server of another kind fails with
    /// (the pool closes it and tries again).
    pub(crate) fn misfit(&self, role: ServerRole) -> sqlx::Error {
        sqlx::Error::Configuration(
            format!(
                "the server is {role}, not a {} session (target_session_attrs); looking for another host",
                self.target
            )
            .into(),
        )
    }

    /// Connects to host `i` within `bound` and checks its session.
    async fn probe(&self, i: usize, bound: Duration) -> Result<PgConnection, HostOutcome> {
        let attempt = async {
            let mut conn = PgConnection::connect_with(&self.pooled[i]).await?;
            match self.verify(&mut conn).await {
                Ok(Ok(())) => Ok(Ok(conn)),
                Ok(Err(role)) => {
                    let _ = conn.close().await;
                    Ok(Err(role))
                }
                Err(e) => Err(e),
            }
        };
        match tokio::time::timeout(bound, attempt).await {
            Err(_) => Err(HostOutcome::NoAnswer {
                after_ms: bound.as_millis(),
            }),
            Ok(Ok(Ok(conn))) => Ok(conn),
            Ok(Ok(Err(role))) => Err(HostOutcome::Role(role)),
            Ok(Err(e)) if session::worth_waiting_for(&e) => {
                Err(HostOutcome::Busy(scrub(&e.to_string(), &self.secrets)))
            }
            Ok(Err(e)) => Err(HostOutcome::Failed(scrub(&e.to_string(), &self.secrets))),
        }
    }

    /// Tries the current host first, then the others in order, each within
    /// `bound`: the first whose session fits, with its connection; else what each
    /// answered. Sticky: while the current host fits, the instance stays, so an
    /// old primary that comes back writable earlier in the list (a split brain)
    /// never pulls an instance away from the promoted one.
    pub(crate) async fn walk(
        &self,
        bound: Duration,
    ) -> Result<(usize, PgConnection), Vec<HostTried>> {
        let current = self.current();
        let order = std::iter::once(current).chain((0..self.hosts.len()).filter(|&i| i != current));
        let mut tried = Vec::with_capacity(self.hosts.len());
        for i in order {
            let host = &self.hosts[i];
            match self.probe(i, bound).await {
                Ok(conn) => return Ok((i, conn)),
                Err(outcome) => tried.push(HostTried {
                    host: host.shown.clone(),
                    outcome,
                }),
            }
        }
        Err(tried)
    }

    /// Sends new connections to host `i`; whether that changed anything.
    pub(crate) fn switch(&self, i: usize) -> bool {
        self.current.swap(i, Ordering::Relaxed) != i
    }
}

/// Joins what a walk tried into one line.
pub(crate) fn list(tried: &[HostTried]) -> String {
    tried
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The follower of an instance whose URL names several hosts: walks whenever
/// `health` asks (see the module docs) and points `pool` at the host it finds.
/// Aborted on drop.
#[derive(Debug)]
pub(crate) struct Follower(Option<JoinHandle<()>>);

impl Follower {
    /// No follower: one host.
    pub(crate) fn none() -> Follower {
        Follower(None)
    }

    pub(crate) fn spawn(route: Arc<Route>, pool: PgPool, health: Arc<Health>) -> Follower {
        Follower(Some(tokio::spawn(follow(route, pool, health))))
    }

    pub(crate) fn stop(&self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn follow(route: Arc<Route>, pool: PgPool, health: Arc<Health>) {
    loop {
        health.look_requested().await;
        let mut pause = FIRST_PAUSE;
        let mut searching = false;
        loop {
            match route.walk(HOST_TIMEOUT).await {
                Ok((i, conn)) => {
                    let _ = conn.close().await;
                    if route.switch(i) {
                        pool.set_connect_options(route.pool_options());
                        // Idle connections may still be on the server left behind:
                        // each is checked before its next use.
                        health.suspect_all();
                        tracing::warn!(
                            host = %route.current_host(),
                            target = %route.target(),
                            "new connections go to {} now", route.current_host()
                        );
                    } else if searching {
                        tracing::info!(host = %route.current_host(), "found the {} session again", route.target());
                    }
                    break;
                }
                Err(tried) => {
                    if searching {
                        tracing::debug!(tried = %list(&tried), "still no host gives a {} session", route.target());
                    } else {
                        tracing::warn!(tried = %list(&tried), "no host gives a {} session; looking again", route.target());
                        searching = true;
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                }
            }
        }
    }
}
