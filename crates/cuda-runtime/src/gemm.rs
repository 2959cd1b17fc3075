//! cuBLASLt GEMMs: one handle and workspace per stream, and a plan (descriptors and the
//! chosen algorithm) cached per problem shape, so a steady-state loop pays no heuristic
//! query and creates no descriptor.
//!
//! Problems are stated column-major, as cuBLASLt takes them: `D[m, n] = op(A)[m, k] ·
//! op(B)[k, n] (+ bias[m] added to every column)`, optionally batched with strides. f32
//! uses full-precision FP32 compute unless TF32 is asked for.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::{result as lt, sys as ltsys};
use cudarc::driver::{result, sys};

use crate::error::CudaError;

/// The bytes of workspace each stream's handle gets (the amount cuBLASLt suggests for
/// Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// Element type of a GEMM's operands and result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmType {
    /// bfloat16 operands, FP32 accumulation.
    Bf16,
    /// float16 operands, FP32 accumulation.
    F16,
    /// float32 (FP32 compute, or TF32 when asked).
    F32,
    /// float64.
    F64,
}

/// A GEMM problem, column-major (see the module docs). Leading dimensions and strides are
/// in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmShape {
    /// Element type.
    pub dtype: GemmType,
    /// Rows of D.
    pub m: u64,
    /// Columns of D.
    pub n: u64,
    /// The contraction length.
    pub k: u64,
    /// Whether A is stored transposed (`k × m`).
    pub transa: bool,
    /// Whether B is stored transposed (`n × k`).
    pub transb: bool,
    /// Leading dimension of A as stored.
    pub lda: i64,
    /// Leading dimension of B as stored.
    pub ldb: i64,
    /// Leading dimension of D.
    pub ldd: i64,
    /// Number of problems (1 for a plain GEMM).
    pub batch: i32,
    /// Element stride between the A of consecutive problems.
    pub stride_a: i64,
    /// Element stride between the B of consecutive problems.
    pub stride_b: i64,
    /// Element stride between the D of consecutive problems.
    pub stride_d: i64,
    /// Whether a bias of `m` elements is added to every column.
    pub bias: bool,
    /// Allow TF32 for f32 problems.
    pub tf32: bool,
    /// Ask cuBLASLt to size the kernel for this many SMs (0: the whole GPU), leaving the rest
    /// to concurrent communication kernels.
    pub sm_count: i32,
    /// Add the product to D (`D = A B + D`, beta = 1; C is D) instead of overwriting it.
    pub accumulate: bool,
}

/// The device addresses of one GEMM's operands.
#[derive(Clone, Copy, Debug)]
pub struct GemmOperands {
    /// A.
    pub a: sys::CUdeviceptr,
    /// B.
    pub b: sys::CUdeviceptr,
    /// D (written).
    pub d: sys::CUdeviceptr,
    /// The bias, when the shape has one.
    pub bias: sys::CUdeviceptr,
}

/// A stream's cuBLASLt handle and workspace.
pub(crate) struct LtHandle {
    handle: ltsys::cublasLtHandle_t,
    workspace: sys::CUdeviceptr,
}

// SAFETY: a cuBLASLt handle may be used from any thread; each stream's handle is only used
// for work on that stream, serialised by the evaluator that owns the stream.
unsafe impl Send for LtHandle {}
// SAFETY: as above.
unsafe impl Sync for LtHandle {}

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: created by `LtHandle::new` and destroyed once; the workspace is only used by
        // this handle's work, which the owner has synchronised before dropping the stream.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
            let _ = result::free_sync(self.workspace);
        }
    }
}

