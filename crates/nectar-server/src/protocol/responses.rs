//! `POST /v1/responses` and `GET /v1/responses/{id}` (OpenAI Responses).
//!
//! `input` is a string or a list of items (messages, `function_call`, `function_call_output`,
//! `reasoning`); `instructions` become a system message for this request only (they do not
//! carry over to a continuation, as in OpenAI's API). With `previous_response_id` the stored
//! conversation of that response is continued; `store: false` keeps a response out of the store.
//! Output items: `reasoning` (from `<think>`), `message` (`output_text`), `function_call`.
//!
//! Streaming follows the official event sequence, every event with a `sequence_number`:
//! `response.created`, `response.in_progress`, then per item `response.output_item.added`,
//! (`response.content_part.added`, `response.output_text.delta`… or
//! `response.reasoning_text.delta`…, `response.output_text.done` / `response.reasoning_text.done`,
//! `response.content_part.done`) or (`response.function_call_arguments.delta`,
//! `response.function_call_arguments.done`), `response.output_item.done`; finally
//! `response.completed` (or `response.incomplete` when `max_output_tokens` was reached, or
//! `response.failed`).

use crate::backend::{
    CancelToken, FinishReason, GenRequest, Piece, Prompt, Sampling, ToolCall, Usage,
};
use crate::error::{ApiError, ApiResult, Flavour};
use crate::generation::{Generation, OutputEvent, OutputMode, Part};
use crate::protocol::constraint::{self, ToolChoice};
use crate::protocol::{
    check_model, content_text, f32_json, function_tool, new_id, parse_body, unix_now,
    validate_max_tokens, validate_sampling,
};
use crate::sse;
use crate::state::AppState;
use crate::store::{ResponseStore, StoredResponse};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// The request body.
#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    /// The served model's id or an alias (`--alias`); another name is 404.
    #[serde(default)]
    pub model: Option<String>,
    /// A string or a list of input items.
    pub input: Value,
    /// A system message for this request only.
    #[serde(default)]
    pub instructions: Option<String>,
    /// Function tools (`{"type":"function","name",...}`).
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// `auto` (default) or `none`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Continue this stored response's conversation.
    #[serde(default)]
    pub previous_response_id: Option<String>,
    /// Store the response (default true).
    #[serde(default)]
    pub store: Option<bool>,
    /// Stream events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Generated tokens at most.
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    /// Sampling temperature (absent or 0: greedy).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus mass.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// `{"effort": "none"|...}`: `none` turns thinking off, other efforts on.
    #[serde(default)]
    pub reasoning: Option<Value>,
    /// `{"format": {"type": "text"}}`; other formats need constrained decoding.
    #[serde(default)]
    pub text: Option<Value>,
    /// Echoed back.
    #[serde(default)]
    pub metadata: Option<Value>,
    /// Echoed back; `false`: at most one tool call (later calls are dropped by the parser).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// Background runs: refused when `true` (the request would expect to poll for it).
    #[serde(default)]
    pub background: Option<Value>,
    /// A stored prompt template by id: refused (this server stores none).
    #[serde(default)]
    pub prompt: Option<Value>,
    /// A stored conversation by id: refused (`previous_response_id` is the supported form).
    #[serde(default)]
    pub conversation: Option<Value>,
}

/// `POST /v1/responses`.
pub async fn create(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match run(state, body).await {
        Ok(r) => r,
        Err(e) => e.flavour(Flavour::OpenAi).into_response(),
    }
}

/// `GET /v1/responses/{id}`.
pub async fn get(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    match state.responses.get(&id) {
        Some(r) => axum::Json(r.response).into_response(),
        None => no_such(&id),
    }
}

fn no_such(id: &str) -> Response {
    ApiError::not_found(format!("no stored response with id `{id}`")).into_response()
}

