//! The wake-up port: waiting for "something you wanted may be free now" instead of
//! sleeping blind (`docs/wakeups.md`).
//!
//! A writer signals [`WakeKey`]s after its write committed: a lock released
//! (settlement, a failed or cancelled select, the lease sweep) or a token minted
//! makes tokens of a (wallet, type) spendable; a queue record written may have
//! freed a slot. A waiter [`WakeUps::subscribe`]s to its key *before* it reads,
//! so a signal sent between its read and its wait is not lost, and then
//! [`Subscription::wait_until`] a signal or its deadline, whichever is first.
//!
//! Wake-ups are an optimisation with a timer fallback: a lost or late signal costs
//! latency, never correctness, so every wait has a deadline.
//!
//! [`Registry`] is the in-process part every adapter shares: the selectors and
//! admission workers of one backend instance wait on it at no database cost. An
//! adapter adds how signals cross instances (PostgreSQL: `LISTEN`/`NOTIFY`;
//! SQLite: polling `PRAGMA data_version` while anyone waits).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use holdfast_domain::{Fullness, Others, QueueName, TokenType, TxId, WalletId};
use tokio::sync::Notify;
use tokio::time::Instant;

/// What a waiter waits for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WakeKey {
    /// Tokens of this wallet and type may be spendable and unlocked now.
    Tokens {
        /// The wallet.
        wallet: WalletId,
        /// The token type.
        token_type: TokenType,
    },
    /// A slot of this queue may be free now (its record was written).
    Queue(QueueName),
}

impl WakeKey {
    /// The key of tokens of `wallet` and `token_type`.
    pub fn tokens(wallet: &WalletId, token_type: &TokenType) -> Self {
        WakeKey::Tokens {
            wallet: wallet.clone(),
            token_type: token_type.clone(),
        }
    }

    /// The key of tokens of a wallet and type as an adapter read them back (a
    /// row, a notification); `None` when either is not a valid id: nobody can
    /// wait on it.
    pub fn tokens_of(wallet: &str, token_type: &str) -> Option<Self> {
        Some(WakeKey::Tokens {
            wallet: WalletId::new(wallet).ok()?,
            token_type: TokenType::new(token_type).ok()?,
        })
    }
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    /// A signal of the key arrived (possibly before the wait began).
    Signalled,
    /// The deadline passed first.
    Timer,
}

/// Waiting for, and sending, wake-up signals. One per backend instance; every
/// selector and admission worker of the instance shares it.
#[mockall::automock]
pub trait WakeUps: Send + Sync {
    /// Starts listening for `key`, on behalf of `origin` (a select is not woken by
    /// the release of its own wins). See [`Registry`] for who a signal wakes.
    fn subscribe(&self, key: WakeKey, origin: Option<TxId>) -> Subscription;

    /// Signals `keys` on behalf of `origin`, after the write that freed them has
    /// committed: this instance's waiters at once, other instances' as the
    /// adapter carries it. Adapters call it after their own writes.
    #[allow(
        clippy::needless_lifetimes,
        reason = "mockall needs the lifetime named"
    )]
    fn signal<'a>(&self, keys: &[WakeKey], origin: Option<&'a TxId>);

    /// Whether signals of other instances reach this one now (PostgreSQL: the
    /// `LISTEN` connection is up). While false, waits still end on their timers.
    fn connected(&self) -> bool;
}

/// One subscription's side of the registry.
#[derive(Default)]
struct Waiter {
    notify: Notify,
    /// Woken, and the wake not consumed by a wait yet.
    pending: AtomicBool,
    /// In [`Subscription::wait_until`] now.
    waiting: AtomicBool,
    /// Woken while waiting, and not done looking at what was freed yet
    /// ([`Subscription::looked`]). A waiter woken between its waits is reading
    /// anyway and holds nobody back.
    looking: AtomicBool,
    /// In its current (or last) wait, a signal of the key woke a waiter
    /// subscribed before this one ([`Subscription::passed_over`]).
    passed_over: AtomicBool,
    /// The newest signal whose freed tokens it has seen or will see: the one
    /// its last wake came from, first-hand or handed on, or else the last one
    /// before it subscribed (it reads after subscribing). A wake handed on
    /// never reaches a waiter that already looked at what that signal freed.
    round: AtomicU64,
    /// When it subscribed or its last wait ended, and its current (or last)
    /// wait's deadline.
    times: Mutex<Times>,
}

/// See [`Waiter::times`].
#[derive(Default)]
struct Times {
    since: Option<Instant>,
    deadline: Option<Instant>,
}

