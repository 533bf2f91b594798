//! `cargo xtask browser` (also a step of `cargo xtask ci`): the simulator's HTML
//! report as a browser sees it. It writes a report of a small hot-lineage
//! workload on SQLite (`holdfast simulate --report`), renders it with headless
//! Chromium (`--dump-dom`) and checks the DOM Chromium parsed, not the file we
//! wrote: three charts, each an `<svg>` with data (a bar of non-zero height or a
//! line with points), and the figures `<table>` with a column per strategy and
//! the expected figure rows, every row as wide as the header. A stray `<` in a
//! cell or an unclosed element would move or drop elements in the parsed DOM.
//!
//! The `holdfast` binary comes from the same build as the test step
//! (`cargo test --no-run --workspace --features holdfast/failpoints`), so under
//! `ci` it compiles nothing. Chromium is `chromium` (or `chromium-browser`) on
//! `PATH`; when it is missing, `CI=true` installs it with apt-get, otherwise the
//! step prints a loud SKIPPED and passes.
//!
//! Option: `--screenshot FILE.png` also saves a picture of the page.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::bench::{root, target_dir};
use crate::{Error, postgres, process};

/// The workload of the report: a hot lineage small enough to run in a second in
/// a debug build, contended enough that every chart has data.
const WORKLOAD: &str = r#"name = "browser-check"
replicas = 2
concurrency = 8
legs = 50

[[tokens]]
wallet = "alice"
type = "CHF"
amount = "1"
count = 4

[[tokens]]
wallet = "alice"
type = "CHF"
amount = "36"
count = 1

[[requests]]
wallet = "alice"
type = "CHF"
amount = "1"
count = 40
mode = "settle"
"#;

/// The charts html.rs draws.
const CHARTS: usize = 3;
/// Column headers the figures table must have (the strategies of the run).
const COLUMNS: &[&str] = &["figure", "naive", "holdfast", "holdfast/naive"];
/// Figure rows the table must have.
const ROWS: &[&str] = &[
    "selects",
    "succeeded",
    "selects/s",
    "spurious failures",
    "conflicts/select",
    "round trips/select",
    "inputs/select",
    "change share",
    "latency p99 ms",
    "invariant violations",
];
/// Program names tried on `PATH`, in order.
const CHROMIUM: &[&str] = &["chromium", "chromium-browser"];
/// How long one Chromium run may take before it is killed.
const CHROMIUM_TIMEOUT: Duration = Duration::from_secs(60);

/// What the check found in a report that passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Charts with data.
    pub charts: usize,
    /// Rows of the figures table.
    pub rows: usize,
    /// Columns of the figures table.
    pub columns: usize,
}

