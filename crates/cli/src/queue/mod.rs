//! `holdfast queue ingest | process | outcome | dead-letter | heartbeat | reconcile
//! | set-limit | prune | backfill | show`: one step of the admission service per
//! command, the operations on a queue's slots, and a view of a queue.
//!
//! A step's [`Reply`] decides the exit code: publish and ack succeed (0); a hold
//! (the gate is closed or the queue paused, or a duplicate delivery of a build
//! published but not yet heartbeated), a retry or a non-retryable admission error
//! is a refusal (1); a dead letter for a missing request or queue is bad input (2).

mod slots;
mod view;
mod work;

use std::sync::Arc;

use clap::{Args, Subcommand, ValueEnum};
use holdfast::domain::{BuildOutcome, Generation, QueueName, Reply, RequestId, RevisionUri};
use holdfast::ports::Clock;
use serde::Serialize;

use super::output::{Rendered, Report};
use super::{CliError, Context};
use holdfast::admission::{Admission, AdmissionPolicy, NoAncestry};
use holdfast::clock::SystemClock;

pub use slots::{HeartbeatView, LimitView, PruneView, PrunedView, ReconcileView};
pub use view::{
    HoldWhy, LastGreenView, OwnerView, QueueView, ReplyView, RequestView, StepView, queue_view,
};
pub use work::{MAX_WORKERS, PublishedView, SCAN_POLL, WorkView};

/// The most requests `queue show` lists: the newest ones.
pub const SHOW_LIMIT: usize = 1000;

/// Queue subcommands.
#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Ingest a revision into a queue (deduplicated on queue and uri)
    Ingest(IngestArgs),
    /// Process (admit) a request: publish its build, or hold it while the gate is closed or while its published build has not heartbeated yet
    Process(RequestArgs),
    /// Record a build outcome: finish the request, then release its slot
    Outcome(OutcomeArgs),
    /// Dead-letter a request: mark it failed, then release its slot
    DeadLetter(RequestArgs),
    /// Extend a running build's slot lease (exit 0), or say why the build must stop (exit 1): the request owns no slot any more, its lease ran out, or a newer generation was published
    Heartbeat(HeartbeatArgs),
    /// Fail slot owners whose lease ran out, prune owners that are not live; print what went and why
    Reconcile(ShowArgs),
    /// Set a queue's slot limit for every replica; 0 pauses it (every head holds)
    SetLimit(SetLimitArgs),
    /// Delete terminal requests older than an age, never the head or the last green
    Prune(PruneArgs),
    /// Run admission workers over the stored requests of queues: admit what can be admitted, print each build the moment it is published, stop when nothing is left to do (or, with --follow, on SIGTERM or SIGINT)
    Work(WorkArgs),
    /// Migrate a queue from an anonymous-count admission: add every processing request to the slot owners
    ///
    /// Run it once per queue with the old binaries stopped: old and new code must
    /// never gate at once on different representations. Running it again adds
    /// nothing.
    Backfill(ShowArgs),
    /// Show a queue: head, last green, slot owners (flagging owners that are not live), newest requests
    Show(ShowArgs),
}

/// `queue ingest`.
#[derive(Debug, Args)]
pub struct IngestArgs {
    /// The queue, e.g. monorepo/main
    #[arg(long, value_name = "Q")]
    pub queue: QueueName,
    /// The revision to build
    #[arg(long, value_name = "U")]
    pub uri: RevisionUri,
}

/// `queue process` and `queue dead-letter`.
#[derive(Debug, Args)]
pub struct RequestArgs {
    /// The request id, request/<queue>/<n>
    #[arg(long, value_name = "ID")]
    pub request: RequestId,
}

/// `queue heartbeat`.
#[derive(Debug, Args)]
pub struct HeartbeatArgs {
    /// The request id, request/<queue>/<n>
    #[arg(long, value_name = "ID")]
    pub request: RequestId,
    /// The generation of the running build, as published; 0 for a build published before generations (by an older holdfast, or adopted by `queue backfill`)
    #[arg(long, value_name = "G")]
    pub generation: u32,
}

/// Build outcomes `queue outcome` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutcomeStatus {
    /// The build passed
    Succeeded,
    /// The build failed
    Failed,
    /// The build was cancelled
    Cancelled,
}

