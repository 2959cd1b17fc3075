//! Measuring a compiled program on a [`World`](crate::calibrate::World) of GPUs: inputs filled on the device from a
//! hash of their global indices, warm-up and timed runs (eager or replayed from a CUDA graph,
//! timed back to back by [`weave_executor::time_back_to_back`]), sampled output rows, on the
//! world's NCCL communicator or a fresh one with other options, NCCL or copy engines. The
//! tuner ([`WorldMeasure`]) measures its candidates this way, reusing the
//! world's ranks and communicator, and the benchmarks (the `weave-bench` package) too.

use std::collections::HashSet;
use std::sync::Arc;

use weave_comm::nccl::{Nccl, NcclId, NcclOptions};
use weave_comm::{Communicator, IpcCopy, IpcOptions, PeerCopy, PeerHub};
use weave_cuda::GpuStream;
use weave_executor::{
    program_teams, run_rank_buffers, Backend, BlockSums, CudaBackend, CudaOptions, Dense,
    DeviceTensor, KernelTable, RunConfig, StreamKey,
};
use weave_host_ir::TensorSig;
use weave_ir::DType;

pub use crate::threads::{Exchange, ExchangeError};

use crate::calibrate::{offset_tables, JobError, Rank, Timing};
use crate::executable::Executable;
use crate::tune::MeasureError;

/// `what: error`, for `map_err`.
fn err<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> JobError + '_ {
    move |e| JobError(format!("{what}: {e}"))
}

/// The kernel table of `exe` run as `how` says on `rank`'s world (made once per executable):
/// what the backend launches, and the sum reductions a copy-engine communicator loads ahead.
fn table_of(rank: &Rank, exe: &Executable, how: &ProgramRun) -> Result<Arc<KernelTable>, JobError> {
    Ok(exe
        .kernel_table(rank.world, how.streams, crate::gpu::sms_of(&rank.gpu))
        .map_err(|e| e.to_string())?)
}

/// This rank's buffer of the fusion input with `layout`, filled from `seed`.
pub fn random_input(
    rank: &Rank,
    backend: &CudaBackend,
    dtype: DType,
    layout: &TensorSig,
    seed: u64,
) -> Result<DeviceTensor, JobError> {
    let tables = offset_tables(&layout.shape, &layout.axis_indices(rank.rank));
    rank.fill(backend, dtype, &tables, seed)
}

