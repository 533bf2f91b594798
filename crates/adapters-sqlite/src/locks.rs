//! The lock store over SQLite.

use std::collections::BTreeSet;

use async_trait::async_trait;
use holdfast_domain::{
    ClaimVerdict, Imbalance, Quantity, SweepRule, Timestamp, Token, TokenId, TokenType, TxId,
    TxStatus, unconserved,
};
use holdfast_ports::{
    CandidateRead, Chooser, Confirmation, LockInfo, LockStore, LockStoreError, Output,
    ReadAndClaim, ReadWithClaim, StoreFault, SweepReport, Unconserved, WakeKey, WakeUps,
    check_outputs, check_window,
};
use rusqlite::types::Value;
use rusqlite::{OptionalExtension, Transaction, params};

use crate::SqliteBackend;
use crate::codec::{
    amount_from_sql, corrupt, status_from_sql, time_from_sql, time_to_sql, token_from_sql,
    tx_from_sql,
};
use crate::pool::Db;
use crate::statuses::record_in;
use crate::tokens::{TOKEN_COLUMNS, read_page, token_row};
use crate::wake::{consumer_keys, token_keys};

/// Claims each token in order inside the caller's IMMEDIATE transaction: stale when
/// the token is missing, spent or not spendable; otherwise the lock insert decides
/// won (row written, and the token recorded as selected by `consumer`) or
/// contended (a row exists, whoever holds it, or `consumer` already selected the
/// token in an earlier select whose lock the sweep took).
fn claim_in(
    tx: &Transaction<'_>,
    consumer: &TxId,
    tokens: &[TokenId],
    created_at: &str,
    owner: &str,
) -> Result<Vec<(TokenId, ClaimVerdict)>, StoreFault> {
    let mut state = tx
        .prepare_cached(
            "SELECT spendable = 1 AND spent_by IS NULL FROM tokens WHERE tx = ?1 AND output = ?2",
        )
        .db()?;
    let mut insert = tx
        .prepare_cached(
            "INSERT INTO locks (tx, output, consumer, created_at, owner)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (tx, output) DO NOTHING",
        )
        .db()?;
    let mut selected = tx
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM selections WHERE consumer = ?1 AND tx = ?2 AND output = ?3)",
        )
        .db()?;
    let mut select = tx
        .prepare_cached(
            "INSERT INTO selections (consumer, tx, output, owner, selected_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .db()?;
    // A confirmed transaction is final: it wins nothing more (a select of it still
    // running after its confirm would leave a selection no confirm accounts for).
    let confirmed: bool = tx
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM tx_statuses WHERE tx = ?1 AND status = 'confirmed')",
        )
        .db()?
        .query_row([consumer.as_str()], |r| r.get(0))
        .db()?;
    let mut out = Vec::with_capacity(tokens.len());
    for token in tokens {
        let claimable: Option<bool> = state
            .query_row(params![token.tx.as_str(), token.index], |r| r.get(0))
            .optional()
            .db()?;
        let key = params![consumer.as_str(), token.tx.as_str(), token.index];
        let verdict = if claimable != Some(true) {
            ClaimVerdict::Stale
        } else if confirmed {
            ClaimVerdict::Contended
        } else if selected.query_row(key, |r| r.get::<_, bool>(0)).db()? {
            // Already selected by this consumer (its lock swept meanwhile): an
            // earlier select of the transaction has it, this one may not.
            ClaimVerdict::Contended
        } else {
            let n = insert
                .execute(params![
                    token.tx.as_str(),
                    token.index,
                    consumer.as_str(),
                    created_at,
                    owner
                ])
                .db()?;
            if n == 1 {
                select
                    .execute(params![
                        consumer.as_str(),
                        token.tx.as_str(),
                        token.index,
                        owner,
                        created_at
                    ])
                    .db()?;
                ClaimVerdict::Won
            } else {
                ClaimVerdict::Contended
            }
        };
        out.push((token.clone(), verdict));
    }
    Ok(out)
}

/// Releases every lock of `consumer` and forgets its selections; returns the locks
/// released.
fn forget_consumer(tx: &Transaction<'_>, consumer: &TxId) -> Result<u64, StoreFault> {
    let n = tx
        .prepare_cached("DELETE FROM locks WHERE consumer = ?1")
        .db()?
        .execute([consumer.as_str()])
        .db()?;
    tx.prepare_cached("DELETE FROM selections WHERE consumer = ?1")
        .db()?
        .execute([consumer.as_str()])
        .db()?;
    Ok(u64::try_from(n).unwrap_or(u64::MAX))
}

