//! Tidy checks: the repository's conventions, tested like code.
//!
//! * every `.rs` file opens with a `//!` module doc;
//! * crate dependencies point the one way docs/ARCHITECTURE.md draws (read from
//!   `cargo metadata`), and nothing from `weave-ir` to `weave-passes`, nor the kernel code
//!   generator `weave-codegen`, depends on cudarc;
//! * the user-facing library `streamweave` pulls no CLI, progress-bar, error-reporting or
//!   log-subscriber crate into a user's build (its normal dependency tree, from the resolve
//!   graph of `cargo metadata`) and, like the compiler crates, reads no environment variable
//!   (the binaries do), and no published package needs an unpublished one;
//! * a CPU-only `weave` (`cargo build -p weave-cli --no-default-features`) builds neither
//!   cudarc nor weave-cuda (`cargo tree`);
//! * every workspace package inherits the workspace lints;
//! * every repository path that README.md and docs/*.md name exists.
//! * no file of a crate imports itself through others (an import cycle between files), but
//!   for the cycles listed as not yet broken;
//! * what a host statement touches is derived in one place (`Stmt::effects`), and so is the
//!   mapping of the host IR's collectives onto the communicator's operations;
//! * no struct of the crates in `SIDE_TABLE_CRATES` keeps a `HashMap` or `HashSet` keyed by
//!   an arena key (a `new_key_type!` id): side tables are `SecondaryMap`s;
//! * no source file (tests apart) is over `MAX_SOURCE_LINES` lines: a file that grows past
//!   it is split by concern;
//! * no public function returns `Result<_, String>`: an error is a type that says what
//!   failed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

mod import_graph;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, skipping build output and hidden directories.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("readable directory entry").path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if path.is_dir() {
            if name.starts_with('.') || name == "target" {
                continue;
            }
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The most lines a source file (not a test) may have.
const MAX_SOURCE_LINES: usize = 900;

/// Whether `relative` (a path below the repository root) holds tests: a `tests/` folder or
/// a `tests.rs` module.
fn is_test_file(relative: &Path) -> bool {
    relative.components().any(|c| c.as_os_str() == "tests")
        || relative.file_name().is_some_and(|n| n == "tests.rs")
}

#[test]
fn no_source_file_is_over_the_line_limit() {
    let root = repo_root();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut offenders: Vec<String> = files
        .iter()
        .filter_map(|p| {
            let relative = p.strip_prefix(&root).unwrap_or(p);
            if is_test_file(relative) {
                return None;
            }
            let lines = std::fs::read_to_string(p)
                .unwrap_or_default()
                .lines()
                .count();
            (lines > MAX_SOURCE_LINES).then(|| format!("{} ({lines} lines)", relative.display()))
        })
        .collect();
    offenders.sort();
    assert!(
        offenders.is_empty(),
        "these source files are over {MAX_SOURCE_LINES} lines; split them by concern:\n  {}",
        offenders.join("\n  ")
    );
    assert!(is_test_file(Path::new("crates/comm/src/copy/tests.rs")));
    assert!(is_test_file(Path::new("tests/tidy.rs")));
    assert!(!is_test_file(Path::new("crates/comm/src/ipc.rs")));
}

/// Public functions that still return `Result<_, String>`, as `path: name`: the list may only
/// shrink (it is empty).
const STRING_ERRORS: &[&str] = &[];

/// The `pub fn`s of `text` whose signature returns `Result<_, String>`: their names.
fn string_error_functions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("pub fn ") {
        let after = &rest[at + "pub fn ".len()..];
        let end = after.find(['{', ';']).unwrap_or(after.len());
        let signature: String = after[..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let returns = signature.rsplit_once("->").map_or("", |(_, r)| r.trim());
        if returns.starts_with("Result<") && returns.ends_with(", String>") {
            let name: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
        rest = &after[end.min(after.len())..];
    }
    out
}

#[test]
fn public_functions_return_typed_errors() {
    assert_eq!(
        string_error_functions(
            "pub fn a(x: u8)\n    -> Result<(), String> {}\npub fn b() -> Result<u8, E> {}\n\
             pub fn c() -> Result<Vec<u8>, String>;"
        ),
        ["a", "c"]
    );
    let root = repo_root();
    let mut files = Vec::new();
    for dir in ["crates", "src", "xtask"] {
        rust_files(&root.join(dir), &mut files);
    }
    let mut found: Vec<String> = files
        .iter()
        .filter_map(|p| {
            let relative = p.strip_prefix(&root).unwrap_or(p).to_path_buf();
            (!is_test_file(&relative)).then_some((relative, p))
        })
        .flat_map(|(relative, p)| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            string_error_functions(&text)
                .into_iter()
                .map(move |name| format!("{}: {name}", relative.display()))
        })
        .collect();
    found.sort();
    let new: Vec<&String> = found
        .iter()
        .filter(|f| !STRING_ERRORS.contains(&f.as_str()))
        .collect();
    assert!(
        new.is_empty(),
        "these public functions return Result<_, String>; give them an error type that \
         says what failed:\n  {new:?}"
    );
    let gone: Vec<&&str> = STRING_ERRORS
        .iter()
        .filter(|k| !found.iter().any(|f| f == *k))
        .collect();
    assert!(
        gone.is_empty(),
        "converted, so remove them from STRING_ERRORS: {gone:?}"
    );
}

#[test]
fn every_rust_file_starts_with_a_module_doc() {
    let root = repo_root();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(
        !files.is_empty(),
        "no .rs files found under {}",
        root.display()
    );
    let mut offenders: Vec<String> = files
        .iter()
        .filter(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            !text.starts_with("//!")
        })
        .map(|p| p.strip_prefix(&root).unwrap_or(p).display().to_string())
        .collect();
    offenders.sort();
    assert!(
        offenders.is_empty(),
        "these files do not begin with a `//!` line saying what they hold:\n  {}",
        offenders.join("\n  ")
    );
}

