//! The `Holdfast` handle as a service uses it, through `holdfast::` names only:
//! open from a configuration, pay under concurrent load, shut down mid-load, and
//! reopen to find every unit of value where the payments left it. On SQLite and
//! on a real PostgreSQL.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use holdfast::{
    AdmitError, BuildOutcome, BuildPlan, BuildPublisher, Config, DeliveryError, ErrorKind,
    Generation, Handled, Heartbeat, Holdfast, Ingest, NewToken, Output, Precision, Quantity,
    QueueName, Request, RevisionUri, RunReport, SelectError, SettleError, TokenError, TokenId,
    TokenType, TxId, WalletId, async_trait,
};
use tokio::sync::Notify;

use crate::pg_support::TestDb;

const DEPOSITS: u32 = 200;
const DEPOSIT: u128 = 100;
const PAYERS: u64 = 24;

fn q(v: u128) -> Quantity {
    Quantity::new(v, Precision::default()).expect("in range")
}

fn config(db_url: String) -> Config {
    Config {
        db_url,
        ..Config::default()
    }
}

async fn fund(holdfast: &Holdfast, wallet: &WalletId, chf: &TokenType) {
    let tokens: Vec<NewToken> = (0..DEPOSITS)
        .map(|i| NewToken {
            id: TokenId::new(TxId::new(format!("deposit-{i}")).expect("id"), 0),
            wallet: wallet.clone(),
            token_type: chf.clone(),
            quantity: q(DEPOSIT),
            spendable: true,
        })
        .collect();
    assert_eq!(
        holdfast.mint(&tokens).await.expect("mint"),
        u64::from(DEPOSITS)
    );
    // Minting is idempotent for identical tokens.
    assert_eq!(holdfast.mint(&tokens).await.expect("mint again"), 0);
}

/// What the payers saw, by answer.
#[derive(Debug, Default)]
struct Answers {
    paid: AtomicU64,
    refused_new: AtomicU64,
    retry_later: AtomicU64,
    poor: AtomicU64,
    /// Payments selected but refused at their confirm: the drain counts calls,
    /// not work (`docs/service.md`), so the gate may close between a select and
    /// its confirm. Finished after the restart.
    unfinished: Mutex<Vec<(TxId, Quantity)>>,
}

