//! holdfast services wiring the domain rules to the ports: what a service imports.
//! The `holdfast` command lives in the `holdfast-cli` crate.
//!
//! Features: `sqlite` and `postgres` (the adapters [`backend::Backend::open`] can
//! open) and `config-file` (TOML configuration files), all default. With one
//! backend feature a service pulls neither the other adapter nor any
//! command-line crate.
//!
//! - [`config`]: the one [`Config`] struct, from TOML and `HOLDFAST_*` variables.
//! - [`backend`]: opening a backend from a database URL (SQLite or PostgreSQL).
//! - [`clock`]: [`SystemClock`], the wall clock as the `Clock` port.
//! - [`selector`]: [`TokenSelector`], token selection with stubborn legs.
//! - [`settlement`]: [`Settlement`], the lock lifecycle on status reports and at start-up.
//! - [`sweeper`]: [`LeaseSweeper`], the background lease sweep.
//! - [`admission`]: [`Admission`], build-slot admission against the queue store.
//! - [`worker`]: [`Admission::run`] over a delivery source, and
//!   [`worker::StoreDeliveries`], the reference source over the queue store.
//! - [`crash`]: [`crash::CrashingQueues`], a queue store whose writes crash as a
//!   plan says (the demo, the simulator and the crash tests share it).
//! - [`failpoint`]: crash points around admission writes (feature `failpoints`).
//! - [`metrics`]: the metrics table and `docs/metrics.md`.

pub mod admission;
pub mod backend;
pub mod clock;
pub mod config;
pub mod crash;
pub mod failpoint;
pub mod metrics;
pub mod selector;
pub mod settlement;
pub mod sweeper;
pub mod worker;

pub use admission::{
    Admission, AdmissionPolicy, AdmitError, Ancestry, AncestryError, Ingest, NoAncestry,
};
pub use clock::SystemClock;
pub use config::{Config, ConfigError};
pub use holdfast_ports::Output;
pub use selector::{SelectError, SelectReport, TokenSelector};
pub use settlement::{Confirmed, Orphan, Recovery, SettleError, Settled, Settlement};
pub use sweeper::{LeaseSweeper, SweepTotals, SweeperHandle, sweep_once};
pub use worker::{Handled, RunOptions, RunReport, StoreDeliveries};

/// The README's Rust examples, compiled as doc tests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
