//! The real router over the real demo model (`models/nectar-demo-glm5`), greedy decoding.
//!
//! One model thread, batching up to 8 rows, is shared by every test of this file (the tests run
//! concurrently and share its batch, which is itself part of what is tested); each test builds
//! its own router and state.
//! Token budgets are small: the demo decodes a few hundred tokens per second on two cores.

mod common;
use axum::http::StatusCode;
use axum::Router;
use common::{post_json, send};
use nectar_server::backend::{Backend, LoadState};
use nectar_server::{router, AppState, EngineBackend, EngineOptions, Pin, ServerConfig};
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/nectar-demo-glm5");
const HARBOR: &str = "Define the word \"harbor\".";
/// The demo's reference greedy answer to HARBOR starts with this.
const HARBOR_REF: &str = "harbor \\harbor\\ n.";

fn backend() -> Arc<EngineBackend> {
    static B: OnceLock<Arc<EngineBackend>> = OnceLock::new();
    B.get_or_init(|| {
        let opts = EngineOptions {
            parallel: 8,
            ..EngineOptions::new(DEMO)
        };
        Arc::new(EngineBackend::spawn(opts).unwrap())
    })
    .clone()
}

async fn app() -> Router {
    app_over(backend()).await
}

/// A router over `b` once its model has loaded.
async fn app_over(b: Arc<EngineBackend>) -> Router {
    let mut rx = b.subscribe();
    let state = tokio::time::timeout(
        Duration::from_secs(120),
        rx.wait_for(|s| *s != LoadState::Loading),
    )
    .await
    .expect("model load timed out")
    .unwrap()
    .clone();
    assert_eq!(state, LoadState::Ready);
    router(AppState::new(b, ServerConfig::default(), None))
}

fn reference(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{DEMO}/reference.json")).unwrap();
    let r: Value = serde_json::from_str(&text).unwrap();
    r["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap()
        .clone()
}

/// `(event name, parsed data)` of an SSE body; `[DONE]` comes back as the string "[DONE]".
fn sse(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter_map(|block| {
            let mut name = String::new();
            let mut data = None;
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_owned();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str(d).unwrap_or(Value::String(d.to_owned())));
                }
            }
            data.map(|d| (name, d))
        })
        .collect()
}

fn chat_body(text: &str, max_tokens: u64) -> Value {
    json!({"model": "nectar-demo-glm5", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens})
}

async fn chat_text(app: &Router, text: &str, max_tokens: u64) -> String {
    let v = post_json(app, "/v1/chat/completions", chat_body(text, max_tokens)).await;
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn chat_stream_text(app: &Router, text: &str, max_tokens: u64) -> String {
    let mut body = chat_body(text, max_tokens);
    body["stream"] = json!(true);
    let (st, raw) = send(app, "POST", "/v1/chat/completions", Some(body)).await;
    assert_eq!(st, StatusCode::OK);
    let events = sse(&raw);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    events
        .iter()
        .filter_map(|(_, d)| d["choices"][0]["delta"]["content"].as_str())
        .collect()
}

#[tokio::test]
async fn chat_matches_the_demo_reference() {
    let app = app().await;
    let v = post_json(&app, "/v1/chat/completions", chat_body(HARBOR, 12)).await;
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "nectar-demo-glm5");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with(HARBOR_REF), "{text:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert_eq!(
        v["usage"]["prompt_tokens"],
        reference("chat")["n_tokens"],
        "the server renders the chat template as the reference did"
    );
}

#[tokio::test]
async fn streaming_chat_concatenates_to_the_non_streaming_text() {
    let app = app().await;
    let whole = chat_text(&app, HARBOR, 16).await;
    let streamed = chat_stream_text(&app, HARBOR, 16).await;
    assert_eq!(streamed, whole);
    assert!(whole.starts_with(HARBOR_REF));
}

#[tokio::test]
async fn completions_with_token_ids_match_the_reference() {
    let app = app().await;
    let r = reference("en_text");
    let v = post_json(
        &app,
        "/v1/completions",
        json!({"prompt": r["input_ids"], "max_tokens": 16}),
    )
    .await;
    assert_eq!(v["object"], "text_completion");
    // The reference continuation ends with <|endoftext|>, a stop id: the text stops before it.
    let want = r["greedy_text"]
        .as_str()
        .unwrap()
        .trim_end_matches("<|endoftext|>");
    assert_eq!(v["choices"][0]["text"], want);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"], r["n_tokens"]);
    // The same prompt as text, echoed.
    let v = post_json(
        &app,
        "/v1/completions",
        json!({"prompt": r["text"], "max_tokens": 16, "echo": true}),
    )
    .await;
    assert_eq!(
        v["choices"][0]["text"],
        format!("{}{want}", r["text"].as_str().unwrap())
    );
}

