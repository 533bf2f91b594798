//! The `holdfast` command (crate `holdfast-cli`): argument parsing, one module per
//! command group, rendering, and the `simulate` command over the contention simulator (crate
//! `holdfast-simulator`).
//! Commands are thin: they parse and validate input at the edge, call the services
//! of the `holdfast` library (selector, settlement, sweeper, admission) and the
//! ports, and render what they got back. No claim logic lives here.
//!
//! Exit codes: 0 success, 1 a domain refusal, 2 bad input, 3 a backend error
//! (see [`ErrorClass`]). Output goes to stdout; errors, logs and progress to stderr.

// Doc comments of arguments are the command's help text, where `<queue>` is a
// placeholder, not an HTML tag.
#![allow(rustdoc::invalid_html_tags)]

pub mod demo;
pub mod error;
pub mod locks;
pub mod output;
pub mod queue;
pub mod select;
pub mod settle;
pub mod simulate;
pub mod soak;
pub mod tokens;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use serde::Serialize;

pub use error::{CliError, ErrorClass};
pub use output::{Rendered, Report};

use holdfast::backend::{Backend, DEFAULT_DB_URL};
use holdfast::config::Config;

/// Claim scarce shared things (tokens, build slots) from one database, safely.
#[derive(Debug, Parser)]
#[command(
    name = "holdfast",
    version,
    about = "Claim scarce shared things (tokens, build slots) from one database: \
             no false failures, no double claims, no leaked claims.",
    long_about = None,
    after_help = "Exit codes: 0 success, 1 refused (insufficient funds, funds locked, hold, conflict), \
                  2 bad input, 3 backend error.\nLogs go to stderr; set HOLDFAST_LOG (or RUST_LOG), e.g. HOLDFAST_LOG=debug."
)]
pub struct Cli {
    /// Database URL: sqlite://PATH, a plain file path, or postgres://USER@HOST/DB
    /// [env: HOLDFAST_DB; default: the config's db_url, else sqlite://holdfast.db]
    #[arg(
        long,
        global = true,
        value_name = "URL",
        help_heading = "Global options"
    )]
    pub db: Option<String>,

    /// Configuration file (TOML); HOLDFAST_* environment variables override it
    #[arg(
        long,
        global = true,
        env = "HOLDFAST_CONFIG",
        hide_env_values = true,
        value_name = "FILE",
        help_heading = "Global options"
    )]
    pub config: Option<PathBuf>,

    /// Print machine-readable JSON on stdout (and errors as JSON on stderr)
    #[arg(
        long,
        global = true,
        env = "HOLDFAST_JSON",
        hide_env_values = true,
        help_heading = "Global options"
    )]
    pub json: bool,

    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply missing schema migrations (every command also migrates on open)
    Migrate,
    /// Add, list and count tokens
    #[command(subcommand)]
    Tokens(tokens::TokensCommand),
    /// Select and lock tokens of a wallet covering an amount for a transaction
    Select(select::SelectArgs),
    /// Apply a transaction's settlement status to its locks
    Settle(settle::SettleArgs),
    /// List and sweep token locks
    #[command(subcommand)]
    Locks(locks::LocksCommand),
    /// Build-slot admission: ingest, process, outcomes, dead letters, queue state
    #[command(subcommand)]
    Queue(queue::QueueCommand),
    /// A scripted tour on a fresh database (a temporary one unless --db is given)
    Demo(demo::DemoArgs),
    /// Run holdfast beside a naive selector on a contention workload, each on a fresh database
    Simulate(simulate::SimulateArgs),
    /// Select and settle in a loop, as one replica of a fleet (a soak or kill test)
    Soak(soak::SoakArgs),
}

/// What every command runs with: the configuration and the open backend.
#[derive(Debug)]
pub struct Context {
    /// The validated configuration.
    pub config: Config,
    /// The open, migrated backend.
    pub backend: Backend,
}

impl Context {
    /// Opens the backend at `url` with the configuration's options.
    pub async fn open(url: &str, config: Config) -> Result<Context, CliError> {
        let backend = Backend::open(url, &config.backend_options()).await?;
        Ok(Context { config, backend })
    }
}

/// The database URL a command uses: `--db`, else the configuration's `db_url`
/// (which `HOLDFAST_DB` sets), else [`DEFAULT_DB_URL`].
pub fn database_url<'a>(flag: Option<&'a str>, config: &'a Config) -> &'a str {
    match flag {
        Some(url) => url,
        None if !config.db_url.trim().is_empty() => &config.db_url,
        None => DEFAULT_DB_URL,
    }
}

/// Loads the configuration: defaults, then the `--config` file, then `HOLDFAST_*`
/// environment variables; validated.
pub fn load_config(file: Option<&std::path::Path>) -> Result<Config, CliError> {
    Ok(Config::load(file)?)
}

/// Runs the parsed command and returns its rendered result.
pub async fn run(cli: Cli) -> Result<Rendered, CliError> {
    let config = load_config(cli.config.as_deref())?;
    if let Command::Demo(args) = &cli.command {
        return demo::run(args, cli.db.as_deref(), config).await;
    }
    if let Command::Simulate(args) = &cli.command {
        return simulate::run(args, cli.db.as_deref(), config).await;
    }
    let url = database_url(cli.db.as_deref(), &config).to_owned();
    let json = cli.json;
    let ctx = match &cli.command {
        // A replica of a fleet outlives a database that is full or restarting.
        Command::Soak(args) => soak::open(&url, config, &args.name).await?,
        _ => Context::open(&url, config).await?,
    };
    let result = match cli.command {
        Command::Migrate => Ok(migrate(&ctx)),
        Command::Tokens(cmd) => tokens::run(&ctx, cmd).await,
        Command::Select(args) => select::run(&ctx, args).await,
        Command::Settle(args) => settle::run(&ctx, args).await,
        Command::Locks(cmd) => locks::run(&ctx, cmd).await,
        Command::Queue(cmd) => queue::run(&ctx, cmd, json).await,
        Command::Soak(args) => soak::run(&ctx, args).await,
        Command::Demo(_) => Err(CliError::Demo {
            step: "dispatch",
            detail: "the demo runs before a database is opened".to_owned(),
        }),
        Command::Simulate(_) => Err(CliError::from(holdfast_simulator::SimulateError::Internal(
            "simulate runs before a database is opened".to_owned(),
        ))),
    };
    ctx.backend.close().await;
    result
}

/// `migrate`: `{"backend": "sqlite", "url": "...", "schema_version": 1}`, and
/// `"warnings": [...]` when there are any.
#[derive(Debug, Serialize)]
pub struct Migrated {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// The database URL, password redacted.
    pub url: String,
    /// The schema version the database is at.
    pub schema_version: i64,
    /// How the server's settings let an acknowledged commit be lost (PostgreSQL:
    /// each `CommitRisk` of `PgBackend::durability`, see
    /// `docs/postgres-failover.md`); left out when there is none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl Report for Migrated {
    fn human(&self) -> String {
        let mut text = format!(
            "{} database {} is at schema version {}\n",
            self.backend, self.url, self.schema_version
        );
        for warning in &self.warnings {
            text.push_str(&format!("warning: {warning}\n"));
        }
        text
    }
}

fn migrate(ctx: &Context) -> Rendered {
    let warnings = ctx
        .backend
        .postgres()
        .and_then(|pg| pg.durability())
        .map(|found| found.risks().iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    Rendered::of(&Migrated {
        backend: ctx.backend.kind().as_str(),
        url: ctx.backend.shown_url().to_owned(),
        schema_version: ctx.backend.schema_version(),
        warnings,
    })
}
