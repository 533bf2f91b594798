//! The transaction status port.

use async_trait::async_trait;
use holdfast_domain::{Timestamp, TxId, TxStatus};

use crate::error::StatusStoreError;

/// Records and reads the status of transactions (the consumers of locks).
#[mockall::automock]
#[async_trait]
pub trait TxStatusStore: Send + Sync {
    /// Records `status` for `tx` at `at`, replacing any earlier status.
    async fn record_status(
        &self,
        tx: &TxId,
        status: TxStatus,
        at: Timestamp,
    ) -> Result<(), StatusStoreError>;

    /// The recorded status of `tx`, if any.
    async fn status(&self, tx: &TxId) -> Result<Option<TxStatus>, StatusStoreError>;
}
