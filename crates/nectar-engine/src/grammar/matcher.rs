//! One request's grammar state.

use crate::error::{Error, Result};
use llguidance::{Matcher, TokenParser};

/// A compiled grammar following one request's output: which ids may come
/// next, advancing over chosen tokens, rolling back rejected drafts.
///
/// Stop tokens are never consumed: the request ends on them, and the
/// grammar only says whether they are allowed (when it is accepting).
#[derive(Clone)]
pub struct GrammarMatcher {
    inner: Matcher,
    vocab_size: usize,
    /// The request parameter the grammar came from, for messages.
    param: &'static str,
}

impl std::fmt::Debug for GrammarMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarMatcher")
            .field("param", &self.param)
            .field("complete", &self.is_complete())
            .finish_non_exhaustive()
    }
}

impl GrammarMatcher {
    /// An independent copy of the parser state, to return to after drafting: llguidance cannot
    /// roll back grammars with `max_tokens`/`stop` lexemes (forced tool calls have them).
    pub(crate) fn snapshot(&self) -> GrammarMatcher {
        GrammarMatcher {
            inner: self.inner.deep_clone(),
            vocab_size: self.vocab_size,
            param: self.param,
        }
    }

    pub(crate) fn new(
        parser: TokenParser,
        vocab_size: usize,
        param: &'static str,
    ) -> Result<GrammarMatcher> {
        let m = GrammarMatcher {
            inner: Matcher::new(Ok(parser)),
            vocab_size,
            param,
        };
        match m.inner.get_error() {
            Some(reason) => Err(Error::InvalidParam { param, reason }),
            None => Ok(m),
        }
    }

    fn fail(&self, what: &str, e: impl std::fmt::Display) -> Error {
        Error::Grammar(format!("{} grammar: {what}: {e}", self.param))
    }

    /// The ids allowed next, one entry per vocabulary id. A complete
    /// grammar allows only the eos set.
    pub fn mask(&mut self) -> Result<Vec<bool>> {
        let vob = self
            .inner
            .compute_mask_or_eos()
            .map_err(|e| self.fail("computing the mask", e))?;
        let mut mask = vec![false; self.vocab_size];
        vob.iter_set_entries(|i| {
            if let Some(m) = mask.get_mut(i) {
                *m = true;
            }
        });
        Ok(mask)
    }

    /// Whether the grammar could end here (it allows the eos set).
    pub fn is_accepting(&mut self) -> Result<bool> {
        self.inner
            .is_accepting()
            .map_err(|e| self.fail("checking for the end", e))
    }

    /// Whether `token` (not a stop token) may come next.
    pub fn allows(&mut self, token: u32) -> Result<bool> {
        let n = self
            .inner
            .validate_tokens(&[token])
            .map_err(|e| self.fail("validating a token", e))?;
        Ok(n == 1)
    }

    /// Advances over `token` (not a stop token); a token the grammar does
    /// not allow is an error, not a silent skip.
    pub fn advance(&mut self, token: u32) -> Result<()> {
        self.inner
            .consume_token(token)
            .map_err(|e| self.fail(&format!("token {token}"), e))
    }

    /// Undoes the last `n` advances.
    pub fn rollback(&mut self, n: usize) -> Result<()> {
        self.inner
            .rollback(n)
            .map_err(|e| self.fail("rolling back", e))
    }

    /// The tokens the grammar forces next, in order (empty when the next
    /// token is a real choice). Does not advance.
    pub fn forced(&mut self) -> Result<Vec<u32>> {
        let ff = self.inner.compute_ff_tokens();
        match self.inner.get_error() {
            Some(e) => Err(self.fail("computing forced tokens", e)),
            None => Ok(ff),
        }
    }

    /// True when the grammar is complete and allows nothing but the end of
    /// the output.
    pub fn is_complete(&self) -> bool {
        self.inner.is_stopped() && !self.inner.is_error()
    }
}
