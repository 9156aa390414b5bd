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

#[cfg(test)]
mod tests {
    use crate::mock::MockBackend;
    use crate::{router, AppState, ServerConfig};
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use std::sync::Arc;
    use tower::ServiceExt;

    async fn get(app: &axum::Router, path: &str, key: Option<&str>) -> (StatusCode, Vec<u8>) {
        let mut b = Request::builder().uri(path);
        if let Some(k) = key {
            b = b.header("authorization", format!("Bearer {k}"));
        }
        let resp = app
            .clone()
            .oneshot(b.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, body.to_vec())
    }

    fn app(atlas: Option<std::path::PathBuf>, key: Option<&str>) -> (axum::Router, AppState) {
        let cfg = ServerConfig {
            atlas,
            ..ServerConfig::default()
        };
        let state = AppState::new(Arc::new(MockBackend::new(&["x"])), cfg, key);
        (router(state.clone()), state)
    }

    #[tokio::test]
    async fn the_page_is_public_and_its_data_needs_the_key() {
        let (app, state) = app(None, Some("k"));
        state
            .observatory
            .init(&[(1, vec![0; 4]), (2, vec![3; 4])], vec![], None);
        for path in ["/", "/assets/app.js", "/assets/style.css"] {
            let (st, body) = get(&app, path, None).await;
            assert_eq!(st, StatusCode::OK, "{path}");
            assert!(!body.is_empty());
        }
        for path in ["/experts/map", "/experts/events", "/experts.json"] {
            assert_eq!(
                get(&app, path, None).await.0,
                StatusCode::UNAUTHORIZED,
                "{path}"
            );
        }
        let (st, frame) = get(&app, "/experts/map", Some("k")).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(&frame[..4], b"NXM1");
        let seq = u64::from_le_bytes(frame[8..16].try_into().unwrap());
        let (st, body) = get(&app, &format!("/experts/map?since={seq}"), Some("k")).await;
        assert_eq!((st, body.len()), (StatusCode::NOT_MODIFIED, 0));
        let (st, _) = get(&app, &format!("/experts/map?since={}", seq + 1), Some("k")).await;
        assert_eq!(st, StatusCode::OK);
        let (st, text) = get(&app, "/experts/map?format=emap", Some("k")).await;
        assert_eq!(st, StatusCode::OK);
        // Layer 2's experts were selected 3 times each before: heat 2, no hits this turn; no
        // budget, so every expert is memory-mapped (Colibri's RAM tier).
        assert!(String::from_utf8(text)
            .unwrap()
            .starts_with("EMAP 2 4 4040404042424242\nHITS 2 4 00\n"));
        let (st, _) = get(&app, "/experts/map?format=png", Some("k")).await;
        assert_eq!(st, StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn the_map_waits_for_the_model() {
        let (app, _) = app(None, None);
        assert_eq!(
            get(&app, "/experts/map", None).await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[tokio::test]
    async fn the_atlas_is_served_checked_or_explained() {
        let dir = tempfile_dir();
        let good = dir.join("experts.json");
        std::fs::write(
            &good,
            r#"{"categories":["a"],"experts":[{"layer":1,"expert":0,"spec":0.9,"top_topic":"a"}]}"#,
        )
        .unwrap();
        let (app1, _) = app(Some(good.clone()), None);
        let (st, body) = get(&app1, "/experts.json", None).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(body, std::fs::read(&good).unwrap());

        let (app2, _) = app(Some(dir.join("missing.json")), None);
        let (st, body) = get(&app2, "/experts.json", None).await;
        assert_eq!(st, StatusCode::NOT_FOUND);
        assert!(String::from_utf8(body)
            .unwrap()
            .contains("nectar atlas probe"));

        let bad = dir.join("bad.json");
        std::fs::write(&bad, r#"{"categories":[]}"#).unwrap();
        let (app3, _) = app(Some(bad), None);
        assert_eq!(
            get(&app3, "/experts.json", None).await.0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("nectar-atlas-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
