//! `cargo xtask bench`: the simulator's presets and the workload files named in
//! [`WORKLOAD_FILES`] on SQLite and PostgreSQL, the physical limit (a raw select
//! cycle), and select latency and peak memory as the wallet grows from 1k to 1M
//! tokens. Builds `holdfast` in release once, runs `holdfast simulate --json` for
//! every measurement, writes `bench/results.json` and prints a markdown table.
//! Numbers are reported, never asserted.
//!
//! It also replays a payment history (`holdfast simulate --payments`, SQLite,
//! every policy): [`DEFAULT_PAYMENTS`], beside the repository, unless
//! `--payments FILE.csv` names another; a missing file fails the bench before
//! anything runs.
//!
//! Options: `--quick` stops the scaling series at 100k tokens; `--sqlite-only`
//! skips PostgreSQL. PostgreSQL is `DATABASE_URL`, or a throwaway cluster as for
//! the tests.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{Value, json};

use crate::{Error, postgres, process};

/// The presets, in report order.
const PRESETS: &[&str] = &[
    "many-wallets",
    "hot-lineage",
    "pareto",
    "dust",
    "big-wallet",
    "hot-wallets",
    "admission",
];
/// Workload files of `bench/workloads/` run after the presets, in report order.
const WORKLOAD_FILES: &[&str] = &["many-wallets-unlock"];
/// A workload file run twice, holdfast only: with the default settings and with
/// `selection.prefer_exact`, to show what the exact search saves in change.
const EXACT_FILE: &str = "denominations";
/// Workload files run with holdfast and `--ablate wakeups` (no naive: its 5 s
/// backoffs take minutes): the true defaults, and the short budget a workload
/// file gets when it sets no `legs` (10 legs of [0, 20 ms)).
const WAKE_FILES: &[&str] = &[
    "hot-lineage-defaults",
    "pareto-defaults",
    "hot-lineage-short",
];
/// The preset whose settlement throughput shows what wake-ups cost (NOTIFY on
/// PostgreSQL), run with holdfast and `--ablate wakeups`.
const WAKE_COST_PRESET: &str = "many-wallets";
/// The payment history the bench replays, relative to the workspace root: the
/// Bitcoin Core developers' `bustabit` tiny scenario, kept in the shared data
/// directory beside the repository (`../shared/data/README.md` describes it).
pub const DEFAULT_PAYMENTS: &str = "../shared/data/payments-bustabit-tiny.csv";
/// Wallet sizes of the scaling series.
const WALLETS: &[u64] = &[1_000, 10_000, 100_000, 1_000_000];
/// The seed of every run.
const SEED: &str = "42";

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The path of `bench/workloads/<name>.toml`, as an argument.
fn workload_file(root: &Path, name: &str) -> String {
    root.join("bench")
        .join("workloads")
        .join(format!("{name}.toml"))
        .display()
        .to_string()
}

/// Cargo's target directory (`CARGO_TARGET_DIR`, else `target/` under `root`).
pub fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// Runs `cmd` with stderr shown (progress bars) and returns its stdout as JSON.
fn json_of(cmd: &mut Command) -> Result<Value, Error> {
    let command = process::describe(cmd);
    eprintln!("$ {command}");
    let out = cmd
        .stderr(Stdio::inherit())
        .stdout(Stdio::piped())
        .output()
        .map_err(|source| Error::Spawn {
            command: command.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::CommandFailed {
            command,
            status: out.status,
        });
    }
    serde_json::from_slice(&out.stdout).map_err(|e| Error::BadOutput {
        command,
        detail: format!("not JSON: {e}"),
    })
}

fn text_of(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_default();
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().map(str::to_owned))
        .unwrap_or_default();
    json!({
        "cpu": cpu,
        "cpus": std::thread::available_parallelism().map_or(0, usize::from),
        "memory": memory.trim_start_matches("MemTotal:").trim(),
        "os": text_of("uname", &["-sr"]),
        "rustc": text_of("rustc", &["--version"]),
    })
}

