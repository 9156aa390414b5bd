//! From processed logits to the distribution a token is drawn from:
//! temperature, then top-k, top-p and min-p truncation.

use super::params::SamplingParams;
use crate::error::{Error, Result};
use std::cmp::Ordering;

/// Greedy decoding: the index of the largest logit, the lowest id on ties.
/// NaN never wins unless every entry is NaN; an empty slice gives 0.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

/// The distribution a token is drawn from: the candidates that survive
/// truncation, most likely first (the lowest id first among equals), with
/// probabilities renormalised over the survivors so they sum to 1 (up to f64
/// rounding). Every other id has probability 0.
///
/// Speculative decoding's rejection sampling needs exactly this: the target
/// probability `p(x)` of a drafted token and the residual `max(0, p - q)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Distribution {
    candidates: Vec<(u32, f64)>,
}

impl Distribution {
    /// A distribution over `candidates` as given: `(id, probability)`, most
    /// likely first, probabilities summing to 1 (the caller's contract; a
    /// speculative verifier builds its residual distribution this way).
    pub(crate) fn from_candidates(candidates: Vec<(u32, f64)>) -> Distribution {
        Distribution { candidates }
    }

    /// `(id, probability)` of every token that can be drawn, most likely first.
    pub fn candidates(&self) -> &[(u32, f64)] {
        &self.candidates
    }

    /// Probability of `token` (0 when it was truncated away or masked).
    pub fn prob(&self, token: u32) -> f64 {
        self.candidates
            .iter()
            .find(|&&(id, _)| id == token)
            .map_or(0.0, |&(_, p)| p)
    }

    /// Inverse-CDF draw: the first candidate whose cumulative probability
    /// exceeds `u` (`u` uniform in `[0, 1)`). Rounding can leave the total a
    /// hair under 1; a `u` past it takes the last candidate.
    pub fn sample_at(&self, u: f64) -> u32 {
        let mut cum = 0.0;
        for &(id, p) in &self.candidates {
            cum += p;
            if u < cum {
                return id;
            }
        }
        // `distribution` never builds an empty candidate list.
        self.candidates.last().map_or(0, |&(id, _)| id)
    }
}

/// The sampling distribution of `processed` logits (see
/// [`super::process_logits`]) under `params`: a pure function, so a
/// speculative verifier can recompute it for any position.
///
/// Order and tie rules:
/// - greedy (`temperature == 0`): all mass on [`argmax`];
/// - otherwise `z = logit / temperature` over the ids whose logit is neither
///   NaN nor `-inf` (masked), sorted by `z` descending, lower id first on
///   ties;
/// - **top-k** keeps the first `k` of that order — exactly `k`, so a tie at
///   the boundary is broken towards the lower id (the project-wide rule);
/// - **top-p** keeps the shortest prefix whose probability (renormalised over
///   the top-k survivors) reaches `top_p`, so again exactly the lower ids
///   of a boundary tie;
/// - **min-p** keeps the tokens whose probability is at least `min_p` times
///   the most likely one's; equal tokens are kept or dropped together.
///
/// At least one token always survives. If some logit is `+inf` the
/// distribution is uniform over the `+inf` ids (the limit of softmax).
pub fn distribution(params: &SamplingParams, processed: &[f32]) -> Result<Distribution> {
    if params.is_greedy() {
        let best = argmax(processed);
        return match processed.get(best as usize) {
            Some(&l) if is_candidate(l) => Ok(Distribution {
                candidates: vec![(best, 1.0)],
            }),
            _ => Err(Error::NoCandidates),
        };
    }
    let t = f64::from(params.temperature);
    let mut cand: Vec<(u32, f64)> = processed
        .iter()
        .enumerate()
        .filter(|&(_, &l)| is_candidate(l))
        .map(|(i, &l)| (i as u32, f64::from(l) / t))
        .collect();
    if cand.is_empty() {
        return Err(Error::NoCandidates);
    }
    if cand.iter().any(|&(_, z)| z == f64::INFINITY) {
        cand.retain(|&(_, z)| z == f64::INFINITY);
        let p = 1.0 / cand.len() as f64;
        return Ok(Distribution {
            candidates: cand.into_iter().map(|(id, _)| (id, p)).collect(),
        });
    }
    // Only the top-k need ordering: select them first (O(n)), then sort.
    if params.top_k > 0 && params.top_k < cand.len() {
        cand.select_nth_unstable_by(params.top_k - 1, by_score);
        cand.truncate(params.top_k);
    }
    let z_max = cand.iter().map(|c| c.1).fold(f64::NEG_INFINITY, f64::max);
    if params.top_p < 1.0 {
        let keep = top_p_prefix(&mut cand, z_max, params.top_p);
        cand.truncate(keep);
    } else {
        cand.sort_unstable_by(by_score);
    }
    // Unnormalised probabilities relative to the best token (which gets 1).
    for c in cand.iter_mut() {
        c.1 = (c.1 - z_max).exp();
    }
    if params.min_p > 0.0 {
        // Relative to the best (whose weight is exactly 1), so no
        // renormalisation is needed for the comparison.
        let min = f64::from(params.min_p);
        let keep = cand.iter().take_while(|c| c.1 >= min).count().max(1);
        cand.truncate(keep);
    }
    let total: f64 = cand.iter().map(|c| c.1).sum();
    for c in cand.iter_mut() {
        c.1 /= total;
    }
    Ok(Distribution { candidates: cand })
}

