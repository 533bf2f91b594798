//! [`SqliteBackend`]: one adapter instance on a SQLite database (a file or memory),
//! opened with its connections configured and its schema migrated.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use holdfast_domain::Timestamp;
use holdfast_ports::{StoreFault, Stores};
use rusqlite::{Connection, OpenFlags};

use crate::dbfile::DbFile;
use crate::error::OpenError;
use crate::lockout::BusyWaits;
use crate::options::{Location, SqliteOptions};
use crate::pool::{self, Db, Pool};
use crate::schema;
use crate::wake::Wake;

/// One adapter instance on a SQLite database: implements every holdfast port.
/// Cheap to clone (the clones share the connections).
#[derive(Clone, Debug)]
pub struct SqliteBackend {
    pub(crate) pool: Arc<Pool>,
    pub(crate) wake: Arc<Wake>,
    /// The owner id recorded on this instance's locks and selections.
    pub(crate) owner: Arc<str>,
    location: Location,
}

impl SqliteBackend {
    /// Opens (creating if missing) the database at `location` — `sqlite://path`,
    /// `sqlite:path`, `sqlite::memory:` or a plain file path — and applies any
    /// missing migrations.
    pub async fn open(location: &str, options: SqliteOptions) -> Result<Self, OpenError> {
        options.validate()?;
        let location = Location::parse(location)?;
        let loc = location.clone();
        let pool = tokio::task::spawn_blocking(move || open_pool(&loc, &options))
            .await
            .map_err(|e| StoreFault::Backend(format!("the open task failed: {e}")))??;
        tracing::debug!(?location, "opened SQLite backend");
        let pool = Arc::new(pool);
        let wake = match location {
            Location::Memory => Wake::in_process(),
            Location::File(_) => Wake::polling(&pool),
        };
        Ok(SqliteBackend {
            pool,
            wake: Arc::new(wake),
            owner: Arc::from(""),
            location,
        })
    }

    /// A private, migrated in-memory database (one connection; for tests and demos).
    pub async fn open_in_memory() -> Result<Self, OpenError> {
        Self::open(":memory:", SqliteOptions::default()).await
    }

    /// The ports of this instance, as the app wires them.
    pub fn stores(&self) -> Stores {
        Stores::shared(Arc::new(self.clone()))
    }

    /// This instance with `owner` as the owner id it records on its locks and
    /// selections, so a restarted instance with the same id finds its own
    /// unsettled work ([`holdfast_ports::LockStore::unsettled_owned`]). Default `""`.
    pub fn with_owner(mut self, owner: &str) -> Self {
        self.owner = Arc::from(owner);
        self
    }

    /// The owner id this instance records.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Where this instance's database lives.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// How many write transactions of this instance waited for another
    /// connection's write lock, and how many failed busy after the whole busy
    /// timeout or after a short probe (module `lockout`).
    pub fn busy_waits(&self) -> BusyWaits {
        self.pool.busy_waits()
    }
}

/// Prepared statements kept per connection: more than the adapter's distinct
/// statements, so none is parsed again (rusqlite keeps 16 by default, and a
/// select's round trip alone uses more than that between settlements).
const STATEMENT_CACHE: usize = 128;

fn configure(conn: &Connection, options: &SqliteOptions) -> Result<(), StoreFault> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.busy_timeout(options.busy_timeout).db()?;
    conn.pragma_update(None, "synchronous", "FULL").db()?;
    conn.pragma_update(None, "foreign_keys", "ON").db()?;
    Ok(())
}

