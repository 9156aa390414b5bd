//! Layer-major prefill in the batch: a joining prompt runs layer by layer over all its tokens
//! between the other rows' decode steps. Its rows' tokens are the ones they get alone (greedy;
//! speculating or not; under a memory budget), each routed expert the prompt touches is read at
//! most once per layer, and each step's prefill work stays within its bound while the rows
//! already decoding produce a token every step.

use nectar_engine::{
    generate, Batch, BatchOptions, ModelBundle, Request, RequestState, RowOptions, Speculation,
    Speculator,
};
use nectar_model::arch::glm5::LoadOptions;
use nectar_model::{Glm5, NoObserver, Observer, SeqStep};
use std::collections::BTreeSet;
use std::path::Path;

mod common;
use common::{demo, prompts, ROOT};

/// A row of a test batch: its request, speculation and the step it joins at.
type Row = (Request, Option<Speculation>, usize);

/// Steps `rows` through one batch until all finish; returns each row's tokens and every step's
/// report as (prefill work, rows that produced tokens).
fn run_batch(b: &ModelBundle, rows: &[Row], opts: BatchOptions) -> (Vec<Vec<u32>>, Vec<Step>) {
    run_batch_with(b, rows, opts, &b.stop_ids, &mut NoObserver)
}

/// One step as a test sees it.
#[derive(Debug, Clone)]
struct Step {
    prefill_work: usize,
    /// Ids of the rows that produced a token.
    produced: BTreeSet<u64>,
}

/// [`run_batch`] with the stop ids and an observer of the forwards.
fn run_batch_with(
    b: &ModelBundle,
    rows: &[Row],
    opts: BatchOptions,
    stop_ids: &[u32],
    obs: &mut dyn Observer,
) -> (Vec<Vec<u32>>, Vec<Step>) {
    let tok = b.tokenizer.as_ref();
    let mut batch = Batch::new(opts);
    let mut out = vec![Vec::new(); rows.len()];
    let mut done = vec![false; rows.len()];
    let mut steps = Vec::new();
    while done.iter().any(|d| !d) {
        for (i, (r, spec, join)) in rows.iter().enumerate() {
            if *join == steps.len() {
                let state = RequestState::new(r, stop_ids, b.model.vocab_size(), tok).unwrap();
                let o = RowOptions {
                    speculation: *spec,
                    ..RowOptions::default()
                };
                batch.admit_row(&b.model, i as u64, state, o).unwrap();
            }
        }
        let report = batch.step_observed(&b.model, tok, obs).unwrap();
        let mut produced = BTreeSet::new();
        for rs in report.rows {
            out[rs.id as usize].push(rs.step.token);
            produced.insert(rs.id);
            if rs.summary.is_some() {
                done[rs.id as usize] = true;
            }
        }
        steps.push(Step {
            prefill_work: report.prefill_work,
            produced,
        });
        assert!(steps.len() < 10_000, "the batch never drained");
    }
    (out, steps)
}

fn alone(b: &ModelBundle, r: &Request) -> Vec<u32> {
    generate(b, r, |_| Ok(true)).unwrap().tokens
}

fn opts(rows: usize, chunk: usize, span: usize) -> BatchOptions {
    BatchOptions {
        max_rows: rows,
        prefill_chunk: chunk,
        prefill_span: span,
        ..BatchOptions::default()
    }
}

fn mtp() -> Option<Speculation> {
    Some(Speculation {
        speculator: Speculator::Mtp { gamma: 2 },
        auto: false,
    })
}

fn lookup() -> Option<Speculation> {
    Some(Speculation {
        speculator: Speculator::PromptLookup {
            ngram: 2,
            max_draft: 3,
        },
        auto: false,
    })
}

/// The demo's prompts as rows: the long one (284 tokens) joins while the others decode.
fn mixed_rows(max_tokens: usize) -> Vec<Row> {
    let p = prompts();
    let specs = [None, mtp(), lookup(), mtp()];
    let joins = [0, 2, 0, 3];
    p.into_iter()
        .zip(specs)
        .zip(joins)
        .map(|((p, s), j)| (Request::new(p, max_tokens), s, j))
        .collect()
}

