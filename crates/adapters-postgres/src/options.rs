//! Configuration of the PostgreSQL backend.

use std::time::Duration;

pub use holdfast_ports::{LockStrategy, UnknownStrategy};

/// Options of [`crate::PgBackend::connect`]. Plain data; [`PgOptions::validate`]
/// runs on connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOptions {
    /// How claims decide a lost race.
    pub strategy: LockStrategy,
    /// The owner id this instance records on its locks and selections, so a
    /// restarted instance finds its own unsettled work (`""`: none recorded).
    pub owner: String,
    /// The most connections the pool opens (at least 1). Every operation holds at
    /// most one connection at a time, so any size is deadlock-free.
    pub max_connections: u32,
    /// Connections the pool keeps open even when idle (at most `max_connections`).
    pub min_connections: u32,
    /// How long [`crate::PgBackend::connect`] waits for the first connection.
    pub connect_timeout: Duration,
    /// How long an operation waits for a connection from a busy pool (or for a new
    /// one while the server refuses them) before it fails as unavailable.
    pub acquire_timeout: Duration,
    /// An idle connection beyond `min_connections` is closed after this long.
    pub idle_timeout: Duration,
    /// A connection is closed (and replaced when needed) after this long.
    pub max_lifetime: Duration,
    /// How long a read-and-claim waits for its wallet and type's advisory lock
    /// before it reads and claims without it (always correct; the lock only
    /// spares races). Milliseconds, so a frozen holder cannot stall the fleet.
    pub line_wait: Duration,
    /// The session's `lock_timeout`: the longest wait for a row lock (for example
    /// behind a frozen replica's uncommitted claim); then the statement fails busy.
    pub lock_timeout: Duration,
    /// The session's `statement_timeout`: the longest any statement runs.
    pub statement_timeout: Duration,
    /// The session's `idle_in_transaction_session_timeout`: the server ends a
    /// session that sits inside a transaction this long (a frozen replica), which
    /// releases its locks.
    pub idle_in_transaction_timeout: Duration,
    /// The session's `tcp_keepalives_idle` (whole seconds): the server probes a
    /// silent client after this long and ends the session of one that vanished.
    pub keepalive_idle: Duration,
    /// Whether instances wake each other's waiters (`NOTIFY` after writes that
    /// free tokens or slots, one `LISTEN` connection per instance; default on).
    /// Off, waiters of this instance are still woken by its own writes.
    pub wakeups: bool,
    /// With wake-ups: whether a freed key is sent only to instances that
    /// announced a wait on it (default on; `docs/wakeups.md`). Off, every freed
    /// key is sent, as instances of earlier versions do: for a rolling upgrade
    /// from one, whose waiters announce nothing.
    pub wake_where_waited: bool,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            strategy: LockStrategy::default(),
            owner: String::new(),
            max_connections: 10,
            min_connections: 0,
            connect_timeout: Duration::from_secs(10),
            acquire_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_lifetime: Duration::from_secs(30 * 60),
            line_wait: Duration::from_millis(50),
            lock_timeout: Duration::from_secs(1),
            statement_timeout: Duration::from_secs(30),
            idle_in_transaction_timeout: Duration::from_secs(5),
            keepalive_idle: Duration::from_secs(10),
            wakeups: true,
            wake_where_waited: true,
        }
    }
}

