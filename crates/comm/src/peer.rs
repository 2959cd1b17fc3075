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

/// One transfer's state in the hub.
#[derive(Default)]
struct Slot {
    offer: Option<Offer>,
    done: Option<Arc<CudaEvent>>,
}

/// The meeting place of the ranks of one process: transfers keyed by (sender, receiver,
/// sequence number of the pair).
#[derive(Default)]
pub struct PeerHub {
    slots: Mutex<HashMap<(usize, usize, u64), Slot>>,
    aborted: AtomicBool,
}

impl PeerHub {
    /// A hub for the ranks of this process.
    pub fn new() -> Arc<PeerHub> {
        Arc::new(PeerHub::default())
    }

    /// Polls `ready` on the slot of `key` until it gives a value, for at most `timeout`.
    fn wait_for<T>(
        &self,
        key: (usize, usize, u64),
        timeout: Duration,
        mut ready: impl FnMut(&mut Slot) -> Option<T>,
    ) -> Option<T> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            {
                let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(v) = ready(slots.entry(key).or_default()) {
                    return Some(v);
                }
            }
            if self.aborted.load(Ordering::Acquire) || start.elapsed() >= timeout {
                return None;
            }
            spins += 1;
            if spins < 2000 {
                std::hint::spin_loop();
            } else if spins < 6000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
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

    fn fail(&self, label: &str, message: String) -> CommError {
        CommError::Backend {
            op: label.to_string(),
            message: format!("rank {}: {message}", self.inner.rank()),
        }
    }

    fn timed_out(&self, label: &str, peer: usize, waited: Duration) -> CommError {
        CommError::Timeout {
            op: format!("{label} (copy-engine transfer)"),
            rank: self.inner.rank(),
            waiting_for: vec![peer],
            millis: waited.as_millis() as u64,
        }
    }

    /// Posts sends `(to, address, bytes)` and receives `(from, address, bytes)` as peer copies
    /// on `stream`.
    fn transfer(
        &self,
        label: &str,
        sends: &[(usize, u64, usize)],
        recvs: &[(usize, u64, usize)],
        stream: &GpuStream,
    ) -> Result<(), CommError> {
        let me = self.inner.rank();
        let timeout = self.inner.timeout();
        // Number every transfer of this post by its pair's sequence.
        let (send_keys, recv_keys): (Vec<_>, Vec<_>) = {
            let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            let s = sends
                .iter()
                .map(|(to, _, _)| {
                    c.0[*to] += 1;
                    (me, *to, c.0[*to] - 1)
                })
                .collect();
            let r = recvs
                .iter()
                .map(|(from, _, _)| {
                    c.1[*from] += 1;
                    (*from, me, c.1[*from] - 1)
                })
                .collect();
            (s, r)
        };
        // Offer every send first.
        if !sends.is_empty() {
            let ready = Arc::new(self.gpu.new_event(false)?);
            stream.record(&ready)?;
            let mut slots = self.hub.slots.lock().unwrap_or_else(|e| e.into_inner());
            for ((_, ptr, bytes), key) in sends.iter().zip(&send_keys) {
                slots.entry(*key).or_default().offer = Some(Offer {
                    ptr: *ptr,
                    bytes: *bytes,
                    gpu: self.gpu.clone(),
                    ready: ready.clone(),
                });
            }
        }
        // Pull every receive.
        for ((from, dst, want), key) in recvs.iter().zip(&recv_keys) {
            let offer = self
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
                return Err(self.fail(
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
            let mut slots = self.hub.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.entry(*key).or_default().done = Some(done);
        }
        // Wait (on the stream) until every receiver of our offers has its copy.
        for ((to, _, _), key) in sends.iter().zip(&send_keys) {
            let done = self
                .hub
                .wait_for(*key, timeout, |slot| slot.done.clone())
                .ok_or_else(|| self.timed_out(label, *to, timeout))?;
            stream.wait(&done)?;
            self.hub
                .slots
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(key);
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
        let me = self.inner.rank();
        match &collective.op {
            CommOp::Allgather { input, output }
                if collective.team.contains(&me)
                    && input.is_contiguous()
                    && output.is_contiguous()
                    && output.len() == input.len() * collective.team.len() =>
            {
                let bytes = input.len() * input.data_type().size();
                let block = |i: usize| output.device_ptr() + (i * bytes) as u64;
                let mut sends = Vec::new();
                let mut recvs = Vec::new();
                for (i, &p) in collective.team.iter().enumerate() {
                    if p == me {
                        // The local block.
                        self.gpu.copy(block(i), input.device_ptr(), bytes, stream)?;
                    } else {
                        sends.push((p, input.device_ptr(), bytes));
                        recvs.push((p, block(i), bytes));
                    }
                }
                self.transfer(&collective.label, &sends, &recvs, stream)
            }
            _ => self.inner.post(collective, stream),
        }
    }

    fn post_p2p(
        &self,
        label: String,
        ops: Vec<P2p<B>>,
        stream: &GpuStream,
    ) -> Result<(), CommError> {
        if ops.iter().any(|op| match op {
            P2p::Send { buffer, .. } | P2p::Recv { buffer, .. } => !buffer.is_contiguous(),
        }) {
            return self.inner.post_p2p(label, ops, stream);
        }
        let me = self.inner.rank();
        let bytes = |b: &B| b.len() * b.data_type().size();
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        let mut to_self = Vec::new();
        let mut from_self = Vec::new();
        for op in &ops {
            match op {
                P2p::Send { peer, buffer } if *peer == me => to_self.push(buffer),
                P2p::Recv { peer, buffer } if *peer == me => from_self.push(buffer),
                P2p::Send { peer, buffer } => {
                    sends.push((*peer, buffer.device_ptr(), bytes(buffer)))
                }
                P2p::Recv { peer, buffer } => {
                    recvs.push((*peer, buffer.device_ptr(), bytes(buffer)))
                }
            }
        }
        // A rank's sends to itself meet its receives from itself, in order: local copies.
        if to_self.len() != from_self.len() {
            return Err(self.fail(
                &label,
                format!(
                    "{} send(s) to itself but {} receive(s) from itself",
                    to_self.len(),
                    from_self.len()
                ),
            ));
        }
        for (s, r) in to_self.into_iter().zip(from_self) {
            if bytes(s) != bytes(r) {
                return Err(self.fail(
                    &label,
                    format!(
                        "it sends itself {} bytes but receives {}",
                        bytes(s),
                        bytes(r)
                    ),
                ));
            }
            self.gpu
                .copy(r.device_ptr(), s.device_ptr(), bytes(s), stream)?;
        }
        self.transfer(&label, &sends, &recvs, stream)
    }

    fn abort(&self, reason: &str) {
        self.hub.aborted.store(true, Ordering::Release);
        self.inner.abort(reason);
    }
}
