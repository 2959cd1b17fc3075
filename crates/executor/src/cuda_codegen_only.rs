//! The `cuda` module of a build without the `cuda` feature: only the generated CUDA C
//! ([`codegen`], the weave-codegen crate), which is text and needs no CUDA library, so the
//! kernel table (`crate::kernels`), `weave dump` and `weave dump --kernels` work in a
//! CPU-only build. The backend, replay and timers are absent.

/// The kernel code generator (the weave-codegen crate), under its path in this crate.
pub use weave_codegen as codegen;
