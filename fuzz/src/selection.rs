//! The selection engine driven by an adversarial token store: the fuzzer's bytes
//! choose the wallet, the amount, the configuration, the RNG seed, and every
//! answer — store errors (applied or not), missing and unasked-for verdicts,
//! other consumers locking and freeing tokens, tokens going stale between calls.
//!
//! The store itself is honest about what it did, and the driver checks: the engine
//! never panics and ends; it never claims a token it knows it holds, so no token is
//! won twice; everything the store says this call holds is in
//! [`Selection::held`]; a success names distinct tokens, all held, with the right
//! total and change; a failure leaves nothing held unless a release failed; an
//! insufficient-funds verdict matches the balance the store reported; backoffs are
//! inside `[0, retry_interval)`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use holdfast_domain::{
    Action, Candidate, ClaimVerdict, FaultKind, Precision, Quantity, SelectError, SelectRequest,
    Selection, SelectionConfig, SelectionPolicy, StoreFault, TokenId, TokenType, TxId, WalletId,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::Input;

/// More steps than any input can need (small wallets, few legs); reaching it
/// means the engine does not end.
const MAX_STEPS: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Free,
    Me,
    Other,
    Gone,
}

struct Store {
    tokens: BTreeMap<TokenId, (Quantity, Owner)>,
}

impl Store {
    fn mine(&self) -> BTreeSet<TokenId> {
        self.tokens
            .iter()
            .filter(|(_, (_, o))| *o == Owner::Me)
            .map(|(t, _)| t.clone())
            .collect()
    }

    fn quantity(&self, token: &TokenId) -> Quantity {
        self.tokens.get(token).map_or(Quantity::ZERO, |(q, _)| *q)
    }

    /// Other consumers lock and release tokens, tokens are spent or retired.
    fn churn(&mut self, input: &mut Input<'_>) {
        if !input.fault(30) {
            return;
        }
        let n = u64::try_from(self.tokens.len()).unwrap_or(0);
        let pick = usize::try_from(input.below(n)).unwrap_or(0);
        if let Some((_, (_, owner))) = self.tokens.iter_mut().nth(pick) {
            *owner = match (*owner, input.byte() % 3) {
                (Owner::Me, _) => Owner::Me,
                (_, 0) => Owner::Free,
                (_, 1) => Owner::Other,
                _ => Owner::Gone,
            };
        }
    }

    /// The candidates after `after`, ascending by (quantity, id): free tokens only.
    fn page(&self, after: Option<&Candidate>, limit: usize) -> Vec<Candidate> {
        let mut free: Vec<Candidate> = self
            .tokens
            .iter()
            .filter(|(_, (_, o))| *o == Owner::Free)
            .map(|(id, (q, _))| Candidate {
                id: id.clone(),
                quantity: *q,
            })
            .collect();
        free.sort_by(|a, b| (a.quantity, &a.id).cmp(&(b.quantity, &b.id)));
        free.into_iter()
            .filter(|c| after.is_none_or(|a| (c.quantity, &c.id) > (a.quantity, &a.id)))
            .take(limit)
            .collect()
    }

    fn balance(&self) -> Quantity {
        self.tokens
            .values()
            .filter(|(_, o)| matches!(o, Owner::Free | Owner::Me | Owner::Other))
            .fold(Quantity::ZERO, |sum, (q, _)| {
                sum.checked_add(*q).unwrap_or(sum)
            })
    }

    /// What the store reports to the select: the balance less what this consumer
    /// holds (the engine adds its own wins back).
    fn balance_for_me(&self) -> Quantity {
        self.tokens
            .values()
            .filter(|(_, o)| matches!(o, Owner::Free | Owner::Other))
            .fold(Quantity::ZERO, |sum, (q, _)| {
                sum.checked_add(*q).unwrap_or(sum)
            })
    }

    /// The honest verdict for one token, applying a win.
    fn claim(&mut self, token: &TokenId) -> ClaimVerdict {
        match self.tokens.get_mut(token) {
            Some((_, owner @ Owner::Free)) => {
                *owner = Owner::Me;
                ClaimVerdict::Won
            }
            Some((_, Owner::Me | Owner::Other)) => ClaimVerdict::Contended,
            Some((_, Owner::Gone)) | None => ClaimVerdict::Stale,
        }
    }

    fn release(&mut self, token: &TokenId) {
        if let Some((_, owner @ Owner::Me)) = self.tokens.get_mut(token) {
            *owner = Owner::Free;
        }
    }
}

