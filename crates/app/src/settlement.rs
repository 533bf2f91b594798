//! Settlement: applies the domain's lock lifecycle rules ([`holdfast_domain::lease`])
//! when a transaction's status is reported, and once at start-up to every
//! transaction with selections that has not settled.
//!
//! - Confirmed: [`LockStore::spend_consumer`] records the status, marks every token
//!   the transaction selected spent by it (also tokens whose lock the lease sweep
//!   removed) and releases its locks, in one transaction. A selected token that
//!   another confirmed transaction already spent is [`SettleError::DoubleSpend`]:
//!   nothing changes, not even the status.
//! - Deleted / Invalid: [`LockStore::release_consumer`] records Deleted and
//!   releases every lock of the transaction, in one transaction.
//! - Pending and Orphan are recorded and keep the locks (the sweep releases Orphan).
//! - Busy, Unknown and unrecognised codes change nothing: not recorded, not released.
//! - A releasing settlement is retried per [`PersistPolicy`] (tokio time); when the
//!   retries are exhausted the settlement (status with it) is tried once more,
//!   exactly once, and its error returned if that fails too. Dropping the future
//!   during a retry backoff changes nothing (the listener was cancelled):
//!   [`Settlement::recover`] and the lease sweep are the backstops.

use std::sync::Arc;

use holdfast_domain::lease::settlement_action;
use holdfast_domain::{
    LockAction, PersistPolicy, PersistResult, PersistStep, SettlementStatus, TokenId, TxId,
    TxStatus, WalletId,
};
use holdfast_ports::{
    Clock, Confirmation, LockStore, LockStoreError, MAX_OUTPUTS, Output, StatusStoreError,
    StoreFault, Stores, TokenStore, TokenStoreError, TxStatusStore,
};
use tracing::Instrument;

use crate::error::{ErrorKind, of_fault};
use crate::metrics as m;

/// Why settling failed. Settling is idempotent: the caller may simply retry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettleError {
    /// The transaction selected a token that another confirmed transaction has
    /// already spent (its lease expired and the token was selected again). Nothing
    /// was changed; the transaction's inputs are invalid on the ledger.
    #[error(
        "double spend: {tx} selected token {token}, which {spent_by} has already spent; nothing was settled"
    )]
    DoubleSpend {
        /// The transaction being settled.
        tx: TxId,
        /// The token spent twice.
        token: TokenId,
        /// The transaction that spent it first.
        spent_by: TxId,
    },
    /// Releasing or spending the consumer's locks failed.
    #[error("settling {tx}: lock store: {source}")]
    Locks {
        /// The transaction.
        tx: TxId,
        /// The store error.
        source: LockStoreError,
    },
    /// The recovery pass could not list the unsettled transactions.
    #[error("recovery: listing unsettled transactions: {source}")]
    ListUnsettled {
        /// The store error.
        source: LockStoreError,
    },
    /// The outputs of a confirm were refused: they do not conserve the inputs per
    /// token type, the transaction is already confirmed with other outputs, or an
    /// output is invalid. Nothing was changed; retrying the same call cannot help.
    #[error("confirming {tx}: {source}")]
    Outputs {
        /// The transaction.
        tx: TxId,
        /// What the lock store refused (`NotConserved`, `OutputsDiffer`,
        /// `BadOutputs`).
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
    /// The handle is shutting down and takes no new work; retry on another
    /// replica. Never returned by [`Settlement`] itself.
    #[error("shutting down: this handle takes no new settlements; retry on another replica")]
    ShuttingDown,
}

impl SettleError {
    /// What kind of failure this is ([`ErrorKind`]): a double spend and outputs
    /// that differ from the recorded ones are conflicts, invalid or unconserved
    /// outputs invalid input, a store error its fault's kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            SettleError::DoubleSpend { .. } => ErrorKind::Conflict,
            SettleError::Outputs { source, .. } => match source {
                LockStoreError::OutputsDiffer { .. } => ErrorKind::Conflict,
                LockStoreError::NotConserved(_) | LockStoreError::BadOutputs { .. } => {
                    ErrorKind::InvalidInput
                }
                other => of_fault(other.fault_kind(), ErrorKind::Backend),
            },
            SettleError::Locks { source, .. } | SettleError::ListUnsettled { source } => {
                of_fault(source.fault_kind(), ErrorKind::Backend)
            }
            SettleError::Status { source, .. } => of_fault(source.fault_kind(), ErrorKind::Backend),
            SettleError::ShuttingDown => ErrorKind::ShuttingDown,
        }
    }
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

