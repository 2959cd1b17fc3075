//! The plan compiler: what one member issues for a collective or a point-to-point group
//! (NCCL calls, then device copies), computed and checked without touching NCCL.

use super::DeviceBuffer;
use crate::communicator::{size_relation, CommOp, P2p};
use crate::dtype::{DataType, RedOp};

/// One NCCL call of a plan; addresses are device pointers, peers and roots are ranks of
/// the communicator used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Call {
    AllGather {
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
    },
    AllReduce {
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: RedOp,
    },
    ReduceScatter {
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: RedOp,
    },
    Broadcast {
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        root: usize,
    },
    Reduce {
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: RedOp,
        root: usize,
    },
    Send {
        buf: u64,
        count: usize,
        dtype: DataType,
        peer: usize,
    },
    Recv {
        buf: u64,
        count: usize,
        dtype: DataType,
        peer: usize,
    },
}

impl Call {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Call::AllGather { .. } => "ncclAllGather",
            Call::AllReduce { .. } => "ncclAllReduce",
            Call::ReduceScatter { .. } => "ncclReduceScatter",
            Call::Broadcast { .. } => "ncclBroadcast",
            Call::Reduce { .. } => "ncclReduce",
            Call::Send { .. } => "ncclSend",
            Call::Recv { .. } => "ncclRecv",
        }
    }

    pub(super) fn is_p2p(&self) -> bool {
        matches!(self, Call::Send { .. } | Call::Recv { .. })
    }

    /// The element count the call moves (per member, as NCCL counts it).
    pub(super) fn count(&self) -> usize {
        match self {
            Call::AllGather { count, .. }
            | Call::AllReduce { count, .. }
            | Call::ReduceScatter { count, .. }
            | Call::Broadcast { count, .. }
            | Call::Reduce { count, .. }
            | Call::Send { count, .. }
            | Call::Recv { count, .. } => *count,
        }
    }

    /// The element type of the call's buffers.
    pub(super) fn dtype(&self) -> DataType {
        match self {
            Call::AllGather { dtype, .. }
            | Call::AllReduce { dtype, .. }
            | Call::ReduceScatter { dtype, .. }
            | Call::Broadcast { dtype, .. }
            | Call::Reduce { dtype, .. }
            | Call::Send { dtype, .. }
            | Call::Recv { dtype, .. } => *dtype,
        }
    }

    /// The bytes of the call's `count` elements (for traces; saturating).
    fn bytes(&self) -> usize {
        self.count().saturating_mul(self.dtype().size())
    }
}

/// A device-to-device copy on the posting stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct DeviceCopy {
    pub(super) dst: u64,
    pub(super) src: u64,
    pub(super) bytes: usize,
}

/// What one member issues for one operation: NCCL calls (in one group when there are
/// sends or receives), then copies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Plan {
    pub(super) calls: Vec<Call>,
    pub(super) copies: Vec<DeviceCopy>,
}

impl Plan {
    /// Drops the calls that move no element: the empty last chunks of an axis that the
    /// stream chunks do not divide. Every member of a team cuts the same chunk of the same
    /// axis, so every member drops the same calls and nothing waits for a missing partner.
    fn drop_empty_calls(&mut self) {
        self.calls.retain(|c| c.count() > 0);
    }

    /// The bytes this member's calls and copies move, as traces report them: each call's
    /// element count (per member, as NCCL counts it) in bytes, plus the copies.
    pub(super) fn bytes(&self) -> usize {
        let calls = self.calls.iter().map(Call::bytes);
        let copies = self.copies.iter().map(|c| c.bytes);
        calls.chain(copies).fold(0, usize::saturating_add)
    }

    pub(super) fn grouped(&self) -> bool {
        self.calls.len() > 1 || self.calls.iter().any(Call::is_p2p)
    }

    /// Issues `call`, or on a team of one (`n == 1`) copies the `len` elements from `src` to
    /// `dst` that it would move instead.
    fn call_or_copy(
        &mut self,
        n: usize,
        call: Call,
        dst: &Operand,
        src: &Operand,
        len: usize,
    ) -> Result<(), String> {
        if n == 1 {
            self.copy(dst, 0, src, 0, len)
        } else {
            self.calls.push(call);
            Ok(())
        }
    }

