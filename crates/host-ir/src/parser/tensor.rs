//! Tensors: names (`T3`, declared at first mention as `T3_g_f32[4]`) and the statements that
//! define one (`T3 = ALLOCATE(..)`, `ShardByStream`, `matmul`, `linear`).

use weave_ir::{DType, Diagnostic, MemoryType};

use super::{PResult, Parser};
use crate::builder::ScopeRef;
use crate::ids::{HostTensorId, StmtId};
use crate::lexer::{clip, Tok};
use crate::syntax::{ChunkOf, Stmt};

impl Parser<'_> {
    /// `T3 = ALLOCATE(..)`, `T3 = ShardByStream(..)`, `T3 = matmul(..)`, `T3 += matmul(..)`,
    /// `T3 = linear(..)`, `T3 += linear(..)`.
    pub(super) fn tensor_statement(&mut self, scope: ScopeRef) -> PResult<StmtId> {
        let out = self.tensor_ref("a tensor")?;
        // `T4 += matmul(..)`, `T4 += linear(..)`: an accumulating GEMM.
        let accumulate = if self.at_punct("+") {
            self.bump();
            self.expect_punct("=", "after `+` (an accumulating `T… += matmul(..)`)")?;
            true
        } else {
            self.expect_punct("=", "after the tensor a statement defines")?;
            false
        };
        let t = self.bump();
        let op = match &t.tok {
            Tok::Ident(op) => op.clone(),
            _ => String::new(),
        };
        if accumulate && op != "matmul" && op != "linear" {
            return self.err(
                &t,
                "`matmul` or `linear` after `T… +=` (only a GEMM accumulates)",
            );
        }
        let stmt = match op.as_str() {
            "ALLOCATE" => self.allocate(out)?,
            "ShardByStream" => self.shard_by_stream(out)?,
            "matmul" => self.matmul(out, accumulate)?,
            "linear" => self.linear(out, accumulate)?,
            _ => {
                return self.err(
                    &t,
                    "`ALLOCATE`, `ShardByStream`, `matmul` or `linear` after `T… =`",
                )
            }
        };
        Ok(self.add(scope, stmt))
    }

    /// `ALLOCATE(mem_type=…, zero_init=…)`, after `out =`.
    fn allocate(&mut self, out: HostTensorId) -> PResult<Stmt> {
        self.expect_punct("(", "after `ALLOCATE`")?;
        self.expect_key("mem_type", "as the first field of `ALLOCATE`")?;
        let (mem, span) = self.named(
            "a memory type (`global`, `local`, `symmetric`)",
            "memory type",
            "`global`, `local` or `symmetric`",
            MemoryType::from_name,
        )?;
        let declared = self.prog.tensors.get(out).map(|t| t.memory);
        if let Some(declared) = declared.filter(|d| *d != mem) {
            return Err(Diagnostic::at(
                span,
                format!(
                    "`mem_type={}` does not match the tensor's type, which says `{}`",
                    mem.name(),
                    declared.short()
                ),
            ));
        }
        self.expect_punct(",", "after the memory type")?;
        self.expect_key("zero_init", "after the memory type")?;
        let (b, span) = self.ident("`true` or `false`")?;
        let zero_init = match b.as_str() {
            "true" => true,
            "false" => false,
            _ => {
                return Err(Diagnostic::at(
                    span,
                    format!("expected `true` or `false`, found `{}`", clip(&b)),
                ))
            }
        };
        self.expect_punct(")", "to close `ALLOCATE(`")?;
        Ok(Stmt::Allocate {
            tensor: out,
            zero_init,
        })
    }

    /// `ShardByStream(T2, axis=…, chunks=…, stream_index=…[, holds=(..)])`, after `out =`:
    /// `out` becomes a view of `T2`.
    fn shard_by_stream(&mut self, out: HostTensorId) -> PResult<Stmt> {
        self.expect_punct("(", "after `ShardByStream`")?;
        let input = self.tensor_ref("the tensor to cut into chunks")?;
        self.expect_punct(",", "after the tensor")?;
        self.expect_key("axis", "after the tensor")?;
        let (axis, span) = self.unsigned("an axis number")?;
        let axis = usize::try_from(axis)
            .map_err(|_| Diagnostic::at(span, format!("axis `{axis}` is out of range")))?;
        let chunks = self.scalar_field("chunks", "after the axis")?;
        let index = self.scalar_field("stream_index", "after the number of chunks")?;
        let holds = if self.at_punct(",") {
            self.expect_punct(",", "after the stream index")?;
            self.expect_key("holds", "after the stream index")?;
            self.expect_punct("(", "after `holds=`")?;
            self.expect_key("chunk", "after `holds=(`")?;
            let chunk = self.scalar()?;
            let chunks = self.scalar_field("chunks", "after the chunk held")?;
            let extent = self.scalar_field("extent", "after the number of chunks held")?;
            self.expect_punct(")", "to close `holds=(`")?;
            Some(ChunkOf {
                chunk,
                chunks,
                extent,
            })
        } else {
            None
        };
        self.expect_punct(")", "to close `ShardByStream(`")?;
        Ok(Stmt::ShardByStream {
            input,
            axis,
            chunks,
            index,
            holds,
            output: out,
        })
    }

    /// `matmul(A, B)`, after `out =` or (accumulating) `out +=`.
    fn matmul(&mut self, out: HostTensorId, accumulate: bool) -> PResult<Stmt> {
        self.expect_punct("(", "after `matmul`")?;
        let a = self.tensor_ref("the left operand")?;
        self.expect_punct(",", "after the left operand")?;
        let b = self.tensor_ref("the right operand")?;
        self.expect_punct(")", "to close `matmul(`")?;
        Ok(Stmt::Matmul {
            a,
            b,
            out,
            accumulate,
        })
    }

    /// `linear(X, W[, bias])`, after `out =` or (accumulating) `out +=`.
    fn linear(&mut self, out: HostTensorId, accumulate: bool) -> PResult<Stmt> {
        self.expect_punct("(", "after `linear`")?;
        let input = self.tensor_ref("the activations")?;
        self.expect_punct(",", "after the activations")?;
        let weight = self.tensor_ref("the weight")?;
        let mut bias = None;
        if self.at_punct(",") {
            self.bump();
            bias = Some(self.tensor_ref("the bias")?);
        }
        self.expect_punct(")", "or `,` with a bias to close `linear(`")?;
        Ok(Stmt::Linear {
            input,
            weight,
            bias,
            out,
            accumulate,
        })
    }

    // ----- names ------------------------------------------------------------------------------

    /// `T3`, or at a tensor's first mention `T3_g_f32[4, ( ceilDiv(t, 3) )]`.
    pub(super) fn tensor_ref(&mut self, what: &str) -> PResult<HostTensorId> {
        let t = self.bump();
        let Tok::Ident(word) = &t.tok else {
            return self.err(&t, &format!("{what} (a tensor such as `T3`)"));
        };
        let (name, ty) = match split_tensor_name(word) {
            Some(Ok(parts)) => parts,
            Some(Err(m)) => return Err(Diagnostic::at(t.span, m)),
            None => return self.err(&t, &format!("{what} (a tensor such as `T3`)")),
        };
        match ty {
            Some((memory, dtype)) => {
                self.expect_punct("[", &format!("with the sizes of `{name}`"))?;
                let mut sizes = Vec::new();
                if !self.at_punct("]") {
                    loop {
                        sizes.push(self.scalar()?);
                        if self.at_punct(",") {
                            self.bump();
                            continue;
                        }
                        break;
                    }
                }
                self.expect_punct("]", "or `,` in the sizes")?;
                if self.tensors.contains_key(name) {
                    return Err(Diagnostic::at(
                        t.span,
                        format!(
                            "`{name}` is declared again; after its first mention a tensor is \
                             written bare (`{name}`)"
                        ),
                    ));
                }
                let id = self.prog.new_tensor_sized(dtype, sizes, memory);
                self.tensors.insert(name.to_string(), id);
                Ok(id)
            }
            None => match self.tensors.get(name) {
                Some(id) => Ok(*id),
                None => Err(Diagnostic::at(
                    t.span,
                    format!(
                        "`{name}` is used before its type is declared; its first mention must \
                         read like `{name}_g_f32[4, 8]`"
                    ),
                )),
            },
        }
    }
}