/// `DELETE /v1/responses/{id}`: forgets a stored response (a continuation of it is then 404).
pub async fn delete(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    if state.responses.remove(&id) {
        axum::Json(json!({"id": id, "object": "response", "deleted": true})).into_response()
    } else {
        no_such(&id)
    }
}

/// Query of `GET /v1/responses/{id}/input_items`.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    /// `asc` or `desc` (the default, as in OpenAI's API).
    #[serde(default)]
    pub order: Option<String>,
    /// Items per page, 1–100 (default 20).
    #[serde(default)]
    pub limit: Option<usize>,
    /// List after the item with this id.
    #[serde(default)]
    pub after: Option<String>,
}

/// `GET /v1/responses/{id}/input_items`: the input items the response was created from.
pub async fn input_items(
    State(state): State<AppState>,
    Path(id): Path<String>,
    query: Result<axum::extract::Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let q = match query {
        Ok(q) => q.0,
        Err(e) => return ApiError::invalid(e.body_text()).into_response(),
    };
    let Some(r) = state.responses.get(&id) else {
        return no_such(&id);
    };
    let limit = q.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return ApiError::invalid_param("limit", "`limit` must be between 1 and 100")
            .into_response();
    }
    let mut items = r.input_items;
    match q.order.as_deref() {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(o) => {
            return ApiError::invalid_param(
                "order",
                format!("unknown order `{o}`; expected asc or desc"),
            )
            .into_response()
        }
    }
    if let Some(after) = &q.after {
        match items.iter().position(|it| it["id"] == after.as_str()) {
            Some(i) => {
                items.drain(..=i);
            }
            None => {
                return ApiError::invalid_param("after", format!("no input item `{after}`"))
                    .into_response()
            }
        }
    }
    let has_more = items.len() > limit;
    items.truncate(limit);
    axum::Json(json!({
        "object": "list",
        "data": items,
        "first_id": items.first().map(|i| i["id"].clone()),
        "last_id": items.last().map(|i| i["id"].clone()),
        "has_more": has_more,
    }))
    .into_response()
}

/// The request's input as stored items, each with an id (messages as content-part lists).
fn stored_input_items(input: &Value) -> Vec<Value> {
    let items = match input {
        Value::String(s) => vec![json!({"role": "user", "content": s})],
        Value::Array(a) => a.clone(),
        _ => vec![],
    };
    items
        .into_iter()
        .map(|mut it| {
            let kind = it["type"]
                .as_str()
                .unwrap_or(if it.get("role").is_some() {
                    "message"
                } else {
                    ""
                })
                .to_owned();
            if kind == "message" {
                it["type"] = json!("message");
                if let Some(text) = it["content"].as_str() {
                    let part = if it["role"] == "assistant" {
                        "output_text"
                    } else {
                        "input_text"
                    };
                    it["content"] = json!([{"type": part, "text": text}]);
                }
                if it.get("status").is_none() {
                    it["status"] = json!("completed");
                }
            }
            if it.get("id").is_none_or(Value::is_null) {
                let prefix = match kind.as_str() {
                    "message" => "msg_",
                    "function_call" => "fc_",
                    "function_call_output" => "fco_",
                    "reasoning" => "rs_",
                    _ => "item_",
                };
                it["id"] = json!(new_id(prefix));
            }
            it
        })
        .collect()
}

