//! The `weave launch` command end to end: every rank gets the torchrun environment and its
//! output comes back prefixed with its rank; a failing rank stops the others after the grace
//! period, the timeout stops them all, and bad requests fail with a clear message. Stopping a
//! rank stops its whole process group: what a rank started, even a process that ignores
//! SIGTERM, SIGHUP and SIGINT, does not outlive the launch. The port of the ranks' store is
//! bound by the launcher and handed to rank 0, so launches at once never collide.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `weave ARGS`; returns the exit code, stdout, stderr and how long it took.
fn weave(args: &[&str]) -> (Option<i32>, String, String, Duration) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_weave"));
    run(cmd.args(args))
}

/// `weave launch -n N FLAGS -- sh -c SCRIPT`, not started yet.
fn launch_sh(n: &str, flags: &[&str], script: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_weave"));
    cmd.args(["launch", "-n", n])
        .args(flags)
        .args(["--", "sh", "-c", script]);
    cmd
}

/// Runs `cmd` in the package directory; returns the exit code, stdout, stderr and how long it
/// took.
fn run(cmd: &mut Command) -> (Option<i32>, String, String, Duration) {
    let start = Instant::now();
    let out = cmd
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
    let (code, out, err, _) = run(&mut launch_sh(
        "3",
        &[],
        "echo $RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE/$GROUP_RANK $MASTER_ADDR:$MASTER_PORT; echo to-stderr >&2",
    ));
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
    let flags = ["--master-addr", "10.1.2.3", "--master-port", "29555"];
    let script = "echo $NCCL_DEBUG $MASTER_ADDR:$MASTER_PORT";
    let (code, stdout, _, _) = run(launch_sh("1", &flags, script).env("NCCL_DEBUG", "WARN"));
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("[rank 0] WARN 10.1.2.3:29555"), "{stdout}");
}

