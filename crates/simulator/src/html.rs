//! The `--report FILE.html` page: one self-contained HTML file (inline CSS and SVG,
//! no scripts, no external assets) with the figure table (an HTML `<table>` with
//! the cells of the text table) and three charts: the per-token conflict
//! distribution, the select latency histogram, and successful selects over time.

use std::fmt::Write as _;
use std::time::Duration;

use super::figures::{conflicts_by_token, to_f64};
use super::runner::StrategyRun;
use super::{SimulationReport, Strategy};
use crate::table::Table;

const COLORS: &[&str] = &["#d9534f", "#2a7ab0", "#5cb85c", "#9b59b6"];
const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 260.0;
const LEFT: f64 = 56.0;
const BOTTOM: f64 = 36.0;
const TOP: f64 = 16.0;

/// Latency histogram bucket upper bounds, in milliseconds (the last is open).
const LATENCY_BUCKETS_MS: &[u64] = &[1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000];

/// `text` with the characters HTML gives a meaning escaped, for element content
/// and quoted attribute values alike.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// `table` as an HTML `<table>`: the headers as column headers, the first cell of
/// each row (the figure's name) as its row header, every cell escaped.
fn html_table(table: &Table) -> String {
    let mut out = String::from(r#"<table class="figures"><thead><tr>"#);
    for header in table.headers() {
        let _ = write!(out, r#"<th scope="col">{}</th>"#, escape(header));
    }
    out.push_str("</tr></thead><tbody>");
    for row in table.rows() {
        out.push_str("<tr>");
        for (i, cell) in row.iter().enumerate() {
            if i == 0 {
                let _ = write!(out, r#"<th scope="row">{}</th>"#, escape(cell));
            } else {
                let _ = write!(out, "<td>{}</td>", escape(cell));
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

fn color(run: &StrategyRun, index: usize) -> &'static str {
    match run.strategy {
        Strategy::Naive => COLORS[0],
        Strategy::Holdfast => COLORS[1],
        Strategy::Ablated(_) | Strategy::Oracle => COLORS[2 + index % 2],
    }
}

fn axis(svg: &mut String, max_y: f64, y_label: &str, x_label: &str) {
    let plot_h = HEIGHT - TOP - BOTTOM;
    let _ = write!(
        svg,
        r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{y0}" stroke="#333"/><line x1="{LEFT}" y1="{y0}" x2="{WIDTH}" y2="{y0}" stroke="#333"/>"##,
        y0 = TOP + plot_h
    );
    for i in 0..=4u32 {
        let value = max_y * f64::from(i) / 4.0;
        let y = TOP + plot_h - plot_h * f64::from(i) / 4.0;
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{WIDTH}" y2="{y:.1}" stroke="#ddd"/><text x="{x:.1}" y="{ty:.1}" font-size="10" text-anchor="end">{label}</text>"##,
            x = LEFT - 4.0,
            ty = y + 3.0,
            label = short(value)
        );
    }
    let _ = write!(
        svg,
        r##"<text x="12" y="{my:.1}" font-size="11" transform="rotate(-90 12 {my:.1})" text-anchor="middle">{}</text><text x="{mx:.1}" y="{by:.1}" font-size="11" text-anchor="middle">{}</text>"##,
        escape(y_label),
        escape(x_label),
        my = TOP + plot_h / 2.0,
        mx = LEFT + (WIDTH - LEFT) / 2.0,
        by = HEIGHT - 4.0
    );
}

fn short(x: f64) -> String {
    if x >= 1000.0 {
        format!("{:.1}k", x / 1000.0)
    } else if x.fract() == 0.0 {
        format!("{x:.0}")
    } else if x < 10.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.1}")
    }
}

fn legend(runs: &[StrategyRun]) -> String {
    let mut out = String::from(r#"<p class="legend">"#);
    for (i, run) in runs.iter().enumerate() {
        let _ = write!(
            out,
            r#"<span><i style="background:{}"></i>{} ({:.2} s)</span>"#,
            color(run, i),
            escape(&run.strategy.name()),
            run.wall.as_secs_f64()
        );
    }
    out.push_str("</p>");
    out
}

/// Each strategy's conflicts per token as a share of its own conflicts, most
/// contended first, side by side (shares, so strategies with very different
/// totals stay comparable; the counts are in the tooltips).
fn conflict_chart(runs: &[StrategyRun]) -> String {
    const SHOWN: usize = 30;
    let series: Vec<(u64, Vec<u64>)> = runs
        .iter()
        .map(|r| {
            let all = conflicts_by_token(r);
            let total: u64 = all.iter().sum();
            (total, all.into_iter().take(SHOWN).collect())
        })
        .collect();
    let share = |v: u64, total: u64| {
        if total == 0 {
            0.0
        } else {
            to_f64(v) / to_f64(total)
        }
    };
    let max = series
        .iter()
        .flat_map(|(total, values)| values.iter().map(|&v| share(v, *total)))
        .fold(0.0, f64::max)
        .max(0.01);
    let mut svg = svg_open("Share of each strategy's conflicts per token, most contended first");
    axis(
        &mut svg,
        max,
        "share of conflicts",
        "token rank (most contended first)",
    );
    let plot_w = WIDTH - LEFT - 8.0;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let group = plot_w / to_f64(u64::try_from(SHOWN).unwrap_or(1));
    let n = to_f64(u64::try_from(runs.len().max(1)).unwrap_or(1));
    let bar = (group * 0.8 / n).max(1.0);
    for (s, (run, (total, values))) in runs.iter().zip(&series).enumerate() {
        for (rank, &v) in values.iter().enumerate() {
            let h = plot_h * share(v, *total) / max;
            let x = LEFT
                + 2.0
                + group * to_f64(u64::try_from(rank).unwrap_or(0))
                + bar * to_f64(u64::try_from(s).unwrap_or(0));
            let _ = write!(
                svg,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{bar:.1}" height="{h:.1}" fill="{c}"><title>{name}: token #{r}: {v} of {total} conflicts</title></rect>"#,
                y = TOP + plot_h - h,
                c = color(run, s),
                name = escape(&run.strategy.name()),
                r = rank + 1
            );
        }
    }
    for rank in [1usize, 10, 20, 30] {
        let x = LEFT + 2.0 + group * (to_f64(u64::try_from(rank - 1).unwrap_or(0)) + 0.4);
        let _ = write!(
            svg,
            r#"<text x="{x:.1}" y="{y:.1}" font-size="10" text-anchor="middle">{rank}</text>"#,
            y = TOP + plot_h + 12.0
        );
    }
    svg.push_str("</svg>");
    svg
}

fn bucket_of(latency: Duration) -> usize {
    let ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
    LATENCY_BUCKETS_MS
        .iter()
        .position(|&upper| ms < upper)
        .unwrap_or(LATENCY_BUCKETS_MS.len())
}

/// Select latency histogram on logarithmic buckets.
fn latency_chart(runs: &[StrategyRun]) -> String {
    let buckets = LATENCY_BUCKETS_MS.len() + 1;
    let counts: Vec<Vec<u64>> = runs
        .iter()
        .map(|r| {
            let mut c = vec![0u64; buckets];
            for s in &r.samples {
                c[bucket_of(s.latency)] += 1;
            }
            c
        })
        .collect();
    let max = counts.iter().flatten().copied().max().unwrap_or(0).max(1);
    let mut svg = svg_open("Select latency histogram");
    axis(
        &mut svg,
        to_f64(max),
        "selects",
        "select latency (ms, bucket upper bound)",
    );
    let plot_w = WIDTH - LEFT - 8.0;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let group = plot_w / to_f64(u64::try_from(buckets).unwrap_or(1));
    let n = to_f64(u64::try_from(runs.len().max(1)).unwrap_or(1));
    let bar = group * 0.8 / n;
    for (s, (run, values)) in runs.iter().zip(&counts).enumerate() {
        for (b, &v) in values.iter().enumerate() {
            let h = plot_h * to_f64(v) / to_f64(max);
            let x = LEFT
                + 2.0
                + group * to_f64(u64::try_from(b).unwrap_or(0))
                + bar * to_f64(u64::try_from(s).unwrap_or(0));
            let _ = write!(
                svg,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{bar:.1}" height="{h:.1}" fill="{c}"><title>{name}: {v} selects</title></rect>"#,
                y = TOP + plot_h - h,
                c = color(run, s),
                name = escape(&run.strategy.name()),
            );
        }
    }
    for b in 0..buckets {
        let label = LATENCY_BUCKETS_MS
            .get(b)
            .map_or_else(|| "more".to_owned(), |u| format!("<{u}"));
        let x = LEFT + 2.0 + group * (to_f64(u64::try_from(b).unwrap_or(0)) + 0.4);
        let _ = write!(
            svg,
            r#"<text x="{x:.1}" y="{y:.1}" font-size="10" text-anchor="middle">{}</text>"#,
            escape(&label),
            y = TOP + plot_h + 12.0
        );
    }
    svg.push_str("</svg>");
    svg
}

/// Successful selects per second over each run, one line per strategy; the x axis
/// is the share of that strategy's own run (their durations differ widely, and
/// are in the legend).
fn throughput_chart(runs: &[StrategyRun]) -> String {
    const SLOTS: u32 = 40;
    let rates: Vec<Vec<f64>> = runs
        .iter()
        .map(|r| {
            let wall = r.wall.max(Duration::from_millis(1));
            let slot = wall / SLOTS;
            let slot_secs = slot.as_secs_f64().max(1e-6);
            let mut c = vec![0u64; usize::try_from(SLOTS).unwrap_or(40)];
            for s in r.samples.iter().filter(|s| s.ok) {
                let i = usize::try_from(s.finished_at.as_nanos() / slot.as_nanos().max(1))
                    .unwrap_or(usize::MAX)
                    .min(c.len() - 1);
                c[i] += 1;
            }
            c.into_iter().map(|n| to_f64(n) / slot_secs).collect()
        })
        .collect();
    let max = rates.iter().flatten().copied().fold(1.0, f64::max);
    let mut svg = svg_open("Successful selects per second over each run");
    axis(
        &mut svg,
        max,
        "selects/s",
        "progress through the strategy's own run (%)",
    );
    let plot_w = WIDTH - LEFT - 8.0;
    let plot_h = HEIGHT - TOP - BOTTOM;
    for (s, (run, values)) in runs.iter().zip(&rates).enumerate() {
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let t = (to_f64(u64::try_from(i).unwrap_or(0)) + 0.5) / f64::from(SLOTS);
                format!(
                    "{:.1},{:.1}",
                    LEFT + plot_w * t,
                    TOP + plot_h - plot_h * v / max
                )
            })
            .collect();
        let _ = write!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"><title>{}: {:.2} s</title></polyline>"#,
            color(run, s),
            points.join(" "),
            escape(&run.strategy.name()),
            run.wall.as_secs_f64()
        );
    }
    for i in 0..=4u32 {
        let _ = write!(
            svg,
            r#"<text x="{x:.1}" y="{y:.1}" font-size="10" text-anchor="middle">{p}</text>"#,
            x = LEFT + plot_w * f64::from(i) / 4.0,
            y = TOP + plot_h + 12.0,
            p = i * 25
        );
    }
    svg.push_str("</svg>");
    svg
}

fn svg_open(title: &str) -> String {
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{t}"><title>{t}</title>"#,
        t = escape(title)
    )
}

