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

mod rules;

#[cfg(test)]
mod tests;

use rules::{
    check_device_axis, check_device_origin, check_origin, check_stream_origin, check_unique,
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

/// Fails with [`out_of_range`] (`{op} of axis {axis}`) unless `axis` is one of the `n` axes
/// of `t`'s `dom` domain.
fn check_axis(
    f: &Fusion,
    t: TensorId,
    dom: DomainKind,
    n: usize,
    op: &str,
    axis: usize,
) -> IrResult<()> {
    if axis >= n {
        return Err(out_of_range(f, t, dom, &format!("{op} of axis {axis}"), n));
    }
    Ok(())
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
    check_axis(f, t, dom, ids.len(), op, axis)?;
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
    check_axis(f, t, DomainKind::Loop, ids.len(), "parallelize", axis)?;
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
    check_axis(f, t, DomainKind::Loop, ids.len(), "swizzle1d", axis)?;
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
    op.source_with(Scalar::to_source, |_| "...".to_string())
}

/// Loop axis `id` of `t` followed up through outer outputs of splits: the first axis on the
/// way that is logical or not the outer output of a split.
fn outer_split_top(f: &Fusion, t: TensorId, mut id: IterDomainId) -> IterDomainId {
    let logical = &f.tensor(t).logical;
    while !logical.contains(&id) {
        match f.id(id).definition.map(|e| f.id_expr(e)) {
            Some(IdExpr::Split { input, outer, .. }) if *outer == id => id = *input,
            _ => break,
        }
    }
    id
}

/// The logical axis of `t` that loop axis `id` is the outer part of (through outer outputs of
/// splits only), if any.
pub fn outer_split_root(f: &Fusion, t: TensorId, id: IterDomainId) -> Option<IterDomainId> {
    let top = outer_split_top(f, t, id);
    f.tensor(t).logical.contains(&top).then_some(top)
}

/// The logical axis of `t` that the Stream (or any) loop axis `id` chunks: followed up
/// through outer outputs of splits, and through the inner output of a device split of the
/// logical axis itself (stream chunks of each device's block, `outer_split(a, d) -> DIDx;
/// outer_split(a + 1, s) -> Stream`, whose chunks cut the local axis of every device's
/// buffer). `None` when the chain passes through a merge or through any other inner output.
pub fn stream_split_root(f: &Fusion, t: TensorId, id: IterDomainId) -> Option<IterDomainId> {
    let logical = &f.tensor(t).logical;
    let top = outer_split_top(f, t, id);
    if logical.contains(&top) {
        return Some(top);
    }
    match f.id(top).definition.map(|e| f.id_expr(e)) {
        Some(IdExpr::Split {
            input,
            outer,
            inner,
            ..
        }) if *inner == top && f.id(*outer).parallel.is_device() && logical.contains(input) => {
            Some(*input)
        }
        _ => None,
    }
}

/// Whether the Stream loop axis `id` of `t` chunks each device's block of its logical axis
/// (it is cut from the inner output of a device split of that axis), and so the local axis
/// rather than the global one.
pub fn streams_inside_device_split(f: &Fusion, t: TensorId, id: IterDomainId) -> bool {
    let top = outer_split_top(f, t, id);
    if f.tensor(t).logical.contains(&top) {
        return false;
    }
    match f.id(top).definition.map(|e| f.id_expr(e)) {
        Some(IdExpr::Split { outer, inner, .. }) if *inner == top => {
            f.id(*outer).parallel.is_device()
        }
        _ => false,
    }
}

/// Where [`walk_splits`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitsEnd {
    /// At an axis that `stop` accepts.
    Stop(IterDomainId),
    /// At an axis that nothing defines.
    Undefined(IterDomainId),
    /// At `output`, which a merge of `outer` and `inner` made.
    Merge {
        /// The merged axis the walk reached.
        output: IterDomainId,
        /// The merge's outer input.
        outer: IterDomainId,
        /// The merge's inner input.
        inner: IterDomainId,
    },
}

/// Walks from axis `id` up through the splits that made it until `stop` accepts an axis, or
/// the walk reaches an axis that nothing defines or that a merge made. At a split of `input`
/// into `outer` and `inner` that made `cur`, `split(cur, input, outer, inner)` runs before
/// the walk goes on to `input`; its error ends the walk.
pub fn walk_splits<E>(
    f: &Fusion,
    mut id: IterDomainId,
    stop: impl Fn(IterDomainId) -> bool,
    mut split: impl FnMut(IterDomainId, IterDomainId, IterDomainId, IterDomainId) -> Result<(), E>,
) -> Result<SplitsEnd, E> {
    loop {
        if stop(id) {
            return Ok(SplitsEnd::Stop(id));
        }
        let Some(def) = f.id(id).definition else {
            return Ok(SplitsEnd::Undefined(id));
        };
        match f.id_expr(def) {
            IdExpr::Split {
                input,
                outer,
                inner,
                ..
            } => {
                split(id, *input, *outer, *inner)?;
                id = *input;
            }
            IdExpr::Merge { outer, inner, .. } => {
                return Ok(SplitsEnd::Merge {
                    output: id,
                    outer: *outer,
                    inner: *inner,
                })
            }
        }
    }
}

/// A split step: the split, then the parallel type of its outer output and the checks of
/// where a device or stream axis comes from.
fn apply_split(
    f: &mut Fusion,
    t: TensorId,
    step: &ScheduleStep,
    kind: SplitKind,
    (axis, factor, parallel): (usize, &Scalar, Option<ParallelType>),
) -> IrResult<()> {
    let pt = parallel.unwrap_or(ParallelType::Serial);
    if kind == SplitKind::Inner && pt.is_device_or_stream() {
        return Err(Diagnostic::new(format!(
            "{}: {}: device and stream axes must come from an outer split",
            prefix(f, t),
            step_text(&step.op)
        )));
    }
    split(f, t, DomainKind::Loop, axis, factor.clone(), kind)?;
    if pt != ParallelType::Serial {
        parallelize_step(f, t, axis, pt, &step_text(&step.op))?;
    }
    if pt == ParallelType::Stream {
        check_stream_origin(f, t, axis, &step_text(&step.op))?;
    }
    if pt.is_device() {
        check_device_origin(f, t, axis, pt, &step_text(&step.op))?;
    }
    Ok(())
}

fn apply_step(f: &mut Fusion, t: TensorId, step: &ScheduleStep) -> IrResult<()> {
    match &step.op {
        ScheduleOp::OuterSplit {
            axis,
            factor,
            parallel,
        } => apply_split(f, t, step, SplitKind::Outer, (*axis, factor, *parallel)),
        ScheduleOp::InnerSplit {
            axis,
            factor,
            parallel,
        } => apply_split(f, t, step, SplitKind::Inner, (*axis, factor, *parallel)),
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
