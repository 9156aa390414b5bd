//! Streamed experts (residency slots under a memory budget) against the all-resident model:
//! bit-identical logits, bounded slots, real reads, and a refused impossible budget.
mod common;
use common::*;
use nectar_format::convert::{convert, ConvertParams};
use nectar_model::arch::glm5::{
    classify, expert_of, plan_memory, Config, LoadOptions, Prefetch, TensorClass,
};
use nectar_model::{Glm5, MtpStep, NoObserver, SeqStep};
use std::path::Path;

/// Greedy logits of the prompt and `steps` decode steps, then the MTP head's draft logits over
/// the prompt (when the model has one).
fn run(model: &Glm5, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut c = model.new_cache();
    let hd = model.hidden_size();
    let h = model
        .forward(
            &mut [SeqStep {
                cache: &mut c,
                tokens: prompt,
            }],
            &mut NoObserver,
        )
        .unwrap();
    let mut out = vec![model.logits(&h[h.len() - hd..]).unwrap()];
    let mut drafts = None;
    if model.has_mtp() {
        let n = prompt.len() - 1;
        let hm = model
            .mtp_forward(
                &mut [MtpStep {
                    cache: &mut c,
                    hidden: &h[..n * hd],
                    next_tokens: &prompt[1..],
                }],
                &mut NoObserver,
            )
            .unwrap();
        drafts = Some(model.mtp_logits(&hm).unwrap());
    }
    for _ in 0..steps {
        let t = argmax(out.last().unwrap());
        let h = model
            .forward(
                &mut [SeqStep {
                    cache: &mut c,
                    tokens: &[t],
                }],
                &mut NoObserver,
            )
            .unwrap();
        out.push(model.logits(&h).unwrap());
    }
    out.extend(drafts);
    out
}

fn budget_for(dir: &Path, lru: usize, opts: &LoadOptions) -> u64 {
    // Solve the memory equation backwards: the smallest budget giving `lru` slots per layer.
    let mut lo = 1u64;
    let mut hi = 1u64 << 32;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let o = LoadOptions {
            memory_budget: Some(mid),
            ..opts.clone()
        };
        match Glm5::load_with(dir, &o) {
            Ok(m) if m.memory_plan().unwrap().lru_per_layer >= lru => hi = mid,
            _ => lo = mid + 1,
        }
    }
    lo
}

