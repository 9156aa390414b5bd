//! One request's generation as the protocol layer sees it: backend events turned into classified
//! output ([`Piece`]s: text, reasoning, tool calls) and a finish, consumed either whole
//! ([`Generation::collect`]) or as a stream ([`Generation::into_stream`]).
//!
//! Whoever holds a `Generation` holds the request's cancel guard: when the client goes away,
//! axum drops the handler future (non-streaming) or the response body stream (streaming), the
//! guard drops, and the model thread stops at its next token.

use crate::backend::{
    Backend, BackendError, CancelOnDrop, Failure, Finish, FinishReason, GenEvent, GenRequest,
    GenStart, OutputParser, Piece, Prompt, StringParams, TokenLogprob, ToolCall,
};
use crate::error::ApiError;
use crate::observe::requests::RequestRecord;
use futures_util::Stream;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// How the output is classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    /// Raw text (`/v1/completions`): no tags are interpreted.
    Raw,
    /// Chat: `<think>` is reasoning; `<tool_call>` is parsed when `tools` is set.
    Chat {
        /// The request offered tools (and did not forbid them).
        tools: bool,
        /// Tool calls at most (`parallel_tool_calls: false`, Anthropic's
        /// `disable_parallel_tool_use`: 1); `None` for no limit.
        max_calls: Option<usize>,
    },
}

/// One event of a generation, after parsing.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputEvent {
    /// Classified output.
    Piece(Piece),
    /// Token ids generated since the previous event (model stop ids excluded), with their
    /// logprobs when the request asked for them. Comes before the pieces those ids complete.
    Tokens {
        /// The ids.
        ids: Vec<u32>,
        /// Their logprobs (empty unless asked for).
        logprobs: Vec<TokenLogprob>,
    },
    /// The prompt's tokens with their logprobs (first, when asked for): the first token's id
    /// and text (nothing predicts it), then the others.
    Prompt {
        /// The first prompt token.
        first: (u32, String),
        /// The others.
        rest: Vec<TokenLogprob>,
    },
    /// The end.
    Finish(Finish),
    /// The model failed mid-generation; the cause is logged, the client gets
    /// [`Failure::client_message`].
    Failed(Failure),
}

/// A running generation.
pub struct Generation {
    /// What the backend reported at acceptance.
    pub start: GenStart,
    rx: UnboundedReceiver<GenEvent>,
    parser: Option<OutputParser>,
    pending: VecDeque<OutputEvent>,
    done: bool,
    _guard: CancelOnDrop,
    /// The request's record (request log, latency histograms), when started inside one.
    record: Option<Arc<RequestRecord>>,
}

/// One part of a collected output.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// Answer text.
    Text(String),
    /// Reasoning text.
    Reasoning(String),
    /// A whole tool call.
    Call(ToolCall),
}

/// A finished generation, collected.
#[derive(Debug, Clone, PartialEq)]
pub struct Collected {
    /// The output in order (adjacent parts of one kind merged).
    pub pieces: Vec<Part>,
    /// Every generated id (model stop ids excluded).
    pub ids: Vec<u32>,
    /// Their logprobs, when the request asked for them.
    pub logprobs: Vec<TokenLogprob>,
    /// The prompt's tokens with logprobs, when asked for (see [`OutputEvent::Prompt`]).
    pub prompt: Option<((u32, String), Vec<TokenLogprob>)>,
    /// How it ended.
    pub finish: Finish,
}

