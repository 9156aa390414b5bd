//! `auto`: choosing the draft depth γ from what this machine measures.
//!
//! Speculation pays only when the tokens a round yields outweigh what the
//! round costs: verifying γ + 1 rows costs more than decoding one (under a
//! memory budget much more, because each row routes its own experts and the
//! union per layer grows — `lessons.md` #19), and every draft costs a draft
//! forward. So nothing is assumed: per draft depth j the controller keeps
//! the measured acceptance α_j (the chance the j-th draft is accepted given
//! the ones before it were), per γ the measured time of a round (drafting
//! plus verification; γ = 0 is a plain decoding step), and the measured
//! time to absorb one kept row into the draft model. At the end of every
//! window of [`WINDOW`] rounds (the first is [`FIRST_WINDOW`], so a wrong
//! start costs little) it picks the γ in 0..=γ_max that maximises
//!
//! ```text
//! tokens/s(γ) = E(γ) / (cost(γ) + absorb_per_row · E(γ)),   E(γ) = 1 + Σ_{j≤γ} Π_{i≤j} α_i
//! ```
//!
//! A window ends with one probe round at every other γ, so every cost stays
//! measured (γ = 0 re-probes drafting this way), warm, just before the
//! decision. Probes cost rounds off the optimum, so while the decision
//! holds they back off to every 2nd, then every 4th window; a change
//! re-probes every window. Acceptance counts decay by half per decision, so
//! the choice follows the text as it changes.

use serde::Serialize;

/// Rounds per decision.
pub const WINDOW: usize = 16;
/// Rounds before the first decision.
pub const FIRST_WINDOW: usize = 8;
/// Probe at most this many windows apart while the decision holds.
const MAX_PROBE_EVERY: usize = 4;
/// Weight of a new sample in the running mean of a round's cost.
const EMA: f64 = 0.3;
/// Per-window decay of the acceptance counts.
const DECAY: f64 = 0.5;

/// One decision of the `auto` controller.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AutoDecision {
    /// Rounds (main forwards after the prefill) run when it was taken.
    pub round: usize,
    /// Tokens generated when it was taken.
    pub tokens: usize,
    /// The depth chosen (0 = plain decoding).
    pub gamma: usize,
    /// Consecutive windows this decision held (a repeated decision updates
    /// the entry instead of adding one).
    pub windows: usize,
    /// Expected tokens per second for each γ = 0..=γ_max (`None`: not
    /// measured yet).
    pub expected_tok_s: Vec<Option<f64>>,
    /// Measured milliseconds per round for each γ, absorption excluded.
    pub round_ms: Vec<Option<f64>>,
    /// Measured acceptance at each draft depth 1..=γ_max.
    pub acceptance_by_depth: Vec<f64>,
    /// The decision in words.
    pub reason: String,
}

/// The γ controller of `auto` mode.
#[derive(Debug, Clone)]
pub struct AutoGamma {
    max: usize,
    current: usize,
    /// Rounds into the current window, and its length.
    round: usize,
    window: usize,
    rounds: usize,
    /// Windows decided so far; probes run when `windows % probe_every == 0`.
    windows: usize,
    probe_every: usize,
    /// Per depth j (index j − 1): drafts checked and accepted (decayed).
    tried: Vec<f64>,
    accepted: Vec<f64>,
    /// Seconds per round at each γ, absorption excluded.
    cost: Vec<Option<f64>>,
    absorb_per_row: Option<f64>,
    decisions: Vec<AutoDecision>,
}

impl AutoGamma {
    /// Starts drafting at `max` and chooses among 0..=max.
    pub fn new(max: usize) -> AutoGamma {
        AutoGamma {
            max,
            current: max,
            round: 0,
            window: FIRST_WINDOW,
            rounds: 0,
            windows: 0,
            probe_every: 1,
            tried: vec![0.0; max],
            accepted: vec![0.0; max],
            cost: vec![None; max + 1],
            absorb_per_row: None,
            decisions: Vec::new(),
        }
    }

