//! What each statement does, as one table: [`Stmt::effects`] says which tensors a statement
//! reads, writes, allocates, frees and views, which scalars it evaluates, which stream it
//! captures, makes current or waits for, which communication it waits for, and whether its
//! device work runs on the current stream or as a posted communication. The verifier, the
//! `allocate-and-deallocate` pass and the executor's race recording all read it, so that
//! "which buffers does a `Linear` read" has one answer; the narrower accessors below
//! ([`Stmt::reads`], [`Stmt::writes`], …) are views of it.
//!
//! These are facts about one statement in isolation. Facts that depend on the program around
//! it (the buffers of an [`Stmt::EndCoalescing`] are those of the point-to-point
//! communications of its group; a [`Stmt::Wait`] uses the buffers of the communication it
//! names) live with whoever walks the program.

use crate::ids::{HostTensorId, KernelId, ScalarId, StmtId, StreamId};
use crate::syntax::{HostProgram, HostScalar, P2PDirection, Stmt};

/// How a statement touches one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Reads the contents: operands of kernels and library calls, the input of a collective,
    /// the buffer of a send.
    Read,
    /// Writes the contents: outputs of kernels and library calls, the output of a collective,
    /// the buffer of a receive. A write into a tensor that is not bound yet binds it (library
    /// calls allocate their outputs when nothing did).
    Write,
    /// Binds the tensor to a fresh buffer ([`Stmt::Allocate`]); a zero fill, when asked for,
    /// happens on the current stream.
    Allocate,
    /// Drops the tensor's buffer ([`Stmt::Deallocate`]); the memory may be reused.
    Free,
    /// Cuts a view out of the tensor without touching its contents (the input of a
    /// [`Stmt::ShardByStream`]).
    View,
}

/// Where a statement's accesses happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Runs {
    /// Nowhere on a device: the host binds, evaluates or switches (loops, streams, views, the
    /// brackets of a coalescing group, waits, which only order).
    Host,
    /// In order on the current stream: allocations, frees, kernels and library calls.
    Stream,
    /// As an asynchronous communication posted on the current stream: ordered after that
    /// stream's earlier work, and before nothing until a [`Stmt::Wait`] names the statement.
    /// A point-to-point inside a coalescing group is posted with its group, at the
    /// [`Stmt::EndCoalescing`].
    Posted,
}

/// A stream a statement names, and what it does with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamUse {
    /// Defines the stream value as the stream current now ([`Stmt::GetCurrentStream`]).
    Captures(StreamId),
    /// Makes the stream current for the statements that follow ([`Stmt::SetCurrentStream`]).
    Sets(StreamId),
    /// Orders the current stream after the work enqueued so far on the stream
    /// ([`Stmt::Synchronize`]).
    Joins(StreamId),
}

impl StreamUse {
    /// The stream named.
    pub fn stream(self) -> StreamId {
        match self {
            StreamUse::Captures(s) | StreamUse::Sets(s) | StreamUse::Joins(s) => s,
        }
    }
}

/// Everything one statement does to the program's state, by itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Effects {
    /// The tensors it touches, in the order it touches them: the tensor it views, then its
    /// reads, then its writes (an `Allocate`'s or `Deallocate`'s one tensor). A tensor read
    /// and written (an in-place collective) is listed twice.
    pub accesses: Vec<(HostTensorId, Access)>,
    /// The view it binds: the output of a [`Stmt::ShardByStream`], aliasing the tensor it
    /// lists as [`Access::View`].
    pub view: Option<HostTensorId>,
    /// Scalars it evaluates when it runs: loop bounds, chunk count and index of a view (and
    /// of the chunk it holds), the root of a collective, the peer of a point-to-point. The
    /// index of a [`Stmt::ForLoop`] is bound, not read, and is not listed; neither are tensor
    /// sizes nor stream indices.
    pub scalars: Vec<ScalarId>,
    /// The stream it captures, makes current or waits for.
    pub stream: Option<StreamUse>,
    /// The communication whose completion it orders the current stream after
    /// ([`Stmt::Wait`]).
    pub waits_for: Option<StmtId>,
    /// Where its accesses happen.
    pub runs: Runs,
    /// The kernel it launches.
    pub kernel: Option<KernelId>,
}

impl Effects {
    /// Nothing touched, named or waited for, on the host.
    fn host() -> Effects {
        Effects {
            accesses: Vec::new(),
            view: None,
            scalars: Vec::new(),
            stream: None,
            waits_for: None,
            runs: Runs::Host,
            kernel: None,
        }
    }

