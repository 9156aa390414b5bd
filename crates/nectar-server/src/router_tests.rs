//! Router-level tests over the scripted [`MockBackend`]: error shapes, auth, limits and the exact
//! streaming event sequences of each protocol.

use crate::backend::{BackendError, FinishReason, LoadState};
use crate::mock::MockBackend;
use crate::{router, AppState, ServerConfig};
use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

const TOOL_OUTPUT: &[&str] = &[
    "<think>",
    "need the tool",
    "</think>\n",
    "Let me ",
    "check.\n<tool_",
    "call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par",
    "is</arg_value>\n</tool_call>",
];

fn state_with(
    mock: MockBackend,
    cfg: ServerConfig,
    key: Option<&str>,
) -> (AppState, Arc<MockBackend>) {
    let mock = Arc::new(mock);
    (AppState::new(mock.clone(), cfg, key), mock)
}

fn app(mock: MockBackend) -> (axum::Router, Arc<MockBackend>) {
    let (s, m) = state_with(mock, ServerConfig::default(), None);
    (router(s), m)
}

async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    body: Option<Value>,
    headers: &[(&str, &str)],
) -> (StatusCode, Vec<(String, String)>, String) {
    let mut b = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = match body {
        Some(v) => b
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(v.to_string()))
            .unwrap(),
        None => b.body(Body::empty()).unwrap(),
    };
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let hs = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, hs, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn post(app: &axum::Router, path: &str, body: Value) -> (StatusCode, String) {
    let (s, _, b) = call(app, "POST", path, Some(body), &[]).await;
    (s, b)
}

/// `(event name or "", data)` of an SSE body.
fn sse_events(body: &str) -> Vec<(String, String)> {
    body.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .filter_map(|block| {
            let mut name = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_owned();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = d.to_owned();
                }
            }
            (!data.is_empty()).then_some((name, data))
        })
        .collect()
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

fn weather_tool() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}])
}

#[tokio::test]
async fn auth_refuses_missing_and_wrong_keys_in_the_family_shape() {
    let (s, _) = state_with(
        MockBackend::new(&["hi"]),
        ServerConfig::default(),
        Some("k3y"),
    );
    let app = router(s);
    let chat = json!({"messages": user("x")});
    let (st, _, body) = call(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(chat.clone()),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["type"], "authentication_error");
    let (st, _, _) = call(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(chat.clone()),
        &[("authorization", "Bearer nope")],
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let (st, _, _) = call(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(chat.clone()),
        &[("authorization", "Bearer k3y")],
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let (st, _, _) = call(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(chat),
        &[("x-api-key", "k3y")],
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let msg = json!({"max_tokens": 5, "messages": user("x")});
    let (st, _, body) = call(
        &app,
        "POST",
        "/v1/messages",
        Some(msg),
        &[("x-api-key", "wrong")],
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "authentication_error");
    // Probes need no key; everything else does.
    assert_eq!(
        call(&app, "GET", "/health", None, &[]).await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&app, "GET", "/metrics", None, &[]).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(&app, "GET", "/v1/models", None, &[]).await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn malformed_json_is_400_in_the_family_shape() {
    let (app, _) = app(MockBackend::new(&["hi"]));
    for (path, anthropic) in [
        ("/v1/chat/completions", false),
        ("/v1/completions", false),
        ("/v1/responses", false),
        ("/v1/messages", true),
        ("/v1/messages/count_tokens", true),
    ] {
        let req = Request::post(path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from("{\"messages\": [oops"))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{path}");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&body).unwrap();
        if anthropic {
            assert_eq!(v["type"], "error", "{path}");
            assert_eq!(v["error"]["type"], "invalid_request_error");
        } else {
            assert_eq!(v["error"]["type"], "invalid_request_error", "{path}");
            assert!(v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("not valid JSON"));
        }
    }
}

#[tokio::test]
async fn wrong_field_type_names_the_parameter() {
    let (app, _) = app(MockBackend::new(&["hi"]));
    let (st, body) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": user("x"), "max_tokens": "ten"}),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["param"], "max_tokens");
    let (st, body) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": user("x"), "temperature": 9}),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["param"],
        "temperature"
    );
    let (st, body) = post(&app, "/v1/messages", json!({"messages": user("x")})).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(body.contains("max_tokens"), "{body}");
}

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let cfg = ServerConfig {
        body_limit: 1024,
        ..Default::default()
    };
    let (s, _) = state_with(MockBackend::new(&["hi"]), cfg, None);
    let app = router(s);
    let big = json!({"messages": user(&"x".repeat(4096))});
    let (st, body) = post(&app, "/v1/chat/completions", big.clone()).await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(body.contains("1024 bytes"), "{body}");
    let (st, body) = post(&app, "/v1/messages", big).await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["type"],
        "request_too_large"
    );
}

#[tokio::test]
async fn full_queue_is_429_with_retry_after_and_loading_is_503() {
    let mut m = MockBackend::new(&["hi"]);
    m.refuse = Some(BackendError::QueueFull { capacity: 3 });
    let (app, _) = app(m);
    let (st, hs, _) = call(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(json!({"messages": user("x")})),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS);
    assert!(hs.iter().any(|(k, v)| k == "retry-after" && v == "1"));

    let mut m = MockBackend::new(&["hi"]);
    m.state = LoadState::Loading;
    let (app, _) = self::app(m);
    let (st, body) = post(&app, "/v1/chat/completions", json!({"messages": user("x")})).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("loading"));
    let (st, _, body) = call(&app, "GET", "/health", None, &[]).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["status"],
        "loading"
    );
}