    /// γ for the next round: the choice, then the window's probes (when
    /// this window probes).
    pub fn next(&self) -> usize {
        let probes = self.max; // every γ in 0..=max but the current one
        let first_probe = self.window.saturating_sub(probes);
        if !self.windows.is_multiple_of(self.probe_every) || self.round < first_probe {
            return self.current;
        }
        (0..=self.max)
            .filter(|&g| g != self.current)
            .nth(self.round - first_probe)
            .unwrap_or(self.current)
    }

    /// The largest depth it chooses from.
    pub fn max(&self) -> usize {
        self.max
    }

    /// A controller for a new request that starts from what this one measured (its
    /// acceptance, its costs, its choice), with no decisions of its own yet. Requests are often
    /// shorter than a few windows; a batch hands each new row what the rows before it learned
    /// instead of starting every one at γ_max.
    pub fn carry_over(&self) -> AutoGamma {
        AutoGamma {
            round: 0,
            window: WINDOW,
            rounds: 0,
            decisions: Vec::new(),
            ..self.clone()
        }
    }

    /// The depth currently chosen.
    pub fn current(&self) -> usize {
        self.current
    }

    /// Every decision so far.
    pub fn decisions(&self) -> &[AutoDecision] {
        &self.decisions
    }

    /// Records a round that checked `drafted` drafts and accepted `accepted`
    /// in `secs` (absorption excluded), after absorbing `absorbed` rows in
    /// `absorb_secs`; `tokens` is the output length so far.
    pub fn record(
        &mut self,
        drafted: usize,
        accepted: usize,
        secs: f64,
        absorbed: usize,
        absorb_secs: f64,
        tokens: usize,
    ) {
        let drafted = drafted.min(self.max);
        // Depth j was checked when every draft before it was accepted.
        for j in 0..drafted.min(accepted + 1) {
            self.tried[j] += 1.0;
            if j < accepted {
                self.accepted[j] += 1.0;
            }
        }
        let c = &mut self.cost[drafted];
        *c = Some(c.map_or(secs, |old| old + EMA * (secs - old)));
        if absorbed > 0 {
            let per = absorb_secs / absorbed as f64;
            let a = &mut self.absorb_per_row;
            *a = Some(a.map_or(per, |old| old + EMA * (per - old)));
        }
        self.round += 1;
        self.rounds += 1;
        if self.round >= self.window {
            self.decide(tokens);
        }
    }

