//! `Nccl`: one NCCL communicator per rank, posting collectives and point-to-point groups on
//! the caller's stream, with every wait bounded by a timeout.
//!
//! * **Initialisation.** Rank 0 makes an [`NcclId`] and hands it to every rank (see
//!   [`crate::bootstrap::exchange_id`], or share it in memory when the ranks are threads of
//!   one process); each rank then calls [`Nccl::init`] with its GPU, from its own thread.
//!   Communicators are created *non-blocking* by default (`ncclConfig_t::blocking = 0`):
//!   every NCCL call may answer `ncclInProgress`, after which the communicator is polled
//!   with `ncclCommGetAsyncError` until it settles. A poll that outlasts
//!   [`NcclOptions::timeout`] aborts every communicator of the rank and fails with
//!   [`CommError::Timeout`], so a rank that never arrives cannot hang its peers' `init`.
//!   [`NcclOptions::blocking`] trades that guarantee for less host time per operation.
//! * **Teams.** A [`Collective`] names its team by world ranks, in team order. The team
//!   `0..world` in that order uses the world communicator; a one-member team needs no
//!   communicator (its operation is a device copy, or nothing); every other team uses a
//!   communicator split off the world by `ncclCommSplit`, whose ranks are the team indices.
//!   Splitting is collective over the whole world, so every rank calls
//!   [`Nccl::prepare_teams`] with the same list of teams before posting.
//! * **Operations.** Allgather, allreduce, reduce-scatter, broadcast and reduce are NCCL's
//!   own collectives; gather, scatter, all-to-all, collective permute and send-recv are
//!   groups of `ncclSend`/`ncclRecv` on the team's communicator, a member's piece for itself
//!   being a device-to-device copy on the same stream. [`Communicator::post_p2p`] is a
//!   group of sends then receives on the world communicator.
//! * **Order.** NCCL matches operations by the order in which they are issued on each
//!   communicator, and ranks that issue operations on several communicators in different
//!   orders can deadlock. Every rank must therefore post its collectives and transfers in
//!   the same order: the evaluator posts them in program order, which is the same on every
//!   rank.
//! * **Semantics.** Results are those of [`crate::Local`], with two differences: the ranks
//!   cannot check each other's arguments (mismatched sizes or kinds between ranks are
//!   undefined behaviour in NCCL, typically a hang ended by the caller's timeout), and
//!   floating-point reductions round after every step in NCCL's own order instead of once.
//!   Boolean sums and products are computed as maximum and minimum, which is what `Local`
//!   yields for 0/1 values.
//! * **Failures.** [`Nccl::async_error`] polls every communicator and is meant for the
//!   executor's event waits; [`Communicator::abort`] aborts every communicator of the rank.
//!
//! The library is loaded at run time: when `libnccl.so` cannot be found, every entry point
//! answers [`CommError::Backend`] instead of panicking.
#![allow(unsafe_code)]

use std::collections::HashSet;
use std::ffi::{c_int, c_void, CStr};
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use cudarc::nccl::sys;
use weave_cuda::{Gpu, GpuStream};

use crate::communicator::{Collective, CommOp, Communicator, P2p};
use crate::dtype::{DataType, RedOp};
use crate::error::CommError;

/// `NCCL_SPLIT_NOCOLOR` from `nccl.h`: the color of a rank that joins no communicator in
/// `ncclCommSplit`.
pub const NCCL_SPLIT_NOCOLOR: i32 = -1;

/// `NCCL_CONFIG_UNDEF_INT` from `nccl.h`: a configuration field NCCL should choose.
pub const NCCL_CONFIG_UNDEF_INT: i32 = i32::MIN;

/// The magic number `NCCL_CONFIG_INITIALIZER` writes into `ncclConfig_t`.
const NCCL_CONFIG_MAGIC: u32 = 0xcafe_beef;

/// The oldest NCCL this module works with (`ncclCommSplit` appeared in 2.18).
const MIN_NCCL_VERSION: i32 = 21800;

/// A buffer in device memory that NCCL can read or write.
pub trait DeviceBuffer: Clone + Send + Sync + 'static {
    /// The device address of the first element.
    fn device_ptr(&self) -> u64;
    /// The number of elements.
    fn len(&self) -> usize;
    /// Whether the buffer has no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The element type.
    fn data_type(&self) -> DataType;
    /// Whether the elements are contiguous in row-major order (NCCL moves contiguous memory
    /// only).
    fn is_contiguous(&self) -> bool;
}

/// The 128-byte unique id that names one NCCL world: rank 0 makes it, every rank passes it
/// to [`Nccl::init`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NcclId([u8; NcclId::BYTES]);

impl NcclId {
    /// The size of an id in bytes.
    pub const BYTES: usize = 128;

    /// A fresh id (`ncclGetUniqueId`). On rank 0 this also starts NCCL's bootstrap listener
    /// (or uses `NCCL_COMM_ID` when it is set).
    pub fn new() -> Result<NcclId, CommError> {
        library()?;
        let mut id = sys::ncclUniqueId {
            internal: [0; NcclId::BYTES],
        };
        // SAFETY: the library is loaded (checked above); `id` is a valid out-pointer to a
        // `ncclUniqueId` on this stack frame.
        let result = unsafe { sys::ncclGetUniqueId(&mut id) };
        if result != sys::ncclResult_t::ncclSuccess {
            return Err(backend("ncclGetUniqueId", describe(result)));
        }
        Ok(NcclId(id.internal.map(|c| c as u8)))
    }

    /// The id's bytes, to send to the other ranks.
    pub fn as_bytes(&self) -> &[u8; NcclId::BYTES] {
        &self.0
    }

    /// An id received from rank 0; fails unless `bytes` has exactly [`NcclId::BYTES`]
    /// bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<NcclId, CommError> {
        let array: [u8; NcclId::BYTES] = bytes.try_into().map_err(|_| {
            CommError::Bootstrap(format!(
                "an NCCL id has {} bytes, not {}",
                NcclId::BYTES,
                bytes.len()
            ))
        })?;
        Ok(NcclId(array))
    }

    fn raw(&self) -> sys::ncclUniqueId {
        sys::ncclUniqueId {
            internal: self.0.map(|b| b as std::ffi::c_char),
        }
    }
}

impl fmt::Debug for NcclId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NcclId(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

/// How a rank's communicators are created and how long they wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NcclOptions {
    /// How long any NCCL call (creation, split, posting, finalisation) may stay in progress
    /// before the rank aborts its communicators and fails with [`CommError::Timeout`].
    pub timeout: Duration,
    /// The most CTAs (thread blocks) one NCCL kernel may use (`maxCTAs`): fewer leave more
    /// of the GPU to concurrent compute. `None` lets NCCL choose.
    pub max_ctas: Option<i32>,
    /// The fewest CTAs one NCCL kernel uses (`minCTAs`); needs `max_ctas` too.
    pub min_ctas: Option<i32>,
    /// Create *blocking* communicators (`ncclConfig_t::blocking = 1`). A non-blocking
    /// communicator (the default) hands every group launch to a new NCCL helper thread and
    /// answers `ncclInProgress`, which costs on the order of 100 µs of host time per
    /// operation (docs/benchmarks.md); a blocking one enqueues in the caller's thread. The
    /// price: init, splits and the first operation between two ranks (NCCL connects lazily)
    /// block inside NCCL, where the timeout cannot reach, so a rank that never arrives hangs
    /// its peers there. Later waits keep their timeouts (the host waits on events and
    /// aborts). For benchmarks and jobs whose ranks are known to start.
    pub blocking: bool,
}

impl Default for NcclOptions {
    fn default() -> NcclOptions {
        NcclOptions {
            timeout: Duration::from_secs(60),
            max_ctas: None,
            min_ctas: None,
            blocking: false,
        }
    }
}

/// The `ncclConfig_t` of every communicator of a rank: what `NCCL_CONFIG_INITIALIZER`
/// would give, non-blocking, with the CTA limits of `options`. `version` is the loaded
/// library's (NCCL reads `size` bytes of the struct, so a newer library keeps its defaults
/// for the fields this layout lacks).
fn make_config(version: i32, options: &NcclOptions) -> Result<sys::ncclConfig_t, String> {
    for (name, value) in [
        ("max_ctas", options.max_ctas),
        ("min_ctas", options.min_ctas),
    ] {
        if let Some(v) = value {
            if v <= 0 {
                return Err(format!("NcclOptions::{name} is {v}; it must be positive"));
            }
        }
    }
    match (options.min_ctas, options.max_ctas) {
        (Some(_), None) => {
            return Err("NcclOptions::min_ctas needs max_ctas as well".into());
        }
        (Some(min), Some(max)) if min > max => {
            return Err(format!(
                "NcclOptions::min_ctas ({min}) is larger than max_ctas ({max})"
            ));
        }
        _ => {}
    }
    let undef = NCCL_CONFIG_UNDEF_INT;
    Ok(sys::ncclConfig_t {
        size: size_of::<sys::ncclConfig_t>(),
        magic: NCCL_CONFIG_MAGIC,
        version: u32::try_from(version).unwrap_or(0),
        blocking: i32::from(options.blocking),
        cgaClusterSize: undef,
        minCTAs: options.min_ctas.unwrap_or(undef),
        maxCTAs: options.max_ctas.unwrap_or(undef),
        netName: std::ptr::null(),
        splitShare: undef,
        trafficClass: undef,
        commName: std::ptr::null(),
        collnetEnable: undef,
        CTAPolicy: undef,
        shrinkShare: undef,
        nvlsCTAs: undef,
        nChannelsPerNetPeer: undef,
        nvlinkCentricSched: undef,
    })
}

