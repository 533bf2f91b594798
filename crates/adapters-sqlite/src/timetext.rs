//! The one stored text form of timestamps, and a tolerant reader.
//!
//! holdfast writes every timestamp as RFC 3339 in UTC with exactly three fraction
//! digits and a `Z`, such as `2026-11-30T08:00:00.000Z`. These sort as text in time
//! order and are what SQLite's own date functions understand.
//!
//! Rows written by other tools (or by hand) may use other common layouts, so reading
//! also accepts: a space (or lower-case `t`) instead of `T`; no fraction or 1 to 9
//! fraction digits (truncated to milliseconds); `Z`, `z`, `+HH:MM`, `-HH:MM`,
//! `+HHMM` or `+HH` as the zone, or no zone at all (taken as UTC, as SQLite's
//! `CURRENT_TIMESTAMP` writes it); and minutes without seconds (`HH:MM`). Anything
//! else is refused with a [`TimeTextError`] naming the text.
//!
//! Writing is the domain's [`Timestamp::rfc3339`] (one home for the written form,
//! which the command line shows too); reading is here. Written by hand rather
//! than with a date crate: the format is one fixed layout, the conversion is the
//! civil-calendar algorithm below, and the workspace
//! stays free of a second time library beside the domain's `Timestamp`.

use holdfast_domain::Timestamp;

/// A stored timestamp that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid timestamp {input:?}: {reason}; expected RFC 3339 such as 2026-11-30T08:00:00.000Z"
)]
pub struct TimeTextError {
    /// The rejected text.
    pub input: String,
    /// What was wrong.
    pub reason: &'static str,
}

const MILLIS_PER_DAY: i64 = 86_400_000;

/// Days from 1970-01-01 to the given civil date (proleptic Gregorian).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// The latest timestamp the stored form can hold: 9999-12-31T23:59:59.999Z.
pub const MAX_STORABLE: Timestamp = Timestamp::MAX_RFC3339;

/// Formats `ts` in the stored form, the domain's [`Timestamp::rfc3339`]; `None`
/// after [`MAX_STORABLE`] (a five-digit year would not sort as text).
pub fn format(ts: Timestamp) -> Option<String> {
    ts.rfc3339()
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn digits(&mut self, n: usize) -> Option<i64> {
        let slice = self.bytes.get(self.pos..self.pos + n)?;
        if !slice.iter().all(u8::is_ascii_digit) {
            return None;
        }
        self.pos += n;
        Some(
            slice
                .iter()
                .fold(0i64, |acc, b| acc * 10 + i64::from(b - b'0')),
        )
    }

    fn eat(&mut self, byte: u8) -> bool {
        if self.bytes.get(self.pos) == Some(&byte) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }
}

