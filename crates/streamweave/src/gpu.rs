//! Running ranks on GPUs: one thread per local GPU in this process (the default), or this
//! process as one rank of a world started by `weave launch`, torchrun or mpirun, with the
//! NCCL id exchanged through a TCP store on rank 0 and every rank's outputs gathered there
//! for the comparison with the reference.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use weave_comm::bootstrap::{all_gather, gather, LaunchEnv, TcpStore};
use weave_comm::nccl::{Nccl, NcclId};
use weave_comm::{CommError, Communicator, IpcCopy};
use weave_cuda::{Gpu, GpuStream};
use weave_executor::{
    check_inputs, program_teams, run_rank, run_rank_buffers, time_back_to_back, Backend, BlockSums,
    CudaBackend, CudaOptions, Dense, DeviceTensor, ExecError, KernelTable, RankRun, Replay,
    RunConfig,
};
use weave_host_ir::HostProgram;

use crate::executable::Executable;
use crate::run::check_all_inputs;
use crate::setup::{RunError, RunOptions, Transport};

/// The CUDA options a run asks for on `gpu` (its overlap knobs included).
fn cuda_options(options: &RunOptions, gpu: &Gpu) -> Result<CudaOptions, ExecError> {
    let base = CudaOptions {
        timeout: options.timeouts.wait,
        trace: options.trace,
        ..CudaOptions::default()
    };
    options
        .gpu
        .overlap
        .cuda_options(base, gpu.sm_count(), options.gpu.transport)
        .map_err(|e| ExecError::Program(e.to_string()))
}

/// Checks that this process sees at least `needed` GPUs.
fn gpus_available(needed: usize) -> Result<(), RunError> {
    crate::world::gpus_available(needed).map_err(RunError::Setup)
}

/// The SM count of `gpu`, what kernel tables are planned for (at least 1).
pub fn sms_of(gpu: &Gpu) -> usize {
    usize::try_from(gpu.sm_count()).unwrap_or(1).max(1)
}

/// The kernel table of `exe` on `world` ranks with the pool of `config`, for the SM count of
/// GPU `device`, made (or found, [`Executable::kernel_table`]) before any rank runs: a kernel
/// the code generator cannot plan fails the run here, naming its statement. With the GPU,
/// which the caller keeps open while its ranks run (they find its context open).
fn kernels_for(
    exe: &Executable,
    world: usize,
    config: &RunConfig,
    device: usize,
) -> Result<(Gpu, Arc<KernelTable>), RunError> {
    let gpu = Gpu::open(device).map_err(|e| RunError::Setup(e.to_string()))?;
    let table = exe
        .kernel_table(world, config.number_of_streams, sms_of(&gpu))
        .map_err(|e| RunError::Setup(e.to_string()))?;
    Ok((gpu, table))
}

/// A backend on `gpu` whose host waits also poll `comm`'s asynchronous errors, so a failed
/// collective ends a wait with the communicator's error instead of a timeout. It has no
/// kernel table: give it the program's ([`CudaBackend::with_kernels`]) before it runs one.
pub fn backend_for(
    gpu: &Gpu,
    options: CudaOptions,
    comm: &Arc<Nccl<DeviceTensor>>,
) -> Result<CudaBackend, ExecError> {
    let backend = CudaBackend::new(gpu.clone(), options)?;
    let check = comm.clone();
    backend.set_error_check(Arc::new(move || check.async_error().map(|e| e.to_string())));
    Ok(backend)
}

