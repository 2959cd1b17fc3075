//! One measured configuration of the overlap benchmark ([`measure`]): its time on every
//! rank (the slowest rank's median), its sampled rows checked, its spans.

use std::sync::Arc;

use streamweave::Executable;
use weave_bench::{
    check_sample, median, run_program, Check, CopyEngine, ProgramRun, ProgramTiming, World,
};
use weave_comm::nccl::{NcclId, NcclOptions};
use weave_executor::timeline::RankSpans;

use super::args::Args;

/// One measured configuration of a row.
pub(crate) struct Measured {
    pub(crate) config: String,
    pub(crate) ms: f64,
    pub(crate) check: Check,
    pub(crate) spans: Vec<RankSpans>,
}

/// Times `compiled` with `how` on every rank (with `comm_options` a fresh communicator for
/// the job, else the world's) and checks its sampled rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn measure(
    world: &World,
    compiled: &Arc<Executable>,
    how: &ProgramRun,
    comm_options: Option<(NcclId, NcclOptions)>,
    engine: CopyEngine,
    args: &Args,
    seeds: &'static [u64],
    rows: &Arc<Vec<usize>>,
    reference: &[Vec<f64>],
    config: String,
) -> Result<Measured, String> {
    let (c, how2, rows2) = (compiled.clone(), how.clone(), rows.clone());
    let (warmup, iters) = (args.warmup, args.iters);
    let timings: Vec<ProgramTiming> = world.run(move |r| {
        run_program(
            r,
            comm_options.as_ref(),
            &engine,
            &c,
            &how2,
            seeds,
            (warmup, iters),
            &rows2,
        )
    })?;
    let ms = timings
        .iter()
        .map(|t| median(&t.times))
        .fold(0.0f64, f64::max);
    let found: Vec<(usize, usize, f64)> = timings.iter().flat_map(|t| t.sample.clone()).collect();
    let check = check_sample(&found, rows, reference, weave_ir::DType::BF16);
    if how.trace {
        let n: usize = timings.iter().map(|t| t.spans.len()).sum();
        println!("  ({config}: {n} spans traced over all ranks)");
    }
    let spans = timings
        .iter()
        .enumerate()
        .map(|(rank, t)| RankSpans {
            rank,
            spans: t.spans.clone(),
        })
        .collect();
    Ok(Measured {
        config,
        ms,
        check,
        spans,
    })
}

/// Per rank, the medians of each part; returns (the slowest rank's sum of the parts, each
/// part's slowest rank).
pub(crate) fn sum_of_medians(v: &[Vec<f64>]) -> (f64, Vec<f64>) {
    let total = v
        .iter()
        .map(|r| r.iter().sum::<f64>())
        .fold(0.0f64, f64::max);
    let parts = (0..v.first().map_or(0, Vec::len))
        .map(|j| v.iter().map(|r| r[j]).fold(0.0f64, f64::max))
        .collect();
    (total, parts)
}
