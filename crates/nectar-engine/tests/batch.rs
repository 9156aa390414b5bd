//! Continuous batching: each row's output is the same whether it decodes alone or beside
//! others (greedy and seeded sampling), rows join late and leave early without disturbing the
//! rest, and a bad request is refused without touching the live rows.

use nectar_engine::{
    generate, Batch, BatchOptions, FinishReason, GrammarSpec, Request, SamplingParams,
};
use serde_json::Value;
use std::collections::BTreeMap;

mod common;
use common::{demo, prompts};

/// What a row produced: tokens, text, finish.
#[derive(Debug, Default, Clone, PartialEq)]
struct Out {
    tokens: Vec<u32>,
    text: String,
    finish: Option<FinishReason>,
}

/// Runs `requests` through one batch; request `i` joins at step `joins[i]`.
fn run_batch(requests: &[Request], joins: &[usize], opts: BatchOptions) -> Vec<Out> {
    let b = demo();
    let tok = b.tokenizer.as_ref();
    let mut batch = Batch::new(opts);
    let mut outs = vec![Out::default(); requests.len()];
    let mut step = 0;
    while outs.iter().any(|o| o.finish.is_none()) {
        for (i, r) in requests.iter().enumerate() {
            if joins[i] == step {
                batch
                    .admit(&b.model, tok, &b.stop_ids, i as u64, r)
                    .unwrap();
            }
        }
        if !batch.is_empty() {
            let report = batch.step(&b.model, tok).unwrap();
            for rs in report.rows {
                let o = &mut outs[rs.id as usize];
                o.tokens.push(rs.step.token);
                o.text += &rs.step.text;
                if let Some(f) = rs.step.finished {
                    o.finish = Some(f);
                    let s = rs.summary.expect("a finished row reports its totals");
                    assert_eq!(s.generated, o.tokens.len());
                }
            }
        }
        step += 1;
        assert!(step < 10_000, "the batch never drained");
    }
    assert!(batch.is_empty());
    outs
}

/// Each request decoded on its own by the serial driver.
fn run_alone(r: &Request) -> Out {
    let g = generate(demo(), r, |_| Ok(true)).unwrap();
    Out {
        tokens: g.tokens,
        text: g.text,
        finish: Some(g.finish),
    }
}

fn requests(max_tokens: usize, params: impl Fn(usize) -> SamplingParams) -> Vec<Request> {
    prompts()
        .into_iter()
        .enumerate()
        .map(|(i, p)| Request {
            params: params(i),
            ..Request::new(p, max_tokens)
        })
        .collect()
}

#[test]
fn greedy_rows_match_serving_alone() {
    let reqs = requests(24, |_| SamplingParams::default());
    let alone: Vec<Out> = reqs.iter().map(run_alone).collect();
    let opts = BatchOptions {
        max_rows: reqs.len(),
        ..BatchOptions::default()
    };
    // Everyone at once, and staggered joins (rows join while others decode).
    let together = run_batch(&reqs, &vec![0; reqs.len()], opts);
    assert_eq!(together, alone);
    let joins: Vec<usize> = (0..reqs.len()).map(|i| i * 5).collect();
    assert_eq!(run_batch(&reqs, &joins, opts), alone);
}

#[test]
fn seeded_sampling_rows_match_serving_alone() {
    let reqs = requests(16, |i| SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(1000 + i as u64),
        ..SamplingParams::default()
    });
    let alone: Vec<Out> = reqs.iter().map(run_alone).collect();
    let opts = BatchOptions {
        max_rows: reqs.len(),
        ..BatchOptions::default()
    };
    assert_eq!(run_batch(&reqs, &[0, 1, 2, 3], opts), alone);
}

