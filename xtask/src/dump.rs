//! `cargo xtask dump`: `weave dump` with the same flags (docs/passes.md), built and run by
//! cargo, so the two never differ: one command line parses them and one function prints.

use std::ffi::OsString;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result};
use clap::Args;

/// Arguments of `cargo xtask dump`: everything `weave dump` takes (`FILE`, `--set`,
/// `--passes`, `--print-before`, `--print-after`, `--print-after-change`, `--dump-dir`,
/// `--list-passes`, `--kernels`, `--sms`, `--streams`), handed on as given.
#[derive(Args)]
pub struct DumpArgs {
    /// The arguments of `weave dump` (`cargo xtask dump --help` shows its own; `weave dump
    /// --help` lists them).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    args: Vec<OsString>,
}

/// Runs `weave dump ARGS` through `cargo run`, and exits as it does.
pub fn run(args: &DumpArgs) -> Result<ExitCode> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["run", "--quiet", "--bin", "weave", "--", "dump"])
        .args(&args.args)
        .status()
        .context("running cargo run --bin weave -- dump")?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}
