//! API-key authentication: with `--api-key`, every route but `/health` needs the key, as
//! `Authorization: Bearer KEY` (OpenAI clients) or `x-api-key: KEY` (Anthropic clients).
//!
//! Keys are compared as SHA-256 digests with a constant-time equality, so the time a wrong key
//! takes to reject says nothing about how close it was, or how long the real key is.

use crate::error::{ApiError, Flavour};
use crate::state::{AppState, KeyDigest};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

/// Routes that answer without a key: load balancers probe `/health`; the web page and its
/// assets hold no data (the page asks for the key and sends it with its own requests).
const PUBLIC: [&str; 4] = ["/health", "/", "/assets/app.js", "/assets/style.css"];

/// The key a request presents, if any.
fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let v = v.trim();
        if let Some(k) = v
            .strip_prefix("Bearer ")
            .or_else(|| v.strip_prefix("bearer "))
        {
            return Some(k.trim());
        }
    }
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// Whether `headers` carry the key whose digest is `expected`.
pub fn authorized(headers: &HeaderMap, expected: &KeyDigest) -> bool {
    match presented_key(headers) {
        Some(k) => bool::from(KeyDigest::of(k).0.ct_eq(&expected.0)),
        None => false,
    }
}

/// Middleware: 401 in the route family's error shape when the key is missing or wrong.
pub async fn require_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(expected) = &state.api_key {
        let path = req.uri().path();
        if !PUBLIC.contains(&path) && !authorized(req.headers(), expected) {
            return ApiError::unauthorized()
                .flavour(Flavour::for_path(path))
                .into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(name: &'static str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn both_header_forms_are_accepted() {
        let key = KeyDigest::of("s3cret");
        assert!(authorized(&headers("authorization", "Bearer s3cret"), &key));
        assert!(authorized(&headers("x-api-key", "s3cret"), &key));
    }

    #[test]
    fn wrong_missing_or_malformed_keys_are_refused() {
        let key = KeyDigest::of("s3cret");
        assert!(!authorized(&headers("authorization", "Bearer s3cre"), &key));
        assert!(!authorized(&headers("authorization", "s3cret"), &key));
        assert!(!authorized(&headers("x-api-key", ""), &key));
        assert!(!authorized(&HeaderMap::new(), &key));
    }
}
