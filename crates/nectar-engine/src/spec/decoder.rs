//! The speculative driver: draft, verify in one batched forward, keep the
//! longest accepted prefix, roll the caches back exactly.

use super::auto::AutoGamma;
use super::drafter::{Drafter, Proposals};
use super::stats::SpecStats;
use super::MAX_DRAFT;
use crate::error::{Error, Result};
use crate::request::Request;
use crate::request_state::{RequestState, Step};
use crate::tokenizer::Tokenizer;
use nectar_model::{Glm5, NoObserver, SeqCache, SeqStep};
use std::time::Instant;

/// What one [`SpecDecoder::round`] produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// The tokens that became output, in order: any tokens the grammar
    /// forced, then the prefill's first token, or the accepted drafts then
    /// the correction or bonus token.
    pub steps: Vec<Step>,
    /// Drafts the main model checked this round.
    pub drafted: usize,
    /// Drafts it accepted.
    pub accepted: usize,
}

/// One request decoded speculatively on its own cache.
///
/// Each round after the prefill: the drafter proposes up to γ tokens after
/// the last accepted token x; one main forward runs `[x, d1..dγ]` (γ + 1 ≤
/// 4 rows, so attention takes the same absorbed path as single-token
/// decoding and every row's logits are bit-identical to plain decoding's);
/// [`RequestState::verify`] keeps the longest accepted prefix plus one
/// token; the main cache is truncated to exactly the kept rows and the
/// drafter is told which rows were kept. With greedy sampling the output is
/// therefore token-identical to plain decoding.
///
/// Structured output: drafts are drawn and checked under the grammar
/// ([`Proposals`]), verification samples each row under its mask, and the
/// grammar advances only over kept tokens. Tokens the grammar forces are
/// emitted at the start of a round ([`RequestState::fast_forward`]); that
/// round then drafts nothing and runs the pending tokens in one forward,
/// exactly as plain decoding does, so greedy output still matches it.
pub struct SpecDecoder<'a> {
    model: &'a Glm5,
    tokenizer: Option<&'a Tokenizer>,
    state: RequestState,
    cache: SeqCache,
    drafter: Option<Box<dyn Drafter + 'a>>,
    gamma: usize,
    auto: Option<AutoGamma>,
    prefilled: bool,
    c: Counters,
}

#[derive(Debug, Default)]
struct Counters {
    main_forwards: usize,
    spec_rounds: usize,
    drafted: usize,
    accepted: usize,
    tried_at: Vec<usize>,
    accepted_at: Vec<usize>,
    draft_secs: f64,
    verify_secs: f64,
}

