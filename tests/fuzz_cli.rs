//! A fuzz harness for the command line itself: `weave run` and `weave dump` with flags and
//! values at their limits, input and output paths of every kind (regular files, links to
//! files and directories, dangling links, directories, a FIFO, devices, empty, binary and
//! oversized files), and SIGINT/SIGTERM at random points of a run. Every invocation must end
//! within [`PER_RUN`] with a result or an error message — never a panic (exit 101), an abort
//! or a crash (killed by a signal it was not sent), a hang, a replaced link or FIFO or device,
//! or a temporary file left behind.
//!
//! By default (CI) a fixed, seeded batch runs. `WEAVE_FUZZ_CLI_MINUTES=N` runs fresh seeds
//! for N minutes on `WEAVE_FUZZ_CLI_JOBS` workers at once (default 1), each with its own seeds
//! (`WEAVE_FUZZ_CLI_SEED` + the worker, + the workers, …; default seed 1) and its own scratch
//! directory under `$TMPDIR`, and prints a summary: invocations, outcomes, finds by kind and
//! the seed and case of each find. `WEAVE_FUZZ_CLI_OUT=DIR` also writes the summary and every
//! find, as an entry for [`FINDS`], into DIR. `WEAVE_FUZZ_CLI_REPLAY=SEED:CASE,…` runs only
//! those cases again.
//!
//! It runs from the GPU bundle too (`bin/fuzz-cli`, `scripts/fuzz_cli.sh`), on a machine
//! without the sources: the `weave` it runs is `$WEAVE_BIN`, else `weave` beside this test's
//! executable (the bundle's `bin/`), else the one cargo built; the scenarios it dumps are
//! found as the other tests find them (`$WEAVE_SCENARIOS`, the bundle's `scenarios/`).
//!
//! Run as root, it never names `/dev/null` (a rename over it would replace it): its device
//! and FIFO outputs are a FIFO in its scratch directory, and a link to it.

use std::io::Write;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest one invocation may take (a debug build on a loaded machine).
const PER_RUN: Duration = Duration::from_secs(60);

mod common;

use common::Rng;

/// One of `v`, at random.
fn pick<'a>(rng: &mut Rng, v: &[&'a str]) -> &'a str {
    v[rng.below(v.len())]
}

/// The `weave` executable under test: `$WEAVE_BIN` when set, else `weave` beside this test's
/// executable (the bundle's `bin/weave` beside `bin/fuzz-cli`), else the one cargo built.
fn weave_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("WEAVE_BIN").filter(|b| !b.is_empty()) {
        return PathBuf::from(bin);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("weave")))
        .filter(|w| w.is_file())
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_weave")))
}

/// Whether this process runs as root: then no path outside the scratch directory is given as
/// an output (a product that replaced `/dev/null` by a file would do it as root).
fn is_root() -> bool {
    // The effective uid: the second number of the `Uid:` line of /proc/self/status.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(true)
}

/// The scenario fixtures `weave dump` is also given (none when there are none).
fn scenarios() -> Vec<PathBuf> {
    let dir = common::scenarios_dir();
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "weave"))
        .collect();
    v.sort();
    v
}

/// Values at and around every limit a count, size or duration flag has.
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "2",
    "-1",
    "64",
    "65",
    "1024",
    "1025",
    "65536",
    "65537",
    "1000000",
    "1000001",
    "31536000",
    "31536001",
    "4294967295",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "1e3",
    "0x10",
    "",
    "abc",
    "auto",
];

const FLAGS: &[&str] = &[
    "--ranks",
    "--streams",
    "--warmup",
    "--iters",
    "--timeout-secs",
    "--chunks",
    "--seed",
];

/// A small fusion with a chunk parameter: runs in well under a second.
const PROGRAM: &str = "fusion f(t = 8, h = 4, d = 2, s = 2) {\n  mesh m = devices(d)\n  \
    tensor x: f32[t, h] on m\n  y = neg(x)\n  output y\n  \
    schedule x { outer_split(0, s) -> Stream }\n}\n";

