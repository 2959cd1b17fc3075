//! Round trips: every fixture under `tests/fixtures/` is printer output (`print(parse(x)) ==
//! x`) and verifies; together they use every node; the seed row-parallel program built with
//! the builder prints exactly as its fixture; and for random programs built through the
//! builder, valid or not, `print(parse(print(p))) == print(p)` and the verifier's verdict
//! survives the round trip.

use std::collections::BTreeSet;
use std::path::PathBuf;

mod common;

use proptest::prelude::*;
use weave_host_ir::{
    parse, print, verify, ChunkOf, Communication, CommunicationType, HostProgram, HostScalar,
    HostTensorId, P2PCommunication, P2PDirection, ScalarId, ScopeRef, Stmt, StmtId, StreamId,
};
use weave_ir::{DType, MemoryType, ReduceOp, Scalar, ScalarOp};

fn fixtures() -> Vec<(String, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("tests/fixtures")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "hir"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    out.sort();
    assert!(out.len() >= 4, "fixtures missing from {}", dir.display());
    out
}

fn parse_ok(name: &str, src: &str) -> HostProgram {
    parse(src).unwrap_or_else(|e| panic!("{}", e.render(name, src)))
}

#[test]
fn every_fixture_is_a_fixed_point_and_verifies() {
    for (name, src) in fixtures() {
        let p = parse_ok(&name, &src);
        assert_eq!(print(&p), src, "{name} is not in printed form");
        if let Err(e) = verify(&p) {
            panic!("{name}: {}", e.message);
        }
        let again = parse_ok(&name, &print(&p));
        assert_eq!(print(&again), src, "{name}");
    }
}

#[test]
fn the_fixtures_use_every_node() {
    let mut kinds = BTreeSet::new();
    let mut comms = BTreeSet::new();
    let mut p2p = BTreeSet::new();
    let mut memories = BTreeSet::new();
    let mut bias = false;
    for (name, src) in fixtures() {
        let p = parse_ok(&name, &src);
        for w in p.walk() {
            let stmt = &p.stmts[w.stmt];
            kinds.insert(stmt.kind_name());
            match stmt {
                Stmt::Communication(c) => {
                    comms.insert(c.kind.name());
                }
                Stmt::P2PCommunication(c) => {
                    p2p.insert(format!("{:?}", c.direction));
                }
                Stmt::Linear { bias: Some(_), .. } => bias = true,
                _ => {}
            }
        }
        for t in p.tensors.values() {
            memories.insert(t.memory.name());
        }
    }
    let all_kinds = [
        "Allocate",
        "Deallocate",
        "ForLoop",
        "GetCurrentStream",
        "SetCurrentStream",
        "Synchronize",
        "ShardByStream",
        "LaunchKernel",
        "Matmul",
        "Linear",
        "Communication",
        "P2PCommunication",
        "StartCoalescing",
        "EndCoalescing",
        "Wait",
    ];
    assert_eq!(kinds, all_kinds.into_iter().collect());
    let all_comms: BTreeSet<&str> = CommunicationType::ALL.iter().map(|c| c.name()).collect();
    assert_eq!(comms, all_comms);
    assert_eq!(p2p.len(), 2);
    assert_eq!(memories.len(), 3);
    assert!(bias);
}

