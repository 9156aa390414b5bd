//! The operational routes: `/health`, `/v1/models`, `/stats`, `/metrics`. None of them touches the
//! model thread, so they answer at once even while every slot is busy generating.

use crate::backend::LoadState;
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// `GET /health`: 200 `{"status":"ok"}` when ready; 503 `{"status":"loading"}` while the model
/// loads (HTTP starts first so probes get an answer); 503 `{"status":"error"}` after a failed
/// load.
pub async fn health(State(state): State<AppState>) -> Response {
    match state.backend.load_state() {
        LoadState::Ready => (StatusCode::OK, axum::Json(json!({"status": "ok"}))).into_response(),
        LoadState::Loading => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "loading", "message": "the model is loading"})),
        )
            .into_response(),
        LoadState::Failed(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "error", "message": "the model failed to load"})),
        )
            .into_response(),
    }
}

/// The `/v1/models` entry of the served model, capabilities as they are today.
fn model_entry(state: &AppState) -> Result<Value, ApiError> {
    let info = match state.backend.load_state() {
        LoadState::Ready => state.backend.info(),
        LoadState::Loading => return Err(ApiError::loading()),
        LoadState::Failed(cause) => return Err(ApiError::load_failed(cause)),
    }
    .ok_or_else(|| ApiError::internal("ready backend without model info"))?;
    let chat = info.chat_template && info.tokenizer;
    // When this server started serving it (Unix seconds): a real time, stable across calls.
    let created = crate::protocol::unix_now().saturating_sub(state.metrics.uptime_seconds() as u64);
    let created_at = nectar_engine::rfc3339(created as i64);
    Ok(json!({
        "id": info.id,
        "object": "model",
        "created": created,
        "owned_by": "nectar",
        // Anthropic's model object fields, so either SDK can list models.
        "type": "model",
        "display_name": info.id,
        "created_at": created_at,
        "context_length": info.context_length,
        "capabilities": {
            "chat": chat,
            "completions": true,
            "tools": chat,
            "thinking": chat,
            "streaming": true,
            "structured_output": info.tokenizer,
            "logprobs": true,
            "vision": false,
            "sampling": true,
            "batching": info.parallel > 1,
            "parallel": info.parallel,
            "mtp": info.mtp,
            "mtp_head_present": info.mtp_head,
        },
    }))
}

/// Every name a request may use: the served model's id, then each `--alias` (a client that
/// lists models before choosing one must find the name it was configured with). An alias
/// entry is the served model's entry under that id, with `"alias_of"` naming the model.
fn model_entries(state: &AppState) -> Result<Vec<Value>, ApiError> {
    let m = model_entry(state)?;
    let mut out = vec![m.clone()];
    for alias in &state.config.aliases {
        if out.iter().any(|e| e["id"] == alias.as_str()) {
            continue;
        }
        let mut a = m.clone();
        a["id"] = json!(alias);
        a["display_name"] = json!(alias);
        a["alias_of"] = m["id"].clone();
        out.push(a);
    }
    Ok(out)
}

