//! One request's generation as a state machine a scheduler can step.
//!
//! The state owns everything per request except the model's cache: the
//! sampler (and its RNG), the token history, the stream decoder and the stop
//! matcher. A driver asks it which tokens to run next
//! ([`RequestState::pending_input`]), runs them through the model, and hands
//! back the last row's logits ([`RequestState::on_logits`]). Nothing here
//! touches the model: the batch ([`crate::Batch`], the one decode driver)
//! steps many states, one row each.
//!
//! Structured output: with a grammar ([`Request::grammar`]) the state owns
//! its matcher. Every row is sampled under the grammar's mask, every emitted
//! token advances it, a complete grammar ends the request, and tokens the
//! grammar forces are emitted without sampling by
//! [`RequestState::fast_forward`]. A forced token still has to go through
//! the model: it joins [`RequestState::pending_input`], so the next forward
//! runs the last sampled token and the forced run together, and the cache
//! stays exactly what plain decoding would have built.

use crate::error::{Error, Result};
use crate::grammar::GrammarMatcher;
use crate::request::{FinishReason, Request, StopCause};
use crate::sampler::{Distribution, Logprobs, Sampler, TokenHistory};
use crate::spec::{verify_coupled, verify_draft, Verdict};
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
    /// The grammar forced this token: it was emitted without sampling (its
    /// logprob is 0, the masked distribution being a point mass).
    pub forced: bool,
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
    /// Structured output's parser state, when the request has a grammar.
    grammar: Option<GrammarMatcher>,
    /// Tokens emitted by [`Self::fast_forward`] (not sampled).
    forced: usize,
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
        let grammar = request.compile_grammar(tokenizer, vocab_size, model_stop_ids)?;
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
            grammar,
            forced: 0,
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
    /// the whole prompt at first, then the last sampled token (followed by
    /// any tokens [`Self::fast_forward`] emitted); `None` once the request
    /// has finished.
    pub fn pending_input(&self) -> Option<&[u32]> {
        match self.finished {
            Some(_) => None,
            None => Some(&self.history.tokens()[self.fed..]),
        }
    }

    /// Takes the logits of the last row the model ran for
    /// [`Self::pending_input`], chooses the next token and advances: stop
    /// tokens, stop strings and `max_tokens` are checked here. `allowed` is
    /// an extra mask (see [`crate::process_logits`]), combined with the
    /// request's grammar mask when it has one; `tokenizer` must be the one
    /// given to [`Self::new`].
    pub fn on_logits(
        &mut self,
        logits: &[f32],
        allowed: Option<&[bool]>,
        tokenizer: Option<&Tokenizer>,
    ) -> Result<Step> {
        if self.finished.is_some() {
            return Err(Error::Request("the request has already finished".into()));
        }
        let mask = self.mask(allowed)?;
        let sampled = self
            .sampler
            .sample(logits, &self.history, mask.as_deref().or(allowed))?;
        self.fed = self.history.tokens().len();
        self.emit(sampled.token, sampled.logprobs, false, tokenizer)
    }

    /// Emits the tokens the grammar forces from here (none without a
    /// grammar, or when the next token is a real choice), each through the
    /// same stop and `max_tokens` checks as a sampled one. Call it before
    /// running [`Self::pending_input`]: the forced tokens join the pending
    /// input, so one forward runs them all and its last row gives the
    /// logits for the next sampled token. Skipping it is still correct
    /// (the mask then allows only the forced token), one forward per token.
    pub fn fast_forward(&mut self, tokenizer: Option<&Tokenizer>) -> Result<Vec<Step>> {
        let forced = match (&self.finished, self.grammar.as_mut()) {
            (None, Some(g)) => g.forced()?,
            _ => return Ok(Vec::new()),
        };
        let mut steps = Vec::with_capacity(forced.len());
        for token in forced {
            if self.finished.is_some() {
                break;
            }
            // The masked distribution is a point mass on the forced token.
            let logprobs = self.sampler.params().logprobs.map(|n| Logprobs {
                logprob: 0.0,
                top: if n > 0 {
                    vec![(token, 0.0)]
                } else {
                    Vec::new()
                },
            });
            self.forced += 1;
            steps.push(self.emit(token, logprobs, true, tokenizer)?);
        }
        Ok(steps)
    }

    /// The mask to sample under: the grammar's (plus every request stop id
    /// while the grammar could end), combined with `allowed`; `None` when
    /// neither applies.
    pub(crate) fn mask(&mut self, allowed: Option<&[bool]>) -> Result<Option<Vec<bool>>> {
        let Some(g) = self.grammar.as_mut() else {
            return Ok(None);
        };
        let mut mask = g.mask()?;
        // The grammar's eos set is the model's; extra stop ids end the
        // request too, so they are allowed exactly when the eos set is.
        if g.is_complete() || g.is_accepting()? {
            for &id in &self.stop_ids {
                if let Some(m) = mask.get_mut(id as usize) {
                    *m = true;
                }
            }
        }
        if let Some(a) = allowed {
            if a.len() != mask.len() {
                return Err(Error::ShapeMismatch {
                    what: "allowed mask",
                    expected: mask.len(),
                    found: a.len(),
                });
            }
            mask.iter_mut().zip(a).for_each(|(m, &ok)| *m &= ok);
        }
        Ok(Some(mask))
    }

    /// Whether the grammar allows `token` next (always, without one); a
    /// stop token is allowed when the grammar could end here.
    pub(crate) fn grammar_allows(&mut self, token: u32) -> Result<bool> {
        let stop = self.stop_ids.binary_search(&token).is_ok();
        match self.grammar.as_mut() {
            None => Ok(true),
            Some(g) if stop => Ok(g.is_complete() || g.is_accepting()?),
            Some(g) => g.allows(token),
        }
    }

    /// Advances the grammar over a draft; stop tokens are not consumed.
    /// Returns whether it advanced (what [`Self::grammar_restore`] undoes).
    pub(crate) fn grammar_advance(&mut self, token: u32) -> Result<bool> {
        match self.grammar.as_mut() {
            Some(g) if self.stop_ids.binary_search(&token).is_err() => {
                g.advance(token)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// A copy of the grammar's state before drafting (`None` without a grammar).
    pub(crate) fn grammar_snapshot(&self) -> Option<GrammarMatcher> {
        self.grammar.as_ref().map(GrammarMatcher::snapshot)
    }

    /// Returns the grammar to a state saved by [`Self::grammar_snapshot`] (undoes the draft
    /// advances; a rollback would fail on grammars with `max_tokens`/`stop` lexemes).
    pub(crate) fn grammar_restore(&mut self, saved: GrammarMatcher) {
        self.grammar = Some(saved);
    }

    /// Tokens emitted without sampling because the grammar forced them.
    pub fn forced_tokens(&self) -> usize {
        self.forced
    }

    /// Verifies one round of speculative drafts: `logits` holds one row per
    /// input the model ran for it — the last sampled token, then each draft
    /// (`drafts.len() + 1` rows) — and `q[j]` the distribution `drafts[j]` was
    /// drawn from (`None`: proposed deterministically, a point mass).
    ///
    /// Each row's target distribution is the one plain decoding would sample
    /// from at that position (same processing, the history up to it, the
    /// grammar's mask in the state it has there: it advances over each
    /// accepted draft, never over a rejected one), and
    /// each draft is checked by coupling with the target's own position-keyed
    /// draw for a seeded sampled request ([`crate::verify_coupled`], so its
    /// output is plain decoding's token for token), by standard rejection
    /// sampling otherwise ([`crate::verify_draft`]; greedy: exact match with
    /// the argmax). The
    /// accepted drafts, then the correction (first rejection) or the bonus
    /// token (all accepted), go through the same stop, text and `max_tokens`
    /// checks as [`Self::on_logits`], so a stop inside the accepted run ends
    /// the request exactly where plain decoding would; later rows are
    /// ignored. With no drafts this is [`Self::on_logits`] with no extra mask.
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
            let mask = self.mask(None)?;
            let (processed, p) = self
                .sampler
                .distribution(row, &self.history, mask.as_deref())?;
            let position = self.history.generated().len();
            let verdict = drafts.get(j).map(|&d| match self.sampler.coupled() {
                true => verify_coupled(&self.sampler, &p, position, d),
                false => verify_draft(&mut self.sampler, &p, q[j].as_ref(), d),
            });
            let (token, last) = match verdict {
                Some(Verdict::Accepted) => {
                    out.accepted += 1;
                    (drafts[j], false)
                }
                Some(Verdict::Rejected(t)) => (t, true),
                None => (self.sampler.draw(&p, position), true),
            };
            let logprobs = self.sampler.logprobs_of(&processed, token);
            self.fed = self.history.tokens().len();
            let step = self.emit(token, logprobs, false, tokenizer)?;
            let finished = step.finished.is_some();
            out.steps.push(step);
            if last || finished {
                break;
            }
        }
        Ok(out)
    }

    /// Records `token` as generated, advances the grammar and runs the end
    /// checks: a stop token, a stop string in the decoded text, a complete
    /// grammar, `max_tokens` (in that order, so output that completes the
    /// grammar on its last allowed token is a `Stop`, not a `Length`). The
    /// caller sets `fed` (a forced token leaves it: the model has not run
    /// the tokens before it yet).
    fn emit(
        &mut self,
        token: u32,
        logprobs: Option<Logprobs>,
        forced: bool,
        tokenizer: Option<&Tokenizer>,
    ) -> Result<Step> {
        self.grammar_advance(token)?;
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
            if self.finished.is_none() && self.grammar.as_ref().is_some_and(|g| g.is_complete()) {
                self.stop = Some(StopCause::Grammar);
                self.finished = Some(FinishReason::Stop);
                text += &self.flush(tokenizer)?;
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
            forced,
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
