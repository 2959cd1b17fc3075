//! `reorder-sharded-axis`: make the buffers of Allgather, Gather, Scatter and ReduceScatter
//! contiguous per device (reference/nvfuser-host-ir.md §4.2, nvFuser's
//! `ReorderShardedAxisPass`).
//!
//! NCCL gathers and scatters whole contiguous blocks: the block of member `i` is the `i`-th
//! slice of the flat buffer. That matches the tensor only when the gathered (or scattered)
//! axis is the outermost allocation axis whose local size is not 1 (device- and
//! stream-parallel, broadcast, reduction and extent-1 axes have local size 1), on both sides
//! of the collective. Reduce, Allreduce, Broadcast, SendRecv and AllToAll need contiguity
//! only and are left alone.
//!
//! What this pass does (the permute/set pairs of nvFuser's original pass, not allocation
//! reordering): a non-compliant `y = set(x)` whose sharded axis is `k` becomes
//!
//! ```text
//! x_reordered = permute(x, [k, 0, .., k-1, k+1, ..])   // local, keeps x's sharding
//! y_reordered = set(x_reordered)                         // the collective, axis k now outermost
//! y           = permute(y_reordered, inverse)            // local, y keeps its id and sharding
//! ```
//!
//! and a non-compliant ReduceScatter `y = sum(x, axes)` becomes `permute`, `sum` over the
//! permuted axes, `permute` back (`y` then loses its reduction axes, which the new `sum`
//! holds). The permuted tensors are fresh, so their allocation is their logical domain, with
//! the sharded axis first. Allocation domains of fusion inputs and outputs are never changed,
//! which is why permutes are inserted rather than allocations reordered.
//!
//! Contract. Input: an [`Ir::Fusion`] after `decompose-reshardings`. Output: the same
//! computation, every layout-sensitive collective compliant, still compute XOR one
//! communication per expr. Existing tensor ids are kept. Idempotent: compliant collectives
//! are left as they are.

use weave_host_ir::CommunicationType;
use weave_ir::{Diagnostic, ExprId, ExprKind, Fusion, IrResult, IterDomainId, IterType, TensorId};
use weave_transform::IdGraph;

use crate::communication::derive_communication;
use crate::pass::{Changed, Ir, Pass, PassError};
use crate::propagate_shardings::{replay, run_on_fusion};
use crate::resharding::{is_resharding, DEVICE_AND_STREAM_TYPES};

/// The `reorder-sharded-axis` pass (see the module doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct ReorderShardedAxis;

impl Pass for ReorderShardedAxis {
    fn name(&self) -> &'static str {
        "reorder-sharded-axis"
    }

    fn summary(&self) -> &'static str {
        "permute around gathers and scatters so the sharded axis is outermost in memory"
    }

    fn run(&self, ir: &mut Ir) -> Result<Changed, PassError> {
        run_on_fusion(self.name(), ir, reorder_sharded_axis)
    }
}

/// Rewrites every non-compliant collective (see the module doc).
pub fn reorder_sharded_axis(f: &mut Fusion) -> IrResult<()> {
    let exprs: Vec<ExprId> = f.exprs().to_vec();
    for e in exprs {
        if !is_resharding(f, e) {
            continue;
        }
        let info = derive_communication(f, e)?;
        if !matches!(
            info.kind,
            CommunicationType::Allgather
                | CommunicationType::Gather
                | CommunicationType::Scatter
                | CommunicationType::ReduceScatter
        ) {
            continue;
        }
        let (Some(pa), Some(ca)) = (info.producer_axis, info.consumer_axis) else {
            continue;
        };
        let (x, y) = (f.expr(e).inputs[0], f.expr(e).outputs[0]);
        if is_layout_compliant(f, x, pa.id) && is_layout_compliant(f, y, ca.id) {
            continue;
        }
        let Some(k) = pa.axis else {
            continue;
        };
        rewrite(f, e, k).map_err(|d| d.or_at(f.expr(e).span))?;
    }
    Ok(())
}

/// True if no allocation axis of `t` before the first one derived from `axis` (a logical or
/// root axis of `t`) has a local size other than 1.
pub fn is_layout_compliant(f: &Fusion, t: TensorId, axis: IterDomainId) -> bool {
    let alloc = f.tensor(t).allocation_domain();
    let Some(pos) = alloc.iter().position(|a| derives_from(f, *a, axis)) else {
        return true;
    };
    alloc[..pos].iter().all(|a| local_size_one(f, *a))
}

