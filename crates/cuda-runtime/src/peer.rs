//! Peer-to-peer transfers between GPUs of this process: peer access between their contexts
//! and stream-ordered copies between their memories, done by the copy engines.
//!
//! Two kinds of access matter: context peer access (`cuCtxEnablePeerAccess`, for memory from
//! `cuMemAlloc`, e.g. NCCL's) and the access list of the peer's memory pool
//! (`cuMemPoolSetAccess`, for stream-ordered allocations, i.e. all of [`Gpu::alloc`]'s);
//! [`Gpu::enable_peer_access`] grants both.
//!
//! [`Gpu::copy_peer`] picks its call by what the stream's GPU may access: with access
//! enabled from the stream's GPU to the other GPU of the copy it is a unified-addressing
//! `cuMemcpyAsync`, done directly by the copy engines and capturable into a graph; without
//! it, `cuMemcpyPeerAsync`, which works on any pair but cannot be captured.
#![allow(unsafe_code)]

use std::collections::HashSet;
use std::sync::MutexGuard;

use cudarc::driver::{result, sys};

use crate::device::{require_driver, Gpu, GpuStream};
use crate::error::{driver, CudaError};

impl Gpu {
    /// Whether this GPU can access `peer`'s memory directly (`cuDeviceCanAccessPeer`). A GPU
    /// can always access its own memory.
    pub fn can_access_peer(&self, peer: &Gpu) -> Result<bool, CudaError> {
        require_driver()?;
        if self.ordinal() == peer.ordinal() {
            return Ok(true);
        }
        let mut can: std::ffi::c_int = 0;
        // SAFETY: both device handles come from live contexts; `can` is an out-pointer to a
        // local.
        unsafe {
            sys::cuDeviceCanAccessPeer(
                &mut can,
                self.context().cu_device(),
                peer.context().cu_device(),
            )
        }
        .result()
        .map_err(driver("cuDeviceCanAccessPeer"))?;
        Ok(can != 0)
    }

