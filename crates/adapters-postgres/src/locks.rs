//! The lock store: claims under the three strategies, release, settlement, the
//! lease sweep under an advisory lock, and the lock listing.
//!
//! A window claim is one statement (see [`WINDOW`] and [`WINDOW_SKIP_LOCKED`]):
//! the candidates arrive as two arrays (up to [`SMALL_WINDOW`] of them as
//! scalars, in [`WINDOW_SMALL`] and [`WINDOW_SMALL_SKIP_LOCKED`], which keep one
//! plan per connection); `spendable` reads which of them are still
//! spendable; `claimed` inserts lock rows with `ON CONFLICT DO NOTHING`, in
//! `(tx_id, idx)` order so concurrent claimers never wait on each other in a
//! cycle; the result reports, per candidate, whether it was won and whether it was
//! still spendable. Not won and not spendable is *stale*; not won but spendable is
//! *contended* (someone else's lock row, or, under `skip_locked`, a row another
//! claimer is locking right now).
//!
//! # Row locks, and why they cannot deadlock
//!
//! Under `insert` and `on_conflict` the `spendable` read (and the single-token
//! [`CLAIM_INSERT`]) takes `FOR SHARE` on the candidate token rows, in
//! `(tx_id, idx)` order. Without it a claim could win a token spent under it: the
//! statement snapshot still shows the token unspent while a settlement that has
//! already deleted the lock row and marked the token spent is committing; the
//! claim's insert waits for the deleted lock row, then succeeds. With the share
//! lock the claim waits for the settlement's row lock on the token instead, and
//! PostgreSQL re-checks `spent_by IS NULL` on the committed row: the token is
//! stale. (`skip_locked` needs no share lock: its `FOR UPDATE SKIP LOCKED` walks
//! past the settling row, and reads the verdict from the snapshot: contended.)
//!
//! Who waits on whom (T = a `tokens` row lock, L = a `token_locks` row lock, a
//! deleted lock row or a lock row being inserted):
//!
//! - A claimer takes T share locks in key order, then inserts L rows in key order.
//!   It inserts L for a token only while holding that token's T (share under
//!   `insert`/`on_conflict`, `FOR UPDATE` under `skip_locked`); an insert waits
//!   only for an uncommitted insert or delete of the same key, never for a mere
//!   row lock.
//! - Settlement as confirmed ([`SPEND`], the `holdfast_spend` function: one
//!   round trip, one transaction) first locks the T rows of every token the
//!   consumer selected, then the consumer's L rows, `FOR UPDATE` in key order, and
//!   only then deletes those L rows and updates those T rows, so its writes wait
//!   for nothing. Every L row of a consumer has its selection row (both are
//!   written by the claim statement), so a claimer never holds T share on a token
//!   whose L row a settlement deletes: the settlement held T exclusively first. (Deleting the lock rows before locking the tokens would
//!   deadlock: the claimer, holding T share, waits for the deleted L row while
//!   the settlement's update waits for the share lock.)
//! - Selection rows are keyed by consumer and token: a claimer inserts only its
//!   own, and only settlement and release of that consumer delete them.
//! - Release and the sweep delete only L rows (and release its own selection rows), locking them `FOR UPDATE` in key
//!   order first, and never touch `tokens`; so they never wait for a claimer, and
//!   ordered L locking keeps them from deadlocking with each other or with a
//!   settlement of an overlapping consumer.
//! - A read-and-claim ([`LockStore::read_and_claim`]) first takes the advisory
//!   lock of its wallet and type's line (`BEGIN; SELECT
//!   pg_advisory_xact_lock(`[`CLAIM_LINE_SPACE`]`, line)`, one round trip), then
//!   reads and claims as a window claimer does, and commits. Only read-and-claims
//!   of the same line wait for that lock, and they hold nothing while they wait
//!   (it is their transaction's first lock; their in-process turn is taken before
//!   a pooled connection), so it closes no wait cycle.
//! - `set_spendable` updates one token row and holds nothing else while waiting.
//! - `add_tokens` inserts its token rows in key order, in one statement, after
//!   its balance locks (`holdfast_lock_balances`, migrations 0007 to 0009). Its
//!   `ON CONFLICT DO NOTHING` on an id that exists takes no lock and does not
//!   wait for a row lock (`FOR SHARE`, `FOR UPDATE`: lock-only), but it does
//!   wait for a transaction that inserted that row, or updated or deleted it,
//!   and has not committed; so does a plain insert of that id. Claimers cannot
//!   see the new rows until committed.
//! - A confirm with outputs (`holdfast_confirm`, and `holdfast_confirm_with_change`
//!   of migration 0010, which adds the change of the inputs it holds to the
//!   outputs between the same steps) takes its rows `FOR UPDATE` as
//!   settlement does, then its balance locks (shared for a small add, so it may
//!   run beside a small `add_tokens` into the same wallet), then inserts its
//!   outputs `(consumer, 0..n)` in index order, and only then (one statement,
//!   migration 0009) records its status, deletes its L and selection rows and
//!   marks its inputs spent. It holds those T and L rows; it may wait for
//!   another writer of its status row or of one of its selection rows (a
//!   status recorded alone, a release, the sweep or a settlement of the same
//!   consumer). Two cycles remain, both between two calls settling the *same*
//!   consumer at once, each ending in a deadlock error (40P01, a busy fault
//!   `Settlement` and the release retry; nothing written by the aborted one):
//!   a confirmed spend (`holdfast_spend`) that recorded its status first and
//!   then waits for this confirm's L rows; and, once the sweep has taken the
//!   consumer's L rows (so nothing orders them), a give-back deleting two of
//!   its selection rows in the other order than the confirm does.
//!   While it waits to insert an output id that an add holds uncommitted, it
//!   holds its confirm lock, lock-only row locks, balance locks and its own
//!   lower-numbered outputs: an add waits for none but those outputs, and it
//!   meets them in key order before the id it holds. If that add commits, the
//!   insert fails on the key and the confirm writes nothing; it is made once
//!   more and answers that its outputs differ. (Spending first deadlocked:
//!   the add, holding the output id, reached an input of its batch that the
//!   confirm had updated, and waited for it.)
//! - Balance locks: an add asks for them first in its transaction, a confirm
//!   while it holds only its confirm lock and lock-only row locks; the
//!   exclusive ones are asked for holding no shared one (0007's header).
//!
//! So every T wait is in key order; every L wait is in key order or by a
//! claimer that holds the same key's T, which the L holder cannot be waiting
//! for; every wait on a token row an add or a confirm inserts or updates is for
//! a key above every such row the waiter holds; and a balance lock is waited for,
//! in key order, by a transaction that holds besides lower balance keys only
//! locks no holder of a balance lock waits for (its confirm lock, lock-only row
//! locks). No other wait cycle forms: PostgreSQL never has to abort one (40P01)
//! unless one consumer is settled two ways at once (the two cases above).

