//! The standard pipeline over every fixture in tests/scenarios: each lowers to a host program
//! that verifies and matches its reviewed snapshot, and the structural properties of the
//! reference's §10 scenarios hold (loop shapes, loop counts, collective types and teams,
//! bounded buffers, deallocation counts), plus the pipeline's negative cases.

mod common;

use common::{fixture, fixtures};

use std::path::Path;

use streamweave::host_ir::{self, CommunicationType, HostProgram, Stmt, StmtId};
use streamweave::passes::{
    AssignStreams, DumpOptions, Ir, PassManager, Pipeline, Registry, SyncVariant,
};

/// The standard pipeline without `prefetch-communications`: the loop shapes these tests state
/// are the lowering's and nvFuser's (§10), one chunk's communications and compute per
/// iteration; tests/prefetch.rs states what that pass then makes of them.
fn lower_with(name: &str, overrides: &[(&str, i64)]) -> HostProgram {
    let ov: Vec<(String, i64)> = overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let f = streamweave::load_file(&fixture(name), &ov).unwrap();
    streamweave::Compiler::new()
        .pipeline(Pipeline::standard().without(PREFETCH))
        .lower(f)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The compiler of [`lower_with`].
fn lowering() -> streamweave::Compiler {
    streamweave::Compiler::new().pipeline(Pipeline::standard().without(PREFETCH))
}

fn lower(name: &str) -> HostProgram {
    lower_with(name, &[])
}

/// The standard pipeline without `merge-kernel-chunks`: every stream loop as `lower-to-host`
/// builds it and `assign-streams` forks it, which is what the §10 loop shapes describe (the
/// default runs a loop that only launches kernels on small chunks once, over whole tensors).
fn lower_unmerged_with(name: &str, overrides: &[(&str, i64)]) -> HostProgram {
    let ov: Vec<(String, i64)> = overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let f = streamweave::load_file(&fixture(name), &ov).unwrap();
    streamweave::Compiler::new()
        .pipeline(Pipeline::standard().without(MERGE).without(PREFETCH))
        .lower(f)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn lower_unmerged(name: &str) -> HostProgram {
    lower_unmerged_with(name, &[])
}

const MERGE: &str = "merge-kernel-chunks";
const PREFETCH: &str = "prefetch-communications";

fn kinds(p: &HostProgram, scope: &[StmtId]) -> Vec<&'static str> {
    scope.iter().map(|s| p.stmts[*s].kind_name()).collect()
}

fn top(p: &HostProgram) -> Vec<&'static str> {
    kinds(p, &p.top_level)
}

/// Bodies of the top-level loops that do device work (not the join loops).
fn compute_loops(p: &HostProgram) -> Vec<Vec<StmtId>> {
    p.top_level
        .iter()
        .filter_map(|s| match &p.stmts[*s] {
            Stmt::ForLoop { body, .. }
                if body.iter().any(|b| {
                    !matches!(
                        p.stmts[*b],
                        Stmt::Synchronize { .. } | Stmt::SetCurrentStream { .. }
                    )
                }) =>
            {
                Some(body.clone())
            }
            _ => None,
        })
        .collect()
}

fn count(p: &HostProgram, kind: &str) -> usize {
    p.stmts.values().filter(|s| s.kind_name() == kind).count()
}

fn communications(p: &HostProgram) -> Vec<(CommunicationType, Vec<Vec<i64>>)> {
    let mut v = Vec::new();
    for w in p.walk() {
        if let Stmt::Communication(c) = &p.stmts[w.stmt] {
            v.push((c.kind, c.teams.clone()));
        }
    }
    v
}

