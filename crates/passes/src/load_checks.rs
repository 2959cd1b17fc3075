//! Checks of the user's shardings that run when a fusion is loaded, before any pass, so that a
//! schedule the pipeline cannot lower is refused where the user wrote it (file:line:col, the
//! user's tensor names) and not from inside a pass about tensors the passes derived.
//!
//! Contract: analyses, not passes. They read a fusion whose schedules are applied (and that
//! verifies) and change nothing.
//!
//! * A `set` between two tensors that both carry the user's mesh and differ in device sharding
//!   must be a communication [`derive_communication`] names, a change of layout that
//!   decompose-reshardings splits in two ([`is_layout_change`]), or a change of both DIDx and
//!   DIDy on one mesh, which it splits into one set per type.
//!
//! * An `index_select` whose table's rows (the axis its ids index) the user split across
//!   devices needs a mesh of consecutive devices, from whose rank each device finds its block.
//!
//! * A Stream split of an axis that a `reshape` merges or splits (on either side of it, on the
//!   reshape's operands or on any tensor whose axis maps to them) is refused at the schedule
//!   step: lowering cuts a stream loop's chunks axis by axis and cannot follow them through
//!   a reshape of the chunked axis, so it would find a tensor with no axis to cut. A Stream
//!   split of an axis the reshape leaves as it is runs.
//!
//! * A communication inside a stream loop on a tensor whose Stream split cuts each device's
//!   block (`outer_split(a, d) -> DIDx; outer_split(a + 1, s) -> Stream`) is refused at the
//!   user's Stream step: every device's chunk `i` is a chunk of its own block, so no collective
//!   per chunk pairs the same elements ([`check_streams_inside_device_splits`]).
//!
//! A DID → Stream copy whose stream chunks and device shards neither match nor nest (through
//! a `set` or through another op) is not refused: decompose-reshardings gathers first
//! ([`crate::communication::is_unnested_did_to_stream`]).

use weave_ir::{
    Diagnostic, ExprKind, Fusion, IdExpr, IterDomainId, IterType, ParallelType, ScheduleOp,
    TensorId,
};
use weave_transform::id_graph::IdGraph;
use weave_transform::schedule::outer_split_root;

use crate::communication::{derive_communication, is_layout_change};
use crate::resharding::is_resharding;

/// Runs every check of the module doc; the first failure is returned with its span.
pub fn check_user_shardings(f: &Fusion) -> Result<(), Diagnostic> {
    check_user_communications(f)?;
    check_lookup_meshes(f)?;
    check_streams_through_reshapes(f)?;
    check_streams_inside_device_splits(f)
}

/// The Stream loop axis of `t` (reduction axes excluded), if any.
fn stream_axis(f: &Fusion, t: TensorId) -> Option<IterDomainId> {
    f.tensor(t).loop_domain.iter().copied().find(|l| {
        f.id(*l).parallel == ParallelType::Stream && f.id(*l).iter_type != IterType::Reduction
    })
}

/// The device type whose split of the same logical axis the Stream axis of `t` cuts the
/// inside of (stream chunks of each device's block), if it does.
fn streams_inside(f: &Fusion, t: TensorId) -> Option<(IterDomainId, ParallelType)> {
    let s = stream_axis(f, t)?;
    if !weave_transform::schedule::streams_inside_device_split(f, t, s) {
        return None;
    }
    let root = weave_transform::schedule::stream_split_root(f, t, s)?;
    let pt = f.tensor(t).loop_domain.iter().find_map(|l| {
        let d = f.id(*l);
        let cut = d
            .definition
            .is_some_and(|e| matches!(f.id_expr(e), IdExpr::Split { input, outer, .. } if *input == root && outer == l));
        (cut && d.parallel.is_device()).then_some(d.parallel)
    })?;
    Some((root, pt))
}

