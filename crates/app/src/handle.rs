//! [`Holdfast`]: the whole library behind one handle, opened from a [`Config`].
//!
//! [`Holdfast::open`] does the start-up a service would otherwise write by hand,
//! in this order: it describes the metrics (install your recorder first), opens
//! the backend (migrations included), finishes what earlier runs left settled but
//! unapplied ([`Settlement::recover`]), starts the lease sweeper and the
//! admission reconcile timer, and builds the selector (the sweep's lease wired
//! in), settlement and admission (wake-ups wired in). Every call through the
//! handle is counted; [`Holdfast::shutdown`] refuses new work (selects, mints,
//! balances: [`ErrorKind::ShuttingDown`](crate::ErrorKind)) but still takes
//! settlements, which finish work already begun; it waits for the calls in
//! flight and for admission workers to finish their current delivery, within a
//! bound, stops the background tasks and closes the pool. `docs/service.md` walks
//! through the lifecycle.
//!
//! The pieces stay usable one by one: [`Holdfast::selector`],
//! [`Holdfast::settlement`], [`Holdfast::admission`] and [`Holdfast::stores`]
//! hand them out (calls made on them directly are not counted by the drain).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use holdfast_domain::{
    BuildOutcome, Generation, Heartbeat, Precision, Quantity, QueueName, Reply, RequestId,
    Selected, SettlementStatus, TokenType, TxId, TxStatus, WalletId,
};
use holdfast_ports::{BuildPublisher, DeliveryError, NewToken, Output, Stores, TokenStoreError};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::admission::{Admission, AdmissionPolicy, AdmitError, Ancestry, NoAncestry};
use crate::backend::{Backend, BackendError};
use crate::clock::SystemClock;
use crate::config::{Config, ConfigError};
use crate::error::ErrorKind;
use crate::selector::{SelectError, TokenSelector};
use crate::settlement::{Confirmed, Recovery, SettleError, Settled, Settlement};
use crate::sweeper::{LeaseSweeper, SweepTotals, SweeperHandle};
use crate::worker::{Handled, RunOptions, RunReport, StoreDeliveries};

/// The default bound on [`Holdfast::shutdown`]'s drain: 30 s.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// What stopping the timers and closing the pool may take past the drain's
/// bound (a sweep or a reconcile pass in progress, an abandoned call's
/// connection): then the shutdown returns anyway.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// How often an admission worker's source scans its queues while nothing else
/// is due (wake-ups bring freed slots and new work sooner).
const SCAN_POLL: Duration = Duration::from_millis(500);

/// What [`Holdfast::open_with`] takes beyond the configuration.
#[derive(Clone)]
pub struct Options {
    /// How long [`Holdfast::shutdown`] waits for calls in flight and admission
    /// workers (default [`DEFAULT_DRAIN_TIMEOUT`]).
    pub drain_timeout: Duration,
    /// The request ancestry admission consults (default [`NoAncestry`]).
    pub ancestry: Arc<dyn Ancestry>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            ancestry: Arc::new(NoAncestry),
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("drain_timeout", &self.drain_timeout)
            .finish_non_exhaustive()
    }
}

/// Why [`Holdfast::open`] failed. Nothing is left running.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The configuration is invalid: a value out of range, a bad URL.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A service refused a setting the configuration check let through (a bug
    /// of holdfast's checks; the message names the setting).
    #[error("configuration: {0}")]
    Settings(String),
    /// The backend could not be opened (bad URL, unreachable, migration failed).
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The start-up recovery pass failed (the database is reachable but a
    /// settlement could not be applied); retry the open.
    #[error("start-up recovery: {0}")]
    Recovery(#[from] SettleError),
}

impl OpenError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            OpenError::Config(_) | OpenError::Settings(_) => ErrorKind::InvalidInput,
            OpenError::Backend(e) => e.kind(),
            OpenError::Recovery(e) => e.kind(),
        }
    }
}

/// Why minting or reading a balance through the handle failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The handle is shutting down and takes no new calls.
    #[error("shutting down: this instance takes no new calls; retry on another replica")]
    ShuttingDown,
    /// The token store refused or failed.
    #[error(transparent)]
    Store(#[from] TokenStoreError),
}

