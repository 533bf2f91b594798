//! The services on a real SQLite backend: concurrent selects across three replicas
//! of one database file, settlement, the lease sweep and the admission happy path.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use holdfast::{Settlement, SystemClock, TokenSelector, sweep_once};
use holdfast_adapters_sqlite::{SqliteBackend, SqliteOptions};
use holdfast_domain::{
    BuildOutcome, BuildStrategy, LeaseConfig, PersistPolicy, Precision, Quantity, QueueName, Reply,
    RequestState, RevisionUri, SelectionConfig, SettlementStatus, Timestamp, TokenId, TokenType,
    TxId, TxStatus, WalletId,
};
use holdfast_ports::{Clock, NewToken, Stores};

use crate::common::{self, TempDb};

/// A clock fixed at a time, for the sweep.
struct At(Timestamp);

impl Clock for At {
    fn now(&self) -> Timestamp {
        self.0
    }
}

fn q(v: u128) -> Quantity {
    Quantity::new(v, Precision::MAX).expect("quantity")
}

fn wallet() -> WalletId {
    WalletId::new("alice").expect("wallet")
}

fn chf() -> TokenType {
    TokenType::new("CHF").expect("type")
}

fn tx(id: &str) -> TxId {
    TxId::new(id).expect("tx")
}

