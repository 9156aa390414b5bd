//! Dense MLP and sigmoid-routed MoE (`specs/glm5-architecture.md` §5.10–5.12).
use super::gpu_combine::GpuCombine;
use super::offload::Step;
use super::phases::{Lap, Phase};
use crate::blocks::{Linear, Loader};
use crate::error::{Error, Result};
use crate::observer::Observer;
use nectar_kernels::{matmul, swiglu_in_place, team, MatRef};
use nectar_residency::Residency;
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// ε of the router's weight renormalisation.
const RENORM_EPS: f32 = 1e-20;

/// A SwiGLU MLP: `down(silu(gate·x) ⊙ up·x)` (dense layers, routed and shared experts).
#[derive(Debug)]
pub struct SwiGlu {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl SwiGlu {
    /// Gate, up, down.
    pub(super) fn linears_mut(&mut self) -> Vec<&mut Linear> {
        vec![&mut self.gate, &mut self.up, &mut self.down]
    }

    /// Loads `{prefix}{gate,up,down}_proj.weight`.
    pub fn load(ld: &Loader<'_>, prefix: &str, hidden: usize, inter: usize) -> Result<Self> {
        Ok(SwiGlu {
            gate: ld.linear(&format!("{prefix}gate_proj.weight"), inter, hidden)?,
            up: ld.linear(&format!("{prefix}up_proj.weight"), inter, hidden)?,
            down: ld.linear(&format!("{prefix}down_proj.weight"), hidden, inter)?,
        })
    }

    /// `m` rows → `m × hidden`: on the GPU as one chain when all three matrices are there
    /// (the activations stay in VRAM), else product by product.
    pub fn forward(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        #[cfg(feature = "cuda")]
        if let Some(w) = self.gpu_mats() {
            let mut y = crate::blocks::GpuWeight::swiglu_many(&[(w, x, m)])?;
            return Ok(y.pop().unwrap_or_default());
        }
        let mut g = self.gate.forward(x, m)?;
        let u = self.up.forward(x, m)?;
        swiglu_in_place(&mut g, &u);
        self.down.forward(&g, m)
    }

    /// Gate, up and down in VRAM, when all three are there.
    #[cfg(feature = "cuda")]
    fn gpu_mats(&self) -> Option<VramMlp<'_>> {
        Some([
            self.gate.gpu_weight()?,
            self.up.gpu_weight()?,
            self.down.gpu_weight()?,
        ])
    }

    /// Bytes of weights.
    pub fn bytes(&self) -> usize {
        self.gate.bytes() + self.up.bytes() + self.down.bytes()
    }

    /// Whether its products run on the GPU (`--gpu-memory` placed it).
    fn on_gpu(&self) -> bool {
        self.gate.on_gpu()
    }
}

/// Routed experts computed since load, by where (each chosen expert once per forward).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExpertRuns {
    /// On the GPU from the VRAM tier (or a resident expert placed there).
    pub vram: u64,
    /// Copied from its RAM slot to the GPU and computed there.
    pub copied: u64,
    /// On the CPU.
    pub cpu: u64,
}

impl ExpertRuns {
    /// On the GPU, either way.
    pub fn gpu(&self) -> u64 {
        self.vram + self.copied
    }
}

impl std::ops::Add for ExpertRuns {
    type Output = ExpertRuns;
    fn add(self, o: ExpertRuns) -> ExpertRuns {
        ExpertRuns {
            vram: self.vram + o.vram,
            copied: self.copied + o.copied,
            cpu: self.cpu + o.cpu,
        }
    }
}

/// The routed choice for one row.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Expert ids in selection order (best selection score first).
    pub ids: Vec<u32>,
    /// Final combine weights (normalised, times `routed_scaling_factor`).
    pub weights: Vec<f32>,
}

/// Where a MoE layer's routed experts live.
#[derive(Debug)]
pub enum Experts {
    /// Every expert resident (memory-mapped from the model files).
    Resident(Vec<SwiGlu>),
    /// Streamed through the residency manager's slots under a memory budget.
    Streamed {
        /// The expert cache shared by all layers.
        residency: Arc<Residency>,
        /// This layer's index in the cache.
        layer: usize,
        /// Bytes of one expert on disk.
        expert_bytes: usize,
        /// Experts in the layer.
        count: usize,
    },
}

/// The rows of `x` a union entry's expert runs on (`(row, slot)` pairs → row indices).
fn row_ids(rows: &[(usize, usize)]) -> Vec<u32> {
    rows.iter().map(|&(i, _)| i as u32).collect()
}

