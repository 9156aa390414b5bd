//! The fixture parity bars on the GPU path (`--features cuda`, `LoadOptions::gpu_memory`): every
//! spine matrix and resident expert multiplied on the GPU, against the Hugging Face reference
//! in `tests/fixtures/glm-tiny`. GPU sums run in another order than the CPU's, so logits are
//! held to 1e-4 × max|logit| (the bar) instead of the CPU path's 1e-4 absolute; router
//! and indexer selections, the 32 greedy tokens and the MTP argmax must be identical.
//!
//! Without a usable GPU each test prints why and passes, unless `NECTAR_REQUIRE_GPU=1`.
#![cfg(feature = "cuda")]
mod common;
use common::*;
use nectar_model::arch::glm5::{GpuMemory, GpuPlacement, LoadOptions};
use nectar_model::{Glm5, MtpStep, NoObserver, SeqStep};

/// The placement of `model` when it placed anything; `None` (the test skips) when nothing went
/// to a GPU — a failure under `NECTAR_REQUIRE_GPU=1`.
fn placed(model: &Glm5, what: &str) -> Option<GpuPlacement> {
    let p = model.gpu_placement().expect("gpu_memory was given").clone();
    eprintln!("{what}: {}", p.summary);
    if p.matrices == 0 {
        assert!(
            std::env::var_os("NECTAR_REQUIRE_GPU").is_none(),
            "NECTAR_REQUIRE_GPU is set but nothing was placed: {}",
            p.summary
        );
        eprintln!("skipped: {}", p.summary);
        return None;
    }
    Some(p)
}

/// Loads a fixture with every matrix on the GPU, or `None` (skip) without one.
fn load_on_gpu(variant: &str) -> Option<Glm5> {
    let opts = LoadOptions {
        gpu_memory: Some(GpuMemory::Size(u64::MAX)),
        ..Default::default()
    };
    let model = Glm5::load_with(&fixture_dir(variant).join("model"), &opts).unwrap();
    let p = placed(&model, variant)?;
    assert_eq!(p.left_on_cpu, 0, "an unlimited budget places everything");
    Some(model)
}

fn max_abs_f64(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |a, &b| a.max(b.abs()))
}

