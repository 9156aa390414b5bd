//! GLM-5 / GLM-5.1 / GLM-5.2 (`model_type: glm_moe_dsa`).
//!
//! ```text
//! x = E[tokens]                                   (rows × hidden)
//! for layer in layers: x = layer(x)               MLA + DSA, dense MLP or MoE, own caches
//! h = RMSNorm(x; model.norm)                      returned by `forward`
//! logits = lm_head · h                            `logits`, only for the rows asked for
//! ```
mod attention;
mod config;
mod contract;
mod copied;
mod decode_cost;
mod gpu_combine;
mod indexer;
mod inventory;
mod layer;
mod layout;
mod moe;
mod mtp;
mod offload;
mod phases;
mod pilot;
mod placement;
mod prefill;
mod prefill_cost;
mod streaming;
mod vram;

pub use attention::MlaMode;
#[cfg(feature = "cuda")]
pub use attention::{gpu_decode_min_keys, set_gpu_decode_min_keys};
pub use config::{eos_list, Config, RawConfig};
pub use contract::logical_shape;
pub use decode_cost::{
    measure as measure_decode_context, ContextCost, BASE_KEYS as CONTEXT_BASE_KEYS,
};
pub use indexer::top_k_positions;
pub use inventory::{classify, expert_of, ClassStats, Inventory, TensorClass};
pub use layout::{Layout, RowInfo};
pub use moe::{ExpertRuns, Experts, Route};
pub use offload::{decide as decide_copies, CopyStats, Costs, Step as CopyStep};
pub use phases::{HalfSeconds, PhaseSeconds};
pub use pilot::{PilotStats, Prefetch};
pub use placement::{
    auto_budget, catalog_candidates, keeps_host_copy, plan as plan_gpu, plan_with as plan_gpu_with,
    resolve_budget as resolve_gpu_budget, staging_slot_bytes, staging_slots, Candidates, ClassLine,
    GpuMemory, GpuPlacement, GpuPlan,
};
pub use prefill::Prefill;
pub use prefill_cost::{measure_gflops as measure_attention_gflops, AttnShape};
pub use streaming::{
    expert_layouts, kv_bytes_per_token, lent_inputs, plan_memory, planned_prefill_tokens,
    prefetch_slots, prompt_transients, serve_sequences, working_bank, LoadOptions, MemoryPlan,
    PinRequest, DEFAULT_ADMISSION,
};

use crate::blocks::{Embedding, Linear, Loader};
use crate::cache::{CacheDims, LayerCache, SeqCache};
use crate::error::{Error, Result};
use crate::observer::Observer;
use layer::{rms_norm_rows, DecoderLayer};
use moe::Mlp;
use mtp::Mtp;
use nectar_format::Catalog;
use nectar_kernels::{rms_norm, team, RopeTable};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// One sequence's part of a main forward: its cache and the tokens to append.
#[derive(Debug)]
pub struct SeqStep<'a> {
    /// The sequence's caches (positions continue from `cache.len()`).
    pub cache: &'a mut SeqCache,
    /// Tokens to run.
    pub tokens: &'a [u32],
}

/// One sequence's part of an MTP forward: for each row i, the main hidden `h_i` (post final
/// norm) and the token at `i + 1`. Positions continue from `cache.mtp.end()` (the drafter
/// may first [`LayerCache::skip_to`] a later one).
#[derive(Debug)]
pub struct MtpStep<'a> {
    /// The sequence's caches (the MTP layer uses `cache.mtp`).
    pub cache: &'a mut SeqCache,
    /// `n × hidden` main hiddens.
    pub hidden: &'a [f32],
    /// `n` next tokens.
    pub next_tokens: &'a [u32],
}

/// A loaded GLM-5 model.
#[derive(Debug)]
pub struct Glm5 {
    /// Resolved configuration.
    pub cfg: Config,
    embed: Embedding,
    layers: Vec<DecoderLayer>,
    norm: Vec<f32>,
    lm_head: Linear,
    mtp: Option<Mtp>,
    rope: RopeTable,
    /// MLA form selection (tests force each form).
    pub mla_mode: MlaMode,
    /// Next-layer expert prediction (see [`Prefetch`]); from [`LoadOptions::prefetch`].
    pub prefetch: Prefetch,
    pilot: Arc<Mutex<PilotStats>>,
    /// The main layers' halves of decode forwards against the disk (under a budget).
    disk_overlap: phases::DiskOverlap,
    catalog: Arc<Catalog>,
    streaming: Option<streaming::Streaming>,
    gpu: Option<GpuPlacement>,
    /// The copy route of streamed experts to the GPU (`copied.rs`), when a staging area was
    /// placed.
    copy_tier: Option<Arc<copied::CopyTier>>,
}

