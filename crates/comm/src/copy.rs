//! The copy-engine communicator: one [`Communicator`] that moves allgathers and
//! point-to-point transfers over contiguous buffers with the GPUs' copy engines (no SM taken
//! from the compute they overlap) and hands every other operation to the communicator it
//! wraps (NCCL).
//!
//! How the bytes travel is the [`CopyTransport`]'s business; the communicator decides what
//! travels. Two transports exist:
//!
//! * [`crate::peer::PeerTransport`]: peer copies pulled by the receiver between the threads
//!   of one process, meeting at a [`crate::PeerHub`] ([`crate::PeerCopy`]);
//! * [`crate::ipc::IpcTransport`]: pushes into receive windows that ranks share through CUDA
//!   IPC handles, between processes of one host or threads ([`crate::IpcCopy`]).

use std::sync::Arc;
use std::time::Duration;

use crate::communicator::{Collective, CommOp, Communicator, P2p};
use crate::error::CommError;
use crate::nccl::DeviceBuffer;

/// What the copy engines do for one operation of one rank: copies within its own memory
/// (its block of an allgather, sends to itself), and sends `(to, address, bytes)` and
/// receives `(from, address, bytes)` between ranks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transfers {
    /// `(destination, source, bytes)` copies within this rank's memory.
    pub local: Vec<(u64, u64, usize)>,
    /// `(to, address, bytes)`: the bytes at `address` go to rank `to`.
    pub sends: Vec<(usize, u64, usize)>,
    /// `(from, address, bytes)`: the bytes rank `from` sends land at `address`.
    pub recvs: Vec<(usize, u64, usize)>,
}

impl Transfers {
    /// The bytes this rank moves: its local copies, sends and receives.
    pub fn bytes(&self) -> usize {
        let local: usize = self.local.iter().map(|c| c.2).sum();
        let sent: usize = self.sends.iter().map(|s| s.2).sum();
        let received: usize = self.recvs.iter().map(|r| r.2).sum();
        local + sent + received
    }
}

/// How a copy-engine communicator moves the bytes of the operations it takes over.
///
/// A transport enqueues work on the caller's stream; like every post, it must not block
/// longer than the communicator's timeout, and every rank enqueues its transfers in program
/// order (pairs of ranks match their transfers by that order).
pub trait CopyTransport: Send + Sync {
    /// The streams it enqueues on.
    type Stream: ?Sized;

    /// Enqueues the transfers `t` of rank `me` for operation `label` on `stream`: the local
    /// copies, then the sends and receives. `timeout` bounds every host wait.
    fn transfer(
        &self,
        me: usize,
        label: &str,
        t: &Transfers,
        stream: &Self::Stream,
        timeout: Duration,
    ) -> Result<(), CommError>;

    /// The rank fails: host waits of this transport end at once from now on.
    fn abort(&self) {}
}

/// A communicator whose allgathers and point-to-point transfers over contiguous buffers go
/// through the copy-engine transport `T`, everything else through `C` (see the module
/// documentation).
pub struct CopyComm<T, C> {
    inner: Arc<C>,
    transport: T,
}

impl<T, C> CopyComm<T, C> {
    /// Wraps `inner`, moving copy-engine transfers through `transport`.
    pub fn with_transport(inner: Arc<C>, transport: T) -> CopyComm<T, C> {
        CopyComm { inner, transport }
    }

    /// The wrapped communicator.
    pub fn inner(&self) -> &Arc<C> {
        &self.inner
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }
}

impl<T, C> Communicator for CopyComm<T, C>
where
    C: Communicator,
    C::Buffer: DeviceBuffer,
    T: CopyTransport<Stream = C::Stream>,
{
    type Buffer = C::Buffer;
    type Stream = C::Stream;

    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }

    fn post(&self, collective: Collective<C::Buffer>, stream: &C::Stream) -> Result<(), CommError> {
        let me = self.rank();
        match allgather_transfers(me, &collective) {
            Some(t) => {
                let _span = tracing::debug_span!(
                    "copy_engine",
                    rank = me,
                    op = collective.op.name(),
                    label = %collective.label,
                    team = ?collective.team,
                    bytes = t.bytes(),
                )
                .entered();
                self.transport
                    .transfer(me, &collective.label, &t, stream, self.timeout())
            }
            None => self.inner.post(collective, stream),
        }
    }

    fn post_p2p(
        &self,
        label: String,
        ops: Vec<P2p<C::Buffer>>,
        stream: &C::Stream,
    ) -> Result<(), CommError> {
        let me = self.rank();
        match p2p_transfers(me, &ops) {
            Ok(Some(t)) => {
                let _span = tracing::debug_span!(
                    "copy_engine",
                    rank = me,
                    op = "p2p",
                    label = %label,
                    bytes = t.bytes(),
                )
                .entered();
                self.transport
                    .transfer(me, &label, &t, stream, self.timeout())
            }
            Ok(None) => self.inner.post_p2p(label, ops, stream),
            Err(m) => Err(copy_error(me, &label, m)),
        }
    }

    fn abort(&self, reason: &str) {
        self.transport.abort();
        self.inner.abort(reason);
    }
}

