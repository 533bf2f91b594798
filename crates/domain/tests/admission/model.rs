//! The model harness: an in-memory versioned store that executes admission
//! decisions like the app does (load the request, then the queue, decide, attempt
//! one compare-and-set, reload), with injectable faults, and checks the invariants
//! of `docs/admission.md` after every step.
//!
//! The harness is generic over a [`Design`], so the same scripts run against the
//! owner-keyed rules of `holdfast_domain::admission` and against the old
//! anonymous-count design (the oracle in `oracle.rs`). Slot ownership is tracked by
//! a ghost map (who claimed, who released), which is what makes the invariants
//! checkable for a design that does not record owners.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use holdfast_domain::admission::{
    AdmissionConfig, AncestryAnswer, AncestryFact, BuildOutcome, Decision, LoadedRequests, Need,
    ProcessMemo, QueueWrite, Reply, RequestWrite, Write, decide_ingest,
};
use holdfast_domain::{
    FailReason, LastGreen, Queue, QueueName, Request, RequestId, RequestState, RevisionUri, Slot,
    Timestamp, Version,
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
    /// The running build of the request is alive (owner-keyed design only).
    Heartbeat(RequestId),
}

impl Msg {
    fn subject(&self) -> Option<&RequestId> {
        match self {
            Msg::Process(id) | Msg::Outcome(id, _) | Msg::DeadLetter(id) | Msg::Heartbeat(id) => {
                Some(id)
            }
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
    /// Decides a heartbeat; a design without slot leases has nothing to extend.
    fn heartbeat(&self, _cfg: &AdmissionConfig, _view: &View<'_>) -> Act {
        Act::Reply(Reply::Ack)
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

    fn heartbeat(&self, cfg: &AdmissionConfig, view: &View<'_>) -> Act {
        act(
            holdfast_domain::admission::decide_heartbeat(
                view.request,
                view.row.map(|r| &r.queue),
                cfg.slot_lease,
                view.now,
            ),
            view.row,
        )
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
    /// Publishing the build fails; the delivery retries.
    PublishFails,
}

/// How a delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The design replied.
    Reply(Reply),
    /// A store operation failed (injected): the message is retried.
    StoreError,
    /// Publishing failed (injected): the message is retried.
    PublishFailed,
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
    /// Builds published and still running.
    pub builds: BTreeSet<RequestId>,
    /// Every publish, in order.
    pub published: Vec<RequestId>,
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
    /// The model clock: what every delivery passes as "now".
    pub now: Timestamp,
    progress: u64,
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
            builds: BTreeSet::new(),
            published: Vec::new(),
            ancestry: BTreeMap::new(),
            ghost: BTreeMap::new(),
            tolerated: BTreeSet::new(),
            max_lowered: false,
            violations: Vec::new(),
            trace: Vec::new(),
            holds: 0,
            finish_newest_first: false,
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
        if !terminal
            || row
                .queue
                .owners
                .insert(id.clone(), Slot::claimed(self.now))
                .is_some()
        {
            return;
        }
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
        self.start_pending(Pending { msg, attempts: 0 })
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

    /// Ends the running build of `id` with `outcome`: its outcome message is queued.
    pub fn finish_build(&mut self, id: &RequestId, outcome: BuildOutcome) {
        self.builds.remove(id);
        self.inbox.push_back(Pending {
            msg: Msg::Outcome(id.clone(), outcome),
            attempts: 0,
        });
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
                now: self.now,
                applied: &d.applied,
            };
            let act = match &d.msg {
                Msg::Ingest(_) => match d.request.as_ref() {
                    Some(request) => act(
                        decide_ingest(&self.cfg, request, d.row.as_ref().map(|r| &r.queue)),
                        d.row.as_ref(),
                    ),
                    None => Act::Reply(Reply::Ack),
                },
                Msg::Process(id) => self.design.process(&self.cfg, id, &view),
                Msg::Outcome(_, outcome) => self.design.outcome(&view, *outcome),
                Msg::DeadLetter(_) => self.design.dead_letter(&view),
                Msg::Reconcile => self.design.reconcile(&self.cfg, &view),
                Msg::Heartbeat(_) => self.design.heartbeat(&self.cfg, &view),
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
                Act::Reply(Reply::Publish { request, plan }) => {
                    if let Some(("publish", Fault::PublishFails)) = d.fault {
                        d.fault = None;
                        return StepResult::Ended(End::PublishFailed);
                    }
                    if request.plan.as_ref() != Some(&plan) {
                        self.violations.push(format!(
                            "publish of {} with a plan other than the stored one",
                            request.id
                        ));
                    }
                    // Decided on the delivery's last read: the slot may have been
                    // released since (a republish racing its outcome), never before.
                    if !d.owned_at_load {
                        self.violations.push(format!(
                            "publish only for a slot owner: {} published without a slot",
                            request.id
                        ));
                    }
                    self.builds.insert(request.id.clone());
                    self.published.push(request.id.clone());
                    let running = self
                        .builds
                        .iter()
                        .filter(|id| {
                            self.store
                                .requests
                                .get(*id)
                                .is_some_and(|r| !r.state.is_terminal())
                        })
                        .count();
                    if !self.max_lowered && running > self.capacity() {
                        self.violations.push(format!(
                            "capacity: {running} builds running, max {}",
                            self.capacity()
                        ));
                    }
                    self.trace
                        .push(format!("#{delivery} publish {}", request.id));
                    return StepResult::Ended(End::Reply(Reply::Publish { request, plan }));
                }
                Act::Reply(reply) => return StepResult::Ended(End::Reply(reply)),
                Act::Write(write) => {
                    let fault = match d.fault {
                        Some((label, fault))
                            if fault != Fault::PublishFails
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
                        }
                        // Loaded owners stay current, as the app keeps them.
                        if let Target::Request { request, .. } = &write.target
                            && let Some(owner) = d.owners.get_mut(&request.id)
                        {
                            *owner = Some(request.clone());
                        }
                    }
                    if fault == Some(Fault::CommitThenError) {
                        return StepResult::Ended(End::StoreError);
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
        let owners: Vec<String> = row
            .queue
            .owners
            .keys()
            .map(|i| i.seq().to_string())
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
                    // a dead letter fails first and releases next.
                    let expired = r.reason == Some(FailReason::SlotLeaseExpired);
                    let releasing =
                        self.pending_for(id, |m| matches!(m, Msg::Process(_) | Msg::DeadLetter(_)));
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
        for r in self.store.requests.values() {
            if r.state == RequestState::Processing
                && self.ghost.get(&r.id).copied().unwrap_or(0) == 0
                && !self.tolerated.contains(&r.id)
                && !self.pending_for(&r.id, |m| {
                    matches!(m, Msg::Outcome(..) | Msg::DeadLetter(_))
                })
            {
                found.push(format!(
                    "processing implies owner: {} is processing without a slot",
                    r.id
                ));
            }
        }
        for f in found {
            if !self.violations.contains(&f) {
                self.violations.push(f);
            }
        }
    }

    fn finish(&mut self, delivery: u64, d: Delivery, end: End) {
        let line = match &end {
            End::Reply(Reply::Publish { .. }) => None,
            End::Reply(reply) => Some(format!("#{delivery} {}: {}", who(&d), short(reply))),
            End::StoreError => Some(format!("#{delivery} {}: store error", who(&d))),
            End::PublishFailed => Some(format!("#{delivery} {}: publish failed", who(&d))),
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
                }),
                _ => w.inbox.push_back(Pending {
                    msg: d.msg,
                    attempts,
                }),
            }
        };
        match end {
            End::Reply(Reply::Ack) | End::Reply(Reply::Publish { .. }) => {
                self.progress += 1;
                if let (Msg::Ingest(_), Some(id)) = (&d.msg, &d.subject) {
                    self.inbox.push_back(Pending {
                        msg: Msg::Process(id.clone()),
                        attempts: 0,
                    });
                }
            }
            End::Reply(Reply::Hold { .. }) => {
                self.holds += 1;
                if let Some(id) = &d.subject
                    && d.owned_at_load
                    && self.ghost.get(id).copied().unwrap_or(0) > 0
                {
                    self.violations
                        .push(format!("no wedge: {id} is held by its own slot"));
                }
                self.inbox.push_back(Pending {
                    msg: d.msg,
                    attempts: d.attempts,
                });
            }
            End::Reply(Reply::Retry(_)) | End::StoreError | End::PublishFailed => {
                self.progress += 1;
                retry(self, d);
            }
            End::Reply(Reply::DeadLetter(_) | Reply::Error(_)) => {
                self.progress += 1;
                if let Some(id) = d.subject
                    && !matches!(d.msg, Msg::DeadLetter(_))
                {
                    self.inbox.push_back(Pending {
                        msg: Msg::DeadLetter(id),
                        attempts: 0,
                    });
                }
            }
        }
    }

    /// Delivers everything, finishing running builds (succeeded, one at a time, in
    /// the order [`World::finish_newest_first`] sets) when nothing else moves, until
    /// the world is quiet. Fails on a wedge: messages remain that can
    /// only hold.
    pub fn drain(&mut self) -> Result<(), String> {
        for _ in 0..2_000 {
            while let Some(&id) = self.active.keys().next() {
                self.run(id);
            }
            if self.inbox.is_empty() && self.builds.is_empty() {
                return Ok(());
            }
            let before = self.progress;
            for _ in 0..self.inbox.len() {
                if let Some(id) = self.start_inbox(0) {
                    self.run(id);
                }
            }
            if self.progress == before {
                let next = if self.finish_newest_first {
                    self.builds.iter().next_back()
                } else {
                    self.builds.iter().next()
                };
                match next.cloned() {
                    Some(id) => self.finish_build(&id, BuildOutcome::Succeeded),
                    None => {
                        return Err(format!(
                            "wedge: only holds remain ({} messages) with {} slots taken",
                            self.inbox.len(),
                            self.design.occupancy(self.row())
                        ));
                    }
                }
            }
        }
        Err("drain did not converge".to_owned())
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
        Msg::Heartbeat(_) => "heartbeat",
    };
    match &d.subject {
        Some(id) => format!("{kind} {}", id.seq()),
        None => kind.to_owned(),
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
