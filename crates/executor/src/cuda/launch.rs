//! Kernel segments on the CUDA backend: the backend launches the plans of the kernel table
//! it was given ([`CudaBackend::with_kernels`]), looked up by the segment's name and its
//! buffers' layouts, and plans nothing itself (a launch the table does not hold is an error
//! naming the statement and the layouts). Each plan's kernels are compiled with NVRTC on
//! first use (the GPU caches them by name and source text) and kept per entry, so a launch
//! does not look its source up again. [`Planned::launch_on`] also launches the
//! backend's own reductions (`reduce`).

use std::sync::{Arc, OnceLock};

use weave_cuda::{DeviceMemory, Gpu, GpuStream};
use weave_ir::Fusion;

use super::codegen::{Buf, KernelPlan, TensorArg};
use super::{CudaBackend, DeviceTensor};
use crate::backend::{Backend, StreamKey};
use crate::dense::elem_bytes;
use crate::error::ExecError;
use crate::kernels::KernelTable;
use crate::meter::{GemmOperand, MeteredGemm};

/// Each launch's kernel and scalar fallback of a plan, once loaded.
type Loaded = Vec<[OnceLock<Arc<weave_cuda::Kernel>>; 2]>;

/// A plan's loaded-kernel slots, none loaded yet.
fn unloaded(plan: &KernelPlan) -> Loaded {
    plan.launches.iter().map(|_| Default::default()).collect()
}

/// A plan of the backend's own (a reduction of `reduce`), with each launch's kernel (and
/// fallback) once loaded.
pub(super) struct Planned {
    _fusion: Arc<Fusion>,
    pub(super) plan: KernelPlan,
    loaded: Loaded,
}

impl Planned {
    /// Launches the plan's kernels on `stream`, their buffers at `address`, the grids sized
    /// for `gpu`'s SM count.
    pub(super) fn launch_on(
        &self,
        gpu: &Gpu,
        address: &dyn Fn(&Buf) -> u64,
        stream: &GpuStream,
    ) -> Result<(), ExecError> {
        let sms = usize::try_from(gpu.sm_count()).unwrap_or(1).max(1);
        launch_plan(gpu, &self.plan, &self.loaded, address, stream, sms)
    }

    /// Loads every kernel of the plan (each launch's and its fallback) on `gpu`, launching
    /// nothing: see [`load_plan`].
    pub(super) fn load_on(&self, gpu: &Gpu) -> Result<(), ExecError> {
        load_plan(gpu, &self.plan, &self.loaded)
    }

    /// `plan` of `fusion`, none of its kernels loaded yet.
    pub(super) fn new(fusion: Arc<Fusion>, plan: KernelPlan) -> Arc<Planned> {
        let loaded = unloaded(&plan);
        Arc::new(Planned {
            _fusion: fusion,
            plan,
            loaded,
        })
    }
}

/// Launches the kernels of `plan` on `stream`, their buffers at `address` (each kernel's
/// variant chosen by the addresses' alignment, loaded into `loaded` on first use), their
/// grids sized for `sms` SMs.
fn launch_plan(
    gpu: &Gpu,
    plan: &KernelPlan,
    loaded: &Loaded,
    address: &dyn Fn(&Buf) -> u64,
    stream: &GpuStream,
    sms: usize,
) -> Result<(), ExecError> {
    for (l, loaded) in plan.launches.iter().zip(loaded) {
        let addresses: Vec<u64> = l.args.iter().map(address).collect();
        let chosen = l.for_addresses(&addresses);
        let slot = &loaded[usize::from(!std::ptr::eq(chosen, l))];
        let Some((grid, block)) = chosen.grid.dims(sms) else {
            continue;
        };
        let k = match slot.get() {
            Some(k) => k.clone(),
            None => {
                let k = gpu.kernel(&chosen.name, &chosen.source)?;
                let _ = slot.set(k.clone());
                k
            }
        };
        let args: Vec<u64> = chosen.args.iter().map(address).collect();
        gpu.launch(stream, &k, grid, block, &args)?;
    }
    Ok(())
}

/// Compiles and loads every kernel of `plan` (each launch's and its fallback, since the
/// buffers' alignment chooses between them only at the launch) into `loaded`, launching
/// nothing. A run loads its kernels before it starts: loading a module can wait for the
/// whole GPU, and mid-run the GPU may wait on another rank (a collective, a copy-engine
/// flag) whose thread waits for this load in the driver.
fn load_plan(gpu: &Gpu, plan: &KernelPlan, loaded: &Loaded) -> Result<(), ExecError> {
    for (l, slots) in plan.launches.iter().zip(loaded) {
        for (variant, slot) in std::iter::once(l).chain(l.fallback.as_deref()).zip(slots) {
            if slot.get().is_none() {
                let _ = slot.set(gpu.kernel(&variant.name, &variant.source)?);
            }
        }
    }
    Ok(())
}