#[test]
fn streamed_demo_container_equals_resident_bit_for_bit() {
    let out = tempfile::tempdir().unwrap();
    convert(
        &demo_dir(),
        out.path(),
        &ConvertParams::recommended(8),
        0,
        &mut |_| {},
    )
    .unwrap();
    let resident = Glm5::load(out.path()).unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| 300 + i * 37).collect();
    let want = run(&resident, &prompt, 12);
    let base = LoadOptions {
        ctx_size: 256,
        runtime_reserve: Some(1 << 20),
        working_slots: 16,
        ..Default::default()
    };
    let load = |budget: u64| {
        Glm5::load_with(
            out.path(),
            &LoadOptions {
                memory_budget: Some(budget),
                ..base.clone()
            },
        )
        .unwrap()
    };
    // (LRU slots, slots' bytes beyond the least budget for them: the plan's last partial row).
    for (lru, more) in [(1usize, 0u64), (3, 0), (3, 5), (32, 0)] {
        let mut budget = budget_for(out.path(), lru, &base);
        if more > 0 {
            // The bytes of `more` slots and the safety margin's 2 % of them.
            let slot = load(budget).residency().unwrap().slot_bytes() as u64;
            budget += more * slot * 52 / 50;
        }
        let m = load(budget);
        let plan = m.memory_plan().unwrap();
        assert_eq!(plan.lru_per_layer, lru);
        // The runtime's capacities are the plan's: one slot more on `lru_extra_layers` evenly
        // spaced sparse layers, the MTP tier at the base count.
        let main = m.residency().unwrap();
        let caps: Vec<usize> = (0..main.layers()).map(|l| main.capacity(l)).collect();
        let sparse: Vec<usize> = caps.iter().copied().filter(|&c| c > 0).collect();
        assert_eq!(sparse.len(), plan.sparse_layers, "{caps:?}");
        for (i, &c) in sparse.iter().enumerate() {
            assert_eq!(c, plan.lru_slots(i), "sparse layer {i}: {caps:?}");
        }
        let extra = sparse.iter().filter(|&&c| c == lru + 1).count();
        assert_eq!(extra, plan.lru_extra_layers);
        if more > 0 {
            assert!((4..=6).contains(&extra), "{more} slots' bytes: {caps:?}");
        } else {
            // The least budget for `lru` slots leaves less than a slot over.
            assert_eq!(extra, 0, "{caps:?}");
        }
        assert_eq!(m.mtp_residency().unwrap().capacity(8), lru);
        let got = run(&m, &prompt, 12);
        assert_eq!(
            got, want,
            "LRU {lru}: streamed logits must equal resident bits"
        );
        let t = m.residency().unwrap().telemetry();
        assert!(t.bytes_read > 0 && t.reads > 0);
        // The MTP layer (int8 experts, wider than the int4 main ones) has its own tier, with
        // slots of its own size, and its experts were streamed too.
        let mtp = m.mtp_residency().expect("the demo has an MTP layer");
        let main = m.residency().unwrap();
        assert!(
            mtp.slot_bytes() > main.slot_bytes() * 3 / 2,
            "{} vs {}",
            mtp.slot_bytes(),
            main.slot_bytes()
        );
        assert!(mtp.telemetry().reads > 0);
        assert_eq!(
            t.layers[8].hits + t.layers[8].misses,
            0,
            "MTP experts use their own tier"
        );
        assert!(
            t.occupancy.lru <= lru * 8 + extra,
            "at most {lru} slots in each of 8 MoE tiers, one more on {extra}"
        );
        eprintln!(
            "LRU {lru}: hit rate {:.3}, {} reads, {} B",
            t.hit_rate(),
            t.reads,
            t.bytes_read
        );
        if lru == 1 {
            let ev: u64 = t.layers.iter().map(|l| l.evictions).sum();
            assert!(ev > 0);
        }
    }
    // The embedding tables are read a row per token under a budget (the logits above are the
    // resident ones): the plan holds every non-expert byte of the headers but their codes.
    let cfg = Config::from_dir(out.path()).unwrap();
    let cat = nectar_format::Catalog::open(out.path()).unwrap();
    let (mut weights, mut embedding) = (0, 0);
    for e in cat.tensors() {
        match classify(&e.name, &cfg) {
            TensorClass::RoutedExpert => {}
            TensorClass::Mtp if expert_of(&e.name).is_some() => {}
            _ if e.name.ends_with("embed_tokens.weight") => embedding += e.len,
            _ => weights += e.len,
        }
    }
    assert!(embedding > 0 && cfg.head_name() == "lm_head.weight");
    let plan = plan_memory(
        out.path(),
        &LoadOptions {
            memory_budget: Some(budget_for(out.path(), 3, &base)),
            ..base.clone()
        },
    )
    .unwrap();
    let held: u64 = plan.inputs.spine.iter().map(|s| s.1).sum();
    assert_eq!(held, weights, "{:?}", plan.inputs.spine);
    // Batch-union: two rows routed to the same experts request each expert once per layer, so
    // a forward over both asks the cache exactly what a forward over one does.
    let requests = |rows: usize| {
        let m = Glm5::load_with(
            out.path(),
            &LoadOptions {
                memory_budget: Some(budget_for(out.path(), 3, &base)),
                ..base.clone()
            },
        )
        .unwrap();
        let mut caches: Vec<_> = (0..rows).map(|_| m.new_cache()).collect();
        let mut steps: Vec<SeqStep<'_>> = caches
            .iter_mut()
            .map(|c| SeqStep {
                cache: c,
                tokens: &prompt[..1],
            })
            .collect();
        m.forward(&mut steps, &mut NoObserver).unwrap();
        let t = m.residency().unwrap().telemetry();
        t.layers.iter().map(|l| l.hits + l.misses).sum::<u64>()
    };
    assert_eq!(requests(2), requests(1));
    assert_eq!(
        requests(1),
        7 * 4,
        "7 MoE layers × top-4, each expert requested once"
    );
    // Next-layer prediction: `measure`, `pilot` (prefetch) and `both` (look-ahead beside it)
    // never change a bit; the predictor names most chosen experts, and prefetches serve real
    // requests.
    for mode in [Prefetch::Measure, Prefetch::Pilot, Prefetch::Both] {
        let o = LoadOptions {
            prefetch: mode,
            ..base.clone()
        };
        let m = Glm5::load_with(
            out.path(),
            &LoadOptions {
                memory_budget: Some(budget_for(out.path(), 3, &o)),
                ..o
            },
        )
        .unwrap();
        assert_eq!(run(&m, &prompt, 12), want, "{mode:?} changed the logits");
        let s = m.pilot_stats();
        // 7 predicted MoE layers × (40 prompt rows + 12 steps) × top-4.
        assert_eq!(s.chosen, 7 * 52 * 4);
        // Scored rank by rank as well: every prediction names top-4.
        assert_eq!(s.rank_predicted.iter().sum::<u64>(), 7 * 52 * 4);
        assert!(s.recall() > 0.5, "recall {:.3}", s.recall());
        let t = m.residency().unwrap().telemetry();
        // Dropped after its read, or cancelled before it by its layer's router.
        let (hits, dropped) = t.layers.iter().fold((0, 0), |(h, d), l| {
            (
                h + l.prefetch_hits,
                d + l.prefetch_dropped + l.prefetch_cancelled,
            )
        });
        let issued: u64 = t.layers.iter().map(|l| l.prefetched).sum();
        if mode.reads_predicted_layer() {
            assert!(s.issued > 0 && hits > 0, "{s:?}, {hits} prefetch hits");
            // With `both` the look-ahead's reads are among them too.
            assert!(issued >= s.issued, "{issued} {s:?}");
            assert_eq!(
                issued,
                hits + dropped,
                "every prefetch is used, dropped or cancelled"
            );
            if mode == Prefetch::Pilot {
                assert_eq!(issued, s.issued, "PILOT alone: every read ahead is its own");
            }
        } else {
            assert_eq!((s.issued, hits, dropped), (0, 0, 0));
        }
    }
    // Look-ahead prefetch (the cache's own prediction, reading ahead into spare working
    // slots) never changes a bit either, runs no router early, and every read it starts is
    // used or dropped.
    let o = LoadOptions {
        prefetch: Prefetch::Lookahead,
        ..base.clone()
    };
    let m = Glm5::load_with(
        out.path(),
        &LoadOptions {
            memory_budget: Some(budget_for(out.path(), 3, &o)),
            ..o
        },
    )
    .unwrap();
    assert_eq!(run(&m, &prompt, 12), want, "lookahead changed the logits");
    assert_eq!(m.pilot_stats().chosen, 0);
    let t = m.residency().unwrap().telemetry();
    let (issued, hits, dropped) = t.layers.iter().fold((0, 0, 0), |(i, h, d), l| {
        (
            i + l.prefetched,
            h + l.prefetch_hits,
            d + l.prefetch_dropped + l.prefetch_cancelled,
        )
    });
    assert_eq!(
        issued,
        hits + dropped,
        "every prefetch is used, dropped or cancelled"
    );
    // Steps that batch two sequences (a server's) are measured by the look-ahead's controller
    // in windows of their own width: the partial one-sequence window is dropped, and 17
    // two-sequence steps (16 measured before the 17th ends) make two windows.
    let res = m.residency().unwrap();
    let control = |r: &nectar_residency::Residency| r.telemetry().lookahead.unwrap();
    let (w0, r0) = (control(res).windows, control(res).restarts);
    let (mut a, mut b) = (m.new_cache(), m.new_cache());
    for t in 0..17u32 {
        let (ta, tb) = ([prompt[t as usize % prompt.len()]], [t + 1]);
        m.forward(
            &mut [
                SeqStep {
                    cache: &mut a,
                    tokens: &ta,
                },
                SeqStep {
                    cache: &mut b,
                    tokens: &tb,
                },
            ],
            &mut NoObserver,
        )
        .unwrap();
    }
    let c = control(res);
    assert!(
        c.windows >= w0 + 2 && c.windows <= w0 + 3,
        "{c:?} after {w0}"
    );
    assert_eq!((c.sequences, c.restarts), (2, r0 + 1), "{c:?}");
    // A budget below the floor is refused with the equation.
    let small = LoadOptions {
        memory_budget: Some(1 << 20),
        ..base
    };
    let e = Glm5::load_with(out.path(), &small).unwrap_err().to_string();
    assert!(
        e.contains("memory budget too small") && e.contains("working bank") && e.contains("LRU"),
        "{e}"
    );
}

