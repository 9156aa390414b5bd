//! Math on weight bytes: the numeric kernels every Nectar forward pass runs.
//!
//! What this crate does: matrix–vector and small-batch matrix products over weights in their
//! stored format (f32, bf16, f16, int8 per-row, int4 per-row and int4 grouped), plus the small
//! vector kernels of a GLM-5 layer (RMSNorm, LayerNorm, interleaved RoPE, softmax, SiLU).
//! What it does not do: know about files, tensors names, models or memory budgets.
//!
//! The one decision a newcomer would question: **every dot product has one fixed accumulation
//! order** (16 interleaved f32 lanes, fused multiply-add, then a fixed pairwise tree — see
//! [`dot`]). The scalar reference, the AVX2 path and any future SIMD path follow it exactly, so a
//! row's result is bit-identical whatever the instruction set, the thread count, or the number
//! of rows in the batch. Speculative decoding (draft with M = 1, verify with M = 4) and
//! continuous batching both depend on that; a faster reduction that changes bits would silently
//! change outputs, so it is not allowed on the default path.
#![deny(missing_docs)]

mod activation;
mod decode;
mod dot;
mod error;
mod format;
mod matmul;
mod norm;
mod rope;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use activation::{silu, softmax_in_place, swiglu_in_place};
pub use decode::decode_row;
pub use dot::{dot, dot_scalar, LANES};
pub use error::{Error, Result};
pub use format::{MatRef, WeightFormat};
pub use matmul::{matmul, matmul_rows};
pub use norm::{layer_norm, rms_norm};
pub use rope::RopeTable;

/// Which instruction set the kernels use on this machine (chosen once, at first use).
pub fn isa() -> &'static str {
    dot::isa_name()
}
