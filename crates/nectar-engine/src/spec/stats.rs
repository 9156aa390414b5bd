//! Speculation telemetry: what drafting cost and what it saved.

use super::auto::AutoDecision;
use serde::Serialize;

/// What speculation did over one generation (`"mtp"` in `nectar run --json`).
///
/// "Forwards" are main-model forwards after the prefill: plain decoding
/// needs one per token after the first, so `tokens_per_forward` is 1 and
/// `forwards_saved` 0 without speculation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpecStats {
    /// `"off"`, `"mtp"` or `"prompt-lookup"` — what actually ran.
    pub mode: &'static str,
    /// How speculation was scheduled: `"serial"` (one request, drafts then
    /// verification) or `"off"`. A scheduler that cannot speculate must say
    /// `"off"` here rather than claim a mode it silently dropped.
    pub schedule: &'static str,
    /// True when `auto` chose the depth.
    pub auto: bool,
    /// The configured draft depth γ (the maximum for `auto`; 0 when off).
    pub gamma: usize,
    /// The depth in force at the end (`auto` changes it).
    pub final_gamma: usize,
    /// Drafts checked by the main model.
    pub drafted: usize,
    /// Drafts accepted.
    pub accepted: usize,
    /// `accepted / drafted` (0 when nothing was drafted).
    pub acceptance_rate: f64,
    /// Per draft depth j: the share of j-th drafts accepted among those
    /// checked (a j-th draft is checked only when the ones before it were
    /// accepted).
    pub acceptance_by_depth: Vec<f64>,
    /// Per draft depth j: how many j-th drafts were checked.
    pub checked_by_depth: Vec<usize>,
    /// Main-model forwards after the prefill (verification rounds and plain
    /// steps).
    pub main_forwards: usize,
    /// Rounds that verified at least one draft.
    pub spec_rounds: usize,
    /// Generated tokens after the first per main forward.
    pub tokens_per_forward: f64,
    /// Main forwards plain decoding would have needed, minus those run.
    pub forwards_saved: usize,
    /// Forwards of the draft model (MTP layer calls; 0 for prompt lookup).
    pub draft_forwards: usize,
    /// Seconds spent drafting (MTP absorption included).
    pub draft_seconds: f64,
    /// Seconds spent in main forwards, logits and verification.
    pub verify_seconds: f64,
    /// End to end: generated tokens over prefill plus decode time.
    pub tok_s: f64,
    /// Decode only: tokens after the first over the decode time.
    pub decode_tok_s: f64,
    /// The `auto` controller's decisions, one per window.
    pub decisions: Vec<AutoDecision>,
}

impl SpecStats {
    /// The figures of a plain (non-speculative) run of `tokens` tokens.
    pub fn plain(tokens: usize, tok_s: f64, decode_tok_s: f64) -> SpecStats {
        let forwards = tokens.saturating_sub(1);
        SpecStats {
            mode: "off",
            schedule: "off",
            auto: false,
            gamma: 0,
            final_gamma: 0,
            drafted: 0,
            accepted: 0,
            acceptance_rate: 0.0,
            acceptance_by_depth: Vec::new(),
            checked_by_depth: Vec::new(),
            main_forwards: forwards,
            spec_rounds: 0,
            tokens_per_forward: if forwards > 0 { 1.0 } else { 0.0 },
            forwards_saved: 0,
            draft_forwards: 0,
            draft_seconds: 0.0,
            verify_seconds: 0.0,
            tok_s,
            decode_tok_s,
            decisions: Vec::new(),
        }
    }
}
