//! The simulated clock: wall time sped up by a factor, so leases expire without
//! real waiting. Lock timestamps and the lease sweep read it; backoffs and
//! latencies stay on the wall clock.

use std::time::{Duration, Instant};

use holdfast_domain::Timestamp;
use holdfast_ports::Clock;

/// A clock that starts at `origin` and runs `scale` times faster than the wall
/// clock. With a scale of 10, a 3 min lease expires after 18 s of wall time.
#[derive(Debug, Clone)]
pub struct SimClock {
    started: Instant,
    origin: Timestamp,
    scale: u32,
}

impl SimClock {
    /// A clock reading `origin` now, running `scale` (at least 1) times faster.
    pub fn new(origin: Timestamp, scale: u32) -> Self {
        SimClock {
            started: Instant::now(),
            origin,
            scale: scale.max(1),
        }
    }

    /// How much faster than the wall clock it runs.
    pub fn scale(&self) -> u32 {
        self.scale
    }

    /// The wall-clock duration that `simulated` takes on this clock (at least 1 ms).
    pub fn wall(&self, simulated: Duration) -> Duration {
        (simulated / self.scale).max(Duration::from_millis(1))
    }
}

impl Clock for SimClock {
    fn now(&self) -> Timestamp {
        let elapsed = self.started.elapsed().saturating_mul(self.scale);
        let millis = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        Timestamp::from_millis(self.origin.as_millis().saturating_add(millis))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_faster_than_the_wall_clock_and_never_goes_back() {
        let clock = SimClock::new(Timestamp::from_millis(1_000), 100);
        let a = clock.now();
        let b = clock.now();
        assert!(a >= Timestamp::from_millis(1_000));
        assert!(b >= a);
        assert_eq!(
            clock.wall(Duration::from_secs(180)),
            Duration::from_millis(1_800)
        );
        assert_eq!(clock.wall(Duration::ZERO), Duration::from_millis(1));
    }
}
