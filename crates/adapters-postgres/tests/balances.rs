//! The balance locks (migration 0007), against a real server: small adds into one
//! wallet take them shared and do not wait for each other; an add of a big token,
//! or a small add into a wallet holding one, takes them exclusive, having let go
//! of the shared ones first; and no interleaving of big and small adds and
//! confirms lifts a wallet's unspent total past 2^128 - 1 or deadlocks; an add
//! and a confirm writing the same ids under the shared lock do not deadlock, and
//! a confirm whose output id an add commits meanwhile is refused as differing; a
//! call that waited for the lock reads what its holder committed; sessions run
//! at READ COMMITTED; direct SQL callers' bad arguments are refused. A confirm
//! counts as inputs only the selected rows it holds, and spends exactly what it
//! counted, whatever give-back commits while it waits.
//!
//! A lock another session holds is taken on a plain connection, in an open
//! transaction; a call that must wait for it is shown waiting by polling
//! `pg_locks` (not timed) before the lock is let go.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use holdfast_adapters_postgres::{BALANCE_SPACE, LockStrategy, PgBackend, PgOptions};
use holdfast_domain::{ClaimVerdict, TokenId};
use holdfast_ports::conformance::support::{
    T0, add, amount, at, chf, token_id, token_type, tx, wallet,
};
use holdfast_ports::{LockStoreError, NewToken, Output, Stores, TokenStoreError};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, PgConnection};
use support::{TestDb, exec};
use tokio::sync::Barrier;
use tokio::task::JoinHandle;

/// 2^63: the smallest amount that makes an add, or a wallet holding it, big.
const BIG: u128 = 1 << 63;

/// Longest a call that must not wait may take: far beyond its time on a loaded
/// machine; it only turns a call stuck behind a lock into a failure.
const NO_WAIT: Duration = Duration::from_secs(30);

/// A backend on `db` whose lock waits last a minute, not the default second: a
/// call these tests hold up must still be waiting when they look, and let go,
/// on a loaded machine.
async fn patient_backend(db: &TestDb, strategy: LockStrategy, max_connections: u32) -> PgBackend {
    PgBackend::connect(
        &db.url,
        PgOptions {
            strategy,
            max_connections,
            lock_timeout: Duration::from_secs(60),
            ..PgOptions::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("connect to {}: {e}", db.name))
}

/// An output of `value` CHF to `wallet_id`.
fn pay(wallet_id: &str, value: u128) -> Output {
    Output {
        wallet: wallet(wallet_id),
        token_type: token_type("CHF"),
        quantity: amount(value),
    }
}

/// Funds `wallet_id` with one token `(consumer's id + "-in", 0)` of `value` and
/// claims it for `consumer`: what a confirm paying `value` spends.
async fn funded(s: &Stores, consumer: &str, wallet_id: &str, value: u128) {
    let input = format!("{consumer}-in");
    add(s, &[chf(wallet_id, &input, 0, value)]).await;
    let won = s.locks.claim(&tx(consumer), &token_id(&input, 0), T0).await;
    assert_eq!(won, Ok(ClaimVerdict::Won), "claim of {input}");
}

/// The unspent CHF balance of `wallet_id`.
async fn balance(s: &Stores, wallet_id: &str) -> u128 {
    s.tokens
        .balance(&wallet(wallet_id), &token_type("CHF"))
        .await
        .expect("balance")
        .value()
}

/// Opens a transaction on `conn` holding the balance lock of `wallet_id`/CHF,
/// shared or exclusive.
async fn hold(conn: &mut PgConnection, wallet_id: &str, shared: bool) {
    sqlx::query("BEGIN")
        .execute(&mut *conn)
        .await
        .expect("BEGIN");
    let lock = if shared {
        "SELECT pg_advisory_xact_lock_shared($1, hashtext($2 || E'\\t' || 'CHF'))"
    } else {
        "SELECT pg_advisory_xact_lock($1, hashtext($2 || E'\\t' || 'CHF'))"
    };
    sqlx::query(lock)
        .bind(BALANCE_SPACE)
        .bind(wallet_id)
        .execute(&mut *conn)
        .await
        .expect("take the balance lock");
}

/// Ends the transaction `hold` opened, letting go of its lock.
async fn let_go(conn: &mut PgConnection) {
    sqlx::query("COMMIT")
        .execute(&mut *conn)
        .await
        .expect("COMMIT");
}

/// Waits until a session other than `observer`'s waits for a balance lock, and
/// answers its pid and the balance locks it holds meanwhile, as their modes.
/// Fails if `call` finishes first: it did not wait.
async fn wait_until_waiting<T>(
    observer: &mut PgConnection,
    call: &JoinHandle<T>,
    what: &str,
) -> (i32, Vec<String>) {
    loop {
        let waiter: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_locks
             WHERE locktype = 'advisory' AND classid::int = $1 AND objsubid = 2
               AND NOT granted AND pid <> pg_backend_pid()
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
             LIMIT 1",
        )
        .bind(BALANCE_SPACE)
        .fetch_optional(&mut *observer)
        .await
        .expect("pg_locks");
        if let Some(pid) = waiter {
            let held: Vec<String> = sqlx::query_scalar(
                "SELECT mode FROM pg_locks
                 WHERE locktype = 'advisory' AND classid::int = $1 AND objsubid = 2
                   AND granted AND pid = $2
                 ORDER BY objid",
            )
            .bind(BALANCE_SPACE)
            .bind(pid)
            .fetch_all(&mut *observer)
            .await
            .expect("pg_locks of the waiter");
            return (pid, held);
        }
        assert!(
            !call.is_finished(),
            "{what}: finished without waiting for the balance lock"
        );
        tokio::task::yield_now().await;
    }
}

