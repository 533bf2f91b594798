//! The admission service: executes the domain's build-slot admission decisions
//! ([`holdfast_domain::admission`]) against the [`QueueStore`] (`docs/admission.md`).
//!
//! Every step loops: load (the request first, then its queue), decide, and either
//! load what the decision needs (owner requests, an ancestry answer), attempt its
//! one compare-and-set write and reload (whether it applied or conflicted), or
//! return its [`Reply`]: what the caller does with the message (publish the build
//! with its plan, hold it for a delay, ack, retry, dead-letter). Conflicts are
//! bounded per step ([`AdmissionPolicy::max_conflicts`]); past the bound the step
//! fails with [`AdmitError::Conflicts`] and the caller retries the message later.
//! A store error fails the step with [`AdmitError::Store`]: retry the message,
//! never compensate — every step is safe to redeliver.
//!
//! Ancestry (is the last green revision an ancestor of the request's revision?) is
//! injected as an [`Ancestry`]. [`NoAncestry`], the default of the command and the
//! demo, answers "not an ancestor", so every build is a full build.
//!
//! Every write passes [`failpoint::hit`] right before and right after its store
//! call: with the cargo feature `failpoints`, a crash test can abort the process
//! there (see [`crate::failpoint`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use holdfast_domain::admission::{
    self as rules, DeadLetterReason, LoadedRequests, Pruned, QueueWrite, RequestWrite,
};
use holdfast_domain::{
    AdmissionConfig, AncestryAnswer, AncestryFact, BuildOutcome, Decision, Generation, Heartbeat,
    Need, ProcessInput, ProcessMemo, Queue, QueueName, Reply, Request, RequestId, RevisionUri,
    Timestamp, Write,
};
use holdfast_ports::{
    CasOutcome, Clock, QueueStore, QueueStoreError, Subscription, WaitEnd, WakeKey, WakeUps,
};
use tracing::Instrument;

use crate::clock::SystemClock;
use crate::config::Config;
use crate::error::{ErrorKind, of_fault};
use crate::failpoint;
use crate::metrics as m;

/// Why an ancestry source could not say yes or no.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AncestryError {
    /// One of the revisions is unknown to the source: the build is a full build.
    #[error("revision not found: {0}")]
    NotFound(String),
    /// The source failed: the message is retried and nothing is claimed.
    #[error("ancestry source failed: {0}")]
    Failed(String),
}

impl AncestryError {
    /// What kind of failure this is ([`ErrorKind`]): an unknown revision is not
    /// found, a failed source unavailable (the message is retried).
    pub fn kind(&self) -> ErrorKind {
        match self {
            AncestryError::NotFound(_) => ErrorKind::NotFound,
            AncestryError::Failed(_) => ErrorKind::Unavailable,
        }
    }
}

/// Answers whether one revision is an ancestor of another (for example by asking
/// the version control system).
#[async_trait]
pub trait Ancestry: Send + Sync {
    /// Whether `ancestor` is an ancestor of `of`.
    async fn is_ancestor(
        &self,
        ancestor: &RevisionUri,
        of: &RevisionUri,
    ) -> Result<bool, AncestryError>;
}

/// An ancestry source that knows no history: never an ancestor, so every build is
/// a full build. The default of the command and the demo.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoAncestry;

#[async_trait]
impl Ancestry for NoAncestry {
    async fn is_ancestor(
        &self,
        _ancestor: &RevisionUri,
        _of: &RevisionUri,
    ) -> Result<bool, AncestryError> {
        Ok(false)
    }
}

/// The admission settings of every queue, and the conflict bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionPolicy {
    /// Settings of queues without an override.
    pub default: AdmissionConfig,
    /// Per-queue overrides.
    pub queues: BTreeMap<QueueName, AdmissionConfig>,
    /// Compare-and-set conflicts one step reloads after before failing (default 32).
    pub max_conflicts: u32,
}

impl Default for AdmissionPolicy {
    fn default() -> Self {
        AdmissionPolicy {
            default: AdmissionConfig::default(),
            queues: BTreeMap::new(),
            max_conflicts: 32,
        }
    }
}

impl AdmissionPolicy {
    /// The policy of a validated [`Config`] (queue names that do not parse, which
    /// [`Config::validate`] refuses, are skipped).
    pub fn from_config(config: &Config) -> Self {
        let queues = config
            .admission
            .queues
            .keys()
            .filter_map(|name| QueueName::new(name.as_str()).ok())
            .map(|name| {
                let settings = config.admission_for(&name);
                (name, settings)
            })
            .collect();
        AdmissionPolicy {
            default: config.admission_default(),
            queues,
            max_conflicts: config.admission.max_conflicts,
        }
    }

