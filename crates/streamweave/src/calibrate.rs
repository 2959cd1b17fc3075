//! Measuring a machine for the chunk-count model ([`crate::chunks`]): a [`World`] of ranks (one
//! persistent thread per GPU with its CUDA backend and NCCL communicator) that runs the same
//! job on every rank, CUDA-event timing (median over iterations; callers take the maximum
//! over ranks), device buffers filled from a counter-based hash of their *global* indices,
//! the GEMM and collective probes, and [`calibrate`], which `weave calibrate` runs. The
//! benchmark harness (the `weave-bench` package) builds on the same world.

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use weave_comm::nccl::{Nccl, NcclId, NcclOptions};
use weave_comm::{Collective, CommOp, Communicator, P2p, RedOp};
use weave_cuda::{wait_event, CudaError, Gpu, GpuStream};
use weave_executor::{Backend, CudaBackend, CudaOptions, DeviceTensor, StreamKey};
use weave_ir::DType;

pub use crate::threads::{Barrier, BarrierError};

use crate::chunks::Calibration;
use crate::gpu::backend_for;

mod world;
pub use world::World;

/// A job's error on a [`World`]: what failed, and on which rank when the world says so
/// ("rank 1: GEMM: ..."). Made from the message of whatever failed (a CUDA, NCCL or run
/// error, a barrier, a reply that did not come).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct JobError(pub String);

impl From<String> for JobError {
    fn from(message: String) -> JobError {
        JobError(message)
    }
}

impl From<JobError> for String {
    fn from(e: JobError) -> String {
        e.0
    }
}

impl From<&str> for JobError {
    fn from(message: &str) -> JobError {
        JobError(message.to_string())
    }
}

/// How a [`World`] is opened.
#[derive(Clone, Debug)]
pub struct WorldOptions {
    /// Ranks, one GPU each.
    pub ranks: usize,
    /// The GPU of each rank (`devices[r]` for rank `r`); empty: GPU `r` for rank `r`.
    pub devices: Vec<usize>,
    /// How long any wait (device, barrier, NCCL) may take.
    pub timeout: Duration,
    /// The NCCL communicator's options.
    pub nccl: NcclOptions,
}

/// How [`Rank::time`] times its calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// After a host barrier, every timed call issued back to back between CUDA events on the
    /// main stream ([`weave_executor::time_back_to_back`], the timer of `weave run --iters`
    /// and of the tuner).
    BackToBack,
    /// One call at a time: each after every rank's GPU went idle and every rank reached a host
    /// barrier, between two CUDA events on the main stream (the kernel benchmark's method,
    /// matching PyTorch's synchronize-then-time there).
    Each,
}

/// One rank of a [`World`], as a job sees it.
pub struct Rank {
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub world: usize,
    /// The GPU.
    pub gpu: Gpu,
    /// The default backend (default [`CudaOptions`] with the world's timeout).
    pub backend: CudaBackend,
    /// The world's communicator.
    pub comm: Arc<Nccl<DeviceTensor>>,
    /// The host barrier of the world.
    pub barrier: Arc<Barrier>,
    /// The world's timeout.
    pub timeout: Duration,
}

fn err<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> JobError + '_ {
    move |e| JobError(format!("{what}: {e}"))
}

impl Rank {
    /// A backend on this rank's GPU with `options` (the world's timeout), checking the
    /// communicator's asynchronous errors while it waits.
    pub fn backend_with(&self, options: CudaOptions) -> Result<CudaBackend, JobError> {
        let options = CudaOptions {
            timeout: self.timeout,
            ..options
        };
        backend_for(&self.gpu, options, &self.comm).map_err(err("backend"))
    }

    /// Posts `op` over the whole world on `stream` through the world's communicator.
    pub fn post_world(
        &self,
        label: &str,
        op: CommOp<DeviceTensor>,
        stream: &GpuStream,
    ) -> Result<(), JobError> {
        let collective = Collective {
            label: label.to_string(),
            team: (0..self.world).collect(),
            op,
        };
        self.comm.post(collective, stream).map_err(err(label))
    }