#[test]
fn every_scenario_lowers_verifies_and_prints_as_reviewed() {
    common::snapshot_each_fixture("snapshots/pipeline", |name, _| {
        let p = lower(name);
        host_ir::verify(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
        let text = host_ir::print(&p);
        // The printed program parses back to the same text.
        let reparsed = host_ir::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        assert_eq!(host_ir::print(&reparsed), text, "{name}");
        insta::assert_snapshot!(name, text);
    });
}

/// §10 #14–16, #19, #20: one stream-parallel op: the output allocated whole before the loop,
/// the fork on the captured stream, the compute loop, the switch back and the join loop.
#[test]
fn single_stream_ops_have_the_fork_join_shape() {
    for name in [
        "single_set_op",
        "single_set_op_non_outermost",
        "single_binary_op",
        "reduction",
        "matmul_m",
        "batched_matmul",
        "matmul_n",
    ] {
        let p = lower_unmerged(name);
        assert_eq!(
            top(&p),
            [
                "Allocate",
                "GetCurrentStream",
                "ForLoop",
                "SetCurrentStream",
                "ForLoop"
            ],
            "{name}"
        );
        let loops = compute_loops(&p);
        assert_eq!(loops.len(), 1, "{name}");
        let body = kinds(&p, &loops[0]);
        assert_eq!(&body[..2], ["SetCurrentStream", "Synchronize"], "{name}");
    }
}

/// The seed-001 variant puts the entry synchronizations in their own loop.
#[test]
fn separate_entry_loop_variant() {
    let f = streamweave::load_file(&fixture("single_set_op"), &[]).unwrap();
    let mut pipeline = Pipeline::standard().without(MERGE);
    assert!(pipeline.replace(
        "assign-streams",
        AssignStreams::new(SyncVariant::SeparateLoop)
    ));
    assert_eq!(
        pipeline,
        Pipeline::resolve(
            "-merge-kernel-chunks,-assign-streams,-allocate-and-deallocate,\
             -prefetch-communications,+assign-streams-separate-sync,+allocate-and-deallocate,\
             +prefetch-communications",
            &Pipeline::standard(),
            &Registry::standard()
        )
        .unwrap()
    );
    let manager =
        PassManager::new(Registry::standard(), pipeline).with_options(DumpOptions::default());
    let Ir::Host(p) = manager
        .run_with_output(Ir::Fusion(f), &mut Vec::new())
        .unwrap()
    else {
        panic!("not a host program")
    };
    assert_eq!(
        top(&p),
        [
            "Allocate",
            "GetCurrentStream",
            "ForLoop",
            "ForLoop",
            "SetCurrentStream",
            "ForLoop"
        ]
    );
}

/// §10 #17: two mapped stream ops share one loop; §10 #18: a non-stream op in between
/// separates them into two loops with the middle op at top level.
#[test]
fn loops_merge_and_separate() {
    let p = lower_unmerged("two_set_ops");
    assert_eq!(compute_loops(&p).len(), 1);
    let p = lower_unmerged("three_set_ops_disjoint_loops");
    assert_eq!(compute_loops(&p).len(), 2);
    let t = top(&p);
    let first = t.iter().position(|k| *k == "ForLoop").unwrap();
    let kernel = t.iter().position(|k| *k == "LaunchKernel").unwrap();
    let last = t.iter().rposition(|k| *k == "ForLoop").unwrap();
    assert!(first < kernel && kernel < last, "{t:?}");
    // §10 #25/#26: inlinable matmuls share a loop; non-inlinable ones need two.
    assert_eq!(compute_loops(&lower("two_matmuls_inlinable")).len(), 1);
    assert_eq!(compute_loops(&lower("two_matmuls_not_inlinable")).len(), 2);
}

/// §10 #43: exactly one stream loop, holding ShardByStream, Linear, ShardByStream,
/// Allreduce and Wait in that order, inside the fork/join of assign-streams.
#[test]
fn row_parallel_linear_has_one_stream_loop() {
    let p = lower_with("row_parallel_linear", &[("s", 3)]);
    let loops = compute_loops(&p);
    assert_eq!(loops.len(), 1);
    let body: Vec<&str> = kinds(&p, &loops[0])
        .into_iter()
        .filter(|k| !matches!(*k, "SetCurrentStream" | "Synchronize"))
        .collect();
    let wanted = [
        "ShardByStream",
        "Linear",
        "ShardByStream",
        "Communication",
        "Wait",
    ];
    let mut it = body.iter();
    assert!(wanted.iter().all(|w| it.any(|k| k == w)), "{body:?}");
    assert_eq!(
        communications(&p),
        vec![(CommunicationType::Allreduce, vec![vec![0, 1]])]
    );
    let t = top(&p);
    assert_eq!(
        t.iter().filter(|k| **k == "ForLoop").count(),
        2,
        "compute + join: {t:?}"
    );
    // The join loop comes right after switching back to the captured stream.
    let join = t.iter().rposition(|k| *k == "ForLoop").unwrap();
    assert_eq!(t[join - 1], "SetCurrentStream", "{t:?}");
}

/// §10 #27–#40: the collective each scenario lowers to, and its team on 2 ranks.
#[test]
fn collective_types_and_teams() {
    use CommunicationType::*;
    let cases: &[(&str, CommunicationType)] = &[
        ("allgather", Allgather),
        ("allgather_loop_split", Allgather),
        ("broadcast", Broadcast),
        ("reduce", Reduce),
        ("allreduce", Allreduce),
        ("reduce_scatter", ReduceScatter),
        ("reduce_scatter_logical", ReduceScatter),
        ("all_to_all_dispatch", AllToAll),
        ("all_to_all_combine", AllToAll),
        ("gather", Gather),
        ("scatter", Scatter),
        ("stream_allgather", Allgather),
        ("stream_allreduce", Allreduce),
        ("stream_reduce_scatter", ReduceScatter),
        ("ag_matmul", Allgather),
        ("matmul_ar", Allreduce),
        ("matmul_rs", ReduceScatter),
        ("matmul_rs_through_bcast", ReduceScatter),
    ];
    for (name, kind) in cases {
        assert_eq!(
            communications(&lower(name)),
            vec![(*kind, vec![vec![0, 1]])],
            "{name}"
        );
    }
    // One SendRecv per (sender, receiver) pair.
    assert_eq!(
        communications(&lower("send_recv")),
        vec![(SendRecv, vec![vec![0, 1]]), (SendRecv, vec![vec![1, 0]])]
    );
    // With 4 ranks the team is the whole mesh.
    assert_eq!(
        communications(&lower_with("allreduce", &[("d", 4)])),
        vec![(Allreduce, vec![vec![0, 1, 2, 3]])]
    );
}

/// On a 2-D mesh `devices(dy, dx)` (device `y * dx + x`), a collective over DIDx runs within
/// each row of the mesh: one node whose teams are the `dy` rows of `dx` devices, in which
/// every rank posts on its own row. The list of teams (what NCCL splits communicators for up
/// front) is the same for every rank.
#[test]
fn collectives_on_a_two_dimensional_mesh_run_within_its_rows() {
    use CommunicationType::*;
    let rows = |dy: i64, dx: i64| -> Vec<Vec<i64>> {
        (0..dy)
            .map(|y| (0..dx).map(|x| y * dx + x).collect())
            .collect()
    };
    for (dy, dx) in [(1, 2), (2, 1), (2, 2), (3, 1), (2, 3)] {
        let shape = [("dy", dy), ("dx", dx), ("t", 12), ("h", 6)];
        // Row-parallel: one Allreduce of the partial product, at top level.
        let p = lower_with("row_parallel_linear_2d", &shape);
        assert_eq!(
            communications(&p),
            vec![(Allreduce, rows(dy, dx))],
            "{dy}x{dx}"
        );
        assert!(compute_loops(&p).is_empty());
        let teams = streamweave::executor::program_teams(&p);
        let want: Vec<Vec<usize>> = rows(dy, dx)
            .into_iter()
            .map(|r| r.into_iter().map(|d| d as usize).collect())
            .collect();
        assert_eq!(teams, want, "{dy}x{dx}");
        // NCCL splits the rows in one round, each rank joining its own row.
        let world = (dy * dx) as usize;
        let plan =
            streamweave::comm::nccl::TeamPlan::new(world, &teams, &Default::default()).unwrap();
        if dx > 1 && dy > 1 {
            assert_eq!(plan.rounds.len(), 1, "{dy}x{dx}");
            for rank in 0..world {
                let (_, key, team) = plan.split_args(0, rank);
                assert_eq!(team, Some(&want[rank / dx as usize][..]));
                assert_eq!(key as usize, rank % dx as usize);
            }
        }
        // Streamed row-parallel: one Allreduce per chunk inside the loop, same teams.
        let p = lower_with("row_parallel_linear_2d_streamed", &shape);
        let loops = compute_loops(&p);
        assert_eq!(loops.len(), 1, "{dy}x{dx}");
        let body = kinds(&p, &loops[0]);
        let linear = body.iter().position(|k| *k == "Linear").unwrap();
        let comm = body.iter().position(|k| *k == "Communication").unwrap();
        assert!(linear < comm, "{body:?}");
        assert_eq!(communications(&p), vec![(Allreduce, rows(dy, dx))]);
        // Column-parallel: the P2P ring within every row, no collective.
        let p = lower_with("column_parallel_linear_2d", &shape);
        let loops = compute_loops(&p);
        assert_eq!(loops.len(), 1);
        assert_eq!(communications(&p), vec![]);
        assert_eq!(count(&p, "P2PCommunication"), 2);
        // With the mesh's devices listed out of rank order, rows of several devices are no
        // strided slices of the world: a Broadcast per iteration whose root is the loop index
        // (an index into the rank's row), over the rows as teams.
        if dx == 1 {
            continue;
        }
        let source = std::fs::read_to_string(fixture("column_parallel_linear_2d"))
            .unwrap()
            .replace("devices(dy, dx)", &permuted_mesh(dy, dx));
        let ov: Vec<(String, i64)> = shape.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        let f = streamweave::load("permuted.weave", &source, &ov).unwrap();
        let p = lowering().lower(f).unwrap();
        let loops = compute_loops(&p);
        let rows: Vec<Vec<i64>> = rows(dy, dx)
            .into_iter()
            .map(|r| r.into_iter().map(|d| (d + 1) % (dy * dx)).collect())
            .collect();
        assert_eq!(communications(&p), vec![(Broadcast, rows.clone())]);
        assert_eq!(count(&p, "P2PCommunication"), 0);
        let comm = loops[0]
            .iter()
            .find_map(|s| match &p.stmts[*s] {
                Stmt::Communication(c) => Some(c.clone()),
                _ => None,
            })
            .unwrap();
        assert!(matches!(
            comm.root.map(|r| &p.scalars[r]),
            Some(host_ir::HostScalar::LoopIndex)
        ));
        for row in rows {
            for d in &row {
                assert_eq!(comm.team_of(*d), Some(row.as_slice()));
            }
        }
        assert_eq!(comm.team_of(dy * dx), None);
    }
}

/// `devices(dy, dx)` written out with device `(k + 1) % (dy * dx)` at flat position `k`.
fn permuted_mesh(dy: i64, dx: i64) -> String {
    let rows: Vec<String> = (0..dy)
        .map(|y| {
            let row: Vec<String> = (0..dx)
                .map(|x| ((y * dx + x + 1) % (dy * dx)).to_string())
                .collect();
            format!("[{}]", row.join(", "))
        })
        .collect();
    format!("[{}]", rows.join(", "))
}

/// A DID → DID copy between two meshes of one shape is one SendRecv node whose teams are the
/// disjoint (sender, receiver) pairs.
#[test]
fn send_recv_pairs_between_disjoint_meshes_share_one_node() {
    use CommunicationType::*;
    let src = "fusion pairs(t = 4, h = 6) {
  mesh a = [0, 1]
  mesh b = [2, 3]
  tensor x: f32[t, h] on a
  y = set(x)
  z = neg(y)
  output z
  schedule x { outer_split(0, 2) -> DIDx }
  schedule y { mesh = b; outer_split(0, 2) -> DIDx }
}
";
    let f = streamweave::load("pairs.weave", src, &[]).unwrap();
    let p = lowering().lower(f).unwrap();
    assert_eq!(
        communications(&p),
        vec![(SendRecv, vec![vec![0, 2], vec![1, 3]])]
    );
}

