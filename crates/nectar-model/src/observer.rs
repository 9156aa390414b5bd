//! Named intermediates: a forward pass reports its discrete decisions and layer outputs to an
//! observer, so tests and `nectar logits` can compare them with the reference.

/// Receives intermediates during a forward pass. Rows are numbered across the whole batch.
pub trait Observer {
    /// The residual stream after decoder layer `layer` for all rows (`rows × hidden`).
    fn layer_output(&mut self, _layer: usize, _x: &[f32]) {}
    /// The experts chosen for `row` at MoE layer `layer`, in selection order, with their final
    /// combine weights (after normalisation and routed scaling).
    fn router(&mut self, _layer: usize, _row: usize, _ids: &[u32], _weights: &[f32]) {}
    /// The key positions `row` attends to at `layer` (`None`: all of `0..=pos`), and whether this
    /// layer computed them (`full`) or reused the previous full layer's selection.
    fn indexer(&mut self, _layer: usize, _row: usize, _full: bool, _selected: Option<&[u32]>) {}
    /// The next-layer prediction for `row` at MoE layer `layer` (made from the previous
    /// layer's post-attention state; only with prediction on, see `Prefetch`).
    fn predicted(&mut self, _layer: usize, _row: usize, _ids: &[u32]) {}
    /// **Benchmark replay only** (`nectar bench replay`): experts that replace the router's
    /// choice for `row` at MoE layer `layer`, so a recorded routing trace drives the real model
    /// code. Every observer of `run`, `serve` and the tests keeps the default (`None`: the
    /// router decides); the replacement experts share the router's total combine weight.
    fn replay_route(&mut self, _layer: usize, _row: usize) -> Option<Vec<u32>> {
        None
    }
    /// **Benchmark replay only**: the next-layer prediction for `row` at MoE layer `layer`
    /// (see [`Observer::predicted`]) recorded from the model that produced the replayed routes,
    /// in place of this model's early router (whose guesses mean nothing against replayed
    /// routes). `None` (every other observer): the model predicts.
    fn replay_prediction(&mut self, _layer: usize, _row: usize) -> Option<Vec<u32>> {
        None
    }
}

/// An observer that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;

impl Observer for NoObserver {}
