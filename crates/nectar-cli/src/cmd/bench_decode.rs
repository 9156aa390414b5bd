//! `nectar bench decode`: synthetic decode over a (synth) container with K LRU slots per layer,
//! replaying routes from a generator or a recorded trace through the real residency code, with
//! real kernels on the real expert bytes (`specs/performance.md` §6, Bench D).
//!
//! Per token and MoE layer: a GEMV over an emulated resident spine slice (`--spine-mb`, 127 MB by
//! default: GLM-5.2's 9.5 GB spine read ÷ 75 layers), then the layer's routed experts through the
//! residency manager (hits first, misses as they land) and their SwiGLU at M = 1. The ceiling is
//! computed from the same run: disk-bound tok/s = raw read GB/s (measured here) ÷ GB read per
//! token; compute-bound tok/s = 1 ÷ measured compute seconds per token. `ratio` = achieved tok/s ÷
//! min(disk-bound, compute-bound).
use super::bench_io::raw;
use crate::args::BenchDecodeArgs;
use anyhow::{Context, Result};
use nectar_kernels::{matmul, swiglu_in_place, MatRef, WeightFormat};
use nectar_model::arch::glm5::{expert_layouts, Config};
use nectar_residency::io::{ExpertIo, FileIo};
use nectar_residency::sim::{belady_bypass, read_npy_i8, uniform, Rng, ZipfLayer};
use nectar_residency::{Residency, ResidencyConfig};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Where the routes come from, and (with `--prefetch pilot`) the real predictor's guesses.
struct Routes {
    /// `[token][moe layer] → experts`.
    routes: Vec<Vec<Vec<u32>>>,
    /// `[token][moe layer] → predicted experts` (pilot only).
    predicted: Option<Vec<Vec<Vec<u32>>>>,
    /// Description.
    source: String,
    /// Predictor figures for the JSON (pilot only).
    pilot: serde_json::Value,
}

/// Routes `[token][moe layer] → experts`.
fn routes(
    a: &BenchDecodeArgs,
    n_layers: usize,
    experts: usize,
    k: usize,
    tokens: usize,
) -> Result<Routes> {
    let (routes, source) = route_source(a, n_layers, experts, k, tokens)?;
    if a.prefetch != "pilot" {
        return Ok(Routes {
            routes,
            predicted: None,
            source,
            pilot: serde_json::Value::Null,
        });
    }
    anyhow::ensure!(
        a.routes == "trace",
        "--prefetch pilot needs --routes trace: predictions come from the trace's model"
    );
    let (dir, (shape, data)) = trace(a)?;
    let model = crate::demo::model_dir(a.predictor.clone())?;
    let p = super::bench_pilot::predictions(&dir, "decode", &model, &data, &shape)?;
    let (t_all, main) = (shape[0], (shape[1] - 1).max(1));
    let predicted = (0..tokens)
        .map(|t| {
            (0..n_layers)
                .map(|l| {
                    p.predicted[t % t_all][l % main]
                        .iter()
                        .map(|&e| e % experts as u32)
                        .collect()
                })
                .collect()
        })
        .collect();
    Ok(Routes {
        routes,
        predicted: Some(predicted),
        source,
        pilot: json!({
            "predictor": model,
            "recall": p.recall,
            "route_agreement_with_trace": p.route_agreement,
        }),
    })
}

/// A `.npy` array: shape and data.
type Npy = (Vec<usize>, Vec<i8>);

/// The trace directory and its `decode.experts.npy` (`[T, layers, k]`).
fn trace(a: &BenchDecodeArgs) -> Result<(PathBuf, Npy)> {
    let dir = a.trace.clone().unwrap_or_else(|| {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/traces/demo"
        ))
    });
    let path = dir.join("decode.experts.npy");
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let (shape, data) =
        read_npy_i8(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    anyhow::ensure!(
        shape.len() == 3,
        "{}: expected [T, layers, k]",
        path.display()
    );
    Ok((dir, (shape, data)))
}

