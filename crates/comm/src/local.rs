//! `Local`: ranks as threads of one process, exchanging host views through rendezvous slots.

use std::time::Duration;

use crate::communicator::{Collective, Communicator, P2p, TaskQueue};
use crate::error::CommError;
use crate::host::HostView;

/// The shared state of one group of in-process ranks.
pub struct LocalWorld {
    size: usize,
    timeout: Duration,
}

impl LocalWorld {
    /// A world of `size` ranks whose waits give up after `timeout`.
    pub fn new(size: usize, timeout: Duration) -> LocalWorld {
        LocalWorld { size, timeout }
    }

    /// The communicator of `rank`.
    pub fn communicator(&self, rank: usize) -> Local {
        Local {
            rank,
            size: self.size,
            timeout: self.timeout,
        }
    }
}

/// One rank's handle on a [`LocalWorld`].
pub struct Local {
    rank: usize,
    size: usize,
    timeout: Duration,
}

impl Communicator for Local {
    type Buffer = HostView;
    type Stream = dyn TaskQueue;

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn post(
        &self,
        collective: Collective<HostView>,
        _stream: &dyn TaskQueue,
    ) -> Result<(), CommError> {
        Err(CommError::Backend {
            op: collective.label,
            message: "not implemented".into(),
        })
    }

    fn post_p2p(
        &self,
        label: String,
        _ops: Vec<P2p<HostView>>,
        _stream: &dyn TaskQueue,
    ) -> Result<(), CommError> {
        Err(CommError::Backend {
            op: label,
            message: "not implemented".into(),
        })
    }

    fn abort(&self, _reason: &str) {}
}
