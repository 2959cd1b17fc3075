//! `cargo xtask`: the project's everyday developer tasks.
//!
//! * `cargo xtask validate` — every check CI runs, cheapest first, stopping at the first
//!   failure: formatting, clippy with warnings denied, docs with warnings denied, tests with
//!   snapshot updates disabled.
//! * `cargo xtask dump FILE [--set k=v]... [--passes=…] [--print-before=…]
//!   [--print-after=…] [--print-after-change] [--dump-dir DIR]` — load a `.weave` fusion
//!   (parse, schedule, verify), run a pass pipeline verifying after every pass, and print the
//!   IR before, between and after the passes; `--list-passes` lists the passes
//!   (docs/passes.md).
//! * `cargo xtask gpu-bundle [--out DIR]` — build `weave`, the GPU integration test and the
//!   `gpu_*` benches with `--profile bundle`, and gather them with the scenarios and
//!   scripts/gpu into DIR (default target/gpu-bundle) to copy to a GPU machine, where
//!   `bash scripts/run-all.sh` runs them.
//! * `cargo xtask rust-version` — fail when a package in the locked dependency graph
//!   (`cargo metadata --locked`) declares a `rust-version` above the workspace's.
//! * `cargo xtask fuzz --minutes N [--threads T]` — run the fuzz harness (tests/fuzz.rs) on
//!   fresh seeds for N minutes and print how many inputs it tried.

mod dump;
mod fuzz;
mod gpu_bundle;
mod rust_version;
mod validate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// streamweave developer tasks.
#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Run fmt check, clippy (-D warnings), docs (-D warnings) and tests, cheapest first.
    Validate,
    /// Load a `.weave` file, run a pass pipeline and print the IR (docs/passes.md).
    Dump(dump::DumpArgs),
    /// Build the GPU executables and gather them with the scenarios and scripts/gpu into a
    /// directory to copy to a GPU machine.
    GpuBundle(gpu_bundle::BundleArgs),
    /// Check that the workspace's `rust-version` is at least that of every locked dependency
    /// (`cargo metadata --locked`).
    RustVersion,
    /// Fuzz the loader, the pipeline and the host-IR parser and verifier for N minutes
    /// (tests/fuzz.rs with fresh seeds); failing inputs land in target/fuzz-finds/.
    Fuzz(fuzz::FuzzArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Validate => validate::run(),
        Task::Dump(args) => dump::run(&args),
        Task::GpuBundle(args) => gpu_bundle::run(&args),
        Task::Fuzz(args) => fuzz::run(&args),
        Task::RustVersion => rust_version::run(),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
