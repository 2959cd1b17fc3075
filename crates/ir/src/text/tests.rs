//! Tests of the `.weave` parser and printer: what a parse records, the canonical print, and
//! the exact message and line:col of every kind of error.

use super::*;
use crate::diag::Span;
use crate::domain::ParallelType;
use crate::dtype::DType;
use crate::expr::{BinaryOp, ExprKind};
use crate::fusion::MeshSpec;
use crate::scalar::Scalar;
use crate::tensor::{MemoryType, ScheduleOp};

/// The example of docs/fusion-format.md.
const ROW_PARALLEL: &str = concat!(
    "\
// Row-parallel linear: inp and w are split on the contraction axis across d devices,
// and the token axis is cut into s chunks that run on a pool of streams.
",
    include_str!("../../tests/fixtures/row_parallel_linear.weave"),
);

fn parse_ok(src: &str) -> Fusion {
    parse(src, &[]).unwrap_or_else(|e| panic!("{}", e.render("test.weave", src)))
}

/// Parses `src` expecting an error; returns `"line:col: message"`.
fn parse_err_with(src: &str, overrides: &[(String, i64)]) -> String {
    match parse(src, overrides) {
        Ok(f) => panic!("expected an error, parsed:\n{}", print(&f)),
        Err(e) => {
            // Rendering never panics and names the place.
            let rendered = e.render("test.weave", src);
            assert!(rendered.contains(&e.message), "{rendered}");
            e.to_string()
        }
    }
}

fn parse_err(src: &str) -> String {
    parse_err_with(src, &[])
}

/// A fusion `f(t = 8, h = 4)` with inputs `a`, `b` (f32[t, h]) on lines 2-3; `body` starts
/// on line 4.
fn with_ab(body: &str) -> String {
    format!("fusion f(t = 8, h = 4) {{\n  tensor a: f32[t, h]\n  tensor b: f32[t, h]\n{body}\n}}\n")
}

/// Checks that each body `src` after `a` and `b` (see [`with_ab`]) fails with `expected`.
fn assert_with_ab_errors(cases: &[(&str, &str)]) {
    for (src, expected) in cases {
        assert_eq!(parse_err(&with_ab(src)), *expected, "{src:?}");
    }
}

/// Checks that each source `src` fails to parse with `expected`.
fn assert_parse_errors(cases: &[(&str, &str)]) {
    for (src, expected) in cases {
        assert_eq!(parse_err(src), *expected, "{src:?}");
    }
}

// ----- what a parse records ---------------------------------------------------------------

#[test]
fn the_doc_example_parses_into_the_expected_fusion() {
    let f = parse_ok(ROW_PARALLEL);
    assert_eq!(f.name, "row_parallel_linear");
    let params: Vec<(&str, Option<i64>)> = f
        .params()
        .iter()
        .map(|p| (p.name.as_str(), p.value))
        .collect();
    assert_eq!(
        params,
        [
            ("t", Some(8192)),
            ("h", Some(8192)),
            ("d", Some(2)),
            ("s", Some(4))
        ]
    );
    let m = f.mesh_by_name("m").unwrap();
    assert_eq!(f.mesh(m).spec, MeshSpec::Devices(vec![Scalar::named("d")]));
    assert_eq!(f.mesh(m).mesh.size(), 2);
    assert_eq!(f.mesh(m).span, Some(Span::new(4, 8)));

    let inp = f.tensor_by_name("inp").unwrap();
    let tv = f.tensor(inp);
    assert_eq!(tv.dtype, DType::BF16);
    assert_eq!(tv.mesh, Some(m));
    assert_eq!(tv.span, Some(Span::new(5, 10)));
    let extents: Vec<String> = tv
        .logical
        .iter()
        .map(|i| f.id(*i).extent.to_source())
        .collect();
    assert_eq!(extents, ["t", "4 * h"]);
    // Schedules are recorded, not applied.
    assert_eq!(tv.loop_domain, tv.logical);
    assert_eq!(
        tv.schedule
            .iter()
            .map(|s| (&s.op, s.span))
            .collect::<Vec<_>>(),
        vec![
            (
                &ScheduleOp::OuterSplit {
                    axis: 0,
                    factor: Scalar::named("s"),
                    parallel: Some(ParallelType::Stream)
                },
                Some(Span::new(9, 18))
            ),
            (
                &ScheduleOp::OuterSplit {
                    axis: 2,
                    factor: Scalar::named("d"),
                    parallel: Some(ParallelType::DIDx)
                },
                Some(Span::new(9, 47))
            ),
        ]
    );

    let out = f.tensor_by_name("out").unwrap();
    assert_eq!(f.tensor(out).span, Some(Span::new(7, 3)));
    let e = f.tensor(out).definition.unwrap();
    assert_eq!(f.expr(e).kind, ExprKind::Linear);
    assert_eq!(f.expr(e).span, Some(Span::new(7, 9)));
    assert_eq!(f.outputs(), &[out]);
}

