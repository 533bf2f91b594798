//! The whole holdfast-ports conformance suite against SQLite files, one test per check.

use crate::common;

use async_trait::async_trait;
use holdfast_adapters_sqlite::SqliteBackend;
use holdfast_ports::Stores;
use holdfast_ports::conformance::{Backend, BackendError, TestDatabase};

use common::TempDb;

/// Each check gets its own temporary database file; replicas open the same file
/// with their own connections.
struct SqliteFiles;

struct FileDb {
    first: SqliteBackend,
    // Declared last so the backends close before the directory is removed.
    file: TempDb,
}

#[async_trait]
impl Backend for SqliteFiles {
    async fn fresh(&self) -> Result<Box<dyn TestDatabase>, BackendError> {
        let file = TempDb::new();
        let first = SqliteBackend::open(&file.url(), Default::default()).await?;
        Ok(Box::new(FileDb { first, file }))
    }
}

#[async_trait]
impl TestDatabase for FileDb {
    fn stores(&self) -> Stores {
        self.first.stores()
    }

    async fn replica(&self) -> Result<Stores, BackendError> {
        Ok(SqliteBackend::open(&self.file.url(), Default::default())
            .await?
            .stores())
    }
}

holdfast_ports::conformance_tests!(SqliteFiles);