/// Refuses a communication inside a stream loop that involves a tensor whose Stream split cuts
/// the inside of a device split of the same axis (`outer_split(a, d) -> DIDx;
/// outer_split(a + 1, s) -> Stream`): every device's chunk `i` is a chunk of its own block,
/// so a collective posted per chunk would pair different elements on different devices, and
/// the global chunks of a tensor streamed the other way (or replicated) are not chunks of any
/// device's block. Such a copy runs whole (its output unstreamed, at top level), or with the
/// stream split first. The shardings are propagated on a copy first, so a split that
/// propagation carries onto a neighbour is seen too (the error is at the user's schedule
/// step that made the Stream split).
pub fn check_streams_inside_device_splits(f: &Fusion) -> Result<(), Diagnostic> {
    let users: Vec<TensorId> = f
        .tensors_in_order()
        .into_iter()
        .filter(|t| streams_inside(f, *t).is_some())
        .collect();
    if users.is_empty() {
        return Ok(());
    }
    let mut p = f.clone();
    if crate::propagate_shardings::propagate_shardings(&mut p).is_err() {
        // Propagation errors are the pipeline's to report.
        return Ok(());
    }
    let graph = IdGraph::build(&p);
    for &e in p.exprs() {
        if !is_resharding(&p, e) {
            continue;
        }
        let ex = p.expr(e);
        if ex.outputs.iter().all(|o| stream_axis(&p, *o).is_none()) {
            // The copy runs whole, at top level: every device sends its whole block.
            continue;
        }
        let Some((t, (root, _))) = ex
            .inputs
            .iter()
            .chain(&ex.outputs)
            .find_map(|t| streams_inside(&p, *t).map(|x| (*t, x)))
        else {
            continue;
        };
        // The user's tensor whose schedule made this split: `t` itself, or a tensor of the
        // user's whose streamed axis maps to `t`'s.
        let user = if users.contains(&t) {
            t
        } else {
            users
                .iter()
                .copied()
                .find(|u| streams_inside(f, *u).is_some_and(|(r, _)| graph.are_mapped(r, root)))
                .unwrap_or(users[0])
        };
        let (uroot, upt) = streams_inside(f, user).expect("a user tensor with the split");
        let utv = f.tensor(user);
        let ins: Vec<&str> = ex
            .inputs
            .iter()
            .map(|i| p.tensor(*i).name.as_str())
            .collect();
        let out = &p.tensor(ex.outputs[0]).name;
        return Err(stream_split_error(f, user, uroot, |k, step_text| {
            format!(
            "schedule of `{}`{step_text}: the Stream split cuts each device's block of axis {k} of `{}` (`{}`, split across {upt}), and `{out} = {}({})` changes the device sharding of `{}` inside a stream loop: a collective per chunk would pair chunk i of different blocks on different devices, which is not a chunk of the tensor. Copy it whole (no Stream split on `{out}`, so the copy runs once before or after the loop), or split the stream first and the devices inside each chunk (`outer_split({k}, s) -> Stream; outer_split({}, d) -> {upt}`)",
            utv.name,
            utv.name,
            f.id(uroot).extent.to_source(),
            ex.kind.op_name(),
            ins.join(", "),
            p.tensor(t).name,
            k + 1,
        )
        }));
    }
    Ok(())
}

/// Refuses a Stream split whose axis maps (in the exact graph of the whole fusion) to an axis
/// that a `reshape` merges or splits: an input axis it merges with another or splits, or an
/// output axis it makes so. The error is at the schedule step that made the Stream axis and
/// names the tensor, its axis and the reshape.
pub fn check_streams_through_reshapes(f: &Fusion) -> Result<(), Diagnostic> {
    let reshapes: Vec<_> = f
        .exprs()
        .iter()
        .copied()
        .filter(|e| matches!(f.expr(*e).kind, ExprKind::Reshape { .. }))
        .collect();
    let streamed: Vec<(TensorId, IterDomainId)> = f
        .tensors_in_order()
        .into_iter()
        .filter_map(|t| {
            let tv = f.tensor(t);
            let s = tv.loop_domain.iter().copied().find(|l| {
                f.id(*l).parallel == ParallelType::Stream
                    && f.id(*l).iter_type != IterType::Reduction
            })?;
            Some((t, s))
        })
        .collect();
    if reshapes.is_empty() || streamed.is_empty() {
        return Ok(());
    }
    let graph = IdGraph::build(f);
    for (t, s) in streamed {
        let Some(axis) = outer_split_root(f, t, s) else {
            continue;
        };
        for &e in &reshapes {
            let ex = f.expr(e);
            let (Some(&input), Some(&output)) = (ex.inputs.first(), ex.outputs.first()) else {
                continue;
            };
            let Some(what) = reshaped(f, output, |c| graph.are_mapped(axis, c)) else {
                continue;
            };
            let tv = f.tensor(t);
            let ExprKind::Reshape { shape } = &ex.kind else {
                continue;
            };
            let shape: Vec<String> = shape.iter().map(|x| x.to_source()).collect();
            let other = if what.1 { output } else { input };
            return Err(stream_split_error(f, t, axis, |k, step_text| {
                format!(
                "schedule of `{}`{step_text}: the Stream split cuts axis {k} of `{}` (`{}`), which `{} = reshape({}, [{}])` {}; stream chunks are not carried through a reshape of their axis (`{}` would have no axis to cut into the same chunks): stream-split an axis that the reshape leaves as it is, or leave this one unsplit",
                tv.name,
                tv.name,
                f.id(axis).extent.to_source(),
                f.tensor(output).name,
                f.tensor(input).name,
                shape.join(", "),
                what.0,
                f.tensor(other).name,
            )
            }));
        }
    }
    Ok(())
}

/// An error about `t`'s Stream split of `axis`: `message` gets the place of `axis` among
/// `t`'s visible axes (0 if not there) and the schedule step that makes the split as
/// `": step"` (empty if none); the error is at that step, else at `t`.
fn stream_split_error(
    f: &Fusion,
    t: TensorId,
    axis: IterDomainId,
    message: impl FnOnce(usize, &str) -> String,
) -> Diagnostic {
    let tv = f.tensor(t);
    let k = f
        .visible_axes(t)
        .iter()
        .position(|a| *a == axis)
        .unwrap_or(0);
    let step = tv.schedule.iter().find(|st| makes_stream(&st.op));
    let step_text = step
        .map(|st| format!(": {}", weave_transform::schedule::step_text(&st.op)))
        .unwrap_or_default();
    Diagnostic::new(message(k, &step_text))
        .or_at(step.and_then(|st| st.span))
        .or_at(tv.span)
}

