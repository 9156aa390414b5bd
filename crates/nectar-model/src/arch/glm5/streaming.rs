//! Setting up streamed experts: the memory plan for a budget and the expert caches that serve
//! the MoE layers — one for the main layers, and the MTP layer's own tier with its own slot size
//! (converted MTP experts are int8, about twice the int4 main ones).
use super::moe::Experts;
use super::{inventory, Config, GpuPlan};
use crate::error::{Error, Result};
use nectar_format::experts::layer_extents;
use nectar_format::Catalog;
use nectar_residency::io::FileIo;
use nectar_residency::layout::{plan as slot_plan, SlotLayout};
use nectar_residency::planner::{plan, Plan, PlanInputs, ReserveInputs};
use nectar_residency::{ExpertKey, Residency, ResidencyConfig};
use std::sync::Arc;

/// How a model is loaded.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Stream routed experts under this memory budget (bytes); `None` keeps every expert
    /// resident (memory-mapped).
    pub memory_budget: Option<u64>,
    /// Context length the plan reserves KV for.
    pub ctx_size: usize,
    /// Sequences decoded together (a server's `--parallel`): the plan reserves KV for
    /// `ctx_size` tokens and a prompt chunk's transients for each.
    pub sequences: usize,
    /// I/O worker threads.
    pub io_threads: usize,
    /// Working slots at most (misses per wave): the bank is sized from the batch, `2 × top-k ×
    /// sequences` (at least 16), up to this cap.
    pub working_slots: usize,
    /// Use direct I/O where the filesystem allows it.
    pub direct_io: bool,
    /// Process reserve in the memory equation; `None` (the default) is the measured model of
    /// [`nectar_residency::planner::runtime_reserve`] for this model and process.
    pub runtime_reserve: Option<u64>,
    /// The process is `nectar serve` (its runtime and buffers are in the reserve).
    pub server: bool,
    /// Next-layer expert prediction; `Pilot` with a budget adds `2 × top-k` prefetch slots to
    /// the working bank (counted in the memory plan).
    pub prefetch: super::Prefetch,
    /// Pin the hottest main-layer experts of a usage ledger at startup (with a budget).
    pub pin: Option<PinRequest>,
    /// How a full layer admits misses (default: [`DEFAULT_ADMISSION`]).
    pub admission: nectar_residency::Admission,
    /// VRAM for matrices on the GPU (`--gpu-memory`; `placement.rs` says which); `None` runs
    /// everything on the CPU. Without a usable GPU, or without the `cuda` feature, the model
    /// stays on the CPU and [`super::Glm5::gpu_placement`] says why.
    pub gpu_memory: Option<super::GpuMemory>,
    /// With `gpu_memory` and a memory budget: plan a staging area so that routed experts outside
    /// the VRAM tier may be copied to the GPU (default). Off: every one of them runs on the CPU
    /// (`nectar bench replay`'s `SIZE:nocopy` arm, the reference the copies are measured
    /// against).
    pub gpu_copies: bool,
    /// Load the MTP layer when the model has one (default). Off for `--mtp off`: the layer is
    /// then neither loaded nor planned, so under a budget its spine, working bank and slot row
    /// (about 1 GB at GLM-5.2's size, a 12th LRU slot per layer at 29 GiB) go to the main
    /// layers' cache instead.
    pub mtp: bool,
}

/// Sequences `nectar serve --parallel N` plans KV and prompt transients for: its N rows and one
/// finished conversation kept for a continuing request. `nectar fit --serve` plans the same.
pub fn serve_sequences(parallel: usize) -> usize {
    parallel.max(1) + 1
}

/// The default admission: predictive (decayed frequency + context-match look-ahead + learned
/// transitions), 0.88 of Belady at 12 slots on the route256 decode trace where decayed
/// frequency alone reaches 0.74 (`benchmarks/RESULTS.md`). Quality-neutral: it only decides
/// which experts stay cached.
pub const DEFAULT_ADMISSION: nectar_residency::Admission = nectar_residency::Admission::PREDICTIVE;

