//! The host text lexer: one line of source to tokens, each with its 1-based line:col
//! (columns count characters, not bytes).
//!
//! The host format is line-oriented (one statement per line, loop bodies by indentation), and
//! the kernel blocks after the container are `.weave` text that this lexer does not know, so
//! the parser lexes a line only when it reaches it. A bad character becomes a final
//! [`Tok::Error`] of the line, met by the parser in order like any other token.

pub(crate) use weave_ir::diag::clip;
use weave_ir::diag::Describe;
use weave_ir::Span;

/// What a token is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Tok {
    /// `[A-Za-z_][A-Za-z0-9_]*`; keywords and names such as `T3_g_bf16` are identifiers too.
    Ident(String),
    /// `[0-9]+`, kept as text so that the parser reports an out-of-range value where it is.
    Int(String),
    /// One of `( ) [ ] { } , : = + - * / % |` or `->`.
    Punct(&'static str),
    /// The end of the line (a `//` comment runs to it).
    Eol,
    /// A character the lexer rejects; always the last token of its line.
    Error(String),
}

/// A host text token and where it starts.
pub(crate) type Token = weave_ir::diag::Token<Tok>;

impl Describe for Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Ident(s) | Tok::Int(s) => format!("`{}`", clip(s)),
            Tok::Punct(p) => format!("`{p}`"),
            Tok::Eol => "end of line".to_string(),
            Tok::Error(m) => m.clone(),
        }
    }
}

const PUNCT: &[&str] = &[
    "(", ")", "[", "]", "{", "}", ",", ":", "=", "+", "*", "/", "%", "|",
];

/// Tokens of one line (`text` without its newline), numbered `line`. The result always
/// ends with [`Tok::Eol`] or, at a bad character, with one [`Tok::Error`].
pub(crate) fn lex_line(text: &str, line: u32) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0usize;
    let span = |i: usize| Span::new(line, u32::try_from(i + 1).unwrap_or(u32::MAX));
    while let Some(&c) = chars.get(i) {
        let start = i;
        i += 1;
        let tok = match c {
            ' ' | '\t' | '\r' => continue,
            '/' if chars.get(i) == Some(&'/') => break,
            '-' if chars.get(i) == Some(&'>') => {
                i += 1;
                Tok::Punct("->")
            }
            '-' => Tok::Punct("-"),
            c if c.is_ascii_digit() => {
                while chars.get(i).is_some_and(char::is_ascii_digit) {
                    i += 1;
                }
                if chars.get(i).is_some_and(|c| is_ident_char(*c)) {
                    while chars.get(i).is_some_and(|c| is_ident_char(*c)) {
                        i += 1;
                    }
                    let whole: String = chars[start..i].iter().collect();
                    Tok::Error(format!(
                        "bad integer `{}` (a name cannot start with a digit)",
                        clip(&whole)
                    ))
                } else {
                    Tok::Int(chars[start..i].iter().collect())
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                while chars.get(i).is_some_and(|c| is_ident_char(*c)) {
                    i += 1;
                }
                Tok::Ident(chars[start..i].iter().collect())
            }
            c => match PUNCT.iter().find(|p| p.starts_with(c)) {
                Some(p) => Tok::Punct(p),
                None => Tok::Error(format!("unexpected character `{}`", c.escape_debug())),
            },
        };
        let is_error = matches!(tok, Tok::Error(_));
        out.push(Token {
            tok,
            span: span(start),
        });
        if is_error {
            return out;
        }
    }
    out.push(Token {
        tok: Tok::Eol,
        span: span(chars.len()),
    });
    out
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_positions_and_comments() {
        let toks = lex_line("  T3_g_bf16[( ceilDiv(t, 3) )] -> -1 // done", 4);
        let got: Vec<(String, String)> = toks
            .iter()
            .map(|t| (t.describe(), t.span.to_string()))
            .collect();
        let want = [
            ("`T3_g_bf16`", "4:3"),
            ("`[`", "4:12"),
            ("`(`", "4:13"),
            ("`ceilDiv`", "4:15"),
            ("`(`", "4:22"),
            ("`t`", "4:23"),
            ("`,`", "4:24"),
            ("`3`", "4:26"),
            ("`)`", "4:27"),
            ("`)`", "4:29"),
            ("`]`", "4:30"),
            ("`->`", "4:32"),
            ("`-`", "4:35"),
            ("`1`", "4:36"),
            ("end of line", "4:45"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_bad_character_ends_the_line() {
        let toks = lex_line("a @ b", 1);
        assert_eq!(toks.len(), 2);
        assert_eq!(toks[1].tok, Tok::Error("unexpected character `@`".into()));
        assert_eq!(toks[1].span, Span::new(1, 3));
        let toks = lex_line("é", 2);
        assert_eq!(toks[0].span, Span::new(2, 1));
        let toks = lex_line("x 12ab", 1);
        assert_eq!(
            toks[1].tok,
            Tok::Error("bad integer `12ab` (a name cannot start with a digit)".into())
        );
    }
}