/// `GET /v1/models`.
pub async fn models(State(state): State<AppState>) -> Response {
    match model_entries(&state) {
        Ok(data) => {
            let first = data.first().map(|m| m["id"].clone());
            let last = data.last().map(|m| m["id"].clone());
            axum::Json(json!({
                "object": "list",
                "data": data,
                "has_more": false,
                "first_id": first,
                "last_id": last,
            }))
            .into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/models/{id}` (the served id or an alias).
pub async fn model(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    match model_entries(&state) {
        Ok(all) => match all.into_iter().find(|m| m["id"] == id.as_str()) {
            Some(m) => axum::Json(m).into_response(),
            None => ApiError::not_found(format!("no model `{id}` is served here")).into_response(),
        },
        Err(e) => e.into_response(),
    }
}

/// `GET /stats`: one JSON object with the resolved settings, queue and token counters, and the
/// backend's residency telemetry (opaque) when experts are streamed.
pub async fn stats(State(state): State<AppState>) -> Response {
    let b = state.backend.stats();
    let load = match state.backend.load_state() {
        LoadState::Ready => "ready",
        LoadState::Loading => "loading",
        LoadState::Failed(_) => "failed",
    };
    let ratio = |a: u64, b: u64| if b > 0 { a as f64 / b as f64 } else { 0.0 };
    let tok_s = if b.busy_seconds > 0.0 {
        b.generated_tokens as f64 / b.busy_seconds
    } else {
        0.0
    };
    axum::Json(json!({
        "model": state.backend.model_id(),
        "state": load,
        "uptime_seconds": state.metrics.uptime_seconds(),
        "config": &*state.config,
        "model_info": state.backend.info(),
        "http": {
            "requests_total": state.metrics.requests_total(),
            "in_flight": state.metrics.in_flight(),
        },
        "queue": {"depth": b.queue_depth, "capacity": b.queue_capacity, "active": b.active},
        "requests": {
            "completed": b.requests_completed,
            "cancelled": b.requests_cancelled,
            "failed": b.requests_failed,
        },
        "tokens": {
            "prompt": b.prompt_tokens,
            "generated": b.generated_tokens,
            "busy_seconds": b.busy_seconds,
            "tokens_per_second": tok_s,
            "last_decode_tokens_per_second": b.last_decode_tok_s,
        },
        "batch": {
            "parallel": b.parallel,
            "steps": b.batch_steps,
            "rows": b.batch_rows,
            "mean_rows": if b.batch_steps > 0 { b.batch_rows as f64 / b.batch_steps as f64 } else { 0.0 },
            "tokens_per_second": b.batch_tok_s,
        },
        "mtp": {
            "mode": state.backend.info().map(|i| i.mtp),
            "drafted": b.mtp_drafted,
            "accepted": b.mtp_accepted,
            "acceptance_rate": if b.mtp_drafted > 0 { b.mtp_accepted as f64 / b.mtp_drafted as f64 } else { 0.0 },
            "main_forwards": b.mtp_forwards,
            "decode_rows": b.mtp_rows,
            "speculating_rows": b.mtp_speculating,
            "mean_speculating_rows": ratio(b.mtp_speculating, b.mtp_forwards),
            "mean_gamma": ratio(b.mtp_gamma, b.mtp_rows),
            "expert_union": b.expert_union.stats(),
            "auto": {"decisions": b.mtp_auto_decisions, "choices": b.mtp_auto_choices},
        },
        "sessions": {
            "kept": b.sessions,
            "tokens": b.session_tokens,
            "continued_requests": b.session_hits,
            "reused_prompt_tokens": b.session_reused_tokens,
        },
        "stored_responses": state.responses.len(),
        "residency": b.residency,
        "gpu": gpu_json(&b),
    }))
    .into_response()
}

/// `/stats`' `gpu` object: the placement, and which experts ran where — since load, in the
/// last batch step, and per step on average.
fn gpu_json(b: &crate::backend::BackendStats) -> Value {
    let g = &b.gpu;
    let per_step = |v: u64| {
        if b.batch_steps > 0 {
            v as f64 / b.batch_steps as f64
        } else {
            0.0
        }
    };
    json!({
        "summary": g.summary,
        "vram_bytes": g.vram_bytes,
        "matrices": g.matrices,
        "left_on_cpu": g.left_on_cpu,
        "spine_host_released_bytes": g.spine_host_released,
        "vram_experts": g.vram_experts,
        "vram_experts_per_layer": g.vram_experts_per_layer.iter()
            .map(|(l, k, n)| json!({"layer": l, "in_vram": k, "experts": n}))
            .collect::<Vec<_>>(),
        "expert_runs": {
            "vram": g.expert_runs_vram,
            "copied": g.expert_runs_copied,
            "cpu": g.expert_runs_cpu,
            "gpu": g.expert_runs_vram + g.expert_runs_copied,
        },
        "last_step": {
            "vram": g.last_step[0],
            "copied": g.last_step[1],
            "cpu": g.last_step[2],
            "gpu": g.last_step[0] + g.last_step[1],
        },
        "per_step": {
            "vram": per_step(g.expert_runs_vram),
            "copied": per_step(g.expert_runs_copied),
            "cpu": per_step(g.expert_runs_cpu),
        },
        "copy": g.copy.map(|c| c.json()),
    })
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let tiers = state.observatory.telemetry();
    let body = state.metrics.render(
        &state.backend.stats(),
        &state.backend.load_state(),
        &tiers,
        nectar_residency::rss::rss_bytes(),
        state.observatory.budget(),
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}