#[tokio::test]
async fn responses_continue_a_stored_response() {
    let app = app().await;
    let first = post_json(
        &app,
        "/v1/responses",
        json!({"input": HARBOR, "max_output_tokens": 8}),
    )
    .await;
    assert_eq!(first["object"], "response");
    assert_eq!(first["status"], "incomplete");
    let text = first["output"][0]["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("harbor"), "{text:?}");
    let second = post_json(
        &app,
        "/v1/responses",
        json!({"input": "Define the word \"anchor\".", "previous_response_id": first["id"], "max_output_tokens": 4}),
    )
    .await;
    assert_eq!(second["previous_response_id"], first["id"]);
    // The continuation's prompt holds the first exchange.
    let first_total = first["usage"]["total_tokens"].as_u64().unwrap();
    assert!(second["usage"]["input_tokens"].as_u64().unwrap() > first_total);
    let (st, got) = send(
        &app,
        "GET",
        &format!("/v1/responses/{}", second["id"].as_str().unwrap()),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        serde_json::from_str::<Value>(&got).unwrap()["id"],
        second["id"]
    );
}

#[tokio::test]
async fn anthropic_messages_and_stream() {
    let app = app().await;
    let body = json!({"model": "nectar-demo-glm5", "max_tokens": 12, "messages": [{"role": "user", "content": HARBOR}]});
    let v = post_json(&app, "/v1/messages", body.clone()).await;
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["stop_reason"], "max_tokens");
    let text = v["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with(HARBOR_REF), "{text:?}");
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let (st, raw) = send(&app, "POST", "/v1/messages", Some(sbody)).await;
    assert_eq!(st, StatusCode::OK);
    let events = sse(&raw);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        &names[..3],
        ["message_start", "content_block_start", "ping"]
    );
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert!(names[3..names.len() - 3]
        .iter()
        .all(|n| *n == "content_block_delta"));
    let streamed: String = events
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(
        events[0].1["message"]["usage"]["input_tokens"],
        v["usage"]["input_tokens"]
    );
    assert_eq!(events[names.len() - 2].1["usage"]["output_tokens"], 12);
    // count_tokens counts the same rendered prompt.
    let n = post_json(
        &app,
        "/v1/messages/count_tokens",
        json!({"model": "nectar-demo-glm5", "messages": body["messages"]}),
    )
    .await;
    assert_eq!(n["input_tokens"], v["usage"]["input_tokens"]);
}

#[tokio::test]
async fn health_models_stats_and_metrics() {
    let app = app().await;
    let (st, body) = send(&app, "GET", "/health", None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["status"],
        "ok"
    );
    let (_, body) = send(&app, "GET", "/v1/models", None).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let m = &v["data"][0];
    assert_eq!(m["id"], "nectar-demo-glm5");
    assert_eq!(m["context_length"], 4096);
    assert_eq!(m["capabilities"]["tools"], true);
    assert_eq!(m["capabilities"]["structured_output"], true);
    assert_eq!(m["capabilities"]["batching"], true);
    assert_eq!(m["capabilities"]["parallel"], 8);
    assert_eq!(m["capabilities"]["mtp"], "off");
    chat_text(&app, HARBOR, 4).await;
    let (_, body) = send(&app, "GET", "/metrics", None).await;
    let generated = body
        .lines()
        .find_map(|l| l.strip_prefix("nectar_generated_tokens_total "))
        .unwrap();
    assert!(generated.parse::<u64>().unwrap() >= 4, "{body}");
    assert!(body.contains("# TYPE nectar_queue_depth gauge"));
    assert!(body
        .contains("nectar_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1"));
    let (_, body) = send(&app, "GET", "/stats", None).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["state"], "ready");
    assert!(v["tokens"]["generated"].as_u64().unwrap() >= 4);
    assert!(v["tokens"]["tokens_per_second"].as_f64().unwrap() > 0.0);
}