#[test]
fn the_doc_example_prints_as_written_without_comments() {
    let f = parse_ok(ROW_PARALLEL);
    let expected: String = ROW_PARALLEL
        .lines()
        .filter(|l| !l.starts_with("//"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(print(&f), expected);
}

#[test]
fn overrides_apply_before_parameters_are_used() {
    let f = parse(ROW_PARALLEL, &[("d".into(), 4), ("s".into(), 3)]).unwrap();
    assert_eq!(f.param_value("s"), Some(3));
    let m = f.mesh_by_name("m").unwrap();
    assert_eq!(f.mesh(m).mesh.size(), 4);
    assert!(
        print(&f).starts_with("fusion row_parallel_linear(t = 8192, h = 8192, d = 4, s = 3) {\n")
    );
}

#[test]
fn a_parameter_without_value_is_fine_until_used_and_prints_bare() {
    let f = parse_ok("fusion f(t, h = 2) {\n  tensor a: f32[h]\n}\n");
    assert_eq!(print(&f), "fusion f(t, h = 2) {\n  tensor a: f32[h]\n}\n");
    let f = parse("fusion f(t) {\n  tensor a: f32[t]\n}\n", &[("t".into(), 5)]).unwrap();
    assert_eq!(print(&f), "fusion f(t = 5) {\n  tensor a: f32[t]\n}\n");
}

#[test]
fn axis_lists_are_sorted_and_permutations_kept() {
    let f = parse_ok(&with_ab("  r = max(a, [1, 0])\n  p = permute(a, [1, 0])"));
    let r = f.tensor(f.tensor_by_name("r").unwrap()).definition.unwrap();
    assert_eq!(
        f.expr(r).kind,
        ExprKind::Reduction {
            op: crate::expr::ReduceOp::Max,
            axes: vec![0, 1]
        }
    );
    let p = f.tensor(f.tensor_by_name("p").unwrap()).definition.unwrap();
    assert_eq!(f.expr(p).kind, ExprKind::Permute { perm: vec![1, 0] });
}

#[test]
fn keywords_are_only_special_where_the_grammar_expects_them() {
    let src = "\
fusion fusion(devices = 2, on = 3) {
  mesh mesh = devices(devices)
  tensor tensor: f32[on] on mesh
  tensor f32: f32[on]
  mesh = set(tensor)
  output = add(mesh, f32)
  schedule = cast(output, f32)
  output output, schedule
  schedule schedule { mesh = mesh }
}
";
    let f = parse_ok(src);
    assert_eq!(print(&f), src);
    let e = f
        .tensor(f.tensor_by_name("mesh").unwrap())
        .definition
        .unwrap();
    assert_eq!(f.expr(e).kind, ExprKind::Set);
    let e = f
        .tensor(f.tensor_by_name("output").unwrap())
        .definition
        .unwrap();
    assert_eq!(f.expr(e).kind, ExprKind::Binary(BinaryOp::Add));
}

#[test]
fn schedule_steps_separated_by_newlines_and_semicolons_print_on_one_line() {
    let src = with_ab(
        "  schedule a {\n    outer_split(0, 2) -> DIDx;\n\n    merge(0, 1)\n    ;; memory = symmetric;\n  }\n  schedule b {}\n  schedule a { allocation = loop }",
    );
    let f = parse_ok(&src);
    assert_eq!(
        print(&f),
        "fusion f(t = 8, h = 4) {\n  tensor a: f32[t, h]\n  tensor b: f32[t, h]\n  schedule a { outer_split(0, 2) -> DIDx; merge(0, 1); memory = symmetric; allocation = loop }\n}\n"
    );
    let a = f.tensor_by_name("a").unwrap();
    assert_eq!(
        f.tensor(a).schedule[2].op,
        ScheduleOp::SetMemory(MemoryType::Symmetric)
    );
    assert_eq!(f.tensor(a).schedule[2].span, Some(Span::new(8, 8)));
}

#[test]
fn negative_values_print_in_a_form_that_parses_back() {
    let src = "fusion f(t = 8, u = 0) {\n  tensor a: f32[t + (0 - 2)]\n  schedule a { inner_split(0, 0 - 3) }\n}\n";
    let f = parse(src, &[("u".into(), -7)]).unwrap();
    let once = print(&f);
    assert_eq!(
        once,
        "fusion f(t = 8, u = -7) {\n  tensor a: f32[t + (0 - 2)]\n  schedule a { inner_split(0, (0 - 3)) }\n}\n"
    );
    assert_eq!(print(&parse_ok(&once)), once);
    let min = format!("fusion f(u = {}) {{\n}}\n", i64::MIN);
    assert_eq!(print(&parse_ok(&min)), min);
}

#[test]
fn deep_but_allowed_nesting_parses() {
    let open = "(".repeat(64);
    let close = ")".repeat(64);
    let f = parse_ok(&format!(
        "fusion f() {{\n  tensor a: f32[{open}3{close}]\n}}\n"
    ));
    assert_eq!(print(&f), "fusion f() {\n  tensor a: f32[3]\n}\n");
}

// ----- errors: exact message and line:col ---------------------------------------------------

#[test]
fn error_unknown_op() {
    assert_eq!(
        parse_err(&with_ab("  c = addd(a, b)")),
        "4:7: unknown op `addd` (expected one of: set, segment_set, cast, neg, abs, exp, log, sin, cos, tanh, \
sqrt, rsqrt, reciprocal, relu, sigmoid, not, erf, gelu, gelu_tanh, add, sub, mul, div, maximum, \
minimum, pow, eq, ne, lt, le, gt, ge, and, or, where, sum, max, min, mean, var, broadcast, squeeze, \
permute, reshape, matmul, linear, iota, slice, concat, index_select)"
    );
}

#[test]
fn error_wrong_arity() {
    assert_with_ab_errors(&[
        (
            "  out = linear(a)",
            "4:9: `linear` takes 2 or 3 tensor operands, got 1",
        ),
        (
            "  c = add(a, b, a)",
            "4:7: `add` takes 2 tensor operands, got 3",
        ),
        ("  c = neg()", "4:7: `neg` takes 1 tensor operand, got 0"),
        (
            "  c = sum(a)",
            "4:7: `sum` takes a tensor and an axis list, e.g. `sum(a, [1])`, got 1 argument",
        ),
        (
            "  c = cast(a, f16, f32)",
            "4:7: `cast` takes a tensor and a dtype, e.g. `cast(a, f32)`, got 3 arguments",
        ),
    ]);
}

#[test]
fn error_dtype_mismatch() {
    assert_eq!(
        parse_err("fusion f() {\n  tensor a: f32[4]\n  tensor b: bf16[4]\n  c = add(a, b)\n}\n"),
        "4:7: dtype mismatch in add: `a` is f32 but `b` is bf16 (insert a cast)"
    );
}

#[test]
fn error_undefined_tensor() {
    assert_with_ab_errors(&[
        ("  c = add(a, x)", "4:14: undefined tensor `x`"),
        ("  output a, y", "4:13: undefined tensor `y`"),
        ("  schedule z { merge(0, 1) }", "4:12: undefined tensor `z`"),
    ]);
}

#[test]
fn error_duplicate_name() {
    assert_with_ab_errors(&[
        ("  tensor a: f32[4]", "4:10: duplicate tensor name `a`"),
        ("  b = neg(a)", "4:3: duplicate tensor name `b`"),
        (
            "  t = neg(a)",
            "4:3: tensor name `t` is already a parameter",
        ),
    ]);
    assert_eq!(
        parse_err("fusion f(t, h, t) {\n}\n"),
        "1:16: duplicate parameter `t`"
    );
    assert_eq!(
        parse_err("fusion f() {\n  mesh m = [0]\n  mesh m = [1]\n}\n"),
        "3:8: duplicate mesh `m`"
    );
    assert_eq!(
        parse_err(&with_ab("  output a, b, a")),
        "4:16: tensor `a` is already an output"
    );
}

#[test]
fn error_unterminated_block() {
    assert_eq!(
        parse_err("fusion f() {\n  tensor a: f32[4]\n  schedule a { outer_split(0, 2)\n"),
        "3:14: unterminated schedule block for `a` (expected `}`)"
    );
    // A statement where a step was expected: the block is missing its `}`.
    assert_eq!(
        parse_err(&with_ab("  schedule a { outer_split(0, 2)\n  output a")),
        "4:14: unterminated schedule block for `a` (expected `}`)"
    );
    assert_eq!(
        parse_err("fusion f() {\n  tensor a: f32[4]\n"),
        "1:12: unterminated body of fusion `f` (expected `}`)"
    );
}

#[test]
fn error_unknown_dtype() {
    assert_eq!(
        parse_err("fusion f() {\n  tensor a: bf17[4]\n}\n"),
        "2:13: unknown dtype `bf17` (expected one of bf16, f16, f32, f64, i64, bool)"
    );
    assert_eq!(
        parse_err(&with_ab("  c = cast(a, f8)")),
        "4:15: unknown dtype `f8` (expected one of bf16, f16, f32, f64, i64, bool)"
    );
}

#[test]
fn error_unknown_parallel_type() {
    assert_eq!(
        parse_err(&with_ab("  schedule a { outer_split(0, 2) -> DIDz }")),
        "4:37: unknown parallel type `DIDz` (expected DIDx, DIDy, Stream or Serial)"
    );
    assert_eq!(
        parse_err(&with_ab("  schedule a { parallelize(0, 3) }")),
        "4:31: expected a parallel type (DIDx, DIDy, Stream or Serial), found `3`"
    );
}

#[test]
fn error_missing_equals() {
    assert_eq!(
        parse_err(&with_ab("  c add(a, b)")),
        "4:5: expected `=` after `c`, found `add`"
    );
    assert_eq!(
        parse_err("fusion f() {\n  mesh m devices(2)\n}\n"),
        "2:10: expected `=` after mesh name `m`, found `devices`"
    );
    assert_eq!(
        parse_err(&with_ab("  schedule a { allocation loop }")),
        "4:27: expected `=` after `allocation`, found `loop`"
    );
}

#[test]
fn error_bad_integer() {
    assert_eq!(
        parse_err("fusion f(t = 99999999999999999999) {\n}\n"),
        "1:14: integer `99999999999999999999` is too large (the largest is 9223372036854775807)"
    );
    assert_eq!(
        parse_err("fusion f() {\n  tensor a: f32[12ab]\n}\n"),
        "2:17: bad integer `12ab` (an integer is digits only; a name cannot start with a digit)"
    );
    assert_eq!(
        parse_err(&with_ab("  schedule a { merge(0, x) }")),
        "4:25: expected an axis number in `merge`, found `x`"
    );
}

#[test]
fn error_unexpected_end_of_file() {
    assert_parse_errors(&[
        (
            "fusion f(t = 8",
            "1:15: expected `,` or `)` after parameter `t`, found end of file",
        ),
        (
            "",
            "1:1: expected `fusion` at the start of the file, found end of file",
        ),
        (
            "fusion f() {\n  tensor a: f32[4",
            "2:18: expected `,` or `]` in the shape of `a`, found end of file",
        ),
    ]);
}

#[test]
fn error_unknown_set_parameter() {
    assert_eq!(
        parse_err_with(ROW_PARALLEL, &[("s".into(), 2), ("q".into(), 1)]),
        "3:1: unknown parameter `q` (fusion `row_parallel_linear` has: t, h, d, s)"
    );
    assert_eq!(
        parse_err_with("fusion g() {\n}\n", &[("q".into(), 1)]),
        "1:1: unknown parameter `q` (fusion `g` has: none)"
    );
}

#[test]
fn error_undefined_mesh() {
    assert_eq!(
        parse_err("fusion f() {\n  tensor a: f32[4] on mm\n}\n"),
        "2:23: undefined mesh `mm`"
    );
    assert_eq!(
        parse_err(&with_ab("  schedule a { memory = global; mesh = m2 }")),
        "4:40: undefined mesh `m2`"
    );
}

#[test]
fn error_undefined_parameter_in_an_extent() {
    assert_with_ab_errors(&[
        (
            "  tensor c: f32[4 * q]",
            "4:21: undefined parameter `q` in `4 * q`",
        ),
        // Even where simplification drops the name.
        (
            "  tensor c: f32[t + (q - q)]",
            "4:22: undefined parameter `q`",
        ),
        (
            "  schedule a { outer_split(0, k) }",
            "4:31: undefined parameter `k` in `k`",
        ),
    ]);
}

#[test]
fn error_parameter_without_value() {
    assert_eq!(
        parse_err("fusion f(t, d) {\n  mesh m = devices(d)\n}\n"),
        "2:20: parameter `d` has no value (give it a default in the header or pass --set d=VALUE)"
    );
    assert_eq!(
        parse_err("fusion f(t) {\n  tensor a: f32[4]\n  schedule a { inner_split(0, ceilDiv(4, t)) }\n}\n"),
        "3:42: parameter `t` has no value (give it a default in the header or pass --set t=VALUE)"
    );
}

#[test]
fn error_shape_mismatch_in_add() {
    assert_eq!(
        parse_err("fusion f(t = 8, h = 4) {\n  tensor a: f32[t, h]\n  tensor b: f32[h, t]\n  c = add(a, b)\n}\n"),
        "4:7: shape mismatch in add: axis 0 of `a` (f32[t, h]) has extent `t` but axis 0 of `b` (f32[h, t]) has extent `h`"
    );
}

#[test]
fn error_matmul_contraction_mismatch() {
    assert_eq!(
        parse_err(&with_ab("  c = matmul(a, b)")),
        "4:7: matmul: contraction extents differ: last axis of `a` (f32[t, h]) is `h`, axis 0 of `b` (f32[t, h]) is `t`"
    );
}

#[test]
fn matmul_batch_axes_broadcast_numpy_style() {
    // Fewer batch axes on the right, and a broadcast batch axis that stretches.
    let f = parse_ok(
        "fusion f(s = 3, d = 2) {\n  tensor a: f32[s, d, 4, 5]\n  tensor b: f32[d, 5, 6]\n  \
         c = matmul(a, b)\n  bb = broadcast(b, [0])\n  e = matmul(a, bb)\n  \
         tensor x: f32[4, 5]\n  g = matmul(x, b)\n  output c, e, g\n}\n",
    );
    let shape = |name: &str| {
        let t = f.tensor_by_name(name).unwrap();
        f.visible_axes(t)
            .iter()
            .map(|i| f.id(*i).extent.to_source())
            .collect::<Vec<_>>()
    };
    assert_eq!(shape("c"), ["s", "d", "4", "6"]);
    assert_eq!(shape("e"), ["s", "d", "4", "6"]);
    // Fewer batch axes on the left: [m, k] x [d, k, n] -> [d, m, n].
    assert_eq!(shape("g"), ["d", "4", "6"]);
}

#[test]
fn error_matmul_batch_axes_that_do_not_broadcast() {
    assert_eq!(
        parse_err(
            "fusion f() {\n  tensor a: f32[3, 2, 4, 5]\n  tensor b: f32[3, 5, 6]\n  c = matmul(a, b)\n}\n"
        ),
        "4:7: matmul: batch axis 1 of `a` (f32[3, 2, 4, 5]) has extent `2` but batch axis 0 of `b` (f32[3, 5, 6]) has extent `3` (batch axes align at the right; only a broadcast axis stretches)"
    );
}

#[test]
fn error_reshape_that_is_not_a_split_or_merge() {
    assert_eq!(
        parse_err(&with_ab("  c = reshape(a, [h, t])")),
        "4:7: reshape of `a` (f32[t, h]) to [h, t] is neither a split of one axis nor a merge of two adjacent axes"
    );
    assert_eq!(
        parse_err("fusion f() {\n  tensor a: f32[]\n  b = reshape(a, [1])\n}\n"),
        "3:7: reshape of `a` (f32[]) to [1] is neither a split of one axis nor a merge of two adjacent axes"
    );
    assert_eq!(
        parse_err(&with_ab("  c = reshape(a, [t, 0 - 2, 0 - 2])")),
        "4:22: `reshape`: shape entry `-2` = -2 must be positive"
    );
}

#[test]
fn error_expression_nesting_too_deep() {
    let open = "(".repeat(100_000);
    assert_eq!(
        parse_err(&format!("fusion f() {{\n  tensor a: f32[{open}1]\n}}\n")),
        "2:81: expression nesting is too deep (more than 64 levels)"
    );
    let calls = "ceilDiv(".repeat(65);
    assert_eq!(
        parse_err(&format!("fusion f() {{\n  tensor a: f32[{calls}")),
        "2:529: expression nesting is too deep (more than 64 levels)"
    );
    let long = vec!["1"; 300].join(" + ");
    assert_eq!(
        parse_err(&format!("fusion f() {{\n  tensor a: f32[{long}]\n}}\n")),
        "2:1043: expression is too long (more than 256 operators)"
    );
}

#[test]
fn error_garbage_character() {
    assert_eq!(
        parse_err(&with_ab("  c = add(a, b) @")),
        "4:17: unexpected character `@`"
    );
    assert_eq!(
        parse_err("fusion f() {\n  tensor é: f32[1]\n}\n"),
        "2:10: unexpected character `é`"
    );
    assert_eq!(
        parse_err("fusion f() {\u{0}}"),
        "1:13: unexpected character `\\0`"
    );
}

#[test]
fn error_missing_fusion_keyword() {
    assert_eq!(
        parse_err("// a comment\n\nfusoin f() {\n}\n"),
        "3:1: expected `fusion` at the start of the file, found `fusoin`"
    );
}

#[test]
fn error_unclosed_argument_list_as_in_the_docs() {
    let src = "fusion f(h = 4) {\n  tensor inp: f32[4, h]\n  tensor w: f32[2, h]\n  // the doc's example\n  out = linear(inp, w {\n}\n";
    let e = parse(src, &[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "5:23: expected `)` to close the argument list of `linear`, found `{`"
    );
    assert_eq!(
        e.render("tests/scenarios/row_parallel_linear.weave", src),
        "error: expected `)` to close the argument list of `linear`, found `{`
 --> tests/scenarios/row_parallel_linear.weave:5:23
  |
5 |   out = linear(inp, w {
  |                       ^
"
    );
}

#[test]
fn error_unknown_schedule_step_and_memory_type() {
    assert_with_ab_errors(&[
        (
            "  schedule a { split(0, 2) }",
            "4:16: unknown schedule step `split` (expected one of outer_split, inner_split, merge, reorder, parallelize, swizzle1d, allocation, mesh, memory)",
        ),
        (
            "  schedule a { memory = shared }",
            "4:25: unknown memory type `shared` (expected global, local or symmetric)",
        ),
        (
            "  schedule a { merge(0, 1) merge(1, 2) }",
            "4:28: expected `;`, a new line or `}` after a schedule step, found `merge`",
        ),
        (
            "  schedule a { reorder(0, 1) }",
            "4:25: expected `->` in a `reorder` move `from -> to`, found `,`",
        ),
    ]);
}

#[test]
fn error_bad_op_arguments() {
    assert_with_ab_errors(&[
        (
            "  c = sum(a, [t])",
            "4:15: `sum`: `t` is not an axis number (axes are non-negative integers)",
        ),
        ("  c = sum(a, [1, 1])", "4:7: sum: axis 1 is listed twice"),
        (
            "  c = squeeze(a, [5])",
            "4:7: squeeze: axis 5 is out of range for `a` (f32[t, h]) of rank 2",
        ),
        (
            "  c = permute(a, b)",
            "4:18: `permute` expects a permutation as its second argument, e.g. `permute(a, [1, 0])`, found `b`",
        ),
        ("  c = add(a, [0])", "4:14: operand 2 of `add` must be a tensor, found a `[...]` list"),
        (
            "  c = cast(a, [0])",
            "4:15: `cast` expects a dtype (bf16, f16, f32, f64, i64, bool) as its second argument, found a `[...]` list",
        ),
        (
            "  c = add(a, )",
            "4:14: expected an argument of `add` (a tensor name or a `[...]` list), found `)`",
        ),
        ("  c = not(a)", "4:7: not needs a bool operand, `a` (f32[t, h]) is f32"),
    ]);
}

#[test]
fn error_bad_meshes() {
    assert_parse_errors(&[
        (
            "fusion f() {\n  mesh m = [[0, 1], [2]]\n}\n",
            "2:21: mesh `m`: row 1 has 1 device but row 0 has 2 devices",
        ),
        (
            "fusion f() {\n  mesh m = [0, 1, 0]\n}\n",
            "2:8: mesh `m`: device 0 appears twice in the mesh",
        ),
        (
            "fusion f(d = 0) {\n  mesh m = devices(d)\n}\n",
            "2:8: mesh `m`: size `d` = 0 must be positive",
        ),
        (
            "fusion f(d = 100000) {\n  mesh m = devices(d, d)\n}\n",
            "2:8: mesh `m` has too many devices (at most 65536 are supported)",
        ),
        (
            "fusion f() {\n  mesh m = devices(2, 2, 2)\n}\n",
            "2:24: expected `)` to close `devices(...)`, found `,`",
        ),
    ]);
}

#[test]
fn error_bad_extents() {
    assert_eq!(
        parse_err("fusion f(t = 8) {\n  tensor a: f32[t / (t - 8)]\n}\n"),
        "2:17: cannot evaluate `t / (t - 8)` (division by zero, a non-positive `ceilDiv` divisor, or overflow)"
    );
    assert_eq!(
        parse_err("fusion f(t = 8) {\n  tensor a: f32[4, t - 8]\n}\n"),
        "2:20: tensor `a` axis 1: extent `t - 8` = 0 must be positive"
    );
}

#[test]
fn error_structure() {
    assert_eq!(
        parse_err("fusion f() {\n}\nfusion g() {\n}\n"),
        "3:1: expected end of file after the closing `}` of fusion `f`, found `fusion`"
    );
    assert_eq!(
        parse_err(&with_ab("  [a]")),
        "4:3: expected a statement (`mesh`, `tensor`, `output`, `schedule` or `NAME = op(...)`), found `[`"
    );
    assert_eq!(
        parse_err(&with_ab("  c = neg(a) d = neg(a)")),
        "4:14: expected end of line after the statement, found `d`"
    );
    assert_parse_errors(&[
        (
            "fusion f() tensor",
            "1:12: expected `{` to open the body of fusion `f`, found `tensor`",
        ),
        (
            "fusion f(,) {\n}\n",
            "1:10: expected a parameter name or `)`, found `,`",
        ),
        (
            "fusion f(t = -x) {\n}\n",
            "1:14: expected an integer default for parameter `t`, found `-`",
        ),
    ]);
}

#[test]
fn parameter_roles_parse_print_and_are_found() {
    let src = "\
fusion f(t = 8, n: mesh = 2, k: chunks = 4) {
  mesh m = devices(n)
  tensor a: f32[t] on m
  output a
}
";
    let f = parse_ok(src);
    assert_eq!(print(&f), src);
    use crate::fusion::ParamRole;
    assert_eq!(f.role_param(ParamRole::MeshSize).unwrap().name, "n");
    assert_eq!(f.role_param(ParamRole::ChunkCount).unwrap().name, "k");
    // Undeclared, the mesh size is the parameter that alone sizes a 1-D mesh; nothing is read
    // off a parameter's name.
    let g = parse_ok("fusion g(t = 8, width = 2) {\n  mesh m = devices(width)\n  tensor a: f32[t] on m\n  output a\n}\n");
    assert_eq!(g.role_param(ParamRole::MeshSize).unwrap().name, "width");
    assert!(g.role_param(ParamRole::ChunkCount).is_none());
    // Two parameters that could size meshes: no guess.
    let h = parse_ok("fusion h(a = 2, b = 2) {\n  mesh m = devices(a)\n  mesh n = devices(b)\n  tensor x: f32[4] on m\n  y = set(x)\n  output y\n  schedule y { mesh = n }\n}\n");
    assert!(h.role_param(ParamRole::MeshSize).is_none());
}

#[test]
fn error_parameter_roles() {
    assert_parse_errors(&[
        (
            "fusion f(d: devices = 2) {\n}\n",
            "1:13: unknown parameter role `devices` for `d` (expected `mesh` or `chunks`)",
        ),
        (
            "fusion f(a: mesh = 2, b: mesh = 2) {\n}\n",
            "1:26: parameters `a` and `b` both declare the role `mesh`",
        ),
        (
            "fusion f(a: = 2) {\n}\n",
            "1:13: expected a role (`mesh` or `chunks`) after `a:`, found `=`",
        ),
    ]);
}

#[test]
fn the_chunk_count_is_read_off_stream_axes_as_schedules_write_them() {
    use crate::fusion::ParamRole;
    let chunks = |src: &str| {
        parse_ok(src)
            .role_param(ParamRole::ChunkCount)
            .map(|p| p.name.clone())
    };
    // A split's outer part parallelized as Stream.
    assert_eq!(
        chunks("fusion f(t = 8, pieces = 4) {\n  tensor a: f32[t, 2]\n  b = neg(a)\n  output b\n  schedule b { outer_split(0, pieces) -> Stream }\n}\n").as_deref(),
        Some("pieces")
    );
    // A split, a reorder, then parallelize.
    assert_eq!(
        chunks("fusion f(t = 8, k = 4) {\n  tensor a: f32[2, t]\n  b = neg(a)\n  output b\n  schedule b { outer_split(1, k); reorder(1 -> 0); parallelize(0, Stream) }\n}\n").as_deref(),
        Some("k")
    );
    // A logical axis of extent `s` parallelized as Stream (a runner may still only pick
    // values that keep the data: `a_chunk_count_keeps_the_data_only_where_it_regroups_rows`).
    assert_eq!(
        chunks("fusion f(s = 4) {\n  tensor a: f32[s, 2]\n  b = neg(a)\n  output b\n  schedule b { parallelize(0, Stream) }\n}\n").as_deref(),
        Some("s")
    );
    // The stream loop of a ring runs over the devices: its extent is the mesh size, which
    // is no chunk count; an inner split's stream axis has no parameter extent.
    assert_eq!(
        chunks("fusion f(d = 2) {\n  mesh m = devices(d)\n  tensor a: f32[d, 4] on m\n  b = set(a)\n  output b\n  schedule a { parallelize(0, DIDx) }\n  schedule b { mesh = m; parallelize(0, Stream) }\n}\n"),
        None
    );
    assert_eq!(
        chunks("fusion f(t = 8, c = 2) {\n  tensor a: f32[t]\n  b = neg(a)\n  output b\n  schedule b { inner_split(0, c) -> Stream }\n}\n"),
        None
    );
}

/// A chunk count keeps the data where every input and output keeps its element count: rows
/// regrouped into `s` chunks (`[s, t / s]`) for the counts that divide them; `s` pieces of
/// data (`[s, 2]`) only as written.
#[test]
fn a_chunk_count_keeps_the_data_only_where_it_regroups_rows() {
    let rows = parse_ok("fusion f(t = 12, s = 2) {\n  tensor a: f32[s, t / s]\n  b = neg(a)\n  output b\n  schedule b { parallelize(0, Stream) }\n}\n");
    for s in [1, 2, 3, 4, 6, 12] {
        assert!(rows.chunk_count_keeps_the_data("s", s).is_ok(), "s = {s}");
    }
    assert_eq!(
        rows.chunk_count_keeps_the_data("s", 5).unwrap_err().message,
        "`s` = 5 would change the data, not its chunks: tensor `a` is [2, 6] with `s` = 2 and [5, 2] with `s` = 5"
    );
    let pieces = parse_ok("fusion f(s = 4) {\n  tensor a: f32[s, 2]\n  b = neg(a)\n  output b\n  schedule b { parallelize(0, Stream) }\n}\n");
    assert!(pieces.chunk_count_keeps_the_data("s", 4).is_ok());
    assert_eq!(
        pieces.chunk_count_keeps_the_data("s", 1).unwrap_err().message,
        "`s` = 1 would change the data, not its chunks: tensor `a` is [4, 2] with `s` = 4 and [1, 2] with `s` = 1"
    );
}

// ----- tensor expressions: literals, infix arithmetic, nested calls -------------------------

/// The op lines of the canonical print of `with_ab(body)`.
fn op_lines(body: &str) -> Vec<String> {
    let text = print(&parse_ok(&with_ab(body)));
    assert_eq!(
        print(&parse_ok(&text)),
        text,
        "print(parse(x)) is a fixed point"
    );
    text.lines()
        .filter(|l| l.contains(" = ") && !l.contains("fusion"))
        .map(|l| l.trim().to_string())
        .collect()
}

#[test]
fn infix_arithmetic_follows_precedence_and_prints_as_named_ops() {
    assert_eq!(
        op_lines("  y = a * 0.5 + b\n  output y"),
        ["y_1 = mul(a, 0.5)", "y = add(y_1, b)"]
    );
    assert_eq!(
        op_lines("  z = -(a - b) * 2\n  output z"),
        ["z_1 = sub(a, b)", "z_2 = neg(z_1)", "z = mul(z_2, 2)"]
    );
    // A literal first stays first; literal arithmetic folds; `-` of a literal is a literal.
    assert_eq!(
        op_lines("  w = 2 / a - b * (1 + 1) / -4\n  output w"),
        [
            "w_1 = div(2, a)",
            "w_2 = mul(b, 2)",
            "w_3 = div(w_2, -4)",
            "w = sub(w_1, w_3)"
        ]
    );
    // Calls nest, and literals go wherever a tensor operand of a pointwise op may.
    assert_eq!(
        op_lines("  g = exp(a * 1e-3) + where(lt(a, 0), 0, a)\n  output g"),
        [
            "g_1 = mul(a, 0.001)",
            "g_2 = exp(g_1)",
            "g_3 = lt(a, 0)",
            "g_4 = where(g_3, 0, a)",
            "g = add(g_2, g_4)"
        ]
    );
    assert_eq!(
        op_lines("  m = where(gt(a, b), a, -inf)\n  output m"),
        ["m_1 = gt(a, b)", "m = where(m_1, a, -inf)"]
    );
}

#[test]
fn generated_names_skip_every_name_the_file_writes() {
    // `y_1` is written later in the file, so the intermediate result is `y_2`.
    assert_eq!(
        op_lines("  y = a * 3 + b\n  y_1 = set(y)\n  output y_1"),
        ["y_2 = mul(a, 3)", "y = add(y_2, b)", "y_1 = set(y)"]
    );
}

#[test]
fn literals_take_the_tensor_operands_dtype() {
    let f = parse_ok(&with_ab("  y = a * 0.5\n  c = lt(a, 1)\n  output y, c"));
    let y = f.tensor_by_name("y").unwrap();
    let c = f.tensor_by_name("c").unwrap();
    assert_eq!(f.tensor(y).dtype, DType::F32);
    assert_eq!(f.tensor(c).dtype, DType::Bool);
    let e = f.expr(f.tensor(y).definition.unwrap());
    assert_eq!(
        e.kind,
        ExprKind::BinaryLit {
            op: BinaryOp::Mul,
            lit: crate::expr::Literal(0.5),
            lit_first: false
        }
    );
    // The expr and its output point at the operator; the statement's tensor at its name.
    assert_eq!(e.span, Some(Span::new(4, 9)));
    assert_eq!(f.tensor(y).span, Some(Span::new(4, 3)));
}

#[test]
fn mean_is_a_sum_divided_by_the_global_count() {
    assert_eq!(
        op_lines("  m = mean(a, [1])\n  output m"),
        ["m_1 = sum(a, [1])", "m = div(m_1, 4)"]
    );
}

#[test]
fn errors_of_tensor_expressions() {
    assert_with_ab_errors(&[
        (
            "  c = 0.5",
            "4:7: `c = ...` must compute a tensor, and a literal alone has no dtype (write an op: `c = set(x)` copies `x`, a literal takes the dtype of a tensor operand as in `mul(x, 0.5)`)",
        ),
        (
            "  c = a",
            "4:7: `c = ...` must compute a tensor, and `a` alone computes nothing (write an op: `c = set(x)` copies `x`, a literal takes the dtype of a tensor operand as in `mul(x, 0.5)`)",
        ),
        ("  c = a * q + b", "4:11: undefined tensor `q`"),
        (
            "  c = add(1, 2.5)",
            "4:11: `add` of two literals has no dtype: a literal takes the dtype of the other operand, which must be a tensor",
        ),
        (
            "  c = a * 1.5e",
            "4:11: bad number `1.5e` (a literal is digits, `.` and digits, then optionally `e`, a sign and digits: `0.5`, `1e-9`)",
        ),
        (
            "  c = linear(a, 2)",
            "4:17: operand 2 of `linear` must be a tensor, found the literal `2`",
        ),
        (
            "  c = (a + b\n  output c",
            "4:13: expected `)` to close the parenthesized expression, found end of line",
        ),
    ]);
    assert_eq!(
        parse_err("fusion f() {\n  tensor i: i64[4]\n  c = i * 0.5\n}\n"),
        "3:9: mul: the literal `0.5` takes the dtype of `i` (i64[4]), and an i64 operand takes integer literals"
    );
    assert_eq!(
        parse_err(&with_ab("  c = mean(a, [2])")),
        "4:7: mean: axis 2 is out of range for `a` (f32[t, h]) of rank 2"
    );
}

/// The host programs' built-in scalars are no parameter's name: a parameter `rank` would
/// stand for the running device's rank, not the value given.
#[test]
fn a_parameter_may_not_take_a_built_in_name() {
    for name in ["rank", "numberOfStreams"] {
        let src = format!("fusion f({name} = 2, n = 4) {{\n  tensor x: f32[n]\n  output x\n}}\n");
        let e = parse(&src, &[]).unwrap_err();
        assert_eq!(e.span.map(|s| (s.line, s.col)), Some((1, 10)), "{e}");
        assert!(
            e.message
                .starts_with(&format!("`{name}` is a built-in scalar of host programs")),
            "{e}"
        );
    }
}

/// `min` and `max` are calls in extents, as in printed host programs.
#[test]
fn min_and_max_are_extent_calls() {
    let f = parse_ok(
        "fusion f(t = 8, h = 3) {\n  tensor a: f32[max(t, 2 * h), min(t, h)]\n  output a\n}\n",
    );
    let a = f.tensor(f.tensor_by_name("a").unwrap());
    let extents: Vec<String> = a
        .logical
        .iter()
        .map(|i| f.id(*i).extent.to_source())
        .collect();
    assert_eq!(extents, ["max(t, 2 * h)", "min(t, h)"]);
}
