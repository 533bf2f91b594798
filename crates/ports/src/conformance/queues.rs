//! Checks of the queue store: dedup and numbering of requests, compare-and-set on
//! queues and requests (stale versions rejected, concurrent writes never lost), and
//! the exact round trip of the owner set and each owner's slot (times, build
//! generation, publication, expiring mark).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use holdfast_domain::{
    BuildPlan, BuildStrategy, FailReason, Generation, LastGreen, Queue, Request, RequestId,
    RequestState, Slot, Timestamp, Version,
};
use tokio::sync::Barrier;

use super::TestDatabase;
use super::support::{queue, uri};
use crate::{CasOutcome, Stores};

async fn instances(db: &dyn TestDatabase) -> Vec<Stores> {
    let mut out = vec![db.stores()];
    for _ in 0..2 {
        match db.replica().await {
            Ok(s) => out.push(s),
            Err(e) => panic!("conformance: could not open a replica: {e}"),
        }
    }
    out
}

pub(super) async fn load_queue(s: &Stores, name: &str) -> Queue {
    s.queues
        .load_queue(&queue(name))
        .await
        .expect("load_queue")
        .unwrap_or_else(|| panic!("queue {name} must exist"))
}

fn rid(text: &str) -> RequestId {
    RequestId::parse(text).unwrap_or_else(|e| panic!("conformance: {e}"))
}

/// `create_request` numbers requests 1, 2, 3... per queue, deduplicates on
/// (queue, uri), creates the queue record at [`Version::FIRST`], and stores an
/// accepted request without a plan.
pub async fn create_request_dedups_and_numbers(db: &dyn TestDatabase) {
    let s = db.stores();
    let q = queue("monorepo/main");
    assert_eq!(s.queues.load_queue(&q).await, Ok(None));
    let a = s
        .queues
        .create_request(&q, &uri("git:aaa"))
        .await
        .expect("create");
    assert!(a.created);
    assert_eq!(a.request.id, rid("request/monorepo/main/1"));
    assert_eq!(a.request.uri, uri("git:aaa"));
    assert_eq!(a.request.state, RequestState::Accepted);
    assert_eq!(a.request.plan, None);
    assert_eq!(a.request.version, Version::FIRST);
    // Stamped by the store's clock at creation (a date after 2023, not a default).
    assert!(
        a.request.ingested_at > Timestamp::from_millis(1_700_000_000_000),
        "{:?}",
        a.request.ingested_at
    );
    let b = s
        .queues
        .create_request(&q, &uri("git:bbb"))
        .await
        .expect("create");
    assert_eq!((b.created, b.request.id.seq()), (true, 2));
    let again = s
        .queues
        .create_request(&q, &uri("git:aaa"))
        .await
        .expect("create");
    assert!(!again.created, "same queue and uri: deduplicated");
    assert_eq!(again.request, a.request);
    let other = s
        .queues
        .create_request(&queue("other"), &uri("git:aaa"))
        .await
        .expect("create");
    assert_eq!(
        (other.created, other.request.id.seq()),
        (true, 1),
        "numbering is per queue"
    );
    let loaded = load_queue(&s, "monorepo/main").await;
    assert_eq!(
        loaded,
        Queue::new(q.clone()),
        "a created queue is empty at version 1"
    );
    assert_eq!(
        s.queues.load_request(&a.request.id).await,
        Ok(Some(a.request.clone()))
    );
    assert_eq!(
        s.queues
            .load_request(&rid("request/monorepo/main/99"))
            .await,
        Ok(None)
    );
}

