//! What kind of failure an error of this crate is, so a service can map every one
//! to a response without matching each error type: retry later, give up, fix the
//! input, page someone.
//!
//! Every public error type has `kind() -> ErrorKind`: [`crate::SelectError`],
//! [`crate::SettleError`], [`crate::AdmitError`], [`crate::admission::SetLimitError`],
//! [`crate::AncestryError`], [`crate::backend::BackendError`] and
//! [`crate::ConfigError`]; [`HasKind`] lets one function take any of them. A
//! store failure keeps the kind the adapter gave it
//! ([`holdfast_domain::FaultKind`]), so a database that is unavailable (503) is
//! not mistaken for corrupt data (500).
//!
//! [`ErrorKind`] and [`RETRY_AFTER`] live in the domain
//! ([`holdfast_domain::error_kind`]), beside [`crate::SelectError`], which is the
//! domain's too; this module re-exports them.
//!
//! ```
//! use holdfast::{ErrorKind, SelectError};
//!
//! /// The status and `Retry-After` seconds a web service answers with.
//! fn response(e: &SelectError) -> (u16, Option<u64>) {
//!     let kind = e.kind();
//!     (kind.http_status(), kind.retry_after().map(|d| d.as_secs()))
//! }
//! assert_eq!(response(&SelectError::FundsLocked), (503, Some(1)));
//! assert_eq!(ErrorKind::Corrupt.http_status(), 500);
//! ```

use holdfast_domain::FaultKind;
pub use holdfast_domain::error_kind::{ErrorKind, RETRY_AFTER};

/// The kind of a port error: its fault's kind, else (a refusal that the
/// service did not turn into a variant of its own) `otherwise`.
pub(crate) fn of_fault(fault: Option<FaultKind>, otherwise: ErrorKind) -> ErrorKind {
    fault.map_or(otherwise, ErrorKind::from)
}

/// An error that says its [`ErrorKind`]: every public error type of this crate,
/// so one function (an HTTP error mapper) takes any of them.
pub trait HasKind: std::error::Error {
    /// What kind of failure this is.
    fn kind(&self) -> ErrorKind;
}

macro_rules! has_kind {
    ($($error:ty),* $(,)?) => {$(
        impl HasKind for $error {
            fn kind(&self) -> ErrorKind {
                <$error>::kind(self)
            }
        }
    )*};
}

has_kind!(
    crate::SelectError,
    crate::SettleError,
    crate::AdmitError,
    crate::admission::SetLimitError,
    crate::AncestryError,
    crate::backend::BackendError,
    crate::ConfigError,
    crate::handle::TokenError,
    crate::handle::OpenError,
);
