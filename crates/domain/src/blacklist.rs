//! The per-call blacklist of token selection (`docs/selection.md`, step 4).
//!
//! A token that lost a lock race (contended) or was found no longer spendable
//! (stale) is skipped for the rest of one Select call, so the call does not hammer
//! a hot token. The reason is kept because only contention means "someone else
//! holds funds": skipping a contended token counts as seeing contention (which
//! suppresses the fast-fail balance check), skipping a stale one does not.
//! Store errors never blacklist a token.

use std::collections::HashMap;

use crate::ids::TokenId;

/// Why a token is blacklisted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlacklistReason {
    /// It lost a lock race: another consumer holds it.
    Contended,
    /// It was no longer spendable when claimed.
    Stale,
}

/// Tokens to skip for the rest of one Select call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Blacklist {
    entries: HashMap<TokenId, BlacklistReason>,
}

impl Blacklist {
    /// An empty blacklist.
    pub fn new() -> Self {
        Self::default()
    }

    /// Blacklists `token`; a later reason replaces an earlier one.
    pub fn insert(&mut self, token: TokenId, reason: BlacklistReason) {
        self.entries.insert(token, reason);
    }

    /// Why `token` is blacklisted, if it is.
    pub fn reason(&self, token: &TokenId) -> Option<BlacklistReason> {
        self.entries.get(token).copied()
    }

    /// Whether `token` is blacklisted.
    pub fn contains(&self, token: &TokenId) -> bool {
        self.entries.contains_key(token)
    }

    /// Forgets every entry (the escape hatch for a scan that saw only blacklisted
    /// tokens: a tight wallet may retry tokens that were freed meanwhile).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// How many tokens are blacklisted.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no token is blacklisted.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::TxId;

    #[test]
    fn keeps_the_latest_reason_and_clears() {
        let t = TokenId::new(TxId::new("a").unwrap(), 0);
        let mut b = Blacklist::new();
        assert!(b.is_empty() && !b.contains(&t));
        b.insert(t.clone(), BlacklistReason::Stale);
        b.insert(t.clone(), BlacklistReason::Contended);
        assert_eq!(b.reason(&t), Some(BlacklistReason::Contended));
        assert_eq!(b.len(), 1);
        b.clear();
        assert!(b.is_empty() && b.reason(&t).is_none());
    }
}
