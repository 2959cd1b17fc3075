//! One GPU: its context, a stream pool with priorities, events, and a stream-ordered caching
//! allocator over the device's memory pool.
//!
//! cudarc's safe layer is used for the context, streams and events; memory is managed as
//! raw device pointers (`cuMemAllocAsync` / `cuMemFreeAsync` on the device's default memory
//! pool, whose release threshold is raised so that freed blocks stay cached: a steady-state
//! loop never reaches `cudaMalloc`). cudarc's per-buffer event tracking is never used, so
//! the only ordering between streams is the one the host program asks for.
#![allow(unsafe_code)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};

use crate::error::{driver, CudaError};
use crate::gemm::{GemmOperands, GemmShape, LtHandle, PlanCache};
use crate::nvrtc::{Kernel, KernelCache};

/// Whether the CUDA driver library can be loaded and how many GPUs it sees. Never panics:
/// a missing library is [`CudaError::Unavailable`].
pub fn device_count() -> Result<usize, CudaError> {
    ask_for_hardware_queues();
    // SAFETY: `is_culib_present` only tries to dlopen the driver library.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::Unavailable(
            "the CUDA driver library (libcuda.so) cannot be loaded; check LD_LIBRARY_PATH".into(),
        ));
    }
    result::init().map_err(driver("cuInit"))?;
    let n = CudaContext::device_count().map_err(driver("cuDeviceGetCount"))?;
    Ok(n.max(0) as usize)
}

/// Fails with [`CudaError::Unavailable`] when the CUDA driver library cannot be loaded. The
/// probe runs once per process; entry points on objects that already exist call it so that
/// no raw driver symbol is ever resolved (which panics) without a loadable library.
pub(crate) fn require_driver() -> Result<(), CudaError> {
    // Before the driver starts: it reads the variable then.
    ask_for_hardware_queues();
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to dlopen the driver library.
    if *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() }) {
        Ok(())
    } else {
        Err(CudaError::Unavailable(
            "the CUDA driver library (libcuda.so) cannot be loaded; check LD_LIBRARY_PATH".into(),
        ))
    }
}

/// How urgent a stream's work is. Communication streams get the highest priority so that
/// their (short) kernels are scheduled ahead of queued GEMM blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Priority {
    /// The default priority.
    Normal,
    /// The greatest priority the device offers.
    High,
}

/// What a GPU's memory pool holds ([`Gpu::pool_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolBytes {
    /// Device memory the pool has taken from the device (`RESERVED_MEM_CURRENT`).
    pub reserved: u64,
    /// Of that, what live allocations use (`USED_MEM_CURRENT`).
    pub used: u64,
}

/// One GPU of this process. Cheap to clone.
#[derive(Clone)]
pub struct Gpu {
    inner: Arc<GpuInner>,
}

pub(crate) struct GpuInner {
    ctx: Arc<CudaContext>,
    ordinal: usize,
    /// (least, greatest) priority as CUDA numbers them (greatest is the smaller number).
    priorities: (i32, i32),
    /// Pointers whose last handle was dropped without an explicit stream-ordered free; freed
    /// at the next [`Gpu::synchronize`], when no stream can still use them.
    deferred: Mutex<Vec<Ptr>>,
    next_allocation: AtomicU64,
    live: AtomicU64,
    kernels: KernelCache,
    gemm_plans: PlanCache,
    /// Ordinals of the GPUs whose memory this context can already access (see
    /// [`Gpu::enable_peer_access`]).
    pub(crate) peers_enabled: Mutex<HashSet<usize>>,
    sm_count: i32,
    /// The device's default memory pool, which [`Gpu::alloc`] allocates from.
    pool: Pool,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({})", self.inner.ordinal)
    }
}

/// The variable through which CUDA takes the number of hardware queues ("connections") a
/// device's streams are spread over (8 unless set, at most 32).
pub const MAX_CONNECTIONS_VAR: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// The hardware queues asked for when [`MAX_CONNECTIONS_VAR`] is unset: the most CUDA gives.
pub const MAX_CONNECTIONS: u32 = 32;

