//! HTTP serving for Nectar: OpenAI Chat Completions, Completions and Responses, Anthropic
//! Messages, the operational routes (`/health`, `/v1/models`, `/stats`, `/metrics`), and the
//! observability page at `/` with its data routes (`/experts/map`, `/experts/events`,
//! `/experts.json`; see [`observe`] and [`web`]).
//!
//! What this crate does: **protocol translation**. Each API family's requests become one
//! protocol-neutral [`backend::GenRequest`] (a prompt as ids, text, or chat messages plus tools;
//! a token budget; sampling knobs; stop strings; a cancel token), and the backend's neutral events
//! (text deltas, token ids, a finish with usage) become that family's responses and exact
//! streaming event sequences. GLM's `<think>` and `<tool_call>` output is parsed by the
//! engine's `glm` module (re-exported by [`backend`]); each protocol here spells the resulting
//! reasoning and tool calls its own way.
//!
//! What it does not do: tokenise, template, sample or decode. The engine is protocol-neutral and
//! sits behind the [`backend::Backend`] trait; [`backend`] is the only module that names
//! `nectar-engine`. JSON exists only at this edge.
//!
//! The decision a newcomer would question: **one model thread behind a bounded queue** rather
//! than generation on the async runtime. Decoding is CPU-bound and the model is not shareable
//! across concurrent forwards yet, so the tokio runtime only moves bytes; a full queue answers
//! 429 at once instead of letting latency grow without bound. Continuous batching will replace
//! the thread's loop with the engine's scheduler behind the same trait.
//!
//! Layout: [`router`] is a thin route table (one line per endpoint, llama.cpp's `server.cpp`
//! style); every handler returns its family's error shape through [`error::ApiError`].
#![deny(missing_docs)]

pub mod auth;
pub mod backend;
pub mod error;
pub mod generation;
mod guard;
pub mod info;
pub mod listen;
pub mod metrics;
pub mod observe;
pub mod protocol;
pub mod run;
mod scheduler;
pub mod sse;
pub mod state;
pub mod store;
pub mod web;

pub use backend::{Backend, EngineBackend, EngineOptions, Pin};
pub use run::{run, ServeError, ServeOptions};
pub use state::{AppState, ServerConfig};

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use error::{ApiError, ErrorCause, Flavour};
use futures_util::StreamExt;
use protocol::{anthropic, openai_chat, openai_completions, responses};

/// The route table.
pub fn router(state: AppState) -> Router {
    let limit = state.config.body_limit;
    Router::new()
        .route("/health", get(info::health))
        .route("/stats", get(info::stats))
        .route("/metrics", get(info::metrics))
        .route("/", get(web::index))
        .route("/assets/app.js", get(web::script))
        .route("/assets/style.css", get(web::style))
        .route("/experts/map", get(observe::routes::map))
        .route("/experts/events", get(observe::routes::events))
        .route("/experts.json", get(observe::routes::atlas))
        .route("/v1/models", get(info::models))
        .route("/v1/models/{id}", get(info::model))
        .route("/v1/chat/completions", post(openai_chat::handle))
        .route("/v1/completions", post(openai_completions::handle))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::input_items),
        )
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(from_fn_with_state(state.clone(), auth::require_key))
        .layer(from_fn_with_state(state.clone(), track))
        .with_state(state)
}

async fn not_found(req: Request) -> Response {
    let path = req.uri().path();
    ApiError::not_found(format!("no route for {} {path}", req.method()))
        .flavour(Flavour::for_path(path))
        .into_response()
}

async fn method_not_allowed(req: Request) -> Response {
    ApiError::method_not_allowed()
        .flavour(Flavour::for_path(req.uri().path()))
        .into_response()
}

/// Middleware: counts requests by route pattern and status, keeps the in-flight gauge up while
/// a response (a stream included) is being sent, logs the internal cause of error responses,
/// and writes each request's log line when its response is complete (see
/// [`observe::requests`]).
async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".into());
    let method = req.method().clone();
    let in_flight = state.metrics.clone().begin_owned();
    let record = state
        .requests
        .open(method.as_str(), &route, state.metrics.clone());
    // Logged when dropped: a client that goes away before the response is complete drops this
    // future, and the line says so.
    let mut done = state.requests.done(record.clone());
    let mut resp = observe::requests::RequestRecord::scope(record.clone(), next.run(req)).await;
    let status = resp.status();
    done.status(status.as_u16());
    if let Ok(v) = header::HeaderValue::from_str(&record.id.to_string()) {
        resp.headers_mut().insert("x-request-id", v);
    }
    state.metrics.record(&route, status.as_u16());
    if let Some(ErrorCause(cause)) = resp.extensions().get::<ErrorCause>() {
        tracing::error!(%method, %route, %status, %cause, "request failed");
    } else if status.is_client_error() || status.is_server_error() {
        tracing::debug!(%method, %route, %status, "request refused");
    }
    let streaming = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streaming {
        return resp;
    }
    // A stream is in flight until its body ends (or the client goes away and it is dropped);
    // its log line is written then.
    let (parts, body) = resp.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _keep = (&in_flight, &done);
        chunk
    });
    Response::from_parts(parts, axum::body::Body::from_stream(body))
}

/// Serves `router(state)` on `listener` until `shutdown` resolves, then lets open requests
/// finish (graceful shutdown).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    timeouts: listen::Timeouts,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let sampler = tokio::spawn(observe::timeline::run(state.clone()));
    let served = listen::serve(listener, router(state), timeouts, shutdown).await;
    sampler.abort();
    served
}

#[cfg(test)]
mod mock;
#[cfg(test)]
mod router_tests;
