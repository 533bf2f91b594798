//! Checks that user-supplied strings are data, never SQL: injection attempts, quotes,
//! backslashes, LIKE wildcards and unusual unicode in every identifier an adapter
//! stores are written literally, read back byte for byte, match only themselves,
//! and leave every table working.

use std::collections::{BTreeMap, BTreeSet};

use holdfast_domain::{
    ClaimVerdict, LastGreen, Queue, QueueName, RevisionUri, Slot, Timestamp, TokenId, TokenType,
    TxId, TxStatus, WalletId,
};

use super::TestDatabase;
use super::support::{add, all_candidates, amount, at, chf, token_id, tx, wallet};
use crate::{CandidateQuery, CasOutcome, NewToken};

/// Hostile identifiers: each is valid (non-empty, at most 256 bytes, no control
/// characters), so validation lets it through and only the adapter stands between
/// it and the database. [`hostile`] adds one of 256 single quotes.
pub const HOSTILE: &[&str] = &[
    "x'); DROP TABLE tokens; --",
    "x\"); DROP TABLE locks; --",
    "'; DELETE FROM tx_statuses WHERE '1'='1",
    "' OR '1'='1",
    "\" OR \"\"=\"",
    "Robert'); DROP TABLE requests;--",
    "$$; DROP TABLE queues; $$",
    "$1",
    "?1",
    ":name",
    "/* comment */",
    "-- comment",
    "\\",
    "\\'",
    "back\\slash\\'quote",
    "E'\\x41'",
    "%",
    "_",
    "%%",
    "w%",
    "_w",
    "[a-z]*",
    "ünïcødé 🔒 ключ 鍵",
    "\u{202e}rtl-override",
    "zero\u{200b}width\u{feff}",
    "e\u{301}",
];

/// [`HOSTILE`] and a maximal run of quotes (256 bytes, the longest id accepted).
pub fn hostile() -> Vec<String> {
    let mut all: Vec<String> = HOSTILE.iter().map(|s| (*s).to_owned()).collect();
    all.push("'".repeat(holdfast_domain::ids::MAX_ID_LEN));
    all
}

fn valid<T, E: std::fmt::Display>(kind: &str, text: &str, r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("conformance: hostile {kind} {text:?} must be a valid id: {e}"))
}

