//! Linears computed by the collective they feed: which linear of a host program may be
//! handed to its sum reduce-scatter or allreduce, so that the GEMM writes each block where
//! the collective sums it ([`weave_comm::Communicator::post_produced`]), and the deferred
//! linear the evaluator keeps until that collective is posted.

use weave_host_ir::ids::SecondaryMap;
use weave_host_ir::{CommunicationType, HostProgram, HostTensorId, Stmt, StmtId};
use weave_ir::ReduceOp;

/// A linear not run yet: its operands, until the collective it feeds computes it.
pub(super) struct Deferred<T> {
    pub(super) input: T,
    pub(super) weight: T,
    pub(super) bias: Option<T>,
    pub(super) out: T,
    pub(super) label: String,
}

/// Every linear that its collective may compute, with that collective: a linear whose
/// output `P` is followed later in the same scope by a sum reduce-scatter or allreduce of
/// `P`, with no statement between them touching `P`; `P` bound by an `Allocate` of its own,
/// or a `ShardByStream` view (a slot of a buffer the loop reuses) that is the only view ever
/// cut from its buffer; and nothing else in the program touching `P` (or that buffer) but
/// its binding and freeing — no other view, no other reader: only the collective's sums see
/// the blocks that go to peers. (The shapes are checked when it runs: a 2-D input, an
/// output of `[rows, n]` and axes of one element.)
pub fn producers(program: &HostProgram) -> SecondaryMap<StmtId, StmtId> {
    let mut out = SecondaryMap::new();
    for w in program.walk() {
        // An accumulating linear adds to what `P` holds: only a linear that writes `P` whole
        // can be computed where the collective wants each block.
        let Some(Stmt::Linear {
            out: p,
            accumulate: false,
            ..
        }) = program.stmts.get(w.stmt)
        else {
            continue;
        };
        let p = *p;
        let scope = program.scope(w.scope);
        let mut feeds = None;
        for &next in &scope[w.position + 1..] {
            match program.stmts.get(next) {
                Some(Stmt::Communication(c)) if c.input == p => {
                    let sums = matches!(
                        c.kind,
                        CommunicationType::ReduceScatter | CommunicationType::Allreduce
                    ) && c.red_op == Some(ReduceOp::Sum)
                        && c.output != p;
                    if sums {
                        feeds = Some(next);
                    }
                    break;
                }
                Some(s) if touches(s, p) => break,
                Some(_) => {}
                None => break,
            }
        }
        let Some(comm) = feeds else { continue };
        // What binds `P`: its own allocation, or a view of a buffer.
        let mut binding = None;
        for v in program.walk() {
            match program.stmts.get(v.stmt) {
                Some(Stmt::Allocate { tensor, .. }) if *tensor == p => {
                    binding = Some((v.stmt, None));
                }
                Some(Stmt::ShardByStream { input, output, .. }) if *output == p => {
                    binding = Some((v.stmt, Some(*input)));
                }
                _ => {}
            }
        }
        let Some((bound_by, base)) = binding else {
            continue;
        };
        let frees = |s: &Stmt, t: HostTensorId| matches!(s, Stmt::Allocate { tensor, .. } | Stmt::Deallocate { tensor } if *tensor == t);
        let alone = program.walk().all(|v| {
            let Some(s) = program.stmts.get(v.stmt) else {
                return true;
            };
            let own = [w.stmt, comm, bound_by].contains(&v.stmt);
            (own || frees(s, p) || !touches(s, p))
                && base.is_none_or(|b| v.stmt == bound_by || frees(s, b) || !touches(s, b))
        });
        let outside = |t: HostTensorId| program.inputs.contains(&t) || program.outputs.contains(&t);
        if alone && !outside(p) && !base.is_some_and(outside) {
            out.insert(w.stmt, comm);
        }
    }
    out
}

/// Whether `s` touches the tensor `t` at all (binds, views, reads, writes or frees it).
fn touches(s: &Stmt, t: HostTensorId) -> bool {
    let e = s.effects();
    e.view == Some(t) || e.accesses.iter().any(|&(u, _)| u == t)
}
