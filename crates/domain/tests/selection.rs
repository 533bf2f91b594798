//! Behaviour of the selection engine (`docs/selection.md`), driven against an
//! in-memory wallet. Randomised behaviours are checked over many fixed seeds.

use crate::selection_sim;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use holdfast_domain::{
    Action, Candidate, ClaimVerdict, FaultKind, SelectError, Selected, Selection, SelectionConfig,
    SelectionError, SelectionPolicy, StoreFault, TokenId,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use selection_sim::{Run, Wallet, q, request, run, tid};

/// The upstream order, which most window tests below pin; the `cover_first`
/// tests are in `selection_cover.rs`.
fn defaults() -> SelectionConfig {
    smallest_first()
}

pub(crate) fn smallest_first() -> SelectionConfig {
    SelectionConfig {
        policy: SelectionPolicy::SmallestFirst,
        ..SelectionConfig::default()
    }
}

/// Small budgets so contended runs stay short; without wake-ups, so that a scan
/// that finds nothing free is rescanned (with them it waits at once).
fn tight() -> SelectionConfig {
    SelectionConfig {
        max_immediate_retries: 2,
        max_retries: 3,
        retry_interval: Duration::from_millis(100),
        wakeups: false,
        ..smallest_first()
    }
}

/// How often each token was the whole selection, over `seeds` runs.
fn picks(
    wallet: &Wallet,
    amount: u128,
    config: &SelectionConfig,
    seeds: u64,
) -> BTreeMap<TokenId, u32> {
    let mut counts = BTreeMap::new();
    for seed in 0..seeds {
        let r = run(wallet.clone(), amount, config.clone(), seed);
        let tokens = r.picked();
        assert_eq!(
            tokens.len(),
            1,
            "seed {seed}: expected one token\n{}",
            r.trace
        );
        *counts.entry(tokens[0].clone()).or_insert(0) += 1;
    }
    counts
}

#[test]
fn smallest_fit_picks_the_small_token() {
    let wallet = Wallet::of(&[1, 200]);
    for seed in 0..20 {
        let r = run(wallet.clone(), 1, defaults(), seed);
        assert_eq!(r.picked(), vec![tid(0)], "seed {seed}\n{}", r.trace);
        let selected = r.outcome.as_ref().unwrap();
        assert_eq!((selected.total, selected.change), (q(1), q(0)));
    }
}

#[test]
fn equal_amounts_are_shuffled() {
    let counts = picks(&Wallet::of(&[10, 10, 10, 10, 10]), 10, &defaults(), 40);
    assert!(counts.len() > 1, "{counts:?}");
}

#[test]
fn a_first_page_that_covers_the_amount_is_planned_without_reading_more() {
    // Window 1, pages of 2: the first page (10, 10) covers 10, so the run of 10s is
    // not held back for later pages: one read, then the claim (2 round trips),
    // spread over the page read.
    let config = SelectionConfig {
        sufficiency_window: 1,
        page_size: 2,
        ..defaults()
    };
    let wallet = Wallet::of(&[10, 10, 10, 10, 10]);
    let counts = picks(&wallet, 10, &config, 60);
    assert_eq!(
        counts.keys().cloned().collect::<Vec<_>>(),
        vec![tid(0), tid(1)],
        "{counts:?}"
    );
    for seed in 0..10 {
        let r = run(wallet.clone(), 10, config.clone(), seed);
        assert_eq!((r.stats.fetches, r.stats.claims), (1, 1), "{}", r.trace);
    }
}

#[test]
fn an_equal_run_split_across_pages_is_shuffled_as_one_bucket_until_it_covers() {
    // Pages of 2 over five 1s, for 3: the first page (2) does not cover, so its run
    // is held back and shuffled with the later pages': the first token is not
    // always picked.
    let config = SelectionConfig {
        page_size: 2,
        ..defaults()
    };
    let wallet = Wallet::of(&[1, 1, 1, 1, 1]);
    let mut without_first = 0;
    for seed in 0..60 {
        let r = run(wallet.clone(), 3, config.clone(), seed);
        let picked = r.picked();
        assert_eq!(picked.len(), 3, "{}", r.trace);
        without_first += u32::from(!picked.contains(&tid(0)));
    }
    assert!(
        without_first > 0,
        "the first page's tokens were always picked"
    );
}

#[test]
fn sufficiency_window_spreads_over_the_count_cap_only() {
    let counts = picks(&Wallet::of(&[2, 3, 4, 5, 6, 200]), 1, &defaults(), 200);
    assert!(counts.len() >= 2, "{counts:?}");
    assert!(!counts.contains_key(&tid(4)), "6 picked: {counts:?}");
    assert!(!counts.contains_key(&tid(5)), "200 picked: {counts:?}");
}

#[test]
fn ratio_cap_excludes_what_the_count_cap_admits() {
    // Three candidates fit the count cap of 4; 60 > 5 x 10 is excluded by the ratio.
    let wallet = Wallet::of(&[10, 20, 60]);
    let counts = picks(&wallet, 5, &defaults(), 200);
    assert!(
        counts.contains_key(&tid(0)) && counts.contains_key(&tid(1)),
        "{counts:?}"
    );
    assert!(!counts.contains_key(&tid(2)), "{counts:?}");
    // The same run without the ratio cap picks 60: the assertion above can fail.
    let no_ratio = SelectionConfig {
        max_sufficiency_ratio: u32::MAX,
        ..defaults()
    };
    let counts = picks(&wallet, 5, &no_ratio, 200);
    assert!(counts.contains_key(&tid(2)), "{counts:?}");
}

#[test]
fn a_request_dwarfed_by_every_token_still_spreads() {
    // The cap is 5 x the anchor (20), not 5 x the request (1).
    let counts = picks(&Wallet::of(&[20, 30, 40, 50]), 1, &defaults(), 100);
    assert!(counts.len() > 1, "{counts:?}");
}

#[test]
fn a_blacklisted_anchor_gets_no_lookahead() {
    // t00 = 2 is always contended. While it anchors, the window is {2, 9, 10}
    // (11 > 5 x 2). Once blacklisted it anchors nothing: 9 anchors and 11 joins.
    let wallet = Wallet::of(&[2, 9, 10, 11]).hot(0, u32::MAX);
    let mut saw_eleven = false;
    for seed in 0..200 {
        let r = run(wallet.clone(), 1, defaults(), seed);
        let first = &r.claims[0];
        if first == &vec![tid(0)] {
            // The next claim is planned with t00 blacklisted.
            assert_ne!(r.claims[1], vec![tid(0)], "{}", r.trace);
            saw_eleven |= r.picked() == vec![tid(3)];
        } else {
            assert_ne!(
                r.picked(),
                vec![tid(3)],
                "11 chosen next to anchor 2\n{}",
                r.trace
            );
        }
        let tries = r.claims.iter().filter(|c| c.contains(&tid(0))).count();
        assert!(tries <= 1, "blacklisted t00 claimed again\n{}", r.trace);
    }
    assert!(
        saw_eleven,
        "11 never chosen after the anchor 2 was blacklisted"
    );
}

#[test]
fn blacklisted_tokens_never_enter_a_window_until_the_escape_hatch() {
    // t00 loses once; the second scan sees only t00, which is blacklisted: the
    // blacklist is cleared once and the third scan wins it.
    let r = run(Wallet::of(&[5]).hot(0, 1), 5, defaults(), 7);
    assert_eq!(r.picked(), vec![tid(0)], "{}", r.trace);
    assert_eq!(r.stats.blacklist_clears, 1, "{}", r.trace);
    assert_eq!(r.stats.fetches, 3, "{}", r.trace);
    assert_eq!(r.claims.len(), 2, "{}", r.trace);
    // With a clean token next to it, the contended token is never retried.
    let r = run(Wallet::of(&[5, 6]).hot(0, 1), 5, defaults(), 1);
    let tries = r.claims.iter().filter(|c| c.contains(&tid(0))).count();
    assert!(tries <= 1, "{}", r.trace);
    assert_eq!(r.stats.blacklist_clears, 0, "{}", r.trace);
}

#[test]
fn without_the_blacklist_a_lost_token_is_retried_on_the_next_scan() {
    let config = SelectionConfig {
        blacklist: false,
        ..defaults()
    };
    let r = run(Wallet::of(&[5]).hot(0, 1), 5, config, 7);
    assert_eq!(r.picked(), vec![tid(0)]);
    assert_eq!(r.stats.fetches, 2, "{}", r.trace);
    assert_eq!(r.stats.blacklist_clears, 0);
}

#[test]
fn stale_is_not_contention_and_asks_for_a_refresh() {
    // The only token turns out spent: no contention, so the balance is read and
    // the call fails fast with InsufficientFunds.
    let r = run(Wallet::of(&[5]).stale(0), 5, defaults(), 3);
    assert_eq!(
        r.outcome,
        Err(SelectError::InsufficientFunds {
            available: q(0),
            requested: q(5)
        }),
        "{}",
        r.trace
    );
    assert_eq!(
        (r.stats.stale, r.stats.conflicts, r.stats.store_errors),
        (1, 0, 0)
    );
    // A stale token next to a good one: the next fetch asks for a refresh (pages
    // of one, so a fetch follows the stale verdict).
    let config = SelectionConfig {
        sufficiency_window: 1,
        page_size: 1,
        ..defaults()
    };
    let r = run(Wallet::of(&[5, 6]).stale(0), 5, config, 3);
    assert_eq!(r.picked(), vec![tid(1)], "{}", r.trace);
    let lines: Vec<&str> = r.trace.lines().collect();
    let stale_at = lines.iter().position(|l| l.contains("t00:stale")).unwrap();
    assert!(
        lines[stale_at + 1].contains("fetch") && lines[stale_at + 1].contains("refresh=true"),
        "{}",
        r.trace
    );
    assert_eq!(r.trace.matches("refresh=true").count(), 1, "{}", r.trace);
    assert_eq!(r.stats.balance_checks, 0);
}

#[test]
fn contended_is_blacklisted_counted_and_ends_in_funds_locked() {
    let r = run(Wallet::of(&[5]).hot(0, u32::MAX), 5, tight(), 3);
    assert_eq!(r.outcome, Err(SelectError::FundsLocked), "{}", r.trace);
    assert!(r.stats.conflicts >= 3, "{}", r.trace);
    assert_eq!((r.stats.stale, r.stats.store_errors), (0, 0));
    assert_eq!(
        r.stats.balance_checks, 3,
        "contention does not suppress the fast fail: one balance read per leg"
    );
    assert_eq!(r.stats.legs, 3);
    assert_eq!(r.backoffs.len(), 2);
    assert!(r.backoffs.iter().all(|d| *d < Duration::from_millis(100)));
    assert_eq!(r.stats.distinct_tokens_attempted, 1);
}

#[test]
fn a_short_wallet_is_insufficient_funds_even_when_every_scan_met_contention() {
    // [3, 4] for 10, with the 4 always lost to another transaction: the wallet
    // holds 7 whatever the locks, so this is not "retry later".
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
    assert!(r.stats.conflicts >= 1, "{}", r.trace);
    assert_eq!(
        (r.stats.legs, r.stats.balance_checks),
        (1, 1),
        "{}",
        r.trace
    );
    assert!(r.wallet.held_by_consumer().is_empty(), "{}", r.trace);
}

#[test]
fn a_store_error_is_retried_not_blacklisted() {
    let mut wallet = Wallet::of(&[5]);
    wallet.fail_claims = 1;
    let r = run(wallet, 5, defaults(), 3);
    assert_eq!(r.picked(), vec![tid(0)], "{}", r.trace);
    assert_eq!(
        (r.stats.store_errors, r.stats.conflicts, r.stats.stale),
        (1, 0, 0)
    );
    assert_eq!(r.stats.blacklist_clears, 0);
    // One retry for the error, one for the rescan; the win does not undo the sum.
    assert_eq!(r.stats.immediate_retries, 2, "{}", r.trace);
}

#[test]
fn store_errors_that_exhaust_the_budget_surface_as_a_store_failure() {
    // The simulated store fails fetches as unavailable, claims as busy and balance
    // reads as timed out (`selection_sim`): the failure keeps the kind.
    for (what, fault, mut wallet) in [
        ("fetch", FaultKind::Unavailable, Wallet::of(&[5])),
        ("claim", FaultKind::Busy, Wallet::of(&[5])),
        ("balance", FaultKind::Timeout, Wallet::of(&[1])),
    ] {
        match what {
            "fetch" => wallet.fail_fetches = u32::MAX,
            "claim" => wallet.fail_claims = u32::MAX,
            _ => wallet.fail_balances = u32::MAX,
        }
        let r = run(wallet, 5, defaults(), 3);
        assert!(
            matches!(&r.outcome, Err(SelectError::Store(store))
                if store.message().contains(what) && store.kind() == fault),
            "{what}: {}",
            r.trace
        );
        assert_eq!(
            r.stats.legs, 1,
            "{what}: no backoff for an outage\n{}",
            r.trace
        );
        assert_eq!(r.stats.immediate_retries, 5, "{what}\n{}", r.trace);
        assert!(r.wallet.held_by_consumer().is_empty());
    }
}

#[test]
fn store_errors_with_contention_are_funds_locked() {
    let mut wallet = Wallet::of(&[5]).hot(0, u32::MAX);
    wallet.fail_fetches = 1;
    let r = run(wallet, 5, tight(), 3);
    assert_eq!(r.outcome, Err(SelectError::FundsLocked), "{}", r.trace);
    // A failed fetch is no lock attempt: it is not a lock store error.
    assert_eq!((r.stats.store_errors, r.stats.other_store_errors), (0, 1));
}

#[test]
fn a_failed_window_claim_counts_a_lock_store_error_per_token() {
    // [2, 3] for 5: one window claim of two tokens fails, the retry wins both.
    let mut wallet = Wallet::of(&[2, 3]);
    wallet.fail_claims = 1;
    let r = run(wallet, 5, defaults(), 3);
    assert_eq!(r.claims, vec![vec![tid(0), tid(1)]; 2], "{}", r.trace);
    assert_eq!(r.picked().len(), 2, "{}", r.trace);
    assert_eq!(r.stats.lock_attempts, 4);
    // Per failed token attempt exactly one of stale, conflict, store error.
    assert_eq!(
        (r.stats.store_errors, r.stats.conflicts, r.stats.stale),
        (2, 0, 0)
    );
    assert_eq!(r.stats.other_store_errors, 0);
    // One retry for the failed claim, whatever its size, one for the rescan.
    assert_eq!(r.stats.immediate_retries, 2, "{}", r.trace);
}

#[test]
fn a_transient_store_error_in_a_locked_wallet_backs_off_instead_of_failing() {
    // [3, 4, 5] with the 5 locked by another transaction: the anti-join hides it,
    // so no contention is ever seen. Each scan runs out at 3 + 4 < 10 while the
    // balance (12) says enough: funds locked by others. One failed fetch must not
    // turn that into a store failure after the first leg.
    let mut wallet = Wallet::of(&[3, 4, 5]).locked_by_other(2);
    wallet.fail_fetches = 1;
    let r = run(wallet, 10, tight(), 5);
    assert_eq!(r.outcome, Err(SelectError::FundsLocked), "{}", r.trace);
    assert_eq!(r.stats.legs, 3, "{}", r.trace);
    assert_eq!(r.backoffs.len(), 2, "{}", r.trace);
    assert!(r.stats.balance_checks >= 3, "{}", r.trace);
    assert!(r.wallet.held_by_consumer().is_empty(), "{}", r.trace);
    // The same with the default budget: still backs off rather than failing.
    let mut wallet = Wallet::of(&[3, 4, 5]).locked_by_other(2);
    wallet.fail_fetches = 1;
    let r = run(wallet, 10, defaults(), 5);
    assert_eq!(r.outcome, Err(SelectError::FundsLocked), "{}", r.trace);
    assert_eq!(r.stats.legs, 10, "{}", r.trace);
}

#[test]
fn a_store_error_ending_a_leg_of_locked_funds_is_not_a_store_failure() {
    // The error lands on the event that finds the budget used up, but the leg's
    // retries went to rescans of locked funds (store errors are no majority).
    // tight(): 2 retries. 3 and 4 are won, the 5 is locked elsewhere (never a
    // candidate); the balance is read once in the leg (12: enough), rescan (1),
    // rescan (2), then the third scan's fetch fails with the budget used up.
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut s = Selection::new(request(10), tight()).unwrap();
    assert!(matches!(s.start(&mut rng), Action::Fetch(_)));
    let claim = s.on_candidates(Ok(vec![cand(0, 3), cand(1, 4)]), &mut rng);
    assert_eq!(claim, Action::Claim(vec![tid(0), tid(1)]));
    let won = vec![(tid(0), ClaimVerdict::Won), (tid(1), ClaimVerdict::Won)];
    assert_eq!(s.on_claim(Ok(won), &mut rng), Action::CheckBalance);
    // First rescan (retry 1).
    assert!(matches!(
        s.on_balance(Ok(q(12)), &mut rng),
        Action::Fetch(_)
    ));
    // Second rescan (retry 2, the budget's last): no second balance read in a leg.
    assert!(matches!(
        s.on_candidates(Ok(Vec::new()), &mut rng),
        Action::Fetch(_)
    ));
    assert_eq!(s.stats().immediate_retries, 2);
    assert_eq!(s.stats().balance_checks, 1);
    let next = s.on_candidates(
        Err(StoreFault::new(FaultKind::Unavailable, "page read failed")),
        &mut rng,
    );
    assert_eq!(next, Action::Release(vec![tid(0), tid(1)]));
    let next = s.on_released(Ok(()), &mut rng);
    assert!(matches!(next, Action::Backoff(_)), "{next:?}");
    assert_eq!(s.leg(), 1);
}

#[test]
fn store_errors_that_are_most_of_a_legs_budget_end_the_call_as_a_store_failure() {
    // One rescan of locked funds, then every fetch fails: store errors are 3 of
    // the 4 retry-charging events, the last included, so no backoff.
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let config = SelectionConfig {
        max_immediate_retries: 3,
        ..tight()
    };
    let mut s = Selection::new(request(10), config).unwrap();
    assert!(matches!(s.start(&mut rng), Action::Fetch(_)));
    let claim = s.on_candidates(Ok(vec![cand(0, 3), cand(1, 4)]), &mut rng);
    assert_eq!(claim, Action::Claim(vec![tid(0), tid(1)]));
    let won = vec![(tid(0), ClaimVerdict::Won), (tid(1), ClaimVerdict::Won)];
    assert_eq!(s.on_claim(Ok(won), &mut rng), Action::CheckBalance);
    let mut action = s.on_balance(Ok(q(12)), &mut rng);
    // Two busy fetches, then an unavailable one: the failure is of the last kind.
    for kind in [FaultKind::Busy, FaultKind::Busy, FaultKind::Unavailable] {
        assert!(matches!(action, Action::Fetch(_)), "{action:?}");
        action = s.on_candidates(Err(StoreFault::new(kind, "fetch failed")), &mut rng);
    }
    assert_eq!(action, Action::Release(vec![tid(0), tid(1)]));
    assert_eq!(
        s.on_released(Ok(()), &mut rng),
        Action::Done(Err(SelectError::Store(StoreFault::new(
            FaultKind::Unavailable,
            "fetch failed"
        ))))
    );
    assert_eq!(s.leg(), 1);
}

#[test]
fn fast_fail_compares_the_balance_with_the_full_amount() {
    // 3 + 4 = 7 < 10. Compared with the remainder (3 after winning 7) the balance
    // would look sufficient and the call would end in FundsLocked instead.
    let expected = Err(SelectError::InsufficientFunds {
        available: q(7),
        requested: q(10),
    });
    let r = run(Wallet::of(&[3, 4]), 10, defaults(), 1);
    assert_eq!(r.outcome, expected, "{}", r.trace);
    let single = SelectionConfig {
        batch_window: 1,
        ..defaults()
    };
    let r = run(Wallet::of(&[3, 4]), 10, single, 1);
    assert_eq!(r.claims, vec![vec![tid(0)], vec![tid(1)]], "{}", r.trace);
    assert_eq!(r.outcome, expected, "{}", r.trace);
    assert!(
        r.trace.contains("release [t00=3 t01=4] -> ok"),
        "{}",
        r.trace
    );
    assert!(r.wallet.held_by_consumer().is_empty());
    assert!(r.held_after.is_empty());
    // Funds locked by others count in the balance: not insufficient.
    let r = run(Wallet::of(&[3, 4, 5]).locked_by_other(2), 10, tight(), 1);
    assert_eq!(r.outcome, Err(SelectError::FundsLocked), "{}", r.trace);
}

#[test]
fn an_empty_wallet_fails_fast() {
    let r = run(Wallet::of(&[]), 1, defaults(), 0);
    assert_eq!(
        r.outcome,
        Err(SelectError::InsufficientFunds {
            available: q(0),
            requested: q(1)
        })
    );
    assert_eq!(r.stats.round_trips(), 2, "{}", r.trace);
}

#[test]
fn dust_is_claimed_in_minimal_windows_within_the_batch_window_and_the_cap() {
    let dust = Wallet::of(&[1; 768]);
    let r = run(dust.clone(), 100, defaults(), 5);
    assert_eq!(r.claims.iter().map(Vec::len).collect::<Vec<_>>(), vec![100]);
    let selected = r.outcome.unwrap();
    assert_eq!((selected.total, selected.change), (q(100), q(0)));

    let windows = SelectionConfig {
        batch_window: 96,
        max_inputs: 256,
        ..defaults()
    };
    let r = run(dust.clone(), 250, windows, 5);
    let sizes: Vec<usize> = r.claims.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![96, 96, 58], "{}", r.trace);
    let selected = r.outcome.unwrap();
    assert_eq!(selected.tokens.len(), 250);
    assert_eq!(selected.tokens.iter().collect::<BTreeSet<_>>().len(), 250);

    // More inputs than the cap (100 by default): a typed answer, nothing held.
    let r = run(dust.clone(), 600, defaults(), 5);
    assert_eq!(
        r.outcome,
        Err(SelectError::TooManyInputs {
            requested: q(600),
            max_inputs: 100
        }),
        "{}",
        r.trace
    );
    assert!(r.wallet.held_by_consumer().is_empty());

    let r = run(dust, 769, defaults(), 5);
    assert!(r.claims.iter().all(|c| c.len() <= 256));
    assert!(matches!(
        r.outcome,
        Err(SelectError::InsufficientFunds { .. })
    ));
    assert!(r.wallet.held_by_consumer().is_empty());
}

