//! The host passes `assign-streams` and `allocate-and-deallocate` on small host programs built
//! directly through the syntax arenas.

use weave_host_ir::{
    Communication, HostProgram, HostScalar, HostTensorId, P2PCommunication, P2PDirection, ScalarId,
    Stmt, StmtId, Stream, StreamId,
};
use weave_ir::{Fusion, ReduceOp, Scalar, ScalarOp};
use weave_passes::{AllocateAndDeallocate, AssignStreams, Changed, HostPass, Pass, SyncVariant};

/// Builds host programs through the arenas, and reads them back as shapes.
mod build {
    use super::*;
    use weave_host_ir::{HostTensor, KernelId, KernelUnit};
    use weave_ir::{DType, MemoryType};

    /// A host program under construction.
    #[derive(Default)]
    pub struct B {
        pub p: HostProgram,
    }

    impl B {
        pub fn cst(&mut self, v: i64) -> ScalarId {
            self.p.scalars.insert(HostScalar::Value(Scalar::c(v)))
        }

        pub fn index(&mut self) -> ScalarId {
            self.p.scalars.insert(HostScalar::LoopIndex)
        }

        /// A global f32 tensor with constant sizes.
        pub fn tensor(&mut self, sizes: &[i64]) -> HostTensorId {
            let sizes = sizes.iter().map(|&s| self.cst(s)).collect();
            self.p.tensors.insert(HostTensor {
                dtype: DType::F32,
                sizes,
                memory: MemoryType::Global,
            })
        }

        pub fn input(&mut self, sizes: &[i64]) -> HostTensorId {
            let t = self.tensor(sizes);
            self.p.inputs.push(t);
            t
        }

        pub fn output(&mut self, sizes: &[i64]) -> HostTensorId {
            let t = self.tensor(sizes);
            self.p.outputs.push(t);
            t
        }

        pub fn kernel(&mut self) -> KernelId {
            self.p.kernels.insert(KernelUnit {
                fusion: Fusion::default().into(),
            })
        }

        pub fn stmt(&mut self, s: Stmt) -> StmtId {
            self.p.stmts.insert(s)
        }

        pub fn launch(&mut self, inputs: &[HostTensorId], outputs: &[HostTensorId]) -> StmtId {
            let kernel = self.kernel();
            self.stmt(Stmt::LaunchKernel {
                kernel,
                inputs: inputs.to_vec(),
                outputs: outputs.to_vec(),
            })
        }

        pub fn matmul(&mut self, a: HostTensorId, b: HostTensorId, out: HostTensorId) -> StmtId {
            self.stmt(Stmt::Matmul {
                a,
                b,
                out,
                accumulate: false,
            })
        }

        pub fn shard(
            &mut self,
            input: HostTensorId,
            chunks: ScalarId,
            index: ScalarId,
            output: HostTensorId,
        ) -> StmtId {
            self.stmt(Stmt::ShardByStream {
                input,
                axis: 0,
                chunks,
                index,
                holds: None,
                output,
            })
        }

        pub fn allreduce(&mut self, input: HostTensorId, output: HostTensorId) -> StmtId {
            self.stmt(Stmt::Communication(Communication::allreduce(
                vec![vec![0, 1]],
                ReduceOp::Sum,
                input,
                output,
            )))
        }

        pub fn wait(&mut self, comm: StmtId) -> StmtId {
            self.stmt(Stmt::Wait { comm })
        }

        /// `FOR index from 0 to stop: body`.
        pub fn for_loop(&mut self, index: ScalarId, stop: ScalarId, body: Vec<StmtId>) -> StmtId {
            let start = self.cst(0);
            self.stmt(Stmt::ForLoop {
                index,
                start,
                stop,
                body,
            })
        }

        pub fn top(&mut self, s: StmtId) {
            self.p.top_level.push(s);
        }
    }

