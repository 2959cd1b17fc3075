//! GEMMs on the CUDA backend: `matmul` and `linear` as cuBLASLt problems, their operands'
//! layouts checked, numpy-broadcast batch axes planned as strided batches, and a stream chunk
//! of a middle axis posted as one GEMM per block of uniformly strided rows.

use weave_cuda::{GemmOperands, GemmShape, GemmType, GpuStream};
use weave_ir::DType;

use super::layout::{matrix_of, stepping_axes, DeviceTensor};
use super::CudaBackend;
use crate::dense::elem_bytes;
use crate::error::ExecError;

/// The left operand, the right operand and the result of a GEMM.
type Operands<'t> = (&'t DeviceTensor, &'t DeviceTensor, &'t DeviceTensor);

/// The error of the GEMM `label`.
fn gemm_error(label: &str, message: String) -> ExecError {
    ExecError::Compute {
        stmt: label.to_string(),
        message,
    }
}

impl CudaBackend {
    fn gemm_type(&self, d: DType, label: &str) -> Result<GemmType, ExecError> {
        match d {
            DType::BF16 => Ok(GemmType::Bf16),
            DType::F16 => Ok(GemmType::F16),
            DType::F32 => Ok(GemmType::F32),
            DType::F64 => Ok(GemmType::F64),
            other => Err(ExecError::Compute {
                stmt: label.to_string(),
                message: format!("GEMMs of {other} tensors are not supported on the GPU"),
            }),
        }
    }

    /// Enqueues `c[.., m, n] = a[.., m, k] · b[.., k, n] (+ bias[n])` where `bt` says that
    /// `b` is given as `[.., n, k]` (linear's weight); with `accumulate`, `c += a · b`
    /// (cuBLASLt's beta = 1: C is D).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm(
        &self,
        label: &str,
        a: &DeviceTensor,
        b: &DeviceTensor,
        bt: bool,
        bias: Option<&DeviceTensor>,
        c: &DeviceTensor,
        accumulate: bool,
        stream: &GpuStream,
    ) -> Result<(), ExecError> {
        if a.dtype != b.dtype || a.dtype != c.dtype {
            return Err(gemm_error(
                label,
                format!(
                    "operand types differ: {} x {} -> {}",
                    a.dtype, b.dtype, c.dtype
                ),
            ));
        }
        let dtype = self.gemm_type(a.dtype, label)?;
        let (k, n) = contraction(label, &a.sizes(), &b.sizes(), bt)?;
        // The empty last chunk of an axis that the stream chunks do not divide: nothing to
        // compute, and cuBLASLt takes no zero-sized matrices.
        if c.numel() == 0 {
            return Ok(());
        }
        let bias_ptr = bias_address(label, bias, n, a.dtype)?;
        let layout = GemmLayout::of(label, (a, b, c), bt, (k, n))?;
        let Ok(batch) = i32::try_from(layout.plan.count) else {
            return Err(gemm_error(
                label,
                format!(
                    "{} batches in one GEMM exceed what cuBLASLt takes",
                    layout.plan.count
                ),
            ));
        };
        if layout.m == 0 || n == 0 || layout.batches == 0 {
            return Ok(());
        }
        let mut shape = gemm_shape(dtype, &layout, (k, n), bt, batch, accumulate);
        shape.bias = bias.is_some();
        shape.tf32 = self.options.tf32;
        shape.sm_count = self.options.gemm_sm_count;
        if k == 0 {
            // An empty contraction (the empty last chunk of a streamed contraction axis): the
            // product is zero, so an accumulation leaves `c` as it is.
            if accumulate {
                return Ok(());
            }
            return self
                .gpu
                .zero(c.ptr(), c.numel() * elem_bytes(c.dtype), stream)
                .map_err(ExecError::from);
        }
        self.post_gemm(label, &shape, &layout.plan, (a, b, c), bias_ptr, stream)
    }

    /// Enqueues `shape` on `stream` once per entry of `plan`'s offsets, as one compute
    /// operation (timed when tracing): the operands swapped, cuBLASLt being column-major.
    fn post_gemm(
        &self,
        label: &str,
        shape: &GemmShape,
        plan: &BatchPlan,
        (a, b, c): Operands<'_>,
        bias_ptr: u64,
        stream: &GpuStream,
    ) -> Result<(), ExecError> {
        let bytes = elem_bytes(a.dtype) as u64;
        self.compute(stream, || {
            self.timed(stream, label, || {
                for (oa, ob, oc) in &plan.offsets {
                    let ops = GemmOperands {
                        a: b.ptr() + *ob as u64 * bytes,
                        b: a.ptr() + *oa as u64 * bytes,
                        d: c.ptr() + *oc as u64 * bytes,
                        bias: bias_ptr,
                    };
                    self.gpu.gemm(stream, shape, ops).map_err(ExecError::from)?;
                }
                Ok(())
            })
        })
    }
}

