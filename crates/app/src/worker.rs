//! Wiring admission into a message consumer (`docs/admission.md`, "Workers"):
//! [`Admission::run`] takes deliveries from a [`DeliverySource`] until it closes,
//! runs the step each message names, and answers the source (ack, hold, retry,
//! dead-letter); admitted builds go to a [`BuildPublisher`].
//!
//! [`StoreDeliveries`] is the reference source, over the queue store itself: it
//! delivers what is sent to it (ingests, outcomes, follow-ups) and, when that runs
//! dry, a process message for every accepted request of its queues and every slot
//! owner whose publication went quiet, so nothing a crashed worker held is lost
//! (the stored state is the message log). A held head
//! comes back after its delay, or as soon as a slot of its queue frees (a queue
//! wake-up). Any number of workers, on any number of replicas, may share it or run
//! their own: every step is safe to repeat.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use holdfast_domain::admission as rules;
use holdfast_domain::{QueueName, Reply, RequestId, RequestState};
use holdfast_ports::{
    BuildPublisher, Clock, Delivery, DeliveryError, DeliverySource, Message, QueueStore,
    Subscription, WakeKey, WakeUps,
};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::admission::{Admission, AdmissionPolicy, reply_label};
use crate::clock::SystemClock;

/// How [`Admission::run`] treats failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOptions {
    /// Failed attempts after which a message is dead-lettered instead of retried
    /// (default 5). Holds never count.
    pub max_attempts: u32,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions { max_attempts: 5 }
    }
}

/// What became of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Handled {
    /// Done (an ingest also sent its process message).
    Acked,
    /// The build was published, then the delivery acked.
    Published,
    /// The gate was closed (or the queue paused): back after the delay.
    Held,
    /// The attempt failed: back later, one more failed attempt.
    Retried,
    /// Routed to the dead-letter path.
    DeadLettered,
}

/// What one [`Admission::run`] did, by outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunReport {
    /// Deliveries per outcome.
    pub handled: BTreeMap<Handled, u64>,
}

impl RunReport {
    /// Adds what another run handled to this one.
    pub fn add(&mut self, other: RunReport) {
        for (handled, n) in other.handled {
            *self.handled.entry(handled).or_default() += n;
        }
    }
}

impl Admission {
    /// Takes deliveries from `source` until it closes, handling each in turn
    /// ([`Admission::handle`]). Run as many of these as you want workers; a source
    /// error ends the run.
    pub async fn run(
        &self,
        source: &dyn DeliverySource,
        publisher: &dyn BuildPublisher,
        options: RunOptions,
    ) -> Result<RunReport, DeliveryError> {
        let mut report = RunReport::default();
        while let Some(delivery) = source.next().await? {
            let handled = self.handle(source, publisher, &delivery, options).await?;
            *report.handled.entry(handled).or_default() += 1;
        }
        Ok(report)
    }