/// A reduction to a mesh outside the senders' reduces among the senders (an Allreduce on
/// their mesh) and broadcasts the result from the first sender; the receiver never takes part
/// in the reduction, where it would add a term it does not have.
#[test]
fn a_reduction_to_a_receiver_outside_the_senders_goes_through_them() {
    use CommunicationType::*;
    let src = "fusion outside(d = 2) {
  mesh m = [0, 1]
  mesh r = [2]
  tensor inp: f32[4, 3] on m
  out = sum(inp, [0])
  output out
  schedule inp { outer_split(0, 2) -> DIDx }
  schedule out { mesh = r }
}
";
    let f = streamweave::load("outside.weave", src, &[]).unwrap();
    let p = lowering().lower(f).unwrap();
    assert_eq!(
        communications(&p),
        vec![(Allreduce, vec![vec![0, 1]]), (Broadcast, vec![vec![2, 0]])]
    );
}

/// §10 #40 / seed 003: a stream-split allgather becomes a coalesced send/recv ring whose
/// peers come from the loop index and the rank.
#[test]
fn stream_split_allgather_is_a_p2p_ring() {
    for name in ["allgather_p2p", "ag_matmul_p2p", "column_parallel_linear"] {
        let p = lower(name);
        let loops = compute_loops(&p);
        assert_eq!(loops.len(), 1, "{name}");
        let body: Vec<&str> = kinds(&p, &loops[0]);
        let start = body.iter().position(|k| *k == "StartCoalescing").unwrap();
        assert_eq!(
            &body[start..start + 5],
            [
                "StartCoalescing",
                "P2PCommunication",
                "P2PCommunication",
                "EndCoalescing",
                "Wait"
            ],
            "{name}"
        );
        assert!(communications(&p).is_empty(), "{name}");
        let text = host_ir::print(&p);
        assert!(
            text.contains("peer=( ( rank + i0 ) % 2 )"),
            "{name}:\n{text}"
        );
        assert!(
            text.contains("peer=( ( ( 2 + rank ) - i0 ) % 2 )"),
            "{name}:\n{text}"
        );
    }
}

