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
//! A DID → Stream copy whose stream chunks and device shards neither match nor nest (through
//! a `set` or through another op) is not refused: decompose-reshardings gathers first
//! ([`crate::communication::is_unnested_did_to_stream`]).

use weave_ir::{Diagnostic, ExprKind, Fusion, IdExpr};

use crate::communication::{derive_communication, is_layout_change};
use crate::resharding::is_resharding;

/// Runs every check of the module doc; the first failure is returned with its span.
pub fn check_user_shardings(f: &Fusion) -> Result<(), Diagnostic> {
    check_user_communications(f)?;
    check_lookup_meshes(f)
}

/// Checks every `index_select` whose table the user split across devices on the rows the ids
/// index: the table's mesh must list consecutive devices, from whose rank each device finds
/// the first row of its block
/// ([`crate::decompose_reshardings::scattered_mesh`]). The error is at the op.
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
