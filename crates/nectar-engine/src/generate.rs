//! The serial generation loop: prefill the prompt, then decode one token per step.
use crate::error::{Error, Result};
use nectar_model::{Glm5, NoObserver, SeqCache, SeqStep};
use std::time::{Duration, Instant};

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was produced (it is included in the output tokens).
    Stop,
    /// `max_tokens` was reached.
    Length,
    /// The consumer asked to stop.
    Cancelled,
}

impl FinishReason {
    /// OpenAI-style name.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// What one generation produced and how long it took.
#[derive(Debug, Clone)]
pub struct Generation {
    /// Generated token ids (a final stop token included).
    pub tokens: Vec<u32>,
    /// Why it stopped.
    pub finish: FinishReason,
    /// Prompt tokens processed.
    pub prompt_tokens: usize,
    /// Time to process the prompt (including the first token's logits).
    pub prefill: Duration,
    /// Time for the remaining decode steps.
    pub decode: Duration,
}

impl Generation {
    /// Prompt tokens per second.
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill.as_secs_f64().max(1e-9)
    }

    /// Decode tokens per second (tokens after the first, over the decode time).
    pub fn decode_tok_s(&self) -> f64 {
        self.tokens.len().saturating_sub(1) as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

/// Greedy decoding: the argmax token (lowest id on ties) at every step.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

/// Generates greedily from `prompt` until a stop id or `max_tokens`. `on_token` sees each token
/// as it is produced and returns `false` to cancel.
pub fn generate_greedy(
    model: &Glm5,
    prompt: &[u32],
    max_tokens: usize,
    stop_ids: &[u32],
    mut on_token: impl FnMut(u32) -> Result<bool>,
) -> Result<Generation> {
    if prompt.is_empty() {
        return Err(Error::Request("the prompt is empty".into()));
    }
    let mut cache: SeqCache = model.new_cache();
    let mut out = Generation {
        tokens: Vec::new(),
        finish: FinishReason::Length,
        prompt_tokens: prompt.len(),
        prefill: Duration::ZERO,
        decode: Duration::ZERO,
    };
    if max_tokens == 0 {
        return Ok(out);
    }
    let t0 = Instant::now();
    let h = model.forward(
        &mut [SeqStep {
            cache: &mut cache,
            tokens: prompt,
        }],
        &mut NoObserver,
    )?;
    let hd = model.hidden_size();
    let mut tok = argmax(&model.logits(&h[h.len() - hd..])?);
    out.prefill = t0.elapsed();
    let t1 = Instant::now();
    loop {
        out.tokens.push(tok);
        if !on_token(tok)? {
            out.finish = FinishReason::Cancelled;
            break;
        }
        if stop_ids.contains(&tok) {
            out.finish = FinishReason::Stop;
            break;
        }
        if out.tokens.len() >= max_tokens {
            break;
        }
        let h = model.forward(
            &mut [SeqStep {
                cache: &mut cache,
                tokens: &[tok],
            }],
            &mut NoObserver,
        )?;
        tok = argmax(&model.logits(&h)?);
    }
    out.decode = t1.elapsed();
    Ok(out)
}