#[tokio::test]
async fn context_overflow_and_bad_ids_are_400() {
    let app = app().await;
    let (st, body) = send(
        &app,
        "POST",
        "/v1/completions",
        Some(json!({"prompt": vec![100u32; 5000], "max_tokens": 1})),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert!(v["error"]["message"].as_str().unwrap().contains("5000"));
    let (st, body) = send(
        &app,
        "POST",
        "/v1/completions",
        Some(json!({"prompt": [1, 999999]})),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["param"],
        "prompt"
    );
}

#[tokio::test]
async fn client_disconnect_mid_stream_cancels_and_the_server_stays_healthy() {
    let app = app().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let b = backend();
    let cancelled_before = b.stats().requests_cancelled;
    // A long generation: the repetitive code prompt does not stop by itself.
    let body =
        json!({"prompt": reference("code_long")["input_ids"], "max_tokens": 3000, "stream": true})
            .to_string();
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\"text\":\"") {
        let n = tokio::time::timeout(Duration::from_secs(60), conn.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "connection closed early");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    drop(conn);
    // The generation stops at its next token instead of running to 3000.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while b.stats().requests_cancelled == cancelled_before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the generation was not cancelled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fresh = router(AppState::new(backend(), ServerConfig::default(), None));
    assert!(chat_text(&fresh, HARBOR, 6).await.starts_with("harbor"));
}

#[tokio::test]
async fn eight_concurrent_streams_equal_their_solo_outputs() {
    let app = app().await;
    let words = [
        "harbor", "anchor", "river", "mountain", "lantern", "garden", "window", "silver",
    ];
    let prompts: Vec<String> = words
        .iter()
        .map(|w| format!("Define the word \"{w}\"."))
        .collect();
    // Solo: each on a server of its own that decodes one row at a time.
    let solo_app = app_over(Arc::new(
        EngineBackend::spawn(EngineOptions::new(DEMO)).unwrap(),
    ))
    .await;
    let mut solo = Vec::new();
    for p in &prompts {
        solo.push(chat_text(&solo_app, p, 12).await);
    }
    let before = backend().stats();
    let tasks: Vec<_> = prompts
        .iter()
        .map(|p| {
            let app = app.clone();
            let p = p.clone();
            tokio::spawn(async move { chat_stream_text(&app, &p, 12).await })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap(), solo[i], "stream {i} ({})", words[i]);
    }
    assert!(solo[0].starts_with(HARBOR_REF));
    // The streams really shared forwards: more rows than steps.
    let after = backend().stats();
    let (steps, rows) = (
        after.batch_steps - before.batch_steps,
        after.batch_rows - before.batch_rows,
    );
    assert!(
        rows > steps,
        "{rows} rows in {steps} steps: nothing was batched"
    );
}

#[tokio::test]
async fn logprobs_stop_strings_and_seeded_sampling() {
    let app = app().await;
    // Greedy logprobs: the chosen token is the most likely one, and the tokens spell the text.
    let mut body = chat_body(HARBOR, 6);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(2);
    let v = post_json(&app, "/v1/chat/completions", body).await;
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    let lps = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(lps.len(), 6);
    let spelled: String = lps.iter().map(|e| e["token"].as_str().unwrap()).collect();
    assert_eq!(spelled, content);
    for e in lps {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(top[0]["token"], e["token"]);
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
    }
    // Streaming carries the same logprobs.
    let mut body = chat_body(HARBOR, 6);
    body["logprobs"] = json!(true);
    body["stream"] = json!(true);
    let (_, raw) = send(&app, "POST", "/v1/chat/completions", Some(body)).await;
    let streamed: Vec<Value> = sse(&raw)
        .iter()
        .filter_map(|(_, d)| d["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(streamed.len(), 6);
    assert_eq!(streamed[0]["logprob"], lps[0]["logprob"]);

    // A stop string cuts the text before it.
    let mut body = chat_body(HARBOR, 12);
    body["stop"] = json!("\\");
    let v = post_json(&app, "/v1/chat/completions", body).await;
    assert_eq!(v["choices"][0]["message"]["content"], "harbor ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let v = post_json(
        &app,
        "/v1/messages",
        json!({"max_tokens": 12, "stop_sequences": ["\\"], "messages": [{"role": "user", "content": HARBOR}]}),
    )
    .await;
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], "\\");
    assert_eq!(v["content"][0]["text"], "harbor ");

    // Sampling is real and seeded: the same seed gives the same text.
    let mut body = chat_body(HARBOR, 8);
    body["temperature"] = json!(1.0);
    body["seed"] = json!(7);
    let a = post_json(&app, "/v1/chat/completions", body.clone()).await;
    let b = post_json(&app, "/v1/chat/completions", body).await;
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);

    // Legacy completions logprobs.
    let r = reference("en_text");
    let v = post_json(
        &app,
        "/v1/completions",
        json!({"prompt": r["input_ids"], "max_tokens": 3, "logprobs": 1}),
    )
    .await;
    let l = &v["choices"][0]["logprobs"];
    assert_eq!(l["tokens"].as_array().unwrap().len(), 3);
    assert_eq!(l["text_offset"][0], 0);
    assert_eq!(l["top_logprobs"][0].as_object().unwrap().len(), 1);
}

