//! Checks of the token store: idempotent adds, candidates, paging, amounts, balance.

use holdfast_domain::{Quantity, TokenId};

use super::TestDatabase;
use super::support::{T0, add, all_candidates, amount, chf, ids, token_id, token_type, tx, wallet};
use crate::{BandQuery, CandidateQuery, NewToken, TokenStoreError};

/// Adding the same tokens twice adds them once; the stored token is exact.
pub async fn add_tokens_is_idempotent(db: &dyn TestDatabase) {
    let s = db.stores();
    let batch = [
        chf("w", "a", 0, 5),
        chf("w", "a", 1, 7),
        chf("w", "b", 0, 9),
    ];
    assert_eq!(s.tokens.add_tokens(&batch).await, Ok(3), "first add");
    assert_eq!(
        s.tokens.add_tokens(&batch).await,
        Ok(0),
        "re-adding identical tokens must add nothing"
    );
    assert_eq!(
        s.tokens
            .add_tokens(&[chf("w", "a", 0, 5), chf("w", "c", 0, 1)])
            .await,
        Ok(1),
        "a batch mixing an existing and a new token adds only the new one"
    );
    let stored = s.tokens.token(&token_id("a", 1)).await.expect("token");
    let stored = stored.expect("token a:1 must exist");
    assert_eq!(stored.id, token_id("a", 1));
    assert_eq!(stored.wallet, wallet("w"));
    assert_eq!(stored.token_type, token_type("CHF"));
    assert_eq!(stored.quantity, amount(7));
    assert!(stored.spendable);
    assert_eq!(stored.spent_by, None);
    assert_eq!(stored.spent_at, None);
    assert_eq!(s.tokens.token(&token_id("zz", 0)).await, Ok(None));
    assert_eq!(s.tokens.add_tokens(&[]).await, Ok(0), "an empty add");
}

/// A token re-added with a different wallet, type or amount is a conflict naming the
/// token, and nothing of that call is written.
pub async fn add_tokens_conflict_writes_nothing(db: &dyn TestDatabase) {
    let s = db.stores();
    add(&s, &[chf("w", "a", 0, 5)]).await;
    let mut other_type = chf("w", "a", 0, 5);
    other_type.token_type = token_type("EUR");
    for changed in [chf("w", "a", 0, 6), chf("v", "a", 0, 5), other_type] {
        let err = s
            .tokens
            .add_tokens(&[chf("w", "new", 0, 1), changed.clone()])
            .await
            .expect_err("a different token under an existing id must be refused");
        match err {
            TokenStoreError::Conflict { token, .. } => assert_eq!(token, "a:0"),
            other => panic!("expected Conflict for a:0, got {other:?}"),
        }
        assert_eq!(
            s.tokens.token(&token_id("new", 0)).await,
            Ok(None),
            "the new token of a refused batch must not be written"
        );
    }
    let kept = s
        .tokens
        .token(&token_id("a", 0))
        .await
        .expect("token")
        .expect("a:0");
    assert_eq!(kept.quantity, amount(5), "the original token is unchanged");
    // Two different tokens under one id within one batch conflict too.
    let err = s
        .tokens
        .add_tokens(&[chf("w", "d", 0, 1), chf("w", "d", 0, 2)])
        .await
        .expect_err("duplicate id with different amounts in one batch");
    assert!(matches!(err, TokenStoreError::Conflict { .. }), "{err:?}");
    assert_eq!(s.tokens.token(&token_id("d", 0)).await, Ok(None));
}

/// `set_spendable` reports whether an unspent token was found.
pub async fn set_spendable_reports_missing_and_spent(db: &dyn TestDatabase) {
    let s = db.stores();
    add(&s, &[chf("w", "a", 0, 5), chf("w", "a", 1, 6)]).await;
    assert_eq!(
        s.tokens.set_spendable(&token_id("a", 0), false).await,
        Ok(true)
    );
    let t = s
        .tokens
        .token(&token_id("a", 0))
        .await
        .expect("token")
        .expect("a:0");
    assert!(!t.spendable, "the flag was written");
    assert_eq!(
        s.tokens.set_spendable(&token_id("a", 0), true).await,
        Ok(true)
    );
    assert_eq!(
        s.tokens.set_spendable(&token_id("nope", 0), true).await,
        Ok(false)
    );
    let c = tx("spender");
    assert_eq!(
        s.locks.claim(&c, &token_id("a", 1), T0).await,
        Ok(holdfast_domain::ClaimVerdict::Won)
    );
    s.locks.spend_consumer(&c, T0, true).await.expect("spend");
    assert_eq!(
        s.tokens.set_spendable(&token_id("a", 1), false).await,
        Ok(false),
        "a spent token is not an unspent token"
    );
}