impl Glm5 {
    /// Loads a Hugging Face `glm_moe_dsa` directory: validates the config, every header, and
    /// the shape and dtype of every tensor before returning.
    pub fn load(dir: &Path) -> Result<Glm5> {
        Self::load_with(dir, &LoadOptions::default())
    }

    /// Loads with options: with a memory budget, routed experts are streamed through the
    /// residency manager's slots (the rest of the model stays resident) and no expert weight is
    /// read at load time.
    pub fn load_with(dir: &Path, opts: &LoadOptions) -> Result<Glm5> {
        let cfg = Config::from_dir(dir)?;
        let catalog = Arc::new(Catalog::open(dir)?);
        let r = &cfg.raw;
        let (h, v) = (r.hidden_size, r.vocab_size);
        // The GPU first: its plan (from the headers) decides which spine matrices live in VRAM
        // (costing no RAM) and which experts (then neither pinned nor cached in RAM).
        let (gpu, gpu_plan, gpu_refusal) = match opts.gpu_memory.map(placement::open) {
            None => (None, None, None),
            Some(Err(why)) => (None, None, Some(GpuPlacement::cpu(&why))),
            Some(Ok(g)) => {
                let p = placement::plan_for(&cfg, &catalog, g.budget(), opts);
                (Some(g), Some(p), None)
            }
        };
        let streaming = match opts.memory_budget {
            Some(b) => Some(streaming::setup(
                &cfg,
                &catalog,
                b,
                opts,
                gpu_plan.as_ref(),
            )?),
            None => None,
        };
        // Under a budget the spine is resident by plan: copy it into process memory, so that
        // only the streamed experts ever read the files again (and their reads are checked) —
        // and the embedding tables, of which a forward needs one row per token, are read a
        // row at a time (`blocks/embedding.rs`; the plan leaves them out).
        let ld = if opts.memory_budget.is_some() {
            Loader::owned(&catalog).embeddings_from_file(&catalog)
        } else {
            Loader::new(&catalog)
        };
        let rule = |name: &str| gpu_plan.as_ref().and_then(|p| p.placement_of(name));
        let ld = match &gpu {
            Some(g) => placement::placing(ld, g, &rule),
            None => ld,
        };
        let streamed = |l: usize| streaming.as_ref().and_then(|s| s.experts(l));
        let layers = (0..r.num_hidden_layers)
            .map(|i| {
                DecoderLayer::load(&ld, &cfg, i, cfg.dense[i], cfg.indexer_full[i], streamed(i))
            })
            .collect::<Result<Vec<_>>>()?;
        let lm_name = cfg.head_name();
        let mut model = Glm5 {
            embed: ld.embedding("model.embed_tokens.weight", v, h)?,
            norm: ld.vector("model.norm.weight", h)?,
            lm_head: ld.linear(lm_name, v, h)?,
            mtp: if streaming::loads_mtp(&cfg, &catalog, opts) {
                Mtp::load(&ld, &cfg, streamed(r.num_hidden_layers))?
            } else {
                None
            },
            rope: RopeTable::new(r.qk_rope_head_dim, cfg.rope_theta),
            layers,
            mla_mode: MlaMode::Auto,
            prefetch: opts.prefetch,
            pilot: Arc::new(Mutex::new(PilotStats::default())),
            disk_overlap: Default::default(),
            catalog: catalog.clone(),
            streaming,
            cfg,
            gpu: gpu_refusal,
            copy_tier: None,
        };
        if let (Some(g), Some(p)) = (gpu, gpu_plan) {
            model.gpu = Some(placement::apply(&mut model, g, &p)?);
            // The host copies released while loading are free heap: give them back now.
            nectar_residency::rss::trim_heap();
        }
        Ok(model)
    }

