//! The command's happy path on PostgreSQL: every token, lock and queue command,
//! and the demo, each test on a fresh database created from `DATABASE_URL` (the
//! PostgreSQL adapter's test helper: skips loudly when the test command says there
//! is no server, fails otherwise and always under CI).

use crate::pg_support;

use crate::cli_support;

use cli_support::{Holdfast, nothing_lost_after_the_sweep, queue_happy_path, token_happy_path};
use pg_support::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_commands_on_postgres() {
    let Some(db) = TestDb::create("cli_postgres::token_commands").await else {
        return;
    };
    let h = Holdfast::at(&db.url);
    tokio::task::spawn_blocking(move || {
        let steps = token_happy_path(&h, "postgres");
        assert_eq!(steps.len(), 11);
        // The same shapes as on SQLite: the field names of every output match.
        let keys = |v: &serde_json::Value| -> Vec<String> {
            v.as_object()
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default()
        };
        let migrate = &steps[0].1;
        // `warnings` only when the server's settings let acknowledged commits be
        // lost (a test server with synchronous_commit off says so).
        let mut shared = keys(migrate);
        shared.retain(|k| k != "warnings");
        assert_eq!(shared, ["backend", "schema_version", "url"]);
        for warning in migrate["warnings"].as_array().into_iter().flatten() {
            assert!(
                warning.as_str().is_some_and(|w| w.contains("lose")),
                "{warning}"
            );
        }
        assert!(
            migrate["url"]
                .as_str()
                .is_some_and(|u| u.starts_with("postgres"))
        );
    })
    .await
    .expect("the happy path panicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_spend_survives_the_lease_sweep_on_postgres() {
    let Some(db) = TestDb::create("cli_postgres::nothing_lost").await else {
        return;
    };
    let h = Holdfast::at(&db.url);
    tokio::task::spawn_blocking(move || nothing_lost_after_the_sweep(&h))
        .await
        .expect("the sequence panicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_commands_on_postgres() {
    let Some(db) = TestDb::create("cli_postgres::queue_commands").await else {
        return;
    };
    let h = Holdfast::at(&db.url);
    tokio::task::spawn_blocking(move || {
        queue_happy_path(&h);
    })
    .await
    .expect("the happy path panicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_on_postgres() {
    let Some(db) = TestDb::create("cli_postgres::demo").await else {
        return;
    };
    let h = Holdfast::at(&db.url);
    tokio::task::spawn_blocking(move || {
        let summary = h.json(&["demo"]);
        cli_support::check_demo(&summary, "postgres");
        // A second tour on the same database is refused: it is not fresh any more.
        let err = h.fails(&["demo"], 2);
        assert!(err.contains("not fresh"), "{err}");
    })
    .await
    .expect("the demo panicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_slot_operations_on_postgres() {
    let Some(db) = TestDb::create("cli_postgres::queue_slot_operations").await else {
        return;
    };
    let h = Holdfast::at(&db.url);
    tokio::task::spawn_blocking(move || {
        cli_support::queue_slot_operations(&h);
        cli_support::queue_lease_expiry(&h);
        cli_support::queue_work(&h);
    })
    .await
    .expect("the slot operations panicked");
}
