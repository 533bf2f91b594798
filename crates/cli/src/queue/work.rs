//! `holdfast queue work`: admission workers over the queue store itself
//! ([`StoreDeliveries`]).
//!
//! Every build is printed the moment it is published: one line on stdout, written
//! and flushed before the publication counts as done, so a worker killed
//! afterwards loses nothing it published. A publication it recorded but never
//! printed goes quiet and is published again, with the next generation, by any
//! worker's scan once the queue's `resume_after` has passed. The summary follows
//! when the workers stop: once nothing is left to do, or with `--follow` on
//! SIGTERM or SIGINT.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use holdfast::domain::{BuildPlan, Generation, Request};
use holdfast::ports::{BuildPublisher, DeliveryError};
use serde::Serialize;
use tokio::sync::Notify;

use super::WorkArgs;
use super::view::publish_line;
use crate::output::{self, Rendered, Report};
use crate::{CliError, Context};
use holdfast::admission::Admission;
use holdfast::{Handled, RunOptions, StoreDeliveries};

/// The most workers `queue work` starts.
pub const MAX_WORKERS: usize = 64;

/// How often the workers scan the store while nothing else is due: beyond the
/// queue's `resume_after`, how late a quiet publication is published again.
pub const SCAN_POLL: Duration = Duration::from_millis(50);

/// One publication, printed when it happens. JSON (one line):
/// `{"request", "generation", "strategy", "base"}`; for people, the publish line
/// of `queue process`.
#[derive(Debug, Clone, Serialize)]
pub struct PublishedView {
    /// The admitted request.
    pub request: String,
    /// The generation published: 1 for the first publication, one more for every
    /// re-publication of a build that went quiet. The build heartbeats with it.
    pub generation: u32,
    /// Its strategy.
    pub strategy: &'static str,
    /// Its incremental base, if any.
    pub base: Option<String>,
}

impl Report for PublishedView {
    fn human(&self) -> String {
        let mut line = publish_line(
            &self.request,
            self.generation,
            self.strategy,
            self.base.as_deref(),
        );
        line.push('\n');
        line
    }
}

/// Prints every publication on stdout, one flushed line each (this command's
/// build system is its output), and counts them.
struct Printer {
    json: bool,
    published: AtomicU64,
    republished: AtomicU64,
    /// The first failed write: stdout is gone, so the command stops.
    broken: Mutex<Option<std::io::Error>>,
    /// Signalled when `broken` is set.
    broke: Notify,
}

impl Printer {
    fn new(json: bool) -> Self {
        Printer {
            json,
            published: AtomicU64::new(0),
            republished: AtomicU64::new(0),
            broken: Mutex::new(None),
            broke: Notify::new(),
        }
    }