/// The `browser` task.
pub fn run(args: &[String]) -> Result<(), Error> {
    let mut screenshot = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.clone().next()) {
            ("--screenshot", Some(path)) => {
                screenshot = Some(std::path::absolute(path).map_err(|source| Error::Io {
                    action: "resolving",
                    path: PathBuf::from(path),
                    source,
                })?);
                args.next();
            }
            _ => {
                return Err(Error::UnexpectedArgument {
                    task: "browser",
                    arg: arg.clone(),
                });
            }
        }
    }
    let started = Instant::now();
    let Some(chromium) = chromium()? else {
        return Ok(());
    };
    let root = root();
    process::run(process::cargo().current_dir(&root).args([
        "test",
        "--no-run",
        "--quiet",
        "--workspace",
        "--features",
        "holdfast/failpoints",
    ]))?;
    let binary = target_dir(&root).join("debug").join("holdfast");
    let scratch = std::env::temp_dir().join(format!("holdfast-browser-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|source| Error::Io {
        action: "creating",
        path: scratch.clone(),
        source,
    })?;
    let result = check_in(&scratch, &binary, &chromium, screenshot.as_deref());
    let _ = std::fs::remove_dir_all(&scratch);
    let found = result?;
    eprintln!(
        "browser: the report renders with {} charts with data and a figures table of {} rows x {} columns ({}, {:.1} s)",
        found.charts,
        found.rows,
        found.columns,
        chromium.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn check_in(
    scratch: &Path,
    binary: &Path,
    chromium: &Path,
    screenshot: Option<&Path>,
) -> Result<Found, Error> {
    let workload = scratch.join("browser-check.toml");
    std::fs::write(&workload, WORKLOAD).map_err(|source| Error::Io {
        action: "writing",
        path: workload.clone(),
        source,
    })?;
    let report = scratch.join("report.html");
    process::output(
        Command::new(binary)
            .current_dir(scratch)
            .env("HOLDFAST_LOG", "error")
            .env_remove("HOLDFAST_CONFIG")
            .env_remove("HOLDFAST_JSON")
            .args(["simulate", "--seed", "42", "--workload"])
            .arg(&workload)
            .arg("--db")
            .arg(scratch.join("sim.db"))
            .arg("--report")
            .arg(&report),
    )?;
    let url = format!("file://{}", report.display());
    let dump = scratch.join("dom.html");
    let command = render(chromium, scratch, &["--dump-dom", &url], &dump)?;
    let dom = std::fs::read_to_string(&dump).map_err(|source| Error::Io {
        action: "reading",
        path: dump.clone(),
        source,
    })?;
    let found = check_dom(&dom).map_err(|problems| Error::BadOutput {
        command,
        detail: format!(
            "the rendered report is not what html.rs means to draw:\n  {}",
            problems.join("\n  ")
        ),
    })?;
    if let Some(png) = screenshot {
        let shot = format!("--screenshot={}", png.display());
        render(
            chromium,
            scratch,
            &[&shot, "--window-size=1000,2400", "--hide-scrollbars", &url],
            &scratch.join("screenshot.log"),
        )?;
        eprintln!("browser: screenshot in {}", png.display());
    }
    Ok(found)
}

/// Runs headless Chromium with `args`, stdout to `stdout`, killed after
/// [`CHROMIUM_TIMEOUT`]. Returns the command line, for messages.
fn render(chromium: &Path, scratch: &Path, args: &[&str], stdout: &Path) -> Result<String, Error> {
    let profile = format!("--user-data-dir={}", scratch.join("profile").display());
    let mut cmd = Command::new(chromium);
    // --no-sandbox: CI containers run as root, where Chromium's sandbox refuses
    // to start. The profile stays in the scratch directory.
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        &profile,
    ])
    .args(args);
    let command = process::describe(&cmd);
    eprintln!("$ {command}");
    let out = File::create(stdout).map_err(|source| Error::Io {
        action: "creating",
        path: stdout.to_path_buf(),
        source,
    })?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(Stdio::null())
        .spawn()
        .map_err(|source| Error::Spawn {
            command: command.clone(),
            source,
        })?;
    let deadline = Instant::now() + CHROMIUM_TIMEOUT;
    loop {
        let polled = child.try_wait().map_err(|source| Error::Spawn {
            command: command.clone(),
            source,
        })?;
        match polled {
            Some(status) if status.success() => return Ok(command),
            Some(status) => return Err(Error::CommandFailed { command, status }),
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::BadOutput {
                    command,
                    detail: format!("no answer in {} s; killed", CHROMIUM_TIMEOUT.as_secs()),
                });
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn find_chromium() -> Option<PathBuf> {
    CHROMIUM.iter().find_map(|name| on_path(name))
}

/// Chromium, installed first under `CI=true` if missing; `None` (after a loud
/// warning) when it is missing outside CI.
fn chromium() -> Result<Option<PathBuf>, Error> {
    if let Some(path) = find_chromium() {
        return Ok(Some(path));
    }
    if !postgres::under_ci() {
        let bar = "!".repeat(78);
        eprintln!(
            "{bar}\nWARNING: browser check SKIPPED: no {} on PATH.\n\
             WARNING: the HTML report was not rendered. Install Chromium \
             (apt-get install chromium) or run with CI=true to install it.\n{bar}",
            CHROMIUM.join(" or ")
        );
        return Ok(None);
    }
    eprintln!("browser: no Chromium on PATH; CI=true: installing it with apt-get");
    // No recommends (printing, notification and power daemons); fonts so that a
    // screenshot shows text.
    let install = || {
        process::run(
            Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args([
                    "install",
                    "-y",
                    "--no-install-recommends",
                    "chromium",
                    "fonts-liberation",
                ]),
        )
    };
    if install().is_err() {
        // A fresh image has no package lists yet.
        process::run(Command::new("apt-get").args(["update"]))?;
        install()?;
    }
    find_chromium().map(Some).ok_or_else(|| {
        Error::NoBrowser(format!(
            "apt-get installed chromium but no {} is on PATH",
            CHROMIUM.join(" or ")
        ))
    })
}

/// The elements `<tag ...>...</tag>` of `html`, in order (not nested in
/// themselves, as `svg`, `table` and `tr` are not here).
fn elements<'a>(html: &'a str, tag: &str) -> Vec<&'a str> {
    let open = format!("<{tag}");
    let close = format!("</{tag}>");
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        // `<tr` must not match `<track`: the name ends at a space or `>`.
        if !after.starts_with([' ', '>', '\n', '/']) {
            rest = after;
            continue;
        }
        let Some(len) = rest[start..].find(&close) else {
            break;
        };
        let end = start + len + close.len();
        out.push(&rest[start..end]);
        rest = &rest[end..];
    }
    out
}