/// First window the top-p prefix is looked for in (grown 4× while it falls short).
const TOP_P_WINDOW: usize = 256;

/// Sorts the shortest prefix of `cand` (by [`by_score`]) whose weight `exp(z - z_max)` reaches
/// `top_p` of the total and returns its length. Only that prefix is ordered: windows of the
/// best candidates are selected in O(n) and sorted, growing until the prefix fits, instead of
/// sorting the whole vocabulary (155K entries for GLM-5) for every token.
fn top_p_prefix(cand: &mut [(u32, f64)], z_max: f64, top_p: f32) -> usize {
    let total: f64 = cand.iter().map(|c| (c.1 - z_max).exp()).sum();
    let target = f64::from(top_p) * total;
    let mut k = TOP_P_WINDOW.min(cand.len());
    loop {
        if k < cand.len() {
            cand.select_nth_unstable_by(k - 1, by_score);
        }
        cand[..k].sort_unstable_by(by_score);
        let mut cum = 0.0;
        for (i, c) in cand[..k].iter().enumerate() {
            cum += (c.1 - z_max).exp();
            if cum >= target {
                return i + 1;
            }
        }
        if k == cand.len() {
            return k;
        }
        k = (k * 4).min(cand.len());
    }
}

/// A logit that can be drawn: not NaN and not masked to `-inf`.
fn is_candidate(l: f32) -> bool {
    !l.is_nan() && l != f32::NEG_INFINITY
}