impl TokenError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            TokenError::ShuttingDown => ErrorKind::ShuttingDown,
            TokenError::Store(TokenStoreError::Conflict { .. }) => ErrorKind::Conflict,
            TokenError::Store(TokenStoreError::BalanceOverflow { .. }) => ErrorKind::InvalidInput,
            TokenError::Store(TokenStoreError::Fault(f)) => ErrorKind::from(f.kind()),
        }
    }
}

/// What [`Holdfast::shutdown`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Whether every call in flight and every admission worker finished within
    /// the bound, and the timers and the pool stopped in time. When not, the
    /// rest were abandoned: a select dropped mid-way gives back what it holds
    /// while the pool is open (after the close its locks stay until the lease),
    /// and an admission step is safe to repeat on another replica.
    pub drained: bool,
    /// Calls still in flight when the bound passed.
    pub abandoned_calls: usize,
    /// Admission deliveries handled over the handle's life, by outcome.
    pub admission: BTreeMap<Handled, u64>,
    /// What the lease sweeper did over the handle's life.
    pub sweeps: SweepTotals,
    /// Reconcile ticks this instance led.
    pub reconciles_led: u64,
}

/// Counts calls in flight and refuses new ones once shutting down. Settling is
/// finishing work already begun, so it is taken until the drain ends.
#[derive(Debug, Default)]
struct Gate {
    state: Mutex<GateState>,
    idle: Notify,
}

#[derive(Debug, Default)]
struct GateState {
    phase: Phase,
    in_flight: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    #[default]
    Open,
    /// New work refused; settlements of work begun still taken.
    Draining,
    /// Everything refused; the pool is closing or closed.
    Closed,
}

/// What a call through the handle is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    /// New work: a select, a mint, a balance, admission workers.
    New,
    /// Finishing work begun: a confirm or another status.
    Settle,
}

/// One call in flight; leaving (also by cancellation) counts it out.
struct Pass<'a>(&'a Gate);

impl Gate {
    fn state(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn enter(&self, call: Call) -> Option<Pass<'_>> {
        let mut state = self.state();
        match (state.phase, call) {
            (Phase::Open, _) | (Phase::Draining, Call::Settle) => {
                state.in_flight += 1;
                Some(Pass(self))
            }
            _ => None,
        }
    }

    /// Moves to `phase` if it is later than the current one (phases only
    /// advance: a second shutdown never reopens a closed gate).
    fn advance(&self, phase: Phase) {
        let mut state = self.state();
        state.phase = state.phase.max(phase);
    }

    fn in_flight(&self) -> usize {
        self.state().in_flight
    }

    /// Waits until no call is in flight and closes the gate in the same step,
    /// so no call can enter between the last one leaving and the close.
    async fn close_when_idle(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            {
                let mut state = self.state();
                if state.in_flight == 0 {
                    state.phase = Phase::Closed;
                    return;
                }
            }
            idle.await;
        }
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.in_flight -= 1;
        if state.in_flight == 0 {
            self.0.idle.notify_waiters();
        }
    }
}

/// The background tasks and the admission workers a handle runs.
#[derive(Default)]
struct Tasks {
    sweeper: Option<SweeperHandle>,
    reconciler: Option<(watch::Sender<()>, JoinHandle<u64>)>,
    workers: Vec<Arc<WorkerGroup>>,
}

type WorkerTask = JoinHandle<Result<RunReport, DeliveryError>>;

/// A worker group's list and what its stops found so far.
struct Stopped {
    running: Vec<WorkerTask>,
    /// Whether every worker stopped so far finished in time.
    finished: bool,
    /// What the workers stopped so far did.
    report: RunReport,
}

/// Admission workers started together, over one delivery source.
struct WorkerGroup {
    source: Arc<StoreDeliveries>,
    /// The workers not yet stopped. One stop at a time: a second (the shutdown
    /// beside [`AdmissionWorkers::stop`]) waits for the first and answers as it.
    tasks: tokio::sync::Mutex<Stopped>,
    /// Aborts the workers without the list: a stop whose wait for another stop
    /// runs out still ends them by its deadline.
    aborts: Vec<tokio::task::AbortHandle>,
}