#[tokio::test]
async fn context_overflow_is_400_with_the_numbers() {
    let mut m = MockBackend::new(&["hi"]);
    m.refuse = Some(BackendError::ContextOverflow {
        prompt_tokens: 5000,
        ctx: 4096,
    });
    let (app, _) = app(m);
    let (st, body) = post(&app, "/v1/chat/completions", json!({"messages": user("x")})).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("4096") && msg.contains("5000"), "{msg}");
}

#[tokio::test]
async fn unknown_route_and_method() {
    let (app, _) = app(MockBackend::new(&["hi"]));
    let (st, _, body) = call(&app, "GET", "/v1/nope", None, &[]).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["type"],
        "not_found_error"
    );
    let (st, _, _) = call(&app, "GET", "/v1/chat/completions", None, &[]).await;
    assert_eq!(st, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn chat_non_streaming_splits_reasoning_text_and_tool_calls() {
    let (app, mock) = app(MockBackend::new(TOOL_OUTPUT));
    let (st, body) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": user("weather?"), "tools": weather_tool()}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "chat.completion");
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["content"], "Let me check.");
    assert_eq!(msg["reasoning_content"], "need the tool");
    assert_eq!(msg["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(
        msg["tool_calls"][0]["function"]["arguments"],
        "{\"city\":\"Paris\"}"
    );
    assert!(msg["tool_calls"][0]["id"]
        .as_str()
        .unwrap()
        .starts_with("call_"));
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(v["usage"]["total_tokens"], 7 + TOOL_OUTPUT.len());
    // The tools reached the template in OpenAI form.
    let seen = mock.seen.lock().unwrap();
    let crate::backend::Prompt::Chat { tools, .. } = &seen[0].prompt else {
        panic!()
    };
    assert_eq!(
        tools.as_ref().unwrap()[0]["function"]["name"],
        "get_weather"
    );
}

#[tokio::test]
async fn chat_stream_sequence() {
    let (app, _) = app(MockBackend::new(TOOL_OUTPUT));
    let (st, hs, body) = call(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(json!({"messages": user("weather?"), "tools": weather_tool(), "stream": true, "stream_options": {"include_usage": true}})),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert!(hs
        .iter()
        .any(|(k, v)| k == "content-type" && v.starts_with("text/event-stream")));
    let events = sse_events(&body);
    assert!(
        events.iter().all(|(name, _)| name.is_empty()),
        "chat chunks are bare data lines"
    );
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    let id = &chunks[0]["id"];
    assert!(chunks.iter().all(|c| &c["id"] == id));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| &c["delta"])
        .collect();
    let text: String = deltas
        .iter()
        .filter_map(|d| d["content"].as_str())
        .collect();
    let reasoning: String = deltas
        .iter()
        .filter_map(|d| d["reasoning_content"].as_str())
        .collect();
    assert_eq!(text, "Let me check.");
    assert_eq!(reasoning, "need the tool");
    // The call streams: its name and id first, then its arguments as they are generated (the
    // string value's first characters before the value closes).
    let calls: Vec<&Value> = deltas.iter().filter_map(|d| d.get("tool_calls")).collect();
    assert!(calls.iter().all(|c| c[0]["index"] == 0));
    assert_eq!(calls[0][0]["function"]["name"], "get_weather");
    assert!(calls[0][0]["id"].as_str().unwrap().starts_with("call_"));
    let fragments: Vec<&str> = calls
        .iter()
        .filter_map(|c| c[0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(fragments.concat(), "{\"city\":\"Paris\"}");
    assert_eq!(fragments, ["", "{\"city\":\"Par", "is\"}"]);
    let last_choice = &chunks[chunks.len() - 2]["choices"][0];
    assert_eq!(last_choice["finish_reason"], "tool_calls");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], TOOL_OUTPUT.len());
    // With include_usage every other chunk carries `usage: null`.
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["usage"].is_null() && c.get("usage").is_some()));
}

