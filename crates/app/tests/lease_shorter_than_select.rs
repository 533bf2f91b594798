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

use common::{q, tx};
use holdfast::TokenSelector;
use holdfast_adapters_postgres::LockStrategy;
use holdfast_adapters_sqlite::SqliteBackend;
use holdfast_domain::{
    ClaimVerdict, LeaseConfig, SelectRequest, SelectionConfig, SweepRule, Timestamp, TokenId,
    TokenType, TxId, WalletId,
};
use holdfast_ports::{Clock, LockStore, LockStoreError, NewToken, Stores, forward_lock_store};
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

forward_lock_store! {
    impl LockStore for SlowFirstClaim {
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
    }
    forward to inner: claim, renew, release_consumer, release_tokens, spend_consumer, confirm,
        selected, unsettled_owned, unsettled, sweep, list_locks, round_trips
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