#[test]
fn dust_then_an_anchor_covers_the_rest() {
    let r = run(Wallet::of(&[1, 1, 1, 50]), 10, defaults(), 5);
    assert_eq!(r.claims, vec![vec![tid(0), tid(1), tid(2), tid(3)]]);
    let selected = r.outcome.unwrap();
    assert_eq!((selected.total, selected.change), (q(53), q(43)));
}

#[test]
fn a_failed_leg_releases_its_wins_before_backing_off() {
    // 3 is won, 7 is always lost: each leg ends by releasing 3.
    let r = run(Wallet::of(&[3, 7]).hot(1, u32::MAX), 10, tight(), 2);
    assert_eq!(r.outcome, Err(SelectError::FundsLocked), "{}", r.trace);
    let lines: Vec<&str> = r.trace.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.contains("backoff") {
            assert!(
                lines[i - 1].contains("release [t00=3] -> ok"),
                "{}",
                r.trace
            );
        }
    }
    assert!(
        r.trace.contains("L2 fetch after=- limit=256 refresh=true"),
        "{}",
        r.trace
    );
    assert!(r.wallet.held_by_consumer().is_empty());
    assert!(r.held_after.is_empty());
}

#[test]
fn a_won_lock_resets_the_immediate_retry_budget() {
    // Single-token claims over tokens that each lose once: every leg would end
    // after 2 fruitless rescans, but each win resets the count.
    let mut wallet = Wallet::of(&[1, 1, 1, 1, 1, 1]);
    for i in 0..6 {
        wallet = wallet.hot(i, 1);
    }
    let config = SelectionConfig {
        batch_window: 1,
        sufficiency_window: 1,
        blacklist: false,
        ..tight()
    };
    let r = run(wallet, 6, config, 9);
    assert!(r.outcome.is_ok(), "{}", r.trace);
    assert_eq!(r.stats.legs, 1, "{}", r.trace);
}

