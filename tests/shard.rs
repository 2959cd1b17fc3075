//! The sharding helpers against the lowered programs: for every scenario, each rank's buffer
//! of every input and output has the sizes the host program declares, and cutting a global
//! tensor into per-rank buffers and putting them back together is the identity.

mod common;

use common::fixtures;

use streamweave::executor::Dense;
use streamweave::host_ir::TensorSig;
use streamweave::Compiler;

fn compile(path: &std::path::Path, set: &[(&str, i64)]) -> streamweave::Executable {
    let mut c = Compiler::new();
    for (k, v) in set {
        c = c.set(k, *v);
    }
    let source = std::fs::read_to_string(path).unwrap();
    c.compile_source(&path.display().to_string(), &source)
        .unwrap()
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
        // The verifier holds every signature entry's per-rank buffer to the program's sizes
        // of that tensor (`weave_host_ir::verify`); `from_program` verifies.
        let exe = compile(&path, &[]);
        let ranks = exe.min_ranks();
        for t in exe.inputs().iter().chain(exe.outputs()) {
            let global = Dense::random(t.dtype, t.shape.clone(), 9);
            let locals: Vec<Vec<f64>> = (0..ranks)
                .map(|r| t.shard(&global.data, r).unwrap())
                .collect();
            for (r, l) in locals.iter().enumerate() {
                if t.holds(r) {
                    assert_eq!(l.len(), t.local_sizes_of(r).iter().product::<usize>());
                }
            }
            let back = t.unshard(&locals, f64::NAN).unwrap();
            assert_eq!(back, global.data, "{name}: `{}`", t.name);
            checked += 1;
        }
    }
    assert!(checked > 60, "{checked}");
}

#[test]
fn a_did_split_inside_stream_chunks_interleaves_by_chunk() {
    // matmul_rs: out [t, h] is cut into 4 stream chunks, and each chunk across 2 devices;
    // rank 1 holds the second half of every chunk, chunk by chunk.
    let out = layout_of("matmul_rs", &[("t", 16), ("h", 1)], true);
    assert_eq!(out.local_sizes(), vec![8, 1]);
    assert_eq!(out.global_indices(1), vec![2, 3, 6, 7, 10, 11, 14, 15]);
}

fn layout_of(name: &str, set: &[(&str, i64)], output: bool) -> TensorSig {
    let exe = compile(&common::fixture(name), set);
    if output {
        exe.outputs()[0].clone()
    } else {
        exe.inputs()[0].clone()
    }
}

fn rows(layout: &TensorSig, rank: usize) -> Vec<usize> {
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
