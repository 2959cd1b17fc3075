//! Building a fusion: inputs, outputs, and ops with their shape and dtype inference
//! ([`Fusion::add_op`]).

use crate::diag::{Diagnostic, IrResult};
use crate::domain::{IterDomain, IterType, SplitKind};
use crate::dtype::DType;
use crate::expr::{Expr, ExprKind, Literal, ReduceOp, UnaryOp};
use crate::ids::{IterDomainId, MeshId, TensorId};
use crate::scalar::Scalar;
use crate::tensor::{MemoryType, TensorView};

use super::Fusion;

impl Fusion {
    pub(super) fn check_new_name(&self, name: &str) -> IrResult<()> {
        if self.has_builder_name(name) {
            return Err(Diagnostic::new(format!("duplicate tensor name `{name}`")));
        }
        if self.param(name).is_some() {
            return Err(Diagnostic::new(format!(
                "tensor name `{name}` is already a parameter"
            )));
        }
        Ok(())
    }

    fn new_tensor(&mut self, name: &str, dtype: DType, logical: Vec<IterDomainId>) -> TensorId {
        let t = self.tensors.insert(TensorView {
            name: name.to_string(),
            dtype,
            loop_domain: logical.clone(),
            logical,
            root: None,
            allocation: None,
            mesh: None,
            memory: MemoryType::Global,
            definition: None,
            schedule: Vec::new(),
            span: None,
        });
        self.names.insert(name.to_string(), t);
        t
    }

    /// Declares a fusion input of global shape `extents`.
    pub fn add_input(
        &mut self,
        name: &str,
        dtype: DType,
        extents: Vec<Scalar>,
        mesh: Option<MeshId>,
    ) -> IrResult<TensorId> {
        self.check_new_name(name)?;
        let mut logical = Vec::new();
        for (axis, e) in extents.into_iter().enumerate() {
            self.check_symbols(&e)?;
            if let Some(v) = self.eval(&e) {
                if v <= 0 {
                    return Err(Diagnostic::new(format!(
                        "tensor `{name}` axis {axis}: extent `{}` = {v} must be positive",
                        e.to_source()
                    )));
                }
            }
            logical.push(self.ids.insert(IterDomain::new(e, IterType::Iteration)));
        }
        let t = self.new_tensor(name, dtype, logical);
        self.tensors[t].mesh = mesh;
        self.inputs.push(t);
        Ok(t)
    }

    /// Marks `t` as a fusion output.
    pub fn add_output(&mut self, t: TensorId) -> IrResult<()> {
        if self.outputs.contains(&t) {
            return Err(Diagnostic::new(format!(
                "tensor `{}` is already an output",
                self.tensors[t].name
            )));
        }
        self.outputs.push(t);
        Ok(())
    }

    fn fresh_copy(&mut self, id: IterDomainId) -> IterDomainId {
        let src = &self.ids[id];
        let fresh = IterDomain::new(src.extent.clone(), src.iter_type);
        self.ids.insert(fresh)
    }

    pub(super) fn desc(&self, t: TensorId) -> String {
        let tv = &self.tensors[t];
        let dims: Vec<String> = self
            .visible_axes(t)
            .iter()
            .map(|i| self.ids[*i].extent.to_source())
            .collect();
        format!("`{}` ({}[{}])", tv.name, tv.dtype, dims.join(", "))
    }

