//! Running the built `holdfast` binary against a temporary database.
//!
//! Every command runs in a fresh temporary working directory with `--db` pointing
//! at the test's database, `HOLDFAST_SEED` fixed (selection is replayable), the
//! owner id `cli-test`, and every
//! other `HOLDFAST_*` variable of the test process removed (the configuration
//! refuses unknown ones, and the test harness sets some of its own).

#![allow(dead_code)] // each test binary uses a different part of this module

use assert_cmd::Command;
use tempfile::TempDir;

/// The seed every command runs with.
pub const SEED: &str = "7";

/// The variable that replays the random choices of a kill test.
pub const KILL_SEED_ENV: &str = "HOLDFAST_KILL_SEED";

/// `HOLDFAST_KILL_SEED`, else a fresh seed: print it, so a failing run can be
/// replayed.
pub fn kill_seed() -> u64 {
    use rand::{Rng, SeedableRng};
    match std::env::var(KILL_SEED_ENV) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{KILL_SEED_ENV}={v:?} is not a number")),
        Err(_) => rand::rngs::StdRng::from_os_rng().random(),
    }
}

/// A database the commands of one test share, and a working directory.
#[derive(Debug)]
pub struct Holdfast {
    /// The working directory (and home of the SQLite file).
    pub dir: TempDir,
    /// The `--db` URL.
    pub url: String,
}

impl Holdfast {
    /// A fresh SQLite file in a fresh temporary directory.
    pub fn sqlite() -> Holdfast {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", dir.path().join("holdfast.db").display());
        Holdfast { dir, url }
    }

    /// The database at `url` (for example a fresh PostgreSQL database).
    pub fn at(url: &str) -> Holdfast {
        Holdfast {
            dir: tempfile::tempdir().expect("temporary directory"),
            url: url.to_owned(),
        }
    }