    /// Waits for every rank (host side).
    pub fn barrier(&self) -> Result<(), JobError> {
        self.barrier
            .wait(self.timeout)
            .map_err(|e| JobError(e.to_string()))
    }

    /// Times `f`, which enqueues work on `backend`'s main stream (and streams joined back to
    /// it), as `timing` says: `warmup` untimed calls, then `iters` timed ones. Returns the
    /// milliseconds of every timed call.
    pub fn time(
        &self,
        timing: Timing,
        backend: &CudaBackend,
        warmup: usize,
        iters: usize,
        mut f: impl FnMut() -> Result<(), JobError>,
    ) -> Result<Vec<f64>, JobError> {
        // One call at a time records its events on the main stream.
        let main = match timing {
            Timing::BackToBack => None,
            Timing::Each => Some(backend.stream(StreamKey::Main).map_err(err("stream"))?),
        };
        for _ in 0..warmup {
            f()?;
        }
        backend.synchronize().map_err(err("warm-up"))?;
        match main {
            None => {
                self.barrier()?;
                let times = weave_executor::time_back_to_back(backend, iters, |_| {
                    f().map_err(|e| weave_executor::ExecError::Program(e.0))
                })
                .map_err(err("timed runs"))?;
                backend.synchronize().map_err(err("timed runs"))?;
                Ok(times.iter().map(|d| d.as_secs_f64() * 1e3).collect())
            }
            Some(main) => self.time_each(backend, &main, iters, f),
        }
    }

    /// The timed calls of [`Timing::Each`]: `iters` calls of `f`, each after every rank's GPU
    /// went idle and every rank reached a host barrier, between two CUDA events on `main`.
    fn time_each(
        &self,
        backend: &CudaBackend,
        main: &GpuStream,
        iters: usize,
        mut f: impl FnMut() -> Result<(), JobError>,
    ) -> Result<Vec<f64>, JobError> {
        let mut out = Vec::with_capacity(iters);
        for i in 0..iters {
            self.barrier()?;
            let start = self.gpu.new_event(true).map_err(err("event"))?;
            let end = self.gpu.new_event(true).map_err(err("event"))?;
            main.record(&start).map_err(err("event record"))?;
            f()?;
            main.record(&end).map_err(err("event record"))?;
            let comm = self.comm.clone();
            wait_event(&end, self.timeout, || {
                comm.async_error().map(|e| CudaError::Driver {
                    call: "communicator",
                    message: e.to_string(),
                })
            })
            .map_err(err(&format!("timed iteration {i}")))?;
            out.push(start.elapsed_ms(&end).map_err(err("event time"))? as f64);
            // Every stream is idle: frees the buffers dropped during the call.
            backend
                .synchronize()
                .map_err(err(&format!("timed iteration {i}")))?;
        }
        Ok(out)
    }

    /// A buffer of `sizes` filled with hash values of the *global* row-major index that
    /// `tables` gives each position (see [`hash_value`]): `tables[a][i]` is the global
    /// offset (index × global stride) of position `i` along axis `a`, or `u64::MAX` for
    /// padding (filled with zero).
    pub fn fill(
        &self,
        backend: &CudaBackend,
        dtype: DType,
        tables: &[Vec<u64>],
        seed: u64,
    ) -> Result<DeviceTensor, JobError> {
        if tables.len() > 4 {
            return Err(JobError(format!(
                "random inputs of rank {} are not supported (at most 4 axes)",
                tables.len()
            )));
        }
        let kind: u64 = match dtype {
            DType::BF16 => 0,
            DType::F32 => 1,
            other => {
                return Err(JobError(format!(
                    "random inputs of {other} are not supported"
                )))
            }
        };
        let sizes: Vec<usize> = tables.iter().map(Vec::len).collect();
        let out = backend.empty(dtype, &sizes).map_err(err("allocate"))?;
        let n: usize = sizes.iter().product();
        if n == 0 {
            return Ok(out);
        }
        // Pad to four axes on the left with one-position tables of offset 0.
        let mut padded: Vec<Vec<u64>> = vec![vec![0]; 4 - tables.len()];
        padded.extend(tables.iter().cloned());
        let mut flat: Vec<u8> = Vec::new();
        let mut offsets = Vec::new();
        for t in &padded {
            offsets.push((flat.len() / 8) as u64);
            for v in t {
                flat.extend_from_slice(&v.to_le_bytes());
            }
        }
        let main = backend.stream(StreamKey::Main).map_err(err("stream"))?;
        let table = self.gpu.alloc(flat.len(), &main).map_err(err("allocate"))?;
        self.gpu
            .upload(table.ptr(), &flat, &main)
            .map_err(err("upload"))?;
        let kernel = self
            .gpu
            .kernel("weave_fill_hash", FILL_KERNEL)
            .map_err(err("fill kernel"))?;
        let args = [
            out.ptr(),
            table.ptr(),
            n as u64,
            padded[1].len() as u64,
            padded[2].len() as u64,
            padded[3].len() as u64,
            offsets[1],
            offsets[2],
            offsets[3],
            seed,
            kind,
        ];
        let block = 256u32;
        let grid = n.div_ceil(256).min(65535 * 16) as u32;
        self.gpu
            .launch(&main, &kernel, grid, block, &args)
            .map_err(err("fill"))?;
        table.free_on(&main).map_err(err("free"))?;
        backend.synchronize().map_err(err("fill"))?;
        Ok(out)
    }