use std::collections::BTreeMap;

use async_trait::async_trait;
use holdfast_domain::lease::SWEPT_STATUSES;
use holdfast_domain::{
    ClaimVerdict, SweepRule, Timestamp, Token, TokenId, TokenType, TxId, TxStatus, WalletId,
};
use holdfast_ports::{
    CandidateRead, Chooser, Confirmation, LockInfo, LockStore, LockStoreError, Output,
    ReadAndClaim, ReadWithClaim, StoreFault, SweepReport, Unconserved, WakeUps, check_outputs,
    check_window,
};

use crate::backend::{CLAIM_LINE_STRIPES, PgBackend};
use crate::codec::{self, get};
use crate::codec::{millis, timestamp};
use crate::error::fault as to_fault;
use crate::options::LockStrategy;
use crate::session::{Session, Tx};
use crate::tokens::spendable;
use crate::wake::token_keys;

/// The advisory lock key of sweep leadership: the bytes of `"holdfast"`.
pub const SWEEP_LOCK_KEY: i64 = 0x686f_6c64_6661_7374;

/// The first key of the two-key advisory locks that serialize read-and-claims
/// of one wallet and type (the bytes of `"hold"`; two-key advisory locks never
/// meet the one-key [`SWEEP_LOCK_KEY`]).
pub const CLAIM_LINE_SPACE: i32 = 0x686f_6c64;

/// Where the read-and-claims of one wallet and type queue.
struct ClaimLine {
    /// The in-process turn ([`crate::backend::Inner::claim_lines`]).
    stripe: usize,
    /// The second key of the line's advisory lock.
    key: i32,
}

/// The two keys of the advisory lock of `wallet` and `token_type`'s line, as
/// `pg_locks` shows them (`classid`, `objid` of an advisory lock with
/// `objsubid = 2`), for diagnosing a waiting read-and-claim.
pub fn claim_line_key(wallet: &WalletId, token_type: &TokenType) -> (i32, i32) {
    (CLAIM_LINE_SPACE, claim_line(wallet, token_type).key)
}

/// The line of `wallet` and `token_type`: FNV-1a of `wallet<TAB>type`, the same
/// on every replica. Two keys on one line only serialize each other's
/// read-and-claims.
fn claim_line(wallet: &WalletId, token_type: &TokenType) -> ClaimLine {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = wallet
        .as_str()
        .bytes()
        .chain([b'\t'])
        .chain(token_type.as_str().bytes());
    for byte in bytes {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    let [a, b, c, d, .., low] = hash.to_be_bytes();
    ClaimLine {
        stripe: usize::from(low) % CLAIM_LINE_STRIPES,
        key: i32::from_be_bytes([a, b, c, d]),
    }
}

/// A window claim's candidates as two arrays: the `candidates` CTE, and the
/// token rows they name (`FROM` up to the start of a condition).
macro_rules! arrays {
    (candidates) => {
        "SELECT c.tx_id, c.idx FROM UNNEST($1::text[], $2::bigint[]) AS c(tx_id, idx)"
    };
    (rows) => {
        "FROM tokens t
         JOIN candidates c ON t.tx_id = c.tx_id AND t.idx = c.idx
         WHERE "
    };
}

/// A small window claim's candidates as [`SMALL_WINDOW`] pairs of scalars, the
/// last repeated to fill, as `arrays` gives them. The rows are found by an
/// `IN` list of the keys (index probes, or one scan of `tokens` under a plan
/// made while it looked empty), not by a join with the candidates.
macro_rules! scalars {
    (candidates) => {
        "SELECT DISTINCT c.tx_id, c.idx FROM (VALUES ($1::text, $2::bigint),
             ($6::text, $7::bigint), ($8::text, $9::bigint), ($10::text, $11::bigint))
             AS c(tx_id, idx)"
    };
    (rows) => {
        "FROM tokens t
         WHERE (t.tx_id, t.idx) IN (($1::text, $2::bigint), ($6::text, $7::bigint),
                                    ($8::text, $9::bigint), ($10::text, $11::bigint))
           AND "
    };
}

macro_rules! window_sql {
    ($from:ident, $spendable_lock:literal, $eligible:expr, $source:literal) => {
        concat!(
            "WITH candidates AS (
                 ",
            $from!(candidates),
            "
             ),
             spendable AS (
                 SELECT t.tx_id, t.idx ",
            $from!(rows),
            spendable!(),
            $spendable_lock,
            "
             ),",
            $eligible,
            "claimed AS (
                 INSERT INTO token_locks (tx_id, idx, consumer, created_at, owner)
                 SELECT s.tx_id, s.idx, $3, TIMESTAMPTZ 'epoch' + $4::bigint * INTERVAL '1 millisecond', $5
                 FROM ",
            $source,
            " s
                 WHERE NOT EXISTS (SELECT 1 FROM selections x
                                   WHERE x.consumer = $3 AND x.tx_id = s.tx_id AND x.idx = s.idx)
                   AND NOT EXISTS (SELECT 1 FROM tx_statuses st
                                   WHERE st.tx_id = $3 AND st.status = 'confirmed')
                 ORDER BY s.tx_id, s.idx
                 ON CONFLICT (tx_id, idx) DO NOTHING
                 RETURNING tx_id, idx
             ),
             recorded AS (
                 INSERT INTO selections (consumer, tx_id, idx, owner, selected_at)
                 SELECT $3, tx_id, idx, $5, TIMESTAMPTZ 'epoch' + $4::bigint * INTERVAL '1 millisecond'
                 FROM claimed
             )
             SELECT c.tx_id, c.idx, cl.tx_id IS NOT NULL AS won, s.tx_id IS NOT NULL AS still_spendable
             FROM candidates c
             LEFT JOIN claimed cl ON cl.tx_id = c.tx_id AND cl.idx = c.idx
             LEFT JOIN spendable s ON s.tx_id = c.tx_id AND s.idx = c.idx"
        )
    };
}

