//! What the queue commands print: requests, step replies and the queue view, for
//! people (text) and programs (JSON).

use holdfast::domain::admission::invariants::owner_violation;
use holdfast::domain::admission::{DeadLetterReason, RetryReason};
use holdfast::domain::{Queue, Reply, Request, RequestState, Slot, Timestamp};
use serde::Serialize;

use crate::Context;
use crate::output::{self, Report, Table};

/// A request in JSON: `{"id", "uri", "state", "reason": null | "slot_lease_expired"
/// | "dead_lettered", "strategy": null | "full" | "incremental_since_green", "base":
/// null | "uri", "version"}`.
#[derive(Debug, Clone, Serialize)]
pub struct RequestView {
    /// `request/<queue>/<n>`.
    pub id: String,
    /// The revision.
    pub uri: String,
    /// `accepted`, `processing`, `superseded`, `succeeded`, `failed` or `cancelled`.
    pub state: &'static str,
    /// Why admission failed it (`slot_lease_expired`, `dead_lettered`), if it did.
    pub reason: Option<&'static str>,
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
            reason: r.reason.map(|r| r.as_str()),
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
/// "generation", "strategy", "base"}`, `{"kind": "hold", "delay_ms", "paused",
/// "why": "full" | "paused" | "unconfirmed", "generation": null | G}`,
/// `{"kind": "ack"}`, `{"kind": "retry", "reason"}`, `{"kind": "dead_letter",
/// "reason"}`, `{"kind": "error", "message"}`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReplyView {
    /// Publish the build of the admitted request.
    Publish {
        /// The admitted request.
        request: String,
        /// The generation this publication carries (1 for the first, one more for
        /// each re-publication): the build heartbeats with it.
        generation: u32,
        /// Its strategy.
        strategy: &'static str,
        /// Its incremental base, if any.
        base: Option<String>,
    },
    /// Redeliver after the delay: the gate is closed, or the request owns its slot
    /// and its build's last publication has not heartbeated yet.
    Hold {
        /// The delay.
        delay_ms: u64,
        /// Whether the queue is paused (its limit is 0) rather than full.
        paused: bool,
        /// Why it holds.
        why: HoldWhy,
        /// For [`HoldWhy::Unconfirmed`]: the generation published last, which has
        /// not heartbeated yet; null for a closed gate.
        generation: Option<u32>,
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

/// Why a delivery holds, as the `why` label of the held-deliveries metric says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldWhy {
    /// Every slot is taken: the head waits at the gate.
    Full,
    /// The queue is paused (its limit is 0): the head waits at the gate.
    Paused,
    /// The request owns its slot and its build was published, but has not
    /// heartbeated since: this duplicate delivery comes back when the publication
    /// would go quiet, and publishes the next generation unless the build
    /// heartbeated by then.
    Unconfirmed,
}

/// The view of a reply to a request that owns no slot (or of a step that never
/// holds a slot owner); a `queue process` reply uses [`ReplyView::of`].
impl From<&Reply> for ReplyView {
    fn from(reply: &Reply) -> Self {
        ReplyView::of(reply, None)
    }
}

impl ReplyView {
    /// The view of a step's `reply` to a delivery of a request that owns `slot`
    /// after the step, if it does: a hold of a slot owner is not the gate but its
    /// build's publication waiting for a first heartbeat.
    pub fn of(reply: &Reply, slot: Option<&Slot>) -> Self {
        match reply {
            Reply::Publish {
                request,
                plan,
                generation,
            } => ReplyView::Publish {
                request: request.id.to_string(),
                generation: generation.0,
                strategy: plan.strategy.as_str(),
                base: plan.base.as_ref().map(ToString::to_string),
            },
            Reply::Hold { delay, paused } => {
                let (why, generation) = match (paused, slot) {
                    (true, _) => (HoldWhy::Paused, None),
                    (false, Some(slot)) => (HoldWhy::Unconfirmed, Some(slot.generation.0)),
                    (false, None) => (HoldWhy::Full, None),
                };
                ReplyView::Hold {
                    delay_ms: output::millis(*delay),
                    paused: *paused,
                    why,
                    generation,
                }
            }
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

    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            ReplyView::Publish {
                request,
                generation,
                strategy,
                base,
            } => publish_line(request, *generation, strategy, base.as_deref()),
            ReplyView::Hold {
                delay_ms,
                why: HoldWhy::Full,
                ..
            } => format!("hold: every slot is taken; redeliver after {delay_ms} ms"),
            ReplyView::Hold {
                delay_ms,
                why: HoldWhy::Paused,
                ..
            } => format!(
                "hold: the queue is paused (limit 0; raise it with `holdfast queue set-limit`); redeliver after {delay_ms} ms"
            ),
            ReplyView::Hold {
                delay_ms,
                why: HoldWhy::Unconfirmed,
                generation,
                ..
            } => {
                let build = match generation {
                    Some(generation) => format!("generation {generation} of its build"),
                    None => "its build".to_owned(),
                };
                format!(
                    "hold: {build} was published and has not heartbeated yet; redeliver after {delay_ms} ms"
                )
            }
            ReplyView::Ack => "ack".to_owned(),
            ReplyView::Retry { reason } => format!("retry later: {reason}"),
            ReplyView::DeadLetter { reason } => format!("dead-letter: {reason}"),
            ReplyView::Error { message } => format!("error: {message}"),
        }
    }
}

/// The line for people that says generation `generation` of a build is to be
/// published.
pub fn publish_line(request: &str, generation: u32, strategy: &str, base: Option<&str>) -> String {
    match base {
        Some(base) => format!(
            "publish generation {generation} of the {strategy} build of {request} (base {base})"
        ),
        None => format!("publish generation {generation} of the {strategy} build of {request}"),
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

/// A slot owner in `queue show` JSON: `{"request", "state": null | "processing",
/// "live", "claimed_at", "heartbeat_at", "lease_expires_at", "lease_expired",
/// "generation", "published_at": null | time, "quiet", "expiring"}` (times RFC 3339
/// UTC).
#[derive(Debug, Clone, Serialize)]
pub struct OwnerView {
    /// The owning request id.
    pub request: String,
    /// Its state, or null when the request is missing.
    pub state: Option<&'static str>,
    /// Whether it is live (accepted or processing); a non-live owner is a leak that
    /// the next admission step's reconcile prunes.
    pub live: bool,
    /// When it claimed the slot.
    pub claimed_at: String,
    /// Its last heartbeat (the claim if none came).
    pub heartbeat_at: String,
    /// When its slot lease runs out without another heartbeat.
    pub lease_expires_at: String,
    /// Whether the lease ran out: the next reconcile fails it with
    /// `slot_lease_expired` and frees the slot.
    pub lease_expired: bool,
    /// The generation of its last publication (0: not published yet); its build
    /// heartbeats with it.
    pub generation: u32,
    /// When that generation was published; null before the first publication and
    /// after a failed publish was withdrawn.
    pub published_at: Option<String>,
    /// Whether its publication went quiet (nothing published, or no heartbeat
    /// within `resume_after`): the next delivery publishes the next generation.
    pub quiet: bool,
    /// Whether a reconcile marked it expiring (its lease ran out): it is being
    /// failed, and no heartbeat extends it any more.
    pub expiring: bool,
}

/// `queue show` JSON: `{"queue", "version", "max_concurrent", "paused",
/// "slot_lease_ms", "resume_after_ms", "latest_request_id",
/// "last_green": null | {"uri", "request_id"}, "owners": [OwnerView...],
/// "not_live_owners", "requests": [RequestView...]}`.
#[derive(Debug, Clone, Serialize)]
pub struct QueueView {
    /// The queue name.
    pub queue: String,
    /// The record's compare-and-set version.
    pub version: u64,
    /// The slot limit in force (stored with the queue; 0 is paused).
    pub max_concurrent: u32,
    /// Whether the queue is paused (its limit is 0).
    pub paused: bool,
    /// The queue's slot lease, in ms.
    pub slot_lease_ms: u64,
    /// How long a publication may go without a heartbeat before it is published
    /// again with the next generation, in ms.
    pub resume_after_ms: u64,
    /// The newest ingested request.
    pub latest_request_id: Option<String>,
    /// The last green bookmark.
    pub last_green: Option<LastGreenView>,
    /// The requests owning a slot.
    pub owners: Vec<OwnerView>,
    /// How many owners are not live.
    pub not_live_owners: usize,
    /// The newest requests (at most [`super::SHOW_LIMIT`]) and any older slot owner,
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
        let slots = if self.paused {
            "PAUSED".to_owned()
        } else {
            format!("{} slot(s)", self.max_concurrent)
        };
        let mut text = format!(
            "queue {} ({}; {slots}): head {}, last green {}\n",
            self.queue,
            format_args!("v{}", self.version),
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
                    if !o.live {
                        return format!("{} ({state}, NOT LIVE)", o.request);
                    }
                    let build = match &o.published_at {
                        Some(at) if o.quiet => format!(
                            "generation {} published at {at}, QUIET: published again on the next delivery",
                            o.generation
                        ),
                        Some(at) => format!("generation {} published at {at}", o.generation),
                        None => "not published yet".to_owned(),
                    };
                    let lease = if o.expiring {
                        format!("LEASE EXPIRED at {}, being failed", o.lease_expires_at)
                    } else if o.lease_expired {
                        format!("LEASE EXPIRED at {}", o.lease_expires_at)
                    } else {
                        format!("lease until {}", o.lease_expires_at)
                    };
                    format!("{} ({state}, {build}, {lease})", o.request)
                })
                .collect();
            text.push_str(&format!("slot owners: {}\n", owners.join(", ")));
        }
        if !self.requests.is_empty() {
            let mut table = Table::new(["REQUEST", "STATE", "URI", "STRATEGY"]);
            for r in &self.requests {
                let state = match r.reason {
                    Some(reason) => format!("{} ({reason})", r.state),
                    None => r.state.to_owned(),
                };
                table.row([
                    r.id.clone(),
                    state,
                    r.uri.clone(),
                    r.strategy.unwrap_or("-").to_owned(),
                ]);
            }
            text.push_str(&table.render());
        }
        text
    }
}

