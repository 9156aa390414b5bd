//! `POST /v1/chat/completions` (OpenAI Chat Completions).
//!
//! Reasoning (`<think>`) is returned as `message.reasoning_content` (streamed as
//! `delta.reasoning_content`, the field vLLM, llama.cpp and GLM's own API use); tool calls as
//! `message.tool_calls` with `finish_reason: "tool_calls"`. Streaming sends
//! `chat.completion.chunk` objects as bare `data:` lines: a first chunk with the role, content
//! deltas, a last chunk with `finish_reason`, a usage chunk (`choices: []`) when
//! `stream_options.include_usage` is set, then `data: [DONE]`.

use crate::backend::{CancelToken, Failure, GenRequest, Piece, Prompt, Sampling, ToolCall, Usage};
use crate::error::{ApiError, ApiResult, Flavour};
use crate::generation::{openai_finish_reason, Generation, OutputEvent, OutputMode};
use crate::protocol::constraint::{self, ToolChoice};
use crate::protocol::{
    chat_logprob, check_model, content_text, function_tool, new_id, parse_body, parse_logit_bias,
    unix_now, validate_max_tokens, validate_sampling, StopField,
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
use serde_json::{json, Map, Value};

/// The request body.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    /// The served model's id or an alias (`--alias`); another name is 404.
    #[serde(default)]
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<Value>,
    /// Function tools.
    #[serde(default)]
    pub tools: Option<Vec<ChatTool>>,
    /// `auto` (default) or `none`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// `text`, `json_object` or `json_schema` (see `protocol::constraint`).
    #[serde(default)]
    pub response_format: Option<Value>,
    /// Stop strings.
    #[serde(default)]
    pub stop: Option<StopField>,
    /// Legacy name of `max_completion_tokens`.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Generated tokens at most.
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    /// Sampling temperature (absent or 0: greedy).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus mass.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Top-k (0: off).
    #[serde(default)]
    pub top_k: Option<u32>,
    /// Min-p.
    #[serde(default)]
    pub min_p: Option<f32>,
    /// OpenAI presence penalty.
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    /// OpenAI frequency penalty.
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    /// Multiplicative repetition penalty (HF/llama.cpp).
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    /// Seed of the sampler's RNG (same seed, same output).
    #[serde(default)]
    pub seed: Option<i64>,
    /// Token id (as a string) → bias added to its logit.
    #[serde(default)]
    pub logit_bias: Option<Map<String, Value>>,
    /// Choices; only 1.
    #[serde(default)]
    pub n: Option<u32>,
    /// Return each token's log-probability.
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// Alternatives per token (0–20; needs `logprobs: true`).
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    /// Stream chunks.
    #[serde(default)]
    pub stream: Option<bool>,
    /// `include_usage`.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Template variables; `enable_thinking` (bool) is honoured.
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// `none` turns thinking off; any other value turns it on.
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    /// `false`: at most one tool call (later calls are dropped by the output parser).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// Output modalities: only `["text"]` (audio output is refused).
    #[serde(default)]
    pub modalities: Option<Value>,
    /// Audio output parameters: refused.
    #[serde(default)]
    pub audio: Option<Value>,
    /// Web search: refused (this server searches nothing).
    #[serde(default)]
    pub web_search_options: Option<Value>,
    /// The deprecated form of `tools`: refused (ignoring it would drop the tools).
    #[serde(default)]
    pub functions: Option<Value>,
    /// The deprecated form of `tool_choice`: refused.
    #[serde(default)]
    pub function_call: Option<Value>,
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with usage.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// A tool definition.
#[derive(Debug, Deserialize)]
pub struct ChatTool {
    /// Must be `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: FunctionDef,
}

/// A function's schema.
#[derive(Debug, Deserialize)]
pub struct FunctionDef {
    /// Name.
    pub name: String,
    /// Description.
    #[serde(default)]
    pub description: Option<Value>,
    /// JSON schema of the arguments.
    #[serde(default)]
    pub parameters: Option<Value>,
}

/// What the handler needs after validation.
struct Plan {
    gen: GenRequest,
    tools: bool,
    /// Tool calls at most (`parallel_tool_calls: false`).
    max_calls: Option<usize>,
    logprobs: bool,
    stream: bool,
    include_usage: bool,
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

async fn run(state: AppState, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let req: ChatRequest = parse_body(body, Flavour::OpenAi, state.config.body_limit)?;
    check_model(&state, req.model.as_deref())?;
    let plan = plan(req)?;
    let gen = Generation::start(
        state.backend.clone(),
        plan.gen,
        OutputMode::Chat {
            tools: plan.tools,
            max_calls: plan.max_calls,
        },
        "messages",
    )
    .await?;
    let model = state.backend.model_id();
    let id = new_id("chatcmpl-");
    let created = unix_now();
    if plan.stream {
        let mut st = ChatStream {
            id,
            created,
            model,
            include_usage: plan.include_usage,
            tool_index: 0,
            prompt_tokens: gen.start.prompt_tokens,
            pending_logprobs: Vec::new(),
        };
        let first = vec![sse::data(
            &st.chunk(json!({"role": "assistant", "content": ""}), None),
        )];
        let events = futures_util::stream::iter(first).chain(
            gen.into_stream()
                .flat_map(move |ev| futures_util::stream::iter(st.on_event(ev))),
        );
        return Ok(sse::response(events));
    }
    let out = gen.collect().await?;
    let calls = out.tool_calls();
    let text = out.text();
    let reasoning = out.reasoning();
    let mut message = json!({
        "role": "assistant",
        "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text) },
    });
    if !reasoning.is_empty() {
        message["reasoning_content"] = Value::String(reasoning);
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(
            calls
                .iter()
                .map(|c| tool_call_json(c, None, &new_id("call_")))
                .collect(),
        );
    }
    let body = json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": Value::Null,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": if plan.logprobs {
                json!({"content": out.logprobs.iter().map(chat_logprob).collect::<Vec<_>>(), "refusal": Value::Null})
            } else {
                Value::Null
            },
            "finish_reason": openai_finish_reason(&out.finish, !calls.is_empty()),
        }],
        "usage": usage_json(&out.finish.usage),
    });
    Ok(axum::Json(body).into_response())
}

