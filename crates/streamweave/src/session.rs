//! Running a compiled program again and again on GPU buffers the caller owns (PyTorch
//! tensors, through the Python module), the way a framework's own operation runs.
//!
//! A [`CudaSession`] opens each rank's GPU, backend and NCCL communicator once: every rank in
//! this process, one GPU each ([`CudaSession::local`]), or this process as one rank of a
//! world started by torchrun or `weave launch` ([`CudaSession::launched`]). Each
//! [`CudaSession::issue`] then
//!
//! * binds the caller's input and output buffers where they are (no copy: an output is
//!   written into the caller's buffer by the statement that would have allocated it,
//!   [`weave_executor::run_rank_into`]),
//! * orders the run after the work already queued on the caller's stream, and the caller's
//!   stream after the run (events, no host wait),
//! * and returns once every statement is issued.
//!
//! The second call of a session whose ranks all run in this process tunes first (within
//! [`GpuRunOptions::tune`](crate::GpuRunOptions::tune), unless the tuning cache has the
//! winner): the candidates a session can switch to ([`crate::tune::Scope::Session`]) are
//! measured on the session's GPUs, and the winner's program, pool and knobs run from that
//! call on ([`CudaSession::config`] says which).
//!
//! The caller keeps its buffers alive until its stream is past the run, as it would for its
//! own kernels. The reference check ([`CudaSession::check`]) and the timeline
//! ([`CudaSession::spans`]) wait for the device; issuing does not.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use weave_comm::bootstrap::{gather, LaunchEnv, TcpStore};
use weave_comm::nccl::{Nccl, NcclId};
use weave_comm::Communicator;
use weave_cuda::cudarc::driver::CudaEvent;
use weave_cuda::{DeviceMemory, ForeignStream, Gpu};
use weave_executor::{
    program_teams, run_rank_into, Backend, CudaBackend, CudaOptions, Dense, DeviceTensor,
    ExecError, IntoRun, RankRun, Span, StreamKey,
};
use weave_ir::DType;

use crate::executable::{Error, Executable};
use crate::run::{OutputCheck, RunOptions};
use crate::setup::RunError;

/// A buffer of the caller's: memory it owns ([`Gpu::borrow`]), read or written as a
/// row-major `dtype` tensor of `sizes`.
#[derive(Clone, Debug)]
pub struct Buffer {
    /// The memory.
    pub mem: Arc<DeviceMemory>,
    /// The element type.
    pub dtype: DType,
    /// The sizes (a rank's local shard).
    pub sizes: Vec<usize>,
}

/// One rank's part of a call: its local input shards and output buffers, in signature
/// order, and the caller's stream on that rank's GPU.
#[derive(Clone, Debug)]
pub struct RankCall {
    /// The input shards.
    pub inputs: Vec<Buffer>,
    /// The output buffers, written in place.
    pub outputs: Vec<Buffer>,
    /// The stream the run is ordered against (PyTorch's current stream).
    pub stream: ForeignStream,
}

impl RankCall {
    /// `f` of every input buffer, then of every output buffer, in order; the first error
    /// stops it.
    fn map_buffers<T, E>(
        &self,
        mut f: impl FnMut(&Buffer) -> Result<T, E>,
    ) -> Result<(Vec<T>, Vec<T>), E> {
        let inputs = self.inputs.iter().map(&mut f).collect::<Result<_, _>>()?;
        let outputs = self.outputs.iter().map(f).collect::<Result<_, _>>()?;
        Ok((inputs, outputs))
    }
}

/// One rank of a session, open in this process.
struct SessionRank {
    rank: usize,
    gpu: Gpu,
    comm: Arc<Nccl<DeviceTensor>>,
    /// The events that order a run after the caller's stream and the caller's stream after
    /// the run, recorded again at every call.
    before: CudaEvent,
    after: CudaEvent,
}

