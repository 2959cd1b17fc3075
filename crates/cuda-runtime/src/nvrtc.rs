//! Run-time compiled kernels: CUDA C source compiled by NVRTC for the device's architecture,
//! loaded once per GPU and cached by the kernel's name and source text (never by a hash
//! alone, whose collision would run the wrong kernel), and launched with 64-bit
//! arguments (device addresses and integers).
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use crate::error::{driver, CudaError};

/// A loaded kernel.
#[derive(Clone)]
pub struct Kernel {
    function: CudaFunction,
    name: String,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({})", self.name)
    }
}

/// The kernels of one GPU, by source text, then kernel name (looked up without copying the
/// source on every launch).
#[derive(Default)]
pub(crate) struct KernelCache {
    kernels: Mutex<HashMap<String, HashMap<String, Arc<Kernel>>>>,
    compiles: std::sync::atomic::AtomicUsize,
}

fn arch_name(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (10, _) => "sm_100",
        (9, _) => "sm_90",
        (8, 9) => "sm_89",
        (8, 6) => "sm_86",
        (8, _) => "sm_80",
        (7, 5) => "sm_75",
        _ => "sm_70",
    }
}

impl KernelCache {
    /// The kernel `name` defined in `source`, compiled for `ctx`'s device on first use (with
    /// the context made current by `bind`) and cached for the life of the process.
    pub(crate) fn get(
        &self,
        ctx: &Arc<CudaContext>,
        bind: impl FnOnce() -> Result<(), CudaError>,
        name: &str,
        source: &str,
    ) -> Result<Arc<Kernel>, CudaError> {
        if let Some(k) = self
            .kernels
            .lock()
            .unwrap()
            .get(source)
            .and_then(|by_name| by_name.get(name))
        {
            return Ok(k.clone());
        }
        // SAFETY: probing for the library only dlopens it.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(CudaError::Unavailable(
                "the NVRTC library (libnvrtc.so) cannot be loaded; check LD_LIBRARY_PATH".into(),
            ));
        }
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("cuDeviceGetAttribute"))?;
        let ptx = compile_ptx_with_opts(
            source,
            CompileOptions {
                arch: Some(arch_name(major, minor)),
                options: vec!["--std=c++17".into()],
                ..Default::default()
            },
        )
        .map_err(|e| CudaError::Compile {
            kernel: name.to_string(),
            log: format!("{e:?}\n--- source ---\n{source}"),
        })?;
        bind()?;
        let _span = tracing::debug_span!("module_load", kernel = name).entered();
        let module = ctx.load_module(ptx).map_err(driver("cuModuleLoadData"))?;
        let function = module
            .load_function(name)
            .map_err(driver("cuModuleGetFunction"))?;
        let kernel = Arc::new(Kernel {
            function,
            name: name.to_string(),
        });
        self.compiles
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.kernels
            .lock()
            .unwrap()
            .entry(source.to_string())
            .or_default()
            .insert(name.to_string(), kernel.clone());
        Ok(kernel)
    }

    /// How many kernels this cache has compiled (cache misses).
    pub(crate) fn compiled(&self) -> usize {
        self.compiles.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Kernel {
    /// Launches this kernel on `stream` with `grid` blocks of `block` threads; `args` are the
    /// kernel's parameters in order, each a 64-bit value (`unsigned long long` or `long
    /// long` in the source: device addresses and sizes).
    ///
    /// The caller guarantees that the arguments match the kernel's signature and that every
    /// address covers what the kernel touches.
    pub(crate) fn launch(
        &self,
        stream: &Arc<CudaStream>,
        grid: u32,
        block: u32,
        args: &[u64],
    ) -> Result<(), CudaError> {
        if grid == 0 {
            return Ok(());
        }
        let mut launch = stream.launch_builder(&self.function);
        for a in args {
            launch.arg(a);
        }
        // SAFETY: see the doc comment: the generated kernels take exactly `args.len()` 64-bit
        // parameters, and the addresses are live allocations of this GPU.
        unsafe {
            launch.launch(LaunchConfig {
                grid_dim: (grid, 1, 1),
                block_dim: (block, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map(|_| ())
        .map_err(driver("cuLaunchKernel"))
    }
}
