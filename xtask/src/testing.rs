//! `cargo xtask test`: the whole test suite against a PostgreSQL server.
//!
//! Unit and integration tests run under cargo-nextest when it is installed (one
//! summary line for the workspace), else `cargo test`; doc tests run with
//! `cargo test --doc`. The PostgreSQL tests get `DATABASE_URL` (see [`postgres`]).
//!
//! Every PostgreSQL test appends one line to the file named by `HOLDFAST_PG_TALLY`:
//! `ran <name>` when it ran against the server, `skipped <name>` when it skipped.
//! The summary counts those lines, so "N PostgreSQL tests ran" is measured, not
//! assumed from test names.
//!
//! Two callers, two rules for a skip ([`skip_verdict`]):
//! - [`suite`], the test step of `cargo xtask ci`, fails when any PostgreSQL test
//!   skipped, or when none reported at all (the tally is then not wired up): "every
//!   test ran" is the gate's claim. Without a server it fails at once, before the
//!   tests. `HOLDFAST_ALLOW_PG_SKIPS=1` lets a local run without PostgreSQL pass with
//!   a loud warning; under `CI=true` it is ignored.
//! - [`run`], `cargo xtask test`, only warns: a developer selects tests (`-p`, a
//!   filter) and may have no PostgreSQL; the summary line still counts the skips.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use crate::postgres::{self, Server};
use crate::{Error, process};

/// Environment variable naming the tally file the PostgreSQL tests append to.
pub const TALLY_VAR: &str = "HOLDFAST_PG_TALLY";
/// Set to `1` to let `cargo xtask ci` pass although PostgreSQL tests skipped (a
/// local run without PostgreSQL); ignored under `CI=true`.
pub const ALLOW_SKIPS_VAR: &str = "HOLDFAST_ALLOW_PG_SKIPS";
/// How many skipped tests a refusal names.
const NAMED_SKIPS: usize = 5;

/// What a test run measured.
#[derive(Debug)]
pub struct Summary {
    /// The runner used.
    pub runner: &'static str,
    /// Whether doc tests ran too (not when the caller selected tests).
    pub doc_tests: bool,
    /// PostgreSQL tests that ran against a server.
    pub pg_ran: usize,
    /// PostgreSQL tests that skipped for want of a server.
    pub pg_skipped: usize,
    /// The tally as the tests wrote it (`ran <name>` / `skipped <name>` lines).
    pub tally: String,
    /// Where the server came from.
    pub server: String,
    /// Wall time of the whole run, server start and stop included.
    pub seconds: f64,
    /// Test counts of the nextest run, from its JUnit report (none under `cargo test`).
    pub counts: Option<Counts>,
}

/// How many tests of a nextest run passed and failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Tests that passed.
    pub passed: u64,
    /// Tests that failed (or errored).
    pub failed: u64,
}

impl Counts {
    /// The closing line CI readers recognise: `tests: N passed, N failed`.
    pub fn print(&self) {
        eprintln!("tests: {} passed, {} failed", self.passed, self.failed);
    }
}

impl Summary {
    /// Prints the summary block.
    pub fn print(&self) {
        eprintln!(
            "xtask test: {}{} passed in {:.0}s; PostgreSQL tests: {} ran, {} skipped; server: {}",
            self.runner,
            if self.doc_tests { " + doc tests" } else { "" },
            self.seconds,
            self.pg_ran,
            self.pg_skipped,
            self.server
        );
        if self.pg_skipped > 0 {
            eprintln!(
                "xtask test: WARNING: {} PostgreSQL test(s) SKIPPED: no PostgreSQL server",
                self.pg_skipped
            );
        }
        if let Some(counts) = self.counts {
            counts.print();
        }
    }
}

/// The `test` task: `args` are passed to the runner (nextest filters, `-p`, ...).
/// Skipped PostgreSQL tests are a warning here (see the module docs).
pub fn run(args: &[String]) -> Result<(), Error> {
    let started = Instant::now();
    let server = postgres::provide()?;
    measure(args, server, started).map(|summary| summary.print())
}

/// The test step of `cargo xtask ci`: the whole suite, which fails when any
/// PostgreSQL test skipped unless [`ALLOW_SKIPS_VAR`] allows it (see the module docs).
pub fn suite(args: &[String]) -> Result<Summary, Error> {
    let started = Instant::now();
    let allow = skips_allowed();
    let server = postgres::provide()?;
    if let Server::Absent(reason) = &server
        && !allow
    {
        return Err(Error::NoPostgres(format!(
            "{reason}; every PostgreSQL test would skip. {}",
            how_to_allow()
        )));
    }
    let summary = measure(args, server, started)?;
    match skip_verdict(&summary.tally, allow) {
        Ok(None) => Ok(summary),
        Ok(Some(warning)) => {
            eprintln!("xtask test: WARNING: {warning}");
            Ok(summary)
        }
        Err(err) => {
            summary.print();
            Err(err)
        }
    }
}