/// The mode a waiting session asks for the balance lock in.
async fn wanted_mode(observer: &mut PgConnection, pid: i32) -> String {
    sqlx::query_scalar(
        "SELECT mode FROM pg_locks
         WHERE locktype = 'advisory' AND classid::int = $1 AND objsubid = 2
           AND NOT granted AND pid = $2",
    )
    .bind(BALANCE_SPACE)
    .bind(pid)
    .fetch_one(&mut *observer)
    .await
    .expect("the waiting lock")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_adds_share_the_balance_lock_and_big_ones_wait_for_it() {
    let Some(db) = TestDb::create("small_adds_share_the_balance_lock").await else {
        return;
    };
    let backend = patient_backend(&db, LockStrategy::OnConflict, 4).await;
    let s = backend.stores();
    let mut holder = db.connection().await;
    let mut observer = db.connection().await;
    funded(&s, "t1", "src", 7).await;
    funded(&s, "t2", "src", 9).await;

    // Another small writer holds the lock of w shared: a small add and a small
    // confirm into w go through at once.
    hold(&mut holder, "w", true).await;
    let added = tokio::time::timeout(NO_WAIT, s.tokens.add_tokens(&[chf("w", "a", 0, BIG - 1)]))
        .await
        .expect("a small add waited for a shared holder");
    assert_eq!(added, Ok(1));
    let confirmed = tokio::time::timeout(
        NO_WAIT,
        s.locks
            .confirm(&tx("t1"), &[pay("w", 5), pay("src", 2)], at(1)),
    )
    .await
    .expect("a small confirm waited for a shared holder");
    assert!(confirmed.is_ok(), "{confirmed:?}");

    // An add of 2^63 must exclude the small writers: it waits, asking exclusive.
    let big = {
        let s = s.clone();
        tokio::spawn(async move { s.tokens.add_tokens(&[chf("w", "big", 0, BIG)]).await })
    };
    let (pid, _) = wait_until_waiting(&mut observer, &big, "an add of 2^63").await;
    assert_eq!(wanted_mode(&mut observer, pid).await, "ExclusiveLock");
    let_go(&mut holder).await;
    assert_eq!(big.await.expect("add task"), Ok(1));

    // Held exclusive (a big writer), a small add and a small confirm wait.
    hold(&mut holder, "v", false).await;
    let small = {
        let s = s.clone();
        tokio::spawn(async move { s.tokens.add_tokens(&[chf("v", "b", 0, 1)]).await })
    };
    let (pid, _) = wait_until_waiting(&mut observer, &small, "a small add").await;
    assert_eq!(wanted_mode(&mut observer, pid).await, "ShareLock");
    let_go(&mut holder).await;
    assert_eq!(small.await.expect("add task"), Ok(1));
    hold(&mut holder, "v", false).await;
    let confirm = {
        let s = s.clone();
        tokio::spawn(async move {
            s.locks
                .confirm(&tx("t2"), &[pay("v", 4), pay("src", 5)], at(2))
                .await
        })
    };
    wait_until_waiting(&mut observer, &confirm, "a small confirm").await;
    let_go(&mut holder).await;
    assert!(confirm.await.expect("confirm task").is_ok());
    assert_eq!(balance(&s, "w").await, BIG - 1 + 5 + BIG);
    assert_eq!(balance(&s, "v").await, 1 + 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_add_into_a_big_wallet_lets_go_of_the_shared_lock_before_waiting() {
    let Some(db) = TestDb::create("a_small_add_into_a_big_wallet_lets_go").await else {
        return;
    };
    let backend = patient_backend(&db, LockStrategy::OnConflict, 4).await;
    let s = backend.stores();
    let mut holder = db.connection().await;
    let mut observer = db.connection().await;
    let off = NewToken {
        spendable: false,
        ..chf("off", "off", 0, BIG)
    };
    add(&s, &[chf("big", "big", 0, BIG), off]).await;
    funded(&s, "t1", "src", 3).await;

    // A small writer holds the lock of each big wallet shared. A small add or
    // confirm into it (and into a small wallet, whose key may come first) must
    // check the total, so it waits for the exclusive lock: holding no shared
    // balance lock meanwhile, only exclusive ones taken in key order.
    for (n, full) in ["big", "off"].into_iter().enumerate() {
        hold(&mut holder, full, true).await;
        let call = {
            let s = s.clone();
            let batch = [
                chf(full, &format!("add-{full}"), 0, 1),
                chf("small", &format!("add-{full}"), 1, 1),
            ];
            tokio::spawn(async move { s.tokens.add_tokens(&batch).await })
        };
        let (pid, held) = wait_until_waiting(&mut observer, &call, full).await;
        assert_eq!(
            wanted_mode(&mut observer, pid).await,
            "ExclusiveLock",
            "{full}"
        );
        assert!(
            held.iter().all(|mode| mode == "ExclusiveLock"),
            "{full}: the waiting add holds {held:?}"
        );
        let_go(&mut holder).await;
        assert_eq!(call.await.expect("add task"), Ok(2), "{full}");
        assert_eq!(
            balance(&s, "small").await,
            1 + u128::try_from(n).unwrap_or(0)
        );
    }
    hold(&mut holder, "big", true).await;
    let confirm = {
        let s = s.clone();
        tokio::spawn(async move {
            s.locks
                .confirm(&tx("t1"), &[pay("big", 2), pay("small", 1)], at(1))
                .await
        })
    };
    let (pid, held) = wait_until_waiting(&mut observer, &confirm, "a confirm").await;
    assert_eq!(wanted_mode(&mut observer, pid).await, "ExclusiveLock");
    assert!(
        held.iter().all(|mode| mode == "ExclusiveLock"),
        "the waiting confirm holds {held:?}"
    );
    let_go(&mut holder).await;
    assert!(confirm.await.expect("confirm task").is_ok());
    assert_eq!(balance(&s, "big").await, BIG + 1 + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_add_into_a_nearly_full_wallet_is_refused_when_it_would_overflow() {
    let Some(db) = TestDb::create("a_small_add_into_a_nearly_full_wallet").await else {
        return;
    };
    let backend = patient_backend(&db, LockStrategy::OnConflict, 2).await;
    let s = backend.stores();
    let off = NewToken {
        spendable: false,
        ..chf("off", "off", 0, u128::MAX - 5)
    };
    add(&s, &[chf("full", "full", 0, u128::MAX - 5), off]).await;
    for full in ["full", "off"] {
        // Every amount is small; the wallet's token is not.
        let refused = s.tokens.add_tokens(&[chf(full, "six", 0, 6)]).await;
        assert!(
            matches!(
                &refused,
                Err(TokenStoreError::BalanceOverflow { wallet: w, .. }) if w.as_str() == full
            ),
            "{full}: {refused:?}"
        );
        funded(&s, &format!("pay-{full}"), "src", 6).await;
        let refused = s
            .locks
            .confirm(&tx(&format!("pay-{full}")), &[pay(full, 6)], at(1))
            .await;
        assert!(
            matches!(&refused, Err(LockStoreError::BadOutputs { detail })
                if detail.contains(&format!("wallet {full} type CHF"))),
            "{full}: {refused:?}"
        );
        let filled = s
            .locks
            .confirm(
                &tx(&format!("pay-{full}")),
                &[pay(full, 5), pay("src", 1)],
                at(2),
            )
            .await;
        assert!(filled.is_ok(), "{full}: filling to 2^128 - 1: {filled:?}");
    }
    assert_eq!(balance(&s, "full").await, u128::MAX);
    let spendable = s.tokens.token(&token_id("pay-off", 0)).await;
    assert!(
        matches!(spendable, Ok(Some(ref t)) if t.quantity == amount(5)),
        "{spendable:?}"
    );
}

/// Waits until `n` sessions of this test's database other than `observer`'s
/// wait for a lock of `what` kind: `advisory` (a balance lock) or
/// `transactionid` (a row another transaction inserted, updated or deleted and
/// has not committed). Fails if a call finishes first (`finished`): it did not
/// wait.
async fn wait_until_n_wait(
    observer: &mut PgConnection,
    n: i64,
    what: &str,
    finished: impl Fn() -> bool,
) {
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND wait_event_type = 'Lock' AND wait_event = $1",
        )
        .bind(what)
        .fetch_one(&mut *observer)
        .await
        .expect("pg_stat_activity");
        if waiting >= n {
            return;
        }
        assert!(!finished(), "a call finished before {n} waited for {what}");
        tokio::task::yield_now().await;
    }
}

/// The SQLSTATE of a failed statement.
fn sqlstate<T: std::fmt::Debug>(result: Result<T, sqlx::Error>) -> String {
    match result {
        Err(sqlx::Error::Database(e)) => e.code().map(|c| c.into_owned()).unwrap_or_default(),
        other => panic!("expected a database error, got {other:?}"),
    }
}

/// The scenario of a deadlock the review of migration 0007 found: a small add
/// whose batch holds a confirm's output id `(d, 0)` and, after it in key order,
/// the confirm's input `(zz-x, 0)`, beside the confirm, both under the shared
/// balance lock. A plain transaction's uncommitted `(m, 0)` between them holds
/// the add after it has inserted `(d, 0)`; the confirm then waits to insert
/// `(d, 0)`. When `(m, 0)` commits, the add reaches `(zz-x, 0)`: had the confirm
/// already marked it spent (its update uncommitted), the add would wait for the
/// confirm and the confirm for the add (40P01). The confirm inserts its outputs
/// first, so the add passes its input (only row-locked), finds `(m, 0)` another
/// token (a conflict: nothing written), and the confirm goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_of_a_confirms_output_id_and_input_does_not_deadlock_with_it() {
    let Some(db) = TestDb::create("an_add_of_a_confirms_output_id_and_input").await else {
        return;
    };
    let backend = patient_backend(&db, LockStrategy::OnConflict, 4).await;
    let s = backend.stores();
    let mut holder = db.connection().await;
    let mut observer = db.connection().await;
    add(&s, &[chf("w", "zz-x", 0, 5)]).await;
    let won = s.locks.claim(&tx("d"), &token_id("zz-x", 0), T0).await;
    assert_eq!(won, Ok(ClaimVerdict::Won));
    sqlx::raw_sql(
        "BEGIN;
         INSERT INTO tokens (tx_id, idx, wallet, token_type, amount, spendable)
         VALUES ('m', 0, 'w', 'CHF', 2, TRUE)",
    )
    .execute(&mut holder)
    .await
    .expect("the uncommitted (m, 0)");

    let adding = {
        let s = s.clone();
        tokio::spawn(async move {
            s.tokens
                .add_tokens(&[
                    chf("w", "d", 0, 5),
                    chf("w", "m", 0, 1),
                    chf("w", "zz-x", 0, 5),
                ])
                .await
        })
    };
    wait_until_n_wait(&mut observer, 1, "transactionid", || adding.is_finished()).await;
    let confirming = {
        let s = s.clone();
        tokio::spawn(async move { s.locks.confirm(&tx("d"), &[pay("w", 5)], at(1)).await })
    };
    wait_until_n_wait(&mut observer, 2, "transactionid", || {
        adding.is_finished() || confirming.is_finished()
    })
    .await;
    let_go(&mut holder).await;

    let added = adding.await.expect("add task");
    assert!(
        matches!(&added, Err(TokenStoreError::Conflict { token, .. }) if token.starts_with("m")),
        "{added:?}"
    );
    let confirmed = confirming.await.expect("confirm task");
    assert!(
        matches!(&confirmed, Ok(c) if c.spent == vec![token_id("zz-x", 0)]),
        "{confirmed:?}"
    );
    assert_eq!(balance(&s, "w").await, 5 + 2);
}

/// An add that commits a token of a confirm's output id while the confirm waits
/// to insert it: the confirm writes nothing and answers that its outputs differ
/// from what is stored, a typed refusal (not a unique-violation fault); its
/// input stays unspent and claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_whose_output_id_an_add_commits_meanwhile_is_told_its_outputs_differ() {
    let Some(db) = TestDb::create("a_confirm_whose_output_id_an_add_commits").await else {
        return;
    };
    let backend = patient_backend(&db, LockStrategy::OnConflict, 4).await;
    let s = backend.stores();
    let mut holder = db.connection().await;
    let mut observer = db.connection().await;
    funded(&s, "d", "w", 5).await;
    sqlx::raw_sql(
        "BEGIN;
         INSERT INTO tokens (tx_id, idx, wallet, token_type, amount, spendable)
         VALUES ('d', 0, 'w', 'CHF', 7, TRUE)",
    )
    .execute(&mut holder)
    .await
    .expect("the uncommitted (d, 0)");
    let confirming = {
        let s = s.clone();
        tokio::spawn(async move { s.locks.confirm(&tx("d"), &[pay("w", 5)], at(1)).await })
    };
    wait_until_n_wait(&mut observer, 1, "transactionid", || {
        confirming.is_finished()
    })
    .await;
    let_go(&mut holder).await;

    let confirmed = confirming.await.expect("confirm task");
    assert!(
        matches!(&confirmed, Err(LockStoreError::OutputsDiffer { tx: t, .. }) if *t == tx("d")),
        "{confirmed:?}"
    );
    assert_eq!(balance(&s, "w").await, 5 + 7, "the input is not spent");
    let again = s.locks.claim(&tx("e"), &token_id("d-in", 0), T0).await;
    assert_eq!(
        again,
        Ok(ClaimVerdict::Contended),
        "the input is still claimed"
    );
}

/// The read of big tokens follows the lock wait: a writer holding the pair's
/// lock exclusive stores a token of 2^128 - 2 while a small add and a small
/// confirm into the pair wait for it. Once it commits, both must see the token
/// (so fall back to the exclusive lock and the check) and are refused: a read
/// with a snapshot from before the wait would let them add 2 each. The function
/// is VOLATILE, so its statements take snapshots of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_calls_waiting_for_the_lock_see_the_big_token_its_holder_stored() {
    let Some(db) = TestDb::create("small_calls_waiting_see_the_big_token").await else {
        return;
    };
    let backend = patient_backend(&db, LockStrategy::OnConflict, 4).await;
    let s = backend.stores();
    let mut holder = db.connection().await;
    let mut observer = db.connection().await;
    let volatility: String = sqlx::query_scalar(
        "SELECT provolatile::TEXT FROM pg_proc WHERE proname = 'holdfast_lock_balances'",
    )
    .fetch_one(&mut observer)
    .await
    .expect("pg_proc");
    assert_eq!(volatility, "v");
    funded(&s, "t", "src", 2).await;

    hold(&mut holder, "w", false).await;
    sqlx::query(
        "INSERT INTO tokens (tx_id, idx, wallet, token_type, amount, spendable)
         VALUES ('huge', 0, 'w', 'CHF', $1::NUMERIC, TRUE)",
    )
    .bind((u128::MAX - 1).to_string())
    .execute(&mut holder)
    .await
    .expect("the big token, uncommitted");
    let adding = {
        let s = s.clone();
        tokio::spawn(async move { s.tokens.add_tokens(&[chf("w", "small", 0, 2)]).await })
    };
    let confirming = {
        let s = s.clone();
        tokio::spawn(async move { s.locks.confirm(&tx("t"), &[pay("w", 2)], at(1)).await })
    };
    wait_until_n_wait(&mut observer, 2, "advisory", || {
        adding.is_finished() || confirming.is_finished()
    })
    .await;
    let_go(&mut holder).await;

    let added = adding.await.expect("add task");
    assert!(
        matches!(&added, Err(TokenStoreError::BalanceOverflow { wallet: w, .. }) if w.as_str() == "w"),
        "{added:?}"
    );
    let confirmed = confirming.await.expect("confirm task");
    assert!(
        matches!(&confirmed, Err(LockStoreError::BadOutputs { detail })
            if detail.contains("wallet w type CHF")),
        "{confirmed:?}"
    );
    assert_eq!(balance(&s, "w").await, u128::MAX - 1);
}

