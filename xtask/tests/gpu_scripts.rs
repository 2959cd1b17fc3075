//! The scripts that run a GPU bundle (scripts/gpu), checked without a GPU: run-all.sh parses,
//! table.py turns passes, failures, crashed runs and skips into the table and verdict, and
//! run-all.sh drives a fake bundle (fake `weave`, `gpu-tests` and `nvidia-smi`) end to end.
//! The checks that need bash or python3 skip themselves where those are missing.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu")
}

fn have(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A fresh, empty scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn write_executable(path: &Path, text: &str) {
    write(path, text);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn every_shell_script_parses() {
    if !have("bash") {
        eprintln!("skipped: no bash");
        return;
    }
    let mut checked = 0;
    for entry in std::fs::read_dir(scripts()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "sh") {
            let out = Command::new("bash").arg("-n").arg(&path).output().unwrap();
            assert!(out.status.success(), "{}: {}", path.display(), text(&out));
            checked += 1;
        }
    }
    assert!(
        checked >= 6,
        "only {checked} scripts found in {}",
        scripts().display()
    );
}

const PASS: &str = r#"{"scenario":"a","ranks":2,"mode":"threads","backend":"cuda","passed":true,"max_abs_error":0.01,"max_rel_error":0.001,"wall_ms":12.3,"error":null}"#;
const FAIL: &str = r#"{"scenario":"b","ranks":2,"mode":"threads","backend":"cuda","passed":false,"max_abs_error":3.5,"max_rel_error":0.9,"wall_ms":10,"error":"output out differs"}"#;

/// table.py over a fresh scratch directory `name` holding the run summaries `runs` (path in
/// the directory, JSON) and `attempted.txt`: whether its verdict passed and what it printed
/// (written to table.md too); `None`, said on stderr, where there is no python3.
fn table(name: &str, runs: &[(&str, &str)], attempted: &str) -> Option<(bool, String)> {
    if !have("python3") {
        eprintln!("skipped: no python3");
        return None;
    }
    let dir = scratch(name);
    for (path, json) in runs {
        write(&dir.join(path), json);
    }
    write(&dir.join("attempted.txt"), attempted);
    let out = Command::new("python3")
        .arg(scripts().join("table.py"))
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let written = std::fs::read_to_string(dir.join("table.md")).unwrap_or_default();
    assert_eq!(stdout, written, "table.md differs from what was printed");
    std::fs::remove_dir_all(&dir).unwrap();
    Some((out.status.success(), stdout))
}

#[test]
fn table_counts_passes_failures_crashes_and_skips() {
    let attempted = "a 2 threads 0\nb 2 threads 1\nc 4 launch 124\nsend_recv 4 threads skipped fixed meshes of 2 devices\n";
    let runs = [
        ("json/a.2.threads.json", PASS),
        ("json/b.2.threads.json", FAIL),
    ];
    let Some((ok, out)) = table("table-mixed", &runs, attempted) else {
        return;
    };
    assert!(!ok, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "| scenario | ranks | mode | max abs err | max rel err | wall ms | result |"
    );
    assert_eq!(lines[2], "| a | 2 | threads | 0.01 | 0.001 | 12.3 | PASS |");
    assert_eq!(
        lines[3],
        "| b | 2 | threads | 3.5 | 0.9 | 10.0 | FAIL (rc 1, output out differs) |"
    );
    assert_eq!(
        lines[4],
        "| c | 4 | launch | - | - | - | FAIL (rc 124, timed out) |"
    );
    assert_eq!(
        lines[5],
        "| send_recv | 4 | threads | - | - | - | SKIP (fixed meshes of 2 devices) |"
    );
    assert_eq!(lines.last(), Some(&"FAILED: 2 of 3 (1 skipped)"));
}

#[test]
fn table_passes_when_every_run_passed() {
    let attempted = "a 2 threads 0\na 2 launch 0\ngpu-tests - tests 0\n";
    let runs = [
        ("json/a.2.threads.json", PASS),
        ("json/a.2.launch.json", PASS),
    ];
    let Some((ok, out)) = table("table-pass", &runs, attempted) else {
        return;
    };
    assert!(ok, "{out}");
    assert!(
        out.contains("| gpu-tests | - | tests | - | - | - | PASS |"),
        "{out}"
    );
    assert_eq!(out.lines().last(), Some("ALL PASS (3 runs)"));
}

/// A stand-in for `weave`: `run` writes a passing JSON for most scenarios, prints
/// `skipped:` for `skipper`, and exits 7 without JSON for `broken`; `launch` runs the
/// command once per rank with RANK set and the output prefixed.
const FAKE_WEAVE: &str = r#"#!/bin/sh
if [ "$NCCL_NVLS_ENABLE" != 0 ]; then echo "NCCL_NVLS_ENABLE is not 0"; exit 9; fi
if [ "$1" = launch ]; then
    n=$3
    while [ "$1" != -- ]; do shift; done
    shift
    r=0; st=0; log=$(mktemp)
    while [ "$r" -lt "$n" ]; do
        RANK=$r WORLD_SIZE=$n "$@" >"$log" 2>&1 || st=1
        sed "s/^/[rank $r] /" "$log"
        r=$((r + 1))
    done
    rm -f "$log"
    exit "$st"
fi
file=$2; shift 2
while [ $# -gt 0 ]; do
    case $1 in
        --json) json=$2; shift ;;
        --ranks) ranks=$2; shift ;;
    esac
    shift