    /// How often a long-running worker reconciles every queue
    /// ([`Admission::reconcile_periodically`]): a tenth of the default slot
    /// lease, between 100 ms and 60 s.
    pub fn reconcile_period(&self) -> Duration {
        (self.default.slot_lease / 10).clamp(Duration::from_millis(100), Duration::from_secs(60))
    }

    /// The settings of `queue`.
    pub fn for_queue(&self, queue: &QueueName) -> AdmissionConfig {
        self.queues.get(queue).copied().unwrap_or(self.default)
    }
}

/// Why an admission step failed. Retrying the message is always safe.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// The queue store failed; the outcome of the last write is unknown.
    #[error("admission {step} of {subject}: queue store: {source}")]
    Store {
        /// The step.
        step: &'static str,
        /// The request or queue.
        subject: String,
        /// The store error.
        source: QueueStoreError,
    },
    /// More compare-and-set conflicts than the bound: heavy contention on the queue.
    #[error(
        "admission {step} of {subject}: {conflicts} compare-and-set conflicts; expected at most {max} (retry later)"
    )]
    Conflicts {
        /// The step.
        step: &'static str,
        /// The request or queue.
        subject: String,
        /// Conflicts met.
        conflicts: u32,
        /// The bound.
        max: u32,
    },
    /// The step kept writing or asking without reaching a reply (a guard against a
    /// rule bug; it never happens with consistent rules).
    #[error(
        "admission {step} of {subject}: no reply after {rounds} rounds; expected at most {max}"
    )]
    Runaway {
        /// The step.
        step: &'static str,
        /// The request or queue.
        subject: String,
        /// Decisions taken.
        rounds: u32,
        /// The bound.
        max: u32,
    },
    /// The handle is shutting down and takes no new work; retry the message on
    /// another replica. Never returned by [`Admission`] itself.
    #[error("shutting down: this handle takes no new admission steps; retry on another replica")]
    ShuttingDown,
}

impl AdmitError {
    /// What kind of failure this is ([`ErrorKind`]): a store error its fault's
    /// kind; more conflicts than the bound busy (contention: retry later); a
    /// runaway step a backend error (a rule bug).
    pub fn kind(&self) -> ErrorKind {
        match self {
            AdmitError::Store { source, .. } => of_fault(source.fault_kind(), ErrorKind::Backend),
            AdmitError::Conflicts { .. } => ErrorKind::Busy,
            AdmitError::Runaway { .. } => ErrorKind::Backend,
            AdmitError::ShuttingDown => ErrorKind::ShuttingDown,
        }
    }
}

/// The result of ingesting a revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ingest {
    /// The request (new, or the existing one for this queue and uri).
    pub request: Request,
    /// Whether this call created it.
    pub created: bool,
    /// What to do next: after [`Reply::Ack`], publish the process message of the
    /// request.
    pub reply: Reply,
}

/// Decisions a step takes without any conflict, with room to spare: the longest
/// path (prune, claim, mark after loading owners and asking ancestry) takes about
/// ten.
const ROUNDS_WITHOUT_CONFLICTS: u32 = 32;

/// Decisions one conflict can cost: the conflicting write, then after the reload
/// at most new owners to load and a new last green to ask about.
const ROUNDS_PER_CONFLICT: u32 = 3;

/// Decisions beyond which a step is a runaway, derived from the conflict bound so
/// that a contended step fails with [`AdmitError::Conflicts`] (what the user can
/// act on) and never with [`AdmitError::Runaway`] first, whatever `max_conflicts`
/// the configuration allows. Saturates at `u32::MAX`.
fn max_rounds(max_conflicts: u32) -> u32 {
    max_conflicts
        .checked_add(1)
        .and_then(|n| n.checked_mul(ROUNDS_PER_CONFLICT))
        .and_then(|n| n.checked_add(ROUNDS_WITHOUT_CONFLICTS))
        .unwrap_or(u32::MAX)
}

