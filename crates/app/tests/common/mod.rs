//! Helpers shared by the services tests.
#![allow(dead_code)]

use std::sync::Arc;

use holdfast_domain::{Candidate, Precision, Quantity, Timestamp, TokenId, TxId};
use holdfast_ports::{
    Clock, MockLockStore, MockQueueStore, MockTokenStore, MockTxStatusStore, Stores,
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

pub fn stores(tokens: MockTokenStore, locks: MockLockStore, statuses: MockTxStatusStore) -> Stores {
    Stores {
        tokens: Arc::new(tokens),
        locks: Arc::new(locks),
        statuses: Arc::new(statuses),
        queues: Arc::new(MockQueueStore::new()),
    }
}