/// Which experts to pin: the most selected of `ledger`, in `bytes` of slots — or, when `bytes`
/// is `None`, Colibri's auto rule: with at least 5,000 recorded selections, half the LRU bytes
/// scaled by the ledger's confidence `min(1, selections / 200,000)` — except under predictive
/// admission, where the auto rule pins nothing (its cache uses the slots better).
#[derive(Debug, Clone)]
pub struct PinRequest {
    /// The usage ledger.
    pub ledger: nectar_residency::usage::Ledger,
    /// Bytes of pinned slots; `None` for the auto rule.
    pub bytes: Option<u64>,
}

/// Fewest recorded selections before the auto rule pins anything.
const AUTOPIN_MIN_HISTORY: u64 = 5_000;
/// Selections at which the auto rule's confidence reaches 1.
const AUTOPIN_FULL_HISTORY: f64 = 200_000.0;

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            memory_budget: None,
            ctx_size: 4096,
            sequences: 1,
            io_threads: 3,
            working_slots: 64,
            direct_io: true,
            runtime_reserve: None,
            server: false,
            prefetch: super::Prefetch::Off,
            pin: None,
            admission: DEFAULT_ADMISSION,
            gpu_memory: None,
            gpu_copies: true,
            mtp: true,
        }
    }
}

/// Prompt tokens per sequence the plan reserves transient buffers for.
const PREFILL_CHUNK: u64 = 512;

/// Prompt tokens whose activations the plan's "prefill transients" term holds: a chunk per
/// sequence decoded together (no more than the context). The engine's batch runs one prompt
/// span's layer at a time, so one span may use all of it ([`super::Glm5::prefill_span`]).
pub fn planned_prefill_tokens(opts: &LoadOptions) -> u64 {
    PREFILL_CHUNK.min(opts.ctx_size.max(1) as u64) * opts.sequences.max(1) as u64
}

/// The plan and the caches for a budget.
#[derive(Debug)]
pub(super) struct Streaming {
    pub plan: Plan,
    /// Prompt tokens whose activations the plan holds ([`planned_prefill_tokens`]).
    pub prefill_tokens: usize,
    /// The main layers' cache.
    pub residency: Arc<Residency>,
    /// The MTP layer's tier (when the model has a streamed MTP layer).
    pub mtp_residency: Option<Arc<Residency>>,
    /// The caches' plan with `k` sequences in use, at `lent[k − 1][prompt]` (`prompt`: a
    /// prompt is in flight; see [`lent_inputs`]): `lent[sequences − 1][1]` is the full plan.
    lent: Vec<[Lent; 2]>,
    /// The plan in force ([`Streaming::use_sequences`]): `2k + prompt`.
    in_use: std::sync::atomic::AtomicUsize,
    expert_bytes: Vec<usize>,
    counts: Vec<usize>,
    mtp_layer: usize,
}

impl Streaming {
    /// Plans the caches for `k` sequences in use (clamped to those planned), `prompt`: with a
    /// prompt in flight. An idle sequence's KV cache and activations are lent to every layer's
    /// LRU, and between prompts also the prompt transients and the working bank beyond what `k`
    /// sequences' decode misses need; taken back — the coldest experts evicted, their pages
    /// returned to the OS — when a sequence or a prompt starts (see [`lent_inputs`]). Call
    /// between steps (no expert lease alive), before a new sequence's or prompt's first step.
    /// Returns the experts evicted.
    pub fn use_sequences(&self, k: usize, prompt: bool) -> nectar_residency::Result<usize> {
        let k = k.clamp(1, self.lent.len());
        // Applied every time (idempotent, a few µs): what a previous call could not take back
        // (a bank slot still holding a read) is taken now.
        let key = 2 * k + usize::from(prompt);
        self.in_use.store(key, std::sync::atomic::Ordering::Relaxed);
        let l = &self.lent[k - 1][usize::from(prompt)];
        let mut evicted = self.residency.set_plan(&l.caps, l.working)?;
        if let Some(m) = &self.mtp_residency {
            evicted += m.set_plan(&l.caps, m.max_wave())?;
        }
        Ok(evicted)
    }

    /// (sequences in use, sequences planned, a prompt in flight) of the plan in force.
    pub fn sequences(&self) -> (usize, usize, bool) {
        let key = self.in_use.load(std::sync::atomic::Ordering::Relaxed);
        (key / 2, self.lent.len(), key % 2 == 1)
    }