/// Whether [`ALLOW_SKIPS_VAR`] is `1` outside CI.
fn skips_allowed() -> bool {
    std::env::var(ALLOW_SKIPS_VAR).is_ok_and(|v| v == "1") && !postgres::under_ci()
}

fn how_to_allow() -> String {
    format!(
        "Install PostgreSQL or set DATABASE_URL; to pass without them locally, set \
         {ALLOW_SKIPS_VAR}=1 (ignored under CI=true)"
    )
}

/// What the tally of a `cargo xtask ci` run means: `Ok(None)` when PostgreSQL
/// tests ran and none skipped; `Ok(Some(warning))` when some skipped and
/// `allow_skips` (the local opt-in) lets that pass; an error when some skipped
/// without it, or when no PostgreSQL test reported at all (the tally is broken,
/// so "none skipped" would be unmeasured).
pub fn skip_verdict(tally: &str, allow_skips: bool) -> Result<Option<String>, Error> {
    let (ran, skipped) = read_tally(tally);
    if ran == 0 && skipped.is_empty() {
        return Err(Error::NoPostgres(format!(
            "no PostgreSQL test wrote to {TALLY_VAR}: the skip check cannot measure anything"
        )));
    }
    if skipped.is_empty() {
        return Ok(None);
    }
    let mut named = skipped
        .iter()
        .take(NAMED_SKIPS)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if skipped.len() > NAMED_SKIPS {
        named.push_str(", ...");
    }
    let what = format!(
        "{} PostgreSQL test(s) SKIPPED ({named}), {ran} ran",
        skipped.len()
    );
    if allow_skips {
        Ok(Some(format!("{what}; allowed by {ALLOW_SKIPS_VAR}=1")))
    } else {
        Err(Error::NoPostgres(format!("{what}. {}", how_to_allow())))
    }
}

/// Runs the suite on `server` (provided since `started`) and returns what it
/// measured; the server is removed afterwards, also when a test fails.
fn measure(args: &[String], server: Server, started: Instant) -> Result<Summary, Error> {
    let tally = Tally::create()?;
    let nextest = nextest_available();
    let runner = if nextest {
        "cargo nextest"
    } else {
        "cargo test"
    };

    let mut tests = process::cargo();
    // Run everything even after a failure, so one run reports every failing test.
    if nextest {
        tests.args(["nextest", "run", "--no-fail-fast"]);
    } else {
        tests.args(["test", "--no-fail-fast"]);
    }
    let selects_packages = args
        .iter()
        .any(|a| a == "-p" || a.starts_with("--package") || a.starts_with("-p"));
    if !selects_packages {
        // The admission crash test needs the test-only failpoints of the app
        // (crates/app/tests/admission_crash.rs, `required-features`).
        tests.args(["--workspace", "--features", "holdfast/failpoints"]);
    }
    tests.args(args);
    prepare(&mut tests, &server, &tally);
    // Doc tests first, so the last runner output of the run is nextest's summary.
    let doc_tests = args.is_empty();
    let mut doc = process::cargo();
    doc.args(["test", "--doc", "--workspace"]);
    prepare(&mut doc, &server, &tally);
    let junit = junit_path();
    let _ = std::fs::remove_file(&junit);
    let result = if doc_tests {
        process::run(&mut doc)
    } else {
        Ok(())
    }
    .and_then(|()| process::run(&mut tests));
    let tally_text = tally.read();
    let (pg_ran, skipped) = read_tally(&tally_text);
    let pg_skipped = skipped.len();
    let summary = Summary {
        runner,
        doc_tests,
        pg_ran,
        pg_skipped,
        tally: tally_text,
        server: server.describe(),
        seconds: started.elapsed().as_secs_f64(),
        counts: if nextest { junit_counts(&junit) } else { None },
    };
    drop(server);
    if let Err(err) = result {
        eprintln!("xtask test: FAILED; PostgreSQL tests: {pg_ran} ran, {pg_skipped} skipped");
        if let Some(counts) = summary.counts {
            counts.print();
        }
        return Err(err);
    }
    Ok(summary)
}

/// Where nextest writes the JUnit report (`.config/nextest.toml`).
fn junit_path() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(
            || crate::tidy::workspace_root().join("target"),
            PathBuf::from,
        )
        .join("nextest/default/junit.xml")
}

/// Reads the counts from the `<testsuites tests=".." failures=".." errors="..">`
/// element of a nextest JUnit report.
fn junit_counts(path: &std::path::Path) -> Option<Counts> {
    parse_junit(&std::fs::read_to_string(path).ok()?)
}

