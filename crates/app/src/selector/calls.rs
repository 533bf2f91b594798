//! The store calls of a select, each run as its own task, and the guard that gives
//! back what a dropped select holds or may hold.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use holdfast_domain::{ClaimVerdict, FaultKind, Timestamp, TokenId, TxId};
use holdfast_ports::{LockStore, LockStoreError, StoreFault, TokenStoreError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::metrics as m;

/// Claims `tokens` for `consumer`: one token through [`LockStore::claim`], several
/// through [`LockStore::claim_window`].
pub(super) async fn claim(
    locks: Arc<dyn LockStore>,
    consumer: TxId,
    tokens: Vec<TokenId>,
    at: Timestamp,
) -> Result<Vec<(TokenId, ClaimVerdict)>, StoreFault> {
    match tokens.as_slice() {
        [single] => locks
            .claim(&consumer, single, at)
            .await
            .map(|verdict| vec![(single.clone(), verdict)])
            .map_err(failure),
        many => locks
            .claim_window(&consumer, many, at)
            .await
            .map_err(failure),
    }
}

/// Re-stamps the locks `consumer` holds among `tokens`; returns those still held.
pub(super) async fn renew(
    locks: Arc<dyn LockStore>,
    consumer: TxId,
    tokens: Vec<TokenId>,
    at: Timestamp,
) -> Result<Vec<TokenId>, StoreFault> {
    locks.renew(&consumer, &tokens, at).await.map_err(failure)
}

/// Releases `tokens` held by `consumer` (only these).
pub(super) async fn release(
    locks: Arc<dyn LockStore>,
    consumer: TxId,
    tokens: Vec<TokenId>,
) -> Result<u64, StoreFault> {
    locks
        .release_tokens(&consumer, &tokens)
        .await
        .map_err(failure)
}

/// The engine's view of a port error: its fault, as the adapter reported it;
/// anything else (a refusal the selector never provokes, such as a window too
/// large) is a [`FaultKind::Backend`] fault.
pub(super) fn failure(e: impl PortError) -> StoreFault {
    match e.fault() {
        Some(fault) => fault.clone(),
        None => StoreFault::new(FaultKind::Backend, e.to_string()),
    }
}

/// The port errors a select meets.
pub(super) trait PortError: std::fmt::Display {
    /// The backend's fault, if the error is one.
    fn fault(&self) -> Option<&StoreFault>;
}

impl PortError for LockStoreError {
    fn fault(&self) -> Option<&StoreFault> {
        match self {
            LockStoreError::Fault(fault) => Some(fault),
            _ => None,
        }
    }
}

impl PortError for TokenStoreError {
    fn fault(&self) -> Option<&StoreFault> {
        match self {
            TokenStoreError::Fault(fault) => Some(fault),
            _ => None,
        }
    }
}

/// Attempts of [`give_back`], and the backoff before its second attempt (doubling).
const GIVE_BACK_ATTEMPTS: u32 = 8;
const GIVE_BACK_BACKOFF: Duration = Duration::from_millis(100);

/// Gives back tokens a select call won but does not answer with (it failed, was
/// cancelled, or lost some to the sweep): releases their locks and forgets their
/// selections, retrying a failing store with a doubling backoff (about 25 s in
/// all). Forgetting matters beyond the lease: a selection left behind would be
/// spent by a later Confirmed of the same transaction.
pub(super) async fn give_back(
    locks: Arc<dyn LockStore>,
    consumer: TxId,
    tokens: Vec<TokenId>,
    reason: &'static str,
) {
    let mut delay = GIVE_BACK_BACKOFF;
    for attempt in 1..=GIVE_BACK_ATTEMPTS {
        match locks.release_tokens(&consumer, &tokens).await {
            Ok(released) => {
                metrics::counter!(m::LOCKS_RELEASED, "reason" => reason).increment(released);
                return;
            }
            Err(e) if attempt == GIVE_BACK_ATTEMPTS => tracing::error!(
                %consumer,
                tokens = tokens.len(),
                error = %e,
                "could not give back a select's tokens; their locks expire with the lease, \
                 but a Confirmed of this transaction would spend them"
            ),
            Err(_) => {
                tokio::time::sleep(delay).await;
                delay = delay.saturating_mul(2);
            }
        }
    }
}

/// Covers what a select call holds or may hold, and its store call in flight, for
/// as long as the call runs; releases them if the call is dropped before it
/// answered.
pub(super) struct HeldGuard {
    pub(super) locks: Arc<dyn LockStore>,
    pub(super) consumer: TxId,
    /// The tokens this call holds or may hold, including those of the claim in
    /// flight.
    pub(super) held: Vec<TokenId>,
    /// The store call in flight, run as its own task.
    pub(super) in_flight: Option<JoinHandle<()>>,
}

impl HeldGuard {
    /// Runs one store call as its own task and waits for its answer. If the select
    /// is dropped meanwhile, the task runs on, and the cleanup waits for it before
    /// releasing. A task that ends without an answer (it panicked, or the runtime
    /// is shutting down) is a store failure.
    pub(super) async fn perform<T: Send + 'static>(
        &mut self,
        call: impl Future<Output = Result<T, StoreFault>> + Send + 'static,
    ) -> Result<T, StoreFault> {
        self.perform_with(call, drop).await
    }

    /// As [`HeldGuard::perform`]; an answer the dropped select cannot take goes
    /// to `undelivered` (in the call's task).
    pub(super) async fn perform_with<T: Send + 'static>(
        &mut self,
        call: impl Future<Output = Result<T, StoreFault>> + Send + 'static,
        undelivered: impl FnOnce(Result<T, StoreFault>) + Send + 'static,
    ) -> Result<T, StoreFault> {
        let (answer_tx, answer_rx) = oneshot::channel();
        let task = async move {
            // The receiver is gone only when the select was dropped; the cleanup
            // then waits for this task instead.
            if let Err(answer) = answer_tx.send(call.await) {
                undelivered(answer);
            }
        };
        self.in_flight = Some(tokio::spawn(task.in_current_span()));
        let answer = answer_rx.await.unwrap_or_else(|_| {
            Err(StoreFault::new(
                FaultKind::Backend,
                "the store call ended without an answer (it panicked or was cancelled)",
            ))
        });
        self.in_flight = None;
        answer
    }
}

impl Drop for HeldGuard {
    fn drop(&mut self) {
        let in_flight = self.in_flight.take();
        if self.held.is_empty() {
            // Nothing held, and a call in flight holds nothing either: a claim
            // in flight has its tokens in `held`.
            return;
        }
        let tokens = std::mem::take(&mut self.held);
        let consumer = self.consumer.clone();
        let locks = self.locks.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                tracing::debug!(%consumer, tokens = tokens.len(), "select cancelled; releasing its locks");
                runtime.spawn(async move {
                    // A claim in flight may still commit: release after it ended.
                    if let Some(call) = in_flight {
                        let _ = call.await;
                    }
                    give_back(locks, consumer, tokens, "cancelled").await;
                });
            }
            Err(_) => tracing::warn!(
                %consumer,
                tokens = tokens.len(),
                "select dropped outside a tokio runtime; its locks are left to the lease sweep"
            ),
        }
    }
}
