//! Device splits and stream splits of the same axis: which collectives each chunk posts
//! (sequence parallelism written with loop splits, a device split nested inside stream
//! chunks, DID → Stream copies whose factors nest), that they match the f64 reference on 1–4
//! ranks, and the exact load-time refusals of the layouts that are not supported.

mod common;

use common::fixture;
use streamweave::host_ir::{self, CommunicationType, HostProgram, Stmt, StmtId};

/// Lowered by the standard pipeline without `prefetch-communications`: the collectives each
/// chunk posts, one chunk per iteration (tests/prefetch.rs covers their order after it).
fn lower_source(source: &str, overrides: &[(&str, i64)]) -> HostProgram {
    let ov: Vec<(String, i64)> = overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let f = streamweave::load("test.weave", source, &ov).unwrap_or_else(|e| panic!("{e}"));
    streamweave::Compiler::new()
        .pipeline(streamweave::passes::Pipeline::standard().without("prefetch-communications"))
        .lower(f)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn lower(name: &str, overrides: &[(&str, i64)]) -> HostProgram {
    lower_source(&std::fs::read_to_string(fixture(name)).unwrap(), overrides)
}

/// The statements of `scope` and of the loops in it, in program order, with the loop depth.
fn flat(p: &HostProgram, scope: &[StmtId], depth: usize, out: &mut Vec<(usize, StmtId)>) {
    for s in scope {
        out.push((depth, *s));
        if let Stmt::ForLoop { body, .. } = &p.stmts[*s] {
            flat(p, body, depth + 1, out);
        }
    }
}

/// The communications in program order: their type, root as printed, and loop depth.
fn communications(p: &HostProgram) -> Vec<(CommunicationType, usize)> {
    let mut all = Vec::new();
    flat(p, &p.top_level, 0, &mut all);
    all.into_iter()
        .filter_map(|(depth, s)| match &p.stmts[s] {
            Stmt::Communication(c) => Some((c.kind, depth)),
            _ => None,
        })
        .collect()
}

fn count(p: &HostProgram, kind: &str) -> usize {
    p.stmts.values().filter(|s| s.kind_name() == kind).count()
}

/// Runs `source` on `ranks` in-process ranks with the race checker and panics unless every
/// output matches the reference.
fn assert_matches_reference(source: &str, overrides: &[(&str, i64)], ranks: usize) {
    let ov: Vec<(String, i64)> = overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let fusion = streamweave::load("test.weave", source, &ov).unwrap_or_else(|e| panic!("{e}"));
    if let Err(f) = common::run_checked(fusion, ranks, 2, 11 + ranks as u64) {
        panic!("{overrides:?} on {ranks} ranks, {}:\n{}", f.stage, f.detail);
    }
}

/// Sequence parallelism with x laid out `[s, d, ..]` on the tokens: one stream loop in which
/// every chunk is an Allgather of the ranks' blocks, the two products, and a ReduceScatter
/// into the same nested layout; no P2P ring and no rotated chunk order.
#[test]
fn sequence_parallel_mlp_allgathers_and_reduce_scatters_every_chunk() {
    for (d, s) in [(2, 2), (2, 3), (4, 2)] {
        let p = lower("sequence_parallel_mlp", &[("d", d), ("s", s)]);
        assert_eq!(
            communications(&p),
            [
                (CommunicationType::Allgather, 1),
                (CommunicationType::ReduceScatter, 1)
            ],
            "d = {d}, s = {s}"
        );
        assert_eq!(count(&p, "P2PCommunication"), 0);
        let text = host_ir::print(&p);
        assert!(text.contains(&format!("FOR i0 from 0 to {s}:")), "{text}");
        assert!(!text.contains("rank"), "chunks indexed by rank:\n{text}");
    }
}

/// The same block from a plain device split: each chunk is a Broadcast rooted at the chunk's
/// device, since the ReduceScatter in the same loop needs every rank on the same chunk.
#[test]
fn sequence_parallel_mlp_from_a_device_split_broadcasts_every_chunk() {
    let p = lower("sequence_parallel_mlp_broadcast", &[]);
    assert_eq!(
        communications(&p),
        [
            (CommunicationType::Broadcast, 1),
            (CommunicationType::ReduceScatter, 1)
        ]
    );
    assert_eq!(count(&p, "P2PCommunication"), 0);
    let text = host_ir::print(&p);
    assert!(
        text.contains("type=Broadcast, team=(0 1), root=i0,"),
        "{text}"
    );
    assert!(!text.contains("rank"), "chunks indexed by rank:\n{text}");
}

/// The DID → Stream copy with a stream factor that is a multiple of the device count, or a
/// divisor of it: per chunk one Broadcast of a piece of one device's block, or several
/// Broadcasts into pieces of the chunk. Both match the reference.
const SP_RATIO: &str = "fusion sp_ratio(t = 48, h = 4, f = 24, d = 2, s = 4) {
  mesh m = devices(d)
  tensor x: f32[t, h] on m
  tensor w1: f32[f, h] on m
  tensor w2: f32[h, f] on m
  ag = set(x)
  h1 = linear(ag, w1)
  a = sigmoid(h1)
  out = linear(a, w2)
  output out
  schedule x { outer_split(0, d) -> DIDx }
  schedule w1 { outer_split(0, d) -> DIDx }
  schedule w2 { outer_split(1, d) -> DIDx }
  schedule ag { mesh = m; outer_split(0, s) -> Stream }
  schedule out { mesh = m; outer_split(2, d) -> DIDx; outer_split(0, s) -> Stream; outer_split(1, d) -> DIDx }
}
";

