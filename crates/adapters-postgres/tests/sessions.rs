//! Sessions that fail or are cancelled inside a transaction never reach another
//! caller: after a line wait that times out under contention, a read-and-claim
//! dropped while it waits for its line, and `pg_cancel_backend` of a waiting
//! session, on every lock strategy:
//!
//! - no holdfast session is left `idle in transaction` (read from
//!   `pg_stat_activity`, polled until the closed session is gone);
//! - a pool of one connection serves the next 100 calls;
//! - every claim answered Won is on the server (lock row and selection, read from
//!   another connection), and no token was answered Won to two consumers.
//!
//! Each test gets a fresh database (see `support`).

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use holdfast_adapters_postgres::{LockStrategy, PgBackend, PgOptions, claim_line_key};
use holdfast_domain::{Candidate, ClaimVerdict, TokenId, TxId};
use holdfast_ports::conformance::support::{T0, add, chf, token_type, tx, wallet};
use holdfast_ports::{CandidateQuery, CandidateRead, LockStore, LockStoreError, StoreFault};
use sqlx::{Connection, PgConnection};
use support::TestDb;

const STRATEGIES: [LockStrategy; 3] = [
    LockStrategy::Insert,
    LockStrategy::OnConflict,
    LockStrategy::SkipLocked,
];

/// A backend of `db` with a pool of `connections` and the given waits.
async fn backend(
    db: &TestDb,
    strategy: LockStrategy,
    connections: u32,
    line_wait: Duration,
    lock_timeout: Duration,
) -> PgBackend {
    PgBackend::connect(
        &db.url,
        PgOptions {
            strategy,
            max_connections: connections,
            line_wait,
            lock_timeout,
            // Far beyond every poll below: the server's own clean-up must not be
            // what makes these tests pass.
            idle_in_transaction_timeout: Duration::from_secs(600),
            wakeups: false,
            ..PgOptions::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("connect to {}: {e}", db.name))
}

/// The first page of wallet `w`, CHF, up to 64 candidates.
fn read_w() -> CandidateRead {
    CandidateRead::Page(CandidateQuery {
        wallet: wallet("w"),
        token_type: token_type("CHF"),
        after: None,
        limit: 64,
    })
}

/// A chooser taking the candidate at `pick` modulo the page (nothing of an empty page).
fn pick(pick: usize) -> holdfast_ports::Chooser {
    Box::new(move |page: &[Candidate]| {
        page.get(pick % page.len().max(1))
            .map(|c| vec![c.id.clone()])
            .unwrap_or_default()
    })
}

/// Sessions of this database in `state`.
async fn sessions_in(observer: &mut PgConnection, state: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'holdfast' AND state = $1",
    )
    .bind(state)
    .fetch_one(&mut *observer)
    .await
    .expect("pg_stat_activity")
}

/// Polls the server until no holdfast session of this database is idle in a
/// transaction (a closed session disappears once its backend notices); fails
/// after 10 s.
async fn no_session_idle_in_transaction(observer: &mut PgConnection, what: &str) {
    for _ in 0..1_000 {
        if sessions_in(observer, "idle in transaction").await == 0
            && sessions_in(observer, "idle in transaction (aborted)").await == 0
        {
            return;
        }
        // sleep: poll interval; the loop waits on the server's view of the
        // sessions, bounded by its 1,000 rounds.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: a holdfast session stayed idle in a transaction");
}

/// The pid of the holdfast session waiting for an advisory lock, once there is one.
async fn waiting_for_line(observer: &mut PgConnection) -> i32 {
    for _ in 0..100_000 {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'holdfast'
               AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
        )
        .fetch_optional(&mut *observer)
        .await
        .expect("pg_stat_activity");
        if let Some(pid) = pid {
            return pid;
        }
        tokio::task::yield_now().await;
    }
    panic!("the read-and-claim never waited for its line");
}

/// Whether `consumer` holds `token` on the server: its lock row and its selection.
async fn on_server(observer: &mut PgConnection, consumer: &TxId, token: &TokenId) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM token_locks WHERE tx_id = $1 AND idx = $2 AND consumer = $3)
            AND EXISTS (SELECT 1 FROM selections WHERE tx_id = $1 AND idx = $2 AND consumer = $3)",
    )
    .bind(token.tx.as_str())
    .bind(i64::from(token.index))
    .bind(consumer.as_str())
    .fetch_one(&mut *observer)
    .await
    .expect("read the lock row")
}

