//! Pure claim rules for holdfast.
//!
//! This crate decides; it performs no I/O, reads no clock, environment or global
//! RNG, and has no async runtime or database driver in its dependency tree, so a
//! service can import the rules alone. Callers feed it facts (candidates, lock
//! outcomes, loaded records, the current time, an RNG) and execute what it returns.
//!
//! - [`quantity`], [`ids`], [`timestamp`], [`token`]: validated values and records.
//! - [`selection`], [`blacklist`], [`window`]: the token selection engine;
//!   [`read_plan`](mod@read_plan): whether a select reads apart from its claim or with it.
//! - [`request`], [`admission`]: build-slot admission.
//! - [`lease`]: the lock lifecycle (settlement and lease expiry).
//! - [`fault`]: [`StoreFault`], a store's failure, and its [`FaultKind`], which
//!   every layer keeps.
//! - [`error_kind`]: [`ErrorKind`], what an error says a caller should do
//!   (retry later, give up, fix the input), as [`SelectError::kind`] answers.
#![warn(missing_docs)]

pub mod admission;
pub mod blacklist;
pub mod error_kind;
pub mod fault;
pub mod ids;
pub mod lease;
pub mod quantity;
pub mod read_plan;
pub mod request;
pub mod selection;
pub mod timestamp;
pub mod token;
pub mod window;

pub use admission::{
    AdmissionConfig, AdmissionConfigError, AdmissionError, AncestryAnswer, AncestryFact,
    BuildOutcome, Decision, Heartbeat, Need, ProcessInput, ProcessMemo, Reply, Write,
};
pub use blacklist::{Blacklist, BlacklistReason};
pub use error_kind::ErrorKind;
pub use fault::{FaultKind, StoreFault};
pub use ids::{IdError, QueueName, RevisionUri, TokenId, TokenType, TxId, WalletId};
pub use lease::{
    Imbalance, LeaseConfig, LeaseConfigError, LockAction, PersistPolicy, PersistResult,
    PersistStep, SettlementStatus, SweepRule, TxStatus, unconserved,
};
pub use quantity::{Precision, Quantity, QuantityError};
pub use read_plan::{
    Fullness, Others, ReadFacts, ReadPlan, ReadWithClaim, may_use_snapshot, read_plan,
};
pub use request::{
    BuildPlan, BuildStrategy, FailReason, Generation, LastGreen, Queue, Request, RequestId,
    RequestIdError, RequestState, Slot, Version,
};
pub use selection::{
    Action, Bands, FetchRequest, MAX_INPUTS, SelectError, SelectRequest, Selected, Selection,
    SelectionConfig, SelectionConfigError, SelectionError, SelectionPolicy, SelectionStats,
    UnknownPolicy,
};
pub use timestamp::Timestamp;
pub use token::{Candidate, ClaimVerdict, Token};
