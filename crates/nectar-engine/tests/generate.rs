//! The serial driver end to end on the demo model.

use nectar_engine::{generate, FinishReason, ModelBundle, Request, SamplingParams, StopCause};
use serde_json::Value;
use std::path::Path;
use std::sync::OnceLock;

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/nectar-demo-glm5");

fn bundle() -> &'static ModelBundle {
    static B: OnceLock<ModelBundle> = OnceLock::new();
    B.get_or_init(|| ModelBundle::open(Path::new(DEMO)).unwrap())
}

/// `(input_ids, greedy_ids)` of a reference prompt.
fn reference(name: &str) -> (Vec<u32>, Vec<u32>) {
    let text = std::fs::read_to_string(Path::new(DEMO).join("reference.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let p = v["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap();
    let ids = |k: &str| -> Vec<u32> {
        p[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    (ids("input_ids"), ids("greedy_ids"))
}

/// Runs `req`, checking that the streamed step texts add up to the result.
fn run(req: &Request) -> nectar_engine::Generation {
    let mut streamed = String::new();
    let gen = generate(bundle(), req, |s| {
        streamed += &s.text;
        Ok(true)
    })
    .unwrap();
    assert_eq!(streamed, gen.text);
    gen
}

#[test]
fn greedy_matches_the_reference() {
    let (prompt, greedy) = reference("chat");
    let gen = run(&Request::new(prompt, greedy.len()));
    assert_eq!(gen.tokens, greedy);
    assert_eq!(gen.finish, FinishReason::Length);
    assert!(gen.text.starts_with("harbor \\harbor\\ n."), "{}", gen.text);
}

#[test]
fn greedy_ends_on_the_eos_token() {
    // The en_text reference continuation ends with <|endoftext|>.
    let (prompt, greedy) = reference("en_text");
    let gen = run(&Request::new(prompt, 64));
    assert_eq!(gen.tokens, greedy);
    assert_eq!(gen.finish, FinishReason::Stop);
    assert_eq!(gen.stop, Some(StopCause::Token(*greedy.last().unwrap())));
    assert_eq!(gen.text, " and the light was not light.\n");
}

#[test]
fn seeded_sampling_is_reproducible() {
    let (prompt, _) = reference("chat");
    let req = |seed| Request {
        params: SamplingParams {
            temperature: 1.2,
            top_p: 0.95,
            seed: Some(seed),
            ..SamplingParams::default()
        },
        ..Request::new(prompt.clone(), 12)
    };
    let a = run(&req(7));
    let b = run(&req(7));
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.text, b.text);
    assert_eq!(a.seed, 7);
    // Some other seed takes another path at this temperature.
    assert!(
        (8..12).any(|s| run(&req(s)).tokens != a.tokens),
        "every seed sampled the same tokens"
    );
}

#[test]
fn stop_string_cuts_the_text() {
    let (prompt, _) = reference("chat");
    let req = Request {
        stop_strings: vec!["never".into(), "\\ n".into()],
        ..Request::new(prompt, 32)
    };
    let gen = run(&req);
    assert_eq!(gen.text, "harbor \\harbor");
    assert_eq!(gen.finish, FinishReason::Stop);
    assert_eq!(gen.stop, Some(StopCause::String("\\ n".into())));
    assert!(gen.tokens.len() < 32);
}

#[test]
fn unicode_stop_string_in_model_output() {
    // The zh reference continues with "谁怨春风。".
    let (prompt, _) = reference("zh");
    let req = Request {
        stop_strings: vec!["春风".into()],
        ..Request::new(prompt, 16)
    };
    let gen = run(&req);
    assert_eq!(gen.text, "谁怨");
    assert_eq!(gen.finish, FinishReason::Stop);
}

#[test]
fn logprobs_and_bias_on_the_model() {
    let (prompt, greedy) = reference("chat");
    let req = Request {
        params: SamplingParams {
            logprobs: Some(3),
            ..SamplingParams::default()
        },
        ..Request::new(prompt.clone(), 4)
    };
    let gen = run(&req);
    assert_eq!(gen.tokens, greedy[..4]);
    assert_eq!(gen.logprobs.len(), 4);
    for (lp, &id) in gen.logprobs.iter().zip(&gen.tokens) {
        // Greedy picks the most likely token.
        assert_eq!(lp.top[0], (id, lp.logprob));
        assert!(lp.logprob <= 0.0 && lp.top.len() == 3);
        assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
    }
    // Banning the greedy first token makes the runner-up win.
    let ban = Request {
        params: SamplingParams {
            logit_bias: [(greedy[0], -100.0)].into(),
            ..SamplingParams::default()
        },
        ..Request::new(prompt, 1)
    };
    assert_eq!(run(&ban).tokens, [gen.logprobs[0].top[1].0]);
}

#[test]
fn cancel_stops_after_the_current_token() {
    let (prompt, greedy) = reference("chat");
    let mut n = 0;
    let gen = generate(bundle(), &Request::new(prompt, 32), |_| {
        n += 1;
        Ok(n < 3)
    })
    .unwrap();
    assert_eq!(gen.tokens, greedy[..3]);
    assert_eq!(gen.finish, FinishReason::Cancelled);
}
