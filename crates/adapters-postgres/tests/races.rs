//! Claims racing settlement and release, against a real server: a claim never wins
//! a token spent under it, a claim waiting for a release wins once it commits, and
//! a storm of claims, spends and releases under all three strategies double-spends
//! nothing and never deadlocks.
//!
//! The races are made deterministic by holding the other side's transaction open on
//! a plain connection and waiting until the server reports the claim waiting on a
//! lock (polled on `pg_stat_activity`, not timed) before committing it.

use crate::support;

use std::collections::BTreeSet;
use std::sync::Arc;

use holdfast_adapters_postgres::{LockStrategy, PgBackend, RELEASE_CONSUMER, SPEND};
use holdfast_domain::{ClaimVerdict, TokenId, TxId};
use holdfast_ports::conformance::support::{T0, add, at, chf, token_id, tx};
use holdfast_ports::{LockStoreError, Stores};
use sqlx::{PgConnection, Row};
use support::{TestDb, exec};
use tokio::sync::Barrier;
use tokio::task::JoinHandle;

/// How the racing claim asks for the token.
#[derive(Debug, Clone, Copy)]
enum Path {
    /// `claim` of the token alone.
    Single,
    /// `claim_window` of the token and a free one after it.
    Window,
}

/// What the settling transaction has done when the claim starts.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Only [`SELECTED_ROWS_FOR_UPDATE`] (the first step of the settlement): the
    /// token rows are locked, nothing is deleted yet.
    Locked,
    /// The whole settlement ([`SPEND`]): lock row deleted, token marked spent, not
    /// committed.
    Spent,
}

type Claim = JoinHandle<Result<Vec<(TokenId, ClaimVerdict)>, LockStoreError>>;

/// Starts the racing claim of `x` (and of the free `free`, on the window path).
fn start_claim(s: &Stores, path: Path, consumer: TxId, x: TokenId, free: TokenId) -> Claim {
    let s = s.clone();
    tokio::spawn(async move {
        match path {
            Path::Single => s
                .locks
                .claim(&consumer, &x, at(1))
                .await
                .map(|v| vec![(x, v)]),
            Path::Window => s.locks.claim_window(&consumer, &[x, free], at(1)).await,
        }
    })
}

/// The first step of the settlement function: the token rows `consumer` selected,
/// locked `FOR UPDATE` in key order.
const SELECTED_ROWS_FOR_UPDATE: &str = "
    SELECT t.tx_id, t.idx FROM selections s
    JOIN tokens t ON t.tx_id = s.tx_id AND t.idx = s.idx
    WHERE s.consumer = $1
    ORDER BY t.tx_id, t.idx
    FOR UPDATE OF t";

/// The settlement's first step for `consumer` on `conn`, inside the transaction
/// the caller opened.
async fn spend_lock(conn: &mut PgConnection, consumer: &str) -> Vec<(String, i64)> {
    sqlx::query(SELECTED_ROWS_FOR_UPDATE)
        .bind(consumer)
        .fetch_all(&mut *conn)
        .await
        .expect("lock the selected rows")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// The whole settlement of `consumer` as the adapter sends it, inside the
/// transaction the caller opened.
async fn spend_locked(conn: &mut PgConnection, consumer: &str, locked: &[(String, i64)]) {
    let spent = sqlx::query(SPEND)
        .bind(consumer)
        .bind(1_i64)
        .bind(true)
        .fetch_all(&mut *conn)
        .await
        .expect("SPEND");
    assert_eq!(spent.len(), locked.len(), "everything locked is spent");
}

/// Waits until the server reports a `holdfast` statement of this database waiting
/// on a lock (polled, not timed). Fails if `claim` finished without waiting.
async fn wait_until_blocked(observer: &mut PgConnection, claim: &Claim, what: &str) {
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'holdfast'
               AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut *observer)
        .await
        .expect("pg_stat_activity");
        if waiting > 0 {
            return;
        }
        assert!(
            !claim.is_finished(),
            "{what}: the claim finished without waiting for the other transaction"
        );
        tokio::task::yield_now().await;
    }
}

