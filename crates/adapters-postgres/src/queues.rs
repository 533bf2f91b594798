//! The queue store: build queues and requests, each written only by whole-row
//! compare-and-set on its version. The owner set is a column of the queue row (a
//! text array of request ids), so a slot claim or release is one CAS.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use holdfast_domain::{
    BuildPlan, BuildStrategy, FailReason, LastGreen, Queue, QueueName, Request, RequestId,
    RequestState, RevisionUri, Slot, Version,
};
use holdfast_ports::{
    CasOutcome, Ingested, QueueStore, QueueStoreError, StoreFault, WakeKey, WakeUps,
};
use sqlx::postgres::{PgQueryResult, PgRow};

use crate::backend::PgBackend;
use crate::codec::{self, get};
use crate::error::fault as to_fault;
use crate::session::Tx;

const LOAD_QUEUE: &str = "
    SELECT latest_request_id, last_green_uri, last_green_request_id, owners, version,
           owner_claimed_ms, owner_heartbeat_ms, max_concurrent
    FROM queues WHERE name = $1";

const REQUEST_COLUMNS_SQL: &str = "
    SELECT seq, uri, state, strategy, base_uri, version, reason,
           (extract(epoch FROM ingested_at) * 1000)::BIGINT
    FROM requests WHERE queue = $1 AND seq = $2";

/// Creates the queue record if missing and locks it for this transaction, so
/// ingests into one queue number their requests one at a time. The no-op update
/// of `version` takes the row lock without changing the record.
const LOCK_QUEUE: &str = "
    INSERT INTO queues (name, version) VALUES ($1, 1)
    ON CONFLICT (name) DO UPDATE SET version = queues.version";

/// Returns the existing request for (queue, uri), or inserts the next one.
const INGEST: &str = "
    WITH existing AS (
        SELECT seq, uri, state, strategy, base_uri, version, reason, ingested_at FROM requests
        WHERE queue = $1 AND uri = $2
    ),
    inserted AS (
        INSERT INTO requests (queue, seq, uri, state, version)
        SELECT $1, COALESCE((SELECT MAX(seq) FROM requests WHERE queue = $1), 0) + 1,
               $2, 'accepted', 1
        WHERE NOT EXISTS (SELECT 1 FROM existing)
        RETURNING seq, uri, state, strategy, base_uri, version, reason, ingested_at
    )
    SELECT seq, uri, state, strategy, base_uri, version, reason,
           (extract(epoch FROM ingested_at) * 1000)::BIGINT, TRUE FROM inserted
    UNION ALL
    SELECT seq, uri, state, strategy, base_uri, version, reason,
           (extract(epoch FROM ingested_at) * 1000)::BIGINT, FALSE FROM existing";

const CAS_QUEUE: &str = "
    UPDATE queues
    SET latest_request_id = $3, last_green_uri = $4, last_green_request_id = $5,
        owners = $6, owner_claimed_ms = $7, owner_heartbeat_ms = $8, max_concurrent = $9,
        version = version + 1
    WHERE name = $1 AND version = $2";

const CAS_REQUEST: &str = "
    UPDATE requests
    SET state = $4, strategy = $5, base_uri = $6, reason = $7, updated_at = now(),
        version = version + 1
    WHERE queue = $1 AND seq = $2 AND version = $3";

/// The newest `$2` requests, oldest first.
const LIST_REQUESTS: &str = "
    SELECT seq, uri, state, strategy, base_uri, version, reason,
           (extract(epoch FROM ingested_at) * 1000)::BIGINT FROM (
        SELECT seq, uri, state, strategy, base_uri, version, reason, ingested_at
        FROM requests WHERE queue = $1 ORDER BY seq DESC LIMIT $2
    ) AS newest ORDER BY seq";

const LIST_QUEUES: &str = "SELECT name FROM queues ORDER BY name";

/// The longest retention age bound into SQL: a thousand years.
const MAX_AGE: Duration = Duration::from_secs(1_000 * 365 * 24 * 3_600);

