//! Tests of the CPU fusion interpreter (`weave_executor::interp`), dense tensors and the
//! reference comparison: every op kind on tiny hand-computed tensors parsed from `.weave`
//! text, shape polymorphism on chunks, input errors, random inputs, and tolerances.

use weave_executor::interp::{eval_fusion, Precision};
use weave_executor::reference::{compare, compare_dense, compare_with, run_reference, Tolerance};
use weave_executor::{dense::round_to, Dense};
use weave_ir::{DType, Fusion};

fn parse(src: &str) -> Fusion {
    parse_with(src, &[])
}

fn parse_with(src: &str, overrides: &[(&str, i64)]) -> Fusion {
    let o: Vec<(String, i64)> = overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    weave_ir::text::parse(src, &o).unwrap_or_else(|e| panic!("parse failed: {e:?}\n{src}"))
}

fn t(dtype: DType, sizes: &[usize], data: &[f64]) -> Dense {
    Dense::new(dtype, sizes.to_vec(), data.to_vec()).unwrap()
}

fn f32t(sizes: &[usize], data: &[f64]) -> Dense {
    t(DType::F32, sizes, data)
}

fn exact(src: &str, inputs: &[Dense]) -> Vec<Dense> {
    eval_fusion(&parse(src), inputs, Precision::Exact).unwrap()
}

fn exact1(src: &str, inputs: &[Dense]) -> Dense {
    exact(src, inputs).remove(0)
}

fn err(src: &str, inputs: &[Dense]) -> String {
    eval_fusion(&parse(src), inputs, Precision::Exact)
        .unwrap_err()
        .to_string()
}

/// `[[1, 2, 3], [4, 5, 6]]`
fn m23() -> Dense {
    f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
}

fn scenario(name: &str) -> String {
    let path = format!(
        "{}/../../tests/scenarios/{name}.weave",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn naive_matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                s += a[i * k + p] * b[p * n + j];
            }
            c[i * n + j] = s;
        }
    }
    c
}

// ----- copies, casts, pointwise -------------------------------------------------------------

#[test]
fn set_and_segment_set_copy() {
    let src = "fusion f() { tensor a: f32[2, 3]\n b = set(a)\n c = segment_set(b)\n output b, c }";
    let out = exact(src, &[m23()]);
    assert_eq!(out, vec![m23(), m23()]);
}

#[test]
fn unary_ops() {
    let x = [0.5, -2.0, 4.0];
    type UnaryFn = fn(f64) -> f64;
    let cases: [(&str, UnaryFn); 12] = [
        ("neg", |v| -v),
        ("abs", f64::abs),
        ("exp", f64::exp),
        ("log", f64::ln),
        ("sin", f64::sin),
        ("cos", f64::cos),
        ("tanh", f64::tanh),
        ("sqrt", f64::sqrt),
        ("rsqrt", |v| 1.0 / v.sqrt()),
        ("reciprocal", |v| 1.0 / v),
        ("relu", |v| v.max(0.0)),
        ("sigmoid", |v| 1.0 / (1.0 + (-v).exp())),
    ];
    for (op, f) in cases {
        let src = format!("fusion f() {{ tensor a: f64[3]\n b = {op}(a)\n output b }}");
        let out = exact1(&src, &[t(DType::F64, &[3], &x)]);
        assert_eq!(out.dtype, DType::F64);
        for (got, v) in out.data.iter().zip(x) {
            let want = f(v);
            assert!(
                got == &want || (got.is_nan() && want.is_nan()),
                "{op}({v}) = {got}, expected {want}"
            );
        }
    }
    assert_eq!(
        exact1(
            "fusion f() { tensor a: f32[3]\n b = relu(a)\n output b }",
            &[f32t(&[3], &[-1.0, 0.0, 2.5])]
        )
        .data,
        vec![0.0, 0.0, 2.5]
    );
}

#[test]
fn binary_arithmetic_ops() {
    let a = f32t(&[4], &[1.0, -2.0, 3.0, 0.5]);
    let b = f32t(&[4], &[2.0, 4.0, -1.0, 0.5]);
    let cases: [(&str, [f64; 4]); 7] = [
        ("add", [3.0, 2.0, 2.0, 1.0]),
        ("sub", [-1.0, -6.0, 4.0, 0.0]),
        ("mul", [2.0, -8.0, -3.0, 0.25]),
        ("div", [0.5, -0.5, -3.0, 1.0]),
        ("maximum", [2.0, 4.0, 3.0, 0.5]),
        ("minimum", [1.0, -2.0, -1.0, 0.5]),
        ("pow", [1.0, 16.0, 1.0 / 3.0, 0.5f64.powf(0.5)]),
    ];
    for (op, want) in cases {
        let src = format!(
            "fusion f() {{ tensor a: f32[4]\n tensor b: f32[4]\n c = {op}(a, b)\n output c }}"
        );
        let out = exact1(&src, &[a.clone(), b.clone()]);
        assert_eq!(out.data, want, "{op}");
        assert_eq!(out.dtype, DType::F32);
    }
}

