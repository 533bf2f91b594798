//! PostgreSQL-specific behaviour, against a real server: the candidate plan, the
//! lock strategies' verdicts and server errors, round trips, sweep leadership, pool
//! discipline, a claimer killed mid-statement, a mixed-strategy fleet, migrations,
//! connection errors and the schema.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use holdfast_adapters_postgres::{
    ConnectError, LockStrategy, PgBackend, PgOptions, SWEEP_LOCK_KEY,
};
use holdfast_domain::{ClaimVerdict, TokenId, TxId};
use holdfast_ports::conformance::support::{T0, add, at, chf, token_id, token_type, tx, wallet};
use holdfast_ports::{BandQuery, CandidateQuery, LockStoreError, StoreFault};
use sqlx::{Connection, PgConnection, Row};
use support::{TestDb, exec};
use tokio::sync::Barrier;

/// Lock rows as (token, consumer).
async fn lock_rows(conn: &mut PgConnection) -> BTreeMap<TokenId, TxId> {
    sqlx::query("SELECT tx_id, idx, consumer FROM token_locks")
        .fetch_all(&mut *conn)
        .await
        .expect("read token_locks")
        .iter()
        .map(|row| {
            let index: i64 = row.get(1);
            (
                token_id(
                    row.get::<&str, _>(0),
                    u32::try_from(index).expect("u32 index"),
                ),
                tx(row.get::<&str, _>(2)),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidate_reads_and_listings_scan_the_partial_indexes_of_150k_tokens() {
    let Some(db) = TestDb::create("candidate_reads_and_listings_scan_the_partial_indexes").await
    else {
        return;
    };
    let backend = db.backend(LockStrategy::OnConflict, 2).await;
    let mut conn = db.connection().await;
    // 100,000 tokens in the wallet (amounts with many ties), 50,000 elsewhere, some
    // spent or unspendable, 1,000 locked.
    exec(
        &mut conn,
        "INSERT INTO tokens (tx_id, idx, wallet, token_type, amount, spendable)
         SELECT 'big-' || g, 0, 'big', 'CHF', (g % 5000) + 1, g % 97 <> 0
         FROM generate_series(1, 100000) g",
    )
    .await;
    exec(
        &mut conn,
        "INSERT INTO tokens (tx_id, idx, wallet, token_type, amount, spendable)
         SELECT 'other-' || g, g % 3, 'w' || (g % 50), CASE WHEN g % 2 = 0 THEN 'CHF' ELSE 'EUR' END,
                g, true
         FROM generate_series(1, 50000) g",
    )
    .await;
    exec(
        &mut conn,
        "UPDATE tokens SET spent_by = 'spender', spent_at = now()
         WHERE wallet = 'big' AND tx_id LIKE 'big-1%' AND amount < 50",
    )
    .await;
    exec(
        &mut conn,
        "INSERT INTO token_locks (tx_id, idx, consumer, created_at)
         SELECT 'big-' || g, 0, 'holder', now() FROM generate_series(1, 100000, 100) g",
    )
    .await;
    exec(&mut conn, "ANALYZE tokens").await;
    exec(&mut conn, "ANALYZE token_locks").await;

    let (w, t) = (wallet("big"), token_type("CHF"));
    let first = backend
        .explain_candidates(&w, &t, None, 64)
        .await
        .expect("explain first page");
    let page = backend
        .stores()
        .tokens
        .candidates(&CandidateQuery {
            wallet: w.clone(),
            token_type: t.clone(),
            after: None,
            limit: 64,
        })
        .await
        .expect("first page");
    let cursor = page.last().cloned().expect("a full first page");
    let next = backend
        .explain_candidates(&w, &t, Some(&cursor), 64)
        .await
        .expect("explain next page");
    let band_query = |at_most: Option<u128>| BandQuery {
        wallet: w.clone(),
        token_type: t.clone(),
        // Mid-wallet: both bands hold tens of thousands of rows.
        threshold: holdfast_ports::conformance::support::amount(2500),
        cover: 16,
        fill: 256,
        fill_before: None,
        fill_unless_cover_at_most: at_most.map(holdfast_ports::conformance::support::amount),
    };
    let bands = backend
        .explain_candidate_bands(&band_query(None))
        .await
        .expect("explain band read");
    // The first read of a select that may skip the fill band.
    let bounded = backend
        .explain_candidate_bands(&band_query(Some(12_500)))
        .await
        .expect("explain bounded band read");
    for (which, plan) in [("bands", &bands), ("bounded bands", &bounded)] {
        assert_eq!(
            plan.matches("using tokens_candidates").count(),
            2,
            "{which}: both bands scan tokens_candidates:\n{plan}"
        );
        assert!(
            plan.contains("Backward"),
            "{which}: the fill band scans backwards:\n{plan}"
        );
    }
    for (which, plan) in [
        ("first page", &first),
        ("keyset page", &next),
        ("bands", &bands),
        ("bounded bands", &bounded),
    ] {
        assert!(
            plan.contains("Index Scan using tokens_candidates")
                || plan.contains("Index Only Scan using tokens_candidates"),
            "{which}: expected a scan of tokens_candidates:\n{plan}"
        );
        assert!(!plan.contains("Sort"), "{which}: expected no sort:\n{plan}");
        assert!(
            !plan.contains("Seq Scan on tokens"),
            "{which}: expected no sequential scan:\n{plan}"
        );
    }
    // A listing reads the wallet's ranges of the two indexes of unspent rows,
    // not the table, whether or not it names a type.
    let small = wallet("w7");
    for (which, of_type) in [("a listing of one type", Some(&t)), ("a listing", None)] {
        let plan = backend
            .explain_list_tokens(&small, of_type, 100)
            .await
            .expect("explain listing");
        for index in ["tokens_candidates", "tokens_unspendable"] {
            assert!(plan.contains(index), "{which}: expected {index}:\n{plan}");
        }
        let by_wallet = plan
            .lines()
            .filter(|line| {
                line.contains("Index Cond: ((wallet = ") || line.contains("Index Cond: (wallet = ")
            })
            .count();
        assert_eq!(
            by_wallet, 2,
            "{which}: both ranges found by wallet:\n{plan}"
        );
        assert!(
            !plan.contains("Seq Scan on tokens"),
            "{which}: expected no sequential scan:\n{plan}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_being_locked_is_contended_under_skip_locked_never_stale() {
    let Some(db) = TestDb::create("a_row_being_locked_is_contended_under_skip_locked").await else {
        return;
    };
    let skip = db.backend(LockStrategy::SkipLocked, 2).await;
    let plain = db.backend(LockStrategy::OnConflict, 2).await;
    let s = skip.stores();
    add(
        &s,
        &[
            chf("w", "k", 0, 1),
            chf("w", "j", 0, 2),
            chf("w", "m", 0, 3),
        ],
    )
    .await;
    // Another claimer is locking k's row right now (and may still roll back).
    let mut other = db.connection().await;
    exec(&mut other, "BEGIN").await;
    exec(
        &mut other,
        "SELECT 1 FROM tokens WHERE tx_id = 'k' FOR UPDATE",
    )
    .await;

    let got = s
        .locks
        .claim_window(&tx("me"), &[token_id("k", 0), token_id("j", 0)], T0)
        .await
        .expect("window");
    assert_eq!(
        got,
        vec![
            (token_id("k", 0), ClaimVerdict::Contended),
            (token_id("j", 0), ClaimVerdict::Won),
        ]
    );
    assert_eq!(
        s.locks.claim(&tx("me"), &token_id("k", 0), T0).await,
        Ok(ClaimVerdict::Contended),
        "single-token path under skip_locked"
    );
    // on_conflict share-locks the row (so a settlement committing under it is seen):
    // it waits for the other claimer, and wins once that one rolls back.
    let waiting = {
        let plain = plain.stores();
        tokio::spawn(async move { plain.locks.claim(&tx("you"), &token_id("k", 0), T0).await })
    };
    let mut observer = db.connection().await;
    loop {
        let blocked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'holdfast'
               AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut observer)
        .await
        .expect("pg_stat_activity");
        if blocked > 0 {
            break;
        }
        assert!(
            !waiting.is_finished(),
            "on_conflict did not wait for the row lock"
        );
        tokio::task::yield_now().await;
    }
    exec(&mut other, "ROLLBACK").await;
    assert_eq!(waiting.await.expect("claim task"), Ok(ClaimVerdict::Won));
    assert_eq!(skip.server_errors() + plain.server_errors(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_races_are_server_errors_only_on_the_insert_single_path() {
    let Some(db) =
        TestDb::create("lost_races_are_server_errors_only_on_the_insert_single_path").await
    else {
        return;
    };
    for strategy in LockStrategy::ALL {
        let backend = db.backend(strategy, 8).await;
        let s = backend.stores();
        let hot = format!("hot-{strategy}");
        add(&s, &[chf("w", &hot, 0, 1)]).await;
        let barrier = Arc::new(Barrier::new(16));
        let mut tasks = Vec::new();
        for i in 0..16 {
            let (s, barrier, hot) = (s.clone(), barrier.clone(), hot.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                s.locks
                    .claim(&tx(&format!("{hot}-claimer-{i}")), &token_id(&hot, 0), T0)
                    .await
            }));
        }
        let mut won = 0;
        for task in tasks {
            match task.await.expect("claim task") {
                Ok(ClaimVerdict::Won) => won += 1,
                Ok(ClaimVerdict::Contended) => {}
                other => panic!("{strategy}: expected won or contended, got {other:?}"),
            }
        }
        assert_eq!(won, 1, "{strategy}: one winner");
        let expected_errors = if strategy == LockStrategy::Insert {
            15
        } else {
            0
        };
        assert_eq!(
            backend.server_errors(),
            expected_errors,
            "{strategy}: every lost race is a unique violation only under insert"
        );
        // Batch claims never raise a server error, under any strategy.
        let before = backend.server_errors();
        let verdicts = s
            .locks
            .claim_window(&tx("late"), &[token_id(&hot, 0)], at(1))
            .await
            .expect("window");
        assert_eq!(verdicts, vec![(token_id(&hot, 0), ClaimVerdict::Contended)]);
        assert_eq!(backend.server_errors(), before, "{strategy}: window path");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_select_costs_two_round_trips() {
    let Some(db) = TestDb::create("an_uncontended_select_costs_two_round_trips").await else {
        return;
    };
    for strategy in LockStrategy::ALL {
        let backend = db.backend(strategy, 2).await;
        let s = backend.stores();
        let w = format!("w-{strategy}");
        let batch: Vec<_> = (0..300u32)
            .map(|i| chf(&w, &format!("{w}-t"), i, 1))
            .collect();
        add(&s, &batch).await;
        let before = backend.round_trips();
        let page = s
            .tokens
            .candidates(&CandidateQuery {
                wallet: wallet(&w),
                token_type: token_type("CHF"),
                after: None,
                limit: 256,
            })
            .await
            .expect("page");
        let window: Vec<TokenId> = page.iter().map(|c| c.id.clone()).collect();
        let verdicts = s
            .locks
            .claim_window(&tx(&format!("{w}-me")), &window, T0)
            .await
            .expect("window");
        assert_eq!(verdicts.len(), 256);
        assert!(verdicts.iter().all(|(_, v)| *v == ClaimVerdict::Won));
        assert_eq!(
            backend.round_trips() - before,
            2,
            "{strategy}: fetch a page, claim a window"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_sweepers_at_once_one_deletes() {
    let Some(db) = TestDb::create("three_sweepers_at_once_one_deletes").await else {
        return;
    };
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(db.backend(LockStrategy::OnConflict, 2).await);
    }
    let s = replicas[0].stores();
    let batch: Vec<_> = (0..10u32).map(|i| chf("w", "t", i, 1)).collect();
    add(&s, &batch).await;
    for i in 0..10u32 {
        s.locks
            .claim(&tx(&format!("c{i}")), &token_id("t", i), at(0))
            .await
            .expect("claim");
    }
    let rule = holdfast_domain::SweepRule {
        cutoff: at(3_600_000).saturating_sub(Duration::from_secs(60)),
    };

    // A sweeper mid-sweep elsewhere holds leadership: nobody else deletes.
    let mut holder = db.connection().await;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(SWEEP_LOCK_KEY)
        .execute(&mut holder)
        .await
        .expect("hold leadership");
    let barrier = Arc::new(Barrier::new(3));
    let sweep_all = |barrier: Arc<Barrier>| {
        let tasks: Vec<_> = replicas
            .iter()
            .map(|r| {
                let (s, barrier) = (r.stores(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    s.locks.sweep(rule).await.expect("sweep")
                })
            })
            .collect();
        async move {
            let mut reports = Vec::new();
            for t in tasks {
                reports.push(t.await.expect("sweep task"));
            }
            reports
        }
    };
    let blocked = sweep_all(barrier.clone()).await;
    assert!(
        blocked.iter().all(|r| !r.leader && r.expired == 0),
        "{blocked:?}"
    );
    assert_eq!(s.locks.list_locks().await.expect("list").len(), 10);
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(SWEEP_LOCK_KEY)
        .execute(&mut holder)
        .await
        .expect("release leadership");

    let reports = sweep_all(barrier).await;
    let deleting: Vec<_> = reports.iter().filter(|r| r.expired > 0).collect();
    assert_eq!(
        deleting.len(),
        1,
        "exactly one sweeper deletes: {reports:?}"
    );
    assert!(deleting[0].leader);
    assert_eq!(reports.iter().map(|r| r.expired).sum::<u64>(), 10);
    assert!(s.locks.list_locks().await.expect("list").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_selects_on_a_pool_of_two_finish() {
    let Some(db) = TestDb::create("sixteen_selects_on_a_pool_of_two_finish").await else {
        return;
    };
    let backend = PgBackend::connect(
        &db.url,
        PgOptions {
            strategy: LockStrategy::SkipLocked,
            max_connections: 2,
            connect_timeout: Duration::from_secs(30),
            ..PgOptions::default()
        },
    )
    .await
    .expect("connect");
    let s = backend.stores();
    let batch: Vec<_> = (0..64u32)
        .map(|i| chf("w", "t", i, u128::from(i % 7) + 1))
        .collect();
    add(&s, &batch).await;
    let barrier = Arc::new(Barrier::new(16));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (s, barrier) = (s.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let me = tx(&format!("select-{i}"));
            let mut held = 0usize;
            for _round in 0..5 {
                // The shape of a select: page, balance, claim a window, release part.
                let page = s
                    .tokens
                    .candidates(&CandidateQuery {
                        wallet: wallet("w"),
                        token_type: token_type("CHF"),
                        after: None,
                        limit: 8,
                    })
                    .await?;
                s.tokens.balance(&wallet("w"), &token_type("CHF")).await?;
                let window: Vec<TokenId> = page.iter().take(3).map(|c| c.id.clone()).collect();
                let verdicts = s.locks.claim_window(&me, &window, T0).await?;
                held += verdicts
                    .iter()
                    .filter(|(_, v)| *v == ClaimVerdict::Won)
                    .count();
                s.locks.release_consumer(&me, T0, true).await?;
            }
            Ok::<usize, Box<dyn std::error::Error + Send + Sync>>(held)
        }));
    }
    for task in tasks {
        task.await
            .expect("select task")
            .unwrap_or_else(|e| panic!("a select failed on the small pool: {e}"));
    }
    assert!(s.locks.list_locks().await.expect("list").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claimer_killed_mid_statement_leaves_no_partial_and_no_double_claim() {
    let Some(db) = TestDb::create("a_claimer_killed_mid_statement").await else {
        return;
    };
    let mut observer = db.connection().await;
    // A window of 8 (the array statement) and of 4 (the scalar one), each with
    // the lock row of one token held by an uncommitted insert.
    for (strategy, size, blocked) in LockStrategy::ALL
        .into_iter()
        .flat_map(|strategy| [(strategy, 8u32, 5u32), (strategy, 4, 2)])
    {
        let claimer = db.backend(strategy, 1).await;
        let s = claimer.stores();
        let name = format!("kill-{strategy}-{size}");
        let batch: Vec<_> = (0..size).map(|i| chf("w", &name, i, 1)).collect();
        add(&s, &batch).await;
        let window: Vec<TokenId> = batch.iter().map(|t| t.id.clone()).collect();

        // The blocker is inserting the lock row of token `blocked` (uncommitted):
        // the claim inserts the tokens before it in order, then waits for it.
        let mut blocker = db.connection().await;
        exec(&mut blocker, "BEGIN").await;
        sqlx::query(
            "INSERT INTO token_locks (tx_id, idx, consumer, created_at) VALUES ($1, $2, 'blocker', now())",
        )
        .bind(&name)
        .bind(i64::from(blocked))
        .execute(&mut blocker)
        .await
        .expect("blocker insert");

        let victim = tx(&format!("victim-{strategy}-{size}"));
        let claim = {
            let (s, window, victim) = (s.clone(), window.clone(), victim.clone());
            tokio::spawn(async move { s.locks.claim_window(&victim, &window, T0).await })
        };
        // Wait (by observing the server, not the clock) until the claim is blocked.
        let mut pid = None;
        for _ in 0..200_000 {
            pid = sqlx::query_scalar::<_, i32>(
                "SELECT pid FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'holdfast'
                   AND wait_event_type = 'Lock'",
            )
            .fetch_optional(&mut observer)
            .await
            .expect("pg_stat_activity");
            if pid.is_some() {
                break;
            }
            tokio::task::yield_now().await;
        }
        let pid = pid.unwrap_or_else(|| panic!("{strategy}: the claim never blocked"));
        let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&mut observer)
            .await
            .expect("terminate");
        assert!(killed);
        match claim.await.expect("claim task") {
            Err(LockStoreError::Fault(StoreFault::Unavailable(_))) => {}
            other => panic!("{strategy}: expected an Unavailable fault, got {other:?}"),
        }
        exec(&mut blocker, "COMMIT").await;

        let rows = lock_rows(&mut observer).await;
        assert!(
            rows.values().all(|holder| *holder != victim),
            "{strategy}: no partial claim of the killed statement survives: {rows:?}"
        );
        // The claimer's pool recovers, and a new claim finds exactly one holder each.
        let again = s
            .locks
            .claim_window(&tx(&format!("after-{strategy}-{size}")), &window, at(1))
            .await
            .expect("claim after the kill");
        for (token, verdict) in &again {
            let want = if token.index == blocked {
                ClaimVerdict::Contended
            } else {
                ClaimVerdict::Won
            };
            assert_eq!(*verdict, want, "{strategy}: {token}");
        }
        let rows = lock_rows(&mut observer).await;
        let mine: Vec<_> = rows.iter().filter(|(t, _)| t.tx.as_str() == name).collect();
        assert_eq!(
            mine.len(),
            usize::try_from(size).unwrap_or(0),
            "{strategy}: one lock row per token"
        );
        let _ = blocker.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mixed_fleet_has_one_winner_per_token_and_no_errors_on_on_conflict_and_skip_locked() {
    let Some(db) = TestDb::create("mixed_fleet_one_winner_per_token").await else {
        return;
    };
    let mut fleet = Vec::new();
    for strategy in LockStrategy::ALL {
        fleet.push(db.backend(strategy, 4).await);
    }
    const TOKENS: u32 = 48;
    let batch: Vec<_> = (0..TOKENS)
        .map(|i| chf("w", "pool", i, u128::from(i % 5) + 1))
        .collect();
    add(&fleet[0].stores(), &batch).await;
    let barrier = Arc::new(Barrier::new(24));
    let mut tasks = Vec::new();
    for i in 0..24u32 {
        let backend = fleet[usize::try_from(i % 3).expect("small")].clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let s = backend.stores();
            let me = tx(&format!("{}-{i}", backend.strategy()));
            // Overlapping windows of 12 (every token is named by six of them), then
            // single-token claims on tokens others are claiming by window.
            let window: Vec<TokenId> = (0..12)
                .map(|k| token_id("pool", (i * 2 + k) % TOKENS))
                .collect();
            let singles: Vec<TokenId> = (0..4)
                .map(|k| token_id("pool", (i * 7 + k * 11) % TOKENS))
                .collect();
            barrier.wait().await;
            let mut won = Vec::new();
            for (token, verdict) in s
                .locks
                .claim_window(&me, &window, T0)
                .await
                .expect("window")
            {
                if verdict == ClaimVerdict::Won {
                    won.push(token);
                }
            }
            for token in singles {
                if s.locks.claim(&me, &token, T0).await.expect("claim") == ClaimVerdict::Won {
                    won.push(token);
                }
            }
            (me, won)
        }));
    }
    let mut winners: BTreeMap<TokenId, TxId> = BTreeMap::new();
    for task in tasks {
        let (me, won) = task.await.expect("fleet task");
        for token in won {
            if let Some(first) = winners.insert(token.clone(), me.clone()) {
                panic!("{token} won by both {first} and {me}");
            }
        }
    }
    assert_eq!(
        winners.len(),
        usize::try_from(TOKENS).expect("small"),
        "every token has a winner"
    );
    let mut observer = db.connection().await;
    assert_eq!(
        lock_rows(&mut observer).await,
        winners,
        "lock rows are exactly the reported wins"
    );
    assert_eq!(fleet[1].server_errors(), 0, "on_conflict pool");
    assert_eq!(fleet[2].server_errors(), 0, "skip_locked pool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_connecting_at_once_apply_each_migration_once() {
    let Some(db) = TestDb::create("replicas_connecting_at_once_apply_each_migration_once").await
    else {
        return;
    };
    let barrier = Arc::new(Barrier::new(4));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (url, barrier) = (db.url.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            PgBackend::connect(&url, PgOptions::default()).await
        }));
    }
    for task in tasks {
        task.await
            .expect("connect task")
            .expect("connect and migrate");
    }
    let mut conn = db.connection().await;
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&mut conn)
            .await
            .expect("migrations table");
    let want: Vec<i64> = holdfast_adapters_postgres::MIGRATIONS
        .iter()
        .map(|m| m.0)
        .collect();
    assert_eq!(versions, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_after_migrations() {
    let Some(db) = TestDb::create("schema_after_migrations").await else {
        return;
    };
    drop(db.backend(LockStrategy::Insert, 1).await);
    let mut conn = db.connection().await;
    let columns = sqlx::query(
        "SELECT table_name, column_name, data_type, numeric_precision, numeric_scale,
                is_nullable, collation_name
         FROM information_schema.columns
         WHERE table_schema = 'public' AND table_name <> '_sqlx_migrations'
         ORDER BY table_name, ordinal_position",
    )
    .fetch_all(&mut conn)
    .await
    .expect("columns");
    let mut out = String::new();
    for c in &columns {
        let precision: Option<i32> = c.get(3);
        let scale: Option<i32> = c.get(4);
        let collation: Option<&str> = c.get(6);
        out.push_str(&format!(
            "{}.{}: {}{}{}{}\n",
            c.get::<&str, _>(0),
            c.get::<&str, _>(1),
            c.get::<&str, _>(2),
            match (c.get::<&str, _>(2), precision) {
                ("numeric", Some(p)) => format!("({p},{})", scale.unwrap_or(0)),
                _ => String::new(),
            },
            if c.get::<&str, _>(5) == "NO" {
                " not null"
            } else {
                ""
            },
            collation
                .map(|k| format!(" collate {k}"))
                .unwrap_or_default(),
        ));
    }
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = 'public'
         AND tablename <> '_sqlx_migrations' ORDER BY indexname",
    )
    .fetch_all(&mut conn)
    .await
    .expect("indexes");
    out.push('\n');
    for index in indexes {
        out.push_str(&index);
        out.push('\n');
    }
    insta::assert_snapshot!(out);
}

/// A TCP listener that accepts and never answers, like a hung server.
fn silent_server() -> (std::net::TcpListener, u16) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    (listener, port)
}

#[tokio::test]
async fn connect_errors_are_typed_and_never_show_the_password() {
    let secret = "s3cr3t-pw";
    let (listener, port) = silent_server();
    let hung = PgBackend::connect(
        &format!("postgres://app:{secret}@127.0.0.1:{port}/holdfast"),
        PgOptions {
            connect_timeout: Duration::from_millis(200),
            ..PgOptions::default()
        },
    )
    .await
    .expect_err("a server that never answers");
    assert!(matches!(hung, ConnectError::Timeout { .. }), "{hung:?}");
    drop(listener);
    let refused = PgBackend::connect(
        &format!("postgres://app:{secret}@127.0.0.1:{port}/holdfast"),
        PgOptions::default(),
    )
    .await
    .expect_err("nothing listens");
    assert!(
        matches!(refused, ConnectError::Unavailable { .. }),
        "{refused:?}"
    );
    let bad_url = PgBackend::connect(
        &format!("postgres://app:{secret}@127.0.0.1:notaport/holdfast"),
        PgOptions::default(),
    )
    .await
    .expect_err("bad port");
    assert!(
        matches!(bad_url, ConnectError::InvalidUrl { .. }),
        "{bad_url:?}"
    );
    let empty_pool = PgBackend::connect(
        "postgres://127.0.0.1/holdfast",
        PgOptions {
            max_connections: 0,
            ..PgOptions::default()
        },
    )
    .await
    .expect_err("no connections");
    assert!(
        matches!(empty_pool, ConnectError::Options(_)),
        "{empty_pool:?}"
    );
    for err in [&hung, &refused, &bad_url] {
        let shown = format!("{err} / {err:?}");
        assert!(!shown.contains(secret), "password leaked: {shown}");
        assert!(
            shown.contains("app:***@127.0.0.1"),
            "redacted URL expected: {shown}"
        );
    }
}

#[test]
fn with_database_replaces_only_the_path() {
    assert_eq!(
        support::with_database("postgres://u:p@h:5432/postgres?sslmode=disable", "t1"),
        "postgres://u:p@h:5432/t1?sslmode=disable"
    );
    assert_eq!(
        support::with_database("postgres://h", "t2"),
        "postgres://h/t2"
    );
    assert_eq!(
        support::with_database("postgres://h/db", "t3"),
        "postgres://h/t3"
    );
}

/// A database at schema version 2 (migrated by an older holdfast) with a request
/// building in a slot: after the upgrade to version 3 the owner keeps its slot
/// with a lease starting at the upgrade, the request has no fail reason, and the
/// queue no stored limit until its next head is stamped.
#[tokio::test]
async fn upgrading_from_version_2_starts_owner_leases_at_the_upgrade() {
    use holdfast_domain::{QueueName, RequestId, Timestamp};
    use holdfast_ports::QueueStore;

    let Some(db) = TestDb::create("upgrading_from_version_2").await else {
        return;
    };
    let mut conn = db.connection().await;
    let older = holdfast_adapters_postgres::migrator_up_to(2);
    older.run(&mut conn).await.expect("migrate to version 2");
    for row in [
        "INSERT INTO queues (name, latest_request_id, owners, version)
         VALUES ('main', 'request/main/1', '{request/main/1}', 3)",
        "INSERT INTO queues (name, version) VALUES ('empty', 1)",
        "INSERT INTO requests (queue, seq, uri, state, strategy, version)
         VALUES ('main', 1, 'git:a', 'processing', 'full', 2)",
    ] {
        exec(&mut conn, row).await;
    }
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis();
    let backend = db.backend(LockStrategy::Insert, 2).await;
    let name = QueueName::new("main").expect("queue");
    let queue = backend
        .load_queue(&name)
        .await
        .expect("load")
        .expect("queue");
    let id = RequestId::new(name, 1);
    let slot = queue.owners[&id];
    let since = Timestamp::from_millis(u64::try_from(before).expect("millis") - 60_000);
    assert!(slot.claimed_at >= since, "{slot:?}");
    assert_eq!(slot.claimed_at, slot.heartbeat_at);
    assert_eq!(queue.max_concurrent, None);
    let request = backend
        .load_request(&id)
        .await
        .expect("load")
        .expect("request");
    assert_eq!(request.reason, None);
    assert!(request.ingested_at >= since);
    let empty = backend
        .load_queue(&QueueName::new("empty").expect("queue"))
        .await
        .expect("load")
        .expect("queue");
    assert!(empty.owners.is_empty());
}
