//! `cargo xtask ci`: what `.ci/run` runs, in order — formatting, clippy with
//! warnings denied (the workspace, then the library with each backend feature
//! alone), `cargo doc` with warnings denied, the README's examples built outside
//! the workspace on its dependency block (see [`crate::readme`]), the whole test suite (see [`crate::testing`]; it includes the
//! fuzz targets' proptest fallback, and the failover tests of `cargo xtask failover`,
//! which start their own primary and standby from the PostgreSQL binaries and
//! fail under `CI=true` without them), the HTML report rendered in headless
//! Chromium (see [`crate::browser`]), `cargo package` of every publishable crate
//! (see [`crate::package`]), the tidy checks (see [`crate::tidy`]). The
//! first failing step stops the run.

use std::time::Instant;

use crate::{Error, browser, process, readme, testing, tidy};

/// The `ci` task.
pub fn run(args: &[String]) -> Result<(), Error> {
    if let Some(arg) = args.first() {
        return Err(Error::UnexpectedArgument {
            task: "ci",
            arg: arg.clone(),
        });
    }
    let started = Instant::now();
    step("fmt", || {
        process::run(process::cargo().args(["fmt", "--all", "--check"]))
    })?;
    step("clippy", || {
        process::run(process::cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            // Lints the test-only failpoints and the crash test that needs them.
            "--features",
            "holdfast/failpoints",
            "--",
            "-D",
            "warnings",
        ]))
    })?;
    step("library features", || {
        // A service imports `holdfast` with one backend: each must build alone,
        // warning-free (what it may not pull is a tidy check).
        for features in ["sqlite", "postgres"] {
            process::run(process::cargo().args([
                "clippy",
                "-p",
                "holdfast",
                "--no-default-features",
                "--features",
                features,
                "--",
                "-D",
                "warnings",
            ]))?;
        }
        Ok(())
    })?;
    step("doc", || {
        process::run(
            process::cargo()
                .args(["doc", "--workspace", "--no-deps"])
                .env("RUSTDOCFLAGS", "-D warnings"),
        )
    })?;
    // The README's examples, outside the workspace, on its dependency block alone.
    step("readme", readme::run)?;
    let summary = step("test", || testing::suite(&[]))?;
    step("browser", || browser::run(&[]))?;
    step("package", crate::package::run)?;
    step("tidy", tidy::run)?;
    eprintln!(
        "xtask ci: all steps passed in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    // Last, so the run closes on the test counts.
    summary.print();
    Ok(())
}

fn step<T>(name: &str, body: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    eprintln!("==> ci: {name}");
    let started = Instant::now();
    let result = body();
    eprintln!(
        "==> ci: {name} {} ({:.0}s)",
        if result.is_ok() { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    result
}
