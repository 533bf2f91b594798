//! Properties of the selection engine, over random wallets, configurations and
//! seeds (driven against the in-memory wallet), and over arbitrary answer
//! sequences fed straight into the engine.

use crate::selection_sim;

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use holdfast_domain::{
    Action, Candidate, ClaimVerdict, FaultKind, SelectError, Selection, SelectionConfig,
    SelectionPolicy, StoreFault, TokenId,
};
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use selection_sim::{Wallet, q, request, run, tid};

#[derive(Debug, Clone)]
struct Scenario {
    amounts: Vec<u128>,
    hot: Vec<(usize, u32)>,
    stale: Vec<usize>,
    others: Vec<usize>,
    faults: [u32; 4],
    amount: u128,
    config: SelectionConfig,
    seed: u64,
}

impl Scenario {
    fn wallet(&self) -> Wallet {
        let n = self.amounts.len();
        let mut wallet = Wallet::of(&self.amounts);
        if n > 0 {
            for (i, losses) in &self.hot {
                wallet = wallet.hot(i % n, *losses);
            }
            for i in &self.stale {
                wallet = wallet.stale(i % n);
            }
            for i in &self.others {
                wallet = wallet.locked_by_other(i % n);
            }
        }
        [
            wallet.fail_fetches,
            wallet.fail_claims,
            wallet.fail_balances,
            wallet.fail_releases,
        ] = self.faults;
        wallet
    }
}

