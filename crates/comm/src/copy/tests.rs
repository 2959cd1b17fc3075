//! The copy-engine communicator on the CPU: which operations its transport takes and which
//! go to the wrapped communicator, over buffers at made-up addresses.

use std::sync::Mutex;

use super::*;
use crate::nccl::fake::Fake;
use crate::{DataType, ReductionShape};

/// A bf16 device buffer by address only.
type Buf = Fake;

fn buf(ptr: u64, len: usize) -> Buf {
    Fake::contiguous(ptr, len, DataType::Bf16)
}

fn strided(ptr: u64, len: usize) -> Buf {
    Buf {
        contiguous: false,
        ..buf(ptr, len)
    }
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

/// Operation `op` labelled `label` over `team`.
fn collective(label: &str, team: Vec<usize>, op: CommOp<Buf>) -> Collective<Buf> {
    Collective {
        label: label.into(),
        team,
        op,
    }
}

#[test]
fn an_allgather_sends_its_input_and_receives_each_block_in_team_order() {
    // Rank 2 of team [3, 2, 0]: 100 bf16 elements (200 bytes) each.
    let gather = |input: Buf, output: Buf| {
        collective("ag", vec![3, 2, 0], CommOp::Allgather { input, output })
    };
    let t = allgather_transfers(2, &gather(buf(0x100, 100), buf(0x1000, 300))).unwrap();
    assert_eq!(t.local, vec![(0x1000 + 200, 0x100, 200)]);
    assert_eq!(t.sends, vec![(3, 0x100, 200), (0, 0x100, 200)]);
    assert_eq!(t.recvs, vec![(3, 0x1000, 200), (0, 0x1000 + 400, 200)]);
    assert_eq!(t.bytes(), 5 * 200);
    // Outside the team, a strided buffer or an output of the wrong size: NCCL moves it.
    assert!(allgather_transfers(1, &gather(buf(0, 100), buf(0, 300))).is_none());
    assert!(allgather_transfers(2, &gather(strided(0, 100), buf(0, 300))).is_none());
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
        buffer: strided(0, 4),
    }];
    assert!(p2p_transfers(0, &strided).unwrap().is_none());
    // A buffer sent to itself into the same memory moves nothing.
    let in_place = vec![
        P2p::Send {
            peer: 0,
            buffer: buf(0x20, 8),
        },
        P2p::Recv {
            peer: 0,
            buffer: buf(0x20, 8),
        },
    ];
    let t = p2p_transfers(0, &in_place).unwrap().unwrap();
    assert!(t.local.is_empty() && t.sends.is_empty() && t.recvs.is_empty());
}

/// What the fake communicator and transport saw, in order.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// The wrapped communicator got a collective (its label).
    Post(String),
    /// The wrapped communicator got a group (its label).
    Group(String),
    /// The transport moved these transfers of rank `me` for `label`.
    Moved {
        me: usize,
        label: String,
        transfers: Transfers,
    },
    Aborted(String),
    TransportAborted,
}

#[derive(Default)]
struct Log(Mutex<Vec<Seen>>);

impl Log {
    fn push(&self, seen: Seen) {
        self.0.lock().unwrap().push(seen);
    }
    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
    /// Records that the transport moved `t` of rank `me` for `label`.
    fn record(&self, me: usize, label: &str, t: &Transfers) {
        self.push(Seen::Moved {
            me,
            label: label.to_string(),
            transfers: t.clone(),
        });
    }
}

/// A copy's or transfer's `(rank or address, address, bytes)`.
type Piece<T> = (T, u64, usize);

/// What the transport moved of rank `me` for `label`.
fn moved(
    me: usize,
    label: &str,
    local: Vec<Piece<u64>>,
    sends: Vec<Piece<usize>>,
    recvs: Vec<Piece<usize>>,
) -> Seen {
    Seen::Moved {
        me,
        label: label.into(),
        transfers: Transfers {
            local,
            sends,
            recvs,
        },
    }
}

