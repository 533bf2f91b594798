//! The token store over SQLite.

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use holdfast_domain::{Candidate, Quantity, Token, TokenId, TokenType, TxId, WalletId};
use holdfast_ports::{
    BandQuery, CandidateQuery, CandidateRead, LockStoreError, NewToken, Output, StoreFault,
    TokenStore, TokenStoreError, WakeKey, WakeUps,
};
use rusqlite::{OptionalExtension, params};

use crate::SqliteBackend;
use crate::codec::{amount_from_sql, corrupt, time_from_sql, token_from_sql, tx_from_sql};
use crate::pool::Db;
use crate::wake::token_keys;

/// What makes a token of wallet `?1` and type `?2` spendable, written once:
/// exactly the rows the partial index `tokens_candidates` holds, in (wallet, type,
/// amount, tx, output) order, so a scan of them needs no sort.
macro_rules! spendable_of_line {
    () => {
        "t.wallet = ?1 AND t.token_type = ?2 AND t.spendable = 1 AND t.spent_by IS NULL"
    };
}

/// A candidate read: the spendable tokens of the line, `$and` conditions on them,
/// and (last) the anti-join on `locks` that drops the locked ones; then `$tail`
/// (order and limit). Every candidate page and band is this one text.
macro_rules! candidates {
    ($($and:literal),*; $tail:literal) => {
        concat!(
            "SELECT t.tx, t.output, t.amount FROM tokens AS t\nWHERE ",
            spendable_of_line!(),
            "\n",
            $("  AND ", $and, "\n",)*
            "  AND NOT EXISTS (SELECT 1 FROM locks AS l WHERE l.tx = t.tx AND l.output = t.output)\n",
            $tail
        )
    };
}

/// The first page of candidates, smallest first.
pub(crate) const CANDIDATES_FIRST: &str =
    candidates!(; "ORDER BY t.amount, t.tx, t.output\nLIMIT +?3");

/// A later page: strictly after the keyset cursor (amount, tx, output).
pub(crate) const CANDIDATES_AFTER: &str = candidates!(
    "(t.amount, t.tx, t.output) > (?4, ?5, ?6)";
    "ORDER BY t.amount, t.tx, t.output\nLIMIT +?3"
);

/// The cover band of a band read: candidates >= the threshold, ascending (the
/// same index scan as a candidate page, started at the threshold).
pub(crate) const COVER_BAND: &str = candidates!(
    "t.amount >= ?3";
    "ORDER BY t.amount, t.tx, t.output\nLIMIT +?4"
);

/// The fill band: candidates below the threshold, largest first (the candidate
/// index scanned backwards).
pub(crate) const FILL_BAND: &str = candidates!(
    "t.amount < ?3";
    "ORDER BY t.amount DESC, t.tx DESC, t.output DESC\nLIMIT +?4"
);

/// A further fill page: strictly before the keyset cursor (amount, tx, output).
pub(crate) const FILL_BAND_BEFORE: &str = candidates!(
    "t.amount < ?3 AND (t.amount, t.tx, t.output) < (?5, ?6, ?7)";
    "ORDER BY t.amount DESC, t.tx DESC, t.output DESC\nLIMIT +?4"
);

/// Amounts below 2^63 are small: a table holds at most 2^64 rows (one per 64-bit
/// rowid), so any number of small amounts sums below 2^127, and adding at most
/// [`ROOM_ABOVE_SMALL`] to such a sum cannot pass 2^128 - 1.
const SMALL: u128 = 1 << 63;
/// See [`SMALL`].
const ROOM_ABOVE_SMALL: u128 = 1 << 127;

/// The largest spendable, unspent amount of a wallet and type: one search of the
/// `tokens_candidates` index (its range ends with it).
const TOP_SPENDABLE: &str = concat!(
    "SELECT t.tx, t.output, t.amount FROM tokens AS t\nWHERE ",
    spendable_of_line!(),
    "\nORDER BY t.amount DESC LIMIT 1"
);

/// The spendable, unspent amounts of a wallet and type, from the covering
/// `tokens_candidates` index.
const SPENDABLE_AMOUNTS: &str = concat!(
    "SELECT t.tx, t.output, t.amount FROM tokens AS t\nWHERE ",
    spendable_of_line!()
);

