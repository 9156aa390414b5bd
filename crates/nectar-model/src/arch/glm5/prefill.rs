//! Layer-major prefill: one sequence's prompt span advanced a few layers at a time, its residual
//! stream kept between calls.
//!
//! [`Glm5::forward`] already runs layer by layer over all the rows it is given, so each layer's
//! MoE reads the union of the span's experts once. A [`Prefill`] lets a caller (the engine's
//! batch) stop between layers — to let other sequences decode — without splitting the span
//! into token chunks, each of which would read its own union again. Running a span's layers in
//! any number of calls computes the same bits as one `forward` over it: the calls run the same
//! layers over the same rows in the same order, and each layer's caches are filled as its call
//! completes.
use super::{Glm5, Layout};
use crate::cache::SeqCache;
use crate::error::{Error, Result};
use crate::observer::Observer;

/// A prompt span in flight: its residual stream after the layers run so far.
#[derive(Debug)]
pub struct Prefill {
    /// Position of the span's first token.
    start: usize,
    /// Tokens in the span.
    count: usize,
    /// `count × hidden` residual stream after layer `next - 1` (the embeddings before layer 0).
    x: Vec<f32>,
    /// The DSA selection a full-indexer layer left for the layers that share it.
    sel: Vec<Option<Vec<u32>>>,
    /// The next main layer to run.
    next: usize,
}

impl Prefill {
    /// Position of the span's first token.
    pub fn start(&self) -> usize {
        self.start
    }

    /// Tokens in the span.
    pub fn tokens(&self) -> usize {
        self.count
    }

    /// Main layers already run over the span.
    pub fn layers_done(&self) -> usize {
        self.next
    }
}

impl Glm5 {
    /// Main decoder layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Starts a span of `tokens` that continues `cache` (its first position is `cache.len()`).
    pub fn prefill_begin(&self, cache: &SeqCache, tokens: &[u32]) -> Result<Prefill> {
        let start = cache.len();
        if tokens.is_empty() || cache.layers.iter().any(|l| l.len() != start) {
            return Err(Error::Input(format!(
                "a prefill span needs tokens ({}) and a cache whose layers hold the same \
                 tokens (first layer: {start})",
                tokens.len()
            )));
        }
        let x = self.guarded(|| self.embed_step(tokens, &vec![cache.id(); tokens.len()]))?;
        Ok(Prefill {
            start,
            count: tokens.len(),
            x,
            sel: vec![None; tokens.len()],
            next: 0,
        })
    }

    /// Runs up to `layers` (at least one) more main layers over the span, appending to those
    /// layers' caches. Returns the span's post-final-norm hiddens (`tokens × hidden`, as
    /// [`Glm5::forward`] returns them) once the last layer has run, else `None`.
    pub fn prefill_layers(
        &self,
        p: &mut Prefill,
        cache: &mut SeqCache,
        layers: usize,
        obs: &mut dyn Observer,
    ) -> Result<Option<Vec<f32>>> {
        let n = self.layers.len();
        let end = (p.next + layers.max(1)).min(n);
        for l in p.next..end {
            if cache.layers.get(l).map(|c| c.len()) != Some(p.start) {
                return Err(Error::Input(format!(
                    "prefill span at {}: layer {l}'s cache does not end where the span starts",
                    p.start
                )));
            }
        }
        let layout = Layout::new(&[p.start], &[p.count]);
        self.guarded(|| {
            self.run_layers(
                &mut p.x,
                &layout,
                &mut [cache],
                &mut p.sel,
                p.next..end,
                obs,
            )
        })?;
        p.next = end;
        Ok((end == n).then(|| self.final_norm(&p.x, &self.norm)))
    }
}
