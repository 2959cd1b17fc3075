//! Copy-engine transfers between ranks in different processes of one host (CUDA IPC), or
//! threads of one process: allgathers and point-to-point sends/receives pushed by the copy
//! engines into receive windows that every rank shares with its peers, signalled by flags
//! the GPUs write and wait on in stream order. The host never waits: a post only enqueues
//! copies and flag operations. This is the [`IpcTransport`] of the copy-engine communicator
//! ([`crate::copy`]), which hands every other operation to the wrapped NCCL communicator.
//!
//! Each rank allocates one [`SharedRegion`] at set-up and hands its IPC handle to every peer
//! (through any all-gather of bytes: the launcher's TCP store, say); each peer maps it once.
//! Transfers posted on different streams never share a slot: the streams that post are
//! numbered in the order they first post (the same on every rank, which posts in program
//! order) and each number, a *lane*, has its own slots. A region holds, for every other rank
//! and lane, a *window* of `slots` slots of `slot_bytes` bytes that only that rank writes,
//! plus one pair of 32-bit flags per slot:
//!
//! * `ready[from][lane][slot]`, in the receiver's region: 1 once the sender's piece is in the
//!   slot, set by the sender, cleared by the receiver when it takes the piece;
//! * `consumed[to][lane][slot]`, in the sender's region: 1 while the slot is free, cleared by
//!   the sender when it fills the slot, set by the receiver once it has copied the piece out.
//!
//! A transfer is cut into pieces of at most one slot; the n-th piece of a lane between a pair
//! goes to slot `n % slots`. A post's steps with each peer run on a side stream of its own
//! (one per lane and peer, forked from the posting stream by an event and joined back), so
//! the copy engines move the pieces of every peer at once; a pair's steps keep their order,
//! which is all the protocol below relies on. The sender's stream waits until the slot is free, clears
//! `consumed`, copies into the receiver's slot and sets `ready` (after a memory fence); the
//! receiver's stream waits for `ready`, clears it, copies the slot into the destination and
//! sets the sender's `consumed`. Within a lane both sides run in stream order, so 0/1 flags
//! suffice, and every flag returns to its initial value once a post completes: the same
//! operations captured into a CUDA graph and replayed stay correct. A post's sends and
//! receives are interleaved piece by piece, so a transfer longer than the window cannot
//! deadlock its own post, and the sender's stream ends each post by waiting until its last
//! piece to every peer is consumed: once a rank's streams are idle, no peer writes into its
//! region any more, so it may be freed.
//!
//! A stream waiting on a flag blocks the hardware queue it shares with other streams: with
//! CUDA's default of 8 queues a device, the posting streams, the side streams and NCCL's own
//! alias, and a wait can hold up the very push it waits for (on a peer doing the same). The
//! process therefore asks for the most queues, 32 ([`weave_cuda::MAX_CONNECTIONS_VAR`]),
//! before CUDA starts.
//!
//! A sum reduce-scatter or allreduce reduces *in the windows*
//! ([`CopyTransport::reduce_in_windows`]): the pushes run as above, and the posting stream,
//! piece by piece, waits for every peer's piece, sums them where they landed together with
//! the rank's own block (one generated kernel) and frees the slots — no scratch buffer and
//! no copy out of the windows; it joins its pushes only after the last sum, since their
//! last pieces may wait for slots that only its sums free ([`plan_reduce`]).
//!
//! The GPU-side waits have no timeout of their own: a peer that never posts stalls the
//! stream, and the executor's host wait on that stream fails with its timeout (or the run's
//! deadline passes), which aborts the communicator. The abort then *releases* the rank's
//! streams: a side stream keeps setting every flag of the rank's region to 1, so each flag
//! wait still queued ends and the streams drain (moving garbage, in a run that has failed),
//! until the transport is dropped (or for a minute at most). A stream blocked on a flag therefore never outlives the
//! run's timeout by more than the release takes, and the region can be freed.

use std::sync::Arc;
use std::time::Duration;

use weave_cuda::{Gpu, GpuStream, PeerRegion, Priority, SharedRegion, IPC_HANDLE_BYTES};

use crate::communicator::Communicator;
use crate::copy::{copy_error, CopyComm, CopyTransport, ProduceAt, Transfers, WindowSum};
use crate::error::CommError;
use crate::nccl::{DeviceBuffer, Nccl};