/// A MoE layer step's input (`rows × hidden`), uploaded to the GPU on first use and then read
/// there by every expert of the step that runs on the GPU (VRAM tier and copied): each gathers
/// its rows in VRAM. Gathered on the host and uploaded per expert, a 4,096-row prompt moved
/// ~25 MB through host memory three times per expert (gather, concatenation, pageable upload).
// Without the CUDA tier nothing reads it (the GPU paths are uninhabited).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Debug)]
pub(super) struct LayerInput<'a> {
    x: &'a [f32],
    hidden: usize,
    #[cfg(feature = "cuda")]
    dev: std::sync::OnceLock<nectar_cuda::GpuRows>,
}

impl<'a> LayerInput<'a> {
    fn new(x: &'a [f32], hidden: usize) -> Self {
        LayerInput {
            x,
            hidden,
            #[cfg(feature = "cuda")]
            dev: std::sync::OnceLock::new(),
        }
    }

    /// f32 per row.
    #[cfg(feature = "cuda")]
    pub(super) fn hidden(&self) -> usize {
        self.hidden
    }

    /// The input in VRAM on `gpu`, uploaded by the first call.
    #[cfg(feature = "cuda")]
    pub(super) fn on(&self, gpu: &nectar_cuda::Gpu) -> Result<&nectar_cuda::GpuRows> {
        if let Some(d) = self.dev.get() {
            return Ok(d);
        }
        let d = gpu
            .upload_rows(self.x, self.hidden)
            .map_err(|e| Error::Gpu(e.to_string()))?;
        Ok(self.dev.get_or_init(|| d))
    }
}

/// `down(silu(gate·x) ⊙ up·x)` over matrices borrowed from a slot — the same kernels and
/// order as [`SwiGlu::forward`], so a streamed expert computes the same bits as a resident one.
fn swiglu_mats(m: &[MatRef<'_>; 3], x: &[f32], rows: usize) -> Result<Vec<f32>> {
    let mut g = vec![0.0; rows * m[0].rows];
    let mut u = vec![0.0; rows * m[1].rows];
    matmul(&m[0], x, rows, &mut g)?;
    matmul(&m[1], x, rows, &mut u)?;
    swiglu_in_place(&mut g, &u);
    let mut y = vec![0.0; rows * m[2].rows];
    matmul(&m[2], &g, rows, &mut y)?;
    Ok(y)
}

/// Gate, up and down of an MLP in VRAM.
#[cfg(feature = "cuda")]
type VramMlp<'a> = [&'a crate::blocks::GpuWeight; 3];

/// A MoE layer's shared expert and the experts of a union, in VRAM.
#[cfg(feature = "cuda")]
type VramLayer<'a> = (VramMlp<'a>, Vec<VramMlp<'a>>);

/// A MoE block: router, routed experts and the shared expert.
#[derive(Debug)]
pub struct Moe {
    router: Linear,
    bias: Vec<f32>,
    experts: Experts,
    shared: SwiGlu,
    top_k: usize,
    norm_topk: bool,
    scaling: f32,
    /// Selections per expert since load (one per row and chosen expert, before the union):
    /// what the usage ledger records.
    usage: Vec<AtomicU64>,
    /// The VRAM expert tier of a streamed layer (`--gpu-memory` with `--memory-budget`).
    vram: Option<super::vram::VramExperts>,
    /// Experts computed since load (each chosen expert once per forward, on all its rows):
    /// from VRAM, copied to the GPU, on the CPU.
    runs: [AtomicU64; 3],
    /// The copy route to the GPU for experts in RAM (`--gpu-memory` with `--memory-budget`),
    /// shared by the streamed layers.
    copy: Option<Arc<super::copied::CopyTier>>,
}

impl Moe {
    /// Loads `{prefix}mlp.*` of a MoE layer; routed experts come from `streamed` when given
    /// (then no expert weight is touched here), else they are mapped resident.
    pub fn load(
        ld: &Loader<'_>,
        prefix: &str,
        cfg: &super::Config,
        streamed: Option<Experts>,
    ) -> Result<Self> {
        let r = &cfg.raw;
        let p = |s: &str| format!("{prefix}mlp.{s}");
        let experts = match streamed {
            Some(e) => e,
            None => Experts::Resident(Self::load_resident(ld, prefix, cfg)?),
        };
        Ok(Moe {
            router: ld.linear(&p("gate.weight"), r.n_routed_experts, r.hidden_size)?,
            bias: ld.vector(&p("gate.e_score_correction_bias"), r.n_routed_experts)?,
            experts,
            shared: SwiGlu::load(
                ld,
                &p("shared_experts."),
                r.hidden_size,
                r.moe_intermediate_size * r.n_shared_experts,
            )?,
            top_k: r.num_experts_per_tok,
            norm_topk: r.norm_topk_prob,
            scaling: r.routed_scaling_factor,
            usage: (0..r.n_routed_experts).map(|_| AtomicU64::new(0)).collect(),
            vram: None,
            runs: Default::default(),
            copy: None,
        })
    }