/// Options that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    /// `max_connections` was zero.
    #[error("max_connections is 0; expected at least 1")]
    NoConnections,
    /// `min_connections` was above `max_connections`.
    #[error("min_connections is {min}; expected at most max_connections ({max})")]
    MinAboveMax {
        /// The minimum asked for.
        min: u32,
        /// The maximum.
        max: u32,
    },
    /// A duration that must be positive was zero (PostgreSQL reads a zero timeout
    /// as none at all).
    #[error("{0} is 0; expected a positive duration")]
    ZeroDuration(&'static str),
    /// `line_wait` was not below `statement_timeout` (the statement would be
    /// cancelled before the line wait could run out).
    #[error(
        "line_wait is {line_wait_ms} ms; expected less than statement_timeout ({statement_timeout_ms} ms)"
    )]
    LineWaitNotBelowStatementTimeout {
        /// The line wait.
        line_wait_ms: u128,
        /// The statement timeout.
        statement_timeout_ms: u128,
    },
    /// A duration PostgreSQL cannot take (its timeouts are 32-bit milliseconds).
    #[error("{name} is {ms} ms; expected at most {max} ms")]
    TooLong {
        /// The option.
        name: &'static str,
        /// What was given.
        ms: u128,
        /// The limit.
        max: u128,
    },
}

/// The longest timeout PostgreSQL accepts (`INT_MAX` milliseconds).
pub const MAX_SERVER_TIMEOUT: Duration = Duration::from_millis(2_147_483_647);

impl PgOptions {
    /// Rejects a pool of zero connections, a minimum above the maximum, a zero
    /// duration and a server timeout PostgreSQL cannot take.
    pub fn validate(&self) -> Result<(), OptionsError> {
        if self.max_connections == 0 {
            return Err(OptionsError::NoConnections);
        }
        if self.min_connections > self.max_connections {
            return Err(OptionsError::MinAboveMax {
                min: self.min_connections,
                max: self.max_connections,
            });
        }
        let durations = [
            ("connect_timeout", self.connect_timeout, false),
            ("acquire_timeout", self.acquire_timeout, false),
            ("idle_timeout", self.idle_timeout, false),
            ("max_lifetime", self.max_lifetime, false),
            ("line_wait", self.line_wait, true),
            ("lock_timeout", self.lock_timeout, true),
            ("statement_timeout", self.statement_timeout, true),
            (
                "idle_in_transaction_timeout",
                self.idle_in_transaction_timeout,
                true,
            ),
            ("keepalive_idle", self.keepalive_idle, true),
        ];
        for (name, value, on_server) in durations {
            if value.as_millis() == 0 {
                return Err(OptionsError::ZeroDuration(name));
            }
            if on_server && value > MAX_SERVER_TIMEOUT {
                return Err(OptionsError::TooLong {
                    name,
                    ms: value.as_millis(),
                    max: MAX_SERVER_TIMEOUT.as_millis(),
                });
            }
        }
        if self.line_wait >= self.statement_timeout {
            return Err(OptionsError::LineWaitNotBelowStatementTimeout {
                line_wait_ms: self.line_wait.as_millis(),
                statement_timeout_ms: self.statement_timeout.as_millis(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_reject_empty_pool_and_zero_timeout() {
        assert_eq!(PgOptions::default().validate(), Ok(()));
        let empty = PgOptions {
            max_connections: 0,
            ..PgOptions::default()
        };
        assert_eq!(empty.validate(), Err(OptionsError::NoConnections));
        let instant = PgOptions {
            connect_timeout: Duration::ZERO,
            ..PgOptions::default()
        };
        assert_eq!(
            instant.validate(),
            Err(OptionsError::ZeroDuration("connect_timeout"))
        );
        let unbounded = PgOptions {
            statement_timeout: Duration::from_micros(10),
            ..PgOptions::default()
        };
        assert_eq!(
            unbounded.validate(),
            Err(OptionsError::ZeroDuration("statement_timeout"))
        );
        let min_above_max = PgOptions {
            min_connections: 11,
            ..PgOptions::default()
        };
        assert_eq!(
            min_above_max.validate(),
            Err(OptionsError::MinAboveMax { min: 11, max: 10 })
        );
        let too_long = PgOptions {
            lock_timeout: Duration::from_secs(30 * 24 * 3600),
            ..PgOptions::default()
        };
        assert!(matches!(
            too_long.validate(),
            Err(OptionsError::TooLong {
                name: "lock_timeout",
                ..
            })
        ));
    }
}
