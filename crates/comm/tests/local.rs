//! Tests of the in-process `Local` communicator: every collective, point-to-point groups,
//! validation, mismatches between ranks, timeouts and aborts, with one worker-thread stream
//! per rank.

use std::sync::mpsc;
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use weave_comm::{
    Collective, CommError, CommOp, Communicator, DataType, HostView, Local, LocalWorld, P2p, RedOp,
    Task, TaskQueue,
};

/// The stream type `Local` posts on.
type Stream = dyn TaskQueue + 'static;

const LONG: Duration = Duration::from_secs(30);

/// The errors of a stream's tasks, each with its task's label.
type Errors = Vec<(String, CommError)>;

/// A stream: one worker thread running its tasks in FIFO order, collecting their errors.
struct Worker {
    tx: Mutex<Option<mpsc::Sender<(String, Task)>>>,
    handle: Mutex<Option<thread::JoinHandle<Errors>>>,
}

impl Worker {
    fn new() -> Worker {
        let (tx, rx) = mpsc::channel::<(String, Task)>();
        let handle = thread::spawn(move || {
            let mut errors = Vec::new();
            for (label, task) in rx {
                if let Err(e) = task() {
                    errors.push((label, e));
                }
            }
            errors
        });
        Worker {
            tx: Mutex::new(Some(tx)),
            handle: Mutex::new(Some(handle)),
        }
    }

    /// Waits for every queued task; returns the errors, each with its task's label.
    fn finish(&self) -> Errors {
        drop(self.tx.lock().unwrap().take());
        match self.handle.lock().unwrap().take() {
            Some(handle) => handle.join().expect("a task panicked"),
            None => Vec::new(),
        }
    }
}

impl TaskQueue for Worker {
    fn enqueue(&self, label: String, task: Task) {
        let tx = self.tx.lock().unwrap();
        tx.as_ref()
            .expect("enqueue after finish")
            .send((label, task))
            .unwrap();
    }
}

/// A stream that only records what is queued on it, and never runs anything.
#[derive(Default)]
struct Recorder {
    tasks: Mutex<Vec<(String, Task)>>,
}

impl Recorder {
    fn labels(&self) -> Vec<String> {
        self.tasks
            .lock()
            .unwrap()
            .iter()
            .map(|(l, _)| l.clone())
            .collect()
    }
}

impl TaskQueue for Recorder {
    fn enqueue(&self, label: String, task: Task) {
        self.tasks.lock().unwrap().push((label, task));
    }
}

/// What one rank's thread produced, and the errors of its stream's tasks.
struct Outcome<R> {
    value: R,
    errors: Vec<CommError>,
}

/// Runs `body` on `n` rank threads of a fresh world, each posting on its own worker stream,
/// and waits until every stream has drained.
fn run_world<R: Send>(
    n: usize,
    timeout: Duration,
    body: impl Fn(usize, &Local, &Stream) -> R + Sync,
) -> (LocalWorld, Vec<Outcome<R>>) {
    let world = LocalWorld::new(n, timeout);
    let outcomes = run_in(&world, body);
    (world, outcomes)
}

/// Runs `body` on a rank thread per rank of `world`, each posting on its own worker stream,
/// and waits until every stream has drained.
fn run_in<R: Send>(
    world: &LocalWorld,
    body: impl Fn(usize, &Local, &Stream) -> R + Sync,
) -> Vec<Outcome<R>> {
    let n = world.size();
    thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let body = &body;
                s.spawn(move || {
                    let comm = world.communicator(rank);
                    let stream = Worker::new();
                    let value = body(rank, &comm, &stream);
                    let errors = stream.finish().into_iter().map(|(_, e)| e).collect();
                    Outcome { value, errors }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank thread panicked"))
            .collect()
    })
}

/// `run_world` for runs that must succeed: checks that no task failed and that the world
/// holds nothing afterwards, and returns each rank's value.
fn run_ok<R: Send>(n: usize, body: impl Fn(usize, &Local, &Stream) -> R + Sync) -> Vec<R> {
    let (world, outcomes) = run_world(n, LONG, body);
    for (rank, o) in outcomes.iter().enumerate() {
        assert!(o.errors.is_empty(), "rank {rank} failed: {:?}", o.errors);
    }
    assert_eq!(world.pending(), 0, "slots or messages left behind");
    outcomes.into_iter().map(|o| o.value).collect()
}

fn view(dtype: DataType, values: &[f64]) -> HostView {
    HostView::from_values(dtype, &[values.len()], values).unwrap()
}

/// An uninitialised (NaN-poisoned) buffer of `len` elements.
fn poisoned(dtype: DataType, len: usize) -> HostView {
    HostView::allocate(dtype, &[len], false)
}

/// Rank-dependent values, exactly representable in `dtype` (f32 values carry a 2^-10 part
/// that bf16 could not hold).
fn data(dtype: DataType, rank: usize, len: usize) -> Vec<f64> {
    let fine = if dtype == DataType::F32 {
        1.0 / 1024.0
    } else {
        0.0
    };
    (0..len)
        .map(|i| {
            let x = rank as f64 * 10.0 + i as f64 * 0.5 + 1.0 + fine;
            assert_eq!(dtype.round(x), x, "test data must be exact");
            x
        })
        .collect()
}

fn post(comm: &Local, stream: &Stream, label: &str, team: &[usize], op: CommOp<HostView>) {
    comm.post(
        Collective {
            label: label.to_string(),
            team: team.to_vec(),
            op,
        },
        stream,
    )
    .unwrap();
}

/// Posts a group of one receive into `buffer` from `peer`.
fn post_recv(comm: &Local, stream: &Stream, label: &str, peer: usize, buffer: HostView) {
    comm.post_p2p(label.into(), vec![P2p::Recv { peer, buffer }], stream)
        .unwrap();
}

/// The error of `rank`'s operation `op` that waited for ranks `waiting_for` for `millis` ms.
fn timed_out(op: &str, rank: usize, waiting_for: Vec<usize>, millis: u64) -> CommError {
    CommError::Timeout {
        op: op.into(),
        rank,
        waiting_for,
        millis,
    }
}

/// The error of `rank`'s operation `op` when `failed_rank` failed for `reason`.
fn peer_failed(op: &str, rank: usize, failed_rank: usize, reason: &str) -> CommError {
    CommError::PeerFailed {
        op: op.into(),
        rank,
        failed_rank,
        reason: reason.into(),
    }
}

