//! The `weave run` command end to end: it runs a scenario on simulated ranks, prints the
//! match against the reference, the race checker's verdict, timings and the trace path, and
//! writes a Chrome trace with spans of every rank and stream and an SVG beside it; bad
//! requests fail with a clear message and exit status 1.

use std::path::Path;
use std::process::Command;

fn weave(args: &[&str]) -> (bool, String, String) {
    weave_with_log(args, None)
}

/// `weave ARGS` with `WEAVE_LOG` set to `log` (or unset): success, stdout, stderr.
fn weave_with_log(args: &[&str], log: Option<&str>) -> (bool, String, String) {
    let env: Vec<(&str, &str)> = log.map(|f| ("WEAVE_LOG", f)).into_iter().collect();
    weave_with_env(args, &env)
}

/// Runs `weave` with `args` and the variables `env`, `WEAVE_LOG` and `WEAVE_LOG_SPANS`
/// otherwise unset.
fn weave_with_env(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_weave"));
    cmd.args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("WEAVE_LOG")
        .env_remove("WEAVE_LOG_SPANS");
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn run_prints_the_match_timings_and_the_trace() {
    let dir = std::env::temp_dir().join(format!("weave-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("rp.json");
    let (ok, out, err) = run_logged(&["--check-races", "--trace", trace.to_str().unwrap()], None);
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("2 rank(s) on the cpu backend (threads), numberOfStreams = 2"),
        "{out}"
    );
    assert!(
        out.contains("host program: 16 statements, 2 loop(s), 0 kernel launch(es), 1 GEMM(s), collectives: Allreduce"),
        "{out}"
    );
    assert!(
        out.contains("output out: matches the reference on 2 rank(s)"),
        "{out}"
    );
    assert!(out.contains("race checker: no races"), "{out}");
    assert!(out.contains("timings: compile "), "{out}");
    assert!(
        out.contains(&format!("trace: {}", trace.display())),
        "{out}"
    );
    assert!(out.trim_end().ends_with("result: PASS"), "{out}");

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let spans: Vec<&serde_json::Value> = json
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .collect();
    for rank in 0..2 {
        let linears = spans
            .iter()
            .filter(|e| e["pid"] == rank && e["name"].as_str().unwrap().contains("linear"))
            .count();
        let allreduces = spans
            .iter()
            .filter(|e| e["pid"] == rank && e["cat"] == "comm")
            .count();
        assert_eq!(
            (linears, allreduces),
            (4, 4),
            "rank {rank}: one of each per chunk"
        );
    }
    let tids: std::collections::BTreeSet<i64> =
        spans.iter().map(|e| e["tid"].as_i64().unwrap()).collect();
    assert!(tids.len() >= 2, "chunks ran on two pool streams: {tids:?}");
    // The ranks on one clock: their first allreduce (the same statement) ends at the same
    // moment on both; the picture starts when both had begun.
    let first_end = |rank: i64| {
        let first = spans
            .iter()
            .filter(|e| e["pid"] == rank && e["cat"] == "comm")
            .min_by(|a, b| {
                a["ts"]
                    .as_f64()
                    .unwrap()
                    .total_cmp(&b["ts"].as_f64().unwrap())
            })
            .unwrap();
        first["ts"].as_f64().unwrap() + first["dur"].as_f64().unwrap()
    };
    assert!(
        (first_end(0) - first_end(1)).abs() < 0.01,
        "{} against {}",
        first_end(0),
        first_end(1)
    );
    let svg = std::fs::read_to_string(Path::new(&trace).with_extension("svg")).unwrap();
    assert!(
        svg.starts_with("<svg")
            && svg.contains("rank 1 pool stream 1")
            && svg.contains("from when every rank had begun"),
        "{svg}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_refuses_more_ranks_than_the_mesh_and_unknown_backends() {
    // `d` follows --ranks unless --set gives it.
    let (ok, out, err) = weave(&["run", "tests/scenarios/allgather.weave", "--ranks", "4"]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("4 rank(s) on the cpu backend"), "{out}");
    let (ok, out, err) = weave(&[
        "run",
        "tests/scenarios/allgather.weave",
        "--ranks",
        "4",
        "--set",
        "d=2",
    ]);
    assert!(!ok);
    assert!(out.starts_with("skipped: "), "{out}");
    assert_eq!(
        err.trim(),
        "error: 4 ranks were asked for but the program's meshes cover 2 device(s): every rank \
         must be a device of a mesh (compile it with d=4)"
    );
    let (ok, _, err) = weave(&[
        "run",
        "tests/scenarios/allgather.weave",
        "--backend",
        "cuda",
    ]);
    assert!(!ok);
    // Without a GPU (as in CI) the CUDA backend says why it cannot run.
    if weave_cuda::device_count().is_err() {
        assert!(err.contains("CUDA is not available"), "{err}");
    }
    let (ok, _, err) = weave(&["run", "tests/scenarios/allgather.weave", "--backend", "tpu"]);
    assert!(!ok);
    assert_eq!(
        err.trim(),
        "error: --backend tpu: unknown backend (expected cpu or cuda)"
    );
    let (ok, _, err) = weave(&["run", "tests/scenarios/allgather.weave", "--set", "q=1"]);
    assert!(!ok);
    assert!(err.contains("unknown parameter `q`"), "{err}");
}

#[test]
fn chunks_sets_the_stream_split_unless_set_gives_it() {
    let dump = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "tests/scenarios/row_parallel_linear.weave",
            "--set",
            "t=48",
            "--set",
            "h=8",
        ];
        args.extend_from_slice(extra);
        weave(&args)
    };
    // Statements rank 0 issued: the loop bodies run once per chunk.
    let issued = |extra: &[&str]| {
        let (ok, out, err) = dump(extra);
        assert!(ok, "{out}\n{err}");
        out.lines()
            .find_map(|l| l.trim().strip_prefix("rank 0: "))
            .and_then(|l| l.split(' ').next())
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("no statement count in {out}"))
    };
    let three = issued(&["--chunks", "3"]);
    let two = issued(&["--chunks", "2"]);
    assert!(
        three > two,
        "3 chunks issue more statements than 2: {three} vs {two}"
    );
    // `--set s=` wins over --chunks.
    assert_eq!(issued(&["--chunks", "3", "--set", "s=2"]), two);
    for bad in ["0", "ring:0", "ring:x", "ring2", "ring:65"] {
        let (ok, _, err) = dump(&["--chunks", bad]);
        assert!(!ok, "--chunks {bad}");
        assert!(
            err.contains(&format!(
                "`{bad}` is neither `auto`, a positive number, `ring` nor `ring:K` (K pieces a step, 1 to 64)"
            )),
            "{err}"
        );
    }
}

