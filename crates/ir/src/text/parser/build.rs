//! Building a parsed tensor expression ([`VExpr`]) into the fusion's ops through the builder
//! API: each call's arguments read by its signature ([`Sig`]), with errors at the op name.

use super::{
    dtype_named, dtype_names, list_arg, op_sig, plural, two_args, Arg, AxisOp, Built, PResult,
    ParsedExpr, Parser, Sig, VExpr,
};
use crate::diag::{Diagnostic, Span};
use crate::expr::{BinaryOp, ExprKind, Literal, ReduceOp, UnaryOp};
use crate::ids::TensorId;
use crate::scalar::Scalar;

impl Parser {
    /// Builds the ops of `e`. With `out` (the statement's name span), `e`'s own op defines
    /// the statement's tensor `stmt`; the ops inside it get fresh names.
    /// An operand `e` of a binary operator in `stmt`, built: its value if it is a literal,
    /// and the tensor it denotes (`None` for a literal).
    fn bin_operand(&mut self, e: &VExpr, stmt: &str) -> PResult<(Option<f64>, Option<TensorId>)> {
        let built = self.build(e, stmt, None)?;
        let lit = if let Built::Lit(v) = built {
            Some(v)
        } else {
            None
        };
        Ok((lit, self.tensor_value(built, e.start())?))
    }

