//! One configuration a tuning measures ([`Candidate`]) and what became of it ([`Outcome`]).

use std::fmt;
use std::time::Duration;

use super::choice::median;
use crate::executable::Chunks;
#[cfg(doc)]
use crate::run::RunOptions;
use crate::run::{Overlap, Transport};

/// One configuration of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Candidate {
    /// The chunk count S, or `None` when the fusion has no chunk-count parameter (its Stream
    /// axes keep the extents it writes). For such a fusion, `Some(1)` runs its Stream axes
    /// serially ([`Chunks::Fixed`] of 1, `Fusion::serialize_streams`).
    pub chunks: Option<usize>,
    /// The fusion's ring form with its reduce rings' steps in this many pieces
    /// ([`Chunks::Ring`]); `chunks` is then the chunks its loops run. `None`: the fusion as
    /// written.
    pub ring: Option<usize>,
    /// The stream-pool size K ([`RunOptions::streams`]).
    pub streams: usize,
    /// Whether repeated runs replay a captured CUDA graph
    /// ([`GpuRunOptions::replay`](crate::GpuRunOptions::replay)).
    pub replay: bool,
    /// How allgathers and transfers move
    /// ([`GpuRunOptions::transport`](crate::GpuRunOptions::transport)).
    pub transport: Transport,
    /// The backend's overlap knobs ([`GpuRunOptions::overlap`](crate::GpuRunOptions::overlap)).
    pub overlap: Overlap,
}

impl Candidate {
    /// `chunks`, `streams` and `replay` with NCCL and the default overlap knobs.
    pub fn new(chunks: Option<usize>, streams: usize, replay: bool) -> Candidate {
        Candidate {
            chunks,
            ring: None,
            streams,
            replay,
            transport: Transport::Nccl,
            overlap: Overlap::default(),
        }
    }

    /// The fusion's ring form, `pieces` pieces a step, running `chunks` chunks, with
    /// `streams`, `replay`, NCCL and the default overlap knobs.
    pub fn ring(pieces: usize, chunks: usize, streams: usize, replay: bool) -> Candidate {
        Candidate {
            ring: Some(pieces),
            ..Candidate::new(Some(chunks), streams, replay)
        }
    }

    /// How the [`Compiler`](crate::Compiler) compiles this candidate's program.
    pub fn compiler_chunks(&self) -> Chunks {
        match self.ring {
            Some(k) => Chunks::Ring(k),
            None => self.chunks.map_or(Chunks::AsWritten, Chunks::Fixed),
        }
    }

    /// How many knobs differ from the defaults (ties go to fewer).
    pub(super) fn knobs(&self) -> usize {
        let o = &self.overlap;
        usize::from(self.transport != Transport::Nccl)
            + usize::from(self.ring.is_some())
            + usize::from(o.ordered_compute)
            + usize::from(o.pool_priority_high)
            + usize::from(o.comm_priority_high)
            + usize::from(o.gemm_sm_margin > 0)
            + usize::from(o.nccl_max_ctas.is_some())
            + usize::from(o.nccl_cta_policy.is_some())
            + usize::from(o.nccl_window_mib > 0)
            + usize::from(o.ce_slot_mib > 0)
            + usize::from(o.gemm_into_windows)
    }
}

impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.ring, self.chunks) {
            (Some(k), Some(s)) => write!(f, "ring:{k} S={s}")?,
            (Some(k), None) => write!(f, "ring:{k}")?,
            (None, Some(s)) => write!(f, "S={s}")?,
            (None, None) => f.write_str("S=as written")?,
        }
        write!(
            f,
            " K={} {}",
            self.streams,
            if self.replay { "replay" } else { "eager" }
        )?;
        if self.transport == Transport::CopyEngine {
            f.write_str(", copy-engine")?;
        }
        if self.overlap != Overlap::default() {
            write!(f, ", {}", self.overlap.describe())?;
        }
        Ok(())
    }
}

/// What became of one candidate.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Measured: the median of the timed repetitions (each at its slowest rank).
    Measured(Duration),
    /// Not measured: the cost model predicts this chunk count too slow.
    Pruned {
        /// Its prediction over the model's best one.
        ratio: f64,
        /// The chunk count the model predicts fastest.
        best: usize,
    },
    /// Not measured: the same run as another candidate (why).
    Redundant(String),
    /// The compiler refused this chunk count (its message).
    Refused(String),
    /// The run failed (its message).
    Failed(String),
    /// Not measured: the tuning's time budget was spent.
    OverBudget,
    /// A finalist, measured again in the final round: its figure is the median of those
    /// fresh figures alone.
    Confirmed {
        /// The figure of the search that made it a finalist.
        first: Duration,
        /// The final round's figures, in the order measured (at least one).
        again: Vec<Duration>,
    },
}

impl Outcome {
    /// The measured time, if any (of a finalist, the median of its final round's figures).
    pub fn time(&self) -> Option<Duration> {
        match self {
            Outcome::Measured(d) => Some(*d),
            Outcome::Confirmed { again, .. } => median(again),
            _ => None,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Measured(d) => write!(f, "{:.3} ms", d.as_secs_f64() * 1e3),
            Outcome::Pruned { ratio, best } => write!(
                f,
                "skipped: the cost model predicts {ratio:.2}x its best (S={best})"
            ),
            Outcome::Redundant(why) => write!(f, "skipped: {why}"),
            Outcome::Refused(m) => write!(f, "refused: {}", first_line(m)),
            Outcome::Failed(m) => write!(f, "failed: {}", first_line(m)),
            Outcome::OverBudget => f.write_str("skipped: over the tuning budget"),
            Outcome::Confirmed { first, again } => {
                let figures: Vec<String> = again
                    .iter()
                    .map(|d| format!("{:.3}", d.as_secs_f64() * 1e3))
                    .collect();
                write!(
                    f,
                    "{:.3} ms (the median of {}, measured again; first {:.3})",
                    self.time().unwrap_or_default().as_secs_f64() * 1e3,
                    figures.join(", "),
                    first.as_secs_f64() * 1e3
                )
            }
        }
    }
}

fn first_line(m: &str) -> &str {
    m.lines().next().unwrap_or("")
}
