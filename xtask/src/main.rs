//! Project automation, run as `cargo xtask <task>` (alias in `.cargo/config.toml`).
//!
//! Each task is one module with a `run` function; `main` only dispatches. CI runs
//! exactly `cargo xtask ci` (see `.ci/run`), so what passes here passes there.
//!
//! Adding a task (`demo`, `bench`, `fuzz`, ...): write `src/<task>.rs` with
//! `pub fn run(args: &[String]) -> Result<(), Error>`, declare the module below,
//! add a line to [`TASKS`] and an arm to [`dispatch`]. Run commands through
//! [`process::run`] so they are echoed and their failures become [`Error`]s.

mod bench;
mod browser;
mod ci;
mod demo;
mod error;
mod failover;
mod fuzz;
mod package;
mod postgres;
mod process;
mod readme;
mod testing;
mod tidy;

use std::process::ExitCode;

pub use error::Error;

/// The tasks, with the one-line help shown by `cargo xtask help`.
const TASKS: &[(&str, &str)] = &[
    (
        "ci",
        "fmt --check, clippy -D warnings, the whole test suite, tidy checks",
    ),
    (
        "test [ARGS]",
        "the whole test suite (nextest + doc tests) with a PostgreSQL server; ARGS go to the runner",
    ),
    (
        "failover",
        "a PostgreSQL primary lost mid-run and its standby promoted, sync and async replication: resume time, losses",
    ),
    (
        "fuzz [--seconds N] [TARGET...]",
        "every fuzz target for N s each (default 30): cargo-fuzz if installed, else the proptest fallback",
    ),
    (
        "demo [ARGS]",
        "the scripted tour of `holdfast demo` on a temporary database; ARGS go to it (--json, --keep)",
    ),
    (
        "bench [--quick] [--sqlite-only] [--payments FILE.csv] [--render]",
        "simulator presets on SQLite and PostgreSQL, raw select-cycle limit, wallet scaling, the payment-history replay -> bench/results.json and docs/measurements.md (--render: the page from the existing results.json, nothing run)",
    ),
    (
        "browser [--screenshot FILE.png]",
        "the simulator's HTML report rendered in headless Chromium: charts and figures table present",
    ),
    (
        "readme",
        "the README's Rust examples built in a crate outside the workspace with exactly its dependency block",
    ),
    (
        "package",
        "cargo package (offline, verified) for every publishable crate",
    ),
    ("help", "this list"),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match dispatch(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(args: &[String]) -> Result<(), Error> {
    let (task, rest) = match args.split_first() {
        Some((task, rest)) => (task.as_str(), rest),
        None => ("help", &[][..]),
    };
    match task {
        "bench" => bench::run(rest),
        "browser" => browser::run(rest),
        "ci" => ci::run(rest),
        "readme" => match rest.first() {
            Some(arg) => Err(Error::UnexpectedArgument {
                task: "readme",
                arg: arg.clone(),
            }),
            None => readme::run(),
        },
        "package" => match rest.first() {
            Some(arg) => Err(Error::UnexpectedArgument {
                task: "package",
                arg: arg.clone(),
            }),
            None => package::run(),
        },
        "test" => testing::run(rest),
        "failover" => failover::run(rest),
        "fuzz" => fuzz::run(rest),
        "demo" => demo::run(rest),
        "help" | "-h" | "--help" => {
            print_help();
            Ok(())
        }
        other => {
            print_help();
            Err(Error::UnknownTask(other.to_owned()))
        }
    }
}

fn print_help() {
    println!("usage: cargo xtask <task>\n\ntasks:");
    for (name, help) in TASKS {
        println!("  {name:<12} {help}");
    }
    println!(
        "\nenvironment:\n  DATABASE_URL       use this PostgreSQL server instead of a throwaway cluster\n  \
         HOLDFAST_PG_BIN    directory with initdb/pg_ctl (default: newest /usr/lib/postgresql/*/bin)\n  \
         CI=true            a missing PostgreSQL is an error instead of a loud skip;\n                     \
         a missing Chromium is installed (apt-get) instead of a loud skip"
    );
}