#[test]
fn did_to_stream_with_nesting_factors_broadcasts_pieces() {
    let p = lower_source(SP_RATIO, &[("d", 2), ("s", 4)]);
    let text = host_ir::print(&p);
    assert!(text.contains("root=( i0 / 2 )"), "{text}");
    assert_eq!(count(&p, "Communication"), 2, "{text}");
    let p = lower_source(SP_RATIO, &[("d", 4), ("s", 2)]);
    let text = host_ir::print(&p);
    assert!(text.contains("root=( ( i0 * 2 ) + 1 )"), "{text}");
    assert_eq!(count(&p, "Communication"), 3, "{text}");
    for (d, s) in [(1, 3), (2, 4), (2, 6), (4, 2), (4, 1), (3, 1), (2, 1)] {
        assert_matches_reference(SP_RATIO, &[("d", d), ("s", s)], d as usize);
    }
}

/// Factors that neither match nor nest: one Allgather before the loop, then local chunks.
#[test]
fn did_to_stream_with_unrelated_factors_gathers_first() {
    let p = lower_source(SP_RATIO, &[("d", 2), ("s", 3)]);
    let text = host_ir::print(&p);
    assert!(text.contains("type=Allgather"), "{text}");
    assert!(!text.contains("type=Broadcast"), "{text}");
    for (d, s) in [(2, 3), (4, 3), (2, 5)] {
        assert_matches_reference(SP_RATIO, &[("d", d), ("s", s)], d as usize);
    }
}

/// A device split inside stream chunks gathered whole (no stream loop): one Allgather per
/// chunk, each between views of that chunk, so rows come back in order.
#[test]
fn allgather_of_a_device_split_inside_stream_chunks_is_posted_per_chunk() {
    let source = "fusion nested_ag(d = 2, s = 3) {
  mesh m = devices(d)
  tensor inp: f32[2 * d * s, 2] on m
  out = neg(inp)
  output out
  schedule inp { outer_split(0, s) -> Stream; outer_split(1, d) -> DIDx }
  schedule out { mesh = m }
}
";
    let p = lower_source(source, &[]);
    assert_eq!(
        communications(&p),
        [(CommunicationType::Allgather, 0); 3],
        "{}",
        host_ir::print(&p)
    );
    for d in 1..=4 {
        assert_matches_reference(source, &[("d", d)], d as usize);
    }
}

