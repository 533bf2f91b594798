//! Wake-ups over PostgreSQL (`docs/wakeups.md`): the in-process [`Registry`] for
//! the waiters of this instance, `NOTIFY` to tell other instances, and one
//! `LISTEN` connection to hear them.
//!
//! - **Never inside a write.** A transaction with a pending `NOTIFY` takes a
//!   database-wide lock at commit, which serialises the commits of heavy writers.
//!   So the writes only return the keys they freed; after the commit the keys go
//!   to a notifier task, which sends them in one short statement of its own
//!   (`pg_notify` over a payload array), at most one per [`COALESCE`]: a key
//!   after a quiet spell at once, keys that follow a send gathered for the next.
//! - **One listener per instance**, on a dedicated connection named
//!   `holdfast-listen`. Payloads name the sending instance, so an instance skips
//!   its own (its waiters were woken in-process already). When the connection
//!   drops it reconnects (pausing from 50 ms, doubling to 5 s) and then wakes
//!   every waiter once: signals sent meanwhile were lost. While it is down, waits
//!   end on their timers. It reconnects to the host the pool's connections go to
//!   (after a failover, the new primary: a standby refuses `LISTEN`) and gets a
//!   session of the kind the URL asks for.
//! - **Only where somebody waits** ([`Interest`]): an instance announces the
//!   keys its waits begin on, and sends a freed key only while another instance
//!   waits for it (or while it may have missed announcements).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use holdfast_domain::{QueueName, TxId};
use holdfast_ports::{Registry, Subscription, WaitStart, WakeKey, WakeUps};
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::PgBackend;
use crate::hosts::TargetSessionAttrs;
use crate::interest::{Interest, MAX_AGE};
use crate::route::Route;
use crate::session::Health;

/// The channel holdfast's instances notify and listen on.
pub const CHANNEL: &str = "holdfast_wake";

/// The notifier sends at most one statement per this long: a key after a quiet
/// spell goes at once, keys arriving within this of a send wait for the next.
pub const COALESCE: Duration = Duration::from_millis(1);

/// The most payload bytes one notification carries (PostgreSQL allows just under 8000).
const MAX_PAYLOAD: usize = 7000;

const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// What the notifier is handed.
#[derive(Debug)]
enum Out {
    /// A key freed here: sent while another instance waits for it.
    Freed(WakeKey),
    /// A key sent whatever the interest: an announcement crossed its release.
    CatchUp(WakeKey),
    /// A key of a failed statement, freed (or caught up) at `freed`: sent
    /// again whatever the interest, until [`MAX_AGE`] after `freed`.
    Resend { key: WakeKey, freed: Instant },
    /// A wait began here: announced.
    Waits(WaitStart),
    /// This listener just connected (its connection's generation): the others
    /// are asked what they wait for.
    Ask(u64),
}

/// What the notifier sent and held back, for tests and operators.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Freed keys sent (catch-ups included), by statements that went out.
    pub(crate) sent: AtomicU64,
    /// Freed keys not sent: no other instance waited for them.
    pub(crate) withheld: AtomicU64,
}

