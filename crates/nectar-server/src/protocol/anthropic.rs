//! `POST /v1/messages` and `POST /v1/messages/count_tokens` (Anthropic Messages).
//!
//! Content blocks map to the chat template as: `text` → message text, `tool_use` (assistant) →
//! `tool_calls`, `tool_result` (user) → a `tool` message, `thinking` (assistant) →
//! `reasoning_content`. The output maps back: `<think>` → a `thinking` block (with an empty
//! `signature`: nothing is signed here), text → `text`, GLM tool calls → `tool_use` blocks and
//! `stop_reason: "tool_use"`. `thinking: {"type": "enabled"|"disabled"}` switches thinking; when
//! it is enabled the answer starts with a thinking block even if the reasoning is empty.
//! Structured outputs (`output_config.format`, or the beta's `output_format`) constrain the
//! text to the JSON schema. Fields this server cannot honour (`container`, `mcp_servers`) are
//! refused by name rather than dropped.
//!
//! Streaming follows the official sequence: `message_start`, then per block
//! `content_block_start`, `content_block_delta` (`text_delta`, `thinking_delta`,
//! `input_json_delta`), `content_block_stop`; a `ping` after the first block starts;
//! `message_delta` (stop reason; cumulative usage, input tokens included) and `message_stop`.
//! A tool call streams as it is generated: its block starts when its name is known and its
//! arguments arrive as `input_json_delta`s.

use crate::backend::{
    CancelToken, Finish, FinishReason, GenRequest, Piece, Prompt, Sampling, ToolCall,
};
use crate::error::{ApiError, ApiResult, Flavour};
use crate::generation::{backend_error, Generation, OutputEvent, OutputMode, Part};
use crate::protocol::constraint::{self, ToolChoice};
use crate::protocol::{check_model, function_tool, new_id, parse_body, validate_sampling};
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

/// The request body (also of `count_tokens`, where `max_tokens` is not needed).
#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    /// The served model's id or an alias (`--alias`); another name is 404.
    #[serde(default)]
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<Value>,
    /// A string or a list of text blocks.
    #[serde(default)]
    pub system: Option<Value>,
    /// Generated tokens at most (required by `/v1/messages`).
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Stop strings.
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    /// Stream events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Sampling temperature (Anthropic's range is 0–1; absent: greedy).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus mass.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Top-k.
    #[serde(default)]
    pub top_k: Option<u32>,
    /// `[{name, description, input_schema}]`.
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// `{"type": "auto"|"none"}`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// `{"type": "enabled", "budget_tokens": N}` or `{"type": "disabled"}`.
    #[serde(default)]
    pub thinking: Option<Value>,
    /// Accepted and ignored.
    #[serde(default)]
    pub metadata: Option<Value>,
    /// Structured outputs: `{"format": {"type": "json_schema", "schema"}}` (`effort` is a hint
    /// this server does not need).
    #[serde(default)]
    pub output_config: Option<Value>,
    /// The structured-outputs beta's form of `output_config.format`.
    #[serde(default)]
    pub output_format: Option<Value>,
    /// Code-execution container: not supported (refused).
    #[serde(default)]
    pub container: Option<Value>,
    /// Remote MCP servers: not supported (refused).
    #[serde(default)]
    pub mcp_servers: Option<Value>,
}

/// What both routes derive from a request.
struct Converted {
    prompt: Prompt,
    tools: bool,
    /// Tool calls at most (`tool_choice.disable_parallel_tool_use`).
    max_calls: Option<usize>,
    /// A forced tool call or a structured output format.
    constraint: Option<crate::backend::Constraint>,
    /// Thinking is on: the answer starts with a thinking block.
    thinking: bool,
}

