//! Why a SQLite database could not be opened. Failures of the ports themselves are
//! the ports' own error types ([`holdfast_ports::StoreFault`] and friends).

use holdfast_ports::StoreFault;

/// Why a database could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// The location is neither a `sqlite:` URL nor a usable file path.
    #[error(
        "invalid SQLite location {input:?}: {reason}; expected sqlite://path, sqlite::memory: or a file path"
    )]
    InvalidLocation {
        /// The rejected location.
        input: String,
        /// What was wrong.
        reason: &'static str,
    },
    /// An option is out of range.
    #[error("invalid SQLite option {option} = {value}; expected {expected}")]
    InvalidOption {
        /// The option name.
        option: &'static str,
        /// The rejected value.
        value: String,
        /// The accepted range.
        expected: String,
    },
    /// The file could not be opened or is not a SQLite database.
    #[error("cannot open SQLite database {path}: {reason}")]
    Unavailable {
        /// The file path.
        path: String,
        /// SQLite's reason.
        reason: String,
    },
    /// The database has a schema version newer than this code knows.
    #[error(
        "database schema version {found} is newer than this holdfast knows (up to {known}); upgrade holdfast"
    )]
    SchemaTooNew {
        /// The version recorded in the database.
        found: i64,
        /// The newest version this code has migrations for.
        known: i64,
    },
    /// A migration failed; it was rolled back.
    #[error("schema migration {version} ({name}) failed: {reason}")]
    Migration {
        /// The migration version.
        version: i64,
        /// Its name.
        name: &'static str,
        /// Why it failed.
        reason: String,
    },
    /// The database failed while opening (busy, I/O, ...).
    #[error("opening the SQLite database failed: {0}")]
    Fault(#[from] StoreFault),
}
