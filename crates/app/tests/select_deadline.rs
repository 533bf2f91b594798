//! A select has a deadline (`selection.deadline_ms`; `docs/selection.md`,
//! "Deadline"): it answers when the deadline passes, wherever it waits (a
//! backoff or wake-up wait, a store call that hangs, a row lock on PostgreSQL),
//! with `FundsLocked` once it saw enough funds held by others and
//! `DeadlineExceeded` otherwise, and gives back what it holds or may hold.
//!
//! The fakes run on paused tokio time, so "at the deadline" is exact; the
//! PostgreSQL tests bound real time generously.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use async_trait::async_trait;
use holdfast::config::{Config, ConfigError};
use holdfast::{SelectError, TokenSelector, metrics as hm};
use holdfast_adapters_postgres::{LockStrategy, PgBackend, PgOptions, claim_line_key};
use holdfast_domain::{
    Candidate, ClaimVerdict, SelectionConfig, SelectionPolicy, SweepRule, Timestamp, Token,
    TokenId, TokenType, TxId, TxStatus, WalletId,
};
use holdfast_ports::{
    Confirmation, LockInfo, LockStore, LockStoreError, MockLockStore, MockTokenStore,
    MockTxStatusStore, NewToken, Output, StoreFault, SweepReport,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tokio::sync::{Notify, mpsc};

use crate::common::{TokioClock, cand, q, stores, tok, tx};
use crate::pg_support::TestDb;

fn wallet() -> WalletId {
    WalletId::new("alice").expect("wallet")
}

fn chf() -> TokenType {
    TokenType::new("CHF").expect("type")
}

/// Who holds which token.
type Table = Arc<StdMutex<BTreeMap<TokenId, TxId>>>;

/// A lock table in memory. A claim of the gated token waits for the gate's
/// `Notify` before it takes effect, in a task of its own: like a statement on
/// the server, it goes on when the caller stops waiting. Every release that
/// took effect is reported on `released`.
struct FakeLocks {
    table: Table,
    gate: Option<(TokenId, Arc<Notify>)>,
    released: mpsc::UnboundedSender<(TxId, Vec<TokenId>)>,
}

fn claim_in(table: &Table, consumer: &TxId, token: &TokenId) -> ClaimVerdict {
    let mut table = table.lock().expect("table");
    match table.get(token) {
        Some(holder) if holder == consumer => ClaimVerdict::Won,
        Some(_) => ClaimVerdict::Contended,
        None => {
            table.insert(token.clone(), consumer.clone());
            ClaimVerdict::Won
        }
    }
}

fn unexpected(what: &str) -> LockStoreError {
    LockStoreError::Fault(StoreFault::Busy(format!("a select never calls {what}")))
}

#[async_trait]
impl LockStore for FakeLocks {
    async fn claim(
        &self,
        consumer: &TxId,
        token: &TokenId,
        _at: Timestamp,
    ) -> Result<ClaimVerdict, LockStoreError> {
        match &self.gate {
            Some((gated, open)) if gated == token => {
                let (table, open) = (self.table.clone(), open.clone());
                let (consumer, token) = (consumer.clone(), token.clone());
                tokio::spawn(async move {
                    open.notified().await;
                    claim_in(&table, &consumer, &token)
                })
                .await
                .map_err(|_| unexpected("a cancelled claim"))
            }
            _ => Ok(claim_in(&self.table, consumer, token)),
        }
    }
    async fn claim_window(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
        at: Timestamp,
    ) -> Result<Vec<(TokenId, ClaimVerdict)>, LockStoreError> {
        let mut out = Vec::new();
        for token in tokens {
            out.push((token.clone(), self.claim(consumer, token, at).await?));
        }
        Ok(out)
    }
    async fn renew(
        &self,
        _consumer: &TxId,
        tokens: &[TokenId],
        _at: Timestamp,
    ) -> Result<Vec<TokenId>, LockStoreError> {
        Ok(tokens.to_vec())
    }
    async fn release_consumer(
        &self,
        _consumer: &TxId,
        _at: Timestamp,
        _record: bool,
    ) -> Result<u64, LockStoreError> {
        Err(unexpected("release_consumer"))
    }
    async fn release_tokens(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
    ) -> Result<u64, LockStoreError> {
        let mut released = Vec::new();
        {
            let mut table = self.table.lock().expect("table");
            for token in tokens {
                if table.get(token) == Some(consumer) {
                    table.remove(token);
                    released.push(token.clone());
                }
            }
        }
        let count = u64::try_from(released.len()).expect("count");
        if !released.is_empty() {
            released.sort();
            let _ = self.released.send((consumer.clone(), released));
        }
        Ok(count)
    }
    async fn spend_consumer(
        &self,
        _consumer: &TxId,
        _at: Timestamp,
        _record: bool,
    ) -> Result<Vec<TokenId>, LockStoreError> {
        Err(unexpected("spend_consumer"))
    }
    async fn confirm(
        &self,
        _consumer: &TxId,
        _outputs: &[Output],
        _at: Timestamp,
    ) -> Result<Confirmation, LockStoreError> {
        Err(unexpected("confirm"))
    }
    async fn selected(&self, _consumer: &TxId) -> Result<Vec<Token>, LockStoreError> {
        Err(unexpected("selected"))
    }
    async fn unsettled(&self) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError> {
        Ok(Vec::new())
    }
    async fn unsettled_owned(&self) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError> {
        Ok(Vec::new())
    }
    async fn sweep(&self, _rule: SweepRule) -> Result<SweepReport, LockStoreError> {
        Ok(SweepReport::default())
    }
    async fn list_locks(&self) -> Result<Vec<LockInfo>, LockStoreError> {
        Ok(Vec::new())
    }
    fn round_trips(&self) -> u64 {
        0
    }
}

/// A wallet of `tokens` over a lock table that starts as `held`, read as the
/// stores read it (locked tokens are no candidates; the balance ignores others'
/// locks), with a claim of `gate`'s token held at its gate.
struct Wallet {
    table: Table,
    released: mpsc::UnboundedReceiver<(TxId, Vec<TokenId>)>,
    selector: TokenSelector,
}

impl Wallet {
    fn new(
        tokens: &[Candidate],
        held: &[(&str, &str)],
        gate: Option<(TokenId, Arc<Notify>)>,
        config: SelectionConfig,
    ) -> Self {
        let table: Table = Arc::new(StdMutex::new(
            held.iter()
                .map(|(t, holder)| (tok(t), tx(holder)))
                .collect(),
        ));
        let mut store = MockTokenStore::new();
        {
            let (table, tokens) = (table.clone(), tokens.to_vec());
            store.expect_candidates().returning(move |query| {
                if query.after.is_some() {
                    return Ok(Vec::new());
                }
                let locked = table.lock().expect("table");
                let mut free: Vec<Candidate> = tokens
                    .iter()
                    .filter(|c| !locked.contains_key(&c.id))
                    .cloned()
                    .collect();
                free.sort_by_key(|c| c.quantity);
                Ok(free)
            });
        }
        {
            let (table, tokens) = (table.clone(), tokens.to_vec());
            store.expect_balance_for().returning(move |_, _, consumer| {
                let locked = table.lock().expect("table");
                let mut sum = q(0);
                for c in &tokens {
                    if locked.get(&c.id) != Some(consumer) {
                        sum = sum.checked_add(c.quantity).expect("sum");
                    }
                }
                Ok(sum)
            });
        }
        let (sender, released) = mpsc::unbounded_channel();
        let mut s = stores(store, MockLockStore::new(), MockTxStatusStore::new());
        s.locks = Arc::new(FakeLocks {
            table: table.clone(),
            gate,
            released: sender,
        });
        let selector = TokenSelector::new(s, TokioClock::new(), config, Some(7)).expect("config");
        Wallet {
            table,
            released,
            selector,
        }
    }

    fn table(&self) -> BTreeMap<TokenId, TxId> {
        self.table.lock().expect("table").clone()
    }
}

/// `smallest_first` (the mocked store answers ascending pages), a backoff
/// of up to an hour and `deadline`.
fn config(deadline: Duration) -> SelectionConfig {
    SelectionConfig {
        policy: SelectionPolicy::SmallestFirst,
        retry_interval: Duration::from_secs(3_600),
        deadline,
        ..SelectionConfig::default()
    }
}

const DEADLINE: Duration = Duration::from_millis(300);

#[tokio::test(start_paused = true)]
async fn funds_held_by_others_through_the_deadline_answer_funds_locked_at_the_deadline_not_after_the_backoff()
 {
    // Every token of the wallet is held by another transaction: the scan finds
    // nothing free, the balance (others' locks ignored) covers the amount, and
    // the leg ends in a wait of up to an hour (10 legs allowed). The deadline
    // cuts that first wait: the answer comes at exactly 300 ms, FundsLocked (the
    // engine saw the funds held by others), and the call holds nothing.
    let held = [("a", "other"), ("b", "other")];
    let mut w = Wallet::new(
        &[cand("a", 10), cand("b", 10)],
        &held,
        None,
        config(DEADLINE),
    );
    let started = tokio::time::Instant::now();
    let report = w
        .selector
        .select_with_stats(&wallet(), &chf(), q(10), &tx("t1"))
        .await;
    assert_eq!(
        started.elapsed(),
        DEADLINE,
        "the paused clock moved by the deadline"
    );
    assert_eq!(report.elapsed, DEADLINE);
    assert_eq!(report.result, Err(SelectError::FundsLocked));
    assert_eq!(
        (
            report.stats.legs,
            report.stats.waits,
            report.stats.balance_checks
        ),
        (1, 1, 1),
        "cut in its first wait: {:?}",
        report.stats
    );
    assert_eq!(
        w.table(),
        BTreeMap::from([(tok("a"), tx("other")), (tok("b"), tx("other"))])
    );
    assert!(
        w.released.try_recv().is_err(),
        "it held nothing to give back"
    );
}

#[tokio::test(start_paused = true)]
async fn a_select_without_a_deadline_in_reach_still_waits_its_backoff() {
    // The same wallet with the default deadline (30 s) and a backoff of up to
    // 20 ms over 3 legs: the legs end the call, FundsLocked, long before the
    // deadline (the deadline bounds time, it does not shorten the legs).
    let held = [("a", "other"), ("b", "other")];
    let cfg = SelectionConfig {
        retry_interval: Duration::from_millis(20),
        max_retries: 3,
        ..config(SelectionConfig::default().deadline)
    };
    let w = Wallet::new(&[cand("a", 10), cand("b", 10)], &held, None, cfg);
    let report = w
        .selector
        .select_with_stats(&wallet(), &chf(), q(10), &tx("t1"))
        .await;
    assert_eq!(report.result, Err(SelectError::FundsLocked));
    assert_eq!(report.stats.legs, 3, "{:?}", report.stats);
    assert!(
        report.elapsed < Duration::from_millis(60),
        "{:?}",
        report.elapsed
    );
}

#[tokio::test(start_paused = true)]
async fn a_claim_that_hangs_is_cut_at_the_deadline_and_what_it_may_hold_is_given_back() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    // 10 from [a=4, b=8], one token per claim: a is won, then the claim of b
    // hangs (a statement behind a lock). The select answers at the deadline,
    // DeadlineExceeded: it never saw the funds held by others.
    let gate = Arc::new(Notify::new());
    let cfg = SelectionConfig {
        batch_window: 1,
        ..config(DEADLINE)
    };
    let mut w = Wallet::new(
        &[cand("a", 4), cand("b", 8)],
        &[],
        Some((tok("b"), gate.clone())),
        cfg,
    );
    let consumer = tx("t1");
    let started = tokio::time::Instant::now();
    let report = w
        .selector
        .select_with_stats(&wallet(), &chf(), q(10), &consumer)
        .await;
    assert_eq!(started.elapsed(), DEADLINE);
    assert_eq!(
        report.result,
        Err(SelectError::DeadlineExceeded { deadline_ms: 300 })
    );
    assert_eq!(
        (report.stats.claims, report.stats.lock_attempts),
        (2, 2),
        "{:?}",
        report.stats
    );
    // The claim of b may still commit: nothing is given back before it ended
    // (given back first, b would stay locked by a select that answered).
    tokio::time::advance(Duration::from_secs(3_600)).await;
    assert_eq!(w.table(), BTreeMap::from([(tok("a"), consumer.clone())]));
    assert!(w.released.try_recv().is_err());
    // The hanging claim ends (it wins b): a and b are given back, by tokens.
    gate.notify_one();
    let released = tokio::time::timeout(Duration::from_secs(60), w.released.recv())
        .await
        .expect("a release")
        .expect("the store is alive");
    assert_eq!(released, (consumer, vec![tok("a"), tok("b")]));
    assert!(w.table().is_empty(), "{:?}", w.table());
    let outcomes: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) if key.key().name() == hm::SELECTION_OUTCOMES => Some((
                key.key()
                    .labels()
                    .map(|l| l.value().to_owned())
                    .collect::<String>(),
                n,
            )),
            _ => None,
        })
        .collect();
    assert_eq!(outcomes, [("deadline_exceeded".to_owned(), 1)]);
}

