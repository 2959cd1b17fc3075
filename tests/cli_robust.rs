//! Bad and extreme input through the `weave` binary: every case ends with one clear
//! `error: ` line (or the right result) and the usual exit status, never a panic, an abort or
//! a report that disagrees with itself; output files are never stale or half written.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use streamweave::executor::reference::Comparison;
use streamweave::executor::RankRun;
use streamweave::run::OutputCheck;
use streamweave::RunReport;

const SET_OP: &str = "tests/scenarios/single_set_op.weave";

fn weave_output(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weave"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("WEAVE_LOG")
        .env_remove("WEAVE_DUMP")
        .output()
        .unwrap()
}

/// `weave ARGS`: exit code, stdout, stderr; asserts that it did not panic or abort.
fn weave(args: &[&str]) -> (Option<i32>, String, String) {
    let out = weave_output(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    for bad in ["panicked", "RUST_BACKTRACE", "memory allocation of"] {
        assert!(!stderr.contains(bad), "{args:?}:\n{stderr}");
    }
    (out.status.code(), stdout, stderr)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weave-robust-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_shape_whose_element_count_overflows_is_an_error_naming_the_tensor() {
    for (x, y) in [("2147483648", "2147483648"), ("4294967296", "4294967296")] {
        let (code, _, err) = weave(&[
            "run",
            SET_OP,
            "--set",
            &format!("x={x}"),
            "--set",
            &format!("y={y}"),
        ]);
        assert_eq!(code, Some(1), "{err}");
        assert_eq!(
            err.trim(),
            format!(
                "error: input `tv0`: its global tensor: the element count of sizes [{x}, {y}] overflows"
            )
        );
    }
}

#[test]
fn a_tensor_beyond_the_host_memory_names_the_bytes_it_asks_for() {
    // 2^40 rows of 8 f32 values: 2^43 elements, held as f64 on the host: 64 TiB, and each of
    // the 2 ranks holds a whole copy.
    let (code, _, err) = weave(&["run", SET_OP, "--set", "x=1099511627776"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.starts_with(
            "error: input `tv0` f32[1099511627776, 8] (the global tensor and the shards of 2 rank(s)) needs 211106232532992 bytes (192.0 TiB) of host memory, but only "
        ),
        "{err}"
    );
    assert!(err.trim_end().ends_with("are available"), "{err}");
}

#[test]
fn the_largest_timeouts_and_grace_periods_are_no_overflow() {
    // A year is the longest timeout of every command, and runs without overflowing a
    // deadline.
    let year = "31536000";
    let (code, out, err) = weave(&["run", SET_OP, "--timeout-secs", year]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("result: PASS"), "{out}");
    let (code, _, err) = weave(&["launch", "-n", "1", "--timeout-secs", year, "--", "true"]);
    assert_eq!(code, Some(0), "{err}");
    // A failing rank starts the grace period; the others end first, so the run ends.
    let max = u64::MAX.to_string();
    let (code, _, err) = weave(&["launch", "-n", "2", "--grace-secs", &max, "--", "false"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("launch: 2 of 2 rank(s) failed"), "{err}");
}

#[test]
fn a_timeout_beyond_a_year_is_refused_naming_the_flag() {
    let cases: [&[&str]; 4] = [
        &["run", SET_OP],
        &["launch", "-n", "1"],
        &["tune", SET_OP],
        &["calibrate"],
    ];
    let max = u64::MAX.to_string();
    for args in cases {
        for value in ["31536001", max.as_str(), "0"] {
            let mut full: Vec<&str> = args.to_vec();
            full.extend(["--timeout-secs", value]);
            if args[0] == "launch" {
                full.extend(["--", "true"]);
            }
            let (code, out, err) = weave(&full);
            // clap's usage error: status 2, the flag and the accepted range named, nothing run.
            assert_eq!(code, Some(2), "{full:?}:\n{out}\n{err}");
            assert!(
                err.contains(&format!("invalid value '{value}' for '--timeout-secs"))
                    && err.contains("1..=31536000"),
                "{full:?}:\n{err}"
            );
            assert!(out.is_empty(), "{full:?}:\n{out}");
        }
    }
}

/// Runs `weave ARGS` with its stdout a pipe whose reading end is closed before it starts.
#[cfg(unix)]
fn with_closed_stdout(args: &[&str]) -> (std::process::ExitStatus, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child = Command::new(env!("CARGO_BIN_EXE_weave"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("WEAVE_LOG")
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (child.wait().unwrap(), err)
}

#[cfg(unix)]
#[test]
fn a_closed_pipe_ends_every_command_quietly_as_sigpipe_does() {
    use std::os::unix::process::ExitStatusExt;
    let cases: [&[&str]; 4] = [
        &["run", SET_OP],
        &["dump", SET_OP, "--passes", "default"],
        &["dump", "--list-passes"],
        &["run", SET_OP, "--no-check", "--streams", "3"],
    ];
    for args in cases {
        let (status, err) = with_closed_stdout(args);
        // The process ends as `yes | head -1` does: by SIGPIPE, silently (the shell says 141).
        assert_eq!(status.signal(), Some(13), "{args:?}: {status:?}\n{err}");
        assert_eq!(err, "", "{args:?}");
    }
    // And through a real shell pipeline, `head` closing early.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "\"{}\" run {SET_OP} | head -1; echo \"status ${{PIPESTATUS:-}}\"",
            env!("CARGO_BIN_EXE_weave")
        ))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.starts_with("tests/scenarios/single_set_op.weave: 2 rank(s)"),
        "{stdout}"
    );
    assert!(
        !stderr.contains("Broken pipe") && !stderr.contains("panicked"),
        "{stderr}"
    );
}

#[test]
fn rank_counts_beyond_the_limit_are_refused_before_compiling() {
    let (code, _, err) = weave(&["run", SET_OP, "--ranks", "5000"]);
    assert_eq!(code, Some(1));
    assert_eq!(
        err.trim(),
        "error: 5000 ranks were asked for; one process runs at most 1024 ranks on its threads (start one process per rank with `weave launch` for more)"
    );
    let (code, _, err) = weave(&["run", "tests/scenarios/allreduce.weave", "--ranks", "65536"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("at most 1024 ranks"), "{err}");
}

#[cfg(target_os = "linux")]
#[test]
fn a_thread_the_system_refuses_is_an_error_naming_the_rank() {
    // Threads of 1 GiB stacks (RUST_MIN_STACK) under a 4 GiB address-space limit: a few
    // rank threads start, the next is refused with most of the memory the process needs for
    // everything else still free (one malloc arena, so threads take no address space of
    // their own beyond their stacks).
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 4194304 && exec \"{}\" run {SET_OP} --ranks 8",
            env!("CARGO_BIN_EXE_weave")
        ))
        .env("RUST_MIN_STACK", "1073741824")
        .env("MALLOC_ARENA_MAX", "1")
        .env_remove("WEAVE_LOG")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("error: cannot start the thread of rank "),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn stream_splits_beyond_the_loop_limit_are_refused() {
    for s in ["4294967295", "65537"] {
        let (code, _, err) = weave(&["run", SET_OP, "--set", &format!("s={s}")]);
        assert_eq!(code, Some(1), "{err}");
        assert_eq!(
            err.trim(),
            format!("error: tensor `tv0` is split into {s} stream chunks; a stream loop runs at most 65536 (choose a smaller chunk count)")
        );
    }
}

fn check(output: &str, rank: usize, comparison: Comparison) -> OutputCheck {
    OutputCheck {
        output: output.into(),
        rank,
        comparison,
    }
}

fn comparison(max_abs: f64, mismatches: usize) -> Comparison {
    Comparison {
        max_abs,
        max_rel: max_abs,
        worst: Some(0),
        mismatches,
        ok: mismatches == 0,
        max_ref: 1.0,
        actual_len: 4,
        expected_len: 4,
        nan_expected: 0,
        nan_actual: 0,
    }
}

#[test]
fn a_failing_output_shows_a_failing_rank_and_the_verdict_says_why() {
    // Rank 0 is within tolerance with the larger absolute error; rank 1 fails.
    let report = RunReport {
        outputs: None,
        ranks: vec![RankRun::default(), RankRun::default()],
        checks: vec![
            check("y", 0, comparison(1e-3, 0)),
            check("y", 1, comparison(1e-4, 2)),
            check("z", 0, comparison(0.0, 0)),
            check("z", 1, comparison(0.0, 0)),
        ],
        reference_time: Duration::ZERO,
        run_time: Duration::ZERO,
        config: None,
    };
    let text = weave_cli::cli::render_report(&report, false);
    let line = text.lines().find(|l| l.starts_with("output y")).unwrap();
    assert_eq!(
        line,
        "output y: DIFFERS from the reference on 1 of 2 rank(s) (worst: rank 1: max abs error 1.0e-4 (1.0e-4 relative to max |ref| 1.00e0), 2 mismatches, worst at index 0)"
    );
    assert!(
        text.contains("output z: matches the reference on 2 rank(s)"),
        "{text}"
    );
    assert_eq!(
        weave_cli::cli::failures(&report).as_deref(),
        Some("output y differs from the reference on 1 rank(s)")
    );
}

#[test]
fn the_trace_and_its_svg_never_collide() {
    let dir = scratch("trace");
    let trace = dir.join("t.svg");
    let (code, _, err) = weave(&["run", SET_OP, "--trace", s(&trace)]);
    assert_eq!(code, Some(1));
    assert!(
        err.starts_with(&format!(
            "error: --trace {}: the trace is a Chrome trace",
            trace.display()
        )),
        "{err}"
    );
    assert!(!trace.exists());
    // When the SVG cannot be written, the error names the SVG.
    let trace = dir.join("t.json");
    std::fs::create_dir(dir.join("t.svg")).unwrap();
    let json = dir.join("summary.json");
    let (code, _, err) = weave(&["run", SET_OP, "--trace", s(&trace), "--json", s(&json)]);
    assert_eq!(code, Some(1));
    let svg = dir.join("t.svg");
    assert!(
        err.starts_with(&format!("error: cannot write {}: ", svg.display())),
        "{err}"
    );
    let summary = std::fs::read_to_string(&json).unwrap();
    assert!(summary.contains("\"passed\":false"), "{summary}");
    assert!(
        summary.contains(&format!("cannot write {}", svg.display())),
        "{summary}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_failed_run_never_leaves_an_earlier_passing_summary() {
    let dir = scratch("json");
    let json = dir.join("summary.json");
    let (code, _, _) = weave(&["run", SET_OP, "--json", s(&json)]);
    assert_eq!(code, Some(0));
    assert!(std::fs::read_to_string(&json)
        .unwrap()
        .contains("\"passed\":true"));
    let failing: [&[&str]; 3] = [
        &["--set", "x=4294967296", "--set", "y=4294967296"],
        &["--ranks", "5000"],
        &["--set", "nope=1"],
    ];
    for extra in failing {
        std::fs::write(&json, "{\"passed\":true}\n").unwrap();
        let mut args = vec!["run", SET_OP, "--json", s(&json)];
        args.extend_from_slice(extra);
        let (code, _, err) = weave(&args);
        assert_eq!(code, Some(1), "{extra:?}");
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(summary["passed"], false, "{extra:?}");
        let message = err.trim().strip_prefix("error: ").unwrap();
        assert_eq!(summary["error"], message, "{extra:?}");
    }
    // No temporary file is left beside the summary.
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(names.len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn non_utf8_sources_are_refused_at_the_line_and_column_of_the_first_bad_byte() {
    let dir = scratch("utf8");
    let weave_file = dir.join("bad.weave");
    std::fs::write(
        &weave_file,
        b"fusion f(n = 4) {\n  tensor \xc3\xa9x\xff: f32[n]\n}\n",
    )
    .unwrap();
    let hir = dir.join("bad.hir");
    std::fs::write(&hir, b"%HostIrContainer\n\xfe\n").unwrap();
    let want = |f: &Path, pos: &str, byte: &str, offset: usize| {
        format!(
            "{}:{pos}: the file is not UTF-8 text: byte {byte} at byte offset {offset}",
            f.display()
        )
    };
    let (code, _, err) = weave(&["run", s(&weave_file)]);
    assert_eq!(code, Some(1));
    assert_eq!(
        err.trim(),
        format!("error: {}", want(&weave_file, "2:12", "0xff", 30))
    );
    let (code, _, err) = weave(&["run", s(&hir)]);
    assert_eq!(code, Some(1));
    assert_eq!(
        err.trim(),
        format!("error: {}", want(&hir, "2:1", "0xfe", 17))
    );
    let (code, _, err) = weave(&["dump", s(&weave_file)]);
    assert_eq!(code, Some(1));
    assert!(
        err.starts_with("error: the file is not UTF-8 text: byte 0xff at byte offset 30\n"),
        "{err}"
    );
    assert!(
        err.contains(&format!("--> {}:2:12\n", weave_file.display())),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_message_carries_two_error_labels() {
    let dir = scratch("labels");
    let bad = dir.join("bad.weave");
    std::fs::write(
        &bad,
        "fusion f(n = 4) {\n  tensor a: f32[n]\n  b = addd(a, a)\n}\n",
    )
    .unwrap();
    let bad_hir = dir.join("bad.hir");
    std::fs::write(&bad_hir, "%HostIrContainer { nonsense }\n").unwrap();
    let binary = dir.join("bin.weave");
    std::fs::write(&binary, b"\xff\xfe").unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["run", "no/such.weave"],
        vec!["dump", "no/such.weave"],
        vec!["run", s(&bad)],
        vec!["dump", s(&bad)],
        vec!["run", s(&bad_hir)],
        vec!["run", s(&binary)],
        vec!["dump", s(&binary)],
        vec!["run", SET_OP, "--set", "nope=1"],
        vec!["dump", SET_OP, "--set", "nope=1"],
        vec!["dump", SET_OP, "--passes", "no-such-pass"],
        vec!["run", SET_OP, "--backend", "tpu"],
        vec!["run", SET_OP, "--ranks", "0"],
        vec![
            "run",
            SET_OP,
            "--set",
            "x=4294967296",
            "--set",
            "y=4294967296",
        ],
        vec!["run", SET_OP, "--trace", "t.svg"],
        vec!["launch", "-n", "0", "--", "true"],
    ];
    for args in cases {
        let (code, out, err) = weave(&args);
        assert_ne!(code, Some(0), "{args:?}");
        assert!(
            err.starts_with("error: ") || err.starts_with("launch: "),
            "{args:?}: {err}"
        );
        for line in out.lines().chain(err.lines()) {
            assert!(!line.contains("error: error:"), "{args:?}: {line}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
