//! Inputs that say how they are drawn (`tensor v: f32[n] drawn uniform(0.5, 2)`, `drawn
//! const(1e-5)`): seeded runs draw them so and give finite, checked results where the
//! default draw in [-1, 1) makes every checked value NaN; the declaration prints and parses
//! back, rides in a printed host program's Definition, and a bad one is refused at its place.

use std::path::PathBuf;
use std::process::Command;

/// `rsqrt(v + eps)`: NaN for most of the default draw of `v`, finite for the declared one.
const DRAWN: &str = "fusion norm(n = 64, d = 2) {
  mesh m = devices(d)
  tensor v: f32[n] on m drawn uniform(0.5, 2)
  tensor eps: f32[n] on m drawn const(1e-5)
  y = rsqrt(v + eps)
  output y
}
";

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weave-draws-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn weave(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_weave"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn declared_draws_give_checked_finite_results_where_the_default_gives_nan() {
    let dir = scratch("run");
    let drawn = dir.join("drawn.weave");
    std::fs::write(&drawn, DRAWN).unwrap();
    let plain = dir.join("plain.weave");
    std::fs::write(&plain, DRAWN.replace(" drawn uniform(0.5, 2)", "")).unwrap();
    for ranks in ["1", "2"] {
        let (code, out, err) = weave(&[
            "run",
            drawn.to_str().unwrap(),
            "--ranks",
            ranks,
            "--set",
            &format!("d={ranks}"),
        ]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(
            out.contains("result: PASS") && out.contains("0 mismatches"),
            "{out}"
        );
    }
    let (code, out, _) = weave(&["run", plain.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(out.contains("NaN in the reference"), "{out}");
    // The printed host program carries the draws in its Definition and runs the same.
    let (code, hir, err) = weave(&["dump", drawn.to_str().unwrap(), "--passes", "default"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        hir.contains("tensor v: f32[n] on m drawn uniform(0.5, 2.0)")
            && hir.contains("tensor eps: f32[n] on m drawn const(1e-5)"),
        "{hir}"
    );
    let printed = dir.join("norm.hir");
    std::fs::write(&printed, &hir).unwrap();
    let (code, out, err) = weave(&["run", printed.to_str().unwrap(), "--ranks", "2"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("result: PASS"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn draws_print_and_parse_back() {
    let f = weave_ir::text::parse(DRAWN, &[]).unwrap();
    let printed = weave_ir::text::print(&f);
    assert!(printed.contains("drawn uniform(0.5, 2.0)"), "{printed}");
    let again = weave_ir::text::print(&weave_ir::text::parse(&printed, &[]).unwrap());
    assert_eq!(printed, again);
}

#[test]
fn a_bad_draw_is_refused_where_it_is_written() {
    let error = |decl: &str| {
        let src = format!("fusion f(n = 4) {{\n  tensor v: {decl}\n  output v\n}}\n");
        let e = weave_ir::text::parse(&src, &[]).unwrap_err();
        e.to_string()
    };
    assert_eq!(
        error("f32[n] drawn normal(0, 1)"),
        "2:26: unknown draw `normal` for `v`: expected `uniform(lo, hi)` (uniform in [lo, hi)) or `const(v)`"
    );
    assert_eq!(
        error("f32[n] drawn uniform(2, 1)"),
        "2:26: `uniform(2, 1)` of `v` is empty: lo must be below hi"
    );
    assert_eq!(
        error("f32[n] drawn const(1, 2)"),
        "2:26: `const` of `v` takes 1 number(s), got 2"
    );
    assert_eq!(
        error("bool[n] drawn const(1)"),
        "2:27: `v` is bool: its values are drawn 0 or 1, not from `const`"
    );
    assert!(error("f32[n] drawn uniform(a, 1)").contains("a number in `uniform(…)`"));
}
