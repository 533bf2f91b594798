//! Ingest: after the store created (or deduplicated) the request, stamp it as the
//! queue's latest head if it is newer.

use super::{
    AdmissionConfig, DeadLetterReason, Decision, QueueWrite, Reply, check_pair, reply, write_queue,
};
use crate::request::{Queue, Request};

/// Decides the ingest step for `request`, which `QueueStore::create_request` just
/// returned (new or deduplicated), given the queue as loaded now.
///
/// Writes the queue with `latest_request_id = request.id` if the request is newer
/// than the stored latest; otherwise replies [`Reply::Ack`]. After the ack the
/// caller publishes the process message of the request: the head is stamped
/// before the process step can see it. A queue without a stored slot limit gets
/// `config.max_concurrent` with its first stamp, so every replica gates on one
/// stored number from then on.
pub fn decide_ingest(
    config: &AdmissionConfig,
    request: &Request,
    queue: Option<&Queue>,
) -> Decision {
    let Some(queue) = queue else {
        return reply(Reply::DeadLetter(DeadLetterReason::QueueMissing(
            request.id.queue().clone(),
        )));
    };
    if let Err(decision) = check_pair(request, queue) {
        return decision;
    }
    let newer = match &queue.latest_request_id {
        None => true,
        Some(latest) => match request.id.compare(latest) {
            Ok(order) => order.is_gt(),
            Err(e) => return reply(Reply::Error(e.into())),
        },
    };
    if !newer {
        return reply(Reply::Ack);
    }
    let mut next = queue.clone();
    next.latest_request_id = Some(request.id.clone());
    next.max_concurrent = Some(queue.limit(config.max_concurrent));
    write_queue(QueueWrite::StampLatest, queue, next)
}
