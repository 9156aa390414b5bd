//! Structured output on the demo model: outputs always match their JSON
//! schema, regex or Lark grammar (greedy and sampled), `max_tokens` cutting
//! a JSON output is a `length` finish, forced tokens are fast-forwarded,
//! speculative decoding composes with the grammar, and bad grammars are
//! rejected up front naming the parameter.

use nectar_engine::{
    generate, generate_spec, Error, FinishReason, Generation, GrammarSpec, ModelBundle, Request,
    SamplingParams, Speculation, Speculator, Step, StopCause,
};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::OnceLock;

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/nectar-demo-glm5");

fn bundle() -> &'static ModelBundle {
    static B: OnceLock<ModelBundle> = OnceLock::new();
    B.get_or_init(|| ModelBundle::open(Path::new(DEMO)).unwrap())
}

fn request(
    prompt: &str,
    grammar: GrammarSpec,
    max_tokens: usize,
    params: SamplingParams,
) -> Request {
    Request {
        params,
        grammar: Some(grammar),
        ..Request::new(bundle().encode_chat(prompt).unwrap(), max_tokens)
    }
}

fn greedy() -> SamplingParams {
    SamplingParams::default()
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

/// Plain decoding; checks that the streamed text adds up to the result.
fn run(req: &Request) -> Generation {
    let mut streamed = String::new();
    let gen = generate(bundle(), req, |s: &Step| {
        streamed += &s.text;
        Ok(true)
    })
    .unwrap();
    assert_eq!(streamed, gen.text);
    gen
}

fn run_spec(req: &Request, spec: &Speculation) -> Generation {
    generate_spec(bundle(), req, Some(spec), |_| Ok(true)).unwrap()
}

/// A structured output that ended because it was complete: the grammar
/// finished it, or it was accepting and the model chose a stop token.
fn assert_complete(gen: &Generation) {
    assert_eq!(gen.finish, FinishReason::Stop, "{:?}", gen.text);
    assert!(
        matches!(gen.stop, Some(StopCause::Grammar | StopCause::Token(_))),
        "{:?}",
        gen.stop
    );
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 12},
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "color": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}
        },
        "required": ["name", "age", "color"],
        "additionalProperties": false
    })
}

/// Hand validation against [`person_schema`].
fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {text}"));
    for k in obj.keys() {
        assert!(
            ["name", "age", "color", "tags"].contains(&k.as_str()),
            "{text}"
        );
    }
    let name = obj["name"].as_str().unwrap_or_else(|| panic!("{text}"));
    assert!((1..=12).contains(&name.chars().count()), "{text}");
    let age = obj["age"].as_i64().unwrap_or_else(|| panic!("{text}"));
    assert!((18..=99).contains(&age), "{text}");
    assert!(
        ["red", "green", "blue"].contains(&obj["color"].as_str().unwrap()),
        "{text}"
    );
    if let Some(tags) = obj.get("tags") {
        let tags = tags.as_array().unwrap();
        assert!(
            tags.len() <= 3 && tags.iter().all(Value::is_boolean),
            "{text}"
        );
    }
}

#[test]
fn json_schema_outputs_validate_greedy_and_sampled() {
    let mut params = vec![greedy()];
    params.extend((1..=4).map(sampled));
    for p in params {
        let req = request(
            "Describe a person as JSON.",
            GrammarSpec::JsonSchema(person_schema()),
            160,
            p,
        );
        let gen = run(&req);
        assert_complete(&gen);
        check_person(&gen.text);
    }
}

#[test]
fn json_object_outputs_parse_as_objects() {
    for p in [greedy(), sampled(7)] {
        let gen = run(&request(
            "Some JSON please.",
            GrammarSpec::JsonObject,
            200,
            p,
        ));
        if gen.finish == FinishReason::Stop {
            let v: Value = serde_json::from_str(&gen.text).unwrap();
            assert!(v.is_object(), "{}", gen.text);
        } else {
            // An unbounded object may run out of tokens; it must still be
            // a prefix of one and be reported as cut.
            assert_eq!(gen.finish, FinishReason::Length);
            assert!(gen.text.trim_start().starts_with('{'), "{}", gen.text);
        }
    }
}

