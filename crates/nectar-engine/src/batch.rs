//! Continuous batching: many requests decode together, one model forward per step.
//!
//! A [`Batch`] holds the live rows — each a [`RequestState`] (its own sampler, stops, text) and
//! its own [`SeqCache`] — and [`Batch::step`] runs every row's pending tokens through **one**
//! `Glm5::forward`. Rows join ([`Batch::admit`]) and leave ([`Batch::remove`], or by finishing)
//! between steps. Because the model's expert batch-union spans every row of a forward, each
//! routed expert a step needs is read (or found resident) once per layer, however many rows
//! route to it.
//!
//! Row independence is what makes this safe to serve: the kernels' output for a row does not
//! depend on how many rows share the matmul, attention runs per sequence, and the MoE sums each
//! row's experts in a fixed order. So a row's tokens are the same whether it decodes alone or
//! beside others (tested under greedy decoding). A long prompt is fed in chunks of at most
//! [`BatchOptions::prefill_chunk`] tokens per step, so a joining request delays the rows already
//! decoding by one bounded step instead of its whole prefill; the chunking depends only on the
//! row itself, never on its neighbours.

use crate::error::{Error, Result};
use crate::prefix_cache::{PrefixCache, PrefixCacheStats};
use crate::request::{FinishReason, Request, StopCause};
use crate::request_state::{RequestState, Step};
use crate::tokenizer::Tokenizer;
use nectar_model::{Glm5, NoObserver, SeqCache, SeqStep};
use std::time::{Duration, Instant};

/// Default prompt tokens a row feeds per step (see [`BatchOptions::prefill_chunk`]).
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// How a [`Batch`] steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchOptions {
    /// Rows at most ([`Batch::admit`] refuses more).
    pub max_rows: usize,
    /// Tokens at most that one row feeds per step while it works through its prompt.
    pub prefill_chunk: usize,
    /// Keep finished conversations' caches, up to this many tokens in all, so a request that
    /// continues one runs only its new tokens (see [`PrefixCache`]); 0 keeps none.
    pub keep_tokens: usize,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            max_rows: 1,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            keep_tokens: 0,
        }
    }
}

/// One live request.
#[derive(Debug)]
struct Row {
    id: u64,
    state: RequestState,
    cache: SeqCache,
    /// Tokens of the current pending input already fed (a prompt split over steps).
    fed_in_input: usize,
    prompt_tokens: usize,
    admitted: Instant,
    first_token: Option<Instant>,
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
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens generated (a final stop token included).
    pub generated: usize,
    /// From admission to the first token (queueing inside the batch and prefill).
    pub time_to_first_token: Duration,
    /// From the first token to the last.
    pub decode: Duration,
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
    /// its sampled one (a row still feeding its prompt produces none).
    pub rows: Vec<RowStep>,
    /// Rows in the forward.
    pub batch_rows: usize,
    /// Tokens in the forward (decode rows count one; prompt chunks their length).
    pub tokens: usize,
    /// Wall time of the step.
    pub elapsed: Duration,
}

/// The live rows of a continuous batch (see the module docs).
#[derive(Debug)]
pub struct Batch {
    opts: BatchOptions,
    rows: Vec<Row>,
    kept: PrefixCache,
}

impl Batch {
    /// An empty batch.
    pub fn new(opts: BatchOptions) -> Batch {
        Batch {
            opts: BatchOptions {
                max_rows: opts.max_rows.max(1),
                prefill_chunk: opts.prefill_chunk.max(1),
                keep_tokens: opts.keep_tokens,
            },
            rows: Vec::new(),
            kept: PrefixCache::new(opts.keep_tokens),
        }
    }

