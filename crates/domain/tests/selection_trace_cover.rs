//! The decision trace of the default policy, `cover_first`
//! (`SelectionConfig::default()`), alone on its wallet and beside other
//! callers, with fixed seeds and wallets, pinned as insta
//! snapshots beside `selection_snapshots.rs` (which pins `smallest_first`). A
//! changed snapshot is a changed behaviour: review it like code. Waits, wake-ups
//! and reading with the claim are the selector's: `crates/app/tests/selector_trace.rs`.

use crate::selection_sim;

use holdfast_domain::SelectionConfig;

use selection_sim::{Wallet, run};

/// One snapshot: the wallet, the request and the trace, under the defaults as
/// a select sees them with other callers of its wallet in its instance: no
/// tidying (`tidy_band`, for a select alone; [`check_alone`]).
fn check(wallet: &[u128], amount: u128, seed: u64) -> String {
    let config = SelectionConfig {
        tidy_band: 0,
        ..SelectionConfig::default()
    };
    trace(wallet, amount, seed, &config)
}

/// As [`check`], for a select alone on its wallet: the defaults as they are,
/// tidying included.
fn check_alone(wallet: &[u128], amount: u128, seed: u64) -> String {
    trace(wallet, amount, seed, &SelectionConfig::default())
}

fn trace(wallet: &[u128], amount: u128, seed: u64, config: &SelectionConfig) -> String {
    let r = run(Wallet::of(wallet), amount, config.clone(), seed);
    format!(
        "wallet {wallet:?}\nrequest {amount}, seed {seed}, policy {:?}, cover_band {}, \
         page_size {}, tidy_band {}, window {}x{}\n---\n{}",
        config.policy,
        config.cover_band,
        config.page_size,
        config.tidy_band,
        config.sufficiency_window,
        config.max_sufficiency_ratio,
        r.trace
    )
}

#[test]
fn trace_one_near_sized_token_covers_the_amount() {
    // The cover band (>= 11) is read alone: its smallest, 12, is within 5 x 11,
    // so the fill band is not needed. One of the covers within 5 x 12, {12, 13,
    // 15}, is drawn and claimed (200 is beyond); the dust stays untouched.
    insta::assert_snapshot!(
        "one_near_sized_token_covers_the_amount",
        check(&[1, 2, 5, 12, 13, 15, 200], 11, 4)
    );
}

#[test]
fn trace_without_a_near_sized_cover_the_largest_smaller_tokens_fill() {
    // The only cover, 500, is more than 5 x 20: both bands are read, and a few
    // of the largest smaller tokens are drawn until they cover 20; the dust and
    // the oversized token stay untouched.
    insta::assert_snapshot!(
        "without_a_near_sized_cover_the_largest_smaller_tokens_fill",
        check(&[1, 2, 4, 6, 7, 9, 10, 500], 20, 4)
    );
}

#[test]
fn trace_alone_on_its_wallet_a_select_takes_an_exact_set_of_the_most_inputs() {
    // No other caller: the read asks for the tidy band (512) below 11 as well as
    // the covers, and of the exact sets (11 alone; 9 + 2; 5 + 4 + 2) the one of
    // the most inputs is claimed: no change, three tokens fewer in the wallet.
    insta::assert_snapshot!(
        "alone_on_its_wallet_a_select_takes_an_exact_set_of_the_most_inputs",
        check_alone(&[1, 2, 4, 5, 9, 11, 12, 200], 11, 4)
    );
}