#[test]
fn a_failed_release_keeps_the_tokens_in_held_and_retries_them() {
    let mut wallet = Wallet::of(&[3, 7]).hot(1, u32::MAX);
    wallet.fail_releases = 1;
    let r = run(wallet, 10, tight(), 2);
    assert_eq!(r.outcome, Err(SelectError::FundsLocked));
    assert!(
        r.trace.contains("release [t00=3] -> store error"),
        "{}",
        r.trace
    );
    assert!(r.wallet.held_by_consumer().is_empty(), "{}", r.trace);
    assert!(r.held_after.is_empty());
}

#[test]
fn new_rejects_a_zero_amount_and_a_bad_config() {
    let zero = Selection::new(request(0), defaults());
    assert_eq!(zero.unwrap_err(), SelectionError::ZeroAmount);
    let bad = SelectionConfig {
        batch_window: 300,
        ..defaults()
    };
    let err = Selection::new(request(1), bad).unwrap_err();
    assert!(err.to_string().contains("batch_window = 300"), "{err}");
}

#[test]
fn failures_name_their_figures() {
    let e = SelectError::InsufficientFunds {
        available: q(7),
        requested: q(10),
    };
    assert_eq!(
        e.to_string(),
        "insufficient funds: 7 available, 10 requested"
    );
    assert!(SelectError::FundsLocked.to_string().contains("retry later"));
}

