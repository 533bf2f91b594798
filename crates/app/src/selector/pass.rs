//! One pass of a select: from a fresh read to its answer, each action of the
//! engine performed against the stores, and each read as the domain's read plan
//! says ([`holdfast_domain::read_plan`]).

use std::time::Duration;

use holdfast_domain::{
    Action, ClaimVerdict, FetchRequest, Fullness, ReadFacts, ReadPlan, ReadWithClaim, SelectError,
    SelectRequest, Selected, Selection, SelectionError, SelectionStats, StoreFault, TokenId,
    TokenType, WalletId, may_use_snapshot, read_plan,
};
use holdfast_ports::{CandidateRead, ReadAndClaim, Subscription, WaitEnd};
use rand::rngs::StdRng;
use tokio::time::Instant;

use super::calls::{HeldGuard, claim, failure, give_back, release};
use super::races::{Answer, candidate_read};

use super::waking::{DEFER_TO_WOKEN, Offered, hand_on, wake_jitter};
use super::{Progress, TokenSelector, covered};

/// What a pass is doing: the engine, and what the select holds or waits for.
struct Pass<'a> {
    selector: &'a TokenSelector,
    request: &'a SelectRequest,
    rng: &'a mut StdRng,
    guard: &'a mut HeldGuard,
    waiter: &'a mut Subscription,
    selection: Selection,
    /// In an attempt a wake-up started: the free candidates it read.
    woken: Option<Offered>,
    /// The deadline of the current leg's wait, kept across its woken attempts.
    leg_deadline: Option<Instant>,
    /// Tokens of read-and-claims that failed: they may be held (see
    /// `read_and_claim`); covered by the guard and given back at the end.
    ambiguous: Vec<TokenId>,
    /// When the call started (tokio time).
    call_started: Instant,
    /// The wallet and type, as the instance's snapshots know them.
    wallet: (WalletId, TokenType),
    /// Whether the call has read (its first read may come from a snapshot).
    has_read: bool,
}

impl TokenSelector {
    /// One pass of the engine, from a fresh read to its answer. On return the guard
    /// covers exactly the selected tokens (none after a failure).
    pub(super) async fn pass(
        &self,
        request: &SelectRequest,
        rng: &mut StdRng,
        guard: &mut HeldGuard,
        waiter: &mut Subscription,
        progress: &mut Progress,
    ) -> Result<(Result<Selected, SelectError>, SelectionStats), SelectionError> {
        let mut pass = Pass {
            selection: Selection::new(request.clone(), self.config.clone())?,
            selector: self,
            request,
            rng,
            guard,
            waiter,
            woken: None,
            leg_deadline: None,
            ambiguous: Vec::new(),
            call_started: progress.started,
            wallet: (request.wallet.clone(), request.token_type.clone()),
            // A later pass (after locks were lost to the lease sweep) reads the
            // store.
            has_read: progress.total.fetches > 0,
        };
        // A store that always reads with the claim loses no race: no spread.
        pass.selection
            .note_reads_race_claims(self.read_with_claim != ReadWithClaim::Always);
        // The first read is widened for the callers as every later one is.
        pass.note_callers();
        let mut action = pass.selection.start(pass.rng);
        let outcome = loop {
            pass.cover();
            progress.note(&pass.selection);
            action = match action {
                Action::Done(outcome) => break outcome,
                action => pass.perform(action).await,
            };
        };
        let kept = outcome.as_ref().map_or(&[][..], |s| s.tokens.as_slice());
        hand_on(pass.waiter, pass.woken.take(), kept);
        pass.cover();
        progress.note(&pass.selection);
        pass.release_leftover(&outcome).await;
        Ok((outcome, pass.selection.stats().clone()))
    }
}

