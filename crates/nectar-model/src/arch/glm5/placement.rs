//! `--gpu-memory`: which of the model's matrices live in VRAM and run on the GPU.
//!
//! One plan, from the tensor headers alone ([`plan`] over [`catalog_candidates`]): `nectar fit`
//! prints it without a GPU, and the load applies the same plan. Order (hottest classes first, as
//! much as fits; a matrix that does not fit is skipped and the next one tried):
//!
//! 1. every layer's attention and indexer matrices, 2. the dense MLPs, routers and shared
//!    experts (read by every token), 3. the MTP layer's, 4. the LM heads — the spine;
//! 5. the **VRAM expert tier**: routed experts, the most selected of the usage ledger first,
//!    then in turn across the MoE layers (expert 0 of every layer, then expert 1, …) so that
//!    each layer gets its share when there is no history.
//!
//! Under `--memory-budget` the plan also carves a **staging area** out of the budget, after the
//! spine and before the expert tier: [`staging_slots`] slots (two per routed expert of a token,
//! so copies into one half overlap the products on the other) of [`staging_slot_bytes`], into
//! which an expert in RAM is copied when the measured costs say the GPU computes it sooner than
//! the CPU (`copied.rs`, `offload.rs`). It shrinks to what fits, down to two slots, or is left
//! out — and is not placed when every expert fits in VRAM anyway.
//!
//! **A spine matrix in VRAM costs no RAM**: it is read into an owned buffer as the model loads,
//! uploaded, and the buffer freed ([`GpuPlan::placement_of`], `Loader::placing`), and the memory
//! plan counts only the spine left on the CPU (`streaming::plan_inputs`), so a `--memory-budget`
//! gets that RAM as expert slots. The one exception is each layer's `kv_b_proj`
//! ([`keeps_host_copy`]): the absorbed attention form (decode) runs on the GPU over KV caches
//! mirrored in VRAM, but a sequence whose mirror does not fit the mirrors' cap runs it on the
//! CPU, which reads kv_b's per-head rows there — so kv_b keeps its host copy beside the VRAM
//! one. Nothing falls back to a released host copy: a product of a placed matrix that fails
//! on the GPU is an error (`Error::Gpu`), and a CPU path that asks for a released copy is
//! `Error::HostReleased`.
//!
//! Experts in VRAM run on the GPU whether the others are resident (no budget) or streamed
//! through the RAM cache (`--memory-budget`): a VRAM expert is never requested from that cache
//! nor pinned in it. Without a usable GPU (or without the `cuda` feature) nothing moves and the
//! summary says why: the model runs on the CPU.
use super::{inventory, Config, Glm5};
use crate::blocks::Linear;
use nectar_format::Catalog;
use nectar_residency::usage::Ledger;
use nectar_residency::ExpertKey;
use std::collections::{BTreeMap, HashSet};

/// `--gpu-memory`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuMemory {
    /// Most of the VRAM free once the device is opened ([`auto_budget`]).
    Auto,
    /// This many bytes.
    Size(u64),
}

/// The VRAM `--gpu-memory auto` uses: 90 % of what is free once the context and the kernels
/// are loaded. The tenth left covers what is allocated beside the weights — each product's
/// activation, output and job-table buffers, the allocator's rounding of a thousand separate
/// matrices, another process starting on the same GPU — and is the headroom `--memory-budget`'s
/// default leaves in RAM.
pub fn auto_budget(free: u64) -> u64 {
    free / 10 * 9
}

/// The VRAM bytes `req` stands for: a size as given; `auto` opens the GPU to read its free
/// memory, or says why it cannot (no GPU, no CUDA tier in this build).
pub fn resolve_budget(req: GpuMemory) -> std::result::Result<u64, String> {
    match req {
        GpuMemory::Size(b) => Ok(b),
        GpuMemory::Auto => open(req).map(|o| o.budget()),
    }
}

/// Names of the spine classes, in placement order.
pub const CLASSES: [&str; 4] = [
    "attention + indexers",
    "dense MLPs, routers, shared experts",
    "MTP layer",
    "LM heads",
];

