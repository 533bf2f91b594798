//! The `holdfast` command on SQLite: every command's happy path, the JSON shapes
//! (insta snapshots, with ids and times that vary redacted), leak flags, and the
//! exit codes: 1 refused, 2 bad input, 3 backend error. Errors go to stderr and
//! never as a panic.

use crate::cli_support;

use std::time::Duration;

use cli_support::{
    Holdfast, json_error, nothing_lost_after_the_sweep, queue_happy_path, token_happy_path,
};
use holdfast_adapters_sqlite::SqliteBackend;
use holdfast_domain::{
    Precision, Quantity, QueueName, RequestId, Timestamp, TokenId, TokenType, TxId, TxStatus,
    WalletId,
};
use holdfast_ports::{CasOutcome, NewToken};

fn snapshot_name(step: &str) -> String {
    step.replace([' ', '-'], "_").replace(['(', ')', ','], "")
}

/// Replaces generated mint transaction ids (`mint-<hex>-<hex>`) anywhere in
/// `value` with `[mint tx]`; given ids are kept.
fn redact_mint_ids(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::String(text) => {
            if let Some(start) = text.find("mint-") {
                let end = text[start..].find(':').map_or(text.len(), |i| start + i);
                text.replace_range(start..end, "[mint tx]");
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact_mint_ids),
        serde_json::Value::Object(fields) => fields.values_mut().for_each(redact_mint_ids),
        _ => {}
    }
}

#[test]
fn token_commands_happy_path_and_json_shapes() {
    let h = Holdfast::sqlite();
    for (step, mut output) in token_happy_path(&h, "sqlite") {
        redact_mint_ids(&mut output);
        insta::assert_json_snapshot!(snapshot_name(step), output, {
            ".url" => "[url]",
            ".seed" => "[seed]",
            ".now" => "[now]",
            ".locks[].created_at" => "[time]",
            ".locks[].age_ms" => "[age]",
        });
    }
}

#[test]
fn a_confirmed_spend_survives_the_lease_sweep_and_a_double_spend_is_refused() {
    nothing_lost_after_the_sweep(&Holdfast::sqlite());
}

#[test]
fn queue_commands_happy_path_and_json_shapes() {
    let h = Holdfast::sqlite();
    for (step, output) in queue_happy_path(&h) {
        insta::assert_json_snapshot!(snapshot_name(step), output, {
            ".owners[].claimed_at" => "[time]",
            ".owners[].heartbeat_at" => "[time]",
            ".owners[].lease_expires_at" => "[time]",
            ".owners[].published_at" => "[time]",
        });
    }
}

#[test]
fn a_quiet_publication_is_published_again_and_its_old_build_told_to_stop() {
    let h = Holdfast::sqlite();
    for (step, output) in cli_support::queue_republish(&h) {
        insta::assert_json_snapshot!(snapshot_name(step), output);
    }
}

#[test]
fn queue_slot_operations_pause_heartbeat_reconcile_prune() {
    let h = Holdfast::sqlite();
    for (step, output) in cli_support::queue_slot_operations(&h) {
        insta::assert_json_snapshot!(snapshot_name(step), output);
    }
}

#[test]
fn queue_work_admits_what_the_store_holds() {
    cli_support::queue_work(&Holdfast::sqlite());
}

#[test]
fn a_lost_outcome_expires_with_the_slot_lease_and_the_queue_moves_on() {
    cli_support::queue_lease_expiry(&Holdfast::sqlite());
}

#[test]
fn human_output_is_tables_and_sentences() {
    let h = Holdfast::sqlite();
    h.ok(&[
        "tokens", "add", "--wallet", "w", "--type", "CHF", "--amount", "5", "--tx", "f", "--count",
        "2",
    ]);
    let listed = h.ok(&["tokens", "list", "--wallet", "w"]);
    insta::assert_snapshot!("human_tokens_list", listed);
    let balance = h.ok(&["tokens", "balance", "--wallet", "w", "--type", "CHF"]);
    assert_eq!(
        balance,
        "wallet w holds 10 CHF (spendable, unspent; locked tokens included)\n"
    );
    assert_eq!(h.ok(&["locks", "list"]), "no locks\n");
    let migrated = h.ok(&["migrate"]);
    assert!(
        migrated.starts_with("sqlite database sqlite://")
            && migrated.ends_with(&format!(
                "is at schema version {}\n",
                holdfast_adapters_sqlite::SCHEMA_VERSION
            )),
        "{migrated}"
    );
}

