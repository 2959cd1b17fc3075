//! Running a fusion end to end: compile, generate seeded inputs, shard them per rank, run
//! every rank (on its own thread with the CPU backend or a GPU, or as one process of a
//! launched world), and compare each rank's outputs with the unsharded f64 reference.

use std::time::{Duration, Instant};

use weave_comm::LocalWorld;
use weave_executor::reference::{compare, run_reference, Comparison};
use weave_executor::{check_inputs, run_rank, CpuBackend, CpuOptions, Dense, RankRun, RunConfig};
use weave_ir::Fusion;
use weave_passes::{DumpOptions, Ir, PassManager, Pipeline, PipelineError, Registry};

use crate::shard::Layout;
use crate::threads::run_rank_threads;

pub use crate::setup::{params_of, BackendKind, Compiled, RunError, RunOptions, Transport};

/// Runs the standard pipeline on `fusion`, without dumps, keeping the fusion as it is just
/// before segmentation.
pub fn compile_for_run(fusion: Fusion) -> Result<Compiled, PipelineError> {
    compile_with(fusion, &Pipeline::standard(), &DumpOptions::default())
}

/// [`compile_for_run`] with `pipeline` (one that includes `segment`, e.g. the standard one
/// with `assign-streams` replaced by `assign-streams-separate-sync`) and the dumps `dumps`
/// asks for (the CLI reads them from `WEAVE_DUMP`).
pub fn compile_with(
    fusion: Fusion,
    pipeline: &Pipeline,
    dumps: &DumpOptions,
) -> Result<Compiled, PipelineError> {
    let start = Instant::now();
    let passes = pipeline.passes();
    let cut = passes
        .iter()
        .position(|p| p.name() == "segment")
        .unwrap_or(passes.len());
    let before = PassManager::new(
        Registry::standard(),
        passes[..cut].iter().cloned().collect(),
    )
    .with_options(dumps.clone());
    let sharded = match before.run(Ir::Fusion(fusion.clone()))? {
        Ir::Fusion(f) => f,
        other => return Err(PipelineError::WrongResult(other.form())),
    };
    let after = PassManager::new(
        Registry::standard(),
        passes[cut..].iter().cloned().collect(),
    )
    .with_options(dumps.clone());
    let program = match after.run(Ir::Fusion(sharded.clone()))? {
        Ir::Host(p) => p,
        other => return Err(PipelineError::WrongResult(other.form())),
    };
    Ok(Compiled {
        fusion,
        sharded,
        program,
        compile_time: start.elapsed(),
    })
}

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
    /// Every rank's run, by rank.
    pub ranks: Vec<RankRun>,
    /// Every output of every rank that holds it, against the reference.
    pub checks: Vec<OutputCheck>,
    /// Time of the f64 reference evaluation.
    pub reference_time: Duration,
    /// Wall time of the whole run of all ranks.
    pub run_time: Duration,
}