    /// Reads of `reads`, then writes of `writes`, on `runs`.
    fn reading_writing(
        reads: impl IntoIterator<Item = HostTensorId>,
        writes: impl IntoIterator<Item = HostTensorId>,
        runs: Runs,
    ) -> Effects {
        let reads = reads.into_iter().map(|t| (t, Access::Read));
        let writes = writes.into_iter().map(|t| (t, Access::Write));
        Effects {
            accesses: reads.chain(writes).collect(),
            runs,
            ..Effects::host()
        }
    }

    /// The tensors touched with `access`, in order.
    pub fn with(&self, access: Access) -> impl Iterator<Item = HostTensorId> + '_ {
        self.accesses
            .iter()
            .filter(move |(_, a)| *a == access)
            .map(|(t, _)| *t)
    }

    /// The tensors whose contents it reads, in order.
    pub fn reads(&self) -> impl Iterator<Item = HostTensorId> + '_ {
        self.with(Access::Read)
    }

    /// The tensors whose contents it writes, in order.
    pub fn writes(&self) -> impl Iterator<Item = HostTensorId> + '_ {
        self.with(Access::Write)
    }

    /// The buffers whose contents it uses, reads then writes, each with whether the statement
    /// writes it (a tensor both read and written counts as written both times): what a
    /// posted communication holds until its `Wait`.
    pub fn contents(&self) -> Vec<(HostTensorId, bool)> {
        let written: Vec<HostTensorId> = self.writes().collect();
        self.reads()
            .map(|t| (t, written.contains(&t)))
            .chain(written.iter().map(|&t| (t, true)))
            .collect()
    }

    /// The first tensor touched with `access`.
    fn first(&self, access: Access) -> Option<HostTensorId> {
        self.accesses
            .iter()
            .find(|(_, a)| *a == access)
            .map(|(t, _)| *t)
    }

    /// The tensor it allocates.
    pub fn allocates(&self) -> Option<HostTensorId> {
        self.first(Access::Allocate)
    }

    /// The tensor it frees.
    pub fn frees(&self) -> Option<HostTensorId> {
        self.first(Access::Free)
    }

    /// The tensor it cuts [`Effects::view`] out of.
    pub fn viewed(&self) -> Option<HostTensorId> {
        self.first(Access::View)
    }

    /// Every tensor it names: the view it binds, then every tensor it touches (duplicates
    /// kept).
    pub fn tensors(&self) -> impl Iterator<Item = HostTensorId> + '_ {
        self.view
            .into_iter()
            .chain(self.accesses.iter().map(|(t, _)| *t))
    }
}

impl Stmt {
    /// What the statement does by itself; see [`Effects`]. The one place that lists, per
    /// statement kind, what it touches.
    pub fn effects(&self) -> Effects {
        match self {
            Stmt::Allocate { tensor, .. } => Effects {
                accesses: vec![(*tensor, Access::Allocate)],
                runs: Runs::Stream,
                ..Effects::host()
            },
            Stmt::Deallocate { tensor } => Effects {
                accesses: vec![(*tensor, Access::Free)],
                runs: Runs::Stream,
                ..Effects::host()
            },
            Stmt::ForLoop { start, stop, .. } => Effects {
                scalars: vec![*start, *stop],
                ..Effects::host()
            },
            Stmt::GetCurrentStream { out } => Effects {
                stream: Some(StreamUse::Captures(*out)),
                ..Effects::host()
            },
            Stmt::SetCurrentStream { stream } => Effects {
                stream: Some(StreamUse::Sets(*stream)),
                ..Effects::host()
            },
            Stmt::Synchronize { stream } => Effects {
                stream: Some(StreamUse::Joins(*stream)),
                ..Effects::host()
            },
            Stmt::ShardByStream {
                input,
                chunks,
                index,
                holds,
                output,
                ..
            } => {
                let mut scalars = vec![*chunks, *index];
                if let Some(h) = holds {
                    scalars.extend([h.chunk, h.chunks, h.extent]);
                }
                Effects {
                    accesses: vec![(*input, Access::View)],
                    view: Some(*output),
                    scalars,
                    ..Effects::host()
                }
            }
            Stmt::LaunchKernel {
                kernel,
                inputs,
                outputs,
            } => Effects {
                kernel: Some(*kernel),
                ..Effects::reading_writing(
                    inputs.iter().copied(),
                    outputs.iter().copied(),
                    Runs::Stream,
                )
            },
            Stmt::Matmul {
                a,
                b,
                out,
                accumulate,
            } => {
                // An accumulating GEMM reads the partial sum it adds to.
                let acc = accumulate.then_some(*out);
                Effects::reading_writing([*a, *b].into_iter().chain(acc), [*out], Runs::Stream)
            }
            Stmt::Linear {
                input,
                weight,
                bias,
                out,
                accumulate,
            } => {
                // An accumulating GEMM reads the partial sum it adds to.
                let acc = accumulate.then_some(*out);
                Effects::reading_writing(
                    [*input, *weight].into_iter().chain(*bias).chain(acc),
                    [*out],
                    Runs::Stream,
                )
            }
            Stmt::Communication(c) => Effects {
                scalars: c.root.into_iter().collect(),
                ..Effects::reading_writing([c.input], [c.output], Runs::Posted)
            },
            Stmt::P2PCommunication(c) => {
                let (reads, writes) = match c.direction {
                    P2PDirection::Send => (Some(c.buffer), None),
                    P2PDirection::Recv => (None, Some(c.buffer)),
                };
                Effects {
                    scalars: vec![c.peer],
                    ..Effects::reading_writing(reads, writes, Runs::Posted)
                }
            }
            Stmt::StartCoalescing => Effects::host(),
            Stmt::EndCoalescing => Effects {
                runs: Runs::Posted,
                ..Effects::host()
            },
            Stmt::Wait { comm } => Effects {
                waits_for: Some(*comm),
                ..Effects::host()
            },
        }
    }

