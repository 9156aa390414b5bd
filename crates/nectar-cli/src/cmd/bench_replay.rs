//! `nectar bench replay`: a recorded routing trace drives the real model. The container (a
//! GLM-5.2-geometry synth: `nectar synth --layers 8 --mtp`) runs its actual forward pass —
//! attention, the resident spine, MoE through the residency manager and its I/O workers, the
//! kernels — but each MoE layer takes its experts for each token from the trace instead of
//! its (random-weight) router, through the benchmark-only `Observer::replay_route` hook. So
//! the cache sees GLM-5.2-shaped routing (route256: 256 experts, top-8, real text) while the
//! bytes, kernels and disk are GLM-5.2's.
//!
//! Each decode step computes its rows' logits (and the draft's MTP logits), as decoding does.
//! Per budget and speculation mode the model is loaded afresh (cold cache) and replays
//! `--conversations` segments spread evenly over the trace (`Trace::spread`: its domains, not
//! its first texts): each prompt in one prefill forward, then up
//! to `--tokens` decode steps. With `--mtp on` a step verifies two rows (the token and its
//! draft) in one main forward and runs the MTP layer over the accepted rows; whether the draft
//! is accepted is drawn with `--acceptance` (seeded), and a rejected row is rolled back, as
//! the speculative decoder does. Reported: decode and prefill tok/s, the residency's hit rate
//! over decode steps against Belady-OPT with bypass on the very requests this run made (same
//! capacity), GB read per token, the I/O workers' busy and compute's wait fractions, and two
//! bounds — disk-bound tok/s = raw GB/s ÷ Belady's GB per token (the least any policy must
//! read), raw GB/s measured before and after the run reading the run's own requested experts in
//! the same order; compute-bound tok/s = tokens ÷ (decode seconds − seconds waiting for
//! misses); and the expert union per decode step (`expert_union`): distinct experts per MoE
//! layer with the draft row against the plain row alone, the union growth per verify.
use super::bench_io::RawReader;
use super::trace_routes::TraceRoutes;
use crate::args::BenchReplayArgs;
use anyhow::{Context, Result};
use nectar_engine::{Batch, BatchOptions, Request, UnionCounts, UnionMeter};
use nectar_model::arch::glm5::{expert_layouts, serve_sequences, GpuMemory, LoadOptions, Prefetch};
use nectar_model::{Glm5, MtpStep, Observer, SeqStep};
use nectar_residency::io::FileIo;
use nectar_residency::layout::SlotLayout;
use nectar_residency::replay::{belady, replay_setup, CacheSetup, Count, Step};
use nectar_residency::sim::Rng;
use nectar_residency::trace::{Segment, Trace};
use nectar_residency::{ExpertKey, Residency, Telemetry, Tier};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Feeds trace routes to the model and records each forward's per-layer requests.
struct Replayer<'a> {
    routes: TraceRoutes<'a>,
    /// Per model layer: the unique experts each forward requested of the RAM tier.
    requests: HashMap<usize, Vec<Vec<u32>>>,
    /// Per model layer: experts held in VRAM (`--gpu-memory`): computed there, never requested
    /// of the RAM tier, so Belady's reference leaves them out too.
    vram: HashMap<usize, Vec<u32>>,
    /// The union per layer of each decode forward, the draft row apart.
    union: UnionMeter,
}

impl Replayer<'_> {
    /// Starts a forward over `rows` that requests experts of `layers`.
    fn begin(&mut self, rows: Vec<usize>, layers: &[usize]) {
        self.routes.rows = rows;
        for l in layers {
            self.requests.entry(*l).or_default().push(Vec::new());
        }
    }
}

impl Observer for Replayer<'_> {
    fn replay_route(&mut self, layer: usize, row: usize) -> Option<Vec<u32>> {
        let ids = self.routes.replay_route(layer, row)?;
        let vram = self.vram.get(&layer);
        if let Some(u) = self.requests.get_mut(&layer).and_then(|v| v.last_mut()) {
            for &e in &ids {
                if !u.contains(&e) && !vram.is_some_and(|v| v.contains(&e)) {
                    u.push(e);
                }
            }
        }
        Some(ids)
    }

    fn replay_prediction(&mut self, layer: usize, row: usize) -> Option<Vec<u32>> {
        self.routes.replay_prediction(layer, row)
    }

    fn router(&mut self, layer: usize, row: usize, ids: &[u32], weights: &[f32]) {
        self.union.router(layer, row, ids, weights);
    }
}

/// The `pilot` arm's predictor: the trace's model and what it predicted for every row.
struct Pilot {
    model: std::path::PathBuf,
    predictions: super::bench_pilot::TracePredictions,
}

/// A step of the runtime's step model: `rows` in one forward, counted when it is a decode step.
fn step(rows: std::ops::Range<usize>, counted: bool) -> Step {
    Step {
        rows,
        counted,
        reset: false,
        turn: false,
    }
}

