//! The `--gpu-memory` plan, from headers alone (no GPU needed): the matrices it lists are the
//! ones the loaded model multiplies, its order is the documented one, it never exceeds the
//! budget, and the VRAM expert tier takes the ledger's hottest experts first.
mod common;
use common::*;
use nectar_format::Catalog;
use nectar_model::arch::glm5::{catalog_candidates, plan_gpu, Candidates, Config, GpuPlan};
use nectar_model::Glm5;
use nectar_residency::usage::Ledger;
use nectar_residency::ExpertKey;
use std::path::Path;

fn candidates(dir: &Path) -> (Config, Candidates) {
    let cfg = Config::from_dir(dir).unwrap();
    let cat = Catalog::open(dir).unwrap();
    let c = catalog_candidates(&cfg, &cat);
    (cfg, c)
}

fn dirs() -> Vec<std::path::PathBuf> {
    vec![
        fixture_dir("glm5").join("model"),
        fixture_dir("glm52").join("model"),
        demo_dir(),
    ]
}

#[test]
fn the_headers_list_exactly_the_matrices_the_model_multiplies() {
    for dir in dirs() {
        let (_, c) = candidates(&dir);
        let mut from_headers = c.spine.clone();
        from_headers.sort();
        let mut model = Glm5::load(&dir).unwrap();
        assert_eq!(
            from_headers,
            model.spine_matrices(),
            "{}: the plan and the model disagree on the spine",
            dir.display()
        );
        // Every MoE layer's experts, the MTP layer's included.
        let moe: Vec<usize> = model.expert_usage().iter().map(|(l, _)| *l).collect();
        assert_eq!(c.experts.keys().copied().collect::<Vec<_>>(), moe);
        for (l, counts) in model.expert_usage() {
            assert_eq!(c.experts[&l].0, counts.len(), "layer {l}");
        }
    }
}

fn used(p: &GpuPlan) -> u64 {
    p.spine_bytes() + p.expert_bytes()
}

#[test]
fn the_plan_fills_classes_in_order_within_the_budget() {
    let dir = fixture_dir("glm5").join("model");
    let (cfg, c) = candidates(&dir);
    let all = plan_gpu(&c, &cfg, u64::MAX, None);
    assert_eq!(all.spine_left(), (0, 0));
    assert_eq!(all.spine.len(), c.spine.len());
    for (l, (k, n, _)) in &all.per_layer {
        assert_eq!(k, n, "layer {l}: an unlimited budget holds every expert");
    }
    let none = plan_gpu(&c, &cfg, 0, None);
    assert_eq!(used(&none), 0);
    assert!(none.experts.is_empty() && none.spine.is_empty());
    // Exactly the first class: attention and indexers, nothing else.
    let attn = all.classes[0].total_bytes;
    let p = plan_gpu(&c, &cfg, attn, None);
    assert_eq!(p.classes[0].placed, p.classes[0].total);
    assert!(p.classes[1..].iter().all(|x| x.placed == 0) && p.experts.is_empty());
    // Any budget: never above it; a class is only started once the earlier ones are done or
    // a matrix of them did not fit.
    let total = used(&all);
    for i in 0..=64u64 {
        let b = total * i / 64;
        let p = plan_gpu(&c, &cfg, b, None);
        assert!(used(&p) <= b, "budget {b}: {} used", used(&p));
        // What is left unplaced would not fit in what is left of the budget.
        let left = b - used(&p);
        let smallest_left = p
            .per_layer
            .values()
            .filter(|(k, n, _)| k < n)
            .map(|x| x.2)
            .min();
        assert!(smallest_left.is_none_or(|s| s > left), "budget {b}");
    }
}