fn cand(n: usize, v: u128) -> Candidate {
    Candidate {
        id: tid(n),
        quantity: q(v),
    }
}

#[test]
fn unexpected_answers_are_ignored_and_the_pending_action_repeats() {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut s = Selection::new(request(5), defaults()).unwrap();
    // Before start: any answer starts the call.
    let first = s.on_claim(Ok(vec![]), &mut rng);
    assert!(matches!(first, Action::Fetch(_)));
    assert_eq!(s.start(&mut rng), first);
    // A claim answer while a fetch is pending is ignored.
    assert_eq!(
        s.on_claim(Ok(vec![(tid(0), ClaimVerdict::Won)]), &mut rng),
        first
    );
    assert_eq!(s.on_balance(Ok(q(1)), &mut rng), first);
    let claim = s.on_candidates(Ok(vec![cand(0, 5)]), &mut rng);
    assert_eq!(claim, Action::Claim(vec![tid(0)]));
    // Verdicts for unknown tokens are ignored; duplicates that agree are fine.
    let done = s.on_claim(
        Ok(vec![
            (tid(9), ClaimVerdict::Won),
            (tid(0), ClaimVerdict::Won),
            (tid(0), ClaimVerdict::Won),
        ]),
        &mut rng,
    );
    let Action::Done(Ok(selected)) = &done else {
        panic!("{done:?}")
    };
    assert_eq!(selected.tokens, vec![tid(0)]);
    assert_eq!(s.on_backoff_elapsed(&mut rng), done);
    assert_eq!(s.held(), vec![tid(0)]);
}

