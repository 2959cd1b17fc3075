//! The copy-engine windows' plans: how a post of one rank on one lane becomes stream steps
//! (waits on flags, claims, pushes, signals, drains, releases), piece by piece — a transfer
//! ([`plan`]) or a reduction in the windows ([`plan_reduce`]) — pure functions of the window
//! layout and the pieces counted so far, which the transport enqueues and the tests simulate.

use super::WindowLayout;

/// One stream operation of a transfer on a lane, in the order a rank enqueues them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Sender: wait until `consumed[peer][lane][slot]` (local) is 1: the slot is free.
    WaitFree {
        /// The receiver.
        peer: usize,
        /// The slot.
        slot: usize,
    },
    /// Sender: clear `consumed[peer][lane][slot]` (local): the slot is being filled.
    Claim {
        /// The receiver.
        peer: usize,
        /// The slot.
        slot: usize,
    },
    /// Sender: copy `bytes` from local address `src` into `peer`'s slot for this rank.
    Push {
        /// The receiver.
        peer: usize,
        /// The slot.
        slot: usize,
        /// The local address read.
        src: u64,
        /// The piece's size.
        bytes: usize,
    },
    /// Sender: set `ready[me][lane][slot]` in `peer`'s region.
    SignalReady {
        /// The receiver.
        peer: usize,
        /// The slot.
        slot: usize,
    },
    /// Receiver: wait until `ready[peer][lane][slot]` (local) is 1.
    WaitReady {
        /// The sender.
        peer: usize,
        /// The slot.
        slot: usize,
    },
    /// Receiver: clear `ready[peer][lane][slot]` (local).
    Take {
        /// The sender.
        peer: usize,
        /// The slot.
        slot: usize,
    },
    /// Receiver: copy `bytes` from its slot for `peer` to local address `dst`.
    Drain {
        /// The sender.
        peer: usize,
        /// The slot.
        slot: usize,
        /// The local address written.
        dst: u64,
        /// The piece's size.
        bytes: usize,
    },
    /// Receiver: set `consumed[me][lane][slot]` in `peer`'s region: the slot is free again.
    SignalFree {
        /// The sender.
        peer: usize,
        /// The slot.
        slot: usize,
    },
}

impl Step {
    /// The peer the step deals with.
    pub fn peer(&self) -> usize {
        match *self {
            Step::WaitFree { peer, .. }
            | Step::Claim { peer, .. }
            | Step::Push { peer, .. }
            | Step::SignalReady { peer, .. }
            | Step::WaitReady { peer, .. }
            | Step::Take { peer, .. }
            | Step::Drain { peer, .. }
            | Step::SignalFree { peer, .. } => peer,
        }
    }
}

/// Pieces sent to and received from each peer so far, per lane.
#[derive(Clone, Debug, Default)]
pub struct PieceCounts {
    lanes: usize,
    sent: Vec<u64>,
    received: Vec<u64>,
}

impl PieceCounts {
    /// Zero counts for a world of `ranks` with `lanes` lanes.
    pub fn new(ranks: usize, lanes: usize) -> PieceCounts {
        PieceCounts {
            lanes,
            sent: vec![0; ranks * lanes],
            received: vec![0; ranks * lanes],
        }
    }

    /// The slot (of `slots`) of the next piece received from `peer` on `lane`, counted.
    pub fn next_received(&mut self, peer: usize, lane: usize, slots: usize) -> usize {
        let at = peer * self.lanes + lane;
        let n = self.received[at];
        self.received[at] += 1;
        (n % slots.max(1) as u64) as usize
    }
}

/// The steps of one post of rank `me` on `lane`: sends `(to, address, bytes)` and receives
/// `(from, address, bytes)` cut into pieces, numbered from `counts` (which it advances),
/// interleaved piece by piece (every send's piece j, then every receive's piece j), and
/// closed by a wait until the last piece sent to each peer is consumed.
pub fn plan(
    me: usize,
    layout: &WindowLayout,
    counts: &mut PieceCounts,
    lane: usize,
    sends: &[(usize, u64, usize)],
    recvs: &[(usize, u64, usize)],
) -> Vec<Step> {
    plan_pieces(me, layout, counts, lane, sends, recvs, layout.slot_bytes)
}