/// The direct dependencies each layer may have among the workspace's crates
/// (docs/ARCHITECTURE.md, "Dependency graph"). A crate may also depend on anything these
/// reach, so `weave-segmenter` may name `weave-ir` directly; nothing may point back up.
const ARROWS: &[(&str, &[&str])] = &[
    ("weave-ir", &[]),
    ("weave-transform", &["weave-ir"]),
    ("weave-segmenter", &["weave-transform"]),
    ("weave-host-ir", &["weave-ir"]),
    (
        "weave-passes",
        &[
            "weave-ir",
            "weave-transform",
            "weave-segmenter",
            "weave-host-ir",
        ],
    ),
    ("weave-cuda", &[]),
    ("weave-comm", &["weave-cuda"]),
    // The kernel code generator: fusions and dtypes only (crates/codegen).
    ("weave-codegen", &["weave-ir"]),
    (
        "weave-executor",
        &["weave-host-ir", "weave-codegen", "weave-cuda", "weave-comm"],
    ),
    (
        "streamweave",
        &[
            "weave-ir",
            "weave-transform",
            "weave-segmenter",
            "weave-host-ir",
            "weave-passes",
            "weave-cuda",
            "weave-comm",
            "weave-codegen",
            "weave-executor",
        ],
    ),
    ("weave-bench", &["streamweave"]),
    // The benchmark harness only as a dev-dependency (tests/gpu.rs):
    // `published_packages_need_no_unpublished_one` checks the kind.
    ("weave-cli", &["streamweave", "weave-bench"]),
    // `cargo xtask dump` runs `weave dump` through cargo rather than linking it.
    ("xtask", &[]),
    // The Python extension module: the facade only (crates/python).
    ("streamweave-python", &["streamweave"]),
];

/// Crates an application chooses for itself, which the user-facing library must not bring
/// into its users' builds.
const APPLICATION_ONLY: &[&str] = &["clap", "indicatif", "anyhow", "tracing-subscriber"];

/// The crates that compile and transform IR, and the kernel code generator (whose output is
/// text); they run without a GPU and never link CUDA.
const CUDA_FREE: &[&str] = &[
    "weave-ir",
    "weave-transform",
    "weave-segmenter",
    "weave-host-ir",
    "weave-passes",
    "weave-codegen",
];

