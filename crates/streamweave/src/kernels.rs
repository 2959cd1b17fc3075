//! An executable's generated kernels, chosen before it runs: its kernel table
//! ([`Executable::kernel_table`], one per rank count, pool size and SM count, made once)
//! holds the plan
//! of every launch of every rank ([`KernelTable::for_program`]: each rank's program on the
//! meter backend, each distinct segment and layout planned by the code generator). GPU runs
//! hand the table to their CUDA backends, which launch what it holds; `weave dump` prints it
//! after the host program ([`print_plans`]) and `weave dump --kernels` prints its CUDA C
//! ([`print_kernels`]).

use std::fmt::Write as _;
use std::sync::Arc;

use weave_executor::kernels::{grid_text, layout_text, layouts_text};
pub use weave_executor::kernels::{KernelEntry, KernelTable, KernelTableError};

use crate::executable::Executable;

impl Executable {
    /// The kernel table of this program on `ranks` ranks with `streams` pool streams
    /// ([`RunOptions::streams`](crate::RunOptions::streams): the strides of a buffer of chunk
    /// slots depend on it), for GPUs of `sms` SMs: the plan of every kernel launch of every
    /// rank, one entry per distinct segment and layout (the chunks of a loop that share a
    /// shape share one; an uneven split's other shapes have their own). Made once per
    /// `(ranks, streams, sms)` and shared by clones of the executable. An error names the
    /// statement whose kernel the code generator cannot plan.
    pub fn kernel_table(
        &self,
        ranks: usize,
        streams: usize,
        sms: usize,
    ) -> Result<Arc<KernelTable>, KernelTableError> {
        // Held while planning: ranks that ask at once plan once.
        let mut tables = self.kernel_tables.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = tables.get(&(ranks, streams, sms)) {
            return Ok(t.clone());
        }
        let table = Arc::new(KernelTable::for_program(
            self.program(),
            ranks,
            streams,
            sms,
        )?);
        tables.insert((ranks, streams, sms), table.clone());
        Ok(table)
    }
}

/// The plans as `//` comment lines, printed after a host program (which parses back with
/// them): a header with the rank count, pool size and SM count, then one line per plan: its
/// statement, segment and layouts, its temporaries, and each kernel's name and grid.
pub fn print_plans(table: &KernelTable) -> String {
    let mut s = format!(
        "// Kernel plans: {} for {} rank(s) and {} pool stream(s), grids for {} SMs\n",
        table.entries().len(),
        table.ranks(),
        table.streams(),
        table.sms()
    );
    for k in table.entries() {
        let temps: Vec<String> = k
            .plan
            .temps
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(d, n)| format!("{d}[{n}]"))
            .collect();
        let kernels: Vec<String> = k
            .plan
            .launches
            .iter()
            .map(|l| format!("{} ({})", l.name, grid_text(&l.grid, table.sms())))
            .collect();
        let _ = writeln!(
            s,
            "// `{}`: segment `{}`, inputs ({}), outputs ({}); temporaries ({}); kernels {}",
            k.statement,
            k.segment,
            layouts_text(&k.inputs),
            layouts_text(&k.outputs),
            temps.join(", "),
            kernels.join(", ")
        );
    }
    s
}

/// The kernels as text: per plan, its statement and layouts, then each kernel's grid,
/// alignment needs and CUDA C (the scalar fallback after it, when there is one).
pub fn print_kernels(table: &KernelTable) -> String {
    let sms = table.sms();
    let mut s = String::new();
    for k in table.entries() {
        let _ = writeln!(s, "// ===== segment `{}` at `{}`", k.segment, k.statement);
        for (i, a) in k.inputs.iter().enumerate() {
            let _ = writeln!(s, "//   input {i}: {}", layout_text(a));
        }
        for (i, a) in k.outputs.iter().enumerate() {
            let _ = writeln!(s, "//   output {i}: {}", layout_text(a));
        }
        for (i, (d, n)) in k.plan.temps.iter().enumerate() {
            // A temporary of no elements was replaced by an output.
            if *n > 0 {
                let _ = writeln!(s, "//   temporary {i}: {d}[{n}]");
            }
        }
        for l in &k.plan.launches {
            let _ = writeln!(
                s,
                "// kernel `{}`: {}; parameters {:?}",
                l.name,
                grid_text(&l.grid, sms),
                l.args
            );
            if !l.align.is_empty() {
                let _ = writeln!(
                    s,
                    "//   vector accesses need (parameter, bytes) aligned: {:?}; otherwise the \
                     fallback below runs",
                    l.align
                );
            }
            s.push_str(&l.source);
            if let Some(f) = &l.fallback {
                let _ = writeln!(
                    s,
                    "// fallback of `{}` (one element per iteration):",
                    l.name
                );
                s.push_str(&f.source);
            }
        }
    }
    s
}