/// What the GPU may hold, from the headers: spine matrices (checkpoint name, bytes) and the
/// routed experts of each MoE layer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Candidates {
    /// Every spine matrix the model multiplies (the embedding tables, only gathered, excluded).
    pub spine: Vec<(String, u64)>,
    /// Per MoE layer (the MTP layer is `num_hidden_layers`): experts, bytes of the largest.
    pub experts: BTreeMap<usize, (usize, u64)>,
}

/// The decoder layer of a checkpoint name (`model.layers.{l}.…`).
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")
        .and_then(|r| r.split('.').next())
        .and_then(|i| i.parse::<usize>().ok())
}

/// The spine class and layer of a matrix: the sort key of the placement order.
fn order_key(name: &str, n: usize) -> (usize, usize) {
    match layer_of(name) {
        Some(l) if l >= n && name.ends_with("shared_head.head.weight") => (3, l),
        Some(l) if l >= n => (2, l),
        Some(l) if name.contains(".self_attn.") => (0, l),
        Some(l) => (1, l),
        None => (3, 0),
    }
}

/// The candidates of a checkpoint (headers only). A quantised matrix counts its `.qs` scales.
pub fn catalog_candidates(cfg: &Config, cat: &Catalog) -> Candidates {
    let mut c = Candidates::default();
    let mut experts: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    for e in cat.tensors() {
        if e.name.ends_with(".qs") || e.shape.len() != 2 {
            continue;
        }
        let bytes = e.len + cat.get(&format!("{}.qs", e.name)).map_or(0, |q| q.len);
        if let Some(k) = inventory::expert_of(&e.name) {
            *experts.entry(k).or_default() += bytes;
            continue;
        }
        if cfg.is_embedding_only(&e.name)
            || inventory::classify(&e.name, cfg) == inventory::TensorClass::Other
        {
            continue;
        }
        c.spine.push((e.name.clone(), bytes));
    }
    for ((l, _), b) in experts {
        let slot = c.experts.entry(l).or_default();
        slot.0 += 1;
        slot.1 = slot.1.max(b);
    }
    c
}

/// One spine class of a plan.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClassLine {
    /// [`CLASSES`] name.
    pub name: &'static str,
    /// Matrices placed / in the class.
    pub placed: usize,
    /// Of the class.
    pub total: usize,
    /// Bytes placed.
    pub placed_bytes: u64,
    /// Bytes of the class.
    pub total_bytes: u64,
}

/// Whether a spine matrix placed in VRAM keeps its host copy: `kv_b_proj`, whose per-head rows
/// the absorbed attention form reads on the CPU for sequences whose KV mirror did not fit in
/// VRAM (`attention/gpu_decode.rs`).
pub fn keeps_host_copy(name: &str) -> bool {
    name.ends_with(".self_attn.kv_b_proj.weight")
}

/// What goes to VRAM within a budget.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuPlan {
    /// The VRAM budget, bytes.
    pub budget: u64,
    /// Spine matrices placed (checkpoint names).
    pub spine: HashSet<String>,
    /// Per class, in placement order.
    pub classes: Vec<ClassLine>,
    /// Routed experts in VRAM, in placement order.
    pub experts: Vec<ExpertKey>,
    /// Per MoE layer: (experts in VRAM, experts in the layer, bytes of one).
    pub per_layer: BTreeMap<usize, (usize, usize, u64)>,
    /// Staging slots for experts copied from RAM (0: none).
    pub staging_slots: usize,
    /// Bytes of the staging area.
    pub staging_bytes: u64,
    /// Bytes of the spine placed whose host copy is released (everything placed but
    /// [`keeps_host_copy`]).
    pub released_bytes: u64,
}

impl GpuPlan {
    /// Where spine matrix `name` goes: `None` stays on the CPU; `Some(copy)` in VRAM, its host
    /// copy released but for [`keeps_host_copy`] — kv_b, which also keeps its stored layout in
    /// VRAM, where the absorbed attention kernels read its single weights.
    pub fn placement_of(&self, name: &str) -> Option<crate::blocks::GpuCopy> {
        self.spine.contains(name).then(|| {
            let rows_read = keeps_host_copy(name);
            crate::blocks::GpuCopy {
                release_host: !rows_read,
                stored_layout: rows_read,
            }
        })
    }