/// What [`Settlement::recover_orphans`] does with one orphan: the service's
/// decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Orphan {
    /// Settle it with this status (Deleted for a transaction the ledger never
    /// saw).
    Settle(SettlementStatus),
    /// The ledger has it: confirm it with these outputs and the change.
    Confirm {
        /// Its outputs.
        outputs: Vec<Output>,
        /// Where its change goes.
        change_to: Option<WalletId>,
    },
}

/// What [`Settlement::confirm`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmed {
    /// The transaction.
    pub tx: TxId,
    /// The inputs spent now (empty when `replayed`).
    pub spent: Vec<TokenId>,
    /// The outputs, in order: ids `(tx, 0..)`, the change last.
    pub outputs: Vec<(TokenId, Output)>,
    /// Already confirmed with these outputs: nothing changed.
    pub replayed: bool,
    /// Attempts made (a failing store is retried per the [`PersistPolicy`]).
    pub attempts: u32,
}

/// What the start-up recovery pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Consumers with selections not settled yet.
    pub consumers: u64,
    /// Of them, those whose settlement failed (a double spend, or the store): they
    /// are logged, counted here and left for the next pass.
    pub failed: u64,
    /// Of them, those with a releasing status whose locks were released.
    pub settled: u64,
    /// Locks released without spending.
    pub released: u64,
    /// Tokens marked spent.
    pub spent: u64,
}

/// A lock store error of settling `tx` as a [`SettleError`].
fn settle_error(tx: &TxId, source: LockStoreError) -> SettleError {
    match source {
        LockStoreError::DoubleSpend { token, spent_by } => SettleError::DoubleSpend {
            tx: tx.clone(),
            token,
            spent_by,
        },
        source @ (LockStoreError::NotConserved(_)
        | LockStoreError::OutputsDiffer { .. }
        | LockStoreError::BadOutputs { .. }) => SettleError::Outputs {
            tx: tx.clone(),
            source,
        },
        source => SettleError::Locks {
            tx: tx.clone(),
            source,
        },
    }
}

/// A token store error of settling `tx` (reading its outputs) as a [`SettleError`].
fn token_error(tx: &TxId, e: TokenStoreError) -> SettleError {
    SettleError::Locks {
        tx: tx.clone(),
        source: LockStoreError::Fault(match e {
            TokenStoreError::Fault(f) => f,
            other => StoreFault::Backend(other.to_string()),
        }),
    }
}