    /// Live rows.
    pub fn len(&self) -> usize {
        self.rows.len()
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
    pub fn admit_state(&mut self, model: &Glm5, id: u64, mut state: RequestState) -> Result<()> {
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
        // A request that continues a kept conversation starts from its cache (before the
        // first step the history is the prompt).
        let prompt_tokens = state.history().tokens().len();
        let cache = match self.kept.take(state.history().tokens()) {
            Some(c) => {
                state.skip_cached(c.len())?;
                c
            }
            None => model.new_cache(),
        };
        self.rows.push(Row {
            id,
            state,
            cache,
            fed_in_input: 0,
            prompt_tokens,
            admitted: Instant::now(),
            first_token: None,
        });
        Ok(())
    }

    /// Takes row `id` out (a cancelled request); its totals so far, or `None` if it is not live.
    pub fn remove(&mut self, id: u64) -> Option<RowSummary> {
        let i = self.rows.iter().position(|r| r.id == id)?;
        Some(summary(&self.rows.remove(i), Instant::now()))
    }

    /// Kept conversations and what they saved.
    pub fn kept(&self) -> PrefixCacheStats {
        self.kept.stats()
    }

    /// A finished row leaves: its totals, and its cache kept for a continuing request.
    fn finish(&mut self, i: usize, now: Instant) -> RowSummary {
        let row = self.rows.remove(i);
        let s = summary(&row, now);
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
    /// feeds its next chunk; every other row samples its next token. Finished rows leave the
    /// batch and report their totals. A model error fails the whole step (the caller should
    /// [`Batch::clear`] and fail those requests: their caches may be half-written).
    pub fn step(&mut self, model: &Glm5, tokenizer: Option<&Tokenizer>) -> Result<StepReport> {
        let t0 = Instant::now();
        let chunk = self.opts.prefill_chunk;
        // Tokens a row's grammar forces are emitted now and join its pending input, so this
        // step's forward runs them with the last sampled token (a row inside its prompt is not
        // at a token boundary and forces nothing yet).
        let mut rows_out = Vec::new();
        for row in &mut self.rows {
            if row.fed_in_input == 0 {
                for step in row.state.fast_forward(tokenizer)? {
                    row.first_token.get_or_insert(t0);
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
        if self.rows.is_empty() {
            return Ok(StepReport {
                rows: rows_out,
                batch_rows: 0,
                tokens: 0,
                elapsed: t0.elapsed(),
            });
        }
        // Which slice of each row's pending input runs now, and whether it completes it.
        let mut plan: Vec<(usize, usize, bool)> = Vec::with_capacity(self.rows.len());
        for row in &self.rows {
            let pending = row.state.pending_input().ok_or_else(|| {
                Error::Request(format!("row {} finished but is still live", row.id))
            })?;
            let start = row.fed_in_input;
            let end = (start + chunk).min(pending.len());
            plan.push((start, end, end == pending.len()));
        }
        let hd = model.hidden_size();
        let hidden = {
            let mut steps: Vec<SeqStep<'_>> = self
                .rows
                .iter_mut()
                .zip(&plan)
                .map(|(row, &(start, end, _))| SeqStep {
                    // `pending_input` is `Some` for every row (checked above).
                    tokens: &row.state.pending_input().unwrap_or_default()[start..end],
                    cache: &mut row.cache,
                })
                .collect();
            model.forward(&mut steps, &mut NoObserver)?
        };
        // The last hidden row of each row that completed its input, batched into one lm_head.
        let mut last_rows = Vec::new();
        let mut offset = 0;
        for &(start, end, complete) in &plan {
            offset += end - start;
            if complete {
                last_rows.extend_from_slice(&hidden[(offset - 1) * hd..offset * hd]);
            }
        }
        let logits = if last_rows.is_empty() {
            Vec::new()
        } else {
            model.logits(&last_rows)?
        };
        let vocab = model.vocab_size();
        let now = Instant::now();
        let mut report = StepReport {
            rows: rows_out,
            batch_rows: self.rows.len(),
            tokens: offset,
            elapsed: Duration::ZERO,
        };
        let mut next_logits = logits.chunks_exact(vocab);
        for (row, &(_, end, complete)) in self.rows.iter_mut().zip(&plan) {
            if !complete {
                row.fed_in_input = end;
                continue;
            }
            row.fed_in_input = 0;
            let l = next_logits
                .next()
                .ok_or_else(|| Error::Request("fewer logits rows than completed inputs".into()))?;
            let step = row.state.on_logits(l, None, tokenizer)?;
            row.first_token.get_or_insert(now);
            report.rows.push(RowStep {
                id: row.id,
                step,
                summary: None,
            });
        }
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

fn summary(row: &Row, now: Instant) -> RowSummary {
    let first = row.first_token.unwrap_or(now);
    RowSummary {
        finish: row.state.finished(),
        stop: row.state.stop_cause().cloned(),
        prompt_tokens: row.prompt_tokens,
        generated: row.state.generated().len(),
        time_to_first_token: first.duration_since(row.admitted),
        decode: now.duration_since(first),
    }
}