    /// Copies `len` elements from piece `src_piece` of `src` to piece `dst_piece` of `dst`,
    /// pieces being `len` elements long.
    fn copy(
        &mut self,
        dst: &Operand,
        dst_piece: usize,
        src: &Operand,
        src_piece: usize,
        len: usize,
    ) -> Result<(), String> {
        let bytes = byte_len(len, src.dtype)?;
        let (d, s) = (dst.piece(dst_piece, len)?, src.piece(src_piece, len)?);
        if bytes > 0 && d != s {
            self.copies.push(DeviceCopy {
                dst: d,
                src: s,
                bytes,
            });
        }
        Ok(())
    }
}

fn byte_len(len: usize, dtype: DataType) -> Result<usize, String> {
    len.checked_mul(dtype.size())
        .ok_or_else(|| format!("{len} elements of {dtype} overflow the address space"))
}

/// The `input` and `output` of an operation, checked in that order.
fn operands<B: DeviceBuffer>(input: &B, output: &B) -> Result<(Operand, Operand), String> {
    Ok((
        Operand::new("input", input)?,
        Operand::new("output", output)?,
    ))
}

/// A buffer as a plan uses it.
struct Operand {
    what: String,
    ptr: u64,
    len: usize,
    dtype: DataType,
}

impl Operand {
    /// Checks that the `what` buffer can be handed to NCCL.
    fn new<B: DeviceBuffer>(what: impl Into<String>, buffer: &B) -> Result<Operand, String> {
        let what = what.into();
        if !buffer.is_contiguous() {
            return Err(format!(
                "the {what} is not contiguous; NCCL moves contiguous memory only"
            ));
        }
        Ok(Operand {
            what,
            ptr: buffer.device_ptr(),
            len: buffer.len(),
            dtype: buffer.data_type(),
        })
    }

    /// A send of `count` elements of this buffer, from `buf`, to `peer`.
    fn send(&self, buf: u64, count: usize, peer: usize) -> Call {
        Call::Send {
            buf,
            count,
            dtype: self.dtype,
            peer,
        }
    }

    /// A receive of `count` elements into this buffer, at `buf`, from `peer`.
    fn recv(&self, buf: u64, count: usize, peer: usize) -> Call {
        Call::Recv {
            buf,
            count,
            dtype: self.dtype,
            peer,
        }
    }

    /// The address of piece `index`, pieces being `len` elements long.
    fn piece(&self, index: usize, len: usize) -> Result<u64, String> {
        index
            .checked_mul(len)
            .and_then(|n| n.checked_mul(self.dtype.size()))
            .and_then(|offset| u64::try_from(offset).ok())
            .and_then(|offset| self.ptr.checked_add(offset))
            .ok_or_else(|| format!("piece {index} of the {} overflows its address", self.what))
    }

    /// Fails unless this buffer has `expected` elements, `factor` times the other.
    fn expect_len(&self, expected: usize, factor: usize) -> Result<(), String> {
        if self.len == expected {
            return Ok(());
        }
        let relation = size_relation(factor);
        Err(format!(
            "the {} has {} elements but must have {relation}, {expected}",
            self.what, self.len
        ))
    }
}

/// Fails unless `input` and `output` hold the same element type.
fn same_type(input: &Operand, output: &Operand) -> Result<(), String> {
    if input.dtype == output.dtype {
        Ok(())
    } else {
        Err(format!(
            "the input is {} but the output is {}",
            input.dtype, output.dtype
        ))
    }
}

