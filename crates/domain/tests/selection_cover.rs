//! The `cover_first` policy (`docs/selection.md`, "Choice") through the engine,
//! driven against the in-memory wallet: few inputs, spread, re-picks from what was
//! read, and the same fast-fail and budget rules as `smallest_first`.

use crate::selection_sim;

use std::collections::BTreeSet;
use std::time::Duration;

use holdfast_domain::{SelectError, SelectionConfig, SelectionPolicy};
use selection_sim::{Wallet, q, run, tid};

fn tight() -> SelectionConfig {
    SelectionConfig {
        max_immediate_retries: 2,
        max_retries: 3,
        retry_interval: Duration::from_millis(100),
        ..SelectionConfig::default()
    }
}

/// The defaults as a select sees them with other callers of its wallet in its
/// instance: no tidying (`tidy_band` is for a select alone).
fn shared() -> SelectionConfig {
    SelectionConfig {
        tidy_band: 0,
        ..SelectionConfig::default()
    }
}

fn amounts(wallet: &Wallet, picked: &[holdfast_domain::TokenId]) -> Vec<u128> {
    let mut v: Vec<u128> = picked
        .iter()
        .map(|id| wallet.quantity_of(id).expect("a wallet token").value())
        .collect();
    v.sort_unstable();
    v
}

#[test]
fn cover_first_is_the_default() {
    assert_eq!(
        SelectionConfig::default().policy,
        SelectionPolicy::CoverFirst
    );
}

#[test]
fn one_covering_token_is_one_input_in_two_round_trips() {
    // The upstream order claims [1, 1, 1, 50] here, and 301 tokens for the second.
    let wallet = Wallet::of(&[1, 1, 1, 50]);
    let r = run(wallet.clone(), 10, SelectionConfig::default(), 1);
    assert_eq!(amounts(&wallet, &r.picked()), [50], "{}", r.trace);
    assert_eq!(
        (r.stats.fetches, r.stats.claims, r.stats.round_trips()),
        (1, 1, 2)
    );

    let mut dust = vec![1u128; 300];
    dust.push(1000);
    let wallet = Wallet::of(&dust);
    let r = run(wallet.clone(), 1000, SelectionConfig::default(), 1);
    assert_eq!(amounts(&wallet, &r.picked()), [1000], "{}", r.trace);
    assert_eq!(r.stats.round_trips(), 2);
}

#[test]
fn a_wallet_of_large_tokens_spreads_callers_over_near_equal_ones() {
    let wallet = Wallet::of(&[500, 501, 502, 503, 504, 900, 5000]);
    let mut picked = BTreeSet::new();
    for seed in 0..64 {
        let r = run(wallet.clone(), 100, SelectionConfig::default(), seed);
        assert_eq!(r.picked().len(), 1);
        picked.extend(amounts(&wallet, &r.picked()));
    }
    assert_eq!(picked.into_iter().collect::<Vec<_>>(), [500, 501, 502, 503]);
}

#[test]
fn without_a_near_sized_token_a_few_of_the_largest_smaller_ones() {
    // 40 tokens of 1..=40 and one of 10,000 for 100: the anchor is 100 x the
    // amount, so three or four of the largest small tokens, never the dust.
    let mut values: Vec<u128> = (1..=40).collect();
    values.push(10_000);
    let wallet = Wallet::of(&values);
    for seed in 0..32 {
        let r = run(wallet.clone(), 100, shared(), seed);
        let got = amounts(&wallet, &r.picked());
        assert!((3..=4).contains(&got.len()), "{got:?}");
        assert!(got.iter().sum::<u128>() >= 100);
        assert!(got.iter().all(|v| *v >= 30), "{got:?}");
        assert_eq!(r.stats.round_trips(), 2);
    }
    // A fill that cannot cover uses the anchor after all.
    let wallet = Wallet::of(&[1, 2, 3, 10_000]);
    let r = run(wallet.clone(), 100, shared(), 1);
    assert_eq!(amounts(&wallet, &r.picked()), [10_000]);
}

#[test]
fn after_a_loss_the_next_pick_comes_from_what_was_read() {
    // Four near-equal cover tokens, one of which loses its race: the re-pick
    // comes from the one read, no fetch while it has candidates.
    let wallet = Wallet::of(&[10, 11, 12, 13]).hot(0, 1);
    for seed in 0..16 {
        let r = run(wallet.clone(), 10, SelectionConfig::default(), seed);
        assert_eq!(r.picked().len(), 1, "{}", r.trace);
        assert_eq!(r.stats.fetches, 1, "{}", r.trace);
        assert_eq!(r.stats.claims, r.stats.conflicts + 1);
    }
}

