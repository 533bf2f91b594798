//! A build worker on holdfast: admission workers hand admitted builds to a
//! publisher, which runs each one (here a simulated build) heartbeating its slot
//! until it reports the outcome.
//!
//! ```sh
//! HOLDFAST_DB=sqlite://builds.db cargo run -p holdfast-example-build-worker -- git://repo#a git://repo#b
//! ```
//!
//! Environment: `HOLDFAST_DB` or `DATABASE_URL` (the database), `BUILD_QUEUE`
//! (default `main`), `BUILD_SLOTS` (builds at once, default 2), `BUILD_MS` (how long
//! a simulated build takes, default 3000), `BUILD_INGEST` (this many made-up
//! revisions when none is given on the command line). Revisions are ingested half a
//! build apart, like pushes. Runs until SIGTERM or SIGINT.

use std::error::Error;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use holdfast::admission::SetLimitError;
use holdfast::{
    Admission, BuildOutcome, BuildPlan, BuildPublisher, Config, DeliveryError, Generation,
    Heartbeat, Holdfast, QueueName, Request, RevisionUri, async_trait,
};
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Starts one simulated build per publication and keeps track of them.
struct SimulatedBuilds {
    admission: Arc<Admission>,
    build_time: Duration,
    running: Mutex<JoinSet<()>>,
}

#[async_trait]
impl BuildPublisher for SimulatedBuilds {
    /// Called once per admitted build and generation. It must return quickly: the
    /// build itself runs on its own task.
    async fn publish(
        &self,
        request: &Request,
        plan: &BuildPlan,
        generation: Generation,
    ) -> Result<(), DeliveryError> {
        println!(
            "{} gen {generation}: build {} ({})",
            request.id,
            request.uri,
            plan.strategy.as_str()
        );
        let build = run_build(
            self.admission.clone(),
            request.clone(),
            generation,
            self.build_time,
        );
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .spawn(build);
        Ok(())
    }
}

/// One simulated build: works for `build_time`, heartbeating its slot, then reports
/// its outcome.
async fn run_build(
    admission: Arc<Admission>,
    request: Request,
    generation: Generation,
    build_time: Duration,
) {
    let id = &request.id;
    // Heartbeat well within the queue's `resume_after` (a third of it): a build
    // silent that long is presumed lost and published again.
    let every = admission.policy().for_queue(id.queue()).resume_after / 3;
    let done_at = Instant::now() + build_time;
    loop {
        // The first heartbeat goes out at once: it confirms the build started.
        match admission.heartbeat(id, generation).await {
            Ok(Heartbeat::Extended { .. }) => {
                println!("{id} gen {generation}: heartbeat, slot extended")
            }
            // Not the owner any more, lease expired, or a newer generation runs:
            // stop, and report nothing (an outcome would end the request for the
            // build that replaced this one).
            Ok(other) => {
                println!("{id} gen {generation}: stopped, {other:?}");
                return;
            }
            // A failed heartbeat is not fatal: the next one may get through before
            // `resume_after` runs out.
            Err(e) => eprintln!("{id} gen {generation}: heartbeat failed: {e}"),
        }
        let now = Instant::now();
        if now >= done_at {
            break;
        }
        // The "work" of the simulated build, in slices between heartbeats.
        tokio::time::sleep((done_at - now).min(every)).await;
    }
    let outcome = BuildOutcome::Succeeded;
    match admission.outcome(id, outcome).await {
        // Reporting the outcome frees the slot: the next head is admitted.
        Ok(_) => println!("{id} gen {generation}: {outcome:?}"),
        Err(e) => eprintln!("{id} gen {generation}: reporting {outcome:?} failed: {e}"),
    }
}

async fn ingest(admission: &Admission, queue: &QueueName, revision: &RevisionUri) {
    match admission.ingest(queue, revision).await {
        Ok(ingest) => println!("ingested {revision} as {}", ingest.request.id),
        Err(e) => eprintln!("ingesting {revision}: {e}"),
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .map_err(|_| format!("{name}={value}: not a valid value")),
        Err(_) => Ok(default),
    }
}

