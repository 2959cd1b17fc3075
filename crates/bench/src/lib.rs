//! The GPU benchmark harness: a world of ranks (one persistent thread per GPU with its CUDA
//! backend and NCCL communicator) that runs the same job on every rank, CUDA-event timing
//! (median over iterations; callers take the maximum over ranks), inputs generated on the
//! device from a counter-based hash of their *global* indices (the same global tensor for
//! every sharding and chunk count), sampled output rows checked against a host reference.
//!
//! The world, the timing and the probes are the library's (`streamweave::calibrate`, which
//! `weave calibrate` runs); this package adds the program runs and checks of the benchmarks.
//! It is not published.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use streamweave::host_ir::TensorSig;
use streamweave::Executable;
use weave_comm::nccl::{Nccl, NcclId, NcclOptions};
use weave_comm::{CommOp, Communicator, RedOp};
use weave_comm::{IpcCopy, IpcOptions, PeerCopy, PeerHub};
use weave_cuda::GpuStream;
use weave_executor::reference::compare;
use weave_executor::{
    program_teams, run_rank_buffers, Backend, CudaBackend, CudaOptions, Dense, DeviceTensor,
    RunConfig, StreamKey,
};
use weave_ir::DType;

pub use streamweave::calibrate::{
    calibrate, hash_value, median, offset_tables, time_comm, time_gemm, time_overlap,
    world_gpu_name, Barrier, CommKind, JobError, Rank, World, WorldOptions,
};

/// `what: error`, for `map_err`.
fn err<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> JobError + '_ {
    move |e| format!("{what}: {e}")
}

/// The seeds of a linear layer's input and weight in the benchmarks, for [`time_program`] and
/// [`linear_reference`] alike.
pub const LINEAR_SEEDS: [u64; 2] = [101, 202];

/// The kernel benchmark's cases, each a fixture `tests/scenarios/kernels/NAME.weave` (the
/// benchmark, the fixtures' CPU tests and scripts/gpu/kernels_torch.py run the same list).
pub const KERNEL_CASES: [&str; 9] = [
    "add",
    "silu",
    "gelu_tanh",
    "bias_residual",
    "row_sum",
    "col_sum",
    "softmax",
    "layernorm",
    "rmsnorm",
];

/// The 0-d constant inputs of a kernel benchmark fixture (tests/scenarios/kernels/*.weave; the
/// format has no scalar literals) at row length `h`: what the benchmark and the fixtures'
/// CPU tests set.
pub fn kernel_constants(case: &str, h: usize) -> Vec<(&'static str, f64)> {
    match case {
        "gelu_tanh" => vec![
            ("half", 0.5),
            ("one", 1.0),
            ("k0", 0.797_884_56),
            ("k1", 0.044_715),
        ],
        "layernorm" => vec![("n", h as f64), ("eps", 1e-5)],
        "rmsnorm" => vec![("n", h as f64), ("eps", 1e-6)],
        _ => Vec::new(),
    }
}

