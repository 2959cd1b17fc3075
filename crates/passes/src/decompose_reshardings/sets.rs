//! Step 3 of `decompose-reshardings`: resharding sets before every remaining resharding
//! expr, one sharding change per `set`, reductions split from a layout change, and the
//! gather-then-scatter forms of the copies no single collective makes.

use std::collections::HashSet;

use weave_ir::{Diagnostic, ExprId, ExprKind, Fusion, IrResult, IterType, ParallelType, TensorId};
use weave_transform::logical_map::pairwise_map;
use weave_transform::schedule::DomainKind;
use weave_transform::IdGraph;

use super::{insert_before, make_set_of};
use crate::communication::{
    ancestor, copy_of, derive_communication, expr_desc, is_layout_change, is_nested_all_to_all,
    is_unnested_did_to_stream,
};
use crate::propagate_shardings::replay;
use crate::resharding::{
    have_different_shardings, is_resharding, parallel_axis, DEVICE_AND_STREAM_TYPES, DEVICE_TYPES,
};

/// The device types whose sharding differs between `x` and `y`.
fn changing_types(f: &Fusion, x: TensorId, y: TensorId) -> Vec<ParallelType> {
    DEVICE_TYPES
        .into_iter()
        .filter(|pt| {
            let (xl, yl) = (&f.tensor(x).loop_domain, &f.tensor(y).loop_domain);
            (parallel_axis(f, xl, *pt).is_some() || parallel_axis(f, yl, *pt).is_some())
                && have_different_shardings(f, x, DomainKind::Loop, y, DomainKind::Loop, &[*pt])
        })
        .collect()
}

/// True if `e` is a `set` on one mesh whose DIDx and DIDy shardings both change: step 3
/// turns it into one set per change (`one_change_per_set`).
pub fn changes_several_device_types(f: &Fusion, e: ExprId) -> bool {
    let Some((x, y)) = copy_of(f, e) else {
        return false;
    };
    f.mesh_of(x).is_some() && f.mesh_of(x) == f.mesh_of(y) && changing_types(f, x, y).len() > 1
}

/// True if `e` is a `set` from one mesh to another whose output is split across devices and
/// that no single communication performs, because the receiver mesh is 2-D (a Scatter onto
/// it) or because DIDx and DIDy both change: step 3 first copies the input whole onto the
/// receiver mesh (`replicate_on_the_receivers`), then splits it there, one set per type.
pub fn copies_onto_another_mesh_in_two(f: &Fusion, e: ExprId) -> bool {
    let Some((x, y)) = copy_of(f, e) else {
        return false;
    };
    let (Some(xm), Some(ym)) = (f.mesh_of(x), f.mesh_of(y)) else {
        return false;
    };
    let y_split = DEVICE_TYPES
        .iter()
        .any(|pt| parallel_axis(f, &f.tensor(y).loop_domain, *pt).is_some());
    xm != ym
        && y_split
        && (ym.shape().len() > 1 || changing_types(f, x, y).len() > 1)
        && derive_communication(f, e).is_err()
}

/// Step 3 for a `set` of [`copies_onto_another_mesh_in_two`]: `<in>_resharded = set(in)`,
/// whole (replicated) on the output's mesh (a Broadcast, or a gather on the senders and a
/// Broadcast), is inserted before it, and the `set` then splits that copy on one mesh.
fn replicate_on_the_receivers(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    let (x, y) = (f.expr(e).inputs[0], f.expr(e).outputs[0]);
    let name = f.fresh_name(&format!("{}_resharded", f.tensor(x).name));
    let (mid, se) = insert_before(f, e, &name, ExprKind::Set, &[x], f.tensor(y).mesh, x)?;
    f.expr_mut(e).inputs = vec![mid];
    ensure_communication(f, se)
}

/// The materialized axis of `t` that its `pt` loop axis splits, if any.
fn sharded_position(f: &Fusion, t: TensorId, pt: ParallelType) -> Option<usize> {
    let id = parallel_axis(f, &f.tensor(t).loop_domain, pt)?;
    let logical = ancestor(f, id, &f.tensor(t).logical)?;
    f.visible_axes(t).iter().position(|a| *a == logical)
}

