//! The fusion arena and its builder API: parameters, meshes, inputs, ops with shape and dtype
//! inference, outputs. Program order is kept in vectors, never in arena order.

use slotmap::{SecondaryMap, SlotMap};

use crate::diag::{Diagnostic, IrResult, Span};
use crate::domain::{IdExpr, IterDomain, IterType, ParallelType, SplitKind};
use crate::dtype::DType;
use crate::expr::{BinaryOp, Expr, ExprKind, Literal, ReduceOp, UnaryOp};
use crate::ids::{ExprId, IdExprId, IterDomainId, MeshId, TensorId};
use crate::mesh::DeviceMesh;
use crate::scalar::Scalar;
use crate::tensor::{MemoryType, ScheduleOp, TensorView};

/// A named parameter with an optional default and its current value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    /// The name, usable in extents, split factors and meshes.
    pub name: String,
    /// The default written in the signature.
    pub default: Option<i64>,
    /// The value in effect (default or override); `None` until one is given.
    pub value: Option<i64>,
    /// What the runtime uses the parameter for, when the fusion declares it (`d: mesh = 2`);
    /// [`Fusion::role_param`] also derives undeclared roles from use.
    pub role: Option<ParamRole>,
}

/// What a runner sets a parameter to: the number of devices of the mesh, or the number of
/// chunks the stream loops cut their axis into. A fusion says which parameter plays which
/// role (`fusion f(t = 8, d: mesh = 2, s: chunks = 4)`), so a runner never guesses by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamRole {
    /// The device count of the fusion's (1-D) mesh: a runner sets it to its rank count.
    MeshSize,
    /// The number of stream chunks: a runner sets it from `--chunks` or the cost model.
    ChunkCount,
}

impl ParamRole {
    /// Both roles.
    pub const ALL: [ParamRole; 2] = [ParamRole::MeshSize, ParamRole::ChunkCount];

    /// The keyword of the `.weave` header (`d: mesh`, `s: chunks`).
    pub fn keyword(self) -> &'static str {
        match self {
            ParamRole::MeshSize => "mesh",
            ParamRole::ChunkCount => "chunks",
        }
    }

    /// The role named by a header keyword.
    pub fn from_keyword(word: &str) -> Option<ParamRole> {
        ParamRole::ALL.into_iter().find(|r| r.keyword() == word)
    }
}

/// How a mesh was written, kept for the `.weave` printer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MeshSpec {
    /// `devices(n)` or `devices(rows, cols)`: devices `0..` laid out in that shape.
    Devices(Vec<Scalar>),
    /// `[0, 2, 4]` or `[[0, 1], [2, 3]]`.
    Explicit {
        /// Shape of the literal.
        shape: Vec<usize>,
        /// Device ids, row-major.
        devices: Vec<i64>,
    },
}

/// A named mesh of the fusion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshDecl {
    /// The name used by `on m` and `mesh = m`.
    pub name: String,
    /// How it was written.
    pub spec: MeshSpec,
    /// The evaluated mesh.
    pub mesh: DeviceMesh,
    /// Where it was declared.
    pub span: Option<Span>,
}

/// A whole tensor program: global shapes, annotations, ops in program order.
#[derive(Clone, Debug, Default)]
pub struct Fusion {
    /// The fusion's name.
    pub name: String,
    params: Vec<Param>,
    /// Each parameter's index in `params`, for lookups in constant time.
    param_index: std::collections::HashMap<String, usize>,
    meshes: SlotMap<MeshId, MeshDecl>,
    mesh_order: Vec<MeshId>,
    ids: SlotMap<IterDomainId, IterDomain>,
    id_exprs: SlotMap<IdExprId, IdExpr>,
    tensors: SlotMap<TensorId, TensorView>,
    /// Tensor names as the builder gave them, for lookups in constant time.
    names: std::collections::HashMap<String, TensorId>,
    exprs: SlotMap<ExprId, Expr>,
    inputs: Vec<TensorId>,
    outputs: Vec<TensorId>,
    order: Vec<ExprId>,
    /// The readers of each tensor in program order: built on the first [`Fusion::uses`] and
    /// dropped by every change to the exprs or their order.
    uses_index: std::sync::OnceLock<SecondaryMap<TensorId, Vec<ExprId>>>,
    /// How generated values of some inputs are drawn ([`Fusion::set_draw`]).
    draws: Vec<(TensorId, Draw)>,
}

/// How the generated values of an input are drawn, where the program says (`tensor x:
/// f32[n] drawn uniform(0.5, 2)`): a run that makes up its inputs (`weave run`,
/// `Executable::random_inputs`) draws them so, rounded to the input's dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Draw {
    /// Uniform in `[lo, hi)`.
    Uniform(f64, f64),
    /// Every element this value.
    Const(f64),
}

impl Draw {
    /// The text form after `drawn`: `uniform(lo, hi)` or `const(v)`.
    pub fn source(&self) -> String {
        match self {
            Draw::Uniform(lo, hi) => format!("uniform({lo:?}, {hi:?})"),
            Draw::Const(v) => format!("const({v:?})"),
        }
    }
}

impl Fusion {
    /// Says how the generated values of input `t` are drawn ([`Draw`]); replaces an earlier
    /// draw of `t`.
    pub fn set_draw(&mut self, t: TensorId, draw: Draw) {
        self.draws.retain(|(u, _)| *u != t);
        self.draws.push((t, draw));
    }

    /// How the generated values of `t` are drawn, where the program says.
    pub fn draw(&self, t: TensorId) -> Option<Draw> {
        self.draws.iter().find(|(u, _)| *u == t).map(|(_, d)| *d)
    }

    /// An empty fusion.
    pub fn new(name: &str) -> Fusion {
        Fusion {
            name: name.to_string(),
            ..Fusion::default()
        }
    }

    // ----- parameters -------------------------------------------------------------------

