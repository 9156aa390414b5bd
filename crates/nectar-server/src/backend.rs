//! The line between HTTP and the engine: a protocol-neutral [`Backend`] trait, and
//! [`EngineBackend`], its implementation over `nectar-engine`.
//!
//! This file and `scheduler.rs` (the model thread) are the only ones of the crate that name
//! `nectar-engine` (or `nectar-model`). Protocol
//! code builds a [`GenRequest`] (a prompt as ids, text or chat messages plus tools; a token
//! budget; sampling knobs; stop strings; a cancel token) and reads [`GenEvent`]s back; it never
//! sees a tokenizer or a model.
//!
//! `EngineBackend` runs generation on **one dedicated OS thread that owns the model**: requests
//! wait in a bounded queue (full → [`BackendError::QueueFull`], answered 429 with Retry-After)
//! and up to `parallel` of them decode together, one batched forward per step (continuous
//! batching, see `scheduler.rs`); a cancelled request leaves the batch at the next step.
//! Rendering the chat template and tokenising happen on the caller's thread (the HTTP side runs
//! them on the blocking pool) so the model thread only decodes.
//!
//! Sampling, stop strings and logprobs are the engine's (`nectar_engine::Request`): this file
//! only maps the protocol-neutral [`Sampling`] onto `SamplingParams`. An absent knob keeps the
//! engine's neutral default, so a request that names no sampling parameter decodes greedily
//! (deterministic, like `nectar run`); the model's `generation_config.json` sampling defaults
//! are not applied.

use nectar_engine::glm::{self, CallBudget};
use nectar_engine::{
    ChatTemplate, GrammarSpec, Request, RequestState, SamplingParams, Speculation, Tokenizer,
    UnionCounts,
};

/// GLM's output format as the protocols see it (the engine's `glm` module owns it).
pub use nectar_engine::glm::{OutputParser, Piece, StringParams, ToolCall};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;

/// A request's cancel flag, shared by its HTTP side and the model thread (checked per token).
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A fresh, unset flag.
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    /// Asks the generation to stop at its next token.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether cancellation was asked for.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// A guard that cancels when dropped: held by whatever consumes the request's output, so a
    /// client that goes away (its response future or body stream is dropped) stops the work.
    pub fn guard(&self) -> CancelOnDrop {
        CancelOnDrop(self.clone())
    }
}

/// Cancels its token when dropped (see [`CancelToken::guard`]).
#[derive(Debug)]
pub struct CancelOnDrop(CancelToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The prompt of a request.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Token ids, used as given.
    Ids(Vec<u32>),
    /// Plain text, tokenised without special tokens (GLM has no BOS).
    Text(String),
    /// OpenAI-shaped chat messages (and tool schemas), rendered through the model's chat
    /// template with the generation prompt.
    Chat {
        /// A JSON array of `{role, content, reasoning_content?, tool_calls?, tool_call_id?}`.
        messages: Value,
        /// A JSON array of `{"type":"function","function":{name, description, parameters}}`.
        tools: Option<Value>,
        /// The template's `enable_thinking`: open the assistant turn inside `<think>` or close
        /// it at once; `None` leaves the template's own default.
        enable_thinking: Option<bool>,
    },
}

/// Sampling knobs as the client sent them (`None` = the engine's neutral default; all `None`
/// is greedy decoding).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Sampling {
    /// Softmax temperature (0 = greedy).
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens.
    pub top_k: Option<u32>,
    /// Minimum probability relative to the most likely token.
    pub min_p: Option<f32>,
    /// OpenAI presence penalty.
    pub presence_penalty: Option<f32>,
    /// OpenAI frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Multiplicative repetition penalty.
    pub repetition_penalty: Option<f32>,
    /// Random seed.
    pub seed: Option<u64>,
    /// Added to the logits of these ids.
    pub logit_bias: BTreeMap<u32, f32>,
    /// Report each token's log-probability and this many alternatives.
    pub logprobs: Option<usize>,
    /// Report the prompt's tokens too (completions' `echo` with `logprobs`): one more prefill.
    pub prompt_logprobs: bool,
}

impl Sampling {
    /// The temperature decoding uses (absent: the engine's 0, greedy).
    pub fn temperature_used(&self) -> f32 {
        self.to_params().temperature
    }

    /// The nucleus mass decoding uses (absent: 1, off).
    pub fn top_p_used(&self) -> f32 {
        self.to_params().top_p
    }

    /// The engine's parameters: every absent knob at its neutral default.
    fn to_params(&self) -> SamplingParams {
        let d = SamplingParams::default();
        SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self.top_k.map_or(d.top_k, |k| k as usize),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            logit_bias: self.logit_bias.clone(),
            seed: self.seed,
            logprobs: self.logprobs,
            ..d
        }
    }
}