#[test]
fn comparisons_give_bool_and_where_selects() {
    let a = f32t(&[4], &[1.0, 2.0, 3.0, 4.0]);
    let b = f32t(&[4], &[4.0, 2.0, 1.0, 4.0]);
    for (op, want) in [
        ("eq", [0.0, 1.0, 0.0, 1.0]),
        ("ne", [1.0, 0.0, 1.0, 0.0]),
        ("lt", [1.0, 0.0, 0.0, 0.0]),
        ("le", [1.0, 1.0, 0.0, 1.0]),
        ("gt", [0.0, 0.0, 1.0, 0.0]),
        ("ge", [0.0, 1.0, 1.0, 1.0]),
    ] {
        let src = format!(
            "fusion f() {{ tensor a: f32[4]\n tensor b: f32[4]\n c = {op}(a, b)\n output c }}"
        );
        let out = exact1(&src, &[a.clone(), b.clone()]);
        assert_eq!(out.dtype, DType::Bool, "{op}");
        assert_eq!(out.data, want, "{op}");
    }
    let src = "fusion f() { tensor a: f32[4]\n tensor b: f32[4]\n c = gt(a, b)\n m = where(c, a, b)\n output c, m }";
    let out = exact(src, &[a, b]);
    assert_eq!(out[1].data, vec![4.0, 2.0, 3.0, 4.0]);
    assert_eq!(out[1].dtype, DType::F32);
}

#[test]
fn logical_ops_on_bool() {
    let a = t(DType::Bool, &[4], &[0.0, 0.0, 1.0, 1.0]);
    let b = t(DType::Bool, &[4], &[0.0, 1.0, 0.0, 1.0]);
    let src = "fusion f() { tensor a: bool[4]\n tensor b: bool[4]\n c = and(a, b)\n d = or(a, b)\n e = not(a)\n output c, d, e }";
    let out = exact(src, &[a, b]);
    assert_eq!(out[0].data, vec![0.0, 0.0, 0.0, 1.0]);
    assert_eq!(out[1].data, vec![0.0, 1.0, 1.0, 1.0]);
    assert_eq!(out[2].data, vec![1.0, 1.0, 0.0, 0.0]);
    assert!(out.iter().all(|d| d.dtype == DType::Bool));
}

#[test]
fn cast_to_bf16_rounds_to_nearest_even_even_in_exact_mode() {
    let e8 = 2f64.powi(-8);
    let x = [
        1.0 + e8,                     // tie -> even: 1
        1.0 + 3.0 * e8,               // tie -> even: 1 + 2^-6
        1.0 + e8 + 2f64.powi(-40),    // just above the tie: up to 1 + 2^-7
        -(1.0 + e8 + 2f64.powi(-40)), // symmetric
        3.0e38,                       // rounds to the largest finite bf16 neighbour
        1e39,                         // overflows to infinity
    ];
    let src = "fusion f() { tensor a: f64[6]\n b = cast(a, bf16)\n output b }";
    let out = exact1(src, &[t(DType::F64, &[6], &x)]);
    assert_eq!(out.dtype, DType::BF16);
    assert_eq!(
        out.data[..4],
        [1.0, 1.0 + 4.0 * e8, 1.0 + 2.0 * e8, -(1.0 + 2.0 * e8)]
    );
    assert_eq!(out.data[4], half::bf16::from_f32(3.0e38).to_f64());
    assert_eq!(out.data[5], f64::INFINITY);
    for v in &out.data {
        assert_eq!(round_to(DType::BF16, *v), *v);
    }
}

#[test]
fn cast_to_integers_truncates_and_to_bool_tests_nonzero() {
    let src = "fusion f() { tensor a: f32[4]\n b = cast(a, i64)\n c = cast(a, bool)\n d = cast(c, f32)\n output b, c, d }";
    let out = exact(src, &[f32t(&[4], &[-1.5, 2.75, 0.0, -0.25])]);
    assert_eq!(out[0].data, vec![-1.0, 2.0, 0.0, 0.0]);
    assert_eq!(out[0].dtype, DType::I64);
    assert_eq!(out[1].data, vec![1.0, 1.0, 0.0, 1.0]);
    assert_eq!(out[2].data, vec![1.0, 1.0, 0.0, 1.0]);
    assert_eq!(out[2].dtype, DType::F32);
}

#[test]
fn i64_division_truncates_toward_zero() {
    let src = "fusion f() { tensor a: i64[4]\n tensor b: i64[4]\n c = div(a, b)\n d = mul(c, b)\n output c, d }";
    let a = t(DType::I64, &[4], &[7.0, -7.0, 9.0, 1.0]);
    let b = t(DType::I64, &[4], &[2.0, 2.0, -4.0, 3.0]);
    let out = exact(src, &[a, b]);
    assert_eq!(out[0].data, vec![3.0, -3.0, -2.0, 0.0]);
    assert_eq!(out[0].dtype, DType::I64);
    assert_eq!(out[1].data, vec![6.0, -6.0, 8.0, 0.0]);
}

#[test]
fn i64_division_by_zero_is_an_error() {
    let src = "fusion f() { tensor a: i64[2]\n tensor b: i64[2]\n c = div(a, b)\n output c }";
    let a = t(DType::I64, &[2], &[1.0, 2.0]);
    let b = t(DType::I64, &[2], &[1.0, 0.0]);
    assert_eq!(err(src, &[a, b]), "div `c`: integer division by zero");
}

