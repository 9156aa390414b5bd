//! The causal look-ahead of [`super::Admission::Predictive`]: a token history with an n-gram
//! index (longest earlier occurrence of the current context), the routes every layer took at
//! each history row, and per-layer expert-to-expert transition counts (row `s` → row `s + 1`).
//! Everything here is learned online from rows already processed; nothing reads ahead.
use foldhash::HashMap;
use std::collections::VecDeque;

/// Context lengths tried for a match, longest first.
pub(crate) const NGRAMS: [usize; 6] = [32, 16, 8, 4, 2, 1];
/// Rows of look-ahead read from a match's continuation.
pub(crate) const HORIZON: u64 = 16;
/// Discount per row of look-ahead.
pub(crate) const GAMMA: f64 = 0.8;
/// Earlier occurrences of a context whose continuations the look-ahead averages (the latest
/// ones). One occurrence of a short context is a noisy guess of what follows; held out on half
/// of route256's conversations, averaging the 4 latest kept 0.003–0.005 more of Belady on
/// sampled decode and fresh prose and lost nothing on greedy decode (`benchmarks/policy-research/`).
pub(crate) const OCCURRENCES: usize = 4;
/// Rows of history kept (tokens and routes); older matches are forgotten.
pub(crate) const HISTORY: usize = 8192;
/// Transition counts kept at most (all layers): past it every count halves and zeros leave, so
/// the table stays within ~25 MB (GLM-5.2 could otherwise reach 75 × 256² pairs, ~120 MB
/// outside the memory plan) while recent transitions keep their weight.
pub(crate) const TRANSITIONS: usize = 1 << 20;

#[derive(Debug, Clone, Default)]
pub(crate) struct Predictor {
    /// Token of each kept row; row index `base + i`.
    tokens: VecDeque<u32>,
    /// Per kept row, per layer: the experts that layer requested for that row.
    rows: VecDeque<Vec<Vec<u32>>>,
    /// Absolute index of `tokens[0]`.
    base: u64,
    /// (context length, hash of the context) → absolute indices of the context's last row at
    /// its latest [`OCCURRENCES`] occurrences, latest first (`u64::MAX`: none).
    grams: HashMap<(usize, u64), [u64; OCCURRENCES]>,
    /// The current row's match: the latest earlier row `p <= t - 2` ending the same context.
    matched: Option<u64>,
    /// Every kept occurrence of that context (latest first; `matched` is the first).
    occurrences: Vec<u64>,
    /// The context length of that match (tokens equal up to and including `p` and `t`).
    matched_len: usize,
    /// (layer, from, to) → rows whose layer requested `from` followed by a row requesting `to`.
    trans: HashMap<(u32, u32, u32), u32>,
    /// (layer, from) → rows whose layer requested `from` and that have a successor row.
    succ: HashMap<(u32, u32), u32>,
    /// Per layer: the experts of the layer's previous wave.
    prev: Vec<Option<Vec<u32>>>,
}

fn hash(tokens: impl Iterator<Item = u32>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for t in tokens {
        h ^= t as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
        h ^= h >> 29;
    }
    h
}

impl Predictor {
    fn end(&self) -> u64 {
        self.base + self.tokens.len() as u64
    }

    fn token(&self, abs: u64) -> u32 {
        self.tokens[(abs - self.base) as usize]
    }

    /// `n` tokens ending at absolute row `last`, if all are kept.
    fn context(&self, last: u64, n: usize) -> Option<u64> {
        let first = (last + 1).checked_sub(n as u64)?;
        (first >= self.base && last < self.end())
            .then(|| hash((first..=last).map(|i| self.token(i))))
    }

    /// A new row for `token` (the token this step feeds the model).
    pub(crate) fn observe_token(&mut self, token: u32) {
        let t = self.end();
        // Contexts ending at t - 2 become visible: their continuation (t - 1) is complete.
        if let Some(q) = t.checked_sub(2) {
            for n in NGRAMS {
                if let Some(h) = self.context(q, n) {
                    let ps = self.grams.entry((n, h)).or_insert([u64::MAX; OCCURRENCES]);
                    ps.copy_within(0..OCCURRENCES - 1, 1);
                    ps[0] = q;
                }
            }
        }
        self.tokens.push_back(token);
        self.rows.push_back(Vec::new());
        self.matched = None;
        self.occurrences.clear();
        for n in NGRAMS {
            let Some(h) = self.context(t, n) else {
                continue;
            };
            let Some(&ps) = self.grams.get(&(n, h)) else {
                continue;
            };
            // Verify (hash collisions) and that the context and its continuation are kept.
            for p in ps {
                if p == u64::MAX || p + 1 < self.base + n as u64 {
                    continue;
                }
                if (0..n as u64).all(|i| self.token(p - i) == self.token(t - i)) {
                    self.occurrences.push(p);
                }
            }
            if let Some(&p) = self.occurrences.first() {
                self.matched = Some(p);
                self.matched_len = n;
                break;
            }
        }
        while self.tokens.len() > HISTORY {
            self.tokens.pop_front();
            self.rows.pop_front();
            self.base += 1;
        }
        if self.grams.len() > 4 * NGRAMS.len() * HISTORY {
            let base = self.base;
            self.grams.retain(|_, p| p[0] >= base);
        }
    }

    /// `layer`'s wave of the current row requested `cur`: learn the transitions from the
    /// layer's previous wave and record the row.
    pub(crate) fn learn(&mut self, layer: usize, cur: &[u32]) {
        self.learn_transition(layer, cur);
        if let Some(row) = self.rows.back_mut() {
            if row.len() <= layer {
                row.resize(layer + 1, Vec::new());
            }
            row[layer] = cur.to_vec();
        }
    }

