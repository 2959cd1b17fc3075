//! The overlap benchmark's patterns ([`Pattern`]): each one's fixture and parameters, its
//! local GEMMs and collectives (measured alone), its host reference, and its compilation.

use clap::ValueEnum;
use streamweave::{Compiler, Executable};
#[cfg(doc)]
use weave_bench::check_sample;
use weave_bench::{linear_reference, times_hashed, CommKind, LINEAR_SEEDS};
use weave_executor::dense::round_to;
use weave_passes::Pipeline;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Pattern {
    /// Matmul + allreduce.
    #[value(name = "row-parallel")]
    RowParallel,
    /// Allgather + matmul.
    #[value(name = "column-parallel")]
    ColumnParallel,
    /// Matmul + reduce-scatter.
    #[value(name = "matmul+rs")]
    MatmulRs,
    /// The P2P-ring allgather + matmul.
    #[value(name = "p2p-ring")]
    P2pRing,
    /// The sequence-parallel MLP block: allgather of x over t, column-parallel linear (w1,
    /// f = 4h), SiLU, row-parallel linear (w2), reduce-scatter back onto t.
    #[value(name = "sp-mlp")]
    SpMlp,
}

impl Pattern {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Pattern::RowParallel => "row-parallel",
            Pattern::ColumnParallel => "column-parallel",
            Pattern::MatmulRs => "matmul+rs",
            Pattern::P2pRing => "p2p-ring",
            Pattern::SpMlp => "sp-mlp",
        }
    }

    pub(crate) fn fixture(self) -> (&'static str, &'static str) {
        match self {
            Pattern::RowParallel => (
                "row_parallel_linear",
                include_str!("../../../../tests/scenarios/row_parallel_linear.weave"),
            ),
            Pattern::ColumnParallel => (
                "column_parallel_chunked",
                include_str!("../../../../tests/scenarios/column_parallel_chunked.weave"),
            ),
            Pattern::MatmulRs => (
                "matmul_rs",
                include_str!("../../../../tests/scenarios/matmul_rs.weave"),
            ),
            Pattern::P2pRing => (
                "column_parallel_p2p",
                include_str!("../../../../tests/scenarios/column_parallel_p2p.weave"),
            ),
            // sequence_parallel_mlp_silu.weave in bf16 (that fixture is f32).
            Pattern::SpMlp => (
                "sequence_parallel_mlp_block",
                include_str!("../../../../tests/scenarios/sequence_parallel_mlp_block.weave"),
            ),
        }
    }

    /// The fixture's parameters at (t, h, d), the chunk count aside.
    pub(crate) fn params(self, t: usize, h: usize, d: usize) -> Vec<(&'static str, i64)> {
        let mut set = vec![("t", t as i64), ("h", h as i64), ("d", d as i64)];
        if self == Pattern::SpMlp {
            set.push(("f", (MLP_EXPANSION * h) as i64));
        }
        set
    }

    /// The seeds of the fixture's inputs, in their order.
    pub(crate) fn seeds(self) -> &'static [u64] {
        match self {
            Pattern::SpMlp => &MLP_SEEDS,
            _ => &LINEAR_SEEDS,
        }
    }

    /// The local GEMMs `[m, k] · [n, k]ᵀ` of one rank, as (m, n, k).
    pub(crate) fn gemms(self, t: usize, h: usize, d: usize) -> Vec<(usize, usize, usize)> {
        match self {
            Pattern::RowParallel | Pattern::MatmulRs => vec![(t, h, 4 * h / d)],
            Pattern::ColumnParallel | Pattern::P2pRing => vec![(t, 4 * h / d, h)],
            Pattern::SpMlp => {
                let f = MLP_EXPANSION * h / d;
                vec![(t, f, h), (t, h, f)]
            }
        }
    }

    /// The collectives alone, each over the whole `[t, h]` activation.
    pub(crate) fn comms(self) -> Vec<CommKind> {
        match self {
            Pattern::RowParallel => vec![CommKind::Allreduce],
            Pattern::ColumnParallel => vec![CommKind::Allgather],
            Pattern::MatmulRs => vec![CommKind::ReduceScatter],
            Pattern::P2pRing => vec![CommKind::Ring],
            Pattern::SpMlp => vec![CommKind::Allgather, CommKind::ReduceScatter],
        }
    }

    /// The host reference of the output rows `rows` at hidden size `h`.
    pub(crate) fn reference(self, rows: &[usize], h: usize) -> Vec<Vec<f64>> {
        let [sx, sw] = LINEAR_SEEDS;
        match self {
            // The global X [t, k] · W [n, k]ᵀ.
            Pattern::RowParallel | Pattern::MatmulRs => linear_reference(rows, 4 * h, h, sx, sw),
            Pattern::ColumnParallel | Pattern::P2pRing => linear_reference(rows, h, 4 * h, sx, sw),
            Pattern::SpMlp => mlp_reference(rows, h, MLP_EXPANSION * h, MLP_SEEDS),
        }
    }

    /// The chunk counts to sweep on `d` ranks.
    pub(crate) fn chunk_counts(self, d: usize) -> Vec<usize> {
        match self {
            Pattern::P2pRing => vec![d],
            _ => vec![1, 2, 4, 8],
        }
    }
}

/// The MLP block's intermediate size f over h.
const MLP_EXPANSION: usize = 4;

/// The seeds of the MLP block's inputs x, w1 and w2 (x and w1 as a linear's).
const MLP_SEEDS: [u64; 3] = [LINEAR_SEEDS[0], LINEAR_SEEDS[1], 303];

/// Rows `rows` of the MLP block's output `silu(x · w1ᵀ) · w2ᵀ` (the reduce-scatter only
/// places rows) for the global x [t, h], w1 [f, h] and w2 [h, f] hashed from `seeds`, in f64
/// but with the bf16 roundings the program makes in between: h1 (the first GEMM's bf16
/// output) and a (the SiLU kernel computes in f32 and stores bf16). The remaining differences
/// (the first GEMM's f32 accumulation, which may round h1 one bf16 step the other way, the
/// second GEMM's, its bf16 partials, the reduce-scatter's bf16 sums) are within the bf16
/// tolerance of [`check_sample`].
fn mlp_reference(rows: &[usize], h: usize, f: usize, seeds: [u64; 3]) -> Vec<Vec<f64>> {
    let bf16 = |v: f64| round_to(weave_ir::DType::BF16, v);
    let a: Vec<Vec<f64>> = linear_reference(rows, h, f, seeds[0], seeds[1])
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|v| {
                    let h1 = bf16(v);
                    bf16(h1 / (1.0 + (-h1).exp()))
                })
                .collect()
        })
        .collect();
    times_hashed(&a, h, seeds[2])
}

/// Loads and compiles the pattern at (t, h, d, s) with `pipeline`.
pub(crate) fn compile(
    p: Pattern,
    t: usize,
    h: usize,
    d: usize,
    s: Option<usize>,
    pipeline: &Pipeline,
) -> Result<Executable, String> {
    let (name, source) = p.fixture();
    let mut set = p.params(t, h, d);
    if let Some(s) = s {
        set.push(("s", s as i64));
    }
    let mut compiler = Compiler::new().pipeline(pipeline.clone());
    for (k, v) in set {
        compiler = compiler.set(k, v);
    }
    compiler
        .compile_source(name, source)
        .map_err(|e| e.to_string())
}
