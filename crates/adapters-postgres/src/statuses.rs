//! The transaction status store.

use async_trait::async_trait;
use holdfast_domain::{Timestamp, TxId, TxStatus};
use holdfast_ports::{StatusStoreError, StoreFault, TxStatusStore};

use crate::backend::PgBackend;
use crate::codec::get;
use crate::codec::millis;
use crate::error::fault as to_fault;

/// Records a status; Confirmed is final: nothing replaces it (a late Pending or
/// Orphan report must not make a confirmed payment look unsettled).
const RECORD: &str = "
    INSERT INTO tx_statuses (tx_id, status, recorded_at)
    VALUES ($1, $2, TIMESTAMPTZ 'epoch' + $3::bigint * INTERVAL '1 millisecond')
    ON CONFLICT (tx_id) DO UPDATE SET status = EXCLUDED.status, recorded_at = EXCLUDED.recorded_at
    WHERE tx_statuses.status <> 'confirmed'";

const STATUS: &str = "SELECT status FROM tx_statuses WHERE tx_id = $1";

fn fault(e: &sqlx::Error) -> StatusStoreError {
    StatusStoreError::Fault(to_fault(e))
}

#[async_trait]
impl TxStatusStore for PgBackend {
    async fn record_status(
        &self,
        tx: &TxId,
        status: TxStatus,
        at: Timestamp,
    ) -> Result<(), StatusStoreError> {
        let at_ms = millis(at)?;
        self.retried(|| {
            sqlx::query(RECORD)
                .bind(tx.as_str())
                .bind(status.as_str())
                .bind(at_ms)
                .execute(self.pool())
        })
        .await
        .map_err(|e| fault(&e))?;
        Ok(())
    }

    async fn status(&self, tx: &TxId) -> Result<Option<TxStatus>, StatusStoreError> {
        let found = self
            .retried(|| {
                sqlx::query(STATUS)
                    .bind(tx.as_str())
                    .fetch_optional(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        let Some(row) = found else {
            return Ok(None);
        };
        let name: String = get(&row, 0)?;
        TxStatus::from_name(&name).map(Some).ok_or_else(|| {
            StatusStoreError::Fault(StoreFault::Corrupt(format!(
                "tx_statuses.status {name:?} of {tx} is not a known status"
            )))
        })
    }
}
