//! The `.weave` lexer: source text to tokens, each with the 1-based line:col of its first
//! character (columns count characters, not bytes).
//!
//! Lexing never fails outright: the first bad character becomes a final [`Tok::Error`] token
//! carrying its message, so that errors earlier in the file are still reported first by the
//! parser, which meets the tokens in order.

use crate::diag::{clip, Describe, Span};

/// A punctuation token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Punct {
    LParen,
    RParen,
    LBracket,
    RBracket,
    LBrace,
    RBrace,
    Comma,
    Colon,
    Semi,
    Eq,
    Arrow,
    Plus,
    Minus,
    Star,
    Slash,
    Percent,
}

impl Punct {
    /// The token as written.
    pub(crate) fn text(self) -> &'static str {
        match self {
            Punct::LParen => "(",
            Punct::RParen => ")",
            Punct::LBracket => "[",
            Punct::RBracket => "]",
            Punct::LBrace => "{",
            Punct::RBrace => "}",
            Punct::Comma => ",",
            Punct::Colon => ":",
            Punct::Semi => ";",
            Punct::Eq => "=",
            Punct::Arrow => "->",
            Punct::Plus => "+",
            Punct::Minus => "-",
            Punct::Star => "*",
            Punct::Slash => "/",
            Punct::Percent => "%",
        }
    }
}

/// What a token is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Tok {
    /// `[A-Za-z_][A-Za-z0-9_]*` (keywords are identifiers too; the parser decides).
    Ident(String),
    /// `[0-9]+`, kept as text so that the parser reports out-of-range values where they are.
    Int(String),
    /// A number with a fraction or an exponent, `[0-9]+ '.' [0-9]+ [e [+-] [0-9]+]` or
    /// `[0-9]+ e [+-] [0-9]+`: a literal of a tensor expression (`x * 0.5`).
    Float(String),
    /// Punctuation.
    Punct(Punct),
    /// The end of a line (statements end there).
    Newline,
    /// The end of the source.
    Eof,
    /// A character (or literal) the lexer rejects; always the last token.
    Error(String),
}

/// A `.weave` token and where it starts.
pub(crate) type Token = crate::diag::Token<Tok>;

impl Describe for Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Ident(s) | Tok::Int(s) | Tok::Float(s) => format!("`{}`", clip(s)),
            Tok::Punct(p) => format!("`{}`", p.text()),
            Tok::Newline => "end of line".to_string(),
            Tok::Eof => "end of file".to_string(),
            Tok::Error(m) => m.clone(),
        }
    }
}

struct Cursor<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: u32,
    col: u32,
}

