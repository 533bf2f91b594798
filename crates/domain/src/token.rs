//! Tokens (unspent outputs), the candidates selection sees, and the verdict of a claim.

use crate::ids::{TokenId, TokenType, TxId, WalletId};
use crate::quantity::Quantity;
use crate::timestamp::Timestamp;

/// A token as stored: spending is a soft delete (`spent_by`, `spent_at`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// Creating transaction and output index.
    pub id: TokenId,
    /// The owning wallet.
    pub wallet: WalletId,
    /// The denomination.
    pub token_type: TokenType,
    /// The amount.
    pub quantity: Quantity,
    /// Whether it may be selected at all (false once, say, its format is retired).
    pub spendable: bool,
    /// The transaction that spent it, if spent.
    pub spent_by: Option<TxId>,
    /// When it was marked spent.
    pub spent_at: Option<Timestamp>,
}

/// A spendable, unlocked token offered to selection, in ascending quantity order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Candidate {
    /// The token.
    pub id: TokenId,
    /// Its amount.
    pub quantity: Quantity,
}

/// What a lock store reports for one claim attempt on one token. These are facts,
/// never errors: the selection engine decides what they mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimVerdict {
    /// The lock row was written for this consumer.
    Won,
    /// The token is no longer spendable (spent, made unspendable or missing).
    Stale,
    /// Another consumer holds it (or is claiming it right now).
    Contended,
}