/// One generated token's log-probability and its most likely alternatives, with their text
/// (decoded alone, special tokens kept).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprob {
    /// The token id.
    pub id: u32,
    /// Its text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens `(id, text, logprob)`, most likely first.
    pub top: Vec<(u32, String, f32)>,
}

/// A constraint on the output's form (structured output), protocol-neutral.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Any JSON object.
    JsonObject,
    /// JSON valid under this schema.
    JsonSchema(Value),
    /// Text in this Lark grammar (llguidance's dialect; `%json {…}` embeds a schema).
    Lark(String),
    /// One tool call to `only` (or to any of `tools`, in the chat template's form), planned to
    /// close within the request's token budget.
    ToolCall {
        /// The tools.
        tools: Vec<Value>,
        /// The one that must be called.
        only: Option<String>,
    },
}

impl Constraint {
    /// The engine's grammar; `max_tokens` (after clamping) is the budget a forced call is
    /// planned for, counted with `tokenizer`.
    fn to_spec(
        &self,
        max_tokens: usize,
        tokenizer: Option<&Tokenizer>,
    ) -> Result<GrammarSpec, BackendError> {
        Ok(match self {
            Constraint::JsonObject => GrammarSpec::JsonObject,
            // Integers without bounds get bounds, so digits cannot run away.
            Constraint::JsonSchema(v) => GrammarSpec::JsonSchema(glm::bound_integers(v)),
            Constraint::Lark(g) => GrammarSpec::Lark(g.clone()),
            Constraint::ToolCall { tools, only } => {
                // GLM's tags are single tokens: the grammar asks for those tokens.
                let tag_id = |s: &str| tokenizer.and_then(|t| t.token_to_id(s));
                let budget = CallBudget {
                    max_tokens,
                    tag_id: &tag_id,
                };
                GrammarSpec::Lark(
                    glm::tool_call_grammar(tools, only.as_deref(), Some(&budget))
                        .map_err(engine_err)?,
                )
            }
        })
    }
}

/// One generation request, protocol-neutral.
#[derive(Debug, Clone)]
pub struct GenRequest {
    /// What to continue.
    pub prompt: Prompt,
    /// Generated tokens at most; `None` = until the context is full. Always clamped to the room
    /// the context leaves after the prompt.
    pub max_tokens: Option<usize>,
    /// Sampling knobs (see [`Sampling`]).
    pub sampling: Sampling,
    /// Extra stop strings; the model's own stop ids always apply too.
    pub stop: Vec<String>,
    /// Constrain the output (structured output, forced tool calls).
    pub constraint: Option<Constraint>,
    /// Cancel flag, checked once per token.
    pub cancel: CancelToken,
}

/// What [`Backend::generate`] knows once the request is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenStart {
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// The token budget after clamping to the context.
    pub max_tokens: usize,
    /// The rendered prompt leaves the assistant inside `<think>`: the output starts as reasoning.
    pub opens_in_reasoning: bool,
}

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A model stop id ended the turn.
    Stop,
    /// One of the request's stop strings matched (it and everything after it are dropped).
    StopString(String),
    /// The token budget was reached.
    Length,
    /// The request was cancelled (client gone).
    Cancelled,
}

impl FinishReason {
    /// The request log's name of the reason.
    pub fn log_name(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::StopString(_) => "stop_string",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// Token counts of one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (a final stop id included: the model produced it).
    pub completion_tokens: usize,
}

/// The last event of a generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    /// Why it ended.
    pub reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
    /// Decode speed of this generation (tokens after the first, per second).
    pub decode_tok_s: f64,
}

/// What the model thread sends back, in order: deltas, then exactly one `Finish` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum GenEvent {
    /// New output: the ids generated since the last event (model stop ids excluded) and the text
    /// they complete (may be empty: a partial character or held back by a stop string; may
    /// come with no ids when held text is flushed at the end).
    Delta {
        /// Token ids.
        ids: Vec<u32>,
        /// Text.
        text: String,
        /// Log-probabilities of `ids`, when the request asked for them.
        logprobs: Vec<TokenLogprob>,
    },
    /// The prompt's tokens with their log-probabilities (sent first, when the request asked
    /// for [`Sampling::prompt_logprobs`]): the first token, which nothing predicts, then the
    /// others.
    Prompt {
        /// The first prompt token's id and text.
        first: (u32, String),
        /// The other prompt tokens.
        rest: Vec<TokenLogprob>,
    },
    /// Generation ended normally.
    Finish(Finish),
    /// Generation failed (the cause is logged, not sent to clients).
    Error(Failure),
}

