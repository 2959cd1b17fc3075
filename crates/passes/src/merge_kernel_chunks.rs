//! `merge-kernel-chunks`: a stream loop that only launches generated kernels, on chunks too
//! small to pay for themselves, runs once, one launch per kernel over the whole tensors.
//!
//! Chunking pays for itself when one chunk's communication or GEMM hides behind another's
//! work. A loop whose every iteration is bandwidth-bound kernels has no such partner, and
//! each chunk adds a launch, a grid tail and (in an eager run) the host's per-chunk cost; a
//! column reduction cut into column chunks also reads strided views. On small chunks that
//! cost shows: at 4096² on an H100, SiLU and softmax in 4 chunks took 3–8% longer than one
//! launch, the column sum 15% (docs/benchmarks.md). On large chunks it does not: at
//! 16384 × 8192 four chunks on two streams run within 1% of one launch. So a kernel-only
//! loop is merged when each of its chunks moves fewer than [`MERGE_BELOW_BYTES`] (the bytes
//! its kernels read and write per iteration, on one rank), and otherwise left as the schedule
//! wrote it, its intermediates in chunk slots.
//!
//! Contract
//! * Input: a host program as `lower-to-host` leaves it (`Ir::Host`, no stream management,
//!   no allocation of loop-local buffers).
//! * Output: every top-level `ForLoop` that is *kernel-only* is replaced, in place, by its
//!   body with the chunk views removed: each `LaunchKernel` names the tensors the views were
//!   cut from. A loop is kernel-only when it starts at 0 and its body holds nothing but
//!   `LaunchKernel`s and `ShardByStream` views that each cut a tensor defined outside the
//!   loop into exactly the loop's number of chunks, indexed by the loop index (or by the
//!   rank-rotated index of a `swizzle1d`, `(rank + i) % s`, which visits every chunk once
//!   too), with no `holds`. So the views of all iterations tile each tensor exactly, and the
//!   merged launches compute exactly what the iterations did. Its chunks must also be small:
//!   the sizes of the tensors its kernels read and write, evaluated with the signature's
//!   parameter values, add up to fewer than the pass's `below_bytes` per iteration; a size
//!   that does not evaluate (no signature, a run-time value) keeps the loop.
//! * Left alone: a loop with a communication, a wait, a GEMM (`Matmul`, `Linear`: a GEMM
//!   chunk on one stream overlaps the next chunk's epilogue kernel, which measured faster
//!   than one launch), a nested loop, an allocation, or a view of a view.
//! * Memory: an intermediate between two kernels of a merged loop is allocated whole by
//!   `allocate-and-deallocate` instead of in `numberOfStreams` chunk slots. A user who wants
//!   the chunk slots drops the pass (`--passes=-merge-kernel-chunks`).
//! * Idempotent: a merged loop is gone; a second run finds nothing to merge.

use std::collections::HashMap;

use weave_host_ir::{HostProgram, HostScalar, HostTensorId, ScalarId, Stmt, StmtId};
use weave_ir::ScalarOp;

use crate::pass::{Changed, HostPass, Pass, PassError};

/// Below this many bytes read and written per chunk (on one rank), a kernel-only stream loop
/// is merged: 64 MiB, about 20 µs of an H100's memory bandwidth, four times a launch and its
/// tail. The kernel benchmark's chunks fall on either side: 16–24 MiB at 4096² (merged,
/// where chunks cost 3–16%), 128–192 MiB at 16384 × 8192 (kept, where they cost nothing).
pub const MERGE_BELOW_BYTES: u64 = 64 << 20;

/// The `merge-kernel-chunks` pass; see the module documentation for its contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MergeKernelChunks {
    /// A kernel-only loop whose chunks each move fewer bytes than this is merged.
    pub below_bytes: u64,
}

impl Default for MergeKernelChunks {
    fn default() -> MergeKernelChunks {
        MergeKernelChunks {
            below_bytes: MERGE_BELOW_BYTES,
        }
    }
}

impl Pass for MergeKernelChunks {
    fn name(&self) -> &'static str {
        "merge-kernel-chunks"
    }

    fn summary(&self) -> &'static str {
        "host program -> host program: a stream loop that only launches generated kernels, on chunks under 64 MiB, runs once over whole tensors"
    }
}

impl HostPass for MergeKernelChunks {
    fn run(&self, p: &mut HostProgram) -> Result<Changed, PassError> {
        Ok(self.run_on(p))
    }
}

