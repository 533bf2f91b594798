//! Tidy checks: the dependency invariants of ARCHITECTURE.md, checked against
//! `cargo metadata` and `Cargo.lock` rather than good intentions.
//!
//! - `holdfast-domain` has no async runtime, database driver or `async-trait` in its
//!   normal dependency tree (a service can import the rules alone);
//! - `holdfast-ports` declares only the domain, `async-trait`, `thiserror`,
//!   `mockall` and `tokio` as normal dependencies, none optional; of tokio only
//!   `sync`, `time` and `macros` (the wake-up primitives: no runtime, no I/O),
//!   and only the `conformance` feature may enable more of it;
//! - neither adapter depends on the other (in any dependency kind);
//! - `Cargo.lock` holds one `libsqlite3-sys` version (two would link two SQLites).
//!
//! The checks are ordinary `#[test]`s below (so `cargo xtask test` runs them) and
//! also the last step of `cargo xtask ci`. Each check is exercised on synthetic
//! metadata with a forbidden edge, so a checker that cannot fail is itself a failure.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{Error, process};

const DOMAIN: &str = "holdfast-domain";
const PORTS: &str = "holdfast-ports";
const SQLITE_ADAPTER: &str = "holdfast-adapters-sqlite";
const POSTGRES_ADAPTER: &str = "holdfast-adapters-postgres";

/// Crates that must not appear in the domain's normal dependency tree.
const DOMAIN_FORBIDDEN: &[&str] = &["tokio", "sqlx", "rusqlite", "libsqlite3-sys", "async-trait"];
/// Name prefixes that must not appear there either (sqlx's sub-crates).
const DOMAIN_FORBIDDEN_PREFIXES: &[&str] = &["sqlx-"];
/// The only normal dependencies the ports may declare (none optional).
const PORTS_ALLOWED: &[&str] = &[DOMAIN, "async-trait", "thiserror", "mockall", "tokio"];
/// The tokio features the ports may declare: `Notify`, timers and `select!` for
/// the wake-up port; no runtime, no I/O.
const PORTS_TOKIO_FEATURES: &[&str] = &["macros", "sync", "time"];
/// The one feature of the ports that may enable more of tokio (a runtime, for the
/// conformance suite).
const PORTS_TOKIO_FEATURE: &str = "conformance";

/// Which kind of dependency an edge is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Normal,
    Dev,
    Build,
}

impl Kind {
    fn parse(value: &Value) -> Result<Kind, Error> {
        match value {
            Value::Null => Ok(Kind::Normal),
            Value::String(s) if s == "dev" => Ok(Kind::Dev),
            Value::String(s) if s == "build" => Ok(Kind::Build),
            other => Err(bad_metadata(format!(
                "dependency kind {other}; expected null, \"dev\" or \"build\""
            ))),
        }
    }
}

/// A dependency as declared in a manifest.
#[derive(Debug, Clone)]
struct Declared {
    name: String,
    kind: Kind,
    optional: bool,
    features: Vec<String>,
}

/// A package of the resolved graph.
#[derive(Debug, Clone)]
struct Package {
    name: String,
    declared: Vec<Declared>,
    features: BTreeMap<String, Vec<String>>,
}

/// The parts of `cargo metadata --format-version 1` the checks read.
#[derive(Debug, Clone)]
pub struct Metadata {
    packages: BTreeMap<String, Package>,
    /// Resolved edges: package id -> (dependency id, kinds of the edge).
    edges: BTreeMap<String, Vec<(String, Vec<Kind>)>>,
}

fn bad_metadata(detail: String) -> Error {
    Error::Metadata {
        what: "cargo metadata",
        detail,
    }
}

fn field<'a>(value: &'a Value, key: &str) -> Result<&'a Value, Error> {
    value
        .get(key)
        .ok_or_else(|| bad_metadata(format!("missing field {key:?}")))
}

fn string(value: &Value, key: &str) -> Result<String, Error> {
    field(value, key)?
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| bad_metadata(format!("field {key:?} is not a string")))
}

fn array<'a>(value: &'a Value, key: &str) -> Result<&'a Vec<Value>, Error> {
    field(value, key)?
        .as_array()
        .ok_or_else(|| bad_metadata(format!("field {key:?} is not an array")))
}