/// Candidates come in ascending amount, and exclude locked, spent, non-spendable
/// tokens and tokens of other wallets or types.
pub async fn candidates_ascending_excluding_locked_spent_unspendable(db: &dyn TestDatabase) {
    let s = db.stores();
    let mut eur = chf("w", "eur", 0, 1);
    eur.token_type = token_type("EUR");
    add(
        &s,
        &[
            chf("w", "a", 0, 50),
            chf("w", "a", 1, 10),
            chf("w", "a", 2, 30),
            chf("w", "a", 3, 20),
            chf("w", "a", 4, 40),
            chf("w", "locked", 0, 15),
            chf("w", "spent", 0, 16),
            chf("w", "off", 0, 17),
            chf("other", "o", 0, 1),
            eur,
        ],
    )
    .await;
    let holder = tx("holder");
    let t0 = T0;
    assert_eq!(
        s.locks.claim(&holder, &token_id("locked", 0), t0).await,
        Ok(holdfast_domain::ClaimVerdict::Won)
    );
    let spender = tx("spender");
    s.locks
        .claim(&spender, &token_id("spent", 0), t0)
        .await
        .expect("claim");
    s.locks
        .spend_consumer(&spender, t0, true)
        .await
        .expect("spend");
    s.tokens
        .set_spendable(&token_id("off", 0), false)
        .await
        .expect("set_spendable");

    let got = all_candidates(&s, "w", 100).await;
    let want: Vec<(TokenId, Quantity)> = [(1, 10), (3, 20), (2, 30), (4, 40), (0, 50)]
        .into_iter()
        .map(|(i, v)| (token_id("a", i), amount(v)))
        .collect();
    let got: Vec<(TokenId, Quantity)> = got.into_iter().map(|c| (c.id, c.quantity)).collect();
    assert_eq!(
        got, want,
        "ascending, without locked/spent/unspendable/foreign tokens"
    );

    s.locks
        .release_consumer(&holder, T0, true)
        .await
        .expect("release");
    let again = ids(&all_candidates(&s, "w", 100).await);
    assert!(
        again.contains(&token_id("locked", 0)),
        "a released token is a candidate again"
    );
}

