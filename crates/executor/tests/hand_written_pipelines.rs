//! Hand-written multi-rank host programs, parsed from host-IR text and run on in-process ranks
//! of the CPU backend with the race checker on: the reference's §10 group F pipelines that are
//! host programs rather than fusions — #47 the ring pairwise exchange, #46 the ring-based
//! allgather + GEMM and GEMM + reduce-scatter, #45 reduce-scatter pipelining with bounded
//! slots — and #41's inter-stream synchronization of a P2P allgather, unrolled (the host IR
//! has no `IfThenElse`).

use std::collections::HashMap;
use std::time::Duration;

use weave_comm::LocalWorld;
use weave_executor::{run_rank, CpuBackend, CpuOptions, Dense, RankRun, RunConfig};
use weave_host_ir::{parse, verify, HostProgram};
use weave_ir::DType;

/// Parses `src` with every `@D` replaced by `d`, verifies it, and runs it on `d` ranks (rank
/// `r` gets `inputs(r)`) with `streams` pool streams and the race checker on.
fn run_ranks(
    src: &str,
    d: usize,
    streams: usize,
    inputs: impl Fn(usize) -> Vec<Dense>,
) -> (HostProgram, Vec<RankRun>) {
    let text = src.replace("@D", &d.to_string());
    let program = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    verify(&program).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let world = LocalWorld::new(d, Duration::from_secs(20));
    let config = RunConfig {
        params: HashMap::new(),
        number_of_streams: streams,
        check_races: true,
        deadline: None,
    };
    let runs = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..d)
            .map(|rank| {
                let comm = world.communicator(rank);
                let (program, config, ins) = (&program, &config, inputs(rank));
                scope.spawn(move || {
                    let backend = CpuBackend::new(CpuOptions {
                        timeout: Duration::from_secs(20),
                        trace: false,
                        delays: Vec::new(),
                    });
                    run_rank(program, &backend, &comm, &ins, config)
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join()
                    .unwrap()
                    .unwrap_or_else(|e| panic!("rank {rank} of {d}: {e}\n{text}"))
            })
            .collect::<Vec<_>>()
    });
    for (rank, r) in runs.iter().enumerate() {
        assert!(r.races.is_empty(), "rank {rank} of {d}: {:?}", r.races);
    }
    (program, runs)
}

fn f32t(sizes: &[usize], data: Vec<f64>) -> Dense {
    Dense::new(DType::F32, sizes.to_vec(), data).unwrap()
}

/// Small integers, exact in f32 and in every product sum below.
fn value(i: usize, j: usize, salt: usize) -> f64 {
    ((i * 7 + j * 3 + salt * 5) % 11) as f64 - 5.0
}

/// Row-major `[rows, cols]` filled by `value`.
fn matrix(rows: usize, cols: usize, salt: usize) -> Vec<f64> {
    (0..rows)
        .flat_map(|i| (0..cols).map(move |j| value(i, j, salt)))
        .collect()
}

fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

/// The statement kinds of the whole program, in pre-order.
fn all_kinds(p: &HostProgram) -> Vec<&'static str> {
    p.walk().map(|w| p.stmts[w.stmt].kind_name()).collect()
}

/// §10 #47 CoalescedRingPairwiseExchange: every rank sends its buffer to (r + 1) % D and
/// receives the buffer of (r - 1 + D) % D, in one coalesced group (NCCL's group semantics make
/// the order inside it irrelevant). The uncoalesced variant orders rank 0 send-then-recv and
/// the others recv-then-send, which needs a rank-dependent `IfThenElse` the host IR lacks.
const PAIRWISE_EXCHANGE: &str = "\
%HostIrContainer { (T0_g_f32[4]) -> (T1_g_f32[4]) :
  T1 = ALLOCATE(mem_type=global, zero_init=false)
  StartCoalescing
  P2PCommunication 2 (type=send, buffer=T0, peer=( ( rank + 1 ) % @D ), backend=NCCL)
  P2PCommunication 3 (type=recv, buffer=T1, peer=( ( ( rank + @D ) - 1 ) % @D ), backend=NCCL)
  EndCoalescing 4
  Wait(EndCoalescing 4)
} // %HostIrContainer
";

