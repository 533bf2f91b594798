//! Versioned, embedded migrations, applied on open.
//!
//! Applied versions are recorded in `holdfast_schema` (version, name, applied_at).
//! Opening a database whose recorded version is newer than the newest migration
//! here is [`OpenError::SchemaTooNew`]; migrations run in one `BEGIN IMMEDIATE`
//! transaction, so replicas opening the same file at once apply each one once.

use holdfast_domain::Timestamp;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use holdfast_ports::StoreFault;

use crate::codec::{time_from_sql, time_to_sql};
use crate::error::OpenError;
use crate::pool::Db;

/// One schema migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// Its version; versions are 1, 2, 3, ... in order.
    pub version: i64,
    /// A short name.
    pub name: &'static str,
    /// The DDL it runs.
    pub sql: &'static str,
}

/// Every migration, oldest first.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "tokens_locks_statuses_queues",
        sql: include_str!("../migrations/0001_initial.sql"),
    },
    Migration {
        version: 2,
        name: "selections",
        sql: include_str!("../migrations/0002_selections.sql"),
    },
    Migration {
        version: 3,
        name: "slot_leases",
        sql: include_str!("../migrations/0003_slot_leases.sql"),
    },
    Migration {
        version: 4,
        name: "owners",
        sql: include_str!("../migrations/0004_owners.sql"),
    },
    Migration {
        version: 5,
        name: "slot_builds",
        sql: include_str!("../migrations/0005_slot_builds.sql"),
    },
];

/// The schema version this code creates and understands: its newest migration's.
pub const SCHEMA_VERSION: i64 = MIGRATIONS[MIGRATIONS.len() - 1].version;

const VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS holdfast_schema (
    version    INTEGER NOT NULL PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at TEXT    NOT NULL
)";

/// Applies every missing migration; returns the versions applied now.
pub(crate) fn migrate(conn: &mut Connection, now: Timestamp) -> Result<Vec<i64>, OpenError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .db()?;
    tx.execute_batch(VERSION_TABLE).db()?;
    let current: i64 = tx
        .query_row(
            "SELECT COALESCE(MAX(version), 0) FROM holdfast_schema",
            [],
            |r| r.get(0),
        )
        .db()?;
    if current > SCHEMA_VERSION {
        return Err(OpenError::SchemaTooNew {
            found: current,
            known: SCHEMA_VERSION,
        });
    }
    let applied_at = time_to_sql(now)?;
    let mut applied = Vec::new();
    for m in MIGRATIONS.iter().filter(|m| m.version > current) {
        let failed = |e: rusqlite::Error| OpenError::Migration {
            version: m.version,
            name: m.name,
            reason: e.to_string(),
        };
        tx.execute_batch(m.sql).map_err(failed)?;
        tx.execute(
            "INSERT INTO holdfast_schema (version, name, applied_at) VALUES (?1, ?2, ?3)",
            rusqlite::params![m.version, m.name, applied_at],
        )
        .map_err(failed)?;
        applied.push(m.version);
    }
    tx.commit().db()?;
    Ok(applied)
}

/// When this database was migrated to its current schema: the `applied_at` of its
/// newest recorded migration. Owner times (claim, heartbeat, publication) an
/// older holdfast left unrecorded or unreadable read as this time (see
/// [`crate::queues`]).
pub(crate) fn upgraded_at(conn: &Connection) -> Result<Timestamp, StoreFault> {
    let text: Option<String> = conn
        .prepare_cached("SELECT applied_at FROM holdfast_schema ORDER BY version DESC LIMIT 1")
        .db()?
        .query_row([], |r| r.get(0))
        .optional()
        .db()?;
    let text = text.ok_or_else(|| {
        StoreFault::Corrupt("holdfast_schema: no migration is recorded".to_owned())
    })?;
    time_from_sql("holdfast_schema row", &text)
}
