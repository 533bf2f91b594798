//! `RequestId::parse`, its display form and ordering.

use holdfast_domain::{QueueName, RequestId};

use crate::Input;

/// The first bytes build an id from parts (which must round-trip), the rest is
/// parsed as text.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let seq = input.u64();
    let queue_len = usize::try_from(input.below(12)).unwrap_or(0);
    let queue: String = (0..queue_len)
        .map(|_| char::from(b"ab/0 9\x7fx"[usize::from(input.byte() % 8)]))
        .collect();
    if let Ok(queue) = QueueName::new(queue) {
        let id = RequestId::new(queue, seq);
        let parsed = RequestId::parse(&id.to_string());
        if (1..=RequestId::MAX_SEQ).contains(&seq) {
            assert_eq!(parsed, Ok(id.clone()), "{id}");
        } else {
            assert!(parsed.is_err(), "{id}: n outside 1..=MAX_SEQ was accepted");
        }
        check(&id.to_string());
    }
    check(&input.rest_text());
}

/// Parses `text`: an accepted id displays exactly as the text (one canonical
/// spelling: no leading zeros) and parses back to itself; a refused one is named
/// in the error.
pub fn check(text: &str) {
    match RequestId::parse(text) {
        Ok(id) => {
            let shown = id.to_string();
            assert_eq!(RequestId::parse(&shown), Ok(id.clone()), "{text:?}");
            assert_eq!(shown, text, "the display form differs from the input");
            assert_eq!(id.compare(&id), Ok(std::cmp::Ordering::Equal));
            let next = RequestId::new(id.queue().clone(), id.seq().saturating_add(1));
            assert!(id.compare(&next).is_ok_and(|o| o.is_le()));
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
}
