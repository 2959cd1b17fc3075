//! A symmetric window: NCCL memory registered on the world communicator with
//! `NCCL_WIN_COLL_SYMMETRIC`, through which whole-world allgathers, allreduces and
//! reduce-scatters are staged so that NCCL may run its symmetric kernels (and, under the
//! zero-CTA policy, its copy-engine collectives) on them.
//!
//! NCCL requires every rank to pass buffers at the same offset of the same registration.
//! The caller's buffers are wherever its allocator put them, so a staged operation copies
//! its send buffer to the window's send half (offset 0), runs on the window (the receive
//! half starts at `bytes`), and copies the result out: the offsets are the same on every
//! rank by construction. Whether an operation is staged depends only on its kind, team and
//! byte counts, which NCCL already requires to agree between ranks, so every rank stages
//! the same operations.
//!
//! The staging runs on the window's own stream, entered and left through two events: the
//! staged operations run in issue order (as NCCL runs the operations of one communicator
//! anyway), so no operation overwrites the window while an earlier one still reads it, and
//! a stream being captured into a CUDA graph takes the window's stream into its capture
//! (fork and join) — the staging replays.
#![allow(unsafe_code)]

use std::ffi::c_void;

use cudarc::nccl::sys;
use weave_cuda::cudarc::driver::CudaEvent;
use weave_cuda::{Gpu, GpuStream, Priority};

use super::library::describe;
use super::plan::{Call, Plan};

/// The calls that exist only in the bindings of NCCL 2.27 and later, in one place: before
/// 2.27 there is no window ([`super::config::make_config`] refuses one), and the stand-ins
/// below answer `ncclInvalidUsage`.
#[cfg(any(
    feature = "nccl-02027",
    feature = "nccl-02028",
    feature = "nccl-02029",
    feature = "nccl-02030"
))]
mod bindings {
    use std::ffi::c_void;

    use cudarc::nccl::sys;

    /// A window registration (`ncclWindow_t`).
    pub(super) type Handle = sys::ncclWindow_t;

    /// `NCCL_WIN_COLL_SYMMETRIC` from `nccl.h`.
    const NCCL_WIN_COLL_SYMMETRIC: i32 = 0x01;

    /// `ncclCommWindowRegister` of `total` bytes at `ptr` on `comm`, symmetric.
    pub(super) fn register(
        comm: sys::ncclComm_t,
        ptr: *mut c_void,
        total: usize,
        handle: &mut Handle,
    ) -> sys::ncclResult_t {
        // SAFETY: `comm` is live (the caller holds its mutex); `ptr` is `total` bytes of NCCL
        // memory; `handle` is a valid out-pointer that outlives the call and the poll that
        // follows (NCCL writes it before the registration settles).
        unsafe { sys::ncclCommWindowRegister(comm, ptr, total, handle, NCCL_WIN_COLL_SYMMETRIC) }
    }

    /// `ncclCommWindowDeregister` of `handle` on `comm`.
    pub(super) fn deregister(comm: sys::ncclComm_t, handle: Handle) -> sys::ncclResult_t {
        // SAFETY: `comm` is the live world communicator `handle` was registered on; it is
        // deregistered once.
        unsafe { sys::ncclCommWindowDeregister(comm, handle) }
    }
}

#[cfg(not(any(
    feature = "nccl-02027",
    feature = "nccl-02028",
    feature = "nccl-02029",
    feature = "nccl-02030"
)))]
mod bindings {
    use std::ffi::c_void;

    use cudarc::nccl::sys;

    /// A window registration (none in these bindings).
    pub(super) type Handle = *mut c_void;

    pub(super) fn register(
        _comm: sys::ncclComm_t,
        _ptr: *mut c_void,
        _total: usize,
        _handle: &mut Handle,
    ) -> sys::ncclResult_t {
        sys::ncclResult_t::ncclInvalidUsage
    }

    pub(super) fn deregister(_comm: sys::ncclComm_t, _handle: Handle) -> sys::ncclResult_t {
        sys::ncclResult_t::ncclInvalidUsage
    }
}

use bindings::{deregister, register, Handle};

/// One rank's registered window, its stream and its two events.
pub(super) struct Window {
    /// The start of the `2 × bytes` of NCCL memory.
    base: u64,
    /// Bytes of each half.
    bytes: usize,
    handle: Handle,
    pub(super) stream: GpuStream,
    enter: CudaEvent,
    leave: CudaEvent,
}

// SAFETY: the handle and the memory are owned by this value alone and used only while the
// communicator mutex that holds it is locked (as for `RawComm`).
unsafe impl Send for Window {}

