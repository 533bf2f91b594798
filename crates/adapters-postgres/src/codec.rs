//! Encoding domain values for binding and decoding stored values back into domain
//! types. A value that does not decode is [`StoreFault::Corrupt`], naming the
//! column and the value.

use holdfast_domain::{Precision, Quantity, TokenId, TxId};
use holdfast_ports::StoreFault;
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::error::fault as to_fault;

/// Column `index` of `row`, decoded as `T`.
pub(crate) fn get<'r, T>(row: &'r PgRow, index: usize) -> Result<T, StoreFault>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(index).map_err(|e| to_fault(&e))
}

/// A token id from `(tx_id, idx)` columns.
pub(crate) fn token_id(tx: String, idx: i64) -> Result<TokenId, StoreFault> {
    let tx = TxId::new(tx).map_err(|e| StoreFault::Corrupt(format!("tokens.tx_id: {e}")))?;
    let index = u32::try_from(idx)
        .map_err(|_| StoreFault::Corrupt(format!("token index {idx} is not a u32")))?;
    Ok(TokenId::new(tx, index))
}

/// An amount from its `amount::text` rendering (a decimal without sign or point).
pub(crate) fn quantity(text: &str) -> Result<Quantity, StoreFault> {
    Quantity::parse(text, Precision::MAX).map_err(|e| StoreFault::Corrupt(format!("amount: {e}")))
}

/// A validated id of type `T` from a text column named `column`.
pub(crate) fn id<T, E: std::fmt::Display>(
    column: &str,
    text: String,
    parse: impl FnOnce(String) -> Result<T, E>,
) -> Result<T, StoreFault> {
    parse(text).map_err(|e| StoreFault::Corrupt(format!("{column}: {e}")))
}

/// The columns binding a list of token ids: tx ids and indexes, as arrays.
pub(crate) fn token_arrays<'a>(
    tokens: impl Iterator<Item = &'a TokenId>,
) -> (Vec<String>, Vec<i64>) {
    tokens
        .map(|t| (t.tx.as_str().to_owned(), i64::from(t.index)))
        .unzip()
}

/// Converts a count of milliseconds for binding (BIGINT), refusing values past
/// `i64::MAX` milliseconds (about 292 million years).
pub(crate) fn millis(ts: holdfast_domain::Timestamp) -> Result<i64, StoreFault> {
    i64::try_from(ts.as_millis()).map_err(|_| {
        StoreFault::Backend(format!(
            "timestamp {ts} is beyond the storable range (at most {} ms)",
            i64::MAX
        ))
    })
}

/// Converts a stored BIGINT millisecond count back to a timestamp.
pub(crate) fn timestamp(millis: i64) -> Result<holdfast_domain::Timestamp, StoreFault> {
    u64::try_from(millis)
        .map(holdfast_domain::Timestamp)
        .map_err(|_| StoreFault::Corrupt(format!("stored time {millis} ms is before the epoch")))
}

/// The latest owner time that is stored and read back (9999-12-31T23:59:59.999Z,
/// the last time SQLite's stored form holds): a later claim, heartbeat or
/// publication would keep a slot beyond any lease, so it is refused when written
/// and read as unreadable.
pub(crate) const MAX_OWNER_MS: i64 = 253_402_300_799_999;

/// An owner time (claim, heartbeat or publication) for binding, refusing a time
/// after [`MAX_OWNER_MS`].
pub(crate) fn owner_millis(ts: holdfast_domain::Timestamp) -> Result<i64, StoreFault> {
    millis(ts)
        .ok()
        .filter(|ms| *ms <= MAX_OWNER_MS)
        .ok_or_else(|| {
            StoreFault::Backend(format!(
                "owner time {ts} is after 9999-12-31T23:59:59.999Z; expected a storable time"
            ))
        })
}

/// A stored owner time, or `None` when it is not a time a holdfast writes: NULL,
/// missing, before the epoch or after [`MAX_OWNER_MS`]. The queue store decides
/// what such a time reads as.
pub(crate) fn owner_time(millis: Option<i64>) -> Option<holdfast_domain::Timestamp> {
    millis
        .filter(|ms| (0..=MAX_OWNER_MS).contains(ms))
        .and_then(|ms| u64::try_from(ms).ok())
        .map(holdfast_domain::Timestamp)
}
