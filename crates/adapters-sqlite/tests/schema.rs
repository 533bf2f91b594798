//! Pins the schema users get: every table and index as SQLite stores its DDL, and
//! the recorded migrations. A change here is a migration and must be reviewed.

use crate::common;

use rusqlite::Connection;

use common::TempDb;

#[tokio::test]
async fn schema_after_migrations() {
    let file = TempDb::new();
    drop(file.open().await);
    let conn = Connection::open(file.path()).expect("raw connection");
    let mut out = String::new();
    let mut stmt = conn
        .prepare(
            "SELECT type, name, sql FROM sqlite_master
             WHERE name NOT LIKE 'sqlite_%' ORDER BY type DESC, name",
        )
        .expect("prepare");
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
            ))
        })
        .expect("query");
    for row in rows {
        let (kind, name, sql) = row.expect("row");
        out.push_str(&format!(
            "-- {kind} {name}\n{};\n\n",
            sql.unwrap_or_default()
        ));
    }
    let mut stmt = conn
        .prepare("SELECT version, name FROM holdfast_schema ORDER BY version")
        .expect("prepare");
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
        .expect("query");
    for row in rows {
        let (version, name) = row.expect("row");
        out.push_str(&format!("-- applied migration {version}: {name}\n"));
    }
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("journal_mode");
    out.push_str(&format!("-- journal_mode: {mode}\n"));
    insta::assert_snapshot!(out);
}

/// A database file at schema `version` (its migrations applied and recorded as an
/// older holdfast would), holding the rows `rows` inserts.
fn at_version(version: usize, rows: &str) -> TempDb {
    use holdfast_adapters_sqlite::MIGRATIONS;

    let file = TempDb::new();
    let conn = Connection::open(file.path()).expect("raw connection");
    conn.execute_batch(
        "CREATE TABLE holdfast_schema (version INTEGER NOT NULL PRIMARY KEY,
             name TEXT NOT NULL, applied_at TEXT NOT NULL);",
    )
    .expect("version table");
    for m in &MIGRATIONS[..version] {
        conn.execute_batch(m.sql).expect("an older migration");
        conn.execute(
            "INSERT INTO holdfast_schema VALUES (?1, ?2, '2026-01-01T00:00:00.000Z')",
            rusqlite::params![m.version, m.name],
        )
        .expect("record it");
    }
    conn.execute_batch(rows).expect("the older database's rows");
    file
}

/// A database written by schema version 1 with a transaction holding a lock: after
/// the upgrade to version 2 the lock counts as selected, so its Confirmed spends
/// the token (the upgrade loses no spend).
#[tokio::test]
async fn upgrading_from_version_1_keeps_held_locks_spendable_by_their_transaction() {
    use holdfast_domain::{Timestamp, TokenId, TxId};

    let file = at_version(
        1,
        "INSERT INTO tokens VALUES ('fund', 0, 'w', 'CHF', '0000000000000000000000000000000a', 1, NULL, NULL);
         INSERT INTO locks VALUES ('fund', 0, 'pay-1', '2026-01-01T00:00:00.000Z');",
    );
    let backend = file.open().await;
    let stores = backend.stores();
    let fund = TokenId::new(TxId::new("fund").expect("tx"), 0);
    assert_eq!(
        stores
            .locks
            .spend_consumer(
                &TxId::new("pay-1").expect("tx"),
                Timestamp::from_millis(1),
                true
            )
            .await,
        Ok(vec![fund])
    );
}

/// A database at schema version 2 with a request building in a slot: after the
/// upgrade to version 3 the owner keeps its slot with a lease starting at the
/// upgrade (no running build expires because of it), the request has no fail
/// reason, and the queue has no stored limit until its next head is stamped.
#[tokio::test]
async fn upgrading_from_version_2_starts_owner_leases_at_the_upgrade() {
    use holdfast_domain::{QueueName, RequestId, Timestamp};

    let file = at_version(
        2,
        "INSERT INTO queues VALUES ('main', 'request/main/1', NULL, NULL, 3);
         INSERT INTO requests VALUES ('main', 1, 'git:a', 'processing', 'full', NULL, 2);
         INSERT INTO queue_owners VALUES ('main', 'request/main/1');",
    );
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis();
    let backend = file.open().await;
    let stores = backend.stores();
    let name = QueueName::new("main").expect("queue");
    let queue = stores
        .queues
        .load_queue(&name)
        .await
        .expect("load")
        .expect("queue");
    let id = RequestId::new(name, 1);
    let slot = queue.owners[&id];
    let since = Timestamp::from_millis(u64::try_from(before).expect("millis") - 1_000);
    assert!(slot.claimed_at >= since, "{slot:?}");
    assert_eq!(slot.claimed_at, slot.heartbeat_at);
    assert_eq!(queue.max_concurrent, None);
    let request = stores
        .queues
        .load_request(&id)
        .await
        .expect("load")
        .expect("request");
    assert_eq!(request.reason, None);
}
