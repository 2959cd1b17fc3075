//! Copy-engine transfers between the GPUs of one process: allgathers and point-to-point
//! sends/receives done as peer-to-peer copies (the GPUs' copy engines over NVLink) instead of
//! NCCL kernels, so no SM is taken from the GEMMs they overlap with; every other operation
//! goes to the wrapped NCCL communicator.
//!
//! Ranks are threads of one process sharing a [`PeerHub`]. A transfer is pulled by its
//! receiver: the sender *offers* its buffer (address, GPU, and an event recorded on its stream
//! when the data is ready); the receiver's stream waits for that event, copies, and records a
//! *done* event; the sender's stream waits for every done event of its offers before it goes
//! on, so it never overwrites or frees a buffer a peer is still reading. Offers between two
//! ranks are matched by order (the n-th send from `a` to `b` meets the n-th receive of `b`
//! from `a`), which holds because every rank posts its operations in program order. Each rank
//! makes every offer of a post before it waits for anything, so posts cannot deadlock; every
//! host wait is bounded by the timeout and names the peer it waited for.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weave_cuda::cudarc::driver::CudaEvent;
use weave_cuda::{Gpu, GpuStream};

use crate::communicator::{Collective, CommOp, Communicator, P2p};
use crate::error::CommError;
use crate::nccl::{DeviceBuffer, Nccl};

/// What a sender offers.
struct Offer {
    ptr: u64,
    bytes: usize,
    gpu: Gpu,
    ready: Arc<CudaEvent>,
}

/// A transfer's key: (sender, receiver, sequence number of the pair).
type Key = (usize, usize, u64);

/// One transfer's state in a hub: the sender's offer, then the receiver's done mark.
struct Slot<O, D> {
    offer: Option<O>,
    done: Option<D>,
}

impl<O, D> Default for Slot<O, D> {
    fn default() -> Self {
        Slot {
            offer: None,
            done: None,
        }
    }
}

/// Transfers in flight between the threads of one process, by [`Key`].
struct Hub<O, D> {
    slots: Mutex<HashMap<Key, Slot<O, D>>>,
    aborted: AtomicBool,
}

impl<O, D> Default for Hub<O, D> {
    fn default() -> Self {
        Hub {
            slots: Mutex::new(HashMap::new()),
            aborted: AtomicBool::new(false),
        }
    }
}

impl<O, D> Hub<O, D> {
    fn with_slot<T>(&self, key: Key, f: impl FnOnce(&mut Slot<O, D>) -> T) -> T {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        f(slots.entry(key).or_default())
    }

    fn remove(&self, key: Key) {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
    }

    /// Polls `ready` on the slot of `key` until it gives a value, for at most `timeout`;
    /// `None` after the timeout or once the hub is aborted (polling with a [`weave_cuda::Backoff`]).
    fn wait_for<T>(
        &self,
        key: Key,
        timeout: Duration,
        mut ready: impl FnMut(&mut Slot<O, D>) -> Option<T>,
    ) -> Option<T> {
        let start = Instant::now();
        let mut backoff = weave_cuda::Backoff::new();
        loop {
            if let Some(v) = self.with_slot(key, &mut ready) {
                return Some(v);
            }
            if self.aborted.load(Ordering::Acquire) || start.elapsed() >= timeout {
                return None;
            }
            backoff.pause();
        }
    }
}

/// Numbers the sends (`to` ranks) and receives (`from` ranks) of one post by the sequence of
/// their pair, advancing `counts` (sends so far to each rank, receives so far from each).
fn number_transfers(
    me: usize,
    counts: &mut (Vec<u64>, Vec<u64>),
    sends: &[usize],
    recvs: &[usize],
) -> (Vec<Key>, Vec<Key>) {
    let s = sends
        .iter()
        .map(|&to| {
            counts.0[to] += 1;
            (me, to, counts.0[to] - 1)
        })
        .collect();
    let r = recvs
        .iter()
        .map(|&from| {
            counts.1[from] += 1;
            (from, me, counts.1[from] - 1)
        })
        .collect();
    (s, r)
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

/// What the copy engines do for one operation of one rank: copies within its own memory
/// (its block of an allgather, sends to itself), and sends `(to, address, bytes)` and
/// receives `(from, address, bytes)` between ranks.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Transfers {
    pub local: Vec<(u64, u64, usize)>,
    pub sends: Vec<(usize, u64, usize)>,
    pub recvs: Vec<(usize, u64, usize)>,
}

