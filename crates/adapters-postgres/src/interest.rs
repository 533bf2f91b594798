//! Which keys other instances wait for, so that a release `NOTIFY`s only where
//! somebody waits (`docs/wakeups.md`, "Across instances").
//!
//! - **An instance says what it waits for.** When one of its waits begins, it
//!   announces the key and how long to keep it (twice the wait's time left, so
//!   that a run of waits on one key announces rarely); an announcement that an
//!   earlier one still covers is not sent again.
//! - **A freed key is sent** while an announcement of another instance covers
//!   it, and always while this instance may have missed announcements: while its
//!   `LISTEN` connection is down and for [`OPEN`] after it (re)connects (it then
//!   asks the others to announce what they wait for).
//! - **Catching up.** A key freed and not sent is remembered for [`CATCH_UP`]:
//!   an announcement of it arriving within that is answered with its signal, so a
//!   waiter whose announcement crossed the release (it read before the release
//!   and began to wait after it) is still woken.
//!
//! Wake-ups stay an optimisation with a timer fallback: whatever this gets
//! wrong costs latency, never correctness.

use std::collections::HashMap;
use std::time::Duration;

use holdfast_ports::WakeKey;
use tokio::time::Instant;

/// After the listener (re)connects, every freed key is sent for this long: the
/// other instances answer its question with what they wait for well within it.
pub const OPEN: Duration = Duration::from_secs(2);

/// How long a key freed and not sent is remembered, for an announcement that
/// crossed it: longer than a waiter takes from its read to its wait under load,
/// plus the announcement's way here.
pub const CATCH_UP: Duration = Duration::from_secs(1);

/// An announcement lasts at least this long past its wait's deadline.
const SLACK: Duration = Duration::from_millis(50);

/// Entries a map holds before expired ones are dropped.
const PRUNE_AT: usize = 4096;

/// The interest of other instances, and this one's announcements.
#[derive(Debug, Default)]
pub(crate) struct Interest {
    /// Keys other instances wait for, until when.
    remote: HashMap<WakeKey, Instant>,
    /// Keys freed here and not sent, when.
    unsent: HashMap<WakeKey, Instant>,
    /// This instance's announcements, until when they last.
    announced: HashMap<WakeKey, Instant>,
    /// Since when the listener is connected; `None` while it is not.
    listening_since: Option<Instant>,
}

impl Interest {
    /// The listener connected: announcements may have been missed until now, so
    /// every key is sent for [`OPEN`], and this instance announces its waits
    /// again.
    pub(crate) fn connected(&mut self, now: Instant) {
        self.listening_since = Some(now);
        self.announced.clear();
    }

    /// The listener lost its connection: every key is sent until it is back.
    pub(crate) fn disconnected(&mut self) {
        self.listening_since = None;
    }

    /// Another instance asked what this one waits for: announce again.
    pub(crate) fn asked(&mut self) {
        self.announced.clear();
    }

    /// Whether every freed key is sent now.
    fn open(&self, now: Instant) -> bool {
        self.listening_since
            .is_none_or(|since| now.saturating_duration_since(since) < OPEN)
    }

    /// `key` was freed here: whether to send it to the other instances. One not
    /// sent is remembered for [`CATCH_UP`].
    pub(crate) fn freed(&mut self, key: &WakeKey, now: Instant) -> bool {
        if self.open(now) || self.remote.get(key).is_some_and(|until| *until > now) {
            return true;
        }
        prune(&mut self.unsent, |at| {
            now.saturating_duration_since(at) > CATCH_UP
        });
        self.unsent.insert(key.clone(), now);
        false
    }

    /// Another instance waits for `key` for `lasting`: whether to send `key` now,
    /// because it was freed here within [`CATCH_UP`] and not sent.
    pub(crate) fn heard(&mut self, key: &WakeKey, lasting: Duration, now: Instant) -> bool {
        let until = now + lasting;
        prune(&mut self.remote, |u| u <= now);
        let kept = self.remote.entry(key.clone()).or_insert(until);
        *kept = (*kept).max(until);
        self.unsent
            .remove(key)
            .is_some_and(|at| now.saturating_duration_since(at) <= CATCH_UP)
    }

    /// A wait on `key` until `deadline` began here: how long to announce it for,
    /// or `None` when an announcement still covers it.
    pub(crate) fn waits(
        &mut self,
        key: &WakeKey,
        deadline: Instant,
        now: Instant,
    ) -> Option<Duration> {
        if self
            .announced
            .get(key)
            .is_some_and(|until| *until >= deadline)
        {
            return None;
        }
        let lasting = deadline.saturating_duration_since(now) * 2 + SLACK;
        prune(&mut self.announced, |u| u <= now);
        self.announced.insert(key.clone(), now + lasting);
        Some(lasting)
    }
}

