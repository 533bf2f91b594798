//! Which keys other instances wait for, so that a release `NOTIFY`s only where
//! somebody waits (`docs/wakeups.md`, "Only where another instance waits").
//!
//! - **An instance says what it waits for.** When one of its waits begins, it
//!   announces the key, how long to keep it (twice the wait's time left, so that
//!   a run of waits on one key announces rarely) and how long ago the waiter may
//!   have read (its subscription or its previous wait's end). An announcement
//!   that an earlier one still covers is not sent again.
//! - **A freed key is sent** while an announcement of another instance covers
//!   it, and every freed key is sent while this instance may miss
//!   announcements: while its `LISTEN` connection is down; from its (re)connect
//!   until [`OPEN`] after its question "what do you wait for?" went out; for
//!   [`LEGACY`] after it heard an instance that announces nothing (an earlier
//!   version, during a rolling upgrade); and while a payload it sent has not come
//!   back to its own listener for [`ECHO`] (a listener that hears nothing). An
//!   instance that holds keys back and heard itself last over [`HEARTBEAT`] ago
//!   sends a line to hear.
//! - **Catching up.** A key freed and not sent is remembered: an announcement of
//!   it whose waiter may have read before that release (within the waiter's age
//!   and [`CATCH_UP`] for the announcement's way here) is answered with its
//!   signal, so a waiter whose read came before the release and whose wait came
//!   after it is still woken.
//!
//! With `postgres.wake_where_waited = false` every freed key is sent (for a
//! rolling upgrade from a version that announces nothing); the instance still
//! announces its waits and answers questions.
//!
//! Wake-ups stay an optimisation with a timer fallback: whatever this gets
//! wrong costs latency, never correctness.

use std::collections::HashMap;
use std::time::Duration;

use holdfast_ports::WakeKey;
use tokio::time::Instant;

/// Every freed key is sent until this long after the question of a listener
/// that (re)connected went out: the others answer it well within that.
pub const OPEN: Duration = Duration::from_secs(2);

/// Margin for an announcement's way here (the notifier's pace, a statement, the
/// delivery), added to its waiter's age when catching up.
pub const CATCH_UP: Duration = Duration::from_secs(1);

/// The longest age an announcement's catch-up reaches back, and how long after
/// its release a key whose `NOTIFY` failed is sent again.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(60);

/// Every freed key is sent for this long after a payload of an instance that
/// announces nothing.
pub const LEGACY: Duration = Duration::from_secs(30);

/// A payload sent and not heard back within this: the listener may hear
/// nothing, so every freed key is sent until it hears one.
pub const ECHO: Duration = Duration::from_secs(1);

/// An instance holding keys back that heard itself last this long ago sends a
/// line to hear back.
pub const HEARTBEAT: Duration = Duration::from_secs(5);

/// An announcement lasts at least this long past its wait's deadline.
const SLACK: Duration = Duration::from_millis(50);

/// Entries a map holds before expired ones are dropped.
const PRUNE_AT: usize = 4096;

/// Keys with an instant each, whose expired entries are dropped once the map
/// has doubled since it was last pruned (at least [`PRUNE_AT`]): amortised, a
/// busy map is not scanned at every insert.
#[derive(Debug, Default)]
struct Timed {
    map: HashMap<WakeKey, Instant>,
    prune_at: usize,
}

impl Timed {
    fn get(&self, key: &WakeKey) -> Option<Instant> {
        self.map.get(key).copied()
    }

    /// Sets `key` to `at` (or to the later of it and the one kept, if
    /// `latest`), first dropping what `expired` says are once the map has grown.
    fn insert(
        &mut self,
        key: &WakeKey,
        at: Instant,
        latest: bool,
        expired: impl Fn(Instant) -> bool,
    ) {
        if self.map.len() >= self.prune_at.max(PRUNE_AT) {
            self.map.retain(|_, at| !expired(*at));
            self.prune_at = self.map.len() * 2;
        }
        let kept = self.map.entry(key.clone()).or_insert(at);
        *kept = if latest { (*kept).max(at) } else { at };
    }

    fn remove(&mut self, key: &WakeKey) -> Option<Instant> {
        self.map.remove(key)
    }

