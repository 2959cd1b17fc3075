//! The `weave` log: a `tracing` subscriber that prints the spans and events of the libraries
//! (passes, runs, communications, device waits) and of the command itself to stderr. Off
//! unless asked for with `--log FILTER` or `WEAVE_LOG=FILTER`; the libraries only emit,
//! they never install a subscriber.

use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::EnvFilter;

/// The environment variable read when `--log` is not given.
pub const ENV: &str = "WEAVE_LOG";

/// The filter to log with: `--log`'s, else `$WEAVE_LOG`'s; `None` (no log) when neither is
/// given or the one given is empty.
pub fn filter(flag: Option<String>) -> Option<String> {
    flag.or_else(|| std::env::var(ENV).ok())
        .filter(|f| !f.trim().is_empty())
}

/// Installs the subscriber for `filter` (`tracing-subscriber` directives: `debug`,
/// `weave_passes=trace,info`, ...): every event at or above the level, and every span when it
/// closes with its busy and idle time, on stderr.
pub fn init(filter: &str) -> Result<(), LogError> {
    let directives = EnvFilter::try_new(filter).map_err(|source| LogError::Filter {
        filter: filter.to_string(),
        source,
    })?;
    tracing_subscriber::fmt()
        .with_env_filter(directives)
        .with_span_events(FmtSpan::CLOSE)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init()
        .map_err(LogError::Install)
}

/// Why [`init`] installed no log.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The filter is not `tracing-subscriber` directives.
    #[error("--log `{filter}`: {source}")]
    Filter {
        /// The filter given.
        filter: String,
        /// What is wrong with it.
        source: tracing_subscriber::filter::ParseError,
    },
    /// A subscriber is installed already.
    #[error("cannot install the log: {0}")]
    Install(#[source] Box<dyn std::error::Error + Send + Sync>),
}