/// The view of `queue` and its requests at `now`.
pub fn queue_view(ctx: &Context, queue: &Queue, requests: &[Request], now: Timestamp) -> QueueView {
    let config = ctx.config.admission_for(&queue.name);
    let owners: Vec<OwnerView> = queue
        .owners
        .iter()
        .map(|(id, slot)| {
            let state = requests.iter().find(|r| &r.id == id).map(|r| r.state);
            OwnerView {
                request: id.to_string(),
                state: state.map(RequestState::as_str),
                live: owner_violation(id, state).is_none(),
                claimed_at: output::time(slot.claimed_at),
                heartbeat_at: output::time(slot.heartbeat_at),
                lease_expires_at: output::time(slot.expires_at(config.slot_lease)),
                lease_expired: slot.expired(config.slot_lease, now),
                generation: slot.generation.0,
                published_at: slot.published_at.map(output::time),
                quiet: !slot.expiring && slot.quiet(config.resume_after, now),
                expiring: slot.expiring,
            }
        })
        .collect();
    let limit = queue.limit(config.max_concurrent);
    QueueView {
        queue: queue.name.to_string(),
        version: queue.version.0,
        max_concurrent: limit,
        paused: limit == 0,
        slot_lease_ms: output::millis(config.slot_lease),
        resume_after_ms: output::millis(config.resume_after),
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
