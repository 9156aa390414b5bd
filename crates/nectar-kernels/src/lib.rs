//! Math on weight bytes: the numeric kernels every Nectar forward pass runs.
//!
//! What this crate does: matrix–vector and small-batch matrix products over weights in their
//! stored format (f32, bf16, f16, int8 per-row, int4 per-row and int4 grouped), a routed
//! expert's fused SwiGLU ([`expert_swiglu`]), plus the small vector kernels of a GLM-5 layer
//! (RMSNorm, LayerNorm, interleaved RoPE, softmax, SiLU).
//! What it does not do: know about files, tensors names, models or memory budgets.
//!
//! The one decision a newcomer would question: **every dot product has one fixed accumulation
//! order** (16 interleaved f32 lanes, fused multiply-add, then a fixed pairwise tree — see
//! [`dot`]). The scalar reference ([`dot_scalar`] over [`decode_row`]), the AVX2, AVX-512 and
//! NEON paths follow it exactly, so a row's result is bit-identical whatever the instruction
//! set, the thread count, or the number of rows in the batch. Speculative decoding (draft with
//! M = 1, verify with M = 4) and continuous batching both depend on that; a faster reduction
//! that changes bits would silently change outputs, so it is not allowed on the default path.
//!
//! How the SIMD paths are fast anyway: they read the weight bytes and dequantise in registers
//! (`(code as f32) * scale`, exactly the reference's value) straight into the fused
//! multiply-add, interleave 4 weight rows so the per-lane dependency chains overlap, reuse each
//! decoded step for up to 8 activation rows, and prefetch the next row block so one core
//! streams at DRAM speed (`driver.rs`). The path is chosen at run time ([`isa`]); [`set_isa`]
//! (the CLI's `--isa`) can force a slower one for measurement.
//!
//! The exceptions are opt-in and named for it: [`matmul_int8_act`] quantises activations to
//! int8 and changes results (≈ 0.4 % relative RMS; `benchmarks/RESULTS.md`), and
//! [`set_int4_order`]`("digits")` computes int4 products as exact integer dot products over
//! activation digits — f32-level accuracy in another order, so other bits (`digits.rs`).
#![deny(missing_docs)]

#[cfg(target_arch = "aarch64")]
mod aarch64;
mod activation;
mod decode;
mod digits;
mod dot;
mod driver;
mod error;
mod expert;
mod format;
mod index_score;
mod int8_act;
mod matmul;
mod norm;
mod readbw;
mod rope;
mod scalar;
mod scaled_add;
pub mod team;
#[cfg(target_arch = "x86_64")]
mod x86;
mod xpack;

pub use activation::{silu, softmax_in_place, swiglu_in_place};
pub use decode::{decode_row, scaled_add_rows};
pub use digits::{int4_digits_available, int4_order, int4_order_covers, set_int4_order};
pub use dot::{dot, dot4, dot_scalar, set_isa, DOT4, LANES};
pub use error::{Error, Result};
pub use expert::{expert_swiglu, ExpertRef};
pub use format::{MatRef, WeightFormat};
pub use index_score::index_score;
pub use int8_act::{matmul_int8_act, INT8_ACT_BLOCK};
pub use matmul::{matmul, matmul_rows};
pub use norm::{layer_norm, rms_norm};
pub use readbw::{read_sum, ReadMode, PREFETCH_DISTANCE};
pub use rope::RopeTable;
pub use scaled_add::{scaled_add, scaled_add4, ROWS4};

/// Which instruction set the kernels use on this machine (chosen once, at first use).
pub fn isa() -> &'static str {
    dot::isa_name()
}