fn run_variant(variant: &str) {
    // Decode attention on the GPU at every length (the fixtures' caches are short).
    nectar_model::arch::glm5::set_gpu_decode_min_keys(0);
    let Some(model) = load_on_gpu(variant) else {
        return;
    };
    let dir = fixture_dir(variant);
    let exp = Expected::load(&dir);
    let prompt = exp.ids("prompt_ids");
    let generated = exp.ids("generated_ids");
    let (s, v) = (prompt.len(), model.vocab_size());

    let mut cache = model.new_cache();
    let mut rec = Recorder::default();
    let hidden = model
        .forward(
            &mut [SeqStep {
                cache: &mut cache,
                tokens: &prompt,
            }],
            &mut rec,
        )
        .unwrap();
    // The prompt's attention ran on the GPU (the reconstructed form; DSA selects from position
    // index_topk = 8 on): every row of every layer.
    assert_eq!(
        model.gpu_attention_rows(),
        (s * model.num_layers()) as u64,
        "{variant}: prompt attention rows on the GPU"
    );
    // The indexer's scores of the rows past index_topk ran on the GPU too (the selections,
    // checked below, are the CPU's: the scores are its bits).
    assert!(
        model.gpu_indexer_rows() > 0,
        "{variant}: indexer scores on the GPU"
    );
    let logits = model.logits(&hidden).unwrap();
    let mut worst = 0.0f64;
    for p in 0..s {
        let want = exp.row("prompt_logits", p);
        let tol = 1e-4 * max_abs_f64(&want);
        let d = max_abs(&logits[p * v..(p + 1) * v], &want);
        assert!(
            d <= tol,
            "{variant}: prompt pos {p}: max |Δ| = {d:e} > {tol:e}"
        );
        worst = worst.max(d / max_abs_f64(&want));
    }
    eprintln!("{variant}: prompt logits max |Δ| / max|logit| = {worst:.3e}");
    let prompt_argmax: Vec<u32> = (0..s)
        .map(|p| argmax(&logits[p * v..(p + 1) * v]))
        .collect();
    assert_eq!(prompt_argmax, exp.ids("prompt_argmax"));
    check_selections(&exp, &rec, 0..s);

    let prompt_indexer_rows = model.gpu_indexer_rows();
    let mut next = argmax(&logits[(s - 1) * v..s * v]);
    let mut out = vec![next];
    let mut worst = 0.0f64;
    for i in 1..generated.len() {
        rec.base = s + i - 1;
        let h = model
            .forward(
                &mut [SeqStep {
                    cache: &mut cache,
                    tokens: &[next],
                }],
                &mut rec,
            )
            .unwrap();
        let l = model.logits(&h).unwrap();
        let want = exp.row("decode_logits", i);
        let tol = 1e-4 * max_abs_f64(&want);
        let d = max_abs(&l, &want);
        assert!(
            d <= tol,
            "{variant}: decode step {i}: max |Δ| = {d:e} > {tol:e}"
        );
        worst = worst.max(d / max_abs_f64(&want));
        next = argmax(&l);
        out.push(next);
    }
    assert_eq!(out, generated, "{variant}: greedy tokens");
    // Every decode row's attention ran on the GPU (the absorbed form over the mirrored cache).
    assert_eq!(
        model.gpu_decode_attention_rows(),
        ((generated.len() - 1) * model.num_layers()) as u64,
        "{variant}: decode attention rows on the GPU"
    );
    // So did the decode rows' indexer scores (over the mirrored keys: the selections, checked
    // below, are the CPU's bits) on every full layer (each decode row sees more than
    // index_topk keys).
    let full = model.cfg.indexer_full.iter().filter(|&&f| f).count();
    assert!(full > 0, "{variant}: the fixture has full indexer layers");
    assert_eq!(
        model.gpu_indexer_rows() - prompt_indexer_rows,
        ((generated.len() - 1) * full) as u64,
        "{variant}: decode indexer rows on the GPU"
    );
    eprintln!(
        "{variant}: {}/{} greedy tokens, decode logits max |Δ| / max|logit| = {worst:.3e}",
        out.len(),
        generated.len()
    );
    check_selections(&exp, &rec, s..s + generated.len() - 1);

    let mut next_tokens = prompt[1..].to_vec();
    next_tokens.push(generated[0]);
    let hm = model
        .mtp_forward(
            &mut [MtpStep {
                cache: &mut cache,
                hidden: &hidden,
                next_tokens: &next_tokens,
            }],
            &mut NoObserver,
        )
        .unwrap();
    let draft = model.mtp_logits(&hm).unwrap();
    let all: Vec<u32> = exp.json["mtp"]["argmax_all_prompt_positions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let got: Vec<u32> = (0..s).map(|p| argmax(&draft[p * v..(p + 1) * v])).collect();
    assert_eq!(got, all, "{variant}: MTP argmax over prompt positions");
}

#[test]
fn glm5_on_the_gpu_matches_hf() {
    run_variant("glm5");
}

#[test]
fn glm52_on_the_gpu_matches_hf() {
    run_variant("glm52");
}

/// A prefill chunk that continues a cache (positions 10..24 over 24 keys, DSA selecting from
/// position 8) runs its attention on the GPU over the whole sequence's keys: its logits are
/// within 1e-4 × max|logit| of the CPU model's for the prompt in one piece, with the same argmax.
#[test]
fn gpu_prefill_attention_continues_a_cache() {
    for variant in ["glm5", "glm52"] {
        let Some(gpu) = load_on_gpu(variant) else {
            return;
        };
        let cpu = Glm5::load(&fixture_dir(variant).join("model")).unwrap();
        let prompt = Expected::load(&fixture_dir(variant)).ids("prompt_ids");
        let v = gpu.vocab_size();
        let run = |m: &Glm5, cuts: &[usize]| -> Vec<f32> {
            let mut cache = m.new_cache();
            let mut last = Vec::new();
            for w in cuts.windows(2) {
                let h = m
                    .forward(
                        &mut [SeqStep {
                            cache: &mut cache,
                            tokens: &prompt[w[0]..w[1]],
                        }],
                        &mut NoObserver,
                    )
                    .unwrap();
                last = m.logits(&h).unwrap();
            }
            last
        };
        let n = prompt.len();
        let got = run(&gpu, &[0, 10, n]);
        let all = run(&cpu, &[0, n]);
        let want = &all[10 * v..];
        assert_eq!(
            gpu.gpu_attention_rows(),
            (n * gpu.num_layers()) as u64,
            "{variant}: both chunks' attention on the GPU"
        );
        assert_eq!(cpu.gpu_attention_rows(), 0);
        for p in 0..n - 10 {
            let (g, w) = (&got[p * v..(p + 1) * v], &want[p * v..(p + 1) * v]);
            let w64: Vec<f64> = w.iter().map(|&x| x as f64).collect();
            let tol = 1e-4 * max_abs_f64(&w64);
            let d = max_abs(g, &w64);
            assert!(
                d <= tol,
                "{variant}: position {}: |Δ| {d:e} > {tol:e}",
                p + 10
            );
            assert_eq!(argmax(g), argmax(w), "{variant}: position {}", p + 10);
        }
    }
}

/// A budget smaller than the model leaves the rest on the CPU and still gives the same tokens.
#[test]
fn a_partial_placement_splits_the_model_and_agrees() {
    let dir = fixture_dir("glm5").join("model");
    let opts = LoadOptions {
        gpu_memory: Some(GpuMemory::Size(64 << 10)),
        ..Default::default()
    };
    let model = Glm5::load_with(&dir, &opts).unwrap();
    let Some(p) = placed(&model, "partial") else {
        return;
    };
    assert!(p.left_on_cpu > 0 && p.bytes <= 64 << 10, "{}", p.summary);
    let exp = Expected::load(&fixture_dir("glm5"));
    let prompt = exp.ids("prompt_ids");
    let mut cache = model.new_cache();
    let h = model
        .forward(
            &mut [SeqStep {
                cache: &mut cache,
                tokens: &prompt,
            }],
            &mut NoObserver,
        )
        .unwrap();
    let l = model.logits(&h).unwrap();
    let v = model.vocab_size();
    let am: Vec<u32> = (0..prompt.len())
        .map(|p| argmax(&l[p * v..(p + 1) * v]))
        .collect();
    assert_eq!(am, exp.ids("prompt_argmax"));
}

/// Greedy logits of `prompt` and `steps` decode steps.
fn greedy(model: &Glm5, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache();
    let hd = model.hidden_size();
    let h = model
        .forward(
            &mut [SeqStep {
                cache: &mut cache,
                tokens: prompt,
            }],
            &mut NoObserver,
        )
        .unwrap();
    let mut out = vec![model.logits(&h[h.len() - hd..]).unwrap()];
    for _ in 0..steps {
        let t = argmax(out.last().unwrap());
        let h = model
            .forward(
                &mut [SeqStep {
                    cache: &mut cache,
                    tokens: &[t],
                }],
                &mut NoObserver,
            )
            .unwrap();
        out.push(model.logits(&h).unwrap());
    }
    out
}

/// Under a memory budget, the VRAM expert tier holds part of every MoE layer's experts (the
/// spine on the GPU too) and the rest stream through the RAM cache to the CPU: the logits stay
/// within 1e-4 × max|logit| of the all-CPU streamed model, the greedy tokens are identical,
/// both devices computed experts, and no VRAM expert ever took a RAM slot.
#[test]
fn a_vram_expert_tier_under_a_memory_budget_agrees_with_the_cpu() {
    use nectar_model::arch::glm5::{
        catalog_candidates, plan_gpu, plan_gpu_with, staging_slots, Config,
    };
    let dir = fixture_dir("glm5").join("model");
    let base = LoadOptions {
        memory_budget: Some(64 << 20),
        ctx_size: 256,
        runtime_reserve: Some(1 << 20),
        ..Default::default()
    };
    let cpu = Glm5::load_with(&dir, &base).unwrap();
    // The spine and about half of each layer's experts.
    let cfg = Config::from_dir(&dir).unwrap();
    let c = catalog_candidates(&cfg, &nectar_format::Catalog::open(&dir).unwrap());
    let all = plan_gpu(&c, &cfg, u64::MAX, None);
    let vram = all.spine_bytes() + all.expert_bytes() / 2;
    // Under a budget the load plans a staging area for copies too.
    let plan = plan_gpu_with(&c, &cfg, vram, None, staging_slots(&cfg));
    let gpu = Glm5::load_with(
        &dir,
        &LoadOptions {
            gpu_memory: Some(GpuMemory::Size(vram)),
            ..base.clone()
        },
    )
    .unwrap();
    let Some(p) = placed(&gpu, "VRAM tier") else {
        return;
    };
    assert_eq!(p.experts_in_vram(), plan.experts.len(), "{}", p.summary);
    assert!(
        p.vram_experts
            .iter()
            .all(|(_, ids, n)| !ids.is_empty() && ids.len() < *n),
        "{:?}",
        p.vram_experts
    );
    let prompt: Vec<u32> = (0..24).map(|i| 3 + i * 7).collect();
    let want = greedy(&cpu, &prompt, 16);
    let got = greedy(&gpu, &prompt, 16);
    let mut worst = 0.0f64;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let w64: Vec<f64> = w.iter().map(|&x| x as f64).collect();
        let tol = 1e-4 * max_abs_f64(&w64);
        let d = max_abs(g, &w64);
        assert!(d <= tol, "step {i}: max |Δ| = {d:e} > {tol:e}");
        worst = worst.max(d / max_abs_f64(&w64));
        assert_eq!(argmax(g), argmax(w), "step {i}: greedy token");
    }
    let runs = gpu.expert_runs();
    let (on_gpu, on_cpu) = (runs.vram, runs.cpu);
    eprintln!(
        "VRAM tier: 17/17 greedy tokens, max |Δ| / max|logit| = {worst:.3e}; expert runs: {on_gpu} on the GPU, {on_cpu} on the CPU"
    );
    assert!(on_gpu > 0 && on_cpu > 0, "{on_gpu} GPU, {on_cpu} CPU");
    assert_eq!(cpu.expert_runs().gpu(), 0);
    // The RAM cache never held a VRAM expert.
    let held: std::collections::HashSet<_> = plan.experts.iter().copied().collect();
    for r in [gpu.residency(), gpu.mtp_residency()].into_iter().flatten() {
        for pl in r.placements() {
            assert!(
                !held.contains(&pl.key),
                "{:?} is in VRAM and in RAM",
                pl.key
            );
        }
    }
}