    /// Makes `peer`'s memory accessible from this GPU: context peer access and read-write
    /// access to `peer`'s default memory pool (where [`Gpu::alloc`] allocates), so kernels
    /// and copies enqueued on this GPU's streams can read and write it directly. Access is
    /// one-directional: enable it both ways for transfers ordered on either GPU's streams.
    /// Idempotent, and cheap once enabled through this handle or a clone of it (the handle
    /// remembers it); the same GPU needs nothing. Fails with [`CudaError::Unavailable`] when
    /// the pair has no peer-to-peer path.
    pub fn enable_peer_access(&self, peer: &Gpu) -> Result<(), CudaError> {
        require_driver()?;
        let peer_ordinal = peer.ordinal();
        if self.ordinal() == peer_ordinal {
            return Ok(());
        }
        if self.peers_enabled().contains(&peer_ordinal) {
            return Ok(());
        }
        if !self.can_access_peer(peer)? {
            return Err(CudaError::Unavailable(format!(
                "GPU {} cannot access the memory of GPU {peer_ordinal}: no peer-to-peer path \
                 between them",
                self.ordinal()
            )));
        }
        self.bind()?;
        // Stream-ordered allocations (all of this crate's) are governed by their pool's
        // access list, not by context peer access: grant this GPU access to the peer's pool.
        // SAFETY: the device handle comes from the peer's live context.
        let pool = unsafe { result::device::get_default_mem_pool(peer.context().cu_device()) }
            .map_err(driver("cuDeviceGetDefaultMemPool"))?;
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                // From CUDA 13.2 the device id is a member of a union.
                #[cfg(not(any(
                    feature = "cuda-13020",
                    feature = "cuda-13030",
                    feature = "cuda-13040"
                )))]
                id: self.context().cu_device(),
                #[cfg(any(
                    feature = "cuda-13020",
                    feature = "cuda-13030",
                    feature = "cuda-13040"
                ))]
                __bindgen_anon_1: sys::CUmemLocation_st__bindgen_ty_1 {
                    id: self.context().cu_device(),
                },
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the pool belongs to the live peer device; `access` is one descriptor on
        // the stack.
        unsafe { sys::cuMemPoolSetAccess(pool, &access, 1) }
            .result()
            .map_err(driver("cuMemPoolSetAccess"))?;
        // SAFETY: this GPU's context is current and `peer`'s context is alive (held by
        // `peer`); the flags must be 0.
        let status = unsafe { sys::cuCtxEnablePeerAccess(peer.context().cu_ctx(), 0) };
        match enable_outcome(status) {
            Ok(()) => {}
            Err(sys::CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED) => {
                return Err(CudaError::Unavailable(format!(
                    "GPU {} cannot access the memory of GPU {peer_ordinal}: peer access is not \
                     supported between them",
                    self.ordinal()
                )))
            }
            Err(code) => {
                return Err(driver("cuCtxEnablePeerAccess")(
                    cudarc::driver::DriverError(code),
                ))
            }
        }
        self.peers_enabled().insert(peer_ordinal);
        Ok(())
    }

    /// Copies `bytes` bytes from `src` on `src_gpu` to `dst` on this GPU, ordered on
    /// `stream` (after the work enqueued there so far; later work there sees the data). The
    /// stream may belong to either GPU; every other stream that touches `src` or `dst` must
    /// be ordered around it by events. `bytes == 0` does nothing.
    ///
    /// When the stream's GPU has enabled access to the other GPU of the copy
    /// ([`Gpu::enable_peer_access`] on the stream's GPU handle or a clone of it), the copy is
    /// a unified-addressing `cuMemcpyAsync`, done directly by the copy engines over NVLink or
    /// PCIe, and can be captured into a graph ([`GpuStream::capture`]). Otherwise it is a
    /// `cuMemcpyPeerAsync`, which works between any two GPUs but not while capturing (it
    /// fails then, and the error says which access to enable).
    pub fn copy_peer(
        &self,
        dst: sys::CUdeviceptr,
        src_gpu: &Gpu,
        src: sys::CUdeviceptr,
        bytes: usize,
        stream: &GpuStream,
    ) -> Result<(), CudaError> {
        require_driver()?;
        if bytes == 0 {
            return Ok(());
        }
        let on = stream.gpu();
        let route = {
            let enabled = on.peers_enabled();
            copy_route(self.ordinal(), src_gpu.ordinal(), on.ordinal(), |peer| {
                enabled.contains(&peer)
            })
        };
        on.bind()?;
        let status = match route {
            // SAFETY: both GPUs' contexts are alive (held by `self` and `src_gpu`), so their
            // addresses are valid in the unified address space, and the stream's GPU may
            // access both; the stream is alive while borrowed; callers pass ranges of at
            // least `bytes` bytes inside live allocations of the two GPUs.
            Route::Unified => unsafe { sys::cuMemcpyAsync(dst, src, bytes, stream.cu_stream()) },
            // SAFETY: as above, with the contexts named explicitly.
            Route::Peer => unsafe {
                sys::cuMemcpyPeerAsync(
                    dst,
                    self.context().cu_ctx(),
                    src,
                    src_gpu.context().cu_ctx(),
                    bytes,
                    stream.cu_stream(),
                )
            },
        };
        status.result().map_err(|e| {
            let call = match route {
                Route::Unified => "cuMemcpyAsync",
                Route::Peer => "cuMemcpyPeerAsync",
            };
            let mut message = format!(
                "peer copy of {bytes} bytes from GPU {} to GPU {} on a stream of GPU {}: {e:?}",
                src_gpu.ordinal(),
                self.ordinal(),
                on.ordinal()
            );
            if route == Route::Peer && e.0 == sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED {
                let other = if on.ordinal() == self.ordinal() {
                    src_gpu.ordinal()
                } else {
                    self.ordinal()
                };
                message.push_str(&format!(
                    "; to copy between GPUs while capturing, enable peer access from GPU {} \
                     to GPU {other} first (Gpu::enable_peer_access, outside the capture)",
                    on.ordinal()
                ));
            }
            CudaError::Driver { call, message }
        })
    }

    /// The set of peers whose memory this context can access, recovered if a holder
    /// panicked (the set stays valid: it is only ever inserted into).
    fn peers_enabled(&self) -> MutexGuard<'_, HashSet<usize>> {
        self.inner()
            .peers_enabled
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// How a copy between GPUs is issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// `cuMemcpyAsync` on unified addresses: direct, capturable; needs the stream's GPU to
    /// access both sides.
    Unified,
    /// `cuMemcpyPeerAsync`: works on any pair, not capturable.
    Peer,
}

/// The route of a copy from GPU `src` to GPU `dst` ordered on a stream of GPU `on`, where
/// `enabled(peer)` says whether GPU `on` has been granted access to `peer`'s memory: direct
/// when GPU `on` can reach both sides.
fn copy_route(dst: usize, src: usize, on: usize, enabled: impl Fn(usize) -> bool) -> Route {
    let reachable = |gpu: usize| gpu == on || enabled(gpu);
    if reachable(dst) && reachable(src) {
        Route::Unified
    } else {
        Route::Peer
    }
}