/// A band read: the cover band (amount >= threshold, ascending, at most `cover`),
/// then the fill band (amount < threshold, descending, at most `fill`), both
/// without locked, spent or non-spendable tokens; further fill pages continue
/// strictly before the cursor and return every smaller candidate exactly once.
pub async fn candidate_bands_split_at_the_threshold(db: &dyn TestDatabase) {
    let s = db.stores();
    let mut batch: Vec<NewToken> = [(0, 5), (1, 10), (2, 10), (3, 12), (4, 30), (5, 9)]
        .into_iter()
        .map(|(i, v)| chf("w", "a", i, v))
        .collect();
    for i in 0..7u32 {
        // Small amounts with a run of equal ones: 1, 2, 2, 2, 3, 4, 4.
        batch.push(chf(
            "w",
            &format!("s{i}"),
            0,
            [1, 2, 2, 2, 3, 4, 4][i as usize],
        ));
    }
    batch.push(chf("w", "locked", 0, 11));
    batch.push(chf("w", "off", 0, 8));
    batch.push(chf("other", "o", 0, 10));
    add(&s, &batch).await;
    assert_eq!(
        s.locks
            .claim(&tx("holder"), &token_id("locked", 0), T0)
            .await,
        Ok(holdfast_domain::ClaimVerdict::Won)
    );
    s.tokens
        .set_spendable(&token_id("off", 0), false)
        .await
        .expect("set_spendable");
    let query = |cover: usize, fill: usize, fill_before| BandQuery {
        wallet: wallet("w"),
        token_type: token_type("CHF"),
        threshold: amount(10),
        cover,
        fill,
        fill_before,
        fill_unless_cover_at_most: None,
    };
    let read = |q: BandQuery| {
        let tokens = s.tokens.clone();
        async move {
            tokens
                .candidate_bands(&q)
                .await
                .unwrap_or_else(|e| panic!("conformance: candidate_bands failed: {e}"))
        }
    };
    let got = read(query(3, 2, None)).await;
    let amounts: Vec<u128> = got.iter().map(|c| c.quantity.value()).collect();
    assert_eq!(
        amounts,
        [10, 10, 12, 9, 5],
        "cover band ascending (3 of 4), then fill band descending (2), no locked or unspendable"
    );
    assert_eq!(
        ids(&got)[..2],
        [token_id("a", 1), token_id("a", 2)],
        "equal amounts in id order"
    );
    // Page the fill band to its end, two at a time.
    let mut fill: Vec<holdfast_domain::Candidate> = got[3..].to_vec();
    loop {
        let page = read(query(0, 2, fill.last().cloned())).await;
        assert!(page.iter().all(|c| c.quantity < amount(10)), "{page:?}");
        let done = page.len() < 2;
        fill.extend(page);
        if done {
            break;
        }
    }
    let amounts: Vec<u128> = fill.iter().map(|c| c.quantity.value()).collect();
    assert_eq!(
        amounts,
        [9, 5, 4, 4, 3, 2, 2, 2, 1],
        "every fill candidate once"
    );
    for pair in fill.windows(2) {
        let key = |c: &holdfast_domain::Candidate| (c.quantity, c.id.clone());
        assert!(
            key(&pair[0]) > key(&pair[1]),
            "strictly descending: {pair:?}"
        );
    }
    let further: Vec<u128> = read(query(3, 2, Some(fill[1].clone())))
        .await
        .iter()
        .map(|c| c.quantity.value())
        .collect();
    assert_eq!(further, [4, 4], "a further fill page reads no cover band");
    let cover_only: Vec<u128> = read(query(3, 0, None))
        .await
        .iter()
        .map(|c| c.quantity.value())
        .collect();
    assert_eq!(cover_only, [10, 10, 12], "no fill band asked, none read");
    assert_eq!(
        read(query(0, 0, None)).await,
        Vec::new(),
        "nothing asked, nothing read"
    );
    // The fill band may be left out when the smallest cover is at most the
    // bound, never when it is larger.
    let bounded = |at_most: u128| BandQuery {
        fill_unless_cover_at_most: Some(amount(at_most)),
        ..query(3, 2, None)
    };
    let amounts = |got: Vec<holdfast_domain::Candidate>| -> Vec<u128> {
        got.iter().map(|c| c.quantity.value()).collect()
    };
    let within = amounts(read(bounded(10)).await);
    assert!(
        within == [10, 10, 12] || within == [10, 10, 12, 9, 5],
        "cover band, with or without the fill band: {within:?}"
    );
    assert_eq!(
        amounts(read(bounded(9)).await),
        [10, 10, 12, 9, 5],
        "a smallest cover above the bound: the fill band is read"
    );
}

/// Equal amounts are equal exactly (one encoding per value): tokens of one amount
/// come together, ordered by token id, before any larger amount.
pub async fn candidates_equal_amounts_compare_exactly(db: &dyn TestDatabase) {
    let s = db.stores();
    let big = (1u128 << 64) + 7;
    add(
        &s,
        &[
            chf("w", "c", 0, big + 1),
            chf("w", "b", 0, big),
            chf("w", "a", 0, big),
            chf("w", "d", 0, big - 1),
            chf("w", "a", 1, big),
        ],
    )
    .await;
    let got = all_candidates(&s, "w", 100).await;
    let want = vec![
        token_id("d", 0),
        token_id("a", 0),
        token_id("a", 1),
        token_id("b", 0),
        token_id("c", 0),
    ];
    assert_eq!(ids(&got), want, "ordered by (amount, tx, index)");
    assert_eq!(got[1].quantity, got[2].quantity);
    assert_eq!(got[2].quantity, got[3].quantity);
    assert_eq!(got[1].quantity, amount(big));
}

