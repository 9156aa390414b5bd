//! `nectar fit --project`: predicted decode tok/s (MTP off and on) and prefill tok/s for a model
//! and a budget, on this machine or on one described by flags.
//!
//! The model is the physical one of `docs/performance.md` §2, specialised to how Nectar runs a
//! layer (MoE block: hits and the shared expert compute while the misses load):
//!
//! ```text
//! per forward of n rows (n = 1; n = 2 with MTP, one draft):
//!   T_attn = (spine read − shared experts) / BW_dec + L·o       attention, norms, head, + compute
//!   T_moe  = (L·U(n)·S_e + shared experts) / BW_dec            routed (hits and misses) + shared
//!   T_ssd  = L·U(n)·(1 − h(C, n))·S_e / BW_ssd                 the misses
//!   T      = T_attn + (1 − η)·T_moe + max(η·T_moe, (1 + w)·T_ssd − min(r·(φ + w)·T_ssd, T_attn))
//!            [+ the MTP layer's own forward, same shape]
//!   tok/s  = τ / T,  τ = 1 (MTP off) or 1 + a (one draft accepted with probability a)
//! ```
//! `o` is the compute a layer spends beyond streaming its weights (attention math, the DSA
//! indexer, routing, synchronisation, and what the reads beside it cost the compute) and `η`
//! the share of the MoE block's compute behind which the reads actually hide (1 is the
//! block's design: hits and the shared expert compute while the misses load). Both come from
//! a short calibration decode of the container under the budget with the trace's routes in
//! place of its routers ([`calibrate`]), or are given (`--layer-overhead-ms`,
//! `--moe-overlap`; without either η is 0, the serial end). `φ` is the share of the misses
//! whose read look-ahead prefetch starts before the layer runs and `w` its wasted reads per
//! needed read, both from the same route256 replay (`replay_prefetch`); without prefetch
//! φ = w = 0. Reads started ahead (wasted ones too) hide only behind attention — during a MoE
//! block the disk is busy with that layer's own misses — and only the share `r` of their disk
//! time that a calibration decode with look-ahead on saw run during its attention halves
//! (`project_calibrate`, or `--lookahead-hidden`; 0 without either: no credit), and no more
//! than attention lasts, so T never drops below `(1 + w)·T_ssd`: every read, wasted or not,
//! takes disk time.
//! `C` is the LRU slots per layer of the memory plan for the budget (the same plan `fit`
//! prints); `U(n)` and `h(C, n)` are measured by replaying the route256 trace (GLM-5.2's expert
//! shape) through the real default policy at exactly that `C` (`nectar_residency::replay`);
//! `BW_dec` is the weight bandwidth of the real int4 kernel at M = 1 streaming from DRAM, and
//! `BW_ssd` the O_DIRECT read rate of whole experts at the I/O threads' queue depth — both
//! measured here in seconds, or from `--mem-gbps` (times the kernel's measured share of read
//! bandwidth) and `--disk-gbps`. Prefill of a P-token prompt: the products at the int4
//! kernel's GFLOP/s at M = 64, plus attention's work (`AttnShape::prefill_flops`: quadratic
//! up to the DSA top k, then linear, plus the indexer's scoring) at the attention core's
//! GFLOP/s (timed here on the model's own reconstructed core, or `--attn-gflops`), plus one
//! read of every touched expert per layer (expert-major prefill).
use super::project_calibrate::{calibrate, Second};
use super::project_gpu::{hot_sets, without, GpuTier};
use crate::args::FitArgs;
use anyhow::{Context, Result};
use nectar_kernels::{matmul, MatRef, WeightFormat};
use nectar_model::arch::glm5::{
    expert_layouts, kv_bytes_per_token, measure_attention_gflops, measure_decode_context,
    plan_memory, planned_prefill_tokens, prefetch_slots, prompt_transients, working_bank,
    AttnShape, Config, LoadOptions, MemoryPlan, Prefetch, CONTEXT_BASE_KEYS,
};
use nectar_residency::io::FileIo;
use nectar_residency::planner::{
    plan, reserve_per_sequence, runtime_reserve, PlanInputs, ReserveInputs,
};
use nectar_residency::policy::control::{self, Controller, Measurement};
use nectar_residency::policy::LONGEST_CONTEXT;
use nectar_residency::replay::{
    replay_policy, replay_prefetch, steps, CacheSetup, PrefetchSetup, Step,
};
use nectar_residency::served::{served, Served};
use nectar_residency::trace::Trace;
use nectar_residency::Admission;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Causal queries (and keys) the attention rate is timed over: a working set per head of a
/// few MB, as a GLM-5.2 prompt of a few thousand tokens has.
const ATTN_PROBE_ROWS: usize = 1024;

/// The budget a `--calibrate` container runs under (its spine and a few slots per layer).
const CALIBRATE_BUDGET: u64 = 4 << 30;

/// What the projection needs to know about a model.
#[derive(Debug, Clone)]
pub struct Geometry {
    /// Where the numbers come from.
    pub source: String,
    /// Spine bytes read per forward (everything resident but the embedding table).
    pub spine_read: f64,
    /// Bytes of one routed expert.
    pub expert: f64,
    /// Bytes of one MTP expert (0: no MTP layer).
    pub mtp_expert: f64,
    /// Bytes of the MTP layer's non-expert weights.
    pub mtp_spine: f64,
    /// MoE layers.
    pub moe_layers: usize,
    /// Experts chosen per token.
    pub top_k: usize,
    /// Parameters per expert byte, for FLOPs (the experts' int4 density, also applied to the
    /// spine: an approximation).
    pub params_per_byte: f64,
    /// Attention dimensions, for prefill's attention work.
    pub attn: AttnShape,
    /// MoE layers with a layer before them: those whose experts PILOT predicts, so whose
    /// attention its reads can run into (of `attn.layers`).
    pub predicted_layers: usize,
    /// The longest context the model takes (`max_position_embeddings`): `--context` past it
    /// projects nothing a run could do (and the probe would hold that many keys).
    pub max_context: usize,
}

/// GLM-5.2's published int4 encodings of its routed experts (`--geometry`): they differ only
/// in a routed expert's bytes (docs/performance.md §1), which sets both the slots a budget buys
/// and the bytes a miss reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Glm52 {
    /// `glm52`: int4 with a scale per 64 weights, 21.2 MB — Nectar's default conversion and
    /// `GLM-5.2-colibri-int4-g64-with-int8-mtp`.
    G64,
    /// `glm52-row`: int4 with a scale per row, 18.9 MB — `GLM-5.2-colibri-int4-with-int8-mtp`,
    /// the published artifact (`convert --group-size 0`).
    Row,
}

impl Glm52 {
    /// The `--geometry` names, for errors.
    pub const NAMES: &'static str = "glm52, glm52-row";

    /// The geometry a `--geometry` name stands for.
    pub fn parse(name: &str) -> Result<Glm52> {
        match name {
            "glm52" => Ok(Glm52::G64),
            "glm52-row" => Ok(Glm52::Row),
            o => anyhow::bail!("unknown --geometry `{o}` ({})", Glm52::NAMES),
        }
    }

    /// Bytes of one routed expert (gate, up and down with their scales).
    fn expert_bytes(self) -> u64 {
        match self {
            Glm52::G64 => 21_200_000,
            Glm52::Row => 18_900_000,
        }
    }

    /// Columns per int4 scale of the encoding (`None`: one scale per row), the spine's as the
    /// experts' (`nectar convert --group-size` sets both).
    pub fn group(self) -> Option<usize> {
        match self {
            Glm52::G64 => Some(64),
            Glm52::Row => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Glm52::G64 => "int4 g64",
            Glm52::Row => "int4 per row",
        }
    }
}