#[test]
fn rows_prefilled_layer_major_match_serving_alone() {
    // Whole-prompt spans, fed a few layers per step (3 and 40 tokens' worth): each row's
    // greedy tokens are `nectar run`'s, speculating (MTP, prompt lookup) or not, beside rows
    // joining and decoding at once.
    let b = demo();
    let rows = mixed_rows(16);
    let want: Vec<Vec<u32>> = rows.iter().map(|r| alone(b, &r.0)).collect();
    for chunk in [3, 40] {
        let (got, steps) = run_batch(b, &rows, opts(4, chunk, usize::MAX));
        assert_eq!(got, want, "prefill_chunk {chunk}");
        // The long prompt took several steps, during which the other rows decoded.
        assert!(steps.iter().filter(|s| s.prefill_work > 0).count() > 3);
    }
    // Spans shorter than the prompt (one per 40 tokens): the same tokens as the row alone
    // under the same spans.
    let o = |rows| opts(rows, 16, 40);
    let (got, _) = run_batch(b, &rows, o(4));
    for (i, r) in rows.iter().enumerate() {
        let (solo, _) = run_batch(b, std::slice::from_ref(&(r.0.clone(), r.1, 0)), o(1));
        assert_eq!(got[i], solo[0], "row {i}");
    }
}