    /// Checks that the variant names of `scope` are the space-separated `expected`.
    #[track_caller]
    pub fn assert_kinds(p: &HostProgram, scope: &[StmtId], expected: &str) {
        assert_eq!(
            kinds(p, scope),
            expected.split_whitespace().collect::<Vec<_>>()
        );
    }

    /// The variant names of a scope, for shape assertions.
    pub fn kinds(p: &HostProgram, scope: &[StmtId]) -> Vec<&'static str> {
        scope.iter().map(|&s| p.stmts[s].kind_name()).collect()
    }

    pub fn body(p: &HostProgram, lp: StmtId) -> &[StmtId] {
        match &p.stmts[lp] {
            Stmt::ForLoop { body, .. } => body,
            other => panic!("not a loop: {other:?}"),
        }
    }

    /// Every statement, in program pre-order.
    pub fn all_stmts(p: &HostProgram) -> Vec<&Stmt> {
        fn go<'a>(p: &'a HostProgram, scope: &[StmtId], out: &mut Vec<&'a Stmt>) {
            for &s in scope {
                out.push(&p.stmts[s]);
                if let Stmt::ForLoop { body, .. } = &p.stmts[s] {
                    go(p, body, out);
                }
            }
        }
        let mut out = Vec::new();
        go(p, &p.top_level, &mut out);
        out
    }

    pub fn count(p: &HostProgram, name: &str) -> usize {
        all_stmts(p)
            .iter()
            .filter(|s| s.kind_name() == name)
            .count()
    }

    /// Evaluates a loop-invariant scalar with `numberOfStreams = n`.
    pub fn eval(p: &HostProgram, s: ScalarId, n: i64) -> i64 {
        let lookup = |name: &str| (name == "numberOfStreams").then_some(n);
        match &p.scalars[s] {
            HostScalar::Value(v) => v.eval(&lookup).expect("bound"),
            HostScalar::LoopIndex => panic!("loop index outside its loop"),
            HostScalar::Binary(op, a, b) => {
                let (a, b) = (eval(p, *a, n), eval(p, *b, n));
                let e = Scalar::binary(*op, Scalar::c(a), Scalar::c(b));
                e.as_const().expect("folds")
            }
        }
    }

    /// Whether `s` is `( index % numberOfStreams )`.
    pub fn is_slot_of(p: &HostProgram, s: ScalarId, index: ScalarId) -> bool {
        matches!(&p.scalars[s], HostScalar::Binary(ScalarOp::Mod, i, n)
            if *i == index
            && p.scalars[*n] == HostScalar::Value(Scalar::named("numberOfStreams")))
    }
}

use build::{all_stmts, assert_kinds, body, count, eval, is_slot_of, B};

fn run(pass: &dyn HostPass, p: &mut HostProgram) -> Changed {
    pass.run(p).expect("pass runs")
}

/// Runs `pass` a second time and checks that it changes nothing.
fn assert_idempotent(pass: &dyn HostPass, p: &mut HostProgram) {
    let before = format!("{:?}", all_stmts(p));
    assert_eq!(
        run(pass, p),
        Changed::No,
        "{} is not idempotent",
        pass.name()
    );
    assert_eq!(format!("{:?}", all_stmts(p)), before);
}

/// `FOR i from 0 to 3: LaunchKernel(x -> y)`, with `x` an input and `y` an output.
fn bare_loop() -> (B, StmtId, ScalarId) {
    let mut b = B::default();
    let x = b.input(&[3]);
    let y = b.output(&[3]);
    let k = b.launch(&[x], &[y]);
    let i = b.index();
    let three = b.cst(3);
    let lp = b.for_loop(i, three, vec![k]);
    b.top(lp);
    (b, lp, i)
}

fn stream_of(p: &HostProgram, s: StmtId) -> StreamId {
    match p.stmts[s] {
        Stmt::SetCurrentStream { stream } | Stmt::Synchronize { stream } => stream,
        Stmt::GetCurrentStream { out } => out,
        ref other => panic!("no stream in {other:?}"),
    }
}

