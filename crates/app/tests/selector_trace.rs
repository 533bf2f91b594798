//! Traces of the selector under the default policy (`cover_first`), several
//! callers on one in-memory wallet: every store call, and the wake-up signal a
//! release sends, as one line with the (paused) tokio time and the caller.
//! Pinned as insta snapshots: a changed snapshot is a changed behaviour, review
//! it like code. The engine's own choices are traced in
//! `crates/domain/tests/selection_trace_cover.rs`.
//!
//! - A select that lost its claim waits, and a release wakes it before its
//!   backoff timer (`docs/wakeups.md`, "The select's budget").
//! - A woken waiter that cannot use the freed token hands the wake on to the
//!   next waiter ("Hand-on").
//! - Callers racing for a small wallet read and claim in one call where the
//!   store says races are likely (`docs/selection.md`, "Reading and claiming in
//!   one transaction").

use crate::common::{TokioClock, q, tok, tx};

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use holdfast::TokenSelector;
use holdfast_domain::{
    Candidate, ClaimVerdict, Quantity, SelectRequest, SelectionConfig, SweepRule, Timestamp, Token,
    TokenId, TokenType, TxId, TxStatus, WalletId,
};
use holdfast_ports::{
    BandQuery, CandidateQuery, CandidateRead, Chooser, Confirmation, LockInfo, LockStore,
    LockStoreError, MockQueueStore, MockTxStatusStore, NewToken, Output, ReadAndClaim,
    ReadWithClaim, Registry, Stores, SweepReport, TokenStore, TokenStoreError, WakeKey,
};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

fn wallet() -> WalletId {
    WalletId::new("alice").expect("wallet")
}

fn chf() -> TokenType {
    TokenType::new("CHF").expect("type")
}

/// The wallet in memory (every token spendable, of `alice` and `CHF`), its
/// locks, and the trace.
#[derive(Debug)]
struct Book {
    tokens: Vec<Candidate>,
    locks: BTreeMap<TokenId, TxId>,
    /// Another caller that takes this token just before the next claim of it.
    rival: Option<(TokenId, TxId)>,
    lines: Vec<String>,
    start: Instant,
}

impl Book {
    fn log(&mut self, caller: &str, line: &str) {
        let ms = self.start.elapsed().as_secs_f64() * 1000.0;
        self.lines.push(format!("{ms:>6.1}ms {caller:<7} {line}"));
    }

    /// `a=10`: the token's creating transaction and its amount.
    fn name(&self, id: &TokenId) -> String {
        match self.tokens.iter().find(|c| &c.id == id) {
            Some(c) => format!("{}={}", id.tx, c.quantity),
            None => id.to_string(),
        }
    }

    fn names(&self, ids: &[TokenId]) -> String {
        let names: Vec<String> = ids.iter().map(|id| self.name(id)).collect();
        format!("[{}]", names.join(" "))
    }

    fn page(&self, page: &[Candidate]) -> String {
        let ids: Vec<TokenId> = page.iter().map(|c| c.id.clone()).collect();
        self.names(&ids)
    }

    /// What a read returns: the unlocked tokens, as the adapters answer it.
    fn read(&self, read: &CandidateRead) -> (String, Vec<Candidate>) {
        let mut free: Vec<Candidate> = self
            .tokens
            .iter()
            .filter(|c| !self.locks.contains_key(&c.id))
            .cloned()
            .collect();
        free.sort_by(|a, b| (a.quantity, &a.id).cmp(&(b.quantity, &b.id)));
        match read {
            CandidateRead::Bands(query) => {
                let page = query
                    .bands()
                    .answer(&free, query.fill_before.as_ref(), query.fill);
                let what = match &query.fill_before {
                    None => format!("read >={}", query.threshold),
                    Some(before) => format!("read <{} before {}", query.threshold, before.id.tx),
                };
                (what, page)
            }
            CandidateRead::Page(query) => {
                let after = |c: &Candidate| {
                    query
                        .after
                        .as_ref()
                        .is_none_or(|a| (c.quantity, &c.id) > (a.quantity, &a.id))
                };
                let page = free.into_iter().filter(after).take(query.limit).collect();
                ("read page".to_owned(), page)
            }
        }
    }

