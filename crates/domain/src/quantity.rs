//! Token amounts: unsigned integers of up to 128 bits, bounded by a configured precision.
//!
//! A [`Quantity`] is parsed once at the edge (decimal or `0x` hex) and trusted inside.
//! It has exactly one canonical text form (decimal, no leading zeros, see [`Display`])
//! and one storage encoding ([`Quantity::to_storage`]): 32 lowercase hex digits,
//! zero-padded, so that comparing two encodings as bytes or as text orders them
//! numerically and equal amounts have byte-equal encodings.
//!
//! [`Display`]: std::fmt::Display

use std::fmt;

/// The number of bits an amount may use, from 1 to 128 (default 64).
///
/// Every construction of a [`Quantity`] checks the value against a precision, so an
/// amount that does not fit the configured ledger can never enter the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Precision(u8);

impl Precision {
    /// The largest precision: full 128-bit amounts.
    pub const MAX: Precision = Precision(128);

    /// A precision of `bits` bits; `bits` must be in `1..=128`.
    pub fn new(bits: u8) -> Result<Self, QuantityError> {
        if (1..=128).contains(&bits) {
            Ok(Precision(bits))
        } else {
            Err(QuantityError::InvalidPrecision { bits })
        }
    }

    /// The number of bits.
    pub fn bits(self) -> u8 {
        self.0
    }

    /// The largest amount this precision admits (`2^bits - 1`).
    pub fn max_value(self) -> u128 {
        if self.0 == 128 {
            u128::MAX
        } else {
            (1u128 << self.0) - 1
        }
    }
}

impl Default for Precision {
    fn default() -> Self {
        Precision(64)
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bits", self.0)
    }
}

/// Why an amount was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The text was empty.
    #[error("invalid amount {input:?}: empty; expected a decimal or 0x-hex unsigned integer")]
    Empty {
        /// The rejected text.
        input: String,
    },
    /// The text started with `+` or `-`.
    #[error("invalid amount {input:?}: signs are not allowed; expected an unsigned integer")]
    Signed {
        /// The rejected text.
        input: String,
    },
    /// The text contained white space (leading, trailing or inside).
    #[error("invalid amount {input:?}: contains white space; expected digits only")]
    Whitespace {
        /// The rejected text.
        input: String,
    },
    /// `0x` with no hex digits after it.
    #[error("invalid amount {input:?}: no digits after 0x; expected hex digits")]
    MissingHexDigits {
        /// The rejected text.
        input: String,
    },
    /// A character that is not a digit of the base.
    #[error(
        "invalid amount {input:?}: {found:?} is not a {base} digit; expected a decimal or 0x-hex unsigned integer"
    )]
    InvalidDigit {
        /// The rejected text.
        input: String,
        /// The first offending character.
        found: char,
        /// "decimal" or "hex".
        base: &'static str,
    },
    /// The value does not fit the precision (or 128 bits).
    #[error(
        "invalid amount {input:?}: exceeds the precision of {precision}; expected at most {max}"
    )]
    Overflow {
        /// The rejected text.
        input: String,
        /// The precision it was checked against.
        precision: Precision,
        /// The largest admitted value.
        max: u128,
    },
    /// A stored encoding that is not 32 lowercase hex digits.
    #[error(
        "corrupt stored amount {input:?}: expected 32 lowercase hex digits (the canonical storage encoding)"
    )]
    CorruptStorage {
        /// The rejected stored text.
        input: String,
    },
    /// A precision outside `1..=128`.
    #[error("invalid precision {bits}: expected 1 to 128 bits")]
    InvalidPrecision {
        /// The rejected number of bits.
        bits: u8,
    },
}

/// An unsigned token amount of at most 128 bits.
///
/// Equality and order are numeric. Arithmetic is checked: [`Quantity::checked_add`]
/// and [`Quantity::checked_sub`] return `None` instead of wrapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Quantity(u128);

impl Quantity {
    /// Zero.
    pub const ZERO: Quantity = Quantity(0);

    /// The amount `value`, checked against `precision`.
    pub fn new(value: u128, precision: Precision) -> Result<Self, QuantityError> {
        if value > precision.max_value() {
            return Err(QuantityError::Overflow {
                input: value.to_string(),
                precision,
                max: precision.max_value(),
            });
        }
        Ok(Quantity(value))
    }

    /// Parses decimal (`"1500"`) or `0x` hex (`"0x5dc"`, either case) text.
    ///
    /// Rejects empty text, signs, white space anywhere, junk and values above the
    /// precision, each with a [`QuantityError`] naming the input.
    pub fn parse(input: &str, precision: Precision) -> Result<Self, QuantityError> {
        let owned = || input.to_owned();
        if input.is_empty() {
            return Err(QuantityError::Empty { input: owned() });
        }
        if input.chars().any(char::is_whitespace) {
            return Err(QuantityError::Whitespace { input: owned() });
        }
        if input.starts_with('+') || input.starts_with('-') {
            return Err(QuantityError::Signed { input: owned() });
        }
        let (digits, radix, base) = match input
            .strip_prefix("0x")
            .or_else(|| input.strip_prefix("0X"))
        {
            Some("") => {
                return Err(QuantityError::MissingHexDigits { input: owned() });
            }
            Some(hex) => (hex, 16, "hex"),
            None => (input, 10, "decimal"),
        };
        let overflow = || QuantityError::Overflow {
            input: owned(),
            precision,
            max: precision.max_value(),
        };
        let mut value: u128 = 0;
        for c in digits.chars() {
            let digit = c.to_digit(radix).ok_or(QuantityError::InvalidDigit {
                input: owned(),
                found: c,
                base,
            })?;
            value = value
                .checked_mul(u128::from(radix))
                .and_then(|v| v.checked_add(u128::from(digit)))
                .ok_or_else(overflow)?;
        }
        if value > precision.max_value() {
            return Err(overflow());
        }
        Ok(Quantity(value))
    }

