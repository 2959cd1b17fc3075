//! How the tuner measures a candidate: the [`Measure`] trait (a closure is one), and
//! [`RunMeasure`], which runs the candidate's program (warm-up runs, then timed repetitions,
//! their median); and [`gpu_name`], the machine part of a tuning's key.

use std::time::{Duration, Instant};

use weave_executor::Dense;

use super::Candidate;
#[cfg(doc)]
use super::TuneKey;
use crate::executable::Executable;
use crate::run::{GpuRunOptions, RunOptions, Target, Timeouts};

/// The name of GPU `device` (`NVIDIA H200`), the machine part of a [`TuneKey`].
#[cfg(feature = "cuda")]
pub fn gpu_name(device: usize) -> Result<String, GpuNameError> {
    Ok(weave_cuda::Gpu::open(device)?.name())
}

/// The name of GPU `device`: in a build without the `cuda` feature, an error saying so.
#[cfg(not(feature = "cuda"))]
pub fn gpu_name(device: usize) -> Result<String, GpuNameError> {
    let _ = device;
    Err(GpuNameError::NoCuda)
}

/// Why [`gpu_name`] has no name.
#[derive(Debug, thiserror::Error)]
pub enum GpuNameError {
    /// The GPU does not open (none at that ordinal, no driver).
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Open(#[from] weave_cuda::CudaError),
    /// This build of streamweave has no CUDA support (the `cuda` feature is off).
    #[cfg(not(feature = "cuda"))]
    #[error("{}", crate::run::NO_CUDA)]
    NoCuda,
}

/// How a first-run tuning of `budget` bounds each candidate, given the run's wait `timeout`:
/// `(wait, limit)`, every wait of a candidate's run at most `wait` (the timeout, or half the
/// budget when that is less, but 5 s at least) and its runs together at most `limit` (the
/// budget, but twice the wait at least, so that a candidate whose waits time out ends with
/// their error rather than as one that did not stop). Candidates start only within the
/// budget, so a tuning takes at most the budget and one limit.
pub fn candidate_bounds(budget: Duration, timeout: Duration) -> (Duration, Duration) {
    let wait = timeout.min((budget / 2).max(Duration::from_secs(5)));
    (wait, budget.max(wait.saturating_mul(2)))
}

/// Why a candidate could not be measured: what its run said (the tuner records it as the
/// candidate's [`Outcome::Failed`](super::Outcome::Failed)).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MeasureError(pub String);

/// Measures one candidate: its compiled program, run with its stream-pool size and replay
/// setting. A closure `FnMut(&Executable, &Candidate) -> Result<Duration, String>` is one.
pub trait Measure {
    /// The candidate's figure (lower is better), or why it could not run.
    fn measure(
        &mut self,
        exe: &Executable,
        candidate: &Candidate,
    ) -> Result<Duration, MeasureError>;

