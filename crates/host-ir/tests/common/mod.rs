//! What the property tests of this crate share.

use proptest::test_runner::{Config, FileFailurePersistence};

/// The property tests' configuration: `cases` cases, and failures print the minimal input
/// without persisting it (there is no lib.rs next to an integration test for proptest to
/// anchor a regressions file to).
pub fn unpersisted(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    }
}
