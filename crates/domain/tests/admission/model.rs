//! The model harness: an in-memory versioned store that executes admission
//! decisions like the app does (read "now" once when a step starts; load the
//! request, then the queue, decide, attempt one compare-and-set, reload), with
//! injectable faults, and checks the invariants of `docs/admission.md` after every
//! step.
//!
//! The harness is generic over a [`Design`], so the same scripts run against the
//! owner-keyed rules of `holdfast_domain::admission` and against the old
//! anonymous-count design (the oracle in `oracle.rs`). Slot ownership is tracked by
//! a ghost map (who claimed, who released), which is what makes the invariants
//! checkable for a design that does not record owners.
//!
//! The harness is also the build system: every [`Reply::Publish`] starts a build of
//! (request, generation), which runs until it finishes (its outcome message is
//! queued), dies (it stops without a word) or is told to stop by a heartbeat. A
//! ghost record of every publication and of the live builds checks the
//! publication invariants of issue 25:
//!
//! - no (request, generation) is published twice, and a delivery publishes only
//!   the generation its own publication write recorded;
//! - at most one live generation per request beyond one heartbeat: a heartbeat of
//!   generation g that starts after a newer generation was recorded is never told
//!   "extended" (the older build stops at it);
//! - a build told "extended until T" is never expired before T, and a heartbeat
//!   is never told "extended" past an expiry (the heartbeat/expiry race);
//! - never more distinct requests with a live build than slots, not counting
//!   builds the store already stopped and that hear it at their next heartbeat;
//! - at quiescence, every request that was marked processing had a generation
//!   published, unless a dead letter or its lease expiry failed it first;
//! - no wedge: a request is never held by its own slot, except a duplicate
//!   process delivery of an owner whose publication is unconfirmed (no
//!   heartbeat since it), held exactly until the publication would go quiet.
//!   Such a message is redelivered after its delay (as a source keeps a hold's
//!   delay; a gate hold comes back at the next wake-up, at once in the model),
//!   and a hold is never a failed attempt.
//!
//! The clock only moves when a test or [`World::drain`] moves it; a delivery reads
//! it when it starts, so a delivery started before a move decides with the time
//! before it, as a slow step (or a replica whose clock lags) does.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use holdfast_domain::admission::{
    AdmissionConfig, AncestryAnswer, AncestryFact, BuildOutcome, Decision, Heartbeat,
    LoadedRequests, Need, ProcessMemo, QueueWrite, Reply, RequestWrite, Write, decide_ingest,
    quiet_owners,
};
use holdfast_domain::{
    FailReason, Generation, LastGreen, Queue, QueueName, Request, RequestId, RequestState,
    RevisionUri, Slot, Timestamp, Version,
};

/// The name of the one queue of the model.
pub const QUEUE: &str = "q";

/// The id of the `n`-th request of the model queue.
pub fn rid(n: u64) -> RequestId {
    RequestId::new(QueueName::new(QUEUE).unwrap(), n)
}

/// A revision uri.
pub fn uri(name: &str) -> RevisionUri {
    RevisionUri::new(name).unwrap()
}

/// The stored queue row: the domain record plus the anonymous count that only the
/// old design reads and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueRow {
    /// The queue record.
    pub queue: Queue,
    /// The old design's in-flight count.
    pub count: u32,
}

/// A message of the model's delivery system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Ingest a revision.
    Ingest(RevisionUri),
    /// Admit a request.
    Process(RequestId),
    /// A build of the request ended.
    Outcome(RequestId, BuildOutcome),
    /// The request's message failed for good.
    DeadLetter(RequestId),
    /// Prune the owners (owner-keyed design only).
    Reconcile,
    /// The running build of the request, of the generation it was published
    /// with, is alive (owner-keyed design only).
    Heartbeat(RequestId, Generation),
}

impl Msg {
    fn subject(&self) -> Option<&RequestId> {
        match self {
            Msg::Process(id)
            | Msg::Outcome(id, _)
            | Msg::DeadLetter(id)
            | Msg::Heartbeat(id, _) => Some(id),
            Msg::Ingest(_) | Msg::Reconcile => None,
        }
    }
}

/// What a delivery loaded, as a design sees it.
#[derive(Debug)]
pub struct View<'a> {
    /// The request, loaded first.
    pub request: Option<&'a Request>,
    /// The queue row, loaded second.
    pub row: Option<&'a QueueRow>,
    /// Owners' requests loaded on demand.
    pub owners: &'a LoadedRequests,
    /// The ancestry answer, once asked.
    pub ancestry: Option<&'a AncestryFact>,
    /// The owner-keyed design's memo.
    pub memo: &'a ProcessMemo,
    /// The model clock.
    pub now: Timestamp,
    /// Labels of the writes this delivery had applied (the old design is
    /// sequential code and remembers what it did).
    pub applied: &'a [&'static str],
}

/// One write as the harness executes it.
#[derive(Debug, Clone)]
pub enum Target {
    /// Compare-and-set the queue row.
    Queue {
        /// The version read.
        expected: Version,
        /// The new row.
        row: QueueRow,
    },
    /// Compare-and-set a request.
    Request {
        /// The version read.
        expected: Version,
        /// The new record.
        request: Request,
    },
}

/// A write with its label and, for the owner-keyed design, the domain write.
#[derive(Debug, Clone)]
pub struct HWrite {
    /// Short name: claim, mark, release, ...
    pub label: &'static str,
    /// What to write.
    pub target: Target,
    /// The domain write, for [`ProcessMemo::record_applied`].
    pub domain: Option<Write>,
}

/// A design's decision.
#[derive(Debug)]
pub enum Act {
    /// Attempt a write (boxed: it carries whole records).
    Write(Box<HWrite>),
    /// Load something.
    Need(Need),
    /// Answer the message.
    Reply(Reply),
}

/// A slot change seen by a queue write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotChange {
    /// The request took a slot.
    Claim(RequestId),
    /// The request's slot was given up.
    Release(RequestId),
}

