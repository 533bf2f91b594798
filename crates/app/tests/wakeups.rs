//! Wake-ups on the real backends (`docs/wakeups.md`): a waiting select answers
//! when another instance frees its tokens, without its backoff timer; a woken
//! waiter that cannot use what was freed hands the wake on; a held admission
//! head is woken when a slot frees; a lost PostgreSQL listener costs only
//! latency; a PostgreSQL release is sent only where another instance waits, a
//! wait announced after a release it missed included; and a release whose
//! `NOTIFY` the server refused is sent again.
//!
//! Every waiting select here has a backoff uniform in [0, 60 s): a wait that a
//! signal did not end would end on that timer, which the select's counters show
//! (`waits` > `wakeups`) and the test then fails.

use std::sync::Arc;
use std::time::{Duration, Instant};

use holdfast::{SelectReport, TokenSelector};
use holdfast_adapters_postgres::{CATCH_UP, LockStrategy, OPEN, PgBackend, PgOptions};
use holdfast_adapters_sqlite::{SqliteBackend, SqliteOptions};
use holdfast_domain::{
    BuildOutcome, QueueName, Reply, RevisionUri, SelectionConfig, Timestamp, TokenId, TokenType,
    WalletId,
};
use holdfast_ports::{NewToken, Stores, WaitEnd, WakeKey};
use tokio::task::JoinHandle;

use crate::common::{self, TempDb, TokioClock, q, tx};
use crate::pg_support::{TestDb, exec};

/// Long backoffs: only a wake-up can answer a waiting select within the test.
fn patient() -> SelectionConfig {
    SelectionConfig {
        max_retries: 3,
        retry_interval: Duration::from_secs(60),
        ..SelectionConfig::default()
    }
}

fn wallet() -> (WalletId, TokenType) {
    (
        WalletId::new("alice").expect("wallet"),
        TokenType::new("CHF").expect("type"),
    )
}

async fn fund(stores: &Stores, tag: &str, amounts: &[u128]) -> Vec<TokenId> {
    let (wallet, chf) = wallet();
    let tokens: Vec<NewToken> = amounts
        .iter()
        .enumerate()
        .map(|(i, &amount)| NewToken {
            id: TokenId::new(tx(&format!("fund-{tag}")), u32::try_from(i).expect("small")),
            wallet: wallet.clone(),
            token_type: chf.clone(),
            quantity: q(amount),
            spendable: true,
        })
        .collect();
    stores.tokens.add_tokens(&tokens).await.expect("funded");
    tokens.into_iter().map(|t| t.id).collect()
}

/// `tokens` locked for `holder`.
async fn hold(stores: &Stores, holder: &str, tokens: &[TokenId]) {
    stores
        .locks
        .claim_window(&tx(holder), tokens, Timestamp::from_millis(1))
        .await
        .expect("held");
}

/// `holder`'s locks on `tokens` released.
async fn release(stores: &Stores, holder: &str, tokens: &[TokenId]) {
    stores
        .locks
        .release_tokens(&tx(holder), tokens)
        .await
        .expect("released");
}

fn selector(stores: &Stores, seed: u64) -> Arc<TokenSelector> {
    Arc::new(
        TokenSelector::new(stores.clone(), TokioClock::new(), patient(), Some(seed))
            .expect("config"),
    )
}

/// Starts a select of `amount` for `consumer` and returns once it waits.
async fn waiting_select(
    selector: &Arc<TokenSelector>,
    amount: u128,
    consumer: &str,
) -> JoinHandle<SelectReport> {
    let (wallet, chf) = wallet();
    let (selector, consumer) = (selector.clone(), tx(consumer));
    let task = tokio::spawn(async move {
        selector
            .select_with_stats(&wallet, &chf, q(amount), &consumer)
            .await
    });
    // Its first leg finds nothing free and waits; give it the time to get there.
    // sleep: synchronisation: nothing public shows a select waiting (the wake registry is the
    // adapter's). One that has not reached its wait by the release reads the token at once and
    // fails `woken` (waits = 0), loudly.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!task.is_finished(), "the select should be waiting");
    task
}

