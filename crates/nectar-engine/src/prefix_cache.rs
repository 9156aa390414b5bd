//! Conversation caches kept between requests (a server's in-memory sessions).
//!
//! When a request finishes, its caches and the tokens they hold are kept; a later request whose
//! prompt **continues** a kept conversation — it holds the kept request's whole prompt and goes
//! on past it, as the next turn of a chat does (the re-rendered assistant turn may differ from
//! what was generated; the common prefix is kept either way) — takes that cache and runs only
//! the rest. A prompt that merely shares a template prefix with a kept one, or repeats one
//! exactly, starts fresh: reuse is for continuing a conversation, where it saves a whole
//! history's prefill. (A reused prefix gives the same logits as a fresh prefill up to the
//! rounding of the attention form, as between prefill and decode; a repeated prompt gains
//! little from reuse and keeps its outputs bit-identical.)
//!
//! Entries are taken, not copied (a conversation continues once), and the oldest are dropped
//! beyond a token budget, so the memory held is bounded by what the plan reserves for contexts.

use crate::session::prefix;
use nectar_model::SeqCache;
use std::collections::VecDeque;

/// Kept conversations, newest last.
#[derive(Debug, Default)]
pub struct PrefixCache {
    /// (tokens the cache holds, the length of that request's prompt, the cache).
    entries: VecDeque<(Vec<u32>, usize, SeqCache)>,
    max_tokens: usize,
    hits: u64,
    reused_tokens: u64,
}

/// What a [`PrefixCache`] holds and has saved, for telemetry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PrefixCacheStats {
    /// Conversations kept.
    pub sessions: usize,
    /// Tokens their caches hold.
    pub tokens: usize,
    /// Requests that continued a kept conversation.
    pub hits: u64,
    /// Prompt tokens those requests did not run again.
    pub reused_tokens: u64,
}

impl PrefixCache {
    /// Keeps conversations of at most `max_tokens` tokens in all (0 keeps none).
    pub fn new(max_tokens: usize) -> PrefixCache {
        PrefixCache {
            max_tokens,
            ..Default::default()
        }
    }

    /// Keeps a finished conversation: `tokens` are those `cache` holds (one row each), the
    /// first `prompt_len` of them its request's prompt.
    pub fn put(&mut self, tokens: Vec<u32>, prompt_len: usize, mut cache: SeqCache) {
        if tokens.is_empty() || tokens.len() != cache.len() || tokens.len() > self.max_tokens {
            return;
        }
        // A kept conversation holds no VRAM: the running sequences' decode attention needs it,
        // and a reused one uploads its rows again on its first GPU step.
        cache.release_device();
        self.entries.push_back((tokens, prompt_len, cache));
        while self.held() > self.max_tokens {
            self.entries.pop_front();
        }
    }

    /// Takes the kept conversation `prompt` continues, with its cache cut to the rows the
    /// prompt keeps (at most all but the prompt's last token, which must run for the logits).
    pub fn take(&mut self, prompt: &[u32]) -> Option<SeqCache> {
        let (best, reuse) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, (t, p, _))| {
                // Continues: the kept prompt entire, then more.
                prompt.len() > *p && t.get(..*p).is_some_and(|k| prompt.starts_with(k))
            })
            .map(|(i, (t, _, c))| (i, prefix::plan(t, c.mtp.end(), prompt)))
            .max_by_key(|(i, r)| (r.main, *i))?;
        if reuse.main == 0 {
            return None;
        }
        let (_, _, mut cache) = self.entries.remove(best)?;
        cache.truncate(reuse.main);
        cache.mtp.truncate_to_position(reuse.mtp);
        self.hits += 1;
        self.reused_tokens += reuse.main as u64;
        Some(cache)
    }

    /// Tokens held.
    fn held(&self) -> usize {
        self.entries.iter().map(|(t, _, _)| t.len()).sum()
    }

    /// Telemetry.
    pub fn stats(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            sessions: self.entries.len(),
            tokens: self.held(),
            hits: self.hits,
            reused_tokens: self.reused_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(n: usize) -> SeqCache {
        let mut c = SeqCache::new(1);
        for _ in 0..n {
            c.layers[0].push(&[0.0], &[0.0], None);
        }
        c
    }

    #[test]
    fn continues_conversations_only() {
        let mut p = PrefixCache::new(100);
        // A 12-token prompt and 8 generated tokens.
        p.put((0..20).collect(), 12, cache(20));
        // Sharing only a short prefix, or repeating the prompt exactly: fresh, entry left.
        let other: Vec<u32> = (0..5).chain(50..70).collect();
        assert!(p.take(&other).is_none());
        assert!(p.take(&(0..12).collect::<Vec<_>>()).is_none());
        assert_eq!(p.stats().sessions, 1);
        // The next turn, whose re-rendered history differs after token 15: 15 rows kept.
        let next: Vec<u32> = (0..15).chain(90..99).collect();
        let c = p.take(&next).unwrap();
        assert_eq!(c.len(), 15);
        assert_eq!(
            p.stats(),
            PrefixCacheStats {
                sessions: 0,
                tokens: 0,
                hits: 1,
                reused_tokens: 15
            }
        );
    }

    #[test]
    fn the_token_budget_drops_the_oldest() {
        let mut p = PrefixCache::new(50);
        p.put((0..30).collect(), 10, cache(30));
        p.put((100..130).collect(), 10, cache(30));
        assert_eq!(p.stats().sessions, 1);
        assert!(p.take(&(0..31).collect::<Vec<_>>()).is_none());
        assert!(p.take(&(100..131).collect::<Vec<_>>()).is_some());
        // Mismatched or oversized entries are not kept.
        p.put((0..5).collect(), 2, cache(4));
        p.put((0..60).collect(), 2, cache(60));
        assert_eq!(p.stats().sessions, 0);
    }
}
