//! A crash between any two admission writes, on a real database (SQLite file and
//! PostgreSQL), leaves a state from which redelivery drains with every invariant of
//! invariants of `docs/admission.md` intact.
//!
//! Needs the cargo feature `failpoints` (`[[test]] required-features`): admission
//! then aborts the process at the point named by `HOLDFAST_FAILPOINT`
//! (`<step>:<write>:<before|after>:<n>`, see `holdfast::failpoint`).
//!
//! How a run goes: a child process (this test binary re-executed, `harness = false`)
//! plays a fixed scenario of admission messages (ingests, processes, outcomes, dead
//! letters) against the database, one message at a time in lockstep with the parent
//! over its stdin and stdout: it announces each message and waits for `go`, so the
//! parent reads and checks the stored state between messages, never by sleeping.
//! The points are enumerated from the code: a first, unarmed child plays the whole
//! scenario and lists every point its writes passed (`holdfast::failpoint::passed`);
//! the test also requires that list to contain, for every write kind of the domain
//! (exhaustive matches below, so a new kind does not compile until it is placed),
//! both sides of the writes every step makes (ingest with its request creation,
//! process, outcome, dead letter, heartbeat, set-limit, reconcile, backfill). Then, for each
//! point, on a fresh database: a child armed with it aborts there
//! (`std::process::abort`); the parent (a new process for the database) redelivers
//! the interrupted message, plays the rest of the scenario and drains (processes
//! every non-terminal request, gives every admitted one an outcome) until every
//! request is terminal.
//!
//! Checked on the stored state after every message, after the crash and after
//! every redelivery and drain step: |owners| <= max_concurrent; at most one slot per
//! request (the stored owner rows are distinct); owners are live requests;
//! terminal and superseded requests own no slot; processing implies owning a slot
//! (except for the interrupted message's request between the crash and its
//! redelivery: a crash between an outcome's release and its terminal write leaves
//! it processing without a slot, which the redelivery finishes); only the latest
//! head is admitted (a request that became processing is the latest head); a slot
//! is released only by its owner's message or pruned because its request is
//! terminal; terminal states are final. At the end: no wedge (everything drained,
//! every slot free).
//!
//! One message of the scenario writes a state no single sequential writer can:
//! a terminal request still owning a slot (a release missed by an older writer, or
//! lost in a race), written straight to the store, so that process's prune write
//! has failpoints too; the checks allow that one stale owner until it is pruned.
//! Another loses the reply of an applied claim (the store call fails after the
//! write), so that a later redelivery finds an accepted request owning a slot after
//! a newer head arrived: the fence, release and supersede writes (and, later, a
//! dead letter of an accepted owner). Another writes a processing request without a slot, as
//! binaries that counted slots anonymously left it, for the backfill. The scenario
//! clock moves a second per event and jumps past the slot lease once, so a
//! reconcile expires an owner.

#[path = "../../adapters-postgres/tests/support/mod.rs"]
mod pg_support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write as _};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use holdfast::admission::{reply_label, write_label};
use holdfast::backend::{Backend, BackendOptions};
use holdfast::crash::{CrashPlan, CrashingQueues, Fate, WriteCall};
use holdfast::failpoint;
use holdfast::{Admission, AdmissionPolicy, NoAncestry};
use holdfast_domain::admission::invariants::{Violation, stored_violations};
use holdfast_domain::admission::{QueueWrite, RequestWrite};
use holdfast_domain::{
    AdmissionConfig, BuildOutcome, FailReason, Heartbeat, Queue, QueueName, Reply, Request,
    RequestId, RequestState, RevisionUri, Slot, Timestamp, Version, Write,
};
use holdfast_ports::{CasOutcome, Clock, QueueStore};
use libtest_mimic::{Arguments, Trial};
use sqlx::{Connection, PgConnection};
use tokio::runtime::Runtime;

use pg_support::TestDb;

const CHILD_ENV: &str = "HOLDFAST_ADMISSION_CRASH_CHILD";
/// Slots of the scenario's queue.
const MAX_CONCURRENT: u32 = 2;
/// What the store wrapper of [`Event::ProcessLosingReply`] answers after the write.
const LOST_REPLY: &str = "reply lost after the write was applied (injected)";
/// Drain rounds before the test calls the queue wedged.
const DRAIN_ROUNDS: usize = 8;
/// The scenario's slot lease; events are a second apart, so only a
/// [`Event::Tick`] makes an owner's lease run out.
const SLOT_LEASE_MS: u64 = 60_000;