    /// Declares a parameter. Fails on a duplicate name.
    pub fn add_param(&mut self, name: &str, default: Option<i64>) -> IrResult<()> {
        if crate::scalar::RESERVED_NAMES.contains(&name) {
            return Err(Diagnostic::new(format!(
                "`{name}` is a built-in scalar of host programs ({}), so no parameter may take \
                 its name: it would stand for the built-in, not your value; rename the parameter",
                if name == crate::scalar::RANK {
                    "the running device's rank"
                } else {
                    "the size of each rank's stream pool"
                }
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
            match &step.op {
                ScheduleOp::OuterSplit {
                    axis,
                    factor,
                    parallel,
                }
                | ScheduleOp::InnerSplit {
                    axis,
                    factor,
                    parallel,
                } => {
                    let Some((e, p)) = axes.get(*axis).cloned() else {
                        return Vec::new();
                    };
                    let divided = e.ceil_div(factor.clone());
                    let (o, i) = match step.op {
                        ScheduleOp::OuterSplit { .. } => (factor.clone(), divided),
                        _ => (divided, factor.clone()),
                    };
                    axes[*axis] = (o, parallel.unwrap_or(p));
                    axes.insert(axis + 1, (i, p));
                }
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

    // ----- meshes -----------------------------------------------------------------------

    /// Declares a mesh, evaluating `spec` with the current parameter values.
    pub fn add_mesh(&mut self, name: &str, spec: MeshSpec) -> IrResult<MeshId> {
        if self.mesh_by_name(name).is_some() {
            return Err(Diagnostic::new(format!("duplicate mesh `{name}`")));
        }
        let mesh = match &spec {
            MeshSpec::Devices(dims) => {
                let mut shape = Vec::new();
                for d in dims {
                    self.check_symbols(d)?;
                    let v = self.eval(d).ok_or_else(|| {
                        Diagnostic::new(format!(
                            "mesh `{name}`: `{}` has no value (give the parameter a default or --set it)",
                            d.to_source()
                        ))
                    })?;
                    if v <= 0 {
                        return Err(Diagnostic::new(format!(
                            "mesh `{name}`: size `{}` = {v} must be positive",
                            d.to_source()
                        )));
                    }
                    shape.push(v as usize);
                }
                let n: usize = shape.iter().product();
                DeviceMesh::new(shape, (0..n as i64).collect())
            }
            MeshSpec::Explicit { shape, devices } => DeviceMesh::new(shape.clone(), devices.clone()),
        }
        .map_err(|e| Diagnostic::new(format!("mesh `{name}`: {e}")))?;
        let id = self.meshes.insert(MeshDecl {
            name: name.to_string(),
            spec,
            mesh,
            span: None,
        });
        self.mesh_order.push(id);
        Ok(id)
    }

    /// Meshes in declaration order.
    pub fn meshes(&self) -> &[MeshId] {
        &self.mesh_order
    }

    /// A mesh declaration.
    pub fn mesh(&self, id: MeshId) -> &MeshDecl {
        &self.meshes[id]
    }

    /// A mesh declaration, mutably (to record its span).
    pub fn mesh_mut(&mut self, id: MeshId) -> &mut MeshDecl {
        &mut self.meshes[id]
    }

    /// Looks a mesh up by name.
    pub fn mesh_by_name(&self, name: &str) -> Option<MeshId> {
        self.mesh_order
            .iter()
            .copied()
            .find(|m| self.meshes[*m].name == name)
    }

    /// The mesh of a tensor, if it has one.
    pub fn mesh_of(&self, t: TensorId) -> Option<&DeviceMesh> {
        self.tensors[t].mesh.map(|m| &self.meshes[m].mesh)
    }

    // ----- arena access -----------------------------------------------------------------

    /// A tensor.
    pub fn tensor(&self, id: TensorId) -> &TensorView {
        &self.tensors[id]
    }

    /// A tensor, mutably.
    pub fn tensor_mut(&mut self, id: TensorId) -> &mut TensorView {
        &mut self.tensors[id]
    }

    /// An iter domain.
    pub fn id(&self, id: IterDomainId) -> &IterDomain {
        &self.ids[id]
    }

    /// An iter domain, mutably.
    pub fn id_mut(&mut self, id: IterDomainId) -> &mut IterDomain {
        &mut self.ids[id]
    }

    /// Adds an iter domain.
    pub fn new_id(&mut self, id: IterDomain) -> IterDomainId {
        self.ids.insert(id)
    }

    /// An id transform.
    pub fn id_expr(&self, id: IdExprId) -> &IdExpr {
        &self.id_exprs[id]
    }

    /// Splits `input`, recording the transform. Extents: outer split by `f` gives
    /// `[f, ceilDiv(e, f)]`, inner split `[ceilDiv(e, f), f]`. Both outputs inherit the
    /// input's iter type and parallel type.
    pub fn split_id(
        &mut self,
        input: IterDomainId,
        factor: Scalar,
        kind: SplitKind,
    ) -> (IterDomainId, IterDomainId) {
        let src = self.ids[input].clone();
        let divided = src.extent.clone().ceil_div(factor.clone());
        let (oe, ie) = match kind {
            SplitKind::Outer => (factor.clone(), divided),
            SplitKind::Inner => (divided, factor.clone()),
        };
        let mk = |extent| IterDomain {
            extent,
            iter_type: src.iter_type,
            parallel: src.parallel,
            rfactor: false,
            swizzle: None,
            definition: None,
        };
        let outer = self.ids.insert(mk(oe));
        let inner = self.ids.insert(mk(ie));
        let e = self.id_exprs.insert(IdExpr::Split {
            input,
            outer,
            inner,
            factor,
            kind,
        });
        self.ids[outer].definition = Some(e);
        self.ids[inner].definition = Some(e);
        (outer, inner)
    }

    /// Merges `outer` and `inner` into one axis of the product extent, recording the
    /// transform. The result takes the outer's parallel type; it is a reduction if either
    /// input is, iteration if either is, broadcast only if both are.
    pub fn merge_ids(&mut self, outer: IterDomainId, inner: IterDomainId) -> IterDomainId {
        let (o, i) = (&self.ids[outer], &self.ids[inner]);
        let iter_type = match (o.iter_type, i.iter_type) {
            (IterType::Reduction, _) | (_, IterType::Reduction) => IterType::Reduction,
            (IterType::Broadcast, IterType::Broadcast) => IterType::Broadcast,
            _ => IterType::Iteration,
        };
        let out = IterDomain {
            extent: o.extent.clone().mul(i.extent.clone()),
            iter_type,
            parallel: o.parallel,
            rfactor: false,
            swizzle: None,
            definition: None,
        };
        let output = self.ids.insert(out);
        let e = self.id_exprs.insert(IdExpr::Merge {
            outer,
            inner,
            output,
        });
        self.ids[output].definition = Some(e);
        output
    }

    /// Every tensor: inputs first, then expr outputs in program order.
    pub fn tensors_in_order(&self) -> Vec<TensorId> {
        let mut v = self.inputs.clone();
        for e in &self.order {
            v.extend(self.exprs[*e].outputs.iter().copied());
        }
        v
    }

    /// Fusion inputs in declaration order.
    pub fn inputs(&self) -> &[TensorId] {
        &self.inputs
    }

    /// Fusion outputs in declaration order.
    pub fn outputs(&self) -> &[TensorId] {
        &self.outputs
    }

    /// Exprs in program (topological) order.
    pub fn exprs(&self) -> &[ExprId] {
        &self.order
    }

    /// An expr.
    pub fn expr(&self, id: ExprId) -> &Expr {
        &self.exprs[id]
    }

    /// An expr, mutably.
    pub fn expr_mut(&mut self, id: ExprId) -> &mut Expr {
        self.uses_index = std::sync::OnceLock::new();
        &mut self.exprs[id]
    }

    /// Moves `e` to just before `anchor` in program order. Passes that insert an op between
    /// existing ones build it with [`Fusion::add_op`] (which appends) and then move it; they
    /// keep the order topological (the verifier checks it). Does nothing when `e` or `anchor`
    /// is not in the program, or when they are the same expr.
    pub fn move_expr_before(&mut self, e: ExprId, anchor: ExprId) {
        if e == anchor || !self.order.contains(&anchor) {
            return;
        }
        let Some(from) = self.order.iter().position(|x| *x == e) else {
            return;
        };
        self.uses_index = std::sync::OnceLock::new();
        self.order.remove(from);
        let to = self
            .order
            .iter()
            .position(|x| *x == anchor)
            .expect("anchor is in the order");
        self.order.insert(to, e);
    }

    /// True for fusion inputs.
    pub fn is_input(&self, t: TensorId) -> bool {
        self.inputs.contains(&t)
    }

    /// True for fusion outputs.
    pub fn is_output(&self, t: TensorId) -> bool {
        self.outputs.contains(&t)
    }

    /// The exprs that read `t`, in program order.
    pub fn uses(&self, t: TensorId) -> Vec<ExprId> {
        let index = self.uses_index.get_or_init(|| {
            let mut index: SecondaryMap<TensorId, Vec<ExprId>> = SecondaryMap::new();
            for &e in &self.order {
                let mut seen: Vec<TensorId> = Vec::new();
                for &i in &self.exprs[e].inputs {
                    // An expr reading a tensor twice is one use.
                    if !seen.contains(&i) {
                        seen.push(i);
                        match index.get_mut(i) {
                            Some(uses) => uses.push(e),
                            None => {
                                index.insert(i, vec![e]);
                            }
                        }
                    }
                }
            }
            index
        });
        index.get(t).cloned().unwrap_or_default()
    }

    /// Looks a tensor up by its user name.
    pub fn tensor_by_name(&self, name: &str) -> Option<TensorId> {
        // The index of the names the builder gave, checked against the tensor (a name is a
        // public field, so a pass or test may have renamed it since); a miss scans.
        if let Some(&t) = self.names.get(name) {
            if self.tensors.get(t).is_some_and(|tv| tv.name == name) && self.is_placed(t) {
                return Some(t);
            }
        }
        self.tensors_in_order()
            .into_iter()
            .find(|t| self.tensors[*t].name == name)
    }

    /// Whether the builder gave a tensor of the fusion the name `name` (an index lookup:
    /// what the builder's duplicate-name check asks; a tensor renamed through
    /// [`Fusion::tensor_mut`] is judged by the verifier's unique-name rule instead).
    pub fn has_builder_name(&self, name: &str) -> bool {
        self.names
            .get(name)
            .is_some_and(|t| self.tensors.get(*t).is_some_and(|tv| tv.name == name))
    }

    /// True for a fusion input or a tensor some expr of the program outputs (every expr of
    /// the arena is in the program order: exprs are appended and moved, never dropped).
    fn is_placed(&self, t: TensorId) -> bool {
        self.is_input(t)
            || self.tensors[t]
                .definition
                .is_some_and(|e| self.exprs.get(e).is_some_and(|ex| ex.outputs.contains(&t)))
    }

    /// A name not used by any tensor, built from `base` (`base`, `base_1`, ...).
    pub fn fresh_name(&self, base: &str) -> String {
        if self.tensor_by_name(base).is_none() {
            return base.to_string();
        }
        (1..)
            .map(|i| format!("{base}_{i}"))
            .find(|n| self.tensor_by_name(n).is_none())
            .unwrap_or_default()
    }

    /// The logical axes of `t` that are materialized (reductions excluded): the axes users
    /// count when they write `sum(x, [1])`.
    pub fn visible_axes(&self, t: TensorId) -> Vec<IterDomainId> {
        self.tensors[t]
            .logical
            .iter()
            .copied()
            .filter(|i| self.ids[*i].iter_type != IterType::Reduction)
            .collect()
    }

    // ----- building ---------------------------------------------------------------------

    fn check_new_name(&self, name: &str) -> IrResult<()> {
        if self.has_builder_name(name) {
            return Err(Diagnostic::new(format!("duplicate tensor name `{name}`")));
        }
        if self.param(name).is_some() {
            return Err(Diagnostic::new(format!(
                "tensor name `{name}` is already a parameter"
            )));
        }
        Ok(())
    }

    fn new_tensor(&mut self, name: &str, dtype: DType, logical: Vec<IterDomainId>) -> TensorId {
        let t = self.tensors.insert(TensorView {
            name: name.to_string(),
            dtype,
            loop_domain: logical.clone(),
            logical,
            root: None,
            allocation: None,
            mesh: None,
            memory: MemoryType::Global,
            definition: None,
            schedule: Vec::new(),
            span: None,
        });
        self.names.insert(name.to_string(), t);
        t
    }

    /// Declares a fusion input of global shape `extents`.
    pub fn add_input(
        &mut self,
        name: &str,
        dtype: DType,
        extents: Vec<Scalar>,
        mesh: Option<MeshId>,
    ) -> IrResult<TensorId> {
        self.check_new_name(name)?;
        let mut logical = Vec::new();
        for (axis, e) in extents.into_iter().enumerate() {
            self.check_symbols(&e)?;
            if let Some(v) = self.eval(&e) {
                if v <= 0 {
                    return Err(Diagnostic::new(format!(
                        "tensor `{name}` axis {axis}: extent `{}` = {v} must be positive",
                        e.to_source()
                    )));
                }
            }
            logical.push(self.ids.insert(IterDomain::new(e, IterType::Iteration)));
        }
        let t = self.new_tensor(name, dtype, logical);
        self.tensors[t].mesh = mesh;
        self.inputs.push(t);
        Ok(t)
    }

    /// Marks `t` as a fusion output.
    pub fn add_output(&mut self, t: TensorId) -> IrResult<()> {
        if self.outputs.contains(&t) {
            return Err(Diagnostic::new(format!(
                "tensor `{}` is already an output",
                self.tensors[t].name
            )));
        }
        self.outputs.push(t);
        Ok(())
    }

    fn fresh_copy(&mut self, id: IterDomainId) -> IterDomainId {
        let src = &self.ids[id];
        let fresh = IterDomain::new(src.extent.clone(), src.iter_type);
        self.ids.insert(fresh)
    }

    fn desc(&self, t: TensorId) -> String {
        let tv = &self.tensors[t];
        let dims: Vec<String> = self
            .visible_axes(t)
            .iter()
            .map(|i| self.ids[*i].extent.to_source())
            .collect();
        format!("`{}` ({}[{}])", tv.name, tv.dtype, dims.join(", "))
    }

    /// Broadcast-aware pointwise shape: same rank; per axis equal extents, or one side a
    /// broadcast.
    fn pointwise_axes(&mut self, op: &str, ins: &[TensorId]) -> IrResult<Vec<IterDomainId>> {
        let axes: Vec<Vec<IterDomainId>> = ins.iter().map(|t| self.visible_axes(*t)).collect();
        let rank = axes[0].len();
        for (k, a) in axes.iter().enumerate().skip(1) {
            if a.len() != rank {
                return Err(Diagnostic::new(format!(
                    "rank mismatch in {op}: {} has rank {rank} but {} has rank {}",
                    self.desc(ins[0]),
                    self.desc(ins[k]),
                    a.len()
                )));
            }
        }
        let mut out = Vec::with_capacity(rank);
        for axis in 0..rank {
            let mut chosen: Option<(usize, IterDomainId)> = None;
            for (k, a) in axes.iter().enumerate() {
                let id = a[axis];
                if self.ids[id].iter_type == IterType::Broadcast {
                    continue;
                }
                match chosen {
                    None => chosen = Some((k, id)),
                    Some((k0, id0)) => {
                        if !self.same_extent(&self.ids[id0].extent, &self.ids[id].extent) {
                            return Err(Diagnostic::new(format!(
                                "shape mismatch in {op}: axis {axis} of {} has extent `{}` but axis {axis} of {} has extent `{}`",
                                self.desc(ins[k0]),
                                self.ids[id0].extent.to_source(),
                                self.desc(ins[k]),
                                self.ids[id].extent.to_source()
                            )));
                        }
                    }
                }
            }
            let src = chosen.map(|(_, id)| id).unwrap_or(axes[0][axis]);
            out.push(self.fresh_copy(src));
        }
        Ok(out)
    }

    fn same_dtype(&self, op: &str, ins: &[TensorId]) -> IrResult<DType> {
        let d0 = self.tensors[ins[0]].dtype;
        for t in &ins[1..] {
            let d = self.tensors[*t].dtype;
            if d != d0 {
                return Err(Diagnostic::new(format!(
                    "dtype mismatch in {op}: `{}` is {d0} but `{}` is {d} (insert a cast)",
                    self.tensors[ins[0]].name, self.tensors[*t].name
                )));
            }
        }
        Ok(d0)
    }

    /// A literal takes the dtype of the tensor operand `t`: any number for a float, an
    /// integer for `i64`, and none for `bool`.
    fn check_literal(&self, op: &str, t: TensorId, lit: Literal) -> IrResult<()> {
        let d = self.tensors[t].dtype;
        let v = lit.0;
        let fits = match d {
            DType::Bool => false,
            DType::I64 => v.is_finite() && v == v.trunc() && v.abs() < 9.007_199_254_740_992e15,
            _ => true,
        };
        if fits {
            Ok(())
        } else {
            let why = if d == DType::Bool {
                "a bool operand takes no literal (compare with a tensor, or use `not`)"
            } else {
                "an i64 operand takes integer literals"
            };
            Err(Diagnostic::new(format!(
                "{op}: the literal `{}` takes the dtype of {}, and {why}",
                lit.to_source(),
                self.desc(t)
            )))
        }
    }

    fn check_axes(&self, op: &str, t: TensorId, axes: &[usize], rank: usize) -> IrResult<()> {
        for (i, a) in axes.iter().enumerate() {
            if *a >= rank {
                return Err(Diagnostic::new(format!(
                    "{op}: axis {a} is out of range for {} of rank {rank}",
                    self.desc(t)
                )));
            }
            if axes[..i].contains(a) {
                return Err(Diagnostic::new(format!("{op}: axis {a} is listed twice")));
            }
        }
        Ok(())
    }

    /// Adds an op named `name` computing `kind` over `inputs`, infers its output's shape and
    /// dtype, and returns the output. Errors name the op, tensors and axes involved.
    pub fn add_op(
        &mut self,
        name: &str,
        kind: ExprKind,
        inputs: &[TensorId],
    ) -> IrResult<TensorId> {
        self.check_new_name(name)?;
        let op = kind.op_name();
        if let ExprKind::WhereLit {
            a: Some(_),
            b: Some(_),
        } = &kind
        {
            return Err(Diagnostic::new(
                "where: both operands are literals, so nothing gives them a dtype (one of them must be a tensor)",
            ));
        }
        let arity = kind.arity();
        if !arity.contains(&inputs.len()) {
            let want = if arity.start() == arity.end() {
                format!("{}", arity.start())
            } else {
                format!("{} or {}", arity.start(), arity.end())
            };
            return Err(Diagnostic::new(format!(
                "{op} takes {want} tensor operands, got {}",
                inputs.len()
            )));
        }
        let in0 = inputs[0];
        let rank0 = self.visible_axes(in0).len();
        let (dtype, logical, root) = match &kind {
            ExprKind::Set | ExprKind::SegmentSet => (
                self.tensors[in0].dtype,
                self.pointwise_axes(op, inputs)?,
                None,
            ),
            ExprKind::Cast(d) => (*d, self.pointwise_axes(op, inputs)?, None),
            ExprKind::Unary(u) => {
                let d = self.tensors[in0].dtype;
                if *u == UnaryOp::Not && d != DType::Bool {
                    return Err(Diagnostic::new(format!(
                        "not needs a bool operand, {} is {d}",
                        self.desc(in0)
                    )));
                }
                if u.needs_float() && !d.is_float() {
                    return Err(Diagnostic::new(format!(
                        "{op} needs a floating-point operand, {} is {d}",
                        self.desc(in0)
                    )));
                }
                (d, self.pointwise_axes(op, inputs)?, None)
            }
            ExprKind::Binary(b) => {
                let d = self.same_dtype(op, inputs)?;
                if b.is_logical() && d != DType::Bool {
                    return Err(Diagnostic::new(format!(
                        "{op} needs bool operands, got {d}"
                    )));
                }
                let out_d = if b.is_comparison() { DType::Bool } else { d };
                (out_d, self.pointwise_axes(op, inputs)?, None)
            }
            ExprKind::BinaryLit { op: b, lit, .. } => {
                let d = self.tensors[in0].dtype;
                self.check_literal(op, in0, *lit)?;
                if b.is_logical() {
                    return Err(Diagnostic::new(format!(
                        "{op} takes bool tensors, not the literal `{}`",
                        lit.to_source()
                    )));
                }
                let out_d = if b.is_comparison() { DType::Bool } else { d };
                (out_d, self.pointwise_axes(op, inputs)?, None)
            }
            ExprKind::WhereLit { a, b } => {
                let c = self.tensors[in0].dtype;
                if c != DType::Bool {
                    return Err(Diagnostic::new(format!(
                        "where: the condition {} must be bool, not {c}",
                        self.desc(in0)
                    )));
                }
                let value = inputs[1];
                for lit in a.iter().chain(b) {
                    self.check_literal(op, value, *lit)?;
                }
                (
                    self.tensors[value].dtype,
                    self.pointwise_axes(op, inputs)?,
                    None,
                )
            }
            ExprKind::Where => {
                let c = self.tensors[in0].dtype;
                if c != DType::Bool {
                    return Err(Diagnostic::new(format!(
                        "where: the condition {} must be bool, not {c}",
                        self.desc(in0)
                    )));
                }
                let d = self.same_dtype(op, &inputs[1..])?;
                (d, self.pointwise_axes(op, inputs)?, None)
            }
            ExprKind::Reduction { op: rop, axes } => {
                self.check_axes(op, in0, axes, rank0)?;
                if axes.is_empty() {
                    return Err(Diagnostic::new(format!("{op}: no axes to reduce")));
                }
                let d = self.tensors[in0].dtype;
                if *rop == ReduceOp::Sum && d == DType::Bool {
                    return Err(Diagnostic::new(format!(
                        "sum of bool tensor {}",
                        self.desc(in0)
                    )));
                }
                let vis = self.visible_axes(in0);
                let mut out = Vec::new();
                for (k, id) in vis.iter().enumerate() {
                    let c = self.fresh_copy(*id);
                    if axes.contains(&k) {
                        self.ids[c].iter_type = IterType::Reduction;
                    }
                    out.push(c);
                }
                (d, out, None)
            }
            ExprKind::Broadcast { axes } => {
                let out_rank = rank0 + axes.len();
                self.check_axes(op, in0, axes, out_rank)?;
                let vis = self.visible_axes(in0);
                let mut src = vis.iter();
                let mut out = Vec::new();
                for k in 0..out_rank {
                    if axes.contains(&k) {
                        out.push(
                            self.ids
                                .insert(IterDomain::new(Scalar::c(1), IterType::Broadcast)),
                        );
                    } else {
                        let id = *src.next().expect("ranks checked");
                        out.push(self.fresh_copy(id));
                    }
                }
                (self.tensors[in0].dtype, out, None)
            }
            ExprKind::Squeeze { axes } => {
                self.check_axes(op, in0, axes, rank0)?;
                let vis = self.visible_axes(in0);
                let mut out = Vec::new();
                for (k, id) in vis.iter().enumerate() {
                    if axes.contains(&k) {
                        let d = &self.ids[*id];
                        if d.iter_type != IterType::Broadcast && d.extent.as_const() != Some(1) {
                            return Err(Diagnostic::new(format!(
                                "squeeze: axis {k} of {} has extent `{}`, not 1",
                                self.desc(in0),
                                d.extent.to_source()
                            )));
                        }
                    } else {
                        out.push(self.fresh_copy(*id));
                    }
                }
                (self.tensors[in0].dtype, out, None)
            }
            ExprKind::Permute { perm } => {
                if perm.len() != rank0 {
                    return Err(Diagnostic::new(format!(
                        "permute: {} has rank {rank0} but the permutation has {} entries",
                        self.desc(in0),
                        perm.len()
                    )));
                }
                self.check_axes(op, in0, perm, rank0)?;
                let vis = self.visible_axes(in0);
                let out = perm.iter().map(|p| self.fresh_copy(vis[*p])).collect();
                (self.tensors[in0].dtype, out, None)
            }
            ExprKind::Reshape { shape } => {
                let (root, logical) = self.reshape_domains(in0, shape)?;
                (self.tensors[in0].dtype, logical, Some(root))
            }
            ExprKind::Iota { axis } => {
                self.check_axes(op, in0, &[*axis], rank0)?;
                let vis = self.visible_axes(in0);
                let out = vis.iter().map(|id| self.fresh_copy(*id)).collect();
                (DType::I64, out, None)
            }
            ExprKind::Slice { axis, start, stop } => {
                self.check_axes(op, in0, &[*axis], rank0)?;
                let vis = self.visible_axes(in0);
                let ext = self.ids[vis[*axis]].extent.clone();
                let value = |s: &Scalar, what: &str| {
                    self.check_symbols(s)?;
                    self.eval(s).ok_or_else(|| {
                        Diagnostic::new(format!(
                            "slice: {what} `{}` has no value (set its parameters)",
                            s.to_source()
                        ))
                    })
                };
                let (b, e) = (value(start, "start")?, value(stop, "stop")?);
                let n = self.eval(&ext);
                if b < 0 || e < b || n.is_some_and(|n| e > n) {
                    return Err(Diagnostic::new(format!(
                        "slice: `{}..{}` ({b}..{e}) is not a range of axis {axis} of {}, of extent `{}`{} (0 <= start <= stop <= extent)",
                        start.to_source(),
                        stop.to_source(),
                        self.desc(in0),
                        ext.to_source(),
                        n.map(|n| format!(" = {n}")).unwrap_or_default()
                    )));
                }
                if e == b {
                    // A tensor's extents are positive: an empty slice has no tensor to be
                    // (lowering refused it late, without a location).
                    return Err(Diagnostic::new(format!(
                        "slice: `{}..{}` ({b}..{e}) of axis {axis} of {} is empty, and a tensor's extents must be positive; slice at least one element (start < stop), or leave the op out",
                        start.to_source(),
                        stop.to_source(),
                        self.desc(in0),
                    )));
                }
                if self.ids[vis[*axis]].iter_type == IterType::Broadcast {
                    return Err(Diagnostic::new(format!(
                        "slice: axis {axis} of {} is a broadcast axis; slice a real axis",
                        self.desc(in0)
                    )));
                }
                let len = if start.as_const() == Some(0) {
                    stop.clone()
                } else {
                    stop.clone().sub(start.clone())
                };
                let mut out = Vec::new();
                for (k, id) in vis.iter().enumerate() {
                    out.push(if k == *axis {
                        self.ids
                            .insert(IterDomain::new(len.clone(), IterType::Iteration))
                    } else {
                        self.fresh_copy(*id)
                    });
                }
                (self.tensors[in0].dtype, out, None)
            }
            ExprKind::Concat { axis } => {
                let d = self.same_dtype(op, inputs)?;
                let (va, vb) = (self.visible_axes(in0), self.visible_axes(inputs[1]));
                self.check_axes(op, in0, &[*axis], rank0)?;
                if va.len() != vb.len() {
                    return Err(Diagnostic::new(format!(
                        "concat: {} has rank {} but {} has rank {}",
                        self.desc(in0),
                        va.len(),
                        self.desc(inputs[1]),
                        vb.len()
                    )));
                }
                let mut out = Vec::new();
                for (k, (a, b)) in va.iter().zip(&vb).enumerate() {
                    let (ea, eb) = (self.ids[*a].extent.clone(), self.ids[*b].extent.clone());
                    let broadcast =
                        |id: &IterDomainId| self.ids[*id].iter_type == IterType::Broadcast;
                    if k == *axis {
                        if broadcast(a) || broadcast(b) {
                            return Err(Diagnostic::new(format!(
                                "concat: axis {axis} of {} and {} must be real axes, not broadcast ones",
                                self.desc(in0),
                                self.desc(inputs[1])
                            )));
                        }
                        out.push(
                            self.ids
                                .insert(IterDomain::new(ea.add(eb), IterType::Iteration)),
                        );
                    } else if !self.same_extent(&ea, &eb) || broadcast(a) != broadcast(b) {
                        return Err(Diagnostic::new(format!(
                            "concat: axis {k} of {} and of {} differ; only axis {axis}, the one joined, may",
                            self.desc(in0),
                            self.desc(inputs[1])
                        )));
                    } else {
                        out.push(self.fresh_copy(*a));
                    }
                }
                (d, out, None)
            }
            ExprKind::IndexSelect { axis, base } => {
                let ids = inputs[1];
                self.check_axes(op, in0, &[*axis], rank0)?;
                let vi = self.visible_axes(ids);
                let id_dtype = self.tensors[ids].dtype;
                if id_dtype != DType::I64 || vi.len() != 1 {
                    return Err(Diagnostic::new(format!(
                        "index_select: the ids {} must be an i64 tensor of rank 1 (one id per looked-up row)",
                        self.desc(ids)
                    )));
                }
                if let Some(b) = base {
                    for sym in b.symbols() {
                        if &*sym != crate::scalar::RANK && self.param(&sym).is_none() {
                            return Err(Diagnostic::new(format!(
                                "index_select: undefined parameter `{sym}` in the base row `{}` (a size over parameters and `rank`)",
                                b.to_source()
                            )));
                        }
                    }
                }
                let vis = self.visible_axes(in0);
                if self.ids[vis[*axis]].iter_type == IterType::Broadcast {
                    return Err(Diagnostic::new(format!(
                        "index_select: axis {axis} of {} is a broadcast axis; select along a real axis",
                        self.desc(in0)
                    )));
                }
                let mut out = Vec::new();
                for (k, id) in vis.iter().enumerate() {
                    out.push(if k == *axis {
                        self.fresh_copy(vi[0])
                    } else {
                        self.fresh_copy(*id)
                    });
                }
                // The table's rows stay as a reduction axis: across a device split of it the
                // per-device lookups are partial results that a sum completes.
                let r = self.fresh_copy(vis[*axis]);
                self.ids[r].iter_type = IterType::Reduction;
                out.push(r);
                (self.tensors[in0].dtype, out, None)
            }
            ExprKind::Matmul => {
                let d = self.same_dtype(op, inputs)?;
                (d, self.matmul_axes(inputs[0], inputs[1])?, None)
            }
            ExprKind::Linear => {
                let d = self.same_dtype(op, inputs)?;
                (d, self.linear_axes(inputs)?, None)
            }
        };
        let out = self.new_tensor(name, dtype, logical);
        self.tensors[out].root = root;
        let e = self.exprs.insert(Expr {
            kind,
            inputs: inputs.to_vec(),
            outputs: vec![out],
            span: None,
        });
        self.tensors[out].definition = Some(e);
        self.uses_index = std::sync::OnceLock::new();
        self.order.push(e);
        Ok(out)
    }

    /// `[.., m, k] x [.., k, n] -> [.., m, n, r(k)]` with numpy batch broadcasting: the batch
    /// axes of both operands align at the right, a missing axis or a broadcast axis `b`
    /// stretches to the other side's extent, and other batch axes must have equal extents.
    fn matmul_axes(&mut self, a: TensorId, b: TensorId) -> IrResult<Vec<IterDomainId>> {
        let (va, vb) = (self.visible_axes(a), self.visible_axes(b));
        if va.len() < 2 || vb.len() < 2 {
            return Err(Diagnostic::new(format!(
                "matmul needs operands of rank 2 or more, got {} and {}",
                self.desc(a),
                self.desc(b)
            )));
        }
        let ka = va[va.len() - 1];
        let kb = vb[vb.len() - 2];
        if !self.same_extent(&self.ids[ka].extent, &self.ids[kb].extent) {
            return Err(Diagnostic::new(format!(
                "matmul: contraction extents differ: last axis of {} is `{}`, axis {} of {} is `{}`",
                self.desc(a),
                self.ids[ka].extent.to_source(),
                vb.len() - 2,
                self.desc(b),
                self.ids[kb].extent.to_source()
            )));
        }
        let (ba, bb) = (&va[..va.len() - 2], &vb[..vb.len() - 2]);
        let nbatch = ba.len().max(bb.len());
        let mut out = Vec::new();
        for axis in 0..nbatch {
            // Right-aligned: output batch axis `axis` is axis `axis - (nbatch - len)` of an
            // operand with `len` batch axes, when that is not negative.
            let pick = |batch: &[IterDomainId]| {
                (axis + batch.len())
                    .checked_sub(nbatch)
                    .map(|i| (i, batch[i]))
            };
            let (pa, pb) = (pick(ba), pick(bb));
            let real = |id: IterDomainId| self.ids[id].iter_type != IterType::Broadcast;
            let src = match (pa, pb) {
                (Some((ia, x)), Some((ib, y))) if real(x) && real(y) => {
                    if !self.same_extent(&self.ids[x].extent, &self.ids[y].extent) {
                        return Err(Diagnostic::new(format!(
                            "matmul: batch axis {ia} of {} has extent `{}` but batch axis {ib} of {} has extent `{}` (batch axes align at the right; only a broadcast axis stretches)",
                            self.desc(a),
                            self.ids[x].extent.to_source(),
                            self.desc(b),
                            self.ids[y].extent.to_source()
                        )));
                    }
                    x
                }
                (Some((_, x)), Some((_, y))) => {
                    if real(x) {
                        x
                    } else {
                        y
                    }
                }
                (Some((_, x)), None) | (None, Some((_, x))) => x,
                (None, None) => continue,
            };
            out.push(self.fresh_copy(src));
        }
        out.push(self.fresh_copy(va[va.len() - 2]));
        out.push(self.fresh_copy(vb[vb.len() - 1]));
        let r = self.fresh_copy(ka);
        self.ids[r].iter_type = IterType::Reduction;
        out.push(r);
        Ok(out)
    }

    fn linear_axes(&mut self, ins: &[TensorId]) -> IrResult<Vec<IterDomainId>> {
        let (x, w) = (ins[0], ins[1]);
        let (vx, vw) = (self.visible_axes(x), self.visible_axes(w));
        if vx.is_empty() || vw.len() != 2 {
            return Err(Diagnostic::new(format!(
                "linear needs an input of rank 1 or more and a weight [n, k] of rank 2, got {} and {}",
                self.desc(x),
                self.desc(w)
            )));
        }
        let kx = vx[vx.len() - 1];
        if !self.same_extent(&self.ids[kx].extent, &self.ids[vw[1]].extent) {
            return Err(Diagnostic::new(format!(
                "linear: the last axis of {} is `{}` but axis 1 of weight {} is `{}`",
                self.desc(x),
                self.ids[kx].extent.to_source(),
                self.desc(w),
                self.ids[vw[1]].extent.to_source()
            )));
        }
        if let Some(bias) = ins.get(2) {
            let vb = self.visible_axes(*bias);
            if vb.len() != 1 || !self.same_extent(&self.ids[vb[0]].extent, &self.ids[vw[0]].extent)
            {
                return Err(Diagnostic::new(format!(
                    "linear: bias {} must have shape [`{}`]",
                    self.desc(*bias),
                    self.ids[vw[0]].extent.to_source()
                )));
            }
        }
        let mut out = Vec::new();
        for id in &vx[..vx.len() - 1] {
            out.push(self.fresh_copy(*id));
        }
        out.push(self.fresh_copy(vw[0]));
        let r = self.fresh_copy(kx);
        self.ids[r].iter_type = IterType::Reduction;
        out.push(r);
        Ok(out)
    }

    /// Root (copies of the input axes) and logical (after one split or merge) for a reshape.
    fn reshape_domains(
        &mut self,
        t: TensorId,
        shape: &[Scalar],
    ) -> IrResult<(Vec<IterDomainId>, Vec<IterDomainId>)> {
        for s in shape {
            self.check_symbols(s)?;
        }
        let vis = self.visible_axes(t);
        let root: Vec<IterDomainId> = vis.iter().map(|i| self.fresh_copy(*i)).collect();
        let ext: Vec<Scalar> = root.iter().map(|i| self.ids[*i].extent.clone()).collect();
        let fail = |f: &Fusion| {
            let to: Vec<String> = shape.iter().map(|s| s.to_source()).collect();
            Diagnostic::new(format!(
                "reshape of {} to [{}] is neither a split of one axis nor a merge of two adjacent axes",
                f.desc(t),
                to.join(", ")
            ))
        };
        if shape.len() == ext.len() + 1 && !ext.is_empty() {
            // Split of axis k: the first differing position.
            let k = (0..ext.len())
                .find(|k| !self.same_extent(&ext[*k], &shape[*k]))
                .unwrap_or(ext.len() - 1);
            let same_rest = (k + 1..ext.len()).all(|j| self.same_extent(&ext[j], &shape[j + 1]));
            let prod = shape[k].clone().mul(shape[k + 1].clone());
            if !same_rest || !self.same_extent(&prod, &ext[k]) {
                return Err(fail(self));
            }
            let (o, i) = self.split_id(root[k], shape[k].clone(), SplitKind::Outer);
            self.ids[o].rfactor = true;
            self.ids[i].rfactor = true;
            // Keep the written extent of the inner axis when it is provably the same.
            self.ids[i].extent = shape[k + 1].clone();
            let mut logical = root.clone();
            logical.splice(k..=k, [o, i]);
            Ok((root, logical))
        } else if shape.len() + 1 == ext.len() && !shape.is_empty() {
            let k = (0..shape.len())
                .find(|k| !self.same_extent(&ext[*k], &shape[*k]))
                .unwrap_or(shape.len() - 1);
            let same_rest = (k + 1..shape.len()).all(|j| self.same_extent(&ext[j + 1], &shape[j]));
            let prod = ext[k].clone().mul(ext[k + 1].clone());
            if !same_rest || !self.same_extent(&prod, &shape[k]) {
                return Err(fail(self));
            }
            let m = self.merge_ids(root[k], root[k + 1]);
            self.ids[m].rfactor = true;
            let mut logical = root.clone();
            logical.splice(k..=k + 1, [m]);
            Ok((root, logical))
        } else {
            Err(fail(self))
        }
    }

    // ----- convenience builders for Rust users --------------------------------------------

    /// `name = set(a)`
    pub fn set(&mut self, name: &str, a: TensorId) -> IrResult<TensorId> {
        self.add_op(name, ExprKind::Set, &[a])
    }

    /// `name = op(a, b)`
    pub fn binary(
        &mut self,
        name: &str,
        op: BinaryOp,
        a: TensorId,
        b: TensorId,
    ) -> IrResult<TensorId> {
        self.add_op(name, ExprKind::Binary(op), &[a, b])
    }

    /// `name = op(a, lit)`, or `op(lit, a)` when `lit_first`: a binary op with a literal
    /// operand of `a`'s dtype (`x * 0.5`).
    pub fn binary_lit(
        &mut self,
        name: &str,
        op: BinaryOp,
        a: TensorId,
        lit: f64,
        lit_first: bool,
    ) -> IrResult<TensorId> {
        let kind = ExprKind::BinaryLit {
            op,
            lit: Literal(lit),
            lit_first,
        };
        self.add_op(name, kind, &[a])
    }

    /// The number of elements a reduction of `a` over `axes` adds up: the product of the
    /// reduced extents' values (a `mean` divides by it). An extent without a value (an unset
    /// parameter) is an error naming it.
    pub fn reduced_count(&self, a: TensorId, axes: &[usize]) -> IrResult<f64> {
        let vis = self.visible_axes(a);
        let mut n = 1.0;
        for ax in axes {
            let Some(id) = vis.get(*ax) else {
                return Err(Diagnostic::new(format!(
                    "mean: axis {ax} is out of range for {} of rank {}",
                    self.desc(a),
                    vis.len()
                )));
            };
            let e = &self.ids[*id].extent;
            match self.eval(e) {
                Some(v) => n *= v as f64,
                None => {
                    return Err(Diagnostic::new(format!(
                        "mean: extent `{}` of axis {ax} of {} has no value (set its parameters)",
                        e.to_source(),
                        self.desc(a)
                    )))
                }
            }
        }
        Ok(n)
    }

    /// `name = mean(a, axes)`: two ops, `sum_name = sum(a, axes)` and
    /// `name = div(sum_name, n)` with `n` the [`Fusion::reduced_count`], so that sharding
    /// treats the sum as any sum (a sum over a device axis is added across devices) and the
    /// division uses the global count.
    pub fn mean(
        &mut self,
        name: &str,
        sum_name: &str,
        a: TensorId,
        axes: &[usize],
    ) -> IrResult<TensorId> {
        let n = self.reduced_count(a, axes)?;
        let s = self.sum(sum_name, a, axes)?;
        self.binary_lit(name, BinaryOp::Div, s, n, false)
    }

    /// `name = sum(a, axes)`
    pub fn sum(&mut self, name: &str, a: TensorId, axes: &[usize]) -> IrResult<TensorId> {
        let mut axes = axes.to_vec();
        axes.sort_unstable();
        self.add_op(
            name,
            ExprKind::Reduction {
                op: ReduceOp::Sum,
                axes,
            },
            &[a],
        )
    }

    /// `name = op(a, axes)`: a sum, max or min reduction.
    pub fn reduce(
        &mut self,
        name: &str,
        op: ReduceOp,
        a: TensorId,
        axes: &[usize],
    ) -> IrResult<TensorId> {
        let mut axes = axes.to_vec();
        axes.sort_unstable();
        self.add_op(name, ExprKind::Reduction { op, axes }, &[a])
    }

    /// The ops of `var(a, axes)`, the population variance, in two passes (the mean, then the
    /// mean of the squared deviations from it, which keeps its precision where the values
    /// are far from zero): `sum`, `div` by the count, `broadcast` back over `axes`, `sub`,
    /// `mul` (the square), `sum`, `div`. `names` gives the seven outputs their names, the
    /// last one the variance's. Over a device-split axis both sums are added across devices.
    pub fn var_ops(&mut self, names: [&str; 7], a: TensorId, axes: &[usize]) -> IrResult<TensorId> {
        self.var_ops_corrected(names, a, axes, 0)
    }

    /// [`Fusion::var_ops`] with Bessel's correction: the squared deviations are divided by
    /// `n - correction` (`correction = 1`: the sample variance, PyTorch's default). An error
    /// when `correction` is at least 1 and not smaller than the count `n` (the divisor would be
    /// zero or negative).
    pub fn var_ops_corrected(
        &mut self,
        names: [&str; 7],
        a: TensorId,
        axes: &[usize],
        correction: u64,
    ) -> IrResult<TensorId> {
        let mut axes = axes.to_vec();
        axes.sort_unstable();
        let n = self
            .reduced_count(a, &axes)
            .map_err(|d| Diagnostic::new(d.message.replacen("mean:", "var:", 1)))?;
        let divisor = self.var_divisor(a, &axes, n, correction)?;
        let s = self.reduce(names[0], ReduceOp::Sum, a, &axes)?;
        let m = self.binary_lit(names[1], BinaryOp::Div, s, n, false)?;
        let mb = self.add_op(names[2], ExprKind::Broadcast { axes: axes.clone() }, &[m])?;
        let d = self.binary(names[3], BinaryOp::Sub, a, mb)?;
        let sq = self.binary(names[4], BinaryOp::Mul, d, d)?;
        let s2 = self.reduce(names[5], ReduceOp::Sum, sq, &axes)?;
        self.binary_lit(names[6], BinaryOp::Div, s2, divisor, false)
    }

    /// The divisor of the squared deviations of `var(a, axes, correction)`: `n - correction`,
    /// `n` the [`Fusion::reduced_count`]; an error when `correction` is at least 1 and not
    /// smaller than `n` (a sample variance of one element has no defined value, and PyTorch's
    /// division by zero or a negative count gives `inf`, `nan` or a negative variance).
    pub fn var_divisor(
        &self,
        a: TensorId,
        axes: &[usize],
        n: f64,
        correction: u64,
    ) -> IrResult<f64> {
        let c = correction as f64;
        if correction > 0 && n <= c {
            let list: Vec<String> = axes.iter().map(|x| x.to_string()).collect();
            return Err(Diagnostic::new(format!(
                "var: the correction {correction} is not smaller than the {n} elements that each variance of {} over axes [{}] reduces, so the divisor n - correction would be {}; reduce more elements, or lower the correction (0 is the population variance)",
                self.desc(a),
                list.join(", "),
                n - c
            )));
        }
        Ok(n - c)
    }

    /// `name = var(a, axes)`: the population variance (see [`Fusion::var_ops`]); the six
    /// intermediate tensors are named `name_1`, `name_2`, … (the first names no tensor has).
    pub fn var(&mut self, name: &str, a: TensorId, axes: &[usize]) -> IrResult<TensorId> {
        self.var_corrected(name, a, axes, 0)
    }

    /// `name = var(a, axes, correction)`: the variance with the squared deviations divided by
    /// `n - correction` (see [`Fusion::var_ops_corrected`]), intermediates named as
    /// [`Fusion::var`] names them.
    pub fn var_corrected(
        &mut self,
        name: &str,
        a: TensorId,
        axes: &[usize],
        correction: u64,
    ) -> IrResult<TensorId> {
        self.check_new_name(name)?;
        let mut names: Vec<String> = Vec::new();
        let mut i = 1;
        while names.len() < 6 {
            let n = format!("{name}_{i}");
            if self.tensor_by_name(&n).is_none() {
                names.push(n);
            }
            i += 1;
        }
        let [a0, a1, a2, a3, a4, a5] = [0, 1, 2, 3, 4, 5].map(|k| names[k].as_str());
        self.var_ops_corrected([a0, a1, a2, a3, a4, a5, name], a, axes, correction)
    }

    /// `name = iota(a, axis)`: `i64`, `a`'s shape, each element its index along `axis`.
    pub fn iota(&mut self, name: &str, a: TensorId, axis: usize) -> IrResult<TensorId> {
        self.add_op(name, ExprKind::Iota { axis }, &[a])
    }

    /// `name = slice(a, axis, start, stop)`.
    pub fn slice(
        &mut self,
        name: &str,
        a: TensorId,
        axis: usize,
        start: Scalar,
        stop: Scalar,
    ) -> IrResult<TensorId> {
        self.add_op(name, ExprKind::Slice { axis, start, stop }, &[a])
    }

    /// `name = concat(a, b, axis)`.
    pub fn concat(
        &mut self,
        name: &str,
        a: TensorId,
        b: TensorId,
        axis: usize,
    ) -> IrResult<TensorId> {
        self.add_op(name, ExprKind::Concat { axis }, &[a, b])
    }

    /// `name = index_select(table, ids, axis)`: the rows of `table` along `axis` that the
    /// `i64` ids `[n]` name (an embedding lookup).
    pub fn index_select(
        &mut self,
        name: &str,
        table: TensorId,
        ids: TensorId,
        axis: usize,
    ) -> IrResult<TensorId> {
        self.add_op(
            name,
            ExprKind::IndexSelect { axis, base: None },
            &[table, ids],
        )
    }

    /// `name = matmul(a, b)`
    pub fn matmul(&mut self, name: &str, a: TensorId, b: TensorId) -> IrResult<TensorId> {
        self.add_op(name, ExprKind::Matmul, &[a, b])
    }

    /// `name = linear(x, w[, bias])`
    pub fn linear(
        &mut self,
        name: &str,
        x: TensorId,
        w: TensorId,
        bias: Option<TensorId>,
    ) -> IrResult<TensorId> {
        let mut ins = vec![x, w];
        ins.extend(bias);
        self.add_op(name, ExprKind::Linear, &ins)
    }
}