#[test]
fn ring_pairwise_exchange_receives_the_left_neighbours_buffer() {
    for d in 1..=4 {
        let send = |r: usize| (0..4).map(|j| (10 * r + j) as f64).collect::<Vec<f64>>();
        let (p, runs) = run_ranks(PAIRWISE_EXCHANGE, d, 1, |r| vec![f32t(&[4], send(r))]);
        assert_eq!(
            all_kinds(&p),
            [
                "Allocate",
                "StartCoalescing",
                "P2PCommunication",
                "P2PCommunication",
                "EndCoalescing",
                "Wait"
            ]
        );
        for (r, run) in runs.iter().enumerate() {
            // nvFuser checks recv == send_buf + (recv_peer - r) * 10 with send_buf = 10 r + j.
            let recv_peer = (r + d - 1) % d;
            assert_eq!(run.outputs[0].data, send(recv_peer), "rank {r} of {d}");
        }
    }
}

/// §10 #46 Ring AG + GEMM (reference §4.6E): C [D, m, n] = allgather(A) @ B where rank r owns
/// A's row block r. The own block is copied into the gather buffer first (a self exchange);
/// then D - 1 steps j each forward the block received last, slice (r - j) % D, to r + 1 while
/// receiving slice (r - j - 1) % D from r - 1, and multiply slice (r - j) % D meanwhile; the
/// last received slice, (r + 1) % D, is multiplied after the loop. The per-step `if j != 0` /
/// `if j != D - 1` of nvFuser's test become the self exchange before the loop and the peeled
/// last matmul. The matmul reads the slice that the step's send reads (the verifier allows a
/// read of an in-flight send's buffer, not of a receive's), so the exchange and the GEMM overlap.
const RING_AG_MATMUL: &str = "\
%HostIrContainer { (T0_g_f32[1, 2, 3], T1_g_f32[3, 4]) -> (T2_g_f32[@D, 2, 4]) :
  T2 = ALLOCATE(mem_type=global, zero_init=false)
  T3_g_f32[@D, 2, 3] = ALLOCATE(mem_type=global, zero_init=false)
  T4_g_f32[1, 2, 3] = ShardByStream(T3, axis=0, chunks=@D, stream_index=rank)
  StartCoalescing
  P2PCommunication 4 (type=send, buffer=T0, peer=rank, backend=NCCL)
  P2PCommunication 5 (type=recv, buffer=T4, peer=rank, backend=NCCL)
  EndCoalescing 6
  Wait(EndCoalescing 6)
  FOR i0 from 0 to ( @D - 1 ):
    T5_g_f32[1, 2, 3] = ShardByStream(T3, axis=0, chunks=@D, stream_index=( ( ( rank + @D ) - i0 ) % @D ))
    T6_g_f32[1, 2, 3] = ShardByStream(T3, axis=0, chunks=@D, stream_index=( ( ( rank + @D ) - ( i0 + 1 ) ) % @D ))
    StartCoalescing
    P2PCommunication 12 (type=send, buffer=T5, peer=( ( rank + 1 ) % @D ), backend=NCCL)
    P2PCommunication 13 (type=recv, buffer=T6, peer=( ( ( rank + @D ) - 1 ) % @D ), backend=NCCL)
    EndCoalescing 14
    T7_g_f32[1, 2, 4] = ShardByStream(T2, axis=0, chunks=@D, stream_index=( ( ( rank + @D ) - i0 ) % @D ))
    T7 = matmul(T5, T1)
    Wait(EndCoalescing 14)
  T8_g_f32[1, 2, 3] = ShardByStream(T3, axis=0, chunks=@D, stream_index=( ( rank + 1 ) % @D ))
  T9_g_f32[1, 2, 4] = ShardByStream(T2, axis=0, chunks=@D, stream_index=( ( rank + 1 ) % @D ))
  T9 = matmul(T8, T1)
  Deallocate(T3)
} // %HostIrContainer
";

#[test]
fn ring_allgather_matmul_matches_the_unsharded_product() {
    let (m, k, n) = (2, 3, 4);
    let b = matrix(k, n, 1);
    for d in 1..=4 {
        let a = matrix(d * m, k, 0);
        let (p, runs) = run_ranks(RING_AG_MATMUL, d, 2, |r| {
            vec![
                f32t(&[1, m, k], a[r * m * k..(r + 1) * m * k].to_vec()),
                f32t(&[k, n], b.clone()),
            ]
        });
        let kinds = all_kinds(&p);
        // One self exchange, then one coalesced send/recv pair per ring step.
        assert_eq!(kinds.iter().filter(|k| **k == "StartCoalescing").count(), 2);
        assert_eq!(kinds.iter().filter(|k| **k == "Matmul").count(), 2);
        let want = matmul(&a, &b, d * m, k, n);
        for (r, run) in runs.iter().enumerate() {
            assert_eq!(run.outputs[0].sizes, [d, m, n]);
            assert_eq!(run.outputs[0].data, want, "rank {r} of {d}");
        }
    }
}