/// NCCL's element type for `dtype`.
fn nccl_type(dtype: DataType) -> sys::ncclDataType_t {
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
fn nccl_op(dtype: DataType, op: RedOp) -> sys::ncclRedOp_t {
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

fn backend(op: &str, message: String) -> CommError {
    CommError::Backend {
        op: op.to_string(),
        message,
    }
}

fn mismatch(label: &str, rank: usize, detail: String) -> CommError {
    CommError::Mismatch {
        op: label.to_string(),
        rank,
        detail,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Loads the library once; its version, or why it cannot be used.
fn library() -> Result<i32, CommError> {
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
fn version_name(code: i32) -> String {
    format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100)
}

/// NCCL's description of `result`, with the library's last error message when it has one.
fn describe(result: sys::ncclResult_t) -> String {
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

// ---------------------------------------------------------------------------------------
// Teams
// ---------------------------------------------------------------------------------------

/// Which communicator a team's collectives use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TeamRoute {
    /// At most one member: no communicator; the operation is a device copy or nothing.
    Alone,
    /// Every rank, in rank order: the world communicator.
    World,
    /// A communicator split off the world by [`Nccl::prepare_teams`].
    Split,
}

impl TeamRoute {
    /// The route of `team` in a world of `world` ranks.
    pub fn of(team: &[usize], world: usize) -> TeamRoute {
        if team.len() <= 1 {
            TeamRoute::Alone
        } else if team.len() == world && team.iter().enumerate().all(|(i, &r)| i == r) {
            TeamRoute::World
        } else {
            TeamRoute::Split
        }
    }
}

/// Checks that `team` names distinct ranks of a world of `world` ranks (with the messages
/// of [`crate::Local`]).
fn check_team(team: &[usize], world: usize) -> Result<(), String> {
    for (i, &r) in team.iter().enumerate() {
        if r >= world {
            return Err(format!(
                "team {team:?}: rank {r} is outside the world of {world} ranks"
            ));
        }
        if team[..i].contains(&r) {
            return Err(format!("team {team:?} names rank {r} twice"));
        }
    }
    Ok(())
}

/// The communicators to split off the world for a list of teams, identical on every rank.
///
/// Every distinct team that needs a split (see [`TeamRoute`]) gets a color, its index in
/// [`TeamPlan::splits`]. Teams are packed, in order, into *rounds* of pairwise disjoint
/// teams; each round is one `ncclCommSplit` of the world, in which a rank passes the color of
/// its team of that round (or [`NCCL_SPLIT_NOCOLOR`]) and, as key, its index in that team, so
/// that the new communicator's ranks are the team indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TeamPlan {
    /// The distinct teams that need a split, in order of first appearance.
    pub splits: Vec<Vec<usize>>,
    /// Each round's teams, as indices into `splits`.
    pub rounds: Vec<Vec<usize>>,
}

impl TeamPlan {
    /// Plans the splits for `teams` in a world of `world` ranks, leaving out the teams in
    /// `done` (already split). Fails on a team that names a rank outside the world or a rank
    /// twice.
    pub fn new(
        world: usize,
        teams: &[Vec<usize>],
        done: &HashSet<Vec<usize>>,
    ) -> Result<TeamPlan, String> {
        let mut splits: Vec<Vec<usize>> = Vec::new();
        for team in teams {
            check_team(team, world)?;
            if TeamRoute::of(team, world) == TeamRoute::Split
                && !done.contains(team)
                && !splits.contains(team)
            {
                splits.push(team.clone());
            }
        }
        let mut rounds: Vec<Vec<usize>> = Vec::new();
        let mut busy: Vec<HashSet<usize>> = Vec::new();
        for (color, team) in splits.iter().enumerate() {
            let free = busy
                .iter()
                .position(|ranks| team.iter().all(|r| !ranks.contains(r)));
            let round = match free {
                Some(round) => round,
                None => {
                    rounds.push(Vec::new());
                    busy.push(HashSet::new());
                    rounds.len() - 1
                }
            };
            rounds[round].push(color);
            busy[round].extend(team.iter().copied());
        }
        Ok(TeamPlan { splits, rounds })
    }

    /// What `rank` passes to `ncclCommSplit` in round `round`: (color, key), and the team it
    /// joins, if any.
    pub fn split_args(&self, round: usize, rank: usize) -> (i32, i32, Option<&[usize]>) {
        let joined = self.rounds.get(round).and_then(|colors| {
            colors.iter().find_map(|&color| {
                let team = self.splits.get(color)?;
                let key = team.iter().position(|&r| r == rank)?;
                Some((color, key, team.as_slice()))
            })
        });
        match joined {
            Some((color, key, team)) => (
                i32::try_from(color).unwrap_or(i32::MAX),
                i32::try_from(key).unwrap_or(i32::MAX),
                Some(team),
            ),
            None => (NCCL_SPLIT_NOCOLOR, 0, None),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Plans: what one member issues, computed without touching NCCL
// ---------------------------------------------------------------------------------------

/// One NCCL call of a plan; addresses are device pointers, peers and roots are ranks of
/// the communicator used.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    AllGather {
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
    },
    AllReduce {
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: RedOp,
    },
    ReduceScatter {
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: RedOp,
    },
    Broadcast {
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        root: usize,
    },
    Reduce {
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: RedOp,
        root: usize,
    },
    Send {
        buf: u64,
        count: usize,
        dtype: DataType,
        peer: usize,
    },
    Recv {
        buf: u64,
        count: usize,
        dtype: DataType,
        peer: usize,
    },
}

impl Call {
    fn name(&self) -> &'static str {
        match self {
            Call::AllGather { .. } => "ncclAllGather",
            Call::AllReduce { .. } => "ncclAllReduce",
            Call::ReduceScatter { .. } => "ncclReduceScatter",
            Call::Broadcast { .. } => "ncclBroadcast",
            Call::Reduce { .. } => "ncclReduce",
            Call::Send { .. } => "ncclSend",
            Call::Recv { .. } => "ncclRecv",
        }
    }

    fn is_p2p(&self) -> bool {
        matches!(self, Call::Send { .. } | Call::Recv { .. })
    }

    /// The element count the call moves (per member, as NCCL counts it).
    fn count(&self) -> usize {
        match self {
            Call::AllGather { count, .. }
            | Call::AllReduce { count, .. }
            | Call::ReduceScatter { count, .. }
            | Call::Broadcast { count, .. }
            | Call::Reduce { count, .. }
            | Call::Send { count, .. }
            | Call::Recv { count, .. } => *count,
        }
    }
}

/// A device-to-device copy on the posting stream.
#[derive(Clone, Debug, PartialEq, Eq)]
struct DeviceCopy {
    dst: u64,
    src: u64,
    bytes: usize,
}

/// What one member issues for one operation: NCCL calls (in one group when there are
/// sends or receives), then copies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Plan {
    calls: Vec<Call>,
    copies: Vec<DeviceCopy>,
}

impl Plan {
    /// Drops the calls that move no element: the empty last chunks of an axis that the
    /// stream chunks do not divide. Every member of a team cuts the same chunk of the same
    /// axis, so every member drops the same calls and nothing waits for a missing partner.
    fn drop_empty_calls(&mut self) {
        self.calls.retain(|c| c.count() > 0);
    }

    fn grouped(&self) -> bool {
        self.calls.len() > 1 || self.calls.iter().any(Call::is_p2p)
    }

    /// Copies `len` elements from piece `src_piece` of `src` to piece `dst_piece` of `dst`,
    /// pieces being `len` elements long.
    fn copy(
        &mut self,
        dst: &Operand,
        dst_piece: usize,
        src: &Operand,
        src_piece: usize,
        len: usize,
    ) -> Result<(), String> {
        let bytes = byte_len(len, src.dtype)?;
        let (d, s) = (dst.piece(dst_piece, len)?, src.piece(src_piece, len)?);
        if bytes > 0 && d != s {
            self.copies.push(DeviceCopy {
                dst: d,
                src: s,
                bytes,
            });
        }
        Ok(())
    }
}

fn byte_len(len: usize, dtype: DataType) -> Result<usize, String> {
    len.checked_mul(dtype.size())
        .ok_or_else(|| format!("{len} elements of {dtype} overflow the address space"))
}

/// A buffer as a plan uses it.
struct Operand {
    what: String,
    ptr: u64,
    len: usize,
    dtype: DataType,
}

impl Operand {
    /// Checks that the `what` buffer can be handed to NCCL.
    fn new<B: DeviceBuffer>(what: impl Into<String>, buffer: &B) -> Result<Operand, String> {
        let what = what.into();
        if !buffer.is_contiguous() {
            return Err(format!(
                "the {what} is not contiguous; NCCL moves contiguous memory only"
            ));
        }
        Ok(Operand {
            what,
            ptr: buffer.device_ptr(),
            len: buffer.len(),
            dtype: buffer.data_type(),
        })
    }

    /// The address of piece `index`, pieces being `len` elements long.
    fn piece(&self, index: usize, len: usize) -> Result<u64, String> {
        index
            .checked_mul(len)
            .and_then(|n| n.checked_mul(self.dtype.size()))
            .and_then(|offset| u64::try_from(offset).ok())
            .and_then(|offset| self.ptr.checked_add(offset))
            .ok_or_else(|| format!("piece {index} of the {} overflows its address", self.what))
    }

    /// Fails unless this buffer has `expected` elements, `factor` times the other.
    fn expect_len(&self, expected: usize, factor: usize) -> Result<(), String> {
        if self.len == expected {
            return Ok(());
        }
        let relation = if factor == 1 {
            "as many elements as the other buffer".to_string()
        } else {
            format!("{factor} times the elements of the other buffer")
        };
        Err(format!(
            "the {} has {} elements but must have {relation}, {expected}",
            self.what, self.len
        ))
    }
}

/// Fails unless `input` and `output` hold the same element type.
fn same_type(input: &Operand, output: &Operand) -> Result<(), String> {
    if input.dtype == output.dtype {
        Ok(())
    } else {
        Err(format!(
            "the input is {} but the output is {}",
            input.dtype, output.dtype
        ))
    }
}

/// What member `index` of a team of `n` issues for `op`, after the checks it can make alone
/// (those of [`crate::Local`], plus contiguity). Only the buffers the member uses are
/// checked: a non-root's input of a broadcast, say, is never read.
fn plan_collective<B: DeviceBuffer>(
    op: &CommOp<B>,
    index: usize,
    n: usize,
) -> Result<Plan, String> {
    let check_root = |root: usize| {
        if root < n {
            Ok(())
        } else {
            Err(format!("root {root} is out of range for a team of {n}"))
        }
    };
    let mut plan = Plan::default();
    match op {
        CommOp::Allgather { input, output } => {
            let (i, o) = (
                Operand::new("input", input)?,
                Operand::new("output", output)?,
            );
            o.expect_len(i.len.saturating_mul(n), n)?;
            same_type(&i, &o)?;
            if n == 1 {
                plan.copy(&o, 0, &i, 0, i.len)?;
            } else {
                plan.calls.push(Call::AllGather {
                    send: i.ptr,
                    recv: o.ptr,
                    count: i.len,
                    dtype: i.dtype,
                });
            }
        }
        CommOp::Allreduce { input, output, op } => {
            let (i, o) = (
                Operand::new("input", input)?,
                Operand::new("output", output)?,
            );
            o.expect_len(i.len, 1)?;
            same_type(&i, &o)?;
            if n == 1 {
                plan.copy(&o, 0, &i, 0, i.len)?;
            } else {
                plan.calls.push(Call::AllReduce {
                    send: i.ptr,
                    recv: o.ptr,
                    count: i.len,
                    dtype: i.dtype,
                    op: *op,
                });
            }
        }
        CommOp::ReduceScatter { input, output, op } => {
            let (i, o) = (
                Operand::new("input", input)?,
                Operand::new("output", output)?,
            );
            i.expect_len(o.len.saturating_mul(n), n)?;
            same_type(&i, &o)?;
            if n == 1 {
                plan.copy(&o, 0, &i, 0, o.len)?;
            } else {
                plan.calls.push(Call::ReduceScatter {
                    send: i.ptr,
                    recv: o.ptr,
                    count: o.len,
                    dtype: o.dtype,
                    op: *op,
                });
            }
        }
        CommOp::Broadcast {
            root,
            input,
            output,
        } => {
            check_root(*root)?;
            let o = Operand::new("output", output)?;
            let send = if index == *root {
                let i = Operand::new("input", input)?;
                o.expect_len(i.len, 1)?;
                same_type(&i, &o)?;
                if n == 1 {
                    plan.copy(&o, 0, &i, 0, i.len)?;
                    return Ok(plan);
                }
                i.ptr
            } else {
                // NCCL reads the send buffer on the root only; pass the output, as an
                // in-place broadcast does.
                o.ptr
            };
            plan.calls.push(Call::Broadcast {
                send,
                recv: o.ptr,
                count: o.len,
                dtype: o.dtype,
                root: *root,
            });
        }
        CommOp::Reduce {
            root,
            input,
            output,
            op,
        } => {
            check_root(*root)?;
            let i = Operand::new("input", input)?;
            let recv = if index == *root {
                let o = Operand::new("output", output)?;
                o.expect_len(i.len, 1)?;
                same_type(&i, &o)?;
                if n == 1 {
                    plan.copy(&o, 0, &i, 0, i.len)?;
                    return Ok(plan);
                }
                o.ptr
            } else {
                // NCCL writes the receive buffer on the root only; pass the input, as an
                // in-place reduce does.
                i.ptr
            };
            plan.calls.push(Call::Reduce {
                send: i.ptr,
                recv,
                count: i.len,
                dtype: i.dtype,
                op: *op,
                root: *root,
            });
        }
        CommOp::Gather {
            root,
            input,
            output,
        } => {
            check_root(*root)?;
            let i = Operand::new("input", input)?;
            if index == *root {
                let o = Operand::new("output", output)?;
                o.expect_len(i.len.saturating_mul(n), n)?;
                same_type(&i, &o)?;
                for j in (0..n).filter(|&j| j != index) {
                    plan.calls.push(Call::Recv {
                        buf: o.piece(j, i.len)?,
                        count: i.len,
                        dtype: o.dtype,
                        peer: j,
                    });
                }
                plan.copy(&o, index, &i, 0, i.len)?;
            } else {
                plan.calls.push(Call::Send {
                    buf: i.ptr,
                    count: i.len,
                    dtype: i.dtype,
                    peer: *root,
                });
            }
        }
        CommOp::Scatter {
            root,
            input,
            output,
        } => {
            check_root(*root)?;
            let o = Operand::new("output", output)?;
            if index == *root {
                let i = Operand::new("input", input)?;
                i.expect_len(o.len.saturating_mul(n), n)?;
                same_type(&i, &o)?;
                for j in (0..n).filter(|&j| j != index) {
                    plan.calls.push(Call::Send {
                        buf: i.piece(j, o.len)?,
                        count: o.len,
                        dtype: i.dtype,
                        peer: j,
                    });
                }
                plan.copy(&o, 0, &i, index, o.len)?;
            } else {
                plan.calls.push(Call::Recv {
                    buf: o.ptr,
                    count: o.len,
                    dtype: o.dtype,
                    peer: *root,
                });
            }
        }
        CommOp::SendRecv {
            root,
            input,
            output,
        } => {
            if n != 2 {
                return Err(format!("send-recv needs a team of two ranks, not {n}"));
            }
            check_root(*root)?;
            if index == *root {
                let i = Operand::new("input", input)?;
                plan.calls.push(Call::Send {
                    buf: i.ptr,
                    count: i.len,
                    dtype: i.dtype,
                    peer: 1 - *root,
                });
            } else {
                let o = Operand::new("output", output)?;
                plan.calls.push(Call::Recv {
                    buf: o.ptr,
                    count: o.len,
                    dtype: o.dtype,
                    peer: *root,
                });
            }
        }
        CommOp::AllToAll { input, output } => {
            let (i, o) = (
                Operand::new("input", input)?,
                Operand::new("output", output)?,
            );
            o.expect_len(i.len, 1)?;
            if i.len % n != 0 {
                return Err(format!(
                    "the input's {} elements do not split into {n} equal pieces",
                    i.len
                ));
            }
            same_type(&i, &o)?;
            let piece = i.len / n;
            for j in (0..n).filter(|&j| j != index) {
                plan.calls.push(Call::Send {
                    buf: i.piece(j, piece)?,
                    count: piece,
                    dtype: i.dtype,
                    peer: j,
                });
            }
            for j in (0..n).filter(|&j| j != index) {
                plan.calls.push(Call::Recv {
                    buf: o.piece(j, piece)?,
                    count: piece,
                    dtype: o.dtype,
                    peer: j,
                });
            }
            plan.copy(&o, index, &i, index, piece)?;
        }
        CommOp::CollectivePermute {
            input,
            output,
            send_to,
            recv_from,
        } => {
            for (what, member) in [("send_to", *send_to), ("recv_from", *recv_from)] {
                if member >= n {
                    return Err(format!("{what} {member} is out of range for a team of {n}"));
                }
            }
            let (i, o) = (
                Operand::new("input", input)?,
                Operand::new("output", output)?,
            );
            same_type(&i, &o)?;
            match (*send_to == index, *recv_from == index) {
                (true, true) => {
                    o.expect_len(i.len, 1)?;
                    plan.copy(&o, 0, &i, 0, i.len)?;
                }
                (true, false) => {
                    return Err(format!(
                        "member {index} sends to itself but receives from member {recv_from}"
                    ));
                }
                (false, true) => {
                    return Err(format!(
                        "member {index} receives from itself but sends to member {send_to}"
                    ));
                }
                (false, false) => {
                    plan.calls.push(Call::Send {
                        buf: i.ptr,
                        count: i.len,
                        dtype: i.dtype,
                        peer: *send_to,
                    });
                    plan.calls.push(Call::Recv {
                        buf: o.ptr,
                        count: o.len,
                        dtype: o.dtype,
                        peer: *recv_from,
                    });
                }
            }
        }
    }
    plan.drop_empty_calls();
    Ok(plan)
}

/// What `rank` issues for a point-to-point group in a world of `world` ranks: every send,
/// then every receive, on the world communicator. Transfers of a rank to itself are paired
/// in order within the group and become copies.
fn plan_p2p<B: DeviceBuffer>(rank: usize, world: usize, ops: &[P2p<B>]) -> Result<Plan, String> {
    let mut plan = Plan::default();
    let mut recvs = Vec::new();
    let mut self_sends = Vec::new();
    let mut self_recvs = Vec::new();
    for op in ops {
        let (P2p::Send { peer, .. } | P2p::Recv { peer, .. }) = op;
        if *peer >= world {
            return Err(format!("rank {peer} is outside the world of {world} ranks"));
        }
    }
    for op in ops {
        match op {
            P2p::Send { peer, buffer } => {
                let b = Operand::new(format!("buffer sent to rank {peer}"), buffer)?;
                if *peer == rank {
                    self_sends.push(b);
                } else {
                    plan.calls.push(Call::Send {
                        buf: b.ptr,
                        count: b.len,
                        dtype: b.dtype,
                        peer: *peer,
                    });
                }
            }
            P2p::Recv { peer, buffer } => {
                let b = Operand::new(format!("buffer received from rank {peer}"), buffer)?;
                if *peer == rank {
                    self_recvs.push(b);
                } else {
                    recvs.push(Call::Recv {
                        buf: b.ptr,
                        count: b.len,
                        dtype: b.dtype,
                        peer: *peer,
                    });
                }
            }
        }
    }
    plan.calls.extend(recvs);
    if self_sends.len() != self_recvs.len() {
        return Err(format!(
            "rank {rank} sends to itself {} time(s) but receives from itself {} time(s) in \
             this group; a transfer to itself must be matched within one group",
            self_sends.len(),
            self_recvs.len()
        ));
    }
    for (send, recv) in self_sends.iter().zip(&self_recvs) {
        if send.dtype != recv.dtype {
            return Err(format!(
                "rank {rank} sends {} data to itself but receives into {}",
                send.dtype, recv.dtype
            ));
        }
        if send.len != recv.len {
            return Err(format!(
                "rank {rank} sends {} elements to itself but receives {}",
                send.len, recv.len
            ));
        }
        plan.copy(recv, 0, send, 0, send.len)?;
    }
    plan.drop_empty_calls();
    Ok(plan)
}

// ---------------------------------------------------------------------------------------
// The communicator
// ---------------------------------------------------------------------------------------

/// A raw NCCL communicator handle.
///
/// NCCL communicators are not tied to the thread that created them: a communicator may be
/// used from any thread as long as no two calls on it run at the same time. Every handle of
/// an [`Nccl`] lives inside its `Mutex<Comms>` and is only passed to NCCL while that mutex
/// is held, so moving it between threads (`Send`) is sound; shared access (`Sync`) is never
/// needed, since the mutex provides it.
struct RawComm(sys::ncclComm_t);

// SAFETY: see the type's documentation: the handle is an opaque pointer that NCCL allows
// any thread to use, and every use is serialised by the owning `Mutex`.
unsafe impl Send for RawComm {}

/// A rank's live communicators.
struct Comms {
    /// The world communicator; `None` once aborted or destroyed.
    world: Option<RawComm>,
    /// This rank's split communicators, by team, in creation order.
    teams: Vec<(Vec<usize>, RawComm)>,
    /// Every team split so far, including those this rank is not a member of.
    prepared: HashSet<Vec<usize>>,
}

impl Comms {
    fn team(&self, team: &[usize]) -> Option<sys::ncclComm_t> {
        self.teams
            .iter()
            .find(|(t, _)| t.as_slice() == team)
            .map(|(_, c)| c.0)
    }

    /// Every handle, split communicators first.
    fn all(&self) -> Vec<(String, sys::ncclComm_t)> {
        let mut all: Vec<_> = self
            .teams
            .iter()
            .map(|(team, c)| (format!("team {team:?}"), c.0))
            .collect();
        if let Some(world) = &self.world {
            all.push(("the world".to_string(), world.0));
        }
        all
    }
}

/// One rank's NCCL communicators, posting on [`GpuStream`]s of its GPU. See the
/// [module documentation](self).
pub struct Nccl<B> {
    rank: usize,
    world: usize,
    gpu: Gpu,
    options: NcclOptions,
    /// The loaded library's version, for `ncclConfig_t`.
    version: i32,
    comms: Mutex<Comms>,
    aborted: AtomicBool,
    abort_reason: Mutex<Option<String>>,
    _buffers: PhantomData<fn() -> B>,
}

impl<B> fmt::Debug for Nccl<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nccl")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("gpu", &self.gpu.ordinal())
            .field("aborted", &self.aborted.load(Ordering::Acquire))
            .finish_non_exhaustive()
    }
}