// ----- reductions and shape ops -------------------------------------------------------------

#[test]
fn sum_and_max_over_an_axis() {
    let src = "fusion f() { tensor a: f32[2, 3]\n s1 = sum(a, [1])\n s0 = sum(a, [0])\n m1 = max(a, [1])\n sall = sum(a, [0, 1])\n output s1, s0, m1, sall }";
    let out = exact(src, &[m23()]);
    assert_eq!(out[0], f32t(&[2], &[6.0, 15.0]));
    assert_eq!(out[1], f32t(&[3], &[5.0, 7.0, 9.0]));
    assert_eq!(out[2], f32t(&[2], &[3.0, 6.0]));
    assert_eq!(out[3], f32t(&[], &[21.0]));
}

#[test]
fn sum_of_i64_and_max_of_bool() {
    let src = "fusion f() { tensor a: i64[2, 2]\n tensor b: bool[2, 2]\n s = sum(a, [0])\n m = max(b, [1])\n output s, m }";
    let a = t(DType::I64, &[2, 2], &[1.0, -8.0, 5.0, 3.0]);
    let b = t(DType::Bool, &[2, 2], &[0.0, 0.0, 0.0, 1.0]);
    let out = exact(src, &[a, b]);
    assert_eq!(out[0], t(DType::I64, &[2], &[6.0, -5.0]));
    assert_eq!(out[1], t(DType::Bool, &[2], &[0.0, 1.0]));
}

#[test]
fn reduction_scenario_sums_the_innermost_axis() {
    let fusion = parse(&scenario("reduction"));
    let x = Dense::random(DType::F32, vec![12, 8, 2], 3);
    let out = run_reference(&fusion, std::slice::from_ref(&x)).unwrap();
    assert_eq!(out[0].sizes, vec![12, 8]);
    for (i, v) in out[0].data.iter().enumerate() {
        // The f32 reduction's result is an f32 value.
        assert_eq!(*v, round_to(DType::F32, x.data[2 * i] + x.data[2 * i + 1]));
    }
}

#[test]
fn broadcast_then_add() {
    let src = "fusion f() { tensor a: f32[2, 3]\n tensor b: f32[3]\n bb = broadcast(b, [0])\n c = add(a, bb)\n output bb, c }";
    let out = exact(src, &[m23(), f32t(&[3], &[10.0, 20.0, 30.0])]);
    assert_eq!(out[0], f32t(&[1, 3], &[10.0, 20.0, 30.0]));
    assert_eq!(out[1], f32t(&[2, 3], &[11.0, 22.0, 33.0, 14.0, 25.0, 36.0]));
    // Along the other axis, and on both sides at once (outer sum).
    let src = "fusion f() { tensor a: f32[2, 3]\n tensor b: f32[2]\n tensor r: f32[3]\n bb = broadcast(b, [1])\n c = mul(a, bb)\n rb = broadcast(r, [0])\n o = add(bb, rb)\n output c, o }";
    let out = exact(
        src,
        &[
            m23(),
            f32t(&[2], &[1.0, -1.0]),
            f32t(&[3], &[0.0, 1.0, 2.0]),
        ],
    );
    assert_eq!(out[0].data, vec![1.0, 2.0, 3.0, -4.0, -5.0, -6.0]);
    assert_eq!(out[1], f32t(&[2, 3], &[1.0, 2.0, 3.0, -1.0, 0.0, 1.0]));
}

#[test]
fn squeeze_removes_size_one_axes() {
    let src = "fusion f() { tensor a: f32[3]\n b = broadcast(a, [0, 2])\n c = squeeze(b, [0, 2])\n output b, c }";
    let a = f32t(&[3], &[1.0, 2.0, 3.0]);
    let out = exact(src, std::slice::from_ref(&a));
    assert_eq!(out[0].sizes, vec![1, 3, 1]);
    assert_eq!(out[1], a);
}

#[test]
fn permute_2d_and_3d() {
    let src = "fusion f() { tensor a: f32[2, 3]\n b = permute(a, [1, 0])\n output b }";
    assert_eq!(
        exact1(src, &[m23()]),
        f32t(&[3, 2], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0])
    );
    // x[i, j, k] = 100 i + 10 j + k on [2, 3, 4]; out axis m = in axis perm[m].
    let data: Vec<f64> = (0..24)
        .map(|l| (100 * (l / 12) + 10 * ((l / 4) % 3) + l % 4) as f64)
        .collect();
    let src = "fusion f() { tensor a: f32[2, 3, 4]\n b = permute(a, [2, 0, 1])\n output b }";
    let out = exact1(src, &[f32t(&[2, 3, 4], &data)]);
    assert_eq!(out.sizes, vec![4, 2, 3]);
    for k in 0..4 {
        for i in 0..2 {
            for j in 0..3 {
                assert_eq!(out.data[k * 6 + i * 3 + j], (100 * i + 10 * j + k) as f64);
            }
        }
    }
}

