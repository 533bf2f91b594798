//! Every public error of the `holdfast` crate says what kind of failure it is
//! (`kind()`), and every kind what a service answers with: table-driven, one row
//! per variant, so a new variant without a considered kind shows up here.

use std::time::Duration;

use holdfast::admission::SetLimitError;
use holdfast::backend::BackendError;
use holdfast::{AdmitError, AncestryError, ConfigError, ErrorKind, SelectError, SettleError};
use holdfast_adapters_postgres::{ConnectError, OptionsError, TargetSessionAttrs};
use holdfast_adapters_sqlite::OpenError;
use holdfast_domain::{FaultKind, QueueName, SelectionError, TokenId, TxId};
use holdfast_ports::{LockStoreError, QueueStoreError, StatusStoreError, StoreFault, Unconserved};

use crate::common::q;
use ErrorKind as K;

fn tx(id: &str) -> TxId {
    TxId::new(id).expect("tx id")
}

/// Every fault kind, as a fault, with the error kind it must become.
fn faults() -> Vec<(StoreFault, ErrorKind)> {
    FaultKind::ALL
        .into_iter()
        .map(|kind| {
            let expected = match kind {
                FaultKind::Busy => K::Busy,
                FaultKind::Unavailable => K::Unavailable,
                FaultKind::Timeout => K::Timeout,
                FaultKind::Corrupt => K::Corrupt,
                FaultKind::Schema => K::Schema,
                FaultKind::Backend => K::Backend,
            };
            (StoreFault::new(kind, "driver message"), expected)
        })
        .collect()
}

