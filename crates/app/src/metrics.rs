//! Metrics through the `metrics` facade: one table ([`METRICS`]) names every
//! metric with its type, unit, help and labels; `docs/metrics.md` is generated from
//! it ([`reference_markdown`]) and pinned by a test. The library only emits; the
//! binary installs an exporter (and may call [`describe`] first).
//!
//! Labels take bounded values only: outcomes, reasons and step names from fixed
//! sets, and queue names, which come from configuration and ingest (a deployment
//! has a bounded set of build queues; do not ingest into user-chosen queue names
//! if metrics are exported). Wallets, transactions, tokens and amounts are never
//! labels.

use std::fmt::Write as _;
use std::time::Duration;

use holdfast_domain::{SelectError, SelectionStats};

/// Seconds one select call took, from start to its final answer (backoffs included).
pub const SELECTION_DURATION: &str = "holdfast_selection_duration_seconds";
/// Select calls by outcome.
pub const SELECTION_OUTCOMES: &str = "holdfast_selection_outcomes_total";
/// Immediate retries per select call, summed over its legs.
pub const SELECTION_IMMEDIATE_RETRIES: &str = "holdfast_selection_immediate_retries";
/// Legs per select call.
pub const SELECTION_LEGS: &str = "holdfast_selection_legs";
/// Claim attempts lost to another consumer.
pub const SELECTION_LOCK_CONFLICTS: &str = "holdfast_selection_lock_conflicts_total";
/// Claim attempts on tokens no longer spendable.
pub const SELECTION_STALE_CANDIDATES: &str = "holdfast_selection_stale_candidates_total";
/// Token claims that failed with a store error (per token, as lock attempts).
pub const SELECTION_STORE_ERRORS: &str = "holdfast_selection_store_errors_total";
/// Distinct tokens named in claims per select call.
pub const SELECTION_DISTINCT_TOKENS: &str = "holdfast_selection_distinct_tokens_attempted";
/// Store round trips per select call.
pub const SELECTION_ROUND_TRIPS: &str = "holdfast_selection_round_trips";
/// Waits of select calls (and of admission heads), by how they ended.
pub const WAITS: &str = "holdfast_waits_total";
/// Locks released outside a select call.
pub const LOCKS_RELEASED: &str = "holdfast_locks_released_total";
/// Tokens marked spent by a confirmed consumer.
pub const TOKENS_SPENT: &str = "holdfast_tokens_spent_total";
/// Settlement statuses handled.
pub const SETTLEMENT_STATUSES: &str = "holdfast_settlement_statuses_total";
/// Failed attempts to record a settlement status.
pub const SETTLEMENT_PERSIST_FAILURES: &str = "holdfast_settlement_persist_failures_total";
/// Confirmed settlements refused because a selected token was already spent.
pub const SETTLEMENT_DOUBLE_SPENDS: &str = "holdfast_settlement_double_spends_total";
/// Locks a select found taken by the lease sweep before it answered.
pub const SELECT_LOCKS_LOST: &str = "holdfast_select_locks_lost_total";
/// Lease sweep ticks.
pub const SWEEP_RUNS: &str = "holdfast_sweep_runs_total";
/// Locks deleted by the lease sweep.
pub const SWEEP_DELETED: &str = "holdfast_sweep_locks_deleted_total";
/// Requests owning a build slot, per queue.
pub const ADMISSION_SLOT_OWNERS: &str = "holdfast_admission_slot_owners";
/// Build slots per queue.
pub const ADMISSION_SLOT_CAPACITY: &str = "holdfast_admission_slot_capacity";
/// Admission compare-and-set writes.
pub const ADMISSION_WRITES: &str = "holdfast_admission_writes_total";
/// Admission step answers.
pub const ADMISSION_REPLIES: &str = "holdfast_admission_replies_total";
/// Admission steps that failed.
pub const ADMISSION_ERRORS: &str = "holdfast_admission_errors_total";
/// Ingest to first publish, per queue.
pub const ADMISSION_WAIT: &str = "holdfast_admission_wait_seconds";
/// Heads held at a closed gate, per queue.
pub const ADMISSION_HELD: &str = "holdfast_admission_held_total";
/// Slot owners failed because their lease ran out, per queue.
pub const ADMISSION_EXPIRED: &str = "holdfast_admission_expired_owners_total";
/// Builds published again after their publication went quiet, per queue.
pub const ADMISSION_REPUBLISHED: &str = "holdfast_admission_republished_total";
/// Heartbeats of a generation that is not the last published, per queue.
pub const ADMISSION_STALE_HEARTBEATS: &str = "holdfast_admission_stale_heartbeats_total";

