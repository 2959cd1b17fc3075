//! Copy-engine transfers between the GPUs of one process: allgathers and point-to-point
//! sends/receives done as peer-to-peer copies (the GPUs' copy engines over NVLink) instead of
//! NCCL kernels, so no SM is taken from the GEMMs they overlap with: the [`PeerTransport`]
//! of the copy-engine communicator ([`crate::copy`]), which hands every other operation to
//! the wrapped NCCL communicator.
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

use crate::communicator::Communicator;
use crate::copy::{copy_error, CopyComm, CopyTransport, Transfers};
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
        .map(|&to| (me, to, advance(&mut counts.0, to)))
        .collect();
    let r = recvs
        .iter()
        .map(|&from| (from, me, advance(&mut counts.1, from)))
        .collect();
    (s, r)
}

/// The count of `rank` in `counts` before this transfer, which it advances.
fn advance(counts: &mut [u64], rank: usize) -> u64 {
    counts[rank] += 1;
    counts[rank] - 1
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

/// Peer copies pulled by the receiver between the threads of one process (see the module
/// documentation): the [`CopyTransport`] of [`PeerCopy`].
pub struct PeerTransport {
    hub: Arc<PeerHub>,
    gpu: Gpu,
    /// Sends to / receives from each peer so far.
    counts: Mutex<(Vec<u64>, Vec<u64>)>,
}

/// An NCCL communicator whose allgathers and point-to-point transfers are peer copies
/// between the threads of one process.
pub type PeerCopy<B> = CopyComm<PeerTransport, Nccl<B>>;

impl PeerTransport {
    /// The transport of a rank on `gpu` in a world of `ranks`, meeting the other ranks at
    /// `hub`.
    pub fn new(hub: Arc<PeerHub>, gpu: Gpu, ranks: usize) -> PeerTransport {
        PeerTransport {
            hub,
            gpu,
            counts: Mutex::new((vec![0; ranks], vec![0; ranks])),
        }
    }
}

impl<B: DeviceBuffer> CopyComm<PeerTransport, Nccl<B>> {
    /// Wraps `inner` (this rank's communicator on `gpu`), meeting the other ranks at `hub`.
    pub fn new(inner: Arc<Nccl<B>>, hub: Arc<PeerHub>, gpu: Gpu) -> PeerCopy<B> {
        let transport = PeerTransport::new(hub, gpu, inner.size());
        CopyComm::with_transport(inner, transport)
    }
}

fn timed_out(me: usize, label: &str, peer: usize, waited: Duration) -> CommError {
    CommError::Timeout {
        op: format!("{label} (copy-engine transfer)"),
        rank: me,
        waiting_for: vec![peer],
        millis: waited.as_millis() as u64,
    }
}

impl CopyTransport for PeerTransport {
    type Stream = GpuStream;

    /// Posts `t` on `stream`: its local copies, then its sends and receives as peer copies.
    fn transfer(
        &self,
        me: usize,
        label: &str,
        t: &Transfers,
        stream: &GpuStream,
        timeout: Duration,
    ) -> Result<(), CommError> {
        for &(dst, src, bytes) in &t.local {
            self.gpu.copy(dst, src, bytes, stream)?;
        }
        let (sends, recvs) = (&t.sends, &t.recvs);
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
            let offer = {
                let _wait = tracing::debug_span!("wait_offer", rank = me, peer = *from).entered();
                self.hub.hub.wait_for(*key, timeout, |slot| {
                    slot.offer
                        .as_ref()
                        .map(|o| (o.ptr, o.bytes, o.gpu.clone(), o.ready.clone()))
                })
            }
            .ok_or_else(|| timed_out(me, label, *from, timeout))?;
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
            let done = {
                let _wait = tracing::debug_span!("wait_done", rank = me, peer = *to).entered();
                self.hub
                    .hub
                    .wait_for(*key, timeout, |slot| slot.done.clone())
            }
            .ok_or_else(|| timed_out(me, label, *to, timeout))?;
            stream.wait(&done)?;
            self.hub.hub.remove(*key);
        }
        Ok(())
    }

    fn abort(&self) {
        self.hub.hub.aborted.store(true, Ordering::Release);
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
