//! The CPU interpreter of fusions: evaluates every expr of a fusion in program order, in
//! `f64`, over its logical semantics — schedules, device and stream parallel types and
//! meshes are ignored.
//!
//! It serves two purposes: the *reference* a run is checked against ([`Precision::RoundEach`],
//! on the global inputs), and the CPU backend's kernel for a segment
//! ([`Precision::RoundOutputs`], on whatever chunk the host program launches it on).
//!
//! Shapes come from the actual inputs, not from the declared extents: a segment declared on
//! `[x, y, z]` is often launched on a chunk `[x / s, y, z]`, and every op derives its output
//! sizes from its operands' sizes. Only ranks and dtypes of the inputs are checked against
//! the declaration. Intermediate values follow their tensors' declared dtypes where that
//! changes the meaning (`i64` results are truncated, so integer division truncates; `bool`
//! results are 0 or 1); floating-point intermediates are rounded by `cast`, and by every op
//! under [`Precision::RoundEach`].
//!
//! By concern: this module walks a fusion and evaluates each expr; `elementwise` holds the
//! scalar functions, broadcasting and the parallel fill loops; `shape_ops` reductions and
//! permutations; the sizes of broadcasts and reshapes come from `weave_ir::shape` (shared
//! with the kernel code generator); `gemm` matrix products.

mod elementwise;
mod gemm;
mod shape_ops;

use std::borrow::Cow;
use std::collections::HashMap;

use weave_ir::shape::reshape_sizes;
use weave_ir::{BinaryOp, DType, ExprKind, Fusion, Scalar, TensorId};

use crate::dense::{checked_numel, round_to, Dense};

use elementwise::{binary_fn, check_axes, fill, pointwise, unary_fn, zeroed};
use gemm::{linear, matmul};
pub use gemm::{linear_dense, matmul_dense, GemmError};
use shape_ops::{permute, reduce};

/// How the interpreter rounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// The program's value in `f64`: nothing is rounded except by explicit `cast` ops (which
    /// are part of the program's meaning).
    Exact,
    /// A CPU kernel segment: computed in `f64`, with every fusion output (and every `cast`)
    /// rounded to its declared dtype, as a kernel storing to memory of that dtype would.
    RoundOutputs,
    /// The reference of a run: every op computed in `f64` and its result rounded to the
    /// op's dtype, as a device that stores the value in that dtype does (a `bf16` GEMM's
    /// result is a `bf16` value before a `cast` to `f32` reads it). View ops (set, broadcast,
    /// squeeze, permute, reshape) move values and round nothing.
    RoundEach,
}

/// Why [`eval_fusion`] cannot evaluate a fusion on its inputs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InterpError {
    /// Not one input per fusion input.
    #[error("fusion `{fusion}` takes {expected} input{}, got {got}", plural(*.expected))]
    InputCount {
        /// The fusion's name.
        fusion: String,
        /// The inputs it declares.
        expected: usize,
        /// The inputs given.
        got: usize,
    },
    /// An input's rank differs from its declared logical rank.
    #[error("input {index} (`{name}`): expected rank {expected}, got {got}")]
    InputRank {
        /// The input's position.
        index: usize,
        /// Its name.
        name: String,
        /// The declared rank.
        expected: usize,
        /// The rank given.
        got: usize,
    },
    /// An input's dtype differs from its declared dtype.
    #[error("input {index} (`{name}`): expected dtype {expected}, got {got}")]
    InputDType {
        /// The input's position.
        index: usize,
        /// Its name.
        name: String,
        /// The declared dtype.
        expected: DType,
        /// The dtype given.
        got: DType,
    },
    /// An input's value count does not match its sizes.
    #[error("input {index} (`{name}`): sizes {sizes:?} do not match its {values} values")]
    InputValues {
        /// The input's position.
        index: usize,
        /// Its name.
        name: String,
        /// Its sizes.
        sizes: Vec<usize>,
        /// Its value count.
        values: usize,
    },
    /// An expr has other than one output.
    #[error("{op} has {count} outputs; the interpreter handles exprs with exactly one")]
    OutputCount {
        /// The expr's op.
        op: &'static str,
        /// Its output count.
        count: usize,
    },
    /// An expr reads a tensor that no earlier expr defines.
    #[error("{op} `{output}`: operand `{operand}` is read before it is defined")]
    ReadBeforeDefined {
        /// The expr's op.
        op: &'static str,
        /// Its output.
        output: String,
        /// The operand.
        operand: String,
    },
    /// An op cannot take its operands (sizes, values, an allocation); `reason` says why.
    #[error("{op} `{output}`: {reason}")]
    OpFailed {
        /// The expr's op.
        op: &'static str,
        /// Its output.
        output: String,
        /// Why it failed.
        reason: String,
    },
    /// A fusion output that no expr defines.
    #[error("output `{name}` is never defined")]
    OutputUndefined {
        /// The output's name.
        name: String,
    },
}