#[test]
fn reshape_merge_and_split() {
    let data: Vec<f64> = (0..24).map(f64::from).collect();
    let merge = "fusion f(a = 2, b = 3, c = 4) { tensor x: f32[a, b, c]\n y = reshape(x, [a, b * c])\n z = reshape(x, [a * b, c])\n output y, z }";
    let out = exact(merge, &[f32t(&[2, 3, 4], &data)]);
    assert_eq!(out[0], f32t(&[2, 12], &data));
    assert_eq!(out[1], f32t(&[6, 4], &data));
    let split = "fusion f(a = 2, b = 3, c = 4) { tensor x: f32[a * b, c]\n y = reshape(x, [a, b, c])\n output y }";
    assert_eq!(
        exact1(split, &[f32t(&[6, 4], &data)]),
        f32t(&[2, 3, 4], &data)
    );
    let split_inner = "fusion f(a = 2, b = 3, c = 4) { tensor x: f32[a, b * c]\n y = reshape(x, [a, b, c])\n output y }";
    assert_eq!(
        exact1(split_inner, &[f32t(&[2, 12], &data)]),
        f32t(&[2, 3, 4], &data)
    );
}

#[test]
fn view_permute_scenario() {
    let data: Vec<f64> = (0..24).map(f64::from).collect();
    let out = run_reference(
        &parse(&scenario("view_permute")),
        &[f32t(&[2, 3, 4], &data)],
    )
    .unwrap()
    .remove(0);
    assert_eq!(out.sizes, vec![12, 2]);
    for i in 0..12 {
        assert_eq!(out.data[2 * i], i as f64);
        assert_eq!(out.data[2 * i + 1], (12 + i) as f64);
    }
}

// ----- matmul and linear --------------------------------------------------------------------

#[test]
fn matmul_2d() {
    let src =
        "fusion f() { tensor a: f32[2, 2]\n tensor b: f32[2, 2]\n c = matmul(a, b)\n output c }";
    let a = f32t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = f32t(&[2, 2], &[5.0, 6.0, 7.0, 8.0]);
    assert_eq!(
        exact1(src, &[a, b]),
        f32t(&[2, 2], &[19.0, 22.0, 43.0, 50.0])
    );
    // Non-square: [2, 3] x [3, 1].
    let src =
        "fusion f() { tensor a: f32[2, 3]\n tensor b: f32[3, 1]\n c = matmul(a, b)\n output c }";
    assert_eq!(
        exact1(src, &[m23(), f32t(&[3, 1], &[1.0, 0.0, -1.0])]),
        f32t(&[2, 1], &[-2.0, -2.0])
    );
}

#[test]
fn batched_matmul_with_a_shared_rank_2_weight() {
    let src =
        "fusion f() { tensor a: f32[2, 2, 2]\n tensor b: f32[2, 2]\n c = matmul(a, b)\n output c }";
    let a = f32t(&[2, 2, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 2.0, 3.0, 4.0]);
    let b = f32t(&[2, 2], &[5.0, 6.0, 7.0, 8.0]);
    assert_eq!(
        exact1(src, &[a, b]),
        f32t(&[2, 2, 2], &[5.0, 6.0, 7.0, 8.0, 19.0, 22.0, 43.0, 50.0])
    );
}

#[test]
fn batched_matmul_with_equal_batches() {
    let src = "fusion f() { tensor a: f32[2, 2, 2]\n tensor b: f32[2, 2, 2]\n c = matmul(a, b)\n output c }";
    let a = f32t(&[2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]);
    let b = f32t(&[2, 2, 2], &[5.0, 6.0, 7.0, 8.0, 1.0, 0.0, 0.0, 1.0]);
    assert_eq!(
        exact1(src, &[a, b]),
        f32t(&[2, 2, 2], &[19.0, 22.0, 43.0, 50.0, 1.0, 2.0, 3.0, 4.0])
    );
}

#[test]
fn batched_matmul_scenario_matches_a_naive_loop() {
    let fusion = parse(&scenario("batched_matmul"));
    let a = Dense::random(DType::F32, vec![12, 8, 4], 1);
    let b = Dense::random(DType::F32, vec![4, 2], 2);
    let out = run_reference(&fusion, &[a.clone(), b.clone()])
        .unwrap()
        .remove(0);
    assert_eq!(out.sizes, vec![12, 8, 2]);
    let want: Vec<f64> = naive_matmul(&a.data, &b.data, 96, 4, 2)
        .into_iter()
        .map(|v| round_to(DType::F32, v))
        .collect();
    assert_eq!(out.data, want);
}

#[test]
fn large_matmul_and_pointwise_take_the_parallel_paths() {
    let (m, k, n) = (67, 96, 501);
    let src = format!(
        "fusion f() {{ tensor a: f64[{m}, {k}]\n tensor b: f64[{k}, {n}]\n tensor r: f64[{n}]\n c = matmul(a, b)\n rb = broadcast(r, [0])\n d = add(c, rb)\n e = mul(d, d)\n s = sum(e, [1])\n output c, d, s }}"
    );
    let a = Dense::random(DType::F64, vec![m, k], 11);
    let b = Dense::random(DType::F64, vec![k, n], 12);
    let r = Dense::random(DType::F64, vec![n], 13);
    let out = exact(&src, &[a.clone(), b.clone(), r.clone()]);
    let want = naive_matmul(&a.data, &b.data, m, k, n);
    assert_close(&out[0].data, &want);
    let want_d: Vec<f64> = want
        .iter()
        .enumerate()
        .map(|(i, v)| v + r.data[i % n])
        .collect();
    assert_close(&out[1].data, &want_d);
    let want_s: Vec<f64> = want_d
        .chunks(n)
        .map(|row| row.iter().fold(0.0, |acc, v| acc + v * v))
        .collect();
    assert_close(&out[2].data, &want_s);
}