/// §10 #46 Ring GEMM + RS (reference §4.6E): rank r holds A's and B's contraction shard r
/// (A as D row blocks). Step j computes the partial product of row block (r + j + 1) % D,
/// sends it to that block's owner and receives, from (D + r - (j + 1)) % D, that rank's
/// partial of r's own block into slot j; a generated kernel sums the D slots. D steps, the
/// last one a self exchange (its block is r).
const RING_MATMUL_RS: &str = "\
%HostIrContainer { (T0_g_f32[@D, 2, 3], T1_g_f32[3, 4]) -> (T2_g_f32[2, 4]) :
  T3_g_f32[@D, 2, 4] = ALLOCATE(mem_type=global, zero_init=false)
  T4_g_f32[@D, 2, 4] = ALLOCATE(mem_type=global, zero_init=false)
  FOR i0 from 0 to @D:
    T5_g_f32[1, 2, 3] = ShardByStream(T0, axis=0, chunks=@D, stream_index=( ( ( rank + i0 ) + 1 ) % @D ))
    T6_g_f32[1, 2, 4] = ShardByStream(T3, axis=0, chunks=@D, stream_index=i0)
    T6 = matmul(T5, T1)
    T7_g_f32[1, 2, 4] = ShardByStream(T4, axis=0, chunks=@D, stream_index=i0)
    StartCoalescing
    P2PCommunication 9 (type=send, buffer=T6, peer=( ( ( rank + i0 ) + 1 ) % @D ), backend=NCCL)
    P2PCommunication 10 (type=recv, buffer=T7, peer=( ( ( @D + rank ) - ( i0 + 1 ) ) % @D ), backend=NCCL)
    EndCoalescing 11
    Wait(EndCoalescing 11)
  T2 = ALLOCATE(mem_type=global, zero_init=false)
  LaunchKernel(kernel=K0, inputs=(T4), outputs=(T2))
  Deallocate(T3)
  Deallocate(T4)
} // %HostIrContainer
K0: fusion ring_rs_sum() {
  tensor p: f32[@D, 2, 4]
  s = sum(p, [0])
  output s
}
";

#[test]
fn ring_matmul_reduce_scatter_matches_the_unsharded_product() {
    let (mb, kl, n) = (2, 3, 4);
    for d in 1..=4 {
        // A [D * mb, D * kl], B [D * kl, n]; rank r holds columns (rows of B) r * kl ...
        let (kk, m) = (d * kl, d * mb);
        let a = matrix(m, kk, 0);
        let b = matrix(kk, n, 1);
        let (p, runs) = run_ranks(RING_MATMUL_RS, d, 2, |r| {
            let a_shard: Vec<f64> = (0..m)
                .flat_map(|i| a[i * kk + r * kl..i * kk + (r + 1) * kl].to_vec())
                .collect();
            let b_shard = b[r * kl * n..(r + 1) * kl * n].to_vec();
            vec![f32t(&[d, mb, kl], a_shard), f32t(&[kl, n], b_shard)]
        });
        assert_eq!(all_kinds(&p).iter().filter(|k| **k == "Matmul").count(), 1);
        let want = matmul(&a, &b, m, kk, n);
        for (r, run) in runs.iter().enumerate() {
            assert_eq!(
                run.outputs[0].data,
                want[r * mb * n..(r + 1) * mb * n],
                "rank {r} of {d}"
            );
        }
    }
}

