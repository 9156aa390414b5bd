//! Continuous batching with speculative decoding: the engine's one decode driver.
//!
//! A [`Batch`] holds the live rows — each a [`RequestState`] (its own sampler, stops, text), its
//! own [`SeqCache`] and, when it speculates, its own draft provider, depth γ and counters — and
//! [`Batch::step`] advances the rows inside a prompt layer-major (below) and runs every other
//! row's tokens through **one** `Glm5::forward`: plain decode tokens and speculative
//! verification runs (`[last, d1..dγ]`) side by side, ragged.
//! Because the model's expert batch-union spans every row of a forward, each routed expert a
//! step needs — for any row or draft position — is read (or found resident) once per layer.
//! Rows join ([`Batch::admit`]) and leave ([`Batch::remove`], or by finishing) between steps.
//! `nectar run` is a batch of one ([`crate::generate`] and friends are thin wrappers).
//!
//! A step: (1) tokens a row's grammar forces are emitted; (2) every speculating row at a
//! decode boundary drafts up to its γ (0 allowed; for `auto` rows the batch's one controller
//! chooses the step's γ from pooled acceptance and the measured cost of steps of this shape,
//! for the step's tokens per second over all rows — `spec::auto`): prompt-lookup rows on
//! their own, MTP rows together in one MTP forward per depth; (3) one main forward, whose
//! expert union per layer a [`UnionMeter`] counts with and without the draft positions; (4)
//! one lm-head call over every row that needs logits; (5) each row samples, or verifies its
//! drafts ([`RequestState::verify`]) and rolls its caches back to exactly the kept rows.
//!
//! Row independence is what makes this safe to serve: the kernels' output for a row does not
//! depend on how many rows share the matmul, attention runs per sequence — and chooses its form
//! per sequence, so a verification run of γ + 1 ≤ 4 rows stays on the absorbed path whatever
//! other rows share the forward — and the MoE sums each row's experts in a fixed order. So a
//! row's tokens are the same whether it decodes alone or beside others, speculating or not
//! (tested under greedy decoding).
//!
//! **Prefill is layer-major.** A row's input of more than one token (a prompt, or a grammar's
//! forced run) does not ride in the main forward: it runs as a [`Prefill`] span, layer by layer
//! over all its tokens, its residual stream kept between steps, so each layer's MoE runs once
//! over the union of the whole span's routes and a routed expert is read (or found resident)
//! once per layer for the whole prompt — where feeding 512-token chunks through the main
//! forward re-read each chunk's union (3.67× one read of every touched expert for a 2,048-token
//! prompt on the GLM-5.2-geometry synth, `benchmarks/RESULTS.md`). A span is the whole input,
//! or [`BatchOptions::prefill_span`] tokens of it when its activations would not fit (the
//! server takes [`Glm5::prefill_span`]: what the memory plan reserves); a longer input runs as
//! consecutive spans. Each step runs at most `W = prefill_chunk × layers` token-layers of
//! prefill, oldest row first, and always at least one layer of the oldest span, so a step's
//! prefill work is at most `max(W, span)` token-layers — with the default `prefill_chunk` of
//! 512, what one 512-token chunk through every layer cost — and the rows already decoding
//! produce a token every step while a prompt of `P` tokens joins over about `P × layers / W`
//! steps. The spans depend only on the row itself, never on its neighbours, and running a span's
//! layers over several steps computes the same bits as one forward over it.

use crate::error::{Error, Result};
use crate::prefix_cache::{PrefixCache, PrefixCacheStats};
use crate::request::{FinishReason, Request, StopCause};
use crate::request_state::{RequestState, Step};
use crate::sampler::Distribution;
use crate::spec::{
    draft_together, row_stats, AutoGamma, AutoRow, Drafter, MtpDrafter, MtpRow, PromptLookup,
    Proposals, RowRound, Shape, SpecCounters, SpecStats, Speculation, Speculator, StepSample,
    StepUnion, UnionCounts, UnionMeter,
};
use crate::tokenizer::Tokenizer;
use nectar_model::{Glm5, NoObserver, Observer, Prefill, SeqCache, SeqStep};
use std::time::{Duration, Instant};

/// Default prompt tokens' worth of prefill work per step (see [`BatchOptions::prefill_chunk`]).
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// How a [`Batch`] steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchOptions {
    /// Rows at most ([`Batch::admit`] refuses more).
    pub max_rows: usize,
    /// Prefill work per step, in prompt tokens through every main layer: a step runs at most
    /// `prefill_chunk × layers` token-layers of prompt (and always one layer of the oldest
    /// prompt span, see the module docs).
    pub prefill_chunk: usize,
    /// Tokens at most that run layer-major together (one span, whose activations — `hidden`
    /// floats per token between steps, a layer's transients while it runs — are held); a longer
    /// input runs as consecutive spans, each reading its experts once per layer.
    /// `nectar serve` takes [`Glm5::prefill_span`]; `usize::MAX` runs any prompt as one span.
    pub prefill_span: usize,
    /// Keep finished conversations' caches, up to this many tokens in all, so a request that
    /// continues one runs only its new tokens (see [`PrefixCache`]); 0 keeps none.
    pub keep_tokens: usize,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            max_rows: 1,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            prefill_span: usize::MAX,
            keep_tokens: 0,
        }
    }
}

