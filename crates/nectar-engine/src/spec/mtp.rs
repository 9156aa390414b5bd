//! Drafts from the model's own MTP head (`specs/glm5-architecture.md` §5.14).
//!
//! Row i of the MTP layer takes `(h_i, t_{i+1})` — the main model's
//! post-final-norm hidden at i and the token at i+1 — and its output drafts
//! token i+2; its cache entry sits at position i. Rows are absorbed lazily:
//! the rows the main model kept wait in `pending` until the next round
//! drafts, then run through the MTP layer in one call (the prompt's rows in
//! the first round, as vLLM and SGLang seed it). A round of γ drafts is the
//! last absorbed row's draft, then γ − 1 chained rows at the following
//! positions, each fed the previous row's post-`shared_head.norm` hidden
//! and the previous draft.
//!
//! Only absorbed rows are conditioned on a true target hidden, so the
//! chained rows are trimmed from the MTP cache when the round is verified
//! and the accepted positions are re-absorbed from the verified hiddens
//! (`lessons.md` #21). The invariant, checked at every step: MTP cache rows
//! + pending rows = main cache rows.
//!
//! Drafts never decide output (verification does), so the MTP layer may run
//! its absorption in either attention form: more than 4 pending rows (the
//! prompt, or rows left by `auto`'s plain stretches) take the
//! reconstructed form, exactly as a prefill does.

use super::drafter::{Drafter, Proposals};
use crate::error::{Error, Result};
use nectar_model::{Glm5, MtpStep, NoObserver, SeqCache};

/// The MTP draft provider.
#[derive(Debug)]
pub struct MtpDrafter {
    hd: usize,
    /// Observed rows not yet run through the MTP layer: hiddens and next tokens.
    pending_h: Vec<f32>,
    pending_next: Vec<u32>,
    /// MTP output of the last absorbed row (drafts the next token).
    last: Option<Vec<f32>>,
    /// MTP cache length before this round's chained rows.
    round_start: Option<usize>,
    forwards: usize,
}

impl MtpDrafter {
    /// A drafter for `model`, which must have an MTP layer.
    pub fn new(model: &Glm5) -> Result<MtpDrafter> {
        if !model.has_mtp() {
            return Err(Error::InvalidParam {
                param: "mtp",
                reason: "this model has no MTP layer (no `eh_proj` under the MTP prefix)".into(),
            });
        }
        Ok(MtpDrafter {
            hd: model.hidden_size(),
            pending_h: Vec::new(),
            pending_next: Vec::new(),
            last: None,
            round_start: None,
            forwards: 0,
        })
    }

    /// Rows observed but not yet absorbed into the MTP cache.
    pub fn pending(&self) -> usize {
        self.pending_next.len()
    }

    fn check(&self, cache: &SeqCache, when: &str) -> Result<()> {
        let (mtp, main) = (cache.mtp.len(), cache.len());
        if mtp + self.pending() != main {
            return Err(Error::Speculation(format!(
                "{when}: the MTP cache holds {mtp} rows and {} are pending, but the main cache \
                 holds {main}",
                self.pending()
            )));
        }
        Ok(())
    }
}

impl Drafter for MtpDrafter {
    fn name(&self) -> &'static str {
        "mtp"
    }

    fn observe(&mut self, cache: &mut SeqCache, hidden: &[f32], next: &[u32]) -> Result<()> {
        if let Some(start) = self.round_start.take() {
            cache.mtp.truncate(start);
        }
        if hidden.len() != next.len() * self.hd {
            return Err(Error::Speculation(format!(
                "observed {} hidden values for {} rows (hidden size {})",
                hidden.len(),
                next.len(),
                self.hd
            )));
        }
        self.pending_h.extend_from_slice(hidden);
        self.pending_next.extend_from_slice(next);
        self.check(cache, "after verification")
    }

    fn prepare(&mut self, model: &Glm5, cache: &mut SeqCache) -> Result<usize> {
        let rows = self.pending();
        if rows == 0 {
            return Ok(0);
        }
        self.check(cache, "before absorbing")?;
        let hm = model.mtp_forward(
            &mut [MtpStep {
                cache,
                hidden: &self.pending_h,
                next_tokens: &self.pending_next,
            }],
            &mut NoObserver,
        )?;
        self.forwards += 1;
        self.last = Some(hm[hm.len() - self.hd..].to_vec());
        self.pending_h.clear();
        self.pending_next.clear();
        Ok(rows)
    }

    fn draft(
        &mut self,
        model: &Glm5,
        cache: &mut SeqCache,
        proposals: &mut Proposals<'_>,
    ) -> Result<()> {
        self.prepare(model, cache)?;
        self.check(cache, "before drafting")?;
        let Some(mut h) = self.last.clone() else {
            return Err(Error::Speculation(
                "MTP drafting before any row was observed".into(),
            ));
        };
        self.round_start = Some(cache.mtp.len());
        for j in 0..proposals.max() {
            if j > 0 {
                let prev = proposals.context()[proposals.context().len() - 1];
                h = model.mtp_forward(
                    &mut [MtpStep {
                        cache,
                        hidden: &h,
                        next_tokens: &[prev],
                    }],
                    &mut NoObserver,
                )?;
                self.forwards += 1;
            }
            let logits = model.mtp_logits(&h)?;
            proposals.sample(&logits)?;
        }
        Ok(())
    }

    fn forwards(&self) -> usize {
        self.forwards
    }
}
