//! `POST /v1/completions` (OpenAI legacy Completions): raw text continuation, no template.
//!
//! `prompt` is a string, a list of token ids, or a one-element list of either (one prompt per
//! request: several prompts would be several choices, which this server does not batch yet).
//! `max_tokens` defaults to 16, as in OpenAI's API. The output is raw text: tags are not
//! interpreted. Streaming sends `text_completion` objects as `data:` lines, then `data: [DONE]`.
//! With `echo` and `logprobs`, `logprobs` covers the prompt's tokens too (the first with null
//! logprobs, as nothing predicts it), as in OpenAI's API: the prompt runs through the model
//! once more for them.

use crate::backend::{CancelToken, GenRequest, Piece, Prompt, Sampling, TokenLogprob};
use crate::error::{ApiError, ApiResult, Flavour};
use crate::generation::{openai_finish_reason, Generation, OutputEvent, OutputMode};
use crate::protocol::openai_chat::{stream_error, usage_json};
use crate::protocol::{
    check_model, new_id, parse_body, parse_logit_bias, unix_now, validate_max_tokens,
    validate_sampling, StopField,
};
use crate::sse;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};

/// OpenAI's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: u64 = 16;

/// The request body.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    /// The served model's id or an alias (`--alias`); another name is 404.
    #[serde(default)]
    pub model: Option<String>,
    /// Text, token ids, or a one-element list of either.
    pub prompt: Value,
    /// Generated tokens at most (default 16).
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Prepend the prompt's text to the output.
    #[serde(default)]
    pub echo: Option<bool>,
    /// Return each token's log-probability and the N (0–5) most likely alternatives.
    #[serde(default)]
    pub logprobs: Option<u32>,
    /// Token id (as a string) → bias added to its logit.
    #[serde(default)]
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// Stop strings.
    #[serde(default)]
    pub stop: Option<StopField>,
    /// Stream chunks.
    #[serde(default)]
    pub stream: Option<bool>,
    /// `include_usage`.
    #[serde(default)]
    pub stream_options: Option<crate::protocol::openai_chat::StreamOptions>,
    /// Sampling temperature (absent or 0: greedy).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus mass.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Top-k.
    #[serde(default)]
    pub top_k: Option<u32>,
    /// Min-p.
    #[serde(default)]
    pub min_p: Option<f32>,
    /// Presence penalty.
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    /// Frequency penalty.
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    /// Repetition penalty.
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    /// Seed.
    #[serde(default)]
    pub seed: Option<i64>,
    /// Choices; only 1.
    #[serde(default)]
    pub n: Option<u32>,
    /// Only 1.
    #[serde(default)]
    pub best_of: Option<u32>,
    /// Insertion suffix: not supported.
    #[serde(default)]
    pub suffix: Option<String>,
}

/// The handler.
pub async fn handle(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match run(state, body).await {
        Ok(r) => r,
        Err(e) => e.flavour(Flavour::OpenAi).into_response(),
    }
}

/// The prompt field as one prompt.
fn prompt_of(v: &Value) -> ApiResult<Prompt> {
    let bad = || {
        ApiError::invalid_param(
            "prompt",
            "`prompt` must be a string, a list of token ids, or a list holding one of those",
        )
    };
    match v {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(items) if items.iter().all(Value::is_number) && !items.is_empty() => {
            let ids = items
                .iter()
                .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| {
                    ApiError::invalid_param("prompt", "token ids must be non-negative integers")
                })?;
            Ok(Prompt::Ids(ids))
        }
        Value::Array(items) if items.len() == 1 && !items[0].is_number() => prompt_of(&items[0]),
        Value::Array(items) if items.len() > 1 && !items[0].is_number() => {
            Err(ApiError::invalid_param(
                "prompt",
                "one prompt per request is supported (a list of several prompts is not batched yet)",
            ))
        }
        _ => Err(bad()),
    }
}