/// A larger program (a few hundred ms per run on the CPU) for signals to land inside.
const SLOW: &str = "fusion g(t = 256, h = 256, d = 2, s = 4) {\n  mesh m = devices(d)\n  \
    tensor x: f32[t, h] on m\n  tensor w: f32[h, h] on m\n  y = linear(x, w)\n  \
    z = exp(y)\n  output z\n  schedule x { outer_split(0, s) -> Stream }\n}\n";

/// The names of the scratch directory's entries (and `adir/…` below them): an argument of a
/// find that starts with one of them is a path in the scratch directory of the replay.
const SCRATCH_NAMES: &[&str] = &[
    "ok.weave",
    "slow.weave",
    "empty.weave",
    "binary.weave",
    "big.weave",
    "adir",
    "link.weave",
    "dangling",
    "missing.weave",
    "target.txt",
    "out-link",
    "dir-link",
    "out.json",
    "trace.json",
    "t.svg",
    "sink.fifo",
    "sink-link",
];

struct Scratch {
    dir: PathBuf,
    /// Tells the thread that drains `sink.fifo` to stop.
    stop: Arc<AtomicBool>,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("weave-fuzz-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let s = Scratch {
            dir,
            stop: Arc::new(AtomicBool::new(false)),
        };
        std::fs::write(s.path("ok.weave"), PROGRAM).unwrap();
        std::fs::write(s.path("slow.weave"), SLOW).unwrap();
        std::fs::write(s.path("empty.weave"), "").unwrap();
        std::fs::write(s.path("binary.weave"), [0u8, 159, 146, 150, 255, 0, 10, 13]).unwrap();
        // Past the loader's cap, without taking the disk: a sparse file.
        let big = std::fs::File::create(s.path("big.weave")).unwrap();
        big.set_len(300 << 20).unwrap();
        std::fs::create_dir_all(s.path("adir")).unwrap();
        std::os::unix::fs::symlink(s.path("ok.weave"), s.path("link.weave")).unwrap();
        std::os::unix::fs::symlink(s.path("nowhere"), s.path("dangling")).unwrap();
        std::fs::write(s.path("target.txt"), "keep me").unwrap();
        std::os::unix::fs::symlink(s.path("target.txt"), s.path("out-link")).unwrap();
        std::os::unix::fs::symlink(s.path("adir"), s.path("dir-link")).unwrap();
        // An output that is not a file and is ours to lose: a FIFO kept open (read and
        // write, so a writer never waits for a reader) and drained, and a link to it.
        let fifo = s.path("sink.fifo");
        let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success(), "mkfifo {}", fifo.display());
        std::os::unix::fs::symlink(&fifo, s.path("sink-link")).unwrap();
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .unwrap();
        let stop = s.stop.clone();
        std::thread::spawn(move || {
            let mut reader = reader;
            let mut buf = vec![0u8; 1 << 16];
            while !stop.load(Ordering::Relaxed) {
                if std::io::Read::read(&mut reader, &mut buf).is_err() {
                    break;
                }
            }
        });
        s
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `arg` with this scratch directory's path taken off (a find as it is replayed).
    fn relative(&self, arg: &str) -> String {
        let prefix = format!("{}/", self.dir.display());
        let scenarios = format!("{}/", common::scenarios_dir().display());
        if let Some(name) = arg.strip_prefix(&scenarios) {
            return format!("scenarios/{name}");
        }
        arg.strip_prefix(&prefix).unwrap_or(arg).to_string()
    }

    /// `arg` of a replayed find in this scratch directory: a name of [`SCRATCH_NAMES`] (or a
    /// path below one) becomes its path here, `scenarios/NAME` the scenario's path.
    fn resolve(&self, arg: &str) -> String {
        let first = arg.split('/').next().unwrap_or(arg);
        if let Some(name) = arg.strip_prefix("scenarios/") {
            common::scenarios_dir().join(name).display().to_string()
        } else if SCRATCH_NAMES.contains(&first) {
            self.path(arg).display().to_string()
        } else {
            arg.to_string()
        }
    }

    /// Temporary files an interrupted or failed write left behind.
    fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for d in [self.dir.clone(), self.path("adir")] {
            for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(".weave-") || name.ends_with(".tmp") {
                    left.push(name);
                }
            }
        }
        left
    }

    /// What must hold after any invocation: the links still links (to the same untouched
    /// file, and to the FIFO), the FIFO still a FIFO, `/dev/null` still a device.
    fn intact(&self) -> Result<(), String> {
        let kind = |name: &str| {
            std::fs::symlink_metadata(self.path(name))
                .map(|m| m.file_type())
                .map_err(|e| format!("{name}: {e}"))
        };
        if !kind("out-link")?.is_symlink() {
            return Err("the output link was replaced".into());
        }
        if !kind("target.txt")?.is_file() {
            return Err("the link's target is no longer a file".into());
        }
        if !kind("sink-link")?.is_symlink() {
            return Err("the link to the FIFO was replaced".into());
        }
        if !kind("sink.fifo")?.is_fifo() {
            return Err("the FIFO was replaced".into());
        }
        if !std::fs::symlink_metadata("/dev/null")
            .map(|m| m.file_type().is_char_device())
            .unwrap_or(false)
        {
            return Err("/dev/null is no longer a character device".into());
        }
        Ok(())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Wake the draining thread (it reads until it sees the flag).
        self.stop.store(true, Ordering::Relaxed);
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(self.path("sink.fifo"))
        {
            let _ = f.write_all(b"\n");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One invocation: its arguments, and a signal to send after a delay.
#[derive(Clone, Debug)]
struct Case {
    args: Vec<String>,
    signal: Option<(i32, Duration)>,
}

/// The paths a case may name as an input, and as a `--json` or `--trace` output: `/dev/null`
/// only when not root (see the module's note).
struct Paths {
    inputs: Vec<&'static str>,
    outputs: Vec<&'static str>,
    traces: Vec<&'static str>,
    scenarios: Vec<PathBuf>,
}

impl Paths {
    fn new() -> Paths {
        // `ok.weave` three times, then the other inputs of the scratch directory, from
        // `slow.weave` to `missing.weave`.
        let mut inputs = [&["ok.weave"; 2][..], &SCRATCH_NAMES[..9]].concat();
        let mut outputs = vec![
            "out.json",
            "adir",
            "out-link",
            "dir-link",
            "dangling",
            "sink.fifo",
            "sink-link",
            "adir/deep/missing.json",
        ];
        let mut traces = vec![
            "trace.json",
            "adir",
            "out-link",
            "t.svg",
            "sink.fifo",
            "sink-link",
        ];
        if !is_root() {
            inputs.push("/dev/null");
            outputs.push("/dev/null");
            traces.push("/dev/null");
        }
        Paths {
            inputs,
            outputs,
            traces,
            scenarios: scenarios(),
        }
    }
}

fn case(rng: &mut Rng, s: &Scratch, paths: &Paths) -> Case {
    let at = |p: &str| {
        if p.starts_with('/') {
            p.to_string()
        } else {
            s.path(p).display().to_string()
        }
    };
    let input = at(pick(rng, &paths.inputs));
    let dump = rng.below(5) == 0;
    let mut args: Vec<String> = if dump {
        // A dump of one of the scenarios now and then (they load; the cases above mostly
        // do not).
        let input = match rng.below(3) {
            0 if !paths.scenarios.is_empty() => paths.scenarios[rng.below(paths.scenarios.len())]
                .display()
                .to_string(),
            _ => input,
        };
        vec!["dump".into(), input]
    } else {
        vec!["run".into(), input, "--set".into(), "t=8".into()]
    };
    for _ in 0..rng.below(4) {
        let flag = pick(rng, FLAGS);
        if dump && flag != "--chunks" {
            continue;
        }
        args.push(flag.into());
        args.push(pick(rng, NUMBERS).into());
    }
    if !dump {
        // Keep every run short whatever the flags say, unless the flags set it themselves.
        if !args.iter().any(|a| a == "--timeout-secs") {
            args.extend(["--timeout-secs".into(), "20".into()]);
        }
        if rng.below(2) == 0 {
            args.push("--json".into());
            args.push(at(pick(rng, &paths.outputs)));
        }
        if rng.below(3) == 0 {
            args.push("--trace".into());
            args.push(at(pick(rng, &paths.traces)));
        }
    }
    let signal = (rng.below(4) == 0).then(|| {
        let sig = if rng.below(2) == 0 {
            libc::SIGINT
        } else {
            libc::SIGTERM
        };
        (sig, Duration::from_millis(rng.below(400) as u64))
    });
    Case { args, signal }
}

/// What went wrong with one invocation: its kind (`hang`, `crash`, `panic`, `silent`,
/// `replaced`, `leftover`, `partial`, `spawn`) and the details.
type Wrong = (&'static str, String);

/// Runs one case; `Ok` says how it ended (`pass`, `error`, `interrupted`), `Err` what went
/// wrong.
fn check(c: &Case, s: &Scratch) -> Result<&'static str, Wrong> {
    let mut child = Command::new(weave_bin())
        .args(&c.args)
        .env("WEAVE_TUNE_CACHE", s.path("tune.toml"))
        .env("WEAVE_CALIBRATION", s.path("calibration.txt"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            (
                "spawn",
                format!("cannot start {}: {e}", weave_bin().display()),
            )
        })?;
    // Read both pipes while the child runs: a child writing more than a pipe holds would
    // otherwise wait for us while we wait for it.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut p) = pipe {
                let mut bytes = Vec::new();
                let _ = p.read_to_end(&mut bytes);
                text = String::from_utf8_lossy(&bytes).into_owned();
            }
            text
        })
    };
    let out_reader = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err_reader = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let start = Instant::now();
    let mut signalled = false;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| ("spawn", e.to_string()))? {
            break status;
        }
        if let Some((sig, after)) = c.signal {
            if !signalled && start.elapsed() >= after {
                // Our own child, not yet reaped.
                let _ = Command::new("kill")
                    .arg(format!("-{sig}"))
                    .arg(child.id().to_string())
                    .status();
                signalled = true;
            }
        }
        if start.elapsed() > PER_RUN {
            let _ = child.kill();
            let _ = child.wait();
            return Err(("hang", format!("still running after {PER_RUN:?}")));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let _ = out_reader.join();
    let stderr = err_reader.join().unwrap_or_default();
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        if c.signal.is_none_or(|(sent, _)| sent != sig) {
            return Err(("crash", format!("killed by signal {sig}:\n{stderr}")));
        }
    }
    if status.code() == Some(101) || stderr.contains("panicked") {
        return Err(("panic", format!("panicked:\n{stderr}")));
    }
    if status.code() != Some(0) && status.signal().is_none() && stderr.trim().is_empty() {
        return Err(("silent", format!("failed ({status}) without a message")));
    }
    s.intact().map_err(|e| ("replaced", e))?;
    let left = s.leftovers();
    if !left.is_empty() {
        // Reported once: removed, so that the next case of this scratch directory is
        // judged on its own files.
        for name in &left {
            let _ = std::fs::remove_file(s.dir.join(name));
            let _ = std::fs::remove_file(s.path("adir").join(name));
        }
        return Err(("leftover", format!("left temporary files {left:?}")));
    }
    // A summary that was written is whole.
    let json = s.path("out.json");
    if let Ok(text) = std::fs::read_to_string(&json) {
        if !text.trim_start().starts_with('{') || !text.trim_end().ends_with('}') {
            return Err(("partial", format!("a partial summary: {text:?}")));
        }
        let _ = std::fs::remove_file(&json);
    }
    Ok(match (status.code(), status.signal()) {
        (Some(0), _) => "pass",
        (_, Some(_)) => "interrupted",
        _ => "error",
    })
}