impl<'a> SpecDecoder<'a> {
    /// Prepares `request` (validated as for plain decoding) with `drafter`
    /// proposing up to `gamma` tokens a round (at most [`MAX_DRAFT`]); with
    /// `auto`, γ is chosen in 0..=gamma by measurement. Without a drafter
    /// every round is a plain decoding step.
    pub fn new(
        model: &'a Glm5,
        tokenizer: Option<&'a Tokenizer>,
        stop_ids: &[u32],
        request: &Request,
        drafter: Option<Box<dyn Drafter + 'a>>,
        gamma: usize,
        auto: bool,
    ) -> Result<SpecDecoder<'a>> {
        check_gamma(gamma)?;
        if drafter.is_some() && gamma == 0 {
            return Err(Error::InvalidParam {
                param: "draft_tokens",
                reason: "a drafter needs at least 1 draft per round".into(),
            });
        }
        let state = RequestState::new(request, stop_ids, model.vocab_size(), tokenizer)?;
        Ok(SpecDecoder {
            model,
            tokenizer,
            state,
            cache: model.new_cache(),
            drafter,
            gamma,
            auto: auto.then(|| AutoGamma::new(gamma)),
            prefilled: false,
            c: Counters {
                tried_at: vec![0; gamma],
                accepted_at: vec![0; gamma],
                ..Counters::default()
            },
        })
    }

    /// Continues from `cache`, which holds the first `cache.len()` prompt
    /// tokens (a session's reused prefix) and, for an MTP drafter, exactly as
    /// many MTP rows: only the rest of the prompt runs in the prefill. Before
    /// the first round only.
    pub fn with_cache(mut self, cache: SeqCache) -> Result<Self> {
        if self.prefilled {
            return Err(Error::Request(
                "a cache can only be given before the prefill".into(),
            ));
        }
        self.state.skip_cached(cache.len())?;
        self.cache = cache;
        Ok(self)
    }

    /// The caches, holding every token of the request but the last one
    /// generated (rows of rejected drafts are rolled back in every round,
    /// the last included).
    pub fn into_cache(self) -> SeqCache {
        self.cache
    }

    /// True once the request has finished.
    pub fn finished(&self) -> bool {
        self.state.finished().is_some()
    }

    /// The consumer wants no more.
    pub fn cancel(&mut self) {
        self.state.cancel();
    }

    /// The request's state (tokens, finish reason, sampler).
    pub fn state(&self) -> &RequestState {
        &self.state
    }

    /// The request's caches (main layers and MTP layer).
    pub fn cache(&self) -> &SeqCache {
        &self.cache
    }

    /// The drafter's name, `"off"` without one.
    pub fn mode(&self) -> &'static str {
        self.drafter.as_ref().map_or("off", |d| d.name())
    }

    /// Runs the prefill (the first call) or one speculative round, after
    /// emitting any tokens the grammar forces.
    pub fn round(&mut self) -> Result<Round> {
        if self.finished() {
            return Err(Error::Request("the request has already finished".into()));
        }
        let mut steps = self.state.fast_forward(self.tokenizer)?;
        let mut round = if self.finished() {
            Round {
                steps: Vec::new(),
                drafted: 0,
                accepted: 0,
            }
        } else if !self.prefilled || !steps.is_empty() {
            self.run_pending()?
        } else {
            self.speculate()?
        };
        steps.append(&mut round.steps);
        round.steps = steps;
        Ok(round)
    }

    /// One round: draft, verify, keep the accepted prefix.
    fn speculate(&mut self) -> Result<Round> {
        let (model, hd) = (self.model, self.model.hidden_size());
        let n = self.cache.len();
        let last = match self.state.pending_input() {
            Some(&[t]) if self.state.history().tokens().len() == n + 1 => t,
            _ => {
                return Err(Error::Speculation(format!(
                    "the main cache holds {n} rows but the request has {} tokens",
                    self.state.history().tokens().len()
                )))
            }
        };
        let (generated, max_tokens) = self.state.budget();
        // Drafts past `max_tokens` could never be kept.
        let room = max_tokens.saturating_sub(generated + 1);
        let want = match &self.drafter {
            None => 0,
            Some(_) => self.auto.as_ref().map_or(self.gamma, AutoGamma::next),
        }
        .min(room);
        let t0 = Instant::now();
        let (mut absorbed, mut absorb_secs) = (0, 0.0);
        let (drafts, q) = match self.drafter.as_mut() {
            Some(d) if want > 0 => {
                absorbed = d.prepare(model, &mut self.cache)?;
                absorb_secs = t0.elapsed().as_secs_f64();
                let mut p = Proposals::new(&mut self.state, want);
                d.draft(model, &mut self.cache, &mut p)?;
                p.finish()
            }
            _ => (Vec::new(), Vec::new()),
        };
        let t1 = Instant::now();
        let mut input = Vec::with_capacity(drafts.len() + 1);
        input.push(last);
        input.extend_from_slice(&drafts);
        let h = model.forward(
            &mut [SeqStep {
                cache: &mut self.cache,
                tokens: &input,
            }],
            &mut NoObserver,
        )?;
        let logits = model.logits(&h)?;
        let v = self.state.verify(&logits, &drafts, &q, self.tokenizer)?;
        {
            // Roll back exactly: keep x and the accepted drafts (when the
            // request finished inside the run, the rows up to its last
            // token), so the cache stays a valid prefix to resume from.
            let kept = v.steps.len();
            self.cache.truncate(n + kept);
            let next: Vec<u32> = v.steps.iter().map(|s| s.token).collect();
            if let Some(d) = self.drafter.as_mut() {
                d.observe(&mut self.cache, &h[..kept * hd], &next)?;
            }
            let tokens = self.state.history().tokens().len();
            if self.cache.len() != n + kept || tokens != n + kept + 1 {
                return Err(Error::Speculation(format!(
                    "after keeping {kept} rows from {n}, the main cache holds {} rows and the \
                     request {tokens} tokens",
                    self.cache.len()
                )));
            }
        }
        let t2 = Instant::now();
        self.count(&drafts, v.accepted, t1 - t0, t2 - t1);
        if let Some(a) = self.auto.as_mut() {
            let secs = (t2 - t0).as_secs_f64() - absorb_secs;
            a.record(
                drafts.len(),
                v.accepted,
                secs,
                absorbed,
                absorb_secs,
                self.state.budget().0,
            );
        }
        Ok(Round {
            steps: v.steps,
            drafted: drafts.len(),
            accepted: v.accepted,
        })
    }

    /// Every pending token in one forward — the prompt (the prefill), or
    /// the last token and a forced run — and the next token from its last
    /// row, as plain decoding does; the drafter sees every row.
    fn run_pending(&mut self) -> Result<Round> {
        let hd = self.model.hidden_size();
        let pending = self.state.pending_input().unwrap_or_default().to_vec();
        let h = self.model.forward(
            &mut [SeqStep {
                cache: &mut self.cache,
                tokens: &pending,
            }],
            &mut NoObserver,
        )?;
        self.c.main_forwards += usize::from(self.prefilled);
        let logits = self.model.logits(&h[h.len() - hd..])?;
        let step = self.state.on_logits(&logits, None, self.tokenizer)?;
        self.prefilled = true;
        if let (false, Some(d)) = (self.finished(), self.drafter.as_mut()) {
            let mut next = pending[1..].to_vec();
            next.push(step.token);
            d.observe(&mut self.cache, &h, &next)?;
        }
        Ok(Round {
            steps: vec![step],
            drafted: 0,
            accepted: 0,
        })
    }

    fn count(
        &mut self,
        drafts: &[u32],
        accepted: usize,
        draft: std::time::Duration,
        verify: std::time::Duration,
    ) {
        let c = &mut self.c;
        c.main_forwards += 1;
        c.spec_rounds += usize::from(!drafts.is_empty());
        c.drafted += drafts.len();
        c.accepted += accepted;
        for j in 0..drafts.len().min(accepted + 1) {
            c.tried_at[j] += 1;
            c.accepted_at[j] += usize::from(j < accepted);
        }
        c.draft_secs += draft.as_secs_f64();
        c.verify_secs += verify.as_secs_f64();
    }

    /// Telemetry so far; `tokens` generated in `total_secs` end to end, of
    /// which `decode_secs` after the first token.
    pub fn stats(&self, tokens: usize, total_secs: f64, decode_secs: f64) -> SpecStats {
        let c = &self.c;
        let decoded = tokens.saturating_sub(1);
        let ratio = |a: usize, b: usize| if b > 0 { a as f64 / b as f64 } else { 0.0 };
        SpecStats {
            mode: self.mode(),
            schedule: if self.drafter.is_some() {
                "serial"
            } else {
                "off"
            },
            auto: self.auto.is_some(),
            gamma: self.gamma,
            final_gamma: self.auto.as_ref().map_or(self.gamma, AutoGamma::current),
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
            draft_forwards: self.drafter.as_ref().map_or(0, |d| d.forwards()),
            draft_seconds: c.draft_secs,
            verify_seconds: c.verify_secs,
            tok_s: tokens as f64 / total_secs.max(1e-9),
            decode_tok_s: decoded as f64 / decode_secs.max(1e-9),
            decisions: self
                .auto
                .as_ref()
                .map_or_else(Vec::new, |a| a.decisions().to_vec()),
        }
    }
}

impl std::fmt::Debug for SpecDecoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpecDecoder")
            .field("mode", &self.mode())
            .field("gamma", &self.gamma)
            .field("cache_len", &self.cache.len())
            .field("finished", &self.state.finished())
            .finish_non_exhaustive()
    }
}

/// γ + 1 verification rows must stay within the attention's single-token
/// (absorbed) path, whose rows are bit-identical to plain decoding
/// (`MlaMode::Auto` switches to the reconstructed form above 4 rows).
pub(crate) fn check_gamma(gamma: usize) -> Result<()> {
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