/// The unspendable, unspent amounts of a wallet and type. No index holds these
/// rows: this is a scan of `tokens`, the cost of the overflow check that grows
/// with the table rather than with the wallet.
const UNSPENDABLE_AMOUNTS: &str = "\
SELECT t.tx, t.output, t.amount FROM tokens AS t
WHERE t.wallet = ?1 AND t.token_type = ?2 AND t.spendable = 0 AND t.spent_by IS NULL";

/// The amount of a row (tx, output, amount), parsed in place; the row is named
/// (allocated) only when corrupt.
fn amount_of(r: &rusqlite::Row<'_>) -> Result<Quantity, StoreFault> {
    if let Ok(Ok(amount)) = r.get_ref(2).db()?.as_str().map(Quantity::from_storage) {
        return Ok(amount);
    }
    let (txid, output, text): (String, i64, String) =
        (r.get(0).db()?, r.get(1).db()?, r.get(2).db()?);
    amount_from_sql(&format!("tokens row {txid}:{output}"), &text)
}

/// `total` plus the amounts `stmt` (columns tx, output, amount) reads for
/// `wallet` and `token_type`; `None` when that exceeds 2^128 - 1.
fn plus_amounts(
    stmt: &mut rusqlite::CachedStatement<'_>,
    wallet: &WalletId,
    token_type: &TokenType,
    mut total: Quantity,
) -> Result<Option<Quantity>, StoreFault> {
    let mut rows = stmt
        .query(params![wallet.as_str(), token_type.as_str()])
        .db()?;
    while let Some(r) = rows.next().db()? {
        match total.checked_add(amount_of(r)?) {
            Some(sum) => total = sum,
            None => return Ok(None),
        }
    }
    Ok(Some(total))
}

/// The first wallet and type, in (wallet, type) order, whose unspent tokens
/// (spendable or not, as the caller's transaction sees them) together with what
/// `adding` brings it would exceed 2^128 - 1; `None` when every total fits.
/// Only the wallets and types named in `adding` are read. Called inside the
/// writing transaction, after its own writes or with them as `adding`, so the
/// write and the check are one atomic step (writers are serialized by
/// `BEGIN IMMEDIATE`).
///
/// Per pair: what `adding` brings plus the unspendable tokens, summed exactly
/// (a scan of the table); then the spendable ones, which are only summed (from
/// the index) unless their largest is small and that sum is at most 2^127, when
/// they cannot make the total pass 2^128 - 1 (see [`SMALL`]).
pub(crate) fn first_overflow<'a>(
    tx: &rusqlite::Transaction<'_>,
    adding: impl IntoIterator<Item = (&'a WalletId, &'a TokenType, Quantity)>,
) -> Result<Option<(WalletId, TokenType)>, StoreFault> {
    // None: what the call adds to the pair does not fit 128 bits by itself.
    let mut added: BTreeMap<(&WalletId, &TokenType), Option<Quantity>> = BTreeMap::new();
    for (wallet, token_type, quantity) in adding {
        let sum = added
            .entry((wallet, token_type))
            .or_insert(Some(Quantity::ZERO));
        *sum = sum.and_then(|s| s.checked_add(quantity));
    }
    let mut unspendable = tx.prepare_cached(UNSPENDABLE_AMOUNTS).db()?;
    let mut top = tx.prepare_cached(TOP_SPENDABLE).db()?;
    let mut spendable = tx.prepare_cached(SPENDABLE_AMOUNTS).db()?;
    for ((wallet, token_type), sum) in added {
        let overflow = Ok(Some((wallet.clone(), token_type.clone())));
        let Some(sum) = sum else {
            return overflow;
        };
        let Some(base) = plus_amounts(&mut unspendable, wallet, token_type, sum)? else {
            return overflow;
        };
        let largest = top
            .query_row(params![wallet.as_str(), token_type.as_str()], |r| {
                Ok(amount_of(r))
            })
            .optional()
            .db()?
            .transpose()?
            .unwrap_or(Quantity::ZERO);
        if largest.value() < SMALL && base.value() <= ROOM_ABOVE_SMALL {
            continue;
        }
        if plus_amounts(&mut spendable, wallet, token_type, base)?.is_none() {
            return overflow;
        }
    }
    Ok(None)
}