    /// Bytes of the spine placed.
    pub fn spine_bytes(&self) -> u64 {
        self.classes.iter().map(|c| c.placed_bytes).sum()
    }

    /// Spine matrices (and bytes) left on the CPU.
    pub fn spine_left(&self) -> (usize, u64) {
        self.classes.iter().fold((0, 0), |(n, b), c| {
            (n + c.total - c.placed, b + c.total_bytes - c.placed_bytes)
        })
    }

    /// Bytes of VRAM the plan uses: spine, staging area and experts.
    pub fn used_bytes(&self) -> u64 {
        self.spine_bytes() + self.staging_bytes + self.expert_bytes()
    }

    /// Bytes of the experts placed.
    pub fn expert_bytes(&self) -> u64 {
        self.per_layer.values().map(|(k, _, b)| *k as u64 * b).sum()
    }

    /// The VRAM experts of `layer`, ascending.
    pub fn experts_of(&self, layer: usize) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .experts
            .iter()
            .filter(|k| k.layer as usize == layer)
            .map(|k| k.expert)
            .collect();
        v.sort_unstable();
        v
    }
}

/// The experts in the order the VRAM tier takes them: the most selected of `ledger` first, then
/// in turn across layers by id.
fn expert_order(layers: &BTreeMap<usize, (usize, u64)>, ledger: Option<&Ledger>) -> Vec<ExpertKey> {
    let exists = |k: ExpertKey| {
        layers
            .get(&(k.layer as usize))
            .is_some_and(|(count, _)| (k.expert as usize) < *count)
    };
    let mut order = ledger.map_or_else(Vec::new, |l| l.hottest(usize::MAX, exists));
    let mut seen: HashSet<ExpertKey> = order.iter().copied().collect();
    let widest = layers.values().map(|(c, _)| *c).max().unwrap_or(0);
    for e in 0..widest {
        for (&l, &(count, _)) in layers {
            let k = ExpertKey {
                layer: l as u32,
                expert: e as u32,
            };
            if e < count && seen.insert(k) {
                order.push(k);
            }
        }
    }
    order
}

/// Alignment of each matrix part inside a staging slot (`nectar_cuda::copy::PART_ALIGN`).
pub const STAGING_ALIGN: u64 = 256;

/// Bytes of one staging slot for experts of `expert_bytes` (weights and scales of three
/// matrices, each of the six parts aligned to [`STAGING_ALIGN`]).
pub fn staging_slot_bytes(expert_bytes: u64) -> u64 {
    expert_bytes + 6 * STAGING_ALIGN
}

/// Staging slots a streamed model asks for: two per routed expert of a token.
pub fn staging_slots(cfg: &Config) -> usize {
    2 * cfg.raw.num_experts_per_tok
}

/// Plans `budget` bytes of VRAM over `c` (see the module docs for the order), without a
/// staging area (experts not streamed).
pub fn plan(c: &Candidates, cfg: &Config, budget: u64, ledger: Option<&Ledger>) -> GpuPlan {
    plan_with(c, cfg, budget, ledger, 0)
}

