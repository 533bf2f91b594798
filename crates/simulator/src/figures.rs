//! The figures of a strategy run, as the human table, the JSON and the HTML report
//! show them. Field names are the JSON names (`selects_per_second`, ...).

use std::time::Duration;

use serde::Serialize;

use super::runner::StrategyRun;

/// Select latency percentiles in milliseconds (nearest rank).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencyMs {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Slowest.
    pub max: f64,
}

/// The figures of one strategy of a token workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StrategyFigures {
    /// `naive`, `holdfast`, `holdfast-no-<mechanism>` or `holdfast-smallest-first`.
    pub strategy: String,
    /// Select calls made.
    pub selects: u64,
    /// Select calls that succeeded.
    pub succeeded: u64,
    /// Successful selects per wall second of the request phase.
    pub selects_per_second: f64,
    /// Selects that finally failed (insufficient funds, or funds still locked after
    /// the last leg) while the wallet's unspent balance, locks ignored, measured
    /// when the failure was returned, covered the request. Must be zero.
    pub spurious_failures: u64,
    /// Selects that failed because the balance did not cover the request.
    pub insufficient_funds: u64,
    /// Selects that failed with a store error.
    pub errors: u64,
    /// Tokens named in claims, per select.
    pub lock_attempts_per_select: f64,
    /// Contended verdicts (lost races), per select.
    pub conflicts_per_select: f64,
    /// Share of all conflicts that hit the most contended token.
    pub hottest_token_conflict_share: f64,
    /// Share of all conflicts that hit the most contended 1% of the tokens that
    /// existed during the run (at least one token).
    pub top_1pct_conflict_share: f64,
    /// Distinct tokens named in at least one claim.
    pub distinct_tokens_attempted: u64,
    /// How far concurrent claims spread: per burst of as many claims as selects
    /// run at once (in the order they were answered), the distinct tokens named
    /// over the tokens named, averaged; 1 when concurrent selects never named
    /// one token twice.
    pub distinct_share_per_burst: f64,
    /// Store round trips of the select calls (fetches, claims, balance reads,
    /// releases), per select.
    pub round_trips_per_select: f64,
    /// Tokens in a successful selection, on average (the inputs a transaction
    /// spends): fewer means fewer locks held and fewer change outputs to come.
    pub inputs_per_select: f64,
    /// Share of the successful selects whose tokens exceeded the amount, leaving
    /// a non-zero change (0 to 1).
    pub change_share: f64,
    /// Select latency, backoffs included.
    pub latency_ms: LatencyMs,
    /// Peak resident memory of the process during the request phase (VmHWM).
    pub peak_memory_bytes: Option<u64>,
    /// Locks in the database when the run finished.
    pub locks_left: u64,
    /// Double claims, spent tokens selected and selected tokens a confirmed
    /// settlement left spendable. Must be zero.
    pub invariant_violations: u64,
    /// Tokens returned to a consumer while another live consumer held them.
    pub double_claims: u64,
    /// Tokens returned after they were spent.
    pub spent_selected: u64,
    /// Settlements (or change mints) that failed in the store.
    pub settle_errors: u64,
    /// Locks a select found taken by the lease sweep when it re-checked them
    /// before answering (it gave them back and selected again): zero unless a
    /// select outlived half the lease. Confirmed still spends what a transaction
    /// selected when the sweep took its lock later; a spend left out counts as an
    /// invariant violation.
    pub locks_lost_to_lease: u64,
    /// Selects that answered only after the (simulated) lease had run out.
    pub selects_outliving_lease: u64,
    /// Wall time of the request phase, in seconds.
    pub wall_seconds: f64,
}

/// `n` as a float (exact below 2^53, which every count here is).
pub fn to_f64(n: u64) -> f64 {
    let high = u32::try_from(n >> 32).unwrap_or(u32::MAX);
    let low = u32::try_from(n & 0xffff_ffff).unwrap_or(u32::MAX);
    f64::from(high) * 4_294_967_296.0 + f64::from(low)
}

/// `x` rounded to 3 decimals (the JSON carries no false precision).
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn ratio(numerator: u64, denominator: u64) -> f64 {
    if denominator == 0 {
        0.0
    } else {
        round3(to_f64(numerator) / to_f64(denominator))
    }
}

fn ms(d: Duration) -> f64 {
    round3(d.as_secs_f64() * 1000.0)
}

/// The nearest-rank percentile `p` (1 to 100) of sorted values.
pub fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

/// Per-token conflict counts, most contended first (tokens without conflicts left out).
pub fn conflicts_by_token(run: &StrategyRun) -> Vec<u64> {
    let mut counts: Vec<u64> = run
        .claims
        .iter()
        .map(|(_, c)| c.conflicts)
        .filter(|&c| c > 0)
        .collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    counts
}