/// Whether a schedule step makes a Stream axis.
fn makes_stream(op: &ScheduleOp) -> bool {
    match op {
        ScheduleOp::OuterSplit { parallel, .. } | ScheduleOp::InnerSplit { parallel, .. } => {
            *parallel == Some(ParallelType::Stream)
        }
        ScheduleOp::Parallelize { parallel, .. } => *parallel == ParallelType::Stream,
        _ => false,
    }
}

/// What `output = reshape(..)` does to the first of its changed axes that `hit`
/// accepts: an input axis it merges or splits (the words, and `true`: the input side), or an
/// output axis it makes (`false`: the output side).
fn reshaped(
    f: &Fusion,
    output: TensorId,
    hit: impl Fn(IterDomainId) -> bool,
) -> Option<(String, bool)> {
    let out = f.tensor(output);
    let root = out.root.as_ref()?;
    let src = |i: IterDomainId| format!("`{}`", f.id(i).extent.to_source());
    let made: Vec<IterDomainId> = out
        .logical
        .iter()
        .copied()
        .filter(|l| !root.contains(l))
        .collect();
    for &c in root {
        if out.logical.contains(&c) || !hit(c) {
            continue;
        }
        let by = made
            .iter()
            .filter_map(|m| f.id(*m).definition.map(|d| f.id_expr(d)))
            .find(|d| d.inputs().contains(&c));
        let words = match by {
            Some(IdExpr::Merge {
                outer,
                inner,
                output,
            }) => {
                let with = if *outer == c { *inner } else { *outer };
                format!("merges with {} into {}", src(with), src(*output))
            }
            Some(IdExpr::Split { outer, inner, .. }) => {
                format!("splits into {} and {}", src(*outer), src(*inner))
            }
            None => "reshapes".to_string(),
        };
        return Some((words, true));
    }
    for m in made {
        if !hit(m) {
            continue;
        }
        let words = match f.id(m).definition.map(|d| f.id_expr(d)) {
            Some(IdExpr::Merge { outer, inner, .. }) => {
                format!("makes by merging {} and {}", src(*outer), src(*inner))
            }
            Some(IdExpr::Split { input, .. }) => format!("makes by splitting {}", src(*input)),
            None => "makes".to_string(),
        };
        return Some((words, false));
    }
    None
}

/// Checks every `index_select` whose table the user split across devices on the rows the ids
/// index: the table's mesh must list consecutive devices, from whose rank each device finds
/// the first row of its block
/// (`decompose_reshardings::scattered_mesh`). The error is at the op.
pub fn check_lookup_meshes(f: &Fusion) -> Result<(), Diagnostic> {
    for &e in f.exprs() {
        let ex = f.expr(e);
        let ExprKind::IndexSelect { axis, .. } = ex.kind else {
            continue;
        };
        let Some(&table) = ex.inputs.first() else {
            continue;
        };
        let Some(&rows) = f.visible_axes(table).get(axis) else {
            continue;
        };
        let split = f.tensor(table).loop_domain.iter().any(|l| {
            f.id(*l).parallel.is_device()
                && (*l == rows
                    || f.id(*l).definition.is_some_and(
                        |d| matches!(f.id_expr(d), IdExpr::Split { input, .. } if *input == rows),
                    ))
        });
        let Some(mesh) = f.mesh_of(table).filter(|_| split) else {
            continue;
        };
        if let Some(d) = crate::decompose_reshardings::scattered_mesh(&f.tensor(table).name, mesh) {
            return Err(d.or_at(ex.span));
        }
    }
    Ok(())
}

/// Checks every `set` whose input and output both carry the user's mesh and that changes the
/// device sharding: it must be a communication [`derive_communication`] names, a change of
/// layout that decompose-reshardings splits in two ([`is_layout_change`]), or a change of
/// both device types on one mesh, which it splits into one set per type. The error is at
/// the `set`.
pub fn check_user_communications(f: &Fusion) -> Result<(), Diagnostic> {
    for &e in f.exprs() {
        let ex = f.expr(e);
        if !matches!(ex.kind, ExprKind::Set | ExprKind::SegmentSet)
            || ex.inputs.len() != 1
            || ex.outputs.len() != 1
            || ex
                .inputs
                .iter()
                .chain(&ex.outputs)
                .any(|t| f.mesh_of(*t).is_none())
        {
            continue;
        }
        if is_resharding(f, e)
            && !is_layout_change(f, e)
            && !crate::communication::is_nested_all_to_all(f, e)
            && !crate::communication::is_unnested_did_to_stream(f, e)
            && !crate::decompose_reshardings::changes_several_device_types(f, e)
            && !crate::decompose_reshardings::copies_onto_another_mesh_in_two(f, e)
        {
            derive_communication(f, e)?;
        }
    }
    Ok(())
}