/// Keyset paging returns every candidate exactly once, in order, for every page
/// size, including page boundaries that fall inside a run of equal amounts.
pub async fn candidates_keyset_paging_is_exact(db: &dyn TestDatabase) {
    let s = db.stores();
    let mut batch: Vec<NewToken> = Vec::new();
    for i in 0..30u32 {
        // Amounts 1,2,3 repeating: long runs of equal amounts across pages.
        batch.push(chf(
            "w",
            &format!("t{:02}", 29 - i),
            i % 4,
            u128::from(i % 3) + 1,
        ));
    }
    add(&s, &batch).await;
    let whole = all_candidates(&s, "w", 1000).await;
    assert_eq!(whole.len(), 30, "all 30 tokens are candidates");
    for pair in whole.windows(2) {
        let key = |c: &holdfast_domain::Candidate| (c.quantity, c.id.clone());
        assert!(
            key(&pair[0]) < key(&pair[1]),
            "strictly ascending (amount, id): {pair:?}"
        );
    }
    for page in [1usize, 2, 3, 4, 7, 10, 29, 30, 31] {
        let paged = all_candidates(&s, "w", page).await;
        assert_eq!(ids(&paged), ids(&whole), "page size {page}");
    }
    // A cursor at a token that is itself gone (locked meanwhile) still works.
    let cursor = whole[4].clone();
    s.locks
        .claim(&tx("x"), &cursor.id, T0)
        .await
        .expect("claim");
    let rest = s
        .tokens
        .candidates(&CandidateQuery {
            wallet: wallet("w"),
            token_type: token_type("CHF"),
            after: Some(cursor),
            limit: 100,
        })
        .await
        .expect("candidates");
    assert_eq!(ids(&rest), ids(&whole[5..]));
    let none = s
        .tokens
        .candidates(&CandidateQuery {
            wallet: wallet("w"),
            token_type: token_type("CHF"),
            after: None,
            limit: 0,
        })
        .await
        .expect("candidates");
    assert!(none.is_empty(), "limit 0 returns nothing");
}

/// Amounts beyond 2^64, up to 2^128 - 1, round-trip exactly and order numerically.
pub async fn amounts_beyond_u64_round_trip_and_order(db: &dyn TestDatabase) {
    let s = db.stores();
    let mut values = vec![
        1u128 << 64,
        u128::from(u64::MAX),
        (1u128 << 64) + 1,
        1u128 << 100,
        0x10,
        0xf,
        1,
        1u128 << 126,
    ];
    // The largest fills the wallet to exactly 2^128 - 1 (a wallet may hold no more).
    let rest: u128 = values.iter().sum();
    values.push(u128::MAX - rest);
    let batch: Vec<NewToken> = values
        .iter()
        .enumerate()
        .map(|(i, v)| chf("w", "big", u32::try_from(i).unwrap_or(u32::MAX), *v))
        .collect();
    add(&s, &batch).await;
    // 2^128 - 1 and 2^128 - 2 each in a wallet of its own.
    add(
        &s,
        &[
            chf("max", "max", 0, u128::MAX),
            chf("max-1", "max", 1, u128::MAX - 1),
        ],
    )
    .await;
    let stored = values
        .iter()
        .enumerate()
        .map(|(i, v)| (token_id("big", u32::try_from(i).unwrap_or(u32::MAX)), *v))
        .chain([
            (token_id("max", 0), u128::MAX),
            (token_id("max", 1), u128::MAX - 1),
        ]);
    for (id, v) in stored {
        let t = s
            .tokens
            .token(&id)
            .await
            .expect("token")
            .expect("stored token");
        assert_eq!(t.quantity, amount(v), "round trip of {v}");
    }
    assert_eq!(
        s.tokens.balance(&wallet("w"), &token_type("CHF")).await,
        Ok(amount(u128::MAX)),
        "a wallet holding exactly 2^128 - 1"
    );
    let got: Vec<u128> = all_candidates(&s, "w", 4)
        .await
        .iter()
        .map(|c| c.quantity.value())
        .collect();
    let mut want = values.to_vec();
    want.sort_unstable();
    assert_eq!(got, want, "numeric order, not text or float order");
    add(
        &s,
        &[
            chf("sum", "s", 0, 1u128 << 64),
            chf("sum", "s", 1, 1u128 << 64),
        ],
    )
    .await;
    assert_eq!(
        s.tokens.balance(&wallet("sum"), &token_type("CHF")).await,
        Ok(amount(1u128 << 65)),
        "balances beyond 2^64 are exact"
    );
}

