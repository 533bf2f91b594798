//! The queue store over SQLite.
//!
//! A queue is a `queues` row plus one `queue_owners` row per slot owner (queue,
//! request, `claimed_at`, `heartbeat_at`, `generation`, `published_at`,
//! `expiring`); a compare-and-set of the queue rewrites its owner rows in the
//! same transaction, from the domain's whole [`Queue`].
//!
//! # Rows of an older holdfast
//!
//! During a rolling upgrade an older holdfast may still write owner rows, and no
//! such row may make queue commands fail. What each owner column reads as:
//!
//! - `claimed_at`, `heartbeat_at`: empty (a schema v2 writer leaves them at their
//!   default `''`), not text, or text that is not a time read as the **upgrade
//!   time** (the `applied_at` of the newest migration in `holdfast_schema`), with
//!   a warning naming the queue and the owner. So the lease of such an owner runs
//!   from the upgrade and no running build expires because of it. The next write
//!   of the queue stores the time read.
//! - `generation`, `expiring`: an older writer leaves the defaults (0, 0), which
//!   read as [`Generation::NONE`](holdfast_domain::Generation::NONE) and not
//!   expiring. The columns' `CHECK`s admit nothing else, so they are read strictly:
//!   any other value is a corrupt row.
//! - `published_at`: NULL (only this code writes it) reads as not published
//!   (nothing published yet, or a failed publication withdrawn): the next
//!   delivery publishes the build. An older writer leaves the default `''`, which
//!   this code never writes: it reads as published at the **upgrade time**, with
//!   a warning, and so does any other value that is not a time. An older writer's
//!   build may still run, and a second publication now would duplicate it;
//!   published at the upgrade time, it stays live while the heartbeats the older
//!   writer records keep coming and is published again only when they stop for
//!   `resume_after`. The owners of a migrated database are stored as published at
//!   the migration, so they read the same way without a warning.
//!
//! The request id of an owner is still validated strictly: an id that does not
//! parse cannot be released or pruned by anyone, so it is a corrupt row.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use holdfast_domain::{
    BuildPlan, BuildStrategy, FailReason, Generation, LastGreen, Queue, QueueName, Request,
    RequestId, RequestState, RevisionUri, Slot, Timestamp, Version,
};
use holdfast_ports::{
    CasOutcome, Ingested, QueueStore, QueueStoreError, StoreFault, WakeKey, WakeUps,
};
use rusqlite::types::ValueRef;
use rusqlite::{OptionalExtension, Transaction, params};

use crate::SqliteBackend;
use crate::codec::{
    corrupt, owner_time_from_sql, queue_from_sql, request_id_from_sql, seq_from_sql, seq_to_sql,
    time_from_sql, time_to_sql, uri_from_sql, version_from_sql, version_to_sql,
};
use crate::pool::Db;
use crate::schema::upgraded_at;

const REQUEST_COLUMNS: &str =
    "queue, seq, uri, state, strategy, base, version, reason, ingested_at";

/// The terminal states, as stored.
const TERMINAL: &str = "('superseded', 'succeeded', 'failed', 'cancelled')";

fn request_row(r: &rusqlite::Row<'_>) -> Result<Request, StoreFault> {
    let queue: String = r.get(0).db()?;
    let seq: i64 = r.get(1).db()?;
    let row = format!("requests row request/{queue}/{seq}");
    let queue = queue_from_sql(&row, queue)?;
    let id = RequestId::new(queue, seq_from_sql(&row, seq)?);
    let uri = uri_from_sql(&row, r.get(2).db()?)?;
    let state: String = r.get(3).db()?;
    let state = RequestState::from_name(&state)
        .ok_or_else(|| corrupt(&row, format!("unknown state {state:?}")))?;
    let strategy: Option<String> = r.get(4).db()?;
    let base: Option<String> = r.get(5).db()?;
    let plan = match strategy {
        None => None,
        Some(s) => Some(BuildPlan {
            strategy: BuildStrategy::from_name(&s)
                .ok_or_else(|| corrupt(&row, format!("unknown build strategy {s:?}")))?,
            base: base.map(|b| uri_from_sql(&row, b)).transpose()?,
        }),
    };
    let reason: Option<String> = r.get(7).db()?;
    let reason = reason
        .map(|text| {
            FailReason::from_name(&text)
                .ok_or_else(|| corrupt(&row, format!("unknown fail reason {text:?}")))
        })
        .transpose()?;
    let ingested: String = r.get(8).db()?;
    Ok(Request {
        id,
        uri,
        state,
        plan,
        reason,
        ingested_at: time_from_sql(&row, &ingested)?,
        version: version_from_sql(&row, r.get(6).db()?)?,
    })
}

