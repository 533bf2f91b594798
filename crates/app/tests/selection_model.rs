//! A model test of token selection on a real SQLite file: proptest generates
//! interleavings of concurrent selects (through the app's `TokenSelector`),
//! crashes (a select dropped mid-way), settlements, clock advances and lease
//! sweeps, and after every step the database is checked against the model:
//!
//! - no token is held by two live consumers, and each live consumer still holds
//!   exactly what its select returned;
//! - no spent token is ever selected;
//! - every lock of a settled (Confirmed or Deleted) transaction is released;
//! - after a sweep, no lock is older than the lease.
//!
//! Crashed selects leave what they leave (their in-flight claim may commit after
//! the drop): those locks belong to no live consumer and only the sweep or a
//! settlement may remove them. Before checking, the test waits until every store
//! call that was started has finished (see [`InFlight`]), observing completion,
//! never time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use holdfast::TokenSelector;
use holdfast::settlement::Settlement;
use holdfast::sweeper::sweep_once;
use holdfast_adapters_sqlite::{SqliteBackend, SqliteOptions};
use holdfast_domain::{
    Candidate, ClaimVerdict, LeaseConfig, PersistPolicy, Precision, Quantity, SelectionConfig,
    SettlementStatus, SweepRule, Timestamp, Token, TokenId, TokenType, TxId, TxStatus, WalletId,
};
use holdfast_ports::{
    BandQuery, CandidateQuery, Clock, Confirmation, LockInfo, LockStore, LockStoreError, NewToken,
    Output, Stores, SweepReport, TokenStore, TokenStoreError,
};
use proptest::prelude::*;
use tokio::sync::Notify;

const LEASE: Duration = Duration::from_secs(180);
const T0: u64 = 1_796_025_600_000;

#[derive(Debug, Default)]
struct ManualClock(AtomicU64);

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

/// Counts store calls that started and have not finished. Each call runs in its
/// own task, so dropping the caller (a crashed select) does not hide a call that
/// is still running: [`InFlight::idle`] waits for it.
#[derive(Debug, Default)]
struct Gauge {
    running: AtomicUsize,
    done: Notify,
}