#[tokio::test]
async fn mtp_speculative_serving_matches_plain_greedy_and_counts_drafts() {
    let opts = EngineOptions {
        speculation: Some(nectar_engine::Speculation {
            speculator: nectar_engine::Speculator::Mtp { gamma: 2 },
            auto: false,
        }),
        ..EngineOptions::new(DEMO)
    };
    let b = Arc::new(EngineBackend::spawn(opts).unwrap());
    let app = app_over(b.clone()).await;
    let (_, body) = send(&app, "GET", "/v1/models", None).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["data"][0]["capabilities"]["mtp"], "on");
    assert_eq!(v["data"][0]["capabilities"]["batching"], false);
    let plain = chat_text(&self::app().await, HARBOR, 16).await;
    assert_eq!(chat_stream_text(&app, HARBOR, 16).await, plain);
    assert_eq!(chat_text(&app, HARBOR, 16).await, plain);
    let s = b.stats();
    assert!(
        s.mtp_drafted > 0 && s.mtp_accepted <= s.mtp_drafted,
        "{s:?}"
    );
    assert!(s.mtp_forwards < 2 * 15, "{s:?}");
}

#[tokio::test]
async fn memory_budget_streams_experts_and_reports_residency() {
    let mut opts = EngineOptions::new(DEMO);
    opts.memory_budget = Some(1 << 30);
    let b = Arc::new(EngineBackend::spawn(opts).unwrap());
    let mut rx = b.subscribe();
    let state = rx
        .wait_for(|s| *s != LoadState::Loading)
        .await
        .unwrap()
        .clone();
    assert_eq!(state, LoadState::Ready);
    let app = router(AppState::new(b, ServerConfig::default(), None));
    assert!(chat_text(&app, HARBOR, 12).await.starts_with(HARBOR_REF));
    let (_, body) = send(&app, "GET", "/stats", None).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["model_info"]["memory_budget"], 1u64 << 30);
    // Look-ahead and PILOT by default (`both`), as `nectar run`: look-ahead's controller has
    // measured the decode steps of this one-sequence request (8 steps a window; 12 tokens
    // leave one window), and PILOT's predictions were scored against the layers' routes.
    assert_eq!(v["model_info"]["prefetch"], "both");
    let la = &v["residency"]["lookahead"];
    assert!(la["windows"].as_u64().unwrap() >= 1, "{la}");
    let p = &v["residency"]["pilot"];
    assert!(p["chosen"].as_u64().unwrap() > 0, "{p}");
    let recall = p["recall"].as_f64().unwrap();
    assert!(recall > 0.0 && recall <= 1.0, "{p}");
    // The memory equation the budget was planned with.
    let plan = &v["model_info"]["memory_plan"];
    assert!(plan["lru_per_layer"].as_u64().unwrap() >= 1, "{plan}");
    let terms = plan["terms"].as_array().unwrap();
    assert!(
        terms
            .iter()
            .any(|t| t[0].as_str().unwrap().starts_with("KV cache")),
        "{plan}"
    );
    let misses: u64 = v["residency"]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["misses"].as_u64().unwrap())
        .sum();
    assert!(misses > 0, "{}", v["residency"]);
}