#[test]
fn a_failing_rank_stops_the_others_after_the_grace_period() {
    let script = "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 30";
    let (code, out, err, took) = run(&mut launch_sh("3", &[], script));
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
    let (code, out, err, took) = run(&mut launch_sh("2", &["--timeout-secs", "1"], "sleep 30"));
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

/// A fresh directory for one test's pid files.
fn scratch(name: &str) -> PathBuf {
    common::scratch("launch", name)
}

/// Whether process `pid` runs (a zombie, dead and waiting for its parent to reap it, does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_string();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

/// The pids written to `dir/NAME` files, once `count` such files hold one (waits up to 10 s).
fn pids(dir: &Path, count: usize) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found: Vec<u32> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
            .filter_map(|t| t.trim().parse().ok())
            .collect();
        if found.len() >= count || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A shell line that starts a child ignoring SIGTERM, SIGHUP and SIGINT, writes the child's
/// pid to `$DIR/child_$RANK`, and then runs `then`.
fn stubborn_child(then: &str) -> String {
    format!("(trap '' TERM HUP INT; exec sleep 60) & echo $! > \"$DIR/child_$RANK\"; {then}")
}

/// Waits up to 5 s for every pid to stop running; returns those still running.
fn still_running(pids: &[u32]) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `launch_sh(n, flags, script)` with `$DIR` a fresh directory `name` in which each
/// rank's [`stubborn_child`] writes its pid; asserts the exit code `code`, that all `n` ranks
/// wrote their child's pid and that none of the children outlives the launch. Returns stderr
/// and how long the launch took.
fn launch_leaving_children(
    name: &str,
    n: usize,
    flags: &[&str],
    script: &str,
    code: i32,
) -> (String, Duration) {
    let dir = scratch(name);
    let (got, _, err, took) = run(launch_sh(&n.to_string(), flags, script).env("DIR", &dir));
    assert_eq!(got, Some(code), "{err}");
    let children = pids(&dir, n);
    assert_eq!(children.len(), n, "every rank wrote its child's pid");
    assert_eq!(
        still_running(&children),
        Vec::<u32>::new(),
        "orphans: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    (err, took)
}

#[test]
fn a_failure_stops_every_process_the_ranks_started() {
    let script = stubborn_child("if [ \"$RANK\" = 1 ]; then sleep 0.5; exit 3; fi; sleep 60");
    let (err, took) = launch_leaving_children("failure", 3, &["--grace-secs", "1"], &script, 1);
    assert!(took < Duration::from_secs(10), "{err}");
    assert!(err.contains("rank 1 exited with status 3"), "{err}");
}

#[test]
fn the_timeout_and_a_finished_rank_leave_no_process_behind() {
    // Rank 0 succeeds at once, leaving its child; rank 1 runs into the timeout.
    let script = stubborn_child("if [ \"$RANK\" = 0 ]; then exit 0; fi; sleep 60");
    let (err, _) = launch_leaving_children("timeout", 2, &["--timeout-secs", "2"], &script, 124);
    assert!(err.contains("rank 1 timed out after 2 s"), "{err}");
}

/// Starts `launch_sh("2", &[], script)` with `$DIR` a fresh directory `name`, waits until
/// `count` pids are written there (`who` wrote them) and sends the launcher `signal` (`-TERM`,
/// `-KILL`). Returns the launcher's output (its stderr goes to `stderr`), the pids and the
/// directory.
fn signal_launch(
    name: &str,
    script: &str,
    count: usize,
    who: &str,
    signal: &str,
    stderr: Stdio,
) -> (std::process::Output, Vec<u32>, PathBuf) {
    let dir = scratch(name);
    let launcher = launch_sh("2", &[], script)
        .env("DIR", &dir)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let started = pids(&dir, count);
    assert_eq!(started.len(), count, "{who} wrote their pids");
    let sent = Command::new("kill")
        .args([signal, &launcher.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    (launcher.wait_with_output().unwrap(), started, dir)
}

#[test]
fn a_signal_to_the_launcher_stops_every_rank_and_what_it_started() {
    let script = stubborn_child("echo $$ > \"$DIR/rank_$RANK\"; sleep 60");
    let who = "two ranks and their children";
    let (out, started, dir) = signal_launch("signal", &script, 4, who, "-TERM", Stdio::piped());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 15), "{err}");
    assert!(
        err.contains("rank 0 killed when the launcher got signal 15 (SIGTERM)"),
        "{err}"
    );
    assert_eq!(still_running(&started), Vec::<u32>::new(), "orphans: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A launcher killed outright (SIGKILL: nothing to catch) takes its ranks with it; and what
/// its ranks started too, even a process that ignores SIGTERM, SIGHUP and SIGINT (the rank's
/// whole process group goes, not only the rank).
#[test]
fn ranks_and_what_they_started_die_with_a_launcher_killed_outright() {
    let cases = [
        (
            "sigkill",
            "echo $$ > \"$DIR/rank_$RANK\"; exec sleep 60".to_string(),
            2,
            "both ranks",
            "ranks outlived the launcher",
        ),
        (
            "sigkill-group",
            stubborn_child("echo $$ > \"$DIR/rank_$RANK\"; wait"),
            4,
            "both ranks and their children",
            "what the ranks started outlived the launcher",
        ),
    ];
    for (name, script, count, who, outlived) in cases {
        let (_, started, dir) = signal_launch(name, &script, count, who, "-KILL", Stdio::null());
        assert_eq!(
            still_running(&started),
            Vec::<u32>::new(),
            "{name}: {outlived}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The variable that makes [`store_rank`] act as a rank of a launch (it passes otherwise).
const STORE_RANK: &str = "WEAVE_TEST_STORE_RANK";

/// One rank of [`two_launches_at_once_each_serve_their_own_store`], run by `weave launch` as
/// this test executable filtered to this test; without [`STORE_RANK`] it does nothing. While
/// every rank runs, the port in `MASTER_PORT` is taken (rank 0 holds the socket the launcher
/// bound, before it even opens its store); rank 0 serves the store on exactly that port, hands
/// its launch's id to every rank and waits until every rank has it.
#[test]
fn store_rank() {
    use weave_comm::bootstrap::{exchange_id, gather, LaunchEnv};
    let Ok(launch) = std::env::var(STORE_RANK) else {
        return;
    };
    let env = LaunchEnv::from_lookup(|name| std::env::var(name).ok())
        .unwrap()
        .expect("the launcher's variables");
    assert_eq!(env.store_fd.is_some(), env.rank == 0, "{env:?}");
    let taken = std::net::TcpListener::bind(("127.0.0.1", env.master_port)).unwrap_err();
    assert_eq!(taken.kind(), std::io::ErrorKind::AddrInUse, "{taken}");
    let store = env.open_store(Duration::from_secs(60)).unwrap();
    assert_eq!(store.is_server(), env.rank == 0);
    assert_eq!(store.local_addr().port(), env.master_port);
    let id = exchange_id(&store, env.rank, || {
        Ok(format!("the id of launch {launch}").into_bytes())
    })
    .unwrap();
    // Rank 0's store outlives the others' use of it: it has every rank's last value, and
    // lingers while its answers to those last requests reach them.
    gather(&store, env.rank, env.world, "done", b"").unwrap();
    if env.rank == 0 {
        std::thread::sleep(Duration::from_secs(1));
    }
    println!(
        "store of rank {} at port {}: {}",
        env.rank,
        env.master_port,
        String::from_utf8(id).unwrap()
    );
}

/// Two launches started at once each bind their own port and serve their own store on it:
/// every rank of a launch reaches its own rank 0 and gets its own launch's id.
#[test]
fn two_launches_at_once_each_serve_their_own_store() {
    let me = std::env::current_exe().unwrap();
    let me = me.to_str().unwrap();
    let start = |launch: &str| {
        Command::new(env!("CARGO_BIN_EXE_weave"))
            .args(["launch", "-n", "3", "--timeout-secs", "120", "--"])
            .args([
                me,
                "--exact",
                "store_rank",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(STORE_RANK, launch)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let launches = [start("a"), start("b")];
    let mut ports = Vec::new();
    for (launch, child) in ["a", "b"].into_iter().zip(launches) {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "launch {launch}:\n{stdout}\n{stderr}");
        let mut port = None;
        for rank in 0..3 {
            // The harness may print `test store_rank ... ` first on the same line.
            let prefix = format!("[rank {rank}] ");
            let marker = format!("store of rank {rank} at port ");
            let line = stdout
                .lines()
                .filter(|l| l.starts_with(&prefix))
                .find_map(|l| l.split_once(&marker).map(|(_, rest)| rest))
                .unwrap_or_else(|| panic!("launch {launch}: no line of rank {rank}:\n{stdout}"));
            let (p, id) = line.split_once(": ").unwrap();
            assert_eq!(id, format!("the id of launch {launch}"), "{stdout}");
            assert!(*port.get_or_insert(p.to_string()) == p, "{stdout}");
        }
        ports.push(port.unwrap());
    }
    assert_ne!(ports[0], ports[1]);
}

/// A port given with `--master-port` is the ranks' to bind: no socket is handed down.
#[test]
fn a_given_port_hands_no_socket_down() {
    let script = "echo $MASTER_PORT ${WEAVE_STORE_FD-none}";
    let (code, out, err, _) = run(&mut launch_sh("2", &["--master-port", "29556"], script));
    assert_eq!(code, Some(0), "{out}\n{err}");
    for rank in 0..2 {
        assert!(out.contains(&format!("[rank {rank}] 29556 none")), "{out}");
    }
    // Without it only rank 0 gets the socket.
    let script = "echo rank $RANK fd ${WEAVE_STORE_FD-none}";
    let (code, out, err, _) = run(&mut launch_sh("2", &[], script));
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("[rank 1] rank 1 fd none"), "{out}");
    let fd = out
        .lines()
        .find_map(|l| l.strip_prefix("[rank 0] rank 0 fd "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(fd.parse::<u32>().is_ok(), "{out}");
}
