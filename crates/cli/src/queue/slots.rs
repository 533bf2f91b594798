//! The operations on a queue's slots outside a message's path: a build's
//! heartbeat, a reconcile pass on demand, the stored slot limit (pause), and
//! retention of old requests.

use std::time::Duration;

use holdfast::domain::admission::{Pruned, PrunedWhy};
use holdfast::domain::{Generation, Heartbeat, QueueName, RequestId};
use serde::Serialize;

use super::{ensure_queue, no_queue};
use crate::output::{self, Rendered, Report};
use crate::{CliError, Context};
use holdfast::admission::{Admission, SetLimitError};

/// `queue heartbeat` JSON: `{"request", "generation", "lease_expires_at"}`.
#[derive(Debug, Clone, Serialize)]
pub struct HeartbeatView {
    /// The request.
    pub request: String,
    /// The generation of the build that heartbeated (the last one published).
    pub generation: u32,
    /// When the lease runs out without another heartbeat (RFC 3339 UTC).
    pub lease_expires_at: String,
}

impl Report for HeartbeatView {
    fn human(&self) -> String {
        format!(
            "{} owns its slot, generation {} its running build; lease until {}\n",
            self.request, self.generation, self.lease_expires_at
        )
    }
}

/// Extends the lease of `id`'s slot for the build of `generation`; a request that
/// owns no slot (any more) is [`CliError::NoSlot`], a build of an older generation
/// [`CliError::Stale`] (both exit 1): the build should stop.
pub async fn heartbeat(
    admission: &Admission,
    id: &RequestId,
    generation: Generation,
) -> Result<Rendered, CliError> {
    let why = match admission.heartbeat(id, generation).await? {
        Heartbeat::Extended { expires_at } => {
            return Ok(Rendered::of(&HeartbeatView {
                request: id.to_string(),
                generation: generation.0,
                lease_expires_at: output::time(expires_at),
            }));
        }
        Heartbeat::Stale { current } => {
            return Err(CliError::Stale {
                request: id.to_string(),
                generation: generation.0,
                current: current.0,
            });
        }
        Heartbeat::NotOwner { state: None } => "no such request".to_owned(),
        Heartbeat::NotOwner { state: Some(state) } => format!("it is {state}"),
        Heartbeat::LeaseExpired { expired_at } => format!(
            "its slot lease ran out at {}; the next reconcile fails it",
            output::time(expired_at)
        ),
    };
    Err(CliError::NoSlot {
        request: id.to_string(),
        why,
    })
}

/// A pruned owner in JSON: `{"request", "why": "lease_expired" | "terminal" |
/// "missing" | "foreign", "state": null | "failed" | ...}`.
#[derive(Debug, Clone, Serialize)]
pub struct PrunedView {
    /// The removed owner.
    pub request: String,
    /// Why it went.
    pub why: &'static str,
    /// Its stored state, for a terminal owner.
    pub state: Option<&'static str>,
}

impl From<&Pruned> for PrunedView {
    fn from(p: &Pruned) -> Self {
        let (why, state) = match p.why {
            PrunedWhy::Foreign => ("foreign", None),
            PrunedWhy::Missing => ("missing", None),
            PrunedWhy::Terminal {
                state,
                reason: Some(holdfast::domain::FailReason::SlotLeaseExpired),
            } => ("lease_expired", Some(state.as_str())),
            PrunedWhy::Terminal { state, .. } => ("terminal", Some(state.as_str())),
        };
        PrunedView {
            request: p.id.to_string(),
            why,
            state,
        }
    }
}

impl PrunedView {
    fn describe(&self) -> String {
        let why = match (self.why, self.state) {
            ("lease_expired", _) => {
                "no heartbeat within the slot lease: failed with slot_lease_expired".to_owned()
            }
            ("terminal", Some(state)) => format!("the request is {state}"),
            ("missing", _) => "no such request".to_owned(),
            ("foreign", _) => "a request of another queue".to_owned(),
            (other, _) => other.to_owned(),
        };
        format!("{}: {why}", self.request)
    }
}

/// `queue reconcile` JSON: `{"queue", "pruned": [PrunedView...]}`.
#[derive(Debug, Clone, Serialize)]
pub struct ReconcileView {
    /// The queue.
    pub queue: String,
    /// The owners this pass removed.
    pub pruned: Vec<PrunedView>,
}

impl Report for ReconcileView {
    fn human(&self) -> String {
        if self.pruned.is_empty() {
            return format!(
                "queue {}: every slot owner is live and within its lease; nothing pruned\n",
                self.queue
            );
        }
        let mut text = format!(
            "queue {}: pruned {} slot owner(s)\n",
            self.queue,
            self.pruned.len()
        );
        for p in &self.pruned {
            text.push_str(&format!("  {}\n", p.describe()));
        }
        text
    }
}

/// One reconcile pass over `queue`, printing what it pruned and why.
pub async fn reconcile(
    ctx: &Context,
    admission: &Admission,
    queue: &QueueName,
) -> Result<Rendered, CliError> {
    ensure_queue(ctx, queue).await?;
    let done = admission.reconcile(queue).await?;
    Ok(Rendered::of(&ReconcileView {
        queue: queue.to_string(),
        pruned: done.pruned.iter().map(PrunedView::from).collect(),
    }))
}