#[test]
fn default_database_is_holdfast_db_in_the_working_directory() {
    let h = Holdfast::sqlite();
    h.bare().arg("migrate").assert().success();
    assert!(h.dir.path().join("holdfast.db").exists());
    // HOLDFAST_DB (read through the configuration) chooses another file.
    h.bare()
        .env("HOLDFAST_DB", "sqlite://other.db")
        .arg("migrate")
        .assert()
        .success();
    assert!(h.dir.path().join("other.db").exists());
    // DATABASE_URL chooses the database when HOLDFAST_DB is unset...
    h.bare()
        .env("DATABASE_URL", "sqlite://from-database-url.db")
        .arg("migrate")
        .assert()
        .success();
    assert!(h.dir.path().join("from-database-url.db").exists());
    // ...and HOLDFAST_DB wins when both are set.
    h.bare()
        .env("DATABASE_URL", "sqlite://not-this.db")
        .env("HOLDFAST_DB", "sqlite://this.db")
        .arg("migrate")
        .assert()
        .success();
    assert!(h.dir.path().join("this.db").exists());
    assert!(!h.dir.path().join("not-this.db").exists());
    // ...and a file that names db_url wins over it, even naming the default.
    std::fs::write(
        h.dir.path().join("holdfast.toml"),
        "db_url = \"sqlite://holdfast.db\"\n",
    )
    .expect("write the file");
    h.bare()
        .env("DATABASE_URL", "sqlite://not-this-either.db")
        .args(["--config", "holdfast.toml", "migrate"])
        .assert()
        .success();
    assert!(!h.dir.path().join("not-this-either.db").exists());
}

#[test]
fn refusals_exit_1() {
    let h = Holdfast::sqlite();
    h.ok(&[
        "tokens", "add", "--wallet", "w", "--type", "CHF", "--amount", "100", "--tx", "f",
    ]);
    let err = h.fails(
        &[
            "select", "--wallet", "w", "--type", "CHF", "--amount", "1000", "--tx", "t",
        ],
        1,
    );
    assert!(
        err.contains("insufficient funds: 100 available, 1000 requested"),
        "{err}"
    );
    let json = json_error(
        &h,
        &[
            "select", "--wallet", "w", "--type", "CHF", "--amount", "1000", "--tx", "t",
        ],
        1,
    );
    insta::assert_json_snapshot!("error_insufficient_funds", json);
    // The same token id with another amount conflicts and writes nothing.
    let err = h.fails(
        &[
            "tokens", "add", "--wallet", "w", "--type", "CHF", "--amount", "7", "--tx", "f",
        ],
        1,
    );
    assert!(err.contains("f:0"), "{err}");
    assert_eq!(
        h.json(&["tokens", "balance", "--wallet", "w", "--type", "CHF"])["balance"],
        "100"
    );
}

#[test]
fn funds_locked_exits_1_and_is_not_insufficient_funds() {
    let h = Holdfast::sqlite();
    h.ok(&[
        "tokens", "add", "--wallet", "w", "--type", "CHF", "--amount", "100", "--tx", "f",
    ]);
    h.ok(&[
        "select", "--wallet", "w", "--type", "CHF", "--amount", "60", "--tx", "first",
    ]);
    let config = h.dir.path().join("fast.toml");
    std::fs::write(&config, "[selection]\nmax_legs = 2\nmax_backoff_ms = 1\n")
        .expect("write config");
    let config = config.display().to_string();
    let err = h.fails(
        &[
            "--config", &config, "select", "--wallet", "w", "--type", "CHF", "--amount", "60",
            "--tx", "second",
        ],
        1,
    );
    assert!(err.contains("funds locked"), "{err}");
    assert!(!err.contains("insufficient"), "{err}");
}