/// `run_ok` on `n` ranks where every rank posts `op(rank, input, output)` as `label` on the
/// whole world: its input `data(dtype, rank, in_len)`, its output `out_len` poisoned
/// elements, which it returns.
fn run_world_op(
    n: usize,
    dtype: DataType,
    label: &str,
    (in_len, out_len): (usize, usize),
    op: impl Fn(usize, HostView, HostView) -> CommOp<HostView> + Sync,
) -> Vec<HostView> {
    run_posting(
        n,
        dtype,
        label,
        |_| out_len,
        |rank, output| {
            let input = view(dtype, &data(dtype, rank, in_len));
            op(rank, input, output)
        },
    )
}

/// `run_ok` on `n` ranks where every rank posts `op(rank, output)` as `label` on the whole
/// world, its output `out_len(rank)` poisoned elements, which it returns.
fn run_posting(
    n: usize,
    dtype: DataType,
    label: &str,
    out_len: impl Fn(usize) -> usize + Sync,
    op: impl Fn(usize, HostView) -> CommOp<HostView> + Sync,
) -> Vec<HostView> {
    run_ok(n, |rank, comm, stream| {
        let output = poisoned(dtype, out_len(rank));
        let op = op(rank, output.clone());
        post(comm, stream, label, &world_team(n), op);
        output
    })
}

/// `run_ok` on 4 ranks where the members of `team` post `op(rank, output)` as `label`, their
/// output `out_len` poisoned `dtype` elements, which they return; the other ranks post
/// nothing and return `None`.
fn run_team(
    team: &[usize],
    dtype: DataType,
    label: &str,
    out_len: usize,
    op: impl Fn(usize, HostView) -> CommOp<HostView> + Sync,
) -> Vec<Option<HostView>> {
    run_ok(4, |rank, comm, stream| {
        if !team.contains(&rank) {
            return None;
        }
        let output = poisoned(dtype, out_len);
        post(comm, stream, label, team, op(rank, output.clone()));
        Some(output)
    })
}

fn world_team(n: usize) -> Vec<usize> {
    (0..n).collect()
}

/// The element-wise reduction, in f64 in team order, rounded once to `dtype`.
fn reference_reduce(dtype: DataType, inputs: &[Vec<f64>], op: RedOp) -> Vec<f64> {
    let mut acc = inputs[0].clone();
    for input in &inputs[1..] {
        for (a, b) in acc.iter_mut().zip(input) {
            *a = op.combine(*a, *b);
        }
    }
    acc.into_iter().map(|x| dtype.round(x)).collect()
}

const DTYPES: [DataType; 2] = [DataType::F32, DataType::Bf16];

// ---------------------------------------------------------------------------------------
// Collectives
// ---------------------------------------------------------------------------------------

#[test]
fn allgather_concatenates_inputs_in_team_order() {
    for n in 2..=4 {
        for dtype in DTYPES {
            let outputs = run_world_op(n, dtype, "ag", (3, 3 * n), |_, input, output| {
                CommOp::Allgather { input, output }
            });
            let expected: Vec<f64> = (0..n).flat_map(|r| data(dtype, r, 3)).collect();
            for (rank, output) in outputs.iter().enumerate() {
                assert_eq!(output.read(), expected, "n={n} {dtype} rank {rank}");
            }
        }
    }
}

#[test]
fn allgather_on_a_team_subset_follows_the_team_order() {
    for team in [[1, 3], [3, 1]] {
        for dtype in DTYPES {
            let outputs = run_team(&team, dtype, "ag-sub", 4, |rank, output| {
                CommOp::Allgather {
                    input: view(dtype, &data(dtype, rank, 2)),
                    output,
                }
            });
            let expected: Vec<f64> = team.iter().flat_map(|&r| data(dtype, r, 2)).collect();
            for &rank in &team {
                assert_eq!(outputs[rank].as_ref().unwrap().read(), expected);
            }
            assert!(outputs[0].is_none() && outputs[2].is_none());
        }
    }
}

#[test]
fn allgather_writes_through_a_strided_view() {
    // The output is column 1 of a 4x2 storage: a non-contiguous view.
    let outputs = run_ok(2, |rank, comm, stream| {
        let storage = HostView::allocate(DataType::F32, &[4, 2], true);
        let column = storage.chunk(1, 2, 1).unwrap();
        post(
            comm,
            stream,
            "ag-strided",
            &[0, 1],
            CommOp::Allgather {
                input: view(DataType::F32, &[rank as f64 + 1.0, rank as f64 + 2.0]),
                output: column,
            },
        );
        storage
    });
    for storage in outputs {
        assert_eq!(storage.read(), vec![0.0, 1.0, 0.0, 2.0, 0.0, 2.0, 0.0, 3.0]);
    }
}

#[test]
fn allreduce_sum_is_exact_for_every_world_size() {
    for n in 2..=4 {
        for dtype in DTYPES {
            let outputs = run_world_op(n, dtype, "ar", (5, 5), |_, input, output| {
                CommOp::Allreduce {
                    input,
                    output,
                    op: RedOp::Sum,
                }
            });
            let inputs: Vec<_> = (0..n).map(|r| data(dtype, r, 5)).collect();
            let expected = reference_reduce(dtype, &inputs, RedOp::Sum);
            if dtype == DataType::F32 {
                // Small sums of these values are exact in f32: check against plain numbers.
                let plain: Vec<f64> = (0..5)
                    .map(|i| (0..n).map(|r| inputs[r][i]).sum::<f64>())
                    .collect();
                assert_eq!(expected, plain);
            }
            for output in outputs {
                assert_eq!(output.read(), expected, "n={n} {dtype}");
            }
        }
    }
}

#[test]
fn allreduce_bf16_combines_in_f64_and_rounds_once() {
    // 256 + 1 + 1 in bf16 step by step is 256 (257 rounds to even); in f64 it is 258, which
    // bf16 holds exactly. A fourth input of 1 makes 259, which rounds to 260.
    let contributions = [256.0, 1.0, 1.0, 1.0];
    for (n, expected) in [(3, 258.0), (4, 260.0)] {
        let outputs = run_ok(n, |rank, comm, stream| {
            let output = poisoned(DataType::Bf16, 1);
            post(
                comm,
                stream,
                "ar-bf16",
                &world_team(n),
                CommOp::Allreduce {
                    input: view(DataType::Bf16, &[contributions[rank]]),
                    output: output.clone(),
                    op: RedOp::Sum,
                },
            );
            output
        });
        for output in outputs {
            assert_eq!(output.read(), vec![expected]);
        }
    }
}

