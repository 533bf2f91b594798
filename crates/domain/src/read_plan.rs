//! The read plan: whether a select reads its candidates apart from the claim or
//! inside the claim's transaction (`docs/selection.md`, "Reading and claiming in
//! one transaction"). The one home of the rule: the lock store says what it can
//! ([`ReadWithClaim`]), the wake-up registry reports what the other callers of
//! the wallet and type in this instance do ([`Others`]), the call says what it has
//! been through ([`ReadFacts`]), and [`read_plan`] decides.
//!
//! - A store that cannot read with the claim reads apart ([`ReadPlan::Apart`]).
//! - A store for which it costs nothing more (SQLite: every write holds the one
//!   write lock anyway) always reads with the claim ([`ReadPlan::WithClaim`]).
//! - A store for which it costs more (PostgreSQL: an advisory lock of the wallet
//!   and type, two statements more) reads with the claim where a race is likely:
//!   the call was woken, has waited or lost a race, or [`Others::race_likely`].
//!   Else it reads apart and, if that read found candidates while a race is now
//!   likely (its own read, noted, may have shown the wallet thin), reads again
//!   with the claim ([`ReadPlan::ApartThenWithClaimIfThin`]).
//! - A read apart may come from the instance's recent snapshot of the wallet
//!   instead of the store ([`may_use_snapshot`]) where other callers of this
//!   instance share it and the call has no reason to doubt it.

use crate::selection::FetchRequest;
use crate::token::Candidate;

/// When a selector reads and claims in one call, as the lock store says it
/// should (the store's `read_with_claim`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadWithClaim {
    /// Never: the store cannot (its `read_and_claim` answers `None`).
    Never,
    /// Where races are likely: it costs the store more than a read and a claim
    /// apart (PostgreSQL: a lock of the wallet and type and four statements).
    WhereRacesLikely,
    /// For every read: it costs no more than a read and a claim apart (SQLite:
    /// every write holds the database's one write lock anyway).
    Always,
}

/// How full a read of candidates came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fullness {
    /// As full as asked (a band or page at its limit, or a cover band read
    /// alone that holds all it asked for): more may be free, nothing to race
    /// for.
    Full,
    /// Short of what it asked for: this many candidates, all there were.
    Short(usize),
}

impl Fullness {
    /// How full `page` is as an answer to `fetch`: full when a page holds its
    /// limit, or a band read holds all the cover candidates (amount at least
    /// the threshold) or all the fill candidates it asked for.
    pub fn of(fetch: &FetchRequest, page: &[Candidate]) -> Fullness {
        let full = match &fetch.bands {
            None => page.len() >= fetch.limit,
            Some(bands) => {
                let cover = page
                    .iter()
                    .filter(|c| c.quantity >= bands.threshold)
                    .count();
                (bands.cover > 0 && cover >= bands.cover)
                    || (fetch.limit > 0 && page.len() - cover >= fetch.limit)
            }
        };
        if full {
            Fullness::Full
        } else {
            Fullness::Short(page.len())
        }
    }
}

/// What the wake-up registry reports of the other callers of one wallet and type
/// in this instance: facts only; [`Others::race_likely`] decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Others {
    /// Other subscriptions of the key (waiting or between waits).
    pub others: usize,
    /// Of those, how many wait now.
    pub others_waiting: usize,
    /// How full the last read of the key (by any of its callers) came back;
    /// `None` when none was noted since the key's callers came.
    pub last_read: Option<Fullness>,
}

/// Candidates per other caller below which a read is thin.
const PER_OTHER_CALLER: usize = 2;

impl Others {
    /// Whether a read now is likely to race another caller of this instance:
    /// another caller waits, or the last read came back short with fewer than
    /// two candidates per other caller.
    pub fn race_likely(&self) -> bool {
        if self.others_waiting > 0 {
            return true;
        }
        let thin = match self.last_read {
            Some(Fullness::Short(n)) => n < PER_OTHER_CALLER.saturating_mul(self.others),
            Some(Fullness::Full) | None => false,
        };
        self.others > 0 && thin
    }
}

