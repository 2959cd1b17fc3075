//! Hand-written host programs on the CPU backend: the runtime primitives of the reference's
//! §10 group A, and the two stream-synchronization bugs the seeds discuss — caught by the
//! race checker, and shown to produce wrong results when a stream is slowed down.

use std::collections::HashMap;
use std::time::Duration;

use weave_comm::LocalWorld;
use weave_executor::{
    run_rank, Backend, CpuBackend, CpuOptions, Dense, ExecError, RankRun, RunConfig, StreamKey,
};
use weave_host_ir::parse;
use weave_ir::DType;

fn run_with(
    src: &str,
    inputs: Vec<Dense>,
    check_races: bool,
    delays: Vec<(StreamKey, Duration)>,
) -> Result<RankRun, ExecError> {
    let program = parse(src).unwrap_or_else(|e| panic!("{e}"));
    let world = LocalWorld::new(1, Duration::from_secs(10));
    let comm = world.communicator(0);
    let backend = cpu_backend(delays);
    run_rank(&program, &backend, &comm, &inputs, &config(check_races))
}

/// The CPU backend of these tests, with `delays`.
fn cpu_backend(delays: Vec<(StreamKey, Duration)>) -> CpuBackend {
    CpuBackend::new(CpuOptions {
        timeout: Duration::from_secs(10),
        trace: false,
        delays,
    })
}

/// Two pool streams, the race checker as asked.
fn config(check_races: bool) -> RunConfig {
    RunConfig {
        params: HashMap::new(),
        number_of_streams: 2,
        check_races,
        deadline: None,
    }
}

fn run(src: &str, inputs: Vec<Dense>) -> RankRun {
    run_with(src, inputs, true, Vec::new()).unwrap_or_else(|e| panic!("{e}"))
}

fn dense(sizes: &[usize], data: Vec<f64>) -> Dense {
    Dense {
        dtype: DType::F32,
        sizes: sizes.to_vec(),
        data,
    }
}

#[test]
fn streams_are_created_by_index_and_captured_streams_restore() {
    let r = run(
        "\
%HostIrContainer { () -> () :
  SetCurrentStream(Stream ( 2 ))
  SetCurrentStream(Stream ( 2 ))
  SetCurrentStream(Stream ( 3 ))
} // %HostIrContainer
",
        vec![],
    );
    assert_eq!(r.final_stream, StreamKey::Pool(3));
    assert_eq!(
        r.streams,
        vec![StreamKey::Main, StreamKey::Pool(2), StreamKey::Pool(3)],
        "the main stream and one stream per distinct index"
    );
    let r = run(
        "\
%HostIrContainer { () -> () :
  SetCurrentStream(Stream ( 1 ))
  Stream 0 = GetCurrentStream()
  SetCurrentStream(Stream ( 4 ))
  SetCurrentStream(Stream 0)
} // %HostIrContainer
",
        vec![],
    );
    assert_eq!(
        r.final_stream,
        StreamKey::Pool(1),
        "the captured stream is the one current at capture"
    );
}

const ADD_KERNEL: &str = "\
K0: fusion acc() {
  tensor a: f32[1, 10]
  tensor b: f32[1, 10]
  c = add(a, b)
  output c
}
";

/// `T1 = zeros; FOR i in 0..3: T1 = T1 + T0[i]` through the add kernel, in place.
fn accumulate_in_place() -> String {
    format!(
        "\
%HostIrContainer {{ (T0_g_f32[3, 10]) -> (T1_g_f32[1, 10]) :
  T1 = ALLOCATE(mem_type=global, zero_init=true)
  FOR i0 from 0 to 3:
    T2_g_f32[1, 10] = ShardByStream(T0, axis=0, chunks=3, stream_index=i0)
    LaunchKernel(kernel=K0, inputs=(T1, T2), outputs=(T1))
}} // %HostIrContainer
{ADD_KERNEL}"
    )
}

