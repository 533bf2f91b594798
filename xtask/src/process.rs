//! Running commands: echoed before they run, failures turned into [`Error`]s.

use std::path::Path;
use std::process::{Command, Output};

use crate::Error;

/// The command line of `cmd` for messages: program and arguments only, never the
/// environment (which may hold a `DATABASE_URL` with a password).
pub fn describe(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program());
    std::iter::once(program.file_name().unwrap_or(program.as_os_str()))
        .chain(cmd.get_args())
        .map(|part| part.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `cmd` with inherited stdio after echoing it; a non-zero exit is an error.
pub fn run(cmd: &mut Command) -> Result<(), Error> {
    let command = describe(cmd);
    eprintln!("$ {command}");
    let status = cmd.status().map_err(|source| Error::Spawn {
        command: command.clone(),
        source,
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::CommandFailed { command, status })
    }
}

/// Runs `cmd` quietly and returns its output; a non-zero exit is an error that
/// carries the command's stderr.
pub fn output(cmd: &mut Command) -> Result<Output, Error> {
    let command = describe(cmd);
    let out = cmd.output().map_err(|source| Error::Spawn {
        command: command.clone(),
        source,
    })?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(Error::BadOutput {
            command,
            detail: format!(
                "exit {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}

/// The `cargo` that invoked us (so toolchain overrides carry through).
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}
