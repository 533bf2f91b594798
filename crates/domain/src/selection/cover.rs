//! The `cover_first` choice (`docs/selection.md`, "Choice"): which of the
//! candidates read the next claim names, preferring few inputs.
//!
//! With R the amount still to cover, the candidates split into *cover* candidates
//! (amount >= R, smallest first) and *fill* candidates (amount < R, largest first).
//! In order:
//!
//! 1. **exact** (`prefer_exact`, or a tidying scan): a cover candidate equal to
//!    R, a pair of any fill candidates read, or a triple (its two largest among
//!    the 200 largest distinct fill amounts) summing to R, so the select makes no
//!    change: of the fewest inputs under `prefer_exact`, of the most (up to 3)
//!    when the scan tidies (no other caller of the wallet in this instance);
//! 2. **single cover**: if the smallest cover candidate (the anchor) is at most
//!    `max_sufficiency_ratio` x R, one of up to `sufficiency_window` cover
//!    candidates no larger than the ratio x the anchor, picked at random: one input,
//!    and concurrent callers spread over near-equal tokens;
//! 3. **fill**: otherwise a random draw from the largest fill candidates until R is
//!    covered, then inputs that are not needed are dropped, smallest first. The
//!    draw is from every candidate read of which any n cover R (n the fewest that
//!    can), so concurrent callers spread as thin as the read allows. If the fill
//!    candidates cannot cover R, the anchor after all;
//! 4. **dust** (opt-in `consolidate_dust = k`): up to k of the smallest remaining
//!    fill candidates join as optional inputs, unless the choice is exact.
//!
//! No choice names more than `max_inputs` tokens (what the select has won in
//! this leg counted). An amount that the fill candidates read cover only with
//! more, and no cover candidate covers, is [`CoverPlan::OverCap`]: the fill band
//! holds the largest tokens below R, so no further page can do with fewer.
//!
//! Pure: the caller passes its RNG, so a seeded RNG replays the choice.

use std::collections::HashMap;

use rand::Rng;
use rand::seq::{IndexedRandom, SliceRandom};

use crate::quantity::Quantity;
use crate::window::{self, WindowLimits};

/// Cover candidates a read asks for per caller of the wallet and type that the
/// instance sees (this one included), beyond the configured `cover_band`.
pub(crate) const COVER_PER_CALLER: usize = 24;

/// Sufficiency-window members per caller the instance sees, beyond the
/// configured `sufficiency_window`.
pub(crate) const WINDOW_PER_CALLER: usize = 24;

/// The cover band of a read with `callers` concurrent callers of the wallet and
/// type in this instance: wide enough that they can land on different tokens;
/// as configured for a caller alone.
pub(crate) fn spread_band(configured: usize, callers: usize) -> usize {
    spread(
        configured,
        callers,
        COVER_PER_CALLER,
        crate::selection::MAX_COVER_BAND,
    )
}

/// The sufficiency window with `callers` concurrent callers (as
/// [`spread_band`]).
pub(crate) fn spread_window(configured: usize, callers: usize) -> usize {
    spread(
        configured,
        callers,
        WINDOW_PER_CALLER,
        crate::selection::MAX_SUFFICIENCY_WINDOW,
    )
}

fn spread(configured: usize, callers: usize, per_caller: usize, max: usize) -> usize {
    if callers <= 1 {
        return configured;
    }
    configured.max(callers.saturating_mul(per_caller)).min(max)
}

/// How many distinct fill amounts (largest first) the exact search takes the
/// two largest members of a triple from: about 200^2 / 2 lookups.
const EXACT_TRIPLE_LIMIT: usize = 200;

/// How many exact triples the search collects before it picks one.
const EXACT_SETS_KEPT: usize = 64;

/// Whether, and how, a choice looks for a set that sums to R exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exact {
    /// Not at all.
    Off,
    /// `prefer_exact`: an exact set of the fewest inputs found.
    FewestInputs,
    /// A tidying scan: an exact set of the most inputs found (up to 3).
    MostInputs,
}