mod plan;
use plan::peers_of;
pub use plan::{
    plan, plan_reduce, plan_reduce_pieces, PieceCounts, ReduceRound, ReduceSteps, Step,
};

/// The receive windows' shape: the same on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcOptions {
    /// Streams that may post transfers (lanes), at least 1.
    pub lanes: usize,
    /// Slots per window (pieces in flight between a pair on one lane), at least 1.
    pub slots: usize,
    /// Bytes per slot (the largest piece), a positive multiple of 256.
    pub slot_bytes: usize,
}

impl Default for IpcOptions {
    /// 8 lanes (a main stream and a pool of up to 7) of 2 slots of 8 MiB: 128 MiB of
    /// windows per peer.
    fn default() -> IpcOptions {
        IpcOptions {
            lanes: 8,
            slots: 2,
            slot_bytes: 8 << 20,
        }
    }
}

/// The variable that overrides the windows' shape ([`IpcOptions::from_env`]).
pub const WINDOWS_VAR: &str = "WEAVE_CE_WINDOWS";

/// Why a windows' shape is refused: a malformed [`WINDOWS_VAR`], or options
/// [`WindowLayout::new`] cannot lay out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WindowsError {
    /// [`WINDOWS_VAR`]'s value is not `SLOTSxMIB` within the limits.
    #[error(
        "{WINDOWS_VAR}={value:?}: expected SLOTSxMIB, such as 4x16 (1..=64 slots of 1..=1024 MiB)"
    )]
    Malformed {
        /// The value given.
        value: String,
    },
    /// No lane.
    #[error("the windows need at least 1 lane")]
    NoLane,
    /// No slot.
    #[error("the windows need at least 1 slot")]
    NoSlot,
    /// A slot size that is not a positive multiple of 256.
    #[error("slot size {slot_bytes} bytes is not a positive multiple of 256")]
    SlotBytes {
        /// The slot size given.
        slot_bytes: usize,
    },
}

impl IpcOptions {
    /// The default shape, with slots and slot size from [`WINDOWS_VAR`] when it is set:
    /// `SLOTSxMIB` (`4x16`: 4 slots of 16 MiB). Every rank must see the same value (the
    /// set-up exchange refuses windows of different shapes).
    pub fn from_env() -> Result<IpcOptions, WindowsError> {
        match std::env::var(WINDOWS_VAR) {
            Ok(v) => IpcOptions::parse_shape(&v),
            Err(_) => Ok(IpcOptions::default()),
        }
    }

    /// Parses `SLOTSxMIB` into the default shape with those slots (1..=64) of that many
    /// MiB (1..=1024).
    pub fn parse_shape(v: &str) -> Result<IpcOptions, WindowsError> {
        let bad = || WindowsError::Malformed {
            value: v.to_string(),
        };
        let (slots, mib) = v.trim().split_once('x').ok_or_else(bad)?;
        let slots: usize = slots.parse().map_err(|_| bad())?;
        let mib: usize = mib.parse().map_err(|_| bad())?;
        if !(1..=64).contains(&slots) || !(1..=1024).contains(&mib) {
            return Err(bad());
        }
        Ok(IpcOptions {
            slots,
            slot_bytes: mib << 20,
            ..IpcOptions::default()
        })
    }
}

/// Where flags and windows lie in a rank's region, for a world of `ranks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowLayout {
    ranks: usize,
    lanes: usize,
    slots: usize,
    slot_bytes: usize,
}

impl WindowLayout {
    /// The layout for `ranks` ranks; an error naming the bad option.
    pub fn new(ranks: usize, options: IpcOptions) -> Result<WindowLayout, WindowsError> {
        if options.lanes == 0 {
            return Err(WindowsError::NoLane);
        }
        if options.slots == 0 {
            return Err(WindowsError::NoSlot);
        }
        if options.slot_bytes == 0 || !options.slot_bytes.is_multiple_of(256) {
            return Err(WindowsError::SlotBytes {
                slot_bytes: options.slot_bytes,
            });
        }
        Ok(WindowLayout {
            ranks,
            lanes: options.lanes,
            slots: options.slots,
            slot_bytes: options.slot_bytes,
        })
    }

