//! The kernel table (`Executable::kernel_table`), the plans a GPU run's backends launch: an
//! entry for every launch of every rank (an uneven stream split's short chunk, each rank's
//! copy of a kernel whose ops mention `rank`, the strides of chunk slots at the run's pool
//! size), once per segment and layout; the error of a launch it does not hold; and a kernel
//! the code generator cannot plan, reported when the table is made, naming its statement.

mod common;

use std::collections::HashSet;

use weave_executor::cuda::codegen::TensorArg;
use weave_executor::{ExecError, KernelTable, KernelTableError};

/// A launch: its segment and layouts.
type Launch = (String, Vec<TensorArg>, Vec<TensorArg>);

/// Every kernel launch that writes something (an output that is not empty) of the ranks
/// `of` of `ranks` ranks of `exe` with `streams` pool streams, each rank run on its own on
/// the meter backend, as the ranks make them.
fn launches_of(
    exe: &streamweave::Executable,
    ranks: usize,
    streams: usize,
    of: std::ops::Range<usize>,
) -> Vec<Launch> {
    let mut all = Vec::new();
    for rank in of {
        let launches = weave_executor::kernels::meter_rank(exe.program(), rank, ranks, streams)
            .unwrap_or_else(|e| panic!("rank {rank} on the meter: {e}"))
            .launches;
        for l in launches {
            if l.outputs.iter().all(|o| o.sizes.contains(&0)) {
                continue;
            }
            all.push((l.fusion.name.clone(), l.inputs, l.outputs));
        }
    }
    all
}

/// Every such launch of every rank, with 2 pool streams.
fn launches(exe: &streamweave::Executable, ranks: usize) -> Vec<Launch> {
    launches_of(exe, ranks, 2, 0..ranks)
}

/// Checks that `table` holds a plan for every launch of every rank and nothing else, each
/// once; returns the distinct launches.
fn assert_covers(what: &str, table: &KernelTable, launches: &[Launch]) -> usize {
    let mut distinct: HashSet<&Launch> = HashSet::new();
    for l in launches {
        assert!(
            table.get(&l.0, &l.1, &l.2).is_some(),
            "{what}: no plan of `{}` on {:?} -> {:?}",
            l.0,
            l.1,
            l.2
        );
        distinct.insert(l);
    }
    let entries: HashSet<Launch> = table
        .entries()
        .iter()
        .map(|e| (e.segment.clone(), e.inputs.clone(), e.outputs.clone()))
        .collect();
    assert_eq!(entries.len(), table.entries().len(), "{what}: a plan twice");
    assert_eq!(
        entries.len(),
        distinct.len(),
        "{what}: a plan no rank launches"
    );
    distinct.len()
}