/// Why a poll stopped before its communicators settled.
enum Stop {
    /// NCCL reported an error.
    Failed(String),
    /// The timeout passed.
    TimedOut,
    /// The rank was aborted meanwhile.
    Aborted,
}

impl<B> Nccl<B> {
    /// Joins the NCCL world named by `id` as rank `rank` of `world`, on `gpu`
    /// (`ncclCommInitRankConfig`, non-blocking). Every rank calls it, each from its own
    /// thread or process, with the same id. Fails with [`CommError::Timeout`] when the
    /// world is not complete within `options.timeout` (the half-made communicator is
    /// aborted), and with [`CommError::Backend`] when the library is missing or NCCL fails.
    pub fn init(
        gpu: &Gpu,
        rank: usize,
        world: usize,
        id: &NcclId,
        options: NcclOptions,
    ) -> Result<Nccl<B>, CommError> {
        let what = format!("NCCL init of rank {rank} of {world}");
        if world == 0 || rank >= world || i32::try_from(world).is_err() {
            return Err(CommError::Bootstrap(format!(
                "{what}: rank {rank} is outside a world of {world} ranks"
            )));
        }
        let version = library()?;
        let config = make_config(version, &options).map_err(|e| backend(&what, e))?;
        gpu.bind()?;
        let nccl = Nccl {
            rank,
            world,
            gpu: gpu.clone(),
            options,
            version,
            comms: Mutex::new(Comms {
                world: None,
                teams: Vec::new(),
                prepared: HashSet::new(),
            }),
            aborted: AtomicBool::new(false),
            abort_reason: Mutex::new(None),
            _buffers: PhantomData,
        };
        let others: Vec<usize> = (0..world).filter(|&r| r != rank).collect();
        let start = Instant::now();
        // The handle cell and the config are leaked on purpose (a few hundred bytes per
        // communicator): with a non-blocking communicator NCCL finishes the init on its own
        // thread, which may still touch them after the call has returned.
        let cell: &'static mut sys::ncclComm_t = Box::leak(Box::new(std::ptr::null_mut()));
        let config: &'static mut sys::ncclConfig_t = Box::leak(Box::new(config));
        // SAFETY: the library is loaded; `cell` and `config` live for the whole process;
        // `world` and `rank` fit in an i32 (checked above). The GPU's context is current on
        // this thread.
        let result = unsafe {
            sys::ncclCommInitRankConfig(
                &mut *cell,
                world as c_int,
                id.raw(),
                rank as c_int,
                &mut *config,
            )
        };
        let comm: sys::ncclComm_t = *cell;
        match result {
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => {}
            error => {
                if !comm.is_null() {
                    // SAFETY: a non-null handle returned by the failed init is a live
                    // communicator that must be released.
                    unsafe { sys::ncclCommAbort(comm) };
                }
                return Err(backend(&what, describe(error)));
            }
        }
        if comm.is_null() {
            return Err(backend(
                &what,
                "ncclCommInitRankConfig returned no communicator".into(),
            ));
        }
        match nccl.poll(&[comm], start) {
            Ok(()) => {}
            Err(stop) => {
                // SAFETY: `comm` is the live, unsettled communicator made above; aborting
                // is the documented way to give up on it.
                unsafe { sys::ncclCommAbort(comm) };
                return Err(match stop {
                    Stop::TimedOut => CommError::Timeout {
                        op: what,
                        rank,
                        waiting_for: others,
                        millis: millis(nccl.options.timeout),
                    },
                    Stop::Failed(message) => backend(&what, message),
                    Stop::Aborted => backend(&what, "aborted during init".into()),
                });
            }
        }
        nccl.lock().world = Some(RawComm(comm));
        Ok(nccl)
    }

