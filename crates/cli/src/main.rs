//! The `holdfast` command. Parses arguments, installs the tracing subscriber (logs on
//! stderr, filtered by `HOLDFAST_LOG` or `RUST_LOG`), runs the command on a tokio
//! runtime, prints the result on stdout and maps errors to exit codes: 1 refused,
//! 2 bad input, 3 backend error. Usage errors from argument parsing exit with 2.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use holdfast_cli::{self as cli, Cli, CliError};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // --help and --version print on stdout and succeed; usage errors exit 2.
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // The demo's crash is on purpose: its warning would only alarm; errors still show.
    let level = if matches!(cli.command, cli::Command::Demo(_)) {
        "error"
    } else {
        "warn"
    };
    // The server's durability settings are `holdfast migrate`'s report; logged by
    // every other command they would come before its output (and its JSON error).
    install_tracing(&format!("{level},{}=off", holdfast::DURABILITY_TARGET));
    let json = cli.json;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(source) => {
            return fail(
                &CliError::Io {
                    action: "starting the async runtime",
                    path: String::from("-"),
                    source,
                },
                json,
            );
        }
    };
    let outcome = runtime.block_on(cli::run(cli));
    // Close the blocking database threads promptly instead of waiting for them.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    match outcome {
        Ok(rendered) => {
            let mut stdout = std::io::stdout().lock();
            // A closed pipe (`holdfast ... | head`) is not an error of the command.
            let _ = stdout.write_all(rendered.to_text(json).as_bytes());
            let _ = stdout.flush();
            ExitCode::SUCCESS
        }
        Err(err) => fail(&err, json),
    }
}

/// Prints `err` on stderr (as JSON under `--json`) and returns its exit code.
fn fail(err: &CliError, json: bool) -> ExitCode {
    let mut stderr = std::io::stderr().lock();
    let _ = if json {
        writeln!(stderr, "{}", err.to_json())
    } else {
        writeln!(stderr, "holdfast: error: {err}")
    };
    ExitCode::from(err.exit_code())
}

/// Logs to stderr, filtered by `HOLDFAST_LOG`, else `RUST_LOG`, else `default`. An
/// unparsable filter is reported and replaced by `default`.
fn install_tracing(default: &str) {
    use tracing_subscriber::EnvFilter;
    let spec = std::env::var("HOLDFAST_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| default.to_owned());
    let filter = EnvFilter::try_new(&spec).unwrap_or_else(|e| {
        eprintln!("holdfast: warning: ignoring the log filter {spec:?}: {e}; using {default:?}");
        EnvFilter::new(default)
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}
