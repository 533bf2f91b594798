//! Bad input, table-driven, through the real `holdfast` binary on a SQLite file:
//! every row is one command with one bad value (an amount, an id, a request id, a
//! configuration key, a database URL, a corrupt stored row). Each must exit with
//! its code (2 for input that can never work, 3 for a database that cannot be
//! used), print a message naming the bad value and what was expected, never
//! panic, and write nothing: the whole database is dumped before and after each
//! row and must be identical.

use std::collections::BTreeMap;
use std::path::Path;

use assert_cmd::Command;
use rusqlite::Connection;
use rusqlite::types::ValueRef;
use tempfile::TempDir;

/// One bad input.
struct Row {
    /// What is being tried, for failure messages.
    what: &'static str,
    /// Arguments after `--db URL`.
    args: Vec<String>,
    /// Extra environment variables.
    env: Vec<(&'static str, String)>,
    /// A configuration file's text, passed with `--config`.
    config: Option<&'static str>,
    /// Replaces the `--db` URL.
    url: Option<String>,
    /// The expected exit code.
    code: i32,
    /// Every one of these must appear in stderr.
    says: Vec<String>,
}

fn row(what: &'static str, args: &[&str], code: i32, says: &[&str]) -> Row {
    Row {
        what,
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        env: Vec::new(),
        config: None,
        url: None,
        code,
        says: says.iter().map(|s| (*s).to_owned()).collect(),
    }
}

/// `tokens add` with a bad amount: the message quotes the amount (as `{:?}`)
/// and says what was expected.
fn amount_row(amount: &'static str, reason: &str) -> Row {
    let quoted = format!("{amount:?}");
    row(
        "tokens add --amount",
        &[
            "tokens", "add", "--wallet", "w", "--type", "CHF", "--tx", "new", "--amount", amount,
        ],
        2,
        &[&quoted, reason, "expected"],
    )
}

fn config_row(what: &'static str, toml: &'static str, says: &[&str]) -> Row {
    Row {
        config: Some(toml),
        ..row(
            what,
            &["tokens", "balance", "--wallet", "w", "--type", "CHF"],
            2,
            says,
        )
    }
}

fn env_row(var: &'static str, value: &str, says: &[&str]) -> Row {
    Row {
        env: vec![(var, value.to_owned())],
        ..row(
            var,
            &["tokens", "balance", "--wallet", "w", "--type", "CHF"],
            2,
            says,
        )
    }
}

/// Every table, every row, every column, in a stable order.
fn dump(path: &Path) -> BTreeMap<String, Vec<Vec<String>>> {
    let conn = Connection::open(path).expect("open the database for a dump");
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("tables")
        .collect::<Result<_, _>>()
        .expect("table names");
    let mut out = BTreeMap::new();
    for table in tables {
        let mut stmt = conn
            .prepare(&format!("SELECT * FROM \"{table}\""))
            .expect("prepare dump");
        let columns = stmt.column_count();
        let mut rows: Vec<Vec<String>> = stmt
            .query_map([], |r| {
                (0..columns)
                    .map(|i| {
                        Ok(match r.get_ref(i)? {
                            ValueRef::Null => "NULL".to_owned(),
                            ValueRef::Integer(n) => n.to_string(),
                            ValueRef::Real(x) => x.to_string(),
                            ValueRef::Text(t) => format!("{:?}", String::from_utf8_lossy(t)),
                            ValueRef::Blob(b) => format!("{b:?}"),
                        })
                    })
                    .collect()
            })
            .expect("rows")
            .collect::<Result<_, _>>()
            .expect("row values");
        rows.sort();
        out.insert(table, rows);
    }
    out
}

struct Db {
    dir: TempDir,
    url: String,
}

impl Db {
    fn new() -> Db {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", dir.path().join("holdfast.db").display());
        Db { dir, url }
    }

    fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("holdfast.db")
    }