/// The select answered with tokens, and every wait it made was ended by a signal.
fn woken(report: &SelectReport) {
    assert!(report.result.is_ok(), "{:?}", report.result);
    assert!(report.stats.waits >= 1, "{:?}", report.stats);
    assert_eq!(
        report.stats.wakeups, report.stats.waits,
        "a wait ended on its timer: {:?}",
        report.stats
    );
    assert_eq!(report.stats.legs, 1, "{:?}", report.stats);
}

async fn answered(task: JoinHandle<SelectReport>) -> SelectReport {
    tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("answered well before any backoff timer")
        .expect("select task")
}

#[tokio::test]
async fn sqlite_a_release_in_another_instance_wakes_a_waiting_select() {
    let db = TempDb::new("wake-across-instances");
    let url = db.url();
    let open = || SqliteBackend::open(&url, SqliteOptions::default());
    let (a, b) = (open().await.expect("a"), open().await.expect("b"));
    let tokens = fund(&b.stores(), "x", &[10]).await;
    hold(&b.stores(), "holder", &tokens).await;
    let waiting = waiting_select(&selector(&a.stores(), 1), 10, "waiter").await;
    release(&b.stores(), "holder", &tokens).await;
    let report = answered(waiting).await;
    woken(&report);
    // The woken attempt read and claimed in one transaction: no race to lose.
    assert_eq!(
        (report.stats.claims_with_read, report.stats.conflicts),
        (1, 0),
        "{:?}",
        report.stats
    );
}

#[tokio::test]
async fn a_woken_waiter_that_cannot_use_the_freed_tokens_hands_the_wake_on() {
    let backend = SqliteBackend::open_in_memory().await.expect("open");
    let stores = backend.stores();
    let tokens = fund(&stores, "y", &[10]).await;
    hold(&stores, "holder", &tokens).await;
    // Funds for the first waiter's balance check, held too, never freed.
    let big = fund(&stores, "big", &[500]).await;
    stores
        .locks
        .claim_window(&tx("hoarder"), &big, Timestamp::from_millis(1))
        .await
        .expect("held");
    let selector = selector(&stores, 2);
    // The first waiter (woken first) needs more than the freed 10; the second fits.
    let large = waiting_select(&selector, 100, "large").await;
    let small = waiting_select(&selector, 5, "small").await;
    release(&stores, "holder", &tokens).await;
    let report = answered(small).await;
    woken(&report);
    assert_eq!(report.result.expect("selected").tokens, tokens);
    large.abort();
}

#[tokio::test]
async fn a_held_head_is_woken_when_a_slot_of_its_queue_frees() {
    let backend = SqliteBackend::open_in_memory().await.expect("open");
    let stores = backend.stores();
    let admission = Arc::new(common::admission(&stores).with_wakeups(stores.wake.clone()));
    let queue = QueueName::new("main").expect("queue");
    let uri = |u: &str| RevisionUri::new(u).expect("uri");
    let first = admission
        .ingest(&queue, &uri("rev-1"))
        .await
        .expect("ingest");
    assert!(matches!(
        admission.process(&first.request.id).await.expect("process"),
        Reply::Publish { .. }
    ));
    let second = admission
        .ingest(&queue, &uri("rev-2"))
        .await
        .expect("ingest");
    let mut watch = admission.watch(&queue);
    let Reply::Hold { .. } = admission
        .process(&second.request.id)
        .await
        .expect("process")
    else {
        panic!("the second head should hold while the first builds");
    };
    let holding = {
        let admission = admission.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let end = admission.hold(&mut watch, Duration::from_secs(60)).await;
            (end, started.elapsed())
        })
    };
    admission
        .outcome(&first.request.id, BuildOutcome::Succeeded)
        .await
        .expect("outcome");
    let (end, _) = tokio::time::timeout(Duration::from_secs(20), holding)
        .await
        .expect("woken before the hold's delay")
        .expect("task");
    assert_eq!(end, WaitEnd::Signalled);
    assert!(matches!(
        admission
            .process(&second.request.id)
            .await
            .expect("process"),
        Reply::Publish { .. }
    ));
}