    /// The streamed-expert source of MoE layer `layer` (MTP: `num_hidden_layers`).
    pub fn experts(&self, layer: usize) -> Option<Experts> {
        let residency = if layer == self.mtp_layer {
            self.mtp_residency.clone()?
        } else {
            self.residency.clone()
        };
        (self.counts.get(layer).copied().unwrap_or(0) > 0).then(|| Experts::Streamed {
            residency,
            layer,
            expert_bytes: self.expert_bytes[layer],
            count: self.counts[layer],
        })
    }
}

/// Largest slot of the main layers and of the MTP layer (0 where there is none).
fn slot_sizes(layouts: &[Vec<SlotLayout>], n: usize) -> (u64, u64) {
    let max = |ls: &[Vec<SlotLayout>]| ls.iter().flatten().map(|l| l.bytes).max().unwrap_or(0);
    (
        max(&layouts[..n.min(layouts.len())]) as u64,
        max(layouts.get(n..).unwrap_or(&[])) as u64,
    )
}

/// KV-cache bytes per token: each attention layer's f32 MLA latent and rope key (`latent_rope`
/// floats), and the indexer keys of the `full` layers whose DSA indexer keeps them.
pub fn kv_bytes_per_token(layers: usize, full: usize, latent_rope: usize, index_dim: usize) -> u64 {
    ((layers * latent_rope + full * index_dim) * 4) as u64
}

/// The activations of `tokens` prompt tokens in flight (see [`planned_prefill_tokens`]).
/// Logits are computed for the last row of each sequence only: they are in the reserve's
/// per-sequence activations, not here.
pub fn prompt_transients(tokens: u64, hidden: usize, top_k: usize) -> u64 {
    tokens * hidden as u64 * 4 * (8 + top_k as u64)
}

/// Whether the model has an MTP layer and `opts` loads it.
pub(super) fn loads_mtp(cfg: &Config, cat: &Catalog, opts: &LoadOptions) -> bool {
    opts.mtp && inventory::has_mtp_layer(cfg, cat)
}