impl WorkerGroup {
    /// Closes the source and waits until `deadline` for the workers to finish
    /// their current delivery; those still running then are aborted (their step
    /// is repeated by whoever handles the request next). Whether all finished,
    /// and what they did (also what an earlier stop of the group saw).
    async fn stop(&self, deadline: tokio::time::Instant) -> (bool, RunReport) {
        self.source.close();
        let Ok(mut state) = tokio::time::timeout_at(deadline, self.tasks.lock()).await else {
            self.aborts.iter().for_each(tokio::task::AbortHandle::abort);
            return (false, RunReport::default());
        };
        let Stopped {
            running,
            finished,
            report,
        } = &mut *state;
        // A worker leaves the list only once it ended: a stop dropped while it
        // waits leaves the rest to the next.
        while let Some(task) = running.last_mut() {
            match tokio::time::timeout_at(deadline, &mut *task).await {
                Ok(Ok(Ok(run))) => report.add(run),
                Ok(Ok(Err(e))) => {
                    tracing::warn!(error = %e, "an admission worker stopped on a source error");
                }
                // Aborted by a stop whose wait for this one ran out.
                Ok(Err(e)) if e.is_cancelled() => *finished = false,
                Ok(Err(e)) => tracing::error!(error = %e, "an admission worker panicked"),
                Err(_) => {
                    *finished = false;
                    task.abort();
                }
            }
            running.pop();
        }
        (*finished, report.clone())
    }
}

/// Admission workers started by [`Holdfast::run_admission`]. Dropping this
/// leaves them running until [`Holdfast::shutdown`].
pub struct AdmissionWorkers {
    group: Arc<WorkerGroup>,
}

impl std::fmt::Debug for AdmissionWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionWorkers").finish_non_exhaustive()
    }
}

impl AdmissionWorkers {
    /// The delivery source the workers take from: send it messages (an outcome, a
    /// new request's ingest) to have them handled by these workers.
    pub fn source(&self) -> &Arc<StoreDeliveries> {
        &self.group.source
    }

    /// Stops these workers (and no other part of the handle): they take no new
    /// delivery and finish their current one, within `bound`. Whether all
    /// finished in time, and what they did.
    pub async fn stop(&self, bound: Duration) -> (bool, RunReport) {
        self.group.stop(tokio::time::Instant::now() + bound).await
    }
}

/// holdfast behind one handle: opened from a [`Config`], shut down with a drain.
/// Share it with an `Arc` (or clone the pieces it hands out).
pub struct Holdfast {
    config: Config,
    backend: Backend,
    precision: Precision,
    selector: Arc<TokenSelector>,
    settlement: Arc<Settlement>,
    admission: Arc<Admission>,
    recovery: Recovery,
    drain_timeout: Duration,
    gate: Gate,
    tasks: Mutex<Tasks>,
}

impl std::fmt::Debug for Holdfast {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holdfast")
            .field("backend", &self.backend.shown_url())
            .field("in_flight", &self.gate.in_flight())
            .finish_non_exhaustive()
    }
}

impl Holdfast {
    /// Opens holdfast as `config` says, with default [`Options`] (module docs).
    /// Call it inside a tokio runtime; install a `metrics` recorder first if you
    /// export metrics.
    pub async fn open(config: Config) -> Result<Holdfast, OpenError> {
        Holdfast::open_with(config, Options::default()).await
    }

    /// As [`Holdfast::open`], with `options`.
    pub async fn open_with(config: Config, options: Options) -> Result<Holdfast, OpenError> {
        config.validate()?;
        let precision = config.precision_bits()?;
        crate::metrics::describe();
        let lease = config.lease_config();
        let backend = Backend::open(&config.db_url, &config.backend_options()).await?;
        let stores = backend.stores();
        let selector = match TokenSelector::new(
            stores.clone(),
            Arc::new(SystemClock),
            config.selection_config(),
            config.seed,
        ) {
            Ok(selector) => selector.with_lease(lease.lease_expiry),
            Err(e) => {
                backend.close().await;
                return Err(OpenError::Settings(e.to_string()));
            }
        };
        let settlement = Settlement::new(
            stores.clone(),
            Arc::new(SystemClock),
            config.persist_policy(),
        );
        let recovery = match settlement.recover().await {
            Ok(recovery) => recovery,
            Err(e) => {
                backend.close().await;
                return Err(e.into());
            }
        };
        let sweeper = match LeaseSweeper::spawn(stores.locks.clone(), Arc::new(SystemClock), lease)
        {
            Ok(sweeper) => sweeper,
            Err(e) => {
                backend.close().await;
                return Err(OpenError::Settings(e.to_string()));
            }
        };
        let policy = AdmissionPolicy::from_config(&config);
        let admission = Arc::new(
            Admission::new(stores.queues.clone(), options.ancestry, policy)
                .with_wakeups(stores.wake.clone()),
        );
        let reconciler = spawn_reconciler(&admission);
        tracing::info!(
            backend = backend.shown_url(),
            owner = backend.owner(),
            recovered = recovery.settled,
            "holdfast open"
        );
        Ok(Holdfast {
            config,
            backend,
            precision,
            selector: Arc::new(selector),
            settlement: Arc::new(settlement),
            admission,
            recovery,
            drain_timeout: options.drain_timeout,
            gate: Gate::default(),
            tasks: Mutex::new(Tasks {
                sweeper: Some(sweeper),
                reconciler: Some(reconciler),
                ..Tasks::default()
            }),
        })
    }

