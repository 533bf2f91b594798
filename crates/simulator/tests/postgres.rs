//! The simulator on PostgreSQL, each test on a fresh database created from
//! `DATABASE_URL` (the PostgreSQL adapter's test helper: skips loudly when the test
//! command says there is no server, fails otherwise and always under CI).

use crate::pg_support::TestDb;
use crate::simulate::{ORACLE_WALLET, options_on};

/// The simulator's raw select cycle through sqlx, on fresh databases of the test
/// server: cycles complete, no lock is left, holdfast's fraction is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raw_limit_runs_the_select_cycle_on_postgres() {
    let Some(db) = TestDb::create("simulator::raw_limit").await else {
        return;
    };
    for (mode, least) in [("settle", 6.0), ("unlock", 4.0)] {
        let load = holdfast_simulator::Workload::from_toml_str(&format!(
            "replicas = 2\nconcurrency = 6\nlegs = 50\n\
             [[tokens]]\nwallet = 'alice'\ntype = 'CHF'\namount = '1..9'\ncount = 5\n\
             [[requests]]\nwallet = 'alice'\ntype = 'CHF'\namount = '1'\ncount = 30\nmode = '{mode}'"
        ))
        .expect("workload");
        let options = holdfast_simulator::SimOptions {
            only: Some(vec![holdfast_simulator::Strategy::Holdfast]),
            raw_limit: Some(std::time::Duration::from_millis(200)),
            ..options_on(load, db.url.clone())
        };
        let report = holdfast_simulator::simulate(options)
            .await
            .expect("simulation runs");
        assert_eq!(report.backend, "postgres");
        let limit = report.raw_limit.expect("raw limit measured");
        assert!(limit.cycles > 0, "{mode}: {limit:?}");
        assert_eq!(limit.locks_left, 0, "{mode}: {limit:?}");
        assert!(limit.statements_per_cycle >= least, "{mode}: {limit:?}");
        assert!(
            limit.fraction_of_raw_limit.is_some_and(|f| f > 0.0),
            "{mode}: {limit:?}"
        );
    }
}

/// The payment replay on fresh PostgreSQL databases: every policy conserves
/// value and makes the same payments as on SQLite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payment_replay_runs_every_policy_on_postgres() {
    let Some(db) = TestDb::create("simulator::replay").await else {
        return;
    };
    let payments =
        holdfast_simulator::replay::parse_payments(crate::replay::HISTORY, None).expect("parses");
    let report = holdfast_simulator::replay::replay(holdfast_simulator::ReplayOptions {
        payments,
        source: "handmade".to_owned(),
        db: Some(db.url.clone()),
        seed: 7,
        policies: holdfast_simulator::ReplayPolicy::ALL.to_vec(),
        config: holdfast::Config::default(),
        progress: false,
    })
    .await
    .expect("replay runs");
    assert_eq!(report.backend, "postgres");
    assert_eq!(
        report.policies.len(),
        holdfast_simulator::ReplayPolicy::ALL.len()
    );
    for p in &report.policies {
        assert_eq!(
            (p.payments, p.insufficient, p.unspent_sats, p.final_pool),
            (4, 1, 4, 1),
            "{p:?}"
        );
    }
}

/// A fresh database's statistics: the seeded `tokens` table is analyzed, the
/// tables a run fills are not. Analyzed empty, they taught the planner they were,
/// and connections kept plans that read them whole as they grew
/// (`docs/measurements.md`, "PostgreSQL: plans made on empty tables").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_database_has_statistics_of_its_tokens_only() {
    let Some(db) = TestDb::create("simulator::fresh_statistics").await else {
        return;
    };
    let provisioner =
        holdfast_simulator::provision::Provisioner::for_url(Some(&db.url)).expect("provisioner");
    let fresh = provisioner
        .create("statistics")
        .await
        .expect("fresh database");
    let backend = holdfast::backend::Backend::open(&fresh.url, &Default::default())
        .await
        .expect("migrated");
    backend.close().await;
    provisioner.analyze(&fresh).await.expect("analyzed");

    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&fresh.url)
        .await
        .expect("a connection");
    // reltuples is -1 until a table is first analyzed (or vacuumed).
    let analyzed: Vec<(String, bool)> = sqlx::query_as(
        "SELECT relname::text, reltuples >= 0 FROM pg_class
         WHERE relname IN ('tokens', 'tx_statuses', 'selections', 'token_locks')
         ORDER BY relname",
    )
    .fetch_all(&mut conn)
    .await
    .expect("pg_class");
    let _ = sqlx::Connection::close(conn).await;
    provisioner.remove(&fresh).await.expect("removed");
    assert_eq!(
        analyzed,
        [
            ("selections".to_owned(), false),
            ("token_locks".to_owned(), false),
            ("tokens".to_owned(), true),
            ("tx_statuses".to_owned(), false),
        ]
    );
}

/// The oracle on a fresh PostgreSQL database: it learns of the change and of the
/// released tokens, and never loses a claim (the SQLite test's workload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oracle_claims_what_is_free_on_postgres() {
    let Some(db) = TestDb::create("simulator::oracle").await else {
        return;
    };
    let workload = holdfast_simulator::Workload::from_toml_str(ORACLE_WALLET).expect("workload");
    let options = holdfast_simulator::SimOptions {
        only: Some(vec![holdfast_simulator::Strategy::Oracle]),
        ..options_on(workload, db.url.clone())
    };
    let report = holdfast_simulator::simulate(options)
        .await
        .expect("simulation runs");
    let Some(holdfast_simulator::StrategyEntry::Tokens(oracle)) = report.strategies.first() else {
        panic!("no oracle figures: {report:?}");
    };
    assert_eq!(oracle.strategy, "oracle");
    assert_eq!(oracle.succeeded, 50, "{oracle:?}");
    assert_eq!(oracle.errors, 0, "{oracle:?}");
    assert_eq!(oracle.conflicts_per_select, 0.0, "{oracle:?}");
    assert_eq!(oracle.lock_attempts_per_select, oracle.inputs_per_select);
    assert_eq!(oracle.round_trips_per_select, 1.0);
    assert_eq!(oracle.locks_left, 0);
    assert_eq!(oracle.invariant_violations, 0);
}
