//! The claim strategies of a lock store over a SQL database: how a claim decides a
//! lost race. The PostgreSQL adapter implements all three; the configuration
//! names them whatever adapters a build includes.

use std::fmt;
use std::str::FromStr;

/// How a claim decides a lost race. All three give exactly one winner per token,
/// also when replicas of a fleet use different strategies (a rolling deploy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LockStrategy {
    /// A single-token claim is a conditional `INSERT`; losing the race is a unique
    /// violation, reported as contended (and logged by the server as an error).
    /// Window claims behave as [`LockStrategy::OnConflict`].
    #[default]
    Insert,
    /// Claims use `INSERT ... ON CONFLICT DO NOTHING`: a lost race writes no row and
    /// raises no server-side error.
    OnConflict,
    /// As [`LockStrategy::OnConflict`], and the token rows are first locked with
    /// `FOR UPDATE SKIP LOCKED`: a row another claimer is locking right now is
    /// walked past and reported contended (never stale).
    SkipLocked,
}

impl LockStrategy {
    /// Every strategy, in declaration order.
    pub const ALL: [LockStrategy; 3] = [
        LockStrategy::Insert,
        LockStrategy::OnConflict,
        LockStrategy::SkipLocked,
    ];

    /// The configuration name: `insert`, `on_conflict` or `skip_locked`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockStrategy::Insert => "insert",
            LockStrategy::OnConflict => "on_conflict",
            LockStrategy::SkipLocked => "skip_locked",
        }
    }
}

impl fmt::Display for LockStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A lock strategy name that is not one of `insert`, `on_conflict`, `skip_locked`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown lock strategy {0:?}; expected insert, on_conflict or skip_locked")]
pub struct UnknownStrategy(pub String);

impl FromStr for LockStrategy {
    type Err = UnknownStrategy;

    fn from_str(s: &str) -> Result<Self, UnknownStrategy> {
        LockStrategy::ALL
            .into_iter()
            .find(|strategy| strategy.as_str() == s)
            .ok_or_else(|| UnknownStrategy(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategy_names_round_trip_and_junk_is_named() {
        for strategy in LockStrategy::ALL {
            assert_eq!(strategy.as_str().parse(), Ok(strategy));
        }
        assert_eq!(
            "SKIP LOCKED".parse::<LockStrategy>(),
            Err(UnknownStrategy("SKIP LOCKED".to_owned()))
        );
        assert_eq!(
            UnknownStrategy("x".to_owned()).to_string(),
            "unknown lock strategy \"x\"; expected insert, on_conflict or skip_locked"
        );
    }
}