/// Routes `[token][moe layer] → experts` from the chosen source, and its description.
fn route_source(
    a: &BenchDecodeArgs,
    n_layers: usize,
    experts: usize,
    k: usize,
    tokens: usize,
) -> Result<(Vec<Vec<Vec<u32>>>, String)> {
    let mut rng = Rng::new(a.seed);
    match a.routes.as_str() {
        "uniform" => Ok((
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
            Ok((
                r,
                "zipf (s 0.6, β 2, λ 0.6, σ_c 1; performance.md §3.3 profile B)".into(),
            ))
        }
        "trace" => {
            let (dir, (shape, data)) = trace(a)?;
            let path = dir.join("decode.experts.npy");
            let (t_all, tl, tk) = (shape[0], shape[1], shape[2]);
            // The last trace layer is the demo's MTP layer; main layers map onto ours in turn.
            let main = (tl - 1).max(1);
            anyhow::ensure!(
                tk <= experts,
                "trace selects {tk} experts, the container has {experts} per layer"
            );
            let r: Vec<Vec<Vec<u32>>> = (0..tokens)
                .map(|t| {
                    let row = t % t_all;
                    (0..n_layers)
                        .map(|l| {
                            let tlayer = l % main;
                            let base = (row * tl + tlayer) * tk;
                            data[base..base + tk]
                                .iter()
                                .filter(|&&e| e >= 0)
                                .map(|&e| e as u32 % experts as u32)
                                .collect()
                        })
                        .collect()
                })
                .collect();
            Ok((
                r,
                format!(
                    "trace {} ({} rows, {} experts per row)",
                    path.display(),
                    t_all,
                    tk
                ),
            ))
        }
        o => anyhow::bail!("unknown --routes `{o}` (uniform, zipf or trace)"),
    }
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut v = vec![0u8; n];
    for c in v.chunks_mut(8) {
        let x = r.next_u64().to_le_bytes();
        c.copy_from_slice(&x[..c.len()]);
    }
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

pub fn decode(a: BenchDecodeArgs) -> Result<()> {
    let cfg = Config::from_dir(&a.model)?;
    let (layouts, paths) = expert_layouts(&a.model)?;
    let moe: Vec<usize> = (0..layouts.len())
        .filter(|&l| !layouts[l].is_empty() && l < cfg.raw.num_hidden_layers)
        .collect();
    anyhow::ensure!(!moe.is_empty(), "{}: no MoE layers", a.model.display());
    let experts = layouts[moe[0]].len();
    let k = cfg.raw.num_experts_per_tok;
    let hidden = cfg.raw.hidden_size;
    let total = a.warmup + a.tokens;
    let Routes {
        routes,
        predicted,
        source,
        pilot,
    } = routes(&a, moe.len(), experts, k, total)?;
    anyhow::ensure!(
        ["none", "oracle", "pilot"].contains(&a.prefetch.as_str()),
        "unknown --prefetch `{}` (none, oracle or pilot)",
        a.prefetch
    );
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
    // The offline optimum on the same requests and capacity.
    let (mut bh, mut br) = (0u64, 0u64);
    for li in 0..moe.len() {
        let steps: Vec<Vec<u32>> = routes.iter().map(|t| t[li].clone()).collect();
        let (h, r) = belady_bypass(&steps, a.slots);
        bh += h;
        br += r;
    }
    let belady = bh as f64 / br.max(1) as f64;
    // Emulated spine slice per layer (int4 g64, random).
    let g64 = WeightFormat::Int4Group { group: 64 };
    let spine_rows =
        ((a.spine_mb * 1e6) as usize / (g64.row_bytes(hidden) + g64.row_scales(hidden) * 4)).max(1);
    let spines: Vec<(Vec<u8>, Vec<f32>)> = moe
        .iter()
        .map(|&l| {
            (
                random_bytes(spine_rows * g64.row_bytes(hidden), l as u64 + 7),
                vec![0.01f32; spine_rows * g64.row_scales(hidden)],
            )
        })
        .collect();
    let io = Arc::new(FileIo::open(&paths, true)?);
    let raw_gbps = raw(&io, &layouts, a.io_threads, a.raw_seconds)?;
    let rc = ResidencyConfig {
        lru_per_layer: vec![a.slots; layouts.len()],
        working_slots: a.working,
        prefetch_slots: if a.prefetch == "none" { 0 } else { 2 * k },
        io_threads: a.io_threads,
        pinned: Vec::new(),
        mlock: false,
        admission: match a.admission.as_str() {
            "frequency" => nectar_residency::Admission::Frequency {
                half_life: a.half_life,
            },
            _ => nectar_residency::Admission::Lru,
        },
    };
    let res = Residency::new(rc, layouts.clone(), io.clone() as Arc<dyn ExpertIo>)?;
    let x: Vec<f32> = (0..hidden)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mut spine_out = vec![0.0f32; spine_rows];
    let (mut compute_s, mut t_start, mut tel0) = (0.0f64, Instant::now(), res.telemetry());
    for (t, tok) in routes.iter().enumerate() {
        if t == a.warmup {
            t_start = Instant::now();
            compute_s = 0.0;
            tel0 = res.telemetry();
        }
        // The first MoE layer's guess comes from the dense layer before it, at the token's start.
        if let Some(g) = guess(t, 0) {
            res.prefetch(moe[0], &g)?;
        }
        for (li, &l) in moe.iter().enumerate() {
            let c0 = Instant::now();
            let (sb, ss) = &spines[li];
            let spine = MatRef::new(g64, spine_rows, hidden, sb, ss)?;
            matmul(&spine, &x, 1, &mut spine_out)?;
            compute_s += c0.elapsed().as_secs_f64();
            let pending = res.acquire(l, &tok[li])?;
            // The next layer's guess is issued once this layer's own reads are queued.
            if let Some(g) = guess(t, li + 1) {
                res.prefetch(moe[li + 1], &g)?;
            }
            let (ready, waiting): (Vec<_>, Vec<_>) =
                pending.into_iter().partition(|p| p.is_ready());
            for p in ready.into_iter().chain(waiting) {
                let lease = p.wait()?;
                let c0 = Instant::now();
                std::hint::black_box(swiglu(&lease.mats()?, &x)?);
                compute_s += c0.elapsed().as_secs_f64();
            }
            res.end_wave_layer(l)?;
        }
    }
    let wall = t_start.elapsed().as_secs_f64();
    let tel = res.telemetry();
    let tokens = a.tokens as f64;
    let tok_s = tokens / wall;
    let bytes_tok = (tel.bytes_read - tel0.bytes_read) as f64 / tokens;
    let gb_tok = bytes_tok / 1e9;
    let io_busy = (tel.disk_seconds - tel0.disk_seconds) / (wall * a.io_threads as f64);
    let compute_tok_s = tokens / compute_s.max(1e-12);
    let disk_tok_s = if gb_tok > 0.0 {
        raw_gbps / gb_tok
    } else {
        f64::INFINITY
    };
    let ceiling = compute_tok_s.min(disk_tok_s);
    let ratio = tok_s / ceiling;
    let (h, m) = tel
        .layers
        .iter()
        .fold((0u64, 0u64), |(h, m), l| (h + l.hits, m + l.misses));
    let hit = h as f64 / (h + m).max(1) as f64;
    let (ph, pd, pi) = tel.layers.iter().fold((0u64, 0u64, 0u64), |(h, d, i), l| {
        (
            h + l.prefetch_hits,
            d + l.prefetch_dropped,
            i + l.prefetched,
        )
    });
    let out = json!({
        "bench": "decode",
        "model": a.model,
        "routes": source,
        "slots_per_layer": a.slots,
        "moe_layers": moe.len(),
        "experts_per_layer": experts,
        "experts_per_token": k,
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
        "spine_mb_per_layer": a.spine_mb,
        "tok_s": tok_s,
        "hit_rate": hit,
        "belady_hit_rate": belady,
        "gb_per_token": gb_tok,
        "io_busy_fraction": io_busy,
        "raw_disk_gbps": raw_gbps,
        "disk_bound_tok_s": if disk_tok_s.is_finite() { json!(disk_tok_s) } else { json!(null) },
        "compute_bound_tok_s": compute_tok_s,
        "ceiling_tok_s": ceiling,
        "ratio": ratio,
    });
    if a.json {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(())
}
