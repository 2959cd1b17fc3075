//! The plan compiler's tests, over buffers at made-up addresses.

use super::*;
use crate::nccl::fake::Fake;

fn buf(ptr: u64, len: usize) -> Fake {
    Fake::contiguous(ptr, len, DataType::F32)
}

const IN: u64 = 0x10_0000;
const OUT: u64 = 0x20_0000;

fn plan(op: CommOp<Fake>, index: usize, n: usize) -> Plan {
    plan_collective(&op, index, n).unwrap()
}

fn copy(dst: u64, src: u64, bytes: usize) -> DeviceCopy {
    DeviceCopy { dst, src, bytes }
}

/// An f32 `ncclSend` of `count` elements at `buf` to `peer`.
fn send_call(buf: u64, count: usize, peer: usize) -> Call {
    Call::Send {
        buf,
        count,
        dtype: DataType::F32,
        peer,
    }
}

/// An f32 `ncclRecv` of `count` elements into `buf` from `peer`.
fn recv_call(buf: u64, count: usize, peer: usize) -> Call {
    Call::Recv {
        buf,
        count,
        dtype: DataType::F32,
        peer,
    }
}

#[test]
fn native_collectives() {
    let f32 = DataType::F32;
    let p = plan(
        CommOp::Allgather {
            input: buf(IN, 3),
            output: buf(OUT, 12),
        },
        1,
        4,
    );
    assert_eq!(
        p.calls,
        vec![Call::AllGather {
            send: IN,
            recv: OUT,
            count: 3,
            dtype: f32
        }]
    );
    assert!(p.copies.is_empty() && !p.grouped());
    let p = plan(
        CommOp::ReduceScatter {
            input: buf(IN, 12),
            output: buf(OUT, 3),
            op: RedOp::Max,
        },
        0,
        4,
    );
    assert_eq!(
        p.calls,
        vec![Call::ReduceScatter {
            send: IN,
            recv: OUT,
            count: 3,
            dtype: f32,
            op: RedOp::Max
        }]
    );
    let p = plan(
        CommOp::Allreduce {
            input: buf(IN, 5),
            output: buf(OUT, 5),
            op: RedOp::Sum,
        },
        0,
        2,
    );
    assert_eq!(
        p.calls,
        vec![Call::AllReduce {
            send: IN,
            recv: OUT,
            count: 5,
            dtype: f32,
            op: RedOp::Sum
        }]
    );
    // Broadcast: the root sends its input; a non-root's input is never looked at.
    let bcast = |index| {
        plan(
            CommOp::Broadcast {
                root: 1,
                input: Fake {
                    contiguous: index == 1,
                    ..buf(IN, if index == 1 { 4 } else { 99 })
                },
                output: buf(OUT, 4),
            },
            index,
            3,
        )
    };
    assert_eq!(
        bcast(1).calls,
        vec![Call::Broadcast {
            send: IN,
            recv: OUT,
            count: 4,
            dtype: f32,
            root: 1
        }]
    );
    assert_eq!(
        bcast(0).calls,
        vec![Call::Broadcast {
            send: OUT,
            recv: OUT,
            count: 4,
            dtype: f32,
            root: 1
        }]
    );
    // Reduce: a non-root's output is never looked at, its receive buffer is its input.
    let reduce = |index| {
        plan(
            CommOp::Reduce {
                root: 0,
                input: buf(IN, 4),
                output: Fake {
                    dtype: if index == 0 {
                        DataType::F32
                    } else {
                        DataType::Bool
                    },
                    ..buf(OUT, if index == 0 { 4 } else { 1 })
                },
                op: RedOp::Prod,
            },
            index,
            2,
        )
    };
    assert_eq!(
        reduce(0).calls,
        vec![Call::Reduce {
            send: IN,
            recv: OUT,
            count: 4,
            dtype: f32,
            op: RedOp::Prod,
            root: 0
        }]
    );
    assert_eq!(
        reduce(1).calls,
        vec![Call::Reduce {
            send: IN,
            recv: IN,
            count: 4,
            dtype: f32,
            op: RedOp::Prod,
            root: 0
        }]
    );
}