/// Reads a stored timestamp in any of the accepted layouts (see the module docs).
pub fn parse(input: &str) -> Result<Timestamp, TimeTextError> {
    let fail = |reason| TimeTextError {
        input: input.to_owned(),
        reason,
    };
    let mut c = Cursor {
        bytes: input.as_bytes(),
        pos: 0,
    };
    let year = c.digits(4).ok_or_else(|| fail("no four-digit year"))?;
    let month = (c.eat(b'-').then(|| c.digits(2)).flatten()).ok_or_else(|| fail("no -MM month"))?;
    let day = (c.eat(b'-').then(|| c.digits(2)).flatten()).ok_or_else(|| fail("no -DD day"))?;
    if !(c.eat(b'T') || c.eat(b't') || c.eat(b' ')) {
        return Err(fail("no T or space between date and time"));
    }
    let hour = c.digits(2).ok_or_else(|| fail("no HH hour"))?;
    let minute =
        (c.eat(b':').then(|| c.digits(2)).flatten()).ok_or_else(|| fail("no :MM minute"))?;
    let mut second = 0;
    let mut millis = 0;
    if c.eat(b':') {
        second = c
            .digits(2)
            .ok_or_else(|| fail("no SS second after the colon"))?;
        if c.eat(b'.') {
            let start = c.pos;
            while c.peek().is_some_and(|b| b.is_ascii_digit()) {
                c.pos += 1;
            }
            let frac = &input[start..c.pos];
            if frac.is_empty() || frac.len() > 9 {
                return Err(fail("the fraction must have 1 to 9 digits"));
            }
            let padded = format!("{frac:0<3}");
            millis = padded[..3]
                .parse::<i64>()
                .map_err(|_| fail("the fraction is not decimal"))?;
        }
    }
    if !(1..=12).contains(&month) {
        return Err(fail("month out of range"));
    }
    if day < 1 || day > days_in_month(year, month) {
        return Err(fail("day out of range for the month"));
    }
    if hour > 23 || minute > 59 || second > 59 {
        return Err(fail("time of day out of range"));
    }
    let offset_minutes = match c.peek() {
        None => 0,
        Some(b'Z' | b'z') => {
            c.pos += 1;
            0
        }
        Some(sign @ (b'+' | b'-')) => {
            c.pos += 1;
            let oh = c
                .digits(2)
                .ok_or_else(|| fail("no HH in the zone offset"))?;
            let om = if c.eat(b':') {
                c.digits(2)
                    .ok_or_else(|| fail("no MM in the zone offset"))?
            } else {
                c.digits(2).unwrap_or(0)
            };
            if oh > 23 || om > 59 {
                return Err(fail("zone offset out of range"));
            }
            let total = oh * 60 + om;
            if sign == b'+' { total } else { -total }
        }
        Some(_) => return Err(fail("unexpected text after the time")),
    };
    if c.pos != input.len() {
        return Err(fail("unexpected text after the zone"));
    }
    let local = days_from_civil(year, month, day) * MILLIS_PER_DAY
        + ((hour * 60 + minute) * 60 + second) * 1000
        + millis;
    let utc = local - offset_minutes * 60_000;
    u64::try_from(utc)
        .map(Timestamp)
        .map_err(|_| fail("before 1970-01-01T00:00:00Z"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Timestamp = Timestamp(1_796_025_600_000);

    #[test]
    fn formats_the_one_stored_form() {
        assert_eq!(format(T0).as_deref(), Some("2026-11-30T08:00:00.000Z"));
        assert_eq!(
            format(Timestamp(0)).as_deref(),
            Some("1970-01-01T00:00:00.000Z")
        );
        assert_eq!(
            format(Timestamp(951_782_400_123)).as_deref(),
            Some("2000-02-29T00:00:00.123Z")
        );
        assert_eq!(
            format(MAX_STORABLE).as_deref(),
            Some("9999-12-31T23:59:59.999Z")
        );
        assert_eq!(format(Timestamp(MAX_STORABLE.0 + 1)), None);
    }

    #[test]
    fn round_trips_across_the_range() {
        let mut ms = 0u64;
        while ms < MAX_STORABLE.0 {
            let ts = Timestamp(ms);
            let text = format(ts).expect("in range");
            assert_eq!(parse(&text), Ok(ts), "{text}");
            ms = ms * 3 + 7_777_777;
        }
    }

    #[test]
    fn reads_the_other_common_forms() {
        let cases = [
            "2026-11-30T08:00:00.000Z",
            "2026-11-30T08:00:00Z",
            "2026-11-30T08:00:00",
            "2026-11-30 08:00:00",
            "2026-11-30 08:00",
            "2026-11-30t08:00:00z",
            "2026-11-30T08:00:00.0Z",
            "2026-11-30T08:00:00.000000000",
            "2026-11-30T09:00:00+01:00",
            "2026-11-30T09:00:00.000+0100",
            "2026-11-30T09:00:00+01",
            "2026-11-30T03:30:00-04:30",
            "2026-11-29T23:00:00-09:00",
        ];
        for text in cases {
            assert_eq!(parse(text), Ok(T0), "{text}");
        }
        assert_eq!(
            parse("2026-11-30T08:00:00.1239Z"),
            Ok(Timestamp(T0.0 + 123))
        );
        assert_eq!(parse("2026-11-30T08:00:00.5"), Ok(Timestamp(T0.0 + 500)));
    }

    #[test]
    fn rejects_junk_naming_the_text_and_the_reason() {
        let cases = [
            ("", "no four-digit year"),
            ("yesterday", "no four-digit year"),
            ("1796025600000", "no -MM month"),
            ("2026-11-30", "no T or space"),
            ("2026-13-01T00:00:00Z", "month out of range"),
            ("2026-02-29T00:00:00Z", "day out of range"),
            ("2024-02-30T00:00:00Z", "day out of range"),
            ("2026-11-30T24:00:00Z", "time of day out of range"),
            ("2026-11-30T08:60:00Z", "time of day out of range"),
            ("2026-11-30T08:00:00.Z", "1 to 9 digits"),
            ("2026-11-30T08:00:00.1234567890Z", "1 to 9 digits"),
            ("2026-11-30T08:00:00+25:00", "zone offset out of range"),
            ("2026-11-30T08:00:00 UTC", "unexpected text after the time"),
            ("2026-11-30T08:00:00Zjunk", "unexpected text after the zone"),
            ("1969-12-31T23:59:59Z", "before 1970"),
            ("２026-11-30T08:00:00Z", "no four-digit year"),
        ];
        for (text, reason) in cases {
            let err = parse(text).expect_err(text).to_string();
            assert!(err.contains(reason), "{text:?}: {err}");
            assert!(err.contains(&format!("{text:?}")), "{text:?}: {err}");
        }
    }
}