/// On a database whose transactions default to REPEATABLE READ (where a read
/// after a lock wait would use the snapshot from before it), holdfast's sessions
/// still run at READ COMMITTED: adds and confirms go through, and a connection
/// with the adapter's session settings shows the level. A direct call of
/// `holdfast_lock_balances` at REPEATABLE READ is refused (SQLSTATE 25000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_run_at_read_committed_whatever_the_database_defaults_to() {
    let Some(db) = TestDb::create("sessions_run_at_read_committed").await else {
        return;
    };
    let mut admin = PgConnection::connect(&db.admin_url)
        .await
        .expect("admin connection");
    sqlx::query(AssertSqlSafe(format!(
        "ALTER DATABASE \"{}\" SET default_transaction_isolation = 'repeatable read'",
        db.name
    )))
    .execute(&mut admin)
    .await
    .expect("ALTER DATABASE");
    let _ = admin.close().await;

    let mut plain = db.connection().await;
    let level: String = sqlx::query_scalar("SHOW transaction_isolation")
        .fetch_one(&mut plain)
        .await
        .expect("SHOW");
    assert_eq!(level, "repeatable read", "the database default");
    let options: sqlx::postgres::PgConnectOptions = db.url.parse().expect("the URL");
    let mut adapted = options
        .options(holdfast_adapters_postgres::session_settings(
            &PgOptions::default(),
        ))
        .connect()
        .await
        .expect("a connection with the adapter's settings");
    let level: String = sqlx::query_scalar("SHOW transaction_isolation")
        .fetch_one(&mut adapted)
        .await
        .expect("SHOW");
    assert_eq!(level, "read committed", "with the session settings");

    let backend = patient_backend(&db, LockStrategy::OnConflict, 2).await;
    let s = backend.stores();
    funded(&s, "t", "src", 3).await;
    let confirmed = s.locks.confirm(&tx("t"), &[pay("w", 3)], at(1)).await;
    assert!(confirmed.is_ok(), "{confirmed:?}");
    assert_eq!(balance(&s, "w").await, 3);

    let refused =
        sqlx::query_scalar::<_, bool>("SELECT holdfast_lock_balances('{w}', '{CHF}', '{1}')")
            .fetch_one(&mut plain)
            .await;
    assert_eq!(sqlstate(refused), "25000");
}