/// The cuBLASLt problem of `c = a · b` (`c += a · b` with `accumulate`) for contraction size
/// `k` and `n` columns laid out as `layout`, `batch` problems per post: row-major
/// `C[m, n] = A[m, k] B[k, n]` is column-major `C'[n, m] = B'[n, k] A'[k, m]`, so the operands
/// swap. No bias, no TF32 and the whole GPU; the caller sets those.
fn gemm_shape(
    dtype: GemmType,
    layout: &GemmLayout,
    (k, n): (usize, usize),
    bt: bool,
    batch: i32,
    accumulate: bool,
) -> GemmShape {
    GemmShape {
        dtype,
        m: n as u64,
        n: layout.m as u64,
        k: k as u64,
        transa: bt,
        transb: false,
        lda: layout.ldb as i64,
        ldb: layout.lda as i64,
        ldd: layout.ldc as i64,
        batch,
        stride_a: layout.plan.stride.1 as i64,
        stride_b: layout.plan.stride.0 as i64,
        stride_d: layout.plan.stride.2 as i64,
        bias: false,
        tf32: false,
        sm_count: 0,
        accumulate,
    }
}

/// The contraction size `k` and the column count `n` of `a · b` for operands of sizes `asz`
/// and `bsz` (`b` given as `[.., n, k]` when `bt`), or the error of the GEMM `label` when
/// their ranks or contraction sizes do not fit.
fn contraction(
    label: &str,
    asz: &[usize],
    bsz: &[usize],
    bt: bool,
) -> Result<(usize, usize), ExecError> {
    // `linear` takes a rank-1 input; `matmul` needs rank 2 or more on both sides.
    let a_ok = if bt { !asz.is_empty() } else { asz.len() >= 2 };
    if !a_ok || bsz.len() < 2 {
        return Err(gemm_error(
            label,
            format!("operands of sizes {asz:?} and {bsz:?}"),
        ));
    }
    let k = asz[asz.len() - 1];
    let (kb, n) = if bt {
        (bsz[bsz.len() - 1], bsz[bsz.len() - 2])
    } else {
        (bsz[bsz.len() - 2], bsz[bsz.len() - 1])
    };
    if k != kb {
        return Err(gemm_error(
            label,
            format!("contraction sizes differ: {asz:?} x {bsz:?}"),
        ));
    }
    Ok((k, n))
}

/// The device address of `bias`, which must be a contiguous `[n]` of `dtype`; 0 without one.
fn bias_address(
    label: &str,
    bias: Option<&DeviceTensor>,
    n: usize,
    dtype: DType,
) -> Result<u64, ExecError> {
    match bias {
        Some(t) if t.numel() == n && t.contiguous() && t.dtype == dtype => Ok(t.ptr()),
        Some(t) => Err(gemm_error(
            label,
            format!(
                "the bias has sizes {:?}, expected [{n}] of {}",
                t.sizes(),
                dtype
            ),
        )),
        None => Ok(0),
    }
}

/// How a GEMM's operands lie in memory: the strided batches to post, the rows of each
/// problem, and the row-major leading dimensions (element distance between rows) of the left
/// operand, the right operand and the result.
struct GemmLayout {
    plan: BatchPlan,
    /// Rows of the left operand and the result per problem.
    m: usize,
    lda: usize,
    ldb: usize,
    ldc: usize,
    /// Problems in the broadcast batch axes.
    batches: usize,
}

