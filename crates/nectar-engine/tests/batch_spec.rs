//! Speculation inside the batch: rows with their own provider and depth (MTP, prompt lookup,
//! none, `auto`) verified in the same forward as the other rows' decode tokens and prompt
//! chunks give every row the tokens it gets alone without speculation (greedy), and a seeded
//! sampled row the tokens it gets speculating alone.

use nectar_engine::{
    generate, generate_speculative, Batch, BatchOptions, GrammarSpec, Request, RequestState,
    RowOptions, SamplingParams, Speculation, Speculator,
};

mod common;
use common::{demo, prompts};

fn mtp(gamma: usize, auto: bool) -> Speculation {
    Speculation {
        speculator: Speculator::Mtp { gamma },
        auto,
    }
}

/// What the whole run did, summed over steps.
#[derive(Debug, Default)]
struct Totals {
    drafted: usize,
    accepted: usize,
    /// Steps where a row verified drafts while another row fed a prompt chunk.
    verify_beside_prefill: usize,
    /// Steps where two or more rows verified drafts together.
    verify_together: usize,
}

/// Runs `rows` (request, speculation, join step) through one batch; returns each row's
/// tokens and the totals.
fn run_batch(rows: &[(Request, Option<Speculation>, usize)]) -> (Vec<Vec<u32>>, Totals) {
    let b = demo();
    let tok = b.tokenizer.as_ref();
    let mut batch = Batch::new(BatchOptions {
        max_rows: rows.len(),
        ..BatchOptions::default()
    });
    let mut out = vec![Vec::new(); rows.len()];
    let mut done = vec![false; rows.len()];
    let mut t = Totals::default();
    let mut step = 0;
    while done.iter().any(|d| !d) {
        let mut joined = Vec::new();
        for (i, (r, spec, join)) in rows.iter().enumerate() {
            if *join == step {
                let state = RequestState::new(r, &b.stop_ids, b.model.vocab_size(), tok).unwrap();
                let opts = RowOptions {
                    speculation: *spec,
                    ..RowOptions::default()
                };
                batch.admit_row(&b.model, i as u64, state, opts).unwrap();
                joined.push(i);
            }
        }
        if !batch.is_empty() {
            let report = batch.step(&b.model, tok).unwrap();
            t.drafted += report.drafted;
            t.accepted += report.accepted;
            if report.speculating > 0 && !joined.is_empty() {
                t.verify_beside_prefill += 1;
            }
            if report.speculating > 1 {
                t.verify_together += 1;
            }
            for rs in report.rows {
                out[rs.id as usize].push(rs.step.token);
                if rs.summary.is_some() {
                    done[rs.id as usize] = true;
                }
            }
        }
        step += 1;
        assert!(step < 10_000, "the batch never drained");
    }
    (out, t)
}

fn alone(r: &Request) -> Vec<u32> {
    generate(demo(), r, |_| Ok(true)).unwrap().tokens
}

#[test]
fn greedy_speculating_rows_match_serving_alone_without_speculation() {
    let ps = prompts();
    let lookup = Speculation {
        speculator: Speculator::PromptLookup {
            ngram: 2,
            max_draft: 3,
        },
        auto: false,
    };
    // Every row its own depth and provider; rows join while others verify, so a prompt
    // (more than 4 rows: the reconstructed attention form) shares forwards with
    // verification runs (the absorbed form).
    let twice: Vec<u32> = ps[2].iter().chain(&ps[2]).copied().collect();
    let rows = vec![
        (Request::new(ps[3].clone(), 48), Some(mtp(3, false)), 0),
        (Request::new(ps[1].clone(), 40), Some(mtp(1, false)), 0),
        (Request::new(ps[0].clone(), 40), None, 3),
        (Request::new(twice, 32), Some(lookup), 6),
        (Request::new(ps[2].clone(), 40), Some(mtp(2, false)), 9),
        (Request::new(ps[1].clone(), 48), Some(mtp(3, true)), 12),
    ];
    let (got, t) = run_batch(&rows);
    for (i, (r, spec, _)) in rows.iter().enumerate() {
        assert_eq!(got[i], alone(r), "row {i} ({spec:?})");
    }
    assert!(t.accepted > 0 && t.accepted < t.drafted, "{t:?}");
    assert!(t.verify_beside_prefill > 0, "{t:?}");
    assert!(t.verify_together > 0, "{t:?}");
}

