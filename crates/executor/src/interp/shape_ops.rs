//! Ops that move or fold axes: reductions, permutations and the sizes of a reshape.

use weave_ir::{Fusion, ReduceOp, Scalar, TensorId};

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
    let mut out = zeroed(&out_sizes)?;
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

/// The output sizes of a reshape of `x` (the value of tensor `in_t`) to `shape`.
///
/// The IR's reshapes split one axis or merge two adjacent ones; the interpreter applies that
/// structure to the *actual* sizes, so that a chunk reshapes like the whole: a merge
/// multiplies the two actual sizes, and a split of axis `k` keeps the declared inner extent
/// and divides the actual size of axis `k` by it. The axis is found from the output's
/// reshape-produced (`rf`) axes, else by comparing declared extents with `shape`. Any other
/// reshape uses `shape` as evaluated, with the outermost target axis scaled when the input
/// is a chunk (the element counts differ and the rest of the target divides the input's).
pub(crate) fn reshape_sizes(
    fusion: &Fusion,
    in_t: TensorId,
    out_t: TensorId,
    shape: &[Scalar],
    ins: &[usize],
) -> Result<Vec<usize>, String> {
    let eval = |s: &Scalar| -> Result<usize, String> {
        match fusion.eval(s) {
            Some(v) if v >= 0 => Ok(v as usize),
            Some(v) => Err(format!(
                "target extent `{}` = {v} is negative",
                s.to_source()
            )),
            None => Err(format!(
                "target extent `{}` has no value (unbound parameter)",
                s.to_source()
            )),
        }
    };
    let r = ins.len();
    let rf: Vec<usize> = fusion
        .visible_axes(out_t)
        .iter()
        .enumerate()
        .filter(|(_, id)| fusion.id(**id).rfactor)
        .map(|(i, _)| i)
        .collect();
    let declared: Vec<Option<i64>> = fusion
        .visible_axes(in_t)
        .iter()
        .map(|id| fusion.eval(&fusion.id(*id).extent))
        .collect();
    let differs = |k: &usize| declared.get(*k).copied().flatten() != fusion.eval(&shape[*k]);

    if r >= 1 && shape.len() == r + 1 {
        let k = match rf.as_slice() {
            [k, k1] if *k1 == *k + 1 && *k < r => *k,
            _ => (0..r).find(differs).unwrap_or(r - 1),
        };
        let inner = eval(&shape[k + 1])?;
        if inner == 0 || !ins[k].is_multiple_of(inner) {
            return Err(format!(
                "cannot split axis {k} of sizes {ins:?} into rows of {inner}"
            ));
        }
        let mut out = ins[..k].to_vec();
        out.extend([ins[k] / inner, inner]);
        out.extend_from_slice(&ins[k + 1..]);
        return Ok(out);
    }
    if r >= 2 && shape.len() + 1 == r {
        let k = match rf.as_slice() {
            [k] if *k + 1 < r => *k,
            _ => (0..r - 1).find(differs).unwrap_or(r - 2),
        };
        let mut out = ins[..k].to_vec();
        out.push(ins[k] * ins[k + 1]);
        out.extend_from_slice(&ins[k + 2..]);
        return Ok(out);
    }
    let mut target = shape.iter().map(eval).collect::<Result<Vec<usize>, _>>()?;
    let numel =
        checked_numel(ins).ok_or_else(|| format!("the element count of {ins:?} overflows"))?;
    if checked_numel(&target) == Some(numel) {
        return Ok(target);
    }
    if let Some(rest) = target.get(1..).and_then(checked_numel) {
        if rest > 0 && numel % rest == 0 {
            target[0] = numel / rest;
            return Ok(target);
        }
    }
    Err(format!(
        "cannot reshape sizes {ins:?} ({numel} elements) to {target:?}"
    ))
}
