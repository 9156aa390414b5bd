//! Activations kept in VRAM between two steps of a layer ([`GpuRows`]): a product's output that
//! the next GPU step reads where it lies instead of a download and an upload — a prompt's
//! queries, from `q_b` through RoPE ([`Gpu::rope_heads`]) to the attention
//! ([`Gpu::mla_attention_rows`]): 201 MB each way per layer at 4,096 rows of GLM-5.2.
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::gemv::{GpuMat, Kernel};
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

/// Largest rotary half-width the RoPE kernel takes (`ROPE_MAX_HALF` in `rope.cu`).
pub const ROPE_MAX_HALF: usize = 128;

/// `rows × width` f32 in VRAM.
#[derive(Debug)]
pub struct GpuRows {
    pub(crate) buf: CudaSlice<f32>,
    rows: usize,
    width: usize,
}

impl GpuRows {
    pub(crate) fn new(buf: CudaSlice<f32>, rows: usize, width: usize) -> GpuRows {
        GpuRows { buf, rows, width }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// f32 per row.
    pub fn width(&self) -> usize {
        self.width
    }

    pub(crate) fn len(&self) -> usize {
        self.rows * self.width
    }
}

impl Gpu {
    /// y = W·x for `m` rows of `x`, left in VRAM: the kernel every `m`-row product with `w`
    /// gets ([`Kernel::model`]), so [`Gpu::download_rows`] of it gives [`Gpu::matmul`] /
    /// [`Gpu::gemm`]'s bits as the model calls them.
    pub fn matmul_keep(&self, w: &GpuMat, x: &[f32], m: usize) -> Result<GpuRows> {
        if Some(x.len()) != m.checked_mul(w.cols) || m == 0 || w.rows == 0 {
            return Err(Error::Shape(format!(
                "matmul: x has {} values for {m} rows of a {}x{} matrix (none may be 0)",
                x.len(),
                w.rows,
                w.cols
            )));
        }
        let x_dev = self.to_device(x)?;
        let (xp, _x_sync) = x_dev.device_ptr(&self.stream);
        // SAFETY: xp holds the m × cols f32 just uploaded, alive for this call.
        let y = unsafe { self.model_product(w, xp, m)? };
        Ok(GpuRows {
            buf: y,
            rows: m,
            width: w.rows,
        })
    }

    /// `w` times the `m` rows at device address `xp` (`m × cols` f32) by the kernel every
    /// `m`-row product with `w` gets ([`Kernel::model`]), into a new `m × rows` buffer.
    ///
    /// # Safety
    /// `xp` must address `m × w.cols` f32 of this context, unchanged until the stream passes.
    pub(crate) unsafe fn model_product(
        &self,
        w: &GpuMat,
        xp: u64,
        m: usize,
    ) -> Result<CudaSlice<f32>> {
        let y = self.nan_filled(m * w.rows)?;
        let (yp, y_sync) = y.device_ptr(&self.stream);
        let job = w.view(&self.stream).job(xp, yp);
        let kernel = Kernel::model(w.format, w.rows, w.cols, m);
        // SAFETY: the job's weights are `w` (borrowed, alive), its x this fn's contract, its y
        // this call's buffer of m × rows f32.
        unsafe { self.launch_jobs((w.format, w.rows, w.cols), m, kernel, &[job])? };
        drop(y_sync);
        Ok(y)
    }

    /// The rows, downloaded.
    pub fn download_rows(&self, rows: &GpuRows) -> Result<Vec<f32>> {
        self.to_host(&rows.buf)
    }

    /// Rotates, in every row of `x` (rows of `heads` heads of `head_dim` f32), each head's
    /// `2 · half` dims from `offset` by the row's angles `sc` (`rows × half` pairs of (sin, cos),
    /// nectar-kernels' `RopeTable::sin_cos`): the bits of `RopeTable::rotate` on the host.
    pub fn rope_heads(
        &self,
        x: &mut GpuRows,
        heads: usize,
        offset: usize,
        sc: &[(f32, f32)],
    ) -> Result<()> {
        let rows = x.rows;
        let head_dim = x.width / heads.max(1);
        let half = sc.len() / rows.max(1);
        if heads == 0
            || head_dim * heads != x.width
            || half * rows != sc.len()
            || half > ROPE_MAX_HALF
            || offset + 2 * half > head_dim
            || rows * heads > i32::MAX as usize
        {
            return Err(Error::Shape(format!(
                "rope: {rows} rows of {} f32 as {heads} heads, {} angles, offset {offset}",
                x.width,
                sc.len()
            )));
        }
        if rows == 0 || half == 0 {
            return Ok(());
        }
        let flat: Vec<f32> = sc.iter().flat_map(|&(s, c)| [s, c]).collect();
        let sc_dev = self.stream.clone_htod(&flat)?;
        let func = self.function("rope_heads")?;
        let threads = 128u32;
        let cfg = LaunchConfig {
            grid_dim: ((rows * heads).div_ceil(threads as usize) as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let dims = [rows, heads, head_dim, offset, half].map(|d| d as i32);
        let mut b = self.stream.launch_builder(&func);
        b.arg(&mut x.buf).arg(&sc_dev);
        for d in &dims {
            b.arg(d);
        }
        // SAFETY: x holds rows × heads × head_dim f32 and sc_dev rows × half pairs (checked
        // above); each thread touches only its own (row, head)'s dims offset .. offset + 2·half,
        // inside the head; half ≤ the kernel's local buffer.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}