impl Geometry {
    /// GLM-5.2 with its experts encoded as `enc` (Nectar's default conversion is int4 g64),
    /// from the model constants of `docs/performance.md` §1: 75 MoE layers, experts 21.2 MB
    /// (g64) or 18.9 MB (per row) of 37.75 M parameters, MTP experts int8 37.8 MB, its spine
    /// counted from its matrices at the encoding's int4 grouping ([`super::glm52_spine`]:
    /// 10.6 GB at g64, 9.6 GB per row; read per forward and resident, since the embedding
    /// table is read a row per token); and its memory plan for `opts` (context,
    /// sequences, server, MTP: as the runtime's plan, with GLM-5.2's dimensions —
    /// `nectar_model::arch::glm5::plan_memory`). With `opts.mtp` off the MTP layer's 0.3 GB,
    /// its working bank and its slot row are not planned. `cores`: compute threads of the
    /// machine planned (the runtime reserve counts their stacks).
    pub fn glm52(enc: Glm52, opts: &LoadOptions, cores: usize) -> (Geometry, PlanInputs) {
        let expert = enc.expert_bytes();
        use super::glm52_spine::{spine_bytes, H, INDEXER_LAYERS, LAYERS, MOE_LAYERS, VOCAB};
        let spine_bytes = spine_bytes(enc.group());
        let g = Geometry {
            source: format!(
                "GLM-5.2 constants (docs/performance.md §1), experts {}",
                enc.name()
            ),
            spine_read: spine_bytes as f64,
            expert: expert as f64,
            mtp_expert: 37.8e6,
            mtp_spine: 0.3e9,
            moe_layers: MOE_LAYERS,
            top_k: 8,
            params_per_byte: 37.75e6 / expert as f64,
            attn: AttnShape::glm52(),
            // Layers 3–77; the 3 dense layers come first.
            predicted_layers: MOE_LAYERS,
            max_context: 1_048_576,
        };
        let (hidden, vocab, top_k, mtp) = (H, VOCAB as u64, 8, opts.mtp);
        let mut spine = vec![(
            "resident spine (int4 + int8 head; the embedding read per token)".into(),
            spine_bytes,
        )];
        if mtp {
            spine.push(("MTP layer (non-expert)".into(), 300_000_000));
        }
        let sequences = opts.sequences.max(1);
        let p = PlanInputs {
            budget: opts.memory_budget.unwrap_or(0),
            spine,
            slot_bytes: expert,
            sparse_layers: MOE_LAYERS,
            mtp_slot_bytes: if mtp { 37_800_000 } else { 0 },
            experts_per_layer: 256,
            working_slots: working_bank(top_k, opts) + prefetch_slots(top_k, opts),
            pinned_slots: 0,
            mtp_slots: if mtp { top_k } else { 0 },
            // 78 layers (+ MTP) of MLA latent (512) + rope key (64); indexer keys (128) on the
            // 21 full-indexer layers (+ MTP).
            kv_bytes_per_token: kv_bytes_per_token(
                LAYERS + usize::from(mtp),
                INDEXER_LAYERS + usize::from(mtp),
                512 + 64,
                128,
            ),
            ctx: opts.ctx_size * sequences,
            sequences,
            reserve_per_sequence: reserve_per_sequence(hidden as u64, vocab),
            prefill_transients: prompt_transients(planned_prefill_tokens(opts), hidden, top_k),
            // GLM-5's tokenizer.json (about 20 MB, as GLM-4.5's), `cores` compute threads,
            // the I/O workers, main and ledger: the reserve of `nectar run` (or `serve`).
            runtime_reserve: runtime_reserve(&ReserveInputs {
                tokenizer_json_bytes: 20_000_000,
                threads: cores + opts.io_threads + 2,
                sequences,
                hidden: hidden as u64,
                vocab,
                server: opts.server,
            }),
        };
        (g, p)
    }

    /// A container's geometry from its memory plan inputs.
    fn from_plan(dir: &Path, p: &PlanInputs, top_k: usize) -> Result<Geometry> {
        let get = |k: &str| {
            p.spine
                .iter()
                .filter(|(n, _)| n.contains(k))
                .map(|x| x.1)
                .sum::<u64>() as f64
        };
        let mtp_spine = get("MTP");
        let cfg = Config::from_dir(dir)?;
        Ok(Geometry {
            source: format!("{} (memory plan inputs)", dir.display()),
            spine_read: p.spine.iter().map(|x| x.1).sum::<u64>() as f64 - mtp_spine,
            expert: p.slot_bytes as f64,
            mtp_expert: p.mtp_slot_bytes as f64,
            mtp_spine,
            moe_layers: p.sparse_layers,
            top_k,
            params_per_byte: 37.75e6 / 21.2e6,
            attn: AttnShape::from_config(&cfg),
            predicted_layers: cfg.dense.iter().skip(1).filter(|d| !**d).count(),
            max_context: cfg.raw.max_position_embeddings.unwrap_or(usize::MAX),
        })
    }
}

/// What the projection needs to know about a machine.
#[derive(Debug, Clone, Copy)]
pub struct Machine {
    /// Weight bytes per second of the int4 kernel at M = 1 (decode), GB/s.
    pub dec_gbps: f64,
    /// Plain read bandwidth, GB/s.
    pub mem_gbps: f64,
    /// Whole-expert O_DIRECT reads at the I/O queue depth, GB/s.
    pub disk_gbps: f64,
    /// int4 kernel GFLOP/s at M = 64 (prefill).
    pub gflops: f64,
    /// GFLOP/s of prefill's attention core (`nectar_model::arch::glm5::measure_attention_gflops`).
    pub attn_gflops: f64,
    /// Compute per MoE layer and token beyond streaming the weights, seconds.
    pub layer_overhead_s: f64,
    /// `η`: the share of the MoE block's compute behind which reads hide (1: all of it, the
    /// block's design; 0: a layer's misses are read after its router with nothing beside).
    pub moe_overlap: f64,
    /// `r`: the share of look-ahead's reads (their disk time) that run during attention
    /// (`project_calibrate::lookahead_hidden`; 0: no credit for reading ahead).
    pub lookahead_hidden: f64,
    /// The share of look-ahead's wrong guesses cancelled unread at their layer's router
    /// (`project_calibrate::cancelled_share`; 0: every wrong guess is read).
    pub lookahead_cancelled: f64,
    /// `b`: the share of the predicted layers' attention through which PILOT's reads kept the
    /// disk busy (`project_calibrate::pilot_busy`; 0: no credit).
    pub pilot_busy: f64,
    /// PILOT's wrong guesses read per needed expert read (`project_calibrate::pilot_waste`).
    pub pilot_waste: f64,
}

/// How long the measurements run: `fit --project` takes its time (about 10 s, and its
/// calibration decodes a minute or so on a GLM-5.2-geometry container), `doctor` takes
/// a quick look (a few seconds), with the same code.
#[derive(Debug, Clone, Copy)]
pub struct Effort {
    /// Passes of the read reference per mode (best kept).
    pub read_passes: usize,
    /// Passes of the M = 1 kernel over the arena (best kept).
    pub kernel_passes: usize,
    /// Seconds of disk reads.
    pub disk_secs: f64,
    /// The memory arena's floor, bytes (it is also at least 8× the last-level cache).
    pub min_arena: usize,
    /// Decode steps of the per-layer compute calibration (0: none, the overhead is 0 unless
    /// given).
    pub calibrate_tokens: usize,
}

impl Effort {
    /// `nectar fit --project`.
    pub const FIT: Effort = Effort {
        read_passes: 5,
        kernel_passes: 3,
        disk_secs: 2.0,
        min_arena: 1 << 30,
        calibrate_tokens: 32,
    };
    /// `nectar doctor`.
    pub const QUICK: Effort = Effort {
        read_passes: 2,
        kernel_passes: 1,
        disk_secs: 0.5,
        min_arena: 256 << 20,
        calibrate_tokens: 0,
    };
}

/// Arena of the memory measurements: at least 8× the last-level cache and `min`, at most half
/// of the usable memory (a cgroup's limit included).
fn arena_bytes(min: usize) -> usize {
    let (llc, _) = crate::machine::llc_bytes();
    let want = (8 * llc).max(min);
    crate::machine::usable_memory()
        .bytes
        .map_or(want, |m| want.min(m as usize / 2))
}

/// The benchmarks' read reference (best of `effort.read_passes` passes per mode) on `threads`
/// threads, GB/s.
pub fn measure_read(threads: usize, effort: &Effort) -> Result<f64> {
    let buf = vec![1u8; arena_bytes(effort.min_arena)];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()?;
    Ok(crate::machine::read_reference(&pool, &buf, effort.read_passes).0)
}

/// The int4 g64 kernel on GLM-5.2's expert gate shape (2048 × 6144) over rotating copies
/// filling [`arena_bytes`] (so M = 1 streams from DRAM):
/// (weight GB/s at M = 1, GFLOP/s at M = 64), best of 3 passes each.
fn measure_kernel(effort: &Effort) -> Result<(f64, f64)> {
    let (rows, cols) = (2048usize, 6144usize);
    let data_b = rows * cols / 2;
    let scales_n = rows * cols / 64;
    let per = data_b + scales_n * 4;
    let copies = (arena_bytes(effort.min_arena) / per).max(2);
    let data = super::bench::random_bytes(data_b * copies, 7);
    let scales = super::bench::random_scales(scales_n * copies, 7);
    let mats: Vec<MatRef<'_>> = (0..copies)
        .map(|c| {
            MatRef::new(
                WeightFormat::Int4Group { group: 64 },
                rows,
                cols,
                &data[c * data_b..(c + 1) * data_b],
                &scales[c * scales_n..(c + 1) * scales_n],
            )
        })
        .collect::<std::result::Result<_, _>>()?;
    let time = |m: usize| -> Result<f64> {
        let x = vec![0.5f32; m * cols];
        let mut y = vec![0.0f32; m * rows];
        let mut best = f64::INFINITY;
        let passes = if m == 1 {
            effort.kernel_passes.max(1)
        } else {
            1
        };
        for _ in 0..passes {
            let n = if m == 1 { copies } else { copies.min(8) };
            let t0 = Instant::now();
            for w in mats.iter().take(n) {
                matmul(w, &x, m, &mut y)?;
            }
            best = best.min(t0.elapsed().as_secs_f64() / n as f64);
        }
        Ok(best)
    };
    let t1 = time(1)?;
    let t64 = time(64)?;
    Ok((
        per as f64 / t1 / 1e9,
        2.0 * (rows * cols * 64) as f64 / t64 / 1e9,
    ))
}

/// Random whole experts of the container's streamed layers, read with `threads` workers for
/// `secs` (O_DIRECT where the filesystem allows it, into huge-page buffers as the slab's):
/// GB/s, and how many of the shards direct I/O opened (of how many).
pub fn measure_disk(dir: &Path, threads: usize, secs: f64) -> Result<(f64, usize, usize)> {
    let (layouts, paths) = expert_layouts(dir)?;
    let io = Arc::new(FileIo::open(&paths, true)?);
    let direct = (io.direct_count(), paths.len());
    let moe: Vec<usize> = (0..layouts.len())
        .filter(|&l| !layouts[l].is_empty())
        .collect();
    anyhow::ensure!(!moe.is_empty(), "{} streams no experts", dir.display());
    let keys = super::bench_io::random_experts(&layouts, &moe, 4096, 7);
    let raw = super::bench_io::RawReader::new(io, &paths, &layouts, threads, 32, true)?;
    Ok((raw.experts(&layouts, &keys, secs)?, direct.0, direct.1))
}

