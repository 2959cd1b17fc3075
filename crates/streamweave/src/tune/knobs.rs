//! The overlap knobs the tuner tries on its best candidates ([`Knob`], [`knob_variants`]):
//! which knobs fit a program's collectives, and the slot and window sizes it tries.

#[cfg(doc)]
use super::tune;
use super::Candidate;
#[cfg(doc)]
use crate::run::Overlap;
use crate::run::{NcclCtaPolicy, Transport};

/// One overlap knob set away from its default (or another pool size, or the other
/// transport): what [`tune`] tries on its best candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Knob {
    /// [`Overlap::ordered_compute`].
    OrderedCompute,
    /// [`Overlap::pool_priority_high`].
    PoolPriorityHigh,
    /// [`Overlap::comm_priority_high`].
    CommPriorityHigh,
    /// [`Overlap::nccl_max_ctas`] at this limit.
    NcclMaxCtas(u32),
    /// [`Overlap::gemm_sm_margin`] of this many SMs.
    GemmSmMargin(u32),
    /// This stream-pool size.
    Streams(usize),
    /// The other replay setting: a replayed base issued statement by statement, or an eager
    /// one replayed. A CUDA graph launches the kernels of parallel branches in an order of
    /// its own, not in the order they were issued (which `prefetch-communications` sets), and
    /// which of the two is faster differs with the program and S.
    FlipReplay,
    /// Copy-engine transfers and reductions ([`Transport::CopyEngine`]).
    CopyEngine,
    /// [`Overlap::nccl_cta_policy`] set to this policy.
    NcclCtaPolicy(NcclCtaPolicy),
    /// A symmetric NCCL window of this many MiB ([`Overlap::nccl_window_mib`]), with the
    /// zero-CTA policy when the second field says so.
    NcclWindow(u32, bool),
    /// Copy-engine window slots of this many MiB ([`Overlap::ce_slot_mib`]).
    CeSlots(u32),
    /// GEMMs writing into the copy engines' windows ([`Overlap::gemm_into_windows`]).
    GemmIntoWindows,
}

impl Knob {
    /// `c` with this knob set.
    pub fn apply(self, c: Candidate) -> Candidate {
        let mut c = c;
        match self {
            Knob::OrderedCompute => c.overlap.ordered_compute = true,
            Knob::PoolPriorityHigh => c.overlap.pool_priority_high = true,
            Knob::CommPriorityHigh => c.overlap.comm_priority_high = true,
            Knob::NcclMaxCtas(n) => c.overlap.nccl_max_ctas = Some(n),
            Knob::GemmSmMargin(n) => c.overlap.gemm_sm_margin = n,
            Knob::Streams(k) => c.streams = k,
            Knob::FlipReplay => c.replay = !c.replay,
            Knob::CopyEngine => c.transport = Transport::CopyEngine,
            Knob::NcclCtaPolicy(p) => c.overlap.nccl_cta_policy = Some(p),
            Knob::NcclWindow(mib, zero) => {
                c.overlap.nccl_window_mib = mib;
                if zero {
                    c.overlap.nccl_cta_policy = Some(NcclCtaPolicy::Zero);
                }
            }
            Knob::CeSlots(mib) => c.overlap.ce_slot_mib = mib,
            Knob::GemmIntoWindows => c.overlap.gemm_into_windows = true,
        }
        c
    }
}

