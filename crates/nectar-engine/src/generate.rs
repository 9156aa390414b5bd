//! One request to its end: a batch of one.
//!
//! There is one decode driver, [`Batch`]; these functions admit a single
//! row (with its speculation, if any, and a starting cache, if any), step
//! the batch until the row finishes and collect what it produced. This is
//! what `nectar run`, sessions, examples and tests use.

use crate::batch::{Batch, BatchOptions, RowOptions};
use crate::bundle::ModelBundle;
use crate::error::Result;
use crate::request::{FinishReason, Request, StopCause};
use crate::request_state::{RequestState, Step};
use crate::sampler::Logprobs;
use crate::spec::{SpecStats, Speculation};
use crate::tokenizer::Tokenizer;
use nectar_model::{Glm5, SeqCache};
use std::time::{Duration, Instant};

/// What one generation produced and how long it took.
#[derive(Debug, Clone)]
pub struct Generation {
    /// Generated token ids (a final stop token included).
    pub tokens: Vec<u32>,
    /// The output text: the concatenation of every step's text (stop
    /// tokens, special tokens and anything from a stop string on excluded;
    /// empty without a tokenizer).
    pub text: String,
    /// Per-token logprobs, one per token, when the request asked for them.
    pub logprobs: Vec<Logprobs>,
    /// Why it stopped.
    pub finish: FinishReason,
    /// The stop token or string, when `finish` is `Stop`.
    pub stop: Option<StopCause>,
    /// The sampler's seed (the request's, or the one drawn for it).
    pub seed: u64,
    /// Prompt tokens processed.
    pub prompt_tokens: usize,
    /// Tokens the grammar forced: emitted without sampling, run through the
    /// model together with the token before them (0 without a grammar).
    pub forced_tokens: usize,
    /// Time to process the prompt (including the first token's logits).
    pub prefill: Duration,
    /// Time for the remaining decode steps.
    pub decode: Duration,
    /// Speculation telemetry (plain decoding reports mode `"off"`); `None`
    /// when nothing ran (`max_tokens` 0).
    pub spec: Option<SpecStats>,
}

impl Generation {
    /// Prompt tokens per second (0 when the prompt was not run, e.g. `max_tokens` 0).
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill)
    }

    /// Decode tokens per second (tokens after the first, over the decode time).
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.tokens.len().saturating_sub(1), self.decode)
    }
}

/// `n` per second over `d`; 0 when nothing was timed (a rate over no time is no measurement).
fn rate(n: usize, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        n as f64 / d.as_secs_f64()
    }
}

/// Generates `request` with `bundle`'s model, tokenizer and stop set.
/// `on_step` sees every step as it happens (its `text` is safe to stream)
/// and returns `false` to cancel.
pub fn generate(
    bundle: &ModelBundle,
    request: &Request,
    on_step: impl FnMut(&Step) -> Result<bool>,
) -> Result<Generation> {
    generate_spec(bundle, request, None, on_step)
}

/// [`generate`] with speculation `spec` (`None`: plain decoding).
pub fn generate_spec(
    bundle: &ModelBundle,
    request: &Request,
    spec: Option<&Speculation>,
    on_step: impl FnMut(&Step) -> Result<bool>,
) -> Result<Generation> {
    generate_speculative(
        &bundle.model,
        bundle.tokenizer.as_ref(),
        &bundle.stop_ids,
        request,
        spec,
        on_step,
    )
}

/// [`generate`] with the parts given separately; without a tokenizer the
/// output is ids only (and stop strings are refused).
pub fn generate_with(
    model: &Glm5,
    tokenizer: Option<&Tokenizer>,
    stop_ids: &[u32],
    request: &Request,
    on_step: impl FnMut(&Step) -> Result<bool>,
) -> Result<Generation> {
    generate_speculative(model, tokenizer, stop_ids, request, None, on_step)
}

/// [`generate_with`] continuing from `cache`, which holds the first
/// `cache.len()` prompt tokens (a session's reused prefix; fewer than the
/// whole prompt, so the last prompt token runs for the first logits). Only
/// the rest of the prompt runs; on return the cache holds every token but
/// the last generated one.
pub fn generate_cached(
    model: &Glm5,
    tokenizer: Option<&Tokenizer>,
    stop_ids: &[u32],
    request: &Request,
    cache: &mut SeqCache,
    on_step: impl FnMut(&Step) -> Result<bool>,
) -> Result<Generation> {
    generate_speculative_cached(model, tokenizer, stop_ids, request, None, cache, on_step)
}

/// [`generate_with`] with speculation `spec` (`None`: plain decoding).
pub fn generate_speculative(
    model: &Glm5,
    tokenizer: Option<&Tokenizer>,
    stop_ids: &[u32],
    request: &Request,
    spec: Option<&Speculation>,
    on_step: impl FnMut(&Step) -> Result<bool>,
) -> Result<Generation> {
    let mut cache = model.new_cache();
    generate_speculative_cached(
        model, tokenizer, stop_ids, request, spec, &mut cache, on_step,
    )
}

