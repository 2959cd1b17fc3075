//! What one collective does among in-process ranks, apart from how they meet: each member's
//! [`Plan`] (which of its buffers it reads and writes, checked alone at post time) and
//! [`Contribution`], the check that the members agree, and each member's output computed
//! from everyone's contributions.

use std::sync::Arc;

use crate::communicator::{size_relation, CommOp};
use crate::dtype::{DataType, RedOp};
use crate::host::HostView;

/// What one member brings to a collective.
pub(super) struct Contribution {
    pub(super) rank: usize,
    pub(super) team: Vec<usize>,
    pub(super) name: &'static str,
    pub(super) root: Option<usize>,
    pub(super) red: Option<RedOp>,
    /// (send_to, recv_from) of a collective permute.
    pub(super) permute: Option<(usize, usize)>,
    /// The element type of the buffers this member uses.
    pub(super) dtype: DataType,
    /// Sizes of the input, when this member reads it.
    pub(super) input_sizes: Option<Vec<usize>>,
    /// Sizes of the output, when this member writes it.
    pub(super) output_sizes: Option<Vec<usize>>,
    /// The input's values, when this member reads it.
    pub(super) input: Option<Vec<f64>>,
}

impl Contribution {
    fn input_numel(&self) -> Option<usize> {
        self.input_sizes.as_ref().map(|s| s.iter().product())
    }

    fn output_numel(&self) -> Option<usize> {
        self.output_sizes.as_ref().map(|s| s.iter().product())
    }

    /// The input's element count and sizes, for messages.
    fn describe_input(&self) -> String {
        describe(self.input_numel(), &self.input_sizes)
    }

    /// The output's element count and sizes, for messages.
    fn describe_output(&self) -> String {
        describe(self.output_numel(), &self.output_sizes)
    }

    fn values(&self) -> &[f64] {
        self.input.as_deref().unwrap_or(&[])
    }
}

/// A collective as one member runs it: which of its buffers it reads and writes.
pub(super) struct Plan {
    pub(super) name: &'static str,
    pub(super) root: Option<usize>,
    pub(super) red: Option<RedOp>,
    pub(super) permute: Option<(usize, usize)>,
    /// Read by this member.
    pub(super) input: Option<HostView>,
    /// Written by this member.
    pub(super) output: Option<HostView>,
}

impl Plan {
    /// This member reads `input` and writes `output`.
    fn uses(&mut self, input: HostView, output: HostView) {
        self.input = Some(input);
        self.output = Some(output);
    }

    /// Checks what member `index` of a team of `n` can check alone.
    pub(super) fn new(op: CommOp<HostView>, index: usize, n: usize) -> Result<Plan, String> {
        let name = op.name();
        let red = match &op {
            CommOp::Allreduce { op, .. }
            | CommOp::ReduceScatter { op, .. }
            | CommOp::Reduce { op, .. } => Some(*op),
            _ => None,
        };
        op.check_members(n)?;
        let mut plan = Plan {
            name,
            root: op.root(),
            red,
            permute: None,
            input: None,
            output: None,
        };
        match op {
            CommOp::Allgather { input, output }
            | CommOp::Allreduce { input, output, .. }
            | CommOp::ReduceScatter { input, output, .. } => {
                expect_sizes(name, &input, &output, n)?;
                plan.uses(input, output);
            }
            CommOp::Broadcast {
                root,
                input,
                output,
            }
            | CommOp::Scatter {
                root,
                input,
                output,
            }
            | CommOp::Reduce {
                root,
                input,
                output,
                ..
            }
            | CommOp::Gather {
                root,
                input,
                output,
            } => {
                if index == root {
                    expect_sizes(name, &input, &output, n)?;
                }
                // A broadcast's or scatter's root reads its input and every member writes its
                // output; every member of a reduce or gather reads its input and the root
                // writes its output.
                let root_reads = matches!(name, "broadcast" | "scatter");
                plan.input = (index == root || !root_reads).then_some(input);
                plan.output = (index == root || root_reads).then_some(output);
            }
            CommOp::SendRecv {
                root,
                input,
                output,
            } => {
                if index == root {
                    plan.input = Some(input);
                } else {
                    plan.output = Some(output);
                }
            }
            CommOp::AllToAll { input, output } => {
                expect_sizes(name, &input, &output, n)?;
                if input.numel() % n != 0 {
                    return Err(format!(
                        "the input's {} elements (sizes {:?}) do not split into {n} equal pieces",
                        input.numel(),
                        input.sizes()
                    ));
                }
                plan.uses(input, output);
            }
            CommOp::CollectivePermute {
                input,
                output,
                send_to,
                recv_from,
            } => {
                plan.permute = Some((send_to, recv_from));
                plan.uses(input, output);
            }
        }
        if let (Some(input), Some(output)) = (&plan.input, &plan.output) {
            if input.dtype() != output.dtype() {
                return Err(format!(
                    "the input is {} but the output is {}",
                    input.dtype(),
                    output.dtype()
                ));
            }
        }
        Ok(plan)
    }
}