/// Two calls from the model; `parallel_tool_calls: false` (Anthropic:
/// `disable_parallel_tool_use`) leaves the first, and no markup of the second leaks.
#[tokio::test]
async fn parallel_tool_calls_false_keeps_one_call_in_every_protocol() {
    const TWO: &[&str] = &[
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>",
        "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n</tool_call>",
    ];
    let tools = weather_tool();
    let anthropic_tools = json!([{"name": "get_weather", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string"}}}}]);
    let responses_tools = json!([{"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}]);
    for limit in [false, true] {
        let want = if limit { 1 } else { 2 };
        let (a, _) = app(MockBackend::new(TWO));
        let mut body = json!({"messages": user("x"), "tools": tools});
        if limit {
            body["parallel_tool_calls"] = json!(false);
        }
        let (st, b) = post(&a, "/v1/chat/completions", body).await;
        assert_eq!(st, StatusCode::OK, "{b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), want, "chat: {v}");
        assert!(calls[0]["function"]["arguments"]
            .as_str()
            .unwrap()
            .contains("Oslo"));
        assert!(!b.contains("Rome") || !limit, "{b}");

        let (a, _) = app(MockBackend::new(TWO));
        let mut body = json!({"input": "x", "tools": responses_tools});
        if limit {
            body["parallel_tool_calls"] = json!(false);
        }
        let (st, b) = post(&a, "/v1/responses", body).await;
        assert_eq!(st, StatusCode::OK, "{b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        let n = v["output"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["type"] == "function_call")
            .count();
        assert_eq!(n, want, "responses: {v}");

        let (a, _) = app(MockBackend::new(TWO));
        let mut body = json!({"max_tokens": 64, "messages": user("x"), "tools": anthropic_tools});
        if limit {
            body["tool_choice"] = json!({"type": "auto", "disable_parallel_tool_use": true});
        }
        let (st, b) = post(&a, "/v1/messages", body).await;
        assert_eq!(st, StatusCode::OK, "{b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        let n = v["content"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["type"] == "tool_use")
            .count();
        assert_eq!(n, want, "messages: {v}");
    }
}

/// Known fields that would change the answer if ignored are a 400 naming them.
#[tokio::test]
async fn unsupported_known_fields_are_refused_by_name() {
    let (app, _) = app(MockBackend::new(&["hi"]));
    for (path, field, body) in [
        (
            "/v1/chat/completions",
            "audio",
            json!({"messages": user("x"), "modalities": ["text"], "audio": {"voice": "alloy", "format": "wav"}}),
        ),
        (
            "/v1/chat/completions",
            "modalities",
            json!({"messages": user("x"), "modalities": ["text", "audio"]}),
        ),
        (
            "/v1/chat/completions",
            "web_search_options",
            json!({"messages": user("x"), "web_search_options": {}}),
        ),
        (
            "/v1/chat/completions",
            "functions",
            json!({"messages": user("x"), "functions": [{"name": "f", "parameters": {}}]}),
        ),
        (
            "/v1/responses",
            "background",
            json!({"input": "x", "background": true}),
        ),
        (
            "/v1/responses",
            "prompt",
            json!({"input": "x", "prompt": {"id": "pmpt_1"}}),
        ),
        (
            "/v1/responses",
            "conversation",
            json!({"input": "x", "conversation": "conv_1"}),
        ),
    ] {
        let (st, b) = post(&app, path, body).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{path} {field}: {b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["error"]["param"], field, "{b}");
    }
    // Fields that change nothing in the answer are accepted.
    let (st, b) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": user("x"), "store": false, "metadata": {"a": "b"}, "service_tier": "auto",
               "user": "u", "prediction": {"type": "content", "content": "hi"}, "modalities": ["text"]}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");
}

#[tokio::test]
async fn tool_tags_are_text_without_tools() {
    let (app, _) = app(MockBackend::new(&["<tool_call>f\n</tool_call>"]));
    let (_, body) = post(&app, "/v1/chat/completions", json!({"messages": user("x")})).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "<tool_call>f\n</tool_call>"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn completions_echo_and_stream() {
    let (app, _) = app(MockBackend::new(&[" wor", "ld"]));
    let (st, body) = post(
        &app,
        "/v1/completions",
        json!({"prompt": "hello", "echo": true}),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], "hello world");
    let (_, body) = post(
        &app,
        "/v1/completions",
        json!({"prompt": [1, 2, 3], "stream": true}),
    )
    .await;
    let events = sse_events(&body);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| {
            serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(text, " world");
}

#[tokio::test]
async fn responses_stream_sequence() {
    let (app, _) = app(MockBackend::new(TOOL_OUTPUT));
    let (st, body) = post(
        &app,
        "/v1/responses",
        json!({"input": "weather?", "stream": true, "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]}),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let events = sse_events(&body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.push("response.reasoning_text.delta");
    expected.extend([
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
    ]);
    let text_deltas = names
        .iter()
        .filter(|n| **n == "response.output_text.delta")
        .count();
    assert!(text_deltas >= 1);
    expected.extend(std::iter::repeat_n(
        "response.output_text.delta",
        text_deltas,
    ));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, expected);
    let payloads: Vec<Value> = events
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    for (i, (p, (name, _))) in payloads.iter().zip(&events).enumerate() {
        assert_eq!(p["sequence_number"], i, "{name}");
        assert_eq!(p["type"], name.as_str());
    }
    let done = &payloads.last().unwrap()["response"];
    assert_eq!(done["status"], "completed");
    let output = done["output"].as_array().unwrap();
    assert_eq!(output.len(), 3);
    assert_eq!(output[0]["type"], "reasoning");
    assert_eq!(output[1]["content"][0]["text"], "Let me check.");
    assert_eq!(output[2]["type"], "function_call");
    assert_eq!(output[2]["arguments"], "{\"city\":\"Paris\"}");
    assert_eq!(done["usage"]["output_tokens"], TOOL_OUTPUT.len());
}

#[tokio::test]
async fn responses_previous_response_id_continues_the_conversation() {
    let (app, mock) = app(MockBackend::new(&["Hi there."]));
    let (st, body) = post(
        &app,
        "/v1/responses",
        json!({"input": "hello", "instructions": "be nice"}),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let first: Value = serde_json::from_str(&body).unwrap();
    let id = first["id"].as_str().unwrap();
    assert!(id.starts_with("resp_"));
    assert_eq!(first["object"], "response");
    assert_eq!(first["output"][0]["content"][0]["text"], "Hi there.");
    let (st, _) = post(
        &app,
        "/v1/responses",
        json!({"input": [{"role": "user", "content": "again"}], "previous_response_id": id}),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        mock.messages(1),
        json!([
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "Hi there."},
            {"role": "user", "content": "again"}
        ])
    );
    // store: false is not retrievable; unknown ids are 404 naming the parameter.
    let (_, body) = post(&app, "/v1/responses", json!({"input": "x", "store": false})).await;
    let unstored: Value = serde_json::from_str(&body).unwrap();
    let (st, body) = post(
        &app,
        "/v1/responses",
        json!({"input": "x", "previous_response_id": unstored["id"]}),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["param"],
        "previous_response_id"
    );
    let (st, _, body) = call(&app, "GET", &format!("/v1/responses/{id}"), None, &[]).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["id"], id);
}

#[tokio::test]
async fn responses_incomplete_at_the_token_limit() {
    let (app, _) = app(MockBackend::new(&["a", "b", "c"]));
    let (_, body) = post(
        &app,
        "/v1/responses",
        json!({"input": "x", "max_output_tokens": 2, "stream": true}),
    )
    .await;
    let events = sse_events(&body);
    let (name, data) = events.last().unwrap();
    assert_eq!(name, "response.incomplete");
    let v: Value = serde_json::from_str(data).unwrap();
    assert_eq!(
        v["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
}

#[tokio::test]
async fn anthropic_messages_and_stream_sequence() {
    let (app, _) = app(MockBackend::new(TOOL_OUTPUT));
    let tools = json!([{"name": "get_weather", "input_schema": {"type": "object"}}]);
    let (st, body) = post(
        &app,
        "/v1/messages",
        json!({"max_tokens": 64, "messages": user("weather?"), "tools": tools}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["type"], "message");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(v["stop_reason"], "tool_use");
    let kinds: Vec<&str> = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["thinking", "text", "tool_use"]);
    assert_eq!(v["content"][2]["input"], json!({"city": "Paris"}));
    assert_eq!(v["usage"]["input_tokens"], 7);

    let (_, body) = post(
        &app,
        "/v1/messages",
        json!({"max_tokens": 64, "messages": user("weather?"), "tools": tools, "stream": true}),
    )
    .await;
    let events = sse_events(&body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let text_deltas = events
        .iter()
        .filter(|(_, d)| d.contains("\"text_delta\""))
        .count();
    let mut expected = vec![
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
    ];
    expected.extend(std::iter::repeat_n("content_block_delta", text_deltas));
    expected.extend([
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]);
    assert_eq!(names, expected);
    let payloads: Vec<Value> = events
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    for (p, (name, _)) in payloads.iter().zip(&events) {
        assert_eq!(p["type"], name.as_str());
    }
    assert_eq!(payloads[1]["content_block"]["type"], "thinking");
    assert_eq!(payloads[3]["delta"]["type"], "thinking_delta");
    assert_eq!(payloads[4]["delta"]["type"], "signature_delta");
    let tool_start = &payloads[names.len() - 5];
    assert_eq!(tool_start["content_block"]["type"], "tool_use");
    assert_eq!(tool_start["index"], 2);
    assert_eq!(
        payloads[names.len() - 4]["delta"]["partial_json"],
        "{\"city\":\"Paris\"}"
    );
    let delta = &payloads[names.len() - 2];
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert_eq!(delta["usage"]["output_tokens"], TOOL_OUTPUT.len());
}

#[tokio::test]
async fn anthropic_stop_sequence_and_max_tokens() {
    let mut m = MockBackend::new(&["abc"]);
    m.finish = FinishReason::StopString("END".into());
    let (app, mock) = app(m);
    let (_, body) = post(
        &app,
        "/v1/messages",
        json!({"max_tokens": 8, "messages": user("x"), "stop_sequences": ["END"]}),
    )
    .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], "END");
    assert_eq!(mock.seen.lock().unwrap()[0].stop, ["END"]);
    let (app, _) = self::app(MockBackend::new(&["a", "b"]));
    let (_, body) = post(
        &app,
        "/v1/messages",
        json!({"max_tokens": 1, "messages": user("x")}),
    )
    .await;
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["stop_reason"],
        "max_tokens"
    );
}

#[tokio::test]
async fn count_tokens_and_models_and_metrics() {
    let (app, _) = app(MockBackend::new(&["a"]));
    let (st, body) = post(
        &app,
        "/v1/messages/count_tokens",
        json!({"messages": user("x")}),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"input_tokens": 7})
    );
    let (_, _, body) = call(&app, "GET", "/v1/models", None, &[]).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "mock-model");
    assert_eq!(v["data"][0]["capabilities"]["structured_output"], true);
    assert_eq!(v["data"][0]["capabilities"]["mtp"], "off");
    // When the server started, not the epoch: the same instant in both families' fields.
    let created = v["data"][0]["created"].as_i64().unwrap();
    assert!(created > 1_700_000_000, "{created}");
    assert_eq!(v["data"][0]["created_at"], nectar_engine::rfc3339(created));
    let (st, hs, body) = call(&app, "GET", "/metrics", None, &[]).await;
    assert_eq!(st, StatusCode::OK);
    assert!(hs
        .iter()
        .any(|(k, v)| k == "content-type" && v.starts_with("text/plain; version=0.0.4")));
    assert!(
        body.contains(
            "nectar_http_requests_total{route=\"/v1/messages/count_tokens\",status=\"200\"} 1"
        ),
        "{body}"
    );
    let (_, _, body) = call(&app, "GET", "/stats", None, &[]).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["state"], "ready");
    assert_eq!(v["config"]["parallel"], 1);
}

/// A forced call the token budget cuts mid-value.
const CUT_CALL: &[&str] = &[
    "<tool_call>get_weather\n",
    "<arg_key>city</arg_key>\n<arg_value>Par",
    "is</arg_value>\n</tool_call>",
];

#[tokio::test]
async fn d1_a_forced_call_cut_by_max_tokens_is_a_call_in_every_protocol() {
    let forced = json!({"type": "function", "function": {"name": "get_weather"}});
    let chat = json!({"messages": user("x"), "tools": weather_tool(), "tool_choice": forced,
                      "max_tokens": 2});
    let (app, mock) = app(MockBackend::new(CUT_CALL));
    let (st, body) = post(&app, "/v1/chat/completions", chat.clone()).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert!(
        !body.contains("<tool_call>") && !body.contains("arg_"),
        "{body}"
    );
    let v: Value = serde_json::from_str(&body).unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["message"]["content"], Value::Null);
    assert_eq!(
        choice["message"]["tool_calls"][0]["function"]["arguments"],
        "{\"city\":\"Par\"}"
    );
    // The backend got the call to plan, not a grammar fixed without the budget.
    assert!(matches!(
        mock.seen.lock().unwrap()[0].constraint,
        Some(crate::backend::Constraint::ToolCall { ref only, .. }) if only.as_deref() == Some("get_weather")
    ));

    let mut stream = chat.clone();
    stream["stream"] = json!(true);
    let (_, body) = post(&app, "/v1/chat/completions", stream).await;
    assert!(
        !body.contains("<tool_call>") && !body.contains("arg_"),
        "{body}"
    );
    assert!(body.contains("\"finish_reason\":\"length\""), "{body}");

    let rtools = json!([{"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}]);
    let resp = json!({"input": "x", "tools": rtools, "max_output_tokens": 2,
                      "tool_choice": {"type": "function", "name": "get_weather"}});
    let (_, body) = post(&app, "/v1/responses", resp.clone()).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "incomplete");
    let items = v["output"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{body}");
    assert_eq!(items[0]["type"], "function_call");
    assert_eq!(items[0]["status"], "incomplete");
    assert_eq!(items[0]["arguments"], "{\"city\":\"Par\"}");
    let mut s = resp;
    s["stream"] = json!(true);
    let (_, body) = post(&app, "/v1/responses", s).await;
    assert!(!body.contains("<tool_call>"), "{body}");
    let last: Value = serde_json::from_str(&sse_events(&body).last().unwrap().1).unwrap();
    assert_eq!(last["response"]["output"][0]["status"], "incomplete");

    let atools = json!([{"name": "get_weather", "input_schema": {"type": "object",
        "properties": {"city": {"type": "string"}}}}]);
    let msg = json!({"max_tokens": 2, "messages": user("x"), "tools": atools,
                     "tool_choice": {"type": "tool", "name": "get_weather"}});
    let (_, body) = post(&app, "/v1/messages", msg.clone()).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(
        v["content"],
        json!([{"type": "tool_use", "id": v["content"][0]["id"],
        "name": "get_weather", "input": {"city": "Par"}}])
    );
    let mut s = msg;
    s["stream"] = json!(true);
    let (_, body) = post(&app, "/v1/messages", s).await;
    assert!(
        !body.contains("<tool_call>") && body.contains("\"input_json_delta\""),
        "{body}"
    );
    assert!(body.contains("\"stop_reason\":\"max_tokens\""), "{body}");
}

#[tokio::test]
async fn d2_anthropic_message_delta_carries_cumulative_input_tokens() {
    let (app, _) = app(MockBackend::new(&["a", "b"]));
    let (_, body) = post(
        &app,
        "/v1/messages",
        json!({"max_tokens": 8, "messages": user("x"), "stream": true}),
    )
    .await;
    let delta = sse_events(&body)
        .into_iter()
        .find(|(n, _)| n == "message_delta")
        .unwrap();
    let v: Value = serde_json::from_str(&delta.1).unwrap();
    assert_eq!(v["usage"]["input_tokens"], 7);
    assert_eq!(v["usage"]["output_tokens"], 2);
}

#[tokio::test]
async fn d3_a_response_format_beside_a_forced_call_is_accepted() {
    let (app, mock) = app(MockBackend::new(CUT_CALL));
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let (st, body) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": user("x"), "tools": weather_tool(), "tool_choice": "required",
               "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let (st, body) = post(
        &app,
        "/v1/responses",
        json!({"input": "x", "tool_choice": "required",
               "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
               "text": {"format": {"type": "json_schema", "name": "a", "schema": schema}}}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["output"][0]["type"], "function_call");
    assert_eq!(v["text"]["format"]["type"], "json_schema");
    // The call is what is forced.
    for r in mock.seen.lock().unwrap().iter() {
        assert!(matches!(
            r.constraint,
            Some(crate::backend::Constraint::ToolCall { .. })
        ));
    }
}

#[tokio::test]
async fn d4_anthropic_structured_outputs_constrain_the_answer() {
    let (app, mock) = app(MockBackend::new(&["{\"a\": 1}"]));
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    for body in [
        json!({"max_tokens": 8, "messages": user("x"),
               "output_config": {"format": {"type": "json_schema", "schema": schema}}}),
        json!({"max_tokens": 8, "messages": user("x"),
               "output_format": {"type": "json_schema", "schema": schema}}),
    ] {
        let (st, b) = post(&app, "/v1/messages", body).await;
        assert_eq!(st, StatusCode::OK, "{b}");
    }
    for r in mock.seen.lock().unwrap().iter() {
        assert_eq!(
            r.constraint,
            Some(crate::backend::Constraint::JsonSchema(schema.clone()))
        );
    }
    // A known feature this server cannot honour is refused by name, not dropped.
    let (st, b) = post(
        &app,
        "/v1/messages",
        json!({"max_tokens": 8, "messages": user("x"), "mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(b.contains("mcp_servers"), "{b}");
    let (st, _) = post(
        &app,
        "/v1/messages",
        json!({"max_tokens": 8, "messages": user("x"), "output_config": {"format": {"type": "xml"}}}),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn d5_allowed_tools_narrow_the_tools_shown() {
    let (app, mock) = app(MockBackend::new(&["ok"]));
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}
    ]);
    let (st, body) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": user("x"), "tools": tools, "tool_choice": {"type": "allowed_tools",
               "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "other"}}]}}}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let seen = mock.seen.lock().unwrap();
    let crate::backend::Prompt::Chat {
        tools: Some(shown), ..
    } = &seen[0].prompt
    else {
        panic!()
    };
    assert_eq!(shown.as_array().unwrap().len(), 1);
    assert_eq!(shown[0]["function"]["name"], "other");
    assert!(matches!(
        &seen[0].constraint,
        Some(crate::backend::Constraint::ToolCall { tools, only: None }) if tools.len() == 1
    ));
}

#[tokio::test]
async fn d7_an_unknown_model_is_404_unless_it_is_an_alias() {
    let cfg = ServerConfig {
        aliases: vec!["gpt-4o".into()],
        ..ServerConfig::default()
    };
    let (s, _) = state_with(MockBackend::new(&["a"]), cfg, None);
    let app = router(s);
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"model": "nope", "messages": user("x")}),
        ),
        ("/v1/completions", json!({"model": "nope", "prompt": "x"})),
        ("/v1/responses", json!({"model": "nope", "input": "x"})),
        (
            "/v1/messages",
            json!({"model": "nope", "max_tokens": 4, "messages": user("x")}),
        ),
        (
            "/v1/messages/count_tokens",
            json!({"model": "nope", "messages": user("x")}),
        ),
    ] {
        let (st, b) = post(&app, path, body).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{path}: {b}");
        assert!(b.contains("nope"), "{b}");
        if !path.starts_with("/v1/messages") {
            let v: Value = serde_json::from_str(&b).unwrap();
            assert_eq!(v["error"]["code"], "model_not_found");
        }
    }
    for model in ["mock-model", "gpt-4o"] {
        let (st, b) = post(
            &app,
            "/v1/chat/completions",
            json!({"model": model, "messages": user("x")}),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{b}");
    }
}

#[tokio::test]
async fn aliases_are_listed_and_retrievable_as_models() {
    let cfg = ServerConfig {
        aliases: vec!["gpt-4o".into(), "claude-x".into()],
        ..ServerConfig::default()
    };
    let (s, _) = state_with(MockBackend::new(&["a"]), cfg, None);
    let app = router(s);
    let (st, _, b) = call(&app, "GET", "/v1/models", None, &[]).await;
    assert_eq!(st, StatusCode::OK, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["mock-model", "gpt-4o", "claude-x"], "{v}");
    assert_eq!(v["last_id"], "claude-x");
    assert_eq!(v["data"][1]["alias_of"], "mock-model");
    for id in ["mock-model", "gpt-4o", "claude-x"] {
        let (st, _, b) = call(&app, "GET", &format!("/v1/models/{id}"), None, &[]).await;
        assert_eq!(st, StatusCode::OK, "{id}: {b}");
        let m: Value = serde_json::from_str(&b).unwrap();
        assert_eq!(m["id"], id);
    }
    let (st, _, _) = call(&app, "GET", "/v1/models/nope", None, &[]).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn d8_responses_report_the_sampling_values_used() {
    let (app, _) = app(MockBackend::new(&["a"]));
    let (_, body) = post(&app, "/v1/responses", json!({"input": "x"})).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    // Nothing asked: greedy decoding, reported as temperature 0.
    assert_eq!(v["temperature"], json!(0.0));
    assert_eq!(v["top_p"], json!(1.0));
    let (_, body) = post(
        &app,
        "/v1/responses",
        json!({"input": "x", "temperature": 0.7, "top_p": 0.8}),
    )
    .await;
    assert!(body.contains("\"top_p\":0.8,"), "{body}");
    assert!(body.contains("\"temperature\":0.7,"), "{body}");
}

#[tokio::test]
async fn d9_thinking_on_with_empty_reasoning_still_has_a_thinking_block() {
    let (app, _) = app(MockBackend::new(&["<think>", "</think>", "answer"]));
    let req = json!({"max_tokens": 8, "messages": user("x"),
                     "thinking": {"type": "enabled", "budget_tokens": 1024}});
    let (_, body) = post(&app, "/v1/messages", req.clone()).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["content"][0],
        json!({"type": "thinking", "thinking": "", "signature": ""})
    );
    assert_eq!(v["content"][1]["text"], "answer");
    let mut s = req;
    s["stream"] = json!(true);
    let (_, body) = post(&app, "/v1/messages", s).await;
    let starts: Vec<Value> = sse_events(&body)
        .into_iter()
        .filter(|(n, _)| n == "content_block_start")
        .map(|(_, d)| serde_json::from_str::<Value>(&d).unwrap())
        .collect();
    assert_eq!(starts[0]["content_block"]["type"], "thinking");
    assert_eq!(starts[1]["content_block"]["type"], "text");
    assert_eq!(starts[1]["index"], 1);
    // Thinking not asked for: no block is invented.
    let (_, body) = post(
        &app,
        "/v1/messages",
        json!({"max_tokens": 8, "messages": user("x")}),
    )
    .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["content"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn d10_responses_delete_and_input_items() {
    let (app, _) = app(MockBackend::new(&["a"]));
    let (_, body) = post(
        &app,
        "/v1/responses",
        json!({"input": [{"role": "user", "content": "one"},
                         {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "two"}]}]}),
    )
    .await;
    let id = serde_json::from_str::<Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (st, _, body) = call(
        &app,
        "GET",
        &format!("/v1/responses/{id}/input_items"),
        None,
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "list");
    // Newest first by default, as in OpenAI's API.
    assert_eq!(v["data"][0]["content"][0]["text"], "two");
    assert_eq!(
        v["data"][1]["content"],
        json!([{"type": "input_text", "text": "one"}])
    );
    assert!(v["data"][1]["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(v["has_more"], false);
    let (_, _, body) = call(
        &app,
        "GET",
        &format!("/v1/responses/{id}/input_items?order=asc&limit=1"),
        None,
        &[],
    )
    .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["data"][0]["content"][0]["text"], "one");
    assert_eq!(v["has_more"], true);
    let (st, _, body) = call(&app, "DELETE", &format!("/v1/responses/{id}"), None, &[]).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"id": id, "object": "response", "deleted": true})
    );
    let (st, _, _) = call(&app, "GET", &format!("/v1/responses/{id}"), None, &[]).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _, _) = call(&app, "DELETE", &format!("/v1/responses/{id}"), None, &[]).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn d6_completions_echo_with_logprobs_cover_the_prompt_tokens() {
    let (app, mock) = app(MockBackend::new(&[" wor", "ld"]));
    let (_, body) = post(
        &app,
        "/v1/completions",
        json!({"prompt": "hello", "echo": true, "logprobs": 1}),
    )
    .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["choices"][0]["text"], "hello world");
    let lp = &v["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens, ["p0", "p1", "p2", "p3", "p4", "p5", "p6"]);
    assert_eq!(lp["token_logprobs"][0], Value::Null);
    assert_eq!(lp["top_logprobs"][0], Value::Null);
    assert_eq!(lp["token_logprobs"][1], json!(-1.0));
    assert_eq!(lp["text_offset"][0], 0);
    assert!(mock.seen.lock().unwrap()[0].sampling.prompt_logprobs);
    // Streamed: the echo chunk carries the prompt's logprobs.
    let (_, body) = post(
        &app,
        "/v1/completions",
        json!({"prompt": "hello", "echo": true, "logprobs": 1, "stream": true}),
    )
    .await;
    let first: Value = serde_json::from_str(&sse_events(&body)[0].1).unwrap();
    assert_eq!(first["choices"][0]["text"], "hello");
    assert_eq!(first["choices"][0]["logprobs"]["tokens"][0], "p0");
    // Without echo, no prompt pass is asked for.
    post(
        &app,
        "/v1/completions",
        json!({"prompt": "hello", "logprobs": 1}),
    )
    .await;
    assert!(!mock.seen.lock().unwrap()[2].sampling.prompt_logprobs);
}