    pub(super) fn build(&mut self, e: &VExpr, stmt: &str, out: Option<Span>) -> PResult<Built> {
        let alone = |span: Span, what: &str| {
            Diagnostic::at(
                span,
                format!(
                    "`{stmt} = ...` must compute a tensor, and {what} (write an op: `{stmt} = set(x)` copies `x`, a literal takes the dtype of a tensor operand as in `mul(x, 0.5)`)"
                ),
            )
        };
        match e {
            VExpr::Name(n, span) => {
                if out.is_some() {
                    return Err(alone(*span, &format!("`{n}` alone computes nothing")));
                }
                Ok(match self.fusion.tensor_by_name(n) {
                    Some(t) => Built::Tensor(t),
                    None if n == "inf" => Built::Lit(f64::INFINITY),
                    None if n == "nan" => Built::Lit(f64::NAN),
                    None => Built::Name(n.clone()),
                })
            }
            VExpr::Lit(v, span) => {
                if out.is_some() {
                    return Err(alone(*span, "a literal alone has no dtype"));
                }
                Ok(Built::Lit(*v))
            }
            VExpr::List(_, span) => Err(Diagnostic::at(
                *span,
                "a `[...]` list is an argument of an op (axes, a shape), not a tensor",
            )),
            VExpr::Neg(x, span) => match self.build(x, stmt, None)? {
                Built::Lit(v) => {
                    if out.is_some() {
                        return Err(alone(*span, "a literal alone has no dtype"));
                    }
                    Ok(Built::Lit(-v))
                }
                b => {
                    let t = self.tensor_value(b, x.start())?;
                    let t = t.ok_or_else(|| Diagnostic::at(x.start(), "expected a tensor"))?;
                    self.emit(ExprKind::Unary(UnaryOp::Neg), &[t], stmt, out, *span)
                        .map(Built::Tensor)
                }
            },
            VExpr::Bin(op, a, b, span) => {
                let (la, ta) = self.bin_operand(a, stmt)?;
                let (lb, tb) = self.bin_operand(b, stmt)?;
                let (kind, inputs) = match (ta, tb) {
                    (Some(x), Some(y)) => (ExprKind::Binary(*op), vec![x, y]),
                    (Some(x), None) => (
                        ExprKind::BinaryLit {
                            op: *op,
                            lit: Literal(lb.unwrap_or_default()),
                            lit_first: false,
                        },
                        vec![x],
                    ),
                    (None, Some(y)) => (
                        ExprKind::BinaryLit {
                            op: *op,
                            lit: Literal(la.unwrap_or_default()),
                            lit_first: true,
                        },
                        vec![y],
                    ),
                    (None, None) => {
                        if out.is_some() {
                            return Err(alone(*span, "arithmetic on literals alone has no dtype"));
                        }
                        let (x, y) = (la.unwrap_or_default(), lb.unwrap_or_default());
                        return Ok(Built::Lit(match op {
                            BinaryOp::Add => x + y,
                            BinaryOp::Sub => x - y,
                            BinaryOp::Mul => x * y,
                            _ => x / y,
                        }));
                    }
                };
                self.emit(kind, &inputs, stmt, out, *span)
                    .map(Built::Tensor)
            }
            VExpr::Call(op, op_span, args)
                if matches!(op.as_str(), "iota" | "slice" | "concat" | "index_select") =>
            {
                let (kind, inputs) = self.indexed_op(op, *op_span, args, stmt)?;
                self.emit(kind, &inputs, stmt, out, *op_span)
                    .map(Built::Tensor)
            }
            VExpr::Call(op, op_span, args) => {
                let sig = op_sig(op)
                    .ok_or_else(|| Diagnostic::at(*op_span, format!("unknown op `{op}`")))?;
                let mut built = Vec::with_capacity(args.len());
                for a in args {
                    let span = a.start();
                    built.push(match a {
                        VExpr::List(items, span) => Arg::List(
                            items
                                .iter()
                                .map(|p| ParsedExpr {
                                    value: p.value.clone(),
                                    span: p.span,
                                    idents: p.idents.clone(),
                                })
                                .collect(),
                            *span,
                        ),
                        _ => match self.build(a, stmt, None)? {
                            Built::Tensor(t) => Arg::Name(self.fusion.tensor(t).name.clone(), span),
                            Built::Lit(v) => Arg::Lit(v, span),
                            Built::Name(n) => Arg::Name(n, span),
                        },
                    });
                }
                // `var(x, axes, correction)`: an optional third argument, a non-negative
                // integer literal (the divisor of the squared deviations is `n - correction`).
                let mut correction = 0u64;
                if op == "var" {
                    if built.len() > 3 {
                        return Err(Diagnostic::at(
                            *op_span,
                            format!(
                                "`var` takes a tensor, an axis list and an optional correction, e.g. `var(a, [1])` or `var(a, [1], 1)`, got {} arguments",
                                built.len()
                            ),
                        ));
                    }
                    if built.len() == 3 {
                        let arg = built.pop().expect("three arguments");
                        correction = match arg {
                            Arg::Lit(v, _)
                                if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 1e15 =>
                            {
                                v as u64
                            }
                            other => {
                                return Err(Diagnostic::at(
                                    other.span(),
                                    format!(
                                        "`var`: the correction must be a non-negative integer (`var(a, [1], 1)` divides by n - 1, the sample variance), found {}",
                                        other.describe()
                                    ),
                                ))
                            }
                        };
                    }
                }
                let (kind, inputs) = self.resolve(op, *op_span, sig, built)?;
                if op == "mean" {
                    // `mean(x, axes)` is `sum(x, axes) / n`, `n` the elements each sum adds.
                    let ExprKind::Reduction { axes, .. } = &kind else {
                        unreachable!("mean resolves as a sum")
                    };
                    let n = self
                        .fusion
                        .reduced_count(inputs[0], axes)
                        .map_err(|d| d.or_at(Some(*op_span)))?;
                    let s = self.emit(kind, &inputs, stmt, None, *op_span)?;
                    let div = ExprKind::BinaryLit {
                        op: BinaryOp::Div,
                        lit: Literal(n),
                        lit_first: false,
                    };
                    return self.emit(div, &[s], stmt, out, *op_span).map(Built::Tensor);
                }
                if op == "var" {
                    // Two passes: `m = sum(x, axes) / n`, then `sum((x - m)^2, axes) / (n - correction)`.
                    let ExprKind::Reduction { axes, .. } = &kind else {
                        unreachable!("var resolves as a sum")
                    };
                    let axes = axes.clone();
                    let x = inputs[0];
                    let n = self.fusion.reduced_count(x, &axes).map_err(|d| {
                        Diagnostic::new(d.message.replacen("mean:", "var:", 1))
                            .or_at(Some(*op_span))
                    })?;
                    let divisor = self
                        .fusion
                        .var_divisor(x, &axes, n, correction)
                        .map_err(|d| d.or_at(Some(*op_span)))?;
                    let div = ExprKind::BinaryLit {
                        op: BinaryOp::Div,
                        lit: Literal(n),
                        lit_first: false,
                    };
                    let s = self.emit(kind, &inputs, stmt, None, *op_span)?;
                    let m = self.emit(div, &[s], stmt, None, *op_span)?;
                    let b = ExprKind::Broadcast { axes: axes.clone() };
                    let mb = self.emit(b, &[m], stmt, None, *op_span)?;
                    let sub = ExprKind::Binary(BinaryOp::Sub);
                    let d = self.emit(sub, &[x, mb], stmt, None, *op_span)?;
                    let mul = ExprKind::Binary(BinaryOp::Mul);
                    let sq = self.emit(mul, &[d, d], stmt, None, *op_span)?;
                    let red = ExprKind::Reduction {
                        op: ReduceOp::Sum,
                        axes,
                    };
                    let s2 = self.emit(red, &[sq], stmt, None, *op_span)?;
                    let div = ExprKind::BinaryLit {
                        op: BinaryOp::Div,
                        lit: Literal(divisor),
                        lit_first: false,
                    };
                    return self
                        .emit(div, &[s2], stmt, out, *op_span)
                        .map(Built::Tensor);
                }
                self.emit(kind, &inputs, stmt, out, *op_span)
                    .map(Built::Tensor)
            }
        }
    }

