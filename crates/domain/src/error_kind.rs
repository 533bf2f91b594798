//! What kind of failure an error is ([`ErrorKind`]), so a service can map every
//! one to a response without matching each error type: retry later, give up, fix
//! the input, page someone.
//!
//! The domain's [`crate::SelectError`] says its kind ([`crate::SelectError::kind`]);
//! the `holdfast` crate re-exports this type and gives every error of its own a
//! `kind()` too. A store failure keeps the kind the adapter gave it
//! ([`FaultKind`], through `From<FaultKind>`), so a database that is unavailable
//! (503) is not mistaken for corrupt data (500).
//!
//! ```
//! use holdfast_domain::{ErrorKind, FaultKind, SelectError, StoreFault};
//!
//! let outage = SelectError::Store(StoreFault::new(FaultKind::Unavailable, "refused"));
//! assert_eq!(outage.kind(), ErrorKind::Unavailable);
//! assert_eq!(outage.kind().http_status(), 503);
//! assert_eq!(ErrorKind::Corrupt.retry_after(), None);
//! ```

use std::time::Duration;

use crate::fault::FaultKind;

/// The kind of an error: what a caller should do about it. `#[non_exhaustive]`:
/// match with a wildcard arm (or use [`ErrorKind::is_transient`] and
/// [`ErrorKind::http_status`]), since new kinds may be added.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// The request can never succeed as given (an amount of zero, a limit out of
    /// range, a configuration value that does not parse). Fix the input; do not
    /// retry. HTTP 422 Unprocessable Content: the request was well-formed, its
    /// values are not acceptable (a service that validates shapes itself may
    /// prefer 400 for those).
    InvalidInput,
    /// The named thing does not exist (a queue before its first request). Check
    /// the name; do not retry. HTTP 404.
    NotFound,
    /// The wallet's spendable balance, locks ignored, is below the amount. Do not
    /// retry until the wallet is funded. HTTP 409 Conflict: the request is valid
    /// but conflicts with the wallet's current state. (Not 402 Payment Required,
    /// which HTTP reserves for future use and which clients and gateways treat
    /// inconsistently.)
    InsufficientFunds,
    /// The request conflicts with what is recorded and retrying it unchanged
    /// cannot help (a double spend, a transaction already confirmed with other
    /// outputs). Reconcile; do not retry. HTTP 409.
    Conflict,
    /// Enough funds exist but other transactions hold them. Retry later. HTTP
    /// 503 with `Retry-After`.
    FundsLocked,
    /// An operation ran past its bound (a select's deadline, a statement
    /// timeout); its outcome may be unknown, so retry an idempotent call (every
    /// call of `holdfast` is). HTTP 503 with `Retry-After`.
    Timeout,
    /// The database is contended (another writer, row locks, more
    /// compare-and-set conflicts than the bound). Retry later. HTTP 503 with
    /// `Retry-After`.
    Busy,
    /// The database cannot be reached, refused the session, or the connection was
    /// lost. Retry later. HTTP 503 with `Retry-After`.
    Unavailable,
    /// The handle is shutting down and takes no new work. Retry on another
    /// replica. HTTP 503 with `Retry-After`.
    ShuttingDown,
    /// A stored row is not valid. Retrying reads the same row: alert an operator.
    /// HTTP 500.
    Corrupt,
    /// The database schema is missing or newer than this code. Deploy the
    /// matching version. HTTP 500.
    Schema,
    /// Any other failure of the backend or of holdfast (a bug); the outcome is
    /// unknown. Alert; retrying may help. HTTP 500.
    Backend,
}

/// The `Retry-After` hint of transient kinds: short, since every call already
/// waited or retried within its own bounds before it failed, and jittered
/// retries by many clients spread out anyway.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 12] = [
        ErrorKind::InvalidInput,
        ErrorKind::NotFound,
        ErrorKind::InsufficientFunds,
        ErrorKind::Conflict,
        ErrorKind::FundsLocked,
        ErrorKind::Timeout,
        ErrorKind::Busy,
        ErrorKind::Unavailable,
        ErrorKind::ShuttingDown,
        ErrorKind::Corrupt,
        ErrorKind::Schema,
        ErrorKind::Backend,
    ];

    /// Whether the same call may succeed later without anything being fixed:
    /// funds locked, timeouts, busy or unavailable databases, a handle shutting
    /// down.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            ErrorKind::FundsLocked
                | ErrorKind::Timeout
                | ErrorKind::Busy
                | ErrorKind::Unavailable
                | ErrorKind::ShuttingDown
        )
    }

    /// The HTTP status a web service answers with (see each kind): 422, 404,
    /// 409, 503 (transient kinds) or 500.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorKind::InvalidInput => 422,
            ErrorKind::NotFound => 404,
            ErrorKind::InsufficientFunds | ErrorKind::Conflict => 409,
            ErrorKind::FundsLocked
            | ErrorKind::Timeout
            | ErrorKind::Busy
            | ErrorKind::Unavailable
            | ErrorKind::ShuttingDown => 503,
            ErrorKind::Corrupt | ErrorKind::Schema | ErrorKind::Backend => 500,
        }
    }

    /// How long to wait before retrying: [`RETRY_AFTER`] for transient kinds
    /// (the `Retry-After` header of a 503), `None` for the rest.
    pub fn retry_after(self) -> Option<Duration> {
        self.is_transient().then_some(RETRY_AFTER)
    }

    /// The kind as a snake_case word (`funds_locked`), for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::NotFound => "not_found",
            ErrorKind::InsufficientFunds => "insufficient_funds",
            ErrorKind::Conflict => "conflict",
            ErrorKind::FundsLocked => "funds_locked",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Busy => "busy",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::ShuttingDown => "shutting_down",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Schema => "schema",
            ErrorKind::Backend => "backend",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A store fault's kind is the error's kind.
impl From<FaultKind> for ErrorKind {
    fn from(kind: FaultKind) -> ErrorKind {
        match kind {
            FaultKind::Busy => ErrorKind::Busy,
            FaultKind::Unavailable => ErrorKind::Unavailable,
            FaultKind::Timeout => ErrorKind::Timeout,
            FaultKind::Corrupt => ErrorKind::Corrupt,
            FaultKind::Schema => ErrorKind::Schema,
            FaultKind::Backend => ErrorKind::Backend,
        }
    }
}
