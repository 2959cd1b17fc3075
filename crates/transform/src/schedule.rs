//! Schedules: split, merge, reorder and parallelize on a tensor's loop or allocation domain,
//! and [`apply_schedules`], which gives the `.weave` schedule recipe its meaning
//! (docs/fusion-format.md §Schedules).
//!
//! Splits and merges go through `Fusion::split_id` / `Fusion::merge_ids`, so extents stay
//! symbolic (`ceilDiv(t, s)`) and every derived axis records how it came from the logical
//! domain. Factors are kept as written; they must still evaluate to a positive constant with
//! the current parameter values, because chunk counts are fixed when a fusion is loaded.
//!
//! Rules for device (`DIDx`, `DIDy`) and `Stream` axes, checked by [`parallelize`]:
//!
//! * the axis is an unsplit logical axis or the **outer** output of an **outer** split
//!   (nvFuser's "valid device split");
//! * a device axis needs a mesh with an axis for that parallel type; its extent (the split
//!   factor) must equal the mesh size along it, and the split input must be divisible by it
//!   when its extent is known. Stream splits may leave a ragged last chunk (`ceilDiv`);
//! * a loop domain holds each of these parallel types at most once among its iteration axes
//!   and at most once among its reduction axes (an `rDIDx` partial-sum axis may sit beside an
//!   `iDIDx` axis, as after a reduce-scatter).
//!
//! Splitting or merging an axis that is already device- or stream-parallel is an error:
//! parallelize after the split that produces the axis.

use weave_ir::{
    Diagnostic, Fusion, IdExpr, IrResult, IterDomainId, IterType, ParallelType, ReorderError,
    Scalar, ScheduleOp, ScheduleStep, SplitKind, TensorId,
};

/// Which domain of a tensor a schedule primitive rewrites.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DomainKind {
    /// The loop domain (where DID and Stream axes live).
    Loop,
    /// The allocation domain (memory layout); starts from the logical domain when unset.
    Allocation,
}

impl DomainKind {
    fn label(self) -> &'static str {
        match self {
            DomainKind::Loop => "loop domain",
            DomainKind::Allocation => "allocation domain",
        }
    }
}

fn prefix(f: &Fusion, t: TensorId) -> String {
    format!("schedule of `{}`", f.tensor(t).name)
}

/// `3 axes (0..2)`, `1 axis (0..0)`, `0 axes`.
fn axes_text(n: usize) -> String {
    match n {
        0 => "0 axes".to_string(),
        1 => "1 axis (0..0)".to_string(),
        _ => format!("{n} axes (0..{})", n - 1),
    }
}

fn domain(f: &Fusion, t: TensorId, dom: DomainKind) -> Vec<IterDomainId> {
    let tv = f.tensor(t);
    match dom {
        DomainKind::Loop => tv.loop_domain.clone(),
        DomainKind::Allocation => tv.allocation_domain().to_vec(),
    }
}

fn store(f: &mut Fusion, t: TensorId, dom: DomainKind, ids: Vec<IterDomainId>) {
    let tv = f.tensor_mut(t);
    match dom {
        DomainKind::Loop => tv.loop_domain = ids,
        DomainKind::Allocation => tv.allocation = Some(ids),
    }
}

fn out_of_range(f: &Fusion, t: TensorId, dom: DomainKind, what: &str, n: usize) -> Diagnostic {
    Diagnostic::new(format!(
        "{}: {what}, but the {} has {}",
        prefix(f, t),
        dom.label(),
        axes_text(n)
    ))
}

/// The value of a split factor, which must be a positive constant under the current
/// parameter values.
fn factor_value(f: &Fusion, t: TensorId, factor: &Scalar) -> IrResult<i64> {
    let src = factor.to_source();
    match f.eval(factor) {
        None => Err(Diagnostic::new(format!(
            "{}: split factor `{src}` has no value",
            prefix(f, t)
        ))),
        Some(v) if v <= 0 => Err(Diagnostic::new(format!(
            "{}: split factor `{src}` = {v} must be positive",
            prefix(f, t)
        ))),
        Some(v) => Ok(v),
    }
}

fn split_name(kind: SplitKind) -> &'static str {
    match kind {
        SplitKind::Outer => "outer_split",
        SplitKind::Inner => "inner_split",
    }
}

/// Splits axis `axis` of `t`'s `dom` domain by the value of `factor`, which must evaluate to
/// a positive constant (`[factor, ceilDiv(e, factor)]` for
/// an outer split, `[ceilDiv(e, factor), factor]` for an inner one). Both outputs are
/// serial; returns `(outer, inner)`, which take the axis' place. For
/// [`DomainKind::Allocation`] the split starts from the allocation domain (the logical one
/// when unset) and stores the result as the tensor's allocation domain.
pub fn split(
    f: &mut Fusion,
    t: TensorId,
    dom: DomainKind,
    axis: usize,
    factor: Scalar,
    kind: SplitKind,
) -> IrResult<(IterDomainId, IterDomainId)> {
    let mut ids = domain(f, t, dom);
    let op = split_name(kind);
    if axis >= ids.len() {
        return Err(out_of_range(
            f,
            t,
            dom,
            &format!("{op} of axis {axis}"),
            ids.len(),
        ));
    }
    // Split factors are constants in the IR (chunk and device counts are known when the
    // schedule is applied); the recipe keeps the expression as written for the printer.
    let factor = Scalar::c(factor_value(f, t, &factor)?);
    let id = ids[axis];
    let p = f.id(id).parallel;
    if p != ParallelType::Serial {
        return Err(Diagnostic::new(format!(
            "{}: {op} of axis {axis}, which is already parallelized as {p} (split before parallelizing)",
            prefix(f, t)
        )));
    }
    let (o, i) = f.split_id(id, factor, kind);
    ids.splice(axis..=axis, [o, i]);
    store(f, t, dom, ids);
    Ok((o, i))
}