/// One find: where it came from (seed and case), the invocation, and what went wrong.
struct Find {
    seed: u64,
    case: usize,
    args: Vec<String>,
    signal: Option<(i32, Duration)>,
    kind: &'static str,
    why: String,
}

impl Find {
    /// The find as an entry of [`FINDS`] (paths in the scratch directory by their names).
    fn entry(&self) -> String {
        let args: Vec<String> = self.args.iter().map(|a| format!("{a:?}")).collect();
        let signal = match self.signal {
            Some((sig, after)) => format!("Some(({sig}, {}))", after.as_millis()),
            None => "None".into(),
        };
        format!(
            "    // {} (seed {}, case {}): …\n    Replay {{\n        args: &[{}],\n        signal: {signal},\n    }},",
            self.kind,
            self.seed,
            self.case,
            args.join(", ")
        )
    }
}

impl std::fmt::Display for Find {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} at case {} of seed {} (replay: WEAVE_FUZZ_CLI_REPLAY={}:{}): weave {:?} (signal {:?}): {}",
            self.kind, self.case, self.seed, self.seed, self.case, self.args, self.signal, self.why
        )
    }
}

/// What a worker saw: invocations by how they ended, and the finds.
#[derive(Default)]
struct Tally {
    invocations: usize,
    outcomes: std::collections::BTreeMap<&'static str, usize>,
    finds: Vec<Find>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.invocations += other.invocations;
        for (k, n) in other.outcomes {
            *self.outcomes.entry(k).or_default() += n;
        }
        self.finds.extend(other.finds);
    }
}

