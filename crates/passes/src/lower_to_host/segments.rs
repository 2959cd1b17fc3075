//! Lowering compute segments: library calls (matmul, linear, accumulating matmuls) and
//! generated kernels, with the fusion each kernel runs.

use std::collections::HashMap;

use weave_host_ir::{HostTensorId, KernelUnit, Stmt};
use weave_ir::{Diagnostic, ExprId, ExprKind, Fusion, IterType, TensorId};
use weave_segmenter::{SegmentId, SegmentKind, SegmentedFusion};
use weave_transform::id_graph::IdGraph;

use super::Lowering;

impl Lowering<'_> {
    pub(super) fn lower_segment(
        &mut self,
        sf: &SegmentedFusion,
        seg: SegmentId,
    ) -> Result<(), Diagnostic> {
        let s = sf.segment(seg);
        let exprs: Vec<ExprId> = s.exprs().to_vec();
        let stream = match self.accumulating.get(&seg) {
            Some(s) => Some(*s),
            None => self.reference_stream(&exprs)?,
        };
        self.current = Some(seg);
        self.open_loop_for(stream)?;
        self.current_graph = Some((exprs.clone(), IdGraph::build_for_exprs(self.f, &exprs)));
        match s.kind() {
            SegmentKind::Library if self.accumulating.contains_key(&seg) => {
                self.lower_accumulating_matmul(exprs[0])
            }
            // Lowered with the ring's exchange, which decides where it writes.
            SegmentKind::Library
                if s.outputs()
                    .first()
                    .is_some_and(|p| self.product_rides_the_ring(*p)) =>
            {
                Ok(())
            }
            SegmentKind::Library => self.lower_library(exprs[0]),
            SegmentKind::Communication => self.lower_communication(exprs[0]),
            SegmentKind::Kernel if self.accumulating.contains_key(&seg) => {
                self.lower_accumulating_reduction(sf, seg)
            }
            SegmentKind::Kernel => self.lower_kernel(sf, seg),
        }
    }

    fn lower_library(&mut self, e: ExprId) -> Result<(), Diagnostic> {
        self.library_call(e, None, false)
    }

    /// The library call of `e` (a matmul or linear) on the open loop's chunks, writing `out`
    /// (`None`: the binding of `e`'s output), adding to what it holds with `accumulate`.
    pub(super) fn library_call(
        &mut self,
        e: ExprId,
        out: Option<HostTensorId>,
        accumulate: bool,
    ) -> Result<(), Diagnostic> {
        let expr = self.f.expr(e).clone();
        let ins: Vec<HostTensorId> = expr
            .inputs
            .iter()
            .map(|t| self.resolve(*t, false))
            .collect::<Result<_, _>>()?;
        let out = match out {
            Some(out) => out,
            None => self.resolve(expr.outputs[0], true)?,
        };
        let stmt = match expr.kind {
            ExprKind::Matmul => Stmt::Matmul {
                a: ins[0],
                b: ins[1],
                out,
                accumulate,
            },
            ExprKind::Linear => Stmt::Linear {
                input: ins[0],
                weight: ins[1],
                bias: ins.get(2).copied(),
                out,
                accumulate,
            },
            ref k => {
                return Err(Diagnostic::new(format!(
                    "a library segment holds `{}`, which is not a matmul or linear",
                    k.op_name()
                )))
            }
        };
        self.emit(stmt);
        Ok(())
    }

    /// A matmul that contracts over the open loop's streamed axis (see
    /// [`Self::accumulating_stream`]): `out += a_chunk @ b_chunk` in every iteration, `out`
    /// allocated whole and zeroed before the loop. `assign-streams` orders each iteration's
    /// accumulation after the previous one's.
    fn lower_accumulating_matmul(&mut self, e: ExprId) -> Result<(), Diagnostic> {
        let f = self.f;
        let expr = f.expr(e).clone();
        let (a, b, out) = (expr.inputs[0], expr.inputs[1], expr.outputs[0]);
        let (va, vb) = (f.visible_axes(a), f.visible_axes(b));
        let (ka, kb) = (va[va.len() - 1], vb[vb.len() - 2]);
        if self.chunk_root(a) != Some(ka) || self.chunk_root(b) != Some(kb) {
            return Err(Diagnostic::new(format!(
                "internal: the stream loop does not cut `{}` and `{}` along the contraction axis of `{}`",
                f.tensor(a).name,
                f.tensor(b).name,
                f.tensor(out).name
            )));
        }
        let a = self.resolve(a, false)?;
        let b = self.resolve(b, false)?;
        if self.top.contains_key(out) {
            return Err(Diagnostic::new(format!(
                "internal: `{}` is written twice",
                f.tensor(out).name
            )));
        }
        let sum = self.new_tensor(out, self.local_sizes(out, false)?);
        self.emit_before_loop(Stmt::Allocate {
            tensor: sum,
            zero_init: true,
        });
        self.top.insert(out, sum);
        self.emit(Stmt::Matmul {
            a,
            b,
            out: sum,
            accumulate: true,
        });
        Ok(())
    }

    /// A sum over the open loop's streamed axis (see [`Self::accumulating_reduction`]): in
    /// every iteration one kernel adds the chunk's sum to the output in place (`acc = acc +
    /// sum(chunk)`, the output both an input and the output of the launch), `acc` allocated
    /// whole and zeroed before the loop. `assign-streams` orders each iteration's
    /// accumulation after the previous one's.
    fn lower_accumulating_reduction(
        &mut self,
        sf: &SegmentedFusion,
        seg: SegmentId,
    ) -> Result<(), Diagnostic> {
        let f = self.f;
        let s = sf.segment(seg);
        let (inputs, outputs) = (s.inputs().to_vec(), s.outputs().to_vec());
        let ([input], [out]) = (inputs.as_slice(), outputs.as_slice()) else {
            return Err(Diagnostic::new(format!(
                "internal: an accumulating sum segment has {} input(s) and {} output(s)",
                inputs.len(),
                outputs.len()
            )));
        };
        if self.chunk_root(*input).is_none() {
            return Err(Diagnostic::new(format!(
                "internal: the stream loop does not cut `{}`, whose sum `{}` accumulates in it",
                f.tensor(*input).name,
                f.tensor(*out).name
            )));
        }
        let chunk = self.resolve(*input, false)?;
        if self.top.contains_key(*out) {
            return Err(Diagnostic::new(format!(
                "internal: `{}` is written twice",
                f.tensor(*out).name
            )));
        }
        let acc = self.new_tensor(*out, self.local_sizes(*out, false)?);
        self.emit_before_loop(Stmt::Allocate {
            tensor: acc,
            zero_init: true,
        });
        self.top.insert(*out, acc);
        let unit = accumulating_kernel_fusion(f, s.exprs(), *input, *out, self.kernels)?;
        self.emit_accumulation(unit, chunk, acc);
        Ok(())
    }

    /// Registers `unit` as the next kernel and launches it on `(addend, acc)` into `acc`, in
    /// place (`assign-streams` orders such launches across iterations).
    pub(super) fn emit_accumulation(
        &mut self,
        unit: Fusion,
        addend: HostTensorId,
        acc: HostTensorId,
    ) {
        self.kernels += 1;
        let kernel = self.p.kernels.insert(KernelUnit {
            fusion: std::sync::Arc::new(unit),
        });
        self.emit(Stmt::LaunchKernel {
            kernel,
            inputs: vec![addend, acc],
            outputs: vec![acc],
        });
    }

    fn lower_kernel(&mut self, sf: &SegmentedFusion, seg: SegmentId) -> Result<(), Diagnostic> {
        let s = sf.segment(seg);
        let inputs: Vec<TensorId> = s.inputs().to_vec();
        let outputs: Vec<TensorId> = s.outputs().to_vec();
        let unit = kernel_fusion(self.f, s.exprs(), &inputs, &outputs, self.kernels)?;
        self.kernels += 1;
        let kernel = self.p.kernels.insert(KernelUnit {
            fusion: std::sync::Arc::new(unit),
        });
        let ins = inputs
            .iter()
            .map(|t| self.resolve(*t, false))
            .collect::<Result<Vec<_>, _>>()?;
        let outs = outputs
            .iter()
            .map(|t| self.resolve(*t, true))
            .collect::<Result<Vec<_>, _>>()?;
        self.emit(Stmt::LaunchKernel {
            kernel,
            inputs: ins,
            outputs: outs,
        });
        Ok(())
    }
}

