//! `cargo xtask rust-version`: the workspace's declared `rust-version` is a true minimum,
//! no lower than the `rust-version` of any package in the locked dependency graph.
//!
//! Reads `cargo metadata --locked` through the `cargo_metadata` crate: every workspace member
//! must declare a `rust-version`, and the lowest of them must be at least the highest that a
//! locked dependency declares (a dependency that declares none needs nothing). CI runs it, so
//! a `cargo update` that pulls in a crate needing a newer Rust fails until the workspace says
//! so.

use std::process::ExitCode;

use anyhow::{bail, Context};
use cargo_metadata::semver::Version;
use cargo_metadata::{Metadata, MetadataCommand};

/// A package and the Rust it declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    /// `name version`.
    pub package: String,
    /// Its `rust-version`.
    pub rust_version: Version,
}

/// What the check found: the workspace's minimum, and every locked dependency that needs more.
#[derive(Debug)]
pub struct Verdict {
    /// The lowest `rust-version` a workspace member declares.
    pub declared: Declared,
    /// The dependency with the highest `rust-version`.
    pub highest: Option<Declared>,
    /// Every dependency whose `rust-version` is above `declared`, highest first.
    pub too_new: Vec<Declared>,
    /// Workspace members without a `rust-version`.
    pub undeclared: Vec<String>,
}

/// Compares the members' declared `rust-version`s with the dependencies' in `meta`.
pub fn check(meta: &Metadata) -> anyhow::Result<Verdict> {
    let members: Vec<_> = meta.workspace_packages();
    let undeclared: Vec<String> = members
        .iter()
        .filter(|p| p.rust_version.is_none())
        .map(|p| p.name.to_string())
        .collect();
    let declared = members
        .iter()
        .filter_map(|p| {
            p.rust_version.as_ref().map(|v| Declared {
                package: format!("{} {}", p.name, p.version),
                rust_version: v.clone(),
            })
        })
        .min_by(|a, b| a.rust_version.cmp(&b.rust_version))
        .context("no workspace member declares a rust-version")?;
    let mut dependencies: Vec<Declared> = meta
        .packages
        .iter()
        .filter(|p| !meta.workspace_members.contains(&p.id))
        .filter_map(|p| {
            p.rust_version.as_ref().map(|v| Declared {
                package: format!("{} {}", p.name, p.version),
                rust_version: v.clone(),
            })
        })
        .collect();
    dependencies.sort_by(|a, b| b.rust_version.cmp(&a.rust_version));
    let too_new = dependencies
        .iter()
        .filter(|d| d.rust_version > declared.rust_version)
        .cloned()
        .collect();
    Ok(Verdict {
        declared,
        highest: dependencies.first().cloned(),
        too_new,
        undeclared,
    })
}

/// Runs the check on this workspace's `Cargo.lock`.
pub fn run() -> anyhow::Result<ExitCode> {
    let meta = MetadataCommand::new()
        .current_dir(crate::validate::workspace_root())
        .other_options(vec!["--locked".to_string()])
        .exec()
        .context("cargo metadata --locked failed (is Cargo.lock up to date?)")?;
    let verdict = check(&meta)?;
    if !verdict.undeclared.is_empty() {
        bail!(
            "these workspace packages declare no rust-version (add `rust-version.workspace = true`): {}",
            verdict.undeclared.join(", ")
        );
    }
    let declared = &verdict.declared;
    if !verdict.too_new.is_empty() {
        let list: Vec<String> = verdict
            .too_new
            .iter()
            .map(|d| format!("  {} needs Rust {}", d.package, d.rust_version))
            .collect();
        bail!(
            "{} declares rust-version {}, but the locked dependency graph needs more:\n{}\nraise `rust-version` in the workspace Cargo.toml (and README's set-up line) to at least {}",
            declared.package,
            declared.rust_version,
            list.join("\n"),
            verdict.too_new[0].rust_version
        );
    }
    match &verdict.highest {
        Some(h) => eprintln!(
            "rust-version: the workspace declares {} (lowest: {}); the highest a locked dependency needs is {} ({})",
            declared.rust_version, declared.package, h.rust_version, h.package
        ),
        None => eprintln!(
            "rust-version: the workspace declares {}; no locked dependency declares one",
            declared.rust_version
        ),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A metadata document of one member declaring `member` and one dependency declaring
    /// `dependency`, in `cargo metadata`'s format.
    fn metadata(member: &str, dependency: &str) -> Metadata {
        let package = |name: &str, id: &str, rust: &str| {
            serde_json::json!({
                "name": name, "version": "1.0.0", "id": id, "license": null,
                "license_file": null, "description": null, "source": null,
                "dependencies": [], "targets": [], "features": {},
                "manifest_path": format!("/{name}/Cargo.toml"), "metadata": null,
                "publish": null, "authors": [], "categories": [], "keywords": [],
                "readme": null, "repository": null, "homepage": null,
                "documentation": null, "edition": "2021", "links": null,
                "default_run": null, "rust_version": rust,
            })
        };
        serde_json::from_value(serde_json::json!({
            "packages": [package("app", "app 1.0.0", member), package("dep", "dep 1.0.0", dependency)],
            "workspace_members": ["app 1.0.0"],
            "workspace_default_members": ["app 1.0.0"],
            "resolve": null,
            "target_directory": "/target",
            "version": 1,
            "workspace_root": "/",
            "metadata": null,
        }))
        .expect("a valid metadata document")
    }

    #[test]
    fn a_dependency_needing_a_newer_rust_is_named() {
        let verdict = check(&metadata("1.85", "1.88")).unwrap();
        assert_eq!(verdict.declared.rust_version, Version::new(1, 85, 0));
        assert_eq!(verdict.too_new.len(), 1);
        assert_eq!(verdict.too_new[0].package, "dep 1.0.0");
        assert_eq!(verdict.too_new[0].rust_version, Version::new(1, 88, 0));
    }

    #[test]
    fn a_declared_version_at_or_above_every_dependency_passes() {
        for member in ["1.88", "1.90"] {
            let verdict = check(&metadata(member, "1.88")).unwrap();
            assert!(verdict.too_new.is_empty(), "{member}: {verdict:?}");
            assert_eq!(
                verdict.highest.unwrap().rust_version,
                Version::new(1, 88, 0)
            );
        }
    }

    /// The real workspace, through `cargo metadata --locked`: what CI checks.
    #[test]
    fn this_workspace_declares_a_true_rust_version() {
        let meta = MetadataCommand::new()
            .current_dir(crate::validate::workspace_root())
            .other_options(vec!["--locked".to_string()])
            .exec()
            .unwrap();
        let verdict = check(&meta).unwrap();
        assert!(verdict.undeclared.is_empty(), "{:?}", verdict.undeclared);
        assert!(verdict.too_new.is_empty(), "{:?}", verdict.too_new);
    }
}
