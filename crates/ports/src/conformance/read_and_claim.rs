//! Checks of [`crate::LockStore::read_and_claim`]: the read and the claim in one
//! transaction that no other claim enters between them, so concurrent callers
//! never lose a race for what they read. holdfast's adapters both read and claim
//! in one transaction; an adapter that cannot (answers `None`) fails these checks
//! and should leave them out of its run.

use std::sync::Arc;

use holdfast_domain::{Candidate, ClaimVerdict, TokenId};
use tokio::sync::Barrier;

use super::TestDatabase;
use super::support::{T0, add, all_candidates, amount, chf, token_type, tx, wallet};
use crate::{
    BandQuery, CandidateQuery, CandidateRead, Chooser, LockStoreError, MAX_WINDOW, ReadAndClaim,
    Stores,
};

/// A first page of up to `limit` candidates of `w`/`CHF`.
fn page(limit: usize) -> CandidateRead {
    CandidateRead::Page(CandidateQuery {
        wallet: wallet("w"),
        token_type: token_type("CHF"),
        after: None,
        limit,
    })
}

/// `read_and_claim`, failing the check on an error or on `None`.
async fn read_and_claim(
    s: &Stores,
    consumer: &str,
    read: &CandidateRead,
    choose: Chooser,
) -> ReadAndClaim {
    match s
        .locks
        .read_and_claim(&tx(consumer), read, T0, choose)
        .await
    {
        Ok(Some(done)) => done,
        Ok(None) => panic!("conformance: the store does not read and claim in one transaction"),
        Err(e) => panic!("conformance: read_and_claim failed: {e}"),
    }
}

/// The chooser gets the page as the plain read answers it (a page, or cover
/// band then fill band); what it names is won, locked and recorded as selected;
/// a chooser naming nothing claims nothing.
pub async fn read_and_claim_wins_what_the_chooser_names(db: &dyn TestDatabase) {
    let s = db.stores();
    add(
        &s,
        &[
            chf("w", "a", 0, 5),
            chf("w", "a", 1, 10),
            chf("w", "a", 2, 20),
        ],
    )
    .await;
    let bands = BandQuery {
        wallet: wallet("w"),
        token_type: token_type("CHF"),
        threshold: amount(10),
        cover: 10,
        fill: 10,
        fill_before: None,
        fill_unless_cover_at_most: None,
    };
    let plain = s
        .tokens
        .candidate_bands(&bands)
        .await
        .expect("candidate_bands");
    let done = read_and_claim(
        &s,
        "me",
        &CandidateRead::Bands(bands),
        Box::new(|page: &[Candidate]| page.iter().take(2).map(|c| c.id.clone()).collect()),
    )
    .await;
    assert_eq!(done.page, plain, "the page is what candidate_bands reads");
    let chosen: Vec<TokenId> = plain.iter().take(2).map(|c| c.id.clone()).collect();
    let won: Vec<(TokenId, ClaimVerdict)> = chosen
        .iter()
        .map(|t| (t.clone(), ClaimVerdict::Won))
        .collect();
    assert_eq!(done.verdicts, won);
    let left = all_candidates(&s, "w", 10).await;
    assert_eq!(left.len(), 1, "the two won tokens are locked: {left:?}");
    let spent = s
        .locks
        .spend_consumer(&tx("me"), T0, true)
        .await
        .expect("spend_consumer");
    assert_eq!(spent.len(), 2, "recorded as selected: {spent:?}");

    let done = read_and_claim(
        &s,
        "other",
        &page(10),
        Box::new(|_: &[Candidate]| Vec::new()),
    )
    .await;
    assert_eq!((done.page.len(), done.verdicts.len()), (1, 0));
    assert!(s.locks.list_locks().await.expect("list_locks").is_empty());
}

/// A chooser naming more than [`MAX_WINDOW`] tokens is refused and nothing of the
/// call is claimed.
pub async fn read_and_claim_refuses_a_window_too_large(db: &dyn TestDatabase) {
    let s = db.stores();
    add(&s, &[chf("w", "a", 0, 10), chf("w", "a", 1, 10)]).await;
    let too_many: Chooser = Box::new(|page: &[Candidate]| {
        let mut ids: Vec<TokenId> = page.iter().map(|c| c.id.clone()).collect();
        ids.extend(std::iter::repeat_n(page[0].id.clone(), MAX_WINDOW));
        ids
    });
    let err = s
        .locks
        .read_and_claim(&tx("me"), &page(10), T0, too_many)
        .await
        .expect_err("a window of more than MAX_WINDOW tokens is refused");
    assert!(
        matches!(err, LockStoreError::WindowTooLarge { .. }),
        "{err:?}"
    );
    assert!(s.locks.list_locks().await.expect("list_locks").is_empty());
}

/// 24 callers on three instances start at once, each taking the first token of
/// its own read of 20 tokens: 20 win one each, 4 read nothing, no verdict is
/// contended.
pub async fn read_and_claim_callers_never_lose_a_race(db: &dyn TestDatabase) {
    let mut instances = vec![db.stores()];
    for _ in 0..2 {
        instances.push(db.replica().await.expect("replica"));
    }
    let tokens: Vec<_> = (0..20).map(|i| chf("w", "fund", i, 10)).collect();
    add(&instances[0], &tokens).await;
    let barrier = Arc::new(Barrier::new(24));
    let mut tasks = Vec::new();
    for i in 0..24 {
        let (s, barrier) = (instances[i % instances.len()].clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let first: Chooser = Box::new(|page: &[Candidate]| {
                page.first().map(|c| c.id.clone()).into_iter().collect()
            });
            read_and_claim(&s, &format!("c{i}"), &page(10), first).await
        }));
    }
    let mut won = 0;
    for task in tasks {
        for (token, verdict) in task.await.expect("task").verdicts {
            assert_eq!(verdict, ClaimVerdict::Won, "a read-and-claim lost {token}");
            won += 1;
        }
    }
    assert_eq!(won, 20);
    assert_eq!(
        instances[0].locks.list_locks().await.expect("locks").len(),
        20
    );
}
