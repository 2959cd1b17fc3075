//! weave-cli: the `weave` command line over the streamweave library — the `weave run`
//! command ([`cli`]), the `weave launch` process launcher ([`launch`]), the log
//! subscriber ([`log`]), and standard output and files written safely ([`output`]).

pub mod cli;
pub mod launch;
pub mod log;
pub mod output;
