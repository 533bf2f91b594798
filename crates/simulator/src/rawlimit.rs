//! The physical limit: a minimal select cycle written by hand against the database
//! driver (rusqlite on SQLite, sqlx on PostgreSQL), with none of holdfast's ports,
//! adapters or selection logic, run at the workload's concurrency and replicas on a
//! fresh database of the same type for a fixed wall time. Holdfast's successful
//! selects per second are reported as a fraction of these cycles per second.
//!
//! The database is made by [`Backend::open`] (so holdfast's migrations give the
//! real schema) and seeded with [`runner::seed_wallets`]; the backend is then
//! closed and the cycle talks to the tables directly. One cycle, for the next
//! request of the run's plan (its wallet, type and mode):
//!
//! 1. read: the first [`PAGE`] candidates of the wallet and type, the same indexed
//!    read holdfast makes (spendable, unspent, no row in the locks table, ordered
//!    by amount);
//! 2. claim: insert the lock row of one candidate, on condition that the token is
//!    still spendable and unspent; a lost race tries the next candidate (each
//!    worker starts at a different one), and when every candidate is lost the
//!    cycle starts again with a fresh read;
//! 3. settle, in one transaction: `settle` requests spend (mark the token spent by
//!    the cycle's consumer, delete its lock, record the status `confirmed`, and
//!    add the spent amount back to the wallet as the consumer's output 0, so the
//!    wallet does not drain over the timed run); `unlock` and `hold` requests
//!    release (delete the lock, record the status `deleted`).
//!
//! A cycle claims one token whatever the request's amount, writes no `selections`
//! row and never backs off: it is less work than any select holdfast makes, which
//! is what a limit should be.
//!
//! SQLite: each replica has one writer connection shared by its workers behind a
//! mutex (as holdfast's adapter has), every write is a `BEGIN IMMEDIATE`
//! transaction, each worker reads on its own read-only connection, with the
//! adapter's pragmas and its way of waiting for the write lock
//! (`begin_immediate`; busy timeout, `synchronous = FULL`, `foreign_keys`; the file
//! is already in WAL mode), and each worker runs on a blocking thread.
//! PostgreSQL: one pool per replica, sized as holdfast's; the claim is one
//! statement that share-locks the token row (as holdfast's `insert` strategy does),
//! the settlement a transaction that locks the token row before the lock row.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use holdfast_adapters_postgres::scrub_password;
use holdfast_adapters_sqlite::begin_immediate;
use rusqlite::{Connection, OpenFlags, params};
use serde::Serialize;
use sqlx::postgres::{PgPool, PgPoolOptions};

use super::SimulateError;
use super::figures::{round3, to_f64};
use super::provision::{FreshDb, Provisioner};
use super::runner::{self, Progress, RunSettings};
use super::workload::{RequestMode, Workload};
use holdfast::backend::{Backend, BackendKind};

/// How long the cycles run when the caller does not say (the bench's duration).
pub const DEFAULT_DURATION: Duration = Duration::from_secs(3);

/// Candidates per read: a small page, enough for the workers to spread over.
pub const PAGE: usize = 8;

/// The one instant every lock, status and spend of the cycles carries
/// (2023-11-14T22:13:20Z); no sweep runs, so time does not matter.
const AT_MILLIS: i64 = 1_700_000_000_000;
/// [`AT_MILLIS`] in the SQLite adapter's stored text form.
const AT_TEXT: &str = "2023-11-14T22:13:20.000Z";

/// What the raw select cycle achieved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RawLimit {
    /// Cycles completed (read, claim, settle).
    pub cycles: u64,
    /// Wall time of the cycles, in seconds.
    pub wall_seconds: f64,
    /// Cycles per wall second.
    pub cycles_per_second: f64,
    /// SQL statements sent per completed cycle (`BEGIN` and `COMMIT` not counted),
    /// reads that found nothing and lost claims included.
    pub statements_per_cycle: f64,
    /// Claims that lost the race for a token (another worker held its lock).
    pub claims_lost: u64,
    /// Reads that found no unlocked candidate.
    pub empty_reads: u64,
    /// Lock rows left after the run (0 unless the cycle is broken).
    pub locks_left: u64,
    /// holdfast's successful selects per second divided by the cycles per second.
    pub fraction_of_raw_limit: Option<f64>,
}