    /// Streams that may post.
    pub fn lanes(&self) -> usize {
        self.lanes
    }

    /// Slots per window.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Flags of one kind in a region: one per rank, lane and slot.
    fn flag_count(&self) -> usize {
        self.ranks * self.lanes * self.slots
    }

    fn flags_bytes(&self) -> usize {
        (2 * self.flag_count() * 4).div_ceil(256) * 256
    }

    fn index(&self, rank: usize, lane: usize, slot: usize) -> usize {
        (rank * self.lanes + lane) * self.slots + slot
    }

    /// Offset of `ready[from][lane][slot]` in a receiver's region.
    pub fn ready(&self, from: usize, lane: usize, slot: usize) -> usize {
        self.index(from, lane, slot) * 4
    }

    /// Offset of `consumed[to][lane][slot]` in a sender's region.
    pub fn consumed(&self, to: usize, lane: usize, slot: usize) -> usize {
        (self.flag_count() + self.index(to, lane, slot)) * 4
    }

    /// Every flag of a region, `ready` then `consumed`: (offset of the first, count).
    pub fn all_flags(&self) -> (usize, usize) {
        (0, 2 * self.flag_count())
    }

    /// The `consumed` flags of a region: (offset of the first, count); they start at 1.
    pub fn consumed_flags(&self) -> (usize, usize) {
        (self.consumed(0, 0, 0), self.flag_count())
    }

    /// Offset of the slot that `from` writes on `lane` in `owner`'s region (`from !=
    /// owner`).
    pub fn window(&self, owner: usize, from: usize, lane: usize, slot: usize) -> usize {
        let peer = if from < owner { from } else { from - 1 };
        self.flags_bytes() + ((peer * self.lanes + lane) * self.slots + slot) * self.slot_bytes
    }

    /// The size of one rank's region.
    pub fn region_bytes(&self) -> usize {
        self.flags_bytes()
            + self.ranks.saturating_sub(1) * self.lanes * self.slots * self.slot_bytes
    }
}

/// What one rank tells the others at set-up: a format tag, its process, its GPU, the
/// window shape, its region's address (for ranks of the same process) and IPC handle.
struct Card {
    process: u64,
    device: u32,
    lanes: u64,
    slots: u64,
    slot_bytes: u64,
    ptr: u64,
    handle: [u8; IPC_HANDLE_BYTES],
}

const CARD_TAG: &[u8; 8] = b"weaveipc";

/// What a rank sends instead of its card when it cannot set its windows up: the tag, then
/// why, so that its peers fail at once instead of waiting for the store's timeout.
const FAILED_TAG: &[u8] = b"weaveipc-failed:";

/// The set-up message of a rank that failed before the exchange.
fn failure_card(why: &str) -> Vec<u8> {
    let mut b = FAILED_TAG.to_vec();
    b.extend_from_slice(why.as_bytes());
    b
}

/// The first rank of the exchange that sent a failure, with what it said.
fn failed_peer(all: &[Vec<u8>]) -> Option<(usize, String)> {
    all.iter().enumerate().find_map(|(rank, b)| {
        b.strip_prefix(FAILED_TAG)
            .map(|why| (rank, String::from_utf8_lossy(why).into_owned()))
    })
}

impl Card {
    fn encode(&self) -> Vec<u8> {
        let mut b = CARD_TAG.to_vec();
        b.extend(self.process.to_le_bytes());
        b.extend(self.device.to_le_bytes());
        b.extend(self.lanes.to_le_bytes());
        b.extend(self.slots.to_le_bytes());
        b.extend(self.slot_bytes.to_le_bytes());
        b.extend(self.ptr.to_le_bytes());
        b.extend(self.handle);
        b
    }

    fn decode(b: &[u8]) -> Option<Card> {
        let rest = b.strip_prefix(CARD_TAG)?;
        if rest.len() != 8 + 4 + 8 + 8 + 8 + 8 + IPC_HANDLE_BYTES {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(rest[i..i + 8].try_into().unwrap_or([0; 8]));
        let mut handle = [0; IPC_HANDLE_BYTES];
        handle.copy_from_slice(&rest[44..]);
        Some(Card {
            process: u64_at(0),
            device: u32::from_le_bytes(rest[8..12].try_into().unwrap_or([0; 4])),
            lanes: u64_at(12),
            slots: u64_at(20),
            slot_bytes: u64_at(28),
            ptr: u64_at(36),
            handle,
        })
    }
}

/// An identifier of this process, distinct from other processes' on the host (the pid and
/// the start time: pids may repeat across PID namespaces).
fn process_token() -> u64 {
    static TOKEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOKEN.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        (u64::from(std::process::id()) << 32) ^ nanos
    })
}