impl MergeKernelChunks {
    /// Runs the pass on a host program directly; [`HostPass::run`] forwards here.
    pub fn run_on(&self, p: &mut HostProgram) -> Changed {
        let old = std::mem::take(&mut p.top_level);
        let mut new = Vec::with_capacity(old.len());
        let mut changed = Changed::No;
        for sid in old {
            match kernel_only_body(p, sid, self.below_bytes) {
                Some(whole) => {
                    changed = Changed::Yes;
                    let Some(Stmt::ForLoop { body, .. }) = p.stmts.remove(sid) else {
                        unreachable!("kernel_only_body accepts loops only");
                    };
                    for s in body {
                        match &mut p.stmts[s] {
                            Stmt::ShardByStream { .. } => {
                                p.stmts.remove(s);
                            }
                            Stmt::LaunchKernel {
                                inputs, outputs, ..
                            } => {
                                for t in inputs.iter_mut().chain(outputs.iter_mut()) {
                                    if let Some(w) = whole.get(t) {
                                        *t = *w;
                                    }
                                }
                                new.push(s);
                            }
                            _ => unreachable!("kernel_only_body accepts views and launches only"),
                        }
                    }
                }
                None => new.push(sid),
            }
        }
        p.top_level = new;
        changed
    }
}

/// For a kernel-only loop (module documentation), the tensor each of its chunk views was cut
/// from; `None` for any other statement.
fn kernel_only_body(
    p: &HostProgram,
    sid: StmtId,
    below_bytes: u64,
) -> Option<HashMap<HostTensorId, HostTensorId>> {
    let Stmt::ForLoop {
        index,
        start,
        stop,
        body,
    } = &p.stmts[sid]
    else {
        return None;
    };
    if constant(p, *start)? != 0 {
        return None;
    }
    let extent = constant(p, *stop)?;
    let mut whole = HashMap::new();
    let mut launches = 0;
    let mut bytes = 0u64;
    for s in body {
        match &p.stmts[*s] {
            Stmt::ShardByStream {
                input,
                chunks,
                index: view_index,
                holds: None,
                output,
                ..
            } => {
                let tiles = constant(p, *chunks) == Some(extent)
                    && visits_every_chunk(p, *view_index, *index, extent);
                if !tiles || whole.contains_key(input) {
                    return None;
                }
                whole.insert(*output, *input);
            }
            Stmt::LaunchKernel {
                inputs, outputs, ..
            } => {
                launches += 1;
                for t in inputs.iter().chain(outputs) {
                    bytes = bytes.saturating_add(tensor_bytes(p, *t)?);
                }
            }
            _ => return None,
        }
    }
    (launches > 0 && bytes < below_bytes).then_some(whole)
}

/// The bytes of `t` on one rank, its sizes evaluated with the signature's parameter values;
/// `None` when a size does not evaluate.
fn tensor_bytes(p: &HostProgram, t: HostTensorId) -> Option<u64> {
    let tensor = &p.tensors[t];
    let lookup = |name: &str| p.signature.as_ref().and_then(|s| s.param(name));
    let mut n = tensor.dtype.size_bytes() as u64;
    for s in &tensor.sizes {
        let HostScalar::Value(v) = &p.scalars[*s] else {
            return None;
        };
        n = n.saturating_mul(u64::try_from(v.eval(&lookup)?).ok()?);
    }
    Some(n)
}

/// The value of a loop-invariant constant scalar.
fn constant(p: &HostProgram, s: ScalarId) -> Option<i64> {
    match &p.scalars[s] {
        HostScalar::Value(v) => v.as_const(),
        _ => None,
    }
}

