//! `holdfast soak` replicas as real processes: spawned on a URL, their histories
//! tailed, waited for, stopped.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{FUNDING, MAX_AMOUNT, PAYEE, TYPE, WALLET};
use crate::cli_support::Holdfast;

/// Counts the whole `settled` lines of a history as it grows.
#[derive(Debug)]
struct Tail {
    path: PathBuf,
    read: u64,
    partial: Vec<u8>,
    settled: u64,
}

impl Tail {
    fn poll(&mut self) -> u64 {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return self.settled;
        };
        let mut fresh = Vec::new();
        if file.seek(SeekFrom::Start(self.read)).is_ok() && file.read_to_end(&mut fresh).is_ok() {
            self.read += u64::try_from(fresh.len()).expect("length");
            self.partial.extend(fresh);
        }
        while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            if line.starts_with(b"settled ") {
                self.settled += 1;
            }
        }
        self.settled
    }
}

/// One `holdfast soak` process, its history and its stderr (warnings of retried
/// faults). Killed on drop. A replica started again under the same name appends to
/// the same history and stderr.
#[derive(Debug)]
pub struct Replica {
    /// `r0`, `r1`, ...
    pub name: String,
    /// Its history file.
    pub history: PathBuf,
    /// Its stderr file.
    pub stderr: PathBuf,
    /// The process.
    pub child: Child,
    tail: Tail,
}

impl Replica {
    /// Starts replica `name` on `url` with `workers` loops and the extra
    /// configuration `env`, writing its files into `dir`.
    pub fn spawn(url: &str, dir: &Path, name: &str, workers: u32, env: &[(&str, &str)]) -> Replica {
        let history = dir.join(format!("{name}.history"));
        let stderr = dir.join(format!("{name}.stderr"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HOLDFAST_") {
                cmd.env_remove(key);
            }
        }
        cmd.env_remove("RUST_LOG");
        for (key, value) in env {
            cmd.env(key, value);
        }
        let child = cmd
            .current_dir(dir)
            .args(["--db", url, "soak", "--wallet", WALLET, "--type", TYPE])
            .args(["--max-amount", MAX_AMOUNT, "--confirm-percent", "70"])
            .args(["--pay-to", PAYEE])
            .args([
                "--workers",
                &workers.to_string(),
                "--name",
                name,
                "--history",
            ])
            .arg(&history)
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&stderr)
                    .expect("stderr file"),
            )
            .spawn()
            .expect("spawn holdfast soak");
        Replica {
            name: name.to_owned(),
            tail: Tail {
                path: history.clone(),
                read: 0,
                partial: Vec::new(),
                settled: 0,
            },
            history,
            stderr,
            child,
        }
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.name);
    }

    /// Settled transactions in the history so far.
    pub fn settled(&mut self) -> u64 {
        self.tail.poll()
    }

    /// The exit status, if the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Panics if the replica has exited on its own (with its stderr).
    pub fn assert_alive(&mut self, when: &str) {
        if let Some(status) = self.exited() {
            panic!(
                "{} exited on its own {when} ({status}); stderr:\n{}",
                self.name,
                tail_of(
                    &std::fs::read_to_string(&self.stderr).unwrap_or_default(),
                    20
                )
            );
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// What the replica logged: warning/error lines, and a few of them.
    pub fn faults(&self) -> (usize, Vec<String>) {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .collect();
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for line in &lines {
            // The message and the error's first words, without timestamps and ids.
            let from = line
                .find("WARN")
                .or_else(|| line.find("ERROR"))
                .unwrap_or(0);
            let kind: String = line[from..]
                .split_whitespace()
                .filter(|w| !w.chars().any(|c| c.is_ascii_digit()))
                .take(14)
                .collect::<Vec<_>>()
                .join(" ");
            *kinds.entry(kind).or_default() += 1;
        }
        let shown = kinds
            .into_iter()
            .map(|(kind, n)| format!("{n} x {kind}"))
            .collect();
        (lines.len(), shown)
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn tail_of(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Starts `n` replicas named `r0`, `r1`, ...
pub fn fleet(url: &str, dir: &Path, n: usize, workers: u32, env: &[(&str, &str)]) -> Vec<Replica> {
    (0..n)
        .map(|i| Replica::spawn(url, dir, &format!("r{i}"), workers, env))
        .collect()
}

/// Funds the wallet through the command line.
pub fn fund(h: &Holdfast) {
    tokio::task::block_in_place(|| {
        h.ok(&[
            "tokens",
            "add",
            "--wallet",
            WALLET,
            "--type",
            TYPE,
            "--amount",
            &FUNDING.amount.to_string(),
            "--tx",
            FUNDING.tx,
            "--count",
            &FUNDING.count.to_string(),
        ]);
    });
}

/// Waits (polling every 50 ms, at most `bound`) until every replica in `which`
/// has settled `more` transactions beyond `from`; returns, per replica, how long
/// its first new settlement took. Panics when the bound passes or one exits.
pub async fn progress(
    replicas: &mut [Replica],
    from: &[u64],
    more: u64,
    bound: Duration,
    what: &str,
) -> Vec<Duration> {
    let began = Instant::now();
    let mut first: Vec<Option<Duration>> = vec![None; replicas.len()];
    loop {
        let mut done = true;
        for (i, r) in replicas.iter_mut().enumerate() {
            let settled = r.settled();
            if settled > from[i] && first[i].is_none() {
                first[i] = Some(began.elapsed());
            }
            done &= settled >= from[i] + more;
            r.assert_alive(what);
        }
        if done {
            return first.into_iter().map(|d| d.unwrap_or_default()).collect();
        }
        assert!(
            began.elapsed() < bound,
            "{what}: not every replica settled {more} more within {bound:?}: {:?} from {from:?}",
            replicas
                .iter_mut()
                .map(Replica::settled)
                .collect::<Vec<_>>()
        );
        // sleep: poll interval of the replicas' progress, bounded by `bound`.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kills every replica still running, prints what each logged, and returns
/// those that had exited on their own: name, status and the end of its stderr.
pub fn stop_fleet(replicas: &mut [Replica]) -> Vec<String> {
    let mut exited = Vec::new();
    for r in replicas.iter_mut() {
        if let Some(status) = r.exited() {
            let stderr = std::fs::read_to_string(&r.stderr).unwrap_or_default();
            exited.push(format!("{} ({status}): {}", r.name, tail_of(&stderr, 1)));
        }
        r.kill();
        let (count, kinds) = r.faults();
        let settled = r.settled();
        println!("{}: {settled} settled, {count} warning/error lines", r.name);
        for kind in kinds {
            println!("    {kind}");
        }
    }
    exited
}

/// [`stop_fleet`], asserting no replica had exited on its own.
pub fn stop_living_fleet(replicas: &mut [Replica]) {
    let exited = stop_fleet(replicas);
    assert!(
        exited.is_empty(),
        "replicas exited on their own:\n{}",
        exited.join("\n")
    );
}
