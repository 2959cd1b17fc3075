//! Tests of the shared-window protocol on the CPU: the layout, the plan of a post, the
//! set-up messages, and a simulator that runs every rank's planned steps on streams in a
//! random order (flags and windows as plain memory) to check that data arrives whole, that
//! no schedule deadlocks, that no peer writes into a rank's region once that rank's streams
//! are idle, and that replaying captured steps works and leaves the flags as they started.

use std::collections::VecDeque;

use super::*;

fn layout(ranks: usize, slots: usize, slot_bytes: usize) -> WindowLayout {
    WindowLayout::new(ranks, options(1, slots, slot_bytes)).unwrap()
}

fn options(lanes: usize, slots: usize, slot_bytes: usize) -> IpcOptions {
    IpcOptions {
        lanes,
        slots,
        slot_bytes,
    }
}

#[test]
fn windows_and_flags_do_not_overlap() {
    let l = WindowLayout::new(4, options(2, 3, 512)).unwrap();
    for owner in 0..4 {
        let mut mine = Vec::new();
        for p in 0..4 {
            for lane in 0..2 {
                for s in 0..3 {
                    mine.push((l.ready(p, lane, s), 4));
                    mine.push((l.consumed(p, lane, s), 4));
                    if p != owner {
                        mine.push((l.window(owner, p, lane, s), 512));
                    }
                }
            }
        }
        mine.sort();
        for w in mine.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlap in rank {owner}: {w:?}");
        }
        let end = mine.last().map(|r| r.0 + r.1).unwrap();
        assert_eq!(
            end,
            l.region_bytes(),
            "rank {owner}'s region is exactly used"
        );
    }
    // 2 x 24 flags in 256 bytes, then three peers' windows of 2 lanes x 3 slots.
    assert_eq!(l.region_bytes(), 256 + 3 * 2 * 3 * 512);
    assert_eq!(l.consumed_flags(), (24 * 4, 24));
}

#[test]
fn window_shapes_parse_from_the_variable_and_bad_ones_name_it() {
    let o = IpcOptions::parse_shape("4x16").unwrap();
    assert_eq!((o.lanes, o.slots, o.slot_bytes), (8, 4, 16 << 20));
    for bad in ["", "4", "0x16", "4x0", "65x1", "1x1025", "ax2", "4x16x2"] {
        assert_eq!(
            IpcOptions::parse_shape(bad).unwrap_err().to_string(),
            format!("WEAVE_CE_WINDOWS={bad:?}: expected SLOTSxMIB, such as 4x16 (1..=64 slots of 1..=1024 MiB)")
        );
    }
}

#[test]
fn bad_window_shapes_are_refused_with_the_reason() {
    let e = WindowLayout::new(2, options(0, 2, 256)).unwrap_err();
    assert_eq!(e.to_string(), "the windows need at least 1 lane");
    let e = WindowLayout::new(2, options(1, 0, 256)).unwrap_err();
    assert_eq!(e.to_string(), "the windows need at least 1 slot");
    let e = WindowLayout::new(2, options(1, 2, 100)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "slot size 100 bytes is not a positive multiple of 256"
    );
}

/// The steps of a sender pushing `bytes` from `src` into `slot` of `peer`'s window: wait
/// until the slot is free, claim it, push, signal it ready.
fn pushed(peer: usize, slot: usize, src: u64, bytes: usize) -> [Step; 4] {
    [
        Step::WaitFree { peer, slot },
        Step::Claim { peer, slot },
        Step::Push {
            peer,
            slot,
            src,
            bytes,
        },
        Step::SignalReady { peer, slot },
    ]
}

/// The steps of a receiver draining `bytes` of `slot` of its window for `peer` to `dst`:
/// wait until the piece is ready, take it, copy it out, signal the slot free.
fn drained(peer: usize, slot: usize, dst: u64, bytes: usize) -> [Step; 4] {
    [
        Step::WaitReady { peer, slot },
        Step::Take { peer, slot },
        Step::Drain {
            peer,
            slot,
            dst,
            bytes,
        },
        Step::SignalFree { peer, slot },
    ]
}

