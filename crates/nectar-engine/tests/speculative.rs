//! Speculative decoding end to end: greedy identity with plain decoding
//! (MTP and prompt lookup, the demo model and both HF fixtures), `auto`,
//! reproducible sampling, and stops and cancellation inside accepted runs.

use nectar_engine::{
    generate_speculative, generate_with, FinishReason, Generation, ModelBundle, Request,
    SamplingParams, Speculation, Speculator, Step, StopCause,
};
use nectar_model::Glm5;
use serde_json::Value;
use std::path::Path;
use std::sync::OnceLock;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn demo() -> &'static ModelBundle {
    static B: OnceLock<ModelBundle> = OnceLock::new();
    B.get_or_init(|| ModelBundle::open(&Path::new(ROOT).join("models/nectar-demo-glm5")).unwrap())
}

fn json(path: &str) -> Value {
    let text = std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// `(name, input_ids)` of every reference prompt of the demo model.
fn demo_prompts() -> Vec<(String, Vec<u32>)> {
    json("models/nectar-demo-glm5/reference.json")["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                ids(&p["input_ids"]),
            )
        })
        .collect()
}

fn mtp(gamma: usize) -> Speculation {
    Speculation {
        speculator: Speculator::Mtp { gamma },
        auto: false,
    }
}

fn ok(_: &Step) -> nectar_engine::Result<bool> {
    Ok(true)
}

/// Ids-only generation with no stop ids (so runs are long and comparable).
fn run(model: &Glm5, req: &Request, spec: Option<&Speculation>) -> Generation {
    generate_speculative(model, None, &[], req, spec, ok).unwrap()
}

fn plain(model: &Glm5, req: &Request) -> Vec<u32> {
    generate_with(model, None, &[], req, ok).unwrap().tokens
}

#[test]
fn mtp_greedy_is_token_identical_on_the_demo_model() {
    let model = &demo().model;
    for (name, prompt) in demo_prompts() {
        let req = Request::new(prompt, 80);
        let want = plain(model, &req);
        assert_eq!(want.len(), 80);
        for gamma in 1..=3 {
            let gen = run(model, &req, Some(&mtp(gamma)));
            assert_eq!(gen.tokens, want, "{name}, γ = {gamma}");
            let s = gen.spec.unwrap();
            assert_eq!(s.mode, "mtp");
            assert!(s.drafted > 0 && s.accepted > 0, "{name} γ={gamma}: {s:?}");
            assert!(
                s.accepted < s.drafted,
                "{name} γ={gamma}: no rejection exercised"
            );
            assert_eq!(s.forwards_saved + s.main_forwards, 79);
            assert!(s.tokens_per_forward > 1.0, "{name} γ={gamma}: {s:?}");
        }
    }
}

#[test]
fn mtp_greedy_reproduces_both_fixtures() {
    for variant in ["glm5", "glm52"] {
        let dir = format!("tests/fixtures/glm-tiny/{variant}");
        let model = Glm5::load(&Path::new(ROOT).join(&dir).join("model")).unwrap();
        let exp = json(&format!("{dir}/expected.json"));
        let (prompt, want) = (ids(&exp["prompt_ids"]), ids(&exp["generated_ids"]));
        let req = Request::new(prompt, want.len());
        assert_eq!(plain(&model, &req), want, "{variant} plain");
        for gamma in 1..=3 {
            let gen = run(&model, &req, Some(&mtp(gamma)));
            assert_eq!(gen.tokens, want, "{variant}, γ = {gamma}");
            let s = gen.spec.unwrap();
            assert!(s.drafted > 0, "{variant}: {s:?}");
        }
    }
}

#[test]
fn prompt_lookup_greedy_is_token_identical() {
    let model = &demo().model;
    for (name, prompt) in demo_prompts() {
        // The prompt twice: the second copy is full of n-gram matches.
        let twice: Vec<u32> = prompt.iter().chain(&prompt).copied().collect();
        let req = Request::new(twice, 48);
        let want = plain(model, &req);
        for (ngram, max_draft) in [(1, 3), (2, 2), (3, 3)] {
            let spec = Speculation {
                speculator: Speculator::PromptLookup { ngram, max_draft },
                auto: false,
            };
            let gen = run(model, &req, Some(&spec));
            assert_eq!(gen.tokens, want, "{name}, n = {ngram}");
            let s = gen.spec.unwrap();
            assert_eq!(s.mode, "prompt-lookup");
            assert_eq!(s.draft_forwards, 0);
            assert!(s.drafted > 0, "{name} n={ngram}: {s:?}");
        }
    }
}

#[test]
fn auto_keeps_greedy_output_and_reports_its_decisions() {
    let model = &demo().model;
    let (_, prompt) = demo_prompts().swap_remove(3);
    let req = Request::new(prompt, 128);
    let want = plain(model, &req);
    let spec = Speculation {
        speculator: Speculator::Mtp { gamma: 3 },
        auto: true,
    };
    let gen = run(model, &req, Some(&spec));
    assert_eq!(gen.tokens, want);
    let s = gen.spec.unwrap();
    assert!(s.auto && !s.decisions.is_empty(), "{s:?}");
    let d = &s.decisions[0];
    assert_eq!(d.expected_tok_s.len(), 4);
    assert!(d.expected_tok_s.iter().all(Option::is_some), "{d:?}");
    assert!(
        d.reason.starts_with(&format!("γ={}", d.gamma)),
        "{}",
        d.reason
    );
    assert_eq!(s.final_gamma, s.decisions.last().unwrap().gamma);
}