impl GemmLayout {
    /// The layout of `c = a · b` (`b` given as `[.., n, k]` when `bt`) for contraction size
    /// `k` and `n` columns, checked against the rows of the result, or the error of the GEMM
    /// `label`.
    fn of(
        label: &str,
        (a, b, c): Operands<'_>,
        bt: bool,
        (k, n): (usize, usize),
    ) -> Result<GemmLayout, ExecError> {
        let (asz, bsz) = (a.sizes(), b.sizes());
        // `linear`'s weight and a rank-2 `b` apply to every row of `a`: one GEMM over all of
        // `a`'s rows. Otherwise the batch axes broadcast numpy-style, and the GEMM runs as
        // strided batches (a stride of 0 for a broadcast operand).
        let (a_batch, b_batch) = if bt {
            (Vec::new(), Vec::new())
        } else {
            (asz[..asz.len() - 2].to_vec(), bsz[..bsz.len() - 2].to_vec())
        };
        let out_batch = weave_ir::shape::broadcast_shapes(&[&a_batch, &b_batch]).map_err(|_| {
            gemm_error(
                label,
                format!("batch sizes of {asz:?} and {bsz:?} do not broadcast"),
            )
        })?;
        let batches: usize = out_batch.iter().product();
        let flat =
            b_batch.iter().product::<usize>() <= 1 && a_batch.iter().product::<usize>() == batches;
        let layout = if flat {
            GemmLayout::flat(label, (a, b, c), bt, (k, n), batches)?
        } else {
            GemmLayout::batched(label, (a, b, c), (k, n), &out_batch)?
        };
        let c_rows = c.numel() / n.max(1);
        let c_want = if flat {
            layout.m * layout.plan.offsets.len()
        } else {
            batches * layout.m
        };
        if c_rows != c_want {
            return Err(gemm_error(
                label,
                format!(
                    "the result buffer has sizes {:?}, expected {c_want} rows of {n}",
                    c.sizes(),
                ),
            ));
        }
        Ok(layout)
    }

    /// One GEMM over all of `a`'s rows, each operand a row-major matrix; or, for a stream
    /// chunk of a middle axis, one GEMM per block of uniformly strided rows.
    fn flat(
        label: &str,
        (a, b, c): Operands<'_>,
        bt: bool,
        (k, n): (usize, usize),
        batches: usize,
    ) -> Result<GemmLayout, ExecError> {
        let err = |m: String| gemm_error(label, m);
        // Each operand as a row-major matrix: (rows, leading dimension).
        let strided = |t: &DeviceTensor, cols: usize, what: &str| {
            t.as_matrix(cols).ok_or_else(|| {
                err(format!(
                    "the {what} (sizes {:?} in an allocation of {:?}) is not a matrix of \
                     uniformly strided rows",
                    t.sizes(),
                    t.shape
                ))
            })
        };
        let a_rows = a.numel() / k.max(1);
        let (_, ldb) = strided(b, if bt { k } else { n }, "right operand")?;
        let (plan, m, lda, ldc) = match (a.as_matrix(k), c.as_matrix(n)) {
            (Some((_, lda)), Some((_, ldc))) => (BatchPlan::single(), a_rows, lda, ldc),
            // A stream chunk of a middle axis (`[b, t/s, k]` in `[b, t, k]`): the rows
            // are blocks of uniformly strided rows, one GEMM per block.
            (a_mat, _) => {
                let blocks = row_blocks(a, k, c, n).ok_or_else(|| {
                    let (what, bad) = if a_mat.is_none() {
                        ("left operand", a)
                    } else {
                        ("result", c)
                    };
                    err(format!(
                        "the {what} (sizes {:?} in an allocation of {:?}) is not made of \
                         blocks of uniformly strided rows",
                        bad.sizes(),
                        bad.shape
                    ))
                })?;
                let plan = BatchPlan {
                    count: 1,
                    stride: (0, 0, 0),
                    offsets: blocks.offsets.iter().map(|&(oa, oc)| (oa, 0, oc)).collect(),
                };
                (plan, blocks.rows, blocks.lda, blocks.ldc)
            }
        };
        Ok(GemmLayout {
            plan,
            m,
            lda,
            ldb,
            ldc,
            batches,
        })
    }

