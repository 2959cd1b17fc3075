//! Which linears a collective computes with `--gemm-into-windows`: the host programs of the
//! GEMM + reduce-scatter, GEMM + allreduce and sequence-parallel MLP patterns hand exactly
//! the linear that feeds a sum collective (and nothing else reads) to that collective.

use streamweave::{Chunks, Compiler};
use weave_host_ir::{CommunicationType, Stmt};

fn program(name: &str, set: &[(&str, i64)]) -> weave_host_ir::HostProgram {
    let path = format!(
        "{}/tests/scenarios/{name}.weave",
        env!("CARGO_MANIFEST_DIR")
    );
    let set: Vec<(String, i64)> = set.iter().map(|&(k, v)| (k.to_string(), v)).collect();
    let fusion = streamweave::load_file(std::path::Path::new(&path), &set).expect("loads");
    Compiler::new()
        .chunks(Chunks::AsWritten)
        .compile(&fusion)
        .expect("compiles")
        .program()
        .clone()
}

/// A fixture, its parameters and the collective its handed-over linear feeds.
type Case = (
    &'static str,
    &'static [(&'static str, i64)],
    CommunicationType,
);

/// Each chunk's linear of the GEMM + reduce-scatter, the GEMM + allreduce and the MLP
/// block's second linear go to their collective (one linear per program: it sits in the
/// stream loop's body); the column-parallel GEMM (its output is the program's) and the MLP
/// block's first linear (a kernel reads it) never do.
#[test]
fn linears_feeding_a_sum_collective_alone_are_handed_to_it() {
    let cases: [Case; 4] = [
        (
            "matmul_rs",
            &[("d", 4), ("s", 2), ("t", 64), ("h", 8)],
            CommunicationType::ReduceScatter,
        ),
        (
            "row_parallel_linear",
            &[("d", 2), ("s", 3), ("t", 12), ("h", 4)],
            CommunicationType::Allreduce,
        ),
        (
            "row_parallel_linear",
            &[("d", 3), ("s", 1), ("t", 6), ("h", 6)],
            CommunicationType::Allreduce,
        ),
        (
            "sequence_parallel_mlp_block",
            &[("d", 2), ("s", 2)],
            CommunicationType::ReduceScatter,
        ),
    ];
    for (name, set, kind) in cases {
        let p = program(name, set);
        let found = weave_executor::producers(&p);
        assert_eq!(found.len(), 1, "{name} {set:?}");
        for (linear, comm) in &found {
            let Stmt::Linear { out, .. } = &p.stmts[linear] else {
                panic!("{name}: a producer that is not a linear")
            };
            let Stmt::Communication(c) = &p.stmts[*comm] else {
                panic!("{name}: not a communication")
            };
            assert_eq!((c.kind, c.input), (kind, *out), "{name}");
        }
    }
    for (name, set) in [
        (
            "column_parallel_chunked",
            &[("d", 2), ("s", 2), ("t", 16), ("h", 4)][..],
        ),
        ("column_parallel_linear", &[("d", 2)][..]),
    ] {
        assert!(
            weave_executor::producers(&program(name, set)).is_empty(),
            "{name}"
        );
    }
}