#[test]
fn a_single_cover_read_leaves_the_fill_band_unread() {
    // 50 is within 5 x 10: the store may answer the cover band alone.
    let wallet = Wallet::of(&[1, 2, 9, 50, 70]);
    let r = run(wallet.clone(), 10, shared(), 1);
    assert_eq!(r.picked().len(), 1, "{}", r.trace);
    assert!(r.trace.contains("-> 2 rows [t03=50 t04=70]"), "{}", r.trace);
    assert_eq!(r.stats.fetches, 1, "{}", r.trace);
    // 70 is beyond 5 x 10: the fill band is read with it, and drawn from.
    let wallet = Wallet::of(&[4, 5, 9, 70]);
    let r = run(wallet.clone(), 10, shared(), 1);
    assert!(r.trace.contains("-> 4 rows"), "{}", r.trace);
    assert_eq!(r.picked().len(), 2, "{}", r.trace);
    // prefer_exact looks at the fill band: it is read with the cover band.
    let exact = SelectionConfig {
        prefer_exact: true,
        ..shared()
    };
    let wallet = Wallet::of(&[1, 9, 50]);
    let r = run(wallet.clone(), 10, exact, 1);
    assert_eq!(amounts(&wallet, &r.picked()), [1, 9], "{}", r.trace);
    assert_eq!(r.stats.fetches, 1, "{}", r.trace);
}

#[test]
fn a_lost_single_cover_read_without_its_fill_band_reads_both_bands_again() {
    // The only cover loses its race: the next read has both bands, and the
    // fill tokens cover the amount.
    let wallet = Wallet::of(&[4, 5, 6, 50]).hot(3, 1);
    let r = run(wallet.clone(), 10, shared(), 1);
    assert!(r.outcome.is_ok(), "{}", r.trace);
    assert_eq!(r.stats.conflicts, 1, "{}", r.trace);
    assert_eq!(r.stats.fetches, 2, "{}", r.trace);
    assert!(r.trace.contains("-> 1 rows [t03=50]"), "{}", r.trace);
    assert!(r.trace.contains("-> 4 rows"), "{}", r.trace);
}

#[test]
fn a_read_that_lost_most_of_its_claims_or_a_stale_token_is_read_afresh() {
    // Three of four lose their first race: once two claims from the read have
    // lost (most of what it proposed), it is out of date and read again.
    let wallet = Wallet::of(&[10, 11, 12, 13]).hot(0, 1).hot(1, 1).hot(2, 1);
    let mut most_lost = 0;
    for seed in 0..32 {
        let r = run(wallet.clone(), 10, SelectionConfig::default(), seed);
        assert_eq!(r.picked().len(), 1, "{}", r.trace);
        let lost = r.stats.conflicts;
        // One read per two losses (the losers show up again in the new read).
        assert_eq!(r.stats.fetches, 1 + lost / 2, "{}", r.trace);
        most_lost = most_lost.max(lost);
    }
    assert!(most_lost >= 2, "some seed picks two hot tokens first");
    // A stale token (spent since the read) is read around at once: the rest of
    // the read is likely spent too.
    let wallet = Wallet::of(&[10, 11, 12, 13]).stale(0).stale(1);
    let mut stale_seen = 0;
    for seed in 0..16 {
        let r = run(wallet.clone(), 10, SelectionConfig::default(), seed);
        assert_eq!(r.picked().len(), 1, "{}", r.trace);
        assert_eq!(r.stats.fetches, 1 + r.stats.stale, "{}", r.trace);
        stale_seen += r.stats.stale;
    }
    assert!(stale_seen > 0, "some seed picks a stale token first");
}

#[test]
fn a_read_used_up_by_losses_is_read_again() {
    // The only cover token loses once. The second read shows it again (released)
    // but blacklisted, and the clean 1 and 2 cannot make a claim: the blacklist
    // is cleared and the third read claims it.
    let wallet = Wallet::of(&[1, 2, 50]).hot(2, 1);
    let r = run(wallet.clone(), 10, SelectionConfig::default(), 2);
    assert_eq!(amounts(&wallet, &r.picked()), [50], "{}", r.trace);
    assert_eq!(r.stats.conflicts, 1);
    assert_eq!(
        (r.stats.fetches, r.stats.blacklist_clears),
        (3, 1),
        "read again once the read is used up:\n{}",
        r.trace
    );
}

#[test]
fn a_short_wallet_is_insufficient_funds_under_contention_too() {
    let r = run(Wallet::of(&[3, 4]).hot(1, u32::MAX), 10, tight(), 3);
    assert_eq!(
        r.outcome,
        Err(SelectError::InsufficientFunds {
            available: q(7),
            requested: q(10),
        }),
        "{}",
        r.trace
    );
    assert_eq!(r.stats.legs, 1);
}

#[test]
fn locked_funds_are_funds_locked_not_insufficient() {
    let r = run(Wallet::of(&[50]).locked_by_other(0), 10, tight(), 3);
    assert_eq!(r.outcome, Err(SelectError::FundsLocked), "{}", r.trace);
    assert_eq!(r.stats.legs, 3);
}