    /// This rank's GPU.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The options the communicators were made with.
    pub fn options(&self) -> &NcclOptions {
        &self.options
    }

    /// Makes the communicators of `teams` (world ranks in team order, the program's teams
    /// in program order). Collective over the whole world: every rank calls it with the same
    /// list, including the teams it is not a member of. Teams that need no split (the world
    /// in rank order, one-member teams) and teams prepared by an earlier call are skipped, so
    /// it may be called again with more teams. Pairwise disjoint teams share one
    /// `ncclCommSplit`.
    pub fn prepare_teams(&self, teams: &[Vec<usize>]) -> Result<(), CommError> {
        const WHAT: &str = "prepare_teams";
        let rank = self.rank;
        let mut comms = self.lock_live(WHAT)?;
        let plan = TeamPlan::new(self.world, teams, &comms.prepared)
            .map_err(|detail| mismatch(WHAT, rank, detail))?;
        if plan.rounds.is_empty() {
            return Ok(());
        }
        self.gpu.bind()?;
        let Some(parent) = comms.world.as_ref().map(|c| c.0) else {
            return Err(self.dead(WHAT));
        };
        let others: Vec<usize> = (0..self.world).filter(|&r| r != rank).collect();
        for round in 0..plan.rounds.len() {
            let (color, key, team) = plan.split_args(round, rank);
            let what = match team {
                Some(team) => format!("ncclCommSplit for team {team:?}"),
                None => format!("ncclCommSplit round {round} (no team of this rank)"),
            };
            // NCCL stores the new handle through this pointer when the split completes,
            // possibly on another thread: it must stay put until then (it is leaked below
            // when the split is given up).
            // Both leaked on purpose: NCCL completes a non-blocking split on its own thread
            // and may write the handle (or read the config) after the call returns, even
            // for a rank that passes no color.
            let out: &'static AtomicPtr<sys::ncclComm> = Box::leak(Box::new(AtomicPtr::new(
                std::ptr::null_mut::<sys::ncclComm>(),
            )));
            let config: &'static mut sys::ncclConfig_t = Box::leak(Box::new(
                make_config(self.version, &self.options).map_err(|e| backend(WHAT, e))?,
            ));
            let start = Instant::now();
            // SAFETY: `parent` is this rank's live world communicator (the mutex is held);
            // `out` is a heap cell that outlives the split (see above); `config` is copied
            // by NCCL during the call.
            let result =
                unsafe { sys::ncclCommSplit(parent, color, key, out.as_ptr(), &mut *config) };
            let settled = match result {
                sys::ncclResult_t::ncclSuccess => Ok(()),
                sys::ncclResult_t::ncclInProgress => self.poll(&[parent], start),
                error => Err(Stop::Failed(describe(error))),
            };
            if let Err(stop) = settled {
                return Err(self.give_up(&mut comms, stop, WHAT, &what, others));
            }
            // The parent settles before NCCL's thread has stored the child's handle: wait
            // for it, within the timeout.
            let mut child = out.load(Ordering::Acquire);
            while team.is_some() && child.is_null() && start.elapsed() < self.options.timeout {
                std::thread::sleep(Duration::from_micros(50));
                child = out.load(Ordering::Acquire);
            }
            if let Some(team) = team {
                if child.is_null() {
                    return Err(backend(
                        WHAT,
                        format!("{what} completed without a communicator"),
                    ));
                }
                comms.teams.push((team.to_vec(), RawComm(child)));
                if let Err(stop) = self.poll(&[child], start) {
                    return Err(self.give_up(&mut comms, stop, WHAT, &what, others));
                }
            }
            for &index in &plan.rounds[round] {
                if let Some(team) = plan.splits.get(index) {
                    comms.prepared.insert(team.clone());
                }
            }
        }
        Ok(())
    }

    /// The first error NCCL reports on any of this rank's communicators
    /// (`ncclCommGetAsyncError`), for the executor to check while it waits for the GPU. An
    /// error aborts the rank's communicators (their kernels would never finish otherwise).
    /// Answers `None` while another thread is issuing NCCL calls on this rank (that call
    /// sees any error itself), and [`CommError::PeerFailed`] naming this rank once it has
    /// been aborted.
    pub fn async_error(&self) -> Option<CommError> {
        if self.aborted.load(Ordering::Acquire) {
            return Some(self.dead("NCCL"));
        }
        let mut comms = match self.comms.try_lock() {
            Ok(comms) => comms,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        for (name, comm) in comms.all() {
            let mut state = sys::ncclResult_t::ncclSuccess;
            // SAFETY: `comm` is live (the mutex is held and it has not been aborted);
            // `state` is a valid out-pointer.
            let result = unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
            let failure = if result != sys::ncclResult_t::ncclSuccess {
                Some(describe(result))
            } else if !matches!(
                state,
                sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
            ) {
                Some(describe(state))
            } else {
                None
            };
            if let Some(message) = failure {
                let message = format!("the communicator of {name} reported {message}");
                let error = backend(&format!("NCCL on rank {}", self.rank), message);
                self.abort_locked(&mut comms, &error.to_string());
                return Some(error);
            }
        }
        None
    }

    fn lock(&self) -> MutexGuard<'_, Comms> {
        self.comms.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The error of any operation `op` once this rank has been aborted.
    fn dead(&self, op: &str) -> CommError {
        let reason = self
            .abort_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| "the communicators were released".into());
        CommError::PeerFailed {
            op: op.to_string(),
            rank: self.rank,
            failed_rank: self.rank,
            reason,
        }
    }

    /// The communicators, unless the rank has been aborted.
    fn lock_live(&self, op: &str) -> Result<MutexGuard<'_, Comms>, CommError> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(self.dead(op));
        }
        let comms = self.lock();
        if self.aborted.load(Ordering::Acquire) || comms.world.is_none() {
            return Err(self.dead(op));
        }
        Ok(comms)
    }

    /// Polls `comms` until none is in progress, failing on an NCCL error, after the
    /// timeout (counted from `start`), or when the rank is aborted meanwhile.
    fn poll(&self, comms: &[sys::ncclComm_t], start: Instant) -> Result<(), Stop> {
        let mut pending: Vec<sys::ncclComm_t> = comms.to_vec();
        let mut pause = weave_cuda::Backoff::new();
        loop {
            let mut still = Vec::new();
            for &comm in &pending {
                let mut state = sys::ncclResult_t::ncclInProgress;
                // SAFETY: `comm` is live: callers hold the communicator mutex or own the
                // handle exclusively (during init); `state` is a valid out-pointer.
                let result = unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
                if result != sys::ncclResult_t::ncclSuccess {
                    return Err(Stop::Failed(describe(result)));
                }
                match state {
                    sys::ncclResult_t::ncclSuccess => {}
                    sys::ncclResult_t::ncclInProgress => still.push(comm),
                    error => return Err(Stop::Failed(describe(error))),
                }
            }
            if still.is_empty() {
                return Ok(());
            }
            pending = still;
            if self.aborted.load(Ordering::Acquire) {
                return Err(Stop::Aborted);
            }
            if start.elapsed() >= self.options.timeout {
                return Err(Stop::TimedOut);
            }
            pause.pause();
        }
    }

    /// Turns a failed poll of `what` (part of operation `op`) into its error; a timeout or
    /// an NCCL error aborts every communicator of the rank, as NCCL requires before its
    /// communicators can be released.
    fn give_up(
        &self,
        comms: &mut Comms,
        stop: Stop,
        op: &str,
        what: &str,
        waiting_for: Vec<usize>,
    ) -> CommError {
        match stop {
            Stop::Aborted => self.dead(op),
            Stop::TimedOut => {
                let error = CommError::Timeout {
                    op: op.to_string(),
                    rank: self.rank,
                    waiting_for,
                    millis: millis(self.options.timeout),
                };
                self.abort_locked(comms, &format!("{what}: {error}"));
                error
            }
            Stop::Failed(message) => {
                let error = backend(op, format!("{what} failed: {message}"));
                self.abort_locked(comms, &error.to_string());
                error
            }
        }
    }

    /// Aborts every communicator (idempotent), remembering the first reason.
    fn abort_locked(&self, comms: &mut Comms, reason: &str) {
        {
            let mut stored = self.abort_reason.lock().unwrap_or_else(|e| e.into_inner());
            if stored.is_none() {
                *stored = Some(reason.to_string());
            }
        }
        self.aborted.store(true, Ordering::Release);
        let _ = self.gpu.bind();
        for (_, comm) in comms.teams.drain(..) {
            // SAFETY: each handle is live and removed from the set here, so it is aborted
            // exactly once and never used again.
            unsafe { sys::ncclCommAbort(comm.0) };
        }
        if let Some(world) = comms.world.take() {
            // SAFETY: as above, for the world communicator.
            unsafe { sys::ncclCommAbort(world.0) };
        }
    }

    /// Issues `plan` on `comm` (when it has NCCL calls) and `stream`.
    fn issue(
        &self,
        comms: &mut Comms,
        comm: Option<sys::ncclComm_t>,
        plan: &Plan,
        stream: &GpuStream,
        label: &str,
        waiting_for: Vec<usize>,
    ) -> Result<(), CommError> {
        if !plan.calls.is_empty() {
            let Some(comm) = comm else {
                return Err(backend(label, "no communicator for the operation".into()));
            };
            let cu_stream = stream.cu_stream() as sys::cudaStream_t;
            let start = Instant::now();
            let grouped = plan.grouped();
            let mut first_error: Option<(String, sys::ncclResult_t)> = None;
            if grouped {
                // SAFETY: the library is loaded (a communicator exists); group calls only
                // change this thread's NCCL state and are balanced below.
                let result = unsafe { sys::ncclGroupStart() };
                if result != sys::ncclResult_t::ncclSuccess {
                    return Err(backend(
                        label,
                        format!("ncclGroupStart: {}", describe(result)),
                    ));
                }
            }
            let mut last = sys::ncclResult_t::ncclSuccess;
            for call in &plan.calls {
                // SAFETY: `comm` is live (the mutex is held); the addresses come from
                // `DeviceBuffer`s of this GPU whose lengths were checked against the
                // counts; `cu_stream` is a stream of this GPU (checked by the caller).
                let result = unsafe { call_nccl(call, comm, cu_stream) };
                match result {
                    sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => {
                        last = result;
                    }
                    error => {
                        first_error.get_or_insert((call.name().to_string(), error));
                        if !grouped {
                            break;
                        }
                    }
                }
            }
            if grouped {
                // SAFETY: closes the group opened above, even after a failed call, as NCCL
                // requires.
                last = unsafe { sys::ncclGroupEnd() };
                if first_error.is_none()
                    && !matches!(
                        last,
                        sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
                    )
                {
                    first_error = Some(("ncclGroupEnd".to_string(), last));
                }
            }
            if let Some((call, error)) = first_error {
                let stop = Stop::Failed(format!("{call}: {}", describe(error)));
                return Err(self.give_up(comms, stop, label, call.as_str(), waiting_for));
            }
            if last == sys::ncclResult_t::ncclInProgress {
                if let Err(stop) = self.poll(&[comm], start) {
                    let what = format!("posting {label}");
                    return Err(self.give_up(comms, stop, label, &what, waiting_for));
                }
            }
        }
        for copy in &plan.copies {
            stream.gpu().copy(copy.dst, copy.src, copy.bytes, stream)?;
        }
        Ok(())
    }

    fn check_stream(&self, label: &str, stream: &GpuStream) -> Result<(), CommError> {
        let device = stream.gpu().ordinal();
        if device != self.gpu.ordinal() {
            return Err(mismatch(
                label,
                self.rank,
                format!(
                    "the stream belongs to GPU {device} but the communicator to GPU {}",
                    self.gpu.ordinal()
                ),
            ));
        }
        Ok(())
    }
}

