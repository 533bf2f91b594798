//! `holdfast simulate` as a command: the documented JSON, the HTML report and
//! bad input. The simulator's own runs and invariants are tested in its crate
//! (`crates/simulator/tests`).

use assert_cmd::Command;

/// A small hot lineage: demand equals balance, every spend mints its change.
const SMALL_LINEAGE: &str = include_str!("../../simulator/tests/small-lineage.toml");

#[test]
fn the_command_prints_the_documented_json_and_writes_the_report() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("w.toml");
    std::fs::write(
        &file,
        SMALL_LINEAGE
            .replace("count = 60", "count = 20")
            .replace("\"56\"", "\"16\""),
    )
    .expect("write workload");
    let html = dir.path().join("report.html");
    let output = Command::cargo_bin("holdfast")
        .expect("binary")
        .args(["simulate", "--workload"])
        .arg(&file)
        .args(["--raw-limit", "--raw-limit-seconds", "0.2"])
        .args(["--seed", "3", "--json", "--report"])
        .arg(&html)
        .arg("--db")
        .arg(dir.path().join("sim.db"))
        .output()
        .expect("runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(json["workload"], "small-lineage");
    assert_eq!(json["backend"], "sqlite");
    assert_eq!(json["seed"], 3);
    let strategies = json["strategies"].as_array().expect("strategies");
    assert_eq!(strategies.len(), 2);
    for s in strategies {
        for name in [
            "strategy",
            "selects",
            "selects_per_second",
            "spurious_failures",
            "insufficient_funds",
            "lock_attempts_per_select",
            "conflicts_per_select",
            "hottest_token_conflict_share",
            "top_1pct_conflict_share",
            "distinct_tokens_attempted",
            "round_trips_per_select",
            "inputs_per_select",
            "change_share",
            "peak_memory_bytes",
            "locks_left",
        ] {
            assert!(s.get(name).is_some(), "{name} missing in {s}");
        }
        for p in ["p50", "p95", "p99", "max"] {
            assert!(
                s["latency_ms"].get(p).is_some(),
                "latency_ms.{p} missing in {s}"
            );
        }
    }
    for name in [
        "cycles",
        "wall_seconds",
        "cycles_per_second",
        "statements_per_cycle",
        "claims_lost",
        "empty_reads",
        "locks_left",
        "fraction_of_raw_limit",
    ] {
        assert!(
            json["raw_limit"].get(name).is_some(),
            "raw_limit.{name} missing in {}",
            json["raw_limit"]
        );
    }
    let page = std::fs::read_to_string(&html).expect("report written");
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert_eq!(page.matches("<svg").count(), 3, "three charts");
    // The figures are an HTML table, one row per figure of the text table.
    assert_eq!(page.matches("<table").count(), 1, "{page}");
    assert!(
        !page.contains("<pre"),
        "the figures are not preformatted text"
    );
    for figure in ["selects/s", "inputs/select", "change share"] {
        assert!(
            page.contains(&format!("<th scope=\"row\">{figure}</th>")),
            "row {figure} missing"
        );
    }
    assert!(
        !page.contains("http://") || !page.contains("src="),
        "no external assets"
    );
}

#[test]
fn unknown_workloads_are_bad_input() {
    Command::cargo_bin("holdfast")
        .expect("binary")
        .args(["simulate", "--workload", "no-such-preset"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("no-such-preset"));
}

#[test]
fn a_payment_history_replays_as_json_and_a_bad_line_is_bad_input_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("payments.csv");
    std::fs::write(
        &file,
        "0.00000010,0.00001\n0.00000020,0.00001\n-0.00000012,0.00001\n-1,0.00001\n",
    )
    .expect("write history");
    let output = Command::cargo_bin("holdfast")
        .expect("binary")
        .args(["simulate", "--payments"])
        .arg(&file)
        .args(["--seed", "3", "--json", "--db"])
        .arg(dir.path().join("replay.db"))
        .output()
        .expect("runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(
        (json["lines"].as_u64(), json["withdrawals"].as_u64()),
        (Some(4), Some(2))
    );
    let policies = json["policies"].as_array().expect("policies");
    assert_eq!(policies.len(), 6);
    for p in policies {
        // 30 in, 12 paid, the payment of 1 BTC skipped.
        assert_eq!(p["unspent_sats"], 18, "{p}");
        assert_eq!(
            (p["payments"].as_u64(), p["insufficient"].as_u64()),
            (Some(1), Some(1)),
            "{p}"
        );
    }

    std::fs::write(&file, "0.00000010,0.00001\n0.1.2,0.00001\n").expect("write history");
    Command::cargo_bin("holdfast")
        .expect("binary")
        .args(["simulate", "--payments"])
        .arg(&file)
        .assert()
        .code(2)
        .stderr(predicates::str::contains("line 2"));
    Command::cargo_bin("holdfast")
        .expect("binary")
        .args(["simulate", "--payments"])
        .arg(dir.path().join("missing.csv"))
        .assert()
        .code(2)
        .stderr(predicates::str::contains("missing.csv"));
}