    /// Broadcast-aware pointwise shape: same rank; per axis equal extents, or one side a
    /// broadcast.
    fn pointwise_axes(&mut self, op: &str, ins: &[TensorId]) -> IrResult<Vec<IterDomainId>> {
        let axes: Vec<Vec<IterDomainId>> = ins.iter().map(|t| self.visible_axes(*t)).collect();
        let rank = axes[0].len();
        for (k, a) in axes.iter().enumerate().skip(1) {
            if a.len() != rank {
                return Err(Diagnostic::new(format!(
                    "rank mismatch in {op}: {} has rank {rank} but {} has rank {}",
                    self.desc(ins[0]),
                    self.desc(ins[k]),
                    a.len()
                )));
            }
        }
        let mut out = Vec::with_capacity(rank);
        for axis in 0..rank {
            let mut chosen: Option<(usize, IterDomainId)> = None;
            for (k, a) in axes.iter().enumerate() {
                let id = a[axis];
                if self.ids[id].iter_type == IterType::Broadcast {
                    continue;
                }
                match chosen {
                    None => chosen = Some((k, id)),
                    Some((k0, id0)) => {
                        if !self.same_extent(&self.ids[id0].extent, &self.ids[id].extent) {
                            return Err(Diagnostic::new(format!(
                                "shape mismatch in {op}: axis {axis} of {} has extent `{}` but axis {axis} of {} has extent `{}`",
                                self.desc(ins[k0]),
                                self.ids[id0].extent.to_source(),
                                self.desc(ins[k]),
                                self.ids[id].extent.to_source()
                            )));
                        }
                    }
                }
            }
            let src = chosen.map(|(_, id)| id).unwrap_or(axes[0][axis]);
            out.push(self.fresh_copy(src));
        }
        Ok(out)
    }

    fn same_dtype(&self, op: &str, ins: &[TensorId]) -> IrResult<DType> {
        let d0 = self.tensors[ins[0]].dtype;
        for t in &ins[1..] {
            let d = self.tensors[*t].dtype;
            if d != d0 {
                return Err(Diagnostic::new(format!(
                    "dtype mismatch in {op}: `{}` is {d0} but `{}` is {d} (insert a cast)",
                    self.tensors[ins[0]].name, self.tensors[*t].name
                )));
            }
        }
        Ok(d0)
    }

    /// A literal takes the dtype of the tensor operand `t`: any number for a float, an
    /// integer for `i64`, and none for `bool`.
    fn check_literal(&self, op: &str, t: TensorId, lit: Literal) -> IrResult<()> {
        let d = self.tensors[t].dtype;
        let v = lit.0;
        let fits = match d {
            DType::Bool => false,
            DType::I64 => v.is_finite() && v == v.trunc() && v.abs() < 9.007_199_254_740_992e15,
            _ => true,
        };
        if fits {
            Ok(())
        } else {
            let why = if d == DType::Bool {
                "a bool operand takes no literal (compare with a tensor, or use `not`)"
            } else {
                "an i64 operand takes integer literals"
            };
            Err(Diagnostic::new(format!(
                "{op}: the literal `{}` takes the dtype of {}, and {why}",
                lit.to_source(),
                self.desc(t)
            )))
        }
    }

    fn check_axes(&self, op: &str, t: TensorId, axes: &[usize], rank: usize) -> IrResult<()> {
        for (i, a) in axes.iter().enumerate() {
            if *a >= rank {
                return Err(Diagnostic::new(format!(
                    "{op}: axis {a} is out of range for {} of rank {rank}",
                    self.desc(t)
                )));
            }
            if axes[..i].contains(a) {
                return Err(Diagnostic::new(format!("{op}: axis {a} is listed twice")));
            }
        }
        Ok(())
    }

