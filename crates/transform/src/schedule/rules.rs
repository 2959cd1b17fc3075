//! The rules for device (`DIDx`, `DIDy`) and `Stream` axes that
//! [`parallelize`](super::parallelize) and the schedule steps check: where such an axis may
//! come from, its mesh and extent, and one axis per parallel type.

use weave_ir::{
    Diagnostic, Fusion, IdExpr, IrResult, IterDomainId, IterType, ParallelType, SplitKind, TensorId,
};

use super::{prefix, walk_splits, SplitsEnd};

/// Where a device or stream axis comes from.
#[derive(Clone, Copy)]
pub(super) enum Origin {
    /// An unsplit logical axis.
    Logical,
    /// The outer output of an outer split of the given input.
    OuterSplit(IterDomainId),
}

pub(super) fn check_origin(
    f: &Fusion,
    t: TensorId,
    id: IterDomainId,
    axis: usize,
    step: &str,
) -> IrResult<Origin> {
    if f.tensor(t).logical.contains(&id) {
        return Ok(Origin::Logical);
    }
    let what = match f.id(id).definition.map(|e| f.id_expr(e)) {
        None => return Ok(Origin::Logical),
        Some(IdExpr::Split {
            input,
            outer,
            kind: SplitKind::Outer,
            ..
        }) if *outer == id => return Ok(Origin::OuterSplit(*input)),
        Some(IdExpr::Split { outer, kind, .. }) => format!(
            "the {} output of an {} split",
            if *outer == id { "outer" } else { "inner" },
            if *kind == SplitKind::Outer {
                "outer"
            } else {
                "inner"
            }
        ),
        Some(IdExpr::Merge { .. }) => "the output of a merge".to_string(),
    };
    Err(Diagnostic::new(format!(
        "{}: {step}: axis {axis} is {what}; device and stream axes must be an unsplit logical axis or the outer output of an outer split",
        prefix(f, t)
    )))
}

/// Mesh, extent and divisibility checks for a device axis.
pub(super) fn check_device_axis(
    f: &Fusion,
    t: TensorId,
    axis: usize,
    id: IterDomainId,
    origin: Origin,
    pt: ParallelType,
) -> IrResult<()> {
    let p = prefix(f, t);
    let what = match origin {
        Origin::Logical => "axis",
        Origin::OuterSplit(_) => "split",
    };
    let Some(mesh_id) = f.tensor(t).mesh else {
        return Err(Diagnostic::new(format!(
            "{p}: {pt} {what} needs a device mesh (declare the tensor `on m` or add `mesh = m`)"
        )));
    };
    let decl = f.mesh(mesh_id);
    let Some(size) = decl.mesh.size_of(pt) else {
        return Err(Diagnostic::new(format!(
            "{p}: {pt} {what}, but mesh `{}` has shape {:?} and no {pt} axis",
            decl.name,
            decl.mesh.shape()
        )));
    };
    let extent = &f.id(id).extent;
    if let Some(v) = f.eval(extent).filter(|v| *v != size as i64) {
        let found = match origin {
            Origin::OuterSplit(_) => format!("{pt} split factor `{}` = {v}", extent.to_source()),
            Origin::Logical => format!("axis {axis} has extent {v} (`{}`)", extent.to_source()),
        };
        return Err(Diagnostic::new(format!(
            "{p}: {found}, but mesh `{}` has {size} devices along {pt}",
            decl.name
        )));
    }
    if let Origin::OuterSplit(input) = origin {
        let in_extent = &f.id(input).extent;
        if let Some(v) = f.eval(in_extent) {
            if v % size as i64 != 0 {
                return Err(Diagnostic::new(format!(
                    "{p}: axis {axis} has extent {v} (`{}`), not divisible by {size} devices ({pt})",
                    in_extent.to_source()
                )));
            }
        }
        // A chunk of a longer axis (the inner output of a split, e.g. a stream chunk)
        // is as long as `in_extent` except at the end of an axis that the chunks do not
        // cut evenly; every device must hold an equal piece of that last chunk too.
        let mut cur = input;
        while let Some(IdExpr::Split {
            input: whole,
            inner,
            ..
        }) = f.id(cur).definition.map(|e| f.id_expr(e))
        {
            if *inner == cur {
                let whole_extent = &f.id(*whole).extent;
                if let (Some(v), Some(e)) = (f.eval(in_extent), f.eval(whole_extent)) {
                    if e % size as i64 != 0 {
                        return Err(Diagnostic::new(format!(
                            "{p}: axis {axis} (`{}` = {v}) is a chunk of an axis of extent {e} (`{}`) whose last chunk is shorter; a {pt} split of every chunk needs {e} divisible by {size} devices too",
                            in_extent.to_source(),
                            whole_extent.to_source()
                        )));
                    }
                }
            }
            cur = *whole;
        }
    }
    Ok(())
}

/// At most one axis per device/stream type among the iteration axes, and one among the
/// reduction axes.
pub(super) fn check_unique(
    f: &Fusion,
    t: TensorId,
    ids: &[IterDomainId],
    axis: usize,
    pt: ParallelType,
    step: &str,
) -> IrResult<()> {
    let is_red = |id: IterDomainId| f.id(id).iter_type == IterType::Reduction;
    let mine = is_red(ids[axis]);
    for (k, other) in ids.iter().enumerate() {
        if k != axis && f.id(*other).parallel == pt && is_red(*other) == mine {
            return Err(Diagnostic::new(format!(
                "{}: {step}: loop axis {k} is already {pt}; a loop domain has at most one {pt} axis",
                prefix(f, t)
            )));
        }
    }
    Ok(())
}

