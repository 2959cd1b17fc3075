//! The kernel table: every generated kernel a host program launches, planned before it runs.
//!
//! A kernel segment's kernels depend on its buffers' layouts (a stream chunk is a strided
//! view of its buffer; an uneven split gives the last chunk other sizes; a buffer of chunk
//! slots, one per pool stream, has strides that depend on the pool's size) and on the SM
//! count their grids are sized for. [`KernelTable::for_program`] runs the program of every
//! rank once on the meter backend with the run's pool size (buffers are shapes, nothing is
//! computed), sees each launch with its layouts, and plans every distinct (segment, layouts)
//! with weave-codegen for one SM count. The CUDA backend launches what the table holds
//! ([`KernelTable::plan_for`]) and plans nothing itself; `weave dump` prints the table after
//! the host program, and `weave dump --kernels` its CUDA C.
//!
//! Entries are keyed by the segment's fusion name and the layouts. A kernel whose ops mention
//! `rank` runs as each rank's copy (`interp::bind_rank`), named `<segment>_rank<r>`, so each
//! rank's copy has entries of its own. The table mirrors what the CUDA backend does before
//! it looks a plan up: a launch whose outputs are all empty launches nothing, and an input
//! that shares its allocation with an output is read from a contiguous copy (the meter
//! records that copy's layout).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use weave_host_ir::HostProgram;
use weave_ir::Fusion;

use crate::dense::Dense;
use crate::error::ExecError;
use crate::eval::{run_rank, RunConfig};
use crate::meter::{Meter, MeterBackend, MeteredGemm, MeteredLaunch};
use weave_codegen::{self as codegen, Grid, KernelPlan, PlanError, TensorArg};
use weave_comm::ReductionShape;

/// The plan of one kernel segment on buffers of given layouts.
#[derive(Clone, Debug)]
pub struct KernelEntry {
    /// The first host statement that launches it, as printed.
    pub statement: String,
    /// The segment's fusion name (`<segment>_rank<r>` for a rank's copy of a kernel whose
    /// ops mention `rank`).
    pub segment: String,
    /// Its inputs' layouts.
    pub inputs: Vec<TensorArg>,
    /// Its outputs' layouts.
    pub outputs: Vec<TensorArg>,
    /// The code generator's plan: temporaries and kernels.
    pub plan: KernelPlan,
}

/// Every kernel plan a program's ranks launch, for one SM count: see the module doc.
#[derive(Clone)]
pub struct KernelTable {
    ranks: usize,
    streams: usize,
    sms: usize,
    entries: Vec<KernelEntry>,
    /// The entries of each segment, by index into `entries`.
    by_segment: HashMap<String, Vec<usize>>,
    /// Each rank's distinct sum reduce-scatters and allreduces, in the order it first posts
    /// them: a copy-engine transport loads the kernels that reduce them before a run.
    reductions: Vec<Vec<ReductionShape>>,
    /// Each rank's peak of live buffer bytes ([`Meter::peak_bytes`]): what a run reserves
    /// in the GPU's memory pool before its first statement.
    peaks: Vec<u64>,
    /// Each rank's distinct GEMMs ([`Meter::distinct_gemms`]): what a run launches once
    /// before its first statement.
    gemms: Vec<Vec<MeteredGemm>>,
}

/// A summary: the table's size, not every plan's source.
impl std::fmt::Debug for KernelTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelTable")
            .field("ranks", &self.ranks)
            .field("streams", &self.streams)
            .field("sms", &self.sms)
            .field("plans", &self.entries.len())
            .finish()
    }
}

/// Why a program's kernel table could not be made ([`KernelTable::for_program`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KernelTableError {
    /// The program has no signature to size each rank's inputs by.
    #[error("the host program has no signature to size its ranks' buffers by")]
    NoSignature,
    /// A rank's program did not run on the meter backend.
    #[error("rank {rank}: {error}")]
    Meter {
        /// The rank.
        rank: usize,
        /// Why its run failed.
        error: ExecError,
    },
    /// The code generator cannot plan a launch.
    #[error("`{statement}`: {error}")]
    Plan {
        /// The statement, as printed.
        statement: String,
        /// Why.
        error: PlanError,
    },
    /// Two different kernels share a fusion name, by which the table keys its plans.
    #[error(
        "`{statement}` launches a kernel named `{segment}`, as `{first}` launches another: \
         each kernel's fusion needs a name of its own"
    )]
    SharedName {
        /// The kernels' name.
        segment: String,
        /// The statement that launches the first of them.
        first: String,
        /// The statement that launches the second.
        statement: String,
    },
}

/// The name of a segment's kernel in its CUDA C (a plan's launches add their suffixes).
pub fn kernel_name(segment: &str) -> String {
    format!("weave_kernel_{segment}")
}