fn loop_parts(p: &HostProgram, lp: StmtId) -> (ScalarId, ScalarId, ScalarId) {
    match p.stmts[lp] {
        Stmt::ForLoop {
            index, start, stop, ..
        } => (index, start, stop),
        ref other => panic!("not a loop: {other:?}"),
    }
}

/// Checks that `s` sets or waits for `Stream (index % numberOfStreams)`.
fn assert_worker(p: &HostProgram, s: StmtId, index: ScalarId) {
    let Stream::Indexed(slot) = p.streams[stream_of(p, s)] else {
        panic!("not a pool stream")
    };
    assert!(is_slot_of(p, slot, index), "not the slot of this loop");
}

#[test]
fn assign_streams_inline_shape() {
    let (mut b, lp, i) = bare_loop();
    let pass = AssignStreams::default();
    assert_eq!(pass.variant, SyncVariant::Inline);
    assert_eq!(pass.name(), "assign-streams");
    assert_eq!(run(&pass, &mut b.p), Changed::Yes);
    let p = &b.p;
    assert_kinds(
        p,
        &p.top_level,
        "GetCurrentStream ForLoop SetCurrentStream ForLoop",
    );
    assert_eq!(p.top_level[1], lp);
    let main = stream_of(p, p.top_level[0]);
    assert_eq!(p.streams[main], Stream::Captured);

    // Worker first, then the wait on main (seed 000's ordering bug).
    let body = body(p, lp);
    assert_kinds(p, body, "SetCurrentStream Synchronize LaunchKernel");
    assert_worker(p, body[0], i);
    assert_eq!(stream_of(p, body[1]), main);

    // Back to main first, then the join loop over every worker.
    assert_eq!(stream_of(p, p.top_level[2]), main);
    let join = p.top_level[3];
    let (j, start, stop) = loop_parts(p, join);
    assert_ne!(j, i, "every loop has its own index");
    assert_eq!((start, stop), (loop_parts(p, lp).1, loop_parts(p, lp).2));
    assert_kinds(p, body_of(p, join), "Synchronize");
    assert_worker(p, body_of(p, join)[0], j);

    assert_idempotent(&pass, &mut b.p);
}

fn body_of(p: &HostProgram, lp: StmtId) -> &[StmtId] {
    body(p, lp)
}

#[test]
fn assign_streams_separate_loop_shape() {
    let (mut b, lp, i) = bare_loop();
    let pass = AssignStreams::new(SyncVariant::SeparateLoop);
    assert_eq!(run(&pass, &mut b.p), Changed::Yes);
    let p = &b.p;
    assert_kinds(
        p,
        &p.top_level,
        "GetCurrentStream ForLoop ForLoop SetCurrentStream ForLoop",
    );
    let main = stream_of(p, p.top_level[0]);
    let entry = p.top_level[1];
    let (e, _, _) = loop_parts(p, entry);
    assert_kinds(p, body(p, entry), "SetCurrentStream Synchronize");
    assert_worker(p, body(p, entry)[0], e);
    assert_eq!(stream_of(p, body(p, entry)[1]), main);

    assert_eq!(p.top_level[2], lp);
    assert_kinds(p, body(p, lp), "SetCurrentStream LaunchKernel");
    assert_worker(p, body(p, lp)[0], i);

    assert_eq!(stream_of(p, p.top_level[3]), main);
    let (j, _, _) = loop_parts(p, p.top_level[4]);
    assert_worker(p, body(p, p.top_level[4])[0], j);

    assert_idempotent(&pass, &mut b.p);
    // The other variant sees a managed program as well.
    assert_idempotent(&AssignStreams::default(), &mut b.p);
}