/// Step 3 for a `y = set(x)` on one mesh whose DIDx and DIDy shardings both change (a 2-D
/// mesh): a chain of sets, each changing one device type, is inserted before it. Each step
/// takes one changing type to `y`'s sharding while keeping `x`'s others, unless `y` splits
/// that type on an axis that `x` splits by another type; when every changing type clashes
/// like that, the step gathers one type instead (e.g. swapping the DIDx and DIDy axes:
/// Allgather over DIDx, AllToAll over DIDy, then the DIDx split of the replicated axis).
fn one_change_per_set(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    let y = f.expr(e).outputs[0];
    for _ in 0..2 * DEVICE_TYPES.len() {
        let x = f.expr(e).inputs[0];
        if f.mesh_of(x) != f.mesh_of(y) {
            return Ok(());
        }
        let changes = changing_types(f, x, y);
        if changes.len() < 2 {
            return Ok(());
        }
        let clashes = |f: &Fusion, pt: ParallelType| {
            let Some(at) = sharded_position(f, y, pt) else {
                return false;
            };
            DEVICE_TYPES
                .into_iter()
                .filter(|o| *o != pt)
                .any(|o| sharded_position(f, x, o) == Some(at))
        };
        // Gathering needs a split of `x` to gather; a clash means `x` has one.
        let gatherable =
            |pt: &&ParallelType| parallel_axis(f, &f.tensor(x).loop_domain, **pt).is_some();
        let (pt, take) = match changes.iter().find(|pt| !clashes(f, **pt)) {
            Some(pt) => (*pt, true),
            None => match changes.iter().find(gatherable) {
                Some(pt) => (*pt, false),
                None => return Ok(()),
            },
        };
        let name = f.fresh_name(&format!("{}_resharded", f.tensor(x).name));
        let (mid, se) = insert_before(f, e, &name, ExprKind::Set, &[x], f.tensor(y).mesh, x)?;
        let keep: Vec<ParallelType> = DEVICE_AND_STREAM_TYPES
            .into_iter()
            .filter(|t| *t != pt)
            .collect();
        let graph = IdGraph::build(f);
        replay(f, x, mid, &graph, &keep)?;
        if take {
            replay(f, y, mid, &graph, &[pt])?;
        }
        f.expr_mut(e).inputs = vec![mid];
        derive_communication(f, se)?;
    }
    Ok(())
}

/// Step 3 for a reduction `out = op(x)` on one mesh over a device-sharded axis that also
/// changes the sharding of other axes (e.g. `x`'s DIDy split `[d, ..]` against `out`'s
/// `[s, d, ..]`): `<out>_reduced = op(x)` reduces over the devices keeping `x`'s sharding of
/// the other axes (an Allreduce, Reduce or ReduceScatter), then `out = set(<out>_reduced)`
/// makes the other changes (one set per change, a layout change as a gather and a scatter).
/// `Err(None)` when `out` is on another mesh or the reduction over devices alone is no
/// communication either: the expr's own diagnostic then stands.
fn reduce_then_reshard(f: &mut Fusion, e: ExprId) -> Result<(), Option<Diagnostic>> {
    let (x, out) = (f.expr(e).inputs[0], f.expr(e).outputs[0]);
    // A reduction to another mesh keeps its own diagnostic.
    if f.mesh_of(x) != f.mesh_of(out) {
        return Err(None);
    }
    let kind = f.expr(e).kind.clone();
    let name = f.fresh_name(&format!("{}_reduced", f.tensor(out).name));
    let (mid, me) =
        insert_before(f, e, &name, kind, &[x], f.tensor(out).mesh, out).map_err(Some)?;
    let graph = IdGraph::build(f);
    replay(f, x, mid, &graph, &DEVICE_AND_STREAM_TYPES).map_err(Some)?;
    // The pass works on a copy: a failure leaves the user's fusion as it was.
    if !is_resharding(f, me) || derive_communication(f, me).is_err() {
        return Err(None);
    }
    make_set_of(f, e, mid);
    one_change_per_set(f, e).map_err(Some)?;
    ensure_communication(f, e).map_err(Some)
}

