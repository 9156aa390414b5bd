//! aarch64 SIMD paths. NEON is part of the aarch64 baseline; it is still chosen through
//! `dot::Isa` so tests can compare it with the scalar reference explicitly.
pub(crate) mod neon;