/// Why a generation failed: the internal cause (logged) and what a client may be told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The internal cause (file paths, offsets): for the log only.
    pub cause: String,
    /// A model file could not be read (truncated, replaced, an I/O error): the operator's
    /// problem, said as such to the client.
    pub model_file: bool,
}

impl Failure {
    /// A failure with no better description than its cause (a bug, a panic).
    pub fn internal(cause: impl Into<String>) -> Failure {
        Failure {
            cause: cause.into(),
            model_file: false,
        }
    }

    /// Classifies an engine error.
    pub fn of_engine(e: &nectar_engine::Error) -> Failure {
        Failure {
            cause: e.to_string(),
            model_file: matches!(e, nectar_engine::Error::Model(m) if m.is_unreadable_file()),
        }
    }

    /// The message a client sees (no paths: details are in the server log).
    pub fn client_message(&self) -> &'static str {
        if self.model_file {
            "a model file could not be read; the server log has the details"
        } else {
            "internal error while generating"
        }
    }
}

/// Whether the model is usable yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadState {
    /// Loading; generation routes answer 503.
    Loading,
    /// Ready to serve.
    Ready,
    /// Loading failed (the cause).
    Failed(String),
}

/// What the served model can do, reported truthfully on `/v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelInfo {
    /// The model id clients see (the model directory's name).
    pub id: String,
    /// Context length in tokens (prompt + reply).
    pub context_length: usize,
    /// The directory has a tokenizer (text prompts work).
    pub tokenizer: bool,
    /// The directory has a chat template (chat routes work).
    pub chat_template: bool,
    /// The checkpoint carries an MTP head.
    pub mtp_head: bool,
    /// Speculative decoding in force: `"off"`, `"on"` (MTP drafts, fixed depth) or `"auto"`
    /// (MTP drafts, depth chosen by measurement per request).
    pub mtp: String,
    /// Rows that decode together (continuous batching when above 1).
    pub parallel: usize,
    /// Experts are streamed under a memory budget (bytes), if one was given.
    pub memory_budget: Option<u64>,
    /// Expert prefetch in force under that budget (`off`, `measure`, `pilot`, `lookahead`, `both`).
    pub prefetch: String,
    /// The memory equation for that budget (`{"terms": [[name, bytes]…], "lru_per_layer",
    /// "lru_extra_layers", "sparse_layers", "lru_bytes", "slack"}`), when experts are streamed.
    pub memory_plan: Option<Value>,
}

/// The depth `auto` chose for steps of one shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AutoChoice {
    /// Rows in the step.
    pub rows: usize,
    /// Of those, rows whose depth `auto` chooses.
    pub auto_rows: usize,
    /// The depth (0: no drafts).
    pub gamma: usize,
}

/// Counters of the backend, for `/stats` and `/metrics`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BackendStats {
    /// Requests waiting in the queue.
    pub queue_depth: usize,
    /// Queue capacity (requests beyond it get 429).
    pub queue_capacity: usize,
    /// Requests generating now (rows of the batch).
    pub active: usize,
    /// Rows that may decode together.
    pub parallel: usize,
    /// Batched forward steps run.
    pub batch_steps: u64,
    /// Rows summed over those steps (`batch_rows / batch_steps` is the mean batch size).
    pub batch_rows: u64,
    /// Generations that ran to a finish (cancelled ones included).
    pub requests_completed: u64,
    /// Generations that ended because the client went away.
    pub requests_cancelled: u64,
    /// Generations that failed inside the model.
    pub requests_failed: u64,
    /// Prompt tokens processed.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Seconds the model thread spent generating (prefill + decode).
    pub busy_seconds: f64,
    /// Decode speed of the last generation.
    pub last_decode_tok_s: f64,
    /// Tokens per second over all rows of the batch, smoothed over recent steps.
    pub batch_tok_s: f64,
    /// Finished conversations kept in memory so a request continuing one runs only its new
    /// tokens.
    pub sessions: usize,
    /// Tokens their caches hold.
    pub session_tokens: usize,
    /// Requests that continued a kept conversation.
    pub session_hits: u64,
    /// Prompt tokens those requests did not run again.
    pub session_reused_tokens: u64,
    /// Drafts checked by the main model (speculation inside the batch).
    pub mtp_drafted: u64,
    /// Drafts accepted.
    pub mtp_accepted: u64,
    /// Batch steps with at least one row at a decode step that could speculate.
    pub mtp_forwards: u64,
    /// Such rows, summed over steps.
    pub mtp_rows: u64,
    /// Of those, rows that verified at least one draft (the others ran γ = 0: `auto`'s choice,
    /// or no draft was found).
    pub mtp_speculating: u64,
    /// The depth those rows asked for, summed (`mtp_gamma / mtp_rows` is the mean γ in force).
    pub mtp_gamma: u64,
    /// The routed-expert union of decode steps per MoE layer, with drafts and without (how
    /// much verification widens what a step reads).
    pub expert_union: UnionCounts,
    /// `auto`'s decisions so far (one per window of a step shape; a repeated one counts once).
    pub mtp_auto_decisions: u64,
    /// `auto`'s depth in force for each step shape it has seen.
    pub mtp_auto_choices: Vec<AutoChoice>,
    /// Residency telemetry (expert cache), when experts are streamed; opaque JSON.
    pub residency: Option<Value>,
    /// The GPU tier: what is in VRAM and which experts ran where.
    pub gpu: GpuStats,
}

