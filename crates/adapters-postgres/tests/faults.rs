//! PostgreSQL faults: the server terminating the connection in the middle of a
//! release or a settlement, the server going away mid-run (a TCP proxy in this test
//! that can be cut and restored), and bad credentials. Every error and every log
//! line (captured with a test subscriber at TRACE, the driver's included) is checked
//! for the URL's password.
//!
//! Every "mid-statement" moment is made deterministic: a second connection holds a
//! row lock the statement needs, the test waits until the server reports the
//! statement waiting on a lock (`pg_stat_activity`), and only then interferes.
//! Each test gets a fresh database (see `support`); without `DATABASE_URL` they skip
//! loudly or fail as the support module says.

use crate::support;

use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use holdfast_adapters_postgres::{ConnectError, PgBackend, PgOptions};
use holdfast_domain::{ClaimVerdict, TokenId, TxId};
use holdfast_ports::conformance::support::{T0, add, at, chf, token_type, tx, wallet};
use holdfast_ports::{CandidateQuery, LockStoreError, StoreFault, Stores};
use sqlx::{Connection, PgConnection};
use support::TestDb;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Tokens each scenario claims.
const TOKENS: u32 = 8;
/// The token a second connection row-locks to hold a statement mid-way.
const HELD: i64 = 5;

// ---------------------------------------------------------------------------------
// Log capture: a subscriber recording every span and event, fields included.
// ---------------------------------------------------------------------------------

/// Every span and event as one line each: `target level name field=value ...`.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<String>>>);

impl Captured {
    fn push(&self, line: String) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    }

    fn lines(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        let _ = write!(self.0, " {}={value}", field.name());
    }
}

struct CaptureAll {
    lines: Captured,
    next_id: AtomicU64,
}

impl tracing::Subscriber for CaptureAll {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }

    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let meta = span.metadata();
        let mut fields = Fields(format!(
            "span {} {} {}",
            meta.target(),
            meta.level(),
            meta.name()
        ));
        span.record(&mut fields);
        self.lines.push(fields.0);
        tracing::span::Id::from_u64(self.next_id.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut fields = Fields("record".to_owned());
        values.record(&mut fields);
        self.lines.push(fields.0);
    }

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let meta = event.metadata();
        let mut fields = Fields(format!("event {} {}", meta.target(), meta.level()));
        event.record(&mut fields);
        self.lines.push(fields.0);
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// Runs `body` on a current-thread runtime (so every task, the driver's included,
/// runs on this thread) with the capturing subscriber as the thread's default, and
/// returns the captured lines.
fn captured<F: Future<Output = ()>>(body: impl FnOnce() -> F) -> Vec<String> {
    let lines = Captured::default();
    let subscriber = CaptureAll {
        lines: lines.clone(),
        next_id: AtomicU64::new(0),
    };
    {
        let _default = tracing::subscriber::set_default(subscriber);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
            .block_on(body());
    }
    lines.lines()
}

/// Asserts `secret` appears in none of `lines`.
fn assert_no_secret(secret: &str, lines: &[String], what: &str) {
    let leaks: Vec<&String> = lines.iter().filter(|l| l.contains(secret)).collect();
    assert!(
        leaks.is_empty(),
        "the password appears in {what}: {leaks:#?}"
    );
}

/// `Display / Debug` of an error, for the password check.
fn shown(err: &(impl std::fmt::Display + std::fmt::Debug)) -> String {
    format!("{err} / {err:?}")
}

// ---------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------

/// Adds `TOKENS` tokens of tx `name` and claims them all for `consumer`.
async fn claim_all(s: &Stores, name: &str, consumer: &TxId) -> Vec<TokenId> {
    let batch: Vec<_> = (0..TOKENS).map(|i| chf("w", name, i, 1)).collect();
    add(s, &batch).await;
    let window: Vec<TokenId> = batch.iter().map(|t| t.id.clone()).collect();
    let verdicts = s
        .locks
        .claim_window(consumer, &window, T0)
        .await
        .expect("claim the window");
    assert!(
        verdicts.iter().all(|(_, v)| *v == ClaimVerdict::Won),
        "{verdicts:?}"
    );
    window
}