/// Sets [`MAX_CONNECTIONS_VAR`] to [`MAX_CONNECTIONS`] unless it is set, once, before the
/// first context of this process is made (later contexts keep what the first one read).
///
/// Streams share hardware queues, and a stream waiting on a flag (the copy-engine windows,
/// [`GpuStream::wait_value`]) holds up every stream queued behind it in its queue: with the
/// default 8, a rank's posting, side and NCCL streams alias, and a wait can hold up the push
/// its peer waits for while the peer does the same — a deadlock. A value the user set is
/// kept.
pub fn ask_for_hardware_queues() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        if std::env::var_os(MAX_CONNECTIONS_VAR).is_none() {
            // Before any context exists; the variable is read by the driver when the first
            // context is made.
            std::env::set_var(MAX_CONNECTIONS_VAR, MAX_CONNECTIONS.to_string());
        }
    });
}

impl Gpu {
    /// Opens GPU `ordinal` (its primary context).
    pub fn open(ordinal: usize) -> Result<Gpu, CudaError> {
        ask_for_hardware_queues();
        let count = device_count()?;
        if ordinal >= count {
            return Err(CudaError::Unavailable(format!(
                "GPU {ordinal} was asked for but {count} GPU(s) are visible"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: called before any slice is allocated through cudarc; this crate allocates
        // raw pointers only, so cudarc's tracking would never apply anyway.
        unsafe { ctx.disable_event_tracking() };
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let priorities = {
            let (mut least, mut greatest) = (0, 0);
            // SAFETY: out-pointers to locals.
            unsafe { sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) }
                .result()
                .map_err(driver("cuCtxGetStreamPriorityRange"))?;
            (least, greatest)
        };
        // SAFETY: the device handle comes from the live context.
        let pool = unsafe { result::device::get_default_mem_pool(ctx.cu_device()) }
            .map_err(driver("cuDeviceGetDefaultMemPool"))?;
        let mut threshold: u64 = u64::MAX;
        // SAFETY: the attribute takes a cuuint64_t, passed by pointer to a local.
        unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold) as *mut u64 as *mut std::ffi::c_void,
            )
        }
        .result()
        .map_err(driver("cuMemPoolSetAttribute"))?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("cuDeviceGetAttribute"))?;
        Ok(Gpu {
            inner: Arc::new(GpuInner {
                ctx,
                ordinal,
                priorities,
                deferred: Mutex::new(Vec::new()),
                next_allocation: AtomicU64::new(1),
                live: AtomicU64::new(0),
                kernels: Default::default(),
                gemm_plans: Default::default(),
                peers_enabled: Mutex::new(HashSet::new()),
                sm_count,
                pool: Pool(pool),
            }),
        })
    }

    pub(crate) fn inner(&self) -> &GpuInner {
        &self.inner
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The device memory a new allocation can have, in bytes: what the driver reports free
    /// plus what the memory pool holds cached but unused; `None` when the driver does not say.
    pub fn available_bytes(&self) -> Option<u64> {
        self.bind().ok()?;
        let (free, _) = result::mem_get_info().ok()?;
        let cached = self
            .pool_bytes()
            .map_or(0, |p| p.reserved.saturating_sub(p.used));
        Some((free as u64).saturating_add(cached))
    }

    /// What this GPU's memory pool (where [`Gpu::alloc`] allocates) holds now; `None` when
    /// the driver does not say.
    pub fn pool_bytes(&self) -> Option<PoolBytes> {
        self.bind().ok()?;
        let attr = |a: sys::CUmemPool_attribute| -> Option<u64> {
            let mut v: u64 = 0;
            // SAFETY: both attributes take a cuuint64_t, read into a local; the pool is the
            // live context's default pool.
            unsafe {
                sys::cuMemPoolGetAttribute(
                    self.inner.pool.0,
                    a,
                    (&mut v) as *mut u64 as *mut std::ffi::c_void,
                )
            }
            .result()
            .ok()?;
            Some(v)
        };
        Some(PoolBytes {
            reserved: attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            used: attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
        })
    }

    /// Grows the memory pool, ahead, so that it holds at least `bytes` it does not lend
    /// out: one allocation of what is missing, freed on `stream` at once and waited for
    /// (within `timeout`). The pool keeps freed memory (its release threshold is raised), so
    /// allocations of up to that many bytes in all are then served without growing it.
    ///
    /// Growing the pool maps new memory for every GPU granted access to it
    /// ([`Gpu::enable_peer_access`]), inside the driver, while the allocating thread holds
    /// its locks; mid-run, with ranks that are threads of one process and a GPU waiting on
    /// another rank's flag, that rank's thread can wait behind those locks while this one
    /// waits for it. A run reserves its rank's peak before its first statement
    /// (the executor's `KernelTable::peak_bytes`, from its meter).
    ///
    /// Returns the bytes the pool grew by: 0 when it held enough already, or when the
    /// device has too little memory left for the reservation (the run then allocates as it
    /// goes, and fails with [`CudaError::OutOfMemory`] should it need more than there is).
    pub fn reserve_pool(
        &self,
        bytes: u64,
        stream: &GpuStream,
        timeout: Duration,
    ) -> Result<u64, CudaError> {
        let Some(before) = self.pool_bytes() else {
            return Ok(0);
        };
        let idle = before.reserved.saturating_sub(before.used);
        if idle >= bytes {
            return Ok(0);
        }
        let missing = usize::try_from(bytes - idle).unwrap_or(usize::MAX);
        let block = match self.alloc(missing, stream) {
            Ok(block) => block,
            Err(CudaError::OutOfMemory { .. }) => return Ok(0),
            Err(e) => return Err(e),
        };
        block.free_on(stream)?;
        stream.synchronize_timeout(timeout)?;
        let after = self.pool_bytes().unwrap_or(before);
        Ok(after.reserved.saturating_sub(before.reserved))
    }

    /// The number of streaming multiprocessors.
    pub fn sm_count(&self) -> i32 {
        self.inner.sm_count
    }

    /// The device name, e.g. `NVIDIA H200`.
    pub fn name(&self) -> String {
        self.inner
            .ctx
            .name()
            .unwrap_or_else(|_| "unknown GPU".into())
    }

    /// The cudarc context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }

    /// Makes this GPU's context current on the calling thread.
    pub fn bind(&self) -> Result<(), CudaError> {
        self.inner
            .ctx
            .bind_to_thread()
            .map_err(driver("cuCtxSetCurrent"))
    }

    /// A new non-blocking stream.
    pub fn new_stream(&self, priority: Priority) -> Result<GpuStream, CudaError> {
        self.bind()?;
        let p = match priority {
            Priority::Normal => self.inner.priorities.0,
            Priority::High => self.inner.priorities.1,
        };
        let stream = self
            .inner
            .ctx
            .new_stream_with_priority(p)
            .map_err(driver("cuStreamCreateWithPriority"))?;
        Ok(GpuStream {
            stream,
            gpu: self.clone(),
            lt: Arc::new(OnceLock::new()),
        })
    }

    /// A new event; `timing` events can measure elapsed time.
    pub fn new_event(&self, timing: bool) -> Result<CudaEvent, CudaError> {
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        self.inner
            .ctx
            .new_event(Some(flags))
            .map_err(driver("cuEventCreate"))
    }

    /// `bytes` of device memory, ordered on `stream`: usable by work enqueued on `stream`
    /// from now on (and by other streams once they are ordered after it).
    pub fn alloc(&self, bytes: usize, stream: &GpuStream) -> Result<Arc<DeviceMemory>, CudaError> {
        self.bind()?;
        let ptr = if bytes == 0 {
            0
        } else {
            // SAFETY: the stream belongs to this context, which is current.
            unsafe { result::malloc_async(stream.cu_stream(), bytes) }.map_err(|e| {
                if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                    CudaError::OutOfMemory {
                        device: self.inner.ordinal,
                        requested: bytes,
                        // The context is current: the driver says what this device has left.
                        free: result::mem_get_info().ok().map(|(free, _)| free),
                    }
                } else {
                    driver("cuMemAllocAsync")(e)
                }
            })?
        };
        self.inner.live.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(DeviceMemory {
            ptr,
            bytes,
            id: self.inner.next_allocation.fetch_add(1, Ordering::Relaxed),
            freed: AtomicBool::new(false),
            gpu: self.clone(),
        }))
    }

    /// Memory that somebody else allocated and owns (a PyTorch tensor's storage), seen as a
    /// [`DeviceMemory`] that is never freed: dropping it or [`DeviceMemory::free_on`] leaves
    /// the memory alone, and it does not count as a live allocation.
    ///
    /// # Safety
    ///
    /// `ptr` must be the start of `bytes` bytes of device memory of this GPU's context (the
    /// primary context, which PyTorch uses too), and stay allocated until every stream that
    /// work using it was enqueued on has finished that work.
    pub unsafe fn borrow(&self, ptr: sys::CUdeviceptr, bytes: usize) -> Arc<DeviceMemory> {
        Arc::new(DeviceMemory {
            ptr,
            bytes,
            id: self.inner.next_allocation.fetch_add(1, Ordering::Relaxed),
            // Already "freed": neither `free_on` nor the drop frees or uncounts it.
            freed: AtomicBool::new(true),
            gpu: self.clone(),
        })
    }

    /// Device allocations made by [`Gpu::alloc`] and not yet freed.
    pub fn live_allocations(&self) -> usize {
        self.inner.live.load(Ordering::Relaxed) as usize
    }

    /// Frees memory whose last handle was dropped. Call it only when every stream that may
    /// have used such memory is idle (after synchronizing them).
    pub fn collect(&self) {
        self.free_deferred();
    }

    fn free_deferred(&self) {
        let ptrs = std::mem::take(&mut *self.inner.deferred.lock().unwrap());
        for Ptr(p) in ptrs {
            // SAFETY: the device is idle (called after a context synchronize) and nothing
            // holds `p` any more.
            let _ = unsafe { result::free_sync(p) };
        }
    }

    /// Makes this device current, then runs `op` unless the operation has nothing to move
    /// (`empty`).
    fn bound_unless_empty(
        &self,
        empty: bool,
        op: impl FnOnce() -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        self.bind()?;
        if empty {
            return Ok(());
        }
        op()
    }

    /// Copies `bytes` from host memory to `dst` on `stream` and waits for it.
    pub fn upload(
        &self,
        dst: sys::CUdeviceptr,
        src: &[u8],
        stream: &GpuStream,
    ) -> Result<(), CudaError> {
        self.bound_unless_empty(src.is_empty(), || {
            // SAFETY: `dst` holds at least `src.len()` bytes (callers allocate it so); the
            // copy is waited for before `src` can go away.
            unsafe {
                result::memcpy_htod_async(dst, src, stream.cu_stream())
                    .map_err(driver("cuMemcpyHtoDAsync"))?;
            }
            stream.synchronize_timeout(Duration::from_secs(600))
        })
    }

    /// Copies `dst.len()` bytes from device address `src` into host memory, after the work
    /// enqueued on `stream` so far, waiting at most `timeout`.
    pub fn download(
        &self,
        dst: &mut [u8],
        src: sys::CUdeviceptr,
        stream: &GpuStream,
        timeout: Duration,
    ) -> Result<(), CudaError> {
        self.bind()?;
        if dst.is_empty() {
            return stream.synchronize_timeout(timeout);
        }
        // SAFETY: `src` holds at least `dst.len()` bytes; the copy is waited for before
        // `dst` is released to the caller.
        unsafe {
            result::memcpy_dtoh_async(dst, src, stream.cu_stream())
                .map_err(driver("cuMemcpyDtoHAsync"))?;
        }
        stream.synchronize_timeout(timeout)
    }

    /// Copies `bytes` bytes from `src` to `dst` (both on this device) on `stream`.
    pub fn copy(
        &self,
        dst: sys::CUdeviceptr,
        src: sys::CUdeviceptr,
        bytes: usize,
        stream: &GpuStream,
    ) -> Result<(), CudaError> {
        self.bound_unless_empty(bytes == 0, || {
            // SAFETY: callers pass ranges inside live allocations.
            unsafe { result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }
                .map_err(driver("cuMemcpyDtoDAsync"))
        })
    }

    /// Copies `height` rows of `width` bytes from `src`, whose rows start `src_pitch` bytes
    /// apart, to `dst`, whose rows start `dst_pitch` bytes apart (both on this device), on
    /// `stream`: a strided box into a contiguous one, or back.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_2d(
        &self,
        dst: sys::CUdeviceptr,
        dst_pitch: usize,
        src: sys::CUdeviceptr,
        src_pitch: usize,
        width: usize,
        height: usize,
        stream: &GpuStream,
    ) -> Result<(), CudaError> {
        self.bound_unless_empty(width == 0 || height == 0, || {
            let copy = sys::CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                srcHost: std::ptr::null(),
                srcDevice: src,
                srcArray: std::ptr::null_mut(),
                srcPitch: src_pitch,
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstHost: std::ptr::null_mut(),
                dstDevice: dst,
                dstArray: std::ptr::null_mut(),
                dstPitch: dst_pitch,
                WidthInBytes: width,
                Height: height,
            };
            // SAFETY: callers pass boxes inside live allocations; the descriptor is read when the
            // copy is enqueued.
            unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream.cu_stream()) }
                .result()
                .map_err(driver("cuMemcpy2DAsync"))
        })
    }

    /// Fills `bytes` bytes at `dst` with zeros on `stream`.
    pub fn zero(
        &self,
        dst: sys::CUdeviceptr,
        bytes: usize,
        stream: &GpuStream,
    ) -> Result<(), CudaError> {
        self.bound_unless_empty(bytes == 0, || {
            // SAFETY: callers pass a range inside a live allocation.
            unsafe { result::memset_d8_async(dst, 0, bytes, stream.cu_stream()) }
                .map_err(driver("cuMemsetD8Async"))
        })
    }
}