/// Runs the cases `range` of `seed` (numbered from 0), stopping early at `until`.
fn cases_of(
    seed: u64,
    range: std::ops::Range<usize>,
    s: &Scratch,
    paths: &Paths,
    until: Option<Instant>,
) -> Tally {
    let mut rng = Rng(seed);
    let mut tally = Tally::default();
    for i in 0..range.end {
        let c = case(&mut rng, s, paths);
        if i < range.start {
            continue;
        }
        if until.is_some_and(|u| Instant::now() >= u) {
            break;
        }
        tally.invocations += 1;
        match check(&c, s) {
            Ok(outcome) => *tally.outcomes.entry(outcome).or_default() += 1,
            Err((kind, why)) => {
                *tally.outcomes.entry("find").or_default() += 1;
                tally.finds.push(Find {
                    seed,
                    case: i,
                    args: c.args.iter().map(|a| s.relative(a)).collect(),
                    signal: c.signal,
                    kind,
                    why,
                });
            }
        }
    }
    tally
}

/// A find replayed: the arguments, separated by spaces (names in the scratch directory, see
/// [`SCRATCH_NAMES`]), and a signal to send after some milliseconds.
struct Replay {
    args: &'static str,
    signal: Option<(i32, u64)>,
}

/// What the fuzzer found, replayed: each must end within [`PER_RUN`] with a result or an
/// error message (a find printed by a fuzz run is an entry to paste here, once fixed).
const FINDS: &[Replay] = &[
    // 65 CPU ranks × 65,536 chunks with a trace through a symbolic link (4 × H200 machine,
    // 36 workers, 25 minutes, seeds 1795884303 case 2 and 1795957654 case 12): still running
    // 60 s into a 20 s timeout. The issuing threads ran millions of jobs ahead of their CPU
    // streams (2 GB queued at 20 s), and a timed-out run skipped them all before it ended. A
    // CPU stream now holds at most `weave_executor::cpu::MAX_QUEUED` jobs
    // (`the_issuing_thread_waits_when_a_stream_holds_max_queued_jobs`).
    Replay {
        args:
            "run slow.weave --set t=8 --chunks 65536 --ranks 65 --timeout-secs 20 --trace sink-link",
        signal: None,
    },
    // 65,536 chunks of a stream loop under a 3 s timeout: the run reported its timeout, and
    // then the CPU streams worked through everything still queued (147 s at 20 s).
    Replay {
        args: "run slow.weave --set t=8 --chunks 65536 --timeout-secs 3",
        signal: None,
    },
    // SIGTERM 3 ms into a traced run (4 × H200 machine, 44 workers, seed 1795770129 case 9):
    // the signal thread removed the temporaries, and the main thread made a new one before
    // the process ended (`.weave-PID-1.tmp` left). Temporaries are now refused once the
    // clean-up has run (`streamweave::output::close_temporaries`).
    Replay {
        args: "run ok.weave --set t=8 --timeout-secs 20 --trace trace.json",
        signal: Some((15, 3)),
    },
];