/// `"s"` unless `n` is 1.
fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Element count from which pointwise ops, reductions and GEMMs use rayon.
const PARALLEL_MIN: usize = 1 << 15;

/// Evaluates `fusion` on `inputs` (one per fusion input, in declaration order) and returns
/// one tensor per fusion output, in declaration order, each of the output's declared dtype.
///
/// Errors (never panics) on: a wrong number of inputs; an input whose rank differs from the
/// declared logical rank, whose dtype differs from the declared dtype, or whose value count
/// does not match its sizes; operand sizes an op cannot take (shapes that do not broadcast,
/// contraction sizes that differ, a squeezed axis that is not of size 1, a reshape that does
/// not divide); integer division by zero; and malformed fusions.
pub fn eval_fusion(
    fusion: &Fusion,
    inputs: &[Dense],
    mode: Precision,
) -> Result<Vec<Dense>, InterpError> {
    let declared = fusion.inputs();
    if inputs.len() != declared.len() {
        return Err(InterpError::InputCount {
            fusion: fusion.name.clone(),
            expected: declared.len(),
            got: inputs.len(),
        });
    }
    let mut env: HashMap<TensorId, Cow<'_, Dense>> = HashMap::new();
    for (index, (t, d)) in declared.iter().zip(inputs).enumerate() {
        let tv = fusion.tensor(*t);
        let rank = fusion.visible_axes(*t).len();
        let name = || tv.name.clone();
        if d.sizes.len() != rank {
            return Err(InterpError::InputRank {
                index,
                name: name(),
                expected: rank,
                got: d.sizes.len(),
            });
        }
        if d.dtype != tv.dtype {
            return Err(InterpError::InputDType {
                index,
                name: name(),
                expected: tv.dtype,
                got: d.dtype,
            });
        }
        match checked_numel(&d.sizes) {
            Some(n) if n == d.data.len() => {}
            _ => {
                return Err(InterpError::InputValues {
                    index,
                    name: name(),
                    sizes: d.sizes.clone(),
                    values: d.data.len(),
                })
            }
        }
        env.insert(*t, Cow::Borrowed(d));
    }

    // Drop intermediates after their last use, so that a long program holds only live
    // tensors.
    let order = fusion.exprs();
    let mut last_use: HashMap<TensorId, usize> = HashMap::new();
    for (n, e) in order.iter().enumerate() {
        for t in &fusion.expr(*e).inputs {
            last_use.insert(*t, n);
        }
    }

    for (n, e) in order.iter().enumerate() {
        let expr = fusion.expr(*e);
        let op = expr.kind.op_name();
        let out_t = match expr.outputs.as_slice() {
            [o] => *o,
            outs => {
                return Err(InterpError::OutputCount {
                    op,
                    count: outs.len(),
                })
            }
        };
        let out_name = &fusion.tensor(out_t).name;
        let value = {
            let mut ins: Vec<&Dense> = Vec::with_capacity(expr.inputs.len());
            for t in &expr.inputs {
                match env.get(t) {
                    Some(d) => ins.push(d.as_ref()),
                    None => {
                        return Err(InterpError::ReadBeforeDefined {
                            op,
                            output: out_name.clone(),
                            operand: fusion.tensor(*t).name.clone(),
                        })
                    }
                }
            }
            let value =
                eval_expr(fusion, &expr.kind, &expr.inputs, &ins, out_t).map_err(|reason| {
                    InterpError::OpFailed {
                        op,
                        output: out_name.clone(),
                        reason,
                    }
                })?;
            if mode == Precision::RoundEach && !is_view(&expr.kind) {
                value.rounded()
            } else {
                value
            }
        };
        for t in &expr.inputs {
            if last_use.get(t) == Some(&n) && !fusion.is_output(*t) {
                env.remove(t);
            }
        }
        env.insert(out_t, Cow::Owned(value));
    }

    let mut outs = Vec::with_capacity(fusion.outputs().len());
    for t in fusion.outputs() {
        let d = env
            .remove(t)
            .ok_or_else(|| InterpError::OutputUndefined {
                name: fusion.tensor(*t).name.clone(),
            })?
            .into_owned();
        outs.push(match mode {
            Precision::Exact | Precision::RoundEach => d,
            Precision::RoundOutputs => d.rounded(),
        });
    }
    Ok(outs)
}

