//! The host program printer, in the seeds' style and parseable back (docs/host-ir-format.md).
//!
//! ```text
//! %HostIrContainer { (T0_g_bf16[t, 4], T1_g_bf16[2, 4]) -> (T2_g_bf16[t, 2]) :
//!   T2 = ALLOCATE(mem_type=global, zero_init=false)
//!   Stream 0 = GetCurrentStream()
//!   FOR i0 from 0 to 3:
//!     SetCurrentStream(Stream i0)
//!     ...
//! } // %HostIrContainer
//! ```
//!
//! Names come from the printer, never from arena keys, and are numbered in the order the
//! printed text first mentions them: tensors `T0, T1, …` (so the inputs first, then the
//! outputs, then tensors in statement order, left to right within a line), loop indices
//! `i0, i1, …`, captured streams `Stream 0, Stream 1, …`, kernels `K0, K1, …`. Statements are
//! numbered by their position in the pre-order walk ([`HostProgram::walk`]), and the
//! communication statements print that number (`Communication 9`, `EndCoalescing 14`), so
//! that a `Wait` can name them.
//!
//! A tensor's type is written where the text first mentions it (`T4_g_bf16[2, 3]`, usually
//! at its `ALLOCATE` or `ShardByStream`), and it is bare (`T4`) everywhere after.
//!
//! After the container come the program's [`Signature`](crate::Signature) (`Signature:` and
//! its indented entries), its definition (`Definition: fusion …`, the global fusion the
//! program computes) and the kernel blocks (`K0: fusion …`).
//!
//! The printer never panics: an id that is not in its arena prints as `T?`, `?`, `Stream ?`,
//! `K?` or `Statement ?`, which the parser rejects and the verifier explains.

use std::fmt;

use slotmap::{Key, SecondaryMap};
use weave_ir::Scalar;

use crate::ids::{HostTensorId, KernelId, ScalarId, StmtId, StreamId};
use crate::syntax::{
    Communication, HostProgram, HostScalar, P2PCommunication, P2PDirection, Stmt, Stream,
};

/// Prints `p` in the host text format; `print(&parse(&print(p))?)` equals `print(p)`.
pub fn print(p: &HostProgram) -> String {
    print_with_names(p).0
}

impl fmt::Display for HostProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&print(self))
    }
}

/// Deeper scalar expressions print as `?`: only a cyclic (malformed) scalar gets there.
const MAX_SCALAR_DEPTH: usize = 256;

/// The names the printer gives a program's entities, for messages that must agree with the
/// printed program (the verifier's, a pass's).
///
/// [`Names::of`] names everything the printed program mentions, exactly as [`print()`] does;
/// an entity the program never mentions gets the next free number when first asked for.
#[derive(Clone, Debug, Default)]
pub struct Names {
    tensors: Numbers<HostTensorId>,
    declared: SecondaryMap<HostTensorId, ()>,
    indices: Numbers<ScalarId>,
    streams: Numbers<StreamId>,
    kernels: Numbers<KernelId>,
    kernel_order: Vec<KernelId>,
    stmts: Numbers<StmtId>,
}

/// The number each id got when first met. A malformed program may name an id that no
/// `SecondaryMap` can hold (the null id, placed by hand, or a stale id older than what its
/// slot now holds); such an id is kept aside, so that it too keeps the number it got first.
#[derive(Clone, Debug)]
struct Numbers<K: Key> {
    by_key: SecondaryMap<K, usize>,
    others: Vec<(K, usize)>,
}

impl<K: Key> Default for Numbers<K> {
    fn default() -> Self {
        Numbers {
            by_key: SecondaryMap::new(),
            others: Vec::new(),
        }
    }
}

impl<K: Key> Numbers<K> {
    /// How many ids have a number.
    fn len(&self) -> usize {
        self.by_key.len() + self.others.len()
    }

    fn get(&self, k: K) -> Option<usize> {
        self.by_key.get(k).copied().or_else(|| {
            self.others
                .iter()
                .find(|(other, _)| *other == k)
                .map(|(_, n)| *n)
        })
    }

    /// The number of `k`, giving it `n` if it has none yet.
    fn get_or_insert(&mut self, k: K, n: usize) -> usize {
        if let Some(old) = self.get(k) {
            return old;
        }
        match self.by_key.entry(k) {
            Some(entry) => *entry.or_insert(n),
            None => {
                self.others.push((k, n));
                n
            }
        }
    }

