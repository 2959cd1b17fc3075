//! The host IR's collectives as the communicator's operations: the one mapping from a
//! [`Communication`] (its [`CommunicationType`] and reduction) to a [`CommOp`].
//!
//! It lives here because this is the one crate that sees both sides: weave-host-ir knows
//! nothing of communicators and weave-comm nothing of host programs (docs/ARCHITECTURE.md),
//! so neither may name the other's type in a `From`.

use weave_comm::{CommOp, RedOp};
use weave_host_ir::{Communication, CommunicationType};
use weave_ir::ReduceOp;

/// What `rank`, a member of `team` (device ids in team order), posts for `c`: the operation
/// of `c`'s type over `input` and `output`, with `root` (an index into the team, for the
/// types that have one) and `c`'s reduction. A collective permute sends to the next member
/// of the team and receives from the previous one, cyclically.
pub(crate) fn comm_op<B>(
    c: &Communication,
    team: &[i64],
    rank: usize,
    root: usize,
    input: B,
    output: B,
) -> CommOp<B> {
    let op = red_op(c.red_op);
    match c.kind {
        CommunicationType::Allgather => CommOp::Allgather { input, output },
        CommunicationType::Allreduce => CommOp::Allreduce { input, output, op },
        CommunicationType::ReduceScatter => CommOp::ReduceScatter { input, output, op },
        CommunicationType::Broadcast => CommOp::Broadcast {
            root,
            input,
            output,
        },
        CommunicationType::Reduce => CommOp::Reduce {
            root,
            input,
            output,
            op,
        },
        CommunicationType::Gather => CommOp::Gather {
            root,
            input,
            output,
        },
        CommunicationType::Scatter => CommOp::Scatter {
            root,
            input,
            output,
        },
        CommunicationType::SendRecv => CommOp::SendRecv {
            root,
            input,
            output,
        },
        CommunicationType::AllToAll => CommOp::AllToAll { input, output },
        CommunicationType::CollectivePermute => {
            let n = team.len().max(1);
            let me = team.iter().position(|&d| d == rank as i64).unwrap_or(0);
            CommOp::CollectivePermute {
                input,
                output,
                send_to: (me + 1) % n,
                recv_from: (me + n - 1) % n,
            }
        }
    }
}

/// The communicators' reduction for a communication's `red_op`; a communication that does
/// not reduce (`None`) passes `Sum`. The match is exhaustive, so a new reduce op must say
/// what it maps to.
fn red_op(op: Option<ReduceOp>) -> RedOp {
    match op {
        None | Some(ReduceOp::Sum) => RedOp::Sum,
        Some(ReduceOp::Max) => RedOp::Max,
        Some(ReduceOp::Min) => RedOp::Min,
    }
}

#[cfg(test)]
mod tests {
    use weave_ir::{DType, MemoryType};

    use super::*;

    fn communication(kind: CommunicationType) -> Communication {
        let mut p = weave_host_ir::HostProgram::new();
        let mut tensor = || p.new_tensor(DType::F32, Vec::new(), MemoryType::Global);
        let (input, output) = (tensor(), tensor());
        Communication {
            kind,
            teams: vec![vec![4, 7, 9]],
            root: kind.has_root().then(|| p.constant(2)),
            red_op: kind.is_reduction().then_some(ReduceOp::Max),
            input,
            output,
        }
    }

    /// Every type maps to the operation of the same name, and keeps its root and reduction.
    #[test]
    fn every_type_maps_to_its_operation() {
        for kind in CommunicationType::ALL {
            let c = communication(kind);
            let op = comm_op(&c, &c.teams[0], 7, 2, 'i', 'o');
            let want = kind.name().to_lowercase();
            let got = op.name().replace('-', "");
            assert_eq!(got, want, "{kind:?} became {}", op.name());
            match op {
                CommOp::Allreduce { op, .. }
                | CommOp::ReduceScatter { op, .. }
                | CommOp::Reduce { op, .. } => assert_eq!(op, RedOp::Max, "{kind:?}"),
                _ => {}
            }
            match op {
                CommOp::Broadcast { root, .. }
                | CommOp::Reduce { root, .. }
                | CommOp::Gather { root, .. }
                | CommOp::Scatter { root, .. }
                | CommOp::SendRecv { root, .. } => assert_eq!(root, 2, "{kind:?}"),
                _ => {}
            }
        }
    }

    /// A permute sends to the next member and receives from the previous one, cyclically.
    #[test]
    fn a_permute_passes_along_the_team() {
        let c = communication(CommunicationType::CollectivePermute);
        for (rank, to, from) in [(4, 1, 2), (7, 2, 0), (9, 0, 1)] {
            match comm_op(&c, &c.teams[0], rank, 0, (), ()) {
                CommOp::CollectivePermute {
                    send_to, recv_from, ..
                } => assert_eq!((send_to, recv_from), (to, from), "rank {rank}"),
                op => panic!("a permute became {}", op.name()),
            }
        }
    }
}