impl Metadata {
    /// Parses the JSON printed by `cargo metadata --format-version 1`.
    pub fn parse(json: &str) -> Result<Metadata, Error> {
        let root: Value =
            serde_json::from_str(json).map_err(|e| bad_metadata(format!("not JSON: {e}")))?;
        let mut packages = BTreeMap::new();
        for pkg in array(&root, "packages")? {
            let mut declared = Vec::new();
            for dep in array(pkg, "dependencies")? {
                declared.push(Declared {
                    name: string(dep, "name")?,
                    kind: Kind::parse(field(dep, "kind")?)?,
                    optional: field(dep, "optional")?.as_bool().unwrap_or(false),
                    features: dep
                        .get("features")
                        .and_then(Value::as_array)
                        .map(|list| {
                            list.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_owned)
                                .collect()
                        })
                        .unwrap_or_default(),
                });
            }
            let mut features = BTreeMap::new();
            if let Some(map) = pkg.get("features").and_then(Value::as_object) {
                for (feature, enables) in map {
                    let enables = enables
                        .as_array()
                        .map(|list| {
                            list.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_owned)
                                .collect()
                        })
                        .unwrap_or_default();
                    features.insert(feature.clone(), enables);
                }
            }
            packages.insert(
                string(pkg, "id")?,
                Package {
                    name: string(pkg, "name")?,
                    declared,
                    features,
                },
            );
        }
        let resolve = field(&root, "resolve")?;
        if resolve.is_null() {
            return Err(bad_metadata(
                "\"resolve\" is null; run cargo metadata without --no-deps".to_owned(),
            ));
        }
        let mut edges = BTreeMap::new();
        for node in array(resolve, "nodes")? {
            let mut out = Vec::new();
            for dep in array(node, "deps")? {
                let kinds = array(dep, "dep_kinds")?
                    .iter()
                    .map(|k| Kind::parse(field(k, "kind")?))
                    .collect::<Result<Vec<_>, _>>()?;
                out.push((string(dep, "pkg")?, kinds));
            }
            edges.insert(string(node, "id")?, out);
        }
        Ok(Metadata { packages, edges })
    }

    /// Reads the metadata of the workspace at `root`.
    pub fn load(root: &Path) -> Result<Metadata, Error> {
        let out = process::output(
            process::cargo()
                .args(["metadata", "--format-version", "1", "--manifest-path"])
                .arg(root.join("Cargo.toml")),
        )?;
        Metadata::parse(&String::from_utf8_lossy(&out.stdout))
    }

    fn id_of(&self, name: &str) -> Option<&str> {
        self.packages
            .iter()
            .find(|(_, pkg)| pkg.name == name)
            .map(|(id, _)| id.as_str())
    }

    fn name_of<'a>(&'a self, id: &'a str) -> &'a str {
        self.packages.get(id).map_or(id, |pkg| pkg.name.as_str())
    }

    /// Every package reachable from `from` over normal edges, with the path that
    /// reaches it (`from -> a -> b`), for messages.
    fn normal_closure(&self, from: &str) -> BTreeMap<String, String> {
        let mut paths = BTreeMap::new();
        let Some(start) = self.id_of(from) else {
            return paths;
        };
        let mut queue = VecDeque::from([(start.to_owned(), from.to_owned())]);
        let mut seen = BTreeSet::from([start.to_owned()]);
        while let Some((id, path)) = queue.pop_front() {
            for (dep, kinds) in self.edges.get(&id).into_iter().flatten() {
                if kinds.contains(&Kind::Normal) && seen.insert(dep.clone()) {
                    let dep_path = format!("{path} -> {}", self.name_of(dep));
                    paths.insert(dep.clone(), dep_path.clone());
                    queue.push_back((dep.clone(), dep_path));
                }
            }
        }
        paths
    }
}

/// `holdfast-domain` reaches no runtime, driver or async-trait through normal edges.
pub fn check_domain_is_pure(meta: &Metadata) -> Vec<String> {
    if meta.id_of(DOMAIN).is_none() {
        return vec![format!("{DOMAIN} is not in the workspace metadata")];
    }
    meta.normal_closure(DOMAIN)
        .into_iter()
        .filter(|(id, _)| {
            let name = meta.name_of(id);
            DOMAIN_FORBIDDEN.contains(&name)
                || DOMAIN_FORBIDDEN_PREFIXES
                    .iter()
                    .any(|prefix| name.starts_with(prefix))
        })
        .map(|(_, path)| format!("{DOMAIN} must stay pure, but depends on: {path}"))
        .collect()
}

