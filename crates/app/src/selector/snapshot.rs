//! Snapshots of hot wallets (`docs/selection.md`, "A snapshot of a hot
//! wallet"): the first read of a select that shares its wallet and type with
//! other callers of this instance may be answered from a recent read of the
//! wallet's free tokens, held in memory, instead of a round trip to the store.
//!
//! - **What it holds:** the smallest [`SNAPSHOT_LIMIT`] free candidates of the
//!   wallet and type, ascending, as one page read found them, at most
//!   `SelectionConfig::snapshot_ttl` old (100 ms by default). A snapshot answers a band read exactly as the store
//!   would have at that read ([`holdfast_domain::Bands::answer`]), or not at
//!   all: when the wallet holds more than the page, only a read whose cover
//!   band lies within it.
//! - **What leaves it:** every token a select of this instance proposes in a
//!   claim, as it proposes it, so concurrent callers of the instance mostly
//!   choose among different tokens; the whole snapshot when a claim finds a
//!   token stale (spent or withdrawn since).
//! - **Advisory only:** tokens added since are missing until the next read;
//!   tokens taken by another instance since are lost races, after which the
//!   select reads the store (the engine's `note_read_from_snapshot`: no answer
//!   rests on a snapshot alone). Claims verify every token, and "insufficient
//!   funds" always comes from a fresh balance read.
//! - **One read at a time:** while one select reads the wallet for a new
//!   snapshot, the others wait for it (at most [`LOAD_WAIT`]), then read their
//!   bands from the store if it did not come. A read that could not answer
//!   because the wallet is bigger than the page is not made again for
//!   [`BEYOND_PAGE_PAUSE`]; at most [`KEEP_WALLETS`] wallets hold one.
//! - **Per selector:** the callers that make a wallet hot are counted by the
//!   wake-up registry of the backend; a service with one selector per backend
//!   (the handle's) shares its snapshots among all of them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use holdfast_domain::{
    Candidate, FetchRequest, Selection, StoreFault, TokenId, TokenType, WalletId,
};
use holdfast_ports::{CandidateQuery, CandidateRead};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::TokenSelector;
use super::calls::HeldGuard;

/// The most candidates a snapshot holds (the first page of the wallet).
pub(super) const SNAPSHOT_LIMIT: usize = 512;

/// How long a snapshot read may be in flight before another select may start
/// one (the first was dropped or is stuck).
const LOAD_PATIENCE: Duration = Duration::from_secs(1);

/// How long a select waits for another's snapshot read before it reads the
/// store itself.
pub(super) const LOAD_WAIT: Duration = Duration::from_millis(20);

/// The most wallets with a snapshot (or a read for one) at a time: beyond
/// them, the expired ones are dropped, and if none has expired, the select
/// reads the store. Memory stays within 64 pages of 512 candidates.
const KEEP_WALLETS: usize = 64;

/// After a read for a snapshot that could not answer though its page was full
/// (the wallet holds more free tokens than the page, and the reads ask beyond
/// it), no new read for one until this long after it.
const BEYOND_PAGE_PAUSE: Duration = Duration::from_secs(10);

type Key = (WalletId, TokenType);

/// The snapshots of one selector.
#[derive(Debug)]
pub(super) struct Snapshots {
    wallets: Mutex<HashMap<Key, Entry>>,
    /// How long a snapshot answers reads (`SelectionConfig::snapshot_ttl`).
    ttl: Duration,
}

#[derive(Debug)]
enum Entry {
    /// A select is reading the wallet, since then; told when it is done.
    Loading(Instant, Arc<Notify>),
    Ready(Snapshot),
}

#[derive(Debug)]
struct Snapshot {
    /// Free candidates, ascending by `(quantity, id)`.
    ascending: Vec<Candidate>,
    /// Whether `ascending` is every free candidate the read found (the page
    /// came back short).
    complete: bool,
    read_at: Instant,
    /// No new read for a snapshot of the wallet before this.
    no_load_before: Instant,
}

/// What a snapshot lookup says to do.
#[derive(Debug)]
pub(super) enum Lookup {
    /// The read's answer, from the snapshot.
    Answered(Vec<Candidate>),
    /// Read the wallet for a new snapshot (this select was chosen to), then
    /// [`Snapshots::loaded`].
    Load,
    /// Another select is reading the wallet: wait for [`Notify`] (at most
    /// [`LOAD_WAIT`]), then look up again.
    Wait(Arc<Notify>),
    /// Read the bands from the store as usual.
    Read,
}

