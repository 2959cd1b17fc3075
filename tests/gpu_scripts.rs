//! The GPU scripts' own behaviour, checked without a GPU: the benchmark script
//! (scripts/gpu/bench.sh) ends the step it is running when it is stopped, so that no step
//! outlives it and runs beside the next measurement.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Whether process `pid` still exists.
fn alive(pid: u32) -> bool {
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A bundle-like folder whose `bin/gpu_overlap` writes its pid and sleeps for a minute.
fn fake_bundle(dir: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::copy(
        root.join("scripts/gpu/bench.sh"),
        dir.join("scripts/bench.sh"),
    )
    .unwrap();
    let step = dir.join("bin/gpu_overlap");
    std::fs::write(
        &step,
        "#!/usr/bin/env bash\necho $$ > \"$(dirname \"$0\")/../step.pid\"\nexec sleep 60\n",
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&step, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// A `timeout` around bench.sh stops the script in its first step (bin/gpu_overlap); the
/// step, which would otherwise sleep on for a minute, is gone within seconds.
#[cfg(unix)]
#[test]
fn a_stopped_benchmark_ends_the_step_it_was_running() {
    let dir = tempfile::tempdir().unwrap();
    fake_bundle(dir.path());
    let start = Instant::now();
    let status = Command::new("timeout")
        .args(["-s", "TERM", "3", "bash", "scripts/bench.sh", "out"])
        .current_dir(dir.path())
        .env("RANKS", "2")
        .env("HS", "64")
        .status()
        .expect("timeout and bash run");
    assert_eq!(status.code(), Some(124), "timeout stopped the script");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    let pid: u32 = std::fs::read_to_string(dir.path().join("step.pid"))
        .expect("the step started and wrote its pid")
        .trim()
        .parse()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while alive(pid) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = alive(pid);
    if left {
        // Do not leave it behind this test either.
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    assert!(!left, "the step (pid {pid}) outlived the stopped script");
}