// Generated kernels ([`crate::nvrtc`]) and GEMMs ([`crate::gemm`]), through the caches each
// GPU owns: compiled kernels and GEMM plans here, a cuBLASLt handle per stream.
impl Gpu {
    /// The kernel `name` defined (as `extern "C" __global__`) in `source`, compiled on first
    /// use and cached for the life of the process.
    pub fn kernel(&self, name: &str, source: &str) -> Result<Arc<Kernel>, CudaError> {
        self.inner
            .kernels
            .get(&self.inner.ctx, || self.bind(), name, source)
    }

    /// How many kernels this GPU has compiled (cache misses).
    pub fn kernels_compiled(&self) -> usize {
        self.inner.kernels.compiled()
    }

    /// Launches `kernel` on `stream` with `grid` blocks of `block` threads; `args` are the
    /// kernel's parameters in order, each a 64-bit value (`unsigned long long` or `long
    /// long` in the source: device addresses and sizes).
    ///
    /// The caller guarantees that the arguments match the kernel's signature and that every
    /// address covers what the kernel touches.
    pub fn launch(
        &self,
        stream: &GpuStream,
        kernel: &Kernel,
        grid: u32,
        block: u32,
        args: &[u64],
    ) -> Result<(), CudaError> {
        kernel.launch(stream.cuda_stream(), grid, block, args)
    }

