//! The ports' conformance suite, unchanged, against PostgreSQL under each lock
//! strategy. Each check gets a fresh database; replicas are independent backends
//! (own pool, own counters) on it.

use crate::support;

use async_trait::async_trait;
use holdfast_adapters_postgres::{LockStrategy, PgBackend};
use holdfast_ports::Stores;
use holdfast_ports::conformance::{Backend, BackendError, TestDatabase};
use support::TestDb;

/// Fresh PostgreSQL databases, opened with one lock strategy.
struct Postgres(LockStrategy);

struct Database {
    first: PgBackend,
    strategy: LockStrategy,
    // Declared last: dropped after the backend, it drops the database.
    db: TestDb,
}

#[async_trait]
impl TestDatabase for Database {
    fn stores(&self) -> Stores {
        self.first.stores()
    }

    async fn replica(&self) -> Result<Stores, BackendError> {
        Ok(self.db.backend(self.strategy, 4).await.stores())
    }
}

#[async_trait]
impl Backend for Postgres {
    async fn fresh(&self) -> Result<Box<dyn TestDatabase>, BackendError> {
        let admin = support::server_url("conformance").ok_or("no PostgreSQL server")?;
        let db = TestDb::create_on(&admin, &format!("conformance/{}", self.0)).await;
        let first = db.backend(self.0, 4).await;
        Ok(Box::new(Database {
            first,
            strategy: self.0,
            db,
        }))
    }

    fn skip_reason(&self) -> Option<String> {
        support::server_url(&format!("conformance/{}", self.0))
            .is_none()
            .then(|| "no PostgreSQL server (HOLDFAST_PG_SKIP=1)".to_owned())
    }
}

mod insert {
    use super::*;
    holdfast_ports::conformance_tests!(Postgres(LockStrategy::Insert));
}

mod on_conflict {
    use super::*;
    holdfast_ports::conformance_tests!(Postgres(LockStrategy::OnConflict));
}

mod skip_locked {
    use super::*;
    holdfast_ports::conformance_tests!(Postgres(LockStrategy::SkipLocked));
}
