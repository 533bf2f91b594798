//! Connections: one writer and a few readers per adapter instance, used only on
//! tokio's blocking threads, and the round-trip counter.
//!
//! Every write runs on the writer connection inside `BEGIN IMMEDIATE`, so a
//! transaction takes SQLite's write lock up front instead of failing when it
//! upgrades a read. While another connection (another process or instance on the
//! same file) holds the lock, [`begin_immediate`] tries again after pauses of at
//! most 0.8 ms up to the busy timeout; SQLite's own busy handler sleeps up to
//! 100 ms between tries, which put hundreds of milliseconds in the tail of writers
//! that share a file. The cap is a trade measured on `big-wallet` (3 writers on
//! one file): 2 ms gave p99 75–109 ms at p50 3.0–3.3 ms, 0.8 ms 64–67 ms at
//! 4.2–4.4 ms, 0.4 ms 50–57 ms at 7.3–9.5 ms (a writer that polls more often
//! gets its turn sooner, at the cost of the others' median). Reads run on a reader connection
//! (WAL lets them proceed beside the writer); an in-memory database has only the
//! writer, which then serves reads too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use holdfast_ports::StoreFault;
use rusqlite::{Connection, ErrorCode, Transaction, TransactionBehavior};

/// Maps a rusqlite error to the port's fault: busy/locked after the timeout is
/// [`StoreFault::Busy`], never a panic.
pub(crate) fn fault(e: rusqlite::Error) -> StoreFault {
    match &e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => StoreFault::Busy(e.to_string()),
            ErrorCode::CannotOpen | ErrorCode::PermissionDenied | ErrorCode::ReadOnly => {
                StoreFault::Unavailable(e.to_string())
            }
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => {
                StoreFault::Corrupt(e.to_string())
            }
            _ => StoreFault::Backend(e.to_string()),
        },
        _ => StoreFault::Backend(e.to_string()),
    }
}

/// `.db()?` turns a rusqlite result into one whose error converts into any port error.
pub(crate) trait Db<T> {
    fn db(self) -> Result<T, StoreFault>;
}

impl<T> Db<T> for Result<T, rusqlite::Error> {
    fn db(self) -> Result<T, StoreFault> {
        self.map_err(fault)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a connection cannot leave a transaction open (dropping
    // the rusqlite Transaction rolls it back), so the connection is still usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The longest pause between two tries of `BEGIN IMMEDIATE` while the write lock
/// is held elsewhere.
const MAX_BEGIN_PAUSE: Duration = Duration::from_micros(800);

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if matches!(f.code, ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked))
}

/// Opens a `BEGIN IMMEDIATE` transaction on `conn`, trying again with short
/// pauses (from 0.1 ms, doubling to 0.8 ms) while the write lock is
/// held elsewhere, for at most `busy_timeout`; then [`StoreFault::Busy`]. The
/// connection's own busy timeout is off while it tries and `busy_timeout` again
/// for the statements of the transaction. Public so that a hand-written cycle on
/// the same file (the simulator's raw limit) waits the same way.
pub fn begin_immediate(
    conn: &Connection,
    busy_timeout: Duration,
) -> Result<Transaction<'_>, StoreFault> {
    let deadline = Instant::now() + busy_timeout;
    let mut pause = Duration::from_micros(100);
    conn.busy_timeout(Duration::ZERO).db()?;
    loop {
        match Transaction::new_unchecked(conn, TransactionBehavior::Immediate) {
            Ok(tx) => {
                tx.busy_timeout(busy_timeout).db()?;
                return Ok(tx);
            }
            Err(e) if is_busy(&e) && Instant::now() < deadline => {
                std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
                pause = (pause * 2).min(MAX_BEGIN_PAUSE);
            }
            Err(e) => {
                let _ = conn.busy_timeout(busy_timeout);
                return Err(fault(e));
            }
        }
    }
}