    /// The candidate whose ranks did not stop in time, if one did not: its GPU work may
    /// still hold the GPUs, so nothing more should run on them in this process.
    fn held_by(&self) -> Option<&str> {
        None
    }
}

impl<F> Measure for F
where
    F: FnMut(&Executable, &Candidate) -> Result<Duration, String>,
{
    fn measure(
        &mut self,
        exe: &Executable,
        candidate: &Candidate,
    ) -> Result<Duration, MeasureError> {
        self(exe, candidate).map_err(MeasureError)
    }
}

/// Measures by running: `warmup` runs, then `iters` timed repetitions on seeded random
/// inputs (the same global inputs for every candidate), the median of each repetition's
/// slowest rank. On GPUs the repetitions run on device-resident inputs
/// ([`RunOptions::iters`], [`crate::RunReport::timed`]), replayed as a CUDA graph or issued
/// statement by statement as the candidate says; on the CPU each repetition is a whole run,
/// timed by its slowest rank's wall time.
#[derive(Clone, Debug)]
pub struct RunMeasure {
    /// `Target::Cuda` or `Target::Cpu` with the tuning's rank count.
    pub target: Target,
    /// Untimed runs first.
    pub warmup: usize,
    /// Timed repetitions (at least 1).
    pub iters: usize,
    /// The timeout of each candidate's runs together, warm-up and timed (and of each wait in
    /// them).
    pub timeout: Duration,
    /// The seed of the inputs.
    pub seed: u64,
    globals: Option<Vec<Dense>>,
}

impl RunMeasure {
    /// Runs on `target`, `warmup` untimed runs then `iters` timed ones.
    pub fn new(target: Target, warmup: usize, iters: usize, timeout: Duration) -> RunMeasure {
        RunMeasure {
            target,
            warmup,
            iters: iters.max(1),
            timeout,
            seed: 0x5eed,
            globals: None,
        }
    }
}

impl Measure for RunMeasure {
    fn measure(
        &mut self,
        exe: &Executable,
        candidate: &Candidate,
    ) -> Result<Duration, MeasureError> {
        self.run(exe, candidate).map_err(MeasureError)
    }
}

impl RunMeasure {
    /// [`Measure::measure`] with the run's message as the error.
    fn run(&mut self, exe: &Executable, candidate: &Candidate) -> Result<Duration, String> {
        if self.globals.is_none() {
            self.globals = Some(exe.random_inputs(self.seed).map_err(|e| e.to_string())?);
        }
        let globals = self.globals.as_deref().unwrap_or_default();
        let options = RunOptions {
            target: self.target.clone(),
            streams: candidate.streams,
            check: false,
            check_races: false,
            timeouts: Timeouts::all(self.timeout),
            gpu: GpuRunOptions {
                replay: candidate.replay,
                transport: candidate.transport,
                overlap: candidate.overlap,
                // A candidate is measured as it is, never tuned itself.
                tune: None,
                ..GpuRunOptions::default()
            },
            ..RunOptions::default()
        };
        if self.target.is_cuda() {
            let report = exe
                .run_dense(
                    globals,
                    &RunOptions {
                        warmup: self.warmup,
                        iters: self.iters,
                        ..options
                    },
                )
                .map_err(|e| e.to_string())?;
            return report
                .timed()
                .map(|t| t.median)
                .ok_or_else(|| "the run reported no timed repetitions".to_string());
        }
        let iters = self.iters.max(1);
        let runs = self
            .warmup
            .checked_add(iters)
            .ok_or_else(|| format!("{} warm-up and {iters} timed runs: too many", self.warmup))?;
        // The timeout bounds the candidate's whole measurement: every run gets what is left
        // of it, and the candidate fails once it is spent. A timeout past the end of time
        // sets no deadline.
        let started = Instant::now();
        let deadline = started.checked_add(self.timeout);
        let mut slowest = Vec::with_capacity(iters.min(1 << 16));
        for i in 0..runs {
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => self.timeout,
            };
            let timed_out = || {
                format!(
                    "timed out after {:.1} s ({i} of {} warm-up and {iters} timed runs done; the timeout bounds each candidate's runs together)",
                    started.elapsed().as_secs_f64(),
                    self.warmup,
                )
            };
            if left.is_zero() {
                return Err(timed_out());
            }
            let report = exe
                .run_dense(
                    globals,
                    &RunOptions {
                        timeouts: Timeouts::all(left),
                        ..options.clone()
                    },
                )
                .map_err(|e| match deadline {
                    // A run stopped by what was left of the candidate's time.
                    Some(d) if Instant::now() >= d => timed_out(),
                    _ => e.to_string(),
                })?;
            if i >= self.warmup {
                let wall = report.ranks.iter().map(|r| r.wall_time).max();
                slowest.push(wall.unwrap_or_default());
            }
        }
        slowest.sort();
        slowest
            .get(slowest.len() / 2)
            .copied()
            .ok_or_else(|| "no timed run".to_string())
    }
}
