//! holdfast services wiring the domain rules to the ports, and the `holdfast` command.
//!
//! - [`config`]: the one [`Config`] struct, from TOML and `HOLDFAST_*` variables.
//! - [`backend`]: opening a backend from a database URL (SQLite or PostgreSQL).
//! - [`cli`]: the `holdfast` command (parsing, commands, rendering, exit codes).
//! - [`clock`]: [`SystemClock`], the wall clock as the `Clock` port.
//! - [`selector`]: [`TokenSelector`], token selection with stubborn legs.
//! - [`settlement`]: [`Settlement`], the lock lifecycle on status reports and at start-up.
//! - [`sweeper`]: [`LeaseSweeper`], the background lease sweep.
//! - [`admission`]: [`Admission`], build-slot admission against the queue store.
//! - [`failpoint`]: crash points around admission writes (feature `failpoints`).
//! - [`metrics`]: the metrics table and `docs/metrics.md`.
//! - [`simulate`]: the contention simulator behind `holdfast simulate`.

pub mod admission;
pub mod backend;
pub mod cli;
pub mod clock;
pub mod config;
pub mod failpoint;
pub mod metrics;
pub mod selector;
pub mod settlement;
pub mod simulate;
pub mod sweeper;

pub use admission::{
    Admission, AdmissionPolicy, AdmitError, Ancestry, AncestryError, Ingest, NoAncestry,
};
pub use clock::SystemClock;
pub use config::{Config, ConfigError};
pub use selector::{SelectError, SelectReport, TokenSelector};
pub use settlement::{Recovery, SettleError, Settled, Settlement};
pub use sweeper::{LeaseSweeper, SweepTotals, SweeperHandle, sweep_once};

/// The README's Rust examples, compiled as doc tests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
