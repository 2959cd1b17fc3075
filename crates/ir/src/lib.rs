//! weave-ir: the fusion IR of streamweave — dtypes, symbolic extents, iter domains, tensor
//! views, ops, device meshes — with its builder API, seed-style printer, `.weave` text format
//! and verifier.
//!
//! Architecture Invariant: this crate knows nothing of CUDA, streams at run time, or host
//! programs. It describes *what* is computed and how the user annotated it; the meaning of
//! schedules lives in `weave-transform`, lowering in `weave-passes`.

pub mod diag;
pub mod domain;
pub mod dtype;
pub mod expr;
pub mod fusion;
pub mod ids;
pub mod mesh;
pub mod print;
pub mod scalar;
pub mod shape;
pub mod tensor;
pub mod text;
pub mod verify;

pub use diag::{Diagnostic, IrResult, Span};
pub use domain::{IdExpr, IterDomain, IterType, ParallelType, SplitKind};
pub use dtype::DType;
pub use expr::{BinaryOp, Expr, ExprKind, Literal, ReduceOp, UnaryOp};
pub use fusion::{Draw, Fusion, MeshDecl, MeshSpec, Param, ParamRole};
pub use ids::{ExprId, IdExprId, IterDomainId, MeshId, TensorId};
pub use mesh::{DeviceMesh, MeshError};
pub use scalar::{Builtin, Scalar, ScalarOp, NUMBER_OF_STREAMS, RANK, RESERVED_NAMES};
pub use tensor::{reordered, MemoryType, ReorderError, ScheduleOp, ScheduleStep, TensorView};
