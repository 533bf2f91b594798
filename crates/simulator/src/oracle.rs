//! The oracle: the most any selection policy can do through holdfast's stores,
//! the bound the simulator measures selectors against.
//!
//! It knows every free token of the run without reading the store: one list in
//! memory, shared by all replicas of the run, filled from the store once before
//! the clock starts and kept up to date by the runner (the change a confirm
//! mints, the tokens a release frees). So it never reads, never loses a race and
//! claims exactly the tokens it needs: the smallest free token that covers the
//! amount, else the largest free ones until the amount is covered. Its select
//! is one claim (of one token, or a window of several) and nothing else; with
//! the settlement every strategy shares, its selects per second bound what a
//! selector that locks its tokens in the store can reach on a workload.
//!
//! When the free tokens do not cover the amount while others hold some, it
//! waits for them (polling every millisecond, for up to 10 s), as a selector
//! waits for freed tokens. Tokens a held request keeps, or a failed settlement
//! leaves, go out of its sight (the lease sweep frees them in the store
//! unseen): the oracle is for workloads that settle or release what they
//! select. A claim it loses means its list was wrong: the select fails with a
//! store error, which the run's figures show.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use holdfast_domain::{
    ClaimVerdict, Quantity, SelectRequest, Selected, SelectionStats, TokenId, TokenType, WalletId,
};
use holdfast_ports::{Clock, LockStore, Output, StoreFault, TokenStore, TokenStoreError};

use holdfast::selector::{SelectError, SelectReport};

type Key = (WalletId, TokenType);

/// How often a select short of free tokens looks again while others hold some.
const POLL: Duration = Duration::from_millis(1);
/// How long it looks before it answers insufficient funds.
const MAX_WAIT: Duration = Duration::from_secs(10);

/// The run's free tokens, by wallet and type, in ascending amount, and the
/// tokens handed out; one lock for both, so a token is always in one of them
/// until it is spent or lost.
#[derive(Debug, Default)]
pub struct Oracle {
    lists: Mutex<Lists>,
}

#[derive(Debug, Default)]
struct Lists {
    free: HashMap<Key, BTreeSet<(Quantity, TokenId)>>,
    /// What each token handed out holds, for its release.
    out: HashMap<TokenId, (Key, Quantity)>,
}

/// What [`Oracle::take`] found.
enum Take {
    /// These tokens cover the amount; they are handed out.
    Chosen(Vec<(Quantity, TokenId)>),
    /// The free tokens fall short, but others hold some that may come back.
    Wait,
    /// The free tokens fall short, and nothing is held: their total.
    Short(Quantity),
}

impl Oracle {
    fn lists(&self) -> MutexGuard<'_, Lists> {
        self.lists.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tracks each wallet and type in `keys`, with its free tokens as `store`
    /// lists them. Tokens of other wallets (the payee's) are never tracked.
    pub async fn fill(
        &self,
        store: &dyn TokenStore,
        keys: impl IntoIterator<Item = Key>,
    ) -> Result<(), TokenStoreError> {
        for key in keys {
            let tokens = store
                .list_tokens(&key.0, Some(key.1.clone()), usize::MAX)
                .await?;
            let mut lists = self.lists();
            let free = lists.free.entry(key).or_default();
            for t in tokens
                .into_iter()
                .filter(|t| t.spendable && t.spent_by.is_none())
            {
                free.insert((t.quantity, t.id));
            }
        }
        Ok(())
    }

    /// A confirm of `selected` committed, minting `outputs`: the selected
    /// tokens are gone, the outputs of tracked wallets free.
    pub fn settled(&self, selected: &[TokenId], outputs: &[(TokenId, Output)]) {
        let mut lists = self.lists();
        for id in selected {
            lists.out.remove(id);
        }
        for (id, output) in outputs {
            let key = (output.wallet.clone(), output.token_type.clone());
            if let Some(free) = lists.free.get_mut(&key) {
                free.insert((output.quantity, id.clone()));
            }
        }
    }

    /// The tokens handed out in `ids` are free again.
    pub fn released(&self, ids: &[TokenId]) {
        let mut lists = self.lists();
        for id in ids {
            if let Some((key, quantity)) = lists.out.remove(id) {
                lists
                    .free
                    .entry(key)
                    .or_default()
                    .insert((quantity, id.clone()));
            }
        }
    }

    /// The tokens handed out in `ids` are out of the oracle's sight (a failed
    /// settlement, a held request, a lost claim): no longer waited for.
    pub fn forget(&self, ids: &[TokenId]) {
        let mut lists = self.lists();
        for id in ids {
            lists.out.remove(id);
        }
    }

    /// Takes the tokens that cover `amount` out of the list: the smallest that
    /// covers it alone, else the largest until covered.
    fn take(&self, key: &Key, amount: Quantity) -> Take {
        let mut lists = self.lists();
        let Lists { free, out } = &mut *lists;
        let Some(tokens) = free.get_mut(key) else {
            return Take::Short(Quantity::ZERO);
        };
        let chosen = match tokens.iter().find(|(q, _)| *q >= amount).cloned() {
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
                    return if out.values().any(|(k, _)| k == key) {
                        Take::Wait
                    } else {
                        Take::Short(short)
                    };
                }
                chosen
            }
        };
        for token in &chosen {
            tokens.remove(token);
            out.insert(token.1.clone(), (key.clone(), token.0));
        }
        Take::Chosen(chosen)
    }
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
            let available = match self.oracle.take(&key, request.amount) {
                Take::Chosen(chosen) => break chosen,
                // What others hold may come back: wait for it, as a selector would.
                Take::Wait if since.elapsed() < MAX_WAIT => {
                    stats.immediate_retries += 1;
                    tokio::time::sleep(POLL).await;
                    continue;
                }
                Take::Wait => Quantity::ZERO,
                Take::Short(available) => available,
            };
            return Err(SelectError::InsufficientFunds {
                available,
                requested: request.amount,
            });
        };
        let ids: Vec<TokenId> = chosen.iter().map(|(_, id)| id.clone()).collect();
        let n = u64::try_from(ids.len()).unwrap_or(u64::MAX);
        // One round trip, as a window claim of holdfast's.
        stats.claims += 1;
        stats.lock_attempts += n;
        stats.distinct_tokens_attempted += n;
        let at = self.clock.now();
        let verdicts = if let [one] = ids.as_slice() {
            self.locks
                .claim(&request.consumer, one, at)
                .await
                .map(|v| vec![(one.clone(), v)])
        } else {
            self.locks.claim_window(&request.consumer, &ids, at).await
        };
        let all_won = verdicts
            .as_ref()
            .is_ok_and(|v| v.len() == ids.len() && v.iter().all(|(_, v)| *v == ClaimVerdict::Won));
        if !all_won {
            stats.store_errors += 1;
            self.oracle.forget(&ids);
            return Err(SelectError::Store(StoreFault::Backend(format!(
                "the oracle's claim of {ids:?} answered {verdicts:?}: its free list is wrong"
            ))));
        }
        let mut total = Quantity::ZERO;
        for (quantity, _) in &chosen {
            total = total.checked_add(*quantity).ok_or_else(|| {
                SelectError::Store(StoreFault::Backend(
                    "selected amounts overflow 128 bits".to_owned(),
                ))
            })?;
        }
        Ok(Selected {
            tokens: ids,
            total,
            change: total.saturating_sub(request.amount),
        })
    }
}
