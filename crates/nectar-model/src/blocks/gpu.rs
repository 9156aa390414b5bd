//! A [`super::Linear`]'s copy in VRAM and the product that uses it (`--features cuda`).
use crate::error::{Error, Result};
use nectar_cuda::{Gpu, GpuMat, Order, Precision, GEMM_MIN_M};
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

    pub(crate) fn device_bytes(&self) -> usize {
        self.mat.device_bytes()
    }

    /// y = W·x: below [`GEMM_MIN_M`] rows (decode, MTP verify) by the GEMV kernels with every
    /// weight dequantised to the CPU's value (the exact order); from there on (prefill, batched
    /// verify) on the tensor cores, activations split into three bf16 parts (`gemm.cu`).
    pub(crate) fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) -> Result<()> {
        if m >= GEMM_MIN_M {
            self.gpu.gemm(&self.mat, x, m, y, Precision::Split3)
        } else {
            self.gpu.matmul(&self.mat, x, m, y, Order::Exact)
        }
        .map_err(gpu_err)
    }
}

/// Opens GPU 0 for the model, or says why there is none (the caller then stays on the CPU).
pub fn open_gpu() -> std::result::Result<Arc<Gpu>, String> {
    Gpu::open(0).map(Arc::new).map_err(|e| e.to_string())
}