/// For each crate, every workspace crate it may depend on (the transitive closure of
/// [`ARROWS`]).
fn allowed_dependencies() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    let direct: BTreeMap<&str, &[&str]> = ARROWS.iter().copied().collect();
    direct
        .keys()
        .map(|&krate| {
            let mut reach = BTreeSet::new();
            let mut stack: Vec<&str> = direct[krate].to_vec();
            while let Some(dep) = stack.pop() {
                if reach.insert(dep) {
                    stack.extend(direct.get(dep).copied().unwrap_or_default());
                }
            }
            (krate, reach)
        })
        .collect()
}

fn cargo_metadata() -> Value {
    metadata(&["--no-deps"])
}

/// The standard output of `cargo ARGS...` run in the repository root; a failure shows its
/// standard error.
fn cargo_output(args: &[&str]) -> Vec<u8> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let out = Command::new(cargo)
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| panic!("cargo {} does not run: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "cargo {} failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `cargo metadata --format-version 1 EXTRA...` as JSON.
fn metadata(extra: &[&str]) -> Value {
    let args: Vec<&str> = ["metadata", "--format-version", "1"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    serde_json::from_slice(&cargo_output(&args)).expect("cargo metadata prints JSON")
}

fn str_field<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("cargo metadata: `{key}` is not a string in {v}"))
}