impl Gauge {
    async fn idle(&self) {
        loop {
            let notified = self.done.notified();
            if self.running.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

struct InFlight {
    tokens: Arc<dyn TokenStore>,
    locks: Arc<dyn LockStore>,
    gauge: Arc<Gauge>,
}

impl InFlight {
    async fn track<T: Send + 'static>(
        &self,
        call: impl std::future::Future<Output = T> + Send + 'static,
    ) -> T {
        let gauge = self.gauge.clone();
        gauge.running.fetch_add(1, Ordering::SeqCst);
        let task = tokio::spawn(async move {
            let out = call.await;
            gauge.running.fetch_sub(1, Ordering::SeqCst);
            gauge.done.notify_waiters();
            out
        });
        task.await.expect("store call task")
    }
}

#[async_trait]
impl TokenStore for InFlight {
    async fn add_tokens(&self, tokens: &[NewToken]) -> Result<u64, TokenStoreError> {
        let (s, t) = (self.tokens.clone(), tokens.to_vec());
        self.track(async move { s.add_tokens(&t).await }).await
    }
    async fn set_spendable(&self, token: &TokenId, on: bool) -> Result<bool, TokenStoreError> {
        let (s, t) = (self.tokens.clone(), token.clone());
        self.track(async move { s.set_spendable(&t, on).await })
            .await
    }
    async fn candidates(&self, query: &CandidateQuery) -> Result<Vec<Candidate>, TokenStoreError> {
        let (s, q) = (self.tokens.clone(), query.clone());
        self.track(async move { s.candidates(&q).await }).await
    }
    async fn candidate_bands(&self, query: &BandQuery) -> Result<Vec<Candidate>, TokenStoreError> {
        let (s, q) = (self.tokens.clone(), query.clone());
        self.track(async move { s.candidate_bands(&q).await }).await
    }
    async fn balance(&self, w: &WalletId, t: &TokenType) -> Result<Quantity, TokenStoreError> {
        let (s, w, t) = (self.tokens.clone(), w.clone(), t.clone());
        self.track(async move { s.balance(&w, &t).await }).await
    }
    async fn balance_for(
        &self,
        w: &WalletId,
        t: &TokenType,
        c: &TxId,
    ) -> Result<Quantity, TokenStoreError> {
        let (s, w, t, c) = (self.tokens.clone(), w.clone(), t.clone(), c.clone());
        self.track(async move { s.balance_for(&w, &t, &c).await })
            .await
    }
    async fn list_tokens(
        &self,
        w: &WalletId,
        t: Option<TokenType>,
        limit: usize,
    ) -> Result<Vec<Token>, TokenStoreError> {
        let (s, w) = (self.tokens.clone(), w.clone());
        self.track(async move { s.list_tokens(&w, t, limit).await })
            .await
    }
    async fn token(&self, id: &TokenId) -> Result<Option<Token>, TokenStoreError> {
        let (s, id) = (self.tokens.clone(), id.clone());
        self.track(async move { s.token(&id).await }).await
    }
}

#[async_trait]
impl LockStore for InFlight {
    async fn claim(
        &self,
        c: &TxId,
        t: &TokenId,
        at: Timestamp,
    ) -> Result<ClaimVerdict, LockStoreError> {
        let (s, c, t) = (self.locks.clone(), c.clone(), t.clone());
        self.track(async move { s.claim(&c, &t, at).await }).await
    }
    async fn claim_window(
        &self,
        c: &TxId,
        t: &[TokenId],
        at: Timestamp,
    ) -> Result<Vec<(TokenId, ClaimVerdict)>, LockStoreError> {
        let (s, c, t) = (self.locks.clone(), c.clone(), t.to_vec());
        self.track(async move { s.claim_window(&c, &t, at).await })
            .await
    }
    async fn release_consumer(
        &self,
        c: &TxId,
        at: Timestamp,
        record: bool,
    ) -> Result<u64, LockStoreError> {
        let (s, c) = (self.locks.clone(), c.clone());
        self.track(async move { s.release_consumer(&c, at, record).await })
            .await
    }
    async fn renew(
        &self,
        c: &TxId,
        t: &[TokenId],
        at: Timestamp,
    ) -> Result<Vec<TokenId>, LockStoreError> {
        let (s, c, t) = (self.locks.clone(), c.clone(), t.to_vec());
        self.track(async move { s.renew(&c, &t, at).await }).await
    }
    async fn selected(&self, c: &TxId) -> Result<Vec<Token>, LockStoreError> {
        let (s, c) = (self.locks.clone(), c.clone());
        self.track(async move { s.selected(&c).await }).await
    }
    async fn unsettled_owned(&self) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError> {
        let s = self.locks.clone();
        self.track(async move { s.unsettled_owned().await }).await
    }
    async fn unsettled(&self) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError> {
        let s = self.locks.clone();
        self.track(async move { s.unsettled().await }).await
    }
    async fn release_tokens(&self, c: &TxId, t: &[TokenId]) -> Result<u64, LockStoreError> {
        let (s, c, t) = (self.locks.clone(), c.clone(), t.to_vec());
        self.track(async move { s.release_tokens(&c, &t).await })
            .await
    }
    async fn spend_consumer(
        &self,
        c: &TxId,
        at: Timestamp,
        record: bool,
    ) -> Result<Vec<TokenId>, LockStoreError> {
        let (s, c) = (self.locks.clone(), c.clone());
        self.track(async move { s.spend_consumer(&c, at, record).await })
            .await
    }
    async fn confirm(
        &self,
        c: &TxId,
        outputs: &[Output],
        at: Timestamp,
    ) -> Result<Confirmation, LockStoreError> {
        let (s, c, outputs) = (self.locks.clone(), c.clone(), outputs.to_vec());
        self.track(async move { s.confirm(&c, &outputs, at).await })
            .await
    }
    async fn sweep(&self, rule: SweepRule) -> Result<SweepReport, LockStoreError> {
        let s = self.locks.clone();
        self.track(async move { s.sweep(rule).await }).await
    }
    async fn list_locks(&self) -> Result<Vec<LockInfo>, LockStoreError> {
        let s = self.locks.clone();
        self.track(async move { s.list_locks().await }).await
    }
    fn round_trips(&self) -> u64 {
        self.locks.round_trips()
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// Selects started together; `Some(n)` crashes that one after `n` yields.
    Round(Vec<(u128, Option<u8>)>),
    /// Settles the `n`-th known consumer (live or crashed) with a status.
    Settle(usize, TxStatus),
    /// Moves the clock forward.
    Advance(u64),
    /// Runs one lease sweep.
    Sweep,
}

fn step() -> impl Strategy<Value = Step> {
    let select = (1u128..=12, prop::option::weighted(0.3, 0u8..6));
    prop_oneof![
        4 => prop::collection::vec(select, 1..=4).prop_map(Step::Round),
        2 => (0usize..16, prop::sample::select(vec![TxStatus::Confirmed, TxStatus::Deleted, TxStatus::Busy]))
            .prop_map(|(n, s)| Step::Settle(n, s)),
        1 => (0u64..=200_000).prop_map(Step::Advance),
        1 => Just(Step::Sweep),
    ]
}

fn id<T>(r: Result<T, holdfast_domain::IdError>) -> T {
    r.expect("valid id")
}

/// What the test knows.
#[derive(Debug, Default)]
struct Model {
    /// Consumers whose select succeeded and who still hold their tokens.
    live: BTreeMap<TxId, BTreeSet<TokenId>>,
    /// Consumers whose select was dropped mid-way.
    crashed: BTreeSet<TxId>,
    /// Settled as Confirmed or Deleted: they must hold nothing.
    settled: BTreeSet<TxId>,
    /// Tokens spent by a Confirmed settlement.
    spent: BTreeSet<TokenId>,
    /// Every consumer so far, in order (settle targets).
    known: Vec<TxId>,
}

async fn locks_by_token(stores: &Stores) -> BTreeMap<TokenId, LockInfo> {
    stores
        .locks
        .list_locks()
        .await
        .expect("list locks")
        .into_iter()
        .map(|l| (l.token.clone(), l))
        .collect()
}

async fn check(stores: &Stores, model: &Model, context: &str) {
    let locks = locks_by_token(stores).await;
    for (consumer, tokens) in &model.live {
        for t in tokens {
            let holder = locks.get(t).map(|l| &l.consumer);
            assert_eq!(holder, Some(consumer), "{context}: {t} of live {consumer}");
        }
    }
    for lock in locks.values() {
        assert!(
            !model.settled.contains(&lock.consumer),
            "{context}: settled {} still holds {}",
            lock.consumer,
            lock.token
        );
        assert!(
            !model.spent.contains(&lock.token),
            "{context}: spent {} is locked",
            lock.token
        );
    }
}

async fn run_case(amounts: Vec<u128>, steps: Vec<Step>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("model.db").display());
    let backend = SqliteBackend::open(&url, SqliteOptions::default())
        .await
        .expect("open");
    let stores = backend.stores();
    let wallet = id(WalletId::new("w"));
    let chf = id(TokenType::new("CHF"));
    let tokens: Vec<NewToken> = amounts
        .iter()
        .enumerate()
        .map(|(i, a)| NewToken {
            id: TokenId::new(id(TxId::new(format!("t{i}"))), 0),
            wallet: wallet.clone(),
            token_type: chf.clone(),
            quantity: Quantity::new(*a, Precision::default()).expect("amount"),
            spendable: true,
        })
        .collect();
    stores.tokens.add_tokens(&tokens).await.expect("seed");

    let clock = Arc::new(ManualClock(AtomicU64::new(T0)));
    let gauge = Arc::new(Gauge::default());
    let tracked = Arc::new(InFlight {
        tokens: stores.tokens.clone(),
        locks: stores.locks.clone(),
        gauge: gauge.clone(),
    });
    let selector_stores = Stores {
        tokens: tracked.clone(),
        locks: tracked,
        ..stores.clone()
    };
    let config = SelectionConfig {
        max_immediate_retries: 3,
        max_retries: 3,
        retry_interval: Duration::from_millis(2),
        ..SelectionConfig::default()
    };
    let selector = Arc::new(
        TokenSelector::new(selector_stores, clock.clone(), config, Some(1)).expect("selector"),
    );
    let settlement = Settlement::new(stores.clone(), clock.clone(), PersistPolicy::default());
    let lease = LeaseConfig {
        lease_expiry: LEASE,
        ..LeaseConfig::default()
    };

    let mut model = Model::default();
    for (n, step) in steps.into_iter().enumerate() {
        let context = format!("step {n} {step:?}");
        match step {
            Step::Round(selects) => {
                let mut running = Vec::new();
                for (k, (amount, crash)) in selects.into_iter().enumerate() {
                    let consumer = id(TxId::new(format!("c{n}-{k}")));
                    model.known.push(consumer.clone());
                    let (sel, w, t) = (selector.clone(), wallet.clone(), chf.clone());
                    let c = consumer.clone();
                    let amount = Quantity::new(amount, Precision::default()).expect("amount");
                    let task = tokio::spawn(async move { sel.select(&w, &t, amount, &c).await });
                    running.push((consumer, crash, task));
                }
                let mut outcomes = Vec::new();
                for (consumer, crash, task) in running {
                    match crash {
                        Some(yields) => {
                            for _ in 0..yields {
                                tokio::task::yield_now().await;
                            }
                            task.abort();
                            let _ = task.await;
                            model.crashed.insert(consumer);
                        }
                        None => outcomes.push((consumer, task.await.expect("select task"))),
                    }
                }
                gauge.idle().await;
                for (consumer, outcome) in outcomes {
                    let Ok(selected) = outcome else { continue };
                    let chosen: BTreeSet<TokenId> = selected.tokens.iter().cloned().collect();
                    assert_eq!(
                        chosen.len(),
                        selected.tokens.len(),
                        "{context}: a token twice"
                    );
                    for t in &chosen {
                        assert!(!model.spent.contains(t), "{context}: spent {t} selected");
                        let stored = stores
                            .tokens
                            .token(t)
                            .await
                            .expect("token")
                            .expect("exists");
                        assert_eq!(stored.spent_by, None, "{context}: spent {t} selected");
                        for (other, held) in &model.live {
                            assert!(
                                !held.contains(t),
                                "{context}: {t} of live {other} selected by {consumer}"
                            );
                        }
                    }
                    model.live.insert(consumer, chosen);
                }
            }
            Step::Settle(pick, status) => {
                if model.known.is_empty() {
                    continue;
                }
                let tx = model.known[pick % model.known.len()].clone();
                settlement
                    .on_status(&tx, SettlementStatus::Known(status))
                    .await
                    .expect("settle");
                match status {
                    TxStatus::Confirmed => {
                        if let Some(held) = model.live.remove(&tx) {
                            model.spent.extend(held);
                        }
                        model.settled.insert(tx);
                    }
                    TxStatus::Deleted => {
                        model.live.remove(&tx);
                        model.settled.insert(tx);
                    }
                    _ => {}
                }
            }
            Step::Advance(ms) => {
                clock.0.fetch_add(ms, Ordering::SeqCst);
            }
            Step::Sweep => {
                sweep_once(&*stores.locks, &*clock, &lease)
                    .await
                    .expect("sweep");
                let now = clock.now();
                let cutoff = now.saturating_sub(LEASE);
                let locks = locks_by_token(&stores).await;
                for lock in locks.values() {
                    assert!(
                        lock.created_at >= cutoff,
                        "{context}: {} of {} is older than the lease after a sweep",
                        lock.token,
                        lock.consumer
                    );
                }
                // A consumer that lost any lock to the lease is no longer live.
                model.live.retain(|c, held| {
                    held.iter()
                        .all(|t| locks.get(t).is_some_and(|l| &l.consumer == c))
                });
            }
        }
        check(&stores, &model, &context).await;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn selection_model_holds_under_concurrency_crashes_settlements_and_sweeps(
        amounts in prop::collection::vec(1u128..=5, 4..=10),
        steps in prop::collection::vec(step(), 1..=12),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(run_case(amounts, steps));
    }
}