/// Lock rows of token `(tx_id, 0)` as their consumers, and its `spent_by`.
async fn state_of(observer: &mut PgConnection, tx_id: &str) -> (Vec<String>, Option<String>) {
    let holders =
        sqlx::query_scalar("SELECT consumer FROM token_locks WHERE tx_id = $1 AND idx = 0")
            .bind(tx_id)
            .fetch_all(&mut *observer)
            .await
            .expect("token_locks");
    let spent_by = sqlx::query_scalar("SELECT spent_by FROM tokens WHERE tx_id = $1 AND idx = 0")
        .bind(tx_id)
        .fetch_one(&mut *observer)
        .await
        .expect("tokens");
    (holders, spent_by)
}

/// Tokens `x-<case>` and `free-<case>` in wallet `w`, with `x` claimed by
/// consumer `a-<case>`: returns (x, free, a).
async fn x_claimed_by_a(s: &Stores, case: &str) -> (String, String, String) {
    let (x, free) = (format!("x-{case}"), format!("free-{case}"));
    add(s, &[chf("w", &x, 0, 1), chf("w", &free, 0, 1)]).await;
    let a = format!("a-{case}");
    assert_eq!(
        s.locks.claim(&tx(&a), &token_id(&x, 0), T0).await,
        Ok(ClaimVerdict::Won),
        "{case}: A claims x"
    );
    (x, free, a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_racing_a_settlement_never_wins_the_spent_token() {
    let Some(db) = TestDb::create("races::a_claim_racing_a_settlement_never_wins").await else {
        return;
    };
    let mut observer = db.connection().await;
    for strategy in LockStrategy::ALL {
        let backend = db.backend(strategy, 2).await;
        let s = backend.stores();
        for path in [Path::Single, Path::Window] {
            for phase in [Phase::Locked, Phase::Spent] {
                let case = format!("{strategy}-{path:?}-{phase:?}").to_lowercase();
                let (x, free, a) = x_claimed_by_a(&s, &case).await;

                // A settles in a transaction left open.
                let mut settler = db.connection().await;
                exec(&mut settler, "BEGIN").await;
                let locked = spend_lock(&mut settler, &a).await;
                assert_eq!(locked, vec![(x.clone(), 0)], "{case}");
                if phase == Phase::Spent {
                    spend_locked(&mut settler, &a, &locked).await;
                }

                let errors_before = backend.server_errors();
                let claim = start_claim(
                    &s,
                    path,
                    tx(&format!("b-{case}")),
                    token_id(&x, 0),
                    token_id(&free, 0),
                );
                let (x_verdict, got) = if strategy == LockStrategy::SkipLocked {
                    // FOR UPDATE SKIP LOCKED walks past the settling row: contended,
                    // decided without waiting, before A commits.
                    let got = claim.await.expect("claim task");
                    if phase == Phase::Locked {
                        spend_locked(&mut settler, &a, &locked).await;
                    }
                    exec(&mut settler, "COMMIT").await;
                    (ClaimVerdict::Contended, got)
                } else {
                    // The share lock waits for the settlement, then re-checks the
                    // committed row: spent, so stale.
                    wait_until_blocked(&mut observer, &claim, &case).await;
                    if phase == Phase::Locked {
                        spend_locked(&mut settler, &a, &locked).await;
                    }
                    exec(&mut settler, "COMMIT").await;
                    (ClaimVerdict::Stale, claim.await.expect("claim task"))
                };
                let want = match path {
                    Path::Single => vec![(token_id(&x, 0), x_verdict)],
                    Path::Window => vec![
                        (token_id(&x, 0), x_verdict),
                        (token_id(&free, 0), ClaimVerdict::Won),
                    ],
                };
                assert_eq!(got, Ok(want), "{case}: B's verdicts");
                assert_eq!(
                    state_of(&mut observer, &x).await,
                    (Vec::new(), Some(a.clone())),
                    "{case}: x is spent by A and locked by nobody"
                );
                assert_eq!(
                    backend.server_errors(),
                    errors_before,
                    "{case}: no server error"
                );
                // Once settled, x is stale for everyone.
                assert_eq!(
                    s.locks.claim(&tx("late"), &token_id(&x, 0), at(2)).await,
                    Ok(ClaimVerdict::Stale),
                    "{case}: a later claim"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_racing_a_release_wins_once_it_commits() {
    let Some(db) = TestDb::create("races::a_claim_racing_a_release_wins").await else {
        return;
    };
    let mut observer = db.connection().await;
    for strategy in LockStrategy::ALL {
        let backend = db.backend(strategy, 2).await;
        let s = backend.stores();
        for path in [Path::Single, Path::Window] {
            let case = format!("{strategy}-{path:?}").to_lowercase();
            let (x, free, a) = x_claimed_by_a(&s, &case).await;
            let mut releaser = db.connection().await;
            exec(&mut releaser, "BEGIN").await;
            let released: i64 = sqlx::query_scalar(RELEASE_CONSUMER)
                .bind(&a)
                .bind(1_i64)
                .bind(true)
                .fetch_one(&mut releaser)
                .await
                .expect("RELEASE_CONSUMER");
            assert_eq!(released, 1, "{case}");

            let errors_before = backend.server_errors();
            let b = format!("b-{case}");
            let claim = start_claim(&s, path, tx(&b), token_id(&x, 0), token_id(&free, 0));
            // Every strategy inserts x's lock row and waits for the deleted one.
            wait_until_blocked(&mut observer, &claim, &case).await;
            exec(&mut releaser, "COMMIT").await;

            let got = claim.await.expect("claim task");
            let want = match path {
                Path::Single => vec![(token_id(&x, 0), ClaimVerdict::Won)],
                Path::Window => vec![
                    (token_id(&x, 0), ClaimVerdict::Won),
                    (token_id(&free, 0), ClaimVerdict::Won),
                ],
            };
            assert_eq!(got, Ok(want), "{case}: B's verdicts");
            assert_eq!(
                state_of(&mut observer, &x).await,
                (vec![b.clone()], None),
                "{case}: x is B's"
            );
            assert_eq!(
                backend.server_errors(),
                errors_before,
                "{case}: no server error, not even under insert"
            );
        }
    }
}

/// What a storm worker does with what it won.
#[derive(Debug, Clone, Copy)]
enum Finish {
    ReleaseConsumer,
    ReleaseTokens,
    Spend,
}

const ROUNDS: u32 = 12;
const TOKENS_PER_ROUND: u32 = 4;
const WORKERS_PER_STRATEGY: usize = 3;
const ATTEMPTS: u32 = 4;

/// One worker of one round: claims (window or single) over the round's tokens,
/// then releases or spends what it won. Every call must succeed (a deadlock would
/// surface as a fault), and a spend must return exactly what the consumer won: a
/// token missing from it was spent by someone else while this consumer held it.
async fn storm_worker(
    s: Stores,
    round: u32,
    worker: usize,
    tokens: Vec<TokenId>,
    start: Arc<Barrier>,
) {
    start.wait().await;
    for attempt in 0..ATTEMPTS {
        let consumer = tx(&format!("r{round}-w{worker}-a{attempt}"));
        let mut ask = tokens.clone();
        ask.rotate_left((worker + usize::try_from(attempt).expect("small")) % tokens.len());
        let verdicts = if (worker + usize::try_from(attempt).expect("small")) % 2 == 0 {
            s.locks
                .claim_window(&consumer, &ask, at(1))
                .await
                .unwrap_or_else(|e| panic!("{consumer}: window claim failed: {e}"))
        } else {
            let one = ask[0].clone();
            let verdict = s
                .locks
                .claim(&consumer, &one, at(1))
                .await
                .unwrap_or_else(|e| panic!("{consumer}: claim failed: {e}"));
            vec![(one, verdict)]
        };
        let won: BTreeSet<TokenId> = verdicts
            .into_iter()
            .filter(|(_, v)| *v == ClaimVerdict::Won)
            .map(|(id, _)| id)
            .collect();
        let finish = match (worker + usize::try_from(round + attempt).expect("small")) % 3 {
            0 => Finish::ReleaseConsumer,
            1 => Finish::ReleaseTokens,
            _ => Finish::Spend,
        };
        match finish {
            Finish::ReleaseConsumer => {
                let n = s
                    .locks
                    .release_consumer(&consumer, T0, true)
                    .await
                    .unwrap_or_else(|e| panic!("{consumer}: release failed: {e}"));
                assert_eq!(n, u64::try_from(won.len()).expect("small"), "{consumer}");
            }
            Finish::ReleaseTokens => {
                let mine: Vec<TokenId> = won.iter().cloned().collect();
                let n = s
                    .locks
                    .release_tokens(&consumer, &mine)
                    .await
                    .unwrap_or_else(|e| panic!("{consumer}: release failed: {e}"));
                assert_eq!(n, u64::try_from(won.len()).expect("small"), "{consumer}");
            }
            Finish::Spend => {
                let spent: BTreeSet<TokenId> = s
                    .locks
                    .spend_consumer(&consumer, at(2), true)
                    .await
                    .unwrap_or_else(|e| panic!("{consumer}: spend failed: {e}"))
                    .into_iter()
                    .collect();
                assert_eq!(
                    spent, won,
                    "{consumer}: spent exactly what it won (a difference is a double spend)"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_claims_spends_and_releases_double_spends_nothing_and_never_deadlocks() {
    let Some(db) = TestDb::create("races::a_storm_of_claims_spends_and_releases").await else {
        return;
    };
    let mut backends: Vec<PgBackend> = Vec::new();
    for strategy in LockStrategy::ALL {
        backends.push(db.backend(strategy, 4).await);
    }
    let seed = backends[0].stores();
    for round in 0..ROUNDS {
        let name = format!("storm-{round}");
        let batch: Vec<_> = (0..TOKENS_PER_ROUND)
            .map(|i| chf("w", &name, i, 1))
            .collect();
        add(&seed, &batch).await;
        let tokens: Vec<TokenId> = batch.iter().map(|t| t.id.clone()).collect();
        let start = Arc::new(Barrier::new(backends.len() * WORKERS_PER_STRATEGY));
        let mut tasks = Vec::new();
        for (b, backend) in backends.iter().enumerate() {
            for w in 0..WORKERS_PER_STRATEGY {
                let worker = b * WORKERS_PER_STRATEGY + w;
                tasks.push(tokio::spawn(storm_worker(
                    backend.stores(),
                    round,
                    worker,
                    tokens.clone(),
                    start.clone(),
                )));
            }
        }
        for task in tasks {
            task.await.expect("storm worker");
        }
    }

    let mut observer = db.connection().await;
    let both: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tokens t JOIN token_locks l ON l.tx_id = t.tx_id AND l.idx = t.idx
         WHERE t.spent_by IS NOT NULL",
    )
    .fetch_one(&mut observer)
    .await
    .expect("count locked spent tokens");
    assert_eq!(both, 0, "no token is both spent and locked");
    let leftover: i64 = sqlx::query_scalar("SELECT count(*) FROM token_locks")
        .fetch_one(&mut observer)
        .await
        .expect("count lock rows");
    assert_eq!(leftover, 0, "every worker released or spent what it won");
    let spent: i64 = sqlx::query_scalar("SELECT count(*) FROM tokens WHERE spent_by IS NOT NULL")
        .fetch_one(&mut observer)
        .await
        .expect("count spent tokens");
    assert!(spent > 0, "the storm spent something");
    for backend in &backends {
        if backend.strategy() != LockStrategy::Insert {
            assert_eq!(
                backend.server_errors(),
                0,
                "{}: no server errors",
                backend.strategy()
            );
        }
    }
}
