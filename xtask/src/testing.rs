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

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use crate::postgres::{self, Server};
use crate::{Error, process};

/// Environment variable naming the tally file the PostgreSQL tests append to.
pub const TALLY_VAR: &str = "HOLDFAST_PG_TALLY";

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
pub fn run(args: &[String]) -> Result<(), Error> {
    suite(args).map(|summary| summary.print())
}

/// Runs the suite and returns what it measured; the server is provided for the
/// duration of the run and removed afterwards, also when a test fails.
pub fn suite(args: &[String]) -> Result<Summary, Error> {
    let started = Instant::now();
    let server = postgres::provide()?;
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
    let (pg_ran, pg_skipped) = tally.count();
    let summary = Summary {
        runner,
        doc_tests,
        pg_ran,
        pg_skipped,
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

    /// (ran, skipped) lines written by the tests.
    fn count(&self) -> (usize, usize) {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        count_lines(&text)
    }
}

fn count_lines(text: &str) -> (usize, usize) {
    text.lines().fold((0, 0), |(ran, skipped), line| {
        match line.split_whitespace().next() {
            Some("ran") => (ran + 1, skipped),
            Some("skipped") => (ran, skipped + 1),
            _ => (ran, skipped),
        }
    })
}

impl Drop for Tally {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::{Counts, count_lines, parse_junit};

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
        assert_eq!(count_lines(text), (2, 1));
    }
}