/// Refuses a confirm's `outputs` ([`LockStoreError::BadOutputs`], naming the wallet
/// and type) when one would lift its wallet's unspent total beyond 2^128 - 1;
/// called in the confirm's transaction once its inputs are spent, before the
/// outputs are inserted.
pub(crate) fn refuse_overflowing_outputs(
    tx: &rusqlite::Transaction<'_>,
    outputs: &[Output],
) -> Result<(), LockStoreError> {
    let adding = outputs
        .iter()
        .map(|o| (&o.wallet, &o.token_type, o.quantity));
    match first_overflow(tx, adding)? {
        None => Ok(()),
        Some((wallet, token_type)) => Err(LockStoreError::BadOutputs {
            detail: TokenStoreError::BalanceOverflow { wallet, token_type }.to_string(),
        }),
    }
}

pub(crate) const TOKEN_COLUMNS: &str =
    "tx, output, wallet, token_type, amount, spendable, spent_by, spent_at";

/// The unspent tokens of wallet `?1` (`of_type` adds the type `?2`), spendable or
/// not, in (amount, tx, output) order, at most `?3`: the wallet's ranges of the
/// two partial indexes that hold unspent rows (`tokens_candidates` and
/// `tokens_unspendable`), merged. One condition `spent_by IS NULL` matches
/// neither index, so it read the whole table.
fn list_tokens_sql(of_type: &str) -> String {
    let range = |spendable: u8| {
        format!(
            "SELECT * FROM (SELECT {TOKEN_COLUMNS} FROM tokens
                            WHERE wallet = ?1{of_type} AND spendable = {spendable}
                              AND spent_by IS NULL
                            ORDER BY amount, tx, output LIMIT +?3)"
        )
    };
    format!(
        "{} UNION ALL {} ORDER BY amount, tx, output LIMIT +?3",
        range(1),
        range(0)
    )
}