/// Checks every rank's card against this rank's window shape; the error names the rank.
fn check_cards(cards: &[Option<Card>], layout: &WindowLayout) -> Result<(), String> {
    for (rank, card) in cards.iter().enumerate() {
        let Some(card) = card else {
            return Err(format!(
                "rank {rank}'s set-up message is not a copy-engine window description"
            ));
        };
        let shape = |l: u64, s: u64, b: u64| format!("{l} lane(s) x {s} slot(s) of {b} bytes");
        let mine = shape(
            layout.lanes as u64,
            layout.slots as u64,
            layout.slot_bytes as u64,
        );
        let theirs = shape(card.lanes, card.slots, card.slot_bytes);
        if theirs != mine {
            return Err(format!(
                "rank {rank} has windows of {theirs} but this rank has {mine}"
            ));
        }
    }
    Ok(())
}

/// Pushes by the copy engines through shared receive windows (see the module documentation):
/// the [`CopyTransport`] of [`IpcCopy`].
///
/// Lanes are keyed by stream handle: keep every stream that posts alive as long as the
/// transport (a destroyed stream's handle may come back for another stream, on one rank and
/// not the others).
pub struct IpcTransport {
    gpu: Gpu,
    layout: WindowLayout,
    /// This rank's region.
    region: Arc<SharedRegion>,
    /// The side stream that releases this rank's flag waits once the rank aborts.
    release: Arc<GpuStream>,
    /// The thread that keeps releasing them until the transport is dropped, once started.
    releaser: std::sync::Mutex<Option<Releaser>>,
    /// Each peer's region mapped here (`None` for this rank and for ranks of this process).
    _mapped: Vec<Option<PeerRegion>>,
    /// Each rank's region base address in this process.
    bases: Vec<u64>,
    /// The posting streams, by lane, and the pieces numbered so far.
    lanes: std::sync::Mutex<(Vec<usize>, PieceCounts)>,
    /// One side stream per lane and peer, made on first use: a post's pieces to and from
    /// each peer run on that pair's stream, forked from the posting stream and joined back,
    /// so the copy engines serve every peer at once (one stream would push to and drain from
    /// the peers one after another). Every stream that waits on a flag can hold up the
    /// streams that share its hardware queue, so the process needs as many queues as it has
    /// such streams: see [`weave_cuda::MAX_CONNECTIONS_VAR`].
    fans: std::sync::Mutex<std::collections::HashMap<(usize, usize), Arc<GpuStream>>>,
}

/// An NCCL communicator whose allgathers and point-to-point transfers are pushed by the copy
/// engines through shared receive windows.
pub type IpcCopy<B> = CopyComm<IpcTransport, Nccl<B>>;

impl<B: DeviceBuffer> CopyComm<IpcTransport, Nccl<B>> {
    /// Sets up the windows of this rank of `inner` (on `gpu`) and maps every peer's (see
    /// [`IpcTransport::connect`]).
    pub fn connect(
        inner: Arc<Nccl<B>>,
        gpu: Gpu,
        options: IpcOptions,
        all_gather: impl FnOnce(Vec<u8>) -> Result<Vec<Vec<u8>>, CommError>,
    ) -> Result<IpcCopy<B>, CommError> {
        let transport =
            IpcTransport::connect(inner.rank(), inner.size(), gpu, options, all_gather)?;
        Ok(CopyComm::with_transport(inner, transport))
    }

    /// The windows' shape.
    pub fn layout(&self) -> &WindowLayout {
        self.transport().layout()
    }
}