    /// Each operand a batch of row-major matrices: its last two axes a matrix of uniformly
    /// strided rows, its batch axes stepping by the allocation's strides (a stream chunk of a
    /// middle axis, `[h, t/s, d]` in `[h, t, d]`, is one), the result's batch sizes
    /// `out_batch`.
    fn batched(
        label: &str,
        (a, b, c): Operands<'_>,
        (k, n): (usize, usize),
        out_batch: &[usize],
    ) -> Result<GemmLayout, ExecError> {
        let err = |m: String| gemm_error(label, m);
        let batched = |t: &DeviceTensor, cols: usize, what: &str| {
            let (sz, st) = (t.sizes(), t.strides());
            let r = sz.len();
            matrix_of(&sz[r - 2..], &st[r - 2..], cols)
                .map(|(_, ld)| (ld, sz[..r - 2].to_vec(), st[..r - 2].to_vec()))
                .ok_or_else(|| {
                    err(format!(
                        "the {what} (sizes {sz:?} in an allocation of {:?}) is not a batch \
                         of matrices of uniformly strided rows",
                        t.shape
                    ))
                })
        };
        let asz = a.sizes();
        let m = asz[asz.len() - 2];
        let (lda, a_sizes, a_steps) = batched(a, k, "left operand")?;
        let (ldb, b_sizes, b_steps) = batched(b, n, "right operand")?;
        let (ldc, c_sizes, c_steps) = batched(c, n, "result")?;
        if c_sizes != out_batch {
            return Err(err(format!(
                "the result buffer has batch sizes {c_sizes:?}, expected {out_batch:?}"
            )));
        }
        let plan = BatchPlan::strided(
            (&a_sizes, &a_steps),
            (&b_sizes, &b_steps),
            (&c_sizes, &c_steps),
        );
        Ok(GemmLayout {
            plan,
            m,
            lda,
            ldb,
            ldc,
            batches: out_batch.iter().product(),
        })
    }
}

/// The rows of a GEMM whose left operand and result do not merge into uniformly strided rows
/// (`[b, t/s, k]`, a stream chunk of the middle axis of `[b, t, k]`): the blocks of rows that
/// do, each posted as one GEMM.
#[derive(Debug, PartialEq)]
struct RowBlocks {
    /// Rows per block.
    rows: usize,
    /// Leading dimensions (element distance between rows) of the left operand and the result.
    lda: usize,
    ldc: usize,
    /// Element offsets of each block in the left operand and the result, from each box start.
    offsets: Vec<(usize, usize)>,
}

/// The row blocks of `a` (`[.., k]`) and `c` (`[.., n]`): see [`split_rows`].
fn row_blocks(a: &DeviceTensor, k: usize, c: &DeviceTensor, n: usize) -> Option<RowBlocks> {
    split_rows((&a.sizes(), &a.strides()), k, (&c.sizes(), &c.strides()), n)
}

/// Splits the leading axes of `a` (sizes and element strides, `[.., k]`) and `c` (`[.., n]`),
/// which must hold the same rows, into outer axes enumerated block by block and the innermost
/// run of axes that merges into uniformly strided rows in both. `None` when their leading axes
/// differ or a last axis is not contiguous.
fn split_rows(
    a: (&[usize], &[usize]),
    k: usize,
    c: (&[usize], &[usize]),
    n: usize,
) -> Option<RowBlocks> {
    // Axes of one element do not step (a GEMM result may carry a trailing `1`).
    let lead = |(sizes, strides): (&[usize], &[usize]), cols: usize| {
        let axes = stepping_axes(sizes, strides);
        match axes.split_last() {
            Some((&(last, 1), rest)) if last == cols => Some(rest.to_vec()),
            _ if cols == 1 => Some(axes),
            _ => None,
        }
    };
    let (la, lc) = (lead(a, k)?, lead(c, n)?);
    if la.len() != lc.len() || la.iter().zip(&lc).any(|(x, y)| x.0 != y.0) {
        return None;
    }
    let r = la.len();
    if r == 0 {
        return Some(RowBlocks {
            rows: 1,
            lda: k,
            ldc: n,
            offsets: vec![(0, 0)],
        });
    }
    let mut p = r - 1;
    while p > 0 && la[p - 1].1 == la[p].1 * la[p].0 && lc[p - 1].1 == lc[p].1 * lc[p].0 {
        p -= 1;
    }
    let rows = la[p..].iter().map(|x| x.0).product();
    let mut offsets = vec![(0usize, 0usize)];
    for q in 0..p {
        let (size, sa, sc) = (la[q].0, la[q].1, lc[q].1);
        offsets = offsets
            .iter()
            .flat_map(|&(x, z)| (0..size).map(move |i| (x + i * sa, z + i * sc)))
            .collect();
    }
    Some(RowBlocks {
        rows,
        lda: la[r - 1].1.max(k),
        ldc: lc[r - 1].1.max(n),
        offsets,
    })
}

