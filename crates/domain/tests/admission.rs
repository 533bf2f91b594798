//! Build-slot admission under crashes, redeliveries, duplicates and faults: the
//! model harness, the 28 named scenarios, the property test over random
//! interleavings, and the old anonymous-count design as a test oracle.

#[path = "admission/model.rs"]
mod model;
#[path = "admission/oracle.rs"]
mod oracle;
#[path = "admission/proptests.rs"]
mod proptests;
#[path = "admission/scenarios.rs"]
mod scenarios;