/// What member `index` of a team of `n` issues for `op`, after the checks it can make alone
/// (those of [`crate::Local`], plus contiguity). Only the buffers the member uses are
/// checked: a non-root's input of a broadcast, say, is never read.
pub(super) fn plan_collective<B: DeviceBuffer>(
    op: &CommOp<B>,
    index: usize,
    n: usize,
) -> Result<Plan, String> {
    op.check_members(n)?;
    let mut plan = Plan::default();
    match op {
        CommOp::Allgather { input, output } => {
            let (i, o) = operands(input, output)?;
            o.expect_len(i.len.saturating_mul(n), n)?;
            same_type(&i, &o)?;
            let call = Call::AllGather {
                send: i.ptr,
                recv: o.ptr,
                count: i.len,
                dtype: i.dtype,
            };
            plan.call_or_copy(n, call, &o, &i, i.len)?;
        }
        CommOp::Allreduce { input, output, op } => {
            let (i, o) = operands(input, output)?;
            o.expect_len(i.len, 1)?;
            same_type(&i, &o)?;
            let call = Call::AllReduce {
                send: i.ptr,
                recv: o.ptr,
                count: i.len,
                dtype: i.dtype,
                op: *op,
            };
            plan.call_or_copy(n, call, &o, &i, i.len)?;
        }
        CommOp::ReduceScatter { input, output, op } => {
            let (i, o) = operands(input, output)?;
            i.expect_len(o.len.saturating_mul(n), n)?;
            same_type(&i, &o)?;
            let call = Call::ReduceScatter {
                send: i.ptr,
                recv: o.ptr,
                count: o.len,
                dtype: o.dtype,
                op: *op,
            };
            plan.call_or_copy(n, call, &o, &i, o.len)?;
        }
        CommOp::Broadcast {
            root,
            input,
            output,
        } => {
            let o = Operand::new("output", output)?;
            let send = if index == *root {
                let i = Operand::new("input", input)?;
                o.expect_len(i.len, 1)?;
                same_type(&i, &o)?;
                if n == 1 {
                    plan.copy(&o, 0, &i, 0, i.len)?;
                    return Ok(plan);
                }
                i.ptr
            } else {
                // NCCL reads the send buffer on the root only; pass the output, as an
                // in-place broadcast does.
                o.ptr
            };
            plan.calls.push(Call::Broadcast {
                send,
                recv: o.ptr,
                count: o.len,
                dtype: o.dtype,
                root: *root,
            });
        }
        CommOp::Reduce {
            root,
            input,
            output,
            op,
        } => {
            let i = Operand::new("input", input)?;
            let recv = if index == *root {
                let o = Operand::new("output", output)?;
                o.expect_len(i.len, 1)?;
                same_type(&i, &o)?;
                if n == 1 {
                    plan.copy(&o, 0, &i, 0, i.len)?;
                    return Ok(plan);
                }
                o.ptr
            } else {
                // NCCL writes the receive buffer on the root only; pass the input, as an
                // in-place reduce does.
                i.ptr
            };
            plan.calls.push(Call::Reduce {
                send: i.ptr,
                recv,
                count: i.len,
                dtype: i.dtype,
                op: *op,
                root: *root,
            });
        }
        CommOp::Gather {
            root,
            input,
            output,
        } => {
            let i = Operand::new("input", input)?;
            if index == *root {
                let o = Operand::new("output", output)?;
                o.expect_len(i.len.saturating_mul(n), n)?;
                same_type(&i, &o)?;
                for j in (0..n).filter(|&j| j != index) {
                    plan.calls.push(o.recv(o.piece(j, i.len)?, i.len, j));
                }
                plan.copy(&o, index, &i, 0, i.len)?;
            } else {
                plan.calls.push(i.send(i.ptr, i.len, *root));
            }
        }
        CommOp::Scatter {
            root,
            input,
            output,
        } => {
            let o = Operand::new("output", output)?;
            if index == *root {
                let i = Operand::new("input", input)?;
                i.expect_len(o.len.saturating_mul(n), n)?;
                same_type(&i, &o)?;
                for j in (0..n).filter(|&j| j != index) {
                    plan.calls.push(i.send(i.piece(j, o.len)?, o.len, j));
                }
                plan.copy(&o, 0, &i, index, o.len)?;
            } else {
                plan.calls.push(o.recv(o.ptr, o.len, *root));
            }
        }
        CommOp::SendRecv {
            root,
            input,
            output,
        } => {
            if index == *root {
                let i = Operand::new("input", input)?;
                plan.calls.push(i.send(i.ptr, i.len, 1 - *root));
            } else {
                let o = Operand::new("output", output)?;
                plan.calls.push(o.recv(o.ptr, o.len, *root));
            }
        }
        CommOp::AllToAll { input, output } => {
            let (i, o) = operands(input, output)?;
            o.expect_len(i.len, 1)?;
            if i.len % n != 0 {
                return Err(format!(
                    "the input's {} elements do not split into {n} equal pieces",
                    i.len
                ));
            }
            same_type(&i, &o)?;
            let piece = i.len / n;
            for j in (0..n).filter(|&j| j != index) {
                plan.calls.push(i.send(i.piece(j, piece)?, piece, j));
            }
            for j in (0..n).filter(|&j| j != index) {
                plan.calls.push(o.recv(o.piece(j, piece)?, piece, j));
            }
            plan.copy(&o, index, &i, index, piece)?;
        }
        CommOp::CollectivePermute {
            input,
            output,
            send_to,
            recv_from,
        } => {
            let (i, o) = operands(input, output)?;
            same_type(&i, &o)?;
            match (*send_to == index, *recv_from == index) {
                (true, true) => {
                    o.expect_len(i.len, 1)?;
                    plan.copy(&o, 0, &i, 0, i.len)?;
                }
                (true, false) => {
                    return Err(format!(
                        "member {index} sends to itself but receives from member {recv_from}"
                    ));
                }
                (false, true) => {
                    return Err(format!(
                        "member {index} receives from itself but sends to member {send_to}"
                    ));
                }
                (false, false) => {
                    plan.calls.push(i.send(i.ptr, i.len, *send_to));
                    plan.calls.push(o.recv(o.ptr, o.len, *recv_from));
                }
            }
        }
    }
    plan.drop_empty_calls();
    Ok(plan)
}