/// How a GEMM with numpy-broadcast batch axes runs as cuBLASLt strided batches: `count`
/// problems `stride` elements apart per operand `(a, b, c)` (0 for an operand that the
/// batches broadcast), posted once per entry of `offsets` (element offsets of the first
/// problem). Batch axes whose operands all step uniformly merge into one strided batch; the
/// others become separate posts.
#[derive(Debug, PartialEq, Eq)]
struct BatchPlan {
    count: usize,
    stride: (usize, usize, usize),
    offsets: Vec<(usize, usize, usize)>,
}

impl BatchPlan {
    /// One problem.
    fn single() -> BatchPlan {
        BatchPlan {
            count: 1,
            stride: (0, 0, 0),
            offsets: vec![(0, 0, 0)],
        }
    }

    /// The plan for contiguous operands with batch sizes `a`, `b` broadcast to `out`, and
    /// matrices of `mats = (m·k, k·n, m·n)` elements.
    #[cfg(test)]
    fn new(a: &[usize], b: &[usize], out: &[usize], mats: (usize, usize, usize)) -> BatchPlan {
        let packed = |sizes: &[usize], mat: usize| {
            let mut st = vec![0usize; sizes.len()];
            let mut run = mat;
            for k in (0..sizes.len()).rev() {
                st[k] = run;
                run *= sizes[k];
            }
            st
        };
        BatchPlan::strided(
            (a, &packed(a, mats.0)),
            (b, &packed(b, mats.1)),
            (out, &packed(out, mats.2)),
        )
    }