    /// Routed experts computed since load, summed over the MoE layers (the MTP layer
    /// included), by where they ran. Each chosen expert counts once per forward.
    pub fn expert_runs(&self) -> ExpertRuns {
        let main = self.layers.iter().map(|x| &x.mlp);
        let mtp = self.mtp.iter().map(|m| &m.layer.mlp);
        main.chain(mtp)
            .filter_map(|mlp| mlp.moe())
            .map(|m| m.runs())
            .fold(ExpertRuns::default(), |a, b| a + b)
    }

    /// Query rows whose attention ran on the GPU since load, summed over the layers (the MTP
    /// layer included): prefill chunks of layers whose `kv_b` is in VRAM.
    pub fn gpu_attention_rows(&self) -> u64 {
        let main = self.layers.iter().map(|l| &l.attn);
        main.chain(self.mtp.iter().map(|m| &m.layer.attn))
            .map(|a| a.gpu_rows())
            .sum()
    }

    /// Decode, MTP and verify rows whose attention (the absorbed form) ran on the GPU since
    /// load, summed over the layers (the MTP layer included).
    pub fn gpu_decode_attention_rows(&self) -> u64 {
        let main = self.layers.iter().map(|l| &l.attn);
        main.chain(self.mtp.iter().map(|m| &m.layer.attn))
            .map(|a| a.gpu_decode_rows())
            .sum()
    }

    /// Prompt rows whose DSA indexer scores ran on the GPU since load, summed over the full
    /// layers (the MTP layer included).
    pub fn gpu_indexer_rows(&self) -> u64 {
        let main = self.layers.iter().map(|l| &l.attn);
        main.chain(self.mtp.iter().map(|m| &m.layer.attn))
            .filter_map(|a| a.indexer.as_ref())
            .map(|i| i.gpu_rows())
            .sum()
    }

    /// Wall seconds per phase of the prefill chunks' layer forwards since load, summed over the
    /// layers (the MTP layer included).
    pub fn prefill_phases(&self) -> PhaseSeconds {
        self.phases(true)
    }

    /// The same for the other forwards: decode, MTP draft and verify steps.
    pub fn decode_phases(&self) -> PhaseSeconds {
        self.phases(false)
    }

    /// The main layers' attention and MLP halves of the decode, MTP and verify forwards, and
    /// the seconds the disk was busy beside each (zero without a memory budget).
    pub fn decode_disk_overlap(&self) -> HalfSeconds {
        self.disk_overlap.seconds()
    }

    fn phases(&self, prefill: bool) -> PhaseSeconds {
        let main = self.layers.iter().map(|l| &l.attn);
        main.chain(self.mtp.iter().map(|m| &m.layer.attn))
            .map(|a| a.phases.seconds(prefill))
            .fold(PhaseSeconds::default(), |a, b| a + b)
    }

    /// Totals of the experts copied from RAM to the GPU (`None` without a copy route).
    pub fn copy_stats(&self) -> Option<CopyStats> {
        self.copy_tier.as_ref().map(|c| c.stats())
    }

    /// Where `LoadOptions::gpu_memory` put the matrices (`None` when it was not asked for).
    pub fn gpu_placement(&self) -> Option<&GpuPlacement> {
        self.gpu.as_ref()
    }

    /// The expert cache, when experts are streamed.
    pub fn residency(&self) -> Option<&Arc<nectar_residency::Residency>> {
        self.streaming.as_ref().map(|s| &s.residency)
    }

    /// The MTP layer's expert tier, when experts are streamed and the model has an MTP layer.
    pub fn mtp_residency(&self) -> Option<&Arc<nectar_residency::Residency>> {
        self.streaming
            .as_ref()
            .and_then(|s| s.mtp_residency.as_ref())
    }

    /// The memory plan, when experts are streamed.
    pub fn memory_plan(&self) -> Option<&nectar_residency::planner::Plan> {
        self.streaming.as_ref().map(|s| &s.plan)
    }

    /// Tells the memory plan how many of its planned sequences are in use (a server: its
    /// decoding rows and the kept conversations' one) and whether a prompt is in flight: the
    /// idle sequences' KV cache and activations are lent to the expert cache — between prompts
    /// also the prompt transients and the working bank beyond `k` sequences' decode misses —
    /// and taken back before another sequence or prompt starts (see
    /// `planner::PlanInputs::lent_to`). Call between steps, before a new sequence's or
    /// prompt's first. Nothing to do without a budget. Returns the experts evicted to take
    /// memory back.
    pub fn use_sequences(&self, k: usize, prompt: bool) -> Result<usize> {
        match &self.streaming {
            Some(s) => s.use_sequences(k, prompt).map_err(crate::Error::Residency),
            None => Ok(0),
        }
    }

