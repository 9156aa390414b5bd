//! Speculative decoding: draft several tokens cheaply, verify them with the
//! main model in one forward, keep the longest prefix the target agrees with.
//!
//! Two providers, exactly one per request ([`Speculator`]): the model's own
//! MTP head ([`MtpDrafter`]) and prompt lookup ([`PromptLookup`], n-gram
//! matches in the context, model-free). The driver is the batch
//! ([`crate::Batch`]): each row has its own provider, depth and rollback, and
//! one main forward verifies every row's drafts beside the other rows'
//! tokens; this module holds the pieces it uses — verification
//! ([`crate::RequestState::verify`]: exact match when greedy, coupled with the
//! position-keyed draw for a seeded sampled request, standard rejection sampling otherwise), the MTP drafting of many rows at once, `auto`, telemetry.
//!
//! Guarantees: greedy output is token-identical to plain decoding (the
//! verify rows' logits are bit-identical to single-token decoding because
//! γ + 1 ≤ 4 rows stay on the absorbed attention path and every kernel's
//! per-row result is independent of the batch); a seeded sampled request's
//! output is token-identical to its plain decoding too (the choice at each
//! position is keyed by the seed and the position, and verification accepts a
//! draft exactly when it is that choice), under `on`, `auto`, any provider and
//! any batch; an unseeded sampled request has exactly the plain decoding
//! distribution (rejection sampling); stops inside an accepted run end the
//! output where plain decoding would. `auto` ([`AutoGamma`], one per batch) chooses the
//! step's γ from measured acceptance and the measured cost of steps of its shape, for the
//! step's tokens per second over all rows, γ = 0 being plain decoding; [`UnionMeter`] counts
//! how much the drafts widen the step's expert union.

mod auto;
mod drafter;
mod lookup;
mod mtp;
mod stats;
mod union;
mod verify;

pub use auto::{AutoDecision, AutoGamma, RowRound, Shape, StepSample, WINDOW as AUTO_WINDOW};
pub use drafter::{Drafter, Proposals};
pub use lookup::{lookup, PromptLookup};
pub(crate) use mtp::{draft_together, MtpRow};
pub use mtp::{MtpDrafter, ABSORB_WINDOW as MTP_ABSORB_WINDOW};
pub use stats::SpecStats;
pub(crate) use stats::{row_stats, AutoRow, SpecCounters};
pub use union::{StepUnion, UnionCounts, UnionMeter, UnionStats};
pub use verify::{verify_coupled, verify_draft, Verdict};

use crate::error::{Error, Result};

/// The most drafts a round may verify: γ + 1 verification rows must stay on
/// the attention's single-token path (`MlaMode::Auto` uses it up to 4 rows),
/// whose rows are bit-identical to plain decoding.
pub const MAX_DRAFT: usize = 3;

/// The default draft depth γ of MTP `on` (`--draft-tokens`), chosen by
/// measurement on the demo model (`benchmarks/RESULTS.md`, "MTP (demo
/// model)"): on an idle CPU the demo is compute-bound, a verification row
/// costs almost a full forward and a draft step a third of one, so γ = 1
/// (1.01× plain) beat γ = 2 (0.94×) and γ = 3 (0.87×). `auto` and prompt
/// lookup (free drafts) default to [`MAX_DRAFT`].
pub const DEFAULT_DRAFT_TOKENS: usize = 1;

/// Who drafts for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speculator {
    /// The model's MTP head, `gamma` drafts per round (chained).
    Mtp {
        /// Drafts per round, 1..=[`MAX_DRAFT`].
        gamma: usize,
    },
    /// Prompt lookup: the tokens after the latest earlier occurrence of the
    /// last `ngram` tokens, at most `max_draft` per round.
    PromptLookup {
        /// n-gram length to match (≥ 1).
        ngram: usize,
        /// Drafts per round at most, 1..=[`MAX_DRAFT`].
        max_draft: usize,
    },
}

/// A request's speculation: the provider and whether `auto` chooses the
/// depth (in 0..=the provider's maximum; 0 is plain decoding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speculation {
    /// Who drafts.
    pub speculator: Speculator,
    /// Choose the depth by measurement.
    pub auto: bool,
}

impl Speculation {
    /// The maximum drafts per round.
    pub fn max_draft(&self) -> usize {
        match self.speculator {
            Speculator::Mtp { gamma } => gamma,
            Speculator::PromptLookup { max_draft, .. } => max_draft,
        }
    }

    /// Checks the depth and the n-gram length; the error names the knob.
    pub fn validate(&self) -> Result<()> {
        let g = self.max_draft();
        if g == 0 {
            return Err(Error::InvalidParam {
                param: "draft_tokens",
                reason: "must be at least 1 (turn speculation off instead)".into(),
            });
        }
        check_gamma(g)?;
        if let Speculator::PromptLookup { ngram: 0, .. } = self.speculator {
            return Err(Error::InvalidParam {
                param: "prompt_lookup",
                reason: "the n-gram length must be at least 1".into(),
            });
        }
        Ok(())
    }
}

/// γ + 1 verification rows must stay within the attention's single-token
/// (absorbed) path, whose rows are bit-identical to plain decoding
/// (`MlaMode::Auto` switches to the reconstructed form above 4 rows of one
/// sequence).
fn check_gamma(gamma: usize) -> Result<()> {
    if gamma > MAX_DRAFT {
        return Err(Error::InvalidParam {
            param: "draft_tokens",
            reason: format!(
                "{gamma} drafts per round; at most {MAX_DRAFT} (verification must stay on the \
                 single-token attention path so output is unchanged)"
            ),
        });
    }
    Ok(())
}