/// Under a memory budget with a VRAM tier of one expert per layer and a staging area, the
/// other experts are copied from their RAM slot to the GPU (a 24-token prompt is prompt-sized:
/// copied from the first step) or computed on the CPU, as the measured costs decide: the logits
/// stay within 1e-4 × max|logit| of the all-CPU streamed model, the greedy tokens are
/// identical, and experts ran on all three routes.
#[test]
fn experts_copied_from_ram_to_the_gpu_agree_with_the_cpu() {
    use nectar_model::arch::glm5::{
        catalog_candidates, plan_gpu_with, staging_slot_bytes, staging_slots, Config,
    };
    let dir = fixture_dir("glm5").join("model");
    let base = LoadOptions {
        memory_budget: Some(64 << 20),
        ctx_size: 256,
        runtime_reserve: Some(1 << 20),
        ..Default::default()
    };
    let cpu = Glm5::load_with(&dir, &base).unwrap();
    let cfg = Config::from_dir(&dir).unwrap();
    let c = catalog_candidates(&cfg, &nectar_format::Catalog::open(&dir).unwrap());
    let slots = staging_slots(&cfg);
    let all = plan_gpu_with(&c, &cfg, u64::MAX, None, slots);
    assert_eq!(all.staging_slots, 0, "everything fits: nothing to copy");
    let largest = c.experts.values().map(|x| x.1).max().unwrap();
    let vram = all.spine_bytes()
        + slots as u64 * staging_slot_bytes(largest)
        + c.experts.len() as u64 * largest;
    let plan = plan_gpu_with(&c, &cfg, vram, None, slots);
    assert_eq!(plan.staging_slots, slots);
    assert!(plan.used_bytes() <= vram);
    let gpu = Glm5::load_with(
        &dir,
        &LoadOptions {
            gpu_memory: Some(GpuMemory::Size(vram)),
            ..base.clone()
        },
    )
    .unwrap();
    let Some(p) = placed(&gpu, "copied experts") else {
        return;
    };
    assert_eq!(p.staging.0, slots, "{}", p.summary);
    assert!(
        p.summary.contains("staging for copied experts"),
        "{}",
        p.summary
    );
    // On the H200 the RAM slots register: every copy is a DMA straight from its slot.
    assert!(
        p.summary
            .contains("copied by DMA from their registered RAM slots"),
        "{}",
        p.summary
    );
    let prompt: Vec<u32> = (0..24).map(|i| 3 + i * 7).collect();
    let want = greedy(&cpu, &prompt, 16);
    let got = greedy(&gpu, &prompt, 16);
    let mut worst = 0.0f64;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let w64: Vec<f64> = w.iter().map(|&x| x as f64).collect();
        let tol = 1e-4 * max_abs_f64(&w64);
        let d = max_abs(g, &w64);
        assert!(d <= tol, "step {i}: max |Δ| = {d:e} > {tol:e}");
        worst = worst.max(d / max_abs_f64(&w64));
        assert_eq!(argmax(g), argmax(w), "step {i}: greedy token");
    }
    let runs = gpu.expert_runs();
    let copy = gpu.copy_stats().expect("a staging area was placed");
    eprintln!(
        "copied experts: 17/17 greedy tokens, max |Δ| / max|logit| = {worst:.3e}; expert runs \
         {runs:?}; {} experts ({} bytes, {} direct, {} slot registrations) copied at {:.1} GB/s, \
         {:.2} of the pinned reference",
        copy.experts,
        copy.bytes,
        copy.direct,
        copy.registrations,
        copy.h2d_gbps(),
        copy.ratio()
    );
    assert!(runs.copied > 0 && runs.vram > 0 && runs.cpu > 0, "{runs:?}");
    assert_eq!(copy.experts, runs.copied);
    // The time each side spent (the shared expert counts on the CPU side when it runs there).
    assert!(copy.gpu_s > 0.0 && copy.cpu_s > 0.0, "{copy:?}");
    assert!(copy.cpu_experts >= runs.cpu, "{copy:?} {runs:?}");
    assert_eq!(
        copy.direct, copy.experts,
        "every copy from its registered slot"
    );
    assert!(copy.registrations >= 1 && copy.register_s > 0.0);
    assert!(copy.bytes >= runs.copied * (largest / 2));
    assert_eq!(cpu.expert_runs().gpu(), 0);
    assert!(cpu.copy_stats().is_none());
}

