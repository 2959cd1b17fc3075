//! Convenience builders for Rust users: one method per op (`set`, `binary`, `sum`, `var`,
//! `matmul`, ...) over [`Fusion::add_op`].

use crate::diag::{Diagnostic, IrResult};
use crate::expr::{BinaryOp, ExprKind, Literal, ReduceOp};
use crate::ids::TensorId;
use crate::scalar::Scalar;

use super::Fusion;

impl Fusion {
    /// `name = set(a)`
    pub fn set(&mut self, name: &str, a: TensorId) -> IrResult<TensorId> {
        self.add_op(name, ExprKind::Set, &[a])
    }

    /// `name = op(a, b)`
    pub fn binary(
        &mut self,
        name: &str,
        op: BinaryOp,
        a: TensorId,
        b: TensorId,
    ) -> IrResult<TensorId> {
        self.add_op(name, ExprKind::Binary(op), &[a, b])
    }

    /// `name = op(a, lit)`, or `op(lit, a)` when `lit_first`: a binary op with a literal
    /// operand of `a`'s dtype (`x * 0.5`).
    pub fn binary_lit(
        &mut self,
        name: &str,
        op: BinaryOp,
        a: TensorId,
        lit: f64,
        lit_first: bool,
    ) -> IrResult<TensorId> {
        let kind = ExprKind::BinaryLit {
            op,
            lit: Literal(lit),
            lit_first,
        };
        self.add_op(name, kind, &[a])
    }

    /// The number of elements a reduction of `a` over `axes` adds up: the product of the
    /// reduced extents' values (a `mean` divides by it). An extent without a value (an unset
    /// parameter) is an error naming it.
    pub fn reduced_count(&self, a: TensorId, axes: &[usize]) -> IrResult<f64> {
        let vis = self.visible_axes(a);
        let mut n = 1.0;
        for ax in axes {
            let Some(id) = vis.get(*ax) else {
                return Err(Diagnostic::new(format!(
                    "mean: axis {ax} is out of range for {} of rank {}",
                    self.desc(a),
                    vis.len()
                )));
            };
            let e = &self.ids[*id].extent;
            match self.eval(e) {
                Some(v) => n *= v as f64,
                None => {
                    return Err(Diagnostic::new(format!(
                        "mean: extent `{}` of axis {ax} of {} has no value (set its parameters)",
                        e.to_source(),
                        self.desc(a)
                    )))
                }
            }
        }
        Ok(n)
    }

    /// `name = mean(a, axes)`: two ops, `sum_name = sum(a, axes)` and
    /// `name = div(sum_name, n)` with `n` the [`Fusion::reduced_count`], so that sharding
    /// treats the sum as any sum (a sum over a device axis is added across devices) and the
    /// division uses the global count.
    pub fn mean(
        &mut self,
        name: &str,
        sum_name: &str,
        a: TensorId,
        axes: &[usize],
    ) -> IrResult<TensorId> {
        let n = self.reduced_count(a, axes)?;
        let s = self.sum(sum_name, a, axes)?;
        self.binary_lit(name, BinaryOp::Div, s, n, false)
    }

    /// `name = sum(a, axes)`
    pub fn sum(&mut self, name: &str, a: TensorId, axes: &[usize]) -> IrResult<TensorId> {
        let mut axes = axes.to_vec();
        axes.sort_unstable();
        self.add_op(
            name,
            ExprKind::Reduction {
                op: ReduceOp::Sum,
                axes,
            },
            &[a],
        )
    }

    /// `name = op(a, axes)`: a sum, max or min reduction.
    pub fn reduce(
        &mut self,
        name: &str,
        op: ReduceOp,
        a: TensorId,
        axes: &[usize],
    ) -> IrResult<TensorId> {
        let mut axes = axes.to_vec();
        axes.sort_unstable();
        self.add_op(name, ExprKind::Reduction { op, axes }, &[a])
    }

    /// The ops of `var(a, axes)`, the population variance, in two passes (the mean, then the
    /// mean of the squared deviations from it, which keeps its precision where the values
    /// are far from zero): `sum`, `div` by the count, `broadcast` back over `axes`, `sub`,
    /// `mul` (the square), `sum`, `div`. `names` gives the seven outputs their names, the
    /// last one the variance's. Over a device-split axis both sums are added across devices.
    pub fn var_ops(&mut self, names: [&str; 7], a: TensorId, axes: &[usize]) -> IrResult<TensorId> {
        self.var_ops_corrected(names, a, axes, 0)
    }