fn main() -> ExitCode {
    if std::env::var_os(CHILD_ENV).is_some() {
        return child::run();
    }
    // libtest-mimic implements the libtest command line that cargo test and cargo
    // nextest drive (filters, --exact, --list --format terse, --ignored, ...). The
    // tests run one after another, as under the hand-written runner this replaced,
    // unless --test-threads says otherwise: each already keeps child processes busy.
    let mut args = Arguments::from_args();
    if args.test_threads.is_none() {
        args.test_threads = Some(1);
    }
    let trials = vec![
        Trial::test(
            "every_failpoint_on_sqlite_redelivery_drains_with_the_invariants",
            || {
                every_failpoint_on_sqlite_redelivery_drains_with_the_invariants();
                Ok(())
            },
        ),
        Trial::test(
            "every_failpoint_on_postgres_redelivery_drains_with_the_invariants",
            || {
                every_failpoint_on_postgres_redelivery_drains_with_the_invariants();
                Ok(())
            },
        ),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

// ---------------------------------------------------------------------------------
// The scenario.
// ---------------------------------------------------------------------------------

/// One admission message (or, for [`Event::LeakSlot`], a direct store write). `k`
/// names the k-th ingested revision, which is request `request/main/k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Ingest(u64),
    Process(u64),
    /// A process delivery whose store reports a failure right after applying the
    /// claim: the message is not acknowledged and is redelivered later.
    ProcessLosingReply(u64),
    Outcome(u64, BuildOutcome),
    DeadLetter(u64),
    /// Writes request k (terminal) back into the owners, as a release missed by an
    /// older writer leaves it.
    LeakSlot(u64),
    /// The running build of request k extends its slot lease.
    Heartbeat(u64),
    /// The publish of request k's build failed: its publication is withdrawn.
    Withdraw(u64),
    /// `queue set-limit`: the stored slot limit (0 pauses the queue).
    SetLimit(u32),
    /// The scenario clock jumps past the slot lease: every owner without a later
    /// heartbeat is expired from here on.
    Tick,
    /// A reconcile pass (`queue reconcile`, or the periodic one).
    Reconcile,
    /// Writes request k (the accepted head) as processing without a slot, as
    /// binaries that counted slots anonymously left their admitted requests.
    Orphan(u64),
    /// The migration from an anonymous count (`queue backfill`).
    Backfill,
}

impl Event {
    /// The request whose slot this message may release.
    fn target(self) -> Option<u64> {
        match self {
            Event::Ingest(_)
            | Event::LeakSlot(_)
            | Event::Heartbeat(_)
            | Event::Withdraw(_)
            | Event::SetLimit(_)
            | Event::Tick
            | Event::Reconcile
            | Event::Orphan(_)
            | Event::Backfill => None,
            Event::Process(k)
            | Event::ProcessLosingReply(k)
            | Event::Outcome(k, _)
            | Event::DeadLetter(k) => Some(k),
        }
    }
}

/// The scenario, with `max_concurrent = 2`. Comments give the writes of an
/// uninterrupted run.
const SCENARIO: &[Event] = &[
    Event::Ingest(1),                            // stamp
    Event::Process(1),                           // claim, mark, publish
    Event::Outcome(1, BuildOutcome::Succeeded),  // finish, release, record_green
    Event::LeakSlot(1),                          // owners {1}: 1 is terminal
    Event::Ingest(2),                            // stamp
    Event::Process(2),                           // claim, mark: owners {1, 2}
    Event::Ingest(3),                            // stamp
    Event::Process(3),                           // gate closed: prune 1, claim, mark
    Event::Outcome(2, BuildOutcome::Failed),     // finish, release: owners {3}
    Event::Ingest(4),                            // stamp
    Event::ProcessLosingReply(4),                // claim (reply lost): owners {3, 4}
    Event::Ingest(5),                            // stamp
    Event::Process(5),                           // gate closed, nothing to prune: hold
    Event::Process(4),                           // not the head: fence, release, supersede
    Event::Process(5),                           // claim, mark: owners {3, 5}
    Event::DeadLetter(3),                        // release, fail: owners {5}
    Event::Ingest(6),                            // stamp
    Event::DeadLetter(6),                        // accepted without a slot: fail
    Event::Ingest(7),                            // stamp
    Event::Ingest(8),                            // stamp
    Event::Process(7),                           // not the head: supersede
    Event::Process(8),                           // claim, mark: owners {5, 8}
    Event::Outcome(5, BuildOutcome::Cancelled),  // finish, release: owners {8}
    Event::DeadLetter(8),                        // release, fail: owners {}
    Event::Ingest(9),                            // stamp
    Event::ProcessLosingReply(9),                // claim (reply lost): owners {9}
    Event::DeadLetter(9),                        // accepted owner: fence, release, fail
    Event::Ingest(10),                           // stamp
    Event::SetLimit(0),                          // set_limit: paused
    Event::Process(10),                          // paused: hold
    Event::SetLimit(2),                          // set_limit
    Event::Process(10),                          // claim, mark: owners {10}
    Event::Heartbeat(10),                        // heartbeat
    Event::Tick,                                 // 10's lease runs out
    Event::Reconcile,                            // mark, expire 10, prune: owners {}
    Event::Ingest(11),                           // stamp
    Event::Process(11),                          // claim, mark, publish: owners {11}
    Event::Withdraw(11),                         // withdraw: its publish failed
    Event::Process(11),                          // publish generation 2
    Event::Outcome(11, BuildOutcome::Succeeded), // finish, release, record_green
    Event::Ingest(12),                           // stamp
    Event::Orphan(12),                           // processing without a slot (old binaries)
    Event::Backfill,                             // backfill: owners {12}
    Event::Outcome(12, BuildOutcome::Succeeded), // finish, release, record_green
];

/// The scenario clock when event `i` plays (and, for `i = SCENARIO.len()`, when
/// the drain runs): a second per event, plus a lease for every [`Event::Tick`]
/// before it.
fn now_at(i: usize) -> Timestamp {
    let ticks = SCENARIO[..i.min(SCENARIO.len())]
        .iter()
        .filter(|e| **e == Event::Tick)
        .count();
    let (i, ticks) = (
        u64::try_from(i).expect("small"),
        u64::try_from(ticks).expect("small"),
    );
    Timestamp::from_millis(1_800_000_000_000 + i * 1_000 + ticks * (SLOT_LEASE_MS + 1_000))
}

/// A clock stopped at one instant.
struct At(Timestamp);

impl Clock for At {
    fn now(&self) -> Timestamp {
        self.0
    }
}

/// The queue of run `n`. Every run on PostgreSQL shares one database (creating a
/// database takes half a second there); nothing in admission reads across queues,
/// so a queue of its own is as fresh a start as a database of its own.
fn queue_name(n: usize) -> QueueName {
    QueueName::new(format!("run{n}")).expect("queue name")
}

fn request(queue: &QueueName, k: u64) -> RequestId {
    RequestId::new(queue.clone(), k)
}

fn uri(k: u64) -> RevisionUri {
    RevisionUri::new(format!("rev-{k}")).expect("uri")
}

fn policy() -> AdmissionPolicy {
    AdmissionPolicy {
        default: AdmissionConfig {
            max_concurrent: MAX_CONCURRENT,
            slot_lease: std::time::Duration::from_millis(SLOT_LEASE_MS),
            ..AdmissionConfig::default()
        },
        ..AdmissionPolicy::default()
    }
}

fn admission(queues: Arc<dyn QueueStore>, now: Timestamp) -> Admission {
    Admission::new(queues, Arc::new(NoAncestry), policy()).with_clock(Arc::new(At(now)))
}

/// A reply the scenario accepts: anything but an error or a dead letter.
fn accept(reply: &Reply) -> Result<String, String> {
    match reply {
        Reply::Ack | Reply::Hold { .. } | Reply::Publish { .. } => {
            Ok(reply_label(reply).to_owned())
        }
        Reply::Retry(_) | Reply::DeadLetter(_) | Reply::Error(_) => {
            Err(format!("unexpected reply {reply:?}"))
        }
    }
}

/// The generation last published for request k: what its build carries.
async fn generation(
    queues: &Arc<dyn QueueStore>,
    queue: &QueueName,
    k: u64,
) -> Result<holdfast_domain::Generation, String> {
    let stored = queues
        .load_queue(queue)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no queue")?;
    Ok(stored
        .owners
        .get(&request(queue, k))
        .map_or(holdfast_domain::Generation::NONE, |slot| slot.generation))
}

/// Plays one event at `now`; `Ok` names the reply.
async fn play(
    queues: &Arc<dyn QueueStore>,
    queue: &QueueName,
    event: Event,
    now: Timestamp,
) -> Result<String, String> {
    let plain = admission(Arc::clone(queues), now);
    match event {
        Event::Ingest(k) => {
            let ingest = plain
                .ingest(queue, &uri(k))
                .await
                .map_err(|e| e.to_string())?;
            if ingest.request.id != request(queue, k) {
                return Err(format!(
                    "revision {k} was ingested as {}; expected {}",
                    ingest.request.id,
                    request(queue, k)
                ));
            }
            accept(&ingest.reply)
        }
        Event::Process(k) => accept(
            &plain
                .process(&request(queue, k))
                .await
                .map_err(|e| e.to_string())?,
        ),
        Event::ProcessLosingReply(k) => {
            let lossy: Arc<dyn QueueStore> = Arc::new(CrashingQueues::new(
                Arc::clone(queues),
                LosesClaimReply {
                    claimer: request(queue, k),
                    lost: AtomicBool::new(false),
                },
            ));
            match admission(lossy, now).process(&request(queue, k)).await {
                Ok(reply) => accept(&reply),
                Err(e) if e.to_string().contains(LOST_REPLY) => Ok("lost reply".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        }
        Event::Outcome(k, outcome) => accept(
            &plain
                .outcome(&request(queue, k), outcome)
                .await
                .map_err(|e| e.to_string())?,
        ),
        Event::DeadLetter(k) => accept(
            &plain
                .dead_letter(&request(queue, k))
                .await
                .map_err(|e| e.to_string())?,
        ),
        Event::LeakSlot(k) => {
            let stored = queues
                .load_queue(queue)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no queue to leak a slot in")?;
            let mut next = stored.clone();
            next.owners.insert(request(queue, k), Slot::claimed(now));
            next.version = stored.version.next();
            match queues.cas_queue(stored.version, &next).await {
                Ok(CasOutcome::Applied) => Ok("leaked".to_owned()),
                other => Err(format!("leaking a slot: {other:?}")),
            }
        }
        Event::Heartbeat(k) => match plain
            .heartbeat(&request(queue, k), generation(queues, queue, k).await?)
            .await
        {
            // A redelivered heartbeat after a crash may find the lease extended.
            Ok(Heartbeat::Extended { .. }) => Ok("extended".to_owned()),
            Ok(other) => Err(format!("heartbeat of an owner answered {other:?}")),
            Err(e) => Err(e.to_string()),
        },
        Event::Withdraw(k) => plain
            .withdraw(&request(queue, k), generation(queues, queue, k).await?)
            .await
            .map(|()| "withdrawn".to_owned())
            .map_err(|e| e.to_string()),
        Event::SetLimit(max) => plain
            .set_limit(queue, max)
            .await
            .map(|()| "limit set".to_owned())
            .map_err(|e| e.to_string()),
        Event::Tick => Ok("tick".to_owned()),
        Event::Reconcile => plain
            .reconcile(queue)
            .await
            .map(|done| format!("pruned {}", done.pruned.len()))
            .map_err(|e| e.to_string()),
        Event::Orphan(k) => {
            let id = request(queue, k);
            let stored = queues
                .load_request(&id)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no request to orphan")?;
            let admitted = Request {
                state: RequestState::Processing,
                plan: Some(holdfast_domain::BuildPlan {
                    strategy: holdfast_domain::BuildStrategy::Full,
                    base: None,
                }),
                ..stored.clone()
            };
            match queues.cas_request(stored.version, &admitted).await {
                Ok(CasOutcome::Applied) => Ok("orphaned".to_owned()),
                other => Err(format!("orphaning a request: {other:?}")),
            }
        }
        Event::Backfill => plain
            .backfill(queue)
            .await
            .map(|done| format!("added {}", done.added.len()))
            .map_err(|e| e.to_string()),
    }
}

/// Loses the reply of the first queue write that gives `claimer` a slot: the
/// write happens, the caller cannot know.
struct LosesClaimReply {
    claimer: RequestId,
    lost: AtomicBool,
}

impl CrashPlan for LosesClaimReply {
    fn fate(&self, write: WriteCall<'_>) -> Fate {
        match write {
            WriteCall::Queue(queue)
                if queue.owners.contains_key(&self.claimer)
                    && !self.lost.swap(true, Ordering::SeqCst) =>
            {
                Fate::CrashAfter(LOST_REPLY.to_owned())
            }
            _ => Fate::Proceed,
        }
    }
}

// ---------------------------------------------------------------------------------
// The child: plays the scenario in lockstep with the parent.
// ---------------------------------------------------------------------------------

mod child {
    use super::*;

    /// Protocol (one line each): `event <i>` then waits for a line on stdin; after
    /// the event `ok <i> <reply>` or `error <i> <message>`; at the end `done`, one
    /// `passed <point>` per failpoint reached, and `end`.
    pub fn run() -> ExitCode {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let [url, queue] = args.as_slice() else {
            eprintln!("child: expected the database URL and the queue name as arguments");
            return ExitCode::from(2);
        };
        let queue = match QueueName::new(queue.as_str()) {
            Ok(queue) => queue,
            Err(e) => {
                eprintln!("child: {e}");
                return ExitCode::from(2);
            }
        };
        let rt = runtime();
        let backend = match rt.block_on(Backend::open(url, &BackendOptions::default())) {
            Ok(backend) => backend,
            Err(e) => {
                eprintln!("child: opening the database: {e}");
                return ExitCode::from(3);
            }
        };
        let queues = backend.stores().queues;
        let mut stdin = std::io::stdin().lock();
        let mut out = std::io::stdout().lock();
        for (i, event) in SCENARIO.iter().enumerate() {
            let _ = writeln!(out, "event {i}");
            let _ = out.flush();
            let mut go = String::new();
            if stdin.read_line(&mut go).unwrap_or(0) == 0 {
                return ExitCode::from(4);
            }
            let line = match rt.block_on(play(&queues, &queue, *event, now_at(i))) {
                Ok(reply) => format!("ok {i} {reply}"),
                Err(e) => format!("error {i} {}", e.replace('\n', " ")),
            };
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(out, "done");
        for point in failpoint::passed() {
            let _ = writeln!(out, "passed {point}");
        }
        let _ = writeln!(out, "end");
        let _ = out.flush();
        rt.block_on(backend.close());
        ExitCode::SUCCESS
    }
}

// ---------------------------------------------------------------------------------
// The stored state and the invariants.
// ---------------------------------------------------------------------------------

/// Where the test database is, for the raw owner-row count.
enum Raw {
    Sqlite(PathBuf),
    Postgres(PgConnection),
}

/// The stored state of the scenario's queue.
#[derive(Debug, Clone, Default)]
struct State {
    queue: Option<Queue>,
    requests: BTreeMap<RequestId, Request>,
    /// Stored owner rows (SQLite: `queue_owners` rows; PostgreSQL: array elements).
    owner_rows: i64,
    /// Distinct stored owner rows.
    distinct_owner_rows: i64,
}

impl State {
    fn owners(&self) -> BTreeSet<RequestId> {
        self.queue
            .as_ref()
            .map(|q| q.owners.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn state_of(&self, id: &RequestId) -> Option<RequestState> {
        self.requests.get(id).map(|r| r.state)
    }
}

/// The parent's view of the database: a backend of its own and a raw connection.
struct Observer {
    backend: Backend,
    queue: QueueName,
    raw: Raw,
    /// Terminal owners written by [`Event::LeakSlot`] and not yet pruned.
    leaked: BTreeSet<RequestId>,
    /// Processing requests written by [`Event::Orphan`] and not yet backfilled.
    orphaned: BTreeSet<RequestId>,
}

impl Observer {
    async fn snapshot(&mut self) -> State {
        let queues = self.backend.stores().queues;
        let queue = queues.load_queue(&self.queue).await.expect("load queue");
        let requests = queues
            .list_requests(&self.queue, 1000)
            .await
            .expect("list requests")
            .into_iter()
            .map(|r| (r.id.clone(), r))
            .collect();
        let (owner_rows, distinct_owner_rows) = match &mut self.raw {
            Raw::Sqlite(path) => {
                let conn = rusqlite::Connection::open_with_flags(
                    path,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
                )
                .expect("open the SQLite file read-only");
                conn.query_row(
                    "SELECT count(*), count(DISTINCT request) FROM queue_owners WHERE queue = ?1",
                    [self.queue.as_str()],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .expect("count owner rows")
            }
            Raw::Postgres(conn) => sqlx::query_as::<_, (i64, i64)>(
                "SELECT COALESCE(SUM(cardinality(owners)), 0)::BIGINT, \
                 (SELECT count(DISTINCT o) FROM queues, unnest(owners) AS o WHERE name = $1) \
                 FROM queues WHERE name = $1",
            )
            .bind(self.queue.as_str())
            .fetch_optional(&mut *conn)
            .await
            .expect("count owner elements")
            .unwrap_or((0, 0)),
        };
        State {
            queue,
            requests,
            owner_rows,
            distinct_owner_rows,
        }
    }
}

/// What may differ from the invariants at a check.
#[derive(Debug, Clone, Default)]
struct Allow {
    /// The interrupted message's request (after a crash, before its redelivery) may
    /// be processing without a slot.
    interrupted: Option<RequestId>,
}

/// Whether `id` is stored as failed because its slot lease ran out.
fn expired(state: &State, id: &RequestId) -> bool {
    state
        .requests
        .get(id)
        .is_some_and(|r| r.reason == Some(FailReason::SlotLeaseExpired))
}

/// The invariants of one state. Returns the violations.
///
/// The stored-state rules are the domain's ([`stored_violations`]), less what this
/// check allows: the terminal owners written by [`Event::LeakSlot`] until they are
/// pruned, and the interrupted message's request processing without a slot.
fn state_violations(
    state: &State,
    name: &QueueName,
    crafted: (&BTreeSet<RequestId>, &BTreeSet<RequestId>),
    allow: Allow,
) -> Vec<String> {
    let (leaked, orphaned) = crafted;
    let queue = state
        .queue
        .clone()
        .unwrap_or_else(|| Queue::new(name.clone()));
    let mut bad: Vec<String> = stored_violations(&queue, state.requests.values(), MAX_CONCURRENT)
        .into_iter()
        .filter(|v| match v {
            // A reconcile fails an expired owner, then prunes it; a crash in between
            // leaves it to the redelivered pass.
            // So does a dead letter (failed first, released next) interrupted
            // between its writes, until it is redelivered.
            Violation::TerminalOwner { owner, .. } => {
                !leaked.contains(owner)
                    && !expired(state, owner)
                    && allow.interrupted.as_ref() != Some(owner)
            }
            Violation::ProcessingWithoutSlot { request } => {
                allow.interrupted.as_ref() != Some(request) && !orphaned.contains(request)
            }
            Violation::TooManyOwners { .. } | Violation::OwnerMissing { .. } => true,
        })
        .map(|v| v.to_string())
        .collect();
    let owners = &queue.owners;
    if state.owner_rows != state.distinct_owner_rows
        || state.owner_rows != i64::try_from(owners.len()).expect("small")
    {
        bad.push(format!(
            "{} stored owner rows, {} distinct, {} owners: a request holds two slots",
            state.owner_rows,
            state.distinct_owner_rows,
            owners.len()
        ));
    }
    for r in state.requests.values() {
        if r.state == RequestState::Processing && r.plan.is_none() {
            bad.push(format!("{} is processing without a build plan", r.id));
        }
    }
    bad
}

/// The invariants of a step from `before` to `after` made by messages for `target`.
fn step_violations(before: &State, after: &State, target: Option<&RequestId>) -> Vec<String> {
    let mut bad = Vec::new();
    // Release only by owner: a slot leaves the owners only by its own request's
    // message, or pruned because its request was terminal or missing.
    for gone in before.owners().difference(&after.owners()) {
        let pruned =
            before.state_of(gone).is_none_or(RequestState::is_terminal) || expired(after, gone);
        if Some(gone) != target && !pruned {
            bad.push(format!(
                "{gone} lost its slot in a message for {target:?} while live"
            ));
        }
    }
    // Only the latest head is admitted.
    let latest = after
        .queue
        .as_ref()
        .and_then(|q| q.latest_request_id.clone());
    for r in after.requests.values() {
        let was = before.state_of(&r.id);
        if r.state == RequestState::Processing
            && was != Some(RequestState::Processing)
            && latest.as_ref() != Some(&r.id)
        {
            bad.push(format!(
                "{} was admitted while {latest:?} was the latest head",
                r.id
            ));
        }
    }
    // Terminal is final.
    for (id, old) in &before.requests {
        if old.state.is_terminal() {
            match after.requests.get(id) {
                Some(new) if new.state == old.state && new.plan == old.plan => {}
                other => bad.push(format!("terminal {old:?} became {other:?}")),
            }
        }
    }
    bad
}

/// Checks a step and the state after it; panics naming `context` on a violation.
/// Snapshots the stored state after a step, checks every invariant against the
/// snapshot taken before it, and makes it the new `before`.
fn advance(
    rt: &Runtime,
    observer: &mut Observer,
    before: &mut State,
    target: Option<u64>,
    context: &str,
) {
    let after = rt.block_on(observer.snapshot());
    check(observer, before, &after, target, Allow::default(), context);
    *before = after;
}

fn check(
    observer: &mut Observer,
    before: &State,
    after: &State,
    target: Option<u64>,
    allow: Allow,
    context: &str,
) {
    let target = target.map(|k| request(&observer.queue, k));
    let mut bad = step_violations(before, after, target.as_ref());
    bad.extend(state_violations(
        after,
        &observer.queue,
        (&observer.leaked, &observer.orphaned),
        allow,
    ));
    assert!(
        bad.is_empty(),
        "{context}: invariants violated:\n  {}\nbefore: {before:#?}\nafter: {after:#?}",
        bad.join("\n  ")
    );
    let owners = after.owners();
    observer.leaked.retain(|id| owners.contains(id));
    observer
        .orphaned
        .retain(|id| !owners.contains(id) && after.state_of(id) == Some(RequestState::Processing));
}

// ---------------------------------------------------------------------------------
// The parent: one run of the scenario, armed or not.
// ---------------------------------------------------------------------------------

/// The database of one run: its URL, the raw view, and the directory that keeps a
/// SQLite file alive.
struct RunDb {
    url: String,
    raw: Raw,
    _dir: Option<tempfile::TempDir>,
}

/// What a run ended with.
enum Ended {
    /// The child played everything: the failpoints it passed.
    Completed(Vec<String>),
    /// The child aborted at the armed point while playing event `at`; the parent
    /// redelivered and drained.
    Crashed { at: usize },
}

fn spawn_child(
    url: &str,
    queue: &QueueName,
    point: Option<&str>,
) -> (Child, ChildStdin, BufReader<ChildStdout>) {
    let exe = std::env::current_exe().expect("path of this test binary");
    let mut cmd = Command::new(exe);
    cmd.env(CHILD_ENV, "1")
        .env_remove(failpoint::ENV)
        .arg(url)
        .arg(queue.as_str())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(point) = point {
        cmd.env(failpoint::ENV, point);
    }
    let mut child = cmd.spawn().expect("spawn the child process");
    let stdin = child.stdin.take().expect("child stdin is piped");
    let stdout = child.stdout.take().expect("child stdout is piped");
    (child, stdin, BufReader::new(stdout))
}

/// The next complete line the child wrote, or None at end of output.
fn next_line(out: &mut BufReader<ChildStdout>) -> Option<String> {
    let mut line = String::new();
    match out.read_line(&mut line) {
        Ok(0) => None,
        Ok(_) if line.ends_with('\n') => Some(line.trim_end().to_owned()),
        Ok(_) => None,
        Err(e) => panic!("reading the child's output: {e}"),
    }
}

/// One run on a fresh, empty database at `url`: the child plays the scenario
/// (aborting at `point` if given); after a crash the parent redelivers and drains.
fn run(rt: &Runtime, url: &str, raw: Raw, queue: QueueName, point: Option<&str>) -> Ended {
    let context = |what: &str| format!("[{}] {what}", point.unwrap_or("unarmed"));
    let backend = rt
        .block_on(Backend::open(url, &BackendOptions::default()))
        .expect("open the test database");
    let (mut child, mut stdin, mut out) = spawn_child(url, &queue, point);
    let mut observer = Observer {
        backend,
        queue,
        raw,
        leaked: BTreeSet::new(),
        orphaned: BTreeSet::new(),
    };
    let mut before = rt.block_on(observer.snapshot());
    let mut current: Option<usize> = None;
    let mut passed = Vec::new();
    let ended = loop {
        let Some(line) = next_line(&mut out) else {
            break None;
        };
        let (word, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match word {
            "event" => {
                let i: usize = rest.parse().expect("event index");
                if let Some(prev) = current {
                    let event = SCENARIO[prev];
                    let what = context(&format!("after event {prev} {event:?}"));
                    advance(rt, &mut observer, &mut before, event.target(), &what);
                } else {
                    before = rt.block_on(observer.snapshot());
                }
                current = Some(i);
                writeln!(stdin, "go").expect("tell the child to go on");
                stdin.flush().expect("flush");
            }
            "ok" => {
                let i: usize = rest
                    .split(' ')
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("ok index");
                match SCENARIO[i] {
                    Event::LeakSlot(k) => {
                        observer.leaked.insert(request(&observer.queue, k));
                    }
                    Event::Orphan(k) => {
                        observer.orphaned.insert(request(&observer.queue, k));
                    }
                    _ => {}
                }
            }
            "error" => panic!("{}", context(&format!("the child failed: {rest}"))),
            "done" => {
                let last = current.expect("at least one event");
                let event = SCENARIO[last];
                let what = context(&format!("after event {last} {event:?}"));
                advance(rt, &mut observer, &mut before, event.target(), &what);
            }
            "passed" => passed.push(rest.to_owned()),
            "end" => break Some(()),
            other => panic!("{}", context(&format!("unexpected child line {other:?}"))),
        }
    };
    drop(stdin);
    let status = child.wait().expect("wait for the child");
    let mut stderr = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    let ended = match (ended, point) {
        (Some(()), None) => {
            assert!(status.success(), "unarmed child exited {status}: {stderr}");
            Ended::Completed(passed)
        }
        (Some(()), Some(point)) => panic!("the child played everything without reaching {point}"),
        (None, None) => panic!("unarmed child died ({status}): {stderr}"),
        (None, Some(point)) => {
            assert_eq!(
                status.signal(),
                Some(6),
                "child armed with {point} exited {status}, expected SIGABRT: {stderr}"
            );
            assert!(
                stderr.contains(&format!("holdfast failpoint {point}: aborting")),
                "child armed with {point} aborted elsewhere: {stderr}"
            );
            let at = current.expect("the child aborted inside an event");
            recover(rt, &mut observer, before, at, &context(""));
            Ended::Crashed { at }
        }
    };
    rt.block_on(observer.backend.close());
    ended
}

/// After the child aborted while playing event `at`: check the state it left,
/// redeliver that event, play the rest, drain, and check everything is free.
fn recover(rt: &Runtime, observer: &mut Observer, before: State, at: usize, context: &str) {
    let interrupted = SCENARIO[at];
    let crashed = rt.block_on(observer.snapshot());
    check(
        observer,
        &before,
        &crashed,
        interrupted.target(),
        Allow {
            interrupted: interrupted.target().map(|k| request(&observer.queue, k)),
        },
        &format!("{context} after the crash in event {at} {interrupted:?}"),
    );
    let queues = observer.backend.stores().queues;
    let mut before = crashed;
    for (i, event) in SCENARIO.iter().enumerate().skip(at) {
        let played = rt.block_on(play(&queues, &observer.queue, *event, now_at(i)));
        if let Err(e) = played {
            panic!("{context} replaying event {i} {event:?}: {e}");
        }
        match event {
            Event::LeakSlot(k) => {
                observer.leaked.insert(request(&observer.queue, *k));
            }
            Event::Orphan(k) => {
                observer.orphaned.insert(request(&observer.queue, *k));
            }
            _ => {}
        }
        let what = if i == at { "redelivered" } else { "replayed" };
        let what = format!("{context} {what} event {i} {event:?}");
        advance(rt, observer, &mut before, event.target(), &what);
    }
    drain(rt, observer, before, context);
}

/// Processes every non-terminal request and gives every admitted one an outcome,
/// until all are terminal; panics if that does not happen (a wedge).
fn drain(rt: &Runtime, observer: &mut Observer, mut before: State, context: &str) {
    let queues = observer.backend.stores().queues;
    let admission = admission(Arc::clone(&queues), now_at(SCENARIO.len()));
    for _ in 0..DRAIN_ROUNDS {
        let open: Vec<Request> = before
            .requests
            .values()
            .filter(|r| !r.state.is_terminal())
            .cloned()
            .collect();
        if open.is_empty() {
            break;
        }
        for r in open {
            let k = r.id.seq();
            let reply = if r.state == RequestState::Accepted {
                let reply = rt
                    .block_on(admission.process(&r.id))
                    .unwrap_or_else(|e| panic!("{context} drain: process {}: {e}", r.id));
                let what = format!("{context} drain: process {}", r.id);
                advance(rt, observer, &mut before, Some(k), &what);
                Some(reply)
            } else {
                None
            };
            let admitted =
                r.state == RequestState::Processing || matches!(reply, Some(Reply::Publish { .. }));
            if admitted {
                rt.block_on(admission.outcome(&r.id, BuildOutcome::Succeeded))
                    .unwrap_or_else(|e| panic!("{context} drain: outcome {}: {e}", r.id));
                let what = format!("{context} drain: outcome {}", r.id);
                advance(rt, observer, &mut before, Some(k), &what);
            }
        }
    }
    let open: Vec<String> = before
        .requests
        .values()
        .filter(|r| !r.state.is_terminal())
        .map(|r| format!("{} {:?}", r.id, r.state))
        .collect();
    assert!(
        open.is_empty(),
        "{context}: wedged: after {DRAIN_ROUNDS} drain rounds still open: {open:?}; owners {:?}",
        before.owners()
    );
    assert!(
        before.owners().is_empty(),
        "{context}: everything is terminal but slots are still owned: {:?}",
        before.owners()
    );
}

// ---------------------------------------------------------------------------------
// Which points there are.
// ---------------------------------------------------------------------------------

/// The steps in which the scenario must reach each queue write. Exhaustive: a new
/// kind does not compile until it is placed here.
fn queue_write_steps(kind: &QueueWrite) -> &'static [&'static str] {
    match kind {
        QueueWrite::StampLatest => &["ingest"],
        QueueWrite::Claim => &["process"],
        // At a closed gate, and in a reconcile pass after an expiry.
        QueueWrite::Prune { .. } => &["process", "reconcile"],
        QueueWrite::Heartbeat => &["heartbeat"],
        QueueWrite::Publish { .. } => &["process"],
        QueueWrite::Withdraw => &["withdraw"],
        // A reconcile pass finding a lease run out.
        QueueWrite::MarkExpiring { .. } => &["reconcile"],
        QueueWrite::SetLimit => &["set_limit"],
        QueueWrite::Release => &["process", "outcome", "dead_letter"],
        // A succeeded outcome, after its terminal write.
        QueueWrite::RecordGreen => &["outcome"],
        // The migration from an anonymous count.
        QueueWrite::Backfill { .. } => &["backfill"],
    }
}

/// The steps in which the scenario must reach each request write. Exhaustive.
fn request_write_steps(kind: &RequestWrite) -> &'static [&'static str] {
    match kind {
        RequestWrite::Supersede | RequestWrite::MarkProcessing => &["process"],
        // Before releasing a superseded head's slot.
        RequestWrite::Fence => &["process"],
        RequestWrite::Finish(_) => &["outcome"],
        RequestWrite::Fail => &["dead_letter"],
        RequestWrite::Expire => &["reconcile"],
    }
}

/// `(step, write label)` pairs whose both sides the scenario must pass.
fn required_points() -> BTreeSet<(String, String)> {
    let queue = Queue::new(queue_name(0));
    let req = Request {
        id: request(&queue.name, 1),
        uri: uri(1),
        state: RequestState::Accepted,
        plan: None,
        reason: None,
        ingested_at: holdfast_domain::Timestamp::from_millis(0),
        version: Version::FIRST,
    };
    // One value of every variant of the two matches above: a variant added there
    // must be added here too.
    let queue_kinds = [
        QueueWrite::StampLatest,
        QueueWrite::Claim,
        QueueWrite::Release,
        QueueWrite::Prune { pruned: Vec::new() },
        QueueWrite::Backfill { added: Vec::new() },
        QueueWrite::RecordGreen,
        QueueWrite::Heartbeat,
        QueueWrite::Publish {
            id: req.id.clone(),
            generation: holdfast_domain::Generation(1),
        },
        QueueWrite::Withdraw,
        QueueWrite::MarkExpiring { id: req.id.clone() },
        QueueWrite::SetLimit,
    ];
    let request_kinds = [
        RequestWrite::Fence,
        RequestWrite::Supersede,
        RequestWrite::MarkProcessing,
        RequestWrite::Finish(RequestState::Succeeded),
        RequestWrite::Fail,
        RequestWrite::Expire,
    ];
    // The one write that is not a compare-and-set: ingest creating the request.
    let mut required = BTreeSet::from([("ingest".to_owned(), "create_request".to_owned())]);
    for kind in queue_kinds {
        let steps = queue_write_steps(&kind);
        let label = write_label(&Write::Queue {
            kind,
            expected: Version::FIRST,
            queue: queue.clone(),
        });
        for step in steps {
            required.insert(((*step).to_owned(), label.to_owned()));
        }
    }
    for kind in request_kinds {
        let steps = request_write_steps(&kind);
        let label = write_label(&Write::Request {
            kind,
            expected: Version::FIRST,
            request: req.clone(),
        });
        for step in steps {
            required.insert(((*step).to_owned(), label.to_owned()));
        }
    }
    required
}

/// Plays the scenario unarmed, checks the points it passed cover every required
/// write, then crashes at each point; `database` gives each run its database.
fn every_failpoint(backend: &str, rt: &Runtime, database: impl Fn() -> RunDb) {
    assert!(
        std::env::var_os(failpoint::ENV).is_none(),
        "{} is set in the test's own environment; unset it (the test arms its children)",
        failpoint::ENV
    );
    let started = Instant::now();
    let db = database();
    let Ended::Completed(points) = run(rt, &db.url, db.raw, queue_name(0), None) else {
        panic!("the unarmed run crashed");
    };
    let mut reached = BTreeSet::new();
    for point in &points {
        let parsed: failpoint::Failpoint = point.parse().expect("a passed point parses");
        reached.insert((parsed.step, parsed.write, parsed.when));
    }
    let missing: Vec<String> = required_points()
        .into_iter()
        .flat_map(|(step, write)| {
            [failpoint::When::Before, failpoint::When::After]
                .map(|when| (step.clone(), write.clone(), when))
        })
        .filter(|key| !reached.contains(key))
        .map(|(step, write, when)| format!("{step}:{write}:{}", when.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the scenario never reaches {missing:?}; it reached {points:?}"
    );

    let mut crashed_in = BTreeMap::<usize, usize>::new();
    for (n, point) in points.iter().enumerate() {
        let db = database();
        match run(rt, &db.url, db.raw, queue_name(n + 1), Some(point)) {
            Ended::Crashed { at } => *crashed_in.entry(at).or_default() += 1,
            Ended::Completed(_) => panic!("{point}: completed"),
        }
    }
    eprintln!(
        "admission_crash ({backend}): {} failpoints, each a crash, a redelivery and a drain \
         with the invariants checked at every step; crashes per scenario event {crashed_in:?}; \
         {:.1}s",
        points.len(),
        started.elapsed().as_secs_f64()
    );
}

fn every_failpoint_on_sqlite_redelivery_drains_with_the_invariants() {
    let rt = runtime();
    every_failpoint("sqlite", &rt, || {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("admission.db");
        RunDb {
            url: format!("sqlite://{}", path.display()),
            raw: Raw::Sqlite(path),
            _dir: Some(dir),
        }
    });
}

fn every_failpoint_on_postgres_redelivery_drains_with_the_invariants() {
    let rt = runtime();
    let Some(db) = rt.block_on(TestDb::create(
        "admission_crash::every_failpoint_on_postgres",
    )) else {
        return;
    };
    every_failpoint("postgres", &rt, || RunDb {
        url: db.url.clone(),
        raw: Raw::Postgres(
            rt.block_on(PgConnection::connect(&db.url))
                .expect("raw connection to the test database"),
        ),
        _dir: None,
    });
}
