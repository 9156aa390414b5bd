//! How much drafts widen a step's expert union.
//!
//! A decode step reads, per MoE layer, the union of the routed experts its rows chose. A
//! verification run adds γ draft positions per speculating row, each routing its own top-k,
//! so the union grows — under a memory budget that is what makes verification dear (the
//! seed's warning: verifying 3 tokens needs ~18 experts per layer instead of 8). The
//! [`UnionMeter`] watches a forward's routing (an [`Observer`]) and counts, per MoE layer, the
//! distinct experts of all rows and of the plain rows alone (every row but the draft
//! positions: what the step would have read without drafts); [`UnionCounts`] sums steps.

use nectar_model::Observer;
use serde::Serialize;

/// One forward's union, summed over its MoE layers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepUnion {
    /// MoE layers that routed.
    pub layers: usize,
    /// Σ over layers of the distinct experts of all rows.
    pub experts: usize,
    /// Σ over layers of the distinct experts of the plain rows (draft positions left out).
    pub plain_experts: usize,
    /// The forward verified at least one draft.
    pub drafts: bool,
}

/// Union sums over decode steps (steps with a prompt chunk are left out: a prompt's union
/// says nothing about decoding).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct UnionCounts {
    /// Steps that verified drafts.
    pub verify_steps: u64,
    /// Their MoE layer-steps.
    pub verify_layers: u64,
    /// Σ distinct experts over those layer-steps, all rows.
    pub verify_experts: u64,
    /// Σ distinct experts over those layer-steps, the plain rows alone.
    pub verify_plain_experts: u64,
    /// Steps without drafts.
    pub plain_steps: u64,
    /// Their MoE layer-steps.
    pub plain_layers: u64,
    /// Σ distinct experts over those layer-steps.
    pub plain_experts: u64,
}

impl UnionCounts {
    /// Adds a step.
    pub fn add(&mut self, s: &StepUnion) {
        let (layers, experts) = (s.layers as u64, s.experts as u64);
        if s.drafts {
            self.verify_steps += 1;
            self.verify_layers += layers;
            self.verify_experts += experts;
            self.verify_plain_experts += s.plain_experts as u64;
        } else {
            self.plain_steps += 1;
            self.plain_layers += layers;
            self.plain_experts += experts;
        }
    }

    /// The means (see [`UnionStats`]).
    pub fn stats(&self) -> UnionStats {
        let per = |x: u64, n: u64| if n > 0 { x as f64 / n as f64 } else { 0.0 };
        UnionStats {
            verify_steps: self.verify_steps,
            verify_experts_per_layer: per(self.verify_experts, self.verify_layers),
            verify_plain_experts_per_layer: per(self.verify_plain_experts, self.verify_layers),
            growth: per(self.verify_experts, self.verify_plain_experts),
            plain_steps: self.plain_steps,
            plain_experts_per_layer: per(self.plain_experts, self.plain_layers),
        }
    }
}

/// The expert union of decode steps, as reported (`"expert_union"` in `--json` and `/stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct UnionStats {
    /// Decode steps that verified drafts.
    pub verify_steps: u64,
    /// Their mean distinct routed experts per MoE layer per step, every row and draft.
    pub verify_experts_per_layer: f64,
    /// The same steps' mean over the plain rows only (draft positions left out): what they
    /// would have read without drafts.
    pub verify_plain_experts_per_layer: f64,
    /// `verify_experts_per_layer / verify_plain_experts_per_layer`: how much the drafts
    /// widened the union (0 when no step verified).
    pub growth: f64,
    /// Decode steps without drafts.
    pub plain_steps: u64,
    /// Their mean distinct routed experts per MoE layer per step.
    pub plain_experts_per_layer: f64,
}

/// Counts a forward's union per MoE layer from its routing (see the module docs). Routing
/// outside [`UnionMeter::begin`] … [`UnionMeter::end`] (an MTP forward) is ignored.
#[derive(Debug, Clone, Default)]
pub struct UnionMeter {
    active: bool,
    /// Per row of the forward: a draft position.
    draft: Vec<bool>,
    /// Per MoE layer seen: (layer, bitset of all rows' experts, bitset of the plain rows').
    layers: Vec<(usize, Vec<u64>, Vec<u64>)>,
}

fn set(bits: &mut Vec<u64>, e: u32) {
    let (w, b) = (e as usize / 64, e % 64);
    if bits.len() <= w {
        bits.resize(w + 1, 0);
    }
    bits[w] |= 1 << b;
}

fn count(bits: &[u64]) -> usize {
    bits.iter().map(|w| w.count_ones() as usize).sum()
}

impl UnionMeter {
    /// Starts a forward whose row `i` is a draft position when `draft[i]`.
    pub fn begin(&mut self, draft: Vec<bool>) {
        self.active = true;
        self.draft = draft;
        self.layers.clear();
    }

    /// Ends the forward: its union.
    pub fn end(&mut self) -> StepUnion {
        self.active = false;
        StepUnion {
            layers: self.layers.len(),
            experts: self.layers.iter().map(|(_, a, _)| count(a)).sum(),
            plain_experts: self.layers.iter().map(|(_, _, p)| count(p)).sum(),
            drafts: self.draft.iter().any(|&d| d),
        }
    }
}

impl Observer for UnionMeter {
    fn router(&mut self, layer: usize, row: usize, ids: &[u32], _weights: &[f32]) {
        if !self.active {
            return;
        }
        // Rows arrive layer by layer: the last layer seen first.
        let i = match self.layers.iter().rposition(|(l, _, _)| *l == layer) {
            Some(i) => i,
            None => {
                self.layers.push((layer, Vec::new(), Vec::new()));
                self.layers.len() - 1
            }
        };
        let plain = !self.draft.get(row).copied().unwrap_or(false);
        let (_, all, p) = &mut self.layers[i];
        for &e in ids {
            set(all, e);
            if plain {
                set(p, e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_widen_the_union_and_plain_rows_are_counted_apart() {
        let mut m = UnionMeter::default();
        // Rows 0 and 2 plain, row 1 a draft; two layers.
        m.begin(vec![false, true, false]);
        m.router(1, 0, &[1, 2], &[]);
        m.router(1, 1, &[2, 70], &[]);
        m.router(1, 2, &[1, 3], &[]);
        m.router(2, 0, &[5, 6], &[]);
        m.router(2, 1, &[5, 6], &[]);
        m.router(2, 2, &[7, 8], &[]);
        let s = m.end();
        // Layer 1: all {1,2,3,70}, plain {1,2,3}; layer 2: all = plain = {5,6,7,8}.
        assert_eq!(
            s,
            StepUnion {
                layers: 2,
                experts: 8,
                plain_experts: 7,
                drafts: true
            }
        );
        // Routing outside a forward (the MTP layer's) is not counted.
        m.router(3, 0, &[9], &[]);
        m.begin(vec![false]);
        m.router(1, 0, &[1, 2], &[]);
        let p = m.end();
        assert_eq!((p.layers, p.experts, p.drafts), (1, 2, false));
        let mut c = UnionCounts::default();
        c.add(&s);
        c.add(&p);
        let st = c.stats();
        assert_eq!(st.verify_steps, 1);
        assert_eq!(st.verify_experts_per_layer, 4.0);
        assert_eq!(st.verify_plain_experts_per_layer, 3.5);
        assert!((st.growth - 8.0 / 7.0).abs() < 1e-12);
        assert_eq!((st.plain_steps, st.plain_experts_per_layer), (1, 2.0));
    }
}
