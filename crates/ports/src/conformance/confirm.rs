//! Checks of [`crate::LockStore::confirm`]: a confirmed transaction spends what it
//! selected and adds its outputs in one transaction with its status; outputs must
//! conserve the inputs per token type; a retry with the same outputs changes
//! nothing, other outputs are refused; every refusal writes nothing.

use holdfast_domain::{ClaimVerdict, TokenId, TxId, TxStatus};

use super::TestDatabase;
use super::locks::holders;
use super::support::{T0, add, amount, at, chf, token_id, token_type, tx, wallet};
use crate::{Confirmation, LockStoreError, NewToken, Output, Stores};

/// An output of `value` CHF to `wallet_id`.
fn pay(wallet_id: &str, value: u128) -> Output {
    Output {
        wallet: wallet(wallet_id),
        token_type: token_type("CHF"),
        quantity: amount(value),
    }
}

/// Funds `w` with 10 and 5 CHF (tx `fund`) and claims both for `consumer`.
async fn funded_and_claimed(s: &Stores, consumer: &TxId) -> Vec<TokenId> {
    add(s, &[chf("w", "fund", 0, 10), chf("w", "fund", 1, 5)]).await;
    let inputs = vec![token_id("fund", 0), token_id("fund", 1)];
    let verdicts = s
        .locks
        .claim_window(consumer, &inputs, T0)
        .await
        .expect("claim");
    assert!(
        verdicts.iter().all(|(_, v)| *v == ClaimVerdict::Won),
        "{verdicts:?}"
    );
    inputs
}

/// The spendable balance of `wallet_id` in CHF.
async fn balance(s: &Stores, wallet_id: &str) -> u128 {
    s.tokens
        .balance(&wallet(wallet_id), &token_type("CHF"))
        .await
        .expect("balance")
        .value()
}

/// What a refused confirm must leave: `consumer` still holds its inputs, unspent,
/// no status, no output, balances as funded.
async fn nothing_changed(s: &Stores, consumer: &TxId, inputs: &[TokenId], what: &str) {
    let held = holders(s).await;
    for input in inputs {
        assert_eq!(
            held.get(input),
            Some(consumer),
            "{what}: {input} still locked"
        );
        let token = s.tokens.token(input).await.expect("token").expect("exists");
        assert_eq!(token.spent_by, None, "{what}: {input} unspent");
    }
    assert_eq!(
        s.statuses.status(consumer).await,
        Ok(None),
        "{what}: no status"
    );
    let output = s.tokens.token(&TokenId::new(consumer.clone(), 0)).await;
    assert_eq!(output, Ok(None), "{what}: no output");
    assert_eq!(balance(s, "w").await, 15, "{what}: w as funded");
    assert_eq!(balance(s, "r").await, 0, "{what}: nothing paid");
}

/// 15 CHF in, 12 to `r` and 3 of change to `w`: both inputs spent, both outputs
/// spendable with ids `(t1, 0)` and `(t1, 1)`, the status recorded, no lock or
/// selection left.
pub async fn confirm_spends_the_inputs_and_adds_the_outputs_at_once(db: &dyn TestDatabase) {
    let s = db.stores();
    let t1 = tx("t1");
    let inputs = funded_and_claimed(&s, &t1).await;
    let selected: Vec<TokenId> = s
        .locks
        .selected(&t1)
        .await
        .expect("selected")
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(selected, inputs, "what a confirm will spend");
    let done = s
        .locks
        .confirm(&t1, &[pay("r", 12), pay("w", 3)], at(1))
        .await
        .expect("confirm");
    assert_eq!(
        done,
        Confirmation {
            spent: inputs.clone(),
            outputs: vec![token_id("t1", 0), token_id("t1", 1)],
            replayed: false,
        }
    );
    for input in &inputs {
        let token = s.tokens.token(input).await.expect("token").expect("exists");
        assert_eq!(token.spent_by, Some(t1.clone()));
    }
    let paid = s.tokens.token(&token_id("t1", 0)).await.expect("token");
    let paid = paid.expect("the payment exists");
    assert_eq!((paid.wallet, paid.quantity), (wallet("r"), amount(12)));
    assert_eq!((balance(&s, "r").await, balance(&s, "w").await), (12, 3));
    assert_eq!(s.statuses.status(&t1).await, Ok(Some(TxStatus::Confirmed)));
    assert!(holders(&s).await.is_empty(), "no lock left");
    assert_eq!(
        s.locks.unsettled().await,
        Ok(Vec::new()),
        "no selection left"
    );
    assert_eq!(
        s.locks.selected(&t1).await,
        Ok(Vec::new()),
        "nothing selected"
    );
    // Confirmed is final: a select of it still running wins nothing more, and a
    // Deleted arriving later (a recovery that decided before the confirm
    // committed) releases nothing and leaves Confirmed.
    add(&s, &[chf("w", "late", 0, 1)]).await;
    assert_eq!(
        s.locks.claim(&t1, &token_id("late", 0), at(2)).await,
        Ok(ClaimVerdict::Contended)
    );
    let window = s
        .locks
        .claim_window(&t1, &[token_id("late", 0)], at(2))
        .await
        .expect("claim");
    assert_eq!(window, vec![(token_id("late", 0), ClaimVerdict::Contended)]);
    assert!(holders(&s).await.is_empty(), "no lock taken");
    assert_eq!(s.locks.release_consumer(&t1, at(3), true).await, Ok(0));
    assert_eq!(s.statuses.status(&t1).await, Ok(Some(TxStatus::Confirmed)));
}

