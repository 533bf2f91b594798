//! Validated identifiers: wallets, token types, transactions and tokens.
//!
//! Each identifier is parsed once at the edge. It is non-empty, at most
//! [`MAX_ID_LEN`] bytes long and free of control characters, so it can be stored,
//! logged and shown without escaping surprises.

use std::fmt;

/// The longest identifier accepted, in bytes.
pub const MAX_ID_LEN: usize = 256;

/// Why an identifier was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The identifier was empty.
    #[error("invalid {kind}: empty; expected 1 to {MAX_ID_LEN} printable characters")]
    Empty {
        /// What kind of identifier ("wallet id", "tx id", ...).
        kind: &'static str,
    },
    /// The identifier was longer than [`MAX_ID_LEN`] bytes.
    #[error("invalid {kind} {shown:?}: {len} bytes long; expected at most {MAX_ID_LEN}")]
    TooLong {
        /// What kind of identifier.
        kind: &'static str,
        /// The first characters of the rejected value.
        shown: String,
        /// Its length in bytes.
        len: usize,
    },
    /// The identifier contained a control character.
    #[error(
        "invalid {kind} {input:?}: contains a control character; expected printable characters"
    )]
    ControlCharacter {
        /// What kind of identifier.
        kind: &'static str,
        /// The rejected value.
        input: String,
    },
}

fn validate(kind: &'static str, input: &str) -> Result<(), IdError> {
    if input.is_empty() {
        return Err(IdError::Empty { kind });
    }
    if input.len() > MAX_ID_LEN {
        return Err(IdError::TooLong {
            kind,
            shown: input.chars().take(32).collect::<String>() + "…",
            len: input.len(),
        });
    }
    if input.chars().any(char::is_control) {
        return Err(IdError::ControlCharacter {
            kind,
            input: input.to_owned(),
        });
    }
    Ok(())
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(std::sync::Arc<str>);

        impl $name {
            /// Validates `input`: non-empty, at most [`MAX_ID_LEN`] bytes, no control characters.
            pub fn new(input: impl Into<String>) -> Result<Self, IdError> {
                let input = input.into();
                validate($kind, &input)?;
                Ok($name(input.into()))
            }

            /// The identifier as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                $name::new(s)
            }
        }
    };
}

string_id!(
    /// The wallet that owns tokens.
    WalletId,
    "wallet id"
);
string_id!(
    /// The type (denomination) of a token, such as `CHF`.
    TokenType,
    "token type"
);
string_id!(
    /// A transaction: the creator of tokens, and the consumer that locks and spends them.
    TxId,
    "tx id"
);
string_id!(
    /// A build queue, such as `monorepo/main` (may contain `/`).
    QueueName,
    "queue name"
);
string_id!(
    /// The revision a build request points at; the dedup key of requests in a queue.
    RevisionUri,
    "uri"
);

/// A token: the output `index` of the transaction `tx` that created it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenId {
    /// The creating transaction.
    pub tx: TxId,
    /// The output index within that transaction.
    pub index: u32,
}

impl TokenId {
    /// The token at output `index` of `tx`.
    pub fn new(tx: TxId, index: u32) -> Self {
        TokenId { tx, index }
    }
}

/// Shown as `tx:index`.
impl fmt::Display for TokenId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.tx, self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_printable_ids() {
        assert_eq!(WalletId::new("alice").unwrap().as_str(), "alice");
        assert_eq!(TxId::new("tx 1 ü").unwrap().to_string(), "tx 1 ü");
        let id = TokenId::new(TxId::new("t").unwrap(), 3);
        assert_eq!(id.to_string(), "t:3");
    }

    #[test]
    fn rejects_empty_long_and_control_characters() {
        assert!(matches!(WalletId::new(""), Err(IdError::Empty { .. })));
        let long = "a".repeat(MAX_ID_LEN + 1);
        let err = TxId::new(long).unwrap_err();
        assert!(matches!(err, IdError::TooLong { len: 257, .. }));
        assert!(err.to_string().contains("at most 256"));
        let err = TokenType::new("CH\u{0}F").unwrap_err();
        assert!(err.to_string().contains("control character"), "{err}");
        assert!(TokenType::new("a".repeat(MAX_ID_LEN)).is_ok());
    }
}