/// `[s, d, ..]` to `[d, ..]` and back on one axis: no device's shard moves whole, so the copy
/// gathers into a replicated tensor and scatters from it (not a one-rank SendRecv). From the
/// nested layout the gather is an Allgather per input chunk, the scatter one whole Scatter; into
/// the nested layout both run per output chunk, a Broadcast from the chunk's device then a
/// Scatter.
#[test]
fn resharding_between_nested_and_plain_device_splits_gathers_then_scatters() {
    use CommunicationType::{Allgather, Broadcast, Scatter};
    let nested = "outer_split(0, s) -> Stream; outer_split(1, d) -> DIDx";
    let plain = "outer_split(0, d) -> DIDx";
    for (from, to, expected) in [
        (nested, plain, vec![(Allgather, 1), (Scatter, 0)]),
        (plain, nested, vec![(Broadcast, 1), (Scatter, 1)]),
    ] {
        let source = format!(
            "fusion nested(d = 2, s = 2) {{
  mesh m = devices(d)
  tensor inp: f32[2 * d * s, 2] on m
  out = set(inp)
  output out
  schedule inp {{ {from} }}
  schedule out {{ mesh = m; {to} }}
}}
"
        );
        let p = lower_source(&source, &[]);
        assert_eq!(communications(&p), expected, "{}", host_ir::print(&p));
        for d in 1..=4 {
            for s in 1..=3 {
                assert_matches_reference(&source, &[("d", d), ("s", s)], d as usize);
            }
        }
    }
}

/// A sum over an axis split by the devices and by an outer split, as
/// `fusion {name}(d = 2, s = 2)` with `inp: f32[3, 2 * d * s]` reduced over axis 1 and `steps`
/// the schedule of `inp`.
fn sum_over_split_axis(name: &str, steps: &str) -> String {
    format!(
        "fusion {name}(d = 2, s = 2) {{
  mesh m = devices(d)
  tensor inp: f32[3, 2 * d * s] on m
  out = sum(inp, [1])
  output out
  schedule inp {{ {steps} }}
}}
"
    )
}

/// A sum over an axis whose device split sits inside an outer split: each rank reduces the
/// blocks it holds, then one Allreduce. The same over an axis split Stream-then-DIDx: no loop
/// chunks the reduction (propagation does not stream a reduction axis), the input is read
/// whole, each rank reduces its blocks and one Allreduce adds them up. Both match the
/// reference on 1 to 4 ranks (the second at 1 to 3 stream chunks too).
#[test]
fn sums_over_a_device_split_inside_an_outer_split_allreduce_once() {
    // (fusion, schedule of `inp`, the stream factors run: none is the default)
    let cases: [(&str, &str, &[i64]); 2] = [
        (
            "nested_sum",
            "outer_split(1, s); outer_split(2, d) -> DIDx",
            &[],
        ),
        (
            "stream_sum",
            "outer_split(1, s) -> Stream; outer_split(2, d) -> DIDx",
            &[1, 2, 3],
        ),
    ];
    for (name, steps, stream_factors) in cases {
        let source = sum_over_split_axis(name, steps);
        let p = lower_source(&source, &[]);
        assert_eq!(
            communications(&p),
            [(CommunicationType::Allreduce, 0)],
            "{name}"
        );
        for d in 1..=4 {
            if stream_factors.is_empty() {
                assert_matches_reference(&source, &[("d", d)], d as usize);
            }
            for &s in stream_factors {
                assert_matches_reference(&source, &[("d", d), ("s", s)], d as usize);
            }
        }
    }
}

/// A Stream split inside a DIDx split of the same axis runs (each device streams over its own
/// block, tests/streams_inside_device_splits.rs); a copy of it inside a stream loop, into
/// global chunks, is refused at load at the Stream step.
#[test]
fn a_copy_of_stream_chunks_inside_a_device_split_into_global_chunks_is_refused_at_load() {
    let source = std::fs::read_to_string(fixture("invalid/stream_inside_did")).unwrap();
    let err = streamweave::load("stream_inside_did.weave", &source, &[])
        .expect_err("refused")
        .to_string();
    assert_eq!(
        err,
        "schedule of `x`: outer_split(1, s) -> Stream: the Stream split cuts each device's block \
         of axis 0 of `x` (`e`, split across DIDx), and `y = set(x)` changes the device sharding \
         of `x` inside a stream loop: a collective per chunk would pair chunk i of different \
         blocks on different devices, which is not a chunk of the tensor. Copy it whole (no \
         Stream split on `y`, so the copy runs once before or after the loop), or split the \
         stream first and the devices inside each chunk (`outer_split(0, s) -> Stream; \
         outer_split(1, d) -> DIDx`)
  --> stream_inside_did.weave:15:43
   |
15 |   schedule x { outer_split(0, d) -> DIDx; outer_split(1, s) -> Stream }
   |                                           ^"
    );
}