/// The limits of one choice (taken from the selection config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CoverLimits {
    pub(crate) batch_window: usize,
    pub(crate) sufficiency_window: usize,
    pub(crate) max_sufficiency_ratio: u32,
    pub(crate) exact: Exact,
    pub(crate) consolidate_dust: usize,
    /// How many more inputs the select may take.
    pub(crate) max_inputs: usize,
}

/// What the next claim should name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CoverPlan {
    /// Claim the candidates at these indices.
    Claim(Vec<usize>),
    /// No cover candidate, and the fill candidates read so far cannot cover R:
    /// read the next fill page.
    MoreFill,
    /// Nothing read can cover R (and no more fill is to be read).
    Nothing,
    /// Only more than `max_inputs` tokens can cover R.
    OverCap,
}

/// What of the fill band is still to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fill {
    /// Nothing: the fill candidates read are all there are (or worth reading).
    Exhausted,
    /// A further fill page may hold more.
    MorePages,
    /// The store left the fill band unread, a single cover being expected
    /// ([`crate::Bands::fill_unless_cover_at_most`]).
    Unread,
}

/// Chooses among `candidates` (any order, none blacklisted or already won) for
/// `remaining` still to cover. `headroom` bounds the claim's total (as in
/// [`crate::window::plan`]); `fill` says what of the fill band is still to read:
/// when it was left unread and no single cover in the window can be chosen, the
/// fill band is read before anything else is chosen.
pub(crate) fn plan(
    candidates: &[Quantity],
    remaining: Quantity,
    headroom: u128,
    fill_left: Fill,
    limits: CoverLimits,
    rng: &mut (impl Rng + ?Sized),
) -> CoverPlan {
    let fits = |q: Quantity| q.value() <= headroom;
    // Stable sorts keep the caller's shuffle of equal amounts.
    let mut cover: Vec<usize> = (0..candidates.len())
        .filter(|&i| candidates[i] >= remaining && fits(candidates[i]))
        .collect();
    cover.sort_by_key(|&i| candidates[i]);
    let mut fill: Vec<usize> = (0..candidates.len())
        .filter(|&i| candidates[i] < remaining)
        .collect();
    fill.sort_by(|&a, &b| candidates[b].cmp(&candidates[a]));

    let chosen = exact(candidates, &cover, &fill, remaining, headroom, limits, rng)
        .or_else(|| single_cover(candidates, &cover, remaining, limits, rng));
    if chosen.is_none() && fill_left == Fill::Unread {
        return CoverPlan::MoreFill;
    }
    let chosen = chosen
        .or_else(|| draw_fill(candidates, &fill, remaining, headroom, limits, rng))
        .or_else(|| anchor_window(candidates, &cover, limits, rng));
    let Some(mut chosen) = chosen else {
        // The fill candidates read cover R, but not within the cap (draw_fill
        // takes the fewest, the largest, when the cap allows them).
        let all: u128 = fill
            .iter()
            .fold(0, |sum, &i| sum.saturating_add(candidates[i].value()));
        if all >= remaining.value() {
            return CoverPlan::OverCap;
        }
        return match fill_left {
            Fill::Exhausted => CoverPlan::Nothing,
            Fill::MorePages | Fill::Unread => CoverPlan::MoreFill,
        };
    };
    add_dust(candidates, &fill, remaining, &mut chosen, headroom, limits);
    CoverPlan::Claim(chosen)
}

