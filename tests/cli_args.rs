//! Counts, sizes and durations on the `weave` command line: each is checked when the command
//! line is parsed, with the flag's name in the error (never wrapped, never quietly changed),
//! and every flag either has its documented effect or is refused for the case at hand.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SET_OP: &str = "tests/scenarios/single_set_op.weave";
const ROW_PARALLEL: &str = "tests/scenarios/row_parallel_linear.weave";
/// A fusion without a chunk-count parameter.
const ALLGATHER: &str = "tests/scenarios/allgather.weave";

/// `weave ARGS` with a scratch tuning cache, killed after `limit`: exit code (`None` when
/// killed), stdout, stderr, how long it ran. Asserts that it did not panic.
fn weave_within(args: &[&str], limit: Duration) -> (Option<i32>, String, String, Duration) {
    let cache = std::env::temp_dir().join(format!("weave-cli-args-{}.toml", std::process::id()));
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_weave"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("WEAVE_LOG")
        .env_remove("WEAVE_DUMP")
        .env("WEAVE_TUNE_CACHE", &cache)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = start.elapsed();
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    let _ = std::fs::remove_file(&cache);
    assert!(!err.contains("panicked"), "{args:?}:\n{err}");
    (code, out, err, took)
}

fn weave(args: &[&str]) -> (Option<i32>, String, String) {
    let (code, out, err, _) = weave_within(args, Duration::from_secs(120));
    (code, out, err)
}

/// Asserts that `args` are refused when parsed (clap's usage error, exit status 2), naming
/// `flag`.
fn refused(args: &[&str], flag: &str) {
    let (code, out, err) = weave(args);
    assert_eq!(code, Some(2), "{args:?}:\n{out}\n{err}");
    assert!(err.contains(&format!("'{flag} ")), "{args:?}: {err}");
    assert!(out.is_empty(), "{args:?}: {out}");
}