/// The resident set size now, after giving the allocator's free pages back.
fn rss_now() -> i64 {
    nectar_residency::rss::trim_heap();
    nectar_residency::rss::rss_bytes().unwrap_or(0) as i64
}

/// A spine matrix in VRAM costs no RAM (issue 14 item 3). Under the CPU plan's smallest budget
/// (one LRU slot per sparse layer), with the whole spine in VRAM: the model holds in host memory
/// only `kv_b_proj`'s copies (decode's absorbed attention reads them on the CPU) — its resident
/// spine falls by exactly the released bytes, the memory plan gives them to LRU slots, and the
/// process RSS falls with them — while prefill, decode, the LM head and the MTP layer run on the
/// VRAM copies: logits within 1e-4 × max|logit| of the all-CPU model under the same budget,
/// identical greedy tokens and MTP argmax.
#[test]
fn a_spine_in_vram_releases_its_host_copy_and_the_budget_gets_the_slots() {
    use nectar_model::arch::glm5::{
        catalog_candidates, keeps_host_copy, plan_gpu, plan_memory, Config,
    };
    let dir = fixture_dir("glm5").join("model");
    let cfg = Config::from_dir(&dir).unwrap();
    let c = catalog_candidates(&cfg, &nectar_format::Catalog::open(&dir).unwrap());
    let spine = plan_gpu(&c, &cfg, u64::MAX, None).spine_bytes();
    let kv_b: u64 = c
        .spine
        .iter()
        .filter(|(n, _)| keeps_host_copy(n))
        .map(|x| x.1)
        .sum();
    let opts = |budget: u64, vram: Option<u64>| LoadOptions {
        memory_budget: Some(budget),
        ctx_size: 256,
        runtime_reserve: Some(1 << 20),
        gpu_memory: vram.map(GpuMemory::Size),
        ..Default::default()
    };
    // The CPU plan's minimum, from its refusal of 1 byte.
    let err = plan_memory(&dir, &opts(1, None))
        .unwrap()
        .plan
        .unwrap_err()
        .to_string();
    let need: u64 = err
        .split("needs at least ")
        .nth(1)
        .and_then(|t| t.split(" (").nth(1))
        .and_then(|t| t.split(" bytes").next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    // The GPU first (its context and compiled kernels stay for the RSS readings below).
    let warm = Glm5::load_with(&dir, &opts(need, Some(spine))).unwrap();
    if placed(&warm, "spine in VRAM").is_none() {
        return;
    }
    let r0 = rss_now();
    let mut cpu = Glm5::load_with(&dir, &opts(need, None)).unwrap();
    let cpu_rss = rss_now() - r0;
    let r1 = rss_now();
    let mut gpu = Glm5::load_with(&dir, &opts(need, Some(spine))).unwrap();
    let gpu_rss = rss_now() - r1;
    let p = gpu.gpu_placement().unwrap().clone();
    eprintln!("{}", p.summary);
    assert_eq!(p.left_on_cpu, 0, "{}", p.summary);
    assert_eq!(p.host_released, spine - kv_b);
    assert_eq!(p.host_kept, kv_b);
    assert_eq!(
        cpu.spine_host_bytes() - gpu.spine_host_bytes(),
        spine - kv_b
    );
    assert_eq!(gpu.spine_host_bytes(), kv_b);
    eprintln!(
        "RSS growth of the load: CPU {:.2} MiB, spine in VRAM {:.2} MiB ({:.2} MiB of host \
         copies released)",
        cpu_rss as f64 / 1048576.0,
        gpu_rss as f64 / 1048576.0,
        (spine - kv_b) as f64 / 1048576.0
    );
    // The released RAM is expert slots.
    let slots = |m: &Glm5| m.memory_plan().unwrap().lru_per_layer;
    assert_eq!(slots(&cpu), 1);
    assert!(slots(&gpu) > 1, "{}", slots(&gpu));
    assert_eq!(
        slots(&gpu),
        plan_memory(&dir, &opts(need, Some(spine)))
            .unwrap()
            .plan
            .unwrap()
            .lru_per_layer,
        "fit's plan is the one that runs"
    );
    // Prefill (the reconstructed form: kv_b on the GPU), decode (absorbed: kv_b's host copy),
    // the LM head — all against the CPU under the same budget.
    let prompt: Vec<u32> = (0..24).map(|i| 3 + i * 7).collect();
    let want = greedy(&cpu, &prompt, 16);
    let got = greedy(&gpu, &prompt, 16);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let w64: Vec<f64> = w.iter().map(|&x| x as f64).collect();
        let tol = 1e-4 * max_abs_f64(&w64);
        let d = max_abs(g, &w64);
        assert!(d <= tol, "step {i}: max |Δ| = {d:e} > {tol:e}");
        assert_eq!(argmax(g), argmax(w), "step {i}: greedy token");
    }
    // The MTP layer (its projections and head in VRAM only).
    let mtp_argmax = |m: &Glm5| -> Vec<u32> {
        let mut cache = m.new_cache();
        let h = m
            .forward(
                &mut [SeqStep {
                    cache: &mut cache,
                    tokens: &prompt,
                }],
                &mut NoObserver,
            )
            .unwrap();
        let hm = m
            .mtp_forward(
                &mut [MtpStep {
                    cache: &mut cache,
                    hidden: &h,
                    next_tokens: &prompt,
                }],
                &mut NoObserver,
            )
            .unwrap();
        let d = m.mtp_logits(&hm).unwrap();
        let v = m.vocab_size();
        (0..prompt.len())
            .map(|r| argmax(&d[r * v..(r + 1) * v]))
            .collect()
    };
    assert_eq!(mtp_argmax(&gpu), mtp_argmax(&cpu));
    drop(warm);
}