    /// Runs the step `delivery` names and answers `source`:
    ///
    /// - ingest: on ack, sends the request's process message, then acks;
    /// - process: publishes an admitted build with its generation, then acks (a
    ///   failed publish is withdrawn and retried: the request keeps its slot and
    ///   the redelivery publishes the next generation); acks a duplicate of a live
    ///   build; holds a held head for the gate delay;
    /// - outcome and dead letter: ack when done;
    /// - a store error or heavy contention retries, up to `options.max_attempts`
    ///   failed attempts, then dead-letters; so does a non-retryable answer.
    pub async fn handle(
        &self,
        source: &dyn DeliverySource,
        publisher: &dyn BuildPublisher,
        delivery: &Delivery,
        options: RunOptions,
    ) -> Result<Handled, DeliveryError> {
        let step = match &delivery.message {
            Message::Ingest { queue, uri } => match self.ingest(queue, uri).await {
                Ok(ingest) if ingest.reply == Reply::Ack => {
                    source
                        .send(Message::Process(ingest.request.id.clone()))
                        .await?;
                    Ok(ingest.reply)
                }
                Ok(ingest) => Ok(ingest.reply),
                Err(e) => Err(e),
            },
            Message::Process(id) => self.process(id).await,
            Message::Outcome(id, outcome) => self.outcome(id, *outcome).await,
            Message::DeadLetter(id) => self.dead_letter(id).await,
        };
        let reply = match step {
            Ok(reply) => reply,
            Err(e) => return fail(source, delivery, &e.to_string(), options).await,
        };
        tracing::debug!(
            delivery = delivery.id,
            reply = reply_label(&reply),
            "delivery handled"
        );
        match reply {
            Reply::Ack => {
                source.ack(delivery).await?;
                Ok(Handled::Acked)
            }
            Reply::Publish {
                request,
                plan,
                generation,
            } => match publisher.publish(&request, &plan, generation).await {
                Ok(()) => {
                    source.ack(delivery).await?;
                    Ok(Handled::Published)
                }
                Err(e) => {
                    // The redelivery publishes the next generation at once; if the
                    // withdrawal fails too, the publication goes quiet and is
                    // published again after resume_after.
                    if let Err(w) = self.withdraw(&request.id, generation).await {
                        tracing::warn!(request = %request.id, %generation, error = %w, "withdrawing a failed publication failed");
                    }
                    fail(source, delivery, &e.to_string(), options).await
                }
            },
            Reply::Hold { delay, .. } => {
                source.hold(delivery, delay).await?;
                Ok(Handled::Held)
            }
            Reply::Retry(reason) => fail(source, delivery, &format!("{reason:?}"), options).await,
            Reply::DeadLetter(reason) => {
                source.dead_letter(delivery, &format!("{reason:?}")).await?;
                Ok(Handled::DeadLettered)
            }
            Reply::Error(e) => {
                source.dead_letter(delivery, &e.to_string()).await?;
                Ok(Handled::DeadLettered)
            }
        }
    }
}

impl Admission {
    /// Reconciles every queue ([`Admission::reconcile_all`]) once per `period`
    /// until `stop` resolves; returns the passes this replica led. Run it on every
    /// replica: each tick (named by its start, the clock's time rounded down to a
    /// multiple of `period`) has one leader ([`QueueStore::lead_reconcile`]), the
    /// others skip it; replicas with different periods still move forward. A failed pass is
    /// logged and the next tick tries again. This is what expires lost builds in a
    /// queue no head waits on. `period` must be more than zero.
    pub async fn reconcile_periodically(
        &self,
        period: Duration,
        stop: impl std::future::Future<Output = ()>,
    ) -> u64 {
        let period_ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut led = 0;
        let mut tick = tokio::time::interval(period.max(Duration::from_millis(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => return led,
                _ = tick.tick() => {}
            }
            // A tick is named by its start: ticks of any period only move forward.
            let tick = self.now().as_millis() / period_ms * period_ms;
            match self.lead_reconcile(tick).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "periodic reconcile: leadership unknown");
                    continue;
                }
            }
            led += 1;
            match self.reconcile_all().await {
                Ok(passes) => {
                    for (queue, pass) in passes {
                        if let Err(e) = pass {
                            tracing::warn!(%queue, error = %e, "periodic reconcile of a queue failed; the next tick retries");
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "periodic reconcile failed; the next tick retries");
                }
            }
        }
    }
}

/// A failed attempt: retried, or dead-lettered once it used up its attempts (a
/// dead-letter message itself is always retried: it is the way out).
async fn fail(
    source: &dyn DeliverySource,
    delivery: &Delivery,
    reason: &str,
    options: RunOptions,
) -> Result<Handled, DeliveryError> {
    let used_up = delivery.attempts.saturating_add(1) >= options.max_attempts;
    if used_up && !matches!(delivery.message, Message::DeadLetter(_)) {
        source.dead_letter(delivery, reason).await?;
        return Ok(Handled::DeadLettered);
    }
    tracing::debug!(delivery = delivery.id, reason, "delivery retried");
    source.retry(delivery, reason).await?;
    Ok(Handled::Retried)
}

/// The state of a [`StoreDeliveries`].
#[derive(Default)]
struct Inner {
    next_id: u64,
    /// Deliverable now, in order.
    ready: VecDeque<Delivery>,
    /// Held or backing off, with when they are due.
    waiting: BTreeMap<u64, (Delivery, Instant)>,
    /// Handed out and not answered yet.
    out: BTreeMap<u64, Delivery>,
    /// Process deliveries handed out, watching their queue from before the step
    /// read it: a slot freed between the read and a hold is not missed.
    watches: BTreeMap<u64, Subscription>,
    /// Scans under way (a scan may find work: the source is busy meanwhile).
    scanning: usize,
    closed: bool,
}