/// Translates the conversation (shared by `messages` and `count_tokens`).
fn convert(req: &MessagesRequest) -> ApiResult<Converted> {
    let mut messages = Vec::new();
    if let Some(system) = &req.system {
        let text = blocks_text(system, "system")?;
        if !text.is_empty() {
            messages.push(json!({"role": "system", "content": text}));
        }
    }
    if req.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    for (i, m) in req.messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content").unwrap_or(&Value::Null);
        let param = format!("messages.{i}.content");
        match role {
            "user" => user_turn(content, &param, &mut messages)?,
            "assistant" => messages.push(assistant_turn(content, &param)?),
            other => {
                return Err(ApiError::invalid_param(
                    format!("messages.{i}.role"),
                    format!("unknown role `{other}`; expected user or assistant"),
                ))
            }
        }
    }
    for (field, v) in [
        ("container", &req.container),
        ("mcp_servers", &req.mcp_servers),
    ] {
        if v.as_ref().is_some_and(|v| !v.is_null() && v != &json!([])) {
            return Err(ApiError::invalid_param(
                field,
                format!("`{field}` is not supported by this server"),
            ));
        }
    }
    let tools = template_tools(req.tools.as_deref().unwrap_or_default())?;
    let choice = ToolChoice::anthropic(req.tool_choice.as_ref())?;
    let format =
        constraint::anthropic_format(req.output_format.as_ref(), req.output_config.as_ref())?;
    let resolved = constraint::resolve(&choice, &tools, format)?;
    let tools_on = resolved.tools_on;
    let enable_thinking = match req
        .thinking
        .as_ref()
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
    {
        None => None,
        Some("enabled") => Some(true),
        Some("disabled") => Some(false),
        Some(other) => {
            return Err(ApiError::invalid_param(
                "thinking.type",
                format!("unknown thinking type `{other}`; expected enabled or disabled"),
            ))
        }
    };
    let enable_thinking = resolved.enable_thinking(enable_thinking);
    Ok(Converted {
        prompt: Prompt::Chat {
            messages: Value::Array(messages),
            tools: tools_on.then(|| Value::Array(resolved.tools.clone())),
            enable_thinking,
        },
        tools: tools_on,
        max_calls: req
            .tool_choice
            .as_ref()
            .and_then(|c| c.get("disable_parallel_tool_use"))
            .and_then(Value::as_bool)
            .and_then(|d| d.then_some(1)),
        constraint: resolved.constraint,
        thinking: enable_thinking == Some(true),
    })
}

/// Text of a string or a list of `text` blocks.
fn blocks_text(v: &Value, param: &str) -> ApiResult<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for (j, b) in blocks.iter().enumerate() {
                match (
                    b.get("type").and_then(Value::as_str),
                    b.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::invalid_param(
                            format!("{param}.{j}"),
                            format!(
                                "block type `{}` is not supported here: this model reads text only",
                                kind.unwrap_or("")
                            ),
                        ))
                    }
                }
            }
            Ok(out)
        }
        Value::Null => Ok(String::new()),
        _ => Err(ApiError::invalid_param(
            param,
            "must be a string or a list of content blocks",
        )),
    }
}

/// A user turn: text blocks become a user message; each `tool_result` a `tool` message, in order.
fn user_turn(content: &Value, param: &str, out: &mut Vec<Value>) -> ApiResult<()> {
    let Value::Array(blocks) = content else {
        out.push(json!({"role": "user", "content": blocks_text(content, param)?}));
        return Ok(());
    };
    let mut text = String::new();
    for (j, b) in blocks.iter().enumerate() {
        match b.get("type").and_then(Value::as_str).unwrap_or("") {
            "text" => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            "tool_result" => {
                if !text.is_empty() {
                    out.push(json!({"role": "user", "content": std::mem::take(&mut text)}));
                }
                let result = blocks_text(
                    b.get("content").unwrap_or(&Value::Null),
                    &format!("{param}.{j}.content"),
                )?;
                let id = b.get("tool_use_id").cloned().unwrap_or(Value::Null);
                out.push(json!({"role": "tool", "content": result, "tool_call_id": id}));
            }
            kind => {
                return Err(ApiError::invalid_param(
                    format!("{param}.{j}"),
                    format!("block type `{kind}` is not supported: this model reads text only"),
                ))
            }
        }
    }
    if !text.is_empty() {
        out.push(json!({"role": "user", "content": text}));
    }
    Ok(())
}

/// An assistant turn: text, thinking and tool_use blocks into one message.
fn assistant_turn(content: &Value, param: &str) -> ApiResult<Value> {
    let Value::Array(blocks) = content else {
        return Ok(json!({"role": "assistant", "content": blocks_text(content, param)?}));
    };
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        match b.get("type").and_then(Value::as_str).unwrap_or("") {
            "text" => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            "thinking" => {
                reasoning.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or(""))
            }
            "redacted_thinking" => {}
            "tool_use" => {
                let name = b.get("name").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::invalid_param(format!("{param}.{j}.name"), "tool_use needs a name")
                })?;
                calls.push(json!({
                    "id": b.get("id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {"name": name, "arguments": b.get("input").cloned().unwrap_or_else(|| json!({}))},
                }));
            }
            kind => {
                return Err(ApiError::invalid_param(
                    format!("{param}.{j}"),
                    format!("block type `{kind}` is not supported in an assistant turn"),
                ))
            }
        }
    }
    let mut m = json!({"role": "assistant", "content": text});
    if !reasoning.is_empty() {
        m["reasoning_content"] = Value::String(reasoning);
    }
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
    }
    Ok(m)
}

