//! `index_select` (issue 28): an embedding lookup by `i64` ids, run on the CPU backend on 1, 2
//! and 4 ranks against the f64 reference, whole and in its vocabulary-parallel form (the
//! table's rows on DIDx: each device looks up the ids in its block, the others give zero
//! rows, and an Allreduce adds the partial rows); ids outside the table are an error naming
//! the ids, the position and the value; the schedules it cannot lower are refused at load.

mod common;

use common::communication_kinds;

fn load(source: &str, overrides: &[(&str, i64)]) -> weave_ir::Fusion {
    let o: Vec<(String, i64)> = overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    streamweave::load("case.weave", source, &o).unwrap_or_else(|e| panic!("{e}"))
}

/// A lookup of `n` tokens in a `[v, h]` table of dtype `dt`, its rows split as `rows` says
/// (a schedule step list for `table`, or none), the tokens in `s` stream chunks, and a
/// lookup along axis 1 (columns) beside it.
fn lookup(dt: &str, table_schedule: &str) -> String {
    format!(
        "fusion lookup(n = 8, v = 24, h = 6, k = 5, d = 2, s = 2) {{
  mesh m = devices(d)
  tensor ids: i64[n] on m
  tensor cols: i64[k] on m
  tensor table: {dt}[v, h] on m
  e = index_select(table, ids, 0)
  y = e * 2
  c = index_select(table, cols, 1)
  output y, c
  {table_schedule}
  schedule y {{ mesh = m; outer_split(0, s) -> Stream }}
}}
"
    )
}

const VOCAB: &str = "schedule table { outer_split(0, d) -> DIDx }";
const HIDDEN: &str = "schedule table { outer_split(1, d) -> DIDx }";

#[test]
fn a_vocabulary_parallel_lookup_matches_the_reference_on_one_two_and_four_ranks() {
    // Even and uneven: 8 tokens in 2 chunks, 7 in 3 (3, 3, 1), 5 in 4 (2, 2, 1, 0), and an
    // odd hidden size; every float dtype.
    let shapes: [&[(&str, i64)]; 3] = [
        &[],
        &[("n", 7), ("s", 3), ("h", 5)],
        &[("n", 5), ("s", 4), ("v", 48)],
    ];
    for dt in ["f32", "bf16", "f16", "f64"] {
        let src = lookup(dt, VOCAB);
        for extra in shapes {
            for d in [1i64, 2, 4] {
                let mut o = extra.to_vec();
                o.push(("d", d));
                let c = common::run_checked(load(&src, &o), d as usize, 2, 5)
                    .unwrap_or_else(|f| panic!("{dt} {o:?}: {}: {}", f.stage, f.detail));
                for out in ["y", "c"] {
                    assert!(
                        c.checks.iter().any(|k| k.output == out),
                        "{out} not checked"
                    );
                }
                assert!(c
                    .checks
                    .iter()
                    .all(|k| k.comparison.ok && k.comparison.max_ref > 0.0));
                // The rows split across devices: the lookup's partial rows are added by an
                // Allreduce; the column lookup needs the whole rows first (an Allgather).
                let kinds = communication_kinds(&c.program);
                if d > 1 {
                    assert!(kinds.contains(&"Allreduce".to_string()), "{o:?}: {kinds:?}");
                } else {
                    assert!(kinds.iter().all(|k| k == "Allreduce" || k == "Allgather"));
                }
            }
        }
    }
}

#[test]
fn a_lookup_with_the_hidden_axis_on_devices_needs_no_communication() {
    // The tokens in stream chunks and the hidden axis on DIDx, from the table to `y`.
    let src = lookup("f32", HIDDEN)
        .replace(
            "  c = index_select(table, cols, 1)\n  output y, c",
            "  output y",
        )
        .replace(
            "schedule y { mesh = m; outer_split(0, s) -> Stream }",
            "schedule y { mesh = m; outer_split(1, d) -> DIDx; outer_split(0, s) -> Stream }",
        );
    for (d, extra) in [(1i64, ("n", 8)), (2, ("n", 7)), (4, ("n", 9))] {
        // The hidden axis splits across 1, 2 and 4 devices: h = 8.
        let f = load(&src, &[("d", d), ("h", 8), extra]);
        let c = common::run_checked(f, d as usize, 2, 3)
            .unwrap_or_else(|f| panic!("{d} ranks: {}: {}", f.stage, f.detail));
        assert!(c.checks.iter().all(|k| k.comparison.ok));
        assert!(communication_kinds(&c.program).is_empty(), "{d} ranks");
    }
}

