//! Tuning of one Select call: windows, retry budgets and backoff.

use std::time::Duration;

/// The most tokens one claim may name (the lock store's window limit).
pub const MAX_BATCH_WINDOW: usize = 256;

/// The largest accepted `sufficiency_window`.
pub const MAX_SUFFICIENCY_WINDOW: usize = 256;

/// The largest accepted `page_size`.
pub const MAX_PAGE_SIZE: usize = 10_000;

/// The largest accepted `max_immediate_retries`.
pub const MAX_IMMEDIATE_RETRIES: u32 = 1_000;

/// The largest accepted `max_retries` (legs).
pub const MAX_LEGS: u32 = 1_000;

/// The longest accepted `retry_interval`.
pub const MAX_RETRY_INTERVAL: Duration = Duration::from_secs(3_600);

/// The longest accepted `deadline`.
pub const MAX_DEADLINE: Duration = Duration::from_secs(3_600);

/// The longest accepted `snapshot_ttl`.
pub const MAX_SNAPSHOT_TTL: Duration = Duration::from_secs(60);

/// The shortest accepted `deadline`.
pub const MIN_DEADLINE: Duration = Duration::from_millis(1);

/// The largest accepted `cover_band`.
pub const MAX_COVER_BAND: usize = 256;

/// The largest accepted `max_inputs`: one claim's window limit.
pub const MAX_INPUTS: usize = MAX_BATCH_WINDOW;

/// The largest accepted `consolidate_dust`.
pub const MAX_CONSOLIDATE_DUST: usize = 64;

/// The largest accepted `tidy_band`.
pub const MAX_TIDY_BAND: usize = MAX_PAGE_SIZE;

/// Which tokens a select prefers (`docs/selection.md`, "Choice").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SelectionPolicy {
    /// Few inputs: one token that covers the amount when a near-sized one exists,
    /// else a few of the largest smaller tokens drawn at random, then trimmed.
    #[default]
    CoverFirst,
    /// The upstream order: accumulate the smallest tokens until one covers the rest.
    SmallestFirst,
}

impl SelectionPolicy {
    /// Every policy, default first.
    pub const ALL: [SelectionPolicy; 2] =
        [SelectionPolicy::CoverFirst, SelectionPolicy::SmallestFirst];

    /// The name used in configuration (`cover_first`, `smallest_first`).
    pub fn as_str(self) -> &'static str {
        match self {
            SelectionPolicy::CoverFirst => "cover_first",
            SelectionPolicy::SmallestFirst => "smallest_first",
        }
    }
}

impl std::fmt::Display for SelectionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy name that is neither `cover_first` nor `smallest_first`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown selection policy {0:?}; expected cover_first or smallest_first")]
pub struct UnknownPolicy(pub String);

impl std::str::FromStr for SelectionPolicy {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SelectionPolicy::ALL
            .into_iter()
            .find(|p| p.as_str() == s.trim())
            .ok_or_else(|| UnknownPolicy(s.to_owned()))
    }
}

