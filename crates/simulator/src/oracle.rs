//! The oracle: the most any selection policy can do through holdfast's stores,
//! the bound the simulator measures selectors against.
//!
//! It knows every free token of the run without reading the store: one list in
//! memory, shared by all replicas of the run, filled from the store once before
//! the clock starts and kept up to date by the runner (the change a confirm
//! mints, the tokens a release frees). So it never reads, never loses a race and
//! claims exactly the tokens it needs: the smallest free token that covers the
//! amount, else the largest free ones until the amount is covered. Its select is
//! one claim per token and nothing else; with the settlement every strategy
//! shares, its selects per second bound what a selector that locks its tokens
//! in the store can reach on a workload.
//!
//! When the free tokens do not cover the amount while others hold some, it
//! waits for them (polling every millisecond, for up to 10 s), as a selector
//! waits for freed tokens. Tokens a held request keeps are not returned to the list (the lease sweep
//! frees them in the store unseen): the oracle is for workloads that settle or
//! release what they select. A claim it loses means its list was wrong, and the
//! select fails with a store error, which the run's figures show.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use holdfast_domain::{
    ClaimVerdict, Quantity, SelectRequest, Selected, SelectionStats, TokenId, TokenType, WalletId,
};
use holdfast_ports::{Clock, LockStore, StoreFault, TokenStore, TokenStoreError};

use holdfast::selector::{SelectError, SelectReport};

type Key = (WalletId, TokenType);

/// How often a select short of free tokens looks again while others hold some.
const POLL: Duration = Duration::from_millis(1);
/// How long it looks before it answers insufficient funds.
const MAX_WAIT: Duration = Duration::from_secs(10);

/// The run's free tokens, by wallet and type, in ascending amount.
#[derive(Debug, Default)]
pub struct Oracle {
    free: Mutex<HashMap<Key, BTreeSet<(Quantity, TokenId)>>>,
    /// What each token handed out holds, for its release.
    out: Mutex<HashMap<TokenId, (Key, Quantity)>>,
}

impl Oracle {
    /// Adds the free tokens of each wallet and type in `keys`, as `store` lists them.
    pub async fn fill(
        &self,
        store: &dyn TokenStore,
        keys: impl IntoIterator<Item = Key>,
    ) -> Result<(), TokenStoreError> {
        for (wallet, token_type) in keys {
            let tokens = store
                .list_tokens(&wallet, Some(token_type.clone()), usize::MAX)
                .await?;
            for t in tokens
                .into_iter()
                .filter(|t| t.spendable && t.spent_by.is_none())
            {
                self.add(&t.wallet, &t.token_type, t.id, t.quantity);
            }
        }
        Ok(())
    }

    /// `id`, holding `quantity`, is free (minted, or released).
    pub fn add(&self, wallet: &WalletId, token_type: &TokenType, id: TokenId, quantity: Quantity) {
        lock(&self.free)
            .entry((wallet.clone(), token_type.clone()))
            .or_default()
            .insert((quantity, id));
    }

    /// The tokens handed out in `ids` are free again.
    pub fn released(&self, ids: &[TokenId]) {
        let freed: Vec<(TokenId, (Key, Quantity))> = {
            let mut out = lock(&self.out);
            ids.iter()
                .filter_map(|id| out.remove(id).map(|was| (id.clone(), was)))
                .collect()
        };
        for (id, ((wallet, token_type), quantity)) in freed {
            self.add(&wallet, &token_type, id, quantity);
        }
    }

    /// The tokens handed out in `ids` are spent.
    pub fn spent(&self, ids: &[TokenId]) {
        let mut out = lock(&self.out);
        for id in ids {
            out.remove(id);
        }
    }

    /// Whether a token of `key` is handed out (it may come back).
    fn holds(&self, key: &Key) -> bool {
        lock(&self.out).values().any(|(k, _)| k == key)
    }