    /// Selects tokens of `token_type` from `wallet` covering `amount` and locks
    /// them for `tx` ([`TokenSelector::select`]).
    pub async fn select(
        &self,
        wallet: &WalletId,
        token_type: &TokenType,
        amount: Quantity,
        tx: &TxId,
    ) -> Result<Selected, SelectError> {
        let _pass = self
            .gate
            .enter(Call::New)
            .ok_or(SelectError::ShuttingDown)?;
        self.selector.select(wallet, token_type, amount, tx).await
    }

    /// Confirms `tx`: spends what it selected and adds `outputs` (and the change,
    /// paid to `change_to`) in one transaction ([`Settlement::confirm`]).
    pub async fn confirm(
        &self,
        tx: &TxId,
        outputs: &[Output],
        change_to: Option<&WalletId>,
    ) -> Result<Confirmed, SettleError> {
        let _pass = self
            .gate
            .enter(Call::Settle)
            .ok_or(SettleError::ShuttingDown)?;
        self.settlement.confirm(tx, outputs, change_to).await
    }

    /// Applies a status reported for `tx` ([`Settlement::on_status`]): Deleted
    /// or Invalid releases its tokens, Confirmed spends them (without outputs:
    /// prefer [`Holdfast::confirm`]), the others keep them.
    pub async fn settle(
        &self,
        tx: &TxId,
        status: SettlementStatus,
    ) -> Result<Settled, SettleError> {
        let _pass = self
            .gate
            .enter(Call::Settle)
            .ok_or(SettleError::ShuttingDown)?;
        self.settlement.on_status(tx, status).await
    }

    /// The status recorded for `tx`, if any: a retried request finds out whether
    /// its transaction was already confirmed (then [`Holdfast::confirm`] with the
    /// same outputs answers what was committed, `replayed`).
    pub async fn status(&self, tx: &TxId) -> Result<Option<TxStatus>, SettleError> {
        let _pass = self
            .gate
            .enter(Call::New)
            .ok_or(SettleError::ShuttingDown)?;
        let stores = self.backend.stores();
        stores
            .statuses
            .status(tx)
            .await
            .map_err(|source| SettleError::Status {
                tx: tx.clone(),
                source,
            })
    }

    /// Releases every token `tx` holds: the transaction will not go out (it is
    /// recorded as Deleted).
    pub async fn release(&self, tx: &TxId) -> Result<Settled, SettleError> {
        self.settle(tx, SettlementStatus::Known(TxStatus::Deleted))
            .await
    }

    /// Adds tokens (a deposit, a payment received); idempotent for identical
    /// tokens. Returns how many were new.
    pub async fn mint(&self, tokens: &[NewToken]) -> Result<u64, TokenError> {
        let _pass = self.gate.enter(Call::New).ok_or(TokenError::ShuttingDown)?;
        let stores = self.backend.stores();
        Ok(stores.tokens.add_tokens(tokens).await?)
    }

    /// The sum of `wallet`'s spendable, unspent tokens of `token_type`, locks
    /// ignored: what a select could cover once the locks settle.
    pub async fn balance(
        &self,
        wallet: &WalletId,
        token_type: &TokenType,
    ) -> Result<Quantity, TokenError> {
        let _pass = self.gate.enter(Call::New).ok_or(TokenError::ShuttingDown)?;
        let stores = self.backend.stores();
        Ok(stores.tokens.balance(wallet, token_type).await?)
    }

