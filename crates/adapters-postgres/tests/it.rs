//! Every integration test of this crate in one binary: one link instead of one
//! per file. Each module is one file beside this one, named as before.

mod support;

mod balances;
mod conformance;
mod faults;
mod hosts;
mod owners;
mod postgres;
mod races;
mod sessions;