/// Asserts that `result` refuses an add as [`TokenStoreError::BalanceOverflow`] of
/// `wallet_id`/`CHF`.
fn assert_overflow(result: Result<u64, TokenStoreError>, wallet_id: &str, what: &str) {
    match result {
        Err(TokenStoreError::BalanceOverflow {
            wallet: w,
            token_type: t,
        }) => {
            assert_eq!((w, t), (wallet(wallet_id), token_type("CHF")), "{what}");
        }
        other => panic!("{what}: expected BalanceOverflow of {wallet_id}/CHF, got {other:?}"),
    }
}

/// A wallet's unspent total of a type, spendable or not, cannot pass 2^128 - 1:
/// an add beyond it, in a later call, is refused as a balance overflow naming the
/// wallet and type, and writes nothing (not even its tokens for other wallets);
/// the balance still reads 2^128 - 1. Other types and wallets, a re-add of what
/// is stored, and adds after the total shrank (a spend) are unaffected.
pub async fn a_balance_cannot_overflow_across_adds(db: &dyn TestDatabase) {
    let s = db.stores();
    let chf_t = token_type("CHF");
    add(&s, &[chf("w", "a", 0, u128::MAX)]).await;
    let mut off = chf("w", "off", 0, 1);
    off.spendable = false;
    let refused = [
        ("a second 2^128 - 1", vec![chf("w", "b", 0, u128::MAX)]),
        ("one more unit", vec![chf("w", "b", 0, 1)]),
        ("an unspendable unit", vec![off]),
        (
            "a batch also paying another wallet",
            vec![chf("v", "b", 0, 7), chf("w", "b", 1, 1)],
        ),
    ];
    for (what, batch) in refused {
        assert_overflow(s.tokens.add_tokens(&batch).await, "w", what);
        for t in &batch {
            assert_eq!(
                s.tokens.token(&t.id).await,
                Ok(None),
                "{what}: {} written",
                t.id
            );
        }
        assert_eq!(
            s.tokens.balance(&wallet("w"), &chf_t).await,
            Ok(amount(u128::MAX)),
            "{what}: the balance still reads 2^128 - 1"
        );
    }
    assert_eq!(
        s.tokens.balance(&wallet("v"), &chf_t).await,
        Ok(Quantity::ZERO)
    );
    let unspendable = s.tokens.set_spendable(&token_id("a", 0), false).await;
    assert_eq!(unspendable, Ok(true));
    assert_overflow(
        s.tokens.add_tokens(&[chf("w", "b", 0, 1)]).await,
        "w",
        "an unspendable 2^128 - 1 counts too",
    );
    assert_eq!(
        s.tokens.set_spendable(&token_id("a", 0), true).await,
        Ok(true)
    );
    assert_eq!(
        s.tokens.add_tokens(&[chf("w", "a", 0, u128::MAX)]).await,
        Ok(0),
        "re-adding the stored token adds nothing and is no overflow"
    );
    let mut eur = chf("w", "eur", 0, u128::MAX);
    eur.token_type = token_type("EUR");
    add(&s, &[eur, chf("v", "v", 0, u128::MAX)]).await;
    let spender = tx("spender");
    let won = s.locks.claim(&spender, &token_id("a", 0), T0).await;
    assert_eq!(won, Ok(holdfast_domain::ClaimVerdict::Won));
    s.locks
        .spend_consumer(&spender, T0, true)
        .await
        .expect("spend");
    add(&s, &[chf("w", "c", 0, u128::MAX)]).await;
    assert_eq!(
        s.tokens.balance(&wallet("w"), &chf_t).await,
        Ok(amount(u128::MAX)),
        "a spent token no longer counts"
    );
}

