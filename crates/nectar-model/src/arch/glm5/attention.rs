//! Multi-head latent attention with DSA sparse selection (`specs/glm5-architecture.md`
//! §5.5–5.9).
//!
//! Two exact forms over the same compressed cache:
//! - **absorbed** (decode, MTP, verify — any sequence adding ≤ 4 rows): the K up-projection is
//!   folded into the query and the V up-projection into the output, so attention runs directly
//!   over cached latents. Every row is computed the same way whatever else is in the batch.
//! - **reconstructed** (prefill chunks of > 4 rows): K/V are rebuilt for the sequence's keys with
//!   one matmul and attention runs per head; cheaper when many queries share the keys.
//!
//! Both are tested against each other and against the HF fixtures. With `kv_b` in VRAM the
//! reconstructed form runs on the GPU ([`gpu`]).
use super::indexer::Indexer;
use super::layout::Layout;
use super::Config;
use crate::blocks::{Linear, Loader};
use crate::cache::LayerCache;
use crate::error::Result;
use crate::observer::Observer;
use nectar_kernels::{
    decode_row, dot, matmul_rows, rms_norm, scaled_add, softmax_in_place, team, RopeTable,
};
use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(feature = "cuda")]
mod gpu;

/// ε of `q_a_layernorm` / `kv_a_layernorm` (HF builds them without passing `rms_norm_eps`).
const LATENT_EPS: f32 = 1e-6;
/// Rows per sequence up to which the absorbed form is used.
const ABSORBED_MAX_ROWS: usize = 4;
/// Largest reconstructed K/V buffer (f32 bytes) before falling back to the absorbed form.
pub(super) const RECON_MAX_BYTES: usize = 256 << 20;