/// [`plan`] with a staging area of up to `staging` slots (experts streamed under a memory
/// budget): placed after the spine, before the expert tier, as many slots as fit (at least
/// two, or none).
pub fn plan_with(
    c: &Candidates,
    cfg: &Config,
    budget: u64,
    ledger: Option<&Ledger>,
    staging: usize,
) -> GpuPlan {
    let n = cfg.raw.num_hidden_layers;
    let mut spine: Vec<&(String, u64)> = c.spine.iter().collect();
    spine.sort_by(|a, b| (order_key(&a.0, n), &a.0).cmp(&(order_key(&b.0, n), &b.0)));
    let mut p = GpuPlan {
        budget,
        classes: CLASSES
            .iter()
            .map(|&name| ClassLine {
                name,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let mut used = 0u64;
    for (name, bytes) in spine {
        let class = &mut p.classes[order_key(name, n).0];
        class.total += 1;
        class.total_bytes += bytes;
        if used + bytes <= budget {
            used += bytes;
            class.placed += 1;
            class.placed_bytes += bytes;
            if !keeps_host_copy(name) {
                p.released_bytes += bytes;
            }
            p.spine.insert(name.clone());
        }
    }
    let largest = c.experts.values().map(|&(_, b)| b).max().unwrap_or(0);
    let all_experts: u64 = c.experts.values().map(|&(n, b)| n as u64 * b).sum();
    // Nothing to copy when every expert fits in VRAM anyway.
    if staging > 0 && largest > 0 && used + all_experts > budget {
        let slot = staging_slot_bytes(largest);
        let fit = (budget.saturating_sub(used) / slot).min(staging as u64) as usize;
        if fit >= 2 {
            p.staging_slots = fit;
            p.staging_bytes = fit as u64 * slot;
            used += p.staging_bytes;
        }
    }
    for (&l, &(count, bytes)) in &c.experts {
        p.per_layer.insert(l, (0, count, bytes));
    }
    for k in expert_order(&c.experts, ledger) {
        let Some(slot) = p.per_layer.get_mut(&(k.layer as usize)) else {
            continue;
        };
        if slot.2 > 0 && used + slot.2 <= budget {
            used += slot.2;
            slot.0 += 1;
            p.experts.push(k);
        }
    }
    p
}

/// The plan a load applies once the GPU opened with `vram` bytes to fill (`fit` plans the
/// same from the headers): the matrices of the layers it loads (not the MTP layer's with
/// `--mtp off`), experts ranked by the pin request's usage ledger, and a staging area when
/// experts stream under a memory budget and may be copied.
pub(super) fn plan_for(
    cfg: &Config,
    cat: &Catalog,
    vram: u64,
    opts: &super::LoadOptions,
) -> GpuPlan {
    let staging = match opts.memory_budget {
        Some(_) if opts.gpu_copies => staging_slots(cfg),
        _ => 0,
    };
    let ranking = opts.pin.as_ref().map(|p| &p.ledger);
    let mut c = catalog_candidates(cfg, cat);
    if !super::streaming::loads_mtp(cfg, cat, opts) {
        // `--mtp off` does not load the MTP layer: none of its matrices takes VRAM.
        let n = cfg.raw.num_hidden_layers;
        c.spine
            .retain(|(name, _)| !matches!(layer_of(name), Some(l) if l >= n));
        c.experts.retain(|&l, _| l < n);
    }
    plan_with(&c, cfg, vram, ranking, staging)
}

/// Where the model's matrices run (what the load did with a [`GpuPlan`]).
#[derive(Debug, Clone, Default)]
pub struct GpuPlacement {
    /// One line for the user: the device and what was placed, or why everything stays on the
    /// CPU.
    pub summary: String,
    /// Matrices placed in VRAM (spine and experts).
    pub matrices: usize,
    /// Device bytes they use.
    pub bytes: u64,
    /// Matrices left on the CPU because the budget ran out (spine, and resident experts).
    pub left_on_cpu: usize,
    /// Per MoE layer: (layer, the experts in VRAM, experts in the layer).
    pub vram_experts: Vec<(usize, Vec<u32>, usize)>,
    /// Staging slots for experts copied from RAM, and their device bytes (included in
    /// `bytes`).
    pub staging: (usize, u64),
    /// Bytes of spine matrices whose host copy was released (in VRAM only).
    pub host_released: u64,
    /// Bytes of spine matrices in VRAM that keep a host copy too ([`keeps_host_copy`]).
    pub host_kept: u64,
    /// VRAM the decode attention's KV mirrors may hold together: half of what was free after
    /// the load.
    pub kv_mirror_cap: u64,
}

impl GpuPlacement {
    /// Everything on the CPU, for `why`.
    pub(super) fn cpu(why: &str) -> GpuPlacement {
        GpuPlacement {
            summary: format!("--gpu-memory: {why}; running on the CPU"),
            ..Default::default()
        }
    }

    /// Routed experts held in VRAM, in all layers.
    pub fn experts_in_vram(&self) -> usize {
        self.vram_experts.iter().map(|x| x.1.len()).sum()
    }
}

impl Glm5 {
    /// Every spine matrix the model multiplies, in no particular order (what
    /// [`catalog_candidates`] lists from the headers).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) fn spine_linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut v: Vec<&mut Linear> = Vec::new();
        for layer in &mut self.layers {
            v.extend(layer.attn.linears_mut());
            v.extend(layer.mlp.spine_linears_mut());
        }
        if let Some(mtp) = &mut self.mtp {
            v.push(&mut mtp.eh_proj);
            v.extend(mtp.layer.attn.linears_mut());
            v.extend(mtp.layer.mlp.spine_linears_mut());
            v.extend(mtp.head.as_mut());
        }
        v.push(&mut self.lm_head);
        v
    }

    /// The spine matrices of the loaded model as (name, bytes), sorted: must equal the
    /// headers' [`catalog_candidates`] (tested), so the plan `fit` prints is the one applied.
    pub fn spine_matrices(&mut self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .spine_linears_mut()
            .into_iter()
            .map(|l| (l.name.clone(), l.bytes() as u64))
            .collect();
        v.sort();
        v
    }
}

/// An opened GPU and the budget resolved for it.
#[cfg(feature = "cuda")]
pub(super) struct Opened {
    gpu: std::sync::Arc<nectar_cuda::Gpu>,
    /// VRAM bytes to fill.
    budget: u64,
}

/// Never constructed: a build without the CUDA tier opens no GPU.
#[cfg(not(feature = "cuda"))]
pub(super) enum Opened {}

#[cfg(not(feature = "cuda"))]
impl Opened {
    pub fn budget(&self) -> u64 {
        match *self {}
    }
}

#[cfg(feature = "cuda")]
impl Opened {
    pub fn budget(&self) -> u64 {
        self.budget
    }
}

/// `ld`, placing the spine matrices `rule` names on the opened GPU as they load.
#[cfg(feature = "cuda")]
pub(super) fn placing<'a>(
    ld: crate::blocks::Loader<'a>,
    opened: &'a Opened,
    rule: crate::blocks::PlaceRule<'a>,
) -> crate::blocks::Loader<'a> {
    ld.placing(&opened.gpu, rule)
}

