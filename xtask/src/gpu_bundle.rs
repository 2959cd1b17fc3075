//! `cargo xtask gpu-bundle`: build the executables a GPU machine needs and gather them, with
//! the scenarios and the run scripts, into one directory to copy there.
//!
//! The bundle (default `target/gpu-bundle`, always git-ignored):
//!
//! ```text
//! bin/weave            the CLI (`--profile bundle`: optimized, no debug info, stripped)
//! bin/gpu-tests        the root package's integration test `gpu` (when tests/gpu.rs exists)
//! bin/fuzz-cli         the root package's integration test `fuzz_cli`, the command-line fuzz
//!                      harness (when tests/fuzz_cli.rs exists; scripts/fuzz_cli.sh runs it)
//! bin/gpu_*            weave-bench's benches crates/bench/benches/gpu_* (when there are any)
//! scenarios/*.weave    tests/scenarios/*.weave (not its other subdirectories)
//! scenarios/kernels/*  tests/scenarios/kernels/*.weave (the kernel benchmark's fixtures)
//! scripts/*            scripts/gpu/* (run-all.sh, table.py)
//! MANIFEST.txt         commit, date, and every file with its size
//! ```
//!
//! The executables' paths come from cargo's JSON messages, never from guessing.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{bail, Context};
use cargo_metadata::{Message, TargetKind};

/// A bundle larger than this gets a warning (what the GPU machine accepts is 64 MiB).
const WARN_BYTES: u64 = 60 * 1024 * 1024;

/// The cargo profile the bundle is built with (root Cargo.toml).
const PROFILE: &str = "bundle";

/// The root package: the CLI and the GPU integration test.
const CLI_PACKAGE: &str = "weave-cli";

/// The benchmark package and its directory.
const BENCH_PACKAGE: &str = "weave-bench";
const BENCH_DIR: &str = "crates/bench";

/// Options of `cargo xtask gpu-bundle`.
#[derive(clap::Args)]
pub struct BundleArgs {
    /// Where to write the bundle; it must be git-ignored when inside the repository, and is
    /// replaced when it holds an earlier bundle. Default: target/gpu-bundle.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Build with these features of weave-cli and weave-bench (both forward them to
    /// streamweave) instead of their defaults: the CUDA and
    /// NCCL versions of the GPU machine, e.g. `cuda-12080,nccl-02027` (one of each; default
    /// `cuda-13000,nccl-02028`).
    #[arg(long, value_name = "LIST")]
    features: Option<String>,
}

/// One executable to build: the cargo subcommand and target selection, the target's name
/// and kind in cargo's messages, and its name in the bundle's `bin/`.
struct Build {
    package: &'static str,
    cargo_args: Vec<String>,
    target: String,
    kind: &'static str,
    bundle_name: String,
}