/// `out = in + in` on chunks 1 and 2 (of 3, along axis 1) of a zeroed `[2, 6]` output.
const CHUNKS_1_AND_2: &str = "\
%HostIrContainer { (T0_g_f32[2, 6]) -> (T1_g_f32[2, 6]) :
  T1 = ALLOCATE(mem_type=global, zero_init=true)
  FOR i0 from 1 to 3:
    T2_g_f32[2, 2] = ShardByStream(T0, axis=1, chunks=3, stream_index=i0)
    T3_g_f32[2, 2] = ShardByStream(T1, axis=1, chunks=3, stream_index=i0)
    LaunchKernel(kernel=K0, inputs=(T2), outputs=(T3))
} // %HostIrContainer
K0: fusion add_per_stream() {
  tensor a: f32[2, 2]
  b = add(a, a)
  output b
}
";

#[test]
fn for_loop_accumulates_in_place() {
    // acc = 21; FOR i in 0..3: acc += arange(7)[2i + 1]  ->  21 + 1 + 3 + 5 = 30.
    let src = "\
%HostIrContainer { (T0_g_f32[1], T1_g_f32[7]) -> (T2_g_f32[1]) :
  T2 = ALLOCATE(mem_type=global, zero_init=true)
  LaunchKernel(kernel=K0, inputs=(T2, T0), outputs=(T2))
  FOR i0 from 0 to 3:
    T3_g_f32[1] = ShardByStream(T1, axis=0, chunks=7, stream_index=( ( 2 * i0 ) + 1 ))
    LaunchKernel(kernel=K0, inputs=(T2, T3), outputs=(T2))
} // %HostIrContainer
K0: fusion acc() {
  tensor a: f32[1]
  tensor b: f32[1]
  c = add(a, b)
  output c
}
";
    let r = run(
        src,
        vec![
            dense(&[1], vec![21.0]),
            dense(&[7], (0..7).map(f64::from).collect()),
        ],
    );
    assert_eq!(r.outputs[0].data, vec![30.0]);
    assert!(r.races.is_empty(), "{:?}", r.races);
}

#[test]
fn in_place_update_in_a_loop_keeps_one_buffer() {
    // x = zeros; FOR i in 0..3: x = x + (2i + 1)  ->  full(10, 9).
    let src = accumulate_in_place();
    let odd: Vec<f64> = (0..3).flat_map(|i| [f64::from(2 * i + 1); 10]).collect();
    let r = run(&src, vec![dense(&[3, 10], odd)]);
    assert_eq!(r.outputs[0].data, vec![9.0; 10]);
    assert_eq!(
        r.live_allocations, 1,
        "the output is the only buffer ever allocated"
    );
}

#[test]
fn a_stream_parallel_kernel_writes_only_its_chunks() {
    // out = in + in on chunks 1 and 2 (of 3, along axis 1); chunk 0 stays zero.
    let src = CHUNKS_1_AND_2;
    let input: Vec<f64> = (1..=12).map(f64::from).collect();
    let r = run(src, vec![dense(&[2, 6], input)]);
    assert_eq!(
        r.outputs[0].data,
        vec![0.0, 0.0, 6.0, 8.0, 10.0, 12.0, 0.0, 0.0, 18.0, 20.0, 22.0, 24.0]
    );
}

#[test]
fn deallocate_leaves_nothing_allocated() {
    let r = run(
        "\
%HostIrContainer { () -> () :
  FOR i0 from 0 to 10:
    T0_g_f32[8, 64] = ALLOCATE(mem_type=global, zero_init=false)
    Deallocate(T0)
} // %HostIrContainer
",
        vec![],
    );
    assert_eq!(r.live_allocations, 0);
    let r = run(
        "\
%HostIrContainer { () -> () :
  FOR i0 from 0 to 10:
    T0_g_f32[8, 64] = ALLOCATE(mem_type=global, zero_init=false)
} // %HostIrContainer
",
        vec![],
    );
    assert_eq!(
        r.live_allocations, 0,
        "unbound at the end of the program too"
    );
}