fn compile(source: &str, set: &[(&str, i64)]) -> streamweave::Executable {
    let set: Vec<(String, i64)> = set.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let fusion = streamweave::load("t.weave", source, &set).unwrap_or_else(|e| panic!("{e}"));
    streamweave::Compiler::new()
        .compile(&fusion)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The linear + ReLU layer on 10 rows in 3 chunks of 4, 4 and 2 (one rank), and its kernel
/// table for 2 pool streams and 132 SMs.
fn uneven_linear_relu() -> (streamweave::Executable, std::sync::Arc<KernelTable>) {
    let exe = compile(
        &common::linear_relu("t = 10, h = 8, f = 4, s = 3", "f32"),
        &[],
    );
    let table = exe.kernel_table(1, 2, 132).unwrap();
    (exe, table)
}

#[test]
fn an_uneven_stream_split_has_a_plan_for_its_short_chunk() {
    // 10 rows in 3 chunks of 4, 4 and 2: a GEMM chunk overlaps the previous chunk's ReLU, so
    // the loop keeps its chunks and the ReLU runs on two shapes.
    let (exe, table) = uneven_linear_relu();
    assert_eq!(assert_covers("linear_relu", &table, &launches(&exe, 1)), 2);
    let rows: Vec<usize> = table
        .entries()
        .iter()
        .map(|e| e.inputs[0].sizes[0])
        .collect();
    assert_eq!(rows, [4, 2], "{:#?}", table.entries());
    assert_eq!((table.ranks(), table.streams(), table.sms()), (1, 2, 132));
    // Made once per rank count and SM count, and shared.
    assert!(std::sync::Arc::ptr_eq(
        &table,
        &exe.clone().kernel_table(1, 2, 132).unwrap()
    ));
    let other = exe.kernel_table(1, 2, 8).unwrap();
    assert_eq!(other.sms(), 8);
    assert!(!std::sync::Arc::ptr_eq(&table, &other));
    assert_eq!(exe.kernel_table(1, 3, 132).unwrap().streams(), 3);
}

#[test]
fn every_rank_has_the_plans_of_its_own_copy_of_a_kernel_that_mentions_rank() {
    // Uneven stream chunks (7 tokens in 3 chunks of 3, 3 and 1), each rank's lookup of its
    // own block of the vocabulary.
    let src = std::fs::read_to_string(common::fixture("vocab_parallel_embedding")).unwrap();
    for ranks in [2, 4] {
        let exe = compile(&src, &[("d", ranks as i64), ("n", 7), ("s", 3)]);
        let table = exe.kernel_table(ranks, 2, 132).unwrap();
        let planned = assert_covers("vocab_parallel_embedding", &table, &launches(&exe, ranks));
        // Rank 0's launches alone miss the other ranks' copies.
        let rank0: HashSet<Launch> = launches_of(&exe, ranks, 2, 0..1).into_iter().collect();
        assert!(rank0.len() < planned, "{} of {planned}", rank0.len());
        for rank in 0..ranks {
            let suffix = format!("_rank{rank}");
            assert!(
                table.entries().iter().any(|e| e.segment.ends_with(&suffix)),
                "rank {rank} of {ranks}: {:#?}",
                table.entries()
            );
        }
    }
}

#[test]
fn a_table_is_for_one_pool_size_since_chunk_slots_take_their_strides_from_it() {
    // Column chunks of a GEMM's result in slots of a buffer, one slot per pool stream: a
    // chunk's row stride is the slots' columns, so each pool size has its own plans.
    let exe = compile(
        "fusion cols(t = 6, h = 8, f = 12, s = 3) {
  tensor x: f32[t, h]
  tensor w: f32[f, h]
  y = linear(x, w)
  z = relu(y)
  output z
  schedule z { outer_split(1, s) -> Stream }
}
",
        &[],
    );
    let mut inputs = Vec::new();
    for streams in [1, 2, 3] {
        let table = exe.kernel_table(1, streams, 132).unwrap();
        let launches = launches_of(&exe, 1, streams, 0..1);
        assert_covers(&format!("{streams} streams"), &table, &launches);
        inputs.push(table.entries()[0].inputs[0].strides.clone());
    }
    assert_eq!(inputs, [vec![4, 1], vec![8, 1], vec![12, 1]]);
    // A run with another pool than the table's finds no plan.
    let table = exe.kernel_table(1, 2, 132).unwrap();
    let other = &launches_of(&exe, 1, 3, 0..1)[0];
    assert!(table.get(&other.0, &other.1, &other.2).is_none());
}

#[test]
fn every_scenario_has_a_plan_for_every_launch_of_every_rank() {
    let mut planned = 0;
    for path in common::fixtures() {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let fusion = streamweave::load_file(&path, &[]).unwrap_or_else(|e| panic!("{e}"));
        let exe = streamweave::Compiler::new()
            .compile(&fusion)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let ranks = exe.min_ranks();
        let table = exe
            .kernel_table(ranks, 2, 132)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        planned += assert_covers(&name, &table, &launches(&exe, ranks));
    }
    assert!(planned > 20, "{planned} plans in all");
}

