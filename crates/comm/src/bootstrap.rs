//! Starting a multi-process run: reading rank and world size from launcher variables, and a
//! small TCP key-value store through which the ranks exchange the NCCL unique id and collect
//! per-rank results.
//!
//! * [`LaunchEnv`] reads (through a lookup its caller passes) the variables set by torchrun, Open MPI, MPICH/Intel MPI (PMI) or
//!   Slurm, in that order of precedence; none of them set means a single process.
//! * [`TcpStore`]: rank 0 serves a key-value map on `MASTER_ADDR:MASTER_PORT`, the other
//!   ranks connect to it (retrying until the timeout, since rank 0 may start later). `get`
//!   blocks until the key is set, bounded by the timeout. A launcher that picks the port
//!   itself (`weave launch`) binds port 0 and hands the bound, listening socket to rank 0
//!   ([`STORE_FD`]), publishing its port as `MASTER_PORT`: no other process can take the port
//!   between the pick and rank 0's store, as it could were the port picked, freed and bound
//!   again.
//! * [`exchange_id`] hands rank 0's NCCL unique id to every rank; [`gather`] collects one
//!   value per rank on rank 0.
//!
//! The wire protocol is private to this module and versionless: every rank of a run must use
//! the same build. A request is one byte of operation, a length-prefixed key and, for `set`,
//! a length-prefixed value; `get` carries how long the server may wait for the key. Lengths
//! are big-endian; keys and values have size limits, and a request over them closes the
//! connection.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::CommError;

/// The default address of rank 0's store when `MASTER_ADDR` is not set.
pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";

/// The default port of rank 0's store when `MASTER_PORT` is not set.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// The variable that chooses the port of rank 0's store outright.
pub const STORE_PORT: &str = "WEAVE_STORE_PORT";

/// The variable through which a launcher hands rank 0 the listening socket of its store: the
/// number of an inherited descriptor, a TCP socket listening at `MASTER_PORT` (`weave launch`
/// binds port 0 and sets it on rank 0 only). Rank 0 serves its stores on that socket instead
/// of binding `MASTER_PORT` itself.
pub const STORE_FD: &str = "WEAVE_STORE_FD";

/// The key under which [`exchange_id`] publishes the NCCL unique id.
pub const NCCL_ID_KEY: &str = "nccl-id";

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

fn bootstrap(message: impl Into<String>) -> CommError {
    CommError::Bootstrap(message.into())
}

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

/// The listening sockets this process inherited ([`STORE_FD`]), each adopted once by its
/// descriptor number and lent to every store served on it as a clone.
static INHERITED: Mutex<Vec<(i32, TcpListener)>> = Mutex::new(Vec::new());

/// A clone of the inherited listening socket `fd`, which must listen at `port`: adopted the
/// first time (as a close-on-exec copy, so that the programs this process starts do not hold
/// the port), cloned every time, so that one process may serve several stores on it one
/// after another.
fn inherited_listener(fd: i32, port: u16) -> Result<TcpListener, CommError> {
    let named = |why: String| bootstrap(format!("{STORE_FD}={fd}: {why}"));
    let mut inherited = INHERITED.lock().unwrap_or_else(|e| e.into_inner());
    let index = match inherited.iter().position(|(f, _)| *f == fd) {
        Some(index) => index,
        None => {
            let listener = adopt_listener(fd).map_err(|e| named(e.to_string()))?;
            let wrong = match listener.local_addr() {
                Ok(bound) if bound.port() == port => None,
                Ok(bound) => Some(format!(
                    "the socket listens at port {}, not at MASTER_PORT's {port}",
                    bound.port()
                )),
                Err(e) => Some(format!("not a TCP socket: {e}")),
            };
            if let Some(why) = wrong {
                // Not the store's socket, so not ours to close: the descriptor stays open.
                std::mem::forget(listener);
                return Err(named(why));
            }
            // Kept as a close-on-exec copy, the inherited descriptor closed: the programs
            // this process starts do not hold the port.
            let kept = listener
                .try_clone()
                .map_err(|e| named(format!("cannot use the socket: {e}")))?;
            drop(listener);
            inherited.push((fd, kept));
            inherited.len() - 1
        }
    };
    inherited[index]
        .1
        .try_clone()
        .map_err(|e| named(format!("cannot use the socket: {e}")))
}