/// Anthropic tools → chat-template tools (client tools only).
fn template_tools(tools: &[Value]) -> ApiResult<Vec<Value>> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            match t.get("type").and_then(Value::as_str) {
                None | Some("custom") => {}
                Some(kind) => {
                    return Err(ApiError::invalid_param(
                        format!("tools.{i}.type"),
                        format!("server tool `{kind}` is not supported; only client tools"),
                    ))
                }
            }
            let name = t.get("name").and_then(Value::as_str).unwrap_or("");
            if name.trim().is_empty() {
                return Err(ApiError::invalid_param(
                    format!("tools.{i}.name"),
                    "the tool name is missing or empty",
                ));
            }
            Ok(function_tool(
                name,
                t.get("description"),
                t.get("input_schema"),
            ))
        })
        .collect()
}

/// `stop_reason` and `stop_sequence` of a finish.
fn stop_reason(f: &Finish, called_tools: bool) -> (&'static str, Value) {
    match &f.reason {
        FinishReason::Length => ("max_tokens", Value::Null),
        FinishReason::StopString(s) => ("stop_sequence", Value::String(s.clone())),
        _ if called_tools => ("tool_use", Value::Null),
        _ => ("end_turn", Value::Null),
    }
}

fn usage_json(input: usize, output: usize) -> Value {
    json!({
        "input_tokens": input,
        "output_tokens": output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    })
}

fn thinking_block(t: &str) -> Value {
    json!({"type": "thinking", "thinking": t, "signature": ""})
}

fn tool_use_block(c: &ToolCall, id: &str, input: Value) -> Value {
    json!({"type": "tool_use", "id": id, "name": c.name, "input": input})
}

/// `POST /v1/messages`.
pub async fn messages(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match run(state, body).await {
        Ok(r) => r,
        Err(e) => e.flavour(Flavour::Anthropic).into_response(),
    }
}

/// `POST /v1/messages/count_tokens`: the prompt's length after the chat template.
pub async fn count_tokens(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let run = async {
        let req: MessagesRequest = parse_body(body, Flavour::Anthropic, state.config.body_limit)?;
        check_model(&state, req.model.as_deref())?;
        let c = convert(&req)?;
        let backend = state.backend.clone();
        let n = tokio::task::spawn_blocking(move || backend.count_tokens(&c.prompt))
            .await
            .map_err(|e| ApiError::internal(format!("count task failed: {e}")))?
            .map_err(|e| backend_error(e, "messages"))?;
        Ok::<_, ApiError>(axum::Json(json!({"input_tokens": n})).into_response())
    };
    match run.await {
        Ok(r) => r,
        Err(e) => e.flavour(Flavour::Anthropic).into_response(),
    }
}

