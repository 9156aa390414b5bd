//! Look-ahead prefetch: reads of a step's likely misses that start before the step runs, so a
//! layer's reads overlap the attention (and the expert work) of the layers before it.
//!
//! A layer's misses are only known once its router has run, after its attention; a read
//! issued then leaves the disk idle during every attention. But under
//! [`Admission::Predictive`] the policy already knows, before the step's first layer, the
//! latest earlier row whose token context equals the current one (the look-ahead of
//! [`super::predict`]): the same context routes to (nearly) the same experts, so that row's
//! recorded routes are a prediction of every layer's request for this row. At the start of a
//! step ([`Policy::plan_prefetch`]) the predicted experts that are not resident become a plan
//! in layer order; [`Policy::issue_prefetches`] starts as many as the free working slots allow
//! beyond the step's own need, and again at each safe point as slots come back, so the reads
//! run a few layers ahead of compute.
//!
//! Quality-neutral by construction: routing stays exact; a prefetch goes into a working slot
//! (never evicting anything), a requested one is an ordinary miss of its wave (admitted or
//! bypassed by the same rule as without prefetch, so the cache's contents do not change), and
//! an unrequested one is dropped at its layer's safe point — a wrong prediction costs a read
//! and a slot for a few layers. Only matches of at least `min_context` tokens are used: shorter
//! contexts predict fewer of their experts (`benchmarks/RESULTS.md`, "Look-ahead prefetch"), and
//! whether a wasted read costs more than an early read saves depends on the machine, so the
//! residency's controller (`control.rs`) moves `min_context` as decode runs, from
//! [`MIN_CONTEXT`].
use super::{Admission, Event, ExpertKey, Policy};

/// Shortest token context whose earlier routes are prefetched, where a run starts (the
/// controller of `control.rs` moves it as decode runs).
pub const MIN_CONTEXT: usize = 8;

/// The longest token context the predictor matches: a threshold above it reads nothing ahead.
pub const LONGEST_CONTEXT: usize = super::predict::NGRAMS[0];

/// What look-ahead prefetch did (counted by [`crate::replay::replay_prefetch`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LookaheadStats {
    /// Misses of counted steps whose read had not started before their request.
    pub misses: u64,
    /// Prefetches a counted step's request found (misses read ahead).
    pub used: u64,
    /// Prefetches issued in counted steps.
    pub issued: u64,
    /// Prefetches of counted steps dropped unrequested (wasted reads).
    pub wasted: u64,
}

impl LookaheadStats {
    /// Of all reads a request needed, the share started ahead.
    pub fn coverage(&self) -> f64 {
        self.used as f64 / (self.misses + self.used).max(1) as f64
    }

    /// Of the prefetches, the share that was requested.
    pub fn precision(&self) -> f64 {
        self.used as f64 / (self.used + self.wasted).max(1) as f64
    }
}

impl Policy {
    /// The experts each layer is predicted to request in a step of `rows` rows (the rows of the
    /// tokens last observed, see [`Policy::observe_token`]), with the length of the token
    /// context the prediction rests on: per layer, the recorded routes of the rows that ended
    /// the same context earlier. Empty without predictive admission or without a match.
    pub fn predict_step(&self, rows: usize) -> Vec<(ExpertKey, usize)> {
        if rows == 0 || !matches!(self.admission, Admission::Predictive { .. }) {
            return Vec::new();
        }
        let mut out: Vec<(ExpertKey, usize)> = Vec::new();
        for (layer, &cap) in self.capacity.iter().enumerate() {
            if cap == 0 {
                continue;
            }
            for (routes, n) in self.predictor.step_routes(layer, rows) {
                for &e in routes {
                    let k = ExpertKey::new(layer, e as usize);
                    match out.iter_mut().find(|(x, _)| *x == k) {
                        Some(x) => x.1 = x.1.max(n),
                        None => out.push((k, n)),
                    }
                }
            }
        }
        out
    }

    /// Plans the look-ahead prefetch of a step of `rows` rows whose waves need up to `reserve`
    /// free working slots: the predicted experts (contexts of at least `min_context` tokens)
    /// that are neither resident nor loading, in layer order. Replaces any earlier plan. Call
    /// after the step's [`Policy::observe_token`] calls, then [`Policy::issue_prefetches`].
    pub fn plan_prefetch(&mut self, rows: usize, reserve: usize, min_context: usize) {
        let mut plan: Vec<ExpertKey> = self
            .predict_step(rows)
            .into_iter()
            .filter(|&(k, n)| n >= min_context && !self.map.contains_key(&k))
            .map(|(k, _)| k)
            .collect();
        // Layer order (the order the step will request them); stable within a layer.
        plan.sort_by_key(|k| k.layer);
        self.plan = plan.into();
        self.plan_reserve = reserve;
    }

    /// Starts planned prefetches while more than the plan's reserve of working slots is free
    /// (at a step's start, and after each safe point: those free the slots of promoted misses).
    /// Returns the (working slot, key) pairs to read.
    pub fn issue_prefetches(&mut self, events: &mut Vec<Event>) -> Vec<(usize, ExpertKey)> {
        let mut out = Vec::new();
        while self.free_working() > self.plan_reserve {
            let Some(key) = self.plan.pop_front() else {
                break;
            };
            if self.map.contains_key(&key) {
                continue;
            }
            let Some(s) = self.claim_prefetch_slot(key, true, events) else {
                break;
            };
            out.push((s, key));
        }
        out
    }

    /// Drops the plan's entries for layers up to `layer` (its router has run: they are past).
    pub fn forget_plan_through(&mut self, layer: u32) {
        self.plan.retain(|k| k.layer > layer);
    }

    /// Planned prefetches not yet started.
    pub fn planned(&self) -> usize {
        self.plan.len()
    }
}
