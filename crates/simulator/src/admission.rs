//! The `admission` workload: build queues driven through [`Admission`] by
//! concurrent workers while crashes are injected at random points, and every
//! failed step's message is redelivered.
//!
//! - Messages: ingest a revision, process (admit) a request, record its build
//!   outcome, dead-letter it. Workers take them from one shared queue.
//! - Crashes: a [`QueueStore`] decorator fails a compare-and-set (or a request
//!   creation) with the configured chance, half of the time *before* the write and
//!   half *after* it (the write applied, the answer lost): a crash between any two
//!   writes of a step. The step fails, and its message is redelivered.
//! - A message that failed (or was told to retry) 10 times is dead-lettered; holds
//!   (closed gate) are redelivered without counting, as `docs/admission.md` says.
//! - A crash right after a publication was recorded loses that build: its
//!   redelivery finds a live publication and publishes nothing. As
//!   `StoreDeliveries`' scan does, whenever every message is handled the
//!   simulator scans the queues and sends a process message for every accepted
//!   request and every owner whose publication went quiet (no heartbeat within
//!   [`RESUME_AFTER`]: the build is published again with the next generation);
//!   the run ends when a scan finds no owner and no accepted request.
//! - Invariants (`docs/admission.md`) are checked on the stored state after every
//!   acknowledged step for that step's queue (between two reads of the queue at the
//!   same version, so the snapshot is consistent): |owners| <= max_concurrent,
//!   owners are existing requests, and every processing request owns a slot. When
//!   every message is handled, every queue is checked again, adding "terminal
//!   requests own no slot", which holds only between steps: an outcome or a dead
//!   letter writes the terminal state before it releases the slot (no transaction
//!   spans queue and request), so while another worker is inside such a step, or
//!   after a crash between its two writes until the redelivery, a terminal request
//!   owns a slot. At the end no request may be left non-terminal (a wedge), and the
//!   owners left are slots leaked.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use holdfast_domain::admission::invariants::{Violation, stored_violations};
use holdfast_domain::admission::quiet_owners;
use holdfast_domain::{
    BuildOutcome, Queue, QueueName, Reply, Request, RequestId, RequestState, RevisionUri,
};
use holdfast_ports::Clock;
use holdfast_ports::{QueueStore, QueueStoreError};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::mpsc;

use super::SimulateError;
use super::figures::{round3, to_f64};
use super::provision::Provisioner;
use super::runner::{Progress, RunSettings, mix};
use super::workload::AdmissionLoad;
use holdfast::SystemClock;
use holdfast::admission::{Admission, AdmissionPolicy, NoAncestry};
use holdfast::backend::Backend;
use holdfast::crash::{CrashPlan, CrashingQueues, Fate, WriteCall};

/// Delivery attempts (failed steps and retries) before a message is dead-lettered.
pub const MAX_DELIVERIES: u32 = 10;

/// How long a publication may go without a heartbeat before it is published
/// again: the simulated builds end at once (their outcome is the next message),
/// so a publication quiet this long was lost to a crash.
pub const RESUME_AFTER: Duration = Duration::from_millis(100);

/// The figures of the admission workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdmissionFigures {
    /// Always `holdfast` (admission has no naive twin).
    pub strategy: String,
    /// Requests admitted (first publish of each).
    pub admits: u64,
    /// Admitted requests per wall second.
    pub admits_per_second: f64,
    /// Invariant violations seen on the stored state. Must be zero.
    pub invariant_violations: u64,
    /// Slot owners left when every message was handled. Must be zero.
    pub slots_leaked: u64,
    /// Requests left neither terminal nor in flight at the end (a wedge).
    pub wedged_requests: u64,
    /// Crashes injected (before or after a write).
    pub crashes_injected: u64,
    /// Messages redelivered after a failed step or a retry reply, and process
    /// messages sent by the scan for quiet owners and accepted requests.
    pub redeliveries: u64,
    /// Redeliveries after a closed gate (holds).
    pub holds: u64,
    /// Requests dead-lettered.
    pub dead_lettered: u64,
    /// Requests superseded by a newer head.
    pub superseded: u64,
    /// Requests whose build succeeded.
    pub succeeded: u64,
    /// Messages dropped after 100 failed deliveries (ingest or dead letter). Must be zero.
    pub undelivered: u64,
    /// Steps run (every delivery).
    pub steps: u64,
    /// Wall time, in seconds.
    pub wall_seconds: f64,
}

/// Crashes writes at random (see the module docs): `percent` of them before the
/// write, as many after it.
struct RandomCrashes {
    rng: Mutex<StdRng>,
    percent: u8,
}

