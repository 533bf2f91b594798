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
//!
//! **Group commit.** Writes of one instance queue for its writer; whoever finds
//! the writer idle leads: it takes every write queued so far, runs them one
//! after another in one `BEGIN IMMEDIATE` transaction, each inside its own
//! savepoint (a write that fails is rolled back to its savepoint and answers its
//! error, the others go on), commits once, and only then answers them; then it
//! takes what queued meanwhile. Alone, a write is a transaction of its own as
//! before. Under concurrency the write lock is taken and the WAL written once per
//! batch instead of once per write: the time that goes is the rows written, not
//! the lock handoffs between instances. A batch answers nothing before its
//! commit, so no caller learns of a write that is then rolled back. A leader
//! that has run batches back to back for a millisecond pauses briefly, so that
//! other instances on the file get the write lock too.
//!
//! **Busy and moved files.** How long a batch tries for the write lock is the
//! lockout's to say (`lockout`: the whole busy timeout, or a short probe just
//! after a write waited it out). Once a batch holds the lock, and again after
//! its commit, the database file is checked to be the one opened (`dbfile`); a
//! read checks it before it reads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use holdfast_ports::StoreFault;
use rusqlite::{Connection, ErrorCode, Transaction, TransactionBehavior};

use crate::dbfile::DbFile;
use crate::lockout::{BusyWaits, Lockout};

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

/// How long a leader may run batches back to back before it lets go of the
/// write lock for [`FAIR_PAUSE`].
const FAIR_TURN_AFTER: Duration = Duration::from_millis(1);

/// The pause that gives other instances, polling for the write lock at most
/// [`MAX_BEGIN_PAUSE`] apart, a turn. Without it a leader with a full queue
/// took the lock again as soon as it committed: on `big-wallet` (three
/// instances on one file) p99 was 44–47 ms at p50 1.4–1.5 ms; with it 23 ms
/// at 2.1 ms, at the same throughput, and a serial lineage (`hot-lineage`),
/// whose leader seldom runs that long, pays nothing. A pause after every batch
/// instead cost `hot-lineage` 14%.
const FAIR_PAUSE: Duration = Duration::from_micros(100);

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
    begin_within(conn, busy_timeout, busy_timeout, || {})
}

