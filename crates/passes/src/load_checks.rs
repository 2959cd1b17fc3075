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
//! * Any other op whose operand is split across devices on an axis that its output (on the
//!   same mesh, not split across devices) is stream-split on: decompose-reshardings will copy
//!   the operand into the output's stream chunks (a DID → Stream copy), which needs the
//!   factors to match or nest, as for a `set`.

use weave_ir::{Diagnostic, ExprKind, Fusion, ParallelType};
use weave_transform::logical_map::pairwise_map;

use crate::communication::{
    ancestor, derive_communication, expr_desc, is_layout_change, nests_evenly,
};
use crate::resharding::{is_resharding, parallel_axis, same_index, DEVICE_TYPES};

/// Runs every check of the module doc; the first failure is returned with its span.
pub fn check_user_shardings(f: &Fusion) -> Result<(), Diagnostic> {
    check_user_communications(f)?;
    check_implicit_did_to_stream(f)
}

/// Refuses an op whose operand's device split and whose output's stream split cut one axis
/// by factors that neither match nor nest (see the module doc).
pub fn check_implicit_did_to_stream(f: &Fusion) -> Result<(), Diagnostic> {
    for &e in f.exprs() {
        let ex = f.expr(e);
        if matches!(ex.kind, ExprKind::Set | ExprKind::SegmentSet) || ex.outputs.len() != 1 {
            continue;
        }
        let o = ex.outputs[0];
        let (Some(om), Some(sd)) = (
            f.mesh_of(o),
            parallel_axis(f, &f.tensor(o).loop_domain, ParallelType::Stream),
        ) else {
            continue;
        };
        let Some(cs) = ancestor(f, sd, f.tensor(o).root_domain()) else {
            continue;
        };
        for &x in &ex.inputs {
            if f.mesh_of(x) != Some(om) {
                continue;
            }
            let xl = &f.tensor(x).loop_domain;
            let chunked_alike = parallel_axis(f, xl, ParallelType::Stream)
                .is_some_and(|ps| same_index(f, x, ps, o, sd));
            if chunked_alike {
                continue;
            }
            let pairs = pairwise_map(f, e, x);
            for pt in DEVICE_TYPES {
                let Some(pd) = parallel_axis(f, xl, pt) else {
                    continue;
                };
                let Some(pl) = ancestor(f, pd, &f.tensor(x).logical) else {
                    continue;
                };
                if !pairs.contains(&(pl, cs))
                    || parallel_axis(f, &f.tensor(o).loop_domain, pt).is_some()
                {
                    continue;
                }
                if !same_index(f, x, pd, o, sd) && !nests_evenly(f, (pl, pd), (cs, sd)) {
                    return Err(Diagnostic::new(format!(
                        "{} reads `{}` split across devices ({pt}) on the axis that `{}` is stream-split on: copying it into the stream chunks needs the stream split of `{}` to match the {pt} split of `{}`, or both to be outer splits of the axis by factors that divide it and one of which divides the other",
                        expr_desc(f, e),
                        f.tensor(x).name,
                        f.tensor(o).name,
                        f.tensor(o).name,
                        f.tensor(x).name
                    ))
                    .or_at(ex.span));
                }
            }
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
            && !crate::decompose_reshardings::changes_several_device_types(f, e)
        {
            derive_communication(f, e)?;
        }
    }
    Ok(())
}
