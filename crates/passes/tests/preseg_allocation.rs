//! `finalize-multidevice-domains` (reference §6.1, seed 002, §10 #23): allocation rules,
//! meshes everywhere, parallel loop axes first; and the whole pipeline on every fixture.

mod preseg_util;

use preseg_util::*;
use weave_ir::ParallelType::{DIDx, Serial, Stream};
use weave_ir::{Fusion, IterType};
use weave_passes::finalize_multidevice_domains::should_allocate_per_stream;

fn alloc_is_logical(f: &Fusion, name: &str) -> bool {
    let tv = f.tensor(t(f, name));
    tv.allocation_domain() == tv.logical.as_slice()
}

fn alloc_is_loop(f: &Fusion, name: &str) -> bool {
    let tv = f.tensor(t(f, name));
    tv.allocation_domain() == tv.loop_domain.as_slice()
}

#[test]
fn sharded_allocation() {
    // StreamTest.ShardedAllocation: every tensor gets Stream on axis 0; the intermediate tv1
    // is allocated per chunk (allocation == loop), fusion I/O keep allocation == logical.
    let mut f = load("sharded_allocation");
    preseg(&mut f);
    for name in ["tv0", "tv1", "tv2", "tv3"] {
        assert_eq!(loop_types(&f, name)[0], Stream, "{name}");
    }
    assert!(alloc_is_loop(&f, "tv1"));
    assert!(!alloc_is_logical(&f, "tv1"));
    assert!(should_allocate_per_stream(&f, t(&f, "tv1")));
    for name in ["tv0", "tv2", "tv3"] {
        assert!(alloc_is_logical(&f, name), "{name}");
        assert!(!should_allocate_per_stream(&f, t(&f, name)), "{name}");
    }
}

#[test]
fn replicated_allocation() {
    // StreamTest.ReplicatedAllocation: tv2 is stream-split on another axis, so tv1 is
    // stream-parallel in loop but fully allocated; tv2's stream axis moves to the front.
    let mut f = load("replicated_allocation");
    preseg(&mut f);
    for name in ["tv0", "tv1", "tv2", "tv3"] {
        assert_eq!(loop_types(&f, name)[0], Stream, "{name}");
        assert!(alloc_is_logical(&f, name), "{name}");
    }
    assert!(!should_allocate_per_stream(&f, t(&f, "tv1")));
    assert_eq!(loop_types(&f, "tv2"), vec![Stream, Serial, Serial, Serial]);
}

#[test]
fn device_splits_always_reach_the_allocation() {
    let mut f = load("row_parallel_linear");
    preseg(&mut f);
    // inp: [t, 4h] with the DIDx split of 4h in allocation, the stream split not (an input).
    let inp = f.tensor(t(&f, "inp"));
    assert_eq!(
        shape(&f, inp.allocation_domain()),
        vec![(Serial, 8192), (DIDx, 2), (Serial, 16384)]
    );
    assert_eq!(
        loop_types(&f, "inp"),
        vec![Stream, DIDx, Serial, Serial],
        "parallel loop axes first"
    );
    // The partial is an intermediate consumed in the same stream loop: allocated per chunk,
    // with its device axis.
    let p = f.tensor(t(&f, "out_partial"));
    assert_eq!(shape(&f, p.allocation_domain()), ROW_PARALLEL_OUT_LOOP);
    // The output is replicated: its allocation is its logical domain (with the rDIDx axis).
    assert!(alloc_is_logical(&f, "out"));
    let last = *f.tensor(t(&f, "out")).logical.last().expect("axes");
    assert_eq!(f.id(last).iter_type, IterType::Reduction);
    assert_eq!(f.id(last).parallel, DIDx);
}

#[test]
fn a_device_split_below_an_unallocated_stream_split_is_replayed_serially() {
    // matmul_rs: out = [Stream(s), DIDx(d), t/(s*d), h]; out is a fusion output, so its
    // allocation gets a serial copy of the stream split: [s, DIDx(d), t/(s*d), h, rDIDx].
    let mut f = load("matmul_rs");
    preseg(&mut f);
    let out = f.tensor(t(&f, "out"));
    assert_eq!(
        shape(&f, out.allocation_domain()),
        vec![
            (Serial, 4),
            (DIDx, 2),
            (Serial, 1024),
            (Serial, 8192),
            (DIDx, 2)
        ]
    );
    assert_ne!(out.allocation_domain()[1], out.loop_domain[1]);
}

#[test]
fn the_ag_buffer_of_column_parallel_linear_is_allocated_per_chunk() {
    let mut f = load("column_parallel_linear");
    preseg(&mut f);
    assert!(alloc_is_loop(&f, "ag"));
    assert!(should_allocate_per_stream(&f, t(&f, "ag")));
    assert!(!should_allocate_per_stream(&f, t(&f, "out")));
    let out = f.tensor(t(&f, "out"));
    assert_eq!(
        shape(&f, out.allocation_domain()),
        vec![(Serial, 8192), (DIDx, 2), (Serial, 16384), (Serial, 8192)]
    );
}

#[test]
fn every_tensor_gets_a_mesh_when_one_has_one() {
    let mut f = load_src(
        "fusion meshes(n = 4) {
          mesh m = devices(2)
          tensor a: f32[n]
          tensor b: f32[n] on m
          c = add(a, b)
          e = neg(a)
          output c, e
        }",
    );
    preseg(&mut f);
    let m = f.mesh_by_name("m");
    for name in ["a", "b", "c", "e"] {
        assert_eq!(f.tensor(t(&f, name)).mesh, m, "{name}");
    }
    // Without any mesh, none is invented.
    let mut f = load("sharded_allocation");
    preseg(&mut f);
    assert!(f
        .tensors_in_order()
        .iter()
        .all(|x| f.tensor(*x).mesh.is_none()));
}

#[test]
fn the_pipeline_runs_on_every_fixture() {
    let dir = format!("{}/../../tests/scenarios", env!("CARGO_MANIFEST_DIR"));
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("scenario dir")
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "weave").then(|| p.file_stem()?.to_str().map(String::from))?
        })
        .collect();
    names.sort();
    assert!(names.len() > 40);
    for name in names {
        let mut f = load(&name);
        preseg(&mut f);
    }
}