/// §6.4 / nvFuser #5308: a loop-local stream intermediate holds min(S, numberOfStreams)
/// chunks, allocated once before its loop.
#[test]
fn loop_local_intermediate_gets_number_of_streams_slots() {
    let p = lower("two_matmuls_inlinable");
    let text = host_ir::print(&p);
    assert!(
        text.contains(
            "T4_g_f32[( ( ceilDiv(M, 3) ) * ( min(3, numberOfStreams) ) ), N] = ALLOCATE"
        ),
        "{text}"
    );
    let loop_pos = top(&p).iter().position(|k| *k == "ForLoop").unwrap();
    let alloc_pos = p
        .top_level
        .iter()
        .position(|s| matches!(&p.stmts[*s], Stmt::Allocate { tensor, .. } if p.tensors[*tensor].sizes.len() == 2 && !p.outputs.contains(tensor)))
        .unwrap();
    assert!(alloc_pos < loop_pos);
    // Iteration i writes slot i % numberOfStreams, one of min(S, numberOfStreams) chunks,
    // narrowed to the length of chunk i of M (the last one is shorter when 3 does not
    // divide M).
    assert!(
        text.contains("chunks=( min(3, numberOfStreams) ), stream_index=( i0 % numberOfStreams ), holds=(chunk=i0, chunks=3, extent=M))"),
        "{text}"
    );
}

/// §10 #10: three kernels separated by segment_set free the two intermediates;
/// §10 #11: outputs are never freed.
#[test]
fn deallocation_counts() {
    let p = lower("insert_deallocations");
    assert_eq!(count(&p, "LaunchKernel"), 3);
    assert_eq!(count(&p, "Deallocate"), 2);
    let p = lower("exclude_outputs_from_deallocations");
    assert_eq!(count(&p, "Deallocate"), 0);
    assert_eq!(p.outputs.len(), 2);
}

/// The acceptance run: `--print-after=all` shows every pass in order and ends in the
/// host program.
#[test]
fn print_after_all_shows_every_pass() {
    let f = streamweave::load_file(&fixture("row_parallel_linear"), &[]).unwrap();
    let mut options = DumpOptions::default();
    options.after.add("all");
    let manager = PassManager::standard().with_options(options);
    let mut out = Vec::new();
    manager.run_with_output(Ir::Fusion(f), &mut out).unwrap();
    let out = String::from_utf8(out).unwrap();
    let mut at = 0;
    for pass in Pipeline::standard().names() {
        let header = format!("IR Dump After {pass} ");
        let pos = out[at..]
            .find(&header)
            .unwrap_or_else(|| panic!("no dump after {pass}"));
        at += pos + header.len();
    }
    assert!(out[at..].contains("%HostIrContainer"));
}

/// A stream axis on a reduction cannot be sliced into chunks: `load` refuses the schedule
/// step, at its position.
#[test]
fn stream_on_a_reduction_axis_is_refused() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scenarios/invalid/stream_on_reduction_axis.weave");
    let e = streamweave::load_file(&path, &[]).unwrap_err().to_string();
    assert!(
        e.contains("schedule of `c`: parallelize(2, Stream): loop axis 2 is a reduction axis, which cannot be stream-parallel (the chunks' partial results would need adding up); stream-split an iteration axis"),
        "{e}"
    );
    assert!(e.contains("stream_on_reduction_axis.weave:11:16"), "{e}");
}

