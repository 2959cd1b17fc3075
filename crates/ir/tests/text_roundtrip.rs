//! Round trips of the `.weave` format: `print(parse(x))` is canonical and a fixed point, for
//! programs that use every op, every schedule step and every mesh form.

use weave_ir::tensor::ScheduleOp;
use weave_ir::text::{parse, print};
use weave_ir::Fusion;

/// The op lines from `set` to the first reduction, written alike in both forms.
macro_rules! unary_binary_ops {
    () => {
        "  s0 = set(a)
  c0 = cast(x, f32)
  u0 = neg(a)
  u1 = abs(a)
  u2 = exp(a)
  u3 = log(a)
  u4 = sin(a)
  u5 = cos(a)
  u6 = tanh(a)
  u7 = sqrt(a)
  u8 = rsqrt(a)
  u9 = reciprocal(a)
  u10 = relu(a)
  u11 = sigmoid(a)
  u12 = not(c)
  b0 = add(a, b)
  b1 = sub(a, b)
  b2 = mul(a, b)
  b3 = div(a, b)
  b4 = maximum(a, b)
  b5 = minimum(a, b)
  b6 = pow(a, b)
  b7 = eq(a, b)
  b8 = ne(a, b)
  b9 = lt(a, b)
  b10 = le(a, b)
  b11 = gt(a, b)
  b12 = ge(a, b)
  b13 = and(c, c)
  b14 = or(c, b7)
  w0 = where(c, a, b)
  r0 = sum(a, [1])
"
    };
}

/// The op lines from `broadcast` to the last `linear`, written alike in both forms.
macro_rules! view_and_matmul_ops {
    () => {
        "  bc = broadcast(r0, [1])
  bb = add(bc, a)
  sq = squeeze(x, [1])
  p0 = permute(a, [1, 0])
  v0 = reshape(a, [t, 2, 2])
  v1 = reshape(a, [t * h])
  wt = permute(w, [1, 0])
  mm = matmul(a, wt)
  l0 = linear(a, w)
  l1 = linear(a, w, bias)
"
    };
}

/// Every op, every step kind, every mesh form, comments, blank lines, multi-line schedule
/// blocks, several blocks for one tensor, and non-canonical spacing and expressions.
const EVERY_OP: &str = concat!(
    "\
// every op
fusion every_op(t = 8, h = 4, d = 2, s = 4) {

  mesh m = devices(d)
  mesh g = [[0, 1], [2, 3]]
  mesh l = [3,1]
  mesh g2 = devices(1, d)
  tensor a: f32[t, h] on m
  tensor b: f32[t,h]   # a trailing comment
  tensor c: bool[t, h]
  tensor w: f32[2 * h, h]
  tensor bias: f32[h * 2]
  tensor x: bf16[t, 1]
  tensor sc: f64[]
  tensor i: i64[(t), ceilDiv(t, s) * s] on l
  tensor hf: f16[t % 3 + 1, t / 2 - 1]
",
    unary_binary_ops!(),
    "  r1 = max(a, [1, 0])
",
    view_and_matmul_ops!(),
    "  output l1, mm
  output r1
  schedule a { outer_split(0, s) -> Stream; outer_split(2, d) -> DIDx }
  schedule w {
    inner_split(1, ceilDiv(t, s))
    merge(0, 1);
    reorder(0 -> 1, 1 -> 0)
    parallelize(0, DIDy)
    allocation = loop; mesh = g; memory = symmetric
  }
  schedule l0 { memory = local; memory = global; inner_split(0, (t + 1) * 2 - 4 / 2 % 3) -> Serial }
  schedule a { parallelize(1, Serial); }
}
",
);

const EVERY_OP_CANONICAL: &str = concat!(
    "\
fusion every_op(t = 8, h = 4, d = 2, s = 4) {
  mesh m = devices(d)
  mesh g = [[0, 1], [2, 3]]
  mesh l = [3, 1]
  mesh g2 = devices(1, d)
  tensor a: f32[t, h] on m
  tensor b: f32[t, h]
  tensor c: bool[t, h]
  tensor w: f32[2 * h, h]
  tensor bias: f32[2 * h]
  tensor x: bf16[t, 1]
  tensor sc: f64[]
  tensor i: i64[t, ceilDiv(t, s) * s] on l
  tensor hf: f16[t % 3 + 1, t / 2 - 1]
",
    unary_binary_ops!(),
    "  r1 = max(a, [0, 1])
",
    view_and_matmul_ops!(),
    "  output l1, mm, r1
  schedule a { outer_split(0, s) -> Stream; outer_split(2, d) -> DIDx; parallelize(1, Serial) }
  schedule w { inner_split(1, ceilDiv(t, s)); merge(0, 1); reorder(0 -> 1, 1 -> 0); parallelize(0, DIDy); allocation = loop; mesh = g; memory = symmetric }
  schedule l0 { memory = local; memory = global; inner_split(0, 2 * (t + 1) - 2) -> Serial }
}
",
);

/// The row-parallel linear of docs/fusion-format.md, canonical as written.
const ROW_PARALLEL: &str = include_str!("fixtures/row_parallel_linear.weave");

/// Batched matmul, a 2-D mesh, an unused parameter without a value, a reduction feeding a
/// broadcast, reshapes, and a schedule written before the ops.
const MISC: &str = "\
fusion misc(b = 2, m = 16, k = 32, n = 8, rows = 2, cols = 2, unused) {
  mesh grid = devices(rows, cols)
  tensor x: f32[b, m, k] on grid
  schedule x { outer_split(0, rows) -> DIDy; outer_split(2, cols) -> DIDx }
  tensor y: f32[b, k, n] on grid
  z = matmul(x, y)
  s = sum(z, [2])
  e = broadcast(s, [2])
  f = sub(z, e)
  g = reshape(f, [b * m, n])
  h = reshape(g, [b, m, n])
  output h
  schedule z { mesh = grid; allocation = loop }
}
";

