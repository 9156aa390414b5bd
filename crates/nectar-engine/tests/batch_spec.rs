//! Speculation inside the batch: rows with their own provider and depth (MTP, prompt lookup,
//! none, `auto`) verified in the same forward as the other rows' decode tokens and prompt
//! chunks give every row the tokens it gets alone without speculation (greedy, and seeded
//! sampled rows whatever their speculation).

use nectar_engine::{
    generate, generate_speculative, Batch, BatchOptions, GrammarSpec, Request, RequestState,
    RowOptions, SamplingParams, Speculation, Speculator, MTP_ABSORB_WINDOW,
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

fn seeded(p: &[u32], seed: u64) -> Request {
    Request {
        params: SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            repetition_penalty: 1.1,
            seed: Some(seed),
            logprobs: Some(2),
            ..SamplingParams::default()
        },
        ..Request::new(p.to_vec(), 40)
    }
}

#[test]
fn a_seeded_sampled_request_gives_plain_decodings_tokens_whatever_the_speculation() {
    // The choice at each output position is keyed by (seed, position) and a draft is accepted
    // exactly when it is that choice: no draft depth, provider, `auto` history or neighbour
    // changes the text (rejection sampling drew differently at each γ).
    let ps = prompts();
    let lookup = |auto| Speculation {
        speculator: Speculator::PromptLookup {
            ngram: 1,
            max_draft: 3,
        },
        auto,
    };
    let r = seeded(&ps[1], 11);
    let want = alone(&r);
    let other = seeded(&ps[2], 5);
    let other_want = alone(&other);
    let unseeded = Request {
        params: SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        },
        ..Request::new(ps[0].clone(), 40)
    };
    let (mut drafted, mut accepted) = (0, 0);
    for spec in [
        None,
        Some(mtp(1, false)),
        Some(mtp(2, false)),
        Some(mtp(3, false)),
        Some(mtp(3, true)),
        Some(lookup(false)),
        Some(lookup(true)),
    ] {
        let (got, t) = run_batch(&[(r.clone(), spec, 0)]);
        assert_eq!(got[0], want, "{spec:?}, alone");
        (drafted, accepted) = (drafted + t.drafted, accepted + t.accepted);
        // Beside a greedy speculating row, an unseeded sampled one and another seeded `auto`
        // row that joins while it decodes.
        let rows = vec![
            (Request::new(ps[3].clone(), 48), Some(mtp(3, false)), 0),
            (r.clone(), spec, 1),
            (unseeded.clone(), Some(mtp(2, false)), 0),
            (other.clone(), Some(mtp(3, true)), 4),
        ];
        let (got, t) = run_batch(&rows);
        assert_eq!(got[1], want, "{spec:?}, batched");
        assert_eq!(got[3], other_want, "{spec:?}, batched");
        assert!(t.verify_together > 0, "{t:?}");
    }
    // The seeded rows really speculate (no stop-gap turns their drafts off), and the coupled
    // MTP drafts are accepted often.
    assert!(
        accepted > 0 && accepted < drafted,
        "{accepted} of {drafted}"
    );
}

#[test]
fn a_seeded_sampled_grammar_row_gives_plain_decodings_tokens_speculating() {
    let ps = prompts();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 12},
                       "count": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["word", "count"],
        "additionalProperties": false
    });
    let r = Request {
        grammar: Some(GrammarSpec::JsonSchema(schema)),
        ..seeded(&ps[0], 3)
    };
    let want = alone(&r);
    for spec in [mtp(1, false), mtp(3, false), mtp(3, true)] {
        let rows = vec![
            (r.clone(), Some(spec), 0),
            (Request::new(ps[3].clone(), 40), Some(mtp(2, false)), 0),
        ];
        assert_eq!(run_batch(&rows).0[0], want, "{spec:?}");
    }
}

/// Admits an `auto` MTP row (γ ≤ 3) that generates `max_tokens` (no stop tokens).
fn admit_auto(batch: &mut Batch, id: u64, prompt: &[u32], max_tokens: usize) {
    let b = demo();
    let r = Request::new(prompt.to_vec(), max_tokens);
    let state = RequestState::new(&r, &[], b.model.vocab_size(), None).unwrap();
    let opts = RowOptions {
        speculation: Some(mtp(3, true)),
        ..RowOptions::default()
    };
    batch.admit_row(&b.model, id, state, opts).unwrap();
}

#[test]
fn a_new_auto_row_continues_what_the_batch_learned() {
    let b = demo();
    let ps = prompts();
    let mut batch = Batch::new(BatchOptions::default());
    // Every forward row costs the same (a compute-bound step): drafts never pay.
    batch.cost_steps_with(Box::new(|r| 1e-3 * r.tokens as f64));
    admit_auto(&mut batch, 0, &ps[3], 64);
    let first = loop {
        let report = batch.step(&b.model, None).unwrap();
        if let Some(s) = report.rows.into_iter().find_map(|r| r.summary) {
            break s.spec;
        }
    };
    assert_eq!(first.final_gamma, 0, "{first:?}");
    // The next row's first decode steps ask for no drafts but the probes' (at most 1 + 2 + 3
    // in a window); a fresh controller would ask for 3 on each of its first five.
    admit_auto(&mut batch, 1, &ps[1], 64);
    let mut asked = Vec::new();
    while asked.len() < 5 {
        let report = batch.step(&b.model, None).unwrap();
        if report.spec_rows > 0 {
            asked.push(report.gamma_sum);
        }
    }
    assert!(asked.iter().sum::<usize>() <= 6, "{asked:?}");
}