    fn load_resident(ld: &Loader<'_>, prefix: &str, cfg: &super::Config) -> Result<Vec<SwiGlu>> {
        let r = &cfg.raw;
        let p = |s: &str| format!("{prefix}mlp.{s}");
        (0..r.n_routed_experts)
            .map(|e| {
                SwiGlu::load(
                    ld,
                    &p(&format!("experts.{e}.")),
                    r.hidden_size,
                    r.moe_intermediate_size,
                )
            })
            .collect::<Result<Vec<_>>>()
    }

    /// Bytes of the routed experts and of everything else.
    pub fn bytes(&self) -> (usize, usize) {
        let routed = match &self.experts {
            Experts::Resident(v) => v.iter().map(SwiGlu::bytes).sum(),
            Experts::Streamed {
                expert_bytes,
                count,
                ..
            } => expert_bytes * count,
        };
        (
            routed,
            self.router.bytes() + self.shared.bytes() + self.bias.len() * 4,
        )
    }

    /// Selections per expert since load.
    pub fn usage(&self) -> Vec<u64> {
        self.usage
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Experts computed since load, by where.
    pub fn runs(&self) -> ExpertRuns {
        let get = |i: usize| self.runs[i].load(Ordering::Relaxed);
        ExpertRuns {
            vram: get(0),
            copied: get(1),
            cpu: get(2),
        }
    }

    fn count_runs(&self, vram: usize, copied: usize, cpu: usize) {
        for (i, n) in [vram, copied, cpu].into_iter().enumerate() {
            self.runs[i].fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// The GPU a streamed step's experts run on (the copy route's, else the VRAM tier's).
    #[cfg(feature = "cuda")]
    fn step_gpu(&self) -> Option<&Arc<nectar_cuda::Gpu>> {
        match (&self.copy, &self.vram) {
            (Some(c), _) => Some(c.gpu()),
            (None, Some(v)) => v.gpu(),
            (None, None) => None,
        }
    }

    /// Gives a streamed layer the copy route to the GPU (no-op for resident experts).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) fn set_copy_tier(&mut self, tier: &Arc<super::copied::CopyTier>) {
        if matches!(self.experts, Experts::Streamed { .. }) {
            self.copy = Some(tier.clone());
        }
    }

    /// Routed experts in the layer.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn expert_count(&self) -> usize {
        self.usage.len()
    }

    /// Puts experts `ids` of MoE layer `layer` in VRAM: a resident expert gets VRAM copies of
    /// its matrices; a streamed one is read into the layer's VRAM tier. Returns (matrices,
    /// device bytes, resident expert matrices left on the CPU).
    #[cfg(feature = "cuda")]
    pub(super) fn place_experts(
        &mut self,
        gpu: &Arc<nectar_cuda::Gpu>,
        catalog: &nectar_format::Catalog,
        cfg: &super::Config,
        layer: usize,
        ids: &[u32],
    ) -> Result<(usize, u64, usize)> {
        let count = self.usage.len();
        match &mut self.experts {
            Experts::Resident(v) => {
                let mut bytes = 0;
                for &e in ids {
                    for l in v[e as usize].linears_mut() {
                        let copy = crate::blocks::GpuCopy {
                            release_host: false,
                            stored_layout: false,
                        };
                        bytes += l.place_on_gpu(gpu, copy)? as u64;
                    }
                }
                Ok((3 * ids.len(), bytes, 3 * (v.len() - ids.len())))
            }
            Experts::Streamed { .. } => {
                if ids.is_empty() {
                    return Ok((0, 0, 0));
                }
                let (t, bytes) =
                    super::vram::VramExperts::load(gpu, catalog, cfg, layer, count, ids)?;
                self.vram = Some(t);
                Ok((3 * ids.len(), bytes, 0))
            }
        }
    }

    /// Bytes of one routed expert.
    pub fn expert_bytes(&self) -> usize {
        match &self.experts {
            Experts::Resident(v) => v.first().map_or(0, SwiGlu::bytes),
            Experts::Streamed { expert_bytes, .. } => *expert_bytes,
        }
    }

    /// Router logits in f32, sigmoid, biased top-k selection, unbiased renormalised weights.
    pub fn route(&self, x: &[f32], m: usize) -> Result<Vec<Route>> {
        let logits = self.router.forward(x, m)?;
        let n = self.bias.len();
        // A prompt's rows on the compute team (each row alone: the same routes).
        Ok(match m >= team::PARALLEL_ROWS && n > 0 {
            true => team::map(m, |i| self.route_row(&logits[i * n..][..n])),
            false => logits.chunks_exact(n).map(|l| self.route_row(l)).collect(),
        })
    }

    /// A replayed route (see [`Observer::replay_route`]): the recorded experts, each with an
    /// equal share of the router's total weight.
    fn replace_route(&self, layer: usize, r: &mut Route, ids: Vec<u32>) -> Result<()> {
        let n = self.bias.len();
        if ids.len() > self.top_k || ids.iter().any(|&e| e as usize >= n) {
            return Err(Error::Input(format!(
                "layer {layer}: replayed route {ids:?} does not fit top-{} of {n} experts",
                self.top_k
            )));
        }
        let w = r.weights.iter().sum::<f32>() / ids.len().max(1) as f32;
        r.weights = vec![w; ids.len()];
        r.ids = ids;
        Ok(())
    }

    fn route_row(&self, logits: &[f32]) -> Route {
        let s: Vec<f32> = logits.iter().map(|&z| 1.0 / (1.0 + (-z).exp())).collect();
        let key: Vec<f32> = s
            .iter()
            .zip(&self.bias)
            .map(|(a, b)| {
                if (a + b).is_nan() {
                    f32::NEG_INFINITY
                } else {
                    a + b
                }
            })
            .collect();
        let mut taken = vec![false; key.len()];
        let mut ids = Vec::with_capacity(self.top_k);
        for _ in 0..self.top_k.min(key.len()) {
            // Repeated argmax with strict `>`: the lowest id wins a tie.
            let mut best: Option<usize> = None;
            for (e, &v) in key.iter().enumerate() {
                if !taken[e] && best.is_none_or(|b| v > key[b]) {
                    best = Some(e);
                }
            }
            let b = best.expect("fewer experts than top_k is refused by the config");
            taken[b] = true;
            ids.push(b as u32);
        }
        let mut weights: Vec<f32> = ids.iter().map(|&e| s[e as usize]).collect();
        if self.norm_topk {
            let sum: f32 = weights.iter().sum::<f32>() + RENORM_EPS;
            for w in &mut weights {
                *w /= sum;
            }
        }
        for w in &mut weights {
            *w *= self.scaling;
        }
        Route { ids, weights }
    }

    /// The VRAM copies of the shared expert and of every expert in `union` (in its order), when
    /// they are all there.
    #[cfg(feature = "cuda")]
    fn vram_layer(&self, union: &[(u32, Vec<(usize, usize)>)]) -> Option<VramLayer<'_>> {
        let shared = self.shared.gpu_mats()?;
        let experts = union
            .iter()
            .map(|(e, _)| match &self.experts {
                Experts::Resident(v) => v.get(*e as usize)?.gpu_mats(),
                Experts::Streamed { .. } => self.vram.as_ref()?.mats(*e),
            })
            .collect::<Option<Vec<_>>>()?;
        Some((shared, experts))
    }