#[test]
fn assign_streams_manages_each_loop_and_skips_empty_ones() {
    let mut b = B::default();
    let x = b.input(&[3]);
    let y = b.tensor(&[3]);
    let z = b.output(&[3]);
    let three = b.cst(3);
    let k1 = b.launch(&[x], &[y]);
    let i1 = b.index();
    let l1 = b.for_loop(i1, three, vec![k1]);
    let between = b.launch(&[y], &[y]);
    let k2 = b.launch(&[y], &[z]);
    let i2 = b.index();
    let l2 = b.for_loop(i2, three, vec![k2]);
    let i3 = b.index();
    let empty = b.for_loop(i3, three, vec![]);
    for s in [l1, between, l2, empty] {
        b.top(s);
    }
    assert_eq!(run(&AssignStreams::default(), &mut b.p), Changed::Yes);
    let p = &b.p;
    assert_kinds(p, &p.top_level, "GetCurrentStream ForLoop SetCurrentStream ForLoop LaunchKernel GetCurrentStream ForLoop SetCurrentStream ForLoop ForLoop");
    assert!(body(p, empty).is_empty());
    // One `numberOfStreams` scalar for the whole program.
    let named = p
        .scalars
        .values()
        .filter(|s| **s == HostScalar::Value(Scalar::named("numberOfStreams")))
        .count();
    assert_eq!(named, 1);
    assert_idempotent(&AssignStreams::default(), &mut b.p);
}

/// A host pass takes a host program by its type; a pipeline that gives it a fusion is
/// refused when it is parsed.
#[test]
fn host_passes_before_lowering_are_refused_by_the_pipeline() {
    let registry = weave_passes::Registry::standard();
    for pass in ["assign-streams", "allocate-and-deallocate"] {
        let err = weave_passes::Pipeline::parse(&format!("propagate-shardings,{pass}"), &registry)
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("`{pass}` runs on a host program, but `propagate-shardings` before it leaves a fusion")),
            "{err}"
        );
    }
}

/// Row-parallel linear + allreduce, as lowered (reference §3.1): per chunk `i` of `S = 3`,
/// `xs = x[i]`, `t = xs @ w` (a fresh per-chunk buffer), `os = out[i]`, `Allreduce(t -> os)`,
/// `Wait`.
struct RowParallel {
    b: B,
    lp: StmtId,
    t: HostTensorId,
    out: HostTensorId,
}

fn row_parallel() -> RowParallel {
    let mut b = B::default();
    let x = b.input(&[6, 4]);
    let w = b.input(&[4, 2]);
    let out = b.output(&[6, 2]);
    let xs = b.tensor(&[2, 4]);
    let t = b.tensor(&[2, 2]);
    let os = b.tensor(&[2, 2]);
    let i = b.index();
    let s = b.cst(3);
    let shard_x = b.shard(x, s, i, xs);
    let mm = b.matmul(xs, w, t);
    let shard_o = b.shard(out, s, i, os);
    let comm = b.allreduce(t, os);
    let wait = b.wait(comm);
    let lp = b.for_loop(i, s, vec![shard_x, mm, shard_o, comm, wait]);
    b.top(lp);
    RowParallel { b, lp, t, out }
}

fn position(p: &HostProgram, scope: &[StmtId], want: &Stmt) -> usize {
    scope
        .iter()
        .position(|&s| p.stmts[s] == *want)
        .unwrap_or_else(|| panic!("{want:?} not in scope"))
}

