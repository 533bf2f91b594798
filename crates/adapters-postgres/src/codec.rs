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
