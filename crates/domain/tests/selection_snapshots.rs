//! The full decision trace of three Select calls with fixed seeds and wallets,
//! pinned as insta snapshots. A changed snapshot is a changed behaviour: review it
//! like code.

use crate::selection_sim;

use std::time::Duration;

use holdfast_domain::SelectionConfig;

use crate::selection::smallest_first;
use selection_sim::{Wallet, run};

/// One snapshot: the wallet, the request, the config deltas and the trace.
fn check(title: &str, wallet: Wallet, amount: u128, config: SelectionConfig, seed: u64) -> String {
    let r = run(wallet, amount, config.clone(), seed);
    format!(
        "{title}\nrequest {amount}, seed {seed}, page_size {}, batch_window {}, window {}x{}, \
         immediate {}, legs {}\n---\n{}",
        config.page_size,
        config.batch_window,
        config.sufficiency_window,
        config.max_sufficiency_ratio,
        config.max_immediate_retries,
        config.max_retries,
        r.trace
    )
}

#[test]
fn trace_hot_wallet_with_paging() {
    // Small pages show the keyset cursor and the equal-amount hold-back; t03 is
    // always contended, t05 loses once, t07 turns stale at the claim.
    let wallet = Wallet::of(&[1, 1, 2, 2, 2, 5, 5, 9])
        .hot(3, u32::MAX)
        .hot(5, 1)
        .stale(7);
    let config = SelectionConfig {
        page_size: 4,
        ..smallest_first()
    };
    insta::assert_snapshot!(
        "hot_wallet_with_paging",
        check("hot wallet, pages of 4", wallet, 12, config, 11)
    );
}

#[test]
fn trace_dust_then_anchor() {
    // 60 dust tokens fill one window of 32, then 28 more and an anchor drawn
    // from {50, 60, 80} (400 > 5 x 50 stays out).
    let mut amounts = vec![1u128; 60];
    amounts.extend([50, 60, 80, 400]);
    let config = SelectionConfig {
        batch_window: 32,
        ..smallest_first()
    };
    insta::assert_snapshot!(
        "dust_then_anchor",
        check("dust then anchor", Wallet::of(&amounts), 100, config, 22)
    );
}

#[test]
fn trace_dust_beyond_the_input_cap() {
    // The 300 smallest tokens and an anchor would cover 320: more inputs than
    // the cap of 100, so the call answers TooManyInputs and claims nothing.
    let mut amounts = vec![1u128; 300];
    amounts.extend([50, 60, 80, 400]);
    insta::assert_snapshot!(
        "dust_beyond_the_input_cap",
        check(
            "dust beyond the input cap",
            Wallet::of(&amounts),
            320,
            smallest_first(),
            22
        )
    );
}

#[test]
fn trace_locked_funds_through_every_leg() {
    // 3 is won and released at the end of every leg; 7 and 8 are always lost; the
    // first fetch fails. Three legs, then FundsLocked.
    let mut wallet = Wallet::of(&[3, 7, 8]).hot(1, u32::MAX).hot(2, u32::MAX);
    wallet.fail_fetches = 1;
    let config = SelectionConfig {
        max_immediate_retries: 2,
        max_retries: 3,
        retry_interval: Duration::from_secs(5),
        ..smallest_first()
    };
    insta::assert_snapshot!(
        "locked_funds_through_every_leg",
        check("locked funds", wallet, 10, config, 33)
    );
}
