//! `weave launch`: start N processes of one command with the torchrun environment, forward
//! their output prefixed with the rank, and stop them all when one fails or time runs out.
//!
//! Every child gets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT` and `GROUP_RANK=0` on top of the launcher's own environment (so `NCCL_*`
//! and `CUDA_*` variables pass through untouched). Unless `--master-port` names the port, the
//! launcher binds port 0 on `MASTER_ADDR`, publishes the port the system gave as
//! `MASTER_PORT` and hands the listening socket itself to rank 0 (an inherited descriptor
//! named by `WEAVE_STORE_FD`), whose store serves on it: the port is bound from the moment it
//! is chosen, so two launches at once, or any other program, cannot take it in between.
//!
//! Every rank leads a process group of its own (`process-wrap`), and the launcher stops a
//! rank by killing its whole group, so whatever the rank started goes with it, even a process
//! that ignores SIGTERM. When a child fails, the others get a grace period and are then
//! killed; the whole run is bounded by a timeout; a SIGINT, SIGTERM or SIGHUP to the launcher
//! (a Ctrl-C at the terminal, a `timeout(1)` around it) kills every group at once. When a rank
//! ends, what it left running in its group is killed too, and every error path kills what was
//! started before returning: no process of a rank outlives the launch.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use process_wrap::std::{ChildWrapper, CommandWrap, ProcessGroup};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// The default `--timeout-secs` of `weave launch`: the bound on the whole run.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The default grace period the surviving ranks get after one rank fails.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// The default `MASTER_ADDR`.
pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";

/// How often the launcher polls its children.
const POLL: Duration = Duration::from_millis(10);

/// How long the launcher waits, once every child has exited, for the output they left in
/// their pipes (a process that escaped the kill may keep a pipe open; it is not waited for).
const DRAIN: Duration = Duration::from_secs(2);

/// What to launch, and how.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// How many processes (ranks) to start; at least 1.
    pub nprocs: usize,
    /// The command and its arguments. A bare `weave` runs the launcher's own executable;
    /// a name containing `/` is a path (relative to the working directory) spawned as is;
    /// any other bare name is looked up in `PATH`.
    pub command: Vec<OsString>,
    /// The bound on the whole run; on expiry every child still running is killed.
    pub timeout: Duration,
    /// How long the surviving ranks may keep running after the first failure.
    pub grace: Duration,
    /// `MASTER_ADDR` given to every child.
    pub master_addr: String,
    /// `MASTER_PORT` given to every child; `None`: the launcher binds port 0 on
    /// `master_addr` and hands the bound socket to rank 0's store (see the module docs).
    pub master_port: Option<u16>,
}

impl LaunchOptions {
    /// Options for `nprocs` ranks of `command` with the default timeout, grace period,
    /// address and port.
    pub fn new(nprocs: usize, command: Vec<OsString>) -> Self {
        LaunchOptions {
            nprocs,
            command,
            timeout: DEFAULT_TIMEOUT,
            grace: DEFAULT_GRACE,
            master_addr: DEFAULT_MASTER_ADDR.to_string(),
            master_port: None,
        }
    }
}

/// How one rank ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankOutcome {
    /// It exited with status 0.
    Succeeded,
    /// It exited with this non-zero status.
    Exited(i32),
    /// A signal it did not survive ended it (not one the launcher sent).
    Signaled(i32),
    /// The launcher killed it when the grace period that followed `failed_rank`'s failure
    /// ran out.
    KilledAfterGrace {
        /// The rank whose failure started the grace period.
        failed_rank: usize,
        /// The grace period.
        grace: Duration,
    },
    /// The launcher killed it when the run's timeout expired.
    TimedOut {
        /// The timeout.
        after: Duration,
    },
    /// The launcher killed it when it got this signal itself (SIGINT, SIGTERM or SIGHUP).
    Interrupted {
        /// The signal the launcher got.
        signal: i32,
    },
}

impl RankOutcome {
    /// Whether the rank succeeded.
    pub fn succeeded(self) -> bool {
        self == RankOutcome::Succeeded
    }
}