/// Merges axes `outer` and `inner` (which must be `outer + 1`) of `t`'s `dom` domain into
/// one axis at `outer`'s position and returns it. A reduction axis cannot be merged with an
/// iteration axis, and device or stream axes cannot be merged at all.
pub fn merge(
    f: &mut Fusion,
    t: TensorId,
    dom: DomainKind,
    outer: usize,
    inner: usize,
) -> IrResult<IterDomainId> {
    let mut ids = domain(f, t, dom);
    let step = format!("merge({outer}, {inner})");
    if outer >= ids.len() || inner >= ids.len() {
        return Err(out_of_range(f, t, dom, &step, ids.len()));
    }
    if inner != outer + 1 {
        return Err(Diagnostic::new(format!(
            "{}: {step}: the inner axis must be the outer axis + 1",
            prefix(f, t)
        )));
    }
    let (o, i) = (f.id(ids[outer]), f.id(ids[inner]));
    for (axis, d) in [(outer, o), (inner, i)] {
        if d.parallel != ParallelType::Serial {
            return Err(Diagnostic::new(format!(
                "{}: {step}: axis {axis} is parallelized as {}; device and stream axes cannot be merged",
                prefix(f, t),
                d.parallel
            )));
        }
    }
    let is_red = |d: &weave_ir::IterDomain| d.iter_type == IterType::Reduction;
    let is_iter = |d: &weave_ir::IterDomain| d.iter_type == IterType::Iteration;
    if (is_red(o) && is_iter(i)) || (is_iter(o) && is_red(i)) {
        let kind = |d: &weave_ir::IterDomain| {
            if is_red(d) {
                "reduction"
            } else {
                "iteration"
            }
        };
        return Err(Diagnostic::new(format!(
            "{}: {step}: cannot merge {} axis {outer} with {} axis {inner}",
            prefix(f, t),
            kind(o),
            kind(i)
        )));
    }
    let m = f.merge_ids(ids[outer], ids[inner]);
    ids.splice(outer..=inner, [m]);
    store(f, t, dom, ids);
    Ok(m)
}

/// Moves axis `from` to position `to` for every `(from, to)` of `moves`; the axes not named
/// keep their relative order in the remaining positions (nvFuser's `reorder`). The sources
/// and the destinations must each be distinct and in range.
pub fn reorder(
    f: &mut Fusion,
    t: TensorId,
    dom: DomainKind,
    moves: &[(usize, usize)],
) -> IrResult<()> {
    let ids = domain(f, t, dom);
    let n = ids.len();
    let list: Vec<String> = moves.iter().map(|(a, b)| format!("{a} -> {b}")).collect();
    let step = format!("reorder({})", list.join(", "));
    let err = |msg: String| Diagnostic::new(format!("{}: {step}: {msg}", prefix(f, t)));
    let new = weave_ir::reordered(&ids, moves).map_err(|e| {
        err(match e {
            ReorderError::OutOfRange { what, index } => format!(
                "{what} {index} is out of range, the {} has {}",
                dom.label(),
                axes_text(n)
            ),
            ReorderError::MovedTwice(a) => format!("axis {a} is moved twice"),
            ReorderError::SamePosition(p) => format!("two axes are moved to position {p}"),
        })
    })?;
    store(f, t, dom, new);
    Ok(())
}

/// Sets the parallel type of loop axis `axis` of `t`, checking the rules of the module doc
/// for device and stream types. `Serial` always succeeds (it unparallelizes).
pub fn parallelize(f: &mut Fusion, t: TensorId, axis: usize, pt: ParallelType) -> IrResult<()> {
    parallelize_step(f, t, axis, pt, &format!("parallelize({axis}, {pt})"))
}

/// [`parallelize`], naming `step` in errors about where the axis comes from.
fn parallelize_step(
    f: &mut Fusion,
    t: TensorId,
    axis: usize,
    pt: ParallelType,
    step: &str,
) -> IrResult<()> {
    let ids = f.tensor(t).loop_domain.clone();
    if axis >= ids.len() {
        return Err(out_of_range(
            f,
            t,
            DomainKind::Loop,
            &format!("parallelize of axis {axis}"),
            ids.len(),
        ));
    }
    let id = ids[axis];
    if pt == ParallelType::Stream && f.id(id).iter_type == IterType::Reduction {
        // Each chunk would hold a partial reduction, and nothing adds the chunks up.
        return Err(Diagnostic::new(format!(
            "{}: {step}: loop axis {axis} is a reduction axis, which cannot be stream-parallel \
             (the chunks' partial results would need adding up); stream-split an iteration axis",
            prefix(f, t)
        )));
    }
    if pt.is_device_or_stream() {
        let origin = check_origin(f, t, id, axis, step)?;
        if pt.is_device() {
            check_device_axis(f, t, axis, id, origin, pt)?;
        }
        check_unique(f, t, &ids, axis, pt, step)?;
    }
    f.id_mut(id).parallel = pt;
    Ok(())
}

