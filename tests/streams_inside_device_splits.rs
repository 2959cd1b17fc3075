//! Stream chunks inside the device split of the same axis (`outer_split(a, d) -> DIDx;
//! outer_split(a + 1, s) -> Stream`: each device's local block cut into `s` stream chunks):
//! the MoE experts and attention-heads fixtures and a data-parallel weight gradient on 1 to 4
//! CPU ranks at even and uneven chunks (and more chunks than local elements), each checked
//! against the f64 reference with the race checker on, with the structure of the host
//! program; and the copies inside a stream loop that load refuses, with their exact message.

mod common;

use common::{attention_inputs, param, runs_on_with, Case, Checked};
use streamweave::host_ir::{HostProgram, HostScalar, Stmt};
use streamweave::ir::ParallelType;

/// The value of scalar `s` of `p`, with the parameter values of its signature.
fn constant(p: &HostProgram, s: streamweave::host_ir::ScalarId) -> Option<i64> {
    let params = &p.signature.as_ref()?.params;
    let lookup = |n: &str| params.iter().find(|(k, _)| k == n).map(|(_, v)| *v);
    match &p.scalars[s] {
        HostScalar::Value(v) => v.eval(&lookup),
        _ => None,
    }
}

/// The one top-level stream loop that does work: its trip count, and for every
/// `ShardByStream` of a program input in its body, (the input's position, the cut axis, the
/// chunk count, the input's local size along that axis).
fn stream_loop(p: &HostProgram) -> (i64, Vec<(usize, usize, i64, i64)>) {
    let loops: Vec<_> = p
        .top_level
        .iter()
        .filter_map(|s| match &p.stmts[*s] {
            Stmt::ForLoop { stop, body, .. }
                if body.iter().any(|b| {
                    !matches!(
                        p.stmts[*b],
                        Stmt::Synchronize { .. } | Stmt::SetCurrentStream { .. }
                    )
                }) =>
            {
                Some((*stop, body.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(loops.len(), 1, "one stream loop");
    let (stop, body) = &loops[0];
    let mut views = Vec::new();
    for b in body {
        if let Stmt::ShardByStream {
            input,
            axis,
            chunks,
            ..
        } = &p.stmts[*b]
        {
            if let Some(k) = p.inputs.iter().position(|i| i == input) {
                let local = constant(p, p.tensors[*input].sizes[*axis]);
                views.push((k, *axis, constant(p, *chunks).unwrap(), local.unwrap()));
            }
        }
    }
    (constant(p, *stop).unwrap(), views)
}

fn communications(p: &HostProgram) -> Vec<(String, bool)> {
    let top: Vec<_> = p.top_level.clone();
    p.walk()
        .filter_map(|w| match &p.stmts[w.stmt] {
            Stmt::Communication(c) => Some((format!("{:?}", c.kind), top.contains(&w.stmt))),
            _ => None,
        })
        .collect()
}

/// Whether tensor `name` of the sharded fusion has a Stream loop axis cut from the inside of
/// a DIDx split of the same axis.
fn streams_inside_didx(c: &Checked, name: &str) -> bool {
    let f = c.sharded();
    let t = f.tensor_by_name(name).unwrap();
    let has = |pt: ParallelType| {
        f.tensor(t)
            .loop_domain
            .iter()
            .any(|i| f.id(*i).parallel == pt)
    };
    let s = f
        .tensor(t)
        .loop_domain
        .iter()
        .copied()
        .find(|i| f.id(*i).parallel == ParallelType::Stream);
    has(ParallelType::DIDx)
        && s.is_some_and(|s| {
            streamweave::transform::schedule::streams_inside_device_split(&f, t, s)
        })
}

/// Even chunks, uneven ones, empty ones and more chunks than local elements, as (ranks,
/// parameters): e = 24 experts, so 24 / d local experts in s chunks.
const MOE_CASES: [Case; 5] = [
    (&[1, 2, 3, 4], &[]),
    (&[1, 2, 3, 4], &[("s", 3)]),
    (&[1, 2, 3, 4], &[("s", 5)]),
    (&[2, 4], &[("s", 7), ("c", 3)]),
    (&[2, 3, 4], &[("s", 16)]),
];

/// tests/scenarios/moe_experts_local_streams.weave: each device's experts in stream chunks;
/// one loop of s iterations whose views cut the local expert axis (e / d) into s chunks, no
/// communication, the reference's numbers.
#[test]
fn moe_local_experts_in_stream_chunks_match_the_reference() {
    let source = std::fs::read_to_string(common::fixture("moe_experts_local_streams")).unwrap();
    for (ranks, extra) in MOE_CASES {
        let s = param(extra, "s", 2);
        for c in runs_on_with(&source, ranks, extra, &|_, _| {}) {
            let p = &c.program;
            let d = c.exe.min_ranks() as i64;
            assert!(communications(p).is_empty(), "{extra:?} on {d}");
            let (trips, views) = stream_loop(p);
            assert_eq!(trips, s, "{extra:?} on {d}");
            // x, w1 and w2 are each cut along their local expert axis into s chunks.
            let mut cut: Vec<usize> = views.iter().map(|v| v.0).collect();
            cut.sort();
            assert_eq!(cut, [0, 1, 2], "{extra:?} on {d}: {views:?}");
            for (_, axis, chunks, local) in &views {
                assert_eq!((*axis, *chunks, *local), (0, s, 24 / d), "{extra:?} on {d}");
            }
            for t in ["x", "h1", "a", "y"] {
                assert!(streams_inside_didx(&c, t), "{t}: {extra:?} on {d}");
            }
            assert!(c.checks.iter().all(|k| k.comparison.max_ref > 0.0));
        }
    }
}

/// tests/scenarios/tp_attention_head_streams.weave: each device's heads in stream chunks; one
/// loop of s iterations over the local heads (nh / d) of the four weights, the only
/// collective the Allreduce of the summed heads, at top level after the loop.
#[test]
fn attention_with_each_devices_heads_in_stream_chunks_matches_the_reference() {
    let source = std::fs::read_to_string(common::fixture("tp_attention_head_streams")).unwrap();
    let cases: [Case; 5] = [
        (&[1, 2, 3, 4], &[]),
        (&[1, 2, 3, 4], &[("s", 4)]),
        (&[1, 2, 3, 4], &[("s", 5), ("t", 7)]),
        (&[2, 3], &[("s", 3), ("hd", 3), ("t", 10)]),
        (&[3, 4], &[("s", 6)]),
    ];
    for (ranks, extra) in cases {
        let s = param(extra, "s", 2);
        let hd = param(extra, "hd", 2) as usize;
        let edit = attention_inputs(12 * hd, hd);
        for c in runs_on_with(&source, ranks, extra, &edit) {
            let p = &c.program;
            let d = c.exe.min_ranks() as i64;
            // (One rank posts it too, on a team of one.)
            let expected = vec![("Allreduce".to_string(), true)];
            assert_eq!(communications(p), expected, "{extra:?} on {d}");
            let (trips, views) = stream_loop(p);
            assert_eq!(trips, s, "{extra:?} on {d}");
            // wq, wk, wv and wo (inputs 4 to 7) are cut along their local heads.
            let mut cut: Vec<usize> = views.iter().map(|v| v.0).collect();
            cut.sort();
            assert_eq!(cut, [4, 5, 6, 7], "{extra:?} on {d}: {views:?}");
            for (_, axis, chunks, local) in &views {
                assert_eq!((*axis, *chunks, *local), (0, s, 12 / d), "{extra:?} on {d}");
            }
            for t in ["wq", "q", "scores", "p", "o", "ph"] {
                assert!(streams_inside_didx(&c, t), "{t}: {extra:?} on {d}");
            }
            assert!(c.checks.iter().all(|k| k.comparison.max_ref > 0.0));
        }
    }
}

/// A data-parallel weight gradient over tokens split across devices and each device's tokens
/// in stream chunks: the product accumulates chunk by chunk inside the loop (`+= matmul`)
/// into each device's partial, and one Allreduce after the loop adds the devices' partials.
#[test]
fn a_weight_gradient_over_local_token_chunks_accumulates_then_allreduces() {
    let source = "fusion wgrad(t = 12, h = 3, o = 4, d = 2, s = 2) {
  mesh m = devices(d)
  tensor x: f32[t, h] on m
  tensor dy: f32[t, o] on m
  dw = matmul(permute(x, [1, 0]), dy)
  g = neg(dy)
  output dw, g
  schedule x { outer_split(0, d) -> DIDx; outer_split(1, s) -> Stream }
  schedule dy { outer_split(0, d) -> DIDx; outer_split(1, s) -> Stream }
}
";
    for extra in [&[][..], &[("s", 4)], &[("s", 5)], &[("s", 7)]] {
        for c in runs_on_with(source, &[1, 2, 3, 4], extra, &|_, _| {}) {
            let p = &c.program;
            let d = c.exe.min_ranks() as i64;
            let accumulating = p
                .walk()
                .filter(|w| {
                    matches!(
                        p.stmts[w.stmt],
                        Stmt::Matmul {
                            accumulate: true,
                            ..
                        }
                    )
                })
                .count();
            assert_eq!(accumulating, 1, "{extra:?} on {d}");
            // (One rank posts it too, on a team of one.)
            let expected = vec![("Allreduce".to_string(), true)];
            assert_eq!(communications(p), expected, "{extra:?} on {d}");
        }
    }
}

/// `x` split `[DIDx, Stream]` on axis 0, copied by `y = set(x)` with `y_steps`.
fn copy(y_steps: &str) -> String {
    format!(
        "fusion copy(e = 12, d = 2, s = 2) {{
  mesh m = devices(d)
  tensor x: f32[e, 3] on m
  y = set(x)
  z = neg(y)
  output z
  schedule x {{ outer_split(0, d) -> DIDx; outer_split(1, s) -> Stream }}
  schedule y {{ {y_steps} }}
}}
"
    )
}

/// A copy of such a tensor inside a stream loop (into global chunks, or the other order of
/// splits) is refused at load at the Stream step, with the copy and what to write instead;
/// the fixture tests/scenarios/invalid/stream_inside_did.weave is the first case. The copy
/// written whole runs, and so does a copy that keeps the device split.
#[test]
fn copies_of_local_stream_chunks_inside_a_loop_are_refused_at_load_and_whole_copies_run() {
    let message = |y: &str| {
        format!(
            "schedule of `x`: outer_split(1, s) -> Stream: the Stream split cuts each device's \
             block of axis 0 of `x` (`e`, split across DIDx), and `y = set(x)` changes the \
             device sharding of `x` inside a stream loop: a collective per chunk would pair \
             chunk i of different blocks on different devices, which is not a chunk of the \
             tensor. Copy it whole (no Stream split on `y`, so the copy runs once before or \
             after the loop), or split the stream first and the devices inside each chunk \
             (`outer_split(0, s) -> Stream; outer_split(1, d) -> DIDx`)
 --> case.weave:7:43
  |
7 |   schedule x {{ outer_split(0, d) -> DIDx; outer_split(1, s) -> Stream }}
  |                                           ^{y}"
        )
    };
    for y in [
        "mesh = m; outer_split(0, s) -> Stream",
        "mesh = m; outer_split(0, s) -> Stream; outer_split(1, d) -> DIDx",
    ] {
        let err = streamweave::load("case.weave", &copy(y), &[])
            .expect_err("refused")
            .to_string();
        assert_eq!(err, message(""), "{y}");
    }
    // A replicated input copied into local stream chunks: refused at `y`'s Stream step.
    let scatter = "fusion scatter(e = 12, d = 2, s = 2) {
  mesh m = devices(d)
  tensor x: f32[e, 3] on m
  y = set(x)
  output y
  schedule y { mesh = m; outer_split(0, d) -> DIDx; outer_split(1, s) -> Stream }
}
";
    let fixture = common::fixture("invalid/stream_inside_did");
    let refusals = [
        (
            streamweave::load_file(&fixture, &[]),
            "x",
            "stream_inside_did.weave:15:43",
        ),
        (
            streamweave::load("case.weave", scatter, &[]),
            "y",
            "case.weave:6:53",
        ),
    ];
    for (loaded, t, at) in refusals {
        let err = loaded.expect_err("refused").to_string();
        let start = format!(
            "schedule of `{t}`: outer_split(1, s) -> Stream: the Stream split cuts each device's \
             block of axis 0 of `{t}` (`e`, split across DIDx), and `y = set(x)` changes the \
             device sharding of `{t}` inside a stream loop"
        );
        assert!(err.starts_with(&start) && err.contains(at), "{err}");
    }
    // What the message suggests: the copy whole (an Allgather at top level), or the device
    // split kept (no communication); the neg of `z` reads the copy chunk by chunk or whole.
    for (y, kinds) in [
        ("mesh = m", vec![("Allgather".to_string(), true)]),
        ("mesh = m; outer_split(0, d) -> DIDx", Vec::new()),
    ] {
        for extra in [&[][..], &[("s", 5)]] {
            for c in runs_on_with(&copy(y), &[2, 3, 4], extra, &|_, _| {}) {
                assert_eq!(communications(&c.program), kinds, "{y} {extra:?}");
            }
        }
    }
}