/// One rank's outcome and when it ended.
#[derive(Debug, Clone)]
pub struct RankReport {
    /// The rank.
    pub rank: usize,
    /// How it ended.
    pub outcome: RankOutcome,
    /// When it ended, from the start of the launch.
    pub elapsed: Duration,
}

impl fmt::Display for RankReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rank = self.rank;
        match self.outcome {
            RankOutcome::Succeeded => write!(f, "rank {rank} succeeded"),
            RankOutcome::Exited(code) => write!(f, "rank {rank} exited with status {code}"),
            RankOutcome::Signaled(sig) => {
                write!(f, "rank {rank} was killed by signal {sig}")?;
                match signal_name(sig) {
                    Some(name) => write!(f, " ({name})"),
                    None => Ok(()),
                }
            }
            RankOutcome::KilledAfterGrace { failed_rank, grace } => write!(
                f,
                "rank {rank} killed after the {} grace period that followed rank {failed_rank}'s failure",
                secs(grace)
            ),
            RankOutcome::TimedOut { after } => {
                write!(f, "rank {rank} timed out after {}", secs(after))
            }
            RankOutcome::Interrupted { signal } => {
                write!(f, "rank {rank} killed when the launcher got signal {signal}")?;
                match signal_name(signal) {
                    Some(name) => write!(f, " ({name})"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// The result of a launch: every rank's outcome, in rank order.
#[derive(Debug, Clone)]
pub struct LaunchReport {
    /// One entry per rank, rank 0 first.
    pub ranks: Vec<RankReport>,
    /// The `MASTER_ADDR` the children got.
    pub master_addr: String,
    /// The `MASTER_PORT` the children got.
    pub master_port: u16,
    /// How long the launch took.
    pub wall: Duration,
}

impl LaunchReport {
    /// Whether every rank succeeded.
    pub fn succeeded(&self) -> bool {
        self.ranks.iter().all(|r| r.outcome.succeeded())
    }

    /// The ranks that did not succeed.
    pub fn failures(&self) -> impl Iterator<Item = &RankReport> {
        self.ranks.iter().filter(|r| !r.outcome.succeeded())
    }

    /// Whether the run's timeout expired.
    pub fn timed_out(&self) -> bool {
        self.ranks
            .iter()
            .any(|r| matches!(r.outcome, RankOutcome::TimedOut { .. }))
    }

    /// The signal that stopped the launch, if one did.
    pub fn interrupted(&self) -> Option<i32> {
        self.ranks.iter().find_map(|r| match r.outcome {
            RankOutcome::Interrupted { signal } => Some(signal),
            _ => None,
        })
    }
}

/// Why a launch failed.
#[derive(Debug)]
pub enum LaunchError {
    /// `nprocs` was 0.
    NoRanks,
    /// No command was given.
    EmptyCommand,
    /// The timeout was zero.
    ZeroTimeout,
    /// The command does not name an executable file.
    CommandNotFound {
        /// The command as given.
        command: OsString,
        /// What is wrong with it.
        reason: String,
    },
    /// No port could be bound on `MASTER_ADDR` for `MASTER_PORT`.
    Port {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The pipe that tells the ranks' watchers the launcher is alive could not be made.
    Pipe(std::io::Error),
    /// A rank could not be started; the ranks started before it were killed.
    Spawn {
        /// The rank that could not be started.
        rank: usize,
        /// The program.
        program: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The children ran, and at least one of them failed (or the run timed out).
    Failed(LaunchReport),
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LaunchError::NoRanks => {
                f.write_str("the number of processes (-n) must be at least 1, got 0")
            }
            LaunchError::EmptyCommand => {
                f.write_str("no command to launch; give it after `--`, e.g. `weave launch -n 2 -- weave run FILE`")
            }
            LaunchError::ZeroTimeout => f.write_str("the timeout must be at least 1 s"),
            LaunchError::CommandNotFound { command, reason } => {
                write!(f, "cannot launch `{}`: {reason}", command.to_string_lossy())
            }
            LaunchError::Port { addr, source } => {
                write!(f, "cannot bind a port for MASTER_PORT on {addr}: {source}")
            }
            LaunchError::Pipe(e) => write!(f, "cannot make the launcher's pipe: {e}"),
            LaunchError::Spawn {
                rank,
                program,
                source,
            } => write!(
                f,
                "cannot start rank {rank} (`{}`): {source}; the ranks already started were killed",
                program.display()
            ),
            LaunchError::Failed(report) => {
                let failed: Vec<RankReport> = report.failures().cloned().collect();
                if report.timed_out() {
                    let running: Vec<String> = failed
                        .iter()
                        .filter(|r| matches!(r.outcome, RankOutcome::TimedOut { .. }))
                        .map(|r| r.rank.to_string())
                        .collect();
                    writeln!(
                        f,
                        "the launch timed out with rank(s) {} still running",
                        running.join(", ")
                    )?;
                } else {
                    writeln!(
                        f,
                        "{} of {} rank(s) failed",
                        failed.len(),
                        report.ranks.len()
                    )?;
                }
                let lines: Vec<String> = failed.iter().map(ToString::to_string).collect();
                f.write_str(&lines.join("\n"))
            }
        }
    }
}

impl std::error::Error for LaunchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LaunchError::Port { source: e, .. }
            | LaunchError::Pipe(e)
            | LaunchError::Spawn { source: e, .. } => Some(e),
            _ => None,
        }
    }
}

/// Starts `opts.nprocs` processes of `opts.command` with the torchrun environment, forwards
/// their stdout and stderr line by line with a `[rank R] ` prefix to the launcher's stdout
/// and stderr, and waits for them all.
///
/// When a rank fails, the others get `opts.grace` and are then killed; after `opts.timeout`
/// every rank still running is killed. Returns the report when every rank succeeded, and
/// [`LaunchError::Failed`] with the same report otherwise. No child outlives the call.
pub fn launch(opts: &LaunchOptions) -> Result<LaunchReport, LaunchError> {
    if opts.nprocs == 0 {
        return Err(LaunchError::NoRanks);
    }
    if opts.timeout.is_zero() {
        return Err(LaunchError::ZeroTimeout);
    }
    let (program, args) = opts
        .command
        .split_first()
        .ok_or(LaunchError::EmptyCommand)?;
    let program = resolve_program(program)?;
    // The store's socket, bound here and handed to rank 0, unless the port was given.
    let (store, master_port) = match opts.master_port {
        Some(port) => (None, port),
        None => {
            let port_error = |source| LaunchError::Port {
                addr: opts.master_addr.clone(),
                source,
            };
            let listener =
                std::net::TcpListener::bind((opts.master_addr.as_str(), 0)).map_err(port_error)?;
            let port = listener.local_addr().map_err(port_error)?.port();
            (Some(listener), port)
        }
    };

    // Set by SIGINT, SIGTERM or SIGHUP to the signal's number; the ranks, in groups of their
    // own, do not get the terminal's signals themselves.
    let signal = Arc::new(AtomicUsize::new(0));
    let handlers: Vec<signal_hook::SigId> = [SIGINT, SIGTERM, SIGHUP]
        .into_iter()
        .filter_map(|s| signal_hook::flag::register_usize(s, signal.clone(), s as usize).ok())
        .collect();
    let result = launch_ranks(opts, &program, args, master_port, store, &signal);
    for id in handlers {
        signal_hook::low_level::unregister(id);
    }
    result
}

/// Makes the rank, and everything it starts in its process group, die with the launcher: a
/// launcher killed outright (SIGKILL, which it cannot catch to stop its ranks) takes every
/// rank with it through the parent-death signal (Linux), and the rank's group with it through
/// a watcher. A rank whose parent is already gone when it starts exits at once.
///
/// The watcher is a process forked into the rank's group before the rank's program starts
/// (and reparented away from it, so the rank never sees it as a child). It holds only the
/// reading end of `launcher_alive`, a pipe whose writing end only the launcher keeps open
/// (close-on-exec, closed in every watcher), and blocks reading it: when the launcher ends,
/// however it ends, the read returns and the watcher kills the rank's whole group, itself
/// included. While it lives the group's id cannot be reused; the launcher's own killing of
/// the group once the rank ended takes the watcher too.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn die_with_launcher(cmd: &mut Command, launcher_alive: std::os::fd::RawFd) {
    use std::os::unix::process::CommandExt;
    let launcher = std::process::id();
    // SAFETY: between fork and exec the closure calls only async-signal-safe functions and
    // raw system calls (`prctl`, `getppid`, `getpid`, `clone` without the C library's fork
    // handlers, `waitpid`, `dup2`, `close_range`, `close`, `read`, `kill`, `_exit`) and
    // allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher died before the signal was armed.
            if u32::try_from(libc::getppid()).ok() != Some(launcher) {
                libc::_exit(1);
            }
            // The rank leads its group (`ProcessGroup::leader` set it before this runs).
            let group = libc::getpid();
            let fork = || libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0);
            let middle = fork();
            if middle < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if middle == 0 {
                // The middle process forks the watcher and exits, so the watcher is
                // reparented away from the rank.
                if fork() == 0 {
                    watch_launcher(launcher_alive, group);
                }
                libc::_exit(0);
            }
            let mut status = 0;
            while libc::waitpid(middle as libc::pid_t, &mut status, 0) < 0 {
                if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                    break;
                }
            }
            Ok(())
        });
    }
}

