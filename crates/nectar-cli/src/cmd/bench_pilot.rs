//! Real next-layer predictions for a recorded routing trace, for `nectar bench decode --prefetch
//! pilot`: the trace's model (by default the one its manifest names) re-runs every conversation of the trace
//! with prediction on, and each row gets the experts PILOT predicted for each MoE layer from the
//! previous layer's post-attention state. The replay then prefetches exactly what the real
//! predictor would have, on the synth container's geometry.
use anyhow::{Context, Result};
use nectar_model::arch::glm5::{LoadOptions, PilotStats, Prefetch};
use nectar_model::{Glm5, Observer, SeqStep};
use nectar_residency::trace::Trace;
use std::path::Path;

/// Predictions `[row][trace layer] → experts` (trace layer i = model MoE layer `first_moe + i`;
/// empty where the model makes none), and how well they and the model's own routing agree
/// with the trace.
pub struct TracePredictions {
    /// Per trace row and layer.
    pub predicted: Vec<Vec<Vec<u32>>>,
    /// Share of the trace's chosen experts the prediction named.
    pub recall: f64,
    /// Per rank of a prediction (its router's order: most confident first), the share of
    /// predictions at that rank the layer then chose.
    pub precision_by_rank: Vec<f64>,
    /// Share of the trace's chosen experts our model's router also chose (a routing-parity
    /// check: the predictions are only meaningful on the trace's own routes).
    pub route_agreement: f64,
}

/// Below this share of the trace's experts chosen again by the predictor on the trace's texts,
/// the predictor is not the model that recorded the trace (route256's int4 model agrees with
/// its bf16 recording on 0.92), and its predictions say little about the replayed routes.
const LEAST_AGREEMENT: f64 = 0.8;

impl TracePredictions {
    /// A warning (for stderr) when the predictor's own routes disagree with the trace's.
    fn foreign_warning(&self, model: &Path) -> Option<String> {
        (self.route_agreement < LEAST_AGREEMENT).then(|| {
            format!(
                "warning: the predictor {} chooses only {:.2} of the trace's experts on the \
                 trace's own texts (below {LEAST_AGREEMENT}): it is probably not the model that \
                 recorded the trace, so its predictions (recall {:.2}) do not speak for it \
                 (--predictor)",
                model.display(),
                self.route_agreement,
                self.recall
            )
        })
    }
}

/// Collects routes and predictions of one segment (rows numbered within the segment).
struct Collect {
    first_moe: usize,
    layers: usize,
    predicted: Vec<Vec<Vec<u32>>>,
    routed: Vec<Vec<Vec<u32>>>,
}

impl Observer for Collect {
    fn router(&mut self, layer: usize, row: usize, ids: &[u32], _weights: &[f32]) {
        if let Some(i) = layer
            .checked_sub(self.first_moe)
            .filter(|&i| i < self.layers)
        {
            self.routed[row][i] = ids.to_vec();
        }
    }
    fn predicted(&mut self, layer: usize, row: usize, ids: &[u32]) {
        if let Some(i) = layer
            .checked_sub(self.first_moe)
            .filter(|&i| i < self.layers)
        {
            self.predicted[row][i] = ids.to_vec();
        }
    }
}

/// Runs `model_dir` over every segment of `trace` that starts before row `before` (prompt and
/// decoded rows, as the trace was recorded; `usize::MAX`: all of them) and returns the
/// predictions for every row (none for the rows of the segments left out).
pub fn predictions(trace: &Trace, model_dir: &Path, before: usize) -> Result<TracePredictions> {
    let (t_all, tl) = (trace.rows, trace.layers.len());
    let tokens = trace.tokens.as_ref().with_context(|| {
        format!(
            "{}: the trace has no token ids, so the predictor cannot re-run it",
            trace.path.display()
        )
    })?;
    let segments = &trace.segments;
    anyhow::ensure!(
        !segments.is_empty(),
        "{}: the trace has no segments",
        trace.path.display()
    );
    let opts = LoadOptions {
        prefetch: Prefetch::Measure,
        ..Default::default()
    };
    let model = Glm5::load_with(model_dir, &opts)
        .with_context(|| format!("loading the predictor model {}", model_dir.display()))?;
    // Another expert universe cannot have produced the trace: its predictions name other ids.
    let experts = model.cfg.raw.n_routed_experts;
    anyhow::ensure!(
        experts == trace.experts_per_layer,
        "the predictor {} routes over {experts} experts a layer, the trace {} over {}: it is not \
         the trace's model (--predictor)",
        model_dir.display(),
        trace.path.display(),
        trace.experts_per_layer
    );
    let first_moe = model.cfg.dense.iter().position(|d| !d).unwrap_or(0);
    // Trace layers of the main model (the MTP layer is not predicted by the main forward).
    let hidden_layers = model.cfg.raw.num_hidden_layers as u32;
    let layers = trace.layers.iter().filter(|&&l| l < hidden_layers).count();
    let mut predicted = vec![vec![Vec::new(); tl]; t_all];
    // The runtime's own scoring: recall and precision by rank.
    let mut score = PilotStats::default();
    let mut agreed = 0u64;
    for seg in segments.iter().take_while(|s| s.start < before) {
        let (start, end) = (seg.start, seg.end);
        anyhow::ensure!(
            start < end && end <= t_all,
            "{}: empty segment {start}..{end}",
            trace.path.display()
        );
        // A batch trace interleaves its sequences' rows (`{kind}.streams.npy`): each runs on
        // its own cache, as the server decodes them, so a row's prediction sees only its own
        // sequence's context.
        for s in trace.segment_streams(seg) {
            let rows: Vec<usize> = (start..end).filter(|&r| trace.stream(r) == s).collect();
            let ids: Vec<u32> = rows.iter().map(|&r| u32::from(tokens[r])).collect();
            let n = rows.len();
            let mut obs = Collect {
                first_moe,
                layers,
                predicted: vec![vec![Vec::new(); layers]; n],
                routed: vec![vec![Vec::new(); layers]; n],
            };
            let mut cache = model.new_cache();
            model.forward(
                &mut [SeqStep {
                    cache: &mut cache,
                    tokens: &ids,
                }],
                &mut obs,
            )?;
            for (&row, (pred, routed)) in rows.iter().zip(obs.predicted.iter_mut().zip(&obs.routed))
            {
                for (i, (p, got)) in pred.iter_mut().zip(routed).enumerate() {
                    let truth: Vec<u32> = trace.experts(row, i).collect();
                    agreed += truth.iter().filter(|e| got.contains(e)).count() as u64;
                    score.score(std::slice::from_ref(p), std::slice::from_ref(&truth));
                    predicted[row][i] = std::mem::take(p);
                }
            }
        }
    }
    let out = TracePredictions {
        predicted,
        recall: score.recall(),
        precision_by_rank: score.precision_by_rank(),
        route_agreement: agreed as f64 / score.chosen.max(1) as f64,
    };
    if let Some(w) = out.foreign_warning(model_dir) {
        eprintln!("{w}");
    }
    Ok(out)
}