/// A set of candidates summing to R exactly: a cover candidate equal to R, a
/// pair of fill candidates (any two read), or a triple (its two largest among
/// the [`EXACT_TRIPLE_LIMIT`] largest distinct fill amounts, its third any
/// candidate read). [`Exact::FewestInputs`] takes a set of the fewest inputs
/// found, [`Exact::MostInputs`] one of the most (up to 3, within the batch
/// window and the cap); among those, one at random, with random members of
/// each amount.
fn exact(
    candidates: &[Quantity],
    cover: &[usize],
    fill: &[usize],
    remaining: Quantity,
    headroom: u128,
    limits: CoverLimits,
    rng: &mut (impl Rng + ?Sized),
) -> Option<Vec<usize>> {
    if limits.exact == Exact::Off || remaining.value() > headroom {
        return None;
    }
    let target = remaining.value();
    let largest = limits.batch_window.min(limits.max_inputs).min(3);
    // Distinct fill amounts, descending, each with its candidates.
    let mut groups: Vec<(u128, Vec<usize>)> = Vec::new();
    for &i in fill {
        let v = candidates[i].value();
        match groups.last_mut() {
            Some((last, members)) if *last == v => members.push(i),
            _ => groups.push((v, vec![i])),
        }
    }
    let group_of: HashMap<u128, usize> = groups
        .iter()
        .enumerate()
        .map(|(g, (v, _))| (*v, g))
        .collect();
    // Enough candidates of each amount (a pair of one amount needs two of it).
    let enough = |set: &[usize]| {
        set.iter()
            .all(|g| groups[*g].1.len() >= set.iter().filter(|h| *h == g).count())
    };
    let sets_of = |size: usize| -> Vec<Vec<usize>> {
        let mut found = Vec::new();
        match size {
            2 => {
                for (a, (va, _)) in groups.iter().enumerate() {
                    // a >= b: a is at least half of R.
                    if va.saturating_mul(2) < target {
                        break;
                    }
                    if let Some(&b) = group_of.get(&(target - va))
                        && b >= a
                        && enough(&[a, b])
                    {
                        found.push(vec![a, b]);
                    }
                }
            }
            3 => {
                let top = groups.len().min(EXACT_TRIPLE_LIMIT);
                'outer: for a in 0..top {
                    for b in a..top {
                        let pair = groups[a].0.saturating_add(groups[b].0);
                        if pair >= target {
                            continue;
                        }
                        let Some(&c) = group_of.get(&(target - pair)) else {
                            // Smaller b only leave more for c, which must be <= b.
                            if target - pair > groups[b].0 {
                                break;
                            }
                            continue;
                        };
                        if c >= b && enough(&[a, b, c]) {
                            found.push(vec![a, b, c]);
                            if found.len() == EXACT_SETS_KEPT {
                                break 'outer;
                            }
                        }
                    }
                }
            }
            _ => {}
        }
        found
    };
    let sizes: Vec<usize> = match limits.exact {
        Exact::MostInputs => (1..=largest).rev().collect(),
        _ => (1..=largest).collect(),
    };
    for size in sizes {
        if size == 1 {
            let equal: Vec<usize> = cover
                .iter()
                .copied()
                .take_while(|&i| candidates[i] == remaining)
                .collect();
            if let Some(&one) = equal.choose(rng) {
                return Some(vec![one]);
            }
            continue;
        }
        let mut found = sets_of(size);
        if found.is_empty() {
            continue;
        }
        let set = found.swap_remove(rng.random_range(0..found.len()));
        let mut chosen: Vec<usize> = Vec::with_capacity(set.len());
        for &g in &set {
            let mut members = groups[g].1.clone();
            members.retain(|i| !chosen.contains(i));
            chosen.push(*members.choose(rng)?);
        }
        return Some(chosen);
    }
    None
}

/// One of the anchor's sufficiency window, if the anchor is near-sized.
fn single_cover(
    candidates: &[Quantity],
    cover: &[usize],
    remaining: Quantity,
    limits: CoverLimits,
    rng: &mut (impl Rng + ?Sized),
) -> Option<Vec<usize>> {
    let &anchor = cover.first()?;
    let bound = remaining
        .value()
        .saturating_mul(u128::from(limits.max_sufficiency_ratio));
    if candidates[anchor].value() > bound {
        return None;
    }
    anchor_window(candidates, cover, limits, rng)
}

