//! `decompose-reshardings`: make every expr either pure compute or exactly one communication
//! (reference/nvfuser-host-ir.md §4.2, nvFuser's `DecomposeReshardingsPass`).
//!
//! Contract.
//!
//! * Input: an [`crate::Ir::Fusion`] after `propagate-shardings` (every sharded tensor has a mesh).
//!   Output: the same computation where every expr that changes the device sharding
//!   ([`is_resharding`]) is a `set`, `sum`/`max` or `squeeze` whose collective
//!   [`derive_communication`] names, and every other expr is local. Tensor ids of existing
//!   tensors, fusion inputs and outputs are kept; new tensors are named `<out>_partial`,
//!   `<out>_nobias`, `<bias>_broadcast`, `<out>_reduced`, `<out>_reshaped`, `<in>_gathered`
//!   and `<in>_resharded` (made unique).
//! * Idempotent: a second run finds nothing to decompose.
//!
//! Steps, in order:
//!
//! 1. **Device-reduced axes are marked.** When an operand of a reduction, `matmul` or `linear`
//!    is device-sharded on an axis the expr reduces and the output's reduction axis is still
//!    unscheduled (a user-annotated output), the operand's split is replayed onto that
//!    reduction axis and parallelized (`rDIDx`). When the output's mesh does not have that
//!    many devices along the type (a reduction to a root mesh), the axis is only marked for
//!    step 2, which rfactors it or takes the mark back.
//!    A `linear(x, w, bias)` whose output is then device-reduced is split first:
//!    `<out>_nobias = linear(x, w)` takes the output's sharding, and `out = add(<out>_nobias,
//!    <bias>_broadcast)` with `<bias>_broadcast = broadcast(bias, [0, ..])`, so that step 2
//!    reduces the products over devices and the bias is added once, after the Allreduce or
//!    ReduceScatter (inside the stream loop when the output is stream-split).
//! 2. **rfactor.** A reduction, `matmul`, `linear` or `index_select` (whose output keeps the
//!    table's rows as a reduction axis) whose output reduces over a device axis
//!    (`rDIDx`) and also over local axes (`linear`/`matmul` always have local work) is split
//!    in two: `<out>_partial = op(inputs)` keeps the device axis as an iteration axis
//!    (`ideviceIdx.x…rf`: its root reduction axis `r{k}` is outer-split by the device count
//!    into `iDIDx{d}rf, r{k/d}rf`) and reduces locally; the original expr becomes
//!    `out = sum(partial)` (or `max`) over that device axis only, which is an Allreduce,
//!    Reduce or ReduceScatter. The partial takes the output's `Stream` split and the operands'
//!    device shardings; it lives on the output's mesh, or for a reduction to another mesh
//!    (a Reduce to a root) on the mesh of the operand whose devices split the reduced axis,
//!    and the output then reduces the partial's device axis as a plain axis. E.g. the row-parallel `out = linear(inp, w)` with a DIDx-split
//!    contraction becomes `out_partial = linear(inp, w)` (local) and `out = sum(out_partial)`
//!    (Allreduce). A vocabulary-parallel lookup `y = index_select(table, ids, 0)` with the
//!    table's rows on DIDx becomes `y_partial = index_select(table, ids, 0, base)` (each
//!    device looks up the ids that fall in its block of rows, `base` the block's first row as
//!    a size over `rank`; other ids give zero rows) and `y = sum(y_partial)` (Allreduce), as
//!    Megatron's vocabulary-parallel embedding does.
//!
//!    **A reduction scattered by its stream chunks.** Then `p = sum(p_partial)` over a device
//!    axis, stream-split on an axis in as many chunks as devices, whose only reader is
//!    `out = set(p)` split over those devices on the same axis and cut alike (the
//!    sequence-parallel MLP block written with one stream chunk per device: `schedule p {
//!    outer_split(0, d) -> Stream }`, `schedule out { outer_split(0, d) -> DIDx }`), becomes
//!    `out = sum(p_partial)`: a Reduce rooted at each iteration's device, which lowering
//!    posts per iteration, or as a P2P ring. Without it, every chunk would be allreduced into
//!    a replicated copy that a Scatter then cuts. The same pair with neither stream-split (such
//!    a fusion with its Stream axes run serially, `Fusion::serialize_streams`) folds into one
//!    ReduceScatter. A replicated bias that step 1b adds between
//!    the two (`p = add(p_nobias, bias_broadcast)`) is added after the reduction instead:
//!    `out_nobias = sum(p_partial)`, `out = add(out_nobias, bias_broadcast)`.
//! 3. **Resharding sets.** A remaining resharding expr that is not a communication gets, for
//!    each operand sharded differently from its output, `x_resharded = set(x)` inserted right
//!    before it, on the output's mesh and sharded like the output (device and stream types,
//!    replayed with [`weave_transform::replay_loop_like`]); the expr then reads the copy
//!    (nvFuser's `insertReshardingSetsBefore`). A `reshape` whose output's device split is no
//!    block of its operand's axes (a split of `b * t` that does not divide `b`, or of the
//!    inner axis of a split `b * t → [b, t]`) becomes `<out>_reshaped = reshape(x)`, sharded
//!    like `x`, then `out = set(<out>_reshaped)` (a Scatter). A `set` or `squeeze` that is not a valid
//!    communication, or a reduction over a device-sharded axis that is not, is refused with
//!    the diagnostic of [`derive_communication`] (e.g. "expected at most one sharding change
//!    in `x = set(y)`: DIDx and DIDy both change"). A `set` that only changes how a device
//!    split lays out its axis (`[s, d, ..]` against `[d, ..]`), moves the shards of one
//!    axis between meshes of different sizes, or moves a device split to another axis from or
//!    into stream chunks (an AllToAll whose pieces would not be blocks), becomes an allgather into `<in>_gathered`
//!    (replicated on the input's mesh, stream-split like the output or the input) and a
//!    scatter.
//!    A DID → Stream `set` whose stream chunks and device shards neither match nor nest
//!    ([`is_unnested_did_to_stream`]) becomes an Allgather into `<in>_gathered` (replicated,
//!    not stream-split) and a local copy into the chunks (`gather_then_slice`).
//!    A `set` from another mesh onto a 2-D mesh that splits it (a Scatter onto it), or that
//!    changes both DIDx and DIDy between two meshes ([`copies_onto_another_mesh_in_two`]),
//!    first copies its input whole onto the receiver mesh (`<in>_resharded`), then splits
//!    that copy on one mesh.
//!    A `set` on one (2-D) mesh whose DIDx and DIDy shardings both change becomes a chain of
//!    sets that each change one type (`one_change_per_set`); the gathered copy of a layout
//!    change keeps the input's splits of the other device types. A reduction over a device
//!    axis that also changes the sharding of other axes (its output lays out a DIDy split
//!    inside stream chunks) becomes `<out>_reduced = op(x)`, the collective keeping `x`'s
//!    sharding of the other axes, then `out = set(<out>_reduced)` (`reduce_then_reshard`).
//! 4. **Receivers outside the senders.** A Gather or Reduce to a mesh with a device outside
//!    the sender mesh becomes an Allgather or Allreduce on the sender mesh followed by a
//!    Broadcast `set` to the receivers (a member of a Gather or Reduce contributes its own
//!    piece, which a device outside the sender mesh does not have).
//!
//! The partial of step 2 takes the output's Stream split unless that drops an operand's device
//! split (`[s, d, ..]` on the output against `[d, ..]` on the operand); it then keeps the
//! operand's split unstreamed, and step 3 splits the reduction from the layout change.
//!
//! The rfactor of step 2 also takes a device axis nested inside outer splits of the reduced
//! axis (`outer_split(k, s); outer_split(k + 1, d) -> DIDx`): the partial cuts its reduction
//! axis the same way and keeps only the device output as an iteration axis.
//!
//! [`is_unnested_did_to_stream`]: crate::communication::is_unnested_did_to_stream