#[test]
fn counts_beyond_their_maxima_are_refused_by_flag() {
    let max = u64::MAX.to_string();
    refused(&["tune", SET_OP, "--warmup", &max], "--warmup");
    refused(&["tune", SET_OP, "--warmup", "1000001"], "--warmup");
    refused(&["tune", SET_OP, "--iters", &max], "--iters");
    refused(&["run", SET_OP, "--streams", &max], "--streams");
    refused(&["run", SET_OP, "--streams", "65"], "--streams");
    refused(&["run", SET_OP, "--streams", "0"], "--streams");
    refused(&["run", SET_OP, "--warmup", &max], "--warmup");
    refused(&["run", SET_OP, "--iters", "1000001"], "--iters");
    refused(
        &["run", SET_OP, "--tune-budget-secs", "0"],
        "--tune-budget-secs",
    );
    refused(
        &["run", SET_OP, "--tune-budget-secs", &max],
        "--tune-budget-secs",
    );
    // The largest accepted pool runs.
    let (code, out, err) = weave(&["run", SET_OP, "--streams", "64"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("result: PASS"), "{out}");
}

#[test]
fn the_tunings_copy_engine_switch_takes_on_or_off() {
    refused(
        &["run", SET_OP, "--tune-copy-engines", "maybe"],
        "--tune-copy-engines",
    );
    refused(
        &["run", SET_OP, "--tune-copy-engines"],
        "--tune-copy-engines",
    );
    refused(&["tune", SET_OP, "--copy-engines", "yes"], "--copy-engines");
    // `off` leaves a CPU run as it is; `on` (what a GPU tuning does unless told) asks a GPU
    // tuning, so said outright it is refused on the CPU and with `--no-tune`, naming why.
    let (code, out, err) = weave(&["run", SET_OP, "--tune-copy-engines", "off"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("result: PASS"), "{out}");
    for (args, why) in [
        (
            &["run", SET_OP, "--tune-copy-engines", "on"][..],
            "error: --tune-copy-engines on needs --backend cuda",
        ),
        (
            &[
                "run",
                SET_OP,
                "--backend",
                "cuda",
                "--no-tune",
                "--tune-copy-engines",
                "on",
            ][..],
            "error: --tune-copy-engines on asks the first run's tuning, which --no-tune turns off",
        ),
    ] {
        let (code, out, err) = weave(args);
        assert_eq!(code, Some(1), "{args:?}:\n{out}\n{err}");
        assert_eq!(err.trim_end(), why, "{args:?}");
        assert!(out.is_empty(), "{out}");
    }
}

#[test]
fn a_zero_timeout_is_refused_not_rounded_up() {
    refused(&["run", SET_OP, "--timeout-secs", "0"], "--timeout-secs");
    refused(&["tune", SET_OP, "--timeout-secs", "0"], "--timeout-secs");
    refused(&["calibrate", "--timeout-secs", "0"], "--timeout-secs");
    refused(
        &["launch", "-n", "1", "--timeout-secs", "0", "--", "true"],
        "--timeout-secs",
    );
}

#[test]
fn warm_up_runs_need_the_cuda_backend_as_timed_runs_do() {
    for args in [
        &["run", SET_OP, "--warmup", "1"][..],
        &["run", SET_OP, "--backend", "cpu", "--warmup", "2"][..],
    ] {
        let (code, out, err) = weave(args);
        assert_eq!(code, Some(1), "{args:?}:\n{out}\n{err}");
        assert_eq!(
            err.trim_end(),
            "error: --warmup needs --backend cuda",
            "{args:?}"
        );
    }
    let (code, out, err) = weave(&["run", SET_OP, "--warmup", "0"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
}

#[test]
fn a_chunk_count_for_a_fusion_without_chunks_is_refused() {
    let (code, out, err) = weave(&["run", ALLGATHER, "--chunks", "4"]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        err.contains("--chunks 4: `allgather` has no chunk-count parameter"),
        "{err}"
    );
    assert!(!out.contains("result: PASS"), "{out}");
    // Without --chunks (auto) the fusion runs as written.
    let (code, out, err) = weave(&["run", ALLGATHER]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("result: PASS"), "{out}");
}

/// A fusion with Stream axes and no chunk-count parameter (a ring written with one stream
/// chunk per device) takes `--chunks 1`: its Stream axes run serially and the ring becomes
/// its collective, checked against the reference. A multiple of its chunks cuts the ring's
/// steps into pieces; any other count is refused.
#[test]
fn one_chunk_runs_a_ring_as_its_collective_and_a_multiple_cuts_its_steps() {
    const RING: &str = "tests/scenarios/matmul_rs_ring.weave";
    let small = [
        "--ranks", "2", "--set", "d=2", "--set", "t=16", "--set", "h=8",
    ];
    let run = |extra: &[&str]| {
        let mut args = vec!["run", RING];
        args.extend_from_slice(&small);
        args.extend_from_slice(extra);
        weave(&args)
    };
    let (code, out, err) = run(&["--chunks", "1"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains("0 loop(s), 0 kernel launch(es), 1 GEMM(s), collectives: ReduceScatter"),
        "{out}"
    );
    assert!(out.contains("result: PASS"), "{out}");
    assert!(out.contains("config: S=1 K="), "{out}");
    let (code, out, err) = run(&[]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("2 send/recv"), "{out}");
    assert!(out.contains("config: S=as written K="), "{out}");
    // Its own chunk count is the ring as written; a multiple of it cuts the ring's steps
    // into pieces summed in the GEMMs (no kernel adds); any other count is refused.
    let (code, out, err) = run(&["--chunks", "2"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("config: S=as written K="), "{out}");
    let (code, out, err) = run(&["--chunks", "4"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains("0 kernel launch(es), 1 GEMM(s), 2 send/recv"),
        "{out}"
    );
    assert!(
        out.contains("config: S=4 (ring steps in 2 pieces) K="),
        "{out}"
    );
    assert!(out.contains("result: PASS"), "{out}");
    let (code, out, err) = run(&["--chunks", "3"]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        err.contains(
            "--chunks 3: `matmul_rs_ring` has no chunk-count parameter (declared `s: chunks` or the extent of its Stream axes) to set; its stream loops run 2 chunks, so it takes 1 (serial), 2 (as written) or a multiple of 2 (a ring's steps in pieces)"
        ),
        "{err}"
    );
    // Pieces that do not divide the rows are refused, naming them.
    let mut args = vec!["run", RING, "--ranks", "2", "--set", "t=18", "--set", "h=8"];
    args.extend_from_slice(&["--chunks", "4"]);
    let (code, out, err) = weave(&args);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        err.contains("ring-pieces=2: the 18 rows of `p_partial` do not fall into 2 device blocks of 2 equal pieces (4 pieces)"),
        "{err}"
    );
}

/// A chunk count that would size the data (`x: f32[s, n, h]`: `s` micro-batches, each a
/// stream chunk) is refused by `--chunks`, and `--chunks auto` leaves it as written: another
/// value runs other data, not other chunks. Chunks that only regroup the rows
/// (`inp: bf16[s, d, t / (s * d), h]`) are chosen freely.
#[test]
fn a_chunk_count_that_would_change_the_data_is_refused() {
    const GRADS: &str = "tests/scenarios/mlp_backward_weight_grads.weave";
    let (code, out, err) = weave(&["run", GRADS, "--chunks", "1"]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        err.contains(
            "--chunks 1: `s` = 1 would change the data, not its chunks: tensor `x` is [2, 12, 8] \
             with `s` = 2 and [1, 12, 8] with `s` = 1"
        ),
        "{err}"
    );
    let (code, out, err) = weave(&["run", GRADS]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("result: PASS"), "{out}");
    // Rows regrouped: t = 64 in 4 chunks of 2 devices' blocks of 8 rows, or 2 chunks of 16,
    // run; 40 rows do not cut into 8 chunks of 2 devices' blocks: refused, not truncated to 32.
    let refused = "--chunks 8: `s` = 8 would change the data, not its chunks: tensor `inp` is \
                   [4, 2, 5, 8] with `s` = 4 and [8, 2, 2, 8] with `s` = 8";
    for (t, chunks, error) in [
        ("64", "4", None),
        ("64", "2", None),
        ("40", "8", Some(refused)),
    ] {
        let (code, out, err) = weave(&[
            "run",
            "tests/scenarios/column_parallel_chunked.weave",
            "--set",
            &format!("t={t}"),
            "--set",
            "h=8",
            "--chunks",
            chunks,
        ]);
        match error {
            None => {
                assert_eq!(code, Some(0), "t={t} --chunks {chunks}: {out}\n{err}");
                assert!(out.contains("result: PASS"), "{out}");
            }
            Some(e) => {
                assert_eq!(code, Some(1), "t={t} --chunks {chunks}: {out}\n{err}");
                assert!(err.contains(e), "{err}");
            }
        }
    }
}

/// The timeout bounds each candidate's warm-up and timed runs together: a million warm-up
/// runs stop after the timeout, as a failed candidate, instead of running for hours.
#[test]
fn the_tuning_timeout_bounds_each_candidate() {
    let (code, out, err, took) = weave_within(
        &[
            "tune",
            ROW_PARALLEL,
            "--set",
            "t=48",
            "--set",
            "h=8",
            "--warmup",
            "1000000",
            "--iters",
            "1",
            "--timeout-secs",
            "1",
        ],
        Duration::from_secs(90),
    );
    assert_eq!(code, Some(1), "took {took:?}:\n{out}\n{err}");
    assert!(
        out.contains("failed: timed out after 1.0 s"),
        "{out}\n{err}"
    );
    assert!(err.contains("no candidate could be measured"), "{err}");
}

/// The load judges the sizes a run binds: with `--ranks 3` and no `--set d`, the mesh size is
/// 3 when the schedules are checked, so t = 21 (divisible by 3, not by the source's d = 2)
/// runs, and t = 20 is refused naming 3 devices; `weave tune` loads the same way.
#[test]
fn the_load_checks_the_mesh_size_the_ranks_give() {
    const RING: &str = "tests/scenarios/sequence_parallel_mlp_ring.weave";
    let sizes = |t: &'static str| ["--set", t, "--set", "h=6", "--set", "f=9"];
    let (code, out, err) = weave(&[&["run", RING, "--ranks", "3"][..], &sizes("t=21")].concat());
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("matches the reference on 3 rank(s)"), "{out}");
    assert!(out.trim_end().ends_with("result: PASS"), "{out}");
    let (code, out, err) = weave(&[&["run", RING, "--ranks", "3"][..], &sizes("t=20")].concat());
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        err.contains("axis 0 has extent 20 (`t`), not divisible by 3 devices (DIDx)"),
        "{err}"
    );
    let cache = std::env::temp_dir().join(format!("weave-load-ranks-{}.toml", std::process::id()));
    let tune = [
        &[
            "tune",
            RING,
            "--ranks",
            "3",
            "--backend",
            "cpu",
            "--iters",
            "1",
        ][..],
        &sizes("t=21"),
        &["--cache", cache.to_str().unwrap()],
    ]
    .concat();
    let (code, out, err) = weave(&tune);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("tuned: "), "{out}");
    let _ = std::fs::remove_file(&cache);
}
