//! Process-level faults on a real SQLite file: another process holding the write
//! lock past the busy timeout, a process SIGKILLed in the middle of window
//! claims, releases and settlements, and the database file (or its `-wal`)
//! deleted or replaced under a running process.
//!
//! This test binary has its own `main` (`harness = false`) because it re-executes
//! itself as the child process: with `HOLDFAST_FAULTS_CHILD` set, `main` plays the
//! named child role instead of running tests. Parent and child synchronise over the
//! child's stdin and stdout (a line per fact), never by sleeping.
//!
//! Replay a kill run with `HOLDFAST_FAULTS_SEED=<seed>` (printed by each run).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ChildStdout, Command, ExitCode, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use holdfast_adapters_sqlite::{BusyWaits, SqliteBackend, SqliteOptions};
use holdfast_domain::{
    ClaimVerdict, Precision, Quantity, Timestamp, TokenId, TokenType, TxId, TxStatus, WalletId,
};
use holdfast_ports::{
    CandidateQuery, LockStoreError, NewToken, StatusStoreError, StoreFault, TokenStoreError,
};
use libtest_mimic::{Arguments, Trial};
use rusqlite::Connection;

use common::TempDb;

const CHILD_ENV: &str = "HOLDFAST_FAULTS_CHILD";
const SEED_ENV: &str = "HOLDFAST_FAULTS_SEED";
const T0: Timestamp = Timestamp(1_796_025_600_000);
/// Tokens in the wallet of the kill test.
const TOKENS: u32 = 1000;
/// Child processes killed per run of the kill test.
const KILL_ROUNDS: usize = 8;