    /// `iota(a, axis)`, `slice(a, axis, start, stop)`, `concat(a, b, axis)` and
    /// `index_select(table, ids, axis [, base])`: tensor operands (any tensor expression), an
    /// axis number, and sizes (integers, parameters and `+ - * /` on them; an index_select's
    /// base row, which only a vocabulary-parallel lookup's partial carries, may also use
    /// the built-in `rank`).
    fn indexed_op(
        &mut self,
        op: &str,
        op_span: Span,
        args: &[VExpr],
        stmt: &str,
    ) -> PResult<(ExprKind, Vec<TensorId>)> {
        let (usage, tensors) = match op {
            "iota" => ("`iota` takes a tensor and an axis, e.g. `iota(s, 0)`", 1),
            "slice" => (
                "`slice` takes a tensor, an axis, a start and a stop, e.g. `slice(w, 0, h, 2 * h)`",
                1,
            ),
            "index_select" => (
                "`index_select` takes a table, i64 ids and the table's axis they index, e.g. `index_select(table, ids, 0)`",
                2,
            ),
            _ => (
                "`concat` takes two tensors and an axis, e.g. `concat(a, b, 0)`",
                2,
            ),
        };
        let want = if op == "slice" { 4 } else { tensors + 1 };
        // A lookup's per-device partial prints its base row as a fourth argument.
        let fits = args.len() == want || (op == "index_select" && args.len() == want + 1);
        if !fits {
            return Err(Diagnostic::at(
                op_span,
                format!("{usage}; got {} arguments", args.len()),
            ));
        }
        let mut inputs = Vec::new();
        for (i, a) in args[..tensors].iter().enumerate() {
            let span = a.start();
            let arg = match self.build(a, stmt, None)? {
                Built::Tensor(t) => Arg::Name(self.fusion.tensor(t).name.clone(), span),
                Built::Lit(v) => Arg::Lit(v, span),
                Built::Name(n) => Arg::Name(n, span),
            };
            inputs.push(self.operand(op, i, &arg)?);
        }
        let axis_arg = &args[tensors];
        let axis = match axis_arg {
            VExpr::Lit(v, _) if *v >= 0.0 && v.fract() == 0.0 && *v < 1e9 => *v as usize,
            other => {
                return Err(Diagnostic::at(
                    other.start(),
                    format!(
                    "`{op}`: argument {} must be an axis number (a non-negative integer); {usage}",
                    tensors + 1
                ),
                ))
            }
        };
        let kind = match op {
            "iota" => ExprKind::Iota { axis },
            "concat" => ExprKind::Concat { axis },
            "index_select" => ExprKind::IndexSelect {
                axis,
                base: match args.get(3) {
                    Some(b) => Some(self.size_arg(op, b)?),
                    None => None,
                },
            },
            _ => ExprKind::Slice {
                axis,
                start: self.size_arg(op, &args[2])?,
                stop: self.size_arg(op, &args[3])?,
            },
        };
        Ok((kind, inputs))
    }