/// Validates the request and builds the protocol-neutral one.
fn plan(req: ChatRequest) -> ApiResult<Plan> {
    crate::protocol::refuse_fields(&[
        (
            "modalities",
            req.modalities.as_ref(),
            crate::protocol::beyond_text,
        ),
        ("audio", req.audio.as_ref(), crate::protocol::asks),
        ("web_search_options", req.web_search_options.as_ref(), |v| {
            !v.is_null()
        }),
        ("functions", req.functions.as_ref(), crate::protocol::asks),
        (
            "function_call",
            req.function_call.as_ref(),
            crate::protocol::asks,
        ),
    ])?;
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_param(
            "n",
            "only n = 1 is supported (one choice per request)",
        ));
    }
    let logprobs = req.logprobs.unwrap_or(false);
    if req.top_logprobs.is_some() && !logprobs {
        return Err(ApiError::invalid_param(
            "top_logprobs",
            "`top_logprobs` needs `logprobs: true`",
        ));
    }
    if req.top_logprobs.is_some_and(|k| k > 20) {
        return Err(ApiError::invalid_param(
            "top_logprobs",
            "`top_logprobs` must be between 0 and 20",
        ));
    }
    let format = constraint::response_format(req.response_format.as_ref())?;
    let tools = req.tools.unwrap_or_default();
    for (i, t) in tools.iter().enumerate() {
        if t.kind != "function" {
            return Err(ApiError::invalid_param(
                format!("tools[{i}].type"),
                format!("tool type `{}` is not supported; only `function`", t.kind),
            ));
        }
        if t.function.name.trim().is_empty() {
            return Err(ApiError::invalid_param(
                format!("tools[{i}].function.name"),
                "the function name is empty",
            ));
        }
    }
    let template_tools: Vec<Value> = tools
        .iter()
        .map(|t| {
            function_tool(
                &t.function.name,
                t.function.description.as_ref(),
                t.function.parameters.as_ref(),
            )
        })
        .collect();
    let choice = ToolChoice::openai(req.tool_choice.as_ref())?;
    let resolved = constraint::resolve(&choice, &template_tools, format)?;
    let tools_on = resolved.tools_on;
    let tool_values = tools_on.then(|| Value::Array(resolved.tools.clone()));
    let messages = chat_messages(&req.messages)?;
    let enable_thinking = req
        .chat_template_kwargs
        .as_ref()
        .and_then(|k| k.get("enable_thinking"))
        .and_then(Value::as_bool)
        .or_else(|| req.reasoning_effort.as_deref().map(|e| e != "none"));
    let enable_thinking = resolved.enable_thinking(enable_thinking);
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
        logprobs: logprobs.then(|| req.top_logprobs.unwrap_or(0) as usize),
        prompt_logprobs: false,
    };
    validate_sampling(&sampling)?;
    let max_tokens = match req.max_completion_tokens {
        Some(_) => validate_max_tokens("max_completion_tokens", req.max_completion_tokens)?,
        None => validate_max_tokens("max_tokens", req.max_tokens)?,
    };
    let stop = match req.stop {
        Some(s) => s.into_vec("stop")?,
        None => vec![],
    };
    let stream = req.stream.unwrap_or(false);
    Ok(Plan {
        max_calls: crate::protocol::call_limit(req.parallel_tool_calls),
        gen: GenRequest {
            prompt: Prompt::Chat {
                messages: Value::Array(messages),
                tools: tool_values,
                enable_thinking,
            },
            max_tokens,
            sampling,
            stop,
            constraint: resolved.constraint,
            cancel: CancelToken::new(),
        },
        tools: tools_on,
        logprobs,
        stream,
        include_usage: stream
            && req
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
    })
}

