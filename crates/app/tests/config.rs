//! Loading and validating the configuration.

use std::time::Duration;

use holdfast::config::{Config, ConfigError, KEYS};
use holdfast_domain::{QueueName, SelectionConfig, SelectionPolicy};

fn queue(name: &str) -> QueueName {
    QueueName::new(name).expect("queue")
}

#[test]
fn defaults_are_valid_and_match_the_domain() {
    let c = Config::default();
    c.validate().expect("defaults validate");
    assert_eq!(c.selection_config(), SelectionConfig::default());
    assert_eq!(c.lease_config(), holdfast_domain::LeaseConfig::default());
    assert_eq!(c.admission_for(&queue("any")), Default::default());
    assert_eq!(c.db_url, "sqlite://holdfast.db");
    assert_eq!(c.precision_bits().expect("64").bits(), 64);
}

#[test]
fn a_file_sets_sections_and_per_queue_overrides() {
    let c = Config::from_toml_str(
        r#"
        db_url = "sqlite::memory:"
        seed = 42
        pg_lock_strategy = "skip_locked"
        [selection]
        policy = "smallest_first"
        prefer_exact = true
        sufficiency_window = 8
        retry_interval_ms = 250
        [lease]
        lease_expiry_ms = 1000
        [admission]
        max_concurrent = 2
        [admission.queues."monorepo/main"]
        max_concurrent = 4
        "#,
    )
    .expect("parses");
    c.validate().expect("valid");
    assert_eq!(c.seed, Some(42));
    assert_eq!(c.pg_lock_strategy.as_str(), "skip_locked");
    assert_eq!(c.selection_config().sufficiency_window, 8);
    assert_eq!(c.selection_config().policy, SelectionPolicy::SmallestFirst);
    assert!(c.selection_config().prefer_exact);
    assert_eq!(
        c.selection_config().retry_interval,
        Duration::from_millis(250)
    );
    assert_eq!(c.lease_config().lease_expiry, Duration::from_secs(1));
    assert_eq!(c.admission_for(&queue("monorepo/main")).max_concurrent, 4);
    assert_eq!(c.admission_for(&queue("other")).max_concurrent, 2);
}

#[test]
fn unknown_keys_are_errors_naming_the_key() {
    for (text, key) in [
        ("sufficiency_window = 3", "sufficiency_window"),
        ("[selection]\nsufficency_window = 3", "sufficency_window"),
        ("[admission.queues.q]\nmax = 1", "max"),
    ] {
        let err = Config::from_toml_str(text).expect_err(text);
        assert!(matches!(err, ConfigError::Toml { .. }), "{err}");
        assert!(err.to_string().contains(key), "{err}");
    }
    let err = Config::from_toml_str("pg_lock_strategy = \"fast\"").expect_err("bad strategy");
    assert!(err.to_string().contains("skip_locked"), "{err}");
    let err = Config::from_toml_str("[selection]\npolicy = \"largest\"").expect_err("bad policy");
    assert!(
        err.to_string()
            .contains("expected cover_first or smallest_first"),
        "{err}"
    );
}

#[test]
fn the_environment_overrides_the_file_and_names_bad_variables() {
    let mut c = Config::from_toml_str("[selection]\nsufficiency_window = 8").expect("parses");
    c.apply_env([
        ("HOLDFAST_SUFFICIENCY_WINDOW", "2"),
        ("HOLDFAST_SEED", "9"),
        ("HOLDFAST_BLACKLIST", "false"),
        ("HOLDFAST_LOG", "debug"),
        ("PATH", "/bin"),
    ])
    .expect("applies");
    assert_eq!(c.selection.sufficiency_window, 2);
    assert_eq!(c.seed, Some(9));
    assert!(!c.selection.blacklist);

    let err = c
        .apply_env([("HOLDFAST_SUFFICENCY_WINDOW", "2")])
        .expect_err("typo");
    assert!(
        err.to_string().contains("HOLDFAST_SUFFICENCY_WINDOW"),
        "{err}"
    );
    let err = c
        .apply_env([("HOLDFAST_MAX_RETRIES", "-1")])
        .expect_err("negative");
    let text = err.to_string();
    assert!(
        text.contains("HOLDFAST_MAX_RETRIES") && text.contains("expected"),
        "{text}"
    );
}

#[test]
fn out_of_range_values_name_the_key_and_the_range() {
    let cases: &[(&str, &str)] = &[
        (
            "[selection]\nsufficiency_window = 0",
            "selection.sufficiency_window",
        ),
        (
            "[selection]\nretry_interval_ms = 0",
            "selection.retry_interval_ms",
        ),
        ("[selection]\nbatch_window = 300", "selection.batch_window"),
        ("[lease]\ncleanup_period_ms = 0", "lease.cleanup_period_ms"),
        ("precision = 0", "precision"),
        ("busy_timeout_ms = 0", "busy_timeout_ms"),
        (
            "[admission]\nmax_concurrent = 0",
            "admission.max_concurrent",
        ),
        (
            "[admission.queues.\"q\"]\ngate_wait_delay_ms = 0",
            "admission.queues.\"q\".gate_wait_delay_ms",
        ),
        (
            "[settlement]\npersist_max_attempts = 0",
            "settlement.persist_max_attempts",
        ),
    ];
    for (text, key) in cases {
        let err = Config::from_toml_str(text)
            .expect("parses")
            .validate()
            .expect_err(text);
        match &err {
            ConfigError::Invalid { key: k, .. } => assert_eq!(k, key, "{text}"),
            other => panic!("{text}: {other}"),
        }
        assert!(err.to_string().contains("expected"), "{err}");
    }
}

#[test]
fn every_key_is_settable_from_its_environment_variable() {
    let samples = |env: &str| match env {
        "HOLDFAST_DB" => "sqlite::memory:",
        "HOLDFAST_PG_LOCK_STRATEGY" => "on_conflict",
        "HOLDFAST_SELECTION_POLICY" => "smallest_first",
        "HOLDFAST_BLACKLIST" | "HOLDFAST_ASCENDING" | "HOLDFAST_PREFER_EXACT" => "true",
        "HOLDFAST_WAKEUPS" => "false",
        _ => "3",
    };
    for k in KEYS {
        let mut c = Config::default();
        c.apply_env([(k.env, samples(k.env))])
            .unwrap_or_else(|e| panic!("{}: {e}", k.env));
        let shown = (k.get)(&c);
        assert!(shown.contains(samples(k.env)), "{} shows {shown}", k.key);
    }
}
