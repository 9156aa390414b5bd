//! Verifying a drafted token: accept it, or replace it, so that the output is
//! distributed exactly as the target's — by rejection sampling ([`verify_draft`])
//! or, for a seeded request, by coupling ([`verify_coupled`]).

use crate::sampler::{Distribution, Sampler};
use std::collections::HashMap;

/// The outcome of checking one drafted token against the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The draft is the next token.
    Accepted,
    /// The draft is rejected; this token replaces it and ends the round.
    Rejected(u32),
}

/// Checks `draft`, drawn from `q` (`None`: proposed deterministically, a
/// point mass on `draft`), against the target distribution `p`:
///
/// accept with probability `min(1, p(d) / q(d))`; otherwise draw the
/// replacement from the residual `norm(max(0, p − q))`. The token that comes
/// out is distributed exactly as `p` (Leviathan et al. 2023, Chen et al.
/// 2023), whatever `q` is, so speculation never changes what a request
/// samples — only how many forwards it takes.
///
/// Uniforms come from the request's `sampler`, so a seed replays the
/// verdicts too. A draw is made only when the outcome is uncertain: an
/// acceptance test with ratio in (0, 1), a residual with more than one
/// candidate. Greedy targets are point masses, so greedy verification is an
/// exact match with the argmax and consumes no randomness, like greedy
/// decoding.
pub fn verify_draft(
    sampler: &mut Sampler,
    p: &Distribution,
    q: Option<&Distribution>,
    draft: u32,
) -> Verdict {
    let pd = p.prob(draft);
    // A draft outside q's support cannot have been drawn from q; treat the
    // proposal as deterministic rather than divide by zero.
    let q = q.filter(|q| q.prob(draft) > 0.0);
    let qd = q.map_or(1.0, |q| q.prob(draft));
    let accept = if pd >= qd {
        true
    } else if pd <= 0.0 {
        false
    } else {
        sampler.next_uniform() < pd / qd
    };
    if accept {
        return Verdict::Accepted;
    }
    let q_of: Box<dyn Fn(u32) -> f64> = match q {
        None => Box::new(move |id| if id == draft { 1.0 } else { 0.0 }),
        Some(q) => {
            let map: HashMap<u32, f64> = q.candidates().iter().copied().collect();
            Box::new(move |id| map.get(&id).copied().unwrap_or(0.0))
        }
    };
    // In p's order (most likely first, lower id among equals), so the draw
    // is deterministic for a given uniform.
    let mut residual: Vec<(u32, f64)> = p
        .candidates()
        .iter()
        .map(|&(id, pp)| (id, (pp - q_of(id)).max(0.0)))
        .filter(|&(_, r)| r > 0.0)
        .collect();
    let total: f64 = residual.iter().map(|c| c.1).sum();
    if residual.is_empty() || total.is_nan() || total <= 0.0 {
        // Only reachable through rounding (p ≤ q everywhere yet p(d) < q(d)):
        // fall back to the target itself.
        return Verdict::Rejected(p.sample_at(sampler.next_uniform()));
    }
    if residual.len() == 1 {
        return Verdict::Rejected(residual[0].0);
    }
    for c in residual.iter_mut() {
        c.1 /= total;
    }
    let u = sampler.next_uniform();
    Verdict::Rejected(Distribution::from_candidates(residual).sample_at(u))
}

/// Checks `draft`, proposed for output `position`, against the target distribution `p` by
/// coupling: the target's own keyed draw at `position` ([`Sampler::draw`]) is the token, and
/// the draft is accepted exactly when it equals it. The output is therefore token for token
/// what plain decoding with the request's seed gives, whatever the draft depth, the provider
/// or the batch — and so distributed exactly as `p`. A draft the request sampled with the
/// same position's noise from `q ≈ p` (what [`crate::Proposals::sample`] does) is accepted
/// with probability at least `(1 − TV(p, q)) / (1 + TV(p, q))` (Gumbel coupling); a
/// deterministic draft with probability `p(draft)`, as under rejection sampling.
pub fn verify_coupled(sampler: &Sampler, p: &Distribution, position: usize, draft: u32) -> Verdict {
    match sampler.draw(p, position) {
        t if t == draft => Verdict::Accepted,
        t => Verdict::Rejected(t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::{distribution, SamplingParams};

    fn sampler(temperature: f32) -> Sampler {
        let p = SamplingParams {
            temperature,
            seed: Some(3),
            ..SamplingParams::default()
        };
        Sampler::new(p, 4).unwrap()
    }

    fn dist(temperature: f32, logits: &[f32]) -> Distribution {
        let p = SamplingParams {
            temperature,
            ..SamplingParams::default()
        };
        distribution(&p, logits).unwrap()
    }

    #[test]
    fn greedy_is_an_exact_match_without_randomness() {
        let mut s = sampler(0.0);
        let before = s.clone();
        let p = dist(0.0, &[0.0, 3.0, 1.0, 2.0]);
        assert_eq!(verify_draft(&mut s, &p, None, 1), Verdict::Accepted);
        assert_eq!(verify_draft(&mut s, &p, None, 2), Verdict::Rejected(1));
        let q = dist(1.0, &[0.0, 0.0, 5.0, 0.0]);
        assert_eq!(verify_draft(&mut s, &p, Some(&q), 2), Verdict::Rejected(1));
        assert_eq!(s.next_uniform(), before.clone().next_uniform());
    }

    #[test]
    fn a_draft_the_target_cannot_produce_is_always_rejected() {
        let mut s = sampler(1.0);
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 2,
            ..SamplingParams::default()
        };
        let p = distribution(&p, &[3.0, 2.0, 1.0, 0.0]).unwrap();
        for _ in 0..100 {
            match verify_draft(&mut s, &p, None, 3) {
                Verdict::Rejected(t) => assert!(t < 2, "{t}"),
                Verdict::Accepted => panic!("accepted a token with p = 0"),
            }
        }
    }

    #[test]
    fn a_draft_more_likely_under_the_target_is_always_accepted() {
        let mut s = sampler(1.0);
        let p = dist(1.0, &[3.0, 0.0, 0.0, 0.0]);
        let q = dist(1.0, &[0.0, 0.0, 0.0, 0.0]);
        let before = s.clone();
        assert_eq!(verify_draft(&mut s, &p, Some(&q), 0), Verdict::Accepted);
        // Certain outcomes draw nothing.
        assert_eq!(s.next_uniform(), before.clone().next_uniform());
    }
}
