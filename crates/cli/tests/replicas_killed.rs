//! Replicas killed for real: three `holdfast soak` processes select and settle on
//! one database while the driver SIGKILLs a random one every 150-450 ms and
//! restarts it, for a bounded time; then a checker reads every replica's history
//! and the final tables:
//!
//! - no token spent twice: no two transactions settled as confirmed share a token;
//! - no confirmed transaction leaves an input spendable: every token of a
//!   transaction recorded Confirmed (in the history or the database) is spent by
//!   it, and every spent token's spender is recorded Confirmed (status and spend
//!   commit together, whatever moment the kill hit);
//! - every spent token was answered to its spender by a select;
//! - every lock of a dead process is swept within the lease (one replica outlives
//!   the others by the lease and a sweep period);
//! - value conserved: a confirmed payment's outputs (the amount to `r`, the
//!   change back to `w`) commit with its spend and status, whatever moment the
//!   kill hit; every output has its confirmed status, every confirmed transaction
//!   its outputs, and the unspent tokens of `w` and `r` add up to the funding.
//!
//! On SQLite the processes share one file; on PostgreSQL one server (skipped
//! loudly without one, as the support module says). Replay the kill times with
//! `HOLDFAST_KILL_SEED=<seed>` (printed by each run).

use crate::pg_support;

use crate::cli_support::{self, KILL_SEED_ENV, kill_seed};

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use cli_support::Holdfast;
use holdfast::backend::{Backend, BackendOptions};
use holdfast_domain::{TokenId, TokenType, TxId, TxStatus, WalletId};
use holdfast_ports::Stores;
use pg_support::TestDb;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How long the replicas are killed and restarted.
const KILLING: Duration = Duration::from_secs(25);
/// The lease of the run, and the sweep period.
const LEASE_MS: u64 = 1_500;
const SWEEP_MS: u64 = 200;
/// Scheduling slack on a loaded machine for the surviving replica's sweeper.
const SLACK_MS: u64 = 1_000;
const REPLICAS: usize = 3;

/// One replica: its name, history file and current process.
struct Replica {
    name: String,
    history: PathBuf,
    child: Option<Child>,
}

impl Replica {
    fn start(&mut self, h: &Holdfast, seed: u64) {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"));
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HOLDFAST_") {
                cmd.env_remove(key);
            }
        }
        let child = cmd
            .current_dir(h.dir.path())
            .env_remove("RUST_LOG")
            .args(["--db", &h.url])
            .env("HOLDFAST_LEASE_EXPIRY_MS", LEASE_MS.to_string())
            .env("HOLDFAST_CLEANUP_PERIOD_MS", SWEEP_MS.to_string())
            .env("HOLDFAST_MAX_BACKOFF_MS", "50")
            .env("HOLDFAST_SEED", seed.to_string())
            .args([
                "soak",
                "--wallet",
                "w",
                "--type",
                "CHF",
                "--max-amount",
                "120",
                "--pay-to",
                "r",
            ])
            .args(["--name", &self.name, "--history"])
            .arg(&self.history)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn holdfast soak");
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL: no destructor, no rollback in the process, no goodbye.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the histories say.
#[derive(Debug, Default)]
struct History {
    selected: BTreeMap<TxId, Vec<TokenId>>,
    amounts: BTreeMap<TxId, u128>,
    confirmed: BTreeSet<TxId>,
    deleted: BTreeSet<TxId>,
    double_spends: u64,
}

fn token(text: &str) -> TokenId {
    let (tx, index) = text
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("token {text:?}"));
    TokenId::new(
        TxId::new(tx).expect("tx"),
        index.parse().unwrap_or_else(|_| panic!("token {text:?}")),
    )
}

