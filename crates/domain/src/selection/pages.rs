//! One scan over a wallet's candidates: pages fetched by keyset cursor, the
//! equal-amount shuffle, and what the scan has seen (for the blacklist escape hatch
//! and the fast-fail gate).

use std::collections::HashSet;

use rand::Rng;
use rand::seq::SliceRandom;

use crate::ids::TokenId;
use crate::quantity::Quantity;
use crate::selection::Bands;
use crate::token::Candidate;

/// The largest run of equal amounts held back across pages to be shuffled as one
/// bucket. A longer run is released (and shuffled) in chunks of this size, which
/// bounds the memory and the round trips spent before the first claim.
pub const MAX_SHUFFLE_BUCKET: usize = 1024;

/// The state of one scan (one pass from the smallest candidate upwards).
#[derive(Debug, Clone, Default)]
pub(crate) struct Scan {
    /// The last candidate of the last page, as the store returned it.
    pub(crate) cursor: Option<Candidate>,
    /// The store has nothing beyond the last page.
    pub(crate) exhausted: bool,
    /// Candidates ready to be planned, in scan order.
    pub(crate) buffer: Vec<Candidate>,
    /// The trailing equal-amount run of the last full page, kept back until the
    /// next page shows whether the run continues.
    held_back: Vec<Candidate>,
    /// Every token id this scan has received.
    seen: HashSet<TokenId>,
    /// The scan received at least one usable candidate.
    pub(crate) saw_any: bool,
    /// The scan met at least one candidate that was not blacklisted.
    pub(crate) saw_clean: bool,
    /// The scan proposed at least one claim.
    pub(crate) claimed: bool,
    /// The tokens read cover the amount only with more than `max_inputs`: the
    /// balance check decides between InsufficientFunds and TooManyInputs.
    pub(crate) over_cap: bool,
    /// The scan met contention (a lost race, or a token blacklisted for one).
    pub(crate) contention: bool,
    /// `cover_first`: the cover band came back full, so more cover candidates may
    /// exist beyond it (a fresh read finds them once these are locked).
    pub(crate) more_cover: bool,
    /// `cover_first`: the threshold of this scan's first read (later fill pages
    /// continue below it).
    pub(crate) threshold: Option<Quantity>,
    /// `cover_first`: the first read left the fill band unread
    /// ([`crate::Bands::fill_unless_cover_at_most`]).
    pub(crate) fill_unread: bool,
    /// `cover_first`: this scan reads the fill band in any case (the previous
    /// scan left it unread, and its single cover could not be chosen).
    pub(crate) read_fill: bool,
    /// `cover_first`: this scan tidies (`SelectionConfig::tidy_band`): it reads
    /// the tidy band below the amount and prefers an exact choice with the most
    /// inputs. Decided at its first read, so the read and the choice agree.
    pub(crate) tidy: bool,
    /// A store error happened during this scan (a failed page, claim or balance
    /// read, or an unclear claim answer): running out proves nothing about locks.
    pub(crate) store_error: bool,
    /// Tokens claims of this read proposed, and how many of them were lost
    /// (contended or stale): how out of date the read has become.
    pub(crate) proposed: usize,
    pub(crate) lost: usize,
    /// The scan's read came from the instance's snapshot of the wallet, not the
    /// store ([`crate::Selection::note_read_from_snapshot`]): a loss uses it up,
    /// and it never ends the call with `TooManyInputs`.
    pub(crate) from_snapshot: bool,
}

impl Scan {
    /// Takes one page answered to a fetch of `limit` candidates.
    ///
    /// Zero amounts (they cover nothing), tokens this call already won and ids the
    /// scan already received are dropped. A page shorter than `limit` ends the scan;
    /// so does a full page with no id new to the scan (a store not honouring the
    /// cursor would otherwise be fetched from for ever). With `ascending`, the page
    /// is sorted by amount (stable, so a correct store's order is kept) and every
    /// run of equal amounts is shuffled; without it the page is shuffled whole.
    ///
    /// The trailing run of equal amounts of a full page is held back for the next
    /// page (to shuffle the whole run), unless what is at hand already covers
    /// `needed`: then planning goes on without another round trip.
    pub(crate) fn ingest(
        &mut self,
        page: Vec<Candidate>,
        limit: usize,
        ascending: bool,
        needed: Quantity,
        won: &HashSet<TokenId>,
        rng: &mut (impl Rng + ?Sized),
    ) {
        let full = page.len() >= limit;
        if let Some(last) = page.last() {
            self.cursor = Some(last.clone());
        }
        let mut fresh = self.take_fresh(page, full, won);
        if !ascending {
            fresh.shuffle(rng);
            self.buffer.append(&mut fresh);
            return;
        }
        let mut merged = std::mem::take(&mut self.held_back);
        merged.append(&mut fresh);
        merged.sort_by_key(|c| c.quantity);
        let at_hand = self
            .buffer
            .iter()
            .chain(&merged)
            .try_fold(Quantity::ZERO, |sum, c| sum.checked_add(c.quantity));
        let covers = at_hand.is_none_or(|sum| sum >= needed);
        if !self.exhausted && !covers {
            let tail = trailing_run_start(&merged);
            if merged.len() - tail < MAX_SHUFFLE_BUCKET {
                self.held_back = merged.split_off(tail);
            }
        }
        shuffle_equal_runs(&mut merged, rng);
        self.buffer.append(&mut merged);
    }

