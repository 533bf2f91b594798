//! `cargo xtask demo [ARGS]`: the scripted tour of `holdfast demo` on a fresh,
//! temporary SQLite database (no setup needed); ARGS go to the demo (`--json`,
//! `--keep`, `--db URL`).

use crate::{Error, process};

/// Runs `cargo run -p holdfast -- demo ARGS`.
pub fn run(args: &[String]) -> Result<(), Error> {
    let mut cmd = process::cargo();
    cmd.args(["run", "--quiet", "-p", "holdfast-cli", "--", "demo"])
        .args(args);
    process::run(&mut cmd)
}
