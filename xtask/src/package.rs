//! The `package` step of `cargo xtask ci`: `cargo package` for every publishable
//! crate, offline, uploading nothing. It proves that each manifest has what
//! crates.io needs, that every dependency on a workspace crate has a version, and
//! that each packaged crate (its SQL migrations included) builds on its own,
//! outside the workspace.
//!
//! The publishable crates are the workspace members without `publish = false`,
//! read from `cargo metadata`, so a new crate is packaged (or skipped) without an
//! edit here. `cargo package --workspace` would not do: unlike `cargo publish`, it
//! packages `publish = false` members too, and the fuzz crate's path dependency
//! has no version. All of them go to one `cargo package` run, which resolves their
//! dependencies on each other through a temporary local registry. `--offline`:
//! the earlier build steps have filled the registry cache. `--allow-dirty`: a
//! working tree with uncommitted edits is packaged as it is (CI's clone is clean).

use serde_json::Value;

use crate::{Error, process, tidy};

/// Packages (and so builds) every publishable crate of the workspace.
pub fn run() -> Result<(), Error> {
    let root = tidy::workspace_root();
    let out = process::output(
        process::cargo()
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .arg("--manifest-path")
            .arg(root.join("Cargo.toml")),
    )?;
    let names = publishable(&String::from_utf8_lossy(&out.stdout))?;
    if names.is_empty() {
        return Err(bad_metadata("no publishable package".to_owned()));
    }
    forget_unpacked(&names);
    // Verification builds our crates as registry crates, and cargo takes a
    // registry crate it has built once at a version as unchanged forever: in the
    // workspace's target directory a warm run would link each crate against its
    // dependencies as they were at the first run. A target directory of its own,
    // emptied first, builds them from this checkout.
    let target = root.join("target").join("package-verify");
    if target.exists() {
        std::fs::remove_dir_all(&target).map_err(|source| Error::Io {
            action: "remove",
            path: target.clone(),
            source,
        })?;
    }
    let mut cmd = process::cargo();
    cmd.current_dir(&root)
        .env("CARGO_TARGET_DIR", &target)
        .args(["package", "--offline", "--allow-dirty"])
        // Verification builds each crate as a workspace of its own, outside our
        // `[profile]`; without debug info it builds in less time and space.
        .env("CARGO_PROFILE_DEV_DEBUG", "false");
    for name in &names {
        cmd.args(["-p", name]);
    }
    process::run(&mut cmd)
}

