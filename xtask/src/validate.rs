//! `cargo xtask validate`: the checks CI runs, cheapest first.
//!
//! The same commands as `.ci/run`, so a green `validate` predicts a green CI. Each step runs
//! from the workspace root; the first failing step stops the run.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{bail, Context};

/// One check: a cargo invocation (its arguments, split at spaces) with extra environment.
struct Step {
    name: &'static str,
    args: &'static str,
    env: &'static [(&'static str, &'static str)],
}

/// The step `name`: `cargo ARGS` with no extra environment.
const fn cargo(name: &'static str, args: &'static str) -> Step {
    Step {
        name,
        args,
        env: &[],
    }
}

/// The checks, cheapest first.
const STEPS: &[Step] = &[
    cargo("fmt", "fmt --all -- --check"),
    cargo(
        "rust-version",
        "run --quiet --package xtask -- rust-version",
    ),
    cargo("clippy", "clippy --workspace --all-targets -- -D warnings"),
    cargo(
        "clippy (no cuda)",
        "clippy --package streamweave --no-default-features --all-targets -- -D warnings",
    ),
    Step {
        name: "doc",
        args: "doc --workspace --no-deps",
        env: &[("RUSTDOCFLAGS", "-Dwarnings")],
    },
    Step {
        name: "test",
        args: "test --workspace",
        // A snapshot that differs fails instead of writing a `.snap.new` for review.
        env: &[("INSTA_UPDATE", "no")],
    },
    cargo(
        "test (no cuda)",
        "test --package streamweave --no-default-features",
    ),
    // The CPU-only `weave` (its tests need the default features: their dev-dependencies
    // build the CUDA bindings); `.ci/run` also runs it.
    cargo(
        "clippy (cpu-only weave)",
        "clippy --package weave-cli --no-default-features -- -D warnings",
    ),
    cargo(
        "build (cpu-only weave)",
        "build --package weave-cli --no-default-features",
    ),
];

/// Runs every step; fails with the name of the first step that fails.
pub fn run() -> anyhow::Result<ExitCode> {
    let root = workspace_root();
    // `cargo run` sets CARGO to the cargo that built us; use the same toolchain.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let total = Instant::now();
    for step in STEPS {
        let shown: Vec<String> = step
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .chain(std::iter::once(format!("cargo {}", step.args)))
            .collect();
        eprintln!("==> {}: {}", step.name, shown.join(" "));
        let start = Instant::now();
        let status = Command::new(&cargo)
            .args(step.args.split(' '))
            .envs(step.env.iter().copied())
            .current_dir(&root)
            .status()
            .with_context(|| format!("cannot start `cargo {}`", step.args))?;
        let took = start.elapsed().as_secs_f64();
        if !status.success() {
            bail!(
                "validate: step `{}` failed after {took:.1}s ({status}); fix it and run `cargo xtask validate` again",
                step.name
            );
        }
        eprintln!("ok  {} ({took:.1}s)", step.name);
    }
    eprintln!(
        "validate: all {} steps passed in {:.1}s",
        STEPS.len(),
        total.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// The workspace root: the parent of this package's directory.
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in a subdirectory of the workspace")
        .to_path_buf()
}