/// Every scenario that parses and is small at its default parameters evaluates, with output
/// sizes equal to the declared extents.
#[test]
fn every_small_scenario_evaluates_with_declared_output_sizes() {
    let dir = format!("{}/../../tests/scenarios", env!("CARGO_MANIFEST_DIR"));
    let mut paths: Vec<_> = ["", "/pending"]
        .iter()
        .filter_map(|sub| std::fs::read_dir(format!("{dir}{sub}")).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "weave"))
        .collect();
    paths.sort();
    let mut ran = 0;
    for path in paths {
        let src = std::fs::read_to_string(&path).unwrap();
        let Ok(fusion) = weave_ir::text::parse(&src, &[]) else {
            continue;
        };
        let extents = |t| -> Option<Vec<usize>> {
            fusion
                .visible_axes(t)
                .iter()
                .map(|id| fusion.eval(&fusion.id(*id).extent).map(|v| v as usize))
                .collect()
        };
        let Some(shapes) = fusion
            .inputs()
            .iter()
            .map(|t| extents(*t))
            .collect::<Option<Vec<_>>>()
        else {
            continue;
        };
        if shapes
            .iter()
            .map(|s| s.iter().product::<usize>())
            .sum::<usize>()
            > 1 << 20
        {
            continue;
        }
        let mut inputs: Vec<Dense> = fusion
            .inputs()
            .iter()
            .zip(shapes)
            .enumerate()
            .map(|(i, (t, s))| Dense::random(fusion.tensor(*t).dtype, s, i as u64))
            .collect();
        // As a run generates them: the ids of a lookup inside its table, and so on.
        weave_executor::reference::keep_in_domain(&fusion, &mut inputs);
        let out =
            run_reference(&fusion, &inputs).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for (t, d) in fusion.outputs().iter().zip(&out) {
            assert_eq!(Some(d.sizes.clone()), extents(*t), "{}", path.display());
            assert_eq!(d.dtype, fusion.tensor(*t).dtype);
        }
        ran += 1;
    }
    assert!(ran >= 20, "only {ran} scenarios ran");
}

