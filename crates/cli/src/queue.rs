//! `holdfast queue ingest | process | outcome | dead-letter | backfill | show`: one
//! step of the admission service per command, and a view of a queue's slot owners.
//!
//! A step's [`Reply`] decides the exit code: publish and ack succeed (0); a hold
//! (the gate is closed), a retry or a non-retryable admission error is a refusal
//! (1); a dead letter for a missing request or queue is bad input (2).

use std::sync::Arc;

use clap::{Args, Subcommand, ValueEnum};
use holdfast_domain::admission::invariants::owner_violation;
use holdfast_domain::admission::{DeadLetterReason, RetryReason};
use holdfast_domain::{
    BuildOutcome, Queue, QueueName, Reply, Request, RequestId, RequestState, RevisionUri,
};
use serde::Serialize;

use super::output::{self, Rendered, Report, Table};
use super::{CliError, Context};
use holdfast::admission::{Admission, AdmissionPolicy, NoAncestry};

/// The most requests `queue show` lists: the newest ones.
pub const SHOW_LIMIT: usize = 1000;

/// Queue subcommands.
#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Ingest a revision into a queue (deduplicated on queue and uri)
    Ingest(IngestArgs),
    /// Process (admit) a request: publish its build, or hold it while the gate is closed
    Process(RequestArgs),
    /// Record a build outcome: release the request's slot, then finish it
    Outcome(OutcomeArgs),
    /// Dead-letter a request: release its slot, then mark it failed
    DeadLetter(RequestArgs),
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

/// `queue show` and `queue backfill`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The queue
    #[arg(long, value_name = "Q")]
    pub queue: QueueName,
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

/// A request in JSON: `{"id", "uri", "state", "strategy": null | "full" |
/// "incremental_since_green", "base": null | "uri", "version"}`.
#[derive(Debug, Clone, Serialize)]
pub struct RequestView {
    /// `request/<queue>/<n>`.
    pub id: String,
    /// The revision.
    pub uri: String,
    /// `accepted`, `processing`, `superseded`, `succeeded`, `failed` or `cancelled`.
    pub state: &'static str,
    /// The build strategy, once admitted.
    pub strategy: Option<&'static str>,
    /// The incremental base, if any.
    pub base: Option<String>,
    /// The record's compare-and-set version.
    pub version: u64,
}

impl From<&Request> for RequestView {
    fn from(r: &Request) -> Self {
        RequestView {
            id: r.id.to_string(),
            uri: r.uri.to_string(),
            state: r.state.as_str(),
            strategy: r.plan.as_ref().map(|p| p.strategy.as_str()),
            base: r
                .plan
                .as_ref()
                .and_then(|p| p.base.as_ref())
                .map(ToString::to_string),
            version: r.version.0,
        }
    }
}

/// A step's reply in JSON, tagged by `kind`: `{"kind": "publish", "request",
/// "strategy", "base"}`, `{"kind": "hold", "delay_ms"}`, `{"kind": "ack"}`,
/// `{"kind": "retry", "reason"}`, `{"kind": "dead_letter", "reason"}`,
/// `{"kind": "error", "message"}`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReplyView {
    /// Publish the build of the admitted request.
    Publish {
        /// The admitted request.
        request: String,
        /// Its strategy.
        strategy: &'static str,
        /// Its incremental base, if any.
        base: Option<String>,
    },
    /// The gate is closed: redeliver after the delay.
    Hold {
        /// The delay.
        delay_ms: u64,
    },
    /// Done: acknowledge the message.
    Ack,
    /// Redeliver later.
    Retry {
        /// Why.
        reason: String,
    },
    /// Route the message to the dead-letter step.
    DeadLetter {
        /// Why.
        reason: String,
    },
    /// A non-retryable error.
    Error {
        /// What went wrong.
        message: String,
    },
}

