//! The signature against the program: one entry per input and output, each with the
//! tensor's dtype, rank and local sizes.

use weave_ir::Diagnostic;

use super::VResult;
use crate::ids::ScalarId;
use crate::syntax::{HostProgram, HostScalar};

/// The element count of `sizes` where every size is known at load (a constant, or an
/// expression over the signature's parameters); `None` otherwise.
pub(crate) fn known_numel(p: &HostProgram, sizes: &[ScalarId]) -> Option<i64> {
    sizes.iter().try_fold(1i64, |acc, &x| {
        let v = match p.scalars.get(x)? {
            HostScalar::Value(v) => match &p.signature {
                Some(sig) => v.eval(&|n| sig.param(n))?,
                None => v.as_const()?,
            },
            _ => return None,
        };
        acc.checked_mul(v)
    })
}

/// A signature agrees with the program: one entry per input and output, with the tensor's
/// dtype and rank, and a local shape (a rank's buffer under the entry's sharding, with the
/// signature's parameter values) equal to the program's sizes of that tensor.
pub(crate) fn verify_signature(p: &HostProgram) -> VResult {
    let Some(sig) = &p.signature else {
        return Ok(());
    };
    for (what, tensors, entries) in [
        ("input", &p.inputs, &sig.inputs),
        ("output", &p.outputs, &sig.outputs),
    ] {
        if tensors.len() != entries.len() {
            return Err(Diagnostic::new(format!(
                "the program has {} {what}(s) but its signature {}",
                tensors.len(),
                entries.len()
            )));
        }
        for (k, (t, e)) in tensors.iter().zip(entries).enumerate() {
            let Some(tensor) = p.tensors.get(*t) else {
                continue;
            };
            let here = format!("signature {what} {k} `{}`", e.name);
            if tensor.dtype != e.dtype {
                return Err(Diagnostic::new(format!(
                    "{here} is {} but the program's tensor is {}",
                    e.dtype, tensor.dtype
                )));
            }
            if tensor.sizes.len() != e.shape.len() {
                return Err(Diagnostic::new(format!(
                    "{here} has {} axes but the program's tensor {}",
                    e.shape.len(),
                    tensor.sizes.len()
                )));
            }
            let local = e.local_sizes();
            for (axis, (&size, want)) in tensor.sizes.iter().zip(&local).enumerate() {
                let value = match p.scalars.get(size) {
                    Some(HostScalar::Value(s)) => s.eval(&|n| sig.param(n)),
                    _ => None,
                };
                match value {
                    Some(v) if usize::try_from(v).ok() == Some(*want) => {}
                    Some(v) => {
                        return Err(Diagnostic::new(format!(
                            "{here}: a rank's buffer has {want} elements along axis {axis} under its sharding, but the program's tensor has {v}"
                        )))
                    }
                    None => {
                        return Err(Diagnostic::new(format!(
                            "{here}: the program's size of axis {axis} does not evaluate with the signature's params"
                        )))
                    }
                }
            }
        }
    }
    sig.check_definition()
        .map_err(|e| Diagnostic::new(e.to_string()))?;
    for (role, name) in &sig.roles {
        if sig.param(name).is_none() {
            return Err(Diagnostic::new(format!(
                "the signature's role `{}` names `{name}`, which is not among its params",
                role.keyword()
            )));
        }
    }
    Ok(())
}
