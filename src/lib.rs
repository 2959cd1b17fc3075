//! weave-cli: the `weave` command line over the streamweave library — the `weave run`
//! command ([`cli`]), the `weave launch` process launcher ([`launch`]) and the log
//! subscriber ([`log`]).

pub mod cli;
pub mod launch;
pub mod log;