/// One payer: select, then confirm paying `bob` with change back to `alice`,
/// until the handle refuses new work.
async fn pay(holdfast: Arc<Holdfast>, payer: u64, answers: Arc<Answers>) {
    let (alice, chf) = (
        WalletId::new("alice").expect("id"),
        TokenType::new("CHF").expect("type"),
    );
    for n in 0u64.. {
        let tx = TxId::new(format!("pay-{payer}-{n}")).expect("id");
        let amount = q(u128::from(1 + (payer * 7 + n * 13) % 150));
        match holdfast.select(&alice, &chf, amount, &tx).await {
            Ok(_) => {}
            Err(SelectError::ShuttingDown) => {
                answers.refused_new.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(SelectError::InsufficientFunds { .. }) => {
                answers.poor.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(e) => {
                assert!(e.kind().is_transient(), "{tx}: {e}");
                answers.retry_later.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        }
        // A payment begun is finished while the handle drains, unless the gate
        // closed since its select (no call of it was in flight then).
        match holdfast.confirm(&tx, &[payee(amount)], Some(&alice)).await {
            Ok(_) => answers.paid.fetch_add(1, Ordering::Relaxed),
            Err(SettleError::ShuttingDown) => {
                let mut unfinished = answers
                    .unfinished
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                unfinished.push((tx, amount));
                return;
            }
            Err(e) => panic!("{tx}: {e}"),
        };
    }
}

/// What a payment of `amount` pays `bob`.
fn payee(amount: Quantity) -> Output {
    Output {
        wallet: WalletId::new("bob").expect("id"),
        token_type: TokenType::new("CHF").expect("type"),
        quantity: amount,
    }
}

/// Opens, pays with `PAYERS` concurrent payers, shuts down mid-load, reopens
/// and checks that value is conserved and nothing is left locked.
async fn pay_and_shut_down(db_url: String) {
    let (alice, bob, chf) = (
        WalletId::new("alice").expect("id"),
        WalletId::new("bob").expect("id"),
        TokenType::new("CHF").expect("type"),
    );
    let holdfast = Arc::new(Holdfast::open(config(db_url.clone())).await.expect("open"));
    fund(&holdfast, &alice, &chf).await;
    let answers = Arc::new(Answers::default());
    let payers: Vec<_> = (0..PAYERS)
        .map(|p| tokio::spawn(pay(holdfast.clone(), p, answers.clone())))
        .collect();
    // Mid-load: once some payments went through (polling the payers' counter).
    while answers.paid.load(Ordering::Relaxed) < 30 {
        tokio::task::yield_now().await;
        // sleep: poll interval of the payers' counter.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let report = holdfast.shutdown().await;
    assert!(report.drained, "{report:?}");
    assert_eq!(report.abandoned_calls, 0);
    for payer in payers {
        payer.await.expect("payer");
    }
    let unfinished = std::mem::take(
        &mut *answers
            .unfinished
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    assert_eq!(
        answers.refused_new.load(Ordering::Relaxed)
            + answers.poor.load(Ordering::Relaxed)
            + u64::try_from(unfinished.len()).expect("count"),
        PAYERS,
        "every payer stopped on a refusal: {answers:?}"
    );
    assert!(
        answers.refused_new.load(Ordering::Relaxed) > 0,
        "the shutdown came mid-load: {answers:?}"
    );
    // After the drain nothing is taken, settlements included.
    let late = TxId::new("late").expect("id");
    let refused = holdfast.select(&alice, &chf, q(1), &late).await;
    assert_eq!(refused, Err(SelectError::ShuttingDown));
    assert_eq!(
        refused.unwrap_err().kind(),
        ErrorKind::ShuttingDown,
        "a shutting-down answer maps to its own kind"
    );
    let refused = holdfast.confirm(&late, &[], None).await;
    assert_eq!(refused, Err(SettleError::ShuttingDown));
    assert_eq!(
        holdfast.balance(&alice, &chf).await,
        Err(TokenError::ShuttingDown)
    );
    drop(holdfast);

    let reopened = Holdfast::open(config(db_url)).await.expect("reopen");
    // The payments the drain caught between select and confirm keep their
    // selections across the restart, and are finished now.
    for (tx, amount) in unfinished {
        let confirmed = reopened.confirm(&tx, &[payee(amount)], Some(&alice)).await;
        assert!(confirmed.is_ok(), "{tx} after the restart: {confirmed:?}");
    }
    let left = reopened.balance(&alice, &chf).await.expect("balance");
    let paid = reopened.balance(&bob, &chf).await.expect("balance");
    assert_eq!(
        left.value() + paid.value(),
        u128::from(DEPOSITS) * DEPOSIT,
        "value is conserved: alice {left} + bob {paid}"
    );
    assert!(paid.value() > 0, "payments went through: {answers:?}");
    // Every select was confirmed: nothing is left selected.
    let unsettled = reopened
        .stores()
        .locks
        .unsettled()
        .await
        .expect("unsettled");
    assert!(unsettled.is_empty(), "{unsettled:?}");
    assert!(reopened.shutdown().await.drained);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handle_pays_shuts_down_mid_load_and_conserves_value_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("handle.db").display());
    pay_and_shut_down(url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handle_pays_shuts_down_mid_load_and_conserves_value_postgres() {
    let Some(db) = TestDb::create("handle_postgres").await else {
        return;
    };
    pay_and_shut_down(db.url.clone()).await;
}

/// A call that cannot finish does not hold the shutdown past its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_is_bounded_by_a_call_that_cannot_finish() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bounded.db");
    let mut config = config(format!("sqlite://{}", path.display()));
    config.busy_timeout_ms = 60_000;
    let holdfast = Arc::new(Holdfast::open(config).await.expect("open"));
    let (alice, chf) = alice_chf();
    fund(&holdfast, &alice, &chf).await;
    // Another process holds the write lock: the select's claim waits for it.
    let blocker = rusqlite::Connection::open(&path).expect("open file");
    blocker
        .execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    let stuck = shut_down_beside_a_stuck_select(&holdfast).await;
    blocker.execute_batch("ROLLBACK").expect("rollback");
    // It answers once the lock is gone (whatever it answers: the pool closed
    // under it), and it was never counted as drained.
    stuck.await.expect("select task").ok();
}

/// The same on PostgreSQL: the select's claim waits behind row locks another
/// session holds on the wallet's tokens, on a pooled connection the shutdown
/// closes the pool around.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_is_bounded_by_a_call_that_cannot_finish_postgres() {
    let Some(db) = TestDb::create("handle_drain_bound").await else {
        return;
    };
    let holdfast = Arc::new(Holdfast::open(config(db.url.clone())).await.expect("open"));
    let (alice, chf) = alice_chf();
    fund(&holdfast, &alice, &chf).await;
    let mut other = db.connection().await;
    sqlx::query("BEGIN")
        .execute(&mut other)
        .await
        .expect("begin");
    sqlx::query("SELECT 1 FROM tokens WHERE wallet = $1 FOR UPDATE")
        .bind(alice.as_str())
        .execute(&mut other)
        .await
        .expect("row locks");
    let stuck = shut_down_beside_a_stuck_select(&holdfast).await;
    sqlx::query("ROLLBACK")
        .execute(&mut other)
        .await
        .expect("rollback");
    stuck.await.expect("select task").ok();
}

fn alice_chf() -> (WalletId, TokenType) {
    (
        WalletId::new("alice").expect("id"),
        TokenType::new("CHF").expect("type"),
    )
}

/// Starts a select of alice's CHF that cannot finish (the caller blocks its
/// claim), shuts `holdfast` down with a bound of 300 ms once the select is in
/// flight, checks the shutdown returned soon, undrained, with that call
/// abandoned, and hands back the select.
async fn shut_down_beside_a_stuck_select(
    holdfast: &Arc<Holdfast>,
) -> tokio::task::JoinHandle<Result<holdfast::Selected, SelectError>> {
    let stuck = {
        let holdfast = holdfast.clone();
        tokio::spawn(async move {
            let (alice, chf) = alice_chf();
            let tx = TxId::new("stuck").expect("id");
            holdfast.select(&alice, &chf, q(5), &tx).await
        })
    };
    tokio::time::timeout(Duration::from_secs(30), async {
        while holdfast.in_flight() == 0 {
            // sleep: poll interval until the select is in flight.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the select is in flight");
    let started = tokio::time::Instant::now();
    let report = holdfast.shutdown_within(Duration::from_millis(300)).await;
    assert!(!report.drained, "{report:?}");
    assert_eq!(report.abandoned_calls, 1);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the shutdown returned {:?} after it began",
        started.elapsed()
    );
    stuck
}

/// Records publications and wakes the test on each.
#[derive(Debug, Default)]
struct Recorder {
    published: std::sync::Mutex<BTreeMap<String, Generation>>,
    seen: Notify,
}

#[async_trait]
impl BuildPublisher for Recorder {
    async fn publish(
        &self,
        request: &Request,
        _plan: &BuildPlan,
        generation: Generation,
    ) -> Result<(), DeliveryError> {
        self.published
            .lock()
            .expect("lock")
            .insert(request.id.to_string(), generation);
        self.seen.notify_waiters();
        Ok(())
    }
}

/// Ingests revision `git://repo#abc` into `queue` (the first ingest creates it).
async fn ingest_abc(holdfast: &Holdfast, queue: &QueueName) -> Ingest {
    let uri = RevisionUri::new("git://repo#abc").expect("uri");
    holdfast
        .admission()
        .ingest(queue, &uri)
        .await
        .expect("ingest")
}

/// Admission workers started on the handle publish what is ingested; the build
/// heartbeats and reports through the handle; stopping
/// one group of workers leaves the handle running, and the shutdown stops the
/// rest after their current delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_workers_publish_and_drain_on_shutdown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("admission.db").display());
    let holdfast = Arc::new(Holdfast::open(config(url)).await.expect("open"));
    let (main, side) = (
        QueueName::new("main").expect("queue"),
        QueueName::new("side").expect("queue"),
    );
    let recorder = Arc::new(Recorder::default());
    let side_workers = holdfast
        .run_admission(vec![side.clone()], recorder.clone(), 1)
        .expect("workers");
    holdfast
        .run_admission(vec![main.clone()], recorder.clone(), 2)
        .expect("workers");
    let (stopped, _) = side_workers.stop(Duration::from_secs(10)).await;
    assert!(stopped, "a group of workers stops on its own");

    let seen = recorder.seen.notified();
    tokio::pin!(seen);
    seen.as_mut().enable();
    // The first ingest creates the queue.
    let ingest = ingest_abc(&holdfast, &main).await;
    tokio::time::timeout(Duration::from_secs(30), seen)
        .await
        .expect("the build is published");
    let id = ingest.request.id.clone();
    let generation = recorder.published.lock().expect("lock")[&id.to_string()];

    // The build heartbeats and reports through the handle.
    let beat = holdfast.heartbeat(&id, generation).await;
    assert!(matches!(beat, Ok(Heartbeat::Extended { .. })), "{beat:?}");
    let reported = holdfast.outcome(&id, BuildOutcome::Succeeded).await;
    assert!(reported.is_ok(), "{reported:?}");
    let report = holdfast.shutdown().await;
    assert!(report.drained, "{report:?}");
    assert!(
        report
            .admission
            .get(&Handled::Published)
            .copied()
            .unwrap_or(0)
            >= 1,
        "{report:?}"
    );
    assert!(matches!(
        holdfast.run_admission(vec![main], recorder.clone(), 1),
        Err(AdmitError::ShuttingDown)
    ));
    assert_eq!(
        holdfast.heartbeat(&id, generation).await,
        Err(AdmitError::ShuttingDown)
    );
}

/// A publisher whose `publish` waits until the test lets it go.
#[derive(Default)]
struct HeldPublisher {
    entered: Notify,
    release: Notify,
    published: AtomicU64,
}

#[async_trait]
impl BuildPublisher for HeldPublisher {
    async fn publish(
        &self,
        _request: &Request,
        _plan: &BuildPlan,
        _generation: Generation,
    ) -> Result<(), DeliveryError> {
        let release = self.release.notified();
        tokio::pin!(release);
        release.as_mut().enable();
        self.entered.notify_one();
        release.await;
        self.published.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A handle on a fresh SQLite file whose one admission worker is held in the
/// middle of publishing, and `AdmissionWorkers::stop` with `bound` running on
/// it, already waiting for that worker: the handle, the publisher to release,
/// the stop, and the directory holding the file.
async fn a_stop_behind_a_held_delivery(
    bound: Duration,
) -> (
    Arc<Holdfast>,
    Arc<HeldPublisher>,
    tokio::task::JoinHandle<(bool, RunReport)>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("held.db").display());
    let holdfast = Arc::new(Holdfast::open(config(url)).await.expect("open"));
    let main = QueueName::new("main").expect("queue");
    let publisher = Arc::new(HeldPublisher::default());
    let workers = holdfast
        .run_admission(vec![main.clone()], publisher.clone(), 1)
        .expect("workers");
    let entered = publisher.entered.notified();
    ingest_abc(&holdfast, &main).await;
    tokio::time::timeout(Duration::from_secs(30), entered)
        .await
        .expect("the worker publishes");
    let stop = tokio::spawn(async move { workers.stop(bound).await });
    // sleep: let the stop take the worker list first, as a shutdown racing it
    // is the case (in the other order the callers' checks hold as well).
    tokio::time::sleep(Duration::from_millis(50)).await;
    (holdfast, publisher, stop, dir)
}

/// A shutdown that runs while `AdmissionWorkers::stop` waits for a worker
/// in the middle of a delivery waits for that worker too (it used to find the
/// workers taken and close the backend under it), and reports the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_beside_a_stop_waits_for_the_workers_delivery() {
    let (holdfast, publisher, stop, _dir) =
        a_stop_behind_a_held_delivery(Duration::from_secs(30)).await;
    let shutdown = tokio::spawn({
        let holdfast = holdfast.clone();
        async move { holdfast.shutdown_within(Duration::from_secs(30)).await }
    });
    // sleep: what is shown is that neither returns while the delivery runs.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !shutdown.is_finished(),
        "the shutdown waits for the delivery"
    );
    assert!(!stop.is_finished(), "the stop waits for the delivery");

    publisher.release.notify_one();
    let report = shutdown.await.expect("shutdown");
    assert_eq!(publisher.published.load(Ordering::SeqCst), 1);
    assert!(report.drained, "{report:?}");
    let (finished, run) = stop.await.expect("stop");
    assert!(finished);
    // Both count the delivery, whichever of them took the workers: the
    // shutdown reports what the handle's workers did over its life.
    assert_eq!(run.handled.get(&Handled::Published), Some(&1), "{run:?}");
    assert_eq!(
        report.admission.get(&Handled::Published),
        Some(&1),
        "{report:?}"
    );
}

/// A shutdown whose bound runs out while `AdmissionWorkers::stop` (with a
/// longer bound) waits for a stuck worker ends that worker by its own bound,
/// and both report that it did not finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_beside_a_longer_stop_ends_a_stuck_worker_by_its_bound() {
    let (holdfast, publisher, stop, _dir) =
        a_stop_behind_a_held_delivery(Duration::from_secs(600)).await;
    let started = tokio::time::Instant::now();
    let report = holdfast.shutdown_within(Duration::from_millis(300)).await;
    assert!(!report.drained, "{report:?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the shutdown returned {:?} after it began",
        started.elapsed()
    );
    let (finished, _) = tokio::time::timeout(Duration::from_secs(20), stop)
        .await
        .expect("the stop ends with the aborted worker")
        .expect("stop");
    assert!(!finished);
    publisher.release.notify_one();
    // sleep: a worker still alive would finish its publication within this.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        publisher.published.load(Ordering::SeqCst),
        0,
        "the worker was ended mid-publish"
    );
}

#[tokio::test]
async fn bad_configuration_and_urls_are_typed_errors() {
    let bad = Config {
        busy_timeout_ms: 0,
        ..Config::default()
    };
    let err = Holdfast::open(bad).await.expect_err("busy_timeout_ms = 0");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("busy_timeout_ms"), "{err}");

    let err = Holdfast::open(config("mysql://db/x".to_owned()))
        .await
        .expect_err("an unknown scheme");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("mysql"), "{err}");
}
