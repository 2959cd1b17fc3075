//! What each statement touches: the tensors it reads, writes and binds, the scalars and
//! streams it names. Shared by the verifier, the host passes and the executor, so that "which
//! buffers does a `Linear` read" has one answer.
//!
//! These are facts about one statement in isolation. Facts that depend on the program around
//! it (the buffers of an [`Stmt::EndCoalescing`] are those of the point-to-point
//! communications of its group) live in the verifier, which walks the program.

use crate::ids::{HostTensorId, KernelId, ScalarId, StmtId, StreamId};
use crate::syntax::{HostProgram, HostScalar, P2PDirection, Stmt};

impl Stmt {
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

    /// Tensors whose contents the statement reads: operands of kernels and library calls, the
    /// input of a collective, the buffer of a send. A [`Stmt::ShardByStream`] input is not
    /// read (the view aliases it); a [`Stmt::Wait`] reads nothing by itself (the verifier
    /// counts it as a use of its communication's buffers).
    pub fn reads(&self) -> Vec<HostTensorId> {
        match self {
            Stmt::LaunchKernel { inputs, .. } => inputs.clone(),
            Stmt::Matmul { a, b, .. } => vec![*a, *b],
            Stmt::Linear {
                input,
                weight,
                bias,
                ..
            } => {
                let mut v = vec![*input, *weight];
                v.extend(bias);
                v
            }
            Stmt::Communication(c) => vec![c.input],
            Stmt::P2PCommunication(c) if c.direction == P2PDirection::Send => vec![c.buffer],
            _ => Vec::new(),
        }
    }

    /// Tensors whose contents the statement writes: outputs of kernels and library calls, the
    /// output of a collective, the buffer of a receive. A write into a tensor that is not
    /// bound yet binds it (library calls allocate their outputs when nothing did).
    pub fn writes(&self) -> Vec<HostTensorId> {
        match self {
            Stmt::LaunchKernel { outputs, .. } => outputs.clone(),
            Stmt::Matmul { out, .. } | Stmt::Linear { out, .. } => vec![*out],
            Stmt::Communication(c) => vec![c.output],
            Stmt::P2PCommunication(c) if c.direction == P2PDirection::Recv => vec![c.buffer],
            _ => Vec::new(),
        }
    }

    /// The tensor the statement binds to a (new) buffer without touching contents: the tensor
    /// of an [`Stmt::Allocate`], the view of a [`Stmt::ShardByStream`].
    pub fn binds(&self) -> Option<HostTensorId> {
        match self {
            Stmt::Allocate { tensor, .. } => Some(*tensor),
            Stmt::ShardByStream { output, .. } => Some(*output),
            _ => None,
        }
    }

    /// Every tensor the statement names, in printed order (duplicates kept).
    pub fn tensors(&self) -> Vec<HostTensorId> {
        match self {
            Stmt::Allocate { tensor, .. } | Stmt::Deallocate { tensor } => vec![*tensor],
            Stmt::ShardByStream { input, output, .. } => vec![*output, *input],
            Stmt::LaunchKernel {
                inputs, outputs, ..
            } => inputs.iter().chain(outputs).copied().collect(),
            Stmt::Matmul { a, b, out } => vec![*out, *a, *b],
            Stmt::Linear {
                input,
                weight,
                bias,
                out,
            } => {
                let mut v = vec![*out, *input, *weight];
                v.extend(bias);
                v
            }
            Stmt::Communication(c) => vec![c.input, c.output],
            Stmt::P2PCommunication(c) => vec![c.buffer],
            _ => Vec::new(),
        }
    }

    /// Scalars the statement evaluates when it runs: loop bounds, chunk count and index of a
    /// view (and of the chunk it holds), the root of a collective, the peer of a point-to-point. The index of a
    /// [`Stmt::ForLoop`] is bound, not read, and is not listed; neither are tensor sizes nor
    /// stream indices (see [`Stmt::stream`]).
    pub fn scalars(&self) -> Vec<ScalarId> {
        match self {
            Stmt::ForLoop { start, stop, .. } => vec![*start, *stop],
            Stmt::ShardByStream {
                chunks,
                index,
                holds,
                ..
            } => {
                let mut v = vec![*chunks, *index];
                if let Some(h) = holds {
                    v.extend([h.chunk, h.chunks, h.extent]);
                }
                v
            }
            Stmt::Communication(c) => c.root.into_iter().collect(),
            Stmt::P2PCommunication(c) => vec![c.peer],
            _ => Vec::new(),
        }
    }

    /// The stream the statement defines ([`Stmt::GetCurrentStream`]) or uses
    /// ([`Stmt::SetCurrentStream`], [`Stmt::Synchronize`]).
    pub fn stream(&self) -> Option<StreamId> {
        match self {
            Stmt::GetCurrentStream { out } => Some(*out),
            Stmt::SetCurrentStream { stream } | Stmt::Synchronize { stream } => Some(*stream),
            _ => None,
        }
    }

    /// The kernel a [`Stmt::LaunchKernel`] runs.
    pub fn kernel(&self) -> Option<KernelId> {
        match self {
            Stmt::LaunchKernel { kernel, .. } => Some(*kernel),
            _ => None,
        }
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
        matches!(
            self,
            Stmt::Communication(_) | Stmt::P2PCommunication(_) | Stmt::EndCoalescing
        )
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
