//! `cargo xtask`: the project's everyday developer tasks.
//!
//! * `cargo xtask validate` — every check CI runs, cheapest first, stopping at the first
//!   failure: formatting, clippy with warnings denied, docs with warnings denied, tests with
//!   snapshot updates disabled.
//! * `cargo xtask dump FILE [--set k=v]...` — load a `.weave` fusion (parse, schedule,
//!   verify) and print it in the seed style.

mod dump;
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
    /// Print the parsed, scheduled and verified fusion of a `.weave` file.
    Dump(dump::DumpArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Validate => validate::run(),
        Task::Dump(args) => dump::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