    /// Claims `ids` for `consumer`: won, stale (not in the wallet) or contended
    /// (locked by anyone); the rival, if it wants one of them, first.
    fn claim(&mut self, consumer: &TxId, ids: &[TokenId]) -> Vec<(TokenId, ClaimVerdict)> {
        if let Some((token, rival)) = self.rival.take_if(|(t, _)| ids.contains(t)) {
            self.locks.insert(token.clone(), rival.clone());
            let line = format!("claim [{}] -> {}:won", self.name(&token), token.tx);
            self.log(rival.as_str(), &line);
        }
        ids.iter()
            .map(|id| {
                let verdict = if !self.tokens.iter().any(|c| &c.id == id) {
                    ClaimVerdict::Stale
                } else if self.locks.contains_key(id) {
                    ClaimVerdict::Contended
                } else {
                    self.locks.insert(id.clone(), consumer.clone());
                    ClaimVerdict::Won
                };
                (id.clone(), verdict)
            })
            .collect()
    }

    fn verdicts(&self, ids: &[TokenId], verdicts: &[(TokenId, ClaimVerdict)]) -> String {
        let parts: Vec<String> = verdicts
            .iter()
            .map(|(t, v)| format!("{}:{}", t.tx, format!("{v:?}").to_lowercase()))
            .collect();
        format!("claim {} -> {}", self.names(ids), parts.join(" "))
    }

    /// What `consumer` could still get: every token, less its own locks.
    fn balance_for(&self, consumer: &TxId) -> Quantity {
        self.tokens
            .iter()
            .filter(|c| self.locks.get(&c.id) != Some(consumer))
            .fold(Quantity::ZERO, |sum, c| {
                sum.checked_add(c.quantity).expect("small")
            })
    }
}

/// The wallet and the instance's wake-up registry, shared by every caller.
#[derive(Debug, Clone)]
struct Shared {
    book: Arc<Mutex<Book>>,
    wake: Registry,
}

