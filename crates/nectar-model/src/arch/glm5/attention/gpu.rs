//! The reconstructed MLA form of a prefill chunk on the GPU (`nectar_cuda::Gpu::mla_prefill`),
//! for sequences whose `kv_b` is in VRAM: K/V are rebuilt by kv_b's product on the GPU in
//! blocks of keys, each written straight into VRAM (no key crosses PCIe, no host copy exists,
//! no size limit applies beyond the GPU's memory), then every (row, head) of the chunk runs in
//! one launch.
//!
//! Equal to the CPU form within reordering error (the scores are the same sums in another
//! order, the softmax online over tiles of keys; `attention.cu` states the order), so parity is
//! by tolerance like every GPU product. `NECTAR_GPU_ATTENTION=off` keeps attention on the CPU
//! (measurement of the two paths in one build).
use super::{Attention, MlaMode, ABSORBED_MAX_ROWS, RECON_MAX_BYTES};
use crate::arch::glm5::layout::Layout;
use crate::arch::glm5::phases::{Lap, Phase};
use crate::cache::LayerCache;
use crate::error::{Error, Result};

/// Whether `NECTAR_GPU_ATTENTION` leaves the GPU paths on (prefill and decode; anything but
/// `off` / `0`), read once.
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var("NECTAR_GPU_ATTENTION").as_deref(),
            Ok("off" | "0")
        )
    })
}

fn gpu_err(e: nectar_cuda::Error) -> Error {
    Error::Gpu(e.to_string())
}

impl Attention {
    /// The GPU and head geometry when this layer's prefill attention runs there (kv_b in VRAM,
    /// the kernel takes the heads, not switched off).
    pub(super) fn gpu_attention(
        &self,
    ) -> Option<(&std::sync::Arc<nectar_cuda::Gpu>, nectar_cuda::MlaShape)> {
        let gpu = self.kv_b.gpu().filter(|_| enabled())?;
        let shape = nectar_cuda::MlaShape {
            heads: self.heads,
            dn: self.dn,
            dr: self.dr,
            dv: self.dv,
        };
        shape.supported().then_some((gpu, shape))
    }

    /// Whether a sequence adding `n` rows takes the GPU's attention (given [`Self::gpu_attention`]).
    fn gpu_takes(n: usize, mode: MlaMode) -> bool {
        match mode {
            MlaMode::Auto => n > ABSORBED_MAX_ROWS,
            MlaMode::Absorbed => false,
            MlaMode::Reconstructed | MlaMode::ReconstructedInBlocks { .. } => n > 0,
        }
    }

    /// A prompt's queries kept in VRAM: when one sequence's rows are the whole batch and its
    /// attention will run on the GPU with `q_b` there, `q_b`'s product and the queries' RoPE run
    /// on the GPU and the queries stay for the attention (`None`: the host computes them). The
    /// same bits: `q_b`'s model kernel, RoPE by the host's angles and operations.
    pub(super) fn gpu_queries(
        &self,
        layout: &Layout,
        mode: MlaMode,
        cq: &[f32],
        rope: &nectar_kernels::RopeTable,
    ) -> Result<Option<nectar_cuda::GpuRows>> {
        let m = layout.rows.len();
        let (Some((gpu, shape)), Some(qb)) = (self.gpu_attention(), self.q_b.gpu_weight()) else {
            return Ok(None);
        };
        let whole = matches!(layout.seqs.as_slice(), [r] if r.len() == m);
        if !whole
            || !Self::gpu_takes(m, mode)
            || !std::sync::Arc::ptr_eq(gpu, qb.gpu())
            || rope.dim() != shape.dr
            || shape.dr / 2 > nectar_cuda::ROPE_MAX_HALF
        {
            return Ok(None);
        }
        let mut q = qb.matmul_keep(cq, m)?;
        let sc: Vec<(f32, f32)> = layout
            .rows
            .iter()
            .flat_map(|r| rope.sin_cos(r.rope))
            .collect();
        gpu.rope_heads(&mut q, shape.heads, shape.dn, &sc)
            .map_err(gpu_err)?;
        Ok(Some(q))
    }

