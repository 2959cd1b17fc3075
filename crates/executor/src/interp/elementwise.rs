//! Elementwise ops: the scalar functions of unary and binary ops, broadcasting, and the
//! parallel loops that fill an output.

use rayon::prelude::*;
use weave_ir::shape::broadcast_shapes;
use weave_ir::{BinaryOp, UnaryOp};

use super::{Value, PARALLEL_MIN};
use crate::dense::{checked_numel, Dense};

pub(super) fn unary_fn(op: UnaryOp) -> fn(f64) -> f64 {
    match op {
        UnaryOp::Neg => |x| -x,
        UnaryOp::Abs => f64::abs,
        UnaryOp::Exp => f64::exp,
        UnaryOp::Log => f64::ln,
        UnaryOp::Sin => f64::sin,
        UnaryOp::Cos => f64::cos,
        UnaryOp::Tanh => f64::tanh,
        UnaryOp::Sqrt => f64::sqrt,
        UnaryOp::Rsqrt => |x| 1.0 / x.sqrt(),
        UnaryOp::Reciprocal => |x| 1.0 / x,
        // `x < 0` keeps NaN, as torch's relu does.
        UnaryOp::Relu => |x| if x < 0.0 { 0.0 } else { x },
        UnaryOp::Sigmoid => |x| 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Not => |x| bool_f64(x == 0.0),
        UnaryOp::Erf => erf,
        UnaryOp::Gelu => |x| 0.5 * x * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2)),
        UnaryOp::GeluTanh => |x| {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
        },
    }
}

/// The error function, to a few units in the last place of `f64`: the series
/// `erf x = 2/√π · e^(-x²) · Σ 2ⁿ x^(2n+1) / (1·3·…·(2n+1))`, whose terms are all of one sign
/// (no cancellation), summed until they no longer change the sum; `±1` beyond `|x| = 6`,
/// where `1 - erf x` is below `f64`'s resolution of 1.
pub(crate) fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x.abs() >= 6.0 {
        return x.signum();
    }
    let x2 = x * x;
    let mut term = x;
    let mut sum = x;
    let mut n = 0.0;
    loop {
        n += 1.0;
        term *= 2.0 * x2 / (2.0 * n + 1.0);
        let next = sum + term;
        if next == sum {
            break;
        }
        sum = next;
    }
    2.0 / std::f64::consts::PI.sqrt() * (-x2).exp() * sum
}

pub(super) fn binary_fn(op: BinaryOp) -> fn(f64, f64) -> f64 {
    match op {
        BinaryOp::Add => |a, b| a + b,
        BinaryOp::Sub => |a, b| a - b,
        BinaryOp::Mul => |a, b| a * b,
        // Truncated for i64 results by the caller.
        BinaryOp::Div => |a, b| a / b,
        BinaryOp::Maximum => |a, b| {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        },
        BinaryOp::Minimum => |a, b| {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        },
        BinaryOp::Pow => f64::powf,
        BinaryOp::Eq => |a, b| bool_f64(a == b),
        BinaryOp::Ne => |a, b| bool_f64(a != b),
        BinaryOp::Lt => |a, b| bool_f64(a < b),
        BinaryOp::Le => |a, b| bool_f64(a <= b),
        BinaryOp::Gt => |a, b| bool_f64(a > b),
        BinaryOp::Ge => |a, b| bool_f64(a >= b),
        BinaryOp::And => |a, b| bool_f64(a != 0.0 && b != 0.0),
        BinaryOp::Or => |a, b| bool_f64(a != 0.0 || b != 0.0),
    }
}

pub(super) fn bool_f64(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// Checks that `axes` are distinct and below `rank`.
pub(super) fn check_axes(axes: &[usize], rank: usize) -> Result<(), String> {
    for (i, a) in axes.iter().enumerate() {
        if *a >= rank {
            return Err(format!("axis {a} is out of range for rank {rank}"));
        }
        if axes[..i].contains(a) {
            return Err(format!("axis {a} is listed twice"));
        }
    }
    Ok(())
}

pub(super) fn row_major_strides(sizes: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; sizes.len()];
    let mut s = 1usize;
    for (k, n) in sizes.iter().enumerate().rev() {
        strides[k] = s;
        s = s.saturating_mul(*n);
    }
    strides
}