/// Hits and misses of the main layers (or the MTP tier) between two snapshots: a request a
/// prefetch had started reading counts as a miss (the cache did not hold it; the read only
/// started earlier), so hit rates compare with Belady's whatever the prefetch.
fn delta(a: &Telemetry, b: &Telemetry) -> (u64, u64, u64, f64, f64) {
    let (mut h, mut m) = (0, 0);
    for (i, l) in b.layers.iter().enumerate() {
        let p = a.layers.get(i).cloned().unwrap_or_default();
        let used = l.prefetch_hits - p.prefetch_hits;
        h += l.hits - p.hits - used;
        m += l.misses - p.misses + used;
    }
    (
        h,
        m,
        b.bytes_read - a.bytes_read,
        b.disk_seconds - a.disk_seconds,
        b.wait_seconds - a.wait_seconds,
    )
}

/// Prefetches (reads started ahead, requested, dropped unrequested after their read, cancelled
/// before it) of the main layers between two snapshots.
fn prefetch_delta(a: &Telemetry, b: &Telemetry) -> [u64; 4] {
    let sum = |t: &Telemetry, f| Telemetry::layer_sum(t, f);
    [
        sum(b, |l| l.read_ahead()) - sum(a, |l| l.read_ahead()),
        sum(b, |l| l.prefetch_hits) - sum(a, |l| l.prefetch_hits),
        sum(b, |l| l.prefetch_dropped) - sum(a, |l| l.prefetch_dropped),
        sum(b, |l| l.prefetch_cancelled) - sum(a, |l| l.prefetch_cancelled),
    ]
}

/// `--admission` as the residency's policy (the frequency policy's half-life: its default).
fn admission(a: &BenchReplayArgs) -> Result<nectar_residency::Admission> {
    super::bench_policy::parse_admission(&a.admission, 64.0)
}

/// The container loaded afresh (a cold cache) under `budget_s`: the model, its expert cache
/// and the budget in bytes, planned as `nectar serve --parallel N` plans memory when `serve`
/// is `Some(N)` (else as `nectar run`). `mtp`: load the MTP layer (as `run --mtp on` does;
/// `--mtp off` leaves it out of memory, and its bytes to the main layers' cache).
fn load_planned(
    a: &BenchReplayArgs,
    budget_s: &str,
    prefetch: Prefetch,
    serve: Option<usize>,
    mtp: bool,
    gpu: GpuArm,
) -> Result<(Glm5, Arc<Residency>, u64)> {
    let budget = super::fit::resolve_budget(Some(budget_s))?;
    let opts = LoadOptions {
        memory_budget: Some(budget),
        io_threads: a.io_threads,
        admission: admission(a)?,
        prefetch,
        sequences: serve.map_or(1, serve_sequences),
        server: serve.is_some(),
        mtp,
        gpu_memory: gpu.memory,
        gpu_copies: gpu.copies,
        ..Default::default()
    };
    let model = Glm5::load_with(&a.model, &opts)
        .with_context(|| format!("loading {} under {budget_s}", a.model.display()))?;
    let res = model
        .residency()
        .cloned()
        .context("no expert streaming under this budget")?;
    Ok((model, res, budget))
}

/// The hit rate the residency's policy code reaches offline over this run's own steps (its
/// trace rows, prompts uncounted and in one step each, decode steps as run), without prefetch,
/// with the run's slots, admission and pins: `bench policy`'s replay
/// (`nectar_residency::replay`) on the runtime's step model. The runtime's own hit rate
/// departs from it only through what the offline replay leaves out (I/O timing, the working
/// bank's waves, prefetch): the two together say whether a gap to the simulator's figures is
/// the runtime's or the workload's, with each layer's slots (the plan's last partial row puts
/// one more on some). `None` with experts in VRAM (they are never requested of the RAM tier).
#[allow(clippy::too_many_arguments)]
fn offline_replay(
    a: &BenchReplayArgs,
    trace: &Trace,
    steps: &[Step],
    obs: &Replayer,
    moe: &[usize],
    res: &Residency,
    pins: &[ExpertKey],
    prompt_lru: Option<Vec<usize>>,
) -> Result<Option<f64>> {
    if obs.vram.values().any(|v| !v.is_empty()) {
        return Ok(None);
    }
    let capacity = least_slots(res, moe);
    let Some(layers) = moe
        .iter()
        .map(|&l| obs.routes.trace_layer(l))
        .collect::<Option<Vec<usize>>>()
    else {
        return Ok(None);
    };
    let setup = CacheSetup {
        capacity,
        extra: moe.iter().map(|&l| res.capacity(l) - capacity).collect(),
        prompt_lru,
        admission: admission(a)?,
        pinned: moe
            .iter()
            .map(|&l| {
                pins.iter()
                    .filter(|k| k.layer as usize == l)
                    .map(|k| k.expert)
                    .collect()
            })
            .collect(),
        repin_swaps: 0,
    };
    let mut c = Count::default();
    for l in replay_setup(trace, steps, &layers, &setup) {
        c.add(l);
    }
    Ok(Some(c.rate()))
}