    /// The binary, in the working directory, with a clean environment, without `--db`
    /// (and without the test server's `DATABASE_URL`, which would choose the database).
    pub fn bare(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HOLDFAST_") {
                cmd.env_remove(key);
            }
        }
        cmd.env_remove("RUST_LOG")
            .env_remove("DATABASE_URL")
            .env("HOLDFAST_SEED", SEED)
            // Not derived from the host name: outputs are the same on every machine.
            .env("HOLDFAST_OWNER", "cli-test")
            .current_dir(self.dir.path());
        cmd
    }

    /// The binary on this test's database.
    pub fn cmd(&self) -> Command {
        let mut cmd = self.bare();
        cmd.arg("--db").arg(&self.url);
        cmd
    }

    /// Runs `args` with `--json`, expects success, and parses stdout.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let output = self
            .cmd()
            .arg("--json")
            .args(args)
            .output()
            .expect("run holdfast");
        assert!(
            output.status.success(),
            "holdfast {args:?} failed with {:?}\nstdout: {}\nstderr: {}",
            output.status.code(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "holdfast {args:?}: stdout is not JSON ({e}): {}",
                String::from_utf8_lossy(&output.stdout)
            )
        })
    }

    /// Runs `args` (human output), expects exit code `code`, and returns stderr.
    pub fn fails(&self, args: &[&str], code: i32) -> String {
        let output = self.cmd().args(args).output().expect("run holdfast");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(
            output.status.code(),
            Some(code),
            "holdfast {args:?}: expected exit code {code}\nstdout: {}\nstderr: {stderr}",
            String::from_utf8_lossy(&output.stdout)
        );
        assert!(
            !stderr.contains("panicked"),
            "holdfast {args:?} panicked: {stderr}"
        );
        stderr
    }

    /// Runs `args` (human output), expects success, and returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let output = self.cmd().args(args).output().expect("run holdfast");
        assert!(
            output.status.success(),
            "holdfast {args:?} failed with {:?}\nstderr: {}",
            output.status.code(),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

/// The JSON outputs of [`token_happy_path`], by step name, for snapshots.
pub type Steps = Vec<(&'static str, serde_json::Value)>;

fn text(v: &serde_json::Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a JSON string, got {v}"))
}

fn amount(v: &serde_json::Value) -> u128 {
    text(v)
        .parse()
        .unwrap_or_else(|e| panic!("expected a decimal amount, got {v}: {e}"))
}

fn count(v: &serde_json::Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("expected a JSON count, got {v}"))
}

/// Every token and lock command on one fresh database: migrate, fund, list,
/// balance, select, locks, settle busy / confirmed / deleted, sweep. Checks what
/// each step must do and returns the outputs.
pub fn token_happy_path(h: &Holdfast, backend: &str) -> Steps {
    let mut steps = Steps::new();
    let migrated = h.json(&["migrate"]);
    assert_eq!(migrated["backend"], backend);
    let newest = match backend {
        "postgres" => holdfast_adapters_postgres::MIGRATIONS.len(),
        _ => usize::try_from(holdfast_adapters_sqlite::SCHEMA_VERSION).expect("version"),
    };
    assert_eq!(migrated["schema_version"], newest);
    steps.push(("migrate", migrated));

    let fund = ["tokens", "add", "--wallet", "alice", "--type", "CHF"];
    let added = h.json(
        &[
            &fund[..],
            &["--amount", "100", "--tx", "fund", "--count", "4"],
        ]
        .concat(),
    );
    assert_eq!(added["added"], 4);
    assert_eq!(
        added["tokens"],
        serde_json::json!(["fund:0", "fund:1", "fund:2", "fund:3"])
    );
    steps.push(("tokens add", added));
    let again = h.json(
        &[
            &fund[..],
            &["--amount", "100", "--tx", "fund", "--count", "4"],
        ]
        .concat(),
    );
    assert_eq!(
        again["added"], 0,
        "adding identical tokens again adds nothing"
    );
    let minted = h.json(&[&fund[..], &["--amount", "0x32"]].concat());
    assert_eq!(minted["amount"], "50");
    assert!(text(&minted["tx"]).starts_with("mint-"), "{minted}");
    steps.push(("tokens add (fresh tx)", minted));

    let balance = h.json(&["tokens", "balance", "--wallet", "alice", "--type", "CHF"]);
    assert_eq!(balance["balance"], "450");
    steps.push(("tokens balance", balance));
    let listed = h.json(&["tokens", "list", "--wallet", "alice"]);
    let amounts: Vec<u128> = listed["tokens"]
        .as_array()
        .expect("tokens array")
        .iter()
        .map(|t| amount(&t["amount"]))
        .collect();
    assert_eq!(amounts, [50, 100, 100, 100, 100], "ascending, all unspent");
    steps.push(("tokens list", listed));

    let selected = h.json(&[
        "select", "--wallet", "alice", "--type", "CHF", "--amount", "120", "--tx", "pay-1",
    ]);
    let total = amount(&selected["total"]);
    assert!(total >= 120, "{selected}");
    assert_eq!(amount(&selected["change"]), total - 120);
    let held: Vec<String> = selected["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| text(t).to_owned())
        .collect();
    assert!(!held.is_empty());
    steps.push(("select", selected));

    let locks = h.json(&["locks", "list"]);
    assert_eq!(
        count(&locks["count"]),
        u64::try_from(held.len()).expect("small")
    );
    assert_eq!(locks["leaked"], 0);
    assert!(
        locks["locks"]
            .as_array()
            .expect("locks")
            .iter()
            .all(|l| l["consumer"] == "pay-1")
    );
    steps.push(("locks list", locks));

    let busy = h.json(&["settle", "--tx", "pay-1", "--status", "busy"]);
    assert_eq!(busy["action"], "keep");
    assert_eq!(busy["recorded"], serde_json::Value::Null);
    steps.push(("settle busy", busy));
    let unknown = h.json(&["settle", "--tx", "pay-1", "--status", "unknown"]);
    assert_eq!(unknown["action"], "keep");
    let still = h.json(&["locks", "list"]);
    assert_eq!(
        count(&still["count"]),
        u64::try_from(held.len()).expect("small"),
        "busy and unknown keep the locks"
    );

    let confirmed = h.json(&["settle", "--tx", "pay-1", "--status", "confirmed"]);
    assert_eq!(confirmed["action"], "release_all");
    assert_eq!(confirmed["recorded"], "confirmed");
    let mut spent: Vec<String> = confirmed["spent"]
        .as_array()
        .expect("spent")
        .iter()
        .map(|t| text(t).to_owned())
        .collect();
    spent.sort();
    let mut expected = held.clone();
    expected.sort();
    assert_eq!(
        spent, expected,
        "confirmed spends exactly the tokens the tx held"
    );
    steps.push(("settle confirmed", confirmed));
    assert_eq!(h.json(&["locks", "list"])["count"], 0);
    let after = h.json(&["tokens", "balance", "--wallet", "alice", "--type", "CHF"]);
    assert_eq!(amount(&after["balance"]), 450 - total);

    let second = h.json(&[
        "select", "--wallet", "alice", "--type", "CHF", "--amount", "100", "--tx", "pay-2",
    ]);
    let second_held = second["tokens"].as_array().expect("tokens").len();
    let deleted = h.json(&["settle", "--tx", "pay-2", "--status", "deleted"]);
    assert_eq!(deleted["action"], "release_all");
    assert_eq!(
        count(&deleted["released"]),
        u64::try_from(second_held).expect("small")
    );
    assert_eq!(deleted["spent"], serde_json::json!([]));
    steps.push(("settle deleted", deleted));
    let unchanged = h.json(&["tokens", "balance", "--wallet", "alice", "--type", "CHF"]);
    assert_eq!(
        amount(&unchanged["balance"]),
        450 - total,
        "deleted spends nothing"
    );

    let swept = h.json(&["locks", "sweep"]);
    assert_eq!(swept["leader"], true);
    assert_eq!(swept["remaining"], 0);
    steps.push(("locks sweep", swept));
    steps
}

/// Runs `args` with `--json`, expects exit code `code`, and parses stderr.
pub fn json_error(h: &Holdfast, args: &[&str], code: i32) -> serde_json::Value {
    json_with(h, &[], args, code)
}

/// Every queue command on one fresh database: ingest (and its dedup), process
/// (publish), a duplicate process (a hold until the build's first heartbeat, exit
/// 1; an ack after it), a hold while the slot is taken (exit 1), show, outcome,
/// process again, dead letter. Checks what each step must do and returns the
/// outputs.
pub fn queue_happy_path(h: &Holdfast) -> Steps {
    let mut steps = Steps::new();
    let ingested = h.json(&["queue", "ingest", "--queue", "ci/main", "--uri", "rev-a"]);
    assert_eq!(ingested["created"], true);
    assert_eq!(ingested["request"]["id"], "request/ci/main/1");
    assert_eq!(ingested["request"]["state"], "accepted");
    assert_eq!(ingested["reply"]["kind"], "ack");
    steps.push(("queue ingest", ingested));
    let again = h.json(&["queue", "ingest", "--queue", "ci/main", "--uri", "rev-a"]);
    assert_eq!(again["created"], false, "ingest dedups on queue and uri");
    assert_eq!(again["request"]["id"], "request/ci/main/1");

    let published = h.json(&["queue", "process", "--request", "request/ci/main/1"]);
    assert_eq!(published["reply"]["kind"], "publish");
    assert_eq!(published["reply"]["generation"], 1);
    assert_eq!(published["reply"]["strategy"], "full");
    assert_eq!(published["request"]["state"], "processing");
    steps.push(("queue process", published));
    // A duplicate delivery of a live publication publishes nothing. Before the
    // build's first heartbeat it holds until the publication would go quiet (the
    // delivery that published may have died before handing the build over).
    let mut unconfirmed = json_error(
        h,
        &["queue", "process", "--request", "request/ci/main/1"],
        1,
    );
    let reply = &unconfirmed["error"]["reply"];
    assert_eq!(
        (&reply["kind"], &reply["paused"], &reply["why"]),
        (&"hold".into(), &false.into(), &"unconfirmed".into()),
        "{unconfirmed}"
    );
    assert_eq!(reply["generation"], 1, "{unconfirmed}");
    // Until the publication would go quiet: within the default 60 s resume_after.
    let delay = reply["delay_ms"].as_u64().unwrap_or_default();
    assert!((1..=60_000).contains(&delay), "{unconfirmed}");
    // The delay depends on the time the hold was answered: redacted for the
    // snapshot.
    unconfirmed["error"]["reply"]["delay_ms"] = "[delay]".into();
    let message = unconfirmed["error"]["message"].as_str().unwrap_or_default();
    unconfirmed["error"]["message"] = message
        .replace(&format!("after {delay} ms"), "after [delay] ms")
        .into();
    steps.push(("queue process (unconfirmed, stderr)", unconfirmed));
    let said = h.fails(&["queue", "process", "--request", "request/ci/main/1"], 1);
    assert!(
        said.contains(
            "request/ci/main/1: hold: generation 1 of its build was published and has not heartbeated yet; redeliver after "
        ) && !said.contains("every slot is taken"),
        "{said}"
    );
    // Once the build heartbeated, a duplicate is acked.
    h.json(&[
        "queue",
        "heartbeat",
        "--request",
        "request/ci/main/1",
        "--generation",
        "1",
    ]);
    let duplicate = h.json(&["queue", "process", "--request", "request/ci/main/1"]);
    assert_eq!(duplicate["reply"]["kind"], "ack", "{duplicate}");
    assert_eq!(duplicate["request"]["state"], "processing", "{duplicate}");

    let second = h.json(&["queue", "ingest", "--queue", "ci/main", "--uri", "rev-b"]);
    assert_eq!(second["request"]["id"], "request/ci/main/2");
    let held = json_error(
        h,
        &["queue", "process", "--request", "request/ci/main/2"],
        1,
    );
    assert_eq!(held["error"]["class"], "refused");
    assert_eq!(held["error"]["reply"]["kind"], "hold");
    assert_eq!(held["error"]["reply"]["why"], "full", "{held}");
    assert!(
        held["error"]["reply"]["delay_ms"]
            .as_u64()
            .is_some_and(|d| d > 0),
        "{held}"
    );
    steps.push(("queue process (hold, stderr)", held));

    let shown = h.json(&["queue", "show", "--queue", "ci/main"]);
    assert_eq!(shown["latest_request_id"], "request/ci/main/2");
    assert_eq!(
        owners_brief(&shown["owners"]),
        serde_json::json!([{"request": "request/ci/main/1", "state": "processing", "live": true}])
    );
    let owner = &shown["owners"][0];
    assert_eq!(
        (&owner["generation"], &owner["quiet"], &owner["expiring"]),
        (&1.into(), &false.into(), &false.into()),
        "{owner}"
    );
    assert!(owner["published_at"].is_string(), "{owner}");
    assert_eq!(shown["not_live_owners"], 0);
    assert_eq!(shown["requests"].as_array().map(Vec::len), Some(2));
    steps.push(("queue show", shown));

    let finished = h.json(&[
        "queue",
        "outcome",
        "--request",
        "request/ci/main/1",
        "--status",
        "succeeded",
    ]);
    assert_eq!(finished["reply"]["kind"], "ack");
    assert_eq!(finished["request"]["state"], "succeeded");
    steps.push(("queue outcome", finished));
    let admitted = h.json(&["queue", "process", "--request", "request/ci/main/2"]);
    assert_eq!(admitted["reply"]["kind"], "publish");

    let dead = h.json(&["queue", "dead-letter", "--request", "request/ci/main/2"]);
    assert_eq!(dead["reply"]["kind"], "ack");
    assert_eq!(dead["request"]["state"], "failed");
    steps.push(("queue dead-letter", dead));
    let empty = h.json(&["queue", "show", "--queue", "ci/main"]);
    assert_eq!(
        empty["owners"],
        serde_json::json!([]),
        "no slot is left owned"
    );
    assert_eq!(
        empty["last_green"],
        serde_json::json!({"uri": "rev-a", "request_id": "request/ci/main/1"}),
        "the succeeded outcome recorded the last green; the dead-lettered one did not"
    );
    steps
}

/// Checks a demo summary (`holdfast --json demo`): every select locked its tokens
/// without a double claim, settlement left no lock and spent exactly the confirmed
/// tokens, and admission went through the crash, the redelivery and the hold and
/// left no slot owner.
pub fn check_demo(summary: &serde_json::Value, backend: &str) {
    assert_eq!(summary["database"]["backend"], backend, "{summary}");
    assert_eq!(summary["database"]["replicas"], 3);
    assert_eq!(summary["funding"]["balance"], "12800");
    let selects = &summary["selects"];
    assert_eq!(selects["concurrent"], 32);
    assert_eq!(selects["locked"], 32, "{selects}");
    assert_eq!(selects["tokens_locked"], 64, "{selects}");
    assert_eq!(selects["double_claims"], false);
    let settlement = &summary["settlement"];
    assert_eq!(settlement["locks_before"], 64);
    assert_eq!(settlement["confirmed"], 16);
    assert_eq!(settlement["deleted"], 16);
    assert_eq!(settlement["tokens_spent"], 32);
    assert_eq!(settlement["locks_released"], 32);
    assert_eq!(settlement["locks_after"], 0);
    assert_eq!(settlement["balance_after"], "10400");
    assert_eq!(settlement["paid"], "2400");
    let admission = &summary["admission"];
    assert_eq!(admission["owners_after"], serde_json::json!([]));
    let steps = admission["steps"].as_array().expect("steps");
    let kinds: Vec<&str> = steps
        .iter()
        .map(|s| s["reply"]["kind"].as_str().unwrap_or("crash"))
        .collect();
    assert_eq!(
        kinds,
        [
            "ack", "crash", "publish", "ack", "hold", "ack", "publish", "ack"
        ],
        "{admission}"
    );
    // The crash left the claim written and the request accepted; the redelivery resumed it.
    assert_eq!(steps[1]["state"], "accepted");
    assert_eq!(
        steps[1]["owners"],
        serde_json::json!(["request/demo/main/1"])
    );
    assert_eq!(steps[2]["state"], "processing");
}

/// Runs `locks sweep` with a lease of 1 ms once the lease has run out for every
/// lock taken before this call (slow finality), and returns its JSON.
fn sweep_with_expired_leases(h: &Holdfast) -> serde_json::Value {
    // sleep: real processes cannot share a paused clock: wait out the 1 ms lease.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let output = h
        .cmd()
        .env("HOLDFAST_LEASE_EXPIRY_MS", "1")
        .args(["--json", "locks", "sweep"])
        .output()
        .expect("run holdfast");
    assert!(output.status.success(), "locks sweep failed: {output:?}");
    serde_json::from_slice(&output.stdout).expect("sweep JSON")
}

/// The selected token ids of a `select` output.
fn selected_tokens(selected: &serde_json::Value) -> Vec<String> {
    selected["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| text(t).to_owned())
        .collect()
}

/// A confirmed spend is never lost: a lock swept before its transaction confirms
/// is spent anyway, and a second transaction that locked the swept token gets a
/// double-spend error (exit 1) that changes nothing.
pub fn nothing_lost_after_the_sweep(h: &Holdfast) {
    let add = |wallet: &str| {
        h.json(&[
            "tokens", "add", "--wallet", wallet, "--type", "CHF", "--amount", "10", "--count", "1",
        ])
    };
    let select = |wallet: &str, tx: &str| {
        h.json(&[
            "select", "--wallet", wallet, "--type", "CHF", "--amount", "5", "--tx", tx,
        ])
    };
    let balance = |wallet: &str| {
        let b = h.json(&["tokens", "balance", "--wallet", wallet, "--type", "CHF"]);
        amount(&b["balance"])
    };
    let spendable = |wallet: &str| {
        let listed = h.json(&["tokens", "list", "--wallet", wallet]);
        listed["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .filter(|t| t["spent_by"].is_null())
            .count()
    };

    // Slow finality: t1's lease runs out before it confirms.
    add("a");
    let t1 = select("a", "t1");
    let swept = sweep_with_expired_leases(h);
    assert_eq!(swept["expired"], 1, "{swept}");
    let confirmed = h.json(&["settle", "--tx", "t1", "--status", "confirmed"]);
    assert_eq!(confirmed["spent"], t1["tokens"], "the swept token is spent");
    assert_eq!(spendable("a"), 0, "the token is spent");
    assert_eq!(balance("a"), 0);
    let refused = json_error(
        h,
        &[
            "select", "--wallet", "a", "--type", "CHF", "--amount", "5", "--tx", "t2",
        ],
        1,
    );
    assert!(
        text(&refused["error"]["message"]).contains("insufficient funds"),
        "{refused}"
    );

    // t2 locks the swept token before t1 confirms: t1 spends it, t2's Confirmed is
    // a double spend and changes nothing.
    add("b");
    let t3 = select("b", "t3");
    sweep_with_expired_leases(h);
    let t4 = select("b", "t4");
    assert_eq!(
        selected_tokens(&t3),
        selected_tokens(&t4),
        "the same token twice"
    );
    h.json(&["settle", "--tx", "t3", "--status", "confirmed"]);
    let locks_before = h.json(&["locks", "list"]);
    let message = h.fails(&["settle", "--tx", "t4", "--status", "confirmed"], 1);
    assert!(
        message.contains("double spend")
            && message.contains("t3")
            && message.contains(&selected_tokens(&t3)[0]),
        "{message}"
    );
    let mut locks_after = h.json(&["locks", "list"]);
    let mut locks_before = locks_before;
    for locks in [&mut locks_before, &mut locks_after] {
        locks["now"] = serde_json::Value::Null;
        for lock in locks["locks"].as_array_mut().expect("locks") {
            lock["age_ms"] = serde_json::Value::Null;
        }
    }
    assert_eq!(locks_after, locks_before, "nothing changed");
    assert_eq!(balance("b"), 0);
}

/// Runs `args` with `--json` and `env`, expects exit code `code`, and parses stdout
/// (on success) or stderr (on failure, when stdout must be empty).
pub fn json_with(
    h: &Holdfast,
    env: &[(&str, &str)],
    args: &[&str],
    code: i32,
) -> serde_json::Value {
    let mut cmd = h.cmd();
    for (key, value) in env {
        cmd.env(key, value);
    }
    let output = cmd.arg("--json").args(args).output().expect("run holdfast");
    assert_eq!(
        output.status.code(),
        Some(code),
        "holdfast {args:?}: expected exit code {code}\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = if code == 0 {
        &output.stdout
    } else {
        assert!(
            output.stdout.is_empty(),
            "a failed command prints nothing on stdout"
        );
        &output.stderr
    };
    serde_json::from_slice(text).unwrap_or_else(|e| {
        panic!(
            "holdfast {args:?}: output is not JSON ({e}): {}",
            String::from_utf8_lossy(text)
        )
    })
}

/// The slot operations of a CI team on one fresh database: pause a queue
/// (`set-limit --max 0`: the head holds, exit 1, saying paused), resume it
/// (`--max 1`: the head is admitted), heartbeat an owner (exit 0) and a finished
/// request (exit 1), reconcile (nothing to prune), and prune old requests
/// (`--older-than 0s` keeps the head and the last green).
pub fn queue_slot_operations(h: &Holdfast) -> Steps {
    let mut steps = Steps::new();
    let q = ["--queue", "ops/main"];
    let ingest = |uri: &str| h.json(&["queue", "ingest", "--queue", "ops/main", "--uri", uri]);
    ingest("rev-a");
    h.json(&["queue", "process", "--request", "request/ops/main/1"]);
    h.json(&[
        "queue",
        "outcome",
        "--request",
        "request/ops/main/1",
        "--status",
        "succeeded",
    ]);
    ingest("rev-b");
    h.json(&["queue", "dead-letter", "--request", "request/ops/main/2"]);
    ingest("rev-c");

    let paused = h.json(&[&["queue", "set-limit"][..], &q, &["--max", "0"]].concat());
    assert_eq!(paused["max_concurrent"], 0);
    assert_eq!(paused["paused"], true);
    steps.push(("queue set-limit 0", paused));
    let held = json_error(
        h,
        &["queue", "process", "--request", "request/ops/main/3"],
        1,
    );
    assert_eq!(held["error"]["reply"]["kind"], "hold", "{held}");
    assert_eq!(held["error"]["reply"]["paused"], true, "{held}");
    assert_eq!(held["error"]["reply"]["why"], "paused", "{held}");
    let said = h.fails(&["queue", "process", "--request", "request/ops/main/3"], 1);
    assert!(said.contains("the queue is paused"), "{said}");
    let resumed = h.json(&[&["queue", "set-limit"][..], &q, &["--max", "1"]].concat());
    assert_eq!(
        (resumed["max_concurrent"].clone(), resumed["paused"].clone()),
        (1.into(), false.into())
    );
    let admitted = h.json(&["queue", "process", "--request", "request/ops/main/3"]);
    assert_eq!(admitted["reply"]["kind"], "publish");
    assert_eq!(admitted["reply"]["generation"], 1);

    let beat = h.json(&[
        "queue",
        "heartbeat",
        "--request",
        "request/ops/main/3",
        "--generation",
        "1",
    ]);
    assert_eq!(beat["request"], "request/ops/main/3");
    assert_eq!(beat["generation"], 1);
    assert!(beat["lease_expires_at"].is_string(), "{beat}");
    let unknown = json_error(
        h,
        &[
            "queue",
            "heartbeat",
            "--request",
            "request/ops/main/3",
            "--generation",
            "2",
        ],
        1,
    );
    assert!(
        unknown["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("generation 2 was never published: the last one is 1")),
        "{unknown}"
    );
    // Generation 0 is a build published before generations (see
    // `queue_backfill_adds_processing_requests_to_the_owners`): accepted, but
    // stale for an owner that published generation 1 since.
    let zero = h.fails(
        &[
            "queue",
            "heartbeat",
            "--request",
            "request/ops/main/3",
            "--generation",
            "0",
        ],
        1,
    );
    assert!(
        zero.contains(
            "request/ops/main/3: generation 0 is stale: a newer generation 1 was published; stop this build"
        ),
        "{zero}"
    );
    let stop = json_error(
        h,
        &[
            "queue",
            "heartbeat",
            "--request",
            "request/ops/main/1",
            "--generation",
            "1",
        ],
        1,
    );
    assert!(
        stop["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("owns no build slot: it is succeeded")),
        "{stop}"
    );
    steps.push(("queue heartbeat (not an owner, stderr)", stop));

    let reconciled = h.json(&[&["queue", "reconcile"][..], &q].concat());
    assert_eq!(reconciled["pruned"], serde_json::json!([]));
    steps.push(("queue reconcile (nothing)", reconciled));

    let pruned = h.json(&[&["queue", "prune"][..], &q, &["--older-than", "0s"]].concat());
    // 1 is the last green, 3 the head (and processing): only the dead-lettered 2 goes.
    assert_eq!(pruned["deleted"], 1, "{pruned}");
    steps.push(("queue prune", pruned));
    let shown = h.json(&[&["queue", "show"][..], &q].concat());
    let ids: Vec<&str> = shown["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(ids, ["request/ops/main/1", "request/ops/main/3"]);
    let bad = h.fails(
        &[&["queue", "prune"][..], &q, &["--older-than", "7 days"]].concat(),
        2,
    );
    assert!(bad.contains("expected a whole number and a unit"), "{bad}");
    let bad = h.fails(
        &[&["queue", "set-limit"][..], &q, &["--max", "2000000"]].concat(),
        2,
    );
    assert!(bad.contains("expected 0 (pause) to 1000000"), "{bad}");
    let missing = h.fails(&["queue", "set-limit", "--queue", "nope", "--max", "1"], 2);
    assert!(missing.contains("no queue \"nope\""), "{missing}");
    steps
}

/// A lost build outcome does not wedge the queue: with a 1 s slot lease, an
/// admitted request that sends no heartbeat for 1.5 s is failed with
/// `slot_lease_expired` by `queue reconcile`, and the next head is admitted.
pub fn queue_lease_expiry(h: &Holdfast) {
    let lease = [("HOLDFAST_SLOT_LEASE_MS", "1000")];
    let step = |args: &[&str]| json_with(h, &lease, args, 0);
    step(&["queue", "ingest", "--queue", "lease", "--uri", "rev-1"]);
    let admitted = step(&["queue", "process", "--request", "request/lease/1"]);
    assert_eq!(admitted["reply"]["kind"], "publish");
    step(&["queue", "ingest", "--queue", "lease", "--uri", "rev-2"]);
    // sleep: the 1 s slot lease must run out; real processes share no paused clock.
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    let reconciled = step(&["queue", "reconcile", "--queue", "lease"]);
    assert_eq!(
        reconciled["pruned"],
        serde_json::json!([{"request": "request/lease/1", "why": "lease_expired", "state": "failed"}])
    );
    let shown = step(&["queue", "show", "--queue", "lease"]);
    assert_eq!(shown["owners"], serde_json::json!([]));
    assert_eq!(shown["requests"][0]["state"], "failed");
    assert_eq!(shown["requests"][0]["reason"], "slot_lease_expired");
    let next = step(&["queue", "process", "--request", "request/lease/2"]);
    assert_eq!(next["reply"]["kind"], "publish");
    // The lost build's heartbeat now says stop (exit 1).
    let stop = json_with(
        h,
        &lease,
        &[
            "queue",
            "heartbeat",
            "--request",
            "request/lease/1",
            "--generation",
            "1",
        ],
        1,
    );
    assert_eq!(stop["error"]["class"], "refused");
}

/// A publication that goes quiet is published again with the next generation:
/// with `resume_after` 300 ms, a second `queue process` of a live publication
/// publishes nothing (it holds until the publication would go quiet, exit 1);
/// once no heartbeat came for 300 ms it publishes generation 2, generation 1's
/// heartbeat is told that a newer generation was published (exit 1), and
/// generation 2's heartbeat extends the lease.
pub fn queue_republish(h: &Holdfast) -> Steps {
    let mut steps = Steps::new();
    let quick = [("HOLDFAST_RESUME_AFTER_MS", "300")];
    let step = |args: &[&str]| json_with(h, &quick, args, 0);
    let id = "request/again/1";
    step(&["queue", "ingest", "--queue", "again", "--uri", "rev-1"]);
    let first = step(&["queue", "process", "--request", id]);
    assert_eq!(first["reply"]["generation"], 1, "{first}");
    let duplicate = json_with(h, &quick, &["queue", "process", "--request", id], 1);
    let reply = &duplicate["error"]["reply"];
    assert_eq!(
        (&reply["kind"], &reply["why"], &reply["generation"]),
        (&"hold".into(), &"unconfirmed".into(), &1.into()),
        "{duplicate}"
    );
    assert!(
        reply["delay_ms"]
            .as_u64()
            .is_some_and(|d| (1..=300).contains(&d)),
        "{duplicate}"
    );
    // sleep: real processes cannot share a paused clock: wait out the 300 ms.
    std::thread::sleep(std::time::Duration::from_millis(400));
    let shown = step(&["queue", "show", "--queue", "again"]);
    assert_eq!(shown["resume_after_ms"], 300, "{shown}");
    assert_eq!(shown["owners"][0]["quiet"], true, "{shown}");
    let human = h
        .cmd()
        .env("HOLDFAST_RESUME_AFTER_MS", "300")
        .args(["queue", "show", "--queue", "again"])
        .output()
        .expect("run holdfast");
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("request/again/1 (processing, generation 1 published at ")
            && human.contains("QUIET: published again on the next delivery"),
        "{human}"
    );
    let again = step(&["queue", "process", "--request", id]);
    assert_eq!(again["reply"]["kind"], "publish", "{again}");
    assert_eq!(again["reply"]["generation"], 2, "{again}");
    steps.push(("queue process (republished)", again));
    let stale = json_with(
        h,
        &quick,
        &["queue", "heartbeat", "--request", id, "--generation", "1"],
        1,
    );
    assert_eq!(stale["error"]["class"], "refused", "{stale}");
    assert_eq!(stale["error"]["current_generation"], 2, "{stale}");
    steps.push(("queue heartbeat (stale, stderr)", stale));
    let said = h.fails(
        &["queue", "heartbeat", "--request", id, "--generation", "1"],
        1,
    );
    assert!(
        said.contains(
            "request/again/1: generation 1 is stale: a newer generation 2 was published; stop this build"
        ),
        "{said}"
    );
    let beat = step(&["queue", "heartbeat", "--request", id, "--generation", "2"]);
    assert_eq!(beat["generation"], 2, "{beat}");
    let shown = step(&["queue", "show", "--queue", "again"]);
    let owner = &shown["owners"][0];
    assert_eq!(
        (&owner["generation"], &owner["quiet"]),
        (&2.into(), &false.into()),
        "{owner}"
    );
    steps
}

/// The slot owners of a `queue show` without their times: `[{"request", "state", "live"}]`.
pub fn owners_brief(owners: &serde_json::Value) -> serde_json::Value {
    owners
        .as_array()
        .expect("owners")
        .iter()
        .map(|o| serde_json::json!({"request": o["request"], "state": o["state"], "live": o["live"]}))
        .collect()
}

/// Runs `queue work` with `--json` and `args`, expects success, and splits its
/// output: one JSON publication per line, then the summary line.
pub fn work_json(h: &Holdfast, args: &[&str]) -> (Vec<serde_json::Value>, serde_json::Value) {
    let output = h
        .cmd()
        .args(["--json", "queue", "work"])
        .args(args)
        .output()
        .expect("run holdfast");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "queue work {args:?} failed with {:?}\nstdout: {stdout}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    let mut lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("queue work: a line is not JSON ({e}): {line:?}"))
        })
        .collect();
    let summary = lines.pop().expect("a summary line");
    assert!(summary["deliveries"].is_object(), "{summary}");
    assert!(lines.iter().all(|l| l["request"].is_string()), "{stdout}");
    (lines, summary)
}

/// `queue work` admits what the store holds: of three ingested revisions the head
/// is published and the older two superseded; a fourth is held at the closed gate
/// (one slot); after the first build's outcome a second run publishes it. Each
/// publication is its own line, the summary the last one.
pub fn queue_work(h: &Holdfast) {
    for uri in ["w-1", "w-2", "w-3"] {
        h.json(&["queue", "ingest", "--queue", "work", "--uri", uri]);
    }
    let (published, summary) = work_json(h, &["--queue", "work", "--workers", "3"]);
    assert_eq!(
        published,
        [
            serde_json::json!({"request": "request/work/3", "generation": 1, "strategy": "full", "base": null})
        ],
        "{summary}"
    );
    assert_eq!(
        (
            &summary["published"],
            &summary["republished"],
            &summary["stopped"]
        ),
        (&1.into(), &0.into(), &"idle".into()),
        "{summary}"
    );
    let shown = h.json(&["queue", "show", "--queue", "work"]);
    let states: Vec<&str> = shown["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .filter_map(|r| r["state"].as_str())
        .collect();
    assert_eq!(states, ["superseded", "superseded", "processing"]);
    h.json(&["queue", "ingest", "--queue", "work", "--uri", "w-4"]);
    let (published, held) = work_json(h, &["--queue", "work"]);
    assert_eq!(published, Vec::<serde_json::Value>::new(), "{held}");
    assert!(
        held["deliveries"]["held"].as_u64().is_some_and(|n| n >= 1),
        "{held}"
    );
    h.json(&[
        "queue",
        "outcome",
        "--request",
        "request/work/3",
        "--status",
        "succeeded",
    ]);
    let human = h.ok(&["queue", "work", "--queue", "work"]);
    let lines: Vec<&str> = human.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some("publish generation 1 of the full build of request/work/4"),
        "{human}"
    );
    assert!(
        lines.get(1).is_some_and(|l| l.starts_with(
            "1 worker(s) on work: nothing left to admit; published 1 build(s) (0 again, with a newer generation); deliveries: "
        )),
        "{human}"
    );
    let bad = h.fails(&["queue", "work", "--queue", "work", "--workers", "0"], 2);
    assert!(bad.contains("expected 1 to 64"), "{bad}");
    let missing = h.fails(&["queue", "work", "--queue", "nope"], 2);
    assert!(missing.contains("no queue \"nope\""), "{missing}");
}
