//! Products over weights that some other buffer owns ([`MatView`]: a matrix at device
//! addresses, e.g. an expert staged by [`crate::copy::Staging`]), with the same kernels and
//! dispatch as [`GpuMat`](crate::GpuMat) products: the GEMV kernels ([`Order::MODEL`]), or the
//! tensor-core GEMM (three activation parts) where [`use_gemm`](crate::use_gemm) picks it for the shape. So a
//! staged expert computes the same bits as the same expert held in VRAM.
use crate::device::Gpu;
use crate::error::Result;
use crate::gemv::{Job, Kernel, Order};
use nectar_kernels::WeightFormat;

/// A weight matrix in its stored format at device addresses this crate does not own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatView {
    /// Storage format.
    pub format: WeightFormat,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Device address of `rows × row_bytes` weight bytes.
    pub w: u64,
    /// Device address of `rows × row_scales` f32 scales (any address for float formats).
    pub s: u64,
    /// Whether weights and scales are int4 in the packed layout ([`Gpu::upload`]); false: as
    /// stored (a matrix copied from RAM as it is there).
    pub packed: bool,
}

impl MatView {
    /// A launch's job over this matrix with activations at `x` and outputs at `y`.
    pub(crate) fn job(&self, x: u64, y: u64) -> Job {
        Job {
            w: self.w,
            s: self.s,
            x,
            y,
            packed: self.packed as u64,
        }
    }
}

impl Gpu {
    /// y_j = W_j·x_j for same-shaped matrices at device addresses, `m` activation rows each, on
    /// the compute stream; synchronous. Returns each product's `m × rows` output. The kernel is
    /// the one a [`GpuMat`](crate::GpuMat) of this shape gets ([`use_gemm`](crate::use_gemm)), run by the same
    /// batch runner, so a staged expert computes the bits the same expert held in VRAM does.
    ///
    /// # Safety
    /// Each view must describe memory of this context that holds its matrix (weights and scales
    /// of the view's format and shape) and that stays unchanged until this call returns.
    pub unsafe fn matmul_views(
        &self,
        items: &[(MatView, &[f32])],
        m: usize,
    ) -> Result<Vec<Vec<f32>>> {
        let kernel = match items.first() {
            Some((v, _)) => Kernel::model(v.format, v.rows, v.cols, m),
            None => Kernel::Gemv(Order::MODEL),
        };
        // SAFETY: this fn's contract is `run_views`'.
        unsafe { self.run_views(items, m, kernel) }
    }
}