/// Rank 1 of 3, recording what it is asked to post.
struct Fallback(Arc<Log>);

impl Communicator for Fallback {
    type Buffer = Buf;
    type Stream = ();

    fn rank(&self) -> usize {
        1
    }
    fn size(&self) -> usize {
        3
    }
    fn timeout(&self) -> Duration {
        Duration::from_secs(7)
    }
    fn post(&self, collective: Collective<Buf>, _: &()) -> Result<(), CommError> {
        self.0.push(Seen::Post(collective.label));
        Ok(())
    }
    fn post_p2p(&self, label: String, _: Vec<P2p<Buf>>, _: &()) -> Result<(), CommError> {
        self.0.push(Seen::Group(label));
        Ok(())
    }
    fn abort(&self, reason: &str) {
        self.0.push(Seen::Aborted(reason.to_string()));
    }
}

/// A transport that records what it would move, and checks the timeout it is given. One
/// that reduces in its windows (`in_windows`) records the pushes and calls the sum for
/// pieces of 6 bytes, each peer's piece at `0x7000 + 0x100 * peer + offset`.
struct Recorder {
    log: Arc<Log>,
    in_windows: bool,
}

impl CopyTransport for Recorder {
    type Stream = ();

    fn transfer(
        &self,
        me: usize,
        label: &str,
        t: &Transfers,
        _: &(),
        timeout: Duration,
    ) -> Result<(), CommError> {
        assert_eq!(timeout, Duration::from_secs(7));
        self.log.record(me, label, t);
        Ok(())
    }

    fn abort(&self) {
        self.log.push(Seen::TransportAborted);
    }

    fn reduces_in_windows(&self) -> bool {
        self.in_windows
    }

    fn reduce_in_windows(
        &self,
        me: usize,
        label: &str,
        sends: &[(usize, u64, usize)],
        from: &[usize],
        bytes: usize,
        _: &(),
        _: Duration,
        sum: &mut WindowSum<'_, ()>,
    ) -> Result<(), CommError> {
        self.log.push(Seen::Moved {
            me,
            label: format!("{label} pushes from {from:?}"),
            transfers: Transfers {
                sends: sends.to_vec(),
                ..Transfers::default()
            },
        });
        for offset in (0..bytes).step_by(6) {
            let windows: Vec<u64> = from
                .iter()
                .map(|&p| 0x7000 + 0x100 * p as u64 + offset as u64)
                .collect();
            sum(offset, 6.min(bytes - offset), &windows, &())?;
        }
        Ok(())
    }
}

/// A copy-engine communicator over [`Fallback`] and a [`Recorder`], both logging to `log`.
fn recording(log: &Arc<Log>, in_windows: bool) -> CopyComm<Recorder, Fallback> {
    let transport = Recorder {
        log: log.clone(),
        in_windows,
    };
    CopyComm::with_transport(Arc::new(Fallback(log.clone())), transport)
}