/// The type of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Monotonic count.
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// A distribution of observations.
    Histogram,
}

impl MetricKind {
    /// `counter`, `gauge` or `histogram`.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }
}

/// One row of the metrics table.
#[derive(Debug, Clone, Copy)]
pub struct MetricDef {
    /// The full name, `holdfast_` prefixed.
    pub name: &'static str,
    /// Its type.
    pub kind: MetricKind,
    /// The unit: `seconds`, `calls`, `tokens`, ...
    pub unit: &'static str,
    /// What it measures.
    pub help: &'static str,
    /// Its labels with their possible values.
    pub labels: &'static [(&'static str, &'static str)],
}

const OUTCOME: (&str, &str) = (
    "outcome",
    "success, insufficient_funds, funds_locked, too_many_inputs, deadline_exceeded, error",
);

/// Every metric holdfast emits.
pub static METRICS: &[MetricDef] = &[
    MetricDef {
        name: SELECTION_DURATION,
        kind: MetricKind::Histogram,
        unit: "seconds",
        help: "Duration of one select call, from start to final answer, backoffs included; at most `selection.deadline_ms`.",
        labels: &[OUTCOME],
    },
    MetricDef {
        name: SELECTION_OUTCOMES,
        kind: MetricKind::Counter,
        unit: "calls",
        help: "Select calls by outcome. funds_locked means retry later; so does deadline_exceeded (the call's deadline, `selection.deadline_ms`, passed before it saw the funds held by others); insufficient_funds means not enough money; too_many_inputs means the amount needs more tokens than `selection.max_inputs`.",
        labels: &[OUTCOME],
    },
    MetricDef {
        name: SELECTION_IMMEDIATE_RETRIES,
        kind: MetricKind::Histogram,
        unit: "retries",
        help: "Immediate retries (rescans and store errors) of one select call, summed over all its legs.",
        labels: &[],
    },
    MetricDef {
        name: SELECTION_LEGS,
        kind: MetricKind::Histogram,
        unit: "legs",
        help: "Legs (stubborn retries after a backoff, the first included) of one select call.",
        labels: &[],
    },
    MetricDef {
        name: SELECTION_LOCK_CONFLICTS,
        kind: MetricKind::Counter,
        unit: "attempts",
        help: "Token claims lost to another consumer (contended). Exclusive with stale and store errors per failed attempt.",
        labels: &[],
    },
    MetricDef {
        name: SELECTION_STALE_CANDIDATES,
        kind: MetricKind::Counter,
        unit: "attempts",
        help: "Token claims that found the token no longer spendable (stale). Not contention.",
        labels: &[],
    },
    MetricDef {
        name: SELECTION_STORE_ERRORS,
        kind: MetricKind::Counter,
        unit: "errors",
        help: "Token claims that failed with a store error or got no clear verdict (a failed window claim counts each token it named). Exclusive with conflicts and stale per failed attempt; failed fetches, balance reads and releases are not counted.",
        labels: &[],
    },
    MetricDef {
        name: SELECTION_DISTINCT_TOKENS,
        kind: MetricKind::Histogram,
        unit: "tokens",
        help: "Distinct tokens named in claims by one select call, over all legs; not observed when zero.",
        labels: &[],
    },
    MetricDef {
        name: SELECTION_ROUND_TRIPS,
        kind: MetricKind::Histogram,
        unit: "round trips",
        help: "Store round trips (fetches, claims, balance reads, releases) of one select call; a claim made with its read counts once, and a read its instance's snapshot answered not at all.",
        labels: &[],
    },
    MetricDef {
        name: WAITS,
        kind: MetricKind::Counter,
        unit: "waits",
        help: "Waits for freed tokens (a select between legs) or a freed slot (a held head), by how they ended: woken by a signal, or on the timer (the backoff or hold delay passed first).",
        labels: &[("waiter", "select, admission"), ("ended", "wakeup, timer")],
    },
    MetricDef {
        name: LOCKS_RELEASED,
        kind: MetricKind::Counter,
        unit: "locks",
        help: "Locks released by settlement, recovery or a cancelled select call.",
        labels: &[(
            "reason",
            "confirmed, deleted, recovery, cancelled, leftover, renewal",
        )],
    },
    MetricDef {
        name: TOKENS_SPENT,
        kind: MetricKind::Counter,
        unit: "tokens",
        help: "Tokens marked spent because their consumer was confirmed.",
        labels: &[],
    },
    MetricDef {
        name: SETTLEMENT_STATUSES,
        kind: MetricKind::Counter,
        unit: "statuses",
        help: "Settlement statuses handled, by reported status.",
        labels: &[(
            "status",
            "pending, confirmed, deleted, invalid, orphan, busy, unknown, unrecognised",
        )],
    },
    MetricDef {
        name: SETTLEMENT_PERSIST_FAILURES,
        kind: MetricKind::Counter,
        unit: "attempts",
        help: "Failed attempts to record a settlement status.",
        labels: &[],
    },
    MetricDef {
        name: SETTLEMENT_DOUBLE_SPENDS,
        kind: MetricKind::Counter,
        unit: "settlements",
        help: "Confirmed settlements refused because another confirmed transaction had already spent one of the selected tokens (nothing changed).",
        labels: &[],
    },
    MetricDef {
        name: SELECT_LOCKS_LOST,
        kind: MetricKind::Counter,
        unit: "locks",
        help: "Locks a select that outlived half the lease found taken by the lease sweep when it re-checked them before answering (the select went on without them).",
        labels: &[],
    },
    MetricDef {
        name: SWEEP_RUNS,
        kind: MetricKind::Counter,
        unit: "runs",
        help: "Lease sweep ticks by result (follower: another replica held sweep leadership).",
        labels: &[("result", "leader, follower, error")],
    },
    MetricDef {
        name: SWEEP_DELETED,
        kind: MetricKind::Counter,
        unit: "locks",
        help: "Locks deleted by the lease sweep.",
        labels: &[("reason", "expired, consumer_status")],
    },
    MetricDef {
        name: ADMISSION_SLOT_OWNERS,
        kind: MetricKind::Gauge,
        unit: "requests",
        help: "Requests owning a build slot, as last read by this replica.",
        labels: &[("queue", "configured queue names")],
    },
    MetricDef {
        name: ADMISSION_SLOT_CAPACITY,
        kind: MetricKind::Gauge,
        unit: "slots",
        help: "Build slots of the queue (its stored limit; 0 is paused), as last read by this replica.",
        labels: &[("queue", "configured queue names")],
    },
    MetricDef {
        name: ADMISSION_WRITES,
        kind: MetricKind::Counter,
        unit: "writes",
        help: "Admission compare-and-set writes; a claim write applied is a slot claimed.",
        labels: &[
            (
                "write",
                "stamp_latest, claim, release, prune, backfill, record_green, heartbeat, publish, withdraw, mark_expiring, set_limit, fence, supersede, mark_processing, finish, fail, expire",
            ),
            ("result", "applied, conflict"),
        ],
    },
    MetricDef {
        name: ADMISSION_REPLIES,
        kind: MetricKind::Counter,
        unit: "replies",
        help: "Answers of admission steps: what the caller was told to do.",
        labels: &[
            (
                "step",
                "ingest, process, outcome, dead_letter, reconcile, backfill, heartbeat, withdraw, set_limit",
            ),
            ("reply", "ack, hold, retry, dead_letter, publish, error"),
        ],
    },
    MetricDef {
        name: ADMISSION_ERRORS,
        kind: MetricKind::Counter,
        unit: "steps",
        help: "Admission steps that failed: a store error, or more conflicts than admission.max_conflicts.",
        labels: &[
            (
                "step",
                "ingest, process, outcome, dead_letter, reconcile, backfill, heartbeat, withdraw, set_limit",
            ),
            ("kind", "store, conflicts"),
        ],
    },
    MetricDef {
        name: ADMISSION_WAIT,
        kind: MetricKind::Histogram,
        unit: "seconds",
        help: "How long a request waited from its ingest to the first publish of its build.",
        labels: &[("queue", "queue names")],
    },
    MetricDef {
        name: ADMISSION_HELD,
        kind: MetricKind::Counter,
        unit: "holds",
        help: "Process deliveries held: a head at a closed gate (every slot taken, or the queue paused), or a duplicate of a publication whose build has not heartbeated yet (unconfirmed; it comes back when the publication would go quiet).",
        labels: &[
            ("queue", "queue names"),
            ("why", "full, paused, unconfirmed"),
        ],
    },
    MetricDef {
        name: ADMISSION_EXPIRED,
        kind: MetricKind::Counter,
        unit: "owners",
        help: "Slot owners failed with slot_lease_expired (no heartbeat within the slot lease) and freed.",
        labels: &[("queue", "queue names")],
    },
    MetricDef {
        name: ADMISSION_REPUBLISHED,
        kind: MetricKind::Counter,
        unit: "publications",
        help: "Builds published again with the next generation: no heartbeat within resume_after (a worker or build died), or a failed publish withdrawn.",
        labels: &[("queue", "queue names")],
    },
    MetricDef {
        name: ADMISSION_STALE_HEARTBEATS,
        kind: MetricKind::Counter,
        unit: "heartbeats",
        help: "Heartbeats of a build generation that is not the last published: that build was told to stop.",
        labels: &[("queue", "queue names")],
    },
];

