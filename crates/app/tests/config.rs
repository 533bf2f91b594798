//! Loading and validating the configuration.

use std::time::Duration;

use holdfast::config::{ALIASES, Config, ConfigError, KEYS, QUEUE_KEYS, UnknownVar};
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
    let unknown = c
        .apply_env([
            ("HOLDFAST_SUFFICIENCY_WINDOW", "2"),
            ("HOLDFAST_SEED", "9"),
            ("HOLDFAST_BLACKLIST", "false"),
            ("HOLDFAST_LOG", "debug"),
            ("PATH", "/bin"),
        ])
        .expect("applies");
    assert_eq!(unknown, Vec::new());
    assert_eq!(c.selection.sufficiency_window, 2);
    assert_eq!(c.seed, Some(9));
    assert!(!c.selection.blacklist);

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
        "HOLDFAST_WAKEUPS" | "HOLDFAST_PG_WAKE_WHERE_WAITED" => "false",
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

/// Unknown `HOLDFAST_*` variables are ignored and reported (the loaders log a
/// warning for each), with the key a typo most likely meant; they change nothing.
#[test]
fn unknown_variables_are_reported_with_the_key_they_likely_meant() {
    let mut c = Config::default();
    let unknown = c
        .apply_env([
            ("HOLDFAST_SUFFICENCY_WINDOW", "2"),
            ("HOLDFAST_PAYMENTS_WEBHOOK", "https://example"),
            ("HOLDFAST_SEDE", "4"),
            ("HOLDFAST_LOGS", "debug"),
            ("HOLDFAST_MAX_RETRIES", "7"),
        ])
        .expect("unknown variables are not errors");
    let shown: Vec<(&str, Option<&str>)> = unknown
        .iter()
        .map(|u| (u.var.as_str(), u.did_you_mean))
        .collect();
    assert_eq!(
        shown,
        [
            ("HOLDFAST_LOGS", Some("HOLDFAST_LOG")),
            ("HOLDFAST_PAYMENTS_WEBHOOK", None),
            ("HOLDFAST_SEDE", Some("HOLDFAST_SEED")),
            (
                "HOLDFAST_SUFFICENCY_WINDOW",
                Some("HOLDFAST_SUFFICIENCY_WINDOW")
            ),
        ]
    );
    let mut expected = Config::default();
    expected.selection.max_legs = 7;
    assert_eq!(c, expected, "unknown variables change nothing");
    let typo = UnknownVar {
        var: "HOLDFAST_SUFFICENCY_WINDOW".into(),
        did_you_mean: Some("HOLDFAST_SUFFICIENCY_WINDOW"),
    };
    assert_eq!(
        typo.to_string(),
        "ignoring environment variable HOLDFAST_SUFFICENCY_WINDOW: not a holdfast \
         configuration key; did you mean HOLDFAST_SUFFICIENCY_WINDOW?"
    );
    assert!(
        unknown[1]
            .to_string()
            .ends_with("(see docs/configuration.md)")
    );
}

/// `DATABASE_URL` is the fallback for `db_url`: it is the database when neither
/// `HOLDFAST_DB` nor the file names one; `HOLDFAST_DB` wins in either order, a
/// file's `db_url` wins over it, and an empty one is unset.
#[test]
fn database_url_is_the_fallback_database() {
    let file = || Config::from_toml_str("db_url = \"sqlite://file.db\"").expect("parses");
    let no_file = Config::default;
    let pg = ("DATABASE_URL", "postgres://u@h/db");
    let mine = ("HOLDFAST_DB", "sqlite://mine.db");
    type Case<'a> = (fn() -> Config, &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (no_file, &[], "sqlite://holdfast.db"),
        (no_file, &[pg], "postgres://u@h/db"),
        (no_file, &[pg, mine], "sqlite://mine.db"),
        (no_file, &[mine, pg], "sqlite://mine.db"),
        (no_file, &[("DATABASE_URL", "")], "sqlite://holdfast.db"),
        (file, &[], "sqlite://file.db"),
        (file, &[pg], "sqlite://file.db"),
        (file, &[pg, mine], "sqlite://mine.db"),
    ];
    for (start, vars, want) in cases {
        let mut c = start();
        let unknown = c.apply_env(vars.iter().copied()).expect("applies");
        assert!(unknown.is_empty(), "{vars:?}: {unknown:?}");
        assert_eq!(c.db_url, *want, "{vars:?}");
    }
}

/// Every per-queue key parses in `[admission.queues."<name>"]`, changes that queue's
/// settings (and no other's), falls back to an `[admission]` key, and is in the
/// reference; the parser and the reference share one declaration.
#[test]
fn every_per_queue_key_overrides_its_queue_and_is_documented() {
    let keys: Vec<&str> = QUEUE_KEYS.iter().map(|k| k.key).collect();
    assert_eq!(
        keys,
        [
            "max_concurrent",
            "gate_wait_delay_ms",
            "slot_lease_ms",
            "resume_after_ms"
        ]
    );
    let reference = holdfast::config::reference_markdown();
    for k in QUEUE_KEYS {
        let c = Config::from_toml_str(&format!("[admission.queues.\"q\"]\n{} = 7", k.key))
            .unwrap_or_else(|e| panic!("{}: {e}", k.key));
        c.validate().unwrap_or_else(|e| panic!("{}: {e}", k.key));
        assert_ne!(
            c.admission_for(&queue("q")),
            c.admission_default(),
            "{} changes nothing",
            k.key
        );
        assert_eq!(c.admission_for(&queue("other")), c.admission_default());
        assert!(
            KEYS.iter().any(|spec| spec.key == k.default_key),
            "{}",
            k.default_key
        );
        assert!(
            reference.contains(&format!("| `{}` | `{}`", k.key, k.default_key)),
            "{} is not in the per-queue table",
            k.key
        );
    }
}