/// Everything [`read_plan`] decides from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadFacts {
    /// What the lock store can.
    pub store: ReadWithClaim,
    /// This attempt was started by a wake-up.
    pub woken: bool,
    /// The call has waited, or lost a race (a contended or stale verdict):
    /// [`crate::SelectionStats::waited_or_lost`].
    pub waited_or_lost: bool,
    /// The other callers of the wallet and type in this instance, before the read.
    pub others: Others,
}

/// How a select reads its candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadPlan {
    /// A read, then (if the engine chooses) a claim: two calls.
    Apart,
    /// Read and claim in one call, in the claim's transaction. A store that
    /// answers that it cannot is read apart ([`ReadPlan::declined`]).
    WithClaim,
    /// Read apart; if that read found candidates and a race is likely now
    /// ([`ReadPlan::again_with_claim`]), read again with the claim instead of
    /// claiming from it.
    ApartThenWithClaimIfThin,
}

/// The read plan of a fetch (module documentation).
pub fn read_plan(facts: &ReadFacts) -> ReadPlan {
    match facts.store {
        ReadWithClaim::Never => ReadPlan::Apart,
        ReadWithClaim::Always => ReadPlan::WithClaim,
        ReadWithClaim::WhereRacesLikely
            if facts.woken || facts.waited_or_lost || facts.others.race_likely() =>
        {
            ReadPlan::WithClaim
        }
        ReadWithClaim::WhereRacesLikely => ReadPlan::ApartThenWithClaimIfThin,
    }
}

impl ReadPlan {
    /// The plan when the store answered a read with the claim with "cannot":
    /// read apart, and where the store reads with the claim only where races
    /// are likely, still read again with it if thin.
    pub fn declined(store: ReadWithClaim) -> ReadPlan {
        match store {
            ReadWithClaim::WhereRacesLikely => ReadPlan::ApartThenWithClaimIfThin,
            ReadWithClaim::Never | ReadWithClaim::Always => ReadPlan::Apart,
        }
    }

    /// After a read apart that found `found` candidates, with `others` the other
    /// callers as the registry reports them now (this read noted): whether to
    /// read again with the claim rather than claim from it and race them.
    pub fn again_with_claim(self, found: usize, others: &Others) -> bool {
        self == ReadPlan::ApartThenWithClaimIfThin && found > 0 && others.race_likely()
    }
}