/// The first token (in key order) that `consumer` selected and another transaction
/// has spent, with its spender.
fn spent_by_another(
    tx: &Transaction<'_>,
    consumer: &TxId,
) -> Result<Option<(TokenId, TxId)>, StoreFault> {
    let found: Option<(String, i64, String)> = tx
        .prepare_cached(
            "SELECT t.tx, t.output, t.spent_by FROM selections AS s
             JOIN tokens AS t ON t.tx = s.tx AND t.output = s.output
             WHERE s.consumer = ?1 AND t.spent_by IS NOT NULL AND t.spent_by <> ?1
             ORDER BY t.tx, t.output LIMIT 1",
        )
        .db()?
        .query_row([consumer.as_str()], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()
        .db()?;
    found
        .map(|(txid, output, spent_by)| {
            let row = format!("tokens row {txid}:{output}");
            Ok((
                token_from_sql(&row, txid, output)?,
                tx_from_sql(&row, spent_by)?,
            ))
        })
        .transpose()
}

/// Marks every unspent token `consumer` selected spent by it at `spent_at`;
/// returns them in key order.
fn spend_selected(
    tx: &Transaction<'_>,
    consumer: &TxId,
    spent_at: &str,
) -> Result<Vec<TokenId>, StoreFault> {
    let mut stmt = tx
        .prepare_cached(
            "UPDATE tokens SET spent_by = ?1, spent_at = ?2
             WHERE spent_by IS NULL
               AND (tx, output) IN
                   (SELECT tx, output FROM selections WHERE consumer = ?1)
             RETURNING tx, output",
        )
        .db()?;
    let mut rows = stmt.query(params![consumer.as_str(), spent_at]).db()?;
    let mut spent = Vec::new();
    while let Some(r) = rows.next().db()? {
        let txid: String = r.get(0).db()?;
        let output: i64 = r.get(1).db()?;
        spent.push(token_from_sql(
            &format!("tokens row {txid}:{output}"),
            txid,
            output,
        )?);
    }
    spent.sort();
    Ok(spent)
}

/// The tokens stored under `consumer`'s output ids, in index order: (index,
/// wallet, type, stored amount).
fn stored_outputs(
    tx: &Transaction<'_>,
    consumer: &TxId,
) -> Result<Vec<(i64, String, String, String)>, StoreFault> {
    let mut stmt = tx
        .prepare_cached(
            "SELECT output, wallet, token_type, amount FROM tokens WHERE tx = ?1 ORDER BY output",
        )
        .db()?;
    let mut rows = stmt.query([consumer.as_str()]).db()?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().db()? {
        out.push((
            r.get(0).db()?,
            r.get(1).db()?,
            r.get(2).db()?,
            r.get(3).db()?,
        ));
    }
    Ok(out)
}

/// Whether `stored` are exactly `outputs`, index by index.
fn same_outputs(stored: &[(i64, String, String, String)], outputs: &[Output]) -> bool {
    stored.len() == outputs.len()
        && stored.iter().zip(outputs).zip(0i64..).all(
            |(((i, wallet, token_type, amount), o), n)| {
                *i == n
                    && wallet == o.wallet.as_str()
                    && token_type == o.token_type.as_str()
                    && *amount == o.quantity.to_storage()
            },
        )
}

/// The type and amount of every unspent token `consumer` selected.
fn selected_inputs(
    tx: &Transaction<'_>,
    consumer: &TxId,
) -> Result<Vec<(TokenType, Quantity)>, StoreFault> {
    let mut stmt = tx
        .prepare_cached(
            "SELECT t.tx, t.output, t.token_type, t.amount FROM selections AS s
             JOIN tokens AS t ON t.tx = s.tx AND t.output = s.output
             WHERE s.consumer = ?1 AND t.spent_by IS NULL",
        )
        .db()?;
    let mut rows = stmt.query([consumer.as_str()]).db()?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().db()? {
        let (txid, output): (String, i64) = (r.get(0).db()?, r.get(1).db()?);
        let row = format!("tokens row {txid}:{output}");
        let (token_type, amount): (String, String) = (r.get(2).db()?, r.get(3).db()?);
        out.push((
            TokenType::new(token_type).map_err(|e| corrupt(&row, e))?,
            amount_from_sql(&row, &amount)?,
        ));
    }
    Ok(out)
}

impl SqliteBackend {
    /// The consumers with selections (made by `owner`, if given), and their
    /// recorded statuses, in id order.
    async fn unsettled_of(
        &self,
        owner: Option<String>,
    ) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError> {
        self.pool
            .read(move |tx| {
                let mut stmt = tx
                    .prepare_cached(
                        "SELECT s.consumer, st.status
                         FROM (SELECT DISTINCT consumer FROM selections
                               WHERE ?1 IS NULL OR owner = ?1) AS s
                         LEFT JOIN tx_statuses AS st ON st.tx = s.consumer
                         ORDER BY s.consumer",
                    )
                    .db()?;
                let mut rows = stmt.query([owner]).db()?;
                let mut out = Vec::new();
                while let Some(r) = rows.next().db()? {
                    let consumer: String = r.get(0).db()?;
                    let status: Option<String> = r.get(1).db()?;
                    let row = format!("selections of {consumer}");
                    let status = status.map(|s| status_from_sql(&row, &s)).transpose()?;
                    out.push((tx_from_sql(&row, consumer)?, status));
                }
                Ok::<_, StoreFault>(out)
            })
            .await
            .map_err(LockStoreError::Fault)
    }
}

struct LockRow {
    token: TokenId,
    consumer: TxId,
    created_at: Timestamp,
    status: Option<TxStatus>,
    owner: String,
}

/// How a stored value is shown when naming a row: text as is, numbers as numbers,
/// anything else by type.
fn shown(value: &Value) -> String {
    match value {
        Value::Text(text) => text.clone(),
        Value::Integer(n) => n.to_string(),
        Value::Real(x) => x.to_string(),
        Value::Null => "NULL".to_owned(),
        Value::Blob(bytes) => format!("<{}-byte blob>", bytes.len()),
    }
}

fn text(row: &str, column: &str, value: Value) -> Result<String, StoreFault> {
    match value {
        Value::Text(text) => Ok(text),
        other => Err(corrupt(
            row,
            format!("{column} is {}; expected text", shown(&other)),
        )),
    }
}

/// Decodes one lock row (`tx`, `output`, `consumer`, `created_at`, the consumer's
/// status or NULL); a [`StoreFault::Corrupt`] naming the row if any part is invalid.
fn decode_lock(values: [Value; 6]) -> Result<LockRow, StoreFault> {
    let [txid, output, consumer, created_at, status, owner] = values;
    let row = format!("locks row {}:{}", shown(&txid), shown(&output));
    let txid = text(&row, "tx", txid)?;
    let Value::Integer(output) = output else {
        return Err(corrupt(
            &row,
            format!("output is {}; expected an integer", shown(&output)),
        ));
    };
    let created_at = text(&row, "created_at", created_at)?;
    let status = match status {
        Value::Null => None,
        other => Some(text(&row, "tx_statuses.status", other)?),
    };
    Ok(LockRow {
        token: token_from_sql(&row, txid, output)?,
        consumer: tx_from_sql(&row, text(&row, "consumer", consumer)?)?,
        created_at: time_from_sql(&row, &created_at)?,
        status: status.map(|s| status_from_sql(&row, &s)).transpose()?,
        owner: text(&row, "owner", owner)?,
    })
}

/// Every lock with its consumer's status, each row decoded on its own: the outer
/// error is a failed read, an inner one a row that cannot be decoded (so the sweep
/// can pass over it while the listing reports it).
fn all_locks(tx: &Transaction<'_>) -> Result<Vec<Result<LockRow, StoreFault>>, StoreFault> {
    let mut stmt = tx
        .prepare_cached(
            "SELECT l.tx, l.output, l.consumer, l.created_at, s.status, l.owner
             FROM locks AS l LEFT JOIN tx_statuses AS s ON s.tx = l.consumer",
        )
        .db()?;
    let mut rows = stmt.query([]).db()?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().db()? {
        let values = [
            r.get::<_, Value>(0).db()?,
            r.get::<_, Value>(1).db()?,
            r.get::<_, Value>(2).db()?,
            r.get::<_, Value>(3).db()?,
            r.get::<_, Value>(4).db()?,
            r.get::<_, Value>(5).db()?,
        ];
        out.push(decode_lock(values));
    }
    Ok(out)
}

#[async_trait]
impl LockStore for SqliteBackend {
    async fn claim(
        &self,
        consumer: &TxId,
        token: &TokenId,
        at: Timestamp,
    ) -> Result<ClaimVerdict, LockStoreError> {
        let mut verdicts = self
            .claim_window(consumer, std::slice::from_ref(token), at)
            .await?;
        match verdicts.pop() {
            Some((_, verdict)) => Ok(verdict),
            None => Err(StoreFault::Backend("a one-token claim returned no verdict".into()).into()),
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
        let created_at = time_to_sql(at)?;
        let (consumer, tokens, owner) = (consumer.clone(), tokens.to_vec(), self.owner.clone());
        self.pool
            .write(move |tx| Ok(claim_in(tx, &consumer, &tokens, &created_at, &owner)?))
            .await
    }

    async fn read_and_claim(
        &self,
        consumer: &TxId,
        read: &CandidateRead,
        at: Timestamp,
        choose: Chooser,
    ) -> Result<Option<ReadAndClaim>, LockStoreError> {
        let created_at = time_to_sql(at)?;
        let (consumer, read, owner) = (consumer.clone(), read.clone(), self.owner.clone());
        // The read runs inside the IMMEDIATE transaction of the claim: no other
        // connection can lock a token between them.
        self.pool
            .write(move |tx| {
                let page = read_page(tx, &read)?;
                let tokens = choose(&page);
                check_window(&tokens)?;
                let verdicts = claim_in(tx, &consumer, &tokens, &created_at, &owner)?;
                Ok(Some(ReadAndClaim { page, verdicts }))
            })
            .await
    }

    /// Always: every write holds the file's one write lock anyway, and the read
    /// in it is one more statement of the same round trip.
    fn read_with_claim(&self) -> ReadWithClaim {
        ReadWithClaim::Always
    }

    async fn release_consumer(
        &self,
        consumer: &TxId,
        at: Timestamp,
        record_status: bool,
    ) -> Result<u64, LockStoreError> {
        let recorded_at = time_to_sql(at)?;
        let (origin, wanted) = (consumer.clone(), self.wake.wanted());
        let consumer = consumer.clone();
        let (released, keys) = self
            .pool
            .write(move |tx| {
                if record_status {
                    record_in(tx, &consumer, TxStatus::Deleted, &recorded_at)?;
                }
                let keys = if wanted {
                    consumer_keys(tx, &consumer)?
                } else {
                    Vec::new()
                };
                Ok::<_, LockStoreError>((forget_consumer(tx, &consumer)?, keys))
            })
            .await?;
        self.signal(&keys, Some(&origin));
        Ok(released)
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
        let stamped_at = time_to_sql(at)?;
        let (consumer, tokens) = (consumer.clone(), tokens.to_vec());
        self.pool
            .write(move |tx| {
                let mut stmt = tx
                    .prepare_cached(
                        "UPDATE locks SET created_at = ?4
                         WHERE tx = ?1 AND output = ?2 AND consumer = ?3",
                    )
                    .db()?;
                let mut held = Vec::new();
                for t in tokens.iter().collect::<BTreeSet<_>>() {
                    let n = stmt
                        .execute(params![
                            t.tx.as_str(),
                            t.index,
                            consumer.as_str(),
                            stamped_at
                        ])
                        .db()?;
                    if n == 1 {
                        held.push(t.clone());
                    }
                }
                Ok(held)
            })
            .await
    }

    async fn confirm(
        &self,
        consumer: &TxId,
        outputs: &[Output],
        at: Timestamp,
    ) -> Result<Confirmation, LockStoreError> {
        check_outputs(outputs)?;
        let spent_at = time_to_sql(at)?;
        let (origin, wanted) = (consumer.clone(), self.wake.wanted());
        let (consumer, outputs) = (consumer.clone(), outputs.to_vec());
        let (confirmation, keys) = self
            .pool
            .write(move |tx| {
                let ids: Vec<TokenId> = (0u32..)
                    .zip(&outputs)
                    .map(|(i, _)| TokenId::new(consumer.clone(), i))
                    .collect();
                let status: Option<String> = tx
                    .prepare_cached("SELECT status FROM tx_statuses WHERE tx = ?1")
                    .db()?
                    .query_row([consumer.as_str()], |r| r.get(0))
                    .optional()
                    .db()?;
                let stored = stored_outputs(tx, &consumer)?;
                if status.as_deref() == Some(TxStatus::Confirmed.as_str()) {
                    if !same_outputs(&stored, &outputs) {
                        return Err(LockStoreError::OutputsDiffer {
                            tx: consumer.clone(),
                            detail: format!(
                                "{} output(s) stored, {} given, or not the same ones",
                                stored.len(),
                                outputs.len()
                            ),
                        });
                    }
                    let replay = Confirmation {
                        spent: Vec::new(),
                        outputs: ids,
                        replayed: true,
                    };
                    return Ok((replay, Vec::new()));
                }
                if !stored.is_empty() {
                    return Err(LockStoreError::OutputsDiffer {
                        tx: consumer.clone(),
                        detail: format!(
                            "{} token(s) already have its output ids ({consumer}:N)",
                            stored.len()
                        ),
                    });
                }
                // Any error below rolls the whole transaction back: nothing changes.
                if let Some((token, spent_by)) = spent_by_another(tx, &consumer)? {
                    return Err(LockStoreError::DoubleSpend { token, spent_by });
                }
                let inputs = selected_inputs(tx, &consumer)?;
                if let Some(imbalance) = unconserved(
                    inputs.iter().map(|(t, q)| (t, *q)),
                    outputs.iter().map(|o| (&o.token_type, o.quantity)),
                ) {
                    return Err(LockStoreError::NotConserved(Box::new(Unconserved {
                        tx: consumer.clone(),
                        token_type: imbalance.token_type.to_string(),
                        inputs: Imbalance::shown(imbalance.inputs),
                        outputs: Imbalance::shown(imbalance.outputs),
                    })));
                }
                record_in(tx, &consumer, TxStatus::Confirmed, &spent_at)?;
                let mut keys = if wanted {
                    consumer_keys(tx, &consumer)?
                } else {
                    Vec::new()
                };
                let spent = spend_selected(tx, &consumer, &spent_at)?;
                forget_consumer(tx, &consumer)?;
                // Inputs spent: each output's wallet total must still fit 128 bits.
                crate::tokens::refuse_overflowing_outputs(tx, &outputs)?;
                let mut insert = tx
                    .prepare_cached(
                        "INSERT INTO tokens (tx, output, wallet, token_type, amount, spendable)
                         VALUES (?1, ?2, ?3, ?4, ?5, 1)",
                    )
                    .db()?;
                for (id, o) in ids.iter().zip(&outputs) {
                    insert
                        .execute(params![
                            id.tx.as_str(),
                            id.index,
                            o.wallet.as_str(),
                            o.token_type.as_str(),
                            o.quantity.to_storage()
                        ])
                        .db()?;
                    keys.push(WakeKey::tokens(&o.wallet, &o.token_type));
                }
                let done = Confirmation {
                    spent,
                    outputs: ids,
                    replayed: false,
                };
                Ok::<_, LockStoreError>((done, keys))
            })
            .await?;
        self.signal(&keys, Some(&origin));
        Ok(confirmation)
    }

    async fn selected(&self, consumer: &TxId) -> Result<Vec<Token>, LockStoreError> {
        let consumer = consumer.clone();
        Ok(self
            .pool
            .read(move |tx| {
                let sql = format!(
                    "SELECT {TOKEN_COLUMNS} FROM tokens
                     WHERE spent_by IS NULL AND (tx, output) IN
                           (SELECT tx, output FROM selections WHERE consumer = ?1)
                     ORDER BY tx, output"
                );
                let mut stmt = tx.prepare_cached(&sql).db()?;
                let mut rows = stmt.query([consumer.as_str()]).db()?;
                let mut found = Vec::new();
                while let Some(r) = rows.next().db()? {
                    found.push(token_row(r)?);
                }
                Ok::<_, StoreFault>(found)
            })
            .await?)
    }

    async fn unsettled(&self) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError> {
        self.unsettled_of(None).await
    }

    async fn unsettled_owned(&self) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError> {
        self.unsettled_of(Some(self.owner.to_string())).await
    }

    async fn release_tokens(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
    ) -> Result<u64, LockStoreError> {
        if tokens.is_empty() {
            return Ok(0);
        }
        let (origin, wanted) = (consumer.clone(), self.wake.wanted());
        let (consumer, tokens) = (consumer.clone(), tokens.to_vec());
        let (released, keys) = self
            .pool
            .write(move |tx| {
                let mut stmt = tx
                    .prepare_cached(
                        "DELETE FROM locks WHERE tx = ?1 AND output = ?2 AND consumer = ?3",
                    )
                    .db()?;
                let mut forget = tx
                    .prepare_cached(
                        "DELETE FROM selections WHERE tx = ?1 AND output = ?2 AND consumer = ?3",
                    )
                    .db()?;
                let mut released = 0u64;
                let mut freed = Vec::new();
                for t in tokens.iter().collect::<BTreeSet<_>>() {
                    let key = params![t.tx.as_str(), t.index, consumer.as_str()];
                    let n = stmt.execute(key).db()?;
                    forget.execute(key).db()?;
                    released += u64::try_from(n).unwrap_or(0);
                    if n > 0 && wanted {
                        freed.push(t);
                    }
                }
                Ok::<_, LockStoreError>((released, token_keys(tx, freed)?))
            })
            .await?;
        self.signal(&keys, Some(&origin));
        Ok(released)
    }

    async fn spend_consumer(
        &self,
        consumer: &TxId,
        at: Timestamp,
        record_status: bool,
    ) -> Result<Vec<TokenId>, LockStoreError> {
        let spent_at = time_to_sql(at)?;
        let consumer = consumer.clone();
        self.pool
            .write(move |tx| {
                if let Some((token, spent_by)) = spent_by_another(tx, &consumer)? {
                    // Returning an error rolls the transaction back: nothing changes.
                    return Err(LockStoreError::DoubleSpend { token, spent_by });
                }
                if record_status {
                    record_in(tx, &consumer, TxStatus::Confirmed, &spent_at)?;
                }
                let spent = spend_selected(tx, &consumer, &spent_at)?;
                forget_consumer(tx, &consumer)?;
                Ok(spent)
            })
            .await
    }

    async fn sweep(&self, rule: SweepRule) -> Result<SweepReport, LockStoreError> {
        let wanted = self.wake.wanted();
        let forget_before = time_to_sql(rule.forget_before())?;
        let (report, keys) = self
            .pool
            .write(move |tx| {
                // Decided in Rust rather than by comparing text in SQL, so rows whose
                // time was written in another accepted layout are judged correctly.
                // A row that cannot be decoded is passed over (and reported), never
                // deleted: one corrupt row must not stop every later sweep, and what
                // cannot be read cannot be judged expired.
                let mut report = SweepReport {
                    leader: true,
                    ..SweepReport::default()
                };
                let mut delete = tx
                    .prepare_cached("DELETE FROM locks WHERE tx = ?1 AND output = ?2")
                    .db()?;
                let mut freed = Vec::new();
                for lock in all_locks(tx)? {
                    let lock = match lock {
                        Ok(lock) => lock,
                        Err(fault) => {
                            tracing::warn!(%fault, "lease sweep skips a lock row it cannot read");
                            continue;
                        }
                    };
                    if !rule.sweeps(lock.created_at, lock.status) {
                        continue;
                    }
                    delete
                        .execute(params![lock.token.tx.as_str(), lock.token.index])
                        .db()?;
                    if rule.expired(lock.created_at) {
                        report.expired += 1;
                    } else {
                        report.released_by_status += 1;
                    }
                    if wanted {
                        freed.push(lock.token);
                    }
                }
                // Selections are written by holdfast alone, in the one stored
                // layout, so their times compare as text.
                let forgotten = tx
                    .prepare_cached(
                        "DELETE FROM selections
                         WHERE selected_at < ?1
                           AND NOT EXISTS (SELECT 1 FROM locks AS l
                                           WHERE l.consumer = selections.consumer
                                             AND l.tx = selections.tx
                                             AND l.output = selections.output)",
                    )
                    .db()?
                    .execute([&forget_before])
                    .db()?;
                report.forgotten = u64::try_from(forgotten).unwrap_or(u64::MAX);
                Ok::<_, LockStoreError>((report, token_keys(tx, &freed)?))
            })
            .await?;
        self.signal(&keys, None);
        Ok(report)
    }

    async fn list_locks(&self) -> Result<Vec<LockInfo>, LockStoreError> {
        self.pool
            .read(|tx| {
                // Diagnostics do not hide corruption: the first undecodable row
                // fails the listing.
                let mut locks = all_locks(tx)?
                    .into_iter()
                    .map(|l| {
                        l.map(|l| LockInfo {
                            token: l.token,
                            consumer: l.consumer,
                            created_at: l.created_at,
                            consumer_status: l.status,
                            owner: l.owner,
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                locks.sort_by(|a, b| (a.created_at, &a.token).cmp(&(b.created_at, &b.token)));
                Ok(locks)
            })
            .await
    }

    fn round_trips(&self) -> u64 {
        self.pool.round_trips()
    }
}