fn limit_to_sql(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Runs a candidate read (columns tx, output, amount) and appends its rows.
fn read_candidates(
    tx: &rusqlite::Transaction<'_>,
    sql: &str,
    params: impl rusqlite::Params,
    out: &mut Vec<Candidate>,
) -> Result<(), StoreFault> {
    let mut stmt = tx.prepare_cached(sql).db()?;
    let mut rows = stmt.query(params).db()?;
    while let Some(r) = rows.next().db()? {
        let txid: String = r.get(0).db()?;
        let output: i64 = r.get(1).db()?;
        let amount: String = r.get(2).db()?;
        let row = format!("tokens row {txid}:{output}");
        out.push(Candidate {
            id: token_from_sql(&row, txid, output)?,
            quantity: amount_from_sql(&row, &amount)?,
        });
    }
    Ok(())
}

/// Reads the candidates `read` asks for inside the caller's transaction: a
/// candidate page, or a band read (cover band on a first read, then the fill
/// band or its next page).
pub(crate) fn read_page(
    tx: &rusqlite::Transaction<'_>,
    read: &CandidateRead,
) -> Result<Vec<Candidate>, StoreFault> {
    let mut out = Vec::new();
    match read {
        CandidateRead::Page(query) => {
            let limit = limit_to_sql(query.limit);
            let (wallet, token_type) = (query.wallet.as_str(), query.token_type.as_str());
            match &query.after {
                _ if limit == 0 => {}
                None => read_candidates(
                    tx,
                    CANDIDATES_FIRST,
                    params![wallet, token_type, limit],
                    &mut out,
                )?,
                Some(after) => read_candidates(
                    tx,
                    CANDIDATES_AFTER,
                    params![
                        wallet,
                        token_type,
                        limit,
                        after.quantity.to_storage(),
                        after.id.tx.as_str(),
                        after.id.index
                    ],
                    &mut out,
                )?,
            }
        }
        CandidateRead::Bands(query) => {
            let (wallet, token_type) = (query.wallet.as_str(), query.token_type.as_str());
            let threshold = query.threshold.to_storage();
            let (cover, fill) = (limit_to_sql(query.cover), limit_to_sql(query.fill));
            if cover > 0 && query.fill_before.is_none() {
                let params = params![wallet, token_type, threshold, cover];
                read_candidates(tx, COVER_BAND, params, &mut out)?;
            }
            // The cover band alone when its smallest candidate will be the
            // single cover chosen (see `BandQuery::fill_unless_cover_at_most`).
            let single_cover = query.bands().skips_fill(out.first());
            match (&query.fill_before, fill) {
                (_, 0) => {}
                _ if single_cover => {}
                (None, _) => {
                    let params = params![wallet, token_type, threshold, fill];
                    read_candidates(tx, FILL_BAND, params, &mut out)?;
                }
                (Some(cursor), _) => {
                    let params = params![
                        wallet,
                        token_type,
                        threshold,
                        fill,
                        cursor.quantity.to_storage(),
                        cursor.id.tx.as_str(),
                        cursor.id.index
                    ];
                    read_candidates(tx, FILL_BAND_BEFORE, params, &mut out)?;
                }
            }
        }
    }
    Ok(out)
}

pub(crate) fn token_row(r: &rusqlite::Row<'_>) -> Result<Token, StoreFault> {
    let tx: String = r.get(0).db()?;
    let output: i64 = r.get(1).db()?;
    let row = format!("tokens row {tx}:{output}");
    let id = token_from_sql(&row, tx, output)?;
    let wallet: String = r.get(2).db()?;
    let token_type: String = r.get(3).db()?;
    let amount: String = r.get(4).db()?;
    let spendable: i64 = r.get(5).db()?;
    let spent_by: Option<String> = r.get(6).db()?;
    let spent_at: Option<String> = r.get(7).db()?;
    Ok(Token {
        id,
        wallet: WalletId::new(wallet).map_err(|e| corrupt(&row, e))?,
        token_type: TokenType::new(token_type).map_err(|e| corrupt(&row, e))?,
        quantity: amount_from_sql(&row, &amount)?,
        spendable: spendable != 0,
        spent_by: spent_by.map(|s| tx_from_sql(&row, s)).transpose()?,
        spent_at: spent_at.map(|s| time_from_sql(&row, &s)).transpose()?,
    })
}

impl SqliteBackend {
    /// The spendable, unspent tokens of the wallet and type, locks ignored, less
    /// those `consumer` (if any) has selected.
    async fn sum_unspent(
        &self,
        wallet: &WalletId,
        token_type: &TokenType,
        consumer: Option<&TxId>,
    ) -> Result<Quantity, TokenStoreError> {
        let (wallet, token_type) = (wallet.clone(), token_type.clone());
        let consumer = consumer.map(|c| c.as_str().to_owned());
        self.pool
            .read(move |tx| {
                // Amounts are 128-bit hex text, which SQL cannot sum; the rows are
                // streamed from the covering candidate index and summed with checks.
                let mut stmt = tx
                    .prepare_cached(concat!(
                        "SELECT t.tx, t.output, t.amount FROM tokens AS t WHERE ",
                        spendable_of_line!(),
                        " AND (?3 IS NULL OR NOT EXISTS (
                                SELECT 1 FROM selections AS s
                                WHERE s.consumer = ?3 AND s.tx = t.tx AND s.output = t.output))"
                    ))
                    .db()?;
                let mut rows = stmt
                    .query(params![wallet.as_str(), token_type.as_str(), consumer])
                    .db()?;
                let mut total = Quantity::ZERO;
                while let Some(r) = rows.next().db()? {
                    let txid: String = r.get(0).db()?;
                    let output: i64 = r.get(1).db()?;
                    let amount: String = r.get(2).db()?;
                    let row = format!("tokens row {txid}:{output}");
                    let q = amount_from_sql(&row, &amount)?;
                    total = total.checked_add(q).ok_or_else(|| {
                        StoreFault::Corrupt(format!(
                            "the balance of wallet {wallet} type {token_type} exceeds 128 bits"
                        ))
                    })?;
                }
                Ok(total)
            })
            .await
    }
}

