//! The token store port: tokens, spendable candidates and balances.

use async_trait::async_trait;
use holdfast_domain::{Bands, Candidate, Quantity, Token, TokenId, TokenType, TxId, WalletId};

use crate::error::TokenStoreError;

/// A token to add to a wallet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewToken {
    /// Creating transaction and output index.
    pub id: TokenId,
    /// Owning wallet.
    pub wallet: WalletId,
    /// Denomination.
    pub token_type: TokenType,
    /// Amount.
    pub quantity: Quantity,
    /// Whether it may be selected.
    pub spendable: bool,
}

/// One page of candidates: spendable, unspent, unlocked tokens of a wallet and type
/// in ascending `(quantity, tx, index)` order, strictly after `after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateQuery {
    /// The wallet.
    pub wallet: WalletId,
    /// The token type.
    pub token_type: TokenType,
    /// Keyset cursor: the last candidate of the previous page; `None` for the first page.
    pub after: Option<Candidate>,
    /// At most this many rows.
    pub limit: usize,
}

/// A `cover_first` read, in one round trip through the candidate index (both
/// bands exclude locked, spent and non-spendable tokens, as candidates do):
/// the cover band, up to `cover` candidates with amount >= `threshold` in ascending
/// `(quantity, tx, index)` order, followed by the fill band, up to `fill`
/// candidates with amount < `threshold` in descending order. With `fill_before`
/// set the read is a further fill page: fill candidates strictly before it, no
/// cover band. `holdfast_domain::Bands::answer` states the same over a wallet in
/// memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BandQuery {
    /// The wallet.
    pub wallet: WalletId,
    /// The token type.
    pub token_type: TokenType,
    /// The amount still to cover: where the bands meet.
    pub threshold: Quantity,
    /// At most this many cover candidates (not read on a further fill page).
    pub cover: usize,
    /// At most this many fill candidates.
    pub fill: usize,
    /// Keyset cursor of a further fill page: the smallest fill candidate so far.
    pub fill_before: Option<Candidate>,
    /// When set, the store may answer the cover band alone if its smallest
    /// candidate is at most this amount (the engine then chooses a single cover
    /// and reads the fill band later if it needs it); `holdfast_domain::Bands`
    /// says the same. SQLite then skips its fill statement; PostgreSQL's one
    /// statement skips the fill scan (a one-time filter on the cover band).
    pub fill_unless_cover_at_most: Option<Quantity>,
}

impl BandQuery {
    /// The engine's view of this read: what it asks, and when a store may leave
    /// the fill band out ([`Bands::skips_fill`]).
    pub fn bands(&self) -> Bands {
        Bands {
            threshold: self.threshold,
            cover: self.cover,
            fill_unless_cover_at_most: self.fill_unless_cover_at_most,
        }
    }
}

/// Tokens, candidates and balances.
#[mockall::automock]
#[async_trait]
pub trait TokenStore: Send + Sync {
    /// Adds tokens; a token that already exists with identical attributes is left
    /// alone (idempotent), one with different attributes is a
    /// [`TokenStoreError::Conflict`] and nothing of the call is written. Returns how
    /// many were new. The attributes compared are wallet, type and quantity; the
    /// spendable flag and the spent state are state, not identity, and an existing
    /// token's state is left as it is.
    async fn add_tokens(&self, tokens: &[NewToken]) -> Result<u64, TokenStoreError>;

    /// Sets the spendable flag; returns false when no such unspent token exists.
    async fn set_spendable(
        &self,
        token: &TokenId,
        spendable: bool,
    ) -> Result<bool, TokenStoreError>;

    /// One page of candidates (see [`CandidateQuery`]). Locked tokens are excluded
    /// (anti-join); the page is read through the candidate index, never by loading
    /// the whole wallet.
    async fn candidates(&self, query: &CandidateQuery) -> Result<Vec<Candidate>, TokenStoreError>;

    /// The cover and fill bands of a `cover_first` read (see [`BandQuery`]): the
    /// cover band first, ascending, then the fill band, descending.
    async fn candidate_bands(&self, query: &BandQuery) -> Result<Vec<Candidate>, TokenStoreError>;

    /// The sum of spendable, unspent tokens of the wallet and type, locks ignored.
    async fn balance(
        &self,
        wallet: &WalletId,
        token_type: &TokenType,
    ) -> Result<Quantity, TokenStoreError>;

    /// What a new select of `consumer` could still get: like [`TokenStore::balance`]
    /// (other transactions' locks ignored), less the tokens `consumer` has selected
    /// and not settled (its earlier selects hold them, and it cannot win them again).
    async fn balance_for(
        &self,
        wallet: &WalletId,
        token_type: &TokenType,
        consumer: &TxId,
    ) -> Result<Quantity, TokenStoreError>;

    /// Unspent tokens of a wallet (of one type, or all), spendable or not, in
    /// ascending quantity (ties by id), at most `limit`. The adapters read the
    /// wallet's own index entries: a listing costs what the wallet holds, not
    /// what the table holds.
    async fn list_tokens(
        &self,
        wallet: &WalletId,
        token_type: Option<TokenType>,
        limit: usize,
    ) -> Result<Vec<Token>, TokenStoreError>;

    /// One token by id, spent or not.
    async fn token(&self, id: &TokenId) -> Result<Option<Token>, TokenStoreError>;
}
