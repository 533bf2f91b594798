//! The queue store port: build queues and requests, each written by compare-and-set.

use std::time::Duration;

use async_trait::async_trait;
use holdfast_domain::{Queue, QueueName, Request, RequestId, RevisionUri, Version};

use crate::error::QueueStoreError;

/// Whether a compare-and-set was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CasOutcome {
    /// The stored version matched; the record now has the next version.
    Applied,
    /// The stored version differed (or the record is missing): nothing was written.
    Conflict,
}

/// The result of ingesting a revision into a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ingested {
    /// The request (new, or the existing one for this queue and uri).
    pub request: Request,
    /// Whether it was created by this call.
    pub created: bool,
}

/// Build queues and requests. There is no transaction across a queue and a request:
/// every write is a whole-record compare-and-set on the version the writer read.
#[mockall::automock]
#[async_trait]
pub trait QueueStore: Send + Sync {
    /// Loads a queue.
    async fn load_queue(&self, name: &QueueName) -> Result<Option<Queue>, QueueStoreError>;

    /// Loads a request.
    async fn load_request(&self, id: &RequestId) -> Result<Option<Request>, QueueStoreError>;

    /// Creates an accepted request for `uri` in `queue` with the next sequence number,
    /// creating the queue record if it is missing. Deduplicates on (queue, uri): an
    /// existing request is returned with `created = false`.
    async fn create_request(
        &self,
        queue: &QueueName,
        uri: &RevisionUri,
    ) -> Result<Ingested, QueueStoreError>;

    /// Replaces the queue record if its stored version is `expected`; the stored
    /// record then carries `expected.next()` (the version field of `queue` is ignored).
    async fn cas_queue(
        &self,
        expected: Version,
        queue: &Queue,
    ) -> Result<CasOutcome, QueueStoreError>;

    /// Replaces the request record if its stored version is `expected`; the stored
    /// record then carries `expected.next()`.
    async fn cas_request(
        &self,
        expected: Version,
        request: &Request,
    ) -> Result<CasOutcome, QueueStoreError>;

    /// The newest `limit` requests of a queue (the highest sequence numbers), in sequence order.
    async fn list_requests(
        &self,
        queue: &QueueName,
        limit: usize,
    ) -> Result<Vec<Request>, QueueStoreError>;

    /// Whether this caller leads the periodic reconcile tick that starts at `tick`
    /// (milliseconds since the epoch). Ticks only move forward: exactly one caller
    /// of all replicas gets `true` for a tick; a tick not after the last led one
    /// is `false`.
    async fn lead_reconcile(&self, tick: u64) -> Result<bool, QueueStoreError>;

    /// Every queue's name, in name order.
    async fn list_queues(&self) -> Result<Vec<QueueName>, QueueStoreError>;

    /// Retention: deletes the terminal requests of `queue` last written at least
    /// `older_than` ago (by the database's clock), in one statement that keeps the
    /// queue's head, its last green, its newest succeeded request (a green about
    /// to be recorded) and every slot owner. Returns how many it deleted.
    async fn prune_requests(
        &self,
        queue: &QueueName,
        older_than: Duration,
    ) -> Result<u64, QueueStoreError>;
}