/// The inputs of the memory equation for this model (no weight bytes are read). With a GPU
/// plan the spine terms count only what stays in RAM: a matrix whose host copy is released for
/// VRAM (and its scales) costs none — the embedding tables, gathered on the CPU, always do.
#[allow(clippy::too_many_arguments)]
pub(super) fn plan_inputs(
    cfg: &Config,
    cat: &Catalog,
    budget: u64,
    opts: &LoadOptions,
    (slot_bytes, mtp_slot_bytes): (u64, u64),
    mtp: bool,
    gpu: Option<&GpuPlan>,
) -> PlanInputs {
    let r = &cfg.raw;
    let n = r.num_hidden_layers;
    let in_vram_only = |name: &str| {
        let matrix = name.strip_suffix(".qs").unwrap_or(name);
        !matrix.ends_with("embed_tokens.weight")
            && gpu.is_some_and(|g| g.placement_of(matrix).is_some_and(|c| c.release_host))
    };
    // The embedding tables are read a row per token under a budget (`blocks/embedding.rs`):
    // only their scales are held — unless the table is also the output head (tied), which is.
    let mut spine: std::collections::BTreeMap<&str, u64> = Default::default();
    for e in cat.tensors() {
        if in_vram_only(&e.name) || cfg.is_embedding_only(&e.name) {
            continue;
        }
        let class = match inventory::classify(&e.name, cfg) {
            inventory::TensorClass::RoutedExpert => continue,
            inventory::TensorClass::Mtp if inventory::expert_of(&e.name).is_some() => continue,
            inventory::TensorClass::Spine => "attention, norms, dense, shared, routers, head",
            inventory::TensorClass::Indexer => "DSA indexers",
            inventory::TensorClass::Mtp if !mtp => continue,
            inventory::TensorClass::Mtp => "MTP layer (non-expert)",
            inventory::TensorClass::Other => "other",
        };
        *spine.entry(class).or_default() += e.len;
    }
    let full = cfg.indexer_full.iter().filter(|f| **f).count() + usize::from(mtp);
    let kv = kv_bytes_per_token(
        n + usize::from(mtp),
        full,
        r.kv_lora_rank + r.qk_rope_head_dim,
        r.index_head_dim,
    );
    let h = r.hidden_size as u64;
    let transients = prompt_transients(
        planned_prefill_tokens(opts),
        r.hidden_size,
        r.num_experts_per_tok,
    );
    // A reserve given whole (`LoadOptions::runtime_reserve`) lends nothing per sequence.
    let per_seq = match opts.runtime_reserve {
        Some(_) => 0,
        None => nectar_residency::planner::reserve_per_sequence(h, r.vocab_size as u64),
    };
    let reserve = opts.runtime_reserve.unwrap_or_else(|| {
        nectar_residency::planner::runtime_reserve(&ReserveInputs {
            tokenizer_json_bytes: std::fs::metadata(cat.dir().join("tokenizer.json"))
                .map_or(0, |m| m.len()),
            // The compute pool's default size (every core), the I/O workers, main and ledger.
            threads: std::thread::available_parallelism().map_or(1, |n| n.get())
                + opts.io_threads
                + 2,
            sequences: opts.sequences.max(1),
            hidden: h,
            vocab: r.vocab_size as u64,
            server: opts.server,
        })
    });
    PlanInputs {
        budget,
        spine: spine.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        slot_bytes,
        sparse_layers: cfg.dense.iter().filter(|d| !**d).count(),
        mtp_slot_bytes: if mtp { mtp_slot_bytes } else { 0 },
        experts_per_layer: r.n_routed_experts,
        working_slots: working_bank(cfg.raw.num_experts_per_tok, opts)
            + prefetch_slots(cfg.raw.num_experts_per_tok, opts),
        pinned_slots: 0,
        mtp_slots: if mtp { mtp_working(cfg) } else { 0 },
        kv_bytes_per_token: kv,
        ctx: opts.ctx_size * opts.sequences.max(1),
        sequences: opts.sequences.max(1),
        reserve_per_sequence: per_seq,
        prefill_transients: transients,
        runtime_reserve: reserve,
    }
}

/// The slot layouts of every MoE layer (`[layer][expert]`, empty for dense layers).
pub(super) fn layouts(cfg: &Config, cat: &Catalog, mtp: bool) -> Result<Vec<Vec<SlotLayout>>> {
    let r = &cfg.raw;
    let n = r.num_hidden_layers;
    let mut out = vec![Vec::new(); n + 1];
    for (l, slot) in out.iter_mut().enumerate() {
        let moe = if l < n { !cfg.dense[l] } else { mtp };
        if !moe {
            continue;
        }
        let ext = layer_extents(
            cat,
            l,
            r.n_routed_experts,
            r.hidden_size,
            r.moe_intermediate_size,
        )?;
        *slot = ext
            .iter()
            .map(|e| {
                slot_plan(e).map_err(|m| Error::Config {
                    path: cat.dir().to_path_buf(),
                    msg: format!("layer {l} expert {}: {m}", e.expert),
                })
            })
            .collect::<Result<_>>()?;
    }
    Ok(out)
}

