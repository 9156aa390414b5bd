//! The causal look-ahead of [`super::Admission::Predictive`]: a token history with an n-gram
//! index (longest earlier occurrence of the current context), the routes every layer took at
//! each history row, and per-layer expert-to-expert transition counts (row `s` → row `s + 1`).
//! Everything here is learned online from rows already processed; nothing reads ahead.
//!
//! The history holds the rows of every stream (sequence) fed to the cache, in the order they
//! arrive; each row links to its stream's previous and next rows, and a context, its
//! continuation and a transition follow those links. A server's batch interleaves the rows of
//! its sequences, which as one token stream would be no sequence's context: two route256
//! conversations decoded together cost the policy 0.09–0.12 of Belady that way
//! (`benchmarks/RESULTS.md`, "Two conversations in one batch"). One stream behaves exactly as
//! the plain history did.
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

/// No row (a link to a row that does not exist or is no longer kept).
const NONE: u64 = u64::MAX;

#[derive(Debug, Clone)]
struct Row {
    token: u32,
    /// The stream (sequence) the row belongs to.
    stream: u64,
    /// Absolute index of the same stream's previous row ([`NONE`]: none).
    prev: u64,
    /// Absolute index of the same stream's next row ([`NONE`]: none yet).
    next: u64,
    /// Per layer: the experts that layer requested for this row.
    routes: Vec<Vec<u32>>,
}

/// What the predictor knows of one stream's current row.
#[derive(Debug, Clone, Default)]
struct Stream {
    /// Absolute index of the stream's last row.
    last: u64,
    /// The current row's match: the latest earlier row ending the same context, at least two
    /// rows back along the stream (its continuation complete).
    matched: Option<u64>,
    /// Every kept occurrence of that context (latest first; `matched` is the first).
    occurrences: Vec<u64>,
    /// The context length of that match.
    matched_len: usize,
    /// Per layer: the experts of the stream's previous wave at that layer.
    prev: Vec<Option<Vec<u32>>>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Predictor {
    /// Kept rows of every stream, in arrival order; row index `base + i`.
    rows: VecDeque<Row>,
    /// Absolute index of `rows[0]`.
    base: u64,
    /// (context length, hash of the context) → absolute indices of the context's last row at
    /// its latest [`OCCURRENCES`] occurrences, latest first (`u64::MAX`: none).
    grams: HashMap<(usize, u64), [u64; OCCURRENCES]>,
    /// Streams by id.
    streams: HashMap<u64, Stream>,
    /// The streams of the current step, in the order of their first row in it, with their
    /// rows in it.
    current: Vec<(u64, usize)>,
    /// A wave was learned since the last row arrived: the next row starts a new step.
    stepped: bool,
    /// (layer, from, to) → rows whose layer requested `from` followed by a row requesting `to`.
    trans: HashMap<(u32, u32, u32), u32>,
    /// (layer, from) → rows whose layer requested `from` and that have a successor row.
    succ: HashMap<(u32, u32), u32>,
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
        self.base + self.rows.len() as u64
    }

    /// The kept row at absolute index `abs`.
    fn row(&self, abs: u64) -> Option<&Row> {
        abs.checked_sub(self.base)
            .and_then(|i| self.rows.get(i as usize))
    }

    /// The row `back` rows before `abs` along its stream, if kept.
    fn back(&self, mut abs: u64, back: usize) -> Option<u64> {
        for _ in 0..back {
            abs = self.row(abs)?.prev;
        }
        self.row(abs).map(|_| abs)
    }

    /// The `n` tokens of the stream ending at row `last`, oldest first, if all are kept.
    fn tokens(&self, last: u64, n: usize) -> Option<Vec<u32>> {
        let mut out = Vec::with_capacity(n);
        let mut r = last;
        for i in 0..n {
            let row = self.row(r)?;
            out.push(row.token);
            if i + 1 < n {
                r = row.prev;
            }
        }
        out.reverse();
        Some(out)
    }

    /// The hash of the `n` tokens ending at row `last`, if all are kept.
    fn context(&self, last: u64, n: usize) -> Option<u64> {
        self.tokens(last, n).map(|t| hash(t.into_iter()))
    }

