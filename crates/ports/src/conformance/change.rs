//! Checks of [`crate::LockStore::confirm_with_change`]: the outputs get the
//! change of what the transaction selected, per token type in type order, to
//! the change wallet, in the confirm's one transaction; its answers and
//! refusals are those of [`crate::LockStore::confirm`] of the outputs with
//! their change.

use holdfast_domain::{ClaimVerdict, TokenId, TxId};

use super::TestDatabase;
use super::support::{T0, add, amount, at, chf, token_id, token_type, tx, wallet};
use crate::{LockStoreError, MAX_OUTPUTS, NewToken, Output, Stores};

/// An output of `value` of `kind` to `wallet_id`.
fn pay(wallet_id: &str, kind: &str, value: u128) -> Output {
    Output {
        wallet: wallet(wallet_id),
        token_type: token_type(kind),
        quantity: amount(value),
    }
}

/// Adds `tokens` and claims them all for `consumer`.
async fn claimed(s: &Stores, consumer: &TxId, tokens: Vec<NewToken>) {
    let ids: Vec<TokenId> = tokens.iter().map(|t| t.id.clone()).collect();
    add(s, &tokens).await;
    let verdicts = s
        .locks
        .claim_window(consumer, &ids, T0)
        .await
        .expect("claim");
    assert!(
        verdicts.iter().all(|(_, v)| *v == ClaimVerdict::Won),
        "{verdicts:?}"
    );
}

/// The spendable balance of `wallet_id` in `kind`.
async fn balance(s: &Stores, wallet_id: &str, kind: &str) -> u128 {
    s.tokens
        .balance(&wallet(wallet_id), &token_type(kind))
        .await
        .expect("balance")
        .value()
}

/// 10 and 5 CHF and 7 EUR in, 12 CHF to `r`: the change is 3 CHF and 7 EUR to
/// `w`, in type order after the payment, all three stored with the spend. A
/// retry of the same call is refused as other outputs (the stored ones include
/// the change), while a confirm of every output answers `replayed`.
pub async fn the_change_of_each_type_goes_back_in_type_order(db: &dyn TestDatabase) {
    let s = db.stores();
    let t1 = tx("t1");
    let eur = NewToken {
        token_type: token_type("EUR"),
        ..chf("w", "fund", 2, 7)
    };
    claimed(
        &s,
        &t1,
        vec![chf("w", "fund", 0, 10), chf("w", "fund", 1, 5), eur],
    )
    .await;
    let (done, all) = s
        .locks
        .confirm_with_change(&t1, &[pay("r", "CHF", 12)], &wallet("w"), at(1))
        .await
        .expect("confirm");
    assert_eq!(
        all,
        vec![pay("r", "CHF", 12), pay("w", "CHF", 3), pay("w", "EUR", 7)]
    );
    assert_eq!(
        done.outputs,
        vec![token_id("t1", 0), token_id("t1", 1), token_id("t1", 2)]
    );
    assert_eq!(done.spent.len(), 3, "{done:?}");
    assert!(!done.replayed);
    let balances = (
        balance(&s, "r", "CHF").await,
        balance(&s, "w", "CHF").await,
        balance(&s, "w", "EUR").await,
    );
    assert_eq!(balances, (12, 3, 7));
    let again = s
        .locks
        .confirm_with_change(&t1, &[pay("r", "CHF", 12)], &wallet("w"), at(2))
        .await;
    assert!(
        matches!(again, Err(LockStoreError::OutputsDiffer { .. })),
        "{again:?}"
    );
    let replayed = s.locks.confirm(&t1, &all, at(2)).await.expect("replay");
    assert!(
        replayed.replayed && replayed.spent.is_empty(),
        "{replayed:?}"
    );
}

/// Paid in full, there is no change: the answer is the outputs given, and the
/// same call again answers `replayed`.
pub async fn a_payment_in_full_has_no_change(db: &dyn TestDatabase) {
    let s = db.stores();
    let t1 = tx("t1");
    claimed(&s, &t1, vec![chf("w", "fund", 0, 10)]).await;
    let outputs = [pay("r", "CHF", 4), pay("q", "CHF", 6)];
    for (n, replayed) in [(1, false), (2, true)] {
        let (done, all) = s
            .locks
            .confirm_with_change(&t1, &outputs, &wallet("w"), at(n))
            .await
            .expect("confirm");
        assert_eq!(all, outputs.to_vec());
        assert_eq!(done.outputs, vec![token_id("t1", 0), token_id("t1", 1)]);
        assert_eq!(done.replayed, replayed, "call {n}: {done:?}");
    }
    assert_eq!(balance(&s, "w", "CHF").await, 0);
}