/// Checks every row; the failure lists every wrong row at once.
fn check(rows: Vec<(String, ErrorKind, ErrorKind)>) {
    let wrong: Vec<String> = rows
        .iter()
        .filter(|(_, got, want)| got != want)
        .map(|(what, got, want)| format!("{what}: {got}, expected {want}"))
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn every_kind_says_what_a_service_answers() {
    // kind, HTTP status, transient, Retry-After
    let table: &[(ErrorKind, u16, bool, Option<Duration>, &str)] = &[
        (K::InvalidInput, 422, false, None, "invalid_input"),
        (K::NotFound, 404, false, None, "not_found"),
        (K::InsufficientFunds, 409, false, None, "insufficient_funds"),
        (K::Conflict, 409, false, None, "conflict"),
        (
            K::FundsLocked,
            503,
            true,
            Some(Duration::from_secs(1)),
            "funds_locked",
        ),
        (
            K::Timeout,
            503,
            true,
            Some(Duration::from_secs(1)),
            "timeout",
        ),
        (K::Busy, 503, true, Some(Duration::from_secs(1)), "busy"),
        (
            K::Unavailable,
            503,
            true,
            Some(Duration::from_secs(1)),
            "unavailable",
        ),
        (
            K::ShuttingDown,
            503,
            true,
            Some(Duration::from_secs(1)),
            "shutting_down",
        ),
        (K::Corrupt, 500, false, None, "corrupt"),
        (K::Schema, 500, false, None, "schema"),
        (K::Backend, 500, false, None, "backend"),
    ];
    assert_eq!(
        table.iter().map(|row| row.0).collect::<Vec<_>>(),
        ErrorKind::ALL,
        "one row per kind"
    );
    for &(kind, status, transient, retry_after, word) in table {
        assert_eq!(kind.http_status(), status, "{kind}");
        assert_eq!(kind.is_transient(), transient, "{kind}");
        assert_eq!(kind.retry_after(), retry_after, "{kind}");
        assert_eq!(kind.as_str(), word);
        assert_eq!(kind.to_string(), word);
    }
}

#[test]
fn select_errors_keep_the_store_faults_kind() {
    let mut rows = vec![
        (
            "insufficient funds".to_owned(),
            SelectError::InsufficientFunds {
                available: q(1),
                requested: q(2),
            }
            .kind(),
            K::InsufficientFunds,
        ),
        (
            "funds locked".into(),
            SelectError::FundsLocked.kind(),
            K::FundsLocked,
        ),
        (
            "deadline".into(),
            SelectError::DeadlineExceeded { deadline_ms: 5 }.kind(),
            K::Timeout,
        ),
        (
            "input".into(),
            SelectError::Input(SelectionError::ZeroAmount).kind(),
            K::InvalidInput,
        ),
        (
            "shutting down".into(),
            SelectError::ShuttingDown.kind(),
            K::ShuttingDown,
        ),
    ];
    for (fault, want) in faults() {
        rows.push((
            format!("store {fault}"),
            SelectError::Store(fault).kind(),
            want,
        ));
    }
    check(rows);
}

#[test]
fn settle_errors_tell_conflicts_and_bad_outputs_from_faults() {
    let t = || tx("t");
    let mut rows = vec![
        (
            "double spend".to_owned(),
            SettleError::DoubleSpend {
                tx: t(),
                token: TokenId::new(tx("f"), 0),
                spent_by: tx("other"),
            }
            .kind(),
            K::Conflict,
        ),
        (
            "outputs differ".into(),
            SettleError::Outputs {
                tx: t(),
                source: LockStoreError::OutputsDiffer {
                    tx: t(),
                    detail: "amount".into(),
                },
            }
            .kind(),
            K::Conflict,
        ),
        (
            "not conserved".into(),
            SettleError::Outputs {
                tx: t(),
                source: LockStoreError::NotConserved(Box::new(Unconserved {
                    tx: t(),
                    token_type: "CHF".into(),
                    inputs: "5".into(),
                    outputs: "6".into(),
                })),
            }
            .kind(),
            K::InvalidInput,
        ),
        (
            "bad outputs".into(),
            SettleError::Outputs {
                tx: t(),
                source: LockStoreError::BadOutputs {
                    detail: "amount 0".into(),
                },
            }
            .kind(),
            K::InvalidInput,
        ),
        (
            "locks, not a fault".into(),
            SettleError::Locks {
                tx: t(),
                source: LockStoreError::WindowTooLarge { len: 300, max: 256 },
            }
            .kind(),
            K::Backend,
        ),
        (
            "shutting down".into(),
            SettleError::ShuttingDown.kind(),
            K::ShuttingDown,
        ),
    ];
    for (fault, want) in faults() {
        rows.push((
            format!("locks {fault}"),
            SettleError::Locks {
                tx: t(),
                source: LockStoreError::Fault(fault.clone()),
            }
            .kind(),
            want,
        ));
        rows.push((
            format!("list unsettled {fault}"),
            SettleError::ListUnsettled {
                source: LockStoreError::Fault(fault.clone()),
            }
            .kind(),
            want,
        ));
        rows.push((
            format!("status {fault}"),
            SettleError::Status {
                tx: t(),
                source: StatusStoreError::Fault(fault),
            }
            .kind(),
            want,
        ));
    }
    check(rows);
}

#[test]
fn admission_errors_are_retryable_except_a_runaway_step() {
    let conflicts = AdmitError::Conflicts {
        step: "process",
        subject: "q".into(),
        conflicts: 33,
        max: 32,
    };
    let mut rows = vec![
        ("conflicts".to_owned(), conflicts.kind(), K::Busy),
        (
            "runaway".into(),
            AdmitError::Runaway {
                step: "process",
                subject: "q".into(),
                rounds: 100,
                max: 64,
            }
            .kind(),
            K::Backend,
        ),
        (
            "shutting down".into(),
            AdmitError::ShuttingDown.kind(),
            K::ShuttingDown,
        ),
        (
            "limit too large".into(),
            SetLimitError::TooLarge { max: 2_000_000 }.kind(),
            K::InvalidInput,
        ),
        (
            "no queue".into(),
            SetLimitError::QueueMissing(QueueName::new("q").expect("queue")).kind(),
            K::NotFound,
        ),
        (
            "set limit, step failed".into(),
            SetLimitError::Admit(conflicts).kind(),
            K::Busy,
        ),
        (
            "ancestry not found".into(),
            AncestryError::NotFound("git:a".into()).kind(),
            K::NotFound,
        ),
        (
            "ancestry failed".into(),
            AncestryError::Failed("git down".into()).kind(),
            K::Unavailable,
        ),
    ];
    for (fault, want) in faults() {
        rows.push((
            format!("store {fault}"),
            AdmitError::Store {
                step: "ingest",
                subject: "q".into(),
                source: QueueStoreError::Fault(fault),
            }
            .kind(),
            want,
        ));
    }
    check(rows);
}

#[test]
fn backend_errors_tell_bad_input_from_an_unreachable_database() {
    let url = || "postgres://app:***@db/holdfast".to_owned();
    let mut rows = vec![
        (
            "unknown scheme".to_owned(),
            BackendError::UnknownScheme {
                scheme: "mysql".into(),
            },
            K::InvalidInput,
        ),
        (
            "sqlite location".into(),
            BackendError::Sqlite(OpenError::InvalidLocation {
                input: "sqlite://".into(),
                reason: "no file path",
            }),
            K::InvalidInput,
        ),
        (
            "sqlite option".into(),
            BackendError::Sqlite(OpenError::InvalidOption {
                option: "busy_timeout",
                value: "0".into(),
                expected: "1 ms to 1 h".into(),
            }),
            K::InvalidInput,
        ),
        (
            "sqlite unavailable".into(),
            BackendError::Sqlite(OpenError::Unavailable {
                path: "/nope/h.db".into(),
                reason: "unable to open".into(),
            }),
            K::Unavailable,
        ),
        (
            "sqlite schema too new".into(),
            BackendError::Sqlite(OpenError::SchemaTooNew {
                found: 99,
                known: 3,
            }),
            K::Schema,
        ),
        (
            "sqlite migration".into(),
            BackendError::Sqlite(OpenError::Migration {
                version: 2,
                name: "two",
                reason: "disk full".into(),
            }),
            K::Schema,
        ),
        (
            "postgres options".into(),
            BackendError::Postgres(ConnectError::Options(OptionsError::NoConnections)),
            K::InvalidInput,
        ),
        (
            "postgres url".into(),
            BackendError::Postgres(ConnectError::InvalidUrl {
                url: url(),
                reason: "bad port".into(),
            }),
            K::InvalidInput,
        ),
        (
            "postgres no host".into(),
            BackendError::Postgres(ConnectError::NoHost {
                url: url(),
                target: TargetSessionAttrs::ReadWrite,
                tried: Vec::new(),
            }),
            K::Unavailable,
        ),
        (
            "postgres connect timeout".into(),
            BackendError::Postgres(ConnectError::Timeout {
                url: url(),
                timeout_ms: 10,
                detail: String::new(),
            }),
            K::Unavailable,
        ),
        (
            "postgres refused".into(),
            BackendError::Postgres(ConnectError::Unavailable {
                url: url(),
                detail: "connection refused".into(),
            }),
            K::Unavailable,
        ),
        (
            "postgres migration".into(),
            BackendError::Postgres(ConnectError::Migration {
                url: url(),
                detail: "permission denied".into(),
            }),
            K::Schema,
        ),
        (
            "open timeout".into(),
            BackendError::Timeout {
                url: url(),
                timeout_ms: 10,
            },
            K::Timeout,
        ),
    ];
    for (fault, want) in faults() {
        rows.push((
            format!("sqlite fault {fault}"),
            BackendError::Sqlite(OpenError::Fault(fault)),
            want,
        ));
    }
    for (what, e, want) in &rows {
        // One rule: bad input is exactly the kind InvalidInput.
        assert_eq!(e.is_bad_input(), *want == K::InvalidInput, "{what}");
    }
    check(
        rows.into_iter()
            .map(|(what, e, want)| (what, e.kind(), want))
            .collect(),
    );
}

#[test]
fn configuration_errors_are_invalid_input() {
    let rows = vec![
        (
            "read".to_owned(),
            ConfigError::Read {
                path: "x.toml".into(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            }
            .kind(),
            K::InvalidInput,
        ),
        (
            "toml".into(),
            ConfigError::Toml {
                path: "x.toml".into(),
                message: "unknown field".into(),
            }
            .kind(),
            K::InvalidInput,
        ),
        (
            "env".into(),
            ConfigError::Env {
                var: "HOLDFAST_SEED".into(),
                value: "x".into(),
                expected: "a number",
            }
            .kind(),
            K::InvalidInput,
        ),
        (
            "invalid".into(),
            ConfigError::Invalid {
                key: "precision".into(),
                value: "0".into(),
                expected: "1 to 128 bits".into(),
            }
            .kind(),
            K::InvalidInput,
        ),
    ];
    check(rows);
}
