//! Where `weave` keeps what it caches between runs: the tuning cache ([`tune_cache_path`])
//! and the machine's calibration ([`calibration_path`]), in the platform's cache directory
//! ([`cache_file`]) unless the environment names them.

use std::path::PathBuf;

/// Where `weave tune` caches its winners: `$WEAVE_TUNE_CACHE`, else
/// `streamweave/tune.toml` in the platform's cache directory ([`cache_file`]; `None` when
/// there is none).
pub fn tune_cache_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WEAVE_TUNE_CACHE") {
        return Some(PathBuf::from(p));
    }
    cache_file("tune.toml")
}

/// `streamweave/NAME` in the platform's cache directory (`dirs::cache_dir`: on Linux
/// `$XDG_CACHE_HOME`, else `~/.cache`; on macOS `~/Library/Caches`), `None` when it has none.
pub fn cache_file(name: &str) -> Option<PathBuf> {
    dirs::cache_dir().map(|d| d.join("streamweave").join(name))
}

/// Where the machine's calibration is cached: `$WEAVE_CALIBRATION`, else
/// `streamweave/calibration.txt` in the platform's cache directory ([`cache_file`]; `None`
/// when there is none).
pub fn calibration_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WEAVE_CALIBRATION") {
        return Some(PathBuf::from(p));
    }
    cache_file("calibration.txt")
}