/// The kernel table a backend launches from, with each entry's kernels once loaded.
pub(super) struct Kernels {
    table: Arc<KernelTable>,
    /// The rank of the table this backend runs.
    rank: usize,
    loaded: Vec<Loaded>,
}

impl Kernels {
    /// `table`, none of its kernels loaded yet.
    pub(super) fn new(table: Arc<KernelTable>, rank: usize) -> Kernels {
        let loaded = table.entries().iter().map(|e| unloaded(&e.plan)).collect();
        Kernels {
            table,
            rank,
            loaded,
        }
    }

    /// An empty table: a backend's before [`CudaBackend::with_kernels`].
    pub(super) fn none() -> Kernels {
        Kernels::new(Arc::new(KernelTable::new(0, 0, 1)), 0)
    }
}

impl CudaBackend {
    /// This backend, launching the kernel segments of a program from `table` as its rank
    /// `rank`: the plans of every launch of every rank, made before the program runs
    /// (`streamweave::Executable::kernel_table`; [`KernelTable::for_program`]). Grids are
    /// sized for the table's SM count. A backend without a table (one that only runs
    /// GEMMs, copies and communications) fails any kernel segment, naming the statement.
    pub fn with_kernels(mut self, table: Arc<KernelTable>, rank: usize) -> CudaBackend {
        self.kernels = Kernels::new(table, rank);
        self
    }

    /// What a run calls before its first statement: compiles and loads every kernel of its
    /// table (each launch's and its scalar fallback); makes every stream the program can
    /// post on (the main stream and the table's pool) with its cuBLASLt handle and
    /// workspace; grows the GPU's memory pool to the rank's peak
    /// ([`KernelTable::peak_bytes`], [`weave_cuda::Gpu::reserve_pool`]); and launches each
    /// distinct GEMM of the rank once ([`KernelTable::gemms`]), waiting for them.
    ///
    /// Loading a module, the synchronous allocation of a stream's first GEMM, a GEMM
    /// kernel's first launch and the growth of a memory pool that peers may access can each
    /// wait for the whole GPU or hold the driver's locks, and mid-run the GPU may wait on
    /// another rank (a collective, a copy-engine flag) whose thread waits in the driver
    /// behind that call: with ranks that are threads of one process, each then waits for
    /// the other.
    pub fn load_kernels(&self) -> Result<(), ExecError> {
        let table = &self.kernels.table;
        let peak = table.peak_bytes(self.kernels.rank);
        let _span = tracing::debug_span!(
            "load_kernels",
            plans = self.kernels.loaded.len(),
            streams = table.streams(),
            rank = self.kernels.rank,
            peak_bytes = peak
        )
        .entered();
        for (entry, loaded) in table.entries().iter().zip(&self.kernels.loaded) {
            load_plan(&self.gpu, &entry.plan, loaded)?;
        }
        let pool = (0..table.streams()).map(StreamKey::Pool);
        for key in std::iter::once(StreamKey::Main).chain(pool) {
            let stream = self.stream(key)?;
            self.gpu.prepare_gemms(&stream)?;
        }
        let main = self.stream(StreamKey::Main)?;
        let grew = self.gpu.reserve_pool(peak, &main, self.options.timeout)?;
        tracing::debug!(
            peak_bytes = peak,
            grew_bytes = grew,
            pool = ?self.gpu.pool_bytes(),
            "memory pool reserved for the rank's peak"
        );
        self.warm_gemms()
    }

    /// Launches each distinct GEMM of the rank ([`KernelTable::gemms`]) once, on its stream,
    /// on scratch operands of its layouts (their values are whatever the memory held; the
    /// product is thrown away), and waits for them: a GEMM shape's first launch in a process
    /// (cuBLASLt's set-up of its kernel) can wait for the whole GPU, which must not happen
    /// once the GPU may wait on another rank (the MLP block's first copy-engine run on
    /// 2 × H200 stalled in its first `linear`, docs/benchmarks.md).
    fn warm_gemms(&self) -> Result<(), ExecError> {
        let gemms = self.kernels.table.gemms(self.kernels.rank);
        if gemms.is_empty() {
            return Ok(());
        }
        let _span = tracing::debug_span!("warm_gemms", gemms = gemms.len()).entered();
        for g in gemms.iter().flat_map(|g| self.pieces(g)) {
            let stream = self.stream(g.stream)?;
            let operand = |o: &GemmOperand| -> Result<DeviceTensor, ExecError> {
                let whole = self.allocate(o.dtype, &o.full, false, &stream)?;
                whole.boxed(&o.ranges).ok_or_else(|| {
                    ExecError::Program(format!(
                        "a metered GEMM operand's box {:?} does not fit its allocation {:?}",
                        o.ranges, o.full
                    ))
                })
            };
            let a = operand(&g.a)?;
            let b = operand(&g.b)?;
            let out = operand(&g.out)?;
            let bias = g.bias.as_ref().map(operand).transpose()?;
            let label = "a GEMM warmed before the first statement";
            // The accumulating form (beta = 1) is a plan of its own in cuBLASLt's cache.
            let run = self.gemm(
                label,
                &a,
                &b,
                g.linear,
                bias.as_ref(),
                &out,
                g.accumulate,
                &stream,
            );
            for t in [Some(a), Some(b), Some(out), bias].into_iter().flatten() {
                self.deallocate(t, &stream);
            }
            run?;
        }
        self.synchronize()?;
        // The warm-ups leave no ordering behind for the run's first GEMM to wait on.
        self.reset_compute_order();
        Ok(())
    }

