//! `GET /experts/map`, `GET /experts/events`, `GET /experts.json` (the Atlas).

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use std::convert::Infallible;
use tokio::sync::broadcast::error::RecvError;

/// Query of `/experts/map`.
#[derive(Debug, Deserialize)]
pub struct MapQuery {
    /// `emap`: Colibri's text lines instead of the binary frame.
    format: Option<String>,
    /// The `seq` the client has: answered 304 (no body) while it is still current.
    since: Option<u64>,
}

/// `GET /experts/map[?format=emap][&since=SEQ]`: the packed expert map (see [`super::map`]).
pub async fn map(State(state): State<AppState>, Query(q): Query<MapQuery>) -> Response {
    let obs = &state.observatory;
    let emap = match q.format.as_deref() {
        None | Some("binary") => false,
        Some("emap") => true,
        Some(other) => {
            return ApiError::invalid_param(
                "format",
                format!("unknown format `{other}` (binary or emap)"),
            )
            .into_response()
        }
    };
    let Some(seq) = obs.seq() else {
        return ApiError::loading().into_response();
    };
    if q.since == Some(seq) {
        return StatusCode::NOT_MODIFIED.into_response();
    }
    let Some(body) = obs.snapshot(emap) else {
        return ApiError::loading().into_response();
    };
    let kind = if emap {
        "text/plain; charset=utf-8"
    } else {
        "application/octet-stream"
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// `GET /experts/events`: server-sent events. First `hello` (geometry, tier names, the kept
/// timeline and pressure history, current requests), then `turn`, `hits`, `evictions`,
/// `sample`, `status` and `pressure` as they happen; `lagged` when this reader fell behind and
/// missed events (re-read the map).
pub async fn events(State(state): State<AppState>) -> Response {
    let obs = state.observatory.clone();
    let mut hello = obs.hello();
    hello["requests"] = json!(state.requests.live());
    let first = Event::default().event("hello").data(hello.to_string());
    let rx = obs.subscribe();
    let rest = futures_util::stream::unfold(rx, |mut rx| async move {
        let ev = match rx.recv().await {
            Ok(e) => Event::default().event(e.name).data(e.data.to_string()),
            Err(RecvError::Lagged(n)) => Event::default()
                .event("lagged")
                .data(json!({"missed": n}).to_string()),
            Err(RecvError::Closed) => return None,
        };
        Some((ev, rx))
    });
    let stream = futures_util::stream::once(async move { first }).chain(rest);
    Sse::new(stream.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// `GET /experts.json`: the Atlas (`nectar serve --atlas FILE`, else the model directory's
/// `experts.json`), checked to be a JSON object with an `experts` list and served as it is.
pub async fn atlas(State(state): State<AppState>) -> Response {
    let Some(path) = state.config.atlas.clone() else {
        return ApiError::not_found("no Atlas is configured").into_response();
    };
    let read = tokio::task::spawn_blocking(move || {
        let bytes = std::fs::read(&path).map_err(|e| (true, format!("{}: {e}", path.display())))?;
        let v: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| (false, format!("{} is not JSON: {e}", path.display())))?;
        if !v
            .get("experts")
            .is_some_and(|e| e.is_array() || e.is_object())
        {
            return Err((false, format!("{} has no `experts` list", path.display())));
        }
        Ok(bytes)
    })
    .await;
    match read {
        Ok(Ok(bytes)) => ([(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Ok(Err((true, _))) => ApiError::not_found(
            "no Atlas for this model: run `nectar atlas probe` then `nectar atlas analyze`, \
             and serve with --atlas FILE or put experts.json in the model directory",
        )
        .into_response(),
        Ok(Err((false, cause))) => ApiError::internal(cause).into_response(),
        Err(e) => ApiError::internal(format!("atlas task failed: {e}")).into_response(),
    }
}