/// `T2 = T0 + T0` on the main stream, then a stream loop copying chunks of `T2` into the
/// output `T1`, with the loop body and the join given by the caller.
fn two_stage(body_head: &str, after_loop: &str) -> String {
    format!(
        "\
%HostIrContainer {{ (T0_g_f32[4, 3]) -> (T1_g_f32[4, 3]) :
  T2_g_f32[4, 3] = ALLOCATE(mem_type=global, zero_init=false)
  LaunchKernel(kernel=K0, inputs=(T0), outputs=(T2))
  T1 = ALLOCATE(mem_type=global, zero_init=false)
  Stream 0 = GetCurrentStream()
  FOR i0 from 0 to 2:
{body_head}
    T3_g_f32[2, 3] = ShardByStream(T2, axis=0, chunks=2, stream_index=i0)
    T4_g_f32[2, 3] = ShardByStream(T1, axis=0, chunks=2, stream_index=i0)
    LaunchKernel(kernel=K1, inputs=(T3), outputs=(T4))
{after_loop}
  Deallocate(T2)
}} // %HostIrContainer
K0: fusion double() {{
  tensor a: f32[4, 3]
  b = add(a, a)
  output b
}}
K1: fusion copy() {{
  tensor a: f32[2, 3]
  b = set(a)
  output b
}}
"
    )
}

const ENTRY_OK: &str =
    "    SetCurrentStream(Stream ( i0 % numberOfStreams ))\n    Synchronize(Stream 0)";
const ENTRY_BUG: &str =
    "    Synchronize(Stream 0)\n    SetCurrentStream(Stream ( i0 % numberOfStreams ))";
const JOIN_OK: &str = "  SetCurrentStream(Stream 0)\n  FOR i1 from 0 to 2:\n    Synchronize(Stream ( i1 % numberOfStreams ))";
const JOIN_BUG: &str = "  FOR i1 from 0 to 2:\n    Synchronize(Stream ( i1 % numberOfStreams ))\n  SetCurrentStream(Stream 0)";

fn input() -> Vec<Dense> {
    vec![dense(&[4, 3], (1..=12).map(f64::from).collect())]
}

fn doubled() -> Vec<f64> {
    (1..=12).map(|x| f64::from(2 * x)).collect()
}

#[test]
fn correct_synchronization_is_race_free_even_with_slow_streams() {
    let slow = vec![
        (StreamKey::Main, Duration::from_millis(30)),
        (StreamKey::Pool(1), Duration::from_millis(30)),
    ];
    let r = run_with(&two_stage(ENTRY_OK, JOIN_OK), input(), true, slow).unwrap();
    assert!(r.races.is_empty(), "{:?}", r.races);
    assert_eq!(r.outputs[0].data, doubled());
}

#[test]
fn synchronize_before_set_current_stream_is_reported() {
    let r = run(&two_stage(ENTRY_BUG, JOIN_OK), input());
    let reports: Vec<String> = r.races.iter().map(ToString::to_string).collect();
    assert_eq!(
        reports,
        vec![
            "race: `LaunchKernel(kernel=K1, inputs=(T3), outputs=(T4))` on pool stream 0 reads T3, \
             unordered with `LaunchKernel(kernel=K0, inputs=(T0), outputs=(T2))` on main stream, which writes T2",
            "race: `LaunchKernel(kernel=K1, inputs=(T3), outputs=(T4))` on pool stream 0 writes T4, \
             unordered with `T1 = ALLOCATE(mem_type=global, zero_init=false)` on main stream, which writes T1",
            "race: `LaunchKernel(kernel=K1, inputs=(T3), outputs=(T4))` on pool stream 1 reads T3, \
             unordered with `LaunchKernel(kernel=K0, inputs=(T0), outputs=(T2))` on main stream, which writes T2",
            "race: `LaunchKernel(kernel=K1, inputs=(T3), outputs=(T4))` on pool stream 1 writes T4, \
             unordered with `T1 = ALLOCATE(mem_type=global, zero_init=false)` on main stream, which writes T1",
        ]
    );
}

#[test]
fn joining_before_switching_back_to_main_is_reported() {
    let r = run(&two_stage(ENTRY_OK, JOIN_BUG), input());
    let reports: Vec<String> = r.races.iter().map(ToString::to_string).collect();
    assert_eq!(
        reports,
        vec![
            "race: `Deallocate(T2)` on main stream writes T2, unordered with \
             `LaunchKernel(kernel=K1, inputs=(T3), outputs=(T4))` on pool stream 0, which reads T3",
            "race: `Deallocate(T2)` on main stream writes T2, unordered with \
             `LaunchKernel(kernel=K1, inputs=(T3), outputs=(T4))` on pool stream 1, which reads T3",
            "race: `<caller reads outputs>` on main stream reads T1, unordered with \
             `LaunchKernel(kernel=K1, inputs=(T3), outputs=(T4))` on pool stream 0, which writes T4",
            "race: `<caller reads outputs>` on main stream reads T1, unordered with \
             `LaunchKernel(kernel=K1, inputs=(T3), outputs=(T4))` on pool stream 1, which writes T4",
        ]
    );
}

