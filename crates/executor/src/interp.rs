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

use std::borrow::Cow;
use std::collections::HashMap;

use rayon::prelude::*;
use weave_ir::{BinaryOp, DType, ExprKind, Fusion, ReduceOp, Scalar, TensorId, UnaryOp};

use crate::dense::{checked_numel, round_to, Dense};

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
) -> Result<Vec<Dense>, String> {
    let declared = fusion.inputs();
    if inputs.len() != declared.len() {
        return Err(format!(
            "fusion `{}` takes {} input{}, got {}",
            fusion.name,
            declared.len(),
            if declared.len() == 1 { "" } else { "s" },
            inputs.len()
        ));
    }
    let mut env: HashMap<TensorId, Cow<'_, Dense>> = HashMap::new();
    for (i, (t, d)) in declared.iter().zip(inputs).enumerate() {
        let tv = fusion.tensor(*t);
        let rank = fusion.visible_axes(*t).len();
        let what = format!("input {i} (`{}`)", tv.name);
        if d.sizes.len() != rank {
            return Err(format!(
                "{what}: expected rank {rank}, got {}",
                d.sizes.len()
            ));
        }
        if d.dtype != tv.dtype {
            return Err(format!(
                "{what}: expected dtype {}, got {}",
                tv.dtype, d.dtype
            ));
        }
        match checked_numel(&d.sizes) {
            Some(n) if n == d.data.len() => {}
            _ => {
                return Err(format!(
                    "{what}: sizes {:?} do not match its {} values",
                    d.sizes,
                    d.data.len()
                ))
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
                return Err(format!(
                    "{op} has {} outputs; the interpreter handles exprs with exactly one",
                    outs.len()
                ))
            }
        };
        let out_name = &fusion.tensor(out_t).name;
        let value = {
            let mut ins: Vec<&Dense> = Vec::with_capacity(expr.inputs.len());
            for t in &expr.inputs {
                match env.get(t) {
                    Some(d) => ins.push(d.as_ref()),
                    None => {
                        return Err(format!(
                            "{op} `{out_name}`: operand `{}` is read before it is defined",
                            fusion.tensor(*t).name
                        ))
                    }
                }
            }
            let value = eval_expr(fusion, &expr.kind, &expr.inputs, &ins, out_t)
                .map_err(|m| format!("{op} `{out_name}`: {m}"))?;
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
            .ok_or_else(|| format!("output `{}` is never defined", fusion.tensor(*t).name))?
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
            reshape_sizes(fusion, in_ids[0], out_t, shape, &x.sizes)?,
            x.data.clone(),
        ),
        ExprKind::Matmul => matmul(x, ins[1])?,
        ExprKind::Linear => linear(x, ins[1], ins.get(2).copied())?,
        ExprKind::Iota { axis } => {
            check_axes(&[*axis], x.sizes.len())?;
            whole_axis(fusion, kind, in_ids[0], *axis, x.sizes[*axis])?;
            let inner: usize = x.sizes[*axis + 1..].iter().product();
            let n = x.sizes[*axis].max(1);
            let mut data = zeroed(&x.sizes)?;
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
/// takes its value there. `None` when no op mentions it, so that every rank shares the
/// kernel. The host program is the same text on every rank; this is where a kernel learns
/// which device runs it.
pub fn bind_rank(fusion: &Fusion, rank: i64) -> Option<Fusion> {
    let mentions = |b: &Scalar| b.symbols().iter().any(|s| &**s == weave_ir::RANK);
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
    let mut data = zeroed(&sizes)?;
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

fn unary_fn(op: UnaryOp) -> fn(f64) -> f64 {
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

fn binary_fn(op: BinaryOp) -> fn(f64, f64) -> f64 {
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

fn bool_f64(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// Checks that `axes` are distinct and below `rank`.
fn check_axes(axes: &[usize], rank: usize) -> Result<(), String> {
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

fn row_major_strides(sizes: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; sizes.len()];
    let mut s = 1usize;
    for (k, n) in sizes.iter().enumerate().rev() {
        strides[k] = s;
        s = s.saturating_mul(*n);
    }
    strides
}

/// The numpy broadcast of `shapes`: trailing axes aligned, size-1 axes stretched.
pub(crate) fn broadcast_shapes(shapes: &[&[usize]]) -> Result<Vec<usize>, String> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        let off = rank - s.len();
        for (i, n) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = *n;
            } else if *n != 1 && *n != *o {
                let all: Vec<String> = shapes.iter().map(|s| format!("{s:?}")).collect();
                return Err(format!("sizes {} do not broadcast", all.join(" and ")));
            }
        }
    }
    Ok(out)
}

/// Strides of a tensor of `sizes` read in the broadcast shape `out`: stretched and missing
/// leading axes get stride 0.
fn broadcast_strides(sizes: &[usize], out: &[usize]) -> Vec<usize> {
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
fn fill(out: &mut [f64], work: usize, f: impl Fn(usize) -> f64 + Sync + Send) {
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
fn for_rows(out: &mut [f64], row_len: usize, f: impl Fn(usize, &mut [f64]) + Sync + Send) {
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
fn zeroed(sizes: &[usize]) -> Result<Vec<f64>, String> {
    crate::memory::allocate_host("a result", sizes, size_of::<f64>(), || {
        crate::memory::try_zeros(checked_numel(sizes).unwrap_or(0))
    })
}

/// A pointwise op over `N` operands with numpy broadcasting.
fn pointwise<const N: usize>(
    ops: [&Dense; N],
    f: impl Fn([f64; N]) -> f64 + Sync + Send,
) -> Result<Value, String> {
    let shapes: Vec<&[usize]> = ops.iter().map(|d| d.sizes.as_slice()).collect();
    let sizes = broadcast_shapes(&shapes)?;
    let mut out = zeroed(&sizes)?;
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

/// Sum or max over `axes` (which the output drops), each output accumulated in `f64` in
/// row-major order of the reduced indices.
fn reduce(x: &Dense, op: ReduceOp, axes: &[usize]) -> Result<Value, String> {
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
fn permute(x: &Dense, perm: &[usize]) -> Result<Value, String> {
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

/// `[.., m, k] x [.., k, n] -> [.., m, n]`, batch axes broadcast numpy-style (a rank-2 `b`
/// applies to every batch of `a`).
fn matmul(a: &Dense, b: &Dense) -> Result<Value, String> {
    let (ra, rb) = (a.sizes.len(), b.sizes.len());
    if ra < 2 || rb < 2 {
        return Err(format!(
            "operands must have rank 2 or more, got sizes {:?} and {:?}",
            a.sizes, b.sizes
        ));
    }
    let (m, k) = (a.sizes[ra - 2], a.sizes[ra - 1]);
    let (kb, n) = (b.sizes[rb - 2], b.sizes[rb - 1]);
    if k != kb {
        return Err(format!(
            "contraction sizes differ: {:?} x {:?}",
            a.sizes, b.sizes
        ));
    }
    let (batch_a, batch_b) = (&a.sizes[..ra - 2], &b.sizes[..rb - 2]);
    let batch = broadcast_shapes(&[batch_a, batch_b]).map_err(|_| {
        format!(
            "batch sizes {batch_a:?} and {batch_b:?} do not broadcast (operands {:?} x {:?})",
            a.sizes, b.sizes
        )
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
fn linear(x: &Dense, w: &Dense, bias: Option<&Dense>) -> Result<Value, String> {
    let rx = x.sizes.len();
    if rx < 1 {
        return Err("the input must have rank 1 or more, got a rank-0 tensor".to_string());
    }
    if w.sizes.len() != 2 {
        return Err(format!(
            "the weight must have rank 2 ([n, k]), got sizes {:?}",
            w.sizes
        ));
    }
    let (n, kw) = (w.sizes[0], w.sizes[1]);
    let k = x.sizes[rx - 1];
    if k != kw {
        return Err(format!(
            "contraction sizes differ: input {:?}, weight {:?}",
            x.sizes, w.sizes
        ));
    }
    if let Some(b) = bias {
        if b.sizes != [n] {
            return Err(format!(
                "the bias has sizes {:?}, expected [{n}] (weight {:?})",
                b.sizes, w.sizes
            ));
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
fn gemm_strided(
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
fn gemm(m: usize, k: usize, n: usize, a: &[f64], b: &[f64], c: &mut [f64], _parallel: bool) {
    gemm_strided((m, k, n), a, b, (n, 1), c);
}

/// `a @ b` as a dense tensor of `a`'s dtype (unrounded): what a GEMM library call computes
/// before the result is stored.
pub fn matmul_dense(a: &Dense, b: &Dense) -> Result<Dense, String> {
    let (sizes, data) = matmul(a, b)?;
    Ok(Dense {
        dtype: a.dtype,
        sizes,
        data,
    })
}

/// `x @ wᵀ (+ bias)` as a dense tensor of `x`'s dtype (unrounded).
pub fn linear_dense(x: &Dense, w: &Dense, bias: Option<&Dense>) -> Result<Dense, String> {
    let (sizes, data) = linear(x, w, bias)?;
    Ok(Dense {
        dtype: x.dtype,
        sizes,
        data,
    })
}

#[cfg(test)]
mod tests {
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
        let e = matmul(&a, &d(&[3, 2, 1], vec![0.0; 6])).unwrap_err();
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
