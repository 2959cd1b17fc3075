//! `cargo xtask fuzz`: the fuzz harness of tests/fuzz.rs on fresh seeds for a given time.

use std::process::{Command, ExitCode};

use anyhow::{Context, Result};
use clap::Args;

/// Arguments of `cargo xtask fuzz`.
#[derive(Args)]
pub struct FuzzArgs {
    /// How long to fuzz, in minutes.
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Threads mutating and checking inputs at once.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

/// Runs the harness's mutation test in release with `WEAVE_FUZZ_MINUTES` and
/// `WEAVE_FUZZ_THREADS` set, printing its count of inputs tried.
pub fn run(args: &FuzzArgs) -> Result<ExitCode> {
    if !(args.minutes.is_finite() && args.minutes > 0.0) {
        anyhow::bail!(
            "--minutes {}: give a positive number of minutes",
            args.minutes
        );
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "test",
            "--release",
            "--test",
            "fuzz",
            "mutated",
            "--",
            "--nocapture",
        ])
        .env("WEAVE_FUZZ_MINUTES", args.minutes.to_string())
        .env("WEAVE_FUZZ_THREADS", args.threads.max(1).to_string())
        .status()
        .context("running cargo test --test fuzz")?;
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