#[test]
fn regex_outputs_fully_match() {
    let rx = r"(yes|no), [a-z]{2,8} [0-9]{1,3}(\.[0-9])?";
    let full = regex::Regex::new(&format!("^(?:{rx})$")).unwrap();
    let mut params = vec![greedy()];
    params.extend((11..=13).map(sampled));
    for p in params {
        let gen = run(&request("Answer.", GrammarSpec::Regex(rx.into()), 40, p));
        assert_complete(&gen);
        assert!(full.is_match(&gen.text), "{:?}", gen.text);
    }
}

#[test]
fn lark_outputs_parse() {
    let lark = r#"
start: greeting ", " name "! " list
greeting: "hello" | "goodbye"
name: /[A-Z][a-z]{1,8}/
list: "[" item ("," item)* "]"
item: /[0-9]{1,2}/
"#;
    // The same language by hand: greeting, name, then 1+ comma-separated
    // numbers, where the number list may not be cut short.
    let parse = |s: &str| -> bool {
        let Some((greet, rest)) = s.split_once(", ") else {
            return false;
        };
        let Some((name, list)) = rest.split_once("! ") else {
            return false;
        };
        let name_ok = name.len() >= 2
            && name.len() <= 9
            && name.chars().next().unwrap().is_ascii_uppercase()
            && name.chars().skip(1).all(|c| c.is_ascii_lowercase());
        let Some(items) = list.strip_prefix('[').and_then(|l| l.strip_suffix(']')) else {
            return false;
        };
        let items_ok = items
            .split(',')
            .all(|i| (1..=2).contains(&i.len()) && i.bytes().all(|b| b.is_ascii_digit()));
        ["hello", "goodbye"].contains(&greet) && name_ok && items_ok
    };
    assert!(parse("hello, Ann! [1,22]") && !parse("hello, ann! [1]"));
    for p in [greedy(), sampled(21), sampled(22)] {
        let gen = run(&request("Greet.", GrammarSpec::Lark(lark.into()), 60, p));
        assert_complete(&gen);
        assert!(parse(&gen.text), "{:?}", gen.text);
    }
}

#[test]
fn max_tokens_cutting_json_is_a_length_finish() {
    let req = request(
        "Describe a person as JSON.",
        GrammarSpec::JsonSchema(person_schema()),
        6,
        greedy(),
    );
    let gen = run(&req);
    assert_eq!(gen.tokens.len(), 6);
    assert_eq!(gen.finish, FinishReason::Length);
    assert_eq!(gen.stop, None);
    assert!(
        serde_json::from_str::<Value>(&gen.text).is_err(),
        "{}",
        gen.text
    );
}

const LITERAL: &str = "The quick brown fox jumps over the lazy dog and keeps running";

#[test]
fn forced_tokens_are_fast_forwarded_without_sampling() {
    let lark = format!("start: \"{LITERAL}: \" /[0-9]{{1,2}}/ \".\"");
    let req = Request {
        params: SamplingParams {
            logprobs: Some(2),
            ..greedy()
        },
        ..request("Go.", GrammarSpec::Lark(lark), 40, greedy())
    };
    let mut steps = Vec::new();
    let gen = generate(bundle(), &req, |s| {
        steps.push(s.clone());
        Ok(true)
    })
    .unwrap();
    assert_complete(&gen);
    assert!(
        gen.text.starts_with(&format!("{LITERAL}: ")),
        "{}",
        gen.text
    );
    let digits = &gen.text[LITERAL.len() + 2..gen.text.len() - 1];
    assert!(
        (1..=2).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()),
        "{}",
        gen.text
    );
    // The literal is most of the output and came without sampling: forced
    // steps say so, carry the point mass's logprob, and are counted.
    let forced: Vec<&Step> = steps.iter().filter(|s| s.forced).collect();
    assert!(
        forced.len() >= 8,
        "{} forced of {}",
        forced.len(),
        steps.len()
    );
    assert_eq!(gen.forced_tokens, forced.len());
    for s in &forced {
        let lp = s.logprobs.as_ref().unwrap();
        assert_eq!((lp.logprob, lp.top.clone()), (0.0, vec![(s.token, 0.0)]));
    }
    // The forced run is the start of the output: the grammar forces it
    // before the first forward.
    assert!(steps[0].forced);
}