/// Plans the budget and builds the cache. Refuses a budget that cannot hold one slot per
/// sparse layer, printing the equation.
pub(super) fn setup(
    cfg: &Config,
    cat: &Catalog,
    budget: u64,
    opts: &LoadOptions,
    gpu: Option<&GpuPlan>,
) -> Result<Streaming> {
    let n = cfg.raw.num_hidden_layers;
    let mtp = loads_mtp(cfg, cat, opts);
    let layouts = layouts(cfg, cat, mtp)?;
    let sizes = slot_sizes(&layouts, n);
    let vram = gpu.map_or(&[][..], |p| &p.experts[..]);
    let mut inputs = plan_inputs(cfg, cat, budget, opts, sizes, mtp, gpu);
    let mut plan = plan(&inputs).map_err(residency_err)?;
    let pinned = match &opts.pin {
        Some(req) => pins(req, &plan, &layouts, n, sizes.0, opts.admission, vram),
        None => Vec::new(),
    };
    if !pinned.is_empty() {
        inputs.pinned_slots = pinned.len();
        plan = nectar_residency::planner::plan(&inputs).map_err(residency_err)?;
    }
    let paths: Vec<_> = cat.shards().iter().map(|s| s.path.clone()).collect();
    let io: Arc<FileIo> = Arc::new(
        FileIo::open(&paths, opts.direct_io)
            .map_err(|e| Error::Input(format!("opening shards: {e}")))?,
    );
    let expert_bytes = layouts
        .iter()
        .map(|l| l.first().map_or(0, |x| x.payload as usize))
        .collect();
    let counts = layouts.iter().map(Vec::len).collect();
    // Each cache sees only its own layers (the others are empty), so its slab is sized by them.
    let only = |keep: &dyn Fn(usize) -> bool| -> Vec<Vec<SlotLayout>> {
        let mut ls = layouts.clone();
        for (l, x) in ls.iter_mut().enumerate() {
            if !keep(l) {
                x.clear();
            }
        }
        ls
    };
    // The plans of the moment, k sequences in use, with and without a prompt in flight; the
    // slab holds the most slots any layer is given (one sequence between prompts), and the
    // caches start at the full plan until told otherwise.
    let top_k = cfg.raw.num_experts_per_tok;
    let lent = (1..=inputs.sequences)
        .map(|k| {
            [false, true].map(|prompt| {
                let p = lent_inputs(&inputs, k, prompt, top_k, opts);
                nectar_residency::planner::plan(&p).map(|plan| Lent {
                    caps: caps_of(&plan, cfg),
                    working: p.working_slots - prefetch_slots(top_k, opts),
                })
            })
        })
        .map(|[a, b]| Ok([a?, b?]))
        .collect::<std::result::Result<Vec<_>, nectar_residency::Error>>()
        .map_err(residency_err)?;
    let most: Vec<usize> = (0..=n)
        .map(|l| lent.iter().flatten().map(|x| x.caps[l]).max().unwrap_or(0))
        .collect();
    let rc = |working: usize, prefetch: usize, pinned: Vec<ExpertKey>, lookahead: bool| {
        ResidencyConfig {
            lru_per_layer: most.clone(),
            working_slots: working,
            prefetch_slots: prefetch,
            io_threads: opts.io_threads,
            pinned,
            mlock: false,
            admission: opts.admission,
            lookahead,
        }
    };
    let residency = Residency::new(
        rc(
            working_bank(cfg.raw.num_experts_per_tok, opts),
            prefetch_slots(cfg.raw.num_experts_per_tok, opts),
            pinned,
            opts.prefetch.reads_repeated_contexts(),
        ),
        only(&|l| l < n),
        io.clone(),
    )
    .map_err(residency_err)?;
    let mtp_residency = if mtp && !layouts[n].is_empty() {
        let r = Residency::new(
            rc(mtp_working(cfg), 0, Vec::new(), false),
            only(&|l| l == n),
            io,
        )
        .map_err(residency_err)?;
        Some(Arc::new(r))
    } else {
        None
    };
    let full = lent.len();
    let s = Streaming {
        plan,
        prefill_tokens: planned_prefill_tokens(opts) as usize,
        residency: Arc::new(residency),
        mtp_residency,
        lent,
        in_use: 0.into(),
        expert_bytes,
        counts,
        mtp_layer: n,
    };
    s.use_sequences(full, true).map_err(residency_err)?;
    Ok(s)
}

/// One plan of the moment of the caches: LRU slots by layer (the MTP layer's last) and the
/// working slots a wave may use.
#[derive(Debug)]
struct Lent {
    caps: Vec<usize>,
    working: usize,
}

/// The memory equation with `k` of the planned sequences in use (`PlanInputs::lent_to`: the
/// idle ones' KV cache and activations lent to the LRU) and, without a prompt in flight
/// (`prompt` false), no prompt transients and a working bank for `k` sequences' decode misses
/// (what `--parallel` would plan for that many): a prompt's span and the bank's room for its
/// union are taken back when one joins.
pub fn lent_inputs(
    inputs: &PlanInputs,
    k: usize,
    prompt: bool,
    top_k: usize,
    opts: &LoadOptions,
) -> PlanInputs {
    let mut p = inputs.lent_to(k);
    if !prompt {
        p.prefill_transients = 0;
        p.working_slots = bank_for(top_k, p.sequences, opts) + prefetch_slots(top_k, opts);
    }
    p
}

