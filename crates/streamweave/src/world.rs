//! Opening a GPU world, in one place: the NCCL id (made here, or exchanged through a
//! launcher's store), and each rank's GPU and NCCL communicator with the run's options. Runs
//! (`gpu`), sessions (`session`), calibration and tuning (`calibrate::World`) open their
//! ranks through it.

use std::sync::Arc;
use std::time::Duration;

use weave_comm::bootstrap::{exchange_id, LaunchEnv, TcpStore};
use weave_comm::nccl::{Nccl, NcclId, NcclOptions};
use weave_comm::CommError;
use weave_cuda::{CudaError, Gpu};
use weave_executor::{DeviceTensor, ExecError};

use crate::setup::{OverlapError, RunOptions};

/// Why a rank's GPU or communicator could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    /// The GPU (its context) could not be opened.
    #[error("{0}")]
    Gpu(#[from] CudaError),
    /// The NCCL communicator could not be initialised.
    #[error("{0}")]
    Nccl(#[from] CommError),
}

impl From<OpenError> for ExecError {
    fn from(e: OpenError) -> ExecError {
        match e {
            OpenError::Gpu(e) => ExecError::Cuda(e),
            OpenError::Nccl(e) => ExecError::Comm(e),
        }
    }
}

/// A rank's GPU and its NCCL communicator.
pub(crate) struct OpenRank {
    pub gpu: Gpu,
    pub comm: Arc<Nccl<DeviceTensor>>,
}

/// The NCCL options a run asks for: its overlap knobs (CTA limits, windows) over NCCL's
/// defaults, every wait bounded by the run's wait timeout.
pub(crate) fn nccl_options(options: &RunOptions) -> Result<NcclOptions, OverlapError> {
    options.gpu.overlap.nccl_options(NcclOptions {
        timeout: options.timeouts.wait,
        ..NcclOptions::default()
    })
}

/// Opens rank `rank` of a world of `world` on GPU `device`: its context and its NCCL
/// communicator from the world's `id`.
pub(crate) fn open_rank(
    device: usize,
    rank: usize,
    world: usize,
    id: &NcclId,
    nccl: NcclOptions,
) -> Result<OpenRank, OpenError> {
    let gpu = Gpu::open(device)?;
    let comm = Arc::new(Nccl::init(&gpu, rank, world, id, nccl)?);
    Ok(OpenRank { gpu, comm })
}

/// The store of a launched world (`env`) and the NCCL id rank 0 made and handed to every
/// rank through it.
pub(crate) fn launched_id(
    env: &LaunchEnv,
    timeout: Duration,
) -> Result<(TcpStore, NcclId), CommError> {
    let store = env.open_store(timeout)?;
    let bytes = exchange_id(&store, env.rank, || {
        NcclId::new().map(|id| id.as_bytes().to_vec())
    })?;
    let id = NcclId::from_bytes(&bytes)?;
    Ok((store, id))
}

/// Checks that this process sees at least `needed` GPUs.
pub(crate) fn gpus_available(needed: usize) -> Result<(), String> {
    let count = weave_cuda::device_count().map_err(|e| e.to_string())?;
    if count < needed {
        return Err(format!(
            "{needed} GPU(s) are needed but {count} are visible"
        ));
    }
    Ok(())
}