/// A copy of the input `T0` into the output `T1` on pool stream 0, after `fork` (run on the
/// main stream, which allocates `T1`) and joined back to the main stream.
fn copy_on_worker(fork: &str) -> String {
    format!(
        "\
%HostIrContainer {{ (T0_g_f32[4, 3]) -> (T1_g_f32[4, 3]) :
  Stream 0 = GetCurrentStream()
  T1 = ALLOCATE(mem_type=global, zero_init=false)
{fork}
  LaunchKernel(kernel=K0, inputs=(T0), outputs=(T1))
  SetCurrentStream(Stream 0)
  Synchronize(Stream ( 0 ))
}} // %HostIrContainer
K0: fusion copy() {{
  tensor a: f32[4, 3]
  b = set(a)
  output b
}}
"
    )
}

#[test]
fn an_input_read_on_a_pool_stream_before_it_synchronizes_with_main_is_reported() {
    // The caller wrote T0 on the main stream before the program started.
    let r = run(&copy_on_worker("  SetCurrentStream(Stream ( 0 ))"), input());
    let reports: Vec<String> = r.races.iter().map(ToString::to_string).collect();
    assert!(
        reports.contains(
            &"race: `LaunchKernel(kernel=K0, inputs=(T0), outputs=(T1))` on pool stream 0 reads T0, \
              unordered with `<caller writes inputs>` on main stream, which writes T0"
                .to_string()
        ),
        "{reports:?}"
    );
    // The race is real: with the main stream slowed down, the worker copies T0 before the
    // upload lands (uninitialised memory is NaN).
    let slow_main = vec![(StreamKey::Main, Duration::from_millis(100))];
    let r = run_with(
        &copy_on_worker("  SetCurrentStream(Stream ( 0 ))"),
        input(),
        false,
        slow_main.clone(),
    )
    .unwrap();
    assert!(
        r.outputs[0].data.iter().all(|x| x.is_nan()),
        "{:?}",
        r.outputs[0].data
    );
    let r = run_with(
        &copy_on_worker("  SetCurrentStream(Stream ( 0 ))\n  Synchronize(Stream 0)"),
        input(),
        true,
        slow_main,
    )
    .unwrap();
    assert!(r.races.is_empty(), "{:?}", r.races);
    assert_eq!(r.outputs[0].data, input()[0].data);
}

#[test]
fn a_buffer_allocated_on_main_and_written_on_a_pool_stream_without_synchronizing_is_reported() {
    // T1's allocation is ordered on the main stream; the worker writes T1 unordered with it.
    let r = run(&copy_on_worker("  SetCurrentStream(Stream ( 0 ))"), input());
    let reports: Vec<String> = r.races.iter().map(ToString::to_string).collect();
    assert!(
        reports.contains(
            &"race: `LaunchKernel(kernel=K0, inputs=(T0), outputs=(T1))` on pool stream 0 writes T1, \
              unordered with `T1 = ALLOCATE(mem_type=global, zero_init=false)` on main stream, which writes T1"
                .to_string()
        ),
        "{reports:?}"
    );
    assert_eq!(
        reports.len(),
        2,
        "the input and the allocation: {reports:?}"
    );
}