/// The wake-ups of one instance.
pub(crate) struct Wake {
    pub(crate) registry: Registry,
    /// Keys for the notifier; `None` when cross-instance wake-ups are off.
    outbox: Option<mpsc::UnboundedSender<Out>>,
    listening: Arc<AtomicBool>,
    pub(crate) counts: Arc<Counts>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wake")
            .field("notify", &self.outbox.is_some())
            .field("listening", &self.listening.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Drop for Wake {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Wake {
    /// In-process signals only: no `NOTIFY`, no `LISTEN` (wake-ups switched off).
    pub(crate) fn in_process() -> Wake {
        Wake {
            registry: Registry::new(),
            outbox: None,
            listening: Arc::new(AtomicBool::new(false)),
            counts: Arc::default(),
            tasks: Vec::new(),
        }
    }

    /// Stops the notifier and the listener (the instance is closing).
    pub(crate) fn stop(&self) {
        for task in &self.tasks {
            task.abort();
        }
        self.listening.store(false, Ordering::Relaxed);
    }

    /// Signals across instances: spawns the notifier (on `pool`) and the listener
    /// (on its own connection to `route`'s current host, whose loss it reports to
    /// `health`: it is the first to see a server restart). Freed keys go only
    /// where another instance waits if `where_waited`, else everywhere.
    pub(crate) fn across_instances(
        pool: PgPool,
        route: Arc<Route>,
        health: Arc<Health>,
        where_waited: bool,
    ) -> Wake {
        let registry = Registry::new();
        let instance = instance_id();
        let listening = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let interest = Arc::new(Mutex::new(Interest::new(!where_waited)));
        let (outbox, inbox) = mpsc::unbounded_channel();
        let waits = outbox.clone();
        // The notifier ends only with the instance.
        registry.on_wait(Box::new(move |start| {
            let _ = waits.send(Out::Waits(start.clone()));
        }));
        let notifier = Notifier {
            pool,
            instance: instance.clone(),
            interest: interest.clone(),
            counts: counts.clone(),
            retry: outbox.downgrade(),
        };
        let listener = Listener {
            route,
            registry: registry.clone(),
            instance,
            listening: listening.clone(),
            health,
            interest,
            outbox: outbox.clone(),
        };
        let tasks = vec![
            tokio::spawn(notifier.run(inbox)),
            tokio::spawn(listener.run()),
        ];
        Wake {
            registry,
            outbox: Some(outbox),
            listening,
            counts,
            tasks,
        }
    }
}

/// A random id for this instance's payloads.
fn instance_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS per process and varies per instance.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(u64::from(std::process::id()));
    format!("{:016x}", hasher.finish())
}

impl WakeUps for PgBackend {
    fn subscribe(&self, key: WakeKey, origin: Option<TxId>) -> Subscription {
        self.inner.wake.registry.subscribe(key, origin)
    }

    fn signal(&self, keys: &[WakeKey], origin: Option<&TxId>) {
        if keys.is_empty() {
            return;
        }
        let wake = &self.inner.wake;
        wake.registry.signal(keys, origin);
        if let Some(outbox) = &wake.outbox {
            for key in keys {
                // The notifier ends only with the instance.
                let _ = outbox.send(Out::Freed(key.clone()));
            }
        }
    }

    fn connected(&self) -> bool {
        self.inner.wake.listening.load(Ordering::Relaxed)
    }
}

/// One key as a payload line: `t<TAB>wallet<TAB>type` or `q<TAB>queue` (ids hold
/// no control characters).
fn line(key: &WakeKey) -> String {
    match key {
        WakeKey::Tokens { wallet, token_type } => format!("t\t{wallet}\t{token_type}"),
        WakeKey::Queue(queue) => format!("q\t{queue}"),
    }
}

/// An announcement as a payload line: `i<TAB>lasting<TAB>age<TAB>` (both in
/// milliseconds) and the key's line. Instances without announcements read no
/// key from it.
fn interest_line(key: &WakeKey, lasting: Duration, age: Duration) -> String {
    format!(
        "i\t{}\t{}\t{}",
        lasting.as_millis(),
        age.as_millis(),
        line(key)
    )
}

/// The question "what do you wait for?" as a payload line.
const ASK: &str = "?";

/// A line sent only for its sender to hear it back.
const HEARTBEAT: &str = "h";

/// After the sender's id on a payload's first line: it announces its waits.
/// Instances without announcements compare the whole line with their own id.
const ANNOUNCES: &str = "announces";

/// The payloads carrying `lines`, each the sender's line then one line per
/// line, at most [`MAX_PAYLOAD`] bytes each.
fn payloads(instance: &str, lines: &[String]) -> Vec<String> {
    let first = format!("{instance}\t{ANNOUNCES}");
    let mut out = Vec::new();
    let mut current = first.clone();
    for line in lines {
        if current.len() + 1 + line.len() > MAX_PAYLOAD && current.len() > first.len() {
            out.push(std::mem::replace(&mut current, first.clone()));
        }
        current.push('\n');
        current.push_str(line);
    }
    if current.len() > first.len() {
        out.push(current);
    }
    out
}

/// A wait announced by another instance.
#[derive(Debug, PartialEq)]
struct Announced {
    key: WakeKey,
    /// How long to keep it.
    lasting: Duration,
    /// How long before it was sent its waiter may have read.
    age: Duration,
}

/// What a payload says.
#[derive(Debug, Default, PartialEq)]
struct Message<'a> {
    sender: &'a str,
    /// The sender announces nothing (an earlier version).
    legacy: bool,
    /// Keys freed.
    wakes: Vec<WakeKey>,
    /// Waits of the sender.
    interests: Vec<Announced>,
    /// The sender asks what the others wait for.
    ask: bool,
}

/// One key from its line's fields (see [`line`]).
fn key_of<'a>(mut fields: impl Iterator<Item = &'a str>) -> Option<WakeKey> {
    match (fields.next()?, fields.next()?, fields.next(), fields.next()) {
        ("t", wallet, Some(token_type), None) => WakeKey::tokens_of(wallet, token_type),
        ("q", queue, None, None) => Some(WakeKey::Queue(QueueName::new(queue).ok()?)),
        _ => None,
    }
}

