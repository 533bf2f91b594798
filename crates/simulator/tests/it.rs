//! Every integration test of the simulator in one binary.

#[path = "../../adapters-postgres/tests/support/mod.rs"]
mod pg_support;

mod postgres;
mod replay;
mod simulate;
