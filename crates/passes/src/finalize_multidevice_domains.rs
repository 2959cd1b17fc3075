//! `finalize-multidevice-domains`: meshes everywhere, device and stream splits in the
//! allocation domains, parallel axes first in the loop domains (reference/nvfuser-host-ir.md
//! §6.1, seed 002; nvFuser's `FinalizeMultideviceDomainsPass`).
//!
//! Contract.
//!
//! * Input: an [`crate::Ir::Fusion`] after `reorder-sharded-axis`. Output: the same exprs and
//!   tensors; meshes, allocation domains and the order of loop axes change. Idempotent.
//! * **Meshes.** If any tensor has a mesh, every tensor gets one: from a tensor of the same
//!   expr (outputs first, then inputs), repeated to a fixed point, and otherwise the first
//!   mesh any tensor has.
//! * **Allocation** (the rules of §6.1). The allocation domain starts as it is (the logical
//!   domain unless the user wrote `allocation = loop`). Then, for each device-parallel loop
//!   axis, the loop's split chain is replayed onto it, reusing the loop's own split outputs, so
//!   a device split is *always* in the allocation (each device allocates its shard). A
//!   `Stream` loop axis goes to the allocation only when the tensor
//!   1. is neither a fusion input nor a fusion output (their buffers come from, or go to, the
//!      caller, who cannot allocate them per loop iteration), and
//!   2. every expr reading it produces outputs with the same stream sharding
//!      (`!have_different_shardings(tv, consumer, [Stream])`), i.e. producer and consumers
//!      can share the loop iteration, and their stream axes are one axis of the id graph
//!      (one-chunk splits of two different axes have equal indices but lower to two loops).
//!
//!   Otherwise the tensor is stream-parallel in its loop but fully allocated ("`s*`"). When a
//!   device split hangs below such an unallocated stream split (`[Stream, DIDx, rest]` from
//!   splitting the stream chunk again), the stream split is replayed serially: the allocation
//!   gets fresh `[s, DIDx, rest]` axes.
//! * **Loop order.** Loop axes are stably reordered `Stream`, `DIDy`, `DIDx`, then the rest
//!   (nvFuser's `reorderParallelizedToFront`), reduction axes included.

use weave_ir::{
    Diagnostic, Fusion, IdExpr, IrResult, IterDomainId, IterType, MeshId, ParallelType, TensorId,
};
use weave_transform::id_graph::IdGraph;
use weave_transform::DomainKind;

use crate::resharding::have_different_shardings;
use crate::shared::FusionRewrite;

/// The `finalize-multidevice-domains` pass (see the module doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct FinalizeMultideviceDomains;

impl FusionRewrite for FinalizeMultideviceDomains {
    const NAME: &'static str = "finalize-multidevice-domains";
    const SUMMARY: &'static str =
        "give every tensor a mesh, put device (and inlinable stream) splits in allocation, parallel loop axes first";
    const REWRITE: fn(&mut Fusion) -> IrResult<()> = finalize_multidevice_domains;
}

/// Meshes, allocation domains and loop order (see the module doc).
pub fn finalize_multidevice_domains(f: &mut Fusion) -> IrResult<()> {
    assign_meshes(f);
    // One id graph for every tensor's question (loop domains do not change below).
    let graph = IdGraph::build(f);
    for t in f.tensors_in_order() {
        shard_allocation(f, t, &graph)?;
        reorder_parallelized_to_front(f, t);
    }
    Ok(())
}

