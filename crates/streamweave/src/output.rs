//! Files written whole or not at all: the one atomic writer of the library and of the `weave`
//! command (its `--json`, `--trace` and calibration files, and the tuning cache).
//!
//! A regular file (or none) is written into a temporary file beside it and renamed over it, so
//! a reader sees the old file or the whole new one; links, devices and FIFOs given as outputs
//! are written through, never replaced. The temporary files being written are listed, so that
//! a program that handles signals (the `weave` command does) removes them with
//! [`remove_temporaries`] before it dies; this library installs no signal handler itself.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Writes `contents` to the output file `path` without replacing what the caller did not ask
/// to replace:
///
/// * a regular file, or no file, is written atomically: into a temporary file beside it, then
///   renamed over it, so that readers see the old file or the whole new one, never a part;
///   the directory is created when missing only if `create_dir` is set;
/// * a symbolic link is written through: its final target is written atomically in the
///   target's directory, and the link stays;
/// * a character device or a FIFO (`/dev/null`, `/dev/stdout`, a named pipe) is opened and
///   written directly;
/// * anything else (a directory, a socket, a block device) is refused.
///
/// New files get the usual permissions (0666 less the umask). The error names `path`.
pub fn write_output(path: &Path, contents: &[u8], create_dir: bool) -> Result<(), OutputError> {
    let named = |source: io::Error| OutputError::Write {
        path: path.to_path_buf(),
        source,
    };
    let atomically = |target: &Path| {
        if create_dir {
            if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
        }
        replace_atomically(target, contents)
    };
    match std::fs::metadata(path) {
        // No file, or a link to none: created at the link's final target.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            atomically(&final_target(path).map_err(named)?).map_err(named)
        }
        Err(e) => Err(named(e)),
        Ok(m) if m.is_file() => {
            let target = std::fs::canonicalize(path).map_err(named)?;
            atomically(&target).map_err(named)
        }
        Ok(m) if is_stream(&m.file_type()) => {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(named)?;
            f.write_all(contents)
                .and_then(|()| f.flush())
                .map_err(named)
        }
        Ok(m) => Err(OutputError::NotAFile {
            path: path.to_path_buf(),
            kind: kind(&m.file_type()),
        }),
    }
}

/// Why an output file was not written ([`write_output`]): every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// Creating, writing or renaming the file (or its temporary) failed.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The output as given.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// The path is something no output replaces: a directory, a socket, a block device.
    #[error("cannot write {}: it is {kind}; give a file", path.display())]
    NotAFile {
        /// The output as given.
        path: PathBuf,
        /// What it is ([`kind`]): `a directory`, `a socket`, ...
        kind: &'static str,
    },
}

/// A character device or a FIFO: written in place.
pub fn is_stream(t: &std::fs::FileType) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        t.is_char_device() || t.is_fifo()
    }
    #[cfg(not(unix))]
    {
        let _ = t;
        false
    }
}

/// What a file type is, for an error message.
pub fn kind(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_socket() {
            return "a socket";
        }
        if t.is_block_device() {
            return "a block device";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// `path` with its symbolic links followed to the last one's target (which need not exist),
/// a relative target taken from the link's directory.
fn final_target(path: &Path) -> io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = std::fs::read_link(&p)?;
                p = match p.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => return Ok(p),
        }
    }
    Err(io::Error::other("too many levels of symbolic links"))
}

/// Writes `path` (a regular file or none) through a temporary file beside it, renamed over it.
fn replace_atomically(path: &Path, contents: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let (tmp, mut file) = create_temporary(dir)?;
    let written = file
        .write_all(contents)
        .and_then(|()| file.sync_all())
        .and_then(|()| {
            let hold = HOLD_MS.load(Ordering::Relaxed);
            if hold > 0 {
                std::thread::sleep(std::time::Duration::from_millis(hold));
            }
            std::fs::rename(&tmp, path)
        });
    drop(file);
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    live().retain(|p| *p != tmp);
    written
}

