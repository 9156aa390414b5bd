//! x86-64 SIMD paths (AVX2 + FMA), chosen at run time by `dot::isa_detect`.
mod avx2;

pub(crate) use avx2::{decode_bf16_avx2, dot_avx2};
