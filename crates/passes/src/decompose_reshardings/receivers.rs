//! Step 4 of `decompose-reshardings`: a Gather or Reduce to receivers outside the sender
//! mesh becomes an Allgather or Allreduce on the senders and a Broadcast `set` to the
//! receivers.

use weave_ir::{ExprId, Fusion, IrResult, ParallelType};
use weave_transform::IdGraph;

use weave_host_ir::CommunicationType;

use super::{insert_before, make_set_of};
use crate::communication::derive_communication;
use crate::propagate_shardings::replay;
use crate::resharding::is_resharding;

/// Step 4: a Gather or Reduce whose receiver is not a device of the sender mesh would make
/// the receiver a member that contributes a piece (or a term) it does not have. It goes
/// through the senders instead: `mid = op(x)` on the sender mesh, replicated there (an
/// Allgather or Allreduce), then `y = set(mid)`, a Broadcast from the first sender to the
/// receivers.
pub(super) fn route_through_the_senders(f: &mut Fusion, e: ExprId) -> IrResult<()> {
    if !is_resharding(f, e) {
        return Ok(());
    }
    let Ok(info) = derive_communication(f, e) else {
        return Ok(());
    };
    if !matches!(
        info.kind,
        CommunicationType::Gather | CommunicationType::Reduce
    ) {
        return Ok(());
    }
    let (x, y) = (f.expr(e).inputs[0], f.expr(e).outputs[0]);
    let (Some(pm), Some(cm)) = (f.mesh_of(x).cloned(), f.mesh_of(y).cloned()) else {
        return Ok(());
    };
    if cm.devices().iter().all(|d| pm.has(*d)) || f.tensor(y).root.is_some() {
        return Ok(());
    }
    let kind = f.expr(e).kind.clone();
    let name = f.fresh_name(&format!("{}_on_senders", f.tensor(y).name));
    let (mid, _) = insert_before(f, e, &name, kind, &[x], f.tensor(x).mesh, y)?;
    let graph = IdGraph::build(f);
    replay(f, y, mid, &graph, &[ParallelType::Stream])?;
    make_set_of(f, e, mid);
    Ok(())
}
