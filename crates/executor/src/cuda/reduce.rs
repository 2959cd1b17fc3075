//! The reductions of copy-engine reduce-scatters and allreduces ([`weave_comm::Reducer`]):
//! the kernel generator's column sum of a `[blocks, n]` scratch buffer into `[n]` (the
//! blocks added in order, in `float` — `double` for f64 — and rounded once), planned once
//! per element type, block count and length, and scratch memory ordered on the posting
//! stream. A copy-engine collective then takes the SMs of this one memory-bound kernel per
//! post instead of NCCL's CTAs for the whole transfer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use weave_comm::{CommError, DataType, Reducer, SumKernel};
use weave_cuda::{Gpu, GpuStream};
use weave_ir::DType;

use super::codegen::{self, Buf, TensorArg};
use super::Planned;
use crate::cpu::ir_dtype;

/// The block sums of one GPU (see the module documentation).
pub struct BlockSums {
    gpu: Gpu,
    plans: PlanCache,
    /// The pointwise sums of `k` separate vectors, by element type, `k` and length.
    sums: PlanCache,
}

impl BlockSums {
    /// The block sums of `gpu`.
    pub fn new(gpu: Gpu) -> BlockSums {
        BlockSums {
            gpu,
            plans: Mutex::new(HashMap::new()),
            sums: Mutex::new(HashMap::new()),
        }
    }

    /// The generated kernel that adds `k` vectors of `n` elements of `dtype` in order (in
    /// `float` for 16-bit types, rounded once).
    fn planned_sum(&self, dtype: DType, k: usize, n: usize) -> Result<Arc<Planned>, String> {
        cached(&self.sums, (dtype, k, n), || {
            let fusion = weave_ir::text::parse(&pointer_sum_source(dtype, k, n), &[])
                .map_err(|d| d.to_string())?;
            let arg = TensorArg {
                dtype,
                sizes: vec![n],
                strides: vec![1],
            };
            let inputs = vec![arg.clone(); k];
            let sms = self.gpu.sm_count().max(1) as usize;
            let plan = codegen::plan(&fusion, "weave_pointer_sum", &inputs, &[arg], sms)
                .map_err(|e| e.to_string())?;
            Ok(Planned::new(Arc::new(fusion), plan))
        })
    }

    /// The generated kernels that sum `blocks` blocks of `n` elements of `dtype`.
    fn planned(&self, dtype: DType, blocks: usize, n: usize) -> Result<Arc<Planned>, String> {
        cached(&self.plans, (dtype, blocks, n), || {
            let source = format!(
                "fusion weave_block_sum(b = {blocks}, n = {n}) {{\n  tensor x: {dtype}[b, n]\n  y = sum(x, [0])\n  output y\n}}\n"
            );
            let fusion = weave_ir::text::parse(&source, &[]).map_err(|d| d.to_string())?;
            let input = TensorArg {
                dtype,
                sizes: vec![blocks, n],
                strides: vec![n, 1],
            };
            let output = TensorArg {
                dtype,
                sizes: vec![n],
                strides: vec![1],
            };
            let sms = self.gpu.sm_count().max(1) as usize;
            let plan = codegen::plan(&fusion, "weave_block_sum", &[input], &[output], sms)
                .map_err(|e| e.to_string())?;
            Ok(Planned::new(Arc::new(fusion), plan))
        })
    }
}

/// The plans of generated reductions, by element type and two sizes.
type PlanCache = Mutex<HashMap<(DType, usize, usize), Arc<Planned>>>;

/// The plan of `key` in `cache`, made by `make` on first use and kept.
fn cached(
    cache: &PlanCache,
    key: (DType, usize, usize),
    make: impl FnOnce() -> Result<Arc<Planned>, String>,
) -> Result<Arc<Planned>, String> {
    let lock = || cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = lock().get(&key).cloned() {
        return Ok(p);
    }
    let planned = make()?;
    lock().insert(key, planned.clone());
    Ok(planned)
}

/// The fusion that adds `k` vectors `x0 … x{k-1}` of `n` elements in order: 16-bit types
/// are cast to `f32` first and the sum rounded once.
fn pointer_sum_source(dtype: DType, k: usize, n: usize) -> String {
    let wide = matches!(dtype, DType::BF16 | DType::F16);
    let mut s = format!("fusion weave_pointer_sum(n = {n}) {{\n");
    for i in 0..k {
        s += &format!("  tensor x{i}: {dtype}[n]\n");
    }
    let term = |i: usize| {
        if wide {
            format!("c{i}")
        } else {
            format!("x{i}")
        }
    };
    if wide {
        for i in 0..k {
            s += &format!("  c{i} = cast(x{i}, f32)\n");
        }
    }
    let mut acc = term(0);
    for i in 1..k {
        let name = if i + 1 == k && !wide {
            "y".to_string()
        } else {
            format!("a{i}")
        };
        s += &format!("  {name} = add({acc}, {})\n", term(i));
        acc = name;
    }
    if wide {
        s += &format!("  y = cast({acc}, {dtype})\n");
    }
    s += "  output y\n}\n";
    s
}

fn failed(what: &str, message: String) -> CommError {
    CommError::Backend {
        op: what.to_string(),
        message,
    }
}

impl Reducer<GpuStream> for BlockSums {
    fn with_scratch(
        &self,
        bytes: usize,
        stream: &GpuStream,
        f: &mut dyn FnMut(u64) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        let scratch = self
            .gpu
            .alloc(bytes.max(1), stream)
            .map_err(|e| failed("copy-engine scratch", e.to_string()))?;
        let enqueued = f(scratch.ptr());
        let freed = scratch
            .free_on(stream)
            .map_err(|e| failed("copy-engine scratch", e.to_string()));
        enqueued.and(freed)
    }