/// Whether `view_index`, over the iterations `0..extent` of the loop indexed by `index`, takes
/// every value of `0..extent` once: the index itself, or `(x + index) % extent` for a
/// loop-invariant `x` (a `swizzle1d`'s rank rotation).
fn visits_every_chunk(p: &HostProgram, view_index: ScalarId, index: ScalarId, extent: i64) -> bool {
    if view_index == index {
        return true;
    }
    let HostScalar::Binary(ScalarOp::Mod, sum, n) = &p.scalars[view_index] else {
        return false;
    };
    if constant(p, *n) != Some(extent) {
        return false;
    }
    let HostScalar::Binary(ScalarOp::Add, a, b) = &p.scalars[*sum] else {
        return false;
    };
    let invariant = |s: ScalarId| matches!(p.scalars[s], HostScalar::Value(_));
    (*b == index && invariant(*a)) || (*a == index && invariant(*b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use weave_host_ir::{parse, print};

    /// `text` with the block of the kernel `K0` it launches: `out = neg(x)` over `sizes`.
    fn with_kernel(text: &str, sizes: &str) -> String {
        format!(
            "{text}K0: fusion k(a = 1) {{\n  tensor x: f32[{sizes}]\n  out = neg(x)\n  output out\n}}\n"
        )
    }

    fn merged(text: &str) -> (Changed, String) {
        let mut p = parse(&with_kernel(text, "8, 16")).expect("parses");
        let changed = MergeKernelChunks::default().run_on(&mut p);
        weave_host_ir::verify(&p).expect("verifies");
        (changed, print(&p))
    }

    #[test]
    fn a_kernel_only_loop_becomes_one_launch_over_whole_tensors() {
        let (changed, out) = merged(
            "%HostIrContainer { (T0_g_f32[8, 16]) -> (T1_g_f32[8, 16]) :
  T1 = ALLOCATE(mem_type=global, zero_init=false)
  FOR i0 from 0 to 4:
    T2_g_f32[8, 4] = ShardByStream(T0, axis=1, chunks=4, stream_index=i0)
    T3_g_f32[8, 4] = ShardByStream(T1, axis=1, chunks=4, stream_index=i0)
    LaunchKernel(kernel=K0, inputs=(T2), outputs=(T3))
} // %HostIrContainer
",
        );
        assert_eq!(changed, Changed::Yes);
        assert!(!out.contains("FOR"), "{out}");
        assert!(!out.contains("ShardByStream"), "{out}");
        assert!(
            out.contains("LaunchKernel(kernel=K0, inputs=(T0), outputs=(T1))"),
            "{out}"
        );
    }

    #[test]
    fn loops_with_anything_but_kernels_and_tiling_views_stay() {
        let cases = [
            // a GEMM chunk overlaps the next chunk's kernel
            "    T2_g_f32[2, 16] = ShardByStream(T0, axis=0, chunks=4, stream_index=i0)
    T3_g_f32[2, 16] = ShardByStream(T1, axis=0, chunks=4, stream_index=i0)
    T3 = matmul(T2, T4)",
            // views that do not tile the tensor: 2 chunks in a loop of 4
            "    T2_g_f32[4, 16] = ShardByStream(T0, axis=0, chunks=2, stream_index=i0)
    T3_g_f32[4, 16] = ShardByStream(T1, axis=0, chunks=2, stream_index=i0)
    LaunchKernel(kernel=K0, inputs=(T2), outputs=(T3))",
            // a view indexed by something else than the loop index
            "    T2_g_f32[2, 16] = ShardByStream(T0, axis=0, chunks=4, stream_index=0)
    T3_g_f32[2, 16] = ShardByStream(T1, axis=0, chunks=4, stream_index=i0)
    LaunchKernel(kernel=K0, inputs=(T2), outputs=(T3))",
        ];
        for body in cases {
            let text = format!(
                "%HostIrContainer {{ (T0_g_f32[8, 16], T4_g_f32[16, 16]) -> (T1_g_f32[8, 16]) :
  T1 = ALLOCATE(mem_type=global, zero_init=false)
  FOR i0 from 0 to 4:
{body}
}} // %HostIrContainer
"
            );
            let (changed, out) = merged(&text);
            assert_eq!(changed, Changed::No, "{out}");
            assert!(out.contains("FOR i0 from 0 to 4"), "{out}");
        }
    }

    /// Each chunk of `[8, 16]` f32 cut into 4 column chunks reads 128 bytes and writes 128:
    /// merged below 256 bytes a chunk, kept from 256 on; kept too when a size does not
    /// evaluate (a free name and no signature to give it a value).
    #[test]
    fn only_chunks_that_move_fewer_bytes_than_the_threshold_merge() {
        let program = |rows: &str| {
            with_kernel(
                &format!(
                    "%HostIrContainer {{ (T0_g_f32[{rows}, 16]) -> (T1_g_f32[{rows}, 16]) :
  T1 = ALLOCATE(mem_type=global, zero_init=false)
  FOR i0 from 0 to 4:
    T2_g_f32[{rows}, 4] = ShardByStream(T0, axis=1, chunks=4, stream_index=i0)
    T3_g_f32[{rows}, 4] = ShardByStream(T1, axis=1, chunks=4, stream_index=i0)
    LaunchKernel(kernel=K0, inputs=(T2), outputs=(T3))
}} // %HostIrContainer
"
                ),
                "8, 16",
            )
        };
        for (rows, below_bytes, merged) in [
            ("8", 257, true),
            ("8", 256, false),
            ("8", MERGE_BELOW_BYTES, true),
            ("t", MERGE_BELOW_BYTES, false),
        ] {
            let mut p = parse(&program(rows)).expect("parses");
            let changed = MergeKernelChunks { below_bytes }.run_on(&mut p);
            assert_eq!(
                changed == Changed::Yes,
                merged,
                "rows {rows}, below {below_bytes}: {}",
                print(&p)
            );
        }
    }

    #[test]
    fn a_rank_rotated_loop_merges_and_a_second_run_changes_nothing() {
        let text = "%HostIrContainer { (T0_g_f32[8, 16]) -> (T1_g_f32[8, 16]) :
  T1 = ALLOCATE(mem_type=global, zero_init=false)
  FOR i0 from 0 to 4:
    T2_g_f32[2, 16] = ShardByStream(T0, axis=0, chunks=4, stream_index=( ( rank + i0 ) % 4 ))
    T3_g_f32[2, 16] = ShardByStream(T1, axis=0, chunks=4, stream_index=( ( rank + i0 ) % 4 ))
    LaunchKernel(kernel=K0, inputs=(T2), outputs=(T3))
} // %HostIrContainer
";
        let mut p = parse(&with_kernel(text, "8, 16")).expect("parses");
        assert_eq!(MergeKernelChunks::default().run_on(&mut p), Changed::Yes);
        let once = print(&p);
        assert!(once.contains("inputs=(T0), outputs=(T1)"), "{once}");
        assert_eq!(MergeKernelChunks::default().run_on(&mut p), Changed::No);
        assert_eq!(print(&p), once);
    }
}