/// Takes ownership of the inherited descriptor `fd` once it is known to be an open socket
/// that listens.
#[cfg(unix)]
#[allow(unsafe_code)]
fn adopt_listener(fd: i32) -> io::Result<TcpListener> {
    use std::os::fd::FromRawFd;
    // SAFETY: `fcntl` and `getsockopt` accept any integer as a descriptor (an error when it
    // is not an open one); `getsockopt` writes at most `len` bytes into `listening`.
    unsafe {
        if libc::fcntl(fd, libc::F_GETFD) < 0 {
            return Err(io::Error::other(format!(
                "not an open descriptor: {}",
                io::Error::last_os_error()
            )));
        }
        let mut listening: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        if libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&raw mut listening).cast(),
            &mut len,
        ) != 0
        {
            return Err(io::Error::other(format!(
                "not a socket: {}",
                io::Error::last_os_error()
            )));
        }
        if listening == 0 {
            return Err(io::Error::other("the socket does not listen"));
        }
        // SAFETY: the descriptor is open and a listening socket, handed to this process by
        // its launcher for its store; [`INHERITED`] adopts each descriptor number once.
        Ok(TcpListener::from_raw_fd(fd))
    }
}

/// Elsewhere no descriptor is inherited.
#[cfg(not(unix))]
fn adopt_listener(_fd: i32) -> io::Result<TcpListener> {
    Err(io::Error::other(
        "inherited sockets are supported on Unix only",
    ))
}

/// The longest key the store accepts, in bytes.
pub const MAX_KEY_BYTES: usize = 4096;

/// The largest value the store accepts, in bytes.
pub const MAX_VALUE_BYTES: usize = 256 << 20;

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const STATUS_OK: u8 = 0;
const STATUS_MISSING: u8 = 1;
const STATUS_CLOSED: u8 = 2;

/// Why a client handle refuses further operations.
const BROKEN: &str = "the connection broke off during an earlier operation";

/// How often the server's threads look at the stop flag.
const POLL: Duration = Duration::from_millis(50);

/// The longest one read of a request or reply may stall once it has started.
const STALL: Duration = Duration::from_secs(30);

/// A key-value store shared by the ranks of a run: rank 0 serves it, the others reach it
/// over TCP. Values are byte strings, never removed; [`TcpStore::get`] waits for a key to be
/// set. Every operation is bounded by the store's timeout.
///
/// Rank 0's store must outlive the other ranks' use of it: dropping it stops the server.
pub struct TcpStore {
    inner: Inner,
    addr: SocketAddr,
    timeout: Duration,
}

enum Inner {
    /// Rank 0: the map itself, and the server's stop flag.
    Server {
        state: Arc<ServerState>,
        world: usize,
    },
    /// Another rank: one connection, one request at a time; `None` once an exchange broke
    /// off midway, after which the connection cannot be trusted to be in step.
    Client(Mutex<Option<TcpStream>>),
}

struct ServerState {
    map: Mutex<HashMap<String, Arc<Vec<u8>>>>,
    changed: Condvar,
    stop: AtomicBool,
}