#[test]
fn grammar_rows_speculating_in_a_batch_match_serving_alone() {
    let ps = prompts();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 12},
                       "count": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["word", "count"],
        "additionalProperties": false
    });
    let constrained = |p: &Vec<u32>| Request {
        grammar: Some(GrammarSpec::JsonSchema(schema.clone())),
        ..Request::new(p.clone(), 40)
    };
    let rows = vec![
        (constrained(&ps[0]), Some(mtp(3, false)), 0),
        (Request::new(ps[3].clone(), 40), Some(mtp(2, false)), 0),
        (constrained(&ps[1]), Some(mtp(2, false)), 2),
    ];
    let (got, _) = run_batch(&rows);
    for (i, (r, _, _)) in rows.iter().enumerate() {
        assert_eq!(got[i], alone(r), "row {i}");
    }
}

#[test]
fn seeded_sampled_rows_in_a_batch_match_speculating_alone() {
    let ps = prompts();
    let b = demo();
    let sampled = |p: &Vec<u32>, seed| Request {
        params: SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            seed: Some(seed),
            repetition_penalty: 1.1,
            ..SamplingParams::default()
        },
        ..Request::new(p.clone(), 32)
    };
    let rows = vec![
        (sampled(&ps[1], 5), Some(mtp(2, false)), 0),
        (sampled(&ps[3], 6), Some(mtp(3, false)), 1),
        (sampled(&ps[2], 7), None, 0),
    ];
    let (got, t) = run_batch(&rows);
    assert!(t.accepted > 0, "{t:?}");
    for (i, (r, spec, _)) in rows.iter().enumerate() {
        let want = generate_speculative(
            &b.model,
            b.tokenizer.as_ref(),
            &b.stop_ids,
            r,
            spec.as_ref(),
            |_| Ok(true),
        )
        .unwrap();
        assert_eq!(got[i], want.tokens, "row {i}");
    }
    // And a batch run replays itself.
    assert_eq!(run_batch(&rows).0, got);
}

#[test]
fn a_new_auto_row_starts_from_what_the_rows_before_it_learned() {
    let b = demo();
    let ps = prompts();
    let mut batch = Batch::new(BatchOptions::default());
    let admit = |batch: &mut Batch, id, p: &Vec<u32>| {
        let r = Request::new(p.clone(), 64);
        let state = RequestState::new(&r, &[], b.model.vocab_size(), None).unwrap();
        let opts = RowOptions {
            speculation: Some(mtp(3, true)),
            ..RowOptions::default()
        };
        batch.admit_row(&b.model, id, state, opts).unwrap();
    };
    // A first row long enough for its controller to decide.
    admit(&mut batch, 0, &ps[3]);
    let first = loop {
        let report = batch.step(&b.model, None).unwrap();
        if let Some(s) = report.rows.into_iter().find_map(|r| r.summary) {
            break s.spec;
        }
    };
    assert!(!first.decisions.is_empty(), "{first:?}");
    // The next row's first decode step asks for the depth the first row ended on (a fresh
    // controller would ask for 3).
    admit(&mut batch, 1, &ps[1]);
    let mut asked = None;
    while asked.is_none() {
        let report = batch.step(&b.model, None).unwrap();
        if report.spec_rows > 0 {
            asked = Some(report.gamma_sum);
        }
    }
    assert_eq!(asked, Some(first.final_gamma), "{first:?}");
}

#[test]
fn auto_drafts_only_for_a_row_that_has_the_step_to_itself() {
    let b = demo();
    let ps = prompts();
    let mut batch = Batch::new(BatchOptions {
        max_rows: 2,
        ..BatchOptions::default()
    });
    let admit = |batch: &mut Batch, id, p: &Vec<u32>, max_tokens| {
        let r = Request::new(p.clone(), max_tokens);
        let state = RequestState::new(&r, &[], b.model.vocab_size(), None).unwrap();
        let opts = RowOptions {
            speculation: Some(mtp(3, true)),
            ..RowOptions::default()
        };
        batch.admit_row(&b.model, id, state, opts).unwrap();
    };
    // Two `auto` rows share every step until the shorter one ends: neither asks for drafts.
    admit(&mut batch, 0, &ps[0], 12);
    admit(&mut batch, 1, &ps[1], 48);
    let (mut shared_rounds, mut alone_gamma) = (0, 0);
    while !batch.is_empty() {
        let shared = batch.len() > 1;
        let report = batch.step(&b.model, None).unwrap();
        if shared {
            shared_rounds += report.spec_rows;
            assert_eq!(report.gamma_sum, 0, "drafts asked in a shared step");
        } else {
            alone_gamma += report.gamma_sum;
        }
    }
    assert!(shared_rounds > 0, "no shared decode step was seen");
    // Alone, the remaining row drafts again (a fresh controller starts at γ = 3).
    assert!(alone_gamma > 0);
}
