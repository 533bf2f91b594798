//! Shared by the integration tests: a temporary database file, removed on drop, and
//! a subscriber capturing warnings (`warnings.rs`, which the PostgreSQL adapter's
//! tests include too).

#![allow(dead_code)]

mod warnings;
#[allow(unused_imports, reason = "the faults binary captures no warnings")]
pub use warnings::Warnings;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
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
