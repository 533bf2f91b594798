//! `cargo xtask failover`: the failover tests alone (`crates/cli/tests/failover.rs`,
//! `docs/postgres-failover.md`). A PostgreSQL primary and a hot standby on this
//! machine (streaming replication, `pg_basebackup`), three `holdfast soak`
//! replicas on the multi-host URL; mid-run the standby's link stalls, the primary
//! is stopped (`immediate`) and the standby promoted, once with synchronous and
//! once with asynchronous replication. Each run prints its figures (time to
//! resume, what the asynchronous case lost).
//!
//! The tests start their own clusters from the PostgreSQL binaries (`initdb`,
//! `pg_ctl`, `postgres`, `pg_basebackup`; `HOLDFAST_PG_BIN`, else the newest
//! `/usr/lib/postgresql/*/bin`); they need no `DATABASE_URL`. Without the
//! binaries this task fails under `CI=true` and skips loudly otherwise, as the
//! tests do when `cargo xtask ci` runs them with the rest of the suite.

use crate::postgres::{self, BIN_VAR};
use crate::{Error, process, testing};

/// The binaries a failover needs beyond a throwaway cluster's.
const MORE: [&str; 1] = ["pg_basebackup"];

/// The `failover` task.
pub fn run(args: &[String]) -> Result<(), Error> {
    if let Some(arg) = args.first() {
        return Err(Error::UnexpectedArgument {
            task: "failover",
            arg: arg.clone(),
        });
    }
    let Some(bin) = postgres::find_binaries_with(&MORE) else {
        let reason = format!(
            "no initdb, pg_ctl, postgres and {} in ${BIN_VAR}, /usr/lib/postgresql/*/bin or PATH",
            MORE.join(", ")
        );
        if postgres::under_ci() {
            return Err(Error::NoPostgres(format!(
                "{reason}; CI=true requires them"
            )));
        }
        eprintln!("xtask failover: WARNING: SKIPPED: {reason}");
        return Ok(());
    };
    let mut tests = process::cargo();
    if testing::nextest_available() {
        tests.args([
            "nextest",
            "run",
            "-p",
            "holdfast-cli",
            "--test",
            "it",
            "--no-capture",
            "--no-fail-fast",
            "failover::",
        ]);
    } else {
        tests.args([
            "test",
            "-p",
            "holdfast-cli",
            "--test",
            "it",
            "failover::",
            "--",
            "--nocapture",
            "--test-threads=1",
        ]);
    }
    // The tests start their own clusters: no shared server.
    tests
        .env(BIN_VAR, &bin)
        .env_remove(postgres::DATABASE_URL)
        .env_remove(postgres::SKIP_VAR);
    process::run(&mut tests)?;
    eprintln!("xtask failover: passed; the figures are the SUMMARY lines above");
    Ok(())
}
