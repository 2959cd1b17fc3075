//! [`TcpStore`]: the key-value store of a run, served by rank 0 on background threads and
//! reached over TCP by the other ranks.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use super::bootstrap;
use super::wire::{
    invalid, put_bytes32, put_bytes64, read_bytes, read_bytes64, read_u32, read_u64, read_u8,
    OP_GET, OP_SET, STATUS_CLOSED, STATUS_MISSING, STATUS_OK,
};
use crate::error::CommError;

pub use super::wire::{MAX_KEY_BYTES, MAX_VALUE_BYTES};

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
    /// through [`STORE_FD`](super::STORE_FD)), for a run of `world` ranks, as
    /// [`TcpStore::serve`] does; [`TcpStore::local_addr`] is the address it is bound to.
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