/// Strides of a tensor of `sizes` read in the broadcast shape `out`: stretched and missing
/// leading axes get stride 0.
pub(super) fn broadcast_strides(sizes: &[usize], out: &[usize]) -> Vec<usize> {
    let own = row_major_strides(sizes);
    let off = out.len() - sizes.len();
    (0..out.len())
        .map(|k| {
            if k < off || sizes[k - off] == 1 {
                0
            } else {
                own[k - off]
            }
        })
        .collect()
}

/// Sets `out[i] = f(i)`, in parallel when `work` (the number of elements read) is large.
pub(super) fn fill(out: &mut [f64], work: usize, f: impl Fn(usize) -> f64 + Sync + Send) {
    if work >= PARALLEL_MIN && out.len() > 1 {
        out.par_iter_mut().enumerate().for_each(|(i, o)| *o = f(i));
    } else {
        for (i, o) in out.iter_mut().enumerate() {
            *o = f(i);
        }
    }
}

/// Calls `f(r, row)` for every row of `row_len` elements of `out` (non-empty, a multiple of
/// `row_len`), in parallel for large outputs.
pub(super) fn for_rows(
    out: &mut [f64],
    row_len: usize,
    f: impl Fn(usize, &mut [f64]) + Sync + Send,
) {
    if out.len() >= PARALLEL_MIN {
        let rows_per_task = (4096 / row_len).max(1);
        out.par_chunks_mut(row_len * rows_per_task)
            .enumerate()
            .for_each(|(t, block)| {
                for (j, row) in block.chunks_mut(row_len).enumerate() {
                    f(t * rows_per_task + j, row);
                }
            });
    } else {
        for (r, row) in out.chunks_mut(row_len).enumerate() {
            f(r, row);
        }
    }
}

/// A zero-filled result of `sizes`, checked first (element count, host memory) so that a
/// huge result is an error, not an abort.
pub(super) fn zeroed(sizes: &[usize]) -> Result<Vec<f64>, crate::memory::MemoryError> {
    crate::memory::allocate_host("a result", sizes, size_of::<f64>(), || {
        crate::memory::try_zeros(checked_numel(sizes).unwrap_or(0))
    })
}

/// A pointwise op over `N` operands with numpy broadcasting.
pub(super) fn pointwise<const N: usize>(
    ops: [&Dense; N],
    f: impl Fn([f64; N]) -> f64 + Sync + Send,
) -> Result<Value, String> {
    let shapes: Vec<&[usize]> = ops.iter().map(|d| d.sizes.as_slice()).collect();
    let sizes = broadcast_shapes(&shapes).map_err(|e| e.to_string())?;
    let mut out = zeroed(&sizes).map_err(|e| e.to_string())?;
    let numel = out.len();
    if numel == 0 {
        return Ok((sizes, out));
    }
    if ops.iter().all(|d| d.sizes == sizes) {
        fill(&mut out, numel, |i| {
            f(std::array::from_fn(|k| ops[k].data[i]))
        });
        return Ok((sizes, out));
    }
    let rank = sizes.len();
    let strides: Vec<Vec<usize>> = ops
        .iter()
        .map(|d| broadcast_strides(&d.sizes, &sizes))
        .collect();
    // rank >= 1 here: rank-0 operands all have sizes `[]` and took the fast path.
    let inner = sizes[rank - 1];
    let inner_strides: [usize; N] = std::array::from_fn(|k| strides[k][rank - 1]);
    for_rows(&mut out, inner, |row, chunk| {
        let mut base = [0usize; N];
        let mut r = row;
        for ax in (0..rank - 1).rev() {
            let idx = r % sizes[ax];
            r /= sizes[ax];
            for k in 0..N {
                base[k] += idx * strides[k][ax];
            }
        }
        for (j, o) in chunk.iter_mut().enumerate() {
            *o = f(std::array::from_fn(|k| {
                ops[k].data[base[k] + j * inner_strides[k]]
            }));
        }
    });
    Ok((sizes, out))
}
