//! Running an executable: every rank of a [`Target`] on named global inputs, one rank on a
//! caller's own device buffers and communicator, and, on GPUs from the second run on, the
//! tuned configuration (from the tuning cache, or tuned once).

use std::sync::Arc;
use std::time::{Duration, Instant};

use weave_comm::Communicator;
use weave_executor::{Backend, BufferRun, Dense};
use weave_ir::{Fusion, ParamRole};

use super::{Compiler, Error, Executable};
use crate::run::{RunError, RunOptions, RunReport, Target};
use crate::tensor::Tensor;

/// What [`Executable::run`] remembers between calls on GPUs: how many ran, and once tuned,
/// the program of the winning chunk count with the winner.
#[derive(Debug, Default)]
pub(super) struct Repeated {
    runs: usize,
    tuned: Option<Arc<Tuned>>,
    tried: bool,
}

/// A tuned program, its configuration and where that came from.
pub(crate) type Tuned = (Executable, crate::tune::Entry, &'static str);

/// Who a tuning is for: what it may choose and where it measures.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum TuneFor {
    /// Runs of [`Executable::run`] (and `weave run`) on GPUs `0..ranks`: every candidate.
    Run {
        /// The rank count.
        ranks: usize,
    },
    /// A [`CudaSession`](crate::CudaSession) whose rank `r` is on GPU `devices[r]`: what it
    /// can switch to between calls ([`crate::tune::Scope::Session`]).
    Session {
        /// The GPU of each rank.
        devices: Vec<usize>,
    },
}

/// Tunes `definition` for `who` within `budget` unless `options.tune_cache` holds its
/// configuration, and compiles the winner's chunk count.
pub(crate) fn tune_definition(
    definition: &Fusion,
    who: &TuneFor,
    budget: Duration,
    options: &RunOptions,
) -> Result<Tuned, String> {
    let (ranks, devices): (usize, Vec<usize>) = match who {
        TuneFor::Run { ranks } => (*ranks, (0..*ranks).collect()),
        TuneFor::Session { devices } => (devices.len(), devices.clone()),
    };
    let mut fusion = definition.clone();
    if let Some(name) = fusion
        .role_param(ParamRole::MeshSize)
        .map(|p| p.name.clone())
    {
        fusion
            .set_param(&name, i64::try_from(ranks).unwrap_or(i64::MAX))
            .map_err(|d| d.message)?;
    }
    let machine =
        crate::tune::gpu_name(devices.first().copied().unwrap_or(0)).map_err(|e| e.to_string())?;
    let tune_options = match who {
        TuneFor::Run { .. } => crate::tune::TuneOptions::first_run(ranks, &machine, None, budget),
        TuneFor::Session { .. } => {
            crate::tune::TuneOptions::first_run(ranks, &machine, None, budget).in_session()
        }
    };
    let key = crate::tune::TuneKey::of(&fusion, ranks, tune_options.backend(), &machine);
    let cache = options.gpu.tune_cache.as_deref();
    let cached = match cache {
        Some(p) => crate::tune::lookup(p, &key).map_err(|e| e.to_string())?,
        None => None,
    };
    let (entry, source) = match cached {
        Some(e) => (e, "the tuning cache"),
        None => {
            #[cfg(feature = "cuda")]
            let mut measure = {
                let (wait, limit) = crate::tune::candidate_bounds(budget, options.timeouts.wait);
                crate::measure::WorldMeasure::open_on(devices, 3, 10, wait)
                    .map_err(|e| e.0)?
                    .with_candidate_limit(limit)
            };
            #[cfg(not(feature = "cuda"))]
            let mut measure = {
                let _ = devices;
                crate::tune::RunMeasure::new(Target::Cuda { ranks }, 3, 10, options.timeouts.run)
            };
            let tuning = crate::tune::tune(&fusion, &tune_options, &mut measure)
                .map_err(|e| e.to_string())?;
            drop(measure);
            let entry = tuning.entry().ok_or("no candidate could be measured")?;
            if let Some(p) = cache {
                // A cache that cannot be written keeps the result for this executable.
                let _ = crate::tune::store(p, &tuning);
            }
            (entry, "tuned now")
        }
    };
    let exe = Compiler::new()
        .devices(ranks)
        .chunks(entry.compiler_chunks())
        .compile(&fusion)
        .map_err(|e| e.to_string())?;
    Ok((exe, entry, source))
}

