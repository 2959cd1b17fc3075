//! `cargo xtask dump`: print a `.weave` fusion as the compiler sees it, before, between and
//! after the passes of a pipeline.
//!
//! ```text
//! cargo xtask dump FILE [--set k=v]... [--passes=PIPELINE|+x,-y]
//!     [--print-before=PASS|all]... [--print-after=PASS|all]... [--print-after-change]
//!     [--dump-dir DIR]
//! cargo xtask dump --list-passes
//! ```
//!
//! The IR between passes goes to stdout, each dump under a
//! `// -----// IR Dump After PASS (form) //----- //` header (or into `DIR/NNN-PASS.after.txt`
//! with `--dump-dir`), followed by the IR the pipeline leaves. `WEAVE_DUMP` applies too, the
//! flags adding to it. docs/passes.md describes the passes and every flag.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use weave_passes::{DumpFlags, Ir, PassManager, Registry, DUMP_ENV};

/// Arguments of `cargo xtask dump`.
#[derive(Args)]
pub struct DumpArgs {
    /// The `.weave` file to load.
    #[arg(required_unless_present = "list_passes")]
    file: Option<PathBuf>,
    /// Override a fusion parameter (repeatable), e.g. `--set s=3`.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = streamweave::parse_override)]
    set: Vec<(String, i64)>,
    /// The passes to run: `default`, a pipeline `a,b,c`, or edits `+x,-y` of the default
    /// pipeline. Without it no pass runs (the loaded fusion is printed) unless a
    /// `--print-*`/`--dump-dir` flag asks for dumps, which runs the default pipeline.
    #[arg(long, value_name = "PIPELINE|EDITS", allow_hyphen_values = true)]
    passes: Option<String>,
    /// Print the IR before these passes: a name, names separated by commas, or `all`.
    #[arg(long, value_name = "PASS|all")]
    print_before: Vec<String>,
    /// Print the IR after these passes: a name, names separated by commas, or `all`.
    #[arg(long, value_name = "PASS|all")]
    print_after: Vec<String>,
    /// Print after a pass only when it changed the IR (alone: after every such pass).
    #[arg(long)]
    print_after_change: bool,
    /// Write the dumps to DIR/NNN-PASS.{before,after}.txt instead (alone: after every
    /// pass), and a failing pass's reproducer to DIR/weave-repro-PASS.txt.
    #[arg(long, value_name = "DIR")]
    dump_dir: Option<PathBuf>,
    /// List the registered passes with their summaries, and the default pipeline.
    #[arg(long)]
    list_passes: bool,
}

/// A point of the compilation at which `dump` prints the IR.
///
/// The points between passes are chosen by the pass-manager flags (`--print-before`,
/// `--print-after`, `--print-after-change`, `--dump-dir`) and `WEAVE_DUMP`, and printed by
/// the pass manager while the pipeline runs; `run` asks for them through [`DumpFlags`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DumpPoint {
    /// Around the passes, as the pass-manager flags select.
    Passes,
    /// The IR the pipeline leaves: the parsed, scheduled and verified fusion when no pass runs.
    Result,
}

impl DumpArgs {
    /// The points to print, in compilation order.
    fn points(&self) -> Vec<DumpPoint> {
        vec![DumpPoint::Passes, DumpPoint::Result]
    }

    /// The pass-manager flags, as given, and `WEAVE_DUMP`.
    fn flags(&self) -> DumpFlags {
        DumpFlags {
            passes: self.passes.clone(),
            print_before: self.print_before.clone(),
            print_after: self.print_after.clone(),
            print_after_change: self.print_after_change,
            dump_dir: self.dump_dir.clone(),
            weave_dump: std::env::var(DUMP_ENV).ok(),
        }
    }
}

/// Loads the file, runs the pipeline and prints the requested points. A file that does not
/// load, a bad flag or a failing pass is reported on stderr with exit status 1.
pub fn run(args: &DumpArgs) -> anyhow::Result<ExitCode> {
    if args.list_passes {
        print!("{}", Registry::standard().listing());
        return Ok(ExitCode::SUCCESS);
    }
    let Some(file) = &args.file else {
        anyhow::bail!("dump needs a FILE (or --list-passes)");
    };
    let manager = match PassManager::from_flags(&args.flags()) {
        Ok(manager) => manager,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let fusion = match streamweave::load_file(file, &args.set) {
        Ok(fusion) => fusion,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let mut ir = Ir::Fusion(fusion);
    let mut out = std::io::stdout().lock();
    for point in args.points() {
        match point {
            DumpPoint::Passes => match manager.run_with_output(ir, &mut out) {
                Ok(result) => ir = result,
                Err(e) => {
                    eprintln!("error: {e}");
                    return Ok(ExitCode::FAILURE);
                }
            },
            DumpPoint::Result => out.write_all(weave_passes::manager::render(&ir).as_bytes())?,
        }
    }
    Ok(ExitCode::SUCCESS)
}