    /// The candidates of `page` new to the scan, without zero amounts and tokens
    /// already won; notes what the scan saw, and ends it when the page was not
    /// `full` or brought no id new to the scan.
    fn take_fresh(
        &mut self,
        page: Vec<Candidate>,
        full: bool,
        won: &HashSet<TokenId>,
    ) -> Vec<Candidate> {
        let mut any_new = false;
        let mut fresh = Vec::with_capacity(page.len());
        for candidate in page {
            if !self.seen.insert(candidate.id.clone()) {
                continue;
            }
            any_new = true;
            if candidate.quantity.is_zero() || won.contains(&candidate.id) {
                continue;
            }
            fresh.push(candidate);
        }
        self.saw_any |= !fresh.is_empty();
        self.exhausted = !full || !any_new;
        fresh
    }

    /// `cover_first`: takes one band read (`docs/selection.md`, "Read"): the
    /// candidates at or above the threshold are the cover band (at most
    /// `bands.cover` were asked), those below it the fill band (at most
    /// `fill_limit`, largest first). A fill band shorter than asked ends the scan,
    /// as does a read with no id new to the scan, unless the store may have left
    /// it unread ([`Bands::skips_fill`]); the cursor for the next fill page
    /// is the smallest fill candidate read. Equal amounts are shuffled among
    /// themselves; zero amounts, won tokens and ids seen before are dropped.
    pub(crate) fn ingest_bands(
        &mut self,
        page: Vec<Candidate>,
        bands: Bands,
        fill_limit: usize,
        won: &HashSet<TokenId>,
        rng: &mut (impl Rng + ?Sized),
    ) {
        let (cover, fill): (Vec<Candidate>, Vec<Candidate>) = page
            .into_iter()
            .partition(|c| c.quantity >= bands.threshold);
        if bands.cover > 0 {
            self.more_cover = cover.len() >= bands.cover;
        }
        // The store answers its bands in order: the smallest cover first.
        self.fill_unread = fill_limit > 0 && fill.is_empty() && bands.skips_fill(cover.first());
        if let Some(smallest) = fill
            .iter()
            .min_by(|a, b| (a.quantity, &a.id).cmp(&(b.quantity, &b.id)))
        {
            self.cursor = Some(smallest.clone());
        }
        let full = self.fill_unread || (fill_limit > 0 && fill.len() >= fill_limit);
        let mut page = cover;
        page.extend(fill);
        let mut fresh = self.take_fresh(page, full, won);
        fresh.sort_by_key(|c| c.quantity);
        shuffle_equal_runs(&mut fresh, rng);
        self.buffer.append(&mut fresh);
    }
}

/// Where the last run of equal amounts starts.
fn trailing_run_start(sorted: &[Candidate]) -> usize {
    let Some(last) = sorted.last() else {
        return 0;
    };
    sorted
        .iter()
        .rposition(|c| c.quantity != last.quantity)
        .map_or(0, |i| i + 1)
}