impl Pass<'_> {
    /// The guard covers what the engine holds and what failed read-and-claims
    /// may hold.
    fn cover(&mut self) {
        self.guard.held = covered(self.selection.held(), &self.ambiguous);
    }

    /// Tells the engine how many callers of the wallet and type this instance
    /// sees now: they widen its next read, and a select alone tidies
    /// (`Selection::note_callers`).
    fn note_callers(&mut self) {
        self.selection
            .note_callers(self.waiter.others().others.saturating_add(1));
    }

    /// Performs one action of the engine; its answer is the engine's next action.
    async fn perform(&mut self, action: Action) -> Action {
        self.note_callers();
        match action {
            Action::Fetch(fetch) => self.fetch(fetch).await,
            Action::Claim(tokens) => self.claim(tokens).await,
            Action::CheckBalance => self.check_balance().await,
            Action::Release(tokens) => self.release(tokens).await,
            Action::Backoff(delay) => self.backoff(delay).await,
            done @ Action::Done(_) => done,
        }
    }

    /// Reads candidates as the read plan says, and feeds what came back to the
    /// engine.
    async fn fetch(&mut self, fetch: FetchRequest) -> Action {
        if self.woken.is_none() {
            // A waiter woken for freed tokens looks at them first.
            let bound = Instant::now() + DEFER_TO_WOKEN;
            self.waiter.defer_to_woken(bound).await;
        }
        let read = candidate_read(self.request, &fetch);
        let facts = ReadFacts {
            store: self.selector.read_with_claim,
            woken: self.woken.is_some(),
            waited_or_lost: self.selection.stats().waited_or_lost(),
            others: self.waiter.others(),
        };
        let plan = read_plan(&facts);
        let first_read = !std::mem::replace(&mut self.has_read, true);
        let snapshot = !self.selector.config.snapshot_ttl.is_zero()
            && may_use_snapshot(plan, &facts, &fetch, first_read);
        let answer = self.read_as(plan, &fetch, &read, snapshot).await;
        self.on_answer(answer, &fetch).await
    }

    /// Performs the read plan: with the claim (read apart if the store
    /// declines), or apart (from the wallet's snapshot if `snapshot` and it
    /// answers), then again with the claim if the plan says so.
    async fn read_as(
        &mut self,
        plan: ReadPlan,
        fetch: &FetchRequest,
        read: &CandidateRead,
        snapshot: bool,
    ) -> Answer {
        let plan = match plan {
            ReadPlan::WithClaim => match self.read_and_claim(read).await {
                Some(done) => return Answer::Claimed(done),
                None => ReadPlan::declined(self.selector.read_with_claim),
            },
            apart => apart,
        };
        let from_snapshot = if snapshot {
            let (guard, selection) = (&mut *self.guard, &mut self.selection);
            (self.selector)
                .read_snapshot(guard, selection, &self.wallet, fetch)
                .await
        } else {
            None
        };
        let page = match from_snapshot {
            Some(page) => page,
            None => self.selector.read(self.guard, read).await,
        };
        let Ok(found) = &page else {
            return Answer::Read(page);
        };
        self.waiter.note(Fullness::of(fetch, found));
        if plan.again_with_claim(found.len(), &self.waiter.others()) {
            if let Some(done) = self.read_and_claim(read).await {
                self.selection.note_read_again();
                return Answer::Claimed(done);
            }
        }
        Answer::Read(page)
    }

    /// A claim found a token stale: the wallet's snapshot is out of date.
    fn note_stale(&self, verdicts: &[(TokenId, ClaimVerdict)]) {
        if verdicts.iter().any(|(_, v)| *v == ClaimVerdict::Stale) {
            self.selector.snapshots.stale(&self.wallet);
        }
    }

    /// Reads and claims in one call ([`TokenSelector::read_and_claim`]).
    async fn read_and_claim(
        &mut self,
        read: &CandidateRead,
    ) -> Option<Result<ReadAndClaim, StoreFault>> {
        self.selector
            .read_and_claim(
                &self.selection,
                self.rng,
                self.guard,
                self.request,
                read,
                &mut self.ambiguous,
            )
            .await
    }

    /// Feeds a fetch's answer to the engine (and notes what a woken attempt saw).
    async fn on_answer(&mut self, answer: Answer, fetch: &FetchRequest) -> Action {
        match answer {
            Answer::Claimed(Ok(done)) => {
                self.waiter.note(Fullness::of(fetch, &done.page));
                // Chosen inside the store's call: they leave the snapshot now.
                let claimed = done.verdicts.iter().map(|(t, _)| t);
                self.selector.snapshots.taken(&self.wallet, claimed);
                self.note_stale(&done.verdicts);
                if let Some(offered) = &mut self.woken {
                    offered.read(&done.page);
                    offered.claimed(&done.verdicts);
                }
                let (selection, request) = (&mut self.selection, self.request);
                self.selector
                    .took_with_read(selection, self.rng, self.guard, request, done)
                    .await
            }
            Answer::Claimed(Err(failure)) => self.selection.on_candidates(Err(failure), self.rng),
            Answer::Read(page) => {
                if let (Some(offered), Ok(page)) = (&mut self.woken, &page) {
                    offered.read(page);
                }
                self.selection.on_candidates(page, self.rng)
            }
        }
    }

    async fn claim(&mut self, tokens: Vec<TokenId>) -> Action {
        let selector = self.selector;
        // Proposed: the instance's other callers choose among other tokens.
        selector.snapshots.taken(&self.wallet, &tokens);
        let call = claim(
            selector.locks.clone(),
            self.request.consumer.clone(),
            tokens,
            selector.clock.now(),
        );
        let verdicts = self.guard.perform(call).await;
        if let Ok(verdicts) = &verdicts {
            self.note_stale(verdicts);
        }
        if let (Some(offered), Ok(verdicts)) = (&mut self.woken, &verdicts) {
            offered.claimed(verdicts);
        }
        self.selection.on_claim(verdicts, self.rng)
    }

    async fn check_balance(&mut self) -> Action {
        let tokens = self.selector.tokens.clone();
        let request = self.request;
        let (wallet, token_type) = (request.wallet.clone(), request.token_type.clone());
        let consumer = request.consumer.clone();
        let balance = self
            .guard
            .perform(async move {
                tokens
                    .balance_for(&wallet, &token_type, &consumer)
                    .await
                    .map_err(failure)
            })
            .await;
        self.selection.on_balance(balance, self.rng)
    }

    async fn release(&mut self, tokens: Vec<TokenId>) -> Action {
        let call = release(
            self.selector.locks.clone(),
            self.request.consumer.clone(),
            tokens,
        );
        let released = self.guard.perform(call).await.map(drop);
        self.selection.on_released(released, self.rng)
    }

    /// Waits for a wake-up or the end of the leg's wait, whichever is first.
    async fn backoff(&mut self, delay: Duration) -> Action {
        // After a woken attempt the leg's wait goes on to the deadline it had:
        // the attempt's own time counts, so a leg never lasts longer than its
        // backoff, however many wake-ups it gets.
        let resumed = self.woken.is_some();
        hand_on(self.waiter, self.woken.take(), &[]);
        let deadline = match self.leg_deadline {
            Some(deadline) if resumed => deadline,
            _ => Instant::now() + delay,
        };
        self.leg_deadline = Some(deadline);
        tracing::debug!(leg = self.selection.leg(), ?delay, "funds locked; waiting");
        match self.waiter.wait_until(deadline).await {
            WaitEnd::Timer if self.waiter.passed_over() => {
                self.leg_deadline = None;
                self.selection.on_backoff_passed_over(self.rng)
            }
            WaitEnd::Timer => {
                self.leg_deadline = None;
                self.selection.on_backoff_elapsed(self.rng)
            }
            WaitEnd::Signalled => self.woken_up(delay, deadline).await,
        }
    }

    /// A wake-up ended the wait: after a jitter, an attempt within the same leg.
    async fn woken_up(&mut self, delay: Duration, deadline: Instant) -> Action {
        tokio::time::sleep(wake_jitter(self.call_started.elapsed(), self.rng)).await;
        let rest = deadline.saturating_duration_since(Instant::now());
        tracing::debug!(?rest, "woken; trying again");
        self.woken = Some(Offered::default());
        self.selection
            .on_woken(delay.saturating_sub(rest), self.rng)
    }

    /// What is still held beyond the answer: tokens whose release failed. One
    /// more attempt, then retries in the background. The guard keeps covering
    /// the selected tokens too until the answer is returned: dropped during this
    /// release, the call must not leave them locked for a caller that never got
    /// them. Afterwards the guard covers exactly the selected tokens.
    async fn release_leftover(&mut self, outcome: &Result<Selected, SelectError>) {
        let keep: Vec<TokenId> = match outcome {
            Ok(selected) => selected.tokens.clone(),
            Err(_) => Vec::new(),
        };
        let leftover: Vec<TokenId> = (self.guard.held.iter())
            .filter(|t| !keep.contains(t))
            .cloned()
            .collect();
        if !leftover.is_empty() {
            self.give_back_leftover(leftover).await;
        }
        self.guard.held = keep;
    }

    async fn give_back_leftover(&mut self, leftover: Vec<TokenId>) {
        let (locks, consumer) = (self.selector.locks.clone(), self.request.consumer.clone());
        let count = leftover.len();
        let call = release(locks.clone(), consumer.clone(), leftover.clone());
        if let Err(e) = self.guard.perform(call).await {
            tracing::warn!(
                tokens = count,
                error = %e,
                "could not release this call's leftover locks; retrying in the background"
            );
            tokio::spawn(give_back(locks, consumer, leftover, "leftover"));
        }
    }
}