/// What a step loads at the start of each round.
enum Load<'a> {
    /// The request, then its queue.
    Request(&'a RequestId),
    /// A queue alone.
    Queue(&'a QueueName),
    /// A queue, then every one of its requests.
    QueueAndRequests(&'a QueueName),
}

/// Everything a step has loaded so far.
#[derive(Default)]
struct Loaded {
    request: Option<Request>,
    queue: Option<Queue>,
    owners: LoadedRequests,
    ancestry: Option<AncestryFact>,
    memo: ProcessMemo,
    /// The queue's requests, for [`Load::QueueAndRequests`].
    requests: Vec<Request>,
    /// The owners added by applied backfill writes, in order.
    backfilled: Vec<RequestId>,
    /// The owners removed by applied prune writes, in order, with why.
    pruned: Vec<Pruned>,
}

/// The result of a backfill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backfill {
    /// The processing requests this call added to the slot owners (empty when
    /// every one was an owner already).
    pub added: Vec<RequestId>,
    /// The step's reply: [`Reply::Ack`], or [`Reply::DeadLetter`] for a missing
    /// queue.
    pub reply: Reply,
}

/// The result of a reconcile pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconciled {
    /// The owners this pass removed, and why (an owner whose lease ran out was
    /// failed with `slot_lease_expired` first, and shows as failed with that reason).
    pub pruned: Vec<Pruned>,
    /// The step's reply: [`Reply::Ack`].
    pub reply: Reply,
}

/// Why a stored slot limit was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetLimitError {
    /// The limit is beyond what every store keeps.
    #[error("invalid slot limit {max}: expected 0 (pause) to {MAX_SLOT_LIMIT}")]
    TooLarge {
        /// The refused limit.
        max: u32,
    },
    /// No such queue: a queue exists from its first ingested request on.
    #[error("no queue {0}: a queue exists from its first ingested request on")]
    QueueMissing(QueueName),
    /// The step failed; retrying is safe.
    #[error(transparent)]
    Admit(#[from] AdmitError),
}

impl SetLimitError {
    /// What kind of failure this is ([`ErrorKind`]): a limit out of range is
    /// invalid input, a missing queue not found, a failed step its own kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            SetLimitError::TooLarge { .. } => ErrorKind::InvalidInput,
            SetLimitError::QueueMissing(_) => ErrorKind::NotFound,
            SetLimitError::Admit(e) => e.kind(),
        }
    }
}

/// The largest stored slot limit (PostgreSQL keeps it as a 32-bit integer).
pub const MAX_SLOT_LIMIT: u32 = 1_000_000;