impl LtHandle {
    /// A handle and workspace on the GPU that `bind` makes current (called once the library
    /// is known to load).
    pub(crate) fn new(bind: impl FnOnce() -> Result<(), CudaError>) -> Result<LtHandle, CudaError> {
        // SAFETY: probing for the library only dlopens it.
        if !unsafe { ltsys::is_culib_present() } {
            return Err(CudaError::Unavailable(
                "the cuBLASLt library (libcublasLt.so) cannot be loaded; check LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        bind()?;
        let handle = lt::create_handle().map_err(blas("cublasLtCreate"))?;
        // SAFETY: a plain synchronous allocation on the current context.
        let workspace =
            unsafe { result::malloc_sync(WORKSPACE_BYTES) }.map_err(|e| CudaError::Driver {
                call: "cuMemAlloc",
                message: format!("{e:?}"),
            })?;
        Ok(LtHandle { handle, workspace })
    }
}

/// Descriptors and algorithm of one shape.
struct Plan {
    desc: ltsys::cublasLtMatmulDesc_t,
    a: ltsys::cublasLtMatrixLayout_t,
    b: ltsys::cublasLtMatrixLayout_t,
    d: ltsys::cublasLtMatrixLayout_t,
    algo: ltsys::cublasLtMatmulAlgo_t,
}

// SAFETY: descriptors are plain host objects; the plan is only mutated (its bias pointer)
// under the cache entry's mutex.
unsafe impl Send for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created once by `Plan::new`, destroyed once.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.d);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// The plans of one GPU, by shape.
#[derive(Default)]
pub(crate) struct PlanCache {
    plans: Mutex<HashMap<GemmShape, Arc<Mutex<Plan>>>>,
}

fn blas(call: &'static str) -> impl Fn(cudarc::cublaslt::result::CublasError) -> CudaError {
    move |e| CudaError::Blas {
        call,
        message: format!("{e:?}"),
    }
}

fn types(
    dtype: GemmType,
    tf32: bool,
) -> (
    ltsys::cudaDataType,
    ltsys::cublasComputeType_t,
    ltsys::cudaDataType,
) {
    use ltsys::cublasComputeType_t as C;
    use ltsys::cudaDataType as T;
    match dtype {
        GemmType::Bf16 => (T::CUDA_R_16BF, C::CUBLAS_COMPUTE_32F, T::CUDA_R_32F),
        GemmType::F16 => (T::CUDA_R_16F, C::CUBLAS_COMPUTE_32F, T::CUDA_R_32F),
        GemmType::F32 if tf32 => (
            T::CUDA_R_32F,
            C::CUBLAS_COMPUTE_32F_FAST_TF32,
            T::CUDA_R_32F,
        ),
        GemmType::F32 => (T::CUDA_R_32F, C::CUBLAS_COMPUTE_32F, T::CUDA_R_32F),
        GemmType::F64 => (T::CUDA_R_64F, C::CUBLAS_COMPUTE_64F, T::CUDA_R_64F),
    }
}

/// # Safety
/// `desc` is a live descriptor and `value` matches the attribute's type.
unsafe fn set_desc<V>(
    desc: ltsys::cublasLtMatmulDesc_t,
    attr: ltsys::cublasLtMatmulDescAttributes_t,
    value: &V,
) -> Result<(), CudaError> {
    lt::set_matmul_desc_attribute(
        desc,
        attr,
        value as *const V as *const c_void,
        size_of::<V>(),
    )
    .map_err(blas("cublasLtMatmulDescSetAttribute"))
}

fn layout(
    t: ltsys::cudaDataType,
    rows: u64,
    cols: u64,
    ld: i64,
    batch: i32,
    stride: i64,
) -> Result<ltsys::cublasLtMatrixLayout_t, CudaError> {
    let l =
        lt::create_matrix_layout(t, rows, cols, ld).map_err(blas("cublasLtMatrixLayoutCreate"))?;
    if batch > 1 {
        use ltsys::cublasLtMatrixLayoutAttribute_t as A;
        // SAFETY: `l` is live; the attributes take an int32 and an int64.
        unsafe {
            lt::set_matrix_layout_attribute(
                l,
                A::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                (&batch) as *const i32 as *const c_void,
                size_of::<i32>(),
            )
            .map_err(blas("cublasLtMatrixLayoutSetAttribute"))?;
            lt::set_matrix_layout_attribute(
                l,
                A::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                (&stride) as *const i64 as *const c_void,
                size_of::<i64>(),
            )
            .map_err(blas("cublasLtMatrixLayoutSetAttribute"))?;
        }
    }
    Ok(l)
}

impl Plan {
    fn new(handle: &LtHandle, s: &GemmShape) -> Result<Plan, CudaError> {
        use ltsys::cublasLtMatmulDescAttributes_t as D;
        let (t, compute, scale) = types(s.dtype, s.tf32);
        let desc =
            lt::create_matmul_desc(compute, scale).map_err(blas("cublasLtMatmulDescCreate"))?;
        // cublasOperation_t: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 (an int32 attribute).
        let op = |tr: bool| -> i32 { i32::from(tr) };
        let (ar, ac) = if s.transa { (s.k, s.m) } else { (s.m, s.k) };
        let (br, bc) = if s.transb { (s.n, s.k) } else { (s.k, s.n) };
        let mut plan = Plan {
            desc,
            a: layout(t, ar, ac, s.lda, s.batch, s.stride_a)?,
            b: layout(t, br, bc, s.ldb, s.batch, s.stride_b)?,
            d: layout(t, s.m, s.n, s.ldd, s.batch, s.stride_d)?,
            // SAFETY: a plain-old-data struct, filled by the heuristic below.
            algo: unsafe { std::mem::zeroed() },
        };
        // SAFETY: the descriptor is live and each value has the attribute's type.
        unsafe {
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_TRANSA, &op(s.transa))?;
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_TRANSB, &op(s.transb))?;
            if s.bias {
                set_desc(
                    desc,
                    D::CUBLASLT_MATMUL_DESC_EPILOGUE,
                    &ltsys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
                )?;
            }
            if s.sm_count > 0 {
                set_desc(desc, D::CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &s.sm_count)?;
            }
        }
        let pref = lt::create_matmul_pref().map_err(blas("cublasLtMatmulPreferenceCreate"))?;
        let ws = WORKSPACE_BYTES;
        // SAFETY: every handle is live; the preference takes a size_t.
        let heuristic = unsafe {
            let r = lt::set_matmul_pref_attribute(
                pref,
                ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const usize as *const c_void,
                size_of::<usize>(),
            )
            .map_err(blas("cublasLtMatmulPreferenceSetAttribute"))
            .and_then(|()| {
                lt::get_matmul_algo_heuristic(handle.handle, desc, plan.a, plan.b, plan.d, plan.d, pref)
                    .map_err(|e| CudaError::Blas {
                        call: "cublasLtMatmulAlgoGetHeuristic",
                        message: format!("{e:?} for {s:?}"),
                    })
            });
            let _ = lt::destroy_matmul_pref(pref);
            r?
        };
        // (Not `Plan { algo, ..plan }`: the descriptors are Copy handles, and `plan` would be
        // dropped — destroying them — while the copy lives on.)
        plan.algo = heuristic.algo;
        Ok(plan)
    }
}