/// The watcher of [`die_with_launcher`]: keeps only `launcher_alive` open (as its standard
/// input), waits until the launcher's end of it closes, then kills `group` and exits.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
unsafe fn watch_launcher(launcher_alive: std::os::fd::RawFd, group: libc::pid_t) -> ! {
    // SAFETY: raw system calls on descriptors this process owns; nothing allocates.
    unsafe {
        if libc::dup2(launcher_alive, 0) < 0 {
            libc::kill(-group, libc::SIGKILL);
            libc::_exit(1);
        }
        // Every other descriptor (the rank's output pipes, the pipe's writing end, the
        // spawn's error pipe) is closed, so the watcher holds nothing open for anyone.
        if libc::syscall(libc::SYS_close_range, 1u32, u32::MAX, 0u32) != 0 {
            let max = libc::sysconf(libc::_SC_OPEN_MAX).clamp(1024, 1 << 20);
            for fd in 1..max {
                libc::close(fd as libc::c_int);
            }
        }
        let mut byte = 0u8;
        loop {
            let n = libc::read(0, (&raw mut byte).cast(), 1);
            let interrupted =
                n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR);
            if !interrupted {
                break;
            }
        }
        libc::kill(-group, libc::SIGKILL);
        libc::_exit(0)
    }
}