/// The ids of [`known_lookup`]: they hit every device's block, repeat, and include the first
/// and last rows.
const KNOWN_IDS: [i64; 10] = [0, 23, 5, 6, 11, 12, 17, 18, 5, 23];

/// Rows `rows` of the table of [`known_lookup`], `table[r, c] = 100 r + c` with 3 columns,
/// flattened.
fn known_rows(rows: impl IntoIterator<Item = i64>) -> Vec<f64> {
    rows.into_iter()
        .flat_map(|r| (0..3).map(move |c| (100 * r + c) as f64))
        .collect()
}

/// `table[r, c] = 100 r + c` looked up at [`KNOWN_IDS`] on `d` ranks.
fn known_lookup(d: i64) -> Vec<f64> {
    let src = row_split_lookup("known(n = 10, v = 24, h = 3, d = 2)");
    let exe = streamweave::Compiler::new()
        .compile(&load(&src, &[("d", d)]))
        .unwrap();
    let mut globals = exe.random_inputs(1).unwrap();
    globals[0].data = KNOWN_IDS.iter().map(|v| *v as f64).collect();
    globals[1].data = known_rows(0..24);
    let report = exe
        .run_dense(
            &globals,
            &streamweave::RunOptions {
                target: streamweave::Target::Cpu { ranks: d as usize },
                check: true,
                check_races: true,
                ..streamweave::RunOptions::default()
            },
        )
        .unwrap();
    assert!(report.passed(), "{d} ranks");
    report
        .into_outputs()
        .unwrap()
        .get("e")
        .unwrap()
        .to_dense()
        .data
}

#[test]
fn each_id_reads_its_row_exactly_whichever_device_holds_it() {
    let want = known_rows(KNOWN_IDS);
    for d in [1, 2, 3, 4] {
        assert_eq!(known_lookup(d), want, "{d} ranks");
    }
}

/// `fusion {header}`: a lookup of `n` i64 ids in an f32 `[v, h]` table whose rows are split
/// across the `d` devices.
fn row_split_lookup(header: &str) -> String {
    format!(
        "fusion {header} {{
  mesh m = devices(d)
  tensor ids: i64[n] on m
  tensor table: f32[v, h] on m
  e = index_select(table, ids, 0)
  output e
  schedule table {{ outer_split(0, d) -> DIDx }}
}}
"
    )
}

/// The lookup of 4 ids in a table of 6 rows, for ids out of range.
fn out_of_range() -> String {
    row_split_lookup("oob(n = 4, v = 6, h = 2, d = 2)")
}

/// Runs [`out_of_range`] on `d` ranks with the ids `ids`, the reference check on or off.
fn run_oob(d: i64, ids: [f64; 4], check: bool) -> Result<(), String> {
    let exe = streamweave::Compiler::new()
        .compile(&load(&out_of_range(), &[("d", d)]))
        .unwrap();
    let mut globals = exe.random_inputs(1).unwrap();
    globals[0].data = ids.to_vec();
    exe.run_dense(
        &globals,
        &streamweave::RunOptions {
            target: streamweave::Target::Cpu { ranks: d as usize },
            check,
            ..streamweave::RunOptions::default()
        },
    )
    .map(|_| ())
    .map_err(|e| e.to_string())
}

#[test]
fn an_id_outside_the_table_is_an_error_naming_the_ids_the_position_and_the_value() {
    // The reference refuses it.
    let f = load(&out_of_range(), &[("d", 1)]);
    let table = weave_executor::Dense {
        dtype: weave_ir::DType::F32,
        sizes: vec![6, 2],
        data: vec![1.0; 12],
    };
    let ids = |v: f64| weave_executor::Dense {
        dtype: weave_ir::DType::I64,
        sizes: vec![4],
        data: vec![0.0, 5.0, v, 1.0],
    };
    let e = weave_executor::reference::run_reference(&f, &[ids(6.0), table.clone()])
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "index_select `e`: id 6 at position 2 of `ids` is outside the 6 rows of axis 0 of `table` (ids must lie in 0..6)"
    );
    let e = weave_executor::reference::run_reference(&f, &[ids(-1.0), table])
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "index_select `e`: id -1 at position 2 of `ids` is outside the 6 rows of axis 0 of `table` (ids must lie in 0..6)"
    );
    // So does the CPU backend's kernel, on every rank count (each device checks the id
    // against the whole table, not only its block), with the reference check off.
    for d in [1, 2] {
        let e = run_oob(d, [0.0, 5.0, 7.0, 1.0], false).unwrap_err();
        assert!(
            e.contains(
                "index_select `e_partial`: id 7 at position 2 of `ids` is outside the 6 rows of axis 0 of `table` (ids must lie in 0..6)"
            ),
            "{d} ranks: {e}"
        );
    }
    // In range, the same program runs.
    run_oob(2, [0.0, 5.0, 3.0, 1.0], true).unwrap();
}