    /// How many GEMM shapes this GPU has planned (each shape's first GEMM plans it).
    pub fn gemm_plans(&self) -> usize {
        self.inner.gemm_plans.len()
    }

    /// Makes `stream`'s cuBLASLt handle and its workspace now, if it has none yet (a stream's
    /// first GEMM would otherwise: a synchronous allocation, which a run must not make once
    /// its GPU may wait on a peer). Fails as that first GEMM would.
    pub fn prepare_gemms(&self, stream: &GpuStream) -> Result<(), CudaError> {
        self.lt_handle(stream).map(|_| ())
    }

    /// `stream`'s cuBLASLt handle, made on first use.
    fn lt_handle<'s>(&self, stream: &'s GpuStream) -> Result<&'s LtHandle, CudaError> {
        stream
            .lt
            .get_or_init(|| LtHandle::new(|| self.bind()))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Enqueues `shape` on `stream` with the given operands. The first call of a shape picks
    /// the algorithm; later calls reuse it.
    pub fn gemm(
        &self,
        stream: &GpuStream,
        shape: &GemmShape,
        ops: GemmOperands,
    ) -> Result<(), CudaError> {
        let handle = self.lt_handle(stream)?;
        self.bind()?;
        self.inner
            .gemm_plans
            .enqueue(handle, stream.cu_stream(), shape, ops)
    }
}