    /// The layer's output by `GpuWeight::moe` over [`Moe::vram_layer`]'s matrices: the bits of
    /// the per-expert GPU path below (each expert over its rows, the same combine order).
    /// `None` when its buffers do not fit the VRAM free.
    #[cfg(feature = "cuda")]
    fn forward_in_vram(
        &self,
        (shared, experts): VramLayer<'_>,
        x: &[f32],
        m: usize,
        routes: &[Route],
        union: &[(u32, Vec<(usize, usize)>)],
    ) -> Result<Option<Vec<f32>>> {
        let k = self.top_k;
        let rows: Vec<Vec<u32>> = union
            .iter()
            .map(|(_, r)| r.iter().map(|&(i, _)| i as u32).collect())
            .collect();
        let mut pairs = vec![nectar_cuda::NO_PAIR; m * k];
        let mut weights = vec![0.0f32; m * k];
        let mut next = 0u32;
        for (_, r) in union {
            for &(i, slot) in r {
                pairs[i * k + slot] = next;
                weights[i * k + slot] = routes[i].weights[slot];
                next += 1;
            }
        }
        let items: Vec<_> = experts
            .into_iter()
            .zip(&rows)
            .map(|(w, r)| (w, r.as_slice()))
            .collect();
        let combine = nectar_cuda::MoeCombine {
            k,
            pairs: &pairs,
            weights: &weights,
        };
        crate::blocks::GpuWeight::moe(x, m, &items, shared, combine)
    }