/// A set of admission rules the harness can execute.
pub trait Design {
    /// Decides a process delivery.
    fn process(&self, cfg: &AdmissionConfig, id: &RequestId, view: &View<'_>) -> Act;
    /// Decides a build outcome delivery.
    fn outcome(&self, view: &View<'_>, outcome: BuildOutcome) -> Act;
    /// Decides a dead-letter delivery.
    fn dead_letter(&self, view: &View<'_>) -> Act;
    /// Decides a reconcile pass.
    fn reconcile(&self, cfg: &AdmissionConfig, view: &View<'_>) -> Act;
    /// Decides a heartbeat of `generation`; a design without slot leases has
    /// nothing to extend.
    fn heartbeat(&self, _cfg: &AdmissionConfig, _generation: Generation, _view: &View<'_>) -> Act {
        Act::Reply(Reply::Ack)
    }
    /// What a heartbeat of `generation` tells its build, from the records its last
    /// decision read. A design without slot leases never stops a build.
    fn heartbeat_answer(
        &self,
        _cfg: &AdmissionConfig,
        _generation: Generation,
        _view: &View<'_>,
    ) -> Heartbeat {
        Heartbeat::Extended {
            expires_at: Timestamp(u64::MAX),
        }
    }
    /// Decides withdrawing the publication of `generation` after its publish
    /// failed; a design without publication records has nothing to withdraw.
    fn withdraw(&self, _generation: Generation, _view: &View<'_>) -> Act {
        Act::Reply(Reply::Ack)
    }
    /// Whether the design records each publication (a generation written before
    /// the publish). The old design publishes every delivery of a processing
    /// request, without a record, as generation 1.
    fn records_publications(&self) -> bool {
        false
    }
    /// How many slots are taken.
    fn occupancy(&self, row: &QueueRow) -> usize;
    /// The slot changes of a queue write made on behalf of `actor`.
    fn slot_changes(
        &self,
        before: &QueueRow,
        after: &QueueRow,
        actor: Option<&RequestId>,
    ) -> Vec<SlotChange>;
}

/// The owner-keyed rules of `holdfast_domain::admission`.
#[derive(Debug, Clone, Copy, Default)]
pub struct OwnerKeyed;

fn queue_label(kind: &QueueWrite) -> &'static str {
    match kind {
        QueueWrite::StampLatest => "stamp",
        QueueWrite::Claim => "claim",
        QueueWrite::Release => "release",
        QueueWrite::Prune { .. } => "prune",
        QueueWrite::Backfill { .. } => "backfill",
        QueueWrite::RecordGreen => "green",
        QueueWrite::Heartbeat => "heartbeat",
        QueueWrite::Publish { .. } => "publish",
        QueueWrite::Withdraw => "withdraw",
        QueueWrite::MarkExpiring { .. } => "mark-expiring",
        QueueWrite::SetLimit => "limit",
    }
}

fn request_label(kind: &RequestWrite) -> &'static str {
    match kind {
        RequestWrite::Fence => "fence",
        RequestWrite::Supersede => "supersede",
        RequestWrite::MarkProcessing => "mark",
        RequestWrite::Finish(_) => "finish",
        RequestWrite::Fail => "fail",
        RequestWrite::Expire => "expire",
    }
}

/// Turns a domain decision into a harness act; queue writes keep the row's count.
pub fn act(decision: Decision, row: Option<&QueueRow>) -> Act {
    match decision {
        Decision::Reply(reply) => Act::Reply(reply),
        Decision::Need(need) => Act::Need(need),
        Decision::Write(write) => {
            let (label, target) = match &write {
                Write::Queue {
                    kind,
                    expected,
                    queue,
                } => (
                    queue_label(kind),
                    Target::Queue {
                        expected: *expected,
                        row: QueueRow {
                            queue: queue.clone(),
                            count: row.map_or(0, |r| r.count),
                        },
                    },
                ),
                Write::Request {
                    kind,
                    expected,
                    request,
                } => (
                    request_label(kind),
                    Target::Request {
                        expected: *expected,
                        request: request.clone(),
                    },
                ),
            };
            Act::Write(Box::new(HWrite {
                label,
                target,
                domain: Some(write),
            }))
        }
    }
}

impl Design for OwnerKeyed {
    fn process(&self, cfg: &AdmissionConfig, id: &RequestId, view: &View<'_>) -> Act {
        let input = holdfast_domain::admission::ProcessInput {
            id,
            request: view.request,
            queue: view.row.map(|r| &r.queue),
            owners: view.owners,
            ancestry: view.ancestry,
            memo: view.memo,
            now: view.now,
        };
        act(
            holdfast_domain::admission::decide_process(cfg, &input),
            view.row,
        )
    }

    fn outcome(&self, view: &View<'_>, outcome: BuildOutcome) -> Act {
        act(
            holdfast_domain::admission::decide_outcome(
                view.request,
                view.row.map(|r| &r.queue),
                outcome,
            ),
            view.row,
        )
    }

    fn dead_letter(&self, view: &View<'_>) -> Act {
        act(
            holdfast_domain::admission::decide_dead_letter(
                view.request,
                view.row.map(|r| &r.queue),
            ),
            view.row,
        )
    }

    fn reconcile(&self, cfg: &AdmissionConfig, view: &View<'_>) -> Act {
        match view.row {
            Some(row) => act(
                holdfast_domain::admission::decide_reconcile(
                    &row.queue,
                    view.owners,
                    cfg.slot_lease,
                    view.now,
                ),
                view.row,
            ),
            None => Act::Reply(Reply::Ack),
        }
    }

    fn heartbeat(&self, cfg: &AdmissionConfig, generation: Generation, view: &View<'_>) -> Act {
        act(
            holdfast_domain::admission::decide_heartbeat(
                view.request,
                view.row.map(|r| &r.queue),
                generation,
                cfg.slot_lease,
                view.now,
            ),
            view.row,
        )
    }

    fn heartbeat_answer(
        &self,
        cfg: &AdmissionConfig,
        generation: Generation,
        view: &View<'_>,
    ) -> Heartbeat {
        holdfast_domain::admission::heartbeat_answer(
            view.request,
            view.row.map(|r| &r.queue),
            generation,
            cfg.slot_lease,
            view.now,
        )
    }

    fn withdraw(&self, generation: Generation, view: &View<'_>) -> Act {
        act(
            holdfast_domain::admission::decide_withdraw(
                view.request,
                view.row.map(|r| &r.queue),
                generation,
            ),
            view.row,
        )
    }

    fn records_publications(&self) -> bool {
        true
    }

    fn occupancy(&self, row: &QueueRow) -> usize {
        row.queue.owners.len()
    }

    fn slot_changes(
        &self,
        before: &QueueRow,
        after: &QueueRow,
        _actor: Option<&RequestId>,
    ) -> Vec<SlotChange> {
        let claims = after
            .queue
            .owners
            .keys()
            .filter(|id| !before.queue.owners.contains_key(*id))
            .cloned()
            .map(SlotChange::Claim);
        let releases = before
            .queue
            .owners
            .keys()
            .filter(|id| !after.queue.owners.contains_key(*id))
            .cloned()
            .map(SlotChange::Release);
        releases.chain(claims).collect()
    }
}

/// A fault injected into a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The store fails before writing; the delivery retries.
    FailBeforeWrite,
    /// The store writes, then reports an error; the delivery retries.
    CommitThenError,
    /// Publishing the build fails; the delivery withdraws the publication (as
    /// the app does), then retries.
    PublishFails,
    /// Publishing reports an error although the build was handed over (it runs
    /// and may heartbeat): the delivery withdraws the publication as after
    /// [`Fault::PublishFails`], then retries.
    PublishAmbiguous,
    /// The store writes, then the worker dies before it answers anything: the
    /// message comes back unanswered, as after a crash. After a publication
    /// write, this is the worker that died between recording and publishing.
    DieAfterWrite,
}

/// How a delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The design replied.
    Reply(Reply),
    /// A store operation failed (injected): the message is retried.
    StoreError,
    /// Publishing failed (injected): the publication was withdrawn (or the
    /// withdrawal ended without a write) and the message is retried.
    PublishFailed,
    /// A heartbeat ended: what it told its build.
    Heartbeat(Heartbeat),
    /// The worker died (injected): the message is back in the inbox.
    Died,
}

/// What one step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepResult {
    /// Loaded something.
    Loaded,
    /// Attempted a write.
    Wrote {
        /// Its label.
        label: &'static str,
        /// Whether it was applied.
        applied: bool,
    },
    /// Publishing the build failed (injected); the delivery withdraws it next.
    PublishFailed,
    /// The delivery ended.
    Ended(End),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Create,
    LoadRequest,
    LoadQueue,
    Decide,
}

/// A message in the inbox with its failed delivery attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The message.
    pub msg: Msg,
    /// Failed attempts so far (holds do not count).
    pub attempts: u32,
    /// Not redelivered before this time: the delay of a hold that waits for a
    /// build's first heartbeat. `None`: at once (a gate hold ends at the earliest
    /// wake-up, when any slot changes). Only [`World::drain`] and
    /// [`World::deliver_due`] wait for it; a delivery started by hand is an early
    /// redelivery, as an at-least-once source may make.
    pub due: Option<Timestamp>,
}

#[derive(Debug)]
struct Delivery {
    msg: Msg,
    attempts: u32,
    phase: Phase,
    subject: Option<RequestId>,
    request: Option<Request>,
    row: Option<QueueRow>,
    owners: LoadedRequests,
    ancestry: Option<AncestryFact>,
    memo: ProcessMemo,
    applied: Vec<&'static str>,
    fault: Option<(&'static str, Fault)>,
    /// The time this step read when it started; every decision of the delivery
    /// uses it, as the app reads its clock once per step.
    now: Timestamp,
    /// The generation whose publish failed, once the delivery withdraws it.
    withdrawing: Option<Generation>,
    /// The generation this delivery's applied publication write recorded.
    recorded: Option<Generation>,
    /// The newest generation of the subject recorded when the delivery started:
    /// a heartbeat of an older one that starts after it must be told to stop.
    newest_at_start: Generation,
    /// Whether the subject owned a slot (ghost) when this delivery last read the
    /// queue: a hold decided on such a read is a wedge; one decided on a read from
    /// before the claim is only stale (the redelivery resumes).
    owned_at_load: bool,
}

/// The in-memory store.
#[derive(Debug, Clone, Default)]
pub struct Store {
    /// The queue row, if created.
    pub queue: Option<QueueRow>,
    /// Every request.
    pub requests: BTreeMap<RequestId, Request>,
    next_seq: u64,
}

/// The model world: store, inbox, in-flight deliveries, running builds, ghost
/// ownership and the invariant violations seen so far.
#[derive(Debug)]
pub struct World<D> {
    /// The rules under test.
    pub design: D,
    /// Admission settings.
    pub cfg: AdmissionConfig,
    /// Failed attempts after which a process or outcome message is dead-lettered.
    pub max_attempts: u32,
    /// The store.
    pub store: Store,
    /// Messages waiting for delivery.
    pub inbox: VecDeque<Pending>,
    active: BTreeMap<u64, Delivery>,
    next_delivery: u64,
    /// The live builds: published, and not finished, dead or told to stop.
    pub builds: BTreeMap<(RequestId, Generation), Build>,
    /// Every publication, in order.
    pub published: Vec<(RequestId, Generation)>,
    /// Every heartbeat answer, in order: the build's request and generation, and
    /// what it was told.
    pub answers: Vec<(RequestId, Generation, Heartbeat)>,
    /// The newest generation recorded (a publication write applied) per request.
    recorded: BTreeMap<RequestId, Generation>,
    /// Every request ever marked processing (admitted).
    marked: BTreeSet<RequestId>,
    /// When each request's slot was marked expiring (the delivery's "now").
    expired_at: BTreeMap<RequestId, Timestamp>,
    /// What the ancestry source answers, by descendant uri (default: ancestor).
    pub ancestry: BTreeMap<RevisionUri, AncestryAnswer>,
    ghost: BTreeMap<RequestId, u32>,
    /// Leaks injected on purpose (crafted states), exempt from the ownership checks
    /// until released.
    pub tolerated: BTreeSet<RequestId>,
    max_lowered: bool,
    /// Every invariant violation seen, in order.
    pub violations: Vec<String>,
    /// Applied writes and replies, in order.
    pub trace: Vec<String>,
    /// Holds replied.
    pub holds: u32,
    /// Whether [`World::drain`] ends the newest running build first (default: the
    /// oldest), so that builds succeed out of request order.
    pub finish_newest_first: bool,
    /// Whether the delivery source scans for quiet owners (default: yes). Without
    /// it, only redelivered messages recover a publication lost before its
    /// handover, as with a message broker, and [`World::drain`] fails on an owner
    /// whose build was never handed over and that no message covers.
    pub scans: bool,
    /// The model clock: what a delivery reads as "now" when it starts.
    pub now: Timestamp,
    progress: u64,
}

/// A live build, as the build system knows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Build {
    /// Until when its last heartbeat told it the slot is its own ("extended
    /// until"); `None` before its first heartbeat.
    pub extended_until: Option<Timestamp>,
}