impl IpcTransport {
    /// Sets up the windows of rank `me` of `n` (on `gpu`) and maps every peer's.
    /// `all_gather` hands this rank's set-up message to every rank and returns all of them in
    /// rank order (every rank calls `connect` collectively); ranks of other processes must be
    /// on this host, ranks of this process on GPUs with peer access.
    pub fn connect(
        me: usize,
        n: usize,
        gpu: Gpu,
        options: IpcOptions,
        all_gather: impl FnOnce(Vec<u8>) -> Result<Vec<Vec<u8>>, CommError>,
    ) -> Result<IpcTransport, CommError> {
        let setup = |message: String| {
            CommError::Bootstrap(format!("rank {me}: copy-engine windows: {message}"))
        };
        let prepared = (|| -> Result<_, CommError> {
            let layout = WindowLayout::new(n, options).map_err(|e| setup(e.to_string()))?;
            let region = gpu.alloc_shared(layout.region_bytes())?;
            // Made now, so that an abort needs nothing that can fail.
            let release = gpu.new_stream(Priority::High)?;
            // Every slot starts free; the exchange below orders this before any peer's write.
            let (first, count) = layout.consumed_flags();
            region.fill_u32(first, count, 1)?;
            let card = Card {
                process: process_token(),
                device: gpu.ordinal() as u32,
                lanes: layout.lanes as u64,
                slots: layout.slots as u64,
                slot_bytes: layout.slot_bytes as u64,
                ptr: region.ptr(),
                handle: region.handle(),
            };
            Ok((layout, region, release, card))
        })();
        let (layout, region, release, card) = match prepared {
            Ok(p) => p,
            Err(e) => {
                // The peers are in the exchange already: tell them, rather than leave them
                // waiting for the store's timeout.
                let _ = all_gather(failure_card(&e.to_string()));
                return Err(e);
            }
        };
        let all = all_gather(card.encode())?;
        if let Some((rank, why)) = failed_peer(&all) {
            return Err(setup(format!(
                "rank {rank} could not set up its windows: {why}"
            )));
        }
        if all.len() != n {
            return Err(setup(format!(
                "the set-up exchange returned {} message(s) for {n} ranks",
                all.len()
            )));
        }
        let cards: Vec<Option<Card>> = all.iter().map(|b| Card::decode(b)).collect();
        check_cards(&cards, &layout).map_err(setup)?;
        let mut mapped = Vec::with_capacity(n);
        let mut bases = Vec::with_capacity(n);
        for (rank, card) in cards.into_iter().flatten().enumerate() {
            if rank == me {
                mapped.push(None);
                bases.push(region.ptr());
            } else if card.process == process_token() {
                let peer = Gpu::open(card.device as usize)?;
                if peer.ordinal() != gpu.ordinal() {
                    gpu.enable_peer_access(&peer)?;
                }
                mapped.push(None);
                bases.push(card.ptr);
            } else {
                let region = gpu.open_region(&card.handle).map_err(|e| {
                    setup(format!(
                        "cannot map rank {rank}'s window (ranks must share one host): {e}"
                    ))
                })?;
                bases.push(region.ptr());
                mapped.push(Some(region));
            }
        }
        // Every lane's side stream to every peer, made now: creating a stream mid-run can wait
        // in the driver behind a peer thread's call that waits for its GPU, which may be
        // waiting on this rank's next push.
        let mut fans = std::collections::HashMap::new();
        for lane in 0..layout.lanes {
            for peer in (0..n).filter(|&p| p != me) {
                fans.insert((lane, peer), Arc::new(gpu.new_stream(Priority::Normal)?));
            }
        }
        Ok(IpcTransport {
            gpu,
            layout,
            region: Arc::new(region),
            release: Arc::new(release),
            releaser: std::sync::Mutex::new(None),
            _mapped: mapped,
            bases,
            lanes: std::sync::Mutex::new((Vec::new(), PieceCounts::new(n, layout.lanes))),
            fans: std::sync::Mutex::new(fans),
        })
    }

    /// The windows' shape.
    pub fn layout(&self) -> &WindowLayout {
        &self.layout
    }

    /// The side streams that carry the pushes and pulls to each peer, by (lane, peer): all
    /// of them are made when the windows connect, none mid-run.
    pub fn side_streams(&self) -> Vec<(usize, usize)> {
        let fans = self.fans.lock().unwrap_or_else(|e| e.into_inner());
        let mut keys: Vec<(usize, usize)> = fans.keys().copied().collect();
        keys.sort_unstable();
        keys
    }
}