/// Every `[selection]` key reaches the domain's settings: setting it alone changes
/// what `selection_config` hands the engine (one declaration gives the key and its
/// conversion).
#[test]
fn every_selection_key_reaches_the_domain() {
    let defaults = Config::default();
    let keys: Vec<_> = KEYS
        .iter()
        .filter(|k| k.key.starts_with("selection."))
        .collect();
    assert!(keys.len() >= 15, "{keys:?}");
    for k in keys {
        let value = match (k.get)(&defaults).as_str() {
            "true" => "false",
            "false" => "true",
            "`cover_first`" => "smallest_first",
            _ => "3",
        };
        let mut c = Config::default();
        c.apply_env([(k.env, value)])
            .unwrap_or_else(|e| panic!("{}: {e}", k.env));
        assert_ne!(
            c.selection_config(),
            SelectionConfig::default(),
            "{} = {value} does not reach the domain",
            k.key
        );
    }
}

/// Renamed keys keep their old names, in the file and in the environment: the
/// value applies to the new key, the old name is reported (the loaders warn),
/// an error names the key as written, and the reference lists the old names.
#[test]
fn old_names_are_accepted_reported_and_documented() {
    assert!(!ALIASES.is_empty());
    let reference = holdfast::config::reference_markdown();
    for a in ALIASES {
        assert!(
            KEYS.iter().any(|k| k.key == a.key && k.env == a.env),
            "{a:?}"
        );
        assert!(
            !KEYS
                .iter()
                .any(|k| k.key == a.old_key || k.env == a.old_env),
            "{a:?}"
        );
        assert!(
            reference.contains(&format!(
                "| `{}` | `{}` | `{}`",
                a.old_key, a.old_env, a.key
            )),
            "{} is not in the reference",
            a.old_key
        );
    }

    let c = Config::from_toml_str("[selection]\nmax_retries = 3\nretry_interval_ms = 40\n")
        .expect("old keys parse");
    c.validate().expect("valid");
    assert_eq!(c.selection.max_legs, 3);
    assert_eq!(c.selection_config().max_retries, 3);
    assert_eq!(
        c.selection_config().retry_interval,
        Duration::from_millis(40)
    );
    let reported: Vec<(&str, &str)> = c
        .deprecated_names()
        .iter()
        .map(|d| (d.old(), d.now()))
        .collect();
    assert_eq!(
        reported,
        [
            ("selection.max_retries", "selection.max_legs"),
            ("selection.retry_interval_ms", "selection.max_backoff_ms")
        ]
    );
    assert_eq!(
        c.deprecated_names()[0].to_string(),
        "configuration key selection.max_retries is deprecated: it sets \
         selection.max_legs, the name to use now (see docs/configuration.md)"
    );
    let renamed = Config::from_toml_str("[selection]\nmax_legs = 3\nmax_backoff_ms = 40\n")
        .expect("new keys parse");
    assert!(renamed.deprecated_names().is_empty());
    assert_eq!(renamed, c, "both names set the same value");

    let err = Config::from_toml_str("[selection]\nmax_retries = 3\nmax_legs = 4\n")
        .expect_err("both names of one key");
    assert!(err.to_string().contains("max_legs"), "{err}");

    let mut env = Config::default();
    let unknown = env
        .apply_env([
            ("HOLDFAST_MAX_RETRIES", "4"),
            ("HOLDFAST_MAX_BACKOFF_MS", "9"),
        ])
        .expect("applies");
    assert!(unknown.is_empty(), "{unknown:?}");
    assert_eq!(env.selection.max_legs, 4);
    assert_eq!(env.selection.max_backoff_ms, 9);
    let reported: Vec<(&str, bool)> = env
        .deprecated_names()
        .iter()
        .map(|d| (d.old(), d.in_env))
        .collect();
    assert_eq!(reported, [("HOLDFAST_MAX_RETRIES", true)]);

    for (text, key) in [
        ("[selection]\nmax_retries = 0", "selection.max_retries"),
        ("[selection]\nmax_legs = 0", "selection.max_legs"),
        (
            "[selection]\nmax_backoff_ms = 0",
            "selection.max_backoff_ms",
        ),
    ] {
        let err = Config::from_toml_str(text)
            .expect("parses")
            .validate()
            .expect_err(text);
        match &err {
            ConfigError::Invalid { key: k, .. } => assert_eq!(k, key, "{text}"),
            other => panic!("{text}: {other}"),
        }
    }
}
