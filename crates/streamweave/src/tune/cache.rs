//! The tuning cache: what a tuning is cached under ([`TuneKey`]), the winners ([`Entry`],
//! one per key, in a [`TuneCache`]), and the TOML file they are read from and written to
//! ([`lookup`], [`store`]).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use weave_ir::{Fusion, ParamRole};

use super::{Candidate, Tuning};
use crate::chunks::{read_toml_file, toml_error, TomlFileError};
use crate::executable::Chunks;
use crate::run::{NcclCtaPolicy, Overlap, RunOptions, Transport};

/// What a tuning is cached under: the fusion's printed text with its chunk-count parameter
/// set to 1 and its mesh-size parameter to the rank count, the other parameter values, the
/// rank count, the backend and the machine. [`TuneKey::id`] is a stable hash of all of them
/// (XXH64 with seed 0, the same on every platform and Rust version); the other fields are kept for the
/// reader of the cache and checked on lookup too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TuneKey {
    /// The stable hash, 16 hex digits.
    pub id: String,
    /// The fusion's name.
    pub fusion: String,
    /// Every parameter value but the chunk count's.
    pub params: BTreeMap<String, i64>,
    /// The rank count.
    pub ranks: usize,
    /// `cpu` or `cuda`.
    pub backend: String,
    /// The GPU's name (`NVIDIA H200`), or `cpu`.
    pub gpu: String,
}

impl TuneKey {
    /// The key of `fusion` (loaded with its parameter values) on `ranks` ranks of `backend`
    /// on `gpu`.
    pub fn of(fusion: &Fusion, ranks: usize, backend: &str, gpu: &str) -> TuneKey {
        let mut normal = fusion.clone();
        let chunk = normal
            .role_param(ParamRole::ChunkCount)
            .map(|p| p.name.clone());
        let mesh = normal
            .role_param(ParamRole::MeshSize)
            .map(|p| p.name.clone());
        // Both names come from the fusion's own parameters, so setting them cannot fail.
        if let Some(c) = &chunk {
            let _ = normal.set_param(c, 1);
        }
        if let Some(m) = &mesh {
            let _ = normal.set_param(m, i64::try_from(ranks).unwrap_or(i64::MAX));
        }
        let params: BTreeMap<String, i64> = normal
            .params()
            .iter()
            .filter(|p| Some(&p.name) != chunk.as_ref())
            .filter_map(|p| p.value.map(|v| (p.name.clone(), v)))
            .collect();
        let text = weave_ir::text::print(&normal);
        let mut canonical = text;
        for (k, v) in &params {
            canonical.push_str(&format!("\0{k}={v}"));
        }
        canonical.push_str(&format!("\0ranks={ranks}\0backend={backend}\0gpu={gpu}"));
        TuneKey {
            id: format!("{:016x}", stable_hash(canonical.as_bytes())),
            fusion: fusion.name.clone(),
            params,
            ranks,
            backend: backend.to_string(),
            gpu: gpu.to_string(),
        }
    }
}

/// The 64-bit XXH64 hash (seed 0) of `bytes`: a specified algorithm, stable across platforms,
/// processes and compiler versions (the standard library's hasher is not).
fn stable_hash(bytes: &[u8]) -> u64 {
    twox_hash::XxHash64::oneshot(0, bytes)
}

