//! Helpers more than one pass uses: running a fusion pass's body on a copy, and interning a
//! host scalar.

use weave_host_ir::{HostProgram, HostScalar, ScalarId};
use weave_ir::{print, Fusion, IrResult};

use crate::pass::{Changed, PassError};

/// Runs `body` on `f` for the fusion pass `pass`: a diagnostic is [`PassError::Unsupported`]
/// and leaves `f` as it was; the result says whether the fusion changed. Shared by the four
/// pre-segmentation passes.
///
/// "Changed" is decided by the fusion's seed-style print, before and after: exact for every
/// difference a dump can show, so a pass that changes nothing reports [`Changed::No`]. A
/// cheaper exact test (a structural `Fusion: PartialEq`, or a generation counter bumped by
/// every mutation) needs weave-ir to provide it; this is the one place to switch over.
pub(crate) fn run_on_fusion(
    pass: &'static str,
    f: &mut Fusion,
    body: fn(&mut Fusion) -> IrResult<()>,
) -> Result<Changed, PassError> {
    // Work on a copy so that a failing pass leaves the IR as it was.
    let mut work = f.clone();
    body(&mut work).map_err(|diagnostic| PassError::Unsupported { pass, diagnostic })?;
    let changed = print::fusion_to_string(&work) != print::fusion_to_string(f);
    *f = work;
    Ok(if changed { Changed::Yes } else { Changed::No })
}

/// The id of a scalar equal to `wanted`, inserting it if the program has none.
pub(crate) fn find_or_insert_scalar(p: &mut HostProgram, wanted: HostScalar) -> ScalarId {
    // A loop index is identified by its id, never by value: never share one.
    if wanted != HostScalar::LoopIndex {
        if let Some((id, _)) = p.scalars.iter().find(|(_, s)| **s == wanted) {
            return id;
        }
    }
    p.scalars.insert(wanted)
}