// SAFETY: shared references only read the addresses and use the stream and events, which
// CUDA allows from any thread; the registration handle is touched only by `close`, which
// takes the window by value.
unsafe impl Sync for Window {}

/// An operation staged through the window: the plan to issue on the window's stream, and
/// the copies before and after it.
pub(super) struct Staged {
    pub(super) plan: Plan,
    /// (window address, the caller's send buffer, bytes).
    copy_in: (u64, u64, usize),
    /// (the caller's receive buffer, window address, bytes).
    copy_out: (u64, u64, usize),
}

/// Allocates `2 × bytes` of NCCL memory and starts its registration on `comm` (collective:
/// every rank of the world calls it at the same point). Answers the registration's result
/// (`ncclInProgress` on a non-blocking communicator: the caller polls) and the memory, or
/// a message.
pub(super) fn allocate_and_register(
    comm: sys::ncclComm_t,
    bytes: usize,
) -> Result<(sys::ncclResult_t, u64, Handle), String> {
    let total = bytes
        .checked_mul(2)
        .ok_or_else(|| format!("a symmetric window of 2 × {bytes} bytes overflows"))?;
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: the library is loaded (a communicator exists); `ptr` is a valid out-pointer;
    // the caller has bound the GPU's context.
    let result = unsafe { sys::ncclMemAlloc(&mut ptr, total) };
    if result != sys::ncclResult_t::ncclSuccess || ptr.is_null() {
        return Err(format!(
            "ncclMemAlloc of {total} bytes: {}",
            describe(result)
        ));
    }
    let mut handle: Handle = std::ptr::null_mut();
    let result = register(comm, ptr, total, &mut handle);
    match result {
        sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => {
            Ok((result, ptr as u64, handle))
        }
        error => {
            // SAFETY: allocated above, never registered, freed once.
            unsafe { sys::ncclMemFree(ptr) };
            Err(format!("ncclCommWindowRegister: {}", describe(error)))
        }
    }
}

impl Window {
    /// The window of `bytes` a half at `base` (registered as `handle`), with a stream and
    /// two events of `gpu`.
    pub(super) fn new(
        gpu: &Gpu,
        base: u64,
        bytes: usize,
        handle: Handle,
    ) -> Result<Window, String> {
        let fail = |e: weave_cuda::CudaError| format!("the symmetric window's stream: {e}");
        Ok(Window {
            base,
            bytes,
            handle,
            stream: gpu.new_stream(Priority::Normal).map_err(fail)?,
            enter: gpu.new_event(false).map_err(fail)?,
            leave: gpu.new_event(false).map_err(fail)?,
        })
    }

    /// The staged form of `plan` when it is one allgather, allreduce or reduce-scatter
    /// whose buffers fit a half of the window, in a team of `members`; `None` otherwise.
    pub(super) fn stage(&self, plan: &Plan, members: usize) -> Option<Staged> {
        stage(self.base, self.bytes, plan, members)
    }

    /// Enters the window's stream after the work enqueued on `stream`, copies in.
    pub(super) fn enter(
        &self,
        gpu: &Gpu,
        stream: &GpuStream,
        staged: &Staged,
    ) -> Result<(), weave_cuda::CudaError> {
        stream.record(&self.enter)?;
        self.stream.wait(&self.enter)?;
        let (dst, src, bytes) = staged.copy_in;
        gpu.copy(dst, src, bytes, &self.stream)
    }

    /// Copies out, and makes `stream` wait for the window's stream.
    pub(super) fn leave(
        &self,
        gpu: &Gpu,
        stream: &GpuStream,
        staged: &Staged,
    ) -> Result<(), weave_cuda::CudaError> {
        let (dst, src, bytes) = staged.copy_out;
        gpu.copy(dst, src, bytes, &self.stream)?;
        self.stream.record(&self.leave)?;
        stream.wait(&self.leave)
    }

    /// Deregisters the window from `comm` and frees its memory once the window's stream
    /// is idle; a failure (or a timeout of `wait`) leaks the memory rather than free what
    /// NCCL may still use. `settle` polls a non-blocking deregistration.
    pub(super) fn close(
        self,
        comm: sys::ncclComm_t,
        timeout: std::time::Duration,
        settle: impl FnOnce() -> bool,
    ) {
        if self.stream.synchronize_timeout(timeout).is_err() {
            return;
        }
        let result = deregister(comm, self.handle);
        let done = match result {
            sys::ncclResult_t::ncclSuccess => true,
            sys::ncclResult_t::ncclInProgress => settle(),
            _ => false,
        };
        if done {
            // SAFETY: allocated by `ncclMemAlloc`, deregistered above, no work of this
            // rank uses it (its stream is idle), freed once.
            unsafe { sys::ncclMemFree(self.base as *mut c_void) };
        }
    }
}

