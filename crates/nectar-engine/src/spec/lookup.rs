//! Prompt-lookup drafts: the model-free provider.
//!
//! Text often repeats its own context (code edits, quotes, lists, chat
//! turns that restate the prompt). The drafter finds the most recent
//! earlier occurrence of the context's last n tokens and proposes the tokens
//! that followed it. Nothing is computed when there is no match, so a
//! round without one is a plain decoding step.

use super::drafter::{Drafter, Proposals};
use crate::error::Result;
use nectar_model::{Glm5, SeqCache};

/// The prompt-lookup (n-gram) draft provider.
#[derive(Debug, Clone)]
pub struct PromptLookup {
    ngram: usize,
}

impl PromptLookup {
    /// Matches the last `ngram` tokens (at least 1).
    pub fn new(ngram: usize) -> PromptLookup {
        PromptLookup {
            ngram: ngram.max(1),
        }
    }
}

/// The tokens (at most `max`) that followed the most recent earlier
/// occurrence of `context`'s last `ngram` tokens; empty when there is none.
pub fn lookup(context: &[u32], ngram: usize, max: usize) -> &[u32] {
    let n = ngram.max(1);
    let len = context.len();
    if len <= n || max == 0 {
        return &[];
    }
    let tail = &context[len - n..];
    (0..len - n)
        .rev()
        .find(|&i| &context[i..i + n] == tail)
        .map_or(&[], |i| &context[i + n..(i + n + max).min(len)])
}

impl Drafter for PromptLookup {
    fn name(&self) -> &'static str {
        "prompt-lookup"
    }

    fn observe(&mut self, _: &mut SeqCache, _: &[f32], _: &[u32]) -> Result<()> {
        Ok(())
    }

    fn draft(&mut self, _: &Glm5, _: &mut SeqCache, proposals: &mut Proposals<'_>) -> Result<()> {
        let found = lookup(proposals.context(), self.ngram, proposals.max()).to_vec();
        for t in found {
            proposals.push(t)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_latest_match() {
        let c = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3];
        assert_eq!(lookup(&c, 3, 2), [7, 8]);
        assert_eq!(lookup(&c, 3, 10), [7, 8, 5, 1, 2, 3]);
        assert_eq!(lookup(&c, 1, 3), [7, 8, 5]);
        assert_eq!(lookup(&c, 4, 3), Vec::<u32>::new());
    }

    #[test]
    fn overlapping_matches_and_edges() {
        assert_eq!(lookup(&[4, 4, 4], 2, 3), [4]);
        assert_eq!(lookup(&[4, 4], 2, 3), Vec::<u32>::new());
        assert_eq!(lookup(&[], 2, 3), Vec::<u32>::new());
        assert_eq!(lookup(&[1, 2, 1, 2], 2, 0), Vec::<u32>::new());
        assert_eq!(lookup(&[1, 2, 1], 0, 5), [2, 1]);
    }
}