#[test]
fn the_transport_takes_contiguous_allgathers_and_groups_and_the_rest_goes_to_the_inner_communicator(
) {
    let log = Arc::new(Log::default());
    let comm = recording(&log, false);
    assert_eq!(
        (comm.rank(), comm.size(), comm.timeout()),
        (1, 3, Duration::from_secs(7))
    );
    // What moves which, as traces name it: the transport a contiguous allgather, the inner
    // communicator (the program's label) a strided one and, without a reducer, a sum.
    let moved_by = |op| comm.moved_by(&collective("x", vec![0, 1, 2], op));
    let ar = || CommOp::Allreduce {
        input: buf(0x100, 4),
        output: buf(0x100, 4),
        op: RedOp::Sum,
    };
    assert_eq!(
        moved_by(CommOp::Allgather {
            input: buf(0x100, 4),
            output: buf(0x1000, 12),
        }),
        Some("copy-engine")
    );
    assert_eq!(
        moved_by(CommOp::Allgather {
            input: strided(0x100, 4),
            output: buf(0x1000, 12),
        }),
        None
    );
    assert_eq!(moved_by(ar()), None);
    let summing = recording(&log, true).with_reducer(Arc::new(Summer(log.clone())));
    let rs = CommOp::ReduceScatter {
        input: buf(0x100, 12),
        output: buf(0x1000, 4),
        op: RedOp::Sum,
    };
    assert_eq!(
        summing.moved_by(&collective("x", vec![0, 1, 2], rs)),
        Some("copy-engine")
    );
    assert_eq!(log.take(), vec![], "naming moves nothing");
    let post = |label: &str, op| comm.post(collective(label, vec![0, 1, 2], op), &());
    post(
        "ag",
        CommOp::Allgather {
            input: buf(0x100, 4),
            output: buf(0x1000, 12),
        },
    )
    .unwrap();
    post(
        "strided ag",
        CommOp::Allgather {
            input: strided(0x100, 4),
            output: buf(0x1000, 12),
        },
    )
    .unwrap();
    post(
        "ar",
        CommOp::Allreduce {
            input: buf(0x100, 4),
            output: buf(0x100, 4),
            op: RedOp::Sum,
        },
    )
    .unwrap();
    let send = |peer, buffer| P2p::Send { peer, buffer };
    let recv = |peer, buffer| P2p::Recv { peer, buffer };
    comm.post_p2p(
        "ring".into(),
        vec![send(2, buf(0x200, 2)), recv(0, buf(0x300, 2))],
        &(),
    )
    .unwrap();
    comm.post_p2p("strided".into(), vec![send(2, strided(0x200, 2))], &())
        .unwrap();
    let error = comm
        .post_p2p("lonely".into(), vec![send(1, buf(0x200, 2))], &())
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        CommError::Backend {
            op: "lonely".into(),
            message: "rank 1: 1 send(s) to itself but 0 receive(s) from itself".into(),
        }
        .to_string()
    );
    comm.abort("stop");
    assert_eq!(
        log.take(),
        vec![
            moved(
                1,
                "ag",
                vec![(0x1000 + 8, 0x100, 8)],
                vec![(0, 0x100, 8), (2, 0x100, 8)],
                vec![(0, 0x1000, 8), (2, 0x1000 + 16, 8)]
            ),
            Seen::Post("strided ag".into()),
            Seen::Post("ar".into()),
            moved(1, "ring", vec![], vec![(2, 0x200, 4)], vec![(0, 0x300, 4)]),
            Seen::Group("strided".into()),
            Seen::TransportAborted,
            Seen::Aborted("stop".into()),
        ]
    );
}

/// A reducer that records its kernels and hands out scratch at a made-up address.
struct Summer(Arc<Log>);

impl Reducer<()> for Summer {
    fn with_scratch(
        &self,
        bytes: usize,
        _: &(),
        f: &mut dyn FnMut(u64) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        self.0.push(Seen::Post(format!("scratch {bytes}")));
        f(0x9000)?;
        self.0.push(Seen::Post("scratch freed".into()));
        Ok(())
    }

    fn sum_blocks(
        &self,
        out: u64,
        src: u64,
        blocks: usize,
        n: usize,
        dtype: DataType,
        _: &(),
    ) -> Result<(), CommError> {
        self.0.push(Seen::Post(format!(
            "sum {blocks} blocks of {n} {dtype:?} at {src:#x} into {out:#x}"
        )));
        Ok(())
    }

    fn sum_pointers(
        &self,
        out: u64,
        srcs: &[u64],
        n: usize,
        dtype: DataType,
        _: &(),
    ) -> Result<(), CommError> {
        let srcs: Vec<String> = srcs.iter().map(|a| format!("{a:#x}")).collect();
        self.0.push(Seen::Post(format!(
            "sum {n} {dtype:?} of [{}] into {out:#x}",
            srcs.join(", ")
        )));
        Ok(())
    }

    fn reduces(&self, dtype: DataType) -> bool {
        dtype == DataType::Bf16
    }

