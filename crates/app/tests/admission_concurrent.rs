//! Admission under real concurrency on PostgreSQL: three backend instances (as
//! three replicas would open them), eight workers running [`Admission::run`] over
//! [`StoreDeliveries`], every ingest and every build outcome delivered twice (to
//! two replicas), process messages duplicated by every replica's scan, store
//! writes crashing at random before or after they apply, and some builds lost
//! for good (no outcome, no heartbeat: published again once quiet). The queue
//! must drain (every request terminal, no slot owned) with every stored invariant
//! intact, never more owners than slots at any sample, every generation of a
//! request published once, and a build published only while its request owns a
//! slot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use holdfast::backend::{Backend, BackendOptions};
use holdfast::crash::{CrashPlan, CrashingQueues, Fate, WriteCall};
use holdfast::{Admission, AdmissionPolicy, Handled, NoAncestry, RunOptions, StoreDeliveries};
use holdfast_domain::admission::invariants::stored_violations;
use holdfast_domain::{
    AdmissionConfig, BuildOutcome, BuildPlan, Generation, Heartbeat, QueueName, Request, RequestId,
    RequestState, RevisionUri,
};
use holdfast_ports::{BuildPublisher, DeliveryError, DeliverySource, Message, QueueStore};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::pg_support::TestDb;

const REPLICAS: usize = 3;
const WORKERS: usize = 8;
const MAX_CONCURRENT: u32 = 2;
/// Enough that every run exercises holds and lost builds (with 30, runs on a
/// fast server published too few builds for either: checked at e7082ef too).
const REVISIONS: u64 = 90;
const SLOT_LEASE: Duration = Duration::from_millis(2_000);
/// A lost build is published again this long after its last sign of life; the
/// builds heartbeat every 20 ms.
const RESUME_AFTER: Duration = Duration::from_millis(150);

/// Crashes one write in `1 / every` before it applies and as many after.
struct RandomCrashes {
    rng: Mutex<StdRng>,
    every: u32,
}

impl CrashPlan for RandomCrashes {
    fn fate(&self, _write: WriteCall<'_>) -> Fate {
        let roll = self
            .rng
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .random_range(0..self.every * 2);
        match roll {
            0 => Fate::CrashBefore("crash before the write (injected)".to_owned()),
            1 => Fate::CrashAfter("crash after the write (injected)".to_owned()),
            _ => Fate::Proceed,
        }
    }
}

/// The build system: runs each published build once, heartbeating its slot
/// lease, and sends its outcome to two replicas; a few builds are lost for good.
struct Builds {
    queues: Arc<dyn QueueStore>,
    admission: Arc<Admission>,
    sources: Vec<Arc<StoreDeliveries>>,
    /// Every publication, by request and generation.
    started: Mutex<BTreeSet<(RequestId, Generation)>>,
    /// Publications of a (request, generation) published before.
    twice: Mutex<Vec<(RequestId, Generation)>>,
    rng: Mutex<StdRng>,
    /// First publishes of a request that did not own a slot when checked.
    without_slot: Mutex<Vec<RequestId>>,
    lost: AtomicU64,
}