#[test]
fn allreduce_max_min_and_prod() {
    let inputs = [
        vec![1.0, -2.0, 3.5, 0.25],
        vec![-1.0, 4.0, 3.0, 2.0],
        vec![0.5, -8.0, 3.25, -1.0],
    ];
    let cases = [
        (RedOp::Max, vec![1.0, 4.0, 3.5, 2.0]),
        (RedOp::Min, vec![-1.0, -8.0, 3.0, -1.0]),
        (RedOp::Prod, vec![-0.5, 64.0, 34.125, -0.5]),
    ];
    for (op, expected) in cases {
        for dtype in DTYPES {
            let outputs = run_ok(3, |rank, comm, stream| {
                let output = poisoned(dtype, 4);
                post(
                    comm,
                    stream,
                    "ar-op",
                    &[0, 1, 2],
                    CommOp::Allreduce {
                        input: view(dtype, &inputs[rank]),
                        output: output.clone(),
                        op,
                    },
                );
                output
            });
            // 3.5 * 3 * 3.25 = 34.125 needs 9 significant bits: bf16 rounds it (to even) to 34.
            let expected: Vec<f64> = expected.iter().map(|&x| dtype.round(x)).collect();
            if dtype == DataType::Bf16 && op == RedOp::Prod {
                assert_eq!(expected[2], 34.0);
            }
            for output in outputs {
                assert_eq!(output.read(), expected, "{op:?} {dtype}");
            }
        }
    }
}

#[test]
fn allreduce_in_place() {
    let outputs = run_ok(4, |rank, comm, stream| {
        let buffer = view(DataType::F32, &[rank as f64, 2.0 * rank as f64]);
        post(
            comm,
            stream,
            "ar-inplace",
            &[0, 1, 2, 3],
            CommOp::Allreduce {
                input: buffer.clone(),
                output: buffer.clone(),
                op: RedOp::Sum,
            },
        );
        buffer
    });
    for buffer in outputs {
        assert_eq!(buffer.read(), vec![6.0, 12.0]);
    }
}

#[test]
fn reduce_scatter_gives_each_member_its_piece() {
    for n in 2..=4 {
        for dtype in DTYPES {
            let outputs = run_world_op(n, dtype, "rs", (2 * n, 2), |_, input, output| {
                CommOp::ReduceScatter {
                    input,
                    output,
                    op: RedOp::Sum,
                }
            });
            let inputs: Vec<_> = (0..n).map(|r| data(dtype, r, 2 * n)).collect();
            let full = reference_reduce(dtype, &inputs, RedOp::Sum);
            for (rank, output) in outputs.iter().enumerate() {
                assert_eq!(output.read(), full[2 * rank..2 * rank + 2], "n={n} {dtype}");
            }
        }
    }
}

#[test]
fn reduce_scatter_max_on_a_team_subset() {
    // Team [3, 1]: rank 3 is member 0 and gets piece 0.
    let outputs = run_team(&[3, 1], DataType::Bf16, "rs-max", 2, |rank, output| {
        let input = if rank == 3 {
            [1.0, 8.0, -3.0, 5.0]
        } else {
            [2.0, 7.0, -4.0, 6.0]
        };
        CommOp::ReduceScatter {
            input: view(DataType::Bf16, &input),
            output,
            op: RedOp::Max,
        }
    });
    assert_eq!(outputs[3].as_ref().unwrap().read(), vec![2.0, 8.0]);
    assert_eq!(outputs[1].as_ref().unwrap().read(), vec![-3.0, 6.0]);
}

#[test]
fn broadcast_from_a_nonzero_root() {
    for n in 2..=4 {
        for dtype in DTYPES {
            let root = n - 1;
            let outputs = run_posting(
                n,
                dtype,
                "bcast",
                |_| 3,
                |rank, output| {
                    // Non-roots pass a wrong-sized, uninitialised input: it is never read.
                    let input = if rank == root {
                        view(dtype, &data(dtype, rank, 3))
                    } else {
                        poisoned(dtype, 1)
                    };
                    CommOp::Broadcast {
                        root,
                        input,
                        output,
                    }
                },
            );
            for output in outputs {
                assert_eq!(output.read(), data(dtype, root, 3), "n={n} {dtype}");
            }
        }
    }
}

#[test]
fn broadcast_on_a_team_subset() {
    // Team [1, 3] with root index 1: rank 3 broadcasts to rank 1.
    let outputs = run_team(&[1, 3], DataType::Bf16, "bcast-sub", 2, |rank, output| {
        CommOp::Broadcast {
            root: 1,
            input: view(DataType::Bf16, &data(DataType::Bf16, rank, 2)),
            output,
        }
    });
    for rank in [1, 3] {
        assert_eq!(
            outputs[rank].as_ref().unwrap().read(),
            data(DataType::Bf16, 3, 2)
        );
    }
}

#[test]
fn reduce_writes_only_the_root() {
    for dtype in DTYPES {
        let n = 3;
        let root = 1;
        // Non-roots pass a wrong-sized output: it is never written.
        let out_len = |rank| if rank == root { 4 } else { 1 };
        let outputs = run_posting(n, dtype, "reduce", out_len, |rank, output| CommOp::Reduce {
            root,
            input: view(dtype, &data(dtype, rank, 4)),
            output,
            op: RedOp::Sum,
        });
        let inputs: Vec<_> = (0..n).map(|r| data(dtype, r, 4)).collect();
        assert_eq!(
            outputs[root].read(),
            reference_reduce(dtype, &inputs, RedOp::Sum)
        );
        for rank in [0, 2] {
            assert!(outputs[rank].read()[0].is_nan(), "rank {rank} was written");
        }
    }
}

#[test]
fn reduce_max_on_a_team_subset_to_rank_three() {
    let outputs = run_team(&[1, 3], DataType::F32, "reduce-max", 3, |rank, output| {
        let input = if rank == 1 {
            [1.5, -2.0, 9.0]
        } else {
            [1.25, 4.0, -9.0]
        };
        CommOp::Reduce {
            root: 1,
            input: view(DataType::F32, &input),
            output,
            op: RedOp::Max,
        }
    });
    assert_eq!(outputs[3].as_ref().unwrap().read(), vec![1.5, 4.0, 9.0]);
    assert!(outputs[1].as_ref().unwrap().read()[0].is_nan());
}