fn config(input: &mut Input<'_>) -> SelectionConfig {
    let n =
        |input: &mut Input<'_>, lo: u64, hi: u64| usize::try_from(input.range(lo, hi)).unwrap_or(1);
    let m =
        |input: &mut Input<'_>, lo: u64, hi: u64| u32::try_from(input.range(lo, hi)).unwrap_or(1);
    SelectionConfig {
        policy: if input.byte().is_multiple_of(2) {
            SelectionPolicy::CoverFirst
        } else {
            SelectionPolicy::SmallestFirst
        },
        cover_band: n(input, 1, 4),
        prefer_exact: input.byte().is_multiple_of(2),
        consolidate_dust: n(input, 0, 2),
        sufficiency_window: n(input, 1, 4),
        max_sufficiency_ratio: m(input, 1, 5),
        batch_window: n(input, 1, 8),
        max_inputs: n(input, 1, 8),
        page_size: n(input, 1, 8),
        max_immediate_retries: m(input, 0, 5),
        max_retries: m(input, 1, 4),
        retry_interval: Duration::from_millis(input.range(1, 5_000)),
        deadline: Duration::from_secs(30),
        wakeups: true,
        // The driver's, not the engine's: nothing here reads a snapshot.
        snapshot_ttl: Duration::ZERO,
        blacklist: input.byte() % 4 != 1,
        ascending: input.byte() % 4 != 1,
        tidy_band: n(input, 0, 8),
    }
}

fn id(kind: &str, text: String) -> TxId {
    TxId::new(text).unwrap_or_else(|e| unreachable!("{kind}: {e}"))
}

/// Runs one Select call against the adversarial store described by `data`.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let config = config(&mut input);
    let count = input.range(0, 24);
    let mut store = Store {
        tokens: (0..count)
            .map(|i| {
                let q = Quantity::new(u128::from(input.range(1, 16)), Precision::MAX)
                    .unwrap_or(Quantity::ZERO);
                let owner = if input.fault(15) {
                    Owner::Other
                } else {
                    Owner::Free
                };
                (TokenId::new(id("token", format!("t{i}")), 0), (q, owner))
            })
            .collect(),
    };
    let total = store.balance().value();
    let amount = u128::from(input.range(1, 40)) % (total + 8) + 1;
    let request = SelectRequest {
        wallet: WalletId::new("w").unwrap_or_else(|e| unreachable!("{e}")),
        token_type: TokenType::new("CHF").unwrap_or_else(|e| unreachable!("{e}")),
        amount: Quantity::new(amount, Precision::MAX).unwrap_or(Quantity::ZERO),
        consumer: id("consumer", "me".to_owned()),
    };
    let retry_interval = config.retry_interval;
    let mut selection = match Selection::new(request, config) {
        Ok(s) => s,
        Err(e) => panic!("a config in range was refused: {e}"),
    };
    let mut rng = StdRng::seed_from_u64(input.u64());
    // Tokens the engine was told it won and has not released since.
    let mut known_won: BTreeSet<TokenId> = BTreeSet::new();
    let mut release_failed = false;
    let mut last_balance = None;
    let mut woken_rest: Option<(u32, Duration)> = None;
    let mut action = selection.start(&mut rng);
    for _ in 0..MAX_STEPS {
        store.churn(&mut input);
        action = match action {
            Action::Fetch(fetch) => {
                if input.fault(10) {
                    selection.on_candidates(
                        Err(StoreFault::new(FaultKind::Unavailable, "fetch failed")),
                        &mut rng,
                    )
                } else {
                    let page = match fetch.bands {
                        Some(bands) => bands.answer(
                            &store.page(None, usize::MAX),
                            fetch.after.as_ref(),
                            fetch.limit,
                        ),
                        None => store.page(fetch.after.as_ref(), fetch.limit),
                    };
                    selection.on_candidates(Ok(page), &mut rng)
                }
            }
            Action::Claim(window) => {
                assert!(!window.is_empty(), "an empty claim");
                assert!(
                    window.len() <= selection.config().batch_window,
                    "claim over the batch window"
                );
                let distinct: BTreeSet<&TokenId> = window.iter().collect();
                assert_eq!(
                    distinct.len(),
                    window.len(),
                    "a token twice in one claim: {window:?}"
                );
                for t in &window {
                    assert!(!known_won.contains(t), "claims {t}, which it already won");
                }
                if input.fault(10) {
                    // A failed round trip: the store may have applied it anyway.
                    if input.byte().is_multiple_of(2) {
                        for t in &window {
                            store.claim(t);
                        }
                    }
                    selection.on_claim(
                        Err(StoreFault::new(FaultKind::Busy, "claim failed")),
                        &mut rng,
                    )
                } else {
                    let mut verdicts = Vec::with_capacity(window.len());
                    for t in &window {
                        let verdict = store.claim(t);
                        if input.fault(5) {
                            continue; // a verdict went missing; the claim stands
                        }
                        if verdict == ClaimVerdict::Won {
                            known_won.insert(t.clone());
                        }
                        verdicts.push((t.clone(), verdict));
                    }
                    if input.fault(5) {
                        // A verdict for a token that was not proposed: ignored.
                        let bogus = TokenId::new(id("bogus", "bogus".to_owned()), 7);
                        verdicts.push((bogus, ClaimVerdict::Won));
                    }
                    selection.on_claim(Ok(verdicts), &mut rng)
                }
            }
            Action::CheckBalance => {
                if input.fault(10) {
                    selection.on_balance(
                        Err(StoreFault::new(FaultKind::Timeout, "balance failed")),
                        &mut rng,
                    )
                } else {
                    // An insufficient-funds verdict must name the whole balance:
                    // what others can take plus what this call holds.
                    last_balance = Some(store.balance());
                    selection.on_balance(Ok(store.balance_for_me()), &mut rng)
                }
            }
            Action::Release(tokens) => {
                assert!(!tokens.is_empty(), "an empty release");
                if input.fault(10) {
                    release_failed = true;
                    if input.byte().is_multiple_of(2) {
                        for t in &tokens {
                            store.release(t);
                            known_won.remove(t);
                        }
                    }
                    selection.on_released(
                        Err(StoreFault::new(FaultKind::Backend, "release failed")),
                        &mut rng,
                    )
                } else {
                    for t in &tokens {
                        store.release(t);
                        known_won.remove(t);
                    }
                    selection.on_released(Ok(()), &mut rng)
                }
            }
            Action::Backoff(delay) => {
                assert!(
                    delay < retry_interval,
                    "backoff {delay:?} >= {retry_interval:?}"
                );
                // After a wake-up the wait goes on for its rest, never longer.
                if let Some((leg, rest)) = woken_rest
                    && leg == selection.leg()
                {
                    assert!(
                        delay <= rest,
                        "waits {delay:?} after a wake-up with {rest:?} left"
                    );
                }
                // A wake-up on 1 (of 0..4), a timer while passed over on 2:
                // input used up reads as 0, a timer, so every run ends.
                let choice = input.byte() % 4;
                if choice == 2 {
                    woken_rest = None;
                    let legs = selection.stats().legs;
                    let next = selection.on_backoff_passed_over(&mut rng);
                    assert_eq!(selection.stats().legs, legs + 1, "a timer spends a leg");
                    next
                } else if choice == 1 {
                    let waited = delay.mul_f64(f64::from(input.byte()) / 255.0);
                    woken_rest = Some((selection.leg(), delay.saturating_sub(waited)));
                    let legs = selection.stats().legs;
                    let next = selection.on_woken(waited, &mut rng);
                    assert_eq!(selection.stats().legs, legs, "a wake-up spent a leg");
                    next
                } else {
                    woken_rest = None;
                    selection.on_backoff_elapsed(&mut rng)
                }
            }
            Action::Done(outcome) => {
                check_done(&selection, &store, &outcome, release_failed, last_balance);
                return;
            }
        };
        let held: BTreeSet<TokenId> = selection.held().into_iter().collect();
        let mine = store.mine();
        assert!(
            mine.is_subset(&held),
            "the store holds {:?} for this call, which it does not know",
            mine.difference(&held).collect::<Vec<_>>()
        );
    }
    panic!("no outcome after {MAX_STEPS} steps; last action {action:?}");
}