impl PartialEq for Lookup {
    fn eq(&self, other: &Lookup) -> bool {
        match (self, other) {
            (Lookup::Answered(a), Lookup::Answered(b)) => a == b,
            (Lookup::Wait(a), Lookup::Wait(b)) => Arc::ptr_eq(a, b),
            (Lookup::Load, Lookup::Load) | (Lookup::Read, Lookup::Read) => true,
            _ => false,
        }
    }
}

impl Snapshots {
    /// Snapshots that answer reads for `ttl` after their read.
    pub(super) fn new(ttl: Duration) -> Snapshots {
        Snapshots {
            wallets: Mutex::default(),
            ttl,
        }
    }

    /// The snapshot's answer to `fetch` (a band read from the start), or what to
    /// do instead.
    pub(super) fn lookup(&self, key: &Key, fetch: &FetchRequest, now: Instant) -> Lookup {
        let mut wallets = self.lock();
        match wallets.get(key) {
            Some(Entry::Ready(snapshot)) if now < snapshot.read_at + self.ttl => {
                if let Some(answer) = snapshot.answer(fetch, false) {
                    return Lookup::Answered(answer);
                }
                // Used up (no cover left in it), or the wallet is bigger than
                // the snapshot's page: the store until it expires.
                return Lookup::Read;
            }
            Some(Entry::Ready(snapshot)) if now < snapshot.no_load_before => return Lookup::Read,
            Some(Entry::Loading(since, done)) if now < *since + LOAD_PATIENCE => {
                return Lookup::Wait(done.clone());
            }
            _ => {}
        }
        if wallets.len() >= KEEP_WALLETS {
            let ttl = self.ttl;
            wallets.retain(|_, entry| match entry {
                Entry::Loading(since, _) => now < *since + LOAD_PATIENCE,
                Entry::Ready(s) => now < (s.read_at + ttl).max(s.no_load_before),
            });
            if wallets.len() >= KEEP_WALLETS {
                return Lookup::Read;
            }
        }
        wallets.insert(key.clone(), Entry::Loading(now, Arc::default()));
        Lookup::Load
    }

    /// After [`Lookup::Wait`]: the snapshot's answer if the read came, else
    /// [`Lookup::Read`] (never a second wait, never a load).
    pub(super) fn after_wait(&self, key: &Key, fetch: &FetchRequest, now: Instant) -> Lookup {
        match self.lookup_ready(key, fetch, now) {
            Some(answer) => Lookup::Answered(answer),
            None => Lookup::Read,
        }
    }

    fn lookup_ready(
        &self,
        key: &Key,
        fetch: &FetchRequest,
        now: Instant,
    ) -> Option<Vec<Candidate>> {
        match self.lock().get(key) {
            Some(Entry::Ready(snapshot)) if now < snapshot.read_at + self.ttl => {
                snapshot.answer(fetch, false)
            }
            _ => None,
        }
    }

    /// Keeps `page`, the first [`SNAPSHOT_LIMIT`] free candidates of the wallet
    /// in ascending order read since `read_at` (when the load was decided), and
    /// answers `fetch` from it if it knows the store's answer (just read, also
    /// one without a cover candidate).
    pub(super) fn loaded(
        &self,
        key: &Key,
        mut page: Vec<Candidate>,
        read_at: Instant,
        fetch: &FetchRequest,
    ) -> Option<Vec<Candidate>> {
        page.sort_by(|a, b| (a.quantity, &a.id).cmp(&(b.quantity, &b.id)));
        let mut snapshot = Snapshot {
            complete: page.len() < SNAPSHOT_LIMIT,
            ascending: page,
            read_at,
            no_load_before: read_at,
        };
        let answer = snapshot.answer(fetch, true);
        if answer.is_none() {
            snapshot.no_load_before = read_at + BEYOND_PAGE_PAUSE;
        }
        if let Some(Entry::Loading(_, done)) =
            self.lock().insert(key.clone(), Entry::Ready(snapshot))
        {
            done.notify_waiters();
        }
        answer
    }

    /// The load failed: another select may start one.
    pub(super) fn failed(&self, key: &Key) {
        let mut wallets = self.lock();
        if let Some(Entry::Loading(_, done)) = wallets.get(key) {
            done.notify_waiters();
            wallets.remove(key);
        }
    }

