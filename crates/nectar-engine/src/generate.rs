//! The serial driver: one request, prefill then one decode step at a time.
//!
//! This is what `nectar run` uses. All per-request logic (sampling, stops,
//! text) lives in [`RequestState`]; the driver only runs the model: one
//! `Glm5::forward` per step on the request's own cache, and the logits of
//! the last row.

use crate::bundle::ModelBundle;
use crate::error::Result;
use crate::request::{FinishReason, Request, StopCause};
use crate::request_state::{RequestState, Step};
use crate::sampler::Logprobs;
use crate::spec::SpecStats;
use crate::tokenizer::Tokenizer;
use nectar_model::{Glm5, NoObserver, SeqCache, SeqStep};
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
    /// Speculation telemetry, from [`crate::generate_speculative`] (which
    /// reports plain decoding too, as `"off"`); `None` from the plain
    /// drivers.
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
    generate_with(
        &bundle.model,
        bundle.tokenizer.as_ref(),
        &bundle.stop_ids,
        request,
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
    let mut cache = model.new_cache();
    generate_cached(model, tokenizer, stop_ids, request, &mut cache, on_step)
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
    mut on_step: impl FnMut(&Step) -> Result<bool>,
) -> Result<Generation> {
    let mut state = RequestState::new(request, stop_ids, model.vocab_size(), tokenizer)?;
    state.skip_cached(cache.len())?;
    let mut out = Generation {
        tokens: Vec::new(),
        text: String::new(),
        logprobs: Vec::new(),
        finish: FinishReason::Length,
        stop: None,
        seed: state.sampler().seed(),
        prompt_tokens: request.prompt_ids.len() - cache.len(),
        forced_tokens: 0,
        prefill: Duration::ZERO,
        decode: Duration::ZERO,
        spec: None,
    };
    let hd = model.hidden_size();
    let t0 = Instant::now();
    let mut t1 = None;
    loop {
        // Forced tokens first: they join the pending input, so the forward
        // below runs them together with the last sampled token.
        let forced = state.fast_forward(tokenizer)?;
        if !report(&mut out, &mut state, forced, &mut on_step)? {
            break;
        }
        let Some(input) = state.pending_input() else {
            break;
        };
        let h = model.forward(
            &mut [SeqStep {
                cache: &mut *cache,
                tokens: input,
            }],
            &mut NoObserver,
        )?;
        let logits = model.logits(&h[h.len() - hd..])?;
        let step = state.on_logits(&logits, None, tokenizer)?;
        if t1.is_none() {
            out.prefill = t0.elapsed();
            t1 = Some(Instant::now());
        }
        report(&mut out, &mut state, vec![step], &mut on_step)?;
    }
    out.decode = t1.map_or(Duration::ZERO, |t| t.elapsed());
    out.forced_tokens = state.forced_tokens();
    out.finish = state.finished().unwrap_or(FinishReason::Length);
    out.stop = state.stop_cause().cloned();
    Ok(out)
}

/// Adds `steps` to `out` and shows them to `on_step`; a `false` from it
/// cancels the request and drops the steps after it. Returns whether to go
/// on.
fn report(
    out: &mut Generation,
    state: &mut RequestState,
    steps: Vec<Step>,
    on_step: &mut impl FnMut(&Step) -> Result<bool>,
) -> Result<bool> {
    for step in steps {
        out.tokens.push(step.token);
        out.text += &step.text;
        out.logprobs.extend(step.logprobs.iter().cloned());
        if !on_step(&step)? {
            state.cancel();
            return Ok(false);
        }
    }
    Ok(true)
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