/// Sizes and row-major values of an op's result.
type Value = (Vec<usize>, Vec<f64>);

/// Evaluates one expr; `in_ids` are its operand tensors, `ins` their values.
fn eval_expr(
    fusion: &Fusion,
    kind: &ExprKind,
    in_ids: &[TensorId],
    ins: &[&Dense],
    out_t: TensorId,
) -> Result<Dense, String> {
    let out_dtype = fusion.tensor(out_t).dtype;
    let arity = kind.arity();
    if !arity.contains(&ins.len()) {
        return Err(format!(
            "expected {} operands, got {}",
            arity.start(),
            ins.len()
        ));
    }
    let x = ins[0];
    let (sizes, mut data) = match kind {
        ExprKind::Set | ExprKind::SegmentSet => (x.sizes.clone(), x.data.clone()),
        ExprKind::Cast(d) => {
            let d = *d;
            pointwise([x], move |[v]| round_to(d, v))?
        }
        ExprKind::Unary(u) => {
            let f = unary_fn(*u);
            pointwise([x], move |[v]| f(v))?
        }
        ExprKind::Binary(b) => {
            let y = ins[1];
            if x.dtype == DType::I64 && *b == BinaryOp::Div && y.data.contains(&0.0) {
                return Err("integer division by zero".to_string());
            }
            if x.dtype == DType::I64 && *b == BinaryOp::Pow && y.data.iter().any(|v| *v < 0.0) {
                return Err("integer base raised to a negative integer power".to_string());
            }
            let f = binary_fn(*b);
            pointwise([x, y], move |[a, b]| f(a, b))?
        }
        ExprKind::BinaryLit { op, lit, lit_first } => {
            let l = lit.0;
            if x.dtype == DType::I64 {
                if *op == BinaryOp::Div
                    && (if *lit_first {
                        x.data.contains(&0.0)
                    } else {
                        l == 0.0
                    })
                {
                    return Err("integer division by zero".to_string());
                }
                let negative_exponent = if *lit_first {
                    x.data.iter().any(|v| *v < 0.0)
                } else {
                    l < 0.0
                };
                if *op == BinaryOp::Pow && negative_exponent {
                    return Err("integer base raised to a negative integer power".to_string());
                }
            }
            let f = binary_fn(*op);
            if *lit_first {
                pointwise([x], move |[v]| f(l, v))?
            } else {
                pointwise([x], move |[v]| f(v, l))?
            }
        }
        ExprKind::WhereLit { a, b } => {
            let (a, b) = (a.map(|l| l.0), b.map(|l| l.0));
            pointwise([x, ins[1]], move |[c, v]| {
                if c != 0.0 {
                    a.unwrap_or(v)
                } else {
                    b.unwrap_or(v)
                }
            })?
        }
        ExprKind::Where => pointwise(
            [x, ins[1], ins[2]],
            |[c, a, b]| {
                if c != 0.0 {
                    a
                } else {
                    b
                }
            },
        )?,
        ExprKind::Reduction { op, axes } => reduce(x, *op, axes)?,
        ExprKind::Broadcast { axes } => {
            let out_rank = x.sizes.len() + axes.len();
            check_axes(axes, out_rank)?;
            let mut src = x.sizes.iter();
            let sizes = (0..out_rank)
                .map(|k| {
                    if axes.contains(&k) {
                        1
                    } else {
                        src.next().copied().unwrap_or(1)
                    }
                })
                .collect();
            (sizes, x.data.clone())
        }
        ExprKind::Squeeze { axes } => {
            check_axes(axes, x.sizes.len())?;
            for a in axes {
                if x.sizes[*a] != 1 {
                    return Err(format!(
                        "axis {a} of sizes {:?} has size {}, not 1",
                        x.sizes, x.sizes[*a]
                    ));
                }
            }
            let sizes = (0..x.sizes.len())
                .filter(|k| !axes.contains(k))
                .map(|k| x.sizes[k])
                .collect();
            (sizes, x.data.clone())
        }
        ExprKind::Permute { perm } => permute(x, perm)?,
        ExprKind::Reshape { shape } => (
            reshape_sizes(fusion, in_ids[0], out_t, shape, &x.sizes).map_err(|e| e.to_string())?,
            x.data.clone(),
        ),
        ExprKind::Matmul => matmul(x, ins[1]).map_err(|e| e.to_string())?,
        ExprKind::Linear => linear(x, ins[1], ins.get(2).copied()).map_err(|e| e.to_string())?,
        ExprKind::Iota { axis } => {
            check_axes(&[*axis], x.sizes.len())?;
            whole_axis(fusion, kind, in_ids[0], *axis, x.sizes[*axis])?;
            let inner: usize = x.sizes[*axis + 1..].iter().product();
            let n = x.sizes[*axis].max(1);
            let mut data = zeroed(&x.sizes).map_err(|e| e.to_string())?;
            fill(&mut data, 0, |i| ((i / inner.max(1)) % n) as f64);
            (x.sizes.clone(), data)
        }
        ExprKind::Slice { axis, start, stop } => {
            check_axes(&[*axis], x.sizes.len())?;
            whole_axis(fusion, kind, in_ids[0], *axis, x.sizes[*axis])?;
            let value = |s: &Scalar| {
                fusion
                    .eval(s)
                    .and_then(|v| usize::try_from(v).ok())
                    .ok_or_else(|| format!("slice bound `{}` has no value", s.to_source()))
            };
            let (b, e) = (value(start)?, value(stop)?);
            if b > e || e > x.sizes[*axis] {
                return Err(format!(
                    "slice {b}..{e} of axis {axis} of sizes {:?}",
                    x.sizes
                ));
            }
            let outer: usize = x.sizes[..*axis].iter().product();
            let inner: usize = x.sizes[*axis + 1..].iter().product();
            let mut data = Vec::with_capacity(outer * (e - b) * inner);
            for o in 0..outer {
                let row = (o * x.sizes[*axis] + b) * inner;
                data.extend_from_slice(&x.data[row..row + (e - b) * inner]);
            }
            let mut sizes = x.sizes.clone();
            sizes[*axis] = e - b;
            (sizes, data)
        }
        ExprKind::IndexSelect { axis, base } => {
            index_select(fusion, in_ids, x, ins[1], *axis, base.as_ref())?
        }
        ExprKind::Concat { axis } => {
            let y = ins[1];
            check_axes(&[*axis], x.sizes.len())?;
            let same = x.sizes.len() == y.sizes.len()
                && (0..x.sizes.len()).all(|k| k == *axis || x.sizes[k] == y.sizes[k]);
            if !same {
                return Err(format!(
                    "concat along axis {axis} of sizes {:?} and {:?}",
                    x.sizes, y.sizes
                ));
            }
            whole_axis(fusion, kind, in_ids[0], *axis, x.sizes[*axis])?;
            whole_axis(fusion, kind, in_ids[1], *axis, y.sizes[*axis])?;
            let outer: usize = x.sizes[..*axis].iter().product();
            let inner: usize = x.sizes[*axis + 1..].iter().product();
            let (na, nb) = (x.sizes[*axis] * inner, y.sizes[*axis] * inner);
            let mut data = Vec::with_capacity(outer * (na + nb));
            for o in 0..outer {
                data.extend_from_slice(&x.data[o * na..(o + 1) * na]);
                data.extend_from_slice(&y.data[o * nb..(o + 1) * nb]);
            }
            let mut sizes = x.sizes.clone();
            sizes[*axis] += y.sizes[*axis];
            (sizes, data)
        }
    };
    if !is_view(kind) && matches!(out_dtype, DType::I64 | DType::Bool) {
        for v in &mut data {
            *v = round_to(out_dtype, *v);
        }
    }
    Ok(Dense {
        dtype: out_dtype,
        sizes,
        data,
    })
}