    /// Acceptance per depth; an unmeasured depth inherits the one before.
    fn alphas(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.max);
        let mut prev = 0.0;
        for (t, a) in self.tried.iter().zip(&self.accepted) {
            prev = if *t > 0.0 { a / t } else { prev };
            out.push(prev);
        }
        out
    }

    fn decide(&mut self, tokens: usize) {
        let alphas = self.alphas();
        let mut expected = Vec::with_capacity(self.max + 1);
        let (mut e, mut run) = (1.0, 1.0);
        for g in 0..=self.max {
            if g > 0 {
                run *= alphas[g - 1];
                e += run;
            }
            let absorb = if g > 0 {
                self.absorb_per_row.unwrap_or(0.0) * e
            } else {
                0.0
            };
            expected.push(self.cost[g].map(|c| (e, e / (c + absorb).max(1e-12))));
        }
        let best = expected
            .iter()
            .enumerate()
            .filter_map(|(g, x)| x.map(|(e, r)| (g, e, r)))
            // Strictly better only, so ties go to the smaller γ.
            .fold(None, |b: Option<(usize, f64, f64)>, x| match b {
                Some(b) if b.2 >= x.2 => Some(b),
                _ => Some(x),
            });
        if let Some((g, e, r)) = best {
            self.probe_every = if g == self.current {
                (self.probe_every * 2).min(MAX_PROBE_EVERY)
            } else {
                1
            };
            self.current = g;
            let held = self
                .decisions
                .last()
                .filter(|d| d.gamma == g)
                .map(|d| d.windows);
            let others: Vec<String> = expected
                .iter()
                .enumerate()
                .filter(|&(o, _)| o != g)
                .filter_map(|(o, x)| x.map(|(_, r)| format!("γ={o} {r:.0}")))
                .collect();
            let reason = format!(
                "γ={g}: {e:.2} tokens per round at {:.2} ms per round → {r:.0} tok/s expected (tok/s: {})",
                self.cost[g].unwrap_or(0.0) * 1e3,
                others.join(", ")
            );
            if held.is_some() {
                self.decisions.pop();
            }
            self.decisions.push(AutoDecision {
                round: self.rounds,
                tokens,
                gamma: g,
                windows: held.map_or(1, |w| w + 1),
                expected_tok_s: expected.iter().map(|x| x.map(|x| x.1)).collect(),
                round_ms: self.cost.iter().map(|c| c.map(|c| c * 1e3)).collect(),
                acceptance_by_depth: alphas,
                reason,
            });
        }
        for x in self.tried.iter_mut().chain(self.accepted.iter_mut()) {
            *x *= DECAY;
        }
        self.round = 0;
        self.window = WINDOW;
        self.windows += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs whole windows with acceptance `alpha` per depth (a fixed
    /// pseudo-random stream) and round costs `cost(γ)`.
    fn simulate(alpha: f64, cost: impl Fn(usize) -> f64, windows: usize) -> AutoGamma {
        let mut a = AutoGamma::new(3);
        let mut x = 1u64;
        let mut uniform = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        for _ in 0..windows * WINDOW {
            let g = a.next();
            let accepted = (0..g).take_while(|_| uniform() < alpha).count();
            a.record(g, accepted, cost(g), 0, 0.0, 0);
        }
        a
    }

    /// The γ of each round of the first `n` rounds, every round recorded
    /// with acceptance `accept(γ)` and cost `cost(γ)`.
    fn schedule(
        n: usize,
        accept: impl Fn(usize) -> usize,
        cost: impl Fn(usize) -> f64,
    ) -> Vec<usize> {
        let mut a = AutoGamma::new(3);
        (0..n)
            .map(|_| {
                let g = a.next();
                a.record(g, accept(g), cost(g), 0, 0.0, 0);
                g
            })
            .collect()
    }

    #[test]
    fn a_window_ends_probing_every_other_depth() {
        // Drafting pays: γ = 3 throughout, probes at the end of each window.
        let s = schedule(8 + 16, |g| g, |g| 1e-3 * (1.0 + 0.1 * g as f64));
        assert_eq!(s[..8], [3, 3, 3, 3, 3, 0, 1, 2], "{s:?}");
        // The decision held: the next window does not probe.
        assert!(s[8..].iter().all(|&g| g == 3), "{s:?}");
    }

    #[test]
    fn probes_back_off_while_the_decision_holds() {
        // Drafting never pays: γ = 0 after the first window, probing every
        // window, then every 2nd, then every 4th.
        let s = schedule(8 + 16 * 9, |_| 0, |g| 1e-3 * (1.0 + g as f64));
        let probed: Vec<bool> = s[8..]
            .chunks(16)
            .map(|w| w.iter().any(|&g| g != 0))
            .collect();
        assert_eq!(
            probed,
            [true, true, false, true, false, false, false, true, false]
        );
    }

    #[test]
    fn cheap_verification_and_good_drafts_choose_deep_drafting() {
        let a = simulate(0.9, |g| 1e-3 * (1.0 + 0.1 * g as f64), 3);
        assert_eq!(a.current(), 3, "{:?}", a.decisions());
        assert_eq!(a.decisions().len(), 1);
        assert_eq!(a.decisions()[0].windows, 3);
    }

    #[test]
    fn a_carried_over_controller_keeps_the_choice_and_starts_a_full_window() {
        let a = simulate(0.5, |g| 1e-3 * (1.0 + g as f64), 3);
        assert_eq!(a.current(), 0);
        let b = a.carry_over();
        assert_eq!(b.current(), 0);
        assert!(b.decisions().is_empty());
        // A fresh controller starts at γ_max; the carried one at the learned choice.
        assert_eq!(AutoGamma::new(3).next(), 3);
        assert_eq!(b.next(), 0);
    }

    #[test]
    fn expensive_verification_turns_drafting_off() {
        let a = simulate(0.5, |g| 1e-3 * (1.0 + g as f64), 3);
        assert_eq!(a.current(), 0);
        let d = a.decisions().last().unwrap();
        assert!(d.reason.starts_with("γ=0"), "{}", d.reason);
        assert!(d.expected_tok_s.iter().all(Option::is_some));
    }
}