#[test]
#[cfg(target_os = "linux")]
fn what_the_command_line_fuzzer_found_stays_fixed() {
    let s = Scratch::new("finds");
    for find in FINDS {
        let args: Vec<String> = find.args.split(' ').map(|a| s.resolve(a)).collect();
        let signal = find
            .signal
            .map(|(sig, ms)| (sig, Duration::from_millis(ms)));
        let c = Case { args, signal };
        let start = Instant::now();
        check(&c, &s).unwrap_or_else(|(kind, e)| panic!("weave {:?}: {kind}: {e}", c.args));
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}",
            start.elapsed()
        );
    }
}

/// What the fuzz gives as a device output when it runs as root, instead of `/dev/null`: a
/// FIFO, and a link to it, are written through and stay what they are (root or not), a
/// trace into one gets no timeline beside it, and no temporary file is left.
#[test]
#[cfg(target_os = "linux")]
fn a_fifo_and_a_link_to_it_given_as_outputs_are_written_through_never_replaced() {
    let s = Scratch::new("fifo");
    for flag in ["--json", "--trace"] {
        for out in ["sink.fifo", "sink-link"] {
            let args: Vec<String> = ["run", "ok.weave", "--set", "t=8", flag, out]
                .iter()
                .map(|a| s.resolve(a))
                .collect();
            let c = Case { args, signal: None };
            assert_eq!(
                check(&c, &s),
                Ok("pass"),
                "weave {:?} (root: {})",
                c.args,
                is_root()
            );
        }
    }
    let names: Vec<String> = std::fs::read_dir(&s.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("sink"))
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

/// A number from the environment variable `name`, `default` when unset or not a number.
fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|m| m.trim().parse().ok())
        .unwrap_or(default)
}