#[test]
fn a_post_interleaves_pieces_and_ends_waiting_for_its_last_send() {
    // Rank 0 sends 600 bytes to rank 1 (3 pieces of at most 256) with 2 slots, and
    // receives 256 bytes from it.
    let l = layout(2, 2, 256);
    let mut counts = PieceCounts::new(2, 1);
    let steps = plan(0, &l, &mut counts, 0, &[(1, 1000, 600)], &[(1, 5000, 256)]);
    use Step::*;
    let p = 1;
    assert_eq!(
        steps,
        [
            pushed(p, 0, 1000, 256).as_slice(),
            &drained(p, 0, 5000, 256),
            &pushed(p, 1, 1256, 256),
            // The third piece reuses slot 0, once the receiver freed it.
            &pushed(p, 0, 1512, 88),
            &[WaitFree { peer: p, slot: 0 }],
        ]
        .concat()
    );
    // The next post goes on numbering: its piece (the fourth) takes slot 1.
    let steps = plan(0, &l, &mut counts, 0, &[(1, 0, 10)], &[]);
    assert_eq!(steps[0], WaitFree { peer: p, slot: 1 });
}

#[test]
fn set_up_messages_round_trip_and_mismatched_windows_are_named() {
    let card = Card {
        process: 0x1234_5678_9abc,
        device: 3,
        lanes: 2,
        slots: 4,
        slot_bytes: 1 << 20,
        ptr: 0x7f00_0000_0000,
        handle: [7; IPC_HANDLE_BYTES],
    };
    let back = Card::decode(&card.encode()).unwrap();
    assert_eq!(
        (
            back.process,
            back.device,
            back.slots,
            back.slot_bytes,
            back.ptr,
            back.handle
        ),
        (card.process, 3, 4, 1 << 20, card.ptr, [7; IPC_HANDLE_BYTES])
    );
    assert!(Card::decode(b"weaveipc").is_none());
    assert!(Card::decode(&[0; 108]).is_none());
    let l = WindowLayout::new(2, options(2, 4, 1 << 20)).unwrap();
    let other = Card { slots: 2, ..back };
    let same = Card::decode(&card.encode());
    assert_eq!(
        check_cards(&[same, Some(other)], &l).unwrap_err(),
        "rank 1 has windows of 2 lane(s) x 2 slot(s) of 1048576 bytes but this rank has \
         2 lane(s) x 4 slot(s) of 1048576 bytes"
    );
    assert_eq!(
        check_cards(&[Card::decode(&card.encode()), None], &l).unwrap_err(),
        "rank 1's set-up message is not a copy-engine window description"
    );
}

/// Ranks' memory and streams, run step by step in a seeded random order. Stream `i` of a
/// rank posts on lane `i`.
struct Sim {
    layout: WindowLayout,
    regions: Vec<Vec<u8>>,
    heaps: Vec<Vec<u8>>,
    /// Per rank, per stream: the steps not yet run.
    streams: Vec<Vec<VecDeque<Step>>>,
    /// Per rank, per stream: the lane its steps use (stream `i` starts on lane `i`; side
    /// streams added by [`Sim::side`] share their posting stream's lane).
    lanes: Vec<Vec<usize>>,
    counts: Vec<PieceCounts>,
}

fn flag(region: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(region[at..at + 4].try_into().unwrap())
}

fn put(region: &mut [u8], at: usize, value: u32) {
    region[at..at + 4].copy_from_slice(&value.to_le_bytes())
}

impl Sim {
    fn new(ranks: usize, streams: usize, slots: usize, slot_bytes: usize, heap: usize) -> Sim {
        let layout = WindowLayout::new(ranks, options(streams, slots, slot_bytes)).unwrap();
        let mut region = vec![0; layout.region_bytes()];
        let (first, count) = layout.consumed_flags();
        for i in 0..count {
            put(&mut region, first + 4 * i, 1);
        }
        Sim {
            layout,
            regions: vec![region; ranks],
            heaps: vec![vec![0; heap]; ranks],
            streams: vec![vec![VecDeque::new(); streams]; ranks],
            lanes: vec![(0..streams).collect(); ranks],
            counts: vec![PieceCounts::new(ranks, streams); ranks],
        }
    }

    /// A new stream of rank `me` whose steps use `lane` (a side stream of that lane).
    fn side(&mut self, me: usize, lane: usize) -> usize {
        self.streams[me].push(VecDeque::new());
        self.lanes[me].push(lane);
        self.streams[me].len() - 1
    }

