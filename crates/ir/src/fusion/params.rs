//! The fusion's parameters: declaring them, their roles and values, and evaluating
//! symbolic extents against them.

use crate::diag::{Diagnostic, IrResult};
use crate::domain::{ParallelType, SplitKind};
use crate::scalar::Scalar;
use crate::tensor::{ScheduleOp, TensorView};

use super::{Fusion, MeshSpec, Param, ParamRole};

impl Fusion {
    /// Declares a parameter. Fails on a duplicate name.
    pub fn add_param(&mut self, name: &str, default: Option<i64>) -> IrResult<()> {
        if let Some(builtin) = crate::scalar::Builtin::from_name(name) {
            return Err(Diagnostic::new(format!(
                "`{name}` is a built-in scalar of host programs ({}), so no parameter may take \
                 its name: it would stand for the built-in, not your value; rename the parameter",
                builtin.meaning()
            )));
        }
        if self.param_index.contains_key(name) {
            return Err(Diagnostic::new(format!("duplicate parameter `{name}`")));
        }
        self.param_index.insert(name.to_string(), self.params.len());
        self.params.push(Param {
            name: name.to_string(),
            default,
            value: default,
            role: None,
        });
        Ok(())
    }

    /// Declares that parameter `name` plays `role`. Fails for an unknown parameter, or when
    /// another parameter already plays that role.
    pub fn set_param_role(&mut self, name: &str, role: ParamRole) -> IrResult<()> {
        if let Some(other) = self
            .params
            .iter()
            .find(|p| p.role == Some(role) && p.name != name)
        {
            return Err(Diagnostic::new(format!(
                "parameters `{}` and `{name}` both declare the role `{}`",
                other.name,
                role.keyword()
            )));
        }
        match self.param_mut(name) {
            Some(p) => {
                p.role = Some(role);
                Ok(())
            }
            None => Err(Diagnostic::new(format!(
                "unknown parameter `{name}` (fusion `{}`)",
                self.name
            ))),
        }
    }

    /// Whether [`Fusion::serialize_streams`] would change anything: a schedule step that puts
    /// an axis on streams or rotates a stream loop, or a logical axis declared Stream.
    pub fn has_stream_axes(&self) -> bool {
        let streams = |op: &ScheduleOp| match op {
            ScheduleOp::Parallelize { parallel, .. } => *parallel == ParallelType::Stream,
            ScheduleOp::Swizzle1d { .. } => true,
            _ => op
                .as_split()
                .is_some_and(|(_, _, _, p)| p == Some(ParallelType::Stream)),
        };
        self.tensors
            .values()
            .any(|tv| tv.schedule.iter().any(|step| streams(&step.op)))
            || self
                .ids
                .values()
                .any(|id| id.parallel == ParallelType::Stream)
    }