impl From<&Reply> for ReplyView {
    fn from(reply: &Reply) -> Self {
        match reply {
            Reply::Publish { request, plan } => ReplyView::Publish {
                request: request.id.to_string(),
                strategy: plan.strategy.as_str(),
                base: plan.base.as_ref().map(ToString::to_string),
            },
            Reply::Hold(delay) => ReplyView::Hold {
                delay_ms: output::millis(*delay),
            },
            Reply::Ack => ReplyView::Ack,
            Reply::Retry(RetryReason::Ancestry {
                ancestor,
                descendant,
                reason,
            }) => ReplyView::Retry {
                reason: format!(
                    "ancestry of {descendant} against the last green {ancestor} is unknown: {reason}"
                ),
            },
            Reply::DeadLetter(reason) => ReplyView::DeadLetter {
                reason: match reason {
                    DeadLetterReason::RequestMissing(id) => format!("no request {id}"),
                    DeadLetterReason::QueueMissing(q) => format!("no queue {q}"),
                },
            },
            Reply::Error(e) => ReplyView::Error {
                message: e.to_string(),
            },
        }
    }
}

impl ReplyView {
    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            ReplyView::Publish {
                request,
                strategy,
                base,
            } => match base {
                Some(base) => format!("publish the {strategy} build of {request} (base {base})"),
                None => format!("publish the {strategy} build of {request}"),
            },
            ReplyView::Hold { delay_ms } => {
                format!("hold: the gate is closed; redeliver after {delay_ms} ms")
            }
            ReplyView::Ack => "ack".to_owned(),
            ReplyView::Retry { reason } => format!("retry later: {reason}"),
            ReplyView::DeadLetter { reason } => format!("dead-letter: {reason}"),
            ReplyView::Error { message } => format!("error: {message}"),
        }
    }
}

/// The JSON of `queue ingest`, `process`, `outcome` and `dead-letter`:
/// `{"step", "request": RequestView | null, "created": bool | null, "reply": ReplyView}`.
#[derive(Debug, Clone, Serialize)]
pub struct StepView {
    /// `ingest`, `process`, `outcome` or `dead_letter`.
    pub step: &'static str,
    /// The request after the step.
    pub request: Option<RequestView>,
    /// For ingest: whether the request was created by this call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created: Option<bool>,
    /// What the caller does with the message.
    pub reply: ReplyView,
}