/// §10 #41 AllgatherInterStreamSyncNoWrap (reference §4.6C), for D = 3 and numberOfStreams =
/// 3, unrolled because the host IR has no `IfThenElse`: iteration i of the offset-by-rank P2P
/// allgather runs on Stream(i); after its exchange, when i + 1 < numberOfStreams, Stream(i + 1)
/// synchronizes with Stream(i), so iteration i + 1's exchange cannot start before iteration
/// i's has completed. The structural claim: a `Synchronize` of the previous iteration's stream
/// sits between every pair of consecutive exchanges (and none after the last, "no wrap");
/// the gathered result is right and race-free. The text is written out one iteration at a
/// time.
fn inter_stream_sync() -> String {
    let mut src = "\
%HostIrContainer { (T0_g_f32[1, 4]) -> (T1_g_f32[3, 4]) :
  T1 = ALLOCATE(mem_type=global, zero_init=false)
  Stream 0 = GetCurrentStream()
"
    .to_string();
    for i in 0..3 {
        // Iteration i: tensor T(2 + i), statements numbered from 7 + 9i.
        let (t, c) = (2 + i, 7 + 9 * i);
        src += &format!("  SetCurrentStream(Stream ( {i} ))\n");
        if i > 0 {
            src += &format!("  Synchronize(Stream ( {} ))\n", i - 1);
        }
        src += &format!(
            "  Synchronize(Stream 0)
  T{t}_g_f32[1, 4] = ShardByStream(T1, axis=0, chunks=3, stream_index=( ( rank + {i} ) % 3 ))
  StartCoalescing
  P2PCommunication {c} (type=recv, buffer=T{t}, peer=( ( rank + {i} ) % 3 ), backend=NCCL)
  P2PCommunication {} (type=send, buffer=T0, peer=( ( ( 3 + rank ) - {i} ) % 3 ), backend=NCCL)
  EndCoalescing {}
  Wait(EndCoalescing {})
",
            c + 1,
            c + 2,
            c + 2
        );
    }
    src + "  SetCurrentStream(Stream 0)
  Synchronize(Stream ( 0 ))
  Synchronize(Stream ( 1 ))
  Synchronize(Stream ( 2 ))
} // %HostIrContainer
"
}

#[test]
fn inter_stream_synchronization_orders_consecutive_exchanges() {
    let shard = |r: usize| (0..4).map(|j| (10 * r + j) as f64).collect::<Vec<f64>>();
    let (p, runs) = run_ranks(&inter_stream_sync(), 3, 3, |r| {
        vec![f32t(&[1, 4], shard(r))]
    });
    // Between the k-th exchange's Wait and the (k + 1)-th StartCoalescing: a switch to the
    // next pool stream and a Synchronize of the previous one.
    let text = weave_host_ir::print(&p);
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let waits: Vec<usize> = (0..lines.len())
        .filter(|i| lines[*i].starts_with("Wait("))
        .collect();
    assert_eq!(waits.len(), 3);
    for (k, w) in waits.iter().enumerate().take(2) {
        assert_eq!(
            lines[w + 1],
            format!("SetCurrentStream(Stream ( {} ))", k + 1)
        );
        assert_eq!(lines[w + 2], format!("Synchronize(Stream ( {k} ))"));
    }
    // No wrap: after the last exchange only the join follows.
    assert_eq!(lines[waits[2] + 1], "SetCurrentStream(Stream 0)");
    let want: Vec<f64> = (0..3).flat_map(shard).collect();
    for (r, run) in runs.iter().enumerate() {
        assert_eq!(run.outputs[0].data, want, "rank {r}");
    }
}

/// §10 #45 ReduceScatterBasedPipeliningHostIrImplementation: S chunks of rows round-robin on
/// the stream pool; chunk j multiplies into slot j % n of a partial buffer of min(S, n) = 2
/// slots, then reduce-scatters it into C[j]; a join loop ends it. Rank r holds A's and B's
/// contraction shard r, A as [S, D, mb, kl]. A chunk's slot is reused two chunks later on the
/// same stream, so stream order keeps the reuse safe.
const RS_PIPELINING: &str = "\
%HostIrContainer { (T0_g_f32[4, @D, 2, 3], T1_g_f32[3, 4]) -> (T2_g_f32[4, 2, 4]) :
  T2 = ALLOCATE(mem_type=global, zero_init=false)
  T3_g_f32[2, @D, 2, 4] = ALLOCATE(mem_type=global, zero_init=false)
  Stream 0 = GetCurrentStream()
  FOR i0 from 0 to 4:
    SetCurrentStream(Stream ( i0 % numberOfStreams ))
    Synchronize(Stream 0)
    T4_g_f32[1, @D, 2, 3] = ShardByStream(T0, axis=0, chunks=4, stream_index=i0)
    T5_g_f32[1, 2, 4] = ShardByStream(T2, axis=0, chunks=4, stream_index=i0)
    T6_g_f32[1, @D, 2, 4] = ShardByStream(T3, axis=0, chunks=2, stream_index=( i0 % numberOfStreams ))
    T6 = matmul(T4, T1)
    Communication 12 (type=ReduceScatter, team=(@TEAM), input=T6, output=T5, red_op=sum, backend=NCCL)
    Wait(Communication 12)
  SetCurrentStream(Stream 0)
  FOR i1 from 0 to numberOfStreams:
    Synchronize(Stream ( i1 % numberOfStreams ))
  Deallocate(T3)
} // %HostIrContainer
";

