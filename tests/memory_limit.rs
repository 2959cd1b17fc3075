//! Runs under an address-space limit (`ulimit -v`) through the `weave` binary: ranks of one
//! process share one memory budget and an allocation that cannot be had is an error naming
//! the buffer and its bytes — exit 1 with a message, never an abort (exit 134).

use std::process::Command;

/// A 4-rank run of a replicated f32[n] chain whose inputs pass the up-front check but
/// whose ranks together need more than the limit: every try ends with a clear error (or,
/// where the machine's layout leaves room, a pass), never an abort.
#[test]
#[cfg(target_os = "linux")]
fn ranks_over_an_address_space_limit_fail_with_a_message_not_an_abort() {
    let dir = std::env::temp_dir().join(format!("weave-memlimit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("chain.weave");
    std::fs::write(
        &file,
        "fusion chain(n = 40000000, d = 4) {\n  mesh m = devices(d)\n  tensor x: f32[n] on m\n  y = exp(x)\n  z = neg(y)\n  output z\n}\n",
    )
    .unwrap();
    let mut failures = 0;
    for _ in 0..2 {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -v 3000000 && exec \"{}\" run \"{}\" --ranks 4 --no-check",
                env!("CARGO_BIN_EXE_weave"),
                file.display()
            ))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        match out.status.code() {
            Some(0) => {}
            Some(1) => {
                failures += 1;
                assert!(
                    stderr.contains("bytes") && stderr.contains("host memory"),
                    "no message naming the bytes:\n{stderr}\n{stdout}"
                );
            }
            other => panic!("exit {other:?} (an abort or a kill):\n{stderr}\n{stdout}"),
        }
    }
    // 40 M elements on 4 ranks need about 5 GB; under a 3 GB limit at least one try fails.
    assert!(failures > 0, "every try passed under the limit");
    let _ = std::fs::remove_dir_all(&dir);
}