/// 24 tasks on three instances ingest 8 uris three times each at once: 8 requests
/// are created, numbered 1..=8 without gaps or repeats, and every duplicate gets the
/// request of its uri.
pub async fn create_request_concurrent_dedups(db: &dyn TestDatabase) {
    let inst = instances(db).await;
    let barrier = Arc::new(Barrier::new(24));
    let mut tasks = Vec::new();
    for i in 0..24usize {
        let s = inst[i % inst.len()].clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let u = uri(&format!("git:{}", i % 8));
            barrier.wait().await;
            (u.clone(), s.queues.create_request(&queue("q/x"), &u).await)
        }));
    }
    let mut by_uri: std::collections::BTreeMap<String, (RequestId, usize)> = Default::default();
    for t in tasks {
        let (u, got) = t.await.expect("task panicked");
        let got = got.unwrap_or_else(|e| panic!("create_request {u}: {e}"));
        assert_eq!(got.request.uri, u);
        let entry = by_uri
            .entry(u.to_string())
            .or_insert((got.request.id.clone(), 0));
        assert_eq!(entry.0, got.request.id, "{u} got two different requests");
        if got.created {
            entry.1 += 1;
        }
    }
    assert_eq!(by_uri.len(), 8);
    for (u, (_, created)) in &by_uri {
        assert_eq!(*created, 1, "{u} created exactly once");
    }
    let seqs: BTreeSet<u64> = by_uri.values().map(|(id, _)| id.seq()).collect();
    assert_eq!(
        seqs,
        (1..=8).collect::<BTreeSet<u64>>(),
        "numbers 1..=8, no gaps or repeats"
    );
    let listed = inst[0]
        .queues
        .list_requests(&queue("q/x"), 100)
        .await
        .expect("list");
    assert_eq!(listed.len(), 8);
}

/// A queue compare-and-set applies on the stored version and bumps it; a stale or
/// missing one conflicts and writes nothing.
pub async fn queue_cas_rejects_stale_version(db: &dyn TestDatabase) {
    let s = db.stores();
    let created = s
        .queues
        .create_request(&queue("q"), &uri("u1"))
        .await
        .expect("create");
    let mut q = load_queue(&s, "q").await;
    q.latest_request_id = Some(created.request.id.clone());
    assert_eq!(
        s.queues.cas_queue(Version::FIRST, &q).await,
        Ok(CasOutcome::Applied)
    );
    let stored = load_queue(&s, "q").await;
    assert_eq!(stored.version, Version(2));
    assert_eq!(stored.latest_request_id, Some(created.request.id.clone()));
    let mut stale = q.clone();
    stale.latest_request_id = None;
    stale
        .owners
        .insert(created.request.id.clone(), Slot::claimed(Timestamp(1)));
    assert_eq!(
        s.queues.cas_queue(Version::FIRST, &stale).await,
        Ok(CasOutcome::Conflict)
    );
    assert_eq!(
        s.queues.cas_queue(Version(3), &stale).await,
        Ok(CasOutcome::Conflict),
        "future"
    );
    assert_eq!(
        load_queue(&s, "q").await,
        stored,
        "a conflicting write changed nothing"
    );
    let missing = Queue::new(queue("never-created"));
    assert_eq!(
        s.queues.cas_queue(Version::FIRST, &missing).await,
        Ok(CasOutcome::Conflict)
    );
    assert_eq!(s.queues.load_queue(&queue("never-created")).await, Ok(None));
}

/// A request compare-and-set applies on the stored version and bumps it, storing
/// state and plan exactly; a stale or missing one conflicts and writes nothing.
pub async fn request_cas_rejects_stale_version(db: &dyn TestDatabase) {
    let s = db.stores();
    let r = s
        .queues
        .create_request(&queue("q"), &uri("u1"))
        .await
        .expect("create")
        .request;
    let processing = Request {
        state: RequestState::Processing,
        plan: Some(BuildPlan {
            strategy: BuildStrategy::IncrementalSinceGreen,
            base: Some(uri("u0")),
        }),
        ..r.clone()
    };
    assert_eq!(
        s.queues.cas_request(Version::FIRST, &processing).await,
        Ok(CasOutcome::Applied)
    );
    let stored = s
        .queues
        .load_request(&r.id)
        .await
        .expect("load")
        .expect("stored");
    assert_eq!(
        stored,
        Request {
            version: Version(2),
            ..processing.clone()
        }
    );
    let failed = Request {
        state: RequestState::Failed,
        reason: Some(FailReason::SlotLeaseExpired),
        ..r.clone()
    };
    assert_eq!(
        s.queues.cas_request(Version::FIRST, &failed).await,
        Ok(CasOutcome::Conflict)
    );
    assert_eq!(
        s.queues.load_request(&r.id).await,
        Ok(Some(stored.clone())),
        "unchanged"
    );
    let full = Request {
        state: RequestState::Succeeded,
        plan: Some(BuildPlan {
            strategy: BuildStrategy::Full,
            base: None,
        }),
        ..r.clone()
    };
    assert_eq!(
        s.queues.cas_request(Version(2), &full).await,
        Ok(CasOutcome::Applied)
    );
    let stored = s
        .queues
        .load_request(&r.id)
        .await
        .expect("load")
        .expect("stored");
    assert_eq!(
        stored,
        Request {
            version: Version(3),
            ..full
        }
    );
    let ghost = Request {
        id: rid("request/q/42"),
        ..r
    };
    assert_eq!(
        s.queues.cas_request(Version::FIRST, &ghost).await,
        Ok(CasOutcome::Conflict)
    );
    assert_eq!(s.queues.load_request(&rid("request/q/42")).await, Ok(None));
}

