//! `ApiError`: every failure a route can answer with, rendered in the error shape of the route's
//! family (OpenAI `{"error":{"message","type","param","code"}}` or Anthropic
//! `{"type":"error","error":{"type","message"}}`).
//!
//! The status is part of the error's kind (axum's `rejection.rs` idea): a handler picks what went
//! wrong, never a number. Messages shown to clients are written to be safe (they name the request's
//! own parameter or limit); an internal cause, when there is one, rides in a response extension
//! and is logged by the middleware in `lib.rs`, never sent.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Which API family's error shape to render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// `/v1/chat/completions`, `/v1/completions`, `/v1/responses`, `/v1/models` and the rest.
    OpenAi,
    /// `/v1/messages` and `/v1/messages/count_tokens`.
    Anthropic,
}

impl Flavour {
    /// The family a request path belongs to (for errors raised before a handler runs: auth,
    /// unknown routes).
    pub fn for_path(path: &str) -> Flavour {
        if path.starts_with("/v1/messages") {
            Flavour::Anthropic
        } else {
            Flavour::OpenAi
        }
    }
}

/// What went wrong; each kind has one HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400: the request is malformed or asks for something this server cannot do.
    InvalidRequest,
    /// 401: `--api-key` is set and the request carries no key or a wrong one.
    Unauthorized,
    /// 404: no such route or stored object.
    NotFound,
    /// 405: the route exists but not for this method.
    MethodNotAllowed,
    /// 408: the request body did not arrive in time (`--body-timeout`).
    RequestTimeout,
    /// 413: the body is over the size limit.
    PayloadTooLarge,
    /// 429: the request queue is full; retry later.
    QueueFull,
    /// 500: a bug or a model failure; the cause is logged, not sent.
    Internal,
    /// 503: the model is still loading (or failed to load).
    Unavailable,
}

impl ErrorKind {
    /// The HTTP status of this kind.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::QueueFull => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// OpenAI's `error.type` for this kind.
    fn openai_type(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest
            | ErrorKind::PayloadTooLarge
            | ErrorKind::RequestTimeout
            | ErrorKind::MethodNotAllowed => "invalid_request_error",
            ErrorKind::Unauthorized => "authentication_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::QueueFull => "rate_limit_error",
            ErrorKind::Internal => "server_error",
            ErrorKind::Unavailable => "unavailable_error",
        }
    }

    /// Anthropic's `error.type` for this kind.
    fn anthropic_type(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::MethodNotAllowed | ErrorKind::RequestTimeout => {
                "invalid_request_error"
            }
            ErrorKind::Unauthorized => "authentication_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::PayloadTooLarge => "request_too_large",
            ErrorKind::QueueFull => "rate_limit_error",
            ErrorKind::Internal => "api_error",
            ErrorKind::Unavailable => "overloaded_error",
        }
    }
}

/// An error answer. Build one with a constructor, then [`ApiError::flavour`] picks the shape
/// (handlers do this once, at their edge).
#[derive(Debug, Clone)]
pub struct ApiError {
    /// What went wrong (decides the status).
    pub kind: ErrorKind,
    /// The client-safe message.
    pub message: String,
    /// The request parameter at fault, when there is one.
    pub param: Option<String>,
    /// A machine-readable code (OpenAI's `error.code`).
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
    /// The error shape.
    pub flavour: Flavour,
    /// An internal cause, logged by the middleware and never sent.
    pub cause: Option<String>,
}

/// Result alias for handlers.
pub type ApiResult<T> = std::result::Result<T, ApiError>;

/// The internal cause of an error response, carried in the response's extensions so the
/// logging middleware can record it.
#[derive(Debug, Clone)]
pub struct ErrorCause(pub String);

impl ApiError {
    fn new(kind: ErrorKind, message: impl Into<String>) -> ApiError {
        ApiError {
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
            flavour: Flavour::OpenAi,
            cause: None,
        }
    }

