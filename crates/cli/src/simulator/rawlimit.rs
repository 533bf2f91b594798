//! The physical limit: the lock statements holdfast uses (a claim, then a release
//! by consumer) driven raw through the lock store, with no selection logic, at the
//! workload's concurrency and replicas, on a fresh database of the same type.
//! Holdfast's selects per second are reported as a fraction of these cycles per
//! second. Each task claims its own token (task `t` uses token `t mod n`), so
//! contention only appears when there are fewer tokens than tasks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use holdfast_domain::{Timestamp, TxId};
use holdfast_ports::{Clock, LockStore};
use serde::Serialize;

use super::SimulateError;
use super::clock::SimClock;
use super::figures::{round3, to_f64};
use super::provision::Provisioner;
use super::runner::{self, Progress, RunSettings};
use super::workload::Workload;
use holdfast::backend::Backend;

/// What the raw lock statements achieved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RawLimit {
    /// Claim-then-release cycles run (as many as the workload has requests).
    pub cycles: u64,
    /// Cycles per wall second.
    pub lock_cycles_per_second: f64,
    /// Statements per cycle (one claim, one release).
    pub statements_per_cycle: u64,
    /// holdfast's successful selects per second divided by the cycles per second.
    pub holdfast_fraction: Option<f64>,
    /// Claims that did not win (only when tasks outnumber tokens), or failed.
    pub claims_not_won: u64,
}

/// Runs the raw lock cycles for `workload` on a fresh database.
pub async fn run(
    workload: &Workload,
    settings: &RunSettings,
    provisioner: &Provisioner,
) -> Result<RawLimit, SimulateError> {
    let db = provisioner
        .create("raw")
        .await
        .map_err(SimulateError::Provision)?;
    let result = run_on(workload, settings, &db.url).await;
    let removed = provisioner.remove(&db).await;
    let limit = result?;
    removed.map_err(SimulateError::Provision)?;
    Ok(limit)
}

async fn run_on(
    workload: &Workload,
    settings: &RunSettings,
    url: &str,
) -> Result<RawLimit, SimulateError> {
    let options = settings.config.backend_options();
    let mut backends = Vec::new();
    for _ in 0..workload.replicas {
        backends.push(
            Backend::open(url, &options)
                .await
                .map_err(SimulateError::Open)?,
        );
    }
    let outcome = drive(workload, settings, &backends).await;
    for backend in &backends {
        backend.close().await;
    }
    outcome
}

async fn drive(
    workload: &Workload,
    settings: &RunSettings,
    backends: &[Backend],
) -> Result<RawLimit, SimulateError> {
    let first = backends
        .first()
        .ok_or_else(|| SimulateError::internal("a workload has at least one replica"))?;
    let seeding = Progress::new(
        Some(workload.token_count()),
        "raw limit: seeding",
        settings.progress,
    );
    let mut ids = Vec::new();
    runner::seed_wallets(
        first.stores().tokens.as_ref(),
        workload,
        settings.seed,
        &seeding,
        Some(&mut ids),
    )
    .await?;
    seeding.finish();
    let ids = Arc::new(ids);
    if ids.is_empty() {
        return Err(SimulateError::internal(
            "the raw limit needs at least one token",
        ));
    }
    let cycles = usize::try_from(workload.request_count()).unwrap_or(usize::MAX);
    let next = Arc::new(AtomicUsize::new(0));
    let not_won = Arc::new(AtomicU64::new(0));
    let clock = Arc::new(SimClock::new(Timestamp::from_millis(1_700_000_000_000), 1));
    let progress = Progress::new(
        Some(u64::try_from(cycles).unwrap_or(u64::MAX)),
        "raw limit",
        settings.progress,
    );
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..workload.concurrency {
        let locks: Arc<dyn LockStore> = backends[t % backends.len()].stores().locks;
        let ids = ids.clone();
        let next = next.clone();
        let not_won = not_won.clone();
        let clock = clock.clone();
        let progress = progress.clone();
        let consumer = TxId::new(format!("raw-{t}")).map_err(SimulateError::internal)?;
        tasks.spawn(async move {
            let token = &ids[t % ids.len()];
            while next.fetch_add(1, Ordering::Relaxed) < cycles {
                match locks.claim(&consumer, token, clock.now()).await {
                    Ok(holdfast_domain::ClaimVerdict::Won) => {}
                    _ => {
                        not_won.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if locks
                    .release_consumer(&consumer, clock.now(), false)
                    .await
                    .is_err()
                {
                    not_won.fetch_add(1, Ordering::Relaxed);
                }
                progress.inc(1);
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| SimulateError::Task(e.to_string()))?;
    }
    let wall = started.elapsed().as_secs_f64();
    progress.finish();
    let cycles = u64::try_from(cycles).unwrap_or(u64::MAX);
    Ok(RawLimit {
        cycles,
        lock_cycles_per_second: if wall > 0.0 {
            round3(to_f64(cycles) / wall)
        } else {
            0.0
        },
        statements_per_cycle: 2,
        holdfast_fraction: None,
        claims_not_won: not_won.load(Ordering::Relaxed),
    })
}