#[test]
fn a_launch_the_table_does_not_hold_is_an_error_naming_the_statement_and_the_layouts() {
    let (_, table) = uneven_linear_relu();
    let entry = &table.entries()[0];
    let arg = |sizes: &[usize], strides: &[usize]| TensorArg {
        dtype: weave_ir::DType::F32,
        sizes: sizes.to_vec(),
        strides: strides.to_vec(),
    };
    let label = entry.statement.as_str();
    // Its own layouts: found.
    assert_eq!(
        table
            .plan_for(label, &entry.segment, &entry.inputs, &entry.outputs)
            .unwrap(),
        0
    );
    // Other layouts of the segment.
    let err = table
        .plan_for(
            label,
            &entry.segment,
            &[arg(&[3, 4], &[4, 1])],
            &[arg(&[3, 4], &[4, 1])],
        )
        .unwrap_err();
    assert_eq!(
        err,
        ExecError::Compute {
            stmt: label.to_string(),
            message: format!(
                "no kernel plan for these layouts: segment `{}`, inputs (f32[3, 4] strides [4, \
                 1]), outputs (f32[3, 4] strides [4, 1]); the kernel table holds 2 plan(s) of \
                 this segment on other layouts (for 1 rank(s) and 2 pool stream(s))",
                entry.segment
            ),
        }
    );
    assert_eq!(
        err.to_string(),
        format!(
            "`{label}` failed: no kernel plan for these layouts: segment `{}`, inputs (f32[3, 4] \
             strides [4, 1]), outputs (f32[3, 4] strides [4, 1]); the kernel table holds 2 \
             plan(s) of this segment on other layouts (for 1 rank(s) and 2 pool stream(s))",
            entry.segment
        )
    );
    // Another segment; and a backend given no table (an empty one).
    let err = table
        .plan_for("X", "nope", &entry.inputs, &entry.outputs)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "`X` failed: no kernel plan for these layouts: segment `nope`, inputs (f32[4, 4] strides \
         [4, 1]), outputs (f32[4, 4] strides [4, 1]); the kernel table holds no plan of this \
         segment (2 plans of others, for 1 rank(s) and 2 pool stream(s))"
    );
    let err = KernelTable::new(0, 0, 1)
        .plan_for("X", "nope", &[], &[arg(&[2], &[1])])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "`X` failed: no kernel plan for these layouts: segment `nope`, inputs (), outputs \
         (f32[2] strides [1]); the backend's kernel table is empty (plan the program's kernels \
         before it runs: `Executable::kernel_table`)"
    );
}

/// A printed host program whose kernel the code generator cannot plan: a GEMM inside the
/// kernel segment (written by hand; the segmenter gives GEMMs statements of their own).
fn gemm_in_a_kernel() -> String {
    let exe = compile(
        "fusion two(n = 4) {
  tensor a: f32[n, n]
  tensor b: f32[n, n]
  c = add(a, b)
  output c
}
",
        &[],
    );
    let text = streamweave::host_ir::print(exe.program());
    assert_eq!(text.matches("c = add(a, b)").count(), 2, "{text}");
    text.replace("c = add(a, b)", "c = matmul(a, b)")
}

#[test]
fn a_kernel_the_generator_cannot_plan_is_reported_when_the_table_is_made() {
    let text = gemm_in_a_kernel();
    let exe = streamweave::Executable::from_text("gemm.hir", &text).unwrap();
    let err = exe.kernel_table(1, 2, 132).unwrap_err();
    let statement = "LaunchKernel(kernel=K0, inputs=(T0, T1), outputs=(T2))";
    assert!(
        matches!(&err, KernelTableError::Plan { statement: s, .. } if s == statement),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "`{statement}`: matmul `c`: a GEMM inside a kernel segment is not supported by \
             the code generator (GEMMs run as their own host statements)"
        )
    );
    // The CPU backend interprets the kernel: the program itself runs.
    let globals = exe.random_inputs(1).unwrap();
    let report = exe
        .run_dense(
            &globals,
            &streamweave::RunOptions::on(streamweave::Target::Cpu { ranks: 1 }),
        )
        .unwrap();
    assert!(report.passed(), "{:?}", report.checks);
}