/// Direct SQL callers: amounts that are not integers of 1 to 39 digits, arrays
/// of different lengths and NULL wallets or types are refused (SQLSTATE 22023)
/// by `holdfast_lock_balances` and `holdfast_confirm` alike, before any lock.
/// `9223372036854775807.5` would otherwise count as small and be stored as 2^63.
#[tokio::test]
async fn direct_calls_with_bad_amounts_or_arrays_are_refused() {
    let Some(db) = TestDb::create("direct_calls_with_bad_amounts").await else {
        return;
    };
    let _backend = patient_backend(&db, LockStrategy::OnConflict, 1).await;
    let mut conn = db.connection().await;
    for (wallets, types, amounts) in [
        (vec!["w"], vec!["CHF"], vec!["9223372036854775807.5"]),
        (vec!["w"], vec!["CHF"], vec!["-1"]),
        (vec!["w"], vec!["CHF"], vec!["1e3"]),
        (vec!["w"], vec!["CHF"], vec![""]),
        // One amount with a comma reads like two when the amounts are joined.
        (vec!["w"], vec!["CHF"], vec!["1,2"]),
        (vec!["w", "v"], vec!["CHF", "CHF"], vec!["1,2", ""]),
        (vec!["w", "v"], vec!["CHF", "CHF"], vec!["1", ",2"]),
        (vec!["w"], vec!["CHF"], vec!["x"]),
        (
            vec!["w"],
            vec!["CHF"],
            vec!["1234567890123456789012345678901234567890"],
        ),
        (vec!["w", "v"], vec!["CHF"], vec!["1", "2"]),
        (vec!["w"], vec!["CHF"], vec!["1", "2"]),
    ] {
        let locked = sqlx::query_scalar::<_, bool>("SELECT holdfast_lock_balances($1, $2, $3)")
            .bind(&wallets)
            .bind(&types)
            .bind(&amounts)
            .fetch_one(&mut conn)
            .await;
        assert_eq!(
            sqlstate(locked),
            "22023",
            "lock {wallets:?} {types:?} {amounts:?}"
        );
        let confirmed = sqlx::query("SELECT * FROM holdfast_confirm('c', 1, $1, $2, $3)")
            .bind(&wallets)
            .bind(&types)
            .bind(&amounts)
            .fetch_all(&mut conn)
            .await;
        assert_eq!(
            sqlstate(confirmed),
            "22023",
            "confirm {wallets:?} {types:?} {amounts:?}"
        );
    }
    let null_type = sqlx::query_scalar::<_, bool>(
        "SELECT holdfast_lock_balances('{w}', ARRAY[NULL::TEXT], '{1}')",
    )
    .fetch_one(&mut conn)
    .await;
    assert_eq!(sqlstate(null_type), "22023");
    for call in [
        "SELECT holdfast_lock_balances('{w,v}', '{CHF,CHF}', ARRAY['1', NULL])",
        "SELECT count(*) > 0 FROM holdfast_confirm('c', 1, '{w}', '{CHF}', ARRAY[NULL::TEXT])",
    ] {
        let null_amount = sqlx::query_scalar::<_, bool>(call)
            .fetch_one(&mut conn)
            .await;
        assert_eq!(sqlstate(null_amount), "22023", "{call}");
    }
    let fine = sqlx::query_scalar::<_, bool>(
        "SELECT holdfast_lock_balances('{w}', '{CHF}', '{340282366920938463463374607431768211455}')",
    )
    .fetch_one(&mut conn)
    .await
    .expect("39 digits");
    assert!(fine, "2^128 - 1 is big: exclusive");
}