impl From<OutcomeStatus> for BuildOutcome {
    fn from(s: OutcomeStatus) -> Self {
        match s {
            OutcomeStatus::Succeeded => BuildOutcome::Succeeded,
            OutcomeStatus::Failed => BuildOutcome::Failed,
            OutcomeStatus::Cancelled => BuildOutcome::Cancelled,
        }
    }
}

/// `queue outcome`.
#[derive(Debug, Args)]
pub struct OutcomeArgs {
    /// The request id, request/<queue>/<n>
    #[arg(long, value_name = "ID")]
    pub request: RequestId,
    /// The build's outcome
    #[arg(long, value_enum, value_name = "STATUS")]
    pub status: OutcomeStatus,
}

/// `queue show`, `queue reconcile` and `queue backfill`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The queue
    #[arg(long, value_name = "Q")]
    pub queue: QueueName,
}

/// `queue set-limit`.
#[derive(Debug, Args)]
pub struct SetLimitArgs {
    /// The queue
    #[arg(long, value_name = "Q")]
    pub queue: QueueName,
    /// Build slots, 0 to 1000000; 0 pauses the queue
    #[arg(long, value_name = "N")]
    pub max: u32,
}

/// `queue work`.
#[derive(Debug, Args)]
pub struct WorkArgs {
    /// A queue to work on (repeat for more)
    #[arg(long, value_name = "Q", required = true)]
    pub queue: Vec<QueueName>,
    /// Workers, 1 to 64
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub workers: usize,
    /// Keep working until SIGTERM or SIGINT (then finish the deliveries in hand, print the summary and exit 0) instead of stopping when nothing is left to do
    #[arg(long)]
    pub follow: bool,
}

/// `queue prune`.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// The queue
    #[arg(long, value_name = "Q")]
    pub queue: QueueName,
    /// Delete terminal requests last written at least this long ago: a number and a unit (ms, s, m, h, d, w), e.g. 7d, 12h, 0s
    #[arg(long, value_name = "AGE", value_parser = slots::parse_age)]
    pub older_than: std::time::Duration,
}

/// The admission service a command uses on `ctx`'s backend: the configured
/// policy, and no ancestry source (every build is a full build).
pub fn admission(ctx: &Context) -> Admission {
    Admission::new(
        ctx.backend.stores().queues,
        Arc::new(NoAncestry),
        AdmissionPolicy::from_config(&ctx.config),
    )
}

/// Turns a step's reply into the command's result: publish and ack succeed; the
/// rest are errors with the matching exit code.
pub fn conclude(view: StepView) -> Result<Rendered, CliError> {
    match &view.reply {
        ReplyView::Publish { .. } | ReplyView::Ack => Ok(Rendered::of(&view)),
        ReplyView::DeadLetter { .. } => Err(CliError::NotFound {
            what: "request or queue",
            id: view
                .request
                .as_ref()
                .map(|r| r.id.clone())
                .unwrap_or_default(),
            hint: "list requests with `holdfast queue show --queue Q`",
        }),
        _ => Err(CliError::Refused {
            subject: view
                .request
                .as_ref()
                .map(|r| r.id.clone())
                .unwrap_or_default(),
            reply: Box::new(view.reply.clone()),
        }),
    }
}

