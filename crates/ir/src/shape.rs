//! The sizes an op's result has, from the actual sizes of its operands: the numpy broadcast
//! of elementwise operands and the sizes of a reshape. The interpreter and the kernel code
//! generator both derive shapes here, so that a value (or a chunk of one) has the same sizes
//! whichever of them computes it.

use crate::{Fusion, Scalar, TensorId};

/// Why operand sizes give no result sizes: [`broadcast_shapes`] and [`reshape_sizes`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// The shapes do not broadcast together.
    #[error("sizes {} do not broadcast", joined(.shapes))]
    NotBroadcastable {
        /// Every shape given, in order.
        shapes: Vec<Vec<usize>>,
    },
    /// A target extent of a reshape evaluates to a negative value.
    #[error("target extent `{extent}` = {value} is negative")]
    NegativeExtent {
        /// The extent, as source text.
        extent: String,
        /// Its value.
        value: i64,
    },
    /// A target extent of a reshape reads a parameter without a value.
    #[error("target extent `{extent}` has no value (unbound parameter)")]
    UnboundExtent {
        /// The extent, as source text.
        extent: String,
    },
    /// A split's inner extent is 0 or does not divide the axis.
    #[error("cannot split axis {axis} of sizes {sizes:?} into rows of {inner}")]
    SplitDoesNotDivide {
        /// The axis split.
        axis: usize,
        /// The input sizes.
        sizes: Vec<usize>,
        /// The inner extent.
        inner: usize,
    },
    /// The element count of the input overflows `usize`.
    #[error("the element count of {sizes:?} overflows")]
    Overflow {
        /// The input sizes.
        sizes: Vec<usize>,
    },
    /// The target holds another number of elements than the input, and no scaling of its
    /// outermost axis fixes that.
    #[error("cannot reshape sizes {sizes:?} ({numel} elements) to {target:?}")]
    ElementCount {
        /// The input sizes.
        sizes: Vec<usize>,
        /// Their element count.
        numel: usize,
        /// The target sizes, as evaluated.
        target: Vec<usize>,
    },
}

/// `[2, 3] and [3]`: shapes as a broadcast error lists them.
fn joined(shapes: &[Vec<usize>]) -> String {
    let all: Vec<String> = shapes.iter().map(|s| format!("{s:?}")).collect();
    all.join(" and ")
}

/// The numpy broadcast of `shapes`: trailing axes aligned, size-1 axes stretched.
pub fn broadcast_shapes(shapes: &[&[usize]]) -> Result<Vec<usize>, ShapeError> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        let off = rank - s.len();
        for (i, n) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = *n;
            } else if *n != 1 && *n != *o {
                return Err(ShapeError::NotBroadcastable {
                    shapes: shapes.iter().map(|s| s.to_vec()).collect(),
                });
            }
        }
    }
    Ok(out)
}

/// The output sizes of a reshape of a value of sizes `ins` (the value of tensor `in_t`, whose
/// reshape gives `out_t`) to `shape`.
///
/// The IR's reshapes split one axis or merge two adjacent ones; this applies that structure
/// to the *actual* sizes, so that a chunk of a tensor reshapes like the whole: a merge
/// multiplies the two actual sizes, and a split of axis `k` keeps the declared inner extent
/// and divides the actual size of axis `k` by it. The axis is found from the output's
/// reshape-produced (`rf`) axes, else by comparing declared extents with `shape`. Any other
/// reshape uses `shape` as evaluated, with the outermost target axis scaled when the input
/// is a chunk (the element counts differ and the rest of the target divides the input's).
pub fn reshape_sizes(
    fusion: &Fusion,
    in_t: TensorId,
    out_t: TensorId,
    shape: &[Scalar],
    ins: &[usize],
) -> Result<Vec<usize>, ShapeError> {
    let eval = |s: &Scalar| -> Result<usize, ShapeError> {
        match fusion.eval(s) {
            Some(v) if v >= 0 => Ok(v as usize),
            Some(value) => Err(ShapeError::NegativeExtent {
                extent: s.to_source(),
                value,
            }),
            None => Err(ShapeError::UnboundExtent {
                extent: s.to_source(),
            }),
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
            return Err(ShapeError::SplitDoesNotDivide {
                axis: k,
                sizes: ins.to_vec(),
                inner,
            });
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
    let numel = checked_numel(ins).ok_or_else(|| ShapeError::Overflow {
        sizes: ins.to_vec(),
    })?;
    if checked_numel(&target) == Some(numel) {
        return Ok(target);
    }
    if let Some(rest) = target.get(1..).and_then(checked_numel) {
        if rest > 0 && numel % rest == 0 {
            target[0] = numel / rest;
            return Ok(target);
        }
    }
    Err(ShapeError::ElementCount {
        sizes: ins.to_vec(),
        numel,
        target,
    })
}

/// The element count of `sizes`, `None` when it overflows.
fn checked_numel(sizes: &[usize]) -> Option<usize> {
    sizes.iter().try_fold(1usize, |acc, s| acc.checked_mul(*s))
}