fn main() -> ExitCode {
    if let Ok(role) = std::env::var(CHILD_ENV) {
        return child::run(&role);
    }
    // libtest-mimic implements the libtest command line that cargo test and cargo
    // nextest drive (filters, --exact, --list --format terse, --ignored, ...). The
    // tests run one after another, as under the hand-written runner this replaced,
    // unless --test-threads says otherwise: each already keeps child processes busy.
    let mut args = Arguments::from_args();
    if args.test_threads.is_none() {
        args.test_threads = Some(1);
    }
    let trials = vec![
        Trial::test(
            "another_process_holding_the_write_lock_is_a_typed_busy_fault",
            || {
                another_process_holding_the_write_lock_is_a_typed_busy_fault();
                Ok(())
            },
        ),
        Trial::test(
            "sigkill_mid_claim_release_or_spend_leaves_all_or_nothing",
            || {
                sigkill_mid_claim_release_or_spend_leaves_all_or_nothing();
                Ok(())
            },
        ),
        Trial::test(
            "a_database_file_deleted_under_a_running_process_is_refused_and_nothing_written",
            || {
                file_moved_under_a_running_process(Move::DeleteAll);
                Ok(())
            },
        ),
        Trial::test(
            "a_database_file_replaced_by_rename_under_a_running_process_is_refused_and_nothing_written",
            || {
                file_moved_under_a_running_process(Move::ReplaceByRename);
                Ok(())
            },
        ),
        Trial::test(
            "a_wal_deleted_under_a_running_process_is_refused_and_nothing_written",
            || {
                file_moved_under_a_running_process(Move::DeleteWal);
                Ok(())
            },
        ),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn wallet() -> WalletId {
    WalletId::new("w").expect("wallet")
}

fn chf() -> TokenType {
    TokenType::new("CHF").expect("type")
}

fn tx(name: &str) -> TxId {
    TxId::new(name).expect("tx id")
}

/// Token `n` of the kill test's wallet.
fn token_id(n: u32) -> TokenId {
    TokenId::new(tx(&format!("t{n}")), 0)
}

fn new_token(n: u32) -> NewToken {
    NewToken {
        id: token_id(n),
        wallet: wallet(),
        token_type: chf(),
        quantity: Quantity::new(u128::from(n % 7) + 1, Precision::default()).expect("amount"),
        spendable: true,
    }
}

fn spawn_child(role: &str, args: &[&str], stdin: Stdio) -> (Child, BufReader<ChildStdout>) {
    let exe = std::env::current_exe().expect("path of this test binary");
    let mut child = Command::new(exe)
        .env(CHILD_ENV, role)
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child process");
    let stdout = child.stdout.take().expect("child stdout is piped");
    (child, BufReader::new(stdout))
}

/// The next complete line the child wrote, or None at end of output. A last line
/// without its newline (the child died while writing it) counts as not written.
fn next_line(out: &mut BufReader<ChildStdout>) -> Option<String> {
    let mut line = String::new();
    match out.read_line(&mut line) {
        Ok(0) => None,
        Ok(_) if line.ends_with('\n') => Some(line.trim_end().to_owned()),
        Ok(_) => None,
        Err(e) => panic!("reading the child's output: {e}"),
    }
}

// ---------------------------------------------------------------------------------
// Busy: a second process holds the write lock for longer than the busy timeout.
// ---------------------------------------------------------------------------------

fn another_process_holding_the_write_lock_is_a_typed_busy_fault() {
    let file = TempDb::new();
    let rt = runtime();
    let options = SqliteOptions {
        busy_timeout: Duration::from_millis(100),
        ..SqliteOptions::default()
    };
    let backend = rt.block_on(async {
        let backend = SqliteBackend::open(&file.url(), options)
            .await
            .expect("open");
        backend
            .add_tokens_for_test(&[new_token(1), new_token(2)])
            .await;
        backend
    });

    // The child takes the write lock (BEGIN IMMEDIATE), says so, and keeps it until
    // its stdin closes: far longer than the 100 ms busy timeout.
    let path = file.path().display().to_string();
    let (mut child, mut out) = spawn_child("hold-write-lock", &[&path], Stdio::piped());
    assert_eq!(next_line(&mut out).as_deref(), Some("locked"));

    let me = tx("busy-consumer");
    rt.block_on(async {
        let s = backend.stores();
        match s.locks.claim_window(&me, &[token_id(1)], T0).await {
            Err(LockStoreError::Fault(StoreFault::Busy(msg))) => {
                assert!(msg.contains("locked"), "busy message: {msg}");
            }
            other => panic!("claim_window under a foreign write lock: {other:?}"),
        }
        assert!(matches!(
            s.locks.claim(&me, &token_id(2), T0).await,
            Err(LockStoreError::Fault(StoreFault::Busy(_)))
        ));
        assert!(matches!(
            s.locks.release_consumer(&me, T0, true).await,
            Err(LockStoreError::Fault(StoreFault::Busy(_)))
        ));
        assert!(matches!(
            s.locks.spend_consumer(&me, T0, true).await,
            Err(LockStoreError::Fault(StoreFault::Busy(_)))
        ));
        assert!(matches!(
            s.locks
                .sweep(holdfast_domain::SweepRule { cutoff: T0 })
                .await,
            Err(LockStoreError::Fault(StoreFault::Busy(_)))
        ));
        assert!(matches!(
            s.tokens.add_tokens(&[new_token(3)]).await,
            Err(TokenStoreError::Fault(StoreFault::Busy(_)))
        ));
        assert!(matches!(
            s.statuses.record_status(&me, TxStatus::Confirmed, T0).await,
            Err(StatusStoreError::Fault(StoreFault::Busy(_)))
        ));
        // The first write waited out the busy timeout; the six after it tried
        // for the lock briefly and failed as well (the lockout), instead of
        // each waiting out a busy timeout of its own.
        assert_eq!(
            backend.busy_waits(),
            BusyWaits {
                waited: 7,
                waited_out: 1,
                cut_short: 6
            }
        );
        // Readers are not blocked by a writer (WAL): both tokens are still candidates.
        let page = s
            .tokens
            .candidates(&CandidateQuery {
                wallet: wallet(),
                token_type: chf(),
                after: None,
                limit: 10,
            })
            .await
            .expect("candidates beside a foreign writer");
        assert_eq!(page.len(), 2);
    });

    // Closing the child's stdin makes it roll back and exit.
    drop(child.stdin.take());
    let status = child.wait().expect("wait for the lock holder");
    assert!(status.success(), "lock holder exited with {status}");

    rt.block_on(async {
        let s = backend.stores();
        // Nothing of the failed calls was written, and the next claim wins.
        assert_eq!(s.locks.list_locks().await.expect("list"), Vec::new());
        assert_eq!(s.tokens.token(&token_id(3)).await.expect("token"), None);
        assert_eq!(
            s.locks.claim(&me, &token_id(1), T0).await.expect("claim"),
            ClaimVerdict::Won
        );
    });
}

/// A small helper so the busy test can seed tokens in one line.
trait Seed {
    async fn add_tokens_for_test(&self, tokens: &[NewToken]);
}

impl Seed for SqliteBackend {
    async fn add_tokens_for_test(&self, tokens: &[NewToken]) {
        let added = self
            .stores()
            .tokens
            .add_tokens(tokens)
            .await
            .expect("add tokens");
        assert_eq!(added, u64::try_from(tokens.len()).expect("count"));
    }
}

// ---------------------------------------------------------------------------------
// The database file, or its -wal, deleted or replaced under a running process.
// ---------------------------------------------------------------------------------

/// What happens to the files under the running process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    /// `rm holdfast.db holdfast.db-wal holdfast.db-shm`.
    DeleteAll,
    /// Another database renamed over the file; its old `-wal` and `-shm`
    /// removed, as moving a SQLite database requires (else SQLite would apply
    /// the old `-wal` to the new file).
    ReplaceByRename,
    /// `rm holdfast.db-wal` only.
    DeleteWal,
}

/// The calls the child makes once its files moved, each answered by one line.
const CALLS_AFTER_MOVE: [&str; 5] = ["add_tokens", "claim", "spend", "candidates", "token"];

fn side_file(file: &TempDb, suffix: &str) -> std::path::PathBuf {
    let mut path = file.path().into_os_string();
    path.push(suffix);
    path.into()
}

fn file_moved_under_a_running_process(how: Move) {
    let file = TempDb::new();
    let path = file.path();
    // The child opens the database, adds tokens 1 and 2, claims token 1 for
    // `early`, says so, and waits.
    let (mut child, mut out) = spawn_child("write-after-move", &[&file.url()], Stdio::piped());
    assert_eq!(next_line(&mut out).as_deref(), Some("ready"));

    match how {
        Move::DeleteAll => {
            for suffix in ["", "-wal", "-shm"] {
                std::fs::remove_file(side_file(&file, suffix)).expect("delete");
            }
        }
        Move::ReplaceByRename => {
            let other = file.dir().join("replacement.db");
            let conn = Connection::open(&other).expect("create the replacement");
            conn.execute_batch(
                "CREATE TABLE replacement (note TEXT); INSERT INTO replacement VALUES ('new');",
            )
            .expect("write the replacement");
            drop(conn);
            std::fs::rename(&other, &path).expect("rename over the database");
            for suffix in ["-wal", "-shm"] {
                std::fs::remove_file(side_file(&file, suffix)).expect("remove the old side file");
            }
        }
        Move::DeleteWal => std::fs::remove_file(side_file(&file, "-wal")).expect("delete"),
    }

    // Every call, a write or a read, answers Unavailable naming the path.
    let mut stdin = child.stdin.take().expect("child stdin is piped");
    stdin.write_all(b"moved\n").expect("tell the child");
    stdin.flush().expect("flush");
    for call in CALLS_AFTER_MOVE {
        let line = next_line(&mut out).unwrap_or_else(|| panic!("no answer for {call}"));
        let Some(message) = line.strip_prefix(&format!("{call} unavailable ")) else {
            panic!("{how:?}: {call} answered {line:?}, expected Unavailable");
        };
        assert!(
            message.contains(&path.display().to_string()),
            "{how:?}: {call}: {message}"
        );
        assert!(
            message.contains("deleted or replaced"),
            "{how:?}: {call}: {message}"
        );
    }
    drop(stdin);
    let status = child.wait().expect("wait for the child");
    assert!(status.success(), "child exited with {status}");

    // A fresh process on the path sees none of what the child was refused:
    // no token 3, no second claim, no spend, and a sound file.
    let conn = Connection::open(&path).expect("open the database at the path");
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity check");
    assert_eq!(integrity, "ok", "{how:?}");
    if how == Move::ReplaceByRename {
        let note: String = conn
            .query_row("SELECT note FROM replacement", [], |r| r.get(0))
            .expect("the replacement is the file at the path");
        assert_eq!(note, "new");
    }
    drop(conn);
    let rt = runtime();
    rt.block_on(async {
        let fresh = SqliteBackend::open(&file.url(), SqliteOptions::default())
            .await
            .expect("open the database at the path");
        let s = fresh.stores();
        assert_eq!(s.tokens.token(&token_id(3)).await.expect("token 3"), None);
        let locks = s.locks.list_locks().await.expect("locks");
        assert!(
            locks.iter().all(|l| l.consumer.as_str() != "late"),
            "{how:?}: {locks:?}"
        );
        assert_eq!(s.statuses.status(&tx("early")).await.expect("status"), None);
        if let Some(one) = s.tokens.token(&token_id(1)).await.expect("token 1") {
            // Only the -wal was deleted: what the child committed before may
            // have reached the file when it closed, the spend never.
            assert_eq!(how, Move::DeleteWal);
            assert_eq!(one.spent_by, None);
        }
    });
}

// ---------------------------------------------------------------------------------
// SIGKILL in the middle of claims, releases and settlements.
// ---------------------------------------------------------------------------------

/// What the database must hold: lock rows and spent marks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Model {
    locks: BTreeMap<TokenId, String>,
    spent: BTreeMap<TokenId, String>,
}

