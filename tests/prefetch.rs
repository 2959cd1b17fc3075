//! `prefetch-communications` on the programs users write: the order in which a rank posts its
//! collectives (chunk `i + 1`'s allgather before chunk `i`'s reduce-scatter), the slots that
//! keep a prefetched chunk apart from the one being computed, the loops left alone, and the
//! results against the f64 reference with the race checker on 1–3 pool streams.

mod common;

use std::collections::HashMap;

use common::fixture;
use streamweave::host_ir::{
    self, CommunicationType, HostProgram, HostScalar, P2PDirection, ScalarId, Stmt, StmtId,
};
use streamweave::passes::{Pipeline, PrefetchCommunications};

fn source(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).unwrap()
}

fn lower_with(src: &str, overrides: &[(&str, i64)], pipeline: Option<Pipeline>) -> HostProgram {
    let ov: Vec<(String, i64)> = overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let f = streamweave::load("test.weave", src, &ov).unwrap_or_else(|e| panic!("{e}"));
    let mut c = streamweave::Compiler::new();
    if let Some(p) = pipeline {
        c = c.pipeline(p);
    }
    c.lower(f).unwrap_or_else(|e| panic!("{e}"))
}

/// The default pipeline without `prefetch-communications`.
fn without_prefetch() -> Pipeline {
    Pipeline::standard().without("prefetch-communications")
}

/// The value of a host scalar with the loop indices bound in `env` and `numberOfStreams` =
/// `k`, the parameters from the program's signature.
fn value(p: &HostProgram, s: ScalarId, env: &HashMap<ScalarId, i64>, k: i64) -> i64 {
    let params = &p.signature.as_ref().unwrap().params;
    match &p.scalars[s] {
        HostScalar::LoopIndex => env[&s],
        HostScalar::Value(x) => x
            .eval(&|name| {
                if name == "numberOfStreams" {
                    Some(k)
                } else {
                    params
                        .iter()
                        .find(|(n, _)| n.as_str() == name)
                        .map(|(_, v)| *v)
                }
            })
            .unwrap_or_else(|| panic!("cannot evaluate {x}")),
        HostScalar::Binary(op, a, b) => {
            let (a, b) = (value(p, *a, env, k), value(p, *b, env, k));
            streamweave::ir::Scalar::binary(
                *op,
                streamweave::ir::Scalar::c(a),
                streamweave::ir::Scalar::c(b),
            )
            .eval(&|_| None)
            .unwrap()
        }
    }
}