/// Hit rate and unique experts per layer and forward at `c` slots, `window` rows per forward,
/// from the trace replayed through the default policy.
fn hit_curve(trace: &Trace, layers: &[usize], c: usize, window: usize) -> (f64, f64) {
    hit_curve_of(trace, &steps(trace, window), layers, c)
}

/// [`hit_curve`] over given steps (a server's batch steps: [`served`]).
fn hit_curve_of(trace: &Trace, st: &[Step], layers: &[usize], c: usize) -> (f64, f64) {
    // The policy alone: Belady-OPT (what `compare` adds) is not part of the projection and
    // took most of its time.
    let (hits, requests) = replay_policy(trace, st, layers, c, Admission::PREDICTIVE)
        .iter()
        .fold((0, 0), |a, x| (a.0 + x.hits, a.1 + x.requests));
    let fwd = st.iter().filter(|s| s.counted).count() * layers.len();
    let rate = if requests == 0 {
        0.0
    } else {
        hits as f64 / requests as f64
    };
    (rate, requests as f64 / fwd.max(1) as f64)
}

/// Look-ahead prefetch at `c` slots with contexts of at least `min_context` tokens over
/// `st` (one row per forward: `steps(trace, 1)`; a server's batch steps: [`served`]), from
/// the trace replayed through the default policy as the residency drives it (`top-k` spare
/// working slots per row: the bank holds `2 × top-k` per sequence): (φ = misses read ahead ÷
/// misses, w = wasted reads ÷ misses).
fn prefetch_curve(
    trace: &Trace,
    st: &[Step],
    rows: usize,
    layers: &[usize],
    c: usize,
    min_context: usize,
) -> (f64, f64) {
    let setup = CacheSetup::lru_only(c, Admission::PREDICTIVE);
    let p = PrefetchSetup {
        slack: trace.top_k * rows,
        min_context,
    };
    let (_, s) = replay_prefetch(trace, st, layers, &setup, p);
    let needed = (s.misses + s.used).max(1) as f64;
    (s.coverage(), s.wasted as f64 / needed)
}

/// Look-ahead's (φ, w) by threshold over one set of steps at a plan's slots ([`prefetch_curve`]
/// mixed by [`at_slots`]), each replayed once: the controller asks for the same rungs many
/// times. Above the longest context the predictor matches nothing is read ahead.
struct Curves<'a> {
    trace: &'a Trace,
    steps: &'a [Step],
    rows: usize,
    layers: &'a [usize],
    c: usize,
    extra: f64,
    by_threshold: std::collections::BTreeMap<usize, (f64, f64)>,
}

impl<'a> Curves<'a> {
    fn new(
        trace: &'a Trace,
        steps: &'a [Step],
        rows: usize,
        layers: &'a [usize],
        (c, extra): (usize, f64),
    ) -> Self {
        Curves {
            trace,
            steps,
            rows,
            layers,
            c,
            extra,
            by_threshold: Default::default(),
        }
    }

    fn at(&mut self, min_context: usize) -> (f64, f64) {
        let Curves {
            trace,
            steps,
            rows,
            layers,
            c,
            extra,
            ..
        } = *self;
        *self.by_threshold.entry(min_context).or_insert_with(|| {
            if min_context > LONGEST_CONTEXT {
                (0.0, 0.0)
            } else {
                at_slots(c, extra, |c| {
                    prefetch_curve(trace, steps, rows, layers, c, min_context)
                })
            }
        })
    }
}

/// Windows the projection runs the look-ahead controller for (it settles within ~10; the
/// rest show its re-probing, whose backoff caps at 64 windows).
const CONTROL_WINDOWS: usize = 400;

/// The disk rate of a projection measured here: what the calibration decode's own reads moved
/// while some read was in flight, when it read enough to tell, else the 2 s sample of
/// whole-expert reads. The decode's rate is the one a decode gets — its queue depth, its
/// compute beside it — and it is steadier: on a 2-vCPU guest five samples read 0.50–2.39 GB/s
/// (one while the disk worked off a 20 GB write, one beside another reader) against 2.19–2.44
/// in their calibrations; with the container in RAM on 16 cores the sample copied 17.8 GB/s
/// and the decode's reads 9.8 (its copies share the cores and the memory with its compute),
/// and a projection from the sample was 1.6× the replay (benchmarks/RESULTS.md, "Look-ahead
/// where reads are fast").
fn disk_rate(sample: f64, calibration: Option<f64>) -> (f64, &'static str) {
    match calibration {
        Some(c) => (c, "calibration"),
        None => (sample, "sample"),
    }
}

/// Reads a forward starts ahead of its layers' routers, as the projection models them.
#[derive(Debug, Clone, Copy)]
enum Ahead {
    /// None: every miss is read after its layer's router.
    Off,
    /// Look-ahead: a share `phi` of the misses read ahead, `w` wrong guesses per miss (the
    /// offline replay's), a share `r` of their disk time inside attention.
    Guesses { phi: f64, w: f64 },
    /// PILOT: the next layer's predicted misses queue behind this layer's and keep the disk
    /// busy through a measured share `b` of the predicted layers' attention, with
    /// `pilot_waste` wrong guesses read.
    Pilot,
}