/// How one row joins a batch ([`Batch::admit_row`]).
#[derive(Default)]
pub struct RowOptions {
    /// Speculate: the provider, its depth and whether `auto` chooses the depth.
    pub speculation: Option<Speculation>,
    /// A caller's own draft provider (replaces the one `speculation` names; its depth and
    /// `auto` still apply).
    pub drafter: Option<Box<dyn Drafter + Send>>,
    /// Start from this cache, which holds the first `cache.len()` prompt tokens (a session's
    /// reused prefix; with MTP drafting also as many MTP rows, else the main cache is cut back
    /// to them).
    pub cache: Option<SeqCache>,
    /// When the row finishes, hold its cache for [`Batch::take_cache`] instead of keeping it
    /// for a continuing request.
    pub hold_cache: bool,
}

impl std::fmt::Debug for RowOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowOptions")
            .field("speculation", &self.speculation)
            .field("drafter", &self.drafter.as_ref().map(|d| d.name()))
            .field("cache", &self.cache.as_ref().map(SeqCache::len))
            .field("hold_cache", &self.hold_cache)
            .finish()
    }
}

/// Who drafts for a row.
enum Provider {
    /// The model's MTP head: drafts with the other MTP rows in one forward per depth.
    Mtp(MtpDrafter),
    /// A per-row drafter (prompt lookup, or a caller's).
    Own(Box<dyn Drafter + Send>),
}

/// A speculating row's drafting state.
struct RowSpec {
    provider: Provider,
    gamma: usize,
    /// `auto` chooses the depth: the batch controller's decision count when the row joined,
    /// and its choice for the shape of the row's latest step.
    auto: Option<(usize, usize)>,
    c: SpecCounters,
}

impl RowSpec {
    fn mode(&self) -> &'static str {
        match &self.provider {
            Provider::Mtp(_) => "mtp",
            Provider::Own(d) => d.name(),
        }
    }
}

/// One live request.
struct Row {
    id: u64,
    state: RequestState,
    cache: SeqCache,
    /// Tokens of the current pending input already fed (completed prefill spans).
    fed_in_input: usize,
    /// The prefill span in flight (its residual stream between steps).
    prefill: Option<Prefill>,
    prompt_tokens: usize,
    admitted: Instant,
    first_token: Option<Instant>,
    spec: Option<RowSpec>,
    hold: bool,
    /// Prompt tokens the starting cache held.
    cached: usize,
    /// The expert union of the decode steps the row took part in.
    union: UnionCounts,
}

impl Row {
    /// The row's input is a prompt still running (several tokens, or a span already fed):
    /// its step runs prefill work.
    fn prefilling(&self) -> bool {
        self.fed_in_input > 0 || self.state.pending_input().is_some_and(|p| p.len() > 1)
    }
}

impl std::fmt::Debug for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Row")
            .field("id", &self.id)
            .field("cache_len", &self.cache.len())
            .field("spec", &self.spec.as_ref().map(|s| (s.mode(), s.gamma)))
            .finish_non_exhaustive()
    }
}

/// What one row produced in a step.
#[derive(Debug, Clone, PartialEq)]
pub struct RowStep {
    /// The row's id (as given to [`Batch::admit`]).
    pub id: u64,
    /// The step: its token, text, logprobs; `finished` is set on the row's last step, after
    /// which the row has left the batch.
    pub step: Step,
    /// Set with the last step: the row's totals.
    pub summary: Option<RowSummary>,
}

/// A finished (or removed) row's totals.
#[derive(Debug, Clone, PartialEq)]
pub struct RowSummary {
    /// How the row ended (`None` for a row removed before it finished).
    pub finish: Option<FinishReason>,
    /// The stop token or string, when `finish` is `Stop`.
    pub stop: Option<StopCause>,
    /// Prompt tokens (those a reused cache held included).
    pub prompt_tokens: usize,
    /// Of those, the tokens a reused cache held (they did not run).
    pub cached_tokens: usize,
    /// Tokens generated (a final stop token included).
    pub generated: usize,
    /// Tokens the grammar forced (emitted without sampling).
    pub forced_tokens: usize,
    /// From admission to the first token (queueing inside the batch and prefill).
    pub time_to_first_token: Duration,
    /// From the first token to the last.
    pub decode: Duration,
    /// Speculation telemetry (mode `"off"` for a row that did not speculate).
    pub spec: SpecStats,
}

impl RowSummary {
    /// Decode tokens per second of this row (tokens after the first, over the decode time).
    pub fn decode_tok_s(&self) -> f64 {
        self.generated.saturating_sub(1) as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

/// What [`Batch::step`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// One entry per token produced this step, in order: a row's grammar-forced tokens, then
    /// its sampled one, or its accepted drafts and the correction or bonus token (a row still
    /// feeding its prompt produces none).
    pub rows: Vec<RowStep>,
    /// Rows in the forward.
    pub batch_rows: usize,
    /// Tokens in the main forward (decode rows count one, verification runs γ + 1).
    pub tokens: usize,
    /// Prefill work this step, in token-layers (a span's tokens × the main layers run over
    /// them): at most `max(prefill_chunk × layers, span)` (see the module docs).
    pub prefill_work: usize,
    /// Rows that advanced a prefill span this step.
    pub prefill_rows: usize,
    /// Rows at a decode step that could speculate (they have a provider).
    pub spec_rows: usize,
    /// Of those, rows that verified at least one draft.
    pub speculating: usize,
    /// Sum of the depth each speculation-capable decode row asked for (`auto` may ask 0).
    pub gamma_sum: usize,
    /// Drafts verified, and accepted.
    pub drafted: usize,
    /// Drafts accepted.
    pub accepted: usize,
    /// The forward's expert union (`None` when it ran a prompt chunk).
    pub union: Option<StepUnion>,
    /// The γ `auto` gave the step's `auto` rows (`None`: no `auto` row at a decode step).
    pub auto_gamma: Option<usize>,
    /// Wall time of the step.
    pub elapsed: Duration,
}

/// What a step costs the `auto` controller, in seconds, instead of its measured time: a
/// deterministic cost model for tests and what-if runs ([`Batch::cost_steps_with`]). It sees
/// the finished step's report (tokens in the forward, its expert union, drafts).
pub type StepCost = Box<dyn Fn(&StepReport) -> f64 + Send>;

/// The `auto` controller's optional cost model.
struct CostModel(Option<StepCost>);

impl std::fmt::Debug for CostModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Fed" } else { "WallTime" })
    }
}

