//! Rendering command results: JSON for programs (one object per command, stable
//! field names, amounts as decimal strings because they may exceed 2^53) and
//! aligned plain-text tables for people.

use holdfast::domain::{Quantity, Timestamp};
use serde::Serialize;

/// A command result that can be shown to a person; its `Serialize` form is the
/// JSON shape documented for the command.
pub trait Report: Serialize {
    /// The human form: a few lines or a table, ending with a newline.
    fn human(&self) -> String;
}

/// A rendered command result, ready to print on stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The JSON form: one pretty-printed object, fields in declaration order.
    pub json: String,
    /// The human form.
    pub text: String,
}

impl Rendered {
    /// Renders `report` both ways.
    pub fn of<R: Report>(report: &R) -> Rendered {
        Rendered {
            // The reports are plain structs with string keys: serializing them
            // cannot fail, and if it ever did the output says so instead of panicking.
            json: serde_json::to_string_pretty(report).unwrap_or_else(|e| {
                serde_json::json!({ "error": format!("cannot render as JSON: {e}") }).to_string()
            }),
            text: report.human(),
        }
    }

    /// Renders `report` with its JSON on one line: for a command whose output is a
    /// stream of JSON lines (`queue work`), where every line parses on its own.
    pub fn line<R: Report>(report: &R) -> Rendered {
        Rendered {
            json: json_line(report),
            text: report.human(),
        }
    }

    /// The text to print: the JSON object or the human form, ending with a newline.
    pub fn to_text(&self, json: bool) -> String {
        if json {
            format!("{}\n", self.json)
        } else {
            self.text.clone()
        }
    }
}

/// `value` as compact JSON on one line, without the newline.
pub fn json_line<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| {
        serde_json::json!({ "error": format!("cannot render as JSON: {e}") }).to_string()
    })
}

/// Plain-text tables: one type for the commands and the simulator's report,
/// whose HTML page renders the same tables.
pub use holdfast_simulator::Table;

/// At most `max` items joined with ", ", then how many more there are.
pub fn short_list(items: &[String], max: usize) -> String {
    let mut text = items
        .iter()
        .take(max)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > max {
        text.push_str(&format!(
            ", … (+{} more; --json lists all)",
            items.len() - max
        ));
    }
    text
}

/// An amount in its canonical decimal form (what the JSON carries).
pub fn amount(q: Quantity) -> String {
    q.to_string()
}

/// A timestamp as RFC 3339 UTC with milliseconds, or the raw milliseconds when it
/// is beyond the calendar range.
pub fn time(ts: Timestamp) -> String {
    ts.rfc3339().unwrap_or_else(|| ts.to_string())
}

/// A duration in whole milliseconds, saturating.
pub fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A short human duration: `850ms`, `12s`, `3m05s`, `2h07m`.
pub fn age(d: std::time::Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        format!("{}ms", d.as_millis())
    } else if secs < 60 {
        format!("{secs}s")
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn long_lists_are_cut_short() {
        let items: Vec<String> = (0..5).map(|i| format!("t:{i}")).collect();
        assert_eq!(short_list(&items, 5), "t:0, t:1, t:2, t:3, t:4");
        assert_eq!(
            short_list(&items, 2),
            "t:0, t:1, … (+3 more; --json lists all)"
        );
    }

    #[test]
    fn ages_are_short() {
        assert_eq!(age(Duration::from_millis(850)), "850ms");
        assert_eq!(age(Duration::from_secs(12)), "12s");
        assert_eq!(age(Duration::from_secs(185)), "3m05s");
        assert_eq!(age(Duration::from_secs(7620)), "2h07m");
    }
}