#[test]
fn deallocate_goes_after_the_wait() {
    let RowParallel { mut b, lp, t, out } = row_parallel();
    let pass = AllocateAndDeallocate;
    assert_eq!(pass.name(), "allocate-and-deallocate");
    assert_eq!(run(&pass, &mut b.p), Changed::Yes);
    let p = &b.p;
    // The output is allocated once, before the loop, and never freed.
    assert_kinds(p, &p.top_level, "Allocate ForLoop");
    assert_eq!(
        p.stmts[p.top_level[0]],
        Stmt::Allocate {
            tensor: out,
            zero_init: false
        }
    );
    // The per-chunk result lives inside one iteration: allocated right before its write,
    // freed after the Wait, not between the Communication and its Wait.
    assert_kinds(
        p,
        body(p, lp),
        "ShardByStream Allocate Matmul ShardByStream Communication Wait Deallocate",
    );
    assert_eq!(p.stmts[body(p, lp)[6]], Stmt::Deallocate { tensor: t });
    assert_eq!(count(p, "Deallocate"), 1);
    assert_idempotent(&pass, &mut b.p);
}

#[test]
fn full_pipeline_on_row_parallel_linear() {
    let RowParallel { mut b, lp, t, .. } = row_parallel();
    assert_eq!(run(&AssignStreams::default(), &mut b.p), Changed::Yes);
    assert_eq!(run(&AllocateAndDeallocate, &mut b.p), Changed::Yes);
    let p = &b.p;
    assert_kinds(
        p,
        &p.top_level,
        "GetCurrentStream Allocate ForLoop SetCurrentStream ForLoop",
    );
    let body = body(p, lp);
    assert_kinds(p, body, "SetCurrentStream Synchronize ShardByStream Allocate Matmul ShardByStream Communication Wait Deallocate");
    let wait = position(p, body, &Stmt::Wait { comm: body[6] });
    let dealloc = position(p, body, &Stmt::Deallocate { tensor: t });
    assert_eq!(dealloc, wait + 1);
    assert_idempotent(&AssignStreams::default(), &mut b.p);
    assert_idempotent(&AllocateAndDeallocate, &mut b.p);
}

/// Reference §10.10 (InsertDeallocations): `in -> K1 -> t1 -> K2 -> t2 -> K3 -> out`, three
/// chained segments with two intermediates between them.
#[test]
fn chained_intermediates_get_two_deallocations() {
    let mut b = B::default();
    let x = b.input(&[8, 8]);
    let t1 = b.tensor(&[8, 8]);
    let t2 = b.tensor(&[8, 8]);
    let out = b.output(&[8, 8]);
    for (i, o) in [(x, t1), (t1, t2), (t2, out)] {
        let k = b.launch(&[i], &[o]);
        b.top(k);
    }
    assert_eq!(run(&AllocateAndDeallocate, &mut b.p), Changed::Yes);
    let p = &b.p;
    assert_eq!(count(p, "Deallocate"), 2);
    assert_eq!(count(p, "Allocate"), 3);
    assert_kinds(
        p,
        &p.top_level,
        "Allocate LaunchKernel Allocate LaunchKernel Deallocate Allocate LaunchKernel Deallocate",
    );
    assert_eq!(p.stmts[p.top_level[4]], Stmt::Deallocate { tensor: t1 });
    assert_eq!(p.stmts[p.top_level[7]], Stmt::Deallocate { tensor: t2 });
    // At most three buffers live at once, counting the caller's input (the reference's
    // 3 x 512 B peak): `t1` is freed before `out` is allocated.
    let mut live = p.inputs.len();
    let mut peak = 0usize;
    for s in all_stmts(p) {
        match s {
            Stmt::Allocate { .. } => live += 1,
            Stmt::Deallocate { .. } => live -= 1,
            _ => {}
        }
        peak = peak.max(live);
    }
    assert_eq!(peak, 3);
    assert_idempotent(&AllocateAndDeallocate, &mut b.p);
}