#[test]
fn gather_to_a_nonzero_root() {
    for n in 2..=4 {
        for dtype in DTYPES {
            let root = n / 2;
            let out_len = |rank| if rank == root { 2 * n } else { 1 };
            let outputs = run_posting(n, dtype, "gather", out_len, |rank, output| CommOp::Gather {
                root,
                input: view(dtype, &data(dtype, rank, 2)),
                output,
            });
            let expected: Vec<f64> = (0..n).flat_map(|r| data(dtype, r, 2)).collect();
            assert_eq!(outputs[root].read(), expected, "n={n} {dtype}");
            for (rank, output) in outputs.iter().enumerate() {
                if rank != root {
                    assert!(output.read()[0].is_nan(), "rank {rank} was written");
                }
            }
        }
    }
}

#[test]
fn scatter_from_a_nonzero_root() {
    for n in 2..=4 {
        for dtype in DTYPES {
            let root = 1;
            let outputs = run_posting(
                n,
                dtype,
                "scatter",
                |_| 3,
                |rank, output| {
                    let input = if rank == root {
                        view(dtype, &data(dtype, 2, 3 * n))
                    } else {
                        poisoned(dtype, 7)
                    };
                    CommOp::Scatter {
                        root,
                        input,
                        output,
                    }
                },
            );
            let source = data(dtype, 2, 3 * n);
            for (rank, output) in outputs.iter().enumerate() {
                assert_eq!(
                    output.read(),
                    source[3 * rank..3 * rank + 3],
                    "n={n} {dtype}"
                );
            }
        }
    }
}

#[test]
fn send_recv_in_a_team_of_two() {
    for dtype in DTYPES {
        // Team [3, 1], root index 0: rank 3 sends, rank 1 receives.
        let outputs = run_team(&[3, 1], dtype, "sendrecv", 4, |rank, output| {
            CommOp::SendRecv {
                root: 0,
                input: view(dtype, &data(dtype, rank, 4)),
                output,
            }
        });
        assert_eq!(outputs[1].as_ref().unwrap().read(), data(dtype, 3, 4));
        assert!(
            outputs[3].as_ref().unwrap().read()[0].is_nan(),
            "the sender's output is not written"
        );
    }
}

#[test]
fn all_to_all_transposes_pieces() {
    for n in 2..=4 {
        for dtype in DTYPES {
            let outputs = run_world_op(n, dtype, "a2a", (2 * n, 2 * n), |_, input, output| {
                CommOp::AllToAll { input, output }
            });
            for (i, output) in outputs.iter().enumerate() {
                // Piece j of my output is piece i of member j's input.
                let expected: Vec<f64> = (0..n)
                    .flat_map(|j| data(dtype, j, 2 * n)[2 * i..2 * i + 2].to_vec())
                    .collect();
                assert_eq!(output.read(), expected, "n={n} {dtype} rank {i}");
            }
        }
    }
}

#[test]
fn collective_permute_shifts_around_the_ring() {
    for n in 2..=4 {
        for dtype in DTYPES {
            let outputs = run_world_op(n, dtype, "permute", (3, 3), |rank, input, output| {
                CommOp::CollectivePermute {
                    input,
                    output,
                    send_to: (rank + 1) % n,
                    recv_from: (rank + n - 1) % n,
                }
            });
            for (rank, output) in outputs.iter().enumerate() {
                assert_eq!(output.read(), data(dtype, (rank + n - 1) % n, 3));
            }
        }
    }
}

#[test]
fn collective_permute_swaps_a_team_subset() {
    let outputs = run_team(&[1, 3], DataType::F32, "permute-sub", 2, |rank, output| {
        let me = if rank == 1 { 0 } else { 1 };
        CommOp::CollectivePermute {
            input: view(DataType::F32, &data(DataType::F32, rank, 2)),
            output,
            send_to: 1 - me,
            recv_from: 1 - me,
        }
    });
    assert_eq!(
        outputs[1].as_ref().unwrap().read(),
        data(DataType::F32, 3, 2)
    );
    assert_eq!(
        outputs[3].as_ref().unwrap().read(),
        data(DataType::F32, 1, 2)
    );
}

#[test]
fn collectives_are_matched_per_team() {
    // Ranks 0 and 1 run two allreduces on team [0, 1], ranks 2 and 3 one on team [2, 3];
    // then the whole world allgathers. Sequence numbers are per team, so they all match.
    let outputs = run_ok(4, |rank, comm, stream| {
        let pair = if rank < 2 { vec![0, 1] } else { vec![2, 3] };
        let rounds = if rank < 2 { 2 } else { 1 };
        let mut sums = Vec::new();
        for round in 0..rounds {
            let output = poisoned(DataType::F32, 1);
            post(
                comm,
                stream,
                &format!("pair-{round}"),
                &pair,
                CommOp::Allreduce {
                    input: view(DataType::F32, &[(rank * 10 + round) as f64]),
                    output: output.clone(),
                    op: RedOp::Sum,
                },
            );
            sums.push(output);
        }
        let gathered = poisoned(DataType::F32, 4);
        post(
            comm,
            stream,
            "world",
            &[0, 1, 2, 3],
            CommOp::Allgather {
                input: view(DataType::F32, &[rank as f64]),
                output: gathered.clone(),
            },
        );
        (sums, gathered)
    });
    for (rank, (sums, gathered)) in outputs.iter().enumerate() {
        let sums: Vec<f64> = sums.iter().map(|s| s.read()[0]).collect();
        let expected = if rank < 2 {
            vec![10.0, 12.0]
        } else {
            vec![50.0]
        };
        assert_eq!(sums, expected, "rank {rank}");
        assert_eq!(gathered.read(), vec![0.0, 1.0, 2.0, 3.0]);
    }
}

#[test]
fn a_team_of_one_copies_locally() {
    let outputs = run_ok(2, |rank, comm, stream| {
        let output = poisoned(DataType::F32, 2);
        post(
            comm,
            stream,
            "solo",
            &[rank],
            CommOp::Allgather {
                input: view(DataType::F32, &[rank as f64, 7.0]),
                output: output.clone(),
            },
        );
        output
    });
    assert_eq!(outputs[0].read(), vec![0.0, 7.0]);
    assert_eq!(outputs[1].read(), vec![1.0, 7.0]);
}

// ---------------------------------------------------------------------------------------
// Point-to-point
// ---------------------------------------------------------------------------------------

