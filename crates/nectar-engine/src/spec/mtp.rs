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
//! (`lessons.md` #21).
//!
//! Drafts never decide output (verification does), so the MTP cache may have
//! **gaps**: at most [`ABSORB_WINDOW`] pending rows are kept, older ones are
//! dropped unabsorbed, and the next absorption places its rows at their true
//! positions after a gap ([`nectar_model::LayerCache::skip_to`]: RoPE rotates
//! by the absolute position, attention sees only the rows computed). A row
//! that did not draft for a long stretch (its prompt, `auto`'s steps at γ = 0)
//! so pays at most the window when it drafts again, not the MTP layer over
//! every token since it last drafted. The invariant, checked at every step:
//! the MTP cache ends at or before the first pending row, and the pending rows
//! end at the main cache's end.
//!
//! The MTP layer may run its absorption in either attention form, chosen for
//! more than 4 pending rows by what each costs, as for any prefill chunk (a
//! window's rows over a long MTP cache stay absorbed).

#[cfg(doc)]
use super::drafter::Drafter;
use super::drafter::Proposals;
use crate::error::{Error, Result};
use nectar_model::{Glm5, MtpStep, NoObserver, SeqCache};

/// Most pending rows a drafter keeps: what drafting absorbs after a stretch without drafting
/// (the prompt, `auto`'s steps at γ = 0); older rows are left out of the MTP cache. It bounds
/// what resuming costs to about as many MTP-layer rows as a few drafting rounds absorb, while
/// the MTP layer still attends over the recent context its next drafts lean on most (each
/// row also carries the main model's hidden, which saw everything). On the demo model
/// (`benchmarks/RESULTS.md`, issue 12) `auto` at one row went from 0.93–1.01 MTP rows absorbed
/// per generated token to 0.31–0.35, and `--mtp on`'s acceptance did not change.
pub const ABSORB_WINDOW: usize = 16;
const _: () = assert!(ABSORB_WINDOW > super::MAX_DRAFT);

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
    /// Rows the latest observation added: what a row that drafts every step absorbs.
    last_observed: usize,
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
            last_observed: 0,
            forwards: 0,
        })
    }

    /// Rows observed but not yet absorbed into the MTP cache.
    pub fn pending(&self) -> usize {
        self.pending_next.len()
    }

    /// Of the pending rows, those that built up while the row did not draft (its prompt, and
    /// the rows of steps at γ = 0): what resuming drafting costs on top of a drafting step.
    pub fn backlog(&self) -> usize {
        self.pending().saturating_sub(self.last_observed)
    }

    /// The position of the first pending row: the pending rows are the main cache's last.
    fn first_pending(&self, cache: &SeqCache, when: &str) -> Result<usize> {
        let (end, main) = (cache.mtp.end(), cache.len());
        match main.checked_sub(self.pending()) {
            Some(first) if end <= first => Ok(first),
            _ => Err(Error::Speculation(format!(
                "{when}: the MTP cache ends at position {end} and {} rows are pending, but the \
                 main cache holds {main}",
                self.pending()
            ))),
        }
    }
}

impl MtpDrafter {
    /// The main model kept these rows (see [`Drafter::observe`]): the round's chained rows leave
    /// the MTP cache, the kept rows wait to be absorbed.
    pub(crate) fn observe(
        &mut self,
        cache: &mut SeqCache,
        hidden: &[f32],
        next: &[u32],
    ) -> Result<()> {
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
        self.last_observed = next.len();
        // Rows beyond the window are never absorbed: drop them now, so pending memory stays
        // bounded too. A verified round's kept rows (≤ MAX_DRAFT + 1) always fit.
        let drop = self.pending().saturating_sub(ABSORB_WINDOW);
        if drop > 0 {
            self.pending_h.drain(..drop * self.hd);
            self.pending_next.drain(..drop);
        }
        self.first_pending(cache, "after verification")?;
        Ok(())
    }

    /// MTP forwards this drafter took part in.
    pub(crate) fn forwards(&self) -> usize {
        self.forwards
    }
}

/// One speculating row of a batch step: its drafter, its caches and the proposals to fill.
pub(crate) struct MtpRow<'r, 's> {
    pub drafter: &'r mut MtpDrafter,
    pub cache: &'r mut SeqCache,
    pub proposals: Proposals<'s>,
}