impl Inner {
    /// Queues a new delivery of `message`, ready now.
    fn enqueue(&mut self, message: Message) {
        self.next_id += 1;
        self.ready.push_back(Delivery {
            id: self.next_id,
            message,
            attempts: 0,
        });
    }

    /// Requests with a process message anywhere in this source.
    fn processing(&self) -> BTreeSet<RequestId> {
        self.ready
            .iter()
            .chain(self.out.values())
            .chain(self.waiting.values().map(|(d, _)| d))
            .filter_map(|d| match &d.message {
                Message::Process(id) => Some(id.clone()),
                _ => None,
            })
            .collect()
    }
}

/// The reference [`DeliverySource`], over the queue store: see the module
/// documentation.
pub struct StoreDeliveries {
    queues: Arc<dyn QueueStore>,
    wake: Option<Arc<dyn WakeUps>>,
    policy: AdmissionPolicy,
    clock: Arc<dyn Clock>,
    scope: Vec<QueueName>,
    poll: Duration,
    state: Arc<Mutex<Inner>>,
    notify: Arc<Notify>,
}

impl std::fmt::Debug for StoreDeliveries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreDeliveries")
            .field("scope", &self.scope)
            .field("poll", &self.poll)
            .finish_non_exhaustive()
    }
}

/// The most requests of a queue one scan reads (the newest).
const SCAN_LIMIT: usize = 200;

impl StoreDeliveries {
    /// A source for the queues `scope` of `queues`, scanning them for accepted
    /// requests every `poll` while nothing else is due.
    pub fn new(queues: Arc<dyn QueueStore>, scope: Vec<QueueName>, poll: Duration) -> Self {
        StoreDeliveries {
            queues,
            wake: None,
            policy: AdmissionPolicy::default(),
            clock: Arc::new(SystemClock),
            scope,
            poll,
            state: Arc::new(Mutex::new(Inner::default())),
            notify: Arc::new(Notify::new()),
        }
    }

    /// Wakes held heads as soon as a slot of their queue frees.
    #[must_use]
    pub fn with_wakeups(mut self, wake: Arc<dyn WakeUps>) -> Self {
        self.wake = Some(wake);
        self
    }

    /// Redelivers quiet owners by `policy`'s `resume_after` per queue (default:
    /// [`AdmissionPolicy::default`]); give it the policy of the [`Admission`] it
    /// feeds.
    #[must_use]
    pub fn with_policy(mut self, policy: AdmissionPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Reads "now" (when a publication went quiet) from `clock` instead of the
    /// system clock; give it the clock of the [`Admission`] it feeds.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Closes the source: every `next` returns `None` from now on (deliveries
    /// handed out may still be answered).
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_waiters();
    }