/// Shuffles every run of equal amounts in place, leaving the ascending order.
fn shuffle_equal_runs(sorted: &mut [Candidate], rng: &mut (impl Rng + ?Sized)) {
    let mut start = 0;
    while start < sorted.len() {
        let quantity = sorted[start].quantity;
        let len = sorted[start..]
            .iter()
            .take_while(|c| c.quantity == quantity)
            .count();
        if len > 1 {
            sorted[start..start + len].shuffle(rng);
        }
        start += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::TxId;
    use crate::quantity::{Precision, Quantity};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn q(v: u128) -> Quantity {
        Quantity::new(v, Precision::MAX).unwrap()
    }

    fn c(tx: &str, v: u128) -> Candidate {
        Candidate {
            id: TokenId::new(TxId::new(tx).unwrap(), 0),
            quantity: Quantity::new(v, Precision::MAX).unwrap(),
        }
    }

    #[test]
    fn holds_back_a_trailing_run_of_a_full_page() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut scan = Scan::default();
        let won = HashSet::new();
        scan.ingest(
            vec![c("a", 1), c("b", 5), c("c", 5)],
            3,
            true,
            q(100),
            &won,
            &mut rng,
        );
        assert_eq!(scan.buffer, vec![c("a", 1)]);
        assert!(!scan.exhausted);
        assert_eq!(scan.cursor, Some(c("c", 5)));
        scan.ingest(vec![c("d", 5), c("e", 7)], 3, true, q(100), &won, &mut rng);
        assert!(scan.exhausted);
        let amounts: Vec<u128> = scan.buffer.iter().map(|c| c.quantity.value()).collect();
        assert_eq!(amounts, vec![1, 5, 5, 5, 7]);
    }

    #[test]
    fn holds_nothing_back_when_the_page_already_covers_the_amount() {
        // 1 + 5 + 5 covers 6: the run of 5s is planned now, no page more is read.
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut scan = Scan::default();
        let won = HashSet::new();
        scan.ingest(
            vec![c("a", 1), c("b", 5), c("c", 5)],
            3,
            true,
            q(6),
            &won,
            &mut rng,
        );
        assert_eq!(scan.buffer.len(), 3);
        assert!(
            !scan.exhausted,
            "the scan may still go on if the claim fails"
        );
    }

    #[test]
    fn bands_split_at_the_threshold_and_page_the_fill_from_its_smallest() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut scan = Scan::default();
        let won = HashSet::new();
        // Cover band (>= 10) of 2 asked 2: full; fill band (< 10) of 2 asked 2: full.
        scan.ingest_bands(
            vec![c("a", 10), c("b", 12), c("c", 9), c("d", 4)],
            bands(10, 2, None),
            2,
            &won,
            &mut rng,
        );
        assert!(scan.more_cover && !scan.exhausted);
        assert_eq!(scan.cursor, Some(c("d", 4)));
        // The next fill page (cover band not asked) is short: the scan ends.
        scan.ingest_bands(vec![c("e", 3)], bands(10, 0, None), 2, &won, &mut rng);
        assert!(scan.more_cover && scan.exhausted);
        let amounts: Vec<u128> = scan.buffer.iter().map(|c| c.quantity.value()).collect();
        assert_eq!(amounts, vec![4, 9, 10, 12, 3]);
    }

    fn bands(threshold: u128, cover: usize, skip_at_most: Option<u128>) -> Bands {
        Bands {
            threshold: q(threshold),
            cover,
            fill_unless_cover_at_most: skip_at_most.map(q),
        }
    }

    #[test]
    fn a_fill_band_left_unread_keeps_the_scan_open_until_it_is_read() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let won = HashSet::new();
        // A cover within the bound and no fill: the store may have skipped it.
        let mut scan = Scan::default();
        scan.ingest_bands(vec![c("a", 30)], bands(10, 4, Some(50)), 8, &won, &mut rng);
        assert!(scan.fill_unread && !scan.exhausted);
        // A smallest cover beyond the bound: an empty fill band is empty.
        let mut scan = Scan::default();
        scan.ingest_bands(vec![c("a", 60)], bands(10, 4, Some(50)), 8, &won, &mut rng);
        assert!(!scan.fill_unread && scan.exhausted);
        // No hint: likewise.
        let mut scan = Scan::default();
        scan.ingest_bands(vec![c("a", 30)], bands(10, 4, None), 8, &won, &mut rng);
        assert!(!scan.fill_unread && scan.exhausted);
    }

    #[test]
    fn a_full_page_of_known_ids_ends_the_scan() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut scan = Scan::default();
        let won = HashSet::new();
        scan.ingest(vec![c("a", 1), c("b", 2)], 2, true, q(10), &won, &mut rng);
        assert!(!scan.exhausted);
        scan.ingest(vec![c("a", 1), c("b", 2)], 2, true, q(10), &won, &mut rng);
        assert!(scan.exhausted);
        assert_eq!(scan.buffer.len(), 2);
    }
}
