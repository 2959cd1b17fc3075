//! Property tests of the `.weave` parser: arbitrary text, token soups and mutated valid
//! programs never make `parse` panic, every error renders with its place, and whatever
//! parses prints to a fixed point.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use weave_ir::text::{parse, print};

/// Valid programs the mutation strategy starts from.
const SEEDS: &[&str] = &[
    include_str!("fixtures/row_parallel_linear.weave"),
    "fusion ops(t = 8, h = 4, d = 2) {
  mesh g = [[0, 1], [2, 3]]
  mesh l = [0, 1]
  tensor a: f32[t, h] on l
  tensor b: f32[t, h]
  tensor c: bool[t, h]
  tensor w: f32[2 * h, h]
  tensor x: bf16[t, 1]
  c0 = cast(x, f32)
  u0 = exp(a)
  b0 = add(a, b)
  b7 = lt(a, b)
  b14 = or(c, b7)
  w0 = where(c, a, b)
  r0 = sum(a, [1])
  bc = broadcast(r0, [1])
  sq = squeeze(x, [1])
  p0 = permute(a, [1, 0])
  v0 = reshape(a, [t, 2, 2])
  v1 = reshape(a, [t * h])
  wt = permute(w, [1, 0])
  mm = matmul(a, wt)
  l1 = linear(a, w)
  output l1, mm
  schedule w { inner_split(1, ceilDiv(t, d)); merge(0, 1); reorder(0 -> 1, 1 -> 0) }
  schedule a { parallelize(0, DIDy); allocation = loop; mesh = g; memory = symmetric }
}
",
];

/// Tokens (and near-tokens) of the format, for soups and insertions.
const VOCAB: &[&str] = &[
    "fusion",
    "mesh",
    "tensor",
    "on",
    "output",
    "schedule",
    "devices",
    "allocation",
    "loop",
    "memory",
    "ceilDiv",
    "global",
    "local",
    "symmetric",
    "set",
    "cast",
    "neg",
    "exp",
    "not",
    "add",
    "lt",
    "and",
    "where",
    "sum",
    "max",
    "broadcast",
    "squeeze",
    "permute",
    "reshape",
    "matmul",
    "linear",
    "outer_split",
    "inner_split",
    "merge",
    "reorder",
    "parallelize",
    "bf16",
    "f32",
    "bool",
    "i64",
    "DIDx",
    "DIDy",
    "Stream",
    "Serial",
    "a",
    "b",
    "t",
    "h",
    "d",
    "s",
    "m",
    "w",
    "inp",
    "out",
    "x",
    "0",
    "1",
    "2",
    "4",
    "8",
    "99999999999999999999",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    ";",
    "=",
    "->",
    "+",
    "-",
    "*",
    "/",
    "%",
    "\n",
    "\n",
    "//",
    "#",
    "@",
    "é",
    "\t",
    "12ab",
    "\u{0}",
];

fn check(src: &str, overrides: &[(String, i64)]) {
    match parse(src, overrides) {
        Ok(f) => {
            let once = print(&f);
            let g = parse(&once, &[]).unwrap_or_else(|e| {
                panic!("printed form does not parse: {e}\n--- source\n{src}\n--- printed\n{once}")
            });
            assert_eq!(print(&g), once, "not a fixed point for\n{src}");
        }
        Err(e) => {
            assert!(!e.message.is_empty());
            let rendered = e.render("fuzz.weave", src);
            assert!(rendered.starts_with("error: "), "{rendered}");
            assert!(rendered.contains(&e.message), "{rendered}");
            if let Some(span) = e.span {
                assert!(span.line >= 1 && span.col >= 1, "{span:?}");
                assert!(
                    rendered.contains(&format!("fuzz.weave:{span}")),
                    "{rendered}"
                );
            }
        }
    }
}

