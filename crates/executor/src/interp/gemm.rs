//! Matrix products: `matmul` and `linear`, batched and broadcast, over `f64`.

use rayon::prelude::*;
use weave_ir::shape::broadcast_shapes;

use super::elementwise::{broadcast_strides, zeroed};
use super::{Value, PARALLEL_MIN};
use crate::dense::Dense;
use crate::memory::MemoryError;

/// Why operands make no matrix product: [`matmul_dense`] and [`linear_dense`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GemmError {
    /// A `matmul` operand has rank below 2.
    #[error("operands must have rank 2 or more, got sizes {a:?} and {b:?}")]
    MatmulRank {
        /// The sizes of `a`.
        a: Vec<usize>,
        /// The sizes of `b`.
        b: Vec<usize>,
    },
    /// The contraction axes of a `matmul` differ.
    #[error("contraction sizes differ: {a:?} x {b:?}")]
    MatmulContraction {
        /// The sizes of `a`.
        a: Vec<usize>,
        /// The sizes of `b`.
        b: Vec<usize>,
    },
    /// The batch axes of a `matmul` do not broadcast.
    #[error("batch sizes {batch_a:?} and {batch_b:?} do not broadcast (operands {a:?} x {b:?})")]
    BatchBroadcast {
        /// The batch sizes of `a`.
        batch_a: Vec<usize>,
        /// The batch sizes of `b`.
        batch_b: Vec<usize>,
        /// The sizes of `a`.
        a: Vec<usize>,
        /// The sizes of `b`.
        b: Vec<usize>,
    },
    /// The input of a `linear` is rank 0.
    #[error("the input must have rank 1 or more, got a rank-0 tensor")]
    LinearInputRank,
    /// The weight of a `linear` is not rank 2.
    #[error("the weight must have rank 2 ([n, k]), got sizes {weight:?}")]
    LinearWeightRank {
        /// The weight's sizes.
        weight: Vec<usize>,
    },
    /// The contraction axes of a `linear` differ.
    #[error("contraction sizes differ: input {input:?}, weight {weight:?}")]
    LinearContraction {
        /// The input's sizes.
        input: Vec<usize>,
        /// The weight's sizes.
        weight: Vec<usize>,
    },
    /// The bias of a `linear` is not `[n]`.
    #[error("the bias has sizes {bias:?}, expected [{n}] (weight {weight:?})")]
    BiasSizes {
        /// The bias's sizes.
        bias: Vec<usize>,
        /// The weight's output rows.
        n: usize,
        /// The weight's sizes.
        weight: Vec<usize>,
    },
    /// The result cannot be allocated.
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

/// `[.., m, k] x [.., k, n] -> [.., m, n]`, batch axes broadcast numpy-style (a rank-2 `b`
/// applies to every batch of `a`).
pub(super) fn matmul(a: &Dense, b: &Dense) -> Result<Value, GemmError> {
    let (ra, rb) = (a.sizes.len(), b.sizes.len());
    if ra < 2 || rb < 2 {
        return Err(GemmError::MatmulRank {
            a: a.sizes.clone(),
            b: b.sizes.clone(),
        });
    }
    let (m, k) = (a.sizes[ra - 2], a.sizes[ra - 1]);
    let (kb, n) = (b.sizes[rb - 2], b.sizes[rb - 1]);
    if k != kb {
        return Err(GemmError::MatmulContraction {
            a: a.sizes.clone(),
            b: b.sizes.clone(),
        });
    }
    let (batch_a, batch_b) = (&a.sizes[..ra - 2], &b.sizes[..rb - 2]);
    let batch = broadcast_shapes(&[batch_a, batch_b]).map_err(|_| GemmError::BatchBroadcast {
        batch_a: batch_a.to_vec(),
        batch_b: batch_b.to_vec(),
        a: a.sizes.clone(),
        b: b.sizes.clone(),
    })?;
    let mut sizes = batch.clone();
    sizes.extend([m, n]);
    let mut out = zeroed(&sizes)?;
    let numel = out.len();
    if numel == 0 {
        return Ok((sizes, out));
    }
    let nb: usize = batch.iter().product();
    if batch_b.iter().product::<usize>() == 1 && batch_a == batch.as_slice() {
        // One GEMM: `a` is [(batch * m), k].
        gemm(nb * m, k, n, &a.data, &b.data, &mut out, true);
        return Ok((sizes, out));
    }
    let sa = broadcast_strides(batch_a, &batch);
    let sb = broadcast_strides(batch_b, &batch);
    let one = |bi: usize, c: &mut [f64], parallel: bool| {
        let (mut ia, mut ib, mut r) = (0, 0, bi);
        for ax in (0..batch.len()).rev() {
            let idx = r % batch[ax];
            r /= batch[ax];
            ia += idx * sa[ax];
            ib += idx * sb[ax];
        }
        let am = &a.data[ia * m * k..(ia + 1) * m * k];
        let bm = &b.data[ib * k * n..(ib + 1) * k * n];
        gemm(m, k, n, am, bm, c, parallel);
    };
    if nb > 1 && numel.saturating_mul(k) >= PARALLEL_MIN {
        out.par_chunks_mut(m * n)
            .enumerate()
            .for_each(|(bi, c)| one(bi, c, false));
    } else {
        for (bi, c) in out.chunks_mut(m * n).enumerate() {
            one(bi, c, true);
        }
    }
    Ok((sizes, out))
}