    /// (sequences in use, sequences planned, a prompt in flight) of the memory plan in force
    /// ([`Glm5::use_sequences`]), when experts are streamed.
    pub fn sequences_in_use(&self) -> Option<(usize, usize, bool)> {
        self.streaming.as_ref().map(|s| s.sequences())
    }

    /// Most prompt tokens to run layer-major at once (one span, see [`Prefill`]): under a
    /// memory budget, the tokens whose activations the memory plan reserves; without one,
    /// unbounded (the whole prompt, whose activations nothing else competes with).
    pub fn prefill_span(&self) -> usize {
        self.streaming
            .as_ref()
            .map_or(usize::MAX, |s| s.prefill_tokens.max(1))
    }

    /// The tensor catalog the model reads from.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// A fresh cache for one sequence.
    pub fn new_cache(&self) -> SeqCache {
        SeqCache::new(self.layers.len())
    }

    /// The per-token width of every cache this model fills (what a saved cache must match).
    pub fn cache_dims(&self) -> CacheDims {
        let index = |a: &attention::Attention| {
            a.indexer
                .as_ref()
                .map_or(0, |_| self.cfg.raw.index_head_dim)
        };
        CacheDims {
            latent: self.cfg.raw.kv_lora_rank,
            rope: self.cfg.raw.qk_rope_head_dim,
            index: self.layers.iter().map(|l| index(&l.attn)).collect(),
            mtp_index: self.mtp.as_ref().map(|m| index(&m.layer.attn)),
        }
    }