#[test]
fn gather_and_scatter_are_point_to_point_groups_with_a_local_copy() {
    let gather = |input, output| CommOp::Gather {
        root: 1,
        input: buf(IN, input),
        output: buf(OUT, output),
    };
    let scatter = |input, output| CommOp::Scatter {
        root: 0,
        input: buf(IN, input),
        output: buf(OUT, output),
    };
    let root = plan(gather(2, 6), 1, 3);
    assert_eq!(
        root.calls,
        vec![recv_call(OUT, 2, 0), recv_call(OUT + 16, 2, 2),]
    );
    assert_eq!(root.copies, vec![copy(OUT + 8, IN, 8)]);
    assert!(root.grouped());
    let leaf = plan(gather(2, 0), 2, 3);
    assert_eq!(leaf.calls, vec![send_call(IN, 2, 1)]);
    assert!(leaf.copies.is_empty() && leaf.grouped());

    let root = plan(scatter(6, 2), 0, 3);
    assert_eq!(
        root.calls,
        vec![send_call(IN + 8, 2, 1), send_call(IN + 16, 2, 2),]
    );
    assert_eq!(root.copies, vec![copy(OUT, IN, 8)]);
    let leaf = plan(scatter(0, 2), 2, 3);
    assert_eq!(leaf.calls, vec![recv_call(OUT, 2, 0)]);
}

#[test]
fn all_to_all_permute_and_send_recv() {
    let p = plan(
        CommOp::AllToAll {
            input: buf(IN, 6),
            output: buf(OUT, 6),
        },
        1,
        3,
    );
    assert_eq!(
        p.calls,
        vec![
            send_call(IN, 2, 0),
            send_call(IN + 16, 2, 2),
            recv_call(OUT, 2, 0),
            recv_call(OUT + 16, 2, 2),
        ]
    );
    assert_eq!(p.copies, vec![copy(OUT + 8, IN + 8, 8)]);

    let p = plan(
        CommOp::CollectivePermute {
            input: buf(IN, 4),
            output: buf(OUT, 4),
            send_to: 2,
            recv_from: 0,
        },
        1,
        3,
    );
    assert_eq!(p.calls, vec![send_call(IN, 4, 2), recv_call(OUT, 4, 0)]);
    let p = plan(
        CommOp::CollectivePermute {
            input: buf(IN, 4),
            output: buf(OUT, 4),
            send_to: 1,
            recv_from: 1,
        },
        1,
        3,
    );
    assert!(p.calls.is_empty());
    assert_eq!(p.copies, vec![copy(OUT, IN, 16)]);
    assert_eq!(
        plan_collective(
            &CommOp::CollectivePermute {
                input: buf(IN, 4),
                output: buf(OUT, 4),
                send_to: 1,
                recv_from: 0,
            },
            1,
            3
        )
        .unwrap_err(),
        "member 1 sends to itself but receives from member 0"
    );

    let send = |index| {
        plan(
            CommOp::SendRecv {
                root: 1,
                input: buf(IN, 3),
                output: buf(OUT, 3),
            },
            index,
            2,
        )
    };
    assert_eq!(send(1).calls, vec![send_call(IN, 3, 0)]);
    assert_eq!(send(0).calls, vec![recv_call(OUT, 3, 1)]);
}

