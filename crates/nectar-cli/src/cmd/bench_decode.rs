//! `nectar bench decode`: synthetic decode over a (synth) container with K slots per layer,
//! replaying routes from a generator or a recorded trace through the real residency code, with
//! real kernels on the real expert bytes (`specs/performance.md` §6, Bench D).
//!
//! Per token and MoE layer: a GEMV over an emulated resident spine slice (`--spine-mb`, 127 MB by
//! default: GLM-5.2's 9.5 GB spine read ÷ 75 layers), then the layer's routed experts through the
//! residency manager and their SwiGLU at M = 1, in the model's order: hits first, then the shared
//! expert's part of the spine (`--shared-mb`, 21.2 MB) while the misses load, then each miss as it
//! lands. The spine slices rotate through copies that together hold at least 4× the last-level
//! cache (`crate::machine::llc_bytes`, from sysfs), so they stream from DRAM as a real spine does.
//!
//! Traces (`--routes trace`): the recorded ids are replayed as they are (never remapped, so only
//! onto a container of the trace's expert count and top-k), trace
//! main layer i on the container's MoE layer i (cycling when the container has more), decode rows
//! only (each segment's prompt rows are prefill), segments in order without a cache reset.
//!
//! The ceiling, both bounds measured in the same run:
//! * disk-bound tok/s = raw disk GB/s ÷ Belady's GB per token. Raw disk GB/s is the higher of
//!   two arms — random whole experts, and large sequential reads — each the median of samples
//!   taken between tokens through the run (excluded from its time). Belady's GB per token is
//!   the least any policy with the same slots must read on the measured tokens (Belady-OPT with
//!   bypass per layer, started from the best possible cache contents), so reads beyond it —
//!   wasted prefetches, worse admission — are charged to the policy, not to the ceiling;
//! * compute-bound tok/s = 1 ÷ the measured compute seconds per token.
//!
//! `ratio` = tok/s ÷ min(disk-bound, compute-bound) ≤ 1 by construction; a measured ratio above
//! 1 means a reference is wrong, and the bench fails.
use super::bench_io::{load_average, median, random_experts, RawReader};
use crate::args::BenchDecodeArgs;
use anyhow::{Context, Result};
use nectar_kernels::{matmul, swiglu_in_place, MatRef, WeightFormat};
use nectar_model::arch::glm5::{expert_layouts, Config};
use nectar_residency::io::{ExpertIo, FileIo};
use nectar_residency::layout::SlotLayout;
use nectar_residency::replay::{belady, Step};
use nectar_residency::sim::{uniform, Rng, ZipfLayer};
use nectar_residency::trace::Trace;
use nectar_residency::{Residency, ResidencyConfig};
use rayon::prelude::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// `[token][moe layer] → experts`.
type Routes = Vec<Vec<Vec<u32>>>;

/// Where the routes come from, and (with `--prefetch pilot`) the real predictor's guesses.
struct Source {
    routes: Routes,
    /// Same shape as `routes` (pilot only).
    predicted: Option<Routes>,
    /// Description.
    source: String,
    /// The trace replayed (trace only).
    trace: serde_json::Value,
    /// Predictor figures for the JSON (pilot only).
    pilot: serde_json::Value,
}

fn repo_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// A recorded trace prepared for replay on `n_layers` MoE layers.
struct Replay {
    dir: PathBuf,
    trace: Trace,
    /// Rows replayed, in order: the decode rows of every segment.
    rows: Vec<usize>,
    /// The trace layer replayed on each container MoE layer.
    layer_of: Vec<usize>,
}