/// `iota`, `slice` and `concat` index their axis globally, so a kernel must hold all of it:
/// an error (never a wrong number) where a device or stream split cut the axis of operand
/// `t` to `local` of its declared extent (sharding propagation can place such a split where
/// the user's schedules did not, which load checks).
fn whole_axis(
    fusion: &Fusion,
    kind: &ExprKind,
    t: TensorId,
    axis: usize,
    local: usize,
) -> Result<(), String> {
    let vis = fusion.visible_axes(t);
    let Some(id) = vis.get(axis) else {
        return Ok(());
    };
    match fusion.eval(&fusion.id(*id).extent) {
        Some(n) if n as usize != local => Err(format!(
            "{}: axis {axis} of `{}` is cut to {local} of its {n} elements here (a device or stream split of that axis reached this op); {} needs the whole axis: keep it unsplit, or split another axis",
            kind.op_name(),
            fusion.tensor(t).name,
            kind.op_name()
        )),
        _ => Ok(()),
    }
}

/// A copy of the kernel `fusion` for the device of rank `rank`, where an op's size mentions
/// the host programs' built-in `rank` (a vocabulary-parallel lookup's first row): `rank`
/// takes its value there, and the copy is named `<name>_rank<rank>` (the kernel table keys
/// plans by name, and each rank's copy generates other code). `None` when no op mentions
/// it, so that every rank shares the kernel. The host program is the same text on every
/// rank; this is where a kernel learns which device runs it.
pub fn bind_rank(fusion: &Fusion, rank: i64) -> Option<Fusion> {
    let mentions = |b: &Scalar| b.mentions(weave_ir::Builtin::Rank);
    let bound: Vec<_> = fusion
        .exprs()
        .iter()
        .copied()
        .filter(|e| {
            matches!(&fusion.expr(*e).kind, ExprKind::IndexSelect { base: Some(b), .. } if mentions(b))
        })
        .collect();
    if bound.is_empty() {
        return None;
    }
    let mut copy = fusion.clone();
    copy.name = format!("{}_rank{rank}", fusion.name);
    for e in bound {
        if let ExprKind::IndexSelect { base: Some(b), .. } = &mut copy.expr_mut(e).kind {
            *b = b.substitute(&|n| (n == weave_ir::RANK).then(|| Scalar::c(rank)));
        }
    }
    Some(copy)
}