#[test]
fn forced_output_matches_decoding_without_fast_forward() {
    // The same grammar driven step by step without `fast_forward` (the
    // mask alone forces the literal, one forward per token) must give the
    // same text: fast-forwarding changes the cost, not the output.
    let lark = format!("start: \"{LITERAL}: \" /[0-9]{{1,2}}/ \".\"");
    let req = request("Go.", GrammarSpec::Lark(lark), 40, greedy());
    let fast = run(&req);
    let b = bundle();
    let tok = b.tokenizer.as_ref();
    let mut state =
        nectar_engine::RequestState::new(&req, &b.stop_ids, b.model.vocab_size(), tok).unwrap();
    let mut cache = b.model.new_cache();
    let mut text = String::new();
    let mut forwards = 0;
    while let Some(input) = state.pending_input() {
        let h = b
            .model
            .forward(
                &mut [nectar_model::SeqStep {
                    cache: &mut cache,
                    tokens: input,
                }],
                &mut nectar_model::NoObserver,
            )
            .unwrap();
        forwards += 1;
        let logits = b
            .model
            .logits(&h[h.len() - b.model.hidden_size()..])
            .unwrap();
        text += &state.on_logits(&logits, None, tok).unwrap().text;
    }
    assert_eq!(text, fast.text);
    // Fast-forward saved one forward per forced token but the last.
    assert!(
        forwards > fast.tokens.len() - fast.forced_tokens,
        "{forwards}"
    );
}

fn mtp(gamma: usize) -> Speculation {
    Speculation {
        speculator: Speculator::Mtp { gamma },
        auto: false,
    }
}

#[test]
fn mtp_with_a_grammar_matches_plain_greedy_and_validates() {
    let cases = [
        GrammarSpec::JsonSchema(person_schema()),
        GrammarSpec::Lark(format!("start: \"{LITERAL}: \" /[a-z ]{{1,40}}/ \".\"")),
    ];
    for grammar in cases {
        let req = request("Describe a person as JSON.", grammar.clone(), 120, greedy());
        let plain = run(&req);
        for gamma in 1..=3 {
            let gen = run_spec(&req, &mtp(gamma));
            assert_eq!(gen.tokens, plain.tokens, "{grammar:?}, γ = {gamma}");
            assert_eq!(gen.text, plain.text);
            assert_eq!((gen.finish, &gen.stop), (plain.finish, &plain.stop));
            // Forced counts may differ: a token plain decoding fast-forwards
            // can arrive as an accepted draft instead.
            assert!(gen.forced_tokens > 0 || plain.forced_tokens == 0);
            let s = gen.spec.unwrap();
            assert!(s.drafted > 0 && s.accepted > 0, "{s:?}");
        }
        if let GrammarSpec::JsonSchema(_) = grammar {
            assert_complete(&plain);
            check_person(&plain.text);
        }
    }
}

#[test]
fn prompt_lookup_with_a_grammar_matches_plain_greedy() {
    // Prompt lookup proposes tokens from the context regardless of the
    // grammar: the ones it rejects are dropped before verification.
    let req = request(
        "Describe a person as JSON.",
        GrammarSpec::JsonSchema(person_schema()),
        120,
        greedy(),
    );
    let plain = run(&req);
    let spec = Speculation {
        speculator: Speculator::PromptLookup {
            ngram: 1,
            max_draft: 3,
        },
        auto: false,
    };
    let gen = run_spec(&req, &spec);
    assert_eq!(gen.tokens, plain.tokens);
    check_person(&gen.text);
}