/// OpenAI messages → chat-template messages (text content, `developer` as `system`).
fn chat_messages(msgs: &[Value]) -> ApiResult<Vec<Value>> {
    if msgs.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let Some(obj) = m.as_object() else {
            return Err(ApiError::invalid_param(
                format!("messages[{i}]"),
                "each message must be an object",
            ));
        };
        let role = obj.get("role").and_then(Value::as_str).unwrap_or("");
        let role = match role {
            "system" | "developer" => "system",
            "user" | "assistant" | "tool" => role,
            other => {
                return Err(ApiError::invalid_param(
                    format!("messages[{i}].role"),
                    format!(
                    "unknown role `{other}`; expected system, developer, user, assistant or tool"
                ),
                ))
            }
        };
        let content = content_text(
            obj.get("content").unwrap_or(&Value::Null),
            &format!("messages[{i}].content"),
        )?;
        let mut msg = Map::new();
        msg.insert("role".into(), Value::String(role.into()));
        msg.insert("content".into(), Value::String(content));
        if role == "assistant" {
            if let Some(r) = obj.get("reasoning_content").filter(|r| r.is_string()) {
                msg.insert("reasoning_content".into(), r.clone());
            }
            if let Some(calls) = obj.get("tool_calls").filter(|c| !c.is_null()) {
                let ok = calls.as_array().is_some_and(|a| {
                    a.iter().all(|c| {
                        c.get("function")
                            .and_then(|f| f.get("name"))
                            .is_some_and(Value::is_string)
                    })
                });
                if !ok {
                    return Err(ApiError::invalid_param(
                        format!("messages[{i}].tool_calls"),
                        "tool_calls must be a list of {\"function\": {\"name\", \"arguments\"}}",
                    ));
                }
                msg.insert("tool_calls".into(), calls.clone());
            }
        }
        if role == "tool" {
            if let Some(id) = obj.get("tool_call_id") {
                msg.insert("tool_call_id".into(), id.clone());
            }
        }
        out.push(Value::Object(msg));
    }
    Ok(out)
}

