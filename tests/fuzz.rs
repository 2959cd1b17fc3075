//! A fuzz harness on the stable toolchain: mutated `.weave` fusions go through the loader and
//! the whole pass pipeline, mutated printed host programs through the host-IR parser, the
//! verifier and `Executable::from_program`, and every program whose tensors are small runs on
//! the CPU ranks it names against its reference. Every input must give a result or an error —
//! no panic, no wrong number, and no input may take longer than [`PER_INPUT`].
//!
//! By default (CI) it replays the corpus of earlier finds in `tests/fuzz/corpus/` and a fixed,
//! seeded batch of mutations. `cargo xtask fuzz --minutes N` (which sets `WEAVE_FUZZ_MINUTES`
//! and `WEAVE_FUZZ_THREADS`) runs fresh seeds until the time is up and prints how many inputs
//! it tried; a failing input is written to `target/fuzz-finds/` to be added to the corpus.
//! Each input runs on its own thread: a panic is caught, a hang is reported after
//! [`PER_INPUT`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The longest one input may take (a debug build, a loaded machine).
const PER_INPUT: Duration = Duration::from_secs(20);

mod common;

use common::Rng;

/// Tokens worth splicing in: keywords, punctuation, extreme numbers, parallel types.
const TOKENS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "3",
    "7",
    "2147483648",
    "4294967295",
    "9223372036854775807",
    "18446744073709551616",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "=",
    "->",
    ";",
    "*",
    "/",
    "%",
    "+",
    "-",
    "DIDx",
    "DIDy",
    "Stream",
    "Serial",
    "outer_split",
    "inner_split",
    "merge",
    "reorder",
    "parallelize",
    "swizzle1d",
    "mesh",
    "tensor",
    "output",
    "schedule",
    "devices",
    "set",
    "sum",
    "matmul",
    "linear",
    "broadcast",
    "reshape",
    "permute",
    "ceilDiv",
    "f32",
    "bf16",
    "i64",
    "bool",
    "FOR",
    "ALLOCATE",
    "ShardByStream",
    "Communication",
    "Wait",
    "Signature:",
    "Definition:",
    "params",
    "input",
    "split",
    "outer",
    "inner",
    "on",
    "\n",
    "  ",
    "é",
    "\u{0}",
    "//",
];

/// One random edit of `text`.
fn mutate(text: &str, rng: &mut Rng) -> String {
    let chars: Vec<char> = text.chars().collect();
    let n = chars.len().max(1);
    let at = rng.below(n);
    let len = 1 + rng.below(8);
    let end = (at + len).min(chars.len());
    let mut out: Vec<char> = chars.clone();
    match rng.below(6) {
        // Delete a short range.
        0 => {
            out.drain(at.min(out.len())..end);
        }
        // Insert a token.
        1 => {
            let t = TOKENS[rng.below(TOKENS.len())];
            let at = at.min(out.len());
            out.splice(at..at, t.chars());
        }
        // Replace a range by a token.
        2 => {
            let t = TOKENS[rng.below(TOKENS.len())];
            out.splice(at.min(out.len())..end, t.chars());
        }
        // Duplicate a range.
        3 => {
            let piece: Vec<char> = chars[at.min(chars.len())..end].to_vec();
            out.splice(end..end, piece);
        }
        // Swap two lines.
        4 => {
            let mut lines: Vec<&str> = text.lines().collect();
            if lines.len() > 1 {
                let (a, b) = (rng.below(lines.len()), rng.below(lines.len()));
                lines.swap(a, b);
            }
            return lines.join("\n") + "\n";
        }
        // Replace a number by an extreme one.
        _ => {
            if let Some(p) = (at..chars.len()).find(|i| chars[*i].is_ascii_digit()) {
                let q = (p..chars.len())
                    .find(|i| !chars[*i].is_ascii_digit())
                    .unwrap_or(chars.len());
                let t = ["0", "4294967296", "9223372036854775807", "65537", "100000"][rng.below(5)];
                out.splice(p..q, t.chars());
            }
        }
    }
    out.into_iter().collect()
}

/// What an input is fed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// `.weave`: load, then the whole pipeline.
    Fusion,
    /// Printed host text: parse, verify, executable.
    Host,
}

/// Runs `text` through `target`; `Err` says how it failed (a panic, or too long).
fn check(target: Target, text: String) -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::Builder::new()
        .name("fuzz-input".into())
        .spawn(move || {
            let outcome = catch_unwind(AssertUnwindSafe(|| match target {
                Target::Fusion => {
                    if let Ok(f) = streamweave::load("fuzz.weave", &text, &[]) {
                        if let Ok(exe) = streamweave::Compiler::new().compile(&f) {
                            return run_small(&exe, true);
                        }
                    }
                    Ok(())
                }
                Target::Host => {
                    if let Ok(p) = streamweave::host_ir::parse(&text) {
                        let _ = streamweave::host_ir::verify(&p);
                        if let Ok(exe) = streamweave::Executable::from_program(p) {
                            // An edited program may well compute something else than its
                            // definition (the check says so): only panics and hangs count.
                            return run_small(&exe, false);
                        }
                    }
                    Ok(())
                }
            }));
            let _ = tx.send(match outcome {
                Ok(result) => result,
                Err(e) => Err(format!(
                    "panicked: {}",
                    e.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "a panic".into())
                )),
            });
        })
        .map_err(|e| format!("cannot start the input's thread: {e}"))?;
    match rx.recv_timeout(PER_INPUT) {
        Ok(Ok(())) => {
            let _ = worker.join();
            Ok(())
        }
        Ok(Err(m)) => Err(m),
        // The thread is left behind: the test fails with the input anyway.
        Err(_) => Err(format!("took longer than {PER_INPUT:?}")),
    }
}