/// The live rows of a continuous batch (see the module docs).
#[derive(Debug)]
pub struct Batch {
    opts: BatchOptions,
    rows: Vec<Row>,
    kept: PrefixCache,
    held: Vec<(u64, SeqCache)>,
    /// The `auto` controller of every `auto` row (created by the first): the objective is the
    /// step's tokens per second over all rows, so it outlives any one row.
    auto: Option<AutoGamma>,
    cost: CostModel,
    meter: UnionMeter,
}

/// What one row runs in a step.
struct Plan {
    /// The row's input is longer than one token: it runs as prefill spans, not in the main
    /// forward.
    prefill: bool,
    /// Slice of the pending input (plain rows; for a prefill row, the span it completed).
    start: usize,
    end: usize,
    /// The slice completes the pending input: the row samples from its last row.
    complete: bool,
    /// A decode step of a row with a provider (it may speculate).
    round: bool,
    /// Drafts asked for.
    want: usize,
    drafts: Vec<u32>,
    q: Vec<Option<Distribution>>,
    /// MTP rows this row absorbed while drafting.
    absorbed: usize,
}

impl Batch {
    /// An empty batch.
    pub fn new(opts: BatchOptions) -> Batch {
        Batch {
            opts: BatchOptions {
                max_rows: opts.max_rows.max(1),
                prefill_chunk: opts.prefill_chunk.max(1),
                prefill_span: opts.prefill_span.max(1),
                keep_tokens: opts.keep_tokens,
            },
            rows: Vec::new(),
            kept: PrefixCache::new(opts.keep_tokens),
            held: Vec::new(),
            auto: None,
            cost: CostModel(None),
            meter: UnionMeter::default(),
        }
    }

    /// Makes the `auto` controller take each step's cost from `cost` instead of the step's
    /// measured time (deterministic: tests and what-if runs).
    pub fn cost_steps_with(&mut self, cost: StepCost) {
        self.cost = CostModel(Some(cost));
    }

    /// The `auto` controller (`None` before the first `auto` row joined).
    pub fn auto(&self) -> Option<&AutoGamma> {
        self.auto.as_ref()
    }

    /// Live rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the next step runs prefill work: a row's prompt is still running (the memory
    /// plan must then hold a prompt span's activations, `Glm5::use_sequences`).
    pub fn prefilling(&self) -> bool {
        self.rows.iter().any(Row::prefilling)
    }

    /// No live rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Room for another row.
    pub fn has_room(&self) -> bool {
        self.rows.len() < self.opts.max_rows
    }

    /// Adds a request as row `id` (ids must be unique among live rows). The request is
    /// validated here; a bad one is refused without touching the other rows. A request with
    /// nothing to do (`max_tokens == 0`) is refused too: it would never produce a step.
    pub fn admit(
        &mut self,
        model: &Glm5,
        tokenizer: Option<&Tokenizer>,
        model_stop_ids: &[u32],
        id: u64,
        request: &Request,
    ) -> Result<()> {
        let state = RequestState::new(request, model_stop_ids, model.vocab_size(), tokenizer)?;
        self.admit_state(model, id, state)
    }

    /// [`Batch::admit`] for a request whose state was prepared already (validated and its
    /// grammar compiled, e.g. on a server's request thread so a bad request is refused there).
    pub fn admit_state(&mut self, model: &Glm5, id: u64, state: RequestState) -> Result<()> {
        self.admit_row(model, id, state, RowOptions::default())
    }