/// Every Won answer is on the server, and no token was answered Won to two
/// consumers.
async fn every_won_is_stored(observer: &mut PgConnection, won: &[(TxId, TokenId)], what: &str) {
    let mut holders: BTreeMap<&TokenId, &TxId> = BTreeMap::new();
    for (consumer, token) in won {
        if let Some(other) = holders.insert(token, consumer) {
            panic!("{what}: {token} was answered Won to {other} and to {consumer}");
        }
        assert!(
            on_server(observer, consumer, token).await,
            "{what}: {consumer} was answered Won for {token}, but the server has no such lock"
        );
    }
}

/// A pool of one connection serves 100 read-and-claims (each claims one more
/// token), and each Won is on the server.
async fn serves_a_hundred_calls(b: &PgBackend, observer: &mut PgConnection, what: &str) {
    let mut won = Vec::new();
    for i in 0..100 {
        let consumer = tx(&format!("after-{i}"));
        let answer = b
            .read_and_claim(&consumer, &read_w(), T0, pick(0))
            .await
            .unwrap_or_else(|e| panic!("{what}: call {i} after the fault failed: {e}"))
            .expect("PostgreSQL reads and claims");
        let [(token, verdict)] = answer.verdicts.as_slice() else {
            panic!("{what}: call {i} claimed {:?}", answer.verdicts);
        };
        assert_eq!(*verdict, ClaimVerdict::Won, "{what}: call {i}");
        won.push((consumer, token.clone()));
    }
    every_won_is_stored(observer, &won, what).await;
}

/// Adds 1,024 tokens of 1 to wallet `w`: more than every test claims.
async fn fund(b: &PgBackend) {
    let tokens: Vec<_> = (0..1024).map(|i| chf("w", "fund", i, 1)).collect();
    add(&b.stores(), &tokens).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_waits_that_time_out_under_contention_leave_no_session_in_a_transaction() {
    const TEST: &str = "sessions::line_waits_that_time_out_under_contention";
    for strategy in STRATEGIES {
        let Some(db) = TestDb::create(TEST).await else {
            return;
        };
        let what = format!("{TEST} ({strategy})");
        let mut observer = db.connection().await;
        // Database-wide (as role-level ones would be) timeouts of a few ms, other
        // than holdfast's: its own session settings (and the migration's) take
        // precedence, also after the line wait restores the session's
        // lock_timeout, so they break nothing.
        for setting in ["lock_timeout = '2ms'", "statement_timeout = '3ms'"] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "ALTER DATABASE \"{}\" SET {setting}",
                db.name
            )))
            .execute(&mut observer)
            .await
            .expect("ALTER DATABASE");
        }
        // Four replicas of one connection each; the line wait and row-lock waits
        // bounded at a few ms, so under contention they run out again and again.
        let mut replicas = Vec::new();
        for _ in 0..4 {
            replicas.push(Arc::new(
                backend(
                    &db,
                    strategy,
                    1,
                    Duration::from_millis(1),
                    Duration::from_millis(5),
                )
                .await,
            ));
        }
        fund(&replicas[0]).await;
        let mut calls = Vec::new();
        for (r, replica) in replicas.iter().enumerate() {
            for caller in 0..6 {
                let replica = replica.clone();
                calls.push(tokio::spawn(async move {
                    let mut won = Vec::new();
                    let mut faults = 0;
                    for i in 0..20 {
                        let consumer = tx(&format!("r{r}-c{caller}-{i}"));
                        match replica
                            .read_and_claim(&consumer, &read_w(), T0, pick(i))
                            .await
                        {
                            Ok(Some(answer)) => won.extend(
                                answer
                                    .verdicts
                                    .into_iter()
                                    .filter(|(_, v)| *v == ClaimVerdict::Won)
                                    .map(|(token, _)| (consumer.clone(), token)),
                            ),
                            Ok(None) => panic!("PostgreSQL reads and claims"),
                            // A row-lock wait that ran out: a typed fault, never a
                            // poisoned connection.
                            Err(LockStoreError::Fault(StoreFault::Busy(_))) => faults += 1,
                            Err(e) => panic!("unexpected error: {e}"),
                        }
                    }
                    (won, faults)
                }));
            }
        }
        let mut won = Vec::new();
        for call in calls {
            let (w, _) = call.await.expect("caller task");
            won.extend(w);
        }
        let busy: u64 = replicas.iter().map(|r| r.lines_busy()).sum();
        assert!(
            busy > 0,
            "{what}: no line wait ran out; the test shows nothing"
        );
        no_session_idle_in_transaction(&mut observer, &what).await;
        every_won_is_stored(&mut observer, &won, &what).await;
        for replica in &replicas {
            serves_a_hundred_calls(replica, &mut observer, &what).await;
        }
        for replica in &replicas {
            replica.close().await;
        }
        let _ = observer.close().await;
    }
}