/// Refuses a Stream axis cut from inside another split of the same logical axis, or from a
/// merge:
///
/// * inside a device split that is itself nested in another split of the axis (or a Stream
///   split of the device axis itself). Stream chunks of a device split of the logical axis
///   (`outer_split(0, d) -> DIDx; outer_split(1, s) -> Stream`) are admitted: each device
///   streams over its own block, and load refuses the copies inside a loop that would pair
///   such chunks (weave-passes' `load_checks`);
/// * inside a Serial split (`outer_split(0, k); outer_split(1, s) -> Stream`): stream chunks of
///   serial chunks, which the host loop cannot cut from one axis. The order that works puts the
///   serial split inside each stream chunk;
/// * a split of a merge (`merge(0, 1); outer_split(0, s) -> Stream`): a chunk of the merged
///   axis is not a block of either logical axis.
pub(super) fn check_stream_origin(
    f: &Fusion,
    t: TensorId,
    axis: usize,
    step: &str,
) -> IrResult<()> {
    let merged = (
        "is a split of",
        "Stream chunk of a merged axis is not a block of one axis; stream-split one axis before merging (`outer_split(a, s) -> Stream` on the outer axis of the merge, then merge what is left if needed)".to_string(),
    );
    walk_to_logical(f, t, axis, step, merged, |cur, input, outer, inner| {
        let inside = if inner == cur {
            Some(f.id(outer).parallel)
        } else if f.id(input).parallel.is_device() {
            Some(f.id(input).parallel)
        } else {
            None
        };
        // Stream chunks of each device's block: the inner output of a device split of the
        // logical axis itself (`outer_split(a, d) -> DIDx; outer_split(a + 1, s) -> Stream`).
        // Each device streams over its own local block, cut like any other local axis.
        if inner == cur && f.id(outer).parallel.is_device() && f.tensor(t).logical.contains(&input)
        {
            return Ok(());
        }
        if let Some(pt) = inside {
            if pt.is_device() {
                return Err(Diagnostic::new(format!(
                    "{}: {step}: the Stream split cuts the inside of a {pt} split of the same axis, so each device would stream over its own block; split the stream first and the devices inside each chunk (`outer_split(a, s) -> Stream; outer_split(a + 1, d) -> {pt}`)",
                    prefix(f, t)
                )));
            }
            return Err(Diagnostic::new(format!(
                "{}: {step}: the Stream split cuts the inside of a {pt} split of the same axis (stream chunks of {pt} chunks), which no stream loop cuts from one axis; split the stream first and the {pt} chunks inside each stream chunk (`outer_split(a, s) -> Stream; outer_split(a + 1, k)`)",
                prefix(f, t)
            )));
        }
        Ok(())
    })
}

/// Walks from loop axis `axis` of `t` up through the splits that made it to its logical
/// domain: `Ok` on reaching a logical axis or an axis nothing defines. At a split of `input`
/// into `outer` and `inner` that made `cur`, `split(cur, input, outer, inner)` may refuse it
/// before the walk goes on to `input`. An axis made by a merge is refused at `step`: the
/// loop axis `relation` the merged axis, and `consequence` says what goes wrong.
fn walk_to_logical(
    f: &Fusion,
    t: TensorId,
    axis: usize,
    step: &str,
    (relation, consequence): (&str, String),
    split: impl Fn(IterDomainId, IterDomainId, IterDomainId, IterDomainId) -> IrResult<()>,
) -> IrResult<()> {
    let from = f.tensor(t).loop_domain[axis];
    let logical = |id| f.tensor(t).logical.contains(&id);
    match walk_splits(f, from, logical, split)? {
        SplitsEnd::Merge {
            output,
            outer,
            inner,
        } => Err(Diagnostic::new(format!(
            "{}: {step}: loop axis {axis} {relation} `{}`, a merge of two axes (`{}` and `{}`), and a {consequence}",
            prefix(f, t),
            f.id(output).extent.to_source(),
            f.id(outer).extent.to_source(),
            f.id(inner).extent.to_source()
        ))),
        SplitsEnd::Stop(_) | SplitsEnd::Undefined(_) => Ok(()),
    }
}

/// Refuses a device axis that derives from a merge (`merge(0, 1); outer_split(0, d) -> DIDx`):
/// the shard of each device would be a block of the merged axis, which is not a block of
/// either logical axis, so its allocation cannot hold the shard as a tensor of the logical
/// axes and no collective moves it.
pub(super) fn check_device_origin(
    f: &Fusion,
    t: TensorId,
    axis: usize,
    pt: ParallelType,
    step: &str,
) -> IrResult<()> {
    let merged = (
        "derives from",
        format!("{pt} shard of a merged axis is not a block of one axis, which no allocation or collective holds; split one axis across the devices before merging (`outer_split(a, d) -> {pt}` on the outer axis of the merge: the same shards when it divides by d), then merge what is left if needed"),
    );
    walk_to_logical(f, t, axis, step, merged, |_, _, _, _| Ok(()))
}