    /// [`Batch::admit_state`] with the row's speculation, a starting cache, or both.
    pub fn admit_row(
        &mut self,
        model: &Glm5,
        id: u64,
        mut state: RequestState,
        opts: RowOptions,
    ) -> Result<()> {
        if !state.generated().is_empty() {
            return Err(Error::Request(format!(
                "row {id}: only a request that has not started can join a batch"
            )));
        }
        if !self.has_room() {
            return Err(Error::Request(format!(
                "the batch is full ({} rows)",
                self.opts.max_rows
            )));
        }
        if self.rows.iter().any(|r| r.id == id) {
            return Err(Error::Request(format!("row id {id} is already live")));
        }
        if state.finished().is_some() {
            return Err(Error::InvalidParam {
                param: "max_tokens",
                reason: "must be at least 1".into(),
            });
        }
        let spec = match (opts.speculation, opts.drafter) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(Error::InvalidParam {
                    param: "draft_tokens",
                    reason: "a drafter needs a speculation (its depth)".into(),
                })
            }
            (Some(s), own) => {
                s.validate()?;
                let provider = match (own, s.speculator) {
                    (Some(d), _) => Provider::Own(d),
                    (None, Speculator::Mtp { .. }) => Provider::Mtp(MtpDrafter::new(model)?),
                    (None, Speculator::PromptLookup { ngram, .. }) => {
                        Provider::Own(Box::new(PromptLookup::new(ngram)))
                    }
                };
                let gamma = s.max_draft();
                let auto = s.auto.then(|| {
                    let a = self.auto.get_or_insert_with(|| AutoGamma::new(gamma));
                    a.widen(gamma);
                    (a.logged(), gamma)
                });
                Some(RowSpec {
                    provider,
                    gamma,
                    auto,
                    c: SpecCounters::new(gamma),
                })
            }
        };
        // A request that continues a kept conversation starts from its cache (before the
        // first step the history is the prompt).
        let prompt_tokens = state.history().tokens().len();
        let mut cache = match opts.cache {
            Some(c) => Some(c),
            None => self.kept.take(state.history().tokens()),
        }
        .unwrap_or_else(|| model.new_cache());
        // The MTP cache may end before the main cache (it may skip rows, `spec/mtp.rs`: the
        // drafter starts from the rows that run), never after it.
        cache.mtp.truncate_to_position(cache.len());
        let cache_len = cache.len();
        if cache_len > 0 {
            state.skip_cached(cache_len)?;
        }
        self.rows.push(Row {
            id,
            state,
            cache,
            fed_in_input: 0,
            prefill: None,
            prompt_tokens,
            admitted: Instant::now(),
            first_token: None,
            cached: cache_len,
            spec,
            hold: opts.hold_cache,
            union: UnionCounts::default(),
        });
        Ok(())
    }

    /// Takes row `id` out (a cancelled request); its totals so far, or `None` if it is not live.
    pub fn remove(&mut self, id: u64) -> Option<RowSummary> {
        self.take(id).map(|(s, _)| s)
    }

    /// [`Batch::remove`], also returning the row's cache (holding every token fed so far).
    pub fn take(&mut self, id: u64) -> Option<(RowSummary, SeqCache)> {
        let i = self.rows.iter().position(|r| r.id == id)?;
        let mut row = self.rows.remove(i);
        if let Some(p) = row.prefill.take() {
            // Layers the span already ran hold its tokens; the others do not.
            row.cache.truncate(p.start());
        }
        // Out of the batch, its cache holds no VRAM (the next GPU step uploads it again).
        row.cache.release_device();
        Some((summary(&row, self.auto.as_ref(), Instant::now()), row.cache))
    }

    /// Live row `id`'s cache (main layers and MTP layer). While a prefill span is in flight,
    /// the layers it has run hold its tokens and the others do not yet.
    pub fn cache(&self, id: u64) -> Option<&SeqCache> {
        self.rows.iter().find(|r| r.id == id).map(|r| &r.cache)
    }

    /// The cache of finished row `id`, admitted with [`RowOptions::hold_cache`].
    pub fn take_cache(&mut self, id: u64) -> Option<SeqCache> {
        let i = self.held.iter().position(|(h, _)| *h == id)?;
        Some(self.held.swap_remove(i).1)
    }

    /// Kept conversations and what they saved.
    pub fn kept(&self) -> PrefixCacheStats {
        self.kept.stats()
    }

    /// A finished row leaves: its totals, and its cache kept for a continuing request.
    fn finish(&mut self, i: usize, now: Instant) -> RowSummary {
        let mut row = self.rows.remove(i);
        let s = summary(&row, self.auto.as_ref(), now);
        if let Some(Provider::Mtp(d)) = row.spec.as_mut().map(|s| &mut s.provider) {
            // A row that ended inside a verified run still holds the round's chained MTP rows.
            let _ = d.observe(&mut row.cache, &[], &[]);
        }
        if row.hold {
            row.cache.release_device();
            self.held.push((row.id, row.cache));
            return s;
        }
        let n = row.cache.len();
        if let Some(tokens) = row.state.history().tokens().get(..n) {
            self.kept.put(tokens.to_vec(), row.prompt_tokens, row.cache);
        }
        s
    }

    /// Takes every row out (after a failed step, when their caches can no longer be trusted);
    /// returns their ids.
    pub fn clear(&mut self) -> Vec<u64> {
        self.rows.drain(..).map(|r| r.id).collect()
    }

    /// Runs one forward over every live row and advances each: a row still inside its prompt
    /// feeds its next chunk; a speculating row verifies its drafts; every other row samples
    /// its next token. Finished rows leave the batch and report their totals. A model error
    /// fails the whole step (the caller should [`Batch::clear`] and fail those requests: their
    /// caches may be half-written).
    pub fn step(&mut self, model: &Glm5, tokenizer: Option<&Tokenizer>) -> Result<StepReport> {
        self.step_observed(model, tokenizer, &mut NoObserver)
    }

    /// [`Batch::step`] with an observer of the model's forwards: rows of the main forward are
    /// numbered across it, rows of a prefill span by their place in the row's pending input
    /// (for a fresh row, the prompt position). `nectar bench replay` drives the batch with its
    /// routes this way.
    pub fn step_observed(
        &mut self,
        model: &Glm5,
        tokenizer: Option<&Tokenizer>,
        obs: &mut dyn Observer,
    ) -> Result<StepReport> {
        let t0 = Instant::now();
        // Tokens a row's grammar forces are emitted now and join its pending input, so this
        // step's forward runs them with the last sampled token (a row inside its prompt is not
        // at a token boundary and forces nothing yet). Such a row does not draft this step.
        let mut rows_out = Vec::new();
        let mut forced_ids = Vec::new();
        for row in &mut self.rows {
            if row.fed_in_input == 0 && row.prefill.is_none() {
                for step in row.state.fast_forward(tokenizer)? {
                    row.first_token.get_or_insert(t0);
                    forced_ids.push(row.id);
                    rows_out.push(RowStep {
                        id: row.id,
                        step,
                        summary: None,
                    });
                }
            }
        }
        // A forced run can finish a row (its grammar completes): it leaves before the forward.
        for rs in &mut rows_out {
            if rs.step.finished.is_some() {
                if let Some(i) = self.rows.iter().position(|r| r.id == rs.id) {
                    rs.summary = Some(self.finish(i, t0));
                }
            }
        }
        let mut report = StepReport {
            rows: rows_out,
            batch_rows: self.rows.len(),
            tokens: 0,
            prefill_work: 0,
            prefill_rows: 0,
            spec_rows: 0,
            speculating: 0,
            gamma_sum: 0,
            drafted: 0,
            accepted: 0,
            union: None,
            auto_gamma: None,
            elapsed: Duration::ZERO,
        };
        if self.rows.is_empty() {
            report.elapsed = t0.elapsed();
            return Ok(report);
        }
        // What each row runs: prefill spans, its pending token, or a speculative round.
        let mut plans: Vec<Plan> = Vec::with_capacity(self.rows.len());
        // One γ for every `auto` row at a decode step, chosen for the step's shape: in a
        // shared step a row's drafts cost every other row, so only the step's tokens per
        // second over all rows can say whether they pay.
        let is_round = |row: &Row| {
            row.spec.is_some()
                && row.fed_in_input == 0
                && row.state.pending_input().is_some_and(|p| p.len() == 1)
                && !row.state.generated().is_empty()
                && !forced_ids.contains(&row.id)
        };
        // Rows inside a prompt (or a forced run) advance it layer-major, outside the main
        // forward: the step's decode cost is that of the rows in the forward. Counting them
        // made every step where a request joined a shape of its own that is never recorded
        // (the step ran prefill work), so it kept the γ in force when it was first seen.
        let shape = Shape {
            rows: self.rows.iter().filter(|r| !r.prefilling()).count(),
            auto_rows: self
                .rows
                .iter()
                .filter(|r| is_round(r) && r.spec.as_ref().is_some_and(|s| s.auto.is_some()))
                .count(),
        };
        let auto_gamma = match &mut self.auto {
            Some(a) if shape.auto_rows > 0 => Some(a.next(shape)),
            _ => None,
        };
        report.auto_gamma = auto_gamma;
        for row in &self.rows {
            let pending = row.state.pending_input().ok_or_else(|| {
                Error::Request(format!("row {} finished but is still live", row.id))
            })?;
            let start = row.fed_in_input;
            // An input of several tokens runs as prefill spans to its end (its last span may
            // be one token).
            let prefill = start > 0 || pending.len() > 1;
            let end = if prefill { start } else { pending.len() };
            let round = is_round(row);
            let want = match (&row.spec, round) {
                (Some(s), true) => {
                    let (generated, max_tokens) = row.state.budget();
                    // Drafts past `max_tokens` could never be kept.
                    let room = max_tokens.saturating_sub(generated + 1);
                    match s.auto {
                        Some(_) => auto_gamma.unwrap_or(0).min(s.gamma),
                        None => s.gamma,
                    }
                    .min(room)
                }
                _ => 0,
            };
            plans.push(Plan {
                prefill,
                start,
                end,
                complete: !prefill,
                round,
                want,
                drafts: Vec::new(),
                q: Vec::new(),
                absorbed: 0,
            });
        }
        let prefill_in_step = plans.iter().any(|p| p.prefill);
        // Drafting: per-row providers on their own, MTP rows together.
        let td = Instant::now();
        let (mut absorb_secs, mut mtp_secs, mut backlog) = (0.0, 0.0, 0);
        {
            let mut mtp_rows = Vec::new();
            let mut mtp_plans = Vec::new();
            for (row, plan) in self.rows.iter_mut().zip(plans.iter_mut()) {
                if plan.want == 0 {
                    continue;
                }
                let Row {
                    state, cache, spec, ..
                } = row;
                let Some(spec) = spec.as_mut() else { continue };
                let mut proposals = Proposals::new(state, plan.want);
                match &mut spec.provider {
                    Provider::Own(d) => {
                        d.draft(model, cache, &mut proposals)?;
                        (plan.drafts, plan.q) = proposals.finish();
                    }
                    Provider::Mtp(d) => {
                        mtp_rows.push(MtpRow {
                            drafter: d,
                            cache,
                            proposals,
                        });
                        mtp_plans.push(plan);
                    }
                }
            }
            if !mtp_rows.is_empty() {
                let ta = Instant::now();
                let absorbed = draft_together(model, &mut mtp_rows)?;
                mtp_secs = ta.elapsed().as_secs_f64();
                (absorb_secs, backlog) = (absorbed.secs, absorbed.backlog);
                for ((r, plan), n) in mtp_rows.into_iter().zip(mtp_plans).zip(absorbed.rows) {
                    (plan.drafts, plan.q) = r.proposals.finish();
                    plan.absorbed = n;
                }
            }
        }
        let draft_secs = td.elapsed().as_secs_f64();
        // Prefill rows advance their spans; a row whose input completes samples below.
        let spans = self.prefill(model, &mut plans, obs, &mut report)?;
        // Each row's input: a verification run `[last, drafts…]`, or its pending slice (for a
        // prefill row, the span it completed this step, if any).
        let inputs: Vec<Vec<u32>> = self
            .rows
            .iter()
            .zip(&plans)
            .map(|(row, p)| {
                let pending = row.state.pending_input().unwrap_or_default();
                if p.round {
                    let mut v = Vec::with_capacity(p.drafts.len() + 1);
                    v.push(pending[0]);
                    v.extend_from_slice(&p.drafts);
                    v
                } else {
                    pending[p.start..p.end].to_vec()
                }
            })
            .collect();
        let starts: Vec<usize> = self.rows.iter().map(|r| r.cache.len()).collect();
        // The union meter: which rows of the forward are draft positions.
        let draft_rows = plans
            .iter()
            .zip(&inputs)
            .filter(|(p, _)| !p.prefill)
            .flat_map(|(p, input)| (0..input.len()).map(move |j| p.round && j > 0))
            .collect();
        self.meter.begin(draft_rows);
        let tv = Instant::now();
        let main = {
            let mut steps: Vec<SeqStep<'_>> = self
                .rows
                .iter_mut()
                .zip(&inputs)
                .zip(&plans)
                .filter(|(_, p)| !p.prefill)
                .map(|((row, tokens), _)| SeqStep {
                    tokens,
                    cache: &mut row.cache,
                })
                .collect();
            if steps.is_empty() {
                Vec::new()
            } else {
                model.forward(&mut steps, &mut Both(obs, &mut self.meter))?
            }
        };
        let union = self.meter.end();
        if !prefill_in_step {
            report.union = Some(union);
            for row in &mut self.rows {
                row.union.add(&union);
            }
        }
        let hd = model.hidden_size();
        // Each row's hiddens: its rows of the main forward, or its completed span's.
        let mut offset = 0;
        let mut hiddens: Vec<&[f32]> = Vec::with_capacity(plans.len());
        for ((p, input), span) in plans.iter().zip(&inputs).zip(&spans) {
            if p.prefill {
                hiddens.push(span.as_deref().unwrap_or_default());
            } else {
                let n = input.len();
                hiddens.push(&main[offset * hd..(offset + n) * hd]);
                offset += n;
            }
        }
        report.tokens = offset;
        // Logits, in one lm-head call: every row of a verification run, the last row of each
        // completed input.
        let mut logit_rows = Vec::new();
        for (p, h) in plans.iter().zip(&hiddens) {
            if p.round {
                logit_rows.extend_from_slice(h);
            } else if p.complete {
                logit_rows.extend_from_slice(&h[h.len() - hd..]);
            }
        }
        let logits = if logit_rows.is_empty() {
            Vec::new()
        } else {
            model.logits(&logit_rows)?
        };
        let vocab = model.vocab_size();
        let now = Instant::now();
        let mut next_logits = 0;
        let mut take_logits = |rows: usize| -> Result<&[f32]> {
            let l = logits
                .get(next_logits * vocab..(next_logits + rows) * vocab)
                .ok_or_else(|| Error::Request("fewer logits rows than inputs".into()))?;
            next_logits += rows;
            Ok(l)
        };
        let mut rounds = Vec::new();
        let rows = self.rows.iter_mut().zip(&plans).zip(&inputs).zip(&hiddens);
        for (i, (((row, p), input), &h)) in rows.enumerate() {
            if p.round {
                // Verify the drafts, keep the longest accepted prefix plus one, roll back.
                let l = take_logits(input.len())?;
                let v = row.state.verify(l, &p.drafts, &p.q, tokenizer)?;
                let n = starts[i];
                let kept = v.steps.len();
                row.cache.truncate(n + kept);
                let next: Vec<u32> = v.steps.iter().map(|s| s.token).collect();
                observe(row, &h[..kept * hd], &next)?;
                let tokens = row.state.history().tokens().len();
                if row.cache.len() != n + kept || tokens != n + kept + 1 {
                    return Err(Error::Speculation(format!(
                        "after keeping {kept} rows from {n}, the main cache holds {} rows and \
                         the request {tokens} tokens",
                        row.cache.len()
                    )));
                }
                row.first_token.get_or_insert(now);
                rounds.push((row.id, p.want, p.drafts.len(), v.accepted, p.absorbed, kept));
                for step in v.steps {
                    report.rows.push(RowStep {
                        id: row.id,
                        step,
                        summary: None,
                    });
                }
                continue;
            }
            if !p.complete {
                // A prefill row still inside its input.
                continue;
            }
            row.fed_in_input = 0;
            let l = take_logits(1)?;
            let step = row.state.on_logits(l, None, tokenizer)?;
            if row.state.finished().is_none() {
                let mut next = input[1..].to_vec();
                next.push(step.token);
                observe(row, h, &next)?;
            }
            if let Some(s) = row.spec.as_mut().filter(|_| row.first_token.is_some()) {
                // A decode step that could not speculate (forced tokens) still counts.
                s.c.main_forwards += 1;
            }
            row.first_token.get_or_insert(now);
            report.rows.push(RowStep {
                id: row.id,
                step,
                summary: None,
            });
        }
        // The speculating rows' counters. The step's time runs to here: verifying a row's
        // drafts samples each of its γ + 1 positions (softmax, penalties, grammar, stops,
        // detokenising), work a plain row does once; timed only up to the logits, drafting on
        // the demo looked 4–14 % cheaper than plain decoding in step time while decoding no
        // faster (benchmarks/RESULTS.md, issue 12).
        let end = Instant::now();
        let step_secs = end.duration_since(t0).as_secs_f64();
        let verify_secs = end.duration_since(tv).as_secs_f64();
        let total_absorbed: usize = rounds.iter().map(|r| r.4).sum();
        let (mut auto_rows, mut auto_tokens) = (Vec::new(), 0);
        for (id, want, drafted, accepted, _, kept) in rounds {
            report.spec_rows += 1;
            report.speculating += usize::from(drafted > 0);
            report.gamma_sum += want;
            report.drafted += drafted;
            report.accepted += accepted;
            let Some(s) = self
                .rows
                .iter_mut()
                .find(|r| r.id == id)
                .and_then(|r| r.spec.as_mut())
            else {
                continue;
            };
            s.c.round(want, drafted, accepted);
            s.c.draft_secs += draft_secs;
            s.c.verify_secs += verify_secs;
            if s.auto.is_some() {
                auto_rows.push(RowRound {
                    asked: want,
                    accepted,
                });
                auto_tokens += kept;
            }
        }
        // The `auto` controller: the step's tokens over all rows against its cost — the whole
        // step's time (or the fed cost), which holds what the drafts cost every row: draft
        // forwards, verification rows and, under a budget, the experts they add to the union.
        // A step that also ran a prompt chunk says nothing about decode cost.
        if let (Some(a), Some(gamma), false) = (self.auto.as_mut(), auto_gamma, prefill_in_step) {
            // Drafting is part of a step's cost at its γ (it scales with γ); absorption scales
            // with the rows kept, so it is measured per row apart.
            let (secs, absorb) = match &self.cost.0 {
                Some(cost) => (cost(&report), 0.0),
                None => (step_secs - absorb_secs, absorb_secs),
            };
            a.record(&StepSample {
                shape,
                gamma,
                rows: &auto_rows,
                others: report.rows.len().saturating_sub(auto_tokens),
                secs,
                absorbed: total_absorbed,
                backlog,
                absorb_secs: absorb,
            });
            for s in self.rows.iter_mut().filter_map(|r| r.spec.as_mut()) {
                if let Some((_, chosen)) = s.auto.as_mut() {
                    *chosen = a.current(shape).unwrap_or(*chosen);
                }
            }
        }
        // One line per decode step (`NECTAR_LOG=nectar::step=debug`): what speculation cost it.
        tracing::debug!(
            target: "nectar::step",
            rows = shape.rows,
            auto_rows = shape.auto_rows,
            gamma = auto_gamma.unwrap_or(0),
            prefill = prefill_in_step,
            drafted = report.drafted,
            absorbed = total_absorbed,
            backlog,
            absorb_us = (absorb_secs * 1e6) as u64,
            draft_us = ((mtp_secs - absorb_secs) * 1e6) as u64,
            step_us = (step_secs * 1e6) as u64,
        );
        // Finished rows leave, with their totals.
        for rs in &mut report.rows {
            if rs.step.finished.is_some() {
                if let Some(i) = self.rows.iter().position(|r| r.id == rs.id) {
                    rs.summary = Some(self.finish(i, now));
                }
            }
        }
        report.elapsed = t0.elapsed();
        Ok(report)
    }
}

