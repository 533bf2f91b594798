//! Errors of the ports: one enum per port family, each wrapping a [`StoreFault`]
//! for the backend failing. Lost races and stale tokens are verdicts, not errors.

use holdfast_domain::{FaultKind, TokenId, TokenType, TxId, WalletId};

// The backend failed: the domain's fault (`holdfast_domain::fault`), which the
// selection engine keeps too; every port error wraps it.
pub use holdfast_domain::StoreFault;

/// Errors of [`crate::TokenStore`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenStoreError {
    /// A token with this id exists with different attributes (adding is idempotent
    /// only for identical tokens).
    #[error("token {token} already exists with different attributes: {detail}")]
    Conflict {
        /// The token id, as `tx:index`.
        token: String,
        /// What differs.
        detail: String,
    },
    /// The call would lift the total of a wallet's unspent tokens of one type
    /// (spendable or not) beyond 2^128 - 1, the largest amount a balance can hold.
    /// Bad input, refused: nothing of the call is written.
    #[error(
        "adding these tokens would make the unspent total of wallet {wallet} type {token_type} \
         exceed 2^128 - 1 (340282366920938463463374607431768211455); expected a total that \
         fits 128 bits; nothing was written"
    )]
    BalanceOverflow {
        /// The wallet.
        wallet: WalletId,
        /// The token type.
        token_type: TokenType,
    },
    /// The backend failed.
    #[error(transparent)]
    Fault(#[from] StoreFault),
}

impl TokenStoreError {
    /// The kind of the backend's failure; `None` for a refusal of the call
    /// ([`TokenStoreError::Conflict`], [`TokenStoreError::BalanceOverflow`]).
    pub fn fault_kind(&self) -> Option<FaultKind> {
        match self {
            TokenStoreError::Fault(f) => Some(f.kind()),
            TokenStoreError::Conflict { .. } | TokenStoreError::BalanceOverflow { .. } => None,
        }
    }
}

/// Errors of [`crate::LockStore`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockStoreError {
    /// A window claim named more than [`crate::MAX_WINDOW`] tokens.
    #[error("window of {len} tokens; expected at most {max}")]
    WindowTooLarge {
        /// Tokens requested.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Settling a transaction as confirmed found one of its selected tokens already
    /// spent by another confirmed transaction (a lease expired and the token was
    /// selected twice). Nothing of the settlement was applied.
    #[error("double spend: token {token} is already spent by {spent_by}; nothing was settled")]
    DoubleSpend {
        /// The token spent twice.
        token: TokenId,
        /// The transaction that spent it first.
        spent_by: TxId,
    },
    /// The outputs of a confirm cannot be stored (too many, or an amount of 0).
    /// Nothing was changed.
    #[error("invalid outputs: {detail}")]
    BadOutputs {
        /// What was wrong and what was expected.
        detail: String,
    },
    /// A confirm's outputs of one token type do not add up to its inputs of that
    /// type. Nothing was changed.
    #[error("{0}")]
    NotConserved(Box<Unconserved>),
    /// The transaction was already confirmed with other outputs (or without
    /// outputs), or its output ids are taken by tokens that are not its outputs.
    /// Nothing was changed.
    #[error("{tx} is already confirmed with other outputs: {detail}; nothing was changed")]
    OutputsDiffer {
        /// The transaction.
        tx: TxId,
        /// What differs.
        detail: String,
    },
    /// The backend failed; some claims of this call may have been applied.
    #[error(transparent)]
    Fault(#[from] StoreFault),
}

impl LockStoreError {
    /// The kind of the backend's failure; `None` for a verdict or a refusal of
    /// the call (a double spend, outputs that are invalid, unconserved or differ,
    /// a window too large).
    pub fn fault_kind(&self) -> Option<FaultKind> {
        match self {
            LockStoreError::Fault(f) => Some(f.kind()),
            LockStoreError::WindowTooLarge { .. }
            | LockStoreError::DoubleSpend { .. }
            | LockStoreError::BadOutputs { .. }
            | LockStoreError::NotConserved(_)
            | LockStoreError::OutputsDiffer { .. } => None,
        }
    }
}

/// The outputs of a transaction do not conserve one of its token types.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "outputs of {tx} do not conserve type {token_type}: inputs {inputs}, outputs {outputs}; nothing was settled"
)]
pub struct Unconserved {
    /// The transaction.
    pub tx: TxId,
    /// The token type.
    pub token_type: String,
    /// What its selected tokens of that type hold (decimal).
    pub inputs: String,
    /// What its outputs of that type add up to (decimal).
    pub outputs: String,
}

/// Errors of [`crate::TxStatusStore`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatusStoreError {
    /// The backend failed.
    #[error(transparent)]
    Fault(#[from] StoreFault),
}

/// Errors of [`crate::QueueStore`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueStoreError {
    /// The backend failed.
    #[error(transparent)]
    Fault(#[from] StoreFault),
}

impl StatusStoreError {
    /// The kind of the backend's failure (always `Some`: every variant is one).
    pub fn fault_kind(&self) -> Option<FaultKind> {
        match self {
            StatusStoreError::Fault(f) => Some(f.kind()),
        }
    }
}

impl QueueStoreError {
    /// The kind of the backend's failure (always `Some`: every variant is one).
    pub fn fault_kind(&self) -> Option<FaultKind> {
        match self {
            QueueStoreError::Fault(f) => Some(f.kind()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_errors_tell_faults_from_verdicts() {
        let fault = || StoreFault::Busy("locked".into());
        let tx = TxId::new("t").expect("tx");
        let token = TokenId::new(tx.clone(), 0);
        let cases: Vec<(String, Option<FaultKind>)> = vec![
            (
                "tokens fault".into(),
                TokenStoreError::Fault(StoreFault::Corrupt("x".into())).fault_kind(),
            ),
            (
                "tokens conflict".into(),
                TokenStoreError::Conflict {
                    token: "t:0".into(),
                    detail: "amount".into(),
                }
                .fault_kind(),
            ),
            (
                "locks fault".into(),
                LockStoreError::Fault(fault()).fault_kind(),
            ),
            (
                "double spend".into(),
                LockStoreError::DoubleSpend {
                    token,
                    spent_by: tx,
                }
                .fault_kind(),
            ),
            (
                "window".into(),
                LockStoreError::WindowTooLarge { len: 300, max: 256 }.fault_kind(),
            ),
            (
                "status fault".into(),
                StatusStoreError::Fault(StoreFault::Unavailable("down".into())).fault_kind(),
            ),
            (
                "queue fault".into(),
                QueueStoreError::Fault(StoreFault::Timeout("slow".into())).fault_kind(),
            ),
        ];
        let expected = [
            Some(FaultKind::Corrupt),
            None,
            Some(FaultKind::Busy),
            None,
            None,
            Some(FaultKind::Unavailable),
            Some(FaultKind::Timeout),
        ];
        for ((what, got), want) in cases.iter().zip(expected) {
            assert_eq!(*got, want, "{what}");
        }
    }
}