#[test]
fn the_vram_tier_takes_the_hottest_experts_then_shares_out_the_rest() {
    let dir = fixture_dir("glm5").join("model");
    let (cfg, c) = candidates(&dir);
    let spine = plan_gpu(&c, &cfg, u64::MAX, None).spine_bytes();
    let (&first, &(count, e_bytes)) = c.experts.iter().next().unwrap();
    // No history: in turn across layers, expert 0 of every layer first.
    let layers = c.experts.len() as u64;
    let p = plan_gpu(&c, &cfg, spine + layers * e_bytes, None);
    assert_eq!(p.experts.len(), layers as usize);
    assert!(p.experts.iter().all(|k| k.expert == 0), "{:?}", p.experts);
    assert!(p.per_layer.values().all(|x| x.0 == 1));
    // A ledger: its most selected expert goes first.
    let mut ledger = Ledger::new(
        cfg.raw.num_hidden_layers as u32 + 1,
        count as u32,
        "glm_moe_dsa",
    );
    let hot = ExpertKey {
        layer: first as u32,
        expert: count as u32 - 1,
    };
    ledger.add(hot, 1000);
    ledger.add(
        ExpertKey {
            layer: first as u32,
            expert: 1,
        },
        10,
    );
    let p = plan_gpu(&c, &cfg, spine + 2 * e_bytes, Some(&ledger));
    assert_eq!(
        p.experts,
        vec![
            hot,
            ExpertKey {
                layer: first as u32,
                expert: 1
            }
        ]
    );
    assert_eq!(p.experts_of(first), vec![1, count as u32 - 1]);
}

/// A build without the CUDA tier, or a machine without a GPU, plans nothing and says why.
#[test]
fn without_a_gpu_the_model_says_why_and_stays_on_the_cpu() {
    let dir = fixture_dir("glm5").join("model");
    let opts = nectar_model::arch::glm5::LoadOptions {
        gpu_memory: Some(nectar_model::arch::glm5::GpuMemory::Auto),
        ..Default::default()
    };
    let m = Glm5::load_with(&dir, &opts).unwrap();
    let p = m.gpu_placement().unwrap();
    if p.matrices > 0 {
        eprintln!("a GPU is here: {}", p.summary);
        return;
    }
    assert!(p.summary.contains("running on the CPU"), "{}", p.summary);
    #[cfg(not(feature = "cuda"))]
    assert!(p.summary.contains("--features cuda"), "{}", p.summary);
    assert_eq!(m.expert_runs().gpu(), 0);
}

/// Under a memory budget the plan carves the staging area for copied experts out of the
/// budget, after the spine and before the expert tier: two slots per routed expert of a token
/// when they fit, fewer when not (at least two), none when every expert fits in VRAM anyway —
/// and spine + staging + experts never exceed the budget.
#[test]
fn the_staging_area_is_counted_shrinks_to_fit_and_is_left_out_when_all_fits() {
    use nectar_model::arch::glm5::{plan_gpu_with, staging_slot_bytes, staging_slots};
    let dir = fixture_dir("glm5").join("model");
    let (cfg, c) = candidates(&dir);
    let slots = staging_slots(&cfg);
    assert_eq!(slots, 2 * cfg.raw.num_experts_per_tok);
    let largest = c.experts.values().map(|x| x.1).max().unwrap();
    let slot = staging_slot_bytes(largest);
    let spine = plan_gpu(&c, &cfg, u64::MAX, None).spine_bytes();
    // Everything fits: no staging.
    assert_eq!(
        plan_gpu_with(&c, &cfg, u64::MAX, None, slots).staging_slots,
        0
    );
    // Room for the spine, the whole staging area and two experts.
    let b = spine + slots as u64 * slot + 2 * largest;
    let p = plan_gpu_with(&c, &cfg, b, None, slots);
    assert_eq!(
        (p.staging_slots, p.staging_bytes),
        (slots, slots as u64 * slot)
    );
    assert_eq!(p.experts.len(), 2, "{:?}", p.experts);
    assert!(p.used_bytes() <= b);
    // Without staging the same budget holds more experts.
    assert!(plan_gpu(&c, &cfg, b, None).experts.len() > 2);
    // Room for three slots only: three, no expert.
    let p = plan_gpu_with(&c, &cfg, spine + 3 * slot, None, slots);
    assert_eq!((p.staging_slots, p.experts.len()), (3, 0));
    // Room for one slot: none (a single slot cannot overlap a copy with a product).
    let p = plan_gpu_with(&c, &cfg, spine + slot, None, slots);
    assert_eq!(p.staging_slots, 0);
    assert_eq!(p.staging_bytes, 0);
    for budget in [0, spine / 2, spine + slot, b, 2 * b] {
        let p = plan_gpu_with(&c, &cfg, budget, None, slots);
        assert!(p.used_bytes() <= budget, "budget {budget}");
    }
}