/// A layout as the table prints it: `f32[4, 8] strides [8, 1]`.
pub fn layout_text(a: &TensorArg) -> String {
    format!("{}{:?} strides {:?}", a.dtype, a.sizes, a.strides)
}

/// Layouts as the table prints them: each [`layout_text`], separated by `, `.
pub fn layouts_text(args: &[TensorArg]) -> String {
    args.iter().map(layout_text).collect::<Vec<_>>().join(", ")
}

/// A grid as the table prints it on a device of `sms` SMs: its work, then its blocks
/// (`32 items; 1 blocks of 128 threads`).
pub fn grid_text(g: &Grid, sms: usize) -> String {
    let dims = g.dims(sms).map_or("no launch".to_string(), |(b, t)| {
        format!("{b} blocks of {t} threads")
    });
    match g {
        Grid::Items { n, .. } => format!("{n} items; {dims}"),
        Grid::Rows { rows, .. } => format!("{rows} rows; {dims}"),
        Grid::Blocks { .. } => dims,
    }
}

/// What rank `rank` of `ranks` does when it runs `program` with `streams` pool streams
/// (`numberOfStreams`) on the meter backend, its parameter values from the signature and its
/// inputs as shapes only (the meter never reads values): its kernel launches in the order it
/// makes them, its GEMMs and collectives.
pub fn meter_rank(
    program: &HostProgram,
    rank: usize,
    ranks: usize,
    streams: usize,
) -> Result<Meter, KernelTableError> {
    let sig = program
        .signature
        .as_ref()
        .ok_or(KernelTableError::NoSignature)?;
    let config = RunConfig {
        params: sig.params.iter().cloned().collect(),
        number_of_streams: streams,
        check_races: false,
        deadline: None,
    };
    let inputs: Vec<Dense> = sig
        .inputs
        .iter()
        .map(|t| Dense {
            dtype: t.dtype,
            sizes: t.local_sizes_of(rank),
            data: Vec::new(),
        })
        .collect();
    let backend = MeterBackend::new();
    let comm = backend.comm(rank, ranks);
    run_rank(program, &backend, &comm, &inputs, &config)
        .map_err(|error| KernelTableError::Meter { rank, error })?;
    Ok(backend.meter())
}

impl KernelTable {
    /// A table of no plans, for a program of `ranks` ranks with `streams` pool streams on GPUs
    /// of `sms` SMs.
    pub fn new(ranks: usize, streams: usize, sms: usize) -> KernelTable {
        KernelTable {
            ranks,
            streams,
            sms: sms.max(1),
            entries: Vec::new(),
            by_segment: HashMap::new(),
            reductions: Vec::new(),
            peaks: Vec::new(),
            gemms: Vec::new(),
        }
    }

    /// The table of `program` on `ranks` ranks with `streams` pool streams
    /// (`numberOfStreams`), for GPUs of `sms` SMs: every rank's program runs on the meter
    /// backend (its parameter values from the signature), and each distinct launch, in the
    /// order the ranks first make it, is planned. Errors name the rank whose run failed, or
    /// the statement whose kernel cannot be generated.
    pub fn for_program(
        program: &HostProgram,
        ranks: usize,
        streams: usize,
        sms: usize,
    ) -> Result<KernelTable, KernelTableError> {
        let mut table = KernelTable::new(ranks, streams, sms);
        // The fusion of each name so far and the statement that launched it first: two
        // kernels may not share a name.
        let mut named: HashMap<String, (Arc<Fusion>, String)> = HashMap::new();
        for rank in 0..ranks {
            let meter = meter_rank(program, rank, ranks, streams)?;
            let mut reductions: Vec<ReductionShape> = Vec::new();
            for r in meter.reductions {
                if !reductions.contains(&r) {
                    reductions.push(r);
                }
            }
            table.reductions.push(reductions);
            table.peaks.push(meter.peak_bytes);
            table.gemms.push(meter.distinct_gemms);
            for launch in meter.launches {
                let name = &launch.fusion.name;
                match named.get(name) {
                    Some((f, _)) if Arc::ptr_eq(f, &launch.fusion) => {}
                    Some((_, first)) => {
                        return Err(KernelTableError::SharedName {
                            segment: name.clone(),
                            first: first.clone(),
                            statement: launch.label.clone(),
                        })
                    }
                    None => {
                        named.insert(name.clone(), (launch.fusion.clone(), launch.label.clone()));
                    }
                }
                table.add(&launch)?;
            }
        }
        Ok(table)
    }

