//! The transaction status store over SQLite.

use async_trait::async_trait;
use holdfast_domain::{Timestamp, TxId, TxStatus};
use holdfast_ports::{StatusStoreError, StoreFault, TxStatusStore};
use rusqlite::{OptionalExtension, Transaction, params};

use crate::SqliteBackend;
use crate::codec::{status_from_sql, time_to_sql};
use crate::pool::Db;

/// Records `status` for `tx` inside the caller's transaction, replacing any earlier
/// status but Confirmed, which is final (settlement records it in the same
/// transaction as its spend or release).
pub(crate) fn record_in(
    t: &Transaction<'_>,
    tx: &TxId,
    status: TxStatus,
    recorded_at: &str,
) -> Result<(), StoreFault> {
    t.prepare_cached(
        "INSERT INTO tx_statuses (tx, status, recorded_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (tx) DO UPDATE SET status = excluded.status,
                                         recorded_at = excluded.recorded_at
         WHERE tx_statuses.status <> 'confirmed'",
    )
    .db()?
    .execute(params![tx.as_str(), status.as_str(), recorded_at])
    .db()?;
    Ok(())
}

#[async_trait]
impl TxStatusStore for SqliteBackend {
    async fn record_status(
        &self,
        tx: &TxId,
        status: TxStatus,
        at: Timestamp,
    ) -> Result<(), StatusStoreError> {
        let recorded_at = time_to_sql(at)?;
        let txid = tx.clone();
        self.pool
            .write(move |t| Ok(record_in(t, &txid, status, &recorded_at)?))
            .await
    }

    async fn status(&self, tx: &TxId) -> Result<Option<TxStatus>, StatusStoreError> {
        let txid = tx.clone();
        self.pool
            .read(move |t| {
                let name: Option<String> = t
                    .prepare_cached("SELECT status FROM tx_statuses WHERE tx = ?1")
                    .db()?
                    .query_row([txid.as_str()], |r| r.get(0))
                    .optional()
                    .db()?;
                let row = format!("tx_statuses row {txid}");
                Ok(name.map(|n| status_from_sql(&row, &n)).transpose()?)
            })
            .await
    }
}
