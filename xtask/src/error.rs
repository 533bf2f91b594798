//! The one error type of xtask: every task returns it, `main` prints it.

use std::path::PathBuf;

/// Why a task failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The first argument named no task.
    #[error(
        "unknown task {0:?}; expected one of: ci, test, failover, fuzz, demo, bench, browser, readme, package, help"
    )]
    UnknownTask(String),
    /// A task got an argument it does not take.
    #[error("task {task} takes no argument {arg:?}")]
    UnexpectedArgument {
        /// The task.
        task: &'static str,
        /// The argument.
        arg: String,
    },
    /// A command could not be started.
    #[error("could not start `{command}`: {source}")]
    Spawn {
        /// The command line (no environment, so no secrets).
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// A command ran and failed.
    #[error("`{command}` failed ({status})")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
    },
    /// A command's output was not what we expected.
    #[error("`{command}` printed unexpected output: {detail}")]
    BadOutput {
        /// The command line.
        command: String,
        /// What was wrong.
        detail: String,
    },
    /// A file operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What we were doing.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A page's generated section has no place to go.
    #[error("{path}: {source}")]
    Markers {
        /// The page.
        path: PathBuf,
        /// What is wrong with its markers.
        source: crate::bench::MarkerError,
    },
    /// An input file a task needs is not there.
    #[error("{what} {path} is missing: {hint}")]
    MissingInput {
        /// What the file is.
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// How to provide it.
        hint: &'static str,
    },
    /// An option was given without its value.
    #[error("task {task}: {option} needs a value")]
    MissingValue {
        /// The task.
        task: &'static str,
        /// The option.
        option: &'static str,
    },
    /// PostgreSQL is needed (CI=true) but no server could be provided.
    #[error("no PostgreSQL: {0}")]
    NoPostgres(String),
    /// Chromium is needed (CI=true) but could not be provided.
    #[error("no Chromium: {0}")]
    NoBrowser(String),
    /// The throwaway PostgreSQL cluster did not come up.
    #[error("throwaway PostgreSQL cluster failed: {0}")]
    Cluster(String),
    /// The tidy checks found forbidden dependencies.
    #[error("tidy: {} violation(s):\n  {}", .0.len(), .0.join("\n  "))]
    Tidy(Vec<String>),
    /// `cargo metadata` or `Cargo.lock` could not be understood.
    #[error("cannot read {what}: {detail}")]
    Metadata {
        /// Which input.
        what: &'static str,
        /// What was wrong with it.
        detail: String,
    },
}