/// One projection (`prefetch`: the prefetch projected — `Off`, `Lookahead`, or `Pilot` and
/// `Both` (projected alike, from the b and w their own calibration measured);
/// `width`: sequences a server decodes together, projected beside one when above 1).
#[allow(clippy::too_many_arguments)]
pub fn project(
    g: &Geometry,
    m: &Machine,
    slots: Slots,
    trace: &Trace,
    acceptance: f64,
    prefetch: Prefetch,
    gpu: Option<&GpuTier>,
    width: usize,
) -> serde_json::Value {
    let lookahead = prefetch == Prefetch::Lookahead;
    let predicted_share = g.predicted_layers as f64 / g.attn.layers.max(1) as f64;
    let hidden = trace.hidden_layers();
    let main = trace.main_layers(hidden);
    let mtp_l = trace.mtp_layers(hidden);
    let c = slots.mtp_off.min(trace.experts_per_layer);
    let c_on = slots.mtp_on.min(trace.experts_per_layer);
    // With experts in VRAM the RAM cache and the disk are asked only for the others.
    let vram = gpu.filter(|t| t.experts_per_layer > 0).map(|t| {
        let dir = trace.path.parent().unwrap_or(Path::new("."));
        hot_sets(dir, trace, &main, t.experts_per_layer)
    });
    let ram_trace = vram.as_ref().map(|(sets, _)| without(trace, sets));
    let rt = ram_trace.as_ref().unwrap_or(trace);
    // Experts per layer and forward the GPU computes (n rows per forward).
    let u_vram = |n: usize, u_ram: f64| match vram {
        Some(_) => at_slots(c, slots.extra_off, |c| hit_curve(trace, &main, c, n)).1 - u_ram,
        None => 0.0,
    };
    // Three independent replays (deterministic each): run side by side.
    let (((h1, u1), (h2, u2)), (hm, _)) = rayon::join(
        || {
            rayon::join(
                || at_slots(c, slots.extra_off, |c| hit_curve(rt, &main, c, 1)),
                || at_slots(c_on, slots.extra_on, |c| hit_curve(rt, &main, c, 2)),
            )
        },
        || {
            if mtp_l.is_empty() || g.mtp_expert == 0.0 {
                (0.0, 0.0)
            } else {
                hit_curve(trace, &mtp_l, c_on, 1)
            }
        },
    );
    let (uv1, uv2) = (u_vram(1, u1), u_vram(2, u2));
    let l = g.moe_layers as f64;
    let dec = m.dec_gbps * 1e9;
    // The spine on the GPU (its bytes at the card's rate, a round trip per product) and the
    // rest on the CPU; the shared experts are the last of it to leave the CPU.
    let (spine_gpu, products, gpu_bps, trip) = gpu.map_or((0.0, 0.0, 1.0, 0.0), |t| {
        (
            t.spine_bytes.min(g.spine_read),
            t.spine_products,
            t.gbps * 1e9,
            t.product_s,
        )
    });
    let spine_cpu = g.spine_read - spine_gpu;
    let shared = (l * g.expert).min(spine_cpu);
    let t_attn =
        (spine_cpu - shared) / dec + spine_gpu / gpu_bps + products * trip + l * m.layer_overhead_s;
    // The MoE blocks of a forward whose RAM tier serves `u` experts per layer and the VRAM `uv`:
    // (seconds, experts per layer copied to the card). The CPU computes the RAM tier's experts
    // and the shared one, the GPU its own beside them (two launches per layer); with a copy
    // rate the runtime also copies x of the RAM tier's to the card (`offload::decide`: the
    // split that finishes both sides soonest), each copy overlapping the previous expert's
    // product after the first, and the copies' and the CPU's reads of RAM sharing its rate.
    let copy_bps = gpu.and_then(|t| t.copy_bps);
    // Seconds per copied expert once the pipeline is full: its copy or its product, whichever
    // is slower.
    let per = copy_bps.map(|cb| (g.expert / gpu_bps).max(g.expert / cb));
    let moe = |u: f64, uv: f64| -> (f64, f64) {
        let cpu = |x: f64| (l * (u - x) * g.expert + shared) / dec;
        let gpu_side = |x: f64| {
            let launches = if uv > 0.0 || x > 0.0 {
                2.0 * l * trip
            } else {
                0.0
            };
            let copies = match (copy_bps.zip(per), x > 0.0) {
                (Some((cb, per)), true) => l * g.expert / cb + l * x * per,
                _ => 0.0,
            };
            l * uv * g.expert / gpu_bps + launches + copies
        };
        let none = cpu(0.0).max(gpu_side(0.0));
        let Some((cb, per)) = copy_bps.zip(per).filter(|_| u > 0.0) else {
            return (none, 0.0);
        };
        // Where the two sides meet (the GPU's launches and first copy included).
        let fill = l * g.expert / cb + if uv > 0.0 { 0.0 } else { 2.0 * l * trip };
        let x = ((cpu(0.0) - gpu_side(0.0) - fill) / (l * g.expert / dec + l * per)).clamp(0.0, u);
        // A copy reads RAM as the CPU's product would: together they read no faster than RAM.
        let ram = (l * u * g.expert + shared) / (m.mem_gbps * 1e9);
        let split = cpu(x).max(gpu_side(x)).max(ram);
        if x > 0.0 && split < none {
            (split, x)
        } else {
            (none, 0.0)
        }
    };
    // (seconds, disk bytes, seconds without the disk) of a forward that asks the RAM tier for
    // `u` experts per layer (of which it hits `h`) and the GPU for `uv`, with the reads
    // `ahead` starts before their layers. The GPU's experts (two launches per layer) run
    // beside the CPU's.
    // A forward of `rows` rows of different sequences (a server's batch step) reads the spine
    // once but attends, routes and synchronises per row: `o` is taken per row.
    let forward_rows = |rows: f64, u: f64, uv: f64, h: f64, ahead: Ahead| -> (f64, f64, f64) {
        let t_attn = t_attn + (rows - 1.0) * l * m.layer_overhead_s;
        let w = match ahead {
            Ahead::Off => 0.0,
            // Of the wrong guesses only those not cancelled at their layer's router are read:
            // a read ahead waits for an idle disk, and the replay cannot know which did not
            // start.
            Ahead::Guesses { w, .. } => w * (1.0 - m.lookahead_cancelled),
            Ahead::Pilot => m.pilot_waste,
        };
        let t_moe = moe(u, uv).0;
        let ssd = l * u * (1.0 - h) * g.expert;
        let t_ssd = ssd / (m.disk_gbps * 1e9);
        // Reads started ahead of their layer (the wasted ones too) run while the disk would
        // idle, i.e. during attention, and no more than it lasts — but only the share `r` of
        // them measured to run there: in the MoE phases the disk is busy with the demand reads
        // anyway.
        let hide = m.moe_overlap * t_moe;
        let in_attn = match ahead {
            Ahead::Off => 0.0,
            Ahead::Guesses { phi, .. } => (m.lookahead_hidden * (phi + w) * t_ssd).min(t_attn),
            // PILOT's queue (the next layer's predicted misses, behind this layer's demand
            // reads) runs on into the next attention: the disk is busy a share `b` of the
            // predicted layers' attention, with right and wrong guesses alike, up to all the
            // reads there are (attention taken as even across layers).
            Ahead::Pilot => (m.pilot_busy * predicted_share * t_attn).min((1.0 + w) * t_ssd),
        };
        let t = t_attn + (t_moe - hide) + hide.max((1.0 + w) * t_ssd - in_attn);
        (t, ssd * (1.0 + w), t_attn + t_moe)
    };
    let forward = |u: f64, uv: f64, h: f64, ahead: Ahead| forward_rows(1.0, u, uv, h, ahead);
    // The controller's measurement of a window of forwards (seconds, disk bytes, seconds
    // without the disk) with `w` wrong guesses per miss.
    let measure = |(t, ssd, ram): (f64, f64, f64), w: f64| {
        let n_reads = 1_000_000u64;
        Measurement {
            steps: control::WINDOW,
            seconds: t * control::WINDOW as f64,
            busy_seconds: (ssd / (m.disk_gbps * 1e9)).min(t) * control::WINDOW as f64,
            wait_seconds: (t - ram).max(0.0) * control::WINDOW as f64,
            reads: n_reads,
            wasted: (n_reads as f64 * w / (1.0 + w)).round() as u64,
        }
    };
    // The look-ahead's threshold: what the runtime controller (policy/control.rs) settles on
    // when every window measures this model at its current threshold (φ and w replayed there).
    let st1 = steps(rt, 1);
    let at_plan = (c, slots.extra_off);
    let mut curves = Curves::new(rt, &st1, 1, &main, at_plan);
    let mut curve = |n: usize| curves.at(n);
    let guesses = |(phi, w): (f64, f64)| Ahead::Guesses { phi, w };
    let (min_context, spent) = if lookahead {
        Controller::default().settle(CONTROL_WINDOWS, |n| {
            let (phi, w) = curve(n);
            measure(forward(u1, uv1, h1, guesses((phi, w))), w)
        })
    } else {
        (usize::MAX, Vec::new())
    };
    let (phi, waste) = if lookahead {
        curve(min_context)
    } else {
        (0.0, 0.0)
    };
    let ahead = match prefetch {
        Prefetch::Lookahead => guesses((phi, waste)),
        Prefetch::Pilot | Prefetch::Both => Ahead::Pilot,
        Prefetch::Off | Prefetch::Measure => Ahead::Off,
    };
    // Decode tok/s averaged over the controller's windows, probes included.
    let probed = if lookahead {
        let (n, secs) = spent.iter().fold((0.0, 0.0), |a, &(k, w)| {
            (
                a.0 + w as f64,
                a.1 + w as f64 * forward(u1, uv1, h1, guesses(curve(k))).0,
            )
        });
        n / secs
    } else {
        f64::NAN
    };
    let per_threshold: serde_json::Map<String, serde_json::Value> = curves
        .by_threshold
        .iter()
        .map(|(&n, &(phi, w))| {
            (
                n.to_string(),
                json!({"coverage": phi, "wasted_per_miss": w,
                       "decode_tok_s": 1.0 / forward(u1, uv1, h1, guesses((phi, w))).0}),
            )
        })
        .collect();
    let (t1, ssd1, ram1) = forward(u1, uv1, h1, ahead);
    // A verify of two rows fills the working bank: no spare slots, no look-ahead; PILOT's
    // reads beside a verify are not measured, so not credited either.
    let (t2, ssd2, ram2) = forward(u2, uv2, h2, Ahead::Off);
    // The MTP layer drafts over the accepted rows: τ rows of top-k experts, its own tier.
    let tau = 1.0 + acceptance;
    let k = g.top_k as f64;
    let mtp_ssd = tau * k * (1.0 - hm) * g.mtp_expert;
    let mtp_ram = (g.mtp_spine + tau * k * g.mtp_expert) / (m.dec_gbps * 1e9);
    let t_mtp = mtp_ram + mtp_ssd / (m.disk_gbps * 1e9);
    let off = 1.0 / t1;
    let on = tau / (t2 + t_mtp);
    // MTP on's own bound: τ tokens a verify and draft, which take only their slower resource
    // (every read hidden behind compute or compute behind the reads). The one-row ceiling
    // below does not bound MTP on, which moves τ tokens a forward.
    let ceiling_on = tau / (ram2 + mtp_ram).max((ssd2 + mtp_ssd) / (m.disk_gbps * 1e9));
    // With the misses' reads also overlapping attention (perfect next-layer prefetch), the
    // forward takes only its slower resource: the overlap ceiling of docs/performance.md §2.2.
    let ceiling = |u: f64, uv: f64, h: f64| {
        let (_, ssd, ram) = forward(u, uv, h, Ahead::Off);
        1.0 / ram.max(ssd / (m.disk_gbps * 1e9))
    };
    // Prefill of a P-token prompt: the products at the kernel's GFLOP/s, attention (quadratic
    // up to the DSA top k) at the attention core's, each touched expert read once per layer
    // (expert-major).
    let flops_tok = 2.0 * g.params_per_byte * (g.spine_read + l * k * g.expert);
    let experts = trace.experts_per_layer as f64;
    // Experts per layer a P-token prompt touches (each token's k drawn independently).
    let touched = |p: usize| experts * (1.0 - (1.0 - k / experts).powf(p as f64));
    let prefill_parts = |p: usize| -> [f64; 3] {
        [
            p as f64 * flops_tok / (m.gflops * 1e9),
            g.attn.prefill_flops(p) / (m.attn_gflops * 1e9),
            l * touched(p) * g.expert / (m.disk_gbps * 1e9),
        ]
    };
    // Prefill on the GPU (its speeds given): every layer's products, routing and norms at the
    // card's time per token and layer, attention's work as the GPU does it at its rate, and one
    // read of every touched expert not in VRAM (the VRAM experts are touched as often as the
    // others: a prompt of 512 tokens or more touches nearly every expert). The copies of the
    // read experts to the card hide behind the reads (0.90 hidden measured, docs/gpu.md).
    let gpu_prefill_parts = gpu.and_then(|t| t.prefill.map(|s| (t, s))).map(|(t, s)| {
        let left = 1.0 - (t.experts_per_layer as f64 / experts).min(1.0);
        move |p: usize| -> [f64; 3] {
            [
                (g.attn.layers * p) as f64 * s.per_token_layer_s,
                g.attn.gpu_prefill_flops(p) / s.attn_flops,
                l * touched(p) * left * g.expert / (m.disk_gbps * 1e9),
            ]
        }
    });
    let prefill = |p: usize| -> f64 { p as f64 / prefill_parts(p).iter().sum::<f64>() };
    let prefill_split = |p: usize| {
        let [products, attention, reads] = prefill_parts(p);
        json!({"products_s": products, "attention_s": attention, "reads_s": reads,
               "kv_blocks": g.attn.kv_blocks(p)})
    };
    // `serve --parallel N` at full load: N conversations decoded together, one row of each a
    // forward, their experts' union asked of the cache (route256's conversations served N at
    // a time through the default policy, `served`), look-ahead replayed over the same batch
    // steps with the bank's spare slots for N rows and settled by the controller as above.
    // MTP off; PILOT's reads beside a batch are not measured, so not credited.
    let batch = (width > 1).then(|| {
        let n = width as f64;
        let (c, extra) = slots.full_load.unwrap_or((slots.mtp_off, slots.extra_off));
        let c = c.min(trace.experts_per_layer);
        let sv: Served = served(rt, width);
        let (hb, ub) = at_slots(c, extra, |c| hit_curve_of(&sv.trace, &sv.steps, &main, c));
        let uvb = match vram {
            Some(_) => {
                let all = served(trace, width);
                at_slots(c, extra, |c| hit_curve_of(&all.trace, &all.steps, &main, c)).1 - ub
            }
            None => 0.0,
        };
        let mut bcurves = Curves::new(&sv.trace, &sv.steps, width, &main, at_plan);
        let ((phi, w), min_context) = if lookahead {
            let (k, _) = Controller::default().settle(CONTROL_WINDOWS, |k| {
                let pw = bcurves.at(k);
                measure(forward_rows(n, ub, uvb, hb, guesses(pw)), pw.1)
            });
            (bcurves.at(k), Some(k))
        } else {
            ((0.0, 0.0), None)
        };
        let ahead = if lookahead {
            guesses((phi, w))
        } else {
            Ahead::Off
        };
        let (t, ssd, ram) = forward_rows(n, ub, uvb, hb, ahead);
        json!({
            "sequences": width,
            "lru_slots_per_layer": c,
            "hit_rate": hb,
            "unique_experts_per_layer": ub,
            "ssd_gb_per_token": ssd / n / 1e9,
            "decode_tok_s": n / t,
            "decode_tok_s_per_sequence": 1.0 / t,
            "gain_over_one_sequence": (n / t) * t1,
            "ram_wall_tok_s": n / ram,
            "prefetch": {"lookahead": lookahead, "coverage": phi, "wasted_per_miss": w,
                         "min_context": min_context},
        })
    });
    json!({
        "lru_slots_per_layer": slots.mtp_off,
        "lru_slots_per_layer_mtp_on": slots.mtp_on,
        "lru_extra_slot_share": {"mtp_off": slots.extra_off, "mtp_on": slots.extra_on},
        "hit_rate": {"mtp_off": h1, "mtp_on": h2, "mtp_layer": hm},
        "unique_experts_per_layer": {"mtp_off": u1, "mtp_on": u2},
        "ssd_gb_per_token": {"mtp_off": ssd1 / 1e9, "mtp_on": (ssd2 + mtp_ssd) / 1e9 / tau},
        "ram_wall_tok_s": 1.0 / ram1,
        "prefetch": {"mode": prefetch.as_str(), "lookahead": lookahead,
                     "coverage": phi, "wasted_per_miss": waste,
                     "hidden_in_attention": m.lookahead_hidden,
                     "wrong_guesses_cancelled": m.lookahead_cancelled,
                     "min_context": lookahead.then_some(min_context),
                     "controller_windows": spent.iter().map(|&(n, w)| json!({"min_context": n, "windows": w})).collect::<Vec<_>>(),
                     "decode_tok_s_with_probes": lookahead.then_some(probed),
                     "per_threshold": per_threshold,
                     "pilot": prefetch.reads_predicted_layer().then(|| json!({
                         "busy_in_attention": m.pilot_busy,
                         "predicted_attention_share": predicted_share,
                         "wasted_per_read": m.pilot_waste}))},
        "layer_overhead_ms": m.layer_overhead_s * 1e3,
        "moe_overlap": m.moe_overlap,
        "decode_tok_s": {"mtp_off": off, "mtp_on": on},
        // The same forward without reads started ahead (`--prefetch off`'s figure at these
        // slots), beside the prefetch projected: what look-ahead adds at the measured `r`, or
        // PILOT at its measured `b`.
        "decode_tok_s_without_lookahead": (prefetch != Prefetch::Off).then(|| 1.0 / forward(u1, uv1, h1, Ahead::Off).0),
        "overlap_ceiling_tok_s": ceiling(u1, uv1, h1),
        "overlap_ceiling_tok_s_mtp_on": ceiling_on,
        "bound": if ssd1 / (m.disk_gbps * 1e9) > ram1 - t_attn { "disk" } else { "memory" },
        "prefill_tok_s": {"512": prefill(512), "2048": prefill(2048), "8192": prefill(8192)},
        "prefill_seconds": {"512": prefill_split(512), "2048": prefill_split(2048), "8192": prefill_split(8192)},
        "acceptance": acceptance,
        "parallel": batch,
        "gpu": gpu.map(|t| json!({
            "budget": t.budget, "spine_bytes": spine_gpu, "spine_products": products,
            "ram_released_bytes": t.released,
            "experts_per_layer": t.experts_per_layer, "kernel_gbps": t.gbps,
            "product_us": t.product_s * 1e6,
            "vram_ranking": vram.as_ref().map(|v| v.1.clone()),
            "experts_per_forward": {"gpu": uv1, "ram_tier": u1},
            "copies": match t.copy_bps {
                Some(cb) => json!({"gbps": cb / 1e9, "copied_per_layer": moe(u1, uv1).1}),
                None => json!("experts not in VRAM on the CPU (not projected: --gpu-copy-gbps)"),
            },
            "prefill": match &gpu_prefill_parts {
                Some(parts) => {
                    let split = |p: usize| {
                        let [compute, attention, reads] = parts(p);
                        json!({"compute_s": compute, "attention_s": attention, "reads_s": reads,
                               "tok_s": p as f64 / (compute + attention + reads)})
                    };
                    json!({"512": split(512), "2048": split(2048), "8192": split(8192)})
                }
                None => json!("on the CPU (not projected: --gpu-prefill-us and --gpu-attn-tflops)"),
            },
        })),
    })
}