/// The connections of one adapter instance.
pub(crate) struct Pool {
    busy_timeout: Duration,
    writer: Mutex<Connection>,
    readers: Option<Readers>,
    round_trips: AtomicU64,
}

struct Readers {
    idle: Mutex<Vec<Connection>>,
    returned: Condvar,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("readers", &self.readers.is_some())
            .field("round_trips", &self.round_trips.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Pool {
    pub(crate) fn new(
        writer: Connection,
        readers: Vec<Connection>,
        busy_timeout: Duration,
    ) -> Pool {
        let readers = (!readers.is_empty()).then(|| Readers {
            idle: Mutex::new(readers),
            returned: Condvar::new(),
        });
        Pool {
            busy_timeout,
            writer: Mutex::new(writer),
            readers,
            round_trips: AtomicU64::new(0),
        }
    }

    /// The writer's `PRAGMA data_version` (it changes when another connection
    /// committed), or `None` when the writer is busy right now.
    pub(crate) fn try_data_version(&self) -> Option<i64> {
        let conn = match self.writer.try_lock() {
            Ok(conn) => conn,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        conn.pragma_query_value(None, "data_version", |r| r.get(0))
            .ok()
    }

    pub(crate) fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction on the writer, on a blocking
    /// thread; commits when `f` returns Ok, rolls back otherwise. One round trip.
    pub(crate) async fn write<T, E, F>(self: &Arc<Self>, f: F) -> Result<T, E>
    where
        F: FnOnce(&Transaction<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreFault> + Send + 'static,
    {
        let pool = Arc::clone(self);
        pool.round_trips.fetch_add(1, Ordering::Relaxed);
        run_blocking(move || {
            let conn = lock(&pool.writer);
            let tx = begin_immediate(&conn, pool.busy_timeout)?;
            let out = f(&tx)?;
            tx.commit().db()?;
            Ok(out)
        })
        .await
    }

    /// Runs `f` in a read transaction (one consistent snapshot) on a reader, on a
    /// blocking thread. One round trip.
    pub(crate) async fn read<T, E, F>(self: &Arc<Self>, f: F) -> Result<T, E>
    where
        F: FnOnce(&Transaction<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreFault> + Send + 'static,
    {
        let pool = Arc::clone(self);
        pool.round_trips.fetch_add(1, Ordering::Relaxed);
        run_blocking(move || match &pool.readers {
            None => {
                let mut conn = lock(&pool.writer);
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Deferred)
                    .db()?;
                f(&tx)
            }
            Some(readers) => {
                let mut conn = readers.checkout();
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Deferred)
                    .db()?;
                f(&tx)
            }
        })
        .await
    }
}

/// A reader connection taken from the pool; given back when dropped (also when the
/// work panicked), so the pool never shrinks.
struct Checked<'a> {
    readers: &'a Readers,
    conn: Option<Connection>,
}

impl std::ops::Deref for Checked<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
            .as_ref()
            .unwrap_or_else(|| unreachable!("taken only in drop"))
    }
}

impl std::ops::DerefMut for Checked<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn
            .as_mut()
            .unwrap_or_else(|| unreachable!("taken only in drop"))
    }
}

impl Drop for Checked<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            lock(&self.readers.idle).push(conn);
            self.readers.returned.notify_one();
        }
    }
}

impl Readers {
    /// Waits (on this blocking thread) for an idle reader.
    fn checkout(&self) -> Checked<'_> {
        let mut idle = lock(&self.idle);
        loop {
            if let Some(conn) = idle.pop() {
                return Checked {
                    readers: self,
                    conn: Some(conn),
                };
            }
            idle = self
                .returned
                .wait(idle)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

async fn run_blocking<T, E, F>(f: F) -> Result<T, E>
where
    F: FnOnce() -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: From<StoreFault> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(out) => out,
        Err(e) => Err(StoreFault::Backend(format!("the database task failed: {e}")).into()),
    }
}