    fn load(&self, kernel: SumKernel) -> Result<(), CommError> {
        self.0.push(Seen::Post(format!("load {kernel:?}")));
        Ok(())
    }
}

/// Loading ahead asks the reducer for each distinct kernel once, only for element types it
/// reduces; a communicator without a reducer loads nothing.
#[test]
fn reductions_are_loaded_once_per_kernel_and_only_with_a_reducer() {
    let log = Arc::new(Log::default());
    let shape = |dtype, output_len| ReductionShape {
        team: 2,
        allreduce: false,
        dtype,
        input_len: 2 * output_len,
        output_len,
        row: 8,
    };
    let shapes = [
        shape(DataType::Bf16, 64),
        shape(DataType::Bf16, 64),
        shape(DataType::F64, 64),
        shape(DataType::Bf16, 32),
    ];
    recording(&log, false).load_reductions(&shapes).unwrap();
    assert_eq!(log.take(), vec![]);
    let comm = recording(&log, false).with_reducer(Arc::new(Summer(log.clone())));
    comm.load_reductions(&shapes).unwrap();
    assert_eq!(
        log.take(),
        vec![
            Seen::Post("load Blocks { dtype: Bf16, blocks: 2, n: 64 }".into()),
            Seen::Post("load Blocks { dtype: Bf16, blocks: 2, n: 32 }".into()),
        ]
    );
}

/// Where the transport reduces in its windows, no scratch is taken: each piece is summed
/// from the member's own block and the peers' pieces, in team order, into its place in the
/// output; an allreduce then gathers as before.
#[test]
fn a_transport_that_reduces_in_its_windows_sums_each_piece_in_team_order() {
    let log = Arc::new(Log::default());
    let comm = recording(&log, true).with_reducer(Arc::new(Summer(log.clone())));
    // Rank 1 is team index 1 of [2, 1, 0]: 3 blocks of 4 bf16 (8 bytes), pieces of 6 bytes.
    let post = |label: &str, op| {
        comm.post(collective(label, vec![2, 1, 0], op), &())
            .unwrap()
    };
    post(
        "rs",
        CommOp::ReduceScatter {
            input: buf(0x100, 12),
            output: buf(0x1000, 4),
            op: RedOp::Sum,
        },
    );
    assert_eq!(
        log.take(),
        vec![
            Seen::Moved {
                me: 1,
                label: "rs pushes from [2, 0]".into(),
                transfers: Transfers {
                    sends: vec![(2, 0x100, 8), (0, 0x100 + 16, 8)],
                    ..Transfers::default()
                },
            },
            Seen::Post("sum 3 Bf16 of [0x7200, 0x108, 0x7000] into 0x1000".into()),
            Seen::Post("sum 1 Bf16 of [0x7206, 0x10e, 0x7006] into 0x1006".into()),
        ]
    );
    post(
        "ar",
        CommOp::Allreduce {
            input: buf(0x100, 12),
            output: buf(0x1000, 12),
            op: RedOp::Sum,
        },
    );
    let seen = log.take();
    assert_eq!(
        seen[1],
        Seen::Post("sum 3 Bf16 of [0x7200, 0x108, 0x7000] into 0x1008".into())
    );
    assert_eq!(
        seen[3],
        moved(
            1,
            "ar (gather)",
            vec![],
            vec![(2, 0x1008, 8), (0, 0x1008, 8)],
            vec![(2, 0x1000, 8), (0, 0x1000 + 16, 8)]
        )
    );
    assert_eq!(seen.len(), 4);
}