/// What one racing call did: its amount, and whether it was added.
type Outcome = (u128, bool);

/// Runs `adds` (wallet `dst`, amounts) and `confirms` (each paying its amount
/// into `dst` from a wallet of its own) all at once from two backends, and
/// answers what each did. Any answer but done or refused as an overflow of
/// `dst` (a deadlock, say) fails the test.
async fn race(db: &TestDb, adds: &[u128], confirms: &[u128]) -> (Stores, Vec<Outcome>) {
    let backends: Vec<PgBackend> = vec![
        patient_backend(db, LockStrategy::OnConflict, 8).await,
        patient_backend(db, LockStrategy::SkipLocked, 8).await,
    ];
    let instances: Vec<Stores> = backends.iter().map(PgBackend::stores).collect();
    let s = instances[0].clone();
    for (i, value) in confirms.iter().enumerate() {
        funded(&s, &format!("c{i}"), &format!("src{i}"), *value).await;
    }
    let barrier = Arc::new(Barrier::new(adds.len() + confirms.len()));
    let mut tasks: Vec<JoinHandle<Outcome>> = Vec::new();
    for (i, value) in adds.iter().copied().enumerate() {
        let s = instances[i % 2].clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            match s.tokens.add_tokens(&[chf("dst", "a", index, value)]).await {
                Ok(1) => (value, true),
                Err(TokenStoreError::BalanceOverflow { wallet: w, .. }) if w.as_str() == "dst" => {
                    (value, false)
                }
                other => panic!("add {i} of {value}: {other:?}"),
            }
        }));
    }
    for (i, value) in confirms.iter().copied().enumerate() {
        let s = instances[(i + 1) % 2].clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            match s
                .locks
                .confirm(&tx(&format!("c{i}")), &[pay("dst", value)], at(1))
                .await
            {
                Ok(_) => (value, true),
                Err(LockStoreError::BadOutputs { detail })
                    if detail.contains("wallet dst type CHF") =>
                {
                    (value, false)
                }
                other => panic!("confirm {i} of {value}: {other:?}"),
            }
        }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("racing task panicked"));
    }
    (s, outcomes)
}

