//! Tidy checks: the invariants of ARCHITECTURE.md, checked against `cargo
//! metadata`, `Cargo.lock` and the source tree rather than good intentions.
//!
//! - `holdfast-domain` has no async runtime, database driver or `async-trait` in its
//!   normal dependency tree (a service can import the rules alone);
//! - `holdfast-ports` declares only the domain, `async-trait`, `thiserror`,
//!   `mockall` and `tokio` as normal dependencies, none optional; of tokio only
//!   `sync`, `time` and `macros` (the wake-up primitives: no runtime, no I/O),
//!   and only the `conformance` feature may enable more of it;
//! - neither adapter depends on the other (in any dependency kind);
//! - `holdfast-cli` names no database driver or adapter: none is a normal
//!   dependency of it, and `crates/cli/src` has no path into one (the command
//!   reaches the databases through `holdfast` and `holdfast-simulator` only);
//! - `Cargo.lock` holds one `libsqlite3-sys` version (two would link two SQLites);
//! - `holdfast` with one backend feature pulls no command-line crate and not the
//!   other backend (`cargo tree`);
//! - `crates/domain/clippy.toml` bans every way to the clock (`now`, `elapsed`),
//!   the environment and OS randomness (`OsRng`, `from_os_rng`, `rand::rng` and
//!   the other global-generator functions) that [`DOMAIN_BANNED_METHODS`] and
//!   [`DOMAIN_BANNED_TYPES`] list; clippy then enforces the bans;
//! - every source module starts with `//!`, and no test is skipped with an
//!   attribute (a skip at run time is `cargo xtask ci`'s, see `crate::testing`);
//! - test code sleeps only with a stated reason (`// sleep: <reason>`) or on
//!   tokio's paused clock ([`check_test_sleeps`]);
//! - both adapters keep the same file map: a file of one has a counterpart of the
//!   same name in the other unless [`BACKEND_SPECIFIC_FILES`] says why not;
//! - every `Duration` or numeric constant in an adapter's code is declared in
//!   [`ADAPTER_CONSTANTS`] as a fact, a bound or a documented tuning (adapters
//!   decide no policy).
//!
//! All run as the last step of `cargo xtask ci` ([`run`]); all but the `cargo
//! tree` one also run as ordinary `#[test]`s on the real workspace (so `cargo
//! xtask test` runs them). Each check is exercised on a synthetic violation too,
//! so a checker that cannot fail is itself a failure.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{Error, process};

const DOMAIN: &str = "holdfast-domain";
const PORTS: &str = "holdfast-ports";
const SQLITE_ADAPTER: &str = "holdfast-adapters-sqlite";
const POSTGRES_ADAPTER: &str = "holdfast-adapters-postgres";
const CLI: &str = "holdfast-cli";
/// Crates `holdfast-cli` must not declare as normal dependencies (nor any
/// [`CLI_FORBIDDEN_PREFIXES`] one): database drivers and the adapters.
const CLI_FORBIDDEN: &[&str] = &["sqlx", "rusqlite", "libsqlite3-sys"];
const CLI_FORBIDDEN_PREFIXES: &[&str] = &["sqlx-", "holdfast-adapters-"];
/// The command's own sources, relative to the workspace root.
const CLI_SRC: &str = "crates/cli/src";
/// Paths into a driver or an adapter that `crates/cli/src` must not name.
const CLI_FORBIDDEN_PATHS: &[&str] = &["holdfast_adapters_", "sqlx::", "rusqlite::"];

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

/// `holdfast-cli` declares no database driver or adapter as a normal dependency
/// (its tests may: dev-dependencies are allowed).
pub fn check_cli_names_no_driver(meta: &Metadata) -> Vec<String> {
    let Some(pkg) = meta.id_of(CLI).and_then(|id| meta.packages.get(id)) else {
        return vec![format!("{CLI} is not in the workspace metadata")];
    };
    pkg.declared
        .iter()
        .filter(|d| d.kind == Kind::Normal)
        .filter(|d| {
            CLI_FORBIDDEN.contains(&d.name.as_str())
                || CLI_FORBIDDEN_PREFIXES
                    .iter()
                    .any(|prefix| d.name.starts_with(prefix))
        })
        .map(|d| {
            format!(
                "{CLI} depends on {}; the command reaches databases through holdfast and holdfast-simulator only",
                d.name
            )
        })
        .collect()
}