/// What a payload says; `None` for one that is not holdfast's. Lines it does not
/// know are skipped.
fn parse(payload: &str) -> Option<Message<'_>> {
    let mut lines = payload.split('\n');
    let first = lines.next()?;
    let (sender, legacy) = match first.split_once('\t') {
        Some((sender, ANNOUNCES)) => (sender, false),
        _ => (first, true),
    };
    let mut message = Message {
        sender,
        legacy,
        ..Message::default()
    };
    for line in lines {
        if line == ASK {
            message.ask = true;
        } else if let Some(rest) = line.strip_prefix("i\t") {
            let mut fields = rest.splitn(3, '\t');
            let ms = |field: Option<&str>| field?.parse::<u64>().ok().map(Duration::from_millis);
            let (lasting, age) = (ms(fields.next()), ms(fields.next()));
            let key = fields.next().and_then(|key| key_of(key.split('\t')));
            if let (Some(lasting), Some(age), Some(key)) = (lasting, age, key) {
                message.interests.push(Announced { key, lasting, age });
            }
        } else if let Some(key) = key_of(line.split('\t')) {
            message.wakes.push(key);
        }
    }
    Some(message)
}

/// Keys as rows return them (`wallet<TAB>type`, see the lock statements).
pub(crate) fn token_keys(rows: &[String]) -> Vec<WakeKey> {
    rows.iter()
        .filter_map(|row| {
            let (wallet, token_type) = row.split_once('\t')?;
            WakeKey::tokens_of(wallet, token_type)
        })
        .collect()
}

const NOTIFY: &str = "SELECT pg_notify($1, p) FROM UNNEST($2::text[]) AS p";

/// The interest, shared by the notifier and the listener.
type Shared = Arc<Mutex<Interest>>;

fn lock(interest: &Shared) -> std::sync::MutexGuard<'_, Interest> {
    // Nothing panics while holding it; a poisoned state is still whole.
    interest.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sends what the instance hands it, in one statement per [`COALESCE`].
struct Notifier {
    pool: PgPool,
    instance: String,
    interest: Shared,
    counts: Arc<Counts>,
    /// Its own inbox, for the waits and questions a failed statement hands back.
    retry: mpsc::WeakUnboundedSender<Out>,
}

impl Notifier {
    async fn run(self, mut inbox: mpsc::UnboundedReceiver<Out>) {
        let mut last_sent: Option<Instant> = None;
        let mut pause = FIRST_PAUSE;
        // The end of the current pause after a failure: statements that fail
        // before it do not lengthen the next one.
        let mut paused_until: Option<Instant> = None;
        // The freed keys of failed statements (not the keys `Interest` holds
        // back), each once with when it was last freed or caught up: they go
        // with the next statement, at the latest at the end of the pause.
        let mut failed: BTreeMap<WakeKey, Instant> = BTreeMap::new();
        loop {
            let first = tokio::select! {
                out = inbox.recv() => match out {
                    Some(out) => Some(out),
                    None => break,
                },
                () = tokio::time::sleep_until(paused_until.unwrap_or_else(Instant::now)),
                    if !failed.is_empty() => None,
            };
            // The first key after a quiet spell goes at once; keys that follow
            // within COALESCE of a send are gathered for the next one.
            if let Some(last) = last_sent {
                tokio::time::sleep_until(last + COALESCE).await;
            }
            let mut outs: Vec<Out> = first.into_iter().collect();
            while let Ok(out) = inbox.try_recv() {
                outs.push(out);
            }
            // Whatever goes next takes the failed statements' keys along.
            outs.extend(
                std::mem::take(&mut failed)
                    .into_iter()
                    .map(|(key, freed)| Out::Resend { key, freed }),
            );
            let mut batch = self.weigh(outs);
            if batch.is_empty() {
                continue;
            }
            last_sent = Some(Instant::now());
            match self.send(&batch).await {
                Ok(()) => {
                    pause = FIRST_PAUSE;
                    paused_until = None;
                }
                Err(e) => {
                    // Until it goes, other instances' waiters wait: latency, not
                    // correctness. The freed keys go with the next statement, at
                    // the latest at the end of the pause; the announcements and
                    // a question are handed back then to be weighed again (while
                    // a question has not gone out, every key is sent).
                    let now = Instant::now();
                    let until = match paused_until {
                        Some(until) if now < until => until,
                        _ => {
                            let until = now + pause;
                            pause = (pause * 2).min(MAX_PAUSE);
                            *paused_until.insert(until)
                        }
                    };
                    let keys: Vec<WakeKey> =
                        batch.waits.iter().map(|(w, _)| w.key.clone()).collect();
                    lock(&self.interest).not_announced(&keys);
                    failed = std::mem::take(&mut batch.wakes);
                    self.again(batch, until);
                    tracing::warn!(error = %e, "NOTIFY failed; its keys, waits and question go again after a pause");
                }
            }
        }
    }

