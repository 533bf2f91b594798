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

/// A database at schema version 4 with two owners: after the upgrade to version 5
/// they keep their times and read as generation 0, published at the migration
/// (their builds, started by the older holdfast, stay live while their
/// heartbeats come; none is published again at once) and not expiring, without
/// a warning.
#[tokio::test]
async fn upgrading_from_version_4_reads_owners_as_published_at_the_upgrade() {
    use holdfast_domain::{Generation, QueueName, RequestId, Slot, Timestamp};

    let file = at_version(
        4,
        "INSERT INTO queues VALUES ('main', 'request/main/2', NULL, NULL, 5, 2);
         INSERT INTO queue_owners VALUES
             ('main', 'request/main/1', '2026-11-30T08:00:00.000Z', '2026-11-30T08:05:00.000Z'),
             ('main', 'request/main/2', '2026-11-30T08:01:00.000Z', '2026-11-30T08:01:00.000Z');",
    );
    let warnings = common::Warnings::default();
    let _logs = tracing::subscriber::set_default(warnings.clone());
    let backend = file.open().await;
    let conn = Connection::open(file.path()).expect("raw connection");
    let upgraded: String = conn
        .query_row(
            "SELECT applied_at FROM holdfast_schema WHERE version = 5",
            [],
            |r| r.get(0),
        )
        .expect("the upgrade time");
    let upgraded = holdfast_adapters_sqlite::timetext::parse(&upgraded).expect("a stored time");
    let now = Timestamp(
        u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_millis(),
        )
        .expect("millis"),
    );
    let name = QueueName::new("main").expect("queue");
    let queue = backend
        .stores()
        .queues
        .load_queue(&name)
        .await
        .expect("load")
        .expect("queue");
    let migrated = queue.owners[&RequestId::new(name.clone(), 1)]
        .published_at
        .expect("published at the migration");
    assert!(
        upgraded <= migrated && migrated <= now,
        "{upgraded} <= {migrated} <= {now}"
    );
    let t0 = 1_796_025_600_000;
    let published = |heartbeat_at: Timestamp, slot: Slot| Slot {
        heartbeat_at,
        published_at: Some(migrated),
        ..slot
    };
    assert_eq!(
        queue.owners.into_iter().collect::<Vec<_>>(),
        vec![
            (
                RequestId::new(name.clone(), 1),
                published(Timestamp(t0 + 300_000), Slot::claimed(Timestamp(t0)))
            ),
            (
                RequestId::new(name, 2),
                published(
                    Timestamp(t0 + 60_000),
                    Slot::claimed(Timestamp(t0 + 60_000))
                )
            ),
        ]
    );
    assert_eq!(Slot::claimed(Timestamp(t0)).generation, Generation::NONE);
    assert!(!Slot::claimed(Timestamp(t0)).expiring);
    assert_eq!(warnings.lines(), Vec::<String>::new());
}

