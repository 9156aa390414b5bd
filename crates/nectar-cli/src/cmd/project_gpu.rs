//! The GPU tier of `nectar fit --project --gpu-memory SIZE`: what the VRAM holds (the placement
//! `run` and `serve` apply: the spine first, then routed experts) and how fast the card and its
//! link are. The card's speeds are flags, never measured here: the projection is for the machine
//! described, which need not be this one.
//!
//! How it enters the projection (`project.rs`): spine matrices in VRAM are read by the GPU
//! kernels (`--gpu-gbps`) and each costs one round trip per forward (`--gpu-product-us`: launch,
//! activation copies, synchronisation — `Linear::forward` waits for each product); VRAM experts
//! run on the GPU beside the CPU's experts (two launches per layer); the RAM cache and the disk
//! see only the requests for experts not in VRAM — the route trace replayed with those experts
//! removed, so the hit rate is the RAM tier's own. A spine matrix in VRAM releases its host
//! copy (all but `kv_b_proj`, which decode's attention reads on the CPU for sequences whose KV
//! mirror does not fit in VRAM), so the RAM plan counts only the rest and the budget's expert
//! slots grow by what was released.
use super::project::{Geometry, Glm52};
use anyhow::Result;
use nectar_model::arch::glm5::GpuPlan;
use nectar_residency::trace::Trace;
use std::path::Path;

use super::glm52_spine;

/// The GPU of a projection.
#[derive(Debug, Clone)]
pub struct GpuTier {
    /// The VRAM budget, bytes.
    pub budget: f64,
    /// Spine bytes in VRAM.
    pub spine_bytes: f64,
    /// Of them, bytes whose host copy is released (RAM the memory plan gives to expert slots).
    pub released: f64,
    /// Spine products the GPU makes per forward.
    pub spine_products: f64,
    /// Routed experts in VRAM per MoE layer.
    pub experts_per_layer: usize,
    /// Weight bytes per second of the GPU kernels at M = 1, GB/s.
    pub gbps: f64,
    /// Round trip of one product beyond its weight reads, seconds.
    pub product_s: f64,
    /// Prefill on the card, when its speeds are given ([`GpuTier::prefill_speeds`]).
    pub prefill: Option<GpuPrefill>,
    /// Bytes per second of an expert's copy to the card (`--gpu-copy-gbps`); `None`: experts
    /// not in VRAM run on the CPU.
    pub copy_bps: Option<f64>,
}

/// How fast the card prefills: `T(P) = layers·P·per_token_layer_s + attention(P)/attn_flops
/// + one read of every touched expert not in VRAM` (`project.rs`).
#[derive(Debug, Clone, Copy)]
pub struct GpuPrefill {
    /// Seconds per prompt token and layer beyond attention's quadratic work.
    pub per_token_layer_s: f64,
    /// FLOP/s of the prompt's attention on the GPU.
    pub attn_flops: f64,
}

impl GpuTier {
    /// GLM-5.2 encoded as `enc`, from its matrices: the spine (all of it that fits, in
    /// proportion when it does not — `kv_b_proj`'s kept host copies too), then whole experts
    /// evenly over the MoE layers.
    pub fn glm52(enc: Glm52, g: &Geometry, budget: u64, gbps: f64, product_s: f64) -> GpuTier {
        let b = budget as f64;
        let spine = g.spine_read.min(b);
        let kept = glm52_spine::kv_b_bytes(enc.group()) as f64;
        let products = glm52_spine::PRODUCTS as f64;
        let per_layer = ((b - spine) / g.expert / g.moe_layers as f64)
            .floor()
            .max(0.0);
        GpuTier {
            budget: b,
            spine_bytes: spine,
            released: spine * (1.0 - kept / g.spine_read),
            spine_products: products * spine / g.spine_read,
            experts_per_layer: per_layer as usize,
            gbps,
            product_s,
            prefill: None,
            copy_bps: None,
        }
    }