/// The same DID → Stream mismatch through an op other than `set` (decompose-reshardings
/// inserts the copy): the copy gathers first, like the `set`.
#[test]
fn implicit_did_to_stream_with_unrelated_factors_gathers_first() {
    let source = "fusion imp(t = 12, h = 4, d = 2, s = 3) {
  mesh m = devices(d)
  tensor x: f32[t, h] on m
  out = neg(x)
  output out
  schedule x { outer_split(0, d) -> DIDx }
  schedule out { mesh = m; outer_split(0, s) -> Stream }
}
";
    let text = host_ir::print(&lower_source(source, &[]));
    assert!(text.contains("type=Allgather"), "{text}");
    assert_matches_reference(source, &[], 2);
    for (d, s) in [(2, 4), (2, 2), (2, 1), (4, 2), (3, 6)] {
        assert_matches_reference(source, &[("d", d), ("s", s)], d as usize);
    }
}

/// Compiles `name` with `pipeline` and runs it on 1–4 ranks and 1–3 pool streams with the race
/// checker, against the f64 reference.
fn assert_runs(name: &str, pipeline: &streamweave::passes::Pipeline) {
    use streamweave::{Compiler, RunOptions, Target};
    let source = std::fs::read_to_string(fixture(name)).unwrap();
    for ranks in 1..=4usize {
        let ov = vec![
            ("d".to_string(), ranks as i64),
            ("t".to_string(), 12 * ranks as i64),
            ("h".to_string(), 12),
        ];
        let fusion = streamweave::load(name, &source, &ov).unwrap_or_else(|e| panic!("{e}"));
        let compiled = Compiler::new()
            .pipeline(pipeline.clone())
            .compile(&fusion)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for streams in 1..=3 {
            let options = RunOptions {
                target: Target::Cpu { ranks },
                check: true,
                streams,
                check_races: true,
                timeouts: streamweave::Timeouts::all(std::time::Duration::from_secs(20)),
                ..RunOptions::default()
            };
            let globals = compiled.random_inputs(3 + ranks as u64).unwrap();
            let report = compiled
                .run_dense(&globals, &options)
                .unwrap_or_else(|e| panic!("{name}, {ranks} ranks, {streams} streams: {e}"));
            assert!(!report.checks.is_empty(), "{name}: no output was checked");
            assert!(
                report.passed(),
                "{name}, {ranks} ranks, {streams} streams: {:?}",
                report.checks
            );
        }
    }
}

/// The P2P statements of the (only) stream loop, as (direction, peer as printed).
fn p2p_peers(p: &HostProgram) -> Vec<String> {
    let text = host_ir::print(p);
    text.lines()
        .filter(|l| l.contains("P2PCommunication"))
        .map(|l| {
            let kind = if l.contains("type=recv") {
                "recv"
            } else {
                "send"
            };
            let peer = l.split("peer=").nth(1).unwrap_or("");
            let peer = peer.rsplit_once(", backend").map_or(peer, |(p, _)| p);
            format!("{kind} {peer}")
        })
        .collect()
}