/// Applies settlement statuses to the lock and status stores.
pub struct Settlement {
    locks: Arc<dyn LockStore>,
    tokens: Arc<dyn TokenStore>,
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
            tokens: stores.tokens,
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
        loop {
            attempt += 1;
            let result = match self.apply(tx, to_record, true, &mut settled).await {
                Ok(()) => {
                    settled.recorded = Some(to_record);
                    PersistResult::Persisted
                }
                Err(double @ SettleError::DoubleSpend { .. }) => {
                    metrics::counter!(m::SETTLEMENT_DOUBLE_SPENDS).increment(1);
                    tracing::error!(error = %double, "settlement refused");
                    return Err(double);
                }
                Err(e) => {
                    metrics::counter!(m::SETTLEMENT_PERSIST_FAILURES).increment(1);
                    tracing::warn!(attempt, error = %e, "could not settle");
                    PersistResult::Failed
                }
            };
            match self.policy.after_attempt(&status, attempt, result) {
                PersistStep::Done(action) => {
                    settled.persist_attempts = attempt;
                    settled.action = action;
                    if action == LockAction::ReleaseAll && result == PersistResult::Failed {
                        // Final either way: one last try rather than leak the locks
                        // until the lease. Status and effect stay one transaction.
                        self.apply(tx, to_record, true, &mut settled).await?;
                        settled.recorded = Some(to_record);
                    }
                    return Ok(settled);
                }
                PersistStep::RetryAfter(delay) => tokio::time::sleep(delay).await,
            }
        }
    }

    /// Confirms `tx` together with its outputs, in one store transaction with the
    /// status (one round trip on PostgreSQL): spends exactly what `tx` selected and
    /// adds `outputs` as new tokens `(tx, 0..)`; with `change_to`, one more output
    /// per token type pays what the inputs hold beyond the outputs to that wallet.
    /// The outputs must conserve the inputs per type; a retry with the same
    /// arguments after a commit changes nothing (`replayed`). A failing store is
    /// retried per the [`PersistPolicy`]; refused outputs and a double spend are
    /// not. Nothing ever mints change apart from the spend.
    pub async fn confirm(
        &self,
        tx: &TxId,
        outputs: &[Output],
        change_to: Option<&WalletId>,
    ) -> Result<Confirmed, SettleError> {
        let span = tracing::info_span!("confirm", %tx, outputs = outputs.len());
        async {
            metrics::counter!(m::SETTLEMENT_STATUSES, "status" => "confirmed").increment(1);
            let mut attempt = 0u32;
            let mut delay = self.policy.initial_backoff;
            loop {
                attempt += 1;
                match self.confirm_once(tx, outputs, change_to).await {
                    Ok((done, all)) => {
                        let n = u64::try_from(done.spent.len()).unwrap_or(u64::MAX);
                        metrics::counter!(m::TOKENS_SPENT).increment(n);
                        metrics::counter!(m::LOCKS_RELEASED, "reason" => "confirmed").increment(n);
                        tracing::info!(
                            spent = n,
                            replayed = done.replayed,
                            "confirmed with outputs"
                        );
                        return Ok(Confirmed {
                            tx: tx.clone(),
                            spent: done.spent,
                            outputs: done.outputs.into_iter().zip(all).collect(),
                            replayed: done.replayed,
                            attempts: attempt,
                        });
                    }
                    Err(e @ (SettleError::DoubleSpend { .. } | SettleError::Outputs { .. })) => {
                        if matches!(e, SettleError::DoubleSpend { .. }) {
                            metrics::counter!(m::SETTLEMENT_DOUBLE_SPENDS).increment(1);
                        }
                        tracing::error!(error = %e, "confirm refused");
                        return Err(e);
                    }
                    Err(e) if attempt >= self.policy.max_attempts => return Err(e),
                    Err(e) => {
                        metrics::counter!(m::SETTLEMENT_PERSIST_FAILURES).increment(1);
                        tracing::warn!(attempt, error = %e, "could not confirm; retrying");
                        tokio::time::sleep(delay).await;
                        delay = delay.saturating_mul(2);
                    }
                }
            }
        }
        .instrument(span)
        .await
    }

    /// One attempt of [`Settlement::confirm`]: the outputs with the change worked
    /// out from what `tx` selected now, confirmed.
    async fn confirm_once(
        &self,
        tx: &TxId,
        outputs: &[Output],
        change_to: Option<&WalletId>,
    ) -> Result<(Confirmation, Vec<Output>), SettleError> {
        let locks_error = |source| settle_error(tx, source);
        let now = self.clock.now();
        let confirmed = match change_to {
            Some(wallet) => {
                self.locks
                    .confirm_with_change(tx, outputs, wallet, now)
                    .await
            }
            None => {
                (self.locks.confirm(tx, outputs, now).await).map(|done| (done, outputs.to_vec()))
            }
        };
        match confirmed {
            Ok(answer) => Ok(answer),
            // An earlier attempt committed with change (its answer lost): the
            // stored outputs hold the given ones and that change.
            Err(LockStoreError::OutputsDiffer { .. }) if change_to.is_some() => {
                let stored = self.stored_outputs(tx).await?;
                let done = self
                    .locks
                    .confirm(tx, &stored, self.clock.now())
                    .await
                    .map_err(locks_error)?;
                if stored.starts_with(outputs)
                    && stored[outputs.len()..]
                        .iter()
                        .all(|o| change_to == Some(&o.wallet))
                {
                    Ok((done, stored))
                } else {
                    Err(settle_error(
                        tx,
                        LockStoreError::OutputsDiffer {
                            tx: tx.clone(),
                            detail: "confirmed with other outputs".to_owned(),
                        },
                    ))
                }
            }
            Err(e) => Err(locks_error(e)),
        }
    }

    /// Whether `tx` was confirmed with outputs (its first output `(tx, 0)` exists).
    async fn has_outputs(&self, tx: &TxId) -> Result<bool, SettleError> {
        self.tokens
            .token(&TokenId::new(tx.clone(), 0))
            .await
            .map(|found| found.is_some())
            .map_err(|e| token_error(tx, e))
    }

    /// The outputs stored for `tx`: tokens `(tx, 0)`, `(tx, 1)`, ... while they exist.
    async fn stored_outputs(&self, tx: &TxId) -> Result<Vec<Output>, SettleError> {
        let mut stored = Vec::new();
        for index in 0u32.. {
            let id = TokenId::new(tx.clone(), index);
            let found = self
                .tokens
                .token(&id)
                .await
                .map_err(|e| token_error(tx, e))?;
            let Some(token) = found else { break };
            stored.push(Output {
                wallet: token.wallet,
                token_type: token.token_type,
                quantity: token.quantity,
            });
            if stored.len() > MAX_OUTPUTS {
                break;
            }
        }
        Ok(stored)
    }

    /// Applies a releasing `status` to `tx` in one store transaction: spends its
    /// selected tokens (Confirmed) or releases its locks (Deleted), recording the
    /// status with it when `record` says so.
    async fn apply(
        &self,
        tx: &TxId,
        status: TxStatus,
        record: bool,
        settled: &mut Settled,
    ) -> Result<(), SettleError> {
        let locks_error = |source| settle_error(tx, source);
        let reason = if record { status.as_str() } else { "recovery" };
        if status == TxStatus::Confirmed && self.has_outputs(tx).await? {
            // Confirmed with its outputs already: what it still selects is a stray
            // of a select that ran past the confirm; spending it would destroy
            // value no output accounts for. Release it instead.
            let released = self
                .locks
                .release_consumer(tx, self.clock.now(), false)
                .await
                .map_err(locks_error)?;
            tracing::warn!(
                released,
                "confirmed with outputs already: strays released, nothing spent"
            );
            settled.released = released;
            return Ok(());
        }
        if status == TxStatus::Confirmed {
            let spent = self
                .locks
                .spend_consumer(tx, self.clock.now(), record)
                .await
                .map_err(locks_error)?;
            let n = u64::try_from(spent.len()).unwrap_or(u64::MAX);
            metrics::counter!(m::TOKENS_SPENT).increment(n);
            metrics::counter!(m::LOCKS_RELEASED, "reason" => reason).increment(n);
            tracing::info!(
                spent = n,
                "confirmed: selected tokens spent, locks released"
            );
            settled.spent = spent;
        } else {
            let released = self
                .locks
                .release_consumer(tx, self.clock.now(), record)
                .await
                .map_err(locks_error)?;
            metrics::counter!(m::LOCKS_RELEASED, "reason" => reason).increment(released);
            tracing::info!(released, "deleted: locks released");
            settled.released = released;
        }
        Ok(())
    }

    /// The start-up recovery of this instance's own orphans: every transaction
    /// whose selections this instance's owner id made ([`LockStore::unsettled_owned`])
    /// and that has no releasing status is settled as `decide` says, the
    /// service's policy: for example ask the ledger, confirm with its outputs what
    /// the ledger has, and Deleted for what it never saw. Other owners' work is
    /// left alone. Run it after [`Settlement::recover`], before the instance
    /// takes new work: an orphan is a transaction an earlier process of this
    /// owner was selecting or settling when it died. A status is applied as by
    /// [`Settlement::on_status`] (one that keeps, such as Busy, keeps), a confirm
    /// as by [`Settlement::confirm`].
    pub async fn recover_orphans<F, Fut>(&self, mut decide: F) -> Result<Recovery, SettleError>
    where
        F: FnMut(TxId) -> Fut,
        Fut: std::future::Future<Output = Orphan>,
    {
        let owned = self
            .locks
            .unsettled_owned()
            .await
            .map_err(|source| SettleError::ListUnsettled { source })?;
        let mut report = Recovery {
            consumers: u64::try_from(owned.len()).unwrap_or(u64::MAX),
            ..Recovery::default()
        };
        for (tx, status) in owned {
            let releasing = status.is_some_and(|s| {
                settlement_action(&SettlementStatus::Known(s)) == LockAction::ReleaseAll
            });
            if releasing {
                // Recorded final, left for `recover`.
                continue;
            }
            let settled = match decide(tx.clone()).await {
                Orphan::Settle(status) => self
                    .on_status(&tx, status)
                    .await
                    .map(|settled| (settled.released, settled.spent.len())),
                Orphan::Confirm { outputs, change_to } => self
                    .confirm(&tx, &outputs, change_to.as_ref())
                    .await
                    .map(|done| (0, done.spent.len())),
            };
            match settled {
                Ok((released, spent)) => {
                    report.settled += 1;
                    report.released += released;
                    report.spent += u64::try_from(spent).unwrap_or(u64::MAX);
                }
                Err(e) => {
                    tracing::error!(%tx, error = %e, "recovery could not settle an orphan");
                    report.failed += 1;
                }
            }
        }
        tracing::info!(
            orphans = report.consumers,
            settled = report.settled,
            "orphan recovery done"
        );
        Ok(report)
    }

    /// The start-up recovery pass: for every consumer with unsettled selections
    /// whose recorded status releases them (Confirmed, Deleted), applies the same
    /// rule as [`Settlement::on_status`] (spend, or release). Idempotent.
    pub async fn recover(&self) -> Result<Recovery, SettleError> {
        let span = tracing::info_span!("settlement_recover");
        async {
            let consumers = self
                .locks
                .unsettled()
                .await
                .map_err(|source| SettleError::ListUnsettled { source })?;
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
                if let Err(e) = self.apply(&tx, status, false, &mut settled).await {
                    tracing::error!(%tx, error = %e, "recovery could not settle a transaction");
                    report.failed += 1;
                    continue;
                }
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
