//! holdfast services wiring the domain rules to the ports, and the `holdfast` command.
//!
//! - [`config`]: the one [`Config`] struct, from TOML and `HOLDFAST_*` variables.
//! - [`clock`]: [`SystemClock`], the wall clock as the `Clock` port.
//! - [`selector`]: [`TokenSelector`], token selection with stubborn legs.
//! - [`metrics`]: the metrics table and `docs/metrics.md`.

pub mod clock;
pub mod config;
pub mod metrics;
pub mod selector;

pub use clock::SystemClock;
pub use config::{Config, ConfigError};
pub use selector::{SelectError, SelectReport, TokenSelector};