/// The outcome of `cuCtxEnablePeerAccess`: access that was already enabled is success.
fn enable_outcome(status: sys::CUresult) -> Result<(), sys::CUresult> {
    match status {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            Ok(())
        }
        code => Err(code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{device_count, Priority};

    #[test]
    fn already_enabled_peer_access_is_success() {
        use sys::CUresult as R;
        assert_eq!(enable_outcome(R::CUDA_SUCCESS), Ok(()));
        assert_eq!(
            enable_outcome(R::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED),
            Ok(())
        );
        assert_eq!(
            enable_outcome(R::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED),
            Err(R::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)
        );
        assert_eq!(
            enable_outcome(R::CUDA_ERROR_TOO_MANY_PEERS),
            Err(R::CUDA_ERROR_TOO_MANY_PEERS)
        );
    }

    #[test]
    fn copies_are_direct_only_where_the_streams_gpu_reaches_both_sides() {
        let none = |_: usize| false;
        let only_1 = |gpu: usize| gpu == 1;
        // Within one GPU, on its own stream.
        assert_eq!(copy_route(0, 0, 0, none), Route::Unified);
        // From GPU 1 to GPU 0 on a stream of GPU 0, then on one of GPU 1.
        assert_eq!(copy_route(0, 1, 0, none), Route::Peer);
        assert_eq!(copy_route(0, 1, 0, only_1), Route::Unified);
        assert_eq!(copy_route(0, 1, 1, only_1), Route::Peer);
        assert_eq!(copy_route(0, 1, 1, |gpu| gpu == 0), Route::Unified);
        // From GPU 0 to GPU 1 on a stream of GPU 0.
        assert_eq!(copy_route(1, 0, 0, only_1), Route::Unified);
        // A third GPU's stream needs access to both sides.
        assert_eq!(copy_route(0, 1, 2, only_1), Route::Peer);
        assert_eq!(copy_route(0, 1, 2, |gpu| gpu < 2), Route::Unified);
        // Within GPU 1 on a stream of GPU 0.
        assert_eq!(copy_route(1, 1, 0, none), Route::Peer);
        assert_eq!(copy_route(1, 1, 0, only_1), Route::Unified);
    }

    #[test]
    fn without_a_driver_nothing_opens() {
        if let Err(e) = device_count() {
            assert!(matches!(
                e,
                CudaError::Unavailable(_) | CudaError::Driver { .. }
            ));
            assert!(Gpu::open(0).is_err());
            assert!(Gpu::open(1).is_err());
        }
    }

    /// On a machine with GPUs: peer access is idempotent, and a copy from GPU 1 (or GPU 0
    /// itself on a single-GPU machine) lands on GPU 0.
    #[test]
    fn peer_copy_on_gpus() {
        let count = match device_count() {
            Ok(n) if n > 0 => n,
            _ => return,
        };
        let timeout = std::time::Duration::from_secs(60);
        let g0 = Gpu::open(0).unwrap();
        let g1 = Gpu::open(count.min(2) - 1).unwrap();
        assert!(g0.can_access_peer(&g0).unwrap());
        g0.enable_peer_access(&g0).unwrap();
        let s0 = g0.new_stream(Priority::Normal).unwrap();
        let s1 = g1.new_stream(Priority::High).unwrap();
        let src = g1.alloc(4096, &s1).unwrap();
        let dst = g0.alloc(4096, &s0).unwrap();
        let data: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
        g1.upload(src.ptr(), &data, &s1).unwrap();
        g0.upload(dst.ptr(), &[0u8; 4096], &s0).unwrap();
        g0.copy_peer(dst.ptr(), &g1, src.ptr(), 0, &s0).unwrap();
        // Before peer access: cuMemcpyPeerAsync.
        g0.copy_peer(dst.ptr(), &g1, src.ptr(), 2048, &s0).unwrap();
        if g0.can_access_peer(&g1).unwrap() {
            g0.enable_peer_access(&g1).unwrap();
            g0.enable_peer_access(&g1).unwrap();
            g1.enable_peer_access(&g0).unwrap();
        }
        // After it: a direct copy.
        g0.copy_peer(dst.ptr() + 2048, &g1, src.ptr() + 2048, 2048, &s0)
            .unwrap();
        let mut host = vec![0u8; 4096];
        g0.download(&mut host, dst.ptr(), &s0, timeout).unwrap();
        assert_eq!(host, data);
        // The other way round, ordered on the source GPU's stream.
        g0.zero(dst.ptr(), 1024, &s0).unwrap();
        g1.copy_peer(src.ptr(), &g0, dst.ptr(), 1024, &s0).unwrap();
        s0.synchronize_timeout(timeout).unwrap();
        g1.download(&mut host, src.ptr(), &s1, timeout).unwrap();
        assert!(host[..1024].iter().all(|&x| x == 0));
        assert_eq!(host[1024..], data[1024..]);
        src.free_on(&s1).unwrap();
        dst.free_on(&s0).unwrap();
        s0.synchronize_timeout(timeout).unwrap();
        s1.synchronize_timeout(timeout).unwrap();
    }
}
