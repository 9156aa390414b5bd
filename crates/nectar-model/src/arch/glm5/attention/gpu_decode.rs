//! The absorbed MLA form on the GPU (`nectar_cuda::Gpu::mla_absorbed`) for sequences adding
//! few rows (decode, MTP drafts, verify) whose layer has `kv_b` in VRAM: each sequence's layer
//! cache is mirrored in VRAM ([`crate::cache::LayerCache`]'s device mirror, synced by uploading
//! the rows added since its last use), and every such row of the batch runs in one set of
//! launches. Where o_proj is in VRAM too and every row of the batch ran there, o_proj multiplies
//! the output where it lies and only `rows × hidden` comes back.
//!
//! A sequence whose mirror the cap refuses (`nectar_cuda::Gpu::set_kv_mirror_cap`: the load gives
//! the mirrors half the VRAM left free) runs on the CPU's absorbed form, which is why kv_b keeps
//! its host copy (`placement::keeps_host_copy`). Equal to the CPU form within reordering error
//! (`absorbed.cu` states the order). `NECTAR_GPU_ATTENTION=off` keeps it on the CPU, like the
//! prefill form; `NECTAR_GPU_DECODE_MIN_KEYS=N` (read once) only takes rows attending ≥ N keys.
use super::{Attention, MlaMode, ABSORBED_MAX_ROWS};
use crate::arch::glm5::layout::Layout;
use crate::cache::LayerCache;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Keys below which a row stays on the CPU (`usize::MAX`: not read from the environment yet).
static MIN_KEYS: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Keys a row must attend for its sequence's absorbed form to run on the GPU:
/// `NECTAR_GPU_DECODE_MIN_KEYS` (read once), else 0 — every such row, since the GPU form reads
/// kv_b from VRAM (7.3 MB per layer and token at GLM-5.2) where the CPU reads it from RAM.
pub fn gpu_decode_min_keys() -> usize {
    match MIN_KEYS.load(Ordering::Relaxed) {
        usize::MAX => {
            let n = std::env::var("NECTAR_GPU_DECODE_MIN_KEYS")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            // A racing set wins: only replace the sentinel.
            let _ = MIN_KEYS.compare_exchange(usize::MAX, n, Ordering::Relaxed, Ordering::Relaxed);
            MIN_KEYS.load(Ordering::Relaxed)
        }
        n => n,
    }
}

/// Sets [`gpu_decode_min_keys`] for this process (measurements and tests).
pub fn set_gpu_decode_min_keys(n: usize) {
    MIN_KEYS.store(n.min(usize::MAX - 1), Ordering::Relaxed);
}

fn gpu_err(e: nectar_cuda::Error) -> Error {
    Error::Gpu(e.to_string())
}

/// What [`Attention::gpu_decode`] did.
pub(super) enum GpuDecode {
    /// Every row of the batch ran on the GPU and o_proj multiplied them there: the layer's
    /// output, `rows × hidden`.
    Projected(Vec<f32>),
    /// Per sequence, its rows' attention outputs (`rows × heads × dv`) when they ran on the GPU.
    PerSeq(Vec<Option<Vec<f32>>>),
}

impl Attention {
    /// Whether this layer's decode rows can take the GPU form (`kv_b` in VRAM, attention on
    /// the GPU, a latent and rope width the kernels stage), so their caches get mirrors.
    pub(super) fn gpu_decode_possible(&self) -> bool {
        self.gpu_decode_parts().is_some()
    }

    /// The GPU, head geometry and VRAM kv_b of [`Self::gpu_decode_possible`].
    fn gpu_decode_parts(
        &self,
    ) -> Option<(
        &std::sync::Arc<nectar_cuda::Gpu>,
        nectar_cuda::MlaShape,
        &crate::blocks::gpu::GpuWeight,
    )> {
        let (gpu, shape) = self.gpu_attention()?;
        let fits =
            self.rank <= nectar_cuda::ABSORBED_MAX_RANK && self.dr <= nectar_cuda::ABSORBED_MAX_DR;
        Some((gpu, shape, self.kv_b.gpu_weight()?)).filter(|_| fits)
    }

