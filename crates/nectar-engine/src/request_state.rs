//! One request's generation as a state machine a scheduler can step.
//!
//! The state owns everything per request except the model's cache: the
//! sampler (and its RNG), the token history, the stream decoder and the stop
//! matcher. A driver asks it which tokens to run next
//! ([`RequestState::pending_input`]), runs them through the model, and hands
//! back the last row's logits ([`RequestState::on_logits`]). Nothing here
//! touches the model, so the same state serves the serial driver and a
//! batching scheduler that steps many requests, one row each.

use crate::error::{Error, Result};
use crate::request::{FinishReason, Request, StopCause};
use crate::sampler::{Logprobs, Sampler, TokenHistory};
use crate::stop::StopMatcher;
use crate::stream_decoder::StreamDecoder;
use crate::tokenizer::Tokenizer;

/// What one step produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The token chosen at this step (a stop token included).
    pub token: u32,
    /// Text that became safe to emit with this step (possibly empty: an
    /// incomplete character, a possible stop string held back, a stop token,
    /// or no tokenizer).
    pub text: String,
    /// The token's logprobs, when the request asked for them.
    pub logprobs: Option<Logprobs>,
    /// Set on the request's last step.
    pub finished: Option<FinishReason>,
}

/// A request being generated.
#[derive(Debug, Clone)]
pub struct RequestState {
    sampler: Sampler,
    history: TokenHistory,
    /// History tokens already given to the model (its cache length).
    fed: usize,
    max_tokens: usize,
    /// Model eos set ∪ request extras, sorted.
    stop_ids: Vec<u32>,
    /// `None` without a tokenizer: ids only, no text.
    decoder: Option<StreamDecoder>,
    matcher: StopMatcher,
    finished: Option<FinishReason>,
    stop: Option<StopCause>,
}

impl RequestState {
    /// Validates `request` (see [`Request::validate`]) and prepares its state. `model_stop_ids` is the
    /// model's eos set; `vocab_size` the length of a logits row; text output
    /// (and stop strings) need `tokenizer`.
    pub fn new(
        request: &Request,
        model_stop_ids: &[u32],
        vocab_size: usize,
        tokenizer: Option<&Tokenizer>,
    ) -> Result<RequestState> {
        request.validate(vocab_size, tokenizer.is_some())?;
        let mut stop_ids: Vec<u32> = model_stop_ids
            .iter()
            .chain(&request.extra_stop_ids)
            .copied()
            .collect();
        stop_ids.sort_unstable();
        stop_ids.dedup();
        Ok(RequestState {
            sampler: Sampler::new(request.params.clone(), vocab_size)?,
            history: TokenHistory::new(&request.prompt_ids),
            fed: 0,
            max_tokens: request.max_tokens,
            stop_ids,
            // Special tokens are not text; the prompt's tail is context so
            // the first generated piece decodes as it would mid-sequence.
            decoder: tokenizer.map(|_| StreamDecoder::with_context(true, &request.prompt_ids)),
            matcher: StopMatcher::new(request.stop_strings.iter().cloned())?,
            finished: (request.max_tokens == 0).then_some(FinishReason::Length),
            stop: None,
        })
    }

    /// The tokens the model must run before the next [`Self::on_logits`]:
    /// the whole prompt at first, then the last sampled token; `None` once
    /// the request has finished.
    pub fn pending_input(&self) -> Option<&[u32]> {
        match self.finished {
            Some(_) => None,
            None => Some(&self.history.tokens()[self.fed..]),
        }
    }

    /// Takes the logits of the last row the model ran for
    /// [`Self::pending_input`], chooses the next token and advances: stop
    /// tokens, stop strings and `max_tokens` are checked here. `allowed` is
    /// the structured-output mask (see [`crate::process_logits`]);
    /// `tokenizer` must be the one given to [`Self::new`].
    pub fn on_logits(
        &mut self,
        logits: &[f32],
        allowed: Option<&[bool]>,
        tokenizer: Option<&Tokenizer>,
    ) -> Result<Step> {
        if self.finished.is_some() {
            return Err(Error::Request("the request has already finished".into()));
        }
        let sampled = self.sampler.sample(logits, &self.history, allowed)?;
        let token = sampled.token;
        self.fed = self.history.tokens().len();
        self.history.push(token);
        let mut text = String::new();
        if self.stop_ids.binary_search(&token).is_ok() {
            self.stop = Some(StopCause::Token(token));
            self.finished = Some(FinishReason::Stop);
            text = self.flush(tokenizer)?;
        } else {
            if let Some(dec) = self.decoder.as_mut() {
                let piece = dec.push(need(tokenizer)?, token)?;
                text = self.scan(&piece);
            }
            if self.finished.is_none() && self.history.generated().len() >= self.max_tokens {
                self.finished = Some(FinishReason::Length);
                text += &self.flush(tokenizer)?;
            }
        }
        Ok(Step {
            token,
            text,
            logprobs: sampled.logprobs,
            finished: self.finished,
        })
    }

    /// The consumer wants no more: finish now, emitting nothing further.
    pub fn cancel(&mut self) {
        if self.finished.is_none() {
            self.finished = Some(FinishReason::Cancelled);
        }
    }

    /// Why the request finished, once it has.
    pub fn finished(&self) -> Option<FinishReason> {
        self.finished
    }

    /// The stop token or string that ended the request, if one did.
    pub fn stop_cause(&self) -> Option<&StopCause> {
        self.stop.as_ref()
    }

    /// The tokens generated so far.
    pub fn generated(&self) -> &[u32] {
        self.history.generated()
    }

    /// The sampler (its seed, its parameters).
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// Every id that ends this request, sorted.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Runs a decoded piece through the stop matcher; a match finishes the
    /// request.
    fn scan(&mut self, piece: &str) -> String {
        let scan = self.matcher.push(piece);
        if let Some(i) = scan.matched {
            self.stop = Some(StopCause::String(self.matcher.stops()[i].clone()));
            self.finished = Some(FinishReason::Stop);
        }
        scan.text
    }

    /// The stream ends: release what the decoder and the matcher held back.
    /// The decoder's tail can still complete a stop string.
    fn flush(&mut self, tokenizer: Option<&Tokenizer>) -> Result<String> {
        let Some(dec) = self.decoder.as_mut() else {
            return Ok(String::new());
        };
        let tail = dec.finish(need(tokenizer)?)?;
        // After a match `finish` gives nothing: the rest is past the stop.
        Ok(self.scan(&tail) + &self.matcher.finish())
    }
}

/// The tokenizer a text-producing request was created with.
fn need(tokenizer: Option<&Tokenizer>) -> Result<&Tokenizer> {
    tokenizer.ok_or_else(|| {
        Error::Request("this request produces text: pass the tokenizer it was created with".into())
    })
}
