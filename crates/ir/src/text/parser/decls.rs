//! Parsing declarations: `mesh` statements (device lists and ids) and `tensor` inputs with
//! their dtype, shape, mesh and `drawn` clause.

use super::{plural, PResult, Parser, MAX_MESH_DEVICES};
use crate::diag::{Diagnostic, Span};
use crate::dtype::DType;
use crate::fusion::MeshSpec;
use crate::text::lexer::{Punct, Tok};

impl Parser {
    pub(super) fn mesh_decl(&mut self) -> PResult<()> {
        self.bump();
        let (name, span) = self.expect_ident("a mesh name after `mesh`")?;
        self.expect_punct(Punct::Eq, &format!("after mesh name `{name}`"))?;
        let spec = if self.is_ident("devices") {
            self.bump();
            self.expect_punct(Punct::LParen, "after `devices`")?;
            let mut dims = vec![self.expr()?];
            if self.eat_punct(Punct::Comma).is_some() {
                dims.push(self.expr()?);
            }
            self.expect_punct(Punct::RParen, "to close `devices(...)`")?;
            let mut total: u64 = 1;
            for d in &dims {
                self.check_scalar(d)?;
                if let Some(v) = self.fusion.eval(&d.value) {
                    total = total.saturating_mul(v.max(1).unsigned_abs());
                }
            }
            if total > MAX_MESH_DEVICES {
                return Err(Diagnostic::at(
                    span,
                    format!(
                        "mesh `{name}` has too many devices (at most {MAX_MESH_DEVICES} are supported)"
                    ),
                ));
            }
            MeshSpec::Devices(dims.into_iter().map(|d| d.value).collect())
        } else if self.is_punct(Punct::LBracket) {
            self.device_list(&name)?
        } else {
            return Err(self.unexpected(&format!(
                "`devices(...)` or a device list `[...]` after `mesh {name} =`"
            )));
        };
        let id = self
            .fusion
            .add_mesh(&name, spec)
            .map_err(|d| d.or_at(Some(span)))?;
        self.fusion.mesh_mut(id).span = Some(span);
        Ok(())
    }

    /// `[0, 1, 2]` or `[[0, 1], [2, 3]]`, the opening `[` being current.
    fn device_list(&mut self, name: &str) -> PResult<MeshSpec> {
        self.bump();
        if !self.is_punct(Punct::LBracket) {
            let devices = self.device_ids()?;
            return Ok(MeshSpec::Explicit {
                shape: vec![devices.len()],
                devices,
            });
        }
        let mut rows: Vec<(Vec<i64>, Span)> = Vec::new();
        loop {
            let row_span =
                self.expect_punct(Punct::LBracket, "to start a row of the device list")?;
            rows.push((self.device_ids()?, row_span));
            if self.eat_punct(Punct::Comma).is_some() {
                continue;
            }
            if self.eat_punct(Punct::RBracket).is_some() {
                break;
            }
            return Err(self.unexpected("`,` or `]` in the device list"));
        }
        let cols = rows.first().map_or(0, |r| r.0.len());
        for (i, (row, span)) in rows.iter().enumerate() {
            if row.len() != cols {
                return Err(Diagnostic::at(
                    *span,
                    format!(
                        "mesh `{name}`: row {i} has {} but row 0 has {}",
                        plural(row.len(), "device"),
                        plural(cols, "device")
                    ),
                ));
            }
        }
        let shape = vec![rows.len(), cols];
        let devices = rows.into_iter().flat_map(|r| r.0).collect();
        Ok(MeshSpec::Explicit { shape, devices })
    }

    /// `INT { ',' INT } ']'` (the `[` already consumed).
    fn device_ids(&mut self) -> PResult<Vec<i64>> {
        let mut v = Vec::new();
        loop {
            v.push(self.expect_int("a device id (a non-negative integer)")?.0);
            if self.eat_punct(Punct::Comma).is_some() {
                continue;
            }
            if self.eat_punct(Punct::RBracket).is_some() {
                return Ok(v);
            }
            return Err(self.unexpected("`,` or `]` in the device list"));
        }
    }