impl Collected {
    /// All answer text.
    pub fn text(&self) -> String {
        self.pieces
            .iter()
            .filter_map(|p| match p {
                Part::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    /// All reasoning text.
    pub fn reasoning(&self) -> String {
        self.pieces
            .iter()
            .filter_map(|p| match p {
                Part::Reasoning(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The tool calls, in order.
    pub fn tool_calls(&self) -> Vec<&ToolCall> {
        self.pieces
            .iter()
            .filter_map(|p| match p {
                Part::Call(c) => Some(c),
                _ => None,
            })
            .collect()
    }
}

/// Maps a refusal to the client's error (`prompt_param` names the prompt field of the route).
pub fn backend_error(e: BackendError, prompt_param: &str) -> ApiError {
    match e {
        BackendError::Loading => ApiError::loading(),
        BackendError::LoadFailed(cause) => ApiError::load_failed(cause),
        BackendError::QueueFull { capacity } => ApiError::queue_full(capacity),
        BackendError::ContextOverflow { prompt_tokens, ctx } => {
            let mut e = ApiError::context_overflow(prompt_tokens, ctx);
            e.param = Some(prompt_param.into());
            e
        }
        BackendError::InvalidPrompt { param, message } => {
            let param = if param == "messages" || param == "prompt" {
                prompt_param
            } else {
                param
            };
            ApiError::invalid_param(param, message)
        }
        BackendError::Internal(cause) => ApiError::internal(cause),
    }
}

impl Generation {
    /// Submits `req`. Rendering and tokenising run on the blocking pool; refusals (loading, queue
    /// full, context overflow, a bad prompt) come back as errors before any output.
    pub async fn start(
        backend: Arc<dyn Backend>,
        req: GenRequest,
        mode: OutputMode,
        prompt_param: &str,
    ) -> Result<Generation, ApiError> {
        let guard = req.cancel.guard();
        // String parameters of the tools shown stream as generated and stay strings.
        let strings = match &req.prompt {
            Prompt::Chat {
                tools: Some(serde_json::Value::Array(tools)),
                ..
            } => StringParams::of_tools(tools),
            _ => StringParams::default(),
        };
        let record = RequestRecord::current();
        let model = backend.model_id();
        let (tx, rx) = unbounded_channel();
        let start = tokio::task::spawn_blocking(move || backend.generate(req, tx))
            .await
            .map_err(|e| ApiError::internal(format!("generate task failed: {e}")))?
            .map_err(|e| backend_error(e, prompt_param))?;
        if let Some(r) = &record {
            r.generation_started(&model, start.prompt_tokens);
        }
        let parser = match mode {
            OutputMode::Raw => None,
            OutputMode::Chat { tools, max_calls } => {
                let p =
                    OutputParser::new(start.opens_in_reasoning, tools).with_string_params(strings);
                Some(match max_calls {
                    Some(n) => p.with_max_calls(n),
                    None => p,
                })
            }
        };
        Ok(Generation {
            start,
            rx,
            parser,
            pending: VecDeque::new(),
            done: false,
            _guard: guard,
            record,
        })
    }

    /// The next event; `None` after the finish (or failure).
    pub async fn next(&mut self) -> Option<OutputEvent> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Some(e);
            }
            if self.done {
                return None;
            }
            match self.rx.recv().await {
                Some(GenEvent::Delta {
                    ids,
                    text,
                    logprobs,
                }) => {
                    if let Some(r) = &self.record {
                        r.tokens(ids.len());
                    }
                    if !ids.is_empty() {
                        self.pending
                            .push_back(OutputEvent::Tokens { ids, logprobs });
                    }
                    let pieces = match &mut self.parser {
                        Some(p) => p.push(&text),
                        None if text.is_empty() => vec![],
                        None => vec![Piece::Text(text)],
                    };
                    self.pending
                        .extend(pieces.into_iter().map(OutputEvent::Piece));
                }
                Some(GenEvent::Prompt { first, rest }) => {
                    self.pending.push_back(OutputEvent::Prompt { first, rest });
                }
                Some(GenEvent::Finish(f)) => {
                    if let Some(r) = &self.record {
                        r.finished(f.reason.log_name(), f.usage.completion_tokens);
                    }
                    self.flush_parser();
                    self.pending.push_back(OutputEvent::Finish(f));
                    self.done = true;
                }
                Some(GenEvent::Error(failure)) => {
                    if let Some(r) = &self.record {
                        r.finished("error", 0);
                    }
                    tracing::error!(cause = %failure.cause, "generation failed");
                    self.pending.push_back(OutputEvent::Failed(failure));
                    self.done = true;
                }
                None => {
                    // The model thread dropped the sink without a finish: a bug, reported as a
                    // failure rather than a silent truncation.
                    tracing::error!("generation ended without a finish event");
                    self.pending
                        .push_back(OutputEvent::Failed(Failure::internal("no finish event")));
                    self.done = true;
                }
            }
        }
    }

    fn flush_parser(&mut self) {
        if let Some(p) = &mut self.parser {
            let rest = p.finish();
            self.pending
                .extend(rest.into_iter().map(OutputEvent::Piece));
        }
    }

    /// Waits for the whole output.
    pub async fn collect(mut self) -> Result<Collected, ApiError> {
        let mut pieces: Vec<Part> = Vec::new();
        let mut ids = Vec::new();
        let mut lps = Vec::new();
        let mut prompt = None;
        while let Some(e) = self.next().await {
            match e {
                OutputEvent::Piece(p) => match (p, pieces.last_mut()) {
                    (Piece::Text(t), Some(Part::Text(last))) => last.push_str(&t),
                    (Piece::Reasoning(t), Some(Part::Reasoning(last))) => last.push_str(&t),
                    (Piece::Text(t), _) => pieces.push(Part::Text(t)),
                    (Piece::Reasoning(t), _) => pieces.push(Part::Reasoning(t)),
                    (Piece::CallEnd(c), _) => pieces.push(Part::Call(c)),
                    // A call's start and argument fragments are for streams; its end is whole.
                    (Piece::CallStart { .. } | Piece::CallArgs(_), _) => {}
                },
                OutputEvent::Tokens { ids: i, logprobs } => {
                    ids.extend(i);
                    lps.extend(logprobs);
                }
                OutputEvent::Prompt { first, rest } => prompt = Some((first, rest)),
                OutputEvent::Finish(finish) => {
                    return Ok(Collected {
                        pieces,
                        ids,
                        logprobs: lps,
                        prompt,
                        finish,
                    })
                }
                OutputEvent::Failed(f) => {
                    let mut e = ApiError::internal(f.cause.clone());
                    e.message = f.client_message().into();
                    return Err(e);
                }
            }
        }
        Err(ApiError::internal("generation failed"))
    }

    /// The events as a stream (ends after the finish or a failure). Dropping the stream cancels
    /// the generation.
    pub fn into_stream(self) -> impl Stream<Item = OutputEvent> + Send + 'static {
        futures_util::stream::unfold(self, |mut g| async move {
            let e = g.next().await?;
            Some((e, g))
        })
    }
}

/// OpenAI's `finish_reason` for a finish (`tool_calls` when the turn ended in calls).
pub fn openai_finish_reason(f: &Finish, called_tools: bool) -> &'static str {
    match f.reason {
        FinishReason::Length => "length",
        _ if called_tools => "tool_calls",
        _ => "stop",
    }
}