#[test]
fn p2p_ring_with_coalesced_send_and_recv_does_not_deadlock() {
    for n in 2..=4 {
        for dtype in DTYPES {
            let outputs = run_ok(n, |rank, comm, stream| {
                let mut received = Vec::new();
                for round in 0..3 {
                    let output = poisoned(dtype, 3);
                    let send = P2p::Send {
                        peer: (rank + 1) % n,
                        buffer: view(dtype, &data(dtype, rank + round, 3)),
                    };
                    let recv = P2p::Recv {
                        peer: (rank + n - 1) % n,
                        buffer: output.clone(),
                    };
                    // Half the ranks list the receive first: sends still go out first.
                    let ops = if rank % 2 == 0 {
                        vec![send, recv]
                    } else {
                        vec![recv, send]
                    };
                    comm.post_p2p(format!("ring-{round}"), ops, stream).unwrap();
                    received.push(output);
                }
                received
            });
            for (rank, received) in outputs.iter().enumerate() {
                let prev = (rank + n - 1) % n;
                for (round, output) in received.iter().enumerate() {
                    assert_eq!(
                        output.read(),
                        data(dtype, prev + round, 3),
                        "n={n} {dtype} rank {rank} round {round}"
                    );
                }
            }
        }
    }
}

#[test]
fn p2p_matches_the_kth_send_with_the_kth_recv() {
    // Rank 0 sends three messages to rank 1 in separate posts (and one to rank 2 in
    // between); rank 1 receives them in separate posts, two of them coalesced.
    let outputs = run_ok(3, |rank, comm, stream| {
        let mut received = Vec::new();
        match rank {
            0 => {
                for k in 0..3 {
                    let send = P2p::Send {
                        peer: 1,
                        buffer: view(DataType::F32, &[k as f64, 100.0 + k as f64]),
                    };
                    comm.post_p2p(format!("send-{k}"), vec![send], stream)
                        .unwrap();
                    if k == 1 {
                        let other = P2p::Send {
                            peer: 2,
                            buffer: view(DataType::F32, &[-1.0]),
                        };
                        comm.post_p2p("send-2".into(), vec![other], stream).unwrap();
                    }
                }
            }
            1 => {
                // The receiver posts late, after the sends are buffered.
                thread::sleep(Duration::from_millis(50));
                let first = poisoned(DataType::F32, 2);
                post_recv(comm, stream, "recv-0", 0, first.clone());
                let second = poisoned(DataType::F32, 2);
                let third = poisoned(DataType::F32, 2);
                comm.post_p2p(
                    "recv-1-2".into(),
                    vec![
                        P2p::Recv {
                            peer: 0,
                            buffer: second.clone(),
                        },
                        P2p::Recv {
                            peer: 0,
                            buffer: third.clone(),
                        },
                    ],
                    stream,
                )
                .unwrap();
                received = vec![first, second, third];
            }
            _ => {
                let only = poisoned(DataType::F32, 1);
                post_recv(comm, stream, "recv", 0, only.clone());
                received = vec![only];
            }
        }
        received
    });
    let got: Vec<Vec<f64>> = outputs[1].iter().map(HostView::read).collect();
    assert_eq!(
        got,
        vec![vec![0.0, 100.0], vec![1.0, 101.0], vec![2.0, 102.0]]
    );
    assert_eq!(outputs[2][0].read(), vec![-1.0]);
}

#[test]
fn p2p_to_self() {
    let outputs = run_ok(2, |rank, comm, stream| {
        let output = poisoned(DataType::Bf16, 2);
        comm.post_p2p(
            "self".into(),
            vec![
                P2p::Recv {
                    peer: rank,
                    buffer: output.clone(),
                },
                P2p::Send {
                    peer: rank,
                    buffer: view(DataType::Bf16, &[rank as f64, 0.5]),
                },
            ],
            stream,
        )
        .unwrap();
        output
    });
    assert_eq!(outputs[0].read(), vec![0.0, 0.5]);
    assert_eq!(outputs[1].read(), vec![1.0, 0.5]);
}

#[test]
fn collectives_and_p2p_interleave_on_one_stream() {
    let outputs = run_ok(2, |rank, comm, stream| {
        let sum = poisoned(DataType::F32, 1);
        post(
            comm,
            stream,
            "ar",
            &[0, 1],
            CommOp::Allreduce {
                input: view(DataType::F32, &[rank as f64 + 1.0]),
                output: sum.clone(),
                op: RedOp::Sum,
            },
        );
        // Send the allreduce's result: the stream runs in order, so the send reads it
        // after it was written.
        let received = poisoned(DataType::F32, 1);
        comm.post_p2p(
            "swap".into(),
            vec![
                P2p::Send {
                    peer: 1 - rank,
                    buffer: sum.clone(),
                },
                P2p::Recv {
                    peer: 1 - rank,
                    buffer: received.clone(),
                },
            ],
            stream,
        )
        .unwrap();
        received
    });
    for output in outputs {
        assert_eq!(output.read(), vec![3.0]);
    }
}

// ---------------------------------------------------------------------------------------
// Validation at post time
// ---------------------------------------------------------------------------------------

fn try_post(comm: &Local, team: &[usize], op: CommOp<HostView>) -> (CommError, Vec<String>) {
    let stream = Recorder::default();
    let error = comm
        .post(
            Collective {
                label: "bad".into(),
                team: team.to_vec(),
                op,
            },
            &stream,
        )
        .expect_err("the post should fail");
    (error, stream.labels())
}