    fn sum_blocks(
        &self,
        out: u64,
        src: u64,
        blocks: usize,
        n: usize,
        dtype: DataType,
        stream: &GpuStream,
    ) -> Result<(), CommError> {
        let what = "copy-engine reduction";
        if !self.reduces(dtype) {
            return Err(failed(what, format!("no reduction kernel for {dtype:?}")));
        }
        let planned = self
            .planned(ir_dtype(dtype), blocks, n)
            .map_err(|m| failed(what, m))?;
        let temps = planned
            .plan
            .temps
            .iter()
            .map(|(d, k)| self.gpu.alloc(k * crate::dense::elem_bytes(*d), stream))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| failed(what, e.to_string()))?;
        let address = |b: &Buf| match b {
            Buf::Input(_) => src,
            Buf::Output(_) => out,
            Buf::Temp(i) => temps[*i].ptr(),
        };
        let launched = planned
            .launch_on(&self.gpu, &address, stream)
            .map_err(|e| failed(what, e.to_string()));
        for t in temps {
            t.free_on(stream).map_err(|e| failed(what, e.to_string()))?;
        }
        launched
    }

    fn sum_pointers(
        &self,
        out: u64,
        srcs: &[u64],
        n: usize,
        dtype: DataType,
        stream: &GpuStream,
    ) -> Result<(), CommError> {
        let what = "copy-engine reduction";
        if !self.reduces(dtype) || srcs.len() < 2 {
            return Err(failed(
                what,
                format!("no sum of {} {dtype:?} vector(s)", srcs.len()),
            ));
        }
        if n == 0 {
            return Ok(());
        }
        let planned = self
            .planned_sum(ir_dtype(dtype), srcs.len(), n)
            .map_err(|m| failed(what, m))?;
        if !planned.plan.temps.is_empty() {
            return Err(failed(what, "the pointwise sum needs scratch".into()));
        }
        let address = |b: &Buf| match b {
            Buf::Input(i) => srcs[*i],
            Buf::Output(_) => out,
            Buf::Temp(_) => 0,
        };
        planned
            .launch_on(&self.gpu, &address, stream)
            .map_err(|e| failed(what, e.to_string()))
    }

    fn reduces(&self, dtype: DataType) -> bool {
        matches!(
            dtype,
            DataType::Bf16 | DataType::F16 | DataType::F32 | DataType::F64
        )
    }

    /// Plans the kernel, compiles and loads it on this GPU: what `sum_pointers` or
    /// `sum_blocks` will launch for it then loads nothing.
    fn load(&self, kernel: SumKernel) -> Result<(), CommError> {
        let what = "copy-engine reduction";
        let (dtype, planned) = match kernel {
            SumKernel::Pointers { dtype, k, n } => (dtype, self.planned_sum(ir_dtype(dtype), k, n)),
            SumKernel::Blocks { dtype, blocks, n } => {
                (dtype, self.planned(ir_dtype(dtype), blocks, n))
            }
        };
        if !self.reduces(dtype) {
            return Err(failed(what, format!("no reduction kernel for {dtype:?}")));
        }
        planned
            .map_err(|m| failed(what, m))?
            .load_on(&self.gpu)
            .map_err(|e| failed(what, e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block sum is a column sum the kernel generator plans for every float type, at
    /// block counts and lengths a world produces (no GPU needed to plan).
    #[test]
    fn block_sums_plan_as_generated_column_sums() {
        for dtype in [DType::BF16, DType::F16, DType::F32, DType::F64] {
            for (blocks, n) in [(2, 1), (4, 8192 * 2048), (3, 1000), (8, 7)] {
                let source = format!(
                    "fusion weave_block_sum(b = {blocks}, n = {n}) {{\n  tensor x: {dtype}[b, n]\n  y = sum(x, [0])\n  output y\n}}\n"
                );
                let fusion = weave_ir::text::parse(&source, &[]).unwrap();
                let arg = |sizes: Vec<usize>, strides: Vec<usize>| TensorArg {
                    dtype,
                    sizes,
                    strides,
                };
                let plan = codegen::plan(
                    &fusion,
                    "weave_block_sum",
                    &[arg(vec![blocks, n], vec![n, 1])],
                    &[arg(vec![n], vec![1])],
                    132,
                )
                .unwrap();
                assert!(!plan.launches.is_empty());
                assert_eq!(fusion.outputs().len(), 1);
            }
        }
    }
}

#[cfg(test)]
mod pointer_sum_tests {
    use super::*;

    /// The sum of separate vectors is one generated pointwise kernel without scratch, for
    /// every float type and the team sizes of one host.
    #[test]
    fn pointer_sums_plan_as_one_pointwise_kernel_without_scratch() {
        for dtype in [DType::BF16, DType::F16, DType::F32, DType::F64] {
            for (k, n) in [(2, 1), (3, 1000), (4, 4 << 20), (8, 7)] {
                let fusion = weave_ir::text::parse(&pointer_sum_source(dtype, k, n), &[])
                    .unwrap_or_else(|d| panic!("{dtype} k={k}: {d}"));
                let arg = TensorArg {
                    dtype,
                    sizes: vec![n],
                    strides: vec![1],
                };
                let plan = codegen::plan(
                    &fusion,
                    "weave_pointer_sum",
                    &vec![arg.clone(); k],
                    &[arg],
                    132,
                )
                .unwrap();
                assert_eq!(plan.launches.len(), 1, "{dtype} k={k}");
                assert!(plan.temps.is_empty());
                let args = &plan.launches[0].args;
                for i in 0..k {
                    assert!(args.contains(&Buf::Input(i)), "{dtype} k={k}: x{i} is read");
                }
                assert!(args.contains(&Buf::Output(0)));
            }
        }
    }
}