fn load_trace(a: &BenchDecodeArgs, n_layers: usize, experts: usize, k: usize) -> Result<Replay> {
    let dir = a
        .trace
        .clone()
        .unwrap_or_else(|| repo_root().join("tests/fixtures/traces/route256"));
    let trace = Trace::load(&dir, &a.trace_kind)?;
    super::trace_routes::same_expert_shape(&trace, experts, k)?;
    let main = trace.main_layers(trace.hidden_layers());
    anyhow::ensure!(
        !main.is_empty(),
        "{}: no main-model layers in the trace",
        trace.path.display()
    );
    let rows: Vec<usize> = if trace.segments.is_empty() {
        (0..trace.rows).collect()
    } else {
        trace
            .segments
            .iter()
            .flat_map(|s| s.start + s.warmup..s.end)
            .collect()
    };
    anyhow::ensure!(
        !rows.is_empty(),
        "{}: no decode rows in the trace",
        trace.path.display()
    );
    let layer_of = (0..n_layers).map(|l| main[l % main.len()]).collect();
    Ok(Replay {
        dir,
        trace,
        rows,
        layer_of,
    })
}

/// The model that recorded a trace, by the name in its manifest.
pub(crate) fn default_predictor(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("manifest.json");
    let m: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("parsing {}", path.display()))?;
    let name = m["model"]["name"].as_str().unwrap_or("");
    let model = match name {
        "nectar-demo-glm5" => return crate::demo::model_dir(None),
        "nectar-demo-glm5-e256" => repo_root().join("models/nectar-demo-glm5-e256-int4"),
        _ => anyhow::bail!(
            "{}: no built-in model for this trace's model `{name}`; give --predictor",
            path.display()
        ),
    };
    anyhow::ensure!(
        model.join("config.json").exists(),
        "the trace's model `{name}` is not at {}; give --predictor",
        model.display()
    );
    Ok(model)
}

/// Routes `[token][moe layer] → experts` from the chosen source.
fn routes(
    a: &BenchDecodeArgs,
    n_layers: usize,
    experts: usize,
    k: usize,
    tokens: usize,
) -> Result<Source> {
    anyhow::ensure!(
        a.prefetch != "pilot" || a.routes == "trace",
        "--prefetch pilot needs --routes trace: predictions come from the trace's model"
    );
    let mut rng = Rng::new(a.seed);
    let plain = |routes: Routes, source: String| Source {
        routes,
        predicted: None,
        source,
        trace: serde_json::Value::Null,
        pilot: serde_json::Value::Null,
    };
    match a.routes.as_str() {
        "uniform" => Ok(plain(
            (0..tokens)
                .map(|_| {
                    (0..n_layers)
                        .map(|_| uniform(experts, k, &mut rng))
                        .collect()
                })
                .collect(),
            "uniform".into(),
        )),
        "zipf" => {
            let mut layers: Vec<ZipfLayer> = (0..n_layers)
                .map(|_| ZipfLayer::new(experts, k, 0.6, 2.0, 0.6, 1.0, &mut rng))
                .collect();
            let r = (0..tokens)
                .map(|_| layers.iter_mut().map(|z| z.step(&mut rng)).collect())
                .collect();
            Ok(plain(
                r,
                "zipf (s 0.6, β 2, λ 0.6, σ_c 1; performance.md §3.3 profile B)".into(),
            ))
        }
        "trace" => {
            let rp = load_trace(a, n_layers, experts, k)?;
            let tr = &rp.trace;
            let map = |per_row: &dyn Fn(usize, usize) -> Vec<u32>| -> Routes {
                (0..tokens)
                    .map(|t| {
                        let row = rp.rows[t % rp.rows.len()];
                        rp.layer_of.iter().map(|&tl| per_row(row, tl)).collect()
                    })
                    .collect()
            };
            let routes = map(&|row, tl| tr.experts(row, tl).collect());
            let (predicted, pilot) = if a.prefetch == "pilot" {
                let model = match &a.predictor {
                    Some(p) => p.clone(),
                    None => default_predictor(&rp.dir)?,
                };
                let p = super::bench_pilot::predictions(tr, &model, usize::MAX)?;
                let predicted = map(&|row, tl| p.predicted[row][tl].clone());
                let pilot = json!({
                    "predictor": model,
                    "recall": p.recall,
                    "precision_by_rank": p.precision_by_rank,
                    "route_agreement_with_trace": p.route_agreement,
                });
                (Some(predicted), pilot)
            } else {
                (None, serde_json::Value::Null)
            };
            let source = format!(
                "trace {} `{}` ({} experts, top-{}): the decode rows of its {} segments ({} rows; \
                 prompt rows are prefill and not replayed), in order, no cache reset between \
                 segments{}",
                rp.dir.display(),
                tr.kind,
                tr.experts_per_layer,
                tr.top_k,
                tr.segments.len(),
                rp.rows.len(),
                if tokens > rp.rows.len() {
                    "; cycled (more tokens than rows)"
                } else {
                    ""
                }
            );
            let trace = json!({
                "dir": rp.dir,
                "kind": tr.kind,
                "experts_per_layer": tr.experts_per_layer,
                "top_k": tr.top_k,
                "segments": tr.segments.len(),
                "decode_rows": rp.rows.len(),
                "replayed_rows": tokens.min(rp.rows.len()),
                "model_layer_per_moe_layer": rp.layer_of.iter().map(|&tl| tr.layers[tl]).collect::<Vec<_>>(),
            });
            Ok(Source {
                routes,
                predicted,
                source,
                trace,
                pilot,
            })
        }
        o => anyhow::bail!("unknown --routes `{o}` (uniform, zipf or trace)"),
    }
}