    /// True when the checkpoint has an MTP layer.
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.cfg.raw.vocab_size
    }

    /// Hidden size.
    pub fn hidden_size(&self) -> usize {
        self.cfg.raw.hidden_size
    }

    /// Runs every sequence's tokens through the main model, appending to its caches.
    /// Returns the post-final-norm hidden of every row (rows in batch order, `rows × hidden`).
    pub fn forward(&self, steps: &mut [SeqStep<'_>], obs: &mut dyn Observer) -> Result<Vec<f32>> {
        self.guarded(|| self.forward_unguarded(steps, obs))
    }

    /// Runs `f`, which reads mapped weights, between the catalog's fault checks: a shard that
    /// was truncated while mapped makes the result an error naming the file and offset (the
    /// values computed from the missing bytes are discarded), and a shard that faulted earlier
    /// is mapped again first once the file is back.
    fn guarded<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.catalog.ensure_intact()?;
        let r = f();
        self.catalog.take_fault()?;
        r
    }

    fn forward_unguarded(
        &self,
        steps: &mut [SeqStep<'_>],
        obs: &mut dyn Observer,
    ) -> Result<Vec<f32>> {
        let starts: Vec<usize> = steps.iter().map(|s| s.cache.len()).collect();
        let counts: Vec<usize> = steps.iter().map(|s| s.tokens.len()).collect();
        let layout = Layout::new(&starts, &counts);
        let tokens: Vec<u32> = steps
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        // The sequence of each row: the expert cache learns each one's tokens as its own stream.
        let seqs: Vec<u64> = steps
            .iter()
            .flat_map(|s| std::iter::repeat_n(s.cache.id(), s.tokens.len()))
            .collect();
        let mut x = self.embed_step(&tokens, &seqs)?;
        let mut sel: Vec<Option<Vec<u32>>> = vec![None; layout.rows.len()];
        let mut caches: Vec<&mut SeqCache> = steps.iter_mut().map(|s| &mut *s.cache).collect();
        self.run_layers(
            &mut x,
            &layout,
            &mut caches,
            &mut sel,
            0..self.layers.len(),
            obs,
        )?;
        Ok(self.final_norm(&x, &self.norm))
    }

    /// The residual stream of a step's rows (their embeddings), row `i` of sequence
    /// `seqs[i]` (rows of a sequence together, as a layout orders them); tells the expert cache
    /// the tokens and starts its look-ahead for the step.
    fn embed_step(&self, tokens: &[u32], seqs: &[u64]) -> Result<Vec<f32>> {
        let hd = self.hidden_size();
        let mut x = vec![0.0f32; tokens.len() * hd];
        self.embed.rows(tokens, &mut x)?;
        // The expert cache's predictive admission keys its look-ahead on each sequence's tokens.
        let m = tokens.len();
        if let Some(res) = self.residency() {
            for (&t, &s) in tokens.iter().zip(seqs) {
                res.observe_token(s, t);
            }
            // The look-ahead's controller keeps steps of one width per window (`begin_step`).
            let streams = 1 + seqs.windows(2).filter(|w| w[0] != w[1]).count();
            // Look-ahead prefetch (a no-op unless on): this step's predicted misses start
            // reading now, behind the layers' attention.
            res.begin_step(m, streams, m * self.cfg.raw.num_experts_per_tok);
        }
        Ok(x)
    }

    /// Runs main layers `range` over the residual stream `x` (rows as in `layout`), appending
    /// to each sequence's caches of those layers; `sel` carries the DSA selection from a full
    /// indexer layer to the layers that share it.
    fn run_layers(
        &self,
        x: &mut [f32],
        layout: &Layout,
        seqs: &mut [&mut SeqCache],
        sel: &mut [Option<Vec<u32>>],
        range: std::ops::Range<usize>,
        obs: &mut dyn Observer,
    ) -> Result<()> {
        let m = layout.rows.len();
        let mut stats = PilotStats::default();
        // The prediction for the layer about to run (made during the previous one).
        let mut predicted: Option<Vec<Vec<u32>>> = None;
        // The disk's busy time at the halves' boundaries (under a budget).
        let res = self.residency();
        // A layer's end is the next one's start: two readings per layer.
        let clock = || res.map(|r| r.disk_busy_now());
        let mut c0 = clock();
        for l in range {
            let layer = &self.layers[l];
            let mut caches: Vec<&mut LayerCache> =
                seqs.iter_mut().map(|s| &mut s.layers[l]).collect();
            layer.attend(x, layout, &mut caches, sel, &self.rope, self.mla_mode, obs)?;
            let c1 = clock();
            let next = self.layers.get(l + 1);
            let next_pred = match (self.prefetch, next) {
                (p, _) if !p.runs_router_early() => None,
                (_, None) => None,
                // `both` predicts only to read: without streamed experts (no budget) it costs
                // nothing, as look-ahead does (`pilot` and `measure` still score the router).
                (Prefetch::Both, Some(n)) if n.mlp.streamed().is_none() => None,
                (_, Some(n)) => {
                    let replayed: Option<Vec<Vec<u32>>> =
                        (0..m).map(|r| obs.replay_prediction(l + 1, r)).collect();
                    match (replayed, n.predict_replayed()) {
                        (Some(p), true) => Some(p),
                        _ => n.predict(x, m)?,
                    }
                }
            };
            if let Some(p) = &next_pred {
                for (row, ids) in p.iter().enumerate() {
                    obs.predicted(l + 1, row, ids);
                }
            }
            let target = match (self.prefetch, next, &next_pred) {
                (m, Some(n), Some(p)) if m.reads_predicted_layer() => {
                    n.mlp.streamed().map(|t| (t, p, &n.mlp))
                }
                _ => None,
            };
            let mut issue = || -> Result<()> {
                if let Some(((res, tier), p, mlp)) = &target {
                    // Experts in VRAM are never read into RAM.
                    let mut ids = pilot::union(p);
                    ids.retain(|&e| !mlp.in_vram(e));
                    stats.candidates += ids.len() as u64;
                    stats.issued += res.prefetch(*tier, &ids)? as u64;
                }
                Ok(())
            };
            let mut tap = RouteTap {
                inner: obs,
                layer: l,
                routes: vec![Vec::new(); if predicted.is_some() { m } else { 0 }],
            };
            layer.feed_forward(x, m, &mut tap, Some(&mut issue))?;
            let c2 = clock();
            if let (Some(a), Some(b), Some(c), false) = (c0, c1, c2, layer.attn.phases.is_prefill())
            {
                let secs = |p: std::time::Instant, q: std::time::Instant| (q - p).as_secs_f64();
                self.disk_overlap.add(
                    [secs(a.0, b.0), secs(b.0, c.0)],
                    [b.1 - a.1, c.1 - b.1],
                    predicted.is_some(),
                );
            }
            c0 = c2;
            if let Some(p) = predicted.take() {
                stats.score(&p, &tap.routes);
            }
            predicted = next_pred;
            obs.layer_output(l, x);
        }
        if self.prefetch.runs_router_early() {
            self.pilot
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .add(&stats);
        }
        Ok(())
    }

    /// Routed-expert selections since load, per MoE layer (the MTP layer is
    /// `num_hidden_layers`): `(layer, count per expert)`, the usage ledger's records.
    pub fn expert_usage(&self) -> Vec<(usize, Vec<u64>)> {
        let main = self.layers.iter().enumerate().map(|(l, x)| (l, &x.mlp));
        let mtp = self.mtp.iter().map(|m| (self.layers.len(), &m.layer.mlp));
        main.chain(mtp)
            .filter_map(|(l, mlp)| match mlp {
                Mlp::Moe(m) => Some((l, m.usage())),
                Mlp::Dense(_) => None,
            })
            .collect()
    }

    /// Next-layer prediction counts since load (all zero with [`Prefetch::Off`]).
    pub fn pilot_stats(&self) -> PilotStats {
        *self.pilot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`Glm5::pilot_stats`] readable from another thread (a server's `/stats` while the model
    /// thread decodes).
    pub fn pilot_stats_source(&self) -> impl Fn() -> PilotStats + Send + Sync + 'static {
        let pilot = self.pilot.clone();
        move || *pilot.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn final_norm(&self, x: &[f32], w: &[f32]) -> Vec<f32> {
        rms_norm_rows(x, w, self.cfg.raw.rms_norm_eps)
    }

    /// Logits (`rows × vocab`, f32) of post-final-norm hiddens.
    pub fn logits(&self, hidden: &[f32]) -> Result<Vec<f32>> {
        self.guarded(|| {
            let m = hidden.len() / self.hidden_size();
            self.lm_head.forward(hidden, m)
        })
    }

    /// Runs the MTP layer; returns its post-`shared_head.norm` hiddens (`rows × hidden`).
    pub fn mtp_forward(
        &self,
        steps: &mut [MtpStep<'_>],
        obs: &mut dyn Observer,
    ) -> Result<Vec<f32>> {
        self.guarded(|| self.mtp_forward_unguarded(steps, obs))
    }

    fn mtp_forward_unguarded(
        &self,
        steps: &mut [MtpStep<'_>],
        obs: &mut dyn Observer,
    ) -> Result<Vec<f32>> {
        let mtp = self
            .mtp
            .as_ref()
            .ok_or_else(|| Error::Input("this model has no MTP layer".into()))?;
        let hd = self.hidden_size();
        let starts: Vec<usize> = steps.iter().map(|s| s.cache.mtp.len()).collect();
        let positions: Vec<usize> = steps.iter().map(|s| s.cache.mtp.end()).collect();
        let counts: Vec<usize> = steps.iter().map(|s| s.next_tokens.len()).collect();
        let layout = Layout::at(&starts, &positions, &counts);
        let m = layout.rows.len();
        if let Some(s) = steps
            .iter()
            .find(|s| s.hidden.len() != s.next_tokens.len() * hd)
        {
            return Err(Error::Input(format!(
                "MTP step: {} hidden values for {} tokens (hidden size {hd})",
                s.hidden.len(),
                s.next_tokens.len()
            )));
        }
        // [enorm(embed(token)) ; hnorm(hidden)] per row, a prompt's rows on the compute team.
        let tokens: Vec<u32> = steps
            .iter()
            .flat_map(|s| s.next_tokens.iter().copied())
            .collect();
        let mut e = vec![0.0f32; m * hd];
        mtp.embed
            .as_ref()
            .unwrap_or(&self.embed)
            .rows(&tokens, &mut e)?;
        let eps = self.cfg.raw.rms_norm_eps;
        let mut cat = vec![0.0f32; m * 2 * hd];
        if hd > 0 {
            let hidden: Vec<&[f32]> = steps
                .iter()
                .flat_map(|s| s.hidden.chunks_exact(hd))
                .collect();
            team::for_each_row_mut(&mut cat, 2 * hd, |i, c| {
                let (ce, ch) = c.split_at_mut(hd);
                rms_norm(&e[i * hd..][..hd], &mtp.enorm, eps, ce);
                rms_norm(hidden[i], &mtp.hnorm, eps, ch);
            });
        }
        let mut x = mtp.eh_proj.forward(&cat, m)?;
        if let Some(res) = self.mtp_residency() {
            for s in steps.iter() {
                for &t in s.next_tokens {
                    res.observe_token(s.cache.id(), t);
                }
            }
        }
        let mut sel: Vec<Option<Vec<u32>>> = vec![None; m];
        let mut caches: Vec<&mut LayerCache> = steps.iter_mut().map(|s| &mut s.cache.mtp).collect();
        mtp.layer.forward(
            &mut x,
            &layout,
            &mut caches,
            &mut sel,
            &self.rope,
            self.mla_mode,
            obs,
        )?;
        Ok(self.final_norm(&x, &mtp.head_norm))
    }

    /// Draft logits (`rows × vocab`) from MTP hiddens.
    pub fn mtp_logits(&self, hm: &[f32]) -> Result<Vec<f32>> {
        let mtp = self
            .mtp
            .as_ref()
            .ok_or_else(|| Error::Input("this model has no MTP layer".into()))?;
        let head = mtp.head.as_ref().unwrap_or(&self.lm_head);
        self.guarded(|| {
            let m = hm.len() / self.hidden_size();
            head.forward(hm, m)
        })
    }

    /// Bytes of the spine matrices held in host memory: all of them on the CPU, less the host
    /// copies released for VRAM (`--gpu-memory`; `placement.rs`).
    pub fn spine_host_bytes(&mut self) -> u64 {
        self.spine_linears_mut()
            .iter()
            .map(|l| l.host_bytes() as u64)
            .sum()
    }

    /// Weight bytes by class: (spine, routed experts, MTP, indexers).
    pub fn bytes_by_class(&self) -> ClassBytes {
        let mut c = ClassBytes::default();
        c.spine += self.embed.bytes() + self.lm_head.bytes() + self.norm.len() * 4;
        for l in &self.layers {
            let ix = l.attn.indexer.as_ref().map_or(0, |i| i.bytes());
            c.indexer += ix;
            c.spine += l.attn.bytes() - ix;
            match &l.mlp {
                Mlp::Dense(d) => c.spine += d.bytes(),
                Mlp::Moe(m) => {
                    let (routed, rest) = m.bytes();
                    c.routed += routed;
                    c.spine += rest;
                    c.per_expert = m.expert_bytes();
                }
            }
        }
        if let Some(mtp) = &self.mtp {
            c.mtp += mtp.eh_proj.bytes() + mtp.layer.attn.bytes();
            if let Mlp::Moe(m) = &mtp.layer.mlp {
                let (routed, rest) = m.bytes();
                c.mtp += routed + rest;
            }
        }
        c
    }
}

/// Weight bytes by class (what `nectar inspect` reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassBytes {
    /// Resident spine: embeddings, attention, norms, dense MLPs, routers, shared experts, head.
    pub spine: usize,
    /// Routed experts of the main layers.
    pub routed: usize,
    /// The MTP layer (all of it).
    pub mtp: usize,
    /// DSA indexers of the main layers.
    pub indexer: usize,
    /// Bytes of one main routed expert.
    pub per_expert: usize,
}

/// Passes everything on, and keeps the routes of one layer (to score a prediction).
struct RouteTap<'a> {
    inner: &'a mut dyn Observer,
    layer: usize,
    /// One entry per row when recording, else empty.
    routes: Vec<Vec<u32>>,
}

impl Observer for RouteTap<'_> {
    fn layer_output(&mut self, layer: usize, x: &[f32]) {
        self.inner.layer_output(layer, x);
    }
    fn router(&mut self, layer: usize, row: usize, ids: &[u32], weights: &[f32]) {
        if layer == self.layer {
            if let Some(r) = self.routes.get_mut(row) {
                *r = ids.to_vec();
            }
        }
        self.inner.router(layer, row, ids, weights);
    }
    fn indexer(&mut self, layer: usize, row: usize, full: bool, selected: Option<&[u32]>) {
        self.inner.indexer(layer, row, full, selected);
    }
    fn predicted(&mut self, layer: usize, row: usize, ids: &[u32]) {
        self.inner.predicted(layer, row, ids);
    }
    fn replay_route(&mut self, layer: usize, row: usize) -> Option<Vec<u32>> {
        self.inner.replay_route(layer, row)
    }
    fn replay_prediction(&mut self, layer: usize, row: usize) -> Option<Vec<u32>> {
        self.inner.replay_prediction(layer, row)
    }
}
