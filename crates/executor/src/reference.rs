//! Reference results and their comparison with actual ones: the `f64` evaluation of a fusion
//! on its global (unsharded) inputs with every op's result rounded to its dtype, the
//! tolerance each output is checked at (its dtype's, loosened by the least precise rounding
//! on its path), inputs kept inside the domains of the ops that read them, and an
//! element-wise comparison that judges errors relative to the tensor's magnitude.

use std::collections::HashMap;
use std::fmt;

use weave_ir::{BinaryOp, DType, ExprKind, Fusion, TensorId, UnaryOp};

use crate::dense::Dense;
use crate::interp::{eval_fusion, is_view, InterpError, Precision};

/// The reference outputs of `fusion` on its global (unsharded) `inputs`: every op in `f64`,
/// its result rounded to the op's dtype as a device storing it does
/// ([`Precision::RoundEach`]; a `bf16` GEMM's result is a `bf16` value before a `cast` to
/// `f32` reads it).
pub fn run_reference(fusion: &Fusion, inputs: &[Dense]) -> Result<Vec<Dense>, InterpError> {
    eval_fusion(fusion, inputs, Precision::RoundEach)
}

/// Of two floating-point dtypes (or none), the one whose tolerance is looser.
fn looser(a: Option<DType>, b: Option<DType>) -> Option<DType> {
    match (a, b) {
        (Some(x), Some(y)) => {
            if Tolerance::for_dtype(y).rtol > Tolerance::for_dtype(x).rtol {
                Some(y)
            } else {
                Some(x)
            }
        }
        (x, None) => x,
        (None, y) => y,
    }
}

/// The tolerance each output of `fusion` is checked at, in output order.
///
/// A device and the reference round the same ops, but not always the same value: a `bf16`
/// GEMM accumulates in `f32` before it rounds, a fused kernel keeps its intermediates in
/// `float`, so a result rounded to `bf16` may land one `bf16` step away from the
/// reference's, and every value computed from it carries that error, whatever its own dtype.
/// So an output's tolerance is its dtype's ([`Tolerance::for_dtype`]) loosened to that of the
/// least precise floating-point dtype an op on its path computed: the logits pattern (a
/// `bf16` linear cast to `f32`) is checked at the `bf16` tolerance. Values that are exact
/// on both sides loosen nothing: fusion inputs, view ops, and a `cast` of an exact value
/// (both sides round the same number). Integer and `bool` outputs must match exactly.
pub fn output_tolerances(fusion: &Fusion) -> Vec<Tolerance> {
    let mut path: HashMap<TensorId, Option<DType>> = HashMap::new();
    for e in fusion.exprs() {
        let expr = fusion.expr(*e);
        let from_inputs = expr
            .inputs
            .iter()
            .fold(None, |acc, t| looser(acc, path.get(t).copied().flatten()));
        for out in &expr.outputs {
            let dtype = fusion.tensor(*out).dtype;
            let float = dtype.is_float().then_some(dtype);
            let p = if !dtype.is_float() {
                None
            } else if is_view(&expr.kind) {
                from_inputs
            } else if matches!(expr.kind, ExprKind::Cast(_)) && from_inputs.is_none() {
                None
            } else {
                looser(from_inputs, float)
            };
            path.insert(*out, p);
        }
    }
    fusion
        .outputs()
        .iter()
        .map(|t| {
            let dtype = fusion.tensor(*t).dtype;
            if dtype.is_float() {
                let d = looser(Some(dtype), path.get(t).copied().flatten()).unwrap_or(dtype);
                Tolerance::for_dtype(d)
            } else {
                Tolerance::for_dtype(dtype)
            }
        })
        .collect()
}

/// Where a fusion input's values must lie for every op that reads them to be defined.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InputDomain {
    /// No zeros: the divisor of an integer `div`.
    pub nonzero: bool,
    /// No negative values: the exponent of an integer `pow`, the operand of `log`, `sqrt`,
    /// `rsqrt`, the base of a floating-point `pow`.
    pub nonnegative: bool,
    /// Values in `0..n`: the ids of an `index_select` whose table axis has `n` rows (the
    /// smallest such `n` where several lookups read the input).
    pub below: Option<i64>,
}

