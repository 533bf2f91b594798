//! Test databases for the PostgreSQL tests: each test gets a fresh database
//! created from `DATABASE_URL` and dropped afterwards (also when the test panics).
//!
//! Without `DATABASE_URL` a test skips loudly if the test command said so
//! (`HOLDFAST_PG_SKIP=1`, set by `cargo xtask test` when no PostgreSQL binaries
//! exist) and fails otherwise, so a missing server is never silently untested;
//! under `CI=true` it always fails. Every test appends `ran <name>` or
//! `skipped <name>` to the file named by `HOLDFAST_PG_TALLY`, which the xtask
//! counts.

#![allow(dead_code)] // each test binary uses a different part of this module

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use holdfast_adapters_postgres::{LockStrategy, PgBackend, PgOptions};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

/// Appends one line to the tally file, if the test command asked for one.
fn tally(line: &str) {
    let Some(path) = std::env::var_os("HOLDFAST_PG_TALLY") else {
        return;
    };
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        // One write per line: with O_APPEND a single small write is atomic, while
        // `writeln!` may issue the text and the newline separately and interleave
        // with another test process's line.
        let _ = file.write_all(format!("{line}\n").as_bytes());
    }
}

/// The server URL, or `None` after printing a loud SKIPPED line when the test
/// command decided there is no server.
pub fn server_url(test: &str) -> Option<String> {
    if let Some(url) = std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
    {
        return Some(url);
    }
    let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    let skip = std::env::var("HOLDFAST_PG_SKIP").is_ok_and(|v| v == "1");
    if ci {
        panic!("{test}: CI=true but DATABASE_URL is unset; PostgreSQL tests must run in CI");
    }
    if !skip {
        panic!(
            "{test}: DATABASE_URL is unset; run `cargo xtask test` (it starts a throwaway \
             PostgreSQL) or set DATABASE_URL"
        );
    }
    eprintln!("!!!!!!!! SKIPPED: no PostgreSQL: {test} did not run !!!!!!!!");
    tally(&format!("skipped {test}"));
    None
}

/// `url` with its database name replaced by `database`.
pub fn with_database(url: &str, database: &str) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[scheme_end..];
    let path_start = rest.find(['/', '?']).map_or(url.len(), |i| scheme_end + i);
    let query_start = url[path_start..]
        .find('?')
        .map_or(url.len(), |i| path_start + i);
    format!("{}/{}{}", &url[..path_start], database, &url[query_start..])
}

fn unique_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "test_{}_{}_{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh, empty database on the test server, dropped on drop.
#[derive(Debug)]
pub struct TestDb {
    /// The URL of the fresh database.
    pub url: String,
    /// The URL of the server's maintenance database (for creating and dropping).
    pub admin_url: String,
    /// The database name.
    pub name: String,
    /// Login roles made for this database ([`TestDb::login_role`]), dropped
    /// after it (a role outlives its databases).
    roles: std::sync::Mutex<Vec<String>>,
}

impl TestDb {
    /// Creates a fresh database for `test`; `None` when the test must skip.
    pub async fn create(test: &str) -> Option<TestDb> {
        let admin_url = server_url(test)?;
        Some(Self::create_on(&admin_url, test).await)
    }

    /// Creates a fresh database on the server at `admin_url`.
    pub async fn create_on(admin_url: &str, test: &str) -> TestDb {
        let name = unique_name();
        let mut admin = PgConnection::connect(admin_url)
            .await
            .unwrap_or_else(|e| panic!("{test}: cannot connect to DATABASE_URL: {e}"));
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("{test}: CREATE DATABASE {name}: {e}"));
        let _ = admin.close().await;
        tally(&format!("ran {test}"));
        TestDb {
            url: with_database(admin_url, &name),
            admin_url: admin_url.to_owned(),
            name,
            roles: std::sync::Mutex::default(),
        }
    }

    /// A login role `<database>_<suffix>` with `password`, dropped with the
    /// database, even when the test fails; its name.
    pub async fn login_role(&self, suffix: &str, password: &str) -> String {
        let role = format!("{}_{suffix}", self.name);
        let mut conn = self.connection().await;
        exec(
            &mut conn,
            format!("CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}'"),
        )
        .await;
        let _ = conn.close().await;
        self.roles
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(role.clone());
        role
    }

    /// A backend on this database.
    pub async fn backend(&self, strategy: LockStrategy, max_connections: u32) -> PgBackend {
        PgBackend::connect(
            &self.url,
            PgOptions {
                strategy,
                max_connections,
                // Generous: these backends show what the line's advisory lock
                // guarantees (no race lost to another read-and-claim) on a loaded
                // test machine; tests/sessions.rs shows its bound.
                line_wait: std::time::Duration::from_secs(5),
                ..PgOptions::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", self.name))
    }

    /// A plain connection on this database, outside any backend (to observe or
    /// to interfere).
    pub async fn connection(&self) -> PgConnection {
        PgConnection::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.name))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Drop may run inside a runtime (or while panicking): use a thread with its own.
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        let roles = std::mem::take(
            &mut *self
                .roles
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async move {
                let mut admin = PgConnection::connect(&admin_url)
                    .await
                    .map_err(|e| e.to_string())?;
                sqlx::query(AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                )))
                .execute(&mut admin)
                .await
                .map_err(|e| e.to_string())?;
                for role in roles {
                    sqlx::query(AssertSqlSafe(format!("DROP ROLE IF EXISTS \"{role}\"")))
                        .execute(&mut admin)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                let _ = admin.close().await;
                Ok::<(), String>(())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("warning: could not drop test database {}: {e}", self.name),
            Err(_) => eprintln!("warning: dropping test database {} panicked", self.name),
        }
    }
}

/// Runs one statement on a plain connection; a failure fails the test, naming it.
pub async fn exec(conn: &mut PgConnection, sql: impl Into<String>) {
    let sql = sql.into();
    sqlx::query(AssertSqlSafe(sql.as_str()))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}
