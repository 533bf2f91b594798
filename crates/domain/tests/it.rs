//! Every integration test of this crate in one binary: one link instead of one
//! per file. Each module is one file beside this one, named as before.

mod selection_sim;

mod admission;
mod selection;
mod selection_cover;
mod selection_props;
mod selection_snapshots;
mod selection_trace_cover;