    /// The precision quantities are parsed and stored with (`precision`):
    /// `Quantity::parse(text, holdfast.precision())`.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Starts `workers` admission workers ([`Admission::run`]) over the queues
    /// `queues`, publishing admitted builds to `publisher`. A queue comes into
    /// being with its first request; its limit is `admission.max_concurrent` (or
    /// its `[admission.queues.NAME]` override) until [`Admission::set_limit`]
    /// stores one. The workers run until [`AdmissionWorkers::stop`] or
    /// [`Holdfast::shutdown`], which let them finish their current delivery.
    pub fn run_admission(
        &self,
        queues: Vec<QueueName>,
        publisher: Arc<dyn BuildPublisher>,
        workers: usize,
    ) -> Result<AdmissionWorkers, AdmitError> {
        // Checked under the lock `shutdown` takes the workers with: a group is
        // either refused or stopped by the shutdown, never left running.
        let mut running = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        if self.gate.enter(Call::New).is_none() {
            return Err(AdmitError::ShuttingDown);
        }
        let stores = self.backend.stores();
        let source = Arc::new(
            StoreDeliveries::new(stores.queues.clone(), queues, SCAN_POLL)
                .with_wakeups(stores.wake.clone())
                .with_policy(self.admission.policy().clone()),
        );
        let tasks: Vec<WorkerTask> = (0..workers.max(1))
            .map(|_| {
                let (admission, source, publisher) =
                    (self.admission.clone(), source.clone(), publisher.clone());
                tokio::spawn(async move {
                    admission
                        .run(source.as_ref(), publisher.as_ref(), RunOptions::default())
                        .await
                })
            })
            .collect();
        let group = Arc::new(WorkerGroup {
            source,
            aborts: tasks.iter().map(JoinHandle::abort_handle).collect(),
            tasks: tokio::sync::Mutex::new(Stopped {
                running: tasks,
                finished: true,
                report: RunReport::default(),
            }),
        });
        running.workers.push(group.clone());
        Ok(AdmissionWorkers { group })
    }

    /// Extends the slot lease of a running build ([`Admission::heartbeat`]);
    /// taken while the handle drains, since the build is work already begun.
    pub async fn heartbeat(
        &self,
        id: &RequestId,
        generation: Generation,
    ) -> Result<Heartbeat, AdmitError> {
        let _pass = self
            .gate
            .enter(Call::Settle)
            .ok_or(AdmitError::ShuttingDown)?;
        self.admission.heartbeat(id, generation).await
    }

    /// Records a build's outcome and frees its slot ([`Admission::outcome`]);
    /// taken while the handle drains.
    pub async fn outcome(
        &self,
        id: &RequestId,
        outcome: BuildOutcome,
    ) -> Result<Reply, AdmitError> {
        let _pass = self
            .gate
            .enter(Call::Settle)
            .ok_or(AdmitError::ShuttingDown)?;
        self.admission.outcome(id, outcome).await
    }

    /// The selector (lease wired in); calls made on it directly are not drained.
    pub fn selector(&self) -> &Arc<TokenSelector> {
        &self.selector
    }

    /// Settlement; calls made on it directly are not drained.
    pub fn settlement(&self) -> &Arc<Settlement> {
        &self.settlement
    }

