//! A weight matrix in its stored format, applied through `nectar-kernels`.
use crate::error::{Error, Result};
use nectar_format::{Bytes, Floats};
use nectar_kernels::{matmul, MatRef, WeightFormat};

/// y = W·x for a `[rows, cols]` weight kept in its stored format (never widened in memory).
#[derive(Debug, Clone)]
pub struct Linear {
    /// Checkpoint name (for errors and reports).
    pub name: String,
    /// Stored format.
    pub format: WeightFormat,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    data: Bytes,
    /// The scales of a quantised format: a view of the map beside `data` when that is one.
    scales: Floats,
    /// Bytes of the stored matrix (weights + scales), wherever it is held.
    stored: usize,
    /// False once the host copy was released for a VRAM copy ([`Linear::place_on_gpu`]):
    /// `data` and `scales` are then empty and every product runs on the GPU.
    host: bool,
    /// A copy in VRAM (`--gpu-memory`); when present, [`Linear::forward`] runs on the GPU.
    #[cfg(feature = "cuda")]
    gpu: Option<std::sync::Arc<super::gpu::GpuWeight>>,
}

impl Linear {
    /// Wraps stored bytes (already validated against the shape by the loader).
    pub fn new(
        name: String,
        format: WeightFormat,
        rows: usize,
        cols: usize,
        data: Bytes,
        scales: impl Into<Floats>,
    ) -> Result<Self> {
        let scales = scales.into();
        MatRef::new(format, rows, cols, &data, &scales)?;
        Ok(Linear {
            name,
            format,
            rows,
            cols,
            stored: data.len() + scales.len() * 4,
            data,
            scales,
            host: true,
            #[cfg(feature = "cuda")]
            gpu: None,
        })
    }

    /// The kernel view of the whole matrix in host memory; an error when its host copy was
    /// released for a VRAM copy (only the GPU can compute with it then).
    pub fn mat(&self) -> Result<MatRef<'_>> {
        if !self.host {
            return Err(Error::HostReleased(self.name.clone()));
        }
        Ok(MatRef {
            format: self.format,
            rows: self.rows,
            cols: self.cols,
            data: &self.data,
            scales: &self.scales,
        })
    }

    /// `m` rows of `x` (`m × cols`) → `m × rows`: on the GPU when the matrix was placed there
    /// ([`Linear::place_on_gpu`]; equal to the CPU's within `nectar_cuda::within_tolerance`),
    /// else on the CPU kernels.
    pub fn forward(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let mut y = vec![0.0; m * self.rows];
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.gpu {
            g.matmul(x, m, &mut y)?;
            return Ok(y);
        }
        matmul(&self.mat()?, x, m, &mut y)?;
        Ok(y)
    }

    /// [`Linear::forward`] of several matrices over the same `x` (a layer's projections of one
    /// hidden state): where all are on one GPU and take the GEMV, one round trip instead of one
    /// each; the same bits as calling each, which is what happens otherwise.
    pub fn forward_each<const N: usize>(
        ls: [&Linear; N],
        x: &[f32],
        m: usize,
    ) -> Result<[Vec<f32>; N]> {
        #[cfg(feature = "cuda")]
        if let Some(ws) = ls
            .iter()
            .map(|l| l.gpu.as_deref())
            .collect::<Option<Vec<_>>>()
        {
            if let Some(ys) = super::gpu::GpuWeight::matmul_each(&ws, x, m)? {
                return ys.try_into().map_err(|_| {
                    crate::error::Error::Gpu(
                        "a round trip returned another number of outputs".into(),
                    )
                });
            }
        }
        let mut out: [Vec<f32>; N] = std::array::from_fn(|_| Vec::new());
        for (y, l) in out.iter_mut().zip(ls) {
            *y = l.forward(x, m)?;
        }
        Ok(out)
    }

    /// Copies the matrix to `gpu`; later [`Linear::forward`] calls run there. With
    /// `copy.release_host` the host copy is dropped once uploaded, so the matrix costs no RAM
    /// (the caller then never asks for [`Linear::mat`], which would fail). Returns the device
    /// bytes used.
    #[cfg(feature = "cuda")]
    pub fn place_on_gpu(
        &mut self,
        gpu: &std::sync::Arc<nectar_cuda::Gpu>,
        copy: super::GpuCopy,
    ) -> Result<usize> {
        let w = super::gpu::GpuWeight::upload(gpu, &self.mat()?, copy.stored_layout)?;
        let bytes = w.device_bytes();
        self.gpu = Some(std::sync::Arc::new(w));
        if copy.release_host {
            // An owned buffer is freed here (a shared one when its last holder goes); a map
            // view only drops its handle. Loaders read matrices to release into owned buffers.
            self.data = Bytes::Owned(std::sync::Arc::new(Vec::new()));
            self.scales = Vec::new().into();
            self.host = false;
        }
        Ok(bytes)
    }

    /// The GPU holding its VRAM copy, if any (other kernels that consume its products there,
    /// such as prefill attention, run on the same device).
    #[cfg(feature = "cuda")]
    pub fn gpu(&self) -> Option<&std::sync::Arc<nectar_cuda::Gpu>> {
        self.gpu.as_ref().map(|g| g.gpu())
    }

    /// Rows `first ..` of an MLA key buffer rebuilt in VRAM from `latent` (`m × cols`): this
    /// matrix is the layer's kv_b, placed on the GPU that holds `keys` ([`Linear::gpu`]). The
    /// bits [`Linear::forward`] would give, without the host round trip.
    #[cfg(feature = "cuda")]
    pub fn rebuild_mla_keys(
        &self,
        keys: &mut nectar_cuda::MlaKeys,
        first: usize,
        latent: &[f32],
    ) -> Result<()> {
        let g = self.gpu_weight().ok_or_else(|| {
            crate::error::Error::Gpu(
                "kv_b is not on the GPU: MLA keys are rebuilt where kv_b is".into(),
            )
        })?;
        g.rebuild_keys(keys, first, latent)
    }

    /// Its VRAM copy, if any.
    #[cfg(feature = "cuda")]
    pub(crate) fn gpu_weight(&self) -> Option<&super::gpu::GpuWeight> {
        self.gpu.as_deref()
    }

    /// Device bytes of its VRAM copy (0 without one).
    #[cfg(feature = "cuda")]
    pub fn device_bytes(&self) -> usize {
        self.gpu.as_ref().map_or(0, |g| g.device_bytes())
    }

    /// Whether [`Linear::forward`] runs on the GPU.
    pub fn on_gpu(&self) -> bool {
        #[cfg(feature = "cuda")]
        return self.gpu.is_some();
        #[cfg(not(feature = "cuda"))]
        false
    }

    /// Whether its scales are a view of the model file's map (a resident load's) rather than
    /// a copy in process memory.
    pub fn scales_mapped(&self) -> bool {
        self.scales.is_mapped()
    }

    /// Bytes of the stored matrix (weights + scales), wherever it is held.
    pub fn bytes(&self) -> usize {
        self.stored
    }

    /// Bytes of it held in host memory: [`Linear::bytes`], or 0 once released for a VRAM
    /// copy.
    pub fn host_bytes(&self) -> usize {
        if self.host {
            self.stored
        } else {
            0
        }
    }
}