/// `ld` (a build without the CUDA tier opens no GPU).
#[cfg(not(feature = "cuda"))]
pub(super) fn placing<'a>(
    _ld: crate::blocks::Loader<'a>,
    opened: &'a Opened,
    _rule: &'a dyn Fn(&str) -> Option<crate::blocks::GpuCopy>,
) -> crate::blocks::Loader<'a> {
    match *opened {}
}

/// Opens the GPU for `req`, or says why the model stays on the CPU.
#[cfg(not(feature = "cuda"))]
pub(super) fn open(_req: GpuMemory) -> std::result::Result<Opened, String> {
    Err("this nectar was built without the CUDA tier (rebuild with `--features cuda`)".into())
}

/// Opens the GPU for `req`, or says why the model stays on the CPU.
#[cfg(feature = "cuda")]
pub(super) fn open(req: GpuMemory) -> std::result::Result<Opened, String> {
    let gpu = crate::blocks::open_gpu()?;
    let budget = match req {
        GpuMemory::Size(b) => b,
        GpuMemory::Auto => auto_budget(gpu.info().free_bytes as u64),
    };
    Ok(Opened { gpu, budget })
}

/// Applies `plan` on the opened GPU: the planned spine matrices were placed as they loaded
/// ([`placing`]); the planned experts get a VRAM copy (resident experts) or are read once into
/// VRAM (streamed experts).
#[cfg(not(feature = "cuda"))]
pub(super) fn apply(
    _model: &mut Glm5,
    opened: Opened,
    _plan: &GpuPlan,
) -> crate::Result<GpuPlacement> {
    match opened {}
}