/// The names of the workspace members that may be published, sorted, from the
/// JSON of `cargo metadata --no-deps`: `publish` is `null` (anywhere) or a list
/// of registries; `publish = false` is the empty list.
pub fn publishable(json: &str) -> Result<Vec<String>, Error> {
    let root: Value =
        serde_json::from_str(json).map_err(|e| bad_metadata(format!("not JSON: {e}")))?;
    let members = root
        .get("workspace_members")
        .and_then(Value::as_array)
        .ok_or_else(|| bad_metadata("no \"workspace_members\" array".to_owned()))?;
    let packages = root
        .get("packages")
        .and_then(Value::as_array)
        .ok_or_else(|| bad_metadata("no \"packages\" array".to_owned()))?;
    let mut names = Vec::new();
    for pkg in packages {
        let name = pkg
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad_metadata("a package without a \"name\"".to_owned()))?;
        let is_member = pkg.get("id").is_some_and(|id| members.contains(id));
        let may_publish = match pkg.get("publish") {
            None | Some(Value::Null) => true,
            Some(Value::Array(registries)) => !registries.is_empty(),
            Some(other) => {
                return Err(bad_metadata(format!(
                    "package {name}: publish is {other}; expected null or a list"
                )));
            }
        };
        if is_member && may_publish {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Removes the copies of our own crates that earlier `cargo package` runs
/// unpacked from their temporary registry into `$CARGO_HOME/registry/src/-<hash>/`
/// (a registry without a name). Cargo unpacks a crate there once per version and
/// reuses the copy afterwards, so a second run at the same version would verify
/// each crate against its dependencies' sources of the first run. Nothing else
/// lives in those directories; cargo unpacks again what is missing.
fn forget_unpacked(names: &[String]) {
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo")));
    let Some(src) = home.map(|h| h.join("registry").join("src")) else {
        return;
    };
    let Ok(registries) = std::fs::read_dir(&src) else {
        return;
    };
    for registry in registries.flatten() {
        if !registry.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        let Ok(crates) = std::fs::read_dir(registry.path()) else {
            continue;
        };
        for unpacked in crates.flatten() {
            if is_unpacked_copy_of(&unpacked.file_name().to_string_lossy(), names) {
                // A copy that cannot be removed makes `cargo package` fail
                // loudly on a stale source, which is where the problem shows.
                let _ = std::fs::remove_dir_all(unpacked.path());
            }
        }
    }
}

/// Whether `dir` is `<name>-<version>` for one of `names`.
fn is_unpacked_copy_of(dir: &str, names: &[String]) -> bool {
    names.iter().any(|name| {
        dir.strip_prefix(name.as_str())
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|version| version.starts_with(|c: char| c.is_ascii_digit()))
    })
}

fn bad_metadata(detail: String) -> Error {
    Error::Metadata {
        what: "cargo metadata",
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn publish_false_and_non_members_are_left_out() {
        let metadata = json!({
            "workspace_members": ["a 1", "b 1", "c 1", "d 1"],
            "packages": [
                { "id": "a 1", "name": "a", "publish": null },
                { "id": "b 1", "name": "b", "publish": [] },
                { "id": "c 1", "name": "c", "publish": ["crates-io"] },
                { "id": "d 1", "name": "d" },
                { "id": "e 1", "name": "e", "publish": null },
            ],
        });
        assert_eq!(publishable(&metadata.to_string()).unwrap(), ["a", "c", "d"]);
    }

    #[test]
    fn only_unpacked_copies_of_the_named_crates_are_forgotten() {
        let names = ["holdfast".to_owned(), "holdfast-domain".to_owned()];
        assert!(is_unpacked_copy_of("holdfast-0.1.0", &names));
        assert!(is_unpacked_copy_of("holdfast-domain-0.2.0-rc.1", &names));
        assert!(!is_unpacked_copy_of("holdfast-ports-0.1.0", &names));
        assert!(!is_unpacked_copy_of("holdfast", &names));
        assert!(!is_unpacked_copy_of("tokio-1.0.0", &names));
    }

    #[test]
    fn malformed_metadata_is_a_typed_error() {
        for bad in [
            "not json".to_owned(),
            json!({ "packages": [] }).to_string(),
            json!({ "workspace_members": [], "packages": [{ "id": "a 1" }] }).to_string(),
            json!({ "workspace_members": ["a 1"],
                    "packages": [{ "id": "a 1", "name": "a", "publish": false }] })
            .to_string(),
        ] {
            assert!(
                matches!(publishable(&bad), Err(Error::Metadata { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_library_crates_are_publishable_and_the_tooling_is_not() {
        let out = process::output(
            process::cargo()
                .args(["metadata", "--format-version", "1", "--no-deps"])
                .arg("--manifest-path")
                .arg(tidy::workspace_root().join("Cargo.toml")),
        )
        .unwrap();
        let names = publishable(&String::from_utf8_lossy(&out.stdout)).unwrap();
        for name in [
            "holdfast",
            "holdfast-adapters-postgres",
            "holdfast-adapters-sqlite",
            "holdfast-domain",
            "holdfast-ports",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} missing: {names:?}");
        }
        // The command and its simulator are tools shipped from the repository.
        for name in [
            "xtask",
            "holdfast-fuzz",
            "holdfast-cli",
            "holdfast-simulator",
        ] {
            assert!(!names.iter().any(|n| n == name), "{name} listed: {names:?}");
        }
    }
}
