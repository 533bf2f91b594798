//! Small builders the checks share: ids, amounts, tokens and timestamps. Public so
//! adapters can reuse them in their own adapter-specific tests.

use holdfast_domain::{
    Candidate, Precision, Quantity, QueueName, RevisionUri, Timestamp, TokenId, TokenType, TxId,
    WalletId,
};

use crate::{CandidateQuery, NewToken, Stores};

/// A fixed point in time the checks start from (2026-11-30T08:00:00.000Z).
pub const T0: Timestamp = Timestamp(1_796_025_600_000);

/// A transaction id; panics on an invalid literal (checks pass only valid ones).
pub fn tx(id: &str) -> TxId {
    TxId::new(id).unwrap_or_else(|e| panic!("conformance: bad tx literal: {e}"))
}

/// A wallet id.
pub fn wallet(id: &str) -> WalletId {
    WalletId::new(id).unwrap_or_else(|e| panic!("conformance: bad wallet literal: {e}"))
}

/// A token type.
pub fn token_type(id: &str) -> TokenType {
    TokenType::new(id).unwrap_or_else(|e| panic!("conformance: bad type literal: {e}"))
}

/// A queue name.
pub fn queue(name: &str) -> QueueName {
    QueueName::new(name).unwrap_or_else(|e| panic!("conformance: bad queue literal: {e}"))
}

/// A revision uri.
pub fn uri(u: &str) -> RevisionUri {
    RevisionUri::new(u).unwrap_or_else(|e| panic!("conformance: bad uri literal: {e}"))
}

/// The token `tx:index`.
pub fn token_id(tx_id: &str, index: u32) -> TokenId {
    TokenId::new(tx(tx_id), index)
}

/// An amount of up to 128 bits.
pub fn amount(value: u128) -> Quantity {
    Quantity::new(value, Precision::MAX).unwrap_or_else(|e| panic!("conformance: {e}"))
}

/// A spendable token `tx:index` of `wallet`/`CHF` with `value`.
pub fn chf(wallet_id: &str, tx_id: &str, index: u32, value: u128) -> NewToken {
    NewToken {
        id: token_id(tx_id, index),
        wallet: wallet(wallet_id),
        token_type: token_type("CHF"),
        quantity: amount(value),
        spendable: true,
    }
}

/// Adds tokens, failing the check on an error.
pub async fn add(stores: &Stores, tokens: &[NewToken]) {
    if let Err(e) = stores.tokens.add_tokens(tokens).await {
        panic!("conformance: add_tokens failed: {e}");
    }
}

/// Every candidate of `wallet`/`CHF`, fetched in pages of `page`.
pub async fn all_candidates(stores: &Stores, wallet_id: &str, page: usize) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    let mut pages = 0usize;
    loop {
        let query = CandidateQuery {
            wallet: wallet(wallet_id),
            token_type: token_type("CHF"),
            after: out.last().cloned(),
            limit: page,
        };
        let rows = stores
            .tokens
            .candidates(&query)
            .await
            .unwrap_or_else(|e| panic!("conformance: candidates failed: {e}"));
        assert!(
            rows.len() <= page,
            "a candidate page returned {} rows; expected at most the limit {page}",
            rows.len()
        );
        let done = rows.len() < page;
        out.extend(rows);
        pages += 1;
        assert!(pages < 10_000, "candidate paging does not terminate");
        if done {
            return out;
        }
    }
}

/// The ids of candidates, in order.
pub fn ids(candidates: &[Candidate]) -> Vec<TokenId> {
    candidates.iter().map(|c| c.id.clone()).collect()
}

/// `T0 + millis`.
pub fn at(millis: u64) -> Timestamp {
    Timestamp(T0.0 + millis)
}
