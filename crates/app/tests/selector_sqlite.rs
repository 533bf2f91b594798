//! The token selector on the real SQLite adapter: a failed select releases only
//! its own locks; earlier selects of the same transaction keep theirs, and what
//! they hold does not count as available to the transaction's next select; a
//! read-and-claim whose answer was lost holds nothing beyond the select's answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use holdfast::{SelectError, Settlement, SystemClock, TokenSelector};
use holdfast_adapters_sqlite::SqliteBackend;
use holdfast_domain::{
    PersistPolicy, Precision, Quantity, SelectionConfig, SelectionPolicy, SettlementStatus,
    Timestamp, TokenId, TokenType, TxId, TxStatus, WalletId,
};
use holdfast_ports::{
    CandidateRead, Chooser, LockStore, LockStoreError, NewToken, ReadAndClaim, StoreFault,
    forward_lock_store,
};

fn q(v: u128) -> Quantity {
    Quantity::new(v, Precision::MAX).expect("quantity")
}

fn tx(id: &str) -> TxId {
    TxId::new(id).expect("tx")
}

fn wallet() -> WalletId {
    WalletId::new("alice").expect("wallet")
}

fn chf() -> TokenType {
    TokenType::new("CHF").expect("type")
}

#[tokio::test]
async fn a_failed_select_keeps_the_locks_of_an_earlier_select_of_the_same_tx() {
    let backend = SqliteBackend::open_in_memory().await.expect("open");
    let stores = backend.stores();
    let funding: Vec<NewToken> = [3u128, 4, 10]
        .into_iter()
        .zip(0u32..)
        .map(|(amount, index)| NewToken {
            id: TokenId::new(tx("funding"), index),
            wallet: wallet(),
            token_type: chf(),
            quantity: q(amount),
            spendable: true,
        })
        .collect();
    stores.tokens.add_tokens(&funding).await.expect("funded");
    // The upstream order, which claims what it reads before it knows it is short
    // (`cover_first` claims nothing here: the read shows the 14 cannot cover 15).
    let config = SelectionConfig {
        policy: SelectionPolicy::SmallestFirst,
        ..SelectionConfig::default()
    };
    let selector =
        TokenSelector::new(stores.clone(), Arc::new(SystemClock), config, Some(1)).expect("config");

    let first = selector
        .select(&wallet(), &chf(), q(3), &tx("t1"))
        .await
        .expect("first select");
    assert_eq!(first.tokens, vec![TokenId::new(tx("funding"), 0)]);

    // The second select of t1 claims what is left (4 and 10), then the balance
    // available to t1 (17, less the 3 its first select holds) is below 15:
    // insufficient funds, not "locked" (the 3 is t1's own), and it releases its own
    // wins only.
    let second = selector
        .select_with_stats(&wallet(), &chf(), q(15), &tx("t1"))
        .await;
    assert_eq!(
        second.result,
        Err(SelectError::InsufficientFunds {
            available: q(14),
            requested: q(15)
        })
    );
    assert_eq!(second.stats.legs, 1, "no backoff: the money is not there");
    assert_eq!(second.stats.lock_attempts, 2, "{:?}", second.stats);
    assert_eq!(second.stats.releases, 1, "{:?}", second.stats);

    let locks = stores.locks.list_locks().await.expect("locks");
    let held: Vec<(TokenId, TxId)> = locks.into_iter().map(|l| (l.token, l.consumer)).collect();
    assert_eq!(held, vec![(TokenId::new(tx("funding"), 0), tx("t1"))]);
}

/// The SQLite lock store, except that the first read-and-claim commits and then
/// answers an error, as a COMMIT whose answer was lost does.
struct LostCommit {
    inner: Arc<dyn LockStore>,
    lost: AtomicBool,
}

forward_lock_store! {
    impl LockStore for LostCommit {
        async fn read_and_claim(
            &self,
            c: &TxId,
            read: &CandidateRead,
            at: Timestamp,
            choose: Chooser,
        ) -> Result<Option<ReadAndClaim>, LockStoreError> {
            let done = self.inner.read_and_claim(c, read, at, choose).await?;
            if !self.lost.swap(true, Ordering::SeqCst) {
                return Err(LockStoreError::Fault(StoreFault::Unavailable(
                    "connection lost after COMMIT was sent".to_owned(),
                )));
            }
            Ok(done)
        }
    }
    forward to inner: claim, claim_window, read_with_claim, renew, release_consumer,
        release_tokens, spend_consumer, confirm, selected, unsettled_owned, unsettled, sweep,
        list_locks, round_trips
}

/// A read-and-claim that committed but answered an error leaves the select not
/// knowing what it holds: the select gives those tokens back, so it holds exactly
/// what it answers with and a Confirmed spends nothing else.
#[tokio::test]
async fn a_read_and_claim_whose_commit_answer_was_lost_leaves_nothing_held_beyond_the_answer() {
    let backend = SqliteBackend::open_in_memory().await.expect("open");
    let mut stores = backend.stores();
    let funding: Vec<NewToken> = [5u128, 7, 10, 20, 40]
        .into_iter()
        .zip(0u32..)
        .map(|(amount, index)| NewToken {
            id: TokenId::new(tx("funding"), index),
            wallet: wallet(),
            token_type: chf(),
            quantity: q(amount),
            spendable: true,
        })
        .collect();
    stores.tokens.add_tokens(&funding).await.expect("funded");
    stores.locks = Arc::new(LostCommit {
        inner: stores.locks.clone(),
        lost: AtomicBool::new(false),
    });
    let selector = TokenSelector::new(
        stores.clone(),
        Arc::new(SystemClock),
        SelectionConfig::default(),
        Some(3),
    )
    .expect("config");
    let selected = selector
        .select(&wallet(), &chf(), q(6), &tx("pay"))
        .await
        .expect("the select recovers from the lost answer");
    let mut held: Vec<TokenId> = stores
        .locks
        .list_locks()
        .await
        .expect("locks")
        .into_iter()
        .filter(|l| l.consumer == tx("pay"))
        .map(|l| l.token)
        .collect();
    held.sort();
    let mut answered = selected.tokens.clone();
    answered.sort();
    assert_eq!(held, answered, "locked beyond the answer");
    let settled = Settlement::new(
        stores.clone(),
        Arc::new(SystemClock),
        PersistPolicy::default(),
    )
    .on_status(&tx("pay"), SettlementStatus::Known(TxStatus::Confirmed))
    .await
    .expect("confirmed");
    let mut spent = settled.spent.clone();
    spent.sort();
    assert_eq!(
        spent, answered,
        "a Confirmed spends only what the select answered"
    );
}
