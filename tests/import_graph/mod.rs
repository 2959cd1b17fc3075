//! The import graph between the files of one crate, read from its source text, and the
//! cycles in it (for tidy.rs).
//!
//! A file is a module: `src/a/b.rs` and `src/a/b/mod.rs` are `crate::a::b`. A file imports
//! another when its code (comments and string literals left out) names a path into it:
//! `crate::a::b::Item`, `super::b::Item` or `self::b::Item`, a brace group of these (`use
//! crate::{a::X, b::Y}`), or a child module by its bare name (`use b::Item` in `a.rs`).
//! Each path is taken to the longest prefix that is a module file, and `super` counts the
//! inline modules (`mod tests { use super::*; }`) it leaves. A folder's root file (`lib.rs`,
//! `main.rs`, `mod.rs`) declares and re-exports its children, so its arrows into its own
//! folder are left out, as are arrows into the crate root; binaries under `src/bin/` are
//! crate roots of their own and are not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path, `["cuda", "codegen"]` for `crate::cuda::codegen`.
type ModPath = Vec<String>;

/// The files of the crate whose sources are in `src`, by module path.
fn modules(src: &Path) -> BTreeMap<ModPath, PathBuf> {
    let mut files = Vec::new();
    super::rust_files(src, &mut files);
    let mut out = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).expect("a file under src");
        let mut path: ModPath = rel
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        if path.first().is_some_and(|c| c == "bin") {
            continue;
        }
        let last = path.pop().expect("a file name");
        let stem = last.strip_suffix(".rs").expect("a .rs file");
        if !(stem == "mod" || (path.is_empty() && (stem == "lib" || stem == "main"))) {
            path.push(stem.to_string());
        }
        out.insert(path, file);
    }
    out
}

/// A token of Rust code that paths are made of: an identifier or keyword, `::`, or one
/// punctuation character.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Ident(String),
    PathSep,
    Punct(char),
}

/// The tokens of `text`, without comments, string, byte and character literals, and
/// lifetimes.
fn tokens(text: &str) -> Vec<Token> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let ident_char = |ch: char| ch == '_' || ch.is_alphanumeric();
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_string(&c, i + 1);
        } else if ch == '\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && ident_char(c[i]) {
                    i += 1;
                }
            }
        } else if ident_char(ch) {
            let start = i;
            while i < c.len() && ident_char(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            // Raw strings and byte strings: r"..", r#".."#, b"..", br#".."#.
            let raw = matches!(word.as_str(), "r" | "br") && matches!(c.get(i), Some('"' | '#'));
            if raw {
                let mut hashes = 0;
                while c.get(i) == Some(&'#') {
                    hashes += 1;
                    i += 1;
                }
                if c.get(i) == Some(&'"') {
                    i += 1;
                    while i < c.len() {
                        if c[i] == '"' && (0..hashes).all(|h| c.get(i + 1 + h) == Some(&'#')) {
                            i += 1 + hashes;
                            break;
                        }
                        i += 1;
                    }
                }
            } else if word == "b" && c.get(i) == Some(&'"') {
                i = skip_string(&c, i + 1);
            } else if word == "b" && c.get(i) == Some(&'\'') {
                i += 1;
                while i < c.len() && c[i] != '\'' {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            } else {
                out.push(Token::Ident(word));
            }
        } else if ch == ':' && next == Some(':') {
            out.push(Token::PathSep);
            i += 2;
        } else {
            if !ch.is_whitespace() {
                out.push(Token::Punct(ch));
            }
            i += 1;
        }
    }
    out
}

/// The index after the string literal whose body starts at `i`.
fn skip_string(c: &[char], mut i: usize) -> usize {
    while i < c.len() && c[i] != '"' {
        i += if c[i] == '\\' { 2 } else { 1 };
    }
    i + 1
}