    /// A new row of `stream` for `token` (the token this step feeds the model for it).
    pub(crate) fn observe_token(&mut self, stream: u64, token: u32) {
        if std::mem::take(&mut self.stepped) {
            self.current.clear();
        }
        match self.current.iter_mut().find(|(id, _)| *id == stream) {
            Some((_, n)) => *n += 1,
            None => self.current.push((stream, 1)),
        }
        let t = self.end();
        let prev = self
            .streams
            .get(&stream)
            .map(|s| s.last)
            .filter(|&p| self.row(p).is_some())
            .unwrap_or(NONE);
        // Contexts ending two rows back along the stream become visible: their continuation
        // (the stream's previous row) is complete.
        if let Some(q) = self.row(prev).map(|r| r.prev).filter(|&q| q != NONE) {
            for n in NGRAMS {
                if let Some(h) = self.context(q, n) {
                    let ps = self.grams.entry((n, h)).or_insert([u64::MAX; OCCURRENCES]);
                    ps.copy_within(0..OCCURRENCES - 1, 1);
                    ps[0] = q;
                }
            }
        }
        if prev != NONE {
            self.rows[(prev - self.base) as usize].next = t;
        }
        self.rows.push_back(Row {
            token,
            stream,
            prev,
            next: NONE,
            routes: Vec::new(),
        });
        let (mut occurrences, mut matched_len) = (Vec::new(), 0);
        for n in NGRAMS {
            let Some(cur) = self.tokens(t, n) else {
                continue;
            };
            let Some(&ps) = self.grams.get(&(n, hash(cur.iter().copied()))) else {
                continue;
            };
            // Verify (hash collisions) and that the context is kept.
            for p in ps {
                if p != u64::MAX && self.tokens(p, n).as_ref() == Some(&cur) {
                    occurrences.push(p);
                }
            }
            if !occurrences.is_empty() {
                matched_len = n;
                break;
            }
        }
        let s = self.streams.entry(stream).or_default();
        s.last = t;
        s.matched = occurrences.first().copied();
        s.occurrences = occurrences;
        s.matched_len = matched_len;
        while self.rows.len() > HISTORY {
            self.rows.pop_front();
            self.base += 1;
        }
        if self.grams.len() > 4 * NGRAMS.len() * HISTORY {
            let base = self.base;
            self.grams.retain(|_, p| p[0] >= base);
        }
        // Streams with no row left are dropped once per turnover of the history (a scan at
        // every row would cost a server of many sequences a pass over all of them per token).
        if self.base > 0 && self.base.is_multiple_of(HISTORY as u64) {
            let base = self.base;
            self.streams.retain(|_, s| s.last >= base);
        }
    }

    /// The stream of row `abs`, if kept.
    fn stream_of(&self, abs: u64) -> Option<u64> {
        self.row(abs).map(|r| r.stream)
    }

    /// `layer`'s wave of the current row requested `cur`: learn the transitions from the
    /// stream's previous wave and record the row.
    pub(crate) fn learn(&mut self, layer: usize, cur: &[u32]) {
        self.stepped = true;
        let t = self.end().wrapping_sub(1);
        let stream = self.stream_of(t);
        self.learn_transition(stream, layer, cur);
        if let Some(row) = self.rows.back_mut() {
            if row.routes.len() <= layer {
                row.routes.resize(layer + 1, Vec::new());
            }
            row.routes[layer] = cur.to_vec();
        }
    }

    /// `layer`'s routes of the last `rows.len()` rows (one step of several tokens), in row
    /// order: each learns the transition from its stream's row before it and is recorded as
    /// its row's.
    pub(crate) fn learn_rows(&mut self, layer: usize, rows: &[Vec<u32>]) {
        self.stepped = true;
        let kept = self.rows.len();
        let first = kept.saturating_sub(rows.len());
        let skip = rows.len().saturating_sub(kept);
        // Rows older than the history (a prompt longer than it) are the first kept row's.
        let first_stream = self.stream_of(self.base + first as u64);
        for (i, r) in rows.iter().enumerate() {
            let stream = match i >= skip {
                true => self.stream_of(self.base + (first + i - skip) as u64),
                false => first_stream,
            };
            self.learn_transition(stream, layer, r);
            if i >= skip {
                let row = &mut self.rows[first + i - skip];
                if row.routes.len() <= layer {
                    row.routes.resize(layer + 1, Vec::new());
                }
                row.routes[layer] = r.clone();
            }
        }
    }