impl Batch {
    /// Advances the prefill rows' spans, oldest row first, within the step's prefill work (see
    /// the module docs). Returns, per row, the hiddens of the span that completed its input this
    /// step (its plan then names that span and is complete); a span that completes only part of
    /// the input is shown to the row's drafter here, as the main forward's rows are below.
    fn prefill(
        &mut self,
        model: &Glm5,
        plans: &mut [Plan],
        obs: &mut dyn Observer,
        report: &mut StepReport,
    ) -> Result<Vec<Option<Vec<f32>>>> {
        let layers = model.num_layers().max(1);
        let mut budget = self.opts.prefill_chunk.saturating_mul(layers);
        let span = self.opts.prefill_span;
        let mut out: Vec<Option<Vec<f32>>> = (0..plans.len()).map(|_| None).collect();
        // The oldest span always runs a layer, so a prompt whose one layer costs more than the
        // budget still advances.
        let mut first = true;
        let rows = self
            .rows
            .iter_mut()
            .zip(plans.iter_mut())
            .zip(out.iter_mut());
        for ((row, plan), done) in rows {
            if !plan.prefill {
                continue;
            }
            let pending = row.state.pending_input().unwrap_or_default().to_vec();
            let mut advanced = false;
            loop {
                let fed = row.fed_in_input;
                let p = match &mut row.prefill {
                    Some(p) => p,
                    None => {
                        let end = fed.saturating_add(span).min(pending.len());
                        row.prefill
                            .insert(model.prefill_begin(&row.cache, &pending[fed..end])?)
                    }
                };
                let per = p.tokens();
                let mut n = (budget / per).min(layers - p.layers_done());
                if first {
                    n = n.max(1);
                }
                if n == 0 {
                    break;
                }
                first = false;
                advanced = true;
                budget = budget.saturating_sub(n * per);
                report.prefill_work += n * per;
                let mut shifted = Shifted {
                    inner: &mut *obs,
                    by: fed,
                };
                let Some(h) = model.prefill_layers(p, &mut row.cache, n, &mut shifted)? else {
                    break;
                };
                row.prefill = None;
                let end = fed + per;
                if end == pending.len() {
                    (plan.start, plan.end, plan.complete) = (fed, end, true);
                    *done = Some(h);
                    break;
                }
                // A span inside the input: the drafter sees its rows (the next token of each
                // is known).
                row.fed_in_input = end;
                observe(row, &h, &pending[fed + 1..=end])?;
            }
            report.prefill_rows += usize::from(advanced);
        }
        Ok(out)
    }
}