/// `x [.., k], w [n, k] (, bias [n]) -> [.., n]`: `x wᵀ (+ bias)`.
pub(super) fn linear(x: &Dense, w: &Dense, bias: Option<&Dense>) -> Result<Value, GemmError> {
    let rx = x.sizes.len();
    if rx < 1 {
        return Err(GemmError::LinearInputRank);
    }
    if w.sizes.len() != 2 {
        return Err(GemmError::LinearWeightRank {
            weight: w.sizes.clone(),
        });
    }
    let (n, kw) = (w.sizes[0], w.sizes[1]);
    let k = x.sizes[rx - 1];
    if k != kw {
        return Err(GemmError::LinearContraction {
            input: x.sizes.clone(),
            weight: w.sizes.clone(),
        });
    }
    if let Some(b) = bias {
        if b.sizes != [n] {
            return Err(GemmError::BiasSizes {
                bias: b.sizes.clone(),
                n,
                weight: w.sizes.clone(),
            });
        }
    }
    let rows: usize = x.sizes[..rx - 1].iter().product();
    let mut sizes = x.sizes[..rx - 1].to_vec();
    sizes.push(n);
    let mut out = zeroed(&sizes)?;
    let numel = out.len();
    if numel == 0 {
        return Ok((sizes, out));
    }
    // wᵀ read in place: element (p, j) of wᵀ is w[j * k + p].
    gemm_strided((rows, k, n), &x.data, &w.data, (1, k), &mut out);
    if let Some(b) = bias {
        for row in out.chunks_mut(n) {
            for (o, bv) in row.iter_mut().zip(&b.data) {
                *o += bv;
            }
        }
    }
    Ok((sizes, out))
}

/// `c = a b` for row-major `a [m, k]` (row stride `k`), `b [k, n]` given by its strides,
/// `c [m, n]`, in f64 by `matrixmultiply`'s blocked, multi-threaded GEMM.
pub(super) fn gemm_strided(
    (m, k, n): (usize, usize, usize),
    a: &[f64],
    b: &[f64],
    (rsb, csb): (usize, usize),
    c: &mut [f64],
) {
    let b_needed = if k == 0 || n == 0 {
        0
    } else {
        (k - 1) * rsb + (n - 1) * csb + 1
    };
    if a.len() < m * k || b.len() < b_needed || c.len() < m * n {
        // Callers size every buffer; a short one is a bug here, never worth memory unsafety.
        c.fill(f64::NAN);
        return;
    }
    // SAFETY: `a` holds `m * k` elements read with row stride `k` and column stride 1; `b`
    // holds the `(k - 1) * rsb + (n - 1) * csb + 1` elements its strides reach; `c` holds
    // `m * n` elements written with row stride `n`; all three were checked just above, and
    // `c` does not alias `a` or `b` (it is a distinct `&mut`). With `beta = 0`, `c` is not
    // read.
    #[allow(unsafe_code)]
    unsafe {
        matrixmultiply::dgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// `c = a b` for row-major `a [m, k]`, `b [k, n]`, `c [m, n]`.
pub(super) fn gemm(
    m: usize,
    k: usize,
    n: usize,
    a: &[f64],
    b: &[f64],
    c: &mut [f64],
    _parallel: bool,
) {
    gemm_strided((m, k, n), a, b, (n, 1), c);
}

/// `a @ b` as a dense tensor of `a`'s dtype (unrounded): what a GEMM library call computes
/// before the result is stored.
pub fn matmul_dense(a: &Dense, b: &Dense) -> Result<Dense, GemmError> {
    let (sizes, data) = matmul(a, b)?;
    Ok(Dense {
        dtype: a.dtype,
        sizes,
        data,
    })
}

/// `x @ wᵀ (+ bias)` as a dense tensor of `x`'s dtype (unrounded).
pub fn linear_dense(x: &Dense, w: &Dense, bias: Option<&Dense>) -> Result<Dense, GemmError> {
    let (sizes, data) = linear(x, w, bias)?;
    Ok(Dense {
        dtype: x.dtype,
        sizes,
        data,
    })
}
