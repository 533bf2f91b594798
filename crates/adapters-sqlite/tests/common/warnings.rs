//! A subscriber capturing warnings, for tests that check what a load logged. Shared
//! by the SQLite and PostgreSQL adapters' tests (each includes this file), which
//! cannot depend on each other.

use std::sync::{Arc, Mutex, PoisonError};

/// The warnings (and errors) logged while this is the thread's default subscriber
/// (`tracing::subscriber::set_default`), one line each: the message, then
/// `field=value` pairs. Under `#[tokio::test]` (a current-thread runtime) that is
/// everything the test's futures log.
#[derive(Debug, Clone, Default)]
pub struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    pub fn lines(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many lines contain every one of `parts`.
    pub fn count(&self, parts: &[&str]) -> usize {
        self.matching(parts).len()
    }

    /// The lines containing every one of `parts`.
    pub fn matching(&self, parts: &[&str]) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|l| parts.iter().all(|p| l.contains(p)))
            .collect()
    }
}

struct Line(String);

impl tracing::field::Visit for Line {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.insert_str(0, &format!("{value:?}"));
        } else {
            self.0.push_str(&format!(" {}={value:?}", field.name()));
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push_str(&format!(" {}={value}", field.name()));
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, meta: &tracing::Metadata<'_>) -> bool {
        *meta.level() <= tracing::Level::WARN
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::WARN)
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = Line(String::new());
        event.record(&mut line);
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line.0);
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}
