//! Multi-head latent attention with DSA sparse selection (`specs/glm5-architecture.md`
//! §5.5–5.9).
//!
//! Two exact forms over the same compressed cache:
//! - **absorbed** (decode, MTP, verify — any sequence adding ≤ 4 rows): the K up-projection is
//!   folded into the query and the V up-projection into the output, so attention runs directly
//!   over cached latents ([`absorbed`]: in passes that keep what they re-read in cache). Every
//!   row is computed the same way whatever else is in the batch.
//! - **reconstructed** (prefill chunks of > 4 rows, unless a short chunk continues a long
//!   cache — [`recon::reconstruction_pays`]): K/V are rebuilt for the sequence's keys by kv_b's
//!   matmul, in blocks of at most [`RECON_MAX_BYTES`], and attention runs per head with a
//!   running softmax over the blocks ([`recon`]); cheaper when many queries share the keys.
//!
//! Both are tested against each other and against the HF fixtures. With `kv_b` in VRAM the
//! reconstructed form runs on the GPU ([`gpu`]).
use super::indexer::Indexer;
use super::layout::Layout;
use super::phases::{Lap, Phase, Phases};
use super::Config;
use crate::blocks::{Linear, Loader};
use crate::cache::LayerCache;
use crate::error::Result;
use crate::observer::Observer;
use nectar_kernels::{rms_norm, team, RopeTable};
use std::sync::atomic::{AtomicU64, Ordering};

pub(super) mod absorbed;
#[cfg(feature = "cuda")]
mod gpu;
#[cfg(feature = "cuda")]
mod gpu_decode;
#[cfg(feature = "cuda")]
pub use gpu_decode::{gpu_decode_min_keys, set_gpu_decode_min_keys};
pub(super) mod recon;

use recon::Heads;

/// ε of `q_a_layernorm` / `kv_a_layernorm` (HF builds them without passing `rms_norm_eps`).
const LATENT_EPS: f32 = 1e-6;
/// Rows per sequence up to which the absorbed form is used.
const ABSORBED_MAX_ROWS: usize = 4;
/// Largest block of reconstructed K/V (f32 bytes): longer caches are rebuilt block by block.
pub(super) const RECON_MAX_BYTES: usize = 256 << 20;

/// Which MLA form to use (tests force each one; production uses `Auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MlaMode {
    /// Absorbed for ≤ 4 rows per sequence, otherwise the cheaper form.
    #[default]
    Auto,
    /// Always the absorbed form.
    Absorbed,
    /// Always the reconstructed form.
    Reconstructed,
    /// Always the reconstructed form in blocks and tiles of the given sizes (the blocked path
    /// at the fixtures' sizes; production blocks are [`RECON_MAX_BYTES`], tiles
    /// [`recon::TILE_KEYS`]).
    ReconstructedInBlocks {
        /// Keys rebuilt at a time.
        keys: usize,
        /// Keys folded into the running softmax at a time.
        tile: usize,
    },
}

/// One layer's attention weights and geometry.
#[derive(Debug)]
pub struct Attention {
    q_a: Linear,
    q_a_norm: Vec<f32>,
    q_b: Linear,
    kv_a: Linear,
    kv_a_norm: Vec<f32>,
    kv_b: Linear,
    o: Linear,
    /// The DSA indexer, on full layers.
    pub indexer: Option<Indexer>,
    heads: usize,
    dn: usize,
    dr: usize,
    dv: usize,
    rank: usize,
    scale: f32,
    /// Query rows whose attention ran on the GPU ([`gpu`]), since load.
    gpu_rows: AtomicU64,
    /// Decode / MTP / verify rows whose absorbed form ran on the GPU (`gpu_decode`), since load.
    gpu_decode_rows: AtomicU64,
    /// Where this layer's prefill time went (the MLP half included), since load.
    pub(super) phases: Phases,
}