/// Elsewhere ranks outlive a launcher killed outright (a caught signal still stops them).
#[cfg(not(target_os = "linux"))]
fn die_with_launcher(_cmd: &mut Command, _launcher_alive: std::os::fd::RawFd) {}

/// A pipe (reading end, writing end), both ends closed on exec: the ranks' programs never
/// hold it, only the watchers forked before their exec (written before the workspace needed
/// Rust 1.87, which brought std's `io::pipe`).
#[allow(unsafe_code)]
fn launcher_pipe() -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors `pipe` writes; `fcntl` sets flags on
    // descriptors this function owns (no other thread execs a rank while the launcher starts
    // them, so none can inherit them in between).
    unsafe {
        if libc::pipe(fds.as_mut_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        for fd in fds {
            if libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) != 0 {
                let e = std::io::Error::last_os_error();
                libc::close(fds[0]);
                libc::close(fds[1]);
                return Err(e);
            }
        }
    }
    // SAFETY: both descriptors are new and owned by nothing else.
    Ok(unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}

/// Starts the ranks and supervises them until every one has ended ([`launch`]).
fn launch_ranks(
    opts: &LaunchOptions,
    program: &Path,
    args: &[OsString],
    master_port: u16,
    mut store: Option<std::net::TcpListener>,
    signal: &AtomicUsize,
) -> Result<LaunchReport, LaunchError> {
    let start = Instant::now();
    // The pipe the ranks' watchers read ([`die_with_launcher`]): its writing end stays open
    // here until every rank has ended, and closes when the launcher dies.
    let (launcher_alive, _launcher_alive_writer) = launcher_pipe().map_err(LaunchError::Pipe)?;
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut children: Vec<Running> = Vec::with_capacity(opts.nprocs);
    for rank in 0..opts.nprocs {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", opts.nprocs.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", opts.nprocs.to_string())
            .env("GROUP_RANK", "0")
            .env("MASTER_ADDR", &opts.master_addr)
            .env("MASTER_PORT", master_port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        die_with_launcher(&mut cmd, std::os::fd::AsRawFd::as_raw_fd(&launcher_alive));
        if rank == 0 {
            if let Some(listener) = &store {
                hand_down(&mut cmd, listener);
            }
        }
        let mut cmd = CommandWrap::from(cmd);
        cmd.wrap(ProcessGroup::leader());
        match cmd.spawn() {
            Ok(mut child) => {
                let mut readers = 0;
                if let Some(out) = child.stdout().take() {
                    readers += usize::from(forward(out, rank, Stream::Stdout, done_tx.clone()));
                }
                if let Some(err) = child.stderr().take() {
                    readers += usize::from(forward(err, rank, Stream::Stderr, done_tx.clone()));
                }
                children.push(Running {
                    child,
                    readers,
                    outcome: None,
                });
                // Rank 0 holds the store's socket now; the launcher keeps no copy.
                store = None;
            }
            Err(source) => {
                for running in &mut children {
                    kill_group(running.child.as_mut());
                }
                return Err(LaunchError::Spawn {
                    rank,
                    program: program.to_path_buf(),
                    source,
                });
            }
        }
    }
    drop(done_tx);

    let ranks = supervise(&mut children, opts, start, signal);
    let readers: usize = children.iter().map(|r| r.readers).sum();
    drain(&done_rx, readers);
    let report = LaunchReport {
        ranks,
        master_addr: opts.master_addr.clone(),
        master_port,
        wall: start.elapsed(),
    };
    if report.succeeded() {
        Ok(report)
    } else {
        Err(LaunchError::Failed(report))
    }
}