    /// The node's name as the format spells it (`Allocate`, `ForLoop`, `Communication`, ...).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Stmt::Allocate { .. } => "Allocate",
            Stmt::Deallocate { .. } => "Deallocate",
            Stmt::ForLoop { .. } => "ForLoop",
            Stmt::GetCurrentStream { .. } => "GetCurrentStream",
            Stmt::SetCurrentStream { .. } => "SetCurrentStream",
            Stmt::Synchronize { .. } => "Synchronize",
            Stmt::ShardByStream { .. } => "ShardByStream",
            Stmt::LaunchKernel { .. } => "LaunchKernel",
            Stmt::Matmul { .. } => "Matmul",
            Stmt::Linear { .. } => "Linear",
            Stmt::Communication(_) => "Communication",
            Stmt::P2PCommunication(_) => "P2PCommunication",
            Stmt::StartCoalescing => "StartCoalescing",
            Stmt::EndCoalescing => "EndCoalescing",
            Stmt::Wait { .. } => "Wait",
        }
    }

    /// Tensors whose contents the statement reads ([`Access::Read`] of [`Stmt::effects`]). A
    /// [`Stmt::ShardByStream`] input is not read (the view aliases it); a [`Stmt::Wait`]
    /// reads nothing by itself (the verifier counts it as a use of its communication's
    /// buffers).
    pub fn reads(&self) -> Vec<HostTensorId> {
        self.effects().reads().collect()
    }

    /// Tensors whose contents the statement writes ([`Access::Write`] of
    /// [`Stmt::effects`]).
    pub fn writes(&self) -> Vec<HostTensorId> {
        self.effects().writes().collect()
    }

    /// The tensor the statement binds to a (new) buffer without touching contents: the tensor
    /// of an [`Stmt::Allocate`], the view of a [`Stmt::ShardByStream`].
    pub fn binds(&self) -> Option<HostTensorId> {
        let fx = self.effects();
        fx.allocates().or(fx.view)
    }

    /// Every tensor the statement names (duplicates kept).
    pub fn tensors(&self) -> Vec<HostTensorId> {
        self.effects().tensors().collect()
    }

    /// Scalars the statement evaluates when it runs ([`Effects::scalars`]).
    pub fn scalars(&self) -> Vec<ScalarId> {
        self.effects().scalars
    }

    /// The stream the statement defines ([`Stmt::GetCurrentStream`]) or uses
    /// ([`Stmt::SetCurrentStream`], [`Stmt::Synchronize`]).
    pub fn stream(&self) -> Option<StreamId> {
        self.effects().stream.map(StreamUse::stream)
    }

    /// The kernel a [`Stmt::LaunchKernel`] runs.
    pub fn kernel(&self) -> Option<KernelId> {
        self.effects().kernel
    }

    /// The body of a [`Stmt::ForLoop`].
    pub fn body(&self) -> Option<&[StmtId]> {
        match self {
            Stmt::ForLoop { body, .. } => Some(body),
            _ => None,
        }
    }

    /// Whether the statement posts an asynchronous communication that a [`Stmt::Wait`] may
    /// name: a collective, a point-to-point (when outside a coalescing group) or the end of
    /// a coalescing group.
    pub fn is_communication(&self) -> bool {
        self.effects().runs == Runs::Posted
    }
}