impl Waiter {
    fn times(&self) -> MutexGuard<'_, Times> {
        // Nothing panics while holding it; poisoned times are still whole.
        self.times.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Which wake [`Registry::wake_first`] sends.
#[derive(Debug, Clone, Copy)]
enum Wake {
    /// A new signal: what it freed nobody has looked at yet.
    Signal,
    /// The wake of signal `round`, handed on: only to a waiter that has not
    /// looked at what that signal freed.
    HandOn(u64),
}

/// A waiter's registration with a [`Registry`]; dropping it deregisters (and
/// hands a wake it never consumed to the next waiter).
pub struct Subscription {
    waiter: Arc<Waiter>,
    registration: Option<(Registry, WakeKey, u64)>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("key", &self.registration.as_ref().map(|(_, key, _)| key))
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// A subscription no signal reaches: its waits end on their timers (wake-ups
    /// switched off, or a mock).
    pub fn timer_only() -> Self {
        Subscription {
            waiter: Arc::new(Waiter::default()),
            registration: None,
        }
    }

    /// Waits until a wake arrives (or arrived since the subscription or the last
    /// signalled wait) or `deadline` passes, whichever is first. While it waits,
    /// the registry counts it in [`Registry::waiting`].
    pub async fn wait_until(&mut self, deadline: Instant) -> WaitEnd {
        self.waiter.passed_over.store(false, Ordering::SeqCst);
        let since = {
            let mut times = self.waiter.times();
            times.deadline = Some(deadline);
            times.since.unwrap_or_else(Instant::now)
        };
        let _waiting = self.registration.as_ref().map(|(registry, key, _)| {
            let start = WaitStart {
                key: key.clone(),
                deadline,
                since,
            };
            registry.start_waiting(&self.waiter, &start)
        });
        let end = tokio::select! {
            biased;
            () = self.waiter.notify.notified() => {
                // Looking until it says so (or is dropped, which hands the wake
                // on): also a wake that arrived between its waits.
                self.waiter.looking.store(true, Ordering::SeqCst);
                self.waiter.pending.store(false, Ordering::SeqCst);
                WaitEnd::Signalled
            }
            () = tokio::time::sleep_until(deadline) => WaitEnd::Timer,
        };
        // It reads again after its wait.
        self.waiter.times().since = Some(Instant::now());
        end
    }

    /// Whether, during its last wait, a signal of the key woke a waiter that
    /// subscribed before this one: what was freed went to those ahead of it in
    /// line (a waiter that does not keep it hands it on, in order). A wait that
    /// ended on its timer while this holds was passed over, not forgotten.
    pub fn passed_over(&self) -> bool {
        self.waiter.passed_over.load(Ordering::SeqCst)
    }

    /// Notes how full a read of the key came back, for [`Subscription::others`]
    /// of every subscription of the key in this instance. Forgotten with the
    /// key's last subscription.
    pub fn note(&self, read: Fullness) {
        if let Some((registry, key, _)) = &self.registration {
            if let Some(line) = registry.lock().waiters.get_mut(key) {
                line.last_read = Some(read);
            }
        }
    }

    /// What this instance knows of the other callers of the key: how many are
    /// subscribed, how many wait now, and how full the last read of the key came
    /// back ([`Subscription::note`]). Facts only: the domain's
    /// [`holdfast_domain::read_plan()`] decides from them. A timer-only
    /// subscription knows of nobody.
    pub fn others(&self) -> Others {
        let Some((registry, key, id)) = &self.registration else {
            return Others::default();
        };
        let state = registry.lock();
        let Some(line) = state.waiters.get(key) else {
            return Others::default();
        };
        let others = line.entries.iter().filter(|e| e.id != *id);
        Others {
            others: others.clone().count(),
            others_waiting: others
                .filter(|e| e.waiter.waiting.load(Ordering::SeqCst))
                .count(),
            last_read: line.last_read,
        }
    }

    /// Ends a woken waiter's look at what was freed and, if `pass`, hands the
    /// wake on: wakes the longest-subscribed other waiter of the key that has no
    /// wake pending. A woken waiter passes when what it read holds free tokens it
    /// did not keep (too small for it, or more than it needed), so that the next
    /// waiter looks; not when its read found nothing free.
    pub fn looked(&self, pass: bool) {
        if let Some((registry, key, id)) = &self.registration {
            // The next waiter is marked looking before this one stops, so that no
            // newcomer slips in between.
            if pass {
                let round = self.waiter.round.load(Ordering::SeqCst);
                registry.wake_first(key, None, Some(*id), Wake::HandOn(round));
            }
            if self.waiter.looking.swap(false, Ordering::SeqCst) {
                registry.looked.notify_waiters();
            }
        }
    }

