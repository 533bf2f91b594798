//! `holdfast locks list | sweep`: lock diagnostics (age, consumer, consumer status,
//! leaks) and one lease sweep.

use clap::Subcommand;
use holdfast::domain::TxStatus;
use holdfast::ports::{Clock, LockInfo};
use serde::Serialize;

use super::output::{self, Rendered, Report, Table};
use super::{CliError, Context};
use holdfast::clock::SystemClock;

/// Lock subcommands.
#[derive(Debug, Subcommand)]
pub enum LocksCommand {
    /// List every lock, oldest first, with its age and consumer status; flag leaks
    List,
    /// Delete expired locks and locks of Deleted/Orphan consumers (one sweep tick)
    Sweep,
}

/// Runs a lock subcommand.
pub async fn run(ctx: &Context, cmd: LocksCommand) -> Result<Rendered, CliError> {
    match cmd {
        LocksCommand::List => list(ctx).await.map(|r| Rendered::of(&r)),
        LocksCommand::Sweep => sweep(ctx).await.map(|r| Rendered::of(&r)),
    }
}

/// Why a lock looks leaked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Leak {
    /// Its consumer is confirmed: settlement should have spent and released it.
    ConsumerConfirmed,
    /// Its consumer is deleted: settlement or the sweep should have released it.
    ConsumerDeleted,
    /// Its consumer is orphaned: the sweep releases it.
    ConsumerOrphan,
    /// It is older than the lease: the sweep releases it.
    OlderThanLease,
}

impl Leak {
    fn as_str(self) -> &'static str {
        match self {
            Leak::ConsumerConfirmed => "consumer confirmed",
            Leak::ConsumerDeleted => "consumer deleted",
            Leak::ConsumerOrphan => "consumer orphan",
            Leak::OlderThanLease => "older than lease",
        }
    }
}

/// One lock in `locks list` JSON.
#[derive(Debug, Serialize)]
pub struct LockView {
    /// The locked token, `tx:index`.
    pub token: String,
    /// The transaction holding it.
    pub consumer: String,
    /// The consumer's recorded status (`pending`, `confirmed`, ...), or null.
    pub consumer_status: Option<&'static str>,
    /// The owner id of the instance that claimed it (empty for locks of versions
    /// before owners were recorded).
    pub owner: String,
    /// When it was claimed (RFC 3339 UTC).
    pub created_at: String,
    /// Its age in milliseconds.
    pub age_ms: u64,
    /// Why it looks leaked; empty for a healthy lock.
    pub leaks: Vec<Leak>,
    /// Whether the next sweep deletes it.
    pub sweepable: bool,
}

/// `locks list` JSON: `{"now", "lease_expiry_ms", "count", "leaked", "locks": [LockView...]}`.
#[derive(Debug, Serialize)]
pub struct LockList {
    /// The time the ages are measured at (RFC 3339 UTC).
    pub now: String,
    /// The configured lease.
    pub lease_expiry_ms: u64,
    /// How many locks exist.
    pub count: usize,
    /// How many of them look leaked.
    pub leaked: usize,
    /// The locks, oldest first.
    pub locks: Vec<LockView>,
}

impl Report for LockList {
    fn human(&self) -> String {
        if self.locks.is_empty() {
            return "no locks\n".to_owned();
        }
        let mut table = Table::new(["TOKEN", "CONSUMER", "OWNER", "STATUS", "AGE", "LEAK"]);
        for lock in &self.locks {
            table.row([
                lock.token.clone(),
                lock.consumer.clone(),
                if lock.owner.is_empty() {
                    "-".to_owned()
                } else {
                    lock.owner.clone()
                },
                lock.consumer_status.unwrap_or("-").to_owned(),
                output::age(std::time::Duration::from_millis(lock.age_ms)),
                lock.leaks
                    .iter()
                    .map(|l| l.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            ]);
        }
        let mut text = table.render();
        text.push_str(&format!(
            "{} lock(s), {} leaked (lease {})\n",
            self.count,
            self.leaked,
            output::age(std::time::Duration::from_millis(self.lease_expiry_ms))
        ));
        text
    }
}

/// The diagnostic view of `locks` at `now` under the configured lease.
pub fn lock_list(ctx: &Context, locks: &[LockInfo], now: holdfast::domain::Timestamp) -> LockList {
    let lease = ctx.config.lease_config();
    let views: Vec<LockView> = locks
        .iter()
        .map(|lock| {
            let mut leaks = Vec::new();
            match lock.consumer_status {
                Some(TxStatus::Confirmed) => leaks.push(Leak::ConsumerConfirmed),
                Some(TxStatus::Deleted) => leaks.push(Leak::ConsumerDeleted),
                Some(TxStatus::Orphan) => leaks.push(Leak::ConsumerOrphan),
                _ => {}
            }
            if lock.created_at < now.saturating_sub(lease.lease_expiry) {
                leaks.push(Leak::OlderThanLease);
            }
            LockView {
                token: lock.token.to_string(),
                consumer: lock.consumer.to_string(),
                consumer_status: lock.consumer_status.map(TxStatus::as_str),
                owner: lock.owner.clone(),
                created_at: output::time(lock.created_at),
                age_ms: output::millis(now.since(lock.created_at)),
                sweepable: lease.is_expired(lock.created_at, lock.consumer_status, now),
                leaks,
            }
        })
        .collect();
    LockList {
        now: output::time(now),
        lease_expiry_ms: output::millis(lease.lease_expiry),
        count: views.len(),
        leaked: views.iter().filter(|v| !v.leaks.is_empty()).count(),
        locks: views,
    }
}

async fn list(ctx: &Context) -> Result<LockList, CliError> {
    let locks = ctx.backend.stores().locks.list_locks().await?;
    Ok(lock_list(ctx, &locks, SystemClock.now()))
}

/// `locks sweep` JSON: `{"leader": true, "expired": N, "released_by_status": N,
/// "remaining": N}`.
#[derive(Debug, Serialize)]
pub struct Swept {
    /// Whether this caller held sweep leadership for the tick (only the leader deletes).
    pub leader: bool,
    /// Locks deleted because they were older than the lease.
    pub expired: u64,
    /// Locks deleted because their consumer is Deleted or Orphan.
    pub released_by_status: u64,
    /// Locks left after the sweep.
    pub remaining: usize,
}

impl Report for Swept {
    fn human(&self) -> String {
        if !self.leader {
            return format!(
                "another replica holds the sweep this tick; nothing deleted ({} lock(s) remain)\n",
                self.remaining
            );
        }
        format!(
            "swept {} expired lock(s) and {} lock(s) of deleted/orphan consumers; {} remain\n",
            self.expired, self.released_by_status, self.remaining
        )
    }
}

async fn sweep(ctx: &Context) -> Result<Swept, CliError> {
    let locks = ctx.backend.stores().locks;
    let report =
        holdfast::sweeper::sweep_once(locks.as_ref(), &SystemClock, &ctx.config.lease_config())
            .await?;
    let remaining = locks.list_locks().await?.len();
    Ok(Swept {
        leader: report.leader,
        expired: report.expired,
        released_by_status: report.released_by_status,
        remaining,
    })
}
