//! Server-sent events framing shared by the protocols: OpenAI chat and completions send bare
//! `data:` lines ending with `data: [DONE]`; Responses and Anthropic name each event
//! (`event: message_start`), as the official APIs do.

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use serde_json::Value;
use std::convert::Infallible;

/// A `data:` event.
pub fn data(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

/// An `event:` + `data:` event; the name is also the payload's `type`.
pub fn named(name: &str, v: &Value) -> Event {
    Event::default().event(name).data(v.to_string())
}

/// OpenAI's end-of-stream marker.
pub fn done() -> Event {
    Event::default().data("[DONE]")
}

/// The streaming response (`text/event-stream`, keep-alive comments while the model is busy
/// with other requests).
pub fn response(events: impl Stream<Item = Event> + Send + 'static) -> Response {
    Sse::new(events.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response()
}