    /// A buffer of `sizes` filled as if it were a whole global tensor (seeded by `seed`).
    pub fn random_plain(
        &self,
        backend: &CudaBackend,
        dtype: DType,
        sizes: &[usize],
        seed: u64,
    ) -> Result<DeviceTensor, JobError> {
        let identity: Vec<Vec<usize>> = sizes.iter().map(|&n| (0..n).collect()).collect();
        self.fill(backend, dtype, &offset_tables(sizes, &identity), seed)
    }
}

/// Per-axis tables of global offsets (index × global row-major stride; `u64::MAX` for padding).
pub fn offset_tables(global: &[usize], indices: &[Vec<usize>]) -> Vec<Vec<u64>> {
    let mut stride = vec![1usize; global.len()];
    for a in (0..global.len().saturating_sub(1)).rev() {
        stride[a] = stride[a + 1] * global[a + 1];
    }
    indices
        .iter()
        .enumerate()
        .map(|(a, idx)| {
            idx.iter()
                .map(|&i| {
                    if i < global[a] {
                        (i * stride[a]) as u64
                    } else {
                        u64::MAX
                    }
                })
                .collect()
        })
        .collect()
}

/// The device twin of [`hash_value`]: one thread per element (grid-stride), four axes.
const FILL_KERNEL: &str = r#"
__device__ unsigned long long weave_mix(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
extern "C" __global__ void weave_fill_hash(
    unsigned long long out, unsigned long long table, unsigned long long n,
    unsigned long long s1, unsigned long long s2, unsigned long long s3,
    unsigned long long o1, unsigned long long o2, unsigned long long o3,
    unsigned long long seed, unsigned long long kind) {
  const unsigned long long* t = (const unsigned long long*)table;
  const unsigned long long pad = 0xffffffffffffffffULL;
  for (unsigned long long e = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; e < n;
       e += (unsigned long long)gridDim.x * blockDim.x) {
    unsigned long long r = e;
    unsigned long long i3 = r % s3; r /= s3;
    unsigned long long i2 = r % s2; r /= s2;
    unsigned long long i1 = r % s1; r /= s1;
    unsigned long long i0 = r;
    unsigned long long a = t[i0], b = t[o1 + i1], c = t[o2 + i2], d = t[o3 + i3];
    float v = 0.0f;
    if (a != pad && b != pad && c != pad && d != pad) {
      unsigned long long g = a + b + c + d;
      unsigned long long z = weave_mix(g + seed * 0x9E3779B97F4A7C15ULL);
      float mag = (1.0f + (float)((z >> 53) & 127ULL) / 128.0f) / (float)(2ULL << ((z >> 60) & 3ULL));
      v = (z >> 63) ? -mag : mag;
    }
    if (kind == 0) {
      ((unsigned short*)out)[e] = (unsigned short)(__float_as_uint(v) >> 16);
    } else {
      ((float*)out)[e] = v;
    }
  }
}
"#;

/// The value of global element `g` of the tensor seeded by `seed`, from the splitmix64
/// finaliser `z` of `g`: a random sign, a random exponent (magnitudes in [1/16, 1)) and 7
/// random mantissa bits, `±(1 + k/128) / 2^(1..=4)` — never zero, exact in bf16, f16 and
/// f32, and with every mantissa bit of a bf16 in play (a GEMM's speed depends on the bits
/// it multiplies: values of a few bits, like odd sixteenths, draw less power and run up to
/// 5–8% faster on an H100 than the inputs `weave run` and PyTorch generate).
pub fn hash_value(seed: u64, g: u64) -> f64 {
    let mut z = g.wrapping_add(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let k = ((z >> 53) & 127) as f64;
    let scale = (2u64 << ((z >> 60) & 3)) as f64;
    let mag = (1.0 + k / 128.0) / scale;
    if z >> 63 == 1 {
        -mag
    } else {
        mag
    }
}

/// The median of `v` (0 for none).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// Times one GEMM `out[m, n] = x[m, k] · w[n, k]ᵀ` (bf16) on `rank`.
pub fn time_gemm(
    rank: &Rank,
    mnk: (usize, usize, usize),
    warmup: usize,
    iters: usize,
) -> Result<Vec<f64>, JobError> {
    let backend = &rank.backend;
    let gemm = Gemm::new(rank, mnk)?;
    let main = backend.stream(StreamKey::Main).map_err(err("stream"))?;
    rank.time(Timing::BackToBack, backend, warmup, iters, || {
        gemm.launch(backend, &main)
    })
}

/// The bf16 operands of one GEMM `out[m, n] = x[m, k] · w[n, k]ᵀ` on a rank.
struct Gemm {
    x: DeviceTensor,
    w: DeviceTensor,
    out: DeviceTensor,
}

impl Gemm {
    /// Random `x` and `w` and an empty `out` of sizes `(m, n, k)` on `rank`.
    fn new(rank: &Rank, (m, n, k): (usize, usize, usize)) -> Result<Gemm, JobError> {
        let backend = &rank.backend;
        Ok(Gemm {
            x: rank.random_plain(backend, DType::BF16, &[m, k], 11)?,
            w: rank.random_plain(backend, DType::BF16, &[n, k], 12)?,
            out: backend
                .empty(DType::BF16, &[m, n])
                .map_err(err("allocate"))?,
        })
    }

    /// Launches the GEMM on `stream`.
    fn launch(&self, backend: &CudaBackend, stream: &GpuStream) -> Result<(), JobError> {
        backend
            .linear("gemm", &self.x, &self.w, None, &self.out, false, stream)
            .map_err(|e| JobError(e.to_string()))
    }
}

/// A collective to time alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommKind {
    /// Allreduce of `elems` bf16 in place.
    Allreduce,
    /// Allgather of `elems / ranks` per rank into `elems`.
    Allgather,
    /// Reduce-scatter of `elems` into `elems / ranks`.
    ReduceScatter,
    /// The P2P ring: ranks − 1 steps, each sending this rank's `elems / ranks` block to
    /// rank − i and receiving rank + i's.
    Ring,
}

/// Times one collective of `elems` bf16 elements (see [`CommKind`]) over every rank.
pub fn time_comm(
    rank: &Rank,
    kind: CommKind,
    elems: usize,
    warmup: usize,
    iters: usize,
) -> Result<Vec<f64>, JobError> {
    let backend = &rank.backend;
    let d = rank.world;
    let block = elems / d.max(1);
    let full = rank.random_plain(backend, DType::BF16, &[d, block], 21)?;
    let part = rank.random_plain(backend, DType::BF16, &[block], 22)?;
    let main = backend.stream(StreamKey::Main).map_err(err("stream"))?;
    let label = format!("{kind:?}");
    let post = |op: CommOp<DeviceTensor>| rank.post_world(&label, op, &main);
    rank.time(Timing::BackToBack, backend, warmup, iters, || match kind {
        CommKind::Allreduce => post(CommOp::Allreduce {
            input: full.clone(),
            output: full.clone(),
            op: RedOp::Sum,
        }),
        CommKind::Allgather => post(CommOp::Allgather {
            input: part.clone(),
            output: full.clone(),
        }),
        CommKind::ReduceScatter => post(CommOp::ReduceScatter {
            input: full.clone(),
            output: part.clone(),
            op: RedOp::Sum,
        }),
        CommKind::Ring => {
            for i in 1..d {
                let from = (rank.rank + i) % d;
                let to = (rank.rank + d - i) % d;
                let slot = backend
                    .chunk(&full, 0, d, from)
                    .map_err(|e| format!("ring buffer: {e}"))?;
                rank.comm
                    .post_p2p(
                        format!("ring step {i}"),
                        vec![
                            P2p::Recv {
                                peer: from,
                                buffer: slot,
                            },
                            P2p::Send {
                                peer: to,
                                buffer: part.clone(),
                            },
                        ],
                        &main,
                    )
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        }
    })
}

/// Times the GEMM of [`time_gemm`] on the main stream and the allreduce of `elems` bf16 of
/// [`time_comm`] on a pool stream at the same time (both start together; the time ends when
/// both are done): how much they slow each other.
pub fn time_overlap(
    rank: &Rank,
    mnk: (usize, usize, usize),
    elems: usize,
    warmup: usize,
    iters: usize,
) -> Result<Vec<f64>, JobError> {
    let backend = &rank.backend;
    let gemm = Gemm::new(rank, mnk)?;
    let buf = rank.random_plain(backend, DType::BF16, &[elems], 21)?;
    let main = backend.stream(StreamKey::Main).map_err(err("stream"))?;
    let side = backend.stream(StreamKey::Pool(0)).map_err(err("stream"))?;
    rank.time(Timing::BackToBack, backend, warmup, iters, || {
        let fork = backend.record_event(&main);
        backend.wait_event(&side, &fork, "fork");
        gemm.launch(backend, &main)?;
        let op = CommOp::Allreduce {
            input: buf.clone(),
            output: buf.clone(),
            op: RedOp::Sum,
        };
        rank.post_world("overlapped allreduce", op, &side)?;
        let join = backend.record_event(&side);
        backend.wait_event(&main, &join, "join");
        Ok(())
    })
}

/// Measures this machine for the chunk-count model on `world`: bf16 GEMM throughput (8192 ×
/// 8192 × 8192) and the fixed cost of a small GEMM, allreduce bus bandwidth (128 MiB) and
/// the latency of a small one, point-to-point bandwidth over the ring, and how much a GEMM
/// and an allreduce running at once slow each other.
pub fn calibrate(world: &World) -> Result<Calibration, JobError> {
    let (w, i) = (3, 10);
    let max = |v: Vec<Vec<f64>>| v.iter().map(|t| median(t)).fold(0.0f64, f64::max);
    let big = (8192usize, 8192usize, 8192usize);
    let big_ms = max(world.run(move |r| time_gemm(r, big, w, i))?);
    let small = (1024usize, 1024usize, 1024usize);
    let small_ms = max(world.run(move |r| time_gemm(r, small, w, i))?);
    let tflops = 2.0 * (big.0 * big.1 * big.2) as f64 / (big_ms * 1e-3) / 1e12;
    // The small GEMM's time beyond its share at full throughput is its fixed cost.
    let small_ideal_ms = 2.0 * (small.0 * small.1 * small.2) as f64 / (tflops * 1e12) * 1e3;
    let gemm_overhead_us = ((small_ms - small_ideal_ms) * 1e3).max(1.0);
    let n = world.ranks() as f64;
    let elems = 64usize << 20; // 128 MiB of bf16
    let ar_ms = max(world.run(move |r| time_comm(r, CommKind::Allreduce, elems, w, i))?);
    let busbw = 2.0 * (n - 1.0) / n * (elems * 2) as f64 / (ar_ms * 1e-3) / 1e9;
    let tiny = 4096usize;
    let tiny_ms = max(world.run(move |r| time_comm(r, CommKind::Allreduce, tiny, w, i))?);
    let ring_ms = max(world.run(move |r| time_comm(r, CommKind::Ring, elems, w, i))?);
    // Contention: GEMM and allreduce at once, against the longer of the two alone.
    let both_ms = max(world.run(move |r| time_overlap(r, big, elems, w, i))?);
    let contention = (both_ms / big_ms.max(ar_ms) - 1.0).clamp(0.0, 1.0);
    // Each ring step moves one block per rank; steps run one after another.
    let block_bytes = (elems / world.ranks()) as f64 * 2.0;
    let p2p = block_bytes * (n - 1.0) / (ring_ms * 1e-3) / 1e9;
    Ok(Calibration {
        gemm_tflops: tflops,
        busbw_gbs: busbw,
        p2p_gbs: p2p,
        gemm_overhead_us,
        comm_latency_us: (tiny_ms * 1e3).max(1.0),
        contention,
        source: format!(
            "measured on {} x {} ({} ranks)",
            world.ranks(),
            world_gpu_name(world).unwrap_or_else(|_| "GPU".into()),
            world.ranks()
        ),
        ..Calibration::default()
    })
}

/// The name of rank 0's GPU.
pub fn world_gpu_name(world: &World) -> Result<String, JobError> {
    Ok(world
        .run(|r| Ok(r.gpu.name()))?
        .into_iter()
        .next()
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    use std::collections::HashSet;

    #[test]
    fn hash_values_are_exact_in_bf16_never_zero_and_use_every_mantissa_bit() {
        let v: Vec<f64> = (0..16384).map(|g| hash_value(7, g)).collect();
        assert!(v
            .iter()
            .all(|x| *x != 0.0 && x.abs() < 1.0 && x.abs() >= 1.0 / 16.0));
        // Exact in bf16: rounding to it changes nothing.
        assert!(v
            .iter()
            .all(|x| weave_executor::dense::round_to(DType::BF16, *x) == *x));
        // Both signs, four exponents and all 128 mantissas of a bf16 occur.
        let distinct: HashSet<u64> = v.iter().map(|x| x.to_bits()).collect();
        assert_eq!(distinct.len(), 2 * 4 * 128, "every value occurs");
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.05, "mean {mean}");
        assert_ne!(hash_value(7, 3), hash_value(8, 3), "seeds differ");
    }

    #[test]
    fn offset_tables_are_global_offsets_and_padding_is_marked() {
        // A [4, 6] tensor; a rank holding rows 2..4 (and a padded third row) and columns 3..6.
        let t = offset_tables(&[4, 6], &[vec![2, 3, 4], vec![3, 4, 5]]);
        assert_eq!(t[0], vec![12, 18, u64::MAX]);
        assert_eq!(t[1], vec![3, 4, 5]);
    }

    #[test]
    fn a_barrier_times_out_and_a_broken_one_fails_at_once() {
        let b = Barrier::new(2);
        let e = b.wait(Duration::from_millis(20)).unwrap_err();
        assert!(
            matches!(
                e,
                BarrierError::TimedOut {
                    parties: 2,
                    millis: 20,
                    arrived: 1
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "a barrier of 2 ranks timed out after 20 ms (1 arrived)"
        );
        // A timed-out barrier stays broken.
        let e = b.wait(Duration::from_secs(5)).unwrap_err().to_string();
        assert!(e.contains("broken") && e.contains("timed out"), "{e}");
        let b = Barrier::new(2);
        b.break_with("rank 1 failed");
        let e = b.wait(Duration::from_secs(5)).unwrap_err();
        assert_eq!(
            e,
            BarrierError::Broken {
                why: "rank 1 failed".into()
            }
        );
        assert_eq!(e.to_string(), "the barrier was broken: rank 1 failed");
    }

    #[test]
    fn a_barrier_releases_every_party_of_every_generation() {
        let b = Arc::new(Barrier::new(3));
        let counter = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let (b, counter) = (b.clone(), counter.clone());
                std::thread::spawn(move || {
                    for round in 0..50 {
                        counter.fetch_add(1, Ordering::SeqCst);
                        b.wait(Duration::from_secs(10)).unwrap();
                        // Nobody leaves a round before all three arrived in it.
                        assert!(counter.load(Ordering::SeqCst) >= 3 * (round + 1));
                        b.wait(Duration::from_secs(10)).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(counter.load(Ordering::SeqCst), 150);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }
}