fn read_history(files: &[PathBuf]) -> History {
    let mut h = History::default();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        // A killed process may leave its last line incomplete: only whole lines count.
        let whole = match text.rfind('\n') {
            Some(end) => &text[..=end],
            None => "",
        };
        for line in whole.lines() {
            let mut words = line.split_whitespace();
            let kind = words.next().unwrap_or_default();
            let tx = || TxId::new(line.split_whitespace().nth(1).expect("tx")).expect("tx");
            match kind {
                "selected" => {
                    let mut words = words.skip(1);
                    let amount = words.next().and_then(|a| a.parse().ok()).expect("amount");
                    h.amounts.insert(tx(), amount);
                    h.selected.insert(tx(), words.map(token).collect());
                }
                "settled" if line.ends_with(" confirmed") => {
                    h.confirmed.insert(tx());
                }
                "settled" => {
                    h.deleted.insert(tx());
                }
                "double-spend" => h.double_spends += 1,
                "settling" | "minted" | "failed" => {}
                other => panic!("unknown history line {other:?}: {line}"),
            }
        }
    }
    h
}

/// Runs the kill phase and the checks on the database at `h.url`.
async fn kill_and_check(h: Holdfast, backend_name: &str) {
    let seed = kill_seed();
    println!("{backend_name} kill test seed: {seed} (replay with {KILL_SEED_ENV}={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let funding: [(&str, &str); 3] = [("10", "f10"), ("50", "f50"), ("100", "f100")];
    for (amount, tx) in funding {
        h.ok(&[
            "tokens", "add", "--wallet", "w", "--type", "CHF", "--amount", amount, "--tx", tx,
            "--count", "150",
        ]);
    }
    let dir = h.dir.path().to_owned();
    let mut replicas: Vec<Replica> = (0..REPLICAS)
        .map(|i| Replica {
            name: format!("r{i}"),
            history: dir.join(format!("r{i}.log")),
            child: None,
        })
        .collect();
    for r in &mut replicas {
        r.start(&h, rng.random());
    }
    let started = Instant::now();
    let mut kills = 0u32;
    while started.elapsed() < KILLING {
        // sleep: a kill every 150-450 ms (the workload's timing).
        std::thread::sleep(Duration::from_millis(rng.random_range(150..450)));
        let victim = rng.random_range(0..REPLICAS);
        replicas[victim].kill();
        kills += 1;
        replicas[victim].start(&h, rng.random());
    }
    // Everyone but r0 dies now; r0 lives on for the lease and two sweep periods,
    // so every lock a dead process left must be gone by then.
    for r in &mut replicas[1..] {
        r.kill();
    }
    // sleep: the lease and two sweep periods must pass; real processes share no paused clock.
    std::thread::sleep(Duration::from_millis(LEASE_MS + 2 * SWEEP_MS + SLACK_MS));
    let locks = h.json(&["locks", "list"]);
    replicas[0].kill();
    for lock in locks["locks"].as_array().expect("locks") {
        let age = lock["age_ms"].as_u64().expect("age");
        assert!(
            age <= LEASE_MS + 2 * SWEEP_MS + SLACK_MS,
            "a lock outlived the lease and the sweep: {lock}"
        );
    }

    let files: Vec<PathBuf> = replicas.iter().map(|r| r.history.clone()).collect();
    let history = read_history(&files);
    let backend = Backend::open(&h.url, &BackendOptions::default())
        .await
        .expect("open for the checker");
    check(&backend.stores(), &history, &funding).await;
    println!(
        "{backend_name}: {kills} kills, {} selected, {} confirmed, {} deleted, {} double spends",
        history.selected.len(),
        history.confirmed.len(),
        history.deleted.len(),
        history.double_spends
    );
    assert!(kills >= 20, "the run killed too little to test anything");
    assert!(
        history.confirmed.len() >= 20,
        "too few confirmed transactions to test anything"
    );
    backend.close().await;
}

async fn check(s: &Stores, history: &History, funding: &[(&str, &str); 3]) {
    let status = |tx: TxId| async move { s.statuses.status(&tx).await.expect("status") };
    // No token spent twice.
    let mut spender: BTreeMap<&TokenId, &TxId> = BTreeMap::new();
    for tx in &history.confirmed {
        for t in &history.selected[tx] {
            if let Some(first) = spender.insert(t, tx) {
                panic!("{t} was confirmed as spent by both {first} and {tx}");
            }
        }
    }
    // Every token that exists or may exist: the funding, and each selected
    // transaction's outputs (the payment, the change).
    let mut all: Vec<TokenId> = funding
        .iter()
        .flat_map(|(_, tx)| (0..150).map(move |i| TokenId::new(TxId::new(*tx).expect("tx"), i)))
        .collect();
    all.extend(
        history
            .selected
            .keys()
            .flat_map(|tx| [TokenId::new(tx.clone(), 0), TokenId::new(tx.clone(), 1)]),
    );
    let mut tokens = BTreeMap::new();
    for id in all {
        if let Some(t) = s.tokens.token(&id).await.expect("token") {
            if let Some(by) = &t.spent_by {
                assert_eq!(
                    status(by.clone()).await,
                    Some(TxStatus::Confirmed),
                    "{id} is spent by {by}, whose Confirmed status is missing"
                );
                assert!(
                    history
                        .selected
                        .get(by)
                        .is_some_and(|inputs| inputs.contains(&id)),
                    "{id} is spent by {by}, which never answered it from a select"
                );
            }
            tokens.insert(id, t);
        }
    }
    // Confirmed transactions (by history or by the database) spent all their inputs.
    for (tx, inputs) in &history.selected {
        let confirmed =
            history.confirmed.contains(tx) || status(tx.clone()).await == Some(TxStatus::Confirmed);
        for t in inputs {
            let by = tokens.get(t).and_then(|t| t.spent_by.as_ref());
            if confirmed {
                assert_eq!(
                    by,
                    Some(tx),
                    "{tx} is confirmed but its input {t} is not spent by it"
                );
            }
            if history.deleted.contains(tx) {
                assert_ne!(by, Some(tx), "{tx} was deleted but spent {t}");
            }
        }
    }
    // A transaction has its outputs exactly when it is confirmed: the amount to
    // `r`, what its inputs held beyond it back to `w`.
    for (tx, inputs) in &history.selected {
        let confirmed = status(tx.clone()).await == Some(TxStatus::Confirmed);
        let payment = tokens.get(&TokenId::new(tx.clone(), 0));
        let change = tokens.get(&TokenId::new(tx.clone(), 1));
        if !confirmed {
            assert!(
                payment.is_none() && change.is_none(),
                "{tx} has outputs without its confirmed status"
            );
            continue;
        }
        let payment = payment.unwrap_or_else(|| panic!("{tx} is confirmed without its payment"));
        assert_eq!(
            (payment.wallet.as_str(), payment.quantity.value()),
            ("r", history.amounts[tx]),
            "{tx}: the payment"
        );
        let total: u128 = inputs
            .iter()
            .map(|t| tokens.get(t).map_or(0, |t| t.quantity.value()))
            .sum();
        let change_value = change.map_or(0, |c| c.quantity.value());
        assert_eq!(
            change_value,
            total - history.amounts[tx],
            "{tx}: change = selected - amount"
        );
    }
    // Value conserved: what is unspent in `w` and `r` is what was funded.
    let funded: u128 = funding
        .iter()
        .map(|(amount, _)| 150 * amount.parse::<u128>().expect("amount"))
        .sum();
    let mut unspent = 0u128;
    for wallet in ["w", "r"] {
        unspent += s
            .tokens
            .balance(
                &WalletId::new(wallet).expect("wallet"),
                &TokenType::new("CHF").expect("type"),
            )
            .await
            .expect("balance")
            .value();
    }
    assert_eq!(unspent, funded, "value conserved: unspent = funded");
}

fn in_tokio(future: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(future);
}

#[test]
fn sqlite_replicas_killed_at_random_lose_nothing() {
    in_tokio(kill_and_check(Holdfast::sqlite(), "sqlite"));
}

#[test]
fn postgres_replicas_killed_at_random_lose_nothing() {
    in_tokio(async {
        let Some(db) = TestDb::create("replicas_killed").await else {
            return;
        };
        kill_and_check(Holdfast::at(&db.url), "postgres").await;
    });
}