/// The seed row-parallel program, built the way lowering builds it. Arena order differs from
/// print order on purpose (T5 and the join loop's stream are created first, the Wait is
/// placed before its communication is inserted): names come from the printer.
fn build_row_parallel() -> HostProgram {
    let mut p = HostProgram::new();
    let g = MemoryType::Global;
    let t = Scalar::named("t");
    let chunk = t.clone().ceil_div(3);
    let t5 = p.new_tensor(DType::BF16, vec![chunk.clone(), Scalar::c(2)], g);
    let t0 = p.add_input(
        DType::BF16,
        vec![chunk.clone(), Scalar::c(2), Scalar::c(4)],
        g,
    );
    let t1 = p.add_input(DType::BF16, vec![Scalar::c(2), Scalar::c(4)], g);
    let t2 = p.new_tensor(DType::BF16, vec![t, Scalar::c(2)], g);
    p.add_output(t2);
    p.push(
        ScopeRef::Top,
        Stmt::Allocate {
            tensor: t2,
            zero_init: false,
        },
    );
    let main = p.stream_captured();
    p.push(ScopeRef::Top, Stmt::GetCurrentStream { out: main });
    let (zero, three) = (p.constant(0), p.constant(3));
    let (l0, i0) = p.push_for(ScopeRef::Top, zero, three);
    let body = ScopeRef::Body(l0);
    let worker = p.stream_indexed(i0);
    p.push(body, Stmt::SetCurrentStream { stream: worker });
    p.push(body, Stmt::Synchronize { stream: main });
    let t3 = p.new_tensor(
        DType::BF16,
        vec![chunk.clone(), Scalar::c(2), Scalar::c(4)],
        g,
    );
    p.push(
        body,
        Stmt::ShardByStream {
            input: t0,
            axis: 0,
            chunks: three,
            index: i0,
            holds: None,
            output: t3,
        },
    );
    let t4 = p.new_tensor(DType::BF16, vec![chunk, Scalar::c(2)], g);
    p.push(
        body,
        Stmt::Allocate {
            tensor: t4,
            zero_init: false,
        },
    );
    p.push(
        body,
        Stmt::Linear {
            input: t3,
            weight: t1,
            bias: None,
            out: t4,
            accumulate: false,
        },
    );
    p.push(
        body,
        Stmt::ShardByStream {
            input: t2,
            axis: 0,
            chunks: three,
            index: i0,
            holds: None,
            output: t5,
        },
    );
    let dealloc = p.push(body, Stmt::Deallocate { tensor: t4 });
    let wait = p.insert_before(
        dealloc,
        Stmt::Wait {
            comm: StmtId::default(),
        },
    );
    let comm = p.insert_before(
        wait,
        Stmt::Communication(Communication {
            kind: CommunicationType::Allreduce,
            teams: vec![vec![0, 1]],
            root: None,
            red_op: Some(ReduceOp::Sum),
            input: t4,
            output: t5,
        }),
    );
    p.stmts[wait] = Stmt::Wait { comm };
    p.push(ScopeRef::Top, Stmt::SetCurrentStream { stream: main });
    let (l1, i1) = p.push_for(ScopeRef::Top, zero, three);
    let joined = p.stream_indexed(i1);
    p.push(ScopeRef::Body(l1), Stmt::Synchronize { stream: joined });
    p
}

#[test]
fn the_seed_program_built_by_hand_prints_as_its_fixture() {
    let p = build_row_parallel();
    let want = fixtures()
        .into_iter()
        .find(|(n, _)| n == "row_parallel_linear.hir")
        .map(|(_, s)| s)
        .unwrap();
    assert_eq!(print(&p), want);
    assert_eq!(p.to_string(), want);
    verify(&p).unwrap();
}

#[test]
fn removing_a_statement_renumbers_only_what_follows_it() {
    let mut p = build_row_parallel();
    let before = print(&p);
    // Drop the trailing join loop: the lines above it are unchanged.
    let last = *p.top_level.last().unwrap();
    p.remove(last);
    let after = print(&p);
    let kept: Vec<&str> = before
        .lines()
        .take_while(|l| !l.contains("FOR i1"))
        .collect();
    assert!(after.starts_with(&kept.join("\n")), "{after}");
}

// ----- random programs ----------------------------------------------------------------------