/// This rank's buffer of the fusion input with `layout`, filled from `seed`.
pub fn random_input(
    rank: &Rank,
    backend: &CudaBackend,
    dtype: DType,
    layout: &TensorSig,
    seed: u64,
) -> Result<DeviceTensor, JobError> {
    let tables = offset_tables(&layout.global, &layout.axis_indices(rank.rank));
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
    let global = &layout.global;
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

/// Rows `rows` of `X · Wᵀ` for the global `X [.., k]` seeded by `seed_x` and `W [n, k]` seeded
/// by `seed_w` (rows of X are row-major indices over its leading axes), in f64, on every core.
pub fn linear_reference(
    rows: &[usize],
    k: usize,
    n: usize,
    seed_x: u64,
    seed_w: u64,
) -> Vec<Vec<f64>> {
    let xs: Vec<Vec<f64>> = rows
        .iter()
        .map(|&r| {
            (0..k)
                .map(|j| hash_value(seed_x, (r * k + j) as u64))
                .collect()
        })
        .collect();
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(n.max(1));
    let per = n.div_ceil(threads.max(1)).max(1);
    let parts: Vec<Vec<Vec<f64>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .step_by(per)
            .map(|lo| {
                let xs = &xs;
                s.spawn(move || {
                    let hi = (lo + per).min(n);
                    let mut out = vec![vec![0.0f64; hi - lo]; xs.len()];
                    let mut w = vec![0.0f64; k];
                    for col in lo..hi {
                        for (j, v) in w.iter_mut().enumerate() {
                            *v = hash_value(seed_w, (col * k + j) as u64);
                        }
                        for (x, o) in xs.iter().zip(out.iter_mut()) {
                            o[col - lo] = x.iter().zip(&w).map(|(a, b)| a * b).sum();
                        }
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut out = vec![Vec::with_capacity(n); rows.len()];
    for part in parts {
        for (o, p) in out.iter_mut().zip(part) {
            o.extend(p);
        }
    }
    out
}

/// What a sampled check found.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// Every element was within the bf16 tolerance of the reference.
    pub ok: bool,
    /// The largest error relative to the largest reference magnitude.
    pub max_rel: f64,
    /// Elements compared (every rank's copy of a replicated element counts).
    pub compared: usize,
}

/// Compares sampled elements `(row, column, value)` (from every rank) with `reference`
/// (rows in the order of `rows`), at the tolerance of `dtype`. Every sampled row must have
/// been found with all its columns.
pub fn check_sample(
    found: &[(usize, usize, f64)],
    rows: &[usize],
    reference: &[Vec<f64>],
    dtype: DType,
) -> Check {
    let pos: HashMap<usize, usize> = rows.iter().enumerate().map(|(i, r)| (*r, i)).collect();
    let mut got = Vec::with_capacity(found.len());
    let mut want = Vec::with_capacity(found.len());
    let mut seen: HashSet<(usize, usize)> = HashSet::new();
    for &(r, c, v) in found {
        if let Some(&i) = pos.get(&r) {
            if let Some(e) = reference[i].get(c) {
                got.push(v);
                want.push(*e);
                seen.insert((r, c));
            }
        }
    }
    let expected: usize = reference.iter().map(Vec::len).sum();
    let c = compare(&got, &want, dtype);
    Check {
        ok: c.ok && seen.len() == expected,
        max_rel: c.max_rel,
        compared: got.len(),
    }
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
/// `rows` are sampled.
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
    let backend = rank.backend_with(how.cuda.clone())?;
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
            .map_err(|e| e.to_string())
    };
    let times = if how.graph {
        // One run warms up outside the capture (NCCL connects lazily, kernels compile,
        // plans build), then one is captured with its outputs freed inside the graph.
        let replay =
            weave_executor::Replay::capture(exe.program(), &backend, comm, &inputs, &config)
                .map_err(|e| e.to_string())?;
        rank.barrier()?;
        rank.time(&backend, warmup, iters, || {
            replay.launch().map_err(err("graph launch"))
        })?
    } else {
        rank.time(&backend, warmup, iters, || {
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
        let traced = rank.backend_with(CudaOptions {
            trace: true,
            ..how.cuda.clone()
        })?;
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

/// A one-time all-gather of bytes between the ranks (threads) of a [`World`].
pub struct Exchange {
    values: Mutex<Vec<Option<Vec<u8>>>>,
}

impl Exchange {
    /// An exchange for `ranks` ranks.
    pub fn new(ranks: usize) -> Arc<Exchange> {
        Arc::new(Exchange {
            values: Mutex::new(vec![None; ranks]),
        })
    }

    /// Hands `value` to every rank and returns every rank's, in rank order.
    pub fn all_gather(&self, rank: &Rank, value: Vec<u8>) -> Result<Vec<Vec<u8>>, JobError> {
        let put = |v: &mut Vec<Option<Vec<u8>>>| match v.get_mut(rank.rank) {
            Some(slot) => {
                *slot = Some(value);
                Ok(())
            }
            None => Err(format!(
                "rank {}: an exchange of {} ranks",
                rank.rank,
                v.len()
            )),
        };
        put(&mut self.values.lock().unwrap_or_else(|p| p.into_inner()))?;
        rank.barrier()?;
        let values = self.values.lock().unwrap_or_else(|p| p.into_inner());
        values
            .iter()
            .enumerate()
            .map(|(r, v)| v.clone().ok_or_else(|| format!("rank {r} gave no value")))
            .collect()
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
            let pc = PeerCopy::new(comm, hub.clone(), rank.gpu.clone());
            time_program(rank, &pc, exe, how, seeds, warmup, iters, rows)
        }
        CopyEngine::Windows(exchange, options) => {
            let mut gathered = None;
            let ipc = IpcCopy::connect(comm, rank.gpu.clone(), *options, |card| {
                let all = exchange.all_gather(rank, card);
                gathered = all.as_ref().err().cloned();
                all.map_err(weave_comm::CommError::Bootstrap)
            })
            .map_err(|e| gathered.unwrap_or_else(|| format!("copy-engine windows: {e}")))?;
            let timing = time_program(rank, &ipc, exe, how, seeds, warmup, iters, rows);
            if timing.is_err() {
                // A stream may still wait on the windows: never free memory the GPU may touch.
                std::mem::forget(ipc);
            }
            timing
        }
    }
}

/// Host microseconds per post of a small (4096-element) allreduce, over `posts` posts
/// issued back to back (the GPU work is awaited afterwards): what the communicator costs the
/// host per collective.
pub fn host_post_us(rank: &Rank, posts: usize) -> Result<f64, JobError> {
    let backend = &rank.backend;
    let buf = rank.random_plain(backend, DType::BF16, &[4096], 31)?;
    let main = backend.stream(StreamKey::Main).map_err(err("stream"))?;
    let post = || {
        let op = CommOp::Allreduce {
            input: buf.clone(),
            output: buf.clone(),
            op: RedOp::Sum,
        };
        rank.post_world("host-cost probe", op, &main)
    };
    post()?;
    backend.synchronize().map_err(err("probe"))?;
    rank.barrier()?;
    let start = Instant::now();
    for _ in 0..posts {
        post()?;
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / posts.max(1) as f64;
    backend.synchronize().map_err(err("probe"))?;
    Ok(us)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_linear_reference_is_the_dot_product_of_hashed_rows() {
        let (k, n) = (5, 3);
        let r = linear_reference(&[1, 3], k, n, 1, 2);
        let want = |row: usize, col: usize| -> f64 {
            (0..k)
                .map(|j| hash_value(1, (row * k + j) as u64) * hash_value(2, (col * k + j) as u64))
                .sum()
        };
        assert_eq!(r.len(), 2);
        for (got, row) in r.iter().zip([1usize, 3]) {
            let expected: Vec<f64> = (0..n).map(|col| want(row, col)).collect();
            assert_eq!(got, &expected);
        }
    }

    #[test]
    fn a_sampled_check_needs_every_column_and_the_tolerance() {
        let reference = vec![vec![1.0, 2.0], vec![3.0, 4.0]];
        let rows = [5usize, 9];
        let all = [
            (5, 0, 1.0),
            (5, 1, 2.0),
            (9, 0, 3.0),
            (9, 1, 4.0),
            (9, 1, 4.0),
        ];
        let c = check_sample(&all, &rows, &reference, DType::BF16);
        assert!(c.ok);
        assert_eq!(c.compared, 5);
        // A missing column fails; so does a wrong value.
        assert!(!check_sample(&all[..3], &rows, &reference, DType::BF16).ok);
        let mut wrong = all.to_vec();
        wrong[1].2 = 2.5;
        assert!(!check_sample(&wrong, &rows, &reference, DType::BF16).ok);
    }
}
