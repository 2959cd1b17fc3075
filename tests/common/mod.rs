//! Helpers shared by the root package's integration tests: where the scenario fixtures are.

use std::path::{Path, PathBuf};

/// The fixture `tests/scenarios/{name}.weave`.
#[allow(dead_code)]
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/scenarios/{name}.weave"))
}

/// Every `.weave` fixture directly in tests/scenarios, sorted by path.
#[allow(dead_code)]
pub fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/scenarios exists")
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "weave"))
        .collect();
    v.sort();
    v
}
