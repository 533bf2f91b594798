//! Errors: connecting, and the mapping of driver errors onto the ports'
//! [`StoreFault`]. Nothing here ever contains a password: URLs are shown through
//! [`crate::redact_url`], driver messages scrubbed of the password's every form
//! (`url.rs`).

use holdfast_ports::StoreFault;

use crate::hosts::{HostsError, TargetSessionAttrs};
use crate::options::OptionsError;
use crate::route::HostTried;

/// Why [`crate::PgBackend::connect`] failed. The URL in messages is redacted.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The options cannot work.
    #[error("invalid PostgreSQL options: {0}")]
    Options(#[from] OptionsError),
    /// The URL could not be parsed.
    #[error("invalid PostgreSQL URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, password redacted.
        url: String,
        /// What was wrong.
        reason: String,
    },
    /// The hosts or `target_session_attrs` of the URL cannot be used.
    #[error("invalid PostgreSQL URL {url}: {source}")]
    Hosts {
        /// The URL, password redacted.
        url: String,
        /// What was wrong.
        #[source]
        source: HostsError,
    },
    /// No host of the URL gave a session of the wanted kind: every one refused,
    /// did not answer, or is of another kind (a standby, read-only), also after
    /// waiting up to the connect timeout for a busy server or a promotion.
    #[error(
        "no host of PostgreSQL at {url} gives a {target} session: {}",
        crate::route::list(tried)
    )]
    NoHost {
        /// The URL, password redacted.
        url: String,
        /// The kind of session wanted.
        target: TargetSessionAttrs,
        /// Every host, in order, and why it was passed over (password removed).
        tried: Vec<HostTried>,
    },
    /// No connection within the connect timeout.
    #[error("PostgreSQL at {url} did not accept a connection within {timeout_ms} ms: {detail}")]
    Timeout {
        /// The URL, password redacted.
        url: String,
        /// The configured timeout.
        timeout_ms: u128,
        /// The last error seen, if any.
        detail: String,
    },
    /// The server refused or dropped the connection.
    #[error("cannot connect to PostgreSQL at {url}: {detail}")]
    Unavailable {
        /// The URL, password redacted.
        url: String,
        /// The driver's reason, password redacted.
        detail: String,
    },
    /// Applying the embedded migrations failed.
    #[error("migrating PostgreSQL at {url} failed: {detail}")]
    Migration {
        /// The URL, password redacted.
        url: String,
        /// The driver's reason.
        detail: String,
    },
}

/// The SQLSTATE of a database error, if the error came from the server.
pub fn sqlstate(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// Maps a driver error onto the ports' fault kinds. The message is the driver's,
/// which never includes the connection URL.
pub fn fault(err: &sqlx::Error) -> StoreFault {
    let message = err.to_string();
    match err {
        sqlx::Error::Database(_) => {
            let code = sqlstate(err).unwrap_or_default();
            match code.get(..2) {
                // query_canceled: `statement_timeout` ran out (or the statement was
                // cancelled); the outcome is unknown, the session lives on
                _ if code == "57014" => StoreFault::Timeout(message),
                // connection exceptions, operator intervention (terminated backend),
                // insufficient resources (too many connections)
                Some("08" | "57" | "53") => StoreFault::Unavailable(message),
                // the server ended a session idle in a transaction (a frozen client);
                // a write sent to a server that refuses writes (a standby, a demoted
                // or read-only primary): nothing was written, the primary is elsewhere
                _ if code == "25P03" || code == "25006" => StoreFault::Unavailable(message),
                // serialization failure, deadlock, lock not available
                Some("40") | Some("55") => StoreFault::Busy(message),
                // undefined table / column / function: schema missing or too old
                Some("42") if matches!(code.as_str(), "42P01" | "42703" | "42883") => {
                    StoreFault::Schema(message)
                }
                // everything else, including the refusals of migration 0007's
                // functions (25000: a transaction not at READ COMMITTED, which the
                // session settings rule out; 22023: malformed arrays or amounts):
                // a retry would fail the same way
                _ => StoreFault::Backend(message),
            }
        }
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => StoreFault::Unavailable(message),
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => StoreFault::Corrupt(message),
        _ => StoreFault::Backend(message),
    }
}
