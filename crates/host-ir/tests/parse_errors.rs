//! Parser errors: the exact line:col and message of each kind of mistake. A syntax error
//! points at the token where something else was expected; an error about a name at the name.

use weave_host_ir::parse;

/// `line:col: message` of the error `src` must produce; rendering never panics.
fn error(src: &str) -> String {
    match parse(src) {
        Ok(p) => panic!("expected an error, parsed:\n{p}"),
        Err(e) => {
            let rendered = e.render("test.hir", src);
            assert!(rendered.contains(&e.message), "{rendered}");
            assert!(e.span.is_some(), "no position: {}", e.message);
            e.to_string()
        }
    }
}

/// A program with input `T0_g_f32[8]` whose body (line 2 on) is `body`.
fn program(body: &str) -> String {
    format!("%HostIrContainer {{ (T0_g_f32[8]) -> () :\n{body}}} // %HostIrContainer\n")
}

/// Checks that each program body `src` (see [`program`]) fails with `expected`.
fn assert_program_errors(cases: &[(&str, &str)]) {
    for (src, expected) in cases {
        assert_eq!(error(&program(src)), *expected, "{src:?}");
    }
}

#[test]
fn header_errors() {
    for (src, expected) in [
        ("", "1:1: expected `%HostIrContainer {`, found end of file"),
        (
            "\n// only a comment\n  HostIrContainer {",
            "3:3: expected `%` to start the container header `%HostIrContainer {`, found \
             `HostIrContainer`",
        ),
        (
            "%HostIrContainer { (T0_g_f32[8]) (T1) :\n} // %HostIrContainer\n",
            "1:34: expected `->` between the inputs and the outputs, found `(`",
        ),
        (
            "%HostIrContainer { (T0_g_f32[8] T1) -> () :\n}\n",
            "1:33: expected `)` or `,` in the tensor list, found `T1`",
        ),
        (
            "%HostIrContainer { () -> () :\n  StartCoalescing\n",
            "1:18: the container opened here is never closed: expected a line \
             `} // %HostIrContainer`",
        ),
        (
            "%HostIrContainer { () -> () :\n} trailing\n",
            "2:3: expected end of line after the `}` that closes the container, found `trailing`",
        ),
    ] {
        assert_eq!(error(src), expected, "{src:?}");
    }
}

#[test]
fn tensor_names_and_types() {
    assert_program_errors(&[
        (
            "  Deallocate(T7)\n",
            "2:14: `T7` is used before its type is declared; its first mention must read like \
             `T7_g_f32[4, 8]`",
        ),
        (
            "  T0_g_f32[8] = ALLOCATE(mem_type=global, zero_init=false)\n",
            "2:3: `T0` is declared again; after its first mention a tensor is written bare (`T0`)",
        ),
        (
            "  T1_g_f33[8] = ALLOCATE(mem_type=global, zero_init=false)\n",
            "2:3: unknown dtype `f33` in `T1_g_f33` (expected one of bf16, f16, f32, f64, i64, bool)",
        ),
        (
            "  T1_q_f32[8] = ALLOCATE(mem_type=global, zero_init=false)\n",
            "2:3: unknown memory type `q` in `T1_q_f32` (expected `g`, `l` or `sym`)",
        ),
        (
            "  T1_g_f32 = ALLOCATE(mem_type=global, zero_init=false)\n",
            "2:12: expected `[` with the sizes of `T1`, found `=`",
        ),
        (
            "  T1_g_f32[8] = ALLOCATE(mem_type=local, zero_init=false)\n",
            "2:35: `mem_type=local` does not match the tensor's type, which says `g`",
        ),
        (
            "  T1_g_f32[8] = ALLOCATE(mem_type=global, zero_init=maybe)\n",
            "2:53: expected `true` or `false`, found `maybe`",
        ),
    ]);
}

