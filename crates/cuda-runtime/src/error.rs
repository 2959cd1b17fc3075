//! Errors of the CUDA runtime layer.

/// A failure of the CUDA layer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// No usable CUDA driver or device: the library is missing, or no GPU is visible.
    #[error("CUDA is not available: {0}")]
    Unavailable(String),
    /// A driver or runtime call failed.
    #[error("CUDA call `{call}` failed: {message}")]
    Driver {
        /// The failing call (`cuMemAlloc`, `cuStreamWaitEvent`, …).
        call: &'static str,
        /// The driver's error name and description.
        message: String,
    },
    /// A device allocation could not be satisfied.
    #[error(
        "out of device memory: {requested} bytes requested on device {device}, {}",
        free_bytes(.free)
    )]
    OutOfMemory {
        /// The local device index.
        device: usize,
        /// The size of the failed allocation.
        requested: usize,
        /// The device's free memory when the allocation failed, when the driver said.
        free: Option<usize>,
    },
    /// NVRTC rejected a generated kernel.
    #[error("NVRTC failed to compile kernel `{kernel}`: {log}")]
    Compile {
        /// The kernel's name.
        kernel: String,
        /// The compiler log.
        log: String,
    },
    /// The host waited for the device longer than its timeout.
    #[error("the GPU did not finish the enqueued work within {waited:?}")]
    Timeout {
        /// How long the host waited.
        waited: std::time::Duration,
    },
    /// A cuBLASLt call failed or found no algorithm for the problem.
    #[error("cuBLASLt `{call}` failed: {message}")]
    Blas {
        /// The failing call.
        call: &'static str,
        /// The status and problem description.
        message: String,
    },
}

/// Maps a driver error of `call` to [`CudaError::Driver`], for `map_err`.
pub fn driver(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        message: format!("{e:?}"),
    }
}

fn free_bytes(free: &Option<usize>) -> String {
    match free {
        Some(f) => format!("{f} bytes free"),
        None => "free memory unknown".into(),
    }
}