/// A device address kept for a deferred free.
struct Ptr(sys::CUdeviceptr);

/// A device's default memory pool handle.
struct Pool(sys::CUmemoryPool);

// SAFETY: a pool handle is a driver object usable from any thread of the process; it is only
// passed to the driver.
unsafe impl Send for Pool {}
// SAFETY: as above; the driver synchronizes access to the pool.
unsafe impl Sync for Pool {}

/// A block of device memory. Freed stream-ordered by [`DeviceMemory::free_on`], or, when the
/// last handle is dropped without that, at the next device synchronization.
pub struct DeviceMemory {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    id: u64,
    freed: AtomicBool,
    gpu: Gpu,
}

impl std::fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceMemory(#{}, {} bytes)", self.id, self.bytes)
    }
}

impl DeviceMemory {
    /// The device address.
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// A number unique among this process's allocations on this GPU.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The GPU it lives on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Returns the memory to the pool once the work enqueued on `stream` so far is done.
    /// Every other stream that used it must already be ordered before that point.
    pub fn free_on(&self, stream: &GpuStream) -> Result<(), CudaError> {
        if self.freed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.gpu.inner.live.fetch_sub(1, Ordering::Relaxed);
        if self.ptr == 0 {
            return Ok(());
        }
        self.gpu.bind()?;
        // SAFETY: the pointer came from cuMemAllocAsync on this device and is freed once.
        unsafe { result::free_async(self.ptr, stream.cu_stream()) }
            .map_err(driver("cuMemFreeAsync"))
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if !self.freed.swap(true, Ordering::AcqRel) {
            self.gpu.inner.live.fetch_sub(1, Ordering::Relaxed);
            if self.ptr != 0 {
                self.gpu.inner.deferred.lock().unwrap().push(Ptr(self.ptr));
            }
        }
    }
}

