//! The communicator's lifecycle: `Nccl::init`, team splits, polling non-blocking calls
//! against the timeout, posting plans, aborting and finalising.
#![allow(unsafe_code)]

use std::collections::HashSet;
use std::ffi::c_int;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cudarc::nccl::sys;
use weave_cuda::{Gpu, GpuStream};

use super::config::{make_config, NcclId, NcclOptions};
use super::library::{backend, call_nccl, describe, library};
use super::plan::{plan_collective, plan_p2p, Call, Plan};
use super::routing::{check_team, TeamPlan, TeamRoute};
use super::window::{self, Window};
use super::DeviceBuffer;
use crate::communicator::{Collective, Communicator, P2p};
use crate::error::CommError;

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

/// Polls `comm` until it has no operation in progress (`true`), fails or `timeout` passes
/// (`false`).
fn settle(comm: sys::ncclComm_t, timeout: Duration) -> bool {
    let start = Instant::now();
    let mut pause = weave_cuda::Backoff::new();
    loop {
        let mut state = sys::ncclResult_t::ncclInProgress;
        // SAFETY: `comm` is live and owned by the caller alone; `state` is a valid
        // out-pointer.
        let result = unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
        match (result, state) {
            (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclSuccess) => return true,
            (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclInProgress)
                if start.elapsed() < timeout => {}
            _ => return false,
        }
        pause.pause();
    }
}

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
    /// The symmetric window on the world communicator, when the options ask for one.
    window: Option<Arc<Window>>,
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
/// [module documentation](super).
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
        let _span = tracing::debug_span!("nccl_init", rank, world).entered();
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
                window: None,
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
        let window = match nccl.options.symmetric_window {
            None => None,
            Some(bytes) => match nccl.open_window(comm, bytes, &others) {
                Ok(window) => Some(Arc::new(window)),
                Err(error) => {
                    // SAFETY: `comm` is live and owned here alone; given up once.
                    unsafe { sys::ncclCommAbort(comm) };
                    return Err(error);
                }
            },
        };
        {
            let mut comms = nccl.lock();
            comms.world = Some(RawComm(comm));
            comms.window = window;
        }
        Ok(nccl)
    }

    /// Allocates and registers the symmetric window of `bytes` a half on the settled world
    /// communicator `comm` (collective over the world).
    fn open_window(
        &self,
        comm: sys::ncclComm_t,
        bytes: usize,
        others: &[usize],
    ) -> Result<Window, CommError> {
        let what = format!(
            "registering a symmetric window of 2 × {bytes} bytes on rank {}",
            self.rank
        );
        let start = Instant::now();
        let (result, base, handle) =
            window::allocate_and_register(comm, bytes).map_err(|e| backend(&what, e))?;
        // NCCL may finish the registration on its own thread even when the call answers
        // success; the communicator is usable only once it reports no operation in
        // progress.
        let _ = result;
        {
            if let Err(stop) = self.poll(&[comm], start) {
                return Err(match stop {
                    Stop::TimedOut => CommError::Timeout {
                        op: what,
                        rank: self.rank,
                        waiting_for: others.to_vec(),
                        millis: millis(self.options.timeout),
                    },
                    Stop::Failed(message) => backend(&what, message),
                    Stop::Aborted => backend(&what, "aborted".into()),
                });
            }
        }
        Window::new(&self.gpu, base, bytes, handle).map_err(|e| backend(&what, e))
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
        let _span = tracing::debug_span!("nccl_prepare_teams", rank, teams = teams.len()).entered();
        let mut comms = self.lock_live(WHAT)?;
        let plan = TeamPlan::new(self.world, teams, &comms.prepared)
            .map_err(|e| mismatch(WHAT, rank, e.to_string()))?;
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
        let _span =
            tracing::debug_span!("nccl_wait", rank = self.rank, comms = comms.len()).entered();
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
        // The window's memory is left to the process: NCCL may still reference it.
        comms.window = None;
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
        check_team(&team, self.world).map_err(|e| mismatch(&label, rank, e.to_string()))?;
        let plan =
            plan_collective(&op, index, team.len()).map_err(|d| mismatch(&label, rank, d))?;
        let _span = tracing::debug_span!(
            "nccl_post",
            rank,
            op = op.name(),
            label = %label,
            team = ?team,
            bytes = plan.bytes(),
        )
        .entered();
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
        let staged = match (TeamRoute::of(&team, self.world), comms.window.clone()) {
            (TeamRoute::World, Some(window)) => window
                .stage(&plan, team.len())
                .map(|staged| (window, staged)),
            _ => None,
        };
        if let Some((window, staged)) = staged {
            window.enter(&self.gpu, stream, &staged)?;
            self.issue(
                &mut comms,
                comm,
                &staged.plan,
                &window.stream,
                &label,
                others,
            )?;
            window.leave(&self.gpu, stream, &staged)?;
            return Ok(());
        }
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
        let _span = tracing::debug_span!(
            "nccl_post",
            rank,
            op = "p2p",
            label = %label,
            transfers = ops.len(),
            bytes = plan.bytes(),
        )
        .entered();
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
        let timeout = self.options.timeout;
        if let (Some(window), Some(world)) = (comms.window.take(), comms.world.as_ref()) {
            let world = world.0;
            let _ = self.gpu.bind();
            if let Ok(window) = Arc::try_unwrap(window) {
                window.close(world, timeout, || settle(world, timeout));
            }
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