/// Build-slot admission over a queue store.
pub struct Admission {
    queues: Arc<dyn QueueStore>,
    ancestry: Arc<dyn Ancestry>,
    policy: AdmissionPolicy,
    wake: Option<Arc<dyn WakeUps>>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Admission {
    /// Admission over `queues` with `ancestry` and `policy`.
    pub fn new(
        queues: Arc<dyn QueueStore>,
        ancestry: Arc<dyn Ancestry>,
        policy: AdmissionPolicy,
    ) -> Self {
        Admission {
            queues,
            ancestry,
            policy,
            wake: None,
            clock: Arc::new(SystemClock),
        }
    }

    /// Reads "now" (slot claims, heartbeats and lease expiry) from `clock` instead
    /// of the system clock.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Lets a held head be woken when a slot of its queue frees
    /// ([`Admission::watch`], [`Admission::hold`]); without it a hold waits its
    /// whole delay.
    #[must_use]
    pub fn with_wakeups(mut self, wake: Arc<dyn WakeUps>) -> Self {
        self.wake = Some(wake);
        self
    }

    /// Starts watching `queue` for freed slots. Take it *before*
    /// [`Admission::process`], so that a slot freed between the process step and
    /// the hold is not missed.
    pub fn watch(&self, queue: &QueueName) -> Subscription {
        match &self.wake {
            Some(wake) => wake.subscribe(WakeKey::Queue(queue.clone()), None),
            None => Subscription::timer_only(),
        }
    }

    /// Holds a head that [`Reply::Hold`] answered for: waits until a slot of the
    /// queue `watch` watches may have been freed, or `delay` (the hold's delay)
    /// passes, whichever is first; then process the request again. A worker that
    /// takes deliveries from a message queue keeps the message's delay instead.
    pub async fn hold(&self, watch: &mut Subscription, delay: std::time::Duration) -> WaitEnd {
        let end = watch.wait_until(tokio::time::Instant::now() + delay).await;
        let ended = match end {
            WaitEnd::Signalled => "wakeup",
            WaitEnd::Timer => "timer",
        };
        metrics::counter!(m::WAITS, "waiter" => "admission", "ended" => ended).increment(1);
        end
    }

    /// The policy in use.
    pub fn policy(&self) -> &AdmissionPolicy {
        &self.policy
    }

    /// Ingests `uri` into `queue` (creating the queue if needed; deduplicated on
    /// queue and uri) and stamps it as the queue's latest head if it is newer.
    pub async fn ingest(&self, queue: &QueueName, uri: &RevisionUri) -> Result<Ingest, AdmitError> {
        let span =
            tracing::info_span!("admission_ingest", %queue, %uri, request = tracing::field::Empty);
        async {
            failpoint::hit("ingest", "create_request", failpoint::When::Before);
            let ingested = self.queues.create_request(queue, uri).await;
            failpoint::hit("ingest", "create_request", failpoint::When::After);
            let ingested = ingested.map_err(store_error("ingest", queue))?;
            tracing::Span::current()
                .record("request", tracing::field::display(&ingested.request.id));
            let id = ingested.request.id.clone();
            let config = self.policy.for_queue(queue);
            let reply = self
                .drive("ingest", Load::Request(&id), |l| match &l.request {
                    Some(request) => rules::decide_ingest(&config, request, l.queue.as_ref()),
                    None => Decision::Reply(Reply::DeadLetter(DeadLetterReason::RequestMissing(
                        id.clone(),
                    ))),
                })
                .await?;
            Ok(Ingest {
                request: ingested.request,
                created: ingested.created,
                reply,
            })
        }
        .instrument(span)
        .await
    }

    /// Processes (admits) a request: supersede, resume, gate, claim, mark
    /// processing; [`Reply::Publish`] when the build is to be published.
    pub async fn process(&self, id: &RequestId) -> Result<Reply, AdmitError> {
        let span = tracing::info_span!("admission_process", request = %id);
        let config = self.policy.for_queue(id.queue());
        let now = self.clock.now();
        let mut loaded = Loaded::default();
        let reply = self
            .drive_with("process", Load::Request(id), &mut loaded, |l| {
                rules::decide_process(
                    &config,
                    &ProcessInput {
                        id,
                        request: l.request.as_ref(),
                        queue: l.queue.as_ref(),
                        owners: &l.owners,
                        ancestry: l.ancestry.as_ref(),
                        memo: &l.memo,
                        now,
                    },
                )
            })
            .instrument(span)
            .await?;
        if let Some(queue) = &loaded.queue {
            metrics::gauge!(m::ADMISSION_SLOT_CAPACITY, "queue" => queue.name.to_string())
                .set(f64::from(queue.limit(config.max_concurrent)));
        }
        match &reply {
            Reply::Hold { paused, .. } => {
                // A request that owns its slot waits for its build's first
                // heartbeat, not for the gate.
                let owned = loaded
                    .queue
                    .as_ref()
                    .is_some_and(|q| q.owners.contains_key(id));
                let why = match (paused, owned) {
                    (true, _) => "paused",
                    (false, true) => "unconfirmed",
                    (false, false) => "full",
                };
                metrics::counter!(m::ADMISSION_HELD, "queue" => id.queue().to_string(), "why" => why)
                    .increment(1);
            }
            // The first publication: how long the request waited since its ingest.
            Reply::Publish {
                request,
                generation,
                ..
            } if *generation == Generation(1) => {
                metrics::histogram!(m::ADMISSION_WAIT, "queue" => id.queue().to_string())
                    .record(now.since(request.ingested_at).as_secs_f64());
            }
            // A publication gone quiet (its worker or build died), published again.
            Reply::Publish { .. } => {
                metrics::counter!(m::ADMISSION_REPUBLISHED, "queue" => id.queue().to_string())
                    .increment(1);
            }
            _ => {}
        }
        Ok(reply)
    }

    /// Extends the slot lease of generation `generation` of `id`'s build
    /// ([`Heartbeat::Extended`]), or says that it owns no slot (any more), that
    /// its lease ran out, or that a newer generation was published
    /// ([`Heartbeat::Stale`]): then the build should stop. A running build calls
    /// this well within the queue's `resume_after` (a third of it is plenty), or
    /// its build is presumed lost and published again.
    pub async fn heartbeat(
        &self,
        id: &RequestId,
        generation: Generation,
    ) -> Result<Heartbeat, AdmitError> {
        let span = tracing::info_span!("admission_heartbeat", request = %id, %generation);
        let lease = self.policy.for_queue(id.queue()).slot_lease;
        let now = self.clock.now();
        let mut loaded = Loaded::default();
        self.drive_with("heartbeat", Load::Request(id), &mut loaded, |l| {
            rules::decide_heartbeat(l.request.as_ref(), l.queue.as_ref(), generation, lease, now)
        })
        .instrument(span)
        .await?;
        let answer = rules::heartbeat_answer(
            loaded.request.as_ref(),
            loaded.queue.as_ref(),
            generation,
            lease,
            now,
        );
        if let Heartbeat::Stale { .. } = answer {
            metrics::counter!(m::ADMISSION_STALE_HEARTBEATS, "queue" => id.queue().to_string())
                .increment(1);
        }
        Ok(answer)
    }

    /// Withdraws the publication of `generation` of `id`'s build after its publish
    /// failed, so that the next delivery publishes the next generation at once
    /// instead of after `resume_after`. [`Admission::handle`] does this before it
    /// retries a delivery whose publish failed.
    pub async fn withdraw(&self, id: &RequestId, generation: Generation) -> Result<(), AdmitError> {
        let span = tracing::info_span!("admission_withdraw", request = %id, %generation);
        self.drive("withdraw", Load::Request(id), |l| {
            rules::decide_withdraw(l.request.as_ref(), l.queue.as_ref(), generation)
        })
        .instrument(span)
        .await
        .map(drop)
    }

    /// Sets the stored slot limit of `queue` for every replica: 0 pauses it (every
    /// head holds, owners keep their slots), a higher limit admits held heads on
    /// their next delivery (a held head watching the queue is woken at once).
    pub async fn set_limit(&self, queue: &QueueName, max: u32) -> Result<(), SetLimitError> {
        if max > MAX_SLOT_LIMIT {
            return Err(SetLimitError::TooLarge { max });
        }
        let span = tracing::info_span!("admission_set_limit", %queue, max);
        let reply = self
            .drive("set_limit", Load::Queue(queue), |l| {
                rules::decide_set_limit(queue, l.queue.as_ref(), max)
            })
            .instrument(span)
            .await?;
        match reply {
            Reply::DeadLetter(_) => Err(SetLimitError::QueueMissing(queue.clone())),
            _ => Ok(()),
        }
    }

    /// Records a build outcome: releases the request's slot, then writes its
    /// terminal state.
    pub async fn outcome(
        &self,
        id: &RequestId,
        outcome: BuildOutcome,
    ) -> Result<Reply, AdmitError> {
        let span = tracing::info_span!("admission_outcome", request = %id, outcome = ?outcome);
        self.drive("outcome", Load::Request(id), |l| {
            rules::decide_outcome(l.request.as_ref(), l.queue.as_ref(), outcome)
        })
        .instrument(span)
        .await
    }

    /// Dead-letters a request: marks it failed (unless it is terminal already),
    /// then releases its slot.
    pub async fn dead_letter(&self, id: &RequestId) -> Result<Reply, AdmitError> {
        let span = tracing::info_span!("admission_dead_letter", request = %id);
        self.drive("dead_letter", Load::Request(id), |l| {
            rules::decide_dead_letter(l.request.as_ref(), l.queue.as_ref())
        })
        .instrument(span)
        .await
    }

    /// Fails slot owners whose lease ran out (`slot_lease_expired`) and prunes
    /// owners whose request is terminal or missing, or of another queue. A missing
    /// queue has nothing to reconcile.
    pub async fn reconcile(&self, queue: &QueueName) -> Result<Reconciled, AdmitError> {
        let span = tracing::info_span!("admission_reconcile", %queue);
        let lease = self.policy.for_queue(queue).slot_lease;
        let now = self.clock.now();
        let mut loaded = Loaded::default();
        let reply = self
            .drive_with("reconcile", Load::Queue(queue), &mut loaded, |l| {
                match &l.queue {
                    Some(q) => rules::decide_reconcile(q, &l.owners, lease, now),
                    None => Decision::Reply(Reply::Ack),
                }
            })
            .instrument(span)
            .await?;
        Ok(Reconciled {
            pruned: loaded.pruned,
            reply,
        })
    }

    /// The time now, by this admission's clock.
    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Whether this replica leads periodic reconcile tick `tick`.
    pub(crate) async fn lead_reconcile(&self, tick: u64) -> Result<bool, AdmitError> {
        self.queues
            .lead_reconcile(tick)
            .await
            .map_err(store_error("reconcile", format_args!("tick {tick}")))
    }

    /// Reconciles every queue of the store, in name order: what a periodic
    /// reconcile runs. A queue whose pass fails does not stop the others: its
    /// error is in its entry. Listing the queues failing is the one error.
    #[allow(
        clippy::type_complexity,
        reason = "one entry per queue: its name and its pass"
    )]
    pub async fn reconcile_all(
        &self,
    ) -> Result<Vec<(QueueName, Result<Reconciled, AdmitError>)>, AdmitError> {
        let queues = self
            .queues
            .list_queues()
            .await
            .map_err(store_error("reconcile", "every queue"))?;
        let mut out = Vec::new();
        for queue in queues {
            let done = self.reconcile(&queue).await;
            out.push((queue, done));
        }
        Ok(out)
    }

    /// Retention: deletes the terminal requests of `queue` last written at least
    /// `older_than` ago, never the head, the last green (nor the newest succeeded
    /// request) or a slot owner; returns how many were deleted. A deleted request's
    /// revision can be ingested again as a new request.
    pub async fn prune(&self, queue: &QueueName, older_than: Duration) -> Result<u64, AdmitError> {
        self.queues
            .prune_requests(queue, older_than)
            .await
            .map_err(store_error("prune", queue))
    }

    /// Migrates `queue` from an anonymous in-flight count to owner ids: every
    /// processing request of the queue joins the slot owners (`docs/admission.md`). Loads the
    /// queue and all of its requests in every round (a migration runs once, with
    /// the old binaries stopped). A missing queue is [`Reply::DeadLetter`].
    /// Running it again adds nothing.
    pub async fn backfill(&self, queue: &QueueName) -> Result<Backfill, AdmitError> {
        let span = tracing::info_span!("admission_backfill", %queue);
        let now = self.clock.now();
        let mut loaded = Loaded::default();
        let reply = self
            .drive_with(
                "backfill",
                Load::QueueAndRequests(queue),
                &mut loaded,
                |l| match &l.queue {
                    Some(q) => rules::decide_backfill(q, &l.requests, now),
                    None => Decision::Reply(Reply::DeadLetter(DeadLetterReason::QueueMissing(
                        queue.clone(),
                    ))),
                },
            )
            .instrument(span)
            .await?;
        Ok(Backfill {
            added: loaded.backfilled,
            reply,
        })
    }

    /// The load -> decide -> write loop shared by every step.
    async fn drive(
        &self,
        step: &'static str,
        load: Load<'_>,
        decide: impl Fn(&Loaded) -> Decision,
    ) -> Result<Reply, AdmitError> {
        self.drive_with(step, load, &mut Loaded::default(), decide)
            .await
    }

    /// [`Admission::drive`] on a caller's `loaded`, to read what the step recorded.
    async fn drive_with(
        &self,
        step: &'static str,
        load: Load<'_>,
        loaded: &mut Loaded,
        decide: impl Fn(&Loaded) -> Decision,
    ) -> Result<Reply, AdmitError> {
        let subject = match &load {
            Load::Request(id) => id.to_string(),
            Load::Queue(name) | Load::QueueAndRequests(name) => name.to_string(),
        };
        let result = self.rounds(step, &subject, &load, loaded, decide).await;
        match &result {
            Ok(reply) => {
                metrics::counter!(m::ADMISSION_REPLIES, "step" => step, "reply" => reply_label(reply))
                    .increment(1);
                tracing::debug!(reply = reply_label(reply), "admission step answered");
            }
            Err(e) => {
                let kind = match e {
                    // A shutting-down handle refuses before any step runs.
                    AdmitError::Store { .. } | AdmitError::ShuttingDown => "store",
                    AdmitError::Conflicts { .. } | AdmitError::Runaway { .. } => "conflicts",
                };
                metrics::counter!(m::ADMISSION_ERRORS, "step" => step, "kind" => kind).increment(1);
                tracing::warn!(error = %e, "admission step failed");
            }
        }
        result
    }

    async fn rounds(
        &self,
        step: &'static str,
        subject: &str,
        load: &Load<'_>,
        loaded: &mut Loaded,
        decide: impl Fn(&Loaded) -> Decision,
    ) -> Result<Reply, AdmitError> {
        let store = |source| store_error(step, subject)(source);
        let mut conflicts = 0u32;
        let mut rounds = 0u32;
        let base = max_rounds(self.policy.max_conflicts);
        let mut max = base;
        loop {
            match load {
                Load::Request(id) => {
                    loaded.request = self.queues.load_request(id).await.map_err(store)?;
                    loaded.queue = self.queues.load_queue(id.queue()).await.map_err(store)?;
                }
                Load::Queue(name) => {
                    loaded.queue = self.queues.load_queue(name).await.map_err(store)?;
                }
                Load::QueueAndRequests(name) => {
                    loaded.queue = self.queues.load_queue(name).await.map_err(store)?;
                    loaded.requests = self
                        .queues
                        .list_requests(name, usize::MAX)
                        .await
                        .map_err(store)?;
                }
            }
            if let Some(queue) = &loaded.queue {
                let owners = u32::try_from(queue.owners.len()).unwrap_or(u32::MAX);
                metrics::gauge!(m::ADMISSION_SLOT_OWNERS, "queue" => queue.name.to_string())
                    .set(f64::from(owners));
                // A reconcile fails each expired owner with a write of its own:
                // the bound allows one more round per owner (and its reload).
                max = max.max(base.saturating_add(owners.saturating_mul(ROUNDS_PER_CONFLICT)));
            }
            let write = loop {
                rounds = rounds.saturating_add(1);
                if rounds > max {
                    return Err(AdmitError::Runaway {
                        step,
                        subject: subject.to_owned(),
                        rounds,
                        max,
                    });
                }
                match decide(loaded) {
                    Decision::Reply(reply) => return Ok(reply),
                    Decision::Need(need) => self.fulfil(need, loaded).await.map_err(store)?,
                    Decision::Write(write) => break write,
                }
            };
            let label = write_label(&write);
            failpoint::hit(step, label, failpoint::When::Before);
            let outcome = match &write {
                Write::Queue {
                    expected, queue, ..
                } => self.queues.cas_queue(*expected, queue).await,
                Write::Request {
                    expected, request, ..
                } => self.queues.cas_request(*expected, request).await,
            };
            failpoint::hit(step, label, failpoint::When::After);
            let outcome = outcome.map_err(store)?;
            let applied = outcome == CasOutcome::Applied;
            metrics::counter!(
                m::ADMISSION_WRITES,
                "write" => label,
                "result" => if applied { "applied" } else { "conflict" }
            )
            .increment(1);
            tracing::debug!(write = label, applied, "admission write");
            if applied {
                loaded.memo.record_applied(&write);
                match &write {
                    Write::Queue {
                        kind: QueueWrite::Backfill { added },
                        ..
                    } => loaded.backfilled.extend(added.iter().cloned()),
                    Write::Queue {
                        kind: QueueWrite::Prune { pruned },
                        queue,
                        ..
                    } => {
                        note_pruned(&queue.name, pruned);
                        loaded.pruned.extend(pruned.iter().cloned());
                    }
                    // Loaded owners stay current: a failed (expired) owner is then
                    // pruned on the next decision instead of failed again.
                    Write::Request { request, .. } => {
                        if let Some(owner) = loaded.owners.get_mut(&request.id) {
                            *owner = Some(request.clone());
                        }
                    }
                    _ => {}
                }
            } else {
                // A request that moved on under us is read again (a loaded owner
                // kept would make the same compare-and-set fail every round).
                if let Write::Request { request, .. } = &write {
                    loaded.owners.remove(&request.id);
                }
                conflicts += 1;
                if conflicts > self.policy.max_conflicts {
                    return Err(AdmitError::Conflicts {
                        step,
                        subject: subject.to_owned(),
                        conflicts,
                        max: self.policy.max_conflicts,
                    });
                }
            }
        }
    }

    async fn fulfil(&self, need: Need, loaded: &mut Loaded) -> Result<(), QueueStoreError> {
        match need {
            Need::Requests(ids) => {
                for id in ids {
                    let request = self.queues.load_request(&id).await?;
                    loaded.owners.insert(id, request);
                }
            }
            Need::Ancestry {
                ancestor,
                descendant,
            } => {
                let answer = match self.ancestry.is_ancestor(&ancestor, &descendant).await {
                    Ok(true) => AncestryAnswer::Ancestor,
                    Ok(false) => AncestryAnswer::NotAncestor,
                    Err(AncestryError::NotFound(_)) => AncestryAnswer::NotFound,
                    Err(AncestryError::Failed(reason)) => AncestryAnswer::Failed(reason),
                };
                loaded.ancestry = Some(AncestryFact {
                    ancestor,
                    descendant,
                    answer,
                });
            }
        }
        Ok(())
    }
}

