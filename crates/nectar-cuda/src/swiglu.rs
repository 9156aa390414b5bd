//! SwiGLU MLPs on the GPU with their activations kept there: `down(silu(gate·x) ⊙ up·x)` for a
//! batch of MLPs of one shape (a layer's experts, a shared expert). The host uploads each MLP's
//! x once and downloads its output; the gate and up products of the whole batch share one
//! launch, the combine runs on the GPU (`swiglu.cu`), the downs share one launch. Computed as
//! three separate products, each MLP crossed PCIe five times instead (x up for gate and again
//! for up, g and u down, the combine up, the output down), with a wait after each product.
//!
//! The products run the kernels every product of their shapes gets ([`Kernel::model`]), so
//! their bits are those of the separate products; the combine is the CPU's formula, within
//! `expf`'s 2 ulp of it.
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::gemv::{GpuMat, Job, Kernel};
use crate::view::MatView;
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

/// One MLP's matrices in VRAM: gate and up (`inter × hidden`), then down (`hidden × inter`).
pub type SwiGluMats<'a> = [&'a GpuMat; 3];

/// Threads per block of the combine.
const COMBINE_THREADS: u32 = 256;

impl Gpu {
    /// `down_j(silu(gate_j·x_j) ⊙ up_j·x_j)` for MLPs of one shape, `m` rows each (`xs[j]`:
    /// `m × hidden`), synchronously. Returns each MLP's `m × hidden` output.
    pub fn swiglu_batch(
        &self,
        mlps: &[SwiGluMats<'_>],
        xs: &[&[f32]],
        m: usize,
    ) -> Result<Vec<Vec<f32>>> {
        // SAFETY: each view is an uploaded matrix borrowed (alive, unchanged) for this call.
        unsafe { self.swiglu_views(&self.mlp_views(mlps), xs, m) }
    }

    /// The device views of uploaded MLPs, for the `*_views` / `*_rows` calls (valid while the
    /// matrices are borrowed).
    pub(crate) fn mlp_views(&self, mlps: &[SwiGluMats<'_>]) -> Vec<[MatView; 3]> {
        mlps.iter()
            .map(|w| w.map(|w| w.view(&self.stream)))
            .collect()
    }

    /// [`Gpu::swiglu_batch`] over matrices at device addresses (an expert staged by
    /// [`crate::copy::Staging`]): the same launches, so the same bits as the same MLP held in
    /// VRAM.
    ///
    /// # Safety
    /// Each view must describe memory of this context that holds its matrix (weights and scales
    /// of the view's format and shape) and that stays unchanged until this call returns.
    pub unsafe fn swiglu_views(
        &self,
        mlps: &[[MatView; 3]],
        xs: &[&[f32]],
        m: usize,
    ) -> Result<Vec<Vec<f32>>> {
        let Some((inter, hidden)) = chain_shape(mlps)? else {
            return Ok(Vec::new());
        };
        if xs.len() != mlps.len() {
            return Err(Error::Shape(format!(
                "swiglu: {} inputs for {} MLPs",
                xs.len(),
                mlps.len()
            )));
        }
        if let Some(x) = xs.iter().find(|x| Some(x.len()) != m.checked_mul(hidden)) {
            return Err(Error::Shape(format!(
                "swiglu: x has {} values, want m × hidden = {m} × {hidden}",
                x.len()
            )));
        }
        let n = mlps.len();
        if m == 0 || hidden == 0 || inter == 0 {
            return Ok(vec![vec![0.0; m * hidden]; n]);
        }
        let x_dev = self.to_device(&xs.concat())?;
        let y = self.nan_filled(n * m * hidden)?;
        let (xp, _x_sync) = x_dev.device_ptr(&self.stream);
        let (yp, _y_sync) = y.device_ptr(&self.stream);
        let io: Vec<(u64, u64)> = (0..n)
            .map(|j| (at(xp, j * m * hidden), at(yp, j * m * hidden)))
            .collect();
        // SAFETY: the views are this fn's contract; each (x, y) is m rows of this call's
        // buffers, which nothing else uses.
        unsafe { self.enqueue_swiglu(mlps, &io, m)? };
        let out = self.to_host(&y)?;
        Ok(out.chunks(m * hidden).map(<[f32]>::to_vec).collect())
    }

    /// A buffer of `len` f32 filled with NaN (0xff bytes): the output of launches that must
    /// write every element — one left unwritten comes back NaN, which every parity test rejects.
    pub(crate) fn nan_filled(&self, len: usize) -> Result<CudaSlice<f32>> {
        // SAFETY: filled below before anything reads it.
        let y: CudaSlice<f32> = unsafe { self.stream.alloc(len)? };
        let (yp, sync) = y.device_ptr(&self.stream);
        // SAFETY: `yp` addresses `len` f32 of this context.
        unsafe {
            cudarc::driver::result::memset_d8_async(yp, 0xff, len * 4, self.stream.cu_stream())?
        };
        drop(sync);
        Ok(y)
    }

    /// Queues `down_j(silu(gate_j·x_j) ⊙ up_j·x_j)` for MLPs of one shape ([`chain_shape`]),
    /// `m` rows each, reading x_j and writing y_j at the device addresses `io[j]`: gate and up
    /// of every MLP in one launch (two if their shapes differ), the combine, the downs in one
    /// launch. Nothing waits; the gate/up scratch is freed in stream order.
    ///
    /// # Safety
    /// As [`Gpu::swiglu_views`] for the views; each `io[j]` holds `m × hidden` f32 of this
    /// context at x (unchanged) and y (unused by anything else) until the stream passes here.
    pub(crate) unsafe fn enqueue_swiglu(
        &self,
        mlps: &[[MatView; 3]],
        io: &[(u64, u64)],
        m: usize,
    ) -> Result<()> {
        let Some((inter, _)) = chain_shape(mlps)? else {
            return Ok(());
        };
        let [g0, u0, d0] = mlps[0];
        let n = mlps.len();
        if io.len() != n {
            return Err(Error::Shape(format!(
                "swiglu: {} buffers for {n} MLPs",
                io.len()
            )));
        }
        if m == 0 || inter == 0 {
            return Ok(());
        }
        // Gate outputs of every MLP, then up outputs: [2][n][m][inter]. Every element is
        // written by the first launch(es) before the combine reads it.
        // SAFETY: as just said.
        let gu: CudaSlice<f32> = unsafe { self.stream.alloc(2 * n * m * inter)? };
        let (gp, _g_sync) = gu.device_ptr(&self.stream);
        let job = |v: MatView, x: u64, y: u64| v.job(x, y);
        let gates: Vec<Job> = (0..n)
            .map(|j| job(mlps[j][0], io[j].0, at(gp, j * m * inter)))
            .collect();
        let ups: Vec<Job> = (0..n)
            .map(|j| job(mlps[j][1], io[j].0, at(gp, (n + j) * m * inter)))
            .collect();
        let downs: Vec<Job> = (0..n)
            .map(|j| job(mlps[j][2], at(gp, j * m * inter), io[j].1))
            .collect();
        let first = |w: MatView| Kernel::model(w.format, w.rows, w.cols, m);
        // SAFETY (the three launches): every job's weights are a matrix of the launch's shape
        // (this fn's contract); its x and y are m rows of the caller's buffers or of `gu`.
        unsafe {
            if shape(&g0) == shape(&u0) {
                let both = [gates, ups].concat();
                self.launch_jobs(shape(&g0), m, first(g0), &both)?;
            } else {
                self.launch_jobs(shape(&g0), m, first(g0), &gates)?;
                self.launch_jobs(shape(&u0), m, first(u0), &ups)?;
            }
        }
        let count = n * m * inter;
        let func = self.function("swiglu_combine")?;
        let blocks = count.div_ceil(COMBINE_THREADS as usize).min(65_535) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (COMBINE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (g_arg, u_arg, len) = (gp, at(gp, count), count as i64);
        let mut b = self.stream.launch_builder(&func);
        b.arg(&g_arg).arg(&u_arg).arg(&len);
        // SAFETY: g and u are the two halves of `gu` (count floats each), written above.
        unsafe { b.launch(cfg) }?;
        // SAFETY: as the first launches.
        unsafe { self.launch_jobs(shape(&d0), m, first(d0), &downs) }
    }
}

/// The address `floats` f32 past `base`.
pub(crate) fn at(base: u64, floats: usize) -> u64 {
    base + (floats * 4) as u64
}

fn shape(w: &MatView) -> (nectar_kernels::WeightFormat, usize, usize) {
    (w.format, w.rows, w.cols)
}

/// `(inter, hidden)` of MLPs that all have MLP 0's shapes and whose matrices chain (gate and up
/// `inter × hidden`, down `hidden × inter`); `None` for no MLP.
pub(crate) fn chain_shape(mlps: &[[MatView; 3]]) -> Result<Option<(usize, usize)>> {
    let Some(&[g0, u0, d0]) = mlps.first() else {
        return Ok(None);
    };
    let (inter, hidden) = (g0.rows, g0.cols);
    for (j, [g, u, d]) in mlps.iter().enumerate() {
        if shape(g) != shape(&g0) || shape(u) != shape(&u0) || shape(d) != shape(&d0) {
            return Err(Error::Shape(format!(
                "swiglu: MLP {j} differs from MLP 0's shapes"
            )));
        }
    }
    if (u0.rows, u0.cols, d0.rows, d0.cols) != (inter, hidden, hidden, inter) {
        return Err(Error::Shape(format!(
            "swiglu: gate {inter}x{hidden}, up {}x{}, down {}x{} do not chain",
            u0.rows, u0.cols, d0.rows, d0.cols
        )));
    }
    Ok(Some((inter, hidden)))
}