/// An owner time an older holdfast left unrecorded or unreadable, and the upgrade
/// time it was read as (see the module docs); logged once the read is done.
#[derive(Debug)]
struct Unreadable {
    owner: RequestId,
    column: &'static str,
    stored: String,
    read_as: String,
}

impl Unreadable {
    fn warn(&self, queue: &QueueName) {
        tracing::warn!(
            queue = %queue,
            owner = %self.owner,
            column = self.column,
            stored = %self.stored,
            read_as = %self.read_as,
            "an owner time an older holdfast left unrecorded or unreadable is read as the \
             upgrade time; the next write of the queue stores it"
        );
    }
}

/// The owner rows of queue `name`, and the values in them that could not be read
/// (read as the module docs say).
fn load_owners(
    tx: &Transaction<'_>,
    name: &QueueName,
) -> Result<(BTreeMap<RequestId, Slot>, Vec<Unreadable>), StoreFault> {
    let mut owners = BTreeMap::new();
    let mut unreadable = Vec::new();
    // Read on the first unreadable time only.
    let mut upgraded: Option<Timestamp> = None;
    let mut stmt = tx
        .prepare_cached(
            "SELECT request, claimed_at, heartbeat_at, generation, published_at, expiring
             FROM queue_owners WHERE queue = ?1",
        )
        .db()?;
    let mut rows = stmt.query([name.as_str()]).db()?;
    let owner_row = format!("queue_owners row {name}");
    while let Some(r) = rows.next().db()? {
        let text: String = r.get(0).db()?;
        let id = request_id_from_sql(&owner_row, &text)?;
        let mut time = |column: &'static str, index: usize| -> Result<Timestamp, StoreFault> {
            match owner_time_from_sql(r.get_ref(index).db()?) {
                Ok(t) => Ok(t),
                Err(stored) => {
                    let at = match upgraded {
                        Some(at) => at,
                        None => *upgraded.insert(upgraded_at(tx)?),
                    };
                    unreadable.push(Unreadable {
                        owner: id.clone(),
                        column,
                        stored,
                        read_as: format!("the upgrade time {at}"),
                    });
                    Ok(at)
                }
            }
        };
        let claimed_at = time("claimed_at", 1)?;
        let heartbeat_at = time("heartbeat_at", 2)?;
        // Only this code writes NULL; anything else that is not a time (an older
        // writer's default '') reads as the upgrade time.
        let published_at = match r.get_ref(4).db()? {
            ValueRef::Null => None,
            _ => Some(time("published_at", 4)?),
        };
        let generation: i64 = r.get(3).db()?;
        let generation = u32::try_from(generation).map(Generation).map_err(|_| {
            corrupt(
                &owner_row,
                format!("owner {id}: generation {generation} is not in 0..=4294967295"),
            )
        })?;
        let expiring: bool = r.get(5).db()?;
        owners.insert(
            id,
            Slot {
                claimed_at,
                heartbeat_at,
                generation,
                published_at,
                expiring,
            },
        );
    }
    Ok((owners, unreadable))
}

fn load_request_in(tx: &Transaction<'_>, id: &RequestId) -> Result<Option<Request>, StoreFault> {
    let sql = format!("SELECT {REQUEST_COLUMNS} FROM requests WHERE queue = ?1 AND seq = ?2");
    let mut stmt = tx.prepare_cached(&sql).db()?;
    let raw = stmt
        .query_row(params![id.queue().as_str(), seq_to_sql(id.seq())?], |r| {
            Ok(request_row(r))
        })
        .optional()
        .db()?;
    raw.transpose()
}