/// The total `dst` ends with is `start` plus what was added, at most 2^128 - 1,
/// and every refused call would have lifted it past 2^128 - 1 (totals only grew).
async fn check_race(s: &Stores, start: u128, outcomes: &[Outcome]) -> u128 {
    let mut total = start;
    for (value, added) in outcomes {
        if *added {
            total = total
                .checked_add(*value)
                .expect("the added amounts overflow");
        }
    }
    assert_eq!(balance(s, "dst").await, total, "{outcomes:?}");
    for (value, added) in outcomes {
        assert!(
            *added || total.checked_add(*value).is_none(),
            "{value} was refused though it fit: {outcomes:?}"
        );
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_and_small_adds_and_confirms_at_once_never_overflow_a_wallet() {
    let Some(db) = TestDb::create("big_and_small_adds_and_confirms_at_once").await else {
        return;
    };
    // Near 2^127: two fit, a third never. Small ones interleaved: whether they
    // come before the big ones (and keep the second out) or after (and meet a
    // full wallet) is the scheduler's choice; the checks hold either way.
    let near = (1u128 << 127) - 1;
    let adds = [near, 7, near, BIG - 1, near, 3, near];
    let confirms = [near, 5, near, BIG - 1];
    let (s, outcomes) = race(&db, &adds, &confirms).await;
    let total = check_race(&s, 0, &outcomes).await;
    let big_ones = outcomes.iter().filter(|(v, a)| *a && *v == near).count();
    assert!(
        (1..=2).contains(&big_ones),
        "{big_ones} of near 2^127 added, total {total}: {outcomes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_adds_and_confirms_into_a_full_big_wallet_fall_back_without_deadlock() {
    let Some(db) = TestDb::create("small_adds_into_a_full_big_wallet").await else {
        return;
    };
    // Room for five of 20 beside a big token: exactly five of twelve small calls
    // fit, whatever their order, all having fallen back to the exclusive lock.
    let backend = patient_backend(&db, LockStrategy::OnConflict, 2).await;
    add(&backend.stores(), &[chf("dst", "full", 0, u128::MAX - 100)]).await;
    let (s, outcomes) = race(&db, &[20; 8], &[20; 4]).await;
    let total = check_race(&s, u128::MAX - 100, &outcomes).await;
    assert_eq!(total, u128::MAX, "{outcomes:?}");
    assert_eq!(
        outcomes.iter().filter(|(_, a)| *a).count(),
        5,
        "{outcomes:?}"
    );
}

/// Tokens `a` (5 CHF) and `b` (7 CHF) of wallet `src`, both claimed by `c`: a
/// confirm of `c` paying 12 spends them.
async fn two_inputs_of_c(s: &Stores) -> (TokenId, TokenId) {
    add(s, &[chf("src", "a", 0, 5), chf("src", "b", 0, 7)]).await;
    let (a, b) = (token_id("a", 0), token_id("b", 0));
    for input in [&a, &b] {
        let won = s.locks.claim(&tx("c"), input, T0).await;
        assert_eq!(won, Ok(ClaimVerdict::Won), "claim of {input:?}");
    }
    (a, b)
}

/// Waits until a `holdfast` session of this database waits for a row lock
/// (polled on `pg_stat_activity`, not timed). Fails if `call` finishes first.
async fn wait_for_row_lock<T>(observer: &mut PgConnection, call: &JoinHandle<T>, what: &str) {
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'holdfast'
               AND wait_event_type = 'Lock' AND wait_event IN ('transactionid', 'tuple')",
        )
        .fetch_one(&mut *observer)
        .await
        .expect("pg_stat_activity");
        if waiting > 0 {
            return;
        }
        assert!(!call.is_finished(), "{what}: finished without waiting");
        tokio::task::yield_now().await;
    }
}

/// A select of `c` still running gives `b` back while `c`'s confirm waits to lock
/// its inputs (a claimer holds `a` share-locked): the confirm counts only what
/// is still selected once it holds the rows, so outputs of 12 are refused as
/// not conserved and nothing is written, where counting `b` and spending only
/// `a` would have minted 7 CHF.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_while_a_confirm_waits_takes_the_token_out_of_its_inputs() {
    let Some(db) = TestDb::create("a_give_back_while_a_confirm_waits").await else {
        return;
    };
    let backend = patient_backend(&db, LockStrategy::OnConflict, 4).await;
    let s = backend.stores();
    let (_, b) = two_inputs_of_c(&s).await;
    let mut claimer = db.connection().await;
    let mut observer = db.connection().await;
    exec(&mut claimer, "BEGIN").await;
    exec(
        &mut claimer,
        "SELECT 1 FROM tokens WHERE tx_id = 'a' FOR SHARE",
    )
    .await;

    let confirm = {
        let s = backend.stores();
        tokio::spawn(async move { s.locks.confirm(&tx("c"), &[pay("dst", 12)], at(1)).await })
    };
    wait_for_row_lock(&mut observer, &confirm, "the confirm").await;
    let given_back = tokio::time::timeout(NO_WAIT, s.locks.release_tokens(&tx("c"), &[b]))
        .await
        .expect("a give-back does not wait for the confirm");
    assert_eq!(given_back, Ok(1));
    exec(&mut claimer, "COMMIT").await;

    let confirmed = confirm.await.expect("confirm task");
    assert!(
        matches!(&confirmed, Err(LockStoreError::NotConserved(u)) if u.inputs == "5" && u.outputs == "12"),
        "{confirmed:?}"
    );
    assert_eq!(balance(&s, "src").await, 12, "nothing spent");
    assert_eq!(balance(&s, "dst").await, 0, "nothing minted");
}

