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
