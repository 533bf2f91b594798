//! The token selector on the real SQLite adapter: a failed select releases only
//! its own locks; earlier selects of the same transaction keep theirs, and what
//! they hold does not count as available to the transaction's next select.

use std::sync::Arc;

use holdfast::{SelectError, SystemClock, TokenSelector};
use holdfast_adapters_sqlite::SqliteBackend;
use holdfast_domain::{
    Precision, Quantity, SelectionConfig, SelectionPolicy, TokenId, TokenType, TxId, WalletId,
};
use holdfast_ports::NewToken;

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