/// One operation of the child, announced before it starts.
#[derive(Debug, Clone)]
enum Op {
    Claim {
        consumer: String,
        window: Vec<TokenId>,
    },
    Release {
        consumer: String,
    },
    Spend {
        consumer: String,
    },
}

impl Model {
    /// The verdicts the claim must report, and the model after it.
    fn claim(&self, consumer: &str, window: &[TokenId]) -> (Vec<ClaimVerdict>, Model) {
        let mut next = self.clone();
        let verdicts = window
            .iter()
            .map(|t| {
                if self.spent.contains_key(t) {
                    ClaimVerdict::Stale
                } else if next.locks.contains_key(t) {
                    ClaimVerdict::Contended
                } else {
                    next.locks.insert(t.clone(), consumer.to_owned());
                    ClaimVerdict::Won
                }
            })
            .collect();
        (verdicts, next)
    }

    fn release(&self, consumer: &str) -> (u64, Model) {
        let mut next = self.clone();
        next.locks.retain(|_, c| c != consumer);
        let released = self.locks.len() - next.locks.len();
        (u64::try_from(released).expect("count"), next)
    }

    fn spend(&self, consumer: &str) -> (BTreeSet<TokenId>, Model) {
        let mut next = self.clone();
        let held: BTreeSet<TokenId> = self
            .locks
            .iter()
            .filter(|(_, c)| c.as_str() == consumer)
            .map(|(t, _)| t.clone())
            .collect();
        for t in &held {
            next.locks.remove(t);
            next.spent.insert(t.clone(), consumer.to_owned());
        }
        (held, next)
    }

