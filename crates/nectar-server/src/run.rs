//! Running a server process: bind, start HTTP at once, load the model on its thread, serve until
//! Ctrl-C or SIGTERM, then shut down gracefully. `nectar serve` is a thin wrapper over [`run`];
//! keeping the runtime and the signal handling here spares the CLI a tokio dependency.

use crate::backend::{Backend, EngineBackend, EngineOptions, LoadState};
use crate::state::{AppState, ServerConfig};
use nectar_engine::{Speculation, Speculator, DEFAULT_DRAFT_TOKENS, MAX_DRAFT};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How long open requests may take to finish after a shutdown signal before the process exits
/// anyway (a client holding a stream open must not keep the server alive forever).
const DRAIN: Duration = Duration::from_secs(10);
/// How long shutdown waits for the model thread to end its rows and flush the usage ledger.
const MODEL_STOP: Duration = Duration::from_secs(10);

/// Everything `nectar serve` resolved from its flags.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The model directory.
    pub model_dir: PathBuf,
    /// Address to bind.
    pub host: String,
    /// Port to bind (0 = any free port).
    pub port: u16,
    /// Require this key (`Authorization: Bearer` or `x-api-key`).
    pub api_key: Option<String>,
    /// Context length (`None`: the model's, at most 4096).
    pub ctx_size: Option<usize>,
    /// Expert-streaming memory budget in bytes.
    pub memory_budget: Option<u64>,
    /// VRAM for the GPU tier (`--gpu-memory`; `None`: the CPU only).
    pub gpu_memory: Option<nectar_model::arch::glm5::GpuMemory>,
    /// Expert prefetch under the budget (`--prefetch`).
    pub prefetch: nectar_model::arch::glm5::Prefetch,
    /// Expert-reading threads under the budget (`--io-threads`).
    pub io_threads: usize,
    /// What a full layer of the expert cache keeps (`--admission`).
    pub admission: nectar_residency::Admission,
    /// Pinned experts under the budget (`--pin`, `--pin-size`).
    pub pin: crate::Pin,
    /// Requests decoded together (continuous batching when above 1).
    pub parallel: usize,
    /// Speculative decoding: `"off"`, `"on"` or `"auto"` (MTP drafts for every row inside the
    /// batch step; `auto` chooses each row's depth and falls back to off on a model without an
    /// MTP head).
    pub mtp: String,
    /// Requests that may wait for the model.
    pub queue_capacity: usize,
    /// Compute threads of the model (`None`: one per core).
    pub threads: Option<usize>,
    /// Other names a request's `model` may give (`--alias`).
    pub aliases: Vec<String>,
    /// The Atlas served at `/experts.json` (`None`: the model directory's `experts.json`).
    pub atlas: Option<PathBuf>,
    /// Read deadlines for request heads and bodies.
    pub timeouts: crate::listen::Timeouts,
}

/// Why the server stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The model failed to load.
    #[error("the model failed to load: {0}")]
    Load(String),
    /// The runtime or the server failed.
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
}

/// Serves until a shutdown signal (or a failed model load). Blocks.
pub fn run(opts: ServeOptions) -> Result<(), ServeError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("nectar-http")
        .build()?;
    rt.block_on(serve_async(opts))
}

async fn serve_async(opts: ServeOptions) -> Result<(), ServeError> {
    let addr = format!("{}:{}", opts.host, opts.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: addr.clone(),
            source,
        })?;
    let local: SocketAddr = listener.local_addr()?;
    let backend = EngineBackend::spawn(EngineOptions {
        model_dir: opts.model_dir.clone(),
        ctx_size: opts.ctx_size,
        memory_budget: opts.memory_budget,
        gpu_memory: opts.gpu_memory,
        prefetch: opts.prefetch,
        io_threads: opts.io_threads,
        admission: opts.admission,
        pin: opts.pin.clone(),
        queue_capacity: opts.queue_capacity,
        threads: opts.threads,
        parallel: opts.parallel,
        // `on` drafts at the depth measured best on the demo model; `auto` chooses each row's
        // depth up to the most (as `nectar run` does).
        speculation: match opts.mtp.as_str() {
            "on" => Some(Speculation {
                speculator: Speculator::Mtp {
                    gamma: DEFAULT_DRAFT_TOKENS,
                },
                auto: false,
            }),
            "auto" => Some(Speculation {
                speculator: Speculator::Mtp { gamma: MAX_DRAFT },
                auto: true,
            }),
            _ => None,
        },
    })?;
    let mut load = backend.subscribe();
    let config = ServerConfig {
        listen: local.to_string(),
        parallel: opts.parallel,
        mtp: opts.mtp.clone(),
        aliases: opts.aliases.clone(),
        atlas: Some(
            opts.atlas
                .clone()
                .unwrap_or_else(|| opts.model_dir.join("experts.json")),
        ),
        ..Default::default()
    };
    tracing::info!(?config, model = %opts.model_dir.display(), "resolved server configuration");
    if !local.ip().is_loopback() && opts.api_key.is_none() {
        tracing::warn!(%local, "listening beyond loopback without --api-key: anyone who can reach this address can use the model");
    }
    let engine = Arc::new(backend);
    let backend: Arc<dyn Backend> = engine.clone();
    let model_id = backend.model_id();
    let state = AppState::new(backend, config, opts.api_key.as_deref());
    eprintln!(
        "nectar serve: listening on http://{local} (model {model_id} loading); the expert map is at http://{local}/"
    );

    // Shutdown: a signal, or a failed load (the server cannot serve anything useful then).
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let load_watch = {
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            loop {
                let s = load.borrow_and_update().clone();
                match s {
                    LoadState::Ready => {
                        eprintln!("nectar serve: model {model_id} ready");
                        return None;
                    }
                    LoadState::Failed(e) => {
                        let _ = stop_tx.send(true);
                        return Some(e);
                    }
                    LoadState::Loading => {}
                }
                if load.changed().await.is_err() {
                    return None;
                }
            }
        })
    };
    tokio::spawn(async move {
        shutdown_signal().await;
        eprintln!(
            "nectar serve: shutting down (open requests get {} s)",
            DRAIN.as_secs()
        );
        let _ = stop_tx.send(true);
    });
    let mut stopped = stop_rx.clone();
    let shutdown = async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    let mut deadline = stop_rx;
    let server = crate::serve(listener, state, opts.timeouts, shutdown);
    tokio::select! {
        r = server => r?,
        _ = async {
            let _ = deadline.wait_for(|s| *s).await;
            tokio::time::sleep(DRAIN).await;
        } => {
            eprintln!("nectar serve: open requests did not finish in time; exiting");
        }
    }
    // Join the model thread, so the usage ledger's last flush happens before the process ends.
    let closed = tokio::task::spawn_blocking(move || engine.close(MODEL_STOP))
        .await
        .unwrap_or(false);
    if !closed {
        eprintln!(
            "nectar serve: the model thread did not stop in {} s; exiting without it",
            MODEL_STOP.as_secs()
        );
    }
    if load_watch.is_finished() {
        if let Ok(Some(e)) = load_watch.await {
            return Err(ServeError::Load(e));
        }
    }
    Ok(())
}

/// Ctrl-C, or SIGTERM on Unix.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            // Without a handler we can only wait forever; SIGTERM may still work.
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