/// Steps after which one delivery is considered livelocked.
const DELIVERY_STEP_LIMIT: usize = 400;

impl<D: Design> World<D> {
    /// A world with an empty queue row.
    pub fn new(design: D, cfg: AdmissionConfig) -> Self {
        let queue = Queue::new(QueueName::new(QUEUE).unwrap());
        World {
            design,
            cfg,
            max_attempts: 3,
            store: Store {
                queue: Some(QueueRow { queue, count: 0 }),
                requests: BTreeMap::new(),
                next_seq: 1,
            },
            inbox: VecDeque::new(),
            active: BTreeMap::new(),
            next_delivery: 1,
            builds: BTreeMap::new(),
            published: Vec::new(),
            answers: Vec::new(),
            recorded: BTreeMap::new(),
            marked: BTreeSet::new(),
            expired_at: BTreeMap::new(),
            ancestry: BTreeMap::new(),
            ghost: BTreeMap::new(),
            tolerated: BTreeSet::new(),
            max_lowered: false,
            violations: Vec::new(),
            trace: Vec::new(),
            holds: 0,
            finish_newest_first: false,
            scans: true,
            now: Timestamp::from_millis(0),
            progress: 0,
        }
    }

    /// Sets the queue's last green bookmark (as the record step would).
    pub fn set_last_green(&mut self, green: &str) {
        let row = self.store.queue.as_mut().unwrap();
        row.queue.last_green = Some(LastGreen {
            uri: uri(green),
            request_id: rid(0),
        });
    }

    /// Lowers (or raises) the stored slot limit, as `queue set-limit` does (and
    /// the configured default with it); lowering allows excess owners until drain.
    pub fn set_max(&mut self, max: u32) {
        if usize::try_from(max).unwrap() < self.capacity() {
            self.max_lowered = true;
        }
        // The configured default stays valid (at least 1); the old design reads it.
        self.cfg.max_concurrent = max.max(1);
        if let Some(row) = self.store.queue.as_mut() {
            row.queue.max_concurrent = Some(max);
            row.queue.version = row.queue.version.next();
        }
    }

    /// The slot limit in force: the stored one, else the configured default.
    pub fn capacity(&self) -> usize {
        let limit = self
            .store
            .queue
            .as_ref()
            .map_or(self.cfg.max_concurrent, |r| {
                r.queue.limit(self.cfg.max_concurrent)
            });
        usize::try_from(limit).unwrap()
    }

    /// Rebuilds the ghost from the stored owners (after crafting a state by hand).
    pub fn resync_ghost(&mut self) {
        self.ghost.clear();
        if let Some(row) = &self.store.queue {
            for id in row.queue.owners.keys() {
                self.ghost.insert(id.clone(), 1);
            }
        }
    }

    /// Injects a missed release (as an older binary or a manual edit would leave
    /// it): the terminal request `id` is put back among the owners. Reconcile must
    /// heal it; until then it is exempt from the ownership checks.
    pub fn inject_leak(&mut self, id: &RequestId) {
        let terminal = self
            .store
            .requests
            .get(id)
            .is_some_and(|r| r.state.is_terminal());
        let Some(row) = self.store.queue.as_mut() else {
            return;
        };
        // An owner already (a terminal request not released yet) stays as it is.
        if !terminal || row.queue.owners.contains_key(id) {
            return;
        }
        row.queue.owners.insert(id.clone(), Slot::claimed(self.now));
        row.queue.version = row.queue.version.next();
        *self.ghost.entry(id.clone()).or_default() += 1;
        self.tolerated.insert(id.clone());
        self.trace.push(format!("leak {id} injected"));
    }

    /// The state of a request.
    pub fn state(&self, id: &RequestId) -> RequestState {
        self.store.requests[id].state
    }

    /// The request record.
    pub fn request(&self, id: &RequestId) -> &Request {
        &self.store.requests[id]
    }

    /// The owners, by sequence number.
    pub fn owners(&self) -> Vec<u64> {
        self.row().queue.owners.keys().map(RequestId::seq).collect()
    }

    /// The queue row.
    pub fn row(&self) -> &QueueRow {
        self.store.queue.as_ref().unwrap()
    }

    /// Requests in `state`.
    pub fn count_in(&self, state: RequestState) -> usize {
        self.store
            .requests
            .values()
            .filter(|r| r.state == state)
            .count()
    }

    /// Trace lines of applied writes with this label.
    pub fn applied(&self, label: &str) -> usize {
        let needle = format!(": {label} applied");
        self.trace.iter().filter(|l| l.contains(&needle)).count()
    }

    /// Starts a delivery of `msg` (not taken from the inbox).
    pub fn start(&mut self, msg: Msg) -> u64 {
        self.start_pending(Pending {
            msg,
            attempts: 0,
            due: None,
        })
    }

    /// Starts the delivery of the first inbox message equal to `msg`, or of a new
    /// copy if there is none.
    pub fn take(&mut self, msg: Msg) -> u64 {
        match self.inbox.iter().position(|p| p.msg == msg) {
            Some(i) => {
                let pending = self.inbox.remove(i).unwrap();
                self.start_pending(pending)
            }
            None => self.start(msg),
        }
    }

    /// Starts the delivery of the inbox message at `index`.
    pub fn start_inbox(&mut self, index: usize) -> Option<u64> {
        let pending = self.inbox.remove(index)?;
        Some(self.start_pending(pending))
    }

    fn start_pending(&mut self, pending: Pending) -> u64 {
        let id = self.next_delivery;
        self.next_delivery += 1;
        let (phase, subject) = match &pending.msg {
            Msg::Ingest(_) => (Phase::Create, None),
            Msg::Reconcile => (Phase::LoadQueue, None),
            other => (Phase::LoadRequest, other.subject().cloned()),
        };
        let newest_at_start = subject
            .as_ref()
            .and_then(|id| self.recorded.get(id).copied())
            .unwrap_or(Generation::NONE);
        self.active.insert(
            id,
            Delivery {
                msg: pending.msg,
                attempts: pending.attempts,
                phase,
                subject,
                request: None,
                row: None,
                owners: LoadedRequests::new(),
                ancestry: None,
                memo: ProcessMemo::new(),
                applied: Vec::new(),
                fault: None,
                now: self.now,
                withdrawing: None,
                recorded: None,
                newest_at_start,
                owned_at_load: false,
            },
        );
        id
    }

    /// The in-flight deliveries.
    pub fn active_ids(&self) -> Vec<u64> {
        self.active.keys().copied().collect()
    }

    /// The message of an in-flight delivery.
    pub fn active_msg(&self, delivery: u64) -> Option<Msg> {
        self.active.get(&delivery).map(|d| d.msg.clone())
    }

    /// Arms a fault for the delivery's next write labelled `label` (any write with
    /// "*"; its publish with "publish").
    pub fn fault_on(&mut self, delivery: u64, label: &'static str, fault: Fault) {
        if let Some(d) = self.active.get_mut(&delivery) {
            d.fault = Some((label, fault));
        }
    }

