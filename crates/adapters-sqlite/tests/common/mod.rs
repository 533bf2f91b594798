//! Shared by the integration tests: a temporary database file, removed on drop, and
//! a subscriber capturing warnings.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use holdfast_adapters_sqlite::{SqliteBackend, SqliteOptions};

/// A fresh directory under the system temp dir holding one database file.
#[derive(Debug)]
pub struct TempDb {
    dir: PathBuf,
}

impl TempDb {
    pub fn new() -> TempDb {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "holdfast-sqlite-test-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDb { dir }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join("holdfast.db")
    }

    pub fn url(&self) -> String {
        format!("sqlite://{}", self.path().display())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub async fn open(&self) -> SqliteBackend {
        SqliteBackend::open(&self.url(), SqliteOptions::default())
            .await
            .expect("open the test database")
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

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