/// Moves the reconcile tick forward; a row updated means this caller leads it.
const LEAD_RECONCILE: &str = "
    UPDATE reconcile_ticks SET tick = $1 WHERE name = 'reconcile' AND tick < $1";

/// Retention: terminal requests of `$1` last written `$2` ms ago or earlier,
/// except the head, the last green, the newest succeeded request and the owners.
const PRUNE_REQUESTS: &str = "
    DELETE FROM requests AS r USING queues AS q
    WHERE r.queue = $1 AND q.name = $1
      AND r.state IN ('superseded', 'succeeded', 'failed', 'cancelled')
      AND r.updated_at <= now() - make_interval(secs => $2::double precision / 1000)
      AND ('request/' || r.queue || '/' || r.seq) IS DISTINCT FROM q.latest_request_id
      AND ('request/' || r.queue || '/' || r.seq) IS DISTINCT FROM q.last_green_request_id
      AND NOT ('request/' || r.queue || '/' || r.seq) = ANY (q.owners)
      AND r.seq IS DISTINCT FROM (SELECT MAX(seq) FROM requests
                                  WHERE queue = $1 AND state = 'succeeded')";

fn fault(e: &sqlx::Error) -> QueueStoreError {
    QueueStoreError::Fault(to_fault(e))
}

fn request_id(column: &str, text: String) -> Result<RequestId, StoreFault> {
    codec::id(column, text, |t| RequestId::parse(&t))
}

fn version(column: &str, stored: i64) -> Result<Version, StoreFault> {
    u64::try_from(stored)
        .map(Version)
        .map_err(|_| StoreFault::Corrupt(format!("{column} {stored} is negative")))
}

/// A compare-and-set update matched its row at the expected version (applied) or
/// did not (conflict: the version moved, or there is no such row).
fn cas_outcome(done: &PgQueryResult) -> CasOutcome {
    if done.rows_affected() > 0 {
        CasOutcome::Applied
    } else {
        CasOutcome::Conflict
    }
}

/// A version for binding; one past `i64::MAX` cannot be stored, so cannot match.
fn bind_version(v: Version) -> Option<i64> {
    i64::try_from(v.0).ok()
}

/// A request from `seq, uri, state, strategy, base_uri, version, reason,
/// ingested_at (ms)` columns.
fn decode_request(queue: &QueueName, row: &PgRow) -> Result<Request, StoreFault> {
    let seq: i64 = get(row, 0)?;
    let seq = u64::try_from(seq)
        .map_err(|_| StoreFault::Corrupt(format!("requests.seq {seq} is negative")))?;
    let state: String = get(row, 2)?;
    let state = RequestState::from_name(&state).ok_or_else(|| {
        StoreFault::Corrupt(format!("requests.state {state:?} is not a known state"))
    })?;
    let strategy: Option<String> = get(row, 3)?;
    let base: Option<String> = get(row, 4)?;
    let plan = match strategy {
        None => None,
        Some(name) => Some(BuildPlan {
            strategy: BuildStrategy::from_name(&name).ok_or_else(|| {
                StoreFault::Corrupt(format!(
                    "requests.strategy {name:?} is not a known strategy"
                ))
            })?,
            base: base
                .map(|b| codec::id("requests.base_uri", b, RevisionUri::new))
                .transpose()?,
        }),
    };
    let reason: Option<String> = get(row, 6)?;
    let reason = reason
        .map(|text| {
            FailReason::from_name(&text).ok_or_else(|| {
                StoreFault::Corrupt(format!("requests.reason {text:?} is not a known reason"))
            })
        })
        .transpose()?;
    Ok(Request {
        id: RequestId::new(queue.clone(), seq),
        uri: codec::id("requests.uri", get(row, 1)?, RevisionUri::new)?,
        state,
        plan,
        reason,
        ingested_at: codec::timestamp(get(row, 7)?)?,
        version: version("requests.version", get(row, 5)?)?,
    })
}