#[test]
fn empty_chunks_issue_no_call_on_any_member() {
    // The empty last chunk of an axis that the stream chunks do not divide: every member
    // holds zero elements, so every member plans nothing and none waits for another.
    for index in 0..2 {
        let ops = [
            CommOp::Allreduce {
                input: buf(IN, 0),
                output: buf(OUT, 0),
                op: RedOp::Sum,
            },
            CommOp::Allgather {
                input: buf(IN, 0),
                output: buf(OUT, 0),
            },
            CommOp::ReduceScatter {
                input: buf(IN, 0),
                output: buf(OUT, 0),
                op: RedOp::Sum,
            },
        ];
        for op in ops {
            let p = plan(op, index, 2);
            assert!(p.calls.is_empty() && p.copies.is_empty(), "{p:?}");
        }
    }
    let p = plan_p2p(
        0,
        2,
        &[
            P2p::Send {
                peer: 1,
                buffer: buf(IN, 0),
            },
            P2p::Recv {
                peer: 1,
                buffer: buf(OUT, 0),
            },
        ],
    )
    .unwrap();
    assert!(p.calls.is_empty() && p.copies.is_empty(), "{p:?}");
}

#[test]
fn one_member_teams_copy_or_do_nothing() {
    let ops: Vec<CommOp<Fake>> = vec![
        CommOp::Allgather {
            input: buf(IN, 3),
            output: buf(OUT, 3),
        },
        CommOp::Allreduce {
            input: buf(IN, 3),
            output: buf(OUT, 3),
            op: RedOp::Sum,
        },
        CommOp::ReduceScatter {
            input: buf(IN, 3),
            output: buf(OUT, 3),
            op: RedOp::Sum,
        },
        CommOp::Broadcast {
            root: 0,
            input: buf(IN, 3),
            output: buf(OUT, 3),
        },
        CommOp::Reduce {
            root: 0,
            input: buf(IN, 3),
            output: buf(OUT, 3),
            op: RedOp::Min,
        },
        CommOp::Gather {
            root: 0,
            input: buf(IN, 3),
            output: buf(OUT, 3),
        },
        CommOp::Scatter {
            root: 0,
            input: buf(IN, 3),
            output: buf(OUT, 3),
        },
        CommOp::AllToAll {
            input: buf(IN, 3),
            output: buf(OUT, 3),
        },
        CommOp::CollectivePermute {
            input: buf(IN, 3),
            output: buf(OUT, 3),
            send_to: 0,
            recv_from: 0,
        },
    ];
    for op in ops {
        let name = op.name();
        let p = plan(op, 0, 1);
        assert!(p.calls.is_empty(), "{name}");
        assert_eq!(p.copies, vec![copy(OUT, IN, 12)], "{name}");
    }
    // In place: nothing at all.
    let p = plan(
        CommOp::Allreduce {
            input: buf(IN, 3),
            output: buf(IN, 3),
            op: RedOp::Sum,
        },
        0,
        1,
    );
    assert_eq!(p, Plan::default());
    // A send-recv needs two members, as in Local.
    assert_eq!(
        plan_collective(
            &CommOp::SendRecv {
                root: 0,
                input: buf(IN, 3),
                output: buf(OUT, 3)
            },
            0,
            1
        )
        .unwrap_err(),
        "send-recv needs a team of two ranks, not 1"
    );
}