/// A stream that another library made and owns (PyTorch's current stream), by its handle:
/// [`GpuStream::wait_foreign`] and [`GpuStream::signal_foreign`] order work against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForeignStream(sys::CUstream);

// SAFETY: a stream handle is a plain driver object, usable from any thread of the process.
unsafe impl Send for ForeignStream {}
// SAFETY: as above; the handle is never written through.
unsafe impl Sync for ForeignStream {}

impl ForeignStream {
    /// The stream whose handle is `handle` (`cudaStream_t` as an integer, 0 for the legacy
    /// default stream).
    ///
    /// # Safety
    ///
    /// `handle` must be 0 or a stream of a GPU's primary context that stays alive while the
    /// value is used.
    pub unsafe fn new(handle: u64) -> ForeignStream {
        ForeignStream(handle as usize as sys::CUstream)
    }

    /// The handle.
    pub fn handle(&self) -> u64 {
        self.0 as usize as u64
    }
}

/// A stream of one GPU, with its own cuBLASLt handle (created on first GEMM).
#[derive(Clone)]
pub struct GpuStream {
    stream: Arc<CudaStream>,
    gpu: Gpu,
    pub(crate) lt: Arc<OnceLock<Result<LtHandle, CudaError>>>,
}

impl std::fmt::Debug for GpuStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuStream({:?})", self.stream.cu_stream())
    }
}

impl GpuStream {
    /// Whether this stream's cuBLASLt handle exists ([`Gpu::prepare_gemms`], or its first
    /// GEMM).
    pub fn gemms_prepared(&self) -> bool {
        self.lt.get().is_some_and(|h| h.is_ok())
    }

