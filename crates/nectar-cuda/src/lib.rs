//! The CUDA tier: device management and matrix–vector kernels over Nectar's stored weight
//! formats (f32, bf16, f16, int8 per row, int4 per row and grouped), behind the `cuda` feature.
//!
//! What this crate does: open a GPU without panicking when there is none ([`Gpu::open`] returns
//! [`Error::Unavailable`], and callers stay on the CPU), compile its kernels at run time with
//! NVRTC for the device found, keep weight matrices resident in their stored bytes
//! ([`GpuMat`]), run y = W·x for M = 1…8 activation rows per launch — one matrix or a batch of
//! same-shaped ones (a layer's routed experts) — or for many rows at once on the tensor cores
//! ([`Gpu::gemm`], prefill), run whole SwiGLU MLPs with their activations kept in VRAM
//! ([`Gpu::swiglu_batch`]), run the MLA attention of a prefill chunk ([`Gpu::mla_prefill`]) and of decode rows over KV caches mirrored in VRAM ([`Gpu::mla_absorbed`]) and the DSA indexer's
//! scores ([`Gpu::index_scores`], bit for bit the CPU's), stage weights from pageable host memory into VRAM on a copy stream
//! ([`copy::Staging`]) and multiply them there ([`Gpu::matmul_views`]), and measure kernels and copies against the device's own copy
//! bandwidth ([`bench`]).
//! What it does not do: decide what lives on the GPU (the model's placement does), or know
//! model files.
//!
//! The one decision a newcomer would question: **results are not bit-identical to the CPU
//! kernels.** The model's products ([`Order::MODEL`]) run on the tensor cores even at one
//! activation row (`gemv_q.cu` for int4: codes exact, activations as four 7-bit digits per
//! 64-column step, exact integer sums; `gemv_tc.cu` for int8 and bf16: weights exact,
//! activations in three bf16 parts, f32 sums in a stated order), so that 2–8 rows cost about
//! what one does; the f32 kernels
//! (`gemv.cu`) dequantise every weight to the CPU's value but sum in another fixed order. So
//! parity is by tolerance ([`within_tolerance`]): a bound on reordering error relative to
//! Σ|wⱼ·xⱼ|. Each row's result is still independent of M and of what else shares the launch.
//!
//! Without the `cuda` feature only the host-side pieces ([`divide`], [`within_tolerance`])
//! exist, and nothing CUDA is compiled or linked; with it, the driver and NVRTC are loaded at
//! run time, so building needs no CUDA toolkit.
#![deny(missing_docs)]

pub mod divide;

#[cfg(feature = "cuda")]
mod absorbed;
#[cfg(feature = "cuda")]
mod attention;
#[cfg(feature = "cuda")]
pub mod bench;
#[cfg(feature = "cuda")]
mod bounce;
#[cfg(feature = "cuda")]
pub mod copy;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod error;
#[cfg(feature = "cuda")]
mod gemm;
#[cfg(feature = "cuda")]
mod gemv;
#[cfg(feature = "cuda")]
mod index;
#[cfg(feature = "cuda")]
mod kernel_cache;
#[cfg(feature = "cuda")]
mod moe;
#[cfg(feature = "cuda")]
mod moe_out;
#[cfg(feature = "cuda")]
mod round_trip;
#[cfg(feature = "cuda")]
mod rows;
#[cfg(feature = "cuda")]
mod swiglu;
#[cfg(feature = "cuda")]
mod view;

#[cfg(feature = "cuda")]
pub use absorbed::{AbsorbedKeys, AbsorbedRow, KvMirror, ABSORBED_MAX_DR, ABSORBED_MAX_RANK};
#[cfg(feature = "cuda")]
pub use attention::{MlaKeys, MlaOutput, MlaShape, MLA_MAX_DIM};
#[cfg(feature = "cuda")]
pub use device::{Gpu, GpuInfo};
#[cfg(feature = "cuda")]
pub use error::{Error, Result};
#[cfg(feature = "cuda")]
pub use gemm::{use_gemm, GemmPlan, Precision};
#[cfg(feature = "cuda")]
pub use gemv::{packs, GemvPlan, GpuMat, Job, Order, QSrc, MAX_M};
#[cfg(feature = "cuda")]
pub use index::{IndexRows, INDEX_MAX_DIM};
#[cfg(feature = "cuda")]
pub use moe::{MoeCombine, NO_PAIR};
#[cfg(feature = "cuda")]
pub use moe_out::{GpuMoeOut, StreamMark};
#[cfg(feature = "cuda")]
pub use rows::{GpuRows, ROPE_MAX_HALF};
#[cfg(feature = "cuda")]
pub use swiglu::SwiGluMats;
#[cfg(feature = "cuda")]
pub use view::MatView;