    /// `layer`'s routes of the last `rows.len()` rows (one step of several tokens), in row
    /// order: each learns the transition from the row before it and is recorded as its row's.
    pub(crate) fn learn_rows(&mut self, layer: usize, rows: &[Vec<u32>]) {
        let kept = self.rows.len();
        let first = kept.saturating_sub(rows.len());
        let skip = rows.len().saturating_sub(kept);
        for (i, r) in rows.iter().enumerate() {
            self.learn_transition(layer, r);
            if i >= skip {
                let row = &mut self.rows[first + i - skip];
                if row.len() <= layer {
                    row.resize(layer + 1, Vec::new());
                }
                row[layer] = r.clone();
            }
        }
    }

    /// Counts the transitions from `layer`'s previous routes to `cur`, which become previous.
    fn learn_transition(&mut self, layer: usize, cur: &[u32]) {
        let l = layer as u32;
        if self.prev.len() <= layer {
            self.prev.resize(layer + 1, None);
        }
        if let Some(prev) = &self.prev[layer] {
            for &a in prev {
                *self.succ.entry((l, a)).or_insert(0) += 1;
                for &b in cur {
                    *self.trans.entry((l, a, b)).or_insert(0) += 1;
                }
            }
        }
        self.prev[layer] = Some(cur.to_vec());
        if self.trans.len() > TRANSITIONS {
            self.trans.retain(|_, n| {
                *n /= 2;
                *n > 0
            });
            self.succ.retain(|_, n| {
                *n /= 2;
                *n > 0
            });
        }
    }

    /// The mean over the current row t's matched occurrences p of
    /// Σ_{k=1..min(HORIZON, t-1-p)} GAMMA^(k-1) · [expert ∈ routes(p + k, layer)] (0 without a
    /// match).
    pub(crate) fn lookahead(&self, layer: usize, expert: u32) -> f64 {
        if self.occurrences.is_empty() {
            return 0.0;
        }
        let t = self.end() - 1;
        let mut total = 0.0;
        for &p in &self.occurrences {
            let last = (t - 1).min(p + HORIZON);
            let (mut sum, mut w) = (0.0, 1.0);
            for r in p + 1..=last {
                if r >= self.base {
                    let row = &self.rows[(r - self.base) as usize];
                    if row.get(layer).is_some_and(|x| x.contains(&expert)) {
                        sum += w;
                    }
                }
                w *= GAMMA;
            }
            total += sum;
        }
        total / self.occurrences.len() as f64
    }

    /// The routes `layer` took at the row `back` rows before the current row's match, and the
    /// match's context length: the same context as `back` rows before the current row (up to
    /// `back` tokens shorter), so the best guess of what that row will request. `None` without
    /// a match, or when that row is no longer kept or was never recorded at `layer`.
    pub(crate) fn matched_routes(&self, layer: usize, back: usize) -> Option<(&[u32], usize)> {
        let p = self.matched?.checked_sub(back as u64)?;
        if p < self.base || self.matched_len <= back {
            return None;
        }
        let row = self.rows.get((p - self.base) as usize)?;
        let r = row.get(layer)?;
        (!r.is_empty()).then_some((r.as_slice(), self.matched_len - back))
    }

    /// (Σ_{a ∈ cur} N(a → expert), Σ_{a ∈ cur} n(a)) for `layer`.
    pub(crate) fn transition(&self, layer: usize, cur: &[u32], expert: u32) -> (f64, f64) {
        let l = layer as u32;
        let mut num = 0u64;
        let mut den = 0u64;
        for &a in cur {
            num += self.trans.get(&(l, a, expert)).copied().unwrap_or(0) as u64;
            den += self.succ.get(&(l, a)).copied().unwrap_or(0) as u64;
        }
        (num as f64, den as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multi_row_step_is_learned_row_by_row() {
        // Tokens 7 8 9 7 8 fed as one step of three rows, then two single rows.
        let mut bulk = Predictor::default();
        for t in [7, 8, 9] {
            bulk.observe_token(t);
        }
        bulk.learn_rows(0, &[vec![1], vec![2], vec![3]]);
        // The same rows fed one per step.
        let mut single = Predictor::default();
        for (t, r) in [(7, 1), (8, 2), (9, 3)] {
            single.observe_token(t);
            single.learn(0, &[r]);
        }
        for p in [&mut bulk, &mut single] {
            p.observe_token(7);
            p.learn(0, &[1]);
            p.observe_token(8);
        }
        for p in [&bulk, &single] {
            let rows: Vec<Vec<u32>> = p.rows.iter().take(4).map(|r| r[0].clone()).collect();
            assert_eq!(rows, [vec![1], vec![2], vec![3], vec![1]]);
            assert_eq!(p.transition(0, &[1], 2), (1.0, 1.0));
            assert_eq!(p.transition(0, &[2], 3), (1.0, 1.0));
            // Context "7 8" occurred before: what followed it (row 2 requested expert 3).
            assert!(p.lookahead(0, 3) > 0.0 && p.lookahead(0, 9) == 0.0);
        }
        // The transition table is bounded: past the cap every count halves.
        let mut big = Predictor::default();
        for i in 0..(TRANSITIONS / 64 + 2) as u32 {
            big.observe_token(i);
            big.learn(0, &(0..8).map(|j| (i * 8 + j) % 65_536).collect::<Vec<_>>());
        }
        assert!(big.trans.len() <= TRANSITIONS);
        // More rows than kept tokens: only the last ones are recorded, none out of range.
        let mut short = Predictor::default();
        short.observe_token(1);
        short.learn_rows(0, &[vec![4], vec![5]]);
        assert_eq!(short.rows[0][0], vec![5]);
    }
}