/// The fusion of an accumulating sum: the segment's sum of `input` plus an input standing
/// for the running total (named after `out`, of its global shape), whose sum is the output.
fn accumulating_kernel_fusion(
    f: &Fusion,
    exprs: &[ExprId],
    input: TensorId,
    out: TensorId,
    k: usize,
) -> Result<Fusion, Diagnostic> {
    let (mut u, map) = kernel_body(f, exprs, &[input], k)?;
    let total = f.tensor(out);
    let sum = *map.get(&out).ok_or_else(|| {
        Diagnostic::new(format!(
            "internal: the kernel of `{}` does not compute it",
            total.name
        ))
    })?;
    // The running total has the shape the kernel's sum has (its reduced axes gone).
    let extents = u
        .visible_axes(sum)
        .iter()
        .map(|i| u.id(*i).extent.clone())
        .collect();
    let acc = u.add_input(
        &f.fresh_name(&format!("{}_so_far", total.name)),
        total.dtype,
        extents,
        None,
    )?;
    let next = u.add_op(
        &f.fresh_name(&format!("{}_accumulated", total.name)),
        ExprKind::Binary(weave_ir::BinaryOp::Add),
        &[acc, sum],
    )?;
    u.add_output(next)?;
    Ok(u)
}

/// The fusion a kernel segment runs: its exprs replayed over fresh inputs that stand for the
/// segment's inputs (global shapes; the runtime binds local chunks).
fn kernel_fusion(
    f: &Fusion,
    exprs: &[ExprId],
    inputs: &[TensorId],
    outputs: &[TensorId],
    k: usize,
) -> Result<Fusion, Diagnostic> {
    let (mut u, map) = kernel_body(f, exprs, inputs, k)?;
    for t in outputs {
        u.add_output(map[t])?;
    }
    Ok(u)
}