/// The same confirm again (a retry after a lost answer) changes nothing and says
/// so; other outputs, or none, are refused and change nothing either.
pub async fn a_retried_confirm_is_a_no_op_and_other_outputs_are_refused(db: &dyn TestDatabase) {
    let s = db.stores();
    let t1 = tx("t1");
    funded_and_claimed(&s, &t1).await;
    let outputs = [pay("r", 12), pay("w", 3)];
    s.locks
        .confirm(&t1, &outputs, at(1))
        .await
        .expect("confirm");
    let again = s.locks.confirm(&t1, &outputs, at(2)).await.expect("retry");
    assert!(again.replayed && again.spent.is_empty(), "{again:?}");
    assert_eq!(again.outputs, vec![token_id("t1", 0), token_id("t1", 1)]);
    for other in [
        vec![pay("r", 11), pay("w", 4)],
        vec![pay("r", 15)],
        Vec::new(),
    ] {
        let refused = s.locks.confirm(&t1, &other, at(3)).await;
        assert!(
            matches!(refused, Err(LockStoreError::OutputsDiffer { .. })),
            "{other:?}: {refused:?}"
        );
    }
    assert_eq!((balance(&s, "r").await, balance(&s, "w").await), (12, 3));
}

/// Outputs short of the inputs (a fee), beyond them (minting), of another type,
/// missing a type, or with an output of 0: refused, nothing changed.
pub async fn outputs_that_do_not_conserve_the_inputs_change_nothing(db: &dyn TestDatabase) {
    let s = db.stores();
    let t1 = tx("t1");
    let inputs = funded_and_claimed(&s, &t1).await;
    let eur = Output {
        token_type: token_type("EUR"),
        ..pay("r", 15)
    };
    let cases: [(&str, Vec<Output>); 5] = [
        ("a fee", vec![pay("r", 12), pay("w", 2)]),
        ("minting", vec![pay("r", 12), pay("w", 4)]),
        ("another type", vec![eur]),
        ("no outputs", Vec::new()),
        ("an output of 0", vec![pay("r", 15), pay("w", 0)]),
    ];
    for (what, outputs) in cases {
        let refused = s.locks.confirm(&t1, &outputs, at(1)).await;
        match (what, &refused) {
            ("an output of 0", Err(LockStoreError::BadOutputs { .. })) => {}
            (_, Err(LockStoreError::NotConserved(refused))) => {
                assert_eq!(refused.tx, t1, "{what}");
                assert!(
                    ["CHF", "EUR"].contains(&refused.token_type.as_str()),
                    "{what}"
                );
            }
            _ => panic!("{what}: {refused:?}"),
        }
        nothing_changed(&s, &t1, &inputs, what).await;
    }
    // Two types, each conserved on its own: confirmed.
    let eur_input = NewToken {
        token_type: token_type("EUR"),
        ..chf("w", "fund-eur", 0, 7)
    };
    add(&s, &[eur_input]).await;
    let won = s
        .locks
        .claim(&t1, &token_id("fund-eur", 0), T0)
        .await
        .expect("claim");
    assert_eq!(won, ClaimVerdict::Won);
    let eur_out = Output {
        token_type: token_type("EUR"),
        ..pay("r", 7)
    };
    let done = s
        .locks
        .confirm(&t1, &[pay("r", 15), eur_out], at(2))
        .await
        .expect("both types conserved");
    assert_eq!(done.spent.len(), 3);
}