impl RunReport {
    /// Whether every output matched and no race was found.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.comparison.ok) && self.races() == 0
    }

    /// The number of races found over all ranks.
    pub fn races(&self) -> usize {
        self.ranks.iter().map(|r| r.races.len()).sum()
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

/// Checks that `ranks` fits every mesh of the fusion.
pub fn check_ranks(fusion: &Fusion, ranks: usize) -> Result<(), RunError> {
    if ranks == 0 {
        return Err(RunError::Setup("at least one rank is needed".into()));
    }
    let mut devices: Vec<i64> = Vec::new();
    for &m in fusion.meshes() {
        let decl = fusion.mesh(m);
        if let Some(&d) = decl
            .mesh
            .devices()
            .iter()
            .find(|&&d| d < 0 || d as usize >= ranks)
        {
            return Err(RunError::Setup(format!(
                "mesh `{}` names device {d} but only {ranks} rank(s) were asked for",
                decl.name
            )));
        }
        devices.extend(decl.mesh.devices());
    }
    devices.sort_unstable();
    devices.dedup();
    if !devices.is_empty() && devices.len() < ranks {
        let names: Vec<String> = fusion
            .meshes()
            .iter()
            .map(|&m| format!("`{}`", fusion.mesh(m).name))
            .collect();
        return Err(RunError::Setup(format!(
            "{ranks} ranks were asked for but the fusion's meshes ({}) cover {} device(s): every rank must be a device of a mesh (resize the mesh with --set, e.g. d={ranks})",
            names.join(", "),
            devices.len()
        )));
    }
    Ok(())
}

/// Seeded random global inputs for every input of the fusion.
pub fn generate_inputs(fusion: &Fusion, seed: u64) -> Result<Vec<Dense>, RunError> {
    fusion
        .inputs()
        .iter()
        .enumerate()
        .map(|(k, &t)| {
            let layout = Layout::of(fusion, t).map_err(RunError::Setup)?;
            Ok(Dense::random(
                fusion.tensor(t).dtype,
                layout.global_sizes().to_vec(),
                seed.wrapping_add(k as u64 * 0x9e37_79b9),
            ))
        })
        .collect()
}

/// Compiles nothing and generates nothing: runs `compiled` on the given global inputs.
pub fn run_compiled(
    compiled: &Compiled,
    globals: &[Dense],
    options: &RunOptions,
) -> Result<RunReport, RunError> {
    check_ranks(&compiled.fusion, options.ranks)?;
    let t0 = Instant::now();
    let reference = run_reference(&compiled.fusion, globals).map_err(RunError::Reference)?;
    let reference_time = t0.elapsed();
    let per_rank = shard_inputs(compiled, globals, options.ranks)?;
    let report = match options.backend {
        BackendKind::Cpu => run_local(compiled, per_rank, options)?,
        BackendKind::Cuda => crate::gpu::run_threads(compiled, per_rank, options)?,
    };
    let checks = check_outputs(compiled, &reference, &report.0)?;
    Ok(RunReport {
        ranks: report.0,
        checks,
        reference_time,
        run_time: report.1,
    })
}

/// Compares every rank's outputs (`runs`, by rank) with the shards of the reference outputs
/// that the rank holds.
pub fn check_outputs(
    compiled: &Compiled,
    reference: &[Dense],
    runs: &[RankRun],
) -> Result<Vec<OutputCheck>, RunError> {
    let mut checks = Vec::new();
    for (k, &t) in compiled.sharded.outputs().iter().enumerate() {
        let layout = Layout::of(&compiled.sharded, t).map_err(RunError::Setup)?;
        let want = reference
            .get(k)
            .ok_or_else(|| RunError::Reference(format!("the reference produced no output {k}")))?;
        for (rank, run) in runs.iter().enumerate() {
            if !layout.holds(rank) {
                continue;
            }
            let expected = layout.shard(want, rank).map_err(RunError::Setup)?;
            let got = run
                .outputs
                .get(k)
                .ok_or_else(|| RunError::Setup(format!("rank {rank} returned no output {k}")))?;
            let idx = layout.global_indices(rank);
            // Positions past the global extent (which no split makes) are not compared.
            let (g, e): (Vec<f64>, Vec<f64>) = got
                .data
                .iter()
                .zip(&expected.data)
                .zip(&idx)
                .filter(|(_, i)| i.is_some())
                .map(|((a, b), _)| (*a, *b))
                .unzip();
            let mut comparison = compare(&g, &e, want.dtype);
            if got.data.len() != expected.data.len() {
                comparison.ok = false;
            }
            checks.push(OutputCheck {
                output: compiled.sharded.tensor(t).name.clone(),
                rank,
                comparison,
            });
        }
    }
    Ok(checks)
}

/// The per-rank inputs: every global input cut into rank `r`'s shard.
pub fn shard_inputs(
    compiled: &Compiled,
    globals: &[Dense],
    ranks: usize,
) -> Result<Vec<Vec<Dense>>, RunError> {
    let inputs: Vec<Layout> = compiled
        .sharded
        .inputs()
        .iter()
        .map(|&t| Layout::of(&compiled.sharded, t))
        .collect::<Result<_, _>>()
        .map_err(RunError::Setup)?;
    (0..ranks)
        .map(|r| {
            inputs
                .iter()
                .zip(globals)
                .map(|(l, g)| l.shard(g, r))
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()
        .map_err(RunError::Setup)
}

/// Runs the program on `options.ranks` in-process ranks with the given per-rank inputs.
pub fn run_local(
    compiled: &Compiled,
    per_rank: Vec<Vec<Dense>>,
    options: &RunOptions,
) -> Result<(Vec<RankRun>, Duration), RunError> {
    let world = LocalWorld::new(options.ranks, options.timeout);
    let config = RunConfig {
        params: params_of(&compiled.sharded),
        number_of_streams: options.streams,
        check_races: options.check_races,
    };
    // Every rank's inputs are checked before any rank starts, so a bad input stops the run
    // with its own message instead of failing the other ranks' collectives.
    let mut errors = Vec::new();
    for (rank, inputs) in per_rank.iter().enumerate() {
        if let Err(e) = check_inputs(&compiled.program, inputs, &config, rank, options.ranks) {
            errors.push((rank, e));
        }
    }
    if per_rank.len() != options.ranks {
        return Err(RunError::Setup(format!(
            "inputs were given for {} rank(s) but {} ranks run",
            per_rank.len(),
            options.ranks
        )));
    }
    if !errors.is_empty() {
        return Err(RunError::Ranks(errors));
    }
    let rank_inputs: Vec<_> = per_rank
        .into_iter()
        .enumerate()
        .map(|(rank, inputs)| (inputs, world.communicator(rank)))
        .collect();
    run_rank_threads(rank_inputs, |_, (inputs, comm)| {
        let backend = CpuBackend::new(CpuOptions {
            timeout: options.timeout,
            trace: options.trace,
            delays: options.delays.clone(),
        });
        run_rank(&compiled.program, &backend, &comm, &inputs, &config)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use weave_executor::StreamKey;

    fn rank(timed_ms: &[u64]) -> RankRun {
        RankRun {
            outputs: Vec::new(),
            races: Vec::new(),
            spans: Vec::new(),
            issue_time: Duration::ZERO,
            wall_time: Duration::ZERO,
            statements: 0,
            timed: timed_ms.iter().map(|&m| Duration::from_millis(m)).collect(),
            final_stream: StreamKey::Main,
            streams: Vec::new(),
            live_allocations: 0,
        }
    }

    fn report(ranks: Vec<RankRun>) -> RunReport {
        RunReport {
            ranks,
            checks: Vec::new(),
            reference_time: Duration::ZERO,
            run_time: Duration::ZERO,
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