/// One cached winner: its key (the hash and, for the reader, what it hashes), the
/// configuration and its figure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// [`TuneKey::id`].
    pub key: String,
    /// The fusion's name.
    pub fusion: String,
    /// Every parameter value but the chunk count's.
    pub params: BTreeMap<String, i64>,
    /// The rank count.
    pub ranks: usize,
    /// `cpu` or `cuda`.
    pub backend: String,
    /// The GPU's name, or `cpu`.
    pub gpu: String,
    /// The chunk count (absent: the fusion's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks: Option<usize>,
    /// The fusion's ring form, this many pieces a step (absent: the fusion as written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<usize>,
    /// The stream-pool size.
    pub streams: usize,
    /// Whether repeated runs replay a captured CUDA graph.
    pub replay: bool,
    /// How allgathers and transfers move (absent: NCCL).
    #[serde(default, skip_serializing_if = "is_nccl")]
    pub transport: Transport,
    /// [`Overlap::ordered_compute`] (absent: off).
    #[serde(default, skip_serializing_if = "is_false")]
    pub ordered_compute: bool,
    /// [`Overlap::pool_priority_high`] (absent: off).
    #[serde(default, skip_serializing_if = "is_false")]
    pub pool_priority_high: bool,
    /// [`Overlap::comm_priority_high`] (absent: off).
    #[serde(default, skip_serializing_if = "is_false")]
    pub comm_priority_high: bool,
    /// [`Overlap::gemm_sm_margin`] (absent: 0, the whole GPU).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gemm_sm_margin: u32,
    /// [`Overlap::nccl_max_ctas`] (absent: NCCL's choice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_max_ctas: Option<u32>,
    /// [`Overlap::nccl_cta_policy`] (absent: NCCL's choice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_cta_policy: Option<NcclCtaPolicy>,
    /// [`Overlap::nccl_window_mib`] (absent: no window).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nccl_window_mib: u32,
    /// [`Overlap::ce_slot_mib`] (absent: the default slots).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ce_slot_mib: u32,
    /// [`Overlap::gemm_into_windows`] (absent: off).
    #[serde(default, skip_serializing_if = "is_false")]
    pub gemm_into_windows: bool,
    /// The measured median, ms.
    pub median_ms: f64,
    /// [`super::Tuning::contention`] (absent: not fitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contention: Option<f64>,
}

fn is_nccl(t: &Transport) -> bool {
    *t == Transport::Nccl
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Entry {
    /// Whether this entry is the one of `key`.
    pub fn matches(&self, key: &TuneKey) -> bool {
        self.key == key.id
            && self.fusion == key.fusion
            && self.params == key.params
            && self.ranks == key.ranks
            && self.backend == key.backend
            && self.gpu == key.gpu
    }

    /// The configuration.
    pub fn candidate(&self) -> Candidate {
        Candidate {
            chunks: self.chunks,
            ring: self.ring,
            streams: self.streams,
            replay: self.replay,
            transport: self.transport,
            overlap: Overlap {
                ordered_compute: self.ordered_compute,
                pool_priority_high: self.pool_priority_high,
                comm_priority_high: self.comm_priority_high,
                gemm_sm_margin: self.gemm_sm_margin,
                nccl_max_ctas: self.nccl_max_ctas,
                nccl_cta_policy: self.nccl_cta_policy,
                nccl_window_mib: self.nccl_window_mib,
                ce_slot_mib: self.ce_slot_mib,
                gemm_into_windows: self.gemm_into_windows,
            },
        }
    }

    /// How a [`Compiler`](crate::Compiler) should pick the chunk count for this entry.
    pub fn compiler_chunks(&self) -> Chunks {
        self.candidate().compiler_chunks()
    }

    /// Sets `options`' stream pool, transport and overlap knobs to this entry's and turns
    /// graph replay off when the entry measured it slower (an eager run stays eager).
    pub fn apply(&self, options: &mut RunOptions) {
        let c = self.candidate();
        options.streams = c.streams;
        options.gpu.replay = options.gpu.replay && c.replay;
        options.gpu.transport = c.transport;
        options.gpu.overlap = c.overlap;
    }
}

/// The tuning cache: the winners, one per key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TuneCache {
    /// The entries, in the order stored.
    #[serde(default, rename = "entry")]
    pub entries: Vec<Entry>,
}

impl TuneCache {
    /// The cache at `path`; empty when there is no such file. A file that cannot be read or
    /// parsed is an error naming it and the line.
    pub fn load(path: &Path) -> Result<TuneCache, CacheError> {
        if !path.exists() {
            return Ok(TuneCache::default());
        }
        Ok(read_toml_file(path, "tuning cache", TuneCache::parse)?)
    }

