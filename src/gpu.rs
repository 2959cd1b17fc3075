//! Running ranks on GPUs: one thread per local GPU in this process (the default), or this
//! process as one rank of a world started by `weave launch`, torchrun or mpirun, with the
//! NCCL id exchanged through a TCP store on rank 0 and every rank's outputs gathered there
//! for the comparison with the reference.

use std::sync::Arc;
use std::time::{Duration, Instant};

use weave_comm::bootstrap::{all_gather, exchange_id, gather, LaunchEnv, TcpStore};
use weave_comm::nccl::{Nccl, NcclId, NcclOptions};
use weave_comm::{CommError, Communicator, IpcCopy, IpcOptions, PeerCopy, PeerHub};
use weave_cuda::{Gpu, GpuStream};
use weave_executor::{
    check_inputs, program_teams, run_rank, run_rank_buffers, Backend, CudaBackend, CudaOptions,
    Dense, DeviceTensor, ExecError, RankRun, RunConfig, StreamKey,
};

use crate::run::{params_of, Compiled, RunError, RunOptions, Transport};

/// The CUDA options a run asks for.
fn cuda_options(options: &RunOptions) -> CudaOptions {
    CudaOptions {
        timeout: options.timeout,
        trace: options.trace,
        ..CudaOptions::default()
    }
}

fn config_of(compiled: &Compiled, options: &RunOptions) -> RunConfig {
    RunConfig {
        params: params_of(&compiled.sharded),
        number_of_streams: options.streams,
        check_races: options.check_races,
    }
}

/// Checks that this process sees at least `needed` GPUs.
fn gpus_available(needed: usize) -> Result<(), RunError> {
    let count = weave_cuda::device_count().map_err(|e| RunError::Setup(e.to_string()))?;
    if count < needed {
        return Err(RunError::Setup(format!(
            "{needed} GPU(s) are needed but {count} are visible"
        )));
    }
    Ok(())
}