#[test]
fn reduce_scatter_pipelining_with_bounded_slots_matches_the_unsharded_product() {
    let (s, mb, kl, n) = (4, 2, 3, 4);
    for d in 1..=4 {
        let team: Vec<String> = (0..d).map(|r| r.to_string()).collect();
        let src = RS_PIPELINING.replace("@TEAM", &team.join(" "));
        let (kk, m) = (d * kl, s * d * mb);
        let a = matrix(m, kk, 0);
        let b = matrix(kk, n, 1);
        let (p, runs) = run_ranks(&src, d, 2, |r| {
            let a_shard: Vec<f64> = (0..m)
                .flat_map(|i| a[i * kk + r * kl..i * kk + (r + 1) * kl].to_vec())
                .collect();
            let b_shard = b[r * kl * n..(r + 1) * kl * n].to_vec();
            vec![f32t(&[s, d, mb, kl], a_shard), f32t(&[kl, n], b_shard)]
        });
        let kinds = all_kinds(&p);
        assert_eq!(kinds.iter().filter(|k| **k == "Communication").count(), 1);
        let want = matmul(&a, &b, m, kk, n);
        for (r, run) in runs.iter().enumerate() {
            // Chunk j's rows are j * D * mb ..; rank r owns its block r of mb rows.
            let mine: Vec<f64> = (0..s)
                .flat_map(|j| {
                    let row0 = (j * d + r) * mb;
                    want[row0 * n..(row0 + mb) * n].to_vec()
                })
                .collect();
            assert_eq!(run.outputs[0].data, mine, "rank {r} of {d}");
        }
    }
}

/// §10 #13 SwizzleWithParallelType, as nvFuser builds it by hand: in/out [3D, 5] per rank (the
/// DIDx shard of [3D, 5D]), the output zero-initialised, and a loop over [0, D - 1) only whose
/// views select chunk (rank + i) % D (the swizzle1d rotation). Every chunk but
/// (rank + D - 1) % D is copied; that one stays zero. (The fixture
/// tests/scenarios/swizzle_with_parallel_type.weave is the fusion form, lowered with the
/// whole loop.)
const SWIZZLE_WITH_PARALLEL_TYPE: &str = "\
%HostIrContainer { (T0_g_f32[( 3 * @D ), 5]) -> (T1_g_f32[( 3 * @D ), 5]) :
  T1 = ALLOCATE(mem_type=global, zero_init=true)
  FOR i0 from 0 to ( @D - 1 ):
    T2_g_f32[3, 5] = ShardByStream(T1, axis=0, chunks=@D, stream_index=( ( rank + i0 ) % @D ))
    T3_g_f32[3, 5] = ShardByStream(T0, axis=0, chunks=@D, stream_index=( ( rank + i0 ) % @D ))
    LaunchKernel(kernel=K0, inputs=(T3), outputs=(T2))
} // %HostIrContainer
K0: fusion copy() {
  tensor a: f32[3, 5]
  b = set(a)
  output b
}
";

#[test]
fn swizzle_with_parallel_type_leaves_the_last_rotated_chunk_zero() {
    for d in 1..=4 {
        let input = |r: usize| {
            (0..3 * d * 5)
                .map(|e| (100 * r + e + 1) as f64)
                .collect::<Vec<f64>>()
        };
        let (_, runs) = run_ranks(SWIZZLE_WITH_PARALLEL_TYPE, d, 1, |r| {
            vec![f32t(&[3 * d, 5], input(r))]
        });
        for (r, run) in runs.iter().enumerate() {
            let skipped = (r + d - 1) % d;
            let want: Vec<f64> = input(r)
                .into_iter()
                .enumerate()
                .map(|(e, v)| if e / 15 == skipped { 0.0 } else { v })
                .collect();
            assert_eq!(run.outputs[0].data, want, "rank {r} of {d}");
        }
    }
}