    /// The number of `k`, giving it the next free one if it has none yet.
    fn number(&mut self, k: K) -> usize {
        let next = self.len();
        self.get_or_insert(k, next)
    }
}

impl Names {
    /// The names of every entity printed by `print(p)`.
    pub fn of(p: &HostProgram) -> Names {
        print_with_names(p).1
    }

    fn numbered_statements(p: &HostProgram) -> Names {
        let mut n = Names::default();
        for (k, w) in p.walk().enumerate() {
            n.stmts.get_or_insert(w.stmt, k);
        }
        n
    }

    /// `T4`.
    pub fn tensor(&mut self, t: HostTensorId) -> String {
        format!("T{}", self.tensor_number(t))
    }

    fn tensor_number(&mut self, t: HostTensorId) -> usize {
        self.tensors.number(t)
    }

    /// `T4`, or `T4_g_bf16[( ceilDiv(t, 3) ), 2]` when `declare` and this is the first
    /// declaring mention.
    fn tensor_text(&mut self, p: &HostProgram, t: HostTensorId, declare: bool) -> String {
        let name = self.tensor(t);
        match p.tensors.get(t) {
            Some(ht) if declare && self.declared.insert(t, ()).is_none() => {
                let sizes: Vec<String> = ht.sizes.iter().map(|s| self.scalar(p, *s)).collect();
                format!(
                    "{name}_{}_{}[{}]",
                    ht.memory.short(),
                    ht.dtype.name(),
                    sizes.join(", ")
                )
            }
            Some(_) => name,
            None => "T?".to_string(),
        }
    }

    fn tensor_list(&mut self, p: &HostProgram, ts: &[HostTensorId], declare: bool) -> String {
        let v: Vec<String> = ts
            .iter()
            .map(|t| self.tensor_text(p, *t, declare))
            .collect();
        v.join(", ")
    }

    /// A scalar in seed style: `3`, `t`, `i0`, `( i0 % numberOfStreams )`,
    /// `( ceilDiv(t, 3) )`.
    pub fn scalar(&mut self, p: &HostProgram, s: ScalarId) -> String {
        self.scalar_at(p, s, 0)
    }

    fn scalar_at(&mut self, p: &HostProgram, s: ScalarId, depth: usize) -> String {
        if depth > MAX_SCALAR_DEPTH {
            return "?".to_string();
        }
        match p.scalars.get(s) {
            None => "?".to_string(),
            Some(HostScalar::Value(v)) => v.to_string(),
            Some(HostScalar::LoopIndex) => format!("i{}", self.indices.number(s)),
            Some(HostScalar::Binary(op, a, b)) => {
                let a = self.scalar_at(p, *a, depth + 1);
                let b = self.scalar_at(p, *b, depth + 1);
                match op {
                    op if op.is_call() => format!("( {}({a}, {b}) )", op.symbol()),
                    op => format!("( {a} {} {b} )", op.symbol()),
                }
            }
        }
    }

    /// `Stream 0` (captured), `Stream i0`, `Stream ( i0 % numberOfStreams )`, and
    /// `Stream ( 2 )` for a constant index, which would otherwise read as a captured stream.
    pub fn stream(&mut self, p: &HostProgram, s: StreamId) -> String {
        match p.streams.get(s) {
            None => "Stream ?".to_string(),
            Some(Stream::Captured) => format!("Stream {}", self.streams.number(s)),
            Some(Stream::Indexed(i)) => {
                let text = self.scalar(p, *i);
                if matches!(p.scalars.get(*i), Some(HostScalar::Value(Scalar::Const(_)))) {
                    format!("Stream ( {text} )")
                } else {
                    format!("Stream {text}")
                }
            }
        }
    }

    /// `K0`.
    pub fn kernel(&mut self, p: &HostProgram, k: KernelId) -> String {
        if !p.kernels.contains_key(k) {
            return "K?".to_string();
        }
        let n = self.kernel_order.len();
        let n = self.kernels.get_or_insert(k, n);
        if n == self.kernel_order.len() {
            self.kernel_order.push(k);
        }
        format!("K{n}")
    }

    /// The statement's number: its position in the pre-order walk.
    pub fn stmt_number(&self, s: StmtId) -> Option<usize> {
        self.stmts.get(s)
    }