/// Opens a transaction on `blocker` holding the row lock of the lock row of token
/// `HELD` of tx `name`, so a statement deleting it waits.
async fn hold_row(blocker: &mut PgConnection, name: &str) {
    sqlx::query("BEGIN")
        .execute(&mut *blocker)
        .await
        .expect("BEGIN");
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT 1 FROM token_locks WHERE tx_id = $1 AND idx = $2 FOR UPDATE) AS l",
    )
    .bind(name)
    .bind(HELD)
    .fetch_one(&mut *blocker)
    .await
    .expect("row-lock the held token's lock row");
    assert_eq!(held, 1);
}

/// The pid of the backend of application `holdfast` waiting on a lock, once the
/// server reports one (polled on the server, not timed).
async fn waiting_pid(observer: &mut PgConnection) -> i32 {
    for _ in 0..200_000 {
        let pid = sqlx::query_scalar::<_, i32>(
            "SELECT pid FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'holdfast'
               AND wait_event_type = 'Lock'",
        )
        .fetch_optional(&mut *observer)
        .await
        .expect("pg_stat_activity");
        if let Some(pid) = pid {
            return pid;
        }
        tokio::task::yield_now().await;
    }
    panic!("the statement never waited on the held row");
}

/// Lock rows of tx `name` held by `consumer`, and tokens of tx `name` spent by it.
async fn held_and_spent(observer: &mut PgConnection, name: &str, consumer: &TxId) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM token_locks WHERE tx_id = $1 AND consumer = $2),
                (SELECT count(*) FROM tokens WHERE tx_id = $1 AND spent_by = $2)",
    )
    .bind(name)
    .bind(consumer.as_str())
    .fetch_one(&mut *observer)
    .await
    .expect("count lock rows and spent marks")
}

/// The three ways a consumer's locks end.
#[derive(Debug, Clone, Copy)]
enum Release {
    Consumer,
    Tokens,
    Spend,
}

impl Release {
    const ALL: [Release; 3] = [Release::Consumer, Release::Tokens, Release::Spend];

    /// Runs it; the number of tokens released or spent.
    async fn run(
        self,
        s: &Stores,
        consumer: &TxId,
        window: &[TokenId],
    ) -> Result<usize, LockStoreError> {
        match self {
            Release::Consumer => s
                .locks
                .release_consumer(consumer, T0, true)
                .await
                .map(|n| usize::try_from(n).expect("count")),
            Release::Tokens => s
                .locks
                .release_tokens(consumer, window)
                .await
                .map(|n| usize::try_from(n).expect("count")),
            Release::Spend => s
                .locks
                .spend_consumer(consumer, at(1), true)
                .await
                .map(|t| t.len()),
        }
    }
}

// ---------------------------------------------------------------------------------
// pg_terminate_backend in the middle of a release.
// ---------------------------------------------------------------------------------

