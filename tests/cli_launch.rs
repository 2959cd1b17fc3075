//! The `weave launch` command end to end: every rank gets the torchrun environment and its
//! output comes back prefixed with its rank; a failing rank stops the others after the grace
//! period, the timeout stops them all, and bad requests fail with a clear message.

use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `weave ARGS`; returns the exit code, stdout, stderr and how long it took.
fn weave(args: &[&str]) -> (Option<i32>, String, String, Duration) {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_weave"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        start.elapsed(),
    )
}

#[test]
fn every_rank_gets_the_torchrun_environment_and_a_prefix() {
    let (code, out, err, _) = weave(&[
        "launch",
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "echo $RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE/$GROUP_RANK $MASTER_ADDR:$MASTER_PORT; echo to-stderr >&2",
    ]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let mut ports = Vec::new();
    for rank in 0..3 {
        let prefix = format!("[rank {rank}] {rank}/3/{rank}/3/0 127.0.0.1:");
        let line = out
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no line of rank {rank}:\n{out}"));
        let port: u16 = line[prefix.len()..].parse().expect("a port number");
        ports.push(port);
        assert!(err.contains(&format!("[rank {rank}] to-stderr")), "{err}");
    }
    assert!(ports.iter().all(|&p| p == ports[0] && p > 0), "{ports:?}");
}

#[test]
fn the_environment_passes_through_and_the_address_can_be_chosen() {
    let out = Command::new(env!("CARGO_BIN_EXE_weave"))
        .args([
            "launch",
            "-n",
            "1",
            "--master-addr",
            "10.1.2.3",
            "--master-port",
            "29555",
            "--",
            "sh",
            "-c",
            "echo $NCCL_DEBUG $MASTER_ADDR:$MASTER_PORT",
        ])
        .env("NCCL_DEBUG", "WARN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("[rank 0] WARN 10.1.2.3:29555"), "{stdout}");
}

#[test]
fn a_failing_rank_stops_the_others_after_the_grace_period() {
    let (code, out, err, took) = weave(&[
        "launch",
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 30",
    ]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert!(err.contains("rank 1 exited with status 3"), "{err}");
    for rank in [0, 2] {
        assert!(
            err.contains(&format!(
                "rank {rank} killed after the 5 s grace period that followed rank 1's failure"
            )),
            "{err}"
        );
    }
}

#[test]
fn the_timeout_names_the_ranks_still_running() {
    let (code, out, err, took) = weave(&[
        "launch",
        "-n",
        "2",
        "--timeout-secs",
        "1",
        "--",
        "sh",
        "-c",
        "sleep 30",
    ]);
    assert_eq!(code, Some(124), "{out}\n{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(err.contains("still running"), "{err}");
    assert!(err.contains("rank 0 timed out after 1 s"), "{err}");
    assert!(err.contains("rank 1 timed out after 1 s"), "{err}");
}

#[test]
fn a_missing_command_fails_clearly() {
    let (code, _, err, _) = weave(&["launch", "-n", "2", "--", "no-such-command-for-weave"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("cannot launch `no-such-command-for-weave`: no such command in PATH"),
        "{err}"
    );
    let (code, _, err, _) = weave(&["launch", "-n", "2", "--", "./no/such/file"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("cannot launch `./no/such/file`"), "{err}");
    let (code, _, err, _) = weave(&["launch", "-n", "2"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no command to launch"), "{err}");
}

#[test]
fn zero_ranks_fail_clearly() {
    let (code, _, err, _) = weave(&["launch", "-n", "0", "--", "true"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("must be at least 1, got 0"), "{err}");
}

#[test]
fn a_bare_weave_runs_this_executable() {
    let (code, out, err, _) = weave(&["launch", "-n", "2", "--", "weave", "--version"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("[rank 0] weave "), "{out}");
    assert!(out.contains("[rank 1] weave "), "{out}");
}