/// Input items → chat-template messages.
fn input_messages(input: &Value) -> ApiResult<Vec<Value>> {
    let items = match input {
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) => items,
        _ => {
            return Err(ApiError::invalid_param(
                "input",
                "`input` must be a string or a list of items",
            ))
        }
    };
    let mut out: Vec<Value> = Vec::new();
    let mut reasoning = String::new();
    for (i, item) in items.iter().enumerate() {
        let kind =
            item.get("type")
                .and_then(Value::as_str)
                .unwrap_or(if item.get("role").is_some() {
                    "message"
                } else {
                    ""
                });
        let field = |name: &str| -> ApiResult<String> {
            match item.get(name) {
                Some(Value::String(s)) => Ok(s.clone()),
                _ => Err(ApiError::invalid_param(
                    format!("input[{i}].{name}"),
                    format!("`{name}` must be a string"),
                )),
            }
        };
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("");
                let role = match role {
                    "system" | "developer" => "system",
                    "user" | "assistant" => role,
                    other => {
                        return Err(ApiError::invalid_param(
                            format!("input[{i}].role"),
                            format!("unknown role `{other}`"),
                        ))
                    }
                };
                let content = content_text(
                    item.get("content").unwrap_or(&Value::Null),
                    &format!("input[{i}].content"),
                )?;
                let mut m = json!({"role": role, "content": content});
                if role == "assistant" && !reasoning.is_empty() {
                    m["reasoning_content"] = Value::String(std::mem::take(&mut reasoning));
                }
                out.push(m);
            }
            "function_call" => {
                let call = json!({
                    "id": field("call_id")?,
                    "type": "function",
                    "function": {"name": field("name")?, "arguments": field("arguments")?},
                });
                // Calls following an assistant message belong to that turn.
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                            Some(calls) => calls.push(call),
                            None => last["tool_calls"] = json!([call]),
                        }
                    }
                    _ => {
                        let mut m =
                            json!({"role": "assistant", "content": "", "tool_calls": [call]});
                        if !reasoning.is_empty() {
                            m["reasoning_content"] = Value::String(std::mem::take(&mut reasoning));
                        }
                        out.push(m);
                    }
                }
            }
            "function_call_output" => {
                let output = content_text(
                    item.get("output").unwrap_or(&Value::Null),
                    &format!("input[{i}].output"),
                )?;
                out.push(
                    json!({"role": "tool", "content": output, "tool_call_id": field("call_id")?}),
                );
            }
            "reasoning" => {
                let parts = item
                    .get("content")
                    .and_then(Value::as_array)
                    .or_else(|| item.get("summary").and_then(Value::as_array));
                for p in parts.into_iter().flatten() {
                    if let Some(t) = p.get("text").and_then(Value::as_str) {
                        reasoning.push_str(t);
                    }
                }
            }
            other => {
                return Err(ApiError::invalid_param(
                    format!("input[{i}].type"),
                    format!("input item type `{other}` is not supported"),
                ))
            }
        }
    }
    Ok(out)
}

/// Tools → chat-template tools (function tools only).
fn template_tools(tools: &[Value]) -> ApiResult<Vec<Value>> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
            if kind != "function" {
                return Err(ApiError::invalid_param(
                    format!("tools[{i}].type"),
                    format!("tool type `{kind}` is not supported; only `function`"),
                ));
            }
            let name = t.get("name").and_then(Value::as_str).unwrap_or("");
            if name.trim().is_empty() {
                return Err(ApiError::invalid_param(
                    format!("tools[{i}].name"),
                    "the function name is missing or empty",
                ));
            }
            Ok(function_tool(
                name,
                t.get("description"),
                t.get("parameters"),
            ))
        })
        .collect()
}

/// Everything a response object echoes from its request.
#[derive(Debug, Clone)]
struct Echo {
    model: String,
    instructions: Option<String>,
    max_output_tokens: Option<u64>,
    previous_response_id: Option<String>,
    store: bool,
    /// The values decoding uses (absent knobs at the engine's: temperature 0, greedy).
    temperature: Value,
    top_p: Value,
    tool_choice: Value,
    tools: Value,
    parallel_tool_calls: bool,
    reasoning_effort: Value,
    metadata: Value,
    text: Value,
}