/// Registers the help text and unit of every metric with the installed recorder.
pub fn describe() {
    for m in METRICS {
        match m.kind {
            MetricKind::Counter => metrics::describe_counter!(m.name, m.help),
            MetricKind::Gauge => metrics::describe_gauge!(m.name, m.help),
            MetricKind::Histogram => match m.unit {
                "seconds" => {
                    metrics::describe_histogram!(m.name, metrics::Unit::Seconds, m.help)
                }
                _ => metrics::describe_histogram!(m.name, m.help),
            },
        }
    }
}

/// The metrics reference (`docs/metrics.md`), generated from [`METRICS`].
pub fn reference_markdown() -> String {
    let mut out = String::new();
    out.push_str("# Metrics reference\n\n");
    out.push_str(
        "<!-- Generated from crates/app/src/metrics.rs by the test `metrics_reference_is_current`. Do not edit. -->\n\n",
    );
    out.push_str(
        "holdfast emits through the `metrics` facade; the embedding binary installs the\n\
         exporter. Names follow Prometheus conventions (`_total` counters, base units).\n\
         Label values come from fixed sets; the `queue` label takes the configured build\n\
         queue names, which a deployment keeps bounded. Wallets, transactions, tokens and\n\
         amounts are never labels.\n\n",
    );
    out.push_str("| name | type | unit | labels | help |\n|---|---|---|---|---|\n");
    for m in METRICS {
        let labels = if m.labels.is_empty() {
            "—".to_owned()
        } else {
            m.labels
                .iter()
                .map(|(k, v)| format!("`{k}`: {v}"))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} |",
            m.name,
            m.kind.as_str(),
            m.unit,
            labels,
            m.help
        );
    }
    out
}