/// LRU slots per layer of the two plans projected: MTP off (the layer not loaded) and on.
#[derive(Debug, Clone, Copy)]
pub struct Slots {
    pub mtp_off: usize,
    pub mtp_on: usize,
    /// Shares of the sparse layers holding one slot more (each plan's last partial row).
    pub extra_off: f64,
    pub extra_on: f64,
    /// The MTP-off plan at full load (slots, extra share), where a lone sequence decodes with
    /// more: a server lends its idle rows' memory to the cache (`PlanInputs::lent_to`), so
    /// the fields above are one client's and these the `width` rows'.
    pub full_load: Option<(usize, f64)>,
}

/// A curve (hit rate and the like) at a plan's slots: `c` on a share `1 − f` of the layers,
/// `c + 1` on the rest. The layers gain alike from a slot on average, so the two mix linearly.
fn at_slots(c: usize, f: f64, curve: impl Fn(usize) -> (f64, f64)) -> (f64, f64) {
    let a = curve(c);
    if f <= 0.0 {
        return a;
    }
    let b = curve(c + 1);
    (a.0 + f * (b.0 - a.0), a.1 + f * (b.1 - a.1))
}

/// `nectar fit --project`.
pub fn run(a: &FitArgs, budget: u64) -> Result<()> {
    let full = compute(a, budget, &Effort::FIT)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&full)?);
        return Ok(());
    }
    print!("{}", render(&full));
    Ok(())
}

