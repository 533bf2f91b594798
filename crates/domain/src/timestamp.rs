//! Points in time as values. The domain never reads a clock: callers pass the time in.

use std::fmt;
use std::time::Duration;

/// Milliseconds since the Unix epoch, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The time `millis` milliseconds after the Unix epoch.
    pub fn from_millis(millis: u64) -> Self {
        Timestamp(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub fn as_millis(self) -> u64 {
        self.0
    }

    /// How long after `earlier` this is; zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    /// This time minus `d`, clamped at the epoch.
    pub fn saturating_sub(self, d: Duration) -> Timestamp {
        let millis = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_sub(millis))
    }

    /// The latest time [`Timestamp::rfc3339`] writes: 9999-12-31T23:59:59.999Z.
    pub const MAX_RFC3339: Timestamp = Timestamp(253_402_300_799_999);

    /// This time as RFC 3339 in UTC with exactly three fraction digits and a `Z`,
    /// such as `2026-11-30T08:00:00.000Z`; `None` after [`Timestamp::MAX_RFC3339`]
    /// (a five-digit year would not sort as text). The one written form of a
    /// time: the SQLite adapter stores it and the command line shows it.
    pub fn rfc3339(self) -> Option<String> {
        if self > Self::MAX_RFC3339 {
            return None;
        }
        let millis = i64::try_from(self.0).ok()?;
        let days = millis.div_euclid(MILLIS_PER_DAY);
        let in_day = millis.rem_euclid(MILLIS_PER_DAY);
        let (y, mo, d) = civil_from_days(days);
        let (h, rest) = (in_day / 3_600_000, in_day % 3_600_000);
        let (mi, rest) = (rest / 60_000, rest % 60_000);
        let (s, ms) = (rest / 1000, rest % 1000);
        Some(format!(
            "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z"
        ))
    }
}

const MILLIS_PER_DAY: i64 = 86_400_000;

/// The civil date (proleptic Gregorian) of a day count from 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_is_utc_with_milliseconds_up_to_year_9999() {
        let at = |ms| Timestamp(ms).rfc3339();
        assert_eq!(at(0).as_deref(), Some("1970-01-01T00:00:00.000Z"));
        assert_eq!(
            at(1_796_025_600_000).as_deref(),
            Some("2026-11-30T08:00:00.000Z")
        );
        // 2000-02-29, a leap day of a century leap year.
        assert_eq!(
            at(951_782_400_123).as_deref(),
            Some("2000-02-29T00:00:00.123Z")
        );
        assert_eq!(
            Timestamp::MAX_RFC3339.rfc3339().as_deref(),
            Some("9999-12-31T23:59:59.999Z")
        );
        assert_eq!(at(Timestamp::MAX_RFC3339.0 + 1), None);
    }
}