impl CrashPlan for RandomCrashes {
    fn fate(&self, _write: WriteCall<'_>) -> Fate {
        let roll: u8 = self
            .rng
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .random_range(0..200);
        if roll < self.percent {
            Fate::CrashBefore("simulated crash before the write".to_owned())
        } else if roll < self.percent.saturating_mul(2) {
            Fate::CrashAfter("simulated crash after the write".to_owned())
        } else {
            Fate::Proceed
        }
    }
}

#[derive(Debug, Clone)]
enum Step {
    Ingest(QueueName, RevisionUri),
    Process(RequestId),
    Outcome(RequestId, BuildOutcome),
    DeadLetter(RequestId),
}

#[derive(Debug, Clone)]
struct Message {
    step: Step,
    deliveries: u32,
}

#[derive(Default)]
struct Tally {
    admitted: Mutex<BTreeSet<RequestId>>,
    violations: AtomicU64,
    redeliveries: AtomicU64,
    holds: AtomicU64,
    dead_lettered: AtomicU64,
    undelivered: AtomicU64,
    steps: AtomicU64,
}

struct Bus {
    sender: Mutex<Option<mpsc::UnboundedSender<Message>>>,
    receiver: tokio::sync::Mutex<mpsc::UnboundedReceiver<Message>>,
    outstanding: AtomicUsize,
    /// Signalled when the last outstanding message is handled.
    idle: tokio::sync::Notify,
}