/// A plan's LRU slots by layer (`num_hidden_layers + 1` entries, the MTP tier's last): its
/// extra slots on evenly spaced sparse layers, the MTP tier at the base count.
fn caps_of(plan: &Plan, cfg: &Config) -> Vec<usize> {
    let n = cfg.raw.num_hidden_layers;
    let mut caps = vec![plan.lru_per_layer; n + 1];
    for (i, l) in (0..n).filter(|&l| !cfg.dense[l]).enumerate() {
        caps[l] = plan.lru_slots(i);
    }
    caps
}

/// The main-layer experts to pin for `req` under `plan` (before pins): the hottest that exist.
fn pins(
    req: &PinRequest,
    plan: &Plan,
    layouts: &[Vec<SlotLayout>],
    n: usize,
    slot: u64,
    admission: nectar_residency::Admission,
    vram: &[ExpertKey],
) -> Vec<ExpertKey> {
    let lru_bytes = plan.lru_bytes;
    let total = req.ledger.total();
    let bytes = req.bytes.unwrap_or_else(|| {
        // Under predictive admission the auto rule pins nothing: the slots do better in its
        // cache. Replayed on route256 (session, the hottest experts of the prefill stream
        // pinned): 32 slots all predictive hit 0.698; 16 pinned + 16 predictive 0.574, and
        // live repin does not recover it (0.572). An explicit --pin-size still pins.
        if total < AUTOPIN_MIN_HISTORY
            || matches!(admission, nectar_residency::Admission::Predictive { .. })
        {
            return 0;
        }
        let conf = (total as f64 / AUTOPIN_FULL_HISTORY).min(1.0);
        (lru_bytes as f64 * 0.5 * conf) as u64
    });
    let count = (bytes / slot.max(1)) as usize;
    // Experts in VRAM never use a RAM slot: the pins are the hottest of the others.
    let vram: std::collections::HashSet<ExpertKey> = vram.iter().copied().collect();
    req.ledger.hottest(count, |k| {
        let l = k.layer as usize;
        !vram.contains(&k)
            && l < n
            && layouts
                .get(l)
                .is_some_and(|x| (k.expert as usize) < x.len())
    })
}

/// Working slots of the MTP tier: one row's experts per wave (a verified run's MTP catch-up
/// of several rows goes in waves of this size).
fn mtp_working(cfg: &Config) -> usize {
    cfg.raw.num_experts_per_tok
}

/// Fewest working slots: a prompt chunk's union still loads 16 experts per wave.
const MIN_WORKING: usize = 16;

/// The working bank: room for the misses of a decode step of every sequence twice over (a
/// verify or a forced run widens the union), at least [`MIN_WORKING`], at most the cap. A
/// prompt chunk's wider union is served in several waves; every slot not spent here is LRU.
/// `top_k`: the experts a token routes to (a geometry planned without files, `nectar fit
/// --geometry`, passes its own).
pub fn working_bank(top_k: usize, opts: &LoadOptions) -> usize {
    bank_for(top_k, opts.sequences, opts)
}

/// [`working_bank`] for `sequences` of the planned ones (the cap stays `opts`').
fn bank_for(top_k: usize, sequences: usize, opts: &LoadOptions) -> usize {
    let need = 2 * top_k * sequences.max(1);
    need.max(MIN_WORKING).min(opts.working_slots.max(1))
}

/// Slots reserved for next-layer prefetches: one layer's worth of one row's experts (a
/// layer's unstarted wrong guesses give theirs back at its router, `Residency::routed`; each
/// slot is taken from the LRU's budget).
pub fn prefetch_slots(top_k: usize, opts: &LoadOptions) -> usize {
    match opts.prefetch.reads_predicted_layer() {
        true => top_k,
        false => 0,
    }
}

fn residency_err(e: nectar_residency::Error) -> Error {
    Error::Residency(e)
}