    /// A size argument written as a tensor expression: an integer, a parameter, or `+ - * /`
    /// and unary `-` on them.
    fn size_arg(&self, op: &str, e: &VExpr) -> PResult<Scalar> {
        Ok(match e {
            VExpr::Lit(v, s) => {
                if v.fract() != 0.0 || !v.is_finite() || v.abs() > 9.0e15 {
                    return Err(Diagnostic::at(
                        *s,
                        format!(
                            "`{op}`: a size is an integer, not `{}`",
                            Literal(*v).to_source()
                        ),
                    ));
                }
                Scalar::c(*v as i64)
            }
            VExpr::Name(n, _) if op == "index_select" && n == crate::scalar::RANK => {
                Scalar::named(n)
            }
            VExpr::Name(n, s) => {
                if self.fusion.param(n).is_none() {
                    return Err(Diagnostic::at(
                        *s,
                        format!("`{op}`: `{n}` is not a parameter (a size is an integer, a parameter or arithmetic on them)"),
                    ));
                }
                Scalar::named(n)
            }
            VExpr::Neg(x, _) => Scalar::c(0).sub(self.size_arg(op, x)?),
            VExpr::Bin(b, x, y, s) => {
                let (x, y) = (self.size_arg(op, x)?, self.size_arg(op, y)?);
                match b {
                    BinaryOp::Add => x.add(y),
                    BinaryOp::Sub => x.sub(y),
                    BinaryOp::Mul => x.mul(y),
                    BinaryOp::Div => x.div(y),
                    _ => return Err(Diagnostic::at(*s, format!("`{op}`: not a size operator"))),
                }
            }
            other => {
                return Err(Diagnostic::at(
                    other.start(),
                    format!(
                        "`{op}`: expected a size (an integer, a parameter or arithmetic on them)"
                    ),
                ))
            }
        })
    }

    /// The tensor and the list items of `op(a, [..])`; `what` names the list and `example`
    /// shows a call, in errors.
    fn tensor_and_list(
        &self,
        op: &str,
        op_span: Span,
        (what, example): (&str, &str),
        args: Vec<Arg>,
    ) -> PResult<(TensorId, Vec<ParsedExpr>)> {
        let [a, l] = two_args(
            op_span,
            &format!("`{op}` takes a tensor and {what}, e.g. `{example}`"),
            args,
        )?;
        let input = self.operand(op, 0, &a)?;
        Ok((input, list_arg(op, what, example, l)?))
    }

    fn operand(&self, op: &str, index: usize, arg: &Arg) -> PResult<TensorId> {
        match arg {
            Arg::Name(n, s) => self.tensor_named(n, *s),
            Arg::Lit(..) => Err(Diagnostic::at(
                arg.span(),
                format!(
                    "operand {} of `{op}` must be a tensor, found {}",
                    index + 1,
                    arg.describe()
                ),
            )),
            Arg::List(_, s) => Err(Diagnostic::at(
                *s,
                format!(
                    "operand {} of `{op}` must be a tensor, found a `[...]` list",
                    index + 1
                ),
            )),
        }
    }