impl Interest {
    /// Announcements of `keys` did not go out (the `NOTIFY` failed): the next
    /// wait on each announces it again.
    pub(crate) fn not_announced(&mut self, keys: &[WakeKey]) {
        for key in keys {
            self.announced.remove(key);
        }
    }
}

/// Drops the entries `expired` says are, once `map` has grown to [`PRUNE_AT`].
fn prune(map: &mut HashMap<WakeKey, Instant>, expired: impl Fn(Instant) -> bool) {
    if map.len() >= PRUNE_AT {
        map.retain(|_, at| !expired(*at));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(wallet: &str) -> WakeKey {
        WakeKey::tokens_of(wallet, "t").expect("valid ids")
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Listening for longer than [`OPEN`] at `now`.
    fn settled() -> (Interest, Instant) {
        let start = Instant::now();
        let mut interest = Interest::default();
        interest.connected(start);
        (interest, start + OPEN)
    }

    #[test]
    fn every_key_is_sent_until_the_listener_has_listened_for_a_while() {
        let start = Instant::now();
        let mut interest = Interest::default();
        assert!(interest.freed(&key("a"), start), "not listening yet");
        interest.connected(start);
        assert!(interest.freed(&key("a"), start + OPEN - ms(1)));
        assert!(!interest.freed(&key("a"), start + OPEN));
        interest.disconnected();
        assert!(interest.freed(&key("a"), start + OPEN + ms(1)));
    }

    #[test]
    fn a_key_is_sent_while_another_instance_waits_for_it() {
        let (mut interest, now) = settled();
        assert!(!interest.heard(&key("a"), ms(100), now));
        assert!(interest.freed(&key("a"), now + ms(99)));
        assert!(
            !interest.freed(&key("b"), now + ms(99)),
            "nobody waits for b"
        );
        assert!(
            !interest.freed(&key("a"), now + ms(100)),
            "the announcement ran out"
        );
        // A shorter announcement does not cut a longer one short.
        assert!(!interest.heard(&key("c"), ms(500), now));
        assert!(!interest.heard(&key("c"), ms(10), now));
        assert!(interest.freed(&key("c"), now + ms(400)));
    }

    #[test]
    fn an_announcement_that_crossed_a_release_is_answered_with_its_key() {
        let (mut interest, now) = settled();
        assert!(!interest.freed(&key("a"), now));
        assert!(
            interest.heard(&key("a"), ms(100), now + CATCH_UP),
            "caught up"
        );
        assert!(!interest.heard(&key("a"), ms(100), now + CATCH_UP), "once");
        assert!(!interest.freed(&key("b"), now));
        assert!(
            !interest.heard(&key("b"), ms(100), now + CATCH_UP + ms(1)),
            "released too long before"
        );
    }

    #[test]
    fn a_wait_is_announced_unless_an_announcement_covers_it() {
        let (mut interest, now) = settled();
        assert_eq!(interest.waits(&key("a"), now + ms(100), now), Some(ms(250)));
        assert_eq!(interest.waits(&key("a"), now + ms(250), now + ms(10)), None);
        assert_eq!(
            interest.waits(&key("a"), now + ms(300), now + ms(20)),
            Some(ms(610))
        );
        assert_eq!(interest.waits(&key("b"), now, now), Some(SLACK));
        // Asked (or reconnected): every wait is announced again.
        interest.asked();
        assert_eq!(
            interest.waits(&key("a"), now + ms(100), now + ms(20)),
            Some(ms(210))
        );
        interest.connected(now);
        assert!(
            interest
                .waits(&key("a"), now + ms(100), now + ms(20))
                .is_some()
        );
    }

    #[test]
    fn the_maps_drop_what_expired_once_they_grow() {
        let (mut interest, now) = settled();
        for i in 0..PRUNE_AT {
            assert!(!interest.freed(&key(&format!("w{i}")), now));
            assert!(!interest.heard(&key(&format!("r{i}")), ms(1), now));
        }
        let later = now + CATCH_UP + ms(1);
        assert!(!interest.freed(&key("x"), later));
        assert!(!interest.heard(&key("y"), ms(1), later));
        assert_eq!(interest.unsent.len(), 1);
        assert_eq!(interest.remote.len(), 1);
    }
}