/// The fewest LRU slots of the streamed main layers (the plan's base; some layers may hold one
/// more).
fn least_slots(res: &Residency, moe: &[usize]) -> usize {
    moe.iter().map(|&l| res.capacity(l)).min().unwrap_or(0)
}

/// Streamed main layers holding more LRU slots than [`least_slots`].
fn layers_with_more(res: &Residency, moe: &[usize]) -> usize {
    let least = least_slots(res, moe);
    moe.iter().filter(|&&l| res.capacity(l) > least).count()
}

/// One run: a budget, a speculation mode.
struct RunOut {
    json: serde_json::Value,
    line: String,
}

#[allow(clippy::too_many_arguments)]
fn run_one(
    a: &BenchReplayArgs,
    trace: &Trace,
    budget_s: &str,
    mtp: bool,
    prefetch: Prefetch,
    gpu: (&str, GpuArm),
    raw: &RawReader,
    layouts: &[Vec<SlotLayout>],
    pilot: Option<&Pilot>,
) -> Result<RunOut> {
    // Only the pilot and both arms replay the trace model's predictions.
    let pilot = pilot.filter(|_| prefetch.reads_predicted_layer());
    // The replayed segments with their sequences; a batch trace replays as `serve --parallel
    // N` decodes N requests, and is planned so.
    let segs: Vec<(&Segment, Vec<u16>)> = trace
        .spread(a.conversations)
        .into_iter()
        .map(|seg| (seg, trace.segment_streams(seg)))
        .collect();
    anyhow::ensure!(!segs.is_empty(), "{}: no segments", trace.path.display());
    let width = segs.iter().map(|(_, s)| s.len()).max().unwrap_or(1);
    anyhow::ensure!(
        !mtp || width == 1,
        "{}: a batch trace ({width} sequences) replays with --mtp off (a verify step is one \
         sequence's)",
        trace.path.display()
    );
    let serve = a.parallel.or((width > 1).then_some(width));
    anyhow::ensure!(
        serve.is_none_or(|p| p >= width),
        "--parallel {}: the trace decodes {width} sequences together",
        serve.unwrap_or(0)
    );
    let (model, res, budget) = load_planned(a, budget_s, prefetch, serve, mtp, gpu.1)?;
    // As `serve` plans its steps: the idle rows (and between prompts the prompt transients
    // and the bank's spare slots) lend their memory to the expert cache.
    let plan_step = |prompt: bool| match serve {
        Some(_) => model
            .use_sequences(serve_sequences(width), prompt)
            .map(drop),
        None => Ok(()),
    };
    // What a cold cache holds is its pins (from a usage ledger beside the container, if any).
    let pins: Vec<ExpertKey> = res
        .placements()
        .into_iter()
        .filter(|p| p.tier == Tier::Pinned)
        .map(|p| p.key)
        .collect();
    if let Some(p) = model.gpu_placement() {
        eprintln!("{}", p.summary);
    }
    anyhow::ensure!(
        !mtp || model.has_mtp(),
        "{} has no MTP layer (nectar synth --mtp writes one)",
        a.model.display()
    );
    let n = model.cfg.raw.num_hidden_layers;
    let moe: Vec<usize> = (0..n).filter(|&l| !model.cfg.dense[l]).collect();
    let mut layers = moe.clone();
    if mtp {
        layers.push(n);
    }
    let vocab = model.vocab_size() as u32;
    let tok = |r: usize| -> u32 { trace.tokens.as_ref().map_or(r as u32, |t| t[r] as u32) % vocab };
    let mut obs = Replayer {
        routes: TraceRoutes::new(&model, trace)?
            .with_predictions(pilot.map(|p| p.predictions.predicted.as_slice())),
        requests: HashMap::new(),
        vram: vram_map(&model),
        union: UnionMeter::default(),
    };
    let mut union = UnionCounts::default();
    // Per forward of the main model: its trace rows and whether it is a decode step.
    let mut steps: Vec<Step> = Vec::new();
    let mut rng = Rng::new(a.seed);
    let (mut dec_s, mut pre_s, mut dec_tok, mut pre_tok, mut n_steps) = (0.0, 0.0, 0usize, 0, 0);
    let (mut drafted, mut accepted) = (0usize, 0usize);
    let mut dec_main = (0u64, 0u64, 0u64, 0.0f64, 0.0f64);
    let mut dec_pf = [0u64; 4];
    // The decode's disk-busy seconds and expert reads (look-ahead's hidden share).
    let (mut dec_busy, mut dec_reads) = (0.0f64, 0u64);
    let mut dec_mtp = (0u64, 0u64, 0u64);
    let mut prompt_lru: Option<Vec<usize>> = None;
    for (seg, streams) in segs {
        // One cache per sequence of the segment (one without a streams file).
        let mut caches: Vec<_> = streams.iter().map(|_| model.new_cache()).collect();
        let cache_of = |r: usize| streams.iter().position(|&s| s == trace.stream(r));
        let prompt_end = seg.start + seg.warmup.max(1);
        plan_step(true)?;
        // The slots prompts run with (fewer than the decode's where serve's plan lends).
        prompt_lru.get_or_insert_with(|| moe.iter().map(|&l| res.capacity(l)).collect());
        // Each sequence's prompt rows in one forward (a run of one stream's rows each).
        let mut p = seg.start;
        while p < prompt_end {
            let q = (p..prompt_end)
                .find(|&r| trace.stream(r) != trace.stream(p))
                .unwrap_or(prompt_end);
            let ids: Vec<u32> = (p..q).map(tok).collect();
            obs.begin((p..q).collect(), &moe);
            steps.push(step(p..q, false));
            let cache = cache_of(p)
                .and_then(|i| caches.get_mut(i))
                .context("a prompt row's sequence")?;
            let t0 = Instant::now();
            model.forward(
                &mut [SeqStep {
                    cache,
                    tokens: &ids,
                }],
                &mut obs,
            )?;
            pre_s += t0.elapsed().as_secs_f64();
            pre_tok += ids.len();
            p = q;
        }
        let hd = model.hidden_size();
        let end = seg.end.min(prompt_end + a.tokens * streams.len());
        let mut t = prompt_end;
        plan_step(false)?;
        let before = res.telemetry();
        let before_mtp = model.mtp_residency().map(|r| r.telemetry());
        let t0 = Instant::now();
        while t < end {
            let rows: Vec<usize> = if streams.len() > 1 {
                // A batch step: the next rows while each is another sequence's, one token each
                // (as `serve` decodes its requests together).
                let mut rows = vec![t];
                while t + rows.len() < end
                    && !rows
                        .iter()
                        .any(|&r| trace.stream(r) == trace.stream(t + rows.len()))
                {
                    rows.push(t + rows.len());
                }
                rows
            } else if mtp && t + 1 < end {
                vec![t, t + 1]
            } else {
                vec![t]
            };
            obs.begin(rows.clone(), &moe);
            // One sequence: row 0 is the token plain decoding runs, row 1 the draft; a batch's
            // rows are all plain.
            obs.union.begin(
                (0..rows.len())
                    .map(|i| i > 0 && streams.len() == 1)
                    .collect(),
            );
            steps.push(step(t..t + rows.len(), true));
            let ids: Vec<u32> = rows.iter().map(|&r| tok(r)).collect();
            let h = if streams.len() > 1 {
                let mut free: Vec<Option<&mut nectar_model::SeqCache>> =
                    caches.iter_mut().map(Some).collect();
                let mut seqs = Vec::with_capacity(rows.len());
                for (i, &r) in rows.iter().enumerate() {
                    let cache = cache_of(r)
                        .and_then(|c| free.get_mut(c))
                        .and_then(Option::take)
                        .context("a batch row's sequence")?;
                    seqs.push(SeqStep {
                        cache,
                        tokens: &ids[i..i + 1],
                    });
                }
                model.forward(&mut seqs, &mut obs)?
            } else {
                model.forward(
                    &mut [SeqStep {
                        cache: &mut caches[0],
                        tokens: &ids,
                    }],
                    &mut obs,
                )?
            };
            union.add(&obs.union.end());
            // Every row's logits, as decoding does (the verify checks the draft with them).
            model.logits(&h)?;
            let advance = if rows.len() == 2 && streams.len() == 1 {
                drafted += 1;
                if rng.unit() < a.acceptance {
                    accepted += 1;
                    2
                } else {
                    let len = caches[0].len();
                    caches[0].truncate(len - 1);
                    1
                }
            } else {
                rows.len()
            };
            if mtp {
                let cache = &mut caches[0];
                // The MTP layer over the accepted rows (hidden of row r, token of row r + 1),
                // drafting the next step's token.
                let acc: Vec<usize> = rows[..advance]
                    .iter()
                    .copied()
                    .filter(|&r| r + 1 < seg.end)
                    .collect();
                if !acc.is_empty() {
                    let next: Vec<u32> = acc.iter().map(|&r| tok(r + 1)).collect();
                    let hs = &h[..acc.len() * hd];
                    obs.begin(acc.clone(), &[n]);
                    let hm = model.mtp_forward(
                        &mut [MtpStep {
                            cache,
                            hidden: hs,
                            next_tokens: &next,
                        }],
                        &mut obs,
                    )?;
                    // The draft comes from the last row's MTP logits.
                    model.mtp_logits(&hm[hm.len() - hd..])?;
                }
            }
            t += advance;
            dec_tok += advance;
            n_steps += 1;
        }
        dec_s += t0.elapsed().as_secs_f64();
        let after = res.telemetry();
        for (t, d) in dec_pf.iter_mut().zip(prefetch_delta(&before, &after)) {
            *t += d;
        }
        dec_busy += after.disk_busy_seconds - before.disk_busy_seconds;
        dec_reads += after.reads - before.reads;
        let d = delta(&before, &after);
        dec_main = (
            dec_main.0 + d.0,
            dec_main.1 + d.1,
            dec_main.2 + d.2,
            dec_main.3 + d.3,
            dec_main.4 + d.4,
        );
        if let (Some(b), Some(r)) = (before_mtp, model.mtp_residency()) {
            let d = delta(&b, &r.telemetry());
            dec_mtp = (dec_mtp.0 + d.0, dec_mtp.1 + d.1, dec_mtp.2 + d.2);
        }
    }
    // Belady on this run's own main-layer requests (prompts uncounted), same capacity.
    let mut opt = Count::default();
    // Belady's bytes: the main layers' experts share one payload size, so misses × that.
    let payload = moe
        .iter()
        .flat_map(|&l| layouts[l].iter())
        .map(|l| l.payload)
        .max()
        .unwrap_or(0);
    let mut seq: Vec<ExpertKey> = Vec::new();
    for &l in &moe {
        let req = &obs.requests[&l];
        opt.add(belady(req, &steps, res.capacity(l)));
    }
    // The requested experts in request order (forward by forward, layer by layer).
    for f in 0..steps.len() {
        for &l in &moe {
            if let Some(u) = obs.requests[&l].get(f) {
                seq.extend(u.iter().map(|&e| ExpertKey::new(l, e as usize)));
            }
        }
    }
    // The fewest slots a layer had while prompts ran (the decode's `lru_slots_per_layer`).
    let prompt_slots = prompt_lru.as_ref().and_then(|c| c.iter().min().copied());
    let offline = offline_replay(a, trace, &steps, &obs, &moe, &res, &pins, prompt_lru)?;
    let opt_bytes = (opt.requests - opt.hits) * payload;
    let raw_before = raw.experts(layouts, &seq, a.raw_seconds)?;
    let raw_after = raw.experts(layouts, &seq, a.raw_seconds)?;
    let (hits, misses, bytes, disk_s, wait_s) = dec_main;
    // The disk's reference is the best it was seen to do: the raw samples around the run, or
    // the decode's own bytes per second of disk busy time where its reads moved faster (on a
    // drifting virtio disk a PILOT run's did: 1.93 GB/s against samples of 1.69–1.73, which
    // would have set a bound below what the run reached).
    let own = match dec_busy > 0.0 {
        true => bytes as f64 / 1e9 / dec_busy,
        false => 0.0,
    };
    let raw = raw_before.max(raw_after).max(own);
    let hit_rate = hits as f64 / (hits + misses).max(1) as f64;
    let opt_rate = opt.rate();
    let tok_s = dec_tok as f64 / dec_s;
    let gb_tok = bytes as f64 / 1e9 / dec_tok.max(1) as f64;
    let opt_gb_tok = opt_bytes as f64 / 1e9 / dec_tok.max(1) as f64;
    let disk_bound = if opt_gb_tok > 0.0 {
        raw / opt_gb_tok
    } else {
        f64::INFINITY
    };
    let compute_bound = dec_tok as f64 / (dec_s - wait_s).max(1e-9);
    // Where the reads landed against the main layers' halves, ms per decoded token.
    let halves = model.decode_disk_overlap();
    let per_tok = |s: f64| s * 1e3 / dec_tok.max(1) as f64;
    let halves_json = json!({
        "attention": per_tok(halves.attention),
        "mlp": per_tok(halves.mlp),
        "disk_busy_attention": per_tok(halves.disk_busy_attention),
        "disk_busy_mlp": per_tok(halves.disk_busy_mlp),
        "predicted_attention": per_tok(halves.predicted_attention),
        "disk_busy_predicted_attention": per_tok(halves.disk_busy_predicted_attention),
    });
    let bound = disk_bound.min(compute_bound);
    let slots = least_slots(&res, &moe);
    let more = layers_with_more(&res, &moe);
    let u = union.stats();
    let union_text = if u.verify_steps > 0 {
        format!(
            "union {:.1}/{:.1} experts per layer (×{:.2})",
            u.verify_experts_per_layer, u.verify_plain_experts_per_layer, u.growth
        )
    } else {
        format!("union {:.1} experts per layer", u.plain_experts_per_layer)
    };
    let pilot_json = pilot.map(|p| {
        json!({
            "predictor": p.model.display().to_string(),
            "recall": p.predictions.recall,
            "precision_by_rank": p.predictions.precision_by_rank,
            "route_agreement_with_trace": p.predictions.route_agreement,
        })
    });
    let mut json = json!({
        "budget": budget_s,
        "budget_bytes": budget,
        "mtp": if mtp { "on" } else { "off" },
        "prefetch": prefetch.as_str(),
        "gpu_memory": gpu.0,
        "gpu": model.gpu_placement().map(|p| p.summary.clone()),
        "expert_runs": model.expert_runs(),
        "copy": model.copy_stats().map(|c| c.json()),
        "lookahead_control": res.telemetry().lookahead,
        "prefetch_issued": dec_pf[0],
        "prefetch_used": dec_pf[1],
        "prefetch_wasted": dec_pf[2],
        "prefetch_coverage": dec_pf[1] as f64 / misses.max(1) as f64,
        "wasted_gb_per_token": dec_pf[2] as f64 * payload as f64 / 1e9 / dec_tok.max(1) as f64,
        "lru_slots_per_layer": slots,
        "conversations": a.conversations.min(trace.segments.len()),
        "prefill_tokens": pre_tok,
        "prefill_tok_s": pre_tok as f64 / pre_s,
        "decode_tokens": dec_tok,
        "decode_steps": n_steps,
        "decode_tok_s": tok_s,
        "drafted": drafted,
        "accepted": accepted,
        "expert_union": union.stats(),
        "hit_rate": hit_rate,
        "belady_hit_rate": opt_rate,
        "hit_ratio_to_belady": if opt_rate > 0.0 { hit_rate / opt_rate } else { 0.0 },
        "policy_replay_hit_rate": offline,
        "mtp_layer_hit_rate": if mtp { Some(dec_mtp.0 as f64 / (dec_mtp.0 + dec_mtp.1).max(1) as f64) } else { None },
        "gb_per_token": gb_tok,
        "mtp_gb_per_token": dec_mtp.2 as f64 / 1e9 / dec_tok.max(1) as f64,
        "belady_gb_per_token": opt_gb_tok,
        "io_busy_fraction": disk_s / a.io_threads as f64 / dec_s,
        "wait_fraction": wait_s / dec_s,
        "raw_gb_s": {"before": raw_before, "after": raw_after, "decode_busy": own},
        "disk_reference_gb_s": raw,
        "disk_bound_tok_s": disk_bound,
        "compute_bound_tok_s": compute_bound,
        "ratio": tok_s / bound,
        "halves_ms_per_token": halves_json,
        // `fit --project`'s r, measured on this run as its calibration measures it.
        "lookahead_hidden": super::project_calibrate::lookahead_hidden(
            halves.disk_busy_attention, dec_busy, dec_pf[0], dec_reads),
    });
    // Beyond the macro's recursion limit in one object.
    json["pilot"] = pilot_json.into();
    json["lru_extra_layers"] = more.into();
    json["batch"] = width.into();
    json["lru_slots_per_layer_prompt"] = prompt_slots.into();
    // The memory plan in force at the end (its decode): `--parallel` above the trace's width
    // lends the idle rows' memory.
    json["sequences"] = match model.sequences_in_use() {
        Some((in_use, planned, prompt)) => {
            serde_json::json!({"in_use": in_use, "planned": planned, "prompt": prompt})
        }
        None => serde_json::Value::Null,
    };
    json["prefetch_cancelled"] = dec_pf[3].into();
    let line = format!(
        "{budget_s:>6} mtp {:<3} prefetch {:<9} gpu {:<5} batch {width} {slots:>3}{:<3} slots  decode {tok_s:6.3} tok/s  prefill {:6.2} tok/s  \
         hit {hit_rate:.3} (offline {}) / Belady {opt_rate:.3}  {union_text}  {gb_tok:.3} GB/tok (Belady {opt_gb_tok:.3})  \
         io-busy {:.2}  wait {:.2}  bounds: disk {disk_bound:.3} compute {compute_bound:.3}  \
         ratio {:.2}  prefetch used {}/{} (coverage {:.2})  per token: attention {:.1} ms (disk busy {:.1}), \
         mlp {:.1} ms (disk busy {:.1})",
        if mtp { "on" } else { "off" },
        prefetch.as_str(),
        gpu.0,
        if more > 0 { format!("+{more}") } else { String::new() },
        pre_tok as f64 / pre_s,
        offline.map_or("-".into(), |h| format!("{h:.3}")),
        disk_s / a.io_threads as f64 / dec_s,
        wait_s / dec_s,
        tok_s / bound,
        dec_pf[1],
        dec_pf[0],
        dec_pf[1] as f64 / misses.max(1) as f64,
        per_tok(halves.attention),
        per_tok(halves.disk_busy_attention),
        per_tok(halves.mlp),
        per_tok(halves.disk_busy_mlp),
    );
    Ok(RunOut { json, line })
}