    /// Per sequence of `layout`: its rows' attention outputs (`rows × heads × dv`, left in
    /// VRAM) when they ran on the GPU, else `None` (the CPU forms run them). `q_dev`: the
    /// queries [`Self::gpu_queries`] kept in VRAM (then `q` is empty).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gpu_prefill(
        &self,
        layout: &Layout,
        caches: &[&LayerCache],
        sel: &[Option<Vec<u32>>],
        q: &[f32],
        q_dev: Option<&nectar_cuda::GpuRows>,
        mode: MlaMode,
        lap: &mut Lap<'_>,
    ) -> Result<Vec<Option<nectar_cuda::MlaOutput>>> {
        let mut out: Vec<_> = layout.seqs.iter().map(|_| None).collect();
        let Some((gpu, shape)) = self.gpu_attention() else {
            return Ok(out);
        };
        let dq = self.dn + self.dr;
        for (s, rows) in layout.seqs.iter().enumerate() {
            let n = rows.len();
            if !Self::gpu_takes(n, mode) {
                continue;
            }
            let c = caches[s];
            let t = c.len();
            let mut keys = gpu
                .mla_keys(shape, t, &c.k_pe[..t * self.dr])
                .map_err(gpu_err)?;
            // kv_b over blocks of keys (each at most the CPU form's buffer, as before, so the
            // same kernels and bits), its output written straight into the keys in VRAM.
            let block = (RECON_MAX_BYTES / (shape.kv_width() * 4)).max(1);
            for first in (0..t).step_by(block) {
                let end = (first + block).min(t);
                let latent = &c.latent[first * self.rank..end * self.rank];
                self.kv_b.rebuild_mla_keys(&mut keys, first, latent)?;
            }
            lap.mark(Phase::KvB);
            let pos: Vec<u32> = layout.rows[rows.clone()]
                .iter()
                .map(|r| r.pos as u32)
                .collect();
            let sel: Vec<Option<&[u32]>> = sel[rows.clone()].iter().map(Option::as_deref).collect();
            out[s] = Some(
                match q_dev {
                    Some(qd) => gpu.mla_attention_rows(&keys, self.scale, qd, &pos, &sel),
                    None => {
                        let qs = &q[rows.start * self.heads * dq..rows.end * self.heads * dq];
                        gpu.mla_attention(&keys, self.scale, qs, &pos, &sel)
                    }
                }
                .map_err(gpu_err)?,
            );
            lap.mark(Phase::AttnCore);
            self.gpu_rows
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(out)
    }

    /// The layer's output straight from the GPU when one sequence's rows are the whole batch,
    /// its attention ran there and o_proj is in VRAM (a prompt's prefill): o_proj multiplies the
    /// attention output where it lies (`GpuWeight::mla_project`, the bits of the round trip).
    /// Otherwise (`Err`) the outputs come down for the host's assembly (`None` per CPU
    /// sequence).
    pub(super) fn gpu_outputs(
        &self,
        layout: &Layout,
        dev: Vec<Option<nectar_cuda::MlaOutput>>,
    ) -> Result<std::result::Result<Vec<f32>, PerSeq>> {
        let m = layout.rows.len();
        if let ([Some(attn)], Some(o)) = (dev.as_slice(), self.o.gpu_weight()) {
            if layout.seqs[0].len() == m {
                return Ok(Ok(o.mla_project(attn)?));
            }
        }
        let gpu = self.kv_b.gpu();
        dev.into_iter()
            .map(|a| match (a, gpu) {
                (Some(a), Some(g)) => g.mla_download(&a).map(Some).map_err(gpu_err),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()
            .map(Err)
    }
}

/// Per sequence, its rows' attention outputs when the GPU ran them.
pub(super) type PerSeq = Vec<Option<Vec<f32>>>;