    /// How a `Wait` names `s`: `Communication 9`, `P2PCommunication 12`, `EndCoalescing 14`,
    /// or `Statement 3` for any other statement.
    pub fn stmt_ref(&self, p: &HostProgram, s: StmtId) -> String {
        let kind = match p.stmts.get(s) {
            Some(Stmt::Communication(_)) => "Communication",
            Some(Stmt::P2PCommunication(_)) => "P2PCommunication",
            Some(Stmt::EndCoalescing) => "EndCoalescing",
            _ => "Statement",
        };
        match self.stmt_number(s) {
            Some(n) => format!("{kind} {n}"),
            None => format!("{kind} ?"),
        }
    }

    /// `FOR i0`: how a message names the loop `l`.
    pub fn loop_name(&mut self, p: &HostProgram, l: StmtId) -> String {
        match p.stmts.get(l) {
            Some(Stmt::ForLoop { index, .. }) => format!("FOR {}", self.scalar(p, *index)),
            _ => self.stmt_ref(p, l),
        }
    }

    /// The statement as one printed line with bare tensor names (a loop prints its header
    /// only): what messages quote.
    pub fn stmt(&mut self, p: &HostProgram, s: StmtId) -> String {
        self.stmt_line(p, s, false)
    }

    /// The statement's line; `declare` writes each tensor's type at its first mention. The
    /// statement's kind picks the function that prints it.
    fn stmt_line(&mut self, p: &HostProgram, s: StmtId, declare: bool) -> String {
        let Some(stmt) = p.stmts.get(s) else {
            return "<statement not in the program>".to_string();
        };
        let number = match self.stmt_number(s) {
            Some(n) => n.to_string(),
            None => "?".to_string(),
        };
        match stmt {
            Stmt::Allocate { tensor, zero_init } => self.allocate(p, *tensor, *zero_init, declare),
            Stmt::Deallocate { tensor } => {
                format!("Deallocate({})", self.tensor_text(p, *tensor, declare))
            }
            Stmt::ForLoop {
                index, start, stop, ..
            } => self.for_header(p, *index, *start, *stop),
            Stmt::GetCurrentStream { out } => {
                format!("{} = GetCurrentStream()", self.stream(p, *out))
            }
            Stmt::SetCurrentStream { stream } => {
                format!("SetCurrentStream({})", self.stream(p, *stream))
            }
            Stmt::Synchronize { stream } => format!("Synchronize({})", self.stream(p, *stream)),
            Stmt::ShardByStream { .. } => self.shard_by_stream(p, stmt, declare),
            Stmt::LaunchKernel {
                kernel,
                inputs,
                outputs,
            } => self.launch_kernel(p, *kernel, inputs, outputs, declare),
            Stmt::Matmul { .. } => self.matmul(p, stmt, declare),
            Stmt::Linear { .. } => self.linear(p, stmt, declare),
            Stmt::Communication(c) => self.communication(p, c, &number, declare),
            Stmt::P2PCommunication(c) => self.p2p(p, c, &number, declare),
            Stmt::StartCoalescing => "StartCoalescing".to_string(),
            Stmt::EndCoalescing => format!("EndCoalescing {number}"),
            Stmt::Wait { comm } => format!("Wait({})", self.stmt_ref(p, *comm)),
        }
    }

    /// `T2 = ALLOCATE(mem_type=global, zero_init=false)`.
    fn allocate(
        &mut self,
        p: &HostProgram,
        tensor: HostTensorId,
        zero_init: bool,
        declare: bool,
    ) -> String {
        let t = self.tensor_text(p, tensor, declare);
        let mem = p.tensors.get(tensor).map_or("global", |t| t.memory.name());
        format!("{t} = ALLOCATE(mem_type={mem}, zero_init={zero_init})")
    }

    /// `FOR i0 from 0 to 3:`.
    fn for_header(
        &mut self,
        p: &HostProgram,
        index: ScalarId,
        start: ScalarId,
        stop: ScalarId,
    ) -> String {
        let i = self.scalar(p, index);
        let a = self.scalar(p, start);
        let b = self.scalar(p, stop);
        format!("FOR {i} from {a} to {b}:")
    }

