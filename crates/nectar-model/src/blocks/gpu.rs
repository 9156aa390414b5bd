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
    /// `stored_layout`: as stored, for kernels that read single weights in place (the
    /// absorbed attention's kv_b); else int4 packed where it can be (`Gpu::upload`).
    pub(crate) fn upload(gpu: &Arc<Gpu>, w: &MatRef<'_>, stored_layout: bool) -> Result<Self> {
        let mat = match stored_layout {
            true => gpu.upload_stored(w),
            false => gpu.upload(w),
        };
        Ok(GpuWeight {
            gpu: gpu.clone(),
            mat: mat.map_err(gpu_err)?,
        })
    }

    /// The GPU it lives on.
    pub(crate) fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub(crate) fn device_bytes(&self) -> usize {
        self.mat.device_bytes()
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

    /// y_i = W_i·x for matrices on one GPU over one activation block (projections of one
    /// hidden state) in one round trip ([`nectar_cuda::Gpu::matmul_each`]), with the bits of
    /// each [`GpuWeight::matmul`]; `None` (nothing ran) where that cannot hold — matrices on
    /// different GPUs, or one that takes the GEMM at `m` rows.
    pub(crate) fn matmul_each(
        ws: &[&GpuWeight],
        x: &[f32],
        m: usize,
    ) -> Result<Option<Vec<Vec<f32>>>> {
        let Some(w0) = ws.first() else {
            return Ok(Some(Vec::new()));
        };
        if !ws
            .iter()
            .all(|w| Arc::ptr_eq(&w.gpu, &w0.gpu) && !w.takes_gemm(m))
        {
            return Ok(None);
        }
        let mats: Vec<&GpuMat> = ws.iter().map(|w| &w.mat).collect();
        w0.gpu
            .matmul_each(&mats, x, m, Order::MODEL)
            .map(Some)
            .map_err(gpu_err)
    }

    /// `down(silu(gate·x) ⊙ up·x)` for several MLPs (`([gate, up, down], x, rows of x)`) on the
    /// GPU, each MLP's activations kept in VRAM (`nectar_cuda::Gpu::swiglu_batch`): MLPs of one
    /// shape and row count share launches. The products' bits are [`GpuWeight::matmul`]'s; the
    /// combine is the CPU's formula within CUDA's `expf`. Outputs in the order given; all on one
    /// GPU.
    pub(crate) fn swiglu_many(items: &[([&GpuWeight; 3], &[f32], usize)]) -> Result<Vec<Vec<f32>>> {
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); items.len()];
        let key = |i: usize| {
            let (w, _, m) = items[i];
            let s = |g: &GpuWeight| (g.mat.format, g.mat.rows, g.mat.cols);
            (s(w[0]), s(w[1]), s(w[2]), m)
        };
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for i in 0..items.len() {
            match groups.iter_mut().find(|g| key(g[0]) == key(i)) {
                Some(g) => g.push(i),
                None => groups.push(vec![i]),
            }
        }
        for g in groups {
            let (w0, _, m) = items[g[0]];
            let mlps: Vec<nectar_cuda::SwiGluMats<'_>> =
                g.iter().map(|&i| items[i].0.map(|w| &w.mat)).collect();
            let xs: Vec<&[f32]> = g.iter().map(|&i| items[i].1).collect();
            let ys = w0[0].gpu.swiglu_batch(&mlps, &xs, m).map_err(gpu_err)?;
            for (i, y) in g.into_iter().zip(ys) {
                out[i] = y;
            }
        }
        Ok(out)
    }

    /// `down(silu(gate·x) ⊙ up·x)` for several MLPs, each over its rows of `x`, a MoE layer's
    /// input already in VRAM ([`nectar_cuda::Gpu::swiglu_rows`]: gathered there): the bits of
    /// [`GpuWeight::swiglu_many`] over the same rows gathered on the host.
    pub(crate) fn swiglu_rows(
        mlps: &[[&GpuWeight; 3]],
        x: &nectar_cuda::GpuRows,
        rows: &[&[u32]],
    ) -> Result<Vec<Vec<f32>>> {
        let Some(first) = mlps.first() else {
            return Ok(Vec::new());
        };
        let mats: Vec<[&GpuMat; 3]> = mlps.iter().map(|w| w.map(|w| &w.mat)).collect();
        first[0]
            .gpu
            .swiglu_rows_mats(&mats, x, rows)
            .map_err(gpu_err)
    }

    /// [`GpuWeight::swiglu_rows`] with each MLP's output left in VRAM, at pairs `first[j] ..`
    /// of a layer's outputs (`nectar_cuda::Gpu::swiglu_rows_into`): queued, the same bits.
    pub(crate) fn swiglu_rows_into(
        mlps: &[[&GpuWeight; 3]],
        x: &nectar_cuda::GpuRows,
        rows: &[&[u32]],
        out: &nectar_cuda::GpuMoeOut,
        first: &[usize],
    ) -> Result<()> {
        let Some(w0) = mlps.first() else {
            return Ok(());
        };
        let mats: Vec<[&GpuMat; 3]> = mlps.iter().map(|w| w.map(|w| &w.mat)).collect();
        w0[0]
            .gpu
            .swiglu_rows_into_mats(&mats, x, rows, out, first)
            .map_err(gpu_err)
    }

    /// The shared expert `mlp` over every row of `x` into a layer's outputs in VRAM
    /// (`nectar_cuda::Gpu::shared_into_mats`): queued, [`GpuWeight::swiglu_many`]'s bits.
    pub(crate) fn shared_into(
        mlp: [&GpuWeight; 3],
        x: &nectar_cuda::GpuRows,
        out: &nectar_cuda::GpuMoeOut,
    ) -> Result<()> {
        mlp[0]
            .gpu
            .shared_into_mats(mlp.map(|w| &w.mat), x, out)
            .map_err(gpu_err)
    }

    /// A MoE layer's output with its expert work all on the GPU (`nectar_cuda::Gpu::moe_batch`:
    /// `x` up once, each routed expert `([gate, up, down], its rows of x)` gathered and chained
    /// in VRAM, the shared expert, the weighted combine): the bits of running each expert by
    /// [`GpuWeight::swiglu_many`] and combining on the host. `None` when its buffers would not
    /// fit the VRAM free (nothing ran; the caller goes expert by expert).
    pub(crate) fn moe(
        x: &[f32],
        m: usize,
        experts: &[([&GpuWeight; 3], &[u32])],
        shared: [&GpuWeight; 3],
        combine: nectar_cuda::MoeCombine<'_>,
    ) -> Result<Option<Vec<f32>>> {
        let items: Vec<([&GpuMat; 3], &[u32])> = experts
            .iter()
            .map(|(w, rows)| (w.map(|w| &w.mat), *rows))
            .collect();
        match shared[0]
            .gpu
            .moe_batch(x, m, &items, shared.map(|w| &w.mat), combine)
        {
            Ok(y) => Ok(Some(y)),
            Err(nectar_cuda::Error::Memory { .. }) => Ok(None),
            Err(e) => Err(gpu_err(e)),
        }
    }

    /// This matrix (an MLA layer's o_proj) times an attention output left in VRAM, with the
    /// kernel [`GpuWeight::matmul`] would use for its rows, so the same bits without the round
    /// trip.
    pub(crate) fn mla_project(&self, attn: &nectar_cuda::MlaOutput) -> Result<Vec<f32>> {
        self.gpu.mla_project(attn, &self.mat).map_err(gpu_err)
    }

    /// The absorbed MLA form of decode rows over their mirrored caches, this matrix being the
    /// layer's kv_b ([`nectar_cuda::Gpu::mla_absorbed`]); the output stays in VRAM.
    pub(crate) fn mla_absorbed(
        &self,
        shape: nectar_cuda::MlaShape,
        scale: f32,
        rows: &[nectar_cuda::AbsorbedRow<'_>],
    ) -> Result<nectar_cuda::MlaOutput> {
        self.gpu
            .mla_absorbed(shape, scale, &self.mat, rows)
            .map_err(gpu_err)
    }

    /// y = W·x left in VRAM ([`nectar_cuda::Gpu::matmul_keep`]): [`GpuWeight::matmul`]'s bits.
    pub(crate) fn matmul_keep(&self, x: &[f32], m: usize) -> Result<nectar_cuda::GpuRows> {
        self.gpu.matmul_keep(&self.mat, x, m).map_err(gpu_err)
    }

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
