//! Configuration of the PostgreSQL backend.

use std::time::Duration;

pub use holdfast_ports::{LockStrategy, UnknownStrategy};

/// Options of [`crate::PgBackend::connect`]. Plain data; [`PgOptions::validate`]
/// runs on connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOptions {
    /// How claims decide a lost race.
    pub strategy: LockStrategy,
    /// The most connections the pool opens (at least 1). Every operation holds at
    /// most one connection at a time, so any size is deadlock-free.
    pub max_connections: u32,
    /// How long to wait for a connection, when connecting and when an operation
    /// takes one from a busy pool.
    pub connect_timeout: Duration,
    /// Whether instances wake each other's waiters (`NOTIFY` after writes that
    /// free tokens or slots, one `LISTEN` connection per instance; default on).
    /// Off, waiters of this instance are still woken by its own writes.
    pub wakeups: bool,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            strategy: LockStrategy::default(),
            max_connections: 10,
            connect_timeout: Duration::from_secs(10),
            wakeups: true,
        }
    }
}

/// Options that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    /// `max_connections` was zero.
    #[error("max_connections is 0; expected at least 1")]
    NoConnections,
    /// `connect_timeout` was zero.
    #[error("connect_timeout is 0; expected a positive duration")]
    ZeroTimeout,
}

impl PgOptions {
    /// Rejects a pool of zero connections and a zero timeout.
    pub fn validate(&self) -> Result<(), OptionsError> {
        if self.max_connections == 0 {
            return Err(OptionsError::NoConnections);
        }
        if self.connect_timeout.is_zero() {
            return Err(OptionsError::ZeroTimeout);
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
        assert_eq!(instant.validate(), Err(OptionsError::ZeroTimeout));
    }
}