/// How one Select call behaves. A plain struct: set the fields, then
/// [`SelectionConfig::validate`] (which [`crate::selection::Selection::new`] calls).
///
/// The defaults are listed in `docs/configuration.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectionConfig {
    /// Which tokens a select prefers (default [`SelectionPolicy::CoverFirst`]).
    pub policy: SelectionPolicy,
    /// `cover_first`: how many candidates at least as large as the amount one read
    /// returns, smallest first (default 16).
    pub cover_band: usize,
    /// `cover_first`: prefer a token, or a pair or triple of smaller tokens read,
    /// that sums to the amount exactly, so the select needs no change; of the
    /// sets found, one of the fewest inputs (default false; a select that tidies,
    /// [`SelectionConfig::tidy_band`], looks for one of the most inputs anyway).
    pub prefer_exact: bool,
    /// `cover_first`: add up to this many of the smallest candidates read as
    /// optional inputs, to consolidate dust (default 0: none). They are the
    /// smallest of the fill band read (the largest tokens below the amount),
    /// not the wallet's smallest, and they give an exact choice change.
    pub consolidate_dust: usize,
    /// `cover_first`: when this instance has no other select on the wallet and
    /// type, a select reads up to this many candidates below the amount (its fill
    /// band) and prefers a choice that sums to the amount exactly with the most
    /// inputs (up to 3): it makes no change and spends more tokens than it
    /// mints, where that costs nobody a race (default 512; 0 turns it off;
    /// `docs/selection.md`, "A tidy wallet").
    pub tidy_band: usize,
    /// How many candidates the sufficiency window may hold, the anchor included
    /// (default 4). One of them is picked uniformly at random.
    pub sufficiency_window: usize,
    /// A candidate joins the sufficiency window only if it is at most this many
    /// times the anchor (default 5).
    pub max_sufficiency_ratio: u32,
    /// The most tokens one claim names (default 256; 1 gives single-token claims).
    pub batch_window: usize,
    /// The most tokens one select returns, its inputs (default 100, at most
    /// 256). An amount the free tokens cannot cover within it is answered
    /// [`crate::selection::SelectError::TooManyInputs`], never with a
    /// transaction no ledger would take.
    pub max_inputs: usize,
    /// How many candidates one fetch asks for (default 256); under `cover_first`,
    /// the size of the fill band (candidates smaller than the amount).
    pub page_size: usize,
    /// Refetches (or store errors) without a won lock allowed in one leg (default 5).
    pub max_immediate_retries: u32,
    /// How many legs one call may run, the first included (default 10).
    pub max_retries: u32,
    /// Backoff between legs is uniform in `[0, retry_interval)` (default 5 s).
    pub retry_interval: Duration,
    /// The longest one call may take, every wait included: a pooled connection,
    /// the wallet's line, each store call, the backoffs and wake-up waits
    /// (default 30 s). Legs and backoffs bound retries, not time. At the
    /// deadline the call answers as [`crate::selection::Selection::answer_if_stopped`]
    /// says and gives back what it holds. The engine reads no clock: its driver
    /// (`holdfast::TokenSelector`) keeps the deadline.
    pub deadline: Duration,
    /// Wait for a signal that tokens were freed as well as for the backoff, and
    /// try again at once when one comes (default true; the backoff stays the upper
    /// bound, `docs/wakeups.md`). False sleeps the whole backoff.
    pub wakeups: bool,
    /// How long the instance's snapshot of a wallet answers the first read of
    /// a select that shares the wallet and type with other selects of the
    /// instance, instead of a round trip (default 100 ms; zero reads the store
    /// always; `docs/selection.md`, "A snapshot of a hot wallet"). Claims
    /// verify every token; insufficient funds always comes from a fresh
    /// balance read.
    pub snapshot_ttl: Duration,
    /// Skip tokens that lost a race or were stale for the rest of the call
    /// (default true; false only to measure what the blacklist buys).
    pub blacklist: bool,
    /// `smallest_first`: scan candidates smallest first (default true; false
    /// shuffles each page randomly, only to measure what ordering buys).
    pub ascending: bool,
}

impl Default for SelectionConfig {
    fn default() -> Self {
        SelectionConfig {
            policy: SelectionPolicy::CoverFirst,
            cover_band: 16,
            prefer_exact: false,
            consolidate_dust: 0,
            tidy_band: 512,
            sufficiency_window: 4,
            max_sufficiency_ratio: 5,
            batch_window: MAX_BATCH_WINDOW,
            max_inputs: 100,
            page_size: 256,
            max_immediate_retries: 5,
            max_retries: 10,
            retry_interval: Duration::from_secs(5),
            deadline: Duration::from_secs(30),
            wakeups: true,
            snapshot_ttl: Duration::from_millis(100),
            blacklist: true,
            ascending: true,
        }
    }
}

/// A [`SelectionConfig`] field outside its accepted range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid selection config: {key} = {value}; expected {expected}")]
pub struct SelectionConfigError {
    /// The field name, as in [`SelectionConfig`].
    pub key: &'static str,
    /// The rejected value, as text.
    pub value: String,
    /// The accepted range, in words.
    pub expected: &'static str,
}