/// Drafts for every row together: one MTP forward absorbs every row's waiting rows (ragged),
/// then per draft depth one MTP-logits call over the rows still drafting and one chained MTP
/// forward, so the MTP layer's experts are read once per depth, not once per row.
pub(crate) fn draft_together(model: &Glm5, rows: &mut [MtpRow<'_, '_>]) -> Result<Absorbed> {
    let hd = model.hidden_size();
    let t0 = std::time::Instant::now();
    let absorbed: Vec<usize> = rows.iter().map(|r| r.drafter.pending()).collect();
    let backlog = rows.iter().map(|r| r.drafter.backlog()).sum();
    for r in rows.iter_mut() {
        let first = r.drafter.first_pending(r.cache, "before absorbing")?;
        if r.drafter.pending() > 0 {
            // After rows were dropped, the absorbed ones sit at their true positions.
            r.cache.mtp.skip_to(first)?;
        }
    }
    if absorbed.iter().any(|&n| n > 0) {
        let hm = {
            let mut steps: Vec<MtpStep<'_>> = rows
                .iter_mut()
                .filter(|r| r.drafter.pending() > 0)
                .map(|r| MtpStep {
                    cache: &mut *r.cache,
                    hidden: &r.drafter.pending_h,
                    next_tokens: &r.drafter.pending_next,
                })
                .collect();
            model.mtp_forward(&mut steps, &mut NoObserver)?
        };
        let mut end = 0;
        for (r, &n) in rows.iter_mut().zip(&absorbed) {
            if n == 0 {
                continue;
            }
            end += n;
            r.drafter.last = Some(hm[(end - 1) * hd..end * hd].to_vec());
            r.drafter.forwards += 1;
            r.drafter.pending_h.clear();
            r.drafter.pending_next.clear();
        }
    }
    let absorb_secs = t0.elapsed().as_secs_f64();
    let mut h = Vec::with_capacity(rows.len());
    for r in rows.iter_mut() {
        r.drafter.first_pending(r.cache, "before drafting")?;
        let Some(last) = r.drafter.last.clone() else {
            return Err(Error::Speculation(
                "MTP drafting before any row was observed".into(),
            ));
        };
        h.push(last);
        r.drafter.round_start = Some(r.cache.mtp.len());
    }
    let depth = rows.iter().map(|r| r.proposals.max()).max().unwrap_or(0);
    for j in 0..depth {
        let active: Vec<usize> = (0..rows.len())
            .filter(|&i| j < rows[i].proposals.max())
            .collect();
        if active.is_empty() {
            break;
        }
        if j > 0 {
            // Each active row's next chained row: its previous MTP hidden and its last draft.
            let prev: Vec<u32> = active
                .iter()
                .map(|&i| *rows[i].proposals.context().last().unwrap_or(&0))
                .collect();
            let out = {
                let mut steps: Vec<MtpStep<'_>> = rows
                    .iter_mut()
                    .enumerate()
                    .filter(|(i, _)| active.contains(i))
                    .zip(&prev)
                    .map(|((i, r), t)| MtpStep {
                        cache: &mut *r.cache,
                        hidden: &h[i],
                        next_tokens: std::slice::from_ref(t),
                    })
                    .collect();
                model.mtp_forward(&mut steps, &mut NoObserver)?
            };
            for (k, &i) in active.iter().enumerate() {
                h[i] = out[k * hd..(k + 1) * hd].to_vec();
                rows[i].drafter.forwards += 1;
            }
        }
        let cat: Vec<f32> = active.iter().flat_map(|&i| h[i].iter().copied()).collect();
        let logits = model.mtp_logits(&cat)?;
        let vocab = logits.len() / active.len();
        for (k, &i) in active.iter().enumerate() {
            rows[i]
                .proposals
                .sample(&logits[k * vocab..(k + 1) * vocab])?;
        }
    }
    Ok(Absorbed {
        rows: absorbed,
        backlog,
        secs: absorb_secs,
    })
}

/// What a drafting step's MTP absorption was.
pub(crate) struct Absorbed {
    /// Rows each drafting row absorbed.
    pub rows: Vec<usize>,
    /// Of all those, rows that built up while their row did not draft ([`MtpDrafter::backlog`]).
    pub backlog: usize,
    /// Seconds the absorption took (drafting apart).
    pub secs: f64,
}
