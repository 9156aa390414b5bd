//! Reading a converted container in place: expert extents (coalesced reads checked, never
//! assumed), per-format inventory, and the container running end to end.
mod common;
use common::*;
use nectar_format::convert::{convert, ConvertParams};
use nectar_format::experts::{expert_extent, layer_extents};
use nectar_format::Catalog;
use nectar_model::arch::glm5::{Config, Inventory, TensorClass};
use nectar_model::{Glm5, NoObserver, SeqStep};

#[test]
fn demo_container_extents_inventory_and_run() {
    let out = tempfile::tempdir().unwrap();
    convert(
        &demo_dir(),
        out.path(),
        &ConvertParams::recommended(8),
        0,
        &mut |_| {},
    )
    .unwrap();
    let cfg = Config::from_dir(out.path()).unwrap();
    let cat = Catalog::open(out.path()).unwrap();
    let (h, i) = (cfg.raw.hidden_size, cfg.raw.moe_intermediate_size);
    let inv = Inventory::new(&cat, &cfg);
    assert!(inv.problems.is_empty(), "{:?}", inv.problems);
    let routed = &inv.classes[&TensorClass::RoutedExpert];
    // gate/up have 384 columns (6 groups of 64); down has 64 columns, so g64 is one group per
    // row: the per-row format.
    assert_eq!(routed.by_format.get("int4-g64"), Some(&(224 * 2)));
    assert_eq!(routed.by_format.get("int4"), Some(&224));
    assert_eq!(
        inv.classes[&TensorClass::Mtp].by_format.get("int8"),
        Some(&(32 * 3 + 3 + 5 + 2 + 1))
    ); // experts, shared, attention, indexer, eh_proj
    for layer in 1..8 {
        let ext = layer_extents(&cat, layer, 32, h, i).unwrap();
        for e in &ext {
            assert!(
                e.coalesced.is_some() && e.coalesced_scales.is_some(),
                "layer {layer} expert {}",
                e.expert
            );
            assert_eq!(e.reads().len(), 2);
            assert_eq!(e.bytes(), inv.bytes_per_expert.unwrap());
        }
    }
    let mtp = expert_extent(&cat, 8, 5, h, i).unwrap();
    assert_eq!(mtp.bytes(), inv.bytes_per_mtp_expert.unwrap());
    // The container runs; int4-g64 changes numerics, so compare its argmax with the bf16
    // reference's at the recorded positions of the four reference prompts.
    let model = Glm5::load(out.path()).unwrap();
    let reference: serde_json::Value =
        serde_json::from_slice(&std::fs::read(demo_dir().join("reference.json")).unwrap()).unwrap();
    let v = model.vocab_size();
    let (mut agree, mut total) = (0, 0);
    for p in reference["prompts"].as_array().unwrap() {
        let ids: Vec<u32> = p["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let mut c = model.new_cache();
        let hs = model
            .forward(
                &mut [SeqStep {
                    cache: &mut c,
                    tokens: &ids,
                }],
                &mut NoObserver,
            )
            .unwrap();
        let l = model.logits(&hs).unwrap();
        for t in p["top_logits"].as_array().unwrap() {
            let pos = t["position"].as_u64().unwrap() as usize;
            total += 1;
            agree += (argmax(&l[pos * v..(pos + 1) * v]) as u64 == t["ids"][0].as_u64().unwrap())
                as usize;
        }
    }
    eprintln!("int4-g64 demo container: argmax agrees with bf16 at {agree}/{total} positions");
    assert!(
        agree * 4 >= total * 3,
        "int4-g64 argmax agreement {agree}/{total}"
    );
}

#[test]
fn non_adjacent_expert_tensors_are_read_separately() {
    let src = fixture_dir("glm5").join("model");
    let d = tempfile::tempdir().unwrap();
    copy_configs(&src, d.path());
    let mut t = read_tensors(&src);
    // Put a foreign tensor between expert 0's down and gate projections.
    let pos = t
        .iter()
        .position(|x| x.0 == "model.layers.1.mlp.experts.0.gate_proj.weight")
        .unwrap();
    let norm = t.iter().position(|x| x.0 == "model.norm.weight").unwrap();
    let n = t.remove(norm);
    t.insert(pos, n);
    write_safetensors(&d.path().join("model.safetensors"), &t);
    let cat = Catalog::open(d.path()).unwrap();
    let e0 = expert_extent(&cat, 1, 0, 64, 32).unwrap();
    assert!(e0.coalesced.is_none());
    assert_eq!(e0.reads().len(), 3);
    let e1 = expert_extent(&cat, 1, 1, 64, 32).unwrap();
    assert!(e1.coalesced.is_some());
    let missing = expert_extent(&cat, 1, 99, 64, 32).unwrap_err().to_string();
    assert!(missing.contains("experts.99"), "{missing}");
}