    /// Abandons a delivery: the message is redelivered later.
    pub fn crash(&mut self, delivery: u64) {
        if let Some(d) = self.active.remove(&delivery) {
            self.trace.push(format!("#{delivery} crashed"));
            self.inbox.push_back(Pending {
                msg: d.msg,
                attempts: d.attempts,
                due: None,
            });
            self.check_state();
        }
    }

    /// Runs an ingest to completion and returns the request id.
    pub fn ingest(&mut self, name: &str) -> RequestId {
        let d = self.start(Msg::Ingest(uri(name)));
        self.run(d);
        let n = self
            .store
            .requests
            .values()
            .find(|r| r.uri == uri(name))
            .unwrap();
        n.id.clone()
    }

    /// Delivers `msg` (taken from the inbox if there) to completion.
    pub fn deliver(&mut self, msg: Msg) -> End {
        let d = self.take(msg);
        self.run(d)
    }

    /// Delivers the process message of `id`.
    pub fn process(&mut self, id: &RequestId) -> End {
        self.deliver(Msg::Process(id.clone()))
    }

    /// Ends the newest live build of `id` with `outcome`: its outcome message is
    /// queued (also when no build of `id` is live: a build the model stopped
    /// tracking, as a late outcome).
    pub fn finish_build(&mut self, id: &RequestId, outcome: BuildOutcome) {
        if let Some(g) = self.live(id).last().copied() {
            self.builds.remove(&(id.clone(), g));
        }
        self.inbox.push_back(Pending {
            msg: Msg::Outcome(id.clone(), outcome),
            attempts: 0,
            due: None,
        });
    }

    /// Ends the live build of `id` of generation `generation` with `outcome`.
    pub fn finish_generation(
        &mut self,
        id: &RequestId,
        generation: Generation,
        outcome: BuildOutcome,
    ) {
        self.builds.remove(&(id.clone(), generation));
        self.inbox.push_back(Pending {
            msg: Msg::Outcome(id.clone(), outcome),
            attempts: 0,
            due: None,
        });
    }

    /// The generations of `id`'s live builds, oldest first.
    pub fn live(&self, id: &RequestId) -> Vec<Generation> {
        self.builds
            .keys()
            .filter(|(r, _)| r == id)
            .map(|(_, g)| *g)
            .collect()
    }

    /// The generations of `id` published so far, in order.
    pub fn generations(&self, id: &RequestId) -> Vec<Generation> {
        self.published
            .iter()
            .filter(|(r, _)| r == id)
            .map(|(_, g)| *g)
            .collect()
    }

    /// The live builds of `id` ended; the caller delivers their outcome message
    /// (or none: a lost outcome).
    pub fn builds_ended(&mut self, id: &RequestId) {
        self.builds.retain(|(r, _), _| r != id);
    }

    /// Every live build of `id` dies (its runner crashed): no outcome, no
    /// heartbeat, ever.
    pub fn kill_builds(&mut self, id: &RequestId) {
        for g in self.live(id) {
            self.kill_build(id, g);
        }
    }

    /// The live build of `id` of generation `generation` dies.
    pub fn kill_build(&mut self, id: &RequestId, generation: Generation) {
        if self.builds.remove(&(id.clone(), generation)).is_some() {
            self.trace
                .push(format!("build {} g{generation}: died", id.seq()));
        }
    }

    /// Delivers a heartbeat of `id`'s build of `generation` to its end and
    /// returns what it was told.
    pub fn heartbeat(&mut self, id: &RequestId, generation: Generation) -> Heartbeat {
        match self.deliver(Msg::Heartbeat(id.clone(), generation)) {
            End::Heartbeat(answer) => answer,
            other => panic!("heartbeat ended with {other:?}: {:#?}", self.trace),
        }
    }

    /// Moves the model clock forward by `by`.
    pub fn tick(&mut self, by: Duration) {
        let millis = u64::try_from(by.as_millis()).unwrap();
        self.now = Timestamp::from_millis(self.now.as_millis() + millis);
    }

    /// The scan of the reference delivery source: a process message for every
    /// slot owner whose publication went quiet (`quiet_owners`), unless one is
    /// pending already. Returns the owners it redelivered.
    pub fn scan(&mut self) -> Vec<RequestId> {
        let Some(row) = &self.store.queue else {
            return Vec::new();
        };
        let quiet: Vec<RequestId> = quiet_owners(&row.queue, self.cfg.resume_after, self.now)
            .into_iter()
            .filter(|id| !self.pending_for(id, |m| matches!(m, Msg::Process(_))))
            .collect();
        if !quiet.is_empty() {
            let seqs: Vec<String> = quiet.iter().map(|id| id.seq().to_string()).collect();
            self.trace.push(format!("scan: quiet {}", seqs.join(",")));
        }
        for id in &quiet {
            self.inbox.push_back(Pending {
                msg: Msg::Process(id.clone()),
                attempts: 0,
                due: None,
            });
        }
        quiet
    }

    /// Runs a delivery to its end.
    pub fn run(&mut self, delivery: u64) -> End {
        for _ in 0..DELIVERY_STEP_LIMIT {
            match self.step(delivery) {
                Some(StepResult::Ended(end)) => return end,
                Some(_) => {}
                None => panic!("delivery #{delivery} is not active"),
            }
        }
        self.violations
            .push(format!("livelock: delivery #{delivery} did not end"));
        self.active.remove(&delivery);
        End::StoreError
    }

    /// Steps a delivery until a write labelled `label` was applied.
    pub fn run_until_applied(&mut self, delivery: u64, label: &str) {
        for _ in 0..DELIVERY_STEP_LIMIT {
            match self.step(delivery) {
                Some(StepResult::Wrote { label: l, applied }) if l == label && applied => return,
                Some(StepResult::Ended(end)) => {
                    panic!("delivery #{delivery} ended with {end:?} before {label}")
                }
                Some(_) => {}
                None => panic!("delivery #{delivery} is not active"),
            }
        }
        panic!("delivery #{delivery} never applied {label}");
    }

    /// Advances a delivery by one iteration of its loop: steps it until it attempted
    /// a write or ended. `None` if it is not active.
    pub fn iterate(&mut self, delivery: u64) -> Option<StepResult> {
        for _ in 0..DELIVERY_STEP_LIMIT {
            match self.step(delivery)? {
                StepResult::Loaded => {}
                done => return Some(done),
            }
        }
        None
    }

    /// Runs two deliveries in lockstep, one loop iteration (loads, then one write)
    /// each in turn, until both ended; a pair that does not end within the step
    /// limit is a livelock violation (and both are abandoned to the inbox).
    pub fn lockstep(&mut self, first: u64, second: u64) {
        self.trace.push(format!("lockstep #{first} #{second}"));
        for _ in 0..DELIVERY_STEP_LIMIT {
            let a = self.iterate(first);
            let b = self.iterate(second);
            if a.is_none() && b.is_none() {
                return;
            }
        }
        self.violations.push(format!(
            "livelock: deliveries #{first} and #{second} in lockstep did not end"
        ));
        self.crash(first);
        self.crash(second);
    }

    /// Advances a delivery by one step: one load, or one decision with at most one
    /// write, or its end. `None` if it is not active.
    pub fn step(&mut self, delivery: u64) -> Option<StepResult> {
        let mut d = self.active.remove(&delivery)?;
        let result = self.advance(delivery, &mut d);
        match &result {
            StepResult::Ended(end) => self.finish(delivery, d, end.clone()),
            _ => {
                self.active.insert(delivery, d);
            }
        }
        self.check_state();
        Some(result)
    }

    fn advance(&mut self, delivery: u64, d: &mut Delivery) -> StepResult {
        match d.phase {
            Phase::Create => {
                let Msg::Ingest(u) = &d.msg else {
                    unreachable!()
                };
                let request = self.create_request(u);
                d.subject = Some(request.id.clone());
                d.request = Some(request);
                d.phase = Phase::LoadQueue;
                StepResult::Loaded
            }
            Phase::LoadRequest => {
                d.request = d
                    .subject
                    .as_ref()
                    .and_then(|id| self.store.requests.get(id).cloned());
                d.phase = Phase::LoadQueue;
                StepResult::Loaded
            }
            Phase::LoadQueue => {
                d.row = self.store.queue.clone();
                d.owned_at_load = d
                    .subject
                    .as_ref()
                    .is_some_and(|id| self.ghost.get(id).copied().unwrap_or(0) > 0);
                d.phase = Phase::Decide;
                StepResult::Loaded
            }
            Phase::Decide => self.decide(delivery, d),
        }
    }