/// Reference §10.11 (ExcludeOutputsFromDeallocations): outputs `t0 = in + in` and
/// `matmul(t0, t0)`: both allocated, neither freed.
#[test]
fn outputs_are_never_deallocated() {
    let mut b = B::default();
    let x = b.input(&[4, 4]);
    let t0 = b.output(&[4, 4]);
    let m = b.output(&[4, 4]);
    let k = b.launch(&[x, x], &[t0]);
    let mm = b.matmul(t0, t0, m);
    b.top(k);
    b.top(mm);
    assert_eq!(run(&AllocateAndDeallocate, &mut b.p), Changed::Yes);
    let p = &b.p;
    assert_eq!(count(p, "Deallocate"), 0);
    assert_kinds(p, &p.top_level, "Allocate LaunchKernel Allocate Matmul");
    assert_idempotent(&AllocateAndDeallocate, &mut b.p);
}

/// A loop-local stream-parallel intermediate: `t [S * 4, 2]` with `S = 8`, written chunk by
/// chunk through one view and read (by an allreduce) through another, only inside the loop.
struct LoopLocal {
    b: B,
    lp: StmtId,
    i: ScalarId,
    t: HostTensorId,
    views: [StmtId; 2],
}

fn loop_local() -> LoopLocal {
    let mut b = B::default();
    let a = b.input(&[32, 4]);
    let w = b.input(&[4, 2]);
    let out = b.output(&[32, 2]);
    let t = b.tensor(&[32, 2]);
    let (as_, ts, ts2, os) = (
        b.tensor(&[4, 4]),
        b.tensor(&[4, 2]),
        b.tensor(&[4, 2]),
        b.tensor(&[4, 2]),
    );
    let i = b.index();
    let s = b.cst(8);
    let v_a = b.shard(a, s, i, as_);
    let v_t = b.shard(t, s, i, ts);
    let mm = b.matmul(as_, w, ts);
    let v_t2 = b.shard(t, s, i, ts2);
    let v_o = b.shard(out, s, i, os);
    let comm = b.allreduce(ts2, os);
    let wait = b.wait(comm);
    let lp = b.for_loop(i, s, vec![v_a, v_t, mm, v_t2, v_o, comm, wait]);
    b.top(lp);
    LoopLocal {
        b,
        lp,
        i,
        t,
        views: [v_t, v_t2],
    }
}

fn assert_bounded(p: &HostProgram, l: &LoopLocal) {
    // 8 chunks of 4 rows, bounded to min(8, numberOfStreams) slots.
    let size = p.tensors[l.t].sizes[0];
    assert_eq!(eval(p, size, 4), 16);
    assert_eq!(eval(p, size, 2), 8);
    assert_eq!(eval(p, size, 8), 32);
    assert_eq!(eval(p, size, 16), 32, "never more than the full extent");
    assert_eq!(eval(p, p.tensors[l.t].sizes[1], 4), 2);
    for v in l.views {
        let Stmt::ShardByStream {
            chunks,
            index,
            holds,
            ..
        } = p.stmts[v]
        else {
            panic!()
        };
        assert_eq!(eval(p, chunks, 4), 4);
        assert_eq!(eval(p, chunks, 16), 8);
        assert!(is_slot_of(p, index, l.i), "slot i % numberOfStreams");
        // Each view holds chunk i of the 32 rows cut into 8, whatever the slot count.
        let h = holds.expect("a slot view says which chunk it holds");
        assert_eq!(h.chunk, l.i);
        assert_eq!(eval(p, h.chunks, 4), 8);
        assert_eq!(eval(p, h.extent, 4), 32);
    }
}

#[test]
fn loop_local_intermediate_gets_number_of_streams_slots() {
    let mut l = loop_local();
    assert_eq!(run(&AssignStreams::default(), &mut l.b.p), Changed::Yes);
    assert_eq!(run(&AllocateAndDeallocate, &mut l.b.p), Changed::Yes);
    let p = &l.b.p;
    assert_bounded(p, &l);
    // Allocated once before the loop (with the output), freed after the join.
    assert_kinds(
        p,
        &p.top_level,
        "GetCurrentStream Allocate Allocate ForLoop SetCurrentStream ForLoop Deallocate",
    );
    assert_eq!(p.stmts[p.top_level[6]], Stmt::Deallocate { tensor: l.t });
    assert_eq!(p.top_level[3], l.lp);
    assert_eq!(count(p, "Allocate"), 2);
    assert_idempotent(&AllocateAndDeallocate, &mut l.b.p);
    assert_bounded(&l.b.p, &l);
}