    /// Rank `me` posts sends and receives on `stream` (posting order = call order); returns
    /// the steps (what a graph would capture).
    fn post(
        &mut self,
        me: usize,
        stream: usize,
        sends: &[(usize, u64, usize)],
        recvs: &[(usize, u64, usize)],
    ) -> Vec<Step> {
        let steps = plan(me, &self.layout, &mut self.counts[me], stream, sends, recvs);
        self.streams[me][stream].extend(steps.iter().copied());
        steps
    }

    fn can_run(&self, me: usize, lane: usize, step: &Step) -> bool {
        let l = &self.layout;
        match *step {
            Step::WaitFree { peer, slot } => {
                flag(&self.regions[me], l.consumed(peer, lane, slot)) == 1
            }
            Step::WaitReady { peer, slot } => {
                flag(&self.regions[me], l.ready(peer, lane, slot)) == 1
            }
            _ => true,
        }
    }

    fn exec(&mut self, me: usize, lane: usize, step: Step) {
        let l = self.layout;
        match step {
            Step::WaitFree { .. } | Step::WaitReady { .. } => {}
            Step::Claim { peer, slot } => {
                put(&mut self.regions[me], l.consumed(peer, lane, slot), 0)
            }
            Step::Push {
                peer,
                slot,
                src,
                bytes,
            } => {
                let at = l.window(peer, me, lane, slot);
                let data = self.heaps[me][src as usize..src as usize + bytes].to_vec();
                self.regions[peer][at..at + bytes].copy_from_slice(&data);
            }
            Step::SignalReady { peer, slot } => {
                put(&mut self.regions[peer], l.ready(me, lane, slot), 1)
            }
            Step::Take { peer, slot } => put(&mut self.regions[me], l.ready(peer, lane, slot), 0),
            Step::Drain {
                peer,
                slot,
                dst,
                bytes,
            } => {
                let at = l.window(me, peer, lane, slot);
                let data = self.regions[me][at..at + bytes].to_vec();
                self.heaps[me][dst as usize..dst as usize + bytes].copy_from_slice(&data);
            }
            Step::SignalFree { peer, slot } => {
                put(&mut self.regions[peer], l.consumed(me, lane, slot), 1)
            }
        }
    }

    /// Whether a step still queued anywhere writes into `rank`'s region.
    fn writes_pending_into(&self, rank: usize) -> bool {
        self.streams.iter().flatten().flatten().any(|s| {
            matches!(
                *s,
                Step::Push { peer, .. } | Step::SignalReady { peer, .. }
                    | Step::SignalFree { peer, .. } if peer == rank
            )
        })
    }

    /// Whether every flag holds its initial value (ready 0, consumed 1).
    fn flags_at_rest(&self) -> bool {
        let l = &self.layout;
        let (first, count) = l.consumed_flags();
        self.regions.iter().all(|r| {
            (0..first / 4).all(|i| flag(r, 4 * i) == 0)
                && (0..count).all(|i| flag(r, first + 4 * i) == 1)
        })
    }

    /// Runs every stream to the end, picking a runnable stream at random each time; an
    /// error on deadlock or when a peer would write into an idle rank's region.
    fn run(&mut self, seed: u64) -> Result<(), String> {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        loop {
            let runnable: Vec<(usize, usize)> = (0..self.streams.len())
                .flat_map(|r| (0..self.streams[r].len()).map(move |s| (r, s)))
                .filter(|&(r, s)| {
                    self.streams[r][s]
                        .front()
                        .is_some_and(|step| self.can_run(r, self.lanes[r][s], step))
                })
                .collect();
            if runnable.is_empty() {
                let stuck: Vec<String> = self
                    .streams
                    .iter()
                    .enumerate()
                    .flat_map(|(r, ss)| {
                        ss.iter()
                            .enumerate()
                            .filter_map(move |(s, q)| q.front().map(|f| format!("{r}/{s}: {f:?}")))
                    })
                    .collect();
                return if stuck.is_empty() {
                    Ok(())
                } else {
                    Err(format!("deadlock: {stuck:?}"))
                };
            }
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let (r, s) = runnable[(rng % runnable.len() as u64) as usize];
            let step = self.streams[r][s].pop_front().unwrap();
            self.exec(r, self.lanes[r][s], step);
            for rank in 0..self.streams.len() {
                if self.streams[rank].iter().all(|q| q.is_empty()) && self.writes_pending_into(rank)
                {
                    return Err(format!(
                        "rank {rank}'s streams are idle but a peer will still write into its \
                         region"
                    ));
                }
            }
        }
    }
}