/// Turns a queue store error of `step` on `subject` into an [`AdmitError`].
fn store_error(
    step: &'static str,
    subject: impl std::fmt::Display,
) -> impl FnOnce(QueueStoreError) -> AdmitError {
    move |source| AdmitError::Store {
        step,
        subject: subject.to_string(),
        source,
    }
}

/// Logs and counts what a prune removed: owners of another queue are worth a
/// warning (how did they get in?), expired owners a line each.
fn note_pruned(queue: &QueueName, pruned: &[Pruned]) {
    use holdfast_domain::FailReason;
    use holdfast_domain::admission::PrunedWhy;
    for p in pruned {
        match p.why {
            PrunedWhy::Foreign => tracing::warn!(
                %queue, owner = %p.id,
                "pruned a slot owner that is a request of another queue"
            ),
            PrunedWhy::Terminal {
                reason: Some(FailReason::SlotLeaseExpired),
                ..
            } => {
                metrics::counter!(m::ADMISSION_EXPIRED, "queue" => queue.to_string()).increment(1);
                tracing::warn!(%queue, owner = %p.id, "slot lease expired: request failed, slot freed");
            }
            _ => tracing::info!(%queue, owner = %p.id, why = ?p.why, "pruned a slot owner"),
        }
    }
}

/// The `reply` metric label.
pub fn reply_label(reply: &Reply) -> &'static str {
    match reply {
        Reply::Ack => "ack",
        Reply::Hold { .. } => "hold",
        Reply::Retry(_) => "retry",
        Reply::DeadLetter(_) => "dead_letter",
        Reply::Publish { .. } => "publish",
        Reply::Error(_) => "error",
    }
}

