//! Device memory shared between processes (CUDA IPC) and the stream memory operations that
//! let two GPUs signal each other without the host: a [`SharedRegion`] is `cuMemAlloc`
//! memory whose 64-byte IPC handle another process on the same host opens as a
//! [`PeerRegion`] (a mapping of the same memory into its own address space), and
//! [`GpuStream::write_value`] / [`GpuStream::wait_value`] write and wait on 32-bit flags in
//! such memory in stream order (the v2 stream memory operations, always available since
//! CUDA 12).
//!
//! Stream-ordered allocations ([`Gpu::alloc`]) come from the device's default memory pool,
//! which cannot be exported; a region is a plain `cuMemAlloc` block, allocated once and kept.
#![allow(unsafe_code)]

use cudarc::driver::{result, sys};

use crate::device::{require_driver, Gpu, GpuStream};
use crate::error::{driver, CudaError};

/// The size of a CUDA IPC memory handle.
pub const IPC_HANDLE_BYTES: usize = 64;

/// Device memory of this process that other processes can map: `cuMemAlloc`ed, exported
/// with `cuIpcGetMemHandle`, freed on drop. Drop it only when no stream of this process uses
/// it any more and no other process will touch it again.
pub struct SharedRegion {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    handle: [u8; IPC_HANDLE_BYTES],
    gpu: Gpu,
}

impl std::fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedRegion({:#x}, {} bytes)", self.ptr, self.bytes)
    }
}

impl SharedRegion {
    /// The region's device address in this process.
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The region's size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The IPC handle another process opens with [`Gpu::open_region`].
    pub fn handle(&self) -> [u8; IPC_HANDLE_BYTES] {
        self.handle
    }

    /// `Ok` when `count` 32-bit words from byte `offset` lie inside the region and `offset` is
    /// a multiple of 4, else the error of the driver call `call` that would write them.
    fn check_words(
        &self,
        call: &'static str,
        offset: usize,
        count: usize,
    ) -> Result<(), CudaError> {
        if !offset.is_multiple_of(4) || offset + 4 * count > self.bytes {
            return Err(CudaError::Driver {
                call,
                message: format!(
                    "{count} words at byte {offset} do not fit a region of {} bytes",
                    self.bytes
                ),
            });
        }
        Ok(())
    }

    /// Sets `count` 32-bit words from byte `offset` to `value`, synchronously (set-up only:
    /// no stream may use the region meanwhile).
    pub fn fill_u32(&self, offset: usize, count: usize, value: u32) -> Result<(), CudaError> {
        self.check_words("cuMemsetD32", offset, count)?;
        self.gpu.bind()?;
        // SAFETY: the range lies inside this live `cuMemAlloc` block (checked above); the set
        // is synchronous.
        unsafe { sys::cuMemsetD32_v2(self.ptr + offset as u64, value, count) }
            .result()
            .map_err(driver("cuMemsetD32"))
    }
}