use weave_ir::{Diagnostic, ExprId, ExprKind, Fusion, IrResult, IterDomainId, IterType, TensorId};

use crate::communication::derive_communication;
use crate::resharding::is_resharding;
use crate::shared::FusionRewrite;

mod receivers;
mod rfactor;
mod sets;

use receivers::route_through_the_senders;
use rfactor::{
    fold_reduction_into_stream_scatter, mark_device_reduced_axes, rfactor_device_reduction,
    split_device_reduced_bias,
};
use sets::insert_resharding_sets;
pub use sets::{changes_several_device_types, copies_onto_another_mesh_in_two};

/// The `decompose-reshardings` pass (see the module doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct DecomposeReshardings;

impl FusionRewrite for DecomposeReshardings {
    const NAME: &'static str = "decompose-reshardings";
    const SUMMARY: &'static str =
        "rfactor device-split reductions and insert sets so each expr is compute or one communication";
    const REWRITE: fn(&mut Fusion) -> IrResult<()> = decompose_reshardings;
}

/// Runs the steps of the module doc.
pub fn decompose_reshardings(f: &mut Fusion) -> IrResult<()> {
    let exprs: Vec<ExprId> = f.exprs().to_vec();
    for &e in &exprs {
        if is_reducing(&f.expr(e).kind) {
            let span = f.expr(e).span;
            mark_device_reduced_axes(f, e).map_err(|d| d.or_at(span))?;
            let e = split_device_reduced_bias(f, e).map_err(|d| d.or_at(span))?;
            rfactor_device_reduction(f, e).map_err(|d| d.or_at(span))?;
        }
    }
    let exprs: Vec<ExprId> = f.exprs().to_vec();
    for &e in &exprs {
        let span = f.expr(e).span;
        fold_reduction_into_stream_scatter(f, e).map_err(|d| d.or_at(span))?;
    }
    let exprs: Vec<ExprId> = f.exprs().to_vec();
    for &e in &exprs {
        insert_resharding_sets(f, e).map_err(|d| d.or_at(f.expr(e).span))?;
    }
    let exprs: Vec<ExprId> = f.exprs().to_vec();
    for &e in &exprs {
        route_through_the_senders(f, e).map_err(|d| d.or_at(f.expr(e).span))?;
    }
    // Postcondition.
    for &e in f.exprs() {
        if is_resharding(f, e) {
            derive_communication(f, e)?;
        }
    }
    Ok(())
}