/// 16 tasks on three instances each add their own owner to one queue by
/// read-modify-compare-and-set-retry: all 16 owners are present at the end and the
/// version counts exactly 16 applied writes.
pub async fn queue_cas_never_loses_a_concurrent_write(db: &dyn TestDatabase) {
    let inst = instances(db).await;
    inst[0]
        .queues
        .create_request(&queue("a/b/c"), &uri("seed"))
        .await
        .expect("create");
    let barrier = Arc::new(Barrier::new(16));
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let s = inst[usize::try_from(i).unwrap_or(0) % inst.len()].clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mine = RequestId::new(queue("a/b/c"), i + 1);
            for _attempt in 0..10_000u32 {
                let mut q = load_queue(&s, "a/b/c").await;
                let expected = q.version;
                q.owners
                    .insert(mine.clone(), Slot::claimed(Timestamp(i + 1)));
                match s.queues.cas_queue(expected, &q).await {
                    Ok(CasOutcome::Applied) => return,
                    Ok(CasOutcome::Conflict) => tokio::task::yield_now().await,
                    Err(e) => panic!("cas_queue failed: {e}"),
                }
            }
            panic!("task {i} never applied its write");
        }));
    }
    for t in tasks {
        t.await.expect("cas task panicked");
    }
    let q = load_queue(&inst[0], "a/b/c").await;
    let want: BTreeSet<RequestId> = (1..=16)
        .map(|n| RequestId::new(queue("a/b/c"), n))
        .collect();
    assert_eq!(
        q.owners.keys().cloned().collect::<BTreeSet<_>>(),
        want,
        "no owner lost"
    );
    assert_eq!(q.version, Version(17), "16 applied writes");
}

