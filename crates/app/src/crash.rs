//! A crash decorator for the queue store: it stands in for a process dying around
//! a write, so the demo, the simulator and the crash tests exercise the same fault
//! the same way. A [`CrashPlan`] decides, per write, whether the write proceeds,
//! is lost before reaching the store, or is applied and its answer lost (the
//! caller cannot know it happened); the plan can also declare the process dead, so
//! every later call fails as a crashed process's would. A crash is a
//! [`StoreFault::Unavailable`] naming what happened.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use holdfast_domain::{Queue, QueueName, Request, RequestId, RevisionUri, Version};
use holdfast_ports::{CasOutcome, Ingested, QueueStore, QueueStoreError, StoreFault};

/// A write the decorated store is asked to make.
#[derive(Debug, Clone, Copy)]
pub enum WriteCall<'a> {
    /// Creating a request.
    CreateRequest {
        /// Its queue.
        queue: &'a QueueName,
        /// Its revision.
        uri: &'a RevisionUri,
    },
    /// A compare-and-set of a queue row.
    Queue(&'a Queue),
    /// A compare-and-set of a request row.
    Request(&'a Request),
}

/// What happens to one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// It is made and answered.
    Proceed,
    /// The process dies before it reaches the store: nothing is written.
    CrashBefore(String),
    /// It is made, and the process dies before the answer: written, unknown.
    CrashAfter(String),
}

/// Decides the fate of every write (see the [module documentation](self)).
pub trait CrashPlan: Send + Sync {
    /// The fate of `write`, about to be made.
    fn fate(&self, write: WriteCall<'_>) -> Fate;

    /// Whether the process is dead: then every call fails without reaching the
    /// store, with this message.
    fn dead(&self) -> Option<String> {
        None
    }
}

/// A [`QueueStore`] whose writes crash as its [`CrashPlan`] says.
pub struct CrashingQueues<P> {
    inner: Arc<dyn QueueStore>,
    plan: P,
    crashes: AtomicU64,
}

impl<P> std::fmt::Debug for CrashingQueues<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrashingQueues")
            .field("crashes", &self.crashes.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<P: CrashPlan> CrashingQueues<P> {
    /// Decorates `inner` with `plan`.
    pub fn new(inner: Arc<dyn QueueStore>, plan: P) -> Self {
        CrashingQueues {
            inner,
            plan,
            crashes: AtomicU64::new(0),
        }
    }

    /// Crashes injected so far (before and after writes).
    pub fn crashes(&self) -> u64 {
        self.crashes.load(Ordering::Relaxed)
    }

    fn alive(&self) -> Result<(), QueueStoreError> {
        match self.plan.dead() {
            Some(message) => Err(StoreFault::Unavailable(message).into()),
            None => Ok(()),
        }
    }

    fn crash(&self, message: String) -> QueueStoreError {
        self.crashes.fetch_add(1, Ordering::Relaxed);
        StoreFault::Unavailable(message).into()
    }

    async fn write<T: Send>(
        &self,
        call: WriteCall<'_>,
        write: impl std::future::Future<Output = Result<T, QueueStoreError>> + Send,
    ) -> Result<T, QueueStoreError> {
        self.alive()?;
        match self.plan.fate(call) {
            Fate::Proceed => write.await,
            Fate::CrashBefore(message) => Err(self.crash(message)),
            Fate::CrashAfter(message) => {
                write.await?;
                Err(self.crash(message))
            }
        }
    }
}

#[async_trait]
impl<P: CrashPlan> QueueStore for CrashingQueues<P> {
    async fn load_queue(&self, name: &QueueName) -> Result<Option<Queue>, QueueStoreError> {
        self.alive()?;
        self.inner.load_queue(name).await
    }

    async fn load_request(&self, id: &RequestId) -> Result<Option<Request>, QueueStoreError> {
        self.alive()?;
        self.inner.load_request(id).await
    }

    async fn create_request(
        &self,
        queue: &QueueName,
        uri: &RevisionUri,
    ) -> Result<Ingested, QueueStoreError> {
        let call = WriteCall::CreateRequest { queue, uri };
        self.write(call, self.inner.create_request(queue, uri))
            .await
    }

    async fn cas_queue(
        &self,
        expected: Version,
        queue: &Queue,
    ) -> Result<CasOutcome, QueueStoreError> {
        let write = self.inner.cas_queue(expected, queue);
        self.write(WriteCall::Queue(queue), write).await
    }

    async fn cas_request(
        &self,
        expected: Version,
        request: &Request,
    ) -> Result<CasOutcome, QueueStoreError> {
        let write = self.inner.cas_request(expected, request);
        self.write(WriteCall::Request(request), write).await
    }

    async fn list_requests(
        &self,
        queue: &QueueName,
        limit: usize,
    ) -> Result<Vec<Request>, QueueStoreError> {
        self.alive()?;
        self.inner.list_requests(queue, limit).await
    }

    async fn lead_reconcile(&self, tick: u64) -> Result<bool, QueueStoreError> {
        self.alive()?;
        self.inner.lead_reconcile(tick).await
    }

    async fn list_queues(&self) -> Result<Vec<QueueName>, QueueStoreError> {
        self.alive()?;
        self.inner.list_queues().await
    }

    async fn prune_requests(
        &self,
        queue: &QueueName,
        older_than: std::time::Duration,
    ) -> Result<u64, QueueStoreError> {
        self.alive()?;
        self.inner.prune_requests(queue, older_than).await
    }
}