    /// Adds an op named `name` computing `kind` over `inputs`, infers its output's shape and
    /// dtype, and returns the output. Errors name the op, tensors and axes involved.
    pub fn add_op(
        &mut self,
        name: &str,
        kind: ExprKind,
        inputs: &[TensorId],
    ) -> IrResult<TensorId> {
        self.check_new_name(name)?;
        let op = kind.op_name();
        if let ExprKind::WhereLit {
            a: Some(_),
            b: Some(_),
        } = &kind
        {
            return Err(Diagnostic::new(
                "where: both operands are literals, so nothing gives them a dtype (one of them must be a tensor)",
            ));
        }
        let arity = kind.arity();
        if !arity.contains(&inputs.len()) {
            let want = if arity.start() == arity.end() {
                format!("{}", arity.start())
            } else {
                format!("{} or {}", arity.start(), arity.end())
            };
            return Err(Diagnostic::new(format!(
                "{op} takes {want} tensor operands, got {}",
                inputs.len()
            )));
        }
        let in0 = inputs[0];
        let rank0 = self.visible_axes(in0).len();
        let (dtype, logical, root) = match &kind {
            ExprKind::Set | ExprKind::SegmentSet => (
                self.tensors[in0].dtype,
                self.pointwise_axes(op, inputs)?,
                None,
            ),
            ExprKind::Cast(d) => (*d, self.pointwise_axes(op, inputs)?, None),
            ExprKind::Unary(u) => {
                let d = self.tensors[in0].dtype;
                if *u == UnaryOp::Not && d != DType::Bool {
                    return Err(Diagnostic::new(format!(
                        "not needs a bool operand, {} is {d}",
                        self.desc(in0)
                    )));
                }
                if u.needs_float() && !d.is_float() {
                    return Err(Diagnostic::new(format!(
                        "{op} needs a floating-point operand, {} is {d}",
                        self.desc(in0)
                    )));
                }
                (d, self.pointwise_axes(op, inputs)?, None)
            }
            ExprKind::Binary(b) => {
                let d = self.same_dtype(op, inputs)?;
                if b.is_logical() && d != DType::Bool {
                    return Err(Diagnostic::new(format!(
                        "{op} needs bool operands, got {d}"
                    )));
                }
                let out_d = if b.is_comparison() { DType::Bool } else { d };
                (out_d, self.pointwise_axes(op, inputs)?, None)
            }
            ExprKind::BinaryLit { op: b, lit, .. } => {
                let d = self.tensors[in0].dtype;
                self.check_literal(op, in0, *lit)?;
                if b.is_logical() {
                    return Err(Diagnostic::new(format!(
                        "{op} takes bool tensors, not the literal `{}`",
                        lit.to_source()
                    )));
                }
                let out_d = if b.is_comparison() { DType::Bool } else { d };
                (out_d, self.pointwise_axes(op, inputs)?, None)
            }
            ExprKind::WhereLit { a, b } => {
                let c = self.tensors[in0].dtype;
                if c != DType::Bool {
                    return Err(Diagnostic::new(format!(
                        "where: the condition {} must be bool, not {c}",
                        self.desc(in0)
                    )));
                }
                let value = inputs[1];
                for lit in a.iter().chain(b) {
                    self.check_literal(op, value, *lit)?;
                }
                (
                    self.tensors[value].dtype,
                    self.pointwise_axes(op, inputs)?,
                    None,
                )
            }
            ExprKind::Where => {
                let c = self.tensors[in0].dtype;
                if c != DType::Bool {
                    return Err(Diagnostic::new(format!(
                        "where: the condition {} must be bool, not {c}",
                        self.desc(in0)
                    )));
                }
                let d = self.same_dtype(op, &inputs[1..])?;
                (d, self.pointwise_axes(op, inputs)?, None)
            }
            ExprKind::Reduction { op: rop, axes } => {
                self.check_axes(op, in0, axes, rank0)?;
                if axes.is_empty() {
                    return Err(Diagnostic::new(format!("{op}: no axes to reduce")));
                }
                let d = self.tensors[in0].dtype;
                if *rop == ReduceOp::Sum && d == DType::Bool {
                    return Err(Diagnostic::new(format!(
                        "sum of bool tensor {}",
                        self.desc(in0)
                    )));
                }
                let vis = self.visible_axes(in0);
                let mut out = Vec::new();
                for (k, id) in vis.iter().enumerate() {
                    let c = self.fresh_copy(*id);
                    if axes.contains(&k) {
                        self.ids[c].iter_type = IterType::Reduction;
                    }
                    out.push(c);
                }
                (d, out, None)
            }
            ExprKind::Broadcast { axes } => {
                let out_rank = rank0 + axes.len();
                self.check_axes(op, in0, axes, out_rank)?;
                let vis = self.visible_axes(in0);
                let mut src = vis.iter();
                let mut out = Vec::new();
                for k in 0..out_rank {
                    if axes.contains(&k) {
                        out.push(
                            self.ids
                                .insert(IterDomain::new(Scalar::c(1), IterType::Broadcast)),
                        );
                    } else {
                        let id = *src.next().expect("ranks checked");
                        out.push(self.fresh_copy(id));
                    }
                }
                (self.tensors[in0].dtype, out, None)
            }
            ExprKind::Squeeze { axes } => {
                self.check_axes(op, in0, axes, rank0)?;
                let vis = self.visible_axes(in0);
                let mut out = Vec::new();
                for (k, id) in vis.iter().enumerate() {
                    if axes.contains(&k) {
                        let d = &self.ids[*id];
                        if d.iter_type != IterType::Broadcast && d.extent.as_const() != Some(1) {
                            return Err(Diagnostic::new(format!(
                                "squeeze: axis {k} of {} has extent `{}`, not 1",
                                self.desc(in0),
                                d.extent.to_source()
                            )));
                        }
                    } else {
                        out.push(self.fresh_copy(*id));
                    }
                }
                (self.tensors[in0].dtype, out, None)
            }
            ExprKind::Permute { perm } => {
                if perm.len() != rank0 {
                    return Err(Diagnostic::new(format!(
                        "permute: {} has rank {rank0} but the permutation has {} entries",
                        self.desc(in0),
                        perm.len()
                    )));
                }
                self.check_axes(op, in0, perm, rank0)?;
                let vis = self.visible_axes(in0);
                let out = perm.iter().map(|p| self.fresh_copy(vis[*p])).collect();
                (self.tensors[in0].dtype, out, None)
            }
            ExprKind::Reshape { shape } => {
                let (root, logical) = self.reshape_domains(in0, shape)?;
                (self.tensors[in0].dtype, logical, Some(root))
            }
            ExprKind::Iota { axis } => {
                self.check_axes(op, in0, &[*axis], rank0)?;
                let vis = self.visible_axes(in0);
                let out = vis.iter().map(|id| self.fresh_copy(*id)).collect();
                (DType::I64, out, None)
            }
            ExprKind::Slice { axis, start, stop } => {
                self.check_axes(op, in0, &[*axis], rank0)?;
                let vis = self.visible_axes(in0);
                let ext = self.ids[vis[*axis]].extent.clone();
                let value = |s: &Scalar, what: &str| {
                    self.check_symbols(s)?;
                    self.eval(s).ok_or_else(|| {
                        Diagnostic::new(format!(
                            "slice: {what} `{}` has no value (set its parameters)",
                            s.to_source()
                        ))
                    })
                };
                let (b, e) = (value(start, "start")?, value(stop, "stop")?);
                let n = self.eval(&ext);
                if b < 0 || e < b || n.is_some_and(|n| e > n) {
                    return Err(Diagnostic::new(format!(
                        "slice: `{}..{}` ({b}..{e}) is not a range of axis {axis} of {}, of extent `{}`{} (0 <= start <= stop <= extent)",
                        start.to_source(),
                        stop.to_source(),
                        self.desc(in0),
                        ext.to_source(),
                        n.map(|n| format!(" = {n}")).unwrap_or_default()
                    )));
                }
                if e == b {
                    // A tensor's extents are positive: an empty slice has no tensor to be
                    // (lowering refused it late, without a location).
                    return Err(Diagnostic::new(format!(
                        "slice: `{}..{}` ({b}..{e}) of axis {axis} of {} is empty, and a tensor's extents must be positive; slice at least one element (start < stop), or leave the op out",
                        start.to_source(),
                        stop.to_source(),
                        self.desc(in0),
                    )));
                }
                if self.ids[vis[*axis]].iter_type == IterType::Broadcast {
                    return Err(Diagnostic::new(format!(
                        "slice: axis {axis} of {} is a broadcast axis; slice a real axis",
                        self.desc(in0)
                    )));
                }
                let len = if start.as_const() == Some(0) {
                    stop.clone()
                } else {
                    stop.clone().sub(start.clone())
                };
                let mut out = Vec::new();
                for (k, id) in vis.iter().enumerate() {
                    out.push(if k == *axis {
                        self.ids
                            .insert(IterDomain::new(len.clone(), IterType::Iteration))
                    } else {
                        self.fresh_copy(*id)
                    });
                }
                (self.tensors[in0].dtype, out, None)
            }
            ExprKind::Concat { axis } => {
                let d = self.same_dtype(op, inputs)?;
                let (va, vb) = (self.visible_axes(in0), self.visible_axes(inputs[1]));
                self.check_axes(op, in0, &[*axis], rank0)?;
                if va.len() != vb.len() {
                    return Err(Diagnostic::new(format!(
                        "concat: {} has rank {} but {} has rank {}",
                        self.desc(in0),
                        va.len(),
                        self.desc(inputs[1]),
                        vb.len()
                    )));
                }
                let mut out = Vec::new();
                for (k, (a, b)) in va.iter().zip(&vb).enumerate() {
                    let (ea, eb) = (self.ids[*a].extent.clone(), self.ids[*b].extent.clone());
                    let broadcast =
                        |id: &IterDomainId| self.ids[*id].iter_type == IterType::Broadcast;
                    if k == *axis {
                        if broadcast(a) || broadcast(b) {
                            return Err(Diagnostic::new(format!(
                                "concat: axis {axis} of {} and {} must be real axes, not broadcast ones",
                                self.desc(in0),
                                self.desc(inputs[1])
                            )));
                        }
                        out.push(
                            self.ids
                                .insert(IterDomain::new(ea.add(eb), IterType::Iteration)),
                        );
                    } else if !self.same_extent(&ea, &eb) || broadcast(a) != broadcast(b) {
                        return Err(Diagnostic::new(format!(
                            "concat: axis {k} of {} and of {} differ; only axis {axis}, the one joined, may",
                            self.desc(in0),
                            self.desc(inputs[1])
                        )));
                    } else {
                        out.push(self.fresh_copy(*a));
                    }
                }
                (d, out, None)
            }
            ExprKind::IndexSelect { axis, base } => {
                let ids = inputs[1];
                self.check_axes(op, in0, &[*axis], rank0)?;
                let vi = self.visible_axes(ids);
                let id_dtype = self.tensors[ids].dtype;
                if id_dtype != DType::I64 || vi.len() != 1 {
                    return Err(Diagnostic::new(format!(
                        "index_select: the ids {} must be an i64 tensor of rank 1 (one id per looked-up row)",
                        self.desc(ids)
                    )));
                }
                if let Some(b) = base {
                    for sym in b.symbols() {
                        if &*sym != crate::scalar::RANK && self.param(&sym).is_none() {
                            return Err(Diagnostic::new(format!(
                                "index_select: undefined parameter `{sym}` in the base row `{}` (a size over parameters and `rank`)",
                                b.to_source()
                            )));
                        }
                    }
                }
                let vis = self.visible_axes(in0);
                if self.ids[vis[*axis]].iter_type == IterType::Broadcast {
                    return Err(Diagnostic::new(format!(
                        "index_select: axis {axis} of {} is a broadcast axis; select along a real axis",
                        self.desc(in0)
                    )));
                }
                let mut out = Vec::new();
                for (k, id) in vis.iter().enumerate() {
                    out.push(if k == *axis {
                        self.fresh_copy(vi[0])
                    } else {
                        self.fresh_copy(*id)
                    });
                }
                // The table's rows stay as a reduction axis: across a device split of it the
                // per-device lookups are partial results that a sum completes.
                let r = self.fresh_copy(vis[*axis]);
                self.ids[r].iter_type = IterType::Reduction;
                out.push(r);
                (self.tensors[in0].dtype, out, None)
            }
            ExprKind::Matmul => {
                let d = self.same_dtype(op, inputs)?;
                (d, self.matmul_axes(inputs[0], inputs[1])?, None)
            }
            ExprKind::Linear => {
                let d = self.same_dtype(op, inputs)?;
                (d, self.linear_axes(inputs)?, None)
            }
        };
        let out = self.new_tensor(name, dtype, logical);
        self.tensors[out].root = root;
        let e = self.exprs.insert(Expr {
            kind,
            inputs: inputs.to_vec(),
            outputs: vec![out],
            span: None,
        });
        self.tensors[out].definition = Some(e);
        self.uses_index = std::sync::OnceLock::new();
        self.order.push(e);
        Ok(out)
    }