done
name=$(basename "$file" .weave)
mode=threads; [ -n "${RANK:-}" ] && mode=launch
case $name in
    skipper) echo "skipped: needs a fixed mesh"; exit 0 ;;
    broken) echo "crash"; exit 7 ;;
esac
echo "ran $name"
if [ "${RANK:-0}" = 0 ]; then
    printf '{"scenario":"%s","ranks":%s,"mode":"%s","backend":"cuda","passed":true,"max_abs_error":0.0,"max_rel_error":0.0,"wall_ms":1.5,"error":null}\n' \
        "$name" "$ranks" "$mode" >"$json"
fi
"#;

#[test]
fn run_all_drives_a_fake_bundle_and_prints_the_table_last() {
    if !have("bash") || !have("python3") {
        eprintln!("skipped: needs bash and python3");
        return;
    }
    let root = scratch("run-all");
    let bundle = root.join("bundle");
    write_executable(&bundle.join("bin/weave"), FAKE_WEAVE);
    write_executable(
        &bundle.join("bin/gpu-tests"),
        "#!/bin/sh\n[ \"$WEAVE_GPU_TESTS\" = 1 ] && [ \"$1\" = --test-threads=1 ] || exit 3\necho 'test result: ok. 1 passed'\n",
    );
    for name in ["alpha", "broken", "send_recv", "skipper"] {
        write(&bundle.join(format!("scenarios/{name}.weave")), "");
    }
    for script in ["run-all.sh", "table.py"] {
        let dest = bundle.join("scripts").join(script);
        write(&dest, "");
        std::fs::copy(scripts().join(script), &dest).unwrap();
    }
    write_executable(
        &root.join("path/nvidia-smi"),
        "#!/bin/sh\necho 'GPU 0: Fake (UUID: GPU-0)'\necho 'GPU 1: Fake (UUID: GPU-1)'\n",
    );
    let path = format!(
        "{}:{}",
        root.join("path").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out_dir = root.join("out");
    let out = Command::new("bash")
        .arg("scripts/run-all.sh")
        .args(["--ranks", "2 4", "--out"])
        .arg(&out_dir)
        .current_dir(&bundle)
        .env("PATH", path)
        .env_remove("NCCL_NVLS_ENABLE")
        .env_remove("OUT")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let attempted = std::fs::read_to_string(out_dir.join("attempted.txt")).unwrap_or_default();
    let launch_log =
        std::fs::read_to_string(out_dir.join("logs/alpha.2.launch.log")).unwrap_or_default();
    std::fs::remove_dir_all(&root).unwrap();

    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(stdout.contains("NCCL_NVLS_ENABLE=0"), "{stdout}");
    assert!(stdout.contains("==> 2 GPU(s)"), "{stdout}");
    assert!(attempted.contains("gpu-tests - tests 0\n"), "{attempted}");
    assert!(
        attempted.contains("skipper 2 launch skipped needs a fixed mesh\n"),
        "{attempted}"
    );
    assert!(launch_log.contains("[rank 1] "), "{launch_log}");
    for row in [
        "| gpu-tests | - | tests | - | - | - | PASS |",
        "| alpha | 2 | threads | 0 | 0 | 1.5 | PASS |",
        "| alpha | 2 | launch | 0 | 0 | 1.5 | PASS |",
        "| alpha | 4 | threads | - | - | - | SKIP (needs 4 GPUs, found 2) |",
        "| broken | 2 | launch | - | - | - | FAIL (rc 1, no JSON) |",
        "| broken | 2 | threads | - | - | - | FAIL (rc 7, no JSON) |",
        "| send_recv | 2 | threads | 0 | 0 | 1.5 | PASS |",
        "| skipper | 2 | threads | - | - | - | SKIP (needs a fixed mesh) |",
    ] {
        assert!(stdout.contains(row), "no `{row}` in\n{stdout}");
    }
    assert_eq!(
        stdout.lines().last(),
        Some("FAILED: 2 of 7 (10 skipped)"),
        "{stdout}"
    );
}
