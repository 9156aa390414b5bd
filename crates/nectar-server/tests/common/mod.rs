//! Requests to the router in process, shared by the server's integration tests.
#![allow(dead_code)] // each test binary uses its own part
use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

/// `method path` with an optional JSON body: the status and the raw body.
pub async fn send_bytes(
    app: &Router,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Vec<u8>) {
    let b = Request::builder().method(method).uri(path);
    let req = match body {
        Some(v) => b
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(v.to_string()))
            .unwrap(),
        None => b.body(Body::empty()).unwrap(),
    };
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, bytes.to_vec())
}

/// [`send_bytes`] with a text body.
pub async fn send(
    app: &Router,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, String) {
    let (st, raw) = send_bytes(app, method, path, body).await;
    (st, String::from_utf8(raw).unwrap())
}

/// POSTs `body` and parses the answer, which must be 200.
pub async fn post_json(app: &Router, path: &str, body: Value) -> Value {
    let (st, text) = send(app, "POST", path, Some(body)).await;
    assert_eq!(st, StatusCode::OK, "{text}");
    serde_json::from_str(&text).unwrap()
}