#[test]
fn grammar_rows_with_forced_tokens_match_serving_alone() {
    // Two rows constrained by a JSON schema (whose fixed keys are forced and fast-forwarded),
    // two plain: every row equals its solo run, and the constrained outputs parse.
    let schema = serde_json::json!({
        "type": "object",
        // Bounded fields, so that the document must close within the token budget.
        "properties": {"word": {"type": "string", "maxLength": 12},
                       "count": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["word", "count"],
        "additionalProperties": false
    });
    let mut reqs = requests(40, |i| SamplingParams {
        temperature: if i == 1 { 0.8 } else { 0.0 },
        seed: Some(7 + i as u64),
        ..SamplingParams::default()
    });
    reqs[0].grammar = Some(GrammarSpec::JsonSchema(schema.clone()));
    reqs[1].grammar = Some(GrammarSpec::JsonSchema(schema));
    let alone: Vec<Out> = reqs.iter().map(run_alone).collect();
    let opts = BatchOptions {
        max_rows: reqs.len(),
        ..BatchOptions::default()
    };
    let got = run_batch(&reqs, &[0, 2, 0, 1], opts);
    assert_eq!(got, alone);
    assert!(
        got[..2]
            .iter()
            .any(|o| o.finish == Some(FinishReason::Stop)),
        "no constrained row completed its document: {:?}",
        &got[..2]
    );
    for o in &got[..2] {
        if o.finish == Some(FinishReason::Stop) {
            let v: Value = serde_json::from_str(&o.text).unwrap();
            assert!(v["word"].is_string() && v["count"].is_i64(), "{}", o.text);
        }
    }
}

#[test]
fn chunked_prefill_depends_only_on_the_row() {
    // With prompts fed 37 tokens per step, a row beside others equals the row alone under the
    // same chunking, and the rows still decode in the steps a long prompt is being fed.
    let reqs = requests(12, |_| SamplingParams::default());
    let opts = |rows| BatchOptions {
        max_rows: rows,
        prefill_chunk: 37,
        ..BatchOptions::default()
    };
    let alone: Vec<Out> = reqs
        .iter()
        .map(|r| run_batch(std::slice::from_ref(r), &[0], opts(1)).remove(0))
        .collect();
    assert_eq!(run_batch(&reqs, &[0, 3, 0, 6], opts(4)), alone);
}

#[test]
fn removed_rows_leave_the_others_untouched_and_bad_requests_are_refused() {
    let b = demo();
    let tok = b.tokenizer.as_ref();
    let reqs = requests(20, |_| SamplingParams::default());
    let alone = run_alone(&reqs[1]);
    let mut batch = Batch::new(BatchOptions {
        max_rows: 2,
        ..BatchOptions::default()
    });
    batch
        .admit(&b.model, tok, &b.stop_ids, 0, &reqs[0])
        .unwrap();
    batch
        .admit(&b.model, tok, &b.stop_ids, 1, &reqs[1])
        .unwrap();
    // Full, a duplicate id, an out-of-vocabulary bias, nothing to do: all refused.
    assert!(batch
        .admit(&b.model, tok, &b.stop_ids, 2, &reqs[2])
        .is_err());
    let mut roomy = Batch::new(BatchOptions {
        max_rows: 8,
        ..BatchOptions::default()
    });
    roomy
        .admit(&b.model, tok, &b.stop_ids, 0, &reqs[0])
        .unwrap();
    assert!(roomy
        .admit(&b.model, tok, &b.stop_ids, 0, &reqs[1])
        .is_err());
    let bad = Request {
        params: SamplingParams {
            logit_bias: BTreeMap::from([(u32::MAX, 1.0)]),
            ..SamplingParams::default()
        },
        ..reqs[2].clone()
    };
    assert!(roomy.admit(&b.model, tok, &b.stop_ids, 5, &bad).is_err());
    let empty = Request::new(reqs[2].prompt_ids.clone(), 0);
    assert!(roomy.admit(&b.model, tok, &b.stop_ids, 6, &empty).is_err());
    assert_eq!(roomy.len(), 1);

    let mut out = Out::default();
    for step in 0.. {
        if step == 3 {
            let s = batch.remove(0).expect("row 0 is live");
            assert_eq!(s.generated, 3);
            assert!(batch.remove(0).is_none());
        }
        let report = batch.step(&b.model, tok).unwrap();
        for rs in report.rows.into_iter().filter(|r| r.id == 1) {
            out.tokens.push(rs.step.token);
            out.text += &rs.step.text;
            out.finish = rs.step.finished;
        }
        if out.finish.is_some() {
            break;
        }
    }
    assert_eq!(out, alone);
    assert!(batch.is_empty());
}

#[test]
fn a_continued_conversation_reuses_its_kept_cache() {
    // Turn 1, then turn 2 = turn 1's prompt + its output + a new user line: with kept caches
    // turn 2 runs only its new tokens and decodes the same greedy tokens as from scratch.
    let b = demo();
    let tok = b.tokenizer.as_ref();
    let first = Request::new(prompts()[1].clone(), 12);
    let turn1 = run_alone(&first);
    let mut next = first.prompt_ids.clone();
    next.extend(&turn1.tokens);
    next.extend(
        tok.unwrap()
            .encode("\nAnd the word anchor?", false)
            .unwrap(),
    );
    let second = Request::new(next.clone(), 12);
    let fresh = run_alone(&second);
    let mut batch = Batch::new(BatchOptions {
        max_rows: 2,
        keep_tokens: 4096,
        ..BatchOptions::default()
    });
    let run = |batch: &mut Batch, id: u64, r: &Request| {
        batch.admit(&b.model, tok, &b.stop_ids, id, r).unwrap();
        let mut out = Out::default();
        while out.finish.is_none() {
            for rs in batch.step(&b.model, tok).unwrap().rows {
                out.tokens.push(rs.step.token);
                out.text += &rs.step.text;
                out.finish = rs.step.finished;
            }
        }
        out
    };
    assert_eq!(run(&mut batch, 0, &first), turn1);
    assert_eq!(run(&mut batch, 1, &second), fresh);
    let kept = batch.kept();
    assert_eq!(kept.hits, 1);
    // Turn 1's prompt and all its output but the last token were not run again.
    let reusable = (first.prompt_ids.len() + turn1.tokens.len() - 1) as u64;
    assert_eq!(kept.reused_tokens, reusable);
    // A repeated prompt is not a continuation: it starts fresh (and stays bit-identical).
    assert_eq!(run(&mut batch, 2, &second), fresh);
    assert_eq!(batch.kept().hits, 1);
}