/// The host verifier names the statement when a lowered program is broken.
#[test]
fn verifier_names_the_statement() {
    let mut p = lower_with("row_parallel_linear", &[("s", 3)]);
    let body = compute_loops(&p)[0].clone();
    let wait = body
        .iter()
        .copied()
        .find(|s| matches!(p.stmts[*s], Stmt::Wait { .. }))
        .unwrap();
    let Some(Stmt::ForLoop { body, .. }) = p
        .top_level
        .iter()
        .copied()
        .find(|s| matches!(&p.stmts[*s], Stmt::ForLoop { body, .. } if body.contains(&wait)))
        .map(|s| &mut p.stmts[s])
    else {
        panic!("loop not found")
    };
    body.retain(|s| *s != wait);
    let e = host_ir::verify(&p).unwrap_err().to_string();
    assert!(
        e.contains("Communication") && e.contains("type=Allreduce"),
        "{e}"
    );
    assert!(e.contains("is never waited for"), "{e}");
}

/// A fusion input that reaches the stream axis only through a reshape cannot be cut into the
/// loop's chunks: load refuses the Stream split at its schedule step, naming the tensor, its
/// axis and the reshape (lowering used to refuse it late, without a location).
#[test]
fn stream_input_that_cannot_be_sliced_is_refused() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scenarios/invalid/stream_input_through_reshape.weave");
    let e = streamweave::load_file(&path, &[]).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "schedule of `b`: outer_split(0, s) -> Stream: the Stream split cuts axis 0 of `b` \
             (`x * y`), which `b = reshape(a, [x * y])` makes by merging `x` and `y`; stream \
             chunks are not carried through a reshape of their axis (`a` would have no axis to \
             cut into the same chunks)"
        ),
        "{e}"
    );
    assert!(
        e.contains("stream_input_through_reshape.weave:10:16"),
        "{e}"
    );
}

/// An AllToAll whose cut axis is also split by the other device type is refused, naming the
/// set and the tensor: the packing reshape would have to carry that split.
#[test]
fn an_all_to_all_with_another_split_on_its_cut_axis_is_refused() {
    let src = "fusion f(a = 2, b = 3) {
  mesh m = devices(2, 2)
  tensor x: f32[2 * a, 4 * b] on m
  y = set(x)
  output y
  schedule x { outer_split(0, 2) -> DIDx; outer_split(2, 2) -> DIDy }
  schedule y { mesh = m; outer_split(1, 2) -> DIDy; outer_split(2, 2) -> DIDx }
}
";
    let f = streamweave::load("cut.weave", src, &[]).unwrap();
    let e = streamweave::Compiler::new()
        .lower(f)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(
            "pass `reorder-sharded-axis`: AllToAll over DIDx in `y = set(x)`: `x` is also split \
             by DIDy on an axis the exchange moves; split that axis by DIDx only, or reshard \
             DIDy in a set of its own"
        ),
        "{e}"
    );
}

/// A scatter from another mesh onto a 2-D mesh: the input is copied whole onto the 2-D mesh
/// (a Broadcast), then scattered within each row of it.
#[test]
fn a_scatter_onto_a_two_dimensional_mesh_from_another_broadcasts_then_scatters() {
    let src = "fusion sc(n = 2) {
  mesh r = [0]
  mesh m = devices(2, 2)
  tensor x: f32[4, 2 * n] on r
  y = set(x)
  output y
  schedule y { mesh = m; outer_split(0, 2) -> DIDx }
}
";
    let f = streamweave::load("sc.weave", src, &[]).unwrap_or_else(|e| panic!("{e}"));
    let text = host_ir::print(
        &streamweave::Compiler::new()
            .lower(f)
            .unwrap_or_else(|e| panic!("{e}")),
    );
    assert!(text.contains("type=Broadcast"), "{text}");
    assert!(text.contains("type=Scatter, team=(0 1 | 2 3)"), "{text}");
}

/// A set on a 2-D mesh that swaps the DIDx and DIDy axes becomes three collectives, each over
/// the rows or the columns of the mesh: gather DIDx, move DIDy, split DIDx again.
#[test]
fn two_sharding_changes_in_one_expr_become_one_collective_each() {
    use CommunicationType::*;
    let src = "fusion f(d = 2) {\n  mesh m = devices(d, d)\n  tensor a: f32[4, 4] on m\n  b = set(a)\n  output b\n  schedule a { outer_split(0, d) -> DIDx; outer_split(2, d) -> DIDy }\n  schedule b { mesh = m; outer_split(1, d) -> DIDx; outer_split(0, d) -> DIDy }\n}\n";
    let f = streamweave::load("two.weave", src, &[]).unwrap();
    let p = lowering().lower(f).unwrap();
    let (rows, columns) = (vec![vec![0, 1], vec![2, 3]], vec![vec![0, 2], vec![1, 3]]);
    assert_eq!(
        communications(&p),
        vec![
            (Allgather, rows.clone()),
            (AllToAll, columns),
            (Scatter, rows)
        ]
    );
}