/// A byte pattern naming its rank and position.
fn pattern(rank: usize, tag: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (rank * 61 + tag * 17 + i * 7 + i / 251) as u8)
        .collect()
}

#[test]
fn an_allgather_longer_than_the_window_arrives_whole_in_every_schedule() {
    // 3 ranks, 2 slots of 256 bytes: each block of 1000 bytes is 4 pieces.
    let (n, len) = (3, 1000);
    for seed in 0..40 {
        let mut sim = Sim::new(n, 1, 2, 256, 8192);
        for r in 0..n {
            sim.heaps[r][..len].copy_from_slice(&pattern(r, 0, len));
        }
        for me in 0..n {
            // Input at 0, output blocks at 4096 + i * len.
            let peers: Vec<usize> = (0..n).filter(|&p| p != me).collect();
            let sends: Vec<_> = peers.iter().map(|&p| (p, 0, len)).collect();
            let recvs: Vec<_> = peers
                .iter()
                .map(|&p| (p, (4096 + p * len) as u64, len))
                .collect();
            sim.post(me, 0, &sends, &recvs);
        }
        sim.run(seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        for me in 0..n {
            for p in (0..n).filter(|&p| p != me) {
                let at = 4096 + p * len;
                assert_eq!(
                    sim.heaps[me][at..at + len],
                    pattern(p, 0, len)[..],
                    "seed {seed}"
                );
            }
        }
    }
}

/// A reduction in the windows (3 and 4 ranks, blocks of 4 pieces through 2 slots, twice in
/// a row on one lane): the pushes on a side stream per peer, the posting stream waiting for
/// each round's pieces, reading them where they landed (a drain into scratch stands for the
/// sum kernel's loads) and releasing them. Every rank reads every peer's block for it whole,
/// in every schedule, without deadlock, and the flags end at rest — also where all of a
/// rank's streams share one hardware queue (`serial`: everything in the order the transport
/// enqueues it, one queue per rank).
#[test]
fn a_reduction_in_the_windows_reads_every_piece_whole_in_every_schedule() {
    for serial in [false, true] {
        for n in [3, 4] {
            reduce_in_windows_sim(n, serial);
        }
    }
}

/// Queues on `q` the taking of `round`'s pieces, the copy of peer `i`'s piece of post `post`
/// to `8192 + post * 4096 + i * len` plus the round's offset, and the freeing of the slots.
fn drain_round(q: &mut VecDeque<Step>, round: &ReduceRound, post: usize, len: usize) {
    q.extend(round.taken.iter().copied());
    for (i, &(peer, slot)) in round.pieces.iter().enumerate() {
        let dst = 8192 + post * 4096 + i * len + round.offset;
        q.push_back(Step::Drain {
            peer,
            slot,
            dst: dst as u64,
            bytes: round.len,
        });
    }
    q.extend(round.freed.iter().copied());
}

impl Sim {
    /// Fills block `j` (of `len` bytes) of every rank `r`'s heap with `pattern(r, j, len)`.
    fn fill_blocks(&mut self, len: usize) {
        let n = self.heaps.len();
        for r in 0..n {
            for j in 0..n {
                self.heaps[r][j * len..(j + 1) * len].copy_from_slice(&pattern(r, j, len));
            }
        }
    }

    /// Checks that every rank received every peer's block (of `len` bytes) whole in each of
    /// two posts, where [`drain_round`] put it.
    fn assert_blocks_received(&self, len: usize, what: &str) {
        let n = self.heaps.len();
        for me in 0..n {
            let from: Vec<usize> = (0..n).filter(|&p| p != me).collect();
            for post in 0..2 {
                for (i, &p) in from.iter().enumerate() {
                    let at = 8192 + post * 4096 + i * len;
                    assert_eq!(
                        self.heaps[me][at..at + len],
                        pattern(p, me, len)[..],
                        "{what}, post {post}, rank {me} from {p}"
                    );
                }
            }
        }
    }
}

fn reduce_in_windows_sim(n: usize, serial: bool) {
    let len = 1000;
    for seed in 0..30 {
        let mut sim = Sim::new(n, 1, 2, 256, 16384);
        sim.fill_blocks(len);
        for post in 0..2 {
            for me in 0..n {
                let from: Vec<usize> = (0..n).filter(|&p| p != me).collect();
                let sends: Vec<_> = from.iter().map(|&p| (p, (p * len) as u64, len)).collect();
                let l = sim.layout;
                let steps = plan_reduce(me, &l, &mut sim.counts[me], 0, &sends, &from, len);
                assert_eq!(steps.rounds.len(), 4);
                // One side stream per peer, the same for every post (as the transport keeps
                // them): streams 1.. of each rank; queue 0 alone when serial.
                if post == 0 && !serial {
                    for _ in &from {
                        sim.side(me, 0);
                    }
                }
                let side = |peer: usize| {
                    if serial {
                        0
                    } else {
                        1 + from.iter().position(|&p| p == peer).unwrap()
                    }
                };
                for round in &steps.rounds {
                    for step in &round.pushes {
                        sim.streams[me][side(step.peer())].push_back(*step);
                    }
                    drain_round(&mut sim.streams[me][0], round, post, len);
                }
                for step in &steps.closing {
                    sim.streams[me][side(step.peer())].push_back(*step);
                }
            }
        }
        let what = format!("{n} ranks, serial {serial}, seed {seed}");
        sim.run(seed).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(sim.flags_at_rest(), "{what}");
        sim.assert_blocks_received(len, &what);
    }
}

/// A reduction whose input is produced where it is summed (`produce_in_windows`): every step
/// of a rank on its posting stream alone, pieces of whole granules smaller than a slot (200
/// of 256 bytes, so a block of 1000 takes 5 rounds through 2 slots), the production of a
/// peer's piece being a write of the rank's input into that peer's slot. Every rank reads
/// every peer's block whole, without deadlock, over two posts, and the flags end at rest.
#[test]
fn a_reduction_produced_into_the_windows_on_one_stream_reads_every_piece_whole() {
    let len = 1000;
    let piece = 200;
    for n in [2, 3, 4] {
        for seed in 0..30 {
            let mut sim = Sim::new(n, 1, 2, 256, 16384);
            sim.fill_blocks(len);
            for post in 0..2 {
                for me in 0..n {
                    let from: Vec<usize> = (0..n).filter(|&p| p != me).collect();
                    // Rotated, as the communicator posts them: the next rank first.
                    let mut sends: Vec<_> =
                        from.iter().map(|&p| (p, (p * len) as u64, len)).collect();
                    sends.sort_by_key(|s| (s.0 + n - me) % n);
                    let l = sim.layout;
                    let steps = plan_reduce_pieces(
                        me,
                        &l,
                        &mut sim.counts[me],
                        0,
                        &sends,
                        &from,
                        (len, piece),
                    );
                    assert_eq!(steps.rounds.len(), 5);
                    assert!(steps.rounds.iter().all(|r| r.len == piece));
                    let q = &mut sim.streams[me][0];
                    for round in &steps.rounds {
                        q.extend(round.pushes.iter().copied());
                        drain_round(q, round, post, len);
                    }
                    q.extend(steps.closing.iter().copied());
                }
            }
            let what = format!("{n} ranks, seed {seed}");
            sim.run(seed).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(sim.flags_at_rest(), "{what}");
            sim.assert_blocks_received(len, &what);
        }
    }
}

#[test]
fn posts_running_out_of_order_on_two_streams_meet_their_own_pieces() {
    // 2 ranks exchange 6 messages of different sizes, posts alternating between two
    // streams that the scheduler runs in any order; 2 slots of 256 bytes.
    let sizes = [100usize, 700, 256, 40, 513, 300];
    for seed in 0..60 {
        let mut sim = Sim::new(2, 2, 2, 256, 16384);
        let mut at = 0;
        let mut spots = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            for r in 0..2 {
                sim.heaps[r][at..at + len].copy_from_slice(&pattern(r, i, len));
            }
            spots.push((at as u64, (8192 + at) as u64, len));
            at += len;
        }
        for (i, &(src, dst, len)) in spots.iter().enumerate() {
            for me in 0..2 {
                sim.post(me, i % 2, &[(1 - me, src, len)], &[(1 - me, dst, len)]);
            }
        }
        sim.run(seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        for (i, &(_, dst, len)) in spots.iter().enumerate() {
            for me in 0..2 {
                let dst = dst as usize;
                assert_eq!(
                    sim.heaps[me][dst..dst + len],
                    pattern(1 - me, i, len)[..],
                    "seed {seed}, message {i}, rank {me}"
                );
            }
        }
    }
}

#[test]
fn a_ring_of_unequal_transfers_completes_with_one_slot() {
    // 4 ranks, each sends a different amount to the next and receives from the previous,
    // twice, through windows of a single slot.
    let n = 4;
    let len = |r: usize| 200 + r * 150;
    for seed in 0..40 {
        let mut sim = Sim::new(n, 1, 1, 256, 8192);
        for r in 0..n {
            sim.heaps[r][..len(r)].copy_from_slice(&pattern(r, 1, len(r)));
        }
        for round in 0..2u64 {
            for me in 0..n {
                let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
                sim.post(
                    me,
                    0,
                    &[(next, 0, len(me))],
                    &[(prev, 2048 + round * 2048, len(prev))],
                );
            }
        }
        sim.run(seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        for me in 0..n {
            let prev = (me + n - 1) % n;
            for round in 0..2 {
                let at = 2048 + round * 2048;
                assert_eq!(
                    sim.heaps[me][at..at + len(prev)],
                    pattern(prev, 1, len(prev))[..]
                );
            }
        }
    }
}

#[test]
fn replayed_steps_move_new_data_and_leave_the_flags_at_rest() {
    // Capture: two posts per rank on two streams (an allgather of 700 bytes and a ring of
    // 300), 2 slots of 256 bytes. Replay the captured steps three times with new inputs.
    let n = 3;
    let mut sim = Sim::new(n, 2, 2, 256, 16384);
    let mut captured: Vec<Vec<Vec<Step>>> = Vec::new();
    for me in 0..n {
        let peers: Vec<usize> = (0..n).filter(|&p| p != me).collect();
        let sends: Vec<_> = peers.iter().map(|&p| (p, 0, 700)).collect();
        let recvs: Vec<_> = peers
            .iter()
            .map(|&p| (p, (4096 + p * 700) as u64, 700))
            .collect();
        let gather = sim.post(me, 0, &sends, &recvs);
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let ring = sim.post(me, 1, &[(next, 1024, 300)], &[(prev, 8192, 300)]);
        captured.push(vec![gather, ring]);
    }
    // Nothing ran while capturing.
    for ss in &mut sim.streams {
        for q in ss {
            q.clear();
        }
    }
    for replay in 0..3 {
        for (r, streams) in captured.iter().enumerate() {
            sim.heaps[r][..700].copy_from_slice(&pattern(r, replay, 700));
            sim.heaps[r][1024..1324].copy_from_slice(&pattern(r, 10 + replay, 300));
            for (s, steps) in streams.iter().enumerate() {
                sim.streams[r][s].extend(steps.iter().copied());
            }
        }
        sim.run(replay as u64 + 11)
            .unwrap_or_else(|e| panic!("replay {replay}: {e}"));
        assert!(sim.flags_at_rest(), "replay {replay}");
        for me in 0..n {
            for p in (0..n).filter(|&p| p != me) {
                let at = 4096 + p * 700;
                assert_eq!(sim.heaps[me][at..at + 700], pattern(p, replay, 700)[..]);
            }
            let prev = (me + n - 1) % n;
            assert_eq!(
                sim.heaps[me][8192..8492],
                pattern(prev, 10 + replay, 300)[..]
            );
        }
    }
}

#[test]
fn a_rank_that_fails_before_the_exchange_is_named_by_its_peers() {
    let card = Card {
        process: 7,
        device: 0,
        lanes: 1,
        slots: 2,
        slot_bytes: 64,
        ptr: 0x1000,
        handle: [0; IPC_HANDLE_BYTES],
    };
    let all = vec![
        card.encode(),
        failure_card("out of memory: cuMemAlloc of 8388608 bytes"),
        card.encode(),
    ];
    assert_eq!(
        failed_peer(&all),
        Some((1, "out of memory: cuMemAlloc of 8388608 bytes".to_string()))
    );
    // A failure card is no window description, and a card is no failure.
    assert!(Card::decode(&all[1]).is_none());
    assert_eq!(failed_peer(&[card.encode()]), None);
}
