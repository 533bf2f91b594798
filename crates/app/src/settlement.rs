//! Settlement: applies the domain's lock lifecycle rules ([`holdfast_domain::lease`])
//! when a transaction's status is reported, and once at start-up to every consumer
//! that still holds locks.
//!
//! - Confirmed: record the status, then [`LockStore::spend_consumer`] (the held
//!   tokens are marked spent by it and their locks released, in one step).
//! - Deleted / Invalid: record Deleted, then [`LockStore::release_consumer`].
//! - Pending and Orphan are recorded and keep the locks (the sweep releases Orphan).
//! - Busy, Unknown and unrecognised codes change nothing: not recorded, not released.
//! - Recording a releasing status is retried per [`PersistPolicy`] (tokio time);
//!   when the retries are exhausted the locks are released anyway, exactly once.
//!   Dropping the future during a retry backoff releases nothing (the listener was
//!   cancelled): [`Settlement::recover`] and the lease sweep are the backstops.

use std::collections::BTreeMap;
use std::sync::Arc;

use holdfast_domain::lease::settlement_action;
use holdfast_domain::{
    LockAction, PersistPolicy, PersistResult, PersistStep, SettlementStatus, TokenId, TxId,
    TxStatus,
};
use holdfast_ports::{Clock, LockStoreError, StatusStoreError, Stores};
use holdfast_ports::{LockStore, TxStatusStore};
use tracing::Instrument;

use crate::metrics as m;

/// Why settling failed. Settling is idempotent: the caller may simply retry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettleError {
    /// Releasing or spending the consumer's locks failed.
    #[error("settling {tx}: lock store: {source}")]
    Locks {
        /// The transaction.
        tx: TxId,
        /// The store error.
        source: LockStoreError,
    },
    /// The recovery pass could not list the locks.
    #[error("recovery: listing locks: {source}")]
    ListLocks {
        /// The store error.
        source: LockStoreError,
    },
    /// Recording a status that releases nothing failed (releasing statuses retry and
    /// then release anyway).
    #[error("settling {tx}: status store: {source}")]
    Status {
        /// The transaction.
        tx: TxId,
        /// The store error.
        source: StatusStoreError,
    },
}

/// What one settlement did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The transaction.
    pub tx: TxId,
    /// The status recorded, if any (and if recording succeeded).
    pub recorded: Option<TxStatus>,
    /// Whether the locks were released (spent or freed).
    pub action: LockAction,
    /// Attempts made to record the status (0 when nothing is recorded).
    pub persist_attempts: u32,
    /// Locks released without spending (Deleted / Invalid).
    pub released: u64,
    /// Tokens marked spent (Confirmed).
    pub spent: Vec<TokenId>,
}

/// What the start-up recovery pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Consumers holding locks.
    pub consumers: u64,
    /// Of them, those with a releasing status whose locks were released.
    pub settled: u64,
    /// Locks released without spending.
    pub released: u64,
    /// Tokens marked spent.
    pub spent: u64,
}

/// Applies settlement statuses to the lock and status stores.
pub struct Settlement {
    locks: Arc<dyn LockStore>,
    statuses: Arc<dyn TxStatusStore>,
    clock: Arc<dyn Clock>,
    policy: PersistPolicy,
}

impl std::fmt::Debug for Settlement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settlement")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

fn status_label(status: &SettlementStatus) -> &'static str {
    match status {
        SettlementStatus::Known(s) => s.as_str(),
        SettlementStatus::Invalid => "invalid",
        SettlementStatus::Unrecognised(_) => "unrecognised",
    }
}

impl Settlement {
    /// Settlement over `stores` (locks and statuses are used). A `policy` with
    /// `max_attempts` of 0 is treated as 1.
    pub fn new(stores: Stores, clock: Arc<dyn Clock>, policy: PersistPolicy) -> Self {
        Settlement {
            locks: stores.locks,
            statuses: stores.statuses,
            clock,
            policy: PersistPolicy {
                max_attempts: policy.max_attempts.max(1),
                ..policy
            },
        }
    }

    /// Applies `status` reported for `tx` (see the [module documentation](self)).
    pub async fn on_status(
        &self,
        tx: &TxId,
        status: SettlementStatus,
    ) -> Result<Settled, SettleError> {
        let span = tracing::info_span!("settle", %tx, status = status_label(&status));
        self.settle(tx, status).instrument(span).await
    }

