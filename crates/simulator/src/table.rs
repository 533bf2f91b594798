//! The human form of a simulation: the settings, then one row per figure with a
//! column per strategy and the ratio holdfast / naive (and ablated / holdfast).

use std::fmt::Write as _;

use super::figures::StrategyFigures;
use super::{SimulationReport, StrategyEntry};

fn ratio(numerator: f64, denominator: f64) -> String {
    if denominator == 0.0 && numerator == 0.0 {
        "=".to_owned()
    } else if denominator == 0.0 {
        "n/a".to_owned()
    } else {
        format!("x{:.2}", numerator / denominator)
    }
}

fn number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else if x.abs() >= 100.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

type Getter = fn(&StrategyFigures) -> Option<f64>;

fn figure_rows() -> Vec<(&'static str, Getter)> {
    use super::figures::to_f64;
    vec![
        ("selects", |f| Some(to_f64(f.selects))),
        ("succeeded", |f| Some(to_f64(f.succeeded))),
        ("selects/s", |f| Some(f.selects_per_second)),
        ("spurious failures", |f| Some(to_f64(f.spurious_failures))),
        ("insufficient funds", |f| Some(to_f64(f.insufficient_funds))),
        ("store errors", |f| Some(to_f64(f.errors))),
        ("lock attempts/select", |f| Some(f.lock_attempts_per_select)),
        ("conflicts/select", |f| Some(f.conflicts_per_select)),
        ("hottest token conflict share", |f| {
            Some(f.hottest_token_conflict_share)
        }),
        ("top 1% conflict share", |f| Some(f.top_1pct_conflict_share)),
        ("distinct tokens attempted", |f| {
            Some(to_f64(f.distinct_tokens_attempted))
        }),
        ("distinct tokens per burst", |f| {
            Some(f.distinct_share_per_burst)
        }),
        ("round trips/select", |f| Some(f.round_trips_per_select)),
        ("inputs/select", |f| Some(f.inputs_per_select)),
        ("change share", |f| Some(f.change_share)),
        ("latency p50 ms", |f| Some(f.latency_ms.p50)),
        ("latency p95 ms", |f| Some(f.latency_ms.p95)),
        ("latency p99 ms", |f| Some(f.latency_ms.p99)),
        ("latency max ms", |f| Some(f.latency_ms.max)),
        ("peak memory MiB", |f| {
            f.peak_memory_bytes
                .map(|b| super::figures::round3(to_f64(b) / 1_048_576.0))
        }),
        ("locks left", |f| Some(to_f64(f.locks_left))),
        ("invariant violations", |f| {
            Some(to_f64(f.invariant_violations))
        }),
        ("locks lost to lease", |f| {
            Some(to_f64(f.locks_lost_to_lease))
        }),
        ("selects outliving lease", |f| {
            Some(to_f64(f.selects_outliving_lease))
        }),
    ]
}

impl SimulationReport {
    /// The lines that open every report: workload, settings, the backoff note.
    pub fn settings_lines(&self) -> Vec<String> {
        let s = &self.settings;
        vec![
            format!(
                "workload {} on {} (seed {}): {} tokens, {} requests, {} replicas, concurrency {}",
                self.workload,
                self.backend,
                self.seed,
                s.tokens,
                s.requests,
                s.replicas,
                s.concurrency
            ),
            format!(
                "legs {}, backoff uniform in [0, {} ms), lease {} s simulated at {}x (each strategy on a fresh database)",
                s.legs,
                s.retry_interval_ms,
                s.lease_expiry_ms / 1000,
                s.time_scale
            ),
            format!("note: {}", s.note),
        ]
    }

    /// The figure tables, cells as shown: the token strategies' (one row per
    /// figure, a column per strategy, then the ratios), then one per admission
    /// entry. The text and the HTML report both render these.
    pub fn figure_tables(&self) -> Vec<Table> {
        let mut tables = Vec::new();
        let tokens: Vec<&StrategyFigures> = self
            .strategies
            .iter()
            .filter_map(|e| match e {
                StrategyEntry::Tokens(f) => Some(f.as_ref()),
                StrategyEntry::Admission(_) => None,
            })
            .collect();
        if !tokens.is_empty() {
            tables.push(token_table(&tokens));
        }
        for entry in &self.strategies {
            if let StrategyEntry::Admission(a) = entry {
                let mut t = Table::new(["figure", "value"]);
                for (name, value) in [
                    ("admits", a.admits.to_string()),
                    ("admits/s", number(a.admits_per_second)),
                    ("invariant violations", a.invariant_violations.to_string()),
                    ("slots leaked", a.slots_leaked.to_string()),
                    ("wedged requests", a.wedged_requests.to_string()),
                    ("crashes injected", a.crashes_injected.to_string()),
                    ("redeliveries", a.redeliveries.to_string()),
                    ("holds (gate closed)", a.holds.to_string()),
                    ("dead-lettered", a.dead_lettered.to_string()),
                    ("superseded", a.superseded.to_string()),
                    ("succeeded", a.succeeded.to_string()),
                    ("undelivered", a.undelivered.to_string()),
                    ("steps", a.steps.to_string()),
                    ("wall s", number(a.wall_seconds)),
                ] {
                    t.row([name.to_owned(), value]);
                }
                tables.push(t);
            }
        }
        tables
    }

