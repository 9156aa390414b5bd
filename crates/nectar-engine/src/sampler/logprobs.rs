//! Log-probabilities of the chosen token and its most likely alternatives.

use serde::Serialize;

/// The chosen token's log-probability and the top-N alternatives.
///
/// Convention (OpenAI's): the log-softmax of the distribution the token was
/// drawn from **before truncation** — the processed logits (bias, penalties,
/// mask) divided by the temperature, over the whole vocabulary. Top-k/p and
/// min-p do not change it, so the numbers say how likely the model made each
/// token, not how the truncation happened to cut. Greedy requests use
/// temperature 1 here (a point mass would say nothing). Masked ids have
/// `-inf` and never appear among the alternatives.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Logprobs {
    /// Log-probability of the chosen token.
    pub logprob: f32,
    /// The most likely tokens, `(id, logprob)`, most likely first, lower id
    /// first on ties; as many as the request asked for (fewer when fewer ids
    /// are unmasked).
    pub top: Vec<(u32, f32)>,
}

/// Log-softmax of `processed / temperature` (temperature 1 when 0), in f64
/// for the reduction. NaN and `-inf` entries get `-inf`.
pub fn log_softmax(processed: &[f32], temperature: f32) -> Vec<f64> {
    let t = if temperature > 0.0 {
        f64::from(temperature)
    } else {
        1.0
    };
    let z = |l: f32| {
        if l.is_nan() {
            f64::NEG_INFINITY
        } else {
            f64::from(l) / t
        }
    };
    let max = processed
        .iter()
        .map(|&l| z(l))
        .fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        // Nothing finite to normalise against (all masked, or +inf present):
        // report what a limit would, without producing NaN.
        return processed
            .iter()
            .map(|&l| {
                if z(l) == max && max.is_finite() {
                    0.0
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
    }
    let sum: f64 = processed.iter().map(|&l| (z(l) - max).exp()).sum();
    let lse = max + sum.ln();
    processed.iter().map(|&l| z(l) - lse).collect()
}

/// The chosen token's log-probability and the `n` best alternatives.
pub fn logprobs(processed: &[f32], temperature: f32, token: u32, n: usize) -> Logprobs {
    let lp = log_softmax(processed, temperature);
    let chosen = lp.get(token as usize).copied().unwrap_or(f64::NEG_INFINITY);
    let mut top: Vec<(u32, f64)> = lp
        .iter()
        .enumerate()
        .filter(|&(_, &v)| v > f64::NEG_INFINITY)
        .map(|(i, &v)| (i as u32, v))
        .collect();
    let by_lp = |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if n > 0 && n < top.len() {
        top.select_nth_unstable_by(n - 1, by_lp);
    }
    top.truncate(n);
    top.sort_unstable_by(by_lp);
    Logprobs {
        logprob: chosen as f32,
        top: top.into_iter().map(|(id, v)| (id, v as f32)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_normalises() {
        let logits = [1.0f32, -2.0, 0.5, 3.0, f32::NEG_INFINITY];
        for t in [0.0, 0.3, 1.0, 2.0] {
            let lp = log_softmax(&logits, t);
            let total: f64 = lp.iter().map(|v| v.exp()).sum();
            assert!((total - 1.0).abs() < 1e-12, "t={t}: {total}");
            assert_eq!(lp[4], f64::NEG_INFINITY);
        }
    }

    #[test]
    fn top_alternatives_are_sorted_with_ties_to_lower_ids() {
        let logits = [1.0f32, 2.0, 2.0, 0.0, f32::NEG_INFINITY];
        let l = logprobs(&logits, 1.0, 3, 3);
        let ids: Vec<u32> = l.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 2, 0]);
        assert!(l.logprob < l.top[2].1);
        assert_eq!(logprobs(&logits, 1.0, 3, 0).top, []);
        // More asked than unmasked: the masked id is left out.
        assert_eq!(logprobs(&logits, 1.0, 3, 10).top.len(), 4);
    }

    #[test]
    fn temperature_is_part_of_the_distribution() {
        let logits = [0.0f32, 1.0];
        let l = logprobs(&logits, 0.5, 1, 0);
        let want = -(1.0 + (-2.0f64).exp()).ln();
        assert!((f64::from(l.logprob) - want).abs() < 1e-6);
    }

    #[test]
    fn degenerate_inputs_do_not_produce_nan() {
        let lp = log_softmax(&[f32::NEG_INFINITY, f32::NAN], 1.0);
        assert!(lp.iter().all(|v| *v == f64::NEG_INFINITY));
        let lp = log_softmax(&[f32::INFINITY, 1.0], 1.0);
        assert!(lp.iter().all(|v| !v.is_nan()));
    }
}
