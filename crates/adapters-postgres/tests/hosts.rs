//! Multi-host URLs and `target_session_attrs` against one real server
//! (`docs/postgres-failover.md`); the failover itself, with a standby promoted,
//! is the CLI's `failover` test.
//!
//! - A URL naming a host that refuses and then the test server connects to the
//!   second, and works.
//! - When no host gives the wanted session the error names every host tried and
//!   why, never the password.
//! - A database read-only by default (`default_transaction_read_only`, which is
//!   what a standby's sessions report too) is passed over by `read-write`,
//!   taken by `primary` (whose writes then fail as unavailable) and by `any`;
//!   a pool whose server turns read-only never writes there and serves again
//!   once it is read-write.
//! - The durability settings are read at connect.
//!
//! Each test gets a fresh database (see `support`).

use crate::support;

use std::time::{Duration, Instant};

use holdfast_adapters_postgres::{
    CommitRisk, ConnectError, HostOutcome, PgBackend, PgOptions, TargetSessionAttrs,
};
use holdfast_ports::conformance::support::{chf, token_type, wallet};
use holdfast_ports::{StoreFault, TokenStoreError};
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use support::TestDb;

/// `url` with `first` listed before its host.
fn with_host_before(url: &str, first: &str) -> String {
    let start = url
        .rfind('@')
        .map_or_else(|| url.find("://").map_or(0, |i| i + 3), |i| i + 1);
    format!("{}{first},{}", &url[..start], &url[start..])
}

/// `url` with `param` added to its query.
fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// The host part (`host:port`) of `url`.
fn host_of(url: &str) -> String {
    let start = url
        .rfind('@')
        .map_or_else(|| url.find("://").map_or(0, |i| i + 3), |i| i + 1);
    let rest = &url[start..];
    rest[..rest.find(['/', '?']).unwrap_or(rest.len())].to_owned()
}

fn quick() -> PgOptions {
    PgOptions {
        connect_timeout: Duration::from_secs(1),
        acquire_timeout: Duration::from_secs(3),
        wakeups: false,
        ..PgOptions::default()
    }
}

async fn admin(db: &TestDb, sql: String) {
    let mut conn = PgConnection::connect(&db.admin_url)
        .await
        .expect("admin connection");
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&mut conn)
        .await
        .expect("admin statement");
    let _ = conn.close().await;
}

async fn read_only(db: &TestDb, on: bool) {
    let setting = if on {
        "SET default_transaction_read_only = on"
    } else {
        "RESET default_transaction_read_only"
    };
    admin(db, format!("ALTER DATABASE \"{}\" {setting}", db.name)).await;
}

/// Adds one token `tag`:0 of 10 to wallet `w`.
async fn write(backend: &PgBackend, tag: &str) -> Result<u64, TokenStoreError> {
    backend
        .stores()
        .tokens
        .add_tokens(&[chf("w", tag, 0, 10)])
        .await
}

