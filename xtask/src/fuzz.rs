//! `cargo xtask fuzz [--seconds N] [TARGET...]`: every fuzz target of `fuzz/`
//! (quantity, request_id, config, selection), each for about N seconds (default 30).
//!
//! With cargo-fuzz installed the targets run under libFuzzer (`cargo fuzz run`,
//! `--sanitizer none` on a stable toolchain, which has no sanitizers); without it
//! they run under the proptest fallback (`fuzz/tests/fallback.rs`), which calls the
//! same target functions, so nothing needs installing. The fuzz crate is a member
//! of the workspace, so the normal test run (and so CI) runs the fallback with a
//! fixed number of cases per target.

use std::process::{Command, Stdio};

use crate::{Error, process, tidy};

/// The targets, as named in `fuzz/Cargo.toml` and `fuzz/tests/fallback.rs`.
pub const TARGETS: &[&str] = &["quantity", "request_id", "config", "selection"];

const DEFAULT_SECONDS: u64 = 30;

/// The `fuzz` task.
pub fn run(args: &[String]) -> Result<(), Error> {
    let (seconds, targets) = parse_args(args)?;
    if cargo_fuzz_available() {
        libfuzzer(seconds, &targets)
    } else {
        eprintln!("xtask fuzz: cargo-fuzz is not installed; running the proptest fallback");
        fallback(seconds, &targets)
    }
}

fn parse_args(args: &[String]) -> Result<(u64, Vec<&'static str>), Error> {
    let mut seconds = DEFAULT_SECONDS;
    let mut targets = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--seconds" {
            let value = rest.next().map(String::as_str).unwrap_or_default();
            seconds =
                value
                    .parse()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| Error::UnexpectedArgument {
                        task: "fuzz",
                        arg: format!("--seconds {value:?} (expected a positive whole number)"),
                    })?;
        } else if let Some(target) = TARGETS.iter().find(|t| **t == arg) {
            targets.push(*target);
        } else {
            return Err(Error::UnexpectedArgument {
                task: "fuzz",
                arg: format!(
                    "{arg} (expected --seconds N or one of {})",
                    TARGETS.join(", ")
                ),
            });
        }
    }
    if targets.is_empty() {
        targets.extend_from_slice(TARGETS);
    }
    Ok((seconds, targets))
}

fn cargo_fuzz_available() -> bool {
    process::cargo()
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn nightly() -> bool {
    Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .arg("--version")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("nightly"))
}

fn libfuzzer(seconds: u64, targets: &[&str]) -> Result<(), Error> {
    let root = tidy::workspace_root();
    let sanitizer = if nightly() { "address" } else { "none" };
    for target in targets {
        let mut cmd = process::cargo();
        cmd.current_dir(&root).args([
            "fuzz",
            "run",
            "--features",
            "libfuzzer",
            "--sanitizer",
            sanitizer,
            target,
            "--",
            &format!("-max_total_time={seconds}"),
        ]);
        process::run(&mut cmd)?;
    }
    Ok(())
}

fn fallback(seconds: u64, targets: &[&str]) -> Result<(), Error> {
    let mut cmd = process::cargo();
    cmd.current_dir(tidy::workspace_root())
        .args(["test", "-p", "holdfast-fuzz", "--test", "fallback", "--"])
        .args(targets.iter().map(|t| format!("fuzz_{t}")))
        .args(["--exact", "--nocapture"])
        .env("HOLDFAST_FUZZ_SECONDS", seconds.to_string());
    process::run(&mut cmd)
}