/// A started rank: its process (the leader of its process group), how many output
/// forwarders it has, and, once it ended, how.
struct Running {
    child: Box<dyn ChildWrapper>,
    readers: usize,
    outcome: Option<RankReport>,
}

/// Polls the children until every one has ended, applying the grace period, the timeout and
/// the launcher's signals; kills each rank's group once the rank has ended.
fn supervise(
    children: &mut [Running],
    opts: &LaunchOptions,
    start: Instant,
    signal: &AtomicUsize,
) -> Vec<RankReport> {
    // The first failure: its rank and when the grace period it starts runs out (`None`: a
    // grace period past the end of time never does).
    let mut first_failure: Option<(usize, Option<Instant>)> = None;
    loop {
        for (rank, running) in children.iter_mut().enumerate() {
            if running.outcome.is_some() {
                continue;
            }
            let status = match running.child.try_wait() {
                Ok(Some(status)) => status,
                Ok(None) => continue,
                // The child cannot be waited for; count it as killed by the launcher.
                Err(_) => {
                    kill_group(running.child.as_mut());
                    ExitStatus::from_raw(9)
                }
            };
            // What the rank left running in its group goes with it.
            let _ = running.child.start_kill();
            let outcome = outcome_of(status);
            if !outcome.succeeded() && first_failure.is_none() {
                first_failure = Some((rank, Instant::now().checked_add(opts.grace)));
            }
            running.outcome = Some(RankReport {
                rank,
                outcome,
                elapsed: start.elapsed(),
            });
        }
        if children.iter().all(|r| r.outcome.is_some()) {
            break;
        }
        let now = Instant::now();
        let got = signal.load(Ordering::SeqCst);
        let kill_with = if got != 0 {
            Some(RankOutcome::Interrupted { signal: got as i32 })
        } else if now.duration_since(start) >= opts.timeout {
            Some(RankOutcome::TimedOut {
                after: opts.timeout,
            })
        } else {
            match first_failure {
                Some((failed_rank, Some(deadline))) if now >= deadline => {
                    Some(RankOutcome::KilledAfterGrace {
                        failed_rank,
                        grace: opts.grace,
                    })
                }
                _ => None,
            }
        };
        if let Some(outcome) = kill_with {
            for (rank, running) in children.iter_mut().enumerate() {
                if running.outcome.is_none() {
                    kill_group(running.child.as_mut());
                    running.outcome = Some(RankReport {
                        rank,
                        outcome,
                        elapsed: start.elapsed(),
                    });
                }
            }
            break;
        }
        thread::sleep(POLL);
    }
    children
        .iter_mut()
        .map(|r| r.outcome.take())
        .collect::<Option<Vec<_>>>()
        .unwrap_or_default()
}