    /// Reads the TOML that [`TuneCache::render`] writes.
    pub fn parse(text: &str) -> Result<TuneCache, CacheParseError> {
        let cache: TuneCache =
            toml::from_str(text).map_err(|e| CacheParseError::Toml(toml_error(&e)))?;
        for e in &cache.entries {
            if e.streams == 0 || e.chunks == Some(0) || e.ring == Some(0) || e.ranks == 0 {
                return Err(CacheParseError::NotPositive { key: e.key.clone() });
            }
        }
        Ok(cache)
    }

    /// The TOML text [`TuneCache::parse`] reads.
    pub fn render(&self) -> String {
        // Strings, integers, floats and booleans always serialize.
        let body = toml::to_string(self).unwrap_or_default();
        format!("# streamweave tuning cache: written by `weave tune`, read by `weave run`\n{body}")
    }

    /// The entry of `key`, if cached.
    pub fn get(&self, key: &TuneKey) -> Option<&Entry> {
        self.entries.iter().find(|e| e.matches(key))
    }

    /// Stores `entry`, replacing the one with its key.
    pub fn insert(&mut self, entry: Entry) {
        match self.entries.iter_mut().find(|e| e.key == entry.key) {
            Some(old) => *old = entry,
            None => self.entries.push(entry),
        }
    }

    /// Writes the cache to `path` whole or not at all, creating its directory, with the
    /// crate's one atomic writer ([`crate::output::write_output`]): a temporary file beside it,
    /// then a rename. A symbolic link is written through (its final target is replaced, the
    /// link stays); a character device or a FIFO (`/dev/null`) is written in place; anything
    /// else (a directory, a socket) is refused. New files get 0666 less the umask.
    pub fn store(&self, path: &Path) -> Result<(), CacheError> {
        Ok(crate::output::write_output(
            path,
            self.render().as_bytes(),
            true,
        )?)
    }
}

/// Why the tuning cache was not read or written ([`TuneCache::load`], [`TuneCache::store`],
/// [`lookup`], [`store`]): every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The file does not read (or is over the source cap), is not UTF-8 text, or is not a
    /// tuning cache.
    #[error(transparent)]
    Read(#[from] TomlFileError<CacheParseError>),
    /// The file was not written.
    #[error(transparent)]
    Write(#[from] crate::output::OutputError),
}

/// What is wrong in a tuning cache's text ([`TuneCache::parse`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CacheParseError {
    /// Not TOML, or an unknown or mistyped field: where, then what (`TOML parse error at
    /// line 3, column 11: invalid ...`).
    #[error("{0}")]
    Toml(String),
    /// An entry with no chunk, stream or rank.
    #[error("entry {key}: chunks, streams and ranks must be positive")]
    NotPositive {
        /// The entry's [`Entry::key`].
        key: String,
    },
}

/// The winner cached at `path` for `key`, if any (a missing file has none).
pub fn lookup(path: &Path, key: &TuneKey) -> Result<Option<Entry>, CacheError> {
    Ok(TuneCache::load(path)?.get(key).cloned())
}

