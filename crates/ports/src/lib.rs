//! holdfast ports: the async traits holdfast needs from stores and the clock, their
//! mocks, and the conformance suite every adapter runs unchanged.
//!
//! Adapters report facts (a claim was won, stale or contended; a compare-and-set
//! applied or conflicted) and never decide policy; the domain decides. Losing a
//! race and finding a token stale are verdicts, never errors: errors are reserved
//! for the backend failing.
//!
//! Every port is an `#[async_trait]` trait usable as `Arc<dyn Port>`, and has a
//! mockall mock (`MockTokenStore`, `MockLockStore`, ...).
#![warn(missing_docs)]

pub mod clock;
pub mod delivery;
pub mod error;
mod forward;
pub mod locks;
pub mod queues;
pub mod statuses;
pub mod strategy;
pub mod tokens;
pub mod wake;

#[cfg(feature = "conformance")]
pub mod conformance;

use std::sync::Arc;

// For `forward_lock_store!`: the paths its expansion names, whatever the
// caller's own dependencies.
#[doc(hidden)]
pub use async_trait::async_trait as __async_trait;
#[doc(hidden)]
pub use holdfast_domain as __domain;

pub use clock::{Clock, MockClock};
pub use delivery::{
    BuildPublisher, Delivery, DeliveryError, DeliverySource, Message, MockBuildPublisher,
    MockDeliverySource,
};
pub use error::{
    LockStoreError, QueueStoreError, StatusStoreError, StoreFault, TokenStoreError, Unconserved,
};
pub use locks::{
    CandidateRead, Chooser, Confirmation, LockInfo, LockStore, MAX_OUTPUTS, MAX_WINDOW,
    MockLockStore, Output, ReadAndClaim, ReadWithClaim, SweepReport, change_outputs, check_outputs,
    check_window,
};
pub use queues::{CasOutcome, Ingested, MockQueueStore, QueueStore};
pub use statuses::{MockTxStatusStore, TxStatusStore};
pub use strategy::{LockStrategy, UnknownStrategy};
pub use tokens::{BandQuery, CandidateQuery, MockTokenStore, NewToken, TokenStore};
pub use wake::{
    MockWakeUps, Registry, Subscription, WaitEnd, WaitHook, WaitStart, WakeKey, WakeUps,
};

/// One backend's ports, as the app wires them. An adapter returns one of these
/// from its open/connect function; every field may point at the same object.
#[derive(Clone)]
pub struct Stores {
    /// Tokens, candidates and balances.
    pub tokens: Arc<dyn TokenStore>,
    /// Token locks.
    pub locks: Arc<dyn LockStore>,
    /// Transaction statuses.
    pub statuses: Arc<dyn TxStatusStore>,
    /// Build queues and requests.
    pub queues: Arc<dyn QueueStore>,
    /// Wake-up signals: waiting for released locks, minted tokens, freed slots.
    pub wake: Arc<dyn WakeUps>,
}

impl Stores {
    /// The four ports of one object that implements them all (an adapter's
    /// backend): every field is a clone of the same `Arc`.
    pub fn shared<B>(backend: Arc<B>) -> Self
    where
        B: TokenStore + LockStore + TxStatusStore + QueueStore + WakeUps + 'static,
    {
        Stores {
            tokens: backend.clone(),
            locks: backend.clone(),
            statuses: backend.clone(),
            queues: backend.clone(),
            wake: backend,
        }
    }
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores").finish_non_exhaustive()
    }
}