/// `holdfast-ports` declares only the allowed normal dependencies, none optional;
/// of tokio only [`PORTS_TOKIO_FEATURES`], and only [`PORTS_TOKIO_FEATURE`] may
/// enable more of it.
pub fn check_ports_dependencies(meta: &Metadata) -> Vec<String> {
    let Some(pkg) = meta.id_of(PORTS).and_then(|id| meta.packages.get(id)) else {
        return vec![format!("{PORTS} is not in the workspace metadata")];
    };
    let mut violations = Vec::new();
    for dep in pkg.declared.iter().filter(|d| d.kind == Kind::Normal) {
        if !PORTS_ALLOWED.contains(&dep.name.as_str()) {
            violations.push(format!(
                "{PORTS} depends on {}; expected only {}",
                dep.name,
                PORTS_ALLOWED.join(", ")
            ));
        } else if dep.optional {
            violations.push(format!(
                "{PORTS} has optional dependency {}; expected none",
                dep.name
            ));
        }
        if dep.name == "tokio" {
            for feature in dep
                .features
                .iter()
                .filter(|f| !PORTS_TOKIO_FEATURES.contains(&f.as_str()))
            {
                violations.push(format!(
                    "{PORTS} declares tokio feature {feature:?}; expected only {}",
                    PORTS_TOKIO_FEATURES.join(", ")
                ));
            }
        }
    }
    for (feature, enables) in &pkg.features {
        let more_tokio = enables.iter().any(|e| {
            e.strip_prefix("tokio/")
                .is_some_and(|f| !PORTS_TOKIO_FEATURES.contains(&f))
        });
        if more_tokio && feature != PORTS_TOKIO_FEATURE {
            violations.push(format!(
                "{PORTS} feature {feature:?} enables more of tokio; only feature {PORTS_TOKIO_FEATURE:?} may"
            ));
        }
    }
    violations
}

/// Neither adapter depends on the other, directly (any kind) or through normal edges.
pub fn check_adapters_independent(meta: &Metadata) -> Vec<String> {
    let mut violations = Vec::new();
    for (from, to) in [
        (SQLITE_ADAPTER, POSTGRES_ADAPTER),
        (POSTGRES_ADAPTER, SQLITE_ADAPTER),
    ] {
        let Some(pkg) = meta.id_of(from).and_then(|id| meta.packages.get(id)) else {
            violations.push(format!("{from} is not in the workspace metadata"));
            continue;
        };
        if let Some(dep) = pkg.declared.iter().find(|d| d.name == to) {
            violations.push(format!(
                "{from} declares a {:?} dependency on {to}; adapters must not depend on each other",
                dep.kind
            ));
        } else if let Some(path) = meta
            .normal_closure(from)
            .into_iter()
            .find(|(id, _)| meta.name_of(id) == to)
            .map(|(_, path)| path)
        {
            violations.push(format!(
                "adapters must not depend on each other, but: {path}"
            ));
        }
    }
    violations
}

/// `Cargo.lock` names exactly one version of `libsqlite3-sys` (or none).
pub fn check_single_sqlite(lockfile: &str) -> Vec<String> {
    let versions = lock_versions(lockfile, "libsqlite3-sys");
    if versions.len() > 1 {
        vec![format!(
            "Cargo.lock holds {} versions of libsqlite3-sys ({}); expected one",
            versions.len(),
            versions.into_iter().collect::<Vec<_>>().join(", ")
        )]
    } else {
        Vec::new()
    }
}

/// The versions of package `name` recorded in a `Cargo.lock` text.
fn lock_versions(lockfile: &str, name: &str) -> BTreeSet<String> {
    fn quoted(line: &str, key: &str) -> Option<String> {
        let rest = line.strip_prefix(key)?.trim_start().strip_prefix('=')?;
        Some(rest.trim().trim_matches('"').to_owned())
    }
    let mut versions = BTreeSet::new();
    let mut current: (Option<String>, Option<String>) = (None, None);
    let mut flush = |current: &mut (Option<String>, Option<String>)| {
        if let (Some(n), Some(v)) = (current.0.take(), current.1.take())
            && n == name
        {
            versions.insert(v);
        }
    };
    for line in lockfile.lines().map(str::trim) {
        if line == "[[package]]" {
            flush(&mut current);
        } else if let Some(n) = quoted(line, "name") {
            current.0 = Some(n);
        } else if let Some(v) = quoted(line, "version") {
            current.1 = Some(v);
        }
    }
    flush(&mut current);
    versions
}

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map_or_else(|| manifest_dir.clone(), Path::to_path_buf)
}