    fn create_request(&mut self, u: &RevisionUri) -> Request {
        if let Some(existing) = self.store.requests.values().find(|r| &r.uri == u) {
            return existing.clone();
        }
        if self.store.queue.is_none() {
            self.store.queue = Some(QueueRow {
                queue: Queue::new(QueueName::new(QUEUE).unwrap()),
                count: 0,
            });
        }
        let request = Request {
            id: rid(self.store.next_seq),
            uri: u.clone(),
            state: RequestState::Accepted,
            plan: None,
            reason: None,
            ingested_at: self.now,
            version: Version::FIRST,
        };
        self.store.next_seq += 1;
        self.store
            .requests
            .insert(request.id.clone(), request.clone());
        self.trace.push(format!("create {} ({u})", request.id));
        request
    }

    fn decide(&mut self, delivery: u64, d: &mut Delivery) -> StepResult {
        for _ in 0..4 {
            let view = View {
                request: d.request.as_ref(),
                row: d.row.as_ref(),
                owners: &d.owners,
                ancestry: d.ancestry.as_ref(),
                memo: &d.memo,
                now: d.now,
                applied: &d.applied,
            };
            let act = match (&d.msg, d.withdrawing) {
                (_, Some(generation)) => self.design.withdraw(generation, &view),
                (Msg::Ingest(_), None) => match d.request.as_ref() {
                    Some(request) => act(
                        decide_ingest(&self.cfg, request, d.row.as_ref().map(|r| &r.queue)),
                        d.row.as_ref(),
                    ),
                    None => Act::Reply(Reply::Ack),
                },
                (Msg::Process(id), None) => self.design.process(&self.cfg, id, &view),
                (Msg::Outcome(_, outcome), None) => self.design.outcome(&view, *outcome),
                (Msg::DeadLetter(_), None) => self.design.dead_letter(&view),
                (Msg::Reconcile, None) => self.design.reconcile(&self.cfg, &view),
                (Msg::Heartbeat(_, generation), None) => {
                    self.design.heartbeat(&self.cfg, *generation, &view)
                }
            };
            match act {
                Act::Need(Need::Requests(ids)) => {
                    for id in ids {
                        let loaded = self.store.requests.get(&id).cloned();
                        d.owners.insert(id, loaded);
                    }
                }
                Act::Need(Need::Ancestry {
                    ancestor,
                    descendant,
                }) => {
                    let answer = self
                        .ancestry
                        .get(&descendant)
                        .cloned()
                        .unwrap_or(AncestryAnswer::Ancestor);
                    d.ancestry = Some(AncestryFact {
                        ancestor,
                        descendant,
                        answer,
                    });
                }
                Act::Reply(Reply::Publish {
                    request,
                    plan,
                    generation,
                }) => return self.publish(delivery, d, request, plan, generation),
                Act::Reply(Reply::Ack) if d.withdrawing.is_some() => {
                    return StepResult::Ended(End::PublishFailed);
                }
                Act::Reply(Reply::Ack) if matches!(d.msg, Msg::Heartbeat(..)) => {
                    let Msg::Heartbeat(id, generation) = d.msg.clone() else {
                        unreachable!()
                    };
                    let answer = self.design.heartbeat_answer(&self.cfg, generation, &view);
                    self.heard(&id, generation, answer, d);
                    return StepResult::Ended(End::Heartbeat(answer));
                }
                Act::Reply(reply) => return StepResult::Ended(End::Reply(reply)),
                Act::Write(write) => {
                    let fault = match d.fault {
                        Some((label, fault))
                            if !matches!(fault, Fault::PublishFails | Fault::PublishAmbiguous)
                                && (label == "*" || label == write.label) =>
                        {
                            d.fault = None;
                            Some(fault)
                        }
                        _ => None,
                    };
                    if fault == Some(Fault::FailBeforeWrite) {
                        self.trace
                            .push(format!("#{delivery} {}: {} failed", who(d), write.label));
                        return StepResult::Ended(End::StoreError);
                    }
                    let applied = self.apply(delivery, d, &write);
                    if applied {
                        d.applied.push(write.label);
                        if let Some(domain) = &write.domain {
                            d.memo.record_applied(domain);
                            if let Write::Queue {
                                kind: QueueWrite::Publish { generation, .. },
                                ..
                            } = domain
                            {
                                d.recorded = Some(*generation);
                            }
                        }
                        // Loaded owners stay current, as the app keeps them.
                        if let Target::Request { request, .. } = &write.target
                            && let Some(owner) = d.owners.get_mut(&request.id)
                        {
                            *owner = Some(request.clone());
                        }
                    } else if let Target::Request { request, .. } = &write.target {
                        // A request that moved on under the delivery is read again,
                        // as the app does: a kept copy would make the same
                        // compare-and-set (an expiry decided from it after the
                        // mark) fail every round.
                        d.owners.remove(&request.id);
                    }
                    match fault {
                        Some(Fault::CommitThenError) => return StepResult::Ended(End::StoreError),
                        Some(Fault::DieAfterWrite) => return StepResult::Ended(End::Died),
                        _ => {}
                    }
                    d.phase = Phase::LoadRequest;
                    d.row = None;
                    d.request = None;
                    return StepResult::Wrote {
                        label: write.label,
                        applied,
                    };
                }
            }
        }
        self.violations
            .push(format!("delivery #{delivery} kept asking for loads"));
        StepResult::Ended(End::StoreError)
    }

    /// The build system receives a publication: checks it, and starts the build
    /// of (request, generation) unless the publish fails (injected), in which case
    /// the delivery goes on to withdraw it. An ambiguous failure starts the build
    /// and withdraws all the same.
    fn publish(
        &mut self,
        delivery: u64,
        d: &mut Delivery,
        request: Request,
        plan: holdfast_domain::BuildPlan,
        generation: Generation,
    ) -> StepResult {
        let id = request.id.clone();
        let failed = match d.fault {
            Some(("publish", fault @ (Fault::PublishFails | Fault::PublishAmbiguous))) => {
                d.fault = None;
                Some(fault)
            }
            _ => None,
        };
        if failed == Some(Fault::PublishFails) {
            self.trace.push(format!(
                "#{delivery} {}: publish g{generation} failed",
                who(d)
            ));
            return Self::withdraw_next(d, generation);
        }
        if request.plan.as_ref() != Some(&plan) {
            self.violations.push(format!(
                "publish of {id} with a plan other than the stored one"
            ));
        }
        // Decided on the delivery's last read: the slot may have been released
        // since (a republish racing its outcome), never before.
        if !d.owned_at_load {
            self.violations.push(format!(
                "publish only for a slot owner: {id} published without a slot"
            ));
        }
        if self.published.contains(&(id.clone(), generation)) {
            self.violations.push(format!(
                "each generation is published once: {id} generation {generation} published again"
            ));
        }
        if self.design.records_publications() && d.recorded != Some(generation) {
            self.violations.push(format!(
                "a delivery publishes what it recorded: {id} generation {generation} published by a delivery that recorded {:?}",
                d.recorded
            ));
        }
        self.builds
            .insert((id.clone(), generation), Build::default());
        self.published.push((id.clone(), generation));
        self.trace
            .push(format!("#{delivery} publish {id} g{generation}"));
        if failed == Some(Fault::PublishAmbiguous) {
            self.trace.push(format!(
                "#{delivery} {}: publish g{generation} reported failed, handed over",
                who(d)
            ));
            return Self::withdraw_next(d, generation);
        }
        StepResult::Ended(End::Reply(Reply::Publish {
            request,
            plan,
            generation,
        }))
    }

    /// After a failed publish of `generation`: the delivery withdraws it next.
    fn withdraw_next(d: &mut Delivery, generation: Generation) -> StepResult {
        d.withdrawing = Some(generation);
        d.phase = Phase::LoadRequest;
        d.row = None;
        d.request = None;
        StepResult::PublishFailed
    }

    /// A build heard the answer of its heartbeat delivery `d`: it keeps running
    /// when extended, else it stops.
    ///
    /// "At most one live generation beyond one heartbeat": a heartbeat that
    /// started after a newer generation was recorded is never told extended. (One
    /// that read the queue just before the newer generation was recorded may still
    /// be; its build then runs on until its next heartbeat.)
    fn heard(&mut self, id: &RequestId, generation: Generation, answer: Heartbeat, d: &Delivery) {
        let now = d.now;
        self.answers.push((id.clone(), generation, answer));
        let key = (id.clone(), generation);
        match answer {
            Heartbeat::Extended { expires_at } => {
                let newest = d.newest_at_start;
                if newest > generation {
                    self.violations.push(format!(
                        "one live generation: {id} generation {generation} was told extended by a heartbeat that started after generation {newest} was recorded"
                    ));
                }
                if let Some(&marked) = self.expired_at.get(id)
                    && marked < expires_at
                {
                    self.violations.push(format!(
                        "heartbeat vs expiry: {id} generation {generation} was told extended until {expires_at} (at {now}) after its lease was marked expired at {marked}"
                    ));
                }
                if let Some(build) = self.builds.get_mut(&key) {
                    build.extended_until = Some(expires_at);
                }
            }
            _ => {
                if self.builds.remove(&key).is_some() {
                    self.trace
                        .push(format!("build {} g{generation}: stops", id.seq()));
                }
            }
        }
    }

