//! Parity with the Hugging Face transformers fixtures (`tests/fixtures/glm-tiny`).
//!
//! Tolerances: logits and hiddens within 1e-4 absolute (the fixtures' max |logit| is ≈ 9.5, so
//! this is ≈ 1e-5 relative; HF fp32 and an f64 re-implementation differ by ≤ 9.3e-6); router ids,
//! indexer selections and greedy tokens exact; router weights within 1e-5.
mod common;
use common::*;
use nectar_model::{Glm5, MlaMode, MtpStep, NoObserver, SeqStep};

const TOL: f64 = 1e-4;

fn run_variant(variant: &str) {
    let dir = fixture_dir(variant);
    let model = Glm5::load(&dir.join("model")).unwrap();
    let exp = Expected::load(&dir);
    let prompt = exp.ids("prompt_ids");
    let generated = exp.ids("generated_ids");
    let s = prompt.len();

    // 1. One prefill of the prompt: layer outputs, final hidden, logits, selections.
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
    let logits = model.logits(&hidden).unwrap();
    let (v, hd) = (model.vocab_size(), model.hidden_size());
    let mut worst = 0.0f64;
    for p in 0..s {
        worst = worst.max(max_abs(
            &logits[p * v..(p + 1) * v],
            &exp.row("prompt_logits", p),
        ));
        assert!(
            max_abs(
                &hidden[p * hd..(p + 1) * hd],
                &exp.row("prompt_final_hidden", p)
            ) <= TOL
        );
        for (l, x) in rec.layers.iter().enumerate() {
            assert!(
                max_abs(
                    &x[p * hd..(p + 1) * hd],
                    &exp.row("prompt_layer_outputs", l * s + p)
                ) <= TOL,
                "layer {l} pos {p}"
            );
        }
    }
    assert!(worst <= TOL, "{variant}: prompt logits max |Δ| = {worst:e}");
    eprintln!("{variant}: prompt logits max |Δ| = {worst:.3e}");
    let prompt_argmax: Vec<u32> = (0..s)
        .map(|p| argmax(&logits[p * v..(p + 1) * v]))
        .collect();
    assert_eq!(prompt_argmax, exp.ids("prompt_argmax"));
    check_selections(&exp, &rec, 0..s);

    // 2. Cached greedy decode: 32/32 tokens, decode logits, selections at decode positions.
    let mut next = argmax(&logits[(s - 1) * v..s * v]);
    let mut out = vec![next];
    let mut worst = max_abs(&logits[(s - 1) * v..s * v], &exp.row("decode_logits", 0));
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
        worst = worst.max(max_abs(&l, &exp.row("decode_logits", i)));
        next = argmax(&l);
        out.push(next);
    }
    assert_eq!(out, generated, "{variant}: greedy tokens");
    assert!(worst <= TOL, "{variant}: decode logits max |Δ| = {worst:e}");
    eprintln!("{variant}: decode logits max |Δ| = {worst:.3e}");
    check_selections(&exp, &rec, s..s + generated.len() - 1);

    // 3. Prefill-then-decode equals one full forward of prompt + generated.
    let seq = exp.ids("sequence_ids");
    let mut c2 = model.new_cache();
    let h = model
        .forward(
            &mut [SeqStep {
                cache: &mut c2,
                tokens: &seq,
            }],
            &mut NoObserver,
        )
        .unwrap();
    let l = model.logits(&h).unwrap();
    let worst = (0..seq.len())
        .map(|p| max_abs(&l[p * v..(p + 1) * v], &exp.row("sequence_logits", p)))
        .fold(0.0, f64::max);
    assert!(
        worst <= TOL,
        "{variant}: sequence logits max |Δ| = {worst:e}"
    );

    // 4. MTP over the prompt (own cache from position 0): drafts at the reported positions.
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
    let mtp = &exp.json["mtp"];
    let all: Vec<u32> = mtp["argmax_all_prompt_positions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let got_all: Vec<u32> = (0..s).map(|p| argmax(&draft[p * v..(p + 1) * v])).collect();
    assert_eq!(got_all, all, "{variant}: MTP argmax over prompt positions");
    let mut worst = 0.0f64;
    for (j, p) in mtp["positions"].as_array().unwrap().iter().enumerate() {
        let p = p.as_u64().unwrap() as usize;
        worst = worst.max(max_abs(
            &draft[p * v..(p + 1) * v],
            &exp.row("mtp_draft_logits", j),
        ));
        assert!(max_abs(&hm[p * hd..(p + 1) * hd], &exp.row("mtp_hidden", j)) <= TOL);
    }
    assert!(worst <= TOL, "{variant}: MTP logits max |Δ| = {worst:e}");
    eprintln!("{variant}: MTP draft logits max |Δ| = {worst:.3e}");
}

#[test]
fn glm5_all_full_indexers_matches_hf() {
    run_variant("glm5");
}

#[test]
fn glm52_indexshare_matches_hf() {
    run_variant("glm52");
}