#[test]
fn a_release_killed_mid_statement_is_retried_all_or_nothing_on_a_fresh_connection() {
    const TEST: &str = "faults::a_release_killed_mid_statement";
    let mut retried = 0;
    let lines = captured(|| async {
        let Some(db) = TestDb::create(TEST).await else {
            return;
        };
        let mut observer = db.connection().await;
        // One connection: the killed one must be replaced for the next call to work.
        let backend = db.backend(Default::default(), 1).await;
        let s = backend.stores();
        for release in Release::ALL {
            let name = format!("kill-{release:?}").to_lowercase();
            let victim = tx(&format!("victim-{name}"));
            let window = claim_all(&s, &name, &victim).await;

            let mut blocker = db.connection().await;
            hold_row(&mut blocker, &name).await;
            let call = {
                let (s, victim, window) = (s.clone(), victim.clone(), window.clone());
                tokio::spawn(async move { release.run(&s, &victim, &window).await })
            };
            let pid = waiting_pid(&mut observer).await;
            let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .fetch_one(&mut observer)
                .await
                .expect("terminate");
            assert!(killed);
            // A release is safe to repeat: it is sent again on a fresh connection
            // (the pool of one replaced the killed one) and waits for the row again.
            // (The killed backend may still be listed for a moment.)
            while waiting_pid(&mut observer).await == pid {
                tokio::task::yield_now().await;
            }
            // Nothing of the killed statement happened: every lock row is still the
            // victim's and nothing is spent.
            assert_eq!(
                held_and_spent(&mut observer, &name, &victim).await,
                (i64::from(TOKENS), 0),
                "{release:?}: all or nothing"
            );
            sqlx::query("COMMIT")
                .execute(&mut blocker)
                .await
                .expect("COMMIT");
            let _ = blocker.close().await;
            let done = call
                .await
                .expect("release task")
                .unwrap_or_else(|e| panic!("{release:?}: the retried call failed: {e}"));
            retried += 1;
            assert_eq!(done, usize::try_from(TOKENS).expect("small"), "{release:?}");
            let spent = match release {
                Release::Spend => i64::from(TOKENS),
                Release::Consumer | Release::Tokens => 0,
            };
            assert_eq!(
                held_and_spent(&mut observer, &name, &victim).await,
                (0, spent),
                "{release:?}"
            );
            // A later claim of the same tokens: won when they were released, stale
            // when they were spent; spent tokens are no longer candidates.
            let next = tx(&format!("next-{name}"));
            let verdicts = s
                .locks
                .claim_window(&next, &window, at(2))
                .await
                .expect("claim after the kill");
            let want = match release {
                Release::Spend => ClaimVerdict::Stale,
                Release::Consumer | Release::Tokens => ClaimVerdict::Won,
            };
            assert!(
                verdicts.iter().all(|(_, v)| *v == want),
                "{release:?}: {verdicts:?}"
            );
            s.locks
                .release_consumer(&next, T0, true)
                .await
                .expect("release");
        }
        let candidates = s
            .tokens
            .candidates(&CandidateQuery {
                wallet: wallet("w"),
                token_type: token_type("CHF"),
                after: None,
                limit: 100,
            })
            .await
            .expect("candidates");
        // Consumer and Tokens released their 8 each; Spend's 8 are spent.
        assert_eq!(
            candidates.len(),
            2 * usize::try_from(TOKENS).expect("small")
        );
    });
    if retried == 0 {
        return; // skipped: no server
    }
    assert_eq!(retried, 3);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("terminat") && l.contains("statement failed")),
        "the adapter logs the killed statement: {lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("retrying once")),
        "the adapter logs the retry: {lines:#?}"
    );
}

// ---------------------------------------------------------------------------------
// The server going away mid-run, through a proxy the test cuts.
// ---------------------------------------------------------------------------------

/// A TCP proxy on 127.0.0.1 to the test server. `cut` closes every proxied
/// connection and stops listening (connections are refused); `restore` listens
/// again on the same port.
struct Proxy {
    port: u16,
    upstream: String,
    accept: Option<JoinHandle<()>>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let mut proxy = Proxy {
            port,
            upstream,
            accept: None,
            links: Arc::default(),
        };
        proxy.serve(listener);
        proxy
    }

    fn serve(&mut self, listener: TcpListener) {
        let (upstream, links) = (self.upstream.clone(), Arc::clone(&self.links));
        self.accept = Some(tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let link = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                links
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(link);
            }
        }));
    }

    /// Stops listening and closes every proxied connection; returns once done.
    async fn cut(&mut self) {
        if let Some(accept) = self.accept.take() {
            accept.abort();
            let _ = accept.await;
        }
        let links: Vec<JoinHandle<()>> = self
            .links
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .collect();
        for link in links {
            link.abort();
            let _ = link.await;
        }
    }

    /// Listens again on the same port.
    async fn restore(&mut self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port))
            .await
            .expect("listen again on the proxy's port");
        self.serve(listener);
    }
}

/// `host:port` of a `postgres://` URL (port 5432 if absent).
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    }
}

/// `url` with its authority replaced by `user:password@127.0.0.1:port`.
fn through(url: &str, user: &str, password: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let path_at = rest.find(['/', '?']).unwrap_or(rest.len());
    format!(
        "{scheme}://{user}:{password}@127.0.0.1:{port}{}",
        &rest[path_at..]
    )
}

/// The user of a `postgres://` URL (`postgres` if absent).
fn user_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    authority
        .rsplit_once('@')
        .map(|(info, _)| info.split(':').next().unwrap_or("postgres").to_owned())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "postgres".to_owned())
}

