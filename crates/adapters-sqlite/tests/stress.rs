//! Three independent adapter instances (as three replicas) on one database file,
//! 32 tasks claiming from a small shared pool at once: no token is ever held by two
//! consumers, and no error (in particular no "database is locked") reaches a caller.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use holdfast_domain::{
    ClaimVerdict, Precision, Quantity, Timestamp, TokenId, TokenType, TxId, WalletId,
};
use holdfast_ports::{CandidateQuery, NewToken, Stores};
use tokio::sync::Barrier;

use common::TempDb;

const TASKS: usize = 32;
const ROUNDS: usize = 25;
const TOKENS: u32 = 48;

fn id<T>(r: Result<T, holdfast_domain::IdError>) -> T {
    r.expect("valid literal id")
}

/// What the test knows is held: token -> consumer. A win for a token already in
/// here is a double claim.
type Held = Arc<Mutex<HashMap<TokenId, TxId>>>;

async fn worker(s: Stores, task: usize, held: Held, barrier: Arc<Barrier>) -> (u64, u64) {
    let wallet = id(WalletId::new("w"));
    let chf = id(TokenType::new("CHF"));
    let (mut won, mut contended) = (0u64, 0u64);
    barrier.wait().await;
    for round in 0..ROUNDS {
        let me = id(TxId::new(format!("task-{task}-round-{round}")));
        let page = s
            .tokens
            .candidates(&CandidateQuery {
                wallet: wallet.clone(),
                token_type: chf.clone(),
                after: None,
                limit: 6,
            })
            .await
            .unwrap_or_else(|e| panic!("{me}: candidates: {e}"));
        let window: Vec<TokenId> = page.into_iter().map(|c| c.id).collect();
        let verdicts = s
            .locks
            .claim_window(&me, &window, Timestamp(1_000))
            .await
            .unwrap_or_else(|e| panic!("{me}: claim_window: {e}"));
        let mut mine = Vec::new();
        for (token, verdict) in verdicts {
            match verdict {
                ClaimVerdict::Won => {
                    let previous = held
                        .lock()
                        .expect("held map")
                        .insert(token.clone(), me.clone());
                    assert!(
                        previous.is_none(),
                        "{token} won by {me} while held by {previous:?}"
                    );
                    mine.push(token);
                    won += 1;
                }
                ClaimVerdict::Contended => contended += 1,
                ClaimVerdict::Stale => panic!("{me}: {token} is never spent here, not stale"),
            }
        }
        // While this consumer holds its wins, the lock rows must name it for each.
        if !mine.is_empty() {
            let rows = s
                .locks
                .list_locks()
                .await
                .unwrap_or_else(|e| panic!("{me}: list_locks: {e}"));
            for token in &mine {
                let holder = rows.iter().find(|l| &l.token == token).map(|l| &l.consumer);
                assert_eq!(holder, Some(&me), "{token} was reported won by {me}");
            }
        }
        // Forget first, then release, so the map never claims a freed token is held.
        {
            let mut map = held.lock().expect("held map");
            for token in &mine {
                map.remove(token);
            }
        }
        if round % 2 == 0 {
            let n = s
                .locks
                .release_consumer(&me, holdfast_domain::Timestamp::from_millis(0), true)
                .await
                .unwrap_or_else(|e| panic!("{me}: release: {e}"));
            assert_eq!(n, u64::try_from(mine.len()).unwrap_or(u64::MAX));
        } else {
            let n = s
                .locks
                .release_tokens(&me, &mine)
                .await
                .unwrap_or_else(|e| panic!("{me}: release_tokens: {e}"));
            assert_eq!(n, u64::try_from(mine.len()).unwrap_or(u64::MAX));
        }
    }
    (won, contended)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_32_claimers_never_double_claim() {
    let file = TempDb::new();
    let replicas: Vec<Stores> = vec![
        file.open().await.stores(),
        file.open().await.stores(),
        file.open().await.stores(),
    ];
    let tokens: Vec<NewToken> = (0..TOKENS)
        .map(|i| NewToken {
            id: TokenId::new(id(TxId::new("funding")), i),
            wallet: id(WalletId::new("w")),
            token_type: id(TokenType::new("CHF")),
            quantity: Quantity::new(u128::from(i % 5) + 1, Precision::default()).expect("amount"),
            spendable: true,
        })
        .collect();
    assert_eq!(
        replicas[0].tokens.add_tokens(&tokens).await,
        Ok(u64::from(TOKENS))
    );

    let held: Held = Arc::default();
    let barrier = Arc::new(Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            tokio::spawn(worker(
                replicas[t % 3].clone(),
                t,
                held.clone(),
                barrier.clone(),
            ))
        })
        .collect();
    let (mut won, mut contended) = (0u64, 0u64);
    for t in tasks {
        let (w, c) = t.await.expect("a claim task failed");
        won += w;
        contended += c;
    }
    assert!(won > 0, "someone won something");
    assert!(held.lock().expect("held map").is_empty());
    assert!(
        replicas[1]
            .locks
            .list_locks()
            .await
            .expect("list")
            .is_empty(),
        "all released"
    );
    let trips: u64 = replicas.iter().map(|s| s.locks.round_trips()).sum();
    println!("stress: {won} won, {contended} contended, {trips} round trips over 3 replicas");
}
