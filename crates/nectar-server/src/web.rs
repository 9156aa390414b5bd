//! The observability page served at `/`: plain HTML, JavaScript and CSS compiled into the binary
//! (no CDN, works offline). It reads `/experts/map`, `/experts/events` and `/experts.json` with
//! the API key the user types once (kept in the browser's local storage), so the page itself
//! needs no key. Sources: `crates/nectar-server/web/`.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("../web/index.html");
const SCRIPT: &str = include_str!("../web/app.js");
const STYLE: &str = include_str!("../web/style.css");

fn asset(kind: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`.
pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

/// `GET /assets/app.js`.
pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /assets/style.css`.
pub async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}