fn scaling_workload(tokens: u64) -> String {
    format!(
        "name = \"wallet-{tokens}\"\nreplicas = 1\nconcurrency = 8\nlegs = 50\n\
         [[tokens]]\nwallet = \"alice\"\ntype = \"CHF\"\namount = \"1..1000\"\ncount = {tokens}\n\
         [[requests]]\nwallet = \"alice\"\ntype = \"CHF\"\namount = \"1..500\"\ncount = 200\nmode = \"settle\"\n"
    )
}

/// Runs the task.
pub fn run(args: &[String]) -> Result<(), Error> {
    let mut quick = false;
    let mut sqlite_only = false;
    let root = root();
    let mut payments = root.join(DEFAULT_PAYMENTS);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--sqlite-only" => sqlite_only = true,
            "--payments" => {
                payments = args.next().map(PathBuf::from).ok_or(Error::MissingValue {
                    task: "bench",
                    option: "--payments",
                })?;
            }
            other => {
                return Err(Error::UnexpectedArgument {
                    task: "bench",
                    arg: other.to_owned(),
                });
            }
        }
    }
    if !payments.is_file() {
        return Err(Error::MissingInput {
            what: "payment history",
            path: payments,
            hint: "give one with `cargo xtask bench --payments FILE.csv` (amount,feerate lines)",
        });
    }
    let started = Instant::now();
    process::run(process::cargo().current_dir(&root).args([
        "build",
        "--release",
        "-p",
        "holdfast-cli",
        "--bin",
        "holdfast",
    ]))?;
    let binary = target_dir(&root).join("release").join("holdfast");
    let server = if sqlite_only {
        None
    } else {
        Some(postgres::provide()?)
    };
    let mut backends: Vec<(&str, Option<String>)> = vec![("sqlite", None)];
    if let Some(url) = server.as_ref().and_then(|s| s.url()) {
        backends.push(("postgres", Some(url.to_owned())));
    } else if let Some(server) = &server {
        eprintln!("bench: PostgreSQL skipped: {}", server.describe());
    }
    let scratch = std::env::temp_dir().join(format!("holdfast-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|source| Error::Io {
        action: "creating",
        path: scratch.clone(),
        source,
    })?;

    let simulate = |db: &Option<String>, extra: &[&str]| -> Command {
        let mut cmd = Command::new(&binary);
        cmd.current_dir(&scratch)
            .env("HOLDFAST_LOG", "error")
            .args(["simulate", "--json", "--seed", SEED])
            .args(extra);
        if let Some(url) = db {
            cmd.arg("--db").arg(url);
        }
        cmd
    };

    let mut presets = Vec::new();
    for (backend, db) in &backends {
        for preset in PRESETS {
            let mut extra = vec!["--workload", preset];
            if *preset != "admission" {
                // The upstream order beside the default, in the same run.
                extra.extend(["--raw-limit", "--ablate", "smallest-first"]);
            }
            let report = json_of(&mut simulate(db, &extra))?;
            presets.push(json!({ "backend": backend, "preset": preset, "report": report }));
        }
        for name in WORKLOAD_FILES {
            let file_arg = workload_file(&root, name);
            let report = json_of(&mut simulate(
                db,
                &[
                    "--workload",
                    &file_arg,
                    "--raw-limit",
                    "--ablate",
                    "smallest-first",
                ],
            ))?;
            presets.push(json!({
                "backend": backend,
                "preset": name,
                "file": format!("bench/workloads/{name}.toml"),
                "report": report,
            }));
        }
    }

    for (backend, db) in &backends {
        let file_arg = workload_file(&root, EXACT_FILE);
        for exact in [false, true] {
            let mut cmd = simulate(db, &["--workload", &file_arg, "--strategy", "holdfast"]);
            cmd.env("HOLDFAST_PREFER_EXACT", exact.to_string());
            let report = json_of(&mut cmd)?;
            let name = if exact {
                format!("{EXACT_FILE} (prefer_exact)")
            } else {
                EXACT_FILE.to_owned()
            };
            presets.push(json!({
                "backend": backend,
                "preset": name,
                "file": format!("bench/workloads/{EXACT_FILE}.toml"),
                "prefer_exact": exact,
                "report": report,
            }));
        }
    }

    let mut wakeups = Vec::new();
    for (backend, db) in &backends {
        let files = WAKE_FILES
            .iter()
            .map(|name| (workload_file(&root, name), *name));
        let runs = files.chain(std::iter::once((
            WAKE_COST_PRESET.to_owned(),
            WAKE_COST_PRESET,
        )));
        for (workload, name) in runs {
            let report = json_of(&mut simulate(
                db,
                &[
                    "--workload",
                    &workload,
                    "--strategy",
                    "holdfast",
                    "--ablate",
                    "wakeups",
                ],
            ))?;
            wakeups.push(json!({ "backend": backend, "workload": name, "report": report }));
        }
    }

    // The payment history, replayed once on SQLite through every policy.
    let payments_arg = payments.display().to_string();
    let replay = json_of(&mut simulate(&None, &["--payments", &payments_arg]))?;

    let mut scaling = Vec::new();
    for (backend, db) in &backends {
        for &tokens in WALLETS {
            if quick && tokens > 100_000 {
                continue;
            }
            let file = scratch.join(format!("wallet-{tokens}.toml"));
            std::fs::write(&file, scaling_workload(tokens)).map_err(|source| Error::Io {
                action: "writing",
                path: file.clone(),
                source,
            })?;
            let file_arg = file.display().to_string();
            let report = json_of(&mut simulate(
                db,
                &["--workload", &file_arg, "--strategy", "holdfast"],
            ))?;
            let figures = &report["strategies"][0];
            scaling.push(json!({
                "backend": backend,
                "tokens": tokens,
                "selects": figures["selects"],
                "spurious_failures": figures["spurious_failures"],
                "latency_ms": figures["latency_ms"],
                "peak_memory_bytes": figures["peak_memory_bytes"],
                "round_trips_per_select": figures["round_trips_per_select"],
            }));
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    drop(server);

    let results = json!({
        "date": text_of("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
        "commit": text_of("git", &["-C", &root.display().to_string(), "rev-parse", "--short", "HEAD"]),
        "machine": machine(),
        "commands": [
            "cargo xtask bench",
            format!("holdfast simulate --workload <preset> --seed {SEED} --json --raw-limit --ablate smallest-first [--db postgres://...]"),
            format!("holdfast simulate --workload bench/workloads/<file>.toml --seed {SEED} --json --raw-limit --ablate smallest-first [--db postgres://...]"),
            format!("holdfast simulate --workload wallet-<n>.toml --strategy holdfast --seed {SEED} --json"),
            format!("holdfast simulate --workload <file or many-wallets> --strategy holdfast --ablate wakeups --seed {SEED} --json [--db postgres://...]"),
            format!("holdfast simulate --payments {payments_arg} --seed {SEED} --json"),
        ],
        "seconds": started.elapsed().as_secs(),
        "presets": presets,
        "wakeups": wakeups,
        "replay": replay,
        "scaling": scaling,
    });
    let out = root.join("bench").join("results.json");
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            action: "creating",
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let text = serde_json::to_string_pretty(&results).map_err(|e| Error::BadOutput {
        command: "bench".to_owned(),
        detail: e.to_string(),
    })?;
    std::fs::write(&out, text + "\n").map_err(|source| Error::Io {
        action: "writing",
        path: out.clone(),
        source,
    })?;
    println!("{}", markdown(&results));
    eprintln!("bench: wrote {}", out.display());
    Ok(())
}

fn num(v: &Value) -> String {
    match v {
        Value::Number(n) => n.as_f64().map_or_else(
            || n.to_string(),
            |f| {
                if f.fract() == 0.0 || f.abs() >= 100.0 {
                    format!("{f:.0}")
                } else {
                    format!("{f:.2}")
                }
            },
        ),
        Value::Null => "n/a".to_owned(),
        other => other.to_string(),
    }
}

fn mib(v: &Value) -> String {
    v.as_u64().map_or_else(
        || "n/a".to_owned(),
        |b| {
            format!(
                "{:.1}",
                f64::from(u32::try_from(b / 1024).unwrap_or(u32::MAX)) / 1024.0
            )
        },
    )
}

/// The results as markdown tables (what the README's Benchmarks section shows).
pub fn markdown(results: &Value) -> String {
    let mut out = String::new();
    let m = &results["machine"];
    let _ = writeln!(
        out,
        "Machine: {} ({} CPUs, {}), {}; {}. Date: {}, commit {}. Bench took {} s.\n",
        m["cpu"].as_str().unwrap_or("?"),
        m["cpus"],
        m["memory"].as_str().unwrap_or("?"),
        m["os"].as_str().unwrap_or("?"),
        m["rustc"].as_str().unwrap_or("?"),
        results["date"].as_str().unwrap_or("?"),
        results["commit"].as_str().unwrap_or("?"),
        results["seconds"],
    );
    out.push_str("| backend | workload | strategy | selects/s | spurious | insufficient | lock attempts/select | conflicts/select | hottest share | top 1% share | round trips/select | inputs/select | change share | p50 ms | p99 ms | peak MiB | locks left | % of raw limit |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let empty = Vec::new();
    for entry in results["presets"].as_array().unwrap_or(&empty) {
        let report = &entry["report"];
        if entry["preset"] == "admission" {
            continue;
        }
        for s in report["strategies"].as_array().unwrap_or(&empty) {
            let raw = if s["strategy"] == "holdfast" {
                report["raw_limit"]["fraction_of_raw_limit"]
                    .as_f64()
                    .map_or_else(|| "n/a".to_owned(), |f| format!("{:.0}%", f * 100.0))
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                entry["backend"].as_str().unwrap_or("?"),
                entry["preset"].as_str().unwrap_or("?"),
                s["strategy"].as_str().unwrap_or("?"),
                num(&s["selects_per_second"]),
                num(&s["spurious_failures"]),
                num(&s["insufficient_funds"]),
                num(&s["lock_attempts_per_select"]),
                num(&s["conflicts_per_select"]),
                num(&s["hottest_token_conflict_share"]),
                num(&s["top_1pct_conflict_share"]),
                num(&s["round_trips_per_select"]),
                num(&s["inputs_per_select"]),
                num(&s["change_share"]),
                num(&s["latency_ms"]["p50"]),
                num(&s["latency_ms"]["p99"]),
                mib(&s["peak_memory_bytes"]),
                num(&s["locks_left"]),
                raw,
            );
        }
    }
    out.push_str("\n| backend | admits/s | invariant violations | slots leaked | wedged | crashes injected | redeliveries |\n|---|---|---|---|---|---|---|\n");
    for entry in results["presets"].as_array().unwrap_or(&empty) {
        if entry["preset"] != "admission" {
            continue;
        }
        let a = &entry["report"]["strategies"][0];
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            entry["backend"].as_str().unwrap_or("?"),
            num(&a["admits_per_second"]),
            num(&a["invariant_violations"]),
            num(&a["slots_leaked"]),
            num(&a["wedged_requests"]),
            num(&a["crashes_injected"]),
            num(&a["redeliveries"]),
        );
    }
    out.push_str("\n| backend | workload | strategy | selects/s | spurious | conflicts/select | round trips/select | p50 ms | p99 ms | locks left |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for entry in results["wakeups"].as_array().unwrap_or(&empty) {
        for s in entry["report"]["strategies"].as_array().unwrap_or(&empty) {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                entry["backend"].as_str().unwrap_or("?"),
                entry["workload"].as_str().unwrap_or("?"),
                s["strategy"].as_str().unwrap_or("?"),
                num(&s["selects_per_second"]),
                num(&s["spurious_failures"]),
                num(&s["conflicts_per_select"]),
                num(&s["round_trips_per_select"]),
                num(&s["latency_ms"]["p50"]),
                num(&s["latency_ms"]["p99"]),
                num(&s["locks_left"]),
            );
        }
    }
    out.push_str(&replay_markdown(&results["replay"]));
    out.push_str("\n| backend | wallet tokens | select p50 ms | select p99 ms | peak MiB | round trips/select | spurious |\n|---|---|---|---|---|---|---|\n");
    for s in results["scaling"].as_array().unwrap_or(&empty) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            s["backend"].as_str().unwrap_or("?"),
            s["tokens"],
            num(&s["latency_ms"]["p50"]),
            num(&s["latency_ms"]["p99"]),
            mib(&s["peak_memory_bytes"]),
            num(&s["round_trips_per_select"]),
            num(&s["spurious_failures"]),
        );
    }
    out
}