impl ServerState {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Vec<u8>>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, key: String, value: Vec<u8>) {
        self.lock().insert(key, Arc::new(value));
        self.changed.notify_all();
    }

    /// The value of `key`, waiting at most `wait`; `Err(true)` when the server stopped,
    /// `Err(false)` when the wait ran out.
    fn get(&self, key: &str, wait: Duration) -> Result<Arc<Vec<u8>>, bool> {
        let deadline = Instant::now().checked_add(wait);
        let mut map = self.lock();
        loop {
            if let Some(value) = map.get(key) {
                return Ok(Arc::clone(value));
            }
            if self.stop.load(Ordering::Acquire) {
                return Err(true);
            }
            let now = Instant::now();
            let remaining = match deadline {
                Some(deadline) if now >= deadline => return Err(false),
                Some(deadline) => (deadline - now).min(POLL),
                None => POLL,
            };
            map = self
                .changed
                .wait_timeout(map, remaining)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl std::fmt::Debug for TcpStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let role = match self.inner {
            Inner::Server { .. } => "server",
            Inner::Client(_) => "client",
        };
        f.debug_struct("TcpStore")
            .field("role", &role)
            .field("addr", &self.addr)
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl TcpStore {
    /// Serves a store on `addr` (`host:port`; port 0 picks a free port, see
    /// [`TcpStore::local_addr`]) for a run of `world` ranks. Operations of this handle (rank
    /// 0's) wait at most `timeout`. The server runs on background threads until this handle
    /// is dropped.
    pub fn serve(addr: &str, world: usize, timeout: Duration) -> Result<TcpStore, CommError> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| bootstrap(format!("cannot serve the store on {addr}: {e}")))?;
        Self::serve_on(listener, world, timeout)
    }

    /// Serves a store on `listener`, a socket the caller bound (a launcher's, handed down
    /// through [`STORE_FD`]), for a run of `world` ranks, as [`TcpStore::serve`] does;
    /// [`TcpStore::local_addr`] is the address it is bound to.
    pub fn serve_on(
        listener: TcpListener,
        world: usize,
        timeout: Duration,
    ) -> Result<TcpStore, CommError> {
        let local = listener
            .local_addr()
            .map_err(|e| bootstrap(format!("cannot serve the store: {e}")))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| bootstrap(format!("cannot serve the store on {local}: {e}")))?;
        let state = Arc::new(ServerState {
            map: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let accept_state = Arc::clone(&state);
        thread::Builder::new()
            .name("weave-store-accept".into())
            .spawn(move || accept_loop(listener, accept_state))
            .map_err(|e| bootstrap(format!("cannot start the store's server thread: {e}")))?;
        Ok(TcpStore {
            inner: Inner::Server { state, world },
            addr: local,
            timeout,
        })
    }

    /// Connects to the store served at `addr` (`host:port`), retrying until `timeout` has
    /// passed (the server may start later). Operations of this handle wait at most
    /// `timeout`.
    pub fn connect(addr: &str, timeout: Duration) -> Result<TcpStore, CommError> {
        let start = Instant::now();
        let deadline = start.checked_add(timeout);
        let mut last_error = String::from("no attempt was made");
        loop {
            let remaining = match deadline {
                Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if remaining.is_zero() {
                return Err(bootstrap(format!(
                    "could not connect to the store at {addr} within {} ms: {last_error}",
                    millis(timeout)
                )));
            }
            match addr.to_socket_addrs() {
                Ok(candidates) => {
                    for candidate in candidates {
                        let attempt = remaining.min(Duration::from_secs(5)).max(POLL);
                        match TcpStream::connect_timeout(&candidate, attempt) {
                            Ok(stream) => {
                                let _ = stream.set_nodelay(true);
                                return Ok(TcpStore {
                                    inner: Inner::Client(Mutex::new(Some(stream))),
                                    addr: candidate,
                                    timeout,
                                });
                            }
                            Err(e) => last_error = format!("{candidate}: {e}"),
                        }
                    }
                }
                Err(e) => last_error = format!("cannot resolve {addr}: {e}"),
            }
            let remaining = match deadline {
                Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                None => POLL,
            };
            thread::sleep(remaining.min(POLL));
        }
    }

    /// The store's address: where this handle's server listens (rank 0), or the server this
    /// handle is connected to (other ranks).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// How long an operation waits.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether this handle serves the store (rank 0's).
    pub fn is_server(&self) -> bool {
        matches!(self.inner, Inner::Server { .. })
    }

    /// The world size given to [`TcpStore::serve`]; `None` on a connected handle.
    pub fn world(&self) -> Option<usize> {
        match self.inner {
            Inner::Server { world, .. } => Some(world),
            Inner::Client(_) => None,
        }
    }

    /// Sets `key` to `value`, replacing any earlier value, and wakes every `get` waiting for
    /// it.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), CommError> {
        check_sizes(key, value.len()).map_err(|e| self.failed("set", key, e))?;
        match &self.inner {
            Inner::Server { state, .. } => {
                state.set(key.to_string(), value.to_vec());
                Ok(())
            }
            Inner::Client(connection) => {
                let mut connection = connection.lock().unwrap_or_else(|e| e.into_inner());
                let Some(stream) = connection.as_mut() else {
                    return Err(self.failed("set", key, BROKEN.into()));
                };
                let result = (|| -> io::Result<u8> {
                    stream.set_read_timeout(Some(self.timeout.max(POLL)))?;
                    let mut request = Vec::with_capacity(1 + 4 + key.len() + 8 + value.len());
                    request.push(OP_SET);
                    put_bytes32(&mut request, key.as_bytes());
                    put_bytes64(&mut request, value);
                    stream.write_all(&request)?;
                    stream.flush()?;
                    read_u8(stream)
                })();
                match result {
                    Ok(STATUS_OK) => Ok(()),
                    Ok(status) => Err(self.failed(
                        "set",
                        key,
                        format!("the server answered with status {status}"),
                    )),
                    Err(e) => {
                        *connection = None;
                        Err(self.lost("set", key, &e))
                    }
                }
            }
        }
    }

    /// The value of `key`, waiting until some rank sets it, at most the store's timeout.
    pub fn get(&self, key: &str) -> Result<Vec<u8>, CommError> {
        self.get_timeout(key, self.timeout)
    }

    /// The value of `key`, waiting at most `timeout` for some rank to set it.
    pub fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, CommError> {
        let _span = tracing::debug_span!("store_wait", key).entered();
        check_sizes(key, 0).map_err(|e| self.failed("get", key, e))?;
        let timed_out = || {
            bootstrap(format!(
                "timed out after {} ms waiting for key \"{key}\" at the store {}",
                millis(timeout),
                self.addr
            ))
        };
        match &self.inner {
            Inner::Server { state, .. } => match state.get(key, timeout) {
                Ok(value) => Ok(value.as_ref().clone()),
                Err(true) => Err(self.failed("get", key, "the store was closed".into())),
                Err(false) => Err(timed_out()),
            },
            Inner::Client(connection) => {
                let mut connection = connection.lock().unwrap_or_else(|e| e.into_inner());
                let Some(stream) = connection.as_mut() else {
                    return Err(self.failed("get", key, BROKEN.into()));
                };
                let result = (|| -> io::Result<(u8, Vec<u8>)> {
                    // The server answers within `timeout`; allow it time to send the value.
                    stream.set_read_timeout(Some(timeout.saturating_add(STALL)))?;
                    let mut request = Vec::with_capacity(1 + 4 + key.len() + 8);
                    request.push(OP_GET);
                    put_bytes32(&mut request, key.as_bytes());
                    request.extend_from_slice(&millis(timeout).to_be_bytes());
                    stream.write_all(&request)?;
                    stream.flush()?;
                    let status = read_u8(stream)?;
                    if status != STATUS_OK {
                        return Ok((status, Vec::new()));
                    }
                    stream.set_read_timeout(Some(STALL))?;
                    let value = read_bytes64(stream)?;
                    Ok((status, value))
                })();
                match result {
                    Ok((STATUS_OK, value)) => Ok(value),
                    Ok((STATUS_MISSING, _)) => Err(timed_out()),
                    Ok((STATUS_CLOSED, _)) => {
                        Err(self.failed("get", key, "the store was closed".into()))
                    }
                    Ok((status, _)) => Err(self.failed(
                        "get",
                        key,
                        format!("the server answered with status {status}"),
                    )),
                    Err(e) => {
                        *connection = None;
                        Err(self.lost("get", key, &e))
                    }
                }
            }
        }
    }

    fn failed(&self, op: &str, key: &str, why: String) -> CommError {
        bootstrap(format!(
            "{op} of key \"{key}\" at the store {} failed: {why}",
            self.addr
        ))
    }

    fn lost(&self, op: &str, key: &str, e: &io::Error) -> CommError {
        self.failed(op, key, format!("lost the connection: {e}"))
    }
}

impl Drop for TcpStore {
    fn drop(&mut self) {
        if let Inner::Server { state, .. } = &self.inner {
            state.stop.store(true, Ordering::Release);
            state.changed.notify_all();
        }
    }
}

fn check_sizes(key: &str, value: usize) -> Result<(), String> {
    if key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "the key has {} bytes, more than the limit of {MAX_KEY_BYTES}",
            key.len()
        ));
    }
    if value > MAX_VALUE_BYTES {
        return Err(format!(
            "the value has {value} bytes, more than the limit of {MAX_VALUE_BYTES}"
        ));
    }
    Ok(())
}

