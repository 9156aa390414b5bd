//! The tokens a request has seen, as the penalties need them.

use std::collections::HashMap;

/// Prompt and generated tokens of one request.
///
/// Penalties look at two different sets: the repetition penalty at the
/// prompt and output (or a window of their tail), the OpenAI presence and
/// frequency penalties at the generated tokens only. Counts of generated
/// and of all tokens are kept incrementally, so a step costs O(distinct
/// tokens), not O(context length) — prompts can be very long.
#[derive(Debug, Clone, Default)]
pub struct TokenHistory {
    tokens: Vec<u32>,
    prompt_len: usize,
    generated_counts: HashMap<u32, u32>,
    all_counts: HashMap<u32, u32>,
}

impl TokenHistory {
    /// A history that starts with `prompt`.
    pub fn new(prompt: &[u32]) -> TokenHistory {
        let mut all_counts = HashMap::new();
        for &t in prompt {
            *all_counts.entry(t).or_insert(0) += 1;
        }
        TokenHistory {
            tokens: prompt.to_vec(),
            prompt_len: prompt.len(),
            generated_counts: HashMap::new(),
            all_counts,
        }
    }

    /// Record one generated token.
    pub fn push(&mut self, token: u32) {
        self.tokens.push(token);
        *self.generated_counts.entry(token).or_insert(0) += 1;
        *self.all_counts.entry(token).or_insert(0) += 1;
    }

    /// Forget generated tokens past the first `generated` (speculative
    /// decoding rolls back rejected drafts). Prompt tokens are never removed.
    pub fn truncate_generated(&mut self, generated: usize) {
        let keep = self.prompt_len + generated;
        for &t in self.tokens.get(keep..).unwrap_or_default() {
            decrement(&mut self.generated_counts, t);
            decrement(&mut self.all_counts, t);
        }
        self.tokens.truncate(keep);
    }

    /// Prompt followed by generated tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The generated tokens.
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// How often each generated token occurs (absent = never).
    pub fn generated_counts(&self) -> &HashMap<u32, u32> {
        &self.generated_counts
    }

    /// The distinct tokens of the last `window` tokens (all when `None`),
    /// sorted: the set the repetition penalty applies to.
    pub fn recent_distinct(&self, window: Option<usize>) -> Vec<u32> {
        let mut ids = match window {
            Some(n) if n < self.tokens.len() => self.tokens[self.tokens.len() - n..].to_vec(),
            _ => self.all_counts.keys().copied().collect(),
        };
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

fn decrement(counts: &mut HashMap<u32, u32>, token: u32) {
    if let Some(c) = counts.get_mut(&token) {
        *c -= 1;
        if *c == 0 {
            counts.remove(&token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_generated_tokens() {
        let mut h = TokenHistory::new(&[5, 5, 6]);
        h.push(5);
        h.push(7);
        h.push(7);
        assert_eq!(h.generated(), [5, 7, 7]);
        assert_eq!(h.generated_counts()[&5], 1);
        assert_eq!(h.generated_counts()[&7], 2);
        assert!(!h.generated_counts().contains_key(&6));
    }

    #[test]
    fn window_selects_the_tail() {
        let mut h = TokenHistory::new(&[1, 2, 3]);
        h.push(4);
        h.push(2);
        assert_eq!(h.recent_distinct(None), [1, 2, 3, 4]);
        assert_eq!(h.recent_distinct(Some(3)), [2, 3, 4]);
        assert_eq!(h.recent_distinct(Some(0)), Vec::<u32>::new());
        assert_eq!(h.recent_distinct(Some(100)), [1, 2, 3, 4]);
    }

    #[test]
    fn truncate_rolls_back_counts() {
        let mut h = TokenHistory::new(&[1]);
        for t in [2, 3, 3] {
            h.push(t);
        }
        h.truncate_generated(1);
        assert_eq!(h.tokens(), [1, 2]);
        assert!(!h.generated_counts().contains_key(&3));
        assert_eq!(h.recent_distinct(None), [1, 2]);
        h.truncate_generated(0);
        assert_eq!(h.tokens(), [1]);
        assert!(h.generated_counts().is_empty());
        assert_eq!(h.recent_distinct(None), [1]);
    }
}
