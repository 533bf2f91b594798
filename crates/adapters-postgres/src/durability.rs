//! Whether the server's settings let a commit it acknowledged be lost: at a
//! failover to a standby that had not received it, or at a crash.
//!
//! holdfast's promises (a claim answered Won is held, a confirmed payment and its
//! outputs stay) hold only for commits that survive. [`crate::PgBackend::connect`]
//! reads the settings once from the primary it connected to and logs every
//! [`CommitRisk`] with `tracing::warn!` (target [`DURABILITY_TARGET`]);
//! `holdfast migrate` prints them.
//!
//! What is reported, and what is not (`docs/postgres-failover.md`):
//!
//! - `synchronous_commit = off`: the server acknowledges before the WAL is on
//!   disk, so even a crash of a lone server loses the last commits.
//! - Standbys attached (physical replication, `pg_stat_replication`) while
//!   commits do not wait for any: `synchronous_standby_names` empty, or
//!   `synchronous_commit = local`. Promoting one can lose what it had not
//!   received.
//! - A URL naming several hosts while no standby is attached: a host promoted
//!   now lacks every commit since it last replicated.
//! - Nothing for a lone server with `synchronous_commit` on and a single-host URL
//!   (there is nothing to fail over to, or the failover is below PostgreSQL,
//!   as with replicated storage, where holdfast cannot see it).

use std::fmt;

use sqlx::PgConnection;

/// The `tracing` target of the warnings [`crate::PgBackend::connect`] logs about
/// the server's settings, one per [`CommitRisk`]: a tool that reports them
/// itself (the `holdfast` command's `migrate`) can leave them out of its log.
pub const DURABILITY_TARGET: &str = "holdfast::durability";

/// The server's settings and standbys as seen from the primary holdfast connected to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durability {
    /// `synchronous_commit`: `off`, `local`, `remote_write`, `on` or `remote_apply`.
    pub synchronous_commit: String,
    /// `synchronous_standby_names` (empty: commits wait for no standby).
    pub synchronous_standby_names: String,
    /// Physical standbys streaming from this server now.
    pub standbys: u32,
    /// Of them, those the server waits for (`sync` or `quorum`); `None` when the
    /// role may not see the standbys' state (`pg_monitor` or superuser can).
    pub synchronous_standbys: Option<u32>,
    /// Hosts the URL names.
    pub hosts: usize,
}

/// A way an acknowledged commit can be lost, as [`Durability::risks`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitRisk {
    /// `synchronous_commit = off`.
    CommitNotFlushed,
    /// Standbys are attached but `synchronous_standby_names` is empty.
    AsynchronousStandbys {
        /// Standbys attached.
        standbys: u32,
    },
    /// `synchronous_standby_names` is set but `synchronous_commit` does not wait
    /// for standbys (`local`).
    StandbysNotWaitedFor {
        /// The `synchronous_commit` setting.
        synchronous_commit: String,
    },
    /// The URL names several hosts but no standby is attached.
    NoStandby {
        /// Hosts the URL names.
        hosts: usize,
    },
}

impl fmt::Display for CommitRisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommitRisk::CommitNotFlushed => f.write_str(
                "synchronous_commit is off: the server acknowledges a commit before its WAL is \
                 flushed, so a crash or a failover can lose acknowledged claims and confirmed \
                 payments; set synchronous_commit = on",
            ),
            CommitRisk::AsynchronousStandbys { standbys } => write!(
                f,
                "{standbys} standby(s) replicate asynchronously (synchronous_standby_names is \
                 empty): a failover to one can lose commits the primary acknowledged (claims, \
                 spends, confirmed payments); see docs/postgres-failover.md"
            ),
            CommitRisk::StandbysNotWaitedFor { synchronous_commit } => write!(
                f,
                "synchronous_standby_names is set but synchronous_commit is {synchronous_commit}: \
                 commits do not wait for the standbys, so a failover can lose acknowledged commits"
            ),
            CommitRisk::NoStandby { hosts } => write!(
                f,
                "the URL names {hosts} hosts but no standby is attached to the primary: promoting \
                 another host now would lose every commit since it last replicated"
            ),
        }
    }
}

