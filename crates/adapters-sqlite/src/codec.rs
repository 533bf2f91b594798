//! Column encodings: how domain values are stored and read back. Reading never
//! trusts a row: anything invalid is [`StoreFault::Corrupt`] naming the row.

use holdfast_domain::{
    Quantity, QueueName, RequestId, RevisionUri, Timestamp, TokenId, TxId, TxStatus, Version,
};
use holdfast_ports::StoreFault;
use rusqlite::types::ValueRef;

use crate::timetext;

/// A corrupt-row fault naming the table, the row and the problem.
pub(crate) fn corrupt(row: &str, what: impl std::fmt::Display) -> StoreFault {
    StoreFault::Corrupt(format!("{row}: {what}"))
}

/// Timestamps as stored text (see [`crate::timetext`]).
pub(crate) fn time_to_sql(ts: Timestamp) -> Result<String, StoreFault> {
    timetext::format(ts).ok_or_else(|| {
        StoreFault::Backend(format!(
            "timestamp {ts} is after 9999-12-31T23:59:59.999Z; expected a storable time"
        ))
    })
}

pub(crate) fn time_from_sql(row: &str, text: &str) -> Result<Timestamp, StoreFault> {
    timetext::parse(text).map_err(|e| corrupt(row, e))
}

/// An owner's time (claim, heartbeat or publication) as any holdfast may have
/// stored it, or `Err` with the stored value shown when it is not readable: empty
/// (a schema v2 writer's claim or heartbeat, an older writer's publication), not
/// text, or text that is not a time. The caller
/// decides what such a time reads as; see [`crate::queues`].
pub(crate) fn owner_time_from_sql(value: ValueRef<'_>) -> Result<Timestamp, String> {
    match value {
        ValueRef::Text(bytes) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|text| timetext::parse(text).ok())
            .ok_or_else(|| shown(&String::from_utf8_lossy(bytes))),
        ValueRef::Null => Err("NULL".to_owned()),
        ValueRef::Integer(i) => Err(format!("integer {i}")),
        ValueRef::Real(r) => Err(format!("real {r}")),
        ValueRef::Blob(b) => Err(format!("a blob of {} bytes", b.len())),
    }
}

/// A stored value for a log line: quoted, at most 64 characters.
fn shown(text: &str) -> String {
    const MAX: usize = 64;
    if text.chars().count() <= MAX {
        format!("{text:?}")
    } else {
        let head: String = text.chars().take(MAX).collect();
        format!("{head:?}...")
    }
}

pub(crate) fn amount_from_sql(row: &str, text: &str) -> Result<Quantity, StoreFault> {
    Quantity::from_storage(text).map_err(|e| corrupt(row, e))
}

pub(crate) fn output_from_sql(row: &str, value: i64) -> Result<u32, StoreFault> {
    u32::try_from(value).map_err(|_| {
        corrupt(
            row,
            format!("output index {value} is not in 0..=4294967295"),
        )
    })
}

pub(crate) fn tx_from_sql(row: &str, text: String) -> Result<TxId, StoreFault> {
    TxId::new(text).map_err(|e| corrupt(row, e))
}

pub(crate) fn token_from_sql(row: &str, tx: String, output: i64) -> Result<TokenId, StoreFault> {
    Ok(TokenId::new(
        tx_from_sql(row, tx)?,
        output_from_sql(row, output)?,
    ))
}

pub(crate) fn status_from_sql(row: &str, text: &str) -> Result<TxStatus, StoreFault> {
    TxStatus::from_name(text).ok_or_else(|| {
        let names: Vec<&str> = TxStatus::ALL.into_iter().map(TxStatus::as_str).collect();
        corrupt(
            row,
            format!(
                "unknown status {text:?}; expected one of {}",
                names.join(", ")
            ),
        )
    })
}

pub(crate) fn version_to_sql(v: Version) -> Result<i64, StoreFault> {
    i64::try_from(v.0).map_err(|_| {
        StoreFault::Backend(format!("version {v} does not fit SQLite's 63-bit integers"))
    })
}

pub(crate) fn version_from_sql(row: &str, value: i64) -> Result<Version, StoreFault> {
    u64::try_from(value)
        .ok()
        .filter(|v| *v >= 1)
        .map(Version)
        .ok_or_else(|| corrupt(row, format!("version {value} is not a positive integer")))
}

pub(crate) fn seq_to_sql(seq: u64) -> Result<i64, StoreFault> {
    i64::try_from(seq).map_err(|_| {
        StoreFault::Backend(format!(
            "request number {seq} does not fit SQLite's 63-bit integers"
        ))
    })
}

pub(crate) fn seq_from_sql(row: &str, value: i64) -> Result<u64, StoreFault> {
    u64::try_from(value)
        .ok()
        .filter(|v| *v >= 1)
        .ok_or_else(|| {
            corrupt(
                row,
                format!("request number {value} is not a positive integer"),
            )
        })
}

pub(crate) fn request_id_from_sql(row: &str, text: &str) -> Result<RequestId, StoreFault> {
    RequestId::parse(text).map_err(|e| corrupt(row, e))
}

pub(crate) fn uri_from_sql(row: &str, text: String) -> Result<RevisionUri, StoreFault> {
    RevisionUri::new(text).map_err(|e| corrupt(row, e))
}

pub(crate) fn queue_from_sql(row: &str, text: String) -> Result<QueueName, StoreFault> {
    QueueName::new(text).map_err(|e| corrupt(row, e))
}
