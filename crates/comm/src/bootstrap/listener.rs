//! The store's listening socket a launcher hands down ([`STORE_FD`]): adopting the inherited
//! descriptor once and lending a clone of it to every store served on it.

use std::io;
use std::net::TcpListener;
use std::sync::Mutex;

use super::{bootstrap, STORE_FD};
use crate::error::CommError;

/// The listening sockets this process inherited ([`STORE_FD`]), each adopted once by its
/// descriptor number and lent to every store served on it as a clone.
static INHERITED: Mutex<Vec<(i32, TcpListener)>> = Mutex::new(Vec::new());

/// A clone of the inherited listening socket `fd`, which must listen at `port`: adopted the
/// first time (as a close-on-exec copy, so that the programs this process starts do not hold
/// the port), cloned every time, so that one process may serve several stores on it one
/// after another.
pub(super) fn inherited_listener(fd: i32, port: u16) -> Result<TcpListener, CommError> {
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
