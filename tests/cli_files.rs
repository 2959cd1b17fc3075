//! The files `weave` reads and writes, of every kind: output paths that are links, devices,
//! FIFOs or directories are written through or refused, never replaced; new files follow the
//! umask; input files are read with a size cap (`/dev/zero` fails fast); an earlier run's
//! trace never outlives the next run; a signal in the middle of a write (held open by the
//! hidden `WEAVE_TEST_HOLD_WRITES_MS`) leaves no temporary, no half file and no trace without
//! its timeline.

mod common;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SET_OP: &str = "tests/scenarios/single_set_op.weave";

/// `program ARGS` in the package's directory, without `WEAVE_LOG` and `WEAVE_DUMP`, stdin
/// empty, stdout and stderr piped; not started yet.
fn command(program: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("WEAVE_LOG")
        .env_remove("WEAVE_DUMP")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Reads `from` to its end on another thread.
fn read_to_end(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = from.read_to_end(&mut s);
        s
    })
}

/// `program ARGS` in the package's directory, killed after `limit`: exit code (`None` when
/// killed), stdout, stderr. Asserts that it did not panic or abort.
fn run_in(program: &str, args: &[&str], limit: Duration) -> (Option<i32>, String, String) {
    let mut child = command(program, args).spawn().unwrap();
    let out = read_to_end(child.stdout.take().unwrap());
    let err = read_to_end(child.stderr.take().unwrap());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = String::from_utf8_lossy(&out.join().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&err.join().unwrap()).into_owned();
    let status = status.unwrap_or_else(|| panic!("{args:?} still running after {limit:?}"));
    for bad in ["panicked", "RUST_BACKTRACE", "memory allocation of"] {
        assert!(!stderr.contains(bad), "{args:?}:\n{stderr}");
    }
    (status.code(), stdout, stderr)
}

fn weave(args: &[&str]) -> (Option<i32>, String, String) {
    run_in(env!("CARGO_BIN_EXE_weave"), args, Duration::from_secs(120))
}

/// Runs `weave ARGS`: it fails with exit status 1 and a message that holds `error`.
fn fails_with(args: &[&str], error: &str) {
    let (code, _, err) = weave(args);
    assert_eq!(code, Some(1), "{args:?}: {err}");
    assert!(err.contains(error), "{args:?}: {err}");
}

/// A fresh directory for one test's files (see [`common::scratch`]).
fn scratch(name: &str) -> PathBuf {
    common::scratch("files", name)
}

