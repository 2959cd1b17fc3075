//! The `weave dump` command and `WEAVE_DUMP` end to end through the binary: the list of
//! passes, dumps asked for by the environment with the flags adding to them, a dump
//! directory, `weave run` dumping to stderr, and a `WEAVE_DUMP` that does not parse.

use std::process::Command;

use streamweave::passes::{Pipeline, Registry};

mod common;

/// Runs `weave ARGS` with `WEAVE_DUMP` set to `weave_dump` (unset for `None`); returns
/// success, stdout and stderr.
fn weave(args: &[&str], weave_dump: Option<&str>) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_weave"));
    command.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    match weave_dump {
        Some(value) => command.env("WEAVE_DUMP", value),
        None => command.env_remove("WEAVE_DUMP"),
    };
    let out = command.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `IR Dump` header lines of `out`.
fn headers(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| l.starts_with("// -----// IR Dump"))
        .collect()
}

const FUSION: &str = "tests/scenarios/row_parallel_linear.weave";

/// The default pipeline's passes, in order, from the one table that declares them.
fn default_pipeline() -> Vec<&'static str> {
    Pipeline::standard().names()
}

#[test]
fn list_passes_ends_with_the_default_pipeline() {
    let (ok, out, err) = weave(&["dump", "--list-passes"], None);
    assert!(ok, "{err}");
    let names: Vec<&str> = out
        .lines()
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    // Every registered pass and alias, in the registry's order: the default pipeline's
    // passes, each followed by its variants (lowering by broadcast, separate stream sync).
    assert_eq!(names, Registry::standard().names());
    let pipeline = default_pipeline();
    assert_eq!(
        names
            .iter()
            .filter(|n| pipeline.contains(n))
            .copied()
            .collect::<Vec<_>>(),
        pipeline,
        "the default pipeline's passes are listed in pipeline order"
    );
    for (variant, of) in [
        ("lower-to-host-broadcast", "lower-to-host"),
        ("assign-streams-separate-sync", "assign-streams"),
    ] {
        let at = |n: &str| names.iter().position(|m| *m == n);
        assert_eq!(at(variant), at(of).map(|i| i + 1), "{variant} follows {of}");
    }
    assert!(
        out.ends_with(&format!("\ndefault pipeline: {}\n", pipeline.join(","))),
        "{out}"
    );
}

#[test]
fn weave_dump_selects_dumps_and_the_flags_add_to_it() {
    let (ok, out, err) = weave(&["dump", FUSION, "--passes=default"], Some("after:all"));
    assert!(ok, "{err}");
    let expected: Vec<String> = Pipeline::standard()
        .passes()
        .iter()
        .map(|stage| {
            format!(
                "// -----// IR Dump After {} ({}) //----- //",
                stage.pass().name(),
                stage.output().name()
            )
        })
        .collect();
    assert_eq!(
        expected.last().map(String::as_str),
        Some("// -----// IR Dump After prefetch-communications (host program) //----- //")
    );
    assert_eq!(headers(&out), expected);
    // Then the host program the pipeline leaves.
    let last = out.rfind("// -----// IR Dump").unwrap();
    assert_eq!(
        out[last..].matches("} // %HostIrContainer").count(),
        2,
        "{out}"
    );

    let (ok, out, err) = weave(
        &[
            "dump",
            FUSION,
            "--passes=propagate-shardings,segment",
            "--print-before=segment",
        ],
        Some("after:propagate-shardings"),
    );
    assert!(ok, "{err}");
    assert_eq!(
        headers(&out),
        [
            "// -----// IR Dump After propagate-shardings (fusion) //----- //",
            "// -----// IR Dump Before segment (fusion) //----- //",
        ]
    );

    // Without --passes or a dump flag no pass runs, whatever WEAVE_DUMP says: the loaded
    // fusion is printed.
    for weave_dump in [None, Some("after:all")] {
        let (ok, out, err) = weave(&["dump", FUSION], weave_dump);
        assert!(ok, "{err}");
        assert!(headers(&out).is_empty(), "{out}");
        assert!(out.starts_with("Fusion row_parallel_linear("), "{out}");
    }
}