/// Keeps the writer's savepoint journals in memory, once its migrations have
/// run. Savepoints (one per write of a group commit) journal the pages they
/// change; past 64 KiB SQLite spills that journal to a temporary file, which
/// was 12% of the process's CPU on `hot-wallets` (docs/measurements.md,
/// "SQLite: savepoint journals in memory"). The journal only serves rolling a
/// savepoint back (the commit's durability is the WAL's) and is freed when the
/// write's savepoint is released, so it holds at most what one write changes:
/// about 8 KiB per token for a batch of tokens added beside other writes.
/// Migrations and the readers keep SQLite's default, so a migration's index
/// build or a reader's sort may still spill to disk.
fn journal_savepoints_in_memory(writer: &Connection) -> Result<(), StoreFault> {
    writer.pragma_update(None, "temp_store", "MEMORY").db()
}

fn open_connection(
    path: &std::path::Path,
    options: &SqliteOptions,
) -> Result<Connection, OpenError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| OpenError::Unavailable {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    configure(&conn, options).map_err(|e| at_path(path, e))?;
    Ok(conn)
}

/// A fault while opening `path`: a file that cannot be used (not a database,
/// unreadable) is [`OpenError::Unavailable`] naming the path; busy and the rest
/// stay faults.
fn at_path(path: &std::path::Path, fault: StoreFault) -> OpenError {
    match fault {
        StoreFault::Corrupt(reason) | StoreFault::Unavailable(reason) => OpenError::Unavailable {
            path: path.display().to_string(),
            reason,
        },
        other => OpenError::Fault(other),
    }
}

fn open_pool(location: &Location, options: &SqliteOptions) -> Result<Pool, OpenError> {
    let now = Timestamp(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()
            .and_then(|d| u64::try_from(d.as_millis()).ok())
            .unwrap_or(0),
    );
    match location {
        Location::Memory => {
            let mut conn = Connection::open_in_memory().db()?;
            configure(&conn, options)?;
            schema::migrate(&mut conn, now)?;
            journal_savepoints_in_memory(&conn)?;
            Ok(Pool::new(conn, Vec::new(), options.busy_timeout, None))
        }
        Location::File(path) => {
            let mut writer = open_connection(path, options)?;
            let mode: String = writer
                .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
                .map_err(|e| at_path(path, pool::fault(e)))?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(OpenError::Unavailable {
                    path: path.display().to_string(),
                    reason: format!("journal mode is {mode}; expected WAL"),
                });
            }
            schema::migrate(&mut writer, now)?;
            journal_savepoints_in_memory(&writer).map_err(|e| at_path(path, e))?;
            // What the path names now that the writer has it open (the
            // migration's first read made the -wal).
            let file = DbFile::record(path)?;
            let mut readers = Vec::with_capacity(options.readers);
            for _ in 0..options.readers {
                let reader = open_connection(path, options)?;
                reader.pragma_update(None, "query_only", "ON").db()?;
                readers.push(reader);
            }
            // The readers opened the same file.
            if let Some(file) = &file {
                file.check().map_err(|e| at_path(path, e))?;
            }
            Ok(Pool::new(writer, readers, options.busy_timeout, file))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every connection of a file's pool runs with the adapter's pragmas; the
    /// writer, once migrated, keeps its savepoint journals in memory and the
    /// readers keep SQLite's default.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_writer_keeps_savepoint_journals_in_memory() {
        let dir = tempfile::tempdir().expect("temp dir");
        let location = Location::File(dir.path().join("pragmas.db"));
        let pool =
            std::sync::Arc::new(open_pool(&location, &SqliteOptions::default()).expect("opens"));
        let pragmas = |tx: &rusqlite::Transaction<'_>| -> Result<[i64; 3], StoreFault> {
            let get = |name: &str| tx.pragma_query_value(None, name, |r| r.get(0)).db();
            Ok([
                get("temp_store")?,
                get("synchronous")?,
                get("foreign_keys")?,
            ])
        };
        let writer = pool.write(pragmas).await.expect("the writer's");
        let reader = pool.read(pragmas).await.expect("a reader's");
        drop(pool);
        // temp_store 2 is MEMORY, 0 SQLite's default; synchronous 2 is FULL.
        assert_eq!(writer, [2, 2, 1]);
        assert_eq!(reader, [0, 2, 1]);
    }
}
