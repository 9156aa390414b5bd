//! A weight matrix in its stored format, applied through `nectar-kernels`.
use crate::error::Result;
use nectar_format::Bytes;
use nectar_kernels::{decode_row, matmul, MatRef, WeightFormat};

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
    scales: Vec<f32>,
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
        scales: Vec<f32>,
    ) -> Result<Self> {
        MatRef::new(format, rows, cols, &data, &scales)?;
        Ok(Linear {
            name,
            format,
            rows,
            cols,
            data,
            scales,
            #[cfg(feature = "cuda")]
            gpu: None,
        })
    }

    /// The kernel view of the whole matrix.
    pub fn mat(&self) -> MatRef<'_> {
        MatRef {
            format: self.format,
            rows: self.rows,
            cols: self.cols,
            data: &self.data,
            scales: &self.scales,
        }
    }

    /// The kernel view of rows `r0..r0 + n` (a head's block of a fused projection).
    pub fn rows_view(&self, r0: usize, n: usize) -> MatRef<'_> {
        let rb = self.format.row_bytes(self.cols);
        let rs = self.format.row_scales(self.cols);
        MatRef {
            format: self.format,
            rows: n,
            cols: self.cols,
            data: &self.data[r0 * rb..(r0 + n) * rb],
            scales: &self.scales[r0 * rs..(r0 + n) * rs],
        }
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
        matmul(&self.mat(), x, m, &mut y)?;
        Ok(y)
    }

    /// Copies the matrix to `gpu`; later [`Linear::forward`] calls run there. Returns the
    /// device bytes used.
    #[cfg(feature = "cuda")]
    pub fn place_on_gpu(&mut self, gpu: &std::sync::Arc<nectar_cuda::Gpu>) -> Result<usize> {
        let w = super::gpu::GpuWeight::upload(gpu, &self.mat())?;
        let bytes = w.device_bytes();
        self.gpu = Some(std::sync::Arc::new(w));
        Ok(bytes)
    }

    /// Whether [`Linear::forward`] runs on the GPU.
    pub fn on_gpu(&self) -> bool {
        #[cfg(feature = "cuda")]
        return self.gpu.is_some();
        #[cfg(not(feature = "cuda"))]
        false
    }

    /// Bytes held (weights + scales).
    pub fn bytes(&self) -> usize {
        self.data.len() + self.scales.len() * 4
    }
}

/// A token-embedding table: rows are gathered and dequantised one at a time, so no f32 copy
/// of the table ever exists.
#[derive(Debug, Clone)]
pub struct Embedding(pub Linear);

impl Embedding {
    /// Writes the f32 embedding of `token` into `out` (length = hidden size).
    pub fn row(&self, token: u32, out: &mut [f32]) -> Result<()> {
        let t = token as usize;
        if t >= self.0.rows {
            return Err(crate::Error::Input(format!(
                "token id {token} is outside the vocabulary (size {})",
                self.0.rows
            )));
        }
        decode_row(&self.0.mat(), t, out);
        Ok(())
    }
}