/// The `write` metric label.
pub fn write_label(write: &Write) -> &'static str {
    match write {
        Write::Queue { kind, .. } => match kind {
            QueueWrite::StampLatest => "stamp_latest",
            QueueWrite::Claim => "claim",
            QueueWrite::Release => "release",
            QueueWrite::Prune { .. } => "prune",
            QueueWrite::Backfill { .. } => "backfill",
            QueueWrite::RecordGreen => "record_green",
            QueueWrite::Heartbeat => "heartbeat",
            QueueWrite::Publish { .. } => "publish",
            QueueWrite::Withdraw => "withdraw",
            QueueWrite::MarkExpiring { .. } => "mark_expiring",
            QueueWrite::SetLimit => "set_limit",
        },
        Write::Request { kind, .. } => match kind {
            RequestWrite::Fence => "fence",
            RequestWrite::Supersede => "supersede",
            RequestWrite::MarkProcessing => "mark_processing",
            RequestWrite::Finish(_) => "finish",
            RequestWrite::Fail => "fail",
            RequestWrite::Expire => "expire",
        },
    }
}

#[cfg(test)]
mod tests {
    use holdfast_domain::{RequestState, Version};
    use holdfast_ports::MockQueueStore;

    use super::*;

    fn queue_name() -> QueueName {
        QueueName::new("q").expect("queue name")
    }