/// The repository root: where the test was built, or `WEAVE_FUZZ_ROOT` (a test binary
/// copied to another machine with the repository beside it).
fn root() -> PathBuf {
    std::env::var_os("WEAVE_FUZZ_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Runs a program whose tensors are small on the ranks it names (at most 4), on the CPU, and
/// with `compiled` (the compiler made it from a fusion) against its reference: an error is
/// fine (the input may be nonsense), a wrong number or a race in what the compiler made is
/// not. Anything bigger is left at compiling.
fn run_small(exe: &streamweave::Executable, compiled: bool) -> Result<(), String> {
    let small = exe
        .inputs()
        .iter()
        .chain(exe.outputs())
        .all(|t| t.global_len() <= 4096);
    let ranks = exe.min_ranks();
    if !small || ranks > 4 || exe.signature().definition.is_none() {
        return Ok(());
    }
    let Ok(globals) = exe.random_inputs(7) else {
        return Ok(());
    };
    let options = streamweave::RunOptions {
        check: compiled,
        check_races: compiled,
        timeouts: streamweave::Timeouts::all(Duration::from_secs(5)),
        ..streamweave::RunOptions::on(streamweave::Target::Cpu { ranks })
    };
    match exe.run_dense(&globals, &options) {
        Ok(report) if compiled && !report.passed() => {
            let bad = common::failed_checks(&report);
            Err(format!(
                "wrong numbers or races: {bad:?}, {} race(s)",
                report.races()
            ))
        }
        _ => Ok(()),
    }
}

fn fixtures_dir() -> PathBuf {
    root().join("tests/scenarios")
}

/// The seeds: every fixture as text, and every fixture's printed host program.
fn seeds() -> Vec<(Target, String)> {
    let mut out = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "weave"))
        .collect();
    paths.sort();
    for p in paths {
        let text = std::fs::read_to_string(&p).unwrap();
        // Benchmark sizes stay symbolic in the program text; small ones keep printing quick.
        let small: Vec<(String, i64)> = ["t", "h"]
            .iter()
            .filter(|k| text.contains(&format!("{k} = 8192")))
            .map(|k| (k.to_string(), 16))
            .collect();
        if let Ok(f) = streamweave::load("seed.weave", &text, &small) {
            if let Ok(exe) = streamweave::Compiler::new().compile(&f) {
                out.push((Target::Host, streamweave::host_ir::print(exe.program())));
            }
        }
        out.push((Target::Fusion, text));
    }
    out
}

/// Mutates seed `k` of `seeds` with `edits` random edits drawn from `rng`.
fn input(seeds: &[(Target, String)], rng: &mut Rng) -> (Target, String) {
    let (target, text) = &seeds[rng.below(seeds.len())];
    let mut text = text.clone();
    for _ in 0..1 + rng.below(4) {
        text = mutate(&text, rng);
    }
    (*target, text)
}

/// Where a failing input is kept for the corpus.
fn keep(target: Target, text: &str, why: &str) -> String {
    let dir = root().join("target/fuzz-finds");
    let _ = std::fs::create_dir_all(&dir);
    let ext = match target {
        Target::Fusion => "weave",
        Target::Host => "hir",
    };
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let path = dir.join(format!("{hash:016x}.{ext}"));
    let _ = std::fs::write(&path, text);
    format!("{} ({why})", path.display())
}

#[test]
fn the_corpus_replays_without_a_panic_or_a_hang() {
    let dir = root().join("tests/fuzz/corpus");
    let mut failures = Vec::new();
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).expect("tests/fuzz/corpus exists") {
        let path = entry.unwrap().path();
        let target = match path.extension().and_then(|e| e.to_str()) {
            Some("weave") => Target::Fusion,
            Some("hir") => Target::Host,
            _ => continue,
        };
        let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
        count += 1;
        if let Err(why) = check(target, text) {
            failures.push(format!("{}: {why}", path.display()));
        }
    }
    assert!(count > 0, "the corpus is empty");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn mutated_fusions_and_host_programs_never_panic_or_hang() {
    let seeds = seeds();
    assert!(seeds.len() > 100, "{} seeds", seeds.len());
    let minutes: Option<f64> = std::env::var("WEAVE_FUZZ_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok());
    let threads: usize = std::env::var("WEAVE_FUZZ_THREADS")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(1)
        .max(1);
    // CI: a fixed batch; `cargo xtask fuzz`: fresh seeds until the time is up.
    let (deadline, batch, first_seed) = match minutes {
        Some(m) => (
            Some(Instant::now() + Duration::from_secs_f64(m.max(0.0) * 60.0)),
            usize::MAX,
            Instant::now().elapsed().as_nanos() as u64 ^ 0x5eed_f022,
        ),
        None => (None, 2000, 0xf022),
    };
    let results: Vec<(usize, Vec<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|k| {
                let seeds = &seeds;
                s.spawn(move || {
                    let mut rng = Rng(first_seed.wrapping_add(k as u64 * 0x1234_5678_9abc));
                    let mut tried = 0;
                    let mut failures = Vec::new();
                    while tried < batch && deadline.is_none_or(|d| Instant::now() < d) {
                        let (target, text) = input(seeds, &mut rng);
                        tried += 1;
                        if let Err(why) = check(target, text.clone()) {
                            failures.push(keep(target, &text, &why));
                        }
                    }
                    (tried, failures)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let tried: usize = results.iter().map(|r| r.0).sum();
    let failures: Vec<String> = results.into_iter().flat_map(|r| r.1).collect();
    println!("fuzz: {tried} inputs tried, {} failed", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
