//! Peer-to-peer transfers between GPUs of this process: peer access between their contexts
//! and stream-ordered copies between their memories, done by the copy engines.
//!
//! [`Gpu::copy_peer`] works with or without peer access; with it enabled
//! ([`Gpu::enable_peer_access`]) the copy goes directly over NVLink or PCIe instead of being
//! staged by the driver.
#![allow(unsafe_code)]

use std::collections::HashSet;
use std::sync::MutexGuard;

use cudarc::driver::sys;

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

    /// Makes `peer`'s memory accessible from this GPU's context (kernels and copies of this
    /// GPU can then read and write it directly). Access is one-directional: enable it both
    /// ways for transfers in both directions. Idempotent and cheap once enabled; the same
    /// GPU needs nothing. Fails with [`CudaError::Unavailable`] when the pair has no
    /// peer-to-peer path.
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
    /// be ordered around it by events. With peer access enabled from this GPU to `src_gpu`
    /// (or the other way round) the copy engines move the data directly; otherwise the
    /// driver stages it. `bytes == 0` does nothing.
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
        stream.gpu().bind()?;
        // SAFETY: both contexts are alive (held by `self` and `src_gpu`), the stream is alive
        // while borrowed, and callers pass ranges of at least `bytes` bytes inside live
        // allocations of the respective GPUs.
        unsafe {
            sys::cuMemcpyPeerAsync(
                dst,
                self.context().cu_ctx(),
                src,
                src_gpu.context().cu_ctx(),
                bytes,
                stream.cu_stream(),
            )
        }
        .result()
        .map_err(driver("cuMemcpyPeerAsync"))
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
        if g0.can_access_peer(&g1).unwrap() {
            g0.enable_peer_access(&g1).unwrap();
            g0.enable_peer_access(&g1).unwrap();
            g1.enable_peer_access(&g0).unwrap();
        }
        let s0 = g0.new_stream(Priority::Normal).unwrap();
        let s1 = g1.new_stream(Priority::High).unwrap();
        let src = g1.alloc(4096, &s1).unwrap();
        let dst = g0.alloc(4096, &s0).unwrap();
        let data: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
        g1.upload(src.ptr(), &data, &s1).unwrap();
        g0.upload(dst.ptr(), &[0u8; 4096], &s0).unwrap();
        g0.copy_peer(dst.ptr(), &g1, src.ptr(), 0, &s0).unwrap();
        g0.copy_peer(dst.ptr(), &g1, src.ptr(), 4096, &s0).unwrap();
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
