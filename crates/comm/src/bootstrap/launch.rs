//! Where this process sits in a run: [`LaunchEnv`], read from the variables of torchrun,
//! Open MPI, PMI or Slurm, and the store it opens from them.

use std::time::Duration;

use super::listener::inherited_listener;
use super::{bootstrap, TcpStore, DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT, STORE_FD, STORE_PORT};
use crate::error::CommError;

/// Where this process sits in a multi-process run, as its launcher describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    /// This process's rank, in `0..world`.
    pub rank: usize,
    /// The number of processes.
    pub world: usize,
    /// This process's index among the processes of its node; the GPU it uses.
    pub local_rank: usize,
    /// The number of processes on this node.
    pub local_world: usize,
    /// The host of rank 0's store (`MASTER_ADDR`, default `127.0.0.1`).
    pub master_addr: String,
    /// The port of rank 0's store: `WEAVE_STORE_PORT` when set; else `MASTER_PORT`
    /// (default 29500), plus one under torchrun's agent store
    /// (`TORCHELASTIC_USE_AGENT_STORE=True`), which listens at `MASTER_PORT` itself.
    pub master_port: u16,
    /// The launcher the variables came from: `torchrun`, `Open MPI`, `PMI` or `Slurm`.
    pub source: &'static str,
    /// On rank 0, the inherited descriptor of the listening socket its launcher bound for the
    /// store ([`STORE_FD`]); `None` when rank 0 binds `master_port` itself, and on every
    /// other rank.
    pub store_fd: Option<i32>,
}

/// The variables one launcher sets: rank, world size, local rank, local world size (the last
/// two optional).
struct Convention {
    source: &'static str,
    rank: &'static str,
    world: &'static str,
    local_rank: &'static str,
    local_world: Option<&'static str>,
}