    /// Before a read that no wake-up started: while another waiter of the key was
    /// woken and is looking at what was freed, lets it look first, for at most
    /// until `bound`. So a select that just arrived does not take the tokens a
    /// release offered to the one that has waited longest; if that one does not
    /// keep them, it hands them on in order.
    pub async fn defer_to_woken(&self, bound: Instant) {
        let Some((registry, key, id)) = &self.registration else {
            return;
        };
        loop {
            let looked = registry.looked.notified();
            if !registry.others_looking(key, *id) {
                return;
            }
            tokio::select! {
                () = looked => {}
                () = tokio::time::sleep_until(bound) => return,
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some((registry, key, id)) = self.registration.take() {
            registry.remove(&key, id);
            // Woken but gone before it finished looking (a cancelled select): the
            // next waiter looks instead.
            let looking = self.waiter.looking.swap(false, Ordering::SeqCst);
            if looking || self.waiter.pending.load(Ordering::SeqCst) {
                let round = self.waiter.round.load(Ordering::SeqCst);
                registry.wake_first(&key, None, None, Wake::HandOn(round));
            }
            if looking {
                registry.looked.notify_waiters();
            }
        }
    }
}

struct Entry {
    id: u64,
    origin: Option<TxId>,
    waiter: Arc<Waiter>,
}

/// The subscriptions of one key, in subscription order, and what they saw of it.
#[derive(Default)]
struct Line {
    entries: Vec<Entry>,
    /// How full the last read of the key came back ([`Subscription::note`]).
    last_read: Option<Fullness>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// The last signal's round ([`Waiter::round`]).
    last_round: u64,
    /// Kept while the key has subscriptions.
    waiters: HashMap<WakeKey, Line>,
    count: usize,
}

impl State {
    /// The subscriptions of `key`, in subscription order.
    fn entries(&self, key: &WakeKey) -> impl Iterator<Item = &Entry> {
        self.waiters
            .get(key)
            .into_iter()
            .flat_map(|line| &line.entries)
    }
}

/// The in-process wake-up registry: waiters by key, woken by signals of this
/// process at no database cost. Cheap to clone (clones share the registry).
///
/// **One at a time.** A signal of a key wakes one waiter of it: the one
/// subscribed longest (of those not on behalf of the signal's origin) that has
/// no wake pending and is waiting now (else, the one subscribed longest: it is
/// between its read and its wait); a second signal wakes the next. A woken waiter that finds
/// free tokens it does not keep hands the wake on ([`Subscription::looked`]), to
/// a waiter that has not been woken by that signal yet: a signal reaches each
/// waiter once at most, so waiters that all cannot use what it freed do not
/// wake each other in turn until their deadlines. So a
/// release of one token wakes one waiter, not a stampede of reads that all but
/// one lose, and the longest waiting looks first. A wake sent to a waiter that is
/// not waiting yet (it is between its read and its wait) is kept for its next
/// wait, so none is lost.
#[derive(Clone, Default)]
pub struct Registry {
    state: Arc<Mutex<State>>,
    /// Subscriptions in a wait now.
    waiting: Arc<AtomicUsize>,
    /// Notified when a wait begins while none was under way (a poller sleeps
    /// while nobody waits).
    first_waiter: Arc<Notify>,
    /// Notified when a woken waiter is done looking.
    looked: Arc<Notify>,
    /// Told of every wait that begins ([`Registry::on_wait`]).
    on_wait: Arc<OnceLock<WaitHook>>,
}

/// What [`Registry::on_wait`] is told of each wait that begins.
pub type WaitHook = Box<dyn Fn(&WaitStart) + Send + Sync>;

/// A wait that began ([`Registry::on_wait`]), or the waits on one key
/// ([`Registry::waiting_keys`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitStart {
    /// What it waits for.
    pub key: WakeKey,
    /// When it ends on its timer (the latest, for the waits on a key).
    pub deadline: Instant,
    /// When it subscribed or its waiter's previous wait ended, whichever is
    /// later (the earliest, for the waits on a key): it read after this, so a
    /// signal sent since may concern what it read.
    pub since: Instant,
}

/// Marks one wait (and counts it in [`Registry::waiting`]) while it lives.
struct Waiting(Arc<AtomicUsize>, Arc<Waiter>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.1.waiting.store(false, Ordering::SeqCst);
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("waiters", &self.waiters())
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; a poisoned state is still whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a waiter for `key` (see [`WakeUps::subscribe`]).
    pub fn subscribe(&self, key: WakeKey, origin: Option<TxId>) -> Subscription {
        let waiter = Arc::new(Waiter::default());
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        // It reads after subscribing: what earlier signals freed it will see,
        // so their wakes, handed on, are not for it.
        waiter.round.store(state.last_round, Ordering::SeqCst);
        waiter.times().since = Some(Instant::now());
        state
            .waiters
            .entry(key.clone())
            .or_default()
            .entries
            .push(Entry {
                id,
                origin,
                waiter: waiter.clone(),
            });
        state.count += 1;
        drop(state);
        Subscription {
            waiter,
            registration: Some((self.clone(), key, id)),
        }
    }

    fn remove(&self, key: &WakeKey, id: u64) {
        let mut state = self.lock();
        if let Some(line) = state.waiters.get_mut(key) {
            let before = line.entries.len();
            line.entries.retain(|e| e.id != id);
            let removed = before - line.entries.len();
            if line.entries.is_empty() {
                state.waiters.remove(key);
            }
            state.count -= removed;
        }
    }

    /// Wakes the first waiter of `key` (subscription order) that is not on behalf
    /// of `origin`, is not `except`, has no wake pending and, for a wake handed
    /// on, has not been woken by its signal yet. Whether one was woken.
    fn wake_first(
        &self,
        key: &WakeKey,
        origin: Option<&TxId>,
        except: Option<u64>,
        wake: Wake,
    ) -> bool {
        let mut state = self.lock();
        let round = match wake {
            Wake::Signal => {
                state.last_round += 1;
                state.last_round
            }
            Wake::HandOn(round) => round,
        };
        let eligible = || {
            state.entries(key).filter(|e| {
                Some(e.id) != except
                    && (origin.is_none() || e.origin.as_ref() != origin)
                    && !e.waiter.pending.load(Ordering::SeqCst)
                    && e.waiter.round.load(Ordering::SeqCst) < round
            })
        };
        // One that waits now first: one between its waits is reading anyway.
        let next = eligible()
            .find(|e| e.waiter.waiting.load(Ordering::SeqCst))
            .or_else(|| eligible().next());
        match next {
            Some(entry) => {
                // Those waiting behind it are passed over by this wake, if it
                // may still reach them.
                state
                    .entries(key)
                    .skip_while(|e| e.id != entry.id)
                    .skip(1)
                    .filter(|e| {
                        e.waiter.waiting.load(Ordering::SeqCst)
                            && e.waiter.round.load(Ordering::SeqCst) < round
                    })
                    .for_each(|e| e.waiter.passed_over.store(true, Ordering::SeqCst));
                entry.waiter.round.store(round, Ordering::SeqCst);
                entry.waiter.pending.store(true, Ordering::SeqCst);
                if entry.waiter.waiting.load(Ordering::SeqCst) {
                    entry.waiter.looking.store(true, Ordering::SeqCst);
                }
                entry.waiter.notify.notify_one();
                true
            }
            None => false,
        }
    }

    /// Whether a waiter of `key` other than `except` was woken and is not done
    /// looking.
    fn others_looking(&self, key: &WakeKey, except: u64) -> bool {
        self.lock()
            .entries(key)
            .any(|e| e.id != except && e.waiter.looking.load(Ordering::SeqCst))
    }

    /// Wakes one waiter of each of `keys` (see the type's documentation), except
    /// those subscribed on behalf of `origin`. Returns how many were woken.
    pub fn signal(&self, keys: &[WakeKey], origin: Option<&TxId>) -> usize {
        keys.iter()
            .filter(|key| self.wake_first(key, origin, None, Wake::Signal))
            .count()
    }

    /// Wakes one waiter of every key (a change whose keys are unknown: another
    /// process wrote the SQLite file, or PostgreSQL signals may have been missed).
    pub fn signal_all(&self) -> usize {
        let keys: Vec<WakeKey> = self.lock().waiters.keys().cloned().collect();
        self.signal(&keys, None)
    }

    fn start_waiting(&self, waiter: &Arc<Waiter>, start: &WaitStart) -> Waiting {
        waiter.waiting.store(true, Ordering::SeqCst);
        if self.waiting.fetch_add(1, Ordering::SeqCst) == 0 {
            self.first_waiter.notify_waiters();
        }
        if let Some(hook) = self.on_wait.get() {
            hook(start);
        }
        Waiting(self.waiting.clone(), waiter.clone())
    }

    /// Has `hook` told of every wait that begins from now on (PostgreSQL tells
    /// other instances which keys its waiters wait for). One hook per registry:
    /// a second one is refused (`false`).
    pub fn on_wait(&self, hook: WaitHook) -> bool {
        self.on_wait.set(hook).is_ok()
    }

    /// The keys some subscription waits for now, each with the latest deadline
    /// and the earliest `since` of its waits.
    pub fn waiting_keys(&self) -> Vec<WaitStart> {
        let state = self.lock();
        state
            .waiters
            .iter()
            .filter_map(|(key, line)| {
                let times = line
                    .entries
                    .iter()
                    .filter(|e| e.waiter.waiting.load(Ordering::SeqCst))
                    .filter_map(|e| {
                        let times = e.waiter.times();
                        Some((times.deadline?, times.since?))
                    });
                let (deadline, since) =
                    times.reduce(|(d1, s1), (d2, s2)| (d1.max(d2), s1.min(s2)))?;
                Some(WaitStart {
                    key: key.clone(),
                    deadline,
                    since,
                })
            })
            .collect()
    }

    /// Subscriptions registered now (waiting or between waits).
    pub fn waiters(&self) -> usize {
        self.lock().count
    }

    /// Whether any subscription is registered: a write then names the keys it
    /// freed, which costs a read on some backends.
    pub fn has_waiters(&self) -> bool {
        self.waiters() > 0
    }

    /// Subscriptions in [`Subscription::wait_until`] now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Returns once a subscription is waiting (at once if one is).
    pub async fn until_waiting(&self) {
        loop {
            let notified = self.first_waiter.notified();
            if self.waiting() > 0 {
                return;
            }
            notified.await;
        }
    }
}

/// A registry alone is the wake-ups of a single process (an in-memory database, a
/// test): signals reach this process's waiters only.
impl WakeUps for Registry {
    fn subscribe(&self, key: WakeKey, origin: Option<TxId>) -> Subscription {
        Registry::subscribe(self, key, origin)
    }

