//! Sizes checked before anything is allocated: the element count of a shape (checked, so a
//! shape whose count overflows never wraps) and the bytes it asks for against the host memory
//! this machine has, so that a huge tensor is an error naming it rather than an abort.

/// Why a host buffer cannot be had: [`check_fits`], [`check_host`] and [`allocate_host`].
/// `what` names the buffer (e.g. "input `x` f32[4, 8]").
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// The element count of the buffer's sizes overflows.
    #[error("{what}: the element count of sizes {sizes:?} overflows")]
    Overflow {
        /// The buffer.
        what: String,
        /// Its sizes.
        sizes: Vec<usize>,
    },
    /// The buffer needs more bytes than one `Vec` can hold.
    #[error("{what} needs {bytes} bytes ({}), more than one buffer can hold", human(*.bytes))]
    TooLarge {
        /// The buffer.
        what: String,
        /// The bytes it needs.
        bytes: u64,
    },
    /// The buffer needs more host memory than is available.
    #[error(
        "{what} needs {bytes} bytes ({}) of host memory, but only {available} bytes ({}) are available",
        human(*.bytes),
        human(*.available)
    )]
    Unavailable {
        /// The buffer.
        what: String,
        /// The bytes it needs.
        bytes: u64,
        /// The bytes available.
        available: u64,
    },
    /// The allocation itself failed.
    #[error(
        "{what} needs {bytes} bytes ({}) of host memory, and they could not be allocated",
        human(*.bytes)
    )]
    AllocationFailed {
        /// The buffer.
        what: String,
        /// The bytes it needs.
        bytes: u64,
    },
}

/// Requests below this many bytes are not checked against the machine's memory (reading it
/// costs a file read; small buffers cannot exhaust it on their own).
pub const CHECK_ABOVE_BYTES: u64 = 64 << 20;

/// The element count of `sizes`, `None` when it overflows `usize`.
pub fn numel(sizes: &[usize]) -> Option<usize> {
    sizes.iter().try_fold(1usize, |acc, s| acc.checked_mul(*s))
}

/// The bytes `sizes` take at `elem_bytes` per element, `None` when the count overflows.
pub fn bytes_of(sizes: &[usize], elem_bytes: usize) -> Option<u64> {
    let n = u64::try_from(numel(sizes)?).ok()?;
    n.checked_mul(u64::try_from(elem_bytes).ok()?)
}

/// The host memory available to new allocations, in bytes, on Linux: the least of
/// `MemAvailable` (`/proc/meminfo`), what the process's cgroup still allows
/// (`memory.max` − `memory.current`) and what its address-space limit still allows (`ulimit
/// -v` − `VmSize`); `None` where none of them says.
pub fn available_host_bytes() -> Option<u64> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let meminfo = read("/proc/meminfo").and_then(|t| parse_meminfo(&t));
    let cgroup = (|| {
        let max: u64 = read("/sys/fs/cgroup/memory.max")?.trim().parse().ok()?;
        let current: u64 = read("/sys/fs/cgroup/memory.current")?.trim().parse().ok()?;
        Some(max.saturating_sub(current))
    })();
    let address_space = (|| {
        let limit = parse_address_space_limit(&read("/proc/self/limits")?)?;
        let used = parse_status_kb(&read("/proc/self/status")?, "VmSize:")?;
        Some(limit.saturating_sub(used))
    })();
    [meminfo, cgroup, address_space].into_iter().flatten().min()
}

/// The soft limit of `Max address space` in `/proc/self/limits`; `None` when unlimited.
fn parse_address_space_limit(limits: &str) -> Option<u64> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    line.trim_start_matches("Max address space")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A `kB` field of `/proc/self/status`, in bytes.
fn parse_status_kb(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line.split_whitespace().skip(1);
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => value.checked_mul(1024),
        Some(_) => None,
    }
}

/// Checks that `bytes` more bytes (for `what`, e.g. "input `x` f32[4, 8]") fit in the host
/// memory `available` (as [`available_host_bytes`] gives it); `None` available is not checked.
pub fn check_fits(what: &str, bytes: u64, available: Option<u64>) -> Result<(), MemoryError> {
    match available {
        Some(have) if bytes > have => Err(MemoryError::Unavailable {
            what: what.to_string(),
            bytes,
            available: have,
        }),
        _ => Ok(()),
    }
}

/// Checks a host buffer of `sizes` at `elem_bytes` per element before it is allocated: its
/// element count must not overflow, and a large one must fit in the host memory available.
pub fn check_host(what: &str, sizes: &[usize], elem_bytes: usize) -> Result<(), MemoryError> {
    let bytes = bytes_of(sizes, elem_bytes).ok_or_else(|| overflow_error(what, sizes))?;
    // A `Vec` holds at most `isize::MAX` bytes.
    if usize::try_from(bytes).map_or(true, |b| b > isize::MAX as usize) {
        return Err(MemoryError::TooLarge {
            what: what.to_string(),
            bytes,
        });
    }
    if bytes < CHECK_ABOVE_BYTES {
        return Ok(());
    }
    check_fits(what, bytes, available_host_bytes())
}