/// The summary of a fuzz run, in lines.
fn summary(t: &Tally, jobs: u64, first_seed: u64, took: Duration) -> String {
    let mut text = format!(
        "fuzz_cli: {} invocations by {jobs} worker(s) in {:.1} s (weave: {}; first seed {first_seed}; root: {})\n",
        t.invocations,
        took.as_secs_f64(),
        weave_bin().display(),
        is_root()
    );
    let outcomes: Vec<String> = t.outcomes.iter().map(|(k, n)| format!("{k} {n}")).collect();
    text += &format!("fuzz_cli: outcomes: {}\n", outcomes.join(", "));
    let mut kinds: std::collections::BTreeMap<&str, usize> = Default::default();
    for f in &t.finds {
        *kinds.entry(f.kind).or_default() += 1;
    }
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
    text += &format!(
        "fuzz_cli: {} find(s){}{}\n",
        t.finds.len(),
        if kinds.is_empty() { "" } else { ": " },
        kinds.join(", ")
    );
    if !t.finds.is_empty() {
        let seeds: Vec<String> = t
            .finds
            .iter()
            .map(|f| format!("{}:{}", f.seed, f.case))
            .collect();
        text += &format!(
            "fuzz_cli: seeds of the finds (SEED:CASE, replay with WEAVE_FUZZ_CLI_REPLAY): {}\n",
            seeds.join(",")
        );
    }
    text
}

