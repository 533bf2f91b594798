//! Pins the `--help` of the command and of every subcommand: what a person reads
//! first. A change here is a change of the command's interface.

use crate::cli_support;

use cli_support::Holdfast;

/// Every command path, top level first.
const COMMANDS: &[&[&str]] = &[
    &[],
    &["migrate"],
    &["tokens"],
    &["tokens", "add"],
    &["tokens", "list"],
    &["tokens", "balance"],
    &["select"],
    &["settle"],
    &["locks"],
    &["locks", "list"],
    &["locks", "sweep"],
    &["queue"],
    &["queue", "ingest"],
    &["queue", "process"],
    &["queue", "outcome"],
    &["queue", "dead-letter"],
    &["queue", "heartbeat"],
    &["queue", "reconcile"],
    &["queue", "set-limit"],
    &["queue", "prune"],
    &["queue", "work"],
    &["queue", "backfill"],
    &["queue", "show"],
    &["demo"],
    &["simulate"],
    &["soak"],
];

#[test]
fn help_of_every_command() {
    let h = Holdfast::sqlite();
    for path in COMMANDS {
        let output = h
            .bare()
            .args(*path)
            .arg("--help")
            .output()
            .expect("run holdfast");
        assert!(output.status.success(), "{path:?} --help failed");
        let name = if path.is_empty() {
            "help".to_owned()
        } else {
            format!("help_{}", path.join("_"))
        };
        insta::assert_snapshot!(name, String::from_utf8_lossy(&output.stdout));
    }
}

#[test]
fn every_subcommand_has_a_pinned_help() {
    // A new subcommand, at either level, must be added to COMMANDS (and so get a
    // snapshot).
    let h = Holdfast::sqlite();
    let listed = |path: &[&str]| -> Vec<String> {
        let out = h
            .bare()
            .args(path)
            .arg("--help")
            .output()
            .expect("run holdfast");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|c| *c != "help")
            .map(str::to_owned)
            .collect()
    };
    let top = listed(&[]);
    assert!(!top.is_empty(), "no commands listed");
    for command in &top {
        assert!(
            COMMANDS.iter().any(|p| p == &[command.as_str()]),
            "{command} has no help snapshot"
        );
        for sub in listed(&[command]) {
            assert!(
                COMMANDS
                    .iter()
                    .any(|p| p == &[command.as_str(), sub.as_str()]),
                "{command} {sub} has no help snapshot"
            );
        }
    }
}

#[test]
fn version_and_usage_errors() {
    let h = Holdfast::sqlite();
    h.bare().arg("--version").assert().success();
    // No command, an unknown command, a missing argument, a bad enum value: usage errors exit 2.
    for args in [
        &[][..],
        &["frobnicate"][..],
        &["select", "--wallet", "w"][..],
        &["settle", "--tx", "t", "--status", "maybe"][..],
        &[
            "queue",
            "outcome",
            "--request",
            "request/q/1",
            "--status",
            "green",
        ][..],
        &[
            "tokens", "add", "--wallet", "w", "--type", "T", "--amount", "1", "--index", "3",
        ][..],
    ] {
        h.bare().args(args).assert().code(2);
    }
}