#[test]
fn statement_errors() {
    assert_program_errors(&[
        (
            "  Frobnicate(T0)\n",
            "2:3: expected a statement (`T3 = ALLOCATE(..)`, `T3 = ShardByStream(..)`, \
             `T3 = matmul(..)`, `T3 = linear(..)`, `Deallocate(..)`, `FOR`, \
             `Stream 0 = GetCurrentStream()`, `SetCurrentStream(..)`, `Synchronize(..)`, \
             `LaunchKernel(..)`, `Communication N (..)`, `P2PCommunication N (..)`, \
             `StartCoalescing`, `EndCoalescing N` or `Wait(..)`), found `Frobnicate`",
        ),
        (
            "  Deallocate(T0) Deallocate(T0)\n",
            "2:18: expected end of line after the statement, found `Deallocate`",
        ),
        (
            "  T1_g_f32[8] = add(T0, T0)\n",
            "2:17: expected `ALLOCATE`, `ShardByStream`, `matmul` or `linear` after `T… =`, \
             found `add`",
        ),
        (
            "  T1_g_f32[4] = ShardByStream(T0, axis=0, chunks=2, stream_index=0, holds=(chunk=0, extent=8))\n",
            "2:85: expected `chunks` after the chunk held, found `extent`",
        ),
        (
            "  T1_g_f32[8] += ALLOCATE(mem_type=global, zero_init=false)\n",
            "2:18: expected `matmul` or `linear` after `T… +=` (only a GEMM accumulates), found `ALLOCATE`",
        ),
        (
            "  T1_g_f32[8] + matmul(T0, T0)\n",
            "2:17: expected `=` after `+` (an accumulating `T… += matmul(..)`), found `matmul`",
        ),
        (
            "  T1_g_f32[8] = linear(T0, T0 T0)\n",
            "2:31: expected `)` or `,` with a bias to close `linear(`, found `T0`",
        ),
        (
            "  Communication 3 (type=AllGather, team=(0 1), input=T0, output=T0)\n",
            "2:25: unknown communication type `AllGather` (expected one of Allgather, Allreduce, \
             ReduceScatter, Broadcast, Reduce, Gather, Scatter, SendRecv, AllToAll, \
             CollectivePermute)",
        ),
        (
            "  Communication 3 (type=Allgather, team=(0 1), input=T0, output=T0, backend=UCC)\n",
            "2:77: unknown backend `UCC` (only `NCCL` is supported)",
        ),
        (
            "  Communication 3 (type=Allgather, team=(0 1), output=T0, input=T0)\n",
            "2:48: expected `input` (or `root=`) after the team, found `output`",
        ),
        (
            "  P2PCommunication 3 (type=put, buffer=T0, peer=1)\n",
            "2:28: expected `send` or `recv`, found `put`",
        ),
        (
            "  SetCurrentStream(Stream)\n",
            "2:26: expected a scalar (an integer, a name, or a parenthesized expression such as \
             `( i0 % numberOfStreams )`), found `)`",
        ),
        (
            "  Stream 0 = GetCurrentStream\n",
            "2:30: expected `(` after `GetCurrentStream`, found end of line",
        ),
    ]);
}

#[test]
fn labels_and_kernels() {
    assert_program_errors(&[
        (
            "  Wait(Communication 4)\n",
            "2:8: `Wait` names `Communication 4`, but no statement of the program has that label",
        ),
        (
            "  Communication 4 (type=Allgather, team=(0 1), input=T0, output=T0, backend=NCCL)\n  \
             Communication 4 (type=Allgather, team=(0 1), input=T0, output=T0, backend=NCCL)\n",
            "3:17: `Communication 4` is already the label of the statement at 2:17",
        ),
        (
            "  Wait(Event 4)\n",
            "2:8: expected what the `Wait` waits for: `Communication N`, `P2PCommunication N`, \
             `EndCoalescing N` or `Statement N`, found `Event`",
        ),
        (
            "  LaunchKernel(kernel=K0, inputs=(T0), outputs=())\n",
            "2:23: kernel `K0` is launched but has no block `K0: fusion …` after the container",
        ),
    ]);
    assert_eq!(
        error(
            &(program("  LaunchKernel(kernel=K0, inputs=(T0), outputs=())\n")
                + "K0: fusion f() {\n")
        ),
        "4:1: the block of kernel `K0` is never closed: expected a line `}`"
    );
    assert_eq!(
        error(&(program("") + "\nK0: fusion f(n = 4) {\n  tensor a: f32[n]\n  b = sett(a)\n}\n")),
        "6:7: in kernel `K0`: unknown op `sett` (expected one of: set, segment_set, cast, neg, abs, exp, log, \
         sin, cos, tanh, sqrt, rsqrt, reciprocal, relu, sigmoid, not, erf, gelu, gelu_tanh, add, \
         sub, mul, div, maximum, minimum, pow, eq, ne, lt, le, gt, ge, and, or, where, sum, max, \
         min, mean, var, broadcast, squeeze, permute, reshape, matmul, linear, iota, slice, concat, index_select)"
    );
    assert_eq!(
        error(&(program("") + "K0: fusion f(n = 4 {\n}\n")),
        "3:20: in kernel `K0`: expected `,` or `)` after parameter `n`, found `{`"
    );
    assert_eq!(
        error(&(program("") + "fusion f() {\n}\n")),
        "3:1: expected a block `Signature:`, `Definition: fusion …` or `K0: fusion …` after the container, found `fusion`"
    );
}

