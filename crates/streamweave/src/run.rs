//! Running a host program's ranks in this process: every rank on its own thread with the CPU
//! backend ([`run_local`]), and what a run reports ([`RunReport`]). The GPU ranks are
//! [`crate::gpu`]'s; binding named global inputs, sharding them and checking the outputs is
//! [`crate::Executable`]'s.

use std::time::Duration;

use weave_comm::LocalWorld;
use weave_executor::reference::Comparison;
use weave_executor::{check_inputs, run_rank, CpuBackend, CpuOptions, Dense, RankRun, RunConfig};
use weave_host_ir::HostProgram;

use crate::tensor::Outputs;
use crate::threads::run_rank_threads;

pub use crate::setup::{
    NcclCtaPolicy, Overlap, RunError, RunOptions, Target, Transport, MAX_NCCL_WINDOW_MIB,
    MAX_THREAD_RANKS,
};

/// Why a GPU target fails in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub(crate) const NO_CUDA: &str = "this build of streamweave has no CUDA support (it was built without the `cuda` feature, which is on by default); run on `Target::Cpu`, or rebuild with `--features cuda`";

/// One output of one rank against the reference.
#[derive(Clone, Debug)]
pub struct OutputCheck {
    /// The output's name in the fusion.
    pub output: String,
    /// The rank.
    pub rank: usize,
    /// The comparison.
    pub comparison: Comparison,
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// The global outputs, put back together from the ranks' shards; `None` on the ranks of
    /// a launched world other than 0, which do not gather them.
    pub outputs: Option<Outputs>,
    /// Every rank's run, by rank (a launched rank other than 0: its own only).
    pub ranks: Vec<RankRun>,
    /// Every output of every rank that holds it, against the reference: empty unless
    /// [`RunOptions::check`] asked for it.
    pub checks: Vec<OutputCheck>,
    /// Time of the f64 reference evaluation (zero without checking).
    pub reference_time: Duration,
    /// Wall time of the whole run of all ranks.
    pub run_time: Duration,
    /// The configuration that ran when it was not the caller's (a tuned one, see
    /// [`RunOptions::tune`]): `S=2 K=2 replay, ordered compute (tuned now)`.
    pub config: Option<String>,
}

impl RunReport {
    /// The global outputs, or why this process has none.
    pub fn into_outputs(self) -> Result<Outputs, RunError> {
        self.outputs.ok_or(RunError::NotGathered)
    }

    /// Whether every checked output matched and no race was found.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.comparison.ok) && self.races() == 0
    }

    /// The number of races found over all ranks.
    pub fn races(&self) -> usize {
        self.ranks.iter().map(|r| r.races.len()).sum()
    }

    /// Every rank's spans (when the run traced), for `timeline::chrome_trace` and `svg`.
    pub fn rank_spans(&self) -> Vec<weave_executor::timeline::RankSpans> {
        self.ranks
            .iter()
            .enumerate()
            .map(|(rank, r)| weave_executor::timeline::RankSpans {
                rank,
                spans: r.spans.clone(),
            })
            .collect()
    }

    /// The largest absolute error over every checked output.
    pub fn max_abs_error(&self) -> f64 {
        self.checks
            .iter()
            .map(|c| c.comparison.max_abs)
            .fold(0.0, f64::max)
    }

    /// The timed repetitions (`--iters`): each repetition's slowest rank, then the median
    /// and the minimum over repetitions; `None` without repetitions or when ranks timed
    /// different numbers of them.
    pub fn timed(&self) -> Option<TimedRuns> {
        let count = self.ranks.first()?.timed.len();
        if count == 0 || self.ranks.iter().any(|r| r.timed.len() != count) {
            return None;
        }
        let mut slowest: Vec<Duration> = (0..count)
            .map(|i| {
                self.ranks
                    .iter()
                    .map(|r| r.timed[i])
                    .max()
                    .unwrap_or_default()
            })
            .collect();
        slowest.sort();
        Some(TimedRuns {
            count,
            median: slowest[count / 2],
            min: slowest[0],
        })
    }
}

/// Timed repetitions of a run, each taken at its slowest rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimedRuns {
    /// How many.
    pub count: usize,
    /// The median (the upper one of an even count).
    pub median: Duration,
    /// The fastest.
    pub min: Duration,
}

/// Runs `program` on `per_rank.len()` in-process ranks with the CPU backend, rank `r` on
/// `per_rank[r]`. Every rank's inputs are checked before any rank starts, so a bad input stops
/// the run with its own message instead of failing the other ranks' collectives.
pub fn run_local(
    program: &HostProgram,
    config: &RunConfig,
    per_rank: Vec<Vec<Dense>>,
    options: &RunOptions,
) -> Result<(Vec<RankRun>, Duration), RunError> {
    let world = per_rank.len();
    check_all_inputs(program, config, &per_rank)?;
    let local = LocalWorld::new(world, options.timeout);
    let rank_inputs: Vec<_> = per_rank
        .into_iter()
        .enumerate()
        .map(|(rank, inputs)| (inputs, local.communicator(rank)))
        .collect();
    run_rank_threads(rank_inputs, |_, (inputs, comm)| {
        let backend = CpuBackend::new(CpuOptions {
            timeout: options.timeout,
            trace: options.trace,
            delays: options.delays.clone(),
        });
        run_rank(program, &backend, &comm, &inputs, config)
    })
}

/// Checks every rank's inputs against the program (count, dtype, sizes).
pub(crate) fn check_all_inputs(
    program: &HostProgram,
    config: &RunConfig,
    per_rank: &[Vec<Dense>],
) -> Result<(), RunError> {
    if per_rank.is_empty() {
        return Err(RunError::Setup("at least one rank is needed".into()));
    }
    let errors: Vec<_> = per_rank
        .iter()
        .enumerate()
        .filter_map(|(rank, inputs)| {
            check_inputs(program, inputs, config, rank, per_rank.len())
                .err()
                .map(|e| (rank, e))
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(RunError::Ranks(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(timed_ms: &[u64]) -> RankRun {
        RankRun {
            timed: timed_ms.iter().map(|&m| Duration::from_millis(m)).collect(),
            ..RankRun::default()
        }
    }

    fn report(ranks: Vec<RankRun>) -> RunReport {
        RunReport {
            outputs: None,
            ranks,
            checks: Vec::new(),
            reference_time: Duration::ZERO,
            run_time: Duration::ZERO,
            config: None,
        }
    }

    #[test]
    fn timed_runs_take_each_runs_slowest_rank_then_the_median() {
        // Run by run, the slowest ranks take 5, 9, 4, 7 ms: median (upper) 7, min 4.
        let r = report(vec![rank(&[5, 2, 4, 7]), rank(&[1, 9, 3, 6])]);
        assert_eq!(
            r.timed(),
            Some(TimedRuns {
                count: 4,
                median: Duration::from_millis(7),
                min: Duration::from_millis(4),
            })
        );
        assert_eq!(report(vec![rank(&[]), rank(&[])]).timed(), None);
        assert_eq!(report(vec![rank(&[1, 2]), rank(&[1])]).timed(), None);
    }
}