#[test]
fn bad_input_exits_2_naming_the_value() {
    let h = Holdfast::sqlite();
    let add = [
        "tokens", "add", "--wallet", "w", "--type", "CHF", "--amount",
    ];
    for (amount, expected) in [
        ("-5", "signs are not allowed"),
        ("12abc", "is not a decimal digit"),
        ("", "empty"),
        ("0x", "no digits after 0x"),
        ("18446744073709551616", "exceeds the precision"),
    ] {
        let err = h.fails(&[&add[..], &[amount]].concat(), 2);
        assert!(err.contains(expected), "{amount:?}: {err}");
        assert!(err.contains(&format!("{amount:?}")), "{amount:?}: {err}");
    }
    let err = h.fails(
        &[
            "select", "--wallet", "w", "--type", "CHF", "--amount", "0", "--tx", "t",
        ],
        2,
    );
    assert!(err.contains('0'), "{err}");
    let err = h.fails(&["tokens", "list", "--wallet", ""], 2);
    assert!(err.contains("wallet id"), "{err}");
    let err = h.fails(&["queue", "process", "--request", "request/q/x"], 2);
    assert!(err.contains("\"request/q/x\""), "{err}");
    let err = h.fails(&["queue", "process", "--request", "request/q/99"], 2);
    assert!(err.contains("request/q/99"), "{err}");
    let err = h.fails(&["queue", "show", "--queue", "nope"], 2);
    assert!(err.contains("no queue \"nope\""), "{err}");
    let err = h.fails(
        &[
            "tokens", "add", "--wallet", "w", "--type", "T", "--amount", "1", "--tx", "t",
            "--count", "0",
        ],
        2,
    );
    assert!(err.contains("--count 0"), "{err}");
    let err = h.fails(&["tokens", "list", "--wallet", "w", "--limit", "0"], 2);
    assert!(err.contains("--limit 0"), "{err}");

    // Configuration: a missing file, an unknown key, a value out of range.
    let err = h.fails(&["--config", "missing.toml", "migrate"], 2);
    assert!(err.contains("missing.toml"), "{err}");
    std::fs::write(
        h.dir.path().join("bad.toml"),
        "[selection]\nsufficency_window = 3\n",
    )
    .expect("write");
    let err = h.fails(&["--config", "bad.toml", "migrate"], 2);
    assert!(err.contains("sufficency_window"), "{err}");
    let err = h
        .cmd()
        .env("HOLDFAST_PRECISION", "0")
        .arg("migrate")
        .assert()
        .code(2)
        .get_output()
        .stderr
        .clone();
    assert!(String::from_utf8_lossy(&err).contains("precision"));
}