    /// Plans `launch` unless the table holds its segment on its layouts already, or it
    /// launches nothing (every output empty).
    pub fn add(&mut self, launch: &MeteredLaunch) -> Result<(), KernelTableError> {
        let segment = &launch.fusion.name;
        if launch.outputs.iter().all(|o| o.sizes.contains(&0))
            || self.get(segment, &launch.inputs, &launch.outputs).is_some()
        {
            return Ok(());
        }
        let plan = codegen::plan(
            &launch.fusion,
            &kernel_name(segment),
            &launch.inputs,
            &launch.outputs,
            self.sms,
        )
        .map_err(|error| KernelTableError::Plan {
            statement: launch.label.clone(),
            error,
        })?;
        self.insert(KernelEntry {
            statement: launch.label.clone(),
            segment: segment.clone(),
            inputs: launch.inputs.clone(),
            outputs: launch.outputs.clone(),
            plan,
        });
        Ok(())
    }

    /// The distinct sum reduce-scatters and allreduces `rank` posts (none for a rank the table
    /// was not made for).
    pub fn reductions(&self, rank: usize) -> &[ReductionShape] {
        self.reductions.get(rank).map_or(&[], Vec::as_slice)
    }

    /// The most bytes of buffers `rank` holds at once when it runs the program (its uploaded
    /// inputs and every allocation, as the meter counts them); 0 for a rank the table was not
    /// made for.
    pub fn peak_bytes(&self, rank: usize) -> u64 {
        self.peaks.get(rank).copied().unwrap_or(0)
    }

    /// The distinct GEMMs `rank` issues, in the order it first issues them (none for a rank
    /// the table was not made for).
    pub fn gemms(&self, rank: usize) -> &[MeteredGemm] {
        self.gemms.get(rank).map_or(&[], Vec::as_slice)
    }

    /// Adds `entry`, replacing the one of the same segment and layouts if there is one.
    pub fn insert(&mut self, entry: KernelEntry) {
        let at = self.find(&entry.segment, &entry.inputs, &entry.outputs);
        match at {
            Some(i) => self.entries[i] = entry,
            None => {
                self.by_segment
                    .entry(entry.segment.clone())
                    .or_default()
                    .push(self.entries.len());
                self.entries.push(entry);
            }
        }
    }

    /// The ranks the table was planned for.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The pool size (`numberOfStreams`) the table was planned for.
    pub fn streams(&self) -> usize {
        self.streams
    }

    /// The SM count its grids are sized for (at least 1).
    pub fn sms(&self) -> usize {
        self.sms
    }

    /// Every plan, in the order the ranks first launch them.
    pub fn entries(&self) -> &[KernelEntry] {
        &self.entries
    }

    /// The index (into [`KernelTable::entries`]) of the plan of `segment` on these layouts.
    pub fn find(
        &self,
        segment: &str,
        inputs: &[TensorArg],
        outputs: &[TensorArg],
    ) -> Option<usize> {
        self.by_segment.get(segment)?.iter().copied().find(|&i| {
            let e = &self.entries[i];
            e.inputs == inputs && e.outputs == outputs
        })
    }

    /// The plan of `segment` on these layouts.
    pub fn get(
        &self,
        segment: &str,
        inputs: &[TensorArg],
        outputs: &[TensorArg],
    ) -> Option<&KernelEntry> {
        self.find(segment, inputs, outputs)
            .map(|i| &self.entries[i])
    }

    /// The index of the plan that statement `label` launches, `segment` on these layouts, or
    /// the error a launch the table does not hold ends with: [`ExecError::Compute`] naming
    /// the statement, the segment and the layouts.
    pub fn plan_for(
        &self,
        label: &str,
        segment: &str,
        inputs: &[TensorArg],
        outputs: &[TensorArg],
    ) -> Result<usize, ExecError> {
        self.find(segment, inputs, outputs)
            .ok_or_else(|| ExecError::Compute {
                stmt: label.to_string(),
                message: self.missing(segment, inputs, outputs),
            })
    }

    /// Why the table has no plan of `segment` on these layouts.
    fn missing(&self, segment: &str, inputs: &[TensorArg], outputs: &[TensorArg]) -> String {
        let mut m = format!(
            "no kernel plan for these layouts: segment `{segment}`, inputs ({}), outputs ({})",
            layouts_text(inputs),
            layouts_text(outputs)
        );
        let others = self.by_segment.get(segment).map_or(0, Vec::len);
        let _ = match others {
            0 if self.entries.is_empty() => write!(
                m,
                "; the backend's kernel table is empty (plan the program's kernels before it \
                 runs: `Executable::kernel_table`)"
            ),
            0 => write!(
                m,
                "; the kernel table holds no plan of this segment ({} plans of others, for {} \
                 rank(s) and {} pool stream(s))",
                self.entries.len(),
                self.ranks,
                self.streams
            ),
            n => write!(
                m,
                "; the kernel table holds {n} plan(s) of this segment on other layouts (for {} \
                 rank(s) and {} pool stream(s))",
                self.ranks, self.streams
            ),
        };
        m
    }
}