/// The GPU tier as `/stats` and `/metrics` report it (`--gpu-memory`; docs/gpu.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GpuStats {
    /// The load's one line: the device and what went to VRAM, or why the model runs on the
    /// CPU (`None`: no GPU was asked for).
    pub summary: Option<String>,
    /// Device bytes of the matrices in VRAM.
    pub vram_bytes: u64,
    /// Matrices in VRAM (spine and experts).
    pub matrices: usize,
    /// Spine (and resident expert) matrices left on the CPU by the budget.
    pub left_on_cpu: usize,
    /// Bytes of spine host copies released for VRAM (RAM the memory plan gave to experts).
    pub spine_host_released: u64,
    /// Routed experts in VRAM, all layers.
    pub vram_experts: usize,
    /// Per MoE layer: `[layer, experts in VRAM, experts in the layer]`.
    pub vram_experts_per_layer: Vec<(usize, usize, usize)>,
    /// Routed experts computed from the VRAM tier since load (each chosen expert once per
    /// forward).
    pub expert_runs_vram: u64,
    /// Routed experts copied from RAM to the GPU and computed there since load.
    pub expert_runs_copied: u64,
    /// Routed experts computed on the CPU since load.
    pub expert_runs_cpu: u64,
    /// In the last batch step: from VRAM, copied, on the CPU.
    pub last_step: [u64; 3],
    /// Totals of the copies (`None`: no copy route).
    pub copy: Option<nectar_model::arch::glm5::CopyStats>,
}

/// Why a request was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The model is still loading.
    #[error("the model is loading")]
    Loading,
    /// The model failed to load (cause).
    #[error("the model failed to load: {0}")]
    LoadFailed(String),
    /// The queue is full.
    #[error("the queue is full ({capacity} waiting)")]
    QueueFull {
        /// Queue capacity.
        capacity: usize,
    },
    /// The prompt leaves no room in the context.
    #[error("prompt of {prompt_tokens} tokens does not fit a context of {ctx}")]
    ContextOverflow {
        /// Prompt length.
        prompt_tokens: usize,
        /// Context length.
        ctx: usize,
    },
    /// The prompt cannot be used (safe to show the client).
    #[error("{message}")]
    InvalidPrompt {
        /// The request parameter at fault.
        param: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A bug or a failure inside (cause; not shown to clients).
    #[error("{0}")]
    Internal(String),
}

/// The protocol-neutral generation service the HTTP layer talks to.
///
/// Implementations must never panic on request input and must keep one request's failure
/// from affecting another.
pub trait Backend: Send + Sync + 'static {
    /// The model id clients see (known before the model loads).
    fn model_id(&self) -> String;
    /// Loading, ready or failed.
    fn load_state(&self) -> LoadState;
    /// What the model can do; `None` until it is loaded.
    fn info(&self) -> Option<ModelInfo>;
    /// Prompt length in tokens after rendering (for `count_tokens`). Blocking: tokenises.
    fn count_tokens(&self, prompt: &Prompt) -> Result<usize, BackendError>;
    /// Text of token ids (for `echo`). Blocking.
    fn decode(&self, ids: &[u32]) -> Result<String, BackendError>;
    /// Validates and enqueues a request; its events go to `sink`. Blocking: renders and
    /// tokenises the prompt on the calling thread. `sink` is unbounded so the model thread
    /// never waits on a slow client.
    fn generate(
        &self,
        req: GenRequest,
        sink: UnboundedSender<GenEvent>,
    ) -> Result<GenStart, BackendError>;
    /// Counters.
    fn stats(&self) -> BackendStats;
    /// The live expert map and event stream, when the backend feeds one.
    fn observatory(&self) -> Option<Arc<crate::observe::Observatory>> {
        None
    }
}