/// The elements of this rank's output buffer `out` (of the output with `layout`) that lie
/// in the global rows `rows` (a row is a row-major index over every axis but the last),
/// as (global row, global column, value).
pub fn sample_rows(
    rank: &Rank,
    backend: &CudaBackend,
    out: &DeviceTensor,
    layout: &TensorSig,
    rows: &[usize],
) -> Result<Vec<(usize, usize, f64)>, JobError> {
    let global = &layout.shape;
    let tables = layout.axis_indices(rank.rank);
    let r = global.len();
    if r == 0 {
        return Err("a rank-0 output has no rows".into());
    }
    let last = r - 1;
    let strides = out.strides();
    if strides[last] != 1 {
        return Err("the output's last axis is not contiguous".into());
    }
    let want: HashSet<usize> = rows.iter().copied().collect();
    let lead_sizes: Vec<usize> = tables[..last].iter().map(Vec::len).collect();
    let lead_count: usize = lead_sizes.iter().product();
    let main = backend.stream(StreamKey::Main).map_err(err("stream"))?;
    backend.synchronize().map_err(err("output"))?;
    let eb = weave_executor::dense::elem_bytes(backend.dtype(out));
    let cols = tables[last].len();
    let mut found = Vec::new();
    let mut idx = vec![0usize; last];
    for _ in 0..lead_count {
        // The global row of these leading positions (None for padding).
        let mut row = Some(0usize);
        let mut local_off = 0usize;
        for a in 0..last {
            let g = tables[a][idx[a]];
            row = match row {
                Some(v) if g < global[a] => Some(v * global[a] + g),
                _ => None,
            };
            local_off += idx[a] * strides[a];
        }
        if let Some(row) = row.filter(|v| want.contains(v)) {
            let mut bytes = vec![0u8; cols * eb];
            rank.gpu
                .download(
                    &mut bytes,
                    out.ptr() + (local_off * eb) as u64,
                    &main,
                    rank.timeout,
                )
                .map_err(err("download"))?;
            let values = Dense::from_le_bytes(backend.dtype(out), vec![cols], &bytes)
                .map_err(err("download"))?;
            for (j, v) in values.data.iter().enumerate() {
                let g = tables[last][j];
                if g < global[last] {
                    found.push((row, g, *v));
                }
            }
        }
        for a in (0..last).rev() {
            idx[a] += 1;
            if idx[a] < lead_sizes[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    Ok(found)
}

/// How a compiled program is run in a benchmark.
#[derive(Clone, Debug)]
pub struct ProgramRun {
    /// The worker-stream pool size (`numberOfStreams`).
    pub streams: usize,
    /// Backend options (SM-count target, pool priorities).
    pub cuda: CudaOptions,
    /// Capture one run as a CUDA graph and time its replays.
    pub graph: bool,
    /// After timing, run once more with GPU-side spans recorded for the timeline (eager runs
    /// only; a graph replay has none).
    pub trace: bool,
}

impl Default for ProgramRun {
    fn default() -> ProgramRun {
        ProgramRun {
            streams: 2,
            cuda: CudaOptions::default(),
            graph: false,
            trace: false,
        }
    }
}

/// What one rank measured of a program.
#[derive(Clone, Debug)]
pub struct ProgramTiming {
    /// Milliseconds of every timed run.
    pub times: Vec<f64>,
    /// Sampled output elements `(row, column, value)` of the first output.
    pub sample: Vec<(usize, usize, f64)>,
    /// The spans of the traced run (empty unless asked for).
    pub spans: Vec<weave_executor::Span>,
}

/// Runs `exe` on `rank` with `comm` (the world's or one with other options, NCCL or the
/// copy-engine communicator, its NCCL teams prepared): inputs filled from `seeds` (one per
/// fusion input), `warmup` and `iters` timed runs, then one more run whose first output's
/// `rows` are sampled. Its backends launch the executable's kernel table for this rank's
/// GPU ([`Executable::kernel_table`]), made before the first run.
#[allow(clippy::too_many_arguments)]
pub fn time_program<C: Communicator<Buffer = DeviceTensor, Stream = GpuStream>>(
    rank: &Rank,
    comm: &C,
    exe: &Executable,
    how: &ProgramRun,
    seeds: &[u64],
    warmup: usize,
    iters: usize,
    rows: &[usize],
) -> Result<ProgramTiming, JobError> {
    let kernels = table_of(rank, exe, how)?;
    let backend = rank
        .backend_with(how.cuda.clone())?
        .with_kernels(kernels.clone(), rank.rank);
    // Every kernel loaded, every stream made, the pool grown to the rank's peak before the
    // first run
    // (`CudaBackend::load_kernels`).
    backend.load_kernels().map_err(err("kernels"))?;
    let mut inputs = Vec::new();
    for (i, layout) in exe.inputs().iter().enumerate() {
        let seed = seeds.get(i).copied().unwrap_or(i as u64 + 1);
        inputs.push(random_input(rank, &backend, layout.dtype, layout, seed)?);
    }
    let config = RunConfig {
        params: exe.signature().params.iter().cloned().collect(),
        number_of_streams: how.streams,
        check_races: false,
        deadline: None,
    };
    let main = backend.stream(StreamKey::Main).map_err(err("stream"))?;
    let once = |backend: &CudaBackend| -> Result<Vec<DeviceTensor>, JobError> {
        run_rank_buffers(exe.program(), backend, comm, &inputs, &config)
            .map(|r| r.outputs)
            .map_err(|e| JobError(e.to_string()))
    };
    let times = if how.graph {
        // One run warms up outside the capture (NCCL connects lazily, kernels compile,
        // plans build), then one is captured with its outputs freed inside the graph.
        let replay =
            weave_executor::Replay::capture(exe.program(), &backend, comm, &inputs, &config)
                .map_err(|e| e.to_string())?;
        rank.barrier()?;
        rank.time(Timing::BackToBack, &backend, warmup, iters, || {
            replay.launch().map_err(err("graph launch"))
        })?
    } else {
        rank.time(Timing::BackToBack, &backend, warmup, iters, || {
            for o in once(&backend)? {
                backend.deallocate(o, &main);
            }
            Ok(())
        })?
    };
    let outputs = once(&backend)?;
    backend.synchronize().map_err(err("checked run"))?;
    let layout = exe.outputs().first().ok_or("the program has no output")?;
    let sample = sample_rows(rank, &backend, &outputs[0], layout, rows)?;
    for o in outputs {
        backend.deallocate(o, &main);
    }
    backend.synchronize().map_err(err("checked run"))?;
    let mut spans = Vec::new();
    // Eager runs only: span events recorded while capturing come back untimed from a replay
    // (measured: no span of a replayed graph could be read).
    if how.trace && !how.graph {
        let traced = rank
            .backend_with(CudaOptions {
                trace: true,
                ..how.cuda.clone()
            })?
            .with_kernels(kernels, rank.rank);
        traced.load_kernels().map_err(err("kernels"))?;
        let tmain = traced.stream(StreamKey::Main).map_err(err("stream"))?;
        // One run before the traced one warms the new backend's streams and plans.
        for o in once(&traced)? {
            traced.deallocate(o, &tmain);
        }
        traced.synchronize().map_err(err("traced run"))?;
        traced.start_trace().map_err(err("trace"))?;
        rank.barrier()?;
        for o in once(&traced)? {
            traced.deallocate(o, &tmain);
        }
        traced.synchronize().map_err(err("traced run"))?;
        spans = traced.spans();
    }
    Ok(ProgramTiming {
        times,
        sample,
        spans,
    })
}

/// How a benchmark job moves allgathers and send/recv transfers.
#[derive(Clone, Default)]
pub enum CopyEngine {
    /// NCCL kernels.
    #[default]
    Off,
    /// Peer copies pulled by the receiver ([`PeerCopy`]), meeting at a hub shared by every
    /// rank.
    Peer(Arc<PeerHub>),
    /// Pushes into shared receive windows ([`IpcCopy`]) of this shape, set up through an
    /// exchange shared by every rank: the protocol of launched processes, with the ranks'
    /// regions addressed directly because they are threads of one process.
    Windows(Arc<Exchange>, IpcOptions),
}

impl CopyEngine {
    /// Fresh shared windows for a world of `ranks`.
    pub fn windows(ranks: usize, options: IpcOptions) -> CopyEngine {
        CopyEngine::Windows(Exchange::new(ranks), options)
    }
}

/// [`time_program`] on `rank` with the world's communicator, or a fresh one made from
/// `fresh` (an id shared by every rank and its options), moving allgathers and transfers as
/// `engine` says.
#[allow(clippy::too_many_arguments)]
pub fn run_program(
    rank: &Rank,
    fresh: Option<&(NcclId, NcclOptions)>,
    engine: &CopyEngine,
    exe: &Executable,
    how: &ProgramRun,
    seeds: &[u64],
    (warmup, iters): (usize, usize),
    rows: &[usize],
) -> Result<ProgramTiming, JobError> {
    let comm: Arc<Nccl<DeviceTensor>> = match fresh {
        Some((id, options)) => Arc::new(
            Nccl::init(&rank.gpu, rank.rank, rank.world, id, options.clone())
                .map_err(|e| format!("NCCL with {options:?}: {e}"))?,
        ),
        None => rank.comm.clone(),
    };
    comm.prepare_teams(&program_teams(exe.program()))
        .map_err(err("teams"))?;
    match engine {
        CopyEngine::Off => time_program(rank, &*comm, exe, how, seeds, warmup, iters, rows),
        CopyEngine::Peer(hub) => {
            let pc = PeerCopy::new(comm, hub.clone(), rank.gpu.clone())
                .with_reducer(Arc::new(BlockSums::new(rank.gpu.clone())));
            pc.load_reductions(table_of(rank, exe, how)?.reductions(rank.rank))
                .map_err(err("copy-engine reductions"))?;
            time_program(rank, &pc, exe, how, seeds, warmup, iters, rows)
        }
        CopyEngine::Windows(exchange, options) => {
            let mut gathered = None;
            let ipc = IpcCopy::connect(comm, rank.gpu.clone(), *options, |card| {
                let all = exchange
                    .all_gather_as(rank.rank, rank.timeout, card)
                    .map_err(|e| e.to_string());
                gathered = all.as_ref().err().cloned();
                all.map_err(weave_comm::CommError::Bootstrap)
            })
            .map_err(|e| gathered.unwrap_or_else(|| format!("copy-engine windows: {e}")))?
            .with_reducer(Arc::new(BlockSums::new(rank.gpu.clone())));
            let timing = ipc
                .load_reductions(table_of(rank, exe, how)?.reductions(rank.rank))
                .map_err(|e| JobError(format!("copy-engine reductions: {e}")))
                .and_then(|()| time_program(rank, &ipc, exe, how, seeds, warmup, iters, rows));
            if timing.is_err() {
                // A stream may still wait on the windows: never free memory the GPU may touch.
                std::mem::forget(ipc);
            }
            timing
        }
    }
}

/// Measures tuning candidates on a [`World`](crate::calibrate::World) of GPUs opened once:
/// every candidate runs on the same rank threads, GPUs and NCCL communicator (a candidate
/// with an NCCL CTA limit gets a communicator of its own, which that limit needs), its
/// inputs filled on the device, `warmup` runs and `iters` timed ones
/// ([`time_program`]); the figure is the slowest rank's median.
///
/// A candidate that fails leaves the world failed (its communicator aborted): the next
/// candidate reopens it. One whose ranks do not reply within the candidate limit
/// ([`WorldMeasure::with_candidate_limit`]) may have left GPU work that never ends: every
/// candidate after it fails at once, unmeasured, instead of waiting on those GPUs in turn.
pub struct WorldMeasure {
    world: crate::calibrate::World,
    options: crate::calibrate::WorldOptions,
    warmup: usize,
    iters: usize,
    timeout: std::time::Duration,
    /// How long one candidate's runs may take together.
    limit: std::time::Duration,
    /// The candidate whose ranks did not reply in time, once one did not.
    stuck: Option<String>,
}

impl WorldMeasure {
    /// Opens a world of `ranks` GPUs, `0..ranks` (one NCCL communicator for every candidate).
    pub fn open(
        ranks: usize,
        warmup: usize,
        iters: usize,
        timeout: std::time::Duration,
    ) -> Result<WorldMeasure, JobError> {
        WorldMeasure::open_on((0..ranks).collect(), warmup, iters, timeout)
    }

    /// Opens a world of one rank per GPU of `devices`, rank `r` on `devices[r]` (one NCCL
    /// communicator for every candidate).
    pub fn open_on(
        devices: Vec<usize>,
        warmup: usize,
        iters: usize,
        timeout: std::time::Duration,
    ) -> Result<WorldMeasure, JobError> {
        let options = crate::calibrate::WorldOptions {
            ranks: devices.len(),
            devices,
            timeout,
            nccl: NcclOptions::default(),
        };
        let world = crate::calibrate::World::open(options.clone())?;
        Ok(WorldMeasure {
            world,
            options,
            warmup,
            iters: iters.max(1),
            timeout,
            limit: timeout.saturating_mul(4),
            stuck: None,
        })
    }

    /// The longest one candidate's runs (warm-up and timed, every rank) may take together
    /// (four times the wait timeout unless set; a tuning's budget bounds it): a candidate
    /// past it fails, and so, unmeasured, does every candidate after it.
    pub fn with_candidate_limit(mut self, limit: std::time::Duration) -> WorldMeasure {
        self.limit = limit;
        self
    }

    /// The world's rank count.
    pub fn ranks(&self) -> usize {
        self.world.ranks()
    }
}

impl crate::tune::Measure for WorldMeasure {
    fn held_by(&self) -> Option<&str> {
        self.stuck.as_deref()
    }

    fn measure(
        &mut self,
        exe: &Executable,
        candidate: &crate::tune::Candidate,
    ) -> Result<std::time::Duration, MeasureError> {
        if let Some(stuck) = &self.stuck {
            return Err(MeasureError(format!(
                "not measured: the ranks of {stuck} did not stop and may still hold the GPUs \
                 (only the end of this process frees them)"
            )));
        }
        if self.world.failed() {
            // An earlier candidate failed and aborted the communicator: a fresh world.
            self.world = crate::calibrate::World::open(self.options.clone())
                .map_err(|e| MeasureError(format!("reopening the ranks: {e}")))?;
        }
        let exe = Arc::new(exe.clone());
        let overlap = candidate.overlap;
        let fresh = match overlap.needs_own_communicators() {
            false => None,
            true => {
                let options = overlap
                    .nccl_options(NcclOptions {
                        timeout: self.timeout,
                        ..NcclOptions::default()
                    })
                    .map_err(|e| MeasureError(e.to_string()))?;
                Some((
                    NcclId::new().map_err(|e| MeasureError(e.to_string()))?,
                    options,
                ))
            }
        };
        let transport = candidate.transport;
        let engine = match transport {
            crate::Transport::Nccl => CopyEngine::Off,
            // Shared windows: replayable, unlike peer copies (which wait on the host).
            crate::Transport::CopyEngine => {
                let windows = overlap
                    .ce_windows()
                    .map_err(|e| MeasureError(e.to_string()))?;
                CopyEngine::windows(self.world.ranks(), windows)
            }
        };
        let graph = candidate.replay;
        let (streams, warmup, iters) = (candidate.streams, self.warmup, self.iters);
        let timings = self.world.run_within(
            move |r| {
                let how = ProgramRun {
                    streams,
                    cuda: overlap
                        .cuda_options(CudaOptions::default(), r.gpu.sm_count(), transport)
                        .map_err(|e| e.to_string())?,
                    graph,
                    trace: false,
                };
                run_program(
                    r,
                    fresh.as_ref(),
                    &engine,
                    &exe,
                    &how,
                    &[],
                    (warmup, iters),
                    &[],
                )
            },
            self.limit,
        );
        let timings: Vec<ProgramTiming> = match timings {
            Ok(t) => t,
            Err(e) => {
                if self.world.stuck() {
                    self.stuck = Some(candidate.to_string());
                }
                return Err(MeasureError(e.0));
            }
        };
        let slowest = timings
            .iter()
            .map(|t| crate::calibrate::median(&t.times))
            .fold(0.0f64, f64::max);
        Ok(std::time::Duration::from_secs_f64(slowest / 1e3))
    }
}