/// Which MLA form to use (tests force each one; production uses `Auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MlaMode {
    /// Absorbed for ≤ 4 rows per sequence, reconstructed otherwise.
    #[default]
    Auto,
    /// Always the absorbed form.
    Absorbed,
    /// Always the reconstructed form (when the K/V buffer fits).
    Reconstructed,
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
        })
    }

    /// Query rows whose attention ran on the GPU since load (prefill chunks with `kv_b` in VRAM).
    pub fn gpu_rows(&self) -> u64 {
        self.gpu_rows.load(Ordering::Relaxed)
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
        // Queries: q_a → RMSNorm(1e-6) → q_b, then RoPE on the last dr dims of each head.
        let qa = self.q_a.forward(h, m)?;
        let mut cq = vec![0.0; qa.len()];
        for (src, dst) in qa
            .chunks_exact(self.q_a.rows)
            .zip(cq.chunks_exact_mut(self.q_a.rows))
        {
            rms_norm(src, &self.q_a_norm, LATENT_EPS, dst);
        }
        let mut q = self.q_b.forward(&cq, m)?;
        for (row, qr) in layout.rows.iter().zip(q.chunks_exact_mut(hd * dq)) {
            for qh in qr.chunks_exact_mut(dq) {
                rope.apply(&mut qh[self.dn..], row.rope);
            }
        }
        // Keys: kv_a → [latent (RMSNorm 1e-6) ; k_pe (RoPE)] appended to the cache.
        let kv = self.kv_a.forward(h, m)?;
        let mut latent = vec![0.0; self.rank];
        for (row, kvr) in layout.rows.iter().zip(kv.chunks_exact(self.rank + self.dr)) {
            rms_norm(&kvr[..self.rank], &self.kv_a_norm, LATENT_EPS, &mut latent);
            let mut kpe = kvr[self.rank..].to_vec();
            rope.apply(&mut kpe, row.rope);
            let c = &mut caches[row.seq];
            debug_assert_eq!(c.len(), row.pos, "cache length must equal the row's slot");
            c.push(&latent, &kpe, None);
        }
        // DSA: full layers select (and cache their keys); shared layers keep the carried selection.
        if let Some(ix) = &self.indexer {
            let fresh = ix.run(h, &cq, layout, caches, rope)?;
            sel.clone_from_slice(&fresh);
        }
        for (i, s) in sel.iter().enumerate() {
            obs.indexer(layer, i, self.indexer.is_some(), s.as_deref());
        }
        let caches: Vec<&LayerCache> = caches.iter().map(|c| &**c).collect();
        // The reconstructed form on the GPU where kv_b is in VRAM (rows × heads × dv per
        // sequence), the CPU forms for the other sequences.
        #[cfg(feature = "cuda")]
        let on_gpu = self.gpu_prefill(layout, &caches, sel, &q, mode)?;
        #[cfg(not(feature = "cuda"))]
        let on_gpu: Vec<Option<Vec<f32>>> = vec![None; layout.seqs.len()];
        // Reconstructed K/V per sequence where that form is chosen.
        let recon: Vec<Option<Vec<f32>>> = layout
            .seqs
            .iter()
            .enumerate()
            .map(|(s, rows)| {
                if on_gpu[s].is_some() {
                    return Ok(None);
                }
                let t = caches[s].len();
                let fits = t * hd * (self.dn + self.dv) * 4 <= RECON_MAX_BYTES;
                let use_recon = match mode {
                    MlaMode::Auto => rows.len() > ABSORBED_MAX_ROWS && fits,
                    MlaMode::Absorbed => false,
                    MlaMode::Reconstructed => fits,
                };
                if use_recon && !rows.is_empty() {
                    self.kv_b
                        .forward(&caches[s].latent[..t * self.rank], t)
                        .map(Some)
                } else {
                    Ok(None)
                }
            })
            .collect::<Result<_>>()?;
        // The absorbed form reads W_UK / W_UV rows of kv_b on the CPU: kv_b keeps its host
        // copy when placed in VRAM (`placement::keeps_host_copy`).
        let kvb = match layout
            .rows
            .iter()
            .any(|r| recon[r.seq].is_none() && on_gpu[r.seq].is_none())
        {
            true => Some(self.kv_b.mat()?),
            false => None,
        };
        // One task per (head, row), on the compute team, head-major: consecutive tasks read
        // the same head's keys, so a prefill chunk's working set is one head's K/V slice (a few
        // MB, cache-resident) instead of every head's (all of the reconstructed K/V, from DRAM,
        // once per row). Each task computes exactly what it would in any order.
        let mut by_head = vec![0.0; m * hd * self.dv];
        team::for_each_chunk_mut(&mut by_head, self.dv, |idx, out| {
            let (head, i) = (idx / m, idx % m);
            let row = layout.rows[i];
            let qh = &q[i * hd * dq + head * dq..][..dq];
            let keys = sel[i].as_deref();
            if let Some(g) = &on_gpu[row.seq] {
                let j = i - layout.seqs[row.seq].start;
                out.copy_from_slice(&g[(j * hd + head) * self.dv..][..self.dv]);
                return;
            }
            match (&recon[row.seq], &kvb) {
                (Some(kvf), _) => reconstructed(
                    &self.heads(),
                    qh,
                    head,
                    row.pos,
                    &caches[row.seq].k_pe,
                    kvf,
                    keys,
                    out,
                ),
                (None, Some(kvb)) => {
                    self.absorbed(kvb, qh, head, row.pos, caches[row.seq], keys, out)
                }
                (None, None) => unreachable!("kvb is read when any row is absorbed"),
            }
        });
        // Back to row-major `[row][head][dv]`, the layout o_proj multiplies (one row, decode's
        // usual case: the two layouts are the same).
        if m == 1 {
            return self.o.forward(&by_head, m);
        }
        let mut o = vec![0.0; m * hd * self.dv];
        for (idx, src) in by_head.chunks_exact(self.dv).enumerate() {
            let (head, i) = (idx / m, idx % m);
            o[(i * hd + head) * self.dv..][..self.dv].copy_from_slice(src);
        }
        self.o.forward(&o, m)
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

    #[allow(clippy::too_many_arguments)]
    fn absorbed(
        &self,
        kvb: &nectar_kernels::MatRef<'_>,
        qh: &[f32],
        head: usize,
        pos: usize,
        c: &LayerCache,
        keys: Option<&[u32]>,
        out: &mut [f32],
    ) {
        let (r, dr) = (self.rank, self.dr);
        let base = head * (self.dn + self.dv);
        let mut w = vec![0.0f32; r];
        // q_lat = W_UK[h]ᵀ · q_nope, accumulated over the nope dims in order.
        let mut q_lat = vec![0.0f32; r];
        for (j, &a) in qh[..self.dn].iter().enumerate() {
            decode_row(kvb, base + j, &mut w);
            scaled_add(&mut q_lat, a, &w);
        }
        let q_pe = &qh[self.dn..];
        let (ts, p) = probs(self.scale, pos, keys, |t| {
            dot(&q_lat, &c.latent[t * r..(t + 1) * r]) + dot(q_pe, &c.k_pe[t * dr..(t + 1) * dr])
        });
        let mut o_lat = vec![0.0f32; r];
        for (&t, &pt) in ts.iter().zip(&p) {
            scaled_add(&mut o_lat, pt, &c.latent[t * r..(t + 1) * r]);
        }
        // o = W_UV[h] · o_lat: the fused kernel computes each element as the canonical
        // `dot(decode_row(W, r), o_lat)` without materialising the rows.
        let rows = base + self.dn..base + self.dn + self.dv;
        matmul_rows(kvb, rows, &o_lat, out).expect("W_UV rows lie inside kv_b (checked at load)");
    }
}