/// `index_select(table, ids, axis [, base])`: the rows of `table` along `axis` that the ids
/// name. The ids index the whole axis as declared (`rows` elements): one outside `0..rows` is
/// an error naming the ids, the position and the value, never a read out of bounds. Without a
/// base the operand must hold the whole axis; with one (a vocabulary-parallel lookup's
/// partial, run on one device) it holds the rows `base..base + local`, and an id outside them
/// gives a zero row, which the sum across the devices fills in.
fn index_select(
    fusion: &Fusion,
    in_ids: &[TensorId],
    table: &Dense,
    ids: &Dense,
    axis: usize,
    base: Option<&Scalar>,
) -> Result<Value, String> {
    check_axes(&[axis], table.sizes.len())?;
    if ids.sizes.len() != 1 {
        return Err(format!("the ids have sizes {:?}, not one axis", ids.sizes));
    }
    let local = table.sizes[axis];
    let first = match base {
        None => {
            whole_axis(
                fusion,
                &ExprKind::IndexSelect { axis, base: None },
                in_ids[0],
                axis,
                local,
            )?;
            0
        }
        Some(b) => fusion.eval(b).ok_or_else(|| {
            format!(
                "the first row `{}` of this device's block has no value (a vocabulary-parallel lookup's partial runs on a device, which gives `rank` its value)",
                b.to_source()
            )
        })?,
    };
    let rows = fusion
        .visible_axes(in_ids[0])
        .get(axis)
        .and_then(|id| fusion.eval(&fusion.id(*id).extent))
        .unwrap_or(local as i64);
    let name = |t: usize| fusion.tensor(in_ids[t]).name.clone();
    let outer: usize = table.sizes[..axis].iter().product();
    let inner: usize = table.sizes[axis + 1..].iter().product();
    let n = ids.sizes[0];
    let mut sizes = table.sizes.clone();
    sizes[axis] = n;
    let mut data = zeroed(&sizes).map_err(|e| e.to_string())?;
    for (k, v) in ids.data.iter().enumerate() {
        if !(v.fract() == 0.0 && *v >= 0.0 && *v < rows as f64) {
            return Err(format!(
                "id {v} at position {k} of `{}` is outside the {rows} rows of axis {axis} of `{}` (ids must lie in 0..{rows})",
                name(1),
                name(0)
            ));
        }
        let row = *v as i64 - first;
        if row < 0 || row >= local as i64 {
            continue;
        }
        let row = row as usize;
        for o in 0..outer {
            let src = (o * local + row) * inner;
            let dst = (o * n + k) * inner;
            data[dst..dst + inner].copy_from_slice(&table.data[src..src + inner]);
        }
    }
    Ok((sizes, data))
}