fn config() -> impl Strategy<Value = SelectionConfig> {
    (
        (
            1usize..=5,
            1u32..=6,
            prop_oneof![1usize..=8, Just(256usize)],
        ),
        (1usize..=8, 0u32..=3, 1u32..=3),
        (
            any::<bool>(),
            prop::bool::weighted(0.8),
            prop_oneof![Just(0usize), 1usize..=16],
        ),
        (
            prop::sample::select(SelectionPolicy::ALL.to_vec()),
            1usize..=4,
            any::<bool>(),
            0usize..=2,
        ),
    )
        .prop_map(
            |(
                (sufficiency_window, max_sufficiency_ratio, batch_window),
                (page_size, max_immediate_retries, max_retries),
                (blacklist, ascending, tidy_band),
                (policy, cover_band, prefer_exact, consolidate_dust),
            )| SelectionConfig {
                policy,
                cover_band,
                prefer_exact,
                consolidate_dust,
                tidy_band,
                sufficiency_window,
                max_sufficiency_ratio,
                batch_window,
                // The properties here hold below the cap (selection_oracle.rs
                // and the engine's unit tests cover the cap).
                max_inputs: holdfast_domain::MAX_INPUTS,
                page_size,
                max_immediate_retries,
                max_retries,
                retry_interval: Duration::from_millis(50),
                deadline: Duration::from_secs(30),
                wakeups: true,
                // The driver's, not the engine's.
                snapshot_ttl: Duration::ZERO,
                blacklist,
                ascending,
            },
        )
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        prop::collection::vec(prop_oneof![0u128..=3, 1u128..=60], 0..30),
        prop::collection::vec((0usize..30, prop_oneof![1u32..=3, Just(u32::MAX)]), 0..4),
        prop::collection::vec(0usize..30, 0..3),
        prop::collection::vec(0usize..30, 0..3),
        [0u32..=2, 0u32..=2, 0u32..=2, 0u32..=2],
        1u128..=200,
        config(),
        any::<u64>(),
    )
        .prop_map(
            |(amounts, hot, stale, others, faults, amount, config, seed)| Scenario {
                amounts,
                hot,
                stale,
                others,
                faults,
                amount,
                config,
                seed,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn simulated_calls_keep_every_invariant(s in scenario()) {
        let wallet = s.wallet();
        let r = run(wallet.clone(), s.amount, s.config.clone(), s.seed);
        let trace = &r.trace;
        let locked: BTreeSet<TokenId> = r.wallet.held_by_consumer();
        let held: BTreeSet<TokenId> = r.held_after.iter().cloned().collect();
        prop_assert_eq!(held.len(), r.held_after.len(), "held() repeats a token\n{}", trace);
        // Whatever the consumer holds in the store, the engine knows about.
        prop_assert!(locked.is_subset(&held), "leaked locks {:?}\n{}", locked, trace);

        for claim in &r.claims {
            prop_assert!(!claim.is_empty() && claim.len() <= s.config.batch_window.min(256));
            let distinct: HashSet<&TokenId> = claim.iter().collect();
            prop_assert_eq!(distinct.len(), claim.len(), "token twice in a claim\n{}", trace);
        }
        for d in &r.backoffs {
            prop_assert!(*d < s.config.retry_interval);
        }
        // A token that lost a race or was stale is not proposed again before the
        // blacklist is cleared.
        if s.config.blacklist {
            for (i, claim) in r.claims.iter().enumerate() {
                let clears = r.verdicts[i].1;
                for (earlier, earlier_clears) in &r.verdicts[..i] {
                    if *earlier_clears != clears {
                        continue;
                    }
                    for (token, verdict) in earlier {
                        if *verdict != ClaimVerdict::Won {
                            prop_assert!(!claim.contains(token),
                                "blacklisted {} proposed again\n{}", token, trace);
                        }
                    }
                }
            }
        }

        match &r.outcome {
            Ok(selected) => {
                let ids: BTreeSet<&TokenId> = selected.tokens.iter().collect();
                prop_assert_eq!(ids.len(), selected.tokens.len(), "selected twice\n{}", trace);
                let total = selected.tokens.iter().fold(0u128, |sum, t| {
                    let i: usize = t.tx.as_str()[1..].parse().unwrap();
                    sum + s.amounts[i]
                });
                prop_assert_eq!(selected.total, q(total));
                prop_assert!(selected.total >= q(s.amount));
                prop_assert_eq!(Some(selected.change), selected.total.checked_sub(q(s.amount)));
                for t in &selected.tokens {
                    prop_assert!(locked.contains(t), "{} selected but not locked\n{}", t, trace);
                }
            }
            Err(failure) => {
                if s.faults[3] == 0 {
                    prop_assert!(locked.is_empty(), "failure left locks\n{}", trace);
                    prop_assert!(r.held_after.is_empty(), "failure left held\n{}", trace);
                }
                if let SelectError::InsufficientFunds { available, requested } = failure {
                    prop_assert_eq!(*requested, q(s.amount));
                    prop_assert_eq!(*available, r.wallet.balance());
                    prop_assert!(*available < *requested);
                }
            }
        }
        if r.wallet.balance() >= q(s.amount) {
            let insufficient = matches!(r.outcome, Err(SelectError::InsufficientFunds { .. }));
            prop_assert!(!insufficient, "{}", trace);
        }
        // A store failure is only ever reported when the store failed.
        if r.stats.store_errors == 0 && r.stats.other_store_errors == 0 {
            let store = matches!(r.outcome, Err(SelectError::Store(_)));
            prop_assert!(!store, "{}", trace);
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_trace(s in scenario()) {
        let a = run(s.wallet(), s.amount, s.config.clone(), s.seed);
        let b = run(s.wallet(), s.amount, s.config.clone(), s.seed);
        prop_assert_eq!(a.trace, b.trace);
    }
}

/// One input to the engine, chosen without regard to what it asked.
#[derive(Debug, Clone)]
enum Input {
    Start,
    Page(Result<Vec<(usize, u128)>, ()>),
    /// Verdicts: either for the tokens just proposed (`echo`) or for arbitrary ids.
    Claim {
        echo: bool,
        verdicts: Vec<(usize, u8)>,
        error: bool,
    },
    Balance(Result<u128, ()>),
    Released(bool),
    Backoff,
    PassedOver,
}

fn input() -> impl Strategy<Value = Input> {
    let page = prop::collection::vec((0usize..12, 0u128..=20), 0..6);
    prop_oneof![
        1 => Just(Input::Start),
        4 => prop_oneof![4 => page.prop_map(Ok), 1 => Just(Err(()))].prop_map(Input::Page),
        4 => (any::<bool>(), prop::collection::vec((0usize..12, 0u8..3), 0..6), prop::bool::weighted(0.15))
            .prop_map(|(echo, verdicts, error)| Input::Claim { echo, verdicts, error }),
        2 => prop_oneof![4 => (0u128..=60).prop_map(Ok), 1 => Just(Err(()))].prop_map(Input::Balance),
        2 => any::<bool>().prop_map(Input::Released),
        1 => Just(Input::Backoff),
        1 => Just(Input::PassedOver),
    ]
}

fn verdict(code: u8) -> ClaimVerdict {
    match code {
        0 => ClaimVerdict::Won,
        1 => ClaimVerdict::Stale,
        _ => ClaimVerdict::Contended,
    }
}

fn small_config() -> impl Strategy<Value = SelectionConfig> {
    (
        1usize..=4,
        1usize..=4,
        0u32..=2,
        1u32..=2,
        any::<bool>(),
        prop::sample::select(SelectionPolicy::ALL.to_vec()),
    )
        .prop_map(
            |(batch_window, page_size, max_immediate_retries, max_retries, blacklist, policy)| {
                SelectionConfig {
                    policy,
                    batch_window,
                    page_size,
                    max_immediate_retries,
                    max_retries,
                    blacklist,
                    ..SelectionConfig::default()
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    /// Arbitrary answers in arbitrary order: the engine never panics, never names
    /// a token twice in a claim, and a success never holds a token twice and has
    /// change = total - amount.
    #[test]
    fn arbitrary_answers_never_panic_nor_select_twice(
        amount in 1u128..=40,
        config in small_config(),
        inputs in prop::collection::vec(input(), 0..80),
        seed in any::<u64>(),
    ) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut s = Selection::new(request(amount), config).unwrap();
        let mut last_claim: Vec<TokenId> = Vec::new();
        let amounts = |page: &[(usize, u128)]| -> Vec<Candidate> {
            page.iter().map(|(i, v)| Candidate { id: tid(*i), quantity: q(*v) }).collect()
        };
        for input in inputs {
            let action = match input {
                Input::Start => s.start(&mut rng),
                Input::Page(page) => s.on_candidates(
                    page.map(|p| amounts(&p)).map_err(|()| StoreFault::new(FaultKind::Unavailable, "boom")),
                    &mut rng,
                ),
                Input::Claim { echo, verdicts, error } => {
                    let answer = if error {
                        Err(StoreFault::new(FaultKind::Unavailable, "boom"))
                    } else if echo {
                        Ok(last_claim
                            .iter()
                            .zip(verdicts.iter().map(|(_, v)| *v).chain(std::iter::repeat(0)))
                            .map(|(t, v)| (t.clone(), verdict(v)))
                            .collect())
                    } else {
                        Ok(verdicts.iter().map(|(i, v)| (tid(*i), verdict(*v))).collect())
                    };
                    s.on_claim(answer, &mut rng)
                }
                Input::Balance(b) => s.on_balance(
                    b.map(q).map_err(|()| StoreFault::new(FaultKind::Unavailable, "boom")),
                    &mut rng,
                ),
                Input::Released(ok) => s.on_released(
                    if ok { Ok(()) } else { Err(StoreFault::new(FaultKind::Unavailable, "boom")) },
                    &mut rng,
                ),
                Input::Backoff => s.on_backoff_elapsed(&mut rng),
                Input::PassedOver => s.on_backoff_passed_over(&mut rng),
            };
            let held = s.held();
            let distinct: HashSet<&TokenId> = held.iter().collect();
            prop_assert_eq!(distinct.len(), held.len());
            match action {
                Action::Claim(ids) => {
                    prop_assert!(!ids.is_empty() && ids.len() <= 256);
                    let distinct: HashSet<&TokenId> = ids.iter().collect();
                    prop_assert_eq!(distinct.len(), ids.len());
                    last_claim = ids;
                }
                Action::Done(Ok(selected)) => {
                    let distinct: HashSet<&TokenId> = selected.tokens.iter().collect();
                    prop_assert_eq!(distinct.len(), selected.tokens.len(), "selected twice");
                    prop_assert!(selected.total >= q(amount));
                    prop_assert_eq!(Some(selected.change), selected.total.checked_sub(q(amount)));
                    prop_assert!(selected.tokens.iter().all(|t| held.contains(t)));
                }
                Action::Done(Err(_)) | Action::Fetch(_) | Action::CheckBalance
                | Action::Release(_) | Action::Backoff(_) => {}
            }
        }
    }
}