/// A response object.
fn response_json(
    id: &str,
    created: u64,
    echo: &Echo,
    status: &str,
    output: &[Value],
    usage: Option<&Usage>,
) -> Value {
    json!({
        "id": id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": Value::Null,
        "incomplete_details": if status == "incomplete" { json!({"reason": "max_output_tokens"}) } else { Value::Null },
        "instructions": echo.instructions,
        "max_output_tokens": echo.max_output_tokens,
        "model": echo.model,
        "output": output,
        "parallel_tool_calls": echo.parallel_tool_calls,
        "previous_response_id": echo.previous_response_id,
        "reasoning": {"effort": echo.reasoning_effort, "summary": Value::Null},
        "store": echo.store,
        "temperature": echo.temperature,
        "text": echo.text,
        "tool_choice": echo.tool_choice,
        "tools": echo.tools,
        "top_p": echo.top_p,
        "truncation": "disabled",
        "usage": usage.map(usage_json),
        "metadata": echo.metadata,
    })
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "id": id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": if status == "in_progress" { json!([]) } else { json!([output_text_part(text)]) },
    })
}

fn output_text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn reasoning_item(id: &str, text: &str, done: bool) -> Value {
    json!({
        "id": id,
        "type": "reasoning",
        "summary": [],
        "content": if done { json!([{"type": "reasoning_text", "text": text}]) } else { json!([]) },
    })
}

/// A function call item; `status` is `in_progress`, `completed` or `incomplete`.
fn function_call_item(id: &str, call_id: &str, c: &ToolCall, status: &str) -> Value {
    json!({
        "id": id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": c.name,
        "arguments": c.arguments,
    })
}

/// The assistant turn of output items, as a chat-template message (for the store).
fn assistant_message(items: &[Value]) -> Value {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for it in items {
        match it["type"].as_str() {
            Some("message") => {
                for p in it["content"].as_array().into_iter().flatten() {
                    content.push_str(p["text"].as_str().unwrap_or(""));
                }
            }
            Some("reasoning") => {
                for p in it["content"].as_array().into_iter().flatten() {
                    reasoning.push_str(p["text"].as_str().unwrap_or(""));
                }
            }
            Some("function_call") => calls.push(json!({
                "id": it["call_id"],
                "type": "function",
                "function": {"name": it["name"], "arguments": it["arguments"]},
            })),
            _ => {}
        }
    }
    let mut m = json!({"role": "assistant", "content": content});
    if !reasoning.is_empty() {
        m["reasoning_content"] = Value::String(reasoning);
    }
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
    }
    m
}

/// What to store once the response is complete.
struct Storing {
    store: Arc<ResponseStore>,
    /// The conversation before this response's output.
    conversation: Vec<Value>,
    /// This request's input, as items.
    input_items: Vec<Value>,
}

impl Storing {
    fn put(self, id: &str, items: &[Value], response: &Value) {
        let mut conversation = self.conversation;
        conversation.push(assistant_message(items));
        self.store.put(
            id.to_owned(),
            StoredResponse {
                conversation,
                response: response.clone(),
                input_items: self.input_items,
            },
        );
    }
}