/// The launchers, in order of precedence.
const CONVENTIONS: [Convention; 4] = [
    Convention {
        source: "torchrun",
        rank: "RANK",
        world: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
        local_world: Some("LOCAL_WORLD_SIZE"),
    },
    Convention {
        source: "Open MPI",
        rank: "OMPI_COMM_WORLD_RANK",
        world: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_world: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    Convention {
        source: "PMI",
        rank: "PMI_RANK",
        world: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        local_world: Some("MPI_LOCALNRANKS"),
    },
    Convention {
        source: "Slurm",
        rank: "SLURM_PROCID",
        world: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
        local_world: None,
    },
];

/// Parses variable `name`'s `value` as a count or index.
fn number(name: &str, value: &str) -> Result<usize, CommError> {
    value
        .trim()
        .parse::<usize>()
        .map_err(|_| bootstrap(format!("{name}={value} is not a number")))
}

impl LaunchEnv {
    /// Reads the launch description through `get` (a variable's value, or `None` when it is
    /// not set). The library never reads the process environment itself: a program passes
    /// a lookup into it (`|name| std::env::var(name).ok()`, or one that reads values that are
    /// not UTF-8 lossily so they are reported as malformed rather than ignored), a test a
    /// map.
    ///
    /// The first launcher whose rank variable is set wins: torchrun (`RANK`, `WORLD_SIZE`,
    /// `LOCAL_RANK`, `LOCAL_WORLD_SIZE`), Open MPI (`OMPI_COMM_WORLD_RANK`, `…_SIZE`,
    /// `…_LOCAL_RANK`, `…_LOCAL_SIZE`), PMI (`PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`,
    /// `MPI_LOCALNRANKS`), Slurm (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`). Its world
    /// size must be set too; a missing local rank means a single node (local rank = rank), a
    /// missing local world size means the whole world. `MASTER_ADDR` and `MASTER_PORT` are
    /// read whatever the launcher, and on rank 0 [`STORE_FD`].
    ///
    /// `Ok(None)` when no launcher variable is set: a single process. A malformed or
    /// inconsistent value is a [`CommError::Bootstrap`] naming the variable and its value.
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<LaunchEnv>, CommError> {
        let Some((convention, rank_value)) = CONVENTIONS
            .iter()
            .find_map(|c| get(c.rank).map(|value| (c, value)))
        else {
            return Ok(None);
        };
        let rank = number(convention.rank, &rank_value)?;
        let Some(world_value) = get(convention.world) else {
            return Err(bootstrap(format!(
                "{} is set but {} is not",
                convention.rank, convention.world
            )));
        };
        let world = number(convention.world, &world_value)?;
        if world == 0 {
            return Err(bootstrap(format!(
                "{}={world_value} must be at least 1",
                convention.world
            )));
        }
        if rank >= world {
            return Err(bootstrap(format!(
                "{}={rank_value} is not below {}={world_value}",
                convention.rank, convention.world
            )));
        }

        let local_world_var = convention
            .local_world
            .and_then(|name| get(name).map(|value| (name, value)));
        let local_world = match &local_world_var {
            Some((name, value)) => {
                let local_world = number(name, value)?;
                if local_world == 0 {
                    return Err(bootstrap(format!("{name}={value} must be at least 1")));
                }
                if local_world > world {
                    return Err(bootstrap(format!(
                        "{name}={value} is larger than {}={world_value}",
                        convention.world
                    )));
                }
                local_world
            }
            None => world,
        };
        let local_rank = match get(convention.local_rank) {
            Some(value) => {
                let local_rank = number(convention.local_rank, &value)?;
                if local_rank >= local_world {
                    let bound = match &local_world_var {
                        Some((name, world_value)) => format!("{name}={world_value}"),
                        None => format!("{}={world_value}", convention.world),
                    };
                    return Err(bootstrap(format!(
                        "{}={value} is not below {bound}",
                        convention.local_rank
                    )));
                }
                local_rank
            }
            // Ranks fill the nodes in blocks of `local_world`.
            None => rank % local_world,
        };

        let master_addr = match get("MASTER_ADDR") {
            Some(addr) if addr.trim().is_empty() => {
                return Err(bootstrap("MASTER_ADDR is set but empty"));
            }
            Some(addr) => addr.trim().to_string(),
            None => DEFAULT_MASTER_ADDR.to_string(),
        };
        let port = |name: &str, value: &str| match value.trim().parse::<u16>() {
            Ok(port) if port > 0 => Ok(port),
            _ => Err(bootstrap(format!(
                "{name}={value} is not a port number (1 to 65535)"
            ))),
        };
        let master_port = match get("MASTER_PORT") {
            Some(value) => port("MASTER_PORT", &value)?,
            None => DEFAULT_MASTER_PORT,
        };
        // torchrun's agent serves its own store at MASTER_PORT and says so: ours takes the
        // next port. `WEAVE_STORE_PORT` chooses it outright.
        let agent_store = get("TORCHELASTIC_USE_AGENT_STORE")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let master_port = match get(STORE_PORT) {
            Some(value) => port(STORE_PORT, &value)?,
            None if agent_store => master_port.checked_add(1).ok_or_else(|| {
                bootstrap(format!(
                    "MASTER_PORT={master_port} is torchrun's store, and no port follows it for ours: set {STORE_PORT}"
                ))
            })?,
            None => master_port,
        };

        // Only rank 0 serves the store; the variable means nothing elsewhere.
        let store_fd = match get(STORE_FD).filter(|_| rank == 0) {
            Some(value) => Some(
                value
                    .trim()
                    .parse::<i32>()
                    .ok()
                    .filter(|fd| *fd >= 0)
                    .ok_or_else(|| {
                        bootstrap(format!("{STORE_FD}={value} is not a descriptor number"))
                    })?,
            ),
            None => None,
        };

        Ok(Some(LaunchEnv {
            rank,
            world,
            local_rank,
            local_world,
            master_addr,
            master_port,
            source: convention.source,
            store_fd,
        }))
    }

    /// The GPU this process should use: its local rank.
    pub fn device(&self) -> usize {
        self.local_rank
    }

    /// `MASTER_ADDR:MASTER_PORT`, with an IPv6 address in brackets: where rank 0's store
    /// listens.
    pub fn store_addr(&self) -> String {
        if self.master_addr.contains(':') && !self.master_addr.starts_with('[') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }

    /// Rank 0 serves the store at [`LaunchEnv::store_addr`] (on the socket its launcher
    /// handed it when [`LaunchEnv::store_fd`] is set, which must listen at `master_port`);
    /// every other rank connects to it, waiting at most `timeout` for rank 0 to appear.
    pub fn open_store(&self, timeout: Duration) -> Result<TcpStore, CommError> {
        match (self.rank, self.store_fd) {
            (0, Some(fd)) => {
                let listener = inherited_listener(fd, self.master_port)?;
                TcpStore::serve_on(listener, self.world, timeout)
            }
            (0, None) => TcpStore::serve(&self.store_addr(), self.world, timeout),
            _ => TcpStore::connect(&self.store_addr(), timeout),
        }
    }
}