/// `queue set-limit` JSON: `{"queue", "max_concurrent", "paused", "owners"}`.
#[derive(Debug, Clone, Serialize)]
pub struct LimitView {
    /// The queue.
    pub queue: String,
    /// The stored limit now.
    pub max_concurrent: u32,
    /// Whether the queue is paused.
    pub paused: bool,
    /// How many requests own a slot now (more than the limit after lowering it,
    /// until they finish).
    pub owners: usize,
}

impl Report for LimitView {
    fn human(&self) -> String {
        if self.paused {
            format!(
                "queue {} paused: every head holds; {} owner(s) keep their slots\n",
                self.queue, self.owners
            )
        } else {
            format!(
                "queue {}: {} slot(s), {} owned\n",
                self.queue, self.max_concurrent, self.owners
            )
        }
    }
}

/// Sets the stored slot limit of `queue`.
pub async fn set_limit(
    ctx: &Context,
    admission: &Admission,
    queue: &QueueName,
    max: u32,
) -> Result<Rendered, CliError> {
    match admission.set_limit(queue, max).await {
        Ok(()) => {}
        Err(SetLimitError::TooLarge { max }) => {
            return Err(CliError::Argument {
                arg: "--max",
                value: max.to_string(),
                expected: format!(
                    "expected 0 (pause) to {}",
                    holdfast::admission::MAX_SLOT_LIMIT
                ),
            });
        }
        Err(SetLimitError::QueueMissing(_)) => return Err(no_queue(queue)),
        Err(SetLimitError::Admit(e)) => return Err(e.into()),
    }
    // The queue record alone says it (`queue show` would also list its requests).
    let Some(stored) = ctx.backend.stores().queues.load_queue(queue).await? else {
        return Err(no_queue(queue));
    };
    let limit = stored.limit(ctx.config.admission_for(queue).max_concurrent);
    Ok(Rendered::of(&LimitView {
        queue: queue.to_string(),
        max_concurrent: limit,
        paused: limit == 0,
        owners: stored.owners.len(),
    }))
}

/// `queue prune` JSON: `{"queue", "older_than_ms", "deleted"}`.
#[derive(Debug, Clone, Serialize)]
pub struct PruneView {
    /// The queue.
    pub queue: String,
    /// The age cut-off.
    pub older_than_ms: u64,
    /// Requests deleted.
    pub deleted: u64,
}

impl Report for PruneView {
    fn human(&self) -> String {
        format!(
            "queue {}: deleted {} terminal request(s) last written {} ago or earlier (kept the head, the last green and slot owners)\n",
            self.queue,
            self.deleted,
            output::age(Duration::from_millis(self.older_than_ms))
        )
    }
}

/// Deletes the terminal requests of `queue` older than `older_than`.
pub async fn prune(
    ctx: &Context,
    admission: &Admission,
    queue: &QueueName,
    older_than: Duration,
) -> Result<Rendered, CliError> {
    ensure_queue(ctx, queue).await?;
    let deleted = admission.prune(queue, older_than).await?;
    Ok(Rendered::of(&PruneView {
        queue: queue.to_string(),
        older_than_ms: output::millis(older_than),
        deleted,
    }))
}

/// The longest age `--older-than` takes: 100 years.
const MAX_AGE: Duration = Duration::from_secs(100 * 365 * 24 * 3_600);

/// Parses an age such as `7d`, `12h`, `30m`, `45s`, `500ms`, `2w` or `0s`: a whole
/// number and one unit.
pub fn parse_age(text: &str) -> Result<Duration, String> {
    let expected = "expected a whole number and a unit (ms, s, m, h, d, w), e.g. 7d or 0s";
    if !text.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(format!("{text:?} does not start with a number; {expected}"));
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit; {expected}"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a number; {expected}"))?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "w" => 604_800_000,
        _ => return Err(format!("{text:?} has an unknown unit {unit:?}; {expected}")),
    };
    n.checked_mul(unit_ms)
        .map(Duration::from_millis)
        .filter(|d| *d <= MAX_AGE)
        .ok_or_else(|| format!("{text:?} is longer than 100 years; {expected}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_parse_with_one_unit_and_refuse_the_rest() {
        assert_eq!(parse_age("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_age("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_age("12h"), Ok(Duration::from_secs(12 * 3_600)));
        assert_eq!(parse_age("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_age("2w"), Ok(Duration::from_secs(14 * 86_400)));
        for (bad, says) in [
            ("", "does not start with a number"),
            ("7", "has no unit"),
            ("d", "does not start with a number"),
            ("7 d", "unknown unit"),
            ("7days", "unknown unit"),
            ("-1s", "does not start with a number"),
            ("99999999999999999999d", "does not start with a number"),
            ("40000d", "longer than 100 years"),
        ] {
            let err = parse_age(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
            assert!(err.contains("e.g. 7d or 0s"), "{bad:?}: {err}");
        }
    }
}