impl Executable {
    /// Runs the rank of `comm` (`comm.rank()` of `comm.size()`) on inputs already on its
    /// device (`inputs[k]` is the rank's buffer of input `k`, of
    /// [`TensorSig::local_sizes_of`](weave_host_ir::TensorSig::local_sizes_of) sizes), on the caller's backend and communicator: for a
    /// caller that owns its GPU, its communicator and its buffers (one process per rank of its
    /// own framework). Returns once every statement is issued; the outputs stay on the device
    /// (the rank's shards, in signature order) and errors of enqueued work surface at the
    /// backend's next synchronization. Every rank of the world calls it with the same
    /// executable. A CUDA backend launches the program's kernels from its kernel table: give
    /// it [`Executable::kernel_table`] for the world's size and the GPU's SM count
    /// (`CudaBackend::with_kernels`).
    pub fn run_rank_buffers<B, C>(
        &self,
        backend: &B,
        comm: &C,
        inputs: &[B::Buffer],
        options: &RunOptions,
    ) -> Result<BufferRun<B::Buffer>, Error>
    where
        B: Backend,
        C: Communicator<Buffer = B::Buffer, Stream = B::CommStream>,
    {
        let rank = comm.rank();
        self.check_ranks(comm.size())?;
        if inputs.len() != self.inputs().len() {
            return Err(Error::Program(format!(
                "rank {rank}: {} input buffers were given, the program takes {}",
                inputs.len(),
                self.inputs().len()
            )));
        }
        weave_executor::run_rank_buffers(
            &self.program,
            backend,
            comm,
            inputs,
            &self.config(options),
        )
        .map_err(|e| Error::Run(RunError::Ranks(vec![(rank, e)])))
    }

    /// Runs every rank of `options.target` on the named global inputs and returns the global
    /// outputs (and, when `options.check`, every rank's outputs against the reference).
    pub fn run(
        &self,
        inputs: &[(&str, &Tensor)],
        options: &RunOptions,
    ) -> Result<RunReport, Error> {
        let globals = self.bind(inputs)?;
        self.run_dense(&globals, options)
    }

    /// [`Executable::run`] on global inputs already in the executor's dense form, in
    /// signature order.
    pub fn run_dense(&self, globals: &[Dense], options: &RunOptions) -> Result<RunReport, Error> {
        match self.tuned_for(options) {
            Some(Ok(tuned)) => {
                let (exe, entry, source) = &*tuned;
                let mut options = options.clone();
                entry.apply(&mut options);
                let mut report = exe.run_untuned(globals, &options)?;
                report.config = Some(format!("{} ({source})", entry.candidate()));
                Ok(report)
            }
            Some(Err(why)) => {
                let mut report = self.run_untuned(globals, options)?;
                report.config = Some(format!("as compiled (tuning failed: {why})"));
                Ok(report)
            }
            None => self.run_untuned(globals, options),
        }
    }

    /// The tuned program and configuration a run with `options` uses: on GPUs of this process,
    /// from the second run on, when the options leave pool, transport and knobs at their
    /// defaults and the program carries its definition (to compile other chunk counts).
    /// Tunes once ([`GpuRunOptions::tune`]) when the cache has nothing; `Some(Err)` on the run
    /// whose tuning failed (later runs run the program as compiled, `None`).
    fn tuned_for(&self, options: &RunOptions) -> Option<Result<Arc<Tuned>, String>> {
        let Target::Cuda { ranks } = options.target else {
            return None;
        };
        let budget = options.gpu.tune?;
        let defaults = RunOptions::default();
        if options.streams != defaults.streams
            || options.gpu.transport != defaults.gpu.transport
            || options.gpu.overlap != defaults.gpu.overlap
        {
            return None;
        }
        let mut repeated = self.repeated.lock().unwrap_or_else(|p| p.into_inner());
        repeated.runs += 1;
        if let Some(t) = &repeated.tuned {
            return Some(Ok(t.clone()));
        }
        if repeated.runs < 2 || repeated.tried {
            return None;
        }
        repeated.tried = true;
        let definition = self.signature().definition.as_ref()?;
        let tuned = self
            .tune_now(definition, ranks, budget, options)
            .map(Arc::new);
        if let Ok(t) = &tuned {
            repeated.tuned = Some(t.clone());
        }
        Some(tuned)
    }

