//! Loading `libnccl.so` at run time and calling it: the version check, error descriptions,
//! the mapping of element types and reduction operators, and the one function through
//! which a plan's calls reach NCCL.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

use cudarc::nccl::sys;

use super::plan::Call;
use crate::dtype::{DataType, RedOp};
use crate::error::CommError;

/// The oldest NCCL this module works with (`ncclCommSplit` appeared in 2.18).
const MIN_NCCL_VERSION: i32 = 21800;

/// NCCL's element type for `dtype`.
pub(super) fn nccl_type(dtype: DataType) -> sys::ncclDataType_t {
    use sys::ncclDataType_t as T;
    match dtype {
        DataType::Bool => T::ncclUint8,
        DataType::I64 => T::ncclInt64,
        DataType::F16 => T::ncclFloat16,
        DataType::Bf16 => T::ncclBfloat16,
        DataType::F32 => T::ncclFloat32,
        DataType::F64 => T::ncclFloat64,
    }
}

/// NCCL's operator for reducing `dtype` values with `op`. Booleans travel as bytes holding 0
/// or 1, so their sum and product become maximum and minimum (logical or and and), which
/// keeps every result 0 or 1 as [`crate::Local`] computes it.
pub(super) fn nccl_op(dtype: DataType, op: RedOp) -> sys::ncclRedOp_t {
    use sys::ncclRedOp_t as O;
    match (dtype, op) {
        (DataType::Bool, RedOp::Sum | RedOp::Max) => O::ncclMax,
        (DataType::Bool, RedOp::Prod | RedOp::Min) => O::ncclMin,
        (_, RedOp::Sum) => O::ncclSum,
        (_, RedOp::Prod) => O::ncclProd,
        (_, RedOp::Max) => O::ncclMax,
        (_, RedOp::Min) => O::ncclMin,
    }
}

pub(super) fn backend(op: &str, message: String) -> CommError {
    CommError::Backend {
        op: op.to_string(),
        message,
    }
}

/// Loads the library once; its version, or why it cannot be used.
pub(super) fn library() -> Result<i32, CommError> {
    static LIBRARY: OnceLock<Result<i32, String>> = OnceLock::new();
    LIBRARY
        .get_or_init(|| {
            // SAFETY: `is_culib_present` only tries to dlopen the candidate names.
            if !unsafe { sys::is_culib_present() } {
                return Err(
                    "the NCCL library (libnccl.so) cannot be loaded; install NCCL or \
                            put the directory of libnccl.so on LD_LIBRARY_PATH (a libnccl.so.2 \
                            alone is not found: link libnccl.so to it)"
                        .into(),
                );
            }
            let mut version: c_int = 0;
            // SAFETY: the library is present; `version` is a valid out-pointer.
            let result = unsafe { sys::ncclGetVersion(&mut version) };
            if result != sys::ncclResult_t::ncclSuccess {
                return Err(format!("ncclGetVersion failed: {}", describe(result)));
            }
            if version < MIN_NCCL_VERSION {
                return Err(format!(
                    "NCCL {} is loaded but 2.18 or newer is needed",
                    version_name(version)
                ));
            }
            Ok(version)
        })
        .clone()
        .map_err(|message| backend("loading NCCL", message))
}

/// `22803` as `2.28.3`.
pub(super) fn version_name(code: i32) -> String {
    format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100)
}