/// What a service importing the library with one backend feature must not pull:
/// (features, crates forbidden in the normal dependency tree).
pub const LIBRARY_FEATURE_SETS: &[(&str, &[&str])] = &[
    (
        "sqlite",
        &[
            "clap",
            "indicatif",
            "toml",
            "sqlx",
            "tracing-subscriber",
            "holdfast-adapters-postgres",
        ],
    ),
    (
        "postgres",
        &[
            "clap",
            "indicatif",
            "toml",
            "rusqlite",
            "libsqlite3-sys",
            "tracing-subscriber",
            "holdfast-adapters-sqlite",
        ],
    ),
];

/// The crates of a `cargo tree --prefix none` listing that are forbidden.
pub fn check_tree(features: &str, tree: &str, forbidden: &[&str]) -> Vec<String> {
    let names: BTreeSet<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    forbidden
        .iter()
        .filter(|name| names.contains(*name))
        .map(|name| format!("holdfast with only feature `{features}` pulls {name}"))
        .collect()
}

fn check_library_features(root: &Path) -> Result<Vec<String>, Error> {
    let mut violations = Vec::new();
    for (features, forbidden) in LIBRARY_FEATURE_SETS {
        let output = process::output(process::cargo().current_dir(root).args([
            "tree",
            "-p",
            "holdfast",
            "--no-default-features",
            "--features",
            features,
            "-e",
            "normal",
            "--prefix",
            "none",
        ]))?;
        let tree = String::from_utf8_lossy(&output.stdout);
        violations.extend(check_tree(features, &tree, forbidden));
    }
    Ok(violations)
}

/// The attribute that skips a test, spelled so this file does not contain it.
const IGNORE_ATTRIBUTE: &str = concat!("#[", "ignore");

/// Rust sources that skip a test or lack a module doc comment (`//!` first).
pub fn check_sources(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut violations = Vec::new();
    for (path, text) in files {
        if text.contains(IGNORE_ATTRIBUTE) {
            violations.push(format!(
                "{}: a skipped test ({IGNORE_ATTRIBUTE}]); a test that cannot run here must say so and fail under CI",
                path.display()
            ));
        }
        let in_src = path.components().any(|c| c.as_os_str() == "src");
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        if in_src && !first.starts_with("//!") {
            violations.push(format!(
                "{}: no module documentation (`//!` first): say what this module holds",
                path.display()
            ));
        }
    }
    violations
}

fn rust_sources(dir: &Path, out: &mut Vec<(PathBuf, String)>) -> Result<(), Error> {
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
        action: "listing",
        path: dir.to_owned(),
        source,
    })?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path
                .file_name()
                .is_some_and(|n| n == "target" || n == "snapshots")
            {
                continue;
            }
            rust_sources(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
                action: "reading",
                path: path.clone(),
                source,
            })?;
            out.push((path, text));
        }
    }
    Ok(())
}