/// The window claim of `insert` and `on_conflict`, candidates given as `$from`
/// says.
macro_rules! window_insert_sql {
    ($from:ident) => {
        window_sql!(
            $from,
            "
                 ORDER BY t.tx_id, t.idx
                 FOR SHARE OF t",
            "",
            "spendable"
        )
    };
}

/// The window claim of `skip_locked`, candidates given as `$from` says.
macro_rules! window_skip_locked_sql {
    ($from:ident) => {
        window_sql!(
            $from,
            "",
            concat!(
                "eligible AS (
         SELECT t.tx_id, t.idx ",
                $from!(rows),
                spendable!(),
                "
         ORDER BY t.tx_id, t.idx
         FOR UPDATE OF t SKIP LOCKED
     ),"
            ),
            "eligible"
        )
    };
}

/// The window claim of `insert` and `on_conflict`: the still-spendable candidates
/// are share-locked in key order (re-checked after waiting for a settlement), then
/// claimed.
pub const WINDOW: &str = window_insert_sql!(arrays);

/// The window claim of `skip_locked`: token rows locked `FOR UPDATE SKIP LOCKED`
/// first; only rows this claimer locked are inserted.
/// The `spendable` read takes no lock here: it only tells a walked-past row
/// (contended) from a spent one (stale).
pub const WINDOW_SKIP_LOCKED: &str = window_skip_locked_sql!(arrays);

/// At most this many distinct tokens are claimed by [`WINDOW_SMALL`] and
/// [`WINDOW_SMALL_SKIP_LOCKED`] rather than by the array statements.
///
/// With arrays PostgreSQL plans the statement afresh at every call (a plan for
/// the arrays at hand looks cheaper than the generic one, which counts more
/// candidates than a claim usually names), 0.5–0.6 ms of planning a call on the
/// simulator's `many-wallets`; with a fixed number of scalars the generic plan
/// is the custom one, and after five calls a connection keeps it.
pub(crate) const SMALL_WINDOW: usize = 4;

/// [`WINDOW`] over [`SMALL_WINDOW`] scalar ids: `($1, $2)`, `($6, $7)`, `($8,
/// $9)`, `($10, $11)`, the last id repeated to fill; `$3` to `$5` as in
/// [`WINDOW`].
pub(crate) const WINDOW_SMALL: &str = window_insert_sql!(scalars);

/// [`WINDOW_SKIP_LOCKED`] over [`SMALL_WINDOW`] scalar ids, bound as for
/// [`WINDOW_SMALL`].
pub(crate) const WINDOW_SMALL_SKIP_LOCKED: &str = window_skip_locked_sql!(scalars);

/// Whether `e` is PostgreSQL's `lock_not_available` (a `lock_timeout` ran out).
fn lock_not_available(e: &sqlx::Error) -> bool {
    crate::error::sqlstate(e).as_deref() == Some("55P03")
}

