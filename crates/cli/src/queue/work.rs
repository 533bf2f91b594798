//! `holdfast queue work`: admission workers over the queue store itself
//! ([`StoreDeliveries`]), until nothing is left to admit.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use holdfast_domain::{BuildPlan, QueueName, Request};
use holdfast_ports::{BuildPublisher, DeliveryError};
use serde::Serialize;

use super::view::publish_line;
use crate::output::{Rendered, Report};
use crate::{CliError, Context};
use holdfast::admission::Admission;
use holdfast::{Handled, RunOptions, StoreDeliveries};

/// The most workers `queue work` starts.
pub const MAX_WORKERS: usize = 64;

/// A published build in JSON: `{"request", "strategy", "base"}`.
#[derive(Debug, Clone, Serialize)]
pub struct PublishedView {
    /// The admitted request.
    pub request: String,
    /// Its strategy.
    pub strategy: &'static str,
    /// Its incremental base, if any.
    pub base: Option<String>,
}

/// Collects what the workers publish (this command's build system is its output).
#[derive(Default)]
struct Collect(Mutex<Vec<PublishedView>>);

#[async_trait]
impl BuildPublisher for Collect {
    async fn publish(&self, request: &Request, plan: &BuildPlan) -> Result<(), DeliveryError> {
        let mut published = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let id = request.id.to_string();
        if !published.iter().any(|p| p.request == id) {
            published.push(PublishedView {
                request: id,
                strategy: plan.strategy.as_str(),
                base: plan.base.as_ref().map(ToString::to_string),
            });
        }
        Ok(())
    }
}

/// `queue work` JSON: `{"queues", "workers", "published": [PublishedView...],
/// "deliveries": {"acked", "published", "held", "retried", "dead_lettered"}}`.
#[derive(Debug, Clone, Serialize)]
pub struct WorkView {
    /// The queues worked on.
    pub queues: Vec<String>,
    /// Workers run.
    pub workers: usize,
    /// Builds published (once each), in order.
    pub published: Vec<PublishedView>,
    /// Deliveries by what became of them.
    pub deliveries: BTreeMap<&'static str, u64>,
}

impl Report for WorkView {
    fn human(&self) -> String {
        let mut text = String::new();
        for p in &self.published {
            text.push_str(&publish_line(&p.request, p.strategy, p.base.as_deref()));
            text.push('\n');
        }
        let counts: Vec<String> = self
            .deliveries
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect();
        text.push_str(&format!(
            "{} worker(s) on {}: nothing left to admit; deliveries: {}\n",
            self.workers,
            self.queues.join(", "),
            if counts.is_empty() {
                "none".to_owned()
            } else {
                counts.join(", ")
            }
        ));
        text
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

/// Runs `workers` workers on `queues` until no delivery is ready or in hand for a
/// few polls (what is left waits at a closed gate or for a build's outcome).
pub async fn work(
    ctx: &Context,
    admission: Admission,
    queues: Vec<QueueName>,
    workers: usize,
) -> Result<Rendered, CliError> {
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
    let stores = ctx.backend.stores();
    let admission = Arc::new(admission.with_wakeups(Arc::clone(&stores.wake)));
    let source = Arc::new(
        StoreDeliveries::new(
            Arc::clone(&stores.queues),
            queues.clone(),
            Duration::from_millis(50),
        )
        .with_wakeups(Arc::clone(&stores.wake)),
    );
    let publisher = Arc::new(Collect::default());
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (admission, source, publisher) = (
            Arc::clone(&admission),
            Arc::clone(&source),
            Arc::clone(&publisher),
        );
        tasks.push(tokio::spawn(async move {
            admission
                .run(source.as_ref(), publisher.as_ref(), RunOptions::default())
                .await
        }));
    }
    let mut quiet = 0;
    while quiet < 3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        quiet = if source.busy() { 0 } else { quiet + 1 };
    }
    source.close();
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
    let published = publisher
        .0
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    Ok(Rendered::of(&WorkView {
        queues: queues.iter().map(ToString::to_string).collect(),
        workers,
        published,
        deliveries,
    }))
}