    /// `tokens` are proposed in a claim: no later answer names them.
    pub(super) fn taken<'a>(&self, key: &Key, tokens: impl IntoIterator<Item = &'a TokenId>) {
        if let Some(Entry::Ready(snapshot)) = self.lock().get_mut(key) {
            let taken: HashSet<&TokenId> = tokens.into_iter().collect();
            snapshot.ascending.retain(|c| !taken.contains(&c.id));
        }
    }

    /// A claim found a token of the wallet stale: the snapshot is out of date.
    pub(super) fn stale(&self, key: &Key) {
        let mut wallets = self.lock();
        if matches!(wallets.get(key), Some(Entry::Ready(_))) {
            wallets.remove(key);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Entry>> {
        self.wallets.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Snapshot {
    /// The store's answer to `fetch` at the snapshot's read, if the snapshot
    /// knows it and, unless `just_read`, it holds a cover candidate (a snapshot
    /// used up or out of date sends to the store rather than to a choice
    /// among smaller tokens).
    fn answer(&self, fetch: &FetchRequest, just_read: bool) -> Option<Vec<Candidate>> {
        let bands = fetch.bands.filter(|_| fetch.after.is_none())?;
        let answer = bands.answer(&self.ascending, None, fetch.limit);
        let cover = answer
            .iter()
            .take_while(|c| c.quantity >= bands.threshold)
            .count();
        // Beyond the page there may be more candidates: the answer is the
        // store's only if its cover band is full within the page (then every
        // candidate below the threshold is in the page too).
        let exact = self.complete || cover >= bands.cover;
        (exact && (just_read || cover > 0)).then_some(answer)
    }
}

impl TokenSelector {
    /// The answer to `fetch` from the instance's snapshot of the wallet, reading
    /// a new one if this select is to; `None`: read the store as usual.
    pub(super) async fn read_snapshot(
        &self,
        guard: &mut HeldGuard,
        selection: &mut Selection,
        wallet: &Key,
        fetch: &FetchRequest,
    ) -> Option<Result<Vec<Candidate>, StoreFault>> {
        let snapshots = &self.snapshots;
        let read_at = Instant::now();
        let mut lookup = snapshots.lookup(wallet, fetch, read_at);
        if let Lookup::Wait(done) = lookup {
            // Told from its creation on; the read may have come before it.
            let notified = done.notified();
            lookup = snapshots.after_wait(wallet, fetch, Instant::now());
            if lookup == Lookup::Read {
                let _ = tokio::time::timeout(LOAD_WAIT, notified).await;
                lookup = snapshots.after_wait(wallet, fetch, Instant::now());
            }
        }
        match lookup {
            Lookup::Answered(page) => {
                selection.note_read_from_snapshot();
                Some(Ok(page))
            }
            Lookup::Read | Lookup::Wait(_) => None,
            Lookup::Load => {
                // Dropped during the read (a deadline, a cancelled select), the
                // next select reads for the snapshot instead of waiting for this.
                let mut unfinished = LoadGuard {
                    snapshots,
                    key: wallet,
                    landed: false,
                };
                let (wallet_id, token_type) = wallet.clone();
                let whole = CandidateRead::Page(CandidateQuery {
                    wallet: wallet_id,
                    token_type,
                    after: None,
                    limit: SNAPSHOT_LIMIT,
                });
                let read = self.read(guard, &whole).await;
                unfinished.landed = true;
                match read {
                    Ok(page) => {
                        let answer = snapshots.loaded(wallet, page, read_at, fetch);
                        if answer.is_none() {
                            // The snapshot cannot answer this read: one more.
                            selection.note_read_again();
                        }
                        answer.map(Ok)
                    }
                    Err(failure) => {
                        snapshots.failed(wallet);
                        Some(Err(failure))
                    }
                }
            }
        }
    }
}

/// While a select reads the wallet for a snapshot: if the read never lands
/// (the select was dropped), the waiting selects are told and the next one
/// reads ([`Snapshots::failed`]).
struct LoadGuard<'a> {
    snapshots: &'a Snapshots,
    key: &'a (WalletId, TokenType),
    landed: bool,
}

impl Drop for LoadGuard<'_> {
    fn drop(&mut self) {
        if !self.landed {
            self.snapshots.failed(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use holdfast_domain::{Bands, Precision, Quantity, TxId};

    const TTL: Duration = Duration::from_millis(100);

    fn key() -> Key {
        (
            WalletId::new("hot").expect("wallet"),
            TokenType::new("CHF").expect("type"),
        )
    }

    fn quantity(n: u64) -> Quantity {
        Quantity::new(n.into(), Precision::MAX).expect("amount")
    }

    fn candidates(amounts: &[u64]) -> Vec<Candidate> {
        let tx = TxId::new("funding").expect("tx");
        (0u32..)
            .zip(amounts)
            .map(|(n, &amount)| Candidate {
                id: TokenId::new(tx.clone(), n),
                quantity: quantity(amount),
            })
            .collect()
    }

    fn bands(threshold: u64, cover: usize, fill: usize) -> FetchRequest {
        FetchRequest {
            after: None,
            limit: fill,
            refresh: false,
            bands: Some(Bands {
                threshold: quantity(threshold),
                cover,
                fill_unless_cover_at_most: None,
            }),
        }
    }

    /// A first select reads for the snapshot; the Notify a second one waits on.
    fn reading(snapshots: &Snapshots, fetch: &FetchRequest, now: Instant) -> Arc<Notify> {
        assert_eq!(snapshots.lookup(&key(), fetch, now), Lookup::Load);
        let Lookup::Wait(done) = snapshots.lookup(&key(), fetch, now) else {
            panic!("a second select waits for the first one's read");
        };
        done
    }

    fn amounts(page: &[Candidate]) -> Vec<u64> {
        page.iter()
            .map(|c| c.quantity.to_string().parse().expect("integer"))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn one_select_loads_the_others_read_the_store_until_it_is_there() {
        let snapshots = Snapshots::new(TTL);
        let fetch = bands(10, 2, 4);
        let now = Instant::now();
        let done = reading(&snapshots, &fetch, now);
        let notified = done.notified();
        assert_eq!(snapshots.after_wait(&key(), &fetch, now), Lookup::Read);
        let page = candidates(&[20, 3, 12, 5, 11]);
        let answer = snapshots
            .loaded(&key(), page, now, &fetch)
            .expect("answered");
        assert_eq!(amounts(&answer), [11, 12, 5, 3]);
        tokio::time::timeout(LOAD_WAIT, notified)
            .await
            .expect("the waiter is told");
        assert_eq!(
            snapshots.after_wait(&key(), &fetch, now),
            Lookup::Answered(answer.clone())
        );
        assert_eq!(
            snapshots.lookup(&key(), &fetch, now),
            Lookup::Answered(answer)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_read_tells_the_waiters_and_lets_the_next_select_read() {
        let snapshots = Snapshots::new(TTL);
        let fetch = bands(10, 2, 4);
        let now = Instant::now();
        let done = reading(&snapshots, &fetch, now);
        let notified = done.notified();
        snapshots.failed(&key());
        tokio::time::timeout(LOAD_WAIT, notified)
            .await
            .expect("the waiter is told");
        assert_eq!(snapshots.after_wait(&key(), &fetch, now), Lookup::Read);
        assert_eq!(snapshots.lookup(&key(), &fetch, now), Lookup::Load);
    }

    #[tokio::test(start_paused = true)]
    async fn proposed_tokens_leave_it_and_a_used_up_snapshot_sends_to_the_store() {
        let snapshots = Snapshots::new(TTL);
        let fetch = bands(10, 8, 0);
        let now = Instant::now();
        assert_eq!(snapshots.lookup(&key(), &fetch, now), Lookup::Load);
        let page = candidates(&[10, 11, 3]);
        let ids: Vec<TokenId> = page.iter().map(|c| c.id.clone()).collect();
        snapshots.loaded(&key(), page, now, &fetch);
        snapshots.taken(&key(), &ids[..1]);
        match snapshots.lookup(&key(), &fetch, now) {
            Lookup::Answered(answer) => assert_eq!(amounts(&answer), [11]),
            other => panic!("expected an answer, got {other:?}"),
        }
        snapshots.taken(&key(), &ids[1..2]);
        // Only a fill candidate left: no cover, the store answers.
        assert_eq!(snapshots.lookup(&key(), &fetch, now), Lookup::Read);
    }

    #[tokio::test(start_paused = true)]
    async fn it_expires_and_a_stale_token_drops_it() {
        let snapshots = Snapshots::new(TTL);
        let fetch = bands(10, 8, 0);
        let now = Instant::now();
        snapshots.lookup(&key(), &fetch, now);
        snapshots.loaded(&key(), candidates(&[10, 11]), now, &fetch);
        let later = now + TTL;
        assert_eq!(snapshots.lookup(&key(), &fetch, later), Lookup::Load);
        snapshots.loaded(&key(), candidates(&[10, 11]), later, &fetch);
        snapshots.stale(&key());
        assert_eq!(snapshots.lookup(&key(), &fetch, later), Lookup::Load);
        // A load that never ends is taken over after a while.
        assert!(matches!(
            snapshots.lookup(&key(), &fetch, later),
            Lookup::Wait(_)
        ));
        let much_later = later + LOAD_PATIENCE;
        assert_eq!(snapshots.lookup(&key(), &fetch, much_later), Lookup::Load);
    }

    #[tokio::test(start_paused = true)]
    async fn a_page_that_cannot_answer_is_not_read_again_for_a_while() {
        let snapshots = Snapshots::new(TTL);
        // Covers of 8 or more lie beyond a full page of 7s.
        let fetch = bands(8, 4, 2);
        let now = Instant::now();
        assert_eq!(snapshots.lookup(&key(), &fetch, now), Lookup::Load);
        let page = candidates(&vec![7; SNAPSHOT_LIMIT]);
        assert_eq!(snapshots.loaded(&key(), page, now, &fetch), None);
        let later = now + TTL * 2;
        assert_eq!(snapshots.lookup(&key(), &fetch, later), Lookup::Read);
        let much_later = now + BEYOND_PAGE_PAUSE;
        assert_eq!(snapshots.lookup(&key(), &fetch, much_later), Lookup::Load);
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_so_many_wallets_hold_a_snapshot() {
        let snapshots = Snapshots::new(TTL);
        let fetch = bands(10, 2, 0);
        let now = Instant::now();
        let wallet = |n: usize| {
            (
                WalletId::new(format!("w{n}")).expect("wallet"),
                TokenType::new("CHF").expect("type"),
            )
        };
        for n in 0..KEEP_WALLETS {
            assert_eq!(snapshots.lookup(&wallet(n), &fetch, now), Lookup::Load);
        }
        assert_eq!(
            snapshots.lookup(&wallet(KEEP_WALLETS), &fetch, now),
            Lookup::Read
        );
        // Once they expire, their places are free again.
        let later = now + LOAD_PATIENCE;
        assert_eq!(
            snapshots.lookup(&wallet(KEEP_WALLETS), &fetch, later),
            Lookup::Load
        );
    }

    #[test]
    fn a_partial_page_answers_only_a_cover_band_it_holds_whole() {
        let full_page: Vec<Candidate> = candidates(&vec![7; SNAPSHOT_LIMIT]);
        let snapshot = Snapshot {
            ascending: full_page,
            complete: false,
            read_at: Instant::now(),
            no_load_before: Instant::now(),
        };
        // Covers of 5 or more: the page holds 4 of them whole.
        assert_eq!(
            snapshot.answer(&bands(5, 4, 2), false).map(|a| a.len()),
            Some(4)
        );
        // Covers of 8 or more lie beyond the page: unknown.
        assert_eq!(snapshot.answer(&bands(8, 4, 2), false), None);
        // More covers than the page holds: the store might have more.
        let asks_all = bands(5, SNAPSHOT_LIMIT + 1, 0);
        assert_eq!(snapshot.answer(&asks_all, false), None);
        let complete = Snapshot {
            complete: true,
            ..snapshot
        };
        assert_eq!(
            complete.answer(&asks_all, false).map(|a| a.len()),
            Some(SNAPSHOT_LIMIT)
        );
        // Just read, an empty wallet is the store's answer; later, the store's.
        let empty = Snapshot {
            ascending: Vec::new(),
            complete: true,
            read_at: Instant::now(),
            no_load_before: Instant::now(),
        };
        assert_eq!(empty.answer(&bands(5, 4, 2), true), Some(Vec::new()));
        assert_eq!(empty.answer(&bands(5, 4, 2), false), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_snapshot_read_dropped_before_it_lands_lets_the_next_select_read() {
        let snapshots = Snapshots::new(std::time::Duration::from_millis(100));
        let key = (
            WalletId::new("hot").expect("wallet"),
            TokenType::new("CHF").expect("type"),
        );
        let fetch = FetchRequest {
            after: None,
            limit: 4,
            refresh: false,
            bands: Some(Bands {
                threshold: Quantity::new(10, Precision::MAX).expect("amount"),
                cover: 2,
                fill_unless_cover_at_most: None,
            }),
        };
        let now = Instant::now();
        for landed in [true, false] {
            assert_eq!(snapshots.lookup(&key, &fetch, now), Lookup::Load);
            drop(LoadGuard {
                snapshots: &snapshots,
                key: &key,
                landed,
            });
            let next = snapshots.lookup(&key, &fetch, now);
            if landed {
                // Landed: its own `loaded` or `failed` settles the entry.
                assert!(matches!(next, Lookup::Wait(_)), "{next:?}");
                snapshots.failed(&key);
            } else {
                assert_eq!(next, Lookup::Load);
                snapshots.failed(&key);
            }
        }
    }
}