/// True for the ops that move values without computing new ones.
pub(crate) fn is_view(kind: &ExprKind) -> bool {
    matches!(
        kind,
        ExprKind::Set
            | ExprKind::SegmentSet
            | ExprKind::Broadcast { .. }
            | ExprKind::Squeeze { .. }
            | ExprKind::Permute { .. }
            | ExprKind::Reshape { .. }
            | ExprKind::Slice { .. }
            | ExprKind::Concat { .. }
            | ExprKind::IndexSelect { .. }
    )
}

#[cfg(test)]
mod tests {
    use weave_ir::ReduceOp;

    use super::*;

    fn d(sizes: &[usize], data: Vec<f64>) -> Dense {
        Dense::new(DType::F64, sizes.to_vec(), data).unwrap()
    }

    #[test]
    fn pointwise_aligns_trailing_axes_of_different_ranks() {
        let a = d(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = d(&[3], vec![10.0, 20.0, 30.0]);
        let (sizes, data) = pointwise([&a, &b], |[x, y]| x + y).unwrap();
        assert_eq!(sizes, vec![2, 3]);
        assert_eq!(data, vec![11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
        let c = d(&[2, 1], vec![100.0, 200.0]);
        let (sizes, data) = pointwise([&b, &c], |[x, y]| x + y).unwrap();
        assert_eq!(sizes, vec![2, 3]);
        assert_eq!(data, vec![110.0, 120.0, 130.0, 210.0, 220.0, 230.0]);
        let s = d(&[], vec![2.0]);
        let (sizes, data) = pointwise([&a, &s], |[x, y]| x * y).unwrap();
        assert_eq!((sizes, data[5]), (vec![2, 3], 12.0));
        assert_eq!(
            pointwise([&a, &d(&[2], vec![0.0; 2])], |[x, _]| x).unwrap_err(),
            "sizes [2, 3] and [2] do not broadcast"
        );
    }

    #[test]
    fn matmul_broadcasts_size_one_batch_axes() {
        // [2, 1, 2, 2] x [1, 3, 2, 1]: batch [2, 3], every pair of batch matrices.
        let a = d(&[2, 1, 2, 2], vec![1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.0]);
        let b = d(&[1, 3, 2, 1], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let (sizes, data) = matmul(&a, &b).unwrap();
        assert_eq!(sizes, vec![2, 3, 2, 1]);
        assert_eq!(
            data,
            vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
        );
        let a = d(&[2, 2, 2], vec![0.0; 8]);
        let e = matmul(&a, &d(&[3, 2, 1], vec![0.0; 6]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "batch sizes [2] and [3] do not broadcast (operands [2, 2, 2] x [3, 2, 1])"
        );
    }

    #[test]
    fn empty_tensors_and_reductions() {
        let e = d(&[0, 3], vec![]);
        assert_eq!(
            reduce(&e, ReduceOp::Sum, &[0]).unwrap(),
            (vec![3], vec![0.0; 3])
        );
        assert_eq!(
            reduce(&e, ReduceOp::Max, &[0]).unwrap_err(),
            "max over axes [0] of sizes [0, 3], which are empty"
        );
        assert_eq!(reduce(&e, ReduceOp::Max, &[1]).unwrap(), (vec![0], vec![]));
        let (sizes, data) = matmul(&d(&[2, 0], vec![]), &d(&[0, 2], vec![])).unwrap();
        assert_eq!((sizes, data), (vec![2, 2], vec![0.0; 4]));
        let (sizes, data) = linear(&d(&[0, 2], vec![]), &d(&[3, 2], vec![0.0; 6]), None).unwrap();
        assert_eq!((sizes, data), (vec![0, 3], vec![]));
    }

    #[test]
    fn max_propagates_nan() {
        let x = d(&[3], vec![1.0, f64::NAN, 2.0]);
        assert!(reduce(&x, ReduceOp::Max, &[0]).unwrap().1[0].is_nan());
    }
}
