//! Slot owners in the queue row across upgrades: what rows of an older holdfast
//! read as (see the module docs of the adapter's queue store), written here
//! directly with SQL, the warnings their loads log, and the compare-and-set that
//! repairs them.

use crate::support;

use holdfast_adapters_postgres::LockStrategy;
use holdfast_domain::{Generation, Queue, QueueName, RequestId, Slot, Timestamp};
use holdfast_ports::conformance::support::T0;
use holdfast_ports::{CasOutcome, QueueStore};
use sqlx::{PgConnection, Row};
use support::TestDb;

/// The warning capture the SQLite adapter's tests use too.
#[path = "../../adapters-sqlite/tests/common/warnings.rs"]
mod warnings;
use warnings::Warnings;

// ---------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------

/// Runs `sql` (one or more statements) on a plain connection.
async fn exec(conn: &mut PgConnection, sql: &'static str) {
    sqlx::raw_sql(sql)
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The upgrade time: when version 6 (the build data) was installed, in
/// milliseconds. The publication time version 6 gave the owners it found, and
/// what unrecorded owner times read as; later versions do not move it.
async fn upgrade_time(conn: &mut PgConnection) -> Timestamp {
    let ms: i64 = sqlx::query_scalar(
        "SELECT (extract(epoch FROM installed_on) * 1000)::BIGINT FROM _sqlx_migrations
         WHERE version = 6",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("the upgrade time");
    Timestamp(u64::try_from(ms).expect("after the epoch"))
}

/// Moves the `installed_on` of every version after 6 an hour later, as if they
/// had been installed by a later upgrade; the upgrade time must stay.
async fn install_later_versions_an_hour_later(conn: &mut PgConnection) {
    let moved = sqlx::query(
        "UPDATE _sqlx_migrations SET installed_on = installed_on + INTERVAL '1 hour'
         WHERE version > 6",
    )
    .execute(&mut *conn)
    .await
    .expect("move the later versions");
    assert!(moved.rows_affected() > 0, "no version after 6 to move");
}

/// The owner columns of queue `name` as stored: owners, claim and heartbeat
/// arrays, and the build map as text.
async fn raw_owners(
    conn: &mut PgConnection,
    name: &str,
) -> (Vec<String>, Vec<Option<i64>>, Vec<Option<i64>>, String) {
    let row = sqlx::query(
        "SELECT owners, owner_claimed_ms, owner_heartbeat_ms, owner_builds::TEXT
         FROM queues WHERE name = $1",
    )
    .bind(name)
    .fetch_one(&mut *conn)
    .await
    .expect("the queue row");
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

/// Whether the build map of queue `name` equals `json` (as JSONB: key order and
/// spacing do not matter).
async fn builds_equal(conn: &mut PgConnection, name: &str, json: &str) -> bool {
    sqlx::query_scalar("SELECT owner_builds = $2::JSONB FROM queues WHERE name = $1")
        .bind(name)
        .bind(json)
        .fetch_one(&mut *conn)
        .await
        .expect("compare the build map")
}

fn at(ms: u64) -> Timestamp {
    Timestamp(T0.0 + ms)
}

fn owners_of(queue: &Queue) -> Vec<(u64, Slot)> {
    queue
        .owners
        .iter()
        .map(|(id, slot)| (id.seq(), *slot))
        .collect()
}

// ---------------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------------

/// A database at schema version 5 with two owners: the upgrade to version 6 gives
/// each an entry of its claim, generation 0, published at the upgrade (the
/// migration's `installed_on`) and not expiring, so their builds, started by the
/// older holdfast, stay live while their heartbeats come and none is published
/// again at once; they load without a warning.
#[tokio::test]
async fn upgrading_from_version_5_reads_owners_as_published_at_the_upgrade() {
    let Some(db) = TestDb::create("upgrading_from_version_5").await else {
        return;
    };
    let mut conn = db.connection().await;
    holdfast_adapters_postgres::migrator_up_to(5)
        .run(&mut conn)
        .await
        .expect("migrate to version 5");
    exec(
        &mut conn,
        "INSERT INTO queues (name, latest_request_id, owners, owner_claimed_ms,
                             owner_heartbeat_ms, max_concurrent, version)
         VALUES ('main', 'request/main/2', '{request/main/1,request/main/2}',
                 '{1796025600000,1796025660000}', '{1796025900000,1796025660000}', 2, 5),
                ('empty', NULL, '{}', '{}', '{}', NULL, 1)",
    )
    .await;
    let backend = db.backend(LockStrategy::OnConflict, 2).await;
    let upgraded = upgrade_time(&mut conn).await;
    let warnings = Warnings::default();
    let _logs = tracing::subscriber::set_default(warnings.clone());
    let name = QueueName::new("main").expect("queue");
    let queue = backend
        .load_queue(&name)
        .await
        .expect("load")
        .expect("queue");
    let published = Some(upgraded);
    assert_eq!(
        owners_of(&queue),
        vec![
            (
                1,
                Slot {
                    heartbeat_at: at(300_000),
                    published_at: published,
                    ..Slot::claimed(T0)
                }
            ),
            (
                2,
                Slot {
                    published_at: published,
                    ..Slot::claimed(at(60_000))
                }
            ),
        ]
    );
    assert_eq!(
        queue.owners[&RequestId::new(name, 1)].generation,
        Generation::NONE
    );
    let want = format!(
        r#"{{"request/main/1": {{"claimed_ms": 1796025600000, "generation": 0,
                                 "published_ms": {up}, "expiring": false}},
            "request/main/2": {{"claimed_ms": 1796025660000, "generation": 0,
                                 "published_ms": {up}, "expiring": false}}}}"#,
        up = upgraded.0
    );
    assert!(
        builds_equal(&mut conn, "main", &want).await,
        "{:?}",
        raw_owners(&mut conn, "main").await
    );
    assert!(builds_equal(&mut conn, "empty", "{}").await);
    assert_eq!(warnings.lines(), Vec::<String>::new());
}