/// What `rank` issues for a point-to-point group in a world of `world` ranks: every send,
/// then every receive, on the world communicator. Transfers of a rank to itself are paired
/// in order within the group and become copies.
pub(super) fn plan_p2p<B: DeviceBuffer>(
    rank: usize,
    world: usize,
    ops: &[P2p<B>],
) -> Result<Plan, String> {
    let mut plan = Plan::default();
    let mut recvs = Vec::new();
    let mut self_sends = Vec::new();
    let mut self_recvs = Vec::new();
    for op in ops {
        let (P2p::Send { peer, .. } | P2p::Recv { peer, .. }) = op;
        if *peer >= world {
            return Err(format!("rank {peer} is outside the world of {world} ranks"));
        }
    }
    for op in ops {
        match op {
            P2p::Send { peer, buffer } => {
                let b = Operand::new(format!("buffer sent to rank {peer}"), buffer)?;
                if *peer == rank {
                    self_sends.push(b);
                } else {
                    plan.calls.push(b.send(b.ptr, b.len, *peer));
                }
            }
            P2p::Recv { peer, buffer } => {
                let b = Operand::new(format!("buffer received from rank {peer}"), buffer)?;
                if *peer == rank {
                    self_recvs.push(b);
                } else {
                    recvs.push(b.recv(b.ptr, b.len, *peer));
                }
            }
        }
    }
    plan.calls.extend(recvs);
    if self_sends.len() != self_recvs.len() {
        return Err(format!(
            "rank {rank} sends to itself {} time(s) but receives from itself {} time(s) in \
             this group; a transfer to itself must be matched within one group",
            self_sends.len(),
            self_recvs.len()
        ));
    }
    for (send, recv) in self_sends.iter().zip(&self_recvs) {
        if send.dtype != recv.dtype {
            return Err(format!(
                "rank {rank} sends {} data to itself but receives into {}",
                send.dtype, recv.dtype
            ));
        }
        if send.len != recv.len {
            return Err(format!(
                "rank {rank} sends {} elements to itself but receives {}",
                send.len, recv.len
            ));
        }
        plan.copy(recv, 0, send, 0, send.len)?;
    }
    plan.drop_empty_calls();
    Ok(plan)
}

#[cfg(test)]
mod tests;
