//! `docs/metrics.md` and `docs/configuration.md` are generated from code; these
//! tests pin them with insta snapshots and fail when the files are stale.
//! Regenerate with `UPDATE_DOCS=1 cargo test -p holdfast --test reference_docs`.

use std::path::PathBuf;

fn check_doc(file: &str, generated: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .join(file);
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::create_dir_all(path.parent().expect("docs dir")).expect("create docs/");
        std::fs::write(&path, generated).expect("write the doc");
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "docs/{file} is stale; regenerate with `UPDATE_DOCS=1 cargo test -p holdfast --test reference_docs`"
    );
}

#[test]
fn metrics_reference_is_current() {
    let text = holdfast::metrics::reference_markdown();
    insta::assert_snapshot!("metrics_reference", text);
    check_doc("metrics.md", &text);
}

#[test]
fn configuration_reference_is_current() {
    let text = holdfast::config::reference_markdown();
    insta::assert_snapshot!("configuration_reference", text);
    check_doc("configuration.md", &text);
}

#[test]
fn every_metric_is_prefixed_and_named_once() {
    let mut names = std::collections::BTreeSet::new();
    for m in holdfast::metrics::METRICS {
        assert!(m.name.starts_with("holdfast_"), "{}", m.name);
        assert!(names.insert(m.name), "{} twice", m.name);
        let counter = m.kind == holdfast::metrics::MetricKind::Counter;
        assert_eq!(counter, m.name.ends_with("_total"), "{}", m.name);
    }
}

#[test]
fn every_config_key_is_in_the_reference_with_its_env_var() {
    let text = holdfast::config::reference_markdown();
    for k in holdfast::config::KEYS {
        assert!(text.contains(&format!("`{}`", k.key)), "{}", k.key);
        assert!(text.contains(&format!("`{}`", k.env)), "{}", k.env);
    }
}