    /// Sends `batch` in one statement on a connection of the pool. The waits'
    /// ages are taken once the connection is at hand, just before it goes.
    async fn send(&self, batch: &Batch) -> Result<(), sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        let now = Instant::now();
        let mut lines: Vec<String> = batch.wakes.keys().map(line).collect();
        lines.extend(batch.waits.iter().map(|(start, lasting)| {
            interest_line(
                &start.key,
                *lasting,
                now.saturating_duration_since(start.since),
            )
        }));
        if !batch.asks.is_empty() {
            lines.push(ASK.to_owned());
        }
        if lines.is_empty() {
            lines.push(HEARTBEAT.to_owned());
        }
        let echoes = lock(&self.interest).echoes();
        sqlx::query(NOTIFY)
            .bind(CHANNEL)
            .bind(payloads(&self.instance, &lines))
            .execute(&mut *conn)
            .await?;
        let wakes = u64::try_from(batch.wakes.len()).unwrap_or(u64::MAX);
        self.counts.sent.fetch_add(wakes, Ordering::Relaxed);
        let mut interest = lock(&self.interest);
        interest.sent(echoes, now);
        // The others may answer from now on: the open window counts from here.
        let answered_from = Instant::now();
        for generation in &batch.asks {
            interest.ask_sent(*generation, answered_from);
        }
        Ok(())
    }

    /// Hands the failed `batch`'s waits and questions back to the notifier at
    /// `until` (it weighs them again: a wait over by then is dropped).
    fn again(&self, batch: Batch, until: Instant) {
        let Some(retry) = self.retry.upgrade() else {
            return;
        };
        let outs: Vec<Out> = batch
            .waits
            .into_iter()
            .map(|(start, _)| Out::Waits(start))
            .chain(batch.asks.into_iter().map(Out::Ask))
            .collect();
        if outs.is_empty() {
            return;
        }
        tokio::spawn(async move {
            tokio::time::sleep_until(until).await;
            for out in outs {
                let _ = retry.send(out);
            }
        });
    }

    /// What to send of `batch`: freed keys another instance waits for, keys to
    /// catch up on, new announcements, the questions, a heartbeat.
    fn weigh(&self, batch: Vec<Out>) -> Batch {
        let now = Instant::now();
        let mut weighed = Batch::default();
        // Distinct keys, as `sent` counts them.
        let mut held = BTreeSet::new();
        let mut interest = lock(&self.interest);
        for out in batch {
            match out {
                Out::Freed(key) => {
                    if interest.freed(&key, now) {
                        weighed.wake(key, now);
                    } else {
                        held.insert(key);
                    }
                }
                Out::CatchUp(key) => weighed.wake(key, now),
                Out::Resend { key, freed } => {
                    if now.saturating_duration_since(freed) <= MAX_AGE {
                        weighed.wake(key, freed);
                    } else {
                        tracing::debug!(?key, "a key whose NOTIFY failed is no longer sent");
                    }
                }
                // A wait already over (handed back after a failure) is not
                // announced.
                Out::Waits(start) if start.deadline <= now => {}
                Out::Waits(start) => {
                    if let Some(lasting) = interest.waits(&start.key, start.deadline, now) {
                        weighed.waits.push((start, lasting));
                    }
                }
                Out::Ask(generation) if interest.current(generation) => {
                    weighed.asks.push(generation);
                }
                // A question of an earlier connection of the listener.
                Out::Ask(_) => {}
            }
        }
        // A key held back that goes anyway (caught up, or sent again) is sent,
        // stamped with this release, and owed no later announcement.
        held.retain(|key| {
            if !weighed.wakes.contains_key(key) {
                return true;
            }
            interest.goes(key);
            weighed.wake(key.clone(), now);
            false
        });
        let withheld = u64::try_from(held.len()).unwrap_or(u64::MAX);
        self.counts.withheld.fetch_add(withheld, Ordering::Relaxed);
        weighed.heartbeat = withheld > 0 && interest.heartbeat(now);
        weighed
    }
}

