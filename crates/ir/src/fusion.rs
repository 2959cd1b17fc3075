//! The fusion arena and its builder API: parameters, meshes, inputs, ops with shape and dtype
//! inference, outputs. Program order is kept in vectors, never in arena order.

use slotmap::{SecondaryMap, SlotMap};

use crate::diag::Span;
use crate::domain::{IdExpr, IterDomain};
use crate::expr::Expr;
use crate::ids::{ExprId, IdExprId, IterDomainId, MeshId, TensorId};
use crate::mesh::DeviceMesh;
use crate::scalar::Scalar;
use crate::tensor::TensorView;

mod arena;
mod build;
mod builders;
mod meshes;
mod params;

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
}