    /// `T3 = ShardByStream(T2, axis=0, chunks=3, stream_index=i0[, holds=(..)])`.
    fn shard_by_stream(&mut self, p: &HostProgram, stmt: &Stmt, declare: bool) -> String {
        let Stmt::ShardByStream {
            input,
            axis,
            chunks,
            index,
            holds,
            output,
        } = stmt
        else {
            return String::new();
        };
        let o = self.tensor_text(p, *output, declare);
        let i = self.tensor_text(p, *input, declare);
        let c = self.scalar(p, *chunks);
        let x = self.scalar(p, *index);
        let h = match holds {
            Some(h) => format!(
                ", holds=(chunk={}, chunks={}, extent={})",
                self.scalar(p, h.chunk),
                self.scalar(p, h.chunks),
                self.scalar(p, h.extent)
            ),
            None => String::new(),
        };
        format!("{o} = ShardByStream({i}, axis={axis}, chunks={c}, stream_index={x}{h})")
    }

    /// `LaunchKernel(kernel=K0, inputs=(T2), outputs=(T3))`.
    fn launch_kernel(
        &mut self,
        p: &HostProgram,
        kernel: KernelId,
        inputs: &[HostTensorId],
        outputs: &[HostTensorId],
        declare: bool,
    ) -> String {
        let k = self.kernel(p, kernel);
        let i = self.tensor_list(p, inputs, declare);
        let o = self.tensor_list(p, outputs, declare);
        format!("LaunchKernel(kernel={k}, inputs=({i}), outputs=({o}))")
    }

    /// `T4 = matmul(T2, T3)`, or `T4 += matmul(T2, T3)` when it accumulates.
    fn matmul(&mut self, p: &HostProgram, stmt: &Stmt, declare: bool) -> String {
        let Stmt::Matmul {
            a,
            b,
            out,
            accumulate,
        } = stmt
        else {
            return String::new();
        };
        let o = self.tensor_text(p, *out, declare);
        let a = self.tensor_text(p, *a, declare);
        let b = self.tensor_text(p, *b, declare);
        let op = if *accumulate { "+=" } else { "=" };
        format!("{o} {op} matmul({a}, {b})")
    }

    /// `T5 = linear(T2, T3[, T4])`, or `T5 += linear(T2, T3)` when it accumulates.
    fn linear(&mut self, p: &HostProgram, stmt: &Stmt, declare: bool) -> String {
        let Stmt::Linear {
            input,
            weight,
            bias,
            out,
            accumulate,
        } = stmt
        else {
            return String::new();
        };
        let o = self.tensor_text(p, *out, declare);
        let mut args = vec![
            self.tensor_text(p, *input, declare),
            self.tensor_text(p, *weight, declare),
        ];
        if let Some(b) = bias {
            args.push(self.tensor_text(p, *b, declare));
        }
        let op = if *accumulate { "+=" } else { "=" };
        format!("{o} {op} linear({})", args.join(", "))
    }

    /// `Communication 9 (type=Allgather, team=(0 1), input=T2, output=T3, backend=NCCL)`.
    fn communication(
        &mut self,
        p: &HostProgram,
        c: &Communication,
        number: &str,
        declare: bool,
    ) -> String {
        let teams: Vec<String> = c
            .teams
            .iter()
            .map(|t| {
                let devices: Vec<String> = t.iter().map(i64::to_string).collect();
                devices.join(" ")
            })
            .collect();
        let mut fields = vec![
            format!("type={}", c.kind.name()),
            format!("team=({})", teams.join(" | ")),
        ];
        if let Some(r) = c.root {
            fields.push(format!("root={}", self.scalar(p, r)));
        }
        fields.push(format!("input={}", self.tensor_text(p, c.input, declare)));
        fields.push(format!("output={}", self.tensor_text(p, c.output, declare)));
        if let Some(op) = c.red_op {
            fields.push(format!("red_op={}", op.name()));
        }
        fields.push("backend=NCCL".to_string());
        format!("Communication {number} ({})", fields.join(", "))
    }

    /// `P2PCommunication 12 (type=send, buffer=T2, peer=1, backend=NCCL)`.
    fn p2p(
        &mut self,
        p: &HostProgram,
        c: &P2PCommunication,
        number: &str,
        declare: bool,
    ) -> String {
        let dir = match c.direction {
            P2PDirection::Send => "send",
            P2PDirection::Recv => "recv",
        };
        let b = self.tensor_text(p, c.buffer, declare);
        let peer = self.scalar(p, c.peer);
        format!("P2PCommunication {number} (type={dir}, buffer={b}, peer={peer}, backend=NCCL)")
    }
}