/// How to start an [`EngineBackend`].
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// The model directory.
    pub model_dir: PathBuf,
    /// Context length; `None` = the model's `max_position_embeddings`, at most 4096 (the
    /// default of `nectar fit`, so the memory plan and the server agree).
    pub ctx_size: Option<usize>,
    /// Stream routed experts under this budget (bytes); `None` keeps them memory-mapped.
    pub memory_budget: Option<u64>,
    /// Requests that may wait for the model thread.
    pub queue_capacity: usize,
    /// Requests that decode together in one batched forward per step.
    pub parallel: usize,
    /// Speculative decoding (MTP drafts), serial: only with `parallel == 1`. A model without an
    /// MTP head falls back to plain decoding when `auto` is set and fails to load otherwise.
    pub speculation: Option<Speculation>,
    /// Compute threads (`None`: one per core). The model thread is one of them (see
    /// `scheduler::model_thread`).
    pub threads: Option<usize>,
    /// VRAM for the GPU tier (`--gpu-memory`; `None`: the CPU only).
    pub gpu_memory: Option<nectar_model::arch::glm5::GpuMemory>,
    /// Expert prefetch under a memory budget (`--prefetch`; `nectar run`'s default, `both`).
    pub prefetch: nectar_model::arch::glm5::Prefetch,
    /// Expert-reading threads under a memory budget (`--io-threads`).
    pub io_threads: usize,
    /// What a full layer of the expert cache keeps (`--admission`).
    pub admission: nectar_residency::Admission,
    /// Which experts a memory budget pins (`--pin`, `--pin-size`).
    pub pin: Pin,
}

pub use nectar_engine::Pin;

impl EngineOptions {
    /// Defaults for `dir`: model-sized context, no budget, a queue of 64.
    pub fn new(dir: impl Into<PathBuf>) -> EngineOptions {
        EngineOptions {
            model_dir: dir.into(),
            ctx_size: None,
            memory_budget: None,
            queue_capacity: 64,
            parallel: 1,
            speculation: None,
            threads: None,
            gpu_memory: None,
            prefetch: nectar_model::arch::glm5::Prefetch::Both,
            io_threads: 3,
            admission: nectar_model::arch::glm5::DEFAULT_ADMISSION,
            pin: Pin::Auto { bytes: None },
        }
    }
}

/// Default context when the flag is absent (see [`EngineOptions::ctx_size`]).
pub(crate) const DEFAULT_CTX: usize = 4096;

/// The text side of a loaded model, shared with HTTP threads (tokenising and rendering happen
/// there, not on the model thread).
pub(crate) struct TextSide {
    pub(crate) tokenizer: Option<Tokenizer>,
    pub(crate) template: Option<ChatTemplate>,
    pub(crate) vocab_size: usize,
    pub(crate) stop_ids: Vec<u32>,
    pub(crate) info: ModelInfo,
    pub(crate) residency: Option<Box<dyn Fn() -> Option<Value> + Send + Sync>>,
    /// What the load put in VRAM (the run counters are in [`Counters`]).
    pub(crate) gpu: GpuStats,
}

/// State shared by the handle and the model thread.
pub(crate) struct Shared {
    pub(crate) state: watch::Sender<LoadState>,
    pub(crate) text: OnceLock<TextSide>,
    capacity: usize,
    pub(crate) queued: AtomicUsize,
    pub(crate) n: Counters,
    /// The expert map the model thread reports into.
    pub(crate) observatory: Arc<crate::observe::Observatory>,
    /// Set by [`EngineBackend::close`]: the model thread ends its rows and returns (flushing the
    /// usage ledger on its way out).
    pub(crate) closing: std::sync::atomic::AtomicBool,
}

/// The model thread's counters (see [`BackendStats`] for their meaning).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) active: AtomicUsize,
    pub(crate) completed: AtomicU64,
    pub(crate) cancelled: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) prompt_tokens: AtomicU64,
    pub(crate) generated_tokens: AtomicU64,
    pub(crate) busy_nanos: AtomicU64,
    pub(crate) last_tok_s_bits: AtomicU64,
    pub(crate) batch_steps: AtomicU64,
    pub(crate) batch_rows: AtomicU64,
    pub(crate) batch_tok_s_bits: AtomicU64,
    pub(crate) mtp_drafted: AtomicU64,
    pub(crate) mtp_accepted: AtomicU64,
    pub(crate) mtp_forwards: AtomicU64,
    pub(crate) mtp_rows: AtomicU64,
    pub(crate) mtp_speculating: AtomicU64,
    pub(crate) mtp_gamma: AtomicU64,
    pub(crate) expert_union: std::sync::Mutex<UnionCounts>,
    /// `auto`'s decision count and choices, as of the last step.
    pub(crate) auto: std::sync::Mutex<(u64, Vec<AutoChoice>)>,
    pub(crate) sessions: AtomicUsize,
    pub(crate) session_tokens: AtomicUsize,
    pub(crate) session_hits: AtomicU64,
    pub(crate) session_reused: AtomicU64,
    /// Routed experts computed (since load; in the last step): from VRAM, copied, on the CPU.
    pub(crate) expert_runs: [AtomicU64; 3],
    pub(crate) last_step_runs: [AtomicU64; 3],
    /// Totals of the copies to the GPU, as of the last step.
    pub(crate) copy: std::sync::Mutex<Option<nectar_model::arch::glm5::CopyStats>>,
}