/// The thread releasing an aborted rank's flag waits, and how to stop it.
struct Releaser {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

/// How often an aborted rank's flags are set again: a stream that clears a flag after a
/// release (taking a piece) may wait on it again further down its queue.
const RELEASE_EVERY: Duration = Duration::from_millis(1);

/// How long an aborted rank's flags are released at most: its streams have drained long
/// before (a release takes microseconds per queued wait), unless the transport was leaked.
const RELEASE_FOR: Duration = Duration::from_secs(60);

impl IpcTransport {
    /// Starts releasing this rank's flag waits (see the module documentation); idempotent.
    fn release_waits(&self) {
        let mut releaser = self.releaser.lock().unwrap_or_else(|e| e.into_inner());
        if releaser.is_some() {
            return;
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (region, stream, (first, count)) = (
            self.region.clone(),
            self.release.clone(),
            self.layout.all_flags(),
        );
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("weave-ipc-release".into())
            .spawn(move || {
                let start = std::time::Instant::now();
                while !flag.load(std::sync::atomic::Ordering::Acquire)
                    && start.elapsed() < RELEASE_FOR
                {
                    if region.fill_u32_on(first, count, 1, &stream).is_err() {
                        return;
                    }
                    std::thread::sleep(RELEASE_EVERY);
                }
            });
        if let Ok(thread) = thread {
            *releaser = Some(Releaser { stop, thread });
        }
    }
}

impl Drop for IpcTransport {
    fn drop(&mut self) {
        let releaser = self.releaser.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = releaser.take() {
            r.stop.store(true, std::sync::atomic::Ordering::Release);
            let _ = r.thread.join();
        }
    }
}

impl CopyTransport for IpcTransport {
    type Stream = GpuStream;

    /// The rank failed: its streams may wait on flags no peer will ever set, so they are
    /// released (see the module documentation).
    fn abort(&self) {
        self.release_waits();
    }

    /// Enqueues `t` on `stream`: every wait is a GPU-side flag wait, so `timeout` is not
    /// used here (the executor's host wait on the stream bounds it).
    fn transfer(
        &self,
        me: usize,
        label: &str,
        t: &Transfers,
        stream: &GpuStream,
        _timeout: Duration,
    ) -> Result<(), CommError> {
        let (lane, steps) = self.with_lane(me, label, stream, |lane, counts| {
            (
                lane,
                plan(me, &self.layout, counts, lane, &t.sends, &t.recvs),
            )
        })?;
        // Each peer's steps on its own side stream of this lane (a pair's steps keep their
        // order, which is all the protocol needs), forked from `stream` and joined back,
        // enqueued in the plan's order across peers. The local copies go on `stream` after
        // the fork: a copy within one GPU runs as a kernel and waits behind a GEMM that holds
        // every SM, and the peers' transfers, which read none of its bytes, need not wait
        // with it.
        let sides = self.fork(me, label, lane, &peers_of(&steps), stream)?;
        for &(dst, src, bytes) in &t.local {
            self.gpu.copy(dst, src, bytes, stream)?;
        }
        self.dispatch(me, lane, &steps, &sides)?;
        self.join(&sides, stream)
    }

    fn reduces_in_windows(&self) -> bool {
        true
    }

    /// The pushes run on side streams (as in [`CopyTransport::transfer`]); the waits for
    /// each round of pieces, the sums and the releases on `stream`, which joins the pushes
    /// last (joining them first would deadlock a block longer than the window: its last
    /// pieces wait for slots that only this stream's sums free).
    fn reduce_in_windows(
        &self,
        me: usize,
        label: &str,
        sends: &[(usize, u64, usize)],
        from: &[usize],
        bytes: usize,
        stream: &GpuStream,
        _timeout: Duration,
        sum: &mut WindowSum<'_, GpuStream>,
    ) -> Result<(), CommError> {
        let l = self.layout;
        let (lane, reduce) = self.with_lane(me, label, stream, |lane, counts| {
            (lane, plan_reduce(me, &l, counts, lane, sends, from, bytes))
        })?;
        let sides = self.fork(me, label, lane, from, stream)?;
        // Round by round, the pushes of the piece and then the posting stream's waits, sum
        // and releases of it: the order a single hardware queue could run without deadlock.
        for round in &reduce.rounds {
            self.dispatch(me, lane, &round.pushes, &sides)?;
            self.sum_round(me, lane, round, stream, sum)?;
        }
        self.dispatch(me, lane, &reduce.closing, &sides)?;
        self.join(&sides, stream)
    }

