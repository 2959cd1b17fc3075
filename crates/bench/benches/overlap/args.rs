//! The overlap benchmark's command line ([`Args`]).

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser};

use super::pattern::Pattern;

/// The overlap benchmark on GPUs (rows, experiments and calibration; see the module doc).
#[derive(Parser)]
#[command(name = "gpu_overlap")]
pub(crate) struct Args {
    /// World sizes to measure, comma-separated (those above the visible GPUs are skipped).
    #[arg(long, value_name = "D,...", value_delimiter = ',', default_values_t = [2, 4])]
    pub(crate) ranks: Vec<usize>,
    /// Hidden sizes h, comma-separated.
    #[arg(long = "h", value_name = "H,...", value_delimiter = ',', default_values_t = [4096, 8192])]
    pub(crate) hs: Vec<usize>,
    /// Tokens t.
    #[arg(long = "t", default_value_t = 8192)]
    pub(crate) t: usize,
    /// Timed iterations per configuration (at least 1).
    #[arg(long, default_value_t = 20, value_parser = at_least_one)]
    pub(crate) iters: usize,
    /// Untimed iterations before them.
    #[arg(long, default_value_t = 5)]
    pub(crate) warmup: usize,
    /// The patterns to measure, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "row-parallel,column-parallel,matmul+rs,p2p-ring,sp-mlp"
    )]
    pub(crate) patterns: Vec<Pattern>,
    /// Where to write ours.jsonl, the traces and the timelines.
    #[arg(long, value_name = "DIR", default_value = "bench-out")]
    pub(crate) out: PathBuf,
    /// Skip the overlap experiments.
    #[arg(long = "no-experiments", action = ArgAction::SetFalse)]
    pub(crate) experiments: bool,
    /// Skip the calibration (the cost model then reads --calibration, or its defaults).
    #[arg(long = "no-calibrate", action = ArgAction::SetFalse)]
    pub(crate) calibrate: bool,
    /// The calibration cache: read for the cost model, and written with the calibration
    /// measured here. Default: $WEAVE_CALIBRATION; without either the measured calibration
    /// is used for this run only (and logged in ours.jsonl).
    #[arg(long, value_name = "FILE")]
    pub(crate) calibration: Option<PathBuf>,
    /// How long any wait may take, in seconds.
    #[arg(long = "timeout-secs", value_name = "T", default_value_t = 30)]
    pub(crate) timeout_secs: u64,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    pub(crate) bench: bool,
}

impl Args {
    /// The bound on every wait.
    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }

    /// `--calibration`, else `$WEAVE_CALIBRATION`.
    pub(crate) fn calibration_path(&self) -> Option<PathBuf> {
        self.calibration
            .clone()
            .or_else(|| std::env::var_os("WEAVE_CALIBRATION").map(PathBuf::from))
    }
}

/// A count of at least 1.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{s}` is not a positive number")),
    }
}
