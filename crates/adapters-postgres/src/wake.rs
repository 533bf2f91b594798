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

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use holdfast_domain::{QueueName, TxId};
use holdfast_ports::{Registry, Subscription, WakeKey, WakeUps};
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::PgBackend;
use crate::hosts::TargetSessionAttrs;
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

/// The wake-ups of one instance.
pub(crate) struct Wake {
    pub(crate) registry: Registry,
    /// Keys for the notifier; `None` when cross-instance wake-ups are off.
    outbox: Option<mpsc::UnboundedSender<WakeKey>>,
    listening: Arc<AtomicBool>,
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
    /// `health`: it is the first to see a server restart).
    pub(crate) fn across_instances(pool: PgPool, route: Arc<Route>, health: Arc<Health>) -> Wake {
        let registry = Registry::new();
        let instance = instance_id();
        let listening = Arc::new(AtomicBool::new(false));
        let (outbox, inbox) = mpsc::unbounded_channel();
        let tasks = vec![
            tokio::spawn(notify(pool, instance.clone(), inbox)),
            tokio::spawn(listen(
                route,
                registry.clone(),
                instance,
                listening.clone(),
                health,
            )),
        ];
        Wake {
            registry,
            outbox: Some(outbox),
            listening,
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
                let _ = outbox.send(key.clone());
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

/// The payloads naming `keys`, each `instance` then one key per line, at most
/// [`MAX_PAYLOAD`] bytes each.
fn payloads(instance: &str, keys: &BTreeSet<WakeKey>) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = instance.to_owned();
    for key in keys {
        let line = line(key);
        if current.len() + 1 + line.len() > MAX_PAYLOAD && current.len() > instance.len() {
            out.push(std::mem::replace(&mut current, instance.to_owned()));
        }
        current.push('\n');
        current.push_str(&line);
    }
    if current.len() > instance.len() {
        out.push(current);
    }
    out
}

/// The sender and keys of a payload; `None` for one that is not holdfast's.
fn parse(payload: &str) -> Option<(&str, Vec<WakeKey>)> {
    let mut lines = payload.split('\n');
    let instance = lines.next()?;
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
    Some((instance, keys))
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

async fn notify(pool: PgPool, instance: String, mut inbox: mpsc::UnboundedReceiver<WakeKey>) {
    let mut last_sent: Option<tokio::time::Instant> = None;
    while let Some(first) = inbox.recv().await {
        // The first key after a quiet spell goes at once; keys that follow within
        // COALESCE of a send are gathered for the next one.
        if let Some(last) = last_sent {
            tokio::time::sleep_until(last + COALESCE).await;
        }
        let mut keys = BTreeSet::from([first]);
        while let Ok(key) = inbox.try_recv() {
            keys.insert(key);
        }
        last_sent = Some(tokio::time::Instant::now());
        let payloads = payloads(&instance, &keys);
        let sent = sqlx::query(NOTIFY)
            .bind(CHANNEL)
            .bind(&payloads)
            .execute(&pool)
            .await;
        if let Err(e) = sent {
            // Other instances' waiters end on their timers: latency, not correctness.
            tracing::warn!(error = %e, keys = keys.len(), "NOTIFY failed; other instances wait for their timers");
        }
    }
}

async fn listen(
    route: Arc<Route>,
    registry: Registry,
    instance: String,
    listening: Arc<AtomicBool>,
    health: Arc<Health>,
) {
    let mut pause = FIRST_PAUSE;
    loop {
        let mut options = PgPoolOptions::new().max_connections(1);
        if route.target() != TargetSessionAttrs::Any {
            let checked = route.clone();
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
        let pool =
            options.connect_lazy_with(route.pool_options().application_name("holdfast-listen"));
        let connected = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        match connected.await {
            Ok(mut listener) => {
                listening.store(true, Ordering::Relaxed);
                pause = FIRST_PAUSE;
                // Signals sent before this connection listened are lost: look again.
                registry.signal_all();
                tracing::debug!("listening for wake-ups");
                loop {
                    match listener.try_recv().await {
                        Ok(Some(notification)) => {
                            if let Some((sender, keys)) = parse(notification.payload()) {
                                if sender != instance {
                                    registry.signal(&keys, None);
                                }
                            }
                        }
                        // The connection dropped and was made again: signals were lost,
                        // and the pool's connections may be as broken as this one was.
                        Ok(None) => {
                            health.broken();
                            registry.signal_all();
                        }
                        Err(e) => {
                            health.broken();
                            tracing::warn!(error = %e, "the wake-up listener lost its connection; reconnecting");
                            break;
                        }
                    }
                }
                listening.store(false, Ordering::Relaxed);
            }
            Err(e) => {
                // The server may have moved.
                health.look_again();
                tracing::warn!(error = %e, ?pause, "could not listen for wake-ups; waits use their timers");
            }
        }
        pool.close().await;
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(wallet: &str, token_type: &str) -> WakeKey {
        WakeKey::tokens_of(wallet, token_type).expect("valid ids")
    }

    #[test]
    fn payloads_round_trip_and_stay_under_the_limit() {
        let mut keys = BTreeSet::new();
        keys.insert(WakeKey::Queue(QueueName::new("main").expect("queue")));
        for i in 0..400 {
            keys.insert(tokens(&format!("wallet with spaces {i}"), "coin:α"));
        }
        let sent = payloads("me", &keys);
        assert!(sent.len() > 1, "{} payloads", sent.len());
        let mut back = BTreeSet::new();
        for payload in &sent {
            assert!(payload.len() <= MAX_PAYLOAD, "{}", payload.len());
            let (sender, keys) = parse(payload).expect("parsed");
            assert_eq!(sender, "me");
            back.extend(keys);
        }
        assert_eq!(back, keys);
    }

    #[test]
    fn foreign_payloads_name_no_keys() {
        let (_, keys) = parse("someone\nhello world\nt\tonly-wallet").expect("parsed");
        assert!(keys.is_empty());
    }
}