fn assert_local_mismatch(comm: &Local, team: &[usize], op: CommOp<HostView>, needle: &str) {
    let (error, queued) = try_post(comm, team, op);
    assert!(queued.is_empty(), "a failed post queued {queued:?}");
    match error {
        CommError::Mismatch { op, rank, detail } => {
            assert_eq!(op, "bad");
            assert_eq!(rank, comm.rank());
            assert!(detail.contains(needle), "{detail:?} lacks {needle:?}");
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

#[test]
fn post_fails_for_a_rank_outside_the_team() {
    let world = LocalWorld::new(4, LONG);
    let comm = world.communicator(0);
    let (error, queued) = try_post(
        &comm,
        &[1, 2],
        CommOp::Allgather {
            input: poisoned(DataType::F32, 1),
            output: poisoned(DataType::F32, 2),
        },
    );
    assert!(queued.is_empty());
    assert_eq!(
        error,
        CommError::NotInTeam {
            rank: 0,
            team: vec![1, 2],
            op: "bad".into()
        }
    );
}

#[test]
fn post_checks_local_buffer_sizes_types_and_indices() {
    let world = LocalWorld::new(4, LONG);
    let comm = world.communicator(1);
    let team: &[usize] = &[0, 1, 2];
    let f32 = |n| poisoned(DataType::F32, n);
    let sum = RedOp::Sum;
    let ag = |input, output| CommOp::Allgather { input, output };
    let ar = |input, output, op| CommOp::Allreduce { input, output, op };
    let rs = |input, output, op| CommOp::ReduceScatter { input, output, op };
    let a2a = |input, output| CommOp::AllToAll { input, output };
    let bcast = |root, input, output| CommOp::Broadcast {
        root,
        input,
        output,
    };
    let reduce = |root, input, output, op| CommOp::Reduce {
        root,
        input,
        output,
        op,
    };
    let gather = |root, input, output| CommOp::Gather {
        root,
        input,
        output,
    };
    let scatter = |root, input, output| CommOp::Scatter {
        root,
        input,
        output,
    };
    let send_recv = |root, input, output| CommOp::SendRecv {
        root,
        input,
        output,
    };
    let permute = |input, output, send_to, recv_from| CommOp::CollectivePermute {
        input,
        output,
        send_to,
        recv_from,
    };
    let f64_out = poisoned(DataType::F64, 2);
    let bf16_out = poisoned(DataType::Bf16, 6);
    let cases: Vec<(&[usize], CommOp<HostView>, &str)> = vec![
        (team, ag(f32(2), f32(5)), "the output has 5 elements"),
        (
            team,
            ag(f32(2), bf16_out),
            "the input is f32 but the output is bf16",
        ),
        (team, ar(f32(2), f32(3), sum), "the output has 3 elements"),
        (team, rs(f32(5), f32(2), sum), "the input has 5 elements"),
        (team, bcast(3, f32(2), f32(2)), "root 3 is out of range"),
        // Rank 1 is the root (team index 1): its buffers must agree.
        (team, bcast(1, f32(2), f32(3)), "the output has 3 elements"),
        (
            team,
            reduce(1, f32(2), f64_out, RedOp::Max),
            "the input is f32 but the output is f64",
        ),
        (team, gather(1, f32(2), f32(4)), "the output has 4 elements"),
        (team, scatter(1, f32(4), f32(2)), "the input has 4 elements"),
        (team, send_recv(0, f32(2), f32(2)), "team of two"),
        (
            &[1, 2],
            send_recv(2, f32(2), f32(2)),
            "root 2 is out of range",
        ),
        (
            team,
            a2a(f32(4), f32(4)),
            "do not split into 3 equal pieces",
        ),
        (team, a2a(f32(3), f32(6)), "the output has 6 elements"),
        (
            team,
            permute(f32(2), f32(2), 3, 0),
            "send_to 3 is out of range",
        ),
        (
            team,
            permute(f32(2), f32(2), 0, 5),
            "recv_from 5 is out of range",
        ),
        (
            &[1, 4],
            ar(f32(1), f32(1), sum),
            "outside the world of 4 ranks",
        ),
        (&[1, 2, 1], ar(f32(1), f32(1), sum), "names rank 1 twice"),
    ];
    for (team, op, needle) in cases {
        assert_local_mismatch(&comm, team, op, needle);
    }
}

#[test]
fn non_roots_buffers_that_are_not_used_are_not_checked() {
    let world = LocalWorld::new(3, LONG);
    let comm = world.communicator(2);
    let stream = Recorder::default();
    // Rank 2 is not the root: its broadcast input, reduce/gather output and scatter input
    // are ignored, whatever their sizes or types.
    let ops = vec![
        CommOp::Broadcast {
            root: 0,
            input: poisoned(DataType::F64, 7),
            output: poisoned(DataType::F32, 2),
        },
        CommOp::Reduce {
            root: 1,
            input: poisoned(DataType::F32, 2),
            output: poisoned(DataType::Bf16, 9),
            op: RedOp::Sum,
        },
        CommOp::Gather {
            root: 0,
            input: poisoned(DataType::F32, 2),
            output: poisoned(DataType::F32, 1),
        },
        CommOp::Scatter {
            root: 0,
            input: poisoned(DataType::I64, 1),
            output: poisoned(DataType::F32, 2),
        },
    ];
    for op in ops {
        comm.post(
            Collective {
                label: op.name().into(),
                team: vec![0, 1, 2],
                op,
            },
            &stream,
        )
        .unwrap();
    }
    assert_eq!(
        stream.labels(),
        ["broadcast", "reduce", "gather", "scatter"]
    );
}

#[test]
fn post_p2p_checks_peers() {
    let world = LocalWorld::new(2, LONG);
    let comm = world.communicator(0);
    let stream = Recorder::default();
    let error = comm
        .post_p2p(
            "p2p-bad".into(),
            vec![
                P2p::Send {
                    peer: 1,
                    buffer: poisoned(DataType::F32, 1),
                },
                P2p::Recv {
                    peer: 2,
                    buffer: poisoned(DataType::F32, 1),
                },
            ],
            &stream,
        )
        .unwrap_err();
    assert!(
        matches!(&error, CommError::Mismatch { op, rank: 0, detail }
            if op == "p2p-bad" && detail.contains("rank 2 is outside the world of 2 ranks")),
        "{error:?}"
    );
    assert!(stream.labels().is_empty());
}

#[test]
fn a_rank_outside_the_world_cannot_post() {
    let world = LocalWorld::new(2, LONG);
    let comm = world.communicator(5);
    assert_eq!(comm.size(), 2);
    let stream = Recorder::default();
    let error = comm
        .post(
            Collective {
                label: "ghost".into(),
                team: vec![0, 5],
                op: CommOp::Allreduce {
                    input: poisoned(DataType::F32, 1),
                    output: poisoned(DataType::F32, 1),
                    op: RedOp::Sum,
                },
            },
            &stream,
        )
        .unwrap_err();
    assert!(
        matches!(error, CommError::Mismatch { rank: 5, .. }),
        "{error:?}"
    );
    let error = comm
        .post_p2p(
            "ghost-p2p".into(),
            vec![P2p::Send {
                peer: 0,
                buffer: poisoned(DataType::F32, 1),
            }],
            &stream,
        )
        .unwrap_err();
    assert!(
        matches!(error, CommError::Mismatch { rank: 5, .. }),
        "{error:?}"
    );
    assert!(stream.labels().is_empty());
}

#[test]
fn posting_never_blocks_and_queues_one_task() {
    let world = LocalWorld::new(3, LONG);
    assert_eq!(world.size(), 3);
    assert_eq!(world.timeout(), LONG);
    let comm = world.communicator(0);
    assert_eq!((comm.rank(), comm.size(), comm.timeout()), (0, 3, LONG));
    let stream = Recorder::default();
    let start = Instant::now();
    // Nobody else posts and nothing runs: every post still returns at once.
    post(
        &comm,
        &stream,
        "Communication 1 (type=Allgather)",
        &[0, 1, 2],
        CommOp::Allgather {
            input: poisoned(DataType::F32, 1),
            output: poisoned(DataType::F32, 3),
        },
    );
    comm.post_p2p(
        "group".into(),
        vec![
            P2p::Recv {
                peer: 1,
                buffer: poisoned(DataType::F32, 1),
            },
            P2p::Send {
                peer: 2,
                buffer: poisoned(DataType::F32, 1),
            },
        ],
        &stream,
    )
    .unwrap();
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_eq!(
        stream.labels(),
        ["Communication 1 (type=Allgather)", "group"]
    );
    assert_eq!(world.pending(), 0, "nothing runs before the stream does");
}

// ---------------------------------------------------------------------------------------
// Mismatches between ranks
// ---------------------------------------------------------------------------------------

fn mismatch_detail(error: &CommError, expected_rank: usize, label: &str) -> String {
    match error {
        CommError::Mismatch { op, rank, detail } => {
            assert_eq!(op, label);
            assert_eq!(*rank, expected_rank);
            detail.clone()
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

/// Checks that every rank's stream failed with exactly the mismatches `(label, detail)`,
/// in order.
fn assert_mismatches<R>(outcomes: &[Outcome<R>], expected: &[(&str, &str)]) {
    for (rank, o) in outcomes.iter().enumerate() {
        assert_eq!(
            o.errors.len(),
            expected.len(),
            "rank {rank}: {:?}",
            o.errors
        );
        for (error, (label, detail)) in o.errors.iter().zip(expected) {
            assert_eq!(mismatch_detail(error, rank, label), *detail);
        }
    }
}

#[test]
fn allgather_with_different_sizes_fails_on_every_rank() {
    let (world, outcomes) = run_world(3, LONG, |rank, comm, stream| {
        let len = if rank == 2 { 4 } else { 3 };
        post(
            comm,
            stream,
            "ag-mismatch",
            &[0, 1, 2],
            CommOp::Allgather {
                input: poisoned(DataType::F32, len),
                output: poisoned(DataType::F32, 3 * len),
            },
        );
    });
    assert_mismatches(
        &outcomes,
        &[(
            "ag-mismatch",
            "rank 0 contributes 3 elements (sizes [3]) but rank 2 contributes 4 elements \
             (sizes [4])",
        )],
    );
    assert_eq!(world.pending(), 0);
}

#[test]
fn allreduce_with_different_element_types_fails() {
    let (_, outcomes) = run_world(2, LONG, |rank, comm, stream| {
        let dtype = if rank == 0 {
            DataType::F32
        } else {
            DataType::Bf16
        };
        post(
            comm,
            stream,
            "ar-types",
            &[0, 1],
            CommOp::Allreduce {
                input: view(dtype, &[1.0]),
                output: poisoned(dtype, 1),
                op: RedOp::Sum,
            },
        );
    });
    assert_mismatches(
        &outcomes,
        &[("ar-types", "rank 0 has f32 data but rank 1 has bf16 data")],
    );
}

#[test]
fn different_collectives_or_operators_fail() {
    let (_, outcomes) = run_world(2, LONG, |rank, comm, stream| {
        let op = if rank == 0 {
            CommOp::Allreduce {
                input: view(DataType::F32, &[1.0, 2.0]),
                output: poisoned(DataType::F32, 2),
                op: RedOp::Sum,
            }
        } else {
            CommOp::AllToAll {
                input: view(DataType::F32, &[1.0, 2.0]),
                output: poisoned(DataType::F32, 2),
            }
        };
        post(comm, stream, "kinds", &[0, 1], op);
        post(
            comm,
            stream,
            "ops",
            &[0, 1],
            CommOp::Allreduce {
                input: view(DataType::F32, &[1.0]),
                output: poisoned(DataType::F32, 1),
                op: if rank == 0 { RedOp::Sum } else { RedOp::Max },
            },
        );
    });
    assert_mismatches(
        &outcomes,
        &[
            (
                "kinds",
                "rank 0 posted allreduce but rank 1 posted all-to-all",
            ),
            ("ops", "rank 0 reduces with sum but rank 1 with max"),
        ],
    );
}

#[test]
fn broadcast_and_permute_size_mismatches_name_both_ranks() {
    let (_, outcomes) = run_world(3, LONG, |rank, comm, stream| {
        post(
            comm,
            stream,
            "bcast",
            &[0, 1, 2],
            CommOp::Broadcast {
                root: 2,
                input: view(DataType::F32, &[1.0, 2.0]),
                output: poisoned(DataType::F32, if rank == 1 { 3 } else { 2 }),
            },
        );
        post(
            comm,
            stream,
            "permute",
            &[0, 1, 2],
            CommOp::CollectivePermute {
                input: view(DataType::F32, &[1.0, 2.0]),
                output: poisoned(DataType::F32, 2),
                // Rank 0 and 2 both send to 1; nobody sends to 0.
                send_to: if rank == 2 { 1 } else { (rank + 1) % 3 },
                recv_from: (rank + 2) % 3,
            },
        );
    });
    assert_mismatches(
        &outcomes,
        &[
            (
                "bcast",
                "rank 2 sends 2 elements (sizes [2]) but rank 1 receives 3 elements (sizes [3])",
            ),
            (
                "permute",
                "rank 0 receives from rank 2 but rank 2 sends to rank 1",
            ),
        ],
    );
}

#[test]
fn p2p_size_mismatch_fails_the_receiver() {
    let (world, outcomes) = run_world(2, LONG, |rank, comm, stream| {
        let op = if rank == 0 {
            P2p::Send {
                peer: 1,
                buffer: view(DataType::F32, &[1.0, 2.0, 3.0, 4.0]),
            }
        } else {
            P2p::Recv {
                peer: 0,
                buffer: poisoned(DataType::F32, 3),
            }
        };
        comm.post_p2p("p2p-mismatch".into(), vec![op], stream)
            .unwrap();
    });
    assert!(outcomes[0].errors.is_empty(), "the send is buffered");
    assert_eq!(
        mismatch_detail(&outcomes[1].errors[0], 1, "p2p-mismatch"),
        "rank 0 sends 4 elements (sizes [4]) but rank 1 receives 3 (sizes [3])"
    );
    assert_eq!(world.pending(), 0);
}

#[test]
fn p2p_type_mismatch_fails_the_receiver() {
    let (_, outcomes) = run_world(2, LONG, |rank, comm, stream| {
        let op = if rank == 0 {
            P2p::Send {
                peer: 1,
                buffer: view(DataType::F32, &[1.0]),
            }
        } else {
            P2p::Recv {
                peer: 0,
                buffer: poisoned(DataType::Bf16, 1),
            }
        };
        comm.post_p2p("p2p-types".into(), vec![op], stream).unwrap();
    });
    assert_eq!(
        mismatch_detail(&outcomes[1].errors[0], 1, "p2p-types"),
        "rank 0 sends f32 data but rank 1 receives into bf16"
    );
}

// ---------------------------------------------------------------------------------------
// Timeouts and aborts
// ---------------------------------------------------------------------------------------

#[test]
fn a_missing_rank_times_out_its_peers() {
    let timeout = Duration::from_millis(200);
    let start = Instant::now();
    let (_, outcomes) = run_world(3, timeout, |rank, comm, stream| {
        if rank == 2 {
            return; // never posts
        }
        post(
            comm,
            stream,
            "ag-timeout",
            &[0, 1, 2],
            CommOp::Allgather {
                input: view(DataType::F32, &[rank as f64]),
                output: poisoned(DataType::F32, 3),
            },
        );
    });
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    for (rank, outcome) in outcomes.iter().enumerate().take(2) {
        assert_eq!(
            outcome.errors,
            vec![timed_out("ag-timeout", rank, vec![2], 200)]
        );
    }
    assert!(outcomes[2].errors.is_empty());
}

#[test]
fn a_recv_without_a_send_times_out() {
    let timeout = Duration::from_millis(200);
    let start = Instant::now();
    let (_, outcomes) = run_world(2, timeout, |rank, comm, stream| {
        if rank == 1 {
            post_recv(comm, stream, "lonely-recv", 0, poisoned(DataType::F32, 1));
        }
    });
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(
        outcomes[1].errors,
        vec![timed_out("lonely-recv", 1, vec![0], 200)]
    );
}

#[test]
fn an_abort_fails_a_waiting_peer_promptly() {
    let start = Instant::now();
    let (world, outcomes) = run_world(2, LONG, |rank, comm, stream| {
        if rank == 1 {
            // Let rank 0 start waiting, then fail instead of posting.
            thread::sleep(Duration::from_millis(100));
            comm.abort("boom");
            return;
        }
        post(
            comm,
            stream,
            "ag-abort",
            &[0, 1],
            CommOp::Allgather {
                input: view(DataType::F32, &[1.0]),
                output: poisoned(DataType::F32, 2),
            },
        );
    });
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        outcomes[0].errors,
        vec![peer_failed("ag-abort", 0, 1, "boom")]
    );
    assert_eq!(world.aborted(), vec![(1, "boom".to_string())]);
}

#[test]
fn operations_posted_after_an_abort_fail_at_once() {
    let barrier = Barrier::new(3);
    let start = Instant::now();
    let (_, outcomes) = run_world(3, LONG, |rank, comm, stream| {
        if rank == 1 {
            comm.abort("boom");
        }
        barrier.wait();
        let team = [0, 1, 2];
        // Rank 1's own operations fail too: its communicator is dead.
        post(
            comm,
            stream,
            "ar-after-abort",
            &team,
            CommOp::Allreduce {
                input: view(DataType::Bf16, &[1.0]),
                output: poisoned(DataType::Bf16, 1),
                op: RedOp::Sum,
            },
        );
        // Ranks 0 and 2 can still talk to each other, but not receive from rank 1.
        if rank != 1 {
            let other = 2 - rank;
            let output = poisoned(DataType::F32, 1);
            comm.post_p2p(
                "p2p-ok".into(),
                vec![
                    P2p::Send {
                        peer: other,
                        buffer: view(DataType::F32, &[rank as f64]),
                    },
                    P2p::Recv {
                        peer: other,
                        buffer: output.clone(),
                    },
                ],
                stream,
            )
            .unwrap();
            post_recv(
                comm,
                stream,
                "recv-from-failed",
                1,
                poisoned(DataType::F32, 1),
            );
            Some(output)
        } else {
            None
        }
    });
    assert!(start.elapsed() < Duration::from_secs(5));
    let failed = |op: &str, rank: usize| peer_failed(op, rank, 1, "boom");
    for rank in [0, 2] {
        assert_eq!(
            outcomes[rank].errors,
            vec![
                failed("ar-after-abort", rank),
                failed("recv-from-failed", rank)
            ]
        );
        let other = 2 - rank;
        assert_eq!(
            outcomes[rank].value.as_ref().unwrap().read(),
            vec![other as f64]
        );
    }
    assert_eq!(outcomes[1].errors, vec![failed("ar-after-abort", 1)]);
}

#[test]
fn an_abort_fails_a_waiting_recv_promptly() {
    let start = Instant::now();
    let (_, outcomes) = run_world(2, LONG, |rank, comm, stream| {
        if rank == 0 {
            thread::sleep(Duration::from_millis(100));
            comm.abort("sender died");
            return;
        }
        post_recv(comm, stream, "recv-abort", 0, poisoned(DataType::F32, 1));
    });
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(
        outcomes[1].errors,
        vec![peer_failed("recv-abort", 1, 0, "sender died")]
    );
}

#[test]
fn an_abort_after_arriving_does_not_fail_the_peers() {
    // Rank 1 deposits its contribution, then aborts while it waits: nobody waits for rank 1
    // any more, so rank 0 still completes; rank 1's own wait fails.
    let world = LocalWorld::new(2, LONG);
    let barrier = Barrier::new(2);
    let outcomes = run_in(&world, |rank, comm, stream| {
        let output = poisoned(DataType::F32, 2);
        if rank == 1 {
            post(
                comm,
                stream,
                "ag",
                &[0, 1],
                CommOp::Allgather {
                    input: view(DataType::F32, &[1.0]),
                    output: output.clone(),
                },
            );
            // The slot exists once rank 1's stream has deposited.
            while world.pending() == 0 {
                thread::sleep(Duration::from_millis(1));
            }
            comm.abort("late failure");
        }
        barrier.wait();
        if rank == 0 {
            post(
                comm,
                stream,
                "ag",
                &[0, 1],
                CommOp::Allgather {
                    input: view(DataType::F32, &[0.0]),
                    output: output.clone(),
                },
            );
        }
        output
    });
    assert!(outcomes[0].errors.is_empty(), "{:?}", outcomes[0].errors);
    assert_eq!(outcomes[0].value.read(), vec![0.0, 1.0]);
    assert_eq!(
        outcomes[1].errors,
        vec![peer_failed("ag", 1, 1, "late failure")]
    );
    assert_eq!(world.pending(), 0, "both members left the slot");
}