#[async_trait]
impl TokenStore for SqliteBackend {
    async fn add_tokens(&self, tokens: &[NewToken]) -> Result<u64, TokenStoreError> {
        if tokens.is_empty() {
            return Ok(0);
        }
        let keys: Vec<WakeKey> = tokens
            .iter()
            .filter(|t| t.spendable)
            .map(|t| WakeKey::tokens(&t.wallet, &t.token_type))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let tokens = tokens.to_vec();
        let added = self
            .pool
            .write(move |tx| {
                let mut insert = tx
                    .prepare_cached(
                        "INSERT INTO tokens (tx, output, wallet, token_type, amount, spendable)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (tx, output) DO NOTHING",
                    )
                    .db()?;
                let mut existing = tx
                    .prepare_cached(
                        "SELECT wallet, token_type, amount FROM tokens WHERE tx = ?1 AND output = ?2",
                    )
                    .db()?;
                let mut added = 0u64;
                let mut inserted = Vec::new();
                for t in &tokens {
                    let amount = t.quantity.to_storage();
                    let n = insert
                        .execute(params![
                            t.id.tx.as_str(),
                            t.id.index,
                            t.wallet.as_str(),
                            t.token_type.as_str(),
                            amount,
                            t.spendable
                        ])
                        .db()?;
                    if n == 1 {
                        added += 1;
                        inserted.push((&t.wallet, &t.token_type, Quantity::ZERO));
                        continue;
                    }
                    let (wallet, token_type, stored): (String, String, String) = existing
                        .query_row(params![t.id.tx.as_str(), t.id.index], |r| {
                            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                        })
                        .db()?;
                    let mut diffs = Vec::new();
                    if wallet != t.wallet.as_str() {
                        diffs.push(format!("wallet {wallet:?} stored, {:?} given", t.wallet.as_str()));
                    }
                    if token_type != t.token_type.as_str() {
                        diffs.push(format!(
                            "type {token_type:?} stored, {:?} given",
                            t.token_type.as_str()
                        ));
                    }
                    if stored != amount {
                        let shown = Quantity::from_storage(&stored)
                            .map_or_else(|_| format!("{stored:?}"), |q| q.to_string());
                        diffs.push(format!("amount {shown} stored, {} given", t.quantity));
                    }
                    if !diffs.is_empty() {
                        // Returning Err rolls the whole call back.
                        return Err(TokenStoreError::Conflict {
                            token: t.id.to_string(),
                            detail: diffs.join("; "),
                        });
                    }
                }
                // The new rows are in place: the totals they join must still fit.
                if let Some((wallet, token_type)) = first_overflow(tx, inserted)? {
                    return Err(TokenStoreError::BalanceOverflow { wallet, token_type });
                }
                Ok(added)
            })
            .await?;
        if added > 0 {
            self.signal(&keys, None);
        }
        Ok(added)
    }

    async fn set_spendable(
        &self,
        token: &TokenId,
        spendable: bool,
    ) -> Result<bool, TokenStoreError> {
        let token = token.clone();
        let wanted = spendable && self.wake.wanted();
        let (changed, keys) = self
            .pool
            .write(move |tx| {
                let n = tx
                    .prepare_cached(
                        "UPDATE tokens SET spendable = ?3
                         WHERE tx = ?1 AND output = ?2 AND spent_by IS NULL",
                    )
                    .db()?
                    .execute(params![token.tx.as_str(), token.index, spendable])
                    .db()?;
                let keys = if n == 1 && wanted {
                    token_keys(tx, [&token])?
                } else {
                    Vec::new()
                };
                Ok::<_, TokenStoreError>((n == 1, keys))
            })
            .await?;
        self.signal(&keys, None);
        Ok(changed)
    }

    async fn candidates(&self, query: &CandidateQuery) -> Result<Vec<Candidate>, TokenStoreError> {
        if query.limit == 0 {
            return Ok(Vec::new());
        }
        let read = CandidateRead::Page(query.clone());
        self.pool.read(move |tx| Ok(read_page(tx, &read)?)).await
    }