/// With a reducer, a sum reduce-scatter pushes each block to its owner's scratch and sums
/// the scratch in team order; an allreduce then gathers the reduced blocks; whatever does
/// not fit (another reduction, in place, sizes the team does not divide, strided, a team of
/// one) goes to the inner communicator.
#[test]
fn sum_reductions_go_through_the_copy_engines_with_a_reducer_and_the_rest_to_nccl() {
    let log = Arc::new(Log::default());
    let comm = recording(&log, false).with_reducer(Arc::new(Summer(log.clone())));
    let post = |label: &str, team, op| comm.post(collective(label, team, op), &()).unwrap();
    let rs = |input, output, op| CommOp::ReduceScatter { input, output, op };
    let ar = |input, output, op| CommOp::Allreduce { input, output, op };
    // Rank 1 keeps its block 1 and pushes blocks 0 and 2 to ranks 0 and 2, receiving theirs
    // into the scratch at 0x9000.
    let to_scratch = |label: &str| {
        moved(
            1,
            label,
            vec![(0x9000 + 8, 0x100 + 8, 8)],
            vec![(0, 0x100, 8), (2, 0x100 + 16, 8)],
            vec![(0, 0x9000, 8), (2, 0x9000 + 16, 8)],
        )
    };
    // Rank 1 is team index 1 of [0, 1, 2]: 3 blocks of 4 bf16 (8 bytes). Its block 1 is
    // summed from the scratch into the output: of 4 for a reduce-scatter; for an allreduce of
    // 12 into the output's block 1, then sent to 0 and 2, whose blocks land at the output's
    // blocks 0 and 2.
    for (label, op, sum, then) in [
        (
            "rs",
            rs(buf(0x100, 12), buf(0x1000, 4), RedOp::Sum),
            "sum 3 blocks of 4 Bf16 at 0x9000 into 0x1000",
            vec![],
        ),
        (
            "ar",
            ar(buf(0x100, 12), buf(0x1000, 12), RedOp::Sum),
            "sum 3 blocks of 4 Bf16 at 0x9000 into 0x1008",
            vec![moved(
                1,
                "ar (gather)",
                vec![],
                vec![(0, 0x1008, 8), (2, 0x1008, 8)],
                vec![(0, 0x1000, 8), (2, 0x1000 + 16, 8)],
            )],
        ),
    ] {
        post(label, vec![0, 1, 2], op);
        let mut expected = vec![
            Seen::Post("scratch 24".into()),
            to_scratch(label),
            Seen::Post(sum.into()),
        ];
        expected.extend(then);
        expected.push(Seen::Post("scratch freed".into()));
        assert_eq!(log.take(), expected, "{label}");
    }
    // A team of two, where rank 1 is index 0.
    post(
        "rs2",
        vec![1, 0],
        rs(buf(0x100, 8), buf(0x1000, 4), RedOp::Sum),
    );
    let seen = log.take();
    assert_eq!(
        seen[1],
        moved(
            1,
            "rs2",
            vec![(0x9000, 0x100, 8)],
            vec![(0, 0x100 + 8, 8)],
            vec![(0, 0x9000 + 8, 8)]
        )
    );
    // What the copy engines do not take.
    for (label, op) in [
        ("max", ar(buf(0x100, 12), buf(0x1000, 12), RedOp::Max)),
        ("in place", ar(buf(0x100, 12), buf(0x100, 12), RedOp::Sum)),
        ("overlap", rs(buf(0x100, 12), buf(0x108, 4), RedOp::Sum)),
        ("uneven", ar(buf(0x100, 10), buf(0x1000, 10), RedOp::Sum)),
        ("sizes", rs(buf(0x100, 12), buf(0x1000, 5), RedOp::Sum)),
        (
            "strided",
            rs(strided(0x100, 12), buf(0x1000, 4), RedOp::Sum),
        ),
    ] {
        post(label, vec![0, 1, 2], op);
    }
    post(
        "alone",
        vec![1],
        ar(buf(0x100, 4), buf(0x1000, 4), RedOp::Sum),
    );
    let expected: Vec<Seen> = [
        "max", "in place", "overlap", "uneven", "sizes", "strided", "alone",
    ]
    .into_iter()
    .map(|l| Seen::Post(l.into()))
    .collect();
    assert_eq!(log.take(), expected);
}
