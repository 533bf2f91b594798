//! SQLite-specific behaviour beyond the conformance suite: schema versions, corrupt
//! rows, tolerant timestamps, busy timeouts and the lockout after one, readers
//! beside the writer, open errors.

use crate::common;

use std::time::Duration;

use holdfast_adapters_sqlite::{
    BusyWaits, OpenError, SCHEMA_VERSION, SqliteBackend, SqliteOptions,
};
use holdfast_domain::{
    ClaimVerdict, Precision, Quantity, Timestamp, TokenId, TokenType, TxId, WalletId,
};
use holdfast_ports::{
    BandQuery, CandidateQuery, CandidateRead, LockStoreError, NewToken, StoreFault, TokenStore,
    TokenStoreError,
};
use rusqlite::Connection;

use common::TempDb;

const T0: Timestamp = Timestamp(1_796_025_600_000);

fn token(tx: &str, index: u32, value: u128) -> NewToken {
    NewToken {
        id: TokenId::new(TxId::new(tx).expect("tx"), index),
        wallet: WalletId::new("w").expect("wallet"),
        token_type: TokenType::new("CHF").expect("type"),
        quantity: Quantity::new(value, Precision::MAX).expect("amount"),
        spendable: true,
    }
}

fn first_page() -> CandidateQuery {
    CandidateQuery {
        wallet: WalletId::new("w").expect("wallet"),
        token_type: TokenType::new("CHF").expect("type"),
        after: None,
        limit: 10,
    }
}

fn raw(file: &TempDb) -> Connection {
    let conn = Connection::open(file.path()).expect("raw connection");
    conn.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    conn
}

#[tokio::test]
async fn reopening_applies_migrations_once_and_a_newer_schema_is_refused() {
    let file = TempDb::new();
    drop(file.open().await);
    drop(file.open().await);
    let conn = raw(&file);
    let versions: Vec<i64> = conn
        .prepare("SELECT version FROM holdfast_schema ORDER BY version")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    conn.execute(
        "INSERT INTO holdfast_schema (version, name, applied_at) VALUES (99, 'future', '2030-01-01T00:00:00.000Z')",
        [],
    )
    .expect("insert");
    let err = SqliteBackend::open(&file.url(), SqliteOptions::default())
        .await
        .expect_err("a newer schema must be refused");
    assert_eq!(
        err,
        OpenError::SchemaTooNew {
            found: 99,
            known: SCHEMA_VERSION
        }
    );
    assert!(err.to_string().contains("upgrade holdfast"), "{err}");
}

