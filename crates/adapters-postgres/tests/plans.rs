//! A plan PostgreSQL keeps for one of holdfast's statements, made while the
//! tables were empty, still finds its rows by index once the tables have grown.
//!
//! PostgreSQL keeps a generic plan per connection and statement until the
//! tables it reads are analyzed again. Made on empty tables, the single-token
//! claim's plan read `tx_statuses` whole, and went on doing so at every claim as
//! the statuses grew: 824 buffers a claim instead of 25 after 10,000 payments of
//! the simulator's `hot-wallets`. Holdfast's sessions turn sequential scans off
//! (`session_settings`), so such a plan probes the indexes at any size; and JIT,
//! so that a statement left with a sequential scan as its only path is not
//! compiled for the cost a turned-off path carries.

use crate::support;

use holdfast_adapters_postgres::{CLAIM_INSERT, LockStrategy, PgOptions, session_settings};
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, ConnectOptions, PgConnection};
use support::TestDb;

/// A connection of `db` with `settings`, whose statements always get the
/// generic plan (as a connection does on its own once the generic plan looks no
/// dearer than the custom ones).
async fn generic_plans(db: &TestDb, settings: Vec<(&'static str, String)>) -> PgConnection {
    let options: PgConnectOptions = db.url.parse().expect("the URL");
    options
        .options(settings)
        .options([("plan_cache_mode", "force_generic_plan")])
        .connect()
        .await
        .expect("a connection")
}

/// Prepares the single-token claim on `conn` and runs it once, which makes and
/// keeps its plan with the tables as they are.
async fn prepare_claim(conn: &mut PgConnection) {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "PREPARE claim(text, bigint, text, bigint, text) AS {CLAIM_INSERT}"
    )))
    .execute(&mut *conn)
    .await
    .expect("PREPARE");
    run(conn, "EXECUTE claim('none', 0, 'c', 0, '')").await;
}

/// The plan `conn` now uses for the prepared claim.
async fn claim_plan(conn: &mut PgConnection) -> String {
    let lines: Vec<String> = sqlx::query_scalar("EXPLAIN EXECUTE claim('none', 0, 'c', 0, '')")
        .fetch_all(&mut *conn)
        .await
        .expect("EXPLAIN");
    lines.join("\n")
}

/// The plan, run, of a join whose only path is a sequential scan (`relpages`
/// has no index).
async fn explain_scan(conn: &mut PgConnection) -> String {
    let lines: Vec<String> = sqlx::query_scalar(
        "EXPLAIN ANALYZE SELECT count(*) FROM generate_series(1, 10) AS g
         JOIN pg_class c ON c.relpages >= g",
    )
    .fetch_all(&mut *conn)
    .await
    .expect("EXPLAIN");
    lines.join("\n")
}

async fn run(conn: &mut PgConnection, sql: &'static str) {
    sqlx::raw_sql(sql)
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

#[tokio::test]
async fn a_claim_planned_on_empty_tables_still_probes_the_indexes_once_they_grow() {
    let Some(db) = TestDb::create("claim_plan_on_empty_tables").await else {
        return;
    };
    // The schema, on an empty database analyzed as a fresh one is.
    db.backend(LockStrategy::Insert, 1).await.close().await;
    let mut admin = db.connection().await;
    run(&mut admin, "ANALYZE").await;

    let mut plain = generic_plans(&db, Vec::new()).await;
    let mut holdfast = generic_plans(&db, session_settings(&PgOptions::default())).await;
    prepare_claim(&mut plain).await;
    prepare_claim(&mut holdfast).await;

    // The statuses of 20,000 settled transactions, not analyzed yet.
    run(
        &mut admin,
        "INSERT INTO tx_statuses (tx_id, status, recorded_at)
         SELECT 'settled-' || g, 'confirmed', now() FROM generate_series(1, 20000) AS g",
    )
    .await;

    let plain_plan = claim_plan(&mut plain).await;
    assert!(
        plain_plan.contains("Seq Scan on tx_statuses"),
        "without holdfast's settings the kept plan reads the statuses whole:\n{plain_plan}"
    );
    let holdfast_plan = claim_plan(&mut holdfast).await;
    assert!(
        !holdfast_plan.contains("Seq Scan"),
        "with holdfast's settings the kept plan probes the indexes:\n{holdfast_plan}"
    );
    assert!(
        holdfast_plan.contains("tx_statuses_pkey"),
        "{holdfast_plan}"
    );
}

/// A statement with no usable index still scans under holdfast's settings, and
/// the cost a turned-off path carries does not make PostgreSQL compile it (JIT:
/// 0.1 s a call, measured on the naive selector's wallet listing).
#[tokio::test]
async fn a_scan_left_as_the_only_path_is_not_compiled() {
    let Some(db) = TestDb::create("scan_not_compiled").await else {
        return;
    };
    let mut plain = db.connection().await;
    let jit: bool = sqlx::query_scalar("SELECT pg_jit_available()")
        .fetch_one(&mut plain)
        .await
        .expect("pg_jit_available");
    let options: PgConnectOptions = db.url.parse().expect("the URL");
    let mut seqscan_off = options
        .clone()
        .options([("enable_seqscan", "off")])
        .connect()
        .await
        .expect("a connection");
    if jit {
        let plan = explain_scan(&mut seqscan_off).await;
        assert!(
            plan.contains("JIT:"),
            "sequential scans off alone compile:\n{plan}"
        );
    }
    let mut holdfast = options
        .options(session_settings(&PgOptions::default()))
        .connect()
        .await
        .expect("a connection");
    let plan = explain_scan(&mut holdfast).await;
    assert!(plan.contains("Seq Scan"), "{plan}");
    assert!(!plan.contains("JIT:"), "{plan}");
}