/// Builds a program from `ops`, each choosing a statement and its operands among what exists
/// so far. Programs are mostly invalid; that is the point: the text must carry any program.
fn random_program(ops: &[(u8, u8, u8, u8)]) -> HostProgram {
    let mut p = HostProgram::new();
    let g = MemoryType::Global;
    let n = p.named("n");
    let mut tensors: Vec<HostTensorId> = vec![
        p.add_input(DType::F32, vec![Scalar::named("t"), Scalar::c(4)], g),
        p.add_input(DType::BF16, vec![Scalar::c(4)], MemoryType::Symmetric),
    ];
    let out = p.new_tensor_sized(DType::F32, vec![n], MemoryType::Local);
    p.add_output(out);
    tensors.push(out);
    let kernel = p.add_kernel(
        weave_ir::text::parse(
            "fusion k(n = 4) {\n  tensor a: f32[n]\n  b = neg(a)\n  output b\n}\n",
            &[],
        )
        .unwrap(),
    );
    let mut scalars: Vec<ScalarId> = vec![p.constant(0), p.constant(-3), n, p.named("rank")];
    let mut streams: Vec<StreamId> = vec![p.stream_captured()];
    let mut placed: Vec<StmtId> = Vec::new();
    let mut scopes = vec![ScopeRef::Top];
    for &(op, a, b, c) in ops {
        let pick = |v: &[ScalarId], k: u8| v[k as usize % v.len()];
        let scope = *scopes.last().unwrap();
        let tensor = |k: u8| tensors[k as usize % tensors.len()];
        let tensor_a = tensor(a);
        let tensor_b = tensor(b);
        let stmt = match op % 18 {
            0 => {
                let t = if a % 2 == 0 {
                    let dtype = DType::ALL[b as usize % DType::ALL.len()];
                    let sizes = vec![pick(&scalars, c), pick(&scalars, b)];
                    let t = p.new_tensor_sized(dtype, sizes, g);
                    tensors.push(t);
                    t
                } else {
                    tensor(b)
                };
                Stmt::Allocate {
                    tensor: t,
                    zero_init: c % 2 == 0,
                }
            }
            1 => Stmt::Deallocate { tensor: tensor(a) },
            2 if scopes.len() < 4 => {
                let (start, stop) = (pick(&scalars, a), pick(&scalars, b));
                let (l, i) = p.push_for(scope, start, stop);
                placed.push(l);
                scalars.push(i);
                scopes.push(ScopeRef::Body(l));
                continue;
            }
            3 => {
                if scopes.len() > 1 {
                    scopes.pop();
                }
                continue;
            }
            4 => {
                let s = p.stream_captured();
                streams.push(s);
                Stmt::GetCurrentStream {
                    out: streams[a as usize % streams.len()],
                }
            }
            5 | 6 => {
                let s = if b % 2 == 0 {
                    streams[a as usize % streams.len()]
                } else {
                    let s = p.stream_indexed(pick(&scalars, a));
                    streams.push(s);
                    s
                };
                if op % 18 == 5 {
                    Stmt::SetCurrentStream { stream: s }
                } else {
                    Stmt::Synchronize { stream: s }
                }
            }
            7 => {
                let output = p.tensor_like(tensor_a);
                tensors.push(output);
                Stmt::ShardByStream {
                    input: tensor_b,
                    axis: c as usize % 3,
                    chunks: pick(&scalars, c),
                    index: pick(&scalars, a),
                    holds: (b % 2 == 0).then(|| ChunkOf {
                        chunk: pick(&scalars, a),
                        chunks: pick(&scalars, b),
                        extent: pick(&scalars, c),
                    }),
                    output,
                }
            }
            8 => Stmt::LaunchKernel {
                kernel,
                inputs: vec![tensor(a)],
                outputs: (0..c % 3).map(|k| tensor(b.wrapping_add(k))).collect(),
            },
            9 => Stmt::Matmul {
                a: tensor(a),
                b: tensor(b),
                out: tensor(c),
                accumulate: c % 2 == 1,
            },
            10 => Stmt::Linear {
                input: tensor(a),
                weight: tensor(b),
                bias: (c % 2 == 0).then(|| tensor(c)),
                out: tensor(c / 2),
                accumulate: c % 3 == 1,
            },
            11 => {
                let kind = CommunicationType::ALL[a as usize % CommunicationType::ALL.len()];
                Stmt::Communication(Communication {
                    kind,
                    teams: (0..1 + i64::from(c % 2))
                        .map(|k| (0..b % 4).map(|d| i64::from(d) - 1 + 10 * k).collect())
                        .collect(),
                    root: (c % 2 == 0).then(|| pick(&scalars, c)),
                    red_op: (c % 3 == 0).then_some(ReduceOp::Max),
                    input: tensor(a),
                    output: tensor(b),
                })
            }
            12 => Stmt::P2PCommunication(P2PCommunication {
                direction: if a % 2 == 0 {
                    P2PDirection::Send
                } else {
                    P2PDirection::Recv
                },
                peer: pick(&scalars, b),
                buffer: tensor(c),
            }),
            13 => Stmt::StartCoalescing,
            14 => Stmt::EndCoalescing,
            15 if !placed.is_empty() => Stmt::Wait {
                comm: placed[a as usize % placed.len()],
            },
            16 => {
                let ops = [
                    ScalarOp::Add,
                    ScalarOp::Sub,
                    ScalarOp::Mul,
                    ScalarOp::Div,
                    ScalarOp::Mod,
                    ScalarOp::CeilDiv,
                ];
                let s = p.binary(ops[a as usize % 6], pick(&scalars, b), pick(&scalars, c));
                scalars.push(s);
                continue;
            }
            17 => {
                // A raw (unsimplified) value, and a constant-indexed pool stream.
                let v = Scalar::Binary(
                    ScalarOp::Mul,
                    Box::new(Scalar::named("t")),
                    Box::new(Scalar::Const(i64::from(a) - 128)),
                );
                let s = p.scalar(HostScalar::Value(v));
                scalars.push(s);
                let k = p.constant(i64::from(b) - 128);
                streams.push(p.stream_indexed(k));
                continue;
            }
            _ => continue,
        };
        placed.push(p.push(scope, stmt));
    }
    p
}