impl SelectionConfig {
    /// Checks every field against its range; the error names the first bad field,
    /// its value and what was expected.
    pub fn validate(&self) -> Result<(), SelectionConfigError> {
        fn bad(
            key: &'static str,
            value: impl std::fmt::Debug,
            expected: &'static str,
        ) -> Result<(), SelectionConfigError> {
            Err(SelectionConfigError {
                key,
                value: format!("{value:?}"),
                expected,
            })
        }
        if !(1..=MAX_SUFFICIENCY_WINDOW).contains(&self.sufficiency_window) {
            return bad(
                "sufficiency_window",
                self.sufficiency_window,
                "1 to 256 candidates",
            );
        }
        if self.max_sufficiency_ratio < 1 {
            return bad(
                "max_sufficiency_ratio",
                self.max_sufficiency_ratio,
                "at least 1 (times the anchor)",
            );
        }
        if !(1..=MAX_COVER_BAND).contains(&self.cover_band) {
            return bad("cover_band", self.cover_band, "1 to 256 candidates");
        }
        if self.consolidate_dust > MAX_CONSOLIDATE_DUST {
            return bad("consolidate_dust", self.consolidate_dust, "0 to 64 tokens");
        }
        if self.tidy_band > MAX_TIDY_BAND {
            return bad("tidy_band", self.tidy_band, "0 to 10000 candidates");
        }
        if !(1..=MAX_BATCH_WINDOW).contains(&self.batch_window) {
            return bad("batch_window", self.batch_window, "1 to 256 tokens");
        }
        if !(1..=MAX_INPUTS).contains(&self.max_inputs) {
            return bad("max_inputs", self.max_inputs, "1 to 256 tokens");
        }
        if !(1..=MAX_PAGE_SIZE).contains(&self.page_size) {
            return bad("page_size", self.page_size, "1 to 10000 candidates");
        }
        if self.max_immediate_retries > MAX_IMMEDIATE_RETRIES {
            return bad(
                "max_immediate_retries",
                self.max_immediate_retries,
                "0 to 1000",
            );
        }
        if !(1..=MAX_LEGS).contains(&self.max_retries) {
            return bad("max_retries", self.max_retries, "1 to 1000 legs");
        }
        if self.retry_interval.is_zero() || self.retry_interval > MAX_RETRY_INTERVAL {
            return bad(
                "retry_interval",
                self.retry_interval,
                "more than 0 and at most 1 hour",
            );
        }
        if self.deadline < MIN_DEADLINE || self.deadline > MAX_DEADLINE {
            return bad("deadline", self.deadline, "1 ms to 1 hour");
        }
        if self.snapshot_ttl > MAX_SNAPSHOT_TTL {
            return bad("snapshot_ttl", self.snapshot_ttl, "0 to 1 minute");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_design() {
        let c = SelectionConfig::default();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(
            (
                c.sufficiency_window,
                c.max_sufficiency_ratio,
                c.batch_window
            ),
            (4, 5, 256)
        );
        assert_eq!((c.max_immediate_retries, c.max_retries), (5, 10));
        assert_eq!(c.max_inputs, 100);
        assert_eq!(c.retry_interval, Duration::from_secs(5));
        assert_eq!(c.deadline, Duration::from_secs(30));
        assert_eq!(
            (c.policy, c.cover_band, c.prefer_exact, c.consolidate_dust),
            (SelectionPolicy::CoverFirst, 16, false, 0)
        );
        assert_eq!(c.tidy_band, 512);
    }

    #[test]
    fn policies_parse_by_name_and_reject_others() {
        for policy in SelectionPolicy::ALL {
            assert_eq!(policy.as_str().parse(), Ok(policy));
        }
        let err = "largest_first".parse::<SelectionPolicy>().unwrap_err();
        assert!(
            err.to_string()
                .contains("expected cover_first or smallest_first")
        );
    }

    #[test]
    fn rejects_each_out_of_range_field_by_name() {
        type Edit = fn(&mut SelectionConfig);
        let cases: &[(Edit, &str, &str)] = &[
            (|c| c.sufficiency_window = 0, "sufficiency_window", "0"),
            (|c| c.sufficiency_window = 257, "sufficiency_window", "257"),
            (
                |c| c.max_sufficiency_ratio = 0,
                "max_sufficiency_ratio",
                "0",
            ),
            (|c| c.cover_band = 0, "cover_band", "0"),
            (|c| c.cover_band = 257, "cover_band", "257"),
            (|c| c.consolidate_dust = 65, "consolidate_dust", "65"),
            (|c| c.tidy_band = 10_001, "tidy_band", "10001"),
            (|c| c.batch_window = 0, "batch_window", "0"),
            (|c| c.batch_window = 257, "batch_window", "257"),
            (|c| c.max_inputs = 0, "max_inputs", "0"),
            (|c| c.max_inputs = 257, "max_inputs", "257"),
            (|c| c.page_size = 0, "page_size", "0"),
            (|c| c.page_size = 10_001, "page_size", "10001"),
            (
                |c| c.max_immediate_retries = 1_001,
                "max_immediate_retries",
                "1001",
            ),
            (|c| c.max_retries = 0, "max_retries", "0"),
            (
                |c| c.retry_interval = Duration::ZERO,
                "retry_interval",
                "0ns",
            ),
            (
                |c| c.retry_interval = Duration::from_secs(3_601),
                "retry_interval",
                "3601s",
            ),
            (|c| c.deadline = Duration::ZERO, "deadline", "0ns"),
            (
                |c| c.deadline = Duration::from_micros(999),
                "deadline",
                "999µs",
            ),
            (
                |c| c.deadline = Duration::from_secs(3_601),
                "deadline",
                "3601s",
            ),
        ];
        for (edit, key, value) in cases {
            let mut c = SelectionConfig::default();
            edit(&mut c);
            let err = c.validate().unwrap_err();
            assert_eq!(err.key, *key);
            assert_eq!(err.value, *value);
            let text = err.to_string();
            assert!(text.contains(key) && text.contains("expected"), "{text}");
        }
    }
}
