//! The sampling knobs of one request, their defaults and their validation.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The most top-N alternatives a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// How one request turns logits into a token.
///
/// The defaults are **greedy**: with `temperature == 0` the sampler takes the
/// argmax (lowest id on ties) of the logits after bias and penalties, and the
/// truncation knobs and the seed have no effect. Every default below is the
/// neutral value of its knob, so a default `SamplingParams` reproduces plain
/// argmax decoding bit for bit.
///
/// Deserialises from JSON with every field optional; unknown fields are an
/// error, so a misspelt knob is never silently ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    /// Softmax temperature; `0` means greedy. Default `0`. Must be finite
    /// and `>= 0`.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables. Default `0`.
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest most-likely prefix whose
    /// probability reaches `top_p`. In `(0, 1]`; default `1` (disabled).
    pub top_p: f32,
    /// Keep tokens whose probability is at least `min_p` times the most likely
    /// token's. In `[0, 1]`; default `0` (disabled).
    pub min_p: f32,
    /// HF/llama.cpp repetition penalty: over the tokens seen (see
    /// `repetition_window`), positive logits are divided by it and negative
    /// ones multiplied. Finite and `> 0`; default `1` (disabled).
    pub repetition_penalty: f32,
    /// How far back `repetition_penalty` looks: `None` (default) means the
    /// whole prompt and output, `Some(n)` the last `n` tokens of them.
    pub repetition_window: Option<usize>,
    /// OpenAI presence penalty: subtracted once from the logit of every
    /// token that occurs in the generated output. In `[-2, 2]`; default `0`.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty: subtracted from a token's logit once per
    /// occurrence in the generated output. In `[-2, 2]`; default `0`.
    pub frequency_penalty: f32,
    /// Added to the logit of the given token ids before anything else.
    /// Values must be finite; ids must be in the vocabulary. JSON object
    /// keys are the ids as strings (`{"42": -100}`), as in OpenAI's API.
    pub logit_bias: BTreeMap<u32, f32>,
    /// Seed of the request's RNG. The same seed, prompt and parameters give
    /// the same tokens on every run and machine. `None` (default) draws a
    /// seed from the OS; the sampler reports the seed it used.
    pub seed: Option<u64>,
    /// Return the chosen token's log-probability and this many most likely
    /// alternatives (`0` = the chosen token's only). At most
    /// [`MAX_TOP_LOGPROBS`]; `None` (default) returns none.
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            repetition_window: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: BTreeMap::new(),
            seed: None,
            logprobs: None,
        }
    }
}

impl SamplingParams {
    /// True when the sampler takes the argmax instead of drawing.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// True when a penalty knob changes logits; lets the sampler skip the
    /// history scan (and keeps the greedy default a plain argmax).
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// Checks every knob's range. `vocab_size` bounds the `logit_bias` ids.
    /// The error names the first bad parameter.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        let bad = |param: &'static str, reason: String| Err(Error::InvalidParam { param, reason });
        let t = self.temperature;
        if !t.is_finite() || t < 0.0 {
            return bad("temperature", format!("{t} must be a finite number >= 0"));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return bad("top_p", format!("{p} is outside (0, 1]"));
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return bad("min_p", format!("{m} is outside [0, 1]"));
        }
        let r = self.repetition_penalty;
        if !r.is_finite() || r <= 0.0 {
            return bad(
                "repetition_penalty",
                format!("{r} must be a finite number > 0"),
            );
        }
        for (param, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(param, format!("{v} is outside [-2, 2]"));
            }
        }
        for (&id, &b) in &self.logit_bias {
            if id as usize >= vocab_size {
                return bad(
                    "logit_bias",
                    format!("token id {id} is outside the vocabulary (size {vocab_size})"),
                );
            }
            if !b.is_finite() {
                return bad(
                    "logit_bias",
                    format!("bias {b} for token {id} is not finite"),
                );
            }
        }
        if let Some(n) = self.logprobs {
            if n > MAX_TOP_LOGPROBS {
                return bad(
                    "logprobs",
                    format!("{n} alternatives asked, at most {MAX_TOP_LOGPROBS}"),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param_of(p: SamplingParams) -> &'static str {
        match p.validate(100) {
            Err(Error::InvalidParam { param, .. }) => param,
            other => panic!("expected InvalidParam, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid_and_greedy() {
        let p = SamplingParams::default();
        p.validate(1).unwrap();
        assert!(p.is_greedy());
        assert!(!p.has_penalties());
    }

    #[test]
    fn each_bad_value_names_its_parameter() {
        let d = SamplingParams::default;
        let cases = [
            (
                SamplingParams {
                    temperature: -0.1,
                    ..d()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    temperature: f32::NAN,
                    ..d()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    temperature: f32::INFINITY,
                    ..d()
                },
                "temperature",
            ),
            (SamplingParams { top_p: 0.0, ..d() }, "top_p"),
            (SamplingParams { top_p: 1.01, ..d() }, "top_p"),
            (
                SamplingParams {
                    top_p: f32::NAN,
                    ..d()
                },
                "top_p",
            ),
            (SamplingParams { min_p: -0.5, ..d() }, "min_p"),
            (SamplingParams { min_p: 1.5, ..d() }, "min_p"),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..d()
                },
                "repetition_penalty",
            ),
            (
                SamplingParams {
                    presence_penalty: 2.5,
                    ..d()
                },
                "presence_penalty",
            ),
            (
                SamplingParams {
                    frequency_penalty: -3.0,
                    ..d()
                },
                "frequency_penalty",
            ),
            (
                SamplingParams {
                    logprobs: Some(21),
                    ..d()
                },
                "logprobs",
            ),
            (
                SamplingParams {
                    logit_bias: [(100, 1.0)].into(),
                    ..d()
                },
                "logit_bias",
            ),
            (
                SamplingParams {
                    logit_bias: [(3, f32::NEG_INFINITY)].into(),
                    ..d()
                },
                "logit_bias",
            ),
        ];
        for (p, want) in cases {
            assert_eq!(param_of(p.clone()), want, "{p:?}");
        }
    }

    #[test]
    fn boundary_values_are_accepted() {
        let p = SamplingParams {
            temperature: 2.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 1.0,
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            logprobs: Some(MAX_TOP_LOGPROBS),
            logit_bias: [(99, -100.0)].into(),
            ..SamplingParams::default()
        };
        p.validate(100).unwrap();
    }

    #[test]
    fn deserialises_with_defaults_and_string_bias_keys() {
        let p: SamplingParams =
            serde_json::from_str(r#"{"temperature": 0.7, "logit_bias": {"42": -100}, "seed": 7}"#)
                .unwrap();
        assert_eq!(p.temperature, 0.7);
        assert_eq!(p.logit_bias[&42], -100.0);
        assert_eq!(p.seed, Some(7));
        assert_eq!(p.top_p, 1.0);
        assert!(serde_json::from_str::<SamplingParams>(r#"{"temprature": 1}"#).is_err());
    }
}