#[test]
fn a_buffer_allocated_and_used_on_one_pool_stream_needs_no_synchronization_for_itself() {
    // The temporary T2 lives on pool stream 0 only: allocated, written, read and freed there.
    let src = "\
%HostIrContainer { (T0_g_f32[4, 3]) -> (T1_g_f32[4, 3]) :
  Stream 0 = GetCurrentStream()
  T1 = ALLOCATE(mem_type=global, zero_init=false)
  SetCurrentStream(Stream ( 0 ))
  Synchronize(Stream 0)
  T2_g_f32[4, 3] = ALLOCATE(mem_type=global, zero_init=false)
  LaunchKernel(kernel=K0, inputs=(T0), outputs=(T2))
  LaunchKernel(kernel=K0, inputs=(T2), outputs=(T1))
  Deallocate(T2)
  SetCurrentStream(Stream 0)
  Synchronize(Stream ( 0 ))
} // %HostIrContainer
K0: fusion copy() {
  tensor a: f32[4, 3]
  b = set(a)
  output b
}
";
    let r = run(src, input());
    assert!(r.races.is_empty(), "{:?}", r.races);
    assert_eq!(r.outputs[0].data, input()[0].data);
    // Allocated on pool stream 0 but used on pool stream 1, which synchronized with main
    // only: the use races with the allocation.
    let src = src.replace(
        "  LaunchKernel(kernel=K0, inputs=(T0), outputs=(T2))\n",
        "  SetCurrentStream(Stream ( 1 ))\n  Synchronize(Stream 0)\n  \
         LaunchKernel(kernel=K0, inputs=(T0), outputs=(T2))\n  SetCurrentStream(Stream ( 0 ))\n  \
         Synchronize(Stream ( 1 ))\n",
    );
    // The race is real: with pool stream 0 slowed down, its allocation's fill lands after
    // pool stream 1's write.
    let slow = vec![(StreamKey::Pool(0), Duration::from_millis(100))];
    let r = run_with(&src, input(), false, slow).unwrap();
    assert!(
        r.outputs[0].data.iter().all(|x| x.is_nan()),
        "{:?}",
        r.outputs[0].data
    );
    let r = run(&src, input());
    let reports: Vec<String> = r.races.iter().map(ToString::to_string).collect();
    assert_eq!(
        reports,
        vec![
            "race: `LaunchKernel(kernel=K0, inputs=(T0), outputs=(T2))` on pool stream 1 writes T2, \
             unordered with `T2 = ALLOCATE(mem_type=global, zero_init=false)` on pool stream 0, \
             which writes T2"
        ]
    );
}

#[test]
fn a_missing_synchronization_gives_a_wrong_result_when_a_stream_is_slow() {
    // Entry bug: the first worker does not wait for the main stream, which is slowed down, so
    // it copies T2 before T2 is written (uninitialised memory is NaN).
    let slow_main = vec![(StreamKey::Main, Duration::from_millis(200))];
    let r = run_with(
        &two_stage(ENTRY_BUG, JOIN_OK),
        input(),
        false,
        slow_main.clone(),
    )
    .unwrap();
    assert!(r.races.is_empty(), "the checker is off");
    assert!(
        r.outputs[0].data[..6].iter().all(|x| x.is_nan()),
        "chunk 0 was copied before it was computed: {:?}",
        r.outputs[0].data
    );
    // Join bug: the caller reads the output on the main stream, which never waited for the
    // slow worker.
    let slow_worker = vec![(StreamKey::Pool(1), Duration::from_millis(200))];
    let r = run_with(
        &two_stage(ENTRY_OK, JOIN_BUG),
        input(),
        false,
        slow_worker.clone(),
    )
    .unwrap();
    assert!(
        r.outputs[0].data[6..].iter().all(|x| x.is_nan()),
        "chunk 1 was read before the worker wrote it: {:?}",
        r.outputs[0].data
    );
    // The same runs with the checker on report the races.
    let r = run_with(&two_stage(ENTRY_BUG, JOIN_OK), input(), true, slow_main).unwrap();
    assert_eq!(
        r.races.len(),
        4,
        "T2 read and T1 (allocated on main) written, per worker"
    );
    let r = run_with(&two_stage(ENTRY_OK, JOIN_BUG), input(), true, slow_worker).unwrap();
    assert_eq!(r.races.len(), 4);
}

#[test]
fn a_read_before_the_wait_of_a_communication_is_reported() {
    let src = "\
%HostIrContainer { (T0_g_f32[4]) -> (T1_g_f32[4]) :
  T1 = ALLOCATE(mem_type=global, zero_init=false)
  T2_g_f32[4] = ALLOCATE(mem_type=global, zero_init=false)
  Communication 2 (type=Allreduce, team=(0), input=T0, output=T2, red_op=sum, backend=NCCL)
  LaunchKernel(kernel=K0, inputs=(T2), outputs=(T1))
  Wait(Communication 2)
  Deallocate(T2)
} // %HostIrContainer
K0: fusion copy() {
  tensor a: f32[4]
  b = set(a)
  output b
}
";
    let r = run(src, vec![dense(&[4], vec![1.0, 2.0, 3.0, 4.0])]);
    let reports: Vec<String> = r.races.iter().map(ToString::to_string).collect();
    assert_eq!(
        reports,
        vec![
            "race: `LaunchKernel(kernel=K0, inputs=(T2), outputs=(T1))` on main stream reads T2, \
             unordered with `Communication 2 (type=Allreduce, team=(0), input=T0, output=T2, red_op=sum, backend=NCCL)` \
             on main stream, which writes T2"
        ]
    );
}

