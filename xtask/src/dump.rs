//! `cargo xtask dump`: print a `.weave` fusion as the compiler sees it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

/// Arguments of `cargo xtask dump`.
#[derive(Args)]
pub struct DumpArgs {
    /// The `.weave` file to load.
    file: PathBuf,
    /// Override a fusion parameter (repeatable), e.g. `--set s=3`.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = streamweave::parse_override)]
    set: Vec<(String, i64)>,
}

/// A point of the compilation at which `dump` prints the IR.
///
/// Today the only point is the loaded fusion. The pass-pipeline flags (`--passes`,
/// `--print-before=PASS|all`, `--print-after=PASS|all`, `--dump-dir`) add their points here
/// when the pass manager exists, so that `run` stays one loop over the requested points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DumpPoint {
    /// The fusion after parsing, applying the schedule blocks and verifying.
    Loaded,
}

impl DumpArgs {
    /// The points to print, in compilation order.
    fn points(&self) -> Vec<DumpPoint> {
        vec![DumpPoint::Loaded]
    }
}

/// Loads the file and prints the requested points. A file that does not load is reported
/// with file:line:col on stderr and exit status 1.
pub fn run(args: &DumpArgs) -> anyhow::Result<ExitCode> {
    let fusion = match streamweave::load_file(&args.file, &args.set) {
        Ok(fusion) => fusion,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    for point in args.points() {
        match point {
            DumpPoint::Loaded => print!("{}", streamweave::ir::print::fusion_to_string(&fusion)),
        }
    }
    Ok(ExitCode::SUCCESS)
}