impl StrategyFigures {
    /// The figures of `run`.
    pub fn of(run: &StrategyRun) -> StrategyFigures {
        let samples = &run.samples;
        let selects = u64::try_from(samples.len()).unwrap_or(u64::MAX);
        let count = |f: fn(&super::runner::Sample) -> bool| {
            u64::try_from(samples.iter().filter(|s| f(s)).count()).unwrap_or(u64::MAX)
        };
        let succeeded = count(|s| s.ok);
        let lock_attempts: u64 = samples.iter().map(|s| s.lock_attempts).sum();
        let round_trips: u64 = samples.iter().map(|s| s.round_trips).sum();
        let inputs: u64 = samples.iter().filter(|s| s.ok).map(|s| s.inputs).sum();
        let with_change = count(|s| s.ok && s.change);
        let per_token = conflicts_by_token(run);
        let total_conflicts: u64 = per_token.iter().sum();
        let top_n = usize::try_from(run.population.div_ceil(100).max(1)).unwrap_or(usize::MAX);
        let top: u64 = per_token.iter().take(top_n).sum();
        let mut latencies: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
        latencies.sort_unstable();
        let wall = run.wall.as_secs_f64();
        let violations = run.violations;
        StrategyFigures {
            strategy: run.strategy.name(),
            selects,
            succeeded,
            selects_per_second: if wall > 0.0 {
                round3(to_f64(succeeded) / wall)
            } else {
                0.0
            },
            spurious_failures: count(|s| s.spurious),
            insufficient_funds: count(|s| s.insufficient),
            errors: count(|s| s.error),
            lock_attempts_per_select: ratio(lock_attempts, selects),
            conflicts_per_select: ratio(total_conflicts, selects),
            hottest_token_conflict_share: ratio(
                per_token.first().copied().unwrap_or(0),
                total_conflicts,
            ),
            top_1pct_conflict_share: ratio(top, total_conflicts),
            distinct_tokens_attempted: u64::try_from(
                run.claims.iter().filter(|(_, c)| c.attempts > 0).count(),
            )
            .unwrap_or(u64::MAX),
            distinct_share_per_burst: round3(run.distinct_share_per_burst),
            round_trips_per_select: ratio(round_trips, selects),
            inputs_per_select: ratio(inputs, succeeded),
            change_share: ratio(with_change, succeeded),
            latency_ms: LatencyMs {
                p50: ms(percentile(&latencies, 50)),
                p95: ms(percentile(&latencies, 95)),
                p99: ms(percentile(&latencies, 99)),
                max: ms(latencies.last().copied().unwrap_or_default()),
            },
            peak_memory_bytes: run.peak_memory_bytes,
            locks_left: run.locks_left,
            invariant_violations: violations.double_claims
                + violations.spent_selected
                + violations.confirmed_left_spendable,
            double_claims: violations.double_claims,
            spent_selected: violations.spent_selected,
            settle_errors: violations.settle_errors,
            locks_lost_to_lease: violations.lost_to_lease,
            selects_outliving_lease: violations.outlived_lease,
            wall_seconds: round3(wall),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::runner::{Sample, Violations};
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 50), Duration::from_millis(50));
        assert_eq!(percentile(&v, 99), Duration::from_millis(99));
        assert_eq!(percentile(&v[..1], 99), Duration::from_millis(1));
        assert_eq!(percentile(&[], 50), Duration::ZERO);
    }

    fn sample(ok: bool, inputs: u64, change: bool) -> Sample {
        Sample {
            ok,
            insufficient: !ok,
            spurious: false,
            error: false,
            lock_attempts: inputs,
            conflicts: 0,
            round_trips: 2,
            inputs,
            change,
            latency: Duration::from_millis(1),
            finished_at: Duration::from_millis(1),
        }
    }

    #[test]
    fn inputs_and_change_count_successful_selects_only() {
        let run = StrategyRun {
            strategy: crate::Strategy::Holdfast,
            samples: vec![
                sample(true, 1, false),
                sample(true, 3, true),
                sample(true, 2, true),
                sample(true, 2, false),
                // A failure selects nothing and must not dilute either figure.
                sample(false, 0, false),
            ],
            claims: Vec::new(),
            distinct_share_per_burst: 1.0,
            population: 10,
            wall: Duration::from_secs(1),
            peak_memory_bytes: None,
            locks_left: 0,
            violations: Violations::default(),
        };
        let f = StrategyFigures::of(&run);
        assert_eq!(f.succeeded, 4);
        assert_eq!(f.inputs_per_select, 2.0);
        assert_eq!(f.change_share, 0.5);
        let none = StrategyRun {
            samples: vec![sample(false, 0, false)],
            ..run
        };
        let f = StrategyFigures::of(&none);
        assert_eq!((f.inputs_per_select, f.change_share), (0.0, 0.0));
    }

    #[test]
    fn floats_of_counts_are_exact() {
        assert_eq!(to_f64(0), 0.0);
        assert_eq!(to_f64(12_345), 12_345.0);
        assert_eq!(to_f64(1 << 40), 1_099_511_627_776.0);
    }
}
