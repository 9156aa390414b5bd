//! Stops through the request state machine with the demo tokenizer: scripted
//! token sequences (one-hot logits, greedy) stand in for the model, so every
//! edge case is exact and fast.

use nectar_engine::{
    Error, FinishReason, Request, RequestState, SamplingParams, StopCause, Tokenizer,
};
use std::path::Path;

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/nectar-demo-glm5");
const VOCAB: usize = 8192;
const EOS: [u32; 3] = [8160, 8167, 8169];

fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(Path::new(DEMO).join("tokenizer.json")).unwrap()
}

/// Logits whose argmax is `id`.
fn one_hot(id: u32) -> Vec<f32> {
    let mut l = vec![0.0; VOCAB];
    l[id as usize] = 10.0;
    l
}

struct Run {
    pieces: Vec<String>,
    tokens: Vec<u32>,
    finish: Option<FinishReason>,
    stop: Option<StopCause>,
}

impl Run {
    fn text(&self) -> String {
        self.pieces.concat()
    }
}

/// Drives a request through `script` (the tokens the "model" produces, in
/// order) until it finishes or the script runs out.
fn drive(tok: &Tokenizer, req: &Request, script: &[u32]) -> Run {
    let mut st = RequestState::new(req, &EOS, VOCAB, Some(tok)).unwrap();
    let mut run = Run {
        pieces: Vec::new(),
        tokens: Vec::new(),
        finish: None,
        stop: None,
    };
    for &id in script {
        if st.pending_input().is_none() {
            break;
        }
        let step = st.on_logits(&one_hot(id), None, Some(tok)).unwrap();
        assert_eq!(step.token, id);
        run.pieces.push(step.text);
        run.tokens.push(id);
        if step.finished.is_some() {
            break;
        }
    }
    run.finish = st.finished();
    run.stop = st.stop_cause().cloned();
    run
}

fn request(stops: &[&str], max_tokens: usize) -> Request {
    Request {
        stop_strings: stops.iter().map(|s| s.to_string()).collect(),
        ..Request::new(vec![1, 2, 3], max_tokens)
    }
}

/// No streamed prefix ever shows text that the final output does not have:
/// a held-back stop prefix is never leaked.
fn assert_no_leak(run: &Run) {
    let full = run.text();
    let mut so_far = String::new();
    for p in &run.pieces {
        so_far += p;
        assert!(
            full.starts_with(&so_far),
            "leaked {so_far:?}; final {full:?}"
        );
    }
}

#[test]
fn stop_string_split_across_tokens() {
    let tok = tokenizer();
    let ids = tok
        .encode("The harbor is calm. STOP and more text", false)
        .unwrap();
    let run = drive(&tok, &request(&["STOP"], 100), &ids);
    assert_eq!(run.text(), "The harbor is calm. ");
    assert_eq!(run.finish, Some(FinishReason::Stop));
    assert_eq!(run.stop, Some(StopCause::String("STOP".into())));
    assert_no_leak(&run);
    // Generation ends at the token that completes the stop.
    let upto = tok.encode("The harbor is calm. STOP", false).unwrap();
    assert!(run.tokens.len() <= upto.len(), "{:?}", run.tokens);
}

#[test]
fn stop_string_that_spans_many_tokens_and_false_starts() {
    let tok = tokenizer();
    let text = "a <<EN b <<END c";
    let ids = tok.encode(text, false).unwrap();
    let run = drive(&tok, &request(&["<<END"], 100), &ids);
    assert_eq!(run.text(), "a <<EN b ");
    assert_no_leak(&run);
}

#[test]
fn overlapping_stops_first_completed_wins() {
    let tok = tokenizer();
    let ids = tok.encode("xx abcd yy", false).unwrap();
    let run = drive(&tok, &request(&["abcd", "bc"], 100), &ids);
    assert_eq!(run.text(), "xx a");
    assert_eq!(run.stop, Some(StopCause::String("bc".into())));
    let run = drive(&tok, &request(&["cd", "abc"], 100), &ids);
    assert_eq!(run.stop, Some(StopCause::String("abc".into())));
    assert_eq!(run.text(), "xx ");
}

#[test]
fn unicode_stop_inside_byte_split_tokens() {
    let tok = tokenizer();
    let bee = tok.encode("🐝", false).unwrap();
    assert!(
        bee.len() > 1,
        "the test needs a character split across tokens"
    );
    let ids = tok.encode("春风不语🐝欧阳修", false).unwrap();
    for stop in ["🐝", "语🐝欧", "🐝欧"] {
        let run = drive(&tok, &request(&[stop], 100), &ids);
        let want = &"春风不语🐝欧阳修"[.."春风不语🐝欧阳修".find(stop).unwrap()];
        assert_eq!(run.text(), want, "stop {stop:?}");
        assert!(
            run.pieces.iter().all(|p| !p.contains('\u{FFFD}')),
            "{:?}",
            run.pieces
        );
        assert_no_leak(&run);
    }
}