    /// The plan for operands whose batch axes have sizes and element strides `(a, sa)`,
    /// `(b, sb)` (broadcast to `out`) and `(out, sc)` for the result: a stream chunk of a
    /// batched tensor steps by its allocation's strides, not by its own matrices' size.
    fn strided(
        (a, sa): (&[usize], &[usize]),
        (b, sb): (&[usize], &[usize]),
        (out, sc): (&[usize], &[usize]),
    ) -> BatchPlan {
        // Per output batch axis: its size and each operand's element stride (0 where the
        // operand is missing the axis or has size 1 there).
        let strides = |sizes: &[usize], steps: &[usize]| {
            let off = out.len() - sizes.len();
            let mut st = vec![0usize; out.len()];
            for k in 0..sizes.len() {
                if sizes[k] != 1 {
                    st[k + off] = steps[k];
                }
            }
            st
        };
        let (sa, sb, sc) = (strides(a, sa), strides(b, sb), strides(out, sc));
        // Axes of size 1 do not step; merge an axis into the one inside it when every operand
        // steps across the pair uniformly.
        let mut axes: Vec<(usize, [usize; 3])> = Vec::new();
        for k in 0..out.len() {
            if out[k] != 1 {
                axes.push((out[k], [sa[k], sb[k], sc[k]]));
            }
        }
        let mut merged: Vec<(usize, [usize; 3])> = Vec::new();
        for (n, st) in axes.into_iter().rev() {
            match merged.last_mut() {
                Some((ni, si)) if (0..3).all(|o| st[o] == si[o] * *ni) => *ni *= n,
                _ => merged.push((n, st)),
            }
        }
        // `merged` runs inner to outer: the innermost is the strided batch, the rest are posts.
        let Some(&(count, inner)) = merged.first() else {
            return BatchPlan::single();
        };
        let mut offsets = vec![(0usize, 0usize, 0usize)];
        for &(n, st) in merged.iter().skip(1).rev() {
            offsets = offsets
                .iter()
                .flat_map(|&(x, y, z)| {
                    (0..n).map(move |i| (x + i * st[0], y + i * st[1], z + i * st[2]))
                })
                .collect();
        }
        BatchPlan {
            count,
            stride: (inner[0], inner[1], inner[2]),
            offsets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{gemm_shape, split_rows, BatchPlan, GemmLayout};
    use weave_cuda::GemmType;

    #[test]
    fn an_accumulating_gemm_is_the_same_problem_with_beta_one() {
        // A weight gradient's chunk, dW[4, 6] += xᵀ[4, k=3] · dy[3, 6], row-major and dense.
        let layout = GemmLayout {
            plan: BatchPlan::single(),
            m: 4,
            lda: 3,
            ldb: 6,
            ldc: 6,
            batches: 1,
        };
        let plain = gemm_shape(GemmType::F32, &layout, (3, 6), false, 1, false);
        let acc = gemm_shape(GemmType::F32, &layout, (3, 6), false, 1, true);
        // Column-major with the operands swapped: D'[6, 4] = dy'[6, 3] · xᵀ'[3, 4].
        assert_eq!((plain.m, plain.n, plain.k), (6, 4, 3));
        assert_eq!((plain.lda, plain.ldb, plain.ldd), (6, 3, 6));
        assert!(!plain.accumulate && acc.accumulate);
        // Only the flag differs (a plan of its own in the cache: beta is fixed per call).
        assert_eq!(
            weave_cuda::GemmShape {
                accumulate: false,
                ..acc
            },
            plain
        );
    }

    #[test]
    fn chunks_of_a_middle_axis_are_gemms_per_block_of_rows() {
        // a = [6, 12, 16][:, 4..8, :] and c = [6, 12, 3, 1][:, 4..8, :, :]: 6 blocks of 4 rows.
        let blocks = split_rows(
            (&[6, 4, 16], &[192, 16, 1]),
            16,
            (&[6, 4, 3, 1], &[36, 3, 1, 1]),
            3,
        )
        .unwrap();
        assert_eq!(blocks.rows, 4);
        assert_eq!((blocks.lda, blocks.ldc), (16, 3));
        assert_eq!(
            blocks.offsets,
            (0..6).map(|i| (i * 192, i * 36)).collect::<Vec<_>>()
        );
        // Whole rows merge into one block.
        let one = split_rows(
            (&[6, 12, 16], &[192, 16, 1]),
            16,
            (&[6, 12, 3], &[36, 3, 1]),
            3,
        );
        assert_eq!(one.unwrap().offsets, vec![(0, 0)]);
        // Different rows, or a strided last axis, are no GEMM.
        let rows_differ = split_rows(
            (&[6, 4, 16], &[192, 16, 1]),
            16,
            (&[5, 4, 3], &[12, 3, 1]),
            3,
        );
        assert!(rows_differ.is_none());
        let strided = split_rows(
            (&[6, 4, 16], &[192, 32, 2]),
            16,
            (&[6, 4, 3], &[12, 3, 1]),
            3,
        );
        assert!(strided.is_none());
    }

    /// Runs `a @ b` the way the GPU does under `BatchPlan` (one strided batch of GEMMs per
    /// offset), on the CPU, and compares it with the reference matmul; every result matrix
    /// must be written exactly once.
    fn planned_matmul_matches_the_reference(a_sizes: &[usize], b_sizes: &[usize]) {
        use crate::dense::Dense;
        let (m, k, n) = (2, 3, 2);
        let full = |batch: &[usize], r: usize, c: usize| {
            let mut sz = batch.to_vec();
            sz.extend([r, c]);
            let len: usize = sz.iter().product();
            let data = (0..len).map(|i| ((i * 7) % 5) as f64 - 2.0).collect();
            Dense::new(weave_ir::DType::F64, sz, data).unwrap()
        };
        let (a, b) = (full(a_sizes, m, k), full(b_sizes, k, n));
        let want = crate::interp::matmul_dense(&a, &b).unwrap();
        let out = weave_ir::shape::broadcast_shapes(&[a_sizes, b_sizes]).unwrap();
        let plan = BatchPlan::new(a_sizes, b_sizes, &out, (m * k, k * n, m * n));
        let mut c = vec![f64::NAN; want.data.len()];
        let mut writes = vec![0usize; c.len() / (m * n)];
        for (oa, ob, oc) in &plan.offsets {
            for t in 0..plan.count {
                let (pa, pb, pc) = (
                    oa + t * plan.stride.0,
                    ob + t * plan.stride.1,
                    oc + t * plan.stride.2,
                );
                writes[pc / (m * n)] += 1;
                for i in 0..m {
                    for j in 0..n {
                        c[pc + i * n + j] = (0..k)
                            .map(|p| a.data[pa + i * k + p] * b.data[pb + p * n + j])
                            .sum();
                    }
                }
            }
        }
        assert!(
            writes.iter().all(|w| *w == 1),
            "{a_sizes:?} x {b_sizes:?}: {writes:?}"
        );
        assert_eq!(c, want.data, "{a_sizes:?} x {b_sizes:?}");
    }

    #[test]
    fn planned_batches_compute_the_broadcast_product() {
        for (a, b) in [
            (&[4][..], &[][..]),
            (&[][..], &[4][..]),
            (&[3, 2][..], &[2][..]),
            (&[3, 1][..], &[4][..]),
            (&[3, 1][..], &[1, 4][..]),
            (&[1, 4][..], &[3, 1][..]),
            (&[2, 1, 3][..], &[4, 1][..]),
            (&[2, 3, 4][..], &[2, 3, 4][..]),
            (&[2, 1, 4][..], &[1, 3, 1][..]),
            (&[1, 1][..], &[1][..]),
        ] {
            planned_matmul_matches_the_reference(a, b);
        }
    }

    #[test]
    fn broadcast_batches_become_strided_batches_with_zero_strides() {
        let plan = |count, stride, offsets: &[(usize, usize, usize)]| BatchPlan {
            count,
            stride,
            offsets: offsets.to_vec(),
        };
        for (what, planned, expected) in [
            (
                "[4, m, k] x [k, n] written as batched: b is shared (stride 0)",
                BatchPlan::new(&[4], &[], &[4], (6, 12, 8)),
                plan(4, (6, 0, 8), &[(0, 0, 0)]),
            ),
            (
                "[S=3, D=2, m, k] x [D=2, k, n]: b steps with D but not with S, so D is the \
                 strided batch and S becomes 3 posts",
                BatchPlan::new(&[3, 2], &[2], &[3, 2], (6, 12, 8)),
                plan(2, (6, 12, 8), &[(0, 0, 0), (12, 0, 16), (24, 0, 32)]),
            ),
            (
                "[3, 2, m, k] x [1, 2, k, n] (a broadcast axis of size 1) is the same plan",
                BatchPlan::new(&[3, 2], &[1, 2], &[3, 2], (6, 12, 8)),
                BatchPlan::new(&[3, 2], &[2], &[3, 2], (6, 12, 8)),
            ),
            (
                "equal batches merge into one strided batch; size-1 axes vanish",
                BatchPlan::new(&[2, 1, 3], &[2, 1, 3], &[2, 1, 3], (6, 12, 8)),
                plan(6, (6, 12, 8), &[(0, 0, 0)]),
            ),
            (
                "all batch sizes 1: one problem",
                BatchPlan::new(&[1, 1], &[1], &[1, 1], (6, 12, 8)),
                BatchPlan::single(),
            ),
            (
                "a stream chunk of queries, `[h=4, t/s=2, d=3]` in an allocation `[4, 8, 3]`, \
                 times whole keys `[4, 3, 8]`, into a chunk `[4, 2, 8]` of a slot buffer \
                 `[4, 4, 8]`: the batches step by the allocations' strides",
                BatchPlan::strided((&[4], &[24]), (&[4], &[24]), (&[4], &[32])),
                plan(4, (24, 24, 32), &[(0, 0, 0)]),
            ),
        ] {
            assert_eq!(planned, expected, "{what}");
        }
        // Heads in groups `[2, 2]` of such chunks merge into one strided batch when they step
        // uniformly, and stay posts when they do not.
        assert_eq!(
            BatchPlan::strided(
                (&[2, 2], &[48, 24]),
                (&[2, 2], &[48, 24]),
                (&[2, 2], &[64, 32])
            )
            .count,
            4
        );
        let posts = BatchPlan::strided(
            (&[2, 2], &[50, 24]),
            (&[2, 2], &[48, 24]),
            (&[2, 2], &[64, 32]),
        );
        assert_eq!((posts.count, posts.offsets.len()), (2, 2));
        assert_eq!(posts.offsets[1], (50, 48, 64));
    }
}