/// One `--gpu-memory` arm: the VRAM (`off`, a size, `auto`) and, with a `:nocopy` suffix, no
/// staging area — every expert outside the VRAM tier then runs on the CPU (the reference the
/// copies to the GPU are measured against).
#[derive(Debug, Clone, Copy)]
struct GpuArm {
    memory: Option<GpuMemory>,
    copies: bool,
}

fn gpu_arm(s: &str) -> Result<GpuArm> {
    let (size, copies) = match s.strip_suffix(":nocopy") {
        Some(size) => (size, false),
        None => (s, true),
    };
    Ok(GpuArm {
        memory: super::gpu_flag::resolve(Some(size))?,
        copies,
    })
}

/// Per model layer, the experts the load put in VRAM (the replayer never requests them).
fn vram_map(model: &Glm5) -> HashMap<usize, Vec<u32>> {
    model
        .gpu_placement()
        .map(|p| {
            p.vram_experts
                .iter()
                .map(|(l, ids, _)| (*l, ids.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Prefills the first `rows` rows of the `prefill` trace under `budget_s` — in one forward, or
/// through `nectar serve`'s batch (the same `Batch` code, options and memory plan) with
/// `--prefill-chunk` work per step: expert bytes read against one read of every (layer, expert)
/// the prompt touches.
fn prefill_run(
    a: &BenchReplayArgs,
    dir: &std::path::Path,
    budget_s: &str,
    rows: usize,
    gpu: (&str, GpuArm),
) -> Result<serde_json::Value> {
    let trace = Trace::load(dir, "prefill")?;
    anyhow::ensure!(
        rows >= 1 && rows <= trace.rows,
        "--prompt-rows {rows}: the prefill trace has {} rows",
        trace.rows
    );
    let serve = (a.prefill_chunk > 0).then_some(a.parallel.unwrap_or(4));
    // `serve` loads the MTP layer by default (`--mtp auto`); `run` does not.
    let (model, res, _) = load_planned(a, budget_s, Prefetch::Off, serve, serve.is_some(), gpu.1)?;
    if let Some(p) = model.gpu_placement() {
        eprintln!("{}", p.summary);
    }
    let n = model.cfg.raw.num_hidden_layers;
    let moe: Vec<usize> = (0..n).filter(|&l| !model.cfg.dense[l]).collect();
    let mut obs = Replayer {
        routes: TraceRoutes::new(&model, &trace)?,
        requests: HashMap::new(),
        vram: vram_map(&model),
        union: UnionMeter::default(),
    };
    let vocab = model.vocab_size() as u32;
    let tok = |r: usize| trace.tokens.as_ref().map_or(r as u32, |t| t[r] as u32) % vocab;
    let ids: Vec<u32> = (0..rows).map(tok).collect();
    let span = if a.prefill_chunk == 0 {
        rows
    } else {
        model.prefill_span().min(rows)
    };
    let before = res.telemetry();
    let t0 = Instant::now();
    // The replayer's rows are prompt positions: a prefill span numbers its rows so.
    obs.begin((0..rows).collect(), &moe);
    let mut steps = 0;
    if a.prefill_chunk == 0 {
        let mut cache = model.new_cache();
        model.forward(
            &mut [SeqStep {
                cache: &mut cache,
                tokens: &ids,
            }],
            &mut obs,
        )?;
        steps = 1;
    } else {
        let mut batch = Batch::new(BatchOptions {
            max_rows: a.parallel.unwrap_or(4),
            prefill_chunk: a.prefill_chunk,
            prefill_span: model.prefill_span(),
            ..BatchOptions::default()
        });
        batch.admit(&model, None, &[], 0, &Request::new(ids, 1))?;
        while !batch.is_empty() {
            batch.step_observed(&model, None, &mut obs)?;
            steps += 1;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let (_, _, bytes, _, wait) = delta(&before, &res.telemetry());
    let (layouts, _) = expert_layouts(&a.model)?;
    let (mut touched, mut touched_bytes) = (0usize, 0u64);
    for l in &moe {
        let mut all: Vec<u32> = obs.requests[l].iter().flatten().copied().collect();
        all.sort_unstable();
        all.dedup();
        touched += all.len();
        touched_bytes += all
            .iter()
            .map(|&e| layouts[*l][e as usize].payload)
            .sum::<u64>();
    }
    let touched_gb = touched_bytes as f64 / 1e9;
    let read_gb = bytes as f64 / 1e9;
    let runs = model.expert_runs();
    let copy = model.copy_stats();
    if !a.json {
        let copy_text = copy.map_or(String::new(), |c| {
            format!(
                ", copied {:.2} GB at {:.1} GB/s end to end, DMA {:.1} GB/s ({:.2} of pinned {:.1}), {:.0}% hidden",
                c.bytes as f64 / 1e9,
                c.copy_gbps(),
                c.h2d_gbps(),
                c.ratio(),
                c.pinned_bps / 1e9,
                100.0 * c.hidden()
            )
        });
        println!(
            "{budget_s:>6} gpu {:<12} prefill {rows} tokens, prefill chunk {} (span {span}, {steps} steps): {:.2} tok/s, {read_gb:.2} GB read, touched experts {touched_gb:.2} GB, ratio {:.2}, wait {:.2}; experts vram {} copied {} cpu {}{copy_text}",
            gpu.0,
            a.prefill_chunk,
            rows as f64 / secs,
            read_gb / touched_gb.max(1e-12),
            wait / secs,
            runs.vram,
            runs.copied,
            runs.cpu,
        );
    }
    Ok(json!({
        "budget": budget_s,
        "gpu_memory": gpu.0,
        "gpu": model.gpu_placement().map(|p| p.summary.clone()),
        "expert_runs": runs,
        "copy": copy.map(|c| c.json()),
        "lru_slots_per_layer": least_slots(&res, &moe),
        "lru_extra_layers": layers_with_more(&res, &moe),
        "prompt_tokens": rows,
        "chunk": a.prefill_chunk,
        "span": span,
        "steps": steps,
        "prefill_tok_s": rows as f64 / secs,
        "gb_read": read_gb,
        "touched_experts": touched,
        "touched_gb": touched_gb,
        "read_ratio_to_touched": read_gb / touched_gb.max(1e-12),
        "wait_fraction": wait / secs,
    }))
}

pub fn replay(a: BenchReplayArgs) -> Result<()> {
    let dir = a
        .trace
        .clone()
        .unwrap_or_else(super::bench_policy::default_trace_dir);
    let trace = Trace::load(&dir, &a.kind)?;
    anyhow::ensure!(a.conversations >= 1, "--conversations must be at least 1");
    anyhow::ensure!(
        a.tokens >= 1 || !a.prompt_rows.is_empty(),
        "--tokens must be at least 1 (a decode benchmark needs decoded tokens; --prompt-rows \
         measures prefill)"
    );
    let (layouts, paths) =
        expert_layouts(&a.model).with_context(|| format!("reading {}", a.model.display()))?;
    let io = Arc::new(FileIo::open(&paths, true)?);
    // The raw arm's buffers (huge pages, like the slab), allocated once outside every timing.
    let raw = RawReader::new(io, &paths, &layouts, a.io_threads, 32, true)?;
    // The pilot and both arms' predictions, made once by the trace's model over the trace's
    // texts.
    let reads_predicted = a
        .prefetch
        .iter()
        .any(|p| Prefetch::parse(p).is_some_and(Prefetch::reads_predicted_layer));
    let pilot = match reads_predicted && a.prompt_rows.is_empty() {
        true => {
            let model = match &a.predictor {
                Some(p) => p.clone(),
                None => super::bench_decode::default_predictor(&dir)?,
            };
            let predictions = super::bench_pilot::predictions(&trace, &model, usize::MAX)?;
            Some(Pilot { model, predictions })
        }
        false => None,
    };
    let mut runs = Vec::new();
    if !a.prompt_rows.is_empty() {
        for b in &a.memory_budget {
            for &rows in &a.prompt_rows {
                for g in &a.gpu_memory {
                    let gpu = (g.as_str(), gpu_arm(g)?);
                    runs.push(prefill_run(&a, &dir, b, rows, gpu)?);
                }
            }
        }
        if a.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({"prefill": runs}))?
            );
        }
        return Ok(());
    }
    for b in &a.memory_budget {
        for m in &a.mtp {
            let mtp = match m.as_str() {
                "off" => false,
                "on" => true,
                o => anyhow::bail!("unknown --mtp `{o}` (off or on)"),
            };
            for p in &a.prefetch {
                let prefetch = Prefetch::parse(p)
                    .filter(|p| *p != Prefetch::Measure)
                    .with_context(|| {
                        format!("unknown --prefetch `{p}` (off, lookahead, pilot, both)")
                    })?;
                for g in &a.gpu_memory {
                    let gpu = (g.as_str(), gpu_arm(g)?);
                    let r = run_one(
                        &a,
                        &trace,
                        b,
                        mtp,
                        prefetch,
                        gpu,
                        &raw,
                        &layouts,
                        pilot.as_ref(),
                    )?;
                    if !a.json {
                        println!("{}", r.line);
                    }
                    runs.push(r.json);
                }
            }
        }
    }
    if a.json {
        let out = json!({
            "model": a.model.display().to_string(),
            "trace": trace.path.display().to_string(),
            "kind": a.kind,
            "tokens_per_conversation": a.tokens,
            "acceptance": a.acceptance,
            "io_threads": a.io_threads,
            "admission": a.admission,
            "runs": runs,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `SIZE:nocopy` is the VRAM tier without a staging area; anything else keeps the copies.
    #[test]
    fn gpu_arms_parse_the_nocopy_suffix() {
        let a = gpu_arm("2G:nocopy").unwrap();
        assert_eq!(
            (a.memory, a.copies),
            (Some(GpuMemory::Size(2 << 30)), false)
        );
        let a = gpu_arm("16G").unwrap();
        assert_eq!(
            (a.memory, a.copies),
            (Some(GpuMemory::Size(16 << 30)), true)
        );
        assert_eq!(gpu_arm("off").unwrap().memory, None);
        assert!(gpu_arm("lots:nocopy").is_err());
    }
}
