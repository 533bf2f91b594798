//! The queue store: build queues and requests, each written only by whole-row
//! compare-and-set on its version. The owner set is a column of the queue row (a
//! text array of request ids), so a slot claim or release is one CAS.
//!
//! # Owners in the queue row
//!
//! - `owners`: the request ids owning a slot;
//! - `owner_claimed_ms`, `owner_heartbeat_ms`: each owner's claim and last
//!   heartbeat (milliseconds since the epoch), parallel to `owners`;
//! - `owner_builds` (schema 6): each owner's last build publication, a JSONB map
//!   keyed by request id, `{"request/q/7": {"claimed_ms": ..., "generation": 2,
//!   "published_ms": ..., "expiring": false}}`. Keyed, not parallel: an older
//!   holdfast rewrites `owners` and the time arrays but not this map, and arrays
//!   it does not know would fall out of step. An entry counts only while its
//!   `claimed_ms` equals its owner's claim, so an entry an older writer left
//!   behind never lends its generation to a later claim of the same id.
//!
//! A compare-and-set writes all four from the domain's whole [`Queue`]: the map
//! holds exactly one entry per owner.
//!
//! # Rows of an older holdfast
//!
//! During a rolling upgrade an older holdfast may still write the queue row, and
//! no row it can write may make queue commands fail. What reads as what:
//!
//! - An owner time that is NULL, missing (a time array shorter than `owners`),
//!   negative or after [`MAX_OWNER_MS`](crate::codec::MAX_OWNER_MS) reads as the
//!   **upgrade time** (when migration 6, which brought the build data, was
//!   installed, from `_sqlx_migrations`; see [`crate::schema::UPGRADED_AT`]),
//!   with a warning naming the queue and the owner: the lease of such an owner
//!   runs from the upgrade, so no running build expires because of it. Extra
//!   times beyond `owners` are ignored.
//! - An owner without an entry (added by an older writer), with an entry of an
//!   earlier claim, or with an entry that is not an object reads as
//!   [`Generation::NONE`], published at the **upgrade time**, not expiring, with
//!   a warning. Its build, started by the older writer, may still run, and a
//!   second publication now would duplicate it; published at the upgrade time, it
//!   stays live while the heartbeats the older writer records keep coming and is
//!   published again only when they stop for `resume_after`. The owners of a
//!   migrated database get an entry published at the migration, so they read the
//!   same way without a warning.
//! - In an entry of the owner's claim, a `published_ms` of JSON null (only this
//!   code writes it: nothing published yet, or a failed publication withdrawn)
//!   reads as not published, so the next delivery publishes the build. A
//!   `published_ms` that is missing or not a time as above reads as the upgrade
//!   time; a generation outside `0..=u32::MAX` as 0; an `expiring` that is not a
//!   boolean as not expiring; each with a warning.
//! - Entries of ids that are not owners (an older writer released them) are
//!   ignored, with one warning per load.
//!
//! The next compare-and-set of the queue stores the row as read. Refused as
//! corrupt, as before: an owner id that is NULL or does not parse (nobody could
//! release or prune it, and no holdfast writes one).

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
use sqlx::postgres::{PgQueryResult, PgRow};

use crate::backend::PgBackend;
use crate::codec::{self, get};
use crate::error::fault as to_fault;
use crate::schema;
use crate::session::Tx;

