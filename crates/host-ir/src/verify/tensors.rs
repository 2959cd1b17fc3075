//! Tensors: a use needs a dominating definition, and no statement touches memory that an
//! in-flight communication uses (views share memory with the tensor they cut).

use super::{State, VResult, Verifier};
use crate::ids::{HostTensorId, StmtId};
use crate::printer::Names;
use crate::syntax::HostProgram;

impl Verifier<'_> {
    /// `t` must be defined here, and so must every tensor it is a view of.
    pub(super) fn need(
        &mut self,
        s: StmtId,
        state: &State,
        t: HostTensorId,
        verb: &str,
    ) -> VResult {
        if !state.defined.contains_key(t) {
            let n = self.t(t);
            let why = if state.freed.contains_key(t) {
                " after it is deallocated".to_string()
            } else if let Some(l) = state.loop_local.get(t).copied() {
                format!(
                    ", which is defined only inside {} (a definition in a loop body does not \
                     reach past the loop)",
                    self.names.loop_name(self.p, l)
                )
            } else {
                " before it is written".to_string()
            };
            return Err(self.fail(s, format!("{verb} {n}{why}")));
        }
        self.usable_parents(s, state, t, verb)
    }

    /// Every tensor `t` is a view of must still be defined.
    pub(super) fn usable_parents(
        &mut self,
        s: StmtId,
        state: &State,
        t: HostTensorId,
        verb: &str,
    ) -> VResult {
        for parent in chain(state, t).into_iter().skip(1) {
            if !state.defined.contains_key(parent) {
                let (n, m) = (self.t(t), self.t(parent));
                return Err(self.fail(
                    s,
                    format!("{verb} {n}, a view of {m}, after {m} is deallocated"),
                ));
            }
        }
        Ok(())
    }

    /// `s` touches `t`: no in-flight communication may use memory that `t` shares.
    pub(super) fn touch(
        &mut self,
        s: StmtId,
        state: &State,
        t: HostTensorId,
        verb: &str,
    ) -> VResult {
        self.touch_as(s, state, t, verb, false)
    }

    /// `s` touches `t`, only reading it when `reading`: a read may overlap an in-flight
    /// communication that only reads the same memory (a send, or a collective's input), as
    /// the ring patterns compute on the chunk they forward; anything else must wait.
    pub(super) fn touch_as(
        &mut self,
        s: StmtId,
        state: &State,
        t: HostTensorId,
        verb: &str,
        reading: bool,
    ) -> VResult {
        let mut hit = None;
        'search: for pd in self.pending.iter().flatten() {
            for &(b, written) in &pd.buffers {
                if (written || !reading) && overlaps(&mut self.names, self.p, state, t, b) {
                    hit = Some((pd.comm, b, pd.in_group));
                    break 'search;
                }
            }
        }
        let Some((comm, b, in_group)) = hit else {
            return Ok(());
        };
        let (n, m) = (self.t(t), self.t(b));
        let on = if b == t {
            "on it".to_string()
        } else {
            format!("on {m}, which shares memory with {n}")
        };
        let q = self.quote(comm);
        let fix = if in_group {
            "the coalescing group must end and be waited for first".to_string()
        } else {
            format!(
                "`Wait({})` must come first",
                self.names.stmt_ref(self.p, comm)
            )
        };
        Err(self.fail(s, format!("{verb} {n} while {q} is in flight {on}; {fix}")))
    }
}

/// `t` is (re)bound to a new buffer or view here.
pub(super) fn bind(state: &mut State, t: HostTensorId) {
    state.defined.insert(t, ());
    state.freed.remove(t);
    state.loop_local.remove(t);
    state.from_outside.remove(t);
}

/// `t`, the tensor it is a view of, that tensor's parent, and so on.
fn chain(state: &State, t: HostTensorId) -> Vec<HostTensorId> {
    let mut out = vec![t];
    let mut cur = t;
    while let Some(v) = state.views.get(cur) {
        if out.contains(&v.parent) {
            break;
        }
        out.push(v.parent);
        cur = v.parent;
    }
    out
}

/// Whether `a` and `b` may share memory (see the module docs for sibling views).
fn overlaps(
    names: &mut Names,
    p: &HostProgram,
    state: &State,
    a: HostTensorId,
    b: HostTensorId,
) -> bool {
    if a == b {
        return true;
    }
    let (ca, cb) = (chain(state, a), chain(state, b));
    if ca.contains(&b) || cb.contains(&a) {
        return true;
    }
    for (i, x) in ca.iter().enumerate() {
        if let Some(j) = cb.iter().position(|y| y == x) {
            // `a` and `b` are views of the common ancestor `x` through ca[i-1] and cb[j-1].
            let (Some(va), Some(vb)) = (
                i.checked_sub(1)
                    .and_then(|k| ca.get(k))
                    .and_then(|t| state.views.get(*t)),
                j.checked_sub(1)
                    .and_then(|k| cb.get(k))
                    .and_then(|t| state.views.get(*t)),
            ) else {
                return true;
            };
            // Scalars compare as printed, so that the verdict does not depend on how a
            // program splits an expression into host scalars.
            let disjoint = va.axis == vb.axis
                && names.scalar(p, va.chunks) == names.scalar(p, vb.chunks)
                && names.scalar(p, va.index) != names.scalar(p, vb.index);
            return !disjoint;
        }
    }
    false
}
