//! The `weave calibrate` command, which measures the machine for the chunk-count model, and
//! the calibration a GPU run or tuning reads ([`gpu_calibration`]).

#[cfg(feature = "cuda")]
use std::path::Path;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[cfg(not(feature = "cuda"))]
use super::NO_CUDA_FEATURE;
use super::{calibration_path, tune_cache_path};

/// The cost model's calibration of `ranks` GPUs named `gpu`: the file at
/// [`calibration_path`] (else the built-in figures), its contention replaced by the one the
/// tunings in the tuning cache measured on this machine, when they did
/// ([`streamweave::tune::measured_contention`]).
pub fn gpu_calibration(
    gpu: &str,
    ranks: usize,
) -> Result<streamweave::chunks::Calibration, streamweave::chunks::CalibrationError> {
    let mut cal = streamweave::chunks::Calibration::load(calibration_path().as_deref())?;
    if let Some(c) =
        tune_cache_path().and_then(|p| streamweave::tune::measured_contention(&p, gpu, ranks))
    {
        cal.contention = c;
        cal.source = format!("{}, contention {c:.2} measured by tuning", cal.source);
    }
    Ok(cal)
}

/// `weave calibrate`: measures this machine on `ranks` GPUs and writes the calibration to
/// `out` (default [`calibration_path`]).
pub fn calibrate(ranks: usize, out: Option<PathBuf>, timeout: Duration) -> ExitCode {
    let Some(path) = out.or_else(calibration_path) else {
        eprintln!("error: no calibration file: pass --out FILE (WEAVE_CALIBRATION is not set and there is no cache directory)");
        return ExitCode::FAILURE;
    };
    if ranks < 2 {
        eprintln!("error: --ranks {ranks}: the collectives need 2 or more GPUs");
        return ExitCode::FAILURE;
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (timeout, path);
        eprintln!("error: weave calibrate: {NO_CUDA_FEATURE}");
        ExitCode::FAILURE
    }
    #[cfg(feature = "cuda")]
    {
        let world =
            match streamweave::calibrate::World::open(streamweave::calibrate::WorldOptions {
                devices: Vec::new(),
                ranks,
                timeout,
                nccl: weave_comm::NcclOptions::default(),
            }) {
                Ok(w) => w,
                Err(e) => {
                    eprintln!("error: cannot open {ranks} GPU(s): {e}");
                    return ExitCode::FAILURE;
                }
            };
        let cal = match streamweave::calibrate::calibrate(&world) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: calibration failed: {e}");
                return ExitCode::FAILURE;
            }
        };
        write_calibration(&path, &cal)
    }
}

/// Writes the calibration `cal` to `path` and prints it.
#[cfg(feature = "cuda")]
fn write_calibration(path: &Path, cal: &streamweave::chunks::Calibration) -> ExitCode {
    if let Some(dir) = path.parent() {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("error: cannot create {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    if let Err(e) = crate::output::write_output(path, cal.render().as_bytes()) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    crate::out!("{}", cal.render());
    crate::outln!("calibration written to {}", path.display());
    ExitCode::SUCCESS
}