/// Outputs beyond the inputs are not conserved; outputs that with their change
/// are more than [`MAX_OUTPUTS`] are bad outputs; both change nothing.
pub async fn outputs_confirm_would_refuse_are_refused_with_their_change(db: &dyn TestDatabase) {
    let s = db.stores();
    let t1 = tx("t1");
    claimed(&s, &t1, vec![chf("w", "fund", 0, 2_000)]).await;
    let minting = s
        .locks
        .confirm_with_change(&t1, &[pay("r", "CHF", 2_001)], &wallet("w"), at(1))
        .await;
    assert!(
        matches!(&minting, Err(LockStoreError::NotConserved(u)) if u.token_type == "CHF"),
        "{minting:?}"
    );
    let ones = vec![pay("r", "CHF", 1); MAX_OUTPUTS];
    let crowded = s
        .locks
        .confirm_with_change(&t1, &ones, &wallet("w"), at(1))
        .await;
    assert!(
        matches!(crowded, Err(LockStoreError::BadOutputs { .. })),
        "{crowded:?}"
    );
    assert_eq!(s.statuses.status(&t1).await, Ok(None), "no status");
    let output = s.tokens.token(&token_id("t1", 0)).await;
    assert_eq!(output, Ok(None), "no output");
    assert_eq!(balance(&s, "w", "CHF").await, 2_000);
    // One output fewer leaves room for the change.
    let (_, all) = s
        .locks
        .confirm_with_change(&t1, &ones[1..], &wallet("w"), at(2))
        .await
        .expect("room for the change");
    assert_eq!(all.len(), MAX_OUTPUTS);
    assert_eq!(all.last(), Some(&pay("w", "CHF", 977)));
}

/// t1's lease ran out and t2 took and spent one of its two tokens: t1's confirm
/// with change is a double spend naming the token and t2, whatever change the
/// other token would leave, and writes nothing.
pub async fn a_double_spend_wins_over_the_change(db: &dyn TestDatabase) {
    let s = db.stores();
    let (t1, t2) = (tx("t1"), tx("t2"));
    claimed(
        &s,
        &t1,
        vec![chf("w", "fund", 0, 10), chf("w", "fund", 1, 5)],
    )
    .await;
    let rule = holdfast_domain::LeaseConfig::default().sweep_rule(at(1_000_000));
    s.locks.sweep(rule).await.expect("sweep");
    let taken = token_id("fund", 0);
    let won = s.locks.claim(&t2, &taken, at(1_000_001)).await;
    assert_eq!(won, Ok(ClaimVerdict::Won));
    s.locks
        .confirm_with_change(&t2, &[pay("r", "CHF", 4)], &wallet("w"), at(1_000_002))
        .await
        .expect("t2 confirms");
    let refused = s
        .locks
        .confirm_with_change(&t1, &[pay("x", "CHF", 1)], &wallet("w"), at(1_000_003))
        .await;
    assert_eq!(
        refused,
        Err(LockStoreError::DoubleSpend {
            token: taken,
            spent_by: t2
        })
    );
    assert_eq!(s.tokens.token(&token_id("t1", 0)).await, Ok(None));
    assert_eq!(s.statuses.status(&t1).await, Ok(None), "no status");
    assert_eq!(balance(&s, "x", "CHF").await, 0);
}

/// Inputs of two wallets that together hold more than 2^128 - 1: their change
/// could not be one output, so the confirm is refused (as bad outputs where the
/// store works the change out, as not conserved where it is capped first) and
/// writes nothing.
pub async fn a_change_beyond_the_limit_is_refused(db: &dyn TestDatabase) {
    let s = db.stores();
    let t1 = tx("t1");
    claimed(
        &s,
        &t1,
        vec![chf("a", "fund", 0, u128::MAX - 5), chf("b", "fund", 1, 100)],
    )
    .await;
    let refused = s
        .locks
        .confirm_with_change(&t1, &[pay("r", "CHF", 1)], &wallet("w"), at(1))
        .await;
    assert!(
        matches!(
            refused,
            Err(LockStoreError::BadOutputs { .. } | LockStoreError::NotConserved(_))
        ),
        "{refused:?}"
    );
    assert_eq!(s.statuses.status(&t1).await, Ok(None), "no status");
    assert_eq!(
        s.tokens.token(&token_id("t1", 0)).await,
        Ok(None),
        "no output"
    );
    assert_eq!(balance(&s, "a", "CHF").await, u128::MAX - 5);
    assert_eq!(balance(&s, "b", "CHF").await, 100);
    assert_eq!(balance(&s, "w", "CHF").await, 0, "no change");
}