/// t1's lease ran out and t2 took and spent its token: t1's confirm is a double
/// spend naming the token and t2, and adds no output.
pub async fn a_confirm_of_a_token_spent_by_another_adds_nothing(db: &dyn TestDatabase) {
    let s = db.stores();
    add(&s, &[chf("w", "fund", 0, 10)]).await;
    let (t1, t2, token) = (tx("t1"), tx("t2"), token_id("fund", 0));
    assert_eq!(s.locks.claim(&t1, &token, T0).await, Ok(ClaimVerdict::Won));
    // The sweep takes t1's lock; t2 claims and confirms the token.
    let rule = holdfast_domain::LeaseConfig::default().sweep_rule(at(1_000_000));
    s.locks.sweep(rule).await.expect("sweep");
    assert_eq!(
        s.locks.claim(&t2, &token, at(1_000_001)).await,
        Ok(ClaimVerdict::Won)
    );
    s.locks
        .confirm(&t2, &[pay("r", 10)], at(1_000_002))
        .await
        .expect("t2 confirms");
    let refused = s.locks.confirm(&t1, &[pay("x", 10)], at(1_000_003)).await;
    assert_eq!(
        refused,
        Err(LockStoreError::DoubleSpend {
            token: token.clone(),
            spent_by: t2.clone()
        })
    );
    assert_eq!(
        s.tokens.token(&token_id("t1", 0)).await,
        Ok(None),
        "no output"
    );
    assert_eq!(s.statuses.status(&t1).await, Ok(None), "no status");
    assert_eq!(balance(&s, "x").await, 0);
}

/// Two confirms of one transaction at once (a retry racing the first attempt):
/// both succeed, exactly one of them applied it.
pub async fn concurrent_confirms_of_one_transaction_apply_it_once(db: &dyn TestDatabase) {
    let s = db.stores();
    let t1 = tx("t1");
    funded_and_claimed(&s, &t1).await;
    let outputs = vec![pay("r", 12), pay("w", 3)];
    let (a, b) = tokio::join!(
        s.locks.confirm(&t1, &outputs, at(1)),
        s.locks.confirm(&t1, &outputs, at(1))
    );
    let (a, b) = (a.expect("first"), b.expect("second"));
    assert!(a.replayed != b.replayed, "exactly one applied: {a:?} {b:?}");
    assert_eq!((balance(&s, "r").await, balance(&s, "w").await), (12, 3));
}

/// Outputs that would lift a wallet's unspent total (spendable or not) beyond
/// 2^128 - 1 are bad outputs naming the wallet and type, and change nothing;
/// up to exactly 2^128 - 1 is fine, and the inputs a confirm spends no longer
/// count (change paid back into a full wallet).
pub async fn outputs_that_would_overflow_a_wallet_change_nothing(db: &dyn TestDatabase) {
    let s = db.stores();
    let t1 = tx("t1");
    let inputs = funded_and_claimed(&s, &t1).await;
    let off = NewToken {
        spendable: false,
        ..chf("off", "full", 1, u128::MAX - 5)
    };
    add(&s, &[chf("full", "full", 0, u128::MAX - 5), off]).await;
    let cases: [(&str, &str, Vec<Output>); 3] = [
        ("a payment", "full", vec![pay("full", 12), pay("w", 3)]),
        (
            "two outputs to one wallet",
            "full",
            vec![pay("full", 3), pay("full", 3), pay("w", 9)],
        ),
        (
            "a wallet full of unspendable tokens",
            "off",
            vec![pay("off", 6), pay("w", 9)],
        ),
    ];
    for (what, full, outputs) in cases {
        match s.locks.confirm(&t1, &outputs, at(1)).await {
            Err(LockStoreError::BadOutputs { detail }) => {
                let named = format!("wallet {full} type CHF");
                assert!(detail.contains(&named), "{what}: {detail}");
            }
            other => panic!("{what}: expected BadOutputs, got {other:?}"),
        }
        nothing_changed(&s, &t1, &inputs, what).await;
        assert_eq!(balance(&s, "full").await, u128::MAX - 5, "{what}");
    }
    s.locks
        .confirm(&t1, &[pay("full", 5), pay("w", 10)], at(2))
        .await
        .expect("filling a wallet to exactly 2^128 - 1");
    assert_eq!(
        (balance(&s, "full").await, balance(&s, "w").await),
        (u128::MAX, 10)
    );
    // w holds t1's change of 10; filled to 2^128 - 1, it may still pay itself.
    add(&s, &[chf("w", "fill", 0, u128::MAX - 10)]).await;
    let t2 = tx("t2");
    let won = s.locks.claim(&t2, &token_id("t1", 1), T0).await;
    assert_eq!(won, Ok(ClaimVerdict::Won));
    s.locks
        .confirm(&t2, &[pay("w", 4), pay("w", 6)], at(3))
        .await
        .expect("the spent input makes room for its change");
    assert_eq!(balance(&s, "w").await, u128::MAX);
}