/// Within one batch too: two tokens of 2^128 - 1 for one wallet are refused and
/// neither is written; a batch reaching exactly 2^128 - 1 is accepted, a token
/// named twice in it counting once.
pub async fn a_batch_cannot_overflow_a_balance(db: &dyn TestDatabase) {
    let s = db.stores();
    let chf_t = token_type("CHF");
    let batch = [chf("w", "a", 0, u128::MAX), chf("w", "a", 1, u128::MAX)];
    assert_overflow(s.tokens.add_tokens(&batch).await, "w", "two of 2^128 - 1");
    for t in &batch {
        assert_eq!(s.tokens.token(&t.id).await, Ok(None), "{} written", t.id);
    }
    assert_eq!(
        s.tokens.balance(&wallet("w"), &chf_t).await,
        Ok(Quantity::ZERO)
    );
    let exact = [
        chf("w", "b", 0, u128::MAX - 1),
        chf("w", "b", 1, 1),
        chf("w", "b", 1, 1),
    ];
    assert_eq!(
        s.tokens.add_tokens(&exact).await,
        Ok(2),
        "exactly 2^128 - 1"
    );
    assert_eq!(
        s.tokens.balance(&wallet("w"), &chf_t).await,
        Ok(amount(u128::MAX))
    );
}

/// 16 concurrent adds on three instances, each of one token of 2^126 to one
/// wallet: exactly three fit below 2^128, so exactly three are added and the
/// others refused as a balance overflow, whatever their interleaving.
pub async fn concurrent_adds_cannot_overflow_a_balance(db: &dyn TestDatabase) {
    let mut instances = vec![db.stores()];
    for _ in 0..2 {
        match db.replica().await {
            Ok(s) => instances.push(s),
            Err(e) => panic!("conformance: could not open a replica: {e}"),
        }
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(16));
    let mut tasks = Vec::new();
    for i in 0..16u32 {
        let s = instances[usize::try_from(i).unwrap_or(0) % instances.len()].clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let added = s.tokens.add_tokens(&[chf("w", "q", i, 1u128 << 126)]).await;
            (i, added)
        }));
    }
    let mut added = Vec::new();
    for task in tasks {
        let (i, result) = task.await.expect("add task panicked");
        match result {
            Ok(1) => added.push(i),
            Err(TokenStoreError::BalanceOverflow { .. }) => {}
            other => panic!("add {i}: expected Ok(1) or BalanceOverflow, got {other:?}"),
        }
    }
    assert_eq!(
        added.len(),
        3,
        "three quarters of 2^128 fit, added: {added:?}"
    );
    assert_eq!(
        instances[1]
            .tokens
            .balance(&wallet("w"), &token_type("CHF"))
            .await,
        Ok(amount(3u128 << 126))
    );
}