impl PlanCache {
    /// How many shapes have a plan.
    pub(crate) fn len(&self) -> usize {
        self.plans.lock().unwrap().len()
    }

    /// Enqueues `shape` on `stream` with `handle` and the given operands, on the current
    /// context (this cache's GPU). The first call of a shape picks the algorithm; later calls
    /// reuse it.
    pub(crate) fn enqueue(
        &self,
        handle: &LtHandle,
        stream: sys::CUstream,
        shape: &GemmShape,
        ops: GemmOperands,
    ) -> Result<(), CudaError> {
        let plan = {
            let mut plans = self.plans.lock().unwrap();
            match plans.get(shape) {
                Some(p) => p.clone(),
                None => {
                    // A shape's first GEMM: its descriptors and the heuristic's algorithm.
                    let _span = tracing::debug_span!(
                        "gemm_plan",
                        m = shape.m,
                        n = shape.n,
                        k = shape.k,
                        batch = shape.batch
                    )
                    .entered();
                    let p = Arc::new(Mutex::new(Plan::new(handle, shape)?));
                    plans.insert(*shape, p.clone());
                    p
                }
            }
        };
        let plan = plan.lock().unwrap();
        // beta = 1 adds the product to D (C and D are one buffer): an accumulating GEMM.
        let beta = if shape.accumulate { 1.0 } else { 0.0 };
        let (alpha32, beta32) = (1.0f32, beta as f32);
        let (alpha64, beta64) = (1.0f64, beta);
        let (alpha, beta): (*const c_void, *const c_void) = if shape.dtype == GemmType::F64 {
            ((&alpha64) as *const f64 as _, (&beta64) as *const f64 as _)
        } else {
            ((&alpha32) as *const f32 as _, (&beta32) as *const f32 as _)
        };
        let _span = tracing::trace_span!("gemm_launch", m = shape.m, n = shape.n).entered();
        // SAFETY: the plan's descriptors are live and match `shape`; the caller guarantees
        // that the operand addresses cover the problem; the workspace belongs to this
        // stream's handle; alpha and beta outlive the call (cuBLASLt reads them at enqueue).
        unsafe {
            if shape.bias {
                let ptr = ops.bias as *const c_void;
                set_desc(
                    plan.desc,
                    ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &ptr,
                )?;
            }
            lt::matmul(
                handle.handle,
                plan.desc,
                alpha,
                beta,
                ops.a as *const c_void,
                plan.a,
                ops.b as *const c_void,
                plan.b,
                ops.d as *const c_void,
                plan.d,
                ops.d as *mut c_void,
                plan.d,
                &plan.algo,
                handle.workspace as *mut c_void,
                WORKSPACE_BYTES,
                stream as _,
            )
            .map_err(|e| CudaError::Blas {
                call: "cublasLtMatmul",
                message: format!("{e:?} for {shape:?}"),
            })
        }
    }
}
