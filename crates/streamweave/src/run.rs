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

pub use crate::setup::OverlapError;
pub use crate::setup::{
    CpuRunOptions, GpuRunOptions, NcclCtaPolicy, Overlap, RunError, RunOptions, Target, Timeouts,
    Transport, MAX_CE_SLOT_MIB, MAX_NCCL_WINDOW_MIB, MAX_THREAD_RANKS,
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
    /// [`GpuRunOptions::tune`]): `S=2 K=2 replay, ordered compute (tuned now)`.
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
    let local = LocalWorld::new(world, options.timeouts.wait);
    let rank_inputs: Vec<_> = per_rank
        .into_iter()
        .enumerate()
        .map(|(rank, inputs)| (inputs, local.communicator(rank)))
        .collect();
    // Every rank's spans count from one moment: the ranks' traces share the process's clock.
    let epoch = std::time::Instant::now();
    run_rank_threads(rank_inputs, |_, (inputs, comm)| {
        let backend = CpuBackend::new(CpuOptions {
            timeout: options.timeouts.wait,
            trace: options.trace,
            delays: options.cpu.delays.clone(),
        })
        .with_epoch(epoch);
        run_rank(program, &backend, &comm, &inputs, config)
    })
}

/// What the ranks of a CPU run of one process hold on the host at their peak, estimated
/// before any of them allocates: see [`host_peak`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPeak {
    /// The ranks of this process.
    pub ranks: usize,
    /// The most bytes one rank holds at once: its input shards as given (`f64` values) and,
    /// at the peak of its program on the meter backend, its buffers (uploaded inputs and
    /// allocations, at their dtype's size) with the `f64` values the CPU backend works on
    /// while a kernel, matmul or linear runs
    /// ([`weave_executor::meter::Meter::peak_with_f64_work`]).
    pub per_rank: u64,
    /// Bytes the run holds besides the ranks' (the reference's outputs, when it checks).
    pub besides: u64,
    /// The program's largest tensors, largest first, as the error names them, e.g.
    /// ``input `x` f32[40000000] (152.6 MiB a rank)``.
    pub largest: Vec<String>,
}

impl HostPeak {
    /// `per_rank` times the ranks, plus `besides` (saturating).
    pub fn total(&self) -> u64 {
        self.per_rank
            .saturating_mul(self.ranks as u64)
            .saturating_add(self.besides)
    }

    /// Checks [`HostPeak::total`] against the host memory `available` (as
    /// [`weave_executor::memory::available_host_bytes`] gives it; `None` is not checked): the
    /// error names the ranks, the bytes needed and available and the largest tensors.
    pub fn check(&self, available: Option<u64>) -> Result<(), RunError> {
        use weave_executor::memory::human;
        let total = self.total();
        match available {
            Some(have) if total > have => Err(RunError::Setup(format!(
                "the {} rank(s) of this CPU run need {total} bytes ({}) of host memory at their peak ({} bytes, {}, a rank{}), but only {have} bytes ({}) are available; nothing was allocated; the program's largest tensors: {}; run fewer ranks or smaller sizes",
                self.ranks,
                human(total),
                self.per_rank,
                human(self.per_rank),
                if self.besides > 0 {
                    format!(", and {} for the reference's outputs", human(self.besides))
                } else {
                    String::new()
                },
                human(have),
                if self.largest.is_empty() {
                    "(none named)".to_string()
                } else {
                    self.largest.join(", ")
                },
            ))),
            _ => Ok(()),
        }
    }
}

/// The host memory a CPU run of `program` on `ranks` ranks of this process holds at its
/// peak ([`HostPeak`]), with `besides` bytes held apart from the ranks; `None` when the
/// program has no signature to size its inputs by, or its run on the meter backend fails
/// (the run itself reports why).
///
/// Each rank's peak comes from running its program on the meter backend (buffers are shapes,
/// nothing is computed): rank 0 and the last rank are metered (a split's remainder falls on
/// the last ranks, so these two hold the most) and the larger taken for every rank.
pub fn host_peak(
    program: &HostProgram,
    config: &RunConfig,
    ranks: usize,
    besides: u64,
) -> Option<HostPeak> {
    use weave_executor::memory::{bytes_of, human};
    use weave_executor::meter::MeterBackend;
    let sig = program.signature.as_ref()?;
    let f64_bytes = size_of::<f64>();
    let config = RunConfig {
        check_races: false,
        ..config.clone()
    };
    let mut per_rank: u64 = 0;
    let mut at_peak = Vec::new();
    let mut metered: Vec<usize> = vec![0, ranks.saturating_sub(1)];
    metered.dedup();
    for rank in metered {
        let mut shards: u64 = 0;
        let inputs: Vec<Dense> = sig
            .inputs
            .iter()
            .map(|t| {
                let sizes = t.local_sizes_of(rank);
                if t.holds(rank) {
                    let bytes = bytes_of(&sizes, f64_bytes).unwrap_or(u64::MAX);
                    shards = shards.saturating_add(bytes);
                }
                Dense {
                    dtype: t.dtype,
                    sizes,
                    data: Vec::new(),
                }
            })
            .collect();
        let backend = MeterBackend::new();
        let comm = backend.comm(rank, ranks);
        run_rank(program, &backend, &comm, &inputs, &config).ok()?;
        let meter = backend.meter();
        let peak = shards.saturating_add(meter.peak_bytes.max(meter.peak_with_f64_work));
        if peak > per_rank || at_peak.is_empty() {
            per_rank = per_rank.max(peak);
            at_peak = meter.peak_buffers;
        }
    }
    // The signature's tensors by their bytes on a rank, then the buffers live at the peak
    // that none of them names.
    let mut named: Vec<(u64, String)> = Vec::new();
    for (role, list) in [("input", &sig.inputs), ("output", &sig.outputs)] {
        for t in list.iter() {
            let local = t.local_sizes_of(0);
            let bytes =
                bytes_of(&local, weave_executor::dense::elem_bytes(t.dtype)).unwrap_or(u64::MAX);
            named.push((
                bytes,
                format!(
                    "{role} `{}` {}{:?} ({} a rank)",
                    t.name,
                    t.dtype,
                    t.shape,
                    human(bytes)
                ),
            ));
        }
    }
    for (dtype, sizes) in at_peak {
        let bytes = bytes_of(&sizes, weave_executor::dense::elem_bytes(dtype)).unwrap_or(u64::MAX);
        let is_named = sig
            .inputs
            .iter()
            .chain(&sig.outputs)
            .any(|t| t.dtype == dtype && t.local_sizes_of(0) == sizes);
        if !is_named {
            named.push((
                bytes,
                format!("a buffer {dtype}{sizes:?} ({} a rank)", human(bytes)),
            ));
        }
    }
    named.sort_by_key(|n| std::cmp::Reverse(n.0));
    Some(HostPeak {
        ranks,
        per_rank,
        besides,
        largest: named
            .into_iter()
            .take(weave_executor::meter::PEAK_BUFFERS)
            .map(|(_, s)| s)
            .collect(),
    })
}