    fn apply(&mut self, delivery: u64, d: &Delivery, write: &HWrite) -> bool {
        let actor = d.subject.clone();
        let applied = match &write.target {
            Target::Queue { expected, row } => {
                let Some(current) = self.store.queue.clone() else {
                    return false;
                };
                if current.queue.version != *expected {
                    false
                } else {
                    let mut after = row.clone();
                    after.queue.version = expected.next();
                    self.check_queue_write(&current, &after, actor.as_ref(), write.label);
                    self.check_slots(&current, &after, write.label, d.now);
                    self.store.queue = Some(after);
                    true
                }
            }
            Target::Request { expected, request } => {
                match self.store.requests.get(&request.id).cloned() {
                    Some(current) if current.version == *expected => {
                        let mut after = request.clone();
                        after.version = expected.next();
                        self.check_request_write(&current, &after);
                        if write.label == "mark" {
                            self.check_mark(&after);
                            self.marked.insert(after.id.clone());
                        }
                        if write.label == "expire" {
                            self.check_expiry(&after.id, d.now);
                        }
                        self.store.requests.insert(after.id.clone(), after);
                        true
                    }
                    _ => false,
                }
            }
        };
        let outcome = if applied { "applied" } else { "conflict" };
        let detail = if applied {
            self.describe()
        } else {
            String::new()
        };
        self.trace.push(format!(
            "#{delivery} {}: {} {outcome}{detail}",
            who(d),
            write.label
        ));
        if applied {
            self.progress += 1;
        }
        applied
    }

    fn describe(&self) -> String {
        let Some(row) = self.store.queue.as_ref() else {
            return " [no queue]".to_owned();
        };
        // An owner shows its generation once published (`1g2`), a withdrawn
        // publication (`1g2-`) and an expiring slot (`1g2!`).
        let owners: Vec<String> = row
            .queue
            .owners
            .iter()
            .map(|(i, slot)| {
                let mut text = i.seq().to_string();
                if slot.generation > Generation::NONE {
                    text.push_str(&format!("g{}", slot.generation));
                    if slot.published_at.is_none() {
                        text.push('-');
                    }
                }
                if slot.expiring {
                    text.push('!');
                }
                text
            })
            .collect();
        let states: Vec<String> = self
            .store
            .requests
            .values()
            .map(|r| format!("{}={}", r.id.seq(), r.state))
            .collect();
        // The green is shown only once set, so traces of runs without a succeeded
        // build read as before.
        let green = row
            .queue
            .last_green
            .as_ref()
            .map_or(String::new(), |g| format!(" green {}", g.request_id.seq()));
        format!(
            " [owners {{{}}} count {} latest {}{green} | {}]",
            owners.join(","),
            row.count,
            row.queue
                .latest_request_id
                .as_ref()
                .map_or("-".to_owned(), |l| l.seq().to_string()),
            states.join(" ")
        )
    }

    fn check_queue_write(
        &mut self,
        before: &QueueRow,
        after: &QueueRow,
        actor: Option<&RequestId>,
        label: &str,
    ) {
        if after.queue.latest_request_id < before.queue.latest_request_id {
            self.violations.push(format!(
                "latest moved backwards from {:?} to {:?}",
                before.queue.latest_request_id, after.queue.latest_request_id
            ));
        }
        self.check_green(before, after);
        for change in self.design.slot_changes(before, after, actor) {
            match change {
                SlotChange::Claim(id) => {
                    let held = self.ghost.entry(id.clone()).or_default();
                    if *held > 0 {
                        self.violations
                            .push(format!("one slot per request: {id} claimed a second slot"));
                    }
                    *held += 1;
                    let latest = after.queue.latest_request_id.as_ref();
                    if label != "backfill" && latest.is_some_and(|l| id < *l) {
                        self.violations
                            .push(format!("latest head only: {id} claimed while not the head"));
                    }
                    if self.design.occupancy(after) > self.capacity() {
                        self.violations.push(format!(
                            "capacity: claim by {id} took {} slots of {}",
                            self.design.occupancy(after),
                            self.cfg.max_concurrent
                        ));
                    }
                }
                SlotChange::Release(id) => {
                    let held = self.ghost.entry(id.clone()).or_default();
                    if *held == 0 {
                        let by = actor.map_or("reconcile".to_owned(), ToString::to_string);
                        self.violations.push(format!(
                            "release only by owner: {by} released a slot {id} does not hold (double release)"
                        ));
                        continue;
                    }
                    *held -= 1;
                    self.tolerated.remove(&id);
                    if actor != Some(&id) {
                        let live = self
                            .store
                            .requests
                            .get(&id)
                            .is_some_and(|r| !r.state.is_terminal());
                        if live {
                            self.violations.push(format!(
                                "release only by owner: live {id} released by {actor:?}"
                            ));
                        }
                    }
                }
            }
        }
    }

    /// The publication and expiry rules of a queue write, slot by slot:
    /// generations only grow within a slot, by one and only by a publication
    /// write (a new slot starts unpublished); a slot is marked expiring only by
    /// the mark, and the mark never lands before a lease its build was told
    /// extended ends.
    fn check_slots(&mut self, before: &QueueRow, after: &QueueRow, label: &str, now: Timestamp) {
        for (id, slot) in &after.queue.owners {
            let (generation, expiring) = before
                .queue
                .owners
                .get(id)
                .map_or((Generation::NONE, false), |b| (b.generation, b.expiring));
            if slot.generation != generation {
                let by_publish = label == "publish" && slot.generation == generation.next();
                if !by_publish {
                    self.violations.push(format!(
                        "generations grow by one publication: {id} went from {generation} to {} by {label}",
                        slot.generation
                    ));
                }
                self.recorded.insert(id.clone(), slot.generation);
            }
            if slot.expiring && !expiring {
                if label != "mark-expiring" {
                    self.violations.push(format!(
                        "only the mark marks a slot expiring: {id} by {label}"
                    ));
                }
                self.check_expiry(id, now);
            }
            if !slot.expiring && expiring {
                self.violations.push(format!(
                    "a slot marked expiring stays marked: {id} by {label}"
                ));
            }
        }
    }

    /// The heartbeat/expiry race: `id`'s lease is marked expired (or the request
    /// failed by its lease) at `now`, the deciding delivery's time; no build of it
    /// may have been told its lease runs beyond that. The expiry is decided by the
    /// mark: a failure that follows it (possibly by a delivery whose step started
    /// before the mark, with an earlier "now") is checked at the mark's time.
    fn check_expiry(&mut self, id: &RequestId, now: Timestamp) {
        let now = *self.expired_at.entry(id.clone()).or_insert(now);
        for ((r, g), build) in &self.builds {
            if r == id
                && let Some(until) = build.extended_until
                && until > now
            {
                self.violations.push(format!(
                    "heartbeat vs expiry: {id} generation {g} was told extended until {until} but its lease was expired at {now}"
                ));
            }
        }
    }

    /// Latest head only, on the mark: a request marked processing is the latest
    /// head, or it still holds the slot it claimed as the head.
    ///
    /// The plain "is the latest head" check of the claim cannot hold here. A mark
    /// is a compare-and-set of the request only, so a newer head may be stamped
    /// between the delivery's queue read and its mark (a crash between claim and
    /// mark, then a resume racing an ingest); the request then keeps its slot and
    /// builds, as processing requests are never superseded. What the fence
    /// guarantees is that such a mark never lands after its slot was released for
    /// supersession, and never after a dead letter failed it (its fence).
    fn check_mark(&mut self, after: &Request) {
        let Some(row) = &self.store.queue else {
            return;
        };
        let head = row
            .queue
            .latest_request_id
            .as_ref()
            .is_none_or(|l| after.id >= *l);
        let holds = self.ghost.get(&after.id).copied().unwrap_or(0) > 0;
        if !head && !holds {
            self.violations.push(format!(
                "latest head only: {} marked processing while not the head and without a slot",
                after.id
            ));
        }
    }

    /// Last green only moves forward, and only to a request stored as succeeded
    /// with the bookmarked uri (so failed, cancelled and superseded requests never
    /// move it, and the bookmark is written after the terminal write).
    fn check_green(&mut self, before: &QueueRow, after: &QueueRow) {
        let (old, new) = (&before.queue.last_green, &after.queue.last_green);
        if old == new {
            return;
        }
        let Some(new) = new else {
            self.violations.push(format!(
                "last green only moves forward: {old:?} was cleared"
            ));
            return;
        };
        if let Some(old) = old
            && new.request_id <= old.request_id
        {
            self.violations.push(format!(
                "last green only moves forward: from {} to {}",
                old.request_id, new.request_id
            ));
        }
        match self.store.requests.get(&new.request_id) {
            Some(r) if r.state == RequestState::Succeeded && r.uri == new.uri => {}
            other => self.violations.push(format!(
                "last green is a succeeded request: {} ({}) recorded while {:?}",
                new.request_id,
                new.uri,
                other.map(|r| (r.state, &r.uri))
            )),
        }
    }

