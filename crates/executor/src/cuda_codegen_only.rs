//! The `cuda` module of a build without the `cuda` feature: only the generated CUDA C
//! ([`codegen`]), which is text and needs no CUDA library, so `weave dump --kernels` and the
//! meter's kernel plans work in a CPU-only build. The backend, replay and timers are absent.

#[path = "cuda/codegen.rs"]
pub mod codegen;
#[path = "cuda/emit.rs"]
mod emit;
#[path = "cuda/expr.rs"]
mod expr;