/// Checks that a rank's sends to itself meet its receives from itself, in order and by size
/// in bytes: they become local copies.
fn pair_self(to_self: &[usize], from_self: &[usize]) -> Result<(), String> {
    if to_self.len() != from_self.len() {
        return Err(format!(
            "{} send(s) to itself but {} receive(s) from itself",
            to_self.len(),
            from_self.len()
        ));
    }
    for (s, r) in to_self.iter().zip(from_self) {
        if s != r {
            return Err(format!("it sends itself {s} bytes but receives {r}"));
        }
    }
    Ok(())
}

/// The transfers of an allgather that `me` is a member of, over contiguous buffers whose
/// output holds every member's input; `None` for anything else (it goes to NCCL).
fn allgather_transfers<B: DeviceBuffer>(
    me: usize,
    collective: &Collective<B>,
) -> Option<Transfers> {
    let CommOp::Allgather { input, output } = &collective.op else {
        return None;
    };
    if !collective.team.contains(&me)
        || !input.is_contiguous()
        || !output.is_contiguous()
        || output.len() != input.len() * collective.team.len()
    {
        return None;
    }
    let bytes = input.len() * input.data_type().size();
    let block = |i: usize| output.device_ptr() + (i * bytes) as u64;
    let mut t = Transfers::default();
    for (i, &p) in collective.team.iter().enumerate() {
        if p == me {
            t.local.push((block(i), input.device_ptr(), bytes));
        } else {
            t.sends.push((p, input.device_ptr(), bytes));
            t.recvs.push((p, block(i), bytes));
        }
    }
    Some(t)
}

/// The transfers of a group of sends and receives of `me` over contiguous buffers (`None`
/// when a buffer is not contiguous: NCCL moves it); sends to itself meet receives from
/// itself in order and become local copies, an error when their count or sizes differ.
fn p2p_transfers<B: DeviceBuffer>(me: usize, ops: &[P2p<B>]) -> Result<Option<Transfers>, String> {
    if ops.iter().any(|op| match op {
        P2p::Send { buffer, .. } | P2p::Recv { buffer, .. } => !buffer.is_contiguous(),
    }) {
        return Ok(None);
    }
    let bytes = |b: &B| b.len() * b.data_type().size();
    let mut t = Transfers::default();
    let mut to_self = Vec::new();
    let mut from_self = Vec::new();
    for op in ops {
        match op {
            P2p::Send { peer, buffer } if *peer == me => to_self.push(buffer),
            P2p::Recv { peer, buffer } if *peer == me => from_self.push(buffer),
            P2p::Send { peer, buffer } => t.sends.push((*peer, buffer.device_ptr(), bytes(buffer))),
            P2p::Recv { peer, buffer } => t.recvs.push((*peer, buffer.device_ptr(), bytes(buffer))),
        }
    }
    let sizes = |v: &[&B]| v.iter().map(|b| bytes(b)).collect::<Vec<usize>>();
    pair_self(&sizes(&to_self), &sizes(&from_self))?;
    for (s, r) in to_self.into_iter().zip(from_self) {
        t.local.push((r.device_ptr(), s.device_ptr(), bytes(s)));
    }
    Ok(Some(t))
}

/// A copy-engine failure of `label` on `rank`.
pub(crate) fn copy_error(rank: usize, label: &str, message: String) -> CommError {
    CommError::Backend {
        op: label.to_string(),
        message: format!("rank {rank}: {message}"),
    }
}

#[cfg(test)]
mod tests;
