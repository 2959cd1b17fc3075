//! Failure injection on in-process ranks: a rank that fails in the middle of an allgather
//! loop, a collective that one rank never posts, inputs of the wrong shape or dtype, and more
//! ranks than the mesh. Each ends every rank with a clear error within seconds; nothing
//! hangs.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use streamweave::comm::{
    Collective, CommError, Communicator, HostView, Local, LocalWorld, P2p, TaskQueue,
};
use streamweave::executor::{run_rank, CpuBackend, CpuOptions, Dense, ExecError, RunConfig};
use streamweave::run::{run_local, RunError, RunOptions};
use streamweave::{Compiler, Executable};

fn compiled(name: &str, set: &[(&str, i64)]) -> Executable {
    let path = common::fixture(name);
    let mut c = Compiler::new();
    for (k, v) in set {
        c = c.set(k, *v);
    }
    c.compile_source(name, &std::fs::read_to_string(path).unwrap())
        .unwrap()
}

/// Every rank's inputs, sharded from seeded global inputs.
fn inputs(c: &Executable, ranks: usize) -> Vec<Vec<Dense>> {
    let globals = c.random_inputs(3).unwrap();
    (0..ranks)
        .map(|r| c.shard_inputs(&globals, r).unwrap())
        .collect()
}

/// What the wrapper does to one rank's `n`-th collective.
#[derive(Clone, Copy)]
enum Fault {
    /// The collective's task fails (the rank "crashes" inside it) and the rank aborts.
    Fail,
    /// The collective is never posted (the rank skipped it).
    Drop,
}

/// `Local`, except that rank `rank`'s `nth` collective (counting from 0) suffers `fault`.
struct Faulty {
    inner: Local,
    rank: usize,
    nth: usize,
    fault: Fault,
    seen: AtomicUsize,
}

impl Communicator for Faulty {
    type Buffer = HostView;
    type Stream = dyn TaskQueue;

    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }

    fn post(&self, c: Collective<HostView>, stream: &Self::Stream) -> Result<(), CommError> {
        let n = self.seen.fetch_add(1, Ordering::SeqCst);
        if self.inner.rank() != self.rank || n != self.nth {
            return self.inner.post(c, stream);
        }
        match self.fault {
            Fault::Drop => Ok(()),
            Fault::Fail => {
                let label = c.label.clone();
                stream.enqueue(
                    label.clone(),
                    Box::new(move || {
                        Err(CommError::Backend {
                            op: label,
                            message: "injected failure: the device was lost".into(),
                        })
                    }),
                );
                Ok(())
            }
        }
    }

    fn post_p2p(
        &self,
        label: String,
        ops: Vec<P2p<HostView>>,
        stream: &Self::Stream,
    ) -> Result<(), CommError> {
        self.inner.post_p2p(label, ops, stream)
    }

    fn abort(&self, reason: &str) {
        self.inner.abort(reason)
    }
}