#[test]
fn a_missing_or_contradictory_verdict_is_a_store_error_and_possibly_held() {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut s = Selection::new(request(5), defaults()).unwrap();
    s.start(&mut rng);
    let claim = s.on_candidates(Ok(vec![cand(0, 2), cand(1, 5)]), &mut rng);
    assert_eq!(claim, Action::Claim(vec![tid(0), tid(1)]));
    let next = s.on_claim(
        Ok(vec![
            (tid(0), ClaimVerdict::Won),
            (tid(0), ClaimVerdict::Contended),
        ]),
        &mut rng,
    );
    // Both proposed tokens lack a clear verdict: two lock store errors.
    assert_eq!(s.stats().store_errors, 2);
    assert_eq!(s.held(), vec![tid(0), tid(1)]);
    // Nothing left in the scan: the balance is asked.
    assert_eq!(next, Action::CheckBalance);
    // 3 is short of 5, but the call may hold tokens it cannot account for: it does
    // not fail fast on a guess, it scans again (and still covers both).
    let next = s.on_balance(Ok(q(3)), &mut rng);
    assert!(matches!(next, Action::Fetch(_)), "{next:?}");
    assert_eq!(s.held(), vec![tid(0), tid(1)]);
}

#[test]
fn an_ambiguous_claim_is_released_after_success_elsewhere() {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let config = SelectionConfig {
        sufficiency_window: 1,
        ..defaults()
    };
    let mut s = Selection::new(request(5), config).unwrap();
    s.start(&mut rng);
    let claim = s.on_candidates(Ok(vec![cand(0, 5), cand(1, 6)]), &mut rng);
    assert_eq!(claim, Action::Claim(vec![tid(0)]));
    let next = s.on_claim(
        Err(StoreFault::new(FaultKind::Timeout, "timeout")),
        &mut rng,
    );
    assert_eq!(next, Action::Claim(vec![tid(1)]));
    let next = s.on_claim(Ok(vec![(tid(1), ClaimVerdict::Won)]), &mut rng);
    assert_eq!(next, Action::Release(vec![tid(0)]));
    let done = s.on_released(Ok(()), &mut rng);
    let Action::Done(Ok(selected)) = done else {
        panic!("{done:?}")
    };
    assert_eq!(selected.tokens, vec![tid(1)]);
    assert_eq!(s.held(), vec![tid(1)]);
}