/// A matrix whose host copy was released computes on the GPU only: asking for the host copy is
/// a typed error naming it, never a read of freed memory.
#[test]
fn a_released_host_copy_is_a_typed_error() {
    use nectar_kernels::WeightFormat;
    use nectar_model::blocks::Linear;
    let gpu = match nectar_model::blocks::open_gpu() {
        Ok(g) => g,
        Err(why) => {
            assert!(
                std::env::var_os("NECTAR_REQUIRE_GPU").is_none(),
                "NECTAR_REQUIRE_GPU is set: {why}"
            );
            eprintln!("skipped: {why}");
            return;
        }
    };
    let (rows, cols) = (8, 64);
    let w: Vec<u8> = (0..rows * cols * 4)
        .map(|i| if i % 4 == 3 { 0x3c } else { (i % 7) as u8 })
        .collect();
    let data = nectar_format::Bytes::Owned(std::sync::Arc::new(w));
    let mut l = Linear::new(
        "m.weight".into(),
        WeightFormat::F32,
        rows,
        cols,
        data,
        vec![],
    )
    .unwrap();
    let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.1).sin()).collect();
    let want = l.forward(&x, 1).unwrap();
    let bytes = l.bytes();
    let copy = nectar_model::blocks::GpuCopy {
        release_host: true,
        stored_layout: false,
    };
    l.place_on_gpu(&gpu, copy).unwrap();
    assert!(l.on_gpu());
    assert_eq!((l.bytes(), l.host_bytes()), (bytes, 0));
    let err = l.mat().unwrap_err();
    assert!(
        matches!(&err, nectar_model::Error::HostReleased(n) if n == "m.weight"),
        "{err}"
    );
    assert!(err.to_string().contains("`m.weight`"), "{err}");
    let got = l.forward(&x, 1).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
    }
}