/// The domain each input of `fusion` must keep (in input order) so that the ops reading it
/// are defined: an input that reaches, through view ops and casts only, the divisor of an
/// integer `div` must have no zeros (the reference refuses to divide by zero), the exponent
/// of an integer `pow` no negative values, and the operand of `log`, `sqrt`, `rsqrt` or the
/// base of a floating-point `pow` no negative values (else NaN, which never matches), and the
/// ids of an `index_select` values in `0..rows`.
pub fn input_domains(fusion: &Fusion) -> Vec<InputDomain> {
    // The fusion input each tensor is a view or cast of, if any.
    let mut source: HashMap<TensorId, TensorId> = HashMap::new();
    for t in fusion.inputs() {
        source.insert(*t, *t);
    }
    let mut needs: HashMap<TensorId, InputDomain> = HashMap::new();
    for e in fusion.exprs() {
        let expr = fusion.expr(*e);
        let src = |k: usize| expr.inputs.get(k).and_then(|t| source.get(t)).copied();
        let mut need = |k: usize, nonzero: bool, nonneg: bool| {
            if let Some(s) = src(k) {
                let n = needs.entry(s).or_default();
                n.nonzero |= nonzero;
                n.nonnegative |= nonneg;
            }
        };
        let int = |k: usize| {
            expr.inputs
                .get(k)
                .is_some_and(|t| fusion.tensor(*t).dtype == DType::I64)
        };
        match &expr.kind {
            ExprKind::BinaryLit {
                op,
                lit_first: true,
                ..
            } if int(0) => match op {
                BinaryOp::Div => need(0, true, false),
                BinaryOp::Pow => need(0, false, true),
                _ => {}
            },
            ExprKind::BinaryLit {
                op: BinaryOp::Pow,
                lit_first: false,
                ..
            } if !int(0) => need(0, false, true),
            ExprKind::Binary(BinaryOp::Div) if int(1) => need(1, true, false),
            ExprKind::Binary(BinaryOp::Pow) if int(1) => need(1, false, true),
            ExprKind::Binary(BinaryOp::Pow) => need(0, false, true),
            ExprKind::Unary(UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt) => need(0, false, true),
            ExprKind::IndexSelect { axis, .. } => {
                let rows = fusion
                    .visible_axes(expr.inputs[0])
                    .get(*axis)
                    .and_then(|id| fusion.eval(&fusion.id(*id).extent));
                if let (Some(s), Some(rows)) = (src(1), rows) {
                    let n = needs.entry(s).or_default();
                    n.below = Some(n.below.map_or(rows, |b| b.min(rows)));
                }
            }
            _ => {}
        }
        // A lookup moves the table's values: its output is a view of the table, not of the ids.
        if is_view(&expr.kind) || matches!(expr.kind, ExprKind::Cast(_)) {
            if let Some(s) = src(0) {
                for out in &expr.outputs {
                    source.insert(*out, s);
                }
            }
        }
    }
    fusion
        .inputs()
        .iter()
        .map(|t| needs.get(t).copied().unwrap_or_default())
        .collect()
}

/// Moves generated `inputs` (one per fusion input, in order) into the domains
/// [`input_domains`] gives: a negative value becomes its magnitude where the input must not
/// be negative, a zero becomes `1` where it must not be zero, and an id of a lookup into `n`
/// rows is taken modulo `n` (the default draw's -8..=8 become rows 0..=8 and the last
/// eight). Values already inside are kept.
pub fn keep_in_domain(fusion: &Fusion, inputs: &mut [Dense]) {
    for (dom, d) in input_domains(fusion).into_iter().zip(inputs) {
        for v in &mut d.data {
            if dom.nonnegative && *v < 0.0 {
                *v = -*v;
            }
            if dom.nonzero && *v == 0.0 {
                *v = 1.0;
            }
            if let Some(n) = dom.below.filter(|n| *n > 0) {
                *v = v.rem_euclid(n as f64);
            }
        }
    }
}

/// How far an actual value may be from the reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Relative tolerance.
    pub rtol: f64,
    /// Absolute tolerance.
    pub atol: f64,
}

impl Tolerance {
    /// The tolerance for results of dtype `dtype`: `bf16` rtol 1.6e-2, `f16` 2e-3, `f32`
    /// 1e-5, `f64` 1e-12 (each with a small atol); `i64` and `bool` must match exactly.
    pub fn for_dtype(dtype: DType) -> Tolerance {
        let (rtol, atol) = match dtype {
            DType::BF16 => (1.6e-2, 1e-5),
            DType::F16 => (2e-3, 1e-5),
            DType::F32 => (1e-5, 1e-6),
            DType::F64 => (1e-12, 1e-12),
            DType::I64 | DType::Bool => (0.0, 0.0),
        };
        Tolerance { rtol, atol }
    }
}

/// The magnitude errors are judged against is `SCALE_FACTOR` times the largest finite
/// `|expected|` of the tensor.
pub const SCALE_FACTOR: f64 = 1.0;

/// The outcome of [`compare`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    /// The largest `|actual - expected|` (∞ where either is NaN, or one is infinite and the
    /// other is not or is the other infinity).
    pub max_abs: f64,
    /// `max_abs` relative to the tensor's scale (`SCALE_FACTOR` × max `|expected|`).
    pub max_rel: f64,
    /// The index of the largest error; `None` when no element differs.
    pub worst: Option<usize>,
    /// How many compared elements are out of tolerance (every NaN, expected or actual, is).
    pub mismatches: usize,
    /// True when the lengths are equal and no element is out of tolerance.
    pub ok: bool,
    /// The largest finite `|expected|`.
    pub max_ref: f64,
    /// The number of actual values.
    pub actual_len: usize,
    /// The number of expected values.
    pub expected_len: usize,
    /// How many compared reference values are NaN (each is a mismatch).
    pub nan_expected: usize,
    /// How many compared actual values are NaN (each is a mismatch).
    pub nan_actual: usize,
}

