//! The ports' conformance suite, unchanged, against PostgreSQL under each lock
//! strategy. Each check gets a fresh database; replicas are independent backends
//! (own pool, own counters) on it.

use crate::support;

use async_trait::async_trait;
use holdfast_adapters_postgres::{LockStrategy, PgBackend};
use holdfast_ports::Stores;
use holdfast_ports::conformance::{Backend, BackendError, TestDatabase};
use support::TestDb;

/// Fresh PostgreSQL databases, opened with one lock strategy; with `generic`,
/// every session on them uses generic plans from its first call
/// (`plan_cache_mode = force_generic_plan`), the plans a connection keeps after
/// five calls of a statement whose generic plan looks as cheap as a custom one.
struct Postgres(LockStrategy, bool);

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
        if self.1 {
            let mut conn = db.connection().await;
            support::exec(
                &mut conn,
                format!(
                    "ALTER DATABASE \"{}\" SET plan_cache_mode = force_generic_plan",
                    db.name
                ),
            )
            .await;
        }
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
    holdfast_ports::conformance_tests!(Postgres(LockStrategy::Insert, false));
}

mod on_conflict {
    use super::*;
    holdfast_ports::conformance_tests!(Postgres(LockStrategy::OnConflict, false));
}

mod skip_locked {
    use super::*;
    holdfast_ports::conformance_tests!(Postgres(LockStrategy::SkipLocked, false));
}

/// The claims under generic plans, as a connection runs them after its fifth
/// call: windows small enough for the scalar statement and larger ones.
mod generic_plans {
    use super::*;
    use holdfast_ports::conformance::{fresh, locks};

    async fn claims(strategy: LockStrategy) {
        let backend = Postgres(strategy, true);
        if let Some(reason) = holdfast_ports::conformance::Backend::skip_reason(&backend) {
            eprintln!("SKIPPED: generic plans under {strategy}: {reason}");
            return;
        }
        locks::claim_verdicts_stale_vs_contended(&*fresh(&backend).await).await;
        locks::small_windows_verdicts(&*fresh(&backend).await).await;
        locks::window_verdicts_in_order(&*fresh(&backend).await).await;
        locks::overlapping_windows_one_winner_per_token(&*fresh(&backend).await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn insert() {
        claims(LockStrategy::Insert).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn on_conflict() {
        claims(LockStrategy::OnConflict).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn skip_locked() {
        claims(LockStrategy::SkipLocked).await;
    }
}
