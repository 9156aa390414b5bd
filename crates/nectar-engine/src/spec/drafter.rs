//! The draft provider interface and the proposals a drafter fills.

use crate::error::{Error, Result};
use crate::request_state::RequestState;
use crate::sampler::Distribution;
use nectar_model::{Glm5, SeqCache};

/// A source of draft tokens for one request. Exactly one drafter owns a
/// request for its whole life; the driver ([`crate::Batch`]) asks it for
/// drafts, verifies them with the main model and tells it which rows were
/// kept. Implementations: [`crate::PromptLookup`] (n-gram matches in the
/// context) and any drafter a caller brings ([`crate::RowOptions::drafter`]).
/// The model's own MTP head ([`crate::MtpDrafter`]) is not one: its rows draft
/// together in one MTP forward per depth, which a per-row trait cannot do.
pub trait Drafter {
    /// Short name for telemetry (`"mtp"`, `"prompt-lookup"`).
    fn name(&self) -> &'static str;

    /// The main model verified these rows and kept them: for each kept row,
    /// its post-final-norm hidden (`rows × hidden`) and the token that
    /// follows it. Called once after the prefill (every prompt row; the last
    /// row's next token is the first generated one) and after every round
    /// (the accepted drafts' rows after the round's first row, whose next
    /// token is the correction or bonus). The drafter drops whatever
    /// speculative state it built while drafting the round.
    fn observe(&mut self, cache: &mut SeqCache, hidden: &[f32], next: &[u32]) -> Result<()>;

    /// Proposes up to `proposals.max()` tokens to follow
    /// `proposals.context()`, each through [`Proposals::sample`] or
    /// [`Proposals::push`]. Proposing fewer, or none, is allowed.
    fn draft(
        &mut self,
        model: &Glm5,
        cache: &mut SeqCache,
        proposals: &mut Proposals<'_>,
    ) -> Result<()>;
}

/// The drafts of one round, as a drafter proposes them.
///
/// Proposed tokens join the request's history while the round is drafted,
/// so a draft distribution sees the same penalties plain decoding would at
/// that position; the history is restored when the proposals are dropped.
///
/// With structured output the request's grammar follows the drafts the
/// same way: a sampled draft is drawn under the grammar's mask (so its
/// distribution matches the masked target's support), a pushed draft the
/// grammar rejects ends the round's drafts (it and every later push are
/// dropped), and the grammar is rolled back with the history.
#[derive(Debug)]
pub struct Proposals<'a> {
    state: &'a mut RequestState,
    /// Generated tokens before the round (what the history returns to).
    generated: usize,
    max: usize,
    tokens: Vec<u32>,
    q: Vec<Option<Distribution>>,
    /// Grammar advances made while drafting (what the drop undoes).
    advanced: usize,
    /// The grammar's state before the round (restored on drop when it advanced).
    saved: Option<crate::grammar::GrammarMatcher>,
    /// A pushed draft was rejected by the grammar: nothing more is taken.
    closed: bool,
}

impl<'a> Proposals<'a> {
    /// Room for `max` drafts after the request's current tokens.
    pub(crate) fn new(state: &'a mut RequestState, max: usize) -> Proposals<'a> {
        let generated = state.budget().0;
        let saved = state.grammar_snapshot();
        Proposals {
            saved,
            state,
            generated,
            max,
            tokens: Vec::with_capacity(max),
            q: Vec::with_capacity(max),
            advanced: 0,
            closed: false,
        }
    }

    /// The most drafts this round may have (once the grammar rejected a
    /// pushed draft, the drafts already taken).
    pub fn max(&self) -> usize {
        if self.closed {
            self.tokens.len()
        } else {
            self.max
        }
    }

    /// Drafts proposed so far.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True before the first draft.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Prompt, output so far, then the drafts proposed so far.
    pub fn context(&self) -> &[u32] {
        self.state.history().tokens()
    }

    /// Proposes a draft drawn from `logits` (one row over the vocabulary)
    /// with the request's own sampling (bias, penalties, temperature,
    /// truncation, the grammar's mask; the argmax when greedy) and the noise
    /// of the draft's output position — the noise the target's draw there
    /// uses, so a draft distribution close to the target's proposes the
    /// target's token (Gumbel coupling); the distribution is kept for the
    /// rejection test of unseeded requests.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32> {
        self.room()?;
        let mask = self.state.mask(None)?;
        let (history, sampler) = self.state.draft_parts();
        let (_, dist) = sampler.distribution(logits, history, mask.as_deref())?;
        let token = sampler.draw(&dist, history.generated().len());
        history.push(token);
        self.advanced += usize::from(self.state.grammar_advance(token)?);
        self.tokens.push(token);
        self.q.push(Some(dist));
        Ok(token)
    }

    /// Proposes `token` deterministically (a point-mass draft distribution).
    /// A token the request's grammar does not allow here is dropped and
    /// ends the round's drafts (verification would reject it anyway).
    pub fn push(&mut self, token: u32) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.room()?;
        let vocab = self.state.sampler().vocab_size();
        if token as usize >= vocab {
            return Err(Error::Speculation(format!(
                "drafted token {token} is outside the vocabulary of {vocab}"
            )));
        }
        if !self.state.grammar_allows(token)? {
            self.closed = true;
            return Ok(());
        }
        self.advanced += usize::from(self.state.grammar_advance(token)?);
        self.state.draft_parts().0.push(token);
        self.tokens.push(token);
        self.q.push(None);
        Ok(())
    }

    /// The drafts and their distributions; the history is restored.
    pub(crate) fn finish(mut self) -> (Vec<u32>, Vec<Option<Distribution>>) {
        (
            std::mem::take(&mut self.tokens),
            std::mem::take(&mut self.q),
        )
    }

    fn room(&self) -> Result<()> {
        if self.tokens.len() >= self.max {
            return Err(Error::Speculation(format!(
                "the drafter proposed more than the {} drafts allowed this round",
                self.max
            )));
        }
        Ok(())
    }
}

impl Drop for Proposals<'_> {
    fn drop(&mut self) {
        let generated = self.generated;
        self.state.draft_parts().0.truncate_generated(generated);
        if let (true, Some(g)) = (self.advanced > 0, self.saved.take()) {
            self.state.grammar_restore(g);
        }
    }
}