/// Large host allocations of this process, one at a time: each is checked against the memory
/// the process has left and made (every page written) before the next is checked. This is
/// the second line: a CPU run first reserves what all the ranks of its process hold at their
/// peak, once, before any allocates (`streamweave::run::reserve_host_memory`), so that ranks
/// that each pass their own checks do not fail later, half-way; these checks catch what that
/// estimate misses.
static LARGE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Makes a host buffer of `sizes` at `elem_bytes` per element with `alloc` (which returns
/// `None` when the memory cannot be had), checked first like [`check_host`]; a large one is
/// checked and made while holding the process's lock on large allocations (see above). The
/// error names `what` and the bytes: an allocation failure is never an abort.
pub fn allocate_host<T>(
    what: &str,
    sizes: &[usize],
    elem_bytes: usize,
    alloc: impl FnOnce() -> Option<T>,
) -> Result<T, MemoryError> {
    let bytes = bytes_of(sizes, elem_bytes).ok_or_else(|| overflow_error(what, sizes))?;
    let failed = || MemoryError::AllocationFailed {
        what: what.to_string(),
        bytes,
    };
    if bytes < CHECK_ABOVE_BYTES {
        return alloc().ok_or_else(failed);
    }
    let _one_at_a_time = LARGE.lock().unwrap_or_else(|e| e.into_inner());
    check_host(what, sizes, elem_bytes)?;
    alloc().ok_or_else(failed)
}

/// `len` zeros, `None` when the memory cannot be had (every page written).
pub fn try_zeros(len: usize) -> Option<Vec<f64>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).ok()?;
    v.resize(len, 0.0);
    Some(v)
}

/// The message of a shape whose element count overflows.
pub fn overflow(what: &str, sizes: &[usize]) -> String {
    overflow_error(what, sizes).to_string()
}

/// The error of a shape whose element count overflows.
fn overflow_error(what: &str, sizes: &[usize]) -> MemoryError {
    MemoryError::Overflow {
        what: what.to_string(),
        sizes: sizes.to_vec(),
    }
}

/// `bytes` in binary units, one decimal.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_overflow_instead_of_wrapping() {
        assert_eq!(numel(&[1 << 32, 1 << 32]), None);
        assert_eq!(numel(&[]), Some(1));
        assert_eq!(bytes_of(&[1 << 31, 1 << 31], 8), None);
        assert_eq!(bytes_of(&[3, 4], 2), Some(24));
        assert_eq!(
            check_host("input `x`", &[1 << 32, 1 << 32], 8)
                .unwrap_err()
                .to_string(),
            "input `x`: the element count of sizes [4294967296, 4294967296] overflows"
        );
    }

    /// An allocation that cannot be had is an error naming the buffer and the bytes, never an
    /// abort; one that can is made.
    #[test]
    fn failed_allocations_are_errors_naming_the_buffer() {
        assert_eq!(
            allocate_host("a result", &[3, 4], 8, || try_zeros(12)).unwrap(),
            vec![0.0; 12]
        );
        assert_eq!(
            allocate_host("a result", &[3, 4], 8, || None::<Vec<f64>>)
                .unwrap_err()
                .to_string(),
            "a result needs 96 bytes (96 B) of host memory, and they could not be allocated"
        );
        // More than the address space: try_reserve refuses instead of aborting.
        assert_eq!(try_zeros(usize::MAX / 4), None);
        assert!(
            allocate_host("a result", &[1 << 20, 1 << 20, 1 << 10], 8, || {
                try_zeros(1 << 50)
            })
            .is_err()
        );
    }

    #[test]
    fn a_request_beyond_the_memory_available_names_both() {
        assert_eq!(
            check_fits("input `x`", 3 << 30, Some(1 << 30))
                .unwrap_err()
                .to_string(),
            "input `x` needs 3221225472 bytes (3.0 GiB) of host memory, but only 1073741824 bytes (1.0 GiB) are available"
        );
        assert!(check_fits("input `x`", 1 << 20, Some(1 << 30)).is_ok());
        assert!(check_fits("input `x`", u64::MAX, None).is_ok());
        // 2^40 rows of 8 f64 values: 64 TiB, more than any test machine has.
        assert!(check_host("input `x`", &[1 << 40, 8], 8)
            .unwrap_err()
            .to_string()
            .contains("bytes (64.0 TiB)"));
        assert!(check_host("input `x`", &[4, 8], 8).is_ok());
    }

    #[test]
    fn limits_and_status_are_read() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max address space         4294967296           unlimited            bytes\n";
        assert_eq!(parse_address_space_limit(limits), Some(4 << 30));
        let unlimited =
            "Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(parse_address_space_limit(unlimited), None);
        let status = "Name:\tweave\nVmPeak:\t  20000 kB\nVmSize:\t   10000 kB\n";
        assert_eq!(parse_status_kb(status, "VmSize:"), Some(10000 * 1024));
        // This process: whatever the limits, the answer is at most what /proc/meminfo says.
        let meminfo = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| parse_meminfo(&t));
        if let (Some(all), Some(m)) = (available_host_bytes(), meminfo) {
            assert!(all <= m);
        }
    }

    #[test]
    fn meminfo_is_read_in_kilobytes() {
        let text = "MemTotal:       16303952 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_meminfo(text), Some(2 << 20));
        assert_eq!(parse_meminfo("MemTotal: 5 kB\n"), None);
    }
}