fn derives_from(f: &Fusion, id: IterDomainId, axis: IterDomainId) -> bool {
    let mut cur = id;
    loop {
        if cur == axis {
            return true;
        }
        let Some(e) = f.id(cur).definition else {
            return false;
        };
        cur = f.id_expr(e).inputs()[0];
    }
}

fn local_size_one(f: &Fusion, id: IterDomainId) -> bool {
    let d = f.id(id);
    d.parallel.is_device_or_stream()
        || d.iter_type != IterType::Iteration
        || f.eval(&d.extent) == Some(1)
}

/// Wraps the collective `e` in permutes that move operand axis `k` to the front.
fn rewrite(f: &mut Fusion, e: ExprId, k: usize) -> IrResult<()> {
    let (x, y) = (f.expr(e).inputs[0], f.expr(e).outputs[0]);
    let kind = f.expr(e).kind.clone();
    let n = f.visible_axes(x).len();
    let mut perm = vec![k];
    perm.extend((0..n).filter(|j| *j != k));
    let inverse = |p: &[usize]| -> Vec<usize> {
        (0..p.len())
            .map(|j| p.iter().position(|q| *q == j).expect("a permutation"))
            .collect()
    };
    let span = f.expr(e).span;
    let add = |f: &mut Fusion, base: TensorId, kind: ExprKind, input: TensorId| {
        let name = f.fresh_name(&format!("{}_reordered", f.tensor(base).name));
        let t = f.add_op(&name, kind, &[input])?;
        let d = f.tensor(t).definition.expect("just defined");
        f.move_expr_before(d, e);
        f.expr_mut(d).span = span;
        f.tensor_mut(t).mesh = f.tensor(base).mesh;
        f.tensor_mut(t).span = f.tensor(base).span;
        Ok::<TensorId, Diagnostic>(t)
    };
    let xp = add(f, x, ExprKind::Permute { perm: perm.clone() }, x)?;
    let (yp, back) = match kind {
        ExprKind::Set => (add(f, y, ExprKind::Set, xp)?, inverse(&perm)),
        ExprKind::Reduction { op, axes } => {
            if f.tensor(y).root.is_some() {
                return Err(Diagnostic::new(format!(
                    "reorder-sharded-axis: `{}` has a root domain",
                    f.tensor(y).name
                )));
            }
            let inv = inverse(&perm);
            let mut paxes: Vec<usize> = axes.iter().map(|a| inv[*a]).collect();
            paxes.sort_unstable();
            let yp = add(f, y, ExprKind::Reduction { op, axes: paxes }, xp)?;
            // yp's materialized axes are x's, permuted, minus the reduced ones.
            let yp_order: Vec<usize> = perm.iter().copied().filter(|a| !axes.contains(a)).collect();
            let back = (0..n)
                .filter(|j| !axes.contains(j))
                .map(|j| yp_order.iter().position(|q| *q == j).expect("kept"))
                .collect();
            (yp, back)
        }
        other => {
            return Err(Diagnostic::new(format!(
                "reorder-sharded-axis: cannot reorder a {} collective",
                other.op_name()
            )))
        }
    };
    let graph = IdGraph::build(f);
    replay(f, x, xp, &graph, &DEVICE_AND_STREAM_TYPES)?;
    replay(f, y, yp, &graph, &DEVICE_AND_STREAM_TYPES)?;

    // y = permute(yp): y keeps its materialized axes and their schedule, without reductions.
    let tv = f.tensor(y).clone();
    let keep = |f: &Fusion, id: &IterDomainId| {
        let mut cur = *id;
        loop {
            if tv.logical.contains(&cur) {
                return f.id(cur).iter_type != IterType::Reduction;
            }
            match f.id(cur).definition {
                Some(d) => cur = f.id_expr(d).inputs()[0],
                None => return true,
            }
        }
    };
    let logical: Vec<IterDomainId> = tv.logical.iter().copied().filter(|i| keep(f, i)).collect();
    let loop_domain: Vec<IterDomainId> = tv
        .loop_domain
        .iter()
        .copied()
        .filter(|i| keep(f, i))
        .collect();
    let allocation = tv
        .allocation
        .as_ref()
        .map(|a| a.iter().copied().filter(|i| keep(f, i)).collect());
    let t = f.tensor_mut(y);
    t.logical = logical;
    t.loop_domain = loop_domain;
    t.allocation = allocation;
    let ex = f.expr_mut(e);
    ex.kind = ExprKind::Permute { perm: back };
    ex.inputs = vec![yp];
    Ok(())
}
