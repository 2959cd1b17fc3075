//! What follows the container: the `Signature:` block, the `Definition:` block and the kernel
//! blocks (`K0: fusion …`).

use weave_ir::{DType, DeviceMesh, Diagnostic, ParallelType, ParamRole, Span, SplitKind};

use super::stmt::is_kernel_name;
use super::{line_number, PResult, Parser, MAX_DEPTH};
use crate::lexer::{clip, lex_line, Tok, Token};
use crate::signature::{AxisSplit, Sharding, Signature, TensorSig};

impl Parser<'_> {
    // ----- kernel blocks --------------------------------------------------------------------

    /// After the container: the `Signature:` block (its entries indented on the lines
    /// below), the `Definition: fusion …` block and the `K0: fusion …` blocks, each fusion
    /// block up to a line that is exactly `}`.
    pub(super) fn kernel_blocks(&mut self) -> PResult<()> {
        while let Some(text) = self.lines.get(self.next_line).copied() {
            let start = self.next_line;
            self.next_line += 1;
            let trimmed = text.trim();
            if trimmed.is_empty() || trimmed.starts_with("//") {
                continue;
            }
            let toks = lex_line(text, line_number(start));
            let (name, colon_col) = match (toks.first(), toks.get(1)) {
                (
                    Some(Token {
                        tok: Tok::Ident(name),
                        ..
                    }),
                    Some(Token {
                        tok: Tok::Punct(":"),
                        span,
                    }),
                ) if is_kernel_name(name) || name == "Signature" || name == "Definition" => {
                    (name.clone(), span.col)
                }
                (Some(t), _) => {
                    return self.err(
                        t,
                        "a block `Signature:`, `Definition: fusion …` or `K0: fusion …` after the container",
                    )
                }
                (None, _) => continue,
            };
            let name_span = Span::new(line_number(start), toks.first().map_or(1, |t| t.span.col));
            if name == "Signature" {
                self.toks = toks;
                self.pos = 2;
                self.signature_block(name_span)?;
                continue;
            }
            let fusion = self.fusion_block(&name, start, text, colon_col, name_span)?;
            if name == "Definition" {
                let sig = self.prog.signature.get_or_insert_with(Signature::default);
                if sig.definition.is_some() {
                    return Err(Diagnostic::at(name_span, "a second `Definition:` block"));
                }
                sig.definition = Some(fusion);
                self.definition_at = Some(name_span);
                continue;
            }
            match self.kernels.get_mut(&name) {
                Some((_, _, true)) => {
                    return Err(Diagnostic::at(
                        name_span,
                        format!("kernel `{name}` has a second block"),
                    ))
                }
                Some((k, _, defined)) => {
                    *defined = true;
                    if let Some(unit) = self.prog.kernels.get_mut(*k) {
                        unit.fusion = std::sync::Arc::new(fusion);
                    }
                }
                None => {
                    let k = self.prog.add_kernel(fusion);
                    self.kernels.insert(name, (k, name_span, true));
                }
            }
        }
        Ok(())
    }

    /// The `.weave` text of a block that starts on line `start` (`text`, its name ending at
    /// `colon_col`) and ends at the next line that is exactly `}`.
    pub(super) fn fusion_block(
        &mut self,
        name: &str,
        start: usize,
        text: &str,
        colon_col: u32,
        name_span: Span,
    ) -> PResult<weave_ir::Fusion> {
        let what = if name == "Definition" {
            "the definition".to_string()
        } else {
            format!("kernel `{name}`")
        };
        let Some(end) = (start..self.lines.len())
            .skip(1)
            .find(|i| self.lines.get(*i).is_some_and(|l| l.trim_end() == "}"))
        else {
            return Err(Diagnostic::at(
                name_span,
                format!("the block of {what} is never closed: expected a line `}}`"),
            ));
        };
        // The `.weave` text, with `K0:` blanked out so that columns stay those of the file.
        let prefix = usize::try_from(colon_col).unwrap_or(usize::MAX);
        let mut fusion_text: String = " ".repeat(prefix.min(text.chars().count()));
        fusion_text.extend(text.chars().skip(prefix));
        for line in self.lines.get(start + 1..=end).unwrap_or(&[]) {
            fusion_text.push('\n');
            fusion_text.push_str(line);
        }
        fusion_text.push('\n');
        self.next_line = end + 1;
        weave_ir::text::parse(&fusion_text, &[]).map_err(|e| {
            let span = e.span.map(|s| {
                Span::new(
                    s.line.saturating_add(line_number(start)).saturating_sub(1),
                    s.col,
                )
            });
            Diagnostic {
                message: format!("in {what}: {}", e.message),
                span: span.or(Some(name_span)),
            }
        })
    }

    // ----- the signature ---------------------------------------------------------------------

    /// `Signature:` then, on the indented lines below, `params(..) [roles(..)]` and one
    /// `input …`/`output …` line per program input and output, in order.
    pub(super) fn signature_block(&mut self, name_span: Span) -> PResult<()> {
        self.expect_eol("after `Signature:`")?;
        let sig = self.prog.signature.get_or_insert_with(Signature::default);
        if !sig.params.is_empty() || !sig.inputs.is_empty() || !sig.outputs.is_empty() {
            return Err(Diagnostic::at(name_span, "a second `Signature:` block"));
        }
        let mut seen_params = false;
        while let Some(text) = self.lines.get(self.next_line).copied() {
            if !text.starts_with(' ') && !text.trim().is_empty() {
                break;
            }
            if !self.next_content_line() {
                break;
            }
            let t = self.peek();
            match &t.tok {
                Tok::Ident(w) if w == "params" && !seen_params => {
                    self.bump();
                    seen_params = true;
                    self.signature_params()?;
                }
                Tok::Ident(w) if seen_params && (w == "input" || w == "output") => {
                    let output = w == "output";
                    self.bump();
                    let entry = self.tensor_sig()?;
                    let sig = self.prog.signature.get_or_insert_with(Signature::default);
                    if output {
                        sig.outputs.push(entry);
                    } else {
                        sig.inputs.push(entry);
                    }
                }
                _ => {
                    return self.err(
                        &t,
                        if seen_params {
                            "a signature entry `input NAME: …` or `output NAME: …`"
                        } else {
                            "`params(..)` as the first line of the signature"
                        },
                    )
                }
            }
            self.expect_eol("after the signature entry")?;
        }
        if !seen_params {
            return Err(Diagnostic::at(
                name_span,
                "the signature has no `params(..)` line",
            ));
        }
        Ok(())
    }

    /// `(t=8, d=2) [devices(0 1)] [roles(mesh=d, chunks=s)]`, after `params`.
    pub(super) fn signature_params(&mut self) -> PResult<()> {
        self.expect_punct("(", "after `params`")?;
        let params =
            self.comma_list(")", "between parameters", |p, params: &[(String, i64)]| {
                let (name, span) = p.ident("a parameter name")?;
                if weave_ir::RESERVED_NAMES.contains(&name.as_str()) {
                    return Err(Diagnostic::at(
                        span,
                        format!(
                        "`{name}` is a built-in scalar of host programs, bound when the program \
                         runs; no parameter may take its name"
                    ),
                    ));
                }
                if params.iter().any(|(n, _)| *n == name) {
                    return Err(Diagnostic::at(
                        span,
                        format!("parameter `{name}` is given twice"),
                    ));
                }
                p.expect_punct("=", &format!("after parameter `{name}`"))?;
                let v = p.signed(&format!("the value of parameter `{name}`"))?;
                Ok((name, v))
            })?;
        self.bump();
        let mut devices = Vec::new();
        if self.at_ident("devices") {
            self.bump();
            self.expect_punct("(", "after `devices`")?;
            devices = self.device_list()?;
        }
        let mut roles = Vec::new();
        if self.at_ident("roles") {
            self.bump();
            self.expect_punct("(", "after `roles`")?;
            roles = self.comma_list(")", "between roles", |p, _| {
                let (word, span) = p.ident("a role `mesh` or `chunks`")?;
                let Some(role) = ParamRole::from_keyword(&word) else {
                    return Err(Diagnostic::at(
                        span,
                        format!("unknown parameter role `{word}` (expected `mesh` or `chunks`)"),
                    ));
                };
                p.expect_punct("=", &format!("after `{word}`"))?;
                let (name, span) = p.ident("a parameter name")?;
                if !params.iter().any(|(n, _)| *n == name) {
                    return Err(Diagnostic::at(
                        span,
                        format!("role `{word}` names `{name}`, which is not among the params"),
                    ));
                }
                Ok((role, name))
            })?;
            self.bump();
        }
        let sig = self.prog.signature.get_or_insert_with(Signature::default);
        sig.params = params;
        sig.devices = devices;
        sig.roles = roles;
        Ok(())
    }

    /// Device numbers separated by spaces, up to and including the closing `)`.
    pub(super) fn device_list(&mut self) -> PResult<Vec<i64>> {
        let mut devices = Vec::new();
        while !self.at_punct(")") {
            let (v, span) = self.unsigned("a device number")?;
            devices.push(
                i64::try_from(v)
                    .map_err(|_| Diagnostic::at(span, format!("device {v} is out of range")))?,
            );
        }
        self.bump();
        Ok(devices)
    }

    /// `inp: bf16[8, 8] [on [2](0 1)] split(outer(4, Stream, Serial), DIDx)`.
    pub(super) fn tensor_sig(&mut self) -> PResult<TensorSig> {
        let (name, _) = self.ident("the tensor's name")?;
        self.expect_punct(":", &format!("after `{name}`"))?;
        let (dt, span) = self.ident("a dtype such as `bf16`")?;
        let dtype = DType::from_name(&dt)
            .ok_or_else(|| Diagnostic::at(span, format!("unknown dtype `{dt}`")))?;
        self.expect_punct("[", "to open the global sizes")?;
        let global = self.comma_list("]", "between sizes", |p, _| {
            let (v, span) = p.unsigned("a size")?;
            usize::try_from(v)
                .map_err(|_| Diagnostic::at(span, format!("size {v} is out of range")))
        })?;
        self.bump();
        let mut mesh = None;
        if self.at_ident("on") {
            let on = self.bump();
            self.expect_punct("[", "to open the mesh shape")?;
            let shape = self.comma_list("]", "between mesh axes", |p, _| {
                let (v, span) = p.unsigned("a mesh axis size")?;
                usize::try_from(v).map_err(|_| {
                    Diagnostic::at(span, format!("mesh axis size {v} is out of range"))
                })
            })?;
            self.bump();
            self.expect_punct("(", "to open the mesh's devices")?;
            let devices = self.device_list()?;
            mesh = Some(
                DeviceMesh::new(shape, devices)
                    .map_err(|m| Diagnostic::at(on.span, format!("mesh of `{name}`: {m}")))?,
            );
        }
        self.expect_ident("split", "before the split trees of the axes")?;
        self.expect_punct("(", "after `split`")?;
        let axes = self.comma_list(")", "between axes", |p, _| p.axis_split(0))?;
        let close = self.bump();
        if axes.len() != global.len() {
            return Err(Diagnostic::at(
                close.span,
                format!(
                    "`{name}` has {} sizes but {} split trees",
                    global.len(),
                    axes.len()
                ),
            ));
        }
        Ok(TensorSig {
            name,
            dtype,
            shape: global,
            sharding: Sharding { mesh, axes },
        })
    }

    /// `Serial`, `DIDx`, … or `outer(F, TREE, TREE)` / `inner(F, TREE, TREE)`.
    pub(super) fn axis_split(&mut self, depth: usize) -> PResult<AxisSplit> {
        let (word, span) = self.ident("a parallel type or `outer(..)`/`inner(..)`")?;
        if depth > MAX_DEPTH {
            return Err(Diagnostic::at(span, "split tree nested too deeply"));
        }
        let kind = match word.as_str() {
            "outer" => SplitKind::Outer,
            "inner" => SplitKind::Inner,
            _ => {
                return ParallelType::from_name(&word)
                    .map(AxisSplit::Leaf)
                    .ok_or_else(|| {
                        Diagnostic::at(
                            span,
                            format!(
                                "expected a parallel type (`Serial`, `Stream`, `DIDx`, `DIDy`) or `outer(..)`/`inner(..)`, found `{}`",
                                clip(&word)
                            ),
                        )
                    })
            }
        };
        self.expect_punct("(", &format!("after `{word}`"))?;
        let (f, fspan) = self.unsigned("the split factor")?;
        let factor = usize::try_from(f)
            .ok()
            .filter(|f| *f > 0)
            .ok_or_else(|| Diagnostic::at(fspan, format!("split factor {f} is out of range")))?;
        self.expect_punct(",", "after the split factor")?;
        let outer = self.axis_split(depth + 1)?;
        self.expect_punct(",", "between the outer and the inner tree")?;
        let inner = self.axis_split(depth + 1)?;
        self.expect_punct(")", &format!("to close `{word}(`"))?;
        Ok(AxisSplit::Split {
            kind,
            factor,
            outer: Box::new(outer),
            inner: Box::new(inner),
        })
    }

    pub(super) fn check_kernels(&self) -> PResult<()> {
        let mut missing: Vec<(&String, Span)> = self
            .kernels
            .iter()
            .filter(|(_, (_, _, defined))| !defined)
            .map(|(n, (_, span, _))| (n, *span))
            .collect();
        missing.sort_by_key(|(_, s)| *s);
        match missing.first() {
            Some((name, span)) => Err(Diagnostic::at(
                *span,
                format!(
                    "kernel `{name}` is launched but has no block `{name}: fusion …` after the \
                     container"
                ),
            )),
            None => Ok(()),
        }
    }
}
