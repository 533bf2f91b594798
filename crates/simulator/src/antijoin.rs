//! The `anti-join` ablation: a [`TokenStore`] whose candidate pages include locked
//! tokens, as if the candidate query had no `NOT EXISTS (lock)` clause. It pages
//! over [`TokenStore::list_tokens`] (unspent tokens, locks ignored), so each page
//! reads the wallet up to the end of that page: fine for the simulator's wallets,
//! and it is only used to measure what the anti-join buys.

use std::sync::Arc;

use async_trait::async_trait;
use holdfast_domain::{Candidate, Quantity, Token, TokenId, TokenType, TxId, WalletId};
use holdfast_ports::{BandQuery, CandidateQuery, NewToken, TokenStore, TokenStoreError};

/// Forwards everything to the inner store except the candidate reads, which
/// return spendable unspent tokens whether locked or not, in the same orders.
pub struct LockBlindTokens {
    inner: Arc<dyn TokenStore>,
}

impl std::fmt::Debug for LockBlindTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockBlindTokens").finish_non_exhaustive()
    }
}

impl LockBlindTokens {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn TokenStore>) -> Self {
        LockBlindTokens { inner }
    }
}

/// A spendable, unspent token as a candidate (locked or not).
fn candidate(t: Token) -> Option<Candidate> {
    (t.spendable && t.spent_by.is_none()).then_some(Candidate {
        id: t.id,
        quantity: t.quantity,
    })
}

fn key(c: &Candidate) -> (Quantity, &TokenId) {
    (c.quantity, &c.id)
}

#[async_trait]
impl TokenStore for LockBlindTokens {
    async fn add_tokens(&self, tokens: &[NewToken]) -> Result<u64, TokenStoreError> {
        self.inner.add_tokens(tokens).await
    }

    async fn set_spendable(
        &self,
        token: &TokenId,
        spendable: bool,
    ) -> Result<bool, TokenStoreError> {
        self.inner.set_spendable(token, spendable).await
    }

    async fn candidates(&self, query: &CandidateQuery) -> Result<Vec<Candidate>, TokenStoreError> {
        let mut want = query.limit;
        loop {
            let rows = self
                .inner
                .list_tokens(&query.wallet, Some(query.token_type.clone()), want)
                .await?;
            let exhausted = rows.len() < want;
            // The store orders ties by its own collation; keep only whole groups of
            // equal amounts unless the wallet was read to its end.
            let boundary = if exhausted {
                None
            } else {
                rows.last().map(|t| t.quantity)
            };
            let mut page: Vec<Candidate> = rows.into_iter().filter_map(candidate).collect();
            if let Some(boundary) = boundary {
                page.retain(|c| c.quantity < boundary);
            }
            page.sort_by(|a, b| key(a).cmp(&key(b)));
            if let Some(after) = &query.after {
                page.retain(|c| key(c) > key(after));
            }
            if page.len() >= query.limit || exhausted {
                page.truncate(query.limit);
                return Ok(page);
            }
            want = want.saturating_mul(2);
        }
    }

    /// The bands over the whole wallet as [`TokenStore::list_tokens`] reads it
    /// (locks ignored), answered in memory by [`holdfast_domain::Bands::answer`].
    async fn candidate_bands(&self, query: &BandQuery) -> Result<Vec<Candidate>, TokenStoreError> {
        let mut all: Vec<Candidate> = self
            .inner
            .list_tokens(&query.wallet, Some(query.token_type.clone()), usize::MAX)
            .await?
            .into_iter()
            .filter_map(candidate)
            .collect();
        all.sort_by(|a, b| key(a).cmp(&key(b)));
        Ok(query
            .bands()
            .answer(&all, query.fill_before.as_ref(), query.fill))
    }

    async fn balance(
        &self,
        wallet: &WalletId,
        token_type: &TokenType,
    ) -> Result<Quantity, TokenStoreError> {
        self.inner.balance(wallet, token_type).await
    }

    async fn balance_for(
        &self,
        wallet: &WalletId,
        token_type: &TokenType,
        consumer: &TxId,
    ) -> Result<Quantity, TokenStoreError> {
        self.inner.balance_for(wallet, token_type, consumer).await
    }

    async fn list_tokens(
        &self,
        wallet: &WalletId,
        token_type: Option<TokenType>,
        limit: usize,
    ) -> Result<Vec<Token>, TokenStoreError> {
        self.inner.list_tokens(wallet, token_type, limit).await
    }

    async fn token(&self, id: &TokenId) -> Result<Option<Token>, TokenStoreError> {
        self.inner.token(id).await
    }
}