#[tokio::test]
async fn postgres_three_replicas_wake_each_other() {
    let Some(db) = TestDb::create("wakeups::three_replicas").await else {
        return;
    };
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(db.backend(LockStrategy::default(), 4).await);
    }
    for replica in &replicas {
        // Each instance listens before the rounds start.
        listening(replica).await;
    }
    let tokens = fund(&replicas[0].stores(), "z", &[10]).await;
    let mut latencies = Vec::new();
    for round in 0..6u64 {
        let waiter = replicas[usize::try_from(round % 3).expect("small")].stores();
        let settler = replicas[usize::try_from((round + 1) % 3).expect("small")].stores();
        let holder = format!("holder-{round}");
        hold(&settler, &holder, &tokens).await;
        let waiting =
            waiting_select(&selector(&waiter, 10 + round), 10, &format!("w-{round}")).await;
        // Settled as deleted on another replica: its locks are released.
        settler
            .locks
            .release_consumer(&tx(&holder), Timestamp::from_millis(2), true)
            .await
            .expect("settled");
        let committed = Instant::now();
        let report = answered(waiting).await;
        latencies.push(committed.elapsed());
        woken(&report);
        // The woken attempt read and claimed in one transaction, under the
        // wallet's advisory lock.
        assert_eq!(
            (report.stats.claims_with_read, report.stats.conflicts),
            (1, 0),
            "{:?}",
            report.stats
        );
        // Give the token back for the next round.
        waiter
            .locks
            .release_consumer(&tx(&format!("w-{round}")), Timestamp::from_millis(3), true)
            .await
            .expect("given back");
    }
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    eprintln!("wake-up across replicas, from the settling commit to the answer: {latencies:?}");
    assert!(
        median < Duration::from_millis(100),
        "median {median:?} of {latencies:?}"
    );
}

