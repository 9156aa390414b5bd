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
use crate::sampler::{Distribution, Logprobs, Sampler, TokenHistory};
use crate::spec::{verify_draft, Verdict};
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

/// What [`RequestState::verify`] produced for one round.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    /// One step per token that became output, in order: the accepted drafts,
    /// then the correction or bonus token (fewer when the request finished
    /// inside the run).
    pub steps: Vec<Step>,
    /// How many drafts were accepted.
    pub accepted: usize,
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

    /// Marks the first `n` prompt tokens as already in the model's cache (a
    /// session's reused prefix), so [`Self::pending_input`] starts after
    /// them. Only before the first step, and at least the last prompt token
    /// must remain to produce the first logits.
    pub fn skip_cached(&mut self, n: usize) -> Result<()> {
        let prompt = self.history.tokens().len() - self.history.generated().len();
        if self.fed != 0 || !self.history.generated().is_empty() || n >= prompt {
            return Err(Error::Request(format!(
                "{n} cached tokens for a {prompt}-token prompt (at most {} before the first step)",
                prompt.saturating_sub(1)
            )));
        }
        self.fed = n;
        Ok(())
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
        self.emit(sampled.token, sampled.logprobs, tokenizer)
    }

    /// Verifies one round of speculative drafts: `logits` holds one row per
    /// input the model ran for it — the last sampled token, then each draft
    /// (`drafts.len() + 1` rows) — and `q[j]` the distribution `drafts[j]` was
    /// drawn from (`None`: proposed deterministically, a point mass).
    ///
    /// Each row's target distribution is the one plain decoding would sample
    /// from at that position (same processing, the history up to it), and
    /// each draft is checked by standard rejection sampling
    /// ([`crate::verify_draft`]; greedy: exact match with the argmax). The
    /// accepted drafts, then the correction (first rejection) or the bonus
    /// token (all accepted), go through the same stop, text and `max_tokens`
    /// checks as [`Self::on_logits`], so a stop inside the accepted run ends
    /// the request exactly where plain decoding would; later rows are
    /// ignored. With no drafts this is [`Self::on_logits`] without a mask.
    pub fn verify(
        &mut self,
        logits: &[f32],
        drafts: &[u32],
        q: &[Option<Distribution>],
        tokenizer: Option<&Tokenizer>,
    ) -> Result<Verified> {
        if self.finished.is_some() {
            return Err(Error::Request("the request has already finished".into()));
        }
        let vocab = self.sampler.vocab_size();
        if logits.len() != (drafts.len() + 1) * vocab {
            return Err(Error::ShapeMismatch {
                what: "verification logits",
                expected: (drafts.len() + 1) * vocab,
                found: logits.len(),
            });
        }
        if q.len() != drafts.len() {
            return Err(Error::ShapeMismatch {
                what: "draft distributions",
                expected: drafts.len(),
                found: q.len(),
            });
        }
        let mut out = Verified {
            steps: Vec::with_capacity(drafts.len() + 1),
            accepted: 0,
        };
        for (j, row) in logits.chunks_exact(vocab).enumerate() {
            let (processed, p) = self.sampler.distribution(row, &self.history, None)?;
            let (token, last) = match drafts.get(j) {
                Some(&d) => match verify_draft(&mut self.sampler, &p, q[j].as_ref(), d) {
                    Verdict::Accepted => {
                        out.accepted += 1;
                        (d, false)
                    }
                    Verdict::Rejected(t) => (t, true),
                },
                None => (self.sampler.draw(&p), true),
            };
            let logprobs = self.sampler.logprobs_of(&processed, token);
            let step = self.emit(token, logprobs, tokenizer)?;
            let finished = step.finished.is_some();
            out.steps.push(step);
            if last || finished {
                break;
            }
        }
        Ok(out)
    }

    /// Records `token` as generated and runs the end checks: a stop token,
    /// a stop string in the decoded text, `max_tokens`.
    fn emit(
        &mut self,
        token: u32,
        logprobs: Option<Logprobs>,
        tokenizer: Option<&Tokenizer>,
    ) -> Result<Step> {
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
            logprobs,
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

    /// Prompt and generated tokens (while drafting, the drafts too).
    pub(crate) fn history(&self) -> &TokenHistory {
        &self.history
    }

    /// The history and the sampler together, for drafting: drafts are pushed
    /// to the history while they are proposed (so penalties see them, as
    /// they would in plain decoding) and rolled back before verification.
    pub(crate) fn draft_parts(&mut self) -> (&mut TokenHistory, &mut Sampler) {
        (&mut self.history, &mut self.sampler)
    }

    /// Tokens generated so far that count against `max_tokens`, and the limit.
    pub(crate) fn budget(&self) -> (usize, usize) {
        (self.history.generated().len(), self.max_tokens)
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
