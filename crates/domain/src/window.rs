//! The claim window and the sufficiency window of token selection
//! (`docs/selection.md`, steps 2 and 3).
//!
//! Given the candidates still usable in a scan (ascending, blacklisted ones already
//! removed), [`plan`] decides which ones the next claim names:
//!
//! - smaller tokens are accumulated smallest first, as long as they do not cover
//!   what remains;
//! - the first token that alone covers the rest is the **anchor**. The sufficiency
//!   window looks ahead at up to `sufficiency_window` candidates (the anchor
//!   included) no larger than `max_sufficiency_ratio` times the *anchor* (not the
//!   remaining amount, so a request dwarfed by every token still spreads over
//!   several), and the caller picks one of them uniformly at random;
//! - the claim stops at the first covering member, so it is the minimal covering
//!   prefix, and never names more than `batch_window` tokens.
//!
//! Planning is pure and needs no RNG; the random pick is the caller's.

use crate::quantity::Quantity;

/// The limits [`plan`] works within (taken from the selection config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowLimits {
    /// The most tokens one claim names (1 to 256).
    pub batch_window: usize,
    /// The most candidates in the sufficiency window, the anchor included.
    pub sufficiency_window: usize,
    /// Lookahead candidates may be at most this many times the anchor.
    pub max_sufficiency_ratio: u32,
}

/// What the next claim should name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowPlan {
    /// The candidates seen so far cannot decide the window and more may exist:
    /// fetch the next page, then plan again.
    NeedMore,
    /// The claim names the first `prefix` candidates and, if `anchor_choices` is
    /// not empty, exactly one of the candidates at those indices (all after the
    /// prefix, in ascending order, the anchor first). Both empty: nothing usable
    /// is left in this scan.
    Ready {
        /// How many leading candidates are accumulated (none of them covers alone).
        prefix: usize,
        /// Indices of the sufficiency window members; pick one uniformly.
        anchor_choices: Vec<usize>,
    },
}

impl WindowPlan {
    /// Whether this plan names no candidate at all (the scan is used up).
    pub fn is_empty(&self) -> bool {
        matches!(self, WindowPlan::Ready { prefix: 0, anchor_choices } if anchor_choices.is_empty())
    }
}

/// Plans the next claim over `candidates` (ascending quantities, none blacklisted)
/// for `remaining` still to cover.
///
/// `headroom` is the largest total the claim may have without the call's running
/// total overflowing 128 bits (`u128::MAX` minus what the call already won); a candidate that would exceed it is never proposed
/// (nor is anything after it, all being at least as large). `exhausted` says
/// whether the store has no candidates beyond these.
pub fn plan(
    candidates: &[Quantity],
    remaining: Quantity,
    headroom: u128,
    exhausted: bool,
    limits: WindowLimits,
) -> WindowPlan {
    let batch = limits.batch_window.max(1);
    let mut accumulated = Quantity::ZERO;
    let mut index = 0;
    while index < batch {
        let Some(&quantity) = candidates.get(index) else {
            return if exhausted {
                ready(index, Vec::new())
            } else {
                WindowPlan::NeedMore
            };
        };
        let need = remaining.saturating_sub(accumulated);
        if quantity < need {
            // Cannot overflow: accumulated + quantity < remaining.
            accumulated = accumulated.checked_add(quantity).unwrap_or(remaining);
            index += 1;
            continue;
        }
        let fits = |q: Quantity| {
            accumulated
                .checked_add(q)
                .is_some_and(|total| total.value() <= headroom)
        };
        if !fits(quantity) {
            return ready(index, Vec::new());
        }
        return sufficiency_window(candidates, index, exhausted, limits, fits)
            .map_or(WindowPlan::NeedMore, |choices| ready(index, choices));
    }
    ready(index, Vec::new())
}

/// The sufficiency window anchored at `anchor` (indices into `candidates`,
/// ascending), or `None` when more candidates are needed to decide it. Also the
/// single-cover window of `cover_first`.
pub(crate) fn sufficiency_window(
    candidates: &[Quantity],
    anchor: usize,
    exhausted: bool,
    limits: WindowLimits,
    fits: impl Fn(Quantity) -> bool,
) -> Option<Vec<usize>> {
    let threshold = candidates[anchor]
        .value()
        .saturating_mul(u128::from(limits.max_sufficiency_ratio));
    let mut choices = vec![anchor];
    let mut next = anchor + 1;
    while choices.len() < limits.sufficiency_window.max(1) {
        match candidates.get(next) {
            None if exhausted => break,
            None => return None,
            Some(q) if q.value() <= threshold && fits(*q) => choices.push(next),
            // Ascending: everything after is larger too.
            Some(_) => break,
        }
        next += 1;
    }
    Some(choices)
}

fn ready(prefix: usize, anchor_choices: Vec<usize>) -> WindowPlan {
    WindowPlan::Ready {
        prefix,
        anchor_choices,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantity::Precision;

    fn q(v: u128) -> Quantity {
        Quantity::new(v, Precision::MAX).unwrap()
    }

    fn qs(vs: &[u128]) -> Vec<Quantity> {
        vs.iter().map(|v| q(*v)).collect()
    }

    const LIMITS: WindowLimits = WindowLimits {
        batch_window: 256,
        sufficiency_window: 4,
        max_sufficiency_ratio: 5,
    };
    fn max() -> u128 {
        u128::MAX
    }

    #[test]
    fn anchor_window_is_capped_by_count_and_ratio() {
        let c = qs(&[2, 3, 4, 5, 6, 200]);
        assert_eq!(
            plan(&c, q(1), max(), true, LIMITS),
            ready(0, vec![0, 1, 2, 3])
        );
        let c = qs(&[2, 9, 11, 200]);
        assert_eq!(plan(&c, q(1), max(), true, LIMITS), ready(0, vec![0, 1]));
    }

    #[test]
    fn accumulates_small_tokens_then_anchors() {
        let c = qs(&[1, 1, 1, 5, 6]);
        // Remaining 4: 1+1+1 = 3, then 5 covers the last 1; 6 joins (6 <= 25).
        assert_eq!(plan(&c, q(4), max(), true, LIMITS), ready(3, vec![3, 4]));
    }

    #[test]
    fn asks_for_more_until_the_window_is_decided() {
        let c = qs(&[1, 1]);
        assert_eq!(plan(&c, q(5), max(), false, LIMITS), WindowPlan::NeedMore);
        assert_eq!(plan(&c, q(5), max(), true, LIMITS), ready(2, vec![]));
        let c = qs(&[10, 11]);
        assert_eq!(plan(&c, q(5), max(), false, LIMITS), WindowPlan::NeedMore);
        assert_eq!(plan(&c, q(5), max(), true, LIMITS), ready(0, vec![0, 1]));
        assert!(plan(&[], q(5), max(), true, LIMITS).is_empty());
    }

    #[test]
    fn batch_window_bounds_the_prefix() {
        let c = qs(&[1; 300]);
        let limits = WindowLimits {
            batch_window: 256,
            ..LIMITS
        };
        assert_eq!(plan(&c, q(1000), max(), false, limits), ready(256, vec![]));
        let single = WindowLimits {
            batch_window: 1,
            ..LIMITS
        };
        assert_eq!(plan(&c, q(1000), max(), false, single), ready(1, vec![]));
    }

    #[test]
    fn never_proposes_a_total_beyond_the_headroom() {
        let c = qs(&[1, 10, 20]);
        assert_eq!(plan(&c, q(5), 15, true, LIMITS), ready(1, vec![1]));
        assert_eq!(plan(&c, q(5), 5, true, LIMITS), ready(1, vec![]));
    }
}