    pub(super) fn tensor_decl(&mut self) -> PResult<()> {
        self.bump();
        let (name, span) = self.expect_ident("a tensor name after `tensor`")?;
        self.check_new_tensor_name(&name, span)?;
        self.expect_punct(Punct::Colon, &format!("after tensor name `{name}`"))?;
        let dtype = self.dtype()?;
        self.expect_punct(Punct::LBracket, &format!("to start the shape of `{name}`"))?;
        let mut extents = Vec::new();
        if self.eat_punct(Punct::RBracket).is_none() {
            loop {
                let e = self.expr()?;
                self.check_scalar(&e)?;
                self.check_positive(&e, || {
                    format!("tensor `{name}` axis {}: extent", extents.len())
                })?;
                extents.push(e.value);
                if self.eat_punct(Punct::Comma).is_some() {
                    continue;
                }
                if self.eat_punct(Punct::RBracket).is_some() {
                    break;
                }
                return Err(self.unexpected(&format!("`,` or `]` in the shape of `{name}`")));
            }
        }
        let mesh = if self.is_ident("on") {
            self.bump();
            let (m, mspan) = self.expect_ident("a mesh name after `on`")?;
            Some(self.mesh_named(&m, mspan)?)
        } else {
            None
        };
        let draw = if self.is_ident("drawn") {
            self.bump();
            Some(self.draw(&name, dtype)?)
        } else {
            None
        };
        let t = self
            .fusion
            .add_input(&name, dtype, extents, mesh)
            .map_err(|d| d.or_at(Some(span)))?;
        self.fusion.tensor_mut(t).span = Some(span);
        if let Some(draw) = draw {
            self.fusion.set_draw(t, draw);
        }
        Ok(())
    }

    /// `uniform(lo, hi)` or `const(v)` after `drawn` (numbers, optionally negative): how the
    /// generated values of input `name` are drawn.
    fn draw(&mut self, name: &str, dtype: DType) -> PResult<crate::fusion::Draw> {
        use crate::fusion::Draw;
        let what = format!("`uniform(lo, hi)` or `const(v)` after `drawn` for `{name}`");
        let (kind, kspan) = self.expect_ident(&what)?;
        if kind != "uniform" && kind != "const" {
            return Err(Diagnostic::at(kspan, format!(
                "unknown draw `{kind}` for `{name}`: expected `uniform(lo, hi)` (uniform in [lo, hi)) or `const(v)`"
            )));
        }
        self.expect_punct(Punct::LParen, &format!("after `{kind}`"))?;
        let mut values = Vec::new();
        loop {
            let start = self.peek().span;
            let negative = self.eat_punct(Punct::Minus).is_some();
            let v = match self.peek().tok.clone() {
                Tok::Int(t) | Tok::Float(t) => t.parse::<f64>().ok(),
                _ => None,
            };
            let Some(v) = v else {
                return Err(self.unexpected(&format!("a number in `{kind}(…)`")));
            };
            self.bump();
            let v = if negative { -v } else { v };
            if !v.is_finite() {
                return Err(Diagnostic::at(
                    start,
                    format!("`{kind}` of `{name}` needs finite numbers"),
                ));
            }
            values.push(v);
            if self.eat_punct(Punct::Comma).is_some() {
                continue;
            }
            self.expect_punct(Punct::RParen, &format!("to close `{kind}(`"))?;
            break;
        }
        let draw = match (kind.as_str(), values.as_slice()) {
            ("uniform", &[lo, hi]) if lo < hi => Draw::Uniform(lo, hi),
            ("uniform", &[lo, hi]) => {
                return Err(Diagnostic::at(
                    kspan,
                    format!("`uniform({lo}, {hi})` of `{name}` is empty: lo must be below hi"),
                ))
            }
            ("const", &[v]) => Draw::Const(v),
            _ => {
                return Err(Diagnostic::at(
                    kspan,
                    format!(
                        "`{kind}` of `{name}` takes {} number(s), got {}",
                        if kind == "uniform" { 2 } else { 1 },
                        values.len()
                    ),
                ))
            }
        };
        if matches!(dtype, DType::Bool) {
            return Err(Diagnostic::at(
                kspan,
                format!("`{name}` is bool: its values are drawn 0 or 1, not from `{kind}`"),
            ));
        }
        Ok(draw)
    }
}