/// `--parallel 4` plans KV for five sequences (four rows and a kept conversation); a lone
/// client's decode lends the three idle ones' share (and the prompt transients and the bank's
/// spare slots) to the expert cache (`/stats` `residency.lru_planned` above the full plan's
/// slots), and rows that join take it back — the coldest experts evicted, their pages
/// returned — without changing any row's output.
#[tokio::test]
async fn a_lone_client_gets_the_idle_rows_memory() {
    let opts = EngineOptions {
        // A little above the least budget of this plan (131 MiB): 3 slots a layer at full load.
        memory_budget: Some(134 << 20),
        ctx_size: Some(1024),
        parallel: 4,
        ..EngineOptions::new(DEMO)
    };
    let b = Arc::new(EngineBackend::spawn(opts).unwrap());
    let app = app_over(b.clone()).await;
    let prompts = ["river", "harbor", "lantern"].map(|w| format!("Define the word \"{w}\"."));
    // The first decodes long enough for the others to join it.
    let tokens = [160, 12, 12];
    let mut alone = Vec::new();
    for (p, &n) in prompts.iter().zip(&tokens) {
        alone.push(chat_text(&app, p, n).await);
    }
    assert!(alone[1].starts_with(HARBOR_REF), "{}", alone[1]);
    let stats = || async {
        let (_, body) = send(&app, "GET", "/stats", None).await;
        serde_json::from_str::<Value>(&body).unwrap()
    };
    let v = stats().await;
    let plan = &v["model_info"]["memory_plan"];
    let full = plan["lru_per_layer"].as_u64().unwrap() * plan["sparse_layers"].as_u64().unwrap()
        + plan["lru_extra_layers"].as_u64().unwrap();
    let lent = v["residency"]["lru_planned"].as_u64().unwrap();
    assert!(lent >= full + 7 * 8, "lent {lent}, full plan {full}: {v}");
    assert_eq!(v["residency"]["lru_capacity"], lent, "{}", v["residency"]);
    // The long one decoding, the other two join it: the loan is taken back at their admission
    // (seen in `/stats` while they run).
    let spawn = |i: usize| {
        let (app, p) = (app.clone(), prompts[i].clone());
        tokio::spawn(async move { chat_text(&app, &p, tokens[i]).await })
    };
    let first = spawn(0);
    while b.stats().active == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let rest = [spawn(1), spawn(2)];
    let mut least = lent;
    while !rest.iter().all(|t| t.is_finished()) {
        let v = stats().await;
        least = least.min(v["residency"]["lru_planned"].as_u64().unwrap());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(least < lent, "the plan stayed at {lent} with three rows");
    assert_eq!(first.await.unwrap(), alone[0]);
    for (t, want) in rest.into_iter().zip(&alone[1..]) {
        assert_eq!(&t.await.unwrap(), want);
    }
    // Memory went back to the OS; the last row alone borrowed it again.
    let t = &stats().await["residency"];
    assert!(t["released_bytes"].as_u64().unwrap() > 0, "{t}");
    assert_eq!(t["lru_planned"], lent, "{t}");
}

#[tokio::test]
async fn a_budgeted_server_takes_runs_cache_flags() {
    // `--pin FILE --pin-size`, `--admission`, `--io-threads`, `--prefetch off`, as `nectar run`:
    // a ledger from another engine is trusted when named, and pins exactly what it names.
    let ledger =
        std::env::temp_dir().join(format!("nectar-serve-pin-{}.usage", std::process::id()));
    std::fs::write(&ledger, "-1 8 32\n-2 1 42\n1 3 100\n2 5 90\n").unwrap();
    let opts = |pin: Pin| EngineOptions {
        memory_budget: Some(1 << 30),
        prefetch: nectar_model::arch::glm5::Prefetch::Off,
        admission: nectar_residency::Admission::Lru,
        io_threads: 1,
        pin,
        ..EngineOptions::new(DEMO)
    };
    for (pin, pinned) in [
        (
            Pin::Ledger {
                file: ledger.clone(),
                bytes: Some(1 << 20),
            },
            2,
        ),
        (Pin::Off, 0),
    ] {
        let b = Arc::new(EngineBackend::spawn(opts(pin)).unwrap());
        let app = app_over(b).await;
        assert!(chat_text(&app, HARBOR, 12).await.starts_with(HARBOR_REF));
        let (_, body) = send(&app, "GET", "/stats", None).await;
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["model_info"]["prefetch"], "off");
        assert!(v["residency"]["lookahead"].is_null(), "{}", v["residency"]);
        assert!(v["residency"]["pilot"].is_null(), "{}", v["residency"]);
        assert_eq!(
            v["residency"]["occupancy"]["pinned"], pinned,
            "{}",
            v["residency"]
        );
    }
    let _ = std::fs::remove_file(&ledger);
}