#[test]
fn loop_local_intermediate_is_bounded_on_a_single_stream_too() {
    let mut l = loop_local();
    assert_eq!(run(&AllocateAndDeallocate, &mut l.b.p), Changed::Yes);
    let p = &l.b.p;
    assert_bounded(p, &l);
    assert_kinds(p, &p.top_level, "Allocate Allocate ForLoop Deallocate");
}

#[test]
fn slots_need_iterations_n_apart_on_one_stream() {
    // `SetCurrentStream(Stream i)` (nvFuser Path A keys streams by the raw index): iterations
    // i and i + n run on different streams, so a shared slot would race. Full size instead.
    let mut l = loop_local();
    let p = &mut l.b.p;
    let raw = p.streams.insert(Stream::Indexed(l.i));
    let set = p.stmts.insert(Stmt::SetCurrentStream { stream: raw });
    if let Stmt::ForLoop { body, .. } = &mut p.stmts[l.lp] {
        body.insert(0, set);
    }
    let before = p.tensors[l.t].clone();
    assert_eq!(run(&AllocateAndDeallocate, p), Changed::Yes);
    assert_eq!(p.tensors[l.t], before);
    assert_kinds(p, &p.top_level, "Allocate Allocate ForLoop Deallocate");
}

#[test]
fn a_buffer_carried_across_iterations_is_hoisted() {
    // `acc` is read before it is written in each iteration: it must outlive the iteration.
    let mut b = B::default();
    let x = b.input(&[4]);
    let out = b.output(&[4]);
    let acc = b.tensor(&[4]);
    let i = b.index();
    let s = b.cst(3);
    let step = b.launch(&[acc, x], &[acc]);
    let lp = b.for_loop(i, s, vec![step]);
    let fin = b.launch(&[acc], &[out]);
    b.top(lp);
    b.top(fin);
    assert_eq!(run(&AllocateAndDeallocate, &mut b.p), Changed::Yes);
    let p = &b.p;
    assert_kinds(
        p,
        &p.top_level,
        "Allocate ForLoop Allocate LaunchKernel Deallocate",
    );
    assert_eq!(
        p.stmts[p.top_level[0]],
        Stmt::Allocate {
            tensor: acc,
            zero_init: false
        }
    );
    assert_kinds(p, body(p, lp), "LaunchKernel");
}

#[test]
fn coalesced_receive_is_freed_after_the_group_wait() {
    let mut b = B::default();
    let x = b.input(&[4]);
    let out = b.output(&[4]);
    let buf = b.tensor(&[4]);
    let peer = b.cst(1);
    let start = b.stmt(Stmt::StartCoalescing);
    let recv = b.stmt(Stmt::P2PCommunication(P2PCommunication {
        direction: P2PDirection::Recv,
        peer,
        buffer: buf,
    }));
    let send = b.stmt(Stmt::P2PCommunication(P2PCommunication {
        direction: P2PDirection::Send,
        peer,
        buffer: x,
    }));
    let end = b.stmt(Stmt::EndCoalescing);
    let wait = b.wait(end);
    let use_ = b.launch(&[x], &[out]);
    for s in [start, recv, send, end, wait, use_] {
        b.top(s);
    }
    assert_eq!(run(&AllocateAndDeallocate, &mut b.p), Changed::Yes);
    let p = &b.p;
    assert_kinds(p, &p.top_level, "Allocate StartCoalescing P2PCommunication P2PCommunication EndCoalescing Wait Deallocate Allocate LaunchKernel");
    assert_eq!(p.stmts[p.top_level[6]], Stmt::Deallocate { tensor: buf });
}
