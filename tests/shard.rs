//! The sharding helpers against the lowered programs: for every scenario, each rank's buffer
//! of every input and output has the sizes the host program declares, and cutting a global
//! tensor into per-rank buffers and putting them back together is the identity.

mod common;

use common::fixtures;

use streamweave::executor::Dense;
use streamweave::host_ir::HostProgram;
use streamweave::run::{compile_for_run, params_of};
use streamweave::shard::Layout;

fn declared_sizes(
    p: &HostProgram,
    t: streamweave::host_ir::HostTensorId,
    params: &std::collections::HashMap<String, i64>,
) -> Vec<usize> {
    p.tensors[t]
        .sizes
        .iter()
        .map(|&s| match &p.scalars[s] {
            streamweave::host_ir::HostScalar::Value(v) => {
                v.eval(&|n| params.get(n).copied()).unwrap() as usize
            }
            other => panic!("an input size is {other:?}"),
        })
        .collect()
}

#[test]
fn per_rank_buffers_match_the_host_signature_and_round_trip() {
    let mut checked = 0;
    for path in fixtures() {
        let fusion = streamweave::load_file(&path, &[]).unwrap();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if fusion.params().iter().any(|p| p.value.unwrap_or(0) > 1000) {
            continue; // benchmark sizes; the same layouts are covered at small sizes below
        }
        let c = compile_for_run(fusion).unwrap();
        let params = params_of(&c.sharded);
        let ranks = c
            .fusion
            .meshes()
            .iter()
            .flat_map(|&m| c.fusion.mesh(m).mesh.devices().to_vec())
            .max()
            .map_or(1, |d| d as usize + 1);
        let pairs = c
            .sharded
            .inputs()
            .iter()
            .zip(&c.program.inputs)
            .chain(c.sharded.outputs().iter().zip(&c.program.outputs));
        for (&t, &h) in pairs {
            let layout = Layout::of(&c.sharded, t).unwrap();
            let want = declared_sizes(&c.program, h, &params);
            let got = layout.local_sizes();
            assert_eq!(
                got.iter().product::<usize>(),
                want.iter().product::<usize>(),
                "{name}: `{}` local sizes {got:?}, host program {want:?}",
                c.sharded.tensor(t).name
            );
            let global =
                Dense::random(c.sharded.tensor(t).dtype, layout.global_sizes().to_vec(), 9);
            let locals: Vec<Dense> = (0..ranks)
                .map(|r| layout.shard(&global, r).unwrap())
                .collect();
            let back = layout.unshard(&locals).unwrap();
            assert_eq!(
                back.data,
                global.data,
                "{name}: `{}`",
                c.sharded.tensor(t).name
            );
            checked += 1;
        }
    }
    assert!(checked > 60, "{checked}");
}

#[test]
fn a_did_split_inside_stream_chunks_interleaves_by_chunk() {
    // matmul_rs: out [t, h] is cut into 4 stream chunks, and each chunk across 2 devices;
    // rank 1 holds the second half of every chunk, chunk by chunk.
    let path = common::fixture("matmul_rs");
    let set = |k: &str, v: i64| (k.to_string(), v);
    let fusion = streamweave::load_file(&path, &[set("t", 16), set("h", 1)]).unwrap();
    let c = compile_for_run(fusion).unwrap();
    let out = c.sharded.outputs()[0];
    let layout = Layout::of(&c.sharded, out).unwrap();
    assert_eq!(layout.local_sizes(), vec![8, 1]);
    let rows: Vec<usize> = layout
        .global_indices(1)
        .into_iter()
        .map(|i| i.unwrap())
        .collect();
    assert_eq!(rows, vec![2, 3, 6, 7, 10, 11, 14, 15]);
}

fn layout_of(name: &str, set: &[(&str, i64)], output: bool) -> Layout {
    let set: Vec<(String, i64)> = set.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let fusion = streamweave::load_file(&common::fixture(name), &set).unwrap();
    let c = compile_for_run(fusion).unwrap();
    let t = if output {
        c.sharded.outputs()[0]
    } else {
        c.sharded.inputs()[0]
    };
    Layout::of(&c.sharded, t).unwrap()
}

fn rows(layout: &Layout, rank: usize) -> Vec<usize> {
    layout.axis_indices(rank)[0].clone()
}

#[test]
fn a_stream_split_that_does_not_divide_keeps_the_whole_axis() {
    // 12 rows in 5 chunks of 3 (the last one empty), and in 13 chunks of 1: the buffers of
    // the input and the output are the whole axis, in order, with no padding.
    for s in [5, 13] {
        for output in [false, true] {
            let l = layout_of("single_set_op", &[("s", s)], output);
            assert_eq!(l.local_sizes(), vec![12, 8], "s = {s}");
            assert_eq!(rows(&l, 0), (0..12).collect::<Vec<_>>());
        }
    }
}

#[test]
fn a_did_split_inside_uneven_stream_chunks_cuts_each_chunk_as_it_is() {
    // 14 rows in 4 chunks of 4, 4, 4 and 2, each chunk split across 2 devices: rank 1 holds
    // the second half of every chunk, one row of the short last chunk.
    let l = layout_of("matmul_rs", &[("t", 14), ("h", 1), ("s", 4)], true);
    assert_eq!(l.local_sizes(), vec![7, 1]);
    assert_eq!(rows(&l, 0), vec![0, 1, 4, 5, 8, 9, 12]);
    assert_eq!(rows(&l, 1), vec![2, 3, 6, 7, 10, 11, 13]);
    // 16 rows in 5 chunks of 4 (the last one empty).
    let l = layout_of("matmul_rs", &[("t", 16), ("h", 1), ("s", 5)], true);
    assert_eq!(rows(&l, 1), vec![2, 3, 6, 7, 10, 11, 14, 15]);
}

#[test]
fn a_did_split_inside_a_short_last_chunk_that_it_does_not_divide_is_refused_at_load() {
    // 13 rows in 4 chunks of 4, 4, 4 and 1: the last chunk cannot be split across 2 devices.
    let set = |k: &str, v: i64| (k.to_string(), v);
    let path = common::fixture("matmul_rs");
    let e = streamweave::load_file(&path, &[set("t", 13), set("h", 1), set("s", 4)]).unwrap_err();
    assert_eq!(
        e.diagnostic.message,
        "schedule of `out`: axis 1 (`ceilDiv(t, 4)` = 4) is a chunk of an axis of extent 13 \
         (`t`) whose last chunk is shorter; a DIDx split of every chunk needs 13 divisible by 2 \
         devices too"
    );
    assert!(
        e.to_string()
            .contains(&format!("--> {}:26:84", path.display())),
        "{e}"
    );
}
