//! The CUDA C of a program's generated kernels, as the CUDA backend would compile them: the
//! program runs once on the meter backend (rank 0, nothing computed) to see every kernel
//! segment's launches with their buffers' layouts (a stream chunk is a strided view of its
//! buffer), and each distinct launch is planned by the code generator.

use std::fmt::Write as _;

use weave_executor::cuda::codegen::{self, Grid, KernelPlan, TensorArg};

use crate::executable::Executable;
use crate::run::RunError;

/// The kernels of one distinct launch of a kernel segment.
#[derive(Clone, Debug)]
pub struct KernelSource {
    /// The first host statement that launches it, as printed.
    pub statement: String,
    /// The segment's name.
    pub segment: String,
    /// Its inputs' layouts.
    pub inputs: Vec<TensorArg>,
    /// Its outputs' layouts.
    pub outputs: Vec<TensorArg>,
    /// The code generator's plan: temporaries and kernels.
    pub plan: KernelPlan,
}

impl Executable {
    /// The generated kernels of rank 0 of `ranks`, for a GPU of `sms` SMs, one entry per
    /// distinct segment and layout (the chunks of a loop that share a shape share one).
    pub fn kernel_sources(&self, ranks: usize, sms: usize) -> Result<Vec<KernelSource>, RunError> {
        let meter = crate::chunks::meter(self.program(), ranks)?;
        let mut out: Vec<KernelSource> = Vec::new();
        for l in meter.launches {
            let seen = out.iter().any(|k| {
                k.segment == l.fusion.name && k.inputs == l.inputs && k.outputs == l.outputs
            });
            if seen {
                continue;
            }
            let name = format!("weave_kernel_{}", l.fusion.name);
            let plan = codegen::plan(&l.fusion, &name, &l.inputs, &l.outputs, sms)
                .map_err(|m| RunError::Setup(format!("`{}`: {m}", l.label)))?;
            out.push(KernelSource {
                statement: l.label,
                segment: l.fusion.name.clone(),
                inputs: l.inputs,
                outputs: l.outputs,
                plan,
            });
        }
        Ok(out)
    }
}

fn layout(a: &TensorArg) -> String {
    format!("{}{:?} strides {:?}", a.dtype, a.sizes, a.strides)
}

fn grid(g: &Grid, sms: usize) -> String {
    let dims = g.dims(sms).map_or("no launch".to_string(), |(b, t)| {
        format!("{b} blocks of {t} threads")
    });
    match g {
        Grid::Items { n, .. } => format!("{n} items; {dims}"),
        Grid::Rows { rows, .. } => format!("{rows} rows; {dims}"),
        Grid::Blocks { .. } => dims,
    }
}

/// The kernels as text: per launch, its statement and layouts, then each kernel's grid,
/// alignment needs and CUDA C (the scalar fallback after it, when there is one).
pub fn print_kernels(kernels: &[KernelSource], sms: usize) -> String {
    let mut s = String::new();
    for k in kernels {
        let _ = writeln!(s, "// ===== segment `{}` at `{}`", k.segment, k.statement);
        for (i, a) in k.inputs.iter().enumerate() {
            let _ = writeln!(s, "//   input {i}: {}", layout(a));
        }
        for (i, a) in k.outputs.iter().enumerate() {
            let _ = writeln!(s, "//   output {i}: {}", layout(a));
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
                grid(&l.grid, sms),
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