/// 16 tasks on three instances each apply one request compare-and-set (retrying on
/// conflict): the final version counts exactly 16 applied writes.
pub async fn request_cas_never_loses_a_concurrent_write(db: &dyn TestDatabase) {
    let inst = instances(db).await;
    let id = inst[0]
        .queues
        .create_request(&queue("q"), &uri("u"))
        .await
        .expect("create")
        .request
        .id;
    let barrier = Arc::new(Barrier::new(16));
    let mut tasks = Vec::new();
    for i in 0..16usize {
        let s = inst[i % inst.len()].clone();
        let (barrier, id) = (barrier.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut applied = 0u32;
            let mut conflicts = 0u32;
            while applied == 0 {
                let r = s
                    .queues
                    .load_request(&id)
                    .await
                    .expect("load")
                    .expect("stored");
                let state = if i % 2 == 0 {
                    RequestState::Processing
                } else {
                    RequestState::Accepted
                };
                match s
                    .queues
                    .cas_request(r.version, &Request { state, ..r.clone() })
                    .await
                {
                    Ok(CasOutcome::Applied) => applied += 1,
                    Ok(CasOutcome::Conflict) => {
                        conflicts += 1;
                        assert!(conflicts < 10_000, "task {i} never applied its write");
                        tokio::task::yield_now().await;
                    }
                    Err(e) => panic!("cas_request failed: {e}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("cas task panicked");
    }
    let r = inst[1]
        .queues
        .load_request(&id)
        .await
        .expect("load")
        .expect("stored");
    assert_eq!(r.version, Version(17), "16 applied writes, none lost");
}

/// The owner set with each slot's claim and heartbeat times and build data,
/// latest request, last green bookmark and slot limit round-trip exactly: empty,
/// one, many, with `/` in queue names and numbers beyond 2^53, times to the
/// millisecond.
pub async fn owner_set_round_trips_exactly(db: &dyn TestDatabase) {
    let s = db.stores();
    let name = queue("org/repo/main");
    s.queues
        .create_request(&name, &uri("u"))
        .await
        .expect("create");
    let slot = |claimed: u64, heartbeat: u64| Slot {
        claimed_at: Timestamp(1_764_000_000_000 + claimed),
        heartbeat_at: Timestamp(1_764_000_000_000 + heartbeat),
        generation: Generation(u32::try_from(claimed % 4).unwrap_or(0)),
        published_at: (claimed % 4 > 0).then(|| Timestamp(1_764_000_000_000 + claimed + 1)),
        expiring: heartbeat % 5 == 0,
    };
    let owner_sets: Vec<BTreeMap<RequestId, Slot>> = vec![
        BTreeMap::new(),
        BTreeMap::from([(RequestId::new(name.clone(), 1), slot(0, 0))]),
        (1..=40)
            .map(|n| (RequestId::new(name.clone(), n * 3), slot(n, n * 7 + 1)))
            .collect(),
        BTreeMap::from([
            (RequestId::new(name.clone(), 2), slot(1, 999)),
            (RequestId::new(name.clone(), 10), slot(5, 5)),
            (
                RequestId::new(name.clone(), (1 << 53) + 1),
                slot(123, 456_789),
            ),
        ]),
        BTreeMap::new(),
    ];
    let mut version = Version::FIRST;
    for (step, owners) in owner_sets.into_iter().enumerate() {
        let mut q = load_queue(&s, "org/repo/main").await;
        q.owners = owners.clone();
        q.latest_request_id = (step % 2 == 1).then(|| RequestId::new(name.clone(), 7));
        q.max_concurrent = [None, Some(0), Some(1), Some(40), Some(3)][step];
        q.last_green = (step % 2 == 0 && step > 0).then(|| LastGreen {
            uri: uri("git:green/with/slashes"),
            request_id: RequestId::new(name.clone(), 5),
        });
        assert_eq!(
            s.queues.cas_queue(version, &q).await,
            Ok(CasOutcome::Applied),
            "step {step}"
        );
        version = version.next();
        let stored = load_queue(&s, "org/repo/main").await;
        assert_eq!(stored, Queue { version, ..q }, "step {step}");
    }
}

/// Each owner's build data round-trips exactly and independently of the others
/// (never published; published at generation 1, 2 or `u32::MAX`; a withdrawn
/// publication; the expiring mark, set and cleared), and belongs to the owner's
/// slot: an owner released and claimed again, even at the same claim time, starts
/// never published and not expiring, and so does an owner admitted while others
/// keep theirs.
pub async fn slot_builds_round_trip_and_end_with_the_slot(db: &dyn TestDatabase) {
    let s = db.stores();
    let name = queue("builds/main");
    s.queues
        .create_request(&name, &uri("u"))
        .await
        .expect("create");
    let base = 1_764_000_000_000;
    let id = |n: u64| RequestId::new(name.clone(), n);
    let claimed = |n: u64| Slot::claimed(Timestamp(base + n));
    let published = |n: u64, generation: u32, at: u64, expiring: bool| Slot {
        heartbeat_at: Timestamp(base + n + 10),
        generation: Generation(generation),
        published_at: Some(Timestamp(base + at)),
        expiring,
        ..claimed(n)
    };
    let write = |owners: Vec<(u64, Slot)>| {
        let s = s.clone();
        let name = name.clone();
        async move {
            let mut q = load_queue(&s, name.as_str()).await;
            let version = q.version;
            q.owners = owners.into_iter().map(|(n, slot)| (id(n), slot)).collect();
            assert_eq!(
                s.queues.cas_queue(version, &q).await,
                Ok(CasOutcome::Applied)
            );
            let stored = load_queue(&s, name.as_str()).await;
            assert_eq!(
                stored,
                Queue {
                    version: version.next(),
                    ..q.clone()
                }
            );
            stored.owners
        }
    };

    // Five owners, each at a different point of its build.
    let first = write(vec![
        (1, claimed(1)),
        (2, published(2, 1, 20, false)),
        (3, published(3, 7, 30, true)),
        (4, published(4, u32::MAX, 0, false)),
        (
            5,
            Slot {
                generation: Generation(3),
                published_at: None,
                ..claimed(5)
            },
        ),
    ])
    .await;
    assert_eq!(first[&id(1)].generation, Generation::NONE);
    assert_eq!(first[&id(1)].published_at, None);
    assert!(first[&id(3)].expiring && !first[&id(2)].expiring);
    assert_eq!(first[&id(4)].generation, Generation(u32::MAX));
    assert_eq!(
        (first[&id(5)].generation, first[&id(5)].published_at),
        (Generation(3), None),
        "a withdrawn publication keeps its generation"
    );

    // Owner 2 publishes again and is marked; 3's mark is cleared; 1 and 4 are
    // released; 6 is admitted; 5 is untouched.
    let second = write(vec![
        (2, published(2, 2, 40, true)),
        (
            3,
            Slot {
                expiring: false,
                ..first[&id(3)]
            },
        ),
        (5, first[&id(5)]),
        (6, claimed(6)),
    ])
    .await;
    assert_eq!(second[&id(2)].generation, Generation(2));
    assert!(!second[&id(3)].expiring);
    assert_eq!(second[&id(6)], Slot::claimed(Timestamp(base + 6)));

    // Owner 4, released, claims again with the very claim time of its old slot,
    // and 3's slot is replaced by a fresh claim at its old claim time: nothing of
    // their earlier builds comes back.
    let third = write(vec![
        (2, second[&id(2)]),
        (3, claimed(3)),
        (4, claimed(4)),
        (5, second[&id(5)]),
        (6, second[&id(6)]),
    ])
    .await;
    for n in [3, 4] {
        assert_eq!(
            third[&id(n)],
            Slot::claimed(Timestamp(base + n)),
            "owner {n}: a new claim starts unpublished"
        );
    }
    assert_eq!(third[&id(5)], first[&id(5)]);
}

/// `list_requests` lists the newest `limit` requests of a queue, in sequence order.
pub async fn list_requests_in_sequence_order(db: &dyn TestDatabase) {
    let s = db.stores();
    for u in ["z", "y", "x", "w"] {
        s.queues
            .create_request(&queue("q"), &uri(u))
            .await
            .expect("create");
    }
    s.queues
        .create_request(&queue("q2"), &uri("other"))
        .await
        .expect("create");
    let listed = s.queues.list_requests(&queue("q"), 3).await.expect("list");
    let got: Vec<(u64, String)> = listed
        .iter()
        .map(|r| (r.id.seq(), r.uri.to_string()))
        .collect();
    assert_eq!(
        got,
        vec![
            (2, "y".to_owned()),
            (3, "x".to_owned()),
            (4, "w".to_owned())
        ],
        "the newest 3 of 4, oldest first"
    );
    let all: Vec<u64> = s
        .queues
        .list_requests(&queue("q"), 10)
        .await
        .expect("list")
        .iter()
        .map(|r| r.id.seq())
        .collect();
    assert_eq!(all, [1, 2, 3, 4]);
    assert!(
        s.queues
            .list_requests(&queue("empty"), 10)
            .await
            .expect("list")
            .is_empty()
    );
}

/// `list_queues` names every queue once, in name order.
pub async fn list_queues_in_name_order(db: &dyn TestDatabase) {
    let s = db.stores();
    assert_eq!(s.queues.list_queues().await, Ok(vec![]));
    for (q, u) in [("b", "1"), ("a/x", "1"), ("b", "2"), ("a", "1")] {
        s.queues
            .create_request(&queue(q), &uri(u))
            .await
            .expect("create");
    }
    assert_eq!(
        s.queues.list_queues().await,
        Ok(vec![queue("a"), queue("a/x"), queue("b")])
    );
}

/// Moves request `id` to `state` (with `reason`) by compare-and-set.
async fn finish(
    s: &crate::Stores,
    id: &RequestId,
    state: RequestState,
    reason: Option<FailReason>,
) {
    let r = s
        .queues
        .load_request(id)
        .await
        .expect("load")
        .expect("stored");
    let next = Request {
        state,
        reason,
        ..r.clone()
    };
    assert_eq!(
        s.queues.cas_request(r.version, &next).await,
        Ok(CasOutcome::Applied)
    );
}

/// Retention deletes terminal requests last written at least `older_than` ago,
/// and never the head, the last green, the newest succeeded request, a slot owner
/// or a live request; the fail reason round-trips on what it keeps.
pub async fn prune_requests_keeps_head_green_owners_and_live(db: &dyn TestDatabase) {
    let s = db.stores();
    let q = queue("keep/me");
    let mut ids = Vec::new();
    for u in ["r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8"] {
        ids.push(
            s.queues
                .create_request(&q, &uri(u))
                .await
                .expect("create")
                .request
                .id,
        );
    }
    let other = s
        .queues
        .create_request(&queue("other"), &uri("r1"))
        .await
        .expect("create")
        .request
        .id;
    finish(&s, &other, RequestState::Superseded, None).await;
    // 1 superseded, 2 succeeded (the green), 3 failed owner, 4 cancelled,
    // 5 succeeded (newest succeeded, not yet the green), 6 failed by a lease,
    // 7 accepted, 8 superseded and the head.
    finish(&s, &ids[0], RequestState::Superseded, None).await;
    finish(&s, &ids[1], RequestState::Succeeded, None).await;
    finish(&s, &ids[2], RequestState::Failed, None).await;
    finish(&s, &ids[3], RequestState::Cancelled, None).await;
    finish(&s, &ids[4], RequestState::Succeeded, None).await;
    finish(
        &s,
        &ids[5],
        RequestState::Failed,
        Some(FailReason::SlotLeaseExpired),
    )
    .await;
    finish(&s, &ids[7], RequestState::Superseded, None).await;
    let mut stored = load_queue(&s, "keep/me").await;
    let version = stored.version;
    stored.latest_request_id = Some(ids[7].clone());
    stored.last_green = Some(LastGreen {
        uri: uri("r2"),
        request_id: ids[1].clone(),
    });
    stored
        .owners
        .insert(ids[2].clone(), Slot::claimed(Timestamp(1)));
    assert_eq!(
        s.queues.cas_queue(version, &stored).await,
        Ok(CasOutcome::Applied)
    );
    assert_eq!(
        s.queues
            .prune_requests(&q, Duration::from_secs(3_600))
            .await,
        Ok(0),
        "nothing is an hour old"
    );
    assert_eq!(s.queues.prune_requests(&q, Duration::ZERO).await, Ok(3));
    let left: Vec<u64> = s
        .queues
        .list_requests(&q, 100)
        .await
        .expect("list")
        .iter()
        .map(|r| r.id.seq())
        .collect();
    assert_eq!(left, [2, 3, 5, 7, 8]);
    assert_eq!(
        s.queues
            .load_request(&other)
            .await
            .expect("load")
            .map(|r| r.state),
        Some(RequestState::Superseded),
        "another queue is untouched"
    );
    assert_eq!(s.queues.prune_requests(&q, Duration::ZERO).await, Ok(0));
    let next = s
        .queues
        .create_request(&q, &uri("r9"))
        .await
        .expect("create");
    assert_eq!(
        next.request.id.seq(),
        9,
        "numbering continues past pruned requests"
    );
}

/// One leader per reconcile tick: of 16 callers on three instances asking for one
/// tick, exactly one leads; an old tick never leads again; the next one does.
pub async fn one_reconcile_leader_per_tick(db: &dyn TestDatabase) {
    let inst = instances(db).await;
    let barrier = Arc::new(Barrier::new(16));
    let mut tasks = Vec::new();
    for i in 0..16usize {
        let (s, barrier) = (inst[i % inst.len()].clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            s.queues.lead_reconcile(1_000).await.expect("lead")
        }));
    }
    let mut leaders = 0;
    for t in tasks {
        leaders += usize::from(t.await.expect("lead task panicked"));
    }
    assert_eq!(leaders, 1, "one leader of tick 1000");
    assert_eq!(inst[1].queues.lead_reconcile(1_000).await, Ok(false));
    assert_eq!(inst[2].queues.lead_reconcile(999).await, Ok(false));
    assert_eq!(inst[0].queues.lead_reconcile(1_001).await, Ok(true));
}