/// The queue row, with each owner's entry of `owner_builds` taken apart into
/// text arrays parallel to `owners` (its JSON type, then each field as text; NULL
/// where missing; `published_ms` as JSON text, so a JSON null is `null`), and the
/// number of entries of ids that are not owners.
const LOAD_QUEUE: &str = "
    SELECT q.latest_request_id, q.last_green_uri, q.last_green_request_id, q.owners,
           q.version, q.owner_claimed_ms, q.owner_heartbeat_ms, q.max_concurrent,
           b.kinds, b.claimed, b.generations, b.published, b.expiring,
           (SELECT count(*)
            FROM jsonb_object_keys(CASE WHEN jsonb_typeof(q.owner_builds) = 'object'
                                        THEN q.owner_builds ELSE '{}' END) AS k(id)
            WHERE k.id <> ALL (q.owners))
    FROM queues AS q
    CROSS JOIN LATERAL (
        SELECT array_agg(jsonb_typeof(e.entry) ORDER BY e.n) AS kinds,
               array_agg(e.entry ->> 'claimed_ms' ORDER BY e.n) AS claimed,
               array_agg(e.entry ->> 'generation' ORDER BY e.n) AS generations,
               array_agg((e.entry -> 'published_ms')::TEXT ORDER BY e.n) AS published,
               array_agg(e.entry ->> 'expiring' ORDER BY e.n) AS expiring
        FROM (SELECT o.n, q.owner_builds -> o.id AS entry
              FROM unnest(q.owners) WITH ORDINALITY AS o(id, n)) AS e
    ) AS b
    WHERE q.name = $1";

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

/// The whole queue row; `owner_builds` is built from arrays parallel to the
/// owners ($6, $7, $10..$12), so it holds exactly one entry per owner.
const CAS_QUEUE: &str = "
    UPDATE queues
    SET latest_request_id = $3, last_green_uri = $4, last_green_request_id = $5,
        owners = $6, owner_claimed_ms = $7, owner_heartbeat_ms = $8, max_concurrent = $9,
        owner_builds = COALESCE(
            (SELECT jsonb_object_agg(b.id, jsonb_build_object(
                        'claimed_ms', b.claimed_ms, 'generation', b.generation,
                        'published_ms', b.published_ms, 'expiring', b.expiring))
             FROM unnest($6::TEXT[], $7::BIGINT[], $10::BIGINT[], $11::BIGINT[],
                         $12::BOOLEAN[])
                  AS b(id, claimed_ms, generation, published_ms, expiring)),
            '{}'),
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

/// The owner columns of a queue row as stored, before they are read as slots
/// (see the module docs for what reads as what).
struct StoredOwners {
    owners: Vec<String>,
    claimed: Vec<Option<i64>>,
    heartbeats: Vec<Option<i64>>,
    /// Per owner: the JSON type of its `owner_builds` entry (`None`: no entry),
    /// then each field as text.
    kinds: Vec<Option<String>>,
    entry_claimed: Vec<Option<String>>,
    generations: Vec<Option<String>>,
    published: Vec<Option<String>>,
    expiring: Vec<Option<String>>,
    /// Entries of ids that are not owners.
    strays: i64,
}

/// Element `i` of a stored array, `None` when NULL or beyond its end.
fn nth<T: Clone>(values: &[Option<T>], i: usize) -> Option<T> {
    values.get(i).cloned().flatten()
}

impl StoredOwners {
    /// Columns 3 and 5 (`owners`, the time arrays) and 8..=12 of [`LOAD_QUEUE`]; a
    /// NULL array reads as empty.
    fn decode(row: &PgRow) -> Result<StoredOwners, StoreFault> {
        let texts = |i| -> Result<Vec<Option<String>>, StoreFault> {
            Ok(get::<Option<Vec<Option<String>>>>(row, i)?.unwrap_or_default())
        };
        let times = |i| -> Result<Vec<Option<i64>>, StoreFault> {
            Ok(get::<Option<Vec<Option<i64>>>>(row, i)?.unwrap_or_default())
        };
        Ok(StoredOwners {
            owners: get(row, 3)?,
            claimed: times(5)?,
            heartbeats: times(6)?,
            kinds: texts(8)?,
            entry_claimed: texts(9)?,
            generations: texts(10)?,
            published: texts(11)?,
            expiring: texts(12)?,
            strays: get(row, 13)?,
        })
    }

    /// Whether any owner reads as the upgrade time: a claim or heartbeat time that
    /// does not read, or a publication not recorded by this code.
    fn needs_upgrade_time(&self) -> bool {
        (0..self.owners.len()).any(|i| {
            let claimed_ms = nth(&self.claimed, i);
            codec::owner_time(claimed_ms).is_none()
                || codec::owner_time(nth(&self.heartbeats, i)).is_none()
                || match self.entry(i, claimed_ms) {
                    Entry::Current => self.publication(i).is_err(),
                    Entry::Unrecorded { .. } => true,
                }
        })
    }