#[test]
fn prefer_exact_avoids_change_where_a_set_sums_to_the_amount() {
    let exact = SelectionConfig {
        prefer_exact: true,
        ..shared()
    };
    let wallet = Wallet::of(&[7, 9, 13, 30, 31]);
    let r = run(wallet.clone(), 16, exact.clone(), 1);
    let selected = r.outcome.clone().expect("selected");
    assert_eq!(amounts(&wallet, &r.picked()), [7, 9]);
    assert!(selected.change.is_zero());
    let r = run(wallet.clone(), 16, shared(), 1);
    assert!(!r.outcome.expect("selected").change.is_zero());
}

#[test]
fn alone_on_its_wallet_a_select_spends_more_tokens_than_it_mints() {
    // Tidying (the default, no other caller): the tidy band below the amount is
    // read with the covers, and an exact set of the most inputs is taken.
    let wallet = Wallet::of(&[3, 4, 6, 9, 13, 30]);
    let r = run(wallet.clone(), 13, SelectionConfig::default(), 1);
    let selected = r.outcome.clone().expect("selected");
    assert_eq!(amounts(&wallet, &r.picked()), [3, 4, 6], "{}", r.trace);
    assert!(selected.change.is_zero());
    assert!(r.trace.contains("limit=512"), "{}", r.trace);
    assert_eq!(r.stats.round_trips(), 2, "{}", r.trace);
    // No exact set: the choice is as with other callers (a near-sized cover).
    let r = run(wallet.clone(), 14, SelectionConfig::default(), 1);
    assert_eq!(amounts(&wallet, &r.picked()), [30], "{}", r.trace);
    // With tidying off, the single cover even where an exact set exists.
    let r = run(wallet.clone(), 13, shared(), 1);
    assert_eq!(r.picked().len(), 1, "{}", r.trace);
}

#[test]
fn dust_joins_a_selection_and_losing_it_costs_nothing() {
    let dust = SelectionConfig {
        consolidate_dust: 2,
        ..SelectionConfig::default()
    };
    let wallet = Wallet::of(&[1, 1, 2, 60]);
    let r = run(wallet.clone(), 50, dust.clone(), 1);
    assert_eq!(amounts(&wallet, &r.picked()), [1, 1, 60]);
    // One dust token always lost: the selection succeeds without it.
    let r = run(wallet.clone().hot(0, u32::MAX), 50, dust, 1);
    let got = amounts(&wallet, &r.picked());
    assert!(got.contains(&60) && got.len() == 2, "{got:?}\n{}", r.trace);
}

#[test]
fn tokens_of_one_run_are_never_claimed_twice() {
    let wallet = Wallet::of(&[5; 40]);
    let r = run(wallet, 100, SelectionConfig::default(), 9);
    let picked = r.picked();
    assert_eq!(picked.len(), 20);
    assert_eq!(picked.iter().collect::<BTreeSet<_>>().len(), 20);
    assert!(picked.iter().all(|t| (0..40).map(tid).any(|x| &x == t)));
}

#[test]
fn an_amount_of_one_reads_no_fill_band() {
    // Nothing but a zero amount lies below 1: the read asks for the cover band only.
    let r = run(Wallet::of(&[0, 1, 5]), 1, SelectionConfig::default(), 1);
    assert!(
        r.trace.starts_with("L1 fetch after=- limit=0 bands>=1:16"),
        "{}",
        r.trace
    );
    assert_eq!(r.picked().len(), 1);
    assert_eq!(r.stats.round_trips(), 2);
}

#[test]
fn a_read_asks_for_a_cover_band_that_widens_with_the_callers_the_instance_sees() {
    use holdfast_domain::{Action, Selection};
    use rand::SeedableRng;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let mut read = |callers: Option<usize>, race: bool| {
        let mut s =
            Selection::new(selection_sim::request(5), SelectionConfig::default()).expect("valid");
        if let Some(n) = callers {
            s.note_callers(n);
        }
        s.note_reads_race_claims(race);
        match s.start(&mut rng) {
            Action::Fetch(fetch) => fetch.bands.expect("cover_first reads bands").cover,
            other => panic!("expected a fetch, got {other:?}"),
        }
    };
    // Alone: the configured 16. With 10 callers of the wallet in this instance:
    // 24 per caller, so that they can land on different tokens.
    let mut cover_band = |callers| read(callers, true);
    assert_eq!(cover_band(None), 16);
    assert_eq!(cover_band(Some(1)), 16);
    assert_eq!(cover_band(Some(10)), 240);
    assert_eq!(cover_band(Some(100)), 256);
    // A store whose reads cannot race claims (SQLite: read and claim in one
    // serialized transaction): as configured, however many callers.
    assert_eq!(read(Some(10), false), 16);
}
