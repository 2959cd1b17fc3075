//! Property tests of the host text parser: arbitrary text, token soups and mutated fixtures
//! never make `parse` (or `verify` of what parses) panic, every error renders with its place,
//! and whatever parses prints to a fixed point.

mod common;

use proptest::prelude::*;
use weave_host_ir::{parse, print, verify};

const SEEDS: &[&str] = &[
    include_str!("fixtures/row_parallel_linear.hir"),
    include_str!("fixtures/all_nodes.hir"),
    include_str!("fixtures/ring_allgather.hir"),
];

/// Tokens (and near-tokens) of the format.
const VOCAB: &[&str] = &[
    "%HostIrContainer",
    "%",
    "HostIrContainer",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    "->",
    ":",
    ",",
    "=",
    "+",
    "-",
    "*",
    "/",
    "%",
    "//",
    "\n",
    "\n  ",
    "\n    ",
    "  ",
    "T0",
    "T1",
    "T3",
    "T3_g_f32",
    "T4_l_bf16",
    "T9_sym_i64",
    "T2_x_f32",
    "ALLOCATE",
    "mem_type",
    "global",
    "zero_init",
    "true",
    "Deallocate",
    "FOR",
    "i0",
    "i1",
    "from",
    "to",
    "Stream",
    "GetCurrentStream",
    "SetCurrentStream",
    "Synchronize",
    "ShardByStream",
    "axis",
    "chunks",
    "stream_index",
    "LaunchKernel",
    "kernel",
    "K0",
    "inputs",
    "outputs",
    "matmul",
    "linear",
    "Communication",
    "P2PCommunication",
    "type",
    "Allreduce",
    "Broadcast",
    "send",
    "recv",
    "team",
    "root",
    "red_op",
    "sum",
    "input",
    "output",
    "buffer",
    "peer",
    "backend",
    "NCCL",
    "StartCoalescing",
    "EndCoalescing",
    "Wait",
    "Statement",
    "ceilDiv",
    "rank",
    "numberOfStreams",
    "0",
    "3",
    "99999999999999999999",
    "fusion",
    "K0: fusion f(n = 4) {\n  tensor a: f32[n]\n  output a\n}\n",
    "@",
    "é",
];

fn check(src: &str) -> Result<(), TestCaseError> {
    match parse(src) {
        Ok(p) => {
            let printed = print(&p);
            let again = parse(&printed).map_err(|e| {
                TestCaseError::fail(format!(
                    "printed text does not parse: {}\n{printed}",
                    e.render("printed.hir", &printed)
                ))
            })?;
            prop_assert_eq!(print(&again), printed);
            let _ = verify(&p);
        }
        Err(e) => {
            prop_assert!(e.span.is_some(), "no position: {}", e.message);
            let rendered = e.render("fuzz.hir", src);
            prop_assert!(rendered.contains(&e.message));
        }
    }
    Ok(())
}

fn soup() -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(VOCAB), 0..80).prop_map(|toks| {
        let mut s = String::from("%HostIrContainer { (T0_g_f32[4]) -> () :\n  ");
        for t in toks {
            s.push_str(t);
            s.push(' ');
        }
        s
    })
}

/// A seed with one line replaced, deleted, duplicated, or a token spliced in.
fn mutated() -> impl Strategy<Value = String> {
    (
        proptest::sample::select(SEEDS),
        any::<usize>(),
        0u8..4,
        proptest::sample::select(VOCAB),
    )
        .prop_map(|(seed, at, how, tok)| {
            let mut lines: Vec<String> = seed.lines().map(str::to_string).collect();
            let i = at % lines.len();
            match how {
                0 => {
                    lines.remove(i);
                }
                1 => {
                    let l = lines[i].clone();
                    lines.insert(i, l);
                }
                2 => {
                    let l = &mut lines[i];
                    let cut = l.char_indices().map(|(k, _)| k).nth(at % (l.len() + 1));
                    l.insert_str(cut.unwrap_or(l.len()), tok);
                }
                _ => lines[i] = tok.to_string(),
            }
            lines.join("\n") + "\n"
        })
}

proptest! {
    #![proptest_config(common::unpersisted(1024))]

    #[test]
    fn arbitrary_text_never_panics(src in ".{0,200}") {
        check(&src)?;
    }

    #[test]
    fn token_soups_never_panic(src in soup()) {
        check(&src)?;
    }

    #[test]
    fn mutated_programs_never_panic(src in mutated()) {
        check(&src)?;
    }
}
