//! What the commands print and the files they leave: standard output that ends the process
//! quietly when its reader has gone (`weave run … | head -1`), as other Unix tools do, and
//! files written whole or not at all (a temporary file in the same directory, renamed over
//! the target, and removed when a signal ends the process), so that an interrupted run never
//! leaves half a file or a stale one that looks current — while links, devices and FIFOs
//! given as outputs are written through, never replaced.

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, Once, PoisonError};

use streamweave::output::{is_stream, kind, OutputError};

/// Prints to standard output, as `print!` does, through [`Stdout`].
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::print(format_args!($($arg)*))
    };
}

/// Prints a line to standard output, as `println!` does, through [`Stdout`].
#[macro_export]
macro_rules! outln {
    () => {
        $crate::output::print(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::print(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Writes `args` to standard output (see [`Stdout`]).
pub fn print(args: fmt::Arguments<'_>) {
    let _ = Stdout.write_fmt(args);
}

/// Standard output whose reader may go away: a closed pipe ends the process as the pipe's
/// signal does (SIGPIPE: the shell reports status 141, and prints nothing), instead of the
/// panic of `println!` (Rust ignores SIGPIPE, so the write fails with `BrokenPipe`). Any other
/// write error is reported on stderr and ends the process with status 1.
pub struct Stdout;

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut out = io::stdout().lock();
        out.write_all(buf)
            .and_then(|()| out.flush())
            .map_err(gone)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stdout().flush().map_err(gone)
    }
}

/// Ends the process on a write error of standard output (see [`Stdout`]).
fn gone(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::BrokenPipe {
        #[cfg(unix)]
        {
            let _ = signal_hook::low_level::emulate_default_handler(signal_hook::consts::SIGPIPE);
        }
        std::process::exit(141);
    }
    eprintln!("error: cannot write to standard output: {e}");
    std::process::exit(1);
}

/// Writes `contents` to the output file `path` (`--json`, `--trace`, the calibration) without
/// replacing what the user did not ask to replace:
///
/// * a regular file, or no file, is written atomically: into a temporary file beside it, then
///   renamed over it, so that readers see the old file or the whole new one, never a part;
/// * a symbolic link is written through: its final target is written atomically in the
///   target's directory, and the link stays;
/// * `/dev/stdout` and `/dev/stderr` write to this process's standard output and error;
///   another character device or a FIFO (`/dev/null`, a named pipe) is opened and written
///   directly;
/// * anything else (a directory, a socket, a block device) is refused.
///
/// New files get the usual permissions (0666 less the umask). A temporary file is removed
/// when SIGINT, SIGTERM or SIGHUP ends the process mid-write (see [`remove_temporaries`]).
/// The error names `path`.
pub fn write_output(path: &Path, contents: &[u8]) -> Result<(), OutputError> {
    let named = |source: io::Error| OutputError::Write {
        path: path.to_path_buf(),
        source,
    };
    let stream = path.to_str().and_then(|p| match p {
        "/dev/stdout" | "/dev/fd/1" | "/proc/self/fd/1" => Some(1),
        "/dev/stderr" | "/dev/fd/2" | "/proc/self/fd/2" => Some(2),
        _ => None,
    });
    match stream {
        Some(1) => return Stdout.write_all(contents).map_err(named),
        Some(_) => {
            let mut err = io::stderr().lock();
            return err
                .write_all(contents)
                .and_then(|()| err.flush())
                .map_err(named);
        }
        None => {}
    }
    clean_up_on_signals();
    streamweave::output::write_output(path, contents, false)
}

/// Starts the signal thread once, before the first temporary file exists.
static HANDLER: Once = Once::new();

/// The hidden variable that makes every atomic write hold its written temporary file this
/// many milliseconds before renaming it ([`streamweave::output::hold_temporaries`]): a window
/// for the tests that interrupt a write with a signal.
pub const HOLD_WRITES_ENV: &str = "WEAVE_TEST_HOLD_WRITES_MS";

/// Makes SIGINT, SIGTERM and SIGHUP remove the temporary files of this process's atomic
/// writes, and the outputs [`remove_on_signal`] lists, before they end the process (once per
/// process; [`write_output`] calls it). Whatever else writes through the library's writer
/// (the tuning cache, [`streamweave::tune::store`]) calls it first: the library installs no
/// signal handler of its own.
pub fn clean_up_on_signals() {
    HANDLER.call_once(|| {
        remove_temporaries_on_signals();
        if let Some(ms) = std::env::var(HOLD_WRITES_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            streamweave::output::hold_temporaries(std::time::Duration::from_millis(ms));
        }
    });
}

/// Outputs of this run that a signal must take away with it: a trace whose SVG timeline is
/// not written yet (a run's outputs appear together or not at all).
static INCOMPLETE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn incomplete() -> MutexGuard<'static, Vec<PathBuf>> {
    INCOMPLETE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Lists `path`, an output this run is about to write or has written, for removal should a
/// signal end the process before [`keep_on_signal`] takes it off the list. Only a regular
/// file or a path with nothing there yet is listed: a link, a device or a FIFO given as the
/// output is the user's, never removed.
pub fn remove_on_signal(path: &Path) {
    let ours = match std::fs::symlink_metadata(path) {
        Ok(m) => m.is_file(),
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    };
    if ours {
        incomplete().push(path.to_path_buf());
    }
}

/// Takes `path` off the list of [`remove_on_signal`]: the output is complete.
pub fn keep_on_signal(path: &Path) {
    incomplete().retain(|p| p != path);
}

/// Readies the output file `path` before a run: a regular file left by an earlier run is
/// removed (so that a run that ends early never leaves an older output that looks like its
/// own); a link, a FIFO or a device is left alone; a path [`write_output`] would refuse (a
/// directory, a socket, a block device) is an error now rather than after the run.
pub fn remove_stale(path: &Path) -> Result<(), StaleOutputError> {
    let named = |source: io::Error| StaleOutputError::Remove {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(named(e)),
        Ok(m) if m.is_file() => match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(named(e)),
            _ => Ok(()),
        },
        Ok(m) if m.file_type().is_symlink() || is_stream(&m.file_type()) => Ok(()),
        Ok(m) => Err(StaleOutputError::Refused(OutputError::NotAFile {
            path: path.to_path_buf(),
            kind: kind(&m.file_type()),
        })),
    }
}

/// Why [`remove_stale`] did not ready an output: every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum StaleOutputError {
    /// The earlier run's file is there and does not go.
    #[error("cannot remove the earlier {}: {source}", path.display())]
    Remove {
        /// The output as given.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// The path is one [`write_output`] would refuse (a directory, a socket, a block device).
    #[error(transparent)]
    Refused(#[from] OutputError),
}

/// Removes every temporary file being written now, and the incomplete outputs
/// [`remove_on_signal`] lists; the signal thread calls it before the process ends.
pub fn remove_temporaries() {
    streamweave::output::remove_temporaries();
    for p in incomplete().drain(..) {
        let _ = std::fs::remove_file(p);
    }
}

/// Starts the thread that, on SIGINT, SIGTERM or SIGHUP, removes the temporary files and ends
/// the process as the signal would (status 128 + the signal where it cannot).
fn remove_temporaries_on_signals() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("weave-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                streamweave::output::close_temporaries();
                remove_temporaries();
                let _ = signal_hook::low_level::emulate_default_handler(sig);
                std::process::exit(128 + sig);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Mutex, PoisonError};

    /// Held by the tests that write files: [`remove_temporaries`] removes every test's.
    static WRITES: Mutex<()> = Mutex::new(());

    #[test]
    fn the_commands_write_a_file_whole_and_leave_no_temporary() {
        let _one = WRITES.lock().unwrap_or_else(PoisonError::into_inner);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("summary.json");
        write_output(&path, b"old").unwrap();
        write_output(&path, b"new contents").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new contents");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
        let missing = dir.path().join("no-such-dir/summary.json");
        let e = write_output(&missing, b"x").unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("cannot write {}: ", missing.display())),
            "{e}"
        );
    }

    #[test]
    fn the_signal_cleanup_removes_the_temporaries_being_written() {
        let _one = WRITES.lock().unwrap_or_else(PoisonError::into_inner);
        let dir = tempfile::tempdir().unwrap();
        let (tmp, file) = streamweave::output::create_temporary(dir.path()).unwrap();
        assert!(tmp.exists());
        let name = tmp.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(".weave-") && name.ends_with(".tmp"),
            "{name}"
        );
        remove_temporaries();
        drop(file);
        assert!(!tmp.exists());
        // Renamed files are no longer temporaries: nothing else is removed.
        write_output(&dir.path().join("kept"), b"x").unwrap();
        remove_temporaries();
        assert_eq!(std::fs::read(dir.path().join("kept")).unwrap(), b"x");
    }
}