/// Builds the executables and writes the bundle.
pub fn run(args: &BundleArgs) -> anyhow::Result<ExitCode> {
    let root = crate::validate::workspace_root();
    let out = match &args.out {
        Some(dir) => std::env::current_dir()
            .context("cannot read the working directory")?
            .join(dir),
        None => root.join("target/gpu-bundle"),
    };
    check_ignored(&root, &out)?;
    check_replaceable(&out)?;

    let mut builds = vec![Build {
        package: CLI_PACKAGE,
        cargo_args: vec!["build".into(), "--bin".into(), "weave".into()],
        target: "weave".into(),
        kind: "bin",
        bundle_name: "weave".into(),
    }];
    // An integration test of the root package, built as an executable of the bundle.
    let test = |target: &str, bundle_name: &str| Build {
        package: CLI_PACKAGE,
        cargo_args: ["test", "--test", target, "--no-run"]
            .map(String::from)
            .to_vec(),
        target: target.into(),
        kind: "test",
        bundle_name: bundle_name.into(),
    };
    if root.join("tests/gpu.rs").is_file() {
        builds.push(test("gpu", "gpu-tests"));
    } else {
        eprintln!("warning: tests/gpu.rs does not exist; the bundle has no bin/gpu-tests");
    }
    // The command-line fuzz harness, for a machine with many cores (it runs bin/weave).
    if root.join("tests/fuzz_cli.rs").is_file() {
        builds.push(test("fuzz_cli", "fuzz-cli"));
    }
    for bench in gpu_benches(&root.join(BENCH_DIR).join("benches"))? {
        builds.push(Build {
            package: BENCH_PACKAGE,
            cargo_args: vec![
                "bench".into(),
                "--bench".into(),
                bench.clone(),
                "--no-run".into(),
            ],
            target: bench.clone(),
            kind: "bench",
            bundle_name: bench,
        });
    }

    if let Some(features) = &args.features {
        for build in &mut builds {
            build.cargo_args.extend([
                "--no-default-features".to_string(),
                "--features".to_string(),
                features.clone(),
            ]);
        }
    }
    let mut executables = Vec::new();
    for build in &builds {
        let exe = cargo_build(&root, build)?;
        executables.push((build.bundle_name.clone(), exe));
    }

    prepare_out(&out)?;
    let mut files: Vec<PathBuf> = Vec::new();
    for (name, exe) in &executables {
        files.push(copy(exe, &out, &Path::new("bin").join(name))?);
    }
    for (scenario, to) in scenarios(&root.join("tests/scenarios"))? {
        files.push(copy(&scenario, &out, &to)?);
    }
    for script in files_in(&root.join("scripts/gpu"), None)? {
        let name = script.file_name().unwrap_or_default();
        files.push(copy(&script, &out, &Path::new("scripts").join(name))?);
    }

    let manifest = manifest(&root, &out, &files)?;
    std::fs::write(out.join("MANIFEST.txt"), &manifest)
        .with_context(|| format!("cannot write {}", out.join("MANIFEST.txt").display()))?;
    let total = dir_size(&out)?;
    print!("{manifest}");
    println!(
        "gpu-bundle: {} ({total} bytes, {:.1} MiB in all)",
        out.display(),
        mib(total)
    );
    if total > WARN_BYTES {
        eprintln!(
            "warning: the bundle is {:.1} MiB, over {:.0} MiB; the GPU machine takes at most 64 MiB",
            mib(total),
            mib(WARN_BYTES)
        );
    }
    println!(
        "on the GPU machine, from the bundle directory: bash scripts/run-all.sh [--ranks \"2 4\"] [--out DIR]"
    );
    if executables.iter().any(|(name, _)| name == "fuzz-cli") {
        println!(
            "the command-line fuzz, from the bundle directory: MINUTES=10 JOBS=48 bash scripts/fuzz_cli.sh"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Fails unless `out` is outside the repository or git-ignored in it.
fn check_ignored(root: &Path, out: &Path) -> anyhow::Result<()> {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let out = normalize(out);
    let Ok(inside) = out.strip_prefix(&root) else {
        return Ok(());
    };
    if inside.as_os_str().is_empty() {
        bail!(
            "--out {}: the bundle cannot be the repository itself",
            out.display()
        );
    }
    // The trailing slash makes directory patterns (`/gpu-bundle/`) match before it exists.
    let status = Command::new("git")
        .arg("check-ignore")
        .arg("-q")
        .arg(format!("{}/", inside.display()))
        .current_dir(&root)
        .stdout(Stdio::null())
        .status();
    match status.map(|s| s.code()) {
        Ok(Some(0)) => Ok(()),
        Ok(Some(1)) => bail!(
            "--out {}: the bundle must be git-ignored (e.g. under target/)",
            out.display()
        ),
        _ => {
            eprintln!(
                "warning: cannot ask git whether {} is ignored",
                out.display()
            );
            Ok(())
        }
    }
}

/// `path` with `.` and `..` components resolved textually, and the longest existing prefix
/// canonicalized (so symlinks in it compare equal to the repository root).
fn normalize(path: &Path) -> PathBuf {
    let mut clean = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                clean.pop();
            }
            other => clean.push(other),
        }
    }
    let mut existing = clean.clone();
    let mut rest = Vec::new();
    while !existing.exists() {
        match existing.file_name() {
            Some(name) => rest.push(name.to_os_string()),
            None => break,
        }
        existing.pop();
    }
    let mut resolved = existing.canonicalize().unwrap_or(existing);
    resolved.extend(rest.iter().rev());
    resolved
}

