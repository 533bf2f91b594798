//! `Quantity::parse` and the storage encoding against an independent reference.

use holdfast_domain::{Precision, Quantity};

use crate::Input;

/// What the text must parse to, decided without the parser under test: digits
/// only (decimal), or `0x`/`0X` and hex digits only; `None` for anything else or
/// for a value over 128 bits.
fn reference(text: &str) -> Option<Option<u128>> {
    let (digits, radix) = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (text, 10),
    };
    let well_formed = !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix));
    // `from_str_radix` accepts a leading `+`, so the digit check above comes first.
    well_formed.then(|| u128::from_str_radix(digits, radix).ok())
}

/// The first byte picks the precision, the rest is the text.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let bits = u8::try_from(input.range(1, 128)).unwrap_or(128);
    let precision = Precision::new(bits).unwrap_or(Precision::MAX);
    let text = input.rest_text();
    check(&text, precision);
}

/// Parses `text` and checks the result against the reference and the encodings.
pub fn check(text: &str, precision: Precision) {
    let parsed = Quantity::parse(text, precision);
    match (reference(text), &parsed) {
        (Some(Some(value)), Ok(q)) => {
            assert_eq!(q.value(), value, "{text:?}");
            assert!(value <= precision.max_value(), "{text:?} above {precision}");
        }
        (Some(Some(value)), Err(e)) => assert!(
            value > precision.max_value(),
            "{text:?} = {value} fits {precision} but was refused: {e}"
        ),
        (Some(None) | None, Ok(q)) => panic!("{text:?} accepted as {}", q.value()),
        (Some(None) | None, Err(_)) => {}
    }
    match parsed {
        Ok(q) => {
            let stored = q.to_storage();
            assert_eq!(stored.len(), 32, "{stored:?}");
            assert_eq!(Quantity::from_storage(&stored), Ok(q), "{stored:?}");
            assert_eq!(Quantity::parse(&q.value().to_string(), precision), Ok(q));
            assert_eq!(
                Quantity::parse(&format!("{:#x}", q.value()), precision),
                Ok(q)
            );
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains(&format!("{text:?}")),
                "the error does not name the input {text:?}: {message}"
            );
            assert!(message.contains("expected"), "no expectation in: {message}");
        }
    }
    // Any text offered as a stored amount: canonical or refused, never a panic.
    if let Ok(q) = Quantity::from_storage(text) {
        assert_eq!(q.to_storage(), text, "non-canonical storage accepted");
    }
}