    /// The physical limit and holdfast's share of it, when it was measured.
    pub fn raw_limit_line(&self) -> Option<String> {
        self.raw_limit.as_ref().map(|limit| {
            format!(
                "physical limit: {} raw select cycles/s (read, claim, settle) on the same database and concurrency; holdfast reaches {}",
                number(limit.cycles_per_second),
                limit
                    .fraction_of_raw_limit
                    .map_or_else(|| "n/a".to_owned(), |f| format!("{:.1}% of it", f * 100.0))
            )
        })
    }

    /// The report as text: settings, the figure table with ratios, notes.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for line in self.settings_lines() {
            let _ = writeln!(out, "{line}");
        }
        out.push('\n');
        for table in self.figure_tables() {
            out.push_str(&table.render());
        }
        if let Some(line) = self.raw_limit_line() {
            let _ = writeln!(out, "\n{line}");
        }
        out
    }
}

fn token_table(strategies: &[&StrategyFigures]) -> Table {
    let naive = strategies.iter().find(|f| f.strategy == "naive");
    let holdfast = strategies.iter().find(|f| f.strategy == "holdfast");
    let ablated: Vec<&&StrategyFigures> = strategies
        .iter()
        .filter(|f| f.strategy.starts_with("holdfast-"))
        .collect();
    let mut headers: Vec<String> = vec!["figure".to_owned()];
    headers.extend(strategies.iter().map(|f| f.strategy.clone()));
    let compare = naive.is_some() && holdfast.is_some();
    if compare {
        headers.push("holdfast/naive".to_owned());
    }
    if holdfast.is_some() {
        for a in &ablated {
            headers.push(format!("{}/holdfast", a.strategy));
        }
    }
    let mut table = Table::new(headers);
    for (name, get) in figure_rows() {
        let mut row = vec![name.to_owned()];
        row.extend(
            strategies
                .iter()
                .map(|f| get(f).map_or_else(|| "n/a".to_owned(), number)),
        );
        if let (Some(n), Some(h)) = (naive, holdfast) {
            row.push(match (get(h), get(n)) {
                (Some(h), Some(n)) => ratio(h, n),
                _ => "n/a".to_owned(),
            });
        }
        if let Some(h) = holdfast {
            for a in &ablated {
                row.push(match (get(a), get(h)) {
                    (Some(a), Some(h)) => ratio(a, h),
                    _ => "n/a".to_owned(),
                });
            }
        }
        table.row(row);
    }
    table
}

/// A plain-text table with left-aligned columns separated by two spaces.
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new<I, S>(headers: I) -> Table
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (missing cells are blank, extra cells are dropped).
    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut cells: Vec<String> = cells.into_iter().map(Into::into).collect();
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// The column headers.
    pub fn headers(&self) -> &[String] {
        &self.headers
    }

    /// The rows, each with one cell per header.
    pub fn rows(&self) -> &[Vec<String>] {
        &self.rows
    }

    /// Whether the table has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text, one line per row, each ending with a newline.
    pub fn render(&self) -> String {
        let width = |s: &str| s.chars().count();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(width(cell));
            }
        }
        let mut out = String::new();
        for line in std::iter::once(&self.headers).chain(&self.rows) {
            let mut text = String::new();
            for (i, (cell, w)) in line.iter().zip(&widths).enumerate() {
                if i + 1 == line.len() {
                    text.push_str(cell);
                } else {
                    let _ = write!(text, "{cell:<w$}  ");
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_trim_trailing_space() {
        let mut t = Table::new(["id", "amount", "note"]);
        t.row(["a:0", "100", ""]);
        t.row(["long-tx:12", "7", "x"]);
        assert_eq!(
            t.render(),
            "id          amount  note\na:0         100\nlong-tx:12  7       x\n"
        );
    }
}
