//! The command's errors and their exit codes: 1 a domain refusal, 2 bad input,
//! 3 a backend error. Every failure of a command is one of these; `main` prints it
//! on stderr and exits with [`CliError::exit_code`].

use holdfast::domain::{IdError, QuantityError, RequestIdError, SelectionConfigError};
use holdfast::ports::{LockStoreError, QueueStoreError, StatusStoreError, TokenStoreError};
use serde::Serialize;

use super::queue::ReplyView;
use holdfast::admission::AdmitError;
use holdfast::backend::BackendError;
use holdfast::config::ConfigError;
use holdfast::selector::SelectError;
use holdfast::settlement::SettleError;

/// What kind of failure, which decides the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// The domain refused (insufficient funds, funds locked, a closed gate, a
    /// conflicting token): exit code 1.
    Refused,
    /// The input can never work (an amount, id, config key or URL): exit code 2.
    BadInput,
    /// The database failed or could not be reached: exit code 3.
    Backend,
}

impl ErrorClass {
    /// The process exit code.
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorClass::Refused => 1,
            ErrorClass::BadInput => 2,
            ErrorClass::Backend => 3,
        }
    }
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The database could not be opened.
    #[error(transparent)]
    Open(#[from] BackendError),
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The selection settings were refused.
    #[error(transparent)]
    SelectionConfig(#[from] SelectionConfigError),
    /// The selector refused or failed.
    #[error(transparent)]
    Select(#[from] SelectError),
    /// Settling failed in the stores.
    #[error(transparent)]
    Settle(#[from] SettleError),
    /// An admission step failed in the store or met too much contention.
    #[error(transparent)]
    Admit(#[from] AdmitError),
    /// An admission step did not admit: the gate is closed (hold), the step must be
    /// retried later, or the request cannot proceed.
    #[error("{subject}: {}", reply.describe())]
    Refused {
        /// The request.
        subject: String,
        /// The step's reply.
        reply: Box<ReplyView>,
    },
    /// A heartbeat's request owns no build slot (any more): its build should stop.
    #[error("{request} owns no build slot: {why}; stop its build")]
    NoSlot {
        /// The request.
        request: String,
        /// Why (its state, or that its lease ran out).
        why: String,
    },
    /// A heartbeat's generation is not the build's last publication: a newer
    /// generation runs (this one went quiet and was published again), so this build
    /// should stop.
    #[error("{request}: {}; stop this build", stale_why(*generation, *current))]
    Stale {
        /// The request.
        request: String,
        /// The generation that heartbeated.
        generation: u32,
        /// The generation published last.
        current: u32,
    },
    /// An amount argument was refused.
    #[error(transparent)]
    Amount(#[from] QuantityError),
    /// An identifier argument was refused.
    #[error(transparent)]
    Id(#[from] IdError),
    /// A request id argument was refused.
    #[error(transparent)]
    RequestId(#[from] RequestIdError),
    /// An argument is out of range or inconsistent with another.
    #[error("invalid {arg} {value}: {expected}")]
    Argument {
        /// The argument, as typed (`--count`).
        arg: &'static str,
        /// The rejected value.
        value: String,
        /// What was expected.
        expected: String,
    },
    /// A named record does not exist.
    #[error("no {what} {id:?}; {hint}")]
    NotFound {
        /// What kind of record.
        what: &'static str,
        /// Its id.
        id: String,
        /// How to find valid ids.
        hint: &'static str,
    },
    /// The token store failed or refused (a token id reused with other attributes).
    #[error(transparent)]
    Tokens(#[from] TokenStoreError),
    /// The lock store failed.
    #[error(transparent)]
    Locks(#[from] LockStoreError),
    /// The status store failed.
    #[error(transparent)]
    Statuses(#[from] StatusStoreError),
    /// The queue store failed.
    #[error(transparent)]
    Queues(#[from] QueueStoreError),
    /// A file or directory could not be used.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The demo found a database that already holds demo data.
    #[error(
        "the database {url} is not fresh: {found}; the demo needs an empty database (omit --db to use a temporary one)"
    )]
    NotFresh {
        /// The database URL, password redacted.
        url: String,
        /// What was found.
        found: String,
    },
    /// A demo step saw something the tour does not expect.
    #[error("demo step {step:?} failed: {detail}")]
    Demo {
        /// The step.
        step: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// A `queue work` worker failed (its delivery source, or a panic).
    #[error("queue work: {0}")]
    Worker(String),
    /// The simulator could not run (`holdfast simulate`).
    #[error(transparent)]
    Simulate(Box<holdfast_simulator::SimulateError>),
}

impl CliError {
    /// The class of the failure.
    pub fn class(&self) -> ErrorClass {
        match self {
            CliError::Open(e) if e.is_bad_input() => ErrorClass::BadInput,
            CliError::Simulate(e) if e.is_bad_input() => ErrorClass::BadInput,
            CliError::Simulate(_) => ErrorClass::Backend,
            CliError::Open(_) => ErrorClass::Backend,
            CliError::Select(
                SelectError::InsufficientFunds { .. }
                | SelectError::FundsLocked
                | SelectError::TooManyInputs { .. }
                | SelectError::DeadlineExceeded { .. },
            ) => ErrorClass::Refused,
            CliError::Select(SelectError::Store(_) | SelectError::ShuttingDown) => {
                ErrorClass::Backend
            }
            CliError::Refused { .. }
            | CliError::NoSlot { .. }
            | CliError::Stale { .. }
            | CliError::Admit(AdmitError::Conflicts { .. }) => ErrorClass::Refused,
            CliError::Admit(_) => ErrorClass::Backend,
            CliError::Select(SelectError::Input(_))
            | CliError::Tokens(TokenStoreError::BalanceOverflow { .. })
            | CliError::SelectionConfig(_)
            | CliError::Config(_)
            | CliError::Amount(_)
            | CliError::Id(_)
            | CliError::RequestId(_)
            | CliError::Argument { .. }
            | CliError::NotFound { .. }
            | CliError::NotFresh { .. } => ErrorClass::BadInput,
            CliError::Tokens(TokenStoreError::Conflict { .. })
            | CliError::Settle(SettleError::DoubleSpend { .. } | SettleError::Outputs { .. }) => {
                ErrorClass::Refused
            }
            CliError::Tokens(_)
            | CliError::Settle(_)
            | CliError::Locks(_)
            | CliError::Statuses(_)
            | CliError::Queues(_)
            | CliError::Io { .. }
            | CliError::Worker(_)
            | CliError::Demo { .. } => ErrorClass::Backend,
        }
    }

    /// The process exit code: 1 refused, 2 bad input, 3 backend.
    pub fn exit_code(&self) -> u8 {
        self.class().exit_code()
    }

    /// The error as the JSON object printed on stderr under `--json`:
    /// `{"error": {"class": "refused", "exit_code": 1, "message": "..."}}`; a refused
    /// admission step adds `"request"` and its `"reply"` (e.g. `{"kind": "hold",
    /// "delay_ms": 5000, "paused": false, "why": "full", "generation": null}`); a
    /// stale heartbeat adds `"request"`, `"generation"` and `"current_generation"`.
    pub fn to_json(&self) -> serde_json::Value {
        let class = self.class();
        let mut error = serde_json::json!({
            "class": class,
            "exit_code": class.exit_code(),
            "message": self.to_string(),
        });
        if let CliError::Refused { subject, reply } = self {
            error["request"] = serde_json::json!(subject);
            error["reply"] = serde_json::to_value(reply.as_ref()).unwrap_or_default();
        }
        if let CliError::Stale {
            request,
            generation,
            current,
        } = self
        {
            error["request"] = serde_json::json!(request);
            error["generation"] = serde_json::json!(generation);
            error["current_generation"] = serde_json::json!(current);
        }
        serde_json::json!({ "error": error })
    }
}

/// Why the build of `generation` must stop when `current` was published last.
fn stale_why(generation: u32, current: u32) -> String {
    if current > generation {
        format!("generation {generation} is stale: a newer generation {current} was published")
    } else {
        format!("generation {generation} was never published: the last one is {current}")
    }
}