    /// The sequences of `layout` that take the absorbed form on the GPU: `kv_b` in VRAM, few
    /// rows (or the absorbed form forced), rows attending at least [`gpu_decode_min_keys`], and
    /// a mirror the cap allows — synced here.
    pub(super) fn gpu_decode(
        &self,
        layout: &Layout,
        caches: &mut [&mut LayerCache],
        sel: &[Option<Vec<u32>>],
        q: &[f32],
        mode: MlaMode,
    ) -> Result<GpuDecode> {
        let none = || GpuDecode::PerSeq(vec![None; layout.seqs.len()]);
        let Some((gpu, shape, kvb)) = self.gpu_decode_parts().filter(|_| !q.is_empty()) else {
            return Ok(none());
        };
        let (hd, dq) = (self.heads, self.dn + self.dr);
        let min_keys = gpu_decode_min_keys();
        // Each row's keys: its DSA selection up to its position, or every key up to it.
        let keys_of = |i: usize| {
            let pos = layout.rows[i].pos;
            sel[i]
                .as_ref()
                .map(|k| k.iter().copied().filter(|&t| t as usize <= pos).collect())
        };
        let mut taken = vec![false; layout.seqs.len()];
        // Built only for the rows of sequences that take this form (a prompt chunk's rows never
        // do: their selections stay unfiltered and uncopied).
        let mut keys: Vec<Option<Vec<u32>>> = vec![None; layout.rows.len()];
        for (s, rows) in layout.seqs.iter().enumerate() {
            let few = match mode {
                MlaMode::Auto => rows.len() <= ABSORBED_MAX_ROWS,
                MlaMode::Absorbed => true,
                MlaMode::Reconstructed | MlaMode::ReconstructedInBlocks { .. } => false,
            };
            if rows.is_empty() || !few {
                continue;
            }
            for i in rows.clone() {
                keys[i] = keys_of(i);
            }
            let attended = |i: usize| keys[i].as_ref().map_or(layout.rows[i].pos + 1, Vec::len);
            if rows.clone().all(|i| attended(i) < min_keys) {
                continue;
            }
            // A no-op when the indexer synced it for this step already.
            taken[s] = caches[s].sync_device(gpu)?;
        }
        if !taken.contains(&true) {
            return Ok(none());
        }
        let rows: Vec<nectar_cuda::AbsorbedRow<'_>> = layout
            .seqs
            .iter()
            .enumerate()
            .filter(|&(s, _)| taken[s])
            .flat_map(|(s, rows)| rows.clone().map(move |i| (s, i)))
            .map(|(s, i)| nectar_cuda::AbsorbedRow {
                q: &q[i * hd * dq..][..hd * dq],
                mirror: caches[s].device().expect("synced above"),
                keys: match &keys[i] {
                    Some(k) => nectar_cuda::AbsorbedKeys::List(k),
                    None => nectar_cuda::AbsorbedKeys::Upto(layout.rows[i].pos + 1),
                },
            })
            .collect();
        // A launch that fails (its scratch buffers did not fit, …) leaves these rows to the CPU
        // form, which kv_b's host copy serves: a request never fails for it.
        let out = match kvb.mla_absorbed(shape, self.scale, &rows) {
            Ok(out) => out,
            Err(e) => {
                // Said once per process; each later fallback at debug level.
                static SAID: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                match SAID.swap(true, Ordering::Relaxed) {
                    false => tracing::warn!("decode attention runs on the CPU for a step: {e}"),
                    true => tracing::debug!("decode attention runs on the CPU for a step: {e}"),
                }
                return Ok(none());
            }
        };
        self.gpu_decode_rows
            .fetch_add(rows.len() as u64, Ordering::Relaxed);
        if rows.len() == layout.rows.len() {
            if let Some(o) = self.o.gpu_weight() {
                return Ok(GpuDecode::Projected(o.mla_project(&out)?));
            }
        }
        let all = gpu.mla_download(&out).map_err(gpu_err)?;
        let w = hd * self.dv;
        let mut per: Vec<Option<Vec<f32>>> = vec![None; layout.seqs.len()];
        let mut at = 0;
        for (s, r) in layout.seqs.iter().enumerate() {
            if taken[s] {
                per[s] = Some(all[at * w..(at + r.len()) * w].to_vec());
                at += r.len();
            }
        }
        Ok(GpuDecode::PerSeq(per))
    }
}