    /// Checks an op's arguments against its signature and turns them into the builder's
    /// `ExprKind` and input tensors.
    fn resolve(
        &self,
        op: &str,
        op_span: Span,
        sig: Sig,
        args: Vec<Arg>,
    ) -> PResult<(ExprKind, Vec<TensorId>)> {
        let n = args.len();
        match sig {
            Sig::Tensors { kind, min, max } => {
                if n < min || n > max {
                    let want = if min == max {
                        plural(min, "tensor operand")
                    } else {
                        format!("{min} or {max} tensor operands")
                    };
                    return Err(Diagnostic::at(
                        op_span,
                        format!("`{op}` takes {want}, got {n}"),
                    ));
                }
                let lit = |a: &Arg| match a {
                    Arg::Lit(v, _) => Some(Literal(*v)),
                    _ => None,
                };
                let lits = args.iter().filter(|a| lit(a).is_some()).count();
                let kind = match (&kind, args.as_slice()) {
                    (_, _) if lits == 0 => kind,
                    (ExprKind::Binary(_), [a, b]) if lits == 2 => {
                        return Err(Diagnostic::at(
                            a.span().min(b.span()),
                            format!(
                                "`{op}` of two literals has no dtype: a literal takes the dtype of the other operand, which must be a tensor"
                            ),
                        ))
                    }
                    (ExprKind::Binary(b), [x, _]) => ExprKind::BinaryLit {
                        op: *b,
                        lit: lit(x).or(lit(&args[1])).unwrap_or(Literal(0.0)),
                        lit_first: lit(x).is_some(),
                    },
                    (ExprKind::Where, [c, a, b]) if lit(c).is_none() => ExprKind::WhereLit {
                        a: lit(a),
                        b: lit(b),
                    },
                    _ => kind,
                };
                let inputs = args
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| {
                        !matches!(kind, ExprKind::BinaryLit { .. } | ExprKind::WhereLit { .. })
                            || lit(a).is_none()
                    })
                    .map(|(i, a)| self.operand(op, i, a))
                    .collect::<PResult<Vec<_>>>()?;
                Ok((kind, inputs))
            }
            Sig::Cast => {
                let [a, d] = two_args(
                    op_span,
                    "`cast` takes a tensor and a dtype, e.g. `cast(a, f32)`",
                    args,
                )?;
                let input = self.operand(op, 0, &a)?;
                let dtype = match &d {
                    Arg::Name(s, span) => dtype_named(s, *span)?,
                    Arg::List(_, span) | Arg::Lit(_, span) => {
                        return Err(Diagnostic::at(
                            *span,
                            format!(
                                "`cast` expects a dtype ({}) as its second argument, found {}",
                                dtype_names(),
                                d.describe()
                            ),
                        ))
                    }
                };
                Ok((ExprKind::Cast(dtype), vec![input]))
            }
            Sig::Axes(axis_op) => {
                let (what, example) = match axis_op {
                    AxisOp::Reduce(_) => ("an axis list", format!("{op}(a, [1])")),
                    AxisOp::Broadcast => {
                        ("a list of new axis positions", format!("{op}(a, [0, 2])"))
                    }
                    AxisOp::Squeeze => ("an axis list", format!("{op}(a, [0])")),
                    AxisOp::Permute => ("a permutation", format!("{op}(a, [1, 0])")),
                };
                let (input, items) = self.tensor_and_list(op, op_span, (what, &example), args)?;
                let mut axes = Vec::new();
                for e in &items {
                    let axis = e
                        .value
                        .as_const()
                        .filter(|_| e.idents.is_empty())
                        .and_then(|v| usize::try_from(v).ok());
                    match axis {
                        Some(v) => axes.push(v),
                        None => {
                            return Err(Diagnostic::at(
                                e.span,
                                format!(
                                    "`{op}`: `{}` is not an axis number (axes are non-negative integers)",
                                    e.value.to_source()
                                ),
                            ))
                        }
                    }
                }
                let kind = match axis_op {
                    AxisOp::Permute => ExprKind::Permute { perm: axes },
                    other => {
                        // Sorted for the builder; a repeated axis stays and is reported there.
                        axes.sort_unstable();
                        match other {
                            AxisOp::Reduce(r) => ExprKind::Reduction { op: r, axes },
                            AxisOp::Broadcast => ExprKind::Broadcast { axes },
                            _ => ExprKind::Squeeze { axes },
                        }
                    }
                };
                Ok((kind, vec![input]))
            }
            Sig::Reshape => {
                let example = ("a shape", "reshape(a, [t, 2, h])");
                let (input, items) = self.tensor_and_list(op, op_span, example, args)?;
                let mut shape = Vec::new();
                for e in items {
                    self.check_scalar(&e)?;
                    self.check_positive(&e, || "`reshape`: shape entry".to_string())?;
                    shape.push(e.value);
                }
                Ok((ExprKind::Reshape { shape }, vec![input]))
            }
        }
    }
}