pub(super) type TensorName<'a> = (&'a str, Option<(MemoryType, DType)>);

/// Splits `T3` or `T3_g_bf16` into the name and the type. `None` when the word is not a
/// tensor name at all; `Some(Err(..))` when it is one with a malformed type.
pub(super) fn split_tensor_name(word: &str) -> Option<Result<TensorName<'_>, String>> {
    let rest = word.strip_prefix('T')?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let (name, suffix) = word.split_at(1 + digits);
    if suffix.is_empty() {
        return Some(Ok((name, None)));
    }
    let suffix = suffix.strip_prefix('_')?;
    let Some((mem, dtype)) = suffix.split_once('_') else {
        return Some(Err(format!(
            "expected a tensor type such as `{name}_g_f32`, found `{}`",
            clip(word)
        )));
    };
    let memory = match mem {
        "g" => MemoryType::Global,
        "l" => MemoryType::Local,
        "sym" => MemoryType::Symmetric,
        _ => {
            return Some(Err(format!(
                "unknown memory type `{}` in `{}` (expected `g`, `l` or `sym`)",
                clip(mem),
                clip(word)
            )))
        }
    };
    let Some(dtype) = DType::from_name(dtype) else {
        let all: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
        return Some(Err(format!(
            "unknown dtype `{}` in `{}` (expected one of {})",
            clip(dtype),
            clip(word),
            all.join(", ")
        )));
    };
    Some(Ok((name, Some((memory, dtype)))))
}
