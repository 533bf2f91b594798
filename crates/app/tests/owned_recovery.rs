//! Owned work: each backend instance records its owner id on the locks and
//! selections it makes; a restarted instance recovers its own orphans (by the
//! service's policy) and leaves other owners' work alone; `list_locks` names
//! the owner. On a SQLite file and on PostgreSQL.

use crate::common;
use crate::pg_support;

use std::sync::Arc;

use common::{q, tx};
use holdfast::backend::{Backend, BackendOptions};
use holdfast::{SystemClock, TokenSelector};
use holdfast_domain::{
    PersistPolicy, SelectionConfig, SettlementStatus, TokenId, TokenType, TxId, TxStatus, WalletId,
};
use holdfast_ports::NewToken;

async fn open(url: &str, owner: &str) -> Backend {
    let options = BackendOptions {
        owner: owner.to_owned(),
        ..BackendOptions::default()
    };
    Backend::open(url, &options).await.expect("open")
}

async fn select(backend: &Backend, consumer: &str) -> Vec<TokenId> {
    let selector = TokenSelector::new(
        backend.stores(),
        Arc::new(SystemClock),
        SelectionConfig::default(),
        Some(1),
    )
    .expect("selector");
    selector
        .select(
            &WalletId::new("w").expect("wallet"),
            &TokenType::new("CHF").expect("type"),
            q(10),
            &tx(consumer),
        )
        .await
        .expect("select")
        .tokens
}

async fn check(url: &str) {
    let a = open(url, "replica-a").await;
    let b = open(url, "replica-b").await;
    assert_eq!((a.owner(), b.owner()), ("replica-a", "replica-b"));
    let funding: Vec<NewToken> = (0..4)
        .map(|i| NewToken {
            id: TokenId::new(tx("fund"), i),
            wallet: WalletId::new("w").expect("wallet"),
            token_type: TokenType::new("CHF").expect("type"),
            quantity: q(10),
            spendable: true,
        })
        .collect();
    a.stores()
        .tokens
        .add_tokens(&funding)
        .await
        .expect("funded");
    let of_a = select(&a, "a-1").await;
    let of_b = select(&b, "b-1").await;
    let locks = a.stores().locks.list_locks().await.expect("locks");
    let owner_of = |token: &TokenId| {
        locks
            .iter()
            .find(|l| &l.token == token)
            .map(|l| l.owner.clone())
    };
    assert_eq!(owner_of(&of_a[0]).as_deref(), Some("replica-a"));
    assert_eq!(owner_of(&of_b[0]).as_deref(), Some("replica-b"));
    // replica-a dies before settling a-1; a new process with its owner id starts.
    a.close().await;
    let a2 = open(url, "replica-a").await;
    let settlement =
        holdfast::Settlement::new(a2.stores(), Arc::new(SystemClock), PersistPolicy::default());
    let mut asked: Vec<TxId> = Vec::new();
    let asked_ref = &mut asked;
    let report = settlement
        .recover_orphans(|tx| {
            asked_ref.push(tx);
            async { holdfast::Orphan::Settle(SettlementStatus::Known(TxStatus::Deleted)) }
        })
        .await
        .expect("recover");
    assert_eq!(asked, vec![tx("a-1")], "only its own orphan is decided");
    assert_eq!(
        (report.consumers, report.settled, report.released),
        (1, 1, 1)
    );
    let statuses = a2.stores().statuses;
    assert_eq!(
        statuses.status(&tx("a-1")).await,
        Ok(Some(TxStatus::Deleted))
    );
    assert_eq!(
        statuses.status(&tx("b-1")).await,
        Ok(None),
        "b's work untouched"
    );
    let left = a2.stores().locks.list_locks().await.expect("locks");
    let left: Vec<(&TokenId, &str)> = left.iter().map(|l| (&l.token, l.owner.as_str())).collect();
    assert_eq!(
        left,
        vec![(&of_b[0], "replica-b")],
        "b still holds its token"
    );
    a2.close().await;
    b.close().await;
}

#[tokio::test]
async fn sqlite_a_restarted_instance_recovers_its_own_orphans_only() {
    let db = common::TempDb::new("owned-recovery");
    check(&db.url()).await;
}

#[tokio::test]
async fn postgres_a_restarted_instance_recovers_its_own_orphans_only() {
    let Some(db) = pg_support::TestDb::create("owned_recovery").await else {
        return;
    };
    check(&db.url).await;
}