/// A tool call in OpenAI's shape (`index` only in stream deltas).
fn tool_call_json(c: &ToolCall, index: Option<usize>, id: &str) -> Value {
    let mut v = json!({
        "id": id,
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments},
    });
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
}

/// OpenAI's `usage` object.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

/// The error object sent inside a stream when generation fails after the headers went out.
pub fn stream_error(f: &Failure) -> Value {
    json!({"error": {"message": f.client_message(), "type": "server_error", "param": null, "code": null}})
}

/// The streaming state machine.
struct ChatStream {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    tool_index: usize,
    prompt_tokens: usize,
    /// Logprobs of tokens whose text has not been sent yet; they ride on the next chunk.
    pending_logprobs: Vec<Value>,
}

impl ChatStream {
    fn chunk(&mut self, delta: Value, finish: Option<&str>) -> Value {
        let logprobs = if self.pending_logprobs.is_empty() {
            Value::Null
        } else {
            json!({"content": std::mem::take(&mut self.pending_logprobs), "refusal": Value::Null})
        };
        let mut c = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": Value::Null,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        });
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    fn on_event(&mut self, ev: OutputEvent) -> Vec<Event> {
        match ev {
            OutputEvent::Piece(Piece::Text(t)) => {
                vec![sse::data(&self.chunk(json!({"content": t}), None))]
            }
            OutputEvent::Piece(Piece::Reasoning(t)) => {
                vec![sse::data(
                    &self.chunk(json!({"reasoning_content": t}), None),
                )]
            }
            OutputEvent::Piece(Piece::CallStart { name }) => {
                let call = tool_call_json(
                    &ToolCall {
                        name,
                        arguments: String::new(),
                    },
                    Some(self.tool_index),
                    &new_id("call_"),
                );
                vec![sse::data(&self.chunk(json!({"tool_calls": [call]}), None))]
            }
            OutputEvent::Piece(Piece::CallArgs(a)) => {
                let delta = json!({"index": self.tool_index, "function": {"arguments": a}});
                vec![sse::data(&self.chunk(json!({"tool_calls": [delta]}), None))]
            }
            OutputEvent::Piece(Piece::CallEnd(_)) => {
                self.tool_index += 1;
                vec![]
            }
            OutputEvent::Tokens { logprobs, .. } => {
                self.pending_logprobs
                    .extend(logprobs.iter().map(chat_logprob));
                vec![]
            }
            OutputEvent::Finish(f) => {
                let reason = openai_finish_reason(&f, self.tool_index > 0);
                let mut out = vec![sse::data(&self.chunk(json!({}), Some(reason)))];
                if self.include_usage {
                    let mut u = f.usage;
                    u.prompt_tokens = self.prompt_tokens;
                    out.push(sse::data(&json!({
                        "id": self.id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model,
                        "system_fingerprint": Value::Null,
                        "choices": [],
                        "usage": usage_json(&u),
                    })));
                }
                out.push(sse::done());
                out
            }
            OutputEvent::Prompt { .. } => vec![],
            OutputEvent::Failed(f) => vec![sse::data(&stream_error(&f))],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: Value) -> ChatRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn developer_becomes_system_and_parts_are_joined() {
        let p = plan(req(json!({"messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}
        ]})))
        .unwrap();
        let Prompt::Chat {
            messages, tools, ..
        } = p.gen.prompt
        else {
            panic!()
        };
        assert_eq!(
            messages[0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(messages[1]["content"], "hi there");
        assert!(tools.is_none());
    }

    #[test]
    fn unsupported_features_name_their_parameter() {
        let base = json!({"messages": [{"role": "user", "content": "x"}]});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            plan(req(b)).err().and_then(|e| e.param)
        };
        assert_eq!(with("n", json!(2)).as_deref(), Some("n"));
        assert_eq!(
            with("top_logprobs", json!(2)).as_deref(),
            Some("top_logprobs")
        );
        assert_eq!(
            with("logit_bias", json!({"x": 1})).as_deref(),
            Some("logit_bias")
        );
        assert!(with("logprobs", json!(true)).is_none());
        assert_eq!(
            with("response_format", json!({"type": "json_schema"})).as_deref(),
            Some("response_format")
        );
        assert_eq!(
            with("response_format", json!({"type": "xml"})).as_deref(),
            Some("response_format")
        );
        // Forcing a call without tools, or naming a function that is not offered.
        assert_eq!(
            with("tool_choice", json!("required")).as_deref(),
            Some("tool_choice")
        );
        assert!(with("response_format", json!({"type": "json_object"})).is_none());
        assert_eq!(
            with("temperature", json!(-1)).as_deref(),
            Some("temperature")
        );
        assert_eq!(with("max_tokens", json!(0)).as_deref(), Some("max_tokens"));
        assert_eq!(with("messages", json!([])).as_deref(), Some("messages"));
        assert_eq!(
            with("messages", json!([{"role": "wizard", "content": "x"}])).as_deref(),
            Some("messages[0].role")
        );
        // Known fields that would change the answer if ignored are refused by name.
        assert_eq!(
            with("modalities", json!(["text", "audio"])).as_deref(),
            Some("modalities")
        );
        assert!(with("modalities", json!(["text"])).is_none());
        assert_eq!(
            with("audio", json!({"voice": "alloy", "format": "mp3"})).as_deref(),
            Some("audio")
        );
        assert_eq!(
            with("web_search_options", json!({})).as_deref(),
            Some("web_search_options")
        );
        assert_eq!(
            with("functions", json!([{"name": "f"}])).as_deref(),
            Some("functions")
        );
        assert_eq!(
            with("function_call", json!("auto")).as_deref(),
            Some("function_call")
        );
        // Known fields that change nothing in the answer are accepted.
        for (k, v) in [
            ("store", json!(true)),
            ("metadata", json!({"k": "v"})),
            ("service_tier", json!("auto")),
            ("user", json!("u1")),
            ("safety_identifier", json!("s")),
            ("prompt_cache_key", json!("p")),
            ("prediction", json!({"type": "content", "content": "x"})),
            ("audio", Value::Null),
            ("parallel_tool_calls", json!(false)),
        ] {
            assert!(with(k, v).is_none(), "{k}");
        }
        // Accepted and passed to the engine's sampler.
        assert!(with("temperature", json!(0.7)).is_none());
        assert!(with("seed", json!(42)).is_none());
        assert!(with("response_format", json!({"type": "text"})).is_none());
    }

    #[test]
    fn tools_and_thinking_switches() {
        let p = plan(req(json!({
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "chat_template_kwargs": {"enable_thinking": false}
        })))
        .unwrap();
        assert!(p.tools);
        let Prompt::Chat {
            tools,
            enable_thinking,
            ..
        } = p.gen.prompt
        else {
            panic!()
        };
        assert_eq!(tools.unwrap()[0]["function"]["name"], "f");
        assert_eq!(enable_thinking, Some(false));
        let p = plan(req(json!({
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "none",
            "reasoning_effort": "high"
        })))
        .unwrap();
        assert!(!p.tools);
        let Prompt::Chat {
            tools,
            enable_thinking,
            ..
        } = p.gen.prompt
        else {
            panic!()
        };
        assert!(tools.is_none());
        assert_eq!(enable_thinking, Some(true));
    }
}