/// Every hostile string as wallet, token type and creating tx id of its own token,
/// as consumer tx id of a lock, as a status's tx id, and as queue name and uri of
/// a request: each is stored and read back exactly, matches only itself (a `%`
/// wallet lists one token, a `%` consumer releases one lock), and the ordinary
/// rows written first are untouched at the end.
pub async fn hostile_strings_are_stored_literally(db: &dyn TestDatabase) {
    let s = db.stores();
    // Ordinary rows first: they must survive everything below.
    add(&s, &[chf("w", "ordinary", 0, 5)]).await;
    s.statuses
        .record_status(&tx("ordinary"), TxStatus::Pending, at(1))
        .await
        .expect("record ordinary status");
    let ordinary_queue = QueueName::new("ordinary").expect("queue");
    let ordinary_uri = RevisionUri::new("git:ordinary").expect("uri");
    s.queues
        .create_request(&ordinary_queue, &ordinary_uri)
        .await
        .expect("create ordinary request");

    let hostile = hostile();
    let mut tokens = Vec::new();
    for (i, text) in hostile.iter().enumerate() {
        let n = u128::try_from(i).expect("index") + 10;
        tokens.push(NewToken {
            id: TokenId::new(valid("tx id", text, TxId::new(text.as_str())), 0),
            wallet: valid("wallet", text, WalletId::new(text.as_str())),
            token_type: valid("token type", text, TokenType::new(text.as_str())),
            quantity: amount(n),
            spendable: true,
        });
    }
    let added = s
        .tokens
        .add_tokens(&tokens)
        .await
        .expect("add hostile tokens");
    assert_eq!(added, u64::try_from(hostile.len()).expect("count"));

    for t in &tokens {
        let stored = s.tokens.token(&t.id).await.expect("read token");
        let stored = stored.unwrap_or_else(|| panic!("token {} not found", t.id));
        assert_eq!(stored.id, t.id, "tx id read back");
        assert_eq!(stored.wallet, t.wallet, "wallet read back");
        assert_eq!(stored.token_type, t.token_type, "token type read back");
        assert_eq!(stored.quantity, t.quantity, "amount of {}", t.id);
        let listed = s
            .tokens
            .list_tokens(&t.wallet, None, 100)
            .await
            .expect("list tokens");
        assert_eq!(
            listed.iter().map(|x| &x.id).collect::<Vec<_>>(),
            vec![&t.id],
            "wallet {:?} lists exactly its own token",
            t.wallet.as_str()
        );
        let page = s
            .tokens
            .candidates(&CandidateQuery {
                wallet: t.wallet.clone(),
                token_type: t.token_type.clone(),
                after: None,
                limit: 100,
            })
            .await
            .expect("candidates");
        assert_eq!(
            page.iter().map(|c| &c.id).collect::<Vec<_>>(),
            vec![&t.id],
            "candidates of wallet {:?}",
            t.wallet.as_str()
        );
        assert_eq!(
            s.tokens.balance(&t.wallet, &t.token_type).await,
            Ok(t.quantity),
            "balance of wallet {:?}",
            t.wallet.as_str()
        );
    }

    // Each hostile consumer locks its own token; the verdicts, the lock list and
    // a status recorded under the same id read back exactly.
    for t in &tokens {
        let consumer = t.id.tx.clone();
        assert_eq!(
            s.locks.claim(&consumer, &t.id, at(2)).await,
            Ok(ClaimVerdict::Won),
            "claim by {:?}",
            consumer.as_str()
        );
        s.statuses
            .record_status(&consumer, TxStatus::Busy, at(3))
            .await
            .expect("record hostile status");
        assert_eq!(s.statuses.status(&consumer).await, Ok(Some(TxStatus::Busy)));
    }
    let locks = s.locks.list_locks().await.expect("list locks");
    let listed: BTreeSet<(TokenId, TxId)> = locks
        .iter()
        .map(|l| (l.token.clone(), l.consumer.clone()))
        .collect();
    let expected: BTreeSet<(TokenId, TxId)> = tokens
        .iter()
        .map(|t| (t.id.clone(), t.id.tx.clone()))
        .collect();
    assert_eq!(listed, expected, "every lock names its consumer exactly");
    for lock in &locks {
        assert_eq!(lock.consumer_status, Some(TxStatus::Busy), "{}", lock.token);
    }
    // A wildcard consumer releases its own lock only.
    for wildcard in ["%", "_", "%%"] {
        assert_eq!(
            s.locks
                .release_consumer(
                    &tx(wildcard),
                    holdfast_domain::Timestamp::from_millis(0),
                    true
                )
                .await,
            Ok(1),
            "release by {wildcard:?}"
        );
    }
    assert_eq!(
        s.locks.list_locks().await.expect("list locks").len(),
        hostile.len() - 3
    );

    // Queues and requests: hostile queue names and uris.
    for text in &hostile {
        let queue = valid("queue", text, QueueName::new(text.as_str()));
        let uri = valid("uri", text, RevisionUri::new(text.as_str()));
        let ingested = s
            .queues
            .create_request(&queue, &uri)
            .await
            .expect("create hostile request");
        assert!(ingested.created, "queue {text:?}");
        assert_eq!(ingested.request.uri, uri);
        assert_eq!(ingested.request.id.queue(), &queue);
        let id = ingested.request.id.clone();
        let loaded = s.queues.load_request(&id).await.expect("load request");
        assert_eq!(loaded.as_ref(), Some(&ingested.request), "request {id}");
        let again = s
            .queues
            .create_request(&queue, &uri)
            .await
            .expect("dedup hostile request");
        assert!(!again.created, "dedup on queue {text:?} and uri");
        let listed = s.queues.list_requests(&queue, 10).await.expect("list");
        assert_eq!(listed, vec![ingested.request.clone()], "queue {text:?}");
        let stored = s
            .queues
            .load_queue(&queue)
            .await
            .expect("load queue")
            .unwrap_or_else(|| panic!("queue {text:?} missing"));
        assert_eq!(stored.name, queue);
        let owned = Queue {
            owners: BTreeMap::from([(
                id.clone(),
                Slot::claimed(Timestamp::from_millis(1_700_000_000_123)),
            )]),
            last_green: Some(LastGreen {
                uri: uri.clone(),
                request_id: id.clone(),
            }),
            latest_request_id: Some(id.clone()),
            ..stored.clone()
        };
        assert_eq!(
            s.queues.cas_queue(stored.version, &owned).await,
            Ok(CasOutcome::Applied)
        );
        let reread = s.queues.load_queue(&queue).await.expect("reload queue");
        assert_eq!(
            reread,
            Some(Queue {
                version: stored.version.next(),
                ..owned
            }),
            "queue {text:?} read back"
        );
    }

    // The ordinary rows are intact and every table still works.
    assert_eq!(
        all_candidates(&s, "w", 10).await.len(),
        1,
        "the ordinary token is still a candidate"
    );
    assert_eq!(
        s.tokens
            .balance(&wallet("w"), &super::support::token_type("CHF"))
            .await,
        Ok(amount(5))
    );
    assert_eq!(
        s.locks
            .claim(&tx("ordinary-consumer"), &token_id("ordinary", 0), at(4))
            .await,
        Ok(ClaimVerdict::Won)
    );
    assert_eq!(
        s.statuses.status(&tx("ordinary")).await,
        Ok(Some(TxStatus::Pending))
    );
    let ordinary = s
        .queues
        .list_requests(&ordinary_queue, 10)
        .await
        .expect("list ordinary requests");
    assert_eq!(ordinary.len(), 1);
    assert_eq!(ordinary[0].uri, ordinary_uri);
    let spent = s
        .locks
        .spend_consumer(&tx("ordinary-consumer"), at(5), true)
        .await
        .expect("spend");
    assert_eq!(spent, vec![token_id("ordinary", 0)]);
}
