//! The embedded, versioned migrations. Each file of `migrations/` is one version,
//! applied in order on connect; a changed, already applied file is an error
//! (checksums are compared), never silently re-run.

use std::borrow::Cow;

use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

/// The migrations, as `(version, description, sql)`.
pub const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "schema", include_str!("../migrations/0001_schema.sql")),
    (
        2,
        "selections",
        include_str!("../migrations/0002_selections.sql"),
    ),
    (
        3,
        "slot_leases",
        include_str!("../migrations/0003_slot_leases.sql"),
    ),
    (4, "confirm", include_str!("../migrations/0004_confirm.sql")),
    (5, "owners", include_str!("../migrations/0005_owners.sql")),
    (
        6,
        "slot_builds",
        include_str!("../migrations/0006_slot_builds.sql"),
    ),
    (
        7,
        "shared_balance_locks",
        include_str!("../migrations/0007_shared_balance_locks.sql"),
    ),
    (
        8,
        "balance_probe",
        include_str!("../migrations/0008_balance_probe.sql"),
    ),
    (
        9,
        "lean_confirm",
        include_str!("../migrations/0009_lean_confirm.sql"),
    ),
    (
        10,
        "confirm_with_change",
        include_str!("../migrations/0010_confirm_with_change.sql"),
    ),
];

/// The *upgrade time*, in milliseconds since the epoch: when version 6 (the
/// owners' build publications, `0006_slot_builds.sql`) was installed. Owner
/// times (claim, heartbeat, publication) an older holdfast left unrecorded or
/// unreadable read as this time (see the queue store), and version 6 stamped
/// the owners it found as published at it. It is version 6's own time, not the
/// newest migration's (which 0006's header, written when it was the newest,
/// calls it): a later migration must not move the time such owners read as.
pub(crate) const UPGRADED_AT: &str = "
    SELECT (extract(epoch FROM installed_on) * 1000)::BIGINT
    FROM _sqlx_migrations WHERE version = 6 AND success";

/// A migrator over [`MIGRATIONS`]. It takes PostgreSQL's advisory migration lock,
/// so replicas starting at once apply each version exactly once.
pub fn migrator() -> Migrator {
    migrator_up_to(i64::MAX)
}

/// A migrator over the migrations up to `version`: the schema an older holdfast
/// left (upgrade tests start from it). The checksums are the same, so a later
/// migrator of every version (what opening a backend runs) applies only what
/// follows.
pub fn migrator_up_to(version: i64) -> Migrator {
    Migrator::with_migrations(
        MIGRATIONS
            .iter()
            .filter(|(v, _, _)| *v <= version)
            .map(|(version, description, sql)| {
                Migration::new(
                    *version,
                    Cow::Borrowed(*description),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                )
            })
            .collect(),
    )
}