fn put_bytes32(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn put_bytes64(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn read_u8(r: &mut impl Read) -> io::Result<u8> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

fn read_bytes(r: &mut impl Read, len: u64, limit: usize) -> io::Result<Vec<u8>> {
    let len = usize::try_from(len)
        .ok()
        .filter(|&len| len <= limit)
        .ok_or_else(|| invalid(format!("a length of {len} bytes exceeds the limit {limit}")))?;
    let mut bytes = vec![0u8; len];
    r.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn read_bytes64(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let len = read_u64(r)?;
    read_bytes(r, len, MAX_VALUE_BYTES)
}

/// Accepts connections until the store is dropped, one thread per connection.
fn accept_loop(listener: TcpListener, state: Arc<ServerState>) {
    while !state.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                let state = Arc::clone(&state);
                let spawned = thread::Builder::new()
                    .name("weave-store-conn".into())
                    .spawn(move || {
                        // A broken connection only ends that client's session.
                        let _ = serve_connection(stream, &state);
                    });
                if spawned.is_err() {
                    thread::sleep(POLL);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(POLL / 10),
            Err(_) => thread::sleep(POLL / 10),
        }
    }
}

/// Answers one client's requests until it disconnects or the store stops.
fn serve_connection(mut stream: TcpStream, state: &ServerState) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    let _ = stream.set_nodelay(true);
    loop {
        // Wait for the next request, looking at the stop flag now and then.
        stream.set_read_timeout(Some(POLL))?;
        let op = loop {
            if state.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            let mut b = [0u8; 1];
            match stream.read(&mut b) {
                Ok(0) => return Ok(()),
                Ok(_) => break b[0],
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        stream.set_read_timeout(Some(STALL))?;
        let key_len = read_u32(&mut stream)?;
        let key = read_bytes(&mut stream, u64::from(key_len), MAX_KEY_BYTES)?;
        let key = String::from_utf8(key).map_err(|_| invalid("a key is not UTF-8".into()))?;
        match op {
            OP_SET => {
                let value = read_bytes64(&mut stream)?;
                state.set(key, value);
                stream.write_all(&[STATUS_OK])?;
            }
            OP_GET => {
                let wait = Duration::from_millis(read_u64(&mut stream)?);
                match state.get(&key, wait) {
                    Ok(value) => {
                        let mut reply = Vec::with_capacity(1 + 8 + value.len());
                        reply.push(STATUS_OK);
                        put_bytes64(&mut reply, &value);
                        stream.write_all(&reply)?;
                    }
                    Err(true) => stream.write_all(&[STATUS_CLOSED])?,
                    Err(false) => stream.write_all(&[STATUS_MISSING])?,
                }
            }
            other => return Err(invalid(format!("unknown request {other}"))),
        }
        stream.flush()?;
    }
}

/// Hands rank 0's NCCL unique id to every rank through `store`: rank 0 calls `make` (for
/// instance `|| NcclId::new().map(|id| id.as_bytes().to_vec())`) and publishes the bytes
/// under [`NCCL_ID_KEY`]; every other rank waits for them. Returns the id's bytes on every
/// rank. When `make` fails on rank 0 the failure is published too, so that the other ranks
/// fail at once with rank 0's reason instead of timing out.
///
/// One store carries one id: use a fresh store for every communicator world.
pub fn exchange_id<T: Into<Vec<u8>>>(
    store: &TcpStore,
    rank: usize,
    make: impl FnOnce() -> Result<T, CommError>,
) -> Result<Vec<u8>, CommError> {
    if rank == 0 {
        match make() {
            Ok(id) => {
                let id: Vec<u8> = id.into();
                let mut message = Vec::with_capacity(1 + id.len());
                message.push(1);
                message.extend_from_slice(&id);
                store.set(NCCL_ID_KEY, &message)?;
                Ok(id)
            }
            Err(e) => {
                let mut message = vec![0];
                message.extend_from_slice(e.to_string().as_bytes());
                // The other ranks would time out anyway if this fails; report `make`'s error.
                let _ = store.set(NCCL_ID_KEY, &message);
                Err(e)
            }
        }
    } else {
        let message = store.get(NCCL_ID_KEY)?;
        match message.split_first() {
            Some((1, id)) => Ok(id.to_vec()),
            Some((0, reason)) => Err(bootstrap(format!(
                "rank 0 could not create the NCCL id: {}",
                String::from_utf8_lossy(reason)
            ))),
            _ => Err(bootstrap(format!(
                "the value of key \"{NCCL_ID_KEY}\" at the store {} is malformed",
                store.local_addr()
            ))),
        }
    }
}

/// Collects one value per rank on rank 0: every rank publishes `value` under `key/<rank>`,
/// rank 0 waits for all `world` of them and returns them in rank order; the other ranks
/// return `None` once theirs is stored.
pub fn gather(
    store: &TcpStore,
    rank: usize,
    world: usize,
    key: &str,
    value: &[u8],
) -> Result<Option<Vec<Vec<u8>>>, CommError> {
    check_member("gather", key, rank, world)?;
    if rank != 0 {
        store.set(&format!("{key}/{rank}"), value)?;
        return Ok(None);
    }
    read_all(store, rank, world, key, value).map(Some)
}

/// Hands every rank's `value` to every rank: each publishes it under `key/<rank>` and reads
/// all `world` of them, in rank order (the set-up exchange of copy-engine windows). Every
/// rank calls it with the same `key`, once per key.
pub fn all_gather(
    store: &TcpStore,
    rank: usize,
    world: usize,
    key: &str,
    value: &[u8],
) -> Result<Vec<Vec<u8>>, CommError> {
    check_member("all-gather", key, rank, world)?;
    store.set(&format!("{key}/{rank}"), value)?;
    read_all(store, rank, world, key, value)
}

fn check_member(what: &str, key: &str, rank: usize, world: usize) -> Result<(), CommError> {
    if rank >= world {
        return Err(bootstrap(format!(
            "{what} of \"{key}\": rank {rank} is outside a world of {world} ranks"
        )));
    }
    Ok(())
}

/// Every rank's value under `key/<r>` in rank order, `value` in `rank`'s place, all within
/// the store's timeout.
fn read_all(
    store: &TcpStore,
    rank: usize,
    world: usize,
    key: &str,
    value: &[u8],
) -> Result<Vec<Vec<u8>>, CommError> {
    let start = Instant::now();
    let mut values = Vec::with_capacity(world);
    for r in 0..world {
        if r == rank {
            values.push(value.to_vec());
            continue;
        }
        let remaining = store.timeout().saturating_sub(start.elapsed());
        values.push(store.get_timeout(&format!("{key}/{r}"), remaining)?);
    }
    Ok(values)
}