#[tokio::test]
async fn a_corrupt_amount_is_a_corrupt_fault_naming_the_row() {
    let file = TempDb::new();
    let s = file.open().await.stores();
    s.tokens
        .add_tokens(&[token("good", 0, 5), token("bad", 3, 7)])
        .await
        .expect("add");
    raw(&file)
        .execute(
            "UPDATE tokens SET amount = '0000000000000000000000000000000G' WHERE tx = 'bad'",
            [],
        )
        .expect("corrupt the row");
    let id = TokenId::new(TxId::new("bad").expect("tx"), 3);
    let errors = [
        s.tokens.candidates(&first_page()).await.map(|_| ()),
        s.tokens
            .balance(&first_page().wallet, &first_page().token_type)
            .await
            .map(|_| ()),
        s.tokens.token(&id).await.map(|_| ()),
    ];
    for result in errors {
        match result {
            Err(TokenStoreError::Fault(StoreFault::Corrupt(msg))) => {
                assert!(msg.contains("tokens row bad:3"), "{msg}");
                assert!(msg.contains("0000000000000000000000000000000G"), "{msg}");
            }
            other => panic!("expected a Corrupt fault, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn stored_timestamps_in_other_layouts_are_read_and_junk_is_refused() {
    let file = TempDb::new();
    let s = file.open().await.stores();
    s.tokens.add_tokens(&[token("t", 0, 1)]).await.expect("add");
    let consumer = TxId::new("c").expect("tx");
    let tok = TokenId::new(TxId::new("t").expect("tx"), 0);
    assert_eq!(
        s.locks.claim(&consumer, &tok, T0).await,
        Ok(ClaimVerdict::Won)
    );
    let conn = raw(&file);
    let stored: String = conn
        .query_row("SELECT created_at FROM locks", [], |r| r.get(0))
        .expect("created_at");
    assert_eq!(
        stored, "2026-11-30T08:00:00.000Z",
        "the one documented write form"
    );
    for layout in [
        "2026-11-30 08:00:00",
        "2026-11-30T08:00:00Z",
        "2026-11-30T09:00:00.000+01:00",
        "2026-11-30T08:00:00.000000",
    ] {
        conn.execute("UPDATE locks SET created_at = ?1", [layout])
            .expect("update");
        let locks = s.locks.list_locks().await.expect("list_locks");
        assert_eq!(locks[0].created_at, T0, "{layout}");
    }
    conn.execute("UPDATE locks SET created_at = 'last tuesday'", [])
        .expect("update");
    match s.locks.list_locks().await {
        Err(LockStoreError::Fault(StoreFault::Corrupt(msg))) => {
            assert!(msg.contains("locks row t:0"), "{msg}");
            assert!(msg.contains("\"last tuesday\""), "{msg}");
        }
        other => panic!("expected a Corrupt fault, got {other:?}"),
    }
}

#[tokio::test]
async fn a_sweep_passes_over_corrupt_lock_rows_and_still_deletes_the_expired_valid_ones() {
    let file = TempDb::new();
    let s = file.open().await.stores();
    let ids: Vec<TokenId> = ["old-a", "junk-time", "old-c", "blob-time", "fresh"]
        .iter()
        .map(|tx| TokenId::new(TxId::new(*tx).expect("tx"), 0))
        .collect();
    let batch: Vec<NewToken> = ids.iter().map(|id| token(id.tx.as_str(), 0, 1)).collect();
    s.tokens.add_tokens(&batch).await.expect("add");
    let later = Timestamp(T0.0 + 3_600_000);
    for id in &ids {
        let when = if id.tx.as_str() == "fresh" { later } else { T0 };
        let consumer = TxId::new(format!("holder-{}", id.tx.as_str())).expect("tx");
        assert_eq!(
            s.locks.claim(&consumer, id, when).await,
            Ok(ClaimVerdict::Won)
        );
    }
    let conn = raw(&file);
    conn.execute(
        "UPDATE locks SET created_at = 'last tuesday' WHERE tx = 'junk-time'",
        [],
    )
    .expect("corrupt a time");
    conn.execute(
        "UPDATE locks SET created_at = x'00ff' WHERE tx = 'blob-time'",
        [],
    )
    .expect("corrupt a type");

    // Diagnostics still report the corruption, naming the row.
    match s.locks.list_locks().await {
        Err(LockStoreError::Fault(StoreFault::Corrupt(msg))) => {
            assert!(
                msg.contains("locks row junk-time:0") || msg.contains("locks row blob-time:0"),
                "{msg}"
            );
        }
        other => panic!("expected a Corrupt fault, got {other:?}"),
    }
    // The sweep deletes the two expired valid locks and passes over the rest.
    let report = s
        .locks
        .sweep(holdfast_domain::SweepRule {
            cutoff: later.saturating_sub(Duration::from_secs(60)),
        })
        .await
        .expect("a corrupt row does not stop the sweep");
    assert!(report.leader);
    assert_eq!((report.expired, report.released_by_status), (2, 0));
    let left: Vec<String> = conn
        .prepare("SELECT tx FROM locks ORDER BY tx")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(
        left,
        ["blob-time", "fresh", "junk-time"],
        "unreadable rows are never deleted; the fresh lock stays"
    );
    // The next sweep is not stuck either.
    assert_eq!(
        s.locks
            .sweep(holdfast_domain::SweepRule {
                cutoff: later.saturating_sub(Duration::from_secs(60)),
            })
            .await
            .map(|r| r.expired),
        Ok(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_write_lock_is_busy_after_the_timeout_and_readers_still_read() {
    let file = TempDb::new();
    let options = SqliteOptions {
        busy_timeout: Duration::from_millis(50),
        readers: 2,
    };
    let backend = SqliteBackend::open(&file.url(), options)
        .await
        .expect("open");
    let s = backend.stores();
    s.tokens.add_tokens(&[token("t", 0, 1)]).await.expect("add");

    let mut other = raw(&file);
    let writer = other
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .expect("take the write lock");
    writer
        .execute("INSERT INTO tx_statuses (tx, status, recorded_at) VALUES ('x', 'pending', '2026-11-30T08:00:00.000Z')", [])
        .expect("uncommitted write");

    let consumer = TxId::new("c").expect("tx");
    let tok = TokenId::new(TxId::new("t").expect("tx"), 0);
    match s.locks.claim(&consumer, &tok, T0).await {
        Err(LockStoreError::Fault(StoreFault::Busy(msg))) => {
            assert!(msg.contains("locked"), "{msg}")
        }
        other => panic!("expected Busy while another connection writes, got {other:?}"),
    }
    // WAL: reads proceed beside the writer and do not see its uncommitted row.
    assert_eq!(
        s.tokens
            .candidates(&first_page())
            .await
            .expect("read")
            .len(),
        1
    );
    assert_eq!(
        s.statuses.status(&TxId::new("x").expect("tx")).await,
        Ok(None)
    );

    writer.commit().expect("commit");
    assert_eq!(
        s.locks.claim(&consumer, &tok, T0).await,
        Ok(ClaimVerdict::Won)
    );
}

#[tokio::test]
async fn open_errors_are_typed() {
    let bad = SqliteBackend::open("mysql://root:secret@db/x", SqliteOptions::default()).await;
    assert!(
        matches!(bad, Err(OpenError::InvalidLocation { .. })),
        "{bad:?}"
    );
    let opts = SqliteOptions {
        readers: 0,
        ..SqliteOptions::default()
    };
    let bad = SqliteBackend::open("sqlite::memory:", opts).await;
    assert!(
        matches!(
            bad,
            Err(OpenError::InvalidOption {
                option: "readers",
                ..
            })
        ),
        "{bad:?}"
    );

    let file = TempDb::new();
    let missing_dir = file.dir().join("no/such/dir/h.db");
    let bad =
        SqliteBackend::open(&missing_dir.display().to_string(), SqliteOptions::default()).await;
    assert!(matches!(bad, Err(OpenError::Unavailable { .. })), "{bad:?}");

    let junk = file.dir().join("junk.db");
    std::fs::write(&junk, vec![b'x'; 4096]).expect("write junk");
    let bad = SqliteBackend::open(
        &format!("sqlite://{}", junk.display()),
        SqliteOptions::default(),
    )
    .await;
    match bad {
        Err(OpenError::Unavailable { reason, .. }) => {
            assert!(reason.contains("not a database"), "{reason}")
        }
        other => panic!("expected Unavailable for a junk file, got {other:?}"),
    }
}

#[tokio::test]
async fn in_memory_databases_are_private_and_work() {
    let a = SqliteBackend::open_in_memory()
        .await
        .expect("open")
        .stores();
    let b = SqliteBackend::open_in_memory()
        .await
        .expect("open")
        .stores();
    a.tokens.add_tokens(&[token("t", 0, 3)]).await.expect("add");
    assert_eq!(
        a.tokens
            .candidates(&first_page())
            .await
            .expect("read")
            .len(),
        1
    );
    assert!(
        b.tokens
            .candidates(&first_page())
            .await
            .expect("read")
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_waits_for_a_lock_released_within_the_timeout() {
    let file = TempDb::new();
    let options = SqliteOptions {
        busy_timeout: Duration::from_secs(5),
        readers: 1,
    };
    let backend = SqliteBackend::open(&file.url(), options)
        .await
        .expect("open");
    let s = backend.stores();
    s.tokens.add_tokens(&[token("t", 0, 1)]).await.expect("add");

    // Another connection (as another process would) holds the write lock for a
    // while, then commits: the claim waits for it instead of failing.
    let (held, release) = std::sync::mpsc::channel::<()>();
    let path = file.path();
    let holder = std::thread::spawn(move || {
        let mut other = Connection::open(path).expect("raw connection");
        let tx = other
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .expect("take the write lock");
        held.send(()).expect("signal");
        // sleep: the scenario: the other connection holds the write lock for 150 ms, within the
        // busy timeout, so the claim must wait for it.
        std::thread::sleep(Duration::from_millis(150));
        tx.commit().expect("commit");
    });
    release.recv().expect("lock taken");
    let consumer = TxId::new("c").expect("tx");
    let tok = TokenId::new(TxId::new("t").expect("tx"), 0);
    assert_eq!(
        s.locks.claim(&consumer, &tok, T0).await,
        Ok(ClaimVerdict::Won)
    );
    holder.join().expect("holder");
}

/// Busy, as a write under another connection's write lock answers it.
fn is_busy<T: std::fmt::Debug>(result: &Result<T, LockStoreError>) -> bool {
    matches!(result, Err(LockStoreError::Fault(StoreFault::Busy(_))))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_select_against_a_file_locked_elsewhere_waits_out_one_busy_timeout_not_one_per_call() {
    let file = TempDb::new();
    let options = SqliteOptions {
        busy_timeout: Duration::from_millis(200),
        readers: 2,
    };
    let backend = SqliteBackend::open(&file.url(), options)
        .await
        .expect("open");
    let s = backend.stores();
    let funding: Vec<NewToken> = (0..4).map(|i| token("f", i, 10)).collect();
    s.tokens.add_tokens(&funding).await.expect("add");

    // Another connection holds the write lock for longer than the whole select.
    let mut other = raw(&file);
    let holder = other
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .expect("take the write lock");

    // The store calls of a select that cannot get the lock: a read-and-claim
    // per fetch (one and five immediate retries), the balance, a claim, a
    // release.
    let me = TxId::new("c").expect("tx");
    let read = CandidateRead::Page(first_page());
    for _ in 0..6 {
        let chooser: holdfast_ports::Chooser =
            Box::new(|page| page.iter().take(2).map(|c| c.id.clone()).collect());
        let fetched = s.locks.read_and_claim(&me, &read, T0, chooser).await;
        assert!(is_busy(&fetched), "{fetched:?}");
    }
    // WAL: the balance is read beside the other writer.
    let balance = s
        .tokens
        .balance_for(&first_page().wallet, &first_page().token_type, &me)
        .await
        .expect("a read needs no write lock");
    assert_eq!(balance, Quantity::new(40, Precision::MAX).expect("amount"));
    let claimed = s.locks.claim(&me, &funding[0].id, T0).await;
    assert!(is_busy(&claimed), "{claimed:?}");
    let released = s.locks.release_tokens(&me, &[funding[0].id.clone()]).await;
    assert!(is_busy(&released), "{released:?}");
    // One busy timeout waited out; every later write tried for the lock
    // briefly, and the read in between did not end that.
    assert_eq!(
        backend.busy_waits(),
        BusyWaits {
            waited: 8,
            waited_out: 1,
            cut_short: 7
        }
    );

    // The lock is free again: the next write gets it, and that ends the
    // memory, so a lock held again is waited out in full once more.
    holder.rollback().expect("let go of the write lock");
    assert_eq!(
        s.locks.claim(&me, &funding[0].id, T0).await,
        Ok(ClaimVerdict::Won)
    );
    let holder = other
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .expect("take the write lock again");
    let claimed = s.locks.claim(&me, &funding[1].id, T0).await;
    assert!(is_busy(&claimed), "{claimed:?}");
    assert_eq!(
        backend.busy_waits(),
        BusyWaits {
            waited: 9,
            waited_out: 2,
            cut_short: 7
        }
    );
    holder.rollback().expect("let go of the write lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_for_less_than_the_busy_timeout_is_waited_for_in_full() {
    let file = TempDb::new();
    let options = SqliteOptions {
        busy_timeout: Duration::from_secs(30),
        readers: 1,
    };
    let backend = SqliteBackend::open(&file.url(), options)
        .await
        .expect("open");
    let s = backend.stores();
    s.tokens.add_tokens(&[token("t", 0, 1)]).await.expect("add");

    let mut other = raw(&file);
    let holder = other
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .expect("take the write lock");
    let claim = tokio::spawn({
        let s = s.clone();
        async move {
            let tok = TokenId::new(TxId::new("t").expect("tx"), 0);
            s.locks.claim(&TxId::new("c").expect("tx"), &tok, T0).await
        }
    });
    // Let go once the claim is waiting for the lock.
    while backend.busy_waits().waited == 0 {
        tokio::task::yield_now().await;
    }
    holder.commit().expect("commit");
    assert_eq!(claim.await.expect("task"), Ok(ClaimVerdict::Won));
    assert_eq!(
        backend.busy_waits(),
        BusyWaits {
            waited: 1,
            waited_out: 0,
            cut_short: 0
        }
    );
}

#[tokio::test]
async fn a_band_read_whose_smallest_cover_is_within_the_bound_skips_the_fill_band() {
    let file = TempDb::new();
    let backend = file.open().await;
    backend
        .add_tokens(&[token("a", 0, 5), token("a", 1, 20), token("a", 2, 60)])
        .await
        .expect("funded");
    let read = |at_most: Option<u128>| BandQuery {
        wallet: WalletId::new("w").expect("wallet"),
        token_type: TokenType::new("CHF").expect("type"),
        threshold: Quantity::new(10, Precision::MAX).expect("amount"),
        cover: 16,
        fill: 256,
        fill_before: None,
        fill_unless_cover_at_most: at_most
            .map(|v| Quantity::new(v, Precision::MAX).expect("amount")),
    };
    let amounts = |got: Vec<holdfast_domain::Candidate>| -> Vec<u128> {
        got.iter().map(|c| c.quantity.value()).collect()
    };
    let within = backend
        .candidate_bands(&read(Some(50)))
        .await
        .expect("read");
    assert_eq!(amounts(within), [20, 60], "the cover band alone");
    let beyond = backend
        .candidate_bands(&read(Some(19)))
        .await
        .expect("read");
    assert_eq!(amounts(beyond), [20, 60, 5], "both bands");
    let unbounded = backend.candidate_bands(&read(None)).await.expect("read");
    assert_eq!(amounts(unbounded), [20, 60, 5], "both bands");
}