    /// The GEMMs a run of this backend launches for metered GEMM `g`: `g` itself; for a
    /// linear computed into a copy-engine communicator's windows, none where this backend
    /// does not produce into windows, else one per piece size its slots cut a block into
    /// ([`MeteredGemm::window_pieces`]).
    fn pieces(&self, g: &MeteredGemm) -> Vec<MeteredGemm> {
        match (g.into_windows, self.options.produce_into_windows) {
            (false, _) => vec![g.clone()],
            (true, false) => Vec::new(),
            (true, true) => g.window_pieces(self.options.produce_slot_bytes),
        }
    }

    /// The kernel table this backend launches from.
    pub fn kernel_table(&self) -> &Arc<KernelTable> {
        &self.kernels.table
    }

    /// Launches the kernel segment `fusion` of statement `label`: its plan from the kernel
    /// table, then its temporaries and kernels on `stream`.
    pub(super) fn launch_segment(
        &self,
        label: &str,
        fusion: &Arc<Fusion>,
        inputs: &[DeviceTensor],
        outputs: &[DeviceTensor],
        stream: &GpuStream,
    ) -> Result<(), ExecError> {
        // A launch on the empty last chunk of an axis that the stream chunks do not divide
        // writes nothing; a grid of zero blocks is not a valid launch. (The kernel table
        // holds no plan for it either.)
        if outputs.iter().all(|o| o.numel() == 0) {
            return Ok(());
        }
        // A kernel that updates an input in place (`acc = acc + sum(chunk)`, a running total
        // of a stream loop) reads a copy of it: generated kernels take their buffers as
        // `__restrict__`. (The meter records the copy's layout, so the table holds its plan.)
        if let Some(i) = inputs
            .iter()
            .position(|i| outputs.iter().any(|o| o.mem.id() == i.mem.id()))
        {
            let original = &inputs[i];
            let copy = self.allocate(original.dtype, &original.sizes(), false, stream)?;
            self.copy(label, original, &copy, stream)?;
            let mut staged = inputs.to_vec();
            staged[i] = copy.clone();
            let launched = self.launch_segment(label, fusion, &staged, outputs, stream);
            self.deallocate(copy, stream);
            return launched;
        }
        // Generated kernels take their buffers as `__restrict__`: an output may share no
        // allocation with an input or another output.
        for (k, o) in outputs.iter().enumerate() {
            let id = o.mem.id();
            if inputs.iter().any(|i| i.mem.id() == id)
                || outputs[k + 1..].iter().any(|p| p.mem.id() == id)
            {
                return Err(ExecError::Compute {
                    stmt: label.to_string(),
                    message: format!(
                        "output {k} of the kernel shares its allocation with another of its \
                         buffers; a kernel's outputs must not overlap its inputs or each other"
                    ),
                });
            }
        }
        let ins: Vec<TensorArg> = inputs.iter().map(DeviceTensor::arg).collect();
        let outs: Vec<TensorArg> = outputs.iter().map(DeviceTensor::arg).collect();
        let table = &self.kernels.table;
        let at = table.plan_for(label, &fusion.name, &ins, &outs)?;
        let plan = &table.entries()[at].plan;
        let loaded = &self.kernels.loaded[at];
        let temps: Vec<Arc<DeviceMemory>> = plan
            .temps
            .iter()
            .map(|(d, n)| self.gpu.alloc(n * elem_bytes(*d), stream))
            .collect::<Result<_, _>>()?;
        let address = |b: &Buf| match b {
            Buf::Input(i) => inputs[*i].ptr(),
            Buf::Output(i) => outputs[*i].ptr(),
            Buf::Temp(i) => temps[*i].ptr(),
        };
        let sms = table.sms();
        self.compute(stream, || {
            self.timed(stream, label, || {
                launch_plan(&self.gpu, plan, loaded, &address, stream, sms)
            })
        })?;
        for t in temps {
            t.free_on(stream)?;
        }
        Ok(())
    }
}