/// The MLP block with one stream chunk per device is two P2P rings and no collective: the
/// allgather's ring (iteration i of rank r receives chunk (r + i) % d, its own block first) with
/// the first product and the SiLU, then, in a loop of its own, the ring that sends the partial
/// sums back and computes the rank's own chunk last (iteration i: chunk (r + 1 + i) % d, sent
/// to its device, while this rank's partial from device (r - 1 - i) % d arrives in a slot and
/// is added in place into the output, zeroed before that loop). No Allreduce per chunk and no
/// Scatter after the loop.
#[test]
fn the_mlp_block_with_a_chunk_per_device_is_two_rings() {
    for d in [2, 3, 4] {
        let p = lower("sequence_parallel_mlp_ring", &[("d", d), ("t", 12 * d)]);
        assert_eq!(communications(&p), [], "d = {d}");
        let text = host_ir::print(&p);
        let gather = format!("( ( rank + i0 ) % {d} )");
        let reduce = format!("( ( ( rank + 1 ) + i2 ) % {d} )");
        assert_eq!(
            p2p_peers(&p),
            [
                format!("recv {gather}"),
                format!("send ( ( ( {d} + rank ) - i0 ) % {d} )"),
                format!("recv ( ( ( {d} + ( rank + rank ) ) - {reduce} ) % {d} )"),
                format!("send {reduce}"),
            ],
            "d = {d}:\n{text}"
        );
        assert_eq!(count(&p, "EndCoalescing"), 2, "{text}");
        assert!(text.contains(&format!("FOR i0 from 0 to {d}:")), "{text}");
        assert!(text.contains(&format!("FOR i2 from 0 to {d}:")), "{text}");
        // The first loop ends with the SiLU kernel, the second starts with the second product.
        let first_loop = &text[text.find("FOR i0").unwrap()..text.find("FOR i1").unwrap()];
        assert!(!first_loop.contains("K1"), "{first_loop}");
        assert_eq!(first_loop.matches("linear(").count(), 1, "{first_loop}");
        // The output, zeroed before the second loop, is both an input and the output of the
        // last kernel of the loop.
        let last_kernel = text
            .lines()
            .rfind(|l| l.contains("LaunchKernel"))
            .unwrap()
            .to_string();
        let out_name = text
            .lines()
            .next()
            .and_then(|l| l.split("-> (").nth(1))
            .and_then(|l| l.split('_').next())
            .unwrap()
            .to_string();
        assert!(
            last_kernel.ends_with(&format!(", {out_name}), outputs=({out_name}))")),
            "{last_kernel}"
        );
        assert!(
            text.contains(&format!(
                "{out_name} = ALLOCATE(mem_type=global, zero_init=true)"
            )),
            "{text}"
        );
    }
    assert_runs(
        "sequence_parallel_mlp_ring",
        &streamweave::passes::Pipeline::standard(),
    );
}

/// `lower-to-host{allgather=broadcast}` posts collectives instead of both rings: per
/// iteration i one Broadcast rooted at device i and one Reduce rooted at device i, which
/// writes the block of device i only.
#[test]
fn the_mlp_block_with_a_chunk_per_device_broadcasts_and_reduces_per_chunk() {
    use streamweave::passes::{LowerToHost, Pipeline, StreamAllgather};
    let mut pipeline = Pipeline::standard();
    assert!(pipeline.replace(
        "lower-to-host",
        LowerToHost::new(StreamAllgather::Broadcast)
    ));
    let source = std::fs::read_to_string(fixture("sequence_parallel_mlp_ring")).unwrap();
    let f = streamweave::load("ring.weave", &source, &[]).unwrap();
    let p = streamweave::Compiler::new()
        .pipeline(pipeline.clone().without("prefetch-communications"))
        .lower(f)
        .unwrap();
    assert_eq!(
        communications(&p),
        [
            (CommunicationType::Broadcast, 1),
            (CommunicationType::Reduce, 1)
        ]
    );
    let text = host_ir::print(&p);
    assert!(text.contains("type=Reduce, team=(0 1), root=i0,"), "{text}");
    assert_eq!(count(&p, "P2PCommunication"), 0);
    assert_runs("sequence_parallel_mlp_ring", &pipeline);
}

/// A matmul whose partial sums leave in one stream chunk per device, with no allgather in its
/// loop: a ring of its own that computes the rank's own chunk last (iteration i holds chunk
/// (rank + 1 + i) % d, whose partial goes to that device while this rank's partial from device
/// (rank - 1 - i) % d arrives).
#[test]
fn a_matmul_reduce_scattered_by_its_chunks_is_a_ring_that_ends_with_the_own_chunk() {
    for d in [2, 3, 4] {
        let p = lower("matmul_rs_ring", &[("d", d), ("t", 12 * d), ("h", 12)]);
        assert_eq!(communications(&p), [], "d = {d}");
        let text = host_ir::print(&p);
        let view = format!("( ( ( rank + 1 ) + i0 ) % {d} )");
        assert_eq!(
            p2p_peers(&p),
            [
                format!("recv ( ( ( {d} + ( rank + rank ) ) - {view} ) % {d} )"),
                format!("send {view}"),
            ],
            "d = {d}:\n{text}"
        );
        assert!(
            text.contains(&format!("axis=0, chunks={d}, stream_index={view})")),
            "{text}"
        );
    }
    assert_runs("matmul_rs_ring", &streamweave::passes::Pipeline::standard());
}