proptest! {
    #![proptest_config(common::unpersisted(512))]

    #[test]
    fn any_program_survives_print_then_parse(
        ops in proptest::collection::vec(any::<(u8, u8, u8, u8)>(), 0..40)
    ) {
        let p = random_program(&ops);
        let text = print(&p);
        let q = match parse(&text) {
            Ok(q) => q,
            Err(e) => panic!("{}", e.render("printed.hir", &text)),
        };
        prop_assert_eq!(print(&q), text.clone());
        let (vp, vq) = (verify(&p), verify(&q));
        prop_assert_eq!(
            vp.map_err(|e| e.message),
            vq.map_err(|e| e.message),
            "verdicts differ for\n{}", text
        );
    }
}

/// The built-in scalars parse as typed values ([`weave_ir::Builtin`]), never as parameters,
/// and print back by name.
#[test]
fn built_in_scalars_parse_typed() {
    let src = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/all_nodes.hir"),
    )
    .unwrap();
    let p = parse_ok("all_nodes.hir", &src);
    let mut seen = BTreeSet::new();
    for s in p.scalars.values() {
        if let HostScalar::Value(v) = s {
            for b in weave_ir::Builtin::ALL {
                if v.mentions(b) {
                    seen.insert(b.name());
                }
            }
            assert!(
                !matches!(v, Scalar::Named(n) if weave_ir::RESERVED_NAMES.contains(&&**n)),
                "a built-in parsed as a parameter: {v}"
            );
        }
    }
    assert_eq!(
        seen,
        BTreeSet::from([weave_ir::RANK, weave_ir::NUMBER_OF_STREAMS]),
        "all_nodes.hir uses both built-ins"
    );
    assert_eq!(print(&p), src);
}