fn print_with_names(p: &HostProgram) -> (String, Names) {
    let mut names = Names::numbered_statements(p);
    let mut out = String::from("%HostIrContainer { (");
    out.push_str(&names.tensor_list(p, &p.inputs, true));
    out.push_str(") -> (");
    out.push_str(&names.tensor_list(p, &p.outputs, true));
    out.push_str(") :\n");
    for w in p.walk() {
        for _ in 0..=w.loops.len() {
            out.push_str("  ");
        }
        out.push_str(&names.stmt_line(p, w.stmt, true));
        out.push('\n');
    }
    out.push_str("} // %HostIrContainer\n");
    if let Some(sig) = &p.signature {
        out.push_str(&crate::signature::print_signature(sig));
        if let Some(def) = &sig.definition {
            out.push_str("Definition: ");
            out.push_str(&weave_ir::text::print(def));
        }
    }
    for (n, k) in names.kernel_order.iter().enumerate() {
        if let Some(unit) = p.kernels.get(*k) {
            out.push_str(&format!("K{n}: "));
            out.push_str(&weave_ir::text::print(&unit.fusion));
        }
    }
    (out, names)
}

#[cfg(test)]
mod tests {
    use weave_ir::{DType, MemoryType};

    use super::*;
    use crate::builder::ScopeRef;

    #[test]
    fn names_follow_the_text_not_the_arena() {
        let mut p = HostProgram::new();
        // Created first, mentioned last.
        let late = p.new_tensor(DType::F32, vec![Scalar::c(2)], MemoryType::Local);
        let a = p.add_input(DType::F32, vec![Scalar::c(2)], MemoryType::Global);
        p.push(
            ScopeRef::Top,
            Stmt::Allocate {
                tensor: late,
                zero_init: false,
            },
        );
        p.push(ScopeRef::Top, Stmt::Deallocate { tensor: a });
        assert_eq!(
            print(&p),
            "%HostIrContainer { (T0_g_f32[2]) -> () :\n  \
             T1_l_f32[2] = ALLOCATE(mem_type=local, zero_init=false)\n  \
             Deallocate(T0)\n} // %HostIrContainer\n"
        );
        let mut names = Names::of(&p);
        assert_eq!(names.tensor(late), "T1");
        assert_eq!(
            names.stmt(&p, p.top_level[0]),
            "T1 = ALLOCATE(mem_type=local, zero_init=false)"
        );
    }

    #[test]
    fn streams_by_constant_index_do_not_read_as_captured_streams() {
        let mut p = HostProgram::new();
        let main = p.stream_captured();
        let two = p.constant(2);
        let pool = p.stream_indexed(two);
        p.push(ScopeRef::Top, Stmt::GetCurrentStream { out: main });
        p.push(ScopeRef::Top, Stmt::SetCurrentStream { stream: pool });
        p.push(ScopeRef::Top, Stmt::Synchronize { stream: main });
        let text = print(&p);
        assert!(text.contains("  Stream 0 = GetCurrentStream()\n  SetCurrentStream(Stream ( 2 ))\n  Synchronize(Stream 0)\n"), "{text}");
    }

    #[test]
    fn ids_outside_their_arenas_print_as_placeholders() {
        let mut p = HostProgram::new();
        let t = p.new_tensor(DType::F32, vec![], MemoryType::Global);
        let s = p.constant(1);
        let st = p.stream_indexed(s);
        let k = p.add_kernel(weave_ir::Fusion::default());
        let w = p.push(
            ScopeRef::Top,
            Stmt::Wait {
                comm: StmtId::default(),
            },
        );
        p.push(ScopeRef::Top, Stmt::Deallocate { tensor: t });
        p.push(ScopeRef::Top, Stmt::SetCurrentStream { stream: st });
        p.push(
            ScopeRef::Top,
            Stmt::LaunchKernel {
                kernel: k,
                inputs: vec![],
                outputs: vec![],
            },
        );
        p.tensors.remove(t);
        p.scalars.remove(s);
        p.kernels.remove(k);
        // The null id is in no arena: placed, it prints as a placeholder line, and the Wait
        // that names it names its position.
        p.top_level.push(StmtId::default());
        let text = print(&p);
        assert_eq!(
            text,
            "%HostIrContainer { () -> () :\n  Wait(Statement 4)\n  Deallocate(T?)\n  \
             SetCurrentStream(Stream ?)\n  LaunchKernel(kernel=K?, inputs=(), outputs=())\n  \
             <statement not in the program>\n} // %HostIrContainer\n"
        );
        assert_eq!(Names::of(&p).stmt_number(w), Some(0));
    }
}