    async fn candidate_bands(&self, query: &BandQuery) -> Result<Vec<Candidate>, TokenStoreError> {
        let read = CandidateRead::Bands(query.clone());
        self.pool.read(move |tx| Ok(read_page(tx, &read)?)).await
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
        limit: usize,
    ) -> Result<Vec<Token>, TokenStoreError> {
        let wallet = wallet.clone();
        self.pool
            .read(move |tx| {
                let of_type = if token_type.is_some() {
                    " AND token_type = ?2"
                } else {
                    ""
                };
                let mut stmt = tx.prepare_cached(&list_tokens_sql(of_type)).db()?;
                let mut rows = stmt
                    .query(params![
                        wallet.as_str(),
                        token_type.as_ref().map(TokenType::as_str),
                        limit_to_sql(limit)
                    ])
                    .db()?;
                let mut out = Vec::new();
                while let Some(r) = rows.next().db()? {
                    out.push(token_row(r)?);
                }
                Ok(out)
            })
            .await
    }

    async fn token(&self, id: &TokenId) -> Result<Option<Token>, TokenStoreError> {
        let id = id.clone();
        self.pool
            .read(move |tx| {
                let sql =
                    format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE tx = ?1 AND output = ?2");
                let mut stmt = tx.prepare_cached(&sql).db()?;
                let raw = stmt
                    .query_row(params![id.tx.as_str(), id.index], |r| Ok(token_row(r)))
                    .optional()
                    .db()?;
                Ok(raw.transpose()?)
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::types::Value;

    use super::*;

    /// An in-memory database with every migration applied.
    fn migrated() -> rusqlite::Connection {
        let conn = rusqlite::Connection::open_in_memory().expect("in-memory database");
        for m in crate::MIGRATIONS {
            conn.execute_batch(m.sql).expect("migration");
        }
        conn
    }

    /// Values for a candidate read of `count` parameters: wallet `wallet` of
    /// CHF, `limit` candidates, keyset cursors of amount `cursor` (and the
    /// threshold of a band read too).
    fn bindings(count: usize, wallet: &str, cursor: i64, limit: i64) -> Vec<Value> {
        let (wallet, chf) = (
            Value::Text(wallet.to_owned()),
            Value::Text("CHF".to_owned()),
        );
        let (at, limit) = (Value::Text(format!("{cursor:032x}")), Value::Integer(limit));
        let key = [at.clone(), Value::Text("tx".to_owned()), Value::Integer(0)];
        match count {
            3 => vec![wallet, chf, limit],
            4 => vec![wallet, chf, at, limit],
            6 => [vec![wallet, chf, limit], key.to_vec()].concat(),
            _ => [vec![wallet, chf, at, limit], key.to_vec()].concat(),
        }
    }

    fn plan(sql: &str) -> Vec<String> {
        let conn = migrated();
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("explain");
        let values = bindings(stmt.parameter_count(), "w", 1, 10);
        stmt.query_map(rusqlite::params_from_iter(values), |r| {
            r.get::<_, String>(3)
        })
        .expect("query")
        .collect::<Result<Vec<_>, _>>()
        .expect("rows")
    }

    /// Rows an older version wrote past 2^128 - 1 in one wallet: its balance is a
    /// typed Corrupt fault (no panic), its candidates still read, and adding to
    /// it is refused as an overflow.
    #[tokio::test]
    async fn an_over_full_wallet_written_before_is_a_typed_error() {
        let backend = SqliteBackend::open_in_memory().await.expect("open");
        let max = Quantity::new(u128::MAX, holdfast_domain::Precision::MAX).expect("max");
        backend
            .pool
            .write(move |tx| {
                for tx_id in ["old-a", "old-b"] {
                    tx.execute(
                        "INSERT INTO tokens (tx, output, wallet, token_type, amount, spendable)
                         VALUES (?1, 0, 'w', 'CHF', ?2, 1)",
                        params![tx_id, max.to_storage()],
                    )
                    .db()?;
                }
                Ok::<_, StoreFault>(())
            })
            .await
            .expect("rows of an older version");
        let s = backend.stores();
        let (w, chf) = (
            WalletId::new("w").expect("w"),
            TokenType::new("CHF").expect("t"),
        );
        match s.tokens.balance(&w, &chf).await {
            Err(TokenStoreError::Fault(StoreFault::Corrupt(msg))) => {
                assert!(msg.contains("wallet w type CHF"), "{msg}");
            }
            other => panic!("expected a Corrupt fault, got {other:?}"),
        }
        let page = CandidateQuery {
            wallet: w.clone(),
            token_type: chf.clone(),
            after: None,
            limit: 10,
        };
        assert_eq!(s.tokens.candidates(&page).await.map(|c| c.len()), Ok(2));
        let one = NewToken {
            id: TokenId::new(TxId::new("new").expect("tx"), 0),
            wallet: w.clone(),
            token_type: chf.clone(),
            quantity: Quantity::new(1, holdfast_domain::Precision::MAX).expect("1"),
            spendable: true,
        };
        assert_eq!(
            s.tokens.add_tokens(&[one]).await,
            Err(TokenStoreError::BalanceOverflow {
                wallet: w,
                token_type: chf
            })
        );
    }

    /// The overflow check reads the spendable rows through the candidate index,
    /// the largest with one search, no sort (the unspendable ones, having no
    /// index, cost a scan of the table).
    #[test]
    fn the_overflow_check_reads_spendable_rows_through_the_candidate_index() {
        let conn = migrated();
        for sql in [TOP_SPENDABLE, SPENDABLE_AMOUNTS] {
            let mut stmt = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .expect("explain");
            let steps: Vec<String> = stmt
                .query_map(params!["w", "CHF"], |r| r.get::<_, String>(3))
                .expect("query")
                .collect::<Result<_, _>>()
                .expect("rows");
            let text = steps.join("\n");
            assert!(
                text.contains("INDEX tokens_candidates (wallet=? AND token_type=?)"),
                "{sql}\n--\n{text}"
            );
            assert!(!text.contains("TEMP B-TREE"), "sorts:\n{text}");
        }
    }

    /// A cached candidate read is prepared once: executed again with other
    /// bindings (as every select does), SQLite does not prepare it anew.
    #[test]
    fn candidate_queries_are_not_prepared_again_for_new_bindings() {
        let conn = migrated();
        for sql in [
            COVER_BAND,
            FILL_BAND,
            CANDIDATES_FIRST,
            CANDIDATES_AFTER,
            FILL_BAND_BEFORE,
        ] {
            for i in 1..=20 {
                let mut stmt = conn.prepare_cached(sql).expect("prepare");
                let values = bindings(stmt.parameter_count(), &format!("w{i}"), i, i);
                let mut rows = stmt
                    .query(rusqlite::params_from_iter(values))
                    .expect("query");
                assert!(rows.next().expect("step").is_none());
            }
            let stmt = conn.prepare_cached(sql).expect("prepare");
            let again = stmt.get_status(rusqlite::StatementStatus::RePrepare);
            assert_eq!(again, 0, "prepared again {again} times:\n{sql}");
        }
    }

    #[test]
    fn candidate_queries_scan_the_partial_index_without_sorting() {
        for sql in [
            CANDIDATES_FIRST,
            CANDIDATES_AFTER,
            COVER_BAND,
            FILL_BAND,
            FILL_BAND_BEFORE,
        ] {
            let steps = plan(sql);
            let text = steps.join("\n");
            assert!(
                steps.iter().any(|s| s.starts_with("SEARCH t USING")
                    && s.contains("INDEX tokens_candidates (wallet=? AND token_type=?")),
                "{sql}\n--\n{text}"
            );
            assert!(!text.contains("TEMP B-TREE"), "sorts:\n{text}");
            assert!(
                steps
                    .iter()
                    .any(|s| s.starts_with("SEARCH l USING") && s.contains("(tx=? AND output=?)")),
                "the anti-join probes the locks primary key:\n{text}"
            );
        }
    }

    #[test]
    fn listings_search_the_two_indexes_of_unspent_rows() {
        for of_type in ["", " AND token_type = ?2"] {
            let sql = list_tokens_sql(of_type);
            let text = plan(&sql).join("\n");
            for index in ["tokens_candidates", "tokens_unspendable"] {
                assert!(
                    text.contains(&format!("SEARCH tokens USING INDEX {index} (wallet=?")),
                    "{sql}\n--\n{text}"
                );
            }
            assert!(!text.contains("SCAN tokens"), "{sql}\n--\n{text}");
        }
    }
}