/// [`plan`] with pieces of at most `z` bytes (at most a slot).
fn plan_pieces(
    me: usize,
    layout: &WindowLayout,
    counts: &mut PieceCounts,
    lane: usize,
    sends: &[(usize, u64, usize)],
    recvs: &[(usize, u64, usize)],
    z: usize,
) -> Vec<Step> {
    let z = z.clamp(1, layout.slot_bytes.max(1));
    let k = layout.slots as u64;
    let lanes = counts.lanes;
    // The slot of the next piece counted in `count` for `peer`, which it advances.
    let next_slot = |count: &mut [u64], peer: usize| {
        let c = &mut count[peer * lanes + lane];
        let n = *c;
        *c += 1;
        (n % k) as usize
    };
    let pieces = |bytes: usize| bytes.div_ceil(z);
    let rounds = sends
        .iter()
        .chain(recvs)
        .map(|t| pieces(t.2))
        .max()
        .unwrap_or(0);
    let piece = |j: usize, bytes: usize| (j * z, z.min(bytes - j * z));
    let mut steps = Vec::new();
    // The slot of the last piece sent to each peer in this post.
    let mut last: Vec<Option<usize>> = vec![None; counts.sent.len() / counts.lanes.max(1)];
    debug_assert!(sends.iter().chain(recvs).all(|t| t.0 != me));
    for j in 0..rounds {
        for &(to, src, bytes) in sends.iter().filter(|t| pieces(t.2) > j) {
            let (offset, len) = piece(j, bytes);
            let slot = next_slot(&mut counts.sent, to);
            steps.push(Step::WaitFree { peer: to, slot });
            steps.push(Step::Claim { peer: to, slot });
            steps.push(Step::Push {
                peer: to,
                slot,
                src: src + offset as u64,
                bytes: len,
            });
            steps.push(Step::SignalReady { peer: to, slot });
            last[to] = Some(slot);
        }
        for &(from, dst, bytes) in recvs.iter().filter(|t| pieces(t.2) > j) {
            let (offset, len) = piece(j, bytes);
            let slot = next_slot(&mut counts.received, from);
            steps.push(Step::WaitReady { peer: from, slot });
            steps.push(Step::Take { peer: from, slot });
            steps.push(Step::Drain {
                peer: from,
                slot,
                dst: dst + offset as u64,
                bytes: len,
            });
            steps.push(Step::SignalFree { peer: from, slot });
        }
    }
    for (to, slot) in last.iter().enumerate() {
        if let Some(slot) = *slot {
            steps.push(Step::WaitFree { peer: to, slot });
        }
    }
    steps
}

/// The steps of a reduction in the windows ([`plan_reduce`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReduceSteps {
    /// Piece by piece, the pushes and what the posting stream does.
    pub rounds: Vec<ReduceRound>,
    /// The sender's closing waits, until its last piece to every peer is consumed.
    pub closing: Vec<Step>,
}

/// One piece of a reduction in the windows: wait for every peer's piece, sum, release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReduceRound {
    /// The pushes of this piece to every peer, as [`plan`] makes them for the sends alone
    /// (they run on side streams).
    pub pushes: Vec<Step>,
    /// Where the piece starts in the block, in bytes.
    pub offset: usize,
    /// Its length in bytes.
    pub len: usize,
    /// The waits for, and takes of, every peer's piece.
    pub taken: Vec<Step>,
    /// `(peer, slot)` of each peer's piece, in the order of `from`.
    pub pieces: Vec<(usize, usize)>,
    /// The releases of those slots.
    pub freed: Vec<Step>,
}

/// The steps of rank `me` reducing in its windows on `lane` (see
/// [`CopyTransport::reduce_in_windows`](crate::CopyTransport::reduce_in_windows)): the pushes of `sends`, and for every piece of the
/// `bytes` each rank of `from` pushes, the waits, the slots to sum and the releases.
pub fn plan_reduce(
    me: usize,
    layout: &WindowLayout,
    counts: &mut PieceCounts,
    lane: usize,
    sends: &[(usize, u64, usize)],
    from: &[usize],
    bytes: usize,
) -> ReduceSteps {
    plan_reduce_pieces(
        me,
        layout,
        counts,
        lane,
        sends,
        from,
        (bytes, layout.slot_bytes),
    )
}

/// [`plan_reduce`] with pieces of at most `piece` bytes (at most a slot).
pub fn plan_reduce_pieces(
    me: usize,
    layout: &WindowLayout,
    counts: &mut PieceCounts,
    lane: usize,
    sends: &[(usize, u64, usize)],
    from: &[usize],
    (bytes, piece): (usize, usize),
) -> ReduceSteps {
    let z = piece.clamp(1, layout.slot_bytes.max(1));
    let mut pushes = plan_pieces(me, layout, counts, lane, sends, &[], z).into_iter();
    let rounds = (0..bytes.div_ceil(z))
        .map(|j| {
            // `plan` gives 4 steps per send that has a piece in round j, round by round.
            let sending = sends.iter().filter(|t| t.2.div_ceil(z) > j).count();
            let round_pushes: Vec<Step> = pushes.by_ref().take(4 * sending).collect();
            let pieces: Vec<(usize, usize)> = from
                .iter()
                .map(|&p| (p, counts.next_received(p, lane, layout.slots)))
                .collect();
            ReduceRound {
                pushes: round_pushes,
                offset: j * z,
                len: z.min(bytes - j * z),
                taken: pieces
                    .iter()
                    .flat_map(|&(peer, slot)| {
                        [Step::WaitReady { peer, slot }, Step::Take { peer, slot }]
                    })
                    .collect(),
                freed: pieces
                    .iter()
                    .map(|&(peer, slot)| Step::SignalFree { peer, slot })
                    .collect(),
                pieces,
            }
        })
        .collect();
    ReduceSteps {
        rounds,
        closing: pushes.collect(),
    }
}

/// The peers that `steps` deal with, in order of first appearance.
pub(super) fn peers_of(steps: &[Step]) -> Vec<usize> {
    let mut peers = Vec::new();
    for step in steps {
        if !peers.contains(&step.peer()) {
            peers.push(step.peer());
        }
    }
    peers
}