/// The absorbed and reconstructed MLA forms agree — the reconstructed one also when it rebuilds
/// K/V a few keys at a time (a running softmax over blocks, as past 256 MiB of K/V).
#[test]
fn absorbed_and_reconstructed_mla_agree() {
    let dir = fixture_dir("glm52");
    let mut model = Glm5::load(&dir.join("model")).unwrap();
    let exp = Expected::load(&dir);
    let seq = exp.ids("sequence_ids");
    let run = |model: &Glm5| {
        let mut c = model.new_cache();
        let h = model
            .forward(
                &mut [SeqStep {
                    cache: &mut c,
                    tokens: &seq,
                }],
                &mut NoObserver,
            )
            .unwrap();
        model.logits(&h).unwrap()
    };
    model.mla_mode = MlaMode::Reconstructed;
    let a = run(&model);
    model.mla_mode = MlaMode::Absorbed;
    let b = run(&model);
    let d = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(d <= 2e-5, "absorbed vs reconstructed max |Δ| = {d:e}");
    for (keys, tile) in [(1, 1), (3, 2), (7, 3), (7, 7)] {
        model.mla_mode = MlaMode::ReconstructedInBlocks { keys, tile };
        let c = run(&model);
        let d = a
            .iter()
            .zip(&c)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(
            d <= 2e-5,
            "blocks of {keys} keys, tiles of {tile}, vs one block: max |Δ| = {d:e}"
        );
    }
}

/// Batching sequences together does not change any row's bits (absorbed rows), and batched
/// decode equals decoding each sequence alone.
#[test]
fn batch_rows_are_independent() {
    let dir = fixture_dir("glm5");
    let model = Glm5::load(&dir.join("model")).unwrap();
    let exp = Expected::load(&dir);
    let prompt = exp.ids("prompt_ids");
    let (a_prompt, b_prompt) = (&prompt[..10], &prompt[5..20]);
    let prefill = |p: &[u32]| {
        let mut c = model.new_cache();
        model
            .forward(
                &mut [SeqStep {
                    cache: &mut c,
                    tokens: p,
                }],
                &mut NoObserver,
            )
            .unwrap();
        c
    };
    let (mut ca, mut cb) = (prefill(a_prompt), prefill(b_prompt));
    let (mut ca2, mut cb2) = (ca.clone(), cb.clone());
    let alone_a = model
        .forward(
            &mut [SeqStep {
                cache: &mut ca,
                tokens: &[7, 9],
            }],
            &mut NoObserver,
        )
        .unwrap();
    let alone_b = model
        .forward(
            &mut [SeqStep {
                cache: &mut cb,
                tokens: &[11],
            }],
            &mut NoObserver,
        )
        .unwrap();
    let both = model
        .forward(
            &mut [
                SeqStep {
                    cache: &mut ca2,
                    tokens: &[7, 9],
                },
                SeqStep {
                    cache: &mut cb2,
                    tokens: &[11],
                },
            ],
            &mut NoObserver,
        )
        .unwrap();
    let hd = model.hidden_size();
    assert_eq!(&both[..2 * hd], &alone_a[..]);
    assert_eq!(&both[2 * hd..], &alone_b[..]);
}

/// A prompt chunk long enough for the reconstructed form, batched beside another sequence's
/// decode row (absorbed), leaves every row's bits as they are alone: the plain rows are
/// gathered apart from the reconstructed ones and put back in their places.
#[test]
fn a_prompt_beside_decode_rows_keeps_every_rows_bits() {
    let dir = fixture_dir("glm5");
    let model = Glm5::load(&dir.join("model")).unwrap();
    let exp = Expected::load(&dir);
    let prompt = exp.ids("prompt_ids");
    let (a_prompt, b_prompt) = (&prompt[..6], &prompt[3..15]);
    let mut ca = model.new_cache();
    model
        .forward(
            &mut [SeqStep {
                cache: &mut ca,
                tokens: a_prompt,
            }],
            &mut NoObserver,
        )
        .unwrap();
    let (a0, b0) = (ca.clone(), model.new_cache());
    let mut cb = b0.clone();
    let alone = |c: &mut _, t: &[u32]| {
        model
            .forward(
                &mut [SeqStep {
                    cache: c,
                    tokens: t,
                }],
                &mut NoObserver,
            )
            .unwrap()
    };
    let alone_a = alone(&mut ca, &[7]);
    let alone_b = alone(&mut cb, b_prompt);
    // Decode row first, then the chunk; and the other way round.
    for order in [false, true] {
        let (mut a, mut b) = (a0.clone(), b0.clone());
        let (x, y) = (
            SeqStep {
                cache: &mut a,
                tokens: &[7],
            },
            SeqStep {
                cache: &mut b,
                tokens: b_prompt,
            },
        );
        let hd = model.hidden_size();
        if order {
            let both = model.forward(&mut [y, x], &mut NoObserver).unwrap();
            let (b_rows, a_row) = both.split_at(b_prompt.len() * hd);
            assert_eq!(a_row, &alone_a[..], "decode row after the chunk");
            assert_eq!(b_rows, &alone_b[..], "chunk before the decode row");
        } else {
            let both = model.forward(&mut [x, y], &mut NoObserver).unwrap();
            let (a_row, b_rows) = both.split_at(hd);
            assert_eq!(a_row, &alone_a[..], "decode row before the chunk");
            assert_eq!(b_rows, &alone_b[..], "chunk after the decode row");
        }
    }
}