impl Attention {
    /// Every matrix, hottest first (the placement order of `--gpu-memory`).
    pub(super) fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut v = vec![
            &mut self.q_a,
            &mut self.kv_a,
            &mut self.q_b,
            &mut self.kv_b,
            &mut self.o,
        ];
        if let Some(i) = &mut self.indexer {
            v.extend(i.linears_mut());
        }
        v
    }

    /// Loads `{prefix}self_attn.*` (and the indexer when `full`).
    pub fn load(ld: &Loader<'_>, prefix: &str, cfg: &Config, full: bool) -> Result<Self> {
        let r = &cfg.raw;
        let (h, dn, dr, dv, rank) = (
            r.num_attention_heads,
            r.qk_nope_head_dim,
            r.qk_rope_head_dim,
            r.v_head_dim,
            r.kv_lora_rank,
        );
        let p = |s: &str| format!("{prefix}self_attn.{s}");
        Ok(Attention {
            q_a: ld.linear(&p("q_a_proj.weight"), r.q_lora_rank, r.hidden_size)?,
            q_a_norm: ld.vector(&p("q_a_layernorm.weight"), r.q_lora_rank)?,
            q_b: ld.linear(&p("q_b_proj.weight"), h * (dn + dr), r.q_lora_rank)?,
            kv_a: ld.linear(&p("kv_a_proj_with_mqa.weight"), rank + dr, r.hidden_size)?,
            kv_a_norm: ld.vector(&p("kv_a_layernorm.weight"), rank)?,
            kv_b: ld.linear(&p("kv_b_proj.weight"), h * (dn + dv), rank)?,
            o: ld.linear(&p("o_proj.weight"), r.hidden_size, h * dv)?,
            indexer: if full {
                Some(Indexer::load(ld, prefix, cfg)?)
            } else {
                None
            },
            heads: h,
            dn,
            dr,
            dv,
            rank,
            scale: ((dn + dr) as f32).powf(-0.5),
            gpu_rows: AtomicU64::new(0),
            gpu_decode_rows: AtomicU64::new(0),
            phases: Phases::default(),
        })
    }

    /// Query rows whose attention ran on the GPU since load (prefill chunks with `kv_b` in VRAM).
    pub fn gpu_rows(&self) -> u64 {
        self.gpu_rows.load(Ordering::Relaxed)
    }

    /// Decode, MTP and verify rows whose absorbed form ran on the GPU since load.
    pub fn gpu_decode_rows(&self) -> u64 {
        self.gpu_decode_rows.load(Ordering::Relaxed)
    }

    /// Bytes of weights (including the indexer).
    pub fn bytes(&self) -> usize {
        [&self.q_a, &self.q_b, &self.kv_a, &self.kv_b, &self.o]
            .iter()
            .map(|l| l.bytes())
            .sum::<usize>()
            + self.indexer.as_ref().map_or(0, Indexer::bytes)
    }

    /// Attention for all rows of the batch; appends each row's latent, rope key and indexer key
    /// to its sequence's cache. `sel` carries the DSA selection across layers (IndexShare).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        layer: usize,
        h: &[f32],
        layout: &Layout,
        caches: &mut [&mut LayerCache],
        sel: &mut [Option<Vec<u32>>],
        rope: &RopeTable,
        mode: MlaMode,
        obs: &mut dyn Observer,
    ) -> Result<Vec<f32>> {
        let m = layout.rows.len();
        let (hd, dq) = (self.heads, self.dn + self.dr);
        let mut lap = self
            .phases
            .lap(layout.seqs.iter().any(|r| r.len() > ABSORBED_MAX_ROWS));
        // Queries: q_a → RMSNorm(1e-6) → q_b, then RoPE on the last dr dims of each head.
        // Row by row on the compute team (each row alone: the same bits in any order), the
        // angles once per row for all its heads.
        // q_a and kv_a both project h: one GPU round trip for the two where both are there.
        let [qa, kv] = Linear::forward_each([&self.q_a, &self.kv_a], h, m)?;
        let mut cq = vec![0.0; qa.len()];
        let w = self.q_a.rows;
        team::for_each_row_mut(&mut cq, w, |i, dst| {
            rms_norm(&qa[i * w..(i + 1) * w], &self.q_a_norm, LATENT_EPS, dst);
        });
        // A prompt's queries stay in VRAM for the GPU's attention where it runs (then `q` is
        // empty: nothing below reads it).
        #[cfg(feature = "cuda")]
        let q_dev = self.gpu_queries(layout, mode, &cq, rope)?;
        #[cfg(feature = "cuda")]
        let on_host = q_dev.is_none();
        #[cfg(not(feature = "cuda"))]
        let on_host = true;
        let mut q = match on_host {
            true => self.q_b.forward(&cq, m)?,
            false => Vec::new(),
        };
        team::for_each_row_mut(&mut q, hd * dq, |i, qr| {
            let sc = rope.sin_cos(layout.rows[i].rope);
            for qh in qr.chunks_exact_mut(dq) {
                RopeTable::rotate(&mut qh[self.dn..], &sc);
            }
        });
        // Keys: kv_a → [latent (RMSNorm 1e-6) ; k_pe (RoPE)] appended to the cache.
        let mut latent = vec![0.0; self.rank];
        for (row, kvr) in layout.rows.iter().zip(kv.chunks_exact(self.rank + self.dr)) {
            rms_norm(&kvr[..self.rank], &self.kv_a_norm, LATENT_EPS, &mut latent);
            let mut kpe = kvr[self.rank..].to_vec();
            rope.apply(&mut kpe, row.rope);
            let c = &mut caches[row.seq];
            debug_assert_eq!(c.len(), row.pos, "cache length must equal the row's slot");
            c.push(&latent, &kpe, None);
        }
        lap.mark(Phase::AttnProj);
        // DSA: full layers select (and cache their keys); shared layers keep the carried selection.
        if let Some(ix) = &self.indexer {
            // Decode rows score the keys mirrored in VRAM where the attention mirrors them.
            #[cfg(feature = "cuda")]
            let mirrored = self.gpu_decode_possible();
            #[cfg(not(feature = "cuda"))]
            let mirrored = false;
            let fresh = ix.run(h, &cq, layout, caches, rope, mirrored, &mut lap)?;
            sel.clone_from_slice(&fresh);
        }
        for (i, s) in sel.iter().enumerate() {
            obs.indexer(layer, i, self.indexer.is_some(), s.as_deref());
        }
        // The absorbed form on the GPU where kv_b is in VRAM (decode, MTP, verify rows), over
        // caches mirrored there (synced now, hence before the caches are only read).
        #[cfg(feature = "cuda")]
        let decoded = match self.gpu_decode(layout, caches, sel, &q, mode)? {
            gpu_decode::GpuDecode::Projected(o) => {
                lap.mark(Phase::OProj);
                return Ok(o);
            }
            gpu_decode::GpuDecode::PerSeq(per) => per,
        };
        let caches: Vec<&LayerCache> = caches.iter().map(|c| &**c).collect();
        // The reconstructed form on the GPU where kv_b is in VRAM (rows × heads × dv per
        // sequence), the CPU forms for the other sequences.
        #[cfg(feature = "cuda")]
        let on_gpu = {
            let dev = self.gpu_prefill(layout, &caches, sel, &q, q_dev.as_ref(), mode, &mut lap)?;
            match self.gpu_outputs(layout, dev)? {
                Ok(projected) => {
                    lap.mark(Phase::OProj);
                    return Ok(projected);
                }
                Err(per_seq) => per_seq
                    .into_iter()
                    .zip(decoded)
                    .map(|(p, d)| p.or(d))
                    .collect::<Vec<_>>(),
            }
        };
        #[cfg(not(feature = "cuda"))]
        let on_gpu: Vec<Option<Vec<f32>>> = vec![None; layout.seqs.len()];
        // The CPU's reconstructed form, per sequence, where it is chosen (`recon`).
        let recon: Vec<bool> = layout
            .seqs
            .iter()
            .enumerate()
            .map(|(s, rows)| {
                on_gpu[s].is_none()
                    && !rows.is_empty()
                    && match mode {
                        MlaMode::Auto => {
                            rows.len() > ABSORBED_MAX_ROWS
                                && self.reconstruction_pays(layout, rows.clone(), caches[s], sel)
                        }
                        MlaMode::Absorbed => false,
                        MlaMode::Reconstructed | MlaMode::ReconstructedInBlocks { .. } => true,
                    }
            })
            .collect();
        // Every row ran on the GPU: its outputs, sequence after sequence, are already the
        // row-major `[row][head][dv]` o_proj multiplies.
        if layout
            .seqs
            .iter()
            .zip(&on_gpu)
            .all(|(r, g)| r.is_empty() || g.is_some())
        {
            let o: Vec<f32> = on_gpu.into_iter().flatten().flatten().collect();
            lap.mark(Phase::AttnCore);
            let o = self.o.forward(&o, m)?;
            lap.mark(Phase::OProj);
            return Ok(o);
        }
        let mut o = vec![0.0; m * hd * self.dv];
        // Rows of the absorbed form or the GPU's, straight into their rows of `o`; the others
        // (a long prompt chunk beside them) are filled by `reconstructed`.
        let plain: Vec<usize> = (0..m).filter(|&i| !recon[layout.rows[i].seq]).collect();
        if !plain.is_empty() {
            self.plain_rows(layout, &caches, sel, &q, &plain, &on_gpu, &mut o)?;
            lap.mark(Phase::AttnCore);
        }
        for (s, rows) in layout.seqs.iter().enumerate() {
            if recon[s] {
                let tiling = match mode {
                    MlaMode::ReconstructedInBlocks { keys, tile } => (keys.max(1), tile.max(1)),
                    _ => (
                        (RECON_MAX_BYTES / (hd * (self.dn + self.dv) * 4)).max(1),
                        recon::TILE_KEYS,
                    ),
                };
                let seq = (rows.clone(), caches[s]);
                self.reconstructed(layout, seq, sel, &q, tiling, &mut o, &mut lap)?;
            }
        }
        let o = self.o.forward(&o, m)?;
        lap.mark(Phase::OProj);
        Ok(o)
    }

    /// The absorbed form's rows and the GPU's (`plain`, ascending row indices), written into
    /// their rows of `o` (`[row][head][dv]`).
    #[allow(clippy::too_many_arguments)]
    fn plain_rows(
        &self,
        layout: &Layout,
        caches: &[&LayerCache],
        sel: &[Option<Vec<u32>>],
        q: &[f32],
        plain: &[usize],
        on_gpu: &[Option<Vec<f32>>],
        o: &mut [f32],
    ) -> Result<()> {
        let (hd, dq, w) = (self.heads, self.dn + self.dr, self.heads * self.dv);
        let (gpu, cpu): (Vec<usize>, Vec<usize>) = plain
            .iter()
            .partition(|&&i| on_gpu[layout.rows[i].seq].is_some());
        for i in gpu {
            let row = layout.rows[i];
            let g = on_gpu[row.seq].as_ref().expect("partitioned on it");
            let j = i - layout.seqs[row.seq].start;
            o[i * w..][..w].copy_from_slice(&g[j * w..][..w]);
        }
        if cpu.is_empty() {
            return Ok(());
        }
        // The absorbed form reads W_UK / W_UV rows of kv_b on the CPU: kv_b keeps its host
        // copy when placed in VRAM (`placement::keeps_host_copy`).
        let kvb = self.kv_b.mat()?;
        let rows: Vec<absorbed::Row<'_>> = cpu
            .iter()
            .map(|&i| absorbed::Row {
                q: &q[i * hd * dq..][..hd * dq],
                pos: layout.rows[i].pos,
                cache: caches[layout.rows[i].seq],
                keys: sel[i].as_deref(),
            })
            .collect();
        let mut out = vec![0.0; cpu.len() * w];
        absorbed::attend(&self.heads(), self.rank, &kvb, &rows, &mut out);
        for (&i, r) in cpu.iter().zip(out.chunks_exact(w)) {
            o[i * w..][..w].copy_from_slice(r);
        }
        Ok(())
    }

    /// Whether the reconstructed form costs less than the absorbed one for these rows of one
    /// sequence ([`recon::reconstruction_pays`]).
    fn reconstruction_pays(
        &self,
        layout: &Layout,
        rows: std::ops::Range<usize>,
        cache: &LayerCache,
        sel: &[Option<Vec<u32>>],
    ) -> bool {
        let attended = rows
            .clone()
            .map(|i| sel[i].as_ref().map_or(layout.rows[i].pos + 1, Vec::len))
            .sum();
        recon::reconstruction_pays(&self.heads(), self.rank, rows.len(), cache.len(), attended)
    }

    /// The reconstructed form for `rows` of one sequence, written into `o` (`[row][head][dv]`):
    /// K/V rebuilt by kv_b in blocks of at most `block` keys, each block folded into every
    /// (row, head)'s running softmax `tile` keys at a time ([`recon::fold_group`]) on the
    /// compute team.
    #[allow(clippy::too_many_arguments)]
    fn reconstructed(
        &self,
        layout: &Layout,
        (rows, c): (std::ops::Range<usize>, &LayerCache),
        sel: &[Option<Vec<u32>>],
        q: &[f32],
        (block, tile): (usize, usize),
        o: &mut [f32],
        lap: &mut Lap<'_>,
    ) -> Result<()> {
        let (g, n, t) = (self.heads(), rows.len(), c.len());
        let (hd, dq, sl) = (self.heads, self.dn + self.dr, g.state_len());
        // Each row's selected keys it can see, ascending, so a block's share is a sub-slice.
        let listed: Vec<Option<Vec<u32>>> = rows
            .clone()
            .map(|i| {
                sel[i].as_ref().map(|k| {
                    let pos = layout.rows[i].pos;
                    let mut v: Vec<u32> =
                        k.iter().copied().filter(|&t| t as usize <= pos).collect();
                    v.sort_unstable();
                    v
                })
            })
            .collect();
        // States `[head][group][row of the group]`, the last group padded: one task per
        // (head, group of rows), head-major.
        let gr = recon::GROUP_ROWS;
        let groups = n.div_ceil(gr);
        let mut st = vec![0.0f32; hd * groups * gr * sl];
        for s in st.chunks_exact_mut(sl) {
            recon::init(&g, s);
        }
        for first in (0..t).step_by(block) {
            let end = (first + block).min(t);
            let kvf = self
                .kv_b
                .forward(&c.latent[first * self.rank..end * self.rank], end - first)?;
            lap.mark(Phase::KvB);
            team::for_each_chunk_mut(&mut st, gr * sl, |idx, s| {
                let (head, grp) = (idx / groups, idx % groups);
                let group: Vec<recon::Row<'_>> = (grp * gr..((grp + 1) * gr).min(n))
                    .map(|j| {
                        let i = rows.start + j;
                        recon::Row {
                            qh: &q[i * hd * dq + head * dq..][..dq],
                            pos: layout.rows[i].pos,
                            listed: listed[j].as_deref(),
                        }
                    })
                    .collect();
                recon::fold_group(&g, head, first, tile, &c.k_pe, &kvf, &group, s);
            });
            lap.mark(Phase::AttnCore);
        }
        for (idx, s) in st.chunks_exact(sl).enumerate() {
            let (head, j) = (idx / (groups * gr), idx % (groups * gr));
            if j < n {
                let i = rows.start + j;
                recon::finish(&g, s, &mut o[(i * hd + head) * self.dv..][..self.dv]);
            }
        }
        Ok(())
    }

    /// The per-head geometry the attention cores need.
    fn heads(&self) -> Heads {
        Heads {
            heads: self.heads,
            dn: self.dn,
            dr: self.dr,
            dv: self.dv,
            scale: self.scale,
        }
    }
}