#[test]
fn a_row_resuming_drafting_after_a_long_plain_stretch_skips_its_backlog_and_matches_off() {
    // Drafts never pay (every forward row costs the same): `auto` decodes plainly and drafts
    // only in its probes, each after a stretch of plain steps far longer than the MTP window.
    let b = demo();
    let ps = prompts();
    let r = Request::new(ps[3].clone(), 560);
    let mut batch = Batch::new(BatchOptions::default());
    batch.cost_steps_with(Box::new(|r| 1e-3 * r.tokens as f64));
    admit_auto(&mut batch, 0, &r.prompt_ids, r.max_tokens);
    let (mut got, mut resumes, mut accepted_on_resume) = (Vec::new(), 0, 0);
    let mut plain_run = 0;
    loop {
        let report = batch.step(&b.model, None).unwrap();
        got.extend(report.rows.iter().map(|s| s.step.token));
        if report.rows.iter().any(|s| s.summary.is_some()) {
            break;
        }
        let c = batch.cache(0).unwrap();
        // The MTP cache never runs past the main cache, and holds no more rows than it spans.
        assert!(c.mtp.end() <= c.len() && c.mtp.len() <= c.mtp.end());
        if report.drafted > 0 {
            if plain_run > 2 * MTP_ABSORB_WINDOW {
                resumes += 1;
                accepted_on_resume += report.accepted;
                // The backlog beyond the window was left out: a gap just before the rows
                // this probe absorbed (the last window and its own kept rows).
                assert!(c.mtp.contiguous() < c.mtp.end(), "no gap");
                assert!(
                    c.mtp.len() + MTP_ABSORB_WINDOW < c.mtp.end(),
                    "the backlog was absorbed"
                );
            }
            plain_run = 0;
        } else {
            plain_run += 1;
        }
    }
    assert!(resumes >= 2, "{resumes} resumes after a long plain stretch");
    assert!(
        accepted_on_resume > 0,
        "drafts after a gap were all rejected"
    );
    // Greedy output is `off`'s, token for token.
    assert_eq!(got, alone(&r));
}

/// Steps a batch of four `auto` rows to the end; `read_ms` is what one expert the drafts add
/// to the step's union costs, read before each step. Returns per decode step (γ asked by
/// `auto`, rows in the step) and the rows' summaries.
fn four_auto_rows(
    read_ms: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    switch_at: usize,
) -> (Vec<(usize, usize)>, Vec<nectar_engine::RowSummary>) {
    use std::sync::atomic::Ordering;
    let b = demo();
    let ps = prompts();
    let mut batch = Batch::new(BatchOptions {
        max_rows: 4,
        ..BatchOptions::default()
    });
    // A step costs 4 ms plus `read_ms` per expert the drafts added to the union (summed over
    // layers): the union meter's counts, not the wall clock.
    let read = read_ms.clone();
    batch.cost_steps_with(Box::new(move |r| {
        let extra = r.union.map_or(0, |u| u.experts - u.plain_experts);
        1e-3 * (4.0 + read.load(Ordering::Relaxed) as f64 * extra as f64)
    }));
    for (i, p) in ps.iter().cycle().take(4).enumerate() {
        admit_auto(&mut batch, i as u64, p, 400);
    }
    let (mut steps, mut summaries) = (Vec::new(), Vec::new());
    while !batch.is_empty() {
        if steps.len() == switch_at {
            read_ms.store(0, Ordering::Relaxed);
        }
        let rows = batch.len();
        let report = batch.step(&b.model, None).unwrap();
        if let Some(g) = report.auto_gamma {
            steps.push((g, rows));
        }
        summaries.extend(report.rows.into_iter().filter_map(|r| r.summary));
    }
    (steps, summaries)
}