/// Queue rows no holdfast of this version writes, but an older one (or a row
/// written before a constraint existed) can hold: owner times that are NULL,
/// negative, after year 9999 or missing (arrays shorter than the owners, written
/// here with the cardinality constraint dropped), owners without build data, an
/// entry of an earlier claim, entries that do not read or lack a publication
/// time, and entries of ids that own nothing. The load reads each time as the
/// upgrade time, each build nobody recorded for the owner's claim as generation
/// 0 published at the upgrade time, and each field that does not read as the
/// module docs say, warning about every one; a publication withdrawn by this code
/// (JSON null) reads as none, without a warning. The next compare-and-set stores
/// a whole, consistent row (so the constraint holds again). The upgrade time is
/// when version 6 was installed, also after later versions were installed an
/// hour later.
#[tokio::test]
async fn queue_rows_of_an_older_writer_read_as_the_upgrade_time_and_are_repaired() {
    let Some(db) = TestDb::create("queue_rows_of_an_older_writer").await else {
        return;
    };
    let backend = db.backend(LockStrategy::OnConflict, 2).await;
    let mut conn = db.connection().await;
    exec(
        &mut conn,
        "ALTER TABLE queues DROP CONSTRAINT queues_owner_times;
         INSERT INTO queues (name, latest_request_id, owners, owner_claimed_ms,
                             owner_heartbeat_ms, max_concurrent, version, owner_builds)
         VALUES ('old', 'request/old/9',
                 '{request/old/1,request/old/2,request/old/3,request/old/4,request/old/5,
                   request/old/6,request/old/8,request/old/9,request/old/7}',
                 '{NULL,1796025600000,1796025600000,1796025600000,1796025600000,1796025600000,
                   1796025600000,1796025600000}',
                 '{-5,253402300800000,1796025601000,1796025600000,1796025600000,1796025600000,
                   1796025600000,1796025600000}',
                 9, 4,
                 '{\"request/old/3\": {\"claimed_ms\": 1796025600000, \"generation\": 4,
                                      \"published_ms\": 1796025600500, \"expiring\": true},
                   \"request/old/4\": {\"claimed_ms\": 1796025599000, \"generation\": 9,
                                      \"published_ms\": 1796025599500, \"expiring\": true},
                   \"request/old/5\": {\"claimed_ms\": 1796025600000, \"generation\": \"x\",
                                      \"published_ms\": -1, \"expiring\": \"maybe\"},
                   \"request/old/6\": 5,
                   \"request/old/8\": {\"claimed_ms\": 1796025600000, \"generation\": 2,
                                      \"published_ms\": null, \"expiring\": false},
                   \"request/old/9\": {\"claimed_ms\": 1796025600000, \"generation\": 1,
                                      \"expiring\": false},
                   \"request/old/99\": {\"claimed_ms\": 1, \"generation\": 1,
                                       \"published_ms\": 1, \"expiring\": false},
                   \"request/other/1\": {}}')",
    )
    .await;
    let upgraded = upgrade_time(&mut conn).await;
    // A later migration installed after version 6 does not move the time the
    // owners below read as.
    install_later_versions_an_hour_later(&mut conn).await;

    let warnings = Warnings::default();
    let _logs = tracing::subscriber::set_default(warnings.clone());
    let name = QueueName::new("old").expect("queue");
    let queue = backend
        .load_queue(&name)
        .await
        .expect("an older writer's row loads")
        .expect("queue");
    let published = |slot: Slot| Slot {
        published_at: Some(upgraded),
        ..slot
    };
    assert_eq!(
        owners_of(&queue),
        vec![
            (1, published(Slot::claimed(upgraded))),
            (
                2,
                published(Slot {
                    heartbeat_at: upgraded,
                    ..Slot::claimed(T0)
                })
            ),
            (
                3,
                Slot {
                    heartbeat_at: at(1_000),
                    generation: Generation(4),
                    published_at: Some(at(500)),
                    expiring: true,
                    ..Slot::claimed(T0)
                }
            ),
            (4, published(Slot::claimed(T0))),
            (5, published(Slot::claimed(T0))),
            (6, published(Slot::claimed(T0))),
            (7, published(Slot::claimed(upgraded))),
            (
                8,
                Slot {
                    generation: Generation(2),
                    ..Slot::claimed(T0)
                }
            ),
            (
                9,
                published(Slot {
                    generation: Generation(1),
                    ..Slot::claimed(T0)
                })
            ),
        ]
    );
    let shown = format!("{:#?}", warnings.lines());
    for (owner, parts) in [
        (1, &["column=owner_claimed_ms", "stored=None"][..]),
        (1, &["column=owner_heartbeat_ms", "stored=Some(-5)"]),
        (
            2,
            &["column=owner_heartbeat_ms", "stored=Some(253402300800000)"],
        ),
        (7, &["column=owner_claimed_ms", "stored=None"]),
        (7, &["column=owner_heartbeat_ms", "stored=None"]),
        (1, &["without build data"]),
        (2, &["without build data"]),
        (7, &["without build data"]),
        (4, &["another claim", "stored=1796025599000"]),
        (5, &["unreadable generation", "stored=x"]),
        (5, &["unreadable publication time", "stored=-1"]),
        (5, &["unreadable expiring mark", "stored=maybe"]),
        (6, &["not an object", "stored=number"]),
        (9, &["unreadable publication time", "stored=nothing"]),
    ] {
        let owner = format!("owner=request/old/{owner}");
        let mut all = vec!["queue=old", owner.as_str()];
        all.extend_from_slice(parts);
        assert_eq!(warnings.count(&all), 1, "one warning {all:?}: {shown}");
    }
    assert_eq!(
        warnings.count(&["queue=old", "entries=2", "own no slot"]),
        1,
        "{shown}"
    );
    assert_eq!(warnings.lines().len(), 15, "{shown}");

    // The next write stores the row as read: whole arrays, one entry per owner.
    assert_eq!(
        backend.cas_queue(queue.version, &queue).await,
        Ok(CasOutcome::Applied)
    );
    let (owners, claimed, heartbeats, _) = raw_owners(&mut conn, "old").await;
    let t0 = i64::try_from(T0.0).expect("millis");
    let up = i64::try_from(upgraded.0).expect("millis");
    assert_eq!(owners.len(), 9);
    assert_eq!(
        claimed,
        [up, t0, t0, t0, t0, t0, up, t0, t0].map(Some).to_vec(),
        "claims"
    );
    assert_eq!(
        heartbeats,
        [up, up, t0 + 1_000, t0, t0, t0, up, t0, t0]
            .map(Some)
            .to_vec(),
        "heartbeats"
    );
    let entry = |claimed: i64, generation: u32, published: &str| {
        format!(
            r#"{{"claimed_ms": {claimed}, "generation": {generation}, "published_ms": {published}, "expiring": false}}"#
        )
    };
    let up_text = up.to_string();
    let want = format!(
        r#"{{"request/old/1": {u}, "request/old/2": {t},
            "request/old/3": {{"claimed_ms": {t0}, "generation": 4,
                               "published_ms": {p}, "expiring": true}},
            "request/old/4": {t}, "request/old/5": {t}, "request/old/6": {t},
            "request/old/7": {u}, "request/old/8": {withdrawn},
            "request/old/9": {missing}}}"#,
        u = entry(up, 0, &up_text),
        t = entry(t0, 0, &up_text),
        withdrawn = entry(t0, 2, "null"),
        missing = entry(t0, 1, &up_text),
        p = t0 + 500,
    );
    assert!(
        builds_equal(&mut conn, "old", &want).await,
        "{:?}",
        raw_owners(&mut conn, "old").await
    );
    exec(
        &mut conn,
        "ALTER TABLE queues ADD CONSTRAINT queues_owner_times CHECK (
             cardinality(owner_claimed_ms) = cardinality(owners)
             AND cardinality(owner_heartbeat_ms) = cardinality(owners))",
    )
    .await;
    let again = backend
        .load_queue(&name)
        .await
        .expect("load")
        .expect("queue");
    assert_eq!(again.owners, queue.owners);
    assert_eq!(warnings.lines().len(), 15, "no new warning: {shown}");
}