/// One member of the anchor's sufficiency window (the rule of
/// [`window::sufficiency_window`], extended through the run of amounts equal to
/// its last member), picked uniformly.
fn anchor_window(
    candidates: &[Quantity],
    cover: &[usize],
    limits: CoverLimits,
    rng: &mut (impl Rng + ?Sized),
) -> Option<Vec<usize>> {
    if cover.is_empty() {
        return None;
    }
    let amounts: Vec<Quantity> = cover.iter().map(|&i| candidates[i]).collect();
    let window_limits = WindowLimits {
        batch_window: limits.batch_window,
        sufficiency_window: limits.sufficiency_window,
        max_sufficiency_ratio: limits.max_sufficiency_ratio,
    };
    // Cover holds only candidates that fit the headroom; all of it is read.
    let positions = window::sufficiency_window(&amounts, 0, true, window_limits, |_| true)?;
    let mut members: Vec<usize> = positions.into_iter().map(|p| cover[p]).collect();
    extend_through_equal_run(candidates, cover, &mut members);
    match members.len() {
        0 | 1 => Some(vec![cover[0]]),
        n => Some(vec![members[rng.random_range(0..n)]]),
    }
}

/// Extends `prefix` (a prefix of `sorted`) with the rest of the run of amounts
/// equal to its last member: equal tokens serve alike, and every one more to draw
/// from spreads concurrent callers thinner.
fn extend_through_equal_run(candidates: &[Quantity], sorted: &[usize], prefix: &mut Vec<usize>) {
    let Some(&last) = prefix.last() else {
        return;
    };
    let run = sorted[prefix.len()..]
        .iter()
        .take_while(|&&i| candidates[i] == candidates[last]);
    prefix.extend(run);
}

/// A random draw from the largest fill candidates until R is covered, trimmed of
/// inputs that are not needed (smallest first); `None` when the fill candidates
/// cannot cover R. More than a batch window of inputs: the largest batch window
/// (a partial claim; the rest is chosen after it).
fn draw_fill(
    candidates: &[Quantity],
    fill: &[usize],
    remaining: Quantity,
    headroom: u128,
    limits: CoverLimits,
    rng: &mut (impl Rng + ?Sized),
) -> Option<Vec<usize>> {
    let value = |i: usize| candidates[i].value();
    let target = remaining.value();
    // How many of the largest cover R.
    let mut sum = 0u128;
    let needed = fill.iter().position(|&i| {
        sum = sum.saturating_add(value(i));
        sum >= target
    })? + 1;
    if needed > limits.max_inputs {
        return None;
    }
    let batch = limits.batch_window.max(1);
    if needed > batch {
        return Some(fill[..batch].to_vec());
    }
    // The pool: every candidate read such that any `needed` of the pool still
    // cover R (the smallest `needed` of a descending prefix are its last ones),
    // and at least `sufficiency_window - 1` beyond the `needed` largest.
    let mut interchangeable = needed;
    let mut window = fill[..needed]
        .iter()
        .fold(0u128, |sum, &i| sum.saturating_add(value(i)));
    while let Some(&next) = fill.get(interchangeable) {
        window = (window - value(fill[interchangeable - needed])).saturating_add(value(next));
        if window < target {
            break;
        }
        interchangeable += 1;
    }
    let pool_size = (needed + limits.sufficiency_window.max(1) - 1)
        .max(interchangeable)
        .min(fill.len());
    let mut pool = fill[..pool_size].to_vec();
    extend_through_equal_run(candidates, fill, &mut pool);
    pool.shuffle(rng);
    let mut chosen = Vec::new();
    let mut total = 0u128;
    for i in pool {
        if total >= target {
            break;
        }
        total = total.saturating_add(value(i));
        chosen.push(i);
    }
    // Drop what is not needed, smallest first.
    chosen.sort_by_key(|&i| candidates[i]);
    let mut kept = Vec::with_capacity(chosen.len());
    for (n, &i) in chosen.iter().enumerate() {
        if total - value(i) >= target {
            total -= value(i);
        } else {
            kept.push(i);
            kept.extend_from_slice(&chosen[n + 1..]);
            break;
        }
    }
    kept.sort_by(|&a, &b| candidates[b].cmp(&candidates[a]));
    if kept.len() > limits.max_inputs {
        // The draw took more of the smaller ones than the cap allows: the
        // fewest, the largest, instead.
        kept = fill[..needed].to_vec();
        total = kept
            .iter()
            .fold(0u128, |sum, &i| sum.saturating_add(value(i)));
    }
    kept.truncate(batch);
    (total <= headroom).then_some(kept)
}