/// Whether a read planned as `plan` may be answered from the instance's
/// snapshot of the wallet (`docs/selection.md`, "A snapshot of a hot wallet"):
/// only the call's first read, of both bands from the start (no fill cursor, no
/// refresh asked), planned apart, by a call that was not woken and has not
/// waited or lost a race, while other callers of the wallet and type share this
/// instance. A snapshot is advisory: claims verify every token, and "insufficient
/// funds" always comes from a fresh balance read.
pub fn may_use_snapshot(
    plan: ReadPlan,
    facts: &ReadFacts,
    fetch: &FetchRequest,
    first_read: bool,
) -> bool {
    first_read
        && plan != ReadPlan::WithClaim
        && !facts.woken
        && !facts.waited_or_lost
        && facts.others.others > 0
        && !fetch.refresh
        && fetch.after.is_none()
        && fetch.bands.is_some_and(|b| b.cover > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selection::Bands;
    use crate::{Precision, Quantity, TokenId, TxId};

    const NEVER: ReadWithClaim = ReadWithClaim::Never;
    const LIKELY: ReadWithClaim = ReadWithClaim::WhereRacesLikely;
    const ALWAYS: ReadWithClaim = ReadWithClaim::Always;

    fn line(others: usize, others_waiting: usize, last_read: Option<Fullness>) -> Others {
        Others {
            others,
            others_waiting,
            last_read,
        }
    }

    #[test]
    fn the_plan_of_every_case() {
        use Fullness::{Full, Short};
        use ReadPlan::{Apart, ApartThenWithClaimIfThin as IfThin, WithClaim};
        let alone = line(0, 0, None);
        #[rustfmt::skip]
        let rows: [(&str, ReadWithClaim, bool, bool, Others, ReadPlan); 15] = [
            // name,                                   store,  woken, waited, line,                      plan
            ("a store that cannot reads apart",         NEVER,  false, false, alone,                     Apart),
            ("cannot, even woken",                      NEVER,  true,  true,  line(3, 3, Some(Short(0))), Apart),
            ("always, alone",                           ALWAYS, false, false, alone,                     WithClaim),
            ("always, whatever the line",               ALWAYS, false, false, line(5, 0, Some(Full)),    WithClaim),
            ("likely: alone, quiet",                    LIKELY, false, false, alone,                     IfThin),
            ("likely: woken",                           LIKELY, true,  false, alone,                     WithClaim),
            ("likely: waited or lost a race",           LIKELY, false, true,  alone,                     WithClaim),
            ("likely: another waits",                   LIKELY, false, false, line(1, 1, None),          WithClaim),
            ("likely: others, nothing read yet",        LIKELY, false, false, line(2, 0, None),          IfThin),
            ("likely: last read full",                  LIKELY, false, false, line(4, 0, Some(Full)),    IfThin),
            ("likely: short, 2 per other caller",       LIKELY, false, false, line(2, 0, Some(Short(4))), IfThin),
            ("likely: short, under 2 per other caller", LIKELY, false, false, line(2, 0, Some(Short(3))), WithClaim),
            ("likely: one other, one candidate",        LIKELY, false, false, line(1, 0, Some(Short(1))), WithClaim),
            ("likely: empty read, nobody else",         LIKELY, false, false, line(0, 0, Some(Short(0))), IfThin),
            ("likely: empty read, one other",           LIKELY, false, false, line(1, 0, Some(Short(0))), WithClaim),
        ];
        for (name, store, woken, waited_or_lost, line, plan) in rows {
            let facts = ReadFacts {
                store,
                woken,
                waited_or_lost,
                others: line,
            };
            assert_eq!(read_plan(&facts), plan, "{name}");
        }
    }

    #[test]
    fn after_a_read_apart() {
        use Fullness::{Full, Short};
        use ReadPlan::{Apart, ApartThenWithClaimIfThin as IfThin, WithClaim};
        #[rustfmt::skip]
        let rows: [(&str, ReadPlan, usize, Others, bool); 7] = [
            // name,                                  plan,      found, line after the read,       again
            ("thin, with another caller",             IfThin,    1,     line(1, 0, Some(Short(1))), true),
            ("another waits now",                     IfThin,    5,     line(1, 1, Some(Full)),     true),
            ("found nothing: nothing to race for",    IfThin,    0,     line(1, 1, Some(Short(0))), false),
            ("enough per other caller",               IfThin,    4,     line(2, 0, Some(Short(4))), false),
            ("alone",                                 IfThin,    1,     line(0, 0, Some(Short(1))), false),
            ("a plain read apart never reads again",  Apart,     1,     line(1, 1, Some(Short(1))), false),
            ("a read with the claim never reads again", WithClaim, 1, line(1, 1, Some(Short(1))), false),
        ];
        for (name, plan, found, line, again) in rows {
            assert_eq!(plan.again_with_claim(found, &line), again, "{name}");
        }
    }

    #[test]
    fn a_declined_read_with_the_claim() {
        for (name, store, plan) in [
            ("never", NEVER, ReadPlan::Apart),
            ("always", ALWAYS, ReadPlan::Apart),
            ("likely", LIKELY, ReadPlan::ApartThenWithClaimIfThin),
        ] {
            assert_eq!(ReadPlan::declined(store), plan, "{name}");
        }
    }

    fn candidates(amounts: &[u64]) -> Vec<Candidate> {
        let tx = TxId::new("funding").expect("tx");
        (0u32..)
            .zip(amounts)
            .map(|(n, &amount)| Candidate {
                id: TokenId::new(tx.clone(), n),
                quantity: Quantity::new(amount.into(), Precision::MAX).expect("amount"),
            })
            .collect()
    }

    fn page(limit: usize) -> FetchRequest {
        FetchRequest {
            after: None,
            limit,
            bands: None,
            refresh: false,
        }
    }

    fn bands(threshold: u64, cover: usize, fill: usize) -> FetchRequest {
        FetchRequest {
            bands: Some(Bands {
                threshold: Quantity::new(threshold.into(), Precision::MAX).expect("amount"),
                cover,
                fill_unless_cover_at_most: None,
            }),
            ..page(fill)
        }
    }

    #[test]
    fn how_full_a_read_came_back() {
        use Fullness::{Full, Short};
        let rows: [(&str, FetchRequest, Vec<Candidate>, Fullness); 8] = [
            ("a page at its limit", page(2), candidates(&[1, 2]), Full),
            ("a short page", page(3), candidates(&[1, 2]), Short(2)),
            ("an empty page", page(3), candidates(&[]), Short(0)),
            (
                "a full cover band",
                bands(10, 2, 5),
                candidates(&[10, 12, 3]),
                Full,
            ),
            (
                "a full fill band",
                bands(10, 2, 2),
                candidates(&[10, 3, 4]),
                Full,
            ),
            (
                "both bands short",
                bands(10, 2, 5),
                candidates(&[10, 3]),
                Short(2),
            ),
            (
                "a cover band read alone, all it asked for",
                bands(10, 1, 5),
                candidates(&[11]),
                Full,
            ),
            (
                "a further fill page, short",
                bands(10, 0, 5),
                candidates(&[3, 4]),
                Short(2),
            ),
        ];
        for (name, fetch, read, fullness) in rows {
            assert_eq!(Fullness::of(&fetch, &read), fullness, "{name}");
        }
    }

    #[test]
    fn a_snapshot_answers_only_a_first_untroubled_band_read_beside_other_callers() {
        use ReadPlan::{Apart, ApartThenWithClaimIfThin as IfThin, WithClaim};
        let facts = |woken, waited_or_lost, others| ReadFacts {
            store: LIKELY,
            woken,
            waited_or_lost,
            others: line(others, 0, None),
        };
        let first = bands(10, 4, 8);
        let refresh = FetchRequest {
            refresh: true,
            ..first.clone()
        };
        let further_fill = FetchRequest {
            after: candidates(&[9]).pop(),
            ..bands(10, 0, 8)
        };
        #[rustfmt::skip]
        let rows: [(&str, ReadPlan, ReadFacts, &FetchRequest, bool, bool); 10] = [
            // name,                        plan,      facts,                     fetch,         first, use
            ("beside others, read apart",   IfThin,    facts(false, false, 2),    &first,        true,  true),
            ("a store that cannot",         Apart,     facts(false, false, 2),    &first,        true,  true),
            ("alone: the store",            IfThin,    facts(false, false, 0),    &first,        true,  false),
            ("a later read of the call",    IfThin,    facts(false, false, 2),    &first,        false, false),
            ("woken",                       IfThin,    facts(true, false, 2),     &first,        true,  false),
            ("waited or lost",              IfThin,    facts(false, true, 2),     &first,        true,  false),
            ("read with the claim",         WithClaim, facts(false, false, 2),    &first,        true,  false),
            ("a refresh",                   IfThin,    facts(false, false, 2),    &refresh,      true,  false),
            ("a further fill page",         IfThin,    facts(false, false, 2),    &further_fill, true,  false),
            ("an ascending page",           IfThin,    facts(false, false, 2),    &page(8),      true,  false),
        ];
        for (name, plan, facts, fetch, first_read, answer) in rows {
            assert_eq!(
                may_use_snapshot(plan, &facts, fetch, first_read),
                answer,
                "{name}"
            );
        }
    }
}