/// Runs `c` on `ranks` ranks with communication `timeout`, rank 1 hitting `fault` at its
/// `nth` communication; asserts that every rank is done within `within`.
fn run_faulty(
    c: &Executable,
    ranks: usize,
    fault: Fault,
    nth: usize,
    timeout: Duration,
    within: Duration,
) -> Vec<Result<(), ExecError>> {
    let start = Instant::now();
    let world = LocalWorld::new(ranks, timeout);
    let per_rank = inputs(c, ranks);
    let config = RunConfig {
        params: c.signature().params.iter().cloned().collect(),
        number_of_streams: 2,
        check_races: true,
        deadline: None,
    };
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = per_rank
            .into_iter()
            .enumerate()
            .map(|(rank, ins)| {
                let comm = Faulty {
                    inner: world.communicator(rank),
                    rank: 1,
                    nth,
                    fault,
                    seen: AtomicUsize::new(0),
                };
                let (program, config) = (c.program(), &config);
                s.spawn(move || {
                    let backend = CpuBackend::new(CpuOptions {
                        timeout,
                        ..CpuOptions::default()
                    });
                    run_rank(program, &backend, &comm, &ins, config).map(|_| ())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(start.elapsed() < within, "took {:?}", start.elapsed());
    results
}

#[test]
fn a_rank_failing_in_the_middle_of_an_allgather_loop_fails_every_rank() {
    // ag_matmul posts one Allgather per chunk; rank 1 fails inside its third.
    let c = compiled("ag_matmul", &[("d", 2)]);
    let within = Duration::from_secs(10);
    let results = run_faulty(&c, 2, Fault::Fail, 2, Duration::from_secs(30), within);
    let label = "Communication 8 (type=Allgather, team=(0 1), input=T4, output=T5, backend=NCCL)";
    assert_eq!(
        results[1],
        Err(ExecError::Comm(CommError::Backend {
            op: label.into(),
            message: "injected failure: the device was lost".into(),
        }))
    );
    match &results[0] {
        Err(ExecError::Comm(CommError::PeerFailed {
            op,
            rank: 0,
            failed_rank: 1,
            reason,
        })) => {
            assert_eq!(op, label);
            assert!(reason.contains("injected failure"), "{reason}");
        }
        other => panic!("rank 0 should fail because rank 1 did: {other:?}"),
    }
}

#[test]
fn a_collective_that_one_rank_never_posts_times_out_naming_it() {
    let c = compiled("allgather", &[("d", 2)]);
    let within = Duration::from_secs(5);
    let results = run_faulty(&c, 2, Fault::Drop, 0, Duration::from_millis(300), within);
    assert_eq!(
        results[0].as_ref().unwrap_err().to_string(),
        "Communication 1 (type=Allgather, team=(0 1), input=T0, output=T1, backend=NCCL) \
         on rank 0 timed out after 300 ms waiting for rank(s) [1]"
    );
}

#[test]
fn inputs_of_the_wrong_shape_or_dtype_are_rejected_before_anything_runs() {
    let c = compiled("row_parallel_linear", &[("t", 12), ("h", 4), ("d", 2)]);
    let options = RunOptions {
        timeouts: streamweave::Timeouts::all(Duration::from_secs(5)),
        ..RunOptions::default()
    };
    let config = c.config(&options);
    let mut bad = inputs(&c, 2);
    bad[1][0].sizes = vec![12, 4];
    bad[1][0].data.truncate(48);
    let err = run_local(c.program(), &config, bad, &options).unwrap_err();
    assert_eq!(
        err.to_string(),
        "rank 1: input 0 (T0) axis 1 must have size 8 = ( 2 * h ) but has 4"
    );
    let mut bad = inputs(&c, 2);
    bad[0][1].dtype = streamweave::ir::DType::F32;
    match run_local(c.program(), &config, bad, &options).unwrap_err() {
        RunError::Ranks(errors) => {
            assert_eq!(
                errors[0],
                (
                    0,
                    ExecError::Input("input 1 (T1) must be bf16 but a f32 tensor was given".into())
                )
            );
        }
        other => panic!("{other}"),
    }
}

#[test]
fn more_ranks_than_the_mesh_is_an_error() {
    let c = compiled("allgather", &[("d", 2)]);
    assert_eq!(
        c.check_ranks(4).unwrap_err().to_string(),
        "4 ranks were asked for but the program's meshes cover 2 device(s): every rank must \
         be a device of a mesh (compile it with d=4)"
    );
    assert_eq!(
        c.check_ranks(1).unwrap_err().to_string(),
        "the program's meshes name device 1 but only 1 rank(s) were asked for"
    );
}

#[test]
fn a_stream_waiting_for_a_stalled_stream_times_out() {
    // A worker stream waits for the main stream, which is stuck far longer than the timeout.
    let src = "\
%HostIrContainer { (T0_g_f32[2]) -> (T1_g_f32[2]) :
  T1 = ALLOCATE(mem_type=global, zero_init=true)
  Stream 0 = GetCurrentStream()
  SetCurrentStream(Stream ( 0 ))
  Synchronize(Stream 0)
  SetCurrentStream(Stream 0)
  Synchronize(Stream ( 0 ))
} // %HostIrContainer
";
    let program = streamweave::host_ir::parse(src).unwrap();
    let world = LocalWorld::new(1, Duration::from_millis(200));
    let backend = CpuBackend::new(CpuOptions {
        timeout: Duration::from_millis(200),
        trace: false,
        delays: vec![(
            streamweave::executor::StreamKey::Main,
            // Three jobs on the main stream (the upload, the fill, the join) stay within the
            // host's patience (twice the timeout and a second).
            Duration::from_millis(400),
        )],
    });
    let input = Dense {
        dtype: streamweave::ir::DType::F32,
        sizes: vec![2],
        data: vec![1.0, 2.0],
    };
    let start = Instant::now();
    let err = run_rank(
        &program,
        &backend,
        &world.communicator(0),
        &[input],
        &RunConfig::default(),
    )
    .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(&err, ExecError::Timeout { what, millis: 200 } if what.contains("waited")),
        "{err}"
    );
}