/// What a session runs: the program as compiled with the caller's options, or, once tuned,
/// the winner's program and configuration.
struct Active {
    exe: Arc<Executable>,
    options: RunOptions,
    /// The backend of each rank of this process (in the order of [`CudaSession::ranks`]),
    /// with the options' overlap knobs.
    backends: Vec<CudaBackend>,
}

/// The calls of a session so far and what they run ([`CudaSession::issue`] holds it).
struct Calls {
    count: usize,
    /// Whether the first repeated call tried to tune (it tries once).
    tried: bool,
    active: Active,
    /// Where the configuration that runs came from, once tuned: see [`CudaSession::config`].
    config: Option<String>,
}

/// Every rank of a program that runs in this process, open on its GPU: see the module doc.
pub struct CudaSession {
    /// The program as opened (tuning keeps it; the check compares against its definition).
    exe: Arc<Executable>,
    world: usize,
    ranks: Vec<SessionRank>,
    /// The launcher's store, which gathers a launched world's shards on rank 0 for the check.
    store: Option<TcpStore>,
    /// Checks made so far (each gathers under its own key).
    checks: AtomicUsize,
    /// Held while a call issues: calls from several threads take turns.
    issuing: Mutex<Calls>,
}

impl std::fmt::Debug for CudaSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let here: Vec<(usize, usize)> = self
            .ranks
            .iter()
            .map(|r| (r.rank, r.gpu.ordinal()))
            .collect();
        write!(
            f,
            "CudaSession(world {}, (rank, GPU) here: {here:?})",
            self.world
        )
    }
}

/// A setup failure of rank `rank`.
fn setup(rank: usize) -> impl Fn(String) -> Error {
    move |m| Error::Run(RunError::Setup(format!("rank {rank}: {m}")))
}

impl CudaSession {
    /// Opens every rank of `exe` in this process, rank `r` on GPU `devices[r]`: the world is
    /// `devices.len()` ranks, which must fit the program's meshes, on distinct GPUs.
    pub fn local(
        exe: Arc<Executable>,
        devices: &[usize],
        options: &RunOptions,
    ) -> Result<CudaSession, Error> {
        let world = devices.len();
        exe.check_ranks(world)?;
        for (r, d) in devices.iter().enumerate() {
            if let Some(q) = devices[..r].iter().position(|e| e == d) {
                return Err(Error::Run(RunError::Setup(format!(
                    "ranks {q} and {r} are both given GPU {d}: each rank needs its own GPU"
                ))));
            }
        }
        let count = weave_cuda::device_count().map_err(|e| setup(0)(e.to_string()))?;
        if let Some(d) = devices.iter().find(|&&d| d >= count) {
            return Err(Error::Run(RunError::Setup(format!(
                "GPU {d} is asked for but {count} are visible"
            ))));
        }
        let id = NcclId::new().map_err(|e| setup(0)(e.to_string()))?;
        let opened: Vec<Result<(SessionRank, CudaBackend), Error>> = std::thread::scope(|scope| {
            let handles: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(rank, &device)| {
                    let (exe, id) = (&exe, &id);
                    scope.spawn(move || open_rank(exe, options, device, rank, world, id))
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(rank, h)| {
                    h.join()
                        .unwrap_or_else(|_| Err(setup(rank)("its set-up panicked".into())))
                })
                .collect()
        });
        let opened = opened.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(CudaSession::new(exe, options, world, opened, None))
    }

    fn new(
        exe: Arc<Executable>,
        options: &RunOptions,
        world: usize,
        opened: Vec<(SessionRank, CudaBackend)>,
        store: Option<TcpStore>,
    ) -> CudaSession {
        let (ranks, backends) = opened.into_iter().unzip();
        CudaSession {
            exe: exe.clone(),
            world,
            ranks,
            store,
            checks: AtomicUsize::new(0),
            issuing: Mutex::new(Calls {
                count: 0,
                tried: false,
                active: Active {
                    exe,
                    options: options.clone(),
                    backends,
                },
                config: None,
            }),
        }
    }