#[tokio::test(start_paused = true)]
async fn a_claim_that_never_returns_does_not_hold_back_the_answer() {
    // The gate never opens: the select still answers at its deadline.
    let gate = Arc::new(Notify::new());
    let w = Wallet::new(
        &[cand("a", 10)],
        &[],
        Some((tok("a"), gate)),
        config(DEADLINE),
    );
    let report = w
        .selector
        .select_with_stats(&wallet(), &chf(), q(10), &tx("t1"))
        .await;
    assert_eq!(report.elapsed, DEADLINE);
    assert_eq!(
        report.result,
        Err(SelectError::DeadlineExceeded { deadline_ms: 300 })
    );
    assert!(w.table().is_empty(), "the claim never took effect");
}

#[test]
fn the_deadline_is_a_selection_key_with_an_environment_variable_and_a_range() {
    let defaults = Config::default();
    assert_eq!(defaults.selection.deadline_ms, 30_000);
    assert_eq!(
        defaults.selection_config().deadline,
        Duration::from_secs(30)
    );
    let mut c = Config::from_toml_str("[selection]\ndeadline_ms = 250\n").expect("parses");
    c.validate().expect("valid");
    assert_eq!(c.selection_config().deadline, Duration::from_millis(250));
    c.apply_env([("HOLDFAST_SELECT_DEADLINE_MS", "1500")])
        .expect("env");
    assert_eq!(c.selection_config().deadline, Duration::from_millis(1_500));
    for bad in [0, 3_600_001] {
        let c = Config {
            selection: holdfast::config::SelectionSection {
                deadline_ms: bad,
                ..Default::default()
            },
            ..Config::default()
        };
        match c.validate() {
            Err(ConfigError::Invalid {
                key,
                value,
                expected,
            }) => {
                assert_eq!(key, "selection.deadline_ms");
                assert_eq!(value, bad.to_string());
                assert_eq!(expected, "1 to 3600000 ms");
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}

/// How another session stands in the select's way on PostgreSQL.
#[derive(Debug, Clone, Copy)]
enum Blocker {
    /// `SELECT … FOR UPDATE` on every token of the wallet: a claim's share lock
    /// on the token waits.
    RowLocks,
    /// The wallet's line advisory lock and an uncommitted lock row on every
    /// token: a claim's insert waits for that row's transaction.
    LineAndLockRows,
}

/// A select of 10 with a deadline of 400 ms from a wallet of four tokens of 10
/// that another session holds as `blocker` says: it answers DeadlineExceeded
/// within about the deadline, holds nothing then, and gives back the lock its
/// cut claim wins once the other session lets go.
async fn behind(db: &TestDb, blocker: Blocker) {
    const DEADLINE: Duration = Duration::from_millis(400);
    // Row locks wait long, so the cut claim is still waiting when the other
    // session lets go.
    let backend = PgBackend::connect(
        &db.url,
        PgOptions {
            strategy: LockStrategy::Insert,
            max_connections: 4,
            lock_timeout: Duration::from_secs(20),
            ..PgOptions::default()
        },
    )
    .await
    .expect("connect");
    let stores = backend.stores();
    let name = format!("hot-{blocker:?}");
    let (hot, chf) = (WalletId::new(name.as_str()).expect("wallet"), chf());
    let funding: Vec<NewToken> = (0..4u32)
        .map(|n| NewToken {
            id: TokenId::new(tx(&format!("fund-{blocker:?}")), n),
            wallet: hot.clone(),
            token_type: chf.clone(),
            quantity: q(10),
            spendable: true,
        })
        .collect();
    stores.tokens.add_tokens(&funding).await.expect("funded");
    let mut other = db.connection().await;
    sqlx::query("BEGIN")
        .execute(&mut other)
        .await
        .expect("begin");
    match blocker {
        Blocker::RowLocks => {
            sqlx::query("SELECT 1 FROM tokens WHERE wallet = $1 FOR UPDATE")
                .bind(hot.as_str())
                .execute(&mut other)
                .await
                .expect("row locks");
        }
        Blocker::LineAndLockRows => {
            let (space, line) = claim_line_key(&hot, &chf);
            sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
                .bind(space)
                .bind(line)
                .execute(&mut other)
                .await
                .expect("line");
            sqlx::query(
                "INSERT INTO token_locks (tx_id, idx, consumer, created_at) \
                 SELECT tx_id, idx, 'other', now() FROM tokens WHERE wallet = $1",
            )
            .bind(hot.as_str())
            .execute(&mut other)
            .await
            .expect("lock rows");
        }
    }
    let selector = TokenSelector::new(
        stores.clone(),
        TokioClock::new(),
        SelectionConfig {
            deadline: DEADLINE,
            ..SelectionConfig::default()
        },
        Some(3),
    )
    .expect("config");
    let consumer = tx(&format!("late-{blocker:?}"));
    let started = std::time::Instant::now();
    let report = selector
        .select_with_stats(&hot, &chf, q(10), &consumer)
        .await;
    let elapsed = started.elapsed();
    assert_eq!(
        report.result,
        Err(SelectError::DeadlineExceeded { deadline_ms: 400 }),
        "{blocker:?}: {:?}",
        report.stats
    );
    assert!(
        elapsed >= DEADLINE && elapsed < DEADLINE + Duration::from_secs(2),
        "{blocker:?}: answered after {elapsed:?}"
    );
    assert_eq!(
        (
            report.stats.claims,
            report.stats.lock_attempts,
            report.stats.conflicts + report.stats.stale + report.stats.store_errors
        ),
        (1, 1, 0),
        "{blocker:?}: cut while its first claim waited: {:?}",
        report.stats
    );
    let mine = |locks: &[LockInfo]| locks.iter().filter(|l| l.consumer == consumer).count();
    let locks = stores.locks.list_locks().await.expect("locks");
    assert_eq!(mine(&locks), 0, "{blocker:?}: {locks:?}");
    // The other session lets go. The cut claim now wins its token, and the
    // select's cleanup gives it back: a select of the whole wallet (default
    // deadline) gets all four tokens, woken by that release if it came first,
    // and the late select has neither a lock nor a selection left.
    sqlx::query("ROLLBACK")
        .execute(&mut other)
        .await
        .expect("rollback");
    let patient = TokenSelector::new(
        stores.clone(),
        TokioClock::new(),
        SelectionConfig::default(),
        Some(4),
    )
    .expect("config");
    let everything = patient
        .select(&hot, &chf, q(40), &tx(&format!("all-{blocker:?}")))
        .await
        .expect("the whole wallet, once the cut claim's lock is given back");
    assert_eq!(everything.tokens.len(), 4, "{blocker:?}: {everything:?}");
    let locks = stores.locks.list_locks().await.expect("locks");
    assert_eq!(mine(&locks), 0, "{blocker:?}: {locks:?}");
    let selections: i64 = sqlx::query_scalar("SELECT count(*) FROM selections WHERE consumer = $1")
        .bind(consumer.as_str())
        .fetch_one(&mut other)
        .await
        .expect("selections");
    assert_eq!(selections, 0, "{blocker:?}: selection rows left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_select_behind_row_locks_answers_at_its_deadline_and_holds_nothing() {
    let Some(db) = TestDb::create("select_deadline::behind_row_locks").await else {
        return;
    };
    behind(&db, Blocker::RowLocks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_select_behind_the_line_and_uncommitted_locks_answers_at_its_deadline() {
    let Some(db) = TestDb::create("select_deadline::behind_the_line").await else {
        return;
    };
    behind(&db, Blocker::LineAndLockRows).await;
}