/// Applies `plan` on the opened GPU: the planned spine matrices were placed as they loaded
/// ([`placing`]); the planned experts get a VRAM copy (resident experts) or are read once into
/// VRAM (streamed experts).
#[cfg(feature = "cuda")]
pub(super) fn apply(
    model: &mut Glm5,
    opened: Opened,
    plan: &GpuPlan,
) -> crate::Result<GpuPlacement> {
    let gpu = opened.gpu;
    let mut p = GpuPlacement::default();
    for l in model.spine_linears_mut() {
        if l.on_gpu() {
            p.bytes += l.device_bytes() as u64;
            p.matrices += 1;
            match l.host_bytes() {
                0 => p.host_released += l.bytes() as u64,
                b => p.host_kept += b as u64,
            }
        } else {
            p.left_on_cpu += 1;
        }
    }
    let catalog = model.catalog.clone();
    let cfg = model.cfg.clone();
    let n = model.layers.len();
    let mut mlps: Vec<(usize, &mut super::moe::Mlp)> = model
        .layers
        .iter_mut()
        .enumerate()
        .map(|(l, x)| (l, &mut x.mlp))
        .collect();
    if let Some(mtp) = &mut model.mtp {
        mlps.push((n, &mut mtp.layer.mlp));
    }
    for (l, mlp) in mlps {
        let Some(moe) = mlp.moe_mut() else { continue };
        let ids = plan.experts_of(l);
        let (matrices, bytes, left) = moe.place_experts(&gpu, &catalog, &cfg, l, &ids)?;
        p.matrices += matrices;
        p.bytes += bytes;
        p.left_on_cpu += left;
        p.vram_experts.push((l, ids, moe.expert_count()));
    }
    let mut route = String::new();
    if plan.staging_slots > 0 {
        let largest = plan.per_layer.values().map(|x| x.2).max().unwrap_or(0);
        let tier = std::sync::Arc::new(super::copied::CopyTier::new(
            &gpu,
            plan.staging_slots,
            staging_slot_bytes(largest) as usize,
        )?);
        let mut mlps: Vec<&mut super::moe::Mlp> =
            model.layers.iter_mut().map(|x| &mut x.mlp).collect();
        if let Some(mtp) = &mut model.mtp {
            mlps.push(&mut mtp.layer.mlp);
        }
        for mlp in mlps {
            if let Some(moe) = mlp.moe_mut() {
                moe.set_copy_tier(&tier);
            }
        }
        // Every residency manager whose experts may be copied tells the registry before it
        // gives slot memory back.
        for res in [model.residency(), model.mtp_residency()]
            .into_iter()
            .flatten()
        {
            tier.attach(res);
        }
        p.staging = (tier.slots(), tier.device_bytes() as u64);
        p.bytes += p.staging.1;
        route = format!(", {}", tier.route());
        model.copy_tier = Some(tier);
    }
    // The decode attention's KV mirrors (`attention/gpu_decode.rs`) take at most half of what
    // the plan left free, so the other half stays for the products' and prefill's buffers.
    p.kv_mirror_cap = gpu
        .free_bytes()
        .map_err(|e| crate::Error::Gpu(e.to_string()))?
        / 2;
    gpu.set_kv_mirror_cap(p.kv_mirror_cap);
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let total: usize = p.vram_experts.iter().map(|x| x.2).sum();
    let staging = match p.staging {
        (0, _) => String::new(),
        (n, b) => format!(
            "; staging for copied experts: {n} slots ({:.1} MiB){route}",
            mib(b)
        ),
    };
    p.summary = format!(
        "GPU: {} — {} matrices ({:.1} MiB) in VRAM, {} left on the CPU; spine host copies \
         released: {:.1} MiB; routed experts in VRAM: {} of {}{staging}; decode KV mirrors up to {:.1} \
         MiB (budget {:.1} MiB)",
        gpu.describe(),
        p.matrices,
        mib(p.bytes),
        p.left_on_cpu,
        mib(p.host_released),
        p.experts_in_vram(),
        total,
        mib(p.kv_mirror_cap),
        mib(opened.budget),
    );
    Ok(p)
}