#[test]
fn inputs_are_checked_before_anything_runs() {
    let src = "\
%HostIrContainer { (T0_g_f32[( 2 * n ), 3]) -> () :
} // %HostIrContainer
";
    let program = parse(src).unwrap();
    let world = LocalWorld::new(1, Duration::from_secs(1));
    let backend = CpuBackend::new(CpuOptions::default());
    let mut config = RunConfig::default();
    config.params.insert("n".into(), 2);
    let err = |inputs: Vec<Dense>| {
        run_rank(&program, &backend, &world.communicator(0), &inputs, &config)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(vec![dense(&[4, 2], vec![0.0; 8])]),
        "input 0 (T0) axis 1 must have size 3 but has 2"
    );
    assert_eq!(
        err(vec![dense(&[3, 3], vec![0.0; 9])]),
        "input 0 (T0) axis 0 must have size 4 = ( 2 * n ) but has 3"
    );
    assert_eq!(
        err(vec![Dense {
            dtype: DType::BF16,
            sizes: vec![4, 3],
            data: vec![0.0; 12]
        }]),
        "input 0 (T0) must be f32 but a bf16 tensor was given"
    );
    assert_eq!(err(vec![]), "the program takes 1 inputs but 0 were given");
    assert!(
        backend.streams().is_empty() || backend.streams() == vec![StreamKey::Main],
        "nothing ran"
    );
}

/// `T1 = 2 * T0` chunk by chunk through a buffer of two slots: the axis of `n` rows is cut
/// into `chunks` chunks of `ceilDiv(n, chunks)` rows, the last ones shorter or empty, and
/// each slot view is narrowed to the chunk it holds.
fn slots_program(n: usize, chunks: usize) -> String {
    let c = n.div_ceil(chunks);
    format!(
        "\
%HostIrContainer {{ (T0_g_f32[{n}, 2]) -> (T1_g_f32[{n}, 2]) :
  T1 = ALLOCATE(mem_type=global, zero_init=false)
  T2_g_f32[{slots}, 2] = ALLOCATE(mem_type=global, zero_init=false)
  FOR i0 from 0 to {chunks}:
    T3_g_f32[{c}, 2] = ShardByStream(T0, axis=0, chunks={chunks}, stream_index=i0)
    T4_g_f32[{c}, 2] = ShardByStream(T2, axis=0, chunks=2, stream_index=( i0 % 2 ), holds=(chunk=i0, chunks={chunks}, extent={n}))
    LaunchKernel(kernel=K0, inputs=(T3), outputs=(T4))
    T5_g_f32[{c}, 2] = ShardByStream(T1, axis=0, chunks={chunks}, stream_index=i0)
    LaunchKernel(kernel=K1, inputs=(T4), outputs=(T5))
  Deallocate(T2)
}} // %HostIrContainer
K0: fusion twice() {{
  tensor a: f32[{c}, 2]
  b = add(a, a)
  output b
}}
K1: fusion copy() {{
  tensor a: f32[{c}, 2]
  b = set(a)
  output b
}}
",
        slots = 2 * c
    )
}

#[test]
fn slot_views_take_the_length_of_the_chunk_they_hold() {
    // 5 rows in 3 chunks: 2, 2 and 1 row; 3 rows in 5 chunks: 1, 1, 1, then two empty ones.
    for (n, chunks) in [(5, 3), (3, 5), (6, 3), (7, 2)] {
        let input: Vec<f64> = (0..2 * n).map(|x| x as f64).collect();
        let r = run(
            &slots_program(n, chunks),
            vec![dense(&[n, 2], input.clone())],
        );
        let want: Vec<f64> = input.iter().map(|x| 2.0 * x).collect();
        assert_eq!(r.outputs[0].data, want, "{n} rows in {chunks} chunks");
        assert!(r.races.is_empty(), "{:?}", r.races);
    }
}