/// The projection of `fit --project` as JSON (`nectar doctor` reports the same).
pub fn compute(a: &FitArgs, budget: u64, effort: &Effort) -> Result<serde_json::Value> {
    let trace_dir = a
        .trace
        .clone()
        .unwrap_or_else(super::bench_policy::default_trace_dir);
    let trace = Trace::load(&trace_dir, "decode")?;
    // Every lane of a projected batch needs a conversation of its own (`served`).
    anyhow::ensure!(
        a.parallel <= trace.segments.len().max(1),
        "--parallel {} projects that many conversations decoded together, but the decode \
         trace of {} holds {} (route256's has 24)",
        a.parallel,
        trace_dir.display(),
        trace.segments.len()
    );
    // `--gpu-memory`: the card's speeds (flags), and below the VRAM plan `run` applies (a
    // container's, from its headers, or GLM-5.2's from its constants). The RAM plans count
    // only the spine left on the CPU: a spine matrix in VRAM releases its host copy.
    let speeds = match &a.gpu_memory {
        Some(_) => Some(GpuTier::speeds(a.gpu_gbps, a.gpu_product_us)?),
        None => None,
    };
    let gpu_prefill = GpuTier::prefill_speeds(a.gpu_prefill_us, a.gpu_attn_tflops)?;
    anyhow::ensure!(
        gpu_prefill.is_none() || a.gpu_memory.is_some(),
        "--gpu-prefill-us projects prefill on the GPU tier: it needs --gpu-memory SIZE"
    );
    let (geom, inputs, model_dir, gpu) = match a.geometry.as_deref().map(Glm52::parse) {
        Some(enc) => {
            let enc = enc?;
            let cores = a.cores.unwrap_or_else(rayon::current_num_threads);
            let opts = |mtp: bool| LoadOptions {
                mtp,
                ..super::fit::load_options(a, budget)
            };
            let geom = Geometry::glm52(enc, &opts(true), cores).0;
            let gpu = match (&a.gpu_memory, speeds) {
                (Some(flag), Some((gbps, trip))) => {
                    let req = super::gpu_flag::resolve(Some(flag))?.ok_or_else(|| {
                        anyhow::anyhow!("--gpu-memory off: nothing to project on a GPU")
                    })?;
                    let vram = nectar_model::arch::glm5::resolve_gpu_budget(req)
                        .map_err(|e| anyhow::anyhow!("--gpu-memory {flag}: {e}"))?;
                    Some(GpuTier::glm52(enc, &geom, vram, gbps, trip))
                }
                _ => None,
            };
            let plans = [false, true].map(|mtp| {
                let mut p = Geometry::glm52(enc, &opts(mtp), cores).1;
                if let Some(t) = &gpu {
                    t.release_spine(&mut p);
                }
                p
            });
            (geom, plans, None, gpu)
        }
        None => {
            let dir = crate::demo::model_dir(a.model.clone())?;
            let (gpu_memory, pin) = super::fit::gpu_options(&dir, a.gpu_memory.as_deref())?;
            let plan_for = |mtp: bool, gpu: bool| -> Result<MemoryPlan> {
                let opts = LoadOptions {
                    mtp,
                    gpu_memory: gpu_memory.filter(|_| gpu),
                    pin: pin.clone().filter(|_| gpu),
                    ..super::fit::load_options(a, budget)
                };
                Ok(plan_memory(&dir, &opts)?)
            };
            let (off, on) = (plan_for(false, true)?, plan_for(true, true)?);
            let gpu = match (on.gpu.as_ref(), speeds) {
                (Some(p), Some((gbps, trip))) => Some(GpuTier::from_plan(p, gbps, trip)),
                _ => None,
            };
            let cfg: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.join("config.json"))?)?;
            let k = cfg["num_experts_per_tok"].as_u64().unwrap_or(8) as usize;
            // The spine the model reads per forward: all of it, wherever it is held.
            let whole = match gpu {
                Some(_) => plan_for(true, false)?.inputs,
                None => on.inputs.clone(),
            };
            let geom = Geometry::from_plan(&dir, &whole, k)?;
            (geom, [off.inputs, on.inputs], Some(dir), gpu)
        }
    };
    anyhow::ensure!(
        a.gpu_copy_gbps.is_none() || a.gpu_memory.is_some(),
        "--gpu-copy-gbps projects expert copies to the GPU tier: it needs --gpu-memory SIZE"
    );
    let gpu = gpu.map(|t| GpuTier {
        prefill: gpu_prefill,
        copy_bps: a.gpu_copy_gbps.map(|g| g * 1e9),
        ..t
    });
    anyhow::ensure!(
        a.disk_gbps.is_some() || model_dir.is_some(),
        "--geometry has no files to measure the disk with: pass --disk-gbps (or --model)"
    );
    // `run --mtp off` plans without the MTP layer, `--mtp on` with it: each projection uses
    // its own plan's slots.
    // A server decodes a lone client with its idle rows' memory (and between prompts the
    // prompt transients and the bank's spare slots) lent to the cache.
    let opts = super::fit::load_options(a, budget);
    let lone = |p: &PlanInputs| match a.serve {
        true => nectar_model::arch::glm5::lent_inputs(
            p,
            nectar_model::arch::glm5::serve_sequences(1),
            false,
            geom.top_k,
            &opts,
        ),
        false => p.clone(),
    };
    let p_full = plan(&inputs[0]).context("the memory plan (MTP off)")?;
    let p_off = plan(&lone(&inputs[0])).context("the memory plan (MTP off)")?;
    let p_on = plan(&lone(&inputs[1])).context("the memory plan (MTP on)")?;
    let threads = rayon::current_num_threads();
    let t0 = Instant::now();
    // The disk sample first, in a quiet process: read right after the calibration's model was
    // dropped, it measured 1.0–1.8 GB/s where it reads 3.1–3.3 (a quiet machine, the same
    // experts, minutes apart; benchmarks/RESULTS.md, "The projection validated on a quiet
    // machine"). It is the rate projected only without a calibration ([`disk_rate`]); beside one
    // it is printed as the cross-check that showed a sample 1.8× off what a decode gets.
    let mut disk_direct = None;
    let disk_sample = match (a.disk_gbps, &model_dir) {
        (Some(d), _) => d,
        (None, Some(dir)) => {
            let (g, d, n) = measure_disk(dir, a.io_threads, effort.disk_secs)?;
            disk_direct = Some((d, n));
            g
        }
        (None, None) => anyhow::bail!("no disk speed to project with"),
    };
    // Measure only what the flags leave open: the kernel (its decode GB/s, its share of the
    // read rate, its prefill GFLOP/s) and the read reference (the share's denominator).
    let kernel = if a.mem_gbps.is_none() || a.kernel_share.is_none() || a.gflops.is_none() {
        Some(measure_kernel(effort)?)
    } else {
        None
    };
    // The read reference is the denominator of the kernel's share: a kernel that streams faster
    // means the reference read low (a busy moment), so it is measured again, best kept, up to
    // three more times; past that the kernel's own rate is the best this memory was seen to do
    // and becomes the reference (`read_reference`), never a share above 1 clamped away.
    let mut read_from = "read";
    let read = if a.mem_gbps.is_none() || a.kernel_share.is_none() {
        let mut best = measure_read(threads, effort)?;
        if let Some((k, _)) = kernel {
            for _ in 0..3 {
                if best >= k {
                    break;
                }
                best = best.max(measure_read(threads, effort)?);
            }
            if best < k {
                (best, read_from) = (k, "kernel");
            }
        }
        Some(best)
    } else {
        None
    };
    let share = match (a.kernel_share, read, kernel) {
        (Some(s), _, _) => s,
        (None, Some(m), Some((k, _))) => k / m,
        _ => anyhow::bail!("no kernel share to project with"),
    };
    let measured = |what: Option<f64>, name: &str| {
        what.ok_or_else(|| anyhow::anyhow!("{name} was neither given nor measured"))
    };
    let dec_here = kernel.map(|k| k.0);
    // The per-layer compute: given, or calibrated on a container of this geometry by a short
    // decode on this machine (scaled to --cores).
    let calib_dir = match (&a.geometry, &a.calibrate) {
        (Some(_), Some(d)) => Some(d.clone()),
        (None, _) => model_dir.clone(),
        (Some(_), None) => None,
    };
    let mut calibration = None;
    let prefetch = Prefetch::parse(&a.prefetch)
        .with_context(|| format!("unknown --prefetch `{}`", a.prefetch))?;
    // A figure for a prefetch the projection does not model would be silently ignored.
    let la_flag = a.lookahead_hidden.is_some() || a.lookahead_cancelled.is_some();
    anyhow::ensure!(
        !la_flag || prefetch == Prefetch::Lookahead,
        "--lookahead-hidden and --lookahead-cancelled project --prefetch lookahead, not `{}` \
         (`both`, the default, is projected as PILOT: --pilot-busy, --pilot-waste)",
        prefetch.as_str()
    );
    let pilot_flag = a.pilot_busy.is_some() || a.pilot_waste.is_some();
    anyhow::ensure!(
        !pilot_flag || prefetch.reads_predicted_layer(),
        "--pilot-busy and --pilot-waste project --prefetch pilot or both, not `{}`",
        prefetch.as_str()
    );
    // Look-ahead's r and cancelled share need a second decode with look-ahead on, PILOT's b
    // and waste one with PILOT on: only where it is projected.
    let second = match prefetch {
        Prefetch::Lookahead if a.lookahead_hidden.is_none() || a.lookahead_cancelled.is_none() => {
            Prefetch::Lookahead
        }
        p if p.reads_predicted_layer() && (a.pilot_busy.is_none() || a.pilot_waste.is_none()) => p,
        _ => Prefetch::Off,
    };
    let wanted =
        a.layer_overhead_ms.is_none() || a.moe_overlap.is_none() || second != Prefetch::Off;
    if let (true, Some(dir), true) = (wanted, calib_dir, effort.calibrate_tokens > 0) {
        // The container's own geometry and a budget it runs under (a --geometry budget is
        // the projected machine's, not this one's).
        let cb = if a.geometry.is_some() {
            CALIBRATE_BUDGET
        } else {
            budget
        };
        let opts = LoadOptions {
            memory_budget: Some(cb),
            ..Default::default()
        };
        let ci = plan_memory(&dir, &opts)?.inputs;
        let cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json"))?)?;
        let k = cfg["num_experts_per_tok"].as_u64().unwrap_or(8) as usize;
        let cg = Geometry::from_plan(&dir, &ci, k)?;
        let dec = match dec_here {
            Some(d) => d,
            None => measure_kernel(effort)?.0,
        };
        // PILOT's predictions are the trace model's (the container's early router means
        // nothing against replayed routes), made over the texts the calibration decodes: its
        // rows start at the first segment (its prompt, then its decode steps).
        let predicted = match second {
            p if p.reads_predicted_layer() => {
                let model = match &a.predictor {
                    Some(p) => p.clone(),
                    None => super::bench_decode::default_predictor(&trace_dir)?,
                };
                let first = trace.segments.first().map_or(0, |s| s.start);
                let prompt = super::project_calibrate::prompt_rows(&trace, second);
                let before = first + prompt + effort.calibrate_tokens;
                Some(super::bench_pilot::predictions(&trace, &model, before)?.predicted)
            }
            _ => None,
        };
        let second = match (second, predicted.as_deref()) {
            (Prefetch::Lookahead, _) => Second::Lookahead,
            (m, Some(p)) if m.reads_predicted_layer() => Second::Pilot(p, m),
            _ => Second::None,
        };
        calibration = Some(calibrate(
            &dir,
            cb,
            &cg,
            dec,
            &trace,
            effort.calibrate_tokens,
            second,
        )?);
    }
    let (disk_gbps, disk_reference) = match a.disk_gbps {
        Some(d) => (d, "flag"),
        None => disk_rate(disk_sample, calibration.as_ref().and_then(|c| c.read_gbps)),
    };
    let layer_overhead_s = match (a.layer_overhead_ms, &calibration) {
        (Some(ms), _) => ms / 1e3,
        (None, Some(c)) => {
            c.layer_overhead_s * a.cores.map_or(1.0, |c| threads as f64 / c.max(1) as f64)
        }
        _ => 0.0,
    };
    // Without a flag or a measurement, no overlap: the conservative end (docs/performance.md
    // §2.2.1 has the measurements).
    let moe_overlap = match (a.moe_overlap, &calibration) {
        (Some(e), _) => e,
        (None, Some(c)) => c.moe_overlap.unwrap_or(0.0),
        _ => 0.0,
    };
    // Without a flag or a measurement, reads ahead get no credit (a pure cost: their wasted
    // reads), the conservative end.
    let lookahead_hidden = match (a.lookahead_hidden, &calibration) {
        (Some(r), _) => r,
        (None, Some(c)) => c.lookahead_hidden.unwrap_or(0.0),
        _ => 0.0,
    };
    // Prefill's attention core, timed on the model's own code at its dimensions (about a
    // second); only the attention term of the prefill projection uses it.
    let attn_here = match a.attn_gflops {
        Some(_) => f64::NAN,
        None => measure_attention_gflops(&geom.attn, ATTN_PROBE_ROWS, 2),
    };
    // Without a flag or a measurement, every wrong guess is read: the conservative end.
    let lookahead_cancelled = match (a.lookahead_cancelled, &calibration) {
        (Some(c), _) => c,
        (None, Some(c)) => c.lookahead_cancelled.unwrap_or(0.0),
        _ => 0.0,
    };
    // Without a flag or a measurement, PILOT's reads get no credit and waste nothing: its
    // projection is then `off`'s at PILOT's slots.
    let pilot_busy = match (a.pilot_busy, &calibration) {
        (Some(b), _) => b,
        (None, Some(c)) => c.pilot_busy.unwrap_or(0.0),
        _ => 0.0,
    };
    let pilot_waste = match (a.pilot_waste, &calibration) {
        (Some(w), _) => w,
        (None, Some(c)) => c.pilot_waste.unwrap_or(0.0),
        _ => 0.0,
    };
    let machine = Machine {
        layer_overhead_s,
        moe_overlap,
        lookahead_hidden,
        lookahead_cancelled,
        pilot_busy,
        pilot_waste,
        mem_gbps: match a.mem_gbps {
            Some(g) => g,
            None => measured(read, "the read rate")?,
        },
        dec_gbps: match a.mem_gbps {
            Some(g) => g * share,
            None => measured(kernel.map(|k| k.0), "the kernel rate")?,
        },
        disk_gbps,
        attn_gflops: match a.attn_gflops {
            Some(g) => g,
            None => attn_here * a.cores.map_or(1.0, |c| c as f64 / threads as f64),
        },
        gflops: match a.gflops {
            Some(g) => g,
            None => {
                measured(kernel.map(|k| k.1), "the prefill rate")?
                    * a.cores.map_or(1.0, |c| c as f64 / threads as f64)
            }
        },
    };
    let mut out = project(
        &geom,
        &machine,
        Slots {
            mtp_off: p_off.lru_per_layer,
            mtp_on: p_on.lru_per_layer,
            extra_off: p_off.lru_extra_share(),
            extra_on: p_on.lru_extra_share(),
            full_load: (p_full.lru_bytes != p_off.lru_bytes)
                .then(|| (p_full.lru_per_layer, p_full.lru_extra_share())),
        },
        &trace,
        a.acceptance,
        prefetch,
        gpu.as_ref(),
        a.parallel.max(1),
    );
    if let Some(n) = a.context {
        anyhow::ensure!(
            n <= geom.max_context,
            "--context {n}: the model takes at most {} tokens (max_position_embeddings)",
            geom.max_context
        );
        // Twice the last-level cache read between timed calls: the KV cache comes from RAM.
        let evict = (2 * crate::machine::llc_bytes().0).clamp(64 << 20, 1 << 30);
        let cost = measure_decode_context(&geom.attn, n, CONTEXT_PASSES, evict);
        let per_row =
            cost.per_row_s(&geom.attn) * a.cores.map_or(1.0, |c| threads as f64 / c.max(1) as f64);
        out["context"] = at_context(&out, n, per_row, a.acceptance);
        // A batch forward of N rows pays each row's longer attention: N/(N/x + N·a).
        if let Some(all) = out["parallel"]["decode_tok_s"].as_f64() {
            out["context"]["parallel_decode_tok_s"] = json!(1.0 / (1.0 / all + per_row));
        }
        out["context"]["attend_ms_per_layer"] = json!(cost.attend_s * 1e3);
        out["context"]["index_ms_per_indexer_layer"] = json!(cost.index_s * 1e3);
    }
    let full = json!({
        "geometry": geom.source,
        "budget": budget,
        "machine": {
            "read_gbps": machine.mem_gbps,
            "decode_kernel_gbps": machine.dec_gbps,
            "kernel_share_of_read_bandwidth": share,
            "read_reference": read.map(|_| read_from),
            "disk_gbps": machine.disk_gbps,
            "disk_reference": disk_reference,
            "disk_direct_shards": disk_direct.map(|(d, n)| json!({"direct": d, "of": n})),
            "prefill_gflops": machine.gflops,
            "attention_gflops": machine.attn_gflops,
            "layer_overhead_ms": machine.layer_overhead_s * 1e3,
            "moe_overlap": machine.moe_overlap,
            "lookahead_hidden": machine.lookahead_hidden,
            "lookahead_cancelled": machine.lookahead_cancelled,
            "pilot_busy": machine.pilot_busy,
            "pilot_waste": machine.pilot_waste,
            "calibration": calibration.map(|c| c.record),
            "measured_here": {"read_gbps": read, "kernel_gbps": kernel.map(|k| k.0),
                              "disk_sample_gbps": a.disk_gbps.is_none().then_some(disk_sample),
                              "gflops": kernel.map(|k| k.1),
                              "attention_gflops": a.attn_gflops.is_none().then_some(attn_here),
                              "threads": threads, "seconds": t0.elapsed().as_secs_f64()},
        },
        "trace": trace.path.display().to_string(),
        "projection": out,
    });
    Ok(full)
}

