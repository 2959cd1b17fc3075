//! Ops that move or fold axes: reductions and permutations (the sizes of a reshape are
//! `weave_ir::shape::reshape_sizes`).

use weave_ir::ReduceOp;

use super::elementwise::{check_axes, fill, row_major_strides, zeroed};
use super::Value;
use crate::dense::{checked_numel, Dense};

/// Sum or max over `axes` (which the output drops), each output accumulated in `f64` in
/// row-major order of the reduced indices.
pub(super) fn reduce(x: &Dense, op: ReduceOp, axes: &[usize]) -> Result<Value, String> {
    let rank = x.sizes.len();
    check_axes(axes, rank)?;
    let strides = row_major_strides(&x.sizes);
    let kept: Vec<usize> = (0..rank).filter(|a| !axes.contains(a)).collect();
    let mut reduced = axes.to_vec();
    reduced.sort_unstable();
    let out_sizes: Vec<usize> = kept.iter().map(|a| x.sizes[*a]).collect();
    let red_sizes: Vec<usize> = reduced.iter().map(|a| x.sizes[*a]).collect();
    let red_n = checked_numel(&red_sizes)
        .ok_or_else(|| crate::memory::overflow("a reduction", &red_sizes))?;
    let mut out = zeroed(&out_sizes).map_err(|e| e.to_string())?;
    let out_n = out.len();
    if red_n == 0 && out_n > 0 && op != ReduceOp::Sum {
        return Err(format!(
            "{} over axes {axes:?} of sizes {:?}, which are empty",
            op.name(),
            x.sizes
        ));
    }
    let offsets: Vec<usize> = (0..red_n)
        .map(|i| {
            let mut r = i;
            let mut off = 0;
            for (k, ax) in reduced.iter().enumerate().rev() {
                off += (r % red_sizes[k]) * strides[*ax];
                r /= red_sizes[k];
            }
            off
        })
        .collect();
    fill(&mut out, out_n.saturating_mul(red_n), |o| {
        let mut base = 0;
        let mut r = o;
        for (k, ax) in kept.iter().enumerate().rev() {
            base += (r % out_sizes[k]) * strides[*ax];
            r /= out_sizes[k];
        }
        let vals = offsets.iter().map(|off| x.data[base + off]);
        match op {
            ReduceOp::Sum => vals.fold(0.0, |acc, v| acc + v),
            ReduceOp::Max => vals.fold(f64::NEG_INFINITY, |acc, v| {
                if acc.is_nan() || v.is_nan() {
                    f64::NAN
                } else {
                    acc.max(v)
                }
            }),
            ReduceOp::Min => vals.fold(f64::INFINITY, |acc, v| {
                if acc.is_nan() || v.is_nan() {
                    f64::NAN
                } else {
                    acc.min(v)
                }
            }),
        }
    });
    Ok((out_sizes, out))
}

/// Output axis `i` is input axis `perm[i]`.
pub(super) fn permute(x: &Dense, perm: &[usize]) -> Result<Value, String> {
    let rank = x.sizes.len();
    if perm.len() != rank {
        return Err(format!(
            "the permutation {perm:?} has {} entries for sizes {:?} of rank {rank}",
            perm.len(),
            x.sizes
        ));
    }
    check_axes(perm, rank)?;
    let in_strides = row_major_strides(&x.sizes);
    let sizes: Vec<usize> = perm.iter().map(|p| x.sizes[*p]).collect();
    let strides: Vec<usize> = perm.iter().map(|p| in_strides[*p]).collect();
    let mut out = vec![0.0; x.data.len()];
    fill(&mut out, x.data.len(), |o| {
        let mut r = o;
        let mut off = 0;
        for k in (0..rank).rev() {
            off += (r % sizes[k]) * strides[k];
            r /= sizes[k];
        }
        x.data[off]
    });
    Ok((sizes, out))
}