/// Reserves, once and before any rank of a CPU run allocates, the host memory its `ranks`
/// ranks hold together at their peak ([`host_peak`]) plus `besides`: when that is at least
/// [`weave_executor::memory::CHECK_ABOVE_BYTES`] it is checked against the memory available
/// now, so that the ranks of one process share one budget instead of each passing its own
/// check and failing later, half-way. Each large allocation is still checked as it is made
/// ([`weave_executor::memory::allocate_host`]): a second line for what the estimate misses.
pub fn reserve_host_memory(
    program: &HostProgram,
    config: &RunConfig,
    ranks: usize,
    besides: u64,
) -> Result<(), RunError> {
    use weave_executor::memory;
    let Some(peak) = host_peak(program, config, ranks, besides) else {
        return Ok(());
    };
    if peak.total() < memory::CHECK_ABOVE_BYTES {
        return Ok(());
    }
    peak.check(memory::available_host_bytes())
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

#[cfg(test)]
mod peak_tests {
    use super::*;

    /// The [`host_peak`] of the program `source` (named `file`, default options) on `ranks`
    /// ranks, with `besides` bytes held apart from the ranks.
    fn peak_of(file: &str, source: &str, ranks: usize, besides: u64) -> HostPeak {
        let exe = crate::Compiler::new().compile_source(file, source).unwrap();
        let config = exe.config(&RunOptions::default());
        host_peak(exe.program(), &config, ranks, besides).unwrap()
    }

    /// A replicated f32[1000] chain `z = neg(exp(x))` (one kernel) on 2 ranks: each rank
    /// holds its shard of `x` as given (1000 f64 values: 8000 bytes), the uploaded `x` and the
    /// allocated `z` (f32: 4000 bytes each) and, while the kernel runs, `x` read as f64 and
    /// one f64 value of the output's size for each of its 2 expressions (3 x 8000 bytes):
    /// 40 000 bytes a rank.
    #[test]
    fn the_peak_of_a_program_with_known_sizes() {
        let peak = peak_of(
            "chain.weave",
            "fusion chain(n = 1000, d = 2) {\n  mesh m = devices(d)\n  tensor x: f32[n] on m\n  y = exp(x)\n  z = neg(y)\n  output z\n}\n",
            2,
            8000,
        );
        assert_eq!(peak.per_rank, 8000 + 4000 + 4000 + 3 * 8000);
        assert_eq!(peak.total(), 2 * 40_000 + 8000);
        assert_eq!(
            peak.largest,
            [
                "input `x` f32[1000] (3.9 KiB a rank)",
                "output `z` f32[1000] (3.9 KiB a rank)"
            ]
        );
        assert!(peak.check(Some(88_000)).is_ok());
        assert!(peak.check(None).is_ok());
        let e = peak.check(Some(87_999)).unwrap_err().to_string();
        assert!(
            e.starts_with("the 2 rank(s) of this CPU run need 88000 bytes (85.9 KiB) of host memory at their peak (40000 bytes, 39.1 KiB, a rank, and 7.8 KiB for the reference's outputs), but only 87999 bytes (85.9 KiB) are available; nothing was allocated; the program's largest tensors: input `x` f32[1000]"),
            "{e}"
        );
    }

    /// A rank whose sizes are split holds its own shard: 4 ranks of f32[4000] split on its
    /// one axis hold 1000 elements each.
    #[test]
    fn a_split_input_counts_each_ranks_shard() {
        let peak = peak_of(
            "split.weave",
            "fusion split(n = 4000, d = 4) {\n  mesh m = devices(d)\n  tensor x: f32[n] on m\n  y = neg(x)\n  output y\n  schedule x { outer_split(0, d) -> DIDx }\n}\n",
            4,
            0,
        );
        // 1000 f64 values given, `x` and `y` as f32 buffers, the kernel's `x` and one value.
        assert_eq!(peak.per_rank, 8000 + 4000 + 4000 + 2 * 8000);
    }
}
