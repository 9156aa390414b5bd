//! Serving on the GPU path (`EngineOptions::gpu_memory`, as `nectar serve --gpu-memory`): under a
//! memory budget, with two batched rows and MTP speculation, a chat, a structured output and a
//! continued conversation give the demo's greedy answers, and `/stats`, `/metrics` and the
//! expert map report the VRAM tier — which experts are in VRAM and which ran where.
//!
//! Without a usable GPU (or in a build without `--features cuda`) the same requests run on the
//! CPU and the reports say why, with zero bytes in VRAM; `NECTAR_REQUIRE_GPU=1` makes that a
//! failure (the GPU machine: scripts/gpu-device-run). `NECTAR_DEMO_MODEL` points at the demo
//! model for a test executable run away from its source tree.

mod common;
use axum::Router;
use common::{post_json, send, send_bytes};
use nectar_model::arch::glm5::{catalog_candidates, plan_gpu, Config, GpuMemory};
use nectar_server::backend::LoadState;
use nectar_server::{router, AppState, EngineBackend, EngineOptions, ServerConfig};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The demo's reference greedy answer to "Define the word "harbor"." starts with this.
const HARBOR_REF: &str = "harbor \\harbor\\ n.";

fn demo() -> PathBuf {
    std::env::var_os("NECTAR_DEMO_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../models/nectar-demo-glm5"
            ))
        })
}

async fn get_json(app: &Router, path: &str) -> Value {
    serde_json::from_str(&send(app, "GET", path, None).await.1).unwrap()
}

fn chat(messages: Value, max_tokens: u64) -> Value {
    json!({"model": "nectar-demo-glm5", "messages": messages, "max_tokens": max_tokens})
}

fn content(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_on_the_gpu_path_keeps_the_answers_and_reports_the_vram_tier() {
    let dir = demo();
    // VRAM for the spine and about half of every layer's experts: the rest streams through
    // the RAM cache under the budget.
    let cfg = Config::from_dir(&dir).unwrap();
    let c = catalog_candidates(&cfg, &nectar_format::Catalog::open(&dir).unwrap());
    let all = plan_gpu(&c, &cfg, u64::MAX, None);
    let vram = all.spine_bytes() + all.expert_bytes() / 2;
    let opts = EngineOptions {
        memory_budget: Some(1 << 30),
        gpu_memory: Some(GpuMemory::Size(vram)),
        parallel: 2,
        speculation: Some(nectar_engine::Speculation {
            speculator: nectar_engine::Speculator::Mtp { gamma: 2 },
            auto: false,
        }),
        ..EngineOptions::new(dir.clone())
    };
    let b = Arc::new(EngineBackend::spawn(opts).unwrap());
    let mut rx = b.subscribe();
    let state = tokio::time::timeout(
        Duration::from_secs(300),
        rx.wait_for(|s| *s != LoadState::Loading),
    )
    .await
    .expect("model load timed out")
    .unwrap()
    .clone();
    assert_eq!(state, LoadState::Ready);
    let app = router(AppState::new(b, ServerConfig::default(), None));

    // Two rows in one batch, speculating: both give the greedy reference.
    let harbor = json!([{"role": "user", "content": "Define the word \"harbor\"."}]);
    let (a, b2) = tokio::join!(
        post_json(&app, "/v1/chat/completions", chat(harbor.clone(), 12)),
        post_json(&app, "/v1/chat/completions", chat(harbor.clone(), 12)),
    );
    for v in [&a, &b2] {
        assert!(content(v).starts_with(HARBOR_REF), "{v}");
    }
    // Structured output.
    let schema = json!({
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 16}},
        "required": ["word"],
        "additionalProperties": false
    });
    let mut body = chat(harbor.clone(), 60);
    body["response_format"] =
        json!({"type": "json_schema", "json_schema": {"name": "w", "schema": schema}});
    let v = post_json(&app, "/v1/chat/completions", body).await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let text = content(&v);
    let obj: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(obj["word"].is_string(), "{obj}");
    // A continued conversation reuses the kept one.
    let mut turn2 = harbor.as_array().unwrap().clone();
    turn2.push(json!({"role": "assistant", "content": content(&a)}));
    turn2.push(json!({"role": "user", "content": "And \"valley\"?"}));
    let v = post_json(&app, "/v1/chat/completions", chat(Value::Array(turn2), 6)).await;
    assert!(v["choices"][0]["message"]["content"].is_string());

    let s = get_json(&app, "/stats").await;
    assert!(
        s["sessions"]["continued_requests"].as_u64().unwrap() >= 1,
        "{s}"
    );
    assert!(s["mtp"]["drafted"].as_u64().unwrap() > 0, "{}", s["mtp"]);
    let g = &s["gpu"];
    let summary = g["summary"]
        .as_str()
        .expect("a GPU was asked for: a line says what happened");
    eprintln!("{summary}\n/stats gpu: {g}");
    let runs = |d: &str| g["expert_runs"][d].as_u64().unwrap();
    let metrics = send(&app, "GET", "/metrics", None).await.1;
    assert!(
        metrics.contains(&format!(
            "nectar_expert_runs_total{{device=\"cpu\"}} {}",
            runs("cpu")
        )),
        "{metrics}"
    );
    let (_, frame) = send_bytes(&app, "GET", "/experts/map", None).await;
    let rows = u16::from_le_bytes([frame[4], frame[5]]) as usize;
    let cols = u16::from_le_bytes([frame[6], frame[7]]) as usize;
    let cells = &frame[24 + 2 * rows..24 + 2 * rows + rows * cols];
    let in_vram = cells.iter().filter(|c| *c >> 5 == 7).count();
    if summary.contains("running on the CPU") {
        assert!(
            std::env::var_os("NECTAR_REQUIRE_GPU").is_none(),
            "NECTAR_REQUIRE_GPU is set: {summary}"
        );
        assert_eq!((g["vram_bytes"].as_u64(), runs("gpu")), (Some(0), 0), "{g}");
        assert!(runs("cpu") > 0, "{g}");
        assert_eq!(in_vram, 0);
        assert!(metrics.contains("nectar_gpu_vram_bytes 0"), "{metrics}");
        return;
    }
    // On a GPU: the spine and part of every MoE layer's experts in VRAM; both devices ran
    // experts, the last step included some; the map shows the VRAM tier cell for cell.
    assert!(g["vram_bytes"].as_u64().unwrap() > 0, "{g}");
    // Part of the experts: how they spread over the layers follows the usage ledger when the
    // model directory has one.
    let per_layer = g["vram_experts_per_layer"].as_array().unwrap();
    let count = |k: &str| -> u64 { per_layer.iter().map(|l| l[k].as_u64().unwrap()).sum() };
    assert!(
        count("in_vram") > 0 && count("in_vram") < count("experts"),
        "{g}"
    );
    assert!(runs("gpu") > 0 && runs("cpu") > 0, "{g}");
    assert_eq!(in_vram as u64, g["vram_experts"].as_u64().unwrap());
    assert_eq!(runs("gpu"), runs("vram") + runs("copied"), "{g}");
    for device in ["vram", "copied"] {
        assert!(metrics.contains(&format!(
            "nectar_expert_runs_total{{device=\"{device}\"}} {}",
            runs(device)
        )));
    }
    // Under the budget a staging area lets experts in RAM be copied; `copy` reports them.
    assert!(summary.contains("staging for copied experts"), "{summary}");
    assert_eq!(
        g["copy"]["experts"].as_u64().unwrap(),
        runs("copied"),
        "{g}"
    );
}