/// The table also lists each rank's distinct sum reduce-scatters and allreduces by their
/// sizes (what a copy-engine transport loads the reduction kernels of before a run): one per
/// distinct chunk shape, in the order the rank first posts them; none for a rank the table
/// was not made for.
#[test]
fn the_table_lists_each_ranks_distinct_sum_reductions_by_size() {
    use weave_comm::{DataType, ReductionShape};
    let reduction = |allreduce, input_len, output_len| ReductionShape {
        team: 2,
        allreduce,
        dtype: DataType::Bf16,
        input_len,
        output_len,
        row: 8,
    };
    let rs = std::fs::read_to_string(common::fixture("matmul_rs")).unwrap();
    // 24 rows in 3 chunks of 8: each chunk's [8, 8] partial sums scattered into [4, 8].
    let exe = compile(&rs, &[("t", 24), ("h", 8), ("d", 2), ("s", 3)]);
    let table = exe.kernel_table(2, 2, 132).unwrap();
    for rank in 0..2 {
        assert_eq!(table.reductions(rank), &[reduction(false, 64, 32)]);
    }
    assert!(table.reductions(2).is_empty());
    // 10 rows in chunks of 4, 4 and 2, each chunk's [rows, 8] summed on every rank.
    let ar = std::fs::read_to_string(common::fixture("row_parallel_linear")).unwrap();
    let exe = compile(&ar, &[("t", 10), ("h", 8), ("d", 2), ("s", 3)]);
    let table = exe.kernel_table(2, 2, 132).unwrap();
    assert_eq!(
        table.reductions(1),
        &[reduction(true, 32, 32), reduction(true, 16, 16)]
    );
}

/// The table also holds each rank's peak of live buffer bytes (what a GPU run reserves in its
/// memory pool before the first statement): at least the rank's inputs and outputs, which
/// are live together when its program ends, and as much as the meter counts; 0 for a rank
/// the table was not made for.
#[test]
fn the_table_holds_each_ranks_peak_of_live_bytes() {
    let rs = std::fs::read_to_string(common::fixture("matmul_rs")).unwrap();
    // 24 rows in 3 chunks of 8, bf16 on 2 ranks.
    let exe = compile(&rs, &[("t", 24), ("h", 8), ("d", 2), ("s", 3)]);
    let table = exe.kernel_table(2, 2, 132).unwrap();
    let bytes = |sigs: &[weave_host_ir::TensorSig], rank: usize| -> u64 {
        sigs.iter()
            .map(|t| {
                let n: usize = t.local_sizes_of(rank).iter().product();
                (n * t.dtype.size_bytes()) as u64
            })
            .sum()
    };
    for rank in 0..2 {
        let ends_with = bytes(exe.inputs(), rank) + bytes(exe.outputs(), rank);
        let peak = table.peak_bytes(rank);
        assert!(
            peak >= ends_with,
            "rank {rank}: a peak of {peak} bytes is below its inputs and outputs ({ends_with})"
        );
        let metered = weave_executor::kernels::meter_rank(exe.program(), rank, 2, 2)
            .unwrap()
            .peak_bytes;
        assert_eq!(peak, metered, "rank {rank}");
    }
    assert_eq!(table.peak_bytes(2), 0);
}