    /// Takes the tokens that cover `amount` out of the list: the smallest that
    /// covers it alone, else the largest until covered. `Err`: the free total.
    fn take(&self, key: &Key, amount: Quantity) -> Result<Vec<(Quantity, TokenId)>, Quantity> {
        let mut free = lock(&self.free);
        let Some(tokens) = free.get_mut(key) else {
            return Err(Quantity::ZERO);
        };
        let cover = tokens.iter().find(|(q, _)| *q >= amount).cloned();
        let chosen = match cover {
            Some(one) => vec![one],
            None => {
                // None: beyond 128 bits, so covered.
                let mut sum = Some(Quantity::ZERO);
                let mut chosen = Vec::new();
                for token in tokens.iter().rev() {
                    sum = sum.and_then(|s| s.checked_add(token.0));
                    chosen.push(token.clone());
                    if sum.is_none_or(|s| s >= amount) {
                        break;
                    }
                }
                if let Some(short) = sum.filter(|s| *s < amount) {
                    return Err(short);
                }
                chosen
            }
        };
        for token in &chosen {
            tokens.remove(token);
        }
        let mut out = lock(&self.out);
        for (quantity, id) in &chosen {
            out.insert(id.clone(), (key.clone(), *quantity));
        }
        Ok(chosen)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One replica's oracle selector: the run's [`Oracle`] and the replica's lock store.
pub struct OracleSelector {
    oracle: Arc<Oracle>,
    locks: Arc<dyn LockStore>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for OracleSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OracleSelector").finish_non_exhaustive()
    }
}

impl OracleSelector {
    /// A selector claiming through `locks` what `oracle` hands out.
    pub fn new(oracle: Arc<Oracle>, locks: Arc<dyn LockStore>, clock: Arc<dyn Clock>) -> Self {
        OracleSelector {
            oracle,
            locks,
            clock,
        }
    }

    /// The run's oracle.
    pub fn oracle(&self) -> &Oracle {
        &self.oracle
    }

    /// Selects `request`'s amount: claims the tokens the oracle hands out.
    pub async fn select_seeded(&self, request: &SelectRequest, seed: u64) -> SelectReport {
        let started = tokio::time::Instant::now();
        let mut stats = SelectionStats {
            legs: 1,
            ..SelectionStats::default()
        };
        let result = self.claim(request, &mut stats).await;
        SelectReport {
            result,
            stats,
            seed,
            elapsed: started.elapsed(),
        }
    }

    async fn claim(
        &self,
        request: &SelectRequest,
        stats: &mut SelectionStats,
    ) -> Result<Selected, SelectError> {
        let key = (request.wallet.clone(), request.token_type.clone());
        let since = tokio::time::Instant::now();
        let chosen = loop {
            match self.oracle.take(&key, request.amount) {
                Ok(chosen) => break chosen,
                // What others hold may come back: wait for it, as a selector would.
                Err(_) if self.oracle.holds(&key) && since.elapsed() < MAX_WAIT => {
                    stats.immediate_retries += 1;
                    tokio::time::sleep(POLL).await;
                }
                Err(available) => {
                    return Err(SelectError::InsufficientFunds {
                        available,
                        requested: request.amount,
                    });
                }
            }
        };
        let mut total = Quantity::ZERO;
        let mut tokens = Vec::new();
        for (quantity, id) in chosen {
            stats.claims += 1;
            stats.lock_attempts += 1;
            stats.distinct_tokens_attempted += 1;
            let verdict = self
                .locks
                .claim(&request.consumer, &id, self.clock.now())
                .await;
            if !matches!(verdict, Ok(ClaimVerdict::Won)) {
                stats.store_errors += 1;
                return Err(SelectError::Store(StoreFault::Backend(format!(
                    "the oracle's claim of {id} answered {verdict:?}: its free list is wrong"
                ))));
            }
            total = total.checked_add(quantity).ok_or_else(|| {
                SelectError::Store(StoreFault::Backend(
                    "selected amounts overflow 128 bits".to_owned(),
                ))
            })?;
            tokens.push(id);
        }
        Ok(Selected {
            tokens,
            total,
            change: total.saturating_sub(request.amount),
        })
    }
}