#[test]
fn held_covers_the_claim_in_flight_for_cancellation() {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut s = Selection::new(request(5), defaults()).unwrap();
    s.start(&mut rng);
    s.on_candidates(Ok(vec![cand(0, 2), cand(1, 5)]), &mut rng);
    assert_eq!(s.held(), vec![tid(0), tid(1)]);
}

#[test]
fn runs_are_replayable() {
    let wallet = Wallet::of(&[1, 2, 2, 2, 5, 5, 9, 40]).hot(3, 2).stale(6);
    let a: Run = run(wallet.clone(), 12, tight(), 42);
    let b: Run = run(wallet, 12, tight(), 42);
    assert_eq!(a.trace, b.trace);
}

/// Drives a call on a wallet whose one token (t0 = 10) another transaction holds,
/// until the first leg asks to wait; returns the call and the wait.
fn waiting_on_a_held_token(rng: &mut ChaCha8Rng) -> (Selection, Duration) {
    let mut s = Selection::new(request(10), tight()).unwrap();
    let mut action = s.start(rng);
    loop {
        action = match action {
            // The anti-join hides the held token: every scan comes back empty.
            Action::Fetch(_) => s.on_candidates(Ok(Vec::new()), rng),
            Action::CheckBalance => s.on_balance(Ok(q(10)), rng),
            Action::Backoff(delay) => return (s, delay),
            other => panic!("unexpected {other:?}"),
        };
    }
}