/// The write of an older holdfast during a rolling upgrade: it rewrites the owners
/// and their times but not the build map. An owner it kept keeps its build data;
/// an owner it released and claimed again, and one it admitted, read as
/// generation 0 published at the upgrade time (with a warning: the older writer
/// may have published their builds), never with the generation of an earlier
/// claim; the entry of an owner it released is ignored.
#[tokio::test]
async fn an_older_writer_keeps_the_builds_of_the_owners_it_keeps_and_no_others() {
    let Some(db) = TestDb::create("an_older_writer_keeps_the_builds").await else {
        return;
    };
    let backend = db.backend(LockStrategy::OnConflict, 2).await;
    let name = QueueName::new("q").expect("queue");
    backend
        .create_request(&name, &holdfast_ports::conformance::support::uri("git:a"))
        .await
        .expect("create");
    let mut queue = backend
        .load_queue(&name)
        .await
        .expect("load")
        .expect("queue");
    let published = |generation: u32| Slot {
        generation: Generation(generation),
        published_at: Some(at(100)),
        ..Slot::claimed(T0)
    };
    for (n, generation) in [(1, 2), (2, 3), (3, 5)] {
        queue
            .owners
            .insert(RequestId::new(name.clone(), n), published(generation));
    }
    assert_eq!(
        backend.cas_queue(queue.version, &queue).await,
        Ok(CasOutcome::Applied)
    );
    // The older writer's compare-and-set: 1 kept, 2 released and claimed again a
    // second later, 3 released, 4 admitted.
    let mut conn = db.connection().await;
    let upgraded = upgrade_time(&mut conn).await;
    exec(
        &mut conn,
        "UPDATE queues
         SET owners = '{request/q/1,request/q/2,request/q/4}',
             owner_claimed_ms = '{1796025600000,1796025601000,1796025602000}',
             owner_heartbeat_ms = '{1796025600000,1796025601000,1796025602000}',
             version = version + 1
         WHERE name = 'q'",
    )
    .await;
    let warnings = Warnings::default();
    let _logs = tracing::subscriber::set_default(warnings.clone());
    let loaded = backend
        .load_queue(&name)
        .await
        .expect("load")
        .expect("queue");
    let at_upgrade = |claimed: Timestamp| Slot {
        published_at: Some(upgraded),
        ..Slot::claimed(claimed)
    };
    assert_eq!(
        owners_of(&loaded),
        vec![
            (1, published(2)),
            (2, at_upgrade(at(1_000))),
            (4, at_upgrade(at(2_000))),
        ]
    );
    let shown = format!("{:#?}", warnings.lines());
    assert_eq!(
        warnings.count(&["owner=request/q/2", "another claim"]),
        1,
        "{shown}"
    );
    assert_eq!(
        warnings.count(&["owner=request/q/4", "without build data"]),
        1,
        "{shown}"
    );
    assert_eq!(warnings.count(&["entries=1", "own no slot"]), 1, "{shown}");
    assert_eq!(warnings.lines().len(), 3, "{shown}");
    assert_eq!(
        backend.cas_queue(loaded.version, &loaded).await,
        Ok(CasOutcome::Applied)
    );
    let up = upgraded.0;
    let none = format!(r#"{{"generation": 0, "published_ms": {up}, "expiring": false"#);
    let want = format!(
        r#"{{"request/q/1": {{"claimed_ms": 1796025600000, "generation": 2,
                              "published_ms": 1796025600100, "expiring": false}},
            "request/q/2": {none}, "claimed_ms": 1796025601000}},
            "request/q/4": {none}, "claimed_ms": 1796025602000}}}}"#
    );
    assert!(
        builds_equal(&mut conn, "q", &want).await,
        "{:?}",
        raw_owners(&mut conn, "q").await
    );
}