/// Adds up to `consolidate_dust` of the smallest fill candidates not chosen yet,
/// within the batch window and the headroom; none to an exact choice.
fn add_dust(
    candidates: &[Quantity],
    fill: &[usize],
    remaining: Quantity,
    chosen: &mut Vec<usize>,
    headroom: u128,
    limits: CoverLimits,
) {
    let mut total = chosen
        .iter()
        .fold(0u128, |sum, &i| sum.saturating_add(candidates[i].value()));
    // An exact choice stays exact: dust would give it change.
    if limits.consolidate_dust == 0 || total == remaining.value() {
        return;
    }
    let room = limits
        .batch_window
        .min(limits.max_inputs)
        .saturating_sub(chosen.len());
    let dust: Vec<usize> = fill
        .iter()
        .rev()
        .copied()
        .filter(|i| !chosen.contains(i))
        .take(limits.consolidate_dust.min(room))
        .collect();
    for i in dust {
        match total.checked_add(candidates[i].value()) {
            Some(t) if t <= headroom => {
                total = t;
                chosen.push(i);
            }
            _ => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantity::Precision;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn qs(vs: &[u128]) -> Vec<Quantity> {
        vs.iter()
            .map(|v| Quantity::new(*v, Precision::MAX).unwrap())
            .collect()
    }

    fn q(v: u128) -> Quantity {
        Quantity::new(v, Precision::MAX).unwrap()
    }

    const LIMITS: CoverLimits = CoverLimits {
        batch_window: 256,
        sufficiency_window: 4,
        max_sufficiency_ratio: 5,
        exact: Exact::Off,
        consolidate_dust: 0,
        max_inputs: 100,
    };

    /// The amounts a plan claims, ascending.
    fn claimed(c: &[Quantity], plan: CoverPlan) -> Vec<u128> {
        let CoverPlan::Claim(indices) = plan else {
            panic!("expected a claim, got {plan:?}");
        };
        let mut v: Vec<u128> = indices.iter().map(|&i| c[i].value()).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn one_near_sized_token_covers_alone() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let c = qs(&[1, 1, 1, 50]);
        assert_eq!(
            claimed(
                &c,
                plan(&c, q(10), u128::MAX, Fill::Exhausted, LIMITS, &mut rng)
            ),
            [50]
        );
        let mut c = qs(&[1; 300]);
        c.push(q(1000));
        assert_eq!(
            claimed(
                &c,
                plan(&c, q(1000), u128::MAX, Fill::Exhausted, LIMITS, &mut rng)
            ),
            [1000]
        );
    }

    #[test]
    fn single_cover_spreads_over_the_sufficiency_window() {
        let c = qs(&[10, 11, 12, 13, 14, 49]);
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            seen.extend(claimed(
                &c,
                plan(&c, q(10), u128::MAX, Fill::Exhausted, LIMITS, &mut rng),
            ));
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), [10, 11, 12, 13]);
    }

    #[test]
    fn equal_amounts_beyond_the_window_join_it() {
        // Six tokens of 10: the window of four takes the whole run.
        let c = qs(&[10, 10, 10, 10, 10, 10, 11]);
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let CoverPlan::Claim(i) = plan(&c, q(10), u128::MAX, Fill::Exhausted, LIMITS, &mut rng)
            else {
                panic!("a claim");
            };
            seen.extend(i);
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_far_too_large_anchor_gives_way_to_a_few_large_fill_tokens() {
        // 1000 > 5 x 60: fill from the largest smaller tokens instead.
        let c = qs(&[1, 2, 3, 30, 31, 32, 1000]);
        for seed in 0..32 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let got = claimed(
                &c,
                plan(&c, q(60), u128::MAX, Fill::Exhausted, LIMITS, &mut rng),
            );
            assert_eq!(got.len(), 2, "{got:?}");
            assert!(got.iter().sum::<u128>() >= 60, "{got:?}");
        }
    }

    #[test]
    fn the_anchor_is_used_when_the_fill_cannot_cover() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let c = qs(&[1, 2, 1000]);
        assert_eq!(
            claimed(
                &c,
                plan(&c, q(10), u128::MAX, Fill::Exhausted, LIMITS, &mut rng)
            ),
            [1000]
        );
        let c = qs(&[1, 2]);
        assert_eq!(
            plan(&c, q(10), u128::MAX, Fill::MorePages, LIMITS, &mut rng),
            CoverPlan::MoreFill
        );
        assert_eq!(
            plan(&c, q(10), u128::MAX, Fill::Exhausted, LIMITS, &mut rng),
            CoverPlan::Nothing
        );
    }

    #[test]
    fn the_draw_spreads_over_every_token_of_which_any_two_cover() {
        // 60 is covered by any two of 30..=40 (30 + 29 would not: 29 stays out).
        let mut values: Vec<u128> = (30..=40).collect();
        values.extend([29, 5, 1000]);
        let c = qs(&values);
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let got = claimed(
                &c,
                plan(&c, q(60), u128::MAX, Fill::Exhausted, LIMITS, &mut rng),
            );
            assert_eq!(got.len(), 2, "{got:?}");
            seen.extend(got);
        }
        assert_eq!(
            seen.into_iter().collect::<Vec<_>>(),
            (30..=40).collect::<Vec<_>>()
        );
    }

    #[test]
    fn trimming_drops_inputs_that_are_not_needed() {
        // The largest two (9 + 8) cover 15; a draw that took 7 or 6 as well drops
        // what is not needed.
        let c = qs(&[9, 8, 7, 6]);
        for seed in 0..32 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let got = claimed(
                &c,
                plan(&c, q(15), u128::MAX, Fill::Exhausted, LIMITS, &mut rng),
            );
            let total: u128 = got.iter().sum();
            assert!(total >= 15, "{got:?}");
            assert!(
                got.iter().all(|v| total - v < 15),
                "{got:?} keeps an input it does not need"
            );
        }
    }

    #[test]
    fn exact_prefers_a_changeless_set_when_asked() {
        let exact = CoverLimits {
            exact: Exact::FewestInputs,
            ..LIMITS
        };
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let c = qs(&[5, 12, 20, 21]);
        assert_eq!(
            claimed(
                &c,
                plan(&c, q(20), u128::MAX, Fill::Exhausted, exact, &mut rng)
            ),
            [20]
        );
        let c = qs(&[3, 5, 9, 11, 40]);
        assert_eq!(
            claimed(
                &c,
                plan(&c, q(16), u128::MAX, Fill::Exhausted, exact, &mut rng)
            ),
            [5, 11]
        );
        assert_eq!(
            claimed(
                &c,
                plan(&c, q(17), u128::MAX, Fill::Exhausted, exact, &mut rng)
            ),
            [3, 5, 9]
        );
        // Without it, the near-sized cover token.
        assert_eq!(
            claimed(
                &c,
                plan(&c, q(16), u128::MAX, Fill::Exhausted, LIMITS, &mut rng)
            ),
            [40]
        );
    }

    #[test]
    fn a_tidying_choice_takes_the_exact_set_of_the_most_inputs() {
        let most = CoverLimits {
            exact: Exact::MostInputs,
            ..LIMITS
        };
        let fewest = CoverLimits {
            exact: Exact::FewestInputs,
            ..LIMITS
        };
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let c = qs(&[2, 3, 5, 7, 10, 40]);
        let choose = |limits, rng: &mut ChaCha8Rng| {
            let mut set = claimed(&c, plan(&c, q(10), u128::MAX, Fill::Exhausted, limits, rng));
            set.sort_unstable();
            set
        };
        assert_eq!(choose(fewest, &mut rng), [10]);
        assert_eq!(choose(most, &mut rng), [2, 3, 5]);
        // Within the cap: two inputs at most, so a pair (3 + 7).
        let capped = CoverLimits {
            max_inputs: 2,
            ..most
        };
        assert_eq!(choose(capped, &mut rng), [3, 7]);
        // A pair's members may be any two read, not only the largest: 1,000
        // fill candidates, the pair is the largest and the smallest.
        let mut many: Vec<u128> = (0..1_000).map(|i| 10_000 + 2 * i).collect();
        many.push(1);
        let c = qs(&many);
        let set = claimed(
            &c,
            plan(&c, q(11_999), u128::MAX, Fill::Exhausted, fewest, &mut rng),
        );
        assert_eq!(set, [1, 11_998]);
    }

    #[test]
    fn an_exact_choice_takes_no_dust() {
        let both = CoverLimits {
            exact: Exact::FewestInputs,
            consolidate_dust: 2,
            ..LIMITS
        };
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let c = qs(&[1, 1, 4, 6, 50]);
        assert_eq!(
            claimed(
                &c,
                plan(&c, q(10), u128::MAX, Fill::Exhausted, both, &mut rng)
            ),
            [4, 6]
        );
    }

    #[test]
    fn dust_joins_as_optional_inputs() {
        let dust = CoverLimits {
            consolidate_dust: 2,
            ..LIMITS
        };
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let c = qs(&[1, 1, 2, 3, 50]);
        assert_eq!(
            claimed(
                &c,
                plan(&c, q(40), u128::MAX, Fill::Exhausted, dust, &mut rng)
            ),
            [1, 1, 50]
        );
    }

    #[test]
    fn the_band_and_the_window_widen_with_the_callers_up_to_their_limits() {
        // Alone: as configured.
        assert_eq!(spread_band(16, 1), 16);
        assert_eq!(spread_window(4, 1), 4);
        // Two: 24 each.
        assert_eq!(spread_band(16, 2), 48);
        assert_eq!(spread_window(4, 2), 48);
        // Ten callers of the wallet in this instance.
        assert_eq!(spread_band(16, 10), 10 * COVER_PER_CALLER);
        assert_eq!(spread_window(4, 10), 10 * WINDOW_PER_CALLER);
        // Never beyond what a config may ask for.
        assert_eq!(spread_band(16, 1_000), crate::selection::MAX_COVER_BAND);
        assert_eq!(
            spread_window(4, 1_000),
            crate::selection::MAX_SUFFICIENCY_WINDOW
        );
    }

    #[test]
    fn callers_of_one_run_of_equal_covers_spread_over_all_of_it_read() {
        // 64 equal covers read, far above the amount: every one may be picked.
        let c = qs(&[1_000; 64]);
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut picked = std::collections::BTreeSet::new();
        for _ in 0..2_000 {
            let CoverPlan::Claim(i) = plan(&c, q(5), u128::MAX, Fill::Exhausted, LIMITS, &mut rng)
            else {
                panic!("expected a claim");
            };
            picked.extend(i);
        }
        assert_eq!(picked.len(), 64);
    }

    #[test]
    fn never_beyond_the_batch_window_the_cap_or_the_headroom() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let c = qs(&[1; 300]);
        let windows = CoverLimits {
            batch_window: 64,
            ..LIMITS
        };
        let got = claimed(
            &c,
            plan(&c, q(90), u128::MAX, Fill::Exhausted, windows, &mut rng),
        );
        assert_eq!(got.len(), 64, "a window, the rest claimed after it");
        // 290 of them would cover, but the cap is 100.
        assert_eq!(
            plan(&c, q(290), u128::MAX, Fill::Exhausted, LIMITS, &mut rng),
            CoverPlan::OverCap
        );
        // A cover candidate does with one.
        let mut with_cover = c.clone();
        with_cover.push(q(1_000));
        assert_eq!(
            claimed(
                &with_cover,
                plan(
                    &with_cover,
                    q(290),
                    u128::MAX,
                    Fill::Exhausted,
                    LIMITS,
                    &mut rng
                )
            ),
            [1_000]
        );
        // Fewer than the amount in all: not over the cap, short.
        assert_eq!(
            plan(&c, q(301), u128::MAX, Fill::Exhausted, LIMITS, &mut rng),
            CoverPlan::Nothing
        );
        let c = qs(&[100]);
        assert_eq!(
            plan(&c, q(10), 50, Fill::Exhausted, LIMITS, &mut rng),
            CoverPlan::Nothing
        );
    }
}