    fn slot_bytes(&self) -> Option<usize> {
        Some(self.layout.slot_bytes)
    }

    /// Everything on `stream`, round by round: each peer's piece produced into its slot
    /// (wait until free, claim, produce, signal ready: the driver's value write fences the
    /// producer's stores before it), the own piece produced in place, then the waits for the
    /// peers' pieces, the sum and the releases; last, the waits until every peer has taken
    /// this rank's last pieces. A round needs only what earlier rounds of every rank
    /// enqueued, so one queue per device runs it without deadlock.
    fn produce_in_windows(
        &self,
        me: usize,
        label: &str,
        sends: &[(usize, u64, usize)],
        own: u64,
        from: &[usize],
        (bytes, piece): (usize, usize),
        stream: &GpuStream,
        produce: &mut ProduceAt<'_>,
        sum: &mut WindowSum<'_, GpuStream>,
    ) -> Result<(), CommError> {
        let l = self.layout;
        if piece == 0 || piece > l.slot_bytes {
            return Err(copy_error(
                me,
                label,
                format!(
                    "a piece of {piece} bytes does not fit the windows' slots of {} bytes",
                    l.slot_bytes
                ),
            ));
        }
        let (lane, reduce) = self.with_lane(me, label, stream, |lane, counts| {
            (
                lane,
                plan_reduce_pieces(me, &l, counts, lane, sends, from, (bytes, piece)),
            )
        })?;
        let local = self.region.ptr();
        for round in &reduce.rounds {
            for &step in &round.pushes {
                match step {
                    Step::Push {
                        peer,
                        slot,
                        src,
                        bytes,
                    } => produce(
                        src,
                        bytes,
                        self.bases[peer] + l.window(peer, me, lane, slot) as u64,
                    )?,
                    other => self.enqueue(me, lane, &[other], stream, local)?,
                }
            }
            let at = own + round.offset as u64;
            produce(at, round.len, at)?;
            self.sum_round(me, lane, round, stream, sum)?;
        }
        self.enqueue(me, lane, &reduce.closing, stream, local)
    }
}

impl IpcTransport {
    /// Enqueues on `stream` the end of one round of a reduction in the windows: the waits
    /// for every peer's piece, their sum where they landed, and the release of their slots.
    fn sum_round(
        &self,
        me: usize,
        lane: usize,
        round: &ReduceRound,
        stream: &GpuStream,
        sum: &mut WindowSum<'_, GpuStream>,
    ) -> Result<(), CommError> {
        let (l, local) = (self.layout, self.region.ptr());
        self.enqueue(me, lane, &round.taken, stream, local)?;
        let windows: Vec<u64> = round
            .pieces
            .iter()
            .map(|&(peer, slot)| local + l.window(me, peer, lane, slot) as u64)
            .collect();
        sum(round.offset, round.len, &windows, stream)?;
        self.enqueue(me, lane, &round.freed, stream, local)
    }

    /// The side streams of `lane` for `peers` (made when the windows connected), each
    /// waiting for what `stream` has enqueued so far.
    fn fork(
        &self,
        me: usize,
        label: &str,
        lane: usize,
        peers: &[usize],
        stream: &GpuStream,
    ) -> Result<Vec<(usize, Arc<GpuStream>)>, CommError> {
        if peers.is_empty() {
            return Ok(Vec::new());
        }
        let _span = tracing::trace_span!("copy_engine_fork", rank = me, lane).entered();
        let fork = self.gpu.new_event(false)?;
        stream.record(&fork)?;
        let mut sides = Vec::with_capacity(peers.len());
        for &peer in peers {
            let side = {
                let fans = self.fans.lock().unwrap_or_else(|e| e.into_inner());
                fans.get(&(lane, peer)).cloned().ok_or_else(|| {
                    copy_error(
                        me,
                        label,
                        format!("no side stream of lane {lane} to rank {peer}"),
                    )
                })?
            };
            side.wait(&fork)?;
            sides.push((peer, side));
        }
        Ok(sides)
    }