    fn after(&self, op: &Op) -> Model {
        match op {
            Op::Claim { consumer, window } => self.claim(consumer, window).1,
            Op::Release { consumer } => self.release(consumer).1,
            Op::Spend { consumer } => self.spend(consumer).1,
        }
    }
}

fn parse_tokens(words: std::str::SplitWhitespace<'_>) -> Vec<TokenId> {
    words
        .map(|w| {
            let n: u32 = w.parse().unwrap_or_else(|_| panic!("token number {w:?}"));
            token_id(n)
        })
        .collect()
}

/// Applies one completed child line to the model, checking the reported result
/// against it; returns the announced operation for an intent line.
fn apply_line(model: &mut Model, pending: &mut Option<Op>, line: &str) {
    let mut words = line.split_whitespace();
    let kind = words.next().unwrap_or_default();
    let consumer = words.next().unwrap_or_default().to_owned();
    match kind {
        "claim" => {
            assert!(pending.is_none(), "two operations in flight: {line}");
            *pending = Some(Op::Claim {
                consumer,
                window: parse_tokens(words),
            });
        }
        "release" => {
            assert!(pending.is_none(), "two operations in flight: {line}");
            *pending = Some(Op::Release { consumer });
        }
        "spend" => {
            assert!(pending.is_none(), "two operations in flight: {line}");
            *pending = Some(Op::Spend { consumer });
        }
        "claimed" => {
            let Some(Op::Claim {
                consumer: c,
                window,
            }) = pending.take()
            else {
                panic!("claim result without its claim: {line}");
            };
            assert_eq!(c, consumer);
            let (expected, next) = model.claim(&c, &window);
            let reported: Vec<ClaimVerdict> = words
                .map(|w| match w {
                    "W" => ClaimVerdict::Won,
                    "S" => ClaimVerdict::Stale,
                    "C" => ClaimVerdict::Contended,
                    other => panic!("verdict {other:?}"),
                })
                .collect();
            assert_eq!(reported, expected, "verdicts of {c}");
            *model = next;
        }
        "released" => {
            let Some(Op::Release { consumer: c }) = pending.take() else {
                panic!("release result without its release: {line}");
            };
            let (expected, next) = model.release(&c);
            let n: u64 = words.next().and_then(|w| w.parse().ok()).expect("count");
            assert_eq!(n, expected, "released by {c}");
            *model = next;
        }
        "spent" => {
            let Some(Op::Spend { consumer: c }) = pending.take() else {
                panic!("spend result without its spend: {line}");
            };
            let (expected, next) = model.spend(&c);
            let reported: BTreeSet<TokenId> = parse_tokens(words).into_iter().collect();
            assert_eq!(reported, expected, "spent by {c}");
            *model = next;
        }
        other => panic!("unexpected child line {other:?}: {line}"),
    }
}

