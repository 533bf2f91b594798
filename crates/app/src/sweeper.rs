//! The lease sweeper: a background task that calls [`LockStore::sweep`] every
//! `cleanup_period` with the lease expiry (`docs/lifecycle.md`), until
//! [`SweeperHandle::shutdown`].
//!
//! The first sweep runs at once, then one per period on tokio time (so tests can
//! pause and advance it); a tick that falls behind is delayed, not bunched. A
//! failed sweep is logged and counted, and the next tick tries again. Which replica
//! deletes is the adapter's business (leadership); the report says whether this
//! one did.

use std::sync::Arc;

use holdfast_domain::{LeaseConfig, LeaseConfigError};
use holdfast_ports::{Clock, LockStore, LockStoreError, SweepReport};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tracing::Instrument;

use crate::metrics as m;

/// Totals of a sweeper's life, returned by [`SweeperHandle::shutdown`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepTotals {
    /// Ticks run.
    pub runs: u64,
    /// Ticks where this replica held leadership.
    pub led: u64,
    /// Ticks that failed.
    pub errors: u64,
    /// Locks deleted for age.
    pub expired: u64,
    /// Locks deleted for their consumer's status.
    pub released_by_status: u64,
}

/// Runs one sweep now: deletes locks older than `config.lease_expiry` (and locks of
/// Deleted or Orphan consumers) if this caller wins leadership for the tick.
pub async fn sweep_once(
    locks: &dyn LockStore,
    clock: &dyn Clock,
    config: &LeaseConfig,
) -> Result<SweepReport, LockStoreError> {
    let span = tracing::info_span!("sweep", lease_ms = config.lease_expiry.as_millis());
    async {
        let result = locks.sweep(config.sweep_rule(clock.now())).await;
        match &result {
            Ok(report) => {
                let role = if report.leader { "leader" } else { "follower" };
                metrics::counter!(m::SWEEP_RUNS, "result" => role).increment(1);
                metrics::counter!(m::SWEEP_DELETED, "reason" => "expired")
                    .increment(report.expired);
                metrics::counter!(m::SWEEP_DELETED, "reason" => "consumer_status")
                    .increment(report.released_by_status);
                tracing::debug!(
                    leader = report.leader,
                    expired = report.expired,
                    released_by_status = report.released_by_status,
                    "swept"
                );
            }
            Err(e) => {
                metrics::counter!(m::SWEEP_RUNS, "result" => "error").increment(1);
                tracing::warn!(error = %e, "lease sweep failed; retrying next tick");
            }
        }
        result
    }
    .instrument(span)
    .await
}

/// Starts sweeps in the background.
#[derive(Debug, Clone, Copy)]
pub struct LeaseSweeper;

impl LeaseSweeper {
    /// Spawns the sweeper on the current tokio runtime. Panics only if called
    /// outside a runtime (as [`tokio::spawn`] does).
    pub fn spawn(
        locks: Arc<dyn LockStore>,
        clock: Arc<dyn Clock>,
        config: LeaseConfig,
    ) -> Result<SweeperHandle, LeaseConfigError> {
        config.validate()?;
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut totals = SweepTotals::default();
            let mut ticks = tokio::time::interval(config.cleanup_period);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    biased;
                    _ = stopped.changed() => break,
                    _ = ticks.tick() => {}
                }
                let sweep = sweep_once(locks.as_ref(), clock.as_ref(), &config);
                // A shutdown during a sweep waits for it: a sweep is one short
                // transaction, and abandoning it would only make its outcome unknown.
                let result = sweep.await;
                totals.runs += 1;
                match result {
                    Ok(report) => {
                        totals.led += u64::from(report.leader);
                        totals.expired += report.expired;
                        totals.released_by_status += report.released_by_status;
                    }
                    Err(_) => totals.errors += 1,
                }
                if *stopped.borrow() {
                    break;
                }
            }
            tracing::info!(runs = totals.runs, "lease sweeper stopped");
            totals
        });
        Ok(SweeperHandle { stop, task })
    }
}

/// A running sweeper. Dropping the handle without [`SweeperHandle::shutdown`] also
/// stops the task at its next wait.
#[derive(Debug)]
pub struct SweeperHandle {
    stop: watch::Sender<bool>,
    task: JoinHandle<SweepTotals>,
}

impl SweeperHandle {
    /// Stops the sweeper (after the sweep in progress, if any) and returns its totals.
    pub async fn shutdown(self) -> SweepTotals {
        let _ = self.stop.send(true);
        match self.task.await {
            Ok(totals) => totals,
            Err(e) => {
                tracing::error!(error = %e, "lease sweeper task failed");
                SweepTotals::default()
            }
        }
    }
}