    /// The raw stream handle, for NCCL and cuBLASLt calls.
    pub fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// The cudarc stream.
    pub fn cuda_stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The GPU it belongs to.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Records `event` here.
    pub fn record(&self, event: &CudaEvent) -> Result<(), CudaError> {
        event.record(&self.stream).map_err(driver("cuEventRecord"))
    }

    /// Makes this stream wait for `event` without blocking the host.
    pub fn wait(&self, event: &CudaEvent) -> Result<(), CudaError> {
        let _span =
            tracing::trace_span!("stream_wait_event", device = self.gpu.ordinal()).entered();
        self.stream.wait(event).map_err(driver("cuStreamWaitEvent"))
    }

    /// Makes this stream wait, without blocking the host, for the work enqueued so far on
    /// `other`, a stream of the same GPU that another library made. `event` (of this GPU)
    /// is recorded there for it: an event may serve call after call.
    pub fn wait_foreign(&self, other: &ForeignStream, event: &CudaEvent) -> Result<(), CudaError> {
        self.gpu.bind()?;
        // SAFETY: the event is live; `ForeignStream::new`'s caller vouched for the stream.
        unsafe { sys::cuEventRecord(event.cu_event(), other.0) }
            .result()
            .map_err(driver("cuEventRecord"))?;
        self.wait(event)
    }

    /// Makes the stream `other` of another library wait, without blocking the host, for the
    /// work enqueued on this stream so far, recording `event` (of this GPU) here for it.
    pub fn signal_foreign(
        &self,
        other: &ForeignStream,
        event: &CudaEvent,
    ) -> Result<(), CudaError> {
        self.gpu.bind()?;
        self.record(event)?;
        // SAFETY: the event is live and recorded; `ForeignStream::new`'s caller vouched for
        // the stream.
        unsafe { sys::cuStreamWaitEvent(other.0, event.cu_event(), 0) }
            .result()
            .map_err(driver("cuStreamWaitEvent"))
    }

    /// Blocks the host until the work enqueued so far is done, for at most `timeout`.
    pub fn synchronize_timeout(&self, timeout: Duration) -> Result<(), CudaError> {
        let _span =
            tracing::debug_span!("stream_synchronize", device = self.gpu.ordinal()).entered();
        let event = self.gpu.new_event(false)?;
        self.record(&event)?;
        wait_event(&event, timeout, || None)
    }
}

/// Blocks the host until `event` has happened, polling; every poll also asks `check` for an
/// asynchronous error (a communicator's, say) and stops with it. After `timeout` it fails
/// with [`CudaError::Timeout`].
pub fn wait_event(
    event: &CudaEvent,
    timeout: Duration,
    mut check: impl FnMut() -> Option<CudaError>,
) -> Result<(), CudaError> {
    let _span =
        tracing::debug_span!("wait_event", timeout_ms = timeout.as_millis() as u64).entered();
    let start = Instant::now();
    let mut backoff = Backoff::new();
    loop {
        match event.try_is_complete() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(driver("cuEventQuery")(e)),
        }
        if let Some(e) = check() {
            return Err(e);
        }
        if start.elapsed() >= timeout {
            return Err(CudaError::Timeout { waited: timeout });
        }
        backoff.pause();
    }
}

/// How a host poll waits between two looks: it spins for the first 200 µs (what it waits for
/// — an event, a non-blocking NCCL post, a peer's offer — is usually microseconds away, and
/// every microsecond the host sleeps may be a microsecond the GPU idles before the next
/// launch), yields until 1.2 ms, then sleeps 50 µs at a time.
#[derive(Clone, Debug)]
pub struct Backoff {
    start: Instant,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::new()
    }
}

impl Backoff {
    /// A backoff whose spinning starts now.
    pub fn new() -> Backoff {
        Backoff {
            start: Instant::now(),
        }
    }

    /// Waits once, as long as the time since [`Backoff::new`] says.
    pub fn pause(&mut self) {
        let waited = self.start.elapsed();
        if waited < Duration::from_micros(200) {
            std::hint::spin_loop();
        } else if waited < Duration::from_micros(1200) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}
