//! The GLM-5 decoder layer: pre-norm attention and MLP with two residual adds (§5.3).
use super::attention::{Attention, MlaMode};
use super::layout::Layout;
use super::moe::{Experts, Mlp, Moe, SwiGlu};
use super::phases::Phase;
use super::Config;
use crate::blocks::Loader;
use crate::cache::LayerCache;
use crate::error::Result;
use crate::observer::Observer;
use nectar_kernels::{rms_norm, team, RopeTable};

/// One decoder layer (main layers and the MTP layer's block alike).
#[derive(Debug)]
pub struct DecoderLayer {
    /// Layer index (the MTP layer is `num_hidden_layers`).
    pub index: usize,
    input_norm: Vec<f32>,
    /// Attention (with the indexer on full layers).
    pub attn: Attention,
    post_norm: Vec<f32>,
    /// Dense MLP or MoE.
    pub mlp: Mlp,
    eps: f32,
}

impl DecoderLayer {
    /// Loads `model.layers.{index}.*`.
    pub fn load(
        ld: &Loader<'_>,
        cfg: &Config,
        index: usize,
        dense: bool,
        full_indexer: bool,
        streamed: Option<Experts>,
    ) -> Result<Self> {
        let r = &cfg.raw;
        let prefix = format!("model.layers.{index}.");
        let mlp = if dense {
            Mlp::Dense(SwiGlu::load(
                ld,
                &format!("{prefix}mlp."),
                r.hidden_size,
                r.intermediate_size,
            )?)
        } else {
            Mlp::Moe(Moe::load(ld, &prefix, cfg, streamed)?)
        };
        Ok(DecoderLayer {
            index,
            input_norm: ld.vector(&format!("{prefix}input_layernorm.weight"), r.hidden_size)?,
            attn: Attention::load(ld, &prefix, cfg, full_indexer)?,
            post_norm: ld.vector(
                &format!("{prefix}post_attention_layernorm.weight"),
                r.hidden_size,
            )?,
            mlp,
            eps: r.rms_norm_eps,
        })
    }

    /// `x ← x + Attn(norm(x))`, then `x ← x + Mlp(norm(x))`, for all rows.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        x: &mut [f32],
        layout: &Layout,
        caches: &mut [&mut LayerCache],
        sel: &mut [Option<Vec<u32>>],
        rope: &RopeTable,
        mode: MlaMode,
        obs: &mut dyn Observer,
    ) -> Result<()> {
        self.attend(x, layout, caches, sel, rope, mode, obs)?;
        self.feed_forward(x, layout.rows.len(), obs, None)
    }

    /// The attention half: `x ← x + Attn(norm(x))`.
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &self,
        x: &mut [f32],
        layout: &Layout,
        caches: &mut [&mut LayerCache],
        sel: &mut [Option<Vec<u32>>],
        rope: &RopeTable,
        mode: MlaMode,
        obs: &mut dyn Observer,
    ) -> Result<()> {
        let h = self.norm_rows(x, &self.input_norm);
        let a = self
            .attn
            .forward(self.index, &h, layout, caches, sel, rope, mode, obs)?;
        add(x, &a, self.input_norm.len());
        Ok(())
    }

    /// The MLP half: `x ← x + Mlp(norm(x))` for `m` rows. `after_reads` runs once this layer's
    /// expert reads are queued (at once for dense and resident layers): the next layer's
    /// prefetch goes there so it never delays this layer's own reads.
    pub fn feed_forward(
        &self,
        x: &mut [f32],
        m: usize,
        obs: &mut dyn Observer,
        after_reads: Option<&mut dyn FnMut() -> Result<()>>,
    ) -> Result<()> {
        let mut lap = self.attn.phases.resume();
        let h2 = self.norm_rows(x, &self.post_norm);
        let f = self
            .mlp
            .forward(self.index, &h2, m, obs, after_reads, &mut lap)?;
        add(x, &f, self.post_norm.len());
        lap.mark(Phase::MlpCombine);
        Ok(())
    }

    /// This layer's expert choice per row if its MLP input were `x` (a residual stream of `m`
    /// rows): the next-layer prediction of [`super::pilot`]. `None` for a dense layer.
    pub fn predict(&self, x: &[f32], m: usize) -> Result<Option<Vec<Vec<u32>>>> {
        let Mlp::Moe(moe) = &self.mlp else {
            return Ok(None);
        };
        let h = self.norm_rows(x, &self.post_norm);
        Ok(Some(moe.route(&h, m)?.into_iter().map(|r| r.ids).collect()))
    }

    /// Whether a replayed prediction may stand for [`Layer::predict`] (a MoE layer).
    pub fn predict_replayed(&self) -> bool {
        matches!(self.mlp, Mlp::Moe(_))
    }

    fn norm_rows(&self, x: &[f32], w: &[f32]) -> Vec<f32> {
        rms_norm_rows(x, w, self.eps)
    }
}

/// RMSNorm of every `w.len()`-wide row of `x`: a prompt's rows on the compute team (each row
/// alone, so the same bits however they are split), a decode step's few on this thread.
pub(super) fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    if !w.is_empty() {
        team::for_each_row_mut(&mut out, w.len(), |i, dst| {
            rms_norm(&x[i * w.len()..][..w.len()], w, eps, dst);
        });
    }
    out
}

/// `x += y` (the residual add), `width`-wide rows of a prompt on the compute team.
fn add(x: &mut [f32], y: &[f32], width: usize) {
    let width = width.max(1);
    team::for_each_row_mut(x, width, |i, r| {
        for (a, b) in r.iter_mut().zip(&y[(i * width).min(y.len())..]) {
            *a += b;
        }
    });
}