    /// The slots, reading what an older holdfast left unrecorded or unreadable as
    /// the module docs say (`upgraded`: the upgrade time, given when
    /// [`Self::needs_upgrade_time`]) and warning about each such value.
    fn read(
        self,
        queue: &QueueName,
        upgraded: Option<Timestamp>,
    ) -> Result<BTreeMap<RequestId, Slot>, StoreFault> {
        if self.strays > 0 {
            tracing::warn!(
                queue = %queue,
                entries = self.strays,
                "queues.owner_builds has entries of ids that own no slot (an older holdfast \
                 released them); ignored, and dropped by the next write of the queue"
            );
        }
        let mut slots = BTreeMap::new();
        for (i, id) in self.owners.iter().enumerate() {
            let id = request_id("queues.owners", id.clone())?;
            let time = |column: &str, stored: Option<i64>| -> Result<Timestamp, StoreFault> {
                if let Some(t) = codec::owner_time(stored) {
                    return Ok(t);
                }
                let at = upgrade_time(upgraded)?;
                tracing::warn!(
                    queue = %queue,
                    owner = %id,
                    column,
                    stored = ?stored,
                    read_as = %at,
                    "an owner time an older holdfast left unreadable is read as the upgrade \
                     time; the next write of the queue stores it"
                );
                Ok(at)
            };
            let claimed_ms = nth(&self.claimed, i);
            let claimed_at = time("owner_claimed_ms", claimed_ms)?;
            let heartbeat_at = time("owner_heartbeat_ms", nth(&self.heartbeats, i))?;
            let (generation, published_at, expiring) =
                self.build(queue, &id, i, claimed_ms, upgraded)?;
            slots.insert(
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
        Ok(slots)
    }

    /// Whether owner `i`'s entry is one this code wrote for its current claim
    /// (`claimed_ms`, as stored).
    fn entry(&self, i: usize, claimed_ms: Option<i64>) -> Entry {
        match nth(&self.kinds, i).as_deref() {
            Some("object") => {}
            None => {
                return Entry::Unrecorded {
                    what: "an owner without build data (added by an older holdfast)",
                    stored: None,
                };
            }
            Some(kind) => {
                return Entry::Unrecorded {
                    what: "an owner's entry is not an object",
                    stored: Some(kind.to_owned()),
                };
            }
        }
        let entry_claimed = nth(&self.entry_claimed, i);
        let same_claim = entry_claimed
            .as_deref()
            .and_then(|ms| ms.parse::<i64>().ok())
            .is_some_and(|ms| Some(ms) == claimed_ms);
        if same_claim {
            Entry::Current
        } else {
            Entry::Unrecorded {
                what: "an owner's entry is of another claim (an older holdfast claimed again)",
                stored: entry_claimed,
            }
        }
    }

    /// The `published_ms` of owner `i`'s entry: `Ok(None)` for JSON null (not
    /// published), or `Err` with what is stored (`None`: no key) when it is not a
    /// time.
    fn publication(&self, i: usize) -> Result<Option<Timestamp>, Option<String>> {
        match nth(&self.published, i) {
            Some(text) if text == "null" => Ok(None),
            Some(text) => codec::owner_time(text.parse::<i64>().ok())
                .map(Some)
                .ok_or(Some(text)),
            None => Err(None),
        }
    }

    /// Owner `i`'s build data: its generation, publication time and mark, read as
    /// the module docs say where nothing of this claim is recorded or a field does
    /// not read.
    fn build(
        &self,
        queue: &QueueName,
        id: &RequestId,
        i: usize,
        claimed_ms: Option<i64>,
        upgraded: Option<Timestamp>,
    ) -> Result<(Generation, Option<Timestamp>, bool), StoreFault> {
        let unread = |what: &str, stored: Option<&str>, read_as: &str| {
            tracing::warn!(
                queue = %queue,
                owner = %id,
                stored = stored.unwrap_or("nothing"),
                read_as,
                "queues.owner_builds: {what}; the next write of the queue stores what it is \
                 read as"
            );
        };
        if let Entry::Unrecorded { what, stored } = self.entry(i, claimed_ms) {
            let at = upgrade_time(upgraded)?;
            unread(
                what,
                stored.as_deref(),
                &format!("generation 0, published at the upgrade time {at}, not expiring"),
            );
            return Ok((Generation::NONE, Some(at), false));
        }
        let stored = nth(&self.generations, i);
        let generation = match stored.as_deref().map(str::parse::<u32>) {
            Some(Ok(g)) => Generation(g),
            _ => {
                unread("unreadable generation", stored.as_deref(), "generation 0");
                Generation::NONE
            }
        };
        let published_at = match self.publication(i) {
            Ok(at) => at,
            Err(stored) => {
                let at = upgrade_time(upgraded)?;
                unread(
                    "unreadable publication time",
                    stored.as_deref(),
                    &format!("published at the upgrade time {at}"),
                );
                Some(at)
            }
        };
        let stored = nth(&self.expiring, i);
        let expiring = match stored.as_deref() {
            Some("true") => true,
            Some("false") => false,
            other => {
                unread("unreadable expiring mark", other, "not expiring");
                false
            }
        };
        Ok((generation, published_at, expiring))
    }
}

/// What owner `i`'s entry of `owner_builds` records for its claim.
enum Entry {
    /// An object of the owner's current claim, written by this code.
    Current,
    /// No entry, one that is not an object, or one of another claim: no
    /// publication of this claim was recorded. `what` and `stored` for the warning.
    Unrecorded {
        what: &'static str,
        stored: Option<String>,
    },
}

/// The upgrade time, read by the load when [`StoredOwners::needs_upgrade_time`].
fn upgrade_time(upgraded: Option<Timestamp>) -> Result<Timestamp, StoreFault> {
    upgraded.ok_or_else(|| StoreFault::Backend("the upgrade time was not read".to_owned()))
}

impl PgBackend {
    /// See [`crate::schema::UPGRADED_AT`].
    async fn upgraded_at(&self) -> Result<Timestamp, QueueStoreError> {
        let ms: Option<i64> = self
            .retried(|| sqlx::query_scalar(schema::UPGRADED_AT).fetch_optional(self.pool()))
            .await
            .map_err(|e| fault(&e))?;
        ms.and_then(|ms| u64::try_from(ms).ok())
            .map(Timestamp)
            .ok_or_else(|| {
                QueueStoreError::Fault(StoreFault::Corrupt(
                    "_sqlx_migrations: no successful migration 6 is recorded".to_owned(),
                ))
            })
    }
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
        let max: Option<i32> = get(&row, 7)?;
        let stored = StoredOwners::decode(&row)?;
        let upgraded = if stored.needs_upgrade_time() {
            Some(self.upgraded_at().await?)
        } else {
            None
        };
        let slots = stored.read(name, upgraded)?;
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
        let mut tx = Tx::begin(self.sessions()).await.map_err(|e| fault(&e))?;
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
        tx.commit(self.sessions()).await.map_err(|e| fault(&e))?;
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
        let slots = queue.owners.values();
        let claimed = slots
            .clone()
            .map(|s| codec::owner_millis(s.claimed_at))
            .collect::<Result<Vec<i64>, _>>()?;
        let heartbeats = slots
            .clone()
            .map(|s| codec::owner_millis(s.heartbeat_at))
            .collect::<Result<Vec<i64>, _>>()?;
        let generations: Vec<i64> = slots.clone().map(|s| i64::from(s.generation.0)).collect();
        let published = slots
            .clone()
            .map(|s| s.published_at.map(codec::owner_millis).transpose())
            .collect::<Result<Vec<Option<i64>>, _>>()?;
        let expiring: Vec<bool> = slots.map(|s| s.expiring).collect();
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
                    .bind(&generations)
                    .bind(&published)
                    .bind(&expiring)
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