/// Step 3: sets before the operands of a resharding expr that is not a communication.
pub(super) fn insert_resharding_sets(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    if !is_resharding(f, e) {
        return Ok(());
    }
    let kind = f.expr(e).kind.clone();
    match kind {
        ExprKind::Set | ExprKind::SegmentSet => {
            if copies_onto_another_mesh_in_two(f, e) {
                replicate_on_the_receivers(f, e)?;
            }
            one_change_per_set(f, e)?;
            return ensure_communication(f, e);
        }
        ExprKind::Squeeze { .. } => {
            return ensure_communication(f, e);
        }
        ExprKind::Reduction { .. } => match derive_communication(f, e) {
            Ok(_) => return Ok(()),
            Err(d) if reduces_device_axis(f, e) => {
                return reduce_then_reshard(f, e).map_err(|other| other.unwrap_or(d));
            }
            Err(_) => {}
        },
        ExprKind::Reshape { .. } => {
            // Copies of the operand sharded like the output, when the output's device splits
            // map onto the operand as blocks of its axes; on a copy of the fusion first, so
            // that a failure leaves nothing behind.
            let mut trial = f.clone();
            if copy_operands_like_the_output(&mut trial, e).is_ok() {
                *f = trial;
                return Ok(());
            }
            return reshape_then_reshard(f, e);
        }
        _ => {}
    }
    copy_operands_like_the_output(f, e)
}

/// Step 3 for a `reshape` whose output is split across devices where its operand has no
/// block to match (a split of the merge `b * t` whose factor does not divide `b`, or of the
/// inner axis `t` that a reshape splits out of `b * t`): `<out>_reshaped = reshape(x)` keeps
/// the operand's sharding (its splits that map across the reshape as blocks; the others are
/// gathered first by copies of `x`), and the reshape becomes `out = set(<out>_reshaped)`,
/// which splits the reshaped tensor across the devices (a Scatter, per stream chunk when
/// `out` is stream-split).
fn reshape_then_reshard(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    let (x, out) = (f.expr(e).inputs[0], f.expr(e).outputs[0]);
    let kind = f.expr(e).kind.clone();
    let name = f.fresh_name(&format!("{}_reshaped", f.tensor(out).name));
    let (mid, me) = insert_before(
        f,
        e,
        &name,
        kind,
        &[x],
        f.tensor(x).mesh.or(f.tensor(out).mesh),
        out,
    )?;
    let graph = IdGraph::build(f);
    replay(f, x, mid, &graph, &DEVICE_AND_STREAM_TYPES)?;
    if is_resharding(f, me) {
        copy_operands_like_the_output(f, me)?;
    }
    // `out` becomes a copy: its logical axes are its own, no longer made from a root.
    let tv = f.tensor(out).clone();
    if let Some(root) = &tv.root {
        for l in &tv.logical {
            if !root.contains(l) {
                let id = f.id_mut(*l);
                id.definition = None;
                id.rfactor = false;
            }
        }
    }
    f.tensor_mut(out).root = None;
    let ex = f.expr_mut(e);
    ex.kind = ExprKind::Set;
    ex.inputs = vec![mid];
    one_change_per_set(f, e)?;
    ensure_communication(f, e)
}

/// Step 3 for any resharding expr: `x_resharded = set(x)`, sharded like the output, before
/// each operand `x` sharded differently from it.
fn copy_operands_like_the_output(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    let out = f.expr(e).outputs[0];
    // The user's expr as written, before its operands are replaced by copies.
    let user_desc = expr_desc(f, e);
    let mut inputs = f.expr(e).inputs.clone();
    let mut seen = HashSet::new();
    inputs.retain(|x| seen.insert(*x));
    for x in inputs {
        if !have_different_shardings(f, x, DomainKind::Loop, out, DomainKind::Loop, &DEVICE_TYPES) {
            continue;
        }
        if f.tensor(out).mesh.is_none() {
            // propagate-shardings gives every tensor next to a meshed one a mesh, so only a
            // pipeline that skipped it gets here; name the user's tensors, not the copy.
            return Err(Diagnostic::new(format!(
                "{user_desc}: `{}` has no device mesh while its operand `{}` is sharded across \
                 devices; give `{}` a mesh (`mesh = …` in its schedule)",
                f.tensor(out).name,
                f.tensor(x).name,
                f.tensor(out).name
            )));
        }
        let name = f.fresh_name(&format!("{}_resharded", f.tensor(x).name));
        let (copy, se) = insert_before(f, e, &name, ExprKind::Set, &[x], f.tensor(out).mesh, x)?;
        for i in f.expr_mut(e).inputs.iter_mut() {
            if *i == x {
                *i = copy;
            }
        }
        let graph = IdGraph::build(f);
        replay(f, out, copy, &graph, &DEVICE_AND_STREAM_TYPES)?;
        one_change_per_set(f, se)?;
        ensure_communication(f, se).map_err(|d| {
            // The copy is the compiler's: name the user's tensor and expr instead.
            let copy_desc = expr_desc(f, se);
            let user = format!("the resharding of `{}` for {user_desc}", f.tensor(x).name);
            Diagnostic::new(d.message.replace(&copy_desc, &user)).or_at(f.expr(e).span)
        })?;
    }
    if is_resharding(f, e) {
        return Err(Diagnostic::new(format!(
            "decompose-reshardings could not make {user_desc} local: its operands still differ from its output in device sharding"
        )));
    }
    Ok(())
}

