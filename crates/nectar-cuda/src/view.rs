//! Products over weights that some other buffer owns ([`MatView`]: a matrix at device
//! addresses, e.g. an expert staged by [`crate::copy::Staging`]), with the same kernels and
//! dispatch as [`GpuMat`](crate::GpuMat) products: the GEMV kernels (exact order) below
//! [`GEMM_MIN_M`] rows, the tensor-core GEMM (three activation parts) from there on. So a staged
//! expert computes the same bits as the same expert held in VRAM.
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::gemm::{Precision, GEMM_MIN_M};
use crate::gemv::{Job, Order, MAX_M};
use cudarc::driver::{CudaSlice, DevicePtr};
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
}

impl Gpu {
    /// y_j = W_j·x_j for same-shaped matrices at device addresses, `m` activation rows each, on
    /// the compute stream; synchronous. Returns each product's `m × rows` output.
    ///
    /// # Safety
    /// Each view must describe memory of this context that holds its matrix (weights and scales
    /// of the view's format and shape) and that stays unchanged until this call returns.
    pub unsafe fn matmul_views(
        &self,
        items: &[(MatView, &[f32])],
        m: usize,
    ) -> Result<Vec<Vec<f32>>> {
        let Some(&(first, _)) = items.first() else {
            return Ok(Vec::new());
        };
        let (format, rows, cols) = (first.format, first.rows, first.cols);
        for (v, x) in items {
            if (v.format, v.rows, v.cols) != (format, rows, cols) {
                return Err(Error::Shape(format!(
                    "matmul_views: a {}x{} {} matrix among {rows}x{cols} {}",
                    v.rows,
                    v.cols,
                    v.format.name(),
                    format.name()
                )));
            }
            if Some(x.len()) != m.checked_mul(cols) {
                return Err(Error::Shape(format!(
                    "matmul_views: x has {} values, want m × cols = {m} × {cols}",
                    x.len()
                )));
            }
        }
        if m == 0 || rows == 0 || cols == 0 {
            return Ok(vec![vec![0.0; m * rows]; items.len()]);
        }
        let n = items.len();
        let xs: Vec<f32> = items.iter().flat_map(|(_, x)| x.iter().copied()).collect();
        let x_dev = self.stream.clone_htod(&xs)?;
        // Every element is written by the kernels before it is read (each (item, row, output)
        // is covered once by the grid).
        let y_dev: CudaSlice<f32> = self.stream.alloc_zeros(n * m * rows)?;
        let (xp, _x_sync) = x_dev.device_ptr(&self.stream);
        let (yp, _y_sync) = y_dev.device_ptr(&self.stream);
        let jobs_from = |i0: usize| -> Vec<Job> {
            items
                .iter()
                .enumerate()
                .map(|(j, (v, _))| Job {
                    w: v.w,
                    s: v.s,
                    x: xp + ((j * m + i0) * cols * 4) as u64,
                    y: yp + ((j * m + i0) * rows * 4) as u64,
                })
                .collect()
        };
        if m >= GEMM_MIN_M {
            let plan = self.gemm_plan(format, rows, cols, m, Precision::Split3)?;
            let jobs = jobs_from(0);
            let vec = plan.vector_flags(&jobs);
            let table = self.stream.clone_htod(&jobs)?;
            let (tp, _t_sync) = table.device_ptr(&self.stream);
            // SAFETY: the views hold matrices of the plan's shape (this fn's contract); x and y
            // are this call's buffers, m × cols and m × rows per item; `vector_flags` checked
            // the alignment.
            unsafe { self.gemm_launch(&plan, tp, jobs.len(), vec)? };
        } else {
            let plan = self.gemv_plan(format, rows, cols, m, Order::Exact)?;
            let jobs = jobs_from(0);
            let vector = plan.vector_ok(&jobs);
            let table = self.stream.clone_htod(&jobs)?;
            let (tp, _t_sync) = table.device_ptr(&self.stream);
            debug_assert!(m <= MAX_M);
            // SAFETY: as above; `vector_ok` checked the alignment.
            unsafe { self.gemv_launch(&plan, tp, jobs.len(), vector)? };
        }
        let y = self.stream.clone_dtoh(&y_dev)?;
        Ok(y.chunks(m * rows).map(<[f32]>::to_vec).collect())
    }
}
