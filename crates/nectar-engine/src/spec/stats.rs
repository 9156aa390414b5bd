//! Speculation telemetry: what drafting cost and what it saved.

use super::auto::AutoDecision;
use super::union::UnionStats;
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
    /// How speculation was scheduled: `"batch"` (drafts verified inside the
    /// batch step, beside the other rows) or `"off"`. A scheduler that cannot
    /// speculate must say `"off"` here rather than claim a mode it silently
    /// dropped.
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
    /// Mean drafts asked for per decode step (the γ in force on average; `auto` moves it).
    pub mean_gamma: f64,
    /// End to end: generated tokens over prefill plus decode time.
    pub tok_s: f64,
    /// Decode only: tokens after the first over the decode time.
    pub decode_tok_s: f64,
    /// The batch's `auto` decisions taken while this row was live, one per window of a step
    /// shape (a repeated decision extends its entry).
    pub decisions: Vec<AutoDecision>,
    /// The expert union of the decode steps this row took part in: mean distinct experts per
    /// MoE layer per step with drafts against the same steps' plain rows, and without drafts.
    pub expert_union: UnionStats,
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
            mean_gamma: 0.0,
            tok_s,
            decode_tok_s,
            decisions: Vec::new(),
            expert_union: UnionStats::default(),
        }
    }
}

/// A speculating row's running counts, turned into [`SpecStats`] when it ends.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpecCounters {
    /// Main forwards (batch steps) the row took part in after its prefill.
    pub main_forwards: usize,
    /// Steps that verified at least one of the row's drafts.
    pub spec_rounds: usize,
    pub drafted: usize,
    pub accepted: usize,
    /// Per draft depth j: j-th drafts checked, and accepted.
    pub tried_at: Vec<usize>,
    pub accepted_at: Vec<usize>,
    /// MTP forwards the row took part in (absorption and chained drafting).
    pub draft_forwards: usize,
    pub draft_secs: f64,
    pub verify_secs: f64,
    /// Sum of the depth asked for at each decode step (its mean is the γ in force).
    pub gamma_sum: usize,
}

impl SpecCounters {
    pub fn new(gamma: usize) -> SpecCounters {
        SpecCounters {
            tried_at: vec![0; gamma],
            accepted_at: vec![0; gamma],
            ..SpecCounters::default()
        }
    }

    /// One decode step that asked for `want` drafts, verified `drafted` and accepted `accepted`.
    pub fn round(&mut self, want: usize, drafted: usize, accepted: usize) {
        self.main_forwards += 1;
        self.gamma_sum += want;
        self.spec_rounds += usize::from(drafted > 0);
        self.drafted += drafted;
        self.accepted += accepted;
        for j in 0..drafted.min(accepted + 1).min(self.tried_at.len()) {
            self.tried_at[j] += 1;
            self.accepted_at[j] += usize::from(j < accepted);
        }
    }
}

/// What `auto` did for a row: the depth in force at its end and the decisions while it lived.
#[derive(Debug, Clone, Default)]
pub(crate) struct AutoRow {
    pub final_gamma: usize,
    pub decisions: Vec<AutoDecision>,
}

/// The figures of a speculating row that generated `tokens` in `total_secs` end to end, of
/// which `decode_secs` after the first token.
pub(crate) fn row_stats(
    mode: &'static str,
    auto: Option<AutoRow>,
    gamma: usize,
    c: &SpecCounters,
    tokens: usize,
    total_secs: f64,
    decode_secs: f64,
) -> SpecStats {
    let decoded = tokens.saturating_sub(1);
    let ratio = |a: usize, b: usize| if b > 0 { a as f64 / b as f64 } else { 0.0 };
    SpecStats {
        mode,
        schedule: "batch",
        auto: auto.is_some(),
        gamma,
        final_gamma: auto.as_ref().map_or(gamma, |a| a.final_gamma),
        drafted: c.drafted,
        accepted: c.accepted,
        acceptance_rate: ratio(c.accepted, c.drafted),
        acceptance_by_depth: c
            .tried_at
            .iter()
            .zip(&c.accepted_at)
            .map(|(&t, &a)| ratio(a, t))
            .collect(),
        checked_by_depth: c.tried_at.clone(),
        main_forwards: c.main_forwards,
        spec_rounds: c.spec_rounds,
        tokens_per_forward: ratio(decoded, c.main_forwards),
        forwards_saved: decoded.saturating_sub(c.main_forwards),
        draft_forwards: c.draft_forwards,
        draft_seconds: c.draft_secs,
        verify_seconds: c.verify_secs,
        mean_gamma: if c.main_forwards > 0 {
            c.gamma_sum as f64 / c.main_forwards as f64
        } else {
            0.0
        },
        tok_s: tokens as f64 / total_secs.max(1e-9),
        decode_tok_s: decoded as f64 / decode_secs.max(1e-9),
        decisions: auto.map_or_else(Vec::new, |a| a.decisions),
        expert_union: UnionStats::default(),
    }
}