/// How an exit status reads as a rank outcome.
fn outcome_of(status: ExitStatus) -> RankOutcome {
    match (status.code(), status.signal()) {
        (Some(0), _) => RankOutcome::Succeeded,
        (Some(code), _) => RankOutcome::Exited(code),
        (None, Some(sig)) => RankOutcome::Signaled(sig),
        (None, None) => RankOutcome::Exited(-1),
    }
}

/// Waits up to [`DRAIN`] for the output forwarders to reach the end of their pipes.
fn drain(done: &mpsc::Receiver<()>, readers: usize) {
    let deadline = Instant::now() + DRAIN;
    for _ in 0..readers {
        let left = deadline.saturating_duration_since(Instant::now());
        if done.recv_timeout(left).is_err() {
            return;
        }
    }
}

/// Which of the launcher's streams a child's stream is forwarded to.
#[derive(Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

/// Forwards `pipe` line by line to the launcher's `stream`, each line prefixed with
/// `[rank R] `, on its own thread; signals `done` at the end of the pipe. Write errors (a
/// closed stdout) are ignored so the child never blocks on a full pipe. Returns whether the
/// thread started; without it the pipe is closed, which the child sees as a closed output.
fn forward(
    pipe: impl Read + Send + 'static,
    rank: usize,
    stream: Stream,
    done: mpsc::Sender<()>,
) -> bool {
    thread::Builder::new()
        .name(format!("rank-{rank}-output"))
        .spawn(move || {
            let prefix = format!("[rank {rank}] ");
            let mut reader = BufReader::new(pipe);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                let _ = match stream {
                    Stream::Stdout => write_line(&mut std::io::stdout().lock(), &prefix, &line),
                    Stream::Stderr => write_line(&mut std::io::stderr().lock(), &prefix, &line),
                };
            }
            let _ = done.send(());
        })
        .is_ok()
}

/// Writes one prefixed line and flushes it.
fn write_line(out: &mut impl Write, prefix: &str, line: &[u8]) -> std::io::Result<()> {
    out.write_all(prefix.as_bytes())?;
    out.write_all(line)?;
    out.flush()
}

/// Kills a rank's whole process group (SIGKILL: the rank and everything it started that is
/// still in its group), then reaps the rank.
fn kill_group(child: &mut dyn ChildWrapper) {
    let _ = child.start_kill();
    let _ = child.wait();
}

/// Resolves the program to run: a bare `weave` is the running executable, a name with a
/// `/` is a path, any other name is looked up in `PATH`.
fn resolve_program(program: &OsStr) -> Result<PathBuf, LaunchError> {
    let not_found = |reason: String| LaunchError::CommandNotFound {
        command: program.to_os_string(),
        reason,
    };
    if program.is_empty() {
        return Err(not_found("the command is empty".to_string()));
    }
    let path = Path::new(program);
    if program.as_encoded_bytes().contains(&b'/') {
        return match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => Err(not_found("it is a directory".to_string())),
            Ok(meta) if meta.permissions().mode() & 0o111 == 0 => {
                Err(not_found("it is not executable".to_string()))
            }
            Ok(_) => Ok(path.to_path_buf()),
            Err(e) => Err(not_found(e.to_string())),
        };
    }
    if program == "weave" {
        if let Ok(me) = std::env::current_exe() {
            return Ok(me);
        }
    }
    which::which(path).map_err(|_| not_found("no such command in PATH".to_string()))
}