    /// The numeric value.
    pub fn value(self) -> u128 {
        self.0
    }

    /// Whether this is zero.
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// `self + other`, or `None` on 128-bit overflow.
    pub fn checked_add(self, other: Quantity) -> Option<Quantity> {
        self.0.checked_add(other.0).map(Quantity)
    }

    /// `self - other`, or `None` when `other` is larger.
    pub fn checked_sub(self, other: Quantity) -> Option<Quantity> {
        self.0.checked_sub(other.0).map(Quantity)
    }

    /// `self - other`, or zero when `other` is larger.
    pub fn saturating_sub(self, other: Quantity) -> Quantity {
        Quantity(self.0.saturating_sub(other.0))
    }

    /// The storage encoding: exactly 32 lowercase hex digits, zero-padded.
    ///
    /// Byte-wise (and text) comparison of two encodings orders them numerically, and
    /// every value has exactly one encoding, so an index on it gives numeric order
    /// and equality is exact.
    pub fn to_storage(self) -> String {
        format!("{:032x}", self.0)
    }

    /// Decodes [`Quantity::to_storage`] output, rejecting anything non-canonical
    /// (wrong length, upper case, junk) with [`QuantityError::CorruptStorage`].
    pub fn from_storage(stored: &str) -> Result<Self, QuantityError> {
        let corrupt = || QuantityError::CorruptStorage {
            input: stored.to_owned(),
        };
        if stored.len() != 32
            || !stored
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(corrupt());
        }
        u128::from_str_radix(stored, 16)
            .map(Quantity)
            .map_err(|_| corrupt())
    }
}

/// The canonical text form: decimal without leading zeros.
impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p64() -> Precision {
        Precision::default()
    }

    #[test]
    fn parses_decimal_and_hex() {
        assert_eq!(Quantity::parse("1500", p64()).unwrap().value(), 1500);
        assert_eq!(Quantity::parse("0x5dc", p64()).unwrap().value(), 1500);
        assert_eq!(Quantity::parse("0X5DC", p64()).unwrap().value(), 1500);
        assert_eq!(Quantity::parse("0", p64()).unwrap(), Quantity::ZERO);
    }

    #[test]
    fn rejects_bad_text_with_the_reason() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("-1", "signs"),
            ("+1", "signs"),
            ("1.5", "'.' is not a decimal digit"),
            ("1e3", "'e' is not a decimal digit"),
            ("0x", "no digits after 0x"),
            ("0xZZ", "'Z' is not a hex digit"),
            (" 1", "white space"),
            ("1 2", "white space"),
            ("18446744073709551616", "exceeds the precision of 64 bits"),
            (
                "340282366920938463463374607431768211456",
                "exceeds the precision of 64 bits",
            ),
        ];
        for (input, reason) in cases {
            let err = Quantity::parse(input, p64()).unwrap_err().to_string();
            assert!(err.contains(reason), "{input:?}: {err}");
            assert!(err.contains(&format!("{input:?}")), "{input:?}: {err}");
        }
    }

    #[test]
    fn precision_bounds_every_construction() {
        let p8 = Precision::new(8).unwrap();
        assert!(Quantity::new(255, p8).is_ok());
        assert!(Quantity::new(256, p8).is_err());
        assert!(Quantity::parse("0x100", p8).is_err());
        assert!(Quantity::parse(&u128::MAX.to_string(), Precision::MAX).is_ok());
        assert!(Precision::new(0).is_err());
        assert!(Precision::new(129).is_err());
    }

    #[test]
    fn storage_encoding_sorts_numerically_and_round_trips() {
        let values = [
            0u128,
            1,
            9,
            10,
            255,
            256,
            u128::from(u64::MAX) + 1,
            u128::MAX,
        ];
        let mut encoded: Vec<String> = values
            .iter()
            .map(|v| Quantity::new(*v, Precision::MAX).unwrap().to_storage())
            .collect();
        let sorted = encoded.clone();
        encoded.sort();
        assert_eq!(encoded, sorted);
        for v in values {
            let q = Quantity::new(v, Precision::MAX).unwrap();
            assert_eq!(Quantity::from_storage(&q.to_storage()).unwrap(), q);
        }
        for junk in [
            "",
            "1",
            "0000000000000000000000000000000A",
            "x".repeat(32).as_str(),
        ] {
            assert!(Quantity::from_storage(junk).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn arithmetic_is_checked() {
        let one = Quantity::new(1, p64()).unwrap();
        let max = Quantity::new(u128::MAX, Precision::MAX).unwrap();
        assert_eq!(max.checked_add(one), None);
        assert_eq!(Quantity::ZERO.checked_sub(one), None);
        assert_eq!(one.checked_sub(one), Some(Quantity::ZERO));
    }
}