    /// Counts the transitions from `layer`'s previous routes in `stream` to `cur`, which become
    /// previous.
    fn learn_transition(&mut self, stream: Option<u64>, layer: usize, cur: &[u32]) {
        let l = layer as u32;
        let Some(s) = stream.and_then(|id| self.streams.get_mut(&id)) else {
            return;
        };
        if s.prev.len() <= layer {
            s.prev.resize(layer + 1, None);
        }
        if let Some(prev) = &s.prev[layer] {
            for &a in prev {
                *self.succ.entry((l, a)).or_insert(0) += 1;
                for &b in cur {
                    *self.trans.entry((l, a, b)).or_insert(0) += 1;
                }
            }
        }
        s.prev[layer] = Some(cur.to_vec());
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

    /// Summed over the current step's streams s, the mean over the current row t_s's matched
    /// occurrences p of Σ_{k=1..HORIZON} GAMMA^(k-1) · [expert ∈ routes(p_k, layer)], where p_k
    /// is the k-th row after p along p's stream, before t_s (0 without a match).
    pub(crate) fn lookahead(&self, layer: usize, expert: u32) -> f64 {
        let mut value = 0.0;
        for s in self
            .current
            .iter()
            .filter_map(|(id, _)| self.streams.get(id))
        {
            if s.occurrences.is_empty() {
                continue;
            }
            let mut total = 0.0;
            for &p in &s.occurrences {
                let (mut sum, mut w) = (0.0, 1.0);
                let mut r = self.row(p).map_or(NONE, |x| x.next);
                for _ in 0..HORIZON {
                    if r == NONE || r >= s.last {
                        break;
                    }
                    let Some(row) = self.row(r) else { break };
                    if row.routes.get(layer).is_some_and(|x| x.contains(&expert)) {
                        sum += w;
                    }
                    w *= GAMMA;
                    r = row.next;
                }
                total += sum;
            }
            value += total / s.occurrences.len() as f64;
        }
        value
    }

    /// For each row of the current step, along its stream: the routes `layer` took at the row
    /// as many rows before its stream's match as the row is before the stream's current row,
    /// and that match's context length shortened as much — the same context, so the best guess
    /// of what the row will request. Rows without a match, whose row is no longer kept or was
    /// never recorded at `layer`, are left out; each stream's rows in row order, at most
    /// `rows` of them (the step's).
    pub(crate) fn step_routes(&self, layer: usize, rows: usize) -> Vec<(&[u32], usize)> {
        let mut out = Vec::new();
        for (s, n) in self
            .current
            .iter()
            .filter_map(|(id, n)| Some((self.streams.get(id)?, *n)))
        {
            let rows = n.min(rows);
            let Some(m) = s.matched else { continue };
            for back in (0..rows).rev().filter(|&b| b < s.matched_len) {
                let Some(r) = self
                    .back(m, back)
                    .and_then(|p| self.row(p)?.routes.get(layer))
                else {
                    continue;
                };
                if !r.is_empty() {
                    out.push((r.as_slice(), s.matched_len - back));
                }
            }
        }
        out
    }

    /// Each current stream's routes at `layer` for its current row, where recorded.
    pub(crate) fn current_routes(&self, layer: usize) -> Vec<&[u32]> {
        self.current
            .iter()
            .filter_map(|(id, _)| self.streams.get(id))
            .filter_map(|s| self.row(s.last)?.routes.get(layer))
            .filter(|r| !r.is_empty())
            .map(Vec::as_slice)
            .collect()
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
            bulk.observe_token(0, t);
        }
        bulk.learn_rows(0, &[vec![1], vec![2], vec![3]]);
        // The same rows fed one per step.
        let mut single = Predictor::default();
        for (t, r) in [(7, 1), (8, 2), (9, 3)] {
            single.observe_token(0, t);
            single.learn(0, &[r]);
        }
        for p in [&mut bulk, &mut single] {
            p.observe_token(0, 7);
            p.learn(0, &[1]);
            p.observe_token(0, 8);
        }
        for p in [&bulk, &single] {
            let rows: Vec<Vec<u32>> = p.rows.iter().take(4).map(|r| r.routes[0].clone()).collect();
            assert_eq!(rows, [vec![1], vec![2], vec![3], vec![1]]);
            assert_eq!(p.transition(0, &[1], 2), (1.0, 1.0));
            assert_eq!(p.transition(0, &[2], 3), (1.0, 1.0));
            // Context "7 8" occurred before: what followed it (row 2 requested expert 3).
            assert!(p.lookahead(0, 3) > 0.0 && p.lookahead(0, 9) == 0.0);
        }
        // The transition table is bounded: past the cap every count halves.
        let mut big = Predictor::default();
        for i in 0..(TRANSITIONS / 64 + 2) as u32 {
            big.observe_token(0, i);
            big.learn(0, &(0..8).map(|j| (i * 8 + j) % 65_536).collect::<Vec<_>>());
        }
        assert!(big.trans.len() <= TRANSITIONS);
        // More rows than kept tokens: only the last ones are recorded, none out of range.
        let mut short = Predictor::default();
        short.observe_token(0, 1);
        short.learn_rows(0, &[vec![4], vec![5]]);
        assert_eq!(short.rows[0].routes[0], vec![5]);
    }