impl Cursor<'_> {
    fn peek(&mut self) -> Option<char> {
        self.chars.peek().copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.line = self.line.saturating_add(1);
            self.col = 1;
        } else {
            self.col = self.col.saturating_add(1);
        }
        Some(c)
    }

    fn span(&self) -> Span {
        Span::new(self.line, self.col)
    }

    fn skip_line(&mut self) {
        while let Some(c) = self.peek() {
            if c == '\n' {
                break;
            }
            self.bump();
        }
    }

    fn take_while(&mut self, first: char, pred: impl Fn(char) -> bool) -> String {
        let mut s = String::from(first);
        self.extend_while(&mut s, pred);
        s
    }

    fn extend_while(&mut self, s: &mut String, pred: impl Fn(char) -> bool) {
        while let Some(c) = self.peek() {
            if !pred(c) {
                break;
            }
            s.push(c);
            self.bump();
        }
    }
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Splits `source` into tokens. The result always ends with [`Tok::Eof`] or, when a bad
/// character is met, with one [`Tok::Error`] at that character.
pub(crate) fn lex(source: &str) -> Vec<Token> {
    let mut cur = Cursor {
        chars: source.chars().peekable(),
        line: 1,
        col: 1,
    };
    let mut out = Vec::new();
    loop {
        let span = cur.span();
        let Some(c) = cur.bump() else {
            out.push(Token {
                tok: Tok::Eof,
                span,
            });
            return out;
        };
        let punct = |p| Some(Tok::Punct(p));
        let tok = match c {
            '\n' => Some(Tok::Newline),
            ' ' | '\t' | '\r' => None,
            '#' => {
                cur.skip_line();
                None
            }
            '/' if cur.peek() == Some('/') => {
                cur.skip_line();
                None
            }
            '/' => punct(Punct::Slash),
            '-' if cur.peek() == Some('>') => {
                cur.bump();
                punct(Punct::Arrow)
            }
            '-' => punct(Punct::Minus),
            '(' => punct(Punct::LParen),
            ')' => punct(Punct::RParen),
            '[' => punct(Punct::LBracket),
            ']' => punct(Punct::RBracket),
            '{' => punct(Punct::LBrace),
            '}' => punct(Punct::RBrace),
            ',' => punct(Punct::Comma),
            ':' => punct(Punct::Colon),
            ';' => punct(Punct::Semi),
            '=' => punct(Punct::Eq),
            '+' => punct(Punct::Plus),
            '*' => punct(Punct::Star),
            '%' => punct(Punct::Percent),
            c if c.is_ascii_digit() => {
                let mut digits = cur.take_while(c, |c| c.is_ascii_digit());
                let mut float = false;
                if cur.peek() == Some('.') {
                    cur.bump();
                    digits.push('.');
                    float = true;
                    let before = digits.len();
                    cur.extend_while(&mut digits, |c| c.is_ascii_digit());
                    if digits.len() == before {
                        digits.push('?');
                    }
                }
                if matches!(cur.peek(), Some('e' | 'E')) {
                    cur.bump();
                    digits.push('e');
                    float = true;
                    if let Some(sign @ ('+' | '-')) = cur.peek() {
                        cur.bump();
                        digits.push(sign);
                    }
                    let before = digits.len();
                    cur.extend_while(&mut digits, |c| c.is_ascii_digit());
                    if digits.len() == before {
                        digits.push('?');
                    }
                }
                if float && (digits.contains('?') || cur.peek().is_some_and(is_ident_char)) {
                    let mut whole = digits.replace('?', "");
                    cur.extend_while(&mut whole, is_ident_char);
                    Some(Tok::Error(format!(
                        "bad number `{}` (a literal is digits, `.` and digits, then optionally `e`, a sign and digits: `0.5`, `1e-9`)",
                        clip(&whole)
                    )))
                } else if float {
                    Some(Tok::Float(digits))
                } else if cur.peek().is_some_and(is_ident_char) {
                    let mut whole = std::mem::take(&mut digits);
                    cur.extend_while(&mut whole, is_ident_char);
                    Some(Tok::Error(format!(
                        "bad integer `{}` (an integer is digits only; a name cannot start with a digit)",
                        clip(&whole)
                    )))
                } else {
                    Some(Tok::Int(digits))
                }
            }
            c if is_ident_start(c) => Some(Tok::Ident(cur.take_while(c, is_ident_char))),
            c => Some(Tok::Error(format!(
                "unexpected character `{}`",
                c.escape_debug()
            ))),
        };
        if let Some(tok) = tok {
            let is_error = matches!(tok, Tok::Error(_));
            out.push(Token { tok, span });
            if is_error {
                return out;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(src: &str) -> Vec<Tok> {
        lex(src).into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn tokens_and_positions() {
        let toks = lex("fusion f(t = 8) {\n  x = add(a, b) // hi\n}");
        let spans: Vec<String> = toks.iter().map(|t| t.span.to_string()).collect();
        assert_eq!(
            spans,
            [
                "1:1", "1:8", "1:9", "1:10", "1:12", "1:14", "1:15", "1:17", "1:18", "2:3", "2:5",
                "2:7", "2:10", "2:11", "2:12", "2:14", "2:15", "2:22", "3:1", "3:2"
            ]
        );
        assert_eq!(toks.last().map(|t| &t.tok), Some(&Tok::Eof));
    }

    #[test]
    fn arrow_minus_comments_and_slash() {
        assert_eq!(
            kinds("a->b - c / d # x\n%"),
            vec![
                Tok::Ident("a".into()),
                Tok::Punct(Punct::Arrow),
                Tok::Ident("b".into()),
                Tok::Punct(Punct::Minus),
                Tok::Ident("c".into()),
                Tok::Punct(Punct::Slash),
                Tok::Ident("d".into()),
                Tok::Newline,
                Tok::Punct(Punct::Percent),
                Tok::Eof,
            ]
        );
    }

    #[test]
    fn errors_end_the_stream() {
        let toks = lex("a @ b");
        assert_eq!(toks.len(), 2);
        assert_eq!(toks[1].tok, Tok::Error("unexpected character `@`".into()));
        assert_eq!(toks[1].span, Span::new(1, 3));
        let toks = lex("x 12ab");
        assert_eq!(
            toks[1].tok,
            Tok::Error(
                "bad integer `12ab` (an integer is digits only; a name cannot start with a digit)"
                    .into()
            )
        );
    }

    #[test]
    fn columns_count_characters() {
        let toks = lex("é");
        assert_eq!(toks[0].tok, Tok::Error("unexpected character `é`".into()));
        let toks = lex("// é\n\tx");
        assert_eq!(toks[1].span, Span::new(2, 2));
    }
}