/// The column-parallel benchmark patterns (issue 6): the chunked form gathers each chunk with
/// one allgather inside the stream loop into a buffer of min(s, numberOfStreams) slots; the
/// P2P form receives and sends one block per iteration in a coalesced pair and multiplies it,
/// with no collective at all.
#[test]
fn column_parallel_benchmark_patterns_pipeline_per_chunk() {
    let p = lower_with("column_parallel_chunked", &[("t", 64), ("h", 8), ("s", 4)]);
    let loops = compute_loops(&p);
    assert_eq!(loops.len(), 1);
    let body = kinds(&p, &loops[0]);
    let gather = body.iter().position(|k| *k == "Communication").unwrap();
    let linear = body.iter().position(|k| *k == "Linear").unwrap();
    assert!(gather < linear, "{body:?}");
    assert_eq!(
        communications(&p),
        vec![(CommunicationType::Allgather, vec![vec![0, 1]])]
    );
    let text = host_ir::print(&p);
    assert!(
        text.contains("min(4, numberOfStreams)"),
        "the gather buffer is bounded by the stream pool:\n{text}"
    );

    let p = lower_with("column_parallel_p2p", &[("t", 64), ("h", 8), ("d", 4)]);
    let loops = compute_loops(&p);
    assert_eq!(loops.len(), 1);
    let body = kinds(&p, &loops[0]);
    assert_eq!(communications(&p), vec![], "no collective: {body:?}");
    let start = body.iter().position(|k| *k == "StartCoalescing").unwrap();
    let end = body.iter().position(|k| *k == "EndCoalescing").unwrap();
    assert_eq!(
        body[start + 1..end],
        ["P2PCommunication", "P2PCommunication"],
        "{body:?}"
    );
    assert!(body.iter().position(|k| *k == "Linear").unwrap() > end);
    let text = host_ir::print(&p);
    assert!(
        text.contains("FOR i0 from 0 to 4"),
        "d = 4 iterations:\n{text}"
    );
}

/// The statements of `body` with the given kind names, in order.
fn only<'a>(body: &[&'a str], wanted: &[&str]) -> Vec<&'a str> {
    body.iter()
        .copied()
        .filter(|k| wanted.contains(k))
        .collect()
}

/// §10 #37 AGMatmul CollectiveBasedPipeline (explicit stream axis): the loop body is nvFuser's
/// "AG_before_Matmul" order — select the input chunk and the gather slot, Allgather, Wait,
/// select the output chunk, matmul — and the gather buffer has min(S, numberOfStreams) slots.
#[test]
fn ag_matmul_gathers_then_multiplies_per_chunk() {
    let p = lower("ag_matmul");
    assert_eq!(
        top(&p),
        [
            "Allocate",
            "GetCurrentStream",
            "Allocate",
            "ForLoop",
            "SetCurrentStream",
            "ForLoop",
            "Deallocate"
        ]
    );
    let loops = compute_loops(&p);
    assert_eq!(loops.len(), 1);
    assert_eq!(
        kinds(&p, &loops[0]),
        [
            "SetCurrentStream",
            "Synchronize",
            "ShardByStream",
            "ShardByStream",
            "Communication",
            "Wait",
            "ShardByStream",
            "Matmul"
        ]
    );
    assert_eq!(
        communications(&p),
        vec![(CommunicationType::Allgather, vec![vec![0, 1]])]
    );
    let text = host_ir::print(&p);
    assert!(text.contains("FOR i0 from 0 to 4:"), "{text}");
    assert!(text.contains("min(4, numberOfStreams)"), "{text}");
}

/// §10 #38 and #39 in nvFuser's explicit-axis form (matmul batch broadcasting): one stream
/// loop whose body multiplies the chunk and reduces it with one collective per chunk; #39's
/// explicit broadcast of the weight is a kernel launched once before the loop.
#[test]
fn logical_matmul_ar_and_rs_reduce_per_chunk() {
    for (name, kind, head, kernels) in [
        (
            "matmul_ar_logical",
            CommunicationType::Allreduce,
            &["Allocate", "GetCurrentStream"][..],
            0,
        ),
        (
            "matmul_rs_through_bcast_logical",
            CommunicationType::ReduceScatter,
            &["Allocate", "LaunchKernel", "Allocate", "GetCurrentStream"][..],
            1,
        ),
    ] {
        for d in 1..=4 {
            let p = lower_with(name, &[("d", d)]);
            if d == 1 && kind == CommunicationType::ReduceScatter {
                // One device: the device axis the sum scatters to indexes the same (single)
                // block as the one it reduces, so the sum is local.
                assert_eq!(communications(&p), vec![], "{name} d={d}");
                continue;
            }
            let t = top(&p);
            assert_eq!(&t[..head.len()], head, "{name} d={d}");
            assert_eq!(count(&p, "LaunchKernel"), kernels, "{name} d={d}");
            let loops = compute_loops(&p);
            assert_eq!(loops.len(), 1, "{name} d={d}");
            let body = kinds(&p, &loops[0]);
            assert_eq!(
                only(&body, &["Matmul", "Communication", "Wait"]),
                ["Matmul", "Communication", "Wait"],
                "{name} d={d}: {body:?}"
            );
            let team: Vec<i64> = (0..d).collect();
            assert_eq!(communications(&p), vec![(kind, vec![team])], "{name} d={d}");
            let text = host_ir::print(&p);
            assert!(text.contains("FOR i0 from 0 to 4:"), "{name}:\n{text}");
        }
    }
}