    fn clear(&mut self) {
        self.map.clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// The interest of other instances, and this one's announcements.
#[derive(Debug, Default)]
pub(crate) struct Interest {
    /// Every freed key is sent (`postgres.wake_where_waited = false`).
    everywhere: bool,
    /// Keys other instances wait for, until when.
    remote: Timed,
    /// Keys freed here and not sent, when last.
    unsent: Timed,
    /// This instance's announcements, until when they last.
    announced: Timed,
    /// Whether the listener is connected.
    listening: bool,
    /// Counts the listener's connections: a question belongs to one.
    generation: u64,
    /// When its question since it connected went out; `None` before.
    asked_at: Option<Instant>,
    /// When an instance that announces nothing was last heard.
    legacy_at: Option<Instant>,
    /// The first payload sent since this instance last heard itself.
    unheard_since: Option<Instant>,
    /// When this instance last heard itself (or connected).
    echo_at: Option<Instant>,
    /// Its payloads heard back so far.
    echoes: u64,
}

impl Interest {
    /// Sending every freed key (`everywhere`), or only where another instance
    /// waits.
    pub(crate) fn new(everywhere: bool) -> Self {
        Interest {
            everywhere,
            ..Interest::default()
        }
    }

    /// The listener connected: announcements may have been missed until now, so
    /// every key is sent until [`OPEN`] after its question went out, and this
    /// instance announces its waits again. The connection's generation, for its
    /// question.
    pub(crate) fn connected(&mut self, now: Instant) -> u64 {
        self.listening = true;
        self.generation += 1;
        self.asked_at = None;
        self.announced.clear();
        self.unheard_since = None;
        self.echo_at = Some(now);
        self.generation
    }

    /// The listener lost its connection: every key is sent until it is back.
    pub(crate) fn disconnected(&mut self) {
        self.listening = false;
    }

    /// Whether a question of the listener's connection `generation` is still
    /// worth asking (one of an earlier connection is not).
    pub(crate) fn current(&self, generation: u64) -> bool {
        generation == self.generation
    }

    /// The question of the listener's connection `generation` went out (one of
    /// an earlier connection says nothing of the current one).
    pub(crate) fn ask_sent(&mut self, generation: u64, now: Instant) {
        if generation == self.generation {
            self.asked_at = Some(now);
        }
    }

    /// Another instance asked what this one waits for: announce again.
    pub(crate) fn asked(&mut self) {
        self.announced.clear();
    }

    /// An instance that announces nothing was heard.
    pub(crate) fn legacy(&mut self, now: Instant) {
        self.legacy_at = Some(now);
    }

    /// Payloads of this instance heard back so far: read before a send, for
    /// [`Interest::sent`].
    pub(crate) fn echoes(&self) -> u64 {
        self.echoes
    }

    /// A payload went out, sent when `echoes` had been heard back: one heard back
    /// since (its own, come back before the send was answered) shows the
    /// listener hears.
    pub(crate) fn sent(&mut self, echoes: u64, now: Instant) {
        if self.echoes == echoes {
            self.unheard_since.get_or_insert(now);
        }
    }

    /// A payload of this instance came back to its listener.
    pub(crate) fn echo(&mut self, now: Instant) {
        self.unheard_since = None;
        self.echo_at = Some(now);
        self.echoes += 1;
    }

    /// Whether every freed key is sent now.
    fn open(&self, now: Instant) -> bool {
        let within = |at: Option<Instant>, span| {
            at.is_some_and(|at| now.saturating_duration_since(at) < span)
        };
        self.everywhere
            || !self.listening
            || self.asked_at.is_none()
            || within(self.asked_at, OPEN)
            || within(self.legacy_at, LEGACY)
            || self
                .unheard_since
                .is_some_and(|at| now.saturating_duration_since(at) >= ECHO)
    }

    /// Whether a payload should go out only to be heard back: keys are held
    /// back, and this instance heard itself last over [`HEARTBEAT`] ago.
    pub(crate) fn heartbeat(&self, now: Instant) -> bool {
        self.unheard_since.is_none()
            && self
                .echo_at
                .is_some_and(|at| now.saturating_duration_since(at) >= HEARTBEAT)
    }

    /// `key` was freed here: whether to send it to the other instances. One not
    /// sent is remembered for a later announcement to catch up on.
    pub(crate) fn freed(&mut self, key: &WakeKey, now: Instant) -> bool {
        if self.open(now) || self.remote.get(key).is_some_and(|until| until > now) {
            // An earlier release held back is answered by this one.
            self.unsent.remove(key);
            return true;
        }
        self.unsent.insert(key, now, false, |at| {
            now.saturating_duration_since(at) > MAX_AGE + CATCH_UP
        });
        false
    }

    /// `key`, held back by [`Interest::freed`], goes out anyway (caught up, or
    /// sent again after a failure): no announcement is owed it any more.
    pub(crate) fn goes(&mut self, key: &WakeKey) {
        self.unsent.remove(key);
    }

    /// Another instance waits for `key` for `lasting`, its waiter having read up
    /// to `age` ago: whether to send `key` now, because it was freed here and
    /// not sent since then (and [`CATCH_UP`] before, for the way here).
    pub(crate) fn heard(
        &mut self,
        key: &WakeKey,
        lasting: Duration,
        age: Duration,
        now: Instant,
    ) -> bool {
        self.remote
            .insert(key, now + lasting, true, |until| until <= now);
        let reach = age.min(MAX_AGE) + CATCH_UP;
        // Kept when out of reach: another waiter may have read earlier.
        let caught = self
            .unsent
            .get(key)
            .is_some_and(|at| now.saturating_duration_since(at) <= reach);
        if caught {
            self.unsent.remove(key);
        }
        caught
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
            .is_some_and(|until| until >= deadline)
        {
            return None;
        }
        let lasting = deadline.saturating_duration_since(now) * 2 + SLACK;
        self.announced
            .insert(key, now + lasting, false, |until| until <= now);
        Some(lasting)
    }

    /// Announcements of `keys` did not go out (the `NOTIFY` failed): they may be
    /// announced again (the notifier hands them back after a pause, and a new
    /// wait on each announces it).
    pub(crate) fn not_announced(&mut self, keys: &[WakeKey]) {
        for key in keys {
            self.announced.remove(key);
        }
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

    /// Connected, asked and past [`OPEN`] at the returned instant.
    fn settled() -> (Interest, Instant) {
        let start = Instant::now();
        let mut interest = Interest::default();
        let generation = interest.connected(start);
        interest.ask_sent(generation, start);
        (interest, start + OPEN)
    }

    #[test]
    fn every_key_is_sent_until_the_listener_has_asked_and_listened_for_a_while() {
        let start = Instant::now();
        let mut interest = Interest::default();
        assert!(interest.freed(&key("a"), start), "not listening yet");
        let first = interest.connected(start);
        assert!(
            interest.freed(&key("a"), start + OPEN * 3),
            "the question never went out"
        );
        interest.ask_sent(first, start + OPEN);
        assert!(interest.freed(&key("a"), start + OPEN * 2 - ms(1)));
        assert!(!interest.freed(&key("a"), start + OPEN * 2));
        interest.disconnected();
        assert!(interest.freed(&key("a"), start + OPEN * 2));
        // Connected again: the first connection's question says nothing of it.
        let second = interest.connected(start + OPEN * 2);
        interest.ask_sent(first, start + OPEN * 2);
        assert!(interest.freed(&key("a"), start + OPEN * 5));
        interest.ask_sent(second, start + OPEN * 5);
        assert!(!interest.freed(&key("a"), start + OPEN * 6));
    }

    #[test]
    fn every_key_is_sent_when_the_setting_says_so() {
        let start = Instant::now();
        let mut interest = Interest::new(true);
        let generation = interest.connected(start);
        interest.ask_sent(generation, start);
        assert!(interest.freed(&key("a"), start + OPEN * 10));
    }

    #[test]
    fn every_key_is_sent_for_a_while_after_an_instance_that_announces_nothing() {
        let (mut interest, now) = settled();
        interest.legacy(now);
        assert!(interest.freed(&key("a"), now + LEGACY - ms(1)));
        assert!(!interest.freed(&key("a"), now + LEGACY));
    }

    #[test]
    fn every_key_is_sent_while_what_this_instance_sent_does_not_come_back() {
        let (mut interest, now) = settled();
        let echoes = interest.echoes();
        interest.sent(echoes, now);
        interest.sent(echoes, now + ms(500));
        assert!(!interest.freed(&key("a"), now + ECHO - ms(1)));
        assert!(
            interest.freed(&key("a"), now + ECHO),
            "deaf since the first send"
        );
        interest.echo(now + ECHO);
        assert!(!interest.freed(&key("a"), now + ECHO));
        // Its payload came back before its send was answered: it hears.
        let echoes = interest.echoes();
        interest.echo(now + ECHO);
        interest.sent(echoes, now + ECHO);
        assert!(!interest.freed(&key("a"), now + ECHO * 3));
        // Holding keys back, it asks to hear itself once in a while.
        assert!(!interest.heartbeat(now + ECHO + HEARTBEAT - ms(1)));
        assert!(interest.heartbeat(now + ECHO + HEARTBEAT));
        interest.sent(interest.echoes(), now + ECHO + HEARTBEAT);
        assert!(
            !interest.heartbeat(now + ECHO + HEARTBEAT),
            "one is on its way"
        );
    }

    #[test]
    fn a_key_is_sent_while_another_instance_waits_for_it() {
        let (mut interest, now) = settled();
        assert!(!interest.heard(&key("a"), ms(100), ms(0), now));
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
        assert!(!interest.heard(&key("c"), ms(500), ms(0), now));
        assert!(!interest.heard(&key("c"), ms(10), ms(0), now));
        assert!(interest.freed(&key("c"), now + ms(400)));
    }

    #[test]
    fn an_announcement_whose_waiter_read_before_a_release_is_answered_with_its_key() {
        let (mut interest, now) = settled();
        assert!(!interest.freed(&key("a"), now));
        assert!(
            interest.heard(&key("a"), ms(100), ms(0), now + CATCH_UP),
            "caught up"
        );
        assert!(
            !interest.heard(&key("a"), ms(100), ms(0), now + CATCH_UP),
            "once"
        );
        // A waiter that read 5 s before its announcement arrived reaches back 5 s.
        assert!(!interest.freed(&key("b"), now));
        let later = now + CATCH_UP + ms(5_000);
        assert!(interest.heard(&key("b"), ms(100), ms(5_000), later));
        // One that read after the release is not answered.
        assert!(!interest.freed(&key("c"), now));
        assert!(!interest.heard(&key("c"), ms(100), ms(5_000), later + ms(1)));
        // ... but another that read before it still is.
        assert!(interest.heard(&key("c"), ms(100), ms(6_000), later + ms(1)));
        // A release held back, then one sent (another instance waits): the
        // announcement of a later waiter is not answered with the first.
        assert!(!interest.freed(&key("e"), now));
        let then = now + CATCH_UP + ms(1);
        assert!(
            !interest.heard(&key("e"), ms(100), ms(0), then),
            "out of reach"
        );
        assert!(interest.freed(&key("e"), then + ms(1)));
        assert!(!interest.heard(&key("e"), ms(100), ms(5_000), then + ms(2)));
        // Nor beyond the longest reach.
        assert!(!interest.freed(&key("d"), now));
        let much_later = now + MAX_AGE + CATCH_UP + ms(1);
        assert!(!interest.heard(&key("d"), ms(100), MAX_AGE * 2, much_later));
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
        // One that did not go out is announced again by the next wait.
        interest.not_announced(&[key("a")]);
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
            assert!(!interest.heard(&key(&format!("r{i}")), ms(1), ms(0), now));
        }
        let later = now + MAX_AGE + CATCH_UP + ms(1);
        assert!(!interest.freed(&key("x"), later));
        assert!(!interest.heard(&key("y"), ms(1), ms(0), later));
        assert_eq!(interest.unsent.len(), 1);
        assert_eq!(interest.remote.len(), 1);
        // Pruned once, a map grows to twice what was left before it is scanned
        // again: live entries are not scanned at every insert.
        for i in 0..PRUNE_AT {
            assert!(!interest.freed(&key(&format!("v{i}")), later));
        }
        assert_eq!(interest.unsent.len(), PRUNE_AT + 1);
        assert!(!interest.freed(&key("z"), later));
        assert_eq!(interest.unsent.len(), PRUNE_AT + 2, "all live: kept");
        assert_eq!(interest.unsent.prune_at, PRUNE_AT * 2);
    }
}