/// The balance counts locked tokens but not spent or non-spendable ones;
/// `balance_for` also leaves out what the consumer itself selected.
pub async fn balance_ignores_locks_excludes_spent_and_unspendable(db: &dyn TestDatabase) {
    let s = db.stores();
    let chf_t = token_type("CHF");
    assert_eq!(
        s.tokens.balance(&wallet("w"), &chf_t).await,
        Ok(Quantity::ZERO),
        "empty wallet"
    );
    let mut eur = chf("w", "eur", 0, 1000);
    eur.token_type = token_type("EUR");
    let mut off = chf("w", "off", 0, 2000);
    off.spendable = false;
    add(
        &s,
        &[
            chf("w", "a", 0, 1),
            chf("w", "a", 1, 10),
            chf("w", "a", 2, 100),
            chf("other", "o", 0, 5000),
            eur,
            off,
        ],
    )
    .await;
    assert_eq!(
        s.tokens.balance(&wallet("w"), &chf_t).await,
        Ok(amount(111))
    );
    s.locks
        .claim(&tx("l"), &token_id("a", 2), T0)
        .await
        .expect("claim");
    assert_eq!(
        s.tokens.balance(&wallet("w"), &chf_t).await,
        Ok(amount(111)),
        "a locked token still counts"
    );
    assert_eq!(
        s.tokens
            .balance_for(&wallet("w"), &chf_t, &tx("other"))
            .await,
        Ok(amount(111)),
        "another transaction's lock still counts for a consumer"
    );
    assert_eq!(
        s.tokens.balance_for(&wallet("w"), &chf_t, &tx("l")).await,
        Ok(amount(11)),
        "but not for the consumer that selected it"
    );
    s.locks
        .claim(&tx("sp"), &token_id("a", 1), T0)
        .await
        .expect("claim");
    s.locks
        .spend_consumer(&tx("sp"), T0, true)
        .await
        .expect("spend");
    assert_eq!(
        s.tokens.balance(&wallet("w"), &chf_t).await,
        Ok(amount(101)),
        "a spent token does not count"
    );
    s.tokens
        .set_spendable(&token_id("a", 0), false)
        .await
        .expect("set");
    assert_eq!(
        s.tokens.balance(&wallet("w"), &chf_t).await,
        Ok(amount(100))
    );
    assert_eq!(
        s.tokens.balance(&wallet("w"), &token_type("EUR")).await,
        Ok(amount(1000))
    );
}

/// `list_tokens` returns unspent tokens, spendable or not, in one ascending order
/// (amount, then id), filtered by type, limited.
pub async fn list_tokens_filters_orders_and_limits(db: &dyn TestDatabase) {
    let s = db.stores();
    let mut eur = chf("w", "eur", 0, 2);
    eur.token_type = token_type("EUR");
    // Not spendable: between spendable ones, and tied in amount with eur:0 and
    // d:0 (ties go by id, whichever is spendable).
    let [mut n, mut b, mut off] = [
        chf("w", "n", 0, 2),
        chf("w", "b", 0, 3),
        chf("w", "off", 0, 4),
    ];
    for token in [&mut n, &mut b, &mut off] {
        token.spendable = false;
    }
    add(
        &s,
        &[
            chf("w", "d", 0, 3),
            chf("w", "a", 1, 1),
            eur,
            n,
            b,
            off,
            chf("w", "sp", 0, 5),
        ],
    )
    .await;
    s.locks
        .claim(&tx("c"), &token_id("sp", 0), T0)
        .await
        .expect("claim");
    s.locks
        .spend_consumer(&tx("c"), T0, true)
        .await
        .expect("spend");
    let all = s
        .tokens
        .list_tokens(&wallet("w"), None, 100)
        .await
        .expect("list");
    let got: Vec<(TokenId, u128)> = all
        .iter()
        .map(|t| (t.id.clone(), t.quantity.value()))
        .collect();
    assert_eq!(
        got,
        vec![
            (token_id("a", 1), 1),
            (token_id("eur", 0), 2),
            (token_id("n", 0), 2),
            (token_id("b", 0), 3),
            (token_id("d", 0), 3),
            (token_id("off", 0), 4),
        ],
        "unspent tokens of all types (non-spendable included), ascending"
    );
    let chf_first = [
        token_id("a", 1),
        token_id("n", 0),
        token_id("b", 0),
        token_id("d", 0),
        token_id("off", 0),
    ];
    for n in [2, 3, 4] {
        let expected = chf_first[..n].to_vec();
        let chf_only = s
            .tokens
            .list_tokens(&wallet("w"), Some(token_type("CHF")), n)
            .await
            .expect("list");
        let got: Vec<TokenId> = chf_only.iter().map(|t| t.id.clone()).collect();
        assert_eq!(got, expected, "the first {n} CHF tokens");
    }
    let first = s
        .tokens
        .list_tokens(&wallet("w"), None, 1)
        .await
        .expect("list");
    assert_eq!(first.len(), 1, "at most the limit");
    assert_eq!(first[0].id, token_id("a", 1));
    let spent = s
        .tokens
        .token(&token_id("sp", 0))
        .await
        .expect("token")
        .expect("sp:0");
    assert_eq!(spent.spent_by, Some(tx("c")));
    assert_eq!(spent.spent_at, Some(T0));
}