    /// `[.., m, k] x [.., k, n] -> [.., m, n, r(k)]` with numpy batch broadcasting: the batch
    /// axes of both operands align at the right, a missing axis or a broadcast axis `b`
    /// stretches to the other side's extent, and other batch axes must have equal extents.
    fn matmul_axes(&mut self, a: TensorId, b: TensorId) -> IrResult<Vec<IterDomainId>> {
        let (va, vb) = (self.visible_axes(a), self.visible_axes(b));
        if va.len() < 2 || vb.len() < 2 {
            return Err(Diagnostic::new(format!(
                "matmul needs operands of rank 2 or more, got {} and {}",
                self.desc(a),
                self.desc(b)
            )));
        }
        let ka = va[va.len() - 1];
        let kb = vb[vb.len() - 2];
        if !self.same_extent(&self.ids[ka].extent, &self.ids[kb].extent) {
            return Err(Diagnostic::new(format!(
                "matmul: contraction extents differ: last axis of {} is `{}`, axis {} of {} is `{}`",
                self.desc(a),
                self.ids[ka].extent.to_source(),
                vb.len() - 2,
                self.desc(b),
                self.ids[kb].extent.to_source()
            )));
        }
        let (ba, bb) = (&va[..va.len() - 2], &vb[..vb.len() - 2]);
        let nbatch = ba.len().max(bb.len());
        let mut out = Vec::new();
        for axis in 0..nbatch {
            // Right-aligned: output batch axis `axis` is axis `axis - (nbatch - len)` of an
            // operand with `len` batch axes, when that is not negative.
            let pick = |batch: &[IterDomainId]| {
                (axis + batch.len())
                    .checked_sub(nbatch)
                    .map(|i| (i, batch[i]))
            };
            let (pa, pb) = (pick(ba), pick(bb));
            let real = |id: IterDomainId| self.ids[id].iter_type != IterType::Broadcast;
            let src = match (pa, pb) {
                (Some((ia, x)), Some((ib, y))) if real(x) && real(y) => {
                    if !self.same_extent(&self.ids[x].extent, &self.ids[y].extent) {
                        return Err(Diagnostic::new(format!(
                            "matmul: batch axis {ia} of {} has extent `{}` but batch axis {ib} of {} has extent `{}` (batch axes align at the right; only a broadcast axis stretches)",
                            self.desc(a),
                            self.ids[x].extent.to_source(),
                            self.desc(b),
                            self.ids[y].extent.to_source()
                        )));
                    }
                    x
                }
                (Some((_, x)), Some((_, y))) => {
                    if real(x) {
                        x
                    } else {
                        y
                    }
                }
                (Some((_, x)), None) | (None, Some((_, x))) => x,
                (None, None) => continue,
            };
            out.push(self.fresh_copy(src));
        }
        out.push(self.fresh_copy(va[va.len() - 2]));
        out.push(self.fresh_copy(vb[vb.len() - 1]));
        let r = self.fresh_copy(ka);
        self.ids[r].iter_type = IterType::Reduction;
        out.push(r);
        Ok(out)
    }

