//! `holdfast demo` on a fresh temporary database (no setup), and on a given one.

use crate::cli_support;

use cli_support::{Holdfast, check_demo};

#[test]
fn demo_runs_with_no_setup() {
    let h = Holdfast::sqlite();
    let output = h
        .bare()
        .args(["--json", "demo"])
        .output()
        .expect("run holdfast");
    assert!(
        output.status.success(),
        "demo failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    check_demo(&summary, "sqlite");
    assert_eq!(summary["database"]["temporary"], true);
    // The temporary database is gone, and nothing was written to the working directory.
    let url = summary["database"]["url"].as_str().expect("url");
    let path = url.trim_start_matches("sqlite://");
    assert!(
        !std::path::Path::new(path).exists(),
        "{path} was left behind"
    );
    assert_eq!(std::fs::read_dir(h.dir.path()).expect("dir").count(), 0);
}

#[test]
fn demo_prints_a_readable_tour() {
    let h = Holdfast::sqlite();
    let text = h.bare().arg("demo").output().expect("run holdfast");
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    for line in [
        "1. funded demo-wallet with 128 tokens of 100 CHF: balance 12800",
        "2. 32 concurrent selects of 150 across 3 replicas: 32 locked (64 tokens)",
        "2400 paid to demo-payee, change returned",
        "locks left: 0; balance 10400",
        "CRASHED after the claim write; state accepted; slot owners: request/demo/main/1",
        "redeliver: process resumes: request/demo/main/1 -> publish generation 1 of the full build",
        "hold: every slot is taken",
        "0 lock(s) left, 0 slot owner(s) left",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
}

#[test]
fn demo_on_a_given_database_needs_it_fresh() {
    let h = Holdfast::sqlite();
    let summary = h.json(&["demo"]);
    check_demo(&summary, "sqlite");
    assert_eq!(summary["database"]["temporary"], false);
    let err = h.fails(&["demo"], 2);
    assert!(
        err.contains("not fresh") && err.contains("demo-wallet"),
        "{err}"
    );
}