/// What one statement of the notifier sends.
#[derive(Default)]
struct Batch {
    /// Freed keys, each with when it was freed (the latest, when several).
    wakes: BTreeMap<WakeKey, Instant>,
    /// Waits announced, each for how long.
    waits: Vec<(WaitStart, Duration)>,
    /// The questions, by their connection's generation.
    asks: Vec<u64>,
    /// A line only to be heard back.
    heartbeat: bool,
}

impl Batch {
    /// Adds `key`, freed at `freed`.
    fn wake(&mut self, key: WakeKey, freed: Instant) {
        let at = self.wakes.entry(key).or_insert(freed);
        *at = (*at).max(freed);
    }

    fn is_empty(&self) -> bool {
        self.wakes.is_empty() && self.waits.is_empty() && self.asks.is_empty() && !self.heartbeat
    }
}

/// Hears the other instances on its own connection.
struct Listener {
    route: Arc<Route>,
    registry: Registry,
    instance: String,
    listening: Arc<AtomicBool>,
    health: Arc<Health>,
    interest: Shared,
    outbox: mpsc::UnboundedSender<Out>,
}

impl Listener {
    async fn run(self) {
        let mut pause = FIRST_PAUSE;
        loop {
            let pool = self.pool();
            let connected = async {
                let mut listener = PgListener::connect_with(&pool).await?;
                listener.listen(CHANNEL).await?;
                Ok::<_, sqlx::Error>(listener)
            };
            match connected.await {
                Ok(mut listener) => {
                    self.listening.store(true, Ordering::Relaxed);
                    pause = FIRST_PAUSE;
                    self.caught_up();
                    tracing::debug!("listening for wake-ups");
                    loop {
                        match listener.try_recv().await {
                            Ok(Some(notification)) => self.heard(notification.payload()),
                            // The connection dropped and was made again (sqlx listens
                            // again before it answers so): signals and announcements
                            // were lost, and the pool's connections may be as broken
                            // as this one was.
                            Ok(None) => {
                                self.health.broken();
                                self.caught_up();
                            }
                            Err(e) => {
                                self.health.broken();
                                tracing::warn!(error = %e, "the wake-up listener lost its connection; reconnecting");
                                break;
                            }
                        }
                    }
                    self.listening.store(false, Ordering::Relaxed);
                    lock(&self.interest).disconnected();
                }
                Err(e) => {
                    // The server may have moved.
                    self.health.look_again();
                    tracing::warn!(error = %e, ?pause, "could not listen for wake-ups; waits use their timers");
                }
            }
            pool.close().await;
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    /// A pool of one connection to the route's current host, of the kind the
    /// URL asks for.
    fn pool(&self) -> PgPool {
        let mut options = PgPoolOptions::new().max_connections(1);
        if self.route.target() != TargetSessionAttrs::Any {
            let checked = self.route.clone();
            options = options.after_connect(move |conn, _meta| {
                let route = checked.clone();
                Box::pin(async move {
                    match route.verify(conn).await? {
                        Ok(()) => Ok(()),
                        Err(role) => Err(route.misfit(role)),
                    }
                })
            });
        }
        options.connect_lazy_with(
            self.route
                .pool_options()
                .application_name("holdfast-listen"),
        )
    }

    /// The connection listens (again): signals and announcements sent before
    /// were missed. Every waiter looks again, every freed key is sent for a
    /// while, the others are asked what they wait for, and this instance's
    /// waits are announced.
    fn caught_up(&self) {
        let generation = lock(&self.interest).connected(Instant::now());
        self.registry.signal_all();
        // The notifier ends only with the instance.
        let _ = self.outbox.send(Out::Ask(generation));
        self.announce_waits();
    }

    fn announce_waits(&self) {
        for start in self.registry.waiting_keys() {
            let _ = self.outbox.send(Out::Waits(start));
        }
    }

    /// A notification: this instance's own is heard back; another instance's
    /// wakes this instance's waiters of the keys it freed, says what it waits
    /// for (catching up on keys freed here meanwhile) and may ask what this
    /// one waits for.
    fn heard(&self, payload: &str) {
        let Some(message) = parse(payload) else {
            return;
        };
        let now = Instant::now();
        if message.sender == self.instance {
            lock(&self.interest).echo(now);
            return;
        }
        if message.legacy {
            lock(&self.interest).legacy(now);
        }
        self.registry.signal(&message.wakes, None);
        if !message.interests.is_empty() {
            let mut interest = lock(&self.interest);
            for Announced { key, lasting, age } in message.interests {
                if interest.heard(&key, lasting, age, now) {
                    let _ = self.outbox.send(Out::CatchUp(key));
                }
            }
        }
        if message.ask {
            lock(&self.interest).asked();
            self.announce_waits();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn tokens(wallet: &str, token_type: &str) -> WakeKey {
        WakeKey::tokens_of(wallet, token_type).expect("valid ids")
    }

    /// A notifier whose pool never connects and whose inbox is gone: weighing
    /// needs neither.
    fn notifier(interest: &Shared) -> Notifier {
        let (outbox, _) = mpsc::unbounded_channel();
        Notifier {
            pool: PgPoolOptions::new()
                .connect_lazy("postgres://nobody@127.0.0.1:1/none")
                .expect("a lazy pool"),
            instance: "i".to_owned(),
            interest: interest.clone(),
            counts: Arc::default(),
            retry: outbox.downgrade(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_statements_keys_go_again_until_a_minute_after_their_release() {
        let interest = Arc::new(Mutex::new(Interest::new(false)));
        let notifier = notifier(&interest);
        let (key, freed) = (tokens("w", "t"), Instant::now());
        let again = |freed| Out::Resend {
            key: key.clone(),
            freed,
        };
        assert_eq!(
            notifier.weigh(vec![again(freed)]).wakes.get(&key),
            Some(&freed)
        );
        tokio::time::advance(MAX_AGE).await;
        assert!(notifier.weigh(vec![again(freed)]).wakes.contains_key(&key));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            notifier.weigh(vec![again(freed)]).is_empty(),
            "sent again past MAX_AGE"
        );
        // Caught up since: the window counts from the later signal.
        let batch = notifier.weigh(vec![again(freed), Out::CatchUp(key.clone())]);
        assert_eq!(batch.wakes.get(&key), Some(&Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_held_back_that_goes_anyway_is_not_sent_again_for_an_announcement() {
        let interest = Arc::new(Mutex::new(Interest::new(false)));
        let notifier = notifier(&interest);
        // Listening, asked, and past the time every key is sent.
        {
            let mut interest = lock(&interest);
            let generation = interest.connected(Instant::now());
            interest.ask_sent(generation, Instant::now());
        }
        tokio::time::advance(crate::interest::OPEN).await;
        let key = tokens("w", "t");
        let earlier = Instant::now();
        tokio::time::advance(Duration::from_millis(10)).await;
        // Freed here twice while nobody waits for it: held back, and counted
        // once, as a sent key is...
        assert!(
            notifier
                .weigh(vec![Out::Freed(key.clone()), Out::Freed(key.clone())])
                .is_empty()
        );
        assert_eq!(notifier.counts.withheld.load(Ordering::Relaxed), 1);
        // ... but freed again beside a resend of a failed statement: it goes,
        // stamped with the later release.
        let resend = Out::Resend {
            key: key.clone(),
            freed: earlier,
        };
        let batch = notifier.weigh(vec![Out::Freed(key.clone()), resend]);
        assert_eq!(batch.wakes.get(&key), Some(&Instant::now()));
        assert_eq!(notifier.counts.withheld.load(Ordering::Relaxed), 1);
        // Another instance's announcement of a wait on it is not answered with
        // it again: it went out.
        let heard =
            lock(&interest).heard(&key, Duration::from_secs(1), Duration::ZERO, Instant::now());
        assert!(!heard, "sent once more for an announcement");
        // Likewise beside a catch-up of the same key.
        let other = tokens("w2", "t");
        assert!(notifier.weigh(vec![Out::Freed(other.clone())]).is_empty());
        let batch = notifier.weigh(vec![Out::Freed(other.clone()), Out::CatchUp(other.clone())]);
        assert!(batch.wakes.contains_key(&other));
        let heard = lock(&interest).heard(
            &other,
            Duration::from_secs(1),
            Duration::ZERO,
            Instant::now(),
        );
        assert!(
            !heard,
            "sent once more for an announcement after a catch-up"
        );
    }

    #[test]
    fn payloads_round_trip_and_stay_under_the_limit() {
        let mut keys = BTreeSet::new();
        keys.insert(WakeKey::Queue(QueueName::new("main").expect("queue")));
        for i in 0..400 {
            keys.insert(tokens(&format!("wallet with spaces {i}"), "coin:α"));
        }
        let waits = [
            Announced {
                key: tokens("w", "t"),
                lasting: Duration::from_millis(40),
                age: Duration::from_millis(3),
            },
            Announced {
                key: WakeKey::Queue(QueueName::new("q").expect("queue")),
                lasting: Duration::from_secs(7200),
                age: Duration::ZERO,
            },
        ];
        let mut lines: Vec<String> = keys.iter().map(line).collect();
        lines.extend(
            waits
                .iter()
                .map(|a| interest_line(&a.key, a.lasting, a.age)),
        );
        lines.push(ASK.to_owned());
        lines.push(HEARTBEAT.to_owned());
        let sent = payloads("me", &lines);
        assert!(sent.len() > 1, "{} payloads", sent.len());
        let mut back = BTreeSet::new();
        let mut interests = Vec::new();
        let mut asked = false;
        for payload in &sent {
            assert!(payload.len() <= MAX_PAYLOAD, "{}", payload.len());
            let message = parse(payload).expect("parsed");
            assert_eq!((message.sender, message.legacy), ("me", false));
            back.extend(message.wakes);
            interests.extend(message.interests);
            asked |= message.ask;
        }
        assert_eq!(back, keys);
        assert_eq!(interests, waits);
        assert!(asked);
    }

    #[test]
    fn foreign_payloads_name_no_keys() {
        let message =
            parse("someone\tannounces\nhello world\nt\tonly-wallet\ni\tsoon\t1\tq\tmain\ni\t5\t5")
                .expect("parsed");
        assert_eq!(
            message,
            Message {
                sender: "someone",
                ..Message::default()
            }
        );
    }

    #[test]
    fn a_payload_of_an_earlier_version_is_read_as_one_that_announces_nothing() {
        let message = parse("old\nt\tw\tt\nq\tmain").expect("parsed");
        assert_eq!(
            message,
            Message {
                sender: "old",
                legacy: true,
                wakes: vec![
                    tokens("w", "t"),
                    WakeKey::Queue(QueueName::new("main").expect("queue"))
                ],
                ..Message::default()
            }
        );
    }

    /// What an instance of an earlier version read from a payload: its first
    /// line whole (the sender), and the keys of `t` and `q` lines of three and
    /// two fields.
    fn read_by_an_earlier_version(payload: &str) -> (&str, Vec<WakeKey>) {
        let mut lines = payload.split('\n');
        let sender = lines.next().expect("a first line");
        let keys = lines
            .filter_map(|line| {
                let mut fields = line.split('\t');
                match (fields.next()?, fields.next()?, fields.next()) {
                    ("t", wallet, Some(token_type)) => WakeKey::tokens_of(wallet, token_type),
                    ("q", queue, None) => Some(WakeKey::Queue(QueueName::new(queue).ok()?)),
                    _ => None,
                }
            })
            .collect();
        (sender, keys)
    }

    #[test]
    fn an_earlier_version_reads_only_the_freed_keys_from_another_sender() {
        let freed = tokens("w", "t");
        let lines = [
            line(&freed),
            interest_line(&tokens("x", "t"), Duration::from_millis(9), Duration::ZERO),
            interest_line(
                &WakeKey::Queue(QueueName::new("q").expect("queue")),
                Duration::from_millis(9),
                Duration::ZERO,
            ),
            ASK.to_owned(),
            HEARTBEAT.to_owned(),
        ];
        let sent = payloads("me", &lines);
        let (sender, keys) = read_by_an_earlier_version(&sent[0]);
        assert_ne!(
            sender, "me",
            "an earlier version with this id would skip it as its own"
        );
        assert_eq!(keys, vec![freed]);
    }
}
