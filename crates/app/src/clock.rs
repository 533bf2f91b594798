//! The wall clock, as the [`Clock`] port.

use std::time::{SystemTime, UNIX_EPOCH};

use holdfast_domain::Timestamp;
use holdfast_ports::Clock;

/// The system's wall clock, in milliseconds since the Unix epoch. A clock set
/// before 1970 reads as the epoch.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()
            .and_then(|d| u64::try_from(d.as_millis()).ok())
            .unwrap_or(0);
        Timestamp::from_millis(millis)
    }
}
