//! The token store: tokens, candidate pages read through the `tokens_candidates`
//! index, balances.

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use holdfast_domain::{Candidate, Quantity, Token, TokenId, TokenType, TxId, WalletId};
use holdfast_ports::{
    BandQuery, CandidateQuery, CandidateRead, LockStoreError, NewToken, StoreFault, TokenStore,
    TokenStoreError, WakeKey, WakeUps,
};

use crate::backend::PgBackend;
use crate::codec::timestamp;
use crate::codec::{self, get};
use crate::error::fault as to_fault;
use crate::session::Tx;
use crate::wake::token_keys;

/// What makes a token row `t` spendable, written once: spendable and unspent (the
/// rows of the partial index `tokens_candidates`). The claims in `locks` re-check it.
macro_rules! spendable {
    () => {
        "t.spendable AND t.spent_by IS NULL"
    };
}
pub(crate) use spendable;

/// A spendable token of wallet `$1` and type `$2`: a range of `tokens_candidates`
/// in (amount, tx_id, idx) order, so a scan of it needs no sort.
macro_rules! spendable_of_line {
    () => {
        concat!("t.wallet = $1 AND t.token_type = $2 AND ", spendable!())
    };
}

/// Not locked: the anti-join on `token_locks` that drops a locked token.
macro_rules! unlocked {
    () => {
        "NOT EXISTS (SELECT 1 FROM token_locks l WHERE l.tx_id = t.tx_id AND l.idx = t.idx)"
    };
}

