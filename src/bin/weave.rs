//! `weave`: the streamweave command line.
//!
//! `weave dump FILE [--set k=v]...` loads a `.weave` fusion (parse, schedule, verify) and
//! prints it in the seed style. Running a program (`weave run`) arrives with the executor.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Compile multi-GPU tensor programs into host programs that overlap communication with
/// compute.
#[derive(Parser)]
#[command(name = "weave", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the parsed, scheduled and verified fusion of a `.weave` file.
    Dump {
        /// The `.weave` file to load.
        file: PathBuf,
        /// Override a fusion parameter (repeatable), e.g. `--set s=3`.
        #[arg(long = "set", value_name = "NAME=VALUE", value_parser = streamweave::parse_override)]
        set: Vec<(String, i64)>,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Dump { file, set } => match streamweave::load_file(&file, &set) {
            Ok(fusion) => {
                print!("{}", streamweave::ir::print::fusion_to_string(&fusion));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
    }
}