    /// A store where request 1 of `q` is the accepted head and every write
    /// conflicts (another instance always wins).
    fn contended() -> MockQueueStore {
        let mut store = MockQueueStore::new();
        let id = RequestId::new(queue_name(), 1);
        let request = Request {
            id: id.clone(),
            uri: RevisionUri::new("git:a").expect("uri"),
            state: RequestState::Accepted,
            plan: None,
            reason: None,
            ingested_at: holdfast_domain::Timestamp::from_millis(0),
            version: Version::FIRST,
        };
        let mut queue = Queue::new(queue_name());
        queue.latest_request_id = Some(id);
        store
            .expect_load_request()
            .returning(move |_| Ok(Some(request.clone())));
        store
            .expect_load_queue()
            .returning(move |_| Ok(Some(queue.clone())));
        store
            .expect_cas_queue()
            .returning(|_, _| Ok(CasOutcome::Conflict));
        store
    }

    #[test]
    fn the_round_bound_follows_the_conflict_bound_and_saturates() {
        assert_eq!(max_rounds(1), 38);
        assert_eq!(max_rounds(32), 131);
        assert!(max_rounds(1_000) > 1_000 * ROUNDS_PER_CONFLICT);
        assert_eq!(max_rounds(u32::MAX), u32::MAX);
        assert_eq!(max_rounds(u32::MAX / 3), u32::MAX);
    }

    /// With more conflicts allowed than the old fixed bound of 64 rounds, a
    /// contended step still ends as `Conflicts` naming the configured bound.
    #[tokio::test]
    async fn a_contended_step_fails_with_conflicts_not_runaway() {
        for max_conflicts in [1, 32, 100, 500] {
            let admission = Admission::new(
                Arc::new(contended()),
                Arc::new(NoAncestry),
                AdmissionPolicy {
                    max_conflicts,
                    ..AdmissionPolicy::default()
                },
            );
            let err = admission
                .process(&RequestId::new(queue_name(), 1))
                .await
                .unwrap_err();
            assert_eq!(
                err,
                AdmitError::Conflicts {
                    step: "process",
                    subject: "request/q/1".to_owned(),
                    conflicts: max_conflicts + 1,
                    max: max_conflicts,
                }
            );
        }
    }
}