#[test]
fn chunks_ring_runs_the_ring_form_and_says_so_or_says_why_not() {
    let run = |file: &str, chunks: &str, set: &[&str]| {
        let path = format!("tests/scenarios/{file}.weave");
        let mut args = vec!["run", path.as_str(), "--chunks", chunks];
        for s in set {
            args.extend_from_slice(&["--set", s]);
        }
        weave(&args)
    };
    let (ok, out, err) = run("row_parallel_linear", "ring:2", &["t=48", "h=8"]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("result: PASS"), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("config: ring form")
            && l.contains("2 pieces a step")
            && l.contains(
                "`out`: allreduce as a reduce ring and its gather on axis 0 (2 devices)"
            )),
        "{out}"
    );
    let (ok, out, err) = run("sequence_parallel_mlp_block", "ring", &[]);
    assert!(ok, "{out}\n{err}");
    assert!(
        out.lines().any(|l| l.starts_with("config: ring form")
            && l.contains("`ag`: allgather as a ring on axis 0")
            && l.contains("`out`: reduce-scatter as a reduce ring on axis 0")),
        "{out}"
    );
    // Only an allgather's ring: nothing to cut into pieces.
    let (ok, _, err) = run("column_parallel_linear", "ring:2", &["t=48", "h=8"]);
    assert!(!ok);
    assert!(
        err.contains("ring:2: the ring form of `column_parallel_linear` has no reduce ring to cut into pieces (its rings: `ag`: allgather as a ring on axis 0 (2 devices)); `ring` runs it with each step whole"),
        "{err}"
    );
    // Pieces that do not cut the rows evenly: refused in the fusion's own names.
    let (ok, _, err) = run("row_parallel_linear", "ring:5", &["t=48", "h=8"]);
    assert!(!ok);
    assert!(
        err.contains("ring:5: the 48 rows of `out` (axis 0) do not fall into 2 device blocks of 5 equal pieces each")
            && !err.contains("_ring"),
        "{err}"
    );
    // Nothing to make a ring of.
    let (ok, _, err) = run("single_binary_op", "ring:2", &[]);
    assert!(!ok);
    assert!(
        err.contains("`single_binary_op` has no ring form: it has no allgather, and no GEMM whose contraction is split over devices and reduced by an allreduce or reduce-scatter"),
        "{err}"
    );
    // A linear with a bias sums without it in the ring and adds it after: to the gathered
    // tensor of an allreduce, to the blocks of a reduce-scatter (`matmul_rs` given a bias).
    let (ok, out, err) = run("row_parallel_linear_bias", "ring:2", &["t=48", "h=8"]);
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("`out`: allreduce as a reduce ring and its gather on axis 0 (2 devices)")
            && out.contains("result: PASS"),
        "{out}"
    );
    let dir = std::env::temp_dir().join(format!("weave-ring-bias-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let with_bias = dir.join("matmul_rs_bias.weave");
    std::fs::write(
        &with_bias,
        std::fs::read_to_string("tests/scenarios/matmul_rs.weave")
            .unwrap()
            .replace(
                "  out = linear(inp, w)\n",
                "  tensor bias: bf16[h] on m\n  out = linear(inp, w, bias)\n",
            ),
    )
    .unwrap();
    for chunks in ["auto", "ring:2"] {
        let (ok, out, err) = weave(&[
            "run",
            with_bias.to_str().unwrap(),
            "--chunks",
            chunks,
            "--set",
            "t=48",
            "--set",
            "h=8",
        ]);
        assert!(ok && out.contains("result: PASS"), "{out}\n{err}");
        assert_eq!(
            out.contains("`out`: reduce-scatter as a reduce ring on axis 0 (2 devices)"),
            chunks != "auto",
            "{out}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    // Rows that do not fall into one block per device.
    let (ok, _, err) = run("row_parallel_linear", "ring:2", &["t=51", "h=8"]);
    assert!(!ok);
    assert!(
        err.contains("`row_parallel_linear` has no ring form: `out`'s axis 0 (51) does not fall into 2 equal blocks"),
        "{err}"
    );
}

#[test]
fn calibrate_refuses_one_rank_and_names_what_is_missing_without_gpus() {
    let out_file = std::env::temp_dir().join(format!("weave-cal-{}.txt", std::process::id()));
    let out_arg = out_file.to_string_lossy().to_string();
    let (ok, _, err) = weave(&["calibrate", "--ranks", "1", "--out", &out_arg]);
    assert!(!ok);
    assert!(
        err.contains("--ranks 1: the collectives need 2 or more GPUs"),
        "{err}"
    );
    // Without GPUs (CI) the error says why; with them it measures and writes the file.
    let (ok, out, err) = weave(&["calibrate", "--ranks", "2", "--out", &out_arg]);
    if ok {
        let text = std::fs::read_to_string(&out_file).unwrap();
        let cal = streamweave::chunks::Calibration::parse(&text).unwrap();
        assert!(cal.gemm_tflops > 0.0 && cal.busbw_gbs > 0.0, "{out}");
        let _ = std::fs::remove_file(&out_file);
    } else {
        assert!(err.contains("cannot open 2 GPU(s)"), "{err}");
        assert!(
            !out_file.exists(),
            "nothing is written when calibration fails"
        );
    }
}

/// A program whose meshes need more devices than the ranks asked for is skipped with the
/// devices it needs, on the CUDA backend too, where the cost model's chunk choice used to
/// meter it on too few ranks and fail with an internal error (a 2 x 2 mesh on 2 ranks). The
/// message comes before any GPU is needed, so this runs without one.
#[test]
fn a_mesh_larger_than_the_ranks_is_skipped_with_its_devices_on_every_backend() {
    for backend in ["cpu", "cuda"] {
        let (ok, out, err) = weave(&[
            "run",
            "tests/scenarios/tp_attention_2d.weave",
            "--ranks",
            "2",
            "--backend",
            backend,
        ]);
        assert!(!ok, "{backend}");
        let want = "the program's meshes name device 2 but only 2 rank(s) were asked for";
        assert!(
            out.contains(&format!("skipped: {want}")),
            "{backend}: {out}\n{err}"
        );
        assert!(err.contains(want), "{backend}: {err}");
    }
}

#[test]
fn gpu_only_flags_and_unknown_transports_are_refused_with_the_flag() {
    let file = "tests/scenarios/row_parallel_linear.weave";
    let (ok, _, err) = weave(&["run", file, "--iters", "5"]);
    assert!(!ok);
    assert_eq!(err.trim(), "error: --iters needs --backend cuda");
    let (ok, _, err) = weave(&["run", file, "--transport", "copy-engine"]);
    assert!(!ok);
    assert_eq!(
        err.trim(),
        "error: --transport copy-engine needs --backend cuda"
    );
    let (ok, _, err) = weave(&["run", file, "--backend", "cuda", "--transport", "ipc"]);
    assert!(!ok);
    assert_eq!(
        err.trim(),
        "error: --transport ipc: unknown transport (expected nccl or copy-engine)"
    );
}

/// The overlap knobs are flags of `weave run`: GPU-only ones are refused on the CPU naming
/// the flag, values out of range are refused by the parser, and the configuration that ran
/// is printed with where it came from.
#[test]
fn overlap_knobs_are_flags_and_the_configuration_is_printed_with_its_source() {
    let file = "tests/scenarios/row_parallel_linear.weave";
    let small = ["--set", "t=16", "--set", "h=4"];
    for (flag, value) in [
        ("--ordered-compute", "on"),
        ("--pool-priority", "high"),
        ("--comm-priority", "high"),
        ("--gemm-sm-margin", "16"),
        ("--nccl-max-ctas", "16"),
        ("--nccl-cta-policy", "zero"),
        ("--nccl-window-mib", "256"),
        ("--ce-slot-mib", "32"),
        ("--gemm-into-windows", "on"),
    ] {
        let (ok, _, err) = weave(&["run", file, flag, value]);
        assert!(!ok, "{flag}");
        assert_eq!(err.trim(), format!("error: {flag} needs --backend cuda"));
    }
    const CTAS: &str = "expected auto or a CTA count from 1 to 64";
    const POLICIES: &str = "`fast`: expected default, efficiency, zero or auto";
    for (flag, value, why) in [
        ("--nccl-max-ctas", "0", CTAS),
        ("--nccl-max-ctas", "65", CTAS),
        ("--ordered-compute", "yes", "expected on or off"),
        ("--pool-priority", "low", "expected high or normal"),
        ("--comm-priority", "urgent", "expected high or normal"),
        ("--gemm-sm-margin", "x", "invalid digit"),
        ("--nccl-cta-policy", "fast", POLICIES),
        ("--nccl-window-mib", "65537", "65537 is not in 0..=65536"),
        ("--nccl-window-mib", "-1", "unexpected argument"),
        ("--ce-slot-mib", "0", "0 is not in 1..=1024"),
        ("--ce-slot-mib", "1025", "1025 is not in 1..=1024"),
        ("--gemm-into-windows", "yes", "expected on or off"),
    ] {
        let (ok, _, err) = weave(&["run", file, flag, value]);
        assert!(!ok, "{flag} {value}");
        assert!(err.contains(why), "{flag} {value}: {err}");
    }
    // Collectives at high priority run on NCCL only: with copy engines the run is refused
    // before any rank starts (here, before a GPU is looked for).
    let (ok, out, err) = weave(
        &[
            &[
                "run",
                file,
                "--backend",
                "cuda",
                "--transport",
                "copy-engine",
            ][..],
            &["--comm-priority", "high"],
            &small[..],
        ]
        .concat(),
    );
    assert!(!ok, "{out}");
    assert_eq!(
        err.trim(),
        "error: collectives at high priority (--comm-priority high) need the NCCL transport: \
         the copy-engine transport's transfers wait on flags from streams of their own, which \
         more streams would share hardware queues with"
    );
    assert!(!out.contains("rank(s) on the cuda backend"), "{out}");
    let (ok, out, err) = weave(&[&["run", file][..], &small[..]].concat());
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("\nconfig: S=4 K=2 (from the defaults)\n"),
        "{out}"
    );
    let json = std::env::temp_dir().join(format!("weave-config-{}.json", std::process::id()));
    let json_arg = json.to_str().unwrap();
    let args = [
        &["run", file, "--streams", "3", "--json", json_arg][..],
        &small[..],
    ]
    .concat();
    let (ok, out, err) = weave(&args);
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("\nconfig: S=4 K=3 (from the command line)\n"),
        "{out}"
    );
    // The summary carries the same line.
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(summary["config"], "S=4 K=3 (from the command line)");
    let _ = std::fs::remove_file(&json);
}

/// The `--json` summary is JSON whatever the file is called and whatever the error says: a
/// scenario name with a quote and a tab, and a failing run whose message spans lines.
#[test]
fn json_summaries_stay_valid_json() {
    let dir = std::env::temp_dir().join(format!("weave-cli-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let name = dir.join("odd \"name\"\t.weave");
    std::fs::copy("tests/scenarios/single_set_op.weave", &name).unwrap();
    let summary = dir.join("summary.json");
    let run_one_rank = |extra: &[&str]| {
        weave(&[&["run", name.to_str().unwrap(), "--ranks", "1"][..], extra].concat())
    };
    let (ok, out, err) = run_one_rank(&["--json", summary.to_str().unwrap()]);
    assert!(ok, "{out}\n{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(v["scenario"], "odd \"name\"\t");
    assert_eq!(v["passed"], true);
    assert_eq!(v["ranks"], 1);
    assert!(v["max_abs_error"].as_f64().is_some_and(|e| e == 0.0), "{v}");
    // A failing run: the error is a string, newlines and all.
    let (ok, _, _) = run_one_rank(&["--set", "nope=1", "--json", summary.to_str().unwrap()]);
    assert!(!ok);
    let text = std::fs::read_to_string(&summary).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["passed"], false);
    assert!(
        v["error"].as_str().is_some_and(|e| e.contains("nope")),
        "{v}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs a small `weave run` with `extra` arguments and `WEAVE_LOG` set to `env` (or unset).
fn run_logged(extra: &[&str], env: Option<&str>) -> (bool, String, String) {
    weave_with_log(&small_run(extra), env)
}

/// The arguments of a small `weave run` of the row-parallel linear on 2 ranks, then `extra`.
fn small_run<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        "tests/scenarios/row_parallel_linear.weave",
        "--ranks",
        "2",
        "--set",
        "t=48",
        "--set",
        "h=8",
    ];
    args.extend_from_slice(extra);
    args
}

#[test]
fn the_log_is_off_by_default_and_goes_to_stderr_when_asked_for() {
    let (ok, quiet_out, quiet_err) = run_logged(&[], None);
    assert!(ok, "{quiet_out}\n{quiet_err}");
    assert_eq!(quiet_err, "", "nothing on stderr without --log");
    for (extra, env) in [(&["--log", "debug"][..], None), (&[][..], Some("debug"))] {
        let (ok, out, err) = run_logged(extra, env);
        assert!(ok, "{out}\n{err}");
        // Each span of the command is printed when it closes, with its time.
        for span in ["weave_run", "compile", "execute"] {
            assert!(
                err.lines().any(|l| l.contains(span) && l.contains("close")),
                "no closing `{span}` span with {extra:?} / WEAVE_LOG={env:?}:\n{err}"
            );
        }
        // The log stays off stdout: the report reads the same.
        assert!(out.trim_end().ends_with("result: PASS"), "{out}");
        assert!(!out.contains("close"), "{out}");
    }
    // --log wins over WEAVE_LOG; a filter that does not parse is refused.
    let (ok, _, err) = run_logged(&["--log", "weave_cli=loud"], Some("debug"));
    assert!(!ok);
    assert!(err.contains("--log `weave_cli=loud`"), "{err}");
}

/// `WEAVE_LOG_SPANS=open,close` prints each span when it opens as well (a stalled run shows
/// what it began and never finished), every line naming its thread; a word that is not a
/// span event is refused.
#[test]
fn the_log_prints_spans_when_they_open_when_asked_and_names_threads() {
    let run = |spans: &str| {
        let (ok, _, err) = weave_with_env(
            &small_run(&[]),
            &[("WEAVE_LOG", "debug"), ("WEAVE_LOG_SPANS", spans)],
        );
        (ok, err)
    };
    let (ok, err) = run("open,close");
    assert!(ok, "{err}");
    for span in ["weave_run", "execute"] {
        for event in ["new", "close"] {
            assert!(
                err.lines().any(|l| l.contains(span) && l.contains(event)),
                "no `{event}` of `{span}`:\n{err}"
            );
        }
    }
    assert!(
        err.lines().any(|l| l.contains("weave-rank-1")),
        "no line of rank 1's thread:\n{err}"
    );
    let (ok, err) = run("close");
    assert!(ok, "{err}");
    assert!(!err.lines().any(|l| l.contains(" new")), "{err}");
    let (ok, err) = run("begin");
    assert!(!ok);
    assert!(err.contains("WEAVE_LOG_SPANS=\"begin\""), "{err}");
}

/// `weave dump --passes default` prints a host program with its signature and definition;
/// `weave run` runs that text by itself, on the ranks its signature names.
#[test]
fn a_printed_host_program_runs_by_itself() {
    let dir = std::env::temp_dir().join(format!("weave-hir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (fixture, set, ranks) in [
        (
            "row_parallel_linear",
            vec!["t=12", "h=4", "d=2", "s=3"],
            "2",
        ),
        ("sequence_parallel_mlp", vec!["d=4", "t=48"], "4"),
        ("allgather", vec!["d=3"], "3"),
    ] {
        let mut args = vec!["dump", "--passes", "default"];
        let path = format!("tests/scenarios/{fixture}.weave");
        args.push(&path);
        for s in &set {
            args.extend(["--set", s]);
        }
        let (ok, hir, err) = weave(&args);
        assert!(ok, "{err}");
        assert!(hir.contains("\nSignature:\n") && hir.contains("\nDefinition: fusion"));
        let file = dir.join(format!("{fixture}.hir"));
        std::fs::write(&file, &hir).unwrap();
        let file = file.to_str().unwrap();
        // Without --ranks: the devices its signature names.
        let (ok, out, err) = weave(&["run", file, "--check-races"]);
        assert!(ok, "{fixture}: {out}\n{err}");
        assert!(
            out.contains(&format!("{ranks} rank(s) on the cpu backend")),
            "{out}"
        );
        assert!(out.contains("result: PASS"), "{out}");
        assert!(out.contains("race checker: no races"), "{out}");
    }
    // A host program's parameters and chunk count are fixed.
    let file = dir.join("row_parallel_linear.hir");
    let file = file.to_str().unwrap();
    let (ok, _, err) = weave(&["run", file, "--set", "t=24"]);
    assert!(!ok);
    assert_eq!(
        err.trim(),
        "error: --set t: a host program's parameters are fixed (its signature's `params(..)`); set them when compiling the .weave fusion"
    );
    let (ok, _, err) = weave(&["run", file, "--chunks", "2"]);
    assert!(!ok);
    assert!(
        err.contains("--chunks 2: a host program's chunk count is fixed"),
        "{err}"
    );
    let (ok, out, err) = weave(&["run", file, "--ranks", "4"]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("4 ranks were asked for but the program's meshes cover 2 device(s)"),
        "{err}"
    );
    // Without its definition there is no reference: refused unless --no-check.
    let text = std::fs::read_to_string(file).unwrap();
    let cut = text.find("Definition: ").unwrap();
    let end = cut + text[cut..].find("\n}\n").unwrap() + 3;
    let bare = dir.join("bare.hir");
    std::fs::write(&bare, format!("{}{}", &text[..cut], &text[end..])).unwrap();
    let bare = bare.to_str().unwrap();
    let (ok, _, err) = weave(&["run", bare]);
    assert!(!ok);
    assert!(
        err.contains("the program has no `Definition:` block, so there is no reference"),
        "{err}"
    );
    let (ok, out, err) = weave(&["run", bare, "--no-check", "--check-races"]);
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("reference check: skipped (--no-check)"),
        "{out}"
    );
    // Without its signature it cannot be sharded at all; a broken line names its place.
    let sig = text.find("Signature:").unwrap();
    let unsigned = dir.join("unsigned.hir");
    std::fs::write(&unsigned, &text[..sig]).unwrap();
    let (ok, _, err) = weave(&["run", unsigned.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("the host program has no `Signature:` block"),
        "{err}"
    );
    let broken = dir.join("broken.hir");
    std::fs::write(
        &broken,
        text.replace("split(Serial, outer(2, DIDx", "split(Serial, outer(2, DIDz"),
    )
    .unwrap();
    let (ok, _, err) = weave(&["run", broken.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("broken.hir:"), "{err}");
    assert!(err.contains("expected a parallel type"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cached configuration sets pool, transport and knobs; a knob given on the command line
/// wins over it, the others stay the tuned ones.
#[test]
fn knobs_on_the_command_line_win_over_the_tuned_ones() {
    let cache = streamweave::tune::TuneCache::parse(
        r#"[[entry]]
key = "00000000000000aa"
fusion = "f"
params = {}
ranks = 4
backend = "cuda"
gpu = "NVIDIA H100 80GB HBM3"
chunks = 2
streams = 2
replay = true
transport = "copy-engine"
ordered_compute = true
nccl_max_ctas = 16
median_ms = 1.5
"#,
    )
    .unwrap();
    let mut options = streamweave::RunOptions::default();
    cache.entries[0].apply(&mut options);
    assert_eq!(options.gpu.transport, streamweave::Transport::CopyEngine);
    assert!(options.gpu.overlap.ordered_compute);
    assert_eq!(options.gpu.overlap.nccl_max_ctas, Some(16));
    let pinned = weave_cli::cli::Pinned {
        ordered_compute: Some(false),
        nccl_max_ctas: Some(None),
        ..weave_cli::cli::Pinned::default()
    };
    pinned.apply(&mut options);
    assert!(!options.gpu.overlap.ordered_compute);
    assert_eq!(options.gpu.overlap.nccl_max_ctas, None);
    assert_eq!(options.gpu.transport, streamweave::Transport::CopyEngine);
    assert_eq!(options.streams, 2);
}

/// A printed host program's definition is what its run is checked against: one that
/// disagrees with the signature (another shape, element type or name of an input, an extra
/// output) is refused at load, at the `Definition:` block, naming the tensor and the
/// difference, instead of passing or being reported as `DIFFERS`.
#[test]
fn a_definition_that_disagrees_with_its_signature_is_refused_at_its_block() {
    let dir = std::env::temp_dir().join(format!("weave-hir-def-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ok, hir, err) = weave(&[
        "dump",
        "--passes",
        "default",
        "tests/scenarios/single_set_op.weave",
    ]);
    assert!(ok, "{err}");
    let def_line = hir
        .lines()
        .position(|l| l.starts_with("Definition: fusion"))
        .expect("a definition")
        + 1;
    let definition = |from: &str, to: &str| -> String {
        let (head, tail) = hir.split_at(hir.find("Definition: fusion").unwrap());
        let end = tail.find("\n}\n").unwrap();
        format!(
            "{head}{}{}",
            tail[..end].replacen(from, to, 1),
            &tail[end..]
        )
    };
    for (name, text, want) in [
        (
            "shape",
            definition("tensor tv0: f32[x, y]", "tensor tv0: f32[x - 1, y]"),
            "the definition's input 0 `tv0` has shape [11, 8] but the signature says [12, 8]",
        ),
        (
            "dtype",
            definition("tensor tv0: f32[x, y]", "tensor tv0: f64[x, y]"),
            "the definition's input 0 `tv0` is f64 but the signature says f32",
        ),
        (
            "outputs",
            definition(
                "  output tv1\n",
                "  output tv1\n  tv2 = neg(tv0)\n  output tv2\n",
            ),
            "the definition has 2 output(s) but the signature 1",
        ),
        (
            "params",
            definition(
                "fusion single_set_op(x = 12,",
                "fusion single_set_op(x = 13,",
            ),
            "the definition's parameter `x` is 13 but the signature's is 12",
        ),
    ] {
        assert_ne!(text, hir, "{name}: the edit applies");
        let file = dir.join(format!("{name}.hir"));
        std::fs::write(&file, &text).unwrap();
        let (ok, out, err) = weave(&["run", file.to_str().unwrap()]);
        assert!(!ok, "{name}: {out}");
        assert!(err.contains(want), "{name}: {err}");
        assert!(
            err.contains(&format!("{name}.hir:{def_line}:")),
            "{name}: the error points at the block: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