/// Higher score first, then lower id: a total order, so every sort and
/// selection above is deterministic.
fn by_score(a: &(u32, f64), b: &(u32, f64)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            ..SamplingParams::default()
        }
    }

    fn ids(d: &Distribution) -> Vec<u32> {
        d.candidates().iter().map(|c| c.0).collect()
    }

    #[test]
    fn argmax_lowest_id_wins_ties_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN, 2.0]), 3);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn greedy_is_a_point_mass_on_argmax() {
        let d = distribution(&params(0.0, 1, 0.1, 0.9), &[0.5, 2.0, 2.0]).unwrap();
        assert_eq!(d.candidates(), [(1, 1.0)]);
        assert!(matches!(
            distribution(&params(0.0, 0, 1.0, 0.0), &[f32::NEG_INFINITY; 3]),
            Err(Error::NoCandidates)
        ));
    }

    #[test]
    fn full_distribution_is_the_softmax() {
        let logits = [1.0f32, 2.0, 0.0, 2.0];
        let d = distribution(&params(1.0, 0, 1.0, 0.0), &logits).unwrap();
        assert_eq!(ids(&d), [1, 3, 0, 2]);
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        for &(id, p) in d.candidates() {
            let want = f64::from(logits[id as usize]).exp() / z;
            assert!((p - want).abs() < 1e-12, "{id}: {p} vs {want}");
        }
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let logits = [0.0f32, 1.0];
        let cold = distribution(&params(0.5, 0, 1.0, 0.0), &logits).unwrap();
        let hot = distribution(&params(2.0, 0, 1.0, 0.0), &logits).unwrap();
        let want_cold = 1.0 / (1.0 + (-2.0f64).exp());
        let want_hot = 1.0 / (1.0 + (-0.5f64).exp());
        assert!((cold.prob(1) - want_cold).abs() < 1e-12);
        assert!((hot.prob(1) - want_hot).abs() < 1e-12);
    }

    #[test]
    fn top_k_keeps_exactly_k_breaking_ties_to_the_lower_id() {
        let logits = [1.0, 3.0, 2.0, 2.0, 2.0, 0.0];
        let d = distribution(&params(1.0, 3, 1.0, 0.0), &logits).unwrap();
        assert_eq!(ids(&d), [1, 2, 3]);
        let d = distribution(&params(1.0, 1, 1.0, 0.0), &logits).unwrap();
        assert_eq!(d.candidates(), [(1, 1.0)]);
        // k larger than the vocabulary keeps everything.
        let d = distribution(&params(1.0, 100, 1.0, 0.0), &logits).unwrap();
        assert_eq!(ids(&d), [1, 2, 3, 4, 0, 5]);
    }

    #[test]
    fn top_p_keeps_the_shortest_prefix_reaching_p() {
        // Probabilities 0.5, 0.25, 0.125, 0.125 (ln-weights).
        let logits = [0.5f32.ln(), 0.25f32.ln(), 0.125f32.ln(), 0.125f32.ln()];
        let keep = |p: f32| ids(&distribution(&params(1.0, 0, p, 0.0), &logits).unwrap());
        assert_eq!(keep(0.49), [0]);
        assert_eq!(keep(0.51), [0, 1]);
        assert_eq!(keep(0.74), [0, 1]);
        // The boundary falls inside the tie {2, 3}: the lower id is kept.
        assert_eq!(keep(0.8), [0, 1, 2]);
        assert_eq!(keep(1.0), [0, 1, 2, 3]);
        assert_eq!(keep(1e-6), [0]);
    }

    /// The windowed top-p search keeps exactly the prefix a full sort keeps, whether the prefix
    /// fits the first window or needs it grown (flat and peaked logits over a large vocabulary).
    #[test]
    fn windowed_top_p_equals_the_full_sort() {
        let mut s = 0x9e3779b97f4a7c15u64;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        for (spread, top_p) in [(0.1f64, 0.9f32), (8.0, 0.95), (2.0, 0.5), (0.01, 0.999)] {
            // Quantised logits so that ties occur and the id tie-break is exercised.
            let logits: Vec<f32> = (0..20_000)
                .map(|_| ((rnd() * spread * 64.0).round() / 64.0) as f32)
                .collect();
            let d = distribution(&params(1.0, 0, top_p, 0.0), &logits).unwrap();
            let mut full: Vec<(u32, f64)> = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, f64::from(l)))
                .collect();
            full.sort_unstable_by(by_score);
            let w: Vec<f64> = full.iter().map(|c| (c.1 - full[0].1).exp()).collect();
            let target = f64::from(top_p) * w.iter().sum::<f64>();
            let mut cum = 0.0;
            let keep = w.iter().position(|x| {
                cum += x;
                cum >= target
            });
            let want: Vec<u32> = full[..keep.unwrap() + 1].iter().map(|c| c.0).collect();
            assert_eq!(ids(&d), want, "spread {spread} top_p {top_p}");
        }
    }

    #[test]
    fn top_p_renormalises_over_top_k_survivors() {
        // After top-k = 2, the survivors have 2/3 and 1/3.
        let logits = [0.4f32.ln(), 0.2f32.ln(), 0.2f32.ln(), 0.2f32.ln()];
        let d = distribution(&params(1.0, 2, 0.6, 0.0), &logits).unwrap();
        assert_eq!(d.candidates(), [(0, 1.0)]);
        let d = distribution(&params(1.0, 2, 0.7, 0.0), &logits).unwrap();
        assert_eq!(ids(&d), [0, 1]);
    }

    #[test]
    fn min_p_keeps_ties_together() {
        let logits = [0.4f32.ln(), 0.2f32.ln(), 0.2f32.ln(), 0.1f32.ln()];
        let keep = |m: f32| ids(&distribution(&params(1.0, 0, 1.0, m), &logits).unwrap());
        assert_eq!(keep(0.49), [0, 1, 2]);
        assert_eq!(keep(0.51), [0]);
        assert_eq!(keep(0.24), [0, 1, 2, 3]);
        assert_eq!(keep(1.0), [0]);
        let d = distribution(&params(1.0, 0, 1.0, 0.49), &logits).unwrap();
        assert!((d.prob(0) - 0.5).abs() < 1e-6 && (d.prob(1) - 0.25).abs() < 1e-6);
    }

    #[test]
    fn masked_and_nan_tokens_never_survive() {
        let logits = [f32::NEG_INFINITY, 1.0, f32::NAN, 1.0];
        let d = distribution(&params(1.0, 0, 1.0, 0.0), &logits).unwrap();
        assert_eq!(ids(&d), [1, 3]);
        assert!(matches!(
            distribution(&params(1.0, 0, 1.0, 0.0), &[f32::NAN, f32::NEG_INFINITY]),
            Err(Error::NoCandidates)
        ));
    }

    #[test]
    fn positive_infinity_gets_all_the_mass() {
        let logits = [f32::INFINITY, 1.0, f32::INFINITY];
        let d = distribution(&params(1.0, 0, 1.0, 0.0), &logits).unwrap();
        assert_eq!(d.candidates(), [(0, 0.5), (2, 0.5)]);
    }

    #[test]
    fn sample_at_inverts_the_cdf() {
        let d = Distribution {
            candidates: vec![(7, 0.5), (3, 0.25), (9, 0.25)],
        };
        assert_eq!(d.sample_at(0.0), 7);
        assert_eq!(d.sample_at(0.4999), 7);
        assert_eq!(d.sample_at(0.5), 3);
        assert_eq!(d.sample_at(0.8), 9);
        assert_eq!(d.sample_at(1.0), 9);
        assert_eq!(d.prob(3), 0.25);
        assert_eq!(d.prob(4), 0.0);
    }
}