#[test]
fn indentation() {
    assert_program_errors(&[
        (
            "StartCoalescing\n",
            "2:1: expected a statement indented under the container header",
        ),
        (
            "  StartCoalescing\n    EndCoalescing 1\n",
            "3:5: unexpected indentation: expected a statement at column 3 (or a dedent that \
             matches an enclosing scope)",
        ),
        (
            "  FOR i0 from 0 to 2:\n      StartCoalescing\n    EndCoalescing 1\n",
            "4:5: unexpected indentation: expected a statement at column 3 (or a dedent that \
             matches an enclosing scope)",
        ),
        (
            "  FOR x from 0 to 2:\n",
            "2:7: expected a loop index such as `i0` after `FOR`, found `x`",
        ),
        (
            "  FOR i0 from 0 to 2\n",
            "2:21: expected `:` to end the `FOR` header, found end of line",
        ),
    ]);
}

#[test]
fn scalars() {
    assert_program_errors(&[
        (
            "  FOR i0 from 0 to ( 3 + n:\n",
            "2:27: expected `)` to close the expression opened at 2:20, found `:`",
        ),
        (
            "  FOR i0 from 0 to ( 3 ^ n ):\n",
            "2:24: unexpected character `^`",
        ),
        (
            "  FOR i0 from 0 to ( 3 n ):\n",
            "2:24: expected an operator (`+`, `-`, `*`, `/`, `%`) or `)`, found `n`",
        ),
        (
            "  FOR i0 from 0 to 99999999999999999999:\n",
            "2:20: integer `99999999999999999999` is out of range",
        ),
        (
            "  FOR i0 from 0 to -99999999999999999999:\n",
            "2:20: integer `-99999999999999999999` is out of range",
        ),
    ]);
    let deep = format!(
        "  FOR i0 from 0 to {}1{}:\n",
        "( ".repeat(70),
        " )".repeat(70)
    );
    assert_eq!(
        error(&program(&deep)),
        "2:150: the expression nests too deeply (at most 64 levels)"
    );
}

#[test]
fn loops_nest_at_most_64_deep() {
    let mut body = String::new();
    for k in 0..64 {
        body.push_str(&format!("{}FOR i{k} from 0 to 2:\n", "  ".repeat(k + 1)));
    }
    assert!(parse(&program(&body)).is_ok());
    body.push_str(&format!("{}FOR i64 from 0 to 2:\n", "  ".repeat(65)));
    assert_eq!(
        error(&program(&body)),
        "66:131: loops nest too deeply (at most 64 levels)"
    );
}

#[test]
fn signature_errors() {
    let sig = |lines: &str| program("") + "Signature:\n" + lines;
    for (src, expected) in [
        (
            "  input a: f32[8] split(Serial)\n",
            "4:3: expected `params(..)` as the first line of the signature, found `input`",
        ),
        ("  params(n=8)\n  input a: f33[8] split(Serial)\n", "5:12: unknown dtype `f33`"),
        (
            "  params(n=8) roles(devices=n)\n",
            "4:21: unknown parameter role `devices` (expected `mesh` or `chunks`)",
        ),
        (
            "  params(n=8) roles(mesh=m)\n",
            "4:26: role `mesh` names `m`, which is not among the params",
        ),
        (
            "  params()\n  input a: f32[8, 2] split(Serial)\n",
            "5:34: `a` has 2 sizes but 1 split trees",
        ),
        (
            "  params()\n  input a: f32[8] on [2](0 1) split(outer(0, DIDx, Serial))\n",
            "5:43: split factor 0 is out of range",
        ),
        (
            "  params()\n  input a: f32[8] on [3](0 1) split(DIDx)\n",
            "5:19: mesh of `a`: mesh shape [3] holds 3 devices but 2 were given",
        ),
        (
            "  params()\n  input a: f32[8] split(Thread)\n",
            "5:25: expected a parallel type (`Serial`, `Stream`, `DIDx`, `DIDy`) or `outer(..)`/`inner(..)`, found `Thread`",
        ),
    ] {
        assert_eq!(error(&sig(src)), expected, "{src:?}");
    }
}

#[test]
fn a_signature_parameter_may_not_take_a_built_in_name() {
    let src = program("") + "Signature:\n  params(rank=2)\n";
    assert_eq!(
        error(&src),
        "4:10: `rank` is a built-in scalar of host programs, bound when the program runs; no parameter may take its name"
    );
}