    /// The binary with a clean `HOLDFAST_*` environment, in the temp directory.
    fn command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HOLDFAST_") {
                cmd.env_remove(key);
            }
        }
        cmd.env_remove("RUST_LOG")
            .env_remove("DATABASE_URL")
            .env("HOLDFAST_SEED", "7");
        cmd.current_dir(self.dir.path());
        cmd
    }

    fn ok(&self, args: &[&str]) {
        let out = self
            .command()
            .arg("--db")
            .arg(&self.url)
            .args(args)
            .output()
            .expect("run holdfast");
        assert!(
            out.status.success(),
            "holdfast {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs `row`, checks exit code, message and that nothing was written.
    fn check(&self, row: &Row) {
        let before = dump(&self.path());
        let mut cmd = self.command();
        cmd.arg("--db").arg(row.url.as_deref().unwrap_or(&self.url));
        if let Some(text) = row.config {
            let file = self.dir.path().join("bad.toml");
            std::fs::write(&file, text).expect("write the config file");
            cmd.arg("--config").arg(&file);
        }
        for (key, value) in &row.env {
            cmd.env(key, value);
        }
        let out = cmd.args(&row.args).output().expect("run holdfast");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let context = format!("{} {:?}: stderr: {stderr}", row.what, row.args);
        assert_eq!(out.status.code(), Some(row.code), "exit code of {context}");
        assert!(!stderr.contains("panicked"), "panic in {context}");
        for needle in &row.says {
            assert!(
                stderr.contains(needle.as_str()),
                "{needle:?} missing from {context}"
            );
        }
        assert!(out.stdout.is_empty(), "stdout of a failure: {context}");
        assert_eq!(
            dump(&self.path()),
            before,
            "the database changed after {context}"
        );
    }
}

/// Funds, a lock, a status and a queue with a request, so "nothing written"
/// compares against a database with something in every table.
fn seeded() -> Db {
    let db = Db::new();
    db.ok(&[
        "tokens", "add", "--wallet", "w", "--type", "CHF", "--amount", "10", "--tx", "seed",
        "--count", "3",
    ]);
    db.ok(&[
        "select", "--wallet", "w", "--type", "CHF", "--amount", "5", "--tx", "spender",
    ]);
    db.ok(&["settle", "--tx", "spender", "--status", "busy"]);
    db.ok(&["queue", "ingest", "--queue", "q", "--uri", "git:a"]);
    db.ok(&["queue", "ingest", "--queue", "other", "--uri", "git:b"]);
    db
}

#[test]
fn amounts_are_refused_naming_the_value() {
    let db = seeded();
    let rows = [
        amount_row("", "empty"),
        amount_row("-1", "signs are not allowed"),
        amount_row("+1", "signs are not allowed"),
        amount_row("1.5", "'.' is not a decimal digit"),
        amount_row("1e3", "'e' is not a decimal digit"),
        amount_row("0x", "no digits after 0x"),
        amount_row("0xZZ", "'Z' is not a hex digit"),
        amount_row(" 1", "white space"),
        amount_row("1 ", "white space"),
        amount_row("١", "is not a decimal digit"),
        // The default precision is 64 bits.
        amount_row("18446744073709551616", "exceeds the precision of 64 bits"),
        amount_row("0x10000000000000000", "exceeds the precision of 64 bits"),
        // 2^128 and beyond: over any precision.
        amount_row(
            "340282366920938463463374607431768211456",
            "exceeds the precision",
        ),
        amount_row(
            "99999999999999999999999999999999999999999999",
            "exceeds the precision",
        ),
        Row {
            env: vec![("HOLDFAST_PRECISION", "128".to_owned())],
            ..amount_row(
                "340282366920938463463374607431768211456",
                "exceeds the precision of 128 bits",
            )
        },
        row(
            "select --amount",
            &[
                "select", "--wallet", "w", "--type", "CHF", "--tx", "t2", "--amount", "-5",
            ],
            2,
            &["\"-5\"", "signs are not allowed", "expected"],
        ),
        row(
            "select --amount 0",
            &[
                "select", "--wallet", "w", "--type", "CHF", "--tx", "t2", "--amount", "0",
            ],
            2,
            &["0", "expected at least 1"],
        ),
    ];
    for r in &rows {
        db.check(r);
    }
}

#[test]
fn ids_are_refused_naming_the_value() {
    let db = seeded();
    let long = "a".repeat(257);
    let shown = format!("{:?}", "a".repeat(32) + "…");
    let rows = [
        row(
            "empty wallet",
            &["tokens", "list", "--wallet", ""],
            2,
            &["wallet id", "empty", "expected"],
        ),
        row(
            "empty type",
            &["tokens", "balance", "--wallet", "w", "--type", ""],
            2,
            &["empty", "expected"],
        ),
        row(
            "too long wallet",
            &["tokens", "list", "--wallet", &long],
            2,
            &[
                "wallet id",
                &shown,
                "257 bytes long",
                "expected at most 256",
            ],
        ),
        row(
            "too long tx",
            &[
                "select", "--wallet", "w", "--type", "CHF", "--amount", "1", "--tx", &long,
            ],
            2,
            &["tx id", "257 bytes long", "expected at most 256"],
        ),
        row(
            "control character in a wallet",
            &["tokens", "list", "--wallet", "w\u{1}x"],
            2,
            &[
                "wallet id",
                "\"w\\u{1}x\"",
                "control character",
                "expected printable",
            ],
        ),
        row(
            "tab in a tx id",
            &["settle", "--tx", "a\tb", "--status", "confirmed"],
            2,
            &["tx id", "\"a\\tb\"", "control character"],
        ),
        row(
            "newline in a queue",
            &["queue", "ingest", "--queue", "q\nx", "--uri", "git:c"],
            2,
            &["\"q\\nx\"", "control character"],
        ),
        row(
            "empty uri",
            &["queue", "ingest", "--queue", "q", "--uri", ""],
            2,
            &["uri", "empty"],
        ),
        row(
            "request id without prefix",
            &["queue", "process", "--request", "req/q/1"],
            2,
            &[
                "\"req/q/1\"",
                "missing the request/ prefix",
                "expected request/<queue>/<n>",
            ],
        ),
        row(
            "request id without a number",
            &["queue", "process", "--request", "request/q/x"],
            2,
            &["\"request/q/x\"", "not a decimal number"],
        ),
        row(
            "request id without a queue",
            &["queue", "process", "--request", "request//1"],
            2,
            &["\"request//1\"", "empty"],
        ),
        row(
            "request id over 64 bits",
            &[
                "queue",
                "process",
                "--request",
                "request/q/18446744073709551616",
            ],
            2,
            &[
                "\"request/q/18446744073709551616\"",
                "above 9223372036854775807",
            ],
        ),
        // The stores keep n as a signed 64-bit number: one past it is bad input on
        // every store, never a backend error.
        row(
            "request id one past the signed 64-bit maximum",
            &[
                "queue",
                "process",
                "--request",
                "request/q/9223372036854775808",
            ],
            2,
            &[
                "\"request/q/9223372036854775808\"",
                "above 9223372036854775807",
                "expected request/<queue>/<n>",
            ],
        ),
        row(
            "request id 0",
            &["queue", "process", "--request", "request/q/0"],
            2,
            &["\"request/q/0\"", "n is 0", "from 1"],
        ),
        row(
            "request id with a leading zero",
            &["queue", "dead-letter", "--request", "request/q/01"],
            2,
            &["\"request/q/01\"", "leading zero", "without leading zeros"],
        ),
        row(
            "request id with a sign",
            &[
                "queue",
                "outcome",
                "--request",
                "request/q/-1",
                "--status",
                "succeeded",
            ],
            2,
            &["\"request/q/-1\""],
        ),
        // request/other/1 exists, but in queue "other": request/q/2 does not.
        row(
            "a request id of another queue",
            &["queue", "dead-letter", "--request", "request/q/2"],
            2,
            &["request/q/2"],
        ),
        row(
            "a request id of a missing queue",
            &["queue", "process", "--request", "request/nope/1"],
            2,
            &["request/nope/1"],
        ),
    ];
    for r in &rows {
        db.check(r);
    }
}

#[test]
fn configuration_is_refused_naming_the_key() {
    let db = seeded();
    let rows = [
        config_row(
            "window 0",
            "[selection]\nsufficiency_window = 0\n",
            &["selection.sufficiency_window", "0", "expected"],
        ),
        config_row(
            "ratio below 1",
            "[selection]\nmax_sufficiency_ratio = 0\n",
            &["selection.max_sufficiency_ratio", "0"],
        ),
        config_row(
            "batch window over 256",
            "[selection]\nbatch_window = 257\n",
            &["selection.batch_window", "257", "256"],
        ),
        config_row(
            "lease 0",
            "[lease]\nlease_expiry_ms = 0\n",
            &["lease.lease_expiry_ms", "more than 0 ms"],
        ),
        config_row(
            "cleanup period 0",
            "[lease]\ncleanup_period_ms = 0\n",
            &["lease.cleanup_period_ms", "more than 0 ms"],
        ),
        config_row(
            "zero retry interval",
            "[selection]\nretry_interval_ms = 0\n",
            &["selection.retry_interval_ms", "1 to 3600000 ms"],
        ),
        config_row(
            "zero gate delay",
            "[admission]\ngate_wait_delay_ms = 0\n",
            &["admission.gate_wait_delay_ms", "1 to 3600000 ms"],
        ),
        config_row(
            "negative gate delay",
            "[admission]\ngate_wait_delay_ms = -5\n",
            &["-5", "line 2"],
        ),
        config_row("negative lease", "[lease]\nlease_expiry_ms = -1\n", &["-1"]),
        config_row("unknown top-level key", "bogus = 1\n", &["bogus"]),
        config_row(
            "unknown key in a section",
            "[selection]\nsufficency_window = 3\n",
            &["sufficency_window"],
        ),
        config_row(
            "a queue override of zero slots",
            "[admission.queues.\"q\"]\nmax_concurrent = 0\n",
            &["max_concurrent", "at least 1 slot"],
        ),
        config_row(
            "precision 0",
            "precision = 0\n",
            &["precision", "1 to 128 bits"],
        ),
        config_row(
            "a string for a number",
            "busy_timeout_ms = \"soon\"\n",
            &["busy_timeout_ms"],
        ),
        env_row(
            "HOLDFAST_BATCH_WINDOW",
            "300",
            &["selection.batch_window", "300"],
        ),
        env_row("HOLDFAST_LEASE_EXPIRY_MS", "0", &["lease.lease_expiry_ms"]),
        env_row(
            "HOLDFAST_RETRY_INTERVAL_MS",
            "-1",
            &["HOLDFAST_RETRY_INTERVAL_MS", "-1", "non-negative"],
        ),
        env_row(
            "HOLDFAST_SUFFICIENCY_WINDOW",
            "0",
            &["selection.sufficiency_window"],
        ),
    ];
    for r in &rows {
        db.check(r);
    }
}

/// An unknown `HOLDFAST_*` variable is not refused (a service may keep settings of
/// its own under the prefix): the command runs, and a warning on stderr names the
/// variable and, for a typo, the key it likely meant. An unknown key in a
/// `--config` file stays an error (the rows above).
#[test]
fn unknown_variables_are_warned_about_not_refused() {
    let db = seeded();
    let out = db
        .command()
        .arg("--db")
        .arg(&db.url)
        .env("HOLDFAST_SUFFICENCY_WINDOW", "2")
        .env("HOLDFAST_PAYMENTS_WEBHOOK", "https://example.invalid/hook")
        .args(["tokens", "balance", "--wallet", "w", "--type", "CHF"])
        .output()
        .expect("run holdfast");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 2, "one warning per variable: {stderr}");
    assert!(
        warnings
            .iter()
            .any(|l| l.contains("HOLDFAST_SUFFICENCY_WINDOW")
                && l.contains("did you mean HOLDFAST_SUFFICIENCY_WINDOW?")),
        "{stderr}"
    );
    assert!(
        warnings
            .iter()
            .any(|l| l.contains("HOLDFAST_PAYMENTS_WEBHOOK") && !l.contains("did you mean")),
        "{stderr}"
    );
    assert!(
        !stderr.contains("example.invalid"),
        "values are not logged: {stderr}"
    );
}