/// Fails unless the sizes of `input` and `output` relate as operation `name` on a team of
/// `n` needs: the output `n` times the input for gathers, the input `n` times the output for
/// scatters, the same number of elements otherwise.
fn expect_sizes(name: &str, input: &HostView, output: &HostView, n: usize) -> Result<(), String> {
    match name {
        "allgather" | "gather" => {
            expect_numel("output", output, input.numel().saturating_mul(n), n)
        }
        "reduce-scatter" | "scatter" => {
            expect_numel("input", input, output.numel().saturating_mul(n), n)
        }
        _ => expect_numel("output", output, input.numel(), 1),
    }
}

/// Fails unless `view` (the `what` buffer) has `expected` elements, `factor` times the other.
fn expect_numel(what: &str, view: &HostView, expected: usize, factor: usize) -> Result<(), String> {
    if view.numel() == expected {
        return Ok(());
    }
    let relation = size_relation(factor);
    Err(format!(
        "the {what} has {} elements (sizes {:?}) but must have {relation}, {expected}",
        view.numel(),
        view.sizes()
    ))
}

/// `numel` elements with their sizes, for messages.
fn describe(numel: Option<usize>, sizes: &Option<Vec<usize>>) -> String {
    match (numel, sizes) {
        (Some(numel), Some(sizes)) => format!("{numel} elements (sizes {sizes:?})"),
        _ => "no buffer".to_string(),
    }
}

/// "rank A <a> but rank B <b>": how members `first` and `m` disagree, for messages.
fn disagree(first: &Contribution, a: String, m: &Contribution, b: String) -> String {
    format!("rank {} {a} but rank {} {b}", first.rank, m.rank)
}

