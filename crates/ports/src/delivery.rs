//! The delivery port: how admission is wired into a message consumer. A source
//! hands out admission messages at least once (duplicates and redeliveries are
//! expected: every step is safe to repeat) and takes back what became of each; a
//! publisher hands admitted builds to the build system.

use std::time::Duration;

use async_trait::async_trait;
use holdfast_domain::{
    BuildOutcome, BuildPlan, Generation, QueueName, Request, RequestId, RevisionUri,
};

/// An admission message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A new revision for a queue.
    Ingest {
        /// The queue.
        queue: QueueName,
        /// The revision.
        uri: RevisionUri,
    },
    /// Admit the request (publish its build, or hold it at a closed gate).
    Process(RequestId),
    /// The request's build ended.
    Outcome(RequestId, BuildOutcome),
    /// The request's message failed for good: release its slot, fail it.
    DeadLetter(RequestId),
}

impl Message {
    /// The queue the message concerns.
    pub fn queue(&self) -> &QueueName {
        match self {
            Message::Ingest { queue, .. } => queue,
            Message::Process(id) | Message::Outcome(id, _) | Message::DeadLetter(id) => id.queue(),
        }
    }
}

/// One delivery of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The source's handle for this delivery (to ack, hold, retry or dead-letter it).
    pub id: u64,
    /// The message.
    pub message: Message,
    /// Failed attempts before this one (holds do not count).
    pub attempts: u32,
}

/// Why a delivery source or publisher failed. Retrying is the caller's choice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("delivery: {0}")]
pub struct DeliveryError(pub String);

/// Where admission messages come from. At-least-once: a delivery that is neither
/// acked nor answered (its worker crashed) comes back, and duplicates may arrive
/// at any time.
#[mockall::automock]
#[async_trait]
pub trait DeliverySource: Send + Sync {
    /// The next delivery, waiting for one; `None` when the source is closed (no
    /// message will come any more).
    async fn next(&self) -> Result<Option<Delivery>, DeliveryError>;

    /// The message is done: never deliver it again.
    async fn ack(&self, delivery: &Delivery) -> Result<(), DeliveryError>;

    /// The gate is closed: deliver it again after `delay` (or earlier, when a slot
    /// of its queue frees), without counting a failed attempt.
    async fn hold(&self, delivery: &Delivery, delay: Duration) -> Result<(), DeliveryError>;

    /// The attempt failed (a store error, heavy contention, an unknown ancestry):
    /// deliver it again later, counting one more failed attempt.
    async fn retry(&self, delivery: &Delivery, reason: &str) -> Result<(), DeliveryError>;

    /// The message can never succeed (or failed too often): route it to the
    /// dead-letter path; the source then delivers a [`Message::DeadLetter`] for
    /// its request, if it has one.
    async fn dead_letter(&self, delivery: &Delivery, reason: &str) -> Result<(), DeliveryError>;

    /// Sends a follow-up message (the process message of an ingested request).
    async fn send(&self, message: Message) -> Result<(), DeliveryError>;
}

/// Where admitted builds go. Each publication carries a generation, and each
/// generation of a request is published once: a duplicate delivery of a live
/// build publishes nothing. A request is published again, with the next
/// generation, only when its last publication went quiet (no heartbeat within the
/// queue's `resume_after`: its worker or build died) or its publish failed. The
/// build heartbeats with its generation, and when told anything but "extended"
/// stops without reporting an outcome (any generation's outcome ends the
/// request, also for the newer build that runs).
#[mockall::automock]
#[async_trait]
pub trait BuildPublisher: Send + Sync {
    /// Starts generation `generation` of the build of `request` with `plan`.
    async fn publish(
        &self,
        request: &Request,
        plan: &BuildPlan,
        generation: Generation,
    ) -> Result<(), DeliveryError>;
}