/// Adds `tuning`'s winner to the cache at `path` (read first, so other entries stay) and
/// returns it; `None` when the tuning has no winner (nothing is written).
pub fn store(path: &Path, tuning: &Tuning) -> Result<Option<Entry>, CacheError> {
    let Some(entry) = tuning.entry() else {
        return Ok(None);
    };
    let mut cache = TuneCache::load(path)?;
    cache.insert(entry.clone());
    cache.store(path)?;
    Ok(Some(entry))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunks::{toml_error_at, Calibration};
    use crate::tune::tests::{candidate, fusion};

    /// The cache is read like a source file: one that grew beyond the cap (a sparse file
    /// here) is refused naming its size, never read whole.
    #[test]
    fn a_cache_beyond_the_source_cap_is_refused_before_it_is_read() {
        let dir = std::env::temp_dir().join(format!("weave-tune-cap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tune.toml");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(crate::MAX_SOURCE_BYTES + 1).unwrap();
        let e = TuneCache::load(&path).unwrap_err().to_string();
        assert!(
            e.contains(&(crate::MAX_SOURCE_BYTES + 1).to_string()),
            "{e}"
        );
        let cal = Calibration::load(Some(&path)).unwrap_err().to_string();
        assert!(
            cal.contains(&(crate::MAX_SOURCE_BYTES + 1).to_string()),
            "{cal}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An entry written before the overlap knobs existed reads back with their defaults.
    #[test]
    fn entries_without_knobs_read_back_with_the_defaults() {
        let text = r#"[[entry]]
key = "00000000000000aa"
fusion = "f"
params = {}
ranks = 2
backend = "cuda"
gpu = "NVIDIA H200"
chunks = 2
streams = 2
replay = true
median_ms = 1.5
"#;
        let cache = TuneCache::parse(text).unwrap();
        let c = cache.entries[0].candidate();
        assert_eq!(c, candidate(2, 2, true));
        assert!(!cache.render().contains("ordered_compute"));
    }

    #[test]
    fn keys_are_stable_and_tell_programs_apart() {
        let key = |set: &[(&str, i64)], ranks: usize, gpu: &str| {
            TuneKey::of(&fusion(set), ranks, "cuda", gpu)
        };
        let a = key(&[], 2, "NVIDIA H200");
        assert_eq!(a, key(&[], 2, "NVIDIA H200"));
        assert_eq!(a.id.len(), 16);
        // The chunk count is what is tuned: it is not part of the key.
        assert_eq!(a, key(&[("s", 2)], 2, "NVIDIA H200"));
        assert!(!a.params.contains_key("s"));
        assert_eq!(a.params.get("t"), Some(&48));
        // The mesh size follows the rank count.
        assert_eq!(a, key(&[("d", 4)], 2, "NVIDIA H200"));
        assert_eq!(a.params.get("d"), Some(&2));
        for other in [
            key(&[("t", 96)], 2, "NVIDIA H200"),
            key(&[], 4, "NVIDIA H200"),
            key(&[], 2, "NVIDIA H100 80GB HBM3"),
            TuneKey::of(&fusion(&[]), 2, "cpu", "NVIDIA H200"),
        ] {
            assert_ne!(a.id, other.id, "{other:?}");
        }
        // The hash itself is fixed: XXH64 (seed 0) of the empty string and of "a", as the
        // xxHash reference gives them.
        assert_eq!(stable_hash(b""), 0xef46_db37_51d8_e999);
        assert_eq!(stable_hash(b"a"), 0xd24e_c4f1_a98c_6e5b);
    }

    #[test]
    fn a_corrupt_cache_is_an_error_naming_the_file_and_the_line() {
        toml_error_at(
            TuneCache::parse("[[entry]]\nkey = \"ab\"\nstreams = many\n"),
            "line 3",
        );
        let err = toml_error_at(
            TuneCache::parse("# a comment\n[[entry]]\nspeed = 3\n"),
            "line 3",
        );
        assert!(err.contains("speed"), "{err}");
        let dir = std::env::temp_dir().join(format!("weave-tune-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tune.toml");
        std::fs::write(&path, "this is not toml\n").unwrap();
        let err = TuneCache::load(&path).unwrap_err().to_string();
        assert!(
            err.starts_with(&path.display().to_string()) && err.contains("line 1"),
            "{err}"
        );
        let key = TuneKey::of(&fusion(&[]), 2, "cuda", "x");
        assert!(lookup(&path, &key).is_err());
        let _ = std::fs::remove_dir_all(&dir);
        // A missing file is an empty cache.
        assert_eq!(
            TuneCache::load(Path::new("/no/such/dir/tune.toml")).unwrap(),
            TuneCache::default()
        );
    }
}
