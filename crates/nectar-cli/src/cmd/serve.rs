//! `nectar serve`: the OpenAI- and Anthropic-compatible HTTP server over one model.
//!
//! Flags are checked here and refused when the server cannot honour them, rather than accepted
//! and silently ignored.
use crate::args::ServeArgs;
use crate::demo::model_dir;
use anyhow::{bail, Result};
use nectar_residency::planner::parse_size;
use nectar_server::ServeOptions;

/// Requests that may wait for the model thread before new ones get 429.
const QUEUE_CAPACITY: usize = 64;

pub fn run(a: ServeArgs, threads: Option<usize>) -> Result<()> {
    let dir = model_dir(a.model)?;
    if a.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    if a.ctx_size == Some(0) {
        bail!("--ctx-size must be at least 1");
    }
    let memory_budget = match a.memory_budget.as_deref() {
        Some(s) => Some(parse_size(s).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let pin = super::usage::pin(&a.cache.pin, a.cache.pin_size.as_deref())?;
    nectar_server::run(ServeOptions {
        model_dir: dir,
        host: a.host,
        port: a.port,
        api_key: a.api_key,
        ctx_size: a.ctx_size,
        memory_budget,
        gpu_memory: super::gpu_flag::resolve(a.gpu_memory.as_deref())?,
        prefetch: nectar_model::arch::glm5::Prefetch::parse(&a.cache.prefetch).unwrap_or_default(),
        io_threads: a.cache.io_threads,
        admission: nectar_residency::Admission::from_name(&a.cache.admission)
            .unwrap_or(nectar_model::arch::glm5::DEFAULT_ADMISSION),
        pin,
        parallel: a.parallel,
        mtp: a.mtp,
        queue_capacity: QUEUE_CAPACITY,
        threads,
        aliases: a.alias,
        atlas: a.atlas,
        timeouts: nectar_server::listen::Timeouts {
            header: std::time::Duration::from_secs(a.header_timeout),
            body: std::time::Duration::from_secs(a.body_timeout),
        },
    })?;
    Ok(())
}
