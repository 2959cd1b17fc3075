//! Runs under an address-space limit (`ulimit -v`) through the `weave` binary: ranks of one
//! process share one memory budget, reserved for all of them before any allocates, and an
//! allocation that cannot be had is an error naming the buffer and its bytes — exit 1 with a
//! message, never an abort (exit 134).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A replicated f32[n] chain `z = neg(exp(x))` on `d` devices.
fn chain(n: u64, d: usize) -> String {
    format!(
        "fusion chain(n = {n}, d = {d}) {{\n  mesh m = devices(d)\n  tensor x: f32[n] on m\n  y = exp(x)\n  z = neg(y)\n  output z\n}}\n"
    )
}

/// `chain.weave` holding [`chain`]`(n, d)` in the directory `weave-{what}-{pid}` of the
/// temporary directory: the directory and the file.
fn chain_file(what: &str, n: u64, d: usize) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("weave-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("chain.weave");
    std::fs::write(&file, chain(n, d)).unwrap();
    (dir, file)
}

/// `weave run FILE ARGS` under an address-space limit of `kib` KiB.
fn run_limited(kib: u64, file: &Path, args: &str) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {kib} && exec \"{}\" run \"{}\" {args}",
            env!("CARGO_BIN_EXE_weave"),
            file.display()
        ))
        .output()
        .unwrap()
}

/// 4 ranks of a chain over 40 M elements, each of which would pass a check of its own
/// buffers (160 MB each) against a 3 GB address-space limit, need about 6.4 GB together:
/// the run is refused once, up front, naming the bytes and the largest tensors, before any
/// rank allocates — not with one rank's allocation failing half-way (as each rank checking
/// only its own allocations did), and never an abort.
#[test]
#[cfg(target_os = "linux")]
fn the_ranks_of_one_process_are_checked_together_before_any_allocates() {
    let (dir, file) = chain_file("membudget", 40_000_000, 4);
    for _ in 0..2 {
        let out = run_limited(3_000_000, &file, "--ranks 4 --no-check");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{stderr}\n{stdout}");
        for part in [
            "the 4 rank(s) of this CPU run need ",
            "6400000000 bytes (6.0 GiB) of host memory at their peak (1600000000 bytes, 1.5 GiB, a rank)",
            "are available; nothing was allocated",
            "input `x` f32[40000000] (152.6 MiB a rank)",
            "output `z` f32[40000000]",
        ] {
            assert!(stderr.contains(part), "no `{part}` in:\n{stderr}");
        }
        // Not one rank's allocation failing on its own.
        assert!(
            !stderr.contains("could not be allocated") && !stderr.contains("rank 0:"),
            "{stderr}"
        );
    }
    // The same chain at a tenth of the size fits, and runs.
    std::fs::write(&file, chain(4_000_000, 4)).unwrap();
    let out = run_limited(3_000_000, &file, "--ranks 4");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("result: PASS"),
        "{stderr}\n{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A 4-rank run of a replicated f32[n] chain whose inputs pass the up-front check but
/// whose ranks together need more than the limit: every try ends with a clear error (or,
/// where the machine's layout leaves room, a pass), never an abort.
#[test]
#[cfg(target_os = "linux")]
fn ranks_over_an_address_space_limit_fail_with_a_message_not_an_abort() {
    let (dir, file) = chain_file("memlimit", 40_000_000, 4);
    let mut failures = 0;
    for _ in 0..2 {
        let out = run_limited(3_000_000, &file, "--ranks 4 --no-check");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        match out.status.code() {
            Some(0) => {}
            Some(1) => {
                failures += 1;
                assert!(
                    stderr.contains("bytes") && stderr.contains("host memory"),
                    "no message naming the bytes:\n{stderr}\n{stdout}"
                );
            }
            other => panic!("exit {other:?} (an abort or a kill):\n{stderr}\n{stdout}"),
        }
    }
    // 40 M elements on 4 ranks need about 5 GB; under a 3 GB limit at least one try fails.
    assert!(failures > 0, "every try passed under the limit");
    let _ = std::fs::remove_dir_all(&dir);
}
