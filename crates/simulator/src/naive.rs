//! The naive selector the simulator compares holdfast with: how token selection
//! behaved before the lock-contention work.
//!
//! - **No anti-join:** candidates are the wallet's unspent tokens, locked or not,
//!   from a per-replica cache of the whole wallet (upstream's eager fetcher),
//!   reloaded (one reload at a time) when older than [`NaiveConfig::cache_refresh`]
//!   or after a stale verdict.
//! - **Random order:** each scan is a fresh random permutation (a 1 CHF request
//!   may lock a 296 CHF token).
//! - **No blacklist, no sufficiency window, one token at a time:** every scan
//!   tries every candidate not already won, one claim per round trip.
//! - **Locks released only by the lease:** a failed select keeps what it won; the
//!   lease sweep is the only release (spending a token still removes its lock,
//!   because spending is the one port that marks tokens spent).
//! - It keeps the same budget as holdfast (immediate retries per leg, legs, backoff
//!   uniform in `[0, retry_interval)`) and the same fast fail (no contention seen
//!   and the lock-ignoring balance below the full amount: insufficient funds).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use holdfast_domain::{
    Candidate, ClaimVerdict, Quantity, SelectRequest, Selected, SelectionStats, TokenId, TokenType,
    WalletId,
};
use holdfast_ports::{Clock, LockStore, StoreFault, TokenStore, TokenStoreError};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use holdfast::selector::{SelectError, SelectReport};

/// How many tokens one cache load reads at most (the whole wallet, in practice).
pub const NAIVE_READ_LIMIT: usize = 10_000_000;

/// The naive selector's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NaiveConfig {
    /// Legs per call, the first included.
    pub legs: u32,
    /// Rescans without a won lock allowed in one leg.
    pub max_immediate_retries: u32,
    /// Backoff between legs is uniform in `[0, retry_interval)`.
    pub retry_interval: Duration,
    /// The wallet cache is reloaded when older than this (upstream: 1 s).
    pub cache_refresh: Duration,
}

struct CacheEntry {
    tokens: Arc<Vec<Candidate>>,
    loaded: Instant,
    valid: bool,
}