#[test]
fn the_rows_cut_into_stream_chunks_are_refused_at_load() {
    let src = lookup("f32", "schedule table { outer_split(0, s) -> Stream }");
    let e = streamweave::load("lookup.weave", &src, &[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "index_select: the schedule of `table` cuts axis 0, the rows the ids index, other than by one device split; a lookup's rows may only be split across devices (`outer_split(0, d) -> DIDx`, each device looking up the ids in its block, the partial rows added across devices), not into stream or serial chunks: split the rows across devices, or split another axis\n --> lookup.weave:6:7\n  |\n6 |   e = index_select(table, ids, 0)\n  |       ^"
    );
    // A device split inside a serial split of the rows is refused the same way.
    let src = lookup(
        "f32",
        "schedule table { outer_split(0, 2); outer_split(1, d) -> DIDx }",
    );
    let e = streamweave::load("lookup.weave", &src, &[]).unwrap_err();
    assert!(
        e.to_string().contains("other than by one device split"),
        "{e}"
    );
}

#[test]
fn rows_split_over_devices_that_are_not_consecutive_are_refused_at_load() {
    let src = lookup("f32", VOCAB).replace("mesh m = devices(d)", "mesh m = [1, 0]");
    let e = streamweave::load("lookup.weave", &src, &[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "index_select: the rows of `table` are split across the devices of DeviceMesh{1 0}, which are not consecutive ids; a vocabulary-parallel lookup needs a mesh of consecutive devices (`devices(d)`, or a list such as `[2, 3]`), from whose rank each device finds its block of rows\n --> lookup.weave:6:7\n  |\n6 |   e = index_select(table, ids, 0)\n  |       ^"
    );
    // A consecutive list that does not start at 0 runs: the lookup on devices 2 and 3 (rows
    // 0..4 and 4..8), its result copied to devices 0 and 1.
    let src = "fusion shifted(n = 6, v = 8, h = 2) {
  mesh a = [0, 1]
  mesh b = [2, 3]
  tensor ids: i64[n] on b
  tensor table: f32[v, h] on b
  e = index_select(table, ids, 0)
  y = set(e)
  output y
  schedule table { outer_split(0, 2) -> DIDx }
  schedule y { mesh = a }
}
";
    let c = common::run_checked(load(src, &[]), 4, 1, 2)
        .unwrap_or_else(|f| panic!("{}: {}", f.stage, f.detail));
    assert!(c.checks.iter().all(|k| k.comparison.ok));
}

/// tests/scenarios/vocab_parallel_embedding.weave's source and the program compiled from it
/// with `overrides`.
fn vocab_embedding(overrides: &[(&str, i64)]) -> (String, streamweave::Executable) {
    let src = std::fs::read_to_string(common::fixture("vocab_parallel_embedding")).unwrap();
    let exe = streamweave::Compiler::new()
        .compile(&load(&src, overrides))
        .unwrap();
    (src, exe)
}

#[test]
fn the_partial_lookup_names_its_block_by_rank_and_the_program_reads_back() {
    let (src, exe) = vocab_embedding(&[("d", 2)]);
    let text = streamweave::host_ir::print(exe.program());
    assert!(
        text.contains("e_partial = index_select(table, ids, 0, 12 * rank)"),
        "{text}"
    );
    assert_eq!(communication_kinds(exe.program()), ["Allreduce"]);
    // The kernel's text parses back as it printed (the `rank` of its base included).
    let back = streamweave::Executable::from_text("p.hir", &text).unwrap();
    assert_eq!(streamweave::host_ir::print(back.program()), text);
    // The op prints as written and parses back; its arguments are checked.
    let f = load(&src, &[]);
    let printed = weave_ir::text::print(&f);
    assert!(
        printed.contains("  e = index_select(table, ids, 0)\n"),
        "{printed}"
    );
    assert_eq!(
        weave_ir::text::print(&weave_ir::text::parse(&printed, &[]).unwrap()),
        printed
    );
    let bad = |body: &str| {
        let s = format!(
            "fusion f(n = 4, v = 6) {{\n  tensor t: f32[v, 3]\n  tensor ids: i64[n]\n  tensor x: f32[n]\n  {body}\n  output e\n}}\n"
        );
        weave_ir::text::parse(&s, &[]).unwrap_err().message
    };
    assert_eq!(
        bad("e = index_select(t, x, 0)"),
        "index_select: the ids `x` (f32[n]) must be an i64 tensor of rank 1 (one id per looked-up row)"
    );
    assert_eq!(
        bad("e = index_select(t, ids)"),
        "`index_select` takes a table, i64 ids and the table's axis they index, e.g. `index_select(table, ids, 0)`; got 2 arguments"
    );
    assert_eq!(
        bad("e = index_select(t, ids, 2)"),
        "index_select: axis 2 is out of range for `t` (f32[v, 3]) of rank 2"
    );
}

#[test]
fn generated_ids_lie_inside_the_table() {
    // Drawn: `drawn uniform(0, 24)` spreads the ids over the whole vocabulary, so that every
    // device's block (of 4) is read.
    let (_, exe) = vocab_embedding(&[("d", 4), ("n", 64)]);
    let ids = &exe.random_inputs(9).unwrap()[0];
    assert!(ids
        .data
        .iter()
        .all(|v| (0.0..24.0).contains(v) && v.fract() == 0.0));
    for block in 0..4 {
        let lo = 6.0 * block as f64;
        assert!(
            ids.data.iter().any(|v| (lo..lo + 6.0).contains(v)),
            "block {block}: {:?}",
            ids.data
        );
    }
    // Not drawn: the generated ids are kept inside the rows they index (modulo the rows).
    let exe = streamweave::Compiler::new()
        .compile(&load(&lookup("f32", VOCAB), &[("n", 64)]))
        .unwrap();
    let inputs = exe.random_inputs(4).unwrap();
    assert!(inputs[0].data.iter().all(|v| (0.0..24.0).contains(v)));
    assert!(inputs[1].data.iter().all(|v| (0.0..6.0).contains(v)));
}

#[test]
fn the_cuda_kernel_of_each_rank_starts_at_its_block() {
    let (_, exe) = vocab_embedding(&[("d", 2)]);
    // Every rank's kernels, as the CUDA backend launches them: each rank's copy of the
    // lookup (named for its rank) reads zero outside its block, never out of bounds.
    let table = exe.kernel_table(2, 2, 132).unwrap();
    let source = |rank: usize| -> String {
        let suffix = format!("_rank{rank}");
        let entries: Vec<_> = table
            .entries()
            .iter()
            .filter(|k| k.segment.ends_with(&suffix))
            .collect();
        assert_eq!(entries.len(), 1, "rank {rank}: {:#?}", table.entries());
        entries[0]
            .plan
            .launches
            .iter()
            .map(|l| l.source.clone())
            .collect()
    };
    let (rank0, rank1) = (source(0), source(1));
    assert!(rank0.contains("- 0LL;"), "{rank0}");
    assert!(rank0.contains("< 12LL)"), "{rank0}");
    // Rank 1's copy of the kernel starts at row 12.
    assert!(rank1.contains("- 12LL;"), "{rank1}");
    assert!(!rank1.contains("- 0LL;"), "{rank1}");
    // The interpreter's copy is the one the table planned: named for its rank.
    let (_, unit) = exe
        .program()
        .kernels
        .iter()
        .find(|(_, u)| {
            u.fusion.exprs().iter().any(|e| {
                matches!(
                    u.fusion.expr(*e).kind,
                    weave_ir::ExprKind::IndexSelect { .. }
                )
            })
        })
        .unwrap();
    let bound = weave_executor::interp::bind_rank(&unit.fusion, 1).unwrap();
    assert_eq!(bound.name, format!("{}_rank1", unit.fusion.name));
}

#[test]
fn the_lookup_of_the_format_doc_runs_as_written() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/fusion-format.md"),
    )
    .unwrap();
    let start = doc.find("fusion embedding(").expect("the example");
    let end = start + doc[start..].find("\n}\n").expect("its end") + 3;
    let src = &doc[start..end];
    for d in [1i64, 2, 4] {
        let c = common::run_checked(load(src, &[("d", d)]), d as usize, 2, 8)
            .unwrap_or_else(|f| panic!("{d} ranks: {}: {}", f.stage, f.detail));
        assert!(c.checks.iter().all(|k| k.comparison.ok));
        if d > 1 {
            assert_eq!(communication_kinds(&c.program), ["Allreduce"]);
        }
    }
}