/// The text of each `<th scope="SCOPE">` in `html`.
fn headers<'a>(html: &'a str, scope: &str) -> Vec<&'a str> {
    let open = format!(r#"<th scope="{scope}">"#);
    html.split(&open)
        .skip(1)
        .filter_map(|s| s.split("</th>").next())
        .collect()
}

/// The value of attribute `name` in the start tag that begins `element`.
fn attribute<'a>(element: &'a str, name: &str) -> Option<&'a str> {
    let tag = element.split('>').next()?;
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    tag[start..].split('"').next()
}

/// Whether a chart draws data: a bar of non-zero height or a line with points.
fn has_data(svg: &str) -> bool {
    let bars = elements(svg, "rect").into_iter().any(|rect| {
        attribute(rect, "height")
            .and_then(|h| h.parse::<f64>().ok())
            .is_some_and(|h| h > 0.0)
    });
    let lines = elements(svg, "polyline")
        .into_iter()
        .any(|line| attribute(line, "points").is_some_and(|p| p.contains(',')));
    bars || lines
}

/// Checks the DOM Chromium rendered; every problem found, or what was found.
pub fn check_dom(dom: &str) -> Result<Found, Vec<String>> {
    let mut problems = Vec::new();
    let charts = elements(dom, "svg");
    if charts.len() != CHARTS {
        problems.push(format!("{} <svg> charts, expected {CHARTS}", charts.len()));
    }
    for (i, svg) in charts.iter().enumerate() {
        if !has_data(svg) {
            let title = elements(svg, "title").first().map_or("", |t| {
                t.trim_start_matches("<title>").trim_end_matches("</title>")
            });
            problems.push(format!("chart {} ({title}) draws no data", i + 1));
        }
    }
    let tables: Vec<&str> = elements(dom, "table")
        .into_iter()
        .filter(|t| attribute(t, "class") == Some("figures"))
        .collect();
    let (rows, columns) = match tables.as_slice() {
        [table] => {
            let columns = headers(table, "col");
            for expected in COLUMNS {
                if !columns.contains(expected) {
                    problems.push(format!("figures table has no column {expected:?}"));
                }
            }
            let body = elements(table, "tbody");
            let rows = body.first().map_or_else(Vec::new, |b| elements(b, "tr"));
            let names: Vec<&str> = rows
                .iter()
                .filter_map(|row| headers(row, "row").first().copied())
                .collect();
            for expected in ROWS {
                if !names.contains(expected) {
                    problems.push(format!("figures table has no row {expected:?}"));
                }
            }
            for row in &rows {
                let cells = headers(row, "row").len() + elements(row, "td").len();
                if cells != columns.len() {
                    problems.push(format!(
                        "a figures row has {cells} cells for {} columns: {row}",
                        columns.len()
                    ));
                }
            }
            (rows.len(), columns.len())
        }
        other => {
            problems.push(format!(
                "{} <table class=\"figures\">, expected one",
                other.len()
            ));
            (0, 0)
        }
    };
    if problems.is_empty() {
        Ok(Found {
            charts: charts.len(),
            rows,
            columns,
        })
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(rows: &[&str]) -> String {
        let mut out = String::from(r#"<table class="figures"><thead><tr>"#);
        for c in COLUMNS {
            out.push_str(&format!(r#"<th scope="col">{c}</th>"#));
        }
        out.push_str("</tr></thead><tbody>");
        for r in rows {
            out.push_str(&format!(
                r#"<tr><th scope="row">{r}</th><td>1</td><td>2</td><td>x2.00</td></tr>"#
            ));
        }
        out.push_str("</tbody></table>");
        out
    }

    const BARS: &str = r#"<svg role="img"><title>bars</title><rect x="1" y="2" width="3" height="4.5"><title>t</title></rect></svg>"#;
    const LINE: &str = r#"<svg role="img"><title>line</title><polyline fill="none" points="1.0,2.0 3.0,4.0"><title>t</title></polyline></svg>"#;

    fn page(charts: &[&str], table: &str) -> String {
        format!(
            "<html><head></head><body><h1>r</h1>{table}{}</body></html>",
            charts.concat()
        )
    }

    #[test]
    fn a_report_with_three_charts_and_the_table_passes() {
        let dom = page(&[BARS, BARS, LINE], &table(ROWS));
        assert_eq!(
            check_dom(&dom),
            Ok(Found {
                charts: 3,
                rows: ROWS.len(),
                columns: COLUMNS.len()
            })
        );
    }

    #[test]
    fn missing_or_empty_charts_fail() {
        let empty = r#"<svg role="img"><title>empty</title><rect x="1" y="2" width="3" height="0.0"></rect><polyline points=""></polyline></svg>"#;
        let problems = check_dom(&page(&[BARS, empty, LINE], &table(ROWS))).unwrap_err();
        assert_eq!(problems, ["chart 2 (empty) draws no data"]);
        let problems = check_dom(&page(&[BARS, LINE], &table(ROWS))).unwrap_err();
        assert_eq!(problems, ["2 <svg> charts, expected 3"]);
    }

    #[test]
    fn a_missing_table_row_or_cell_fails() {
        let problems = check_dom(&page(&[BARS, BARS, LINE], "<pre>figures</pre>")).unwrap_err();
        assert_eq!(problems, [r#"0 <table class="figures">, expected one"#]);
        let problems = check_dom(&page(&[BARS, BARS, LINE], &table(&ROWS[1..]))).unwrap_err();
        assert_eq!(problems, [r#"figures table has no row "selects""#]);
        let short = table(ROWS).replacen("<td>2</td>", "", 1);
        let problems = check_dom(&page(&[BARS, BARS, LINE], &short)).unwrap_err();
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("a figures row has 3 cells for 4 columns"));
    }

    #[test]
    fn elements_match_whole_tag_names() {
        let html = "<track></track><tr><td>a</td></tr><tr class=\"x\"><td>b</td></tr>";
        assert_eq!(
            elements(html, "tr"),
            ["<tr><td>a</td></tr>", "<tr class=\"x\"><td>b</td></tr>"]
        );
    }
}
