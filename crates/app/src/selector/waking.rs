//! What a select does around its waits: letting a woken waiter look first,
//! handing a wake on, and the jitter before a woken read (`docs/wakeups.md`).

use std::collections::BTreeSet;
use std::time::Duration;

use holdfast_domain::{Candidate, ClaimVerdict, TokenId};
use holdfast_ports::Subscription;
use rand::Rng;
use rand::rngs::StdRng;

/// The longest a read that no wake-up started waits for a woken waiter of the
/// same wallet and type to finish looking at what was freed.
pub(super) const DEFER_TO_WOKEN: Duration = Duration::from_millis(5);

/// What an attempt a wake-up started found free: the tokens it read, less those
/// it then lost to other callers (contended or stale: taken already).
#[derive(Debug, Default)]
pub(super) struct Offered(BTreeSet<TokenId>);

impl Offered {
    pub(super) fn read(&mut self, page: &[Candidate]) {
        self.0.extend(page.iter().map(|c| c.id.clone()));
    }

    pub(super) fn claimed(&mut self, verdicts: &[(TokenId, ClaimVerdict)]) {
        for (token, verdict) in verdicts {
            if *verdict != ClaimVerdict::Won {
                self.0.remove(token);
            }
        }
    }

    /// Whether free tokens are left that the attempt did not keep (too small for
    /// it, or more than it needed): then the next waiter should look at them.
    fn left_over(&self, kept: &[TokenId]) -> bool {
        self.0.iter().any(|t| !kept.contains(t))
    }
}

/// At the end of an attempt a wake-up started: if it leaves free tokens it does
/// not keep, hands the wake on to the next waiter, for whom they may do. A read
/// that found nothing free, or only tokens others took first, hands nothing on.
pub(super) fn hand_on(waiter: &Subscription, woken: Option<Offered>, kept: &[TokenId]) {
    if let Some(offered) = woken {
        waiter.looked(offered.left_over(kept));
    }
}

/// The longest jitter a woken select waits before it reads.
const WAKE_JITTER_MAX: Duration = Duration::from_millis(2);
/// A select waiting this long (since it started) reads at once when woken.
const WAKE_JITTER_AGE: Duration = Duration::from_millis(100);

/// How long a select woken `age` after it started waits before it reads: up to
/// [`WAKE_JITTER_MAX`] for one that just started, less the longer it has waited,
/// none after [`WAKE_JITTER_AGE`]; at random between half and all of that. One signal wakes one
/// waiter per instance, so this is not about a stampede within an instance: it
/// lets the longest-waiting of the instances' woken waiters read first.
pub(super) fn wake_jitter(age: Duration, rng: &mut StdRng) -> Duration {
    let youth = WAKE_JITTER_AGE.saturating_sub(age).as_secs_f64() / WAKE_JITTER_AGE.as_secs_f64();
    WAKE_JITTER_MAX.mul_f64(youth * rng.random_range(0.5..1.0))
}

#[cfg(test)]
mod tests {
    use holdfast_domain::{Candidate, ClaimVerdict, Precision, Quantity, TokenId, TxId};

    use super::Offered;

    fn token(n: u32) -> TokenId {
        TokenId::new(TxId::new("funding").expect("tx"), n)
    }

    fn read(tokens: &[u32]) -> Offered {
        let mut offered = Offered::default();
        let page: Vec<Candidate> = tokens
            .iter()
            .map(|&n| Candidate {
                id: token(n),
                quantity: Quantity::new(10, Precision::MAX).expect("amount"),
            })
            .collect();
        offered.read(&page);
        offered
    }

    #[test]
    fn free_tokens_not_kept_are_handed_on() {
        // Read two, kept one: the other may do for the next waiter.
        assert!(read(&[1, 2]).left_over(&[token(1)]));
        // Kept everything, or read nothing: nothing to hand on.
        assert!(!read(&[1, 2]).left_over(&[token(1), token(2)]));
        assert!(!read(&[]).left_over(&[]));
    }

    #[test]
    fn tokens_lost_to_others_are_not_handed_on() {
        // The one token read was taken by another caller before the claim (the
        // serial lineage): waking the next waiter for it would start a race for
        // a token that is gone.
        let mut offered = read(&[1]);
        offered.claimed(&[(token(1), ClaimVerdict::Contended)]);
        assert!(!offered.left_over(&[]));
        let mut offered = read(&[1, 2, 3]);
        offered.claimed(&[
            (token(1), ClaimVerdict::Won),
            (token(2), ClaimVerdict::Stale),
        ]);
        assert!(offered.left_over(&[token(1)]), "token 3 is still free");
        offered.claimed(&[(token(3), ClaimVerdict::Contended)]);
        assert!(!offered.left_over(&[token(1)]));
    }
}