#[test]
fn stop_at_the_very_start() {
    let tok = tokenizer();
    let ids = tok.encode("Hello there", false).unwrap();
    let run = drive(&tok, &request(&["Hel"], 100), &ids);
    assert_eq!(run.text(), "");
    assert_eq!(run.finish, Some(FinishReason::Stop));
}

#[test]
fn stop_tokens_end_without_text() {
    let tok = tokenizer();
    let mut ids = tok.encode("done.", false).unwrap();
    ids.push(8167); // <|user|>: part of GLM's eos set
    ids.extend(tok.encode(" never seen", false).unwrap());
    let run = drive(&tok, &request(&[], 100), &ids);
    assert_eq!(run.text(), "done.");
    assert_eq!(run.finish, Some(FinishReason::Stop));
    assert_eq!(run.stop, Some(StopCause::Token(8167)));
    assert_eq!(*run.tokens.last().unwrap(), 8167);
}

#[test]
fn extra_stop_ids_join_the_model_set() {
    let tok = tokenizer();
    let ids = tok.encode("one two three", false).unwrap();
    let req = Request {
        extra_stop_ids: vec![ids[2]],
        ..request(&[], 100)
    };
    let run = drive(&tok, &req, &ids);
    assert_eq!(run.tokens, ids[..3]);
    assert_eq!(run.stop, Some(StopCause::Token(ids[2])));
    assert_eq!(run.text(), tok.decode(&ids[..2], true).unwrap());
}

#[test]
fn length_releases_a_held_back_partial_stop() {
    let tok = tokenizer();
    let ids = tok.encode("abc <sto", false).unwrap();
    let run = drive(&tok, &request(&["<stop>"], ids.len()), &ids);
    assert_eq!(run.finish, Some(FinishReason::Length));
    assert_eq!(run.text(), "abc <sto");
}

#[test]
fn max_tokens_zero_runs_nothing() {
    let tok = tokenizer();
    let st = RequestState::new(&request(&[], 0), &EOS, VOCAB, Some(&tok)).unwrap();
    assert_eq!(st.pending_input(), None);
    assert_eq!(st.finished(), Some(FinishReason::Length));
}

#[test]
fn pending_input_is_prompt_then_last_token() {
    let tok = tokenizer();
    let mut st = RequestState::new(&request(&[], 5), &EOS, VOCAB, Some(&tok)).unwrap();
    assert_eq!(st.pending_input(), Some(&[1u32, 2, 3][..]));
    st.on_logits(&one_hot(42), None, Some(&tok)).unwrap();
    assert_eq!(st.pending_input(), Some(&[42u32][..]));
    st.cancel();
    assert_eq!(st.pending_input(), None);
    assert_eq!(st.finished(), Some(FinishReason::Cancelled));
    assert!(st.on_logits(&one_hot(1), None, Some(&tok)).is_err());
}

#[test]
fn bad_requests_are_refused_by_name() {
    let tok = tokenizer();
    let param =
        |req: &Request, tok: Option<&Tokenizer>| match RequestState::new(req, &EOS, VOCAB, tok) {
            Err(Error::InvalidParam { param, .. }) => param,
            other => panic!("{other:?}"),
        };
    assert_eq!(param(&Request::new(vec![], 4), Some(&tok)), "prompt_ids");
    assert_eq!(param(&request(&["x", ""], 4), Some(&tok)), "stop");
    assert_eq!(param(&request(&["x"], 4), None), "stop");
    let hot = Request {
        params: SamplingParams {
            min_p: 2.0,
            ..SamplingParams::default()
        },
        ..request(&[], 4)
    };
    assert_eq!(param(&hot, Some(&tok)), "min_p");
}

#[test]
fn without_a_tokenizer_the_output_is_ids_only() {
    let mut st = RequestState::new(&request(&[], 2), &EOS, VOCAB, None).unwrap();
    let s = st.on_logits(&one_hot(7), None, None).unwrap();
    assert_eq!((s.token, s.text.as_str(), s.finished), (7, "", None));
    let s = st.on_logits(&one_hot(8), None, None).unwrap();
    assert_eq!(s.finished, Some(FinishReason::Length));
}