    /// Whether a delivery is ready or handed out and not answered yet (held and
    /// backing-off ones are not busy: they wait for time or a freed slot).
    pub fn busy(&self) -> bool {
        let state = self.lock();
        !state.ready.is_empty() || !state.out.is_empty() || state.scanning > 0
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves `delivery` to the waiting set until `due`; a held process message
    /// whose queue is watched is due at once when its queue is signalled.
    fn wait(&self, delivery: Delivery, due: Instant, wake_early: bool) {
        let id = delivery.id;
        let watch = {
            let mut state = self.lock();
            state.out.remove(&id);
            let watch = state.watches.remove(&id);
            state.waiting.insert(id, (delivery, due));
            watch
        };
        self.notify.notify_one();
        let Some(mut watch) = watch.filter(|_| wake_early) else {
            return;
        };
        let (state, notify) = (Arc::clone(&self.state), Arc::clone(&self.notify));
        tokio::spawn(async move {
            if watch.wait_until(due).await == holdfast_ports::WaitEnd::Signalled {
                let mut inner = state.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some((_, at)) = inner.waiting.get_mut(&id) {
                    *at = Instant::now();
                }
                drop(inner);
                notify.notify_one();
            }
        });
    }

    /// What the scope has to process: its accepted requests, and the slot owners
    /// whose publication went quiet (no heartbeat within the queue's
    /// `resume_after`: their worker or build died), to be published again. A queue
    /// that cannot be read now is logged and skipped: the next scan, a poll later,
    /// tries again.
    async fn scan(&self) -> Vec<RequestId> {
        let mut found = Vec::new();
        for queue in &self.scope {
            let resume_after = self.policy.for_queue(queue).resume_after;
            let read = async {
                let owners = self
                    .queues
                    .load_queue(queue)
                    .await?
                    .map_or_else(Vec::new, |q| {
                        rules::quiet_owners(&q, resume_after, self.clock.now())
                    });
                let requests = self.queues.list_requests(queue, SCAN_LIMIT).await?;
                Ok::<_, holdfast_ports::QueueStoreError>((owners, requests))
            };
            match read.await {
                Ok((owners, requests)) => {
                    found.extend(owners);
                    found.extend(
                        requests
                            .into_iter()
                            .filter(|r| r.state == RequestState::Accepted)
                            .map(|r| r.id),
                    );
                }
                Err(e) => tracing::warn!(%queue, error = %e, "scanning a queue failed; retrying"),
            }
        }
        found
    }
}

#[async_trait]
impl DeliverySource for StoreDeliveries {
    async fn next(&self) -> Result<Option<Delivery>, DeliveryError> {
        let mut scanned = false;
        loop {
            let notified = self.notify.notified();
            let wait_until = {
                let mut state = self.lock();
                if state.closed {
                    return Ok(None);
                }
                let now = Instant::now();
                let due: Vec<u64> = state
                    .waiting
                    .iter()
                    .filter(|(_, (_, at))| *at <= now)
                    .map(|(id, _)| *id)
                    .collect();
                for id in due {
                    if let Some((d, _)) = state.waiting.remove(&id) {
                        state.ready.push_back(d);
                    }
                }
                if let Some(d) = state.ready.pop_front() {
                    state.out.insert(d.id, d.clone());
                    if let (Some(wake), Message::Process(id)) = (&self.wake, &d.message) {
                        let watch = wake.subscribe(WakeKey::Queue(id.queue().clone()), None);
                        state.watches.insert(d.id, watch);
                    }
                    return Ok(Some(d));
                }
                let earliest = state.waiting.values().map(|(_, at)| *at).min();
                earliest.map_or(now + self.poll, |at| at.min(now + self.poll))
            };
            if !scanned {
                scanned = true;
                self.lock().scanning += 1;
                let due = self.scan().await;
                let mut state = self.lock();
                state.scanning -= 1;
                let mut carried = state.processing();
                for id in due {
                    if carried.insert(id.clone()) {
                        state.enqueue(Message::Process(id));
                    }
                }
                if !state.ready.is_empty() {
                    continue;
                }
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(wait_until) => scanned = false,
            }
        }
    }

    async fn ack(&self, delivery: &Delivery) -> Result<(), DeliveryError> {
        let mut state = self.lock();
        state.out.remove(&delivery.id);
        state.watches.remove(&delivery.id);
        Ok(())
    }

    async fn hold(&self, delivery: &Delivery, delay: Duration) -> Result<(), DeliveryError> {
        self.wait(delivery.clone(), Instant::now() + delay, true);
        Ok(())
    }

    async fn retry(&self, delivery: &Delivery, _reason: &str) -> Result<(), DeliveryError> {
        let mut again = delivery.clone();
        again.attempts = again.attempts.saturating_add(1);
        // 10 ms, 20 ms, 40 ms, ... up to 1 s.
        let backoff =
            Duration::from_millis(10 << again.attempts.min(7)).min(Duration::from_secs(1));
        self.wait(again, Instant::now() + backoff, false);
        Ok(())
    }

    async fn dead_letter(&self, delivery: &Delivery, reason: &str) -> Result<(), DeliveryError> {
        let mut state = self.lock();
        state.out.remove(&delivery.id);
        state.watches.remove(&delivery.id);
        match &delivery.message {
            Message::Process(id) | Message::Outcome(id, _) => {
                tracing::warn!(request = %id, reason, "message dead-lettered");
                state.enqueue(Message::DeadLetter(id.clone()));
            }
            Message::Ingest { queue, uri } => {
                tracing::warn!(%queue, %uri, reason, "ingest dead-lettered: dropped");
            }
            Message::DeadLetter(id) => {
                tracing::error!(request = %id, reason, "dead letter failed for good: dropped");
            }
        }
        drop(state);
        self.notify.notify_one();
        Ok(())
    }

    async fn send(&self, message: Message) -> Result<(), DeliveryError> {
        self.lock().enqueue(message);
        self.notify.notify_one();
        Ok(())
    }
}