async fn run(state: AppState, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let req: CompletionRequest = parse_body(body, Flavour::OpenAi, state.config.body_limit)?;
    check_model(&state, req.model.as_deref())?;
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_param("n", "only n = 1 is supported"));
    }
    if req.best_of.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_param(
            "best_of",
            "only best_of = 1 is supported",
        ));
    }
    if req.logprobs.is_some_and(|n| n > 5) {
        return Err(ApiError::invalid_param(
            "logprobs",
            "`logprobs` must be between 0 and 5",
        ));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param(
            "suffix",
            "suffix (fill-in-the-middle) is not supported",
        ));
    }
    let prompt = prompt_of(&req.prompt)?;
    let sampling = Sampling {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
        repetition_penalty: req.repetition_penalty,
        seed: req.seed.map(|s| s as u64),
        logit_bias: parse_logit_bias(req.logit_bias.as_ref())?,
        logprobs: req.logprobs.map(|n| n as usize),
        prompt_logprobs: req.echo.unwrap_or(false) && req.logprobs.is_some(),
    };
    validate_sampling(&sampling)?;
    let max_tokens = validate_max_tokens(
        "max_tokens",
        Some(req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
    )?;
    let stop = match req.stop {
        Some(s) => s.into_vec("stop")?,
        None => vec![],
    };
    let echo = req.echo.unwrap_or(false);
    let echoed = if echo {
        match &prompt {
            Prompt::Text(t) => t.clone(),
            Prompt::Ids(ids) => {
                let backend = state.backend.clone();
                let ids = ids.clone();
                tokio::task::spawn_blocking(move || backend.decode(&ids))
                    .await
                    .map_err(|e| ApiError::internal(format!("decode task failed: {e}")))?
                    .map_err(|e| crate::generation::backend_error(e, "prompt"))?
            }
            Prompt::Chat { .. } => String::new(),
        }
    } else {
        String::new()
    };
    let stream = req.stream.unwrap_or(false);
    let include_usage = stream
        && req
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
    let gen = Generation::start(
        state.backend.clone(),
        GenRequest {
            prompt,
            max_tokens,
            sampling,
            stop,
            constraint: None,
            cancel: CancelToken::new(),
        },
        OutputMode::Raw,
        "prompt",
    )
    .await?;
    let model = state.backend.model_id();
    let id = new_id("cmpl-");
    let created = unix_now();
    let want_logprobs = req.logprobs.is_some();
    if stream {
        let mut st = CompletionStream {
            id,
            created,
            model,
            include_usage,
            logprobs: want_logprobs.then(|| LegacyLogprobs::new(echoed.len())),
            echo_with_prompt: None,
        };
        // With logprobs, the echoed prompt goes out with its tokens' logprobs (they come first).
        let first = if echoed.is_empty() {
            vec![]
        } else if want_logprobs {
            st.echo_with_prompt = Some(echoed);
            vec![]
        } else {
            vec![sse::data(&st.chunk(&echoed, None))]
        };
        let events = futures_util::stream::iter(first).chain(
            gen.into_stream()
                .flat_map(move |ev| futures_util::stream::iter(st.on_event(ev))),
        );
        return Ok(sse::response(events));
    }
    let out = gen.collect().await?;
    let body = json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": Value::Null,
        "choices": [{
            "text": format!("{echoed}{}", out.text()),
            "index": 0,
            "logprobs": if want_logprobs {
                let mut l = LegacyLogprobs::new(echoed.len());
                if let Some((first, rest)) = &out.prompt {
                    l.prompt(first, rest, echoed.len());
                }
                l.extend(&out.logprobs);
                l.take()
            } else {
                Value::Null
            },
            "finish_reason": openai_finish_reason(&out.finish, false),
        }],
        "usage": usage_json(&out.finish.usage),
    });
    Ok(axum::Json(body).into_response())
}

/// The legacy Completions `logprobs` object, built token by token (`text_offset` counts bytes
/// of the choice text, the echoed prompt included).
struct LegacyLogprobs {
    offset: usize,
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<Value>,
}

impl LegacyLogprobs {
    fn new(offset: usize) -> LegacyLogprobs {
        LegacyLogprobs {
            offset,
            tokens: vec![],
            token_logprobs: vec![],
            top_logprobs: vec![],
            text_offset: vec![],
        }
    }