    /// The distinct constant extents of the fusion's Stream axes, in increasing order (a ring
    /// written with one stream chunk per device has one: the device count).
    pub fn stream_axis_extents(&self) -> Vec<i64> {
        let mut out: Vec<i64> = self
            .ids
            .values()
            .filter(|id| id.parallel == ParallelType::Stream)
            .filter_map(|id| self.eval(&id.extent))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Runs every Stream axis serially: a split's `-> Stream` is dropped (the split stays,
    /// serial), `parallelize(axis, Stream)` and the `swizzle1d` steps (which only reorder a
    /// stream loop's chunks) are removed, and logical axes declared Stream become serial. The
    /// values are the same; the program is the one-chunk form of a fusion whose Stream axes
    /// have no chunk-count parameter to set to one (a ring written with one stream chunk per
    /// device lowers to its collective). Returns how many steps or axes changed (0: the
    /// fusion had no Stream axis).
    pub fn serialize_streams(&mut self) -> usize {
        if !self.has_stream_axes() {
            return 0;
        }
        let mut changed = 0;
        for tv in self.tensors.values_mut() {
            let before = tv.schedule.len();
            tv.schedule.retain(|step| {
                !matches!(
                    step.op,
                    ScheduleOp::Parallelize {
                        parallel: ParallelType::Stream,
                        ..
                    } | ScheduleOp::Swizzle1d { .. }
                )
            });
            changed += before - tv.schedule.len();
            for step in &mut tv.schedule {
                match &mut step.op {
                    ScheduleOp::OuterSplit { parallel, .. }
                    | ScheduleOp::InnerSplit { parallel, .. }
                        if *parallel == Some(ParallelType::Stream) =>
                    {
                        *parallel = None;
                        changed += 1;
                    }
                    _ => {}
                }
            }
        }
        for id in self.ids.values_mut() {
            if id.parallel == ParallelType::Stream {
                id.parallel = ParallelType::Serial;
                id.swizzle = None;
                changed += 1;
            }
        }
        changed
    }

    /// The parameter that plays `role`: the one declared with it, else the one its use
    /// implies, when exactly one does. A mesh size is the parameter that alone sizes a 1-D
    /// mesh (`devices(d)`); a chunk count is a parameter, sizing no mesh, that is the extent
    /// of a `Stream` loop axis as the tensors' schedules write them
    /// (`outer_split(0, s) -> Stream`, or `parallelize(0, Stream)` of an axis of extent `s`).
    /// `None` when no parameter, or more than one, fits.
    pub fn role_param(&self, role: ParamRole) -> Option<&Param> {
        if let Some(p) = self.params.iter().find(|p| p.role == Some(role)) {
            return Some(p);
        }
        let candidates: Vec<Scalar> = match role {
            ParamRole::MeshSize => self
                .mesh_order
                .iter()
                .filter_map(|m| match &self.meshes[*m].spec {
                    MeshSpec::Devices(dims) if dims.len() == 1 => dims.first().cloned(),
                    _ => None,
                })
                .collect(),
            ParamRole::ChunkCount => {
                let sizes_mesh = |n: &str| {
                    self.mesh_order.iter().any(|m| match &self.meshes[*m].spec {
                        MeshSpec::Devices(dims) => {
                            dims.iter().any(|d| d.symbols().iter().any(|s| &**s == n))
                        }
                        MeshSpec::Explicit { .. } => false,
                    })
                };
                self.tensors
                    .values()
                    .flat_map(|tv| self.stream_extents(tv))
                    .filter(|e| !matches!(e, Scalar::Named(n) if sizes_mesh(n)))
                    .collect()
            }
        };
        let mut found: Vec<&str> = Vec::new();
        for s in &candidates {
            if let Scalar::Named(n) = s {
                if !found.contains(&&**n) {
                    found.push(n);
                }
            }
        }
        match found.as_slice() {
            [one] => self.param(one),
            _ => None,
        }
    }

    /// The extents of the `Stream` loop axes a tensor's schedule writes, kept symbolic (the
    /// applied loop domain holds evaluated extents): the schedule's splits, merges, reorders
    /// and parallelizations replayed over the logical extents.
    fn stream_extents(&self, tv: &TensorView) -> Vec<Scalar> {
        let mut axes: Vec<(Scalar, ParallelType)> = tv
            .logical
            .iter()
            .map(|id| (self.ids[*id].extent.clone(), self.ids[*id].parallel))
            .collect();
        for step in &tv.schedule {
            if let Some((kind, axis, factor, parallel)) = step.op.as_split() {
                let Some((e, p)) = axes.get(axis).cloned() else {
                    return Vec::new();
                };
                let divided = e.ceil_div(factor.clone());
                let (o, i) = match kind {
                    SplitKind::Outer => (factor.clone(), divided),
                    SplitKind::Inner => (divided, factor.clone()),
                };
                axes[axis] = (o, parallel.unwrap_or(p));
                axes.insert(axis + 1, (i, p));
                continue;
            }
            match &step.op {
                // Replayed above.
                ScheduleOp::OuterSplit { .. } | ScheduleOp::InnerSplit { .. } => {}
                ScheduleOp::Merge { outer, inner } => {
                    let (Some(o), Some(i)) = (axes.get(*outer).cloned(), axes.get(*inner).cloned())
                    else {
                        return Vec::new();
                    };
                    axes[*outer] = (o.0.mul(i.0), o.1);
                    axes.remove(*inner);
                }
                ScheduleOp::Reorder { moves } => match crate::tensor::reordered(&axes, moves) {
                    Ok(r) => axes = r,
                    Err(_) => return Vec::new(),
                },
                ScheduleOp::Parallelize { axis, parallel } => {
                    if let Some(a) = axes.get_mut(*axis) {
                        a.1 = *parallel;
                    }
                }
                ScheduleOp::Swizzle1d { .. }
                | ScheduleOp::AllocationAsLoop
                | ScheduleOp::SetMesh(_)
                | ScheduleOp::SetMemory(_) => {}
            }
        }
        axes.into_iter()
            .filter(|(_, p)| *p == ParallelType::Stream)
            .map(|(e, _)| e)
            .collect()
    }

    /// Whether `value` for parameter `name` — the chunk count a runner is about to choose —
    /// keeps the data: every input and output holds as many elements with it as with the
    /// parameter's current value. A chunk count read off a logical axis
    /// (`x: f32[s, d, t / (s * d), h]`, `parallelize(0, Stream)`) only regroups the same
    /// rows, but one that sizes the data by itself (`x: f32[s, n, h]`: `s` micro-batches)
    /// or a chunk count that does not divide an extent (`t / (s * d)` rounding down) would
    /// run other data than the caller's. The error names the first tensor that changes.
    pub fn chunk_count_keeps_the_data(&self, name: &str, value: i64) -> IrResult<()> {
        let current = self.param_value(name);
        let sizes = |tv: &TensorView, v: Option<i64>| -> Vec<Option<i64>> {
            tv.logical
                .iter()
                .map(|id| {
                    self.ids[*id]
                        .extent
                        .eval(&|n| if n == name { v } else { self.param_value(n) })
                })
                .collect()
        };
        let count = |sizes: &[Option<i64>]| {
            sizes
                .iter()
                .try_fold(1i64, |acc, e| e.and_then(|e| acc.checked_mul(e)))
        };
        let show = |sizes: &[Option<i64>]| {
            let each: Vec<String> = sizes
                .iter()
                .map(|e| e.map_or("?".to_string(), |e| e.to_string()))
                .collect();
            format!("[{}]", each.join(", "))
        };
        for &t in self.inputs().iter().chain(self.outputs()) {
            let tv = self.tensor(t);
            let (now, then) = (sizes(tv, current), sizes(tv, Some(value)));
            if count(&now).is_none() || count(&now) != count(&then) {
                return Err(Diagnostic::new(format!(
                    "`{name}` = {value} would change the data, not its chunks: tensor `{}` is \
                     {} with `{name}` = {} and {} with `{name}` = {value}",
                    tv.name,
                    show(&now),
                    current.map_or("?".to_string(), |c| c.to_string()),
                    show(&then)
                )));
            }
        }
        Ok(())
    }

    /// Overrides a parameter's value (`--set name=value`). Must happen before the parameter
    /// is used; fails for an unknown name, listing the known ones.
    pub fn set_param(&mut self, name: &str, value: i64) -> IrResult<()> {
        if let Some(p) = self.param_mut(name) {
            p.value = Some(value);
            return Ok(());
        }
        let known: Vec<String> = self.params.iter().map(|p| p.name.clone()).collect();
        Err(Diagnostic::new(format!(
            "unknown parameter `{name}` (fusion `{}` has: {})",
            self.name,
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )))
    }

    /// All parameters in declaration order.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// The parameter `name`, if declared (constant time).
    pub fn param(&self, name: &str) -> Option<&Param> {
        self.param_index.get(name).and_then(|&i| self.params.get(i))
    }

    fn param_mut(&mut self, name: &str) -> Option<&mut Param> {
        let i = *self.param_index.get(name)?;
        self.params.get_mut(i)
    }

    /// The current value of a parameter.
    pub fn param_value(&self, name: &str) -> Option<i64> {
        self.param(name).and_then(|p| p.value)
    }

    /// Evaluates `s` with the current parameter values.
    pub fn eval(&self, s: &Scalar) -> Option<i64> {
        s.eval(&|n| self.param_value(n))
    }

    /// True if two extents are provably equal: structurally after simplification, or equal
    /// under the current parameter values.
    pub fn same_extent(&self, a: &Scalar, b: &Scalar) -> bool {
        if a == b {
            return true;
        }
        matches!((self.eval(a), self.eval(b)), (Some(x), Some(y)) if x == y)
    }

    /// Checks that every symbol of `s` is a declared parameter.
    pub fn check_symbols(&self, s: &Scalar) -> IrResult<()> {
        for sym in s.symbols() {
            if self.param(&sym).is_none() {
                return Err(Diagnostic::new(format!(
                    "undefined parameter `{sym}` in `{}`",
                    s.to_source()
                )));
            }
        }
        Ok(())
    }
}