#[test]
#[cfg(target_os = "linux")]
fn the_command_line_never_panics_hangs_or_replaces_what_it_was_not_asked_to() {
    let minutes = env_number("WEAVE_FUZZ_CLI_MINUTES", 0);
    let jobs = env_number("WEAVE_FUZZ_CLI_JOBS", 1).clamp(1, 1024);
    let first_seed = env_number("WEAVE_FUZZ_CLI_SEED", 1);
    let out_dir = std::env::var_os("WEAVE_FUZZ_CLI_OUT")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    let paths = Paths::new();
    let s = Scratch::new("batch");
    let started = Instant::now();

    if let Ok(replay) = std::env::var("WEAVE_FUZZ_CLI_REPLAY") {
        let mut tally = Tally::default();
        for item in replay.split(',').filter(|i| !i.trim().is_empty()) {
            let (seed, case) = item
                .trim()
                .split_once(':')
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                .unwrap_or_else(|| panic!("WEAVE_FUZZ_CLI_REPLAY: `{item}` is not SEED:CASE"));
            tally.add(cases_of(seed, case..case + 1, &s, &paths, None));
        }
        let text = summary(&tally, 1, first_seed, started.elapsed());
        println!("{text}");
        let finds: Vec<String> = tally.finds.iter().map(|f| f.to_string()).collect();
        assert!(finds.is_empty(), "{}", finds.join("\n\n"));
        return;
    }

    // The base program runs and passes: the batch below is not a batch of load errors.
    let base = Command::new(weave_bin())
        .args([
            "run",
            &s.path("ok.weave").display().to_string(),
            "--set",
            "t=8",
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", weave_bin().display()));
    assert!(
        base.status.success() && String::from_utf8_lossy(&base.stdout).contains("result: PASS"),
        "{}",
        String::from_utf8_lossy(&base.stderr)
    );
    let mut tally = cases_of(0x5eed, 0..48, &s, &paths, None);
    drop(s);
    if minutes > 0 {
        let until = Instant::now() + Duration::from_secs(minutes.saturating_mul(60));
        let found = AtomicUsize::new(tally.finds.len());
        let all = Mutex::new(Tally::default());
        std::thread::scope(|scope| {
            for worker in 0..jobs {
                let (paths, found, all) = (&paths, &found, &all);
                scope.spawn(move || {
                    let s = Scratch::new(&format!("w{worker}"));
                    let mut seed = first_seed.wrapping_add(worker);
                    while Instant::now() < until && found.load(Ordering::Relaxed) < 50 {
                        let t = cases_of(seed, 0..16, &s, paths, Some(until));
                        found.fetch_add(t.finds.len(), Ordering::Relaxed);
                        for f in &t.finds {
                            eprintln!("fuzz_cli: find: {f}");
                        }
                        all.lock().unwrap_or_else(|e| e.into_inner()).add(t);
                        seed = seed.wrapping_add(jobs);
                    }
                });
            }
        });
        tally.add(all.into_inner().unwrap_or_else(|e| e.into_inner()));
    }
    let text = summary(&tally, jobs, first_seed, started.elapsed());
    println!("{text}");
    if let Some(dir) = &out_dir {
        let _ = std::fs::create_dir_all(dir);
        let mut details = String::new();
        for f in &tally.finds {
            details += &format!("{f}\n\n{}\n\n", f.entry());
        }
        std::fs::write(dir.join("fuzz_cli_summary.txt"), &text).unwrap();
        std::fs::write(dir.join("fuzz_cli_finds.txt"), &details).unwrap();
    }
    let finds: Vec<String> = tally
        .finds
        .iter()
        .map(|f| format!("{f}\n{}", f.entry()))
        .collect();
    assert!(finds.is_empty(), "{}", finds.join("\n\n"));
}
