//! Logit processing before the distribution: bias, penalties, the allowed mask.

use super::history::TokenHistory;
use super::params::SamplingParams;
use crate::error::{Error, Result};

/// Applies, in this order, to a copy of `logits` (one per vocabulary id):
///
/// 1. `logit_bias` — added to the listed ids;
/// 2. `repetition_penalty` — over the distinct tokens of the prompt and
///    output (or their last `repetition_window`): a positive logit is divided
///    by the penalty, a negative one multiplied (HF `RepetitionPenalty`,
///    llama.cpp `penalty_repeat`), once per distinct token;
/// 3. `presence_penalty` and `frequency_penalty` — over the generated tokens:
///    `logit -= presence · [count > 0] + frequency · count` (OpenAI);
/// 4. `allowed` — ids whose entry is `false` get `-inf`. This is the hook for
///    structured output: a grammar supplies the mask of ids that keep the
///    output valid.
///
/// Bias comes first so that a bias is scaled by the repetition penalty like
/// the model's own logit would be. Every neutral knob leaves the logits
/// bit-identical, so the greedy default is a plain argmax of the model's
/// logits.
pub fn process_logits(
    params: &SamplingParams,
    logits: &[f32],
    history: &TokenHistory,
    allowed: Option<&[bool]>,
) -> Result<Vec<f32>> {
    let mut out = logits.to_vec();
    for (&id, &bias) in &params.logit_bias {
        if let Some(l) = out.get_mut(id as usize) {
            *l += bias;
        }
    }
    let rp = params.repetition_penalty;
    if rp != 1.0 {
        for id in history.recent_distinct(params.repetition_window) {
            if let Some(l) = out.get_mut(id as usize) {
                *l = if *l > 0.0 { *l / rp } else { *l * rp };
            }
        }
    }
    let (pp, fp) = (params.presence_penalty, params.frequency_penalty);
    if pp != 0.0 || fp != 0.0 {
        for (&id, &count) in history.generated_counts() {
            if let Some(l) = out.get_mut(id as usize) {
                *l -= pp + fp * count as f32;
            }
        }
    }
    if let Some(mask) = allowed {
        if mask.len() != out.len() {
            return Err(Error::ShapeMismatch {
                what: "allowed mask",
                expected: out.len(),
                found: mask.len(),
            });
        }
        for (l, &ok) in out.iter_mut().zip(mask) {
            if !ok {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(p: &SamplingParams, logits: &[f32], h: &TokenHistory) -> Vec<f32> {
        process_logits(p, logits, h, None).unwrap()
    }

    #[test]
    fn neutral_params_are_bit_identical() {
        let logits = [1.5, -0.0, 0.0, -3.25, f32::NAN, 1e30];
        let mut h = TokenHistory::new(&[0, 1, 2, 3]);
        h.push(5);
        let out = run(&SamplingParams::default(), &logits, &h);
        for (a, b) in logits.iter().zip(&out) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
    }

    #[test]
    fn logit_bias_adds() {
        let p = SamplingParams {
            logit_bias: [(1, 2.0), (2, -100.0)].into(),
            ..SamplingParams::default()
        };
        assert_eq!(
            run(&p, &[0.0, 1.0, 3.0], &TokenHistory::new(&[])),
            [0.0, 3.0, -97.0]
        );
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::default()
        };
        // Token 0 appears twice in the prompt: still penalised once.
        let mut h = TokenHistory::new(&[0, 0, 1]);
        h.push(2);
        let out = run(&p, &[4.0, -4.0, 1.0, 4.0], &h);
        assert_eq!(out, [2.0, -8.0, 0.5, 4.0]);
    }

    #[test]
    fn repetition_window_limits_the_scope() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            repetition_window: Some(2),
            ..SamplingParams::default()
        };
        let mut h = TokenHistory::new(&[0, 1]);
        h.push(2);
        // Window = last two tokens [1, 2]; token 0 is out of it.
        assert_eq!(run(&p, &[4.0, 4.0, 4.0], &h), [4.0, 2.0, 2.0]);
    }

    #[test]
    fn presence_and_frequency_use_generated_tokens_only() {
        let p = SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..SamplingParams::default()
        };
        let mut h = TokenHistory::new(&[0, 0, 0]);
        for t in [1, 1, 1, 2] {
            h.push(t);
        }
        let out = run(&p, &[1.0, 1.0, 1.0, 1.0], &h);
        // token 0: prompt only, untouched; 1: 0.5 + 3·0.25; 2: 0.5 + 0.25.
        assert_eq!(out, [1.0, 1.0 - 1.25, 1.0 - 0.75, 1.0]);
    }

    #[test]
    fn bias_is_applied_before_the_repetition_penalty() {
        let p = SamplingParams {
            logit_bias: [(0, 2.0)].into(),
            repetition_penalty: 2.0,
            ..SamplingParams::default()
        };
        assert_eq!(run(&p, &[2.0], &TokenHistory::new(&[0])), [2.0]);
    }

    #[test]
    fn mask_sets_minus_infinity_and_checks_length() {
        let p = SamplingParams::default();
        let h = TokenHistory::new(&[]);
        let out = process_logits(&p, &[1.0, 2.0, 3.0], &h, Some(&[true, false, true])).unwrap();
        assert_eq!(out, [1.0, f32::NEG_INFINITY, 3.0]);
        let err = process_logits(&p, &[1.0, 2.0], &h, Some(&[true])).unwrap_err();
        assert!(
            matches!(
                err,
                Error::ShapeMismatch {
                    expected: 2,
                    found: 1,
                    ..
                }
            ),
            "{err}"
        );
    }
}