#[test]
fn linear_with_and_without_bias() {
    let src = "fusion f() { tensor x: f32[2, 3]\n tensor w: f32[2, 3]\n tensor bias: f32[2]\n y = linear(x, w)\n z = linear(x, w, bias)\n output y, z }";
    let w = f32t(&[2, 3], &[1.0, 0.0, -1.0, 0.5, 0.5, 0.5]);
    let bias = f32t(&[2], &[10.0, 20.0]);
    let out = exact(src, &[m23(), w, bias]);
    assert_eq!(out[0], f32t(&[2, 2], &[-2.0, 3.0, -2.0, 7.5]));
    assert_eq!(out[1], f32t(&[2, 2], &[8.0, 23.0, 8.0, 27.5]));
    // A rank-3 input.
    let src =
        "fusion f() { tensor x: f32[2, 1, 3]\n tensor w: f32[1, 3]\n y = linear(x, w)\n output y }";
    let x = f32t(&[2, 1, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(
        exact1(src, &[x, f32t(&[1, 3], &[1.0, 1.0, 1.0])]),
        f32t(&[2, 1, 1], &[6.0, 15.0])
    );
}

#[test]
fn row_parallel_linear_scenario_reference() {
    let fusion = parse_with(
        &scenario("row_parallel_linear"),
        &[("h", 2), ("s", 3), ("t", 6)],
    );
    let inp = Dense::random(DType::BF16, vec![6, 8], 21);
    let w = Dense::random(DType::BF16, vec![2, 8], 22);
    let out = run_reference(&fusion, &[inp.clone(), w.clone()])
        .unwrap()
        .remove(0);
    assert_eq!((out.dtype, out.sizes.clone()), (DType::BF16, vec![6, 2]));
    for i in 0..6 {
        for j in 0..2 {
            let want: f64 = (0..8)
                .map(|p| inp.data[i * 8 + p] * w.data[j * 8 + p])
                .sum();
            // The bf16 linear's result is a bf16 value.
            assert_eq!(out.data[i * 2 + j], round_to(DType::BF16, want));
        }
    }
}

// ----- precision modes ----------------------------------------------------------------------

#[test]
fn round_outputs_rounds_outputs_but_not_intermediates() {
    // a = 1 + 2^-7; a * a = 1 + 2^-6 + 2^-14, which is not a bf16 (it rounds to 1 + 2^-6).
    let src = "fusion f() { tensor a: bf16[1]\n tensor r: bf16[1]\n b = mul(a, a)\n c = sub(b, r)\n output b, c }";
    let a = t(DType::BF16, &[1], &[1.0 + 2f64.powi(-7)]);
    let r = t(DType::BF16, &[1], &[1.0 + 2f64.powi(-6)]);
    let f = parse(src);
    let ex = eval_fusion(&f, &[a.clone(), r.clone()], Precision::Exact).unwrap();
    assert_eq!(ex[0].data, vec![1.0 + 2f64.powi(-6) + 2f64.powi(-14)]);
    assert_eq!(ex[1].data, vec![2f64.powi(-14)]);
    let ro = eval_fusion(&f, &[a, r], Precision::RoundOutputs).unwrap();
    assert_eq!(ro[0].data, vec![1.0 + 2f64.powi(-6)]);
    // c is computed from the unrounded b.
    assert_eq!(ro[1].data, vec![2f64.powi(-14)]);
    assert!(ro.iter().all(|d| d.dtype == DType::BF16));
}

#[test]
fn the_reference_rounds_every_op_result_to_its_dtype() {
    // As above: b = a * a is 1 + 2^-6 + 2^-14 exactly, the bf16 value 1 + 2^-6 as stored.
    let src = "fusion f() { tensor a: bf16[1]\n tensor r: bf16[1]\n b = mul(a, a)\n bb = set(b)\n c = sub(bb, r)\n f = cast(b, f32)\n output c, f }";
    let a = t(DType::BF16, &[1], &[1.0 + 2f64.powi(-7)]);
    let r = t(DType::BF16, &[1], &[1.0 + 2f64.powi(-6)]);
    let out = run_reference(&parse(src), &[a, r]).unwrap();
    // c is computed from the rounded b, and the f32 cast reads the bf16 value.
    assert_eq!(out[0].data, vec![0.0]);
    assert_eq!(out[1].data, vec![1.0 + 2f64.powi(-6)]);
}

// ----- shape polymorphism -------------------------------------------------------------------

#[test]
fn evaluates_on_a_chunk_of_the_declared_shape() {
    // Declared [x, y] = [4, 3]; launched on the chunk [2, 3].
    let src = "fusion f(x = 4, y = 3) { tensor a: f32[x, y]\n tensor b: f32[x, y]\n c = add(a, b)\n s = sum(c, [1])\n output c, s }";
    let out = exact(src, &[m23(), m23()]);
    assert_eq!(out[0], f32t(&[2, 3], &[2.0, 4.0, 6.0, 8.0, 10.0, 12.0]));
    assert_eq!(out[1], f32t(&[2], &[12.0, 30.0]));
    // The reduction scenario on a quarter of its axis 0.
    let x = Dense::random(DType::F32, vec![3, 8, 2], 9);
    let out = run_reference(&parse(&scenario("reduction")), &[x]).unwrap();
    assert_eq!(out[0].sizes, vec![3, 8]);
}

#[test]
fn reshapes_follow_the_chunk() {
    let data: Vec<f64> = (0..12).map(f64::from).collect();
    // Merge on a chunk of axis 0 ([2, 3, 4] declared, [1, 3, 4] given) and of axis 1.
    let merge = "fusion f(a = 2, b = 3, c = 4) { tensor x: f32[a, b, c]\n y = reshape(x, [a, b * c])\n z = permute(y, [1, 0])\n output y, z }";
    let out = exact(merge, &[f32t(&[1, 3, 4], &data)]);
    assert_eq!(out[0].sizes, vec![1, 12]);
    assert_eq!(out[1].sizes, vec![12, 1]);
    let merge_inner = "fusion f(a = 2, b = 3, c = 4) { tensor x: f32[a, b, c]\n y = reshape(x, [a, b * c])\n output y }";
    assert_eq!(
        exact1(merge_inner, &[f32t(&[2, 1, 4], &data[..8])]).sizes,
        vec![2, 4]
    );
    // Split of a chunked axis: [a * b, c] = [6, 4] declared, [3, 4] given -> [1, 3, 4].
    let split = "fusion f(a = 2, b = 3, c = 4) { tensor x: f32[a * b, c]\n y = reshape(x, [a, b, c])\n output y }";
    assert_eq!(
        exact1(split, &[f32t(&[3, 4], &data)]),
        f32t(&[1, 3, 4], &data)
    );
    assert_eq!(
        err(split, &[f32t(&[2, 4], &data[..8])]),
        "reshape `y`: cannot split axis 0 of sizes [2, 4] into rows of 3"
    );
}

#[test]
fn linear_on_a_chunk() {
    let src = "fusion f(t = 8, k = 3, n = 2) { tensor x: f32[t, k]\n tensor w: f32[n, k]\n y = linear(x, w)\n output y }";
    let w = f32t(&[2, 3], &[1.0, 0.0, -1.0, 0.5, 0.5, 0.5]);
    assert_eq!(
        exact1(src, &[m23(), w]),
        f32t(&[2, 2], &[-2.0, 3.0, -2.0, 7.5])
    );
}

// ----- errors -------------------------------------------------------------------------------

const ADD: &str = "fusion f(x = 2, y = 3) { tensor a: f32[x, y]\n tensor b: f32[x, y]\n c = add(a, b)\n output c }";

#[test]
fn wrong_input_count() {
    assert_eq!(err(ADD, &[m23()]), "fusion `f` takes 2 inputs, got 1");
    let one = "fusion g() { tensor a: f32[2]\n b = neg(a)\n output b }";
    assert_eq!(err(one, &[]), "fusion `g` takes 1 input, got 0");
}

#[test]
fn wrong_rank() {
    let fusion = parse(&scenario("reduction"));
    let e = eval_fusion(&fusion, &[f32t(&[2, 3], &[0.0; 6])], Precision::Exact).unwrap_err();
    assert_eq!(e.to_string(), "input 0 (`tv0`): expected rank 3, got 2");
}

#[test]
fn wrong_dtype() {
    let b = t(DType::BF16, &[2, 3], &[0.0; 6]);
    assert_eq!(
        err(ADD, &[m23(), b]),
        "input 1 (`b`): expected dtype f32, got bf16"
    );
}

#[test]
fn wrong_value_count() {
    let bad = Dense {
        dtype: DType::F32,
        sizes: vec![2, 3],
        data: vec![0.0; 5],
    };
    assert_eq!(
        err(ADD, &[m23(), bad]),
        "input 1 (`b`): sizes [2, 3] do not match its 5 values"
    );
}

#[test]
fn op_errors_name_the_op_and_tensor() {
    // Inputs of the right ranks but incompatible sizes.
    let b = f32t(&[4, 3], &[0.0; 12]);
    assert_eq!(
        err(ADD, &[m23(), b]),
        "add `c`: sizes [2, 3] and [4, 3] do not broadcast"
    );
    let mm = "fusion f(m = 2, k = 3, n = 2) { tensor a: f32[m, k]\n tensor b: f32[k, n]\n c = matmul(a, b)\n output c }";
    assert_eq!(
        err(mm, &[m23(), f32t(&[2, 2], &[0.0; 4])]),
        "matmul `c`: contraction sizes differ: [2, 3] x [2, 2]"
    );
    let sq = "fusion f() { tensor a: f32[1, 3]\n b = squeeze(a, [0])\n output b }";
    assert_eq!(
        err(sq, &[m23()]),
        "squeeze `b`: axis 0 of sizes [2, 3] has size 2, not 1"
    );
}

// ----- random tensors -----------------------------------------------------------------------

#[test]
fn random_is_deterministic_in_range_and_representable() {
    for dtype in DType::ALL {
        let a = Dense::random(dtype, vec![7, 33], 42);
        assert_eq!(a, Dense::random(dtype, vec![7, 33], 42), "{dtype}");
        assert_ne!(
            a.data,
            Dense::random(dtype, vec![7, 33], 43).data,
            "{dtype}"
        );
        assert_eq!(a.sizes, vec![7, 33]);
        assert_eq!(a.data.len(), 231);
        assert_eq!(a.clone().rounded(), a, "{dtype} values are representable");
        let (lo, hi) = match dtype {
            DType::I64 => (-8.0, 8.0),
            DType::Bool => (0.0, 1.0),
            _ => (-1.0, 1.0),
        };
        assert!(a.data.iter().all(|v| (lo..=hi).contains(v)), "{dtype}");
    }
    let ints = Dense::random(DType::I64, vec![1000], 1);
    assert!(ints.data.contains(&-8.0) && ints.data.contains(&8.0));
    let floats = Dense::random(DType::F32, vec![1000], 1);
    assert!(floats.data.iter().any(|v| *v < -0.9) && floats.data.iter().any(|v| *v > 0.9));
}

#[test]
fn random_is_never_all_zeros() {
    for seed in 0..300 {
        for dtype in [DType::Bool, DType::I64, DType::BF16] {
            let a = Dense::random(dtype, vec![1], seed);
            assert!(a.data.iter().any(|v| *v != 0.0), "{dtype} seed {seed}");
        }
    }
    assert_eq!(Dense::random(DType::F32, vec![0, 3], 1).data.len(), 0);
}

// ----- comparison ---------------------------------------------------------------------------

#[test]
fn tolerances_per_dtype() {
    assert_eq!(Tolerance::for_dtype(DType::BF16).rtol, 1.6e-2);
    assert_eq!(Tolerance::for_dtype(DType::F16).rtol, 2e-3);
    assert_eq!(Tolerance::for_dtype(DType::F32).rtol, 1e-5);
    assert_eq!(Tolerance::for_dtype(DType::F64).rtol, 1e-12);
    for d in [DType::I64, DType::Bool] {
        assert_eq!(
            Tolerance::for_dtype(d),
            Tolerance {
                rtol: 0.0,
                atol: 0.0
            }
        );
    }
}

#[test]
fn compare_catches_nan_and_large_errors_and_accepts_rounding() {
    let expected = [2.5, -1.0, 0.5, 1.75];
    let ok = compare(&expected, &expected, DType::BF16);
    assert!(ok.ok);
    assert_eq!((ok.mismatches, ok.worst, ok.max_abs), (0, None, 0.0));

    let mut nan = expected;
    nan[2] = f64::NAN;
    let c = compare(&nan, &expected, DType::BF16);
    assert!(!c.ok);
    assert_eq!((c.mismatches, c.worst), (1, Some(2)));
    assert_eq!(c.max_abs, f64::INFINITY);

    let mut five = expected;
    five[0] *= 1.05;
    let c = compare(&five, &expected, DType::BF16);
    assert!(!c.ok);
    assert_eq!((c.mismatches, c.worst), (1, Some(0)));

    let mut small = expected;
    small[0] *= 1.003;
    small[3] *= 0.997;
    let c = compare(&small, &expected, DType::BF16);
    assert!(c.ok, "{c}");
    assert!((c.max_abs - 0.0075).abs() < 1e-12);
    assert!((c.max_rel - 0.003).abs() < 1e-12);

    // Small elements are judged relative to the tensor's magnitude: an error of 1% of
    // max |ref| on an element near zero passes in bf16 ...
    let mut near_zero = [100.0, 0.01];
    near_zero[1] += 1.0;
    assert!(compare(&near_zero, &[100.0, 0.01], DType::BF16).ok);
    // ... but not in f32.
    assert!(!compare(&near_zero, &[100.0, 0.01], DType::F32).ok);
}

#[test]
fn compare_is_exact_for_integers_and_checks_lengths() {
    assert!(compare(&[1.0, 2.0], &[1.0, 2.0], DType::I64).ok);
    let c = compare(&[1.0, 3.0], &[1.0, 2.0], DType::I64);
    assert_eq!((c.ok, c.mismatches, c.worst), (false, 1, Some(1)));
    let c = compare(&[1.0], &[1.0, 2.0], DType::I64);
    assert_eq!((c.ok, c.mismatches), (false, 0));
    assert!(c
        .to_string()
        .starts_with("length mismatch: 1 actual values, 2 expected; "));
    // An infinite reference matches only the same infinity.
    assert!(
        compare(
            &[f64::INFINITY, f64::NEG_INFINITY],
            &[f64::INFINITY, f64::NEG_INFINITY],
            DType::F32
        )
        .ok
    );
    assert!(!compare(&[1e30], &[f64::INFINITY], DType::F32).ok);
    assert!(!compare(&[f64::NEG_INFINITY], &[f64::INFINITY], DType::F32).ok);
}

#[test]
fn a_nan_never_matches_not_even_a_nan_and_the_comparison_says_so() {
    // A reference that is NaN everywhere cannot be matched: the check must be able to fail.
    let nan = [f64::NAN; 4];
    let c = compare(&nan, &nan, DType::F32);
    assert!(!c.ok);
    assert_eq!((c.mismatches, c.nan_expected, c.nan_actual), (4, 4, 4));
    assert_eq!(c.max_abs, f64::INFINITY);
    assert_eq!(
        c.to_string(),
        "4 of 4 values are NaN in the reference: the check cannot pass on NaN; \
         4 of 4 actual values are NaN; max abs error inf (inf relative to max |ref| 0.00e0), \
         4 mismatches, worst at index 0"
    );
    // NaN in the reference only, whatever the output holds, at every tolerance.
    let c = compare(&[1.0, 2.0], &[1.0, f64::NAN], DType::BF16);
    assert_eq!((c.ok, c.mismatches, c.worst), (false, 1, Some(1)));
    assert_eq!((c.nan_expected, c.nan_actual), (1, 0));
    assert!(c
        .to_string()
        .starts_with("1 of 2 values are NaN in the reference: the check cannot pass on NaN; "));
    let loose = Tolerance {
        rtol: f64::INFINITY,
        atol: f64::INFINITY,
    };
    assert!(!compare_with(&[f64::NAN], &[f64::NAN], loose).ok);
    assert!(!compare_with(&[f64::NAN], &[1.0], loose).ok);
    // NaN in the output only; the sign and payload of a NaN change nothing.
    let c = compare(&[-f64::NAN, 1.0], &[0.5, 1.0], DType::I64);
    assert_eq!((c.ok, c.nan_expected, c.nan_actual), (false, 0, 1));
    // An infinity against a NaN is no match either way.
    assert!(!compare(&[f64::INFINITY], &[f64::NAN], DType::F32).ok);
    assert!(!compare(&[f64::NAN], &[f64::INFINITY], DType::F32).ok);
    // Clean comparisons count no NaN and their text is unchanged.
    let c = compare(&[2.5, 1.0], &[2.5, 1.0], DType::F32);
    assert_eq!((c.nan_expected, c.nan_actual), (0, 0));
}

#[test]
fn comparison_display() {
    let c = compare(&[2.5, 1.0], &[2.5, 1.003], DType::BF16);
    assert_eq!(
        c.to_string(),
        "max abs error 3.0e-3 (1.2e-3 relative to max |ref| 2.50e0), 0 mismatches"
    );
    let c = compare(&[f64::NAN, 1.0], &[2.5, 1.0], DType::BF16);
    assert_eq!(
        c.to_string(),
        "1 of 2 actual values are NaN; \
         max abs error inf (inf relative to max |ref| 2.50e0), 1 mismatch, worst at index 0"
    );
}

#[test]
fn compare_dense_checks_dtype_and_sizes() {
    let a = m23();
    assert!(compare_dense(&a, &a).unwrap().ok);
    let b = f32t(&[3, 2], &a.data);
    assert_eq!(
        compare_dense(&a, &b).unwrap_err().to_string(),
        "sizes differ: actual [2, 3], expected [3, 2]"
    );
    let c = t(DType::BF16, &[2, 3], &a.data);
    assert_eq!(
        compare_dense(&a, &c).unwrap_err().to_string(),
        "dtype differs: actual f32, expected bf16"
    );
}

/// Equal up to f64 rounding of a different summation order (the GEMM blocks and may fuse
/// multiply-adds).
fn assert_close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-12 * w.abs().max(1.0),
            "element {k}: {g} != {w}"
        );
    }
}
