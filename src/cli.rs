//! The `weave run` command: compile, run on in-process ranks or GPUs (threads, or one process
//! per rank under a launcher) with a progress bar, compare with the reference, print a
//! summary, write the timeline and an optional JSON summary; with `--chunks auto` it takes
//! the configuration `weave tune` cached for the program. `weave tune` measures the
//! candidate configurations and caches the winner (`$WEAVE_TUNE_CACHE`, else
//! `streamweave/tune.toml` in the platform's cache directory), and `weave calibrate` measures the machine for the
//! chunk-count model.
//!
//! Each command has its own file; the flags, the report and the cache paths they share are
//! their own modules, re-exported here.

mod calibrate_command;
mod flags;
mod paths;
mod report;
mod run_command;
mod tune_command;

use std::path::Path;

pub use calibrate_command::{calibrate, gpu_calibration};
pub use flags::{ChunksFlag, Pinned, RunFlags, TuneFlags};
pub use paths::{cache_file, calibration_path, tune_cache_path};
pub use report::{failures, print_report, render_report, summarize};
pub use run_command::run;
pub use tune_command::tune;

/// What a CUDA path answers in a `weave` built without the `cuda` feature.
pub const NO_CUDA_FEATURE: &str = "this `weave` was built without the `cuda` feature (CPU only): rebuild it with the default features (`cargo build -p weave-cli`) for the CUDA backend";

/// The text of the source file `file`, or what to report: why it does not read, or where
/// it is not UTF-8 text (`file:line:column: ...`).
fn read_source_text(file: &Path) -> Result<String, String> {
    let bytes = streamweave::read_source(file).map_err(|e| e.to_string())?;
    streamweave::utf8_source(bytes).map_err(|d| format!("{}:{d}", file.display()))
}

/// Whether `file` holds a printed host program (`.hir`, or text that starts with the
/// container header) rather than a `.weave` fusion.
fn is_host_program(file: &Path, text: &str) -> bool {
    file.extension().is_some_and(|e| e == "hir")
        || text.trim_start().starts_with("%HostIrContainer")
}