/// An observer of a prefill span: its rows numbered by their place in the row's input.
struct Shifted<'a> {
    inner: &'a mut dyn Observer,
    by: usize,
}

impl Observer for Shifted<'_> {
    fn layer_output(&mut self, layer: usize, x: &[f32]) {
        self.inner.layer_output(layer, x);
    }
    fn router(&mut self, layer: usize, row: usize, ids: &[u32], weights: &[f32]) {
        self.inner.router(layer, row + self.by, ids, weights);
    }
    fn indexer(&mut self, layer: usize, row: usize, full: bool, selected: Option<&[u32]>) {
        self.inner.indexer(layer, row + self.by, full, selected);
    }
    fn predicted(&mut self, layer: usize, row: usize, ids: &[u32]) {
        self.inner.predicted(layer, row + self.by, ids);
    }
    fn replay_route(&mut self, layer: usize, row: usize) -> Option<Vec<u32>> {
        self.inner.replay_route(layer, row + self.by)
    }
    fn replay_prediction(&mut self, layer: usize, row: usize) -> Option<Vec<u32>> {
        self.inner.replay_prediction(layer, row + self.by)
    }
}

/// The caller's observer (first: a benchmark's routes replace the router's) and the union
/// meter, both watching the main forward.
struct Both<'a>(&'a mut dyn Observer, &'a mut UnionMeter);

