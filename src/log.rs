//! The `weave` log: a `tracing` subscriber that prints the spans and events of the libraries
//! (passes, runs, communications, device waits) and of the command itself to stderr. Off
//! unless asked for with `--log FILTER` or `WEAVE_LOG=FILTER`; the libraries only emit,
//! they never install a subscriber.

use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::EnvFilter;

/// The environment variable read when `--log` is not given.
pub const ENV: &str = "WEAVE_LOG";

/// The environment variable that says which span events the log prints ([`span_events`]).
pub const SPANS_ENV: &str = "WEAVE_LOG_SPANS";

/// The span events to print for `value` (a comma-separated list of `open`, `close`, `enter`,
/// `exit`, or `none`, `full`); `None` (unset or empty) is `close`: each span once it closes,
/// with its busy and idle time. `open` prints a span when it starts, so a run that stalls
/// shows, per thread, the spans it opened and never closed.
pub fn span_events(value: Option<&str>) -> Result<FmtSpan, LogError> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(FmtSpan::CLOSE);
    };
    let mut events = FmtSpan::NONE;
    for word in value.split(',').map(str::trim) {
        events |= match word {
            "open" | "new" => FmtSpan::NEW,
            "close" => FmtSpan::CLOSE,
            "enter" => FmtSpan::ENTER,
            "exit" => FmtSpan::EXIT,
            "none" => FmtSpan::NONE,
            "full" => FmtSpan::FULL,
            _ => {
                return Err(LogError::Spans {
                    value: value.to_string(),
                })
            }
        };
    }
    Ok(events)
}

/// The filter to log with: `--log`'s, else `$WEAVE_LOG`'s; `None` (no log) when neither is
/// given or the one given is empty.
pub fn filter(flag: Option<String>) -> Option<String> {
    flag.or_else(|| std::env::var(ENV).ok())
        .filter(|f| !f.trim().is_empty())
}

/// Installs the subscriber for `filter` (`tracing-subscriber` directives: `debug`,
/// `weave_passes=trace,info`, ...): every event at or above the level, and every span when it
/// closes with its busy and idle time (or the span events [`SPANS_ENV`] names), on stderr,
/// each line with its thread's name (`weave-rank-R` for a rank).
pub fn init(filter: &str) -> Result<(), LogError> {
    let directives = EnvFilter::try_new(filter).map_err(|source| LogError::Filter {
        filter: filter.to_string(),
        source,
    })?;
    let spans = span_events(std::env::var(SPANS_ENV).ok().as_deref())?;
    tracing_subscriber::fmt()
        .with_env_filter(directives)
        .with_span_events(spans)
        .with_thread_names(true)
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
    /// [`SPANS_ENV`] names an event that is not one.
    #[error(
        "{SPANS_ENV}={value:?}: expected a comma-separated list of open, close, enter, exit, \
         none, full"
    )]
    Spans {
        /// The value given.
        value: String,
    },
    /// A subscriber is installed already.
    #[error("cannot install the log: {0}")]
    Install(#[source] Box<dyn std::error::Error + Send + Sync>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_events_default_to_close_and_combine_by_name() {
        for unset in [None, Some(""), Some("  ")] {
            assert_eq!(span_events(unset).unwrap(), FmtSpan::CLOSE);
        }
        assert_eq!(
            span_events(Some("open,close")).unwrap(),
            FmtSpan::NEW | FmtSpan::CLOSE
        );
        assert_eq!(span_events(Some("full")).unwrap(), FmtSpan::FULL);
        assert_eq!(span_events(Some("none")).unwrap(), FmtSpan::NONE);
        assert_eq!(
            span_events(Some(" enter , exit ")).unwrap(),
            FmtSpan::ENTER | FmtSpan::EXIT
        );
    }

    #[test]
    fn an_unknown_span_event_is_refused_with_the_variable_and_the_words() {
        let e = span_events(Some("open,begin")).unwrap_err().to_string();
        assert_eq!(
            e,
            "WEAVE_LOG_SPANS=\"open,begin\": expected a comma-separated list of open, close, \
             enter, exit, none, full"
        );
    }
}