    /// Enqueues `steps` one by one, in their order, each on its peer's side stream: the
    /// order of the plan, which stays deadlock-free even where every stream of the device
    /// shares one hardware queue (see the module documentation).
    fn dispatch(
        &self,
        me: usize,
        lane: usize,
        steps: &[Step],
        sides: &[(usize, Arc<GpuStream>)],
    ) -> Result<(), CommError> {
        let local = self.region.ptr();
        for step in steps {
            let peer = step.peer();
            let Some((_, side)) = sides.iter().find(|(p, _)| *p == peer) else {
                return Err(CommError::Backend {
                    op: "copy-engine transfer".into(),
                    message: format!("rank {me}: no side stream for peer {peer}"),
                });
            };
            self.enqueue(me, lane, std::slice::from_ref(step), side, local)?;
        }
        Ok(())
    }

    /// Makes `stream` wait for what is enqueued on the side streams `sides` so far.
    fn join(&self, sides: &[(usize, Arc<GpuStream>)], stream: &GpuStream) -> Result<(), CommError> {
        let _span = tracing::trace_span!("copy_engine_join", sides = sides.len()).entered();
        for (_, side) in sides {
            let join = self.gpu.new_event(false)?;
            side.record(&join)?;
            stream.wait(&join)?;
        }
        Ok(())
    }

    /// The lane of `stream` (numbered in the order streams first post) and what `f` makes
    /// of it and the piece counts.
    fn with_lane<R>(
        &self,
        me: usize,
        label: &str,
        stream: &GpuStream,
        f: impl FnOnce(usize, &mut PieceCounts) -> R,
    ) -> Result<R, CommError> {
        let mut guard = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        let (streams, counts) = &mut *guard;
        let key = stream.cu_stream() as usize;
        let lane = match streams.iter().position(|&s| s == key) {
            Some(lane) => lane,
            None if streams.len() < self.layout.lanes => {
                streams.push(key);
                streams.len() - 1
            }
            None => {
                return Err(copy_error(
                    me,
                    label,
                    format!(
                        "more than {} streams post copy-engine transfers; the windows \
                         have {} lane(s) (IpcOptions::lanes)",
                        self.layout.lanes, self.layout.lanes
                    ),
                ))
            }
        };
        Ok(f(lane, counts))
    }

    /// Enqueues the steps of one peer of one post on `stream`.
    fn enqueue(
        &self,
        me: usize,
        lane: usize,
        steps: &[Step],
        stream: &GpuStream,
        local: u64,
    ) -> Result<(), CommError> {
        let l = &self.layout;
        for &step in steps {
            // Each driver call of a post named, so a log with `WEAVE_LOG_SPANS=open` shows
            // the one a stalled rank is in.
            let _span = tracing::trace_span!("copy_engine_step", rank = me, lane, ?step).entered();
            match step {
                Step::WaitFree { peer, slot } => {
                    stream.wait_value(local + l.consumed(peer, lane, slot) as u64, 1)?
                }
                Step::Claim { peer, slot } => {
                    stream.write_value(local + l.consumed(peer, lane, slot) as u64, 0)?
                }
                Step::Push {
                    peer,
                    slot,
                    src,
                    bytes,
                } => {
                    let dst = self.bases[peer] + l.window(peer, me, lane, slot) as u64;
                    self.gpu.copy(dst, src, bytes, stream)?
                }
                Step::SignalReady { peer, slot } => {
                    stream.write_value(self.bases[peer] + l.ready(me, lane, slot) as u64, 1)?
                }
                Step::WaitReady { peer, slot } => {
                    stream.wait_value(local + l.ready(peer, lane, slot) as u64, 1)?
                }
                Step::Take { peer, slot } => {
                    stream.write_value(local + l.ready(peer, lane, slot) as u64, 0)?
                }
                Step::Drain {
                    peer,
                    slot,
                    dst,
                    bytes,
                } => {
                    let src = local + l.window(me, peer, lane, slot) as u64;
                    self.gpu.copy(dst, src, bytes, stream)?
                }
                Step::SignalFree { peer, slot } => {
                    stream.write_value(self.bases[peer] + l.consumed(me, lane, slot) as u64, 1)?
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
