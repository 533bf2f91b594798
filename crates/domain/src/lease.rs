//! The lock lifecycle: which transaction statuses release a consumer's locks, and
//! when a lock's lease has expired.

use std::fmt;

/// The status of a transaction as holdfast records it, and as a settlement source
/// reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TxStatus {
    /// Submitted, not yet final.
    Pending,
    /// Final and valid: its inputs are spent.
    Confirmed,
    /// Final and invalid (or deleted): its inputs are free again.
    Deleted,
    /// Abandoned without a final answer; released only by the lease sweep.
    Orphan,
    /// The network is busy; try again later.
    Busy,
    /// The network does not know (yet).
    Unknown,
}

impl TxStatus {
    /// The stored name: `pending`, `confirmed`, `deleted`, `orphan`, `busy`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            TxStatus::Pending => "pending",
            TxStatus::Confirmed => "confirmed",
            TxStatus::Deleted => "deleted",
            TxStatus::Orphan => "orphan",
            TxStatus::Busy => "busy",
            TxStatus::Unknown => "unknown",
        }
    }

    /// Parses a stored name; `None` for anything else.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            TxStatus::Pending,
            TxStatus::Confirmed,
            TxStatus::Deleted,
            TxStatus::Orphan,
            TxStatus::Busy,
            TxStatus::Unknown,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

impl fmt::Display for TxStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