    fn check_request_write(&mut self, before: &Request, after: &Request) {
        use RequestState::*;
        let allowed = matches!(
            (before.state, after.state),
            (Accepted, Accepted | Processing | Superseded | Failed)
                | (Processing, Succeeded | Failed | Cancelled)
        );
        if !allowed {
            self.violations.push(format!(
                "terminal is final / legal transitions: {} {} -> {}",
                before.id, before.state, after.state
            ));
        }
        let plan_ok = match (&before.plan, &after.plan) {
            (None, None) => after.state != Processing,
            (None, Some(_)) => before.state == Accepted && after.state == Processing,
            (Some(a), Some(b)) => a == b,
            (Some(_), None) => false,
        };
        if !plan_ok {
            self.violations
                .push(format!("plan written once with processing: {}", after.id));
        }
    }

    fn pending_for(&self, id: &RequestId, kinds: fn(&Msg) -> bool) -> bool {
        let matches = |m: &Msg| m.subject() == Some(id) && kinds(m);
        self.inbox.iter().any(|p| matches(&p.msg)) || self.active.values().any(|d| matches(&d.msg))
    }

    /// Checks the state invariants (ghost-based, so they apply to every design).
    fn check_state(&mut self) {
        let Some(row) = self.store.queue.clone() else {
            return;
        };
        let occupancy = self.design.occupancy(&row);
        let mut found = Vec::new();
        // Injected leaks are crafted excess, not admissions.
        let admitted = occupancy.saturating_sub(self.tolerated.len());
        if !self.max_lowered && admitted > self.capacity() {
            found.push(format!(
                "capacity: {occupancy} slots taken, max {}",
                self.cfg.max_concurrent
            ));
        }
        let held: u32 = self.ghost.values().sum();
        if usize::try_from(held).unwrap() != occupancy {
            found.push(format!(
                "slot accounting: {occupancy} slots taken but {held} held by requests"
            ));
        }
        for (id, n) in &self.ghost {
            if *n == 0 || self.tolerated.contains(id) {
                continue;
            }
            match self.store.requests.get(id) {
                None => found.push(format!("owners are live: {id} owns a slot but is missing")),
                Some(r) if r.state.is_terminal() => {
                    // An expired owner is failed first and pruned by the next write
                    // of the same pass (or, after a crash, by the next reconcile);
                    // an outcome or a dead letter writes the terminal state first
                    // and releases next (a redelivery after a crash too); a process
                    // delivery that claimed for it meanwhile releases on reload.
                    let expired = r.reason == Some(FailReason::SlotLeaseExpired);
                    let releasing = self.pending_for(id, |m| {
                        matches!(m, Msg::Process(_) | Msg::Outcome(..) | Msg::DeadLetter(_))
                    });
                    if !expired && !releasing {
                        found.push(format!(
                            "terminal and superseded own no slot: {id} is {} and owns a slot",
                            r.state
                        ));
                    }
                }
                Some(_) => {}
            }
        }
        // Without exception: an outcome and a dead letter both write the terminal
        // state before they release, so no step frees the slot of a processing
        // request (a stale claim would otherwise admit it a second time).
        for r in self.store.requests.values() {
            if r.state == RequestState::Processing
                && self.ghost.get(&r.id).copied().unwrap_or(0) == 0
                && !self.tolerated.contains(&r.id)
            {
                found.push(format!(
                    "processing implies owner: {} is processing without a slot",
                    r.id
                ));
            }
        }
        // Never more distinct requests with a live build than slots. Not counted:
        // builds the store already stopped, which hear it at their next heartbeat
        // (never "extended": checked where they hear it): builds of a terminal
        // request (an outcome of another of its builds, a dead letter or an
        // expiry ended it). Older generations of a request count once with the
        // newest.
        let running: BTreeSet<&RequestId> = self
            .builds
            .keys()
            .map(|(id, _)| id)
            .filter(|id| {
                self.store
                    .requests
                    .get(*id)
                    .is_some_and(|r| !r.state.is_terminal())
                    && !self.tolerated.contains(*id)
            })
            .collect();
        if !self.max_lowered && running.len() > self.capacity() {
            found.push(format!(
                "capacity: {} requests have a live build, max {}",
                running.len(),
                self.capacity()
            ));
        }
        for f in found {
            if !self.violations.contains(&f) {
                self.violations.push(f);
            }
        }
    }

    /// A hold of the subject of `d`, which owned its slot on the delivery's last
    /// read, is legitimate only while its build is unconfirmed: the request was
    /// read processing, its slot published with no heartbeat since, and the hold
    /// lasts exactly until the publication would go quiet (`resume_after` after
    /// it), so that the redelivery finds it confirmed and acks, or quiet and
    /// publishes the next generation (a delivery that recorded it may have died
    /// before handing it over). Returns when the message is due again, or `None`
    /// for any other hold of an owner: a wedge.
    fn unconfirmed_hold(&self, d: &Delivery, delay: Duration, paused: bool) -> Option<Timestamp> {
        let id = d.subject.as_ref()?;
        let request = d.request.as_ref()?;
        let slot = d.row.as_ref()?.queue.owners.get(id)?;
        let published = slot.published_at?;
        let millis = |t: Duration| u64::try_from(t.as_millis()).unwrap();
        let due = Timestamp::from_millis(d.now.as_millis() + millis(delay));
        let quiet_at =
            Timestamp::from_millis(published.as_millis() + millis(self.cfg.resume_after));
        let unconfirmed = matches!(d.msg, Msg::Process(_))
            && !paused
            && request.state == RequestState::Processing
            && slot.heartbeat_at <= published
            && due == quiet_at;
        unconfirmed.then_some(due)
    }

    fn finish(&mut self, delivery: u64, d: Delivery, end: End) {
        let owned = d
            .subject
            .as_ref()
            .is_some_and(|id| d.owned_at_load && self.ghost.get(id).copied().unwrap_or(0) > 0);
        let unconfirmed = match &end {
            End::Reply(Reply::Hold { delay, paused }) if owned => {
                self.unconfirmed_hold(&d, *delay, *paused)
            }
            _ => None,
        };
        let line = match &end {
            End::Reply(Reply::Publish { .. }) => None,
            End::Reply(reply) if unconfirmed.is_some() => Some(format!(
                "#{delivery} {}: {} (unconfirmed)",
                who(&d),
                short(reply)
            )),
            End::Reply(reply) => Some(format!("#{delivery} {}: {}", who(&d), short(reply))),
            End::StoreError => Some(format!("#{delivery} {}: store error", who(&d))),
            End::PublishFailed => Some(format!("#{delivery} {}: publish failed, retry", who(&d))),
            End::Heartbeat(answer) => Some(format!("#{delivery} {}: {}", who(&d), told(answer))),
            End::Died => Some(format!("#{delivery} {}: worker died", who(&d))),
        };
        self.trace.extend(line);
        let retry = |w: &mut Self, d: Delivery| {
            let attempts = d.attempts + 1;
            let dead =
                matches!(d.msg, Msg::Process(_) | Msg::Outcome(..)) && attempts >= w.max_attempts;
            match (dead, d.subject) {
                (true, Some(id)) => w.inbox.push_back(Pending {
                    msg: Msg::DeadLetter(id),
                    attempts: 0,
                    due: None,
                }),
                _ => w.inbox.push_back(Pending {
                    msg: d.msg,
                    attempts,
                    due: None,
                }),
            }
        };
        match end {
            End::Reply(Reply::Ack) | End::Reply(Reply::Publish { .. }) | End::Heartbeat(_) => {
                self.progress += 1;
                if let (Msg::Ingest(_), Some(id)) = (&d.msg, &d.subject) {
                    self.inbox.push_back(Pending {
                        msg: Msg::Process(id.clone()),
                        attempts: 0,
                        due: None,
                    });
                }
            }
            End::Reply(Reply::Hold { .. }) => {
                self.holds += 1;
                if let Some(id) = &d.subject
                    && owned
                    && unconfirmed.is_none()
                {
                    self.violations
                        .push(format!("no wedge: {id} is held by its own slot"));
                }
                // Redelivered after the delay when it waits for a heartbeat (as
                // the source keeps a hold's delay), at the next wake-up otherwise;
                // never a failed attempt.
                self.inbox.push_back(Pending {
                    msg: d.msg,
                    attempts: d.attempts,
                    due: unconfirmed,
                });
            }
            End::Reply(Reply::Retry(_)) | End::StoreError | End::PublishFailed => {
                self.progress += 1;
                retry(self, d);
            }
            End::Died => {
                self.progress += 1;
                self.inbox.push_back(Pending {
                    msg: d.msg,
                    attempts: d.attempts,
                    due: None,
                });
            }
            End::Reply(Reply::DeadLetter(_) | Reply::Error(_)) => {
                self.progress += 1;
                if let Some(id) = d.subject
                    && !matches!(d.msg, Msg::DeadLetter(_))
                {
                    self.inbox.push_back(Pending {
                        msg: Msg::DeadLetter(id),
                        attempts: 0,
                        due: None,
                    });
                }
            }
        }
    }