impl Observer for Both<'_> {
    fn layer_output(&mut self, layer: usize, x: &[f32]) {
        self.0.layer_output(layer, x);
        self.1.layer_output(layer, x);
    }
    fn router(&mut self, layer: usize, row: usize, ids: &[u32], weights: &[f32]) {
        self.0.router(layer, row, ids, weights);
        self.1.router(layer, row, ids, weights);
    }
    fn indexer(&mut self, layer: usize, row: usize, full: bool, selected: Option<&[u32]>) {
        self.0.indexer(layer, row, full, selected);
        self.1.indexer(layer, row, full, selected);
    }
    fn predicted(&mut self, layer: usize, row: usize, ids: &[u32]) {
        self.0.predicted(layer, row, ids);
        self.1.predicted(layer, row, ids);
    }
    fn replay_route(&mut self, layer: usize, row: usize) -> Option<Vec<u32>> {
        self.0.replay_route(layer, row)
    }
    fn replay_prediction(&mut self, layer: usize, row: usize) -> Option<Vec<u32>> {
        self.0.replay_prediction(layer, row)
    }
}

/// The drafter of a speculating row sees the rows the main model kept: hiddens and the token
/// after each.
fn observe(row: &mut Row, hidden: &[f32], next: &[u32]) -> Result<()> {
    match row.spec.as_mut().map(|s| &mut s.provider) {
        Some(Provider::Mtp(d)) => d.observe(&mut row.cache, hidden, next),
        Some(Provider::Own(d)) => d.observe(&mut row.cache, hidden, next),
        None => Ok(()),
    }
}