/// §10 #42 RSMatmul (reconstructed): the partial product is computed chunk by chunk inside
/// the stream loop (over the D blocks of rows), and the Stream -> DID sum travels in the same
/// loop, as nvFuser's ReduceScatterP2p: iteration i computes chunk (rank + 1 + i) % D (the
/// rank's own block last), sends it to its device and receives this rank's partial of the
/// block into a slot, which one kernel adds into the output zeroed before the loop. With
/// `lower-to-host{allgather=broadcast}` it is nvFuser's ReduceScatterReduceBased: a Reduce
/// rooted at device i in iteration i. The broadcast of `b` is a kernel before the loop.
#[test]
fn rs_matmul_multiplies_and_reduces_per_chunk() {
    use streamweave::passes::{LowerToHost, StreamAllgather};
    for d in 1..=4 {
        let p = lower_with("rs_matmul", &[("d", d)]);
        if d == 1 {
            // One device: the device axis the sum scatters to indexes the same (single) block
            // as the one it reduces, so the sum is local.
            assert_eq!(communications(&p), vec![], "d={d}");
            continue;
        }
        let t = top(&p);
        assert_eq!(&t[..2], ["Allocate", "LaunchKernel"], "d={d}");
        let loops = compute_loops(&p);
        assert_eq!(loops.len(), 1, "d={d}");
        let body = kinds(&p, &loops[0]);
        assert_eq!(
            only(
                &body,
                &[
                    "Matmul",
                    "P2PCommunication",
                    "Communication",
                    "LaunchKernel"
                ]
            ),
            [
                "Matmul",
                "P2PCommunication",
                "P2PCommunication",
                "LaunchKernel"
            ],
            "d={d}"
        );
        let after = t.iter().rposition(|k| *k == "ForLoop").unwrap();
        assert!(
            only(&t[after..], &["Communication", "Wait"]).is_empty(),
            "d={d}: {t:?}"
        );
        assert_eq!(communications(&p), vec![], "d={d}");
        let text = host_ir::print(&p);
        assert!(text.contains(&format!("FOR i0 from 0 to {d}:")), "{text}");
        assert!(
            text.contains(&format!("stream_index=( ( ( rank + 1 ) + i0 ) % {d} ))")),
            "{text}"
        );

        let mut pipeline = Pipeline::standard().without(PREFETCH);
        assert!(pipeline.replace(
            "lower-to-host",
            LowerToHost::new(StreamAllgather::Broadcast)
        ));
        let f = streamweave::load_file(&fixture("rs_matmul"), &[("d".to_string(), d)]).unwrap();
        let p = streamweave::Compiler::new()
            .pipeline(pipeline)
            .lower(f)
            .unwrap();
        let team: Vec<i64> = (0..d).collect();
        assert_eq!(
            communications(&p),
            vec![(CommunicationType::Reduce, vec![team])],
            "d={d}"
        );
        let text = host_ir::print(&p);
        assert!(text.contains("root=i0,"), "{text}");
        assert!(!text.contains("rank"), "{text}");
    }
}

/// §10 #44 test_column_parallel_linear_forward, functional config (h = 2, t = 24): the default
/// lowering of the DID -> Stream allgather is the offset-by-rank exchange (nvFuser's
/// `collective_permute` variant): d iterations, each one coalesced recv + send pair. Iteration
/// 0 exchanges with the rank itself (a local copy), so d - 1 iterations move data between
/// ranks (nvFuser expects d - 1 SendRecv kernels); there is no collective.
#[test]
fn column_parallel_linear_exchanges_one_block_per_iteration() {
    for d in 1..=4 {
        let h = if d == 3 { 3 } else { 2 };
        let p = lower_with("column_parallel_linear", &[("d", d), ("h", h), ("t", 24)]);
        assert_eq!(communications(&p), vec![], "d={d}");
        let loops = compute_loops(&p);
        assert_eq!(loops.len(), 1, "d={d}");
        let body = kinds(&p, &loops[0]);
        assert_eq!(count(&p, "P2PCommunication"), 2, "d={d}");
        assert_eq!(
            only(
                &body,
                &[
                    "StartCoalescing",
                    "P2PCommunication",
                    "EndCoalescing",
                    "Wait",
                    "Linear"
                ]
            ),
            [
                "StartCoalescing",
                "P2PCommunication",
                "P2PCommunication",
                "EndCoalescing",
                "Wait",
                "Linear"
            ],
            "d={d}"
        );
        let text = host_ir::print(&p);
        assert!(text.contains(&format!("FOR i0 from 0 to {d}:")), "{text}");
        // recv from (rank + i) % d: the rank itself exactly when i = 0.
        assert!(
            text.contains(&format!(
                "type=recv, buffer=T4, peer=( ( rank + i0 ) % {d} )"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "type=send, buffer=T0, peer=( ( ( {d} + rank ) - i0 ) % {d} )"
            )),
            "{text}"
        );
        // nvFuser's `collective_permute` variant writes the rotation as a swizzle1d: the same
        // program (only the definitions, as the user wrote them, differ).
        let mut permute = lower_with(
            "column_parallel_linear_permute",
            &[("d", d), ("h", h), ("t", 24)],
        );
        let without_definition = |p: &mut HostProgram| {
            p.signature.as_mut().unwrap().definition = None;
            host_ir::print(p)
        };
        let mut plain = p.clone();
        assert_eq!(
            without_definition(&mut permute),
            without_definition(&mut plain),
            "d={d}"
        );
    }
}