/// Reads the path that starts at `t[*i]` from module `base` (a path's first segment, then
/// `::` and further segments or a brace group), adding every whole path it names to `out`.
fn read_path(t: &[Token], i: &mut usize, mut base: ModPath, out: &mut Vec<ModPath>) {
    loop {
        match t.get(*i) {
            Some(Token::Ident(word)) => {
                match word.as_str() {
                    "crate" => base.clear(),
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => base.push(word.clone()),
                }
                *i += 1;
            }
            Some(Token::Punct('{')) => {
                *i += 1;
                while *i < t.len() && t[*i] != Token::Punct('}') {
                    let before = *i;
                    read_path(t, i, base.clone(), out);
                    if t.get(*i) == Some(&Token::Punct(',')) || *i == before {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            _ => break,
        }
        if t.get(*i) == Some(&Token::PathSep) {
            *i += 1;
        } else {
            break;
        }
    }
    out.push(base);
}

/// The module files that the file of module `me` imports (module docs).
fn imports(me: &ModPath, text: &str, modules: &BTreeMap<ModPath, PathBuf>) -> BTreeSet<ModPath> {
    let is_folder_root = modules
        .keys()
        .any(|m| m.len() > me.len() && m.starts_with(me));
    let t = tokens(text);
    // The inline modules open at each point: (name, the brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut paths = Vec::new();
    let mut i = 0;
    while i < t.len() {
        let here = || -> ModPath {
            let inner = inline.iter().map(|(name, _)| name.clone());
            me.iter().cloned().chain(inner).collect()
        };
        let after_sep = i > 0 && matches!(t[i - 1], Token::PathSep | Token::Punct('.'));
        match &t[i] {
            Token::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Token::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth -= 1;
                i += 1;
            }
            Token::Ident(word) if word == "mod" => {
                if let (Some(Token::Ident(name)), Some(Token::Punct('{'))) =
                    (t.get(i + 1), t.get(i + 2))
                {
                    inline.push((name.clone(), depth + 1));
                }
                i += 1;
            }
            Token::Ident(word) if !after_sep && t.get(i + 1) == Some(&Token::PathSep) => {
                let mut child = here();
                child.push(word.clone());
                let starts_path = matches!(word.as_str(), "crate" | "super" | "self")
                    || modules.contains_key(&child);
                if starts_path {
                    read_path(&t, &mut i, here(), &mut paths);
                } else {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    paths
        .into_iter()
        .filter_map(|mut path| {
            while !path.is_empty() && !modules.contains_key(&path) {
                path.pop();
            }
            // Into the crate root, itself, or (for a folder's root file) its own folder.
            let own_folder = is_folder_root && path.starts_with(me);
            (!path.is_empty() && path != *me && !own_folder).then_some(path)
        })
        .collect()
}

/// The sets of files of the crate whose sources are in `src` that import each other in a
/// loop (strongly connected components of more than one file), each as paths relative to
/// `root`, sorted.
pub fn cycles(root: &Path, src: &Path) -> Vec<Vec<String>> {
    let modules = modules(src);
    let graph: BTreeMap<&ModPath, BTreeSet<ModPath>> = modules
        .iter()
        .map(|(path, file)| {
            let text =
                std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            (path, imports(path, &text, &modules))
        })
        .collect();
    let reach = |from: &ModPath| -> BTreeSet<ModPath> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(m) = stack.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&ModPath, BTreeSet<ModPath>> =
        graph.keys().map(|m| (*m, reach(m))).collect();
    let mut out: BTreeSet<Vec<String>> = BTreeSet::new();
    for (m, from_m) in &reached {
        if !from_m.contains(*m) {
            continue;
        }
        let mut component: Vec<String> = from_m
            .iter()
            .filter(|other| reached[other].contains(*m))
            .map(|other| {
                let file = &modules[other];
                file.strip_prefix(root)
                    .unwrap_or(file)
                    .display()
                    .to_string()
            })
            .collect();
        component.sort();
        if component.len() > 1 {
            out.insert(component);
        }
    }
    out.into_iter().collect()
}