async fn run(state: AppState, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let req: MessagesRequest = parse_body(body, Flavour::Anthropic, state.config.body_limit)?;
    check_model(&state, req.model.as_deref())?;
    let max_tokens = match req.max_tokens {
        None => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                "max_tokens: Field required",
            ))
        }
        Some(0) => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                "max_tokens must be at least 1",
            ))
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    };
    let sampling = Sampling {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        ..Default::default()
    };
    if req.temperature.is_some_and(|t| !(0.0..=1.0).contains(&t)) {
        return Err(ApiError::invalid_param(
            "temperature",
            "temperature must be between 0 and 1",
        ));
    }
    validate_sampling(&sampling)?;
    let c = convert(&req)?;
    let stop = req.stop_sequences.clone().unwrap_or_default();
    if stop.len() > crate::protocol::MAX_STOP_STRINGS {
        return Err(ApiError::invalid_param(
            "stop_sequences",
            format!(
                "at most {} stop sequences are accepted",
                crate::protocol::MAX_STOP_STRINGS
            ),
        ));
    }
    let gen = Generation::start(
        state.backend.clone(),
        GenRequest {
            prompt: c.prompt,
            max_tokens: Some(max_tokens),
            sampling,
            stop,
            constraint: c.constraint,
            cancel: CancelToken::new(),
        },
        OutputMode::Chat {
            tools: c.tools,
            max_calls: c.max_calls,
        },
        "messages",
    )
    .await?;
    let model = state.backend.model_id();
    let id = new_id("msg_");
    if req.stream.unwrap_or(false) {
        let mut st = MessagesStream {
            index: 0,
            open: None,
            pinged: false,
            called_tools: false,
            prompt_tokens: gen.start.prompt_tokens,
            thinking_due: c.thinking,
        };
        let start = sse::named(
            "message_start",
            &json!({
                "type": "message_start",
                "message": {
                    "id": id, "type": "message", "role": "assistant", "content": [],
                    "model": model, "stop_reason": Value::Null, "stop_sequence": Value::Null,
                    "usage": usage_json(gen.start.prompt_tokens, 0),
                },
            }),
        );
        let events = futures_util::stream::iter(vec![start]).chain(
            gen.into_stream()
                .flat_map(move |ev| futures_util::stream::iter(st.on_event(ev))),
        );
        return Ok(sse::response(events));
    }
    let out = gen.collect().await?;
    let mut content: Vec<Value> = out
        .pieces
        .iter()
        .map(|p| match p {
            Part::Text(t) => json!({"type": "text", "text": t}),
            Part::Reasoning(t) => json!({"type": "thinking", "thinking": t, "signature": ""}),
            Part::Call(c) => tool_use_block(c, &new_id("toolu_"), c.input()),
        })
        .collect();
    // Thinking was on: the answer starts with its thinking block, even an empty one.
    if c.thinking && !matches!(out.pieces.first(), Some(Part::Reasoning(_))) {
        content.insert(0, thinking_block(""));
    }
    let (reason, seq) = stop_reason(&out.finish, !out.tool_calls().is_empty());
    let body = json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": usage_json(out.finish.usage.prompt_tokens, out.finish.usage.completion_tokens),
    });
    Ok(axum::Json(body).into_response())
}

/// Which block is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Thinking,
}

/// The streaming state machine.
struct MessagesStream {
    index: usize,
    open: Option<Block>,
    pinged: bool,
    called_tools: bool,
    prompt_tokens: usize,
    /// Thinking is on and no thinking block was sent yet: one comes before any other block.
    thinking_due: bool,
}

impl MessagesStream {
    fn start_block(&mut self, block: Value, out: &mut Vec<Event>) {
        out.push(sse::named(
            "content_block_start",
            &json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        ));
        if !self.pinged {
            self.pinged = true;
            out.push(sse::named("ping", &json!({"type": "ping"})));
        }
    }

    fn delta(&self, delta: Value) -> Event {
        sse::named(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
        )
    }

    fn stop_block(&mut self, out: &mut Vec<Event>) {
        if let Some(b) = self.open.take() {
            if b == Block::Thinking {
                // Thinking blocks end with their signature; nothing is signed here.
                out.push(self.delta(json!({"type": "signature_delta", "signature": ""})));
            }
            out.push(sse::named(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": self.index}),
            ));
            self.index += 1;
        }
    }

    /// The empty thinking block owed when thinking is on but the reasoning was empty.
    fn owed_thinking(&mut self, out: &mut Vec<Event>) {
        if std::mem::take(&mut self.thinking_due) {
            self.start_block(thinking_block(""), out);
            self.open = Some(Block::Thinking);
            self.stop_block(out);
        }
    }