impl Transfers {
    /// Enqueues the local copies on `stream`.
    pub fn copy_local(&self, gpu: &Gpu, stream: &GpuStream) -> Result<(), CommError> {
        for &(dst, src, bytes) in &self.local {
            gpu.copy(dst, src, bytes, stream)?;
        }
        Ok(())
    }
}

/// The transfers of an allgather that `me` is a member of, over contiguous buffers whose
/// output holds every member's input; `None` for anything else (it goes to NCCL).
pub(crate) fn allgather_transfers<B: DeviceBuffer>(
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
pub(crate) fn p2p_transfers<B: DeviceBuffer>(
    me: usize,
    ops: &[P2p<B>],
) -> Result<Option<Transfers>, String> {
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

/// Posts `collective` through `copy` when it is an allgather the copy engines can do (see
/// [`allgather_transfers`]), else on `inner`: the `post` of the copy-engine communicators.
pub(crate) fn post_collective<B: DeviceBuffer>(
    inner: &Nccl<B>,
    collective: Collective<B>,
    stream: &GpuStream,
    copy: impl FnOnce(&str, &Transfers) -> Result<(), CommError>,
) -> Result<(), CommError> {
    match allgather_transfers(inner.rank(), &collective) {
        Some(t) => copy(&collective.label, &t),
        None => inner.post(collective, stream),
    }
}

/// Posts a send/recv group through `copy` when its buffers are contiguous (see
/// [`p2p_transfers`]), else on `inner`: the `post_p2p` of the copy-engine communicators.
pub(crate) fn post_group<B: DeviceBuffer>(
    inner: &Nccl<B>,
    label: String,
    ops: Vec<P2p<B>>,
    stream: &GpuStream,
    copy: impl FnOnce(&str, &Transfers) -> Result<(), CommError>,
) -> Result<(), CommError> {
    match p2p_transfers(inner.rank(), &ops) {
        Ok(Some(t)) => copy(&label, &t),
        Ok(None) => inner.post_p2p(label, ops, stream),
        Err(m) => Err(copy_error(inner.rank(), &label, m)),
    }
}

/// The meeting place of the ranks (threads) of one process: share one between their
/// [`PeerCopy`] communicators.
#[derive(Default)]
pub struct PeerHub {
    hub: Hub<Offer, Arc<CudaEvent>>,
}

impl PeerHub {
    /// A hub for the ranks of this process.
    pub fn new() -> Arc<PeerHub> {
        Arc::new(PeerHub::default())
    }
}

/// An NCCL communicator whose allgathers and point-to-point transfers use the copy engines.
pub struct PeerCopy<B> {
    inner: Arc<Nccl<B>>,
    hub: Arc<PeerHub>,
    gpu: Gpu,
    /// Sends to / receives from each peer so far.
    counts: Mutex<(Vec<u64>, Vec<u64>)>,
}

impl<B: DeviceBuffer> PeerCopy<B> {
    /// Wraps `inner` (this rank's communicator on `gpu`), meeting the other ranks at `hub`.
    pub fn new(inner: Arc<Nccl<B>>, hub: Arc<PeerHub>, gpu: Gpu) -> PeerCopy<B> {
        let n = inner.size();
        PeerCopy {
            inner,
            hub,
            gpu,
            counts: Mutex::new((vec![0; n], vec![0; n])),
        }
    }

    /// The wrapped communicator.
    pub fn inner(&self) -> &Arc<Nccl<B>> {
        &self.inner
    }

    fn timed_out(&self, label: &str, peer: usize, waited: Duration) -> CommError {
        CommError::Timeout {
            op: format!("{label} (copy-engine transfer)"),
            rank: self.inner.rank(),
            waiting_for: vec![peer],
            millis: waited.as_millis() as u64,
        }
    }

    /// Posts `t` on `stream`: its local copies, then its sends and receives as peer copies.
    fn transfer(&self, label: &str, t: &Transfers, stream: &GpuStream) -> Result<(), CommError> {
        t.copy_local(&self.gpu, stream)?;
        let (sends, recvs) = (&t.sends, &t.recvs);
        let me = self.inner.rank();
        let timeout = self.inner.timeout();
        // Number every transfer of this post by its pair's sequence.
        let (send_keys, recv_keys) = {
            let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            let to: Vec<usize> = sends.iter().map(|s| s.0).collect();
            let from: Vec<usize> = recvs.iter().map(|r| r.0).collect();
            number_transfers(me, &mut c, &to, &from)
        };
        // Offer every send first.
        if !sends.is_empty() {
            let ready = Arc::new(self.gpu.new_event(false)?);
            stream.record(&ready)?;
            for ((_, ptr, bytes), key) in sends.iter().zip(&send_keys) {
                let offer = Offer {
                    ptr: *ptr,
                    bytes: *bytes,
                    gpu: self.gpu.clone(),
                    ready: ready.clone(),
                };
                self.hub
                    .hub
                    .with_slot(*key, |slot| slot.offer = Some(offer));
            }
        }
        // Pull every receive.
        for ((from, dst, want), key) in recvs.iter().zip(&recv_keys) {
            let offer = self
                .hub
                .hub
                .wait_for(*key, timeout, |slot| {
                    slot.offer
                        .as_ref()
                        .map(|o| (o.ptr, o.bytes, o.gpu.clone(), o.ready.clone()))
                })
                .ok_or_else(|| self.timed_out(label, *from, timeout))?;
            let (ptr, bytes, gpu, ready) = offer;
            let want = *want;
            if bytes != want {
                return Err(copy_error(
                    me,
                    label,
                    format!("rank {from} sends {bytes} bytes but {want} are received"),
                ));
            }
            if gpu.ordinal() != self.gpu.ordinal() {
                self.gpu.enable_peer_access(&gpu)?;
            }
            stream.wait(&ready)?;
            self.gpu.copy_peer(*dst, &gpu, ptr, bytes, stream)?;
            let done = Arc::new(self.gpu.new_event(false)?);
            stream.record(&done)?;
            self.hub.hub.with_slot(*key, |slot| slot.done = Some(done));
        }
        // Wait (on the stream) until every receiver of our offers has its copy.
        for ((to, _, _), key) in sends.iter().zip(&send_keys) {
            let done = self
                .hub
                .hub
                .wait_for(*key, timeout, |slot| slot.done.clone())
                .ok_or_else(|| self.timed_out(label, *to, timeout))?;
            stream.wait(&done)?;
            self.hub.hub.remove(*key);
        }
        Ok(())
    }
}

impl<B: DeviceBuffer + Clone> Communicator for PeerCopy<B> {
    type Buffer = B;
    type Stream = GpuStream;

    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }

    fn post(&self, collective: Collective<B>, stream: &GpuStream) -> Result<(), CommError> {
        post_collective(&self.inner, collective, stream, |label, t| {
            self.transfer(label, t, stream)
        })
    }

    fn post_p2p(
        &self,
        label: String,
        ops: Vec<P2p<B>>,
        stream: &GpuStream,
    ) -> Result<(), CommError> {
        post_group(&self.inner, label, ops, stream, |label, t| {
            self.transfer(label, t, stream)
        })
    }

    fn abort(&self, reason: &str) {
        self.hub.hub.aborted.store(true, Ordering::Release);
        self.inner.abort(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfers_between_a_pair_are_numbered_in_posting_order() {
        let mut counts = (vec![0; 3], vec![0; 3]);
        // Rank 1 sends to 0 and 2 and receives from 2, then sends to 2 and receives from 2
        // and 0.
        let (s, r) = number_transfers(1, &mut counts, &[0, 2], &[2]);
        assert_eq!(s, vec![(1, 0, 0), (1, 2, 0)]);
        assert_eq!(r, vec![(2, 1, 0)]);
        let (s, r) = number_transfers(1, &mut counts, &[2], &[2, 0]);
        assert_eq!(s, vec![(1, 2, 1)]);
        assert_eq!(r, vec![(2, 1, 1), (0, 1, 0)]);
        // Rank 2's receives from 1 meet rank 1's sends to 2: (1, 2, n).
        let mut other = (vec![0; 3], vec![0; 3]);
        let (_, r) = number_transfers(2, &mut other, &[], &[1, 1]);
        assert_eq!(r, vec![(1, 2, 0), (1, 2, 1)]);
    }

    #[test]
    fn sends_to_itself_must_meet_receives_of_the_same_sizes() {
        assert_eq!(pair_self(&[8, 16], &[8, 16]), Ok(()));
        assert_eq!(
            pair_self(&[8], &[]).unwrap_err(),
            "1 send(s) to itself but 0 receive(s) from itself"
        );
        assert_eq!(
            pair_self(&[8], &[4]).unwrap_err(),
            "it sends itself 8 bytes but receives 4"
        );
    }

    /// A device buffer by address only.
    #[derive(Clone, Debug)]
    struct Buf {
        ptr: u64,
        len: usize,
        contiguous: bool,
    }

    impl DeviceBuffer for Buf {
        fn device_ptr(&self) -> u64 {
            self.ptr
        }
        fn len(&self) -> usize {
            self.len
        }
        fn data_type(&self) -> crate::DataType {
            crate::DataType::Bf16
        }
        fn is_contiguous(&self) -> bool {
            self.contiguous
        }
    }

    fn buf(ptr: u64, len: usize) -> Buf {
        Buf {
            ptr,
            len,
            contiguous: true,
        }
    }

    #[test]
    fn an_allgather_sends_its_input_and_receives_each_block_in_team_order() {
        // Rank 2 of team [3, 2, 0]: 100 bf16 elements (200 bytes) each.
        let gather = |input: Buf, output: Buf| Collective {
            label: "ag".into(),
            team: vec![3, 2, 0],
            op: CommOp::Allgather { input, output },
        };
        let t = allgather_transfers(2, &gather(buf(0x100, 100), buf(0x1000, 300))).unwrap();
        assert_eq!(t.local, vec![(0x1000 + 200, 0x100, 200)]);
        assert_eq!(t.sends, vec![(3, 0x100, 200), (0, 0x100, 200)]);
        assert_eq!(t.recvs, vec![(3, 0x1000, 200), (0, 0x1000 + 400, 200)]);
        // Outside the team, a strided buffer or an output of the wrong size: NCCL moves it.
        assert!(allgather_transfers(1, &gather(buf(0, 100), buf(0, 300))).is_none());
        let strided = Buf {
            contiguous: false,
            ..buf(0, 100)
        };
        assert!(allgather_transfers(2, &gather(strided, buf(0, 300))).is_none());
        assert!(allgather_transfers(2, &gather(buf(0, 100), buf(0, 200))).is_none());
    }

    #[test]
    fn a_group_pairs_sends_to_itself_with_receives_from_itself() {
        let ops = vec![
            P2p::Send {
                peer: 1,
                buffer: buf(0x10, 4),
            },
            P2p::Send {
                peer: 0,
                buffer: buf(0x20, 8),
            },
            P2p::Recv {
                peer: 0,
                buffer: buf(0x30, 8),
            },
            P2p::Recv {
                peer: 2,
                buffer: buf(0x40, 4),
            },
        ];
        let t = p2p_transfers(0, &ops).unwrap().unwrap();
        assert_eq!(t.local, vec![(0x30, 0x20, 16)]);
        assert_eq!(t.sends, vec![(1, 0x10, 8)]);
        assert_eq!(t.recvs, vec![(2, 0x40, 8)]);
        let unmatched = vec![P2p::Send {
            peer: 0,
            buffer: buf(0x20, 8),
        }];
        assert_eq!(
            p2p_transfers(0, &unmatched).unwrap_err(),
            "1 send(s) to itself but 0 receive(s) from itself"
        );
        let strided = vec![P2p::Recv {
            peer: 1,
            buffer: Buf {
                contiguous: false,
                ..buf(0, 4)
            },
        }];
        assert!(p2p_transfers(0, &strided).unwrap().is_none());
    }

    #[test]
    fn a_receiver_gets_another_threads_offer_and_the_sender_its_done_mark() {
        let hub: Arc<Hub<u64, u32>> = Arc::new(Hub::default());
        let key = (0, 1, 0);
        let sender = {
            let hub = hub.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(5));
                hub.with_slot(key, |s| s.offer = Some(0xabc));
                let done = hub.wait_for(key, Duration::from_secs(5), |s| s.done);
                hub.remove(key);
                done
            })
        };
        let got = hub.wait_for(key, Duration::from_secs(5), |s| s.offer);
        assert_eq!(got, Some(0xabc));
        hub.with_slot(key, |s| s.done = Some(7));
        assert_eq!(sender.join().unwrap(), Some(7));
        assert!(hub.slots.lock().unwrap().is_empty(), "the sender cleans up");
    }

    #[test]
    fn waits_end_at_the_timeout_or_at_once_when_aborted() {
        let hub: Hub<u64, u32> = Hub::default();
        let start = Instant::now();
        assert_eq!(
            hub.wait_for((0, 1, 0), Duration::from_millis(20), |s| s.offer),
            None
        );
        assert!(start.elapsed() >= Duration::from_millis(20));
        hub.aborted.store(true, Ordering::Release);
        let start = Instant::now();
        assert_eq!(
            hub.wait_for((0, 1, 1), Duration::from_secs(30), |s| s.offer),
            None
        );
        assert!(start.elapsed() < Duration::from_secs(1));
    }
}
