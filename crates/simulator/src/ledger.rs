//! Per-token claim accounting: a [`LockStore`] decorator that records, for every
//! token named in a claim, the attempt and whether the verdict was contended. The
//! selector's own counters are per call; this ledger attributes conflicts to
//! tokens (the incident's "5 tokens took 85% of the conflicts").

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use holdfast_domain::{ClaimVerdict, Timestamp, TokenId, TxId};
use holdfast_ports::{
    CandidateRead, Chooser, LockStore, LockStoreError, ReadAndClaim, forward_lock_store,
};

/// Claims and conflicts of one token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenClaims {
    /// Times the token was named in a claim.
    pub attempts: u64,
    /// Contended verdicts (lost races).
    pub conflicts: u64,
}

/// Claims per token, shared by every replica of one strategy run.
#[derive(Debug, Default)]
pub struct ClaimLedger {
    claims: Mutex<Claims>,
}

#[derive(Debug, Default)]
struct Claims {
    tokens: HashMap<TokenId, TokenClaims>,
    /// Every token named in a claim, in the order the verdicts came back.
    order: Vec<TokenId>,
}

impl ClaimLedger {
    fn record(&self, verdicts: &[(TokenId, ClaimVerdict)]) {
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        for (token, verdict) in verdicts {
            let entry = claims.tokens.entry(token.clone()).or_default();
            entry.attempts += 1;
            if *verdict == ClaimVerdict::Contended {
                entry.conflicts += 1;
            }
            claims.order.push(token.clone());
        }
    }

    /// Every token claimed at least once, with its counts.
    pub fn snapshot(&self) -> Vec<(TokenId, TokenClaims)> {
        let claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        claims.tokens.iter().map(|(t, c)| (t.clone(), *c)).collect()
    }

    /// How far concurrent claims spread: the claims, in the order they were
    /// answered, cut into bursts of `burst` (the selects in flight at once), and
    /// per burst the distinct tokens named over the tokens named; the mean over
    /// the bursts. 1 when no two claims of a burst named one token; `1 / burst`
    /// when all of them named the same. A run of fewer claims is one burst; no
    /// claim at all is 1.
    pub fn distinct_share_per_burst(&self, burst: usize) -> f64 {
        let claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        distinct_share_per_burst(&claims.order, burst)
    }
}

fn distinct_share_per_burst(order: &[TokenId], burst: usize) -> f64 {
    if order.is_empty() {
        return 1.0;
    }
    // A run of fewer claims than a burst is one burst of what there is.
    let burst = burst.clamp(1, order.len());
    let bursts = order.chunks_exact(burst);
    let runs = count(bursts.len());
    let shares: f64 = bursts
        .map(|b| {
            let distinct: std::collections::HashSet<&TokenId> = b.iter().collect();
            count(distinct.len()) / count(b.len())
        })
        .sum();
    shares / runs
}

fn count(n: usize) -> f64 {
    crate::figures::to_f64(u64::try_from(n).unwrap_or(u64::MAX))
}

/// A [`LockStore`] that forwards everything and records claim verdicts per token
/// in a [`ClaimLedger`]. A claim that fails records nothing (no verdict exists).
pub struct CountingLockStore {
    inner: Arc<dyn LockStore>,
    ledger: Arc<ClaimLedger>,
}

impl std::fmt::Debug for CountingLockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingLockStore").finish_non_exhaustive()
    }
}

impl CountingLockStore {
    /// Wraps `inner`, recording into `ledger`.
    pub fn new(inner: Arc<dyn LockStore>, ledger: Arc<ClaimLedger>) -> Self {
        CountingLockStore { inner, ledger }
    }
}

forward_lock_store! {
    impl LockStore for CountingLockStore {
        async fn claim(
            &self,
            consumer: &TxId,
            token: &TokenId,
            at: Timestamp,
        ) -> Result<ClaimVerdict, LockStoreError> {
            let verdict = self.inner.claim(consumer, token, at).await?;
            self.ledger.record(&[(token.clone(), verdict)]);
            Ok(verdict)
        }

        async fn claim_window(
            &self,
            consumer: &TxId,
            tokens: &[TokenId],
            at: Timestamp,
        ) -> Result<Vec<(TokenId, ClaimVerdict)>, LockStoreError> {
            let verdicts = self.inner.claim_window(consumer, tokens, at).await?;
            self.ledger.record(&verdicts);
            Ok(verdicts)
        }

        async fn read_and_claim(
            &self,
            consumer: &TxId,
            read: &CandidateRead,
            at: Timestamp,
            choose: Chooser,
        ) -> Result<Option<ReadAndClaim>, LockStoreError> {
            let answer = self
                .inner
                .read_and_claim(consumer, read, at, choose)
                .await?;
            if let Some(done) = &answer {
                self.ledger.record(&done.verdicts);
            }
            Ok(answer)
        }
    }
    forward to inner: read_with_claim, release_consumer, renew, selected, unsettled_owned,
        unsettled, release_tokens, spend_consumer, confirm, confirm_with_change, sweep,
        list_locks, round_trips
}

#[cfg(test)]
mod tests {
    use holdfast_ports::MockLockStore;

    use super::*;

    fn id(tx: &str) -> TokenId {
        TokenId::new(TxId::new(tx).expect("tx"), 0)
    }

    fn ids(names: &[u32]) -> Vec<TokenId> {
        names.iter().map(|n| id(&format!("tx-{n}"))).collect()
    }

    #[test]
    fn a_burst_of_claims_on_distinct_tokens_spreads_fully() {
        assert_eq!(distinct_share_per_burst(&ids(&[1, 2, 3, 4]), 2), 1.0);
        assert_eq!(distinct_share_per_burst(&[], 4), 1.0);
    }

    #[test]
    fn claims_that_meet_on_one_token_count_once_per_burst() {
        // Bursts [1, 1] and [2, 3]: a half, then all distinct; the partial
        // burst [3] at the end is left out.
        assert_eq!(distinct_share_per_burst(&ids(&[1, 1, 2, 3, 3]), 2), 0.75);
        // Fewer claims than a burst: one burst of what there is.
        assert_eq!(distinct_share_per_burst(&ids(&[5, 5, 5]), 8), 1.0 / 3.0);
    }

    #[tokio::test]
    async fn records_attempts_and_conflicts_per_token() {
        let mut inner = MockLockStore::new();
        inner.expect_claim_window().returning(|_, tokens, _| {
            Ok(tokens
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let verdict = if i == 0 {
                        ClaimVerdict::Contended
                    } else {
                        ClaimVerdict::Won
                    };
                    (t.clone(), verdict)
                })
                .collect())
        });
        inner
            .expect_claim()
            .returning(|_, _, _| Ok(ClaimVerdict::Contended));
        let ledger = Arc::new(ClaimLedger::default());
        let store = CountingLockStore::new(Arc::new(inner), ledger.clone());
        let consumer = TxId::new("c").expect("tx");
        let at = Timestamp::from_millis(0);
        store
            .claim_window(&consumer, &[id("a"), id("b")], at)
            .await
            .expect("window");
        store.claim(&consumer, &id("a"), at).await.expect("claim");
        let mut snapshot = ledger.snapshot();
        snapshot.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(
            snapshot,
            vec![
                (
                    id("a"),
                    TokenClaims {
                        attempts: 2,
                        conflicts: 2
                    }
                ),
                (
                    id("b"),
                    TokenClaims {
                        attempts: 1,
                        conflicts: 0
                    }
                ),
            ]
        );
    }
}