fn is_reducing(kind: &ExprKind) -> bool {
    matches!(
        kind,
        ExprKind::Reduction { .. }
            | ExprKind::Matmul
            | ExprKind::Linear
            | ExprKind::IndexSelect { .. }
    )
}

/// The refusal of a vocabulary-parallel lookup whose table `name` is split over `mesh` when
/// the mesh's devices are not consecutive ids: a device finds its block's first row by
/// arithmetic on its rank, which a permuted or gapped device list does not allow.
pub(crate) fn scattered_mesh(name: &str, mesh: &weave_ir::DeviceMesh) -> Option<Diagnostic> {
    let devices = mesh.devices();
    let first = devices.first().copied().unwrap_or(0);
    devices
        .iter()
        .enumerate()
        .any(|(k, v)| *v != first + k as i64)
        .then(|| {
            Diagnostic::new(format!(
                "index_select: the rows of `{name}` are split across the devices of {mesh}, which are not consecutive ids; a vocabulary-parallel lookup needs a mesh of consecutive devices (`devices(d)`, or a list such as `[2, 3]`), from whose rank each device finds its block of rows"
            ))
        })
}

/// The axis of `within` that `id` derives from (through any split or merge input).
fn source_in(f: &Fusion, id: IterDomainId, within: &[IterDomainId]) -> Option<IterDomainId> {
    let mut cur = id;
    loop {
        if within.contains(&cur) {
            return Some(cur);
        }
        let e = f.id(cur).definition?;
        cur = f.id_expr(e).inputs()[0];
    }
}

/// Inserts `name = kind(inputs)` just before `e`, at `e`'s place in the source, on `mesh`,
/// its tensor at `span_of`'s place: the new tensor and its expression. Every step that puts
/// an op of its own in front of the one it decomposes goes through here.
#[allow(clippy::too_many_arguments)]
pub(super) fn insert_before(
    f: &mut Fusion,
    e: ExprId,
    name: &str,
    kind: ExprKind,
    inputs: &[TensorId],
    mesh: Option<weave_ir::MeshId>,
    span_of: TensorId,
) -> IrResult<(TensorId, ExprId)> {
    let t = f.add_op(name, kind, inputs)?;
    let x = f.tensor(t).definition.expect("just defined");
    f.move_expr_before(x, e);
    f.expr_mut(x).span = f.expr(e).span;
    f.tensor_mut(t).mesh = mesh;
    f.tensor_mut(t).span = f.tensor(span_of).span;
    Ok((t, x))
}

/// Makes the reduction `e` a `set` of `mid`: its output keeps its materialized axes, without
/// the reduction ones.
fn make_set_of(f: &mut Fusion, e: ExprId, mid: TensorId) {
    let y = f.expr(e).outputs[0];
    drop_reduction_axes(f, y);
    let ex = f.expr_mut(e);
    ex.kind = ExprKind::Set;
    ex.inputs = vec![mid];
}

/// Drops `y`'s reduction axes, and the loop and allocation axes made from them, when the expr
/// that defines it stops reducing (it becomes a copy or a pointwise op).
fn drop_reduction_axes(f: &mut Fusion, y: TensorId) {
    let tv = f.tensor(y).clone();
    let reduced = |f: &Fusion, id: IterDomainId| {
        source_in(f, id, &tv.logical).is_some_and(|l| f.id(l).iter_type == IterType::Reduction)
    };
    let keep = |f: &Fusion, dom: &[IterDomainId]| -> Vec<IterDomainId> {
        dom.iter().copied().filter(|i| !reduced(f, *i)).collect()
    };
    let logical = keep(f, &tv.logical);
    let loop_domain = keep(f, &tv.loop_domain);
    let allocation = tv.allocation.as_ref().map(|a| keep(f, a));
    set_domains(f, y, logical, loop_domain, allocation);
}

/// Gives `t` new logical, loop and allocation domains.
fn set_domains(
    f: &mut Fusion,
    t: TensorId,
    logical: Vec<IterDomainId>,
    loop_domain: Vec<IterDomainId>,
    allocation: Option<Vec<IterDomainId>>,
) {
    let tv = f.tensor_mut(t);
    tv.logical = logical;
    tv.loop_domain = loop_domain;
    tv.allocation = allocation;
}