/// The table also lists each rank's distinct GEMMs (what a GPU run launches once before its
/// first statement): every GEMM shape, layout and stream the rank issues, each once.
#[test]
fn the_table_lists_each_ranks_distinct_gemms() {
    // 10 rows in 3 chunks of 4, 4 and 2 on one rank: the chunks' linears are two distinct
    // GEMMs (4 rows and 2 rows of the same [10, h] input), on the pool streams they run on.
    let (exe, table) = uneven_linear_relu();
    let gemms = table.gemms(0);
    let rows: Vec<(Vec<std::ops::Range<usize>>, bool)> = gemms
        .iter()
        .map(|g| (g.a.ranges.clone(), g.linear))
        .collect();
    let metered = weave_executor::kernels::meter_rank(exe.program(), 0, 1, 2).unwrap();
    assert!(
        metered.gemms >= 3,
        "three chunks, three GEMMs: {}",
        metered.gemms
    );
    assert_eq!(gemms, metered.distinct_gemms.as_slice());
    let distinct: HashSet<_> = gemms.iter().collect();
    assert_eq!(distinct.len(), gemms.len(), "listed once each: {gemms:#?}");
    // Every chunk's rows appear, as a box of the whole [10, 8] input.
    for g in gemms {
        assert_eq!(g.a.full, vec![10, 8], "{g:#?}");
        assert!(g.linear, "{g:#?}");
    }
    let starts: HashSet<usize> = rows.iter().map(|(r, _)| r[0].start).collect();
    assert!(starts.contains(&0) && starts.contains(&8), "{rows:?}");
    assert!(table.gemms(1).is_empty());
}

/// A linear that only feeds a sum reduce-scatter is listed twice: whole (a run on NCCL
/// computes it so) and by its blocks of rows, marked for the windows (a copy-engine run
/// computes each block, in slot-sized pieces, straight into the peers' windows), so that a
/// run warms either way's GEMMs.
#[test]
fn a_linear_feeding_a_sum_is_listed_whole_and_by_its_blocks_for_the_windows() {
    let mlp = std::fs::read_to_string(common::fixture("sequence_parallel_mlp_block")).unwrap();
    // t = 24 rows in one chunk, reduce-scattered over d = 2: blocks of 12 rows.
    let exe = compile(&mlp, &[("t", 24), ("h", 8), ("f", 24), ("d", 2), ("s", 1)]);
    let table = exe.kernel_table(2, 2, 132).unwrap();
    for rank in 0..2 {
        let gemms = table.gemms(rank);
        let windows: Vec<_> = gemms.iter().filter(|g| g.into_windows).collect();
        assert!(!windows.is_empty(), "rank {rank}: {gemms:#?}");
        for g in &windows {
            assert!(g.linear);
            assert_eq!(g.a.ranges[0].len(), 12, "rank {rank}: {g:#?}");
            assert_eq!(g.out.full, vec![12, 8], "rank {rank}: {g:#?}");
        }
        // The whole second linear: 24 rows of the SiLU's output, f / d = 12 wide.
        assert!(
            gemms
                .iter()
                .any(|g| !g.into_windows && g.out.full[0] == 24 && g.a.full[1] == 12),
            "rank {rank}: {gemms:#?}"
        );
        // A run with window slots of 80 bytes (5 rows of 8 bf16) computes each block of 12
        // rows as pieces of 5, 5 and 2 rows: GEMMs of 5 and of 2 rows, from the block's start.
        for g in &windows {
            let pieces = g.window_pieces(80);
            let rows: Vec<std::ops::Range<usize>> =
                pieces.iter().map(|p| p.a.ranges[0].clone()).collect();
            let start = g.a.ranges[0].start;
            assert_eq!(rows, [start..start + 5, start..start + 2], "{g:#?}");
            for p in &pieces {
                let r = p.a.ranges[0].len();
                assert_eq!(
                    (p.out.full.clone(), p.out.ranges.clone()),
                    (vec![r, 8], vec![0..r, 0..8])
                );
                assert_eq!((&p.b, &p.bias, p.stream), (&g.b, &g.bias, g.stream));
            }
            // A slot that holds the block takes it whole; one that holds no row, nothing.
            assert_eq!(g.window_pieces(12 * 16).len(), 1);
            assert_eq!(g.window_pieces(12 * 16)[0].a.ranges[0].len(), 12);
            assert!(g.window_pieces(15).is_empty());
            assert!(g.window_pieces(0).is_empty());
        }
        // Counted once: the blocks are not GEMMs of their own.
        let metered = weave_executor::kernels::meter_rank(exe.program(), rank, 2, 2).unwrap();
        assert_eq!(metered.gemms, 2, "two linears");
    }
}