impl Report for StepView {
    fn human(&self) -> String {
        let mut text = String::new();
        if let Some(request) = &self.request {
            let created = match self.created {
                Some(true) => " (new)",
                Some(false) => " (existing)",
                None => "",
            };
            text.push_str(&format!(
                "{}{created}: {} {}\n",
                request.id, request.state, request.uri
            ));
        }
        text.push_str(&self.reply.describe());
        text.push('\n');
        text
    }
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

async fn after(ctx: &Context, id: &RequestId) -> Result<Option<RequestView>, CliError> {
    Ok(ctx
        .backend
        .stores()
        .queues
        .load_request(id)
        .await?
        .as_ref()
        .map(RequestView::from))
}

/// Runs a queue subcommand.
pub async fn run(ctx: &Context, cmd: QueueCommand) -> Result<Rendered, CliError> {
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
        QueueCommand::Backfill(args) => {
            let backfill = admission.backfill(&args.queue).await?;
            if let Reply::DeadLetter(_) = backfill.reply {
                return Err(CliError::NotFound {
                    what: "queue",
                    id: args.queue.to_string(),
                    hint: "a queue exists once a revision is ingested into it",
                });
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
    let request = after(ctx, id).await?;
    if request.is_none() {
        return Err(CliError::NotFound {
            what: "request",
            id: id.to_string(),
            hint: "list requests with `holdfast queue show --queue Q`",
        });
    }
    conclude(StepView {
        step,
        request,
        created: None,
        reply: ReplyView::from(reply),
    })
}

/// A slot owner in `queue show` JSON: `{"request", "state": null | "processing", "live"}`.
#[derive(Debug, Clone, Serialize)]
pub struct OwnerView {
    /// The owning request id.
    pub request: String,
    /// Its state, or null when the request is missing.
    pub state: Option<&'static str>,
    /// Whether it is live (accepted or processing); a non-live owner is a leak that
    /// the next admission step's reconcile prunes.
    pub live: bool,
}

/// `queue show` JSON: `{"queue", "version", "max_concurrent", "latest_request_id",
/// "last_green": null | {"uri", "request_id"}, "owners": [OwnerView...],
/// "not_live_owners", "requests": [RequestView...]}`.
#[derive(Debug, Clone, Serialize)]
pub struct QueueView {
    /// The queue name.
    pub queue: String,
    /// The record's compare-and-set version.
    pub version: u64,
    /// The configured slot count.
    pub max_concurrent: u32,
    /// The newest ingested request.
    pub latest_request_id: Option<String>,
    /// The last green bookmark.
    pub last_green: Option<LastGreenView>,
    /// The requests owning a slot.
    pub owners: Vec<OwnerView>,
    /// How many owners are not live.
    pub not_live_owners: usize,
    /// The newest requests (at most [`SHOW_LIMIT`]) and any older slot owner,
    /// oldest first.
    pub requests: Vec<RequestView>,
}

/// The last green bookmark in JSON.
#[derive(Debug, Clone, Serialize)]
pub struct LastGreenView {
    /// The green revision.
    pub uri: String,
    /// The request that built it.
    pub request_id: String,
}

impl Report for QueueView {
    fn human(&self) -> String {
        let mut text = format!(
            "queue {} ({}; {} slot(s)): head {}, last green {}\n",
            self.queue,
            format_args!("v{}", self.version),
            self.max_concurrent,
            self.latest_request_id.as_deref().unwrap_or("-"),
            self.last_green
                .as_ref()
                .map_or("-".to_owned(), |g| format!("{} ({})", g.uri, g.request_id)),
        );
        if self.owners.is_empty() {
            text.push_str("slot owners: none\n");
        } else {
            let owners: Vec<String> = self
                .owners
                .iter()
                .map(|o| {
                    let state = o.state.unwrap_or("missing");
                    if o.live {
                        format!("{} ({state})", o.request)
                    } else {
                        format!("{} ({state}, NOT LIVE)", o.request)
                    }
                })
                .collect();
            text.push_str(&format!("slot owners: {}\n", owners.join(", ")));
        }
        if !self.requests.is_empty() {
            let mut table = Table::new(["REQUEST", "STATE", "URI", "STRATEGY"]);
            for r in &self.requests {
                table.row([
                    r.id.clone(),
                    r.state.to_owned(),
                    r.uri.clone(),
                    r.strategy.unwrap_or("-").to_owned(),
                ]);
            }
            text.push_str(&table.render());
        }
        text
    }
}

/// The view of `queue` and its requests.
pub fn queue_view(ctx: &Context, queue: &Queue, requests: &[Request]) -> QueueView {
    let owners: Vec<OwnerView> = queue
        .owners
        .iter()
        .map(|id| {
            let state = requests.iter().find(|r| &r.id == id).map(|r| r.state);
            OwnerView {
                request: id.to_string(),
                state: state.map(RequestState::as_str),
                live: owner_violation(id, state).is_none(),
            }
        })
        .collect();
    QueueView {
        queue: queue.name.to_string(),
        version: queue.version.0,
        max_concurrent: ctx.config.admission_for(&queue.name).max_concurrent,
        latest_request_id: queue.latest_request_id.as_ref().map(ToString::to_string),
        last_green: queue.last_green.as_ref().map(|g| LastGreenView {
            uri: g.uri.to_string(),
            request_id: g.request_id.to_string(),
        }),
        not_live_owners: owners.iter().filter(|o| !o.live).count(),
        owners,
        requests: requests.iter().map(RequestView::from).collect(),
    }
}

/// Loads and views `name`; a missing queue is [`CliError::NotFound`].
pub async fn show(ctx: &Context, name: &QueueName) -> Result<QueueView, CliError> {
    let queues = ctx.backend.stores().queues;
    let Some(queue) = queues.load_queue(name).await? else {
        return Err(CliError::NotFound {
            what: "queue",
            id: name.to_string(),
            hint: "a queue exists once a revision is ingested into it",
        });
    };
    let mut requests = queues.list_requests(name, SHOW_LIMIT).await?;
    // Owners beyond the listing limit are loaded one by one, so liveness is exact.
    for owner in &queue.owners {
        if !requests.iter().any(|r| &r.id == owner)
            && let Some(r) = queues.load_request(owner).await?
        {
            requests.push(r);
        }
    }
    requests.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(queue_view(ctx, &queue, &requests))
}