    fn signal(&self, keys: &[WakeKey], origin: Option<&TxId>) {
        Registry::signal(self, keys, origin);
    }

    fn connected(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn key(wallet: &str) -> WakeKey {
        WakeKey::tokens(
            &WalletId::new(wallet).expect("wallet"),
            &TokenType::new("t").expect("type"),
        )
    }

    fn tx(id: &str) -> TxId {
        TxId::new(id).expect("tx")
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_of_the_key_wakes_a_waiter_and_others_do_not() {
        let registry = Registry::new();
        let mut sub = registry.subscribe(key("a"), None);
        assert_eq!(registry.signal(&[key("b")], None), 0);
        assert_eq!(sub.wait_until(soon()).await, WaitEnd::Timer);
        assert_eq!(registry.signal(&[key("a")], None), 1);
        assert_eq!(sub.wait_until(soon()).await, WaitEnd::Signalled);
        // One signal wakes one wait: the next wait ends on its timer.
        assert_eq!(sub.wait_until(soon()).await, WaitEnd::Timer);
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_between_subscribing_and_waiting_is_not_lost() {
        let registry = Registry::new();
        let mut sub = registry.subscribe(key("a"), None);
        registry.signal(&[key("a")], None);
        let started = Instant::now();
        assert_eq!(sub.wait_until(soon()).await, WaitEnd::Signalled);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_is_not_woken_by_its_own_origin() {
        let registry = Registry::new();
        let mut mine = registry.subscribe(key("a"), Some(tx("t1")));
        let mut other = registry.subscribe(key("a"), Some(tx("t2")));
        assert_eq!(registry.signal(&[key("a")], Some(&tx("t1"))), 1);
        assert_eq!(mine.wait_until(soon()).await, WaitEnd::Timer);
        assert_eq!(other.wait_until(soon()).await, WaitEnd::Signalled);
    }

    #[tokio::test(start_paused = true)]
    async fn one_signal_wakes_the_longest_waiting_and_a_pass_wakes_the_next() {
        let registry = Registry::new();
        let mut first = registry.subscribe(key("a"), None);
        let mut second = registry.subscribe(key("a"), None);
        let mut third = registry.subscribe(key("a"), None);
        assert_eq!(registry.signal(&[key("a")], None), 1);
        assert_eq!(first.wait_until(soon()).await, WaitEnd::Signalled);
        // The first found free tokens it did not keep: the second looks next.
        first.looked(true);
        assert_eq!(second.wait_until(soon()).await, WaitEnd::Signalled);
        assert_eq!(third.wait_until(soon()).await, WaitEnd::Timer);
        // Two signals while nobody consumed one wake two waiters.
        assert_eq!(registry.signal(&[key("a")], None), 1);
        assert_eq!(registry.signal(&[key("a")], None), 1);
        assert_eq!(first.wait_until(soon()).await, WaitEnd::Signalled);
        assert_eq!(second.wait_until(soon()).await, WaitEnd::Signalled);
        assert_eq!(third.wait_until(soon()).await, WaitEnd::Timer);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_is_handed_on_at_most_once_per_waiter_per_signal() {
        let registry = Registry::new();
        let mut first = registry.subscribe(key("a"), None);
        let mut second = registry.subscribe(key("a"), None);
        let mut third = registry.subscribe(key("a"), None);
        registry.signal(&[key("a")], None);
        // Nobody can use what was freed: each hands the wake on.
        for waiter in [&mut first, &mut second, &mut third] {
            assert_eq!(waiter.wait_until(soon()).await, WaitEnd::Signalled);
            waiter.looked(true);
        }
        // Everyone has looked at what this signal freed: the last pass wakes
        // nobody, where it would start the line over and over.
        for waiter in [&mut first, &mut second, &mut third] {
            assert_eq!(waiter.wait_until(soon()).await, WaitEnd::Timer);
        }
        // A new signal starts a new round, from the longest waiting.
        registry.signal(&[key("a")], None);
        assert_eq!(first.wait_until(soon()).await, WaitEnd::Signalled);
        first.looked(true);
        assert_eq!(second.wait_until(soon()).await, WaitEnd::Signalled);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hand_on_that_cannot_reach_a_waiter_does_not_pass_it_over() {
        let registry = Registry::new();
        let mut first = registry.subscribe(key("a"), None);
        let mut second = registry.subscribe(key("a"), None);
        let mut third = registry.subscribe(key("a"), None);
        // Only the third waits when the signal comes: it looks first, and hands
        // on to the first and the second, which were between their waits.
        let third_waits = tokio::spawn(async move {
            let end = third.wait_until(soon()).await;
            (third, end)
        });
        tokio::task::yield_now().await;
        registry.signal(&[key("a")], None);
        let (mut third, end) = third_waits.await.expect("task");
        assert_eq!(end, WaitEnd::Signalled);
        third.looked(true);
        let third_waits = tokio::spawn(async move {
            let end = third.wait_until(soon()).await;
            (third, end)
        });
        tokio::task::yield_now().await;
        assert_eq!(first.wait_until(soon()).await, WaitEnd::Signalled);
        first.looked(true);
        assert_eq!(second.wait_until(soon()).await, WaitEnd::Signalled);
        second.looked(true);
        // The third already looked at what this signal freed: the wakes of the
        // first and second were not its place in line, and it reads on its timer.
        let (third, end) = third_waits.await.expect("task");
        assert_eq!(end, WaitEnd::Timer);
        assert!(!third.passed_over());
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_dropped_after_it_was_woken_between_waits_hands_the_wake_on() {
        let registry = Registry::new();
        let mut first = registry.subscribe(key("a"), None);
        let mut second = registry.subscribe(key("a"), None);
        // Woken while reading; its next wait returns at once, then it is
        // cancelled before it has looked.
        registry.signal(&[key("a")], None);
        assert_eq!(first.wait_until(soon()).await, WaitEnd::Signalled);
        drop(first);
        assert_eq!(second.wait_until(soon()).await, WaitEnd::Signalled);
    }

    #[tokio::test(start_paused = true)]
    async fn a_newcomer_is_not_handed_the_wake_of_a_signal_before_it_subscribed() {
        let registry = Registry::new();
        let mut first = registry.subscribe(key("a"), None);
        registry.signal(&[key("a")], None);
        // Subscribed after the signal: it reads what the signal freed anyway.
        let mut late = registry.subscribe(key("a"), None);
        assert_eq!(first.wait_until(soon()).await, WaitEnd::Signalled);
        first.looked(true);
        assert_eq!(late.wait_until(soon()).await, WaitEnd::Timer);
    }

    #[tokio::test(start_paused = true)]
    async fn a_newcomer_defers_to_a_woken_waiter_until_it_has_looked() {
        let registry = Registry::new();
        let mut woken = registry.subscribe(key("a"), None);
        let newcomer = registry.subscribe(key("a"), None);
        let bound = Instant::now() + Duration::from_millis(5);
        // Nobody looking: no wait at all.
        newcomer.defer_to_woken(bound).await;
        assert_eq!(Instant::now() + Duration::from_millis(5), bound);
        let waiting = tokio::spawn(async move {
            let end = woken.wait_until(soon()).await;
            (woken, end)
        });
        tokio::task::yield_now().await;
        registry.signal(&[key("a")], None);
        let (woken, end) = waiting.await.expect("task");
        assert_eq!(end, WaitEnd::Signalled);
        let deferring = tokio::spawn(async move {
            newcomer.defer_to_woken(soon()).await;
            Instant::now()
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        let looked_at = Instant::now();
        woken.looked(false);
        assert_eq!(deferring.await.expect("task"), looked_at);
        // Bounded: a woken waiter that never finishes looking holds nobody long.
        let mut woken = woken;
        let waiting = tokio::spawn(async move {
            let end = woken.wait_until(soon()).await;
            (woken, end)
        });
        tokio::task::yield_now().await;
        let late = registry.subscribe(key("a"), None);
        registry.signal(&[key("a")], None);
        let bound = Instant::now() + Duration::from_millis(5);
        late.defer_to_woken(bound).await;
        assert_eq!(Instant::now(), bound);
        drop(waiting.await.expect("task"));
        // A wake sent between waits (the waiter is reading anyway) holds nobody.
        let between = registry.subscribe(key("a"), None);
        registry.signal(&[key("a")], None);
        let bound = Instant::now() + Duration::from_millis(5);
        late.defer_to_woken(bound).await;
        assert!(Instant::now() < bound);
        drop(between);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_left_unconsumed_by_a_dropped_waiter_goes_to_the_next() {
        let registry = Registry::new();
        let first = registry.subscribe(key("a"), None);
        let mut second = registry.subscribe(key("a"), None);
        registry.signal(&[key("a")], None);
        drop(first);
        assert_eq!(second.wait_until(soon()).await, WaitEnd::Signalled);
        // Woken while waiting, then dropped before it finished looking.
        let mut third = registry.subscribe(key("a"), None);
        let waiting = tokio::spawn(async move {
            let end = second.wait_until(soon()).await;
            (second, end)
        });
        tokio::task::yield_now().await;
        registry.signal(&[key("a")], None);
        let (second, end) = waiting.await.expect("task");
        assert_eq!(end, WaitEnd::Signalled);
        drop(second);
        assert_eq!(third.wait_until(soon()).await, WaitEnd::Signalled);
    }

    #[tokio::test(start_paused = true)]
    async fn signal_all_wakes_one_waiter_of_every_key() {
        let registry = Registry::new();
        let mut a1 = registry.subscribe(key("a"), None);
        let mut a2 = registry.subscribe(key("a"), None);
        let mut b = registry.subscribe(key("b"), None);
        assert_eq!(registry.signal_all(), 2);
        assert_eq!(a1.wait_until(soon()).await, WaitEnd::Signalled);
        assert_eq!(b.wait_until(soon()).await, WaitEnd::Signalled);
        assert_eq!(a2.wait_until(soon()).await, WaitEnd::Timer);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_is_passed_over_when_a_waiter_ahead_of_it_is_woken() {
        let registry = Registry::new();
        let mut first = registry.subscribe(key("a"), None);
        let mut second = registry.subscribe(key("a"), None);
        let mut other_key = registry.subscribe(key("b"), None);
        let signaller = registry.clone();
        let ends = tokio::join!(
            first.wait_until(soon()),
            second.wait_until(soon()),
            other_key.wait_until(soon()),
            async {
                // Once all three wait: one signal of "a".
                tokio::task::yield_now().await;
                signaller.signal(&[key("a")], None)
            },
        );
        assert_eq!(
            ends,
            (WaitEnd::Signalled, WaitEnd::Timer, WaitEnd::Timer, 1)
        );
        // The first subscribed was woken; the second was passed over; another
        // key's waiter is not in this line.
        assert!(!first.passed_over());
        assert!(second.passed_over());
        assert!(!other_key.passed_over());
        // The next wait starts afresh: nobody was woken meanwhile.
        assert_eq!(second.wait_until(soon()).await, WaitEnd::Timer);
        assert!(!second.passed_over());
    }

    /// The registry's facts, as the domain's read plan judges them.
    fn race_likely(sub: &Subscription) -> bool {
        sub.others().race_likely()
    }

    #[tokio::test(start_paused = true)]
    async fn a_race_is_likely_when_others_wait_or_read_it_thin() {
        use Fullness::Short;
        let registry = Registry::new();
        let me = registry.subscribe(key("a"), None);
        me.note(Short(0));
        assert!(!race_likely(&me), "alone, nobody to race");
        // A read of fewer than two candidates per other caller is thin, whoever
        // of the key's callers read it.
        let mut other = registry.subscribe(key("a"), None);
        other.note(Short(1));
        assert!(race_likely(&me));
        me.note(Short(2));
        assert!(!race_likely(&me));
        // Another caller waiting now.
        let signaller = registry.clone();
        let (end, likely) = tokio::join!(other.wait_until(soon()), async {
            tokio::task::yield_now().await;
            let likely = race_likely(&me);
            signaller.signal(&[key("a")], None);
            likely
        });
        assert_eq!((end, likely), (WaitEnd::Signalled, true));
        // Another key's notes are its own, and a key's notes go with its last
        // subscription.
        let b = registry.subscribe(key("b"), None);
        assert!(!race_likely(&b));
        me.note(Short(0));
        drop((me, other));
        let again = registry.subscribe(key("a"), None);
        let second = registry.subscribe(key("a"), None);
        assert!(!race_likely(&again), "nothing of the old callers is left");
        drop(second);
    }

    #[tokio::test(start_paused = true)]
    async fn the_registry_reports_the_other_callers_of_a_key() {
        let registry = Registry::new();
        let me = registry.subscribe(key("a"), None);
        assert_eq!(me.others(), Others::default(), "alone, nothing read");
        assert_eq!(Subscription::timer_only().others(), Others::default());
        let mut other = registry.subscribe(key("a"), None);
        let _elsewhere = registry.subscribe(key("b"), None);
        other.note(Fullness::Full);
        let expected = Others {
            others: 1,
            others_waiting: 0,
            last_read: Some(Fullness::Full),
        };
        assert_eq!(me.others(), expected);
        let (end, seen) = tokio::join!(other.wait_until(soon()), async {
            tokio::task::yield_now().await;
            let seen = me.others();
            registry.signal(&[key("a")], None);
            seen
        });
        assert_eq!(end, WaitEnd::Signalled);
        assert_eq!(seen.others_waiting, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_a_subscription_deregisters_it() {
        let registry = Registry::new();
        let sub = registry.subscribe(key("a"), None);
        let other = registry.subscribe(key("b"), None);
        assert_eq!(registry.waiters(), 2);
        drop(sub);
        assert_eq!(registry.waiters(), 1);
        assert_eq!(registry.signal(&[key("a")], None), 0);
        drop(other);
        assert!(!registry.has_waiters());
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_only_subscription_ends_on_its_timer() {
        let mut sub = Subscription::timer_only();
        let deadline = Instant::now() + Duration::from_millis(30);
        assert_eq!(sub.wait_until(deadline).await, WaitEnd::Timer);
        assert_eq!(Instant::now(), deadline);
    }

    #[tokio::test(start_paused = true)]
    async fn until_waiting_returns_when_a_wait_begins() {
        let registry = Registry::new();
        let watcher = registry.clone();
        let task = tokio::spawn(async move { watcher.until_waiting().await });
        let mut sub = registry.subscribe(key("a"), None);
        tokio::task::yield_now().await;
        assert!(!task.is_finished(), "a subscription alone is not a wait");
        let waiter = tokio::spawn(async move { sub.wait_until(soon()).await });
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .expect("woken")
            .expect("task");
        assert_eq!(registry.waiting(), 1);
        registry.signal(&[key("a")], None);
        assert_eq!(waiter.await.expect("waiter"), WaitEnd::Signalled);
        assert_eq!(registry.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_hook_hears_each_wait_and_the_keys_waited_for_are_known() {
        let registry = Registry::new();
        let heard = Arc::new(Mutex::new(Vec::new()));
        let into = heard.clone();
        assert!(registry.on_wait(Box::new(move |start| {
            into.lock().expect("heard").push(start.clone());
        })));
        assert!(!registry.on_wait(Box::new(|_| {})), "one hook per registry");
        let subscribed = Instant::now();
        let _idle = registry.subscribe(key("b"), None);
        let mut first = registry.subscribe(key("a"), None);
        let mut second = registry.subscribe(key("a"), None);
        tokio::time::advance(Duration::from_millis(10)).await;
        // The first waits once and is woken: its next wait began after it.
        let near = soon();
        let one = tokio::spawn(async move {
            assert_eq!(first.wait_until(near).await, WaitEnd::Signalled);
            first
        });
        registry.until_waiting().await;
        registry.signal(&[key("a")], None);
        let mut first = one.await.expect("first");
        tokio::time::advance(Duration::from_millis(10)).await;
        let woken_at = Instant::now();
        let (near, far) = (soon(), soon() + Duration::from_secs(5));
        let one = tokio::spawn(async move { first.wait_until(near).await });
        let two = tokio::spawn(async move { second.wait_until(far).await });
        while registry.waiting() < 2 {
            tokio::task::yield_now().await;
        }
        let mut starts = heard.lock().expect("heard").clone();
        starts.sort_by_key(|start| start.deadline);
        let at = |deadline, since| WaitStart {
            key: key("a"),
            deadline,
            since,
        };
        assert_eq!(starts.len(), 3);
        assert_eq!(
            starts[1..],
            [
                at(near, woken_at - Duration::from_millis(10)),
                at(far, subscribed)
            ]
        );
        // A subscription between its waits is no wait: only key "a" is waited for.
        assert_eq!(registry.waiting_keys(), vec![at(far, subscribed)]);
        registry.signal(&[key("a")], None);
        registry.signal(&[key("a")], None);
        assert_eq!(one.await.expect("one"), WaitEnd::Signalled);
        assert_eq!(two.await.expect("two"), WaitEnd::Signalled);
        assert!(registry.waiting_keys().is_empty());
    }
}