/// Checks that the members of a collective (in team order) agree; every member runs the same
/// check on the same contributions, so all of them fail alike.
pub(super) fn check_members(members: &[Arc<Contribution>]) -> Result<(), String> {
    let Some(first) = members.first() else {
        return Ok(());
    };
    for m in &members[1..] {
        let differ = |a: String, b: String| Err(disagree(first, a, m, b));
        if m.name != first.name {
            return differ(
                format!("posted {}", first.name),
                format!("posted {}", m.name),
            );
        }
        if m.team != first.team {
            return differ(
                format!("posted team {:?}", first.team),
                format!("posted team {:?}", m.team),
            );
        }
        if m.root != first.root {
            return differ(
                format!("names root {:?}", first.root),
                format!("names root {:?}", m.root),
            );
        }
        if m.red != first.red {
            let name = |red: Option<RedOp>| red.map_or("none", RedOp::name);
            return differ(
                format!("reduces with {}", name(first.red)),
                format!("with {}", name(m.red)),
            );
        }
        if m.dtype != first.dtype {
            return differ(
                format!("has {} data", first.dtype),
                format!("has {} data", m.dtype),
            );
        }
    }
    match first.name {
        "broadcast" | "send-recv" | "scatter" => {
            let Some(src) = first.root.and_then(|root| members.get(root)) else {
                return Err("the root is out of range".into());
            };
            // The root of a scatter sends each member a piece of its own output's size.
            let (piece, piece_sizes) = if first.name == "scatter" {
                (src.output_numel(), &src.output_sizes)
            } else {
                (src.input_numel(), &src.input_sizes)
            };
            for m in members {
                if m.rank == src.rank || m.output_numel().is_none() {
                    continue;
                }
                if m.output_numel() != piece {
                    return Err(disagree(
                        src,
                        format!("sends {}", describe(piece, piece_sizes)),
                        m,
                        format!("receives {}", m.describe_output()),
                    ));
                }
            }
        }
        "collective-permute" => {
            for (j, m) in members.iter().enumerate() {
                let (_, recv_from) = m.permute.unwrap_or((j, j));
                let Some(src) = members.get(recv_from) else {
                    return Err(format!("rank {} receives from an unknown member", m.rank));
                };
                let (send_to, _) = src.permute.unwrap_or((recv_from, recv_from));
                if send_to != j {
                    let dst = members.get(send_to).map_or(usize::MAX, |d| d.rank);
                    return Err(format!(
                        "rank {} receives from rank {} but rank {} sends to rank {dst}",
                        m.rank, src.rank, src.rank
                    ));
                }
                if m.output_numel() != src.input_numel() {
                    return Err(disagree(
                        src,
                        format!("sends {}", src.describe_input()),
                        m,
                        format!("receives {}", m.describe_output()),
                    ));
                }
            }
        }
        _ => {
            // Every member contributes an input of the same size.
            for m in &members[1..] {
                if m.input_numel() != first.input_numel() {
                    return Err(disagree(
                        first,
                        format!("contributes {}", first.describe_input()),
                        m,
                        format!("contributes {}", m.describe_input()),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Member `index`'s output, of `numel` elements, from the checked contributions.
pub(super) fn compute(
    plan: &Plan,
    members: &[Arc<Contribution>],
    index: usize,
    numel: usize,
) -> Vec<f64> {
    let n = members.len().max(1);
    let piece = |values: &[f64], i: usize, len: usize| -> Vec<f64> {
        values
            .get(i * len..(i + 1) * len)
            .map(<[f64]>::to_vec)
            .unwrap_or_default()
    };
    let root = || plan.root.and_then(|root| members.get(root));
    let concat = || -> Vec<f64> {
        members
            .iter()
            .flat_map(|m| m.values().iter().copied())
            .collect()
    };
    match plan.name {
        "allgather" | "gather" => concat(),
        "allreduce" | "reduce" => reduce(members, plan.red),
        "reduce-scatter" => piece(&reduce(members, plan.red), index, numel),
        "broadcast" | "send-recv" => root().map(|m| m.values().to_vec()).unwrap_or_default(),
        "scatter" => root()
            .map(|m| piece(m.values(), index, numel))
            .unwrap_or_default(),
        "all-to-all" => {
            let len = numel / n;
            members
                .iter()
                .flat_map(|m| piece(m.values(), index, len))
                .collect()
        }
        "collective-permute" => plan
            .permute
            .and_then(|(_, recv_from)| members.get(recv_from))
            .map(|m| m.values().to_vec())
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// The element-wise reduction of the members' inputs, in team order, starting from the first
/// member's values.
fn reduce(members: &[Arc<Contribution>], red: Option<RedOp>) -> Vec<f64> {
    let red = red.unwrap_or(RedOp::Sum);
    let mut members = members.iter();
    let Some(first) = members.next() else {
        return Vec::new();
    };
    let mut acc = first.values().to_vec();
    for m in members {
        for (a, &b) in acc.iter_mut().zip(m.values()) {
            *a = red.combine(*a, b);
        }
    }
    acc
}