#[test]
fn plans_check_what_one_member_can() {
    let err = |op: CommOp<Fake>, index, n| plan_collective(&op, index, n).unwrap_err();
    assert_eq!(
        err(
            CommOp::Allgather {
                input: buf(IN, 3),
                output: buf(OUT, 10)
            },
            0,
            4
        ),
        "the output has 10 elements but must have 4 times the elements of the other \
         buffer, 12"
    );
    assert_eq!(
        err(
            CommOp::Allreduce {
                input: buf(IN, 3),
                output: buf(OUT, 4),
                op: RedOp::Sum
            },
            0,
            2
        ),
        "the output has 4 elements but must have as many elements as the other buffer, 3"
    );
    assert_eq!(
        err(
            CommOp::Broadcast {
                root: 3,
                input: buf(IN, 3),
                output: buf(OUT, 3)
            },
            0,
            3
        ),
        "root 3 is out of range for a team of 3"
    );
    assert_eq!(
        err(
            CommOp::AllToAll {
                input: buf(IN, 7),
                output: buf(OUT, 7)
            },
            0,
            2
        ),
        "the input's 7 elements do not split into 2 equal pieces"
    );
    assert_eq!(
        err(
            CommOp::Allreduce {
                input: buf(IN, 3),
                output: Fake {
                    dtype: DataType::Bf16,
                    ..buf(OUT, 3)
                },
                op: RedOp::Sum
            },
            0,
            2
        ),
        "the input is f32 but the output is bf16"
    );
    assert_eq!(
        err(
            CommOp::CollectivePermute {
                input: buf(IN, 3),
                output: buf(OUT, 3),
                send_to: 0,
                recv_from: 5
            },
            0,
            2
        ),
        "recv_from 5 is out of range for a team of 2"
    );
    assert_eq!(
        err(
            CommOp::ReduceScatter {
                input: Fake {
                    contiguous: false,
                    ..buf(IN, 4)
                },
                output: buf(OUT, 2),
                op: RedOp::Sum
            },
            0,
            2
        ),
        "the input is not contiguous; NCCL moves contiguous memory only"
    );
    assert_eq!(
        err(
            CommOp::Gather {
                root: 0,
                input: buf(IN, 2),
                output: Fake {
                    contiguous: false,
                    ..buf(OUT, 4)
                }
            },
            0,
            2
        ),
        "the output is not contiguous; NCCL moves contiguous memory only"
    );
}

#[test]
fn point_to_point_groups() {
    let ops = vec![
        P2p::Recv {
            peer: 0,
            buffer: buf(OUT, 4),
        },
        P2p::Send {
            peer: 2,
            buffer: buf(IN, 4),
        },
        P2p::Send {
            peer: 1,
            buffer: buf(IN + 64, 2),
        },
        P2p::Recv {
            peer: 1,
            buffer: buf(OUT + 64, 2),
        },
    ];
    let p = plan_p2p(1, 3, &ops).unwrap();
    // Sends first, then receives; the transfer to itself is a copy.
    assert_eq!(p.calls, vec![send_call(IN, 4, 2), recv_call(OUT, 4, 0)]);
    assert_eq!(p.copies, vec![copy(OUT + 64, IN + 64, 8)]);
    assert!(p.grouped());

    let err = |ops: Vec<P2p<Fake>>| plan_p2p(0, 2, &ops).unwrap_err();
    let send = |peer, buffer| P2p::Send { peer, buffer };
    let recv = |peer, buffer| P2p::Recv { peer, buffer };
    assert_eq!(
        err(vec![send(2, buf(IN, 1))]),
        "rank 2 is outside the world of 2 ranks"
    );
    assert_eq!(
        err(vec![send(0, buf(IN, 1))]),
        "rank 0 sends to itself 1 time(s) but receives from itself 0 time(s) in this \
         group; a transfer to itself must be matched within one group"
    );
    assert_eq!(
        err(vec![send(0, buf(IN, 1)), recv(0, buf(OUT, 2))]),
        "rank 0 sends 1 elements to itself but receives 2"
    );
    let strided = Fake {
        contiguous: false,
        ..buf(OUT, 2)
    };
    assert_eq!(
        err(vec![recv(1, strided)]),
        "the buffer received from rank 1 is not contiguous; NCCL moves contiguous memory \
         only"
    );
    assert_eq!(plan_p2p::<Fake>(0, 2, &[]).unwrap(), Plan::default());
}

#[test]
fn piece_addresses_do_not_overflow() {
    let o = Operand {
        what: "output".into(),
        ptr: u64::MAX - 4,
        len: 4,
        dtype: DataType::F64,
    };
    assert_eq!(
        o.piece(1, 4).unwrap_err(),
        "piece 1 of the output overflows its address"
    );
    assert_eq!(o.piece(0, 4).unwrap(), u64::MAX - 4);
}