    fn linear_axes(&mut self, ins: &[TensorId]) -> IrResult<Vec<IterDomainId>> {
        let (x, w) = (ins[0], ins[1]);
        let (vx, vw) = (self.visible_axes(x), self.visible_axes(w));
        if vx.is_empty() || vw.len() != 2 {
            return Err(Diagnostic::new(format!(
                "linear needs an input of rank 1 or more and a weight [n, k] of rank 2, got {} and {}",
                self.desc(x),
                self.desc(w)
            )));
        }
        let kx = vx[vx.len() - 1];
        if !self.same_extent(&self.ids[kx].extent, &self.ids[vw[1]].extent) {
            return Err(Diagnostic::new(format!(
                "linear: the last axis of {} is `{}` but axis 1 of weight {} is `{}`",
                self.desc(x),
                self.ids[kx].extent.to_source(),
                self.desc(w),
                self.ids[vw[1]].extent.to_source()
            )));
        }
        if let Some(bias) = ins.get(2) {
            let vb = self.visible_axes(*bias);
            if vb.len() != 1 || !self.same_extent(&self.ids[vb[0]].extent, &self.ids[vw[0]].extent)
            {
                return Err(Diagnostic::new(format!(
                    "linear: bias {} must have shape [`{}`]",
                    self.desc(*bias),
                    self.ids[vw[0]].extent.to_source()
                )));
            }
        }
        let mut out = Vec::new();
        for id in &vx[..vx.len() - 1] {
            out.push(self.fresh_copy(*id));
        }
        out.push(self.fresh_copy(vw[0]));
        let r = self.fresh_copy(kx);
        self.ids[r].iter_type = IterType::Reduction;
        out.push(r);
        Ok(out)
    }