/// How a select call ended, as the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectOutcomeLabel {
    /// Tokens were locked.
    Success,
    /// Not enough money.
    InsufficientFunds,
    /// Enough money, all locked by others through every leg (or until the
    /// call's deadline).
    FundsLocked,
    /// The amount needs more tokens than `selection.max_inputs`.
    TooManyInputs,
    /// The call's deadline passed before it could tell locked funds from a slow
    /// store.
    DeadlineExceeded,
    /// A store or input error.
    Error,
}

impl SelectOutcomeLabel {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SelectOutcomeLabel::Success => "success",
            SelectOutcomeLabel::InsufficientFunds => "insufficient_funds",
            SelectOutcomeLabel::FundsLocked => "funds_locked",
            SelectOutcomeLabel::TooManyInputs => "too_many_inputs",
            SelectOutcomeLabel::DeadlineExceeded => "deadline_exceeded",
            SelectOutcomeLabel::Error => "error",
        }
    }
}

/// The `outcome` label of a failed select: its own label for insufficient funds,
/// funds locked, too many inputs and a deadline; [`SelectOutcomeLabel::Error`]
/// for a store fault, a refused input or a handle shutting down.
impl From<&SelectError> for SelectOutcomeLabel {
    fn from(error: &SelectError) -> Self {
        match error {
            SelectError::InsufficientFunds { .. } => SelectOutcomeLabel::InsufficientFunds,
            SelectError::FundsLocked => SelectOutcomeLabel::FundsLocked,
            SelectError::TooManyInputs { .. } => SelectOutcomeLabel::TooManyInputs,
            SelectError::DeadlineExceeded { .. } => SelectOutcomeLabel::DeadlineExceeded,
            SelectError::Store(_) | SelectError::Input(_) | SelectError::ShuttingDown => {
                SelectOutcomeLabel::Error
            }
        }
    }
}