/// An old name of a renamed key still sets it: the command runs, and one warning
/// on stderr names the old variable and the new one.
#[test]
fn old_variable_names_are_warned_about_and_applied() {
    let db = seeded();
    let out = db
        .command()
        .arg("--db")
        .arg(&db.url)
        .env("HOLDFAST_MAX_RETRIES", "3")
        .args(["tokens", "balance", "--wallet", "w", "--type", "CHF"])
        .output()
        .expect("run holdfast");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "one warning: {stderr}");
    assert!(
        warnings[0].contains("HOLDFAST_MAX_RETRIES is deprecated")
            && warnings[0].contains("HOLDFAST_MAX_LEGS"),
        "{stderr}"
    );
}

#[test]
fn database_urls_and_corrupt_rows_are_refused() {
    let db = seeded();
    let balance = ["tokens", "balance", "--wallet", "w", "--type", "CHF"];
    let with_url = |what, url: &str, code, says: &[&str]| Row {
        url: Some(url.to_owned()),
        ..row(what, &balance, code, says)
    };
    let rows = [
        with_url(
            "unknown scheme",
            "mysql://root:hunter2@db.example/app",
            2,
            &["\"mysql\"", "expected"],
        ),
        with_url("no path", "sqlite://", 2, &["no file path"]),
        with_url(
            "query parameters",
            "sqlite://x.db?mode=ro",
            2,
            &["query parameters"],
        ),
        // Nothing listens on port 1: a backend error (3), the password redacted.
        with_url(
            "unreachable host",
            "postgres://app:hunter2@127.0.0.1:1/holdfast",
            3,
            &["postgres://app:***@127.0.0.1:1/holdfast"],
        ),
        // Unescaped `#`, `/`, `?` and `@` in a password: the user info still ends
        // at the last `@`, so the whole password is redacted, and the URL is
        // refused before the driver could read a host or a parameter out of it.
        with_url(
            "a password with # / ? @ and a bad port",
            "postgres://app:h#u/n?t@r2@127.0.0.1:99999/holdfast",
            2,
            &[
                "postgres://app:***@127.0.0.1:99999/holdfast",
                "percent-encode",
            ],
        ),
        with_url(
            "an escaped password and a bad port",
            "postgres://app:h%23u%2Fn%3Ft%40r2@127.0.0.1:99999/holdfast",
            2,
            &[
                "postgres://app:***@127.0.0.1:99999/holdfast",
                "invalid port",
            ],
        ),
        with_url(
            "a password parameter with # / ? @ and a bad port",
            "postgres://app@127.0.0.1:99999/holdfast?sslmode=disable&password=h#u/n?t@r2",
            2,
            &[
                "postgres://app@127.0.0.1:99999/holdfast?sslmode=disable&password=***",
                "invalid port",
            ],
        ),
    ];
    // Every password above as written and decoded: no output mode shows one.
    let passwords = ["hunter2", "h#u/n?t@r2", "h%23u%2Fn%3Ft%40r2"];
    for r in &rows {
        db.check(r);
        let Some(url) = &r.url else { continue };
        for json in [false, true] {
            let mut cmd = db.command();
            cmd.args(["--db", url]);
            if json {
                cmd.arg("--json");
            }
            let out = cmd.args(balance).output().expect("run holdfast");
            let all = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            for password in passwords {
                assert!(!all.contains(password), "the password leaked: {all}");
            }
            if json {
                let err: serde_json::Value = serde_json::from_slice(&out.stderr)
                    .unwrap_or_else(|e| panic!("{}: no JSON on stderr ({e}): {all}", r.what));
                assert_eq!(err["error"]["exit_code"], r.code, "{}: {err}", r.what);
                let message = err["error"]["message"].as_str().unwrap_or_default();
                for needle in &r.says {
                    assert!(
                        message.contains(needle.as_str()),
                        "{needle:?} missing: {err}"
                    );
                }
            }
        }
    }

    // Corrupt stored amounts: a read fails as a backend error naming the row and
    // the canonical form, and nothing is rewritten.
    let conn = Connection::open(db.path()).expect("open");
    for (tx, amount) in [
        ("upper", "0000000000000000000000000000000A"),
        ("short", "a"),
        ("junk", "not an amount at all, really no"),
        ("signed", "-0000000000000000000000000000001"),
    ] {
        conn.execute(
            "INSERT INTO tokens (tx, output, wallet, token_type, amount, spendable) VALUES (?1, 0, ?2, 'CHF', ?3, 1)",
            rusqlite::params![tx, format!("bad-{tx}"), amount],
        )
        .expect("insert a corrupt row");
        let wallet = format!("bad-{tx}");
        db.check(&row(
            "a corrupt stored amount",
            &["tokens", "list", "--wallet", &wallet],
            3,
            &[&format!("{amount:?}"), "expected 32 lowercase hex digits"],
        ));
    }
}