/// Hands the store's listening socket to the rank `cmd` starts: the descriptor, close-on-exec
/// in the launcher (so no other rank inherits it), stays open across this rank's exec, and
/// `WEAVE_STORE_FD` names it ([`weave_comm::bootstrap::STORE_FD`]).
#[allow(unsafe_code)]
fn hand_down(cmd: &mut Command, listener: &std::net::TcpListener) {
    use std::os::unix::process::CommandExt;
    let fd = std::os::fd::AsRawFd::as_raw_fd(listener);
    cmd.env(weave_comm::bootstrap::STORE_FD, fd.to_string());
    // SAFETY: between fork and exec the closure calls only `fcntl`, which is
    // async-signal-safe, on a descriptor the launcher keeps open until the spawn returns; it
    // changes the child's copy of the descriptor's flags only.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A duration in seconds as `5 s` or `0.5 s`.
fn secs(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} s", d.as_secs_f64())
    }
}

/// The name of signal `sig` (`SIGSEGV`), as the platform's C library numbers them.
fn signal_name(sig: i32) -> Option<&'static str> {
    nix::sys::signal::Signal::try_from(sig)
        .ok()
        .map(|s| s.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal;

    #[test]
    fn outcomes_read_as_one_line_each() {
        let line = |outcome| {
            RankReport {
                rank: 0,
                outcome,
                elapsed: Duration::ZERO,
            }
            .to_string()
        };
        assert_eq!(line(RankOutcome::Exited(3)), "rank 0 exited with status 3");
        assert_eq!(
            line(RankOutcome::Signaled(Signal::SIGSEGV as i32)),
            format!(
                "rank 0 was killed by signal {} (SIGSEGV)",
                Signal::SIGSEGV as i32
            )
        );
        assert_eq!(
            line(RankOutcome::Signaled(Signal::SIGUSR1 as i32)),
            format!(
                "rank 0 was killed by signal {} (SIGUSR1)",
                Signal::SIGUSR1 as i32
            )
        );
        assert_eq!(
            line(RankOutcome::Signaled(1000)),
            "rank 0 was killed by signal 1000"
        );
        assert_eq!(
            line(RankOutcome::KilledAfterGrace {
                failed_rank: 1,
                grace: DEFAULT_GRACE
            }),
            "rank 0 killed after the 5 s grace period that followed rank 1's failure"
        );
        assert_eq!(
            line(RankOutcome::TimedOut {
                after: DEFAULT_TIMEOUT
            }),
            "rank 0 timed out after 600 s"
        );
    }

    #[test]
    fn bad_requests_fail_before_anything_starts() {
        let sh = vec![
            OsString::from("sh"),
            OsString::from("-c"),
            OsString::from("true"),
        ];
        assert!(matches!(
            launch(&LaunchOptions::new(0, sh.clone())),
            Err(LaunchError::NoRanks)
        ));
        assert!(matches!(
            launch(&LaunchOptions::new(1, Vec::new())),
            Err(LaunchError::EmptyCommand)
        ));
        let missing = vec![OsString::from("no-such-command-for-weave-launch")];
        assert!(matches!(
            launch(&LaunchOptions::new(1, missing)),
            Err(LaunchError::CommandNotFound { .. })
        ));
        let mut zero = LaunchOptions::new(1, sh);
        zero.timeout = Duration::ZERO;
        assert!(matches!(launch(&zero), Err(LaunchError::ZeroTimeout)));
    }

    #[test]
    fn every_rank_reports_its_own_status_in_rank_order() {
        let cmd = ["sh", "-c", "exit $RANK"].map(OsString::from).to_vec();
        let Err(LaunchError::Failed(report)) = launch(&LaunchOptions::new(3, cmd)) else {
            panic!("ranks 1 and 2 exit non-zero");
        };
        let outcomes: Vec<RankOutcome> = report.ranks.iter().map(|r| r.outcome).collect();
        assert_eq!(outcomes[0], RankOutcome::Succeeded);
        assert!(report.master_port > 0);
        for (rank, outcome) in outcomes.iter().enumerate().skip(1) {
            // Each exits with its own status unless the grace period of an earlier failure
            // ran out first (it cannot within 5 s here).
            assert_eq!(*outcome, RankOutcome::Exited(rank as i32));
        }
    }
}