impl Durability {
    /// Every way an acknowledged commit can be lost with these settings (see the
    /// module docs); empty when none.
    pub fn risks(&self) -> Vec<CommitRisk> {
        let mut risks = Vec::new();
        let waits_locally_only = matches!(self.synchronous_commit.as_str(), "off" | "local");
        let names_standbys = !self.synchronous_standby_names.trim().is_empty();
        if self.synchronous_commit == "off" {
            risks.push(CommitRisk::CommitNotFlushed);
        }
        if self.standbys > 0 && !names_standbys {
            risks.push(CommitRisk::AsynchronousStandbys {
                standbys: self.standbys,
            });
        }
        if names_standbys && waits_locally_only {
            risks.push(CommitRisk::StandbysNotWaitedFor {
                synchronous_commit: self.synchronous_commit.clone(),
            });
        }
        if self.hosts > 1 && self.standbys == 0 {
            risks.push(CommitRisk::NoStandby { hosts: self.hosts });
        }
        risks
    }
}

/// The settings and physical standbys (walsenders without a database; logical
/// ones serve a database) of the server of `conn`.
const INSPECT: &str = "WITH standbys AS (
        SELECT r.sync_state FROM pg_stat_replication r
        JOIN pg_stat_activity a ON a.pid = r.pid
        WHERE a.datname IS NULL
    )
    SELECT current_setting('synchronous_commit'),
        current_setting('synchronous_standby_names'),
        (SELECT count(*) FROM standbys),
        (SELECT count(*) FROM standbys WHERE sync_state IN ('sync', 'quorum')),
        (SELECT count(sync_state) FROM standbys)";

/// Reads the [`Durability`] of the server of `conn`; `hosts` is how many the URL names.
pub(crate) async fn inspect(
    conn: &mut PgConnection,
    hosts: usize,
) -> Result<Durability, sqlx::Error> {
    let (synchronous_commit, synchronous_standby_names, standbys, sync, visible): (
        String,
        String,
        i64,
        i64,
        i64,
    ) = sqlx::query_as(INSPECT).fetch_one(conn).await?;
    let count = |n: i64| u32::try_from(n).unwrap_or(u32::MAX);
    Ok(Durability {
        synchronous_commit,
        synchronous_standby_names,
        standbys: count(standbys),
        synchronous_standbys: (visible == standbys).then(|| count(sync)),
        hosts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn durability(commit: &str, names: &str, standbys: u32, hosts: usize) -> Durability {
        Durability {
            synchronous_commit: commit.to_owned(),
            synchronous_standby_names: names.to_owned(),
            standbys,
            synchronous_standbys: Some(0),
            hosts,
        }
    }

    #[test]
    fn risks_follow_the_settings() {
        // A lone server that flushes: nothing to fail over to, nothing said.
        assert_eq!(durability("on", "", 0, 1).risks(), []);
        assert_eq!(
            durability("off", "", 0, 1).risks(),
            [CommitRisk::CommitNotFlushed]
        );
        assert_eq!(
            durability("on", "", 2, 2).risks(),
            [CommitRisk::AsynchronousStandbys { standbys: 2 }]
        );
        // Synchronous: nothing lost at a failover.
        for commit in ["on", "remote_write", "remote_apply"] {
            assert_eq!(durability(commit, "*", 1, 2).risks(), [], "{commit}");
        }
        assert_eq!(
            durability("local", "ANY 1 (s1, s2)", 2, 2).risks(),
            [CommitRisk::StandbysNotWaitedFor {
                synchronous_commit: "local".to_owned()
            }]
        );
        assert_eq!(
            durability("on", "*", 0, 3).risks(),
            [CommitRisk::NoStandby { hosts: 3 }]
        );
        let all = durability("off", "", 0, 2).risks();
        assert_eq!(
            all,
            [
                CommitRisk::CommitNotFlushed,
                CommitRisk::NoStandby { hosts: 2 }
            ]
        );
        for risk in all {
            assert!(risk.to_string().contains("lose"), "{risk}");
        }
    }
}