fn assign_meshes(f: &mut Fusion) {
    let tensors = f.tensors_in_order();
    let Some(fallback) = tensors.iter().find_map(|t| f.tensor(*t).mesh) else {
        return;
    };
    loop {
        let mut changed = false;
        for e in f.exprs().to_vec() {
            let ex = f.expr(e);
            let members: Vec<TensorId> = ex.outputs.iter().chain(&ex.inputs).copied().collect();
            let Some(m): Option<MeshId> = members.iter().find_map(|t| f.tensor(*t).mesh) else {
                continue;
            };
            for t in members {
                if f.tensor(t).mesh.is_none() {
                    f.tensor_mut(t).mesh = Some(m);
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    for t in tensors {
        if f.tensor(t).mesh.is_none() {
            f.tensor_mut(t).mesh = Some(fallback);
        }
    }
}

/// True if `t`'s `Stream` loop split may go to its allocation (the two conditions of the
/// module doc). False when `t` has no stream axis. Builds the fusion's id graph; a caller
/// asking about many tensors builds it once and asks [`should_allocate_per_stream_in`].
pub fn should_allocate_per_stream(f: &Fusion, t: TensorId) -> bool {
    should_allocate_per_stream_in(f, t, &IdGraph::build(f))
}

/// [`should_allocate_per_stream`] against `graph`, the id graph of `f` (only its loop-domain
/// ids are asked about, so later allocation-domain replays leave it valid).
pub fn should_allocate_per_stream_in(f: &Fusion, t: TensorId, graph: &IdGraph) -> bool {
    let has_stream = f.tensor(t).loop_domain.iter().any(|i| {
        let d = f.id(*i);
        d.parallel == ParallelType::Stream && d.iter_type != IterType::Reduction
    });
    if !has_stream || f.is_input(t) || f.is_output(t) {
        return false;
    }
    // The stream axes must also be one axis of the id graph, which is what puts producer and
    // consumer into one stream loop: two one-chunk splits of different axes have provably
    // equal (zero) indices but are two loops.
    let stream_of = |x: TensorId| {
        f.tensor(x).loop_domain.iter().copied().find(|i| {
            let d = f.id(*i);
            d.parallel == ParallelType::Stream && d.iter_type != IterType::Reduction
        })
    };
    f.uses(t).into_iter().all(|e| {
        f.expr(e).outputs.iter().all(|o| {
            !have_different_shardings(
                f,
                t,
                DomainKind::Loop,
                *o,
                DomainKind::Loop,
                &[ParallelType::Stream],
            ) && match (stream_of(t), stream_of(*o)) {
                (Some(a), Some(b)) => graph.are_mapped(a, b),
                _ => true,
            }
        })
    })
}

fn shard_allocation(f: &mut Fusion, t: TensorId, graph: &IdGraph) -> IrResult<()> {
    let stream_ok = should_allocate_per_stream_in(f, t, graph);
    let tv = f.tensor(t).clone();
    let mut alloc: Vec<IterDomainId> = tv.allocation_domain().to_vec();
    let mut changed = false;
    for &l in &tv.loop_domain {
        let d = f.id(l);
        if d.iter_type == IterType::Reduction || alloc.contains(&l) {
            continue;
        }
        let pt = d.parallel;
        if !(pt.is_device() || (pt == ParallelType::Stream && stream_ok)) {
            continue;
        }
        // Already sharded along `pt` (by an earlier run, or by the user's allocation).
        let sharded = alloc.iter().any(|a| {
            let x = f.id(*a);
            x.parallel == pt && x.iter_type != IterType::Reduction
        });
        if sharded {
            continue;
        }
        // The splits from an allocation axis down to `l`, outermost first.
        let mut chain: Vec<IterDomainId> = Vec::new();
        let mut cur = l;
        while !alloc.contains(&cur) {
            let Some(e) = f.id(cur).definition else {
                return Err(Diagnostic::new(format!(
                    "cannot shard the allocation of `{}` like its loop: its {pt} axis does not derive from its allocation domain",
                    tv.name
                )));
            };
            match f.id_expr(e) {
                IdExpr::Split { input, .. } => {
                    chain.push(cur);
                    cur = *input;
                }
                IdExpr::Merge { .. } => {
                    return Err(Diagnostic::new(format!(
                        "cannot shard the allocation of `{}` like its loop: its {pt} axis derives from a merge",
                        tv.name
                    )))
                }
            }
        }
        chain.reverse();
        // Replay: reuse the loop's split outputs while they may be allocated; once a stream
        // split may not, continue on fresh serial copies.
        let mut at = cur;
        let mut fresh = false;
        for taken in chain {
            let Some(e) = f.id(taken).definition else {
                unreachable!("chain members are split outputs")
            };
            let IdExpr::Split {
                outer,
                inner,
                factor,
                kind,
                ..
            } = f.id_expr(e).clone()
            else {
                unreachable!("chain holds splits")
            };
            let op = f.id(outer).parallel;
            let allocatable = op == ParallelType::Serial
                || op.is_device()
                || (op == ParallelType::Stream && stream_ok);
            fresh |= !allocatable;
            let (o, i) = if fresh {
                let (o, i) = f.split_id(at, factor, kind);
                for x in [o, i] {
                    f.id_mut(x).parallel = ParallelType::Serial;
                }
                if taken == l && taken == outer {
                    f.id_mut(o).parallel = pt;
                }
                (o, i)
            } else {
                (outer, inner)
            };
            let pos = alloc.iter().position(|x| *x == at).expect("in allocation");
            alloc.splice(pos..=pos, [o, i]);
            at = if taken == outer { o } else { i };
            changed = true;
        }
    }
    if changed {
        f.tensor_mut(t).allocation = Some(alloc);
    }
    Ok(())
}

fn rank(pt: ParallelType) -> u8 {
    match pt {
        ParallelType::Stream => 0,
        ParallelType::DIDy => 1,
        ParallelType::DIDx => 2,
        ParallelType::Serial => 3,
    }
}

fn reorder_parallelized_to_front(f: &mut Fusion, t: TensorId) {
    let mut dom = f.tensor(t).loop_domain.clone();
    dom.sort_by_key(|i| rank(f.id(*i).parallel));
    f.tensor_mut(t).loop_domain = dom;
}
