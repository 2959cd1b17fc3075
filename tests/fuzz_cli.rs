//! A fuzz harness for the command line itself: `weave run` and `weave dump` with flags and
//! values at their limits, input and output paths of every kind (regular files, links to
//! files and directories, dangling links, directories, devices, empty, binary and oversized
//! files), and SIGINT/SIGTERM at random points of a run. Every invocation must end within
//! [`PER_RUN`] with a result or an error message — never a panic (exit 101), an abort or a
//! crash (killed by a signal it was not sent), a hang, a replaced device or link, or a
//! temporary file left behind.
//!
//! By default (CI) a fixed, seeded batch runs. `WEAVE_FUZZ_CLI_MINUTES=N` runs fresh seeds
//! for N minutes and prints how many invocations it tried.

use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The longest one invocation may take (a debug build on a loaded machine).
const PER_RUN: Duration = Duration::from_secs(60);

mod common;

use common::Rng;

/// One of `v`, at random.
fn pick<'a>(rng: &mut Rng, v: &[&'a str]) -> &'a str {
    v[rng.below(v.len())]
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

struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("weave-fuzz-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let s = Scratch { dir };
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
        s
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
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

    /// What must hold after any invocation: the link still a link to the same untouched
    /// file, `/dev/null` still a device.
    fn intact(&self) -> Result<(), String> {
        let link = std::fs::symlink_metadata(self.path("out-link")).map_err(|e| e.to_string())?;
        if !link.file_type().is_symlink() {
            return Err("the output link was replaced by a file".into());
        }
        if !std::fs::metadata("/dev/null")
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
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One invocation: its arguments, and a signal to send after a delay.
#[derive(Clone, Debug)]
struct Case {
    args: Vec<String>,
    signal: Option<(i32, Duration)>,
}

fn case(rng: &mut Rng, s: &Scratch) -> Case {
    let inputs = [
        "ok.weave",
        "ok.weave",
        "ok.weave",
        "slow.weave",
        "empty.weave",
        "binary.weave",
        "big.weave",
        "adir",
        "link.weave",
        "dangling",
        "missing.weave",
        "/dev/null",
    ];
    let input = pick(rng, &inputs);
    let input = if input.starts_with('/') {
        input.to_string()
    } else {
        s.path(input).display().to_string()
    };
    let dump = rng.below(5) == 0;
    let mut args: Vec<String> = if dump {
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
        let outputs = [
            "out.json",
            "adir",
            "out-link",
            "dir-link",
            "dangling",
            "/dev/null",
            "adir/deep/missing.json",
        ];
        if rng.below(2) == 0 {
            let out = pick(rng, &outputs);
            args.push("--json".into());
            args.push(if out.starts_with('/') {
                out.into()
            } else {
                s.path(out).display().to_string()
            });
        }
        if rng.below(3) == 0 {
            let out = pick(
                rng,
                &["trace.json", "adir", "out-link", "/dev/null", "t.svg"],
            );
            args.push("--trace".into());
            args.push(if out.starts_with('/') {
                out.into()
            } else {
                s.path(out).display().to_string()
            });
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

/// Runs one case; `Err` says what went wrong.
fn check(c: &Case, s: &Scratch) -> Result<(), String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weave"))
        .args(&c.args)
        .env("WEAVE_TUNE_CACHE", s.path("tune.toml"))
        .env("WEAVE_CALIBRATION", s.path("calibration.txt"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
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
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
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
            return Err(format!("still running after {PER_RUN:?}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let _ = out_reader.join();
    let stderr = err_reader.join().unwrap_or_default();
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        if c.signal.is_none_or(|(sent, _)| sent != sig) {
            return Err(format!("killed by signal {sig}:\n{stderr}"));
        }
    }
    if status.code() == Some(101) || stderr.contains("panicked") {
        return Err(format!("panicked:\n{stderr}"));
    }
    if status.code() != Some(0) && status.signal().is_none() && stderr.trim().is_empty() {
        return Err(format!("failed ({status}) without a message"));
    }
    s.intact()?;
    let left = s.leftovers();
    if !left.is_empty() {
        return Err(format!("left temporary files {left:?}"));
    }
    // A summary that was written is whole.
    let json = s.path("out.json");
    if let Ok(text) = std::fs::read_to_string(&json) {
        if !text.trim_start().starts_with('{') || !text.trim_end().ends_with('}') {
            return Err(format!("a partial summary: {text:?}"));
        }
        let _ = std::fs::remove_file(&json);
    }
    Ok(())
}

fn batch(seed: u64, count: usize, s: &Scratch) -> Vec<String> {
    let mut rng = Rng(seed);
    let mut finds = Vec::new();
    for i in 0..count {
        let c = case(&mut rng, s);
        if let Err(why) = check(&c, s) {
            finds.push(format!(
                "case {i} of seed {seed}: weave {:?} (signal {:?}): {why}",
                c.args, c.signal
            ));
        }
    }
    finds
}

/// What the fuzzer found, replayed: each must end within [`PER_RUN`] with a result or an
/// error message.
const FINDS: &[&[&str]] = &[
    // 65,536 chunks of a stream loop under a 3 s timeout: the run reported its timeout, and
    // then the CPU streams worked through everything still queued (147 s at 20 s).
    &[
        "run",
        "slow.weave",
        "--set",
        "t=8",
        "--chunks",
        "65536",
        "--timeout-secs",
        "3",
    ],
];

#[test]
#[cfg(target_os = "linux")]
fn what_the_command_line_fuzzer_found_stays_fixed() {
    let s = Scratch::new("finds");
    for find in FINDS {
        let args: Vec<String> = find
            .iter()
            .map(|a| {
                if a.ends_with(".weave") {
                    s.path(a).display().to_string()
                } else {
                    a.to_string()
                }
            })
            .collect();
        let c = Case { args, signal: None };
        let start = Instant::now();
        check(&c, &s).unwrap_or_else(|e| panic!("weave {:?}: {e}", c.args));
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}",
            start.elapsed()
        );
    }
}

#[test]
#[cfg(target_os = "linux")]
fn the_command_line_never_panics_hangs_or_replaces_what_it_was_not_asked_to() {
    let s = Scratch::new("batch");
    let minutes: u64 = std::env::var("WEAVE_FUZZ_CLI_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    // The base program runs and passes: the batch below is not a batch of load errors.
    let base = Command::new(env!("CARGO_BIN_EXE_weave"))
        .args([
            "run",
            &s.path("ok.weave").display().to_string(),
            "--set",
            "t=8",
        ])
        .output()
        .unwrap();
    assert!(
        base.status.success() && String::from_utf8_lossy(&base.stdout).contains("result: PASS"),
        "{}",
        String::from_utf8_lossy(&base.stderr)
    );
    let mut finds = batch(0x5eed, 48, &s);
    if minutes > 0 {
        let until = Instant::now() + Duration::from_secs(minutes * 60);
        let (mut seed, mut tried) = (1u64, 48usize);
        while Instant::now() < until && finds.len() < 20 {
            finds.extend(batch(seed, 16, &s));
            tried += 16;
            seed += 1;
        }
        eprintln!("fuzz_cli: {tried} invocations, {} find(s)", finds.len());
    }
    assert!(finds.is_empty(), "{}", finds.join("\n\n"));
}