impl Bus {
    fn send(&self, message: Message) {
        let sender = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = sender.as_ref() {
            self.outstanding.fetch_add(1, Ordering::SeqCst);
            if sender.send(message).is_err() {
                self.outstanding.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Marks one message handled (its follow-ups already sent); signals
    /// [`Bus::idle`] when nothing is left.
    fn done(&self) {
        if self.outstanding.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_one();
        }
    }

    /// Whether every message sent was handled.
    fn is_idle(&self) -> bool {
        self.outstanding.load(Ordering::SeqCst) == 0
    }

    /// Closes the bus: the workers stop once the channel is empty.
    fn close(&self) {
        self.sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }

    async fn next(&self) -> Option<Message> {
        self.receiver.lock().await.recv().await
    }
}

/// Runs the admission workload on a fresh database.
pub async fn run(
    load: AdmissionLoad,
    settings: &RunSettings,
    provisioner: &Provisioner,
) -> Result<AdmissionFigures, SimulateError> {
    let db = provisioner
        .create("admission")
        .await
        .map_err(SimulateError::Provision)?;
    let options = settings.config.backend_options();
    let result = async {
        let backend = Backend::open(&db.url, &options)
            .await
            .map_err(SimulateError::Open)?;
        let outcome = drive(load, settings, &backend).await;
        backend.close().await;
        outcome
    }
    .await;
    let removed = provisioner.remove(&db).await;
    let figures = result?;
    removed.map_err(SimulateError::Provision)?;
    Ok(figures)
}

fn redeliver(bus: &Bus, tally: &Tally, message: Message) {
    tally.redeliveries.fetch_add(1, Ordering::Relaxed);
    let deliveries = message.deliveries + 1;
    match message.step {
        Step::Process(id) | Step::Outcome(id, _) if deliveries >= MAX_DELIVERIES => {
            bus.send(Message {
                step: Step::DeadLetter(id),
                deliveries: 0,
            });
        }
        Step::Ingest(..) | Step::DeadLetter(_) if deliveries >= MAX_DELIVERIES * 10 => {
            tally.undelivered.fetch_add(1, Ordering::Relaxed);
            tracing::error!(step = ?message.step, "message dropped after {deliveries} deliveries");
        }
        step => bus.send(Message { step, deliveries }),
    }
}

async fn handle(
    admission: &Admission,
    raw: &dyn QueueStore,
    policy_max: u32,
    bus: &Bus,
    tally: &Tally,
    rng: &mut StdRng,
    message: Message,
) {
    tally.steps.fetch_add(1, Ordering::Relaxed);
    let (result, queue) = match &message.step {
        Step::Ingest(queue, uri) => match admission.ingest(queue, uri).await {
            Ok(ingest) => {
                if ingest.reply == Reply::Ack {
                    bus.send(Message {
                        step: Step::Process(ingest.request.id.clone()),
                        deliveries: 0,
                    });
                }
                (Ok(ingest.reply), queue.clone())
            }
            Err(e) => (Err(e), queue.clone()),
        },
        Step::Process(id) => (admission.process(id).await, id.queue().clone()),
        Step::Outcome(id, outcome) => (admission.outcome(id, *outcome).await, id.queue().clone()),
        Step::DeadLetter(id) => (admission.dead_letter(id).await, id.queue().clone()),
    };
    match result {
        Err(e) => {
            tracing::debug!(error = %e, "admission step failed; redelivering");
            redeliver(bus, tally, message);
        }
        Ok(reply) => {
            match (&message.step, reply) {
                (Step::DeadLetter(_), Reply::Ack) => {
                    tally.dead_lettered.fetch_add(1, Ordering::Relaxed);
                }
                (_, Reply::Ack) => {}
                (_, Reply::Hold { .. }) => {
                    tally.holds.fetch_add(1, Ordering::Relaxed);
                    bus.send(message.clone());
                }
                (_, Reply::Retry(_)) => redeliver(bus, tally, message.clone()),
                (_, Reply::DeadLetter(_) | Reply::Error(_)) => match &message.step {
                    Step::Process(id) | Step::Outcome(id, _) => bus.send(Message {
                        step: Step::DeadLetter(id.clone()),
                        deliveries: 0,
                    }),
                    // A dead letter or ingest that cannot proceed is dropped.
                    _ => {}
                },
                (_, Reply::Publish { request, .. }) => {
                    tally
                        .admitted
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(request.id.clone());
                    let outcome = if rng.random_range(0..10u8) == 0 {
                        BuildOutcome::Failed
                    } else {
                        BuildOutcome::Succeeded
                    };
                    bus.send(Message {
                        step: Step::Outcome(request.id, outcome),
                        deliveries: 0,
                    });
                }
            }
            match check_queue(raw, &queue, policy_max).await {
                Ok(violations) => {
                    tally.violations.fetch_add(violations, Ordering::Relaxed);
                }
                Err(e) => tracing::debug!(error = %e, "invariant check could not read the queue"),
            }
        }
    }
    bus.done();
}

/// Whenever every message is handled, scans `names` as `StoreDeliveries` does and
/// sends a process message for every accepted request and every quiet owner
/// (see the module docs); closes the bus when no owner and no accepted request
/// is left.
async fn resume_lost(
    bus: &Bus,
    tally: &Tally,
    raw: &dyn QueueStore,
    names: &[QueueName],
) -> Result<(), SimulateError> {
    loop {
        if !bus.is_idle() {
            bus.idle.notified().await;
        }
        while bus.is_idle() {
            let mut due = Vec::new();
            let mut owners = 0usize;
            for name in names {
                if let Some(queue) = raw.load_queue(name).await.map_err(SimulateError::Queues)? {
                    owners += queue.owners.len();
                    due.extend(quiet_owners(&queue, RESUME_AFTER, SystemClock.now()));
                }
                let requests = raw
                    .list_requests(name, usize::MAX)
                    .await
                    .map_err(SimulateError::Queues)?;
                due.extend(
                    requests
                        .into_iter()
                        .filter(|r| r.state == RequestState::Accepted)
                        .map(|r| r.id),
                );
            }
            if due.is_empty() && owners == 0 {
                bus.close();
                return Ok(());
            }
            if due.is_empty() {
                // The workload's clock: an owner's publication goes quiet
                // RESUME_AFTER after its last sign of life.
                tokio::time::sleep(RESUME_AFTER / 4).await;
                continue;
            }
            for id in due {
                tally.redeliveries.fetch_add(1, Ordering::Relaxed);
                bus.send(Message {
                    step: Step::Process(id),
                    deliveries: 0,
                });
            }
        }
    }
}

/// Violations of the slot invariants on one queue, read consistently (the queue at
/// the same version before and after its requests); 0 when the queue moved on.
async fn check_queue(
    store: &dyn QueueStore,
    name: &QueueName,
    max_concurrent: u32,
) -> Result<u64, QueueStoreError> {
    let Some(before) = store.load_queue(name).await? else {
        return Ok(0);
    };
    let requests = store.list_requests(name, usize::MAX).await?;
    let Some(after) = store.load_queue(name).await? else {
        return Ok(0);
    };
    if after.version != before.version {
        return Ok(0);
    }
    Ok(violations(&after, &requests, max_concurrent, Moment::Any))
}

/// When the invariants are checked: any moment (another step may be between its
/// writes), or quiescence (every message handled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Moment {
    Any,
    Quiescent,
}

/// Counts (and logs) the stored-state violations of `queue`; a terminal request
/// owning a slot counts only at quiescence (an outcome between its terminal write
/// and its release leaves one).
fn violations(queue: &Queue, requests: &[Request], max_concurrent: u32, moment: Moment) -> u64 {
    let mut found = 0u64;
    for violation in stored_violations(queue, requests, max_concurrent) {
        if moment == Moment::Any && matches!(violation, Violation::TerminalOwner { .. }) {
            continue;
        }
        found += 1;
        tracing::error!(queue = %queue.name, "admission invariant violated: {violation}");
    }
    found
}

async fn drive(
    load: AdmissionLoad,
    settings: &RunSettings,
    backend: &Backend,
) -> Result<AdmissionFigures, SimulateError> {
    let raw = backend.stores().queues;
    let crashing = Arc::new(CrashingQueues::new(
        raw.clone(),
        RandomCrashes {
            rng: Mutex::new(StdRng::seed_from_u64(mix(settings.seed, 7))),
            percent: load.crash_percent,
        },
    ));
    let mut policy = AdmissionPolicy::from_config(&settings.config);
    policy.default.max_concurrent = load.max_concurrent;
    policy.default.resume_after = RESUME_AFTER;
    for queue in policy.queues.values_mut() {
        queue.resume_after = RESUME_AFTER;
    }
    let admission = Arc::new(Admission::new(
        crashing.clone(),
        Arc::new(NoAncestry),
        policy,
    ));

    let (sender, receiver) = mpsc::unbounded_channel();
    let bus = Arc::new(Bus {
        sender: Mutex::new(Some(sender)),
        receiver: tokio::sync::Mutex::new(receiver),
        outstanding: AtomicUsize::new(0),
        idle: tokio::sync::Notify::new(),
    });
    let mut ingests = Vec::new();
    let mut names = Vec::new();
    for q in 0..load.queues {
        let name = QueueName::new(format!("q{q}")).map_err(SimulateError::internal)?;
        for n in 0..load.requests_per_queue {
            let uri = RevisionUri::new(format!("git://sim/q{q}/rev{n}"))
                .map_err(SimulateError::internal)?;
            ingests.push(Step::Ingest(name.clone(), uri));
        }
        names.push(name);
    }
    let mut rng = StdRng::seed_from_u64(mix(settings.seed, 8));
    ingests.shuffle(&mut rng);
    for step in ingests {
        bus.send(Message {
            step,
            deliveries: 0,
        });
    }
    let tally = Arc::new(Tally::default());
    let progress = Progress::new(None, "admission steps", settings.progress);
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..load.workers {
        let (admission, raw, bus, tally, progress) = (
            admission.clone(),
            raw.clone(),
            bus.clone(),
            tally.clone(),
            progress.clone(),
        );
        let mut rng =
            StdRng::seed_from_u64(mix(settings.seed, 100 + u64::try_from(w).unwrap_or(0)));
        workers.spawn(async move {
            while let Some(message) = bus.next().await {
                handle(
                    &admission,
                    raw.as_ref(),
                    load.max_concurrent,
                    &bus,
                    &tally,
                    &mut rng,
                    message,
                )
                .await;
                progress.inc(1);
            }
        });
    }
    let resumed = resume_lost(&bus, &tally, raw.as_ref(), &names).await;
    if resumed.is_err() {
        bus.close();
    }
    while let Some(joined) = workers.join_next().await {
        joined.map_err(|e| SimulateError::Task(e.to_string()))?;
    }
    resumed?;
    let wall = started.elapsed().as_secs_f64();
    progress.finish();

    let mut violations_found = tally.violations.load(Ordering::Relaxed);
    let (mut leaked, mut wedged, mut superseded, mut succeeded) = (0u64, 0u64, 0u64, 0u64);
    for name in &names {
        let queue = raw.load_queue(name).await.map_err(SimulateError::Queues)?;
        let requests = raw
            .list_requests(name, usize::MAX)
            .await
            .map_err(SimulateError::Queues)?;
        if let Some(queue) = &queue {
            violations_found +=
                violations(queue, &requests, load.max_concurrent, Moment::Quiescent);
            leaked += u64::try_from(queue.owners.len()).unwrap_or(u64::MAX);
        }
        for r in &requests {
            match r.state {
                RequestState::Superseded => superseded += 1,
                RequestState::Succeeded => succeeded += 1,
                s if !s.is_terminal() => wedged += 1,
                _ => {}
            }
        }
    }
    let admits = u64::try_from(
        tally
            .admitted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len(),
    )
    .unwrap_or(u64::MAX);
    Ok(AdmissionFigures {
        strategy: "holdfast".to_owned(),
        admits,
        admits_per_second: if wall > 0.0 {
            round3(to_f64(admits) / wall)
        } else {
            0.0
        },
        invariant_violations: violations_found,
        slots_leaked: leaked,
        wedged_requests: wedged,
        crashes_injected: crashing.crashes(),
        redeliveries: tally.redeliveries.load(Ordering::Relaxed),
        holds: tally.holds.load(Ordering::Relaxed),
        dead_lettered: tally.dead_lettered.load(Ordering::Relaxed),
        superseded,
        succeeded,
        undelivered: tally.undelivered.load(Ordering::Relaxed),
        steps: tally.steps.load(Ordering::Relaxed),
        wall_seconds: round3(wall),
    })
}