/// `c`'s lock rows are gone (the sweep), and its confirm waits for the payee's
/// balance lock after counting `a` and `b`; a give-back of `b` commits
/// meanwhile, waiting for nothing. The confirm still spends both inputs it
/// counted (rows it holds): the 12 CHF it pays come out of `src`, never out of
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_spends_every_input_it_counted_though_its_selection_goes_meanwhile() {
    let Some(db) = TestDb::create("a_confirm_spends_every_input_it_counted").await else {
        return;
    };
    let backend = patient_backend(&db, LockStrategy::OnConflict, 4).await;
    let s = backend.stores();
    let (a, b) = two_inputs_of_c(&s).await;
    let mut holder = db.connection().await;
    let mut observer = db.connection().await;
    exec(
        &mut observer,
        "DELETE FROM token_locks WHERE consumer = 'c'",
    )
    .await;
    hold(&mut holder, "dst", false).await;

    let confirm = {
        let s = backend.stores();
        tokio::spawn(async move { s.locks.confirm(&tx("c"), &[pay("dst", 12)], at(1)).await })
    };
    wait_until_waiting(&mut observer, &confirm, "the confirm").await;
    let given_back = tokio::time::timeout(
        NO_WAIT,
        s.locks.release_tokens(&tx("c"), std::slice::from_ref(&b)),
    )
    .await
    .expect("a give-back does not wait for the confirm");
    assert!(given_back.is_ok(), "{given_back:?}");
    let_go(&mut holder).await;

    let confirmed = confirm.await.expect("confirm task").expect("confirmed");
    assert_eq!(confirmed.spent, vec![a, b]);
    assert_eq!(balance(&s, "src").await, 0, "both inputs spent");
    assert_eq!(balance(&s, "dst").await, 12);
}
