//! What the commands print and the files they leave: standard output that ends the process
//! quietly when its reader has gone (`weave run … | head -1`), as other Unix tools do, and
//! files written whole or not at all (a temporary file in the same directory, renamed over
//! the target), so that an interrupted run never leaves half a file or a stale one that looks
//! current.

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

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

/// Writes `contents` to `path` atomically: into a temporary file beside it, then renamed over
/// it, so that readers see the old file or the whole new one, never a part. The error names
/// `path`.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), String> {
    let named = |e: io::Error| format!("cannot write {}: {e}", path.display());
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".weave-")
        .suffix(".tmp")
        .tempfile_in(&dir)
        .map_err(named)?;
    tmp.write_all(contents)
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(named)?;
    tmp.persist(path).map_err(|e| named(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_atomic_write_replaces_the_file_whole_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("summary.json");
        write_atomic(&path, b"old").unwrap();
        write_atomic(&path, b"new contents").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new contents");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
        let missing = dir.path().join("no-such-dir/summary.json");
        let e = write_atomic(&missing, b"x").unwrap_err();
        assert!(
            e.starts_with(&format!("cannot write {}: ", missing.display())),
            "{e}"
        );
    }
}
