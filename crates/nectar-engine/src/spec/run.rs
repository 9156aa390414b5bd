//! Speculative generation end to end: the [`crate::generate`] of
//! speculation, with its telemetry.

use super::decoder::SpecDecoder;
use super::drafter::Drafter;
use super::lookup::PromptLookup;
use super::mtp::MtpDrafter;
use super::stats::SpecStats;
use super::{Speculation, Speculator};
use crate::bundle::ModelBundle;
use crate::error::Result;
use crate::generate::{generate_cached, Generation};
use crate::request::{FinishReason, Request};
use crate::request_state::Step;
use crate::tokenizer::Tokenizer;
use nectar_model::{Glm5, SeqCache};
use std::time::{Duration, Instant};

/// [`generate_speculative`] with `bundle`'s model, tokenizer and stop set.
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

/// Generates `request` with speculation `spec` (`None`: plain decoding,
/// through [`generate_with`]); `on_step` sees every output token as in
/// [`generate_with`] and returns `false` to cancel. The result's `spec`
/// holds the telemetry (also for plain decoding, as the baseline).
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

/// [`generate_speculative`] continuing from `cache`, which holds the first
/// `cache.len()` prompt tokens (see [`crate::generate_cached`]; with MTP
/// drafting also exactly as many MTP rows). On return (also on error, then
/// possibly emptied) the cache holds every token but the last generated one.
pub fn generate_speculative_cached(
    model: &Glm5,
    tokenizer: Option<&Tokenizer>,
    stop_ids: &[u32],
    request: &Request,
    spec: Option<&Speculation>,
    cache: &mut SeqCache,
    mut on_step: impl FnMut(&Step) -> Result<bool>,
) -> Result<Generation> {
    let Some(spec) = spec else {
        let mut g = generate_cached(model, tokenizer, stop_ids, request, cache, on_step)?;
        let total = (g.prefill + g.decode).as_secs_f64().max(1e-9);
        g.spec = Some(SpecStats::plain(
            g.tokens.len(),
            g.tokens.len() as f64 / total,
            g.decode_tok_s(),
        ));
        return Ok(g);
    };
    spec.validate()?;
    let drafter: Box<dyn Drafter> = match spec.speculator {
        Speculator::Mtp { .. } => Box::new(MtpDrafter::new(model)?),
        Speculator::PromptLookup { ngram, .. } => Box::new(PromptLookup::new(ngram)),
    };
    let mut dec = SpecDecoder::new(
        model,
        tokenizer,
        stop_ids,
        request,
        Some(drafter),
        spec.max_draft(),
        spec.auto,
    )?
    .with_cache(std::mem::take(cache))?;
    let mut out = Generation {
        tokens: Vec::new(),
        text: String::new(),
        logprobs: Vec::new(),
        finish: FinishReason::Length,
        stop: None,
        seed: dec.state().sampler().seed(),
        prompt_tokens: request.prompt_ids.len() - dec.cache().len(),
        forced_tokens: 0,
        prefill: Duration::ZERO,
        decode: Duration::ZERO,
        spec: None,
    };
    let t0 = Instant::now();
    let mut t1 = None;
    // Set when the consumer cancels before the round's last token: the
    // request then ends there, as it would have in plain decoding, whatever
    // the unreported tokens were.
    let mut cut = false;
    'run: while !dec.finished() {
        let round = dec.round()?;
        if t1.is_none() {
            out.prefill = t0.elapsed();
            t1 = Some(Instant::now());
        }
        for (i, step) in round.steps.iter().enumerate() {
            out.tokens.push(step.token);
            out.text += &step.text;
            out.logprobs.extend(step.logprobs.iter().cloned());
            if !on_step(step)? {
                dec.cancel();
                cut = i + 1 < round.steps.len() || step.finished.is_none();
                break 'run;
            }
        }
    }
    out.decode = t1.map_or(Duration::ZERO, |t| t.elapsed());
    out.forced_tokens = dec.state().forced_tokens();
    if cut {
        out.finish = FinishReason::Cancelled;
    } else {
        out.finish = dec.state().finished().unwrap_or(FinishReason::Length);
        out.stop = dec.state().stop_cause().cloned();
    }
    let stats = dec.stats(
        out.tokens.len(),
        (out.prefill + out.decode).as_secs_f64(),
        out.decode.as_secs_f64(),
    );
    out.spec = Some(stats);
    *cache = dec.into_cache();
    Ok(out)
}