/// How long [`replace_atomically`] holds a written temporary file before renaming it, in
/// milliseconds (0: not at all); see [`hold_temporaries`].
static HOLD_MS: AtomicU64 = AtomicU64::new(0);

/// Makes every atomic write of this process wait `hold` with its temporary file written and
/// not yet renamed: a window in which a test of a program's signal handling interrupts the
/// write (the `weave` command sets it from `WEAVE_TEST_HOLD_WRITES_MS`) and checks that the
/// program removed the temporary ([`remove_temporaries`]). Not for other uses.
#[doc(hidden)]
pub fn hold_temporaries(hold: std::time::Duration) {
    let ms = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX);
    HOLD_MS.store(ms, Ordering::Relaxed);
}

/// The temporary files being written now.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn live() -> MutexGuard<'static, Vec<PathBuf>> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A new temporary file `.weave-PID-N.tmp` in `dir`, 0666 less the umask, listed for
/// [`remove_temporaries`] while the list is locked, so that a signal handler that calls it
/// removes the file whenever the process is stopped after it exists.
pub fn create_temporary(dir: &Path) -> io::Result<(PathBuf, std::fs::File)> {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let mut live = live();
    if CLOSED.load(Ordering::Acquire) {
        // A signal's clean-up has run: a file made now would outlive the process.
        return Err(io::Error::new(
            io::ErrorKind::Interrupted,
            "the process is ending on a signal",
        ));
    }
    loop {
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".weave-{}-{n}.tmp", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => {
                live.push(tmp.clone());
                return Ok((tmp, f));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1 << 20 => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Removes every temporary file being written now.
pub fn remove_temporaries() {
    for p in live().drain(..) {
        let _ = std::fs::remove_file(p);
    }
}

/// Removes every temporary file being written now and makes no more: for a signal handler
/// to call before the process ends. Closed while the list is locked, so a write that has
/// not made its temporary yet makes none (`create_temporary` refuses) and one that has is
/// removed here: nothing is left whenever the signal lands.
pub fn close_temporaries() {
    let mut live = live();
    CLOSED.store(true, Ordering::Release);
    for p in live.drain(..) {
        let _ = std::fs::remove_file(p);
    }
}

/// Set by [`close_temporaries`]: the process is ending, and makes no more temporaries.
static CLOSED: AtomicBool = AtomicBool::new(false);

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by the tests that write files: [`remove_temporaries`] removes every test's.
    static WRITES: Mutex<()> = Mutex::new(());

    #[test]
    fn an_atomic_write_replaces_the_file_whole_and_leaves_no_temporary() {
        let _one = WRITES.lock().unwrap_or_else(PoisonError::into_inner);
        let dir = std::env::temp_dir().join(format!("weave-output-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sub/summary.json");
        let e = write_output(&path, b"x", false).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("cannot write {}: ", path.display())),
            "{e}"
        );
        write_output(&path, b"old", true).unwrap();
        write_output(&path, b"new contents", false).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new contents");
        let names: Vec<_> = std::fs::read_dir(dir.join("sub")).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
        let e = write_output(&dir, b"x", true).unwrap_err();
        assert!(matches!(e, OutputError::NotAFile { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.ends_with("it is a directory; give a file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_listed_temporaries_are_removed_and_written_files_are_not() {
        let _one = WRITES.lock().unwrap_or_else(PoisonError::into_inner);
        let dir = std::env::temp_dir().join(format!("weave-temps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (tmp, file) = create_temporary(&dir).unwrap();
        assert!(tmp.exists());
        remove_temporaries();
        drop(file);
        assert!(!tmp.exists());
        write_output(&dir.join("kept"), b"x", false).unwrap();
        remove_temporaries();
        assert_eq!(std::fs::read(dir.join("kept")).unwrap(), b"x");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