    /// Delivers everything due, finishing live builds (succeeded, one at a time,
    /// in the order [`World::finish_newest_first`] sets) when nothing else moves,
    /// and when no build is left either, moving the clock to the next time
    /// something is due (an owner's `resume_after`, or a held message's delay) and
    /// scanning for quiet owners (with a reconcile pass), until the world is
    /// quiet. Then checks that every admitted request was published. Fails on a
    /// wedge: messages remain that can only hold; and, without
    /// [`World::scans`], on an unconfirmed owner that nothing covers any more.
    pub fn drain(&mut self) -> Result<(), String> {
        for _ in 0..2_000 {
            while let Some(&id) = self.active.keys().next() {
                self.run(id);
            }
            let owners = self
                .store
                .queue
                .as_ref()
                .map_or(0, |r| r.queue.owners.len());
            if self.inbox.is_empty() && self.builds.is_empty() && owners == 0 {
                self.check_quiescent();
                return Ok(());
            }
            let before = self.progress;
            self.deliver_due();
            if self.progress != before {
                continue;
            }
            let next = if self.finish_newest_first {
                self.builds.keys().next_back()
            } else {
                self.builds.keys().next()
            };
            if let Some((id, g)) = next.cloned() {
                self.finish_generation(&id, g, BuildOutcome::Succeeded);
                continue;
            }
            if owners == 0 && self.inbox.iter().all(|p| p.due.is_none()) {
                return Err(format!(
                    "wedge: only holds remain ({} messages) with {} slots taken",
                    self.inbox.len(),
                    self.design.occupancy(self.row())
                ));
            }
            if !self.scans && self.inbox.is_empty() {
                let lost = self.unconfirmed_owners();
                if !lost.is_empty() {
                    return Err(format!(
                        "lost: owners {lost:?} have no build and no message, and no scan finds them"
                    ));
                }
            }
            self.resume_quiet();
        }
        Err("drain did not converge".to_owned())
    }

    /// Delivers, in inbox order, every message that is due (one pass: what the
    /// deliveries queue waits for the next pass), and returns how each ended.
    /// Messages held until later stay in the inbox, as a source keeps a hold's
    /// delay.
    pub fn deliver_due(&mut self) -> Vec<End> {
        let mut ends = Vec::new();
        for _ in 0..self.inbox.len() {
            let Some(pending) = self.inbox.pop_front() else {
                break;
            };
            if pending.due.is_some_and(|due| due > self.now) {
                self.inbox.push_back(pending);
                continue;
            }
            let delivery = self.start_pending(pending);
            ends.push(self.run(delivery));
        }
        ends
    }

    /// Nothing moves, no build runs, and slots are owned (or messages are held
    /// until later): their publications were lost (a worker or build died), or
    /// held messages wait for them. Moves the clock to the earliest time an owner
    /// without a pending process message goes quiet (without scans: its lease
    /// runs out) or a held message is due (not back), scans (if the source does),
    /// and queues a reconcile pass for owners that are marked expiring, expired or
    /// terminal. An owner with a pending process message is left to it: the scan
    /// would not redeliver it.
    fn resume_quiet(&mut self) {
        let owners_due: Vec<Timestamp> = self.store.queue.as_ref().map_or(Vec::new(), |row| {
            row.queue
                .owners
                .iter()
                .filter(|(id, slot)| {
                    !slot.expiring && !self.pending_for(id, |m| matches!(m, Msg::Process(_)))
                })
                .map(|(_, slot)| {
                    if self.scans {
                        slot.resume_due(self.cfg.resume_after)
                    } else {
                        slot.expires_at(self.cfg.slot_lease)
                    }
                })
                .collect()
        });
        let held = self.inbox.iter().filter_map(|p| p.due);
        let due = owners_due.into_iter().chain(held).min();
        if let Some(due) = due
            && due > self.now
        {
            self.now = due;
            self.trace.push(format!("clock {due}"));
        }
        if self.scans {
            self.scan();
        }
        self.inbox.push_back(Pending {
            msg: Msg::Reconcile,
            attempts: 0,
            due: None,
        });
    }

    /// The owners (by sequence number) of a live request whose build was never
    /// handed over (nothing published, or no heartbeat since the publication),
    /// and whose slot is neither marked expiring nor past its lease: only a
    /// process message publishes it. (A build that stops after its handover is
    /// found by a scan, or failed by its lease.)
    fn unconfirmed_owners(&self) -> Vec<u64> {
        self.store.queue.as_ref().map_or(Vec::new(), |row| {
            row.queue
                .owners
                .iter()
                .filter(|(id, slot)| {
                    !slot.expiring
                        && !slot.expired(self.cfg.slot_lease, self.now)
                        && slot
                            .published_at
                            .is_none_or(|published| slot.heartbeat_at <= published)
                        && self
                            .store
                            .requests
                            .get(*id)
                            .is_some_and(|r| !r.state.is_terminal())
                })
                .map(|(id, _)| id.seq())
                .collect()
        })
    }

    /// At quiescence: every request that was marked processing had at least one
    /// generation published, unless a dead letter or its lease expiry failed it
    /// before any publication could happen.
    fn check_quiescent(&mut self) {
        for id in &self.marked {
            if self.published.iter().any(|(r, _)| r == id) {
                continue;
            }
            let request = self.store.requests.get(id);
            let failed_first = request.is_some_and(|r| {
                r.state == RequestState::Failed
                    && matches!(
                        r.reason,
                        Some(FailReason::DeadLettered | FailReason::SlotLeaseExpired)
                    )
            });
            if !failed_first {
                let state = request.map_or("missing".to_owned(), |r| r.state.to_string());
                self.violations.push(format!(
                    "every admitted request is published: {id} was marked processing and is {state} without a publication"
                ));
            }
        }
    }

    /// After a drain: no slot is taken and every request is terminal.
    pub fn assert_drained_clean(&self) {
        assert_eq!(self.violations, Vec::<String>::new(), "{:#?}", self.trace);
        assert_eq!(self.design.occupancy(self.row()), 0, "{:#?}", self.trace);
        for r in self.store.requests.values() {
            assert!(
                r.state.is_terminal(),
                "{} is {}: {:#?}",
                r.id,
                r.state,
                self.trace
            );
        }
    }
}

fn who(d: &Delivery) -> String {
    let kind = match &d.msg {
        Msg::Ingest(_) => "ingest",
        Msg::Process(_) => "process",
        Msg::Outcome(..) => "outcome",
        Msg::DeadLetter(_) => "dead-letter",
        Msg::Reconcile => "reconcile",
        Msg::Heartbeat(..) => "heartbeat",
    };
    match (&d.msg, &d.subject) {
        (Msg::Heartbeat(_, g), Some(id)) => format!("{kind} {} g{g}", id.seq()),
        (_, Some(id)) => format!("{kind} {}", id.seq()),
        (_, None) => kind.to_owned(),
    }
}

/// A heartbeat answer as the trace shows it.
fn told(answer: &Heartbeat) -> String {
    match answer {
        Heartbeat::Extended { expires_at } => format!("extended until {expires_at}"),
        Heartbeat::NotOwner { state } => match state {
            Some(state) => format!("not owner ({state})"),
            None => "not owner (missing)".to_owned(),
        },
        Heartbeat::LeaseExpired { expired_at } => format!("lease expired at {expired_at}"),
        Heartbeat::Stale { current } => format!("stale (current g{current})"),
    }
}

fn short(reply: &Reply) -> String {
    match reply {
        Reply::Ack => "ack".to_owned(),
        Reply::Hold { delay, paused } => {
            let why = if *paused { " (paused)" } else { "" };
            format!("hold {}ms{why}", delay.as_millis())
        }
        Reply::Retry(_) => "retry".to_owned(),
        Reply::DeadLetter(_) => "dead-letter".to_owned(),
        Reply::Publish { .. } => "publish".to_owned(),
        Reply::Error(e) => format!("error: {e}"),
    }
}