impl SharedRegion {
    /// Sets `count` 32-bit words from byte `offset` to `value` on `stream`, in its order: for
    /// releasing flag waits, since a stream blocked on a flag holds back no other stream.
    pub fn fill_u32_on(
        &self,
        offset: usize,
        count: usize,
        value: u32,
        stream: &GpuStream,
    ) -> Result<(), CudaError> {
        self.check_words("cuMemsetD32Async", offset, count)?;
        self.gpu.bind()?;
        // SAFETY: the range lies inside this live `cuMemAlloc` block (checked above); the
        // stream belongs to this context.
        unsafe { sys::cuMemsetD32Async(self.ptr + offset as u64, value, count, stream.cu_stream()) }
            .result()
            .map_err(driver("cuMemsetD32Async"))
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: `ptr` came from `cuMemAlloc` in this context and is freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Another process's [`SharedRegion`] mapped into this one (`cuIpcOpenMemHandle`, with peer
/// access enabled on first use); unmapped on drop.
pub struct PeerRegion {
    ptr: sys::CUdeviceptr,
    gpu: Gpu,
}

impl std::fmt::Debug for PeerRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PeerRegion({:#x})", self.ptr)
    }
}

impl PeerRegion {
    /// The mapped region's device address in this process.
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }
}

impl Drop for PeerRegion {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: `ptr` came from `cuIpcOpenMemHandle` in this context and is closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}

impl Gpu {
    /// `bytes` of zeroed device memory that other processes on this host can map.
    pub fn alloc_shared(&self, bytes: usize) -> Result<SharedRegion, CudaError> {
        require_driver()?;
        self.bind()?;
        let bytes = bytes.max(1);
        // SAFETY: this GPU's context is current.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(|e| {
            if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                CudaError::OutOfMemory {
                    device: self.ordinal(),
                    requested: bytes,
                    // The context is current: the driver says what this device has left.
                    free: result::mem_get_info().ok().map(|(free, _)| free),
                }
            } else {
                driver("cuMemAlloc")(e)
            }
        })?;
        // From here on the drop frees `ptr`, whatever fails next.
        let mut region = SharedRegion {
            ptr,
            bytes,
            handle: [0; IPC_HANDLE_BYTES],
            gpu: self.clone(),
        };
        // SAFETY: `ptr` holds `bytes` bytes; the set is synchronous.
        unsafe { result::memset_d8_sync(ptr, 0, bytes) }.map_err(driver("cuMemsetD8"))?;
        let mut handle = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
        // SAFETY: `ptr` is the base of a `cuMemAlloc` block of this context; `handle` is an
        // out-pointer to a local.
        unsafe { sys::cuIpcGetMemHandle(handle.as_mut_ptr(), ptr) }
            .result()
            .map_err(driver("cuIpcGetMemHandle"))?;
        // SAFETY: the call above initialized the handle.
        let handle = unsafe { handle.assume_init() };
        for (dst, src) in region.handle.iter_mut().zip(handle.reserved.iter()) {
            *dst = *src as u8;
        }
        Ok(region)
    }

    /// Maps another process's region, given its [`SharedRegion::handle`]. Fails when the
    /// handle comes from this process (map nothing: use the address) or from another host.
    pub fn open_region(&self, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<PeerRegion, CudaError> {
        require_driver()?;
        self.bind()?;
        let mut raw = sys::CUipcMemHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        for (dst, src) in raw.reserved.iter_mut().zip(handle) {
            *dst = *src as _;
        }
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `raw` is a handle made by `cuIpcGetMemHandle` (or garbage, which the driver
        // rejects); `ptr` is an out-pointer to a local.
        unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                raw,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint,
            )
        }
        .result()
        .map_err(driver("cuIpcOpenMemHandle"))?;
        Ok(PeerRegion {
            ptr,
            gpu: self.clone(),
        })
    }
}

impl GpuStream {
    /// Writes `value` to the 32-bit word at `addr` (this GPU's memory, or a peer's mapped
    /// into this process) once the work enqueued on this stream so far is done; the write
    /// comes after a memory fence, so whoever sees the value also sees that work's writes.
    pub fn write_value(&self, addr: sys::CUdeviceptr, value: u32) -> Result<(), CudaError> {
        let _span = tracing::trace_span!(
            "stream_write_value",
            device = self.gpu().ordinal(),
            addr,
            value
        )
        .entered();
        self.gpu().bind()?;
        // SAFETY: callers pass the address of a live, 4-byte aligned word; the stream is
        // live.
        unsafe { sys::cuStreamWriteValue32_v2(self.cu_stream(), addr, value, 0) }
            .result()
            .map_err(driver("cuStreamWriteValue32"))
    }

    /// Holds this stream's later work until the 32-bit word at `addr` reaches `value`, in
    /// the cyclic order `(i32)(word - value) >= 0` (wrapping counters work). The wait runs
    /// on the GPU: the host goes on at once.
    pub fn wait_value(&self, addr: sys::CUdeviceptr, value: u32) -> Result<(), CudaError> {
        let _span = tracing::trace_span!(
            "stream_wait_value",
            device = self.gpu().ordinal(),
            addr,
            value
        )
        .entered();
        self.gpu().bind()?;
        // SAFETY: callers pass the address of a live, 4-byte aligned word; the stream is
        // live.
        unsafe {
            sys::cuStreamWaitValue32_v2(
                self.cu_stream(),
                addr,
                value,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as std::ffi::c_uint,
            )
        }
        .result()
        .map_err(driver("cuStreamWaitValue32"))
    }
}