#[async_trait]
impl BuildPublisher for Builds {
    async fn publish(
        &self,
        request: &Request,
        _plan: &BuildPlan,
        generation: Generation,
    ) -> Result<(), DeliveryError> {
        let nth = {
            let mut started = self.started.lock().expect("started");
            if !started.insert((request.id.clone(), generation)) {
                self.twice
                    .lock()
                    .expect("twice")
                    .push((request.id.clone(), generation));
                return Ok(());
            }
            started.len()
        };
        let queue = self
            .queues
            .load_queue(request.id.queue())
            .await
            .map_err(|e| DeliveryError(e.to_string()))?;
        if !queue.is_some_and(|q| q.owners.contains_key(&request.id)) {
            self.without_slot
                .lock()
                .expect("without slot")
                .push(request.id.clone());
        }
        let (lost, runs_ms, outcome, to) = {
            let mut rng = self.rng.lock().expect("rng");
            let outcome = if rng.random_bool(0.7) {
                BuildOutcome::Succeeded
            } else {
                BuildOutcome::Failed
            };
            let to = rng.random_range(0..self.sources.len());
            // Every fifth build, starting with the first, is lost for good: its
            // runner died. (A run may start only a handful of builds when newer
            // revisions supersede the rest.)
            (nth % 5 == 1, rng.random_range(5..60u64), outcome, to)
        };
        if lost {
            self.lost.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let id = request.id.clone();
        let admission = Arc::clone(&self.admission);
        let sources: Vec<Arc<StoreDeliveries>> = (0..2)
            .map(|k| Arc::clone(&self.sources[(to + k) % self.sources.len()]))
            .collect();
        tokio::spawn(async move {
            let mut ran = 0;
            while ran < runs_ms {
                // sleep: the fake build runs, heartbeating every 20 ms (the workload's timing).
                tokio::time::sleep(Duration::from_millis(20)).await;
                ran += 20;
                // A heartbeat error is a store crash: the next one extends. A
                // build told to stop (a newer generation runs) stops silently.
                match admission.heartbeat(&id, generation).await {
                    Ok(Heartbeat::Extended { .. }) | Err(_) => {}
                    Ok(_) => return,
                }
            }
            for source in sources {
                let _ = source.send(Message::Outcome(id.clone(), outcome)).await;
            }
        });
        Ok(())
    }
}

/// Waits (at most 5 s) until the request of `uri` exists and is not accepted.
async fn left_accepted(queues: &dyn QueueStore, queue: &QueueName, uri: &RevisionUri) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        if let Ok(requests) = queues.list_requests(queue, 1_000).await
            && requests
                .iter()
                .any(|r| &r.uri == uri && r.state != RequestState::Accepted)
        {
            return;
        }
        // sleep: poll interval of the wait for the request, bounded at 5 s.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn policy() -> AdmissionPolicy {
    AdmissionPolicy {
        default: AdmissionConfig {
            max_concurrent: MAX_CONCURRENT,
            gate_wait_delay: Duration::from_millis(200),
            slot_lease: SLOT_LEASE,
            resume_after: RESUME_AFTER,
        },
        ..AdmissionPolicy::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_eight_workers_duplicates_and_crashes_drain_with_every_invariant() {
    let Some(db) = TestDb::create("admission_concurrent::three_replicas").await else {
        return;
    };
    let queue = QueueName::new("ci/main").expect("queue");
    let mut backends = Vec::new();
    for _ in 0..REPLICAS {
        backends.push(
            Backend::open(&db.url, &BackendOptions::default())
                .await
                .expect("open a replica"),
        );
    }
    let observer = backends[0].stores().queues;
    let mut admissions = Vec::new();
    let mut sources = Vec::new();
    for (n, backend) in backends.iter().enumerate() {
        let stores = backend.stores();
        let crashing: Arc<dyn QueueStore> = Arc::new(CrashingQueues::new(
            Arc::clone(&stores.queues),
            RandomCrashes {
                rng: Mutex::new(StdRng::seed_from_u64(7 + n as u64)),
                every: 25,
            },
        ));
        admissions.push(Arc::new(
            Admission::new(crashing, Arc::new(NoAncestry), policy())
                .with_wakeups(Arc::clone(&stores.wake)),
        ));
        sources.push(Arc::new(
            StoreDeliveries::new(
                Arc::clone(&stores.queues),
                vec![queue.clone()],
                Duration::from_millis(50),
            )
            .with_policy(policy())
            .with_wakeups(Arc::clone(&stores.wake)),
        ));
    }
    let builds = Arc::new(Builds {
        queues: Arc::clone(&observer),
        admission: Arc::clone(&admissions[0]),
        sources: sources.clone(),
        started: Mutex::new(BTreeSet::new()),
        twice: Mutex::new(Vec::new()),
        rng: Mutex::new(StdRng::seed_from_u64(11)),
        without_slot: Mutex::new(Vec::new()),
        lost: AtomicU64::new(0),
    });
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (admission, source, builds) = (
            Arc::clone(&admissions[w % REPLICAS]),
            Arc::clone(&sources[w % REPLICAS]),
            Arc::clone(&builds),
        );
        workers.push(tokio::spawn(async move {
            let options = RunOptions { max_attempts: 8 };
            admission
                .run(source.as_ref(), builds.as_ref(), options)
                .await
                .expect("a worker's source failed")
        }));
    }
    // Every revision is ingested twice, through two replicas, while the state is
    // sampled. Every third one waits until its request left `accepted` (admitted
    // or superseded), so that builds run and heads are held however slow the
    // machine is; the two in between are mostly superseded.
    let ingest = {
        let (sources, queue, observer) = (sources.clone(), queue.clone(), Arc::clone(&observer));
        tokio::spawn(async move {
            for (k, first) in (1..=REVISIONS).zip((0..REPLICAS).cycle()) {
                let uri = RevisionUri::new(format!("rev-{k}")).expect("uri");
                for r in [first, (first + 1) % REPLICAS] {
                    sources[r]
                        .send(Message::Ingest {
                            queue: queue.clone(),
                            uri: uri.clone(),
                        })
                        .await
                        .expect("send");
                }
                // sleep: the pace of the workload, not a synchronisation.
                tokio::time::sleep(Duration::from_millis(15)).await;
                if k % 3 == 0 {
                    left_accepted(observer.as_ref(), &queue, &uri).await;
                }
            }
        })
    };
    // Every replica reconciles periodically: lost builds expire.
    let (stop, stopped) = tokio::sync::watch::channel(());
    let reconcilers: Vec<_> = admissions
        .iter()
        .map(|admission| {
            let (admission, mut stopped) = (Arc::clone(admission), stopped.clone());
            tokio::spawn(async move {
                admission
                    .reconcile_periodically(Duration::from_millis(100), async move {
                        let _ = stopped.changed().await;
                    })
                    .await
            })
        })
        .collect();
    drop(stopped);
    // Sample the stored state until the queue drained: never more owners than slots.
    let mut samples = 0u32;
    let mut most_owners = 0usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let drained = loop {
        let q = observer.load_queue(&queue).await.expect("load queue");
        let requests = observer
            .list_requests(&queue, 1_000)
            .await
            .expect("list requests");
        samples += 1;
        if let Some(q) = &q {
            most_owners = most_owners.max(q.owners.len());
            assert!(
                q.owners.len() <= MAX_CONCURRENT as usize,
                "{} owners of {MAX_CONCURRENT} slots: {:?}",
                q.owners.len(),
                q.owners.keys()
            );
        }
        let all_in = ingest.is_finished() && requests.len() as u64 == REVISIONS;
        let open = requests.iter().filter(|r| !r.state.is_terminal()).count();
        if all_in && open == 0 && q.as_ref().is_some_and(|q| q.owners.is_empty()) {
            break (q.expect("queue"), requests);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "wedged: {open} open requests of {}; owners {:?}",
            requests.len(),
            q.map(|q| q.owners)
        );
        // sleep: poll interval of the drain check, bounded by the deadline.
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    for source in &sources {
        source.close();
    }
    drop(stop);
    let mut passes = 0;
    for r in reconcilers {
        passes += r.await.expect("a reconciler panicked");
    }
    let mut handled: BTreeMap<Handled, u64> = BTreeMap::new();
    for w in workers {
        for (k, n) in w.await.expect("a worker panicked").handled {
            *handled.entry(k).or_default() += n;
        }
    }
    let (q, requests) = drained;
    let violations = stored_violations(&q, &requests, MAX_CONCURRENT);
    assert!(violations.is_empty(), "{violations:?}");
    let without_slot = builds.without_slot.lock().expect("without slot").clone();
    assert!(
        without_slot.is_empty(),
        "published without owning a slot: {without_slot:?}"
    );
    let twice = builds.twice.lock().expect("twice").clone();
    assert!(twice.is_empty(), "generations published twice: {twice:?}");
    let started = builds.started.lock().expect("started").clone();
    let republished = started.iter().filter(|(_, g)| *g > Generation(1)).count();
    // The run exercised what it claims to: duplicates, holds, crashes, lost builds.
    let crashes_retried = handled.get(&Handled::Retried).copied().unwrap_or(0);
    assert!(
        handled.get(&Handled::Held).copied().unwrap_or(0) > 0,
        "{handled:?}"
    );
    assert!(crashes_retried > 0, "{handled:?}");
    assert!(builds.lost.load(Ordering::Relaxed) > 0, "no build was lost");
    assert!(republished > 0, "no lost build was published again");
    assert!(most_owners >= 1);
    eprintln!(
        "admission_concurrent: {REVISIONS} revisions, {} builds started ({} lost, \
         {republished} published again), deliveries {handled:?}, {passes} reconcile \
         passes, {samples} samples, at most {most_owners} owners",
        started.len(),
        builds.lost.load(Ordering::Relaxed)
    );
    for backend in backends {
        backend.close().await;
    }
}