/// The single-token claim of `insert`: a conditional insert of a share-locked,
/// still-spendable token, recorded as selected, unless `$3` already selected it
/// (an earlier select of the transaction whose lock was swept) or is confirmed; a
/// lost race is a unique violation. Returns (1 when won, whether `$3` had already
/// selected it or is confirmed: contended, not stale).
const CLAIM_INSERT: &str = concat!(
    "
    WITH claimed AS (
        INSERT INTO token_locks (tx_id, idx, consumer, created_at, owner)
        SELECT t.tx_id, t.idx, $3, TIMESTAMPTZ 'epoch' + $4::bigint * INTERVAL '1 millisecond', $5
        FROM tokens t
        WHERE t.tx_id = $1 AND t.idx = $2 AND ",
    spendable!(),
    "
          AND NOT EXISTS (SELECT 1 FROM selections x
                          WHERE x.consumer = $3 AND x.tx_id = t.tx_id AND x.idx = t.idx)
          AND NOT EXISTS (SELECT 1 FROM tx_statuses st
                          WHERE st.tx_id = $3 AND st.status = 'confirmed')
        FOR SHARE OF t
        RETURNING tx_id, idx
    ),
    recorded AS (
        INSERT INTO selections (consumer, tx_id, idx, owner, selected_at)
        SELECT $3, tx_id, idx, $5, TIMESTAMPTZ 'epoch' + $4::bigint * INTERVAL '1 millisecond'
        FROM claimed
    )
    SELECT (SELECT COUNT(*) FROM claimed),
           EXISTS (SELECT 1 FROM selections x
                   WHERE x.consumer = $3 AND x.tx_id = $1 AND x.idx = $2)
           OR (EXISTS (SELECT 1 FROM tx_statuses st
                       WHERE st.tx_id = $3 AND st.status = 'confirmed')
               AND EXISTS (SELECT 1 FROM tokens t
                           WHERE t.tx_id = $1 AND t.idx = $2 AND ",
    spendable!(),
    "))"
);

/// Settles consumer `$1` as deleted in one statement: records the status (when
/// `$3`, at `$2` milliseconds; never over Confirmed, which is final: a confirm
/// still running for a killed client may commit first), releases its locks (locking them in key order
/// first) and forgets its selections. Returns the locks released and the
/// `wallet<TAB>type` of their tokens (what to wake).
pub const RELEASE_CONSUMER: &str = "
    WITH recorded AS (
        INSERT INTO tx_statuses (tx_id, status, recorded_at)
        SELECT $1, 'deleted', TIMESTAMPTZ 'epoch' + $2::bigint * INTERVAL '1 millisecond'
        WHERE $3
        ON CONFLICT (tx_id) DO UPDATE
        SET status = EXCLUDED.status, recorded_at = EXCLUDED.recorded_at
        WHERE tx_statuses.status <> 'confirmed'
    ),
    forgotten AS (
        DELETE FROM selections WHERE consumer = $1
    ),
    released AS (
        DELETE FROM token_locks l
        USING (SELECT tx_id, idx FROM token_locks WHERE consumer = $1
               ORDER BY tx_id, idx FOR UPDATE) v
        WHERE l.tx_id = v.tx_id AND l.idx = v.idx
        RETURNING l.tx_id, l.idx
    )
    SELECT (SELECT COUNT(*) FROM released), ARRAY(SELECT DISTINCT t.wallet || E'\\t' || t.token_type
        FROM released r JOIN tokens t ON t.tx_id = r.tx_id AND t.idx = r.idx)";

/// Releases the tokens `($2, $3)` that consumer `$1` holds (locking them in key
/// order first) and forgets them as its selections. Returns the locks released
/// and the `wallet<TAB>type` of their tokens.
const RELEASE_TOKENS: &str = "
    WITH forgotten AS (
        DELETE FROM selections s
        USING UNNEST($2::text[], $3::bigint[]) AS u(tx_id, idx)
        WHERE s.consumer = $1 AND s.tx_id = u.tx_id AND s.idx = u.idx
    ),
    released AS (
        DELETE FROM token_locks l
        USING (SELECT k.tx_id, k.idx FROM token_locks k
               JOIN UNNEST($2::text[], $3::bigint[]) AS u(tx_id, idx)
                 ON k.tx_id = u.tx_id AND k.idx = u.idx
               WHERE k.consumer = $1
               ORDER BY k.tx_id, k.idx FOR UPDATE OF k) v
        WHERE l.tx_id = v.tx_id AND l.idx = v.idx
        RETURNING l.tx_id, l.idx
    )
    SELECT (SELECT COUNT(*) FROM released), ARRAY(SELECT DISTINCT t.wallet || E'\\t' || t.token_type
        FROM released r JOIN tokens t ON t.tx_id = r.tx_id AND t.idx = r.idx)";

/// Re-stamps the locks consumer `$1` holds among `($2, $3)` with `$4` milliseconds
/// (locking them in key order first); returns the re-stamped keys.
const RENEW: &str = "
    UPDATE token_locks l
    SET created_at = TIMESTAMPTZ 'epoch' + $4::bigint * INTERVAL '1 millisecond'
    FROM (SELECT k.tx_id, k.idx FROM token_locks k
          JOIN UNNEST($2::text[], $3::bigint[]) AS u(tx_id, idx)
            ON k.tx_id = u.tx_id AND k.idx = u.idx
          WHERE k.consumer = $1
          ORDER BY k.tx_id, k.idx FOR UPDATE OF k) v
    WHERE l.tx_id = v.tx_id AND l.idx = v.idx
    RETURNING l.tx_id, l.idx";

/// Settlement as confirmed: one call of the `holdfast_spend` function (migration
/// 2), one round trip. Rows are `(tx_id, idx, spender)`: the spent tokens with the
/// consumer as spender, or one token another transaction spent (nothing changed).
pub const SPEND: &str = "SELECT spent_tx, spent_idx, spender FROM holdfast_spend($1, $2, $3)";

/// Confirmation with outputs: one call of the `holdfast_confirm` function
/// (migration 4), one round trip. Rows are `(kind, tx, idx, detail)`: `spent`
/// inputs and `key`s to wake, or one refusal (`replayed`, `differ`,
/// `double_spend`, `not_conserved`).
pub const CONFIRM: &str = "SELECT kind, tx, idx, detail FROM holdfast_confirm($1, $2, $3, $4, $5)";

/// Confirmation with outputs and their change to wallet `$3`: one call of the
/// `holdfast_confirm_with_change` function (migration 10), one round trip. Rows
/// as [`CONFIRM`]'s, and a `change` row per change output (`idx` its index,
/// `detail` its type TAB amount), or the refusal `bad_outputs`.
pub const CONFIRM_WITH_CHANGE: &str =
    "SELECT kind, tx, idx, detail FROM holdfast_confirm_with_change($1, $2, $3, $4, $5, $6)";

/// The unspent tokens consumer `$1` selected, in key order.
const SELECTED: &str = "
    SELECT t.tx_id, t.idx, t.wallet, t.token_type, t.amount::text, t.spendable, t.spent_by,
           (EXTRACT(EPOCH FROM t.spent_at) * 1000)::bigint
    FROM selections s JOIN tokens t ON t.tx_id = s.tx_id AND t.idx = s.idx
    WHERE s.consumer = $1 AND t.spent_by IS NULL
    ORDER BY t.tx_id, t.idx";

/// The consumers with selections made by owner `$1`, and their recorded statuses.
const UNSETTLED_OWNED: &str = "
    SELECT s.consumer, st.status
    FROM (SELECT DISTINCT consumer FROM selections WHERE owner = $1) s
    LEFT JOIN tx_statuses st ON st.tx_id = s.consumer
    ORDER BY s.consumer";

/// The consumers with selections, and their recorded statuses.
const UNSETTLED: &str = "
    SELECT s.consumer, st.status
    FROM (SELECT DISTINCT consumer FROM selections) s
    LEFT JOIN tx_statuses st ON st.tx_id = s.consumer
    ORDER BY s.consumer";

/// One statement: take leadership for this transaction (released at its end), and
/// if won delete the locks created before the cut-off `$2` and the locks of
/// consumers whose status is in `$3`, as the domain's sweep rule says, locking them
/// in key order first; and forget the selections made before `$4` whose lock is
/// gone.
const SWEEP: &str = "
    WITH leader AS MATERIALIZED (SELECT pg_try_advisory_xact_lock($1) AS ok),
    doomed AS (
        SELECT l.tx_id, l.idx,
               l.created_at < TIMESTAMPTZ 'epoch' + $2::bigint * INTERVAL '1 millisecond' AS expired
        FROM token_locks l, leader
        WHERE leader.ok
          AND (l.created_at < TIMESTAMPTZ 'epoch' + $2::bigint * INTERVAL '1 millisecond'
               OR EXISTS (SELECT 1 FROM tx_statuses s
                          WHERE s.tx_id = l.consumer AND s.status = ANY($3::text[])))
        ORDER BY l.tx_id, l.idx
        FOR UPDATE OF l
    ),
    deleted AS (
        DELETE FROM token_locks l
        USING doomed d
        WHERE l.tx_id = d.tx_id AND l.idx = d.idx
        RETURNING d.expired, d.tx_id, d.idx
    ),
    forgotten AS (
        DELETE FROM selections s
        USING leader
        WHERE leader.ok
          AND s.selected_at < TIMESTAMPTZ 'epoch' + $4::bigint * INTERVAL '1 millisecond'
          AND NOT EXISTS (SELECT 1 FROM token_locks l
                          WHERE l.consumer = s.consumer AND l.tx_id = s.tx_id AND l.idx = s.idx)
        RETURNING 1
    )
    SELECT (SELECT ok FROM leader),
           COUNT(*) FILTER (WHERE expired),
           COUNT(*) FILTER (WHERE NOT expired),
           ARRAY(SELECT DISTINCT t.wallet || E'\\t' || t.token_type
                 FROM deleted x JOIN tokens t ON t.tx_id = x.tx_id AND t.idx = x.idx),
           (SELECT COUNT(*) FROM forgotten)
    FROM deleted";

const LIST_LOCKS: &str = "
    SELECT l.tx_id, l.idx, l.consumer, (EXTRACT(EPOCH FROM l.created_at) * 1000)::bigint, s.status,
           l.owner
    FROM token_locks l
    LEFT JOIN tx_statuses s ON s.tx_id = l.consumer
    ORDER BY l.created_at, l.tx_id, l.idx";

fn fault(e: &sqlx::Error) -> LockStoreError {
    LockStoreError::Fault(to_fault(e))
}

/// A stored status name as a [`TxStatus`]; an unknown name is corrupt data.
fn status_named(name: &str) -> Result<TxStatus, StoreFault> {
    TxStatus::from_name(name).ok_or_else(|| {
        StoreFault::Corrupt(format!("tx_statuses.status {name:?} is not a known status"))
    })
}

/// Rows of [`UNSETTLED`] or [`UNSETTLED_OWNED`].
fn decode_unsettled(
    rows: &[sqlx::postgres::PgRow],
) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError> {
    rows.iter()
        .map(|row| {
            let consumer = codec::id("selections.consumer", get(row, 0)?, TxId::new)?;
            let status: Option<String> = get(row, 1)?;
            Ok((
                consumer,
                status.map(|name| status_named(&name)).transpose()?,
            ))
        })
        .collect::<Result<Vec<_>, StoreFault>>()
        .map_err(LockStoreError::Fault)
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl PgBackend {
    /// The one-statement window claim over distinct tokens on `executor` (the
    /// pool, or a read-and-claim's transaction): their verdicts by id.
    async fn claim_distinct<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        consumer: &TxId,
        tokens: &[&TokenId],
        at: Timestamp,
    ) -> Result<BTreeMap<TokenId, ClaimVerdict>, LockStoreError> {
        let (small, arrays) = match self.strategy() {
            LockStrategy::Insert | LockStrategy::OnConflict => (WINDOW_SMALL, WINDOW),
            LockStrategy::SkipLocked => (WINDOW_SMALL_SKIP_LOCKED, WINDOW_SKIP_LOCKED),
        };
        let query = match tokens {
            [first, .., last] | [first @ last] if tokens.len() <= SMALL_WINDOW => {
                let mut query = sqlx::query(small)
                    .bind(first.tx.as_str())
                    .bind(i64::from(first.index))
                    .bind(consumer.as_str())
                    .bind(millis(at)?)
                    .bind(self.owner());
                for token in tokens[1..]
                    .iter()
                    .chain(std::iter::repeat(last))
                    .take(SMALL_WINDOW - 1)
                {
                    query = query.bind(token.tx.as_str()).bind(i64::from(token.index));
                }
                query
            }
            _ => {
                let (txs, idxs) = codec::token_arrays(tokens.iter().copied());
                sqlx::query(arrays)
                    .bind(txs)
                    .bind(idxs)
                    .bind(consumer.as_str())
                    .bind(millis(at)?)
                    .bind(self.owner())
            }
        };
        let found = self
            .note(query.fetch_all(executor).await)
            .map_err(|e| fault(&e))?;
        let mut verdicts = BTreeMap::new();
        for row in &found {
            let id = codec::token_id(get(row, 0)?, get(row, 1)?)?;
            let (won, spendable): (bool, bool) = (get(row, 2)?, get(row, 3)?);
            let verdict = match (won, spendable) {
                (true, _) => ClaimVerdict::Won,
                (false, true) => ClaimVerdict::Contended,
                (false, false) => ClaimVerdict::Stale,
            };
            verdicts.insert(id, verdict);
        }
        Ok(verdicts)
    }

    /// [`LockStore::claim_window`] on `executor`.
    async fn claim_window_on<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        consumer: &TxId,
        tokens: &[TokenId],
        at: Timestamp,
    ) -> Result<Vec<(TokenId, ClaimVerdict)>, LockStoreError> {
        check_window(tokens)?;
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let mut distinct: Vec<&TokenId> = tokens.iter().collect();
        distinct.sort();
        distinct.dedup();
        let verdicts = self
            .claim_distinct(executor, consumer, &distinct, at)
            .await?;
        // A token named twice: the first mention gets the verdict; a repeat of a won
        // token is contended (this consumer already holds it).
        let mut seen: BTreeMap<&TokenId, ()> = BTreeMap::new();
        Ok(tokens
            .iter()
            .map(|token| {
                let verdict = verdicts.get(token).copied().unwrap_or(ClaimVerdict::Stale);
                let verdict = match (seen.insert(token, ()), verdict) {
                    (Some(()), ClaimVerdict::Won) => ClaimVerdict::Contended,
                    (_, verdict) => verdict,
                };
                (token.clone(), verdict)
            })
            .collect())
    }

    /// [`LockStore::read_and_claim`] once this instance's turn of the line is
    /// taken: under the line's advisory lock, or apart if the line stays held
    /// beyond `line_wait`.
    async fn claim_under_line(
        &self,
        consumer: &TxId,
        read: &CandidateRead,
        at: Timestamp,
        choose: Chooser,
        line: &ClaimLine,
    ) -> Result<ReadAndClaim, LockStoreError> {
        let session = Session::acquire(self.sessions())
            .await
            .map_err(|e| fault(&e))?;
        // BEGIN and the line's lock, its wait bounded by `line_wait`, in one round
        // trip; the read after it is a new statement, so its snapshot shows every
        // claim committed under the line before (READ COMMITTED). Until COMMIT
        // answers, a failure or a dropped future closes the connection (`Tx`).
        let begin = format!(
            "BEGIN; SET LOCAL lock_timeout = {}; \
             SELECT pg_advisory_xact_lock({CLAIM_LINE_SPACE}, {}); \
             SET LOCAL lock_timeout = DEFAULT",
            self.inner.line_wait.as_millis(),
            line.key
        );
        let mut tx = match Tx::begin_on(self.sessions(), session, begin).await {
            Ok(tx) => tx,
            // The line is held beyond the bound (a slow or frozen holder): read and
            // claim without it, which is always correct; only a race may be lost.
            Err(e) if lock_not_available(&e) => {
                tracing::debug!(consumer = %consumer, "line busy beyond line_wait; reading and claiming apart");
                self.inner
                    .lines_busy
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let page = self.read_on(None, read).await?;
                let tokens = choose(&page);
                let mut conn = self.connection().await.map_err(|e| fault(&e))?;
                let verdicts = self
                    .claim_window_on(&mut *conn, consumer, &tokens, at)
                    .await?;
                return Ok(ReadAndClaim { page, verdicts });
            }
            Err(e) => return Err(fault(&e)),
        };
        let claimed = async {
            let page = self.read_on(Some(tx.conn()), read).await?;
            let tokens = choose(&page);
            let verdicts = self
                .claim_window_on(tx.conn(), consumer, &tokens, at)
                .await?;
            Ok::<_, LockStoreError>(ReadAndClaim { page, verdicts })
        }
        .await;
        match claimed {
            // A failed COMMIT may have committed: the selector gives back what it
            // chose when the call fails.
            Ok(done) => {
                tx.commit(self.sessions()).await.map_err(|e| fault(&e))?;
                Ok(done)
            }
            // A statement failed on the server (say a row lock waited out
            // `lock_timeout`): roll back and keep the connection; if even that
            // fails, it is closed.
            Err(e) => {
                let _ = tx.rollback(self.sessions()).await;
                Err(e)
            }
        }
    }

    async fn claim_by_insert(
        &self,
        consumer: &TxId,
        token: &TokenId,
        at: Timestamp,
    ) -> Result<ClaimVerdict, LockStoreError> {
        let at_ms = millis(at)?;
        let result = self
            .once(|| {
                sqlx::query_as::<_, (i64, bool)>(CLAIM_INSERT)
                    .bind(token.tx.as_str())
                    .bind(i64::from(token.index))
                    .bind(consumer.as_str())
                    .bind(at_ms)
                    .bind(self.owner())
                    .fetch_one(self.pool())
            })
            .await;
        match result {
            Ok((won, _)) if won > 0 => Ok(ClaimVerdict::Won),
            Ok((_, true)) => Ok(ClaimVerdict::Contended),
            Ok((_, false)) => Ok(ClaimVerdict::Stale),
            Err(e)
                if e.as_database_error()
                    .is_some_and(|db| db.is_unique_violation()) =>
            {
                Ok(ClaimVerdict::Contended)
            }
            Err(e) => Err(fault(&e)),
        }
    }
}

/// A row of [`CONFIRM`] or [`CONFIRM_WITH_CHANGE`]: kind, tx, idx, detail.
type ConfirmRow = (String, Option<String>, Option<i64>, Option<String>);

impl PgBackend {
    /// [`LockStore::confirm`] (no `change_to`) or
    /// [`LockStore::confirm_with_change`]: one call of the confirm function,
    /// answered with every output, the given ones first.
    async fn confirm_call(
        &self,
        consumer: &TxId,
        outputs: &[Output],
        change_to: Option<&WalletId>,
        at: Timestamp,
    ) -> Result<(Confirmation, Vec<Output>), LockStoreError> {
        check_outputs(outputs)?;
        let at_ms = millis(at)?;
        let wallets: Vec<&str> = outputs.iter().map(|o| o.wallet.as_str()).collect();
        let types: Vec<&str> = outputs.iter().map(|o| o.token_type.as_str()).collect();
        let amounts: Vec<String> = outputs.iter().map(|o| o.quantity.to_string()).collect();
        // Safe to repeat: a retry of a committed confirm answers `replayed` (with
        // change, `differ`: `Settlement` then confirms the stored outputs).
        let call = || {
            self.retried(|| {
                let query = match change_to {
                    Some(wallet) => sqlx::query_as::<_, ConfirmRow>(CONFIRM_WITH_CHANGE)
                        .bind(consumer.as_str())
                        .bind(at_ms)
                        .bind(wallet.as_str()),
                    None => sqlx::query_as::<_, ConfirmRow>(CONFIRM)
                        .bind(consumer.as_str())
                        .bind(at_ms),
                };
                query
                    .bind(&wallets)
                    .bind(&types)
                    .bind(&amounts)
                    .fetch_all(self.pool())
            })
        };
        let rows = match call().await {
            // An add committed a token of one of the output ids while the call
            // waited to insert it: the call wrote nothing (it is one
            // transaction), and made again it finds that token and answers as
            // for any existing id (`differ`, or `replayed`).
            Err(e)
                if e.as_database_error()
                    .is_some_and(|db| db.is_unique_violation()) =>
            {
                call().await
            }
            answer => answer,
        }
        .map_err(|e| fault(&e))?;
        let mut change = Vec::new();
        let mut done = Confirmation::default();
        let mut keys = Vec::new();
        for (kind, tx, idx, detail) in rows {
            let detail = detail.unwrap_or_default();
            match kind.as_str() {
                "spent" => done
                    .spent
                    .push(codec::token_id(tx.unwrap_or_default(), idx.unwrap_or(-1))?),
                "key" => keys.push(detail),
                "change" => change.push((idx, detail)),
                "replayed" => done.replayed = true,
                "differ" => {
                    return Err(LockStoreError::OutputsDiffer {
                        tx: consumer.clone(),
                        detail,
                    });
                }
                "bad_outputs" => return Err(LockStoreError::BadOutputs { detail }),
                "double_spend" => {
                    return Err(LockStoreError::DoubleSpend {
                        token: codec::token_id(tx.unwrap_or_default(), idx.unwrap_or(-1))?,
                        spent_by: codec::id("tokens.spent_by", detail, TxId::new)?,
                    });
                }
                "not_conserved" => {
                    let mut parts = detail.split('\t');
                    let (token_type, inputs, outputs) = (
                        parts.next().unwrap_or_default().to_owned(),
                        parts.next().unwrap_or_default().to_owned(),
                        parts.next().unwrap_or_default().to_owned(),
                    );
                    return Err(LockStoreError::NotConserved(Box::new(Unconserved {
                        tx: consumer.clone(),
                        token_type,
                        inputs,
                        outputs,
                    })));
                }
                "overflow" => return Err(crate::tokens::overflowing_outputs(&detail)?),
                other => {
                    return Err(LockStoreError::Fault(StoreFault::Corrupt(format!(
                        "holdfast_confirm answered an unknown row kind {other:?}"
                    ))));
                }
            }
        }
        let all = with_change(outputs, change_to, change)?;
        done.outputs = (0u32..)
            .zip(&all)
            .map(|(i, _)| TokenId::new(consumer.clone(), i))
            .collect();
        done.spent.sort();
        self.signal(&token_keys(&keys), Some(consumer));
        Ok((done, all))
    }
}

/// `outputs` followed by the change outputs that the `change` rows of
/// [`CONFIRM_WITH_CHANGE`] name (`(idx, type TAB amount)`, in any order): their
/// indexes must be exactly those after the given outputs.
fn with_change(
    outputs: &[Output],
    wallet: Option<&WalletId>,
    mut rows: Vec<(Option<i64>, String)>,
) -> Result<Vec<Output>, StoreFault> {
    rows.sort_by_key(|(idx, _)| *idx);
    let mut all = outputs.to_vec();
    for (idx, detail) in rows {
        let corrupt = || {
            StoreFault::Corrupt(format!(
                "holdfast_confirm_with_change answered change {detail:?} at {idx:?}, expected output {}",
                all.len()
            ))
        };
        let wallet = wallet.ok_or_else(corrupt)?;
        if idx.and_then(|i| usize::try_from(i).ok()) != Some(all.len()) {
            return Err(corrupt());
        }
        let (token_type, amount) = detail.split_once('\t').ok_or_else(corrupt)?;
        all.push(Output {
            wallet: wallet.clone(),
            token_type: codec::id("tokens.token_type", token_type.to_owned(), TokenType::new)?,
            quantity: codec::quantity(amount)?,
        });
    }
    Ok(all)
}

#[async_trait]
impl LockStore for PgBackend {
    async fn claim(
        &self,
        consumer: &TxId,
        token: &TokenId,
        at: Timestamp,
    ) -> Result<ClaimVerdict, LockStoreError> {
        match self.strategy() {
            LockStrategy::Insert => self.claim_by_insert(consumer, token, at).await,
            LockStrategy::OnConflict | LockStrategy::SkipLocked => {
                let mut conn = self.connection().await.map_err(|e| fault(&e))?;
                let verdicts = self
                    .claim_distinct(&mut *conn, consumer, &[token], at)
                    .await?;
                Ok(verdicts.get(token).copied().unwrap_or(ClaimVerdict::Stale))
            }
        }
    }

    async fn claim_window(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
        at: Timestamp,
    ) -> Result<Vec<(TokenId, ClaimVerdict)>, LockStoreError> {
        check_window(tokens)?;
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.connection().await.map_err(|e| fault(&e))?;
        self.claim_window_on(&mut *conn, consumer, tokens, at).await
    }

    async fn read_and_claim(
        &self,
        consumer: &TxId,
        read: &CandidateRead,
        at: Timestamp,
        choose: Chooser,
    ) -> Result<Option<ReadAndClaim>, LockStoreError> {
        let (wallet, token_type) = match read {
            CandidateRead::Bands(q) => (&q.wallet, &q.token_type),
            CandidateRead::Page(q) => (&q.wallet, &q.token_type),
        };
        let line = claim_line(wallet, token_type);
        // One caller of this instance per line at a time waits for the line's
        // advisory lock: the others wait here, without a pooled connection.
        let _turn = self.inner.claim_lines[line.stripe].lock().await;
        // Bounded on this side too: a connection whose server vanished without a
        // word (a half-open socket) must not keep the line's turn for good.
        let bound = self.inner.transaction_bound;
        match tokio::time::timeout(
            bound,
            self.claim_under_line(consumer, read, at, choose, &line),
        )
        .await
        {
            Ok(answer) => answer.map(Some),
            Err(_) => Err(LockStoreError::Fault(StoreFault::Unavailable(format!(
                "a read-and-claim got no answer within {} ms; its connection was closed",
                bound.as_millis()
            )))),
        }
    }

    /// Where races are likely: it takes the wallet and type's advisory lock and
    /// four statements where a read and a claim apart take two.
    fn read_with_claim(&self) -> ReadWithClaim {
        ReadWithClaim::WhereRacesLikely
    }

    async fn release_consumer(
        &self,
        consumer: &TxId,
        at: Timestamp,
        record_status: bool,
    ) -> Result<u64, LockStoreError> {
        let at_ms = millis(at)?;
        let (released, keys) = self
            .retried(|| {
                sqlx::query_as::<_, (i64, Vec<String>)>(RELEASE_CONSUMER)
                    .bind(consumer.as_str())
                    .bind(at_ms)
                    .bind(record_status)
                    .fetch_one(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        self.signal(&token_keys(&keys), Some(consumer));
        Ok(count(released))
    }

    async fn release_tokens(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
    ) -> Result<u64, LockStoreError> {
        if tokens.is_empty() {
            return Ok(0);
        }
        let (txs, idxs) = codec::token_arrays(tokens.iter());
        let (released, keys) = self
            .retried(|| {
                sqlx::query_as::<_, (i64, Vec<String>)>(RELEASE_TOKENS)
                    .bind(consumer.as_str())
                    .bind(&txs)
                    .bind(&idxs)
                    .fetch_one(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        self.signal(&token_keys(&keys), Some(consumer));
        Ok(count(released))
    }

    async fn renew(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
        at: Timestamp,
    ) -> Result<Vec<TokenId>, LockStoreError> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let (txs, idxs) = codec::token_arrays(tokens.iter());
        let at_ms = millis(at)?;
        let found = self
            .retried(|| {
                sqlx::query(RENEW)
                    .bind(consumer.as_str())
                    .bind(&txs)
                    .bind(&idxs)
                    .bind(at_ms)
                    .fetch_all(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        let mut held = found
            .iter()
            .map(|row| codec::token_id(get(row, 0)?, get(row, 1)?))
            .collect::<Result<Vec<_>, _>>()
            .map_err(LockStoreError::Fault)?;
        held.sort();
        Ok(held)
    }

    async fn spend_consumer(
        &self,
        consumer: &TxId,
        at: Timestamp,
        record_status: bool,
    ) -> Result<Vec<TokenId>, LockStoreError> {
        let at_ms = millis(at)?;
        let found = self
            .retried(|| {
                sqlx::query(SPEND)
                    .bind(consumer.as_str())
                    .bind(at_ms)
                    .bind(record_status)
                    .fetch_all(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        let mut spent = Vec::with_capacity(found.len());
        for row in &found {
            let token = codec::token_id(get(row, 0)?, get(row, 1)?)?;
            let spender = codec::id("tokens.spent_by", get(row, 2)?, TxId::new)?;
            if spender != *consumer {
                return Err(LockStoreError::DoubleSpend {
                    token,
                    spent_by: spender,
                });
            }
            spent.push(token);
        }
        spent.sort();
        Ok(spent)
    }

    async fn confirm(
        &self,
        consumer: &TxId,
        outputs: &[Output],
        at: Timestamp,
    ) -> Result<Confirmation, LockStoreError> {
        let (done, _) = self.confirm_call(consumer, outputs, None, at).await?;
        Ok(done)
    }

    async fn confirm_with_change(
        &self,
        consumer: &TxId,
        outputs: &[Output],
        change_to: &WalletId,
        at: Timestamp,
    ) -> Result<(Confirmation, Vec<Output>), LockStoreError> {
        self.confirm_call(consumer, outputs, Some(change_to), at)
            .await
    }

    async fn selected(&self, consumer: &TxId) -> Result<Vec<Token>, LockStoreError> {
        let found = self
            .retried(|| {
                sqlx::query(SELECTED)
                    .bind(consumer.as_str())
                    .fetch_all(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        found
            .iter()
            .map(crate::tokens::decode_token)
            .collect::<Result<Vec<_>, _>>()
            .map_err(LockStoreError::Fault)
    }

    async fn unsettled(&self) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError> {
        let found = self
            .retried(|| sqlx::query(UNSETTLED).fetch_all(self.pool()))
            .await
            .map_err(|e| fault(&e))?;
        decode_unsettled(&found)
    }

    async fn unsettled_owned(&self) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError> {
        let found = self
            .retried(|| {
                sqlx::query(UNSETTLED_OWNED)
                    .bind(self.owner())
                    .fetch_all(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        decode_unsettled(&found)
    }

    async fn sweep(&self, rule: SweepRule) -> Result<SweepReport, LockStoreError> {
        let dead: Vec<&str> = SWEPT_STATUSES.iter().map(|s| s.as_str()).collect();
        let at_ms = millis(rule.cutoff)?;
        let forget_ms = millis(rule.forget_before())?;
        let row = self
            .retried(|| {
                sqlx::query(SWEEP)
                    .bind(SWEEP_LOCK_KEY)
                    .bind(at_ms)
                    .bind(&dead)
                    .bind(forget_ms)
                    .fetch_one(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        let report = SweepReport {
            leader: get(&row, 0)?,
            expired: count(get(&row, 1)?),
            released_by_status: count(get(&row, 2)?),
            forgotten: count(get(&row, 4)?),
        };
        let keys: Vec<String> = get(&row, 3)?;
        self.signal(&token_keys(&keys), None);
        if report.leader {
            tracing::debug!(?report, "lease sweep");
        }
        Ok(report)
    }

    async fn list_locks(&self) -> Result<Vec<LockInfo>, LockStoreError> {
        let found = self
            .retried(|| sqlx::query(LIST_LOCKS).fetch_all(self.pool()))
            .await
            .map_err(|e| fault(&e))?;
        found
            .iter()
            .map(|row| {
                let status: Option<String> = get(row, 4)?;
                Ok(LockInfo {
                    token: codec::token_id(get(row, 0)?, get(row, 1)?)?,
                    consumer: codec::id("token_locks.consumer", get(row, 2)?, TxId::new)?,
                    created_at: timestamp(get(row, 3)?)?,
                    consumer_status: status.map(|name| status_named(&name)).transpose()?,
                    owner: get(row, 5)?,
                })
            })
            .collect::<Result<Vec<_>, StoreFault>>()
            .map_err(LockStoreError::Fault)
    }

    fn round_trips(&self) -> u64 {
        PgBackend::round_trips(self)
    }
}

#[cfg(test)]
mod tests {
    use holdfast_domain::{Precision, Quantity, TokenType, WalletId};
    use holdfast_ports::{MAX_OUTPUTS, Output, StoreFault};

    use super::with_change;

    fn output(wallet: &str, kind: &str, amount: u128) -> Output {
        Output {
            wallet: WalletId::new(wallet).expect("wallet"),
            token_type: TokenType::new(kind).expect("type"),
            quantity: Quantity::new(amount, Precision::MAX).expect("amount"),
        }
    }

    /// Change rows are placed by their index, in whatever order they came; a
    /// row that does not follow the outputs, or change without a change
    /// wallet, is a corrupt answer.
    #[test]
    fn change_rows_are_placed_by_index() {
        let paid = [output("r", "CHF", 12)];
        let w = WalletId::new("w").expect("wallet");
        let rows = vec![
            (Some(2), "EUR\t7".to_owned()),
            (Some(1), "CHF\t3".to_owned()),
        ];
        let all = with_change(&paid, Some(&w), rows.clone()).expect("placed");
        assert_eq!(
            all,
            [
                output("r", "CHF", 12),
                output("w", "CHF", 3),
                output("w", "EUR", 7)
            ]
        );
        let gap = vec![(Some(2), "EUR\t7".to_owned())];
        for (rows, wallet) in [(gap, Some(&w)), (rows, None)] {
            let answer = with_change(&paid, wallet, rows);
            assert!(matches!(answer, Err(StoreFault::Corrupt(_))), "{answer:?}");
        }
    }

    /// The SQL of a confirm with change refuses more outputs than the ports
    /// allow a confirm, the same limit.
    #[test]
    fn the_confirm_with_change_counts_outputs_to_the_ports_limit() {
        let migration = include_str!("../migrations/0010_confirm_with_change.sql");
        let check = format!("IF cardinality(all_wallets) > {MAX_OUTPUTS} THEN");
        assert!(migration.contains(&check), "no {check:?}");
        let told = format!("outputs with the change; expected at most {MAX_OUTPUTS}");
        assert!(migration.contains(&told), "no {told:?}");
    }
}
