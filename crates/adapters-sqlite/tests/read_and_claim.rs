//! `LockStore::read_and_claim` on SQLite: the read and the claim in one
//! IMMEDIATE transaction, so concurrent callers never lose a race for what they
//! read.

use crate::common;

use std::sync::Arc;

use holdfast_domain::{
    Candidate, ClaimVerdict, Precision, Quantity, Timestamp, TokenId, TokenType, TxId, WalletId,
};
use holdfast_ports::{
    CandidateQuery, CandidateRead, LockStore, LockStoreError, MAX_WINDOW, NewToken, TokenStore,
};

use common::TempDb;

const T0: Timestamp = Timestamp(1_796_025_600_000);

fn wallet() -> (WalletId, TokenType) {
    (
        WalletId::new("w").expect("wallet"),
        TokenType::new("CHF").expect("type"),
    )
}

fn tokens(count: u32) -> Vec<NewToken> {
    let (wallet, token_type) = wallet();
    (0..count)
        .map(|i| NewToken {
            id: TokenId::new(TxId::new("fund").expect("tx"), i),
            wallet: wallet.clone(),
            token_type: token_type.clone(),
            quantity: Quantity::new(10, Precision::MAX).expect("amount"),
            spendable: true,
        })
        .collect()
}

fn page(limit: usize) -> CandidateRead {
    let (wallet, token_type) = wallet();
    CandidateRead::Page(CandidateQuery {
        wallet,
        token_type,
        after: None,
        limit,
    })
}

fn tx(name: &str) -> TxId {
    TxId::new(name).expect("tx")
}

#[tokio::test]
async fn the_chosen_tokens_of_the_page_read_are_won_and_selected() {
    let file = TempDb::new();
    let backend = file.open().await;
    backend.add_tokens(&tokens(3)).await.expect("funded");
    let done = backend
        .read_and_claim(
            &tx("a"),
            &page(10),
            T0,
            Box::new(|page: &[Candidate]| page.iter().take(2).map(|c| c.id.clone()).collect()),
        )
        .await
        .expect("answered")
        .expect("SQLite reads and claims in one transaction");
    assert_eq!(done.page.len(), 3);
    let chosen: Vec<TokenId> = done.page.iter().take(2).map(|c| c.id.clone()).collect();
    assert_eq!(
        done.verdicts,
        chosen
            .iter()
            .map(|t| (t.clone(), ClaimVerdict::Won))
            .collect::<Vec<_>>()
    );
    // Locked for "a" and selected by it: the next read leaves them out, and a
    // confirmed settlement spends them.
    let (wallet, token_type) = wallet();
    let left = backend
        .candidates(&CandidateQuery {
            wallet,
            token_type,
            after: None,
            limit: 10,
        })
        .await
        .expect("read");
    assert_eq!(left.len(), 1);
    let spent = backend
        .spend_consumer(&tx("a"), T0, true)
        .await
        .expect("spent");
    assert_eq!(spent.len(), 2);
    // A chooser that names nothing claims nothing.
    let done = backend
        .read_and_claim(
            &tx("b"),
            &page(10),
            T0,
            Box::new(|_: &[Candidate]| Vec::new()),
        )
        .await
        .expect("answered")
        .expect("supported");
    assert_eq!((done.page.len(), done.verdicts.len()), (1, 0));
}

#[tokio::test]
async fn a_window_too_large_is_refused_and_nothing_is_claimed() {
    let file = TempDb::new();
    let backend = file.open().await;
    backend.add_tokens(&tokens(2)).await.expect("funded");
    let too_many = Box::new(|page: &[Candidate]| {
        std::iter::repeat_n(page[0].id.clone(), MAX_WINDOW + 1).collect()
    });
    let err = backend
        .read_and_claim(&tx("a"), &page(10), T0, too_many)
        .await
        .expect_err("refused");
    assert!(
        matches!(err, LockStoreError::WindowTooLarge { .. }),
        "{err:?}"
    );
    assert!(backend.list_locks().await.expect("locks").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_on_two_instances_never_lose_a_race() {
    // 24 callers on two instances of one file, each taking any one free token of
    // 20 from its own read: 20 win, 4 find nothing, no verdict is contended.
    let file = TempDb::new();
    let (a, b) = (Arc::new(file.open().await), Arc::new(file.open().await));
    a.add_tokens(&tokens(20)).await.expect("funded");
    let mut tasks = Vec::new();
    for i in 0..24 {
        let backend = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            backend
                .read_and_claim(
                    &TxId::new(format!("c{i}")).expect("tx"),
                    &page(10),
                    T0,
                    Box::new(|page: &[Candidate]| {
                        page.first().map(|c| c.id.clone()).into_iter().collect()
                    }),
                )
                .await
                .expect("answered")
                .expect("supported")
        }));
    }
    let mut won = 0;
    for task in tasks {
        for (_, verdict) in task.await.expect("task").verdicts {
            assert_eq!(verdict, ClaimVerdict::Won, "a read-and-claim lost a race");
            won += 1;
        }
    }
    assert_eq!(won, 20);
    assert_eq!(a.list_locks().await.expect("locks").len(), 20);
}