/// A candidate read: `$columns` of the spendable tokens of the line, `$and`
/// conditions on them, and (last) not locked; then `$tail` (order and limit).
/// Every candidate page and band is this one text.
macro_rules! candidates {
    ($columns:literal; $($and:literal),*; $tail:literal) => {
        concat!(
            "SELECT ", $columns, "
         FROM tokens t
         WHERE ", spendable_of_line!(), "
           ",
            $("AND ", $and, "
           ",)*
            "AND ", unlocked!(), "
         ", $tail
        )
    };
}

/// The candidate query, with or without the keyset cursor. Kept as macros so the
/// `EXPLAIN` of [`PgBackend::explain_candidates`] is the very same text.
macro_rules! candidates_sql {
    (first) => {
        candidates!("t.tx_id, t.idx, t.amount::text"; ; "ORDER BY t.amount, t.tx_id, t.idx
         LIMIT $3")
    };
    (after) => {
        candidates!(
            "t.tx_id, t.idx, t.amount::text";
            "(t.amount, t.tx_id, t.idx) > ($4::numeric, $5::text COLLATE \"C\", $6::bigint)";
            "ORDER BY t.amount, t.tx_id, t.idx
         LIMIT $3"
        )
    };
}

/// A statement's text, or (when `$explain`) its `EXPLAIN`: the very same text
/// either way.
macro_rules! text {
    ($explain:expr, $($sql:tt)*) => {
        if $explain {
            concat!("EXPLAIN ", $($sql)*)
        } else {
            $($sql)*
        }
    };
}

/// The band reads, as literals (sqlx takes `&'static str`; `EXPLAIN` of
/// [`PgBackend::explain_candidate_bands`] is the very same text). `cover`:
/// candidates >= the threshold, ascending, `LIMIT $4`; `fill`: below it, the
/// candidate index scanned backwards, `LIMIT $5`; `both`: the two in one round trip.
macro_rules! band_sql {
    (cover) => {
        candidates!(
            "t.tx_id, t.idx, t.amount::text";
            "t.amount >= $3::numeric";
            "ORDER BY t.amount, t.tx_id, t.idx
         LIMIT $4"
        )
    };
    (fill) => {
        candidates!(
            "t.tx_id, t.idx, t.amount::text";
            "t.amount < $3::numeric";
            "ORDER BY t.amount DESC, t.tx_id DESC, t.idx DESC
         LIMIT $5"
        )
    };
    (both) => {
        concat!("(", band_sql!(cover), ") UNION ALL (", band_sql!(fill), ")")
    };
    // A further fill page: strictly before the keyset cursor, largest first.
    (fill_before) => {
        candidates!(
            "t.tx_id, t.idx, t.amount::text";
            "t.amount < $3::numeric",
            "(t.amount, t.tx_id, t.idx) < ($5::numeric, $6::text COLLATE \"C\", $7::bigint)";
            "ORDER BY t.amount DESC, t.tx_id DESC, t.idx DESC
         LIMIT $4"
        )
    };
    // Both bands, the fill band only if no cover candidate is <= $6 (an
    // uncorrelated condition: a one-time filter, the fill scan never runs).
    (both_unless_cover_within) => {
        concat!(
            "WITH cover AS MATERIALIZED (",
            candidates!(
                "t.tx_id, t.idx, t.amount";
                "t.amount >= $3::numeric";
                "ORDER BY t.amount, t.tx_id, t.idx
         LIMIT $4"
            ),
            "
         )
         SELECT tx_id, idx, amount::text FROM cover
         UNION ALL
         (",
            candidates!(
                "t.tx_id, t.idx, t.amount::text";
                "t.amount < $3::numeric";
                "AND NOT EXISTS (SELECT 1 FROM cover c WHERE c.amount <= $6::numeric)
         ORDER BY t.amount DESC, t.tx_id DESC, t.idx DESC
         LIMIT $5"
            ),
            ")"
        )
    };
}

/// The first key of the two-key advisory locks (the *balance locks*) that keep
/// the writes adding to one wallet and type's unspent total from overflowing it:
/// `add_tokens` and the outputs of `holdfast_confirm` take them through the one
/// SQL function `holdfast_lock_balances` (migrations 0007 to 0009). The bytes of `"wbal"`;
/// the second key is `hashtext(wallet || TAB || type)`, computed by the server;
/// `pg_locks` shows them as `classid` and `objid`.
///
/// A *small* add (every amount below 2^63, and no unspent token of 2^63 or more,
/// spendable or not, in its pairs) takes them shared and checks no total, so
/// small adds to one wallet run at once; any other add takes them exclusive and
/// checks the totals. Tokens of 2^63 or more are only added under the exclusive
/// lock, so a pair that only small adds write holds amounts below 2^63 only: fewer
/// than 2^64 rows of those sum below 2^127, no overflow. Without an exclusive
/// lock, two big adds could each see the other's tokens missing (READ COMMITTED)
/// and together overflow the total.
pub const BALANCE_SPACE: i32 = 0x7762_616c;

/// Locks the wallet and type pairs of `$1`, `$2` that amounts `$3` are added to,
/// in key order: shared for a small add (answers false: no total to check),
/// exclusive otherwise (answers true). A statement of its own: the next
/// statement's snapshot (READ COMMITTED, which the session settings pin and the
/// function requires) then shows every write committed under these locks.
const LOCK_BALANCES: &str = "SELECT holdfast_lock_balances($1::text[], $2::text[], $3::text[])";

/// Inserts the batch in key order (an existing id is left alone) and answers a
/// row `new` per inserted id and, when `$7` (the balance locks are exclusive), a
/// row `overflow` (wallet TAB type) per wallet and type whose unspent total,
/// spendable or not, would exceed 2^128 - 1 with the inserted tokens (the sums
/// read the statement's snapshot: the total before it). A small add (`$7`
/// false) checks nothing: see [`BALANCE_SPACE`]. Per pair, `base` is what the
/// batch adds plus the unspendable tokens, summed exactly (through
/// `tokens_unspendable`); the spendable ones are summed (through
/// `tokens_candidates`) only if their largest (one index search) is 2^63 or more
/// or `base` exceeds 2^127: a table holds fewer than 2^64 rows, so amounts below
/// 2^63 sum below 2^127, and adding at most 2^127 to that cannot pass 2^128 - 1.
const INSERT_TOKENS: &str = concat!(
    "
    WITH ins AS (
        INSERT INTO tokens (tx_id, idx, wallet, token_type, amount, spendable)
        SELECT i.tx_id, i.idx, i.wallet, i.token_type, i.amount::numeric, i.spendable
        FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::bool[])
             AS i(tx_id, idx, wallet, token_type, amount, spendable)
        ORDER BY i.tx_id, i.idx
        ON CONFLICT (tx_id, idx) DO NOTHING
        RETURNING tx_id, idx, wallet, token_type, amount
    ),
    added AS (
        SELECT wallet, token_type, SUM(amount) AS total FROM ins
        WHERE $7::bool
        GROUP BY wallet, token_type
    ),
    bounds AS MATERIALIZED (
        SELECT a.wallet, a.token_type,
               a.total + COALESCE((SELECT SUM(t.amount) FROM tokens t
                                   WHERE t.wallet = a.wallet AND t.token_type = a.token_type
                                     AND NOT t.spendable AND t.spent_by IS NULL), 0) AS base,
               (SELECT MAX(t.amount) FROM tokens t
                WHERE t.wallet = a.wallet AND t.token_type = a.token_type
                  AND ",
    spendable!(),
    ") AS top
        FROM added a
    )
    SELECT 'new' AS kind, tx_id, idx FROM ins
    UNION ALL
    (SELECT 'overflow', b.wallet || E'\\t' || b.token_type, NULL
     FROM bounds b
     WHERE CASE
         WHEN COALESCE(b.top, 0) < 9223372036854775808
              AND b.base <= 170141183460469231731687303715884105728 THEN FALSE
         ELSE b.base
              + COALESCE((SELECT SUM(t.amount) FROM tokens t
                          WHERE t.wallet = b.wallet AND t.token_type = b.token_type
                            AND ",
    spendable!(),
    "), 0)
              > 340282366920938463463374607431768211455
     END
     ORDER BY b.wallet, b.token_type)"
);

const STORED_IDENTITIES: &str = "
    SELECT t.tx_id, t.idx, t.wallet, t.token_type, t.amount::text
    FROM tokens t
    JOIN UNNEST($1::text[], $2::bigint[]) AS i(tx_id, idx) ON t.tx_id = i.tx_id AND t.idx = i.idx";

const SELECT_TOKEN: &str = "
    SELECT tx_id, idx, wallet, token_type, amount::text, spendable, spent_by,
           (EXTRACT(EPOCH FROM spent_at) * 1000)::bigint
    FROM tokens WHERE tx_id = $1 AND idx = $2";

/// The unspent tokens of wallet `$1`, spendable or not, in (amount, tx_id, idx)
/// order, at most `$limit`: the wallet's ranges of the two partial indexes that
/// hold unspent rows (`tokens_candidates` and `tokens_unspendable`), merged. One
/// condition `spent_by IS NULL` matches neither index, so it read the whole table
/// (31 ms for a wallet of 3,334 tokens in a table of 226k; 4-9 ms this way).
macro_rules! list_tokens {
    ($of_type:literal, $limit:literal) => {
        concat!(
            "SELECT u.tx_id, u.idx, u.wallet, u.token_type, u.amount::text, u.spendable,
                    u.spent_by, (EXTRACT(EPOCH FROM u.spent_at) * 1000)::bigint
             FROM ((SELECT t.* FROM tokens t
                    WHERE t.wallet = $1",
            $of_type,
            " AND ",
            spendable!(),
            "
                    ORDER BY t.amount, t.tx_id, t.idx LIMIT ",
            $limit,
            ")
                   UNION ALL
                   (SELECT t.* FROM tokens t
                    WHERE t.wallet = $1",
            $of_type,
            " AND NOT t.spendable AND t.spent_by IS NULL
                    ORDER BY t.amount, t.tx_id, t.idx LIMIT ",
            $limit,
            ")) AS u
             -- u.amount, not the amount::text output column: numeric order.
             ORDER BY u.amount, u.tx_id, u.idx
             LIMIT ",
            $limit
        )
    };
}

/// The spendable, unspent sum of wallet `$1` and type `$2`, locks ignored, less the
/// tokens consumer `$3` (when not null) has selected.
const BALANCE: &str = concat!(
    "
    SELECT COALESCE(SUM(t.amount), 0)::text
    FROM tokens t
    WHERE ",
    spendable_of_line!(),
    "
      AND ($3::text IS NULL OR NOT EXISTS (
           SELECT 1 FROM selections s
           WHERE s.consumer = $3 AND s.tx_id = t.tx_id AND s.idx = t.idx))"
);

const SET_SPENDABLE: &str = "
    UPDATE tokens SET spendable = $3 WHERE tx_id = $1 AND idx = $2 AND spent_by IS NULL
    RETURNING wallet || E'\\t' || token_type";

fn fault(e: &sqlx::Error) -> TokenStoreError {
    TokenStoreError::Fault(to_fault(e))
}

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// What makes two tokens under one id the same token.
fn identity(t: &NewToken) -> (&WalletId, &TokenType, Quantity) {
    (&t.wallet, &t.token_type, t.quantity)
}

fn describe(wallet: &str, token_type: &str, quantity: &str) -> String {
    format!("wallet {wallet}, type {token_type}, amount {quantity}")
}

/// The wallet and type of an `overflow` row (`wallet TAB type`).
fn overflowing_pair(pair: &str) -> Result<(WalletId, TokenType), StoreFault> {
    let (wallet, token_type) = pair.split_once('\t').unwrap_or((pair, ""));
    Ok((
        codec::id("tokens.wallet", wallet.to_owned(), WalletId::new)?,
        codec::id("tokens.token_type", token_type.to_owned(), TokenType::new)?,
    ))
}

/// What an `overflow` row of `holdfast_confirm` (`wallet TAB type`) answers: the
/// outputs would lift that wallet's unspent total beyond 2^128 - 1, bad outputs.
pub(crate) fn overflowing_outputs(pair: &str) -> Result<LockStoreError, StoreFault> {
    let (wallet, token_type) = overflowing_pair(pair)?;
    Ok(LockStoreError::BadOutputs {
        detail: TokenStoreError::BalanceOverflow { wallet, token_type }.to_string(),
    })
}

pub(crate) fn decode_token(row: &sqlx::postgres::PgRow) -> Result<Token, StoreFault> {
    let id = codec::token_id(get(row, 0)?, get(row, 1)?)?;
    let spent_at: Option<i64> = get(row, 7)?;
    Ok(Token {
        id,
        wallet: codec::id("tokens.wallet", get(row, 2)?, WalletId::new)?,
        token_type: codec::id("tokens.token_type", get(row, 3)?, TokenType::new)?,
        quantity: codec::quantity(&get::<String>(row, 4)?)?,
        spendable: get(row, 5)?,
        spent_by: get::<Option<String>>(row, 6)?
            .map(|tx| codec::id("tokens.spent_by", tx, TxId::new))
            .transpose()?,
        spent_at: spent_at.map(timestamp).transpose()?,
    })
}

/// Diagnostics of the candidate reads, here beside the statements they explain.
impl PgBackend {
    /// The plan PostgreSQL chooses for the candidate query of `wallet`/`token_type`
    /// (first page, `limit` rows), as `EXPLAIN` text. For diagnostics: the plan
    /// should scan `tokens_candidates` and contain no sort.
    pub async fn explain_candidates(
        &self,
        wallet: &WalletId,
        token_type: &TokenType,
        after: Option<&Candidate>,
        limit: usize,
    ) -> Result<String, StoreFault> {
        let query = CandidateQuery {
            wallet: wallet.clone(),
            token_type: token_type.clone(),
            after: after.cloned(),
            limit,
        };
        explain(self, page_statement(&query, true)).await
    }

    /// The plan PostgreSQL chooses for a first band read (`cover_first`), as
    /// `EXPLAIN` text: both bands should scan `tokens_candidates` (the fill band
    /// backwards) and contain no sort.
    pub async fn explain_candidate_bands(&self, query: &BandQuery) -> Result<String, StoreFault> {
        explain(self, band_statement(query, true)).await
    }

    /// The plan PostgreSQL chooses for `list_tokens` of `wallet` (of `token_type`
    /// when given, `limit` rows), as `EXPLAIN` text: it should read the wallet's
    /// ranges of `tokens_candidates` and `tokens_unspendable`, not scan `tokens`.
    pub async fn explain_list_tokens(
        &self,
        wallet: &WalletId,
        token_type: Option<&TokenType>,
        limit: usize,
    ) -> Result<String, StoreFault> {
        explain(self, list_statement(wallet, token_type, limit, true)).await
    }
}

/// The statement of a listing of `wallet`'s unspent tokens (of `token_type` when
/// given), at most `n` (its `EXPLAIN` when `explain`).
fn list_statement<'q>(
    wallet: &'q WalletId,
    token_type: Option<&'q TokenType>,
    n: usize,
    explain: bool,
) -> Statement<'q> {
    match token_type {
        Some(token_type) => {
            sqlx::query(text!(explain, list_tokens!(" AND t.token_type = $2", "$3")))
                .bind(wallet.as_str())
                .bind(token_type.as_str())
        }
        None => sqlx::query(text!(explain, list_tokens!("", "$2"))).bind(wallet.as_str()),
    }
    .bind(limit(n))
}

/// Runs an `EXPLAIN` statement and joins its lines.
async fn explain(
    backend: &PgBackend,
    statement: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> Result<String, StoreFault> {
    let rows = backend
        .note(statement.fetch_all(backend.pool()).await)
        .map_err(|e| to_fault(&e))?;
    let lines = rows
        .iter()
        .map(|row| get::<String>(row, 0))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(lines.join("\n"))
}

/// A statement of the candidate read (columns tx_id, idx, amount as text).
type Statement<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// The statement of a candidate page: the first, or the next after its cursor
/// (its `EXPLAIN` when `explain`).
fn page_statement(query: &CandidateQuery, explain: bool) -> Statement<'_> {
    match &query.after {
        None => sqlx::query(text!(explain, candidates_sql!(first)))
            .bind(query.wallet.as_str())
            .bind(query.token_type.as_str())
            .bind(limit(query.limit)),
        Some(cursor) => sqlx::query(text!(explain, candidates_sql!(after)))
            .bind(query.wallet.as_str())
            .bind(query.token_type.as_str())
            .bind(limit(query.limit))
            .bind(cursor.quantity.to_string())
            .bind(cursor.id.tx.as_str())
            .bind(i64::from(cursor.id.index)),
    }
}

/// The statement of a band read: both bands (the fill band unless a cover is
/// within `fill_unless_cover_at_most`), the cover band alone, or a further fill
/// page (its `EXPLAIN` when `explain`).
fn band_statement(query: &BandQuery, explain: bool) -> Statement<'_> {
    let threshold = query.threshold.to_string();
    match &query.fill_before {
        // The cover band alone when no fill band is asked for (an amount of 1).
        None if query.fill == 0 => sqlx::query(text!(explain, band_sql!(cover)))
            .bind(query.wallet.as_str())
            .bind(query.token_type.as_str())
            .bind(threshold)
            .bind(limit(query.cover)),
        None => {
            let sql = match query.fill_unless_cover_at_most {
                None => text!(explain, band_sql!(both)),
                Some(_) => text!(explain, band_sql!(both_unless_cover_within)),
            };
            let statement = sqlx::query(sql)
                .bind(query.wallet.as_str())
                .bind(query.token_type.as_str())
                .bind(threshold)
                .bind(limit(query.cover))
                .bind(limit(query.fill));
            match query.fill_unless_cover_at_most {
                None => statement,
                Some(at_most) => statement.bind(at_most.to_string()),
            }
        }
        Some(cursor) => sqlx::query(text!(explain, band_sql!(fill_before)))
            .bind(query.wallet.as_str())
            .bind(query.token_type.as_str())
            .bind(threshold)
            .bind(limit(query.fill))
            .bind(cursor.quantity.to_string())
            .bind(cursor.id.tx.as_str())
            .bind(i64::from(cursor.id.index)),
    }
}

impl PgBackend {
    /// Reads the candidates `read` asks for on `executor` (the pool, or the
    /// transaction of a read-and-claim), in the order the port's contract gives:
    /// a page ascending; bands cover first (ascending), then fill (descending).
    pub(crate) async fn read_on(
        &self,
        conn: Option<&mut sqlx::PgConnection>,
        read: &CandidateRead,
    ) -> Result<Vec<Candidate>, StoreFault> {
        let statement = || match read {
            CandidateRead::Page(query) => page_statement(query, false),
            CandidateRead::Bands(query) => band_statement(query, false),
        };
        if matches!(read, CandidateRead::Page(query) if query.limit == 0) {
            return Ok(Vec::new());
        }
        let rows = match conn {
            Some(conn) => self.note(statement().fetch_all(conn).await),
            None => self.retried(|| statement().fetch_all(self.pool())).await,
        }
        .map_err(|e| to_fault(&e))?;
        let mut found = rows
            .iter()
            .map(|row| {
                Ok(Candidate {
                    id: codec::token_id(get(row, 0)?, get(row, 1)?)?,
                    quantity: codec::quantity(&get::<String>(row, 2)?)?,
                })
            })
            .collect::<Result<Vec<_>, StoreFault>>()?;
        if let CandidateRead::Bands(query) = read {
            // The contract's order, whatever order the server appends the bands in.
            let key = |c: &Candidate| (c.quantity, c.id.clone());
            found.sort_by(|a, b| {
                match (a.quantity >= query.threshold, b.quantity >= query.threshold) {
                    (true, true) => key(a).cmp(&key(b)),
                    (false, false) => key(b).cmp(&key(a)),
                    // Cover before fill.
                    (a_cover, b_cover) => b_cover.cmp(&a_cover),
                }
            });
        }
        Ok(found)
    }

    /// The spendable, unspent sum of the wallet and type, locks ignored, less the
    /// tokens `consumer` (if any) has selected.
    async fn sum_unspent(
        &self,
        wallet: &WalletId,
        token_type: &TokenType,
        consumer: Option<&TxId>,
    ) -> Result<Quantity, TokenStoreError> {
        let row = self
            .retried(|| {
                sqlx::query(BALANCE)
                    .bind(wallet.as_str())
                    .bind(token_type.as_str())
                    .bind(consumer.map(TxId::as_str))
                    .fetch_one(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        let sum: String = get(&row, 0)?;
        Quantity::parse(&sum, holdfast_domain::Precision::MAX).map_err(|e| {
            TokenStoreError::Fault(StoreFault::Corrupt(format!(
                "balance of wallet {wallet} type {token_type} does not fit 128 bits: {e}"
            )))
        })
    }
}

impl PgBackend {
    /// Wakes waiters for the spendable tokens of an added batch.
    fn signal_added(&self, batch: &BTreeMap<&TokenId, &NewToken>) {
        let keys: BTreeSet<WakeKey> = batch
            .values()
            .filter(|t| t.spendable)
            .map(|t| WakeKey::tokens(&t.wallet, &t.token_type))
            .collect();
        self.signal(&keys.into_iter().collect::<Vec<_>>(), None);
    }
}

#[async_trait]
impl TokenStore for PgBackend {
    async fn add_tokens(&self, tokens: &[NewToken]) -> Result<u64, TokenStoreError> {
        // Within the batch: the same id twice must be the same token.
        let mut distinct: BTreeMap<&TokenId, &NewToken> = BTreeMap::new();
        for token in tokens {
            if let Some(first) = distinct.insert(&token.id, token) {
                if identity(first) != identity(token) {
                    return Err(TokenStoreError::Conflict {
                        token: token.id.to_string(),
                        detail: format!(
                            "named twice in one batch: {} and {}",
                            describe(
                                first.wallet.as_str(),
                                first.token_type.as_str(),
                                &first.quantity.to_string()
                            ),
                            describe(
                                token.wallet.as_str(),
                                token.token_type.as_str(),
                                &token.quantity.to_string()
                            ),
                        ),
                    });
                }
            }
        }
        if distinct.is_empty() {
            return Ok(0);
        }
        let (txs, idxs) = codec::token_arrays(distinct.keys().copied());
        let wallets: Vec<&str> = distinct.values().map(|t| t.wallet.as_str()).collect();
        let types: Vec<&str> = distinct.values().map(|t| t.token_type.as_str()).collect();
        let amounts: Vec<String> = distinct.values().map(|t| t.quantity.to_string()).collect();
        let spendable: Vec<bool> = distinct.values().map(|t| t.spendable).collect();
        // Under the pairs' balance locks, the insert and (when they are
        // exclusive) the check of the totals it joins are one statement: nothing
        // is written unless every total fits.
        let mut tx = Tx::begin(self.sessions()).await.map_err(|e| fault(&e))?;
        let exclusive: bool = self
            .note(
                sqlx::query_scalar(LOCK_BALANCES)
                    .bind(&wallets)
                    .bind(&types)
                    .bind(&amounts)
                    .fetch_one(tx.conn())
                    .await,
            )
            .map_err(|e| fault(&e))?;
        let answered = self
            .note(
                sqlx::query(INSERT_TOKENS)
                    .bind(&txs)
                    .bind(&idxs)
                    .bind(&wallets)
                    .bind(&types)
                    .bind(&amounts)
                    .bind(&spendable)
                    .bind(exclusive)
                    .fetch_all(tx.conn())
                    .await,
            )
            .map_err(|e| fault(&e))?;
        let mut inserted = 0usize;
        let mut overflow = None;
        for row in &answered {
            match get::<String>(row, 0)?.as_str() {
                "new" => inserted += 1,
                _ => overflow = overflow.or(Some(get::<String>(row, 1)?)),
            }
        }
        let added = u64::try_from(inserted).unwrap_or(u64::MAX);
        if inserted < distinct.len() {
            // Some ids existed: each must be the same token, else nothing is written.
            let stored = self
                .note(
                    sqlx::query(STORED_IDENTITIES)
                        .bind(&txs)
                        .bind(&idxs)
                        .fetch_all(tx.conn())
                        .await,
                )
                .map_err(|e| fault(&e))?;
            for row in &stored {
                let id = codec::token_id(get(row, 0)?, get(row, 1)?)?;
                let (wallet, token_type, amount): (String, String, String) =
                    (get(row, 2)?, get(row, 3)?, get(row, 4)?);
                let Some(given) = distinct.get(&id) else {
                    continue;
                };
                let same = wallet == given.wallet.as_str()
                    && token_type == given.token_type.as_str()
                    && codec::quantity(&amount)? == given.quantity;
                if !same {
                    let _ = tx.rollback(self.sessions()).await;
                    return Err(TokenStoreError::Conflict {
                        token: id.to_string(),
                        detail: format!(
                            "stored {}; given {}",
                            describe(&wallet, &token_type, &amount),
                            describe(
                                given.wallet.as_str(),
                                given.token_type.as_str(),
                                &given.quantity.to_string()
                            ),
                        ),
                    });
                }
            }
        }
        if let Some(pair) = overflow {
            let _ = tx.rollback(self.sessions()).await;
            let (wallet, token_type) = overflowing_pair(&pair)?;
            return Err(TokenStoreError::BalanceOverflow { wallet, token_type });
        }
        tx.commit(self.sessions()).await.map_err(|e| fault(&e))?;
        if added > 0 {
            self.signal_added(&distinct);
        }
        Ok(added)
    }

    async fn set_spendable(
        &self,
        token: &TokenId,
        spendable: bool,
    ) -> Result<bool, TokenStoreError> {
        let key = self
            .retried(|| {
                sqlx::query_scalar::<_, String>(SET_SPENDABLE)
                    .bind(token.tx.as_str())
                    .bind(i64::from(token.index))
                    .bind(spendable)
                    .fetch_optional(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        if spendable {
            self.signal(&token_keys(key.as_slice()), None);
        }
        Ok(key.is_some())
    }

    async fn candidates(&self, query: &CandidateQuery) -> Result<Vec<Candidate>, TokenStoreError> {
        let read = CandidateRead::Page(query.clone());
        Ok(self.read_on(None, &read).await?)
    }

    async fn candidate_bands(&self, query: &BandQuery) -> Result<Vec<Candidate>, TokenStoreError> {
        let read = CandidateRead::Bands(query.clone());
        Ok(self.read_on(None, &read).await?)
    }

    async fn balance(
        &self,
        wallet: &WalletId,
        token_type: &TokenType,
    ) -> Result<Quantity, TokenStoreError> {
        self.sum_unspent(wallet, token_type, None).await
    }

    async fn balance_for(
        &self,
        wallet: &WalletId,
        token_type: &TokenType,
        consumer: &TxId,
    ) -> Result<Quantity, TokenStoreError> {
        self.sum_unspent(wallet, token_type, Some(consumer)).await
    }

    async fn list_tokens(
        &self,
        wallet: &WalletId,
        token_type: Option<TokenType>,
        n: usize,
    ) -> Result<Vec<Token>, TokenStoreError> {
        let found = self
            .retried(|| {
                list_statement(wallet, token_type.as_ref(), n, false).fetch_all(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        found
            .iter()
            .map(decode_token)
            .collect::<Result<Vec<_>, _>>()
            .map_err(TokenStoreError::Fault)
    }

    async fn token(&self, id: &TokenId) -> Result<Option<Token>, TokenStoreError> {
        let found = self
            .retried(|| {
                sqlx::query(SELECT_TOKEN)
                    .bind(id.tx.as_str())
                    .bind(i64::from(id.index))
                    .fetch_optional(self.pool())
            })
            .await
            .map_err(|e| fault(&e))?;
        found
            .as_ref()
            .map(decode_token)
            .transpose()
            .map_err(TokenStoreError::Fault)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `holdfast_confirm`, `holdfast_confirm_with_change` (0010, over the
    /// outputs with their change) and `add_tokens` take the balance locks
    /// through the one function `holdfast_lock_balances`, shared and exclusive
    /// on the same keys in the same order, in [`BALANCE_SPACE`] (as their
    /// newest definitions, 0009 and 0010, do).
    #[test]
    fn confirm_takes_the_balance_locks_of_add_tokens() {
        let with_change = include_str!("../migrations/0010_confirm_with_change.sql");
        assert!(
            with_change
                .contains("IF holdfast_lock_balances(all_wallets, all_types, all_amounts) THEN"),
            "the confirm with change locks otherwise"
        );
        assert!(!with_change.contains("FUNCTION holdfast_lock_balances"));
        let migration = include_str!("../migrations/0009_lean_confirm.sql");
        assert!(LOCK_BALANCES.contains("holdfast_lock_balances("));
        let body = |name: &str| {
            let head = format!("CREATE OR REPLACE FUNCTION {name}(");
            let at = migration.find(&head).unwrap_or_else(|| panic!("no {head}"));
            let end = at + migration[at..].find("\n$$;").expect("the body ends");
            &migration[at..end]
        };
        let call = "IF holdfast_lock_balances(p_wallets, p_types, p_amounts) THEN";
        assert!(
            body("holdfast_confirm").contains(call),
            "the confirm locks otherwise"
        );
        let locking = body("holdfast_lock_balances");
        let keys = "FROM (SELECT DISTINCT hashtext(w || E'\\t' || t) AS k
                      FROM unnest(p_wallets, p_types) AS i(w, t)) AS p
                ORDER BY p.k;";
        for lock in ["pg_advisory_xact_lock_shared", "pg_advisory_xact_lock"] {
            let taken = format!("PERFORM {lock}({BALANCE_SPACE}, p.k)");
            let at = locking.find(&taken).unwrap_or_else(|| panic!("no {taken}"));
            let tail = locking[at + taken.len()..].trim_start();
            let normal = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(
                normal(tail).starts_with(&normal(keys)),
                "{lock}: other keys or order"
            );
        }
    }
}