/// §10 #13 SwizzleWithParallelType: `swizzle1d(0, DIDx)` makes every chunk view of the stream
/// loop select chunk (rank + i) % d; a plain copy, no communication.
#[test]
fn swizzle1d_rotates_every_chunk_view_by_the_rank() {
    for d in 1..=4 {
        let p = lower_unmerged_with("swizzle_with_parallel_type", &[("d", d)]);
        assert_eq!(communications(&p), vec![], "d={d}");
        let loops = compute_loops(&p);
        assert_eq!(loops.len(), 1, "d={d}");
        let text = host_ir::print(&p);
        let rotated = format!("stream_index=( ( rank + i0 ) % {d} ))");
        assert_eq!(text.matches(&rotated).count(), 2, "{text}");
        assert_eq!(text.matches("ShardByStream").count(), 2, "{text}");
    }
}

/// A stream loop that only launches generated kernels, on small chunks (every fixture's are),
/// costs more in launches and tails than it gains: the default
/// pipeline runs it once, one launch per kernel over the whole tensors (`merge-kernel-chunks`),
/// and keeps every loop that holds a GEMM or a communication exactly as `lower-to-host` built
/// it. Over every fixture: no kernel-only loop survives, every other loop does, and the
/// kernels launched are the same.
#[test]
fn kernel_only_stream_loops_run_once_over_whole_tensors() {
    fn loop_bodies(p: &HostProgram) -> Vec<Vec<&'static str>> {
        compute_loops(p)
            .iter()
            .map(|b| {
                kinds(p, b)
                    .into_iter()
                    .filter(|k| {
                        !matches!(
                            *k,
                            "SetCurrentStream" | "Synchronize" | "Allocate" | "Deallocate"
                        )
                    })
                    .collect()
            })
            .collect()
    }
    let kernel_only = |b: &Vec<&str>| {
        b.iter()
            .all(|k| matches!(*k, "ShardByStream" | "LaunchKernel"))
    };
    let mut merged_somewhere = 0;
    for path in fixtures() {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let merged = lower(&name);
        let unmerged = lower_unmerged(&name);
        let (before, after) = (loop_bodies(&unmerged), loop_bodies(&merged));
        assert!(!after.iter().any(kernel_only), "{name}: {after:?}");
        let kept: Vec<_> = before.iter().filter(|b| !kernel_only(b)).cloned().collect();
        assert_eq!(after, kept, "{name}");
        assert_eq!(
            count(&merged, "LaunchKernel"),
            count(&unmerged, "LaunchKernel"),
            "{name}"
        );
        if before.iter().any(kernel_only) {
            merged_somewhere += 1;
            // The launches that left their loop name whole tensors: the program's own or
            // buffers allocated at top level.
            for s in &merged.top_level {
                if let Stmt::LaunchKernel {
                    inputs, outputs, ..
                } = &merged.stmts[*s]
                {
                    for t in inputs.iter().chain(outputs) {
                        let bound_at_top = merged.inputs.contains(t)
                            || merged.top_level.iter().any(|a| {
                                matches!(merged.stmts[*a], Stmt::Allocate { tensor, .. } if tensor == *t)
                            });
                        assert!(bound_at_top, "{name}: {}", host_ir::print(&merged));
                    }
                }
            }
        }
    }
    assert!(merged_somewhere >= 5, "{merged_somewhere}");
    for name in [
        "single_set_op",
        "single_binary_op",
        "reduction",
        "two_set_ops",
    ] {
        let p = lower(name);
        assert_eq!(
            (count(&p, "ForLoop"), count(&p, "ShardByStream")),
            (0, 0),
            "{name}: {}",
            host_ir::print(&p)
        );
    }
}

/// Only small chunks merge: the kernel benchmark's bf16 add at 4096² moves 24 MiB a chunk
/// in 4 chunks (merged), at 16384 × 8192 192 MiB (kept: such chunks cost nothing); the f32
/// column sum likewise, and exactly 64 MiB a chunk is kept.
#[test]
fn kernel_only_loops_keep_chunks_that_move_64_mib_or_more() {
    for (name, t, h, loops) in [
        ("add", 4096, 4096, 0),
        ("add", 16384, 8192, 1),
        ("col_sum", 4096, 4096, 0),
        ("col_sum", 16384, 8192, 1),
        // A column chunk of 16384 × 1024 f32 in and 1024 f32 out: 4 KiB over 64 MiB, kept;
        // 16383 rows: exactly 64 MiB, kept; 16382 rows: 4 KiB under, merged.
        ("col_sum", 16384, 4096, 1),
        ("col_sum", 16383, 4096, 1),
        ("col_sum", 16382, 4096, 0),
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/scenarios/kernels")
            .join(format!("{name}.weave"));
        let set = [
            ("t".to_string(), t),
            ("h".to_string(), h),
            ("s".to_string(), 4),
        ];
        let f = streamweave::load_file(&path, &set).unwrap();
        let p = lowering().lower(f).unwrap();
        assert_eq!(
            compute_loops(&p).len(),
            loops,
            "{name} [{t}, {h}]: {}",
            host_ir::print(&p)
        );
    }
}