/// Records one finished select call. Each failed claim attempt counted in `stats`
/// moves exactly one of conflicts, stale and store errors.
pub fn record_selection(outcome: SelectOutcomeLabel, stats: &SelectionStats, elapsed: Duration) {
    let label = outcome.as_str();
    metrics::histogram!(SELECTION_DURATION, "outcome" => label).record(elapsed.as_secs_f64());
    metrics::counter!(SELECTION_OUTCOMES, "outcome" => label).increment(1);
    metrics::histogram!(SELECTION_IMMEDIATE_RETRIES).record(as_f64(stats.immediate_retries));
    metrics::histogram!(SELECTION_LEGS).record(as_f64(stats.legs));
    if stats.conflicts > 0 {
        metrics::counter!(SELECTION_LOCK_CONFLICTS).increment(stats.conflicts);
    }
    if stats.stale > 0 {
        metrics::counter!(SELECTION_STALE_CANDIDATES).increment(stats.stale);
    }
    if stats.store_errors > 0 {
        metrics::counter!(SELECTION_STORE_ERRORS).increment(stats.store_errors);
    }
    if stats.distinct_tokens_attempted > 0 {
        metrics::histogram!(SELECTION_DISTINCT_TOKENS)
            .record(as_f64(stats.distinct_tokens_attempted));
    }
    metrics::histogram!(SELECTION_ROUND_TRIPS).record(as_f64(stats.round_trips()));
    if stats.wakeups > 0 {
        metrics::counter!(WAITS, "waiter" => "select", "ended" => "wakeup")
            .increment(stats.wakeups);
    }
    let timer = stats.waits.saturating_sub(stats.wakeups);
    if timer > 0 {
        metrics::counter!(WAITS, "waiter" => "select", "ended" => "timer").increment(timer);
    }
}

/// A count as a histogram sample, saturating at `u32::MAX` (per-call counts never
/// come near it).
pub(crate) fn as_f64(n: u64) -> f64 {
    let exact = u32::try_from(n).unwrap_or(u32::MAX);
    f64::from(exact)
}