/// Issues one NCCL call.
///
/// # Safety
///
/// `comm` must be a live communicator used by no other thread meanwhile, the call's
/// addresses must hold `count` elements on the communicator's GPU, and `stream` must be a
/// stream of that GPU.
unsafe fn call_nccl(
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
            } => sys::ncclAllReduce(
                ptr(send),
                ptr(recv),
                count,
                nccl_type(dtype),
                nccl_op(dtype, op),
                comm,
                stream,
            ),
            Call::ReduceScatter {
                send,
                recv,
                count,
                dtype,
                op,
            } => sys::ncclReduceScatter(
                ptr(send),
                ptr(recv),
                count,
                nccl_type(dtype),
                nccl_op(dtype, op),
                comm,
                stream,
            ),
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

impl<B: DeviceBuffer> Communicator for Nccl<B> {
    type Buffer = B;
    type Stream = GpuStream;

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.world
    }

    fn timeout(&self) -> Duration {
        self.options.timeout
    }

    fn post(&self, collective: Collective<B>, stream: &GpuStream) -> Result<(), CommError> {
        let Collective { label, team, op } = collective;
        let rank = self.rank;
        let Some(index) = team.iter().position(|&r| r == rank) else {
            return Err(CommError::NotInTeam {
                rank,
                team,
                op: label,
            });
        };
        check_team(&team, self.world).map_err(|detail| mismatch(&label, rank, detail))?;
        let plan =
            plan_collective(&op, index, team.len()).map_err(|d| mismatch(&label, rank, d))?;
        self.check_stream(&label, stream)?;
        let mut comms = self.lock_live(&label)?;
        let comm = match TeamRoute::of(&team, self.world) {
            TeamRoute::Alone => None,
            TeamRoute::World => comms.world.as_ref().map(|c| c.0),
            TeamRoute::Split => match comms.team(&team) {
                Some(comm) => Some(comm),
                None => {
                    return Err(backend(
                        &label,
                        format!(
                            "team {team:?} was not prepared: every rank must call \
                             Nccl::prepare_teams with the program's teams before posting"
                        ),
                    ));
                }
            },
        };
        self.gpu.bind()?;
        let others = team.iter().copied().filter(|&r| r != rank).collect();
        self.issue(&mut comms, comm, &plan, stream, &label, others)
    }

    fn post_p2p(
        &self,
        label: String,
        ops: Vec<P2p<B>>,
        stream: &GpuStream,
    ) -> Result<(), CommError> {
        let rank = self.rank;
        let plan = plan_p2p(rank, self.world, &ops).map_err(|d| mismatch(&label, rank, d))?;
        if ops.is_empty() {
            return Ok(());
        }
        self.check_stream(&label, stream)?;
        let mut comms = self.lock_live(&label)?;
        let comm = comms.world.as_ref().map(|c| c.0);
        self.gpu.bind()?;
        let mut peers: Vec<usize> = plan
            .calls
            .iter()
            .filter_map(|call| match call {
                Call::Send { peer, .. } | Call::Recv { peer, .. } => Some(*peer),
                _ => None,
            })
            .collect();
        peers.sort_unstable();
        peers.dedup();
        self.issue(&mut comms, comm, &plan, stream, &label, peers)
    }

    /// Aborts every communicator of this rank (`ncclCommAbort`; idempotent). Operations
    /// already enqueued on the GPU are cancelled, peers waiting for this rank see NCCL
    /// errors, and every later operation of this rank fails with
    /// [`CommError::PeerFailed`] naming `reason`.
    fn abort(&self, reason: &str) {
        {
            let mut stored = self.abort_reason.lock().unwrap_or_else(|e| e.into_inner());
            if stored.is_none() {
                *stored = Some(reason.to_string());
            }
        }
        // A poll in progress on another thread sees the flag and lets go of the mutex.
        self.aborted.store(true, Ordering::Release);
        let mut comms = self.lock();
        self.abort_locked(&mut comms, reason);
    }
}