/// The owner rows an older holdfast writes after the upgrade never make a queue
/// command fail. A schema v2 writer leaves both owner times empty; other rows hold
/// times that are not times (text, an integer, a blob) or a publication time that
/// is not one; every older writer leaves the build columns at their defaults
/// (generation 0, publication `''`, not expiring). The load reads every
/// unrecorded or unreadable time, the publication included, as the upgrade time
/// (the newest migration's `applied_at`), warning about each; a NULL publication,
/// which only this code writes, reads as none without a warning; and the next
/// compare-and-set stores what was read.
#[tokio::test]
async fn owner_rows_of_an_older_writer_read_as_the_upgrade_time_and_are_repaired() {
    use holdfast_domain::{Generation, QueueName, RequestId, Slot, Timestamp};
    use holdfast_ports::CasOutcome;

    let file = TempDb::new();
    let backend = file.open().await;
    let stores = backend.stores();
    let conn = Connection::open(file.path()).expect("raw connection");
    conn.execute_batch(
        "INSERT INTO queues (name, latest_request, version, max_concurrent)
             VALUES ('old', 'request/old/6', 3, 6);
         -- A schema v2 writer: no times.
         INSERT INTO queue_owners (queue, request) VALUES ('old', 'request/old/1');
         -- A schema v4 writer: times, no build data.
         INSERT INTO queue_owners (queue, request, claimed_at, heartbeat_at)
             VALUES ('old', 'request/old/2', '2026-11-30T08:00:00.000Z', '2026-11-30T08:00:01.000Z');
         -- Times that are not times.
         INSERT INTO queue_owners (queue, request, claimed_at, heartbeat_at)
             VALUES ('old', 'request/old/3', 'yesterday', 42);
         INSERT INTO queue_owners (queue, request, claimed_at, heartbeat_at, generation, published_at)
             VALUES ('old', 'request/old/4', '2026-11-30T08:00:00.000Z', x'00', 3, 'soon');
         -- Rows of this version, read as they are: published, and a publication
         -- withdrawn (NULL).
         INSERT INTO queue_owners VALUES ('old', 'request/old/5', '2026-11-30T08:00:00.000Z',
             '2026-11-30T08:00:02.000Z', 2, '2026-11-30T08:00:01.500Z', 1);
         INSERT INTO queue_owners VALUES ('old', 'request/old/6', '2026-11-30T08:00:00.000Z',
             '2026-11-30T08:00:03.000Z', 4, NULL, 0);",
    )
    .expect("an older writer's rows");
    let upgraded_text: String = conn
        .query_row(
            "SELECT applied_at FROM holdfast_schema WHERE version = 5",
            [],
            |r| r.get(0),
        )
        .expect("the upgrade time");
    let upgraded =
        holdfast_adapters_sqlite::timetext::parse(&upgraded_text).expect("a stored time");

    let warnings = common::Warnings::default();
    let _logs = tracing::subscriber::set_default(warnings.clone());
    let name = QueueName::new("old").expect("queue");
    let queue = stores
        .queues
        .load_queue(&name)
        .await
        .expect("an older writer's rows load")
        .expect("queue");
    let t0 = Timestamp(1_796_025_600_000);
    let at = |ms: u64| Timestamp(t0.0 + ms);
    let id = |n: u64| RequestId::new(name.clone(), n);
    let published = |slot: Slot| Slot {
        published_at: Some(upgraded),
        ..slot
    };
    let want = [
        (1, published(Slot::claimed(upgraded))),
        (
            2,
            published(Slot {
                heartbeat_at: at(1_000),
                ..Slot::claimed(t0)
            }),
        ),
        (3, published(Slot::claimed(upgraded))),
        (
            4,
            published(Slot {
                heartbeat_at: upgraded,
                generation: Generation(3),
                ..Slot::claimed(t0)
            }),
        ),
        (
            5,
            Slot {
                heartbeat_at: at(2_000),
                generation: Generation(2),
                published_at: Some(at(1_500)),
                expiring: true,
                ..Slot::claimed(t0)
            },
        ),
        (
            6,
            Slot {
                heartbeat_at: at(3_000),
                generation: Generation(4),
                ..Slot::claimed(t0)
            },
        ),
    ]
    .map(|(n, slot)| (id(n), slot));
    assert_eq!(queue.owners.clone().into_iter().collect::<Vec<_>>(), want);
    for (owner, column, stored) in [
        (1, "claimed_at", "\"\""),
        (1, "heartbeat_at", "\"\""),
        (1, "published_at", "\"\""),
        (2, "published_at", "\"\""),
        (3, "claimed_at", "\"yesterday\""),
        (3, "heartbeat_at", "\"42\""),
        (3, "published_at", "\"\""),
        (4, "heartbeat_at", "a blob of 1 bytes"),
        (4, "published_at", "\"soon\""),
    ] {
        let owner = format!("owner=request/old/{owner}");
        let column = format!("column={column}");
        let stored = format!("stored={stored}");
        assert_eq!(
            warnings
                .matching(&["queue=old", &owner, &column, &stored])
                .len(),
            1,
            "one warning for {owner} {column} {stored}: {:#?}",
            warnings.lines()
        );
    }
    assert_eq!(warnings.lines().len(), 9, "{:#?}", warnings.lines());

    // The next write stores the times read, and the next load warns no more.
    assert_eq!(
        stores.queues.cas_queue(queue.version, &queue).await,
        Ok(CasOutcome::Applied)
    );
    let mut stmt = conn
        .prepare(
            "SELECT request, claimed_at, heartbeat_at, generation, published_at, expiring
             FROM queue_owners WHERE queue = 'old' ORDER BY request",
        )
        .expect("prepare");
    let rows: Vec<(String, String, String, i64, Option<String>, i64)> = stmt
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("the repaired rows");
    let (t0_text, up) = ("2026-11-30T08:00:00.000Z".to_owned(), upgraded_text.clone());
    let text = |s: &str| s.to_owned();
    assert_eq!(
        rows,
        vec![
            (
                text("request/old/1"),
                up.clone(),
                up.clone(),
                0,
                Some(up.clone()),
                0
            ),
            (
                text("request/old/2"),
                t0_text.clone(),
                text("2026-11-30T08:00:01.000Z"),
                0,
                Some(up.clone()),
                0
            ),
            (
                text("request/old/3"),
                up.clone(),
                up.clone(),
                0,
                Some(up.clone()),
                0
            ),
            (
                text("request/old/4"),
                t0_text.clone(),
                up.clone(),
                3,
                Some(up),
                0
            ),
            (
                text("request/old/5"),
                t0_text.clone(),
                text("2026-11-30T08:00:02.000Z"),
                2,
                Some(text("2026-11-30T08:00:01.500Z")),
                1
            ),
            (
                text("request/old/6"),
                t0_text,
                text("2026-11-30T08:00:03.000Z"),
                4,
                None,
                0
            ),
        ]
    );
    let again = stores
        .queues
        .load_queue(&name)
        .await
        .expect("load")
        .expect("queue");
    assert_eq!(again.owners, queue.owners);
    assert_eq!(warnings.lines().len(), 9, "{:#?}", warnings.lines());
}
