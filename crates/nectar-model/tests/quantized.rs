//! The quantised container path against the fixtures: codes and scales bit-exact with the
//! fixture's `codes.safetensors`, and a converted int4-g32 fixture model matching the quantised
//! HF oracle (`quant/int4_g32`) — logits within 1e-4, greedy tokens, router ids and indexer
//! selections exact.
mod common;
use common::*;
use nectar_format::convert::{convert, Bits, ConvertParams};
use nectar_format::quant::{quantize_int4_row, quantize_int8_row};
use nectar_format::Catalog;
use nectar_model::{Glm5, SeqStep};

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn codes_and_scales_are_bit_exact() {
    for variant in ["glm5", "glm52"] {
        let dir = fixture_dir(variant);
        let model = Catalog::open(&dir.join("model")).unwrap();
        let codes = Catalog::open(&dir.join("quant")).unwrap();
        let mut checked = 0;
        for e in codes.tensors().filter(|e| e.name.ends_with("/codes")) {
            let parts: Vec<&str> = e.name.split('/').collect();
            let (tensor, scheme) = (parts[0], parts[1]);
            let w = f32s(model.bytes(model.get(tensor).unwrap()));
            let (o, i) = (e.shape[0], e.shape[1]);
            let want_codes: Vec<i8> = codes.bytes(e).iter().map(|b| *b as i8).collect();
            let want_scales =
                f32s(codes.bytes(codes.get(&format!("{tensor}/{scheme}/scales")).unwrap()));
            let (mut bytes, mut scales) = (Vec::new(), Vec::new());
            for r in 0..o {
                let row = &w[r * i..(r + 1) * i];
                match scheme {
                    "int4_row" => quantize_int4_row(row, 0, &mut bytes, &mut scales),
                    "int4_g32" => quantize_int4_row(row, 32, &mut bytes, &mut scales),
                    "int8_row" => quantize_int8_row(row, &mut bytes, &mut scales),
                    other => panic!("unknown scheme {other}"),
                }
            }
            let got: Vec<i8> = if scheme.starts_with("int4") {
                let rb = i.div_ceil(2);
                (0..o * i)
                    .map(|k| {
                        let (r, c) = (k / i, k % i);
                        let b = bytes[r * rb + c / 2];
                        (if c % 2 == 0 { b & 15 } else { b >> 4 }) as i8 - 8
                    })
                    .collect()
            } else {
                bytes.iter().map(|b| *b as i8).collect()
            };
            assert_eq!(got, want_codes, "{variant} {tensor} {scheme} codes");
            let sb: Vec<u32> = scales.iter().map(|s| s.to_bits()).collect();
            let wb: Vec<u32> = want_scales.iter().map(|s| s.to_bits()).collect();
            assert_eq!(sb, wb, "{variant} {tensor} {scheme} scales");
            checked += 1;
        }
        assert_eq!(checked, 9, "3 tensors × 3 schemes");
    }
}

/// The oracle's scheme: every 2-D linear of the main layers int4 g32; embed, head, norms,
/// router, indexer weights_proj and the MTP layer kept in f32.
fn oracle_params(n_layers: usize) -> ConvertParams {
    ConvertParams {
        expert_bits: Bits::Int4,
        attn_bits: Bits::Int4,
        shared_bits: Bits::Int4,
        dense_bits: Bits::Int4,
        io_bits: Bits::Float,
        mtp_bits: Bits::Float,
        indexer_bits: Bits::Int4,
        group_size: 32,
        n_layers,
    }
}

fn run_quantized(variant: &str) {
    let dir = fixture_dir(variant);
    let out = tempfile::tempdir().unwrap();
    convert(
        &dir.join("model"),
        out.path(),
        &oracle_params(4),
        0,
        &mut |_| {},
    )
    .unwrap();
    let model = Glm5::load(out.path()).unwrap();
    let exp = Expected::load(&dir.join("quant/int4_g32"));
    let prompt = exp.ids("prompt_ids");
    let generated = exp.ids("generated_ids");
    let v = model.vocab_size();
    let mut cache = model.new_cache();
    let mut rec = Recorder::default();
    let h = model
        .forward(
            &mut [SeqStep {
                cache: &mut cache,
                tokens: &prompt,
            }],
            &mut rec,
        )
        .unwrap();
    let logits = model.logits(&h).unwrap();
    let s = prompt.len();
    let worst = (0..s)
        .map(|p| max_abs(&logits[p * v..(p + 1) * v], &exp.row("prompt_logits", p)))
        .fold(0.0, f64::max);
    assert!(
        worst <= 1e-4,
        "{variant} int4_g32 prompt logits max |Δ| = {worst:e}"
    );
    eprintln!("{variant} int4_g32: prompt logits max |Δ| = {worst:.3e}");
    let mut tok = argmax(&logits[(s - 1) * v..]);
    let mut got = vec![tok];
    for i in 1..generated.len() {
        rec.base = s + i - 1;
        let h = model
            .forward(
                &mut [SeqStep {
                    cache: &mut cache,
                    tokens: &[tok],
                }],
                &mut rec,
            )
            .unwrap();
        let l = model.logits(&h).unwrap();
        assert!(
            max_abs(&l, &exp.row("decode_logits", i)) <= 1e-4,
            "{variant} decode step {i}"
        );
        tok = argmax(&l);
        got.push(tok);
    }
    assert_eq!(got, generated, "{variant} int4_g32 greedy");
    check_selections(&exp, &rec, 0..s + generated.len() - 1);
}

#[test]
fn converted_glm5_int4_g32_matches_quantised_oracle() {
    run_quantized("glm5");
}

#[test]
fn converted_glm52_int4_g32_matches_quantised_oracle() {
    run_quantized("glm52");
}
