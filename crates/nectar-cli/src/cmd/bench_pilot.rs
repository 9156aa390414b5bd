//! Real next-layer predictions for a recorded routing trace, for `nectar bench decode --prefetch
//! pilot`: the trace's model (the demo model by default) re-runs every conversation of the trace
//! with prediction on, and each row gets the experts PILOT predicted for each MoE layer from the
//! previous layer's post-attention state. The replay then prefetches exactly what the real
//! predictor would have, on the synth container's geometry.
use anyhow::{Context, Result};
use nectar_model::arch::glm5::{LoadOptions, Prefetch};
use nectar_model::{Glm5, Observer, SeqStep};
use nectar_residency::sim::read_npy_u16;
use std::path::Path;

/// Predictions `[row][trace layer] → experts` (trace layer i = model MoE layer `first_moe + i`;
/// empty where the model makes none), and how well they and the model's own routing agree
/// with the trace.
pub struct TracePredictions {
    /// Per trace row and layer.
    pub predicted: Vec<Vec<Vec<u32>>>,
    /// Share of the trace's chosen experts the prediction named.
    pub recall: f64,
    /// Share of the trace's chosen experts our model's router also chose (a routing-parity
    /// check: the predictions are only meaningful on the trace's own routes).
    pub route_agreement: f64,
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

/// Runs `model_dir` over the `kind` trace of `trace_dir` (segments from its manifest) and
/// returns the predictions for every row. `experts` holds the trace's `[T, layers, k]` routes.
pub fn predictions(
    trace_dir: &Path,
    kind: &str,
    model_dir: &Path,
    experts: &[i8],
    shape: &[usize],
) -> Result<TracePredictions> {
    let (t_all, tl, tk) = (shape[0], shape[1], shape[2]);
    let tok_path = trace_dir.join(format!("{kind}.tokens.npy"));
    let bytes =
        std::fs::read(&tok_path).with_context(|| format!("reading {}", tok_path.display()))?;
    let (_, tokens) =
        read_npy_u16(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", tok_path.display()))?;
    anyhow::ensure!(
        tokens.len() == t_all,
        "{}: {} tokens for {t_all} trace rows",
        tok_path.display(),
        tokens.len()
    );
    let manifest_path = trace_dir.join("manifest.json");
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&manifest_path)
            .with_context(|| format!("reading {}", manifest_path.display()))?,
    )
    .with_context(|| format!("parsing {}", manifest_path.display()))?;
    let segments = manifest["traces"][kind]["segments"]
        .as_array()
        .with_context(|| {
            format!(
                "{}: no segments for trace `{kind}`",
                manifest_path.display()
            )
        })?;
    let opts = LoadOptions {
        prefetch: Prefetch::Measure,
        ..Default::default()
    };
    let model = Glm5::load_with(model_dir, &opts)
        .with_context(|| format!("loading the predictor model {}", model_dir.display()))?;
    let first_moe = model.cfg.dense.iter().position(|d| !d).unwrap_or(0);
    // The trace's last layer is the MTP layer, which the main forward does not predict.
    let layers = tl.saturating_sub(1);
    let mut predicted = vec![vec![Vec::new(); tl]; t_all];
    let (mut chosen, mut named, mut agreed) = (0u64, 0u64, 0u64);
    for seg in segments {
        let (start, end) = (
            seg["start"].as_u64().unwrap_or(0) as usize,
            seg["end"].as_u64().unwrap_or(0) as usize,
        );
        anyhow::ensure!(
            start < end && end <= t_all,
            "{}: bad segment {seg}",
            manifest_path.display()
        );
        let n = end - start;
        let ids: Vec<u32> = tokens[start..end].iter().map(|&t| u32::from(t)).collect();
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
        for (r, (pred, routed)) in obs.predicted.iter_mut().zip(&obs.routed).enumerate() {
            for (i, (p, got)) in pred.iter_mut().zip(routed).enumerate() {
                let base = ((start + r) * tl + i) * tk;
                let truth: Vec<u32> = experts[base..base + tk]
                    .iter()
                    .filter(|&&e| e >= 0)
                    .map(|&e| e as u32)
                    .collect();
                chosen += truth.len() as u64;
                named += truth.iter().filter(|e| p.contains(e)).count() as u64;
                agreed += truth.iter().filter(|e| got.contains(e)).count() as u64;
                predicted[start + r][i] = std::mem::take(p);
            }
        }
    }
    Ok(TracePredictions {
        predicted,
        recall: named as f64 / chosen.max(1) as f64,
        route_agreement: agreed as f64 / chosen.max(1) as f64,
    })
}