/// Runs a queue subcommand; `json` is the output mode (`queue work` prints its
/// builds as it publishes them).
pub async fn run(ctx: &Context, cmd: QueueCommand, json: bool) -> Result<Rendered, CliError> {
    let admission = admission(ctx);
    match cmd {
        QueueCommand::Ingest(args) => {
            let ingest = admission.ingest(&args.queue, &args.uri).await?;
            conclude(StepView {
                step: "ingest",
                request: Some(RequestView::from(&ingest.request)),
                created: Some(ingest.created),
                reply: ReplyView::from(&ingest.reply),
            })
        }
        QueueCommand::Process(args) => {
            let reply = admission.process(&args.request).await?;
            step(ctx, "process", &args.request, &reply).await
        }
        QueueCommand::Outcome(args) => {
            let reply = admission.outcome(&args.request, args.status.into()).await?;
            step(ctx, "outcome", &args.request, &reply).await
        }
        QueueCommand::DeadLetter(args) => {
            let reply = admission.dead_letter(&args.request).await?;
            step(ctx, "dead_letter", &args.request, &reply).await
        }
        QueueCommand::Heartbeat(args) => {
            slots::heartbeat(&admission, &args.request, Generation(args.generation)).await
        }
        QueueCommand::Reconcile(args) => slots::reconcile(ctx, &admission, &args.queue).await,
        QueueCommand::SetLimit(args) => {
            slots::set_limit(ctx, &admission, &args.queue, args.max).await
        }
        QueueCommand::Prune(args) => {
            slots::prune(ctx, &admission, &args.queue, args.older_than).await
        }
        QueueCommand::Work(args) => work::work(ctx, admission, args, json).await,
        QueueCommand::Backfill(args) => {
            let backfill = admission.backfill(&args.queue).await?;
            if let Reply::DeadLetter(_) = backfill.reply {
                return Err(no_queue(&args.queue));
            }
            let view = BackfillView {
                queue: args.queue.to_string(),
                added: backfill.added.iter().map(ToString::to_string).collect(),
                reply: ReplyView::from(&backfill.reply),
            };
            match view.reply {
                ReplyView::Ack => Ok(Rendered::of(&view)),
                _ => Err(CliError::Refused {
                    subject: view.queue.clone(),
                    reply: Box::new(view.reply.clone()),
                }),
            }
        }
        QueueCommand::Show(args) => show(ctx, &args.queue).await.map(|v| Rendered::of(&v)),
    }
}

/// `queue backfill` JSON: `{"queue", "added": ["request/<queue>/<n>"...], "reply":
/// ReplyView}`; `added` lists the processing requests this run made slot owners.
#[derive(Debug, Clone, Serialize)]
pub struct BackfillView {
    /// The queue.
    pub queue: String,
    /// The request ids added to the slot owners, in order.
    pub added: Vec<String>,
    /// The step's reply (always an ack when the command succeeds).
    pub reply: ReplyView,
}

impl Report for BackfillView {
    fn human(&self) -> String {
        if self.added.is_empty() {
            format!(
                "queue {}: every processing request owns a slot already; nothing added\n",
                self.queue
            )
        } else {
            format!(
                "queue {}: added {} slot owner(s): {}\n",
                self.queue,
                self.added.len(),
                self.added.join(", ")
            )
        }
    }
}

async fn step(
    ctx: &Context,
    step: &'static str,
    id: &RequestId,
    reply: &Reply,
) -> Result<Rendered, CliError> {
    let queues = ctx.backend.stores().queues;
    let Some(request) = queues.load_request(id).await? else {
        return Err(CliError::NotFound {
            what: "request",
            id: id.to_string(),
            hint: "list requests with `holdfast queue show --queue Q`",
        });
    };
    // A hold of a request that owns its slot is not the gate: its build was
    // published and has not heartbeated yet. The slot says which generation.
    let slot = match reply {
        Reply::Hold { paused: false, .. } => queues
            .load_queue(id.queue())
            .await?
            .and_then(|q| q.owners.get(id).copied()),
        _ => None,
    };
    conclude(StepView {
        step,
        request: Some(RequestView::from(&request)),
        created: None,
        reply: ReplyView::of(reply, slot.as_ref()),
    })
}

/// Loads and views `name`; a missing queue is [`CliError::NotFound`].
pub async fn show(ctx: &Context, name: &QueueName) -> Result<QueueView, CliError> {
    let queues = ctx.backend.stores().queues;
    let Some(queue) = queues.load_queue(name).await? else {
        return Err(no_queue(name));
    };
    let mut requests = queues.list_requests(name, SHOW_LIMIT).await?;
    // Owners beyond the listing limit are loaded one by one, so liveness is exact.
    for owner in queue.owners.keys() {
        if !requests.iter().any(|r| &r.id == owner)
            && let Some(r) = queues.load_request(owner).await?
        {
            requests.push(r);
        }
    }
    requests.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(queue_view(ctx, &queue, &requests, SystemClock.now()))
}

fn no_queue(queue: &QueueName) -> CliError {
    CliError::NotFound {
        what: "queue",
        id: queue.to_string(),
        hint: "a queue exists once a revision is ingested into it",
    }
}

/// A missing queue is bad input, not an empty answer.
async fn ensure_queue(ctx: &Context, queue: &QueueName) -> Result<(), CliError> {
    match ctx.backend.stores().queues.load_queue(queue).await? {
        Some(_) => Ok(()),
        None => Err(no_queue(queue)),
    }
}