/// The locks and spent marks actually in the file, read through a plain connection
/// after an integrity check.
fn stored_state(file: &TempDb) -> Model {
    let conn = Connection::open(file.path()).expect("raw connection");
    let integrity: Vec<String> = conn
        .prepare("PRAGMA integrity_check")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("integrity_check")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(integrity, vec!["ok".to_owned()], "integrity_check");
    let fk: i64 = conn
        .query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
            r.get(0)
        })
        .expect("foreign_key_check");
    assert_eq!(fk, 0, "foreign key violations");
    let orphans: i64 = conn
        .query_row(
            "SELECT count(*) FROM locks AS l
             WHERE NOT EXISTS (SELECT 1 FROM tokens AS t WHERE t.tx = l.tx AND t.output = l.output)",
            [],
            |r| r.get(0),
        )
        .expect("orphan locks");
    assert_eq!(orphans, 0, "lock rows naming no token");
    let spent_and_locked: i64 = conn
        .query_row(
            "SELECT count(*) FROM locks AS l JOIN tokens AS t ON t.tx = l.tx AND t.output = l.output
             WHERE t.spent_by IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .expect("spent and locked");
    assert_eq!(spent_and_locked, 0, "spent tokens still locked");
    let read = |sql: &str| -> BTreeMap<TokenId, String> {
        conn.prepare(sql)
            .expect("prepare")
            .query_map([], |r| {
                let txid: String = r.get(0)?;
                let output: u32 = r.get(1)?;
                let who: String = r.get(2)?;
                Ok((TokenId::new(tx(&txid), output), who))
            })
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    };
    Model {
        locks: read("SELECT tx, output, consumer FROM locks"),
        spent: read("SELECT tx, output, spent_by FROM tokens WHERE spent_by IS NOT NULL"),
    }
}