/// Checks that the `set` `e` is one communication; a copy that only changes how a device
/// split lays out its axis ([`is_layout_change`]), or that moves a device split to another
/// axis from or into stream chunks ([`is_nested_all_to_all`]), first becomes
/// `<in>_gathered = set(in)`,
/// replicated on the input's mesh (an allgather), and `e` then copies that (a scatter).
/// The gathered copy takes the Stream split of `e`'s output, so that gather and scatter run
/// chunk by chunk in the output's stream loop (a broadcast per chunk), or else that of the
/// input (an allgather per chunk when the input's device split sits inside its stream
/// chunks), or else none.
fn ensure_communication(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    if is_unnested_did_to_stream(f, e) {
        return gather_then_slice(f, e);
    }
    if !is_layout_change(f, e) && !is_nested_all_to_all(f, e) {
        derive_communication(f, e)?;
        return Ok(());
    }
    let (x, gathered, ge) = insert_gather(f, e)?;
    let out = f.expr(e).outputs[0];
    let unsplit = f.tensor(gathered).loop_domain.clone();
    for reference in [out, x] {
        if parallel_axis(f, &f.tensor(reference).loop_domain, ParallelType::Stream).is_none() {
            continue;
        }
        let graph = IdGraph::build(f);
        replay(f, reference, gathered, &graph, &[ParallelType::Stream])?;
        if derive_communication(f, ge).is_ok() && derive_communication(f, e).is_ok() {
            return Ok(());
        }
        f.tensor_mut(gathered).loop_domain = unsplit.clone();
    }
    derive_communication(f, ge)?;
    derive_communication(f, e)?;
    Ok(())
}

/// A DID → Stream `set` whose stream chunks and device shards neither match nor nest
/// ([`is_unnested_did_to_stream`]) becomes `<in>_gathered = set(in)`, replicated on the
/// input's mesh and not stream-split (one Allgather before the stream loop; other device
/// types keep `in`'s splits), and `e` copies the gathered tensor chunk by chunk, locally.
fn gather_then_slice(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    let (_, _, ge) = insert_gather(f, e)?;
    derive_communication(f, ge)?;
    if is_resharding(f, e) {
        derive_communication(f, e)?;
    }
    Ok(())
}

/// Inserts `<in>_gathered = set(in)` before the copy `e` (on the input's mesh, at `e`'s
/// place) and makes `e` read it; only the device types whose layout changes are gathered:
/// the others keep the input's splits, so that the gather and the scatter each change one
/// type (on a 2-D mesh). Returns the input, the gathered tensor and its `set`.
fn insert_gather(f: &mut Fusion, e: ExprId) -> IrResult<(TensorId, TensorId, ExprId)> {
    let x = f.expr(e).inputs[0];
    let changing = changing_types(f, x, f.expr(e).outputs[0]);
    let name = f.fresh_name(&format!("{}_gathered", f.tensor(x).name));
    let (gathered, ge) = insert_before(f, e, &name, ExprKind::Set, &[x], f.tensor(x).mesh, x)?;
    f.expr_mut(e).inputs = vec![gathered];
    let kept: Vec<ParallelType> = DEVICE_TYPES
        .into_iter()
        .filter(|t| !changing.contains(t))
        .collect();
    if !kept.is_empty() {
        let graph = IdGraph::build(f);
        replay(f, x, gathered, &graph, &kept)?;
    }
    Ok((x, gathered, ge))
}

/// True if an operand of the reduction `e` is device-sharded on an axis `e` reduces.
fn reduces_device_axis(f: &Fusion, e: ExprId) -> bool {
    let x = f.expr(e).inputs[0];
    let pairs = pairwise_map(f, e, x);
    DEVICE_TYPES.iter().any(|pt| {
        parallel_axis(f, &f.tensor(x).loop_domain, *pt)
            .and_then(|id| ancestor(f, id, &f.tensor(x).logical))
            .and_then(|l| pairs.iter().find(|(p, _)| *p == l).map(|(_, c)| *c))
            .is_some_and(|c| f.id(c).iter_type == IterType::Reduction)
    })
}