/// Compares `actual` with the reference `expected` at the tolerance of `dtype` (see
/// [`compare_with`]).
pub fn compare(actual: &[f64], expected: &[f64], dtype: DType) -> Comparison {
    compare_with(actual, expected, Tolerance::for_dtype(dtype))
}

/// Compares `actual` with the reference `expected`, element by element.
///
/// Element `i` matches when `|a - e| <= atol + rtol * max(|e|, scale)`, where `scale` is
/// [`SCALE_FACTOR`] times the largest finite `|e|` of the whole tensor: `rtol * scale` is an
/// absolute floor, so errors are judged relative to the tensor's magnitude (low-precision
/// results of long dot products with cancellation are only accurate relative to their
/// operands).
///
/// Non-finite values: a NaN, expected or actual, never matches, not even a NaN (a NaN is no
/// value: a reference that is NaN checks nothing, and uninitialised memory is poisoned with
/// NaN), and the comparison counts them ([`Comparison::nan_expected`],
/// [`Comparison::nan_actual`]); an infinite expected value matches only the same infinity,
/// sign included (an overflow, `log(0)`, a masked `-∞` are values the result must reproduce);
/// an infinite actual value where the expected one is finite never matches.
///
/// Only the common prefix is compared when the lengths differ, and the comparison is then not
/// `ok`.
pub fn compare_with(actual: &[f64], expected: &[f64], tol: Tolerance) -> Comparison {
    let max_ref = expected
        .iter()
        .filter(|e| e.is_finite())
        .fold(0.0f64, |m, e| m.max(e.abs()));
    let scale = max_ref * SCALE_FACTOR;
    let mut max_abs = 0.0f64;
    let mut worst = None;
    let mut mismatches = 0;
    let (mut nan_expected, mut nan_actual) = (0, 0);
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        nan_expected += usize::from(e.is_nan());
        nan_actual += usize::from(a.is_nan());
        // `a == e` is false where either is NaN; equal infinities are equal.
        let same = a == e;
        let err = if same {
            0.0
        } else {
            let d = (a - e).abs();
            if d.is_nan() {
                f64::INFINITY
            } else {
                d
            }
        };
        // A NaN output fails at any tolerance (even an infinite one).
        let matches = if a.is_nan() {
            false
        } else if e.is_finite() {
            err <= tol.atol + tol.rtol * e.abs().max(scale)
        } else {
            same
        };
        if !matches {
            mismatches += 1;
        }
        if err > max_abs {
            max_abs = err;
            worst = Some(i);
        }
    }
    Comparison {
        max_abs,
        max_rel: max_abs / scale.max(f64::MIN_POSITIVE),
        worst,
        mismatches,
        ok: mismatches == 0 && actual.len() == expected.len(),
        max_ref,
        actual_len: actual.len(),
        expected_len: expected.len(),
        nan_expected,
        nan_actual,
    }
}

/// Why [`compare_dense`] cannot compare two tensors' values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CompareError {
    /// The dtypes differ.
    #[error("dtype differs: actual {actual}, expected {expected}")]
    DType {
        /// The actual tensor's dtype.
        actual: DType,
        /// The expected tensor's dtype.
        expected: DType,
    },
    /// The sizes differ.
    #[error("sizes differ: actual {actual:?}, expected {expected:?}")]
    Sizes {
        /// The actual tensor's sizes.
        actual: Vec<usize>,
        /// The expected tensor's sizes.
        expected: Vec<usize>,
    },
}

/// Compares two tensors: their dtypes and sizes must be equal (else an error saying how they
/// differ), and their values are compared with [`compare`] at the dtype's tolerance.
pub fn compare_dense(actual: &Dense, expected: &Dense) -> Result<Comparison, CompareError> {
    if actual.dtype != expected.dtype {
        return Err(CompareError::DType {
            actual: actual.dtype,
            expected: expected.dtype,
        });
    }
    if actual.sizes != expected.sizes {
        return Err(CompareError::Sizes {
            actual: actual.sizes.clone(),
            expected: expected.sizes.clone(),
        });
    }
    Ok(compare(&actual.data, &expected.data, actual.dtype))
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let compared = self.actual_len.min(self.expected_len);
        if self.nan_expected > 0 {
            write!(
                f,
                "{} of {compared} values are NaN in the reference: the check cannot pass on NaN; ",
                self.nan_expected
            )?;
        }
        if self.nan_actual > 0 {
            write!(
                f,
                "{} of {compared} actual values are NaN; ",
                self.nan_actual
            )?;
        }
        if self.actual_len != self.expected_len {
            write!(
                f,
                "length mismatch: {} actual values, {} expected; ",
                self.actual_len, self.expected_len
            )?;
        }
        write!(
            f,
            "max abs error {:.1e} ({:.1e} relative to max |ref| {:.2e}), {} mismatch{}",
            self.max_abs,
            self.max_rel,
            self.max_ref,
            self.mismatches,
            if self.mismatches == 1 { "" } else { "es" }
        )?;
        if let (Some(w), true) = (self.worst, self.mismatches > 0) {
            write!(f, ", worst at index {w}")?;
        }
        Ok(())
    }
}
