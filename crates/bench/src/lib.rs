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
use std::time::Instant;

use weave_comm::{CommOp, RedOp};
use weave_executor::reference::compare;
use weave_executor::{Backend, StreamKey};
use weave_ir::DType;

pub use streamweave::calibrate::{
    calibrate, hash_value, median, offset_tables, time_comm, time_gemm, time_overlap,
    world_gpu_name, Barrier, CommKind, JobError, Rank, Timing, World, WorldOptions,
};
pub use streamweave::measure::{
    random_input, run_program, sample_rows, time_program, CopyEngine, Exchange, ProgramRun,
    ProgramTiming,
};

/// `what: error`, for `map_err`.
fn err<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> JobError + '_ {
    move |e| JobError(format!("{what}: {e}"))
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
    times_hashed(&xs, n, seed_w)
}

/// `xs · Wᵀ` in f64 for the rows `xs` (each of length k) and `W [n, k]` hashed from
/// `seed_w`, the output columns spread over every core.
pub fn times_hashed(xs: &[Vec<f64>], n: usize, seed_w: u64) -> Vec<Vec<f64>> {
    let k = xs.first().map_or(0, Vec::len);
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(n.max(1));
    let per = n.div_ceil(threads.max(1)).max(1);
    let parts: Vec<Vec<Vec<f64>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .step_by(per)
            .map(|lo| {
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
    let mut out = vec![Vec::with_capacity(n); xs.len()];
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