fn parse_ok(src: &str) -> Fusion {
    parse(src, &[]).unwrap_or_else(|e| panic!("{}", e.render("test.weave", src)))
}

/// `print(parse(x))` parses back and prints the same; returns it.
fn round_trip(src: &str) -> String {
    let f = parse_ok(src);
    let once = print(&f);
    let g = parse(&once, &[]).unwrap_or_else(|e| {
        panic!(
            "printed form does not parse: {}\n{once}",
            e.render("printed", &once)
        )
    });
    let twice = print(&g);
    assert_eq!(once, twice, "print(parse(x)) is not a fixed point");
    assert_same_program(&f, &g);
    once
}

/// The parts of two fusions the text format carries, compared by name.
fn assert_same_program(f: &Fusion, g: &Fusion) {
    assert_eq!(f.name, g.name);
    assert_eq!(f.params(), g.params());
    let names = |f: &Fusion, ts: &[weave_ir::TensorId]| -> Vec<String> {
        ts.iter().map(|t| f.tensor(*t).name.clone()).collect()
    };
    assert_eq!(names(f, f.inputs()), names(g, g.inputs()));
    assert_eq!(names(f, f.outputs()), names(g, g.outputs()));
    let kinds = |f: &Fusion| -> Vec<weave_ir::ExprKind> {
        f.exprs().iter().map(|e| f.expr(*e).kind.clone()).collect()
    };
    assert_eq!(kinds(f), kinds(g));
    let mesh_names = |f: &Fusion| -> Vec<(String, weave_ir::DeviceMesh)> {
        f.meshes()
            .iter()
            .map(|m| (f.mesh(*m).name.clone(), f.mesh(*m).mesh.clone()))
            .collect()
    };
    assert_eq!(mesh_names(f), mesh_names(g));
    for t in f.tensors_in_order() {
        let tv = f.tensor(t);
        let u = g.tensor_by_name(&tv.name).expect("same tensors");
        let uv = g.tensor(u);
        assert_eq!(tv.dtype, uv.dtype);
        let ext =
            |f: &Fusion, ids: &[weave_ir::IterDomainId]| -> Vec<(String, weave_ir::IterType)> {
                ids.iter()
                    .map(|i| (f.id(*i).extent.to_source(), f.id(*i).iter_type))
                    .collect()
            };
        assert_eq!(ext(f, &tv.logical), ext(g, &uv.logical), "{}", tv.name);
        let steps = |f: &Fusion, s: &[weave_ir::ScheduleStep]| -> Vec<String> {
            s.iter()
                .map(|s| match &s.op {
                    ScheduleOp::SetMesh(m) => format!("mesh = {}", f.mesh(*m).name),
                    other => format!("{other:?}"),
                })
                .collect()
        };
        assert_eq!(
            steps(f, &tv.schedule),
            steps(g, &uv.schedule),
            "{}",
            tv.name
        );
    }
}

#[test]
fn every_op_and_step_round_trips_to_the_canonical_form() {
    assert_eq!(round_trip(EVERY_OP), EVERY_OP_CANONICAL);
    assert_eq!(round_trip(EVERY_OP_CANONICAL), EVERY_OP_CANONICAL);
}

#[test]
fn the_doc_example_is_canonical() {
    assert_eq!(round_trip(ROW_PARALLEL), ROW_PARALLEL);
}

#[test]
fn misc_programs_round_trip() {
    let once = round_trip(MISC);
    assert!(once
        .starts_with("fusion misc(b = 2, m = 16, k = 32, n = 8, rows = 2, cols = 2, unused) {\n"));
    assert!(once
        .contains("  schedule x { outer_split(0, rows) -> DIDy; outer_split(2, cols) -> DIDx }\n"));
    assert!(once.ends_with("  output h\n  schedule x { outer_split(0, rows) -> DIDy; outer_split(2, cols) -> DIDx }\n  schedule z { mesh = grid; allocation = loop }\n}\n"));
}

#[test]
fn round_trips_with_overrides() {
    let f = parse(ROW_PARALLEL, &[("s".to_string(), 3), ("t".to_string(), -1)]);
    // t = -1 makes the extents non-positive.
    let e = f.unwrap_err();
    assert_eq!(
        e.to_string(),
        "3:20: tensor `inp` axis 0: extent `t` = -1 must be positive"
    );
    let f = parse(ROW_PARALLEL, &[("s".to_string(), 3)]).unwrap();
    let once = print(&f);
    assert!(once.starts_with("fusion row_parallel_linear(t = 8192, h = 8192, d = 2, s = 3) {\n"));
    assert_eq!(print(&parse_ok(&once)), once);
}

#[test]
fn minimal_programs_round_trip() {
    for src in [
        "fusion f() {\n}\n",
        "fusion f() {}",
        "fusion f(a, b = 0) {\n}\n",
        "fusion f() {\n  tensor a: f32[]\n  b = set(a)\n  output b\n}\n",
        "fusion f() {\n  mesh m = [7]\n  tensor a: f32[3] on m\n  schedule a { mesh = m; memory = local }\n}\n",
    ] {
        round_trip(src);
    }
    assert_eq!(round_trip("fusion f() {}"), "fusion f() {\n}\n");
}