/// Per-head geometry of the attention cores.
#[derive(Debug, Clone, Copy)]
pub(super) struct Heads {
    /// Heads (the per-key stride of the rebuilt K/V is `heads × (dn + dv)`).
    pub heads: usize,
    /// `qk_nope_head_dim`.
    pub dn: usize,
    /// `qk_rope_head_dim`.
    pub dr: usize,
    /// `v_head_dim`.
    pub dv: usize,
    /// Softmax scale, 1/√(dn + dr).
    pub scale: f32,
}

/// Scores → softmax over the selected keys (or all of `0..=pos`).
fn probs(
    scale: f32,
    pos: usize,
    keys: Option<&[u32]>,
    score: impl Fn(usize) -> f32,
) -> (Vec<usize>, Vec<f32>) {
    let ts: Vec<usize> = match keys {
        Some(k) => k
            .iter()
            .map(|&t| t as usize)
            .filter(|&t| t <= pos)
            .collect(),
        None => (0..=pos).collect(),
    };
    let mut p: Vec<f32> = ts.iter().map(|&t| score(t) * scale).collect();
    softmax_in_place(&mut p);
    (ts, p)
}

/// One (row, head) of the reconstructed form: `kvf` holds every key's rebuilt
/// `[k_nope ; v]` per head (`heads × (dn + dv)` per key), `k_pe` the keys' rope parts.
/// (`prefill_cost` times this very function.)
#[allow(clippy::too_many_arguments)]
pub(super) fn reconstructed(
    g: &Heads,
    qh: &[f32],
    head: usize,
    pos: usize,
    k_pe: &[f32],
    kvf: &[f32],
    keys: Option<&[u32]>,
    out: &mut [f32],
) {
    let (dn, dv, dr) = (g.dn, g.dv, g.dr);
    let stride = g.heads * (dn + dv);
    let base = head * (dn + dv);
    let (ts, p) = probs(g.scale, pos, keys, |t| {
        dot(&qh[..dn], &kvf[t * stride + base..][..dn])
            + dot(&qh[dn..], &k_pe[t * dr..(t + 1) * dr])
    });
    out.fill(0.0);
    for (&t, &pt) in ts.iter().zip(&p) {
        scaled_add(out, pt, &kvf[t * stride + base + dn..][..dv]);
    }
}
