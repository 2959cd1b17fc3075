//! Tests of signatures: shards, cuts and their errors.
use super::*;

fn leaf(p: ParallelType) -> Box<AxisSplit> {
    Box::new(AxisSplit::Leaf(p))
}

fn outer(factor: usize, o: Box<AxisSplit>, i: Box<AxisSplit>) -> AxisSplit {
    AxisSplit::Split {
        kind: SplitKind::Outer,
        factor,
        outer: o,
        inner: i,
    }
}

/// `chunks` stream chunks, each cut again across two devices (DIDx).
fn stream_chunks_across_devices(chunks: usize) -> AxisSplit {
    outer(
        chunks,
        leaf(ParallelType::Stream),
        Box::new(outer(
            2,
            leaf(ParallelType::DIDx),
            leaf(ParallelType::Serial),
        )),
    )
}

/// `[6, 2]` on two devices: axis 0 cut into 3 stream chunks of 2 rows, each chunk cut
/// again across the devices (the reduce-scattered layout); axis 1 whole.
fn chunked() -> TensorSig {
    TensorSig {
        name: "x".into(),
        dtype: DType::F32,
        shape: vec![6, 2],
        sharding: Sharding {
            mesh: Some(DeviceMesh::arange(2).unwrap()),
            axes: vec![
                stream_chunks_across_devices(3),
                AxisSplit::Leaf(ParallelType::Serial),
            ],
        },
    }
}

#[test]
fn a_device_split_inside_stream_chunks_takes_one_half_of_each_chunk() {
    let t = chunked();
    assert_eq!(t.stream_chunks(), 3);
    // Rows 0..6 in chunks {0,1} {2,3} {4,5}; rank 0 holds the first row of each.
    assert_eq!(t.axis_indices(0)[0], vec![0, 2, 4]);
    assert_eq!(t.axis_indices(1)[0], vec![1, 3, 5]);
    assert_eq!(t.local_sizes(), vec![3, 2]);
    let global: Vec<i32> = (0..12).collect();
    let locals: Vec<Vec<i32>> = (0..2).map(|r| t.shard(&global, r).unwrap()).collect();
    assert_eq!(locals[1], vec![2, 3, 6, 7, 10, 11]);
    assert_eq!(t.unshard(&locals, -1).unwrap(), global);
    assert!(!t.holds(2));
    assert_eq!(
        t.shard(&global[..5], 0).unwrap_err().to_string(),
        "tensor `x` has global sizes [6, 2] (12 elements), but 5 were given"
    );
    assert_eq!(
        t.unshard(&[vec![0; 6], vec![0; 5]], 0)
            .unwrap_err()
            .to_string(),
        "rank 1's buffer of `x` has 5 elements, its shard 6"
    );
}

#[test]
fn a_split_that_does_not_divide_cuts_the_elements_the_axis_has() {
    // 4 rows split across the rows of a 2-D mesh (DIDy), 3 columns cut into stream chunks.
    let t = TensorSig {
        name: "y".into(),
        dtype: DType::F32,
        shape: vec![4, 3],
        sharding: Sharding {
            mesh: Some(DeviceMesh::new(vec![2, 2], vec![0, 1, 2, 3]).unwrap()),
            axes: vec![
                outer(2, leaf(ParallelType::DIDy), leaf(ParallelType::Serial)),
                outer(3, leaf(ParallelType::Stream), leaf(ParallelType::Serial)),
            ],
        },
    };
    // Rank 2 is row 1 of the mesh: global rows 2..4, every column.
    assert_eq!(t.axis_indices(2), vec![vec![2, 3], vec![0, 1, 2]]);
    assert_eq!(t.global_indices(3), vec![6, 7, 8, 9, 10, 11]);
}

#[test]
fn local_sizes_are_counted_without_listing_the_axis() {
    // 2^40 rows in 4294967295 stream chunks, each cut across 2 devices: no list of 2^40
    // indices is ever made.
    let huge = TensorSig {
        name: "h".into(),
        dtype: DType::F32,
        shape: vec![1 << 40, 3],
        sharding: Sharding {
            mesh: Some(DeviceMesh::arange(2).unwrap()),
            axes: vec![
                stream_chunks_across_devices(4_294_967_295),
                AxisSplit::Leaf(ParallelType::Serial),
            ],
        },
    };
    let sizes = huge.local_sizes_of(1);
    assert_eq!(sizes[1], 3);
    // Chunks of 257 rows (the last one short): rank 1 holds 128 of each full chunk.
    let stride = (1usize << 40).div_ceil(4_294_967_295);
    assert_eq!(stride, 257);
    let full = (1usize << 40) / stride;
    let last = (1usize << 40) - full * stride;
    assert_eq!(sizes[0], full * 128 + last.saturating_sub(last.div_ceil(2)));
    // A factor far larger than the axis lists only the chunks that hold elements.
    let sparse = TensorSig {
        shape: vec![5, 2],
        sharding: Sharding {
            mesh: None,
            axes: vec![
                outer(
                    4_294_967_295,
                    leaf(ParallelType::Stream),
                    leaf(ParallelType::Serial),
                ),
                AxisSplit::Leaf(ParallelType::Serial),
            ],
        },
        ..chunked()
    };
    assert_eq!(sparse.axis_indices(0)[0], vec![0, 1, 2, 3, 4]);
    assert_eq!(sparse.local_sizes_of(0), vec![5, 2]);
    // Against the listing, on sizes that fit.
    for rows in [0, 1, 5, 6, 7, 13] {
        let t = TensorSig {
            shape: vec![rows, 2],
            ..chunked()
        };
        for r in 0..2 {
            let listed: Vec<usize> = t.axis_indices(r).iter().map(Vec::len).collect();
            assert_eq!(t.local_sizes_of(r), listed, "rows {rows} rank {r}");
        }
    }
}

#[test]
fn entries_print_one_line_each() {
    let s = Signature {
        params: vec![("t".into(), 6), ("d".into(), 2)],
        roles: vec![(ParamRole::MeshSize, "d".into())],
        devices: vec![0, 1],
        inputs: vec![chunked()],
        outputs: Vec::new(),
        definition: None,
    };
    assert_eq!(
        print_signature(&s),
        "Signature:\n  params(t=6, d=2) devices(0 1) roles(mesh=d)\n  input x: f32[6, 2] on [2](0 1) \
         split(outer(3, Stream, outer(2, DIDx, Serial)), Serial)\n"
    );
}