fn soup() -> impl Strategy<Value = String> {
    let tok = prop::sample::select(VOCAB);
    let sep = prop::sample::select(&[" ", "", "\n"][..]);
    prop::collection::vec((tok, sep), 0..120).prop_map(|v| {
        let body: String = v.into_iter().map(|(t, s)| format!("{t}{s}")).collect();
        body
    })
}

/// An edit to a valid program, positions taken modulo its length (in characters or lines).
#[derive(Clone, Debug)]
enum Edit {
    Delete(usize, usize),
    Insert(usize, &'static str),
    Duplicate(usize, usize),
    Replace(usize, usize, &'static str),
    DeleteLine(usize),
    DuplicateLine(usize),
    SwapLines(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), 1usize..12).prop_map(|(p, n)| Edit::Delete(p, n)),
        (any::<usize>(), prop::sample::select(VOCAB)).prop_map(|(p, t)| Edit::Insert(p, t)),
        (any::<usize>(), 1usize..40).prop_map(|(p, n)| Edit::Duplicate(p, n)),
        (any::<usize>(), 1usize..6, prop::sample::select(VOCAB))
            .prop_map(|(p, n, t)| Edit::Replace(p, n, t)),
        any::<usize>().prop_map(Edit::DeleteLine),
        any::<usize>().prop_map(Edit::DuplicateLine),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
    ]
}

fn apply(src: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = src.chars().collect();
    for e in edits {
        let len = chars.len().max(1);
        let text: String = chars.iter().collect();
        let mut lines: Vec<&str> = text.lines().collect();
        let nl = lines.len().max(1);
        let mut set_lines = |lines: Vec<&str>| chars = lines.join("\n").chars().collect();
        match e {
            Edit::DeleteLine(p) => {
                if !lines.is_empty() {
                    lines.remove(p % nl);
                }
                set_lines(lines);
            }
            Edit::DuplicateLine(p) => {
                if let Some(l) = lines.get(p % nl).copied() {
                    lines.insert(p % nl, l);
                }
                set_lines(lines);
            }
            Edit::SwapLines(a, b) => {
                if !lines.is_empty() {
                    lines.swap(a % nl, b % nl);
                }
                set_lines(lines);
            }
            Edit::Delete(p, n) => {
                let p = p % len;
                let end = (p + n).min(chars.len());
                chars.drain(p.min(end)..end);
            }
            Edit::Insert(p, t) => {
                let p = p % (chars.len() + 1);
                chars.splice(p..p, t.chars());
            }
            Edit::Duplicate(p, n) => {
                let p = p % len;
                let end = (p + n).min(chars.len());
                let piece: Vec<char> = chars[p.min(end)..end].to_vec();
                chars.splice(end..end, piece);
            }
            Edit::Replace(p, n, t) => {
                let p = p % len;
                let end = (p + n).min(chars.len());
                chars.splice(p.min(end)..end, t.chars());
            }
        }
    }
    chars.into_iter().collect()
}

/// The text of a random scalar expression over the parameters `t`, `h`, `d`, `s`.
fn scalar_text() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        (0i64..20).prop_map(|v| v.to_string()),
        prop::sample::select(&["t", "h", "d", "s"][..]).prop_map(String::from),
    ];
    leaf.prop_recursive(5, 24, 2, |inner| {
        prop_oneof![
            (
                inner.clone(),
                prop::sample::select(&["+", "-", "*", "/", "%"][..]),
                inner.clone()
            )
                .prop_map(|(a, op, b)| format!("{a} {op} {b}")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("ceilDiv({a}, {b})")),
            inner.prop_map(|a| format!("({a})")),
        ]
    })
}