/// The e256 int4 demo (256 routed experts, top-8) under a budget 8 MiB above the least the
/// planner accepts: far fewer slots than a long prompt's experts per layer.
fn e256_budgeted() -> ModelBundle {
    let dir = Path::new(ROOT).join("models/nectar-demo-glm5-e256-int4");
    let load = |budget| {
        ModelBundle::open_with(
            &dir,
            &LoadOptions {
                memory_budget: Some(budget),
                ..LoadOptions::default()
            },
        )
    };
    let err = load(1 << 20).unwrap_err().to_string();
    let least: u64 = err
        .split(" bytes)")
        .next()
        .and_then(|x| x.rsplit('(').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no minimum in: {err}"));
    load(least + (8 << 20)).unwrap()
}

/// Every (layer, expert) the routers chose.
#[derive(Default)]
struct Touched(BTreeSet<(usize, u32)>);

impl Observer for Touched {
    fn router(&mut self, layer: usize, _row: usize, ids: &[u32], _weights: &[f32]) {
        self.0.extend(ids.iter().map(|&e| (layer, e)));
    }
}

/// The (layer, expert) pairs `prompt` routes to, from one forward on a resident copy.
fn touched(dir: &Path, prompt: &[u32]) -> BTreeSet<(usize, u32)> {
    let model = Glm5::load(dir).unwrap();
    let mut cache = model.new_cache();
    let mut t = Touched::default();
    model
        .forward(
            &mut [SeqStep {
                cache: &mut cache,
                tokens: prompt,
            }],
            &mut t,
        )
        .unwrap();
    t.0
}

#[test]
fn a_joining_prompt_reads_each_touched_expert_once_per_layer() {
    // A decoding row, then a 284-token prompt joins with 16 tokens' worth of prefill work per
    // step. The expert reads from its admission to its first token are at most one per
    // (layer, expert) the prompt touches plus what the decoding row's steps can ask for (top-k
    // per MoE layer per step). Fed as 16-token chunks through the main forward, each chunk
    // re-read its own union: several times that.
    let b = e256_budgeted();
    let res = b.model.residency().unwrap().clone();
    let tok = b.tokenizer.as_ref();
    let p = prompts();
    let long = p[3].clone();
    let touched = touched(
        &Path::new(ROOT).join("models/nectar-demo-glm5-e256-int4"),
        &long,
    );
    let mut batch = Batch::new(BatchOptions {
        max_rows: 2,
        prefill_chunk: 16,
        prefill_span: b.model.prefill_span(),
        ..BatchOptions::default()
    });
    assert!(b.model.prefill_span() >= long.len());
    let admit = |batch: &mut Batch, id, prompt: &[u32]| {
        let r = Request::new(prompt.to_vec(), 200);
        batch.admit(&b.model, tok, &b.stop_ids, id, &r).unwrap();
    };
    admit(&mut batch, 0, &p[0]);
    while batch.step(&b.model, tok).unwrap().rows.is_empty() {}
    let before = res.telemetry();
    admit(&mut batch, 1, &long);
    let mut steps = 0;
    loop {
        let r = batch.step(&b.model, tok).unwrap();
        steps += 1;
        assert!(r.rows.iter().any(|s| s.id == 0), "the decoding row stalled");
        if r.rows.iter().any(|s| s.id == 1) {
            break;
        }
    }
    let after = res.telemetry();
    let moe_layers = b.model.cfg.dense.iter().filter(|d| !**d).count();
    let k = b.model.cfg.raw.num_experts_per_tok;
    let reads = after.reads - before.reads;
    let bound = touched.len() + steps * k * moe_layers;
    assert!(
        reads as usize <= bound,
        "{reads} expert reads over {steps} steps; the prompt touches {} (layer, expert) pairs, \
         the decoding row can add {}",
        touched.len(),
        steps * k * moe_layers
    );
    // The budget is tight: the prompt's experts did not fit, so the bound is not vacuous.
    let slots = res.capacity(1);
    assert!(
        touched.len() > 2 * slots * moe_layers,
        "{} vs {slots}",
        touched.len()
    );
}

#[test]
fn a_budgeted_batch_matches_serving_alone() {
    // Under the same budget, rows prefilled layer-major beside each other (MTP on for one)
    // give `nectar run`'s greedy tokens.
    let b = e256_budgeted();
    let rows = mixed_rows(12);
    let want: Vec<Vec<u32>> = rows.iter().map(|r| alone(&b, &r.0)).collect();
    let (got, _) = run_batch(&b, &rows, opts(4, 16, b.model.prefill_span()));
    assert_eq!(got, want);
}

#[test]
fn a_joining_prompt_stalls_decoding_rows_by_a_bounded_step() {
    // Prefill work per step is at most max(prefill_chunk × layers, span) token-layers, the rows
    // already decoding produce a token every step, every prompt token runs through every layer
    // exactly once, and two long prompts joining together take at most the steps their spans
    // need at ⌊W ÷ span⌋ layers a step (at least one).
    let b = demo();
    let layers = b.model.num_layers();
    let p = prompts();
    let long = p[3].len();
    let join = 10;
    for (chunk, span) in [
        (64, usize::MAX),
        (8, usize::MAX),
        (16, 100),
        (300, usize::MAX),
    ] {
        let rows: Vec<Row> = vec![
            (Request::new(p[0].clone(), 300), None, 0),
            (Request::new(p[1].clone(), 300), mtp(), 0),
            (Request::new(p[3].clone(), 2), None, join),
            (Request::new(p[3].clone(), 2), None, join),
        ];
        let (_, steps) = run_batch_with(b, &rows, opts(4, chunk, span), &[], &mut NoObserver);
        let w = chunk * layers;
        let per = span.min(long);
        let bound = w.max(per);
        for (i, s) in steps.iter().enumerate() {
            assert!(
                s.prefill_work <= bound,
                "step {i}: {} > {bound}",
                s.prefill_work
            );
        }
        let work: usize = steps.iter().map(|s| s.prefill_work).sum();
        assert_eq!(work, (2 * long + p[0].len() + p[1].len()) * layers);
        let first = |id| steps.iter().position(|s| s.produced.contains(&id)).unwrap();
        assert!(first(0) < join && first(1) < join);
        let last = first(2).max(first(3));
        for (i, s) in steps.iter().enumerate().take(last + 1).skip(join) {
            assert!(
                s.produced.contains(&0) && s.produced.contains(&1),
                "step {i}"
            );
        }
        let need = 2 * long.div_ceil(per) * layers.div_ceil((w / per).max(1));
        assert!(
            last + 1 - join <= need,
            "chunk {chunk} span {span}: {} steps, bound {need}",
            last + 1 - join
        );
    }
}

#[test]
fn a_row_taken_out_inside_a_span_leaves_a_whole_cache() {
    // Taken out after its 284-token prompt ran 3 of 8 layers, a row's cache holds what every
    // layer holds (nothing of the unfinished span); a row started from it decodes as alone.
    let b = demo();
    let tok = b.tokenizer.as_ref();
    let p = prompts();
    let r = Request::new(p[3].clone(), 8);
    let mut batch = Batch::new(opts(1, 40, usize::MAX));
    batch.admit(&b.model, tok, &b.stop_ids, 0, &r).unwrap();
    for _ in 0..3 {
        let s = batch.step(&b.model, tok).unwrap();
        assert!(s.rows.is_empty() && s.prefill_work == p[3].len());
    }
    let layers = |c: &nectar_model::SeqCache| c.layers.iter().map(|l| l.len()).collect::<Vec<_>>();
    assert_eq!(
        layers(batch.cache(0).unwrap())[..4],
        [p[3].len(), p[3].len(), p[3].len(), 0]
    );
    let (_, cache) = batch.take(0).unwrap();
    assert_eq!(layers(&cache), vec![0; b.model.num_layers()]);
    let state = RequestState::new(&r, &b.stop_ids, b.model.vocab_size(), tok).unwrap();
    let o = RowOptions {
        cache: Some(cache),
        ..RowOptions::default()
    };
    batch.admit_row(&b.model, 1, state, o).unwrap();
    let mut got = Vec::new();
    while !batch.is_empty() {
        got.extend(
            batch
                .step(&b.model, tok)
                .unwrap()
                .rows
                .iter()
                .map(|s| s.step.token),
        );
    }
    assert_eq!(got, alone(b, &r));
}