    fn on_event(&mut self, ev: OutputEvent) -> Vec<Event> {
        let mut out = Vec::new();
        match &ev {
            OutputEvent::Piece(Piece::Reasoning(t)) if !t.is_empty() => self.thinking_due = false,
            OutputEvent::Piece(Piece::Text(t)) if t.is_empty() => {}
            OutputEvent::Piece(Piece::Text(_) | Piece::CallStart { .. })
            | OutputEvent::Finish(_) => self.owed_thinking(&mut out),
            _ => {}
        }
        match ev {
            OutputEvent::Piece(Piece::Text(t)) if !t.is_empty() => {
                if self.open != Some(Block::Text) {
                    self.stop_block(&mut out);
                    self.start_block(json!({"type": "text", "text": ""}), &mut out);
                    self.open = Some(Block::Text);
                }
                out.push(self.delta(json!({"type": "text_delta", "text": t})));
            }
            OutputEvent::Piece(Piece::Reasoning(t)) if !t.is_empty() => {
                if self.open != Some(Block::Thinking) {
                    self.stop_block(&mut out);
                    self.start_block(thinking_block(""), &mut out);
                    self.open = Some(Block::Thinking);
                }
                out.push(self.delta(json!({"type": "thinking_delta", "thinking": t})));
            }
            OutputEvent::Piece(Piece::CallStart { name }) => {
                self.stop_block(&mut out);
                self.called_tools = true;
                let c = ToolCall {
                    name,
                    arguments: String::new(),
                };
                self.start_block(tool_use_block(&c, &new_id("toolu_"), json!({})), &mut out);
            }
            OutputEvent::Piece(Piece::CallArgs(a)) => {
                out.push(self.delta(json!({"type": "input_json_delta", "partial_json": a})));
            }
            OutputEvent::Piece(Piece::CallEnd(_)) => {
                out.push(sse::named(
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": self.index}),
                ));
                self.index += 1;
            }
            OutputEvent::Piece(_) | OutputEvent::Tokens { .. } | OutputEvent::Prompt { .. } => {}
            OutputEvent::Finish(f) => {
                self.stop_block(&mut out);
                if !self.pinged {
                    self.pinged = true;
                    out.push(sse::named("ping", &json!({"type": "ping"})));
                }
                let (reason, seq) = stop_reason(&f, self.called_tools);
                out.push(sse::named(
                    "message_delta",
                    &json!({
                        "type": "message_delta",
                        "delta": {"stop_reason": reason, "stop_sequence": seq},
                        // Cumulative, as Anthropic sends it (clients read input tokens here).
                        "usage": usage_json(self.prompt_tokens, f.usage.completion_tokens),
                    }),
                ));
                out.push(sse::named("message_stop", &json!({"type": "message_stop"})));
            }
            OutputEvent::Failed(f) => {
                self.stop_block(&mut out);
                out.push(sse::named(
                    "error",
                    &json!({"type": "error", "error": {"type": "api_error", "message": f.client_message()}}),
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: Value) -> MessagesRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn blocks_map_to_template_messages() {
        let c = convert(&req(json!({
            "system": [{"type": "text", "text": "sys"}],
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "use the tool", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {"type": "text", "text": "thanks"}
                ]}
            ],
            "tools": [{"name": "weather", "description": "d", "input_schema": {"type": "object"}}]
        })))
        .unwrap();
        assert!(c.tools);
        let Prompt::Chat {
            messages, tools, ..
        } = c.prompt
        else {
            panic!()
        };
        assert_eq!(messages[0], json!({"role": "system", "content": "sys"}));
        assert_eq!(messages[2]["reasoning_content"], "use the tool");
        assert_eq!(
            messages[2]["tool_calls"][0]["function"]["arguments"],
            json!({"city": "Paris"})
        );
        assert_eq!(
            messages[3],
            json!({"role": "tool", "content": "sunny", "tool_call_id": "toolu_1"})
        );
        assert_eq!(messages[4], json!({"role": "user", "content": "thanks"}));
        assert_eq!(
            tools.unwrap()[0]["function"]["parameters"],
            json!({"type": "object"})
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let e = convert(&req(
            json!({"messages": [{"role": "user", "content": [{"type": "image"}]}]}),
        ))
        .err()
        .unwrap();
        assert_eq!(e.param.as_deref(), Some("messages.0.content.0"));
        let e = convert(&req(
            json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}}),
        ))
        .err()
        .unwrap();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        let e = convert(&req(json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305", "name": "web_search"}]})))
            .err()
            .unwrap();
        assert_eq!(e.param.as_deref(), Some("tools.0.type"));
    }

    #[test]
    fn thinking_switch() {
        let c = convert(&req(json!({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "enabled", "budget_tokens": 1024}}))).unwrap();
        assert!(matches!(
            c.prompt,
            Prompt::Chat {
                enable_thinking: Some(true),
                ..
            }
        ));
        let c = convert(&req(json!({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "disabled"}}))).unwrap();
        assert!(matches!(
            c.prompt,
            Prompt::Chat {
                enable_thinking: Some(false),
                ..
            }
        ));
    }
}