    fn extend(&mut self, lps: &[TokenLogprob]) {
        for t in lps {
            self.tokens.push(json!(t.token));
            self.token_logprobs.push(json!(t.logprob));
            let top: serde_json::Map<String, Value> = t
                .top
                .iter()
                .map(|(_, s, lp)| (s.clone(), json!(lp)))
                .collect();
            self.top_logprobs.push(Value::Object(top));
            self.text_offset.push(json!(self.offset));
            self.offset += t.token.len();
        }
    }

    /// The prompt's tokens (echo): the first has null logprobs; offsets count from 0, and the
    /// generated tokens' from `echoed` (the echoed text's length).
    fn prompt(&mut self, first: &(u32, String), rest: &[TokenLogprob], echoed: usize) {
        self.offset = 0;
        self.tokens.push(json!(first.1));
        self.token_logprobs.push(Value::Null);
        self.top_logprobs.push(Value::Null);
        self.text_offset.push(json!(0));
        self.offset = first.1.len();
        self.extend(rest);
        self.offset = echoed;
    }

    fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The object so far; starts a new one at the current offset.
    fn take(&mut self) -> Value {
        let v = json!({
            "tokens": std::mem::take(&mut self.tokens),
            "token_logprobs": std::mem::take(&mut self.token_logprobs),
            "top_logprobs": std::mem::take(&mut self.top_logprobs),
            "text_offset": std::mem::take(&mut self.text_offset),
        });
        v
    }
}

/// The streaming state machine.
struct CompletionStream {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    /// Logprobs of tokens not yet sent; they ride on the next chunk.
    logprobs: Option<LegacyLogprobs>,
    /// The echoed prompt, sent when its tokens' logprobs arrive.
    echo_with_prompt: Option<String>,
}

impl CompletionStream {
    fn chunk(&mut self, text: &str, finish: Option<&str>) -> Value {
        let logprobs = match &mut self.logprobs {
            Some(l) if !l.is_empty() => l.take(),
            _ => Value::Null,
        };
        let mut c = json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": Value::Null,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}],
        });
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    fn on_event(&mut self, ev: OutputEvent) -> Vec<Event> {
        match ev {
            OutputEvent::Piece(Piece::Text(t)) => vec![sse::data(&self.chunk(&t, None))],
            OutputEvent::Tokens { logprobs, .. } => {
                if let Some(l) = &mut self.logprobs {
                    l.extend(&logprobs);
                }
                vec![]
            }
            OutputEvent::Piece(_) => vec![],
            OutputEvent::Prompt { first, rest } => {
                let Some(echoed) = self.echo_with_prompt.take() else {
                    return vec![];
                };
                if let Some(l) = &mut self.logprobs {
                    l.prompt(&first, &rest, echoed.len());
                }
                vec![sse::data(&self.chunk(&echoed, None))]
            }
            OutputEvent::Finish(f) => {
                let mut out = vec![sse::data(
                    &self.chunk("", Some(openai_finish_reason(&f, false))),
                )];
                if self.include_usage {
                    out.push(sse::data(&json!({
                        "id": self.id,
                        "object": "text_completion",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": usage_json(&f.usage),
                    })));
                }
                out.push(sse::done());
                out
            }
            OutputEvent::Failed(f) => vec![sse::data(&stream_error(&f))],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_forms() {
        assert!(matches!(prompt_of(&json!("hi")).unwrap(), Prompt::Text(t) if t == "hi"));
        assert!(matches!(prompt_of(&json!([1, 2])).unwrap(), Prompt::Ids(v) if v == [1, 2]));
        assert!(matches!(
            prompt_of(&json!(["hi"])).unwrap(),
            Prompt::Text(_)
        ));
        assert!(matches!(prompt_of(&json!([[5]])).unwrap(), Prompt::Ids(v) if v == [5]));
        for bad in [
            json!(["a", "b"]),
            json!([-1]),
            json!([]),
            json!(3),
            json!([1.5]),
        ] {
            assert_eq!(
                prompt_of(&bad).unwrap_err().param.as_deref(),
                Some("prompt"),
                "{bad}"
            );
        }
    }
}
