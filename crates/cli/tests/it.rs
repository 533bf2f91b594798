//! Every integration test of this crate in one binary: one link instead of one
//! per file. Each module is one file beside this one, named as before.

mod cli_support;
mod fleet_support;
#[path = "../../adapters-postgres/tests/support/mod.rs"]
mod pg_support;

mod bad_input;
mod cli;
mod cli_demo;
mod cli_help;
mod cli_postgres;
mod failover;
mod fleet_faults;
mod queue_replicas;
mod replicas_killed;
mod simulate;