#[test]
fn the_server_going_away_mid_run_is_unavailable_and_the_pool_recovers_without_the_password() {
    const TEST: &str = "faults::the_server_going_away_mid_run";
    let secret = "pw-Zq8-never-shown";
    let mut errors = Vec::new();
    let lines = captured(|| async {
        let Some(db) = TestDb::create(TEST).await else {
            return;
        };
        let mut proxy = Proxy::start(host_port(&db.url)).await;
        let url = through(&db.url, &user_of(&db.url), secret, proxy.port);
        let backend = PgBackend::connect(
            &url,
            PgOptions {
                max_connections: 1,
                connect_timeout: Duration::from_millis(300),
                ..PgOptions::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("connect through the proxy: {e}"));
        let s = backend.stores();
        let mut observer = db.connection().await;

        // 1. The server goes away while a release waits on a row lock.
        let victim = tx("victim");
        let window = claim_all(&s, "gone", &victim).await;
        let mut blocker = db.connection().await;
        hold_row(&mut blocker, "gone").await;
        let call = {
            let (s, victim) = (s.clone(), victim.clone());
            tokio::spawn(async move { s.locks.release_consumer(&victim, T0, true).await })
        };
        let _ = waiting_pid(&mut observer).await;
        proxy.cut().await;
        match call.await.expect("release task") {
            Err(err @ LockStoreError::Fault(StoreFault::Unavailable(_))) => {
                errors.push(shown(&err));
            }
            other => panic!("release while the server went away: {other:?}"),
        }
        sqlx::query("COMMIT")
            .execute(&mut blocker)
            .await
            .expect("COMMIT");
        let _ = blocker.close().await;
        // The statement was in flight: the server may have finished it after the
        // client vanished, or not; either way all of it or none of it.
        let (held, _) = held_and_spent(&mut observer, "gone", &victim).await;
        assert!(
            held == 0 || held == i64::from(TOKENS),
            "a half-done release: {held} of {TOKENS} lock rows left"
        );

        // 2. While it is away, every call is a typed Unavailable fault once the
        //    configured connect (acquire) timeout passes; none hangs.
        for attempt in 0..2 {
            match s.locks.release_consumer(&victim, T0, true).await {
                Err(err @ LockStoreError::Fault(StoreFault::Unavailable(_))) => {
                    errors.push(shown(&err));
                }
                other => panic!("call {attempt} while the server is away: {other:?}"),
            }
        }
        let refused = PgBackend::connect(&url, PgOptions::default())
            .await
            .expect_err("connecting while the server is away");
        assert!(
            matches!(refused, ConnectError::Unavailable { .. }),
            "{refused:?}"
        );
        errors.push(shown(&refused));

        // 3. It comes back: the next call works (a fresh connection), and the
        //    release completes what the interrupted one did or did not do.
        proxy.restore().await;
        s.locks
            .release_consumer(&victim, T0, true)
            .await
            .expect("release after the server came back");
        assert_eq!(held_and_spent(&mut observer, "gone", &victim).await, (0, 0));
        let next = tx("after");
        let verdicts = s
            .locks
            .claim_window(&next, &window, at(1))
            .await
            .expect("claim after the server came back");
        assert!(
            verdicts.iter().all(|(_, v)| *v == ClaimVerdict::Won),
            "{verdicts:?}"
        );

        // 4. It goes away while the pool holds an idle connection and comes back
        //    before the next call: that call may fail on the dead connection
        //    (typed), the one after works.
        proxy.cut().await;
        proxy.restore().await;
        match s.locks.release_consumer(&next, T0, true).await {
            Ok(_) => {}
            Err(err @ LockStoreError::Fault(StoreFault::Unavailable(_))) => {
                errors.push(shown(&err));
            }
            Err(other) => panic!("first call on a dead pooled connection: {other:?}"),
        }
        s.locks
            .release_consumer(&next, T0, true)
            .await
            .expect("the call after recovers");
        assert_eq!(held_and_spent(&mut observer, "gone", &next).await, (0, 0));
        backend.close().await;
        proxy.cut().await;
    });
    if errors.is_empty() {
        return; // skipped: no server
    }
    assert!(errors.len() >= 4, "{errors:#?}");
    for err in &errors {
        assert!(
            !err.contains(secret),
            "the password appears in an error: {err}"
        );
    }
    assert!(
        errors.iter().any(|e| e.contains("pool timed out")),
        "a call while the server is away ends at the acquire timeout: {errors:#?}"
    );
    assert_no_secret(secret, &lines, "a log line");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("statement failed") && l.contains("error=")),
        "the adapter's failure log was captured: {lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.contains(":***@127.0.0.1")),
        "the redacted URL was logged and captured"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("event sqlx")),
        "the driver's logs were captured too"
    );
}

// ---------------------------------------------------------------------------------
// Bad credentials.
// ---------------------------------------------------------------------------------

