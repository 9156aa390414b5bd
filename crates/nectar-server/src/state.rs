//! Shared state of the HTTP side: the backend, the resolved settings, counters and the store of
//! Responses-API conversations. Everything is behind an `Arc`, so cloning the state per request
//! is cheap and there are no globals (tests build as many independent servers as they like).

use crate::backend::Backend;
use crate::metrics::Metrics;
use crate::observe::requests::Requests;
use crate::observe::Observatory;
use crate::store::ResponseStore;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// Default request-body limit: 8 MiB (a long conversation with tool schemas fits many times).
pub const DEFAULT_BODY_LIMIT: usize = 8 << 20;

/// Default number of stored Responses-API responses (oldest dropped first).
pub const DEFAULT_STORED_RESPONSES: usize = 1024;

/// Server settings, resolved once (by the CLI) and reported on `/stats`.
#[derive(Debug, Clone, Serialize)]
pub struct ServerConfig {
    /// Address the server listens on (informational).
    pub listen: String,
    /// Largest accepted request body, in bytes.
    pub body_limit: usize,
    /// Requests decoded together, as asked for (`/v1/models` reports what the model thread
    /// resolved).
    pub parallel: usize,
    /// Speculative decoding as asked for (`off`, `on`, `auto`).
    pub mtp: String,
    /// Stored Responses-API responses kept for `previous_response_id`.
    pub stored_responses: usize,
    /// Whether an API key is required (the key itself is never reported).
    pub auth: bool,
    /// Other names a request's `model` may give for the served model (`--alias`); any other
    /// name is 404 `model_not_found`.
    pub aliases: Vec<String>,
    /// The Atlas served at `/experts.json` (`--atlas FILE`, else the model directory's
    /// `experts.json`).
    pub atlas: Option<std::path::PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: String::new(),
            body_limit: DEFAULT_BODY_LIMIT,
            parallel: 1,
            mtp: "off".into(),
            stored_responses: DEFAULT_STORED_RESPONSES,
            auth: false,
            aliases: Vec::new(),
            atlas: None,
        }
    }
}

/// The SHA-256 of the API key. Comparing digests in constant time leaks neither the key's bytes
/// nor its length.
#[derive(Clone)]
pub struct KeyDigest(pub [u8; 32]);

impl KeyDigest {
    /// The digest of `key`.
    pub fn of(key: &str) -> KeyDigest {
        KeyDigest(Sha256::digest(key.as_bytes()).into())
    }
}

impl std::fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyDigest(..)")
    }
}

/// What every handler gets.
#[derive(Clone)]
pub struct AppState {
    /// The generation service.
    pub backend: Arc<dyn Backend>,
    /// Resolved settings.
    pub config: Arc<ServerConfig>,
    /// The API key's digest, when `--api-key` is set.
    pub api_key: Option<KeyDigest>,
    /// HTTP counters.
    pub metrics: Arc<Metrics>,
    /// Stored Responses-API responses.
    pub responses: Arc<ResponseStore>,
    /// The expert map and event stream (the backend's, or an empty one).
    pub observatory: Arc<Observatory>,
    /// The requests being answered now.
    pub requests: Arc<Requests>,
}

impl AppState {
    /// State over `backend` with `config`; `api_key` turns on authentication.
    pub fn new(
        backend: Arc<dyn Backend>,
        mut config: ServerConfig,
        api_key: Option<&str>,
    ) -> AppState {
        config.auth = api_key.is_some();
        let stored = config.stored_responses;
        let observatory = backend.observatory().unwrap_or_default();
        AppState {
            observatory,
            requests: Arc::new(Requests::default()),
            backend,
            api_key: api_key.map(KeyDigest::of),
            config: Arc::new(config),
            metrics: Arc::new(Metrics::default()),
            responses: Arc::new(ResponseStore::new(stored)),
        }
    }
}