    #[test]
    fn ended_streams_are_dropped_without_a_scan_at_every_row() {
        // 100 sequences at once, each a token a step: all live, none dropped.
        let mut p = Predictor::default();
        for step in 0..4u32 {
            for s in 0..100u64 {
                p.observe_token(s, step);
            }
        }
        assert_eq!(p.streams.len(), 100);
        // A live stream keeps its rows linked along it: its context "1 2 3" is found.
        assert_eq!(p.tokens(p.streams[&7].last, 3), Some(vec![1, 2, 3]));
        // One other sequence pushes every row of theirs out of the history: they are ended,
        // but kept until the history's turnover, not dropped by a scan at the next row.
        for i in 0..HISTORY as u32 {
            p.observe_token(1_000, i);
        }
        assert_eq!(p.streams.values().filter(|s| s.last < p.base).count(), 100);
        for i in 0..HISTORY as u32 {
            p.observe_token(1_000, i);
        }
        // The turnover dropped them.
        assert_eq!(p.streams.keys().collect::<Vec<_>>(), [&1_000]);
    }

    #[test]
    fn interleaved_streams_keep_their_own_contexts() {
        // Stream 1 decodes 7 8 9 7 8 (routes 1 2 3 1 …) alone, and again in steps that batch
        // it with stream 2 (other tokens and routes); and, as one history would see the batch,
        // with both in a single stream.
        let a = [(7, 1), (8, 2), (9, 3), (7, 1)];
        let (mut alone, mut mixed, mut flat) = (
            Predictor::default(),
            Predictor::default(),
            Predictor::default(),
        );
        for (i, &(t, e)) in a.iter().enumerate() {
            let other = (100 + i as u32, 50 + i as u32);
            alone.observe_token(1, t);
            alone.learn(0, &[e]);
            mixed.observe_token(1, t);
            mixed.observe_token(2, other.0);
            mixed.learn_rows(0, &[vec![e], vec![other.1]]);
            flat.observe_token(0, t);
            flat.observe_token(0, other.0);
            flat.learn_rows(0, &[vec![e], vec![other.1]]);
        }
        alone.observe_token(1, 8);
        mixed.observe_token(1, 8);
        mixed.observe_token(2, 104);
        flat.observe_token(0, 8);
        flat.observe_token(0, 104);
        // "7 8" occurred before along stream 1: what followed it (expert 3) is predicted, and
        // the transitions are stream 1's own (1 → 2 once).
        for p in [&alone, &mixed] {
            assert!(p.lookahead(0, 3) > 0.0 && p.lookahead(0, 50) == 0.0);
            assert_eq!(p.lookahead(0, 3), alone.lookahead(0, 3));
            assert_eq!(p.transition(0, &[1], 2), (1.0, 1.0));
        }
        assert_eq!(mixed.transition(0, &[50], 51), (1.0, 1.0));
        // One history for both: no context repeats, and 1 is followed by 50, not 2.
        assert_eq!(flat.lookahead(0, 3), 0.0);
        assert_eq!(flat.transition(0, &[1], 2), (0.0, 2.0));
        // The look-ahead plan: stream 1's match (the earlier "8", which requested expert 2),
        // alone or in the batch; one history plans nothing.
        assert_eq!(alone.step_routes(0, 2), vec![(&[2][..], 2)]);
        assert_eq!(mixed.step_routes(0, 2), alone.step_routes(0, 2));
        assert!(flat.step_routes(0, 2).is_empty());
        // Each stream's current routes, once recorded.
        mixed.learn_rows(0, &[vec![2], vec![54]]);
        assert_eq!(mixed.current_routes(0), vec![&[2][..], &[54][..]]);
    }
}