    /// 400 about one parameter: the message should say what is wrong with it.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(ErrorKind::InvalidRequest, message);
        e.param = Some(param.into());
        e
    }

    /// 400 not tied to one parameter.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::InvalidRequest, message)
    }

    /// 400: the prompt does not fit the context, with the numbers.
    pub fn context_overflow(prompt_tokens: usize, ctx: usize) -> ApiError {
        let mut e = ApiError::new(
            ErrorKind::InvalidRequest,
            format!(
                "this model's maximum context length is {ctx} tokens, but the prompt has \
                 {prompt_tokens} tokens (at least one token must be left for the reply); \
                 shorten the prompt"
            ),
        );
        e.code = Some("context_length_exceeded");
        e.param = Some("messages".into());
        e
    }

    /// 401.
    pub fn unauthorized() -> ApiError {
        let mut e = ApiError::new(
            ErrorKind::Unauthorized,
            "missing or invalid API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`",
        );
        e.code = Some("invalid_api_key");
        e
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::NotFound, message)
    }

    /// 405.
    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            ErrorKind::MethodNotAllowed,
            "this route does not accept that method",
        )
    }

    /// 413.
    pub fn payload_too_large(limit: usize) -> ApiError {
        ApiError::new(
            ErrorKind::PayloadTooLarge,
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    }

    /// 408: the body did not arrive within the server's body timeout.
    pub fn body_timeout(cause: impl Into<String>) -> ApiError {
        ApiError::new(
            ErrorKind::RequestTimeout,
            format!("the request body did not arrive in time ({})", cause.into()),
        )
    }

    /// 429 with `Retry-After`.
    pub fn queue_full(capacity: usize) -> ApiError {
        let mut e = ApiError::new(
            ErrorKind::QueueFull,
            format!("the server is busy: {capacity} requests are already waiting; retry later"),
        );
        e.retry_after = Some(1);
        e
    }

    /// 503 with `Retry-After` (the model is loading).
    pub fn loading() -> ApiError {
        let mut e = ApiError::new(
            ErrorKind::Unavailable,
            "the model is loading; retry shortly",
        );
        e.retry_after = Some(2);
        e
    }

    /// 503: the model failed to load; the server cannot serve generation.
    pub fn load_failed(cause: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(ErrorKind::Unavailable, "the model failed to load");
        e.cause = Some(cause.into());
        e
    }

    /// 500: the message is generic, the cause is logged.
    pub fn internal(cause: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(
            ErrorKind::Internal,
            "internal error while serving the request",
        );
        e.cause = Some(cause.into());
        e
    }

    /// The same error in another family's shape.
    pub fn flavour(mut self, flavour: Flavour) -> ApiError {
        self.flavour = flavour;
        self
    }

    /// The JSON body of this error.
    pub fn body(&self) -> serde_json::Value {
        match self.flavour {
            Flavour::OpenAi => json!({
                "error": {
                    "message": self.message,
                    "type": self.kind.openai_type(),
                    "param": self.param,
                    "code": self.code,
                }
            }),
            Flavour::Anthropic => json!({
                "type": "error",
                "error": {
                    "type": self.kind.anthropic_type(),
                    "message": self.message,
                }
            }),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.kind.status())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.kind.status(), axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(cause) = self.cause {
            resp.extensions_mut().insert(ErrorCause(cause));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_shape_names_the_param() {
        let e = ApiError::invalid_param("temperature", "must be between 0 and 2");
        let b = e.body();
        assert_eq!(b["error"]["param"], "temperature");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert!(b["error"]["code"].is_null());
        assert_eq!(e.kind.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn anthropic_shape() {
        let e = ApiError::payload_too_large(10).flavour(Flavour::Anthropic);
        let b = e.body();
        assert_eq!(b["type"], "error");
        assert_eq!(b["error"]["type"], "request_too_large");
        assert!(b["error"]["message"].as_str().unwrap().contains("10 bytes"));
    }

    #[test]
    fn internal_cause_is_not_sent() {
        let resp = ApiError::internal("secret path /x/y").into_response();
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            resp.extensions().get::<ErrorCause>().unwrap().0,
            "secret path /x/y"
        );
    }

    #[test]
    fn queue_full_has_retry_after() {
        let resp = ApiError::queue_full(4).into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn flavour_by_path() {
        assert_eq!(Flavour::for_path("/v1/messages"), Flavour::Anthropic);
        assert_eq!(
            Flavour::for_path("/v1/messages/count_tokens"),
            Flavour::Anthropic
        );
        assert_eq!(Flavour::for_path("/v1/chat/completions"), Flavour::OpenAi);
    }
}
