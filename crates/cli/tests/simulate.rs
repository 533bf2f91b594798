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