    /// The MoE output for `m` rows.
    ///
    /// Experts run over the batch-union (each expert once, on all rows that chose it, in
    /// first-seen order); each row then sums its experts in its own selection order and adds
    /// the shared expert last, so a row's result never depends on the other rows.
    pub fn forward(
        &self,
        layer: usize,
        x: &[f32],
        m: usize,
        obs: &mut dyn Observer,
        mut after_reads: Option<&mut dyn FnMut() -> Result<()>>,
        lap: &mut Lap<'_>,
    ) -> Result<Vec<f32>> {
        let hidden = x.len() / m.max(1);
        let mut routes = self.route(x, m)?;
        for (i, r) in routes.iter_mut().enumerate() {
            if let Some(ids) = obs.replay_route(layer, i) {
                self.replace_route(layer, r, ids)?;
            }
            obs.router(layer, i, &r.ids, &r.weights);
            for &e in &r.ids {
                if let Some(c) = self.usage.get(e as usize) {
                    c.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let k = self.top_k;
        // Each expert's entry in first-seen order, found by its id (a prompt's rows × k
        // picks over up to every expert).
        let mut union: Vec<(u32, Vec<(usize, usize)>)> = Vec::new();
        let mut entry = vec![usize::MAX; self.bias.len()];
        for (i, r) in routes.iter().enumerate() {
            for (slot, &e) in r.ids.iter().enumerate() {
                let Some(u) = entry.get_mut(e as usize) else {
                    return Err(Error::Input(format!(
                        "layer {layer}: expert {e} of {}",
                        self.bias.len()
                    )));
                };
                if *u == usize::MAX {
                    *u = union.len();
                    union.push((e, Vec::new()));
                }
                union[*u].1.push((i, slot));
            }
        }
        lap.mark(Phase::MlpRoute);
        // Every expert of the union and the shared expert in VRAM: the whole layer there.
        #[cfg(feature = "cuda")]
        if let Some(vram) = self.vram_layer(&union) {
            if let Some(f) = after_reads.take() {
                f()?;
            }
            if let Some(out) = self.forward_in_vram(vram, x, m, &routes, &union)? {
                self.count_runs(union.len(), 0, 0);
                if let (
                    Experts::Streamed {
                        residency, layer, ..
                    },
                    true,
                ) = (&self.experts, m > 1)
                {
                    residency.observe_rows(*layer, &vec![Vec::new(); m]);
                }
                lap.mark(Phase::Mlp);
                return Ok(out);
            }
        }
        // Where row i's slot s finds its expert output: (union entry, row of that output).
        let mut at = vec![(usize::MAX, 0); m * k];
        for (u, (_, rows)) in union.iter().enumerate() {
            for (j, &(i, slot)) in rows.iter().enumerate() {
                at[i * k + slot] = (u, j);
            }
        }
        // Each union entry's output, kept as it arrives (a (row, slot) belongs to one entry,
        // so an entry's first pair names it).
        let mut ys: Vec<Vec<f32>> = vec![Vec::new(); union.len()];
        // An expert's rows of x, row by row on the compute team for a prompt's (a GLM-5.2
        // expert's rows of an 8,192-token prompt are ~6 MB; inside a team task it runs inline).
        let gather = |rows: &[(usize, usize)]| -> Vec<f32> {
            let mut g = vec![0.0f32; rows.len() * hidden];
            if hidden > 0 {
                team::for_each_row_mut(&mut g, hidden, |j, dst| {
                    dst.copy_from_slice(&x[rows[j].0 * hidden..][..hidden]);
                });
            }
            g
        };
        let mut scatter = |rows: &[(usize, usize)], y: Vec<f32>| {
            let (i, slot) = rows[0];
            ys[at[i * k + slot].0] = y;
        };
        let mut shared = None;
        // The experts that run on the GPU (VRAM tier and copied) read the layer's input from
        // VRAM, uploaded once ([`LayerInput`]), each gathering its rows there.
        let input = LayerInput::new(x, hidden);
        // A streamed step with experts on the GPU sums its rows there (`gpu_combine.rs`).
        #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
        let mut dev: Option<GpuCombine> = None;
        match &self.experts {
            Experts::Resident(experts) => {
                let on_gpu = union
                    .iter()
                    .filter(|(e, _)| experts[*e as usize].on_gpu())
                    .count();
                self.count_runs(on_gpu, 0, union.len() - on_gpu);
                if let Some(f) = after_reads.take() {
                    f()?;
                }
                // Experts and the shared expert are independent: computed in parallel on the
                // compute team, one task each (the shared expert first), then placed by (row,
                // slot) — the sums below run in a fixed order.
                let mut ys_union = team::map(union.len() + 1, |t| match t.checked_sub(1) {
                    None => self.shared.forward(x, m),
                    Some(u) => {
                        let (e, rows) = &union[u];
                        experts[*e as usize].forward(&gather(rows), rows.len())
                    }
                });
                let sh = ys_union.remove(0);
                shared = Some(sh?);
                for ((_, rows), y) in union.iter().zip(ys_union) {
                    scatter(rows, y?);
                }
            }
            Experts::Streamed {
                residency,
                layer: tier,
                expert_bytes,
                ..
            } => {
                // Experts in the VRAM tier run on the GPU and never touch the RAM cache.
                let in_vram = |e: u32| self.vram.as_ref().is_some_and(|v| v.holds(e));
                let (gpu_union, ram_union): (Vec<_>, Vec<_>) =
                    union.iter().partition(|(e, _)| in_vram(*e));
                // Which of the others are copied to the GPU this step (`offload.rs`).
                let copy_mask: Vec<bool> = match &self.copy {
                    Some(c) if !ram_union.is_empty() => {
                        let rows: Vec<usize> = ram_union.iter().map(|(_, r)| r.len()).collect();
                        let mut gpu_rows: Vec<usize> =
                            gpu_union.iter().map(|(_, r)| r.len()).collect();
                        let mut cpu_rows = Vec::new();
                        match self.shared.on_gpu() {
                            true => gpu_rows.push(m),
                            false => cpu_rows.push(m),
                        }
                        c.offload().decide(&Step {
                            m,
                            rows: &rows,
                            expert_bytes: *expert_bytes as u64,
                            gpu_rows: &gpu_rows,
                            cpu_rows: &cpu_rows,
                        })
                    }
                    _ => vec![false; ram_union.len()],
                };
                let copied = copy_mask.iter().filter(|&&c| c).count();
                self.count_runs(gpu_union.len(), copied, ram_union.len() - copied);
                #[cfg(feature = "cuda")]
                if let Some(gpu) = self.step_gpu() {
                    let mut decided = copy_mask.iter();
                    let on_gpu: Vec<bool> = union
                        .iter()
                        .map(|(e, _)| in_vram(*e) || decided.next() == Some(&true))
                        .collect();
                    dev = GpuCombine::new(gpu, hidden, &entry, k, &routes, &union, &on_gpu)?;
                }
                let dev = &dev;
                let run_gpu = || -> Result<Vec<Vec<f32>>> {
                    let jobs: Vec<(u32, Vec<u32>)> = gpu_union
                        .iter()
                        .map(|(e, rows)| (*e, row_ids(rows)))
                        .collect();
                    match (&self.vram, dev) {
                        (Some(v), Some(d)) => v.forward_into(&input, &jobs, d).map(|()| Vec::new()),
                        (Some(v), None) => v.forward(&input, &jobs),
                        (None, _) => Ok(Vec::new()),
                    }
                };
                let mut gpu_ys: Option<Result<Vec<Vec<f32>>>> = None;
                // A step of several rows (a prompt, a verify) tells the cache each row's
                // routes, so its look-ahead learns them token by token.
                if m > 1 {
                    let rows: Vec<Vec<u32>> = routes
                        .iter()
                        .map(|r| r.ids.iter().copied().filter(|&e| !in_vram(e)).collect())
                        .collect();
                    residency.observe_rows(*tier, &rows);
                }
                // Prefetches of this layer's experts it did not choose stop here if unstarted.
                let chosen: Vec<u32> = ram_union.iter().map(|(e, _)| *e).collect();
                residency.routed(*tier, &chosen);
                // Waves of at most the working bank. CPU side: resident experts and the shared
                // expert while misses load, then each miss as it arrives. GPU side, at the same
                // time: the VRAM experts (first wave), then the wave's copied experts, each as
                // its lease is granted.
                let wave_len = residency.max_wave();
                for (w, (wave, mask)) in ram_union
                    .chunks(wave_len)
                    .zip(copy_mask.chunks(wave_len))
                    .enumerate()
                {
                    let ids: Vec<u32> = wave.iter().map(|(e, _)| *e).collect();
                    let with_gpu = gpu_ys.is_none() && !gpu_union.is_empty();
                    let wave_started = Instant::now();
                    let result = (|| -> Result<()> {
                        let pending = residency.acquire(*tier, &ids)?;
                        let acquired = wave_started.elapsed();
                        if let Some(f) = after_reads.take() {
                            f()?;
                        }
                        let mut to_copy = Vec::new();
                        let mut on_cpu = Vec::new();
                        for ((p, item), &c) in pending.into_iter().zip(wave).zip(mask) {
                            match c {
                                true => to_copy.push((p, item)),
                                false => on_cpu.push((p, item)),
                            }
                        }
                        let copy_rows: Vec<&Vec<(usize, usize)>> =
                            to_copy.iter().map(|(_, (_, rows))| rows).collect();
                        // Each with its first pair when the combine is on the GPU.
                        let copy_jobs = to_copy
                            .into_iter()
                            .map(|(p, (e, rows))| {
                                let first = dev.as_ref().map(|d| d.first_of(*e)).transpose()?;
                                Ok((p, row_ids(rows), first.unwrap_or(0)))
                            })
                            .collect::<Result<Vec<_>>>()?;
                        let (ready, waiting): (Vec<_>, Vec<_>) =
                            on_cpu.into_iter().partition(|(p, _)| p.is_ready());
                        // The CPU side's work: its experts, and the shared expert (m rows) in
                        // the first wave when it is not on the GPU.
                        let shared_on_cpu = shared.is_none() && !self.shared.on_gpu();
                        let cpu_experts = ready.len() + waiting.len() + usize::from(shared_on_cpu);
                        let cpu_rows = (ready
                            .iter()
                            .chain(&waiting)
                            .map(|(_, (_, r))| r.len())
                            .sum::<usize>()
                            + if shared_on_cpu { m } else { 0 })
                        .div_ceil(cpu_experts.max(1));
                        let (cpu, gpu_side) = rayon::join(
                            || {
                                let started = Instant::now();
                                // Resident experts and the shared expert in parallel while
                                // misses load.
                                let (ys_ready, sh) = rayon::join(
                                    || {
                                        ready
                                            .into_par_iter()
                                            .map(|(p, (_, rows))| {
                                                let y = (|| -> Result<Vec<f32>> {
                                                    let lease = p.wait()?;
                                                    swiglu_mats(
                                                        &lease.mats()?,
                                                        &gather(rows),
                                                        rows.len(),
                                                    )
                                                })(
                                                );
                                                (rows, y)
                                            })
                                            .collect::<Vec<_>>()
                                    },
                                    // The shared expert once per layer, in the first wave;
                                    // with the rows summed on the GPU and its matrices
                                    // there, it runs there instead (`GpuCombine::finish`).
                                    || match shared {
                                        None if !(dev.is_some() && self.shared.on_gpu()) => {
                                            self.shared.forward(x, m).map(Some)
                                        }
                                        _ => Ok(None),
                                    },
                                );
                                let mut waited = 0.0;
                                let mut ys_waiting = Vec::with_capacity(waiting.len());
                                for (p, (_, rows)) in waiting {
                                    let t = Instant::now();
                                    let lease = p.wait();
                                    waited += t.elapsed().as_secs_f64();
                                    let y = (|| -> Result<Vec<f32>> {
                                        let l = lease?;
                                        swiglu_mats(&l.mats()?, &gather(rows), rows.len())
                                    })();
                                    ys_waiting.push((rows, y));
                                }
                                if let Some(c) = &self.copy {
                                    let busy = started.elapsed().as_secs_f64() - waited;
                                    c.offload().cpu_sample(cpu_rows, cpu_experts, busy);
                                }
                                (ys_ready, sh, ys_waiting, started.elapsed())
                            },
                            || {
                                let started = Instant::now();
                                let g = with_gpu.then(run_gpu);
                                let vram = started.elapsed();
                                let copied = match &self.copy {
                                    Some(c) if !copy_jobs.is_empty() => {
                                        c.run(copy_jobs, &input, dev.as_ref())
                                    }
                                    _ => Ok(Vec::new()),
                                };
                                (g, copied, vram, started.elapsed() - vram)
                            },
                        );
                        let (g, copied, vram_time, copy_time) = gpu_side;
                        let (ys_ready, sh, ys_waiting, cpu_time) = cpu;
                        // One line per wave (`NECTAR_LOG=nectar::moe=debug`): where a streamed
                        // layer's time goes, the two sides of the wave apart.
                        tracing::debug!(
                            target: "nectar::moe",
                            layer,
                            rows = m,
                            wave = w,
                            experts = ids.len(),
                            copied = copy_rows.len(),
                            vram_experts = if with_gpu { gpu_union.len() } else { 0 },
                            acquire_us = acquired.as_micros() as u64,
                            cpu_us = cpu_time.as_micros() as u64,
                            vram_us = vram_time.as_micros() as u64,
                            copy_us = copy_time.as_micros() as u64,
                            wave_us = wave_started.elapsed().as_micros() as u64,
                        );
                        if g.is_some() {
                            gpu_ys = g;
                        }
                        if let Some(s) = sh? {
                            shared = Some(s);
                        }
                        for (rows, y) in ys_ready.into_iter().chain(ys_waiting) {
                            scatter(rows, y?);
                        }
                        for (rows, y) in copy_rows.into_iter().zip(copied?) {
                            scatter(rows, y);
                        }
                        Ok(())
                    })();
                    // Every lease of the wave is dropped by now: this is the safe point, also
                    // after a failed read (its slot is discarded, the next request retries).
                    let settled = residency.end_wave_layer(*tier);
                    result?;
                    settled?;
                }
                let gpu_ys = match gpu_ys {
                    Some(r) => r?,
                    None => run_gpu()?,
                };
                for ((_, rows), y) in gpu_union.iter().zip(gpu_ys) {
                    scatter(rows, y);
                }
            }
        }
        if let Some(f) = after_reads.take() {
            f()?;
        }
        if let Some(d) = dev {
            #[cfg(feature = "cuda")]
            {
                // The shared expert runs on the GPU beside the others when it is there.
                let on_gpu = shared.is_none().then(|| self.shared.gpu_mats()).flatten();
                if shared.is_none() && on_gpu.is_none() {
                    shared = Some(self.shared.forward(x, m)?);
                }
                let out = d.finish(&union, &ys, on_gpu, shared.as_deref(), &input)?;
                lap.mark(Phase::Mlp);
                return Ok(out);
            }
            #[cfg(not(feature = "cuda"))]
            match d {}
        }
        let shared = match shared {
            Some(s) => s,
            None => self.shared.forward(x, m)?,
        };
        for (u, (e, rows)) in union.iter().enumerate() {
            if ys[u].len() != rows.len() * hidden {
                return Err(Error::Input(format!(
                    "layer {layer}: expert {e} gave {} values for {} rows",
                    ys[u].len(),
                    rows.len()
                )));
            }
        }
        lap.mark(Phase::Mlp);
        // Row by row (on the compute team for a prompt): each row's experts in its selection
        // order, then the shared expert — the row's bits whatever the other rows.
        let mut out = vec![0.0f32; m * hidden];
        team::for_each_row_mut(&mut out, hidden.max(1), |i, o| {
            // Written before it is read: a fresh allocation's page is then faulted in once (a
            // first read maps the shared zero page and the first write faults again; measured
            // 3× the whole combine's time on a 2,048-row prompt, more on the GPU host).
            o.fill(0.0);
            for (slot, &w) in routes[i].weights.iter().enumerate() {
                let (u, j) = at[i * k + slot];
                for (a, &y) in o.iter_mut().zip(&ys[u][j * hidden..][..hidden]) {
                    *a += w * y;
                }
            }
            for (a, &s) in o.iter_mut().zip(&shared[i * hidden..(i + 1) * hidden]) {
                *a += s;
            }
        });
        Ok(out)
    }
}

/// The MLP of a decoder layer.
#[derive(Debug)]
// One per layer, built once and never moved on a hot path: the size difference between the
// variants (which crosses clippy's threshold once `Linear` carries a GPU copy, `--features cuda`)
// costs nothing, and boxing would add an indirection.
#[allow(clippy::large_enum_variant)]
pub enum Mlp {
    /// Dense SwiGLU (layers before `first_k_dense_replace`).
    Dense(SwiGlu),
    /// Routed experts + shared expert.
    Moe(Moe),
}

impl Mlp {
    /// The MoE block, when this is one.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) fn moe_mut(&mut self) -> Option<&mut Moe> {
        match self {
            Mlp::Moe(m) => Some(m),
            Mlp::Dense(_) => None,
        }
    }

    /// Whether routed expert `e` is in the layer's VRAM tier (streamed layers).
    pub(super) fn in_vram(&self, e: u32) -> bool {
        self.moe()
            .and_then(|m| m.vram.as_ref())
            .is_some_and(|v| v.holds(e))
    }

    /// The MoE block, when this is one.
    pub(super) fn moe(&self) -> Option<&Moe> {
        match self {
            Mlp::Moe(m) => Some(m),
            Mlp::Dense(_) => None,
        }
    }

    /// The matrices every token reads: the dense MLP, or the router and the shared expert.
    pub(super) fn spine_linears_mut(&mut self) -> Vec<&mut Linear> {
        match self {
            Mlp::Dense(d) => d.linears_mut(),
            Mlp::Moe(m) => {
                let mut v = vec![&mut m.router];
                v.extend(m.shared.linears_mut());
                v
            }
        }
    }

    /// Runs the MLP for `m` rows; `after_reads` runs once the layer's expert reads are queued
    /// (see [`super::layer::DecoderLayer::feed_forward`]).
    pub fn forward(
        &self,
        layer: usize,
        x: &[f32],
        m: usize,
        obs: &mut dyn Observer,
        mut after_reads: Option<&mut dyn FnMut() -> Result<()>>,
        lap: &mut Lap<'_>,
    ) -> Result<Vec<f32>> {
        match self {
            Mlp::Dense(d) => {
                lap.mark(Phase::MlpRoute);
                if let Some(f) = after_reads.take() {
                    f()?;
                }
                let y = d.forward(x, m);
                lap.mark(Phase::Mlp);
                y
            }
            Mlp::Moe(moe) => moe.forward(layer, x, m, obs, after_reads, lap),
        }
    }

    /// The expert cache and tier of a MoE layer whose experts are streamed.
    pub fn streamed(&self) -> Option<(&Arc<Residency>, usize)> {
        match self {
            Mlp::Moe(Moe {
                experts:
                    Experts::Streamed {
                        residency, layer, ..
                    },
                ..
            }) => Some((residency, *layer)),
            _ => None,
        }
    }
}