    /// Root (copies of the input axes) and logical (after one split or merge) for a reshape.
    fn reshape_domains(
        &mut self,
        t: TensorId,
        shape: &[Scalar],
    ) -> IrResult<(Vec<IterDomainId>, Vec<IterDomainId>)> {
        for s in shape {
            self.check_symbols(s)?;
        }
        let vis = self.visible_axes(t);
        let root: Vec<IterDomainId> = vis.iter().map(|i| self.fresh_copy(*i)).collect();
        let ext: Vec<Scalar> = root.iter().map(|i| self.ids[*i].extent.clone()).collect();
        let fail = |f: &Fusion| {
            let to: Vec<String> = shape.iter().map(|s| s.to_source()).collect();
            Diagnostic::new(format!(
                "reshape of {} to [{}] is neither a split of one axis nor a merge of two adjacent axes",
                f.desc(t),
                to.join(", ")
            ))
        };
        if shape.len() == ext.len() + 1 && !ext.is_empty() {
            // Split of axis k: the first differing position.
            let k = (0..ext.len())
                .find(|k| !self.same_extent(&ext[*k], &shape[*k]))
                .unwrap_or(ext.len() - 1);
            let same_rest = (k + 1..ext.len()).all(|j| self.same_extent(&ext[j], &shape[j + 1]));
            let prod = shape[k].clone().mul(shape[k + 1].clone());
            if !same_rest || !self.same_extent(&prod, &ext[k]) {
                return Err(fail(self));
            }
            let (o, i) = self.split_id(root[k], shape[k].clone(), SplitKind::Outer);
            self.ids[o].rfactor = true;
            self.ids[i].rfactor = true;
            // Keep the written extent of the inner axis when it is provably the same.
            self.ids[i].extent = shape[k + 1].clone();
            let mut logical = root.clone();
            logical.splice(k..=k, [o, i]);
            Ok((root, logical))
        } else if shape.len() + 1 == ext.len() && !shape.is_empty() {
            let k = (0..shape.len())
                .find(|k| !self.same_extent(&ext[*k], &shape[*k]))
                .unwrap_or(shape.len() - 1);
            let same_rest = (k + 1..shape.len()).all(|j| self.same_extent(&ext[j + 1], &shape[j]));
            let prod = ext[k].clone().mul(ext[k + 1].clone());
            if !same_rest || !self.same_extent(&prod, &shape[k]) {
                return Err(fail(self));
            }
            let m = self.merge_ids(root[k], root[k + 1]);
            self.ids[m].rfactor = true;
            let mut logical = root.clone();
            logical.splice(k..=k + 1, [m]);
            Ok((root, logical))
        } else {
            Err(fail(self))
        }
    }
}
