//! Helpers shared by the services tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use holdfast_domain::{Candidate, Precision, Quantity, Timestamp, TokenId, TxId};
use holdfast_ports::{
    Clock, MockLockStore, MockQueueStore, MockTokenStore, MockTxStatusStore, ReadWithClaim,
    Registry, Stores,
};

pub fn q(v: u128) -> Quantity {
    Quantity::new(v, Precision::MAX).expect("test quantity")
}

pub fn tx(id: &str) -> TxId {
    TxId::new(id).expect("test tx id")
}

pub fn tok(id: &str) -> TokenId {
    TokenId::new(tx(id), 0)
}

pub fn cand(id: &str, v: u128) -> Candidate {
    Candidate {
        id: tok(id),
        quantity: q(v),
    }
}

/// A clock reading tokio time (paused in tests) from a fixed epoch offset.
#[derive(Debug)]
pub struct TokioClock {
    start: tokio::time::Instant,
}

impl TokioClock {
    pub fn new() -> Arc<Self> {
        Arc::new(TokioClock {
            start: tokio::time::Instant::now(),
        })
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        Timestamp::from_millis(1_000_000 + ms)
    }
}

/// Admission over `stores`' queue store with the default policy and no ancestry
/// (every build a full build).
pub fn admission(stores: &Stores) -> holdfast::Admission {
    holdfast::Admission::new(
        stores.queues.clone(),
        Arc::new(holdfast::NoAncestry),
        holdfast::AdmissionPolicy::default(),
    )
}

/// Mock stores; the mock lock store reads and claims in two calls, as a store
/// without [`holdfast_ports::LockStore::read_and_claim`] does.
pub fn stores(
    tokens: MockTokenStore,
    mut locks: MockLockStore,
    statuses: MockTxStatusStore,
) -> Stores {
    locks
        .expect_read_with_claim()
        .return_const(ReadWithClaim::Never);
    locks
        .expect_read_and_claim()
        .returning(|_, _, _, _| Ok(None));
    Stores {
        tokens: Arc::new(tokens),
        locks: Arc::new(locks),
        statuses: Arc::new(statuses),
        queues: Arc::new(MockQueueStore::new()),
        wake: Arc::new(Registry::new()),
    }
}

/// A database file removed (with its WAL files) before and after the test.
pub struct TempDb(PathBuf);

impl TempDb {
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "holdfast-services-{}-{name}.db",
            std::process::id()
        ));
        let db = TempDb(path);
        db.remove();
        db
    }
    pub fn url(&self) -> String {
        format!("sqlite://{}", self.0.display())
    }
    fn remove(&self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.0.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        self.remove();
    }
}