async fn read(backend: &PgBackend) -> Result<(), TokenStoreError> {
    backend
        .stores()
        .tokens
        .balance(&wallet("w"), &token_type("CHF"))
        .await
        .map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_host_url_takes_the_first_host_that_gives_writes() {
    let Some(db) = TestDb::create("hosts::first_host_that_gives_writes").await else {
        return;
    };
    // Nothing listens on port 1: refused at once, the walk goes on.
    let url = with_host_before(&db.url, "127.0.0.1:1");
    let backend = PgBackend::connect(&url, quick())
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    assert_eq!(backend.target(), TargetSessionAttrs::ReadWrite);
    assert_eq!(backend.current_host(), host_of(&db.url));
    write(&backend, "a").await.expect("a write");
    read(&backend).await.expect("a read");
    let durability = backend.durability().expect("the settings were read");
    assert_eq!(durability.hosts, 2);
    // No standby attached (a test server has none): another host promoted now
    // would lack every commit.
    assert_eq!(
        durability
            .risks()
            .contains(&CommitRisk::NoStandby { hosts: 2 }),
        durability.standbys == 0
    );
    let mut conn = db.connection().await;
    let (commit,): (String,) = sqlx::query_as("SHOW synchronous_commit")
        .fetch_one(&mut conn)
        .await
        .expect("synchronous_commit");
    assert_eq!(durability.synchronous_commit, commit);
    assert_eq!(
        durability.risks().contains(&CommitRisk::CommitNotFlushed),
        commit == "off"
    );
    backend.close().await;
}

#[tokio::test]
async fn no_host_names_every_host_tried_and_never_the_password() {
    let url = "postgres://app:hunter2@127.0.0.1:1,[::1]:1/holdfast?target_session_attrs=primary";
    let err = PgBackend::connect(url, quick())
        .await
        .expect_err("nothing listens on port 1");
    let ConnectError::NoHost { target, tried, .. } = &err else {
        panic!("expected NoHost, got {err:?}");
    };
    assert_eq!(*target, TargetSessionAttrs::Primary);
    let hosts: Vec<&str> = tried.iter().map(|t| t.host.as_str()).collect();
    assert_eq!(hosts, ["127.0.0.1:1", "[::1]:1"]);
    assert!(
        tried
            .iter()
            .all(|t| matches!(t.outcome, HostOutcome::Failed(_))),
        "{tried:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("postgres://app:***@127.0.0.1:1,[::1]:1/holdfast"),
        "{text}"
    );
    assert!(text.contains("primary"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");

    let bad = PgBackend::connect(
        "postgres://app:hunter2@h1,h2/db?target_session_attrs=standby",
        quick(),
    )
    .await
    .expect_err("a read-only session kind");
    assert!(matches!(bad, ConnectError::Hosts { .. }), "{bad:?}");
    assert!(
        bad.to_string()
            .contains("expected read-write, primary or any"),
        "{bad}"
    );
}

/// Ends the pool sessions of `db` (as a server restarting into another role does).
async fn end_sessions(db: &TestDb) {
    admin(
        db,
        format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{}' AND application_name LIKE 'holdfast%'",
            db.name
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_passed_over_by_read_write_and_taken_by_primary() {
    let Some(db) = TestDb::create("hosts::read_only_server").await else {
        return;
    };
    // Opened (and migrated) while the server takes writes.
    let primary = PgBackend::connect(
        &with_param(&db.url, "target_session_attrs=primary"),
        quick(),
    )
    .await
    .expect("connect");
    assert_eq!(primary.target(), TargetSessionAttrs::Primary);
    read_only(&db, true).await;
    end_sessions(&db).await;

    let err = PgBackend::connect(
        &with_param(&db.url, "target_session_attrs=read-write"),
        quick(),
    )
    .await
    .expect_err("a read-only server gives no read-write session");
    let ConnectError::NoHost { tried, .. } = &err else {
        panic!("expected NoHost, got {err:?}");
    };
    // Worth waiting for (a standby may be promoted): waited out the connect
    // timeout, then named what the host is.
    assert!(
        matches!(tried[..], [ref t] if matches!(t.outcome, HostOutcome::Role(r) if r.read_only && !r.in_recovery)),
        "{tried:?}"
    );
    assert!(err.to_string().contains("read-only"), "{err}");

    // `primary` and `any` take the server, whose refusal of the migrations'
    // writes ends the open.
    for target in ["primary", "any"] {
        let url = with_param(&db.url, &format!("target_session_attrs={target}"));
        match PgBackend::connect(&url, quick()).await {
            Err(ConnectError::Migration { detail, .. }) => {
                assert!(detail.contains("read-only"), "{target}: {detail}");
            }
            other => panic!("{target} on a read-only server: {other:?}"),
        }
    }

    // An open `primary` pool goes on with the server: reads work, and its writes
    // reach it and are refused as unavailable.
    let _ = read(&primary).await;
    read(&primary).await.expect("reads work");
    match write(&primary, "b").await {
        Err(TokenStoreError::Fault(StoreFault::Unavailable(message))) => {
            assert!(message.contains("read-only"), "{message}");
        }
        other => panic!("a write on a read-only server: {other:?}"),
    }
    primary.close().await;
    read_only(&db, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_never_writes_to_a_server_turned_read_only_and_serves_again_after() {
    let Some(db) = TestDb::create("hosts::pool_follows_read_write").await else {
        return;
    };
    let url = with_host_before(&db.url, "127.0.0.1:1");
    let backend = PgBackend::connect(&url, quick()).await.expect("connect");
    write(&backend, "a").await.expect("a write");

    // The server turns read-only for new sessions, and ends the pool's sessions
    // (as a demotion restarts the server).
    read_only(&db, true).await;
    end_sessions(&db).await;
    // The first write meets its connection ended; the next fails as unavailable
    // without reaching the server (which would refuse it with an error the
    // backend counts): no connection to it is handed out.
    let ended = write(&backend, "b").await;
    assert!(
        matches!(
            ended,
            Err(TokenStoreError::Fault(StoreFault::Unavailable(_)))
        ),
        "{ended:?}"
    );
    let server_errors = backend.server_errors();
    let began = Instant::now();
    match write(&backend, "c").await {
        Err(TokenStoreError::Fault(StoreFault::Unavailable(e))) => {
            println!(
                "the write failed as unavailable after {:?}: {e}",
                began.elapsed()
            );
        }
        other => panic!("a write while no host gives a read-write session: {other:?}"),
    }
    assert_eq!(
        backend.server_errors(),
        server_errors,
        "a write reached the read-only server"
    );
    let mut conn = db.connection().await;
    let (tokens,): (i64,) = sqlx::query_as("SELECT count(*) FROM tokens")
        .fetch_one(&mut conn)
        .await
        .expect("count");
    assert_eq!(tokens, 1, "nothing was written");

    read_only(&db, false).await;
    let began = Instant::now();
    loop {
        match write(&backend, "d").await {
            Ok(_) => break,
            Err(e) => assert!(
                began.elapsed() < Duration::from_secs(15),
                "the pool did not serve again within 15 s of the server taking writes: {e}"
            ),
        }
    }
    println!(
        "served again {:?} after the server took writes",
        began.elapsed()
    );
    read(&backend).await.expect("a read");
    backend.close().await;
}
