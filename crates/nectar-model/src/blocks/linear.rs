//! A weight matrix in its stored format, applied through `nectar-kernels`.
use crate::error::{Error, Result};
use nectar_format::Bytes;
use nectar_kernels::{decode_row, matmul, team, MatRef, WeightFormat};

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
        scales: Vec<f32>,
    ) -> Result<Self> {
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
            self.scales = Vec::new();
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

/// A token-embedding table: rows are gathered and dequantised one at a time, so no f32 copy
/// of the table ever exists.
#[derive(Debug, Clone)]
pub struct Embedding(pub Linear);

impl Embedding {
    /// The f32 embedding of every token, into consecutive rows of `out` (`tokens.len() ×
    /// hidden`): a prompt's rows on the compute team (each row alone: the same bits). A token
    /// outside the vocabulary is an error naming it.
    pub fn rows(&self, tokens: &[u32], out: &mut [f32]) -> Result<()> {
        let hidden = self.0.cols;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.0.rows) {
            return Err(crate::Error::Input(format!(
                "token id {t} is outside the vocabulary (size {})",
                self.0.rows
            )));
        }
        if tokens.is_empty() {
            return Ok(());
        }
        if out.len() != tokens.len() * hidden || hidden == 0 {
            return Err(crate::Error::Input(format!(
                "embedding: {} values for {} tokens of {hidden}",
                out.len(),
                tokens.len()
            )));
        }
        let mat = self.0.mat()?;
        team::for_each_row_mut(out, hidden, |i, r| decode_row(&mat, tokens[i] as usize, r));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An f32 table of `rows` rows of `cols`, row r = [r·100 + c].
    fn table(rows: usize, cols: usize) -> Embedding {
        let v: Vec<u8> = (0..rows * cols)
            .flat_map(|i| ((i / cols * 100 + i % cols) as f32).to_le_bytes())
            .collect();
        let data = Bytes::Owned(std::sync::Arc::new(v));
        Embedding(Linear::new("embed".into(), WeightFormat::F32, rows, cols, data, vec![]).unwrap())
    }

    #[test]
    fn embedding_rows_gather_each_token_and_name_a_bad_one() {
        let e = table(40, 3);
        // More rows than the team's threshold, so the parallel path runs too.
        let tokens: Vec<u32> = (0..20).map(|i| (i * 7 % 40) as u32).collect();
        let mut out = vec![f32::NAN; tokens.len() * 3];
        e.rows(&tokens, &mut out).unwrap();
        for (r, &t) in tokens.iter().enumerate() {
            let want: Vec<f32> = (0..3).map(|c| (t as usize * 100 + c) as f32).collect();
            assert_eq!(&out[r * 3..r * 3 + 3], &want[..], "row {r}, token {t}");
        }
        let err = e.rows(&[1, 40], &mut [0.0; 6]).unwrap_err().to_string();
        assert!(
            err.contains("token id 40") && err.contains("size 40"),
            "{err}"
        );
        assert!(e.rows(&[1, 2], &mut [0.0; 5]).is_err());
        assert!(e.rows(&[], &mut []).is_ok());
    }
}