/// Passes of the long-context probe (best kept): on 16 cores three passes left the attention's
/// share 20 % apart between two contexts that attend to the same 2,048 keys; with seven, three
/// fits at 4k tokens agreed within 2 % (RESULTS, "Decode after a long prompt, projected").
const CONTEXT_PASSES: usize = 7;

/// Decode after a `tokens`-token context: each decoded row also pays `per_row_s` of attention
/// beyond the calibration's short context (a verify forward with MTP on has two rows). The
/// time is added, not overlapped: reads that look-ahead starts during the longer attention are
/// not credited, so the figure errs low when the disk is the bound.
fn at_context(
    projection: &serde_json::Value,
    tokens: usize,
    per_row_s: f64,
    acceptance: f64,
) -> serde_json::Value {
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    let (off, on) = (
        f(&projection["decode_tok_s"]["mtp_off"]),
        f(&projection["decode_tok_s"]["mtp_on"]),
    );
    let tau = 1.0 + acceptance;
    json!({
        "tokens": tokens,
        "base_keys": CONTEXT_BASE_KEYS,
        "attention_ms_per_row": per_row_s * 1e3,
        "decode_tok_s": {
            "mtp_off": 1.0 / (1.0 / off + per_row_s),
            "mtp_on": tau / (tau / on + 2.0 * per_row_s),
        },
    })
}