    /// Opens this process's rank of a launched world (`env`: torchrun's or another
    /// launcher's variables) on GPU `env.local_rank`, the NCCL id exchanged through the
    /// launcher's store on rank 0. Every rank of the world calls it.
    pub fn launched(
        exe: Arc<Executable>,
        env: &LaunchEnv,
        options: &RunOptions,
    ) -> Result<CudaSession, Error> {
        let (rank, world) = (env.rank, env.world);
        exe.check_ranks(world)?;
        let (store, id) = crate::world::launched_id(env, options.timeouts.store)
            .map_err(|e| setup(rank)(e.to_string()))?;
        let opened = open_rank(&exe, options, env.local_rank, rank, world, &id)?;
        Ok(CudaSession::new(
            exe,
            options,
            world,
            vec![opened],
            Some(store),
        ))
    }

    /// The world's size.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The ranks this process runs, each with its GPU, in rank order.
    pub fn ranks(&self) -> Vec<(usize, &Gpu)> {
        self.ranks.iter().map(|r| (r.rank, &r.gpu)).collect()
    }

    /// The executable.
    pub fn executable(&self) -> &Arc<Executable> {
        &self.exe
    }

    /// Issues one run of every rank of this process (`calls[k]` for its `k`-th rank, see
    /// [`CudaSession::ranks`]) and returns once every statement is issued: see the module
    /// doc. With the timeline on ([`RunOptions::trace`]) each rank's spans restart here.
    pub fn issue(&self, calls: &[RankCall]) -> Result<Vec<IntoRun>, Error> {
        if calls.len() != self.ranks.len() {
            return Err(Error::Program(format!(
                "{} rank call(s) were given for the {} rank(s) of this process",
                calls.len(),
                self.ranks.len()
            )));
        }
        let mut turn = self.issuing.lock().unwrap_or_else(|p| p.into_inner());
        turn.count += 1;
        if turn.count == 2 && !turn.tried {
            turn.tried = true;
            self.tune(&mut turn);
        }
        let active = &turn.active;
        let config = active.exe.config(&active.options);
        let trace = active.options.trace;
        let issue_rank = |r: &SessionRank,
                          backend: &CudaBackend,
                          call: &RankCall|
         -> Result<IntoRun, ExecError> {
            let (inputs, outputs) =
                call.map_buffers(|b| backend.adopt(b.mem.clone(), b.dtype, &b.sizes))?;
            if trace {
                crate::gpu::start_trace_on_one_clock(backend, &*r.comm)?;
            }
            let main = backend.stream(StreamKey::Main)?;
            main.wait_foreign(&call.stream, &r.before)?;
            let run = run_rank_into(
                active.exe.program(),
                backend,
                &*r.comm,
                &inputs,
                &outputs,
                &config,
            )?;
            main.signal_foreign(&call.stream, &r.after)?;
            Ok(run)
        };
        // A rank that fails aborts its communicator at once, on its own thread: the other
        // ranks' waits for it (the trace's origin, a copy-engine handshake) then fail instead
        // of waiting, so every thread below ends within its own bounded waits.
        let one = |r: &SessionRank, backend: &CudaBackend, call: &RankCall| {
            let result = issue_rank(r, backend, call);
            if let Err(e) = &result {
                r.comm.abort(&e.to_string());
            }
            result
        };
        let results: Vec<Result<IntoRun, ExecError>> = if self.ranks.len() == 1 {
            vec![one(&self.ranks[0], &active.backends[0], &calls[0])]
        } else {
            // NCCL wants the ranks of one process to post their collectives concurrently.
            std::thread::scope(|scope| {
                let handles: Vec<_> = self
                    .ranks
                    .iter()
                    .zip(&active.backends)
                    .zip(calls)
                    .map(|((r, b), c)| scope.spawn(move || one(r, b, c)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(ExecError::Program("the rank's thread panicked".into()))
                        })
                    })
                    .collect()
            })
        };
        let mut runs = Vec::new();
        let mut errors = Vec::new();
        for (r, result) in self.ranks.iter().zip(results) {
            match result {
                Ok(run) => runs.push(run),
                // A panicked thread did not abort its communicator (idempotent for the rest).
                Err(e) => {
                    r.comm.abort(&e.to_string());
                    errors.push((r.rank, e));
                }
            }
        }
        if errors.is_empty() {
            Ok(runs)
        } else {
            Err(Error::Run(RunError::Ranks(errors)))
        }
    }

    /// The configuration the calls run once the first repeated call tuned (or tried to):
    /// the winner and where it came from (`S=2 K=2 eager, ordered compute (tuned now)`, or
    /// `(the tuning cache)`), or why the program runs as opened; `None` before that call and
    /// in sessions that do not tune.
    pub fn config(&self) -> Option<String> {
        let turn = self.issuing.lock().unwrap_or_else(|p| p.into_inner());
        turn.config.clone()
    }

    /// Tunes on the first repeated call, when the options ask for it
    /// ([`GpuRunOptions::tune`](crate::GpuRunOptions::tune)) and leave the pool, transport
    /// and overlap knobs at their defaults, every rank runs in this process and the program
    /// carries its definition: measures what a session can switch to on the session's GPUs
    /// ([`crate::tune::Scope::Session`], a world of their own for the measurement), or takes
    /// the cached winner, then runs the winner's program, pool and knobs from this call on.
    /// A failed tuning leaves the program as opened and says why in [`CudaSession::config`].
    fn tune(&self, turn: &mut Calls) {
        let options = &turn.active.options;
        let defaults = RunOptions::default();
        let Some(budget) = options.gpu.tune else {
            return;
        };
        if self.store.is_some()
            || options.streams != defaults.streams
            || options.gpu.transport != defaults.gpu.transport
            || options.gpu.overlap != defaults.gpu.overlap
        {
            return;
        }
        let Some(definition) = self.exe.signature().definition.as_ref() else {
            return;
        };
        let devices: Vec<usize> = self.ranks.iter().map(|r| r.gpu.ordinal()).collect();
        let tuned = synchronize(&self.ranks, &turn.active.backends)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                crate::executable::tune_definition(
                    definition,
                    &crate::executable::TuneFor::Session { devices },
                    budget,
                    options,
                )
            })
            .and_then(|(exe, entry, source)| {
                let candidate = entry.candidate();
                if !crate::tune::Scope::Session.admits(&candidate) {
                    return Err(format!(
                        "the cached configuration {candidate} is not one a session can run"
                    ));
                }
                let mut options = options.clone();
                entry.apply(&mut options);
                let teams = program_teams(exe.program());
                let backends = self
                    .ranks
                    .iter()
                    .map(|r| {
                        r.comm
                            .prepare_teams(&teams)
                            .map_err(|e| e.to_string())
                            .and_then(|()| {
                                backend_of(&exe, (r.rank, self.world), &options, &r.gpu, &r.comm)
                            })
                            .map_err(|m| format!("rank {}: {m}", r.rank))
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                let active = Active {
                    exe: Arc::new(exe),
                    options,
                    backends,
                };
                Ok((active, format!("{candidate} ({source})")))
            });
        turn.config = Some(match tuned {
            Ok((active, config)) => {
                turn.active = active;
                config
            }
            Err(why) => format!("as opened (tuning failed: {why})"),
        });
    }

    /// Waits (within [`Timeouts::wait`](crate::Timeouts::wait)) until every rank's GPU has
    /// done everything issued.
    pub fn synchronize(&self) -> Result<(), Error> {
        let turn = self.issuing.lock().unwrap_or_else(|p| p.into_inner());
        synchronize(&self.ranks, &turn.active.backends)
    }

    /// Every rank's spans of the last issue (with [`RunOptions::trace`]), after waiting for
    /// the device: by rank, as [`crate::RunReport::rank_spans`] gives them.
    pub fn spans(&self) -> Result<Vec<(usize, Vec<Span>)>, Error> {
        let turn = self.issuing.lock().unwrap_or_else(|p| p.into_inner());
        let backends = &turn.active.backends;
        synchronize(&self.ranks, backends)?;
        Ok(self
            .ranks
            .iter()
            .zip(backends)
            .map(|(r, b)| (r.rank, b.spans()))
            .collect())
    }

    /// Compares the outputs of `calls` (after they ran: this waits for the device) with
    /// the f64 reference of the program's global definition on the global inputs, put back
    /// together from every rank's input shards. In a launched world every rank sends its
    /// shards to rank 0 through the launcher's store and rank 0 returns the checks; the
    /// others return none.
    pub fn check(&self, calls: &[RankCall]) -> Result<Vec<OutputCheck>, Error> {
        let turn = self.issuing.lock().unwrap_or_else(|p| p.into_inner());
        let backends = &turn.active.backends;
        synchronize(&self.ranks, backends)?;
        let mut shards: Vec<(Vec<Dense>, Vec<Dense>)> = Vec::new();
        for ((r, backend), call) in self.ranks.iter().zip(backends).zip(calls) {
            let main = backend
                .stream(StreamKey::Main)
                .map_err(rank_error(r.rank))?;
            let read = |b: &Buffer| -> Result<Dense, Error> {
                let t = backend
                    .adopt(b.mem.clone(), b.dtype, &b.sizes)
                    .map_err(rank_error(r.rank))?;
                backend.download(&t, &main).map_err(rank_error(r.rank))
            };
            shards.push(call.map_buffers(read)?);
        }
        synchronize(&self.ranks, backends)?;
        drop(turn);
        let shards = match &self.store {
            None => shards,
            Some(store) => {
                let rank = self.ranks[0].rank;
                let mine = serde_json::to_vec(&wire(&shards[0]))
                    .map_err(|e| setup(rank)(e.to_string()))?;
                let key = format!(
                    "session-check-{}",
                    self.checks.fetch_add(1, Ordering::Relaxed)
                );
                let gathered = gather(store, rank, self.world, &key, &mine)
                    .map_err(|e| setup(rank)(e.to_string()))?;
                let Some(all) = gathered else {
                    return Ok(Vec::new());
                };
                all.iter()
                    .map(|bytes| unwire(bytes).map_err(setup(rank)))
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        let globals = self
            .exe
            .inputs()
            .iter()
            .enumerate()
            .map(|(k, sig)| {
                let locals: Vec<&[f64]> = shards
                    .iter()
                    .enumerate()
                    .map(|(rank, (ins, _))| match ins.get(k) {
                        Some(d) if sig.holds(rank) => d.data.as_slice(),
                        _ => &[],
                    })
                    .collect();
                let data = sig.unshard(&locals, f64::NAN).map_err(|e| Error::Input {
                    tensor: sig.name.clone(),
                    message: e.to_string(),
                })?;
                Ok(Dense {
                    dtype: sig.dtype,
                    sizes: sig.shape.clone(),
                    data,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let reference = self.exe.reference(&globals)?;
        let runs: Vec<RankRun> = shards
            .into_iter()
            .map(|(_, outputs)| RankRun {
                outputs,
                ..RankRun::default()
            })
            .collect();
        self.exe.check(&reference, &runs)
    }
}

/// A run failure of rank `rank`.
fn rank_error(rank: usize) -> impl Fn(ExecError) -> Error {
    move |e| Error::Run(RunError::Ranks(vec![(rank, e)]))
}

/// Opens rank `rank` of `world` on GPU `device`: its NCCL communicator (with the program's
/// teams) and its backend, which launches the program's kernel table for this GPU's SM count
/// ([`Executable::kernel_table`], made here before anything runs).
fn open_rank(
    exe: &Executable,
    options: &RunOptions,
    device: usize,
    rank: usize,
    world: usize,
    id: &NcclId,
) -> Result<(SessionRank, CudaBackend), Error> {
    let fail = setup(rank);
    let nccl = crate::world::nccl_options(options).map_err(|e| fail(e.to_string()))?;
    let crate::world::OpenRank { gpu, comm } =
        crate::world::open_rank(device, rank, world, id, nccl).map_err(|e| fail(e.to_string()))?;
    comm.prepare_teams(&program_teams(exe.program()))
        .map_err(|e| fail(e.to_string()))?;
    let backend = backend_of(exe, (rank, world), options, &gpu, &comm).map_err(&fail)?;
    let event = || gpu.new_event(false).map_err(|e| fail(e.to_string()));
    let (before, after) = (event()?, event()?);
    Ok((
        SessionRank {
            rank,
            gpu,
            comm,
            before,
            after,
        },
        backend,
    ))
}

/// A backend on `gpu` with `options`' overlap knobs, wait timeout and trace setting, which
/// launches the kernel table of `exe` as rank `rank` of `world` ranks with `options`' pool, for this GPU's SM
/// count ([`Executable::kernel_table`]: a kernel the code generator cannot plan fails here).
fn backend_of(
    exe: &Executable,
    (rank, world): (usize, usize),
    options: &RunOptions,
    gpu: &Gpu,
    comm: &Arc<Nccl<DeviceTensor>>,
) -> Result<CudaBackend, String> {
    let kernels = exe
        .kernel_table(world, options.streams, crate::gpu::sms_of(gpu))
        .map_err(|e| e.to_string())?;
    let cuda = options
        .gpu
        .overlap
        .cuda_options(
            CudaOptions {
                timeout: options.timeouts.wait,
                trace: options.trace,
                ..CudaOptions::default()
            },
            gpu.sm_count(),
            options.gpu.transport,
        )
        .map_err(|e| e.to_string())?;
    let backend = crate::gpu::backend_for(gpu, cuda, comm)
        .map_err(|e| e.to_string())?
        .with_kernels(kernels, rank);
    // Loaded (kernels, streams, GEMM handles, the pool's peak) before the first call: mid-run, either can
    // wait for the whole GPU while it waits on another rank.
    backend.load_kernels().map_err(|e| e.to_string())?;
    Ok(backend)
}

/// Waits (within the wait timeout) until every rank's GPU has done everything issued on
/// its backend.
fn synchronize(ranks: &[SessionRank], backends: &[CudaBackend]) -> Result<(), Error> {
    for (r, b) in ranks.iter().zip(backends) {
        b.synchronize()
            .map_err(|e| Error::Run(RunError::Ranks(vec![(r.rank, e)])))?;
    }
    Ok(())
}

/// A rank's shards as the store carries them: `(dtype, sizes, values)` per tensor.
type Wire = (
    Vec<(String, Vec<usize>, Vec<f64>)>,
    Vec<(String, Vec<usize>, Vec<f64>)>,
);

fn wire((ins, outs): &(Vec<Dense>, Vec<Dense>)) -> Wire {
    let w = |d: &[Dense]| {
        d.iter()
            .map(|d| (d.dtype.to_string(), d.sizes.clone(), d.data.clone()))
            .collect()
    };
    (w(ins), w(outs))
}

fn unwire(bytes: &[u8]) -> Result<(Vec<Dense>, Vec<Dense>), String> {
    let (ins, outs): Wire =
        serde_json::from_slice(bytes).map_err(|e| format!("a malformed shard report: {e}"))?;
    let back = |v: Vec<(String, Vec<usize>, Vec<f64>)>| {
        v.into_iter()
            .map(|(dtype, sizes, data)| {
                let dtype = DType::from_name(&dtype)
                    .ok_or_else(|| format!("a malformed shard report: no dtype `{dtype}`"))?;
                Dense::new(dtype, sizes, data).map_err(|m| format!("a malformed shard report: {m}"))
            })
            .collect::<Result<Vec<_>, String>>()
    };
    Ok((back(ins)?, back(outs)?))
}