/// `swizzle1d(axis, DIDx)` (nvFuser's `Swizzle1D`): a stream loop over loop axis `axis`
/// visits chunk `(i + deviceIdx.x) % extent` in iteration `i`. The rotation is by the rank, so
/// the tensor needs a 1-D mesh of devices `0..n` (`devices(n)`) and the axis one chunk per
/// device (extent `n`); the axis must be one that can become a Stream axis.
fn swizzle1d(
    f: &mut Fusion,
    t: TensorId,
    axis: usize,
    pt: ParallelType,
    step: &str,
) -> IrResult<()> {
    let p = prefix(f, t);
    if pt != ParallelType::DIDx {
        return Err(Diagnostic::new(format!(
            "{p}: {step}: only DIDx can rotate a stream axis (the chunks are rotated by the device index of a 1-D mesh)"
        )));
    }
    let ids = f.tensor(t).loop_domain.clone();
    if axis >= ids.len() {
        return Err(out_of_range(
            f,
            t,
            DomainKind::Loop,
            &format!("swizzle1d of axis {axis}"),
            ids.len(),
        ));
    }
    let id = ids[axis];
    check_origin(f, t, id, axis, step)?;
    let Some(mesh_id) = f.tensor(t).mesh else {
        return Err(Diagnostic::new(format!(
            "{p}: {step} needs a device mesh (declare the tensor `on m` or add `mesh = m` before it)"
        )));
    };
    let decl = f.mesh(mesh_id);
    let n = decl.mesh.size();
    let ranks: Vec<i64> = (0..n as i64).collect();
    if decl.mesh.shape().len() != 1 || decl.mesh.devices() != ranks.as_slice() {
        return Err(Diagnostic::new(format!(
            "{p}: {step} needs a 1-D mesh of devices 0..n (`devices(n)`), but mesh `{}` is {:?} with shape {:?}",
            decl.name,
            decl.mesh.devices(),
            decl.mesh.shape()
        )));
    }
    let extent = f.id(id).extent.clone();
    if f.eval(&extent) != Some(n as i64) {
        return Err(Diagnostic::new(format!(
            "{p}: {step}: axis {axis} has extent `{}`, but the rotation needs one chunk per device of mesh `{}` ({n})",
            extent.to_source(),
            decl.name
        )));
    }
    f.id_mut(id).swizzle = Some(pt);
    Ok(())
}

/// Where a device or stream axis comes from.
#[derive(Clone, Copy)]
enum Origin {
    /// An unsplit logical axis.
    Logical,
    /// The outer output of an outer split of the given input.
    OuterSplit(IterDomainId),
}