/// One queued generation.
pub(crate) struct Job {
    /// The prepared state (validated, its grammar compiled), admitted into the batch.
    pub(crate) state: RequestState,
    /// The request itself (its prompt, for the prompt's logprobs and the usage counts).
    pub(crate) request: Request,
    /// Send the prompt's logprobs first, with this many alternatives per token.
    pub(crate) prompt_logprobs: Option<usize>,
    pub(crate) cancel: CancelToken,
    pub(crate) sink: UnboundedSender<GenEvent>,
}

/// The backend over the engine: one model thread, a bounded queue, continuous batching.
pub struct EngineBackend {
    shared: Arc<Shared>,
    jobs: SyncSender<Job>,
    model_id: String,
    /// The model thread, joined by [`EngineBackend::close`].
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for EngineBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBackend")
            .field("model_id", &self.model_id)
            .field("state", &*self.shared.state.borrow())
            .finish()
    }
}

impl EngineBackend {
    /// Starts the model thread, which loads the model and then serves the queue. Returns at
    /// once: the state is [`LoadState::Loading`] until the load finishes (watch it with
    /// [`EngineBackend::subscribe`]).
    pub fn spawn(opts: EngineOptions) -> std::io::Result<EngineBackend> {
        let capacity = opts.queue_capacity.max(1);
        let (state, _) = watch::channel(LoadState::Loading);
        let shared = Arc::new(Shared {
            state,
            text: OnceLock::new(),
            capacity,
            queued: AtomicUsize::new(0),
            n: Counters::default(),
            observatory: Arc::default(),
            closing: Default::default(),
        });
        let (jobs, rx) = sync_channel::<Job>(capacity);
        let model_id = model_id_of(&opts.model_dir);
        let thread_shared = shared.clone();
        let id = model_id.clone();
        let thread = std::thread::Builder::new()
            .name("nectar-model".into())
            .spawn(move || crate::scheduler::model_thread(opts, id, thread_shared, rx))?;
        Ok(EngineBackend {
            shared,
            jobs,
            model_id,
            thread: std::sync::Mutex::new(Some(thread)),
        })
    }