fn sampled(prompt: &[u32], seed: u64, n: usize) -> Request {
    Request {
        params: SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            seed: Some(seed),
            repetition_penalty: 1.1,
            logprobs: Some(2),
            ..SamplingParams::default()
        },
        ..Request::new(prompt.to_vec(), n)
    }
}

#[test]
fn sampled_mtp_is_reproducible_with_a_seed() {
    let model = &demo().model;
    let (_, prompt) = demo_prompts().swap_remove(1);
    let a = run(model, &sampled(&prompt, 11, 48), Some(&mtp(2)));
    let b = run(model, &sampled(&prompt, 11, 48), Some(&mtp(2)));
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.logprobs, b.logprobs);
    assert_eq!(a.tokens.len(), a.logprobs.len());
    let s = a.spec.unwrap();
    assert!(s.accepted > 0 && s.accepted < s.drafted, "{s:?}");
    assert!(
        (12..16)
            .any(|seed| run(model, &sampled(&prompt, seed, 48), Some(&mtp(2))).tokens != a.tokens),
        "every seed sampled the same tokens"
    );
}

#[test]
fn stops_inside_an_accepted_run_end_where_plain_decoding_does() {
    let b = demo();
    let model = &b.model;
    let (_, prompt) = demo_prompts().swap_remove(1);
    let want = plain(model, &Request::new(prompt.clone(), 32));
    // A stop id in the middle of the output (its first occurrence).
    let stop = want[9];
    let first = want.iter().position(|&t| t == stop).unwrap();
    let req = Request {
        extra_stop_ids: vec![stop],
        ..Request::new(prompt.clone(), 32)
    };
    for spec in [None, Some(mtp(3))] {
        let gen = generate_speculative(model, None, &[], &req, spec.as_ref(), ok).unwrap();
        assert_eq!(gen.tokens, want[..=first], "{spec:?}");
        assert_eq!(gen.finish, FinishReason::Stop);
        assert_eq!(gen.stop, Some(StopCause::Token(stop)));
    }
    // A stop string, with text: the same text and tokens as plain decoding.
    let req = Request {
        stop_strings: vec!["never".into(), "\\ n".into()],
        ..Request::new(prompt, 32)
    };
    let tok = b.tokenizer.as_ref();
    let plain = generate_with(model, tok, &b.stop_ids, &req, ok).unwrap();
    for gamma in 1..=3 {
        let mut streamed = String::new();
        let gen = generate_speculative(model, tok, &b.stop_ids, &req, Some(&mtp(gamma)), |s| {
            streamed += &s.text;
            Ok(true)
        })
        .unwrap();
        assert_eq!(gen.tokens, plain.tokens, "γ = {gamma}");
        assert_eq!(gen.text, plain.text);
        assert_eq!(streamed, gen.text);
        assert_eq!(gen.stop, Some(StopCause::String("\\ n".into())));
    }
}

#[test]
fn eos_inside_a_run_and_max_tokens_are_exact() {
    let b = demo();
    let (_, prompt) = demo_prompts().swap_remove(0);
    // en_text ends with <|endoftext|> after 8 tokens.
    let req = Request::new(prompt, 64);
    let want = generate_with(&b.model, None, &b.stop_ids, &req, ok).unwrap();
    let gen = generate_speculative(&b.model, None, &b.stop_ids, &req, Some(&mtp(3)), ok).unwrap();
    assert_eq!(gen.tokens, want.tokens);
    assert_eq!(gen.finish, FinishReason::Stop);
    // max_tokens that is not a multiple of the round length.
    for n in [1, 2, 5, 7] {
        let req = Request::new(demo_prompts().swap_remove(3).1, n);
        let gen = run(&b.model, &req, Some(&mtp(3)));
        assert_eq!(gen.tokens.len(), n);
        assert_eq!(gen.tokens, plain(&b.model, &req));
        assert_eq!(gen.finish, FinishReason::Length);
    }
}

#[test]
fn cancel_inside_a_run_ends_at_the_cancelled_token() {
    let model = &demo().model;
    let (_, prompt) = demo_prompts().swap_remove(3);
    let req = Request::new(prompt, 40);
    let want = plain(model, &req);
    for stop_after in [2, 5, 9] {
        let mut n = 0;
        let gen = generate_speculative(model, None, &[], &req, Some(&mtp(3)), |_| {
            n += 1;
            Ok(n < stop_after)
        })
        .unwrap();
        assert_eq!(gen.tokens, want[..stop_after]);
        assert_eq!(gen.finish, FinishReason::Cancelled);
        assert_eq!(gen.stop, None);
    }
}

#[test]
fn bad_speculation_settings_are_refused() {
    let model = &demo().model;
    let req = Request::new(vec![1, 2, 3], 4);
    for (spec, param) in [
        (mtp(4), "draft_tokens"),
        (mtp(0), "draft_tokens"),
        (
            Speculation {
                speculator: Speculator::PromptLookup {
                    ngram: 0,
                    max_draft: 2,
                },
                auto: false,
            },
            "prompt_lookup",
        ),
    ] {
        let err = generate_speculative(model, None, &[], &req, Some(&spec), ok).unwrap_err();
        assert!(
            matches!(err, nectar_engine::Error::InvalidParam { param: p, .. } if p == param),
            "{err}"
        );
    }
}