#[test]
fn a_wake_up_tries_again_within_the_same_leg() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (mut s, delay) = waiting_on_a_held_token(&mut rng);
    assert_eq!((s.leg(), s.stats().legs, s.stats().waits), (1, 1, 1));
    let waited = delay / 3;
    let fetch = s.on_woken(waited, &mut rng);
    assert!(
        matches!(&fetch, Action::Fetch(f) if f.refresh),
        "a woken attempt reads afresh: {fetch:?}"
    );
    // The holder settled and t0 is free again: the woken attempt takes it.
    let claim = s.on_candidates(Ok(vec![cand(0, 10)]), &mut rng);
    assert_eq!(claim, Action::Claim(vec![tid(0)]));
    let done = s.on_claim(Ok(vec![(tid(0), ClaimVerdict::Won)]), &mut rng);
    assert!(matches!(done, Action::Done(Ok(_))), "{done:?}");
    assert_eq!((s.leg(), s.stats().legs), (1, 1), "no leg spent");
    assert_eq!((s.stats().waits, s.stats().wakeups), (1, 1));
}

#[test]
fn a_wake_up_that_finds_nothing_goes_back_to_the_rest_of_the_same_wait() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let (mut s, delay) = waiting_on_a_held_token(&mut rng);
    let waited = delay / 4;
    assert!(matches!(s.on_woken(waited, &mut rng), Action::Fetch(_)));
    let checks = s.stats().balance_checks;
    let fetches = s.stats().fetches;
    // Nothing free: no rescan, no second balance read, back to waiting.
    let next = s.on_candidates(Ok(Vec::new()), &mut rng);
    assert_eq!(next, Action::Backoff(delay - waited));
    assert_eq!(s.stats().balance_checks, checks);
    assert_eq!(s.stats().fetches, fetches);
    assert_eq!((s.leg(), s.stats().legs), (1, 1), "no leg spent");
    // Woken again: the wait left shrinks again; the timer then starts leg 2.
    assert!(matches!(s.on_woken(delay / 4, &mut rng), Action::Fetch(_)));
    assert_eq!(
        s.on_candidates(Ok(Vec::new()), &mut rng),
        Action::Backoff(delay - waited - delay / 4)
    );
    assert!(matches!(s.on_backoff_elapsed(&mut rng), Action::Fetch(_)));
    assert_eq!((s.leg(), s.stats().wakeups, s.stats().waits), (2, 2, 3));
}