    async fn settle(&self, tx: &TxId, status: SettlementStatus) -> Result<Settled, SettleError> {
        metrics::counter!(m::SETTLEMENT_STATUSES, "status" => status_label(&status)).increment(1);
        let mut settled = Settled {
            tx: tx.clone(),
            recorded: None,
            action: LockAction::Keep,
            persist_attempts: 0,
            released: 0,
            spent: Vec::new(),
        };
        let to_record = match (&status, status.recorded()) {
            // Busy and Unknown say nothing new about the transaction.
            (SettlementStatus::Known(TxStatus::Busy | TxStatus::Unknown), _) | (_, None) => {
                tracing::debug!("status changes nothing");
                return Ok(settled);
            }
            (_, Some(recorded)) => recorded,
        };
        if settlement_action(&status) == LockAction::Keep {
            settled.persist_attempts = 1;
            self.statuses
                .record_status(tx, to_record, self.clock.now())
                .await
                .map_err(|source| SettleError::Status {
                    tx: tx.clone(),
                    source,
                })?;
            settled.recorded = Some(to_record);
            return Ok(settled);
        }
        let mut attempt = 0u32;
        let action = loop {
            attempt += 1;
            let result = match self
                .statuses
                .record_status(tx, to_record, self.clock.now())
                .await
            {
                Ok(()) => {
                    settled.recorded = Some(to_record);
                    PersistResult::Persisted
                }
                Err(e) => {
                    metrics::counter!(m::SETTLEMENT_PERSIST_FAILURES).increment(1);
                    tracing::warn!(attempt, error = %e, "could not record the status");
                    PersistResult::Failed
                }
            };
            match self.policy.after_attempt(&status, attempt, result) {
                PersistStep::Done(action) => break action,
                PersistStep::RetryAfter(delay) => tokio::time::sleep(delay).await,
            }
        };
        settled.persist_attempts = attempt;
        settled.action = action;
        if action == LockAction::ReleaseAll {
            self.release(tx, to_record, &mut settled, "confirmed", "deleted")
                .await?;
        }
        Ok(settled)
    }

    async fn release(
        &self,
        tx: &TxId,
        status: TxStatus,
        settled: &mut Settled,
        spent_reason: &'static str,
        released_reason: &'static str,
    ) -> Result<(), SettleError> {
        let locks_error = |source| SettleError::Locks {
            tx: tx.clone(),
            source,
        };
        if status == TxStatus::Confirmed {
            let spent = self
                .locks
                .spend_consumer(tx, self.clock.now())
                .await
                .map_err(locks_error)?;
            let n = u64::try_from(spent.len()).unwrap_or(u64::MAX);
            metrics::counter!(m::TOKENS_SPENT).increment(n);
            metrics::counter!(m::LOCKS_RELEASED, "reason" => spent_reason).increment(n);
            tracing::info!(spent = n, "confirmed: held tokens spent and released");
            settled.spent = spent;
        } else {
            let released = self.locks.release_consumer(tx).await.map_err(locks_error)?;
            metrics::counter!(m::LOCKS_RELEASED, "reason" => released_reason).increment(released);
            tracing::info!(released, "deleted: locks released");
            settled.released = released;
        }
        Ok(())
    }

    /// The start-up recovery pass: for every consumer that still holds locks and
    /// whose recorded status releases them (Confirmed, Deleted), applies the same
    /// rule as [`Settlement::on_status`] (spend, or release). Idempotent.
    pub async fn recover(&self) -> Result<Recovery, SettleError> {
        let span = tracing::info_span!("settlement_recover");
        async {
            let locks = self
                .locks
                .list_locks()
                .await
                .map_err(|source| SettleError::ListLocks { source })?;
            let mut consumers: BTreeMap<TxId, Option<TxStatus>> = BTreeMap::new();
            for lock in locks {
                consumers.insert(lock.consumer, lock.consumer_status);
            }
            let mut report = Recovery {
                consumers: u64::try_from(consumers.len()).unwrap_or(u64::MAX),
                ..Recovery::default()
            };
            for (tx, status) in consumers {
                let Some(status) = status else { continue };
                if settlement_action(&SettlementStatus::Known(status)) != LockAction::ReleaseAll {
                    continue;
                }
                let mut settled = Settled {
                    tx: tx.clone(),
                    recorded: Some(status),
                    action: LockAction::ReleaseAll,
                    persist_attempts: 0,
                    released: 0,
                    spent: Vec::new(),
                };
                self.release(&tx, status, &mut settled, "recovery", "recovery")
                    .await?;
                report.settled += 1;
                report.released += settled.released;
                report.spent += u64::try_from(settled.spent.len()).unwrap_or(u64::MAX);
            }
            tracing::info!(
                consumers = report.consumers,
                settled = report.settled,
                "recovery pass done"
            );
            Ok(report)
        }
        .instrument(span)
        .await
    }
}