/// [`kernel_fusion`] without outputs, and where each tensor of the segment went.
fn kernel_body(
    f: &Fusion,
    exprs: &[ExprId],
    inputs: &[TensorId],
    k: usize,
) -> Result<(Fusion, HashMap<TensorId, TensorId>), Diagnostic> {
    let mut u = Fusion::new(&format!("{}_kernel{k}", f.name));
    for p in f.params() {
        u.add_param(&p.name, p.value)?;
    }
    let mut map: HashMap<TensorId, TensorId> = HashMap::new();
    for t in inputs {
        let tv = f.tensor(*t);
        let axes = f.visible_axes(*t);
        let ext = axes.iter().map(|i| f.id(*i).extent.clone()).collect();
        let n = u.add_input(&tv.name, tv.dtype, ext, None)?;
        let new_axes = u.tensor(n).logical.clone();
        let mut broadcast = Vec::new();
        for (k, (old, new)) in axes.iter().zip(new_axes).enumerate() {
            match f.id(*old).iter_type {
                IterType::Broadcast => broadcast.push(k),
                it => u.id_mut(new).iter_type = it,
            }
        }
        // A `.weave` declaration has no broadcast axes, and the kernel must read back from
        // the host IR text as it is: the input is declared with extent-1 axes, squeezed and
        // broadcast again, so the ops that follow stretch them as before.
        let value = if broadcast.is_empty() {
            n
        } else {
            let squeezed = u.add_op(
                &f.fresh_name(&format!("{}_squeezed", tv.name)),
                ExprKind::Squeeze {
                    axes: broadcast.clone(),
                },
                &[n],
            )?;
            u.add_op(
                &f.fresh_name(&format!("{}_stretched", tv.name)),
                ExprKind::Broadcast { axes: broadcast },
                &[squeezed],
            )?
        };
        map.insert(*t, value);
    }
    for e in exprs {
        let ex = f.expr(*e);
        let ins: Vec<TensorId> = ex.inputs.iter().map(|t| map[t]).collect();
        let o = ex.outputs[0];
        let n = u.add_op(&f.tensor(o).name, ex.kind.clone(), &ins)?;
        map.insert(o, n);
    }
    Ok((u, map))
}