/// The knobs [`tune`] tries on `base`, whose program posts the collectives `comms` (their
/// type names) on `ranks` ranks: ordered compute, pool priority, (on NCCL) collectives at
/// high priority and (on several ranks) the other replay setting where a loop has chunks to
/// overlap; the NCCL CTA limit (16: fewer starve the collective, docs/benchmarks.md) and
/// a GEMM SM margin (16) where NCCL kernels run beside GEMMs; pool sizes 1, 2 and 4 up to
/// the chunk count; copy-engine transfers and reductions where allgathers, transfers or sum
/// reductions move data; on a copy-engine base, slots of [`TUNED_CE_SLOT_MIB`] (a chunk's
/// block to one peer in one piece) and, where sums are reduced, GEMMs writing into the
/// windows. `chunks` is the chunk count of the base's loops: its S, or for a fusion without a
/// chunk-count parameter the trip count of its stream loops as written (a P2P ring's one
/// chunk per device, [`loop_chunks`]).
pub fn knob_variants(
    base: &Candidate,
    comms: &[String],
    ranks: usize,
    chunks: Option<usize>,
) -> Vec<Knob> {
    let chunked = chunks.is_some_and(|s| s > 1);
    let mut out = Vec::new();
    if chunked {
        out.push(Knob::OrderedCompute);
        out.push(Knob::PoolPriorityHigh);
        if base.transport == Transport::Nccl {
            out.push(Knob::CommPriorityHigh);
        }
    }
    if ranks > 1 {
        out.push(Knob::NcclMaxCtas(16));
        out.push(Knob::GemmSmMargin(16));
    }
    if chunked && ranks > 1 {
        out.push(Knob::FlipReplay);
    }
    if chunked {
        let s = chunks.unwrap_or(1);
        for k in [1, 2, 4] {
            if k != base.streams && k <= s {
                out.push(Knob::Streams(k));
            }
        }
    }
    if ranks > 1 && moves_data(comms) && base.transport == Transport::Nccl {
        out.push(Knob::CopyEngine);
    }
    if ranks > 1 && base.transport == Transport::CopyEngine && base.overlap.ce_slot_mib == 0 {
        out.push(Knob::CeSlots(TUNED_CE_SLOT_MIB));
    }
    if ranks > 1
        && sums(comms)
        && base.transport == Transport::CopyEngine
        && !base.overlap.gemm_into_windows
    {
        out.push(Knob::GemmIntoWindows);
    }
    // NCCL's own ways of leaving SMs to GEMMs: fewer CTAs, and symmetric windows (whose
    // kernels need fewer; with the zero-CTA policy, copy engines) for the collectives a
    // window can stage.
    let stageable = comms
        .iter()
        .any(|c| matches!(c.as_str(), "Allgather" | "ReduceScatter" | "Allreduce"));
    if ranks > 1 && stageable && base.transport == Transport::Nccl {
        out.push(Knob::NcclCtaPolicy(NcclCtaPolicy::Efficiency));
        out.push(Knob::NcclWindow(TUNED_NCCL_WINDOW_MIB, false));
        out.push(Knob::NcclWindow(TUNED_NCCL_WINDOW_MIB, true));
    }
    out
}

/// Whether collectives of `comms` (type names) move data the copy engines can carry.
pub(super) fn moves_data(comms: &[String]) -> bool {
    comms.iter().any(|c| {
        matches!(
            c.as_str(),
            "Allgather" | "SendRecv" | "P2P" | "ReduceScatter" | "Allreduce"
        )
    })
}

/// Whether `comms` (type names) has a sum reduction the copy engines can reduce in their
/// windows.
pub(super) fn sums(comms: &[String]) -> bool {
    comms
        .iter()
        .any(|c| matches!(c.as_str(), "ReduceScatter" | "Allreduce"))
}

/// The copy-engine slot size the tuner tries beside the default 8 MiB: a t = h = 8192 bf16
/// layer's block to one peer at S = 2 on 4 ranks (16 MiB) or S = 1 (32 MiB) in one piece.
pub const TUNED_CE_SLOT_MIB: u32 = 32;

/// The symmetric window the tuner tries: 256 MiB a direction holds the collectives of a
/// t = h = 8192 bf16 layer on 2 ranks (128 MiB) with room to spare.
pub const TUNED_NCCL_WINDOW_MIB: u32 = 256;

/// The chunk count of `program`'s loops as written: the longest trip count of its stream
/// loops (a loop whose body first makes a pool stream current) whose bounds are constants;
/// `None` without one. A fusion without a chunk-count parameter (a P2P ring, one chunk per
/// device) has its loops' chunks only here.
pub fn loop_chunks(program: &weave_host_ir::HostProgram) -> Option<usize> {
    use weave_host_ir::{HostScalar, Stmt};
    let constant = |s| match &program.scalars[s] {
        HostScalar::Value(v) => v.as_const(),
        _ => None,
    };
    program
        .top_level
        .iter()
        .filter_map(|&s| match &program.stmts[s] {
            Stmt::ForLoop {
                start, stop, body, ..
            } if body
                .first()
                .is_some_and(|b| matches!(program.stmts[*b], Stmt::SetCurrentStream { .. })) =>
            {
                usize::try_from(constant(*stop)? - constant(*start)?).ok()
            }
            _ => None,
        })
        .max()
}
