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
//! A DID → Stream copy whose stream chunks and device shards neither match nor nest (through
//! a `set` or through another op) is not refused: decompose-reshardings gathers first
//! ([`crate::communication::is_unnested_did_to_stream`]).

use weave_ir::{Diagnostic, ExprKind, Fusion};

use crate::communication::{derive_communication, is_layout_change};
use crate::resharding::is_resharding;

/// Runs every check of the module doc; the first failure is returned with its span.
pub fn check_user_shardings(f: &Fusion) -> Result<(), Diagnostic> {
    check_user_communications(f)
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
