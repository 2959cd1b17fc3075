//! `weave tune` end to end on the CPU backend: it measures the candidate configurations of a
//! scenario, prints them with the winner marked and writes the tuning cache; `weave run
//! --chunks auto` then runs the cached configuration and says so, unless `--streams` or
//! `--chunks` decide, or the program differs; a corrupt cache is an error naming the file
//! and the line.

use std::path::Path;
use std::process::Command;

use streamweave::tune::TuneCache;

mod common;

/// `weave ARGS` with the tuning cache at `cache`: success, stdout, stderr.
fn weave(args: &[&str], cache: &Path) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_weave"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("WEAVE_LOG")
        .env("WEAVE_TUNE_CACHE", cache)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const SCENARIO: &str = "tests/scenarios/row_parallel_linear.weave";

/// `weave tune FILE` on 2 CPU ranks with 2 timed runs per candidate.
fn cpu_tune(file: &str) -> Vec<&str> {
    vec![
        "tune",
        file,
        "--ranks",
        "2",
        "--backend",
        "cpu",
        "--iters",
        "2",
    ]
}

#[test]
fn tune_caches_the_winner_and_run_uses_it() {
    let dir = std::env::temp_dir().join(format!("weave-cli-tune-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = dir.join("cache/tune.toml");
    let small = ["--set", "t=48", "--set", "h=8"];
    let mut args = cpu_tune(SCENARIO);
    args.extend(["--warmup", "1"]);
    args.extend(small);
    let (ok, out, err) = weave(&args, &cache);
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("tuning on 2 rank(s) of the cpu backend, 1 warm-up and 2 timed run(s)"),
        "{out}"
    );
    // S ∈ {1, 2, 4, 8} and the ring form in 1, 2 and 4 pieces a step (2, 4 and 8 chunks),
    // × K ∈ {1, 2, 4}, eager on the CPU; pools larger than the chunk count are skipped;
    // exactly one winner.
    let rows: Vec<&str> = out.lines().filter(|l| l.contains(" K=")).collect();
    assert_eq!(rows.len(), 22, "{out}"); // 21 candidates and the `tuned:` line
    for k in [1, 2, 4] {
        let ring = format!("ring:{k} S={} K=2 eager", 2 * k);
        assert!(
            out.lines().any(|l| l.contains(&ring) && l.contains(" ms")),
            "{ring} not measured\n{out}"
        );
    }

    // `--copy-engines on|off` (a bare flag says `on`, the default) lets the copy-engine
    // transport among the GPU knobs or leaves it out: on CPU ranks, which have no knobs, the
    // same candidates are measured either way; any other word is refused.
    for (i, words) in [&["--copy-engines"][..], &["--copy-engines", "off"]]
        .into_iter()
        .enumerate()
    {
        let mut with = args.clone();
        with.extend(words);
        let ce_cache = dir.join(format!("ce{i}/tune.toml"));
        let (ok, ce_out, err) = weave(&with, &ce_cache);
        assert!(ok, "{ce_out}\n{err}");
        let ce_rows = ce_out.lines().filter(|l| l.contains(" K=")).count();
        assert_eq!(ce_rows, 22, "{ce_out}");
        assert!(!ce_out.contains("copy-engine"), "{ce_out}");
    }
    let mut bad = args.clone();
    bad.extend(["--copy-engines", "maybe"]);
    let (ok, _, err) = weave(&bad, &dir.join("bad/tune.toml"));
    assert!(!ok);
    assert!(
        err.contains("invalid value 'maybe' for '--copy-engines [<on|off>]'"),
        "{err}"
    );
    assert_eq!(out.matches("the same run as K=").count(), 4, "{out}");
    let winners = out
        .lines()
        .filter(|l| l.starts_with("* S=") || l.starts_with("* ring:"))
        .count();
    assert_eq!(winners, 1, "{out}");
    assert!(out.contains(" ms\n"), "{out}");
    let cached = TuneCache::load(&cache).unwrap();
    assert_eq!(cached.entries.len(), 1, "{}", cached.render());
    let entry = &cached.entries[0];
    assert_eq!(
        (entry.fusion.as_str(), entry.ranks, entry.backend.as_str()),
        ("row_parallel_linear", 2, "cpu")
    );
    assert!(!entry.replay);
    let winner = entry.candidate().to_string();
    assert!(
        out.contains(&format!("* {winner}")) && out.contains(&format!("tuned: {winner} at ")),
        "{winner}\n{out}"
    );
    assert!(out.contains(&cache.display().to_string()), "{out}");

    // `weave run` with `--chunks auto` (the default) runs the cached configuration.
    let mut run = vec!["run", SCENARIO, "--ranks", "2"];
    run.extend(small);
    let (ok, out, err) = weave(&run, &cache);
    assert!(ok, "{out}\n{err}");
    common::assert_ran_tuned(&out, &winner, &cache, entry.streams);
    // `--streams`, a fixed chunk count, or another program leave the cache aside.
    for extra in [
        &["--ranks", "2", "--streams", "2"][..],
        &["--ranks", "2", "--chunks", "3"][..],
        &["--ranks", "2", "--set", "t=96"][..],
        &["--ranks", "1"][..],
    ] {
        let mut args = vec!["run", SCENARIO];
        args.extend(small);
        args.extend(extra);
        let (ok, out, err) = weave(&args, &cache);
        assert!(ok, "{extra:?}: {out}\n{err}");
        assert!(!out.contains("chunks: tuned"), "{extra:?}: {out}");
    }

    // A corrupt cache is an error naming the file and the line.
    std::fs::write(&cache, "[[entry]]\nkey = \"x\"\nstreams = many\n").unwrap();
    let (ok, out, err) = weave(&run, &cache);
    assert!(!ok, "{out}");
    assert!(
        err.starts_with(&format!("error: {}", cache.display())) && err.contains("line 3"),
        "{err}"
    );
    let (ok, _, err) = weave(&args, &cache);
    assert!(!ok);
    assert!(err.contains("line 3"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tune_refuses_to_set_the_chunk_count_and_a_host_program() {
    let cache = std::env::temp_dir().join(format!("weave-cli-tune-no-{}.toml", std::process::id()));
    let (ok, _, err) = weave(&["tune", SCENARIO, "--set", "s=3"], &cache);
    assert!(!ok);
    assert_eq!(
        err.trim_end(),
        "error: --set s: the chunk count is what `weave tune` chooses; leave it out"
    );
    let (ok, _, err) = weave(&["tune", SCENARIO, "--iters", "0"], &cache);
    assert!(!ok);
    assert!(err.contains("--iters 0"), "{err}");
    let (ok, _, err) = weave(&["tune", SCENARIO, "--backend", "tpu"], &cache);
    assert!(!ok);
    assert!(err.contains("unknown backend"), "{err}");
    assert!(!cache.exists());
}

/// A ring written with one stream chunk per device has no chunk-count parameter: `weave tune`
/// measures its S = 1 (the Stream axes serially: the collective form) beside the ring as
/// written at every pool size up to its two chunks, and `weave run` runs the cached winner,
/// whichever it is.
#[test]
fn tune_measures_a_ring_and_its_collective_and_run_uses_the_winner() {
    const RING: &str = "tests/scenarios/matmul_rs_ring.weave";
    let dir = std::env::temp_dir().join(format!("weave-cli-tune-ring-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = dir.join("tune.toml");
    let small = ["--set", "t=16", "--set", "h=8"];
    let mut args = cpu_tune(RING);
    args.extend(small);
    let (ok, out, err) = weave(&args, &cache);
    assert!(ok, "{out}\n{err}");
    for row in [
        "S=1 K=1 eager",
        "S=as written K=1 eager",
        "S=as written K=2 eager",
    ] {
        assert!(
            out.lines()
                .any(|l| l.trim_start_matches(['*', ' ']).starts_with(row)),
            "{row}\n{out}"
        );
    }
    // Two chunks as written use at most two streams.
    assert!(
        out.lines().any(|l| l.contains("S=as written K=4 eager")
            && l.contains("skipped: 2 chunk(s) use at most 2 stream(s): the same run as K=2")),
        "{out}"
    );
    let entry = TuneCache::load(&cache).unwrap().entries[0].clone();
    let winner = entry.candidate().to_string();
    let mut run = vec!["run", RING, "--ranks", "2"];
    run.extend(small);
    let (ok, out, err) = weave(&run, &cache);
    assert!(ok, "{out}\n{err}");
    common::assert_ran_tuned(&out, &winner, &cache, entry.streams);
    let serial = entry.chunks == Some(1);
    assert_eq!(out.contains("collectives: ReduceScatter"), serial, "{out}");
    assert_eq!(out.contains("send/recv"), !serial, "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
