//! What kind of failure a store reported, so that every layer above can keep it
//! and a service can map it (a database that is unavailable is not corrupt data).
//!
//! The adapters classify their driver's errors once (`StoreFault` in the ports);
//! the selection engine carries the kind through [`crate::StoreFailure`] and
//! [`crate::SelectionFailure::Store`]; the services' errors expose it.

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

#[cfg(test)]
mod tests {
    use super::FaultKind;

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
}