    /// [`Fusion::var_ops`] with Bessel's correction: the squared deviations are divided by
    /// `n - correction` (`correction = 1`: the sample variance, PyTorch's default). An error
    /// when `correction` is at least 1 and not smaller than the count `n` (the divisor would be
    /// zero or negative).
    pub fn var_ops_corrected(
        &mut self,
        names: [&str; 7],
        a: TensorId,
        axes: &[usize],
        correction: u64,
    ) -> IrResult<TensorId> {
        let mut axes = axes.to_vec();
        axes.sort_unstable();
        let n = self
            .reduced_count(a, &axes)
            .map_err(|d| Diagnostic::new(d.message.replacen("mean:", "var:", 1)))?;
        let divisor = self.var_divisor(a, &axes, n, correction)?;
        let s = self.reduce(names[0], ReduceOp::Sum, a, &axes)?;
        let m = self.binary_lit(names[1], BinaryOp::Div, s, n, false)?;
        let mb = self.add_op(names[2], ExprKind::Broadcast { axes: axes.clone() }, &[m])?;
        let d = self.binary(names[3], BinaryOp::Sub, a, mb)?;
        let sq = self.binary(names[4], BinaryOp::Mul, d, d)?;
        let s2 = self.reduce(names[5], ReduceOp::Sum, sq, &axes)?;
        self.binary_lit(names[6], BinaryOp::Div, s2, divisor, false)
    }

    /// The divisor of the squared deviations of `var(a, axes, correction)`: `n - correction`,
    /// `n` the [`Fusion::reduced_count`]; an error when `correction` is at least 1 and not
    /// smaller than `n` (a sample variance of one element has no defined value, and PyTorch's
    /// division by zero or a negative count gives `inf`, `nan` or a negative variance).
    pub fn var_divisor(
        &self,
        a: TensorId,
        axes: &[usize],
        n: f64,
        correction: u64,
    ) -> IrResult<f64> {
        let c = correction as f64;
        if correction > 0 && n <= c {
            let list: Vec<String> = axes.iter().map(|x| x.to_string()).collect();
            return Err(Diagnostic::new(format!(
                "var: the correction {correction} is not smaller than the {n} elements that each variance of {} over axes [{}] reduces, so the divisor n - correction would be {}; reduce more elements, or lower the correction (0 is the population variance)",
                self.desc(a),
                list.join(", "),
                n - c
            )));
        }
        Ok(n - c)
    }

    /// `name = var(a, axes)`: the population variance (see [`Fusion::var_ops`]); the six
    /// intermediate tensors are named `name_1`, `name_2`, … (the first names no tensor has).
    pub fn var(&mut self, name: &str, a: TensorId, axes: &[usize]) -> IrResult<TensorId> {
        self.var_corrected(name, a, axes, 0)
    }

    /// `name = var(a, axes, correction)`: the variance with the squared deviations divided by
    /// `n - correction` (see [`Fusion::var_ops_corrected`]), intermediates named as
    /// [`Fusion::var`] names them.
    pub fn var_corrected(
        &mut self,
        name: &str,
        a: TensorId,
        axes: &[usize],
        correction: u64,
    ) -> IrResult<TensorId> {
        self.check_new_name(name)?;
        let mut names: Vec<String> = Vec::new();
        let mut i = 1;
        while names.len() < 6 {
            let n = format!("{name}_{i}");
            if self.tensor_by_name(&n).is_none() {
                names.push(n);
            }
            i += 1;
        }
        let [a0, a1, a2, a3, a4, a5] = [0, 1, 2, 3, 4, 5].map(|k| names[k].as_str());
        self.var_ops_corrected([a0, a1, a2, a3, a4, a5, name], a, axes, correction)
    }

    /// `name = iota(a, axis)`: `i64`, `a`'s shape, each element its index along `axis`.
    pub fn iota(&mut self, name: &str, a: TensorId, axis: usize) -> IrResult<TensorId> {
        self.add_op(name, ExprKind::Iota { axis }, &[a])
    }

    /// `name = slice(a, axis, start, stop)`.
    pub fn slice(
        &mut self,
        name: &str,
        a: TensorId,
        axis: usize,
        start: Scalar,
        stop: Scalar,
    ) -> IrResult<TensorId> {
        self.add_op(name, ExprKind::Slice { axis, start, stop }, &[a])
    }

    /// `name = concat(a, b, axis)`.
    pub fn concat(
        &mut self,
        name: &str,
        a: TensorId,
        b: TensorId,
        axis: usize,
    ) -> IrResult<TensorId> {
        self.add_op(name, ExprKind::Concat { axis }, &[a, b])
    }

    /// `name = index_select(table, ids, axis)`: the rows of `table` along `axis` that the
    /// `i64` ids `[n]` name (an embedding lookup).
    pub fn index_select(
        &mut self,
        name: &str,
        table: TensorId,
        ids: TensorId,
        axis: usize,
    ) -> IrResult<TensorId> {
        self.add_op(
            name,
            ExprKind::IndexSelect { axis, base: None },
            &[table, ids],
        )
    }

    /// `name = matmul(a, b)`
    pub fn matmul(&mut self, name: &str, a: TensorId, b: TensorId) -> IrResult<TensorId> {
        self.add_op(name, ExprKind::Matmul, &[a, b])
    }

    /// `name = linear(x, w[, bias])`
    pub fn linear(
        &mut self,
        name: &str,
        x: TensorId,
        w: TensorId,
        bias: Option<TensorId>,
    ) -> IrResult<TensorId> {
        let mut ins = vec![x, w];
        ins.extend(bias);
        self.add_op(name, ExprKind::Linear, &ins)
    }
}
