//! Every integration test of this crate in one binary: one link instead of one
//! per file. Each module is one file beside this one, named as before.

mod common;
#[path = "../../adapters-postgres/tests/support/mod.rs"]
mod pg_support;

mod admission_concurrent;
mod config;
mod error_kinds;
mod handle;
mod lease_shorter_than_select;
mod owned_recovery;
mod races;
mod reference_docs;
mod round_trips;
mod select_deadline;
mod selection_model;
mod selection_oracle;
mod selector;
mod selector_sqlite;
mod selector_trace;
mod settlement;
mod sqlite_busy;
mod sqlite_services;
mod wakeups;