#[test]
fn a_woken_attempt_that_wins_part_releases_it_before_waiting_again() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (mut s, delay) = waiting_on_a_held_token(&mut rng);
    assert!(matches!(
        s.on_woken(Duration::ZERO, &mut rng),
        Action::Fetch(_)
    ));
    // Only 4 of the 10 came free: won, then nothing more to read.
    assert_eq!(
        s.on_candidates(Ok(vec![cand(1, 4)]), &mut rng),
        Action::Claim(vec![tid(1)])
    );
    let mut action = s.on_claim(Ok(vec![(tid(1), ClaimVerdict::Won)]), &mut rng);
    // A win gives the attempt the leg's usual budget of rescans.
    let mut rescans = 0;
    while let Action::Fetch(_) = action {
        rescans += 1;
        action = s.on_candidates(Ok(Vec::new()), &mut rng);
    }
    assert_eq!(rescans, tight().max_immediate_retries);
    assert_eq!(action, Action::Release(vec![tid(1)]));
    assert_eq!(s.on_released(Ok(()), &mut rng), Action::Backoff(delay));
    assert!(s.held().is_empty());
}

/// Runs a call with wake-ups on a wallet with enough money, none of it free,
/// through every leg, each wait ending through `waited`; returns the call, its
/// outcome and its reads per leg.
fn locked_through_every_leg(
    max_retries: u32,
    seed: u64,
    waited: fn(&mut Selection, &mut ChaCha8Rng) -> Action,
) -> (Selection, Result<Selected, SelectError>, BTreeMap<u32, u32>) {
    let config = SelectionConfig {
        wakeups: true,
        max_retries,
        ..tight()
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut s = Selection::new(request(10), config).unwrap();
    let mut reads = BTreeMap::<u32, u32>::new();
    let mut action = s.start(&mut rng);
    let outcome = loop {
        action = match action {
            Action::Fetch(_) => {
                *reads.entry(s.leg()).or_default() += 1;
                s.on_candidates(Ok(Vec::new()), &mut rng)
            }
            Action::CheckBalance => s.on_balance(Ok(q(10)), &mut rng),
            Action::Backoff(_) => waited(&mut s, &mut rng),
            Action::Done(outcome) => break outcome,
            other => panic!("unexpected {other:?}"),
        };
    };
    (s, outcome, reads)
}

#[test]
fn with_wakeups_a_scan_that_finds_nothing_free_waits_instead_of_rescanning() {
    let (_, outcome, reads) =
        locked_through_every_leg(tight().max_retries, 6, |s, rng| s.on_backoff_elapsed(rng));
    assert_eq!(outcome, Err(SelectError::FundsLocked));
    // One read then a wait per leg; the last leg, with no wait to go to,
    // rescans as before.
    assert_eq!(reads, BTreeMap::from([(1, 1), (2, 1), (3, 3)]));
}

#[test]
fn a_wait_passed_over_keeps_its_place_in_line_for_the_first_third_of_the_legs() {
    // Every wait ends on its timer while others ahead in line were woken.
    let (s, outcome, reads) =
        locked_through_every_leg(9, 7, |s, rng| s.on_backoff_passed_over(rng));
    assert_eq!(outcome, Err(SelectError::FundsLocked));
    // Legs 2 and 3 start with a wait (no read that would race those ahead);
    // after the first third, a leg reads again, and the last rescans.
    let expected: BTreeMap<u32, u32> =
        [(1, 1), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1), (9, 3)].into();
    assert_eq!(reads, expected);
    assert_eq!((s.stats().legs, s.stats().passed_over), (9, 2));
    // The budget is the same: one wait per leg but the last.
    assert_eq!(s.stats().waits, 8);
}

#[test]
fn without_wakeups_a_passed_over_wait_reads_like_any_timer() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let (mut s, _) = waiting_on_a_held_token(&mut rng);
    assert!(matches!(
        s.on_backoff_passed_over(&mut rng),
        Action::Fetch(_)
    ));
    assert_eq!((s.leg(), s.stats().passed_over), (2, 0));
}
