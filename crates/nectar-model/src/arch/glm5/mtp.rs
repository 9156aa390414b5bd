//! The MTP (multi-token prediction) head, `model.layers.{num_hidden_layers}`
//! (`specs/glm5-architecture.md` §5.14):
//!
//! ```text
//! u  = eh_proj · [ enorm(E[t_{i+1}]) ; hnorm(h_i) ]     embedding first, hidden second
//! u' = DecoderLayer_N(u, pos = i)                        own MLA cache and own indexer
//! draft logits for t_{i+2} = lm_head · shared_head.norm(u')
//! ```
//! `h_i` is the main model's post-final-norm hidden. The main embedding and LM head are reused
//! unless the checkpoint ships its own copies under the MTP prefix.
use super::layer::DecoderLayer;
use super::moe::Experts;
use super::Config;
use crate::blocks::{Embedding, Linear, Loader};
use crate::error::Result;

/// MTP head weights.
#[derive(Debug)]
pub struct Mtp {
    pub(super) enorm: Vec<f32>,
    pub(super) hnorm: Vec<f32>,
    pub(super) eh_proj: Linear,
    pub(super) layer: DecoderLayer,
    pub(super) head_norm: Vec<f32>,
    pub(super) embed: Option<Embedding>,
    pub(super) head: Option<Linear>,
}

impl Mtp {
    /// Loads the MTP layer when the checkpoint has it (`eh_proj` present), else `None`.
    pub fn load(ld: &Loader<'_>, cfg: &Config, streamed: Option<Experts>) -> Result<Option<Mtp>> {
        let Some(idx) = cfg.mtp_layer() else {
            return Ok(None);
        };
        let p = |s: &str| format!("model.layers.{idx}.{s}");
        if !ld.has(&p("eh_proj.weight")) {
            return Ok(None);
        }
        let (h, v) = (cfg.raw.hidden_size, cfg.raw.vocab_size);
        let has_indexer = ld.has(&p("self_attn.indexer.wk.weight"));
        Ok(Some(Mtp {
            enorm: ld.vector(&p("enorm.weight"), h)?,
            hnorm: ld.vector(&p("hnorm.weight"), h)?,
            eh_proj: ld.linear(&p("eh_proj.weight"), h, 2 * h)?,
            layer: DecoderLayer::load(ld, cfg, idx, false, has_indexer, streamed)?,
            head_norm: ld.vector(&p("shared_head.norm.weight"), h)?,
            embed: if ld.has(&p("embed_tokens.weight")) {
                Some(ld.embedding(&p("embed_tokens.weight"), v, h)?)
            } else {
                None
            },
            head: if ld.has(&p("shared_head.head.weight")) {
                Some(ld.linear(&p("shared_head.head.weight"), v, h)?)
            } else {
                None
            },
        }))
    }
}