    fn take_broken(&self) -> Option<std::io::Error> {
        self.broken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    fn is_broken(&self) -> bool {
        self.broken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    fn break_with(&self, e: std::io::Error) {
        let mut broken = self.broken.lock().unwrap_or_else(PoisonError::into_inner);
        if broken.is_none() {
            *broken = Some(e);
        }
        drop(broken);
        self.broke.notify_one();
    }
}

#[async_trait]
impl BuildPublisher for Printer {
    /// Succeeds only once the line is written and flushed: a failed write is a
    /// failed publish (withdrawn by the worker, so another worker publishes the
    /// next generation at once) and stops this command.
    async fn publish(
        &self,
        request: &Request,
        plan: &BuildPlan,
        generation: Generation,
    ) -> Result<(), DeliveryError> {
        let view = PublishedView {
            request: request.id.to_string(),
            generation: generation.0,
            strategy: plan.strategy.as_str(),
            base: plan.base.as_ref().map(ToString::to_string),
        };
        let line = if self.json {
            format!("{}\n", output::json_line(&view))
        } else {
            view.human()
        };
        // One write of the whole line under stdout's lock, then a flush, off the
        // async threads (a full pipe blocks).
        let written = tokio::task::spawn_blocking(move || {
            let mut out = std::io::stdout().lock();
            out.write_all(line.as_bytes())?;
            out.flush()
        })
        .await
        .unwrap_or_else(|e| {
            Err(std::io::Error::other(format!(
                "the printing task failed: {e}"
            )))
        });
        match written {
            Ok(()) => {
                self.published.fetch_add(1, Ordering::Relaxed);
                if generation > Generation(1) {
                    self.republished.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
            Err(e) => {
                let failed = DeliveryError(format!(
                    "printing generation {generation} of {} on stdout: {e}",
                    request.id
                ));
                self.break_with(e);
                Err(failed)
            }
        }
    }
}

/// `queue work` summary, the last line of the output. JSON (one line):
/// `{"queues", "workers", "stopped": "idle" | "SIGTERM" | "SIGINT", "published",
/// "republished", "deliveries": {"acked", "published", "held", "retried",
/// "dead_lettered"}}`; every line before it is a [`PublishedView`].
#[derive(Debug, Clone, Serialize)]
pub struct WorkView {
    /// The queues worked on.
    pub queues: Vec<String>,
    /// Workers run.
    pub workers: usize,
    /// Why the workers stopped: `idle` (nothing left to do) or the signal that
    /// ended `--follow`.
    pub stopped: &'static str,
    /// Publications printed by this run (every generation).
    pub published: u64,
    /// Of those, re-publications (generation 2 or more) of builds that went quiet.
    pub republished: u64,
    /// Deliveries by what became of them.
    pub deliveries: BTreeMap<&'static str, u64>,
}

impl Report for WorkView {
    fn human(&self) -> String {
        let counts: Vec<String> = self
            .deliveries
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect();
        let stopped = match self.stopped {
            "idle" => "nothing left to admit".to_owned(),
            signal => format!("stopped on {signal}"),
        };
        format!(
            "{} worker(s) on {}: {stopped}; published {} build(s) ({} again, with a newer generation); deliveries: {}\n",
            self.workers,
            self.queues.join(", "),
            self.published,
            self.republished,
            if counts.is_empty() {
                "none".to_owned()
            } else {
                counts.join(", ")
            }
        )
    }
}

fn label(handled: Handled) -> &'static str {
    match handled {
        Handled::Acked => "acked",
        Handled::Published => "published",
        Handled::Held => "held",
        Handled::Retried => "retried",
        Handled::DeadLettered => "dead_lettered",
    }
}

/// The signals that end `queue work --follow`, listened to from before the
/// workers start.
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn listen() -> Result<Signals, CliError> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let listen = |kind| {
                signal(kind).map_err(|source| CliError::Io {
                    action: "listening for",
                    path: "SIGTERM and SIGINT".to_owned(),
                    source,
                })
            };
            Ok(Signals {
                term: listen(SignalKind::terminate())?,
                int: listen(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Signals {})
        }
    }

    /// The name of the first signal received.
    async fn received(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => "SIGTERM",
                _ = self.int.recv() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}

/// Runs `args.workers` workers on `args.queues`, printing each build as it is
/// published, until no delivery is ready or in hand for a few polls (what is left
/// waits at a closed gate, for a build's outcome or for a quiet publication's
/// `resume_after`), or with `args.follow` until SIGTERM or SIGINT. Either way the
/// source is closed, the workers finish the deliveries they hold, and the summary
/// is returned. A failed write on stdout stops the command with an error.
pub async fn work(
    ctx: &Context,
    admission: Admission,
    args: WorkArgs,
    json: bool,
) -> Result<Rendered, CliError> {
    let WorkArgs {
        queue: queues,
        workers,
        follow,
    } = args;
    if !(1..=MAX_WORKERS).contains(&workers) {
        return Err(CliError::Argument {
            arg: "--workers",
            value: workers.to_string(),
            expected: format!("expected 1 to {MAX_WORKERS}"),
        });
    }
    for queue in &queues {
        super::ensure_queue(ctx, queue).await?;
    }
    let mut signals = if follow {
        Some(Signals::listen()?)
    } else {
        None
    };
    let stores = ctx.backend.stores();
    let policy = admission.policy().clone();
    let admission = Arc::new(admission.with_wakeups(Arc::clone(&stores.wake)));
    let source = Arc::new(
        StoreDeliveries::new(Arc::clone(&stores.queues), queues.clone(), SCAN_POLL)
            .with_wakeups(Arc::clone(&stores.wake))
            .with_policy(policy),
    );
    let printer = Arc::new(Printer::new(json));
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (admission, source, printer) = (
            Arc::clone(&admission),
            Arc::clone(&source),
            Arc::clone(&printer),
        );
        tasks.push(tokio::spawn(async move {
            admission
                .run(source.as_ref(), printer.as_ref(), RunOptions::default())
                .await
        }));
    }
    // A long-running worker also expires silent owners on a timer (one replica
    // leads each tick), so a lost outcome frees its slot even if no head waits.
    let (stop_reconcile, reconcile_stopped) = tokio::sync::watch::channel(());
    let reconciler = follow.then(|| {
        let (admission, mut stopped) = (Arc::clone(&admission), reconcile_stopped.clone());
        let period = admission.policy().reconcile_period();
        tokio::spawn(async move {
            admission
                .reconcile_periodically(period, async move {
                    let _ = stopped.changed().await;
                })
                .await
        })
    });
    drop(reconcile_stopped);
    let stopped = match signals.as_mut() {
        Some(signals) => tokio::select! {
            signal = signals.received() => signal,
            () = printer.broke.notified() => "broken output",
        },
        None => {
            let mut quiet = 0;
            while quiet < 3 && !printer.is_broken() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                quiet = if source.busy() { 0 } else { quiet + 1 };
            }
            "idle"
        }
    };
    source.close();
    drop(stop_reconcile);
    if let Some(reconciler) = reconciler {
        reconciler
            .await
            .map_err(|e| CliError::Worker(format!("the reconcile timer panicked: {e}")))?;
    }
    let mut deliveries = BTreeMap::new();
    for task in tasks {
        let report = task
            .await
            .map_err(|e| CliError::Worker(format!("a worker panicked: {e}")))?
            .map_err(|e| CliError::Worker(e.to_string()))?;
        for (handled, n) in report.handled {
            *deliveries.entry(label(handled)).or_default() += n;
        }
    }
    if let Some(source) = printer.take_broken() {
        return Err(CliError::Io {
            action: "printing a published build on",
            path: "stdout".to_owned(),
            source,
        });
    }
    Ok(Rendered::line(&WorkView {
        queues: queues.iter().map(ToString::to_string).collect(),
        workers,
        stopped,
        published: printer.published.load(Ordering::Relaxed),
        republished: printer.republished.load(Ordering::Relaxed),
        deliveries,
    }))
}