/// Runs every check on the real workspace; all violations are reported together.
pub fn run() -> Result<(), Error> {
    let root = workspace_root();
    let meta = Metadata::load(&root)?;
    let lock_path = root.join("Cargo.lock");
    let lockfile = std::fs::read_to_string(&lock_path).map_err(|source| Error::Io {
        action: "reading",
        path: lock_path,
        source,
    })?;
    let mut sources = Vec::new();
    for dir in ["crates", "xtask", "fuzz"] {
        rust_sources(&root.join(dir), &mut sources)?;
    }
    let checks: [(&str, Vec<String>); 6] = [
        ("domain is pure", check_domain_is_pure(&meta)),
        ("ports dependencies", check_ports_dependencies(&meta)),
        ("adapters independent", check_adapters_independent(&meta)),
        ("one libsqlite3-sys", check_single_sqlite(&lockfile)),
        ("library with one backend", check_library_features(&root)?),
        ("module docs, no skipped tests", check_sources(&sources)),
    ];
    let mut violations = Vec::new();
    for (name, found) in checks {
        eprintln!(
            "tidy: {name}: {}",
            if found.is_empty() { "ok" } else { "FAILED" }
        );
        violations.extend(found);
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(Error::Tidy(violations))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn real() -> Metadata {
        match Metadata::load(&workspace_root()) {
            Ok(meta) => meta,
            Err(err) => panic!("cargo metadata failed: {err}"),
        }
    }

    /// A synthetic workspace: `deps` are (from, to, kind, optional) declarations,
    /// which also become resolved edges; `features` are (package, feature, enables).
    fn synthetic(
        deps: &[(&str, &str, Option<&str>, bool)],
        features: &[(&str, &str, &str)],
    ) -> Metadata {
        let mut names: BTreeSet<&str> = [DOMAIN, PORTS, SQLITE_ADAPTER, POSTGRES_ADAPTER]
            .into_iter()
            .collect();
        for (from, to, _, _) in deps {
            names.insert(from);
            names.insert(to);
        }
        let packages: Vec<Value> = names
            .iter()
            .map(|name| {
                let declared: Vec<Value> = deps
                    .iter()
                    .filter(|d| d.0 == *name)
                    .map(|(_, to, kind, optional)| {
                        // `name[f1,f2]` declares features.
                        let (name, features) = match to.split_once('[') {
                            Some((name, rest)) => (name, rest.trim_end_matches(']').split(',').collect()),
                            None => (*to, Vec::new()),
                        };
                        json!({"name": name, "kind": kind, "optional": optional, "features": features})
                    })
                    .collect();
                let mut feats = serde_json::Map::new();
                for (pkg, feature, enables) in features.iter().filter(|f| f.0 == *name) {
                    let _ = pkg;
                    feats.insert((*feature).to_owned(), json!([enables]));
                }
                json!({"id": format!("id:{name}"), "name": name, "version": "1.0.0",
                       "dependencies": declared, "features": feats})
            })
            .collect();
        let nodes: Vec<Value> = names
            .iter()
            .map(|name| {
                let out: Vec<Value> = deps
                    .iter()
                    .filter(|d| d.0 == *name)
                    .map(|(_, to, kind, _)| json!({"pkg": format!("id:{to}"), "dep_kinds": [{"kind": kind}]}))
                    .collect();
                json!({"id": format!("id:{name}"), "deps": out})
            })
            .collect();
        let text = json!({"packages": packages, "resolve": {"nodes": nodes}}).to_string();
        match Metadata::parse(&text) {
            Ok(meta) => meta,
            Err(err) => panic!("synthetic metadata did not parse: {err}"),
        }
    }

    #[test]
    fn workspace_satisfies_every_tidy_check() {
        let meta = real();
        assert_eq!(check_domain_is_pure(&meta), Vec::<String>::new());
        assert_eq!(check_ports_dependencies(&meta), Vec::<String>::new());
        assert_eq!(check_adapters_independent(&meta), Vec::<String>::new());
        let lockfile = std::fs::read_to_string(workspace_root().join("Cargo.lock"))
            .unwrap_or_else(|err| panic!("reading Cargo.lock: {err}"));
        assert_eq!(check_single_sqlite(&lockfile), Vec::<String>::new());
    }

    #[test]
    fn domain_reaching_tokio_transitively_is_reported_with_its_path() {
        let meta = synthetic(
            &[
                (DOMAIN, "rand", None, false),
                ("rand", "tokio", None, false),
            ],
            &[],
        );
        assert_eq!(
            check_domain_is_pure(&meta),
            vec![format!(
                "{DOMAIN} must stay pure, but depends on: {DOMAIN} -> rand -> tokio"
            )]
        );
    }

    #[test]
    fn domain_forbidden_crates_and_sqlx_family_are_all_caught() {
        for forbidden in ["sqlx", "sqlx-core", "rusqlite", "async-trait", "tokio"] {
            let meta = synthetic(&[(DOMAIN, forbidden, None, false)], &[]);
            assert_eq!(
                check_domain_is_pure(&meta).len(),
                1,
                "{forbidden} not caught"
            );
        }
    }

    #[test]
    fn domain_dev_dependencies_are_allowed() {
        let meta = synthetic(&[(DOMAIN, "tokio", Some("dev"), false)], &[]);
        assert_eq!(check_domain_is_pure(&meta), Vec::<String>::new());
    }

    #[test]
    fn ports_with_a_database_driver_is_reported() {
        let meta = synthetic(
            &[(PORTS, DOMAIN, None, false), (PORTS, "sqlx", None, false)],
            &[],
        );
        assert_eq!(
            check_ports_dependencies(&meta),
            vec![format!(
                "{PORTS} depends on sqlx; expected only {DOMAIN}, async-trait, thiserror, mockall, tokio"
            )]
        );
    }

    #[test]
    fn ports_tokio_is_allowed_only_for_its_wake_up_primitives() {
        let allowed = synthetic(
            &[(PORTS, "tokio[sync,time,macros]", None, false)],
            &[(PORTS, "conformance", "tokio/rt")],
        );
        assert_eq!(check_ports_dependencies(&allowed), Vec::<String>::new());

        let runtime = synthetic(&[(PORTS, "tokio[sync,rt-multi-thread]", None, false)], &[]);
        assert_eq!(
            check_ports_dependencies(&runtime),
            vec![format!(
                "{PORTS} declares tokio feature \"rt-multi-thread\"; expected only macros, sync, time"
            )]
        );

        let other_feature = synthetic(
            &[(PORTS, "tokio[sync]", None, false)],
            &[(PORTS, "runtime", "tokio/rt")],
        );
        assert_eq!(
            check_ports_dependencies(&other_feature),
            vec![format!(
                "{PORTS} feature \"runtime\" enables more of tokio; only feature \"conformance\" may"
            )]
        );

        let optional = synthetic(&[(PORTS, "tokio[sync]", None, true)], &[]);
        assert_eq!(check_ports_dependencies(&optional).len(), 1);
    }

    #[test]
    fn ports_dev_dependencies_are_allowed() {
        let meta = synthetic(&[(PORTS, "tokio", Some("dev"), false)], &[]);
        assert_eq!(check_ports_dependencies(&meta), Vec::<String>::new());
    }

    #[test]
    fn adapter_depending_on_the_other_is_reported_directly_and_transitively() {
        let direct = synthetic(
            &[(SQLITE_ADAPTER, POSTGRES_ADAPTER, Some("dev"), false)],
            &[],
        );
        assert_eq!(check_adapters_independent(&direct).len(), 1);

        let transitive = synthetic(
            &[
                (POSTGRES_ADAPTER, "shim", None, false),
                ("shim", SQLITE_ADAPTER, None, false),
            ],
            &[],
        );
        assert_eq!(
            check_adapters_independent(&transitive),
            vec![format!(
                "adapters must not depend on each other, but: {POSTGRES_ADAPTER} -> shim -> {SQLITE_ADAPTER}"
            )]
        );
    }

    #[test]
    fn two_libsqlite3_sys_versions_are_reported() {
        let lock = "version = 4\n\n[[package]]\nname = \"libsqlite3-sys\"\nversion = \"0.35.0\"\n\n\
                    [[package]]\nname = \"rusqlite\"\nversion = \"0.39.0\"\n\n\
                    [[package]]\nname = \"libsqlite3-sys\"\nversion = \"0.36.0\"\n";
        assert_eq!(
            check_single_sqlite(lock),
            vec![
                "Cargo.lock holds 2 versions of libsqlite3-sys (0.35.0, 0.36.0); expected one"
                    .to_owned()
            ]
        );
        let one = "[[package]]\nname = \"libsqlite3-sys\"\nversion = \"0.36.0\"\n";
        assert_eq!(check_single_sqlite(one), Vec::<String>::new());
    }

    #[test]
    fn a_forbidden_crate_in_the_library_tree_is_reported() {
        let tree = "holdfast v0.1.0\nclap v4.5.0\nholdfast-domain v0.1.0\n";
        assert_eq!(
            check_tree("sqlite", tree, &["clap", "toml"]),
            vec!["holdfast with only feature `sqlite` pulls clap".to_owned()]
        );
        assert!(check_tree("sqlite", "holdfast v0.1.0\n", &["clap"]).is_empty());
    }

    #[test]
    fn skipped_tests_and_undocumented_modules_are_reported() {
        let file = |path: &str, text: &str| (PathBuf::from(path), text.to_owned());
        let found = check_sources(&[
            file("crates/x/src/a.rs", "//! A.\nfn a() {}\n"),
            file("crates/x/src/b.rs", "fn b() {}\n"),
            file(
                "crates/x/tests/c.rs",
                &format!("{IGNORE_ATTRIBUTE}]\n#[test]\nfn c() {{}}\n"),
            ),
            file("crates/x/tests/d.rs", "#[test]\nfn d() {}\n"),
        ]);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("b.rs") && found[0].contains("module documentation"));
        assert!(found[1].contains("c.rs") && found[1].contains("skipped test"));
    }

    #[test]
    fn malformed_metadata_is_a_typed_error() {
        assert!(matches!(
            Metadata::parse("{\"packages\": []}"),
            Err(Error::Metadata { .. })
        ));
        assert!(matches!(
            Metadata::parse("not json"),
            Err(Error::Metadata { .. })
        ));
    }
}