struct Rng(u64);

impl Rng {
    /// splitmix64: enough for picking kill points, replayable from the seed.
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn seed() -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("{SEED_ENV}={s:?}; expected a u64")),
        Err(_) => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .ok()
            .and_then(|n| u64::try_from(n % u128::from(u64::MAX)).ok())
            .unwrap_or(1),
    }
}

fn sigkill_mid_claim_release_or_spend_leaves_all_or_nothing() {
    let seed = seed();
    println!("kill test seed: {seed} (replay with {SEED_ENV}={seed})");
    let mut rng = Rng(seed);
    let file = TempDb::new();
    let rt = runtime();
    rt.block_on(async {
        let backend = file.open().await;
        let tokens: Vec<NewToken> = (0..TOKENS).map(new_token).collect();
        backend.add_tokens_for_test(&tokens).await;
    });

    let url = file.url();
    let mut model = Model::default();
    let mut next_consumer = 0u64;
    let (mut landed_before, mut landed_after, mut idle) = (0, 0, 0);
    for round in 0..KILL_ROUNDS {
        let child_seed = rng.next().to_string();
        let first = next_consumer.to_string();
        let (mut child, mut out) =
            spawn_child("claimer", &[&url, &child_seed, &first], Stdio::null());
        // Kill right after the child announces its k-th operation: it is then
        // before, inside or just after that operation's transaction.
        let kill_after = rng.below(40) + 1;
        let mut announced = 0;
        let mut pending = None;
        while announced < kill_after {
            let line = next_line(&mut out)
                .unwrap_or_else(|| panic!("round {round}: the child stopped before being killed"));
            if matches!(line.split(' ').next(), Some("claim" | "release" | "spend")) {
                announced += 1;
                next_consumer += 1;
            }
            apply_line(&mut model, &mut pending, &line);
        }
        child.kill().expect("SIGKILL the child");
        let status = child.wait().expect("wait for the killed child");
        assert_eq!(status.signal(), Some(9), "round {round}: {status}");
        // Facts the child wrote before it died still count.
        while let Some(line) = next_line(&mut out) {
            if matches!(line.split(' ').next(), Some("claim" | "release" | "spend")) {
                next_consumer += 1;
            }
            apply_line(&mut model, &mut pending, &line);
        }
        let mut rest = String::new();
        let _ = out.read_to_string(&mut rest);

        // Reopen: the file is intact and holds either the state before the
        // interrupted operation or the state after it, nothing in between.
        let stored = stored_state(&file);
        match &pending {
            None => {
                assert_eq!(stored, model, "round {round}: no operation in flight");
                idle += 1;
            }
            Some(op) => {
                let after = model.after(op);
                if stored == model {
                    landed_before += 1;
                } else if stored == after {
                    landed_after += 1;
                    model = after;
                } else {
                    panic!(
                        "round {round}: {op:?} was half applied:\n stored {stored:?}\n before {model:?}\n after {after:?}"
                    );
                }
            }
        }

        rt.block_on(async {
            let backend = file.open().await;
            let s = backend.stores();
            // The adapter agrees: its lock list and candidates match the file.
            let listed: BTreeMap<TokenId, String> = s
                .locks
                .list_locks()
                .await
                .expect("list locks after the kill")
                .into_iter()
                .map(|l| (l.token, l.consumer.as_str().to_owned()))
                .collect();
            assert_eq!(listed, model.locks, "round {round}: listed locks");
            let candidates: BTreeSet<TokenId> = s
                .tokens
                .candidates(&CandidateQuery {
                    wallet: wallet(),
                    token_type: chf(),
                    after: None,
                    limit: usize::try_from(TOKENS).expect("limit"),
                })
                .await
                .expect("candidates after the kill")
                .into_iter()
                .map(|c| c.id)
                .collect();
            let free: BTreeSet<TokenId> = (0..TOKENS)
                .map(token_id)
                .filter(|t| !model.locks.contains_key(t) && !model.spent.contains_key(t))
                .collect();
            assert_eq!(candidates, free, "round {round}: candidates");
            // A later claim succeeds. By now the children may have locked or spent
            // every token; then the probe first frees one lock the ordinary way (a
            // dead child's lock, released by its consumer), keeping the model exact.
            let probe = tx(&format!("probe-{round}"));
            let target = match free.first() {
                Some(token) => token.clone(),
                None => {
                    let Some((token, holder)) = model
                        .locks
                        .iter()
                        .next()
                        .map(|(t, c)| (t.clone(), c.clone()))
                    else {
                        // Every token is spent: a claim is refused as stale.
                        let spent = token_id(0);
                        assert_eq!(
                            s.locks.claim(&probe, &spent, T0).await.expect("claim"),
                            ClaimVerdict::Stale
                        );
                        return;
                    };
                    let released = s
                        .locks
                        .release_tokens(&tx(&holder), std::slice::from_ref(&token))
                        .await
                        .expect("release a dead child's lock");
                    assert_eq!(released, 1, "round {round}: release {token}");
                    model.locks.remove(&token);
                    token
                }
            };
            assert_eq!(
                s.locks
                    .claim(&probe, &target, T0)
                    .await
                    .expect("claim after the kill"),
                ClaimVerdict::Won
            );
            assert_eq!(
                s.locks
                    .release_consumer(&probe, T0, true)
                    .await
                    .expect("release"),
                1
            );
        });
    }
    println!(
        "kill test: {KILL_ROUNDS} kills; interrupted operation absent {landed_before}, \
         complete {landed_after}; between operations {idle}"
    );
}

