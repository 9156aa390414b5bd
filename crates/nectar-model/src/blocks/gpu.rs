//! A [`super::Linear`]'s copy in VRAM and the product that uses it (`--features cuda`).
use crate::error::{Error, Result};
use nectar_cuda::{use_gemm, Gpu, GpuMat, Order, Precision};
use nectar_kernels::MatRef;
use std::sync::Arc;

/// A weight matrix resident on a GPU.
#[derive(Debug)]
pub(crate) struct GpuWeight {
    gpu: Arc<Gpu>,
    mat: GpuMat,
}

fn gpu_err(e: nectar_cuda::Error) -> Error {
    Error::Gpu(e.to_string())
}

impl GpuWeight {
    pub(crate) fn upload(gpu: &Arc<Gpu>, w: &MatRef<'_>) -> Result<Self> {
        Ok(GpuWeight {
            gpu: gpu.clone(),
            mat: gpu.upload(w).map_err(gpu_err)?,
        })
    }

    /// The GPU it lives on.
    pub(crate) fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub(crate) fn device_bytes(&self) -> usize {
        self.mat.device_bytes()
    }

    /// yᵢ = Wᵢ·xᵢ for several products (`(weight, x, rows of x)`), each computed as
    /// [`GpuWeight::matmul`] would: decode-sized products of one format, shape and row count
    /// share a GEMV launch. Outputs in the order given. All weights must be on one GPU.
    pub(crate) fn matmul_many(items: &[(&GpuWeight, &[f32], usize)]) -> Result<Vec<Vec<f32>>> {
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); items.len()];
        let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
        for (i, (w, _, m)) in items.iter().enumerate() {
            let key = |j: usize| {
                let (v, _, mj) = items[j];
                (v.mat.format, v.mat.rows, v.mat.cols, mj)
            };
            match groups
                .iter_mut()
                .find(|(first, _)| key(*first) == (w.mat.format, w.mat.rows, w.mat.cols, *m))
            {
                Some((_, g)) => g.push(i),
                None => groups.push((i, vec![i])),
            }
        }
        for (first, g) in groups {
            let (w0, _, m) = items[first];
            if w0.takes_gemm(m) {
                // Prompt-sized products: each on the tensor cores, as `matmul` runs them.
                for i in g {
                    let (w, x, m) = items[i];
                    out[i] = vec![0.0; w.mat.rows * m];
                    w.matmul(x, m, &mut out[i])?;
                }
                continue;
            }
            let batch: Vec<(&GpuMat, &[f32])> =
                g.iter().map(|&i| (&items[i].0.mat, items[i].1)).collect();
            let ys = w0
                .gpu
                .matmul_batch(&batch, m, Order::MODEL)
                .map_err(gpu_err)?;
            for (i, y) in g.into_iter().zip(ys) {
                out[i] = y;
            }
        }
        Ok(out)
    }

    /// Whether an `m`-row product with this matrix runs on the tensor cores (nectar-cuda's
    /// per-shape rule, [`use_gemm`]).
    fn takes_gemm(&self, m: usize) -> bool {
        use_gemm(self.mat.format, self.mat.rows, self.mat.cols, m)
    }

    /// y = W·x: by the GEMV kernels in nectar-cuda's model order ([`Order::MODEL`]: the
    /// tensor-core GEMV where the layout admits it) — always up to 8 rows (decode, MTP
    /// verify) — or, where [`use_gemm`] says that is
    /// faster for this shape (prefill, batched verify), on the tensor cores, activations split
    /// into three bf16 parts (`gemm.cu`).
    pub(crate) fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) -> Result<()> {
        if self.takes_gemm(m) {
            self.gpu.gemm(&self.mat, x, m, y, Precision::Split3)
        } else {
            self.gpu.matmul(&self.mat, x, m, y, Order::MODEL)
        }
        .map_err(gpu_err)
    }
}

impl GpuWeight {
    /// Keys `first ..` of `keys` rebuilt in VRAM from `latent` (`m × cols`) by this matrix (an
    /// MLA layer's kv_b), with the kernel [`GpuWeight::matmul`] would use, so the same bits.
    pub(crate) fn rebuild_keys(
        &self,
        keys: &mut nectar_cuda::MlaKeys,
        first: usize,
        latent: &[f32],
    ) -> Result<()> {
        self.gpu
            .mla_rebuild_kv(keys, first, &self.mat, latent)
            .map_err(gpu_err)
    }
}

/// Opens GPU 0 for the model, or says why there is none (the caller then stays on the CPU).
pub fn open_gpu() -> std::result::Result<Arc<Gpu>, String> {
    Gpu::open(0).map(Arc::new).map_err(|e| e.to_string())
}