/// `p = linear(a, w)` with a device-split contraction, written as `out = set(p)`: whether the
/// device sum and the `set` fold into one Reduce per chunk (posted as the P2P ring) depends on
/// the layouts, and every variant matches the reference on 1–4 ranks and 1–3 pool streams.
/// `p`'s schedule, an op after `out`, and whether the ring is expected.
const RS_VARIANTS: &[(&str, &str, &str, bool)] = &[
    // One stream chunk per device, `out` read by another op: folded.
    (
        "p = linear(a, w)",
        "outer_split(0, d) -> Stream",
        "y = relu(out)\n  output y",
        true,
    ),
    // Twice as many chunks as devices: a chunk is no device's block, no fold (an Allreduce
    // per chunk, then a Scatter).
    (
        "p = linear(a, w)",
        "outer_split(0, 2 * d) -> Stream",
        "output out",
        false,
    ),
    // A bias (added after the sum) is added after the ring instead, into the device block.
    (
        "p = linear(a, w, bias)",
        "outer_split(0, d) -> Stream",
        "output out",
        true,
    ),
    // ... and with twice as many chunks as devices, as without one: no fold.
    (
        "p = linear(a, w, bias)",
        "outer_split(0, 2 * d) -> Stream",
        "output out",
        false,
    ),
];

#[test]
fn stream_to_device_sums_fold_where_each_chunk_is_a_device_block() {
    for &(def, split, tail, ring) in RS_VARIANTS {
        let source = format!(
            "fusion rs_variant(t = 48, h = 8, f = 24, d = 2) {{
  mesh m = devices(d)
  tensor a: f32[t, f] on m
  tensor w: f32[h, f] on m
  tensor bias: f32[h] on m
  {def}
  out = set(p)
  {tail}
  schedule a {{ outer_split(1, d) -> DIDx }}
  schedule w {{ outer_split(1, d) -> DIDx }}
  schedule p {{ mesh = m; outer_split(2, d) -> DIDx; {split} }}
  schedule out {{ mesh = m; outer_split(0, d) -> DIDx }}
}}
"
        );
        for d in 1..=4i64 {
            let set = [("d", d), ("t", 24 * d)];
            let p = lower_source(&source, &set);
            let rings = count(&p, "P2PCommunication") > 0;
            if d > 1 {
                assert_eq!(rings, ring, "{def} / {split} / {tail}, d = {d}");
                let kinds: Vec<_> = communications(&p).into_iter().map(|(k, _)| k).collect();
                if !ring {
                    assert!(
                        kinds.contains(&CommunicationType::Allreduce)
                            && kinds.contains(&CommunicationType::Scatter),
                        "{kinds:?}"
                    );
                }
            }
            for streams in 1..=3usize {
                let ov: Vec<(String, i64)> = set.iter().map(|(k, v)| (k.to_string(), *v)).collect();
                let fusion = streamweave::load("v.weave", &source, &ov).unwrap();
                if let Err(f) = common::run_checked(fusion, d as usize, streams, 9) {
                    panic!(
                        "{def} / {split}, d = {d}, {streams} streams, {}:\n{}",
                        f.stage, f.detail
                    );
                }
            }
        }
    }
}

/// The MLP block with one stream chunk per device of each mesh row, on a `devices(dy, dx)`
/// mesh: the teams are the rows, not the world in rank order, so neither ring is built; per
/// iteration `i` one Broadcast and one Reduce rooted at the row's device `i`, every row at
/// once. Results on every mesh shape of up to 4 devices, 1–2 pool streams.
const MLP_RING_2D: &str = "fusion mlp_ring_2d(b = 4, t = 16, h = 8, f = 32, dy = 2, dx = 2) {
  mesh m = devices(dy, dx)
  tensor x: f32[b, t, h] on m
  tensor w1: f32[f, h] on m
  tensor w2: f32[h, f] on m
  ag = set(x)
  h1 = linear(ag, w1)
  a = relu(h1)
  p = linear(a, w2)
  out = set(p)
  output out
  schedule x { outer_split(0, dy) -> DIDy; outer_split(2, dx) -> DIDx }
  schedule w1 { outer_split(0, dx) -> DIDx }
  schedule w2 { outer_split(1, dx) -> DIDx }
  schedule ag { mesh = m; outer_split(0, dy) -> DIDy; outer_split(2, dx) -> Stream }
  schedule p { mesh = m; outer_split(0, dy) -> DIDy; outer_split(4, dx) -> DIDx; outer_split(2, dx) -> Stream }
  schedule out { mesh = m; outer_split(0, dy) -> DIDy; outer_split(2, dx) -> DIDx }
}
";