#[test]
fn database_urls_unknown_scheme_2_unreachable_3() {
    let h = Holdfast::sqlite();
    let run = |url: &str, code: i32| -> String {
        let out = h
            .bare()
            .args(["--db", url, "migrate"])
            .output()
            .expect("run holdfast");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(code), "{url}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        stderr
    };
    let err = run("mysql://root:hunter2@db.example/app", 2);
    assert!(err.contains("\"mysql\""), "{err}");
    assert!(!err.contains("hunter2"), "the password leaked: {err}");
    let err = run("sqlite://", 2);
    assert!(err.contains("no file path"), "{err}");

    // A file that is not a database, and a directory that does not exist.
    let junk = h.dir.path().join("junk.db");
    std::fs::write(
        &junk,
        "this is not a SQLite database, only some text to fill a page",
    )
    .expect("write");
    let err = run(&junk.display().to_string(), 3);
    assert!(err.contains("junk.db"), "{err}");
    let missing = h.dir.path().join("no/such/dir/h.db");
    let err = run(&format!("sqlite://{}", missing.display()), 3);
    assert!(err.contains("no/such/dir"), "{err}");

    // Nothing listens on port 1: connecting fails at once, and the password stays hidden.
    let err = run("postgres://app:hunter2@127.0.0.1:1/holdfast", 3);
    assert!(
        err.contains("postgres://app:***@127.0.0.1:1/holdfast"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "the password leaked: {err}");
}

#[test]
fn backend_errors_are_json_under_json() {
    let h = Holdfast::sqlite();
    let out = h
        .bare()
        .args(["--json", "--db", "sqlite:///no/such/dir/h.db", "migrate"])
        .output()
        .expect("run holdfast");
    assert_eq!(out.status.code(), Some(3));
    let err: serde_json::Value = serde_json::from_slice(&out.stderr).expect("JSON on stderr");
    assert_eq!(err["error"]["class"], "backend");
    assert_eq!(err["error"]["exit_code"], 3);
}

fn id(tx: &str, index: u32) -> TokenId {
    TokenId::new(TxId::new(tx).expect("tx"), index)
}

/// Leaks planted through the adapter (they cannot be made with the command, which
/// only goes through the services): a lock older than the lease, a lock of an orphan
/// consumer, a lock of a confirmed consumer, and a slot owner that is not live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diagnostics_flag_leaked_locks_and_owners() {
    let h = Holdfast::sqlite();
    let backend = SqliteBackend::open(&h.url, Default::default())
        .await
        .expect("open");
    let stores = backend.stores();
    let quantity = Quantity::new(10, Precision::default()).expect("10");
    let tokens: Vec<NewToken> = (0..4)
        .map(|i| NewToken {
            id: id("f", i),
            wallet: WalletId::new("w").expect("wallet"),
            token_type: TokenType::new("CHF").expect("type"),
            quantity,
            spendable: true,
        })
        .collect();
    stores.tokens.add_tokens(&tokens).await.expect("add");
    let now = Timestamp::from_millis(
        u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_millis(),
        )
        .expect("millis"),
    );
    let old = now.saturating_sub(Duration::from_secs(3600));
    for (tx, token, at, status) in [
        ("healthy", 0, now, Some(TxStatus::Pending)),
        ("stale", 1, old, None),
        ("orphaned", 2, now, Some(TxStatus::Orphan)),
        ("confirmed", 3, now, Some(TxStatus::Confirmed)),
    ] {
        let consumer = TxId::new(tx).expect("tx");
        stores
            .locks
            .claim(&consumer, &id("f", token), at)
            .await
            .expect("claim");
        if let Some(status) = status {
            stores
                .statuses
                .record_status(&consumer, status, now)
                .await
                .expect("status");
        }
    }
    let queue = QueueName::new("ci/main").expect("queue");
    stores
        .queues
        .create_request(
            &queue,
            &holdfast_domain::RevisionUri::new("rev").expect("uri"),
        )
        .await
        .expect("ingest");
    let mut record = stores
        .queues
        .load_queue(&queue)
        .await
        .expect("load")
        .expect("queue");
    let ghost = RequestId::new(queue.clone(), 42);
    record.owners.insert(
        ghost,
        holdfast_domain::Slot::claimed(holdfast_domain::Timestamp::from_millis(1)),
    );
    let expected = record.version;
    assert_eq!(
        stores
            .queues
            .cas_queue(expected, &record)
            .await
            .expect("cas"),
        CasOutcome::Applied
    );
    drop(stores);
    drop(backend);

    let locks = h.json(&["locks", "list"]);
    let leaks: Vec<(String, serde_json::Value, bool)> = locks["locks"]
        .as_array()
        .expect("locks")
        .iter()
        .map(|l| {
            (
                l["consumer"].as_str().expect("consumer").to_owned(),
                l["leaks"].clone(),
                l["sweepable"].as_bool().expect("sweepable"),
            )
        })
        .collect();
    assert_eq!(locks["count"], 4);
    assert_eq!(locks["leaked"], 3);
    let of = |tx: &str| leaks.iter().find(|(c, _, _)| c == tx).cloned().expect(tx);
    assert_eq!(of("healthy").1, serde_json::json!([]));
    assert_eq!(of("stale").1, serde_json::json!(["older_than_lease"]));
    assert_eq!(of("orphaned").1, serde_json::json!(["consumer_orphan"]));
    assert_eq!(of("confirmed").1, serde_json::json!(["consumer_confirmed"]));
    assert!(!of("healthy").2 && of("stale").2 && of("orphaned").2 && !of("confirmed").2);
    let human = h.ok(&["locks", "list"]);
    assert!(
        human.contains("older than lease") && human.contains("consumer orphan"),
        "{human}"
    );

    let swept = h.json(&["locks", "sweep"]);
    assert_eq!(swept["expired"], 1);
    assert_eq!(swept["released_by_status"], 1);
    assert_eq!(swept["remaining"], 2);

    let shown = h.json(&["queue", "show", "--queue", "ci/main"]);
    assert_eq!(
        cli_support::owners_brief(&shown["owners"]),
        serde_json::json!([{"request": "request/ci/main/42", "state": null, "live": false}])
    );
    assert_eq!(shown["not_live_owners"], 1);
    assert!(
        h.ok(&["queue", "show", "--queue", "ci/main"])
            .contains("NOT LIVE")
    );
}

