//! What kind of failure a store reported, so that every layer above can keep it
//! and a service can map it (a database that is unavailable is not corrupt data).
//!
//! The adapters classify their driver's errors once, as a [`StoreFault`] (the
//! ports re-export it as `holdfast_ports::StoreFault`); the selection engine takes
//! the same fault as the answer to a failed store call and keeps it in
//! [`crate::SelectError::Store`]; the services' errors expose its [`FaultKind`].

/// The kind of a store failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// The database stayed locked or contended (a writer, a row lock, a
    /// serialization failure) for longer than its bound. Transient.
    Busy,
    /// The database could not be reached, refused the session or the connection
    /// was lost. Transient.
    Unavailable,
    /// A statement or lock wait ran past its bound; the outcome is unknown.
    /// Transient.
    Timeout,
    /// A stored row is not valid. Not transient: retrying reads the same row.
    Corrupt,
    /// The schema is missing or newer than this code knows. Not transient.
    Schema,
    /// Any other backend failure; the outcome of the operation is unknown.
    Backend,
}

impl FaultKind {
    /// Every kind, in declaration order.
    pub const ALL: [FaultKind; 6] = [
        FaultKind::Busy,
        FaultKind::Unavailable,
        FaultKind::Timeout,
        FaultKind::Corrupt,
        FaultKind::Schema,
        FaultKind::Backend,
    ];

    /// The kind as a lowercase word: `busy`, `unavailable`, `timeout`, `corrupt`,
    /// `schema`, `backend`.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Busy => "busy",
            FaultKind::Unavailable => "unavailable",
            FaultKind::Timeout => "timeout",
            FaultKind::Corrupt => "corrupt",
            FaultKind::Schema => "schema",
            FaultKind::Backend => "backend",
        }
    }

    /// Whether the same call may succeed when retried later without anything
    /// being repaired: busy, unavailable and timed-out stores.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            FaultKind::Busy | FaultKind::Unavailable | FaultKind::Timeout
        )
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The backend failed. Messages never contain passwords or other secrets. Each
/// variant is one [`FaultKind`] ([`StoreFault::kind`]), which every error above
/// keeps so a service can map it (an outage is not corrupt data).
///
/// The selection engine takes it as the answer to a failed fetch, claim, balance
/// read or release (`Selection::on_*`); a lost race or a stale token is never
/// one: those are verdicts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreFault {
    /// The database stayed locked by another writer for longer than the busy timeout.
    #[error("database busy: {0}")]
    Busy(String),
    /// The database could not be reached, or the connection was lost.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A statement or lock wait ran past its bound (PostgreSQL's
    /// `statement_timeout`); the outcome is unknown.
    #[error("database timeout: {0}")]
    Timeout(String),
    /// A stored row is not valid (for example a non-canonical amount).
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// The schema is missing, or newer than this code knows.
    #[error("schema: {0}")]
    Schema(String),
    /// Any other backend failure; the outcome of the operation is unknown.
    #[error("backend error: {0}")]
    Backend(String),
}

impl StoreFault {
    /// A fault of `kind` with `message`.
    pub fn new(kind: FaultKind, message: impl Into<String>) -> StoreFault {
        let message = message.into();
        match kind {
            FaultKind::Busy => StoreFault::Busy(message),
            FaultKind::Unavailable => StoreFault::Unavailable(message),
            FaultKind::Timeout => StoreFault::Timeout(message),
            FaultKind::Corrupt => StoreFault::Corrupt(message),
            FaultKind::Schema => StoreFault::Schema(message),
            FaultKind::Backend => StoreFault::Backend(message),
        }
    }

    /// The kind of this fault.
    pub fn kind(&self) -> FaultKind {
        match self {
            StoreFault::Busy(_) => FaultKind::Busy,
            StoreFault::Unavailable(_) => FaultKind::Unavailable,
            StoreFault::Timeout(_) => FaultKind::Timeout,
            StoreFault::Corrupt(_) => FaultKind::Corrupt,
            StoreFault::Schema(_) => FaultKind::Schema,
            StoreFault::Backend(_) => FaultKind::Backend,
        }
    }

    /// The driver's message, without the kind's prefix.
    pub fn message(&self) -> &str {
        match self {
            StoreFault::Busy(m)
            | StoreFault::Unavailable(m)
            | StoreFault::Timeout(m)
            | StoreFault::Corrupt(m)
            | StoreFault::Schema(m)
            | StoreFault::Backend(m) => m,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{FaultKind, StoreFault};

    #[test]
    fn kinds_show_as_lowercase_words() {
        let shown: Vec<String> = FaultKind::ALL.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "busy",
                "unavailable",
                "timeout",
                "corrupt",
                "schema",
                "backend"
            ]
        );
        let transient: Vec<FaultKind> = FaultKind::ALL
            .into_iter()
            .filter(|k| k.is_transient())
            .collect();
        assert_eq!(
            transient,
            [FaultKind::Busy, FaultKind::Unavailable, FaultKind::Timeout]
        );
    }

    #[test]
    fn a_fault_keeps_its_kind_and_message() {
        for kind in FaultKind::ALL {
            let fault = StoreFault::new(kind, "the driver said so");
            assert_eq!(fault.kind(), kind);
            assert_eq!(fault.message(), "the driver said so");
            assert!(
                fault.to_string().ends_with(": the driver said so"),
                "{fault}"
            );
        }
        assert_eq!(
            StoreFault::Timeout("canceling statement due to statement timeout".into()).to_string(),
            "database timeout: canceling statement due to statement timeout"
        );
    }
}
