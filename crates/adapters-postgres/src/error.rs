//! Errors: connecting, and the mapping of driver errors onto the ports'
//! [`StoreFault`]. Nothing here ever contains a password.

use holdfast_ports::StoreFault;

use crate::options::OptionsError;

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

/// `url` with the password of its user info replaced by `***`.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let authority_end = url[scheme_end..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| scheme_end + i);
    let authority = &url[scheme_end..authority_end];
    let Some(at) = authority.rfind('@') else {
        return redact_query_password(url);
    };
    let redacted = match authority[..at].find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end],
            &authority[..colon],
            &url[scheme_end + at..]
        ),
        None => url.to_owned(),
    };
    redact_query_password(&redacted)
}

/// Redacts a `password=` query parameter (libpq accepts one).
fn redact_query_password(url: &str) -> String {
    let Some(query_start) = url.find('?') else {
        return url.to_owned();
    };
    let (base, query) = url.split_at(query_start + 1);
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
            _ => param.to_owned(),
        })
        .collect();
    format!("{base}{}", params.join("&"))
}

/// Removes every occurrence of `secret` from `text` (when the secret is non-empty).
pub fn scrub(text: &str, secret: Option<&str>) -> String {
    match secret {
        Some(secret) if !secret.is_empty() => text.replace(secret, "***"),
        _ => text.to_owned(),
    }
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
                // connection exceptions, operator intervention (terminated backend),
                // insufficient resources (too many connections)
                Some("08" | "57" | "53") => StoreFault::Unavailable(message),
                // serialization failure, deadlock, lock not available
                Some("40") | Some("55") => StoreFault::Busy(message),
                // undefined table / column / function: schema missing or too old
                Some("42") if matches!(code.as_str(), "42P01" | "42703" | "42883") => {
                    StoreFault::Schema(message)
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_url_hides_passwords_in_user_info_and_query() {
        assert_eq!(
            redact_url("postgres://app:hunter2@db.example:5432/holdfast"),
            "postgres://app:***@db.example:5432/holdfast"
        );
        assert_eq!(
            redact_url("postgres://app@db/holdfast?password=hunter2&sslmode=require"),
            "postgres://app@db/holdfast?password=***&sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://app:p%40ss@h/db?application_name=x"),
            "postgres://app:***@h/db?application_name=x"
        );
        assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
        assert_eq!(redact_url("garbage"), "garbage");
    }

    #[test]
    fn scrub_removes_the_secret_everywhere() {
        assert_eq!(scrub("a hunter2 b hunter2", Some("hunter2")), "a *** b ***");
        assert_eq!(scrub("unchanged", Some("")), "unchanged");
        assert_eq!(scrub("unchanged", None), "unchanged");
    }
}
