//! Lost races: reading and claiming in one call where the lock store says so
//! (always, or where races are likely; `docs/selection.md`, "Reading and
//! claiming in one transaction").

use holdfast_domain::{
    Action, Candidate, ClaimVerdict, FetchRequest, SelectRequest, Selection, StoreFault, TokenId,
};
use holdfast_ports::{BandQuery, CandidateQuery, CandidateRead, Chooser, ReadAndClaim};
use rand::rngs::StdRng;
use std::sync::{Arc, Mutex, PoisonError};

use super::TokenSelector;
use super::calls::{HeldGuard, failure, give_back, release};

/// How a fetch of the engine was answered.
pub(super) enum Answer {
    /// Read and claimed in one call.
    Claimed(Result<ReadAndClaim, StoreFault>),
    /// Read alone.
    Read(Result<Vec<Candidate>, StoreFault>),
}

impl TokenSelector {
    /// Reads candidates as `read` says, in a call of its own.
    pub(super) async fn read(
        &self,
        guard: &mut HeldGuard,
        read: &CandidateRead,
    ) -> Result<Vec<Candidate>, StoreFault> {
        let (tokens, read) = (self.tokens.clone(), read.clone());
        guard
            .perform(async move {
                match &read {
                    CandidateRead::Bands(query) => tokens.candidate_bands(query).await,
                    CandidateRead::Page(query) => tokens.candidates(query).await,
                }
                .map_err(failure)
            })
            .await
    }

    /// Reads and claims in one call where the lock store can
    /// ([`holdfast_ports::LockStore::read_and_claim`]): the engine's choice runs on the page
    /// inside the store's transaction (a copy of the engine with a copy of the
    /// call's RNG, so the real engine, fed the same page afterwards, names the
    /// same tokens). `None` when the store cannot: the caller reads and claims
    /// in two calls. If the call fails, the tokens it was to claim go to
    /// `ambiguous`: they may be held.
    pub(super) async fn read_and_claim(
        &self,
        selection: &Selection,
        rng: &StdRng,
        guard: &mut HeldGuard,
        request: &SelectRequest,
        read: &CandidateRead,
        ambiguous: &mut Vec<TokenId>,
    ) -> Option<Result<ReadAndClaim, StoreFault>> {
        let (mut probe, mut probe_rng) = (selection.clone(), rng.clone());
        // What the store was asked to claim: if the call fails, the claim may
        // still have committed (a COMMIT whose answer was lost), and nothing else
        // tells the select which tokens it may hold.
        let chosen = Arc::new(Mutex::new(Vec::new()));
        let choose: Chooser = {
            let chosen = chosen.clone();
            Box::new(move |page: &[Candidate]| {
                let tokens = match probe.on_candidates(Ok(page.to_vec()), &mut probe_rng) {
                    Action::Claim(tokens) => tokens,
                    _ => Vec::new(),
                };
                chosen
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone_from(&tokens);
                tokens
            })
        };
        let (locks, consumer, read, at) = (
            self.locks.clone(),
            request.consumer.clone(),
            read.clone(),
            self.clock.now(),
        );
        let call = async move {
            locks
                .read_and_claim(&consumer, &read, at, choose)
                .await
                .map_err(failure)
        };
        let maybe_held =
            move || std::mem::take(&mut *chosen.lock().unwrap_or_else(PoisonError::into_inner));
        // Dropped while the call runs, the select never learns what it won:
        // the call's task gives it back.
        let (locks, consumer) = (self.locks.clone(), request.consumer.clone());
        let undelivered_held = maybe_held.clone();
        let answer = guard
            .perform_with(call, move |undelivered| {
                let back = match undelivered {
                    Ok(Some(done)) => won(&done.verdicts),
                    Ok(None) => Vec::new(),
                    Err(_) => undelivered_held(),
                };
                if !back.is_empty() {
                    tokio::spawn(give_back(locks, consumer, back, "cancelled"));
                }
            })
            .await;
        if answer.is_err() {
            // Failed after choosing: the claim may have committed (a COMMIT whose
            // answer was lost). The select gives these back when it ends, unless
            // it answers with them (won again later in the call).
            ambiguous.extend(maybe_held());
        }
        answer.transpose()
    }

    /// Feeds a read-and-claim to the engine: the page, then (if a claim was
    /// made) its verdicts, as if read and claimed in two calls.
    pub(super) async fn took_with_read(
        &self,
        selection: &mut Selection,
        rng: &mut StdRng,
        guard: &mut HeldGuard,
        request: &SelectRequest,
        done: ReadAndClaim,
    ) -> Action {
        let next = selection.on_candidates(Ok(done.page), rng);
        if done.verdicts.is_empty() {
            return next;
        }
        let claimed: Vec<TokenId> = done.verdicts.iter().map(|(t, _)| t.clone()).collect();
        match next {
            Action::Claim(tokens) if tokens == claimed => {
                selection.note_claim_with_read();
                selection.on_claim(Ok(done.verdicts), rng)
            }
            other => {
                // The engine chose otherwise than its copy did (it cannot, fed
                // the same page and RNG): give back what the store claimed.
                tracing::error!(
                    ?claimed,
                    ?other,
                    "read-and-claim chose other tokens than the engine"
                );
                let won = won(&done.verdicts);
                let call = release(self.locks.clone(), request.consumer.clone(), won.clone());
                if guard.perform(call).await.is_err() {
                    tokio::spawn(give_back(
                        self.locks.clone(),
                        request.consumer.clone(),
                        won,
                        "leftover",
                    ));
                }
                other
            }
        }
    }
}

/// The tokens of `verdicts` that were won.
fn won(verdicts: &[(TokenId, ClaimVerdict)]) -> Vec<TokenId> {
    verdicts
        .iter()
        .filter(|(_, v)| *v == ClaimVerdict::Won)
        .map(|(t, _)| t.clone())
        .collect()
}

/// What a fetch of the engine reads.
pub(super) fn candidate_read(request: &SelectRequest, fetch: &FetchRequest) -> CandidateRead {
    let (wallet, token_type) = (request.wallet.clone(), request.token_type.clone());
    match fetch.bands {
        Some(bands) => CandidateRead::Bands(BandQuery {
            wallet,
            token_type,
            threshold: bands.threshold,
            cover: bands.cover,
            fill: fetch.limit,
            fill_before: fetch.after.clone(),
            fill_unless_cover_at_most: bands.fill_unless_cover_at_most,
        }),
        None => CandidateRead::Page(CandidateQuery {
            wallet,
            token_type,
            after: fetch.after.clone(),
            limit: fetch.limit,
        }),
    }
}
