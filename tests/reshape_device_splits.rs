//! Device splits of an axis a `reshape` merges or splits (docs/passes.md, "Device splits
//! across a reshape"). A split of `b * t` by `d` is a block of `b` only when `d` divides `b`;
//! then propagation carries it onto the reshape's operand, else the reshape runs whole and its
//! result is split across the devices (`<out>_reshaped = reshape(x)`, then a Scatter). Either
//! way the program matches the f64 reference with the race checker on. Before, the
//! non-dividing case failed inside `decompose-reshardings` with an error about the internal
//! `x_resharded` (`axis 0 has extent 4 (`b`), not divisible by 3 devices`) and no location.

mod common;

use common::communication_kinds;

/// The first-contact trial's program (p22): tokens `[b, t]` merged, then a linear and a tanh
/// whose output is split across the devices on the merged axis.
const MERGED_TOKENS: &str = "fusion p22(b = 4, t = 3, h = 8, d = 3) {
  mesh m = devices(d)
  tensor x: f32[b, t, h] on m
  tensor w: f32[h, h] on m
  x2 = reshape(x, [b * t, h])
  y = linear(x2, w)
  z = tanh(y)
  output z
  schedule z { mesh = m; outer_split(0, d) -> DIDx }
}
";

fn ov(overrides: &[(&str, i64)]) -> Vec<(String, i64)> {
    overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Runs `source` with `b`, `t` and `d` set on `d` ranks, with the race checker, and returns
/// the communications of its program; panics unless every output matches the reference.
fn run(source: &str, b: i64, t: i64, d: i64) -> Vec<String> {
    let overrides = [("b", b), ("t", t), ("d", d)];
    let fusion =
        streamweave::load("test.weave", source, &ov(&overrides)).unwrap_or_else(|e| panic!("{e}"));
    match common::run_checked(fusion, d as usize, 2, 11 + d as u64) {
        Ok(c) => communication_kinds(&c.program),
        Err(f) => panic!("b={b} t={t} on {d} ranks, {}:\n{}", f.stage, f.detail),
    }
}

/// `(b, t, d)`: `d` does not divide `b` (but divides `b * t`), then the ones where it does.
const NOT_DIVIDING_B: [(i64, i64, i64); 3] = [(4, 3, 3), (3, 4, 2), (2, 6, 4)];
const DIVIDING_B: [(i64, i64, i64); 3] = [(6, 2, 3), (4, 3, 2), (4, 3, 4)];

#[test]
fn a_device_split_of_a_reshape_merged_axis_runs_whether_or_not_it_divides_the_outer_axis() {
    for (b, t, d) in NOT_DIVIDING_B {
        // The reshape runs whole on every device, and a Scatter splits its result.
        assert_eq!(
            run(MERGED_TOKENS, b, t, d),
            ["Scatter"],
            "b={b} t={t} d={d}"
        );
    }
    for (b, t, d) in DIVIDING_B {
        // The split reaches the copy of `x` as blocks of `b` (a Scatter on `b`), and each
        // device reshapes its own block.
        assert_eq!(
            run(MERGED_TOKENS, b, t, d),
            ["Scatter"],
            "b={b} t={t} d={d}"
        );
    }
    // On 1 to 4 ranks wherever the ranks divide the merged axis.
    for (b, t) in [(4, 3), (3, 4), (2, 6), (6, 2)] {
        for d in 1..=4 {
            if (b * t) % d == 0 {
                run(MERGED_TOKENS, b, t, d);
            }
        }
    }
}

#[test]
fn the_reshape_output_scheduled_by_the_user_or_fed_by_an_op_runs_too() {
    // The user splits the reshape's result itself.
    let scheduled = "fusion own(b = 4, t = 3, h = 8, d = 3) {
  mesh m = devices(d)
  tensor x: f32[b, t, h] on m
  tensor w: f32[h, h] on m
  x2 = reshape(x, [b * t, h])
  y = linear(x2, w)
  output y
  schedule x2 { mesh = m; outer_split(0, d) -> DIDx }
}
";
    // The reshape's operand is an intermediate, which propagation would have split on `b`
    // (before: "propagating shardings from `x2` to `x1`: … not divisible by 3 devices").
    let produced = "fusion produced(b = 4, t = 3, h = 8, d = 3) {
  mesh m = devices(d)
  tensor x: f32[b, t, h] on m
  x1 = x * 2
  x2 = reshape(x1, [b * t, h])
  z = tanh(x2)
  output z
  schedule z { mesh = m; outer_split(0, d) -> DIDx }
}
";
    for src in [scheduled, produced] {
        for (b, t, d) in NOT_DIVIDING_B.into_iter().chain(DIVIDING_B) {
            run(src, b, t, d);
        }
    }
}

/// `fusion {name}`: `x: f32[b * t, h]` reshaped to `[b, t, h]` and its tanh, on `d` devices,
/// with the one schedule `schedule {schedule}`.
fn reshape_then_tanh(name: &str, schedule: &str) -> String {
    format!(
        "fusion {name}(b = 4, t = 3, h = 8, d = 3) {{
  mesh m = devices(d)
  tensor x: f32[b * t, h] on m
  x2 = reshape(x, [b, t, h])
  z = tanh(x2)
  output z
  schedule {schedule}
}}
"
    )
}

#[test]
fn a_device_split_of_the_inner_axis_a_reshape_splits_out_runs() {
    // `[b * t] -> [b, t]` with `t` split: a block of `t` is no block of `b * t` (before, the
    // split was carried onto the operand as the inner half of a split, and the kernel failed:
    // "reshape `x2`: cannot split axis 0 of sizes [4, 8] into rows of 3").
    let inner = reshape_then_tanh("inner", "z { mesh = m; outer_split(1, d) -> DIDx }");
    for (b, t, d) in [(4, 3, 3), (3, 4, 2), (2, 6, 3), (1, 12, 4), (3, 4, 4)] {
        assert_eq!(run(&inner, b, t, d), ["Scatter"], "b={b} t={t} d={d}");
    }
    // The operand split on `b * t`, the result unscheduled: gathered for the reshape where
    // the shards are no blocks of `b`.
    let from_split = reshape_then_tanh("from_split", "x { outer_split(0, d) -> DIDx }");
    for (b, t, d) in NOT_DIVIDING_B.into_iter().chain(DIVIDING_B) {
        run(&from_split, b, t, d);
    }
}