    /// A container's VRAM plan (`fit --gpu-memory`'s): its spine matrices placed, and the
    /// fewest experts any MoE layer holds (the plan spreads them in turn across layers).
    pub fn from_plan(p: &GpuPlan, gbps: f64, product_s: f64) -> GpuTier {
        GpuTier {
            budget: p.budget as f64,
            spine_bytes: p.spine_bytes() as f64,
            released: p.released_bytes as f64,
            spine_products: p.spine.len() as f64,
            experts_per_layer: p.per_layer.values().map(|x| x.0).min().unwrap_or(0),
            gbps,
            product_s,
            prefill: None,
            copy_bps: None,
        }
    }

    /// `p` (GLM-5.2's memory plan from its constants) with the released host copies out of
    /// its resident spine term: what `plan_memory` does for a container from its headers.
    pub fn release_spine(&self, p: &mut nectar_residency::planner::PlanInputs) {
        if let Some(term) = p.spine.first_mut() {
            term.1 = term.1.saturating_sub(self.released as u64);
            term.0 += " (RAM: less the host copies released for VRAM)";
        }
    }

    /// The flags' checks: speeds must be given and positive.
    pub fn speeds(gbps: Option<f64>, product_us: Option<f64>) -> Result<(f64, f64)> {
        let gbps = gbps.ok_or_else(|| {
            anyhow::anyhow!(
                "--project with --gpu-memory needs --gpu-gbps: the weight GB/s of the GPU's int4 \
                 kernels at M = 1 (about 0.35–0.4 of the card's memory bandwidth today, \
                 docs/gpu.md)"
            )
        })?;
        let us = product_us.ok_or_else(|| {
            anyhow::anyhow!(
                "--project with --gpu-memory needs --gpu-product-us: one product's round trip \
                 beyond its weight reads (launch, activation copies, synchronisation)"
            )
        })?;
        anyhow::ensure!(gbps > 0.0, "--gpu-gbps {gbps}: expected a positive rate");
        anyhow::ensure!(us >= 0.0, "--gpu-product-us {us}: expected a duration ≥ 0");
        Ok((gbps, us / 1e6))
    }

    /// The prefill flags: both or neither (then the projection prints the CPU's prefill).
    pub fn prefill_speeds(us: Option<f64>, tflops: Option<f64>) -> Result<Option<GpuPrefill>> {
        match (us, tflops) {
            (Some(us), Some(tf)) => Ok(Some(GpuPrefill {
                per_token_layer_s: us / 1e6,
                attn_flops: tf * 1e12,
            })),
            (None, None) => Ok(None),
            _ => anyhow::bail!(
                "--gpu-prefill-us and --gpu-attn-tflops go together: the card's prefill time per \
                 token and layer, and its prompt attention's rate"
            ),
        }
    }
}

/// The `experts_per_layer` most selected experts of every trace layer in `layers`, ranked on
/// the trace directory's `prefill` stream — other text, standing in for the usage ledger the
/// runtime ranks by — else on `trace` itself (then the projection has seen its own future: the
/// reply says so). Returns per trace layer the experts held, and the ranking's source.
pub fn hot_sets(
    dir: &Path,
    trace: &Trace,
    layers: &[usize],
    experts_per_layer: usize,
) -> (Vec<Vec<u32>>, String) {
    let (rank, source) = match Trace::load(dir, "prefill") {
        Ok(t) if t.layers == trace.layers && t.experts_per_layer == trace.experts_per_layer => {
            (t, "the trace's prefill stream (other text)".to_string())
        }
        _ => (
            trace.clone(),
            format!("the {} trace itself (no prefill stream)", trace.kind),
        ),
    };
    let mut sets = vec![Vec::new(); trace.layers.len()];
    for &l in layers {
        let mut counts = vec![0u64; rank.experts_per_layer];
        for r in 0..rank.rows {
            for e in rank.experts(r, l) {
                if let Some(c) = counts.get_mut(e as usize) {
                    *c += 1;
                }
            }
        }
        let mut order: Vec<u32> = (0..counts.len() as u32).collect();
        order.sort_by_key(|&e| (std::cmp::Reverse(counts[e as usize]), e));
        order.truncate(experts_per_layer);
        sets[l] = order;
    }
    (sets, source)
}