/// The names of the benches whose entries in `benches/` start with `gpu_` (`gpu_x.rs` or a
/// directory `gpu_x/`), sorted.
fn gpu_benches(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(names);
    };
    for entry in entries {
        let path = entry
            .with_context(|| format!("cannot list {}", dir.display()))?
            .path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !name.starts_with("gpu_") {
            continue;
        }
        if path.is_dir() {
            names.push(name.to_string());
        } else if let Some(stem) = name.strip_suffix(".rs") {
            names.push(stem.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// Runs one cargo build with `--profile bundle --message-format=json-render-diagnostics` and
/// returns the executable cargo reports for the build's target.
fn cargo_build(root: &Path, build: &Build) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut args = build.cargo_args.clone();
    args.extend(
        [
            "--package",
            build.package,
            "--profile",
            PROFILE,
            "--message-format=json-render-diagnostics",
        ]
        .map(String::from),
    );
    eprintln!("==> cargo {}", args.join(" "));
    let output = Command::new(&cargo)
        .args(&args)
        .current_dir(root)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start `cargo {}`", args.join(" ")))?;
    if !output.status.success() {
        bail!("`cargo {}` failed ({})", args.join(" "), output.status);
    }
    let messages = String::from_utf8_lossy(&output.stdout);
    executable(&messages, &build.target, build.kind).with_context(|| {
        format!(
            "`cargo {}` reported no executable for the {} target `{}`",
            args.join(" "),
            build.kind,
            build.target
        )
    })
}

/// The `executable` of the compiler-artifact message for the target `name` of kind `kind`
/// among cargo's JSON messages, read by `cargo_metadata` (one per line; other lines are
/// ignored).
fn executable(messages: &str, name: &str, kind: &str) -> Option<PathBuf> {
    let kind = TargetKind::from(kind);
    Message::parse_stream(messages.as_bytes())
        .filter_map(Result::ok)
        .filter_map(|m| match m {
            Message::CompilerArtifact(a) if a.target.name == name => Some(a),
            _ => None,
        })
        .filter(|a| a.target.kind.contains(&kind))
        .filter_map(|a| a.executable.map(PathBuf::from))
        .last()
}

/// Fails when `out` exists and is neither an empty directory nor an earlier bundle (one
/// with a MANIFEST.txt), before anything is built.
fn check_replaceable(out: &Path) -> anyhow::Result<()> {
    if !out.exists() {
        return Ok(());
    }
    let mut entries =
        std::fs::read_dir(out).with_context(|| format!("cannot list {}", out.display()))?;
    if entries.next().is_some() && !out.join("MANIFEST.txt").is_file() {
        bail!(
            "{} exists and does not hold an earlier bundle (no MANIFEST.txt); remove it or choose another --out",
            out.display()
        );
    }
    Ok(())
}

/// Makes `out` an empty directory: creates it, or replaces it when it is empty or holds an
/// earlier bundle; anything else is left alone and refused.
fn prepare_out(out: &Path) -> anyhow::Result<()> {
    check_replaceable(out)?;
    if out.exists() {
        std::fs::remove_dir_all(out)
            .with_context(|| format!("cannot remove the earlier bundle {}", out.display()))?;
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))
}

/// Copies `from` to `out/to` (keeping its permissions); returns `to`.
fn copy(from: &Path, out: &Path, to: &Path) -> anyhow::Result<PathBuf> {
    let dest = out.join(to);
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::copy(from, &dest)
        .with_context(|| format!("cannot copy {} to {}", from.display(), dest.display()))?;
    Ok(to.to_path_buf())
}

/// The subdirectories of tests/scenarios that the bundle carries too.
const SCENARIO_SUBDIRS: [&str; 1] = ["kernels"];

/// The `.weave` files of the bundle's `scenarios/` (from `dir`, tests/scenarios), each with
/// its path in the bundle: those directly in `dir`, and those of [`SCENARIO_SUBDIRS`] under
/// the same subdirectory.
fn scenarios(dir: &Path) -> anyhow::Result<Vec<(PathBuf, PathBuf)>> {
    let mut out = Vec::new();
    let bundle = Path::new("scenarios");
    for file in files_in(dir, Some("weave"))? {
        let name = file.file_name().unwrap_or_default().to_os_string();
        out.push((file, bundle.join(name)));
    }
    for sub in SCENARIO_SUBDIRS {
        for file in files_in(&dir.join(sub), Some("weave"))? {
            let name = file.file_name().unwrap_or_default().to_os_string();
            out.push((file, bundle.join(sub).join(name)));
        }
    }
    Ok(out)
}

/// The plain files directly in `dir` (with extension `ext` when given), sorted; none when
/// `dir` does not exist.
fn files_in(dir: &Path, ext: Option<&str>) -> anyhow::Result<Vec<PathBuf>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .with_context(|| format!("cannot list {}", dir.display()))?
            .path();
        if path.is_file() && ext.is_none_or(|e| path.extension().is_some_and(|x| x == e)) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// The text of MANIFEST.txt: the commit, the date, the profile, and every file with its size.
fn manifest(root: &Path, out: &Path, files: &[PathBuf]) -> anyhow::Result<String> {
    let commit = git(root, &["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_string());
    let dirty = git(root, &["status", "--porcelain", "--untracked-files=no"])
        .is_some_and(|s| !s.is_empty());
    let mut text = String::from("streamweave GPU bundle\n");
    text += &format!(
        "commit: {commit}{}\n",
        if dirty {
            " (with uncommitted changes)"
        } else {
            ""
        }
    );
    text += &format!("date: {}\n", utc_now());
    text += &format!("profile: {PROFILE}\n\n");
    let mut total = 0;
    for file in files {
        let path = out.join(file);
        let size = std::fs::metadata(&path)
            .with_context(|| format!("cannot read {}", path.display()))?
            .len();
        total += size;
        text += &format!("{size:>12}  {}\n", file.display());
    }
    text += &format!(
        "{total:>12}  total, without this file ({:.1} MiB)\n",
        mib(total)
    );
    Ok(text)
}

/// The trimmed stdout of `git ARGS` in `root`, or `None` when git fails.
fn git(root: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(root)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The bytes of every file under `dir`.
fn dir_size(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            dir_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// Bytes in MiB.
fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The current UTC time as `YYYY-MM-DD HH:MM:SS UTC`.
fn utc_now() -> String {
    utc(jiff::Timestamp::now())
}

/// `t` in UTC as `YYYY-MM-DD HH:MM:SS UTC` (jiff's calendar).
fn utc(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_executable_comes_from_the_matching_artifact_message() {
        // Messages as cargo writes them (the fields `cargo_metadata` requires).
        let artifact = |kind: &str, name: &str, exe: Option<&str>| {
            serde_json::json!({
                "reason": "compiler-artifact",
                "package_id": "path+file:///t#weave-cli@0.1.0",
                "manifest_path": "/t/Cargo.toml",
                "target": {
                    "kind": [kind], "crate_types": [kind], "name": name,
                    "src_path": "/t/src/main.rs", "edition": "2021",
                    "doctest": false, "test": true, "doc": false,
                },
                "profile": {
                    "opt_level": "3", "debuginfo": 0, "debug_assertions": false,
                    "overflow_checks": false, "test": false,
                },
                "features": [], "filenames": [], "executable": exe, "fresh": false,
            })
            .to_string()
        };
        let messages = [
            artifact("lib", "streamweave", None),
            artifact("bin", "weave", Some("/t/bundle/weave")),
            artifact("test", "gpu", Some("/t/bundle/deps/gpu-0123")),
            "not json".to_string(),
            r#"{"reason":"build-finished","success":true}"#.to_string(),
        ]
        .join("\n");
        let messages = messages.as_str();
        assert_eq!(
            executable(messages, "weave", "bin"),
            Some(PathBuf::from("/t/bundle/weave"))
        );
        assert_eq!(
            executable(messages, "gpu", "test"),
            Some(PathBuf::from("/t/bundle/deps/gpu-0123"))
        );
        assert_eq!(executable(messages, "gpu", "bench"), None);
        assert_eq!(executable(messages, "streamweave", "lib"), None);
    }

    #[test]
    fn timestamps_read_as_utc_dates() {
        let at = |secs| utc(jiff::Timestamp::from_second(secs).unwrap());
        assert_eq!(at(0), "1970-01-01 00:00:00 UTC");
        // Day 11 016 since 1970 is 2000-02-29 (a leap day); one hour, one minute, one second in.
        assert_eq!(at(11_016 * 86_400 + 3_661), "2000-02-29 01:01:01 UTC");
        assert_eq!(at(19_723 * 86_400 - 1), "2023-12-31 23:59:59 UTC");
    }

    #[test]
    fn only_gpu_benches_are_bundled() {
        let dir = std::env::temp_dir().join(format!("xtask-benches-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("gpu_dir")).unwrap();
        for f in ["gpu_overlap.rs", "compile.rs", "gpu_notes.txt"] {
            std::fs::write(dir.join(f), "").unwrap();
        }
        let names = gpu_benches(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(names, ["gpu_dir", "gpu_overlap"]);
    }

    #[test]
    fn scenarios_and_the_kernel_fixtures_are_bundled() {
        let dir = std::env::temp_dir().join(format!("xtask-scenarios-{}", std::process::id()));
        for sub in ["kernels", "invalid"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        for f in [
            "b.weave",
            "a.weave",
            "README.md",
            "kernels/add.weave",
            "kernels/notes.txt",
            "invalid/bad.weave",
        ] {
            std::fs::write(dir.join(f), "").unwrap();
        }
        let found = scenarios(&dir).unwrap();
        let from: Vec<PathBuf> = found
            .iter()
            .map(|(f, _)| f.strip_prefix(&dir).unwrap().to_path_buf())
            .collect();
        let to: Vec<PathBuf> = found.iter().map(|(_, t)| t.clone()).collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            from,
            ["a.weave", "b.weave", "kernels/add.weave"].map(PathBuf::from)
        );
        assert_eq!(
            to,
            [
                "scenarios/a.weave",
                "scenarios/b.weave",
                "scenarios/kernels/add.weave"
            ]
            .map(PathBuf::from)
        );
    }
}