/// [`Window::stage`] for a window of `bytes` a half at `base` (pure, for tests).
fn stage(base: u64, bytes: usize, plan: &Plan, members: usize) -> Option<Staged> {
    if plan.calls.len() != 1 || !plan.copies.is_empty() {
        return None;
    }
    let recv_at = base.checked_add(bytes as u64)?;
    let mut call = plan.calls[0].clone();
    // The bytes of the call's `count` elements; then the call's buffers (moved into the
    // window below) and the bytes each holds.
    let one = call.count().checked_mul(call.dtype().size())?;
    let (send_at, recv_at_call, send_bytes, recv_bytes) = match &mut call {
        Call::AllGather { send, recv, .. } => (send, recv, one, one.checked_mul(members)?),
        Call::AllReduce { send, recv, .. } => (send, recv, one, one),
        Call::ReduceScatter { send, recv, .. } => (send, recv, one.checked_mul(members)?, one),
        _ => return None,
    };
    let (send, recv) = (*send_at, *recv_at_call);
    *send_at = base;
    *recv_at_call = recv_at;
    if send_bytes == 0 || send_bytes > bytes || recv_bytes > bytes {
        return None;
    }
    Some(Staged {
        plan: Plan {
            calls: vec![call],
            copies: Vec::new(),
        },
        copy_in: (base, send, send_bytes),
        copy_out: (recv, recv_at, recv_bytes),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DataType, RedOp};

    fn plan(call: Call) -> Plan {
        Plan {
            calls: vec![call],
            copies: Vec::new(),
        }
    }

    #[test]
    fn the_three_collectives_are_staged_at_the_same_offsets_when_they_fit() {
        let base = 1 << 40;
        let half = 1024;
        // Stages `call` of a team of `members` and checks its copies in and out.
        let staged = |call, members, copy_in, copy_out| {
            let staged = stage(base, half, &plan(call), members).unwrap();
            assert_eq!(staged.copy_in, copy_in);
            assert_eq!(staged.copy_out, copy_out);
            staged
        };
        // A reduce-scatter of 4 members: 4 × 32 f32 in, 32 out.
        let rs = Call::ReduceScatter {
            send: 7000,
            recv: 9000,
            count: 32,
            dtype: DataType::F32,
            op: RedOp::Sum,
        };
        let rs = staged(rs, 4, (base, 7000, 512), (9000, base + 1024, 128));
        assert!(matches!(
            rs.plan.calls[..],
            [Call::ReduceScatter { send, recv, count: 32, .. }] if send == base && recv == base + 1024
        ));
        // An allgather: 32 in, 4 × 32 out.
        let ag = Call::AllGather {
            send: 100,
            recv: 200,
            count: 32,
            dtype: DataType::Bf16,
        };
        staged(ag, 4, (base, 100, 64), (200, base + 1024, 256));
        // An allreduce in place.
        let ar = Call::AllReduce {
            send: 300,
            recv: 300,
            count: 256,
            dtype: DataType::F32,
            op: RedOp::Sum,
        };
        staged(ar, 2, (base, 300, 1024), (300, base + 1024, 1024));
    }

    #[test]
    fn what_does_not_fit_or_is_not_one_collective_is_not_staged() {
        let base = 4096;
        let ar = |count| Call::AllReduce {
            send: 1,
            recv: 2,
            count,
            dtype: DataType::F32,
            op: RedOp::Sum,
        };
        assert!(stage(base, 1024, &plan(ar(257)), 2).is_none());
        assert!(stage(base, 1024, &plan(ar(0)), 2).is_none());
        // A reduce-scatter whose send buffer (4 × 128 f32) overflows the half.
        let rs = Call::ReduceScatter {
            send: 1,
            recv: 2,
            count: 128,
            dtype: DataType::F32,
            op: RedOp::Sum,
        };
        assert!(stage(base, 1024, &plan(rs), 4).is_none());
        let broadcast = Call::Broadcast {
            send: 1,
            recv: 2,
            count: 4,
            dtype: DataType::F32,
            root: 0,
        };
        assert!(stage(base, 1024, &plan(broadcast), 2).is_none());
        let two = Plan {
            calls: vec![ar(4), ar(4)],
            copies: Vec::new(),
        };
        assert!(stage(base, 1024, &two, 2).is_none());
    }
}