/// NCCL's description of `result`, with the library's last error message when it has one.
pub(super) fn describe(result: sys::ncclResult_t) -> String {
    // SAFETY: both functions return pointers to NUL-terminated strings owned by the
    // library (static, or a process-wide buffer) or null; they are copied at once. The
    // library is loaded: every caller has passed `library()` (or got `result` from it).
    let (text, last) = unsafe {
        let text = sys::ncclGetErrorString(result);
        let last = sys::ncclGetLastError(std::ptr::null_mut());
        let read = |p: *const std::ffi::c_char| {
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        (read(text), read(last))
    };
    if last.trim().is_empty() {
        format!("{result:?} ({text})")
    } else {
        format!("{result:?} ({text}): {}", last.trim())
    }
}

/// Issues one NCCL call.
///
/// # Safety
///
/// `comm` must be a live communicator used by no other thread meanwhile, the call's
/// addresses must hold `count` elements on the communicator's GPU, and `stream` must be a
/// stream of that GPU.
pub(super) unsafe fn call_nccl(
    call: &Call,
    comm: sys::ncclComm_t,
    stream: sys::cudaStream_t,
) -> sys::ncclResult_t {
    let ptr = |p: u64| p as usize as *mut c_void;
    // Roots and peers are team indices or world ranks, which were checked to fit an i32
    // at init.
    let rank = |r: usize| c_int::try_from(r).unwrap_or(c_int::MAX);
    // SAFETY: the caller upholds this function's contract, which is every NCCL entry
    // point's: a live communicator, device buffers of its GPU, a stream of that GPU.
    unsafe {
        match *call {
            Call::AllGather {
                send,
                recv,
                count,
                dtype,
            } => sys::ncclAllGather(ptr(send), ptr(recv), count, nccl_type(dtype), comm, stream),
            Call::AllReduce {
                send,
                recv,
                count,
                dtype,
                op,
            }
            | Call::ReduceScatter {
                send,
                recv,
                count,
                dtype,
                op,
            } => {
                // The two take the same arguments (`count` per member for a
                // reduce-scatter, as the plan counts it).
                let reduce = if matches!(*call, Call::AllReduce { .. }) {
                    sys::ncclAllReduce
                } else {
                    sys::ncclReduceScatter
                };
                reduce(
                    ptr(send),
                    ptr(recv),
                    count,
                    nccl_type(dtype),
                    nccl_op(dtype, op),
                    comm,
                    stream,
                )
            }
            Call::Broadcast {
                send,
                recv,
                count,
                dtype,
                root,
            } => sys::ncclBroadcast(
                ptr(send),
                ptr(recv),
                count,
                nccl_type(dtype),
                rank(root),
                comm,
                stream,
            ),
            Call::Reduce {
                send,
                recv,
                count,
                dtype,
                op,
                root,
            } => sys::ncclReduce(
                ptr(send),
                ptr(recv),
                count,
                nccl_type(dtype),
                nccl_op(dtype, op),
                rank(root),
                comm,
                stream,
            ),
            Call::Send {
                buf,
                count,
                dtype,
                peer,
            } => sys::ncclSend(ptr(buf), count, nccl_type(dtype), rank(peer), comm, stream),
            Call::Recv {
                buf,
                count,
                dtype,
                peer,
            } => sys::ncclRecv(ptr(buf), count, nccl_type(dtype), rank(peer), comm, stream),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::NcclId;

    #[test]
    fn missing_library_is_an_error_not_a_panic() {
        // SAFETY: only tries to dlopen the library.
        let present = unsafe { sys::is_culib_present() };
        if !present {
            let error = NcclId::new().unwrap_err();
            assert!(error.to_string().contains("libnccl.so"), "{error}");
        }
    }

    #[test]
    fn data_types_and_operators_map_to_nccl() {
        use sys::ncclDataType_t as T;
        use sys::ncclRedOp_t as O;
        let types: Vec<_> = DataType::ALL.iter().map(|&d| nccl_type(d)).collect();
        assert_eq!(
            types,
            [
                T::ncclUint8,
                T::ncclInt64,
                T::ncclFloat16,
                T::ncclBfloat16,
                T::ncclFloat32,
                T::ncclFloat64
            ]
        );
        for dtype in [DataType::F32, DataType::I64, DataType::Bf16] {
            assert_eq!(nccl_op(dtype, RedOp::Sum), O::ncclSum);
            assert_eq!(nccl_op(dtype, RedOp::Prod), O::ncclProd);
            assert_eq!(nccl_op(dtype, RedOp::Max), O::ncclMax);
            assert_eq!(nccl_op(dtype, RedOp::Min), O::ncclMin);
        }
        // Logical or / and, as Local rounds bool results.
        assert_eq!(nccl_op(DataType::Bool, RedOp::Sum), O::ncclMax);
        assert_eq!(nccl_op(DataType::Bool, RedOp::Max), O::ncclMax);
        assert_eq!(nccl_op(DataType::Bool, RedOp::Prod), O::ncclMin);
        assert_eq!(nccl_op(DataType::Bool, RedOp::Min), O::ncclMin);
        // Local's rounding agrees: a sum of trues is true, a product with a false is false.
        let or = DataType::Bool.round(RedOp::Sum.combine(1.0, 1.0));
        let and = DataType::Bool.round(RedOp::Prod.combine(1.0, 0.0));
        assert_eq!((or, and), (1.0, 0.0));
    }
}