/// [`begin_immediate`] trying for the lock for `wait` (the statements still get
/// `busy_timeout`); calls `waiting` once when it first finds the lock held.
fn begin_within(
    conn: &Connection,
    wait: Duration,
    busy_timeout: Duration,
    waiting: impl FnOnce(),
) -> Result<Transaction<'_>, StoreFault> {
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_micros(100);
    let mut waiting = Some(waiting);
    conn.busy_timeout(Duration::ZERO).db()?;
    loop {
        match Transaction::new_unchecked(conn, TransactionBehavior::Immediate) {
            Ok(tx) => {
                tx.busy_timeout(busy_timeout).db()?;
                return Ok(tx);
            }
            Err(e) if is_busy(&e) && Instant::now() < deadline => {
                if let Some(waiting) = waiting.take() {
                    waiting();
                }
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
    /// Whether another connection was just found holding the write lock past
    /// the busy timeout (`lockout`).
    lockout: Lockout,
    /// The file and the check that its path still names it; `None` in memory.
    file: Option<DbFile>,
    writer: Mutex<Connection>,
    /// Writes waiting for the writer, and whether a leader runs them.
    writes: Mutex<Writes>,
    readers: Option<Readers>,
    round_trips: AtomicU64,
    /// Write transactions begun (a batch is one).
    transactions: AtomicU64,
}

#[derive(Default)]
struct Writes {
    queue: Vec<Box<dyn Job>>,
    leading: bool,
}

/// A queued write: run inside the batch's transaction, or failed unrun.
trait Job: Send {
    /// Runs the write; `Ok` holds the answer to send once the batch committed.
    fn run(self: Box<Self>, tx: &Transaction<'_>) -> Result<Answer, ()>;
    /// Answers the error without running (the batch could not begin).
    fn fail(self: Box<Self>, fault: StoreFault);
}

/// Sends a write's result once its batch's commit answered.
type Answer = Box<dyn FnOnce(Result<(), StoreFault>) + Send>;

/// A write's closure and where its result goes.
struct Write<F, T, E> {
    f: F,
    answer: tokio::sync::oneshot::Sender<Result<T, E>>,
}

impl<F, T, E> Job for Write<F, T, E>
where
    F: FnOnce(&Transaction<'_>) -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: From<StoreFault> + Send + 'static,
{
    fn run(self: Box<Self>, tx: &Transaction<'_>) -> Result<Answer, ()> {
        let Write { f, answer } = *self;
        match f(tx) {
            Ok(out) => Ok(Box::new(move |committed: Result<(), StoreFault>| {
                let _ = answer.send(committed.map(|()| out).map_err(E::from));
            })),
            Err(e) => {
                // Nothing of it is kept: its savepoint (or the batch) is rolled back.
                let _ = answer.send(Err(e));
                Err(())
            }
        }
    }

    fn fail(self: Box<Self>, fault: StoreFault) {
        let _ = self.answer.send(Err(fault.into()));
    }
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
            .field("transactions", &self.transactions.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Pool {
    pub(crate) fn new(
        writer: Connection,
        readers: Vec<Connection>,
        busy_timeout: Duration,
        file: Option<DbFile>,
    ) -> Pool {
        let readers = (!readers.is_empty()).then(|| Readers {
            idle: Mutex::new(readers),
            returned: Condvar::new(),
        });
        Pool {
            busy_timeout,
            lockout: Lockout::new(busy_timeout),
            file,
            writer: Mutex::new(writer),
            writes: Mutex::new(Writes::default()),
            readers,
            round_trips: AtomicU64::new(0),
            transactions: AtomicU64::new(0),
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

    pub(crate) fn busy_waits(&self) -> BusyWaits {
        self.lockout.counts()
    }

    /// Whether the database path still names the file opened (`dbfile`);
    /// always in memory.
    fn check_file(&self) -> Result<(), StoreFault> {
        self.file.as_ref().map_or(Ok(()), DbFile::check)
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction on the writer, on a blocking
    /// thread, with the writes queued beside it (group commit, see the module
    /// docs); answers once the transaction committed: `f`'s result, or the
    /// commit's error. When `f` fails, nothing it wrote is kept. One round trip.
    pub(crate) async fn write<T, E, F>(self: &Arc<Self>, f: F) -> Result<T, E>
    where
        F: FnOnce(&Transaction<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreFault> + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let lead = {
            let mut writes = lock(&self.writes);
            writes.queue.push(Box::new(Write { f, answer }));
            !std::mem::replace(&mut writes.leading, true)
        };
        // Counted once queued (a test waits on it).
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        if lead {
            let pool = Arc::clone(self);
            // Dropped with the runtime, the task drops the queued writes: their
            // callers learn the task failed.
            drop(tokio::task::spawn_blocking(move || pool.lead()));
        }
        match answered.await {
            Ok(out) => out,
            Err(_) => Err(StoreFault::Backend("the database task failed".into()).into()),
        }
    }

    /// Runs batches of queued writes until the queue is empty. After holding
    /// the writer back to back for [`FAIR_TURN_AFTER`], it pauses
    /// [`FAIR_PAUSE`] before the next batch, so that another instance polling
    /// for the file's write lock gets its turn.
    fn lead(&self) {
        let mut turn_started = Instant::now();
        loop {
            if turn_started.elapsed() >= FAIR_TURN_AFTER {
                std::thread::sleep(FAIR_PAUSE);
                turn_started = Instant::now();
            }
            let batch = {
                let mut writes = lock(&self.writes);
                if writes.queue.is_empty() {
                    writes.leading = false;
                    return;
                }
                std::mem::take(&mut writes.queue)
            };
            self.run_batch(batch);
        }
    }

    /// One transaction for `batch`: each write in a savepoint when there are
    /// several, one commit, then the answers. The lock is tried for the
    /// budget the lockout gives; the file is checked once the lock is held
    /// (nothing is written to a file the path no longer names) and after the
    /// commit (whose success is then not answered).
    fn run_batch(&self, mut batch: Vec<Box<dyn Job>>) {
        let conn = lock(&self.writer);
        self.transactions.fetch_add(1, Ordering::Relaxed);
        let budget = self.lockout.budget(Instant::now());
        let begun = begin_within(&conn, budget.wait(), self.busy_timeout, || {
            self.lockout.waiting();
        })
        .inspect(|_| self.lockout.got_lock())
        .map_err(|fault| self.lockout.failed(budget, Instant::now(), fault))
        .and_then(|tx| self.check_file().map(|()| tx));
        let tx = match begun {
            Ok(tx) => tx,
            Err(fault) => {
                // Dropped, a transaction begun rolls back.
                for job in batch {
                    job.fail(fault.clone());
                }
                return;
            }
        };
        if batch.len() == 1 {
            // Alone, the transaction is the write's own: a failed write drops
            // it, which rolls it back.
            if let Some(job) = batch.pop()
                && let Ok(answer) = run(job, &tx)
            {
                answer(tx.commit().db().and_then(|()| self.check_file()));
            }
            return;
        }
        let mut answers = Vec::with_capacity(batch.len());
        let mut broken: Option<StoreFault> = None;
        for job in batch {
            if let Some(fault) = &broken {
                job.fail(fault.clone());
                continue;
            }
            if let Err(fault) = savepoint(&tx, "SAVEPOINT write") {
                job.fail(fault.clone());
                broken = Some(fault);
                continue;
            }
            let ended = match run(job, &tx) {
                Ok(answer) => {
                    answers.push(answer);
                    savepoint(&tx, "RELEASE write")
                }
                Err(()) => savepoint(&tx, "ROLLBACK TO write")
                    .and_then(|()| savepoint(&tx, "RELEASE write")),
            };
            if let Err(fault) = ended {
                broken = Some(fault);
            }
        }
        let committed = match broken {
            // The transaction's state is unknown: dropping it rolls it all back.
            Some(fault) => {
                drop(tx);
                Err(fault)
            }
            None => tx.commit().db().and_then(|()| self.check_file()),
        };
        for answer in answers {
            answer(committed.clone());
        }
    }

    /// Runs `f` in a read transaction (one consistent snapshot) on a reader, on a
    /// blocking thread, once the file is found where it was opened. One round
    /// trip. Reads do not consult the lockout: in WAL mode they need no write
    /// lock.
    pub(crate) async fn read<T, E, F>(self: &Arc<Self>, f: F) -> Result<T, E>
    where
        F: FnOnce(&Transaction<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<StoreFault> + Send + 'static,
    {
        let pool = Arc::clone(self);
        pool.round_trips.fetch_add(1, Ordering::Relaxed);
        run_blocking(move || {
            pool.check_file()?;
            match &pool.readers {
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

/// Runs a savepoint statement (prepared once per connection).
fn savepoint(tx: &Transaction<'_>, sql: &str) -> Result<(), StoreFault> {
    tx.prepare_cached(sql).db()?.execute([]).db().map(drop)
}

/// Runs one queued write; a panicking write answers as a failed task (its
/// sender is dropped) and is rolled back like a failed one.
fn run(job: Box<dyn Job>, tx: &Transaction<'_>) -> Result<Answer, ()> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run(tx))).unwrap_or(Err(()))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool on an in-memory database with one table of names.
    fn pool() -> Arc<Pool> {
        let conn = Connection::open_in_memory().expect("open");
        conn.execute_batch("CREATE TABLE names (name TEXT PRIMARY KEY)")
            .expect("schema");
        Arc::new(Pool::new(conn, Vec::new(), Duration::from_secs(5), None))
    }

    /// Inserts `name`, then fails when it starts with "bad".
    async fn insert(pool: &Arc<Pool>, name: &'static str) -> Result<(), StoreFault> {
        pool.write(move |tx| {
            tx.execute("INSERT INTO names (name) VALUES (?1)", [name])
                .db()?;
            if name.starts_with("bad") {
                return Err(StoreFault::Backend(format!("{name} refused")));
            }
            if name.starts_with("panic") {
                panic!("{name}");
            }
            Ok(())
        })
        .await
    }

    fn names(pool: &Pool) -> Vec<String> {
        let conn = lock(&pool.writer);
        let mut stmt = conn
            .prepare("SELECT name FROM names ORDER BY name")
            .expect("prepare");
        stmt.query_map([], |r| r.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    // Held on purpose: the leader waits for the writer on a blocking thread.
    #[allow(clippy::await_holding_lock)]
    async fn a_batch_commits_its_good_writes_and_rolls_back_each_failed_one_alone() {
        let pool = pool();
        // Hold the writer: the first write's leader waits for it, and the rest
        // queue behind as one batch.
        let held = lock(&pool.writer);
        let names_in = ["a", "bad-b", "c", "panic-d", "e", "bad-f"];
        let tasks: Vec<_> = names_in
            .iter()
            .map(|&name| {
                let pool = Arc::clone(&pool);
                tokio::spawn(async move { (name, insert(&pool, name).await) })
            })
            .collect();
        // Every write queued (or taken by the leader, which waits for the
        // writer): the first batch is what the leader took, the rest queue
        // behind it.
        while pool.round_trips() < names_in.len() as u64 {
            tokio::task::yield_now().await;
        }
        drop(held);
        for task in tasks {
            let (name, result) = task.await.expect("task");
            match name.split('-').next() {
                Some("bad") => {
                    assert_eq!(result, Err(StoreFault::Backend(format!("{name} refused"))))
                }
                Some("panic") => assert!(
                    matches!(&result, Err(StoreFault::Backend(m)) if m.contains("task failed")),
                    "{result:?}"
                ),
                _ => assert_eq!(result, Ok(()), "{name}"),
            }
        }
        // What a failed or panicking write inserted is gone; the rest is kept.
        assert_eq!(names(&pool), ["a", "c", "e"]);
        // Six writes, two transactions at most: what the leader took first, the
        // rest.
        let transactions = pool.transactions.load(Ordering::Relaxed);
        assert!((1..=2).contains(&transactions), "{transactions}");
        // The pool goes on: the leader stepped down and a new write leads.
        insert(&pool, "g").await.expect("a later write");
        assert_eq!(names(&pool), ["a", "c", "e", "g"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_alone_that_fails_keeps_nothing() {
        let pool = pool();
        let err = insert(&pool, "bad").await.expect_err("refused");
        assert_eq!(err, StoreFault::Backend("bad refused".into()));
        insert(&pool, "good").await.expect("written");
        assert_eq!(names(&pool), ["good"]);
    }
}