// ---------------------------------------------------------------------------------
// Child roles.
// ---------------------------------------------------------------------------------

mod child {
    use super::*;

    pub fn run(role: &str) -> ExitCode {
        let args: Vec<String> = std::env::args().skip(1).collect();
        match role {
            "hold-write-lock" => hold_write_lock(&args),
            "claimer" => claimer(&args),
            "write-after-move" => write_after_move(&args),
            other => {
                eprintln!("unknown child role {other:?}");
                ExitCode::FAILURE
            }
        }
    }

    /// One whole line per write, flushed, so the parent sees whole facts only.
    fn say(line: &str) {
        let mut out = std::io::stdout().lock();
        let whole = format!("{line}\n");
        out.write_all(whole.as_bytes())
            .expect("write to the parent");
        out.flush().expect("flush to the parent");
    }

    /// Takes SQLite's write lock and holds it until stdin closes.
    fn hold_write_lock(args: &[String]) -> ExitCode {
        let path = args.first().expect("database path");
        let conn = Connection::open(path).expect("open");
        conn.execute_batch("BEGIN IMMEDIATE")
            .expect("take the write lock");
        say("locked");
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        conn.execute_batch("ROLLBACK").expect("roll back");
        ExitCode::SUCCESS
    }

    /// Opens the database, adds tokens 1 and 2, claims token 1 for `early`,
    /// says `ready`; once a line comes on stdin (the files moved), makes the
    /// calls of [`CALLS_AFTER_MOVE`], answering each with a line: its name and
    /// `ok`, `unavailable <message>` or `other <error>`.
    fn write_after_move(args: &[String]) -> ExitCode {
        let url = args.first().expect("database url");
        let rt = runtime();
        rt.block_on(async {
            let backend = SqliteBackend::open(url, SqliteOptions::default())
                .await
                .expect("open");
            let s = backend.stores();
            backend
                .add_tokens_for_test(&[new_token(1), new_token(2)])
                .await;
            assert_eq!(
                s.locks.claim(&tx("early"), &token_id(1), T0).await,
                Ok(ClaimVerdict::Won)
            );
            say("ready");
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .expect("wait for the parent");
            fn answer<T, E: Into<Fault>>(call: &str, result: Result<T, E>) {
                match result.map_err(Into::into) {
                    Ok(_) => say(&format!("{call} ok")),
                    Err(Fault(StoreFault::Unavailable(m))) => {
                        say(&format!("{call} unavailable {}", m.replace('\n', " ")))
                    }
                    Err(Fault(other)) => say(&format!("{call} other {other:?}")),
                }
            }
            answer("add_tokens", s.tokens.add_tokens(&[new_token(3)]).await);
            answer("claim", s.locks.claim(&tx("late"), &token_id(2), T0).await);
            answer(
                "spend",
                s.locks.spend_consumer(&tx("early"), T0, true).await,
            );
            let query = CandidateQuery {
                wallet: wallet(),
                token_type: chf(),
                after: None,
                limit: 10,
            };
            answer("candidates", s.tokens.candidates(&query).await);
            answer("token", s.tokens.token(&token_id(1)).await);
        });
        ExitCode::SUCCESS
    }