/// The text report of a [`compute`] result.
pub fn render(full: &serde_json::Value) -> String {
    let o = &full["projection"];
    let m = &full["machine"];
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    // `13` or, with the plan's last partial row, `13–14 (14 on 75 % of layers)`.
    let words = |c: &serde_json::Value, x: &serde_json::Value| {
        let (c, x) = (c.as_u64().unwrap_or(0), f(x));
        if x > 0.0 {
            format!("{c}–{} ({} on {:.0} % of layers)", c + 1, c + 1, 100.0 * x)
        } else {
            c.to_string()
        }
    };
    let x = &o["lru_extra_slot_share"];
    let slots = words(&o["lru_slots_per_layer"], &x["mtp_off"]);
    let share = |p: &str| {
        let t = &o["prefill_seconds"][p];
        100.0 * f(&t["attention_s"])
            / (f(&t["products_s"]) + f(&t["attention_s"]) + f(&t["reads_s"]))
    };
    let mut s = format!(
        "projection for {} under {} ({slots} LRU slots per layer; {} with the MTP layer loaded)\n",
        full["geometry"].as_str().unwrap_or(""),
        nectar_residency::planner::human(full["budget"].as_u64().unwrap_or(0)),
        words(&o["lru_slots_per_layer_mtp_on"], &x["mtp_on"]),
    );
    s += &format!(
        "  machine: decode kernel {:.1} GB/s (read {:.1} GB/s), disk {:.2} GB/s{}, prefill {:.0} GFLOP/s (attention {:.1})\n",
        f(&m["decode_kernel_gbps"]), f(&m["read_gbps"]), f(&m["disk_gbps"]),
        if m["disk_reference"] == "calibration" {
            format!(
                " (the calibration decode's reads; a 2 s sample read {:.2})",
                f(&m["measured_here"]["disk_sample_gbps"])
            )
        } else {
            String::new()
        },
        f(&m["prefill_gflops"]),
        f(&m["attention_gflops"])
    );
    s += &format!(
        "  hit rate {:.3} (route256 replay at {slots} slots), {:.2} GB/token from disk, bound: {}\n",
        f(&o["hit_rate"]["mtp_off"]),
        f(&o["ssd_gb_per_token"]["mtp_off"]),
        o["bound"].as_str().unwrap_or("")
    );
    s += &format!(
        "  decode: {:.2} tok/s (MTP off{}), {:.2} tok/s (MTP on, acceptance {}), RAM wall {:.2}\n",
        f(&o["decode_tok_s"]["mtp_off"]),
        match o["decode_tok_s_without_lookahead"].as_f64() {
            Some(x) => format!(
                "; {x:.2} without {}",
                match o["prefetch"]["mode"].as_str() {
                    Some("pilot") => "PILOT",
                    Some("both") => "look-ahead and PILOT",
                    _ => "look-ahead",
                }
            ),
            None => String::new(),
        },
        f(&o["decode_tok_s"]["mtp_on"]),
        o["acceptance"],
        f(&o["ram_wall_tok_s"])
    );
    let pilot = &o["prefetch"]["pilot"];
    s += &match pilot.is_object() {
        true => format!(
            "  compute beyond weight streaming: {:.2} ms per layer; {} prefetch: the disk busy through {:.0} % of the predicted layers' attention ({:.0} % of all attention), {:.3} wrong guesses read per needed read\n",
            f(&o["layer_overhead_ms"]),
            match o["prefetch"]["mode"].as_str() {
                Some("both") => "look-ahead and PILOT",
                _ => "PILOT",
            },
            100.0 * f(&pilot["busy_in_attention"]),
            100.0 * f(&pilot["predicted_attention_share"]),
            f(&pilot["wasted_per_read"])
        ),
        false => format!(
            "  compute beyond weight streaming: {:.2} ms per layer; look-ahead prefetch: {} (reads {:.0} % of the misses ahead, {:.2} wrong guesses per miss of which {:.0} % are cancelled unread, {:.0} % of the reads ahead hidden behind attention)\n",
            f(&o["layer_overhead_ms"]),
            if o["prefetch"]["lookahead"].as_bool() == Some(true) { "on" } else { "off" },
            100.0 * f(&o["prefetch"]["coverage"]),
            f(&o["prefetch"]["wasted_per_miss"]),
            100.0 * f(&o["prefetch"]["wrong_guesses_cancelled"]),
            100.0 * f(&o["prefetch"]["hidden_in_attention"])
        ),
    };
    s += &format!(
        "  overlap ceiling (reads also hidden behind attention): {:.2} tok/s (one row a forward), {:.2} with MTP on\n",
        f(&o["overlap_ceiling_tok_s"]),
        f(&o["overlap_ceiling_tok_s_mtp_on"])
    );
    if let Some(b) = o["parallel"].as_object() {
        s += &format!(
            "  {} sequences decoded together (serve --parallel, MTP off, {} LRU slots a layer): {:.2} \
             tok/s in all, {:.2} per sequence ({:.2}× a lone client): hit rate {:.3}, {:.1} experts \
             per layer a step, {:.2} GB/token from disk, RAM wall {:.2}\n",
            b["sequences"],
            b["lru_slots_per_layer"],
            f(&b["decode_tok_s"]),
            f(&b["decode_tok_s_per_sequence"]),
            f(&b["gain_over_one_sequence"]),
            f(&b["hit_rate"]),
            f(&b["unique_experts_per_layer"]),
            f(&b["ssd_gb_per_token"]),
            f(&b["ram_wall_tok_s"]),
        );
    }
    if let Some(c) = o["context"].as_object() {
        s += &format!(
            "  decode after {} tokens of context: {:.2} tok/s (MTP off), {:.2} (MTP on){}: {:.1} ms \
             more attention per token ({:.2} ms per layer, {:.2} more per indexer layer)\n",
            c["tokens"],
            f(&c["decode_tok_s"]["mtp_off"]),
            f(&c["decode_tok_s"]["mtp_on"]),
            match c.get("parallel_decode_tok_s").and_then(|v| v.as_f64()) {
                Some(x) => format!(", {x:.2} in all with {} sequences", o["parallel"]["sequences"]),
                None => String::new(),
            },
            f(&c["attention_ms_per_row"]),
            f(&c["attend_ms_per_layer"]),
            f(&c["index_ms_per_indexer_layer"]),
        );
    }
    if let Some(g) = o["gpu"].as_object() {
        s += &format!(
            "  GPU ({} of VRAM): spine {} in {:.0} products per forward ({} of RAM released to \
             the expert slots), {} experts per layer (ranked by {}); kernels {:.0} GB/s, {:.0} µs \
             per product; {:.2} of a layer's {:.2} experts per forward on the GPU\n",
            nectar_residency::planner::human(f(&g["budget"]) as u64),
            nectar_residency::planner::human(f(&g["spine_bytes"]) as u64),
            f(&g["spine_products"]),
            nectar_residency::planner::human(f(&g["ram_released_bytes"]) as u64),
            g["experts_per_layer"],
            g["vram_ranking"].as_str().unwrap_or("-"),
            f(&g["kernel_gbps"]),
            f(&g["product_us"]),
            f(&g["experts_per_forward"]["gpu"]),
            f(&g["experts_per_forward"]["gpu"]) + f(&g["experts_per_forward"]["ram_tier"]),
        );
    }
    let gp = &o["gpu"]["prefill"];
    if gp.is_object() {
        let tok = |p: &str| f(&gp[p]["tok_s"]);
        let reads = |p: &str| 100.0 * f(&gp[p]["reads_s"]) * tok(p) / p.parse().unwrap_or(1.0);
        s += &format!(
            "  prefill on the GPU: {:.1} / {:.1} / {:.1} tok/s for 512 / 2048 / 8192-token \
             prompts (expert reads {:.0} / {:.0} / {:.0} % of the time)\n",
            tok("512"),
            tok("2048"),
            tok("8192"),
            reads("512"),
            reads("2048"),
            reads("8192"),
        );
    }
    s += &format!(
        "  prefill{}: {:.1} / {:.1} / {:.1} tok/s for 512 / 2048 / 8192-token prompts \
         (attention {:.0} / {:.0} / {:.0} % of the time)\n",
        // With the GPU tier this is the CPU's figure: say so.
        if o["gpu"].is_object() {
            " on the CPU"
        } else {
            ""
        },
        f(&o["prefill_tok_s"]["512"]),
        f(&o["prefill_tok_s"]["2048"]),
        f(&o["prefill_tok_s"]["8192"]),
        share("512"),
        share("2048"),
        share("8192"),
    );
    s
}

#[cfg(test)]
mod tests {
    use super::{at_context, disk_rate};
    use serde_json::json;

    #[test]
    fn a_long_context_adds_its_attention_to_every_decoded_row() {
        // 10 tok/s off and 15 on (τ = 1.5: 0.1 s per verify forward and draft); 10 ms more
        // per row: 0.11 s per token off, 0.12 per forward of two rows on.
        let p = json!({"decode_tok_s": {"mtp_off": 10.0, "mtp_on": 15.0}});
        let c = at_context(&p, 8192, 0.01, 0.5);
        let f = |k: &str| c["decode_tok_s"][k].as_f64().unwrap();
        assert!((f("mtp_off") - 1.0 / 0.11).abs() < 1e-9, "{c}");
        assert!((f("mtp_on") - 1.5 / 0.12).abs() < 1e-9, "{c}");
        assert_eq!(c["tokens"], 8192);
        assert!((c["attention_ms_per_row"].as_f64().unwrap() - 10.0).abs() < 1e-9);
    }

    #[test]
    fn the_disk_rate_is_the_calibration_decodes_own() {
        // A sample taken while the disk was busy elsewhere: the decode's reads stand.
        assert_eq!(disk_rate(0.5, Some(2.29)), (2.29, "calibration"));
        // A sample faster than a decode's reads (copies from RAM beside the compute): the
        // decode's reads stand too — they are what a decode gets.
        assert_eq!(disk_rate(17.8, Some(9.8)), (9.8, "calibration"));
        // A calibration that read too little to tell says nothing.
        assert_eq!(disk_rate(1.7, None), (1.7, "sample"));
    }
}