/// `trace` without the experts of `sets` (per trace layer): what the RAM tier is asked for.
pub fn without(trace: &Trace, sets: &[Vec<u32>]) -> Trace {
    let mut t = trace.clone();
    let width = t.layers.len() * t.top_k;
    for (i, id) in t.ids.iter_mut().enumerate() {
        let layer = (i % width) / t.top_k;
        if *id >= 0 && sets[layer].contains(&(*id as u32)) {
            *id = -1;
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace_dir() -> std::path::PathBuf {
        super::super::bench_policy::default_trace_dir()
    }

    #[test]
    fn the_hot_sets_are_the_most_selected_and_leave_the_ram_tier_the_rest() {
        let dir = trace_dir();
        let t = Trace::load(&dir, "decode").unwrap();
        let layers = t.main_layers(t.hidden_layers());
        let (sets, source) = hot_sets(&dir, &t, &layers, 16);
        assert!(source.contains("prefill"), "{source}");
        let rest = without(&t, &sets);
        let count =
            |t: &Trace, l: usize| (0..t.rows).map(|r| t.experts(r, l).count()).sum::<usize>();
        let p = Trace::load(&dir, "prefill").unwrap();
        for &l in &layers {
            assert_eq!(sets[l].len(), 16);
            // Removed: exactly the requests for the held experts; the others untouched.
            let held: usize = (0..t.rows)
                .map(|r| t.experts(r, l).filter(|e| sets[l].contains(e)).count())
                .sum();
            assert!(
                held > 0,
                "layer {l}: the hottest 16 of 256 are never selected"
            );
            assert_eq!(count(&rest, l), count(&t, l) - held);
            assert!(rest.experts(0, l).all(|e| !sets[l].contains(&e)));
            // The most selected in the ranking stream: 16 experts of 256 take more than 16/256
            // of its selections (routing is skewed).
            let sel = |pred: &dyn Fn(u32) -> bool| -> usize {
                (0..p.rows)
                    .map(|r| p.experts(r, l).filter(|&e| pred(e)).count())
                    .sum()
            };
            let hot = sel(&|e| sets[l].contains(&e)) as f64;
            let all = sel(&|_| true) as f64;
            assert!(hot / all > 16.0 / 256.0, "layer {l}: {hot} of {all}");
        }
    }

    #[test]
    fn glm52_spine_first_then_whole_experts_evenly() {
        let (g, _) = Geometry::glm52(
            Glm52::G64,
            &nectar_model::arch::glm5::LoadOptions::default(),
            8,
        );
        // 22 GB: the 10.6 GB g64 spine, then 11.4 GB / 21.2 MB / 75 = 7.2 → 7 experts per layer.
        let t = GpuTier::glm52(Glm52::G64, &g, 22_000_000_000, 400.0, 20e-6);
        assert_eq!(t.spine_bytes, g.spine_read);
        assert_eq!(t.spine_products, glm52_spine::PRODUCTS as f64);
        assert_eq!(t.experts_per_layer, 7);
        // 4 GB: part of the spine, its products in proportion, no experts.
        let t = GpuTier::glm52(Glm52::G64, &g, 4_000_000_000, 400.0, 20e-6);
        assert_eq!(t.spine_bytes, 4e9);
        let share = 4e9 / g.spine_read;
        assert!((t.spine_products - (glm52_spine::PRODUCTS as f64) * share).abs() < 1e-9);
        assert_eq!(t.experts_per_layer, 0);
    }

    #[test]
    fn the_card_speeds_are_required_and_checked() {
        assert!(GpuTier::speeds(None, Some(20.0))
            .unwrap_err()
            .to_string()
            .contains("--gpu-gbps"));
        assert!(GpuTier::speeds(Some(400.0), None)
            .unwrap_err()
            .to_string()
            .contains("--gpu-product-us"));
        assert!(GpuTier::speeds(Some(0.0), Some(20.0)).is_err());
        assert_eq!(
            GpuTier::speeds(Some(400.0), Some(20.0)).unwrap(),
            (400.0, 20e-6)
        );
    }
}