/// A fresh scratch directory `name` ([`scratch`]) and the paths of the files `files` in it.
fn scratch_with<const N: usize>(name: &str, files: [&str; N]) -> (PathBuf, [PathBuf; N]) {
    let dir = scratch(name);
    let paths = files.map(|f| dir.join(f));
    (dir, paths)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Runs `weave run SET_OP --json LINK`: it passes and `link` is still a symbolic link.
fn json_summary_through(link: &Path) {
    let (code, _, err) = weave(&["run", SET_OP, "--json", s(link)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(std::fs::symlink_metadata(link)
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn a_json_summary_to_a_symbolic_link_is_written_through_and_the_link_stays() {
    let (dir, [real, link]) = scratch_with("symlink", ["real.json", "link.json"]);
    std::fs::write(&real, "old").unwrap();
    std::os::unix::fs::symlink("real.json", &link).unwrap();
    json_summary_through(&link);
    let summary = std::fs::read_to_string(&real).unwrap();
    assert!(summary.contains("\"passed\":true"), "{summary}");
    assert_eq!(names(&dir), ["link.json", "real.json"]);
    // A dangling link: its target is created, the link stays.
    std::fs::remove_file(&real).unwrap();
    json_summary_through(&link);
    assert!(std::fs::read_to_string(&real)
        .unwrap()
        .contains("\"passed\":true"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_json_summary_to_dev_stdout_is_printed_and_dev_null_takes_one() {
    let (code, out, err) = weave(&["run", SET_OP, "--json", "/dev/stdout"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("\"passed\":true"), "{out}");
    assert!(out.contains("result: PASS"), "{out}");
    let (code, _, err) = weave(&["run", SET_OP, "--json", "/dev/null"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &std::fs::metadata("/dev/null").unwrap().file_type()
    ));
}

/// Makes a FIFO at `fifo` and reads it whole on another thread: what it read comes back on
/// the channel.
fn read_in_background(fifo: &Path) -> std::sync::mpsc::Receiver<std::io::Result<String>> {
    let made = Command::new("mkfifo").arg(fifo).status().unwrap();
    assert!(made.success());
    let (tx, rx) = std::sync::mpsc::channel();
    let path = fifo.to_path_buf();
    std::thread::spawn(move || {
        let mut text = String::new();
        let read = std::fs::File::open(&path).and_then(|mut f| f.read_to_string(&mut text));
        let _ = tx.send(read.map(|_| text));
    });
    rx
}

/// Runs `weave run SET_OP FLAG FIFO` with `fifo` a FIFO made in a fresh directory `name` and
/// read whole as it is written: the run passes and writes into it. Returns stdout, what the
/// FIFO got, and the FIFO's path.
fn run_into_fifo(name: &str, fifo: &str, flag: &str) -> (String, String, PathBuf) {
    let fifo = scratch(name).join(fifo);
    let rx = read_in_background(&fifo);
    let (code, out, err) = weave(&["run", SET_OP, flag, s(&fifo)]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let text = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("nothing was written into the FIFO")
        .unwrap();
    (out, text, fifo)
}

#[test]
fn a_json_summary_to_a_fifo_is_written_into_it() {
    let (_, text, fifo) = run_into_fifo("fifo", "summary.fifo", "--json");
    let dir = fifo.parent().unwrap();
    assert!(text.contains("\"passed\":true"), "{text}");
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(
        &std::fs::symlink_metadata(&fifo).unwrap().file_type()
    ));
    assert_eq!(names(dir), ["summary.fifo"]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_json_summary_or_a_trace_to_a_directory_is_refused_naming_it() {
    let dir = scratch("dir");
    let target = dir.join("out");
    std::fs::create_dir(&target).unwrap();
    for flag in ["--json", "--trace"] {
        let refusal = format!("cannot write {}: it is a directory", target.display());
        fails_with(&["run", SET_OP, flag, s(&target)], &refusal);
        assert!(target.is_dir());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn output_files_follow_the_umask() {
    let (dir, [json, trace]) = scratch_with("umask", ["summary.json", "trace.json"]);
    let script = format!(
        "umask 022; exec \"$0\" run {SET_OP} --json '{}' --trace '{}'",
        json.display(),
        trace.display()
    );
    let (code, _, err) = run_in(
        "sh",
        &["-c", &script, env!("CARGO_BIN_EXE_weave")],
        Duration::from_secs(120),
    );
    assert_eq!(code, Some(0), "{err}");
    for p in [&json, &trace, &dir.join("trace.svg")] {
        let mode = std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "{}: {mode:o}", p.display());
    }
    assert_eq!(names(&dir), ["summary.json", "trace.json", "trace.svg"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_endless_input_fails_fast_at_the_cap() {
    for command in ["run", "dump"] {
        let start = Instant::now();
        let (code, _, err) = run_in(
            env!("CARGO_BIN_EXE_weave"),
            &[command, "/dev/zero"],
            Duration::from_secs(60),
        );
        assert_eq!(code, Some(1), "{command}: {err}");
        assert!(
            err.contains("cannot read /dev/zero: it holds more than 268435456 bytes"),
            "{command}: {err}"
        );
        assert!(start.elapsed() < Duration::from_secs(60));
    }
}

#[test]
fn an_input_file_over_the_cap_is_refused_before_it_is_read() {
    let dir = scratch("huge");
    let big = dir.join("big.weave");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(streamweave::MAX_SOURCE_BYTES + 1).unwrap();
    drop(f);
    for command in ["run", "dump"] {
        let start = Instant::now();
        let refusal = format!(
            "cannot read {}: the file is 268435457 bytes; the limit is 268435456 bytes (256 MiB)",
            big.display()
        );
        fails_with(&[command, s(&big)], &refusal);
        assert!(start.elapsed() < Duration::from_secs(20), "{command}");
    }
    // A directory is no source either.
    let refusal = format!("cannot read {}: it is a directory", dir.display());
    fails_with(&["run", s(&dir)], &refusal);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_earlier_runs_trace_is_removed_before_a_failing_run() {
    let (dir, [trace, svg]) = scratch_with("stale", ["t.json", "t.svg"]);
    std::fs::write(&trace, "stale trace").unwrap();
    std::fs::write(&svg, "stale svg").unwrap();
    let missing = dir.join("missing.weave");
    fails_with(&["run", s(&missing), "--trace", s(&trace)], "cannot read");
    assert_eq!(names(&dir), Vec::<String>::new());
    // A link given as the trace stays, and so does its target.
    std::fs::write(dir.join("real.json"), "kept").unwrap();
    std::os::unix::fs::symlink("real.json", &trace).unwrap();
    let (code, _, err) = weave(&["run", s(&missing), "--trace", s(&trace)]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(names(&dir), ["real.json", "t.json"]);
    assert_eq!(
        std::fs::read_to_string(dir.join("real.json")).unwrap(),
        "kept"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A trace written into a FIFO has no "beside": the Chrome trace goes into it, no SVG
/// timeline is made next to it (`/dev/stdout.svg` would be a new file in `/dev`), and the
/// run says so.
#[test]
fn a_trace_into_a_fifo_gets_no_timeline_beside_it() {
    let (out, text, fifo) = run_into_fifo("trace-fifo", "trace.fifo", "--trace");
    let dir = fifo.parent().unwrap();
    assert!(text.contains("\"process_name\""), "{text}");
    assert!(
        out.contains("no SVG timeline beside a trace that is not a file"),
        "{out}"
    );
    assert_eq!(names(dir), ["trace.fifo"]);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Starts `weave ARGS` with every atomic write held `hold` (`WEAVE_TEST_HOLD_WRITES_MS`)
/// between writing its temporary file and renaming it, waits until `ready` holds of `dir`
/// (a write is being held), sends SIGTERM and waits for the process: it must die of the
/// signal. Returns its stdout and stderr.
fn interrupted(
    args: &[&str],
    hold: Duration,
    dir: &Path,
    ready: impl Fn(&[String]) -> bool,
) -> (String, String) {
    let mut child = command(env!("CARGO_BIN_EXE_weave"), args)
        .env("WEAVE_TEST_HOLD_WRITES_MS", hold.as_millis().to_string())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !ready(&names(dir)) {
        if start.elapsed() > Duration::from_secs(120) || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{args:?}: no write was held in {} ({:?}):\n{}\n{}",
                dir.display(),
                names(dir),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(15),
        "{args:?}: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

/// A temporary file of the atomic writer.
fn is_temporary(name: &str) -> bool {
    name.starts_with(".weave-") && name.ends_with(".tmp")
}

/// SIGTERM while `weave tune` writes its tuning cache (the library's writer, a temporary file
/// beside the cache) leaves neither the temporary nor a cache.
#[test]
fn a_signal_during_the_tuning_cache_write_leaves_no_temporary() {
    let dir = scratch("tune-signal");
    let cache = dir.join("tune.toml");
    let args = [
        "tune",
        SET_OP,
        "--iters",
        "1",
        "--warmup",
        "0",
        "--cache",
        s(&cache),
    ];
    let hold = Duration::from_secs(60);
    let (out, err) = interrupted(&args, hold, &dir, |names| {
        names.iter().any(|n| is_temporary(n))
    });
    assert!(
        out.contains("candidate"),
        "the table was printed:\n{out}\n{err}"
    );
    assert_eq!(names(&dir), Vec::<String>::new(), "{out}\n{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// SIGTERM while the SVG timeline is written, the trace already in place: no half-written
/// timeline, no temporary, and no trace without its timeline.
#[test]
fn a_signal_between_the_trace_and_its_timeline_leaves_neither() {
    let dir = scratch("trace-signal");
    let trace = dir.join("t.json");
    let args = ["run", SET_OP, "--trace", s(&trace)];
    // The trace is renamed into place (after its own hold of 5 s) and the timeline's
    // temporary is being held.
    let (out, err) = interrupted(&args, Duration::from_secs(5), &dir, |names| {
        names.iter().any(|n| n == "t.json") && names.iter().any(|n| is_temporary(n))
    });
    assert_eq!(names(&dir), Vec::<String>::new(), "{out}\n{err}");
    // Held in the trace's own write, the signal leaves nothing either.
    let hold = Duration::from_secs(60);
    let (out, err) = interrupted(&args, hold, &dir, |names| {
        names.iter().any(|n| is_temporary(n))
    });
    assert_eq!(names(&dir), Vec::<String>::new(), "{out}\n{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
