//! The memory that another connection holds the file's write lock: it bounds
//! the busy-wait of a sequence of writes (a select) by about one busy timeout
//! instead of one busy timeout per write.
//!
//! A write that waited out the whole busy timeout for the write lock and did not
//! get it records the fact. While the memory is live, a write tries for the lock
//! only for a short probe (a tenth of the busy timeout, at most [`MAX_PROBE`])
//! and then fails with [`StoreFault::Busy`]: a select whose six store calls
//! each waited 5 s took 30 s to fail; now the first waits 5 s and the others
//! probe, about 5.3 s in all. The memory ends when a write gets the lock, or
//! when no write has found the lock held for one busy timeout (so a lock found
//! held once, long ago, costs a later write nothing). A lock held for less than
//! the busy timeout never sets it: the write waiting for it gets it.
//!
//! Only writes take part. In WAL mode a read needs no write lock and proceeds
//! beside another connection's writer: a read cut short because the write lock
//! is held would turn a read that works into an error, and a read that works
//! says nothing about the write lock, so reads neither consult nor clear the
//! memory (each waits out its own busy timeout in the rare cases a reader is
//! blocked: an exclusive lock taken outside WAL mode, a recovery).
//!
//! The trade: while the memory is live, a write whose probe meets a short,
//! ordinary lock of another connection fails instead of waiting it out. That
//! happens only within one busy timeout of a lock held past the busy timeout.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use holdfast_ports::StoreFault;

/// The longest probe for the write lock while the memory is live.
pub(crate) const MAX_PROBE: Duration = Duration::from_millis(50);

/// How many write transactions waited for the write lock, and how they ended
/// ([`crate::SqliteBackend::busy_waits`]). A batch of writes committed
/// together counts once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BusyWaits {
    /// Found the write lock held by another connection at least once, and waited.
    pub waited: u64,
    /// Waited the whole busy timeout without getting the lock, and failed
    /// [`StoreFault::Busy`].
    pub waited_out: u64,
    /// Failed [`StoreFault::Busy`] after a short probe only, because a write
    /// had just waited out the busy timeout.
    pub cut_short: u64,
}

/// How long a write may try for the write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Budget {
    /// The whole busy timeout.
    Full(Duration),
    /// A probe: the lock was found held past the busy timeout just now.
    Probe(Duration),
}

impl Budget {
    pub(crate) fn wait(self) -> Duration {
        match self {
            Budget::Full(wait) | Budget::Probe(wait) => wait,
        }
    }
}

/// The memory of one adapter instance, and its counters.
#[derive(Debug)]
pub(crate) struct Lockout {
    busy_timeout: Duration,
    probe: Duration,
    /// When a write last failed for want of the write lock; `None` once a
    /// write got it.
    held_since: Mutex<Option<Instant>>,
    waited: AtomicU64,
    waited_out: AtomicU64,
    cut_short: AtomicU64,
}

impl Lockout {
    pub(crate) fn new(busy_timeout: Duration) -> Lockout {
        Lockout {
            busy_timeout,
            probe: (busy_timeout / 10).min(MAX_PROBE),
            held_since: Mutex::new(None),
            waited: AtomicU64::new(0),
            waited_out: AtomicU64::new(0),
            cut_short: AtomicU64::new(0),
        }
    }

    fn held_since(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.held_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How long the write starting at `now` may try for the lock.
    pub(crate) fn budget(&self, now: Instant) -> Budget {
        match *self.held_since() {
            Some(at) if now.saturating_duration_since(at) < self.busy_timeout => {
                Budget::Probe(self.probe)
            }
            _ => Budget::Full(self.busy_timeout),
        }
    }

    /// A write found the lock held and waits (counted once per write).
    pub(crate) fn waiting(&self) {
        self.waited.fetch_add(1, Ordering::Relaxed);
    }

    /// A write got the lock: the memory ends.
    pub(crate) fn got_lock(&self) {
        *self.held_since() = None;
    }

    /// A write with `budget` failed at `now` with `fault`. A busy fault
    /// renews the memory (a full wait starts it) and, after a probe, says
    /// why it came early; other faults pass unchanged.
    pub(crate) fn failed(&self, budget: Budget, now: Instant, fault: StoreFault) -> StoreFault {
        let StoreFault::Busy(reason) = fault else {
            return fault;
        };
        *self.held_since() = Some(now);
        match budget {
            Budget::Full(_) => {
                self.waited_out.fetch_add(1, Ordering::Relaxed);
                StoreFault::Busy(reason)
            }
            Budget::Probe(probe) => {
                self.cut_short.fetch_add(1, Ordering::Relaxed);
                StoreFault::Busy(format!(
                    "{reason}; another connection has held the write lock past the busy \
                     timeout ({:?}), so this write tried for it {probe:?} only",
                    self.busy_timeout
                ))
            }
        }
    }

    pub(crate) fn counts(&self) -> BusyWaits {
        BusyWaits {
            waited: self.waited.load(Ordering::Relaxed),
            waited_out: self.waited_out.load(Ordering::Relaxed),
            cut_short: self.cut_short.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(5);

    fn busy() -> StoreFault {
        StoreFault::Busy("database is locked".into())
    }

    #[test]
    fn a_full_wait_that_fails_cuts_the_next_writes_short_until_one_gets_the_lock() {
        let lockout = Lockout::new(TIMEOUT);
        let t0 = Instant::now();
        assert_eq!(lockout.budget(t0), Budget::Full(TIMEOUT));
        let fault = lockout.failed(Budget::Full(TIMEOUT), t0, busy());
        assert_eq!(fault, busy());
        let probe = Budget::Probe(MAX_PROBE);
        assert_eq!(lockout.budget(t0), probe);
        let later = t0 + Duration::from_millis(60);
        match lockout.failed(probe, later, busy()) {
            StoreFault::Busy(m) => assert!(m.starts_with("database is locked; "), "{m}"),
            other => panic!("{other:?}"),
        }
        // Each failure renews the memory: one busy timeout after the last one,
        // not after the first.
        assert_eq!(lockout.budget(t0 + TIMEOUT), probe);
        lockout.got_lock();
        assert_eq!(lockout.budget(later), Budget::Full(TIMEOUT));
        assert_eq!(
            lockout.counts(),
            BusyWaits {
                waited: 0,
                waited_out: 1,
                cut_short: 1
            }
        );
    }

    #[test]
    fn the_memory_lapses_after_a_quiet_busy_timeout() {
        let lockout = Lockout::new(TIMEOUT);
        let t0 = Instant::now();
        let _ = lockout.failed(Budget::Full(TIMEOUT), t0, busy());
        assert_eq!(
            lockout.budget(t0 + TIMEOUT - Duration::from_millis(1)),
            Budget::Probe(MAX_PROBE)
        );
        assert_eq!(lockout.budget(t0 + TIMEOUT), Budget::Full(TIMEOUT));
    }

    #[test]
    fn other_faults_neither_start_the_memory_nor_count() {
        let lockout = Lockout::new(Duration::from_millis(100));
        let t0 = Instant::now();
        let io = StoreFault::Backend("disk I/O error".into());
        assert_eq!(
            lockout.failed(Budget::Full(Duration::from_millis(100)), t0, io.clone()),
            io
        );
        assert_eq!(lockout.budget(t0), Budget::Full(Duration::from_millis(100)));
        assert_eq!(lockout.counts(), BusyWaits::default());
        // A short busy timeout probes a tenth of it.
        let _ = lockout.failed(Budget::Full(Duration::from_millis(100)), t0, busy());
        assert_eq!(lockout.budget(t0), Budget::Probe(Duration::from_millis(10)));
    }
}