#[test]
fn a_slot_view_without_its_chunk_keeps_the_slot_length_and_fails_on_a_short_chunk() {
    // The same program without `holds=`: the last slot view has 2 rows while the last chunk
    // of the input has 1, so the kernel's result does not fit its output.
    let src = slots_program(5, 3).replace(", holds=(chunk=i0, chunks=3, extent=5)", "");
    let program = parse(&src).unwrap();
    assert!(!weave_host_ir::print(&program).contains("holds="));
    let e = run_with(&src, vec![dense(&[5, 2], vec![1.0; 10])], true, Vec::new()).unwrap_err();
    assert!(
        e.to_string().ends_with(
            "`LaunchKernel(kernel=K0, inputs=(T3), outputs=(T4))` failed: output 0 has sizes \
             [1, 2] but the preallocated output has sizes [2, 2]"
        ),
        "{e}"
    );
}

/// Runs `src` with [`weave_executor::run_rank_into`]: inputs uploaded, every output written
/// into a buffer given beforehand filled with 7s; returns the outputs read back.
fn run_into(
    src: &str,
    inputs: &[Dense],
    outputs: &[(DType, Vec<usize>)],
) -> Result<Vec<Dense>, ExecError> {
    let program = parse(src).unwrap_or_else(|e| panic!("{e}"));
    let world = LocalWorld::new(1, Duration::from_secs(10));
    let comm = world.communicator(0);
    let backend = cpu_backend(Vec::new());
    let config = config(true);
    let ins = inputs
        .iter()
        .map(|d| backend.upload(d))
        .collect::<Result<Vec<_>, _>>()?;
    let outs = outputs
        .iter()
        .map(|(dtype, sizes)| {
            let n = sizes.iter().product();
            backend.upload(&Dense {
                dtype: *dtype,
                sizes: sizes.clone(),
                data: vec![7.0; n],
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let run = weave_executor::run_rank_into(&program, &backend, &comm, &ins, &outs, &config)?;
    assert!(run.races.is_empty(), "{:?}", run.races);
    let main = backend.stream(StreamKey::Main)?;
    let got = outs
        .iter()
        .map(|b| backend.download(b, &main))
        .collect::<Result<Vec<_>, _>>()?;
    backend.synchronize()?;
    Ok(got)
}

/// Outputs written into the caller's buffers match the outputs of a run that allocates
/// them: zero-filled where the program asks for zeros (the 7s are gone), accumulated in
/// place, chunk by chunk. A buffer of the wrong sizes or dtype, or too few buffers, is an
/// error naming the output and the rank.
#[test]
fn outputs_written_into_given_buffers_match_allocated_ones() {
    let accumulate = accumulate_in_place();
    let chunks = CHUNKS_1_AND_2;
    let odd: Vec<f64> = (0..3).flat_map(|i| [f64::from(2 * i + 1); 10]).collect();
    let cases: [(&str, Vec<Dense>, Vec<usize>); 2] = [
        (&accumulate, vec![dense(&[3, 10], odd)], vec![1, 10]),
        (
            chunks,
            vec![dense(&[2, 6], (1..=12).map(f64::from).collect())],
            vec![2, 6],
        ),
    ];
    for (src, inputs, out_sizes) in &cases {
        let want = run(src, inputs.clone()).outputs;
        let got = run_into(src, inputs, &[(DType::F32, out_sizes.clone())])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, want);
    }
    let (src, inputs, _) = &cases[1];
    let wrong = run_into(src, inputs, &[(DType::F32, vec![2, 5])]).unwrap_err();
    assert_eq!(
        wrong.to_string(),
        "output T1 on rank 0: the buffer given is f32[2, 5], the program writes f32[2, 6]"
    );
    let wrong = run_into(src, inputs, &[(DType::BF16, vec![2, 6])]).unwrap_err();
    assert!(
        wrong.to_string().contains("the buffer given is bf16[2, 6]"),
        "{wrong}"
    );
    let none = run_into(src, inputs, &[]).unwrap_err();
    assert!(
        none.to_string()
            .contains("rank 0: 0 output buffers were given, the program has 1 outputs"),
        "{none}"
    );
}
