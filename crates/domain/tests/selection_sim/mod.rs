//! A test driver for the selection engine: an in-memory wallet (ascending pages by
//! keyset cursor, the anti-join, locks held by "others", stale tokens, injected
//! store failures) that performs the engine's actions and records a text trace.
//!
//! Test-only: the shipped API is the engine; this is how tests drive it.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use holdfast_domain::{
    Action, Candidate, ClaimVerdict, FaultKind, Precision, Quantity, SelectError, SelectRequest,
    Selected, Selection, SelectionConfig, SelectionStats, StoreFault, TokenId, TokenType, TxId,
    WalletId,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The most actions one run may take before the driver gives up (an engine that
/// loops for ever fails the test instead of hanging it).
pub const STEP_LIMIT: usize = 100_000;

pub fn q(v: u128) -> Quantity {
    Quantity::new(v, Precision::MAX).expect("test amount")
}

/// The token `tNN:0`, named by its position in the wallet.
pub fn tid(n: usize) -> TokenId {
    TokenId::new(TxId::new(format!("t{n:02}")).expect("tx id"), 0)
}

/// The consumer every test selects for.
pub fn consumer() -> TxId {
    TxId::new("consumer").expect("tx id")
}

#[derive(Debug, Clone)]
pub struct SimToken {
    pub id: TokenId,
    pub quantity: Quantity,
    pub spendable: bool,
}

/// An in-memory wallet and lock table.
#[derive(Debug, Clone, Default)]
pub struct Wallet {
    pub tokens: Vec<SimToken>,
    /// Lock table: token -> holder ("consumer" or "other").
    pub locks: BTreeMap<TokenId, String>,
    /// Tokens another worker grabs just before our claim, this many more times
    /// (`u32::MAX`: for ever). They show up as candidates but lose the race.
    pub hot: BTreeMap<TokenId, u32>,
    /// Tokens that are spendable in the candidate read but spent by the time we
    /// claim them (they turn stale, and unspendable, at the claim).
    pub stale_at_claim: BTreeSet<TokenId>,
    /// The next this-many fetches / claims / balance reads / releases fail.
    pub fail_fetches: u32,
    pub fail_claims: u32,
    pub fail_balances: u32,
    pub fail_releases: u32,
}

impl Wallet {
    /// Tokens `t00`, `t01`, ... with these amounts.
    pub fn of(amounts: &[u128]) -> Self {
        Wallet {
            tokens: amounts
                .iter()
                .enumerate()
                .map(|(i, v)| SimToken {
                    id: tid(i),
                    quantity: q(*v),
                    spendable: true,
                })
                .collect(),
            ..Wallet::default()
        }
    }

    pub fn hot(mut self, token: usize, losses: u32) -> Self {
        self.hot.insert(tid(token), losses);
        self
    }

    pub fn locked_by_other(mut self, token: usize) -> Self {
        self.locks.insert(tid(token), "other".into());
        self
    }

    pub fn stale(mut self, token: usize) -> Self {
        self.stale_at_claim.insert(tid(token));
        self
    }

    pub fn quantity_of(&self, id: &TokenId) -> Option<Quantity> {
        self.tokens.iter().find(|t| &t.id == id).map(|t| t.quantity)
    }

    /// The candidate read: spendable, unlocked (anti-join), ascending by
    /// (quantity, id), strictly after the cursor, at most `limit`.
    fn candidates(&self, after: Option<&Candidate>, limit: usize) -> Vec<Candidate> {
        let mut rows: Vec<Candidate> = self
            .tokens
            .iter()
            .filter(|t| t.spendable && !self.locks.contains_key(&t.id))
            .map(|t| Candidate {
                id: t.id.clone(),
                quantity: t.quantity,
            })
            .collect();
        rows.sort_by(|a, b| (a.quantity, &a.id).cmp(&(b.quantity, &b.id)));
        rows.into_iter()
            .filter(|c| after.is_none_or(|a| (c.quantity, &c.id) > (a.quantity, &a.id)))
            .take(limit)
            .collect()
    }

    /// The window claim: per token won, stale or contended.
    fn claim(&mut self, ids: &[TokenId]) -> Vec<(TokenId, ClaimVerdict)> {
        ids.iter()
            .map(|id| {
                if self.stale_at_claim.remove(id) {
                    if let Some(t) = self.tokens.iter_mut().find(|t| &t.id == id) {
                        t.spendable = false;
                    }
                }
                let spendable = self.tokens.iter().any(|t| &t.id == id && t.spendable);
                let verdict = if !spendable {
                    ClaimVerdict::Stale
                } else if self.locks.contains_key(id) {
                    ClaimVerdict::Contended
                } else if let Some(losses) = self.hot.get_mut(id).filter(|l| **l > 0) {
                    if *losses != u32::MAX {
                        *losses -= 1;
                    }
                    ClaimVerdict::Contended
                } else {
                    self.locks.insert(id.clone(), "consumer".into());
                    ClaimVerdict::Won
                };
                (id.clone(), verdict)
            })
            .collect()
    }

    pub fn balance(&self) -> Quantity {
        self.tokens
            .iter()
            .filter(|t| t.spendable)
            .fold(Quantity::ZERO, |sum, t| {
                sum.checked_add(t.quantity).expect("test balance")
            })
    }

    /// What the store reports to the select: the balance less what "consumer"
    /// holds (the engine adds its own wins back).
    pub fn balance_for_consumer(&self) -> Quantity {
        self.tokens
            .iter()
            .filter(|t| t.spendable)
            .filter(|t| self.locks.get(&t.id).is_none_or(|h| h != "consumer"))
            .fold(Quantity::ZERO, |sum, t| {
                sum.checked_add(t.quantity).expect("test balance")
            })
    }

    fn release(&mut self, ids: &[TokenId]) {
        for id in ids {
            if self.locks.get(id).is_some_and(|h| h == "consumer") {
                self.locks.remove(id);
            }
        }
    }

    /// Tokens the consumer holds in the lock table.
    pub fn held_by_consumer(&self) -> BTreeSet<TokenId> {
        self.locks
            .iter()
            .filter(|(_, h)| *h == "consumer")
            .map(|(t, _)| t.clone())
            .collect()
    }
}

fn take_fault(counter: &mut u32) -> bool {
    if *counter > 0 {
        *counter -= 1;
        true
    } else {
        false
    }
}

/// What one driven call produced.
#[derive(Debug, Clone)]
pub struct Run {
    pub outcome: Result<Selected, SelectError>,
    pub trace: String,
    pub stats: SelectionStats,
    pub wallet: Wallet,
    pub claims: Vec<Vec<TokenId>>,
    /// Per claim: the verdicts (empty on a store error) and how many times the
    /// blacklist had been cleared when the claim was proposed.
    pub verdicts: Vec<(Vec<(TokenId, ClaimVerdict)>, u64)>,
    pub backoffs: Vec<Duration>,
    /// `held()` after the call ended.
    pub held_after: Vec<TokenId>,
}

impl Run {
    pub fn picked(&self) -> Vec<TokenId> {
        match &self.outcome {
            Ok(selected) => selected.tokens.clone(),
            Err(_) => Vec::new(),
        }
    }
}

pub fn request(amount: u128) -> SelectRequest {
    SelectRequest {
        wallet: WalletId::new("w").expect("wallet"),
        token_type: TokenType::new("CHF").expect("type"),
        amount: q(amount),
        consumer: consumer(),
    }
}

fn name(wallet: &Wallet, id: &TokenId) -> String {
    match wallet.quantity_of(id) {
        Some(quantity) => format!("{}={quantity}", id.tx),
        None => id.to_string(),
    }
}

fn names(wallet: &Wallet, ids: &[TokenId]) -> String {
    let parts: Vec<String> = ids.iter().map(|id| name(wallet, id)).collect();
    format!("[{}]", parts.join(" "))
}

/// Runs one Select call for `amount` against `wallet` with a ChaCha8 RNG seeded
/// with `seed`, recording every action and answer.
pub fn run(wallet: Wallet, amount: u128, config: SelectionConfig, seed: u64) -> Run {
    let mut wallet = wallet;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut selection = Selection::new(request(amount), config).expect("valid selection");
    let mut trace = String::new();
    let mut claims = Vec::new();
    let mut verdict_log = Vec::new();
    let mut backoffs = Vec::new();
    let mut action = selection.start(&mut rng);
    for _ in 0..STEP_LIMIT {
        let leg = selection.leg();
        action = match action {
            Action::Fetch(fetch) => {
                let after = fetch
                    .after
                    .as_ref()
                    .map_or("-".to_owned(), |c| format!("{}={}", c.id.tx, c.quantity));
                let bands = fetch.bands.map_or(String::new(), |b| {
                    format!(" bands>={}:{}", b.threshold, b.cover)
                });
                let _ = write!(
                    trace,
                    "L{leg} fetch after={after} limit={}{bands} refresh={} -> ",
                    fetch.limit, fetch.refresh
                );
                if take_fault(&mut wallet.fail_fetches) {
                    let _ = writeln!(trace, "store error");
                    selection.on_candidates(
                        Err(StoreFault::new(FaultKind::Unavailable, "fetch failed")),
                        &mut rng,
                    )
                } else {
                    let page = match fetch.bands {
                        Some(b) => b.answer(
                            &wallet.candidates(None, usize::MAX),
                            fetch.after.as_ref(),
                            fetch.limit,
                        ),
                        None => wallet.candidates(fetch.after.as_ref(), fetch.limit),
                    };
                    let ids: Vec<TokenId> = page.iter().map(|c| c.id.clone()).collect();
                    let _ = writeln!(trace, "{} rows {}", page.len(), short(&wallet, &ids));
                    selection.on_candidates(Ok(page), &mut rng)
                }
            }
            Action::Claim(ids) => {
                let _ = write!(trace, "L{leg} claim {} -> ", short(&wallet, &ids));
                claims.push(ids.clone());
                let clears = selection.stats().blacklist_clears;
                if take_fault(&mut wallet.fail_claims) {
                    verdict_log.push((Vec::new(), clears));
                    let _ = writeln!(trace, "store error");
                    selection.on_claim(
                        Err(StoreFault::new(FaultKind::Busy, "claim failed")),
                        &mut rng,
                    )
                } else {
                    let verdicts = wallet.claim(&ids);
                    verdict_log.push((verdicts.clone(), clears));
                    let mut counts = BTreeMap::new();
                    for (_, v) in &verdicts {
                        *counts.entry(format!("{v:?}").to_lowercase()).or_insert(0) += 1;
                    }
                    if verdicts.len() <= 8 {
                        let parts: Vec<String> = verdicts
                            .iter()
                            .map(|(t, v)| format!("{}:{}", t.tx, format!("{v:?}").to_lowercase()))
                            .collect();
                        let _ = writeln!(trace, "{}", parts.join(" "));
                    } else {
                        let parts: Vec<String> =
                            counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
                        let _ = writeln!(trace, "{}", parts.join(", "));
                    }
                    selection.on_claim(Ok(verdicts), &mut rng)
                }
            }
            Action::CheckBalance => {
                let _ = write!(trace, "L{leg} balance -> ");
                if take_fault(&mut wallet.fail_balances) {
                    let _ = writeln!(trace, "store error");
                    selection.on_balance(
                        Err(StoreFault::new(FaultKind::Timeout, "balance failed")),
                        &mut rng,
                    )
                } else {
                    let balance = wallet.balance_for_consumer();
                    let _ = writeln!(trace, "{balance}");
                    selection.on_balance(Ok(balance), &mut rng)
                }
            }
            Action::Release(ids) => {
                let _ = write!(trace, "L{leg} release {} -> ", names(&wallet, &ids));
                if take_fault(&mut wallet.fail_releases) {
                    let _ = writeln!(trace, "store error");
                    selection.on_released(
                        Err(StoreFault::new(FaultKind::Backend, "release failed")),
                        &mut rng,
                    )
                } else {
                    wallet.release(&ids);
                    let _ = writeln!(trace, "ok");
                    selection.on_released(Ok(()), &mut rng)
                }
            }
            Action::Backoff(delay) => {
                let _ = writeln!(trace, "L{leg} backoff {delay:?}");
                backoffs.push(delay);
                selection.on_backoff_elapsed(&mut rng)
            }
            Action::Done(outcome) => {
                match &outcome {
                    Ok(s) => {
                        let _ = writeln!(
                            trace,
                            "done ok tokens={} total={} change={}",
                            short(&wallet, &s.tokens),
                            s.total,
                            s.change
                        );
                    }
                    Err(e) => {
                        let _ = writeln!(trace, "done err {e}");
                    }
                }
                let stats = selection.stats().clone();
                let _ = writeln!(trace, "stats {stats:?}");
                return Run {
                    outcome,
                    trace,
                    stats,
                    held_after: selection.held(),
                    wallet,
                    claims,
                    verdicts: verdict_log,
                    backoffs,
                };
            }
        };
    }
    panic!("selection did not finish within {STEP_LIMIT} actions:\n{trace}");
}

/// A list of tokens, abbreviated when long.
fn short(wallet: &Wallet, ids: &[TokenId]) -> String {
    if ids.len() <= 8 {
        return names(wallet, ids);
    }
    let head = names(wallet, &ids[..3]);
    let tail = names(wallet, &ids[ids.len() - 2..]);
    format!(
        "{} .. {} ({} tokens)",
        head.trim_end_matches(']'),
        tail.trim_start_matches('['),
        ids.len()
    )
}