#[async_trait]
impl QueueStore for SqliteBackend {
    async fn load_queue(&self, name: &QueueName) -> Result<Option<Queue>, QueueStoreError> {
        let name = name.clone();
        let loaded = self
            .pool
            .read(move |tx| {
                let row = format!("queues row {name}");
                type QueueCols = (
                    Option<String>,
                    Option<String>,
                    Option<String>,
                    i64,
                    Option<i64>,
                );
                let cols: Option<QueueCols> = tx
                    .prepare_cached(
                        "SELECT latest_request, last_green_uri, last_green_request, version,
                                max_concurrent
                         FROM queues WHERE name = ?1",
                    )
                    .db()?
                    .query_row([name.as_str()], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                    })
                    .optional()
                    .db()?;
                let Some((latest, green_uri, green_request, version, max)) = cols else {
                    return Ok::<_, QueueStoreError>(None);
                };
                let max_concurrent = max
                    .map(|m| {
                        u32::try_from(m).map_err(|_| {
                            corrupt(&row, format!("max_concurrent {m} is not a slot count"))
                        })
                    })
                    .transpose()?;
                let last_green = match (green_uri, green_request) {
                    (None, None) => None,
                    (Some(u), Some(r)) => Some(LastGreen {
                        uri: uri_from_sql(&row, u)?,
                        request_id: request_id_from_sql(&row, &r)?,
                    }),
                    _ => {
                        return Err(corrupt(
                            &row,
                            "last green has a uri without a request or the reverse",
                        )
                        .into());
                    }
                };
                let (owners, unreadable) = load_owners(tx, &name)?;
                Ok(Some((
                    Queue {
                        latest_request_id: latest
                            .map(|l| request_id_from_sql(&row, &l))
                            .transpose()?,
                        last_green,
                        owners,
                        max_concurrent,
                        version: version_from_sql(&row, version)?,
                        name: name.clone(),
                    },
                    unreadable,
                )))
            })
            .await?;
        // Logged here, not on the blocking thread that read the rows, so the
        // caller's subscriber (and span) sees it.
        Ok(loaded.map(|(queue, unreadable)| {
            for u in &unreadable {
                u.warn(&queue.name);
            }
            queue
        }))
    }

    async fn load_request(&self, id: &RequestId) -> Result<Option<Request>, QueueStoreError> {
        let id = id.clone();
        self.pool
            .read(move |tx| Ok(load_request_in(tx, &id)?))
            .await
    }

    async fn create_request(
        &self,
        queue: &QueueName,
        uri: &RevisionUri,
    ) -> Result<Ingested, QueueStoreError> {
        let (queue, uri) = (queue.clone(), uri.clone());
        self.pool
            .write(move |tx| {
                tx.prepare_cached(
                    "INSERT INTO queues (name, version) VALUES (?1, 1) ON CONFLICT (name) DO NOTHING",
                )
                .db()?
                .execute([queue.as_str()])
                .db()?;
                let sql = format!("SELECT {REQUEST_COLUMNS} FROM requests WHERE queue = ?1 AND uri = ?2");
                let existing = tx
                    .prepare_cached(&sql)
                    .db()?
                    .query_row(params![queue.as_str(), uri.as_str()], |r| Ok(request_row(r)))
                    .optional()
                    .db()?
                    .transpose()?;
                if let Some(request) = existing {
                    return Ok(Ingested { request, created: false });
                }
                let last: i64 = tx
                    .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM requests WHERE queue = ?1")
                    .db()?
                    .query_row([queue.as_str()], |r| r.get(0))
                    .db()?;
                let seq = last.checked_add(1).ok_or_else(|| {
                    StoreFault::Backend(format!("queue {queue} has run out of request numbers"))
                })?;
                let now: String = tx
                    .prepare_cached("SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now')")
                    .db()?
                    .query_row([], |r| r.get(0))
                    .db()?;
                tx.prepare_cached(
                    "INSERT INTO requests (queue, seq, uri, state, version, ingested_at, updated_at)
                     VALUES (?1, ?2, ?3, ?4, 1, ?5, ?5)",
                )
                .db()?
                .execute(params![
                    queue.as_str(),
                    seq,
                    uri.as_str(),
                    RequestState::Accepted.as_str(),
                    now
                ])
                .db()?;
                let seq = seq_from_sql(&format!("requests row of {queue}"), seq)?;
                Ok(Ingested {
                    request: Request {
                        id: RequestId::new(queue.clone(), seq),
                        uri: uri.clone(),
                        state: RequestState::Accepted,
                        plan: None,
                        reason: None,
                        ingested_at: time_from_sql("requests row", &now)?,
                        version: Version::FIRST,
                    },
                    created: true,
                })
            })
            .await
    }

    async fn cas_queue(
        &self,
        expected: Version,
        queue: &Queue,
    ) -> Result<CasOutcome, QueueStoreError> {
        let key = WakeKey::Queue(queue.name.clone());
        let queue = queue.clone();
        let (exp, next) = (version_to_sql(expected)?, version_to_sql(expected.next())?);
        let outcome: CasOutcome = self
            .pool
            .write(move |tx| {
                let n = tx
                    .prepare_cached(
                        "UPDATE queues SET latest_request = ?2, last_green_uri = ?3,
                                last_green_request = ?4, version = ?5, max_concurrent = ?7
                         WHERE name = ?1 AND version = ?6",
                    )
                    .db()?
                    .execute(params![
                        queue.name.as_str(),
                        queue.latest_request_id.as_ref().map(ToString::to_string),
                        queue.last_green.as_ref().map(|g| g.uri.as_str()),
                        queue.last_green.as_ref().map(|g| g.request_id.to_string()),
                        next,
                        exp,
                        queue.max_concurrent
                    ])
                    .db()?;
                if n == 0 {
                    return Ok(CasOutcome::Conflict);
                }
                tx.prepare_cached("DELETE FROM queue_owners WHERE queue = ?1")
                    .db()?
                    .execute([queue.name.as_str()])
                    .db()?;
                let mut insert = tx
                    .prepare_cached(
                        "INSERT INTO queue_owners (queue, request, claimed_at, heartbeat_at,
                                                   generation, published_at, expiring)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    )
                    .db()?;
                for (owner, slot) in &queue.owners {
                    insert
                        .execute(params![
                            queue.name.as_str(),
                            owner.to_string(),
                            time_to_sql(slot.claimed_at)?,
                            time_to_sql(slot.heartbeat_at)?,
                            slot.generation.0,
                            slot.published_at.map(time_to_sql).transpose()?,
                            slot.expiring
                        ])
                        .db()?;
                }
                Ok::<_, QueueStoreError>(CasOutcome::Applied)
            })
            .await?;
        if outcome == CasOutcome::Applied {
            // A slot may have been freed (or the head moved): waiting heads look again.
            self.signal(&[key], None);
        }
        Ok(outcome)
    }

    async fn cas_request(
        &self,
        expected: Version,
        request: &Request,
    ) -> Result<CasOutcome, QueueStoreError> {
        let request = request.clone();
        let (exp, next) = (version_to_sql(expected)?, version_to_sql(expected.next())?);
        let seq = seq_to_sql(request.id.seq())?;
        self.pool
            .write(move |tx| {
                let plan = request.plan.as_ref();
                let n = tx
                    .prepare_cached(
                        // The uri is the immutable dedup key: never rewritten.
                        "UPDATE requests SET state = ?3, strategy = ?4, base = ?5, version = ?6,
                                reason = ?8, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
                         WHERE queue = ?1 AND seq = ?2 AND version = ?7",
                    )
                    .db()?
                    .execute(params![
                        request.id.queue().as_str(),
                        seq,
                        request.state.as_str(),
                        plan.map(|p| p.strategy.as_str()),
                        plan.and_then(|p| p.base.as_ref()).map(RevisionUri::as_str),
                        next,
                        exp,
                        request.reason.map(FailReason::as_str)
                    ])
                    .db()?;
                Ok(if n == 1 {
                    CasOutcome::Applied
                } else {
                    CasOutcome::Conflict
                })
            })
            .await
    }

    async fn list_requests(
        &self,
        queue: &QueueName,
        limit: usize,
    ) -> Result<Vec<Request>, QueueStoreError> {
        let queue = queue.clone();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.pool
            .read(move |tx| {
                // The newest `limit` requests, oldest first.
                let sql = format!(
                    "SELECT {REQUEST_COLUMNS} FROM (
                         SELECT {REQUEST_COLUMNS} FROM requests
                         WHERE queue = ?1 ORDER BY seq DESC LIMIT +?2
                     ) ORDER BY seq"
                );
                let mut stmt = tx.prepare_cached(&sql).db()?;
                let mut rows = stmt.query(params![queue.as_str(), limit]).db()?;
                let mut out = Vec::new();
                while let Some(r) = rows.next().db()? {
                    out.push(request_row(r)?);
                }
                Ok(out)
            })
            .await
    }

    async fn lead_reconcile(&self, tick: u64) -> Result<bool, QueueStoreError> {
        let tick = i64::try_from(tick).unwrap_or(i64::MAX);
        self.pool
            .write(move |tx| {
                let n = tx
                    .prepare_cached(
                        "UPDATE reconcile_ticks SET tick = ?1
                         WHERE name = 'reconcile' AND tick < ?1",
                    )
                    .db()?
                    .execute([tick])
                    .db()?;
                Ok(n == 1)
            })
            .await
    }

    async fn list_queues(&self) -> Result<Vec<QueueName>, QueueStoreError> {
        self.pool
            .read(|tx| {
                let mut stmt = tx
                    .prepare_cached("SELECT name FROM queues ORDER BY name")
                    .db()?;
                let mut rows = stmt.query([]).db()?;
                let mut out = Vec::new();
                while let Some(r) = rows.next().db()? {
                    out.push(queue_from_sql("queues row", r.get(0).db()?)?);
                }
                Ok(out)
            })
            .await
    }

    async fn prune_requests(
        &self,
        queue: &QueueName,
        older_than: Duration,
    ) -> Result<u64, QueueStoreError> {
        let queue = queue.clone();
        // An SQLite date modifier: this many seconds before now.
        let age = format!(
            "-{}.{:03} seconds",
            older_than.as_secs(),
            older_than.subsec_millis()
        );
        self.pool
            .write(move |tx| {
                let sql = format!(
                    "DELETE FROM requests
                     WHERE queue = ?1 AND state IN {TERMINAL}
                       AND updated_at <= strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?2)
                       AND 'request/' || queue || '/' || seq NOT IN (
                           SELECT latest_request FROM queues
                           WHERE name = ?1 AND latest_request IS NOT NULL
                           UNION ALL
                           SELECT last_green_request FROM queues
                           WHERE name = ?1 AND last_green_request IS NOT NULL
                           UNION ALL
                           SELECT request FROM queue_owners WHERE queue = ?1)
                       AND seq IS NOT (SELECT MAX(seq) FROM requests
                                       WHERE queue = ?1 AND state = 'succeeded')"
                );
                let n = tx
                    .prepare_cached(&sql)
                    .db()?
                    .execute(params![queue.as_str(), age])
                    .db()?;
                Ok(u64::try_from(n).unwrap_or(u64::MAX))
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use holdfast_domain::{QueueName, RequestState, RevisionUri};
    use holdfast_ports::{CasOutcome, QueueStore};

    use crate::SqliteBackend;

    /// The uri is the dedup key of a request: a compare-and-set that carries another
    /// uri still applies its state, but never rewrites the stored uri (as on
    /// Postgres), so a later ingest of the original uri still deduplicates.
    #[tokio::test]
    async fn cas_request_never_rewrites_the_uri() {
        let backend = SqliteBackend::open_in_memory().await.unwrap();
        let q = QueueName::new("q").unwrap();
        let original = RevisionUri::new("git:aaa").unwrap();
        let made = backend.create_request(&q, &original).await.unwrap();
        let mut next = made.request.clone();
        next.uri = RevisionUri::new("git:zzz").unwrap();
        next.state = RequestState::Superseded;
        next.version = made.request.version.next();
        let cas = backend
            .cas_request(made.request.version, &next)
            .await
            .unwrap();
        assert_eq!(cas, CasOutcome::Applied);
        let stored = backend
            .load_request(&made.request.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.uri, original);
        assert_eq!(stored.state, RequestState::Superseded);
        assert_eq!(stored.version, next.version);
        let again = backend.create_request(&q, &original).await.unwrap();
        assert!(!again.created);
        assert_eq!(again.request.id, made.request.id);
    }
}