/// No file under `crates/cli/src` names a path into a driver or an adapter
/// ([`CLI_FORBIDDEN_PATHS`]).
pub fn check_cli_sources(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut violations = Vec::new();
    for (path, text) in files.iter().filter(|(p, _)| p.starts_with(CLI_SRC)) {
        for (n, line) in text.lines().enumerate() {
            for forbidden in CLI_FORBIDDEN_PATHS.iter().filter(|f| line.contains(**f)) {
                violations.push(format!(
                    "{}:{}: names `{forbidden}`; the command reaches databases through holdfast and holdfast-simulator only",
                    path.display(),
                    n + 1
                ));
            }
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

// --- The domain's bans ----------------------------------------------------------

/// The domain's clippy configuration, relative to the workspace root.
const DOMAIN_CLIPPY: &str = "crates/domain/clippy.toml";

/// Functions and methods the domain's clippy configuration must ban: each reads
/// the clock, the environment or OS randomness.
const DOMAIN_BANNED_METHODS: &[&str] = &[
    "std::time::SystemTime::now",
    "std::time::Instant::now",
    "std::time::Instant::elapsed",
    "std::time::SystemTime::elapsed",
    "std::env::var",
    "std::env::var_os",
    "std::env::vars",
    "std::env::vars_os",
    "std::env::args",
    "std::env::args_os",
    "rand::SeedableRng::from_os_rng",
    "rand::SeedableRng::try_from_os_rng",
    "rand::rng",
    "rand::thread_rng",
    "rand::random",
    "rand::random_iter",
    "rand::random_range",
    "rand::random_bool",
    "rand::random_ratio",
    "rand::fill",
];

/// Types the domain's clippy configuration must ban: OS randomness and the
/// OS-seeded global generator.
const DOMAIN_BANNED_TYPES: &[&str] = &["rand::rngs::OsRng", "rand::rngs::ThreadRng"];

/// The paths a clippy.toml text lists under `table` (`disallowed-methods`,
/// `disallowed-types`): the `path` of each `{ path = "..", .. }` entry and each
/// bare `".."` entry.
fn banned_paths(toml: &str, table: &str) -> BTreeSet<String> {
    let text: String = toml
        .lines()
        .map(|line| line.split('#').next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut paths = BTreeSet::new();
    let mut lines = text.split('\n');
    let mut body = String::new();
    // Collect the text of the array that starts at `table = [`.
    while let Some(line) = lines.next() {
        let Some(rest) = line
            .trim_start()
            .strip_prefix(table)
            .map(str::trim_start)
            .and_then(|r| r.strip_prefix('='))
            .map(str::trim_start)
            .and_then(|r| r.strip_prefix('['))
        else {
            continue;
        };
        body.push_str(rest);
        if !rest.contains(']') {
            for more in lines.by_ref() {
                body.push('\n');
                body.push_str(more);
                if more.trim_start().starts_with(']') {
                    break;
                }
            }
        }
        body.push('\n');
    }
    let mut rest = body.as_str();
    loop {
        rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ',');
        if let Some(inner) = rest.strip_prefix('{') {
            let close = inner.find('}').unwrap_or(inner.len());
            let path = inner[..close].split(',').find_map(|pair| {
                let (key, value) = pair.split_once('=')?;
                (key.trim() == "path").then(|| value.trim().trim_matches('"').to_owned())
            });
            paths.extend(path);
            rest = inner.get(close + 1..).unwrap_or("");
        } else if let Some(inner) = rest.strip_prefix('"') {
            let close = inner.find('"').unwrap_or(inner.len());
            paths.insert(inner[..close].to_owned());
            rest = inner.get(close + 1..).unwrap_or("");
        } else if let Some(after) = rest.strip_prefix(']') {
            rest = after;
        } else {
            break;
        }
    }
    paths
}

/// The domain's clippy configuration bans every path of [`DOMAIN_BANNED_METHODS`]
/// and [`DOMAIN_BANNED_TYPES`], so "the domain reads no clock, environment or OS
/// randomness" is enforced by clippy rather than hoped.
pub fn check_domain_bans(clippy_toml: &str) -> Vec<String> {
    let mut violations = Vec::new();
    for (table, required) in [
        ("disallowed-methods", DOMAIN_BANNED_METHODS),
        ("disallowed-types", DOMAIN_BANNED_TYPES),
    ] {
        let banned = banned_paths(clippy_toml, table);
        for path in required.iter().filter(|p| !banned.contains(**p)) {
            violations.push(format!(
                "{DOMAIN_CLIPPY}: `{path}` is not in {table}; the domain could read the clock, \
                 the environment or OS randomness through it"
            ));
        }
    }
    violations
}

// --- The adapters' file maps ----------------------------------------------------

const SQLITE_SRC: &str = "crates/adapters-sqlite/src";
const POSTGRES_SRC: &str = "crates/adapters-postgres/src";

/// Files of one adapter's `src` that the other has no counterpart of, each with
/// why: (adapter `src`, file, reason). Every other file exists in both, for the
/// same role, so a reader who knows one adapter knows where to look in the other.
const BACKEND_SPECIFIC_FILES: &[(&str, &str, &str)] = &[
    (
        SQLITE_SRC,
        "pool.rs",
        "rusqlite is synchronous: one writer with group commit and readers on blocking threads (PostgreSQL's pool is sqlx's, set up in session.rs)",
    ),
    (
        SQLITE_SRC,
        "lockout.rs",
        "the file's one write lock and its busy timeout; PostgreSQL has row locks and statement timeouts",
    ),
    (
        SQLITE_SRC,
        "dbfile.rs",
        "the database is a file whose path can be deleted or replaced; PostgreSQL has no file",
    ),
    (
        SQLITE_SRC,
        "timetext.rs",
        "SQLite stores timestamps as text; PostgreSQL binds them as numbers in codec.rs",
    ),
    (
        POSTGRES_SRC,
        "session.rs",
        "a server connection's settings, the sqlx pool and Health (SQLite's connections are pool.rs)",
    ),
    (
        POSTGRES_SRC,
        "url.rs",
        "passwords in connection URLs; a SQLite URL carries none",
    ),
    (
        POSTGRES_SRC,
        "hosts.rs",
        "multi-host URLs and target_session_attrs; SQLite has one file",
    ),
    (
        POSTGRES_SRC,
        "route.rs",
        "following the primary across hosts at a failover; SQLite has no replicas",
    ),
    (
        POSTGRES_SRC,
        "interest.rs",
        "which keys other instances wait for, so that NOTIFY goes only there; SQLite's instances share a file and poll data_version, sending nothing",
    ),
    (
        POSTGRES_SRC,
        "durability.rs",
        "whether replication settings can lose an acknowledged commit; SQLite has no replication",
    ),
];

/// Each adapter's `src` files (paths below `src`, `/`-separated) exist in the
/// other adapter too, unless `declared` names them as specific to it; a
/// declaration must name a file that exists in its adapter only.
pub fn check_adapter_file_maps(
    maps: &[(&str, BTreeSet<String>)],
    declared: &[(&str, &str, &str)],
) -> Vec<String> {
    let mut violations = Vec::new();
    for (adapter, files) in maps {
        let others: Vec<&(&str, BTreeSet<String>)> =
            maps.iter().filter(|(a, _)| a != adapter).collect();
        for file in files {
            let in_others = others.iter().all(|(_, f)| f.contains(file));
            let specific = declared.iter().any(|(a, f, _)| a == adapter && f == file);
            if !in_others && !specific {
                violations.push(format!(
                    "{adapter}/{file} has no counterpart in {}: give the same role the same file \
                     in both adapters, or declare it in tidy's BACKEND_SPECIFIC_FILES with why",
                    others
                        .iter()
                        .map(|(a, _)| *a)
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            } else if in_others && specific {
                violations.push(format!(
                    "{adapter}/{file} is declared specific to it in BACKEND_SPECIFIC_FILES, \
                     but every adapter has it: remove the declaration"
                ));
            }
        }
    }
    for (adapter, file, _) in declared {
        let exists = maps
            .iter()
            .any(|(a, files)| a == adapter && files.contains(*file));
        if !exists {
            violations.push(format!(
                "BACKEND_SPECIFIC_FILES declares {adapter}/{file}, which does not exist: remove it"
            ));
        }
    }
    violations
}

/// The `.rs` files below `src` among `sources` (root-relative paths), as paths
/// relative to `src` with `/` separators.
fn file_map(sources: &[(PathBuf, String)], src: &str) -> BTreeSet<String> {
    sources
        .iter()
        .filter_map(|(path, _)| path.strip_prefix(src).ok())
        .map(|rel| {
            rel.components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/")
        })
        .collect()
}

// --- Test code ------------------------------------------------------------------

/// Which lines of a root-relative source file are test code: all of a file under
/// a `tests` directory, a `tests.rs` file or the conformance suite
/// (`crates/ports/src/conformance`); elsewhere the inline `#[cfg(test)] mod .. {`
/// modules (to their closing brace at the module's indentation, as rustfmt
/// writes it).
fn test_lines(path: &Path, text: &str) -> Vec<bool> {
    let lines: Vec<&str> = text.lines().collect();
    let whole = path.components().any(|c| c.as_os_str() == "tests")
        || path.file_name().is_some_and(|n| n == "tests.rs")
        || path.starts_with("crates/ports/src/conformance");
    if whole {
        return vec![true; lines.len()];
    }
    let mut mask = vec![false; lines.len()];
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "#[cfg(test)]" {
            i += 1;
            continue;
        }
        let Some(decl) = (i + 1..lines.len())
            .find(|&j| !lines[j].trim().is_empty() && !lines[j].trim_start().starts_with("#["))
        else {
            break;
        };
        let head = lines[decl].trim();
        let is_module =
            head.ends_with('{') && head.split_whitespace().take(2).any(|word| word == "mod");
        if !is_module {
            i = decl;
            continue;
        }
        let indent = &lines[decl][..lines[decl].len() - lines[decl].trim_start().len()];
        let close = format!("{indent}}}");
        let end = (decl + 1..lines.len())
            .find(|&j| lines[j].trim_end() == close)
            .unwrap_or(lines.len() - 1);
        for flag in &mut mask[i..=end] {
            *flag = true;
        }
        i = end + 1;
    }
    mask
}

// --- Sleeps in tests ------------------------------------------------------------

/// The comment that states why a test sleeps, on the sleeping line or in the
/// comment lines right above it: `// sleep: <reason>`.
const SLEEP_REASON: &str = "// sleep:";

/// A call that sleeps (`thread::sleep`, `tokio::time::sleep`, `sleep_until`).
const SLEEP_CALLS: &[&str] = &["sleep(", "sleep_until("];

/// Whether `line` has a stated sleep reason: the marker followed by some text.
fn states_sleep_reason(line: &str) -> bool {
    line.find(SLEEP_REASON)
        .is_some_and(|at| !line[at + SLEEP_REASON.len()..].trim().is_empty())
}

/// Which lines run on tokio's paused clock: the bodies of
/// `#[tokio::test(start_paused = true)]` functions, and what follows a
/// `tokio::time::pause()` call to the end of its block. A sleep there only moves
/// the paused clock, once every task is idle: deterministic, not a guess.
fn paused_lines(text: &str) -> Vec<bool> {
    let lines: Vec<&str> = text.lines().collect();
    let indent = |line: &str| line.len() - line.trim_start().len();
    // The first line from `from` that closes a block opened at an indentation
    // below `inner`.
    let block_end = |from: usize, inner: usize| {
        (from..lines.len())
            .find(|&j| lines[j].trim() == "}" && indent(lines[j]) < inner)
            .unwrap_or(lines.len().saturating_sub(1))
    };
    let mut mask = vec![false; lines.len()];
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim();
        let start =
            if trimmed.starts_with("#[tokio::test") && trimmed.contains("start_paused = true") {
                (i + 1..lines.len())
                    .find(|&j| lines[j].contains("fn "))
                    .map(|f| (i, indent(lines[f]) + 1))
            } else if trimmed.contains("time::pause()") && !trimmed.starts_with("//") {
                Some((i, indent(line)))
            } else {
                None
            };
        if let Some((from, inner)) = start {
            let end = block_end(from + 1, inner);
            for flag in mask.iter_mut().take(end + 1).skip(from) {
                *flag = true;
            }
        }
    }
    mask
}

/// Test code that sleeps without a stated reason. A sleep as synchronisation
/// ("give the task time to get there") makes a test slow and flaky; a test waits
/// on the condition instead (poll it, a channel, `tokio::time::pause`). Where
/// time itself must pass (a lease run out, a workload's pace, a poll interval)
/// the test says so: `// sleep: <reason>`. Sleeps on the paused clock
/// ([`paused_lines`]) need no reason.
pub fn check_test_sleeps(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut violations = Vec::new();
    for (path, text) in files {
        let lines: Vec<&str> = text.lines().collect();
        let tests = test_lines(path, text);
        let paused = paused_lines(text);
        for (n, line) in lines.iter().enumerate() {
            if !tests[n] || paused[n] {
                continue;
            }
            let code = line.split("//").next().unwrap_or("");
            let sleeps = SLEEP_CALLS.iter().any(|call| {
                code.match_indices(call).any(|(at, _)| {
                    !code[..at]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_')
                })
            });
            if !sleeps || states_sleep_reason(line) {
                continue;
            }
            let above = lines[..n]
                .iter()
                .rev()
                .take_while(|l| l.trim_start().starts_with("//"))
                .any(|l| states_sleep_reason(l));
            if !above {
                violations.push(format!(
                    "{}:{}: a test sleeps without a stated reason: wait on the condition instead \
                     (poll it, a channel, tokio::time::pause), or say why time must pass with \
                     `{SLEEP_REASON} <reason>` on the line or just above",
                    path.display(),
                    n + 1
                ));
            }
        }
    }
    violations
}

// --- Tuned constants in the adapters --------------------------------------------

/// Why a number may live in an adapter, which decides no policy.
#[derive(Debug, Clone, Copy)]
pub enum Basis {
    /// A fact of the database, its protocol or a stored form, not a choice.
    Fact,
    /// The edge of what the adapter accepts, stores or prints: validation.
    Bound,
    /// A mechanism's tuning (a pause, a poll interval, a timeout of the
    /// connection machinery), not a rule of the domain; the value is stated and
    /// argued in the named file.
    Tuned(&'static str),
}

/// A `Duration` or numeric constant of an adapter, declared with its basis.
#[derive(Debug, Clone, Copy)]
pub struct AdapterConstant {
    /// The file, relative to the workspace root.
    pub file: &'static str,
    /// The constant's name.
    pub name: &'static str,
    /// Why it may live there.
    pub basis: Basis,
    /// What it is, in a few words.
    pub what: &'static str,
}

const fn constant(
    file: &'static str,
    name: &'static str,
    basis: Basis,
    what: &'static str,
) -> AdapterConstant {
    AdapterConstant {
        file,
        name,
        basis,
        what,
    }
}

const PG_CODEC: &str = "crates/adapters-postgres/src/codec.rs";
const PG_BACKEND: &str = "crates/adapters-postgres/src/backend.rs";
const PG_LOCKS: &str = "crates/adapters-postgres/src/locks.rs";
const PG_OPTIONS: &str = "crates/adapters-postgres/src/options.rs";
const PG_QUEUES: &str = "crates/adapters-postgres/src/queues.rs";
const PG_ROUTE: &str = "crates/adapters-postgres/src/route.rs";
const PG_SESSION: &str = "crates/adapters-postgres/src/session.rs";
const PG_TOKENS: &str = "crates/adapters-postgres/src/tokens.rs";
const PG_WAKE: &str = "crates/adapters-postgres/src/wake.rs";
const PG_INTEREST: &str = "crates/adapters-postgres/src/interest.rs";
const SQLITE_BACKEND: &str = "crates/adapters-sqlite/src/backend.rs";
const SQLITE_CODEC: &str = "crates/adapters-sqlite/src/codec.rs";
const SQLITE_LOCKOUT: &str = "crates/adapters-sqlite/src/lockout.rs";
const SQLITE_OPTIONS: &str = "crates/adapters-sqlite/src/options.rs";
const SQLITE_POOL: &str = "crates/adapters-sqlite/src/pool.rs";
const SQLITE_SCHEMA: &str = "crates/adapters-sqlite/src/schema.rs";
const SQLITE_TIMETEXT: &str = "crates/adapters-sqlite/src/timetext.rs";
const SQLITE_TOKENS: &str = "crates/adapters-sqlite/src/tokens.rs";
const SQLITE_WAKE: &str = "crates/adapters-sqlite/src/wake.rs";

/// Every `Duration` or numeric constant of the adapters' non-test code. Policy
/// (retries, leases, limits a service chooses) belongs to the domain and
/// `Config`; what an adapter may keep is listed here with why.
pub const ADAPTER_CONSTANTS: &[AdapterConstant] = &[
    constant(
        PG_CODEC,
        "MAX_OWNER_MS",
        Basis::Fact,
        "latest owner time SQLite's stored form holds, kept alike",
    ),
    constant(
        PG_LOCKS,
        "SWEEP_LOCK_KEY",
        Basis::Fact,
        "advisory lock key of sweep leadership",
    ),
    constant(
        PG_LOCKS,
        "CLAIM_LINE_SPACE",
        Basis::Fact,
        "first key of the read-and-claim advisory locks",
    ),
    constant(
        PG_LOCKS,
        "SMALL_WINDOW",
        Basis::Tuned("docs/measurements.md"),
        "windows claimed with scalar candidates, one plan per connection",
    ),
    constant(
        PG_BACKEND,
        "CLAIM_LINE_STRIPES",
        Basis::Tuned("crates/adapters-postgres/src/backend.rs"),
        "in-process turns of read-and-claims (mutex stripes)",
    ),
    constant(
        PG_TOKENS,
        "BALANCE_SPACE",
        Basis::Fact,
        "first key of the balance advisory locks, shared with migration 0004",
    ),
    constant(
        PG_OPTIONS,
        "MAX_SERVER_TIMEOUT",
        Basis::Fact,
        "longest timeout PostgreSQL accepts (INT_MAX ms)",
    ),
    constant(
        PG_QUEUES,
        "MAX_AGE",
        Basis::Bound,
        "retention age clamped before it is bound into SQL",
    ),
    constant(
        PG_ROUTE,
        "HOST_TIMEOUT",
        Basis::Tuned("docs/postgres-failover.md"),
        "one host's turn in the walk",
    ),
    constant(
        PG_ROUTE,
        "FIRST_PAUSE",
        Basis::Tuned("docs/postgres-failover.md"),
        "the follower's first pause",
    ),
    constant(
        PG_ROUTE,
        "MAX_PAUSE",
        Basis::Tuned("docs/postgres-failover.md"),
        "the follower's longest pause",
    ),
    constant(
        PG_SESSION,
        "PING_IDLE_AFTER",
        Basis::Tuned("docs/postgres-sessions.md"),
        "idle time after which a pooled connection is pinged",
    ),
    constant(
        PG_SESSION,
        "RETURN_GRACE",
        Basis::Tuned("crates/adapters-postgres/src/session.rs"),
        "a broken connection's return still counts as before the breakage",
    ),
    constant(
        PG_SESSION,
        "ACQUIRE_SLICE",
        Basis::Tuned("docs/postgres-sessions.md"),
        "one request to the pool",
    ),
    constant(
        PG_SESSION,
        "PING_TIMEOUT",
        Basis::Tuned("docs/postgres-sessions.md"),
        "the ping of a suspect connection",
    ),
    constant(
        PG_SESSION,
        "KEEPALIVE_INTERVAL",
        Basis::Tuned("docs/postgres-sessions.md"),
        "server-side TCP keepalive interval",
    ),
    constant(
        PG_SESSION,
        "KEEPALIVE_COUNT",
        Basis::Tuned("docs/postgres-sessions.md"),
        "server-side TCP keepalive probes",
    ),
    constant(
        PG_WAKE,
        "COALESCE",
        Basis::Tuned("docs/wakeups.md"),
        "the notifier's batching of keys",
    ),
    constant(
        PG_WAKE,
        "MAX_PAYLOAD",
        Basis::Bound,
        "notification payload, below PostgreSQL's 8000 bytes",
    ),
    constant(
        PG_WAKE,
        "FIRST_PAUSE",
        Basis::Tuned("docs/wakeups.md"),
        "the listener's first reconnect pause",
    ),
    constant(
        PG_WAKE,
        "MAX_PAUSE",
        Basis::Tuned("docs/wakeups.md"),
        "the listener's longest reconnect pause",
    ),
    constant(
        PG_INTEREST,
        "OPEN",
        Basis::Tuned("docs/wakeups.md"),
        "every key sent after a new listener's question",
    ),
    constant(
        PG_INTEREST,
        "CATCH_UP",
        Basis::Tuned("docs/wakeups.md"),
        "margin for an announcement's way",
    ),
    constant(
        PG_INTEREST,
        "MAX_AGE",
        Basis::Tuned("docs/wakeups.md"),
        "how far back a catch-up reaches",
    ),
    constant(
        PG_INTEREST,
        "LEGACY",
        Basis::Tuned("docs/wakeups.md"),
        "every key sent after hearing an earlier version",
    ),
    constant(
        PG_INTEREST,
        "ECHO",
        Basis::Tuned("docs/wakeups.md"),
        "an instance's own payload not heard back: every key sent",
    ),
    constant(
        PG_INTEREST,
        "HEARTBEAT",
        Basis::Tuned("docs/wakeups.md"),
        "a line sent to hear oneself while holding keys back",
    ),
    constant(
        PG_INTEREST,
        "SLACK",
        Basis::Tuned("docs/wakeups.md"),
        "an announcement's time past its wait's deadline",
    ),
    constant(
        PG_INTEREST,
        "PRUNE_AT",
        Basis::Bound,
        "entries a map of announcements or held-back keys holds before expired ones go",
    ),
    constant(
        SQLITE_CODEC,
        "MAX",
        Basis::Bound,
        "characters of a stored value a message shows",
    ),
    constant(
        SQLITE_LOCKOUT,
        "MAX_PROBE",
        Basis::Tuned("docs/sqlite.md"),
        "the longest probe for the write lock during a lockout",
    ),
    constant(
        SQLITE_OPTIONS,
        "MAX_BUSY_TIMEOUT",
        Basis::Bound,
        "longest accepted busy timeout",
    ),
    constant(
        SQLITE_OPTIONS,
        "MAX_READERS",
        Basis::Bound,
        "most reader connections accepted",
    ),
    constant(
        SQLITE_BACKEND,
        "STATEMENT_CACHE",
        Basis::Tuned("docs/measurements.md"),
        "prepared statements kept per connection, more than the adapter uses",
    ),
    constant(
        SQLITE_POOL,
        "MAX_BEGIN_PAUSE",
        Basis::Tuned("docs/sqlite.md"),
        "longest pause between tries of BEGIN IMMEDIATE",
    ),
    constant(
        SQLITE_POOL,
        "FAIR_TURN_AFTER",
        Basis::Tuned("crates/adapters-sqlite/src/pool.rs"),
        "group-commit leader's run before it yields the lock",
    ),
    constant(
        SQLITE_POOL,
        "FAIR_PAUSE",
        Basis::Tuned("crates/adapters-sqlite/src/pool.rs"),
        "the yield that gives other instances a turn (measured in its doc)",
    ),
    constant(
        SQLITE_SCHEMA,
        "SCHEMA_VERSION",
        Basis::Fact,
        "the schema version this code creates",
    ),
    constant(
        SQLITE_TIMETEXT,
        "MILLIS_PER_DAY",
        Basis::Fact,
        "calendar arithmetic",
    ),
    constant(
        SQLITE_TOKENS,
        "SMALL",
        Basis::Fact,
        "amounts whose sums cannot overflow (2^63)",
    ),
    constant(
        SQLITE_TOKENS,
        "ROOM_ABOVE_SMALL",
        Basis::Fact,
        "headroom above a sum of small amounts (2^127)",
    ),
    constant(
        SQLITE_WAKE,
        "POLL_INTERVAL",
        Basis::Tuned("docs/wakeups.md"),
        "how often a waiting instance reads data_version",
    ),
];

/// Types of a constant this check looks at: durations and plain numbers.
fn is_tunable_type(ty: &str) -> bool {
    const NUMERIC: &[&str] = &[
        "i8", "i16", "i32", "i64", "i128", "isize", "u8", "u16", "u32", "u64", "u128", "usize",
        "f32", "f64",
    ];
    let ty = ty.trim();
    NUMERIC.contains(&ty)
        || ty
            .rsplit("::")
            .next()
            .is_some_and(|last| last == "Duration" || last.starts_with("NonZero"))
}

/// `(name, type)` of a `const` or `static` item declared on `line`.
fn constant_item(line: &str) -> Option<(&str, &str)> {
    let mut rest = line.trim_start();
    if let Some(after) = rest.strip_prefix("pub") {
        rest = after.trim_start();
        if rest.starts_with('(') {
            rest = rest[rest.find(')')? + 1..].trim_start();
        }
    }
    let rest = rest
        .strip_prefix("const ")
        .or_else(|| rest.strip_prefix("static "))?
        .trim_start();
    let name_end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    let (name, rest) = rest.split_at(name_end);
    let ty = rest.trim_start().strip_prefix(':')?;
    let ty = &ty[..ty.find('=')?];
    (!name.is_empty()).then_some((name, ty.trim()))
}

/// Every `Duration` or numeric constant in the adapters' non-test code is
/// declared in `declared` (so "adapters decide no policy" is checked: a new
/// tuned value must be argued), every declaration still names one, and a
/// [`Basis::Tuned`] one names a file that exists (`exists`).
pub fn check_adapter_constants(
    files: &[(PathBuf, String)],
    declared: &[AdapterConstant],
    exists: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut violations = Vec::new();
    let mut found = BTreeSet::new();
    for (path, text) in files {
        if !path.starts_with("crates")
            || !path
                .components()
                .nth(1)
                .is_some_and(|c| c.as_os_str().to_string_lossy().starts_with("adapters-"))
            || !path.components().any(|c| c.as_os_str() == "src")
        {
            continue;
        }
        let tests = test_lines(path, text);
        let file = path.to_string_lossy().replace('\\', "/");
        for (n, line) in text.lines().enumerate() {
            let Some((name, ty)) = constant_item(line).filter(|_| !tests[n]) else {
                continue;
            };
            if !is_tunable_type(ty) {
                continue;
            }
            found.insert((file.clone(), name.to_owned()));
            if !declared.iter().any(|c| c.file == file && c.name == name) {
                violations.push(format!(
                    "{file}:{}: `{name}: {ty}` is a tuned value in an adapter, which decides no \
                     policy: move a rule to the domain or Config, or declare it in tidy's \
                     ADAPTER_CONSTANTS as a fact, a bound or a tuning documented somewhere",
                    n + 1
                ));
            }
        }
    }
    for c in declared {
        if !found.contains(&(c.file.to_owned(), c.name.to_owned())) {
            violations.push(format!(
                "ADAPTER_CONSTANTS declares {} ({}) in {}, which has no such constant: remove it",
                c.name, c.what, c.file
            ));
        }
        if let Basis::Tuned(doc) = c.basis
            && !exists(doc)
        {
            violations.push(format!(
                "ADAPTER_CONSTANTS says {} is documented in {doc}, which does not exist",
                c.name
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

/// The Rust sources of the workspace's `crates`, `xtask` and `fuzz`, with
/// root-relative paths.
fn workspace_sources(root: &Path) -> Result<Vec<(PathBuf, String)>, Error> {
    let mut sources = Vec::new();
    for dir in ["crates", "xtask", "fuzz"] {
        rust_sources(&root.join(dir), &mut sources)?;
    }
    Ok(sources
        .into_iter()
        .map(|(path, text)| {
            let relative = path.strip_prefix(root).map(Path::to_path_buf);
            (relative.unwrap_or(path), text)
        })
        .collect())
}

fn read(root: &Path, file: &str) -> Result<String, Error> {
    let path = root.join(file);
    std::fs::read_to_string(&path).map_err(|source| Error::Io {
        action: "reading",
        path,
        source,
    })
}

/// The checks that read only the source tree (no cargo), by name.
fn source_checks(root: &Path) -> Result<Vec<(&'static str, Vec<String>)>, Error> {
    let sources = workspace_sources(root)?;
    let maps = [
        (SQLITE_SRC, file_map(&sources, SQLITE_SRC)),
        (POSTGRES_SRC, file_map(&sources, POSTGRES_SRC)),
    ];
    Ok(vec![
        (
            "domain bans the clock, env and OS randomness",
            check_domain_bans(&read(root, DOMAIN_CLIPPY)?),
        ),
        ("module docs, no skipped tests", check_sources(&sources)),
        (
            "the command's sources name no driver or adapter",
            check_cli_sources(&sources),
        ),
        (
            "no test sleeps without a reason",
            check_test_sleeps(&sources),
        ),
        (
            "adapters keep one file map",
            check_adapter_file_maps(&maps, BACKEND_SPECIFIC_FILES),
        ),
        (
            "adapter constants declared",
            check_adapter_constants(&sources, ADAPTER_CONSTANTS, |file| {
                root.join(file).is_file()
            }),
        ),
    ])
}

/// Runs every check on the real workspace; all violations are reported together.
pub fn run() -> Result<(), Error> {
    let root = workspace_root();
    let meta = Metadata::load(&root)?;
    let lockfile = read(&root, "Cargo.lock")?;
    let mut checks: Vec<(&str, Vec<String>)> = vec![
        ("domain is pure", check_domain_is_pure(&meta)),
        ("ports dependencies", check_ports_dependencies(&meta)),
        ("adapters independent", check_adapters_independent(&meta)),
        (
            "the command depends on no driver or adapter",
            check_cli_names_no_driver(&meta),
        ),
        ("one libsqlite3-sys", check_single_sqlite(&lockfile)),
        ("library with one backend", check_library_features(&root)?),
    ];
    checks.extend(source_checks(&root)?);
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
        assert_eq!(check_cli_names_no_driver(&meta), Vec::<String>::new());
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
    fn a_cli_depending_on_a_driver_or_an_adapter_is_reported() {
        for forbidden in [
            "sqlx",
            "sqlx-postgres",
            "rusqlite",
            "libsqlite3-sys",
            SQLITE_ADAPTER,
            POSTGRES_ADAPTER,
        ] {
            let meta = synthetic(
                &[
                    (CLI, "holdfast", None, false),
                    (CLI, forbidden, None, false),
                ],
                &[],
            );
            assert_eq!(
                check_cli_names_no_driver(&meta),
                vec![format!(
                    "{CLI} depends on {forbidden}; the command reaches databases through holdfast and holdfast-simulator only"
                )]
            );
        }
        // Its tests may read the databases the command wrote.
        let dev = synthetic(&[(CLI, "rusqlite", Some("dev"), false)], &[]);
        assert_eq!(check_cli_names_no_driver(&dev), Vec::<String>::new());
        let missing = synthetic(&[], &[]);
        assert_eq!(check_cli_names_no_driver(&missing).len(), 1);
    }

    #[test]
    fn cli_sources_naming_a_driver_or_an_adapter_are_reported() {
        let file = |path: &str, text: &str| (PathBuf::from(path), text.to_owned());
        let found = check_cli_sources(&[
            file("crates/cli/src/ok.rs", "//! Fine.\nuse holdfast::Config;\n"),
            file(
                "crates/cli/src/output.rs",
                "//! Out.\nfn f() { holdfast_adapters_sqlite::timetext::format(t) }\n",
            ),
            file("crates/cli/src/queue/a.rs", "//! A.\nuse sqlx::PgPool;\n"),
            file(
                "crates/cli/src/b.rs",
                "//! B.\nlet c = rusqlite::Connection::open(p);\n",
            ),
            // The tests and other crates may.
            file("crates/cli/tests/c.rs", "use rusqlite::Connection;\n"),
            file(
                "crates/simulator/src/rawlimit.rs",
                "//! R.\nuse sqlx::PgPool;\n",
            ),
        ]);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].starts_with("crates/cli/src/output.rs:2: names `holdfast_adapters_`"));
        assert!(found[1].starts_with("crates/cli/src/queue/a.rs:2: names `sqlx::`"));
        assert!(found[2].starts_with("crates/cli/src/b.rs:2: names `rusqlite::`"));
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
    fn workspace_sources_satisfy_every_source_check() {
        let root = workspace_root();
        let checks = source_checks(&root).unwrap_or_else(|err| panic!("reading sources: {err}"));
        let failed: Vec<String> = checks
            .into_iter()
            .flat_map(|(name, found)| found.into_iter().map(move |v| format!("{name}: {v}")))
            .collect();
        assert!(failed.is_empty(), "tidy:\n{}", failed.join("\n"));
    }

    #[test]
    fn a_domain_ban_left_out_is_reported() {
        let complete = std::fs::read_to_string(workspace_root().join(DOMAIN_CLIPPY))
            .unwrap_or_else(|err| panic!("reading {DOMAIN_CLIPPY}: {err}"));
        assert_eq!(check_domain_bans(&complete), Vec::<String>::new());
        // Each required path, removed alone, is missed.
        for path in DOMAIN_BANNED_METHODS.iter().chain(DOMAIN_BANNED_TYPES) {
            let quoted = format!("\"{path}\"");
            assert!(complete.contains(&quoted), "{path} not in the real file");
            let without = complete.replace(&quoted, "\"std::process::exit\"");
            let found = check_domain_bans(&without);
            assert_eq!(found.len(), 1, "{path}: {found:?}");
            assert!(found[0].contains(&format!("`{path}`")), "{found:?}");
        }
    }

    #[test]
    fn a_domain_ban_in_the_wrong_table_or_commented_out_is_reported() {
        let toml = "disallowed-methods = [\n\
                    \x20   \"std::time::Instant::now\",\n\
                    \x20   { path = \"rand::rngs::OsRng\", reason = \"a, type\" },\n\
                    #   { path = \"std::time::Instant::elapsed\" },\n\
                    ]\n\
                    disallowed-types = [ { path = \"rand::rngs::ThreadRng\" } ]\n";
        assert_eq!(
            banned_paths(toml, "disallowed-methods"),
            BTreeSet::from([
                "std::time::Instant::now".to_owned(),
                "rand::rngs::OsRng".to_owned()
            ])
        );
        assert_eq!(
            banned_paths(toml, "disallowed-types"),
            BTreeSet::from(["rand::rngs::ThreadRng".to_owned()])
        );
        let found = check_domain_bans(toml);
        assert!(
            found
                .iter()
                .any(|v| v.contains("`std::time::Instant::elapsed` is not in disallowed-methods")),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|v| v.contains("`rand::rngs::OsRng` is not in disallowed-types")),
            "{found:?}"
        );
        assert!(
            !found
                .iter()
                .any(|v| v.contains("`std::time::Instant::now`")),
            "{found:?}"
        );
    }

    fn files(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn an_adapter_file_without_a_counterpart_is_reported() {
        let declared: &[(&str, &str, &str)] = &[(POSTGRES_SRC, "hosts.rs", "several hosts")];
        let maps = [
            (SQLITE_SRC, files(&["lib.rs", "tokens.rs", "cache.rs"])),
            (
                POSTGRES_SRC,
                files(&["lib.rs", "tokens.rs", "hosts.rs", "locks/claim.rs"]),
            ),
        ];
        assert_eq!(
            check_adapter_file_maps(&maps, declared),
            vec![
                format!(
                    "{SQLITE_SRC}/cache.rs has no counterpart in {POSTGRES_SRC}: give the same role \
                     the same file in both adapters, or declare it in tidy's BACKEND_SPECIFIC_FILES with why"
                ),
                format!(
                    "{POSTGRES_SRC}/locks/claim.rs has no counterpart in {SQLITE_SRC}: give the same role \
                     the same file in both adapters, or declare it in tidy's BACKEND_SPECIFIC_FILES with why"
                ),
            ]
        );
    }

    #[test]
    fn a_stale_or_needless_backend_specific_declaration_is_reported() {
        let declared: &[(&str, &str, &str)] = &[
            (SQLITE_SRC, "pool.rs", "gone"),
            (POSTGRES_SRC, "tokens.rs", "both have it"),
        ];
        let maps = [
            (SQLITE_SRC, files(&["lib.rs", "tokens.rs"])),
            (POSTGRES_SRC, files(&["lib.rs", "tokens.rs"])),
        ];
        let found = check_adapter_file_maps(&maps, declared);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].contains("tokens.rs is declared specific"),
            "{found:?}"
        );
        assert!(
            found[1].contains("declares crates/adapters-sqlite/src/pool.rs, which does not exist"),
            "{found:?}"
        );
    }

    fn source(path: &str, text: &str) -> (PathBuf, String) {
        (PathBuf::from(path), text.to_owned())
    }

    /// A source whose `SLEEP` become `sleep`, so this file holds no sleep call
    /// of its own for the real-tree check to find.
    fn sleepy(path: &str, text: &str) -> (PathBuf, String) {
        (PathBuf::from(path), text.replace("SLEEP", "sleep"))
    }

    #[test]
    fn a_test_sleep_without_a_reason_is_reported() {
        let found = check_test_sleeps(&[
            sleepy(
                "crates/x/tests/a.rs",
                "fn a() {\n\
                 \x20   // Give the task the time to get there.\n\
                 \x20   tokio::time::SLEEP(Duration::from_millis(100)).await;\n\
                 \x20   std::thread::SLEEP(SHORT); // sleep:\n\
                 \x20   SLEEP_until(deadline).await;\n\
                 }\n",
            ),
            sleepy(
                "crates/x/src/b.rs",
                "//! B.\nfn b() { std::thread::SLEEP(PAUSE) }\n\n\
                 #[cfg(test)]\nmod tests {\n    fn t() {\n        thread::SLEEP(PAUSE);\n    }\n}\n",
            ),
        ]);
        let lines: Vec<&str> = found
            .iter()
            .map(|v| v.split(": ").next().unwrap_or(""))
            .collect();
        // An empty reason is no reason; the library's own sleep is not a test's.
        assert_eq!(
            lines,
            vec![
                "crates/x/tests/a.rs:3",
                "crates/x/tests/a.rs:4",
                "crates/x/tests/a.rs:5",
                "crates/x/src/b.rs:7"
            ],
            "{found:?}"
        );
    }

    #[test]
    fn a_test_sleep_with_a_stated_reason_passes() {
        let found = check_test_sleeps(&[sleepy(
            "crates/x/tests/a.rs",
            "fn a() {\n\
             \x20   // sleep: the lease must run out; real processes share no paused clock.\n\
             \x20   std::thread::SLEEP(LEASE);\n\
             \x20   // sleep: poll interval while waiting for the listener,\n\
             \x20   // bounded by the deadline above.\n\
             \x20   tokio::time::SLEEP(POLL).await;\n\
             \x20   tokio::time::SLEEP(PACE).await; // sleep: the workload's pace\n\
             \x20   let _ = nap_SLEEP(1); // not a sleep call\n\
             }\n",
        )]);
        assert_eq!(found, Vec::<String>::new());
    }

    #[test]
    fn a_sleep_on_the_paused_clock_needs_no_reason() {
        let found = check_test_sleeps(&[sleepy(
            "crates/x/tests/a.rs",
            "#[tokio::test(start_paused = true)]\n\
             async fn paused() {\n\
             \x20   tokio::time::SLEEP(TICK).await;\n\
             }\n\
             \n\
             #[tokio::test]\n\
             async fn real() {\n\
             \x20   tokio::time::SLEEP(TICK).await;\n\
             \x20   tokio::time::pause();\n\
             \x20   tokio::time::SLEEP(TICK).await;\n\
             }\n\
             \n\
             async fn helper() {\n\
             \x20   tokio::time::SLEEP(TICK).await;\n\
             }\n",
        )]);
        let lines: Vec<&str> = found
            .iter()
            .map(|v| v.split(": ").next().unwrap_or(""))
            .collect();
        assert_eq!(
            lines,
            vec!["crates/x/tests/a.rs:8", "crates/x/tests/a.rs:14"],
            "{found:?}"
        );
    }

    #[test]
    fn test_code_is_whole_test_files_and_inline_test_modules() {
        let text = "//! M.\nfn a() {}\n#[cfg(test)]\nfn helper() {}\n#[cfg(test)]\n#[allow(x)]\nmod tests {\n    fn t() {}\n}\nfn after() {}\n";
        assert_eq!(
            test_lines(Path::new("crates/x/src/m.rs"), text),
            vec![
                false, false, false, false, true, true, true, true, true, false
            ]
        );
        assert!(
            test_lines(Path::new("crates/x/tests/support/mod.rs"), "a\nb")
                .iter()
                .all(|t| *t)
        );
        assert!(
            test_lines(Path::new("crates/ports/src/conformance/wake.rs"), "a")
                .iter()
                .all(|t| *t)
        );
    }

    #[test]
    fn an_undeclared_tuned_constant_in_an_adapter_is_reported() {
        let declared = [
            constant(
                "crates/adapters-x/src/wake.rs",
                "POLL",
                Basis::Tuned("docs/wakeups.md"),
                "poll",
            ),
            constant("crates/adapters-x/src/gone.rs", "OLD", Basis::Fact, "gone"),
            constant(
                "crates/adapters-x/src/wake.rs",
                "LIMIT",
                Basis::Tuned("docs/nowhere.md"),
                "limit",
            ),
        ];
        let text = "//! W.\n\
                    pub const POLL: Duration = Duration::from_millis(2);\n\
                    pub(crate) const RETRIES: u32 = 5;\n\
                    const LIMIT: usize = 7;\n\
                    const CHANNEL: &str = \"x\";\n\
                    static BACKOFF: std::time::Duration = Duration::ZERO;\n\
                    const fn helper() -> u32 { 1 }\n\
                    #[cfg(test)]\nmod tests {\n    const TIMEOUT: Duration = Duration::from_secs(5);\n}\n";
        let found = check_adapter_constants(
            &[
                source("crates/adapters-x/src/wake.rs", text),
                source("crates/app/src/config.rs", "const DEFAULT_MS: u64 = 5;\n"),
            ],
            &declared,
            |file| file == "docs/wakeups.md",
        );
        assert_eq!(found.len(), 4, "{found:?}");
        assert!(
            found[0].starts_with("crates/adapters-x/src/wake.rs:3: `RETRIES: u32`"),
            "{found:?}"
        );
        assert!(
            found[1].starts_with("crates/adapters-x/src/wake.rs:6: `BACKOFF: std::time::Duration`"),
            "{found:?}"
        );
        assert!(
            found[2].contains("declares OLD (gone) in crates/adapters-x/src/gone.rs"),
            "{found:?}"
        );
        assert!(
            found[3].contains("LIMIT is documented in docs/nowhere.md, which does not exist"),
            "{found:?}"
        );
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
