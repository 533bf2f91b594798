//! Fleets of real `holdfast soak` replicas on the test's own throwaway
//! PostgreSQL clusters, shared by `fleet_faults` (a server frozen, restarted,
//! overfilled) and `failover` (a primary lost, a standby promoted):
//!
//! - `cluster`: [`Cluster`] (`initdb`, a server on a free port, standbys by
//!   `pg_basebackup`, all removed on drop) and [`Turn`], one fleet test at a
//!   time machine-wide;
//! - `replicas`: [`Replica`] processes, their histories, [`progress`];
//! - `ledger`: the histories against the final tables ([`check_ledger`]).
//!
//! The binaries are found as `cargo xtask test` finds them (`HOLDFAST_PG_BIN`,
//! else the newest `/usr/lib/postgresql/*/bin`); without them each test skips
//! loudly, and fails under `CI=true`.

#![allow(dead_code)] // each test module uses a different part of this one

mod cluster;
mod ledger;
mod replicas;

pub use cluster::{Cluster, Shutdown, turn};
pub use ledger::{Funding, Kind, Severity, check_fleet, read_ledger};
pub use replicas::{Replica, fleet, fund, progress, stop_fleet, stop_living_fleet, tail_of};

pub const WALLET: &str = "w";
pub const TYPE: &str = "CHF";
/// Every fleet spends from 600 tokens of 1000 in amounts of 1 to 10: it never
/// runs dry, so a stall is never an empty wallet.
pub const FUNDING: Funding = Funding {
    tx: "fund",
    count: 600,
    amount: 1000,
};
pub const MAX_AMOUNT: &str = "10";
/// Where confirmed payments go (`soak --pay-to`); the change comes back to
/// [`WALLET`].
pub const PAYEE: &str = "r";