    /// Admission (wake-ups wired in): ingest, set_limit, reconcile; calls made
    /// on it directly are not drained.
    pub fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }

    /// The backend's ports, for what the handle does not wrap.
    pub fn stores(&self) -> Stores {
        self.backend.stores()
    }

    /// The backend (its kind, redacted URL, owner id, schema version).
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The configuration the handle was opened with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What the start-up recovery pass settled.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// Whether [`Holdfast::shutdown`] has begun: new work is refused (a service
    /// reports itself not ready).
    pub fn is_shutting_down(&self) -> bool {
        self.gate.state().phase != Phase::Open
    }

    /// Calls through the handle in flight now.
    pub fn in_flight(&self) -> usize {
        self.gate.in_flight()
    }

    /// Shuts down within the drain bound ([`Options::drain_timeout`]): refuses
    /// new work (selects, mints, balances, admission workers), still takes
    /// settlements, heartbeats and outcomes (work already begun) until the drain
    /// ends, stops the admission workers after their current delivery, waits for
    /// the calls in flight, stops the sweeper and the reconcile timer, and
    /// closes the pool (each bounded: 2 s past the drain's bound at most). The
    /// drain counts calls, not work: finish a payment between its select and its
    /// confirm before calling this (`docs/service.md`). On PostgreSQL calls on
    /// the pieces handed out fail once the pool is closed. A second call finds
    /// nothing left to stop.
    pub async fn shutdown(&self) -> ShutdownReport {
        self.shutdown_within(self.drain_timeout).await
    }

    /// As [`Holdfast::shutdown`], with the bound `bound`.
    pub async fn shutdown_within(&self, bound: Duration) -> ShutdownReport {
        self.gate.advance(Phase::Draining);
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(PoisonError::into_inner));
        let deadline = tokio::time::Instant::now() + bound;
        for group in &tasks.workers {
            group.source.close();
        }
        let (mut drained, mut admission) = (true, RunReport::default());
        for group in &tasks.workers {
            let (finished, run) = group.stop(deadline).await;
            drained &= finished;
            admission.add(run);
        }
        let mut report = ShutdownReport {
            admission: admission.handled,
            ..ShutdownReport::default()
        };
        // Builds finishing now still heartbeat and report through the handle.
        drained &= tokio::time::timeout_at(deadline, self.gate.close_when_idle())
            .await
            .is_ok();
        self.gate.advance(Phase::Closed);
        report.abandoned_calls = self.gate.in_flight();
        report.drained = drained && report.abandoned_calls == 0;
        // Stopping the timers and closing the pool wait for a sweep, a reconcile
        // pass or an abandoned call's connection: bounded too, with a short
        // grace past the drain's bound.
        let stop_by = deadline.max(tokio::time::Instant::now()) + STOP_GRACE;
        let stopped = tokio::time::timeout_at(stop_by, async {
            if let Some((stop, task)) = tasks.reconciler {
                drop(stop);
                report.reconciles_led = task.await.unwrap_or_default();
            }
            if let Some(sweeper) = tasks.sweeper {
                report.sweeps = sweeper.shutdown().await;
            }
            self.backend.close().await;
        })
        .await;
        if stopped.is_err() {
            report.drained = false;
            tracing::warn!("holdfast shutdown: the timers or the pool did not stop in time");
        }
        tracing::info!(
            drained = report.drained,
            abandoned = report.abandoned_calls,
            "holdfast shut down"
        );
        report
    }
}

impl Drop for Holdfast {
    /// A handle dropped without [`Holdfast::shutdown`] stops its admission
    /// workers at their next delivery (the sweeper and the timer stop with their
    /// handles).
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().unwrap_or_else(PoisonError::into_inner);
        for group in &tasks.workers {
            group.source.close();
        }
    }
}

/// The admission reconcile timer: expires silent slot owners even when no head
/// waits on their queue (one replica leads each tick).
fn spawn_reconciler(admission: &Arc<Admission>) -> (watch::Sender<()>, JoinHandle<u64>) {
    let (stop, mut stopped) = watch::channel(());
    let admission = admission.clone();
    let period = admission.policy().reconcile_period();
    let task = tokio::spawn(async move {
        admission
            .reconcile_periodically(period, async move {
                let _ = stopped.changed().await;
            })
            .await
    });
    (stop, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draining_refuses_new_work_and_takes_settlements_until_closed() {
        let gate = Gate::default();
        let select = gate.enter(Call::New).expect("open");
        gate.advance(Phase::Draining);
        assert!(gate.enter(Call::New).is_none(), "new work is refused");
        let confirm = gate
            .enter(Call::Settle)
            .expect("a settlement finishes work begun");
        assert_eq!(gate.in_flight(), 2);
        drop((select, confirm));
        assert_eq!(gate.in_flight(), 0);
        gate.advance(Phase::Closed);
        assert!(
            gate.enter(Call::Settle).is_none(),
            "closed refuses everything"
        );
    }

    #[tokio::test]
    async fn the_drain_ends_when_the_last_call_leaves_also_by_cancellation() {
        let gate = Arc::new(Gate::default());
        let pass = gate.enter(Call::New).expect("open");
        gate.advance(Phase::Draining);
        let waiting = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.close_when_idle().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a call is in flight");
        // A dropped (cancelled) call counts out as a finished one does.
        drop(pass);
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("drained")
            .expect("task");
        assert!(
            gate.enter(Call::Settle).is_none(),
            "the gate closed as the last call left"
        );
    }
}