#[tokio::test]
async fn postgres_a_killed_listener_costs_only_latency() {
    let Some((db, a, b)) = two_instances("wakeups::killed_listener").await else {
        return;
    };
    // Two tokens, twelve selects of each one, settled at once: contended all along.
    fund(&a.stores(), "k", &[1, 1]).await;
    let config = SelectionConfig {
        max_retries: 10,
        retry_interval: Duration::from_millis(200),
        ..SelectionConfig::default()
    };
    let selectors = [&a, &b].map(|backend| {
        Arc::new(
            TokenSelector::new(backend.stores(), TokioClock::new(), config.clone(), Some(7))
                .expect("config"),
        )
    });
    let killer = {
        let mut conn = db.connection().await;
        tokio::spawn(async move {
            let mut killed = 0u64;
            for _ in 0..40 {
                let n: i64 = sqlx::query_scalar(
                    "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
                     WHERE application_name = 'holdfast-listen' AND datname = current_database()",
                )
                .fetch_one(&mut conn)
                .await
                .expect("terminate");
                killed += u64::try_from(n).unwrap_or(0);
                // sleep: the fault's pace: the killer ends the listeners' connections every 25 ms
                // for the run.
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            killed
        })
    };
    let mut tasks = Vec::new();
    for i in 0..24usize {
        let selector = selectors[i % 2].clone();
        let stores = [&a, &b][i % 2].stores();
        tasks.push(tokio::spawn(async move {
            let (wallet, chf) = wallet();
            let consumer = tx(&format!("s-{i}"));
            let report = selector
                .select_with_stats(&wallet, &chf, q(1), &consumer)
                .await;
            let selected = report.result.clone().expect("every select is answered");
            // sleep: the workload: each select holds what it got for a moment before
            // it settles, so the others contend.
            tokio::time::sleep(Duration::from_millis(5)).await;
            // Unlocked again (settled as deleted): the next select takes it.
            stores
                .locks
                .release_consumer(&consumer, Timestamp::from_millis(5), true)
                .await
                .expect("released");
            selected.tokens.len()
        }));
    }
    for task in tasks {
        assert_eq!(task.await.expect("select task"), 1);
    }
    let killed = killer.await.expect("killer");
    assert!(killed > 0, "no listener connection was killed");
    // And the listeners came back.
    for backend in [&a, &b] {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !holdfast_ports::WakeUps::connected(backend) {
            assert!(Instant::now() < deadline, "a listener never reconnected");
            // sleep: poll interval until the listener reconnects, bounded by the deadline.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A fresh database (dropped with its `TestDb`) and two instances of it.
async fn two_instances(name: &str) -> Option<(TestDb, PgBackend, PgBackend)> {
    let db = TestDb::create(name).await?;
    let a = db.backend(LockStrategy::default(), 4).await;
    let b = db.backend(LockStrategy::default(), 4).await;
    Some((db, a, b))
}

/// Waits until both listeners have listened for longer than [`OPEN`]: each
/// then sends a freed key only where the other waits for it.
async fn past_the_open_window(a: &PgBackend, b: &PgBackend) {
    listening(a).await;
    listening(b).await;
    // sleep: synchronisation: an instance sends every freed key until OPEN after the question its
    // listener asks on connecting went out; nothing public says when that window closed.
    tokio::time::sleep(OPEN + Duration::from_secs(1)).await;
}

/// Waits (at most 20 s) until `count` has gone past `before`: the notifier
/// counts a key once it has weighed it, or once its statement has gone, which
/// may be after the waiter it woke has answered.
async fn counted_since(count: impl Fn() -> u64, before: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while count() <= before {
        assert!(Instant::now() < deadline, "{what}");
        // sleep: poll interval until the notifier has counted the key, bounded by the deadline.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until `backend`'s notifier has held back a freed key since it had
/// held back `before`.
async fn withheld_since(backend: &PgBackend, before: u64) {
    counted_since(
        || backend.wakes_withheld(),
        before,
        "the release was never held back",
    )
    .await;
}

/// Waits until `backend`'s notifier has sent a freed key since it had sent
/// `before`.
async fn sent_since(backend: &PgBackend, before: u64) {
    counted_since(
        || backend.wakes_sent(),
        before,
        "the release was never sent",
    )
    .await;
}

/// One token of 10 added through `backend`, once its notifier has held back
/// the key the addition freed (nobody waits): what it weighs next is what the
/// test does.
async fn funded(backend: &PgBackend, tag: &str) -> Vec<TokenId> {
    let withheld = backend.wakes_withheld();
    let tokens = fund(&backend.stores(), tag, &[10]).await;
    withheld_since(backend, withheld).await;
    tokens
}

#[tokio::test]
async fn postgres_a_release_is_sent_only_where_another_instance_waits() {
    let Some((_db, a, b)) = two_instances("wakeups::sent_where_waited").await else {
        return;
    };
    past_the_open_window(&a, &b).await;
    let tokens = funded(&a, "n").await;
    // Nobody waits: the release stays in its instance.
    let (sent, withheld) = (a.wakes_sent(), a.wakes_withheld());
    hold(&a.stores(), "holder", &tokens).await;
    release(&a.stores(), "holder", &tokens).await;
    withheld_since(&a, withheld).await;
    assert_eq!(a.wakes_sent(), sent, "a release nobody waits for was sent");
    // A select of the other instance waits: its wait is announced, and the
    // release then reaches it.
    hold(&a.stores(), "holder-2", &tokens).await;
    let waiting = waiting_select(&selector(&b.stores(), 3), 10, "waiter").await;
    release(&a.stores(), "holder-2", &tokens).await;
    woken(&answered(waiting).await);
    sent_since(&a, sent).await;
}

#[tokio::test]
async fn postgres_a_wait_announced_after_a_release_it_missed_is_caught_up() {
    let Some((_db, a, b)) = two_instances("wakeups::caught_up").await else {
        return;
    };
    past_the_open_window(&a, &b).await;
    let tokens = funded(&a, "c").await;
    hold(&a.stores(), "holder", &tokens).await;
    let (wallet, chf) = wallet();
    // A waiter subscribes, reads (the token is held), and is slow to wait: the
    // release comes between its read and its wait, before any announcement.
    let mut waiter = holdfast_ports::WakeUps::subscribe(&b, WakeKey::tokens(&wallet, &chf), None);
    let withheld = a.wakes_withheld();
    release(&a.stores(), "holder", &tokens).await;
    // Nobody waited yet: not sent.
    withheld_since(&a, withheld).await;
    // sleep: the fault: a waiter slower from its read to its wait than the margin
    // the releasing instance gives an announcement's way (CATCH_UP).
    tokio::time::sleep(CATCH_UP + Duration::from_millis(500)).await;
    // Its wait is announced with how long ago it may have read; the releasing
    // instance answers with the key it freed since.
    let end = waiter
        .wait_until(tokio::time::Instant::now() + Duration::from_secs(20))
        .await;
    assert_eq!(
        end,
        WaitEnd::Signalled,
        "the missed release never reached the waiter"
    );
}

#[tokio::test]
async fn postgres_an_instance_that_listens_later_learns_the_waits_under_way() {
    let Some(db) = TestDb::create("wakeups::learns_waits").await else {
        return;
    };
    let a = db.backend(LockStrategy::default(), 4).await;
    listening(&a).await;
    let tokens = fund(&a.stores(), "l", &[10]).await;
    hold(&a.stores(), "holder", &tokens).await;
    // A select of the first instance waits (and announces it) before the
    // second instance exists.
    let waiting = waiting_select(&selector(&a.stores(), 5), 10, "waiter").await;
    let c = db.backend(LockStrategy::default(), 4).await;
    // Once past its open window the second instance sends only where it knows
    // of a wait: it asked when it connected, and the first one answered.
    past_the_open_window(&a, &c).await;
    let withheld = c.wakes_withheld();
    release(&c.stores(), "holder", &tokens).await;
    woken(&answered(waiting).await);
    assert_eq!(c.wakes_withheld(), withheld, "the release was held back");
}

/// `url` as login role `role` with `password` (the server's host and database
/// kept).
fn as_role(url: &str, role: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{role}:{password}@{host}")
}

#[tokio::test]
async fn postgres_a_release_whose_notify_failed_is_sent_again() {
    let Some(db) = TestDb::create("wakeups::notify_failed").await else {
        return;
    };
    // The releasing instance logs in as a role without superuser rights (the
    // database's owner), so that the server can refuse it `pg_notify`; the
    // waiting one as the superuser, which it cannot refuse. (So the test server's
    // URL must be a superuser's, as the throwaway cluster's is.)
    let role = db.login_role("releaser", "releaser").await;
    let mut admin = db.connection().await;
    exec(
        &mut admin,
        format!("ALTER DATABASE \"{}\" OWNER TO \"{role}\"", db.name),
    )
    .await;
    let a = PgBackend::connect(
        &as_role(&db.url, &role, "releaser"),
        PgOptions {
            max_connections: 4,
            ..PgOptions::default()
        },
    )
    .await
    .expect("connect as the releasing role");
    let b = db.backend(LockStrategy::default(), 4).await;
    past_the_open_window(&a, &b).await;
    let tokens = funded(&a, "f").await;
    hold(&a.stores(), "holder", &tokens).await;
    let waiting = waiting_select(&selector(&b.stores(), 7), 10, "waiter").await;
    // The fault: every NOTIFY of the releasing instance is refused while it
    // releases and for a while after (the freed key, or the catch-up that
    // answers the wait's announcement, fails with it).
    exec(
        &mut admin,
        "REVOKE EXECUTE ON FUNCTION pg_notify(text, text) FROM PUBLIC",
    )
    .await;
    let sent = a.wakes_sent();
    release(&a.stores(), "holder", &tokens).await;
    // sleep: the fault lasts through the first send and three retries (after 50,
    // 100 and 200 ms).
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(a.wakes_sent(), sent, "a NOTIFY went out while refused");
    exec(
        &mut admin,
        "GRANT EXECUTE ON FUNCTION pg_notify(text, text) TO PUBLIC",
    )
    .await;
    // The key goes again after the pause, and the waiter wakes: not on its
    // backoff timer.
    woken(&answered(waiting).await);
    sent_since(&a, sent).await;
}

/// `n` selects that each need more than one released token can give, all
/// waiting on a wallet whose funds are held, then one release: the wake-ups
/// and store round trips it caused, summed over the waiters. Each waiter's
/// deadline ends its call 1.5 s after it started.
async fn wakes_of_one_useless_release(stores: &Stores, n: usize, seed: u64) -> (u64, u64) {
    let tokens = fund(stores, "useless", &[10]).await;
    hold(stores, "holder", &tokens).await;
    // Funds for the waiters' balance checks, held and never freed.
    let big = fund(stores, "big", &[5_000]).await;
    hold(stores, "hoarder", &big).await;
    let selector = Arc::new(
        TokenSelector::new(
            stores.clone(),
            TokioClock::new(),
            SelectionConfig {
                deadline: Duration::from_millis(1_500),
                ..patient()
            },
            Some(seed),
        )
        .expect("config"),
    );
    let mut waiting = Vec::new();
    for i in 0..n {
        let amount = 100 * (u128::try_from(i).expect("small") + 1);
        waiting.push(waiting_select(&selector, amount, &format!("needs-{amount}")).await);
    }
    release(stores, "holder", &tokens).await;
    let (mut wakeups, mut round_trips) = (0, 0);
    for task in waiting {
        let report = answered(task).await;
        assert!(report.result.is_err(), "nobody can use the freed token");
        wakeups += report.stats.wakeups;
        round_trips += report.stats.round_trips();
    }
    (wakeups, round_trips)
}

/// Before the fix, two such waiters woke each other until their deadlines: one
/// release gave about 155 wake-ups per select and 317 round trips in a second.
/// A wake is handed on at most once per waiter per signal: one release wakes
/// each waiter once at most.
fn at_most_one_wake_each(n: usize, (wakeups, round_trips): (u64, u64)) {
    eprintln!("{n} waiters, one useless release: {wakeups} wake-ups, {round_trips} round trips");
    let n = u64::try_from(n).expect("small");
    assert!(
        wakeups <= n,
        "{n} waiters were woken {wakeups} times by one release ({round_trips} round trips)"
    );
    // Each waiter: its first read and balance check, then at most one woken read
    // and balance check (a woken read-and-claim is one round trip).
    assert!(
        round_trips <= 4 * n,
        "{n} waiters made {round_trips} round trips around one release ({wakeups} wake-ups)"
    );
}

#[tokio::test]
async fn sqlite_waiters_that_cannot_use_a_freed_token_are_woken_once_each() {
    for n in [2, 3] {
        let backend = SqliteBackend::open_in_memory().await.expect("open");
        at_most_one_wake_each(
            n,
            wakes_of_one_useless_release(&backend.stores(), n, 7).await,
        );
    }
}

#[tokio::test]
async fn postgres_waiters_that_cannot_use_a_freed_token_are_woken_once_each() {
    for n in [2, 3] {
        let Some(db) = TestDb::create(&format!("wakeups::useless_release_{n}")).await else {
            return;
        };
        let backend = db.backend(LockStrategy::default(), 4).await;
        // A listener that connects once the waiters wait wakes them all once
        // (signals sent before it listened are lost): not this release's doing.
        listening(&backend).await;
        at_most_one_wake_each(
            n,
            wakes_of_one_useless_release(&backend.stores(), n, 7).await,
        );
    }
}

/// Waits (at most 20 s) until `backend`'s wake-up listener is connected.
async fn listening(backend: &PgBackend) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !holdfast_ports::WakeUps::connected(backend) {
        assert!(Instant::now() < deadline, "the listener never connected");
        // sleep: poll interval until the listener connects, bounded by the deadline.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
