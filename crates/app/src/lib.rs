//! holdfast services wiring the domain rules to the ports, and the `holdfast` command.
//!
//! - [`config`]: the one [`Config`] struct, from TOML and `HOLDFAST_*` variables.
//! - [`clock`]: [`SystemClock`], the wall clock as the `Clock` port.

pub mod clock;
pub mod config;

pub use clock::SystemClock;
pub use config::{Config, ConfigError};
