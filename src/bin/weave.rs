//! weave CLI.
fn main() {}