/// The naive selector of one replica. Safe to call concurrently.
pub struct NaiveSelector {
    tokens: Arc<dyn TokenStore>,
    locks: Arc<dyn LockStore>,
    clock: Arc<dyn Clock>,
    config: NaiveConfig,
    cache: Mutex<HashMap<(WalletId, TokenType), CacheEntry>>,
    /// One reload at a time (upstream's refreshes are single-flight).
    reloading: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for NaiveSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NaiveSelector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl NaiveSelector {
    /// A naive selector over these stores.
    pub fn new(
        tokens: Arc<dyn TokenStore>,
        locks: Arc<dyn LockStore>,
        clock: Arc<dyn Clock>,
        config: NaiveConfig,
    ) -> Self {
        NaiveSelector {
            tokens,
            locks,
            clock,
            config,
            cache: Mutex::new(HashMap::new()),
            reloading: tokio::sync::Mutex::new(()),
        }
    }

    async fn fetch(
        &self,
        wallet: &WalletId,
        token_type: &TokenType,
        stats: &mut SelectionStats,
    ) -> Result<Arc<Vec<Candidate>>, SelectError> {
        let key = (wallet.clone(), token_type.clone());
        if let Some(tokens) = self.cached(&key) {
            return Ok(tokens);
        }
        let _reload = self.reloading.lock().await;
        // Another call may have reloaded while this one waited.
        if let Some(tokens) = self.cached(&key) {
            return Ok(tokens);
        }
        stats.fetches += 1;
        let rows = self
            .tokens
            .list_tokens(wallet, Some(token_type.clone()), NAIVE_READ_LIMIT)
            .await
            .map_err(|e| {
                SelectError::Store(match e {
                    TokenStoreError::Fault(fault) => fault,
                    other => StoreFault::Backend(other.to_string()),
                })
            })?;
        let tokens: Arc<Vec<Candidate>> = Arc::new(
            rows.into_iter()
                .filter(|t| t.spendable && t.spent_by.is_none())
                .map(|t| Candidate {
                    id: t.id,
                    quantity: t.quantity,
                })
                .collect(),
        );
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.insert(
            key,
            CacheEntry {
                tokens: tokens.clone(),
                loaded: Instant::now(),
                valid: true,
            },
        );
        Ok(tokens)
    }

    fn cached(&self, key: &(WalletId, TokenType)) -> Option<Arc<Vec<Candidate>>> {
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache
            .get(key)
            .filter(|entry| entry.valid && entry.loaded.elapsed() < self.config.cache_refresh)
            .map(|entry| entry.tokens.clone())
    }

    fn invalidate(&self, wallet: &WalletId, token_type: &TokenType) {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = cache.get_mut(&(wallet.clone(), token_type.clone())) {
            entry.valid = false;
        }
    }

    /// Runs one naive select with its RNG seeded by `seed`. On failure the tokens it
    /// won stay locked until the lease sweep.
    pub async fn select_seeded(&self, request: &SelectRequest, seed: u64) -> SelectReport {
        let started = tokio::time::Instant::now();
        let mut stats = SelectionStats::default();
        let result = self.drive(request, seed, &mut stats).await;
        SelectReport {
            result,
            stats,
            seed,
            elapsed: started.elapsed(),
        }
    }

    async fn drive(
        &self,
        request: &SelectRequest,
        seed: u64,
        stats: &mut SelectionStats,
    ) -> Result<Selected, SelectError> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut won: Vec<TokenId> = Vec::new();
        let mut held: HashSet<TokenId> = HashSet::new();
        let mut attempted: HashSet<TokenId> = HashSet::new();
        let mut sum = Quantity::ZERO;
        let legs = self.config.legs.max(1);
        for leg in 0..legs {
            stats.legs += 1;
            let mut retries = 0u32;
            loop {
                let mut locked_by_others = false;
                match self
                    .fetch(&request.wallet, &request.token_type, stats)
                    .await
                {
                    Ok(candidates) => {
                        let mut order: Vec<&Candidate> = candidates
                            .iter()
                            .filter(|c| !held.contains(&c.id))
                            .collect();
                        order.shuffle(&mut rng);
                        for candidate in order {
                            stats.claims += 1;
                            stats.lock_attempts += 1;
                            attempted.insert(candidate.id.clone());
                            stats.distinct_tokens_attempted =
                                u64::try_from(attempted.len()).unwrap_or(u64::MAX);
                            let at = self.clock.now();
                            match self.locks.claim(&request.consumer, &candidate.id, at).await {
                                Ok(ClaimVerdict::Won) => {
                                    retries = 0;
                                    won.push(candidate.id.clone());
                                    held.insert(candidate.id.clone());
                                    sum = sum.checked_add(candidate.quantity).ok_or_else(|| {
                                        SelectError::Store(StoreFault::Backend(
                                            "selected amounts overflow 128 bits".to_owned(),
                                        ))
                                    })?;
                                    if sum >= request.amount {
                                        return Ok(Selected {
                                            tokens: won,
                                            total: sum,
                                            change: sum.saturating_sub(request.amount),
                                        });
                                    }
                                }
                                Ok(ClaimVerdict::Contended) => {
                                    stats.conflicts += 1;
                                    locked_by_others = true;
                                }
                                Ok(ClaimVerdict::Stale) => {
                                    stats.stale += 1;
                                    self.invalidate(&request.wallet, &request.token_type);
                                }
                                Err(_) => {
                                    stats.store_errors += 1;
                                    locked_by_others = true;
                                }
                            }
                        }
                    }
                    Err(_) => {
                        stats.store_errors += 1;
                        locked_by_others = true;
                    }
                }
                if !locked_by_others {
                    stats.balance_checks += 1;
                    match self
                        .tokens
                        .balance(&request.wallet, &request.token_type)
                        .await
                    {
                        Ok(available) if available < request.amount => {
                            return Err(SelectError::InsufficientFunds {
                                available,
                                requested: request.amount,
                            });
                        }
                        Ok(_) => {}
                        Err(_) => stats.store_errors += 1,
                    }
                }
                retries += 1;
                stats.immediate_retries += 1;
                if retries > self.config.max_immediate_retries {
                    break;
                }
            }
            if leg + 1 < legs {
                let interval = self.config.retry_interval.max(Duration::from_millis(1));
                let delay = rng.random_range(Duration::ZERO..interval);
                tokio::time::sleep(delay).await;
            }
        }
        Err(SelectError::FundsLocked)
    }
}