async fn fund(stores: &Stores, n: u32, amount: u128) {
    let tokens: Vec<NewToken> = (0..n)
        .map(|i| NewToken {
            id: TokenId::new(tx("funding"), i),
            wallet: wallet(),
            token_type: chf(),
            quantity: q(amount),
            spendable: true,
        })
        .collect();
    assert_eq!(
        stores.tokens.add_tokens(&tokens).await.expect("funded"),
        u64::from(n)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_selects_on_three_replicas_then_settle_and_sweep() {
    let db = TempDb::new("select");
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let backend = SqliteBackend::open(&db.url(), SqliteOptions::default())
            .await
            .expect("open");
        replicas.push(backend.stores());
    }
    fund(&replicas[0], 96, 10).await;
    let config = SelectionConfig {
        retry_interval: Duration::from_millis(20),
        max_retries: 100,
        ..SelectionConfig::default()
    };
    let selectors: Vec<Arc<TokenSelector>> = replicas
        .iter()
        .zip(1u64..)
        .map(|(stores, seed)| {
            Arc::new(
                TokenSelector::new(
                    stores.clone(),
                    Arc::new(SystemClock),
                    config.clone(),
                    Some(seed),
                )
                .expect("config"),
            )
        })
        .collect();

    let mut tasks = Vec::new();
    for i in 0..32usize {
        let selector = selectors[i % 3].clone();
        tasks.push(tokio::spawn(async move {
            let consumer = tx(&format!("spend-{i}"));
            let report = selector
                .select_with_stats(&wallet(), &chf(), q(15), &consumer)
                .await;
            (consumer, report)
        }));
    }
    let mut held: BTreeMap<TokenId, TxId> = BTreeMap::new();
    let mut by_consumer: BTreeMap<TxId, Vec<TokenId>> = BTreeMap::new();
    for task in tasks {
        let (consumer, report) = task.await.expect("task");
        let selected = report.result.expect("enough funds for everyone");
        assert!(selected.total >= q(15));
        assert_eq!(
            selected.change,
            selected.total.checked_sub(q(15)).expect("change")
        );
        assert!(report.stats.round_trips() >= 1, "{:?}", report.stats);
        for token in &selected.tokens {
            let previous = held.insert(token.clone(), consumer.clone());
            assert_eq!(previous, None, "{token} selected twice");
        }
        by_consumer.insert(consumer, selected.tokens);
    }
    // The lock table holds exactly what the calls returned.
    let locks = replicas[1].locks.list_locks().await.expect("locks");
    let locked: BTreeMap<TokenId, TxId> =
        locks.into_iter().map(|l| (l.token, l.consumer)).collect();
    assert_eq!(locked, held);

    // Settle: even consumers confirmed (their tokens spent), odd ones deleted.
    let settlement = Settlement::new(
        replicas[2].clone(),
        Arc::new(SystemClock),
        PersistPolicy::default(),
    );
    let mut spent = 0u128;
    for (i, (consumer, tokens)) in by_consumer.iter().enumerate() {
        let status = if i % 2 == 0 {
            TxStatus::Confirmed
        } else {
            TxStatus::Deleted
        };
        let settled = settlement
            .on_status(consumer, SettlementStatus::Known(status))
            .await
            .expect("settled");
        if status == TxStatus::Confirmed {
            let got: BTreeSet<_> = settled.spent.iter().cloned().collect();
            let want: BTreeSet<_> = tokens.iter().cloned().collect();
            assert_eq!(got, want);
            spent += 10 * u128::try_from(tokens.len()).expect("small");
        } else {
            assert_eq!(
                settled.released,
                u64::try_from(tokens.len()).expect("small")
            );
        }
    }
    assert!(
        replicas[0]
            .locks
            .list_locks()
            .await
            .expect("locks")
            .is_empty()
    );
    let balance = replicas[0]
        .tokens
        .balance(&wallet(), &chf())
        .await
        .expect("balance");
    assert_eq!(balance, q(960 - spent));
    // Settling again is idempotent, and recovery finds nothing left to do.
    let (first, _) = by_consumer.iter().next().expect("a consumer");
    settlement
        .on_status(first, SettlementStatus::Known(TxStatus::Confirmed))
        .await
        .expect("again");
    assert_eq!(settlement.recover().await.expect("recover").settled, 0);

    // A lock nobody settles is swept once its lease has expired.
    let late = selectors[0]
        .select(&wallet(), &chf(), q(5), &tx("late"))
        .await
        .expect("late select");
    let lease = LeaseConfig::default();
    let now = SystemClock.now();
    let early = sweep_once(replicas[1].locks.as_ref(), &At(now), &lease)
        .await
        .expect("sweep");
    assert_eq!(early.expired, 0);
    let later = At(Timestamp::from_millis(now.as_millis() + 3_600_000));
    let report = sweep_once(replicas[1].locks.as_ref(), &later, &lease)
        .await
        .expect("sweep");
    assert_eq!(
        report.expired,
        u64::try_from(late.tokens.len()).expect("small")
    );
    assert!(
        replicas[2]
            .locks
            .list_locks()
            .await
            .expect("locks")
            .is_empty()
    );
}

#[tokio::test]
async fn admission_happy_path_with_supersede_redelivery_and_dead_letter() {
    let backend = SqliteBackend::open_in_memory().await.expect("open");
    let stores = backend.stores();
    let admission = common::admission(&stores);
    let queue = QueueName::new("monorepo/main").expect("queue");
    let uri = |u: &str| RevisionUri::new(u).expect("uri");

    let first = admission
        .ingest(&queue, &uri("rev-1"))
        .await
        .expect("ingest");
    assert!(first.created);
    assert_eq!(first.reply, Reply::Ack);
    let second = admission
        .ingest(&queue, &uri("rev-2"))
        .await
        .expect("ingest");
    let again = admission
        .ingest(&queue, &uri("rev-1"))
        .await
        .expect("dedup");
    assert!(!again.created);
    assert_eq!(again.request.id, first.request.id);

    // The older request is superseded on sight.
    let reply = admission.process(&first.request.id).await.expect("process");
    assert_eq!(reply, Reply::Ack);
    let state = |id| {
        let stores = stores.clone();
        async move {
            stores
                .queues
                .load_request(&id)
                .await
                .expect("load")
                .expect("exists")
                .state
        }
    };
    assert_eq!(
        state(first.request.id.clone()).await,
        RequestState::Superseded
    );

    // The head is admitted with a full build (no ancestry) as generation 1; a
    // redelivery while that build is live publishes nothing and claims no second
    // slot: it holds until the build's first heartbeat shows it was handed over,
    // then acks.
    match admission
        .process(&second.request.id)
        .await
        .expect("process")
    {
        Reply::Publish {
            request,
            plan,
            generation,
        } => {
            assert_eq!(request.id, second.request.id);
            assert_eq!(plan.strategy, BuildStrategy::Full);
            assert_eq!(generation, holdfast_domain::Generation(1));
        }
        other => panic!("expected publish, got {other:?}"),
    }
    assert!(matches!(
        admission
            .process(&second.request.id)
            .await
            .expect("process"),
        Reply::Hold { paused: false, .. }
    ));
    assert!(matches!(
        admission
            .heartbeat(&second.request.id, holdfast_domain::Generation(1))
            .await
            .expect("heartbeat"),
        holdfast_domain::Heartbeat::Extended { .. }
    ));
    assert_eq!(
        admission
            .process(&second.request.id)
            .await
            .expect("process"),
        Reply::Ack
    );
    let owners = |stores: Stores, queue: QueueName| async move {
        stores
            .queues
            .load_queue(&queue)
            .await
            .expect("load")
            .expect("queue")
            .owners
            .into_keys()
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(
        owners(stores.clone(), queue.clone()).await,
        BTreeSet::from([second.request.id.clone()])
    );

    // A third request waits while the slot is taken (max_concurrent = 1).
    let third = admission
        .ingest(&queue, &uri("rev-3"))
        .await
        .expect("ingest");
    assert!(matches!(
        admission.process(&third.request.id).await.expect("process"),
        Reply::Hold { .. }
    ));
    // The build of the second finishes: the slot is released, the state terminal.
    let reply = admission
        .outcome(&second.request.id, BuildOutcome::Succeeded)
        .await
        .expect("outcome");
    assert_eq!(reply, Reply::Ack);
    assert_eq!(
        state(second.request.id.clone()).await,
        RequestState::Succeeded
    );
    assert!(owners(stores.clone(), queue.clone()).await.is_empty());
    // Now the third is admitted, then dead-lettered: its slot is released.
    assert!(matches!(
        admission.process(&third.request.id).await.expect("process"),
        Reply::Publish { .. }
    ));
    assert_eq!(
        admission
            .dead_letter(&third.request.id)
            .await
            .expect("dead letter"),
        Reply::Ack
    );
    assert_eq!(state(third.request.id.clone()).await, RequestState::Failed);
    assert!(owners(stores.clone(), queue.clone()).await.is_empty());
    let reconciled = admission.reconcile(&queue).await.expect("reconcile");
    assert_eq!((reconciled.pruned, reconciled.reply), (vec![], Reply::Ack));
}

#[tokio::test]
async fn an_owner_id_of_another_queue_is_pruned_and_does_not_close_the_gate() {
    let backend = SqliteBackend::open_in_memory().await.expect("open");
    let stores = backend.stores();
    let admission = common::admission(&stores);
    let queue = QueueName::new("main").expect("queue");
    let head = admission
        .ingest(&queue, &RevisionUri::new("rev-1").expect("uri"))
        .await
        .expect("ingest");
    // A foreign id in the owners (a bug elsewhere, or a hand edit) fills the one slot.
    let mut stored = stores
        .queues
        .load_queue(&queue)
        .await
        .expect("load")
        .expect("queue");
    let foreign = holdfast_domain::RequestId::new(QueueName::new("other").expect("queue"), 1);
    stored.owners.insert(
        foreign.clone(),
        holdfast_domain::Slot::claimed(holdfast_domain::Timestamp::from_millis(1)),
    );
    assert_eq!(
        stores.queues.cas_queue(stored.version, &stored).await,
        Ok(holdfast_ports::CasOutcome::Applied)
    );
    let reply = admission.process(&head.request.id).await.expect("process");
    assert!(matches!(reply, Reply::Publish { .. }), "{reply:?}");
    let owners = stores
        .queues
        .load_queue(&queue)
        .await
        .expect("load")
        .expect("queue")
        .owners;
    assert_eq!(
        owners.into_keys().collect::<Vec<_>>(),
        vec![head.request.id]
    );
}

/// The reference delivery source over the store: a worker run delivers the process
/// message of an ingested revision and publishes it; a second head is held at the
/// closed gate (a minute's delay) and comes back as soon as the first build's
/// outcome frees the slot, not after the minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_head_of_the_store_source_comes_back_when_the_slot_frees() {
    use holdfast::{Handled, RunOptions, StoreDeliveries};
    use holdfast_ports::{BuildPublisher, DeliveryError, DeliverySource, Message};
    use std::sync::Mutex;

    struct Published(Mutex<Vec<holdfast_domain::RequestId>>);
    #[async_trait::async_trait]
    impl BuildPublisher for Published {
        async fn publish(
            &self,
            request: &holdfast_domain::Request,
            _plan: &holdfast_domain::BuildPlan,
            _generation: holdfast_domain::Generation,
        ) -> Result<(), DeliveryError> {
            self.0.lock().expect("published").push(request.id.clone());
            Ok(())
        }
    }

    let backend = SqliteBackend::open_in_memory().await.expect("open");
    let stores = backend.stores();
    let mut policy = holdfast::AdmissionPolicy::default();
    policy.default.gate_wait_delay = Duration::from_secs(60);
    let admission = holdfast::Admission::new(
        stores.queues.clone(),
        Arc::new(holdfast::NoAncestry),
        policy,
    )
    .with_wakeups(stores.wake.clone());
    let queue = QueueName::new("main").expect("queue");
    let source = StoreDeliveries::new(
        stores.queues.clone(),
        vec![queue.clone()],
        Duration::from_secs(60),
    )
    .with_wakeups(stores.wake.clone());
    let published = Published(Mutex::new(Vec::new()));
    let options = RunOptions::default();
    let next = || async { source.next().await.expect("next").expect("a delivery") };
    for uri in ["rev-1", "rev-2"] {
        let uri = RevisionUri::new(uri).expect("uri");
        source
            .send(Message::Ingest {
                queue: queue.clone(),
                uri,
            })
            .await
            .expect("send");
    }
    let mut seen = Vec::new();
    for _ in 0..4 {
        // ingest 1, ingest 2, then the two process messages in order.
        let d = next().await;
        seen.push(
            admission
                .handle(&source, &published, &d, options)
                .await
                .expect("handle"),
        );
    }
    // rev-2 is the head: 1 is superseded, 2 admitted.
    assert_eq!(
        seen,
        [
            Handled::Acked,
            Handled::Acked,
            Handled::Acked,
            Handled::Published
        ]
    );
    let first = published.0.lock().expect("published")[0].clone();
    assert_eq!(first.seq(), 2);
    source
        .send(Message::Ingest {
            queue: queue.clone(),
            uri: RevisionUri::new("rev-3").expect("uri"),
        })
        .await
        .expect("send");
    for want in [Handled::Acked, Handled::Held] {
        let d = next().await;
        assert_eq!(
            admission.handle(&source, &published, &d, options).await,
            Ok(want)
        );
    }
    admission
        .outcome(&first, holdfast_domain::BuildOutcome::Succeeded)
        .await
        .expect("outcome");
    let started = std::time::Instant::now();
    let d = tokio::time::timeout(Duration::from_secs(10), next())
        .await
        .expect("the held head came back before its minute");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        d.message,
        Message::Process(holdfast_domain::RequestId::new(queue.clone(), 3))
    );
    assert_eq!(
        admission.handle(&source, &published, &d, options).await,
        Ok(Handled::Published)
    );
}