#[test]
fn weave_dump_dir_writes_a_file_after_every_pass() {
    let dir = std::env::temp_dir().join(format!("weave-cli-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let spec = format!("dir:{}", dir.display());
    let (ok, out, err) = weave(&["dump", FUSION, "--passes=default"], Some(&spec));
    assert!(ok, "{err}");
    assert!(headers(&out).is_empty(), "{out}");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let expected: Vec<String> = default_pipeline()
        .iter()
        .enumerate()
        .map(|(i, pass)| format!("{i:03}-{pass}.after.txt"))
        .collect();
    assert_eq!(files, expected);
    let host = std::fs::read_to_string(dir.join(expected.last().unwrap())).unwrap();
    assert!(host.contains("%HostIrContainer"), "{host}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn weave_run_dumps_to_stderr() {
    let args = [
        "run", FUSION, "--ranks", "2", "--set", "t=48", "--set", "h=8",
    ];
    let (ok, out, err) = weave(&args, Some("after:lower-to-host"));
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        headers(&err),
        ["// -----// IR Dump After lower-to-host (host program) //----- //"]
    );
    assert!(headers(&out).is_empty(), "{out}");
    assert!(out.trim_end().ends_with("result: PASS"), "{out}");

    let (ok, out, err) = weave(&args, None);
    assert!(ok, "{out}\n{err}");
    assert!(headers(&err).is_empty(), "{err}");
}

#[test]
fn a_bad_weave_dump_fails_with_its_syntax() {
    let syntax = "before:PASS|all, after:PASS|all, after-change, dir:PATH";
    for args in [
        &["dump", FUSION][..],
        &[
            "run", FUSION, "--ranks", "2", "--set", "t=48", "--set", "h=8",
        ][..],
    ] {
        let (ok, out, err) = weave(args, Some("after"));
        assert!(!ok, "{args:?}: {out}");
        assert!(
            err.contains("WEAVE_DUMP: `after` is not a dump item") && err.contains(syntax),
            "{args:?}: {err}"
        );
        let (ok, _, err) = weave(args, Some("after:nope"));
        assert!(!ok, "{args:?}");
        assert!(err.contains("unknown pass `nope`"), "{args:?}: {err}");
    }
}

/// `--kernels` prints the CUDA C of each distinct launch: the chunks of a loop that share a
/// shape share one entry, an uneven last chunk has its own; a loop that only launches kernels
/// on small chunks runs once over whole tensors (`merge-kernel-chunks`), so its kernel has one
/// entry at the whole shape; `--sms` needs `--kernels` or a host program to plan, and
/// `--kernels` runs the default pipeline and takes no pass flags.
#[test]
fn kernels_prints_the_cuda_c_of_each_distinct_chunk_shape() {
    let file = "tests/scenarios/reduction.weave";
    let entries = |out: &str| {
        out.lines()
            .filter(|l| l.starts_with("// ===== segment"))
            .count()
    };
    let (ok, out, err) = weave(
        &["dump", file, "--kernels", "--set", "x=10", "--set", "s=3"],
        None,
    );
    assert!(ok, "{err}");
    assert_eq!(entries(&out), 1, "{out}");
    assert!(
        out.contains("//   input 0: f32[10, 8, 2] strides [16, 2, 1]"),
        "the whole tensor, not chunks: {out}"
    );
    assert!(
        out.contains("extern \"C\" __global__ void weave_kernel_"),
        "{out}"
    );
    assert!(
        out.contains("weave_block_reduce(acc"),
        "a row kernel: {out}"
    );
    // A GEMM chunk overlaps the previous chunk's ReLU, so that loop keeps its chunks.
    let (dir, linear_relu) = linear_relu_file("kernels", "t = 12, h = 8, f = 4, s = 3");
    let linear_relu = linear_relu.to_str().unwrap();
    let (ok, out, err) = weave(&["dump", linear_relu, "--kernels"], None);
    assert!(ok, "{err}");
    assert_eq!(entries(&out), 1, "three chunks of 4 rows: {out}");
    assert!(
        out.contains("//   input 0: f32[4, 4] strides [4, 1]"),
        "{out}"
    );
    let (ok, out, err) = weave(
        &[
            "dump",
            linear_relu,
            "--kernels",
            "--set",
            "t=10",
            "--sms",
            "8",
        ],
        None,
    );
    assert!(ok, "{err}");
    assert_eq!(entries(&out), 2, "chunks of 4 and of 2 rows: {out}");
    assert!(out.contains("input 0: f32[2, 4]"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
    let (ok, _, err) = weave(&["dump", file, "--sms", "8"], None);
    assert!(!ok && err.contains("--kernels"), "{err}");
    let (ok, _, err) = weave(&["dump", file, "--kernels", "--passes", "default"], None);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
}

/// A host program is printed with its kernel table after it: a header, then one `//` line per
/// plan (statement, segment, layouts, temporaries, each kernel's name and grid for `--sms`
/// SMs, 132 without it), an uneven last chunk with a plan of its own; the printed program
/// parses back as it printed, the plans read as comments.
#[test]
fn a_host_program_is_printed_with_its_kernel_plans_and_parses_back() {
    let plans = |out: &str| -> Vec<String> {
        out.lines()
            .skip_while(|l| !l.starts_with("// Kernel plans:"))
            .map(str::to_string)
            .collect()
    };
    let reduction = "tests/scenarios/reduction.weave";
    let line = |blocks: usize| {
        format!(
            "// `LaunchKernel(kernel=K0, inputs=(T0), outputs=(T1))`: segment \
             `reduction_kernel0`, inputs (f32[10000, 8, 2] strides [16, 2, 1]), outputs \
             (f32[10000, 8] strides [8, 1]); temporaries (); kernels \
             weave_kernel_reduction_kernel0_0 (80000 rows; {blocks} blocks of 32 threads)"
        )
    };
    for (sms, blocks) in [(None, 80000), (Some("8"), 8192)] {
        let mut args = vec!["dump", reduction, "--passes", "default", "--set", "x=10000"];
        args.extend(sms.iter().flat_map(|n| ["--sms", n]));
        let (ok, out, err) = weave(&args, None);
        assert!(ok, "{err}");
        assert_eq!(
            plans(&out),
            [
                format!(
                    "// Kernel plans: 1 for 1 rank(s) and 2 pool stream(s), grids for {} SMs",
                    sms.unwrap_or("132")
                ),
                line(blocks)
            ],
            "{out}"
        );
        // The plans follow the last kernel block and read as comments.
        let program = &out[..out.find("// Kernel plans:").unwrap()];
        assert!(program.ends_with("\n}\n"), "{program}");
        let back = streamweave::Executable::from_text("dumped.hir", &out).unwrap();
        assert_eq!(streamweave::host_ir::print(back.program()), program);
    }
    // Two chunk shapes of one segment: two plans.
    let (dir, linear_relu) = linear_relu_file("plans", "t = 10, h = 8, f = 4, s = 3");
    let (ok, out, err) = weave(
        &["dump", linear_relu.to_str().unwrap(), "--passes", "default"],
        None,
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "{err}");
    let plans = plans(&out);
    assert_eq!(plans.len(), 3, "{out}");
    assert_eq!(
        plans[0],
        "// Kernel plans: 2 for 1 rank(s) and 2 pool stream(s), grids for 132 SMs"
    );
    assert!(
        plans[1].contains("inputs (f32[4, 4] strides [4, 1])")
            && plans[2].contains("inputs (f32[2, 4] strides [4, 1])"),
        "{plans:#?}"
    );
    streamweave::Executable::from_text("dumped.hir", &out).unwrap();
    // `--streams`: the pool the plans are for (the header says it).
    let (ok, out, err) = weave(
        &["dump", reduction, "--passes", "default", "--streams", "3"],
        None,
    );
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "\n// Kernel plans: 1 for 1 rank(s) and 3 pool stream(s), grids for 132 SMs\n"
        ),
        "{out}"
    );
    // No host program, nothing to plan: `--sms` and `--streams` are refused.
    for flag in ["--sms", "--streams"] {
        let (ok, _, err) = weave(&["dump", reduction, flag, "8"], None);
        assert!(!ok, "{err}");
        assert!(
            err.starts_with(&format!("error: {flag} sets what the kernel plans"))
                && err.contains("this dump prints a fusion")
                && err.contains("--passes default"),
            "{err}"
        );
    }
}

/// The host program between `%HostIrContainer {` and its closing line, one string per line.
fn host_program(out: &str) -> Vec<&str> {
    out.lines()
        .skip_while(|l| !l.starts_with("%HostIrContainer"))
        .skip(1)
        .take_while(|l| !l.starts_with("} // %HostIrContainer"))
        .collect()
}

/// The top-level loops of a printed host program that do work (not `assign-streams`' join
/// loops of `Synchronize` only), each as its body's lines.
fn compute_loops(program: &[&str]) -> Vec<Vec<String>> {
    let mut loops = Vec::new();
    let mut k = 0;
    while k < program.len() {
        if program[k].starts_with("  FOR ") {
            let body: Vec<String> = program[k + 1..]
                .iter()
                .take_while(|l| l.starts_with("    "))
                .map(|l| l.trim().to_string())
                .collect();
            k += 1 + body.len();
            if body
                .iter()
                .any(|l| !l.starts_with("Synchronize(") && !l.starts_with("SetCurrentStream("))
            {
                loops.push(body);
            }
        } else {
            k += 1;
        }
    }
    loops
}

/// The number after `Communication ` on a printed statement line (`Communication 75 (..)`).
fn communication_number(line: &str) -> Option<&str> {
    line.strip_prefix("Communication ")?
        .split_whitespace()
        .next()
}

/// `weave dump` of the attention layer stays readable: the host program has one loop per
/// overlapped region (QKV over token chunks, then attention over query chunks), no loop
/// inside a loop, and every communication printed inside its loop with its `Wait` after it
/// and before the kernel that reads its result (the residual add).
#[test]
fn the_dump_of_the_attention_layer_shows_one_loop_per_region_and_every_wait() {
    for (fixture, expected) in [
        (
            "tests/scenarios/tp_attention.weave",
            [vec![], vec!["Allreduce"]],
        ),
        (
            "tests/scenarios/sequence_parallel_attention.weave",
            [vec!["Allgather"], vec!["ReduceScatter"]],
        ),
    ] {
        let (ok, out, err) = weave(&["dump", fixture, "--passes", "default"], None);
        assert!(ok, "{fixture}: {err}");
        let program = host_program(&out);
        assert!(!program.is_empty(), "{fixture}: no host program in\n{out}");
        assert!(
            !program.iter().any(|l| l.starts_with("    FOR ")),
            "{fixture}: a loop inside a loop"
        );
        assert!(
            !program.iter().any(|l| l.starts_with("  Communication ")),
            "{fixture}: a communication outside the loops"
        );
        let loops = compute_loops(&program);
        assert_eq!(loops.len(), 2, "{fixture}:\n{}", program.join("\n"));
        for (body, kinds) in loops.iter().zip(&expected) {
            let comms: Vec<(usize, &str)> = body
                .iter()
                .enumerate()
                .filter_map(|(k, l)| communication_number(l).map(|n| (k, n)))
                .collect();
            let printed: Vec<&str> = comms
                .iter()
                .map(|(k, _)| {
                    body[*k]
                        .split("type=")
                        .nth(1)
                        .and_then(|r| r.split([',', ')']).next())
                        .unwrap_or("")
                })
                .collect();
            assert_eq!(&printed, kinds, "{fixture}: {body:#?}");
            for (k, n) in comms {
                let wait = format!("Wait(Communication {n})");
                let at = body
                    .iter()
                    .position(|l| *l == wait)
                    .unwrap_or_else(|| panic!("{fixture}: no `{wait}` in {body:#?}"));
                assert!(at > k, "{fixture}: `{wait}` before its communication");
                // The communication's output is read only after the Wait.
                let output = body[k]
                    .split("output=")
                    .nth(1)
                    .and_then(|r| r.split([',', ')']).next())
                    .unwrap();
                let names = |l: &str| -> bool {
                    l.split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                        .any(|w| w == output)
                };
                assert!(
                    !body[k + 1..at].iter().any(|l| names(l)),
                    "{fixture}: `{output}` used before `{wait}`: {body:#?}"
                );
                assert!(
                    body[at + 1..].iter().any(|l| names(l)),
                    "{fixture}: `{output}` not read in the loop after `{wait}`: {body:#?}"
                );
            }
        }
    }
}

/// A fresh scratch directory `weave-cli-{tag}-PID` holding `linear_relu.weave`, the linear +
/// ReLU layer with parameters `params` in f32.
fn linear_relu_file(tag: &str, params: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("weave-cli-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("linear_relu.weave");
    std::fs::write(&file, common::linear_relu(params, "f32")).unwrap();
    (dir, file)
}
