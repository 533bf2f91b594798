//! holdfast services wiring the domain rules to the ports: what a service imports.
//! The `holdfast` command lives in the `holdfast-cli` crate.
//!
//! This crate is the one dependency a service needs. [`Holdfast::open`] opens
//! everything from a [`Config`] and [`Holdfast::shutdown`] drains it
//! ([`handle`]); every type a service names is re-exported at the root (ids,
//! quantities, statuses, outcomes, stores, new tokens, deliveries, the
//! [`BuildPublisher`] and [`DeliverySource`] traits with the [`async_trait`](macro@async_trait)
//! attribute that implementing them needs), and the adapters are re-exported as
//! [`sqlite`] and [`postgres`] behind their features. The lower crates stay
//! reachable as [`domain`] and [`ports`].
//!
//! Features: `sqlite` and `postgres` (the adapters [`backend::Backend::open`] can
//! open) and `config-file` (TOML configuration files), all default. With one
//! backend feature a service pulls neither the other adapter nor any
//! command-line crate.
//!
//! - [`handle`]: [`Holdfast`], the whole library behind one handle.
//! - [`error`]: [`ErrorKind`], what every error of this crate says about its cause.
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
pub mod error;
pub mod failpoint;
pub mod handle;
pub mod metrics;
pub mod selector;
pub mod settlement;
pub mod sweeper;
pub mod worker;

pub use admission::{
    Admission, AdmissionPolicy, AdmitError, Ancestry, AncestryError, Ingest, NoAncestry,
};
pub use backend::{Backend, BackendError, BackendKind, BackendOptions};
pub use clock::SystemClock;
pub use config::{Config, ConfigError, UnknownVar};
pub use error::{ErrorKind, HasKind};
pub use holdfast_ports::Output;
pub use selector::{SelectError, SelectReport, TokenSelector};
pub use settlement::{Confirmed, Orphan, Recovery, SettleError, Settled, Settlement};
pub use sweeper::{LeaseSweeper, SweepTotals, SweeperHandle, sweep_once};
pub use worker::{Handled, RunOptions, RunReport, StoreDeliveries};

pub use handle::{AdmissionWorkers, Holdfast, OpenError, Options, ShutdownReport, TokenError};

/// The PostgreSQL adapter (`holdfast-adapters-postgres`).
#[cfg(feature = "postgres")]
pub use holdfast_adapters_postgres as postgres;
/// The `tracing` target of PostgreSQL's commit-durability warnings, for a
/// subscriber's filter (`holdfast migrate` reports the same settings itself).
#[cfg(feature = "postgres")]
pub use holdfast_adapters_postgres::DURABILITY_TARGET;
/// The embedded SQLite adapter (`holdfast-adapters-sqlite`).
#[cfg(feature = "sqlite")]
pub use holdfast_adapters_sqlite as sqlite;
/// The pure rules (`holdfast-domain`), whole.
pub use holdfast_domain as domain;
/// The ports (`holdfast-ports`): the store traits, their errors and mocks.
pub use holdfast_ports as ports;

/// The attribute that implementing [`BuildPublisher`] or [`DeliverySource`] needs.
pub use async_trait::async_trait;

pub use holdfast_domain::{
    BuildOutcome, BuildPlan, FaultKind, Generation, Heartbeat, IdError, Precision, Quantity,
    QuantityError, QueueName, Reply, Request, RequestId, RequestIdError, RequestState, RevisionUri,
    Selected, SelectionConfig, SelectionPolicy, SettlementStatus, Timestamp, Token, TokenId,
    TokenType, TxId, TxStatus, WalletId,
};
pub use holdfast_ports::{
    BuildPublisher, Delivery, DeliveryError, DeliverySource, LockStoreError, LockStrategy, Message,
    NewToken, QueueStoreError, StatusStoreError, StoreFault, Stores, TokenStoreError,
};
