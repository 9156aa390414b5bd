//! Next-layer expert prediction ("PILOT", after Colibri): before layer L's MLP, route layer
//! L+1 from layer L's post-attention residual — layer L+1's own `post_attention_layernorm` and
//! router applied to the state L+1 will mostly see — and, when experts are streamed, start
//! reading the predicted experts so their I/O overlaps layer L's expert compute and layer L+1's
//! attention.
//!
//! The prediction never changes the model's function: layer L+1 still routes from its real
//! input, and a predicted expert it does not choose is only a wasted read (the residency
//! manager drops it without evicting anything). Colibri measured 71.6 % recall for this
//! predictor on GLM-5.2; [`PilotStats`] measures it here, and `Measure` mode does so without
//! issuing a read.

use serde::Serialize;

/// Whether and how the forward pass predicts the next layer's experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Prefetch {
    /// No prediction (the default: no extra compute).
    #[default]
    Off,
    /// Predict and count recall; read nothing.
    Measure,
    /// Predict, count recall, and prefetch the predicted experts when they are streamed.
    Pilot,
    /// No router run early: the expert cache's own look-ahead (predictive admission) reads each
    /// step's predicted misses before their layers run, into spare working slots
    /// (`nectar_residency`'s `policy/lookahead.rs`).
    Lookahead,
    /// Both: look-ahead reads what repeated token contexts predict for every layer, and PILOT
    /// what the next layer's router predicts from the current state, into its own slots. The
    /// two fill the same idle disk (reads ahead run one at a time, after a layer's own reads).
    Both,
}

impl Prefetch {
    /// Parses `off`, `measure`, `pilot`, `lookahead` or `both`.
    pub fn parse(s: &str) -> Option<Prefetch> {
        match s {
            "off" => Some(Prefetch::Off),
            "measure" => Some(Prefetch::Measure),
            "pilot" => Some(Prefetch::Pilot),
            "lookahead" => Some(Prefetch::Lookahead),
            "both" => Some(Prefetch::Both),
            _ => None,
        }
    }

    /// Whether the forward pass runs the next layer's router early (`measure`, `pilot`, `both`).
    pub fn runs_router_early(self) -> bool {
        matches!(self, Prefetch::Measure | Prefetch::Pilot | Prefetch::Both)
    }

    /// Whether the next layer's predicted experts are read ahead (`pilot`, `both`).
    pub fn reads_predicted_layer(self) -> bool {
        matches!(self, Prefetch::Pilot | Prefetch::Both)
    }

    /// Whether the expert cache reads the misses repeated contexts predict (`lookahead`, `both`).
    pub fn reads_repeated_contexts(self) -> bool {
        matches!(self, Prefetch::Lookahead | Prefetch::Both)
    }

    /// The name `parse` accepts.
    pub fn as_str(self) -> &'static str {
        match self {
            Prefetch::Off => "off",
            Prefetch::Measure => "measure",
            Prefetch::Pilot => "pilot",
            Prefetch::Lookahead => "lookahead",
            Prefetch::Both => "both",
        }
    }
}

/// Ranks of a prediction whose precision is tracked (GLM-5.2 routes 8 experts a token); a
/// deeper rank counts as the last one.
pub const RANKS: usize = 16;

/// Prediction quality, summed over every predicted (row, layer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PilotStats {
    /// Experts the predicted layers actually chose (rows × top-k).
    pub chosen: u64,
    /// Of those, how many the prediction named.
    pub predicted_right: u64,
    /// Distinct experts named per predicted layer and forward (the prefetch candidates).
    pub candidates: u64,
    /// Prefetch reads issued (candidates not already resident, within the prefetch slots).
    pub issued: u64,
    /// Per rank of a prediction (the router's order, most confident first): predictions
    /// scored, and of those how many the layer then chose.
    pub rank_predicted: [u64; RANKS],
    /// See [`PilotStats::rank_predicted`].
    pub rank_right: [u64; RANKS],
}

impl PilotStats {
    /// Share of the chosen experts the prediction named.
    pub fn recall(&self) -> f64 {
        self.predicted_right as f64 / self.chosen.max(1) as f64
    }

    /// Per scored rank, the share of its predictions the layer chose.
    pub fn precision_by_rank(&self) -> Vec<f64> {
        let n = self
            .rank_predicted
            .iter()
            .rposition(|&n| n > 0)
            .map_or(0, |k| k + 1);
        (0..n)
            .map(|k| self.rank_right[k] as f64 / self.rank_predicted[k].max(1) as f64)
            .collect()
    }