/// [`generate_speculative`] continuing from `cache` (see [`generate_cached`];
/// with MTP drafting the main cache is cut back to the MTP cache's rows). On
/// return the cache holds every token but the last generated one (on error it
/// may have been emptied).
pub fn generate_speculative_cached(
    model: &Glm5,
    tokenizer: Option<&Tokenizer>,
    stop_ids: &[u32],
    request: &Request,
    spec: Option<&Speculation>,
    cache: &mut SeqCache,
    on_step: impl FnMut(&Step) -> Result<bool>,
) -> Result<Generation> {
    let opts = RowOptions {
        speculation: spec.copied(),
        cache: Some(std::mem::take(cache)),
        ..RowOptions::default()
    };
    let (g, c) = generate_row(model, tokenizer, stop_ids, request, opts, on_step)?;
    *cache = c;
    Ok(g)
}

/// Runs `request` as the only row of a [`Batch`] admitted with `opts`, to its
/// end; returns what it produced and its cache. `on_step` sees every output
/// token and returns `false` to cancel: the request then ends at that token,
/// as it would have in plain decoding, whatever the rest of the step's
/// tokens were.
pub fn generate_row(
    model: &Glm5,
    tokenizer: Option<&Tokenizer>,
    stop_ids: &[u32],
    request: &Request,
    mut opts: RowOptions,
    mut on_step: impl FnMut(&Step) -> Result<bool>,
) -> Result<(Generation, SeqCache)> {
    if let Some(s) = &opts.speculation {
        s.validate()?;
    }
    let state = RequestState::new(request, stop_ids, model.vocab_size(), tokenizer)?;
    let mut out = Generation {
        tokens: Vec::new(),
        text: String::new(),
        logprobs: Vec::new(),
        finish: FinishReason::Length,
        stop: None,
        seed: state.sampler().seed(),
        prompt_tokens: 0,
        forced_tokens: 0,
        prefill: Duration::ZERO,
        decode: Duration::ZERO,
        spec: None,
    };
    if state.finished().is_some() {
        // Nothing to generate (`max_tokens` 0): nothing runs.
        let cache = opts.cache.take().unwrap_or_else(|| model.new_cache());
        return Ok((out, cache));
    }
    opts.hold_cache = true;
    // The whole prompt as one span through every layer in one step, as a lone request has no
    // one to wait for.
    let mut batch = Batch::new(BatchOptions {
        max_rows: 1,
        prefill_chunk: usize::MAX,
        prefill_span: usize::MAX,
        keep_tokens: 0,
    });
    batch.admit_row(model, 0, state, opts)?;
    let t0 = Instant::now();
    let mut t1 = None;
    let mut summary = None;
    // Set when the consumer cancels before the step's last token or before the end.
    let mut cut = false;
    'run: while summary.is_none() {
        let report = batch.step(model, tokenizer)?;
        if t1.is_none() {
            out.prefill = t0.elapsed();
            t1 = Some(Instant::now());
        }
        let n = report.rows.len();
        for (i, rs) in report.rows.into_iter().enumerate() {
            out.tokens.push(rs.step.token);
            out.text += &rs.step.text;
            out.logprobs.extend(rs.step.logprobs.iter().cloned());
            let last = rs.summary.is_some();
            summary = summary.or(rs.summary);
            if !on_step(&rs.step)? {
                cut = i + 1 < n || !last;
                break 'run;
            }
        }
    }
    out.decode = t1.map_or(Duration::ZERO, |t| t.elapsed());
    let (s, cache) = match batch.take(0) {
        Some(x) => x,
        None => match (summary, batch.take_cache(0)) {
            (Some(s), Some(c)) => (s, c),
            _ => {
                return Err(crate::error::Error::Request(
                    "the row left the batch without its totals".into(),
                ))
            }
        },
    };
    out.prompt_tokens = s.prompt_tokens - s.cached_tokens;
    out.forced_tokens = s.forced_tokens;
    if cut {
        out.finish = FinishReason::Cancelled;
    } else {
        out.finish = s.finish.unwrap_or(FinishReason::Length);
        out.stop = s.stop.clone();
    }
    out.spec = Some(s.spec);
    Ok((out, cache))
}

/// Greedy ids-only generation from `prompt` until an id of `stop_ids` or
/// `max_tokens`; `on_token` sees each id and returns `false` to cancel.
/// For callers that need no text (benchmarks, parity checks).
pub fn generate_greedy(
    model: &Glm5,
    prompt: &[u32],
    max_tokens: usize,
    stop_ids: &[u32],
    mut on_token: impl FnMut(u32) -> Result<bool>,
) -> Result<Generation> {
    let request = Request::new(prompt.to_vec(), max_tokens);
    generate_with(model, None, stop_ids, &request, |s| on_token(s.token))
}
