//! The built-in demo model against its HF fp32 reference (`models/nectar-demo-glm5/reference.json`).
//!
//! Computed in f32 from the bf16 weights (as the reference did), so the near-tie positions (top-1
//! / top-2 margins of ≈ 0.02) must still agree. Tolerance on the recorded top-16 logits: 1e-3
//! absolute (logits reach ≈ 17).
mod common;
use common::*;
use nectar_model::{Glm5, MtpStep, SeqStep};

fn as_u32(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn demo_model_matches_reference() {
    let dir = demo_dir();
    let model = Glm5::load(&dir).unwrap();
    let reference: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let eos = model.cfg.eos_ids.clone();
    let v = model.vocab_size();
    for p in reference["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let ids = as_u32(&p["input_ids"]);
        let n = ids.len();
        let mut cache = model.new_cache();
        let mut rec = Recorder::default();
        let hidden = model
            .forward(
                &mut [SeqStep {
                    cache: &mut cache,
                    tokens: &ids,
                }],
                &mut rec,
            )
            .unwrap();
        let logits = model.logits(&hidden).unwrap();
        // Top-16 logits at the last 8 positions.
        let mut worst = 0.0f32;
        for t in p["top_logits"].as_array().unwrap() {
            let pos = t["position"].as_u64().unwrap() as usize;
            let row = &logits[pos * v..(pos + 1) * v];
            for (id, want) in as_u32(&t["ids"])
                .iter()
                .zip(t["logits"].as_array().unwrap())
            {
                worst = worst.max((row[*id as usize] - want.as_f64().unwrap() as f32).abs());
            }
            assert_eq!(argmax(row), as_u32(&t["ids"])[0], "{name}: argmax at {pos}");
        }
        assert!(worst <= 1e-3, "{name}: top logits max |Δ| = {worst}");
        eprintln!("{name}: top-16 logits max |Δ| = {worst:.2e}");
        // Experts chosen at the last position (as sets) and DSA selections of the last query.
        for (layer, want) in p["experts_last_position"].as_object().unwrap() {
            let mut got = rec.router[&(layer.parse().unwrap(), n - 1)].0.clone();
            got.sort_unstable();
            assert_eq!(got, as_u32(want), "{name}: experts layer {layer}");
        }
        for (layer, want) in p["indexer_selected_last_position"].as_object().unwrap() {
            let got = rec.indexer[&(layer.parse().unwrap(), n - 1)].clone();
            match want.as_str() {
                Some("all") => assert!(got.is_none(), "{name}: layer {layer} should be dense"),
                _ => assert_eq!(got.unwrap(), as_u32(want), "{name}: indexer layer {layer}"),
            }
        }
        // MTP drafts at the recorded positions (inputs: hidden at p, token p + 1).
        let mut next: Vec<u32> = ids[1..].to_vec();
        next.push(argmax(&logits[(n - 1) * v..n * v]));
        let hm = model
            .mtp_forward(
                &mut [MtpStep {
                    cache: &mut cache,
                    hidden: &hidden,
                    next_tokens: &next,
                }],
                &mut rec,
            )
            .unwrap();
        let draft = model.mtp_logits(&hm).unwrap();
        let mut worst = 0.0f32;
        for t in p["mtp_top_logits"].as_array().unwrap() {
            let pos = t["position"].as_u64().unwrap() as usize;
            let row = &draft[pos * v..(pos + 1) * v];
            for (id, want) in as_u32(&t["ids"])
                .iter()
                .zip(t["logits"].as_array().unwrap())
            {
                worst = worst.max((row[*id as usize] - want.as_f64().unwrap() as f32).abs());
            }
            assert_eq!(
                argmax(row),
                as_u32(&t["ids"])[0],
                "{name}: MTP argmax at {pos}"
            );
        }
        assert!(worst <= 1e-3, "{name}: MTP top logits max |Δ| = {worst}");
        // Greedy continuation with the cache, stopping at an eos id.
        let want = as_u32(&p["greedy_ids"]);
        let mut tok = argmax(&logits[(n - 1) * v..n * v]);
        let mut got = vec![tok];
        while got.len() < want.len() && !eos.contains(&tok) {
            let h = model
                .forward(
                    &mut [SeqStep {
                        cache: &mut cache,
                        tokens: &[tok],
                    }],
                    &mut rec,
                )
                .unwrap();
            tok = argmax(&model.logits(&h).unwrap());
            got.push(tok);
        }
        assert_eq!(got, want, "{name}: greedy continuation");
    }
}