#[test]
fn crate_dependencies_point_one_way() {
    let meta = cargo_metadata();
    let packages = meta["packages"].as_array().expect("packages array");
    let allowed = allowed_dependencies();
    let members: BTreeSet<&str> = packages.iter().map(|p| str_field(p, "name")).collect();

    let mut problems = Vec::new();
    for name in &members {
        if !allowed.contains_key(name) {
            problems.push(format!(
                "workspace package `{name}` has no place in the dependency graph; add it to \
                 ARROWS here and to docs/ARCHITECTURE.md"
            ));
        }
    }
    for package in packages {
        let name = str_field(package, "name");
        let Some(may_use) = allowed.get(name) else {
            continue;
        };
        for dep in package["dependencies"]
            .as_array()
            .expect("dependencies array")
        {
            let dep_name = str_field(dep, "name");
            let kind = dep["kind"].as_str().unwrap_or("normal");
            if members.contains(dep_name) && !may_use.contains(dep_name) {
                problems.push(format!(
                    "`{name}` depends on `{dep_name}` ({kind}), against the arrows; it may use: {}",
                    may_use.iter().copied().collect::<Vec<_>>().join(", ")
                ));
            }
            if CUDA_FREE.contains(&name) && dep_name == "cudarc" {
                problems.push(format!(
                    "`{name}` depends on cudarc; only weave-cuda and weave-comm may bind CUDA"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Whether a Cargo.toml's text opts into the workspace lints, as `[lints]` followed by
/// `workspace = true`, or as `lints.workspace = true`.
fn inherits_workspace_lints(manifest: &str) -> bool {
    let mut in_lints = false;
    for line in manifest.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
        if line.starts_with('[') {
            in_lints = compact == "[lints]";
        } else if compact == "lints.workspace=true" || (in_lints && compact == "workspace=true") {
            return true;
        }
    }
    false
}

#[test]
fn every_package_inherits_the_workspace_lints() {
    let meta = cargo_metadata();
    let mut missing = Vec::new();
    for package in meta["packages"].as_array().expect("packages array") {
        let manifest = str_field(package, "manifest_path");
        let text = std::fs::read_to_string(manifest).unwrap_or_else(|e| panic!("{manifest}: {e}"));
        if !inherits_workspace_lints(&text) {
            missing.push(format!("{} ({manifest})", str_field(package, "name")));
        }
    }
    assert!(
        missing.is_empty(),
        "these packages lack `[lints] workspace = true`:\n  {}",
        missing.join("\n  ")
    );
}

/// The compiler crates ([`CUDA_FREE`]) and the user-facing library are libraries: they read
/// no environment variable, so that what a program compiles and how it runs depend on their
/// arguments only. The binaries read `WEAVE_DUMP`, `WEAVE_CALIBRATION` and a launched
/// process's `RANK`, ... and hand them in.
#[test]
fn compiler_crates_read_no_environment_variable() {
    let meta = cargo_metadata();
    let mut offenders = Vec::new();
    for package in meta["packages"].as_array().expect("packages array") {
        let name = str_field(package, "name");
        if !CUDA_FREE.contains(&name) && name != "streamweave" {
            continue;
        }
        let manifest = Path::new(str_field(package, "manifest_path"));
        let mut files = Vec::new();
        rust_files(&manifest.with_file_name("src"), &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            for (n, line) in text.lines().enumerate() {
                if ["env::var(", "env::var_os(", "env::vars("]
                    .iter()
                    .any(|call| line.contains(call))
                {
                    offenders.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "a compiler crate reads the environment:\n  {}",
        offenders.join("\n  ")
    );
}

/// The names of every package that `root` reaches through normal (not dev, not build)
/// dependencies in the resolve graph of `meta`, `root` excluded.
fn normal_closure(meta: &Value, root: &str) -> BTreeSet<String> {
    let nodes = meta["resolve"]["nodes"].as_array().expect("resolve nodes");
    let packages = meta["packages"].as_array().expect("packages array");
    let name_of: BTreeMap<&str, &str> = packages
        .iter()
        .map(|p| (str_field(p, "id"), str_field(p, "name")))
        .collect();
    let edges: BTreeMap<&str, Vec<&str>> = nodes
        .iter()
        .map(|n| {
            let normal = n["deps"]
                .as_array()
                .expect("node deps")
                .iter()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .is_some_and(|kinds| kinds.iter().any(|k| k["kind"].is_null()))
                })
                .map(|d| str_field(d, "pkg"))
                .collect();
            (str_field(n, "id"), normal)
        })
        .collect();
    let start = name_of
        .iter()
        .find(|(_, name)| **name == root)
        .map(|(id, _)| *id)
        .unwrap_or_else(|| panic!("no package `{root}` in cargo metadata"));
    let mut seen = BTreeSet::new();
    let mut stack = vec![start];
    while let Some(id) = stack.pop() {
        for &dep in edges.get(id).map(Vec::as_slice).unwrap_or_default() {
            if seen.insert(dep) {
                stack.push(dep);
            }
        }
    }
    seen.iter()
        .map(|id| name_of.get(id).copied().unwrap_or(id).to_string())
        .collect()
}

#[test]
fn the_library_pulls_no_application_crates_into_a_users_build() {
    let meta = metadata(&[]);
    let closure = normal_closure(&meta, "streamweave");
    assert!(
        closure.contains("weave-executor") && closure.contains("serde"),
        "the closure misses the library's own dependencies: {closure:?}"
    );
    let found: Vec<&str> = APPLICATION_ONLY
        .iter()
        .copied()
        .filter(|c| closure.contains(*c))
        .collect();
    assert!(
        found.is_empty(),
        "streamweave's dependency tree holds {found:?}; they belong to the CLI (weave-cli) or \
         the benchmarks (weave-bench) (`cargo tree -p streamweave -e normal -i CRATE` shows why)"
    );
    // The CLI, on the other hand, does use them: the check looks where it should.
    let cli = normal_closure(&meta, "weave-cli");
    assert!(
        cli.contains("clap") && cli.contains("tracing-subscriber"),
        "{cli:?}"
    );
}

#[test]
fn published_packages_need_no_unpublished_one() {
    let meta = cargo_metadata();
    let packages = meta["packages"].as_array().expect("packages array");
    // `publish = false` reads as an empty list of registries.
    let unpublished: BTreeSet<&str> = packages
        .iter()
        .filter(|p| p["publish"].as_array().is_some_and(Vec::is_empty))
        .map(|p| str_field(p, "name"))
        .collect();
    assert!(unpublished.contains("weave-bench"), "{unpublished:?}");
    let mut problems = Vec::new();
    for package in packages {
        let name = str_field(package, "name");
        if unpublished.contains(name) {
            continue;
        }
        for dep in package["dependencies"].as_array().expect("dependencies") {
            let dep_name = str_field(dep, "name");
            let kind = dep["kind"].as_str().unwrap_or("normal");
            if unpublished.contains(dep_name) && kind != "dev" {
                problems.push(format!(
                    "`{name}` is published but depends on the unpublished `{dep_name}` ({kind})"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The top-level folders of the repository: a word of README.md or docs/*.md that starts with
/// one of them names a repository path.
const REPO_DIRS: &[&str] = &[
    "crates/", "docs/", "scripts/", "tests/", "src/", "xtask/", "python/", ".ci/", ".github/",
];

/// Whether the repository path `path` (from the root) exists. A `scripts/NAME` also exists
/// as `scripts/gpu/NAME`: the GPU bundle copies scripts/gpu/ to its `scripts/`, where the
/// docs' commands run (`bash scripts/bench.sh`).
fn repo_path_exists(root: &Path, path: &str) -> bool {
    root.join(path).exists()
        || path
            .strip_prefix("scripts/")
            .is_some_and(|rest| root.join("scripts/gpu").join(rest).exists())
}

/// Every repository path README.md and docs/*.md name: relative link targets (from the
/// document's folder) and words that start with a top-level folder (from the root).
fn broken_doc_paths(root: &Path) -> Vec<String> {
    let mut docs = vec![root.join("README.md")];
    let mut in_docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    in_docs.sort();
    docs.extend(in_docs);
    let mut broken = Vec::new();
    for doc in &docs {
        let text =
            std::fs::read_to_string(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
        let shown = doc.strip_prefix(root).unwrap_or(doc).display().to_string();
        // Links: `](target)`, a target with a `.` or a `/` (not grammar like `[A](B)`).
        for piece in text.split("](").skip(1) {
            let target = piece.split([')', ' ']).next().unwrap_or("");
            let target = target.split('#').next().unwrap_or("");
            let external = target.contains("://") || target.starts_with("mailto:");
            if target.is_empty() || external || !target.contains(['.', '/']) {
                continue;
            }
            let dir = doc.parent().unwrap_or(root);
            if !dir.join(target).exists() {
                broken.push(format!("{shown}: link to {target}"));
            }
        }
        // Words: runs of path characters that start with a top-level folder.
        let words = text.split(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c)));
        for word in words {
            let word = word.trim_end_matches('.');
            if REPO_DIRS.iter().any(|d| word.starts_with(d)) && !repo_path_exists(root, word) {
                broken.push(format!("{shown}: {word}"));
            }
        }
    }
    broken.sort();
    broken.dedup();
    broken
}

#[test]
fn every_repository_path_in_the_readme_and_docs_exists() {
    let root = repo_root();
    let broken = broken_doc_paths(&root);
    assert!(
        broken.is_empty(),
        "README.md and docs/ name paths that do not exist:\n  {}",
        broken.join("\n  ")
    );
    // The check looks where it should: a document naming a missing path is caught, a
    // present one and a bundle script are not.
    let dir = std::env::temp_dir().join(format!("weave-doc-paths-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    std::fs::create_dir_all(dir.join("scripts/gpu")).unwrap();
    std::fs::write(dir.join("scripts/gpu/bench.sh"), "").unwrap();
    std::fs::write(
        dir.join("README.md"),
        "Run `bash scripts/bench.sh`; see [the guide](docs/guide.md) and `crates/gone.rs`.\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("docs/guide.md"),
        "[back](../README.md), [x](missing.md)\n",
    )
    .unwrap();
    let found = broken_doc_paths(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        found,
        [
            "README.md: crates/gone.rs",
            "docs/guide.md: link to missing.md"
        ]
    );
}

/// The packages `cargo tree -p PACKAGE -e normal ARGS` lists (normal dependencies only, as a
/// user's build resolves them).
fn tree(package: &str, args: &[&str]) -> BTreeSet<String> {
    let all: Vec<&str> = [
        "tree",
        "--package",
        package,
        "--edges",
        "normal",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ]
    .into_iter()
    .chain(args.iter().copied())
    .collect();
    String::from_utf8_lossy(&cargo_output(&all))
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn a_cpu_only_weave_builds_no_cuda_bindings() {
    let cpu = tree("weave-cli", &["--no-default-features"]);
    assert!(
        cpu.contains("streamweave") && cpu.contains("clap"),
        "the tree misses the CLI's own dependencies: {cpu:?}"
    );
    let cuda: Vec<&String> = cpu
        .iter()
        .filter(|p| *p == "cudarc" || *p == "weave-cuda")
        .collect();
    assert!(
        cuda.is_empty(),
        "`cargo build -p weave-cli --no-default-features` builds {cuda:?}"
    );
    // The default build does have them: the check looks where it should.
    let default = tree("weave-cli", &[]);
    assert!(
        default.contains("cudarc") && default.contains("weave-cuda"),
        "{default:?}"
    );
}

/// Import cycles between files that are known and not yet broken: a cycle may only lie within
/// one of these. None is left; never add one.
const KNOWN_IMPORT_CYCLES: &[&[&str]] = &[];

#[test]
fn no_file_imports_itself_through_others() {
    let root = repo_root();
    let mut sources = vec![root.join("src"), root.join("xtask/src")];
    let crates = std::fs::read_dir(root.join("crates")).expect("crates/ is readable");
    for entry in crates {
        let src = entry.expect("readable directory entry").path().join("src");
        if src.is_dir() {
            sources.push(src);
        }
    }
    sources.sort();
    let mut offenders = Vec::new();
    for src in &sources {
        for cycle in import_graph::cycles(&root, src) {
            let known = KNOWN_IMPORT_CYCLES
                .iter()
                .any(|k| cycle.iter().all(|file| k.contains(&file.as_str())));
            if !known {
                offenders.push(cycle.join(" <-> "));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "these files import each other in a loop; move what they share into a module both \
         import, or let one side own it:\n  {}",
        offenders.join("\n  ")
    );
}

/// Where each fact about host statements is written (issue 30): what a statement reads,
/// writes, allocates, frees and views is `Stmt::effects` in the first file, which the
/// verifier, `allocate-and-deallocate` and the evaluator's race recording derive from; the
/// mapping from the host IR's collectives onto the communicator's operations is the second
/// file. Each entry: a definition or a pair of names that re-derive the fact wherever they
/// meet, and the one file allowed to hold it.
const ONE_PLACE: &[(&[&str], &str)] = &[
    (&["fn accesses("], "crates/host-ir/src/access.rs"),
    (&["fn effects("], "crates/host-ir/src/access.rs"),
    (&["fn reads("], "crates/host-ir/src/access.rs"),
    (&["fn writes("], "crates/host-ir/src/access.rs"),
    (
        &["CommunicationType::", "CommOp::"],
        "crates/executor/src/collective.rs",
    ),
];

#[test]
fn statement_effects_are_derived_in_one_place() {
    let root = repo_root();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut offenders = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&root).unwrap_or(path);
        let rel = rel.to_string_lossy().replace('\\', "/");
        if rel == "tests/tidy.rs" {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for (needles, home) in ONE_PLACE {
            if rel != *home && needles.iter().all(|n| text.contains(n)) {
                offenders.push(format!(
                    "{rel}: {} (belongs in {home})",
                    needles.join(" with ")
                ));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "these files re-derive what a host statement touches, or how a collective is posted, \
         instead of asking the one place that says it:\n  {}",
        offenders.join("\n  ")
    );
}

/// The crates whose structs keep side tables over arena keys in `SecondaryMap`s (issue 30):
/// a struct field there may not be a `HashMap` or `HashSet` keyed by a `new_key_type!` id.
const SIDE_TABLE_CRATES: &[&str] = &[
    "crates/ir",
    "crates/transform",
    "crates/segmenter",
    "crates/host-ir",
    "crates/codegen",
    "crates/executor",
    "crates/passes",
    "crates/streamweave",
    "crates/comm",
];

/// The names of every arena key type that a `new_key_type!` of the workspace's crates defines.
fn arena_key_types(root: &Path) -> BTreeSet<String> {
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    let mut keys = BTreeSet::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for (at, _) in text.match_indices("new_key_type!") {
            let rest = &text[at..];
            let Some(open) = rest.find('{') else { continue };
            let Some(close) = matching_close(rest, open) else {
                continue;
            };
            for line in rest[open + 1..close].lines() {
                let line = line.trim();
                if line.starts_with("//") {
                    continue;
                }
                if let Some(name) = line
                    .split("struct ")
                    .nth(1)
                    .and_then(|s| s.strip_suffix(';'))
                {
                    keys.insert(name.trim().to_string());
                }
            }
        }
    }
    keys
}

/// The index of the bracket closing the one at `open` (`{`, `(` or `[`), counting those three.
fn matching_close(text: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '{' | '(' | '[' => depth += 1,
            '}' | ')' | ']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `text` without its `//` comments (line and doc comments alike).
fn without_line_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |at| &l[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The fields of every struct in `text` (comments removed), each as its declaration text
/// (`pub name: Type` or, for a tuple struct, `Type`).
fn struct_fields(text: &str) -> Vec<String> {
    let text = without_line_comments(text);
    let mut fields = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("struct ") {
        let at = from + found;
        from = at + "struct ".len();
        // A declaration, not a word inside another: `struct` starts a token.
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &text[at..];
        let Some(open) = rest.find(['{', '(', ';']) else {
            break;
        };
        if rest.as_bytes()[open] == b';' {
            continue;
        }
        let Some(close) = matching_close(rest, open) else {
            break;
        };
        // Split the body at top-level commas (angle brackets count, `->` does not).
        let body = &rest[open + 1..close];
        let (mut depth, mut start, mut prev) = (0i32, 0, ' ');
        for (i, c) in body.char_indices() {
            match c {
                '<' | '(' | '[' | '{' => depth += 1,
                '>' if prev != '-' => depth -= 1,
                ')' | ']' | '}' => depth -= 1,
                ',' if depth == 0 => {
                    fields.push(body[start..i].trim().to_string());
                    start = i + 1;
                }
                _ => {}
            }
            prev = c;
        }
        fields.push(body[start..].trim().to_string());
        from = at + close;
    }
    fields.retain(|f| !f.is_empty());
    fields
}

/// The arena key that a `HashMap<K, _>` or `HashSet<K>` in `ty` is keyed by, if any.
fn hashed_by_arena_key<'k>(ty: &str, keys: &'k BTreeSet<String>) -> Option<&'k str> {
    for container in ["HashMap<", "HashSet<"] {
        for (at, _) in ty.match_indices(container) {
            let args = &ty[at + container.len()..];
            let key: String = args
                .split([',', '>'])
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .collect();
            let name = key.rsplit("::").next().unwrap_or_default();
            if let Some(k) = keys.get(name) {
                return Some(k);
            }
        }
    }
    None
}

#[test]
fn side_tables_over_arena_keys_are_secondary_maps() {
    let root = repo_root();
    let keys = arena_key_types(&root);
    assert!(
        keys.contains("TensorId") && keys.contains("ExprId"),
        "the arena key types were not found (new_key_type! in crates/ir/src/ids.rs): {keys:?}"
    );
    // The check itself: a field keyed by an id is found, across lines and through wrappers,
    // and function parameters, locals and other keys are not.
    let sample = "pub(crate) struct S<'a> {\n    /// A doc: HashMap<TensorId, u8>.\n    \
                  pub a: std::sync::OnceLock<std::collections::HashMap<\n        \
                  weave_ir::TensorId,\n        Vec<ExprId>,\n    >>,\n    \
                  b: HashMap<String, ExprId>,\n    c: &'a dyn Fn(u8) -> u8,\n}\n\
                  struct T(HashSet<ExprId>);\nfn f(x: HashMap<TensorId, u8>) {}\n";
    let found: Vec<Option<&str>> = struct_fields(sample)
        .iter()
        .map(|f| hashed_by_arena_key(f, &keys))
        .collect();
    assert_eq!(found, [Some("TensorId"), None, None, Some("ExprId")]);

    let mut offenders = Vec::new();
    for krate in SIDE_TABLE_CRATES {
        let mut files = Vec::new();
        rust_files(&root.join(krate), &mut files);
        files.sort();
        for path in files {
            let rel = path
                .strip_prefix(&root)
                .unwrap_or(&path)
                .display()
                .to_string();
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for field in struct_fields(&text) {
                if let Some(key) = hashed_by_arena_key(&field, &keys) {
                    let field = field.split_whitespace().collect::<Vec<_>>().join(" ");
                    offenders.push(format!("{rel}: `{field}` (keyed by {key})"));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "these struct fields keep a side table over arena keys in a HashMap or HashSet; use \
         slotmap's SecondaryMap (SparseSecondaryMap where few keys are present) instead:\n  {}",
        offenders.join("\n  ")
    );
}
