//! Build-slot admission under crashes, redeliveries, duplicates and faults: the
//! model harness (also the build system: publications, builds, heartbeats), the
//! named scenarios, the property test over random interleavings, and older
//! designs as test oracles.

#[path = "admission/model.rs"]
mod model;
#[path = "admission/oracle.rs"]
mod oracle;
#[path = "admission/proptests.rs"]
mod proptests;
#[path = "admission/scenarios.rs"]
mod scenarios;