impl Shared {
    /// A wallet of tokens named by their creating transaction, of these amounts.
    fn of(tokens: &[(&str, u128)]) -> Self {
        let book = Book {
            tokens: tokens
                .iter()
                .map(|(name, amount)| Candidate {
                    id: tok(name),
                    quantity: q(*amount),
                })
                .collect(),
            locks: BTreeMap::new(),
            rival: None,
            lines: Vec::new(),
            start: Instant::now(),
        };
        Shared {
            book: Arc::new(Mutex::new(book)),
            wake: Registry::new(),
        }
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `token` locked by `holder` before the trace starts.
    fn held(self, token: &str, holder: &str) -> Self {
        self.book().locks.insert(tok(token), tx(holder));
        self
    }

    /// The snapshot: the wallet as it started, then the trace.
    fn trace(&self, wallet: &str) -> String {
        let book = self.book();
        let mut out = format!("{wallet}\n---\n");
        for line in &book.lines {
            let _ = writeln!(out, "{line}");
        }
        out
    }

    /// `name`'s view of the wallet, reading with the claim as `read_with_claim`.
    fn caller(&self, name: &str, read_with_claim: ReadWithClaim) -> Arc<Caller> {
        Arc::new(Caller {
            name: name.to_owned(),
            shared: self.clone(),
            read_with_claim,
        })
    }

    /// Starts a select of `amount` for `name` with the default configuration,
    /// its RNG seeded with `seed`; its answer goes to the trace.
    fn select(
        &self,
        name: &str,
        amount: u128,
        read_with_claim: ReadWithClaim,
        seed: u64,
    ) -> JoinHandle<()> {
        let caller = self.caller(name, read_with_claim);
        let stores = Stores {
            tokens: caller.clone(),
            locks: caller.clone(),
            statuses: Arc::new(MockTxStatusStore::new()),
            queues: Arc::new(MockQueueStore::new()),
            wake: Arc::new(self.wake.clone()),
        };
        let config = SelectionConfig::default();
        let selector = TokenSelector::new(stores, TokioClock::new(), config, Some(seed))
            .expect("default config");
        let request = SelectRequest {
            wallet: wallet(),
            token_type: chf(),
            amount: q(amount),
            consumer: tx(name),
        };
        let shared = self.clone();
        tokio::spawn(async move {
            let report = selector.select_seeded(&request, seed).await;
            let s = &report.stats;
            let mut book = shared.book();
            let answer = match &report.result {
                Ok(selected) => format!(
                    "answer {} change {}",
                    book.names(&selected.tokens),
                    selected.change
                ),
                Err(e) => format!("answer {e}"),
            };
            let counts = format!(
                "  (legs {}, waits {}, wakeups {}, conflicts {}, claims with read {})",
                s.legs, s.waits, s.wakeups, s.conflicts, s.claims_with_read
            );
            book.log(&caller.name, &(answer + &counts));
        })
    }

    /// How many selects wait now.
    fn waiting(&self) -> usize {
        self.wake.waiting()
    }
}

/// One caller's view of the shared wallet: its store calls are traced under
/// its name. Only what a select calls is answered.
#[derive(Debug)]
struct Caller {
    name: String,
    shared: Shared,
    read_with_claim: ReadWithClaim,
}

fn not_for_a_select() -> ! {
    panic!("a select never makes this call")
}

#[async_trait]
impl TokenStore for Caller {
    async fn add_tokens(&self, _tokens: &[NewToken]) -> Result<u64, TokenStoreError> {
        not_for_a_select()
    }
    async fn set_spendable(&self, _t: &TokenId, _s: bool) -> Result<bool, TokenStoreError> {
        not_for_a_select()
    }
    async fn candidates(&self, query: &CandidateQuery) -> Result<Vec<Candidate>, TokenStoreError> {
        let mut book = self.shared.book();
        let (what, page) = book.read(&CandidateRead::Page(query.clone()));
        let line = format!("{what} -> {}", book.page(&page));
        book.log(&self.name, &line);
        Ok(page)
    }
    async fn candidate_bands(&self, query: &BandQuery) -> Result<Vec<Candidate>, TokenStoreError> {
        let mut book = self.shared.book();
        let (what, page) = book.read(&CandidateRead::Bands(query.clone()));
        let line = format!("{what} -> {}", book.page(&page));
        book.log(&self.name, &line);
        Ok(page)
    }
    async fn balance(&self, _w: &WalletId, _t: &TokenType) -> Result<Quantity, TokenStoreError> {
        not_for_a_select()
    }
    async fn balance_for(
        &self,
        _wallet: &WalletId,
        _token_type: &TokenType,
        consumer: &TxId,
    ) -> Result<Quantity, TokenStoreError> {
        let mut book = self.shared.book();
        let balance = book.balance_for(consumer);
        book.log(&self.name, &format!("balance -> {balance}"));
        Ok(balance)
    }
    async fn list_tokens(
        &self,
        _wallet: &WalletId,
        _token_type: Option<TokenType>,
        _limit: usize,
    ) -> Result<Vec<Token>, TokenStoreError> {
        not_for_a_select()
    }
    async fn token(&self, _id: &TokenId) -> Result<Option<Token>, TokenStoreError> {
        not_for_a_select()
    }
}

#[async_trait]
impl LockStore for Caller {
    async fn claim(
        &self,
        consumer: &TxId,
        token: &TokenId,
        at: Timestamp,
    ) -> Result<ClaimVerdict, LockStoreError> {
        let verdicts = self
            .claim_window(consumer, std::slice::from_ref(token), at)
            .await?;
        Ok(verdicts.first().map_or(ClaimVerdict::Stale, |(_, v)| *v))
    }
    async fn claim_window(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
        _at: Timestamp,
    ) -> Result<Vec<(TokenId, ClaimVerdict)>, LockStoreError> {
        let mut book = self.shared.book();
        let verdicts = book.claim(consumer, tokens);
        let line = book.verdicts(tokens, &verdicts);
        book.log(&self.name, &line);
        Ok(verdicts)
    }
    fn read_with_claim(&self) -> ReadWithClaim {
        self.read_with_claim
    }
    async fn read_and_claim(
        &self,
        consumer: &TxId,
        read: &CandidateRead,
        _at: Timestamp,
        choose: Chooser,
    ) -> Result<Option<ReadAndClaim>, LockStoreError> {
        if self.read_with_claim == ReadWithClaim::Never {
            return Ok(None);
        }
        let mut book = self.shared.book();
        let (what, page) = book.read(read);
        let chosen = choose(&page);
        let verdicts = book.claim(consumer, &chosen);
        let line = format!(
            "{what} with the claim -> {}, {}",
            book.page(&page),
            book.verdicts(&chosen, &verdicts)
        );
        book.log(&self.name, &line);
        Ok(Some(ReadAndClaim { page, verdicts }))
    }
    async fn renew(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
        _at: Timestamp,
    ) -> Result<Vec<TokenId>, LockStoreError> {
        let book = self.shared.book();
        Ok(tokens
            .iter()
            .filter(|t| book.locks.get(*t) == Some(consumer))
            .cloned()
            .collect())
    }
    async fn release_consumer(
        &self,
        _consumer: &TxId,
        _at: Timestamp,
        _record_status: bool,
    ) -> Result<u64, LockStoreError> {
        not_for_a_select()
    }
    /// Releases `consumer`'s locks of `tokens` and, as the adapters do after
    /// the commit, signals the wallet's key on its behalf.
    async fn release_tokens(
        &self,
        consumer: &TxId,
        tokens: &[TokenId],
    ) -> Result<u64, LockStoreError> {
        let mut book = self.shared.book();
        let mine: Vec<TokenId> = tokens
            .iter()
            .filter(|t| book.locks.get(*t) == Some(consumer))
            .cloned()
            .collect();
        for token in &mine {
            book.locks.remove(token);
        }
        let mut line = format!("release {}", book.names(tokens));
        if !mine.is_empty() {
            let key = WakeKey::tokens(&wallet(), &chf());
            let woken = self.shared.wake.signal(&[key], Some(consumer));
            let _ = write!(line, " -> signal wakes {woken}");
        }
        book.log(&self.name, &line);
        Ok(u64::try_from(mine.len()).expect("small"))
    }
    async fn spend_consumer(
        &self,
        _consumer: &TxId,
        _at: Timestamp,
        _record_status: bool,
    ) -> Result<Vec<TokenId>, LockStoreError> {
        not_for_a_select()
    }
    async fn confirm(
        &self,
        _consumer: &TxId,
        _outputs: &[Output],
        _at: Timestamp,
    ) -> Result<Confirmation, LockStoreError> {
        not_for_a_select()
    }
    async fn selected(&self, _consumer: &TxId) -> Result<Vec<Token>, LockStoreError> {
        not_for_a_select()
    }
    async fn unsettled_owned(&self) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError> {
        not_for_a_select()
    }
    async fn unsettled(&self) -> Result<Vec<(TxId, Option<TxStatus>)>, LockStoreError> {
        not_for_a_select()
    }
    async fn sweep(&self, _rule: SweepRule) -> Result<SweepReport, LockStoreError> {
        not_for_a_select()
    }
    async fn list_locks(&self) -> Result<Vec<LockInfo>, LockStoreError> {
        not_for_a_select()
    }
    fn round_trips(&self) -> u64 {
        0
    }
}

/// `holder` gives `token` back, as a settlement as Deleted would.
async fn release(shared: &Shared, holder: &str, token: &str) {
    let caller = shared.caller(holder, ReadWithClaim::Never);
    caller
        .release_tokens(&tx(holder), &[tok(token)])
        .await
        .expect("released");
}

#[tokio::test(start_paused = true)]
async fn trace_a_select_that_lost_its_claim_is_woken_by_a_release_before_its_backoff_ends() {
    // The waiter reads a=10 (b=10 is held), and a rival takes a first. Nothing
    // else is free, so the waiter waits: a backoff of up to 5 s. The holder
    // gives b back after 50 ms: the signal wakes the waiter, which reads and
    // wins b in the same leg, a moment (its jitter) later.
    let shared = Shared::of(&[("a", 10), ("b", 10)]).held("b", "holder");
    shared.book().rival = Some((tok("a"), tx("rival")));
    let waiter = shared.select("waiter", 10, ReadWithClaim::Never, 1);
    sleep(Duration::from_millis(50)).await;
    assert_eq!(shared.waiting(), 1, "the waiter waits");
    release(&shared, "holder", "b").await;
    waiter.await.expect("select task");
    insta::assert_snapshot!(
        "a_select_that_lost_its_claim_is_woken_by_a_release",
        shared.trace(
            "wallet [a=10 b=10], b held by holder; waiter selects 10, \
             a rival claims a just before it"
        )
    );
}

#[tokio::test(start_paused = true)]
async fn trace_a_select_woken_by_the_release_of_the_token_it_lost_takes_it() {
    // The waiter reads a=10, the wallet's only token, and a rival takes it first:
    // the waiter blacklists a and waits. The rival gives a back after 50 ms: the
    // woken attempt reads a again and wins it, instead of skipping the token it
    // lost and waiting out its backoff.
    let shared = Shared::of(&[("a", 10)]);
    shared.book().rival = Some((tok("a"), tx("rival")));
    let waiter = shared.select("waiter", 10, ReadWithClaim::Never, 1);
    sleep(Duration::from_millis(50)).await;
    assert_eq!(shared.waiting(), 1, "the waiter waits");
    release(&shared, "rival", "a").await;
    waiter.await.expect("select task");
    insta::assert_snapshot!(
        "a_select_woken_by_the_release_of_the_token_it_lost_takes_it",
        shared.trace("wallet [a=10]; waiter selects 10, a rival claims a just before it")
    );
}

#[tokio::test(start_paused = true)]
async fn trace_a_woken_waiter_that_cannot_use_the_freed_token_hands_the_wake_on() {
    // Both find nothing free and wait, `large` (100) first. The release of y=10
    // wakes `large` (the longest waiting), which reads it, cannot use it and
    // hands the wake on: `small` (5) reads and wins it, with no second signal.
    // `large` goes back to the rest of its wait and is stopped there.
    let shared = Shared::of(&[("y", 10), ("big", 500)])
        .held("y", "holder")
        .held("big", "hoarder");
    let large = shared.select("large", 100, ReadWithClaim::Never, 2);
    sleep(Duration::from_millis(10)).await;
    let small = shared.select("small", 5, ReadWithClaim::Never, 3);
    sleep(Duration::from_millis(10)).await;
    assert_eq!(shared.waiting(), 2, "both wait");
    release(&shared, "holder", "y").await;
    small.await.expect("select task");
    assert_eq!(shared.waiting(), 1, "large waits on");
    shared
        .book()
        .log("large", "still waits (the test stops it)");
    large.abort();
    insta::assert_snapshot!(
        "a_woken_waiter_that_cannot_use_the_freed_token_hands_the_wake_on",
        shared.trace(
            "wallet [y=10 big=500], y held by holder, big by hoarder; \
             large selects 100, then small selects 5"
        )
    );
}

#[tokio::test(start_paused = true)]
async fn trace_callers_racing_for_a_small_wallet_read_with_the_claim() {
    // A store that reads with the claim where races are likely (as PostgreSQL
    // does). Three callers start at once on three tokens: each first read,
    // outside the claim, comes back thin (fewer than two candidates for each
    // other caller), so each reads again with the claim, and no claim loses.
    // Each caller is an instance of its own: two and three, beside another
    // caller, read their first page for their instance's snapshot of the wallet.
    let shared = Shared::of(&[("a", 10), ("b", 10), ("c", 10)]);
    let rwc = ReadWithClaim::WhereRacesLikely;
    let callers = [
        shared.select("one", 10, rwc, 4),
        shared.select("two", 10, rwc, 5),
        shared.select("three", 10, rwc, 6),
    ];
    for caller in callers {
        caller.await.expect("select task");
    }
    insta::assert_snapshot!(
        "callers_racing_for_a_small_wallet_read_with_the_claim",
        shared.trace("wallet [a=10 b=10 c=10]; one, two and three select 10 at once")
    );
}