fn check_done(
    selection: &Selection,
    store: &Store,
    outcome: &Result<holdfast_domain::Selected, SelectError>,
    release_failed: bool,
    last_balance: Option<Quantity>,
) {
    let mine = store.mine();
    let amount = selection.request().amount;
    match outcome {
        Ok(selected) => {
            let chosen: BTreeSet<TokenId> = selected.tokens.iter().cloned().collect();
            assert_eq!(
                chosen.len(),
                selected.tokens.len(),
                "a token selected twice"
            );
            assert!(
                chosen.is_subset(&mine),
                "selected tokens the store does not hold for it"
            );
            if !release_failed {
                assert_eq!(chosen, mine, "holds tokens beyond the selection");
            }
            let sum = selected
                .tokens
                .iter()
                .try_fold(Quantity::ZERO, |s, t| s.checked_add(store.quantity(t)));
            assert_eq!(sum, Some(selected.total), "total");
            assert!(selected.total >= amount, "total below the amount");
            assert!(
                selected.tokens.len() <= selection.config().max_inputs,
                "more inputs than the cap"
            );
            assert_eq!(
                selected.total.checked_sub(amount),
                Some(selected.change),
                "change"
            );
        }
        Err(failure) => {
            if !release_failed {
                assert!(mine.is_empty(), "failed with {failure} but holds {mine:?}");
            }
            if let SelectError::InsufficientFunds {
                available,
                requested,
            } = failure
            {
                assert_eq!(*requested, amount, "requested");
                assert_eq!(Some(*available), last_balance, "available");
                assert!(
                    *available < amount,
                    "insufficient with {available} >= {amount}"
                );
            }
        }
    }
}