fn parse_junit(xml: &str) -> Option<Counts> {
    let start = xml.find("<testsuites")?;
    let element = &xml[start..start + xml[start..].find('>')?];
    let attr = |name: &str| -> Option<u64> {
        let key = format!(" {name}=\"");
        let from = element.find(&key)? + key.len();
        element[from..from + element[from..].find('"')?]
            .parse()
            .ok()
    };
    let tests = attr("tests")?;
    let failed = attr("failures")?.checked_add(attr("errors").unwrap_or(0))?;
    Some(Counts {
        passed: tests.checked_sub(failed)?,
        failed,
    })
}

fn prepare(cmd: &mut Command, server: &Server, tally: &Tally) {
    server.configure(cmd);
    cmd.env(TALLY_VAR, &tally.path);
}

pub fn nextest_available() -> bool {
    process::cargo()
        .args(["nextest", "--version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The tally file, removed on drop.
#[derive(Debug)]
struct Tally {
    path: PathBuf,
}

impl Tally {
    fn create() -> Result<Tally, Error> {
        let path =
            std::env::temp_dir().join(format!("holdfast-pg-tally-{}.txt", std::process::id()));
        std::fs::write(&path, "").map_err(|source| Error::Io {
            action: "creating",
            path: path.clone(),
            source,
        })?;
        Ok(Tally { path })
    }

    /// The lines written by the tests.
    fn read(&self) -> String {
        std::fs::read_to_string(&self.path).unwrap_or_default()
    }
}

/// How many `ran` lines a tally holds, and the names of its `skipped` lines.
fn read_tally(text: &str) -> (usize, Vec<String>) {
    let mut ran = 0;
    let mut skipped = Vec::new();
    for line in text.lines() {
        match line.split_once(char::is_whitespace).unwrap_or((line, "")) {
            ("ran", _) => ran += 1,
            ("skipped", name) => skipped.push(name.trim().to_owned()),
            _ => {}
        }
    }
    (ran, skipped)
}

impl Drop for Tally {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::{ALLOW_SKIPS_VAR, Counts, Error, parse_junit, read_tally, skip_verdict};

    #[test]
    fn junit_counts_come_from_the_testsuites_element() {
        let xml = r#"<?xml version="1.0"?>
<testsuites name="nextest-run" tests="12" failures="2" errors="1" time="1.5">
<testsuite name="a" tests="12" failures="2" errors="1"></testsuite></testsuites>"#;
        assert_eq!(
            parse_junit(xml),
            Some(Counts {
                passed: 9,
                failed: 3
            })
        );
        assert_eq!(parse_junit("<testsuites name=\"x\">"), None);
        assert_eq!(parse_junit("not xml"), None);
    }

    #[test]
    fn tally_counts_ran_and_skipped_lines() {
        let text = "ran pg::claims::window\nskipped pg::sweep\nran pg::queue\n\ngarbage\n";
        assert_eq!(read_tally(text), (2, vec!["pg::sweep".to_owned()]));
    }

    #[test]
    fn a_run_where_every_postgresql_test_ran_passes() {
        let tally = "ran pg::claims::window\nran pg::queue\n";
        assert!(matches!(skip_verdict(tally, false), Ok(None)));
        assert!(matches!(skip_verdict(tally, true), Ok(None)));
    }

    #[test]
    fn a_skipped_postgresql_test_fails_the_gate_and_names_the_opt_in() {
        let tally = "ran pg::queue\nskipped pg::sweep\nskipped fleet::failover\n";
        match skip_verdict(tally, false) {
            Err(Error::NoPostgres(message)) => {
                assert!(
                    message.contains("2 PostgreSQL test(s) SKIPPED"),
                    "{message}"
                );
                assert!(message.contains("pg::sweep, fleet::failover"), "{message}");
                assert!(
                    message.contains(&format!("{ALLOW_SKIPS_VAR}=1")),
                    "{message}"
                );
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_local_opt_in_turns_skips_into_a_warning() {
        let tally = "skipped pg::sweep\n";
        match skip_verdict(tally, true) {
            Ok(Some(warning)) => {
                assert!(
                    warning.contains("1 PostgreSQL test(s) SKIPPED (pg::sweep), 0 ran"),
                    "{warning}"
                );
                assert!(warning.contains(ALLOW_SKIPS_VAR), "{warning}");
            }
            other => panic!("expected a warning, got {other:?}"),
        }
    }

    #[test]
    fn an_empty_tally_is_an_error_even_with_the_opt_in() {
        for allow in [false, true] {
            assert!(matches!(
                skip_verdict("\n", allow),
                Err(Error::NoPostgres(_))
            ));
        }
    }
}