impl<B> Drop for Nccl<B> {
    /// Finalises and destroys every communicator (`ncclCommFinalize`, then
    /// `ncclCommDestroy`), or aborts those whose finalisation fails or outlasts the timeout.
    /// Nothing to do after an abort.
    fn drop(&mut self) {
        let comms = self.comms.get_mut().unwrap_or_else(|e| e.into_inner());
        if self.aborted.load(Ordering::Acquire) {
            return;
        }
        let mut handles: Vec<sys::ncclComm_t> = comms.teams.drain(..).map(|(_, c)| c.0).collect();
        handles.extend(comms.world.take().map(|c| c.0));
        if handles.is_empty() {
            return;
        }
        let _ = self.gpu.bind();
        let start = Instant::now();
        let mut finalizing = Vec::new();
        let mut failed = Vec::new();
        for comm in handles {
            // SAFETY: `comm` is live and owned here alone (`&mut self`); it is finalised
            // once.
            match unsafe { sys::ncclCommFinalize(comm) } {
                sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => {
                    finalizing.push(comm);
                }
                _ => failed.push(comm),
            }
        }
        let mut sleep = Duration::from_micros(20);
        while !finalizing.is_empty() && start.elapsed() < self.options.timeout {
            let mut still = Vec::new();
            for comm in finalizing {
                let mut state = sys::ncclResult_t::ncclInProgress;
                // SAFETY: `comm` is live (finalising, not yet destroyed); `state` is a valid
                // out-pointer.
                let result = unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
                match (result, state) {
                    (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclSuccess) => {
                        // SAFETY: finalised; destroyed once and forgotten.
                        unsafe { sys::ncclCommDestroy(comm) };
                    }
                    (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclInProgress) => {
                        still.push(comm);
                    }
                    _ => failed.push(comm),
                }
            }
            finalizing = still;
            if !finalizing.is_empty() {
                std::thread::sleep(sleep);
                sleep = (sleep * 2).min(Duration::from_millis(1));
            }
        }
        for comm in failed.into_iter().chain(finalizing) {
            // SAFETY: live handles whose finalisation failed or timed out; aborted once.
            unsafe { sys::ncclCommAbort(comm) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer at a made-up address: plans never dereference it.
    #[derive(Clone, Debug)]
    struct Fake {
        ptr: u64,
        len: usize,
        dtype: DataType,
        contiguous: bool,
    }

    impl DeviceBuffer for Fake {
        fn device_ptr(&self) -> u64 {
            self.ptr
        }
        fn len(&self) -> usize {
            self.len
        }
        fn data_type(&self) -> DataType {
            self.dtype
        }
        fn is_contiguous(&self) -> bool {
            self.contiguous
        }
    }

    fn buf(ptr: u64, len: usize) -> Fake {
        Fake {
            ptr,
            len,
            dtype: DataType::F32,
            contiguous: true,
        }
    }

    const IN: u64 = 0x10_0000;
    const OUT: u64 = 0x20_0000;

    #[test]
    fn id_round_trip_and_length_check() {
        let mut bytes = [0u8; 128];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 7 % 256) as u8;
        }
        let id = NcclId::from_bytes(&bytes).unwrap();
        assert_eq!(id.as_bytes(), &bytes);
        let raw = id.raw();
        assert_eq!(raw.internal[200 % 128] as u8, bytes[200 % 128]);
        assert_eq!(
            NcclId::from_bytes(&raw.internal.map(|c| c as u8)).unwrap(),
            id
        );
        let short = NcclId::from_bytes(&bytes[..127]).unwrap_err();
        assert_eq!(
            short.to_string(),
            "bootstrap failed: an NCCL id has 128 bytes, not 127"
        );
        assert!(NcclId::from_bytes(&[0u8; 129]).is_err());
        assert_eq!(format!("{id:?}"), "NcclId(00070e151c232a31…)");
    }

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

    #[test]
    fn config_is_non_blocking_with_undefined_defaults() {
        let config = make_config(22803, &NcclOptions::default()).unwrap();
        assert_eq!(config.size, size_of::<sys::ncclConfig_t>());
        assert_eq!(config.magic, 0xcafebeef);
        assert_eq!(config.version, 22803);
        assert_eq!(config.blocking, 0);
        for field in [
            config.cgaClusterSize,
            config.minCTAs,
            config.maxCTAs,
            config.splitShare,
            config.trafficClass,
            config.collnetEnable,
            config.CTAPolicy,
            config.shrinkShare,
            config.nvlsCTAs,
            config.nChannelsPerNetPeer,
            config.nvlinkCentricSched,
        ] {
            assert_eq!(field, i32::MIN);
        }
        assert!(config.netName.is_null() && config.commName.is_null());

        let options = NcclOptions {
            max_ctas: Some(8),
            min_ctas: Some(2),
            ..NcclOptions::default()
        };
        let config = make_config(22803, &options).unwrap();
        assert_eq!((config.minCTAs, config.maxCTAs), (2, 8));
        let blocking = NcclOptions {
            blocking: true,
            ..NcclOptions::default()
        };
        assert_eq!(make_config(22803, &blocking).unwrap().blocking, 1);
        let only_max = NcclOptions {
            max_ctas: Some(4),
            ..NcclOptions::default()
        };
        assert_eq!(make_config(22803, &only_max).unwrap().minCTAs, i32::MIN);

        let err = |min, max| {
            make_config(
                22803,
                &NcclOptions {
                    min_ctas: min,
                    max_ctas: max,
                    ..NcclOptions::default()
                },
            )
            .unwrap_err()
        };
        assert_eq!(
            err(Some(2), None),
            "NcclOptions::min_ctas needs max_ctas as well"
        );
        assert_eq!(
            err(Some(9), Some(8)),
            "NcclOptions::min_ctas (9) is larger than max_ctas (8)"
        );
        assert_eq!(
            err(None, Some(0)),
            "NcclOptions::max_ctas is 0; it must be positive"
        );
        assert_eq!(NcclOptions::default().timeout, Duration::from_secs(60));
        assert_eq!(version_name(22803), "2.28.3");
    }

    #[test]
    fn routes_of_teams() {
        assert_eq!(TeamRoute::of(&[2], 4), TeamRoute::Alone);
        assert_eq!(TeamRoute::of(&[], 4), TeamRoute::Alone);
        assert_eq!(TeamRoute::of(&[0], 1), TeamRoute::Alone);
        assert_eq!(TeamRoute::of(&[0, 1, 2, 3], 4), TeamRoute::World);
        assert_eq!(TeamRoute::of(&[0, 1], 2), TeamRoute::World);
        assert_eq!(TeamRoute::of(&[1, 0], 2), TeamRoute::Split);
        assert_eq!(TeamRoute::of(&[3, 2, 1, 0], 4), TeamRoute::Split);
        assert_eq!(TeamRoute::of(&[0, 1], 4), TeamRoute::Split);
    }

    #[test]
    fn team_plan_packs_disjoint_teams_into_rounds() {
        let teams = vec![
            vec![0, 1, 2, 3], // world: no split
            vec![0, 1],
            vec![2, 3],
            vec![2],    // alone
            vec![0, 1], // repeated
            vec![1, 2],
            vec![3, 2, 1, 0], // world reversed: split
            vec![3, 0],
        ];
        let plan = TeamPlan::new(4, &teams, &HashSet::new()).unwrap();
        assert_eq!(
            plan.splits,
            vec![
                vec![0, 1],
                vec![2, 3],
                vec![1, 2],
                vec![3, 2, 1, 0],
                vec![3, 0]
            ]
        );
        // [1, 2] is disjoint from [3, 0], so they share a round.
        assert_eq!(plan.rounds, vec![vec![0, 1], vec![2, 4], vec![3]]);
        // Round 0: ranks 0, 1 in color 0, ranks 2, 3 in color 1; keys are team indices.
        assert_eq!(plan.split_args(0, 0), (0, 0, Some(&[0usize, 1][..])));
        assert_eq!(plan.split_args(0, 1), (0, 1, Some(&[0usize, 1][..])));
        assert_eq!(plan.split_args(0, 3), (1, 1, Some(&[2usize, 3][..])));
        // Round 1: [1, 2] is color 2, [3, 0] is color 4: rank 0 is index 1 of [3, 0].
        assert_eq!(plan.split_args(1, 0), (4, 1, Some(&[3usize, 0][..])));
        assert_eq!(plan.split_args(1, 2), (2, 1, Some(&[1usize, 2][..])));
        // Round 2: the reversed world, keys reversed.
        assert_eq!(plan.split_args(2, 0).1, 3);
        assert_eq!(plan.split_args(2, 3).1, 0);
        // A rank in no team of a round passes NOCOLOR.
        let plan = TeamPlan::new(4, &[vec![0, 1]], &HashSet::new()).unwrap();
        assert_eq!(plan.split_args(0, 2), (NCCL_SPLIT_NOCOLOR, 0, None));
        // Teams already split are skipped.
        let done: HashSet<Vec<usize>> = [vec![0, 1]].into_iter().collect();
        let plan = TeamPlan::new(4, &[vec![0, 1], vec![2, 3]], &done).unwrap();
        assert_eq!(plan.splits, vec![vec![2, 3]]);
        assert_eq!(plan.rounds, vec![vec![0]]);
        let plan = TeamPlan::new(4, &[vec![0, 1, 2, 3], vec![1]], &HashSet::new()).unwrap();
        assert!(plan.rounds.is_empty());
    }

    #[test]
    fn team_plan_rejects_bad_teams() {
        let none = HashSet::new();
        assert_eq!(
            TeamPlan::new(4, &[vec![0, 4]], &none).unwrap_err(),
            "team [0, 4]: rank 4 is outside the world of 4 ranks"
        );
        assert_eq!(
            TeamPlan::new(4, &[vec![1, 2, 1]], &none).unwrap_err(),
            "team [1, 2, 1] names rank 1 twice"
        );
    }

    fn plan(op: CommOp<Fake>, index: usize, n: usize) -> Plan {
        plan_collective(&op, index, n).unwrap()
    }

    fn copy(dst: u64, src: u64, bytes: usize) -> DeviceCopy {
        DeviceCopy { dst, src, bytes }
    }

    #[test]
    fn native_collectives() {
        let f32 = DataType::F32;
        let p = plan(
            CommOp::Allgather {
                input: buf(IN, 3),
                output: buf(OUT, 12),
            },
            1,
            4,
        );
        assert_eq!(
            p.calls,
            vec![Call::AllGather {
                send: IN,
                recv: OUT,
                count: 3,
                dtype: f32
            }]
        );
        assert!(p.copies.is_empty() && !p.grouped());
        let p = plan(
            CommOp::ReduceScatter {
                input: buf(IN, 12),
                output: buf(OUT, 3),
                op: RedOp::Max,
            },
            0,
            4,
        );
        assert_eq!(
            p.calls,
            vec![Call::ReduceScatter {
                send: IN,
                recv: OUT,
                count: 3,
                dtype: f32,
                op: RedOp::Max
            }]
        );
        let p = plan(
            CommOp::Allreduce {
                input: buf(IN, 5),
                output: buf(OUT, 5),
                op: RedOp::Sum,
            },
            0,
            2,
        );
        assert_eq!(
            p.calls,
            vec![Call::AllReduce {
                send: IN,
                recv: OUT,
                count: 5,
                dtype: f32,
                op: RedOp::Sum
            }]
        );
        // Broadcast: the root sends its input; a non-root's input is never looked at.
        let bcast = |index| {
            plan(
                CommOp::Broadcast {
                    root: 1,
                    input: Fake {
                        contiguous: index == 1,
                        ..buf(IN, if index == 1 { 4 } else { 99 })
                    },
                    output: buf(OUT, 4),
                },
                index,
                3,
            )
        };
        assert_eq!(
            bcast(1).calls,
            vec![Call::Broadcast {
                send: IN,
                recv: OUT,
                count: 4,
                dtype: f32,
                root: 1
            }]
        );
        assert_eq!(
            bcast(0).calls,
            vec![Call::Broadcast {
                send: OUT,
                recv: OUT,
                count: 4,
                dtype: f32,
                root: 1
            }]
        );
        // Reduce: a non-root's output is never looked at, its receive buffer is its input.
        let reduce = |index| {
            plan(
                CommOp::Reduce {
                    root: 0,
                    input: buf(IN, 4),
                    output: Fake {
                        dtype: if index == 0 {
                            DataType::F32
                        } else {
                            DataType::Bool
                        },
                        ..buf(OUT, if index == 0 { 4 } else { 1 })
                    },
                    op: RedOp::Prod,
                },
                index,
                2,
            )
        };
        assert_eq!(
            reduce(0).calls,
            vec![Call::Reduce {
                send: IN,
                recv: OUT,
                count: 4,
                dtype: f32,
                op: RedOp::Prod,
                root: 0
            }]
        );
        assert_eq!(
            reduce(1).calls,
            vec![Call::Reduce {
                send: IN,
                recv: IN,
                count: 4,
                dtype: f32,
                op: RedOp::Prod,
                root: 0
            }]
        );
    }

    #[test]
    fn gather_and_scatter_are_point_to_point_groups_with_a_local_copy() {
        let f32 = DataType::F32;
        let root = plan(
            CommOp::Gather {
                root: 1,
                input: buf(IN, 2),
                output: buf(OUT, 6),
            },
            1,
            3,
        );
        assert_eq!(
            root.calls,
            vec![
                Call::Recv {
                    buf: OUT,
                    count: 2,
                    dtype: f32,
                    peer: 0
                },
                Call::Recv {
                    buf: OUT + 16,
                    count: 2,
                    dtype: f32,
                    peer: 2
                },
            ]
        );
        assert_eq!(root.copies, vec![copy(OUT + 8, IN, 8)]);
        assert!(root.grouped());
        let leaf = plan(
            CommOp::Gather {
                root: 1,
                input: buf(IN, 2),
                output: buf(OUT, 0),
            },
            2,
            3,
        );
        assert_eq!(
            leaf.calls,
            vec![Call::Send {
                buf: IN,
                count: 2,
                dtype: f32,
                peer: 1
            }]
        );
        assert!(leaf.copies.is_empty() && leaf.grouped());

        let root = plan(
            CommOp::Scatter {
                root: 0,
                input: buf(IN, 6),
                output: buf(OUT, 2),
            },
            0,
            3,
        );
        assert_eq!(
            root.calls,
            vec![
                Call::Send {
                    buf: IN + 8,
                    count: 2,
                    dtype: f32,
                    peer: 1
                },
                Call::Send {
                    buf: IN + 16,
                    count: 2,
                    dtype: f32,
                    peer: 2
                },
            ]
        );
        assert_eq!(root.copies, vec![copy(OUT, IN, 8)]);
        let leaf = plan(
            CommOp::Scatter {
                root: 0,
                input: buf(IN, 0),
                output: buf(OUT, 2),
            },
            2,
            3,
        );
        assert_eq!(
            leaf.calls,
            vec![Call::Recv {
                buf: OUT,
                count: 2,
                dtype: f32,
                peer: 0
            }]
        );
    }

    #[test]
    fn all_to_all_permute_and_send_recv() {
        let f32 = DataType::F32;
        let p = plan(
            CommOp::AllToAll {
                input: buf(IN, 6),
                output: buf(OUT, 6),
            },
            1,
            3,
        );
        assert_eq!(
            p.calls,
            vec![
                Call::Send {
                    buf: IN,
                    count: 2,
                    dtype: f32,
                    peer: 0
                },
                Call::Send {
                    buf: IN + 16,
                    count: 2,
                    dtype: f32,
                    peer: 2
                },
                Call::Recv {
                    buf: OUT,
                    count: 2,
                    dtype: f32,
                    peer: 0
                },
                Call::Recv {
                    buf: OUT + 16,
                    count: 2,
                    dtype: f32,
                    peer: 2
                },
            ]
        );
        assert_eq!(p.copies, vec![copy(OUT + 8, IN + 8, 8)]);

        let p = plan(
            CommOp::CollectivePermute {
                input: buf(IN, 4),
                output: buf(OUT, 4),
                send_to: 2,
                recv_from: 0,
            },
            1,
            3,
        );
        assert_eq!(
            p.calls,
            vec![
                Call::Send {
                    buf: IN,
                    count: 4,
                    dtype: f32,
                    peer: 2
                },
                Call::Recv {
                    buf: OUT,
                    count: 4,
                    dtype: f32,
                    peer: 0
                },
            ]
        );
        let p = plan(
            CommOp::CollectivePermute {
                input: buf(IN, 4),
                output: buf(OUT, 4),
                send_to: 1,
                recv_from: 1,
            },
            1,
            3,
        );
        assert!(p.calls.is_empty());
        assert_eq!(p.copies, vec![copy(OUT, IN, 16)]);
        assert_eq!(
            plan_collective(
                &CommOp::CollectivePermute {
                    input: buf(IN, 4),
                    output: buf(OUT, 4),
                    send_to: 1,
                    recv_from: 0,
                },
                1,
                3
            )
            .unwrap_err(),
            "member 1 sends to itself but receives from member 0"
        );

        let send = |index| {
            plan(
                CommOp::SendRecv {
                    root: 1,
                    input: buf(IN, 3),
                    output: buf(OUT, 3),
                },
                index,
                2,
            )
        };
        assert_eq!(
            send(1).calls,
            vec![Call::Send {
                buf: IN,
                count: 3,
                dtype: f32,
                peer: 0
            }]
        );
        assert_eq!(
            send(0).calls,
            vec![Call::Recv {
                buf: OUT,
                count: 3,
                dtype: f32,
                peer: 1
            }]
        );
    }

    #[test]
    fn empty_chunks_issue_no_call_on_any_member() {
        // The empty last chunk of an axis that the stream chunks do not divide: every member
        // holds zero elements, so every member plans nothing and none waits for another.
        for index in 0..2 {
            let ops = [
                CommOp::Allreduce {
                    input: buf(IN, 0),
                    output: buf(OUT, 0),
                    op: RedOp::Sum,
                },
                CommOp::Allgather {
                    input: buf(IN, 0),
                    output: buf(OUT, 0),
                },
                CommOp::ReduceScatter {
                    input: buf(IN, 0),
                    output: buf(OUT, 0),
                    op: RedOp::Sum,
                },
            ];
            for op in ops {
                let p = plan(op, index, 2);
                assert!(p.calls.is_empty() && p.copies.is_empty(), "{p:?}");
            }
        }
        let p = plan_p2p(
            0,
            2,
            &[
                P2p::Send {
                    peer: 1,
                    buffer: buf(IN, 0),
                },
                P2p::Recv {
                    peer: 1,
                    buffer: buf(OUT, 0),
                },
            ],
        )
        .unwrap();
        assert!(p.calls.is_empty() && p.copies.is_empty(), "{p:?}");
    }

    #[test]
    fn one_member_teams_copy_or_do_nothing() {
        let ops: Vec<CommOp<Fake>> = vec![
            CommOp::Allgather {
                input: buf(IN, 3),
                output: buf(OUT, 3),
            },
            CommOp::Allreduce {
                input: buf(IN, 3),
                output: buf(OUT, 3),
                op: RedOp::Sum,
            },
            CommOp::ReduceScatter {
                input: buf(IN, 3),
                output: buf(OUT, 3),
                op: RedOp::Sum,
            },
            CommOp::Broadcast {
                root: 0,
                input: buf(IN, 3),
                output: buf(OUT, 3),
            },
            CommOp::Reduce {
                root: 0,
                input: buf(IN, 3),
                output: buf(OUT, 3),
                op: RedOp::Min,
            },
            CommOp::Gather {
                root: 0,
                input: buf(IN, 3),
                output: buf(OUT, 3),
            },
            CommOp::Scatter {
                root: 0,
                input: buf(IN, 3),
                output: buf(OUT, 3),
            },
            CommOp::AllToAll {
                input: buf(IN, 3),
                output: buf(OUT, 3),
            },
            CommOp::CollectivePermute {
                input: buf(IN, 3),
                output: buf(OUT, 3),
                send_to: 0,
                recv_from: 0,
            },
        ];
        for op in ops {
            let name = op.name();
            let p = plan(op, 0, 1);
            assert!(p.calls.is_empty(), "{name}");
            assert_eq!(p.copies, vec![copy(OUT, IN, 12)], "{name}");
        }
        // In place: nothing at all.
        let p = plan(
            CommOp::Allreduce {
                input: buf(IN, 3),
                output: buf(IN, 3),
                op: RedOp::Sum,
            },
            0,
            1,
        );
        assert_eq!(p, Plan::default());
        // A send-recv needs two members, as in Local.
        assert_eq!(
            plan_collective(
                &CommOp::SendRecv {
                    root: 0,
                    input: buf(IN, 3),
                    output: buf(OUT, 3)
                },
                0,
                1
            )
            .unwrap_err(),
            "send-recv needs a team of two ranks, not 1"
        );
    }

    #[test]
    fn plans_check_what_one_member_can() {
        let err = |op: CommOp<Fake>, index, n| plan_collective(&op, index, n).unwrap_err();
        assert_eq!(
            err(
                CommOp::Allgather {
                    input: buf(IN, 3),
                    output: buf(OUT, 10)
                },
                0,
                4
            ),
            "the output has 10 elements but must have 4 times the elements of the other \
             buffer, 12"
        );
        assert_eq!(
            err(
                CommOp::Allreduce {
                    input: buf(IN, 3),
                    output: buf(OUT, 4),
                    op: RedOp::Sum
                },
                0,
                2
            ),
            "the output has 4 elements but must have as many elements as the other buffer, 3"
        );
        assert_eq!(
            err(
                CommOp::Broadcast {
                    root: 3,
                    input: buf(IN, 3),
                    output: buf(OUT, 3)
                },
                0,
                3
            ),
            "root 3 is out of range for a team of 3"
        );
        assert_eq!(
            err(
                CommOp::AllToAll {
                    input: buf(IN, 7),
                    output: buf(OUT, 7)
                },
                0,
                2
            ),
            "the input's 7 elements do not split into 2 equal pieces"
        );
        assert_eq!(
            err(
                CommOp::Allreduce {
                    input: buf(IN, 3),
                    output: Fake {
                        dtype: DataType::Bf16,
                        ..buf(OUT, 3)
                    },
                    op: RedOp::Sum
                },
                0,
                2
            ),
            "the input is f32 but the output is bf16"
        );
        assert_eq!(
            err(
                CommOp::CollectivePermute {
                    input: buf(IN, 3),
                    output: buf(OUT, 3),
                    send_to: 0,
                    recv_from: 5
                },
                0,
                2
            ),
            "recv_from 5 is out of range for a team of 2"
        );
        assert_eq!(
            err(
                CommOp::ReduceScatter {
                    input: Fake {
                        contiguous: false,
                        ..buf(IN, 4)
                    },
                    output: buf(OUT, 2),
                    op: RedOp::Sum
                },
                0,
                2
            ),
            "the input is not contiguous; NCCL moves contiguous memory only"
        );
        assert_eq!(
            err(
                CommOp::Gather {
                    root: 0,
                    input: buf(IN, 2),
                    output: Fake {
                        contiguous: false,
                        ..buf(OUT, 4)
                    }
                },
                0,
                2
            ),
            "the output is not contiguous; NCCL moves contiguous memory only"
        );
    }

    #[test]
    fn point_to_point_groups() {
        let f32 = DataType::F32;
        let ops = vec![
            P2p::Recv {
                peer: 0,
                buffer: buf(OUT, 4),
            },
            P2p::Send {
                peer: 2,
                buffer: buf(IN, 4),
            },
            P2p::Send {
                peer: 1,
                buffer: buf(IN + 64, 2),
            },
            P2p::Recv {
                peer: 1,
                buffer: buf(OUT + 64, 2),
            },
        ];
        let p = plan_p2p(1, 3, &ops).unwrap();
        // Sends first, then receives; the transfer to itself is a copy.
        assert_eq!(
            p.calls,
            vec![
                Call::Send {
                    buf: IN,
                    count: 4,
                    dtype: f32,
                    peer: 2
                },
                Call::Recv {
                    buf: OUT,
                    count: 4,
                    dtype: f32,
                    peer: 0
                },
            ]
        );
        assert_eq!(p.copies, vec![copy(OUT + 64, IN + 64, 8)]);
        assert!(p.grouped());

        let err = |ops: Vec<P2p<Fake>>| plan_p2p(0, 2, &ops).unwrap_err();
        assert_eq!(
            err(vec![P2p::Send {
                peer: 2,
                buffer: buf(IN, 1)
            }]),
            "rank 2 is outside the world of 2 ranks"
        );
        assert_eq!(
            err(vec![P2p::Send {
                peer: 0,
                buffer: buf(IN, 1)
            }]),
            "rank 0 sends to itself 1 time(s) but receives from itself 0 time(s) in this \
             group; a transfer to itself must be matched within one group"
        );
        assert_eq!(
            err(vec![
                P2p::Send {
                    peer: 0,
                    buffer: buf(IN, 1)
                },
                P2p::Recv {
                    peer: 0,
                    buffer: buf(OUT, 2)
                }
            ]),
            "rank 0 sends 1 elements to itself but receives 2"
        );
        assert_eq!(
            err(vec![P2p::Recv {
                peer: 1,
                buffer: Fake {
                    contiguous: false,
                    ..buf(OUT, 2)
                }
            }]),
            "the buffer received from rank 1 is not contiguous; NCCL moves contiguous memory \
             only"
        );
        assert_eq!(plan_p2p::<Fake>(0, 2, &[]).unwrap(), Plan::default());
    }

    #[test]
    fn piece_addresses_do_not_overflow() {
        let o = Operand {
            what: "output".into(),
            ptr: u64::MAX - 4,
            len: 4,
            dtype: DataType::F64,
        };
        assert_eq!(
            o.piece(1, 4).unwrap_err(),
            "piece 1 of the output overflows its address"
        );
        assert_eq!(o.piece(0, 4).unwrap(), u64::MAX - 4);
    }
}