/// The payment replay's table (empty without a replay).
pub fn replay_markdown(replay: &Value) -> String {
    let Some(policies) = replay["policies"].as_array() else {
        return String::new();
    };
    let mut out = format!(
        "\nPayment history {} on {}: {} lines ({} deposits, {} payments); dust below {} sat.\n\n",
        replay["source"].as_str().unwrap_or("?"),
        replay["backend"].as_str().unwrap_or("?"),
        replay["lines"],
        replay["deposits"],
        replay["withdrawals"],
        replay["dust_below_sats"],
    );
    out.push_str("| policy | payments | insufficient | final pool | mean pool | inputs mean | inputs p99 | inputs max | changeless | dust count | dust BTC | select mean ms | select p99 ms |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for p in policies {
        let dust = p["dust_sats"].as_u64().map_or_else(
            || "n/a".to_owned(),
            |s| format!("{}.{:08}", s / 100_000_000, s % 100_000_000),
        );
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p["policy"].as_str().unwrap_or("?"),
            num(&p["payments"]),
            num(&p["insufficient"]),
            num(&p["final_pool"]),
            p["mean_pool"].as_f64().unwrap_or(0.0),
            num(&p["inputs"]["mean"]),
            num(&p["inputs"]["p99"]),
            num(&p["inputs"]["max"]),
            p["changeless_share"]
                .as_f64()
                .map_or_else(|| "n/a".to_owned(), |f| format!("{:.1}%", f * 100.0)),
            num(&p["dust_count"]),
            dust,
            num(&p["select_ms"]["mean"]),
            num(&p["select_ms"]["p99"]),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_markdown_row_of_a_workload_file_carries_inputs_and_change() {
        let results = json!({
            "presets": [{
                "backend": "sqlite",
                "preset": "many-wallets-unlock",
                "file": "bench/workloads/many-wallets-unlock.toml",
                "report": {
                    "strategies": [{"strategy": "holdfast", "inputs_per_select": 1.405, "change_share": 0.998}],
                    "raw_limit": {"fraction_of_raw_limit": 0.5},
                },
            }],
        });
        let md = markdown(&results);
        let row = md
            .lines()
            .find(|l| l.contains("many-wallets-unlock"))
            .unwrap_or_else(|| panic!("no row in {md}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let header: Vec<&str> = md
            .lines()
            .find(|l| l.starts_with("| backend | workload |"))
            .unwrap_or_default()
            .split('|')
            .map(str::trim)
            .collect();
        assert_eq!(cells.len(), header.len(), "{row}");
        let at = |name: &str| header.iter().position(|h| *h == name).map(|i| cells[i]);
        assert_eq!(at("inputs/select"), Some("1.41"));
        assert_eq!(at("change share"), Some("1.00"));
        assert_eq!(at("% of raw limit"), Some("50%"));
    }

    #[test]
    fn the_replay_table_has_a_row_per_policy_with_dust_in_btc() {
        let results = json!({
            "replay": {
                "source": "payments.csv", "backend": "sqlite", "lines": 3,
                "deposits": 2, "withdrawals": 1, "dust_below_sats": 4000,
                "policies": [{
                    "policy": "random_improve", "payments": 1, "insufficient": 0,
                    "final_pool": 2, "mean_pool": 1.5,
                    "inputs": {"mean": 1.0, "p99": 1, "max": 1},
                    "changeless_share": 0.25, "dust_count": 1, "dust_sats": 1200,
                    "select_ms": {"mean": 0.5, "p99": 1.25},
                }],
            },
        });
        let md = markdown(&results);
        let row = md
            .lines()
            .find(|l| l.starts_with("| random_improve |"))
            .unwrap_or_else(|| panic!("no row in {md}"));
        assert_eq!(
            row,
            "| random_improve | 1 | 0 | 2 | 2 | 1 | 1 | 1 | 25.0% | 1 | 0.00001200 | 0.50 | 1.25 |"
        );
        assert!(md.contains("Payment history payments.csv on sqlite: 3 lines"));
        assert!(!markdown(&json!({})).contains("Payment history"));
    }
}