/// A spine matrix in VRAM costs no RAM (issue 14 item 3): with a GPU plan the memory plan's
/// spine terms fall by exactly the bytes of the placed matrices whose host copy is released —
/// every placed one but `kv_b_proj`, which decode's attention reads on the CPU when a sequence's
/// KV mirror does not fit in VRAM — and the budget
/// gets the RAM back as expert slots. From headers alone, as `fit` plans it.
#[test]
fn the_memory_plan_counts_only_the_spine_left_in_ram() {
    use nectar_model::arch::glm5::{keeps_host_copy, plan_memory, GpuMemory, LoadOptions};
    for dir in dirs() {
        let (_, c) = candidates(&dir);
        let bytes = |keep: &dyn Fn(&str) -> bool| -> u64 {
            c.spine.iter().filter(|(n, _)| keep(n)).map(|x| x.1).sum()
        };
        let total = bytes(&|_| true);
        let kv_b = bytes(&|n| keeps_host_copy(n));
        assert!(kv_b > 0 && kv_b < total / 2, "{}", dir.display());
        let opts = |budget: u64, gpu: Option<u64>| LoadOptions {
            memory_budget: Some(budget),
            ctx_size: 256,
            runtime_reserve: Some(1 << 20),
            gpu_memory: gpu.map(GpuMemory::Size),
            ..Default::default()
        };
        let ram_spine = |gpu| {
            let m = plan_memory(&dir, &opts(1 << 40, gpu)).unwrap();
            (m.inputs.spine.iter().map(|x| x.1).sum::<u64>(), m.gpu)
        };
        let (cpu, none) = ram_spine(None);
        assert!(none.is_none());
        // Every spine matrix in VRAM: only kv_b's host copies (and the embedding table, never
        // a candidate) stay in RAM.
        let (all, g) = ram_spine(Some(1 << 40));
        let g = g.unwrap();
        assert_eq!(g.spine_bytes(), total);
        assert_eq!(g.released_bytes, total - kv_b);
        assert_eq!(cpu - all, total - kv_b, "{}", dir.display());
        // `--mtp off` loads no MTP layer: the VRAM plan holds none of it either, and what it
        // releases is again exactly what the RAM plan no longer counts.
        let no_mtp = |gpu: Option<u64>| {
            let m = plan_memory(
                &dir,
                &LoadOptions {
                    mtp: false,
                    ..opts(1 << 40, gpu)
                },
            )
            .unwrap();
            (m.inputs.spine.iter().map(|x| x.1).sum::<u64>(), m.gpu)
        };
        let ((cpu_off, _), (all_off, g_off)) = (no_mtp(None), no_mtp(Some(1 << 40)));
        let g_off = g_off.unwrap();
        assert_eq!(g_off.classes[2].total, 0, "{}", dir.display());
        assert!(g_off.spine_bytes() < total);
        assert_eq!(cpu_off - all_off, g_off.released_bytes, "{}", dir.display());
        // VRAM for the attention class only: its matrices but kv_b are released.
        let attn = g.classes[0].total_bytes;
        let (part, p) = ram_spine(Some(attn));
        let p = p.unwrap();
        assert_eq!(p.spine_bytes(), attn);
        let kv_b_placed = bytes(&|n| keeps_host_copy(n) && p.spine.contains(n));
        assert!(kv_b_placed > 0);
        assert_eq!(cpu - part, attn - kv_b_placed, "{}", dir.display());
        for (name, _) in &c.spine {
            let want = p.spine.contains(name).then(|| !keeps_host_copy(name));
            let copy = p.placement_of(name);
            assert_eq!(copy.map(|c| c.release_host), want, "{name}");
            // kv_b keeps its stored layout in VRAM (the absorbed kernels read single weights).
            assert_eq!(copy.map(|c| c.stored_layout), want.map(|r| !r), "{name}");
        }
        // Under a budget the RAM released becomes LRU slots: the CPU plan's minimum (one slot
        // per sparse layer) holds more with the spine in VRAM.
        let lru = |budget, gpu| plan_memory(&dir, &opts(budget, gpu)).unwrap().plan;
        let err = lru(1, None).unwrap_err().to_string();
        let need: u64 = err
            .split("needs at least ")
            .nth(1)
            .and_then(|t| t.split(" (").nth(1))
            .and_then(|t| t.split(" bytes").next())
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{err}"));
        assert_eq!(lru(need, None).unwrap().lru_per_layer, 1);
        let freed = lru(need, Some(1 << 40)).unwrap();
        assert!(freed.lru_per_layer > 1, "{}: {freed:?}", dir.display());
        // The RAM plan of a budget too small for the CPU alone may fit with the spine in VRAM.
        assert!(lru(need - 1, None).is_err());
        assert!(lru(need - 1, Some(1 << 40)).is_ok());
    }
}