/// The memory plan of a model for a budget, and the VRAM plan beside it.
#[derive(Debug)]
pub struct MemoryPlan {
    /// The terms of the memory equation (the spine terms: what stays in RAM).
    pub inputs: PlanInputs,
    /// The plan, or the refusal (the budget is too small).
    pub plan: Result<Plan>,
    /// The `--gpu-memory` plan (`None` without `opts.gpu_memory`).
    pub gpu: Option<GpuPlan>,
}

/// The memory plan of the model in `dir` for `opts.memory_budget`, from headers only (no slab is
/// allocated, no weight is read) — the plan a load with `opts` runs. With `opts.gpu_memory` it
/// plans the VRAM as the load does once the GPU opened (`auto` opens it to read the free
/// memory), and the RAM plan counts only the spine left on the CPU.
pub fn plan_memory(dir: &std::path::Path, opts: &LoadOptions) -> Result<MemoryPlan> {
    let cfg = Config::from_dir(dir)?;
    let cat = Catalog::open(dir)?;
    let n = cfg.raw.num_hidden_layers;
    let mtp = loads_mtp(&cfg, &cat, opts);
    let layouts = layouts(&cfg, &cat, mtp)?;
    let sizes = slot_sizes(&layouts, n);
    let budget = opts.memory_budget.unwrap_or(0);
    let gpu = match opts.gpu_memory {
        None => None,
        Some(req) => {
            let vram = super::resolve_gpu_budget(req)
                .map_err(|why| Error::Gpu(format!("--gpu-memory: {why}")))?;
            Some(super::placement::plan_for(&cfg, &cat, vram, opts))
        }
    };
    let inputs = plan_inputs(&cfg, &cat, budget, opts, sizes, mtp, gpu.as_ref());
    let plan = plan(&inputs).map_err(residency_err);
    Ok(MemoryPlan { inputs, plan, gpu })
}

/// The slot layouts of every MoE layer of the model in `dir` and its shard paths (headers only).
pub fn expert_layouts(
    dir: &std::path::Path,
) -> Result<(Vec<Vec<SlotLayout>>, Vec<std::path::PathBuf>)> {
    let cfg = Config::from_dir(dir)?;
    let cat = Catalog::open(dir)?;
    let mtp = inventory::has_mtp_layer(&cfg, &cat);
    let paths = cat.shards().iter().map(|s| s.path.clone()).collect();
    Ok((layouts(&cfg, &cat, mtp)?, paths))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nectar_residency::usage::Ledger;

    /// The pins are the ledger's hottest experts that are not in VRAM (a VRAM expert in a
    /// pinned RAM slot would waste it: it is never requested from the RAM cache).
    #[test]
    fn experts_in_vram_are_never_pinned() {
        let dir = std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/glm-tiny/glm5/model"
        ));
        let cfg = Config::from_dir(&dir).unwrap();
        let cat = Catalog::open(&dir).unwrap();
        let n = cfg.raw.num_hidden_layers;
        let layouts = layouts(&cfg, &cat, true).unwrap();
        let sizes = slot_sizes(&layouts, n);
        let opts = LoadOptions {
            ctx_size: 256,
            runtime_reserve: Some(1 << 20),
            ..Default::default()
        };
        let p = plan(&plan_inputs(&cfg, &cat, 64 << 20, &opts, sizes, true, None)).unwrap();
        let first = (0..n).find(|&l| !cfg.dense[l]).unwrap() as u32;
        let key = |expert| ExpertKey {
            layer: first,
            expert,
        };
        let mut ledger = Ledger::new(n as u32 + 1, cfg.raw.n_routed_experts as u32, "glm_moe_dsa");
        for e in 0..4 {
            ledger.add(key(e), 100 - u64::from(e));
        }
        let req = PinRequest {
            ledger,
            bytes: Some(2 * sizes.0),
        };
        let pins =
            |vram: &[ExpertKey]| pins(&req, &p, &layouts, n, sizes.0, DEFAULT_ADMISSION, vram);
        assert_eq!(pins(&[]), vec![key(0), key(1)]);
        assert_eq!(pins(&[key(0)]), vec![key(1), key(2)]);
        assert_eq!(pins(&[key(1), key(2)]), vec![key(0), key(3)]);
    }
}