fn summary(row: &Row, auto: Option<&AutoGamma>, now: Instant) -> RowSummary {
    let first = row.first_token.unwrap_or(now);
    let generated = row.state.generated().len();
    let decode = now.duration_since(first);
    let total = now.duration_since(row.admitted);
    let mut spec = match &row.spec {
        Some(s) => {
            let auto = s.auto.map(|(from, chosen)| AutoRow {
                final_gamma: chosen,
                decisions: auto.map_or_else(Vec::new, |a| a.decisions_since(from)),
            });
            let mut st = row_stats(
                s.mode(),
                auto,
                s.gamma,
                &s.c,
                generated,
                total.as_secs_f64(),
                decode.as_secs_f64(),
            );
            if let Provider::Mtp(d) = &s.provider {
                st.draft_forwards = d.forwards();
            }
            st
        }
        None => SpecStats::plain(
            generated,
            generated as f64 / total.as_secs_f64().max(1e-9),
            generated.saturating_sub(1) as f64 / decode.as_secs_f64().max(1e-9),
        ),
    };
    spec.expert_union = row.union.stats();
    RowSummary {
        finish: row.state.finished(),
        stop: row.state.stop_cause().cloned(),
        prompt_tokens: row.prompt_tokens,
        cached_tokens: row.cached,
        generated,
        forced_tokens: row.state.forced_tokens(),
        time_to_first_token: first.duration_since(row.admitted),
        decode,
        spec,
    }
}