impl HostProgram {
    /// The loop indices `s` depends on, each once, in first-occurrence order. Unknown ids and
    /// cycles contribute nothing.
    pub fn loop_indices_of(&self, s: ScalarId) -> Vec<ScalarId> {
        let mut out = Vec::new();
        let mut stack = vec![s];
        // A well-formed scalar is a tree; the bound only keeps a cyclic one from spinning.
        let mut budget = self.scalars.len().saturating_mul(4).saturating_add(16);
        while let Some(s) = stack.pop() {
            budget = budget.saturating_sub(1);
            if budget == 0 {
                break;
            }
            match self.scalars.get(s) {
                Some(HostScalar::LoopIndex) => {
                    if !out.contains(&s) {
                        out.push(s);
                    }
                }
                Some(HostScalar::Binary(_, a, b)) => {
                    stack.push(*b);
                    stack.push(*a);
                }
                Some(HostScalar::Value(_)) | None => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use weave_ir::{DType, Fusion, MemoryType, ReduceOp, Scalar};

    use super::*;
    use crate::syntax::{ChunkOf, Communication, CommunicationType, P2PCommunication};

    /// The effects of one statement of each kind, written out: what it reads, writes,
    /// allocates, frees and views, the scalars it evaluates, its stream, what it waits for
    /// and where it runs.
    #[test]
    fn effects_of_every_statement_kind() {
        use Access::{Allocate, Free, Read, View, Write};
        let mut p = HostProgram::new();
        let mut tensor = || p.new_tensor(DType::F32, vec![Scalar::c(4)], MemoryType::Global);
        let [a, b, c, d] = [tensor(), tensor(), tensor(), tensor()];
        let [start, stop, chunks, index, extent, root, peer] =
            [0, 1, 2, 3, 4, 5, 6].map(|v| p.constant(v));
        let i = p.loop_index();
        let s = p.stream_captured();
        let k = p.add_kernel(Fusion::new("k"));
        let posted = p.stmts.insert(Stmt::EndCoalescing);
        let none = Effects::host;
        // A posted send or receive of `buffer` with `peer`, which it reads or writes.
        let p2p = |direction, buffer, access| {
            (
                Stmt::P2PCommunication(P2PCommunication {
                    direction,
                    peer,
                    buffer,
                }),
                Effects {
                    accesses: vec![(buffer, access)],
                    scalars: vec![peer],
                    runs: Runs::Posted,
                    ..none()
                },
            )
        };
        let cases: Vec<(Stmt, Effects)> = vec![
            (
                Stmt::Allocate {
                    tensor: a,
                    zero_init: true,
                },
                Effects {
                    accesses: vec![(a, Allocate)],
                    runs: Runs::Stream,
                    ..none()
                },
            ),
            (
                Stmt::Deallocate { tensor: a },
                Effects {
                    accesses: vec![(a, Free)],
                    runs: Runs::Stream,
                    ..none()
                },
            ),
            (
                Stmt::ForLoop {
                    index: i,
                    start,
                    stop,
                    body: vec![posted],
                },
                Effects {
                    scalars: vec![start, stop],
                    ..none()
                },
            ),
            (
                Stmt::GetCurrentStream { out: s },
                Effects {
                    stream: Some(StreamUse::Captures(s)),
                    ..none()
                },
            ),
            (
                Stmt::SetCurrentStream { stream: s },
                Effects {
                    stream: Some(StreamUse::Sets(s)),
                    ..none()
                },
            ),
            (
                Stmt::Synchronize { stream: s },
                Effects {
                    stream: Some(StreamUse::Joins(s)),
                    ..none()
                },
            ),
            (
                Stmt::ShardByStream {
                    input: a,
                    axis: 0,
                    chunks,
                    index,
                    holds: Some(ChunkOf {
                        chunk: i,
                        chunks: stop,
                        extent,
                    }),
                    output: b,
                },
                Effects {
                    accesses: vec![(a, View)],
                    view: Some(b),
                    scalars: vec![chunks, index, i, stop, extent],
                    ..none()
                },
            ),
            (
                Stmt::LaunchKernel {
                    kernel: k,
                    inputs: vec![a, b],
                    outputs: vec![c, d],
                },
                Effects {
                    accesses: vec![(a, Read), (b, Read), (c, Write), (d, Write)],
                    runs: Runs::Stream,
                    kernel: Some(k),
                    ..none()
                },
            ),
            (
                Stmt::Matmul {
                    a,
                    b,
                    out: c,
                    accumulate: false,
                },
                Effects {
                    accesses: vec![(a, Read), (b, Read), (c, Write)],
                    runs: Runs::Stream,
                    ..none()
                },
            ),
            (
                Stmt::Matmul {
                    a,
                    b,
                    out: c,
                    accumulate: true,
                },
                Effects {
                    accesses: vec![(a, Read), (b, Read), (c, Read), (c, Write)],
                    runs: Runs::Stream,
                    ..none()
                },
            ),
            (
                Stmt::Linear {
                    input: a,
                    weight: b,
                    bias: Some(c),
                    out: d,
                    accumulate: false,
                },
                Effects {
                    accesses: vec![(a, Read), (b, Read), (c, Read), (d, Write)],
                    runs: Runs::Stream,
                    ..none()
                },
            ),
            (
                Stmt::Linear {
                    input: a,
                    weight: b,
                    bias: None,
                    out: d,
                    accumulate: true,
                },
                Effects {
                    accesses: vec![(a, Read), (b, Read), (d, Read), (d, Write)],
                    runs: Runs::Stream,
                    ..none()
                },
            ),
            (
                Stmt::Communication(Communication {
                    kind: CommunicationType::Reduce,
                    teams: vec![vec![0, 1]],
                    root: Some(root),
                    red_op: Some(ReduceOp::Sum),
                    input: a,
                    output: b,
                }),
                Effects {
                    accesses: vec![(a, Read), (b, Write)],
                    scalars: vec![root],
                    runs: Runs::Posted,
                    ..none()
                },
            ),
            p2p(P2PDirection::Send, a, Read),
            p2p(P2PDirection::Recv, b, Write),
            (Stmt::StartCoalescing, none()),
            (
                Stmt::EndCoalescing,
                Effects {
                    runs: Runs::Posted,
                    ..none()
                },
            ),
            (
                Stmt::Wait { comm: posted },
                Effects {
                    waits_for: Some(posted),
                    ..none()
                },
            ),
        ];
        let kinds: BTreeSet<&str> = cases.iter().map(|(s, _)| s.kind_name()).collect();
        assert_eq!(kinds.len(), 15, "one case per statement kind: {kinds:?}");
        for (stmt, want) in &cases {
            assert_eq!(&stmt.effects(), want, "{}", stmt.kind_name());
        }
    }

    /// The narrower accessors agree with the table.
    #[test]
    fn accessors_are_views_of_the_effects() {
        let mut p = HostProgram::new();
        let mut tensor = || p.new_tensor(DType::F32, vec![Scalar::c(4)], MemoryType::Global);
        let [x, w, bias, out] = [tensor(), tensor(), tensor(), tensor()];
        let linear = Stmt::Linear {
            input: x,
            weight: w,
            bias: Some(bias),
            out,
            accumulate: false,
        };
        assert_eq!(linear.reads(), [x, w, bias]);
        assert_eq!(linear.writes(), [out]);
        assert_eq!(linear.tensors(), [x, w, bias, out]);
        assert_eq!(linear.binds(), None);
        assert!(!linear.is_communication());
        let allocate = Stmt::Allocate {
            tensor: x,
            zero_init: false,
        };
        assert_eq!(allocate.binds(), Some(x));
        assert!((allocate.reads(), allocate.writes()) == (vec![], vec![]));
    }

    /// What a posted communication holds until its `Wait`: reads, then writes, each with
    /// whether it is written; an in-place collective writes its input.
    #[test]
    fn contents_mark_what_is_written() {
        let mut p = HostProgram::new();
        let mut tensor = || p.new_tensor(DType::F32, vec![Scalar::c(4)], MemoryType::Global);
        let [a, b] = [tensor(), tensor()];
        let allreduce = |input, output| {
            Stmt::Communication(Communication::allreduce(
                vec![vec![0, 1]],
                ReduceOp::Sum,
                input,
                output,
            ))
        };
        assert_eq!(
            allreduce(a, b).effects().contents(),
            [(a, false), (b, true)]
        );
        assert_eq!(allreduce(a, a).effects().contents(), [(a, true), (a, true)]);
    }
}
