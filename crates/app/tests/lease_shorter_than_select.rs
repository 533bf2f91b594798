//! A select that runs longer than its locks' lease never returns a token whose lock
//! it no longer holds, on both backends.
//!
//! The wallet holds A (10) and B (10). A select of 15 claims both, but the answer
//! of that first claim arrives 12 s late (a slow network): the injected clock moves
//! on by 12 s and the lease sweep (lease 10 s) runs meanwhile, removing both locks.
//! Before answering (more than half the lease after its first claim) the select
//! re-checks its locks: both are gone, so it gives everything back and selects
//! again. Every token it returns is locked by it when it answers. No test sleeps:
//! time is the injected clock's.

use crate::pg_support;

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::{q, tx};
use holdfast::TokenSelector;
use holdfast_adapters_postgres::LockStrategy;
use holdfast_adapters_sqlite::SqliteBackend;
use holdfast_domain::{
    ClaimVerdict, LeaseConfig, SelectRequest, SelectionConfig, SweepRule, Timestamp, Token,
    TokenId, TokenType, TxId, TxStatus, WalletId,
};
use holdfast_ports::{
    Clock, Confirmation, LockInfo, LockStore, LockStoreError, NewToken, Output, Stores, SweepReport,
};
use pg_support::TestDb;

const LEASE: Duration = Duration::from_secs(10);

fn token(n: u32) -> TokenId {
    TokenId::new(tx("funding"), n)
}

async fn check(stores: Stores) {
    let wallet = WalletId::new("w").expect("wallet");
    let chf = TokenType::new("CHF").expect("type");
    let funding: Vec<NewToken> = (0..2)
        .map(|n| NewToken {
            id: token(n),
            wallet: wallet.clone(),
            token_type: chf.clone(),
            quantity: q(10),
            spendable: true,
        })
        .collect();
    stores.tokens.add_tokens(&funding).await.expect("funded");
    let clock = Arc::new(ManualClock(AtomicU64::new(1_000_000)));
    let stores = Stores {
        locks: Arc::new(SlowFirstClaim {
            inner: stores.locks.clone(),
            clock: clock.clone(),
            delayed: AtomicBool::new(false),
        }),
        ..stores
    };
    let config = SelectionConfig {
        max_retries: 10,
        retry_interval: Duration::from_secs(30),
        ..SelectionConfig::default()
    };
    let selector = TokenSelector::new(stores.clone(), clock.clone(), config, None)
        .expect("config")
        .with_lease(LEASE);
    let request = SelectRequest {
        wallet,
        token_type: chf,
        amount: q(15),
        consumer: tx("slow"),
    };
    let report = selector.select_seeded(&request, 7).await;

    let selected = report.result.expect("the select succeeds once B is free");
    assert_eq!(selected.tokens.len(), 2, "{selected:?}");
    assert!(report.stats.renewals >= 1, "{:?}", report.stats);
    assert_eq!(
        report.stats.locks_lost, 2,
        "the sweep took both while the claim's answer was late: {:?}",
        report.stats
    );
    let locks = stores.locks.list_locks().await.expect("locks");
    for t in &selected.tokens {
        assert!(
            locks
                .iter()
                .any(|l| l.token == *t && l.consumer == tx("slow")),
            "{t} is returned, so it must be locked by the select: {locks:?}"
        );
    }
}

/// The sweep rule of [`LEASE`] at `now`.
fn rule_at(now: Timestamp) -> SweepRule {
    LeaseConfig {
        lease_expiry: LEASE,
        ..LeaseConfig::default()
    }
    .sweep_rule(now)
}

/// A clock the test moves by hand.
struct ManualClock(AtomicU64);

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.0.load(Ordering::SeqCst))
    }
}

/// The real lock store, except that the answer of the first window claim arrives
/// 12 s late: the clock moves on by 12 s and the lease sweep runs before the
/// answer is returned.
struct SlowFirstClaim {
    inner: Arc<dyn LockStore>,
    clock: Arc<ManualClock>,
    delayed: AtomicBool,
}

#[async_trait]
impl LockStore for SlowFirstClaim {
    async fn claim(
        &self,
        c: &TxId,
        t: &TokenId,
        at: Timestamp,
    ) -> Result<ClaimVerdict, LockStoreError> {
        self.inner.claim(c, t, at).await
    }
    async fn claim_window(
        &self,
        c: &TxId,
        t: &[TokenId],
        at: Timestamp,
    ) -> Result<Vec<(TokenId, ClaimVerdict)>, LockStoreError> {
        let verdicts = self.inner.claim_window(c, t, at).await;
        if !self.delayed.swap(true, Ordering::SeqCst) {
            self.clock.0.fetch_add(12_000, Ordering::SeqCst);
            let swept = self.inner.sweep(rule_at(self.clock.now())).await?;
            assert_eq!(swept.expired, 2, "the sweep takes both locks: {swept:?}");
        }
        verdicts
    }
    async fn renew(
        &self,
        c: &TxId,
        t: &[TokenId],
        at: Timestamp,
    ) -> Result<Vec<TokenId>, LockStoreError> {
        self.inner.renew(c, t, at).await
    }
    async fn release_consumer(
        &self,
        c: &TxId,
        at: Timestamp,
        record: bool,
    ) -> Result<u64, LockStoreError> {
        self.inner.release_consumer(c, at, record).await
    }
    async fn release_tokens(&self, c: &TxId, t: &[TokenId]) -> Result<u64, LockStoreError> {
        self.inner.release_tokens(c, t).await
    }
    async fn spend_consumer(
        &self,
        c: &TxId,
        at: Timestamp,
        record: bool,
    ) -> Result<Vec<TokenId>, LockStoreError> {
        self.inner.spend_consumer(c, at, record).await
    }
    async fn confirm(
        &self,
        c: &TxId,
        outputs: &[Output],
        at: Timestamp,
    ) -> Result<Confirmation, LockStoreError> {
        self.inner.confirm(c, outputs, at).await
    }
    async fn selected(&self, c: &TxId) -> Result<Vec<Token>, LockStoreError> {
        self.inner.selected(c).await
    }
    async fn unsettled_owned(&self) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError> {
        self.inner.unsettled_owned().await
    }
    async fn unsettled(&self) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError> {
        self.inner.unsettled().await
    }
    async fn sweep(&self, rule: SweepRule) -> Result<SweepReport, LockStoreError> {
        self.inner.sweep(rule).await
    }
    async fn list_locks(&self) -> Result<Vec<LockInfo>, LockStoreError> {
        self.inner.list_locks().await
    }
    fn round_trips(&self) -> u64 {
        self.inner.round_trips()
    }
}

#[tokio::test]
async fn sqlite_a_select_longer_than_the_lease_holds_what_it_returns() {
    let backend = SqliteBackend::open_in_memory().await.expect("open");
    check(backend.stores()).await;
}

#[tokio::test]
async fn postgres_a_select_longer_than_the_lease_holds_what_it_returns() {
    let Some(db) = TestDb::create("lease_shorter_than_select").await else {
        return;
    };
    for strategy in LockStrategy::ALL {
        let db = TestDb::create_on(&db.url, "lease_shorter_than_select").await;
        let backend = db.backend(strategy, 4).await;
        check(backend.stores()).await;
    }
}