#[test]
fn auto_turns_drafting_off_in_a_shared_step_when_the_union_costs_more_than_it_saves_and_on_when_it_pays(
) {
    use std::sync::{atomic::AtomicUsize, Arc};
    // First every expert the drafts add costs a second (a tiny cache under a budget: each is
    // a read), then nothing (they are resident): 4 rows share every step.
    let switch = 8 + 16 * 6;
    let (steps, summaries) = four_auto_rows(Arc::new(AtomicUsize::new(1000)), switch);
    assert!(steps.len() > switch + 16 * 6, "{}", steps.len());
    assert!(steps[..switch].iter().all(|&(_, rows)| rows == 4));
    // After the first window (8 steps at γ = 3, probes last) drafting is off: only probe
    // steps draft (3 per window at most).
    let dear = &steps[8..switch];
    let drafting = dear.iter().filter(|s| s.0 > 0).count();
    assert!(
        drafting <= 3 * 6,
        "{drafting} of {} steps drafted",
        dear.len()
    );
    assert_eq!(steps[switch - 1].0, 0, "{steps:?}");
    // Once drafts are free, a probe measures it and drafting is back on in the shared steps
    // (within 4 windows of backed-off probes plus one).
    let cheap = &steps[switch + 16 * 5..];
    let shared: Vec<_> = cheap.iter().filter(|s| s.1 == 4).collect();
    assert!(shared.len() >= 16, "{}", shared.len());
    assert!(
        shared.iter().filter(|s| s.0 > 0).count() > shared.len() / 2,
        "{shared:?}"
    );
    // The rows' reports agree: a decision for 4 rows at γ = 0, then one at γ > 0.
    let d = &summaries[0].spec.decisions;
    let off = d.iter().position(|d| d.rows == 4 && d.gamma == 0);
    let on = d.iter().rposition(|d| d.rows == 4 && d.gamma > 0);
    assert!(matches!((off, on), (Some(a), Some(b)) if a < b), "{d:?}");
    assert!(summaries.iter().all(|s| s.spec.accepted > 0));
}

#[test]
fn steps_where_a_request_joins_follow_the_decode_steps_choice() {
    // Drafts never pay (every forward row costs the same). Rows join one by one, and each
    // finished row is replaced at once, as a busy server's are: the steps where a row joins
    // also run its prompt and are never recorded, so they must take the choice the decode
    // steps made, not the γ in force when their shape was first seen (3, at the start).
    let b = demo();
    let ps = prompts();
    let mut batch = Batch::new(BatchOptions {
        max_rows: 4,
        ..BatchOptions::default()
    });
    batch.cost_steps_with(Box::new(|r| 1e-3 * r.tokens as f64));
    let mut next_id = 0u64;
    let mut admit = |batch: &mut Batch, tokens| {
        admit_auto(batch, next_id, &ps[next_id as usize % 3], tokens);
        next_id += 1;
    };
    let (mut late_joins, mut late_join_drafts) = (0, 0);
    for step in 0..400 {
        if step < 4 {
            admit(&mut batch, 60 + 17 * step);
        }
        let report = batch.step(&b.model, None).unwrap();
        for _ in report.rows.iter().filter(|r| r.summary.is_some()) {
            admit(&mut batch, 60);
        }
        if step > 150 && report.prefill_rows > 0 && report.spec_rows > 0 {
            late_joins += 1;
            late_join_drafts += report.gamma_sum;
        }
    }
    assert!(late_joins >= 4, "{late_joins}");
    assert_eq!(late_join_drafts, 0, "over {late_joins} joining steps");
}

#[test]
fn the_union_of_a_verification_step_counts_the_drafts_apart() {
    let b = demo();
    let ps = prompts();
    let mut batch = Batch::new(BatchOptions {
        max_rows: 3,
        ..BatchOptions::default()
    });
    let admit = |batch: &mut Batch, id, p: &Vec<u32>, spec| {
        let r = Request::new(p.clone(), 24);
        let state = RequestState::new(&r, &[], b.model.vocab_size(), None).unwrap();
        let opts = RowOptions {
            speculation: spec,
            ..RowOptions::default()
        };
        batch.admit_row(&b.model, id, state, opts).unwrap();
    };
    admit(&mut batch, 0, &ps[0], Some(mtp(3, false)));
    admit(&mut batch, 1, &ps[1], None);
    admit(&mut batch, 2, &ps[2], Some(mtp(2, false)));
    let (mut verify, mut plain, mut prefill, mut wider) = (0, 0, 0, 0);
    let mut summaries = Vec::new();
    while !batch.is_empty() {
        let report = batch.step(&b.model, None).unwrap();
        match report.union {
            // A prompt chunk: its union is not a decode step's.
            None => prefill += 1,
            Some(u) => {
                // Seven sparse layers; top-4 of 32 experts per row.
                assert_eq!(u.layers, 7, "{u:?}");
                assert_eq!(u.drafts, report.drafted > 0, "{u:?}");
                assert!(u.plain_experts >= 4 * 7 && u.experts <= 32 * 7, "{u:?}");
                if u.drafts {
                    verify += 1;
                    assert!(u.experts >= u.plain_experts, "{u:?}");
                    wider += usize::from(u.experts > u.plain_experts);
                } else {
                    plain += 1;
                    assert_eq!(u.experts, u.plain_experts, "{u:?}");
                }
            }
        }
        summaries.extend(report.rows.into_iter().filter_map(|r| r.summary));
    }
    assert!(prefill > 0 && verify > 0, "{prefill} {verify} {plain}");
    assert!(wider > verify / 2, "{wider} of {verify}");
    // Each row reports the union of the decode steps it took part in (all of them here:
    // the rows start and run together, so their figures agree while all three are live).
    let u = summaries[0].spec.expert_union;
    assert!(u.verify_steps > 0 && u.growth > 1.0, "{u:?}");
    assert!(u.verify_experts_per_layer > u.verify_plain_experts_per_layer);
    assert!(summaries
        .iter()
        .all(|s| s.spec.expert_union.verify_steps > 0));
}