#[test]
fn the_ring_mlp_block_on_a_2d_mesh_posts_rooted_collectives_per_row() {
    let p = lower_source(MLP_RING_2D, &[]);
    assert_eq!(
        communications(&p),
        [
            (CommunicationType::Broadcast, 1),
            (CommunicationType::Reduce, 1)
        ]
    );
    let text = host_ir::print(&p);
    assert!(
        text.contains("type=Reduce, team=(0 1 | 2 3), root=i0,"),
        "{text}"
    );
    assert_eq!(count(&p, "P2PCommunication"), 0);
    for (dy, dx) in [(1, 2), (2, 1), (2, 2), (1, 4), (4, 1)] {
        let ov = vec![("dy".to_string(), dy), ("dx".to_string(), dx)];
        for streams in 1..=2usize {
            let fusion = streamweave::load("m.weave", MLP_RING_2D, &ov).unwrap();
            if let Err(f) = common::run_checked(fusion, (dy * dx) as usize, streams, 4) {
                panic!("{dy} x {dx}, {streams} streams, {}:\n{}", f.stage, f.detail);
            }
        }
    }
}

/// The ring-form MLP block with the biases of Megatron's MLP (the first linear's split with
/// its output features, the second's replicated): still two rings and no collective; the
/// second bias is added once, into each device's block, after the sums' ring.
#[test]
fn the_ring_mlp_block_with_biases_adds_the_second_bias_after_the_sums_ring() {
    let source = std::fs::read_to_string(fixture("sequence_parallel_mlp_ring"))
        .unwrap()
        .replace(
            "tensor w1: bf16[f, h] on m",
            "tensor w1: bf16[f, h] on m\n  tensor b1: bf16[f] on m",
        )
        .replace(
            "tensor w2: bf16[h, f] on m",
            "tensor w2: bf16[h, f] on m\n  tensor b2: bf16[h] on m",
        )
        .replace("linear(ag, w1)", "linear(ag, w1, b1)")
        .replace("linear(a, w2)", "linear(a, w2, b2)")
        .replace(
            "schedule w2 {",
            "schedule b1 { outer_split(0, d) -> DIDx }\n  schedule w2 {",
        );
    for d in 1..=4i64 {
        let set = [("d", d), ("t", 12 * d)];
        let p = lower_source(&source, &set);
        // (One device: its splits of extent 1 are collectives of a team of one, as without
        // biases.)
        if d > 1 {
            assert_eq!(communications(&p), [], "d = {d}");
            assert_eq!(count(&p, "P2PCommunication"), 4, "d = {d}");
        }
        // The last statement that computes: the bias kernel, at top level, into the output.
        let text = host_ir::print(&p);
        let last = p
            .top_level
            .iter()
            .rev()
            .find(|s| matches!(p.stmts[**s], Stmt::LaunchKernel { .. }))
            .map(|s| p.stmts[*s].clone());
        assert!(
            d == 1
                || matches!(&last, Some(Stmt::LaunchKernel { outputs, .. }) if outputs == &p.outputs),
            "{text}"
        );
        for streams in 1..=3usize {
            let ov: Vec<(String, i64)> = set.iter().map(|(k, v)| (k.to_string(), *v)).collect();
            let fusion = streamweave::load("b.weave", &source, &ov).unwrap();
            if let Err(f) = common::run_checked(fusion, d as usize, streams, 6) {
                panic!("d = {d}, {streams} streams, {}:\n{}", f.stage, f.detail);
            }
        }
    }
}