/// Belady-OPT with bypass at `cap` slots on `steps`, started from the best possible cache
/// contents (a first step requesting every expert of `steps`, not counted): the least any
/// policy with `cap` slots can miss on these steps, whatever it held before. (hits, requests).
fn belady_from_best_start(steps: &[Vec<u32>], cap: usize) -> (u64, u64) {
    let mut all: Vec<u32> = steps.iter().flatten().copied().collect();
    all.sort_unstable();
    all.dedup();
    let mut requests = Vec::with_capacity(steps.len() + 1);
    requests.push(all);
    requests.extend_from_slice(steps);
    let flags: Vec<Step> = (0..requests.len())
        .map(|i| Step {
            rows: 0..0,
            counted: i > 0,
            reset: false,
            turn: false,
        })
        .collect();
    let c = belady(&requests, &flags, cap);
    (c.hits, c.requests)
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    v.par_chunks_mut(1 << 20).enumerate().for_each(|(i, c)| {
        let mut r = Rng::new(seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for w in c.chunks_mut(8) {
            let x = r.next_u64().to_le_bytes();
            w.copy_from_slice(&x[..w.len()]);
        }
    });
    v
}

fn swiglu(m: &[MatRef<'_>; 3], x: &[f32]) -> Result<Vec<f32>> {
    let mut g = vec![0.0; m[0].rows];
    let mut u = vec![0.0; m[1].rows];
    matmul(&m[0], x, 1, &mut g)?;
    matmul(&m[1], x, 1, &mut u)?;
    swiglu_in_place(&mut g, &u);
    let mut y = vec![0.0; m[2].rows];
    matmul(&m[2], &g, 1, &mut y)?;
    Ok(y)
}

/// Raw-disk samples: random whole experts and large sequential reads, GB/s each.
#[derive(Default)]
struct DiskSamples {
    random: Vec<f64>,
    sequential: Vec<f64>,
}

impl DiskSamples {
    /// One sample of both arms, their order alternating from one sample to the next.
    fn take(
        &mut self,
        raw: &RawReader,
        layouts: &[Vec<SlotLayout>],
        moe: &[usize],
        secs: f64,
    ) -> Result<()> {
        let n = self.random.len();
        let keys = random_experts(layouts, moe, 4096, 0xD15C + 7919 * n as u64);
        let start = (n * 7919) % raw.n_chunks();
        if n.is_multiple_of(2) {
            self.random.push(raw.experts(layouts, &keys, secs)?);
            self.sequential.push(raw.sequential(start, secs)?);
        } else {
            self.sequential.push(raw.sequential(start, secs)?);
            self.random.push(raw.experts(layouts, &keys, secs)?);
        }
        Ok(())
    }
}

pub fn decode(a: BenchDecodeArgs) -> Result<()> {
    let load_start = load_average();
    let cfg = Config::from_dir(&a.model)?;
    let (layouts, paths) = expert_layouts(&a.model)?;
    let moe: Vec<usize> = (0..layouts.len())
        .filter(|&l| !layouts[l].is_empty() && l < cfg.raw.num_hidden_layers)
        .collect();
    anyhow::ensure!(!moe.is_empty(), "{}: no MoE layers", a.model.display());
    anyhow::ensure!(a.tokens > 0, "--tokens must be positive");
    anyhow::ensure!(
        ["none", "oracle", "pilot"].contains(&a.prefetch.as_str()),
        "unknown --prefetch `{}` (none, oracle or pilot)",
        a.prefetch
    );
    let experts = layouts[moe[0]].len();
    let k = cfg.raw.num_experts_per_tok;
    let hidden = cfg.raw.hidden_size;
    let total = a.warmup + a.tokens;
    let Source {
        routes,
        predicted,
        source,
        trace,
        pilot,
    } = routes(&a, moe.len(), experts, k, total)?;
    // What to prefetch for (token, layer): the truth (oracle) or the real prediction (pilot).
    let top = |g: &[u32]| -> Vec<u32> {
        let n = if a.prefetch_top == 0 {
            g.len()
        } else {
            a.prefetch_top.min(g.len())
        };
        g[..n].to_vec()
    };
    let guess = |t: usize, li: usize| -> Option<Vec<u32>> {
        let g: Option<&Vec<u32>> = match a.prefetch.as_str() {
            "oracle" => routes.get(t).and_then(|r| r.get(li)),
            "pilot" => predicted
                .as_ref()
                .and_then(|p| p.get(t))
                .and_then(|r| r.get(li)),
            _ => None,
        };
        g.map(|g| top(g))
    };
    // The least any policy with these slots must read on the measured tokens.
    let (mut bh, mut br, mut belady_bytes) = (0u64, 0u64, 0u64);
    let mut distinct = Vec::with_capacity(moe.len());
    for (li, &l) in moe.iter().enumerate() {
        let steps: Vec<Vec<u32>> = routes[a.warmup..].iter().map(|t| t[li].clone()).collect();
        let (h, r) = belady_from_best_start(&steps, a.slots);
        bh += h;
        br += r;
        let least = layouts[l].iter().map(|s| s.payload).min().unwrap_or(0);
        belady_bytes += (r - h) * least;
        let mut all: Vec<u32> = routes.iter().flat_map(|t| t[li].iter().copied()).collect();
        all.sort_unstable();
        all.dedup();
        distinct.push(all.len());
    }
    let belady = bh as f64 / br.max(1) as f64;
    let belady_gb_tok = belady_bytes as f64 / a.tokens as f64 / 1e9;
    // Emulated spine slices per layer (int4 g64, random): the part before the router (attention)
    // and the shared expert, which the model computes while the layer's misses load. Copies
    // rotate so that the bytes streamed cover at least 4× the last-level cache.
    anyhow::ensure!(
        (0.0..=a.spine_mb).contains(&a.shared_mb),
        "--shared-mb {} must lie within --spine-mb {}",
        a.shared_mb,
        a.spine_mb
    );
    let g64 = WeightFormat::Int4Group { group: 64 };
    let (row_codes, row_scales) = (g64.row_bytes(hidden), g64.row_scales(hidden));
    let rows_of = |mb: f64| ((mb * 1e6) as usize / (row_codes + row_scales * 4)).max(1);
    let (pre_rows, shared_rows) = (rows_of(a.spine_mb - a.shared_mb), rows_of(a.shared_mb));
    let copy_rows = pre_rows + shared_rows;
    let copy_bytes = copy_rows * (row_codes + row_scales * 4);
    let (llc, llc_source) = crate::machine::llc_bytes();
    let pool_target = if a.spine_pool_mb > 0.0 {
        (a.spine_pool_mb * 1e6) as usize
    } else {
        4 * llc
    };
    let copies = pool_target.div_ceil(copy_bytes).max(moe.len());
    let pool_bytes = copies * copy_bytes;
    let covers_llc = pool_bytes >= 4 * llc;
    if !covers_llc {
        eprintln!(
            "warning: the spine pool ({:.0} MB) is below 4× the last-level cache ({} MiB, \
             {llc_source}): the compute-bound figure may be cache-resident",
            pool_bytes as f64 / 1e6,
            llc >> 20
        );
    }
    let codes = random_bytes(copies * copy_rows * row_codes, 7);
    let scales = vec![0.01f32; copies * copy_rows * row_scales];
    // Copy `c`'s attention part (`shared` false) or shared expert.
    let spine = |c: usize, shared: bool| -> Result<MatRef<'_>> {
        let (r0, rows) = if shared {
            (c * copy_rows + pre_rows, shared_rows)
        } else {
            (c * copy_rows, pre_rows)
        };
        Ok(MatRef::new(
            g64,
            rows,
            hidden,
            &codes[r0 * row_codes..(r0 + rows) * row_codes],
            &scales[r0 * row_scales..(r0 + rows) * row_scales],
        )?)
    };
    let io = Arc::new(FileIo::open(&paths, true)?);
    let raw = RawReader::new(io.clone(), &paths, &layouts, a.io_threads, 32, true)?;
    let rc = ResidencyConfig {
        lru_per_layer: vec![a.slots; layouts.len()],
        working_slots: a.working,
        prefetch_slots: if a.prefetch == "none" { 0 } else { 2 * k },
        io_threads: a.io_threads,
        pinned: Vec::new(),
        mlock: false,
        admission: super::bench_policy::parse_admission(&a.admission, a.half_life)?,
        lookahead: false,
    };
    let res = Residency::new(rc, layouts.clone(), io.clone() as Arc<dyn ExpertIo>)?;
    let x: Vec<f32> = (0..hidden)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mut spine_out = vec![0.0f32; pre_rows.max(shared_rows)];
    let mut gemv = |w: MatRef<'_>| -> Result<()> {
        matmul(&w, &x, 1, &mut spine_out[..w.rows])?;
        Ok(())
    };
    let mut disk = DiskSamples::default();
    let every = a.raw_every.max(1);
    let (mut compute_s, mut wall, mut tel0) = (0.0f64, 0.0f64, res.telemetry());
    let mut spine_at = 0usize;
    for (t, tok) in routes.iter().enumerate() {
        if t >= a.warmup && (t - a.warmup).is_multiple_of(every) {
            // Between tokens no read of the replay is in flight.
            disk.take(&raw, &layouts, &moe, a.raw_seconds)?;
        }
        if t == a.warmup {
            compute_s = 0.0;
            tel0 = res.telemetry();
        }
        let t_tok = Instant::now();
        // The first MoE layer's guess comes from the dense layer before it, at the token's start.
        if let Some(g) = guess(t, 0) {
            res.prefetch(moe[0], &g)?;
        }
        for (li, &l) in moe.iter().enumerate() {
            let c = spine_at % copies;
            spine_at += 1;
            let c0 = Instant::now();
            gemv(spine(c, false)?)?;
            compute_s += c0.elapsed().as_secs_f64();
            let pending = res.acquire(l, &tok[li])?;
            // The next layer's guess is issued once this layer's own reads are queued.
            if let Some(g) = guess(t, li + 1) {
                res.prefetch(moe[li + 1], &g)?;
            }
            let (ready, waiting): (Vec<_>, Vec<_>) =
                pending.into_iter().partition(|p| p.is_ready());
            let expert = |p: nectar_residency::Pending, compute_s: &mut f64| -> Result<()> {
                let lease = p.wait()?;
                let c0 = Instant::now();
                std::hint::black_box(swiglu(&lease.mats()?, &x)?);
                *compute_s += c0.elapsed().as_secs_f64();
                Ok(())
            };
            // The model's order: resident experts, the shared expert, then misses as they land.
            for p in ready {
                expert(p, &mut compute_s)?;
            }
            if a.shared_mb > 0.0 {
                let c0 = Instant::now();
                gemv(spine(c, true)?)?;
                compute_s += c0.elapsed().as_secs_f64();
            }
            for p in waiting {
                expert(p, &mut compute_s)?;
            }
            res.end_wave_layer(l)?;
        }
        if t >= a.warmup {
            wall += t_tok.elapsed().as_secs_f64();
        }
    }
    disk.take(&raw, &layouts, &moe, a.raw_seconds)?;
    let tel = res.telemetry();
    let tokens = a.tokens as f64;
    let tok_s = tokens / wall;
    let bytes_tok = (tel.bytes_read - tel0.bytes_read) as f64 / tokens;
    let gb_tok = bytes_tok / 1e9;
    let io_busy = (tel.disk_seconds - tel0.disk_seconds) / (wall * a.io_threads as f64);
    let compute_tok_s = tokens / compute_s.max(1e-12);
    let (random_gbps, seq_gbps) = (median(&disk.random), median(&disk.sequential));
    let raw_gbps = random_gbps.max(seq_gbps);
    let disk_tok_s = if belady_gb_tok > 0.0 {
        raw_gbps / belady_gb_tok
    } else {
        f64::INFINITY
    };
    let ceiling = compute_tok_s.min(disk_tok_s);
    let ratio = tok_s / ceiling;
    let bound = if disk_tok_s < compute_tok_s {
        "disk"
    } else {
        "compute"
    };
    let (h, m) = tel
        .layers
        .iter()
        .zip(&tel0.layers)
        .fold((0u64, 0u64), |(h, m), (l, l0)| {
            (h + l.hits - l0.hits, m + l.misses - l0.misses)
        });
    let hit = h as f64 / (h + m).max(1) as f64;
    let (ph, pd, pi) = tel.layers.iter().fold((0u64, 0u64, 0u64), |(h, d, i), l| {
        (
            h + l.prefetch_hits,
            d + l.prefetch_dropped,
            i + l.prefetched,
        )
    });
    let finite = |v: f64| if v.is_finite() { json!(v) } else { json!(null) };
    let out = json!({
        "bench": "decode",
        "model": a.model,
        "routes": source,
        "trace": trace,
        "slots_per_layer": a.slots,
        "moe_layers": moe.len(),
        "experts_per_layer": experts,
        "experts_per_token": k,
        "distinct_experts_per_layer": distinct,
        "tokens": a.tokens,
        "warmup": a.warmup,
        "admission": a.admission,
        "half_life": a.half_life,
        "prefetch": a.prefetch,
        "prefetch_top": a.prefetch_top,
        "prefetch_issued": pi,
        "prefetch_hits": ph,
        "prefetch_dropped": pd,
        "pilot": pilot,
        "io_threads": a.io_threads,
        "threads": rayon::current_num_threads(),
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "spine_mb_per_layer": a.spine_mb,
        "shared_mb_per_layer": a.shared_mb,
        "spine_pool": {
            "llc_bytes": llc,
            "llc_source": llc_source,
            "copies": copies,
            "bytes": pool_bytes,
            "at_least_4x_llc": covers_llc,
        },
        "tok_s": tok_s,
        "hit_rate": hit,
        "gb_per_token": gb_tok,
        "belady": {
            "hit_rate": belady,
            "gb_per_token": belady_gb_tok,
            "note": "Belady-OPT with bypass per layer at the same slots on the measured tokens, from the best possible starting cache: the least any policy must read",
        },
        "reads_over_belady": if belady_gb_tok > 0.0 { json!(gb_tok / belady_gb_tok) } else { json!(null) },
        "io_busy_fraction": io_busy,
        "raw_disk": {
            "random_expert_gbps": random_gbps,
            "sequential_gbps": seq_gbps,
            "reference_gbps": raw_gbps,
            "seconds_per_sample": a.raw_seconds,
            "buffers": raw.buffers(),
            "samples_random_expert_gbps": disk.random,
            "samples_sequential_gbps": disk.sequential,
        },
        "disk_bound_tok_s": finite(disk_tok_s),
        "compute_bound_tok_s": compute_tok_s,
        "ceiling_tok_s": ceiling,
        "bound": bound,
        "ratio": ratio,
    });
    if a.json {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    anyhow::ensure!(
        ratio <= 1.0,
        "{tok_s:.2} tok/s exceeds the ceiling {ceiling:.2} tok/s ({bound}-bound): ratio \
         {ratio:.3} > 1, so the {bound} reference is wrong (or the disk drifted between samples)"
    );
    Ok(())
}