/// `queue backfill` migrates a queue admitted under an anonymous count: a
/// processing request that owns no slot (as the old binaries left it) joins the
/// owners, published as generation 0 (its build runs already); a second run adds
/// nothing; a missing queue is bad input (exit 2). A process delivery of the
/// adopted owner holds until its build heartbeats with `--generation 0`, then
/// acks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_backfill_adds_processing_requests_to_the_owners() {
    let h = Holdfast::sqlite();
    let ingested = h.json(&["queue", "ingest", "--queue", "ci/main", "--uri", "rev-a"]);
    assert_eq!(ingested["request"]["id"], "request/ci/main/1");
    h.json(&["queue", "ingest", "--queue", "ci/main", "--uri", "rev-b"]);
    let backend = SqliteBackend::open(&h.url, Default::default())
        .await
        .expect("open");
    let stores = backend.stores();
    let id = RequestId::parse("request/ci/main/1").expect("id");
    let mut old = stores
        .queues
        .load_request(&id)
        .await
        .expect("load")
        .expect("request");
    let expected = old.version;
    old.state = holdfast_domain::RequestState::Processing;
    old.plan = Some(holdfast_domain::BuildPlan {
        strategy: holdfast_domain::BuildStrategy::Full,
        base: None,
    });
    old.version = expected.next();
    assert_eq!(
        stores
            .queues
            .cas_request(expected, &old)
            .await
            .expect("cas"),
        CasOutcome::Applied
    );
    drop(stores);
    drop(backend);

    let before = h.json(&["queue", "show", "--queue", "ci/main"]);
    assert_eq!(before["owners"], serde_json::json!([]));
    let backfill = h.json(&["queue", "backfill", "--queue", "ci/main"]);
    insta::assert_json_snapshot!("queue_backfill", backfill);
    let after = h.json(&["queue", "show", "--queue", "ci/main"]);
    assert_eq!(
        cli_support::owners_brief(&after["owners"]),
        serde_json::json!([{"request": "request/ci/main/1", "state": "processing", "live": true}])
    );
    let owner = &after["owners"][0];
    assert_eq!(
        (&owner["generation"], &owner["quiet"]),
        (&0.into(), &false.into()),
        "{owner}"
    );
    let process = ["queue", "process", "--request", "request/ci/main/1"];
    let held = json_error(&h, &process, 1);
    let reply = &held["error"]["reply"];
    assert_eq!(
        (&reply["kind"], &reply["why"], &reply["generation"]),
        (&"hold".into(), &"unconfirmed".into(), &0.into()),
        "{held}"
    );
    let said = h.fails(&process, 1);
    assert!(
        said.contains("hold: generation 0 of its build was published and has not heartbeated yet"),
        "{said}"
    );
    let beat = h.json(&[
        "queue",
        "heartbeat",
        "--request",
        "request/ci/main/1",
        "--generation",
        "0",
    ]);
    assert_eq!(beat["generation"], 0, "{beat}");
    assert_eq!(h.json(&process)["reply"]["kind"], "ack");
    let again = h.json(&["queue", "backfill", "--queue", "ci/main"]);
    assert_eq!(again["added"], serde_json::json!([]));
    assert_eq!(again["reply"]["kind"], "ack");
    assert!(
        h.ok(&["queue", "backfill", "--queue", "ci/main"])
            .contains("nothing added")
    );
    let missing = h.fails(&["queue", "backfill", "--queue", "nope"], 2);
    assert!(missing.contains("nope"), "{missing}");
}