#[test]
fn streamed_float_fixture_equals_resident() {
    let dir = fixture_dir("glm52").join("model");
    let resident = Glm5::load(&dir).unwrap();
    let exp = Expected::load(&fixture_dir("glm52"));
    let prompt = exp.ids("prompt_ids");
    let want = run(&resident, &prompt, 8);
    let opts = LoadOptions {
        ctx_size: 64,
        runtime_reserve: Some(0),
        working_slots: 4,
        ..Default::default()
    };
    let budget = budget_for(&dir, 1, &opts);
    let m = Glm5::load_with(
        &dir,
        &LoadOptions {
            memory_budget: Some(budget),
            ..opts
        },
    )
    .unwrap();
    assert_eq!(run(&m, &prompt, 8), want);
}

/// A server's plan (`serve --parallel 4`: five sequences) lends what its idle sequences do not
/// hold — their KV cache and step activations — to every layer's LRU, and between prompts also
/// the prompt transients and the working bank's spare slots; it takes them back before more
/// sequences or a prompt run: the capacities and the wave size are the plan of the moment's at
/// each step, the memory taken back is given to the OS, and logits stay the resident model's
/// bits throughout.
#[test]
fn idle_sequences_lend_their_memory_to_the_expert_cache() {
    use nectar_model::arch::glm5::lent_inputs;
    let dir = demo_dir();
    let resident = Glm5::load(&dir).unwrap();
    let prompt: Vec<u32> = (0..24).map(|i| 500 + i * 41).collect();
    let want = run(&resident, &prompt, 8);
    let base = LoadOptions {
        ctx_size: 4096,
        sequences: 5,
        server: true,
        ..Default::default()
    };
    // The least budget whose full plan holds 3 slots a layer: one sequence's 4,096-token KV
    // cache is worth many more on the demo.
    let opts = LoadOptions {
        memory_budget: Some(budget_for(&dir, 3, &base)),
        ..base
    };
    let m = Glm5::load_with(&dir, &opts).unwrap();
    let inputs = plan_memory(&dir, &opts).unwrap().inputs;
    let top_k = m.cfg.raw.num_experts_per_tok;
    let caps = |m: &Glm5| -> Vec<usize> {
        let r = m.residency().unwrap();
        let mut c: Vec<usize> = (0..r.layers()).map(|l| r.capacity(l)).collect();
        c.push(m.mtp_residency().unwrap().capacity(r.layers() - 1));
        c.into_iter().filter(|&c| c > 0).collect()
    };
    let planned = |k: usize, prompt: bool| -> (Vec<usize>, usize) {
        let i = lent_inputs(&inputs, k, prompt, top_k, &opts);
        let p = nectar_residency::planner::plan(&i).unwrap();
        let mut c: Vec<usize> = (0..p.sparse_layers).map(|i| p.lru_slots(i)).collect();
        c.push(p.lru_per_layer);
        (
            c,
            i.working_slots - nectar_model::arch::glm5::prefetch_slots(top_k, &opts),
        )
    };
    let full = planned(5, true);
    assert_eq!(full.0[0], 3);
    let now = |m: &Glm5| (caps(m), m.residency().unwrap().max_wave());
    assert_eq!(now(&m), full, "the full plan until told");
    assert_eq!(m.sequences_in_use(), Some((5, 5, true)));
    let steps = [
        (2, false),
        (1, false),
        (3, true),
        (5, true),
        (5, false),
        (2, true),
        (2, false),
    ];
    for (k, pr) in steps {
        m.use_sequences(k, pr).unwrap();
        assert_eq!(m.sequences_in_use(), Some((k, 5, pr)));
        assert_eq!(now(&m), planned(k, pr), "{k} sequences in use, prompt {pr}");
        assert_eq!(
            run(&m, &prompt, 8),
            want,
            "{k} sequences in use, prompt {pr}"
        );
    }
    // Between prompts a lone client's bank is two sequences' (the kept conversation counts),
    // and its LRU holds at least as much as with a prompt in flight (here every expert: 32),
    // which holds more than the full plan.
    let (lone, lone_prompt) = (planned(2, false), planned(2, true));
    assert!(lone.1 < full.1, "{lone:?} vs {full:?}");
    assert!(lone.0[0] >= lone_prompt.0[0] && lone_prompt.0[0] >= full.0[0] + 3);
    // Taking it back evicted experts and gave their slots' pages to the OS at once.
    let t = m.residency().unwrap().telemetry();
    assert!(t.released_bytes > 0, "{t:?}");
    assert_eq!(
        t.lru_planned,
        lone.0[..lone.0.len() - 1].iter().sum::<usize>()
    );
    assert_eq!(t.lru_capacity, t.lru_planned);
}
