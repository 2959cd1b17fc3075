//! Helpers more than one pass uses: running a fusion pass's body on a copy (and the
//! [`Pass`]/[`FusionPass`] impls of a pass that is only such a body), interning a host scalar
//! (and a folded binary one), and appending to a list in a side table.

use weave_host_ir::{HostProgram, HostScalar, ScalarId};
use weave_ir::{print, Fusion, IrResult, Scalar, ScalarOp};

use crate::pass::{Changed, FusionPass, Pass, PassError};

/// A fusion pass whose whole work is one function rewriting the fusion in place: its
/// [`Pass`] and [`FusionPass`] impls come from here, the run going through
/// [`run_on_fusion`]. Implemented by the four pre-segmentation passes.
pub(crate) trait FusionRewrite {
    /// The pass's name ([`Pass::name`]).
    const NAME: &'static str;
    /// One line on what it does ([`Pass::summary`]).
    const SUMMARY: &'static str;
    /// The rewrite; a diagnostic means the pass does not support the fusion.
    const REWRITE: fn(&mut Fusion) -> IrResult<()>;
}

impl<P: FusionRewrite + Send + Sync> Pass for P {
    fn name(&self) -> &'static str {
        P::NAME
    }

    fn summary(&self) -> &'static str {
        P::SUMMARY
    }
}

impl<P: FusionRewrite + Send + Sync> FusionPass for P {
    fn run(&self, f: &mut Fusion) -> Result<Changed, PassError> {
        run_on_fusion(P::NAME, f, P::REWRITE)
    }
}

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

/// `a op b`: one folded [`HostScalar::Value`] when both sides are values, else a
/// [`HostScalar::Binary`]; an equal existing scalar is reused.
pub(crate) fn binary(p: &mut HostProgram, op: ScalarOp, a: ScalarId, b: ScalarId) -> ScalarId {
    let wanted = match (&p.scalars[a], &p.scalars[b]) {
        (HostScalar::Value(x), HostScalar::Value(y)) => {
            HostScalar::Value(Scalar::binary(op, x.clone(), y.clone()))
        }
        _ => HostScalar::Binary(op, a, b),
    };
    find_or_insert_scalar(p, wanted)
}

/// Appends `value` to the list of `key` in `map`, starting the list when there is none.
pub(crate) fn push_to<K: slotmap::Key, V>(
    map: &mut weave_host_ir::ids::SecondaryMap<K, Vec<V>>,
    key: K,
    value: V,
) {
    match map.get_mut(key) {
        Some(list) => list.push(value),
        None => {
            map.insert(key, vec![value]);
        }
    }
}