/// A backend on `gpu` whose host waits also poll `comm`'s asynchronous errors, so a failed
/// collective ends a wait with the communicator's error instead of a timeout.
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
    /// Copy-engine peer copies between the threads of this process, meeting at the hub.
    Peer(&'a Arc<PeerHub>),
    /// Copy-engine pushes into shared windows, set up through the launcher's store.
    Ipc(&'a TcpStore),
}

/// Opens rank `rank`'s GPU, its backend and its communicator, and runs the program (or, when
/// `fail_early`, aborts right after the setup).
#[allow(clippy::too_many_arguments)]
fn run_one(
    compiled: &Compiled,
    inputs: &[Dense],
    options: &RunOptions,
    device: usize,
    rank: usize,
    world: usize,
    id: &NcclId,
    link: Link<'_>,
    fail_early: bool,
) -> Result<RankRun, ExecError> {
    let gpu = Gpu::open(device)?;
    let comm: Arc<Nccl<DeviceTensor>> = Arc::new(Nccl::init(
        &gpu,
        rank,
        world,
        id,
        NcclOptions {
            timeout: options.timeout,
            ..NcclOptions::default()
        },
    )?);
    comm.prepare_teams(&program_teams(&compiled.program))?;
    if fail_early {
        let why = format!("rank {rank} exits early (injected failure)");
        comm.abort(&why);
        return Err(ExecError::Program(why));
    }
    let backend = backend_for(&gpu, cuda_options(options), &comm)?;
    let run = match link {
        Link::Nccl => drive(compiled, inputs, options, &backend, &*comm),
        Link::Peer(hub) => {
            let peer = PeerCopy::new(comm.clone(), hub.clone(), gpu.clone());
            drive(compiled, inputs, options, &backend, &peer)
        }
        Link::Ipc(store) => {
            let ipc = IpcCopy::connect(comm.clone(), gpu.clone(), IpcOptions::default(), |card| {
                all_gather(store, rank, world, "copy-engine-windows", &card)
            });
            match ipc {
                Ok(ipc) => {
                    let run = drive(compiled, inputs, options, &backend, &ipc);
                    if run.is_err() {
                        // A stream may still wait on the windows: leave them to the
                        // process's exit rather than free memory the GPU may touch.
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

/// Runs the program on `comm`: the warm-up runs, the timed runs (inputs uploaded once,
/// outputs left on the device, each timed from the first statement until the backend is
/// idle), then the run that is checked and traced.
fn drive<C>(
    compiled: &Compiled,
    inputs: &[Dense],
    options: &RunOptions,
    backend: &CudaBackend,
    comm: &C,
) -> Result<RankRun, ExecError>
where
    C: Communicator<Buffer = DeviceTensor, Stream = GpuStream>,
{
    let config = config_of(compiled, options);
    for _ in 0..options.warmup {
        run_rank(&compiled.program, backend, comm, inputs, &config)?;
    }
    let mut timed = Vec::with_capacity(options.iters);
    if options.iters > 0 {
        let buffers = inputs
            .iter()
            .map(|d| backend.upload(d))
            .collect::<Result<Vec<_>, _>>()?;
        for _ in 0..options.iters {
            let start = Instant::now();
            let run = run_rank_buffers(&compiled.program, backend, comm, &buffers, &config)?;
            backend.synchronize()?;
            timed.push(start.elapsed());
            drop(run);
        }
    }
    if options.trace {
        backend.start_trace()?;
    }
    let mut run = run_rank(&compiled.program, backend, comm, inputs, &config)?;
    run.timed = timed;
    Ok(run)
}

/// Runs every rank on its own GPU, one thread per rank, in this process.
pub fn run_threads(
    compiled: &Compiled,
    per_rank: Vec<Vec<Dense>>,
    options: &RunOptions,
) -> Result<(Vec<RankRun>, Duration), RunError> {
    run_threads_with(compiled, per_rank, options, None)
}

/// [`run_threads`] where rank `fail` sets up its GPU and communicator and then exits before
/// posting anything: the failure-injection test of the timeouts and aborts.
pub fn run_threads_failing(
    compiled: &Compiled,
    per_rank: Vec<Vec<Dense>>,
    options: &RunOptions,
    fail: usize,
) -> Result<(Vec<RankRun>, Duration), RunError> {
    run_threads_with(compiled, per_rank, options, Some(fail))
}

fn run_threads_with(
    compiled: &Compiled,
    per_rank: Vec<Vec<Dense>>,
    options: &RunOptions,
    fail: Option<usize>,
) -> Result<(Vec<RankRun>, Duration), RunError> {
    let world = options.ranks;
    if per_rank.len() != world {
        return Err(RunError::Setup(format!(
            "inputs were given for {} rank(s) but {world} ranks run",
            per_rank.len()
        )));
    }
    let config = config_of(compiled, options);
    let mut errors = Vec::new();
    for (rank, inputs) in per_rank.iter().enumerate() {
        if let Err(e) = check_inputs(&compiled.program, inputs, &config, rank, world) {
            errors.push((rank, e));
        }
    }
    if !errors.is_empty() {
        return Err(RunError::Ranks(errors));
    }
    gpus_available(world)?;
    let id = NcclId::new().map_err(|e| RunError::Setup(e.to_string()))?;
    let hub = PeerHub::new();
    let start = Instant::now();
    let results: Vec<Result<RankRun, ExecError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = per_rank
            .iter()
            .enumerate()
            .map(|(rank, inputs)| {
                let id = &id;
                let link = match options.transport {
                    Transport::Nccl => Link::Nccl,
                    Transport::CopyEngine => Link::Peer(&hub),
                };
                scope.spawn(move || {
                    run_one(
                        compiled,
                        inputs,
                        options,
                        rank,
                        rank,
                        world,
                        id,
                        link,
                        fail == Some(rank),
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ExecError::Program("the rank's thread panicked".into()))
                })
            })
            .collect()
    });
    let elapsed = start.elapsed();
    let mut runs = Vec::new();
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(run) => runs.push(run),
            Err(e) => errors.push((rank, e)),
        }
    }
    if errors.is_empty() {
        Ok((runs, elapsed))
    } else {
        Err(RunError::Ranks(errors))
    }
}

/// This process's place in a launched world, if it was started as one: the launcher's
/// variables read from this process's environment (a value that is not UTF-8 is read lossily,
/// so that it is reported as malformed rather than ignored).
pub fn launch_env() -> Result<Option<LaunchEnv>, RunError> {
    LaunchEnv::from_lookup(|name| {
        std::env::var_os(name).map(|value| value.to_string_lossy().into_owned())
    })
    .map_err(|e| RunError::Setup(e.to_string()))
}

/// What rank 0 of a launched world learns: every rank's run (outputs and timings; spans and
/// races of rank 0 only), by rank.
pub type Gathered = Vec<RankRun>;

/// Runs this process's rank of a launched world on GPU `env.local_rank`. Rank 0 returns every
/// rank's run (outputs gathered through the store); the others return `None`.
pub fn run_launched(
    compiled: &Compiled,
    inputs: Vec<Dense>,
    options: &RunOptions,
    env: &LaunchEnv,
) -> Result<Option<(Gathered, Duration)>, RunError> {
    let (rank, world) = (env.rank, env.world);
    let config = config_of(compiled, options);
    check_inputs(&compiled.program, &inputs, &config, rank, world)
        .map_err(|e| RunError::Ranks(vec![(rank, e)]))?;
    gpus_available(env.local_rank + 1)?;
    let setup = |e: CommError| RunError::Setup(format!("rank {rank}: {e}"));
    let store: TcpStore = env.open_store(options.timeout).map_err(setup)?;
    let id_bytes = exchange_id(&store, rank, || {
        NcclId::new().map(|id| id.as_bytes().to_vec())
    })
    .map_err(setup)?;
    let id = NcclId::from_bytes(&id_bytes).map_err(setup)?;
    let start = Instant::now();
    let run = run_one(
        compiled,
        &inputs,
        options,
        env.local_rank,
        rank,
        world,
        &id,
        match options.transport {
            Transport::Nccl => Link::Nccl,
            Transport::CopyEngine => Link::Ipc(&store),
        },
        false,
    );
    let elapsed = start.elapsed();
    // Every rank reports, failed or not, so rank 0 never waits for a report that will not
    // come.
    let report = match &run {
        Ok(r) => encode_run(r),
        Err(e) => {
            let mut b = vec![1u8];
            b.extend(e.to_string().as_bytes());
            b
        }
    };
    let gathered = gather(&store, rank, world, "run", &report).map_err(setup)?;
    let run = run.map_err(|e| RunError::Ranks(vec![(rank, e)]))?;
    let Some(reports) = gathered else {
        return Ok(None);
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
    Ok(Some((runs, elapsed)))
}

/// A rank's run as bytes for the store: `0`, then wall time (µs), statements, the timed
/// repetitions (count, then ns each), and each output
/// as dtype, rank, sizes and its values in the output's element type.
fn encode_run(run: &RankRun) -> Vec<u8> {
    let mut b = vec![0u8];
    b.extend((run.wall_time.as_micros() as u64).to_le_bytes());
    b.extend((run.statements as u64).to_le_bytes());
    b.extend((run.timed.len() as u64).to_le_bytes());
    for t in &run.timed {
        b.extend((t.as_nanos() as u64).to_le_bytes());
    }
    b.extend((run.outputs.len() as u64).to_le_bytes());
    for d in &run.outputs {
        let bytes = d.to_le_bytes();
        let name = d.dtype.to_string();
        b.extend((name.len() as u64).to_le_bytes());
        b.extend(name.as_bytes());
        b.extend((d.sizes.len() as u64).to_le_bytes());
        for s in &d.sizes {
            b.extend((*s as u64).to_le_bytes());
        }
        b.extend((bytes.len() as u64).to_le_bytes());
        b.extend(bytes);
    }
    b
}

fn decode_run(b: &[u8]) -> Result<RankRun, String> {
    let bad = || "a malformed run report".to_string();
    match b.first() {
        Some(0) => {}
        Some(_) => return Err(String::from_utf8_lossy(&b[1..]).into_owned()),
        None => return Err(bad()),
    }
    let mut at = 1usize;
    let u64_ = |at: &mut usize| -> Result<u64, String> {
        let v = b.get(*at..*at + 8).ok_or_else(bad)?;
        *at += 8;
        Ok(u64::from_le_bytes(v.try_into().map_err(|_| bad())?))
    };
    let wall = u64_(&mut at)?;
    let statements = u64_(&mut at)? as usize;
    let count = u64_(&mut at)? as usize;
    let mut timed = Vec::with_capacity(count.min(1 << 20));
    for _ in 0..count {
        timed.push(Duration::from_nanos(u64_(&mut at)?));
    }
    let n = u64_(&mut at)? as usize;
    let mut outputs = Vec::new();
    for _ in 0..n {
        let len = u64_(&mut at)? as usize;
        let name = std::str::from_utf8(b.get(at..at + len).ok_or_else(bad)?).map_err(|_| bad())?;
        at += len;
        let dtype = weave_ir::DType::from_name(name).ok_or_else(bad)?;
        let rank = u64_(&mut at)? as usize;
        let mut sizes = Vec::with_capacity(rank);
        for _ in 0..rank {
            sizes.push(u64_(&mut at)? as usize);
        }
        let len = u64_(&mut at)? as usize;
        let bytes = b.get(at..at + len).ok_or_else(bad)?;
        at += len;
        outputs.push(Dense::from_le_bytes(dtype, sizes, bytes)?);
    }
    Ok(RankRun {
        outputs,
        races: Vec::new(),
        spans: Vec::new(),
        issue_time: Duration::ZERO,
        wall_time: Duration::from_micros(wall),
        statements,
        timed,
        final_stream: StreamKey::Main,
        streams: Vec::new(),
        live_allocations: 0,
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
            races: Vec::new(),
            spans: Vec::new(),
            issue_time: Duration::ZERO,
            wall_time: Duration::from_micros(1234),
            statements: 43,
            timed: vec![Duration::from_nanos(1_500_123), Duration::from_micros(7)],
            final_stream: StreamKey::Main,
            streams: Vec::new(),
            live_allocations: 0,
        };
        let back = decode_run(&encode_run(&run)).unwrap();
        assert_eq!(back.outputs, run.outputs);
        assert_eq!(back.statements, 43);
        assert_eq!(back.wall_time, Duration::from_micros(1234));
        assert_eq!(back.timed, run.timed);
        let mut failed = vec![1u8];
        failed.extend(b"rank 1: out of memory");
        assert_eq!(decode_run(&failed).unwrap_err(), "rank 1: out of memory");
        assert_eq!(
            decode_run(&[0, 1, 2]).unwrap_err(),
            "a malformed run report"
        );
    }
}