#[test]
fn a_missing_role_or_database_is_a_typed_error_naming_it_without_the_password() {
    const TEST: &str = "faults::a_missing_role_or_database";
    let secret = "pw-Kx2-never-shown";
    let mut errors = Vec::new();
    let lines = captured(|| async {
        let Some(db) = TestDb::create(TEST).await else {
            return;
        };
        let server = db.url.clone();
        let port = host_port(&server)
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .expect("the server's port");
        // The test server trusts local users, so a wrong password would be accepted:
        // name a role, then a database, that do not exist.
        let no_role = through(&server, "holdfast_no_such_role", secret, port);
        let no_db = support::with_database(
            &through(&server, &user_of(&server), secret, port),
            "holdfast_no_such_database",
        );
        for (url, named) in [
            (no_role, "role \"holdfast_no_such_role\" does not exist"),
            (
                no_db,
                "database \"holdfast_no_such_database\" does not exist",
            ),
        ] {
            let err = PgBackend::connect(&url, PgOptions::default())
                .await
                .expect_err("bad credentials");
            assert!(matches!(err, ConnectError::Unavailable { .. }), "{err:?}");
            let text = err.to_string();
            assert!(text.contains(named), "names what is wrong: {text}");
            assert!(
                text.contains(":***@127.0.0.1"),
                "shows the redacted URL: {text}"
            );
            errors.push(shown(&err));
        }
    });
    for err in &errors {
        assert!(
            !err.contains(secret),
            "the password appears in an error: {err}"
        );
    }
    assert_no_secret(secret, &lines, "a log line");
}

#[test]
fn url_helpers_find_and_replace_the_authority() {
    assert_eq!(
        host_port("postgres://u@127.0.0.1:5433/db"),
        "127.0.0.1:5433"
    );
    assert_eq!(host_port("postgres://h/db?x=1"), "h:5432");
    assert_eq!(
        through(
            "postgres://u@127.0.0.1:5433/db?sslmode=disable",
            "r",
            "p",
            9
        ),
        "postgres://r:p@127.0.0.1:9/db?sslmode=disable"
    );
    assert_eq!(user_of("postgres://alice:x@h/db"), "alice");
    assert_eq!(user_of("postgres://h/db"), "postgres");
}

// ---------------------------------------------------------------------------------
// statement_timeout: a store call that runs past it is a Timeout fault.
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_past_its_statement_timeout_is_a_timeout_fault_and_can_be_retried() {
    const TEST: &str = "faults::a_statement_past_its_statement_timeout";
    let Some(db) = TestDb::create(TEST).await else {
        return;
    };
    let setup = db.backend(Default::default(), 2).await;
    // The row-lock wait is bounded far beyond the statement: the statement's bound
    // is what runs out (57014 query_canceled, not 55P03 lock_not_available).
    let bounded = PgBackend::connect(
        &db.url,
        PgOptions {
            max_connections: 1,
            line_wait: Duration::from_millis(50),
            lock_timeout: Duration::from_secs(60),
            statement_timeout: Duration::from_millis(300),
            wakeups: false,
            ..PgOptions::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{TEST}: connect: {e}"));
    let (s, timed) = (setup.stores(), bounded.stores());
    for release in Release::ALL {
        let name = format!("timeout-{release:?}").to_lowercase();
        let consumer = tx(&format!("consumer-{name}"));
        let window = claim_all(&s, &name, &consumer).await;
        let mut blocker = db.connection().await;
        hold_row(&mut blocker, &name).await;
        // The blocker holds the row until it commits: the statement waits for it
        // until its statement_timeout ends it.
        let err = release
            .run(&timed, &consumer, &window)
            .await
            .expect_err("the row is held beyond the statement timeout");
        assert!(
            matches!(err, LockStoreError::Fault(StoreFault::Timeout(_))),
            "{release:?}: {err:?}"
        );
        assert_eq!(
            err.fault_kind(),
            Some(holdfast_domain::FaultKind::Timeout),
            "{release:?}"
        );
        sqlx::query("COMMIT")
            .execute(&mut blocker)
            .await
            .expect("COMMIT");
        let _ = blocker.close().await;
        // The session lives on: the same call on the same pool of one succeeds.
        let done = release
            .run(&timed, &consumer, &window)
            .await
            .unwrap_or_else(|e| panic!("{release:?}: the retried call failed: {e}"));
        assert_eq!(done, usize::try_from(TOKENS).expect("small"), "{release:?}");
    }
    bounded.close().await;
    setup.close().await;
}