#[async_trait]
impl QueueStore for PgBackend {
    async fn load_queue(&self, name: &QueueName) -> Result<Option<Queue>, QueueStoreError> {
        let found = self
            .retried(|| {
                sqlx::query(LOAD_QUEUE)
                    .bind(name.as_str())
                    .fetch_optional(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        let Some(row) = found else {
            return Ok(None);
        };
        let latest: Option<String> = get(&row, 0)?;
        let green_uri: Option<String> = get(&row, 1)?;
        let green_id: Option<String> = get(&row, 2)?;
        let owners: Vec<String> = get(&row, 3)?;
        let claimed: Vec<i64> = get(&row, 5)?;
        let heartbeats: Vec<i64> = get(&row, 6)?;
        let max: Option<i32> = get(&row, 7)?;
        if claimed.len() != owners.len() || heartbeats.len() != owners.len() {
            return Err(QueueStoreError::Fault(StoreFault::Corrupt(format!(
                "queues row {name}: {} owners but {} claim and {} heartbeat times",
                owners.len(),
                claimed.len(),
                heartbeats.len()
            ))));
        }
        let mut slots = BTreeMap::new();
        for ((id, claimed), heartbeat) in owners.into_iter().zip(claimed).zip(heartbeats) {
            slots.insert(
                request_id("queues.owners", id)?,
                Slot {
                    claimed_at: codec::timestamp(claimed)?,
                    heartbeat_at: codec::timestamp(heartbeat)?,
                },
            );
        }
        let max_concurrent = max
            .map(|m| {
                u32::try_from(m).map_err(|_| {
                    StoreFault::Corrupt(format!("queues.max_concurrent {m} is negative"))
                })
            })
            .transpose()?;
        let last_green = match (green_uri, green_id) {
            (Some(uri), Some(id)) => Some(LastGreen {
                uri: codec::id("queues.last_green_uri", uri, RevisionUri::new)?,
                request_id: request_id("queues.last_green_request_id", id)?,
            }),
            _ => None,
        };
        Ok(Some(Queue {
            name: name.clone(),
            latest_request_id: latest
                .map(|id| request_id("queues.latest_request_id", id))
                .transpose()?,
            last_green,
            owners: slots,
            max_concurrent,
            version: version("queues.version", get(&row, 4)?)?,
        }))
    }

    async fn load_request(&self, id: &RequestId) -> Result<Option<Request>, QueueStoreError> {
        let Ok(seq) = i64::try_from(id.seq()) else {
            return Ok(None);
        };
        let found = self
            .retried(|| {
                sqlx::query(REQUEST_COLUMNS_SQL)
                    .bind(id.queue().as_str())
                    .bind(seq)
                    .fetch_optional(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        found
            .map(|row| decode_request(id.queue(), &row))
            .transpose()
            .map_err(QueueStoreError::Fault)
    }

    async fn create_request(
        &self,
        queue: &QueueName,
        uri: &RevisionUri,
    ) -> Result<Ingested, QueueStoreError> {
        let mut tx = Tx::begin(self).await.map_err(|e| fault(&e))?;
        self.note(
            sqlx::query(LOCK_QUEUE)
                .bind(queue.as_str())
                .execute(tx.conn())
                .await,
        )
        .map_err(|e| fault(&e))?;
        let row = self
            .note(
                sqlx::query(INGEST)
                    .bind(queue.as_str())
                    .bind(uri.as_str())
                    .fetch_one(tx.conn())
                    .await,
            )
            .map_err(|e| fault(&e))?;
        tx.commit(self).await.map_err(|e| fault(&e))?;
        Ok(Ingested {
            request: decode_request(queue, &row)?,
            created: get(&row, 8)?,
        })
    }

    async fn cas_queue(
        &self,
        expected: Version,
        queue: &Queue,
    ) -> Result<CasOutcome, QueueStoreError> {
        let Some(expected) = bind_version(expected) else {
            return Ok(CasOutcome::Conflict);
        };
        let owners: Vec<String> = queue.owners.keys().map(ToString::to_string).collect();
        let claimed = queue
            .owners
            .values()
            .map(|s| codec::millis(s.claimed_at))
            .collect::<Result<Vec<i64>, _>>()?;
        let heartbeats = queue
            .owners
            .values()
            .map(|s| codec::millis(s.heartbeat_at))
            .collect::<Result<Vec<i64>, _>>()?;
        let max = queue
            .max_concurrent
            .map(|m| i32::try_from(m).unwrap_or(i32::MAX));
        let done = self
            .once(|| {
                sqlx::query(CAS_QUEUE)
                    .bind(queue.name.as_str())
                    .bind(expected)
                    .bind(queue.latest_request_id.as_ref().map(ToString::to_string))
                    .bind(queue.last_green.as_ref().map(|g| g.uri.as_str().to_owned()))
                    .bind(queue.last_green.as_ref().map(|g| g.request_id.to_string()))
                    .bind(&owners)
                    .bind(&claimed)
                    .bind(&heartbeats)
                    .bind(max)
                    .execute(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        let outcome = cas_outcome(&done);
        if outcome == CasOutcome::Applied {
            // A slot may have been freed (or the head moved): waiting heads look again.
            self.signal(&[WakeKey::Queue(queue.name.clone())], None);
        }
        Ok(outcome)
    }

    async fn cas_request(
        &self,
        expected: Version,
        request: &Request,
    ) -> Result<CasOutcome, QueueStoreError> {
        let (Some(expected), Ok(seq)) = (bind_version(expected), i64::try_from(request.id.seq()))
        else {
            return Ok(CasOutcome::Conflict);
        };
        let plan = request.plan.as_ref();
        let done = self
            .once(|| {
                sqlx::query(CAS_REQUEST)
                    .bind(request.id.queue().as_str())
                    .bind(seq)
                    .bind(expected)
                    .bind(request.state.as_str())
                    .bind(plan.map(|p| p.strategy.as_str()))
                    .bind(plan.and_then(|p| p.base.as_ref()).map(RevisionUri::as_str))
                    .bind(request.reason.map(FailReason::as_str))
                    .execute(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        Ok(cas_outcome(&done))
    }

    async fn list_requests(
        &self,
        queue: &QueueName,
        limit: usize,
    ) -> Result<Vec<Request>, QueueStoreError> {
        let found = self
            .retried(|| {
                sqlx::query(LIST_REQUESTS)
                    .bind(queue.as_str())
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .fetch_all(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        found
            .iter()
            .map(|row| decode_request(queue, row))
            .collect::<Result<Vec<_>, _>>()
            .map_err(QueueStoreError::Fault)
    }

    async fn lead_reconcile(&self, tick: u64) -> Result<bool, QueueStoreError> {
        let done = self
            .retried(|| {
                sqlx::query(LEAD_RECONCILE)
                    .bind(i64::try_from(tick).unwrap_or(i64::MAX))
                    .execute(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn list_queues(&self) -> Result<Vec<QueueName>, QueueStoreError> {
        let rows = self
            .retried(|| sqlx::query(LIST_QUEUES).fetch_all(self.pool()))
            .await
            .map_err(|e| fault(&e))?;
        rows.iter()
            .map(|row| codec::id("queues.name", get(row, 0)?, QueueName::new))
            .collect::<Result<Vec<_>, _>>()
            .map_err(QueueStoreError::Fault)
    }

    async fn prune_requests(
        &self,
        queue: &QueueName,
        older_than: Duration,
    ) -> Result<u64, QueueStoreError> {
        let done = self
            .note(
                sqlx::query(PRUNE_REQUESTS)
                    .bind(queue.as_str())
                    // Beyond a millennium nothing is old enough, and PostgreSQL's
                    // timestamps end in year 294276.
                    .bind(i64::try_from(older_than.min(MAX_AGE).as_millis()).unwrap_or(i64::MAX))
                    .execute(self.pool())
                    .await,
            )
            .map_err(|e| fault(&e))?;
        Ok(done.rows_affected())
    }
}