/// How a rank's communicator moves allgathers and send/recv transfers.
enum Link<'a> {
    /// NCCL for everything.
    Nccl,
    /// Copy-engine pushes into shared windows, set up through the launcher's store.
    Ipc(&'a TcpStore),
    /// Copy-engine pushes into shared windows between the threads of this process (direct
    /// pointers; replayable, unlike peer copies), set up through an in-process exchange.
    Windows(&'a Arc<crate::threads::Exchange>),
}

/// Opens rank `rank`'s GPU, its backend (launching from `kernels`) and its communicator, and
/// runs the program (or, when `fail_early`, aborts right after the setup).
#[allow(clippy::too_many_arguments)]
fn run_one(
    program: &HostProgram,
    kernels: &Arc<KernelTable>,
    config: &RunConfig,
    inputs: &[Dense],
    options: &RunOptions,
    device: usize,
    rank: usize,
    world: usize,
    id: &NcclId,
    link: Link<'_>,
    fail_early: bool,
) -> Result<RankRun, ExecError> {
    let nccl =
        crate::world::nccl_options(options).map_err(|e| ExecError::Program(e.to_string()))?;
    let crate::world::OpenRank { gpu, comm } =
        crate::world::open_rank(device, rank, world, id, nccl)?;
    comm.prepare_teams(&program_teams(program))?;
    if fail_early {
        let why = format!("rank {rank} exits early (injected failure)");
        comm.abort(&why);
        return Err(ExecError::Program(why));
    }
    let backend =
        backend_for(&gpu, cuda_options(options, &gpu)?, &comm)?.with_kernels(kernels.clone(), rank);
    let run = match link {
        Link::Nccl => drive(program, config, inputs, options, &backend, &*comm, true),
        Link::Ipc(_) | Link::Windows(_) => {
            let windows = options
                .gpu
                .overlap
                .ce_windows()
                .map_err(|e| ExecError::Program(e.to_string()))?;
            let ipc = IpcCopy::connect(comm.clone(), gpu.clone(), windows, |card| {
                if let Link::Windows(exchange) = link {
                    exchange
                        .all_gather_as(rank, options.timeouts.store, card)
                        .map_err(|e| CommError::Bootstrap(e.to_string()))
                } else if let Link::Ipc(store) = link {
                    all_gather(store, rank, world, "copy-engine-windows", &card)
                } else {
                    Err(CommError::Bootstrap(
                        "NCCL has no windows to connect".into(),
                    ))
                }
            });
            match ipc {
                Ok(ipc) => {
                    let ipc = ipc.with_reducer(Arc::new(BlockSums::new(gpu.clone())));
                    let run = ipc
                        .load_reductions(kernels.reductions(rank))
                        .map_err(ExecError::from)
                        .and_then(|()| {
                            drive(program, config, inputs, options, &backend, &ipc, true)
                        });
                    if run.is_err() {
                        // The abort released the streams' flag waits, but a stream may
                        // still be draining into the windows: leave them to the process's
                        // exit rather than free memory the GPU may touch.
                        std::mem::forget(ipc);
                    }
                    run
                }
                Err(e) => {
                    comm.abort(&e.to_string());
                    Err(e.into())
                }
            }
        }
    };
    if let Err(e) = &run {
        comm.abort(&e.to_string());
    }
    run
}

/// Runs the program on `comm`: the warm-up runs and the timed runs (on inputs uploaded once,
/// issued back to back and timed by CUDA events on the main stream,
/// [`weave_executor::time_back_to_back`]), then the run that is checked
/// and traced (which uploads the inputs and reads the outputs back).
///
/// The warm-up and timed runs replay one captured run as a CUDA graph ([`Replay`]: one
/// eager run, then the capture) when the options ask for it (the default) and `capturable`
/// (the communicator never waits on the host); otherwise each is issued statement by
/// statement, its outputs left on the device.
fn drive<C>(
    program: &HostProgram,
    config: &RunConfig,
    inputs: &[Dense],
    options: &RunOptions,
    backend: &CudaBackend,
    comm: &C,
    capturable: bool,
) -> Result<RankRun, ExecError>
where
    C: Communicator<Buffer = DeviceTensor, Stream = GpuStream>,
{
    // Every kernel loaded, every stream and its GEMM handle made before the first statement:
    // mid-run, either can wait for the whole GPU while it waits on another rank
    // (`CudaBackend::load_kernels`).
    backend.load_kernels()?;
    let mut timed = Vec::new();
    let replayed = options.iters > 0 && options.gpu.replay && capturable;
    if options.warmup > 0 || options.iters > 0 {
        let buffers = inputs
            .iter()
            .map(|d| backend.upload(d))
            .collect::<Result<Vec<_>, _>>()?;
        let main = backend.stream(weave_executor::StreamKey::Main)?;
        // The warm-ups are runs of the kind that is timed: replays of the captured run when
        // replaying (the capture itself is preceded by one eager run), eager runs otherwise
        // — the protocol of the tuner's and the benchmark's measurement
        // (`crate::measure::time_program`), so a configuration runs here as it was measured.
        let replay = match replayed {
            true => Some(Replay::capture(program, backend, comm, &buffers, config)?),
            false => None,
        };
        for _ in 0..options.warmup {
            match &replay {
                Some(replay) => replay.launch()?,
                None => {
                    for o in run_rank_buffers(program, backend, comm, &buffers, config)?.outputs {
                        backend.deallocate(o, &main);
                    }
                }
            }
        }
        backend.synchronize()?;
        // One timer for every repeated run (`weave_executor::time_back_to_back`): CUDA events
        // on the main stream around runs issued back to back, the same as the benchmarks'.
        let deadline = |i: usize| match config.deadline.filter(|d| Instant::now() >= d.at) {
            Some(d) => Err(ExecError::Timeout {
                what: format!("rank {}: the whole run, at timed run {i}", comm.rank()),
                millis: u64::try_from(d.budget.as_millis()).unwrap_or(u64::MAX),
            }),
            None => Ok(()),
        };
        if let Some(replay) = &replay {
            timed = time_back_to_back(backend, options.iters, |i| {
                deadline(i)?;
                replay.launch()
            })?;
        } else {
            timed = time_back_to_back(backend, options.iters, |i| {
                deadline(i)?;
                for o in run_rank_buffers(program, backend, comm, &buffers, config)?.outputs {
                    backend.deallocate(o, &main);
                }
                Ok(())
            })?;
        }
        backend.synchronize()?;
    }
    if options.trace {
        start_trace_on_one_clock(backend, comm)?;
    }
    let mut run = run_rank(program, backend, comm, inputs, config)?;
    run.timed = timed;
    run.replayed = replayed;
    Ok(run)
}

/// Starts the rank's trace at a moment every rank shares: an allgather of one element over
/// the whole world on the main stream, then the trace's origin recorded behind it. Each GPU
/// times its spans from its own origin (GPU clocks are not comparable across devices), and
/// every member leaves a collective at the same moment, so the ranks' origins coincide to a
/// few microseconds and their spans are on one clock — for a program of point-to-point
/// transfers too, which [`weave_executor::timeline::align_ranks`] cannot align. A world of
/// one rank starts its trace at once.
pub(crate) fn start_trace_on_one_clock<C>(backend: &CudaBackend, comm: &C) -> Result<(), ExecError>
where
    C: Communicator<Buffer = DeviceTensor, Stream = GpuStream> + ?Sized,
{
    if comm.size() > 1 {
        let main = backend.stream(weave_executor::StreamKey::Main)?;
        let input = backend.allocate(weave_ir::DType::F32, &[1], true, &main)?;
        let output = backend.allocate(weave_ir::DType::F32, &[comm.size()], false, &main)?;
        let collective = weave_comm::Collective {
            label: "trace origin (allgather of one element)".to_string(),
            team: (0..comm.size()).collect(),
            op: weave_comm::CommOp::Allgather {
                input: input.clone(),
                output: output.clone(),
            },
        };
        comm.post(collective, &main)?;
        backend.start_trace()?;
        backend.deallocate(input, &main);
        backend.deallocate(output, &main);
        return Ok(());
    }
    backend.start_trace()
}

/// Runs every rank of `exe` on its own GPU, one thread per rank, in this process: rank `r`
/// on GPU `r` with `per_rank[r]`. The program's kernel table, for GPU 0's SM count, is made
/// before any rank starts.
pub fn run_threads(
    exe: &Executable,
    config: &RunConfig,
    per_rank: Vec<Vec<Dense>>,
    options: &RunOptions,
) -> Result<(Vec<RankRun>, Duration), RunError> {
    run_threads_with(exe, config, per_rank, options, None)
}

/// [`run_threads`] where rank `fail` sets up its GPU and communicator and then exits before
/// posting anything: the failure-injection test of the timeouts and aborts.
pub fn run_threads_failing(
    exe: &Executable,
    config: &RunConfig,
    per_rank: Vec<Vec<Dense>>,
    options: &RunOptions,
    fail: usize,
) -> Result<(Vec<RankRun>, Duration), RunError> {
    run_threads_with(exe, config, per_rank, options, Some(fail))
}

fn run_threads_with(
    exe: &Executable,
    config: &RunConfig,
    per_rank: Vec<Vec<Dense>>,
    options: &RunOptions,
    fail: Option<usize>,
) -> Result<(Vec<RankRun>, Duration), RunError> {
    let program = exe.program();
    let world = per_rank.len();
    check_all_inputs(program, config, &per_rank)?;
    gpus_available(world)?;
    let (_gpu, kernels) = kernels_for(exe, world, config, 0)?;
    let id = NcclId::new().map_err(|e| RunError::Setup(e.to_string()))?;
    let exchange = crate::threads::Exchange::new(world);
    // The rank threads are detached and waited for until the run's deadline and a grace to
    // stop: a rank stuck in GPU work no wait of its bounds fails the run instead of hanging
    // the caller.
    let limit = options
        .timeouts
        .run
        .checked_add(crate::threads::stop_grace(options.timeouts.run));
    let (program, config, options) = (
        Arc::new(program.clone()),
        Arc::new(config.clone()),
        Arc::new(options.clone()),
    );
    crate::threads::run_rank_threads_bounded(per_rank, limit, move |rank, inputs| {
        let link = match options.gpu.transport {
            Transport::Nccl => Link::Nccl,
            Transport::CopyEngine => Link::Windows(&exchange),
        };
        run_one(
            &program,
            &kernels,
            &config,
            &inputs,
            &options,
            rank,
            rank,
            world,
            &id,
            link,
            fail == Some(rank),
        )
    })
}

/// What a launched rank's run gives back: on rank 0 every rank's run (outputs and timings;
/// spans and races of rank 0 only), by rank; on the others their own run only.
#[derive(Clone, Debug)]
pub struct Launched {
    /// The runs: every rank's on rank 0, this rank's alone elsewhere.
    pub runs: Vec<RankRun>,
    /// Whether `runs` holds every rank's run (rank 0).
    pub gathered: bool,
    /// Wall time of this rank's run.
    pub run_time: Duration,
}

/// Runs this process's rank of a launched world of `exe` on GPU `env.local_rank`, every
/// rank's run gathered to rank 0 through the store. The program's kernel table, for that
/// GPU's SM count, is made before the rank joins the world.
pub fn run_launched(
    exe: &Executable,
    config: &RunConfig,
    inputs: Vec<Dense>,
    options: &RunOptions,
    env: &LaunchEnv,
) -> Result<Launched, RunError> {
    let program = exe.program();
    let (rank, world) = (env.rank, env.world);
    check_inputs(program, &inputs, config, rank, world)
        .map_err(|e| RunError::Ranks(vec![(rank, e)]))?;
    gpus_available(env.local_rank + 1)?;
    let (_gpu, kernels) = kernels_for(exe, world, config, env.local_rank)?;
    let setup = |e: CommError| RunError::Setup(format!("rank {rank}: {e}"));
    let (store, id) = crate::world::launched_id(env, options.timeouts.store).map_err(setup)?;
    let start = Instant::now();
    let run = run_one(
        program,
        &kernels,
        config,
        &inputs,
        options,
        env.local_rank,
        rank,
        world,
        &id,
        match options.gpu.transport {
            Transport::Nccl => Link::Nccl,
            Transport::CopyEngine => Link::Ipc(&store),
        },
        false,
    );
    let run_time = start.elapsed();
    // Every rank reports, failed or not, so rank 0 never waits for a report that will not
    // come.
    let report = match &run {
        Ok(r) => RankReport::of(r),
        Err(e) => RankReport::Failed(e.to_string()),
    };
    let report = serde_json::to_vec(&report)
        .map_err(|e| RunError::Setup(format!("rank {rank}: cannot write its report: {e}")))?;
    let gathered = gather(&store, rank, world, "run", &report).map_err(setup)?;
    let run = run.map_err(|e| RunError::Ranks(vec![(rank, e)]))?;
    let Some(reports) = gathered else {
        return Ok(Launched {
            runs: vec![run],
            gathered: false,
            run_time,
        });
    };
    let mut runs = Vec::with_capacity(world);
    let mut errors = Vec::new();
    for (r, bytes) in reports.into_iter().enumerate() {
        if r == 0 {
            runs.push(run.clone());
            continue;
        }
        match decode_run(&bytes) {
            Ok(x) => runs.push(x),
            Err(m) => errors.push((r, ExecError::Program(m))),
        }
    }
    if !errors.is_empty() {
        return Err(RunError::Ranks(errors));
    }
    Ok(Launched {
        runs,
        gathered: true,
        run_time,
    })
}

/// What a rank of a launched world sends rank 0 through the store (as JSON): its run, or why
/// it failed.
#[derive(Debug, Serialize, Deserialize)]
enum RankReport {
    /// The rank ran.
    Ran {
        /// Wall time of the checked run, µs.
        wall_us: u64,
        /// Statements issued.
        statements: usize,
        /// The timed repetitions, ns each.
        timed_ns: Vec<u64>,
        /// Whether they were CUDA graph replays.
        #[serde(default)]
        replayed: bool,
        /// The outputs, in signature order.
        outputs: Vec<OutputReport>,
    },
    /// The rank failed with this message.
    Failed(String),
}

/// One output of a [`RankReport`]: its element type by name, its sizes and its values as
/// their IEEE 754 bit patterns (`f64::to_bits`), so that every value, NaN (with its payload),
/// ±∞ and -0.0 included, comes back exactly (JSON numbers have no NaN or ∞: serde_json
/// writes them as `null`).
#[derive(Debug, Serialize, Deserialize)]
struct OutputReport {
    dtype: String,
    sizes: Vec<usize>,
    bits: Vec<u64>,
}

impl RankReport {
    fn of(run: &RankRun) -> RankReport {
        RankReport::Ran {
            wall_us: run.wall_time.as_micros() as u64,
            statements: run.statements,
            timed_ns: run.timed.iter().map(|t| t.as_nanos() as u64).collect(),
            replayed: run.replayed,
            outputs: run
                .outputs
                .iter()
                .map(|d| OutputReport {
                    dtype: d.dtype.to_string(),
                    sizes: d.sizes.clone(),
                    bits: d.data.iter().map(|v| v.to_bits()).collect(),
                })
                .collect(),
        }
    }
}

/// Reads a [`RankReport`] back into a run; a failed rank's report is its message.
fn decode_run(bytes: &[u8]) -> Result<RankRun, String> {
    let report: RankReport =
        serde_json::from_slice(bytes).map_err(|e| format!("a malformed run report: {e}"))?;
    let (wall_us, statements, timed_ns, replayed, outputs) = match report {
        RankReport::Ran {
            wall_us,
            statements,
            timed_ns,
            replayed,
            outputs,
        } => (wall_us, statements, timed_ns, replayed, outputs),
        RankReport::Failed(message) => return Err(message),
    };
    let outputs = outputs
        .into_iter()
        .map(|o| {
            let dtype = weave_ir::DType::from_name(&o.dtype)
                .ok_or_else(|| format!("a malformed run report: no dtype `{}`", o.dtype))?;
            if o.bits.len() != o.sizes.iter().product::<usize>() {
                return Err("a malformed run report: values do not fill the sizes".to_string());
            }
            Ok(Dense {
                dtype,
                sizes: o.sizes,
                data: o.bits.into_iter().map(f64::from_bits).collect(),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(RankRun {
        outputs,
        wall_time: Duration::from_micros(wall_us),
        statements,
        timed: timed_ns.into_iter().map(Duration::from_nanos).collect(),
        replayed,
        ..RankRun::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use weave_ir::DType;

    #[test]
    fn run_reports_round_trip_and_failures_carry_their_message() {
        let run = RankRun {
            outputs: vec![Dense {
                dtype: DType::BF16,
                sizes: vec![2, 3],
                data: vec![1.0, -2.0, 0.5, 4.0, 8.0, -0.25],
            }],
            wall_time: Duration::from_micros(1234),
            statements: 43,
            timed: vec![Duration::from_nanos(1_500_123), Duration::from_micros(7)],
            replayed: true,
            ..RankRun::default()
        };
        let encoded = serde_json::to_vec(&RankReport::of(&run)).unwrap();
        let back = decode_run(&encoded).unwrap();
        assert_eq!(back.outputs, run.outputs);
        assert_eq!(back.statements, 43);
        assert_eq!(back.wall_time, Duration::from_micros(1234));
        assert_eq!(back.timed, run.timed);
        assert!(back.replayed);
        let failed =
            serde_json::to_vec(&RankReport::Failed("rank 1: out of memory".into())).unwrap();
        assert_eq!(decode_run(&failed).unwrap_err(), "rank 1: out of memory");
        let malformed = decode_run(&[0, 1, 2]).unwrap_err();
        assert!(
            malformed.starts_with("a malformed run report"),
            "{malformed}"
        );
        let mut short = serde_json::to_value(RankReport::of(&run)).unwrap();
        short["Ran"]["outputs"][0]["sizes"] = serde_json::json!([2, 4]);
        let short = decode_run(&serde_json::to_vec(&short).unwrap()).unwrap_err();
        assert!(short.contains("do not fill"), "{short}");
    }

    #[test]
    fn run_reports_carry_non_finite_values_and_negative_zero_exactly() {
        let quiet_nan_with_payload = f64::from_bits(0x7ff8_0000_0000_1234);
        let values = [
            f64::NAN,
            -f64::NAN,
            quiet_nan_with_payload,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            0.0,
            f64::MIN_POSITIVE / 4.0,
            f64::MAX,
            1.0 / 3.0,
        ];
        let run = RankRun {
            outputs: vec![Dense {
                dtype: DType::F32,
                sizes: vec![values.len()],
                data: values.to_vec(),
            }],
            ..RankRun::default()
        };
        let encoded = serde_json::to_vec(&RankReport::of(&run)).unwrap();
        let back = decode_run(&encoded).unwrap_or_else(|e| panic!("{e}"));
        let bits = |d: &[f64]| d.iter().map(|v| v.to_bits()).collect::<Vec<u64>>();
        assert_eq!(bits(&back.outputs[0].data), bits(&values));
        assert_eq!(back.outputs[0].sizes, vec![values.len()]);
    }
}
