//! x86-64 SIMD paths, chosen at run time (`dot::Isa`). Each keeps the canonical order of
//! `dot.rs` bit for bit; see the module docs for how.
pub(crate) mod avx2;
pub(crate) mod avx512;
pub(crate) mod digits;
pub(crate) mod digits_avx2;
pub(crate) mod vnni;