async fn run(state: AppState, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let req: ResponsesRequest = parse_body(body, Flavour::OpenAi, state.config.body_limit)?;
    crate::protocol::refuse_fields(&[
        ("background", req.background.as_ref(), crate::protocol::asks),
        ("prompt", req.prompt.as_ref(), crate::protocol::asks),
        (
            "conversation",
            req.conversation.as_ref(),
            crate::protocol::asks,
        ),
    ])?;
    check_model(&state, req.model.as_deref())?;
    let format = constraint::text_format(req.text.as_ref())?;
    let tools = template_tools(req.tools.as_deref().unwrap_or_default())?;
    let choice = ToolChoice::openai(req.tool_choice.as_ref())?;
    let resolved = constraint::resolve(&choice, &tools, format)?;
    let tools_on = resolved.tools_on;
    let mut conversation = match &req.previous_response_id {
        Some(prev) => match state.responses.get(prev) {
            Some(r) => r.conversation,
            None => {
                let mut e =
                    ApiError::not_found(format!("previous response `{prev}` was not found"));
                e.param = Some("previous_response_id".into());
                e.code = Some("previous_response_not_found");
                return Err(e);
            }
        },
        None => vec![],
    };
    conversation.extend(input_messages(&req.input)?);
    let input_items = stored_input_items(&req.input);
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if let Some(i) = req.instructions.as_ref().filter(|i| !i.is_empty()) {
        messages.push(json!({"role": "system", "content": i}));
    }
    messages.extend(conversation.iter().cloned());
    let effort = req
        .reasoning
        .as_ref()
        .and_then(|r| r.get("effort"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let sampling = Sampling {
        temperature: req.temperature,
        top_p: req.top_p,
        ..Default::default()
    };
    validate_sampling(&sampling)?;
    let max_tokens = validate_max_tokens("max_output_tokens", req.max_output_tokens)?;
    let store = req.store.unwrap_or(true);
    let gen = Generation::start(
        state.backend.clone(),
        GenRequest {
            prompt: Prompt::Chat {
                messages: Value::Array(messages),
                tools: tools_on.then(|| Value::Array(resolved.tools.clone())),
                enable_thinking: resolved.enable_thinking(effort.as_deref().map(|e| e != "none")),
            },
            max_tokens,
            sampling: sampling.clone(),
            stop: vec![],
            constraint: resolved.constraint,
            cancel: CancelToken::new(),
        },
        OutputMode::Chat {
            tools: tools_on,
            max_calls: crate::protocol::call_limit(req.parallel_tool_calls),
        },
        "input",
    )
    .await?;
    let echo = Echo {
        model: state.backend.model_id(),
        instructions: req.instructions,
        max_output_tokens: req.max_output_tokens,
        previous_response_id: req.previous_response_id,
        store,
        temperature: f32_json(sampling.temperature_used()),
        top_p: f32_json(sampling.top_p_used()),
        tool_choice: req.tool_choice.unwrap_or_else(|| json!("auto")),
        tools: Value::Array(req.tools.unwrap_or_default()),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        reasoning_effort: effort.map(Value::String).unwrap_or(Value::Null),
        metadata: req.metadata.unwrap_or_else(|| json!({})),
        text: match req.text.as_ref().and_then(|t| t.get("format")) {
            Some(f) if !f.is_null() => json!({"format": f}),
            _ => json!({"format": {"type": "text"}}),
        },
    };
    let storing = store.then(|| Storing {
        store: state.responses.clone(),
        conversation,
        input_items,
    });
    let id = new_id("resp_");
    let created = unix_now();
    if req.stream.unwrap_or(false) {
        let mut st = ResponsesStream {
            id,
            created,
            echo,
            seq: 0,
            items: Vec::new(),
            open: None,
            storing,
        };
        let first = st.start();
        let events = futures_util::stream::iter(first).chain(
            gen.into_stream()
                .flat_map(move |ev| futures_util::stream::iter(st.on_event(ev))),
        );
        return Ok(sse::response(events));
    }
    let out = gen.collect().await?;
    let status = status_of(&out.finish.reason);
    let last = out.pieces.len().saturating_sub(1);
    let items: Vec<Value> = out
        .pieces
        .iter()
        .enumerate()
        .map(|(i, p)| {
            // The item the token budget cut is `incomplete`, like the response.
            let s = if i == last { status } else { "completed" };
            match p {
                Part::Text(t) => message_item(&new_id("msg_"), t, s),
                Part::Reasoning(t) => reasoning_item(&new_id("rs_"), t, true),
                Part::Call(c) => function_call_item(&new_id("fc_"), &new_id("call_"), c, s),
            }
        })
        .collect();
    let response = response_json(&id, created, &echo, status, &items, Some(&out.finish.usage));
    if let Some(s) = storing {
        s.put(&id, &items, &response);
    }
    Ok(axum::Json(response).into_response())
}

fn status_of(r: &FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "incomplete",
        _ => "completed",
    }
}

/// What the open item is.
enum Kind {
    Message,
    Reasoning,
    /// A function call. It stays open after its end, until the next event says whether the
    /// token budget cut it.
    Call {
        call_id: String,
        name: String,
    },
}

/// The item being streamed.
struct OpenItem {
    kind: Kind,
    id: String,
    index: usize,
    /// Its text, or a call's arguments so far.
    text: String,
}

/// The streaming state machine.
struct ResponsesStream {
    id: String,
    created: u64,
    echo: Echo,
    seq: u64,
    items: Vec<Value>,
    open: Option<OpenItem>,
    storing: Option<Storing>,
}

impl ResponsesStream {
    fn ev(&mut self, name: &str, mut payload: Value) -> Event {
        payload["type"] = json!(name);
        payload["sequence_number"] = json!(self.seq);
        self.seq += 1;
        sse::named(name, &payload)
    }

    fn snapshot(&self, status: &str, usage: Option<&Usage>) -> Value {
        response_json(
            &self.id,
            self.created,
            &self.echo,
            status,
            &self.items,
            usage,
        )
    }

    fn start(&mut self) -> Vec<Event> {
        let r = self.snapshot("in_progress", None);
        vec![
            self.ev("response.created", json!({"response": r})),
            self.ev("response.in_progress", json!({"response": r})),
        ]
    }

    /// Opens a message or reasoning item unless one of that kind is open.
    fn ensure_open(&mut self, reasoning: bool, out: &mut Vec<Event>) {
        let same = match self.open.as_ref().map(|o| &o.kind) {
            Some(Kind::Reasoning) => reasoning,
            Some(Kind::Message) => !reasoning,
            _ => false,
        };
        if same {
            return;
        }
        self.close("completed", out);
        let index = self.items.len();
        let (id, item, part) = if reasoning {
            let id = new_id("rs_");
            let item = reasoning_item(&id, "", false);
            (id, item, json!({"type": "reasoning_text", "text": ""}))
        } else {
            let id = new_id("msg_");
            let item = message_item(&id, "", "in_progress");
            (
                id,
                item,
                json!({"type": "output_text", "text": "", "annotations": []}),
            )
        };
        out.push(self.ev(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        out.push(self.ev(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        ));
        self.open = Some(OpenItem {
            kind: if reasoning {
                Kind::Reasoning
            } else {
                Kind::Message
            },
            id,
            index,
            text: String::new(),
        });
    }

    /// Closes the open item with `status` (`incomplete` when the token budget cut it).
    fn close(&mut self, status: &str, out: &mut Vec<Event>) {
        let Some(o) = self.open.take() else { return };
        let (id, index) = (o.id, o.index);
        let item = match o.kind {
            Kind::Call { call_id, name, .. } => {
                let call = ToolCall {
                    name,
                    arguments: o.text,
                };
                out.push(self.ev(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "name": call.name, "arguments": call.arguments}),
                ));
                function_call_item(&id, &call_id, &call, status)
            }
            kind => {
                let reasoning = matches!(kind, Kind::Reasoning);
                let (done_name, part, item) = if reasoning {
                    (
                        "response.reasoning_text.done",
                        json!({"type": "reasoning_text", "text": o.text}),
                        reasoning_item(&id, &o.text, true),
                    )
                } else {
                    (
                        "response.output_text.done",
                        output_text_part(&o.text),
                        message_item(&id, &o.text, status),
                    )
                };
                let mut done = json!({"item_id": id, "output_index": index, "content_index": 0, "text": o.text});
                if !reasoning {
                    done["logprobs"] = json!([]);
                }
                out.push(self.ev(done_name, done));
                out.push(self.ev(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                ));
                item
            }
        };
        out.push(self.ev(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.items.push(item);
    }

    fn on_event(&mut self, ev: OutputEvent) -> Vec<Event> {
        let mut out = Vec::new();
        match ev {
            OutputEvent::Piece(Piece::Text(t)) | OutputEvent::Piece(Piece::Reasoning(t))
                if t.is_empty() => {}
            OutputEvent::Piece(p @ (Piece::Text(_) | Piece::Reasoning(_))) => {
                let (reasoning, t) = match p {
                    Piece::Reasoning(t) => (true, t),
                    Piece::Text(t) => (false, t),
                    _ => return out,
                };
                self.ensure_open(reasoning, &mut out);
                let Some(o) = self.open.as_mut() else {
                    return out;
                };
                o.text.push_str(&t);
                let (id, index) = (o.id.clone(), o.index);
                let mut payload =
                    json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t});
                let name = if reasoning {
                    "response.reasoning_text.delta"
                } else {
                    payload["logprobs"] = json!([]);
                    "response.output_text.delta"
                };
                out.push(self.ev(name, payload));
            }
            OutputEvent::Piece(Piece::CallStart { name }) => {
                self.close("completed", &mut out);
                let index = self.items.len();
                let (id, call_id) = (new_id("fc_"), new_id("call_"));
                let call = ToolCall {
                    name: name.clone(),
                    arguments: String::new(),
                };
                out.push(self.ev(
                    "response.output_item.added",
                    json!({"output_index": index, "item": function_call_item(&id, &call_id, &call, "in_progress")}),
                ));
                self.open = Some(OpenItem {
                    kind: Kind::Call { call_id, name },
                    id,
                    index,
                    text: String::new(),
                });
            }
            OutputEvent::Piece(Piece::CallArgs(a)) => {
                let Some(o) = self.open.as_mut() else {
                    return out;
                };
                o.text.push_str(&a);
                let (id, index) = (o.id.clone(), o.index);
                out.push(self.ev(
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": index, "delta": a}),
                ));
            }
            OutputEvent::Piece(Piece::CallEnd(_))
            | OutputEvent::Tokens { .. }
            | OutputEvent::Prompt { .. } => {}
            OutputEvent::Finish(f) => {
                let status = status_of(&f.reason);
                self.close(status, &mut out);
                let r = self.snapshot(status, Some(&f.usage));
                if let Some(s) = self.storing.take() {
                    s.put(&self.id, &self.items, &r);
                }
                let name = if status == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                out.push(self.ev(name, json!({"response": r})));
            }
            OutputEvent::Failed(f) => {
                self.close("incomplete", &mut out);
                let mut r = self.snapshot("failed", None);
                r["error"] = json!({"code": "server_error", "message": f.client_message()});
                out.push(self.ev("response.failed", json!({"response": r})));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_items_become_messages() {
        let m = input_messages(&json!([
            {"role": "developer", "content": "sys"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\":1}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"}
        ]))
        .unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "sys"}));
        assert_eq!(m[1], json!({"role": "user", "content": "q"}));
        assert_eq!(m[2]["role"], "assistant");
        assert_eq!(m[2]["reasoning_content"], "hmm");
        assert_eq!(m[2]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(
            m[3],
            json!({"role": "tool", "content": "42", "tool_call_id": "c1"})
        );
    }

    #[test]
    fn bad_items_name_the_field() {
        let e = input_messages(&json!([{"type": "image_generation_call"}])).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[0].type"));
        let e = input_messages(&json!([{"type": "function_call", "name": "f"}])).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[0].call_id"));
        let e = template_tools(&[json!({"type": "web_search"})]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].type"));
    }

    #[test]
    fn output_items_round_trip_into_the_conversation() {
        let c = ToolCall {
            name: "f".into(),
            arguments: "{\"a\":1}".into(),
        };
        let items = [
            reasoning_item("rs", "think", true),
            message_item("m", "hello", "completed"),
            function_call_item("fc", "call_1", &c, "completed"),
        ];
        assert_eq!(
            assistant_message(&items),
            json!({"role": "assistant", "content": "hello", "reasoning_content": "think",
                   "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]})
        );
    }
}
