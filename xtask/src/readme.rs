//! The README's promise to a new user, checked: a crate outside the workspace
//! that depends on exactly the README's dependency block and holds the README's
//! Rust examples verbatim builds. The service guide (`docs/service.md`) is
//! checked the same way against its own dependency block.
//!
//! Each page's crate is written to `target/readme-check/<page>` with the block
//! copied as it stands and `holdfast` patched to this checkout (the block names
//! the crates.io version). The workspace's `Cargo.lock` is copied beside it, so
//! the check builds the dependency versions the tests ran with. Each example
//! becomes one binary, treated as rustdoc treats a doc test: `# ` lines are
//! unhidden, and code without `fn main` is wrapped in one.

use std::path::{Path, PathBuf};

use crate::Error;
use crate::process;

/// The pages whose examples a new user copies, and the crate each becomes.
const PAGES: &[(&str, &str)] = &[
    ("README.md", "readme"),
    ("docs/service.md", "service-guide"),
];

/// Type-checks each page's examples against its dependency block (a check
/// compiles everything a build does but the machine code).
pub fn run() -> Result<(), Error> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf();
    for (page, name) in PAGES {
        check_page(&root, page, name)?;
    }
    Ok(())
}

fn check_page(root: &Path, page: &str, name: &str) -> Result<(), Error> {
    let path = root.join(page);
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
        action: "reading",
        path: path.clone(),
        source,
    })?;
    let (dependencies, examples) = parse(&text).map_err(|detail| Error::BadOutput {
        command: page.to_owned(),
        detail,
    })?;
    let dir = root.join("target").join("readme-check").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let app = root.join("crates").join("app");
    let manifest = format!(
        "# Written by `cargo xtask ci` (xtask/src/readme.rs) from {page}.\n\
         [package]\nname = \"{name}-check\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
         [workspace]\n\n{dependencies}\n[patch.crates-io]\nholdfast = {{ path = {:?} }}\n",
        app.display().to_string()
    );
    write(&dir.join("Cargo.toml"), &manifest)?;
    let lock = root.join("Cargo.lock");
    std::fs::copy(&lock, dir.join("Cargo.lock")).map_err(|source| Error::Io {
        action: "copying",
        path: lock,
        source,
    })?;
    for (n, example) in examples.iter().enumerate() {
        let file = dir
            .join("src")
            .join("bin")
            .join(format!("example_{}.rs", n + 1));
        write(&file, &as_program(example))?;
    }
    eprintln!(
        "readme: {} examples of {page} against its dependency block in {}",
        examples.len(),
        dir.display()
    );
    // The workspace's target directory: the dependencies the tests built are
    // reused where their features agree.
    process::run(
        process::cargo()
            .current_dir(&dir)
            .args(["check", "--bins", "--quiet"])
            .env("CARGO_TARGET_DIR", root.join("target")),
    )
}

/// The README's dependency block (the `toml` block that starts with
/// `[dependencies]`) and its Rust examples (```rust blocks that are not
/// `ignore`), each verbatim.
fn parse(readme: &str) -> Result<(String, Vec<String>), String> {
    let mut dependencies = None;
    let mut examples = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let mut body = String::new();
        for line in lines.by_ref() {
            if line.trim_start().starts_with("```") {
                break;
            }
            body.push_str(line);
            body.push('\n');
        }
        let mut tags = info.split(',').map(str::trim);
        let language = tags.next();
        if language == Some("toml") && body.starts_with("[dependencies]") {
            if dependencies.replace(body).is_some() {
                return Err("two `[dependencies]` blocks; expected one".to_owned());
            }
        } else if language == Some("rust") && !tags.any(|t| t == "ignore") {
            examples.push(body);
        }
    }
    let dependencies =
        dependencies.ok_or("no ```toml block starting with [dependencies]; expected one")?;
    if examples.is_empty() {
        return Err("no ```rust example; expected at least one".to_owned());
    }
    Ok((dependencies, examples))
}

/// A doc-test example as the program rustdoc compiles.
fn as_program(example: &str) -> String {
    let code: String = example
        .lines()
        .map(|line| match line.trim_start().strip_prefix('#') {
            Some(rest) if rest.is_empty() || rest.starts_with(' ') => {
                rest.strip_prefix(' ').unwrap_or(rest)
            }
            _ => line,
        })
        .fold(String::new(), |mut code, line| {
            code.push_str(line);
            code.push('\n');
            code
        });
    // As rustdoc does: examples may leave names unused.
    if code.contains("fn main") {
        format!("#![allow(unused)]\n{code}")
    } else {
        format!("#![allow(unused)]\nfn main() {{\n{code}}}\n")
    }
}

fn write(path: &PathBuf, text: &str) -> Result<(), Error> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| Error::Io {
            action: "creating",
            path: parent.to_path_buf(),
            source,
        })?;
    }
    std::fs::write(path, text).map_err(|source| Error::Io {
        action: "writing",
        path: path.clone(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dependency_block_and_the_examples_are_taken_verbatim() {
        let readme = "intro\n```toml\n[dependencies]\nholdfast = \"0.1\"\n```\n\
                      ```rust,no_run\nuse holdfast::X;\n#[tokio::main]\nasync fn main() {}\n```\n\
                      ```rust,ignore\nnot built\n```\n```sh\ncargo run\n```\n";
        let (deps, examples) = parse(readme).expect("parses");
        assert_eq!(deps, "[dependencies]\nholdfast = \"0.1\"\n");
        assert_eq!(
            examples,
            vec!["use holdfast::X;\n#[tokio::main]\nasync fn main() {}\n"]
        );
    }

    #[test]
    fn a_readme_without_a_dependency_block_is_refused() {
        let err = parse("```rust\nfn main() {}\n```\n").expect_err("no block");
        assert!(err.contains("[dependencies]"), "{err}");
    }

    #[test]
    fn hidden_lines_are_unhidden_and_snippets_get_a_main() {
        let program = as_program("# async fn f() {\nlet x = 1;\n#[derive(Debug)]\n# }\n");
        assert_eq!(
            program,
            "#![allow(unused)]\nfn main() {\nasync fn f() {\nlet x = 1;\n#[derive(Debug)]\n}\n}\n"
        );
    }
}