impl SimulationReport {
    /// The self-contained HTML report.
    pub fn html(&self) -> String {
        let mut page = String::new();
        let title = format!("holdfast simulate: {} on {}", self.workload, self.backend);
        let _ = write!(
            page,
            r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{t}</title><style>
body{{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:900px}}
table.figures{{border-collapse:collapse;font-size:12px;margin:12px 0}}
.figures th,.figures td{{border:1px solid #ddd;padding:3px 8px}}
.figures thead th{{background:#f0f0f0}} .figures tbody th{{text-align:left;font-weight:normal}}
.figures td{{text-align:right;font-variant-numeric:tabular-nums}}
.settings{{font-size:13px;color:#444}}
h2{{margin-top:28px;font-size:18px}} .legend span{{margin-right:18px}}
.legend i{{display:inline-block;width:12px;height:12px;margin-right:6px;vertical-align:middle}}
</style></head><body><h1>{t}</h1>"#,
            t = escape(&title)
        );
        page.push_str(r#"<div class="settings">"#);
        for line in self.settings_lines() {
            let _ = write!(page, "<p>{}</p>", escape(&line));
        }
        page.push_str("</div><h2>Figures</h2>");
        for table in self.figure_tables() {
            page.push_str(&html_table(&table));
        }
        if let Some(line) = self.raw_limit_line() {
            let _ = write!(page, "<p>{}</p>", escape(&line));
        }
        if self.runs.is_empty() {
            page.push_str("<p>No token strategies in this run (admission figures above).</p>");
        } else {
            page.push_str(&legend(&self.runs));
            page.push_str("<h2>Per-token conflict distribution</h2><p>Each token's share of the strategy's lost races, the 30 most contended tokens of each strategy (counts in the tooltips; totals per select in the table). A steep first bar is the incident's shape: a few hot tokens take most conflicts.</p>");
            page.push_str(&conflict_chart(&self.runs));
            page.push_str(
                "<h2>Select latency</h2><p>Selects per latency bucket (backoffs included).</p>",
            );
            page.push_str(&latency_chart(&self.runs));
            page.push_str("<h2>Throughput over time</h2><p>Successful selects per second in 40 slots of each strategy's own run (run lengths in the legend).</p>");
            page.push_str(&throughput_chart(&self.runs));
        }
        page.push_str("</body></html>\n");
        page
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_html_tables_with_every_cell_escaped() {
        let mut table = Table::new(["figure", "a<b"]);
        table.row(["x & y", "<script>\"'</script>"]);
        let html = html_table(&table);
        assert_eq!(
            html,
            "<table class=\"figures\"><thead><tr><th scope=\"col\">figure</th>\
             <th scope=\"col\">a&lt;b</th></tr></thead><tbody><tr>\
             <th scope=\"row\">x &amp; y</th>\
             <td>&lt;script&gt;&quot;&#39;&lt;/script&gt;</td></tr></tbody></table>"
        );
    }
}