/// Reordering tolerance, in units of f32 epsilon relative to Σ|wⱼ·xⱼ|. Two f32 sums of the same
/// n products in different orders differ by at most about (n/lanes + log₂ lanes) · ε · Σ|wⱼxⱼ|
/// in the worst case and far less in practice; 64 ε (3.8e-6 relative) admits every reordering
/// seen, yet one weight decoded wrong, which moves a 6144-term sum by about Σ|wⱼxⱼ|/6144
/// (1.6e-4 relative), fails it by a factor of 40.
pub const TOLERANCE_EPS: f32 = 64.0;

/// Whether a GPU result `gpu` matches the CPU kernels' `cpu` for one output element whose
/// products have absolute sum `abs_sum` = Σ|wⱼ·xⱼ|. NaN never passes.
pub fn within_tolerance(gpu: f32, cpu: f32, abs_sum: f32) -> bool {
    let bound = TOLERANCE_EPS * f32::EPSILON * abs_sum + f32::MIN_POSITIVE;
    (gpu - cpu).abs() <= bound
}

/// The bound of the tensor-core GEMM with activations in two bf16 parts (`Precision::Split2`,
/// measured, not used by the model), relative to Σ|wⱼ·xⱼ|: two parts keep each xⱼ to
/// 2⁻¹⁶·|xⱼ|, so 4·2⁻¹⁶ = 2⁻¹⁴ (6.1e-5) covers it with room, plus [`TOLERANCE_EPS`] for the
/// summation order. One wrong weight of a 768-term row (1.3e-3 of Σ|w·x|) still misses it
/// twenty-fold. With three parts (what the model uses) the GEMM is held to
/// [`within_tolerance`], the GEMV kernels' bound.
pub const GEMM_TOLERANCE: f32 = 1.0 / 16384.0;

/// |gpu − cpu| ≤ ([`GEMM_TOLERANCE`] + 64 ε)·Σ|wⱼ·xⱼ|.
pub fn within_gemm_tolerance(gpu: f32, cpu: f32, abs_sum: f32) -> bool {
    let bound = (GEMM_TOLERANCE + TOLERANCE_EPS * f32::EPSILON) * abs_sum + f32::MIN_POSITIVE;
    (gpu - cpu).abs() <= bound
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerance_rejects_nan_and_one_wrong_weight() {
        assert!(within_tolerance(1.0, 1.0, 1.0));
        assert!(!within_tolerance(f32::NAN, 1.0, 1.0));
        assert!(!within_tolerance(1.0, f32::NAN, 1.0));
        // A 6144-term sum of unit products off by one product.
        assert!(!within_tolerance(1.0 + 1.0 / 6144.0, 1.0, 6144.0 / 6144.0));
        assert!(within_tolerance(1.0 + 3.0e-6, 1.0, 1.0));
    }

    #[test]
    fn gemm_tolerance_admits_split_rounding_not_a_wrong_weight() {
        assert!(within_gemm_tolerance(1.0 + 5.0e-5, 1.0, 1.0));
        assert!(!within_gemm_tolerance(f32::NAN, 1.0, 1.0));
        // A 768-term sum of unit products off by one product.
        assert!(!within_gemm_tolerance(1.0 + 1.0 / 768.0, 1.0, 1.0));
        // bf16 activations alone (2⁻⁹ relative) do not pass.
        assert!(!within_gemm_tolerance(1.0 + 1.0 / 512.0, 1.0, 1.0));
    }
}