/// What `pick` names of the statements one rank runs, in the order it runs them, each with
/// its chunk (the innermost loop index there), walking the loops as the evaluator does.
fn posted<T>(p: &HostProgram, k: i64, pick: &dyn Fn(&Stmt) -> Option<T>) -> Vec<(T, i64)> {
    fn walk<T>(
        p: &HostProgram,
        scope: &[StmtId],
        env: &mut HashMap<ScalarId, i64>,
        chunk: Option<i64>,
        k: i64,
        pick: &dyn Fn(&Stmt) -> Option<T>,
        out: &mut Vec<(T, i64)>,
    ) {
        for &s in scope {
            match &p.stmts[s] {
                Stmt::ForLoop {
                    index,
                    start,
                    stop,
                    body,
                } => {
                    let (a, b) = (value(p, *start, env, k), value(p, *stop, env, k));
                    for i in a..b {
                        env.insert(*index, i);
                        walk(p, body, env, Some(i), k, pick, out);
                    }
                    env.remove(index);
                }
                other => {
                    if let Some(x) = pick(other) {
                        out.push((x, chunk.unwrap_or(-1)));
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(
        p,
        &p.top_level,
        &mut HashMap::new(),
        None,
        k,
        pick,
        &mut out,
    );
    out
}

/// The collectives one rank posts, in the order it posts them, each with its chunk.
fn posting_order(p: &HostProgram, k: i64) -> Vec<(CommunicationType, i64)> {
    posted(p, k, &|s| match s {
        Stmt::Communication(c) => Some(c.kind),
        _ => None,
    })
}

/// The sequence-parallel MLP block posts chunk `i + 1`'s allgather before chunk `i`'s
/// reduce-scatter (which waits for chunk `i`'s GEMMs); without the pass each allgather
/// follows the previous chunk's reduce-scatter.
#[test]
fn the_mlp_block_posts_the_next_chunks_allgather_before_this_chunks_reduce_scatter() {
    use CommunicationType::{Allgather as Ag, ReduceScatter as Rs};
    let src = source("sequence_parallel_mlp_block");
    for (d, s, t) in [(2, 2, 48), (2, 3, 48), (2, 4, 40), (4, 4, 64), (3, 5, 45)] {
        let set = [("d", d), ("s", s), ("t", t)];
        let mut want = vec![(Ag, 0)];
        for i in 1..s {
            want.push((Ag, i));
            want.push((Rs, i - 1));
        }
        want.push((Rs, s - 1));
        let before: Vec<_> = (0..s).flat_map(|i| [(Ag, i), (Rs, i)]).collect();
        for k in 1..=3 {
            let p = lower_with(&src, &set, None);
            assert_eq!(posting_order(&p, k), want, "d = {d}, s = {s}, K = {k}");
            let old = lower_with(&src, &set, Some(without_prefetch()));
            assert_eq!(posting_order(&old, k), before, "d = {d}, s = {s}, K = {k}");
        }
    }
}

/// The backward of the block gathers `x` at the head of its body and the output's gradient
/// after its first GEMM: both are posted a chunk ahead of the chunk's GEMMs and its
/// reduce-scatter.
#[test]
fn the_mlp_backward_posts_both_allgathers_of_the_next_chunk_first() {
    use CommunicationType::{Allgather as Ag, ReduceScatter as Rs};
    let src = source("sequence_parallel_mlp_backward");
    for (d, s, t) in [(2, 2, 48), (2, 3, 36), (4, 4, 64)] {
        let set = [("d", d), ("s", s), ("t", t)];
        let mut want = vec![(Ag, 0), (Ag, 0)];
        for i in 1..s {
            want.extend([(Ag, i), (Ag, i), (Rs, i - 1)]);
        }
        want.push((Rs, s - 1));
        for k in 1..=3 {
            let p = lower_with(&src, &set, None);
            assert_eq!(posting_order(&p, k), want, "d = {d}, s = {s}, K = {k}");
        }
    }
}

/// The gathered chunks live in `min(s, max(numberOfStreams, 2))` slots: with one pool stream,
/// chunk `i + 1` arrives in the other slot while chunk `i` is computed from its own.
#[test]
fn a_prefetched_buffer_holds_at_least_two_chunks() {
    let src = source("sequence_parallel_mlp_block");
    let (t, h, s) = (48, 8, 4);
    let p = lower_with(&src, &[("s", s), ("t", t), ("h", h)], None);
    let gathered = p
        .stmts
        .values()
        .find_map(|st| match st {
            Stmt::Communication(c) if c.kind == CommunicationType::Allgather => Some(c.output),
            _ => None,
        })
        .unwrap();
    let buffer = p
        .stmts
        .values()
        .find_map(|st| match st {
            Stmt::ShardByStream { input, output, .. } if *output == gathered => Some(*input),
            _ => None,
        })
        .unwrap();
    let env = HashMap::new();
    let rows = |k| value(&p, p.tensors[buffer].sizes[0], &env, k);
    let chunk = t / s;
    assert_eq!(rows(1), 2 * chunk, "one pool stream");
    assert_eq!(rows(2), 2 * chunk);
    assert_eq!(rows(3), 3 * chunk);
    assert_eq!(rows(8), s * chunk, "never more than s chunks");
}

/// Loops whose communications read what the loop computes (a row-parallel linear's
/// allreduce, a GEMM's reduce-scatter), loops that post nothing after their gather (a
/// column-parallel linear), and loops of one chunk, are left as they were; the pass run again
/// changes nothing.
#[test]
fn loops_without_a_communication_of_loop_invariant_data_are_left_alone() {
    for (name, set) in [
        ("row_parallel_linear", vec![("s", 4)]),
        ("matmul_rs", vec![("s", 4)]),
        ("sequence_parallel_mlp_block", vec![("s", 1)]),
        // Gathers, then only computes: the next gather already runs beside this GEMM.
        (
            "column_parallel_chunked",
            vec![("s", 4), ("t", 64), ("h", 8)],
        ),
        ("ag_matmul", vec![]),
    ] {
        let src = source(name);
        let new = host_ir::print(&lower_with(&src, &set, None));
        let old = host_ir::print(&lower_with(&src, &set, Some(without_prefetch())));
        assert_eq!(new, old, "{name} {set:?}");
    }
    let src = source("sequence_parallel_mlp_block");
    let mut p = lower_with(&src, &[("s", 3)], None);
    let once = host_ir::print(&p);
    assert_eq!(
        PrefetchCommunications.run_on(&mut p),
        streamweave::passes::Changed::No
    );
    assert_eq!(host_ir::print(&p), once);
}

/// The rewritten MLP blocks (gathered, and broadcast from a device split: a root that follows
/// the chunk) match the f64 reference, with the race checker, on 1–4 ranks, 1–3 pool
/// streams, chunk counts that divide and that do not.
#[test]
fn prefetched_programs_match_the_reference_on_every_pool_size() {
    let cases: &[(&str, &[(&str, i64)])] = &[
        ("sequence_parallel_mlp_block", &[("t", 48)]),
        ("sequence_parallel_mlp_block", &[("t", 40)]),
        ("sequence_parallel_mlp_broadcast", &[]),
        ("sequence_parallel_mlp_backward", &[("t", 48)]),
        ("sequence_parallel_mlp_backward", &[("t", 45)]),
    ];
    for &(name, set) in cases {
        let src = source(name);
        for ranks in [1usize, 2, 4] {
            for s in [2i64, 3, 5] {
                for streams in 1..=3usize {
                    let mut ov: Vec<(String, i64)> =
                        set.iter().map(|(k, v)| (k.to_string(), *v)).collect();
                    ov.push(("s".into(), s));
                    ov.push(("d".into(), ranks as i64));
                    let fusion = match streamweave::load("test.weave", &src, &ov) {
                        Ok(f) => f,
                        // A chunk count the layout cannot cut is refused at load, by name.
                        Err(e) => {
                            assert!(e.to_string().contains("test.weave:"), "{e}");
                            continue;
                        }
                    };
                    if let Err(f) = common::run_checked(fusion, ranks, streams, 5) {
                        panic!(
                            "{name} {ov:?} on {ranks} ranks, {streams} streams, {}:\n{}",
                            f.stage, f.detail
                        );
                    }
                }
            }
        }
    }
}

/// The MLP block on a 2 × 2 mesh (data-parallel rows, tensor-parallel within each row), as
/// the docs' 2-D meshes write it: its gather reads what a permute kernel made of the chunk of
/// `x` (the gathered axis must lead), so that kernel is posted ahead with the gather.
const MLP_2D: &str = "\
fusion mlp_2d(b = 4, t = 16, h = 8, f = 32, dy = 2, dx = 2, s = 2) {
  mesh m = devices(dy, dx)
  tensor x: f32[b, t, h] on m
  tensor w1: f32[f, h] on m
  tensor w2: f32[h, f] on m
  ag = set(x)
  h1 = linear(ag, w1)
  sg = sigmoid(h1)
  a = mul(h1, sg)
  out = linear(a, w2)
  output out
  schedule x { outer_split(0, dy) -> DIDy; outer_split(2, s) -> Stream; outer_split(3, dx) -> DIDx }
  schedule w1 { outer_split(0, dx) -> DIDx }
  schedule w2 { outer_split(1, dx) -> DIDx }
  schedule ag { mesh = m; outer_split(0, dy) -> DIDy; outer_split(2, s) -> Stream }
  schedule out { mesh = m; outer_split(3, dx) -> DIDx; outer_split(0, dy) -> DIDy; outer_split(2, s) -> Stream; outer_split(3, dx) -> DIDx }
}
";

/// The statements of the first loop of the rewritten loop's body (the posting loop), by kind.
fn posting_loop_kinds(p: &HostProgram) -> Vec<&'static str> {
    let outer = p
        .top_level
        .iter()
        .find_map(|&s| match &p.stmts[s] {
            Stmt::ForLoop { body, .. } => Some(body.clone()),
            _ => None,
        })
        .expect("a loop");
    let Stmt::ForLoop { body, .. } = &p.stmts[outer[0]] else {
        panic!("the posting loop");
    };
    body.iter()
        .map(|&s| match &p.stmts[s] {
            Stmt::SetCurrentStream { .. } => "set",
            Stmt::Synchronize { .. } => "sync",
            Stmt::ShardByStream { .. } => "view",
            Stmt::LaunchKernel { .. } => "kernel",
            Stmt::Communication(_) => "comm",
            Stmt::Wait { .. } => "wait",
            _ => "other",
        })
        .collect()
}

#[test]
fn a_gather_of_a_kernels_output_of_loop_invariant_data_is_posted_ahead_with_that_kernel() {
    use CommunicationType::{Allgather as Ag, ReduceScatter as Rs};
    for (s, t) in [(2, 16), (3, 24), (4, 32)] {
        let set = [("s", s), ("t", t)];
        let p = lower_with(MLP_2D, &set, None);
        assert_eq!(
            posting_loop_kinds(&p),
            ["set", "sync", "view", "view", "kernel", "view", "comm", "wait"],
            "s = {s}\n{}",
            host_ir::print(&p)
        );
        let mut want = vec![(Ag, 0)];
        for i in 1..s {
            want.push((Ag, i));
            want.push((Rs, i - 1));
        }
        want.push((Rs, s - 1));
        for k in 1..=3 {
            assert_eq!(posting_order(&p, k), want, "s = {s}, K = {k}");
        }
        // Without the pass, each gather follows the previous chunk's reduce-scatter.
        let old = lower_with(MLP_2D, &set, Some(without_prefetch()));
        let before: Vec<_> = (0..s).flat_map(|i| [(Ag, i), (Rs, i)]).collect();
        assert_eq!(posting_order(&old, 2), before, "s = {s}");
        // Both the kernel's buffer and the gathered one keep at least two chunks; no other.
        let text = host_ir::print(&p);
        let two_slots = text
            .lines()
            .filter(|l| l.contains("= ALLOCATE") && l.contains("max(numberOfStreams, 2)"))
            .count();
        assert_eq!(two_slots, 2, "{text}");
    }
    // The numbers, with the race checker, on 1–3 pool streams, even and uneven chunks.
    for (s, t) in [(2i64, 16i64), (3, 24), (3, 20)] {
        for streams in 1..=3usize {
            let ov = vec![("s".to_string(), s), ("t".to_string(), t)];
            let fusion = match streamweave::load("test.weave", MLP_2D, &ov) {
                Ok(f) => f,
                Err(e) => {
                    assert!(e.to_string().contains("test.weave:"), "{e}");
                    continue;
                }
            };
            if let Err(f) = common::run_checked(fusion, 4, streams, 5) {
                panic!(
                    "s = {s}, t = {t}, {streams} streams, {}:\n{}",
                    f.stage, f.detail
                );
            }
        }
    }
}

/// The coalesced send/recv groups one rank posts, in the order it posts them, each named by
/// what it moves (`gather`: it sends a program input, the ring's allgather; `reduce`: it
/// sends what the loop computed) and its chunk.
fn p2p_posting_order(p: &HostProgram, k: i64) -> Vec<(&'static str, i64)> {
    posted(p, k, &|s| match s {
        Stmt::P2PCommunication(c) if c.direction == P2PDirection::Send => {
            Some(if p.inputs.contains(&c.buffer) {
                "gather"
            } else {
                "reduce"
            })
        }
        _ => None,
    })
}

/// The MLP block with one stream chunk per device is two P2P rings in two loops
/// (tests/stream_did.rs): every step of the allgather's ring is posted before the first step
/// that sends partial sums back, so no gather queues behind a reduction; the second ring visits
/// the rank's own chunk last.
#[test]
fn the_ring_mlp_block_posts_every_gather_step_before_its_reduce_steps() {
    let src = source("sequence_parallel_mlp_ring");
    for d in [2i64, 3, 4] {
        let set = [("d", d), ("t", 12 * d)];
        let want: Vec<_> = (0..d)
            .map(|i| ("gather", i))
            .chain((0..d).map(|i| ("reduce", i)))
            .collect();
        for k in 1..=3 {
            let p = lower_with(&src, &set, None);
            assert_eq!(p2p_posting_order(&p, k), want, "d = {d}, K = {k}");
        }
    }
}