#[tokio::test]
async fn json_schema_output_parses_and_forced_tool_calls_round_trip() {
    let app = app().await;
    let schema = json!({
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 16}, "letters": {"type": "integer", "minimum": 1, "maximum": 30}},
        "required": ["word", "letters"],
        "additionalProperties": false
    });
    // Chat: response_format json_schema, greedy and sampled.
    for temperature in [0.0, 1.0] {
        let mut body = chat_body(HARBOR, 60);
        body["temperature"] = json!(temperature);
        body["seed"] = json!(3);
        body["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": "w", "schema": schema}});
        let v = post_json(&app, "/v1/chat/completions", body).await;
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        let out: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(out["word"].is_string(), "{out}");
        let n = out["letters"].as_i64().unwrap();
        assert!((1..=30).contains(&n), "{out}");
    }
    // Chat: json_object — always an object in the making; complete when the model ends it.
    let mut body = chat_body(HARBOR, 40);
    body["response_format"] = json!({"type": "json_object"});
    let v = post_json(&app, "/v1/chat/completions", body).await;
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with('{'), "{text}");
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(
            serde_json::from_str::<Value>(text).unwrap().is_object(),
            "{text}"
        );
    }
    // Responses: text.format json_schema.
    let v = post_json(
        &app,
        "/v1/responses",
        json!({"input": HARBOR, "max_output_tokens": 60,
               "text": {"format": {"type": "json_schema", "name": "w", "schema": schema}}}),
    )
    .await;
    assert_eq!(v["status"], "completed", "{v}");
    let text = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["type"] == "message")
        .unwrap()["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        serde_json::from_str::<Value>(&text).unwrap().is_object(),
        "{text}"
    );
    // A bad schema is a 400 naming the parameter, before any generation.
    let mut body = chat_body(HARBOR, 8);
    body["response_format"] =
        json!({"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": 12}}});
    let (st, raw) = send(&app, "POST", "/v1/chat/completions", Some(body)).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{raw}");
    // A forced tool call: the model must call `lookup`; then the tool result goes back.
    let tools = json!([{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string", "maxLength": 12}, "limit": {"type": "integer", "minimum": 1, "maximum": 9}},
                       "required": ["word", "limit"]}}}]);
    let mut body = chat_body(HARBOR, 80);
    body["tools"] = tools.clone();
    body["tool_choice"] = json!({"type": "function", "function": {"name": "lookup"}});
    let v = post_json(&app, "/v1/chat/completions", body).await;
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "lookup");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["word"].is_string() && args["limit"].is_i64(), "{args}");
    let mut body = chat_body(HARBOR, 6);
    body["tools"] = tools;
    body["messages"] = json!([
        {"role": "user", "content": HARBOR},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "a sheltered port"}
    ]);
    let v = post_json(&app, "/v1/chat/completions", body).await;
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
    // Anthropic: tool_choice any.
    let v = post_json(
        &app,
        "/v1/messages",
        json!({"max_tokens": 80, "tool_choice": {"type": "any"},
               "tools": [{"name": "lookup", "input_schema": {"type": "object", "properties": {"word": {"type": "string", "maxLength": 12}}, "required": ["word"]}}],
               "messages": [{"role": "user", "content": HARBOR}]}),
    )
    .await;
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    let block = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap();
    assert_eq!(block["name"], "lookup");
    assert!(block["input"]["word"].is_string(), "{block}");
}

#[tokio::test]
async fn a_continued_chat_reuses_the_kept_conversation() {
    let app = app().await;
    let first = json!([{"role": "user", "content": "Define the word \"meadow\"."}]);
    let mut body = chat_body("", 10);
    body["messages"] = first.clone();
    let v = post_json(&app, "/v1/chat/completions", body).await;
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = backend().stats();
    let mut turn2 = first.as_array().unwrap().clone();
    turn2.push(json!({"role": "assistant", "content": answer}));
    turn2.push(json!({"role": "user", "content": "And the word \"valley\"?"}));
    let mut body = chat_body("", 6);
    body["messages"] = Value::Array(turn2);
    let v = post_json(&app, "/v1/chat/completions", body).await;
    assert!(v["choices"][0]["message"]["content"].is_string());
    let after = backend().stats();
    assert!(after.session_hits > before.session_hits, "{after:?}");
    assert!(after.session_reused_tokens > before.session_reused_tokens);
    let (_, body) = send(&app, "GET", "/stats", None).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(
        v["sessions"]["continued_requests"].as_u64().unwrap() >= 1,
        "{v}"
    );
}