fn step_text() -> impl Strategy<Value = String> {
    let pt = prop::sample::select(&["DIDx", "DIDy", "Stream", "Serial"][..]);
    let arrow = prop::option::of(pt.clone())
        .prop_map(|p| p.map(|p| format!(" -> {p}")).unwrap_or_default());
    prop_oneof![
        (0usize..4, scalar_text(), arrow.clone())
            .prop_map(|(a, f, p)| format!("outer_split({a}, {f}){p}")),
        (0usize..4, scalar_text(), arrow).prop_map(|(a, f, p)| format!("inner_split({a}, {f}){p}")),
        (0usize..4, 0usize..4).prop_map(|(a, b)| format!("merge({a}, {b})")),
        prop::collection::vec((0usize..4, 0usize..4), 1..3).prop_map(|m| {
            let m: Vec<String> = m.iter().map(|(a, b)| format!("{a} -> {b}")).collect();
            format!("reorder({})", m.join(", "))
        }),
        (0usize..4, pt).prop_map(|(a, p)| format!("parallelize({a}, {p})")),
        Just("allocation = loop".to_string()),
        Just("mesh = m".to_string()),
        prop::sample::select(&["global", "local", "symmetric"][..])
            .prop_map(|m| format!("memory = {m}")),
    ]
}

/// A program that is valid unless a random extent is not positive or some expression
/// divides by zero: random parameter values, extents and schedules.
fn generated_program() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(1i64..40, 4),
        prop::collection::vec(scalar_text(), 1..4),
        prop::collection::vec(step_text(), 0..6),
        prop::collection::vec(step_text(), 0..4),
        prop::sample::select(&["neg", "exp", "relu", "set"][..]),
    )
        .prop_map(|(vals, extents, steps_a, steps_c, unary)| {
            let rank = extents.len();
            let all: Vec<usize> = (0..rank).collect();
            let all: Vec<String> = all.iter().map(|a| a.to_string()).collect();
            format!(
                "fusion g(t = {}, h = {}, d = {}, s = {}) {{\n  mesh m = devices(d)\n  \
                 tensor a: f32[{ext}] on m\n  tensor b: f32[{ext}]\n  c = add(a, b)\n  \
                 u = {unary}(c)\n  r = sum(u, [{last}])\n  p = permute(a, [{perm}])\n  \
                 output r, p\n  schedule a {{ {sa} }}\n  schedule c {{\n    {sc}\n  }}\n}}\n",
                vals[0],
                vals[1],
                vals[2],
                vals[3],
                ext = extents.join(", "),
                last = rank - 1,
                perm = all.iter().rev().cloned().collect::<Vec<_>>().join(", "),
                sa = steps_a.join("; "),
                sc = steps_c.join("\n    "),
            )
        })
}

fn overrides() -> impl Strategy<Value = Vec<(String, i64)>> {
    let name = prop::sample::select(&["t", "h", "d", "s", "q", ""][..]).prop_map(String::from);
    let value = prop_oneof![-3i64..10, any::<i64>()];
    prop::collection::vec((name, value), 0..3)
}

proptest! {
    // Failures print the minimal input; nothing is persisted (there is no lib.rs next to
    // an integration test for proptest to anchor a regressions file to).
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_text_never_panics(src in "\\PC*") {
        check(&src, &[]);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        check(&String::from_utf8_lossy(&bytes), &[]);
    }

    #[test]
    fn token_soups_never_panic(body in soup(), header in any::<bool>()) {
        let src = if header { format!("fusion f(t = 8, h = 4) {{\n{body}\n}}\n") } else { body };
        check(&src, &[]);
    }

    #[test]
    fn mutated_programs_never_panic(
        seed in prop::sample::select(SEEDS),
        edits in prop::collection::vec(edit(), 1..5),
        ov in overrides(),
    ) {
        check(&apply(seed, &edits), &ov);
    }

    #[test]
    fn generated_programs_round_trip(src in generated_program(), ov in overrides()) {
        check(&src, &ov);
    }

    #[test]
    fn deep_and_long_inputs_never_panic(
        opens in 0usize..3000,
        plus in 0usize..3000,
        tail in prop::sample::select(&["", ")", "]", "}"][..]),
    ) {
        let src = format!(
            "fusion f(t = 8) {{\n  tensor a: f32[{}{}t{}]\n}}\n",
            "(".repeat(opens),
            "1 + ".repeat(plus),
            tail
        );
        check(&src, &[]);
    }
}