    /// The store fault of a port error, for [`write_after_move`]'s lines.
    struct Fault(StoreFault);

    impl From<TokenStoreError> for Fault {
        fn from(e: TokenStoreError) -> Fault {
            match e {
                TokenStoreError::Fault(f) => Fault(f),
                other => Fault(StoreFault::Backend(other.to_string())),
            }
        }
    }

    impl From<LockStoreError> for Fault {
        fn from(e: LockStoreError) -> Fault {
            match e {
                LockStoreError::Fault(f) => Fault(f),
                other => Fault(StoreFault::Backend(other.to_string())),
            }
        }
    }

    /// Claims random windows for fresh consumers, releases and spends earlier ones,
    /// announcing each operation before it starts and its result after it returns,
    /// until killed.
    fn claimer(args: &[String]) -> ExitCode {
        let [url, seed, first] = args else {
            panic!("claimer arguments: url seed first-consumer");
        };
        let mut rng = Rng(seed.parse().expect("seed"));
        let first: u64 = first.parse().expect("first consumer");
        let rt = runtime();
        rt.block_on(async {
            let backend = SqliteBackend::open(url, SqliteOptions::default())
                .await
                .expect("open");
            let s = backend.stores();
            for n in first.. {
                let roll = rng.below(10);
                if roll < 6 || n == 0 {
                    let me = format!("c{n}");
                    let size = rng.below(256) + 1;
                    let mut picked = BTreeSet::new();
                    while u64::try_from(picked.len()).expect("len") < size {
                        picked.insert(u32::try_from(rng.below(u64::from(TOKENS))).expect("n"));
                    }
                    let numbers: Vec<String> = picked.iter().map(u32::to_string).collect();
                    say(&format!("claim {me} {}", numbers.join(" ")));
                    let window: Vec<TokenId> = picked.iter().copied().map(token_id).collect();
                    let verdicts = s
                        .locks
                        .claim_window(&tx(&me), &window, T0)
                        .await
                        .expect("claim_window");
                    let letters: Vec<&str> = verdicts
                        .iter()
                        .map(|(_, v)| match v {
                            ClaimVerdict::Won => "W",
                            ClaimVerdict::Stale => "S",
                            ClaimVerdict::Contended => "C",
                        })
                        .collect();
                    say(&format!("claimed {me} {}", letters.join(" ")));
                } else {
                    let victim = format!("c{}", rng.below(n));
                    if roll < 9 {
                        say(&format!("release {victim}"));
                        let n = s
                            .locks
                            .release_consumer(&tx(&victim), T0, true)
                            .await
                            .expect("release");
                        say(&format!("released {victim} {n}"));
                    } else {
                        say(&format!("spend {victim}"));
                        let spent = s
                            .locks
                            .spend_consumer(&tx(&victim), T0, true)
                            .await
                            .expect("spend");
                        let numbers: Vec<String> = spent
                            .iter()
                            .map(|t| t.tx.as_str().trim_start_matches('t').to_owned())
                            .collect();
                        say(&format!("spent {victim} {}", numbers.join(" ")));
                    }
                }
            }
        });
        ExitCode::SUCCESS
    }
}