    /// Tunes `definition` on `ranks` GPUs within `budget` unless `options.tune_cache` holds
    /// its configuration, and compiles the winner's chunk count.
    fn tune_now(
        &self,
        definition: &Fusion,
        ranks: usize,
        budget: Duration,
        options: &RunOptions,
    ) -> Result<Tuned, String> {
        tune_definition(definition, &TuneFor::Run { ranks }, budget, options)
    }

    /// [`Executable::run_dense`] of this program with `options` as given, never tuned.
    fn run_untuned(&self, globals: &[Dense], options: &RunOptions) -> Result<RunReport, Error> {
        if globals.len() != self.inputs().len() {
            return Err(Error::Program(format!(
                "{} inputs were given, the program takes {}",
                globals.len(),
                self.inputs().len()
            )));
        }
        let ranks = options.target.ranks();
        options.target.check()?;
        if options.target.is_cuda() {
            options
                .gpu
                .overlap
                .check(options.gpu.transport)
                .map_err(|e| RunError::Setup(e.to_string()))?;
        }
        self.check_ranks(ranks)?;
        if let Target::Cpu { ranks } = options.target {
            // One budget for every rank of this process, reserved before the reference or
            // any rank allocates; the reference's global outputs are held beside them.
            let reference_outputs = if options.check {
                self.outputs().iter().fold(0u64, |sum, t| {
                    let bytes = weave_executor::memory::bytes_of(&t.shape, size_of::<f64>());
                    sum.saturating_add(bytes.unwrap_or(u64::MAX))
                })
            } else {
                0
            };
            let metered = self.config(options);
            crate::run::reserve_host_memory(&self.program, &metered, ranks, reference_outputs)?;
        }
        let (reference, reference_time) = if options.check {
            let t0 = Instant::now();
            (Some(self.reference(globals)?), t0.elapsed())
        } else {
            (None, Duration::ZERO)
        };
        let config = self.config(options);
        #[cfg(not(feature = "cuda"))]
        if options.target.is_cuda() {
            return Err(RunError::Setup(crate::run::NO_CUDA.to_string()).into());
        }
        let (runs, run_time, all) = match &options.target {
            #[cfg(feature = "cuda")]
            Target::Launched(env) => {
                let inputs = self.shard_inputs(globals, env.rank)?;
                let l = crate::gpu::run_launched(self, &config, inputs, options, env)?;
                (l.runs, l.run_time, l.gathered)
            }
            target => {
                let per_rank = (0..ranks)
                    .map(|r| self.shard_inputs(globals, r))
                    .collect::<Result<Vec<_>, _>>()?;
                #[cfg(feature = "cuda")]
                let (runs, time) = if target.is_cuda() {
                    crate::gpu::run_threads(self, &config, per_rank, options)?
                } else {
                    crate::run::run_local(&self.program, &config, per_rank, options)?
                };
                #[cfg(not(feature = "cuda"))]
                let (runs, time) = {
                    let _ = target;
                    crate::run::run_local(&self.program, &config, per_rank, options)?
                };
                (runs, time, true)
            }
        };
        let checks = match (&reference, all) {
            (Some(r), true) => self.check(r, &runs)?,
            _ => Vec::new(),
        };
        let outputs = if all {
            Some(self.gather_outputs(&runs)?)
        } else {
            None
        };
        Ok(RunReport {
            outputs,
            ranks: runs,
            checks,
            reference_time,
            run_time,
            config: None,
        })
    }
}