    /// Shuts the model thread down: rows still running fail ("shutting down"), the usage
    /// ledger gets its last flush, and the thread is joined. Waits at most `wait` (a model still
    /// loading cannot stop sooner); `true` when the thread ended.
    pub fn close(&self, wait: std::time::Duration) -> bool {
        self.shared.closing.store(true, Ordering::SeqCst);
        let mut slot = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        let Some(t) = slot.take() else {
            return true;
        };
        let t0 = std::time::Instant::now();
        while !t.is_finished() {
            if t0.elapsed() >= wait {
                *slot = Some(t);
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        t.join().is_ok()
    }

    /// A receiver that sees every load-state change (the CLI waits on it to report a failed
    /// load and exit).
    pub fn subscribe(&self) -> watch::Receiver<LoadState> {
        self.shared.state.subscribe()
    }

    fn text(&self) -> Result<&TextSide, BackendError> {
        match &*self.shared.state.borrow() {
            LoadState::Loading => return Err(BackendError::Loading),
            LoadState::Failed(e) => return Err(BackendError::LoadFailed(e.clone())),
            LoadState::Ready => {}
        }
        self.shared
            .text
            .get()
            .ok_or_else(|| BackendError::Internal("ready without a text side".into()))
    }

    /// Renders and tokenises a prompt; the flag says whether it leaves the assistant inside
    /// `<think>`.
    fn tokenize(&self, prompt: &Prompt) -> Result<(Vec<u32>, bool), BackendError> {
        let text = self.text()?;
        let tokenizer = || {
            text.tokenizer.as_ref().ok_or(BackendError::InvalidPrompt {
                param: "prompt",
                message: "this model has no tokenizer.json: give the prompt as token ids".into(),
            })
        };
        let (ids, opens_in_reasoning) = match prompt {
            Prompt::Ids(ids) => {
                if let Some(bad) = ids.iter().find(|&&id| id as usize >= text.vocab_size) {
                    return Err(BackendError::InvalidPrompt {
                        param: "prompt",
                        message: format!(
                            "token id {bad} is outside the vocabulary (size {})",
                            text.vocab_size
                        ),
                    });
                }
                (ids.clone(), false)
            }
            Prompt::Text(s) => (tokenizer()?.encode(s, false).map_err(engine_err)?, false),
            Prompt::Chat {
                messages,
                tools,
                enable_thinking,
            } => {
                let template = text.template.as_ref().ok_or(BackendError::InvalidPrompt {
                    param: "messages",
                    message: "this model has no chat template; use /v1/completions".into(),
                })?;
                let mut extra = serde_json::Map::new();
                if let Some(on) = enable_thinking {
                    extra.insert("enable_thinking".into(), Value::Bool(*on));
                }
                let tools = tools.as_ref().filter(|t| !t.is_null());
                let rendered = template
                    .render(messages, tools, true, &extra)
                    .map_err(engine_err)?;
                let opens = glm::opens_in_reasoning(&rendered);
                (
                    tokenizer()?.encode(&rendered, false).map_err(engine_err)?,
                    opens,
                )
            }
        };
        if ids.is_empty() {
            return Err(BackendError::InvalidPrompt {
                param: "prompt",
                message: "the prompt is empty".into(),
            });
        }
        Ok((ids, opens_in_reasoning))
    }
}

impl Backend for EngineBackend {
    fn model_id(&self) -> String {
        self.model_id.clone()
    }

    fn load_state(&self) -> LoadState {
        self.shared.state.borrow().clone()
    }

    fn info(&self) -> Option<ModelInfo> {
        self.text().ok().map(|t| t.info.clone())
    }

    fn count_tokens(&self, prompt: &Prompt) -> Result<usize, BackendError> {
        self.tokenize(prompt).map(|(ids, _)| ids.len())
    }

    fn decode(&self, ids: &[u32]) -> Result<String, BackendError> {
        let text = self.text()?;
        match &text.tokenizer {
            Some(t) => t.decode(ids, true).map_err(engine_err),
            None => Ok(String::new()),
        }
    }

    fn generate(
        &self,
        req: GenRequest,
        sink: UnboundedSender<GenEvent>,
    ) -> Result<GenStart, BackendError> {
        let (prompt, opens_in_reasoning) = self.tokenize(&req.prompt)?;
        let ctx = self.text()?.info.context_length;
        if prompt.len() >= ctx {
            return Err(BackendError::ContextOverflow {
                prompt_tokens: prompt.len(),
                ctx,
            });
        }
        let room = ctx - prompt.len();
        let max_tokens = req.max_tokens.unwrap_or(room).min(room);
        let start = GenStart {
            prompt_tokens: prompt.len(),
            max_tokens,
            opens_in_reasoning,
        };
        let text = self.text()?;
        let grammar = match &req.constraint {
            Some(c) => Some(c.to_spec(max_tokens, text.tokenizer.as_ref())?),
            None => None,
        };
        let request = Request {
            prompt_ids: prompt,
            params: req.sampling.to_params(),
            max_tokens,
            stop_strings: req.stop,
            extra_stop_ids: Vec::new(),
            grammar,
        };
        // Refuse a bad knob or grammar now, as a 400, rather than as a failure after the stream
        // started: the request's whole state (sampler, stops, compiled grammar) is built here
        // and travels to the model thread, which only decodes.
        let state = RequestState::new(
            &request,
            &text.stop_ids,
            text.vocab_size,
            text.tokenizer.as_ref(),
        )
        .map_err(engine_err)?;
        let job = Job {
            state,
            request,
            prompt_logprobs: req
                .sampling
                .prompt_logprobs
                .then(|| req.sampling.logprobs.unwrap_or(0)),
            cancel: req.cancel,
            sink,
        };
        // Count first so the model thread's decrement can never run before the increment.
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        match self.jobs.try_send(job) {
            Ok(()) => Ok(start),
            Err(e) => {
                self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                Err(match e {
                    TrySendError::Full(_) => BackendError::QueueFull {
                        capacity: self.shared.capacity,
                    },
                    TrySendError::Disconnected(_) => {
                        BackendError::Internal("the model thread has stopped".into())
                    }
                })
            }
        }
    }

    fn observatory(&self) -> Option<Arc<crate::observe::Observatory>> {
        Some(self.shared.observatory.clone())
    }

    fn stats(&self) -> BackendStats {
        let s = &self.shared;
        let n = &s.n;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // One lock, taken and released before the struct is built.
        let auto = n.auto.lock().unwrap_or_else(|e| e.into_inner()).clone();
        BackendStats {
            queue_depth: s.queued.load(Ordering::SeqCst),
            queue_capacity: s.capacity,
            active: n.active.load(Ordering::SeqCst),
            parallel: s.text.get().map_or(0, |t| t.info.parallel),
            batch_steps: get(&n.batch_steps),
            batch_rows: get(&n.batch_rows),
            requests_completed: get(&n.completed),
            requests_cancelled: get(&n.cancelled),
            requests_failed: get(&n.failed),
            prompt_tokens: get(&n.prompt_tokens),
            generated_tokens: get(&n.generated_tokens),
            busy_seconds: get(&n.busy_nanos) as f64 * 1e-9,
            last_decode_tok_s: f64::from_bits(get(&n.last_tok_s_bits)),
            batch_tok_s: f64::from_bits(get(&n.batch_tok_s_bits)),
            mtp_drafted: get(&n.mtp_drafted),
            mtp_accepted: get(&n.mtp_accepted),
            mtp_forwards: get(&n.mtp_forwards),
            mtp_rows: get(&n.mtp_rows),
            mtp_speculating: get(&n.mtp_speculating),
            mtp_gamma: get(&n.mtp_gamma),
            expert_union: *n.expert_union.lock().unwrap_or_else(|e| e.into_inner()),
            mtp_auto_decisions: auto.0,
            mtp_auto_choices: auto.1,
            sessions: n.sessions.load(Ordering::Relaxed),
            session_tokens: n.session_tokens.load(Ordering::Relaxed),
            session_hits: get(&n.session_hits),
            session_reused_tokens: get(&n.session_reused),
            residency: s
                .text
                .get()
                .and_then(|t| t.residency.as_ref())
                .and_then(|f| f()),
            gpu: GpuStats {
                expert_runs_vram: get(&n.expert_runs[0]),
                expert_runs_copied: get(&n.expert_runs[1]),
                expert_runs_cpu: get(&n.expert_runs[2]),
                last_step: [0, 1, 2].map(|i| get(&n.last_step_runs[i])),
                copy: *n.copy.lock().unwrap_or_else(|p| p.into_inner()),
                ..s.text.get().map(|t| t.gpu.clone()).unwrap_or_default()
            },
        }
    }
}

/// The id clients see: the model directory's name.
fn model_id_of(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "nectar".into())
}

/// Maps engine errors to request errors: what the client sent wrong gets a safe message;
/// anything else is internal (its text may name server paths).
pub(crate) fn engine_err(e: nectar_engine::Error) -> BackendError {
    use nectar_engine::Error as E;
    match e {
        E::TemplateRaised { message, .. } => BackendError::InvalidPrompt {
            param: "messages",
            message: format!("the chat template rejected the conversation: {message}"),
        },
        E::InvalidChatInput { field, reason } => BackendError::InvalidPrompt {
            param: "messages",
            message: format!("`{field}` {reason}"),
        },
        E::TemplateRender { source, .. } => BackendError::InvalidPrompt {
            param: "messages",
            message: format!("the chat template cannot render these messages: {source}"),
        },
        E::UnknownTokenId { id, vocab_size, .. } => BackendError::InvalidPrompt {
            param: "prompt",
            message: format!("token id {id} is not in the vocabulary (size {vocab_size})"),
        },
        E::InvalidParam { param, reason } => BackendError::InvalidPrompt {
            param: if param == "prompt_ids" {
                "prompt"
            } else {
                param
            },
            message: format!("`{param}`: {reason}"),
        },
        other => BackendError::Internal(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancel_guard_cancels_on_drop() {
        let t = CancelToken::new();
        {
            let _g = t.guard();
            assert!(!t.is_cancelled());
        }
        assert!(t.is_cancelled());
    }

    #[test]
    fn model_id_is_the_directory_name() {
        assert_eq!(model_id_of(Path::new("/m/glm-5.2-int4")), "glm-5.2-int4");
        assert_eq!(model_id_of(Path::new("/")), "nectar");
    }

    #[test]
    fn missing_model_reports_failed_load() {
        let b = EngineBackend::spawn(EngineOptions::new("/nonexistent/model")).unwrap();
        let mut rx = b.subscribe();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let state = rt.block_on(async {
            loop {
                let s = rx.borrow_and_update().clone();
                if s != LoadState::Loading {
                    return s;
                }
                rx.changed().await.unwrap();
            }
        });
        assert!(matches!(state, LoadState::Failed(_)), "{state:?}");
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let req = GenRequest {
            prompt: Prompt::Ids(vec![1]),
            max_tokens: Some(1),
            sampling: Sampling::default(),
            stop: vec![],
            constraint: None,
            cancel: CancelToken::new(),
        };
        assert!(matches!(
            b.generate(req, tx),
            Err(BackendError::LoadFailed(_))
        ));
    }
}