/// Resolves on the first SIGTERM or SIGINT.
async fn shutdown_signal() {
    let mut term = signal(SignalKind::terminate()).expect("install the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Logs holdfast's warnings (an unknown `HOLDFAST_*` variable, a failed sweep) to
/// stderr; `RUST_LOG=info` shows more. Without a subscriber they go nowhere.
fn log_to_stderr() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    log_to_stderr();
    let queue = QueueName::new(env_or("BUILD_QUEUE", "main".to_owned())?)?;
    let slots: u32 = env_or("BUILD_SLOTS", 2)?;
    let build_time = Duration::from_millis(env_or("BUILD_MS", 3000)?);

    let mut config = Config::from_env()?;
    // The slot limit a queue is created with (its first ingest stores it).
    config.admission.max_concurrent = slots.max(1);
    let holdfast = Holdfast::open(config).await?;
    let admission = holdfast.admission().clone();

    // Revisions to build: the command line, else BUILD_INGEST made-up ones.
    let mut revisions: Vec<String> = std::env::args().skip(1).collect();
    if revisions.is_empty() {
        let run = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
        revisions = (1..=env_or("BUILD_INGEST", 0u32)?)
            .map(|n| format!("demo://{run}/{n}"))
            .collect();
    }
    let mut revisions = revisions
        .iter()
        .map(|r| RevisionUri::new(r.as_str()))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter();
    // A queue exists from its first ingest on (which stores the configured limit);
    // an existing queue keeps its stored limit until it is set for every replica.
    if let Some(first) = revisions.next() {
        ingest(&admission, &queue, &first).await;
    }
    match admission.set_limit(&queue, slots).await {
        Ok(()) => println!("queue {queue}: {slots} slots"),
        Err(SetLimitError::QueueMissing(_)) => {
            println!("queue {queue}: none yet; its first ingest creates it with {slots} slots")
        }
        Err(e) => return Err(e.into()),
    }

    let builds = Arc::new(SimulatedBuilds {
        admission,
        build_time,
        running: Mutex::new(JoinSet::new()),
    });
    // Admission workers: each takes a delivery, admits or holds it, and publishes
    // admitted builds to `builds`. More workers than slots gain nothing.
    let workers = holdfast.run_admission(vec![queue.clone()], builds.clone(), 2)?;
    println!("working on queue {queue}; SIGTERM or Ctrl-C to stop");
    // The other revisions arrive half a build apart, like pushes: each newer head
    // takes a free slot, or supersedes the older heads still waiting.
    let pushes = tokio::spawn({
        let (admission, queue) = (holdfast.admission().clone(), queue.clone());
        async move {
            for revision in revisions {
                tokio::time::sleep(build_time / 2).await;
                ingest(&admission, &queue, &revision).await;
            }
        }
    });

    shutdown_signal().await;
    pushes.abort();
    // First the workers stop taking deliveries (nothing new is published), then
    // the running builds finish and report, then holdfast drains and closes the
    // pool. A build abandoned here is published again, after `resume_after`, to
    // whichever worker runs then.
    let (stopped, run) = workers.stop(Duration::from_secs(10)).await;
    println!("workers stopped: {:?}", run.handled);
    if !stopped {
        println!("a worker was still handling a delivery; another replica repeats it");
    }
    let mut running = std::mem::take(
        &mut *builds
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    println!("stopping: letting the running builds finish");
    let bound = build_time + Duration::from_secs(10);
    if tokio::time::timeout(bound, async {
        while running.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        println!("builds still running after {bound:?}: abandoned, another worker resumes them");
    }
    let report = holdfast.shutdown().await;
    println!(
        "shutdown drained={} abandoned_calls={}",
        report.drained, report.abandoned_calls
    );
    Ok(())
}
