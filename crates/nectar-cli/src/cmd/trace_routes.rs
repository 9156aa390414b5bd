//! A recorded routing trace in place of the model's router (benchmark-only): each MoE layer
//! takes its experts for each row of a forward from the trace (`Observer::replay_route`), so a
//! synth container with random-weight routers sees GLM-5.2-shaped routing. Used by
//! `bench replay` and by `fit --project`'s calibration decode.
use anyhow::Result;
use nectar_model::{Glm5, Observer};
use nectar_residency::trace::Trace;
use std::collections::HashMap;
use std::time::Instant;

/// The trace's routes for the rows of the current forward.
pub struct TraceRoutes<'a> {
    trace: &'a Trace,
    /// Model layer → trace layer.
    map: HashMap<usize, usize>,
    /// Trace row of each row of the current forward.
    pub rows: Vec<usize>,
    /// Wall seconds of the MoE blocks so far (routes taken → the layer's output), waits for
    /// reads included: the time a layer's demand reads can overlap.
    pub moe_seconds: f64,
    /// The MoE layer in progress and when its routes were taken.
    block: Option<(usize, Instant)>,
    /// Per trace row and trace layer: the next-layer prediction the trace's model made
    /// (`bench_pilot`), replayed in place of the container's early router.
    predicted: Option<&'a [Vec<Vec<u32>>]>,
}

impl<'a> TraceRoutes<'a> {
    /// Routes of `trace` mapped onto `model`'s MoE layers (and its MTP layer).
    pub fn new(model: &Glm5, trace: &'a Trace) -> Result<Self> {
        Ok(Self {
            trace,
            map: layer_map(model, trace)?,
            rows: Vec::new(),
            moe_seconds: 0.0,
            block: None,
            predicted: None,
        })
    }

    /// Replays `predicted` (per trace row and layer) as the model's next-layer predictions.
    pub fn with_predictions(self, predicted: Option<&'a [Vec<Vec<u32>>]>) -> Self {
        Self { predicted, ..self }
    }

    /// The trace layer whose routes model layer `layer` takes.
    pub fn trace_layer(&self, layer: usize) -> Option<usize> {
        self.map.get(&layer).copied()
    }
}

impl Observer for TraceRoutes<'_> {
    fn replay_route(&mut self, layer: usize, row: usize) -> Option<Vec<u32>> {
        if self.block.map(|b| b.0) != Some(layer) {
            self.block = Some((layer, Instant::now()));
        }
        let tl = *self.map.get(&layer)?;
        Some(self.trace.experts(*self.rows.get(row)?, tl).collect())
    }

    fn replay_prediction(&mut self, layer: usize, row: usize) -> Option<Vec<u32>> {
        let tl = *self.map.get(&layer)?;
        Some(self.predicted?.get(*self.rows.get(row)?)?.get(tl)?.clone())
    }

    fn layer_output(&mut self, layer: usize, _x: &[f32]) {
        if let Some((l, t0)) = self.block.take() {
            if l == layer {
                self.moe_seconds += t0.elapsed().as_secs_f64();
            }
        }
    }
}

/// Model MoE layer → trace layer: the trace layer of the same id when the trace was recorded
/// on this model's layout, else the trace's main layers in turn; the MTP layer takes the
/// trace's MTP layer.
fn layer_map(model: &Glm5, trace: &Trace) -> Result<HashMap<usize, usize>> {
    let n = model.cfg.raw.num_hidden_layers;
    let hidden = trace.hidden_layers();
    let main = trace.main_layers(hidden);
    anyhow::ensure!(!main.is_empty(), "{}: no main layers", trace.path.display());
    let moe: Vec<usize> = (0..n).filter(|&l| !model.cfg.dense[l]).collect();
    let same = moe
        .iter()
        .all(|&l| main.iter().any(|&i| trace.layers[i] as usize == l));
    let mut map: HashMap<usize, usize> = moe
        .iter()
        .enumerate()
        .map(|(j, &l)| {
            let i = if same {
                main.iter()
                    .copied()
                    .find(|&i| trace.layers[i] as usize == l)
                    .unwrap_or(main[0])
            } else {
                main[j % main.len()]
            };
            (l, i)
        })
        .collect();
    if let (true, Some(&m)) = (model.has_mtp(), trace.mtp_layers(hidden).first()) {
        map.insert(n, m);
    }
    same_expert_shape(
        trace,
        model.cfg.raw.n_routed_experts,
        model.cfg.raw.num_experts_per_tok,
    )?;
    Ok(map)
}

/// A trace replays only onto its own expert shape: its ids are never remapped, and a trace of
/// fewer experts or a smaller top-k would run a smaller universe (or fewer experts per token)
/// and make the cache look better than the container's own routing can. `bench replay`, `fit
/// --project`'s calibration and `bench decode` all check it here.
pub fn same_expert_shape(trace: &Trace, experts: usize, top_k: usize) -> Result<()> {
    anyhow::ensure!(
        trace.experts_per_layer == experts && trace.top_k == top_k,
        "{}: the trace routes top-{} of {} experts; the container has top-{top_k} of {experts} \
         (a trace replays only onto its own expert shape: ids are never remapped)",
        trace.path.display(),
        trace.top_k,
        trace.experts_per_layer,
    );
    Ok(())
}