/// One request of the plan, as the cycle needs it.
#[derive(Debug)]
struct Job {
    wallet: String,
    token_type: String,
    spend: bool,
}

/// A candidate row: the token's key and its amount in the stored form.
#[derive(Debug)]
struct Candidate {
    tx: String,
    output: i64,
    amount: String,
}

/// What every worker shares: the plan, where it is, the deadline and the counts.
#[derive(Debug)]
struct Shared {
    jobs: Vec<Job>,
    next: AtomicUsize,
    deadline: Instant,
    cycles: AtomicU64,
    statements: AtomicU64,
    claims_lost: AtomicU64,
    empty_reads: AtomicU64,
    progress: Progress,
}

impl Shared {
    fn job(&self) -> &Job {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        &self.jobs[i % self.jobs.len()]
    }

    fn count(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

fn raw(e: impl std::fmt::Display) -> SimulateError {
    SimulateError::RawLimit(e.to_string())
}

/// Runs the raw select cycle for `workload` on a fresh database for `duration`.
pub async fn run(
    workload: &Workload,
    settings: &RunSettings,
    provisioner: &Provisioner,
    duration: Duration,
) -> Result<RawLimit, SimulateError> {
    let db = provisioner
        .create("raw")
        .await
        .map_err(SimulateError::Provision)?;
    let result = run_on(workload, settings, provisioner, &db, duration).await;
    let removed = provisioner.remove(&db).await;
    let limit = result?;
    removed.map_err(SimulateError::Provision)?;
    Ok(limit)
}

async fn run_on(
    workload: &Workload,
    settings: &RunSettings,
    provisioner: &Provisioner,
    db: &FreshDb,
    duration: Duration,
) -> Result<RawLimit, SimulateError> {
    let (kind, url) = (provisioner.kind(), db.url.as_str());
    let options = settings.config.backend_options();
    let backend = Backend::open(url, &options)
        .await
        .map_err(SimulateError::Open)?;
    let seeding = Progress::new(
        Some(workload.token_count()),
        "raw limit: seeding",
        settings.progress,
    );
    let seeded = runner::seed_wallets(
        backend.stores().tokens.as_ref(),
        workload,
        settings.seed,
        &seeding,
        None,
    )
    .await;
    backend.close().await;
    seeding.finish();
    if seeded? == 0 {
        return Err(SimulateError::internal(
            "the raw limit needs at least one token",
        ));
    }
    provisioner
        .analyze(db)
        .await
        .map_err(SimulateError::Provision)?;
    let jobs: Vec<Job> = runner::plan(workload, settings.seed)
        .into_iter()
        .map(|r| Job {
            wallet: r.wallet.as_str().to_owned(),
            token_type: r.token_type.as_str().to_owned(),
            spend: r.mode == RequestMode::Settle,
        })
        .collect();
    if jobs.is_empty() {
        return Err(SimulateError::internal(
            "the raw limit needs at least one request",
        ));
    }
    let progress = Progress::new(None, "raw limit", settings.progress);
    let started = Instant::now();
    let shared = Arc::new(Shared {
        jobs,
        next: AtomicUsize::new(0),
        deadline: started + duration,
        cycles: AtomicU64::new(0),
        statements: AtomicU64::new(0),
        claims_lost: AtomicU64::new(0),
        empty_reads: AtomicU64::new(0),
        progress: progress.clone(),
    });
    let locks_left = match kind {
        BackendKind::Sqlite => sqlite::drive(workload, &options, url, &shared).await?,
        BackendKind::Postgres => postgres::drive(workload, &options, url, &shared).await?,
    };
    let wall = started.elapsed().as_secs_f64();
    progress.finish();
    let cycles = shared.cycles.load(Ordering::Relaxed);
    let per = |n: u64| {
        if cycles > 0 {
            round3(to_f64(n) / to_f64(cycles))
        } else {
            0.0
        }
    };
    Ok(RawLimit {
        cycles,
        wall_seconds: round3(wall),
        cycles_per_second: if wall > 0.0 {
            round3(to_f64(cycles) / wall)
        } else {
            0.0
        },
        statements_per_cycle: per(shared.statements.load(Ordering::Relaxed)),
        claims_lost: shared.claims_lost.load(Ordering::Relaxed),
        empty_reads: shared.empty_reads.load(Ordering::Relaxed),
        locks_left,
        fraction_of_raw_limit: None,
    })
}

/// The cycle on SQLite through rusqlite.
mod sqlite {
    use super::*;

    const CANDIDATES: &str = "\
SELECT t.tx, t.output, t.amount FROM tokens AS t
WHERE t.wallet = ?1 AND t.token_type = ?2 AND t.spendable = 1 AND t.spent_by IS NULL
  AND NOT EXISTS (SELECT 1 FROM locks AS l WHERE l.tx = t.tx AND l.output = t.output)
ORDER BY t.amount, t.tx, t.output
LIMIT +?3";

    const CLAIM: &str = "\
INSERT INTO locks (tx, output, consumer, created_at)
SELECT t.tx, t.output, ?3, ?4 FROM tokens AS t
WHERE t.tx = ?1 AND t.output = ?2 AND t.spendable = 1 AND t.spent_by IS NULL
ON CONFLICT (tx, output) DO NOTHING";

    const SPEND: &str = "\
UPDATE tokens SET spent_by = ?1, spent_at = ?2
WHERE tx = ?3 AND output = ?4 AND spent_by IS NULL";

    const RELEASE: &str = "DELETE FROM locks WHERE consumer = ?1";

    const RECORD: &str = "\
INSERT INTO tx_statuses (tx, status, recorded_at) VALUES (?1, ?2, ?3)
ON CONFLICT (tx) DO UPDATE SET status = excluded.status, recorded_at = excluded.recorded_at";

    const MINT: &str = "\
INSERT INTO tokens (tx, output, wallet, token_type, amount, spendable)
VALUES (?1, 0, ?2, ?3, ?4, 1)";

    /// Opens a connection configured as the SQLite adapter configures its own.
    fn open(url: &str, busy: Duration, read_only: bool) -> Result<Connection, SimulateError> {
        let path = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .unwrap_or(url);
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(raw)?;
        conn.busy_timeout(busy).map_err(raw)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(raw)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(raw)?;
        if read_only {
            conn.pragma_update(None, "query_only", "ON").map_err(raw)?;
        }
        Ok(conn)
    }

    /// Runs the workers; returns the lock rows left.
    pub(super) async fn drive(
        workload: &Workload,
        options: &holdfast::backend::BackendOptions,
        url: &str,
        shared: &Arc<Shared>,
    ) -> Result<u64, SimulateError> {
        let busy = options.sqlite.busy_timeout;
        let mut writers = Vec::new();
        for _ in 0..workload.replicas {
            writers.push(Arc::new(Mutex::new(open(url, busy, false)?)));
        }
        let mut tasks = tokio::task::JoinSet::new();
        for worker in 0..workload.concurrency {
            let writer = writers[worker % writers.len()].clone();
            let reader = open(url, busy, true)?;
            let shared = shared.clone();
            tasks.spawn_blocking(move || work(worker, &reader, &writer, busy, &shared));
        }
        while let Some(joined) = tasks.join_next().await {
            joined.map_err(|e| SimulateError::Task(e.to_string()))??;
        }
        let conn = open(url, busy, true)?;
        let left: i64 = conn
            .query_row("SELECT COUNT(*) FROM locks", [], |r| r.get(0))
            .map_err(raw)?;
        Ok(u64::try_from(left).unwrap_or(0))
    }

    /// One worker's cycles, on a blocking thread: at least one attempt, then until
    /// the deadline.
    fn work(
        worker: usize,
        reader: &Connection,
        writer: &Mutex<Connection>,
        busy: Duration,
        shared: &Shared,
    ) -> Result<(), SimulateError> {
        let page = i64::try_from(PAGE).unwrap_or(i64::MAX);
        let mut attempt = 0u64;
        loop {
            let job = shared.job();
            let consumer = format!("raw-{worker}-{attempt}");
            attempt += 1;
            let candidates = reader
                .prepare_cached(CANDIDATES)
                .map_err(raw)?
                .query_map(params![job.wallet, job.token_type, page], |r| {
                    Ok(Candidate {
                        tx: r.get(0)?,
                        output: r.get(1)?,
                        amount: r.get(2)?,
                    })
                })
                .map_err(raw)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(raw)?;
            shared.count(&shared.statements, 1);
            if candidates.is_empty() {
                shared.count(&shared.empty_reads, 1);
            }
            let mut won = None;
            for k in 0..candidates.len() {
                let c = &candidates[(worker + k) % candidates.len()];
                let conn = writer.lock().unwrap_or_else(PoisonError::into_inner);
                let tx = begin_immediate(&conn, busy).map_err(raw)?;
                let n = tx
                    .prepare_cached(CLAIM)
                    .map_err(raw)?
                    .execute(params![c.tx, c.output, consumer, AT_TEXT])
                    .map_err(raw)?;
                tx.commit().map_err(raw)?;
                shared.count(&shared.statements, 1);
                if n == 1 {
                    won = Some(c);
                    break;
                }
                shared.count(&shared.claims_lost, 1);
            }
            if let Some(c) = won {
                let conn = writer.lock().unwrap_or_else(PoisonError::into_inner);
                let tx = begin_immediate(&conn, busy).map_err(raw)?;
                if job.spend {
                    let n = tx
                        .prepare_cached(SPEND)
                        .map_err(raw)?
                        .execute(params![consumer, AT_TEXT, c.tx, c.output])
                        .map_err(raw)?;
                    if n != 1 {
                        return Err(raw(format!(
                            "token {}:{} was spent while {consumer} held its lock",
                            c.tx, c.output
                        )));
                    }
                }
                tx.prepare_cached(RELEASE)
                    .map_err(raw)?
                    .execute([&consumer])
                    .map_err(raw)?;
                let status = if job.spend { "confirmed" } else { "deleted" };
                tx.prepare_cached(RECORD)
                    .map_err(raw)?
                    .execute(params![consumer, status, AT_TEXT])
                    .map_err(raw)?;
                if job.spend {
                    tx.prepare_cached(MINT)
                        .map_err(raw)?
                        .execute(params![consumer, job.wallet, job.token_type, c.amount])
                        .map_err(raw)?;
                }
                tx.commit().map_err(raw)?;
                shared.count(&shared.statements, if job.spend { 4 } else { 2 });
                shared.count(&shared.cycles, 1);
                shared.progress.inc(1);
            }
            if Instant::now() >= shared.deadline {
                return Ok(());
            }
        }
    }
}

/// The cycle on PostgreSQL through sqlx.
mod postgres {
    use super::*;

    const CANDIDATES: &str = "
        SELECT t.tx_id, t.idx, t.amount::text
        FROM tokens t
        WHERE t.wallet = $1 AND t.token_type = $2 AND t.spendable AND t.spent_by IS NULL
          AND NOT EXISTS (SELECT 1 FROM token_locks l WHERE l.tx_id = t.tx_id AND l.idx = t.idx)
        ORDER BY t.amount, t.tx_id, t.idx
        LIMIT $3";

    const CLAIM: &str = "
        INSERT INTO token_locks (tx_id, idx, consumer, created_at)
        SELECT t.tx_id, t.idx, $3, TIMESTAMPTZ 'epoch' + $4::bigint * INTERVAL '1 millisecond'
        FROM tokens t
        WHERE t.tx_id = $1 AND t.idx = $2 AND t.spendable AND t.spent_by IS NULL
        FOR SHARE OF t
        ON CONFLICT (tx_id, idx) DO NOTHING";

    const SPEND: &str = "
        UPDATE tokens
        SET spent_by = $1, spent_at = TIMESTAMPTZ 'epoch' + $2::bigint * INTERVAL '1 millisecond'
        WHERE tx_id = $3 AND idx = $4 AND spent_by IS NULL";

    const RELEASE: &str = "DELETE FROM token_locks WHERE consumer = $1";

    const RECORD: &str = "
        INSERT INTO tx_statuses (tx_id, status, recorded_at)
        VALUES ($1, $2, TIMESTAMPTZ 'epoch' + $3::bigint * INTERVAL '1 millisecond')
        ON CONFLICT (tx_id) DO UPDATE
        SET status = EXCLUDED.status, recorded_at = EXCLUDED.recorded_at";

    const MINT: &str = "
        INSERT INTO tokens (tx_id, idx, wallet, token_type, amount, spendable)
        VALUES ($1, 0, $2, $3, $4::numeric, TRUE)";

    /// Runs the workers; returns the lock rows left.
    pub(super) async fn drive(
        workload: &Workload,
        options: &holdfast::backend::BackendOptions,
        url: &str,
        shared: &Arc<Shared>,
    ) -> Result<u64, SimulateError> {
        let mut pools = Vec::new();
        for _ in 0..workload.replicas {
            pools.push(
                PgPoolOptions::new()
                    .max_connections(options.postgres.max_connections)
                    .acquire_timeout(options.connect_timeout)
                    .test_before_acquire(false)
                    .connect(url)
                    .await
                    .map_err(|e| raw(scrub_password(&e.to_string(), url)))?,
            );
        }
        let mut tasks = tokio::task::JoinSet::new();
        for worker in 0..workload.concurrency {
            let pool = pools[worker % pools.len()].clone();
            let shared = shared.clone();
            tasks.spawn(async move { work(worker, &pool, &shared).await });
        }
        let mut outcome = Ok(());
        while let Some(joined) = tasks.join_next().await {
            let result = joined
                .map_err(|e| SimulateError::Task(e.to_string()))
                .and_then(|r| r);
            if outcome.is_ok() {
                outcome = result;
            }
        }
        let left = match &outcome {
            Ok(()) => sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM token_locks")
                .fetch_one(&pools[0])
                .await
                .map_err(raw),
            Err(_) => Ok(0),
        };
        for pool in &pools {
            pool.close().await;
        }
        outcome?;
        Ok(u64::try_from(left?).unwrap_or(0))
    }

    /// One worker's cycles: at least one attempt, then until the deadline.
    async fn work(worker: usize, pool: &PgPool, shared: &Shared) -> Result<(), SimulateError> {
        let page = i64::try_from(PAGE).unwrap_or(i64::MAX);
        let mut attempt = 0u64;
        loop {
            let job = shared.job();
            let consumer = format!("raw-{worker}-{attempt}");
            attempt += 1;
            let candidates: Vec<Candidate> = sqlx::query_as::<_, (String, i64, String)>(CANDIDATES)
                .bind(&job.wallet)
                .bind(&job.token_type)
                .bind(page)
                .fetch_all(pool)
                .await
                .map_err(raw)?
                .into_iter()
                .map(|(tx, output, amount)| Candidate { tx, output, amount })
                .collect();
            shared.count(&shared.statements, 1);
            if candidates.is_empty() {
                shared.count(&shared.empty_reads, 1);
            }
            let mut won = None;
            for k in 0..candidates.len() {
                let c = &candidates[(worker + k) % candidates.len()];
                let n = sqlx::query(CLAIM)
                    .bind(&c.tx)
                    .bind(c.output)
                    .bind(&consumer)
                    .bind(AT_MILLIS)
                    .execute(pool)
                    .await
                    .map_err(raw)?
                    .rows_affected();
                shared.count(&shared.statements, 1);
                if n == 1 {
                    won = Some(c);
                    break;
                }
                shared.count(&shared.claims_lost, 1);
            }
            if let Some(c) = won {
                // The token row is locked (by the spend) before the lock row is
                // deleted, the order a claimer takes them in.
                let mut tx = pool.begin().await.map_err(raw)?;
                if job.spend {
                    let n = sqlx::query(SPEND)
                        .bind(&consumer)
                        .bind(AT_MILLIS)
                        .bind(&c.tx)
                        .bind(c.output)
                        .execute(&mut *tx)
                        .await
                        .map_err(raw)?
                        .rows_affected();
                    if n != 1 {
                        return Err(raw(format!(
                            "token {}:{} was spent while {consumer} held its lock",
                            c.tx, c.output
                        )));
                    }
                }
                sqlx::query(RELEASE)
                    .bind(&consumer)
                    .execute(&mut *tx)
                    .await
                    .map_err(raw)?;
                sqlx::query(RECORD)
                    .bind(&consumer)
                    .bind(if job.spend { "confirmed" } else { "deleted" })
                    .bind(AT_MILLIS)
                    .execute(&mut *tx)
                    .await
                    .map_err(raw)?;
                if job.spend {
                    sqlx::query(MINT)
                        .bind(&consumer)
                        .bind(&job.wallet)
                        .bind(&job.token_type)
                        .bind(&c.amount)
                        .execute(&mut *tx)
                        .await
                        .map_err(raw)?;
                }
                tx.commit().await.map_err(raw)?;
                shared.count(&shared.statements, if job.spend { 4 } else { 2 });
                shared.count(&shared.cycles, 1);
                shared.progress.inc(1);
            }
            if Instant::now() >= shared.deadline {
                return Ok(());
            }
        }
    }
}