#[test]
fn mtp_with_a_grammar_samples_valid_outputs() {
    for seed in 31..=33 {
        let req = request(
            "Describe a person as JSON.",
            GrammarSpec::JsonSchema(person_schema()),
            160,
            sampled(seed),
        );
        let gen = run_spec(&req, &mtp(2));
        assert_complete(&gen);
        check_person(&gen.text);
        // A seed replays the same output.
        assert_eq!(run_spec(&req, &mtp(2)).tokens, gen.tokens);
    }
}

#[test]
fn logprobs_are_of_the_masked_distribution() {
    let req = request(
        "Answer.",
        GrammarSpec::Regex("(yes|no)".into()),
        5,
        SamplingParams {
            logprobs: Some(5),
            ..sampled(3)
        },
    );
    let gen = run(&req);
    assert_complete(&gen);
    let tok = bundle().tokenizer().unwrap();
    let first = &gen.logprobs[0];
    // Only tokens that can start "yes" or "no" have mass, and it sums to 1.
    let mut mass = 0.0;
    for &(id, lp) in &first.top {
        let t = tok.decode(&[id], false).unwrap();
        assert!("yes".starts_with(&t) || "no".starts_with(&t), "{t:?}");
        mass += f64::from(lp).exp();
    }
    assert!(first.top.len() == 5 || (mass - 1.0).abs() < 1e-4, "{mass}");
}

#[test]
fn bad_grammars_are_invalid_params_naming_the_parameter() {
    let cases = [
        (
            GrammarSpec::JsonSchema(json!({"type": "no-such-type"})),
            "json_schema",
        ),
        (GrammarSpec::JsonSchema(json!(42)), "json_schema"),
        (GrammarSpec::Regex("(unclosed".into()), "regex"),
        (GrammarSpec::Lark("start: undefined_rule".into()), "grammar"),
    ];
    for (grammar, want) in cases {
        let req = request("x", grammar.clone(), 8, greedy());
        // Refused up front (what an API layer calls before streaming), and
        // by the driver.
        let b = bundle();
        let early = req
            .compile_grammar(b.tokenizer.as_ref(), b.model.vocab_size(), &b.stop_ids)
            .unwrap_err();
        let late = generate(b, &req, |_| Ok(true)).unwrap_err();
        for err in [early, late] {
            match err {
                Error::InvalidParam { param, .. } => assert_eq!(param, want, "{grammar:?}"),
                e => panic!("{grammar:?}: {e}"),
            }
        }
    }
    // Without a tokenizer there are no bytes to match.
    let req = request("x", GrammarSpec::JsonObject, 8, greedy());
    let err = nectar_engine::generate_with(&bundle().model, None, &bundle().stop_ids, &req, |_| {
        Ok(true)
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidParam {
                param: "json_schema",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn the_compiler_is_built_once_per_tokenizer() {
    use nectar_engine::GrammarCompiler;
    use std::sync::Arc;
    let b = bundle();
    let tok = b.tokenizer().unwrap();
    let vocab = b.model.vocab_size();
    let first = GrammarCompiler::for_tokenizer(tok, vocab, &b.stop_ids).unwrap();
    let mut reordered = b.stop_ids.clone();
    reordered.reverse();
    let again = GrammarCompiler::for_tokenizer(tok, vocab, &reordered).unwrap();
    assert!(Arc::ptr_eq(&first, &again));
    // Clones share the cache; another eos set gets its own compiler.
    let cloned = GrammarCompiler::for_tokenizer(&tok.clone(), vocab, &b.stop_ids).unwrap();
    assert!(Arc::ptr_eq(&first, &cloned));
    let other = GrammarCompiler::for_tokenizer(tok, vocab, &b.stop_ids[..1]).unwrap();
    assert!(!Arc::ptr_eq(&first, &other));
}