fn check_origin(
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
fn check_device_axis(
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
    match origin {
        Origin::OuterSplit(input) => {
            if let Some(v) = f.eval(extent) {
                if v != size as i64 {
                    return Err(Diagnostic::new(format!(
                        "{p}: {pt} split factor `{}` = {v}, but mesh `{}` has {size} devices along {pt}",
                        extent.to_source(),
                        decl.name
                    )));
                }
            }
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
        Origin::Logical => {
            if let Some(v) = f.eval(extent) {
                if v != size as i64 {
                    return Err(Diagnostic::new(format!(
                        "{p}: axis {axis} has extent {v} (`{}`), but mesh `{}` has {size} devices along {pt}",
                        extent.to_source(),
                        decl.name
                    )));
                }
            }
        }
    }
    Ok(())
}

/// At most one axis per device/stream type among the iteration axes, and one among the
/// reduction axes.
fn check_unique(
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

/// `allocation = loop`: the allocation domain becomes (a copy of) the current loop domain.
pub fn set_allocation_as_loop(f: &mut Fusion, t: TensorId) {
    let tv = f.tensor_mut(t);
    tv.allocation = Some(tv.loop_domain.clone());
}

/// Applies every tensor's recorded schedule (`TensorView::schedule`) to its loop domain, in
/// [`Fusion::tensors_in_order`] order and step order. Call it once, right after building or
/// parsing: the loop domains are expected to still equal the logical ones. Errors name the
/// tensor and axis and carry the span of the failing step.
pub fn apply_schedules(f: &mut Fusion) -> IrResult<()> {
    for t in f.tensors_in_order() {
        let steps = f.tensor(t).schedule.clone();
        for step in &steps {
            apply_step(f, t, step).map_err(|d| d.or_at(step.span))?;
        }
    }
    Ok(())
}

/// The step as written in `.weave` (`outer_split(0, s) -> Stream`).
pub fn step_text(op: &ScheduleOp) -> String {
    let arrow = |p: &Option<ParallelType>| p.map(|p| format!(" -> {p}")).unwrap_or_default();
    match op {
        ScheduleOp::OuterSplit {
            axis,
            factor,
            parallel,
        } => format!(
            "outer_split({axis}, {}){}",
            factor.to_source(),
            arrow(parallel)
        ),
        ScheduleOp::InnerSplit {
            axis,
            factor,
            parallel,
        } => format!(
            "inner_split({axis}, {}){}",
            factor.to_source(),
            arrow(parallel)
        ),
        ScheduleOp::Merge { outer, inner } => format!("merge({outer}, {inner})"),
        ScheduleOp::Reorder { moves } => {
            let l: Vec<String> = moves.iter().map(|(a, b)| format!("{a} -> {b}")).collect();
            format!("reorder({})", l.join(", "))
        }
        ScheduleOp::Parallelize { axis, parallel } => format!("parallelize({axis}, {parallel})"),
        ScheduleOp::Swizzle1d { axis, parallel } => format!("swizzle1d({axis}, {parallel})"),
        ScheduleOp::AllocationAsLoop => "allocation = loop".to_string(),
        ScheduleOp::SetMesh(_) => "mesh = ...".to_string(),
        ScheduleOp::SetMemory(m) => format!("memory = {}", m.name()),
    }
}

/// The logical axis of `t` that the Stream (or any) loop axis `id` chunks: followed up
/// through outer outputs of splits, and through the inner output of a device split of the
/// logical axis itself (stream chunks of each device's block, `outer_split(a, d) -> DIDx;
/// outer_split(a + 1, s) -> Stream`, whose chunks cut the local axis of every device's
/// buffer). `None` when the chain passes through a merge or through any other inner output.
pub fn stream_split_root(f: &Fusion, t: TensorId, mut id: IterDomainId) -> Option<IterDomainId> {
    let logical = &f.tensor(t).logical;
    loop {
        if logical.contains(&id) {
            return Some(id);
        }
        match f.id(id).definition.map(|e| f.id_expr(e)) {
            Some(IdExpr::Split { input, outer, .. }) if *outer == id => id = *input,
            Some(IdExpr::Split {
                input,
                outer,
                inner,
                ..
            }) if *inner == id && f.id(*outer).parallel.is_device() && logical.contains(input) => {
                id = *input
            }
            _ => return None,
        }
    }
}

/// Whether the Stream loop axis `id` of `t` chunks each device's block of its logical axis
/// (it is cut from the inner output of a device split of that axis), and so the local axis
/// rather than the global one.
pub fn streams_inside_device_split(f: &Fusion, t: TensorId, mut id: IterDomainId) -> bool {
    let logical = &f.tensor(t).logical;
    loop {
        if logical.contains(&id) {
            return false;
        }
        match f.id(id).definition.map(|e| f.id_expr(e)) {
            Some(IdExpr::Split { input, outer, .. }) if *outer == id => id = *input,
            Some(IdExpr::Split { outer, inner, .. }) if *inner == id => {
                return f.id(*outer).parallel.is_device();
            }
            _ => return false,
        }
    }
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
fn check_stream_origin(f: &Fusion, t: TensorId, axis: usize, step: &str) -> IrResult<()> {
    let mut cur = f.tensor(t).loop_domain[axis];
    while let Some(def) = f.id(cur).definition {
        if f.tensor(t).logical.contains(&cur) {
            return Ok(());
        }
        let (input, outer, inner) = match f.id_expr(def) {
            IdExpr::Split {
                input,
                outer,
                inner,
                ..
            } => (*input, *outer, *inner),
            IdExpr::Merge { outer, inner, .. } => {
                return Err(Diagnostic::new(format!(
                    "{}: {step}: loop axis {axis} is a split of `{}`, a merge of two axes (`{}` and `{}`), and a Stream chunk of a merged axis is not a block of one axis; stream-split one axis before merging (`outer_split(a, s) -> Stream` on the outer axis of the merge, then merge what is left if needed)",
                    prefix(f, t),
                    f.id(cur).extent.to_source(),
                    f.id(*outer).extent.to_source(),
                    f.id(*inner).extent.to_source()
                )));
            }
        };
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
            cur = input;
            continue;
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
        cur = input;
    }
    Ok(())
}

/// Refuses a device axis that derives from a merge (`merge(0, 1); outer_split(0, d) -> DIDx`):
/// the shard of each device would be a block of the merged axis, which is not a block of
/// either logical axis, so its allocation cannot hold the shard as a tensor of the logical
/// axes and no collective moves it.
fn check_device_origin(
    f: &Fusion,
    t: TensorId,
    axis: usize,
    pt: ParallelType,
    step: &str,
) -> IrResult<()> {
    let mut cur = f.tensor(t).loop_domain[axis];
    while let Some(def) = f.id(cur).definition {
        if f.tensor(t).logical.contains(&cur) {
            return Ok(());
        }
        match f.id_expr(def) {
            IdExpr::Split { input, .. } => cur = *input,
            IdExpr::Merge { outer, inner, .. } => {
                return Err(Diagnostic::new(format!(
                    "{}: {step}: loop axis {axis} derives from `{}`, a merge of two axes (`{}` and `{}`), and a {pt} shard of a merged axis is not a block of one axis, which no allocation or collective holds; split one axis across the devices before merging (`outer_split(a, d) -> {pt}` on the outer axis of the merge: the same shards when it divides by d), then merge what is left if needed",
                    prefix(f, t),
                    f.id(cur).extent.to_source(),
                    f.id(*outer).extent.to_source(),
                    f.id(*inner).extent.to_source()
                )));
            }
        }
    }
    Ok(())
}

fn apply_step(f: &mut Fusion, t: TensorId, step: &ScheduleStep) -> IrResult<()> {
    match &step.op {
        ScheduleOp::OuterSplit {
            axis,
            factor,
            parallel,
        }
        | ScheduleOp::InnerSplit {
            axis,
            factor,
            parallel,
        } => {
            let kind = if matches!(step.op, ScheduleOp::OuterSplit { .. }) {
                SplitKind::Outer
            } else {
                SplitKind::Inner
            };
            let pt = parallel.unwrap_or(ParallelType::Serial);
            if kind == SplitKind::Inner && pt.is_device_or_stream() {
                return Err(Diagnostic::new(format!(
                    "{}: {}: device and stream axes must come from an outer split",
                    prefix(f, t),
                    step_text(&step.op)
                )));
            }
            split(f, t, DomainKind::Loop, *axis, factor.clone(), kind)?;
            if pt != ParallelType::Serial {
                parallelize_step(f, t, *axis, pt, &step_text(&step.op))?;
            }
            if pt == ParallelType::Stream {
                check_stream_origin(f, t, *axis, &step_text(&step.op))?;
            }
            if pt.is_device() {
                check_device_origin(f, t, *axis, pt, &step_text(&step.op))?;
            }
            Ok(())
        }
        ScheduleOp::Parallelize {
            axis,
            parallel: ParallelType::Stream,
        } => {
            parallelize(f, t, *axis, ParallelType::Stream)?;
            check_stream_origin(f, t, *axis, &step_text(&step.op))
        }
        ScheduleOp::Parallelize { axis, parallel } if parallel.is_device() => {
            parallelize(f, t, *axis, *parallel)?;
            check_device_origin(f, t, *axis, *parallel, &step_text(&step.op))
        }
        ScheduleOp::Merge { outer, inner } => {
            merge(f, t, DomainKind::Loop, *outer, *inner).map(|_| ())
        }
        ScheduleOp::Reorder { moves } => reorder(f, t, DomainKind::Loop, moves),
        ScheduleOp::Parallelize { axis, parallel } => parallelize(f, t, *axis, *parallel),
        ScheduleOp::Swizzle1d { axis, parallel } => {
            swizzle1d(f, t, *axis, *parallel, &step_text(&step.op))
        }
        ScheduleOp::AllocationAsLoop => {
            set_allocation_as_loop(f, t);
            Ok(())
        }
        ScheduleOp::SetMesh(m) => {
            if !f.meshes().contains(m) {
                return Err(Diagnostic::new(format!(
                    "{}: `mesh =` names a mesh that is not declared in this fusion",
                    prefix(f, t)
                )));
            }
            f.tensor_mut(t).mesh = Some(*m);
            Ok(())
        }
        ScheduleOp::SetMemory(mem) => {
            f.tensor_mut(t).memory = *mem;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weave_ir::{DType, MemoryType, MeshSpec, Span};

    fn n(s: &str) -> Scalar {
        Scalar::named(s)
    }

    fn step(op: ScheduleOp) -> ScheduleStep {
        ScheduleStep {
            op,
            span: Some(Span::new(7, 3)),
        }
    }

    fn outer(axis: usize, factor: Scalar, p: Option<ParallelType>) -> ScheduleStep {
        step(ScheduleOp::OuterSplit {
            axis,
            factor,
            parallel: p,
        })
    }

    fn inner(axis: usize, factor: Scalar, p: Option<ParallelType>) -> ScheduleStep {
        step(ScheduleOp::InnerSplit {
            axis,
            factor,
            parallel: p,
        })
    }

    /// `t = 8192, h = 8192, d = 2, s = 4`, mesh `m = devices(d)`, `inp: bf16[t, 4 * h] on m`,
    /// `w: bf16[h, 4 * h] on m`, `out = linear(inp, w)`.
    fn row_parallel() -> (Fusion, TensorId, TensorId, TensorId) {
        let mut f = Fusion::new("row_parallel_linear");
        for (p, v) in [("t", 8192), ("h", 8192), ("d", 2), ("s", 4)] {
            f.add_param(p, Some(v)).unwrap();
        }
        let m = f.add_mesh("m", MeshSpec::Devices(vec![n("d")])).unwrap();
        let inp = f
            .add_input("inp", DType::BF16, vec![n("t"), n("h").mul(4)], Some(m))
            .unwrap();
        let w = f
            .add_input("w", DType::BF16, vec![n("h"), n("h").mul(4)], Some(m))
            .unwrap();
        let out = f.linear("out", inp, w, None).unwrap();
        f.add_output(out).unwrap();
        (f, inp, w, out)
    }

    fn loop_of(f: &Fusion, t: TensorId) -> Vec<(ParallelType, Scalar)> {
        f.tensor(t)
            .loop_domain
            .iter()
            .map(|i| (f.id(*i).parallel, f.id(*i).extent.clone()))
            .collect()
    }

    fn render(f: &Fusion, ids: &[IterDomainId]) -> String {
        let v: Vec<String> = ids
            .iter()
            .map(|i| {
                let d = f.id(*i);
                format!(
                    "{}{}{{{}}}",
                    d.iter_type.prefix(),
                    d.parallel.print_name(),
                    d.extent
                )
            })
            .collect();
        format!("[{}]", v.join(", "))
    }

    fn apply_err(f: &mut Fusion) -> Diagnostic {
        apply_schedules(f).unwrap_err()
    }

    #[test]
    fn row_parallel_linear_schedules() {
        let (mut f, inp, w, out) = row_parallel();
        f.tensor_mut(inp).schedule = vec![
            outer(0, n("s"), Some(ParallelType::Stream)),
            outer(2, n("d"), Some(ParallelType::DIDx)),
        ];
        f.tensor_mut(w).schedule = vec![outer(1, n("d"), Some(ParallelType::DIDx))];
        apply_schedules(&mut f).unwrap();
        assert_eq!(
            loop_of(&f, inp),
            vec![
                (ParallelType::Stream, Scalar::c(4)),
                (ParallelType::Serial, n("t").ceil_div(Scalar::c(4))),
                (ParallelType::DIDx, Scalar::c(2)),
                (ParallelType::Serial, n("h").mul(4).ceil_div(Scalar::c(2))),
            ]
        );
        assert_eq!(
            loop_of(&f, w),
            vec![
                (ParallelType::Serial, n("h")),
                (ParallelType::DIDx, Scalar::c(2)),
                (ParallelType::Serial, n("h").mul(4).ceil_div(Scalar::c(2))),
            ]
        );
        // The output is untouched; its loop domain is its logical domain.
        assert_eq!(f.tensor(out).loop_domain, f.tensor(out).logical);
        // Evaluated with the parameters: [4, 2048, 2, 16384].
        let ev: Vec<i64> = loop_of(&f, inp)
            .iter()
            .map(|(_, e)| f.eval(e).unwrap())
            .collect();
        assert_eq!(ev, vec![4, 2048, 2, 16384]);
        insta::assert_snapshot!(
            render(&f, &f.tensor(inp).loop_domain),
            @"[istreamIdx{4}, iS{( ceilDiv(t, 4) )}, ideviceIdx.x{2}, iS{( 2 * h )}]"
        );
        insta::assert_snapshot!(
            render(&f, &f.tensor(out).loop_domain),
            @"[iS{t}, iS{h}, rS{( 4 * h )}]"
        );
    }

    #[test]
    fn allocation_domain_splits_start_from_logical() {
        let (mut f, inp, _, _) = row_parallel();
        let (o, i) = split(
            &mut f,
            inp,
            DomainKind::Allocation,
            1,
            n("d"),
            SplitKind::Outer,
        )
        .unwrap();
        let l0 = f.tensor(inp).logical[0];
        assert_eq!(f.tensor(inp).allocation, Some(vec![l0, o, i]));
        assert_eq!(f.tensor(inp).loop_domain, f.tensor(inp).logical);
        reorder(&mut f, inp, DomainKind::Allocation, &[(1, 0)]).unwrap();
        assert_eq!(f.tensor(inp).allocation, Some(vec![o, l0, i]));
        let m = merge(&mut f, inp, DomainKind::Allocation, 1, 2).unwrap();
        assert_eq!(f.tensor(inp).allocation, Some(vec![o, m]));
        assert_eq!(f.id(m).extent, n("t").mul(n("h").mul(2)));
    }

    #[test]
    fn allocation_as_loop_mesh_and_memory_steps() {
        let (mut f, inp, w, _) = row_parallel();
        let m2 = f
            .add_mesh("m2", MeshSpec::Devices(vec![Scalar::c(2)]))
            .unwrap();
        f.tensor_mut(inp).schedule = vec![
            outer(0, n("s"), Some(ParallelType::Stream)),
            step(ScheduleOp::AllocationAsLoop),
            step(ScheduleOp::SetMemory(MemoryType::Symmetric)),
            step(ScheduleOp::SetMesh(m2)),
        ];
        f.tensor_mut(w).schedule = vec![step(ScheduleOp::Reorder {
            moves: vec![(0, 1)],
        })];
        apply_schedules(&mut f).unwrap();
        let tv = f.tensor(inp);
        assert_eq!(tv.allocation.as_ref(), Some(&tv.loop_domain));
        assert_eq!(tv.memory, MemoryType::Symmetric);
        assert_eq!(tv.mesh, Some(m2));
        let wl = f.tensor(w).logical.clone();
        assert_eq!(f.tensor(w).loop_domain, vec![wl[1], wl[0]]);
    }

    #[test]
    fn axis_out_of_range() {
        let (mut f, inp, _, _) = row_parallel();
        f.tensor_mut(inp).schedule = vec![outer(0, n("s"), None), outer(3, Scalar::c(2), None)];
        let e = apply_err(&mut f);
        assert_eq!(
            e.message,
            "schedule of `inp`: outer_split of axis 3, but the loop domain has 3 axes (0..2)"
        );
        assert_eq!(e.span, Some(Span::new(7, 3)));
    }

    #[test]
    fn factor_without_value() {
        let (mut f, inp, _, _) = row_parallel();
        f.add_param("u", None).unwrap();
        f.tensor_mut(inp).schedule = vec![inner(0, n("u"), None)];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `inp`: split factor `u` has no value"
        );
        let (mut f, inp, _, _) = row_parallel();
        f.tensor_mut(inp).schedule = vec![outer(0, n("s").sub(4), None)];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `inp`: split factor `s - 4` = 0 must be positive"
        );
    }

    #[test]
    fn inner_split_cannot_make_device_or_stream_axes() {
        let (mut f, inp, _, _) = row_parallel();
        f.tensor_mut(inp).schedule = vec![inner(1, Scalar::c(4), Some(ParallelType::DIDx))];
        let e = apply_err(&mut f);
        assert_eq!(
            e.message,
            "schedule of `inp`: inner_split(1, 4) -> DIDx: device and stream axes must come from an outer split"
        );
        assert_eq!(e.span, Some(Span::new(7, 3)));
        let (mut f, inp, _, _) = row_parallel();
        f.tensor_mut(inp).schedule = vec![inner(0, n("s"), Some(ParallelType::Stream))];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `inp`: inner_split(0, s) -> Stream: device and stream axes must come from an outer split"
        );
    }

    #[test]
    fn device_split_needs_a_mesh() {
        let mut f = Fusion::new("nomesh");
        f.add_param("d", Some(2)).unwrap();
        let w = f
            .add_input("w", DType::F32, vec![Scalar::c(4), Scalar::c(8)], None)
            .unwrap();
        f.tensor_mut(w).schedule = vec![outer(1, n("d"), Some(ParallelType::DIDx))];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `w`: DIDx split needs a device mesh (declare the tensor `on m` or add `mesh = m`)"
        );
    }

    #[test]
    fn device_split_factor_must_match_the_mesh() {
        let (mut f, _, w, _) = row_parallel();
        f.tensor_mut(w).schedule = vec![outer(1, Scalar::c(4), Some(ParallelType::DIDx))];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `w`: DIDx split factor `4` = 4, but mesh `m` has 2 devices along DIDx"
        );
        let (mut f, _, w, _) = row_parallel();
        f.tensor_mut(w).schedule = vec![outer(1, n("d"), Some(ParallelType::DIDy))];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `w`: DIDy split, but mesh `m` has shape [2] and no DIDy axis"
        );
    }

    #[test]
    fn device_split_must_divide_a_known_extent() {
        let mut f = Fusion::new("ragged");
        let m = f
            .add_mesh("m", MeshSpec::Devices(vec![Scalar::c(4)]))
            .unwrap();
        let w = f
            .add_input("w", DType::F32, vec![Scalar::c(3), Scalar::c(6)], Some(m))
            .unwrap();
        f.tensor_mut(w).schedule = vec![outer(1, Scalar::c(4), Some(ParallelType::DIDx))];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `w`: axis 1 has extent 6 (`6`), not divisible by 4 devices (DIDx)"
        );
    }

    #[test]
    fn stream_splits_may_be_ragged() {
        let mut f = Fusion::new("ragged");
        let a = f
            .add_input("a", DType::F32, vec![Scalar::c(10)], None)
            .unwrap();
        f.tensor_mut(a).schedule = vec![outer(0, Scalar::c(3), Some(ParallelType::Stream))];
        apply_schedules(&mut f).unwrap();
        assert_eq!(
            loop_of(&f, a),
            vec![
                (ParallelType::Stream, Scalar::c(3)),
                (ParallelType::Serial, Scalar::c(4))
            ]
        );
    }

    #[test]
    fn parallelize_rules() {
        // An inner-split output cannot become DIDx.
        let (mut f, inp, _, _) = row_parallel();
        f.tensor_mut(inp).schedule = vec![
            outer(1, n("d"), None),
            step(ScheduleOp::Parallelize {
                axis: 2,
                parallel: ParallelType::DIDx,
            }),
        ];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `inp`: parallelize(2, DIDx): axis 2 is the inner output of an outer split; device and stream axes must be an unsplit logical axis or the outer output of an outer split"
        );
        // The outer output of an inner split cannot either.
        let (mut f, inp, _, _) = row_parallel();
        f.tensor_mut(inp).schedule = vec![
            inner(0, Scalar::c(4), None),
            step(ScheduleOp::Parallelize {
                axis: 0,
                parallel: ParallelType::Stream,
            }),
        ];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `inp`: parallelize(0, Stream): axis 0 is the outer output of an inner split; device and stream axes must be an unsplit logical axis or the outer output of an outer split"
        );
        // Nor a merge output.
        let (mut f, inp, _, _) = row_parallel();
        f.tensor_mut(inp).schedule = vec![
            step(ScheduleOp::Merge { outer: 0, inner: 1 }),
            step(ScheduleOp::Parallelize {
                axis: 0,
                parallel: ParallelType::Stream,
            }),
        ];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `inp`: parallelize(0, Stream): axis 0 is the output of a merge; device and stream axes must be an unsplit logical axis or the outer output of an outer split"
        );
        // An unsplit logical axis may be Stream directly, and DIDx when its extent is the mesh size.
        let (mut f, inp, _, _) = row_parallel();
        parallelize(&mut f, inp, 0, ParallelType::Stream).unwrap();
        assert_eq!(
            parallelize(&mut f, inp, 1, ParallelType::DIDx)
                .unwrap_err()
                .message,
            "schedule of `inp`: axis 1 has extent 32768 (`4 * h`), but mesh `m` has 2 devices along DIDx"
        );
        assert_eq!(
            parallelize(&mut f, inp, 2, ParallelType::DIDx)
                .unwrap_err()
                .message,
            "schedule of `inp`: parallelize of axis 2, but the loop domain has 2 axes (0..1)"
        );
        parallelize(&mut f, inp, 0, ParallelType::Serial).unwrap();
    }

    #[test]
    fn one_axis_per_parallel_type() {
        let (mut f, inp, _, _) = row_parallel();
        f.tensor_mut(inp).schedule = vec![
            outer(0, n("s"), Some(ParallelType::Stream)),
            outer(2, Scalar::c(2), Some(ParallelType::Stream)),
        ];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `inp`: outer_split(2, 2) -> Stream: loop axis 0 is already Stream; a loop domain has at most one Stream axis"
        );
        // A reduction axis may carry DIDx beside an iteration DIDx axis (reduce-scatter).
        let (mut f, _, _, out) = row_parallel();
        let m = f.mesh_by_name("m").unwrap();
        f.tensor_mut(out).schedule = vec![
            step(ScheduleOp::SetMesh(m)),
            outer(2, n("d"), Some(ParallelType::DIDx)),
            outer(1, n("d"), Some(ParallelType::DIDx)),
        ];
        apply_schedules(&mut f).unwrap();
        let ps: Vec<ParallelType> = loop_of(&f, out).into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            ps,
            vec![
                ParallelType::Serial,
                ParallelType::DIDx,
                ParallelType::Serial,
                ParallelType::DIDx,
                ParallelType::Serial
            ]
        );
    }

    #[test]
    fn splitting_a_parallel_axis_is_an_error() {
        let (mut f, inp, _, _) = row_parallel();
        f.tensor_mut(inp).schedule = vec![
            outer(0, n("s"), Some(ParallelType::Stream)),
            outer(0, Scalar::c(2), None),
        ];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `inp`: outer_split of axis 0, which is already parallelized as Stream (split before parallelizing)"
        );
    }

    #[test]
    fn merge_rules() {
        let (mut f, inp, _, _) = row_parallel();
        f.tensor_mut(inp).schedule = vec![step(ScheduleOp::Merge { outer: 0, inner: 2 })];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `inp`: merge(0, 2), but the loop domain has 2 axes (0..1)"
        );
        let (mut f, inp, _, _) = row_parallel();
        f.tensor_mut(inp).schedule = vec![
            outer(0, n("s"), None),
            step(ScheduleOp::Merge { outer: 0, inner: 2 }),
        ];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `inp`: merge(0, 2): the inner axis must be the outer axis + 1"
        );
        let (mut f, _, _, out) = row_parallel();
        f.tensor_mut(out).schedule = vec![step(ScheduleOp::Merge { outer: 1, inner: 2 })];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `out`: merge(1, 2): cannot merge iteration axis 1 with reduction axis 2"
        );
        let (mut f, inp, _, _) = row_parallel();
        f.tensor_mut(inp).schedule = vec![
            outer(0, n("s"), Some(ParallelType::Stream)),
            step(ScheduleOp::Merge { outer: 0, inner: 1 }),
        ];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `inp`: merge(0, 1): axis 0 is parallelized as Stream; device and stream axes cannot be merged"
        );
        let (mut f, inp, _, _) = row_parallel();
        f.tensor_mut(inp).schedule = vec![
            outer(0, n("s"), None),
            step(ScheduleOp::Merge { outer: 1, inner: 2 }),
        ];
        apply_schedules(&mut f).unwrap();
        assert_eq!(
            loop_of(&f, inp),
            vec![
                (ParallelType::Serial, Scalar::c(4)),
                (ParallelType::Serial, n("t").ceil_div(4).mul(n("h").mul(4))),
            ]
        );
    }

    #[test]
    fn reorder_rules() {
        let (mut f, inp, _, _) = row_parallel();
        f.tensor_mut(inp).schedule = vec![step(ScheduleOp::Reorder {
            moves: vec![(2, 0)],
        })];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `inp`: reorder(2 -> 0): axis 2 is out of range, the loop domain has 2 axes (0..1)"
        );
        let (mut f, inp, _, _) = row_parallel();
        f.tensor_mut(inp).schedule = vec![step(ScheduleOp::Reorder {
            moves: vec![(0, 1), (0, 0)],
        })];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `inp`: reorder(0 -> 1, 0 -> 0): axis 0 is moved twice"
        );
        let (mut f, inp, _, _) = row_parallel();
        f.tensor_mut(inp).schedule = vec![step(ScheduleOp::Reorder {
            moves: vec![(0, 1), (1, 1)],
        })];
        assert_eq!(
            apply_err(&mut f).message,
            "schedule of `inp`: reorder(0 -> 1, 1 -> 1): two axes are moved to position 1"
        );
        // [a, b, c, d] with 3 -> 0, 0 -> 2 gives [d, b, a, c].
        let mut f = Fusion::new("r");
        let x = f
            .add_input("x", DType::F32, (1..=4).map(Scalar::c).collect(), None)
            .unwrap();
        reorder(&mut f, x, DomainKind::Loop, &[(3, 0), (0, 2)]).unwrap();
        let ext: Vec<Scalar> = loop_of(&f, x).into_iter().map(|(_, e)| e).collect();
        assert_eq!(ext, [4, 2, 1, 3].map(Scalar::c).to_vec());
    }
}
