//! Source positions and diagnostics: every user-facing error names a place and says what was expected.

use std::fmt;

/// A position in a `.weave` source text (1-based line and column, counted in characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Span {
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub col: u32,
}

impl Span {
    /// A span at `line:col`.
    pub fn new(line: u32, col: u32) -> Span {
        Span { line, col }
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// An error about user input: a message and, when the input came from text, the place.
///
/// Diagnostics produced by the builder API carry no span; the parser attaches the span of
/// the statement it was building (see [`Diagnostic::or_at`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// What went wrong, in one sentence, naming the tensor/axis/op involved.
    pub message: String,
    /// Where, when known.
    pub span: Option<Span>,
}

impl Diagnostic {
    /// A diagnostic without a position.
    pub fn new(message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            message: message.into(),
            span: None,
        }
    }

    /// A diagnostic at `span`.
    pub fn at(span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            message: message.into(),
            span: Some(span),
        }
    }

    /// Attaches `span` unless the diagnostic already has a more precise one.
    pub fn or_at(mut self, span: Option<Span>) -> Diagnostic {
        if self.span.is_none() {
            self.span = span;
        }
        self
    }

    /// Renders the diagnostic the way a compiler does:
    ///
    /// ```text
    /// error: unknown op `addd`
    ///  --> row.weave:5:9
    ///   |
    /// 5 |   out = addd(a, b)
    ///   |         ^
    /// ```
    pub fn render(&self, file: &str, source: &str) -> String {
        let mut out = format!("error: {}\n", self.message);
        match self.span {
            None => out.push_str(&format!(" --> {file}\n")),
            Some(span) => {
                let line_text = source.lines().nth(span.line as usize - 1).unwrap_or("");
                let num = span.line.to_string();
                let pad = " ".repeat(num.len());
                out.push_str(&format!("{pad}--> {file}:{span}\n"));
                out.push_str(&format!("{pad} |\n"));
                out.push_str(&format!("{num} | {line_text}\n"));
                let caret_pad: String = line_text
                    .chars()
                    .take(span.col.saturating_sub(1) as usize)
                    .map(|c| if c == '\t' { '\t' } else { ' ' })
                    .collect();
                out.push_str(&format!("{pad} | {caret_pad}^\n"));
            }
        }
        out
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.span {
            Some(span) => write!(f, "{span}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for Diagnostic {}

/// Result alias for fallible IR operations.
pub type IrResult<T> = Result<T, Diagnostic>;

/// Long identifiers and literals are cut to 40 characters (and `...`) in messages, so that
/// one line stays readable.
pub fn clip(s: &str) -> String {
    const MAX: usize = 40;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        let head: String = s.chars().take(MAX).collect();
        format!("{head}...")
    }
}

/// A token of a line-oriented text format (`.weave`, the host text) and where it starts:
/// what the `.weave` lexer and the host text lexer give their parsers, each with its own
/// kinds of token `T`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token<T> {
    /// The token.
    pub tok: T,
    /// 1-based line:col of its first character.
    pub span: Span,
}

/// A kind of token that can name itself in "found ..." messages.
pub trait Describe {
    /// How the token is named in "found ..." messages.
    fn describe(&self) -> String;
}

impl<T: Describe> Token<T> {
    /// How the token is named in "found ..." messages.
    pub fn describe(&self) -> String {
        self.tok.describe()
    }
}