    /// What a report shows (`run --json`'s `prefetch`, `/stats`' `residency.pilot`): the
    /// recall and the precision by rank beside the counts they come from.
    pub fn summary(&self) -> serde_json::Value {
        serde_json::json!({
            "recall": self.recall(),
            "chosen": self.chosen,
            "predicted_right": self.predicted_right,
            "candidates": self.candidates,
            "issued": self.issued,
            "precision_by_rank": self.precision_by_rank(),
        })
    }

    /// Adds another run's counts.
    pub fn add(&mut self, o: &PilotStats) {
        self.chosen += o.chosen;
        self.predicted_right += o.predicted_right;
        self.candidates += o.candidates;
        self.issued += o.issued;
        for k in 0..RANKS {
            self.rank_predicted[k] += o.rank_predicted[k];
            self.rank_right[k] += o.rank_right[k];
        }
    }

    /// Scores one layer's prediction against what it chose: per row, how many chosen ids were
    /// predicted, and per rank of the prediction whether the layer chose it.
    pub fn score(&mut self, predicted: &[Vec<u32>], chosen: &[Vec<u32>]) {
        for (p, c) in predicted.iter().zip(chosen) {
            self.chosen += c.len() as u64;
            self.predicted_right += c.iter().filter(|e| p.contains(e)).count() as u64;
            for (k, e) in p.iter().enumerate() {
                let k = k.min(RANKS - 1);
                self.rank_predicted[k] += 1;
                self.rank_right[k] += c.contains(e) as u64;
            }
        }
    }
}

/// The distinct experts of `predicted` (rows of router-ordered ids, most confident first) in
/// the prefetch order: every row's first choice, then every row's second, and so on. The
/// prefetch slots (one row's top-k) fill with the likeliest experts of all rows, not with one
/// row's long shots: on route256 the predictor's rank 1 is right 0.86 of the time, rank 8 0.32
/// (`bench replay --prefetch pilot`'s `precision_by_rank`). Every rank is read: a floor on
/// that precision (ranks 6–8 are below one in two) was measured and not kept — the reads it
/// held back were right 0.56–0.83 of the time, the low ranks' uncached names being likelier
/// than their rank's average (`benchmarks/RESULTS.md` 2026-12-07 06:22).
pub fn union(predicted: &[Vec<u32>]) -> Vec<u32> {
    let mut out = Vec::new();
    let ranks = predicted.iter().map(Vec::len).max().unwrap_or(0);
    for k in 0..ranks {
        for e in predicted.iter().filter_map(|row| row.get(k)) {
            if !out.contains(e) {
                out.push(*e);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_and_union() {
        let p = vec![vec![1, 2, 3], vec![4, 1, 9]];
        let c = vec![vec![3, 2, 7], vec![9, 8, 6]];
        let mut s = PilotStats::default();
        s.score(&p, &c);
        assert_eq!((s.chosen, s.predicted_right), (6, 3));
        // Rank 1: 1 (no), 4 (no); rank 2: 2 (yes), 1 (no); rank 3: 3 (yes), 9 (yes).
        assert_eq!(&s.rank_predicted[..4], &[2, 2, 2, 0]);
        assert_eq!(&s.rank_right[..4], &[0, 1, 2, 0]);
        assert_eq!(s.precision_by_rank(), vec![0.0, 0.5, 1.0]);
        let mut t = s;
        t.add(&s);
        assert_eq!(t.precision_by_rank(), s.precision_by_rank());
        assert_eq!((t.chosen, t.rank_predicted[1]), (12, 4));
        // Ranks deeper than RANKS count as the last one.
        let mut d = PilotStats::default();
        d.score(&[(0..20).collect()], &[vec![19]]);
        assert_eq!(
            (d.rank_predicted[RANKS - 1], d.rank_right[RANKS - 1]),
            (5, 1)
        );
        // Rank by rank across rows: a one-row step keeps the router's order.
        assert_eq!(union(&p), vec![1, 4, 2, 3, 9]);
        assert_eq!(union(&p[1..]), vec![4, 1, 9]);
        assert_eq!(union(&[vec![5], vec![6, 7, 8]]), vec![5, 6, 7, 8]);
        for m in [
            Prefetch::Off,
            Prefetch::Measure,
            Prefetch::Pilot,
            Prefetch::Lookahead,
            Prefetch::Both,
        ] {
            assert_eq!(Prefetch::parse(m.as_str()), Some(m));
        }
        assert_eq!(Prefetch::parse("on"), None);
        assert!(!Prefetch::Lookahead.runs_router_early() && Prefetch::Pilot.runs_router_early());
        // `both` is each of the two, nothing else.
        let b = Prefetch::Both;
        assert!(b.runs_router_early() && b.reads_predicted_layer() && b.reads_repeated_contexts());
        assert!(!Prefetch::Pilot.reads_repeated_contexts());
        assert!(!Prefetch::Lookahead.reads_predicted_layer());
        assert!(!Prefetch::Measure.reads_predicted_layer());
    }
}