/// What interrupts a read-and-claim waiting for its line.
#[derive(Debug, Clone, Copy)]
enum Interrupt {
    /// The caller drops the future.
    Cancel,
    /// An operator runs `pg_cancel_backend` on its session.
    ServerCancel,
    /// The line's holder keeps it beyond the bound: it reads and claims apart.
    Bound,
}

async fn interrupted_line_wait(interrupt: Interrupt, test: &str) {
    for strategy in STRATEGIES {
        let Some(db) = TestDb::create(test).await else {
            return;
        };
        let what = format!("{test} ({strategy})");
        let mut observer = db.connection().await;
        let line_wait = match interrupt {
            Interrupt::Bound => Duration::from_millis(50),
            Interrupt::Cancel | Interrupt::ServerCancel => Duration::from_secs(20),
        };
        let b = Arc::new(backend(&db, strategy, 1, line_wait, Duration::from_secs(1)).await);
        fund(&b).await;
        // Another session holds the line.
        let mut holder = db.connection().await;
        let (space, key) = claim_line_key(&wallet("w"), &token_type("CHF"));
        sqlx::query("SELECT pg_advisory_lock($1, $2)")
            .bind(space)
            .bind(key)
            .execute(&mut holder)
            .await
            .expect("hold the line");
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move {
                b.read_and_claim(&tx("waiter"), &read_w(), T0, pick(0))
                    .await
            })
        };
        let pid = waiting_for_line(&mut observer).await;
        let mut won = Vec::new();
        match interrupt {
            Interrupt::Cancel => {
                waiter.abort();
                assert!(waiter.await.is_err_and(|e| e.is_cancelled()), "{what}");
            }
            Interrupt::ServerCancel => {
                let cancelled: bool = sqlx::query_scalar("SELECT pg_cancel_backend($1)")
                    .bind(pid)
                    .fetch_one(&mut observer)
                    .await
                    .expect("pg_cancel_backend");
                assert!(cancelled, "{what}");
                let answer = waiter.await.expect("waiter task");
                assert!(
                    matches!(answer, Err(LockStoreError::Fault(_))),
                    "{what}: {answer:?}"
                );
            }
            Interrupt::Bound => {
                let answer = waiter
                    .await
                    .expect("waiter task")
                    .expect("read and claimed apart")
                    .expect("PostgreSQL reads and claims");
                assert_eq!(answer.verdicts.len(), 1, "{what}");
                assert_eq!(answer.verdicts[0].1, ClaimVerdict::Won, "{what}");
                assert_eq!(b.lines_busy(), 1, "{what}");
                won.push((tx("waiter"), answer.verdicts[0].0.clone()));
            }
        }
        // The holder lets go: a closed waiter's backend gets the lock, finds its
        // client gone and ends, rolling back.
        sqlx::query("SELECT pg_advisory_unlock_all()")
            .execute(&mut holder)
            .await
            .expect("release the line");
        no_session_idle_in_transaction(&mut observer, &what).await;
        every_won_is_stored(&mut observer, &won, &what).await;
        serves_a_hundred_calls(&b, &mut observer, &what).await;
        // Nothing the interrupted call did survives it.
        if !matches!(interrupt, Interrupt::Bound) {
            let held: i64 =
                sqlx::query_scalar("SELECT count(*) FROM token_locks WHERE consumer = 'waiter'")
                    .fetch_one(&mut observer)
                    .await
                    .expect("count");
            assert_eq!(held, 0, "{what}");
        }
        b.close().await;
        let _ = holder.close().await;
        let _ = observer.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_and_claim_dropped_while_it_waits_for_its_line_closes_its_connection() {
    interrupted_line_wait(
        Interrupt::Cancel,
        "sessions::a_read_and_claim_dropped_while_it_waits",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_cancel_backend_of_a_waiting_read_and_claim_is_a_fault_and_the_pool_stays_clean() {
    interrupted_line_wait(
        Interrupt::ServerCancel,
        "sessions::pg_cancel_backend_of_a_waiting_read_and_claim",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_held_beyond_the_bound_is_read_and_claimed_apart() {
    interrupted_line_wait(Interrupt::Bound, "sessions::a_line_held_beyond_the_bound").await;
}
